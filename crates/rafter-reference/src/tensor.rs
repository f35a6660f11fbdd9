//! Host tensors: one `ndarray` per dtype.

use bytes::Bytes;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{ConstData, DType};

/// A tensor held by the reference executor.
///
/// One variant per IR dtype, each an owned row-major `ArrayD`, so every op is ordinary
/// generic Rust over `ArrayD<T>` and the dtype dispatch happens once, at the op boundary.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I8(ArrayD<i8>),
    U8(ArrayD<u8>),
    I16(ArrayD<i16>),
    U16(ArrayD<u16>),
    I32(ArrayD<i32>),
    U32(ArrayD<u32>),
    I64(ArrayD<i64>),
    U64(ArrayD<u64>),
    Bool(ArrayD<bool>),
}

/// Applies `$body` to the array inside any variant, binding it as `$a`.
#[macro_export]
macro_rules! with_array {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $body,
            $crate::Tensor::F64($a) => $body,
            $crate::Tensor::F16($a) => $body,
            $crate::Tensor::BF16($a) => $body,
            $crate::Tensor::I8($a) => $body,
            $crate::Tensor::U8($a) => $body,
            $crate::Tensor::I16($a) => $body,
            $crate::Tensor::U16($a) => $body,
            $crate::Tensor::I32($a) => $body,
            $crate::Tensor::U32($a) => $body,
            $crate::Tensor::I64($a) => $body,
            $crate::Tensor::U64($a) => $body,
            $crate::Tensor::Bool($a) => $body,
        }
    };
}

/// Like [`with_array!`] but rebuilds a tensor of the same variant from `$body`'s array
/// (for dtype-preserving data movement: transpose, slice, gather, ...).
#[macro_export]
macro_rules! map_array {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $crate::Tensor::F32($body),
            $crate::Tensor::F64($a) => $crate::Tensor::F64($body),
            $crate::Tensor::F16($a) => $crate::Tensor::F16($body),
            $crate::Tensor::BF16($a) => $crate::Tensor::BF16($body),
            $crate::Tensor::I8($a) => $crate::Tensor::I8($body),
            $crate::Tensor::U8($a) => $crate::Tensor::U8($body),
            $crate::Tensor::I16($a) => $crate::Tensor::I16($body),
            $crate::Tensor::U16($a) => $crate::Tensor::U16($body),
            $crate::Tensor::I32($a) => $crate::Tensor::I32($body),
            $crate::Tensor::U32($a) => $crate::Tensor::U32($body),
            $crate::Tensor::I64($a) => $crate::Tensor::I64($body),
            $crate::Tensor::U64($a) => $crate::Tensor::U64($body),
            $crate::Tensor::Bool($a) => $crate::Tensor::Bool($body),
        }
    };
}

/// Why bytes could not become a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dtype} tensor of shape {dims:?} needs {expected} bytes, got {actual}")]
pub struct BytesSizeError {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub expected: usize,
    pub actual: usize,
}

fn decode<T, const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    // `as_chunks` hands out `&[u8; N]` directly, so the loop has no per-element length
    // check and compiles to a straight copy on little-endian targets.
    let (chunks, rest) = bytes.as_chunks::<N>();
    debug_assert!(rest.is_empty(), "length checked by the caller");
    chunks.iter().map(|c| f(*c)).collect()
}

fn arr<T>(dims: &[usize], v: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(dims), v).expect("element count checked by caller")
}

