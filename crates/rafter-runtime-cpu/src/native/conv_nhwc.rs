//! Channels-last convolution (`conv_nhwc`, written by `rafter_opt::layout`) with its fused
//! tail, on borrowed operands. With pixels as rows the convolution is a GEMM whose B is the
//! weight, `Y[pixels, M] = X'[pixels, kh·kw·C] · W[kh·kw·C, M]`:
//! - 1×1, stride 1, no padding: `X'` is the input itself, every image at once (no copy);
//! - other ungrouped windows: `X'` is built per block of output rows
//!   (`rafter_kernels_cpu::im2col_nhwc`, a few contiguous runs per pixel) in a reusable
//!   per-thread scratch buffer, the blocks' copies spread over the threads; on maps of at
//!   most `K_SPLIT_MAX_ROWS` pixels (ResNet-50's 7×7), where the GEMM splits K over the
//!   threads (`fill_a_splits_k`), each GEMM task copies only its own columns of `X'`
//!   (`rafter_kernels_cpu::sgemm_fill_a`, `im2col_nhwc_cols`);
//! - depthwise: no GEMM, `rafter_kernels_cpu::depthwise_nhwc` vectorised over channels;
//! - what `rafter_ir::program::cpu_winograd` takes (3×3, stride 1, one group, at least 100
//!   output pixels; the cost model rates those by the same rule): Winograd F(2×2, 3×3),
//!   `rafter_kernels_cpu::conv3x3_nhwc`, its transformed filter made on the first call;
//! - at most [`SMALL_CONV_MAX_CIN`] input channels (an RGB stem), weight left raw by the
//!   compiler: no GEMM, `rafter_kernels_cpu::small_conv_nhwc` accumulates each pixel's
//!   output channels in registers. When the body starts by transposing an NCHW input to
//!   NHWC (`rafter_opt::fusion`'s reordered stem input), that kernel reads the NCHW tensor
//!   in place and the transpose is never computed.
//!
//! The weight `[kh, kw, C, M]` is B as it is, or pre-packed at compile time
//! (`rafter_opt::prepack`): the body then unpacks the panels by a prologue (`transpose`,
//! `reshape`, maybe `slice`, and a last `reshape` to 4-D) that this kernel recognises, handing
//! the GEMM the panels in place (`BRef::Packed`). The conv bias is the epilogue's per-column
//! bias; a residual of the output's shape is a row-major matrix of C's shape.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use rafter_ir::program::cpu_winograd;
use rafter_ir::{AutoPad, DType, Graph, Op};
use rafter_kernels_cpu::{
    conv3x3_nhwc, depthwise_nhwc, fill_a_splits_k, im2col_nhwc, im2col_nhwc_cols, sgemm,
    sgemm_fill_a, sigmoid_in_place, small_conv_nhwc, BRef, ChannelTail, Conv3x3Nhwc, DepthwiseNhwc,
    Epilogue, MatMut, MatRef, PackedBRef, Parallel, Residual, SmallConvNhwc, WindowNhwc,
    WinogradNhwcWeights, K_SPLIT_MAX_ROWS, PACKED_B_NR,
};

use super::conv::{geometry, Geom};
use super::epilogue::{parse_chain_then_sigmoid, resolve_conv, EpiOp, Resolved, Src};
use super::matmul::packed_prologue;
use super::{input_of, known_dims, read_once, In, NativeKernel, Out, Par, TO_NHWC};

/// Where the weight comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WSrc {
    /// Body input `i`, `[kh, kw, C/g, M]`.
    Input(usize),
    /// Body input `input`: panels of the `[kh·kw·C, M]` B that the body unpacks.
    Packed { input: usize, kernel: [usize; 4] },
}

struct ConvNhwcKernel {
    x: usize,
    /// Input `x` is NCHW, reordered by the body (only the small direct convolution takes
    /// it so).
    x_nchw: bool,
    w: WSrc,
    bias: Option<Src>,
    kernel_shape: Vec<i64>,
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
    group: i64,
    auto_pad: AutoPad,
    chain: Vec<EpiOp>,
    /// The body ends with a sigmoid after `chain` (applied in a pass over the result).
    sigmoid: bool,
    par: Par,
    /// The Winograd-transformed filter, by the address of the weight it was computed from.
    winograd: Mutex<Option<(usize, Arc<WinogradNhwcWeights>)>>,
}

/// Convolutions of at most this many input channels run directly
/// (`rafter_kernels_cpu::small_conv_nhwc`) when their weight is raw, as `rafter_opt`
/// leaves it for them (`layout::SMALL_CONV_MAX_CIN`).
const SMALL_CONV_MAX_CIN: usize = rafter_ir::program::SMALL_CONV_MAX_CIN as usize;

