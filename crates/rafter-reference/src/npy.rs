//! Reading and writing NumPy `.npy` files as the reference executor's tensors (the codec is
//! [`rafter_ir::npy`], shared with the runtime).

use crate::Tensor;
use std::path::Path;

pub use rafter_ir::npy::NpyError;

/// Reads a `.npy` file into a tensor.
pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let (dtype, dims, payload) = rafter_ir::npy::read(path)?;
    Tensor::from_le_bytes(dtype, &dims, &payload).map_err(|e| NpyError::Format {
        path: path.display().to_string(),
        msg: format!("payload: {e}"),
    })
}

/// Serialises a tensor as `.npy` (version 1). bf16 has no NumPy dtype and is written as f32.
pub fn to_npy_bytes(t: &Tensor) -> Vec<u8> {
    rafter_ir::npy::encode(t.dtype(), t.shape(), &t.le_bytes())
}

/// Writes a tensor as a `.npy` file.
pub fn write_npy(path: &Path, t: &Tensor) -> std::io::Result<()> {
    std::fs::write(path, to_npy_bytes(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::DType;

    #[test]
    fn round_trip() {
        for t in [
            Tensor::f32s(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]),
            Tensor::i64s(&[4], vec![1, -2, 3, i64::MAX]),
            Tensor::i64s(&[], vec![7]),
            Tensor::from_le_bytes(DType::Bool, &[2], &[1, 0]).unwrap(),
        ] {
            let bytes = to_npy_bytes(&t);
            let (dtype, dims, payload) = rafter_ir::npy::parse(&bytes).unwrap();
            assert_eq!(Tensor::from_le_bytes(dtype, &dims, &payload).unwrap(), t);
        }
    }

    /// A file written by NumPy (the committed BERT fixture's inputs).
    #[test]
    fn reads_numpy_output() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/bert_tiny/seq7/input_ids.npy");
        let t = read_npy(&path).unwrap();
        assert_eq!((t.dtype(), t.shape()), (DType::I64, &[1usize, 7][..]));
    }

    /// Fortran-order files as NumPy writes them (`np.save` of `np.asfortranarray(a)` and of
    /// a transposed array; tests/fixtures/npy): read as the arrays they show.
    #[test]
    fn reads_fortran_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/npy");
        let t = read_npy(&dir.join("fortran_i32_2x3x4.npy")).unwrap();
        let want: Vec<u8> = (0..24i32).flat_map(i32::to_le_bytes).collect();
        assert_eq!(
            t,
            Tensor::from_le_bytes(DType::I32, &[2, 3, 4], &want).unwrap()
        );
        // np.arange(6).reshape(2, 3).T
        let t = read_npy(&dir.join("transposed_f32_3x2.npy")).unwrap();
        assert_eq!(t, Tensor::f32s(&[3, 2], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
    }
}
