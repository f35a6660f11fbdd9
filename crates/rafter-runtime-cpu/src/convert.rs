//! The runtime's tensors and the reference executor's, through their shared byte form.
//!
//! The tensor path and the host slots meet here: a slot holds a runtime
//! [`rafter_runtime::Tensor`] (what a caller passes and gets back), the reference executor
//! computes on its own [`rafter_reference::Tensor`]. Both are packed little-endian
//! elements underneath, so a conversion is one copy of the bytes.

/// A runtime tensor as a reference-executor tensor.
pub fn to_reference(t: &rafter_runtime::Tensor) -> Result<rafter_reference::Tensor, String> {
    rafter_reference::Tensor::from_le_bytes(t.dtype(), t.shape(), t.le_bytes())
        .map_err(|e| e.to_string())
}

/// A reference-executor tensor as a runtime tensor.
pub fn from_reference(t: &rafter_reference::Tensor) -> Result<rafter_runtime::Tensor, String> {
    rafter_runtime::Tensor::from_le_bytes(t.dtype(), t.shape(), &t.le_bytes())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::DType;

    #[test]
    fn every_dtype_round_trips() {
        for dtype in DType::ALL {
            let bytes: Vec<u8> = (0..3 * dtype.size_of() as u8).map(|b| b % 2).collect();
            let t = rafter_runtime::Tensor::from_le_bytes(dtype, &[3], &bytes).unwrap();
            let r = to_reference(&t).unwrap();
            assert_eq!((r.dtype(), r.shape()), (dtype, &[3usize][..]));
            assert_eq!(from_reference(&r).unwrap(), t, "{dtype}");
        }
    }
}
