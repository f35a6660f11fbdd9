//! Direct (non-GEMM) spatial kernels on NCHW planes: the 3×3 depthwise convolution of
//! MobileNet-style networks with its fused tail, 2-D max pooling, and the stride-2 copy that
//! im2col uses. Written once over [`Simd`], split over planes with [`Parallel`].
//!
//! Each plane is first copied into a zero-padded (pooling: `-inf`-padded) scratch row or
//! plane, so every tap of the inner loops is one contiguous, unmasked vector load (stride
//! 2: two, deinterleaved) and no loop tests bounds per element. The depthwise convolution
//! keeps its padded plane's padding across planes and treats narrow maps as one flat 1-D
//! convolution ([`DwGeometry`]).

use std::cell::RefCell;

use crate::common::{check_isa, check_len, par_blocks, ChannelTail, Disjoint, KernelError};
use crate::nhwc::VecTail;
use crate::simd::{copy, Simd, MAX_LANES};
use crate::{Isa, Parallel};

thread_local! {
    /// Padded planes and rows, reused across the planes (thousands per call) this thread
    /// computes.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

/// A 3×3 depthwise convolution (one filter per channel, no dilation) over `planes`
/// NCHW planes, with its tail.
#[derive(Clone, Copy, Debug)]
pub struct Depthwise3x3<'a> {
    /// `planes x h x w`: `n` images of `channels` planes each.
    pub input: &'a [f32],
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// 1 or 2, along both axes.
    pub stride: usize,
    /// Leading padding (top, left); trailing padding is whatever `out` implies (zeros).
    pub pads: [usize; 2],
    /// Output height and width.
    pub out: [usize; 2],
    /// `channels x 9`: plane `i` uses filter `i % channels`.
    pub weights: &'a [f32],
    /// Channels per image.
    pub channels: usize,
    /// The fused tail (bias per channel).
    pub tail: ChannelTail<'a>,
}

/// Runs `conv` into `out` (`planes x out[0] x out[1]`) on the fastest ISA.
pub fn depthwise3x3(
    conv: &Depthwise3x3<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    depthwise3x3_with_isa(Isa::detect(), conv, out, par)
}

/// [`depthwise3x3`] on a given ISA.
pub fn depthwise3x3_with_isa(
    isa: Isa,
    conv: &Depthwise3x3<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let c = conv;
    let [oh, ow] = c.out;
    let p = oh * ow;
    let shape = |detail: String| KernelError::Shape {
        what: "depthwise 3x3".into(),
        detail,
    };
    if !(1..=2).contains(&c.stride) {
        return Err(shape(format!("stride {} (1 or 2 supported)", c.stride)));
    }
    if p == 0 || c.channels == 0 {
        return Ok(());
    }
    if !out.len().is_multiple_of(p * c.channels) {
        return Err(shape(format!(
            "{} output elements for {} channels of {oh}x{ow}",
            out.len(),
            c.channels
        )));
    }
    let planes = out.len() / p;
    check_len("depthwise input", c.input.len(), planes * c.h * c.w)?;
    check_len("depthwise weights", c.weights.len(), c.channels * 9)?;
    c.tail.check("depthwise", c.channels, out.len())?;
    let y = Disjoint::new(out);
    let geo = DwGeometry::new(c, MAX_LANES);
    // A plane's work is 9 FMAs per output, about as long as 4 elements of an elementwise op.
    par_blocks(par, planes, 4 * p, &|r| {
        with_scratch(|scratch| {
            // Padding is zero and stays zero: each plane writes only its input's own rows
            // and columns of the padded plane (the same places for every plane).
            scratch.clear();
            scratch.resize(geo.scratch_len(), 0.0);
            for pi in r {
                // SAFETY: blocks (so planes) are disjoint.
                let plane = unsafe { y.part(pi * p..(pi + 1) * p) };
                dw_plane_isa(isa, c, &geo, pi, plane, scratch);
            }
        })
    });
    Ok(())
}

