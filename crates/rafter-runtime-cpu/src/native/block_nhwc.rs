//! A channels-last depthwise block (`rafter_opt::fusion`'s rule of that name): two or three
//! `conv_nhwc` in one body, `1×1 → depthwise (→ 1×1)` or `depthwise → 1×1`, each with its
//! tail, run band by band by `rafter_kernels_cpu::block_nhwc` so that the expanded rows
//! stay in the core's cache. The 1×1 convolutions' weights may be pre-packed (the body then
//! starts with their unpacking prologues, one after another, `rafter_opt::prepack`); the
//! depthwise filter is raw. Only the last convolution's tail may add a residual.
//!
//! An image's stem (a convolution of few input channels, raw weight) may take the place of
//! the expansion: `stem → depthwise (→ 1×1)`. The body may then start with the NCHW→NHWC
//! transpose of the stem's input (`rafter_opt::fusion`'s reordered stem input rule), which
//! the kernel reads in place, as the standalone stem kernel does (`super::conv_nhwc`).

use std::sync::Arc;

use rafter_ir::program::BlockConv;
use rafter_ir::{AutoPad, DType, Graph, Op, ValueId};
use rafter_kernels_cpu::{
    block_nhwc, BRef, BlockNhwc, DepthwiseStage, Epilogue, MatRef, PackedBRef, Pointwise,
    SmallConvNhwc,
};

use super::conv::geometry;
use super::conv_nhwc::{unpacked_conv_weight, window_of, WSrc};
use super::epilogue::{parse_chain_until, resolve_conv, EpiOp, Resolved, Src};
use super::matmul::packed_prologue_at;
use super::{input_of, known_dims, read_once, In, NativeKernel, Out, Par, TO_NHWC};

/// One convolution of the block and its tail.
struct Stage {
    kind: BlockConv,
    w: WSrc,
    bias: Option<Src>,
    chain: Vec<EpiOp>,
    /// `None` for a 1×1 (stride 1, no padding).
    window: Option<Window>,
}

/// A depthwise or stem stage's attributes.
struct Window {
    strides: Vec<i64>,
    pads: Vec<i64>,
    auto_pad: AutoPad,
}

