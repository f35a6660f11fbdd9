//! The tensor path: kernel bodies run on owned tensors, for everything the native kernels
//! do not cover.
//!
//! Operands are decoded into the reference executor's tensors, the body runs, and results
//! are encoded back (see [`crate::dispatch`]). By default the reference executor runs the
//! body; three body shapes have faster tensor kernels that compute exactly what it does
//! (up to summation order), chosen once when the session is built:
//!
//! - [`gemm_first`]: a body starting with an f32 `matmul` (the packed GEMM, then the rest
//!   of the body on the reference executor);
//! - [`single_op`]: one f32 transpose or layer norm;
//! - [`crate::elementwise_tile::tile_kernel`]: an f32 elementwise body as a tile program.
//!
//! A caller's own kernel ([`rafter_runtime::SessionOptions::host_kernel`]) takes the place
//! of all of these for its kernel.

pub(crate) mod gemm_first;
pub(crate) mod single_op;

use std::sync::Arc;

use rafter_ir::Graph;
use rafter_reference::Tensor;
use rafter_runtime::HostKernel;

use crate::convert::{from_reference, to_reference};
use crate::native::Par;

/// A kernel on the tensor path: the body's inputs in, its outputs out, as reference tensors
/// (checked against the body's types by the caller).
pub(crate) type TensorKernel = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>, String> + Send + Sync>;

/// The fastest tensor kernel for `body`, if one covers it (else the reference executor
/// runs it), running parallel work on `par`.
pub(crate) fn select(body: &Graph, par: &Par) -> Option<TensorKernel> {
    gemm_first::matmul_kernel(body, par)
        .or_else(|| single_op::single_op_kernel(body))
        .or_else(|| crate::elementwise_tile::tile_kernel(body, par))
}

/// A caller's host kernel, on the runtime's tensors, as a tensor kernel.
pub(crate) fn host(f: HostKernel) -> TensorKernel {
    Arc::new(move |ins: &[Tensor]| {
        let ins = ins
            .iter()
            .map(from_reference)
            .collect::<Result<Vec<_>, _>>()?;
        f(&ins)?.iter().map(to_reference).collect()
    })
}
