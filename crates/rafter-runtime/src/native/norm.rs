//! Layer normalisation of f32 rows on borrowed operands, by `rafter-kernels-cpu`'s
//! vectorised layer norm (within a few ulp of the reference, which computes in f64; the
//! reference path's `fast_ops` loop is bitwise but about 10x slower).

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op};

use super::{input_of, In, NativeKernel, Out, Par};

struct LayerNormKernel {
    x: usize,
    scale: usize,
    bias: Option<usize>,
    axis: i64,
    eps: f32,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let Op::LayerNorm { axis, epsilon } = node.op else {
        return None;
    };
    if node.outputs.iter().skip(1).any(Option::is_some) || body.outputs != [node.outputs[0]?] {
        return None;
    }
    let bias = match node.inputs.get(2) {
        None | Some(None) => None,
        Some(b) => Some(input_of(body, *b, DType::F32)?),
    };
    Some(Arc::new(LayerNormKernel {
        x: input_of(body, node.inputs[0], DType::F32)?,
        scale: input_of(body, *node.inputs.get(1)?, DType::F32)?,
        bias,
        axis,
        eps: epsilon,
        par: par.clone(),
    }))
}

impl NativeKernel for LayerNormKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let rank = x.dims.len() as i64;
        let axis = if self.axis < 0 {
            self.axis + rank
        } else {
            self.axis
        };
        if !(0..rank).contains(&axis) || outs[0].dims != x.dims {
            return Ok(false);
        }
        let cols: usize = x.dims[axis as usize..].iter().product();
        let params = |i: usize| -> Result<Option<&[f32]>, String> {
            let p = ins[i].f32s()?;
            Ok((p.len() == cols).then_some(p))
        };
        let Some(scale) = params(self.scale)? else {
            return Ok(false);
        };
        let bias = match self.bias {
            Some(b) => match params(b)? {
                Some(p) => Some(p),
                None => return Ok(false),
            },
            None => None,
        };
        let xs = x.f32s()?;
        let y = outs[0].f32s()?;
        if cols == 0 {
            return Ok(true);
        }
        rafter_kernels_cpu::layer_norm(xs, y, cols, scale, bias, self.eps, &*self.par)
            .map_err(|e| format!("layer norm: {e}"))?;
        Ok(true)
    }
}