/// Where a depthwise plane lives in the scratch: the zero-padded input plane as a flat
/// array of rows of `rw` floats, then the flat results.
///
/// Flat output `q = o * ostride + x` reads padded element `q + ki * rw + kj` for tap
/// `(ki, kj)` at stride 1: the whole plane is one 1-D convolution with 9 offsets over the
/// flat buffer, so a vector covers several short rows at once (a 7×7 map takes 4 vectors of
/// 16, not 7) and no tap needs a bounds test. Columns `x >= ow` of a flat row are junk,
/// skipped when the results are copied out. At stride 2 the padded rows are stored split
/// by parity, even rows then odd rows (`ostride = rw / 2`): tap `(0, kj)` reads even-row
/// element `2 q + kj`, `(1, kj)` odd-row element `2 q + kj`, `(2, kj)` even-row element
/// `2 q + rw + kj`.
struct DwGeometry {
    stride: usize,
    rw: usize,
    ostride: usize,
    /// Flat outputs, rounded up to whole vectors of the widest ISA.
    flat: usize,
    /// Floats of the padded plane (stride 1), or of each parity's rows (stride 2),
    /// including the slack the last vectors read.
    sub: usize,
}

impl DwGeometry {
    fn new(c: &Depthwise3x3<'_>, lanes: usize) -> DwGeometry {
        let [oh, ow] = c.out;
        let st = c.stride;
        let rows = (oh - 1) * st + 3;
        // Stride 2 needs an even row length (so output row o starts at padded column 0 of
        // its rows); both need the last output's 3 taps inside the row.
        let rw = if st == 1 { ow + 2 } else { 2 * ow + 2 };
        let ostride = rw / st;
        let flat = (oh * ostride).div_ceil(lanes) * lanes;
        // Reads reach `st * flat + 2 rw + 2 + 2 lanes` (stride 1) or `2 flat + rw + 2 + 2
        // lanes` in each parity (stride 2).
        let sub = if st == 1 {
            (rows * rw).max(flat + 2 * rw)
        } else {
            (rows.div_ceil(2) * rw).max(2 * flat + rw)
        } + 2 * lanes
            + 4;
        DwGeometry {
            stride: st,
            rw,
            ostride,
            flat,
            sub,
        }
    }

    fn plane_len(&self) -> usize {
        self.stride * self.sub
    }

    fn scratch_len(&self) -> usize {
        self.plane_len() + self.flat
    }

    /// Where padded row `pr` starts in the plane.
    fn row_at(&self, pr: usize) -> usize {
        if self.stride == 1 {
            pr * self.rw
        } else {
            (pr % 2) * self.sub + (pr / 2) * self.rw
        }
    }
}

