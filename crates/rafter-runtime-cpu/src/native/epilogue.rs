//! The elementwise tail of a contraction kernel (`matmul, binary.add, binary.add`,
//! `conv, binary.add, unary.relu`, `conv, clip`, `matmul, binary.mul`): parsed from the body
//! once, resolved against each call's operand shapes, and run inside the GEMM's epilogue
//! (bias, residual, relu, scale, and for convolutions clip's bounds too) or as one pass over
//! the result (clip's bounds after a matmul or a Winograd convolution: [`Resolved::post`]).

use rafter_ir::{BinaryOp, DType, Graph, Op, UnaryOp, ValueId};
use rafter_kernels_cpu::{Activation, ChannelTail};

use super::input_of;
use super::operands::In;

/// Where a secondary f32 operand (a bias, a scale, a clip bound) comes from: a body input
/// (an operand of the dispatch), or a small constant the compiler copied into the body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Src {
    Input(usize),
    Const { dims: Vec<usize>, data: Vec<f32> },
}

impl Src {
    /// `v` when it is an f32 body input or f32 body constant.
    pub(crate) fn of(body: &Graph, v: Option<ValueId>) -> Option<Src> {
        let v = v?;
        if let Some(i) = input_of(body, Some(v), DType::F32) {
            return Some(Src::Input(i));
        }
        let c = body.const_of(v)?;
        if c.dtype != DType::F32 {
            return None;
        }
        let data: Vec<f32> = c
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        // A constant whose bytes disagree with its dims (a corrupt artifact) is not used.
        if data.len() != c.dims.iter().product::<usize>() || c.bytes.len() % 4 != 0 {
            return None;
        }
        Some(Src::Const {
            dims: c.dims.clone(),
            data,
        })
    }

    /// Its dims and elements for this dispatch.
    pub(crate) fn get<'a>(&'a self, ins: &'a [In<'a>]) -> Result<(&'a [usize], &'a [f32]), String> {
        match self {
            Src::Input(i) => Ok((&ins[*i].dims, ins[*i].f32s()?)),
            Src::Const { dims, data } => Ok((dims, data)),
        }
    }
}

/// One op of the tail, applied to the running value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum EpiOp {
    Add(Src),
    Mul(Src),
    Relu,
    Clip { min: Option<Src>, max: Option<Src> },
}

/// The nodes after node 0 as a chain over node 0's result `root`: each takes the running
/// value (used nowhere else) and at most one f32 body input; the last result is the body's
/// only output. `None` for any other body.
pub(crate) fn parse_chain(body: &Graph, root: ValueId) -> Option<Vec<EpiOp>> {
    parse_chain_from(body, root, 1)
}

/// [`parse_chain`] for a root computed by node `start - 1` (a contraction behind a prologue,
/// such as the unpacking of a pre-packed weight): the chain is `body.nodes[start..]`.
pub(crate) fn parse_chain_from(body: &Graph, root: ValueId, start: usize) -> Option<Vec<EpiOp>> {
    let (chain, cur, next) = parse_chain_until(body, root, start, |_| false)?;
    if next != body.nodes.len() || body.value(cur).ty.dtype != DType::F32 || body.outputs != [cur] {
        return None;
    }
    Some(chain)
}

/// [`parse_chain_from`], or a chain that ends with a `sigmoid` (a gate, as a branch of a
/// CNN has it): the chain before the sigmoid and `true`. A kernel taking it applies the
/// sigmoid in one vectorised pass over its result after the epilogue, which it cannot fuse.
pub(crate) fn parse_chain_then_sigmoid(
    body: &Graph,
    root: ValueId,
    start: usize,
) -> Option<(Vec<EpiOp>, bool)> {
    if let Some(chain) = parse_chain_from(body, root, start) {
        return Some((chain, false));
    }
    let is_sigmoid = |n: &rafter_ir::Node| {
        matches!(
            n.op,
            Op::Unary {
                op: UnaryOp::Sigmoid
            }
        )
    };
    let (chain, cur, at) = parse_chain_until(body, root, start, is_sigmoid)?;
    let last = body.nodes.get(at)?;
    let out = (*last.outputs.first()?)?;
    let covered = at + 1 == body.nodes.len()
        && last.inputs == [Some(cur)]
        && last.outputs.len() == 1
        && body.value(cur).ty.dtype == DType::F32
        && body.value(out).ty.dtype == DType::F32
        && body.outputs == [out];
    covered.then_some((chain, true))
}

