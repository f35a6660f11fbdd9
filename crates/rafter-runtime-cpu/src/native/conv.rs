//! 2-D convolution (NCHW, as the graph has it) with its fused tail, on borrowed operands.
//!
//! Per image and group the output is a GEMM, `Y[Cout, OH*OW] = W[Cout, Cin*KH*KW] x
//! X'[Cin*KH*KW, OH*OW]`, with the conv bias as the epilogue's per-row bias and a residual of
//! the output's shape added in the epilogue too:
//! - 1x1, stride 1, no padding: `X'` is the input itself (no copy);
//! - otherwise `X'` is an im2col of the input in a reusable per-thread scratch buffer;
//! - depthwise (one input and one output channel per group): no GEMM; 3×3 with stride 1 or
//!   2 (MobileNet's) runs `rafter_kernels_cpu::depthwise3x3` (vectorised, planes split over
//!   the threads, the whole tail fused), other windows a direct loop per channel;
//! - the tail's clamp (ReLU6) runs in the GEMM epilogue, not as a pass of its own;
//! - convolutions of a weight that `rafter_ir::program::cpu_winograd` takes (3×3, stride 1,
//!   one group of more than 4 channels, at least 100 output pixels; the cost model rates
//!   them by the same rule): Winograd F(2×2, 3×3) (`rafter_kernels_cpu::conv3x3`),
//!   2.25× fewer multiply-adds, its transformed filter computed on the first call and kept
//!   by the kernel (16/9 of the filter's bytes);
//! - stems (at most [`STEM_MAX_CIN`] input channels, windows of [`STEM_MIN_TAPS`]+ taps):
//!   no GEMM, `rafter_kernels_cpu::stem_conv` reads every tap from the input split once into
//!   zero-padded stride phases.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use rafter_ir::program::{cpu_winograd, ConvGeometry};
use rafter_ir::{AutoPad, DType, Graph, Op};
use rafter_kernels_cpu::{
    conv3x3, copy_strided, depthwise3x3, sgemm, stem_conv, Activation, BRef, Conv3x3, Depthwise3x3,
    Epilogue, MatMut, MatRef, Parallel, Residual, StemConv, WinogradWeights, WorkerPool,
};

use super::epilogue::{parse_chain, resolve_conv, EpiOp, Resolved, Src};
use super::{input_of, In, NativeKernel, Out, Par};

struct ConvKernel {
    x: usize,
    w: usize,
    bias: Option<Src>,
    kernel_shape: Vec<i64>,
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
    group: i64,
    auto_pad: AutoPad,
    chain: Vec<EpiOp>,
    par: Par,
    /// The Winograd-transformed filter, by the weight it was computed from.
    winograd: Mutex<Option<(usize, Arc<WinogradWeights>)>>,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let first = body.nodes.first()?;
    let Op::Conv {
        kernel_shape,
        strides,
        pads,
        dilations,
        group,
        auto_pad,
    } = &first.op
    else {
        return None;
    };
    if first.outputs.len() != 1 || !(2..=3).contains(&first.inputs.len()) {
        return None;
    }
    let bias = match first.inputs.get(2) {
        None | Some(None) => None,
        Some(b) => Some(Src::of(body, *b)?),
    };
    Some(Arc::new(ConvKernel {
        x: input_of(body, first.inputs[0], DType::F32)?,
        w: input_of(body, first.inputs[1], DType::F32)?,
        bias,
        kernel_shape: kernel_shape.clone(),
        strides: strides.clone(),
        pads: pads.clone(),
        dilations: dilations.clone(),
        group: *group,
        auto_pad: *auto_pad,
        chain: parse_chain(body, first.outputs[0]?)?,
        par: par.clone(),
        winograd: Mutex::new(None),
    }))
}

/// Resolved 2-D window geometry (also used by pooling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Geom {
    pub(super) k: [usize; 2],
    pub(super) s: [usize; 2],
    pub(super) d: [usize; 2],
    /// Leading padding.
    pub(super) pb: [usize; 2],
    pub(super) out: [usize; 2],
}