/// im2col blocks hold about this many bytes (a block's GEMM reads its A from L2/L3).
const IM2COL_BYTES: usize = 1024 * 1024;

thread_local! {
    /// im2col scratch, reused across dispatches on this thread.
    static COLS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    // A reordered stem input (`rafter_opt::fusion`): the body transposes its NCHW input
    // first, and the small convolution reads the NCHW tensor in place instead.
    let reordered = match body.nodes.first() {
        Some(t) if matches!(&t.op, Op::Transpose { perm } if perm.as_slice() == TO_NHWC) => {
            let xt = (*t.outputs.first()?)?;
            if body.nodes.get(1)?.input(0) != Some(xt) || !read_once(body, xt) {
                return None;
            }
            Some(input_of(body, t.input(0), DType::F32)?)
        }
        _ => None,
    };
    let packed = if reordered.is_some() {
        None
    } else {
        packed_prologue(body)
    };
    let (w, at) = match packed {
        Some(p) => packed_weight(body, &p)?,
        None => {
            let at = usize::from(reordered.is_some());
            let w = input_of(body, body.nodes.get(at)?.input(1), DType::F32)?;
            (WSrc::Input(w), at)
        }
    };
    let node = body.nodes.get(at)?;
    let Op::ConvNhwc {
        kernel_shape,
        strides,
        pads,
        dilations,
        group,
        auto_pad,
    } = &node.op
    else {
        return None;
    };
    if node.outputs.len() != 1 || !(2..=3).contains(&node.inputs.len()) {
        return None;
    }
    let bias = match node.inputs.get(2) {
        None | Some(None) => None,
        Some(b) => Some(Src::of(body, *b)?),
    };
    let x = match reordered {
        Some(x) => x,
        None => input_of(body, node.input(0), DType::F32)?,
    };
    let (chain, sigmoid) = parse_chain_then_sigmoid(body, node.outputs[0]?, at + 1)?;
    Some(Arc::new(ConvNhwcKernel {
        x,
        x_nchw: reordered.is_some(),
        w,
        bias,
        kernel_shape: kernel_shape.clone(),
        strides: strides.clone(),
        pads: pads.clone(),
        dilations: dilations.clone(),
        group: *group,
        auto_pad: *auto_pad,
        chain,
        sigmoid,
        par: par.clone(),
        winograd: Mutex::new(None),
    }))
}

/// The weight that `body`'s unpacking prologue `p` makes (ending with a reshape to the 4-D
/// `[kh, kw, C, M]`) and the index of the convolution that reads it, right after.
pub(super) fn packed_weight(body: &Graph, p: &super::matmul::Prologue) -> Option<(WSrc, usize)> {
    let (w, out, next) = unpacked_conv_weight(body, p)?;
    let conv = body.nodes.get(next)?;
    if conv.input(1) != Some(out) || !matches!(conv.op, Op::ConvNhwc { .. }) {
        return None;
    }
    Some((w, next))
}

/// The 4-D weight a prologue ends with: the final `reshape` of its unpacked `[k, n]` to
/// `[kh, kw, C/g, M]`, read once. Returns the weight's source, the reshaped value, and the
/// index of the node after the reshape.
pub(super) fn unpacked_conv_weight(
    body: &Graph,
    p: &super::matmul::Prologue,
) -> Option<(WSrc, rafter_ir::ValueId, usize)> {
    // Convolutions take f32 panels only (`rafter_opt::prepack` keeps their weights f32).
    if p.half.is_some() {
        return None;
    }
    let r = body.nodes.get(p.next)?;
    let out = *r.outputs.first()?.as_ref()?;
    let dims = known_dims(body, out)?;
    let &[kh, kw, cg, m] = dims.as_slice() else {
        return None;
    };
    if !matches!(r.op, Op::Reshape { .. })
        || r.input(0) != Some(p.unpacked)
        || p.k != kh * kw * cg
        || p.n != m
        || !read_once(body, out)
    {
        return None;
    }
    let w = WSrc::Packed {
        input: p.input,
        kernel: [kh, kw, cg, m],
    };
    Some((w, out, p.next + 1))
}

fn gemm_err(e: rafter_kernels_cpu::GemmError) -> String {
    format!("conv_nhwc: {e}")
}