simd_dispatch!(fn dw_plane_isa(c: &Depthwise3x3<'_>, geo: &DwGeometry, pi: usize, out: &mut [f32], scratch: &mut [f32]) => dw_plane);

/// Splits `src` (`2 * half` elements, `half` a multiple of the lanes) into its even and odd
/// elements.
#[inline(always)]
fn split_even_odd<S: Simd>(s: S, src: &[f32], even: &mut [f32], odd: &mut [f32]) {
    let l = S::LANES;
    for i in (0..even.len()).step_by(l) {
        let (e, o) = s.deinterleave(s.load(&src[2 * i..]), s.load(&src[2 * i + l..]));
        s.store(&mut even[i..], e);
        s.store(&mut odd[i..], o);
    }
}

#[inline(always)]
fn dw_plane<S: Simd>(
    s: S,
    c: &Depthwise3x3<'_>,
    geo: &DwGeometry,
    pi: usize,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let l = S::LANES;
    let [oh, ow] = c.out;
    let (h, w, st) = (c.h, c.w, c.stride);
    let (rw, [pt, pl]) = (geo.rw, c.pads);
    let x = &c.input[pi * h * w..(pi + 1) * h * w];
    let ch = pi % c.channels;
    let (plane, flat) = scratch.split_at_mut(geo.plane_len());
    // The input's rows and columns that the taps reach (trailing ones may not be).
    let (r1, k1) = ((pt + h).min((oh - 1) * st + 3), (pl + w).min(rw));
    if pl < k1 {
        for pr in pt.min(r1)..r1 {
            let src = &x[(pr - pt) * w..][..k1 - pl];
            let at = geo.row_at(pr) + pl;
            copy(s, src, &mut plane[at..at + k1 - pl]);
        }
    }
    let wk = &c.weights[ch * 9..ch * 9 + 9];
    let wv: [S::V; 9] = [
        s.splat(wk[0]),
        s.splat(wk[1]),
        s.splat(wk[2]),
        s.splat(wk[3]),
        s.splat(wk[4]),
        s.splat(wk[5]),
        s.splat(wk[6]),
        s.splat(wk[7]),
        s.splat(wk[8]),
    ];
    let t = &c.tail;
    let bias = t.bias.map_or(0.0, |b| b[ch]);
    let tail = Tail::new(s, bias, t.alpha, t.res_before, t.relu, t.clamp);
    let res = t.residual.map(|r| &r[pi * oh * ow..(pi + 1) * oh * ow]);
    if ow >= DW_ROWWISE_MIN_WIDTH {
        // Wide rows: per output row, the tail applied as each vector is computed.
        for o in 0..oh {
            let orow = &mut out[o * ow..(o + 1) * ow];
            let rrow = res.map(|r| &r[o * ow..(o + 1) * ow]);
            for x0 in (0..ow).step_by(l) {
                let acc = dw_taps(s, plane, geo, &wv, o * geo.ostride + x0);
                tail.store(s, acc, rrow, orow, x0);
            }
        }
        return;
    }
    // Narrow rows: whole vectors over the flat outputs, then the tail row by row.
    for q in (0..geo.flat).step_by(l) {
        s.store(&mut flat[q..], dw_taps(s, plane, geo, &wv, q));
    }
    for o in 0..oh {
        let orow = &mut out[o * ow..(o + 1) * ow];
        let rrow = res.map(|r| &r[o * ow..(o + 1) * ow]);
        let frow = &flat[o * geo.ostride..];
        for x0 in (0..ow).step_by(l) {
            let acc = if x0 + l <= ow {
                s.load(&frow[x0..])
            } else {
                s.load_partial(&frow[x0..ow], 0.0)
            };
            tail.store(s, acc, rrow, orow, x0);
        }
    }
}

/// Output width from which a depthwise plane is computed row by row: narrower maps (14×14,
/// 7×7) fill more lanes as one flat 1-D convolution (see [`DwGeometry`]). Measured on
/// MobileNetV2 (`rafter bench --trace`, 2 threads): the flat form with its separate tail
/// pass made the 112×112 and 56×56 layers ~25% slower, and the 7×7 ones 25–45% faster
/// than per row.
const DW_ROWWISE_MIN_WIDTH: usize = 24;

/// The 3×3 taps of the vector of flat outputs at `q` (see [`DwGeometry`]).
#[inline(always)]
fn dw_taps<S: Simd>(s: S, plane: &[f32], geo: &DwGeometry, wv: &[S::V; 9], q: usize) -> S::V {
    let (l, rw) = (S::LANES, geo.rw);
    let mut acc = s.splat(0.0);
    for ki in 0..3 {
        let (a, b, cc) = if geo.stride == 1 {
            let base = q + ki * rw;
            (
                s.load(&plane[base..]),
                s.load(&plane[base + 1..]),
                s.load(&plane[base + 2..]),
            )
        } else {
            // Even rows for ki = 0 and 2 (one row further down), odd rows for ki = 1.
            let base = (ki % 2) * geo.sub + 2 * q + (ki / 2) * rw;
            let (a, b) = s.deinterleave(s.load(&plane[base..]), s.load(&plane[base + l..]));
            let (cc, _) =
                s.deinterleave(s.load(&plane[base + 2..]), s.load(&plane[base + 2 + l..]));
            (a, b, cc)
        };
        acc = s.fma(wv[3 * ki], a, acc);
        acc = s.fma(wv[3 * ki + 1], b, acc);
        acc = s.fma(wv[3 * ki + 2], cc, acc);
    }
    acc
}

/// A direct convolution's tail per output channel, `clamp(act(alpha * conv + bias (+
/// residual)) (+ residual))`, with its constants splatted once per channel: shared by the
/// depthwise and the stem kernels.
pub(crate) struct Tail<S: Simd> {
    /// The channel's bias, splatted.
    bias: S::V,
    /// Everything else, as the channels-last kernels apply it.
    tail: VecTail<S>,
}

impl<S: Simd> Tail<S> {
    #[inline(always)]
    pub(crate) fn new(
        s: S,
        bias: f32,
        alpha: f32,
        res_before: bool,
        relu: bool,
        clamp: Option<(f32, f32)>,
    ) -> Self {
        let channel = ChannelTail {
            alpha,
            bias: None,
            residual: None,
            res_before,
            relu,
            clamp,
        };
        Tail {
            bias: s.splat(bias),
            tail: VecTail::new(s, &channel),
        }
    }

    /// The tail of `acc`, stored at `orow[x0..]` (masked past the row's end), with the
    /// residual row's matching elements.
    #[inline(always)]
    pub(crate) fn store(&self, s: S, acc: S::V, rrow: Option<&[f32]>, orow: &mut [f32], x0: usize) {
        let full = x0 + S::LANES <= orow.len();
        // (A match, not `Option::map` with a closure: a closure is compiled without the
        // caller's target features, and its load would become a call.)
        let rv = match rrow {
            Some(r) if full => Some(s.load(&r[x0..])),
            Some(r) => Some(s.load_partial(&r[x0..], 0.0)),
            None => None,
        };
        let v = self.tail.finish(s, acc, self.bias, rv);
        if full {
            s.store(&mut orow[x0..], v);
        } else {
            s.store_partial(&mut orow[x0..], v);
        }
    }
}

/// 2-D max pooling geometry (no dilation) over NCHW planes; windows reaching past the input
/// (padding, `ceil_mode`) see only the input elements they cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub stride: [usize; 2],
    /// Leading padding (top, left).
    pub pads: [usize; 2],
    /// Output height and width.
    pub out: [usize; 2],
}

/// Max pooling of `x` (`planes x h x w`) into `out` (`planes x out[0] x out[1]`); NaN
/// propagates (a window holding a NaN gives NaN).
pub fn max_pool2d(
    pool: &MaxPool2d,
    x: &[f32],
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    max_pool2d_with_isa(Isa::detect(), pool, x, out, par)
}

/// [`max_pool2d`] on a given ISA.
pub fn max_pool2d_with_isa(
    isa: Isa,
    pool: &MaxPool2d,
    x: &[f32],
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let [oh, ow] = pool.out;
    let p = oh * ow;
    let (pin, [kh, kw], [sh, sw]) = (pool.h * pool.w, pool.kernel, pool.stride);
    if kh == 0 || kw == 0 || sh == 0 || sw == 0 {
        return Err(KernelError::Shape {
            what: "max pool".into(),
            detail: format!("window {kh}x{kw}, stride {sh}x{sw}"),
        });
    }
    if p == 0 {
        return Ok(());
    }
    if !out.len().is_multiple_of(p) {
        return Err(KernelError::Shape {
            what: "max pool".into(),
            detail: format!("{} output elements for {oh}x{ow} planes", out.len()),
        });
    }
    let planes = out.len() / p;
    check_len("max pool input", x.len(), planes * pin)?;
    let y = Disjoint::new(out);
    par_blocks(par, planes, pin.max(p), &|r| {
        with_scratch(|scratch| {
            for pi in r {
                // SAFETY: blocks (so planes) are disjoint.
                let plane = unsafe { y.part(pi * p..(pi + 1) * p) };
                mp_plane_isa(isa, pool, &x[pi * pin..(pi + 1) * pin], plane, scratch);
            }
        })
    });
    Ok(())
}

simd_dispatch!(fn mp_plane_isa(pool: &MaxPool2d, x: &[f32], out: &mut [f32], scratch: &mut Vec<f32>) => mp_plane);

/// `max(a, b)`, NaN if either is NaN.
#[inline(always)]
pub(crate) fn max_nan<S: Simd>(s: S, a: S::V, b: S::V) -> S::V {
    // x86 max returns its second operand when either is NaN: b's NaN survives, a's is
    // put back by the select.
    s.select_nan(a, a, s.max(a, b))
}

#[inline(always)]
fn mp_plane<S: Simd>(s: S, pool: &MaxPool2d, x: &[f32], out: &mut [f32], scratch: &mut Vec<f32>) {
    let l = S::LANES;
    let (h, w) = (pool.h, pool.w);
    let ([kh, kw], [sh, sw], [pt, pl], [oh, ow]) = (pool.kernel, pool.stride, pool.pads, pool.out);
    let ovec = ow.div_ceil(l) * l;
    // Padded row: column j is input column j - pl, -inf outside; wide enough for every
    // window of the vectors computed, and for the even/odd split of stride 2.
    // A multiple of the lanes, as `split_even_odd` needs.
    let half = (ovec + kw.div_ceil(2)).div_ceil(l) * l + l;
    let pw = ((ovec - 1) * sw + kw).max(2 * half).max(pl + w).div_ceil(l) * l;
    scratch.resize(pw + 2 * half, 0.0);
    let (prow, eo) = scratch.split_at_mut(pw);
    let (even, odd) = eo.split_at_mut(half);
    let ninf = f32::NEG_INFINITY;
    prow.fill(ninf);
    let (lo, n) = (pl.min(pw), w.min(pw - pl.min(pw)));
    for o in 0..oh {
        // Vertical max of the window's rows into prow[lo..lo + n].
        let mut first = true;
        for ki in 0..kh {
            let r = o * sh + ki;
            if r < pt || r - pt >= h {
                continue;
            }
            let src = &x[(r - pt) * w..][..n];
            let dst = &mut prow[lo..lo + n];
            if first {
                dst.copy_from_slice(src);
                first = false;
                continue;
            }
            let mut j = 0;
            while j + l <= n {
                let v = max_nan(s, s.load(&src[j..]), s.load(&dst[j..]));
                s.store(&mut dst[j..], v);
                j += l;
            }
            if j < n {
                let v = max_nan(
                    s,
                    s.load_partial(&src[j..], ninf),
                    s.load_partial(&dst[j..], ninf),
                );
                s.store_partial(&mut dst[j..], v);
            }
        }
        if first {
            prow[lo..lo + n].fill(ninf);
        }
        // Horizontal max over the window's columns.
        let orow = &mut out[o * ow..(o + 1) * ow];
        if sw == 2 {
            split_even_odd(s, &prow[..2 * half], even, odd);
        }
        for x0 in (0..ow).step_by(l) {
            let mut m = s.splat(ninf);
            if sw == 1 {
                for kj in 0..kw {
                    m = max_nan(s, s.load(&prow[x0 + kj..]), m);
                }
            } else if sw == 2 {
                for kj in 0..kw {
                    let src = if kj % 2 == 0 { &*even } else { &*odd };
                    m = max_nan(s, s.load(&src[x0 + kj / 2..]), m);
                }
            } else {
                let mut buf = [ninf; 16];
                for (i, b) in buf.iter_mut().enumerate().take(l.min(ow - x0)) {
                    let win = &prow[(x0 + i) * sw..(x0 + i) * sw + kw];
                    // NaN, once seen, stays: `v > NaN` is false.
                    *b = win
                        .iter()
                        .fold(ninf, |a, &v| if v.is_nan() || v > a { v } else { a });
                }
                m = s.load(&buf);
            }
            if x0 + l <= ow {
                s.store(&mut orow[x0..], m);
            } else {
                s.store_partial(&mut orow[x0..], m);
            }
        }
    }
}

/// `dst[i] = src[i * stride]` (im2col's strided rows), vectorised for stride 2.
///
/// # Panics
/// When `src` is shorter than `(dst.len() - 1) * stride + 1`.
pub fn copy_strided(src: &[f32], stride: usize, dst: &mut [f32]) {
    if dst.is_empty() {
        return;
    }
    assert!(
        src.len() > (dst.len() - 1) * stride,
        "copy_strided: {} elements at stride {stride} from {}",
        dst.len(),
        src.len()
    );
    if stride == 2 {
        copy_stride2_isa(Isa::detect(), src, dst);
    } else {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = src[i * stride];
        }
    }
}