/// What [`Bindings::check`](rafter_ir::Bindings::check) reads of a tensor.
impl rafter_ir::Shaped for Tensor {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }

    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::I8(_) => DType::I8,
            Tensor::U8(_) => DType::U8,
            Tensor::I16(_) => DType::I16,
            Tensor::U16(_) => DType::U16,
            Tensor::I32(_) => DType::I32,
            Tensor::U32(_) => DType::U32,
            Tensor::I64(_) => DType::I64,
            Tensor::U64(_) => DType::U64,
            Tensor::Bool(_) => DType::Bool,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    pub fn len(&self) -> usize {
        with_array!(self, a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds a tensor from packed little-endian bytes (the layout of constants, `.npy`
    /// payloads and ONNX raw_data).
    pub fn from_le_bytes(
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<Tensor, BytesSizeError> {
        let n: Option<usize> = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let expected = n.and_then(|n| n.checked_mul(dtype.size_of()));
        if expected != Some(bytes.len()) {
            return Err(BytesSizeError {
                dtype,
                dims: dims.to_vec(),
                expected: expected.unwrap_or(usize::MAX),
                actual: bytes.len(),
            });
        }
        Ok(match dtype {
            DType::F32 => Tensor::F32(arr(dims, decode(bytes, f32::from_le_bytes))),
            DType::F64 => Tensor::F64(arr(dims, decode(bytes, f64::from_le_bytes))),
            DType::F16 => Tensor::F16(arr(dims, decode(bytes, f16::from_le_bytes))),
            DType::BF16 => Tensor::BF16(arr(dims, decode(bytes, bf16::from_le_bytes))),
            DType::I8 => Tensor::I8(arr(dims, decode(bytes, i8::from_le_bytes))),
            DType::U8 => Tensor::U8(arr(dims, bytes.to_vec())),
            DType::I16 => Tensor::I16(arr(dims, decode(bytes, i16::from_le_bytes))),
            DType::U16 => Tensor::U16(arr(dims, decode(bytes, u16::from_le_bytes))),
            DType::I32 => Tensor::I32(arr(dims, decode(bytes, i32::from_le_bytes))),
            DType::U32 => Tensor::U32(arr(dims, decode(bytes, u32::from_le_bytes))),
            DType::I64 => Tensor::I64(arr(dims, decode(bytes, i64::from_le_bytes))),
            DType::U64 => Tensor::U64(arr(dims, decode(bytes, u64::from_le_bytes))),
            DType::Bool => Tensor::Bool(arr(dims, bytes.iter().map(|&b| b != 0).collect())),
        })
    }

    /// [`to_le_bytes`](Tensor::to_le_bytes), borrowed where the storage already is those
    /// bytes (a contiguous f32, i32 or i64 tensor on a little-endian host): writing a call's
    /// input into its device buffer then copies it once instead of twice (MobileNetV2's
    /// 602 KB input, on the critical path of every call).
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        #[cfg(target_endian = "little")]
        {
            let borrowed = match self {
                Tensor::F32(a) => a.as_slice().map(bytemuck::cast_slice),
                Tensor::I32(a) => a.as_slice().map(bytemuck::cast_slice),
                Tensor::I64(a) => a.as_slice().map(bytemuck::cast_slice),
                _ => None,
            };
            if let Some(bytes) = borrowed {
                return std::borrow::Cow::Borrowed(bytes);
            }
        }
        std::borrow::Cow::Owned(self.to_le_bytes())
    }

    /// Packed little-endian bytes in row-major order.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn pack<T: Copy, const N: usize>(a: &ArrayD<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
            let mut out = vec![0u8; a.len() * N];
            let (chunks, _) = out.as_chunks_mut::<N>();
            // Row-major order either way; the contiguous case skips ndarray's general
            // (per-element index stepping) iterator.
            match a.as_slice() {
                Some(xs) => chunks.iter_mut().zip(xs).for_each(|(c, &x)| *c = f(x)),
                None => chunks
                    .iter_mut()
                    .zip(a.iter())
                    .for_each(|(c, &x)| *c = f(x)),
            }
            out
        }
        match self {
            Tensor::F32(a) => pack(a, f32::to_le_bytes),
            Tensor::F64(a) => pack(a, f64::to_le_bytes),
            Tensor::F16(a) => pack(a, f16::to_le_bytes),
            Tensor::BF16(a) => pack(a, bf16::to_le_bytes),
            Tensor::I8(a) => pack(a, i8::to_le_bytes),
            Tensor::U8(a) => pack(a, u8::to_le_bytes),
            Tensor::I16(a) => pack(a, i16::to_le_bytes),
            Tensor::U16(a) => pack(a, u16::to_le_bytes),
            Tensor::I32(a) => pack(a, i32::to_le_bytes),
            Tensor::U32(a) => pack(a, u32::to_le_bytes),
            Tensor::I64(a) => pack(a, i64::to_le_bytes),
            Tensor::U64(a) => pack(a, u64::to_le_bytes),
            Tensor::Bool(a) => a.iter().map(|&b| b as u8).collect(),
        }
    }

    /// Materialises a graph constant (a copy: constants stay zero-copy in the graph).
    pub fn from_const(c: &ConstData) -> Tensor {
        Tensor::from_le_bytes(c.dtype, &c.dims, &c.bytes)
            .expect("ConstData sizes are checked on construction")
    }

    /// Wraps the tensor as a constant.
    pub fn to_const(&self) -> ConstData {
        ConstData::new(
            self.dtype(),
            self.shape().to_vec(),
            Bytes::from(self.to_le_bytes()),
        )
        .expect("sizes agree")
    }

    /// The elements converted to f64 (exact for every dtype except 64-bit ints above 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            Tensor::F32(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::F64(a) => a.iter().copied().collect(),
            Tensor::F16(a) => a.iter().map(|x| x.to_f64()).collect(),
            Tensor::BF16(a) => a.iter().map(|x| x.to_f64()).collect(),
            Tensor::I8(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::U8(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::I16(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::U16(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::I32(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::U32(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::I64(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::U64(a) => a.iter().map(|&x| x as f64).collect(),
            Tensor::Bool(a) => a.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

    /// The elements as i64 when the dtype is an integer or bool (indices, shapes, axes).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Tensor::I8(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::U8(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::I16(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::U16(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::I32(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::U32(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::I64(a) => a.iter().copied().collect(),
            Tensor::U64(a) => a.iter().map(|&x| x as i64).collect(),
            Tensor::Bool(a) => a.iter().map(|&x| x as i64).collect(),
            _ => return None,
        })
    }

    /// An i64 tensor from values and a shape.
    pub fn i64s(dims: &[usize], v: Vec<i64>) -> Tensor {
        Tensor::I64(arr(dims, v))
    }

    /// An f32 tensor from values and a shape.
    pub fn f32s(dims: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::F32(arr(dims, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        for d in DType::ALL {
            let n = 6;
            let bytes: Vec<u8> = (0..n * d.size_of())
                .map(|i| {
                    if d == DType::Bool {
                        (i % 2) as u8
                    } else {
                        (i * 7) as u8
                    }
                })
                .collect();
            let t = Tensor::from_le_bytes(d, &[2, 3], &bytes).unwrap();
            assert_eq!(t.dtype(), d);
            assert_eq!(t.shape(), &[2, 3]);
            assert_eq!(t.to_le_bytes(), bytes, "{d}");
            assert_eq!(&*t.le_bytes(), &bytes[..], "{d}");
        }
    }

    #[test]
    fn borrowed_bytes_are_the_packed_bytes() {
        // Contiguous f32 and i64 borrow their storage; a transposed (non-contiguous) view
        // and f16 are packed; every form gives the same bytes as `to_le_bytes`.
        let f = Tensor::F32(
            ArrayD::from_shape_vec(vec![2, 3], vec![1.5, -2.0, 0.25, 3.0, -0.5, 8.0]).unwrap(),
        );
        assert!(
            matches!(f.le_bytes(), std::borrow::Cow::Borrowed(_)) == cfg!(target_endian = "little")
        );
        let i = Tensor::I64(ArrayD::from_shape_vec(vec![3], vec![1, -2, 1 << 40]).unwrap());
        let Tensor::F32(a) = &f else { unreachable!() };
        let t = Tensor::F32(a.t().to_owned().into_dyn());
        let tv = Tensor::F32(a.clone().reversed_axes());
        let h = Tensor::F16(ArrayD::from_elem(vec![2], f16::from_f32(1.5)));
        for x in [&f, &i, &t, &tv, &h] {
            assert_eq!(&*x.le_bytes(), &x.to_le_bytes()[..]);
        }
        assert!(matches!(tv.le_bytes(), std::borrow::Cow::Owned(_)));
    }

    #[test]
    fn size_mismatch_is_an_error() {
        let e = Tensor::from_le_bytes(DType::F32, &[2, 2], &[0; 15]).unwrap_err();
        assert_eq!((e.expected, e.actual), (16, 15));
        assert!(Tensor::from_le_bytes(DType::F32, &[usize::MAX, 2], &[]).is_err());
    }
}