/// The GEMM epilogue of `r` for the output elements `span` of a `[pixels, m]` result: the
/// conv bias per column, the activation, the clamp, and the residual's same elements (it
/// has the output's shape). [`ConvNhwcKernel::gemm`] and [`ConvNhwcKernel::gemm_fill`]
/// share it so that the two GEMM forms cannot drift apart in what they fuse.
fn epilogue<'a>(r: &Resolved<'a>, span: Range<usize>, m: usize) -> Epilogue<'a> {
    Epilogue {
        bias: r.bias,
        activation: r.act,
        residual: r
            .residual
            .map(|res| Residual::row_major(&res[span], m, r.res_before)),
        clamp: r.clamp,
        ..Epilogue::none()
    }
}

impl NativeKernel for ConvNhwcKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        if !self.conv(ins, outs)? {
            return Ok(false);
        }
        if self.sigmoid {
            sigmoid_in_place(outs[0].f32s()?, &*self.par).map_err(|e| format!("conv_nhwc: {e}"))?;
        }
        Ok(true)
    }
}

impl ConvNhwcKernel {
    /// The convolution and its fused epilogue (all but a trailing sigmoid); `Ok(false)`
    /// with nothing written for shapes it does not cover.
    fn conv(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let [n, h, wd, c] = match (x.dims.as_slice(), self.x_nchw) {
            (&[n, h, w, c], false) => [n, h, w, c],
            (&[n, c, h, w], true) => [n, h, w, c],
            _ => return Ok(false),
        };
        let [kh, kw, cg, m] = match self.w {
            WSrc::Input(i) => match ins[i].dims.as_slice() {
                &[kh, kw, cg, m] => [kh, kw, cg, m],
                _ => return Ok(false),
            },
            WSrc::Packed { kernel, .. } => kernel,
        };
        if !self.kernel_shape.is_empty() && self.kernel_shape != [kh as i64, kw as i64] {
            return Ok(false);
        }
        if !self.dilations.iter().all(|&d| d == 1) {
            return Ok(false);
        }
        let g = usize::try_from(self.group).unwrap_or(0);
        let depthwise = g == c && cg == 1 && m == c;
        if !(g == 1 && cg == c || depthwise) {
            return Ok(false);
        }
        let Some(geo) = geometry(
            [h, wd],
            [kh, kw],
            &self.strides,
            &self.pads,
            &[],
            self.auto_pad,
            false,
        ) else {
            return Ok(false);
        };
        let [oh, ow] = geo.out;
        let out_dims = [n, oh, ow, m];
        if outs[0].dims != out_dims {
            return Ok(false);
        }
        let Some(r) = resolve_conv(&self.chain, self.bias.as_ref(), ins, &out_dims, 3)? else {
            return Ok(false);
        };
        let xs = x.f32s()?;
        let y = outs[0].f32s()?;
        if y.is_empty() {
            return Ok(true);
        }
        // (A one-channel convolution is also "depthwise"; from NCHW it runs as a small one.)
        let depthwise = depthwise && !self.x_nchw;
        let small = matches!(self.w, WSrc::Input(_)) && c <= SMALL_CONV_MAX_CIN && !depthwise;
        if self.x_nchw && !small {
            return Ok(false);
        }
        if depthwise {
            let WSrc::Input(wi) = self.w else {
                return Ok(false);
            };
            let conv = DepthwiseNhwc {
                window: window_of(xs, [h, wd, c], &geo),
                weights: ins[wi].f32s()?,
                tail: r.channel_tail(),
            };
            depthwise_nhwc(&conv, y, &*self.par).map_err(|e| format!("conv_nhwc: {e}"))?;
            return Ok(true);
        }
        if let (WSrc::Input(wi), true) = (self.w, small) {
            let conv = SmallConvNhwc {
                window: window_of(xs, [h, wd, c], &geo),
                input_nchw: self.x_nchw,
                weights: ins[wi].f32s()?,
                cout: m,
                tail: r.channel_tail(),
            };
            small_conv_nhwc(&conv, y, &*self.par).map_err(|e| format!("conv_nhwc: {e}"))?;
            return Ok(true);
        }
        let k = kh * kw * c;
        let wdata = match self.w {
            WSrc::Input(i) => ins[i].f32s()?,
            WSrc::Packed { input, .. } => ins[input].f32s()?,
        };
        let shape = geo.f32_conv(g, c);
        if cpu_winograd(&shape) {
            self.winograd(wdata, [n, h, wd, c], m, &geo, &r, xs, y)?;
            return Ok(true);
        }
        let b = match self.w {
            WSrc::Input(i) => {
                BRef::Mat(MatRef::row_major(ins[i].f32s()?, k, m, m).map_err(gemm_err)?)
            }
            WSrc::Packed { input, .. } => BRef::Packed(
                PackedBRef::from_panels(k, m, ins[input].f32s()?)
                    .map_err(|e| format!("conv_nhwc: packed weight: {e}"))?,
            ),
        };
        let direct =
            kh == 1 && kw == 1 && geo.s == [1, 1] && geo.pb == [0, 0] && [oh, ow] == [h, wd];
        if direct {
            // Every image at once: the activations are the GEMM's A as they are.
            let a = MatRef::row_major(xs, n * h * wd, c, c).map_err(gemm_err)?;
            return self.gemm(a, b, &r, 0..n * oh * ow, m, y).map(|()| true);
        }
        if kh * kw > 1
            && oh * ow <= K_SPLIT_MAX_ROWS
            && fill_a_splits_k(oh * ow, m, k, self.par.threads())
        {
            // Few pixels (ResNet-50's 7×7 maps): each GEMM task copies its own columns.
            for img in 0..n {
                let xi = &xs[img * h * wd * c..(img + 1) * h * wd * c];
                // The driver asks for ranges inside 0..k with `dst` sized for them; an error
                // all the same is kept (a pool thread must not panic) and returned.
                let err = Mutex::new(None);
                let fill = |cols: Range<usize>, dst: &mut [f32]| {
                    let done = im2col_nhwc_cols(
                        xi,
                        [h, wd, c],
                        [kh, kw],
                        geo.s,
                        geo.pb,
                        geo.out,
                        0..oh,
                        cols,
                        dst,
                    );
                    if let Err(e) = done {
                        *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    }
                };
                let p0 = img * oh * ow;
                self.gemm_fill(&fill, k, b, &r, p0..p0 + oh * ow, m, y)?;
                if let Some(e) = err.into_inner().unwrap_or_else(|p| p.into_inner()) {
                    return Err(format!("conv_nhwc: {e}"));
                }
            }
            return Ok(true);
        }
        // Output rows per im2col block.
        let block = (IM2COL_BYTES / (k * ow * 4).max(1)).clamp(1, oh);
        let mut run = |cols: &mut Vec<f32>| -> Result<(), String> {
            for img in 0..n {
                let xi = &xs[img * h * wd * c..(img + 1) * h * wd * c];
                for o0 in (0..oh).step_by(block) {
                    let o1 = (o0 + block).min(oh);
                    let rows = (o1 - o0) * ow;
                    if cols.len() < rows * k {
                        cols.resize(rows * k, 0.0);
                    }
                    let cols = &mut cols[..rows * k];
                    self.im2col(xi, [h, wd, c], [kh, kw], &geo, o0..o1, cols)?;
                    let a = MatRef::row_major(cols, rows, k, k).map_err(gemm_err)?;
                    let p0 = (img * oh + o0) * ow;
                    self.gemm(a, b, &r, p0..p0 + rows, m, y)?;
                }
            }
            Ok(())
        };
        COLS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut cols) => run(&mut cols),
            Err(_) => run(&mut Vec::new()),
        })?;
        Ok(true)
    }
}

