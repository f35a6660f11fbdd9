//! Constant tensors (weights), kept apart from the graph's ops.

use crate::DType;
use bytes::Bytes;

/// A constant tensor: packed little-endian elements in row-major order.
///
/// The bytes are a `Bytes`, so a weight imported from a memory-mapped model file is a
/// slice of that map and is never copied; cloning a `ConstData` clones a reference count.
/// The bytes carry no alignment guarantee: readers copy or use unaligned loads.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstData {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub bytes: Bytes,
}

/// Why bytes and a shape disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("constant of type {dtype}{dims:?} needs {expected} bytes, got {actual}")]
pub struct ConstSizeError {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub expected: usize,
    pub actual: usize,
}

impl ConstData {
    /// Wraps bytes after checking their length against the shape.
    pub fn new(dtype: DType, dims: Vec<usize>, bytes: Bytes) -> Result<ConstData, ConstSizeError> {
        let expected = dims
            .iter()
            .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d));
        match expected {
            Some(e) if e == bytes.len() => Ok(ConstData { dtype, dims, bytes }),
            _ => Err(ConstSizeError {
                dtype,
                dims,
                expected: expected.unwrap_or(usize::MAX),
                actual: bytes.len(),
            }),
        }
    }

    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// A rank-1 i64 constant (shapes, axes, pads).
    pub fn from_i64s(values: &[i64]) -> ConstData {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        ConstData {
            dtype: DType::I64,
            dims: vec![values.len()],
            bytes: Bytes::from(bytes),
        }
    }

    /// A rank-1 f32 constant.
    pub fn from_f32s(values: &[f32]) -> ConstData {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        ConstData {
            dtype: DType::F32,
            dims: vec![values.len()],
            bytes: Bytes::from(bytes),
        }
    }

    /// The elements as i64 when the dtype is an integer type (shape arithmetic needs this).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        let b = &self.bytes;
        let n = self.num_elements();
        let out = match self.dtype {
            DType::I64 => (0..n)
                .map(|i| i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()))
                .collect(),
            DType::I32 => (0..n)
                .map(|i| i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64)
                .collect(),
            DType::U8 => b.iter().map(|&x| x as i64).collect(),
            DType::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
            DType::I16 => (0..n)
                .map(|i| i16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()) as i64)
                .collect(),
            DType::U16 => (0..n)
                .map(|i| u16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()) as i64)
                .collect(),
            DType::U32 => (0..n)
                .map(|i| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64)
                .collect(),
            DType::U64 => (0..n)
                .map(|i| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as i64)
                .collect(),
            DType::Bool => b.iter().map(|&x| (x != 0) as i64).collect(),
            _ => return None,
        };
        Some(out)
    }

    /// The elements as f64 for any dtype (used by folding and printing small constants).
    pub fn to_f64s(&self) -> Vec<f64> {
        let b = &self.bytes;
        let n = self.num_elements();
        let at = |i: usize, w: usize| &b[i * w..i * w + w];
        match self.dtype {
            DType::F32 => (0..n)
                .map(|i| f32::from_le_bytes(at(i, 4).try_into().unwrap()) as f64)
                .collect(),
            DType::F64 => (0..n)
                .map(|i| f64::from_le_bytes(at(i, 8).try_into().unwrap()))
                .collect(),
            DType::F16 => (0..n)
                .map(|i| half::f16::from_le_bytes(at(i, 2).try_into().unwrap()).to_f64())
                .collect(),
            DType::BF16 => (0..n)
                .map(|i| half::bf16::from_le_bytes(at(i, 2).try_into().unwrap()).to_f64())
                .collect(),
            DType::U64 => (0..n)
                .map(|i| u64::from_le_bytes(at(i, 8).try_into().unwrap()) as f64)
                .collect(),
            _ => self
                .to_i64s()
                .unwrap_or_default()
                .into_iter()
                .map(|v| v as f64)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_checked() {
        assert!(ConstData::new(DType::F32, vec![2, 3], Bytes::from(vec![0u8; 24])).is_ok());
        let e = ConstData::new(DType::F32, vec![2, 3], Bytes::from(vec![0u8; 20])).unwrap_err();
        assert_eq!((e.expected, e.actual), (24, 20));
        assert!(ConstData::new(DType::F64, vec![usize::MAX, 4], Bytes::new()).is_err());
    }

    #[test]
    fn integer_views() {
        let c = ConstData::from_i64s(&[1, -2, 3]);
        assert_eq!(c.to_i64s(), Some(vec![1, -2, 3]));
        assert_eq!(c.to_f64s(), vec![1.0, -2.0, 3.0]);
        assert_eq!(ConstData::from_f32s(&[1.5]).to_i64s(), None);
    }
}