impl Geom {
    /// The f32 convolution of this window over `in_channels` in `groups`, as the CPU's
    /// Winograd rule ([`cpu_winograd`]) reads it.
    pub(super) fn f32_conv(&self, groups: usize, in_channels: usize) -> ConvGeometry {
        ConvGeometry {
            window: self.k,
            strides: self.s,
            dilations: self.d,
            groups,
            in_channels,
            out_pixels: self.out[0] * self.out[1],
            dtype: DType::F32,
        }
    }
}

/// ONNX Conv / Pool geometry for a 2-D input `in_sp` and window `k`; `None` for anything
/// unusual (negative pads, wrong attribute lengths), which the reference path handles.
pub(super) fn geometry(
    in_sp: [usize; 2],
    k: [usize; 2],
    strides: &[i64],
    pads: &[i64],
    dilations: &[i64],
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Option<Geom> {
    let per = |v: &[i64], n: usize, default: i64| -> Option<Vec<usize>> {
        let v = if v.is_empty() {
            vec![default; n]
        } else {
            v.to_vec()
        };
        (v.len() == n && v.iter().all(|&x| x >= 0)).then(|| v.iter().map(|&x| x as usize).collect())
    };
    let s = per(strides, 2, 1)?;
    let d = per(dilations, 2, 1)?;
    if s.contains(&0) || d.contains(&0) || k.contains(&0) {
        return None;
    }
    let mut pb = [0usize; 2];
    let mut out = [0usize; 2];
    let explicit = per(pads, 4, 0)?;
    for i in 0..2 {
        let eff = (k[i] - 1) * d[i] + 1;
        let (n, st) = (in_sp[i], s[i]);
        let pe;
        match auto_pad {
            AutoPad::NotSet => {
                pb[i] = explicit[i];
                pe = explicit[2 + i];
            }
            AutoPad::Valid => pe = 0,
            AutoPad::SameUpper | AutoPad::SameLower => {
                let o = n.div_ceil(st);
                let total = ((o.max(1) - 1) * st + eff).saturating_sub(n);
                pb[i] = if auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                pe = total - pb[i];
                if ceil_mode {
                    return None;
                }
            }
        }
        let span = (n + pb[i] + pe).checked_sub(eff)?;
        let mut o = span / st + 1;
        if ceil_mode && auto_pad == AutoPad::NotSet && span % st != 0 {
            o += 1;
            if (o - 1) * st >= n + pb[i] {
                o -= 1;
            }
        }
        out[i] = o;
    }
    Some(Geom {
        k,
        s: [s[0], s[1]],
        d: [d[0], d[1]],
        pb,
        out,
    })
}

/// The output columns `lo..hi` whose input column `ow * s + off` lies inside `0..w`.
pub(super) fn valid_range(off: isize, s: usize, w: usize, ow: usize) -> (usize, usize) {
    let s = s as isize;
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let last = w as isize - 1 - off;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let hi = hi.clamp(0, ow as isize) as usize;
    ((lo as usize).min(hi), hi)
}

thread_local! {
    /// im2col scratch, reused across dispatches on this thread.
    static COLS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn gemm_err(e: rafter_kernels_cpu::GemmError) -> String {
    format!("conv: {e}")
}

impl NativeKernel for ConvKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (x, w) = (&ins[self.x], &ins[self.w]);
        let (&[n, c, h, wd], &[m, cg, kh, kw]) = (x.dims.as_slice(), w.dims.as_slice()) else {
            return Ok(false);
        };
        if !self.kernel_shape.is_empty() && self.kernel_shape != [kh as i64, kw as i64] {
            return Ok(false);
        }
        let g = usize::try_from(self.group).unwrap_or(0);
        if g == 0 || cg * g != c || m % g != 0 {
            return Ok(false);
        }
        let Some(geo) = geometry(
            [h, wd],
            [kh, kw],
            &self.strides,
            &self.pads,
            &self.dilations,
            self.auto_pad,
            false,
        ) else {
            return Ok(false);
        };
        let [oh, ow] = geo.out;
        let out_dims = [n, m, oh, ow];
        if outs[0].dims != out_dims {
            return Ok(false);
        }
        let Some(r) = resolve_conv(&self.chain, self.bias.as_ref(), ins, &out_dims, 1)? else {
            return Ok(false);
        };
        let (xs, ws) = (x.f32s()?, w.f32s()?);
        let y = outs[0].f32s()?;
        if y.is_empty() {
            return Ok(true);
        }
        if g == c && cg == 1 && m == c {
            depthwise(xs, ws, y, [n, c, h, wd], &geo, &r, &self.par)?;
            return Ok(true);
        }
        if stem(xs, ws, y, [n, c, h, wd], m, g, &geo, &r, &self.par)? {
            return Ok(true);
        }
        if self.winograd(w, [n, c, h, wd], m, g, &geo, &r, xs, y)? {
            return Ok(true);
        }
        let (mg, kc, p) = (m / g, cg * kh * kw, oh * ow);
        let direct =
            kh == 1 && kw == 1 && geo.s == [1, 1] && geo.pb == [0, 0] && [oh, ow] == [h, wd];
        // Output rows per im2col block (all of them for a direct 1×1 or a small im2col; see
        // `IM2COL_BYTES`).
        let wide = IM2COL_BYTES / (kc * 4).max(1) >= IM2COL_MIN_COLUMNS;
        let block = if direct || kc * p * 4 <= IM2COL_WHOLE || !wide {
            oh
        } else {
            (IM2COL_BYTES / (kc * ow * 4).max(1)).clamp(1, oh)
        };
        let mut run = |cols: &mut Vec<f32>| -> Result<(), String> {
            for img in 0..n {
                for gi in 0..g {
                    let x0 = (img * c + gi * cg) * h * wd;
                    let xg = &xs[x0..x0 + cg * h * wd];
                    let a = MatRef::row_major(&ws[gi * mg * kc..(gi + 1) * mg * kc], mg, kc, kc)
                        .map_err(gemm_err)?;
                    let y0 = (img * m + gi * mg) * p;
                    for o0 in (0..oh).step_by(block) {
                        let o1 = (o0 + block).min(oh);
                        // Columns o0·OW..o1·OW of every output row: C's block, strided by P.
                        let (c0, pc) = (o0 * ow, (o1 - o0) * ow);
                        let span = y0 + c0..y0 + (mg - 1) * p + c0 + pc;
                        let b = if direct {
                            MatRef::row_major(xg, kc, p, p).map_err(gemm_err)?
                        } else {
                            // Grown only: shrinking and regrowing re-zeroed megabytes a
                            // call (every element is written by `im2col` anyway).
                            if cols.len() < kc * pc {
                                cols.resize(kc * pc, 0.0);
                            }
                            let cols = &mut cols[..kc * pc];
                            im2col(xg, cg, [h, wd], &geo, o0..o1, cols, &self.par);
                            MatRef::row_major(cols, kc, pc, pc).map_err(gemm_err)?
                        };
                        let e = Epilogue {
                            row_bias: r.bias.map(|b| &b[gi * mg..(gi + 1) * mg]),
                            activation: r.act,
                            residual: r.residual.map(|res| {
                                Residual::row_major(&res[span.clone()], p, r.res_before)
                            }),
                            // The clamp (ReLU6's upper bound) in the epilogue too: no extra pass.
                            clamp: r.clamp,
                            ..Epilogue::none()
                        };
                        let cm = MatMut::row_major(&mut y[span], mg, pc, p).map_err(gemm_err)?;
                        sgemm(r.alpha, a, BRef::Mat(b), 0.0, cm, &e, &*self.par)
                            .map_err(gemm_err)?;
                    }
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

impl ConvKernel {
    /// The convolution by Winograd F(2×2, 3×3) when it applies (see the module docs);
    /// `Ok(false)` otherwise, with nothing written.
    #[allow(clippy::too_many_arguments)]
    fn winograd(
        &self,
        w: &In<'_>,
        [n, c, h, wd]: [usize; 4],
        m: usize,
        g: usize,
        geo: &Geom,
        r: &Resolved<'_>,
        xs: &[f32],
        y: &mut [f32],
    ) -> Result<bool, String> {
        let [oh, ow] = geo.out;
        let act_ok = match r.act {
            Activation::None => true,
            Activation::Relu => r.residual.is_none() || r.res_before,
            _ => false,
        };
        let Some(weight) = w.weight else {
            return Ok(false);
        };
        let shape = geo.f32_conv(g, c);
        // The epilogue limits are this kernel's own (`Conv3x3` fuses a bias, a residual
        // and a ReLU; a clamp runs in `Resolved::post`).
        if !cpu_winograd(&shape) || r.alpha != 1.0 || !act_ok {
            return Ok(false);
        }
        let filters = {
            let mut cached = self.winograd.lock().unwrap_or_else(|e| e.into_inner());
            match &*cached {
                Some((w_index, f)) if *w_index == weight => f.clone(),
                _ => {
                    let f = Arc::new(WinogradWeights::new(w.f32s()?, m, c)?);
                    *cached = Some((weight, f.clone()));
                    f
                }
            }
        };
        let pads = [
            geo.pb[0],
            geo.pb[1],
            oh + 2 - h - geo.pb[0],
            ow + 2 - wd - geo.pb[1],
        ];
        let (in_len, out_len) = (c * h * wd, m * oh * ow);
        for img in 0..n {
            let yi = &mut y[img * out_len..][..out_len];
            let conv = Conv3x3 {
                input: &xs[img * in_len..][..in_len],
                h,
                w: wd,
                pads,
                bias: r.bias,
                residual: r.residual.map(|res| &res[img * out_len..][..out_len]),
                relu: r.act == Activation::Relu,
            };
            conv3x3(&conv, &filters, yi, &*self.par).map_err(|e| format!("conv: {e}"))?;
            r.post(yi);
        }
        Ok(true)
    }
}

/// The most bytes of one im2col block: an im2col above [`IM2COL_WHOLE`] bytes is built and
/// multiplied a block of output rows at a time, so the block is still in cache when the
/// GEMM packs it. ResNet-50's stem (147 × 12,544 floats) had written and re-read 7.4 MB:
/// 2.85–3.23 → 1.72–2.02 ms a call in blocks (2 threads, this 2-core machine). Smaller ones
/// stay whole: MobileNetV2's 1.35 MB stem measured ~3% slower in three blocks. So do long
/// rows (large K), whose blocks would be narrow: ResNet-50's 3×3 stride-2 convolution of
/// layer 2 (K = 1,152, 3.6 MB) took 1.42–1.48 ms in blocks of 112 columns against
/// 1.21–1.35 ms whole. Commands and runs: benchmarks/RESULTS.md, "Kernel-level
/// measurements behind this session's CPU changes".
const IM2COL_BYTES: usize = 512 * 1024;
/// The largest im2col built whole (see [`IM2COL_BYTES`]).
const IM2COL_WHOLE: usize = 2 * 1024 * 1024;
/// The fewest columns a block may have (see [`IM2COL_BYTES`]).
const IM2COL_MIN_COLUMNS: usize = 512;

/// im2col of one group's `cg` input planes, for output rows `rows_out`, into `cols`
/// (`cg*KH*KW` rows of `rows_out.len()*OW`).
pub(super) fn im2col(
    xg: &[f32],
    cg: usize,
    [h, w]: [usize; 2],
    geo: &Geom,
    rows_out: std::ops::Range<usize>,
    cols: &mut [f32],
    par: &WorkerPool,
) {
    let [kh, kw] = geo.k;
    let ow = geo.out[1];
    let p = rows_out.len() * ow;
    let rows = cg * kh * kw;
    let fill = |r: usize, dst: &mut [f32]| {
        let (ci, ki, kj) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &xg[ci * h * w..(ci + 1) * h * w];
        let off = (kj * geo.d[1]) as isize - geo.pb[1] as isize;
        let (lo, hi) = valid_range(off, geo.s[1], w, ow);
        for (o, drow) in rows_out.clone().zip(dst.chunks_exact_mut(ow)) {
            let ih = (o * geo.s[0] + ki * geo.d[0]) as isize - geo.pb[0] as isize;
            if ih < 0 || ih >= h as isize {
                drow.fill(0.0);
                continue;
            }
            let src = &plane[ih as usize * w..(ih as usize + 1) * w];
            drow[..lo].fill(0.0);
            drow[hi..].fill(0.0);
            if geo.s[1] == 1 {
                let s0 = (lo as isize + off) as usize;
                drow[lo..hi].copy_from_slice(&src[s0..s0 + (hi - lo)]);
            } else if hi > lo {
                // Inside 0..w for every column of lo..hi (`valid_range`).
                let s0 = (lo * geo.s[1]) as isize + off;
                copy_strided(&src[s0 as usize..], geo.s[1], &mut drow[lo..hi]);
            }
        }
    };
    // A copy of 64K floats takes ~10 us, well above the pool's wake-up cost: ResNet-50's
    // 3x3 stride-2 im2cols (1152 x 784) and the stems ran on one thread below 1M.
    let tasks = if rows * p < (1 << 16) {
        1
    } else {
        (par.threads() * 4).min(rows)
    };
    if tasks <= 1 {
        for (r, dst) in cols.chunks_exact_mut(p).enumerate() {
            fill(r, dst);
        }
        return;
    }
    let per = rows.div_ceil(tasks);
    let chunks: Vec<Mutex<&mut [f32]>> = cols.chunks_mut(per * p).map(Mutex::new).collect();
    par.run(chunks.len(), &|t| {
        let mut chunk = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
        for (i, dst) in chunk.chunks_exact_mut(p).enumerate() {
            fill(t * per + i, dst);
        }
    });
}

/// Input channels up to which an ungrouped convolution with a window of at least
/// [`STEM_MIN_TAPS`] runs directly (`rafter_kernels_cpu::stem_conv`): a network's stem, on an
/// image's 3 channels, where the GEMM's K (`Cin·KH·KW`) is short and its im2col large.
/// ResNet-50's 7×7 stride-2 stem: 2,286 → 1,839 µs a call (minimum of 5 alternated rounds,
/// `rafter bench --trace`, 2 threads). MobileNetV2's 3×3 one (27 taps) measured no faster
/// (427 against 464 µs, within the noise of that run), so it stays on im2col + GEMM.
const STEM_MAX_CIN: usize = 4;

/// The smallest window (`KH·KW`) that runs directly (see [`STEM_MAX_CIN`]).
const STEM_MIN_TAPS: usize = 25;

/// The convolution by `rafter_kernels_cpu::stem_conv` when it applies (few input channels,
/// stride 1 or 2, no dilation, a relu or no activation); `Ok(false)` otherwise.
#[allow(clippy::too_many_arguments)]
fn stem(
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    [n, c, h, w]: [usize; 4],
    m: usize,
    g: usize,
    geo: &Geom,
    r: &Resolved<'_>,
    par: &WorkerPool,
) -> Result<bool, String> {
    if g != 1
        || c > STEM_MAX_CIN
        || geo.k[0] * geo.k[1] < STEM_MIN_TAPS
        || geo.d != [1, 1]
        || geo.s[0] != geo.s[1]
        || geo.s[0] > 2
        || r.alpha != 1.0
        || !matches!(r.act, Activation::None | Activation::Relu)
    {
        return Ok(false);
    }
    let [oh, ow] = geo.out;
    let (in_len, out_len) = (c * h * w, m * oh * ow);
    for img in 0..n {
        let conv = StemConv {
            input: &xs[img * in_len..][..in_len],
            cin: c,
            h,
            w,
            weights: ws,
            cout: m,
            kernel: geo.k,
            stride: geo.s[0],
            pads: geo.pb,
            out: geo.out,
            bias: r.bias,
            residual: r.residual.map(|res| &res[img * out_len..][..out_len]),
            res_before: r.res_before,
            relu: r.act == Activation::Relu,
            clamp: r.clamp,
        };
        stem_conv(&conv, &mut y[img * out_len..][..out_len], par)
            .map_err(|e| format!("conv: {e}"))?;
    }
    Ok(true)
}

/// Depthwise conv (group == channels, one filter each), then the tail, per plane.
fn depthwise(
    xs: &[f32],
    ws: &[f32],
    y: &mut [f32],
    [n, c, h, w]: [usize; 4],
    geo: &Geom,
    r: &Resolved<'_>,
    par: &WorkerPool,
) -> Result<(), String> {
    let [kh, kw] = geo.k;
    let [oh, ow] = geo.out;
    let p = oh * ow;
    let three = kh == 3
        && kw == 3
        && geo.d == [1, 1]
        && geo.s[0] == geo.s[1]
        && geo.s[0] <= 2
        && matches!(r.act, Activation::None | Activation::Relu);
    if three {
        let conv = Depthwise3x3 {
            input: xs,
            h,
            w,
            stride: geo.s[0],
            pads: geo.pb,
            out: geo.out,
            weights: ws,
            channels: c,
            tail: r.channel_tail(),
        };
        return depthwise3x3(&conv, y, par).map_err(|e| format!("conv: {e}"));
    }
    let ranges: Vec<(isize, usize, usize)> = (0..kw)
        .map(|kj| {
            let off = (kj * geo.d[1]) as isize - geo.pb[1] as isize;
            let (lo, hi) = valid_range(off, geo.s[1], w, ow);
            (off, lo, hi)
        })
        .collect();
    let plane = |pi: usize, out: &mut [f32]| {
        let ch = pi % c;
        let xp = &xs[pi * h * w..(pi + 1) * h * w];
        let wk = &ws[ch * kh * kw..(ch + 1) * kh * kw];
        out.fill(0.0);
        for (o, orow) in out.chunks_exact_mut(ow).enumerate() {
            for ki in 0..kh {
                let ih = (o * geo.s[0] + ki * geo.d[0]) as isize - geo.pb[0] as isize;
                if ih < 0 || ih >= h as isize {
                    continue;
                }
                let xrow = &xp[ih as usize * w..(ih as usize + 1) * w];
                for (kj, &(off, lo, hi)) in ranges.iter().enumerate() {
                    let wv = wk[ki * kw + kj];
                    if geo.s[1] == 1 {
                        let s0 = (lo as isize + off) as usize;
                        for (d, &xv) in orow[lo..hi].iter_mut().zip(&xrow[s0..s0 + (hi - lo)]) {
                            *d += wv * xv;
                        }
                    } else {
                        for (j, d) in orow[lo..hi].iter_mut().enumerate() {
                            let iw = ((lo + j) * geo.s[1]) as isize + off;
                            *d += wv * xrow[iw as usize];
                        }
                    }
                }
            }
        }
        let b = r.bias.map_or(0.0, |b| b[ch]);
        r.apply(out, b, r.residual.map(|res| &res[pi * p..(pi + 1) * p]));
    };
    let planes = n * c;
    let tasks = if planes * p * kh * kw < (1 << 18) {
        1
    } else {
        (par.threads() * 8).min(planes)
    };
    if tasks <= 1 {
        for (pi, out) in y.chunks_exact_mut(p).enumerate() {
            plane(pi, out);
        }
        return Ok(());
    }
    let per = planes.div_ceil(tasks);
    let chunks: Vec<Mutex<&mut [f32]>> = y.chunks_mut(per * p).map(Mutex::new).collect();
    par.run(chunks.len(), &|t| {
        let mut chunk = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
        for (i, out) in chunk.chunks_exact_mut(p).enumerate() {
            plane(t * per + i, out);
        }
    });
    Ok(())
}
