//! Layer normalisation of f32 rows on borrowed operands, by `rafter-kernels-cpu`'s
//! vectorised layer norm (within a few ulp of the reference, which computes in f64; the
//! tensor path's `fallback::single_op` loop is bitwise but about 10x slower).
//!
//! f16 rows go through the same kernel: widened to f32, the prologue's sums rounded to f16
//! after each add as the reference rounds each op's result, normalised in f32, and rounded
//! to f16 once at the end. BERT-base exported in f16 keeps its embedding layer norm on the
//! CPU (its position embedding is broadcast over the batch), and the reference path took
//! 13 ms a call for it on the H100's host.

use std::sync::Arc;

use half::{f16, slice::HalfFloatSliceExt};
use rafter_ir::{BinaryOp, DType, Graph, Op, ValueId};

use super::{input_of, In, NativeKernel, Out, Par};

struct LayerNormKernel {
    x: usize,
    /// More inputs added to `x` first (BERT's embeddings: word + token type + position), of
    /// `x`'s dims or repeating over its leading dims ([`repeats_over`]).
    addends: Vec<usize>,
    scale: usize,
    bias: Option<usize>,
    axis: i64,
    eps: f32,
    /// F32 or F16: every operand and the result have it.
    dtype: DType,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let (node, prologue) = body.nodes.split_last()?;
    let Op::LayerNorm { axis, epsilon } = node.op else {
        return None;
    };
    if node.outputs.iter().skip(1).any(Option::is_some) || body.outputs != [node.outputs[0]?] {
        return None;
    }
    let dtype = body.value(node.outputs[0]?).ty.dtype;
    if dtype != DType::F32 && dtype != DType::F16 {
        return None;
    }
    let bias = match node.inputs.get(2) {
        None | Some(None) => None,
        Some(b) => Some(input_of(body, *b, dtype)?),
    };
    let (x, addends) = add_chain(body, prologue, node.inputs[0]?, dtype)?;
    Some(Arc::new(LayerNormKernel {
        x,
        addends,
        scale: input_of(body, *node.inputs.get(1)?, dtype)?,
        bias,
        axis,
        eps: epsilon,
        dtype,
        par: par.clone(),
    }))
}

/// `v` as a sum of body inputs through the `add` nodes `prologue` (each used once, in
/// order): the first input and the others. No prologue: `v` itself is an input.
fn add_chain(
    body: &Graph,
    prologue: &[rafter_ir::Node],
    v: ValueId,
    dtype: DType,
) -> Option<(usize, Vec<usize>)> {
    let input = |v: Option<ValueId>| input_of(body, v, dtype);
    let Some((first, rest)) = prologue.split_first() else {
        return Some((input(Some(v))?, Vec::new()));
    };
    let is_add = |n: &rafter_ir::Node| {
        n.op == (Op::Binary { op: BinaryOp::Add }) && n.inputs.len() == 2 && n.outputs.len() == 1
    };
    if !is_add(first) {
        return None;
    }
    let x = input(first.inputs[0])?;
    let mut addends = vec![input(first.inputs[1])?];
    let mut cur = first.outputs[0]?;
    for n in rest {
        if !is_add(n) {
            return None;
        }
        let other = match (n.inputs[0], n.inputs[1]) {
            (Some(a), b) if a == cur => b,
            (a, Some(b)) if b == cur => a,
            _ => return None,
        };
        addends.push(input(other)?);
        cur = n.outputs[0]?;
    }
    // The chain's result must be what the norm reads, and used nowhere else.
    (cur == v && super::read_once(body, cur)).then_some((x, addends))
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
        if self
            .addends
            .iter()
            .any(|&i| !repeats_over(&ins[i].dims, &x.dims))
            || [Some(self.scale), self.bias]
                .into_iter()
                .flatten()
                .any(|i| ins[i].len() != cols)
        {
            return Ok(false);
        }
        if cols == 0 {
            return Ok(true);
        }
        let bias = self.bias.map(|b| &ins[b]);
        if self.dtype == DType::F16 {
            return self.run_f16(ins, bias, &mut outs[0], cols);
        }
        // The prologue's sum is added row by row inside the norm, in the body's order
        // (bitwise the reference's adds).
        let addends = self
            .addends
            .iter()
            .map(|&i| ins[i].f32s())
            .collect::<Result<Vec<_>, _>>()?;
        let scale = ins[self.scale].f32s()?;
        let bias = bias.map(In::f32s).transpose()?;
        let y = outs[0].f32s()?;
        rafter_kernels_cpu::add_layer_norm(
            x.f32s()?,
            &addends,
            y,
            cols,
            scale,
            bias,
            self.eps,
            &*self.par,
        )
        .map_err(|e| format!("layer norm: {e}"))?;
        Ok(true)
    }
}

impl LayerNormKernel {
    /// The f16 case: widened, summed with the reference's per-op rounding, normalised in
    /// f32, rounded once into the result.
    fn run_f16(
        &self,
        ins: &[In<'_>],
        bias: Option<&In<'_>>,
        y: &mut Out<'_>,
        cols: usize,
    ) -> Result<bool, String> {
        let mut xs = widen(&ins[self.x]);
        let mut halves = vec![f16::ZERO; xs.len()];
        for &i in &self.addends {
            for (s, a) in xs.iter_mut().zip(widen(&ins[i]).into_iter().cycle()) {
                *s += a;
            }
            // Each add's result rounded to f16, as the reference stores it.
            halves.convert_from_f32_slice(&xs);
            halves.convert_to_f32_slice(&mut xs);
        }
        let scale = widen(&ins[self.scale]);
        let bias = bias.map(widen);
        let mut out = vec![0f32; xs.len()];
        rafter_kernels_cpu::layer_norm(
            &xs,
            &mut out,
            cols,
            &scale,
            bias.as_deref(),
            self.eps,
            &*self.par,
        )
        .map_err(|e| format!("layer norm: {e}"))?;
        match super::operands::f16s_mut(y.bytes_mut()) {
            Some(y) => y.convert_from_f32_slice(&out),
            None => return Ok(false),
        }
        Ok(true)
    }
}

/// The f32 values of an f16 operand. Converted as a slice: `half` then uses the CPU's
/// conversion instructions (F16C) where present. Element by element, one 128×768 f16
/// layer norm of BERT-base took ~430 µs, as slices ~200 µs (`rafter bench` of the f16
/// model compiled for the CPU, `--threads 2`, traced, this 2-core machine, loaded; see
/// `benchmarks/RESULTS.md`, f16 section).
fn widen(x: &In<'_>) -> Vec<f32> {
    let halves = super::operands::f16s(x.bytes());
    let mut out = vec![0f32; halves.len()];
    halves.convert_to_f32_slice(&mut out);
    out
}

/// Whether an addend of dims `a` broadcast against `x` repeats whole over `x`'s leading
/// dims: `a`, less leading 1s, is a suffix of `x`'s dims (a position embedding `[1, S, H]`
/// or `[S, H]` added to every batch entry of `[B, S, H]`). Its elements then cycle over x's.
fn repeats_over(a: &[usize], x: &[usize]) -> bool {
    let lead = a.iter().take_while(|&&d| d == 1).count();
    let a = &a[lead..];
    a.len() <= x.len() && x.ends_with(a) && a.iter().product::<usize>() > 0
}
