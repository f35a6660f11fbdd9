//! The elementwise tail of a contraction kernel (`matmul, binary.add, binary.add`,
//! `conv, binary.add, unary.relu`, `conv, clip`, `matmul, binary.mul`): parsed from the body
//! once, resolved against each call's operand shapes, and run inside the GEMM's epilogue
//! (bias, residual, relu, scale) or as one pass over the result (clip's upper bound).

use rafter_ir::{BinaryOp, DType, Graph, Op, UnaryOp, ValueId};
use rafter_kernels_cpu::Activation;

use super::operands::In;
use super::input_of;

/// One op of the tail, applied to the running value; indices are body inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpiOp {
    Add(usize),
    Mul(usize),
    Relu,
    Clip {
        min: Option<usize>,
        max: Option<usize>,
    },
}

/// The nodes after node 0 as a chain over node 0's result `root`: each takes the running
/// value (used nowhere else) and at most one f32 body input; the last result is the body's
/// only output. `None` for any other body.
pub(crate) fn parse_chain(body: &Graph, root: ValueId) -> Option<Vec<EpiOp>> {
    let uses = |v: ValueId| {
        body.nodes
            .iter()
            .flat_map(|n| n.inputs.iter())
            .filter(|&&i| i == Some(v))
            .count()
    };
    let mut cur = root;
    let mut chain = Vec::new();
    for node in &body.nodes[1..] {
        if uses(cur) != 1 || body.outputs.contains(&cur) || node.outputs.len() != 1 {
            return None;
        }
        let other = |i: usize| input_of(body, *node.inputs.get(i)?, DType::F32);
        let op = match &node.op {
            Op::Binary { op } if node.inputs.len() == 2 => {
                let x = if node.inputs[0] == Some(cur) {
                    other(1)?
                } else if node.inputs[1] == Some(cur) {
                    other(0)?
                } else {
                    return None;
                };
                match op {
                    BinaryOp::Add => EpiOp::Add(x),
                    BinaryOp::Mul => EpiOp::Mul(x),
                    _ => return None,
                }
            }
            Op::Unary { op: UnaryOp::Relu } if node.inputs == [Some(cur)] => EpiOp::Relu,
            Op::Clip if node.inputs.first() == Some(&Some(cur)) && node.inputs.len() <= 3 => {
                let bound = |i: usize| match node.inputs.get(i) {
                    None | Some(None) => Some(None),
                    Some(v) => other(i).map(Some).filter(|_| v.is_some()),
                };
                EpiOp::Clip {
                    min: bound(1)?,
                    max: bound(2)?,
                }
            }
            _ => return None,
        };
        chain.push(op);
        cur = node.outputs[0]?;
    }
    if body.value(cur).ty.dtype != DType::F32 || body.outputs != [cur] {
        return None;
    }
    Some(chain)
}

/// A tail resolved for one call: `clamp(act(alpha*x + bias + res_before) + res_after)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resolved<'a> {
    pub(crate) alpha: f32,
    /// Per channel (the output's `channel_axis`), one value per channel.
    pub(crate) bias: Option<&'a [f32]>,
    /// Of the output's full shape.
    pub(crate) residual: Option<&'a [f32]>,
    pub(crate) res_before: bool,
    pub(crate) act: Activation,
    pub(crate) clamp: Option<(f32, f32)>,
}

/// A scalar operand's value.
fn scalar(x: &In<'_>) -> Result<Option<f32>, String> {
    let v = x.f32s()?;
    Ok((v.len() == 1).then(|| v[0]))
}

/// Resolves `chain` for an output of `out_dims`, whose channels lie along `channel_axis`:
/// an added operand is a per-channel bias when, right-aligned against the output, it is 1
/// everywhere but the channel axis; a residual when it has the output's dims. `bias` is a
/// bias the contraction itself has (conv's third operand). `Ok(None)`: not covered.
pub(crate) fn resolve<'a>(
    chain: &[EpiOp],
    ins: &'a [In<'a>],
    out_dims: &[usize],
    channel_axis: usize,
    mut bias: Option<&'a [f32]>,
) -> Result<Option<Resolved<'a>>, String> {
    let mut r = Resolved {
        alpha: 1.0,
        bias: None,
        residual: None,
        res_before: true,
        act: Activation::None,
        clamp: None,
    };
    let channels = out_dims[channel_axis];
    let per_channel = |d: &[usize]| {
        d.len() <= out_dims.len()
            && d.iter().rev().enumerate().all(|(i, &n)| {
                let axis = out_dims.len() - 1 - i;
                n == 1 || (axis == channel_axis && n == channels)
            })
            && d.iter().product::<usize>() == channels
    };
    let mut activated = false;
    let mut added = false;
    for op in chain {
        match *op {
            EpiOp::Mul(i) => {
                let Some(s) = scalar(&ins[i])? else {
                    return Ok(None);
                };
                if added || activated {
                    return Ok(None);
                }
                r.alpha *= s;
            }
            EpiOp::Add(i) => {
                added = true;
                let x = &ins[i];
                if x.dims == out_dims && r.residual.is_none() && r.clamp.is_none() {
                    r.residual = Some(x.f32s()?);
                    r.res_before = !activated;
                } else if per_channel(&x.dims) && bias.is_none() && !activated {
                    bias = Some(x.f32s()?);
                } else {
                    return Ok(None);
                }
            }
            EpiOp::Relu => {
                if activated {
                    return Ok(None);
                }
                activated = true;
                r.act = Activation::Relu;
            }
            EpiOp::Clip { min, max } => {
                if activated {
                    return Ok(None);
                }
                activated = true;
                let bound = |i: Option<usize>, none: f32| -> Result<Option<f32>, String> {
                    match i {
                        None => Ok(Some(none)),
                        Some(i) => scalar(&ins[i]),
                    }
                };
                let (Some(lo), Some(hi)) = (
                    bound(min, f32::NEG_INFINITY)?,
                    bound(max, f32::INFINITY)?,
                ) else {
                    return Ok(None);
                };
                if lo.is_nan() || hi.is_nan() || lo > hi {
                    return Ok(None);
                }
                if lo == 0.0 {
                    r.act = Activation::Relu;
                    if hi != f32::INFINITY {
                        r.clamp = Some((lo, hi));
                    }
                } else {
                    r.clamp = Some((lo, hi));
                }
            }
        }
        // A clamp applied after the epilogue must be the last thing that happens.
        if r.clamp.is_some() && r.residual.is_some() && !r.res_before {
            return Ok(None);
        }
    }
    r.bias = bias;
    Ok(Some(r))
}

impl Resolved<'_> {
    /// Applies the clamp (the part the GEMM epilogue cannot fuse) to results.
    pub(crate) fn post(&self, y: &mut [f32]) {
        if let Some((lo, hi)) = self.clamp {
            for v in y {
                *v = v.max(lo).min(hi);
            }
        }
    }

    /// The whole tail on raw products `y` of one channel (bias `b`), with the residual's
    /// matching elements `res`.
    pub(crate) fn apply(&self, y: &mut [f32], b: f32, res: Option<&[f32]>) {
        let before = self.res_before;
        let act = |x: f32| match self.act {
            Activation::Relu => x.max(0.0),
            _ => x,
        };
        match res {
            Some(res) => {
                for (v, &r) in y.iter_mut().zip(res) {
                    let x = self.alpha * *v + b + if before { r } else { 0.0 };
                    *v = act(x) + if before { 0.0 } else { r };
                }
            }
            None => {
                for v in y.iter_mut() {
                    *v = act(self.alpha * *v + b);
                }
            }
        }
        self.post(y);
    }
}
