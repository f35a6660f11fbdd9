//! Local response normalisation (ONNX LRN) of f32 NC... tensors by `rafter-kernels-cpu`'s
//! [`lrn`](rafter_kernels_cpu::lrn) on borrowed operands: channel planes split over the
//! session's pool. The reference path loops in f64 one element at a time: 21.7 ms for a
//! 1x64x56x56 map (`rafter bench --estimate` on the LRN between two Relus, 2-core machine
//! under load), 0.06 ms with this kernel on the H200 machine's 16 cores (the midgraph
//! benchmark's trace), where it had cost more than the GPU convolutions around it. Other element types take the reference path.

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op};
use rafter_kernels_cpu::Lrn;

use super::{input_of, In, NativeKernel, Out, Par};

struct LrnKernel {
    /// Body input index of the tensor.
    x: usize,
    params: Lrn,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let Op::Lrn {
        alpha,
        beta,
        bias,
        size,
    } = node.op
    else {
        return None;
    };
    let y = node.outputs.first().copied().flatten()?;
    if body.outputs != [y] || body.value(y).ty.dtype != DType::F32 || size <= 0 {
        return None;
    }
    Some(Arc::new(LrnKernel {
        x: input_of(body, *node.inputs.first()?, DType::F32)?,
        params: Lrn {
            alpha,
            beta,
            bias,
            size: usize::try_from(size).ok()?,
        },
        par: par.clone(),
    }))
}

impl NativeKernel for LrnKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        if x.dims.len() < 3 || outs[0].dims != x.dims {
            return Ok(false);
        }
        let (n, c) = (x.dims[0], x.dims[1]);
        let spatial: usize = x.dims[2..].iter().product();
        if c == 0 || n * spatial == 0 {
            return Ok(true);
        }
        rafter_kernels_cpu::lrn(
            x.f32s()?,
            outs[0].f32s()?,
            n,
            c,
            spatial,
            &self.params,
            &*self.par,
        )
        .map_err(|e| e.to_string())?;
        Ok(true)
    }
}