struct BlockKernel {
    x: usize,
    /// Input `x` is NCHW, transposed by the body for the stem, which reads it in place.
    x_nchw: bool,
    stages: Vec<Stage>,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    // The unpacking prologues of the pre-packed 1×1 weights, one after another.
    let mut packed: Vec<(ValueId, WSrc)> = Vec::new();
    let mut at = 0;
    while let Some(p) = packed_prologue_at(body, at) {
        let (w, value, next) = unpacked_conv_weight(body, &p)?;
        packed.push((value, w));
        at = next;
    }
    let x_nchw =
        matches!(&body.nodes.get(at)?.op, Op::Transpose { perm } if perm.as_slice() == TO_NHWC);
    let x = input_of(body, body.nodes.get(at)?.input(0), DType::F32)?;
    if x_nchw {
        let xt = (*body.nodes[at].outputs.first()?)?;
        if body.nodes.get(at + 1)?.input(0) != Some(xt) || !read_once(body, xt) {
            return None;
        }
        at += 1;
    }
    let mut stages = Vec::new();
    while at < body.nodes.len() {
        let node = &body.nodes[at];
        let Op::ConvNhwc {
            strides,
            pads,
            auto_pad,
            ..
        } = &node.op
        else {
            return None;
        };
        if node.outputs.len() != 1 || !(2..=3).contains(&node.inputs.len()) {
            return None;
        }
        let w = match packed.iter().find(|(v, _)| node.input(1) == Some(*v)) {
            Some(&(_, w)) => w,
            None => WSrc::Input(input_of(body, node.input(1), DType::F32)?),
        };
        let wdims = match w {
            WSrc::Packed { kernel, .. } => kernel.to_vec(),
            WSrc::Input(_) => known_dims(body, node.input(1)?)?,
        };
        let wdims: Vec<i64> = wdims
            .into_iter()
            .map(|d| i64::try_from(d).ok())
            .collect::<Option<_>>()?;
        let kind = BlockConv::of(&node.op, wdims.try_into().ok()?)?;
        // (The kernel reads depthwise and stem filters raw; prepack packs only GEMM weights.)
        if kind != BlockConv::Pointwise && matches!(w, WSrc::Packed { .. }) {
            return None;
        }
        let bias = match node.inputs.get(2) {
            None | Some(None) => None,
            Some(b) => Some(Src::of(body, *b)?),
        };
        let stop = |n: &rafter_ir::Node| matches!(n.op, Op::ConvNhwc { .. });
        let (chain, cur, next) = parse_chain_until(body, node.outputs[0]?, at + 1, stop)?;
        if next == body.nodes.len()
            && (body.value(cur).ty.dtype != DType::F32 || body.outputs != [cur])
        {
            return None;
        }
        stages.push(Stage {
            kind,
            w,
            bias,
            chain,
            window: (kind != BlockConv::Pointwise).then(|| Window {
                strides: strides.clone(),
                pads: pads.clone(),
                auto_pad: *auto_pad,
            }),
        });
        at = next;
    }
    use BlockConv::{Depthwise as D, Pointwise as P, Stem as S};
    let shape: Vec<BlockConv> = stages.iter().map(|s| s.kind).collect();
    // (Only a stem reads an NCHW input in place.)
    let ok = match shape.as_slice() {
        [S, D] | [S, D, P] => true,
        [P, D] | [D, P] | [P, D, P] => !x_nchw,
        _ => false,
    };
    if !ok {
        return None;
    }
    Some(Arc::new(BlockKernel {
        x,
        x_nchw,
        stages,
        par: par.clone(),
    }))
}

