//! `matmul_block_quant` (ONNX Runtime's MatMulNBits, weights kept in its packed layout) on
//! `rafter-kernels-cpu`'s `nbits_matmul`: the weights are read in place from the
//! artifact, never copied or widened to f32 as a whole.

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op};
use rafter_kernels_cpu::{nbits_matmul, MatMut, MatRef, NBitsRef};

use super::{input_of, In, NativeKernel, Out, Par};

/// `y = a · dequant(b)ᵀ (+ bias)` over operands `a, b, scales, zero_points?, bias?`.
pub(super) struct BlockQuantKernel {
    k: usize,
    n: usize,
    bits: usize,
    block: usize,
    /// ORT's `accuracy_level` 4: activations rounded to int8 per block.
    int8: bool,
    a: usize,
    b: usize,
    scales: usize,
    zero_points: Option<usize>,
    bias: Option<usize>,
    par: Par,
}

/// The kernel for a body that is one `matmul_block_quant` with integer (or absent) zero
/// points.
pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let Op::MatMulBlockQuant {
        k,
        n,
        bits,
        block_size,
        accuracy_level,
    } = node.op
    else {
        return None;
    };
    if body.outputs.len() != 1 {
        return None;
    }
    let optional = |i: usize, dtype: DType| match node.inputs.get(i).copied().flatten() {
        None => Some(None),
        Some(v) => input_of(body, Some(v), dtype).map(Some),
    };
    Some(Arc::new(BlockQuantKernel {
        k: usize::try_from(k).ok()?,
        n: usize::try_from(n).ok()?,
        bits: usize::try_from(bits).ok()?,
        block: usize::try_from(block_size).ok()?,
        int8: accuracy_level == 4,
        a: input_of(body, node.input(0), DType::F32)?,
        b: input_of(body, node.input(1), DType::U8)?,
        scales: input_of(body, node.input(2), DType::F32)?,
        zero_points: optional(3, DType::U8)?,
        bias: optional(4, DType::F32)?,
        par: par.clone(),
    }))
}

impl NativeKernel for BlockQuantKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (k, n) = (self.k, self.n);
        let a = &ins[self.a];
        if a.dims.last() != Some(&k) || outs[0].dims.last() != Some(&n) {
            return Ok(false);
        }
        let m = a.len() / k.max(1);
        if outs[0].dims.iter().product::<usize>() != m * n {
            return Ok(false);
        }
        let err = |e: rafter_kernels_cpu::GemmError| format!("matmul_block_quant: {e}");
        let w = NBitsRef::new(
            ins[self.b].bytes(),
            ins[self.scales].f32s()?,
            self.zero_points.map(|z| ins[z].bytes()),
            n,
            k,
            self.bits,
            self.block,
        )
        .map_err(err)?
        .with_int8_activations(self.int8);
        let bias = match self.bias {
            Some(b) => Some(ins[b].f32s()?),
            None => None,
        };
        let x = MatRef::row_major(a.f32s()?, m, k, k).map_err(err)?;
        let y = MatMut::row_major(outs[0].f32s()?, m, n, n).map_err(err)?;
        nbits_matmul(x, w, bias, y, &*self.par).map_err(err)?;
        Ok(true)
    }
}
