//! Tensor types: a dtype and a ranked shape of (possibly symbolic) dims.

use crate::{DType, Dim};
use std::fmt;

/// The type of an SSA value. Rank is always known; each dim may be symbolic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> TensorType {
        TensorType { dtype, dims }
    }

    /// A type whose dims are all known.
    pub fn known(dtype: DType, dims: &[i64]) -> TensorType {
        TensorType {
            dtype,
            dims: dims.iter().map(|&d| Dim::known(d)).collect(),
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The dims as integers if none is symbolic.
    pub fn known_dims(&self) -> Option<Vec<i64>> {
        self.dims.iter().map(Dim::as_known).collect()
    }

    /// Element count as a dim (a polynomial when dims are symbolic).
    pub fn num_elements(&self) -> Dim {
        self.dims.iter().fold(Dim::known(1), |acc, d| acc.mul(d))
    }
}

impl fmt::Display for TensorType {
    /// `f32[batch, seq, 768]`; a scalar prints as `f32[]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
