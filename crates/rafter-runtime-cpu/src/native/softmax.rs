//! Softmax over the last axis, alone or after an additive mask (`binary.add,
//! softmax.softmax`, BERT's attention), by `rafter-kernels-cpu`'s vectorised softmax on
//! borrowed operands; the mask is broadcast along rows (`[b, 1, 1, k]` against
//! `[b, h, q, k]`), other broadcasts fall back to the reference path.

use std::sync::Arc;

use rafter_ir::{BinaryOp, DType, Graph, Op, SoftmaxKind};
use rafter_kernels_cpu::RowMask;

use super::{input_of, In, NativeKernel, Out, Par};

struct SoftmaxKernel {
    x: usize,
    mask: Option<usize>,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let (sm, add) = match body.nodes.as_slice() {
        [sm] => (sm, None),
        [add, sm] => (sm, Some(add)),
        _ => return None,
    };
    let Op::Softmax {
        kind: SoftmaxKind::Softmax,
        axis,
    } = sm.op
    else {
        return None;
    };
    let [Some(y)] = sm.outputs.as_slice() else {
        return None;
    };
    let rank = body.value(*y).ty.rank();
    if body.outputs != [*y] || body.value(*y).ty.dtype != DType::F32 || rank == 0 {
        return None;
    }
    if axis != -1 && axis != rank as i64 - 1 {
        return None;
    }
    let (x, mask) = match add {
        None => (
            input_of(body, sm.inputs.first().copied().flatten(), DType::F32)?,
            None,
        ),
        Some(add) => {
            if add.op != (Op::Binary { op: BinaryOp::Add })
                || add.outputs.as_slice() != [sm.inputs.first().copied().flatten()]
            {
                return None;
            }
            let a = input_of(body, add.inputs.first().copied().flatten(), DType::F32)?;
            let b = input_of(body, add.inputs.get(1).copied().flatten(), DType::F32)?;
            (a, Some(b))
        }
    };
    Some(Arc::new(SoftmaxKernel {
        x,
        mask,
        par: par.clone(),
    }))
}

impl SoftmaxKernel {
    /// The scores operand and the mask: the scores are the larger of the add's operands.
    fn operands(&self, ins: &[In<'_>]) -> (usize, Option<usize>) {
        match self.mask {
            Some(m) if ins[m].len() > ins[self.x].len() => (m, Some(self.x)),
            m => (self.x, m),
        }
    }
}

impl NativeKernel for SoftmaxKernel {
    fn out_dims(&self, ins: &[In<'_>]) -> Option<Vec<usize>> {
        Some(ins[self.operands(ins).0].dims.clone())
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (xi, mi) = self.operands(ins);
        let x = &ins[xi];
        let Some((&cols, rows_dims)) = x.dims.split_last() else {
            return Ok(false);
        };
        if outs[0].dims != x.dims {
            return Ok(false);
        }
        let mask = match mi {
            None => None,
            Some(mi) => {
                let m = &ins[mi];
                if m.dims.len() > x.dims.len() {
                    return Ok(false);
                }
                match RowMask::broadcast(m.f32s()?, rows_dims, &m.dims, cols) {
                    Ok(mask) => Some(mask),
                    Err(_) => return Ok(false),
                }
            }
        };
        let xs = x.f32s()?;
        let y = outs[0].f32s()?;
        if y.is_empty() {
            return Ok(true);
        }
        rafter_kernels_cpu::softmax(xs, y, cols, mask.as_ref(), &*self.par)
            .map_err(|e| format!("softmax: {e}"))?;
        Ok(true)
    }
}
