//! Reference kernels: recurrent ops.

use super::{unsupported, OpCtx, OpError};
use crate::Tensor;
use rafter_ir::Op;

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = (inputs, ctx);
    unsupported(format!("`{}` has no reference kernel yet", op.name()))
}