impl ConvNhwcKernel {
    /// `y[pixels] = act(alpha · a · b + bias (+ residual)) (+ residual)`, clamped, for output
    /// pixels `pixels` (rows of `y` as a `[P, m]` matrix).
    fn gemm(
        &self,
        a: MatRef<'_>,
        b: BRef<'_>,
        r: &Resolved<'_>,
        pixels: Range<usize>,
        m: usize,
        y: &mut [f32],
    ) -> Result<(), String> {
        let span = pixels.start * m..pixels.end * m;
        let e = epilogue(r, span.clone(), m);
        let c = MatMut::row_major(&mut y[span], pixels.len(), m, m).map_err(gemm_err)?;
        sgemm(r.alpha, a, b, 0.0, c, &e, &*self.par).map_err(gemm_err)
    }

    /// [`Self::gemm`] with A (`pixels.len() x k`) copied by the GEMM's own tasks, each the
    /// columns it multiplies (`rafter_kernels_cpu::sgemm_fill_a`): a few-row im2col written
    /// by some threads and read by all the others cost the 7×7-map convolutions of
    /// ResNet-50 ~12% on a 16-core host (`benches/few_rows.rs` in `rafter-kernels-cpu`).
    #[allow(clippy::too_many_arguments)]
    fn gemm_fill(
        &self,
        fill: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
        k: usize,
        b: BRef<'_>,
        r: &Resolved<'_>,
        pixels: Range<usize>,
        m: usize,
        y: &mut [f32],
    ) -> Result<(), String> {
        let span = pixels.start * m..pixels.end * m;
        let e = epilogue(r, span.clone(), m);
        let rows = pixels.len();
        let c = MatMut::row_major(&mut y[span], rows, m, m).map_err(gemm_err)?;
        sgemm_fill_a(r.alpha, rows, k, fill, b, c, &e, &*self.par).map_err(gemm_err)
    }

