//! Layer normalisation of f32 rows on borrowed operands, by `rafter-kernels-cpu`'s
//! vectorised layer norm (within a few ulp of the reference, which computes in f64; the
//! reference path's `fast_ops` loop is bitwise but about 10x slower).

use std::sync::Arc;

use rafter_ir::{BinaryOp, DType, Graph, Op, ValueId};

use super::{input_of, In, NativeKernel, Out, Par};

struct LayerNormKernel {
    x: usize,
    /// More inputs added to `x` first (BERT's embeddings: word + token type + position), all
    /// of `x`'s dims.
    addends: Vec<usize>,
    scale: usize,
    bias: Option<usize>,
    axis: i64,
    eps: f32,
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
    let bias = match node.inputs.get(2) {
        None | Some(None) => None,
        Some(b) => Some(input_of(body, *b, DType::F32)?),
    };
    let (x, addends) = add_chain(body, prologue, node.inputs[0]?)?;
    Some(Arc::new(LayerNormKernel {
        x,
        addends,
        scale: input_of(body, *node.inputs.get(1)?, DType::F32)?,
        bias,
        axis,
        eps: epsilon,
        par: par.clone(),
    }))
}

/// `v` as a sum of body inputs through the `add` nodes `prologue` (each used once, in
/// order): the first input and the others. No prologue: `v` itself is an input.
fn add_chain(
    body: &Graph,
    prologue: &[rafter_ir::Node],
    v: ValueId,
) -> Option<(usize, Vec<usize>)> {
    let input = |v: Option<ValueId>| input_of(body, v, DType::F32);
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
    let uses = body
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter())
        .filter(|&&i| i == Some(cur))
        .count();
    (cur == v && uses == 1 && !body.outputs.contains(&cur)).then_some((x, addends))
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
        if self.addends.iter().any(|&i| ins[i].dims != x.dims) {
            return Ok(false);
        }
        let mut sum = Vec::new();
        let xs = if self.addends.is_empty() {
            x.f32s()?
        } else {
            // The prologue's sum, added in the body's order (bitwise the reference's adds).
            sum.extend_from_slice(x.f32s()?);
            for &i in &self.addends {
                for (s, a) in sum.iter_mut().zip(ins[i].f32s()?) {
                    *s += a;
                }
            }
            &sum[..]
        };
        let y = outs[0].f32s()?;
        if cols == 0 {
            return Ok(true);
        }
        rafter_kernels_cpu::layer_norm(xs, y, cols, scale, bias, self.eps, &*self.par)
            .map_err(|e| format!("layer norm: {e}"))?;
        Ok(true)
    }
}
