//! Shape and dtype inference with symbolic dims.
//!
//! Given an op and what is known of its operands (types, and for small integer tensors
//! their element values as [`Dim`]s), computes the result types and, where the result is
//! shape arithmetic, its element values. This is what keeps `seq` symbolic through
//! Shape → Gather → Unsqueeze → Concat → Reshape in exported models, so one import serves
//! every sequence length.

use crate::{ConstData, Dim, Op, TensorType};

/// What is known of one operand at compile time.
#[derive(Clone, Copy, Debug)]
pub struct InferInput<'a> {
    pub ty: &'a TensorType,
    /// The elements (row-major) as dims, when the operand is a 0-D or 1-D integer tensor
    /// whose values are known symbolically (integer constants, shape arithmetic).
    pub sym: Option<&'a [Dim]>,
    /// The data when the operand is a constant (float scales, pad values, ...).
    pub konst: Option<&'a ConstData>,
}

/// Inference results for one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// One type per requested result.
    pub types: Vec<TensorType>,
    /// Symbolic element values per result, where known.
    pub syms: Vec<Option<Vec<Dim>>>,
}

/// Makes a fresh symbol for a dim inference cannot express (data-dependent sizes,
/// non-exact divisions). The argument is a hint for the name (e.g. the op name).
pub type Fresh<'a> = dyn FnMut(&str) -> Dim + 'a;

/// Infers the types of a node's `num_outputs` results.
///
/// Errors name the problem (rank mismatch, incompatible broadcast, bad axis); the caller
/// adds the node's name and op.
pub fn infer_node(
    op: &Op,
    inputs: &[Option<InferInput<'_>>],
    num_outputs: usize,
    fresh: &mut Fresh<'_>,
) -> Result<Inferred, String> {
    let _ = (inputs, num_outputs, fresh);
    Err(format!("shape inference for `{}` is not implemented yet", op.name()))
}