    /// The im2col rows of output rows `oy` of one image, the copy spread over the threads.
    fn im2col(
        &self,
        x: &[f32],
        [h, w, c]: [usize; 3],
        k: [usize; 2],
        geo: &Geom,
        oy: Range<usize>,
        cols: &mut [f32],
    ) -> Result<(), String> {
        let per_row = geo.out[1] * k[0] * k[1] * c;
        let tasks = self.par.threads().min(oy.len()).max(1);
        // Each task's rows, split off up front: task `t` takes part `t` alone.
        let mut parts = Vec::with_capacity(tasks);
        let mut rest = cols;
        for t in 0..tasks {
            let rows = oy.len() * (t + 1) / tasks - oy.len() * t / tasks;
            let (part, tail) = rest.split_at_mut(rows * per_row);
            parts.push(Mutex::new(part));
            rest = tail;
        }
        let err = Mutex::new(None);
        self.par.run(tasks, &|t| {
            let lo = oy.start + oy.len() * t / tasks;
            let hi = oy.start + oy.len() * (t + 1) / tasks;
            let mut dst = parts[t].lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = im2col_nhwc(x, [h, w, c], k, geo.s, geo.pb, geo.out, lo..hi, &mut dst) {
                *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        });
        match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(format!("conv_nhwc: {e}")),
            None => Ok(()),
        }
    }

    /// The convolution by Winograd F(2×2, 3×3), one image at a time, its transformed filter
    /// computed from the weight (raw or pre-packed panels) on the first call and kept.
    #[allow(clippy::too_many_arguments)]
    fn winograd(
        &self,
        wdata: &[f32],
        [n, h, w, c]: [usize; 4],
        m: usize,
        geo: &Geom,
        r: &Resolved<'_>,
        xs: &[f32],
        y: &mut [f32],
    ) -> Result<(), String> {
        let [oh, ow] = geo.out;
        let filters = {
            let key = wdata.as_ptr() as usize;
            let mut cached = self.winograd.lock().unwrap_or_else(|e| e.into_inner());
            match &*cached {
                Some((k, f)) if *k == key => f.clone(),
                _ => {
                    let raw = match self.w {
                        WSrc::Input(_) => std::borrow::Cow::Borrowed(wdata),
                        WSrc::Packed { .. } => std::borrow::Cow::Owned(unpack(wdata, 9 * c, m)),
                    };
                    let f = Arc::new(
                        WinogradNhwcWeights::new(&raw, c, m)
                            .map_err(|e| format!("conv_nhwc: {e}"))?,
                    );
                    *cached = Some((key, f.clone()));
                    f
                }
            }
        };
        let pads = [
            geo.pb[0],
            geo.pb[1],
            oh + 2 - h - geo.pb[0],
            ow + 2 - w - geo.pb[1],
        ];
        let (in_len, out_len) = (h * w * c, oh * ow * m);
        for img in 0..n {
            let conv = Conv3x3Nhwc {
                input: &xs[img * in_len..][..in_len],
                h,
                w,
                pads,
                tail: ChannelTail {
                    residual: r.residual.map(|res| &res[img * out_len..][..out_len]),
                    ..r.channel_tail()
                },
            };
            conv3x3_nhwc(
                &conv,
                &filters,
                &mut y[img * out_len..][..out_len],
                &*self.par,
            )
            .map_err(|e| format!("conv_nhwc: {e}"))?;
        }
        Ok(())
    }
}

/// The row-major `k × n` B held in GEMM panels (`[ceil(n/16), k, 16]`).
fn unpack(panels: &[f32], k: usize, n: usize) -> Vec<f32> {
    let mut b = vec![0f32; k * n];
    for (j, col) in (0..n).map(|j| (j, (j / PACKED_B_NR) * k * PACKED_B_NR + j % PACKED_B_NR)) {
        for i in 0..k {
            b[i * n + j] = panels[col + i * PACKED_B_NR];
        }
    }
    b
}

/// The input and window of a convolution over `xs` (`[n, h, w, c]`).
pub(super) fn window_of<'a>(xs: &'a [f32], [h, w, c]: [usize; 3], geo: &Geom) -> WindowNhwc<'a> {
    WindowNhwc {
        input: xs,
        h,
        w,
        channels: c,
        kernel: geo.k,
        stride: geo.s,
        pads: geo.pb,
        out: geo.out,
    }
}