/// A stage's weight dims for this call: `[kh, kw, C/group, M]`.
fn weight_dims(ins: &[In<'_>], w: WSrc) -> Option<[usize; 4]> {
    match w {
        WSrc::Packed { kernel, .. } => Some(kernel),
        WSrc::Input(i) => match ins[i].dims.as_slice() {
            &[kh, kw, cg, m] => Some([kh, kw, cg, m]),
            _ => None,
        },
    }
}

/// A 1×1 stage's weight as the GEMM's `[cin, cout]` B.
fn b_of<'a>(ins: &'a [In<'a>], w: WSrc, cin: usize, cout: usize) -> Result<BRef<'a>, String> {
    Ok(match w {
        WSrc::Input(i) => BRef::Mat(
            MatRef::row_major(ins[i].f32s()?, cin, cout, cout)
                .map_err(|e| format!("block_nhwc: {e}"))?,
        ),
        WSrc::Packed { input, .. } => BRef::Packed(
            PackedBRef::from_panels(cin, cout, ins[input].f32s()?)
                .map_err(|e| format!("block_nhwc: packed weight: {e}"))?,
        ),
    })
}

/// A 1×1 stage as the kernel takes it (its residual, if any, is the block's).
fn pointwise<'a>(b: BRef<'a>, r: &Resolved<'a>) -> Pointwise<'a> {
    Pointwise {
        weights: b,
        alpha: r.alpha,
        epilogue: Epilogue {
            bias: r.bias,
            activation: r.act,
            clamp: r.clamp,
            ..Epilogue::none()
        },
    }
}

impl NativeKernel for BlockKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let [n, h, w, c] = match (ins[self.x].dims.as_slice(), self.x_nchw) {
            (&[n, h, w, c], false) => [n, h, w, c],
            (&[n, c, h, w], true) => [n, h, w, c],
            _ => return Ok(false),
        };
        // Walk the stages' shapes: channels and spatial size after each, and the geometry
        // of each windowed stage.
        let (mut ch, mut sp) = (c, [h, w]);
        let mut geos = Vec::with_capacity(self.stages.len());
        let mut dims = Vec::with_capacity(self.stages.len());
        for st in &self.stages {
            let Some([kh, kw, cg, m]) = weight_dims(ins, st.w) else {
                return Ok(false);
            };
            let fits = match st.kind {
                BlockConv::Pointwise => [kh, kw, cg] == [1, 1, ch],
                BlockConv::Depthwise => cg == 1 && m == ch,
                BlockConv::Stem => cg == ch,
            };
            if !fits {
                return Ok(false);
            }
            let geo = match &st.window {
                None => None,
                Some(wd) => {
                    let Some(g) =
                        geometry(sp, [kh, kw], &wd.strides, &wd.pads, &[], wd.auto_pad, false)
                    else {
                        return Ok(false);
                    };
                    sp = g.out;
                    Some(g)
                }
            };
            geos.push(geo);
            ch = m;
            dims.push([n, sp[0], sp[1], m]);
        }
        if outs[0].dims != [n, sp[0], sp[1], ch] {
            return Ok(false);
        }
        let mut tails = Vec::with_capacity(self.stages.len());
        for (st, d) in self.stages.iter().zip(&dims) {
            match resolve_conv(&st.chain, st.bias.as_ref(), ins, d, 3)? {
                Some(r) => tails.push(r),
                None => return Ok(false),
            }
        }
        let last = tails.len() - 1;
        if tails[..last].iter().any(|r| r.residual.is_some()) {
            return Ok(false);
        }
        let dw_at = self
            .stages
            .iter()
            .position(|s| s.kind == BlockConv::Depthwise);
        let (Some(dw_at), Some(first)) = (dw_at, self.stages.first()) else {
            return Ok(false);
        };
        let Some(geo) = &geos[dw_at] else {
            return Ok(false);
        };
        let mid = dims[dw_at][3];
        let WSrc::Input(dw_w) = self.stages[dw_at].w else {
            return Ok(false);
        };
        let xs = ins[self.x].f32s()?;
        // The block's input: `x`, or the stem's output, computed band by band.
        let (input, stem, [bh, bw, bc]) = match (first.kind, first.w, &geos[0]) {
            (BlockConv::Stem, WSrc::Input(wi), Some(sg)) => {
                let stem = SmallConvNhwc {
                    window: window_of(xs, [h, w, c], sg),
                    input_nchw: self.x_nchw,
                    weights: ins[wi].f32s()?,
                    cout: dims[0][3],
                    tail: tails[0].channel_tail(),
                };
                let [_, sh, sw, sc] = dims[0];
                (&[][..], Some(stem), [sh, sw, sc])
            }
            (BlockConv::Stem, ..) => return Ok(false),
            _ => (xs, None, [h, w, c]),
        };
        let expand = match (dw_at, first.kind) {
            (1, BlockConv::Pointwise) => Some(pointwise(b_of(ins, first.w, c, mid)?, &tails[0])),
            _ => None,
        };
        let project = match self.stages.get(dw_at + 1) {
            Some(st) => Some(pointwise(b_of(ins, st.w, mid, ch)?, &tails[last])),
            None => None,
        };
        let block = BlockNhwc {
            input,
            stem,
            n,
            h: bh,
            w: bw,
            channels: bc,
            expand,
            depthwise: DepthwiseStage {
                kernel: geo.k,
                stride: geo.s,
                pads: geo.pb,
                out: geo.out,
                weights: ins[dw_w].f32s()?,
                tail: tails[dw_at].channel_tail(),
            },
            project,
            residual: tails[last].residual.map(|r| (r, tails[last].res_before)),
        };
        if project.is_none() && block.depthwise.tail.residual.is_some() {
            return Ok(false);
        }
        let y = outs[0].f32s()?;
        block_nhwc(&block, y, &*self.par).map_err(|e| format!("block_nhwc: {e}"))?;
        Ok(true)
    }
}