simd_dispatch!(fn copy_stride2_isa(src: &[f32], dst: &mut [f32]) => copy_stride2);

#[inline(always)]
fn copy_stride2<S: Simd>(s: S, src: &[f32], dst: &mut [f32]) {
    let l = S::LANES;
    let mut i = 0;
    while i + l <= dst.len() && 2 * (i + l) <= src.len() {
        let (e, _) = s.deinterleave(s.load(&src[2 * i..]), s.load(&src[2 * i + l..]));
        s.store(&mut dst[i..], e);
        i += l;
    }
    for (j, d) in dst.iter_mut().enumerate().skip(i) {
        *d = src[2 * j];
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::{ScopedThreads, Sequential};

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut st = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                st = st
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((st >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    pub(crate) fn out_size(n: usize, pb: usize, pe: usize, k: usize, s: usize) -> usize {
        (n + pb + pe - k) / s + 1
    }

    #[test]
    fn depthwise_matches_direct_loops() {
        let shapes = [
            (1, 1, 1),
            (3, 7, 5),
            (2, 17, 33),
            (4, 16, 16),
            (1, 40, 3),
            (2, 9, 64),
        ];
        for isa in isas() {
            for (si, &(ch, h, w)) in shapes.iter().enumerate() {
                for stride in [1, 2] {
                    for (pt, pl, pb, pe) in [(1, 1, 1, 1), (0, 0, 0, 0), (0, 0, 1, 1), (2, 1, 0, 2)]
                    {
                        if h + pt + pb < 3 || w + pl + pe < 3 {
                            continue;
                        }
                        let (oh, ow) = (
                            out_size(h, pt, pb, 3, stride),
                            out_size(w, pl, pe, 3, stride),
                        );
                        let n = 2;
                        let x = rand(n * ch * h * w, si as u64);
                        let wts = rand(ch * 9, 7);
                        let bias = rand(ch, 9);
                        let res = rand(n * ch * oh * ow, 11);
                        for variant in 0..4 {
                            let conv = Depthwise3x3 {
                                input: &x,
                                h,
                                w,
                                stride,
                                pads: [pt, pl],
                                out: [oh, ow],
                                weights: &wts,
                                channels: ch,
                                tail: ChannelTail {
                                    alpha: if variant == 3 { 0.5 } else { 1.0 },
                                    bias: (variant != 0).then_some(&bias[..]),
                                    residual: (variant >= 2).then_some(&res[..]),
                                    res_before: variant == 2,
                                    relu: variant != 3,
                                    clamp: (variant == 1 || variant == 3).then_some((0.0, 1.5)),
                                },
                            };
                            let mut y = vec![f32::NAN; n * ch * oh * ow];
                            let par = ScopedThreads::new(3);
                            depthwise3x3_with_isa(isa, &conv, &mut y, &par).unwrap();
                            for pi in 0..n * ch {
                                let c = pi % ch;
                                for o in 0..oh {
                                    for q in 0..ow {
                                        let mut acc = 0.0f64;
                                        for ki in 0..3 {
                                            for kj in 0..3 {
                                                let ih = (o * stride + ki) as isize - pt as isize;
                                                let iw = (q * stride + kj) as isize - pl as isize;
                                                if ih >= 0
                                                    && iw >= 0
                                                    && (ih as usize) < h
                                                    && (iw as usize) < w
                                                {
                                                    acc += wts[c * 9 + ki * 3 + kj] as f64
                                                        * x[pi * h * w
                                                            + ih as usize * w
                                                            + iw as usize]
                                                            as f64;
                                                }
                                            }
                                        }
                                        let i = pi * oh * ow + o * ow + q;
                                        let v = conv.tail.reference(acc, c, i);
                                        assert!(
                                            (y[i] as f64 - v).abs() < 1e-5 * (1.0 + v.abs()),
                                            "{isa:?} {ch}x{h}x{w} s{stride} pads {pt},{pl},{pb},{pe} v{variant} at {pi},{o},{q}: {} vs {v}",
                                            y[i]
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn max_pool_matches_direct_loops() {
        for isa in isas() {
            for &(h, w) in &[(1, 1), (5, 7), (17, 33), (112, 112), (4, 40)] {
                for (k, st, pt, pl, pb, pe) in [
                    (3, 2, 1, 1, 1, 1),
                    (2, 2, 0, 0, 0, 0),
                    (3, 1, 1, 1, 1, 1),
                    (3, 3, 0, 0, 2, 2),
                    (1, 1, 0, 0, 0, 0),
                    (5, 2, 2, 2, 2, 2),
                ] {
                    if h + pt + pb < k || w + pl + pe < k {
                        continue;
                    }
                    let (oh, ow) = (out_size(h, pt, pb, k, st), out_size(w, pl, pe, k, st));
                    let planes = 3;
                    let mut x = rand(planes * h * w, (h * w) as u64);
                    if h * w > 4 {
                        x[h * w + 2] = f32::NAN;
                    }
                    let pool = MaxPool2d {
                        h,
                        w,
                        kernel: [k, k],
                        stride: [st, st],
                        pads: [pt, pl],
                        out: [oh, ow],
                    };
                    let mut y = vec![0.0; planes * oh * ow];
                    max_pool2d_with_isa(isa, &pool, &x, &mut y, &Sequential).unwrap();
                    for pi in 0..planes {
                        for o in 0..oh {
                            for q in 0..ow {
                                let mut m = f32::NEG_INFINITY;
                                let mut nan = false;
                                for ki in 0..k {
                                    for kj in 0..k {
                                        let ih = (o * st + ki) as isize - pt as isize;
                                        let iw = (q * st + kj) as isize - pl as isize;
                                        if ih >= 0
                                            && iw >= 0
                                            && (ih as usize) < h
                                            && (iw as usize) < w
                                        {
                                            let v = x[pi * h * w + ih as usize * w + iw as usize];
                                            nan |= v.is_nan();
                                            m = m.max(v);
                                        }
                                    }
                                }
                                let got = y[pi * oh * ow + o * ow + q];
                                if nan {
                                    assert!(
                                        got.is_nan(),
                                        "{isa:?} {h}x{w} k{k} s{st}: {got} not NaN"
                                    );
                                } else {
                                    assert_eq!(
                                        got, m,
                                        "{isa:?} {h}x{w} k{k} s{st} at {pi},{o},{q}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copy_strided_matches() {
        for n in [1, 2, 7, 15, 16, 17, 33, 100] {
            for stride in [1, 2, 3] {
                let src: Vec<f32> = (0..(n - 1) * stride + 1).map(|i| i as f32).collect();
                let mut dst = vec![0.0; n];
                copy_strided(&src, stride, &mut dst);
                for (i, &d) in dst.iter().enumerate() {
                    assert_eq!(d, (i * stride) as f32);
                }
            }
        }
    }
}