/// The chain over `root` in `body.nodes[start..]` up to the first node that `stop` picks
/// (a fused block's next contraction), with the running value there and that node's index
/// (the body's length when none stops it). The running value is read once, by that node.
pub(crate) fn parse_chain_until(
    body: &Graph,
    root: ValueId,
    start: usize,
    stop: impl Fn(&rafter_ir::Node) -> bool,
) -> Option<(Vec<EpiOp>, ValueId, usize)> {
    let mut cur = root;
    let mut chain = Vec::new();
    for (i, node) in body.nodes.iter().enumerate().skip(start) {
        if stop(node) {
            return (node.input(0) == Some(cur) && super::read_once(body, cur))
                .then_some((chain, cur, i));
        }
        if !super::read_once(body, cur) || node.outputs.len() != 1 {
            return None;
        }
        let other = |i: usize| Src::of(body, *node.inputs.get(i)?);
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
    Some((chain, cur, body.nodes.len()))
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
fn scalar<'a>(x: &'a Src, ins: &'a [In<'a>]) -> Result<Option<f32>, String> {
    let (_, v) = x.get(ins)?;
    Ok((v.len() == 1).then(|| v[0]))
}

/// Resolves `chain` for an output of `out_dims`, whose channels lie along `channel_axis`:
/// an added operand is a per-channel bias when, right-aligned against the output, it is 1
/// everywhere but the channel axis; a residual when it has the output's dims, or (with
/// `repeat_residual`, for batched products) the output's last two dims and 1 before them,
/// one matrix added to every batch entry (an attention mask over all heads): the caller then
/// reads the residual at offsets modulo its length. `bias` is a bias the contraction itself
/// has (conv's third operand). `Ok(None)`: not covered.
pub(crate) fn resolve<'a>(
    chain: &'a [EpiOp],
    ins: &'a [In<'a>],
    out_dims: &[usize],
    channel_axis: usize,
    mut bias: Option<&'a [f32]>,
    repeat_residual: bool,
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
            EpiOp::Mul(ref x) => {
                let Some(s) = scalar(x, ins)? else {
                    return Ok(None);
                };
                if added || activated {
                    return Ok(None);
                }
                r.alpha *= s;
            }
            EpiOp::Add(ref x) => {
                added = true;
                let (dims, data) = x.get(ins)?;
                let rank = out_dims.len();
                let repeats = repeat_residual
                    && rank >= 2
                    && dims.len() >= 2
                    && dims[dims.len() - 2..] == out_dims[rank - 2..]
                    && dims[..dims.len() - 2].iter().all(|&d| d == 1);
                if (dims == out_dims || repeats) && r.residual.is_none() && r.clamp.is_none() {
                    r.residual = Some(data);
                    r.res_before = !activated;
                } else if per_channel(dims) && bias.is_none() && !activated {
                    bias = Some(data);
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
            EpiOp::Clip { ref min, ref max } => {
                if activated {
                    return Ok(None);
                }
                activated = true;
                let bound = |x: &'a Option<Src>, none: f32| -> Result<Option<f32>, String> {
                    match x {
                        None => Ok(Some(none)),
                        Some(x) => scalar(x, ins),
                    }
                };
                let (Some(lo), Some(hi)) =
                    (bound(min, f32::NEG_INFINITY)?, bound(max, f32::INFINITY)?)
                else {
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

/// [`resolve`] for a convolution whose own bias operand is `bias`: covered only when the
/// bias has one value per output channel and the tail scales nothing (a scale would have
/// to apply before the bias). The output's channels lie along `channel_axis`.
pub(crate) fn resolve_conv<'a>(
    chain: &'a [EpiOp],
    bias: Option<&'a Src>,
    ins: &'a [In<'a>],
    out_dims: &[usize],
    channel_axis: usize,
) -> Result<Option<Resolved<'a>>, String> {
    let bias = match bias {
        Some(b) => match b.get(ins)? {
            (_, data) if data.len() == out_dims[channel_axis] => Some(data),
            _ => return Ok(None),
        },
        None => None,
    };
    if bias.is_some() && chain.iter().any(|o| matches!(o, EpiOp::Mul(_))) {
        return Ok(None);
    }
    resolve(chain, ins, out_dims, channel_axis, bias, false)
}

impl<'a> Resolved<'a> {
    /// The tail as the direct convolution kernels take it (`resolve` yields no activation
    /// but relu).
    pub(crate) fn channel_tail(&self) -> ChannelTail<'a> {
        ChannelTail {
            alpha: self.alpha,
            bias: self.bias,
            residual: self.residual,
            res_before: self.res_before,
            relu: self.act == Activation::Relu,
            clamp: self.clamp,
        }
    }

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
