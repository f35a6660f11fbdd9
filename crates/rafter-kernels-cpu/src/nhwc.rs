//! Convolution helpers for channels-last (NHWC) activations.
//!
//! In NHWC a pixel's channels are contiguous, which is what these kernels exploit:
//! - [`depthwise_nhwc`] vectorises over channels: an output vector of `LANES` channels is
//!   `kh·kw` fused multiply-adds of input vectors by weight vectors (`[kh, kw, C]`, so a
//!   tap's weights are contiguous too), with no per-plane padding, no row gathers and no
//!   short-map special cases; the 3×3 taps of interior pixels are unrolled with their
//!   weights held in registers;
//! - [`im2col_nhwc`] builds a k×k (or strided) convolution's GEMM operand row by row: each
//!   output pixel's row is `kh·kw` contiguous runs of `C` input values, so the copy is a
//!   few long `memcpy`s per pixel instead of one gather per element. 1×1 stride-1
//!   convolutions need no copy at all: the activations *are* the GEMM's row-major A.

use std::ops::Range;

use crate::common::{check_isa, check_len, par_blocks, prefetch_read, ChannelTail, Disjoint};
use crate::simd::{Simd, MAX_LANES};
use crate::{Isa, KernelError, Parallel};

/// An NHWC input and the window a convolution slides over it (no dilation).
#[derive(Clone, Copy, Debug)]
pub struct WindowNhwc<'a> {
    /// `n x h x w x channels`.
    pub input: &'a [f32],
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub channels: usize,
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub stride: [usize; 2],
    /// Leading padding (top, left); trailing padding is whatever `out` implies (zeros).
    pub pads: [usize; 2],
    /// Output height and width.
    pub out: [usize; 2],
}

impl WindowNhwc<'_> {
    /// The images in an output of `out_len` elements of `cout` channels, after checking the
    /// window and the input's length against them; 0 for an empty output.
    fn images(&self, what: &str, out_len: usize, cout: usize) -> Result<usize, KernelError> {
        let ([oh, ow], [kh, kw]) = (self.out, self.kernel);
        let pixel = oh * ow * cout;
        if pixel == 0 || out_len == 0 {
            return Ok(0);
        }
        let shape = |detail: String| KernelError::Shape {
            what: what.into(),
            detail,
        };
        if kh == 0 || kw == 0 || self.stride.contains(&0) {
            return Err(shape(format!(
                "window {kh}x{kw}, strides {:?} (all must be positive)",
                self.stride
            )));
        }
        if !out_len.is_multiple_of(pixel) {
            return Err(shape(format!(
                "{out_len} output elements for {oh}x{ow}x{cout} images"
            )));
        }
        let n = out_len / pixel;
        check_len(
            &format!("{what} input"),
            self.input.len(),
            n * self.h * self.w * self.channels,
        )?;
        Ok(n)
    }
}

/// A depthwise convolution (one filter per input channel) over NHWC activations, with its
/// tail.
#[derive(Clone, Copy, Debug)]
pub struct DepthwiseNhwc<'a> {
    /// The input and window; output channels are the input's.
    pub window: WindowNhwc<'a>,
    /// `kh x kw x channels`.
    pub weights: &'a [f32],
    /// The fused tail.
    pub tail: ChannelTail<'a>,
}

/// Runs `conv` into `out` (`n x out[0] x out[1] x channels`) on the fastest ISA.
pub fn depthwise_nhwc(
    conv: &DepthwiseNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    depthwise_nhwc_with_isa(Isa::detect(), conv, out, par)
}

/// [`depthwise_nhwc`] on a given ISA.
pub fn depthwise_nhwc_with_isa(
    isa: Isa,
    conv: &DepthwiseNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let c = conv;
    let (ch, [oh, ow], [kh, kw]) = (c.window.channels, c.window.out, c.window.kernel);
    let n = c.window.images("depthwise nhwc", out.len(), ch)?;
    if n == 0 {
        return Ok(());
    }
    check_len("depthwise weights", c.weights.len(), kh * kw * ch)?;
    c.tail.check("depthwise", ch, out.len())?;
    let rows = n * oh;
    let dst = Disjoint::new(out);
    let threads = par.threads();
    if threads > 1 && rows < CHANNEL_SPLIT_ROWS * threads && ch >= 2 * MAX_LANES * threads {
        // Few rows (a 7×7 map): split the channels instead, in whole vectors of the widest
        // ISA, so each thread reads only its channels' inputs and filters.
        let vecs = ch.div_ceil(MAX_LANES);
        let parts = threads.min(vecs);
        par.run(parts, &|t| {
            let chans =
                (vecs * t / parts * MAX_LANES)..(vecs * (t + 1) / parts * MAX_LANES).min(ch);
            depthwise_isa(isa, c, 0..rows, chans, &dst)
        });
        return Ok(());
    }
    par_blocks(par, rows, ow * ch * kh * kw, &|r| {
        depthwise_isa(isa, c, r, 0..ch, &dst)
    });
    Ok(())
}

/// Below this many output rows per thread, [`depthwise_nhwc`] splits channels, not rows:
/// on MobileNetV2's 7×7 maps (7 rows for 2 threads) the row split ran no faster on two
/// threads than on one (`rafter bench --trace`, medians of 300 calls: 22–23 µs a layer on
/// two threads, 13–22 on one); split by channels, 18–23 against 23–26 µs in an alternated
/// pair of traces.
const CHANNEL_SPLIT_ROWS: usize = 8;

simd_dispatch!(fn depthwise_isa(c: &DepthwiseNhwc<'_>, rows: Range<usize>, chans: Range<usize>, dst: &Disjoint<'_>) => depthwise_rows);

/// The tail of an output vector of channels: `clamp(act(alpha·acc + bias (+ residual))
/// (+ residual))`, its constants splat once per kernel call.
#[derive(Clone, Copy)]
pub(crate) struct VecTail<S: Simd> {
    alpha: S::V,
    zero: S::V,
    lo: S::V,
    hi: S::V,
    res_before: bool,
    relu: bool,
    clamp: bool,
}

impl<S: Simd> VecTail<S> {
    #[inline(always)]
    pub(crate) fn new(s: S, tail: &ChannelTail<'_>) -> Self {
        let (lo, hi) = tail.clamp.unwrap_or((0.0, 0.0));
        VecTail {
            alpha: s.splat(tail.alpha),
            zero: s.splat(0.0),
            lo: s.splat(lo),
            hi: s.splat(hi),
            res_before: tail.res_before,
            relu: tail.relu,
            clamp: tail.clamp.is_some(),
        }
    }

    /// The per-channel bias vector of channels `c0..c0 + lanes` (zero without a bias).
    #[inline(always)]
    pub(crate) fn bias(&self, s: S, bias: Option<&[f32]>, c0: usize, lanes: usize) -> S::V {
        match bias {
            Some(b) if lanes == S::LANES => s.load(&b[c0..]),
            Some(b) => s.load_partial(&b[c0..c0 + lanes], 0.0),
            None => self.zero,
        }
    }

    /// The tail of `acc`, with `rv` as the residual.
    #[inline(always)]
    pub(crate) fn finish(&self, s: S, acc: S::V, bias: S::V, rv: Option<S::V>) -> S::V {
        let mut v = s.fma(acc, self.alpha, bias);
        if let (Some(rv), true) = (rv, self.res_before) {
            v = s.add(v, rv);
        }
        if self.relu {
            v = s.max(v, self.zero);
        }
        if let (Some(rv), false) = (rv, self.res_before) {
            v = s.add(v, rv);
        }
        if self.clamp {
            v = s.min(s.max(v, self.lo), self.hi);
        }
        v
    }

    /// The tail of `acc` stored to `out[..lanes]`, with `res[..lanes]` as the residual.
    #[inline(always)]
    pub(crate) fn store(
        &self,
        s: S,
        acc: S::V,
        bias: S::V,
        res: Option<&[f32]>,
        out: &mut [f32],
        lanes: usize,
    ) {
        let full = lanes == S::LANES;
        // (A match, not `Option::map` with a closure: a closure is compiled without the
        // caller's target features, and its load would become a call.)
        let rv = match res {
            Some(r) if full => Some(s.load(r)),
            Some(r) => Some(s.load_partial(&r[..lanes], 0.0)),
            None => None,
        };
        let v = self.finish(s, acc, bias, rv);
        if full {
            s.store(out, v);
        } else {
            s.store_partial(&mut out[..lanes], v);
        }
    }
}

/// Output rows `rows` (image-major: row `r` is image `r / oh`, output row `r % oh`).
///
/// One channel vector at a time over all the rows: the vector's slice of the window's input
/// rows (3·w·64 bytes with AVX-512) stays in L1 while the rows' pixels are swept, and is read
/// from L2 about once, where a pixel's whole channel range first streams the window rows
/// (3·w·C floats, 96 KiB for MobileNetV2's 56×56×144, twice L1) from L2 for each output row.
/// This is the order of a channel-blocked (NCHWc) layout, reached within NHWC.
#[inline(always)]
fn depthwise_rows<S: Simd>(
    s: S,
    c: &DepthwiseNhwc<'_>,
    rows: Range<usize>,
    chans: Range<usize>,
    dst: &Disjoint<'_>,
) {
    let wnd = &c.window;
    let ch = wnd.channels;
    let [kh, kw] = wnd.kernel;
    let t = VecTail::new(s, &c.tail);
    let cols = InnerCols::of(wnd);
    let quads = kh == 3 && kw == 3 && (wnd.stride[1] == 1 || wnd.stride[1] == 2);
    for c0 in chans.clone().step_by(S::LANES) {
        let lanes = S::LANES.min(chans.end - c0);
        let bias = t.bias(s, c.tail.bias, c0, lanes);
        let unrolled = kh == 3 && kw == 3 && lanes == S::LANES;
        let mut wv = [s.splat(0.0); 9];
        if unrolled {
            for (i, v) in wv.iter_mut().enumerate() {
                *v = s.load(&c.weights[i * ch + c0..]);
            }
        }
        for r in rows.clone() {
            let g = RowGeom::of(wnd, r);
            // Output vector `at..at + lanes` of this row. SAFETY: (of each use) tasks get
            // disjoint row ranges or disjoint channel ranges, so no two tasks write one
            // element, and each part is dead once its vector is stored.
            let out = |at: usize| unsafe { dst.part(r * g.len + at..r * g.len + at + lanes) };
            let rrow = c.tail.residual.map(|res| &res[r * g.len..(r + 1) * g.len]);
            let plane = &wnd.input[g.plane..g.plane + wnd.h * wnd.w * ch];
            let full_rows = g.ky.start == 0 && g.ky.end == kh;
            let mut ox = 0;
            while ox < wnd.out[1] {
                let inner = ox >= cols.lo && ox < cols.hi && full_rows && unrolled;
                if inner && quads && ox + QUAD <= cols.hi {
                    // Every quad left in the row's interior, through unchecked loads and
                    // stores whose bounds are checked here once.
                    let n = (cols.hi - ox) / QUAD;
                    let base = (g.iy0 as usize * wnd.w + cols.ix(ox) as usize) * ch + c0;
                    let sw = wnd.stride[1];
                    let last_in =
                        base + 2 * wnd.w * ch + ((n - 1) * QUAD * sw + 2 + (QUAD - 1) * sw) * ch;
                    assert!(last_in + S::LANES <= plane.len());
                    let at = ox * ch + c0;
                    let end = at + ((n - 1) * QUAD + QUAD - 1) * ch + S::LANES;
                    let o = dst.ptr_to(r * g.len + at..r * g.len + end);
                    let res = rrow.map(|rr| rr[at..end].as_ptr());
                    let x = plane[base..].as_ptr();
                    // SAFETY: the last quad's last input vector ends inside `plane`, its
                    // last output vector inside this task's part of `dst` and its last
                    // residual vector inside the row's (all checked above); earlier ones
                    // lie before them.
                    unsafe {
                        if sw == 1 {
                            quads_at::<S, 1>(s, x, wnd.w * ch, ch, o, res, n, &wv, &t, bias);
                        } else {
                            quads_at::<S, 2>(s, x, wnd.w * ch, ch, o, res, n, &wv, &t, bias);
                        }
                    }
                    ox += n * QUAD;
                    continue;
                }
                let acc = if inner {
                    let base = (g.iy0 as usize * wnd.w + cols.ix(ox) as usize) * ch + c0;
                    dot9(s, plane, base, wnd.w * ch, ch, &wv)
                } else if unrolled {
                    edge3x3(s, wnd, plane, g.iy0, g.ky.clone(), cols.ix(ox), c0, &wv)
                } else {
                    window(s, c, plane, g.iy0, g.ky.clone(), cols.ix(ox), c0, lanes)
                };
                let at = ox * ch + c0;
                t.store(s, acc, bias, rrow.map(|r| &r[at..]), out(at), lanes);
                ox += 1;
            }
        }
    }
}

/// The output columns whose whole window lies inside the input (`lo..hi`): no checks there.
struct InnerCols {
    lo: usize,
    hi: usize,
    stride: usize,
    pad: usize,
}

impl InnerCols {
    fn of(wnd: &WindowNhwc<'_>) -> InnerCols {
        let mut c = InnerCols {
            lo: 0,
            hi: 0,
            stride: wnd.stride[1],
            pad: wnd.pads[1],
        };
        let ow = wnd.out[1];
        c.lo = (0..ow).find(|&ox| c.ix(ox) >= 0).unwrap_or(ow);
        c.hi = (c.lo..ow)
            .find(|&ox| c.ix(ox) + wnd.kernel[1] as isize > wnd.w as isize)
            .unwrap_or(ow);
        c
    }

    /// The input column of output column `ox`'s first tap.
    #[inline(always)]
    fn ix(&self, ox: usize) -> isize {
        (ox * self.stride) as isize - self.pad as isize
    }
}

/// Where output row `r` (image-major) reads: its image's plane, its first input row and the
/// window rows inside the input.
struct RowGeom {
    /// Offset of the image's input plane.
    plane: usize,
    /// Input row of the window's first row (negative in the top padding).
    iy0: isize,
    /// Window rows inside the input.
    ky: Range<usize>,
    /// Elements in an output row.
    len: usize,
}

impl RowGeom {
    #[inline(always)]
    fn of(wnd: &WindowNhwc<'_>, r: usize) -> RowGeom {
        let [oh, ow] = wnd.out;
        let (img, oy) = (r / oh, r % oh);
        let iy0 = (oy * wnd.stride[0]) as isize - wnd.pads[0] as isize;
        let ky0 = (-iy0).max(0) as usize;
        let ky1 = (wnd.h as isize - iy0).clamp(0, wnd.kernel[0] as isize) as usize;
        RowGeom {
            plane: img * wnd.h * wnd.w * wnd.channels,
            iy0,
            ky: ky0..ky1.max(ky0),
            len: ow * wnd.channels,
        }
    }
}

/// Output pixels computed together by [`quads_at`].
const QUAD: usize = 4;

/// `n` runs of [`QUAD`] adjacent output pixels along a row, for one channel vector of a 3×3
/// depthwise window of stride `SW`: the first window's top-left tap at `x` (rows `row`
/// apart, pixels `px` apart), the outputs at `out` and the residual, if any, at `res`
/// (pixels `px` apart too: depthwise keeps the channels), each finished by `t`.
///
/// Each input vector of a window row is loaded once for the four pixels (6 or 9 columns
/// instead of 12), and the four accumulators are independent chains of fused
/// multiply-adds: MobileNetV2's ten depthwise shapes took 587–732 µs in all against 702–814
/// one pixel at a time (`cargo bench -p rafter-kernels-cpu --bench cnn_layers`, builds
/// alternated, 5 rounds; the old build won one). The accesses are unchecked, bounded once
/// per row by the caller: with a slice and its bounds checks per load and store,
/// MobileNetV2 ran at 1/0.976 of this (17 of 20 alternated `rafter bench` rounds, Zen 5).
///
/// # Safety
/// The last quad's last input vector (at `x + 2·row + ((n-1)·QUAD·SW + 2 + (QUAD-1)·SW)·px`)
/// must be readable, and its last output vector (at `out + ((n-1)·QUAD + QUAD-1)·px`)
/// writable and unaliased, as its residual readable; earlier ones lie before them.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn quads_at<S: Simd, const SW: usize>(
    s: S,
    x: *const f32,
    row: usize,
    px: usize,
    out: *mut f32,
    res: Option<*const f32>,
    n: usize,
    wv: &[S::V; 9],
    t: &VecTail<S>,
    bias: S::V,
) {
    for q in 0..n {
        let xq = x.wrapping_add(q * QUAD * SW * px);
        let mut acc = [s.splat(0.0); QUAD];
        for ky in 0..3 {
            let xr = xq.wrapping_add(ky * row);
            let mut col = [s.splat(0.0); 9];
            for (k, v) in col.iter_mut().enumerate().take(3 + (QUAD - 1) * SW) {
                // SAFETY: below the last quad's last input vector (the contract).
                *v = unsafe { s.load_at(xr.wrapping_add(k * px)) };
            }
            for (j, a) in acc.iter_mut().enumerate() {
                for kx in 0..3 {
                    *a = s.fma(col[j * SW + kx], wv[ky * 3 + kx], *a);
                }
            }
        }
        for (j, &a) in acc.iter().enumerate() {
            let at = (q * QUAD + j) * px;
            // Both accesses below stay below the last quad's last output and residual vectors
            // (the contract). (A match, not `Option::map`: a closure is compiled without the
            // caller's target features, and its load would become a call.)
            #[allow(clippy::manual_map)]
            let rv = match res {
                // SAFETY: below the last quad's last residual vector (the contract).
                Some(r) => Some(unsafe { s.load_at(r.wrapping_add(at)) }),
                None => None,
            };
            // SAFETY: below the last quad's last output vector (the contract, as above).
            unsafe { s.store_at(out.wrapping_add(at), t.finish(s, a, bias, rv)) };
        }
    }
}

/// The 3×3 window at `plane[base..]` (rows `row` apart, pixels `px` apart) times `wv`.
#[inline(always)]
fn dot9<S: Simd>(s: S, plane: &[f32], base: usize, row: usize, px: usize, wv: &[S::V; 9]) -> S::V {
    let mut acc = s.mul(s.load(&plane[base..]), wv[0]);
    acc = s.fma(s.load(&plane[base + px..]), wv[1], acc);
    acc = s.fma(s.load(&plane[base + 2 * px..]), wv[2], acc);
    let b1 = base + row;
    acc = s.fma(s.load(&plane[b1..]), wv[3], acc);
    acc = s.fma(s.load(&plane[b1 + px..]), wv[4], acc);
    acc = s.fma(s.load(&plane[b1 + 2 * px..]), wv[5], acc);
    let b2 = b1 + row;
    acc = s.fma(s.load(&plane[b2..]), wv[6], acc);
    acc = s.fma(s.load(&plane[b2 + px..]), wv[7], acc);
    s.fma(s.load(&plane[b2 + 2 * px..]), wv[8], acc)
}

/// A 3×3 window that crosses the input's edge, for a whole channel vector: the taps of rows
/// `ky` and of the columns inside the input, the filter taken from the registers `wv`.
/// Through [`window`], which reloads the filter and walks general bounds, MobileNetV2's 7×7
/// depthwise layers (half their pixels on the edge) took 14.5 µs, so 13.7 (medians of 3
/// alternated `rafter bench --trace` runs).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn edge3x3<S: Simd>(
    s: S,
    wnd: &WindowNhwc<'_>,
    plane: &[f32],
    iy0: isize,
    ky: Range<usize>,
    ix0: isize,
    c0: usize,
    wv: &[S::V; 9],
) -> S::V {
    let ch = wnd.channels;
    let inside = |kx: usize| (0..wnd.w as isize).contains(&(ix0 + kx as isize));
    let cols = [inside(0), inside(1), inside(2)];
    let mut acc = s.splat(0.0);
    // Constant bounds, so that `wv` is indexed by constants and stays in registers.
    for r in 0..3 {
        if !ky.contains(&r) {
            continue;
        }
        let row = (iy0 + r as isize) as usize * wnd.w;
        for kx in 0..3 {
            if cols[kx] {
                let i = (row + (ix0 + kx as isize) as usize) * ch + c0;
                acc = s.fma(s.load(&plane[i..]), wv[r * 3 + kx], acc);
            }
        }
    }
    acc
}

/// Any window, checking each tap's column: the taps of rows `ky` at input row `iy0 + ky`
/// and columns `ix0 + kx`, channels `c0..c0 + lanes`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn window<S: Simd>(
    s: S,
    c: &DepthwiseNhwc<'_>,
    plane: &[f32],
    iy0: isize,
    ky: Range<usize>,
    ix0: isize,
    c0: usize,
    lanes: usize,
) -> S::V {
    let ch = c.window.channels;
    let kw = c.window.kernel[1];
    let kx0 = (-ix0).max(0) as usize;
    let kx1 = (c.window.w as isize - ix0).clamp(0, kw as isize) as usize;
    let mut acc = s.splat(0.0);
    for ky in ky {
        let iy = (iy0 + ky as isize) as usize;
        for kx in kx0..kx1 {
            let i = (iy * c.window.w + (ix0 + kx as isize) as usize) * ch + c0;
            let wi = (ky * kw + kx) * ch + c0;
            let (x, w) = if lanes == S::LANES {
                (s.load(&plane[i..]), s.load(&c.weights[wi..]))
            } else {
                (
                    s.load_partial(&plane[i..i + lanes], 0.0),
                    s.load_partial(&c.weights[wi..wi + lanes], 0.0),
                )
            };
            acc = s.fma(x, w, acc);
        }
    }
    acc
}

/// Max pooling of NHWC activations (no dilation): each output pixel's channel vectors are
/// the maxima of the window's input pixel vectors inside the input (padding never wins), a
/// NaN in the window giving NaN. Channels-last, so no plane is transposed around the pool
/// (ResNet's stem pool reads the stem's NHWC output in place).
#[derive(Clone, Copy, Debug)]
pub struct MaxPoolNhwc<'a> {
    /// The input and window; output channels are the input's.
    pub window: WindowNhwc<'a>,
}

/// Runs `pool` into `out` (`n x out[0] x out[1] x channels`) on the fastest ISA.
pub fn max_pool_nhwc(
    pool: &MaxPoolNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    max_pool_nhwc_with_isa(Isa::detect(), pool, out, par)
}

/// [`max_pool_nhwc`] on a given ISA.
pub fn max_pool_nhwc_with_isa(
    isa: Isa,
    pool: &MaxPoolNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let wnd = &pool.window;
    let ([oh, ow], [kh, kw], ch) = (wnd.out, wnd.kernel, wnd.channels);
    let n = wnd.images("max pool nhwc", out.len(), ch)?;
    if n == 0 {
        return Ok(());
    }
    let dst = Disjoint::new(out);
    par_blocks(par, n * oh, ow * ch * kh * kw, &|r| {
        max_pool_isa(isa, wnd, r, &dst)
    });
    Ok(())
}

simd_dispatch!(fn max_pool_isa(wnd: &WindowNhwc<'_>, rows: Range<usize>, dst: &Disjoint<'_>) => max_pool_rows);

/// Output rows `rows` (image-major) of [`max_pool_nhwc`].
#[inline(always)]
fn max_pool_rows<S: Simd>(s: S, wnd: &WindowNhwc<'_>, rows: Range<usize>, dst: &Disjoint<'_>) {
    let ch = wnd.channels;
    let cols = InnerCols::of(wnd);
    let ninf = s.splat(f32::NEG_INFINITY);
    for r in rows {
        let g = RowGeom::of(wnd, r);
        // SAFETY: tasks get disjoint row ranges, so their output rows do not overlap.
        let orow = unsafe { dst.part(r * g.len..(r + 1) * g.len) };
        let plane = &wnd.input[g.plane..g.plane + wnd.h * wnd.w * ch];
        for ox in 0..wnd.out[1] {
            let ix0 = cols.ix(ox);
            let kx0 = (-ix0).max(0) as usize;
            let kx1 = (wnd.w as isize - ix0).clamp(0, wnd.kernel[1] as isize) as usize;
            for c0 in (0..ch).step_by(S::LANES) {
                let lanes = S::LANES.min(ch - c0);
                let mut m = ninf;
                for ky in g.ky.clone() {
                    let iy = (g.iy0 + ky as isize) as usize;
                    for kx in kx0..kx1 {
                        let at = (iy * wnd.w + (ix0 + kx as isize) as usize) * ch + c0;
                        let v = if lanes == S::LANES {
                            s.load(&plane[at..])
                        } else {
                            s.load_partial(&plane[at..at + lanes], f32::NEG_INFINITY)
                        };
                        m = crate::spatial::max_nan(s, v, m);
                    }
                }
                let at = ox * ch + c0;
                if lanes == S::LANES {
                    s.store(&mut orow[at..], m);
                } else {
                    s.store_partial(&mut orow[at..at + lanes], m);
                }
            }
        }
    }
}

/// A convolution of few input channels (an RGB stem) writing NHWC activations, computed
/// directly: each output pixel's channels are accumulated in registers as input values
/// (broadcast) times weight vectors, `kh·kw·cin` of them, for a block of output-channel
/// vectors and a block of pixels sharing each weight load (on AVX-512, 4 pixels × 4
/// vectors, or 8 pixels × 2 vectors when the output has at most two vectors of channels,
/// as MobileNetV2's 32 channels are with 16 lanes). The input may be NHWC or NCHW
/// (`input_nchw`): a model's NCHW input is then read in place, with no transpose before the
/// stem. No dilation.
#[derive(Clone, Copy, Debug)]
pub struct SmallConvNhwc<'a> {
    /// The input and window (`window.input` is `n x h x w x channels`, or
    /// `n x channels x h x w` with `input_nchw`).
    pub window: WindowNhwc<'a>,
    /// The input is NCHW.
    pub input_nchw: bool,
    /// `kh x kw x cin x cout` (`conv_nhwc`'s layout).
    pub weights: &'a [f32],
    /// Output channels.
    pub cout: usize,
    /// The fused tail.
    pub tail: ChannelTail<'a>,
}

/// Output-channel vectors accumulated together by [`small_conv_nhwc`], at most.
const SMALL_VECS: usize = 4;

/// Runs `conv` into `out` (`n x out[0] x out[1] x cout`) on the fastest ISA.
pub fn small_conv_nhwc(
    conv: &SmallConvNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    small_conv_nhwc_with_isa(Isa::detect(), conv, out, par)
}

/// [`small_conv_nhwc`] on a given ISA.
pub fn small_conv_nhwc_with_isa(
    isa: Isa,
    conv: &SmallConvNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let c = conv;
    let n = check_small_conv(c, out.len())?;
    if n == 0 {
        return Ok(());
    }
    let [oh, ow] = c.window.out;
    let w = SmallWeights::new(c);
    let dst = Disjoint::new(out);
    par_blocks(par, n * oh, ow * w.wp.len(), &|r| {
        small_conv_isa(isa, c, &w.wp, w.cp, r, 0, &dst)
    });
    Ok(())
}

/// Checks `c` against an output of `out_len` elements; returns its images (0: empty).
pub(crate) fn check_small_conv(
    c: &SmallConvNhwc<'_>,
    out_len: usize,
) -> Result<usize, KernelError> {
    let [kh, kw] = c.window.kernel;
    let n = c.window.images("small conv nhwc", out_len, c.cout)?;
    if n == 0 {
        return Ok(0);
    }
    check_len(
        "small conv weights",
        c.weights.len(),
        kh * kw * c.window.channels * c.cout,
    )?;
    c.tail.check("small conv", c.cout, out_len)?;
    Ok(n)
}

/// A small convolution's weights with each tap's row of output channels padded to a whole
/// number of accumulator groups of the widest ISA (zeros), so the inner loop never masks a
/// load.
pub(crate) struct SmallWeights {
    wp: Vec<f32>,
    cp: usize,
}

impl SmallWeights {
    /// `c`'s weights padded; `c` checked by [`check_small_conv`].
    pub(crate) fn new(c: &SmallConvNhwc<'_>) -> SmallWeights {
        let [kh, kw] = c.window.kernel;
        let group = SMALL_VECS * MAX_LANES;
        let cp = c.cout.div_ceil(group) * group;
        let taps = kh * kw * c.window.channels;
        let mut wp = vec![0f32; taps * cp];
        for t in 0..taps {
            wp[t * cp..t * cp + c.cout].copy_from_slice(&c.weights[t * c.cout..(t + 1) * c.cout]);
        }
        SmallWeights { wp, cp }
    }
}

/// Output rows `rows` (image-major) of checked `c`, on the calling thread, into `out`,
/// which holds just those rows. For a caller that consumes a few rows at a time (the
/// depthwise block's first stage).
pub(crate) fn small_conv_rows_into(
    isa: Isa,
    c: &SmallConvNhwc<'_>,
    w: &SmallWeights,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let row = c.window.out[1] * c.cout;
    assert!(c.tail.residual.is_none() && out.len() == rows.len() * row);
    let base = rows.start;
    small_conv_isa(isa, c, &w.wp, w.cp, rows, base, &Disjoint::new(out));
}

simd_dispatch!(fn small_conv_isa(c: &SmallConvNhwc<'_>, wp: &[f32], cp: usize, rows: Range<usize>, base: usize, dst: &Disjoint<'_>) => small_conv_rows);

/// Output rows `rows` (image-major) of [`small_conv_nhwc`], weights `wp` padded to `cp`
/// output channels per tap, row `r` written at row `r - base` of `dst`. The accumulator block is `V` channel vectors × `P` pixels:
/// 16 accumulators on AVX-512 (of 32 registers), 12 on AVX2/NEON (of 16), each tap loading
/// `V` weight vectors and broadcasting `P` inputs for `V·P` FMAs. 24 on AVX-512 (12 × 2,
/// 6 × 4) made LLVM rotate and spill accumulators every tap; the old 2 × 4 / 4 × 2 blocks
/// with per-window-row unrolling measured the same on MobileNetV2's stem and slower on
/// ResNet-50's: `cnn_layers`' "resnet stem to NHWC" 807–847 → 688–913 µs (medians 822 →
/// 692) over 5 alternated runs on a 2-core Zen 5. The interior's last block overlapping
/// the one before (no one-at-a-time leftovers) and a constant pixel step
/// ([`small_conv_step`]) then took "stem from NCHW" 149–154 → 114–154 µs (medians 150 →
/// 124) and "resnet stem to NHWC" 754–789 → 670–804 (759 → 716) over 5 alternated runs
/// on a noisy Zen 5; 98–100 → 91–92 µs for the first on a quiet one.
#[inline(always)]
fn small_conv_rows<S: Simd>(
    s: S,
    c: &SmallConvNhwc<'_>,
    wp: &[f32],
    cp: usize,
    rows: Range<usize>,
    base: usize,
    dst: &Disjoint<'_>,
) {
    let narrow = c.cout.div_ceil(S::LANES) <= 2;
    match (S::LANES >= 16, narrow) {
        (true, true) => small_conv_step::<S, 2, 8>(s, c, wp, cp, rows, base, dst),
        (true, false) => small_conv_step::<S, 4, 4>(s, c, wp, cp, rows, base, dst),
        (false, true) => small_conv_step::<S, 2, 6>(s, c, wp, cp, rows, base, dst),
        (false, false) => small_conv_step::<S, 4, 3>(s, c, wp, cp, rows, base, dst),
    }
}

/// Input elements between a pixel's window and the next pixel's: the stride times the
/// input's pixel stride (1 from NCHW, the channels from NHWC).
fn pixel_step(c: &SmallConvNhwc<'_>) -> usize {
    let ps = if c.input_nchw { 1 } else { c.window.channels };
    c.window.stride[1] * ps
}

/// [`small_conv_block`] with the pixel step a constant when it is 2 (stride 2 from NCHW,
/// both stems' case): the block's `P` input offsets are then address immediates; held in
/// variables, LLVM spilled them and reloaded one per broadcast.
#[inline(always)]
fn small_conv_step<S: Simd, const V: usize, const P: usize>(
    s: S,
    c: &SmallConvNhwc<'_>,
    wp: &[f32],
    cp: usize,
    rows: Range<usize>,
    base: usize,
    dst: &Disjoint<'_>,
) {
    match pixel_step(c) {
        2 => small_conv_block::<S, V, P, 2>(s, c, wp, cp, rows, base, dst),
        _ => small_conv_block::<S, V, P, 0>(s, c, wp, cp, rows, base, dst),
    }
}

/// How many output rows ahead [`small_conv_block`] prefetches its input rows.
const PREFETCH_ROWS: usize = 2;

/// Prefetches the input rows that output row `oy` of image `img` reads and the row before
/// it did not: the bottom `stride` rows of its window. A network's image comes from memory
/// (or another core) on every call, where a bench's stays in L2: `cnn_layers`' MobileNetV2
/// stem took 86.8 µs warm and 112.8 cold (16 MB touched between calls).
fn prefetch_window_bottom(c: &SmallConvNhwc<'_>, img: usize, oy: usize) {
    let wnd = &c.window;
    let [sh, kh] = [wnd.stride[0], wnd.kernel[0]];
    let bottom = (oy * sh + kh) as isize - wnd.pads[0] as isize;
    let rows = (bottom - sh.min(kh) as isize).max(0) as usize..(bottom.max(0) as usize).min(wnd.h);
    let (cin, plane) = (wnd.channels, wnd.h * wnd.w * wnd.channels);
    let x = &wnd.input[img * plane..(img + 1) * plane];
    for iy in rows {
        if c.input_nchw {
            for ci in 0..cin {
                let at = ci * wnd.h * wnd.w + iy * wnd.w;
                prefetch_read(&x[at..at + wnd.w]);
            }
        } else {
            prefetch_read(&x[iy * wnd.w * cin..(iy + 1) * wnd.w * cin]);
        }
    }
}

/// One tap of a window (row `ky`, column `kx`, input channel `ci`): its input's offset from
/// the window's first element, and its weight row's offset in the padded weights.
#[derive(Clone, Copy)]
struct Tap {
    x: usize,
    w: usize,
}

/// [`small_conv_rows`] with `V` output-channel vectors times `P` pixels of accumulators.
/// Interior pixels (whole window inside the input's width) run `P` at a time over a flat
/// list of the row's taps (the window rows inside the input only), so the inner loop is
/// one loop whatever the window; the few edge pixels run one at a time. `STEP` is the
/// pixel step ([`pixel_step`]) when known at compile time, else 0.
#[inline(always)]
fn small_conv_block<S: Simd, const V: usize, const P: usize, const STEP: usize>(
    s: S,
    c: &SmallConvNhwc<'_>,
    wp: &[f32],
    cp: usize,
    rows: Range<usize>,
    base: usize,
    dst: &Disjoint<'_>,
) {
    let wnd = &c.window;
    let [oh, ow] = wnd.out;
    let [kh, kw] = wnd.kernel;
    let [sh, sw] = wnd.stride;
    let (cin, cout) = (wnd.channels, c.cout);
    // Element strides of a row, a pixel and a channel of the input.
    let (rs, ps, cs) = if c.input_nchw {
        (wnd.w, 1, wnd.h * wnd.w)
    } else {
        (wnd.w * cin, cin, 1)
    };
    let t = VecTail::new(s, &c.tail);
    let zero = s.splat(0.0);
    // Input offset of a block's next pixel from the previous.
    let step = if STEP > 0 { STEP } else { pixel_step(c) };
    // Every channel group's `V` weight vectors lie inside a tap's padded row (`cp` is a
    // whole number of the widest ISA's accumulator groups), so each tap's slice below is
    // in bounds: `tap.w + cp <= wp.len()` and `g0 + V·LANES <= cp`.
    assert!(cp.is_multiple_of(V * S::LANES) && wp.len() >= kh * kw * cin * cp);
    let ix = |ox: usize| (ox * sw) as isize - wnd.pads[1] as isize;
    // Output columns whose window lies inside the input's width: `P` at a time there.
    let inner_lo = (0..ow).find(|&ox| ix(ox) >= 0).unwrap_or(ow);
    let inner_hi = (inner_lo..ow)
        .find(|&ox| ix(ox) + kw as isize > wnd.w as isize)
        .unwrap_or(ow);
    let mut taps = Vec::with_capacity(kh * kw * cin);
    for r in rows {
        let (img, oy) = (r / oh, r % oh);
        if oy + PREFETCH_ROWS < oh {
            prefetch_window_bottom(c, img, oy + PREFETCH_ROWS);
        }
        // SAFETY: tasks get disjoint row ranges, so their output rows do not overlap.
        let orow = unsafe { dst.part((r - base) * ow * cout..(r - base + 1) * ow * cout) };
        let rrow = c
            .tail
            .residual
            .map(|res| &res[r * ow * cout..(r + 1) * ow * cout]);
        let plane = &wnd.input[img * wnd.h * wnd.w * cin..(img + 1) * wnd.h * wnd.w * cin];
        let iy0 = (oy * sh) as isize - wnd.pads[0] as isize;
        let ky0 = (-iy0).max(0) as usize;
        let ky1 = (wnd.h as isize - iy0).clamp(0, kh as isize) as usize;
        // This row's taps, offsets from the window's top-left input element (row `ky0`).
        taps.clear();
        for ky in ky0..ky1 {
            for kx in 0..kw {
                for ci in 0..cin {
                    taps.push(Tap {
                        x: (ky - ky0) * rs + ci * cs + kx * ps,
                        w: ((ky * kw + kx) * cin + ci) * cp,
                    });
                }
            }
        }
        let row0 = (iy0 + ky0 as isize) as usize * rs;
        let mut ox = 0;
        while ox < ow {
            // The interior's last `P` pixels when fewer than `P` are left: the block then
            // overlaps the one before and recomputes (rewrites the same values of) a few
            // pixels, instead of running the rest one at a time on the edge path (7 of
            // MobileNetV2's 112 columns did, a third of its stem's time).
            if ox >= inner_lo && ox < inner_hi && ox + P > inner_hi && inner_hi - inner_lo >= P {
                ox = inner_hi - P;
            }
            let block = ox >= inner_lo && ox + P <= inner_hi;
            for g0 in (0..cout).step_by(V * S::LANES) {
                let mut acc = [[zero; V]; P];
                if block {
                    let x0 = row0 + ix(ox) as usize * ps;
                    // The block's last tap of its last pixel is inside the plane, so every
                    // offset below is (taps ascend in `x`; interior windows stay in-row).
                    assert!(x0 + taps.last().map_or(0, |t| t.x) + (P - 1) * step < plane.len());
                    for tap in &taps {
                        // SAFETY: `tap.w + g0 + V·LANES <= wp.len()` by the assertion
                        // above (`tap.w` is a tap row's start, at most `(taps - 1)·cp`).
                        let wt = unsafe { wp.get_unchecked(tap.w + g0..tap.w + g0 + V * S::LANES) };
                        let mut wv = [zero; V];
                        for (j, v) in wv.iter_mut().enumerate() {
                            *v = s.load(&wt[j * S::LANES..]);
                        }
                        let xk = x0 + tap.x;
                        for (p, pacc) in acc.iter_mut().enumerate() {
                            // SAFETY: `xk + p·step` is at most the asserted last offset.
                            let xv = s.splat(unsafe { *plane.get_unchecked(xk + p * step) });
                            for (a, &w) in pacc.iter_mut().zip(&wv) {
                                *a = s.fma(xv, w, *a);
                            }
                        }
                    }
                } else {
                    let ix0 = ix(ox);
                    let kx0 = (-ix0).max(0) as usize;
                    let kx1 = (wnd.w as isize - ix0).clamp(0, kw as isize) as usize;
                    for ky in ky0..ky1 {
                        let iy = (iy0 + ky as isize) as usize;
                        for kx in kx0..kx1 {
                            let at = iy * rs + (ix0 + kx as isize) as usize * ps;
                            for ci in 0..cin {
                                let xv = s.splat(plane[at + ci * cs]);
                                let wt = &wp[((ky * kw + kx) * cin + ci) * cp + g0..];
                                for (j, a) in acc[0].iter_mut().enumerate() {
                                    *a = s.fma(xv, s.load(&wt[j * S::LANES..]), *a);
                                }
                            }
                        }
                    }
                }
                let pixels = if block { P } else { 1 };
                for (p, pacc) in acc.iter().take(pixels).enumerate() {
                    for (j, &a) in pacc.iter().enumerate() {
                        let c0 = g0 + j * S::LANES;
                        if c0 >= cout {
                            break;
                        }
                        let lanes = S::LANES.min(cout - c0);
                        let bias = t.bias(s, c.tail.bias, c0, lanes);
                        let at = (ox + p) * cout + c0;
                        t.store(s, a, bias, rrow.map(|rr| &rr[at..]), &mut orow[at..], lanes);
                    }
                }
            }
            ox += if block { P } else { 1 };
        }
    }
}

/// The GEMM operand of a k×k convolution over one NHWC image: for each output pixel of
/// rows `oy` (row-major over `oy × out[1]`), the row `[kh][kw][channels]` of the input
/// values under its window, zero where the window leaves the input (`cols` holds
/// `oy.len() · out[1]` such rows of `kh·kw·channels`). No dilation.
#[allow(clippy::too_many_arguments)]
pub fn im2col_nhwc(
    x: &[f32],
    [h, w, ch]: [usize; 3],
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [usize; 2],
    out: [usize; 2],
    oy: Range<usize>,
    cols: &mut [f32],
) -> Result<(), KernelError> {
    let [kh, kw] = kernel;
    let k = kh * kw * ch;
    let ow = out[1];
    check_len("im2col input", x.len(), h * w * ch)?;
    check_len("im2col columns", cols.len(), oy.len() * ow * k)?;
    if oy.end > out[0] {
        return Err(KernelError::Shape {
            what: "im2col nhwc".into(),
            detail: format!("rows {oy:?} of an output {} tall", out[0]),
        });
    }
    if k == 0 {
        return Ok(());
    }
    let oy0 = oy.start;
    for (row, dst) in cols.chunks_exact_mut(k).enumerate() {
        let (y, xo) = (oy0 + row / ow, row % ow);
        let iy0 = (y * stride[0]) as isize - pads[0] as isize;
        let ix0 = (xo * stride[1]) as isize - pads[1] as isize;
        for ky in 0..kh {
            let iy = iy0 + ky as isize;
            let drow = &mut dst[ky * kw * ch..(ky + 1) * kw * ch];
            if iy < 0 || iy >= h as isize {
                drow.fill(0.0);
                continue;
            }
            let kx0 = (-ix0).clamp(0, kw as isize) as usize;
            let kx1 = (w as isize - ix0).clamp(kx0 as isize, kw as isize) as usize;
            drow[..kx0 * ch].fill(0.0);
            drow[kx1 * ch..].fill(0.0);
            if kx1 > kx0 {
                let src = (iy as usize * w + (ix0 + kx0 as isize) as usize) * ch;
                drow[kx0 * ch..kx1 * ch].copy_from_slice(&x[src..src + (kx1 - kx0) * ch]);
            }
        }
    }
    Ok(())
}

/// Columns `cols` of [`im2col_nhwc`]'s rows: for each output pixel of rows `oy`, the part
/// `cols` of its row `[kh][kw][channels]` (`cols` holds `oy.len() · out[1]` rows of
/// `cols.len()` floats). A K split's task builds only its own part of the columns with it
/// (`sgemm_fill_a`), so no copy is shared between threads.
#[allow(clippy::too_many_arguments)]
pub fn im2col_nhwc_cols(
    x: &[f32],
    [h, w, ch]: [usize; 3],
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [usize; 2],
    out: [usize; 2],
    oy: Range<usize>,
    cols: Range<usize>,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    let [kh, kw] = kernel;
    let k = kh * kw * ch;
    let ow = out[1];
    let width = cols.end.saturating_sub(cols.start);
    check_len("im2col input", x.len(), h * w * ch)?;
    check_len("im2col columns", dst.len(), oy.len() * ow * width)?;
    if oy.end > out[0] || cols.end > k || cols.start > cols.end {
        return Err(KernelError::Shape {
            what: "im2col nhwc".into(),
            detail: format!(
                "rows {oy:?} of an output {} tall, columns {cols:?} of {k}",
                out[0]
            ),
        });
    }
    if width == 0 {
        return Ok(());
    }
    for (row, d) in dst.chunks_exact_mut(width).enumerate() {
        let (y, xo) = (oy.start + row / ow, row % ow);
        let iy0 = (y * stride[0]) as isize - pads[0] as isize;
        let ix0 = (xo * stride[1]) as isize - pads[1] as isize;
        let mut at = cols.start;
        while at < cols.end {
            // The tap (ky, kx) holding column `at`, and the part of its channels wanted.
            let tap = at / ch;
            let end = ((tap + 1) * ch).min(cols.end);
            let (ky, kx) = (tap / kw, tap % kw);
            let (iy, ix) = (iy0 + ky as isize, ix0 + kx as isize);
            let seg = &mut d[at - cols.start..end - cols.start];
            if iy < 0 || iy >= h as isize || ix < 0 || ix >= w as isize {
                seg.fill(0.0);
            } else {
                let src = (iy as usize * w + ix as usize) * ch + at - tap * ch;
                seg.copy_from_slice(&x[src..src + (end - at)]);
            }
            at = end;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::winograd::tests::data;
    use crate::{ScopedThreads, Sequential};

    /// Direct NHWC depthwise convolution in f64, with the tail.
    fn direct(c: &DepthwiseNhwc<'_>, n: usize) -> Vec<f32> {
        let (ch, [oh, ow], [kh, kw]) = (c.window.channels, c.window.out, c.window.kernel);
        let mut y = vec![0f32; n * oh * ow * ch];
        for img in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for k in 0..ch {
                        let mut acc = 0f64;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * c.window.stride[0] + ky) as isize
                                    - c.window.pads[0] as isize;
                                let ix = (ox * c.window.stride[1] + kx) as isize
                                    - c.window.pads[1] as isize;
                                if iy < 0
                                    || ix < 0
                                    || iy >= c.window.h as isize
                                    || ix >= c.window.w as isize
                                {
                                    continue;
                                }
                                let xi = ((img * c.window.h + iy as usize) * c.window.w
                                    + ix as usize)
                                    * ch
                                    + k;
                                acc += c.window.input[xi] as f64
                                    * c.weights[(ky * kw + kx) * ch + k] as f64;
                            }
                        }
                        let i = ((img * oh + oy) * ow + ox) * ch + k;
                        y[i] = c.tail.reference(acc, k, i) as f32;
                    }
                }
            }
        }
        y
    }

    #[allow(clippy::too_many_arguments)]
    fn case(
        n: usize,
        h: usize,
        w: usize,
        ch: usize,
        k: usize,
        s: usize,
        p: [usize; 4],
        tail: bool,
    ) {
        let out = [(h + p[0] + p[2] - k) / s + 1, (w + p[1] + p[3] - k) / s + 1];
        let x = data(n * h * w * ch, 1);
        let wt = data(k * k * ch, 2);
        let bias = data(ch, 3);
        let res = data(n * out[0] * out[1] * ch, 4);
        let conv = DepthwiseNhwc {
            window: WindowNhwc {
                input: &x,
                h,
                w,
                channels: ch,
                kernel: [k, k],
                stride: [s, s],
                pads: [p[0], p[1]],
                out,
            },
            weights: &wt,
            tail: ChannelTail {
                alpha: if tail { 0.5 } else { 1.0 },
                bias: tail.then_some(&bias[..]),
                residual: tail.then_some(&res[..]),
                res_before: !tail || ch.is_multiple_of(2),
                relu: tail,
                clamp: tail.then_some((0.0, 1.5)),
            },
        };
        let want = direct(&conv, n);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
            if !isa.is_available() {
                continue;
            }
            let mut y = vec![f32::NAN; want.len()];
            depthwise_nhwc_with_isa(isa, &conv, &mut y, &ScopedThreads::new(3)).unwrap();
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{isa:?} n{n} {h}x{w}x{ch} k{k} s{s} {p:?} tail {tail}: [{i}] {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn depthwise_matches_direct_convolution() {
        // MobileNet's 3×3 (stride 1 and 2, pad 1), channel counts with and without a
        // partial vector, maps narrower than the window, 5×5 and uneven padding.
        case(1, 7, 7, 32, 3, 1, [1; 4], true);
        case(2, 9, 8, 19, 3, 2, [1; 4], true);
        case(1, 14, 13, 40, 3, 2, [0, 1, 1, 0], false);
        case(1, 2, 1, 17, 3, 1, [1; 4], true);
        case(1, 11, 12, 24, 5, 1, [2; 4], true);
        case(1, 6, 6, 3, 3, 1, [0; 4], false);
        // Rows wide enough for several four-pixel blocks, with leftover pixels and (on the
        // wider ISAs) a partial channel vector beside the whole ones.
        case(1, 10, 23, 40, 3, 1, [1; 4], true);
        case(2, 12, 21, 48, 3, 2, [1; 4], false);
        case(1, 9, 30, 72, 3, 2, [0, 0, 1, 1], true);
        // Few rows and many channels, split by channels over the 3 threads: whole vectors,
        // a partial last vector, two images, and a stride-2 map from 14 to 7 rows.
        case(1, 7, 7, 160, 3, 1, [1; 4], true);
        case(2, 5, 6, 100, 3, 1, [1; 4], false);
        case(1, 14, 14, 104, 3, 2, [0, 0, 1, 1], true);
    }

    #[test]
    fn depthwise_bad_sizes_are_errors() {
        let x = data(4 * 4 * 8, 1);
        let w = data(9 * 8, 2);
        let conv = DepthwiseNhwc {
            window: WindowNhwc {
                input: &x,
                h: 4,
                w: 4,
                channels: 8,
                kernel: [3, 3],
                stride: [1, 1],
                pads: [1, 1],
                out: [4, 4],
            },
            weights: &w[..70],
            tail: ChannelTail::default(),
        };
        let mut y = vec![0f32; 4 * 4 * 8];
        let e = depthwise_nhwc(&conv, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("depthwise weights"), "{e}");
        let e = depthwise_nhwc(
            &DepthwiseNhwc {
                weights: &w,
                ..conv
            },
            &mut y[..100],
            &Sequential,
        )
        .unwrap_err();
        assert!(e.to_string().contains("output elements"), "{e}");
        let ok = DepthwiseNhwc {
            weights: &w,
            ..conv
        };
        let short = DepthwiseNhwc {
            window: WindowNhwc {
                input: &x[..100],
                ..conv.window
            },
            ..ok
        };
        let e = depthwise_nhwc(&short, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("input"), "{e}");
        let zero = DepthwiseNhwc {
            window: WindowNhwc {
                stride: [0, 1],
                ..conv.window
            },
            ..ok
        };
        let e = depthwise_nhwc(&zero, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("strides"), "{e}");
        let bias = [0f32; 7];
        let bad_bias = DepthwiseNhwc {
            tail: ChannelTail {
                bias: Some(&bias),
                ..ChannelTail::default()
            },
            ..ok
        };
        let e = depthwise_nhwc(&bad_bias, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("bias"), "{e}");
    }

    #[test]
    fn max_pool_matches_direct_loops() {
        // (n, h, w, channels, k, stride, pads, out): ResNet's 3×3 stride-2 pad-1 pool,
        // partial channel vectors, a window that reaches past the input (ceil mode), and
        // a NaN that must win its windows.
        for &(n, h, w, ch, k, s, p, out, nan) in &[
            (
                1usize,
                12usize,
                14usize,
                64usize,
                3usize,
                2usize,
                1usize,
                [6usize, 7usize],
                false,
            ),
            (2, 7, 5, 19, 3, 1, 1, [7, 5], true),
            (1, 9, 9, 40, 2, 2, 0, [5, 5], false),
        ] {
            let mut x = data(n * h * w * ch, 21);
            if nan {
                x[(2 * w + 3) * ch + 5] = f32::NAN;
            }
            let pool = MaxPoolNhwc {
                window: WindowNhwc {
                    input: &x,
                    h,
                    w,
                    channels: ch,
                    kernel: [k, k],
                    stride: [s, s],
                    pads: [p, p],
                    out,
                },
            };
            let mut want = vec![f32::NEG_INFINITY; n * out[0] * out[1] * ch];
            for img in 0..n {
                for oy in 0..out[0] {
                    for ox in 0..out[1] {
                        for c in 0..ch {
                            let o = &mut want[((img * out[0] + oy) * out[1] + ox) * ch + c];
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (iy, ix) = (
                                        (oy * s + ky) as isize - p as isize,
                                        (ox * s + kx) as isize - p as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let v = x[((img * h + iy as usize) * w + ix as usize) * ch + c];
                                    if v.is_nan() || v > *o {
                                        *o = if o.is_nan() { *o } else { v };
                                    }
                                }
                            }
                        }
                    }
                }
            }
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
                if !isa.is_available() {
                    continue;
                }
                let mut y = vec![0f32; want.len()];
                max_pool_nhwc_with_isa(isa, &pool, &mut y, &ScopedThreads::new(3)).unwrap();
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        a == b || (a.is_nan() && b.is_nan()),
                        "{isa:?} {n}x{h}x{w}x{ch} k{k} s{s}: element {i}: {a} vs {b}"
                    );
                }
                if nan {
                    assert!(y.iter().any(|v| v.is_nan()), "{isa:?}: the NaN was lost");
                }
            }
            let mut short = vec![0f32; want.len() - 1];
            let e = max_pool_nhwc(&pool, &mut short, &Sequential).unwrap_err();
            assert!(e.to_string().contains("max pool nhwc"), "{e}");
        }
    }

    #[test]
    fn small_conv_matches_im2col_and_a_direct_sum() {
        // (n, h, w, cin, cout, k, stride, pads): MobileNet's stem shape, channel counts
        // that leave partial vectors and partial accumulator groups, uneven padding.
        for &(n, h, w, cin, cout, k, s, p) in &[
            (
                1usize,
                9usize,
                9usize,
                3usize,
                32usize,
                3usize,
                2usize,
                [1usize, 1],
            ),
            (2, 7, 6, 1, 5, 3, 1, [1, 0]),
            (1, 11, 10, 4, 40, 5, 2, [2, 1]),
            (1, 5, 5, 2, 17, 1, 1, [0, 0]),
            // Wide rows: several pixel blocks per row, and leftovers.
            (2, 8, 29, 3, 32, 3, 2, [1, 1]),
            (1, 6, 23, 3, 24, 3, 1, [1, 1]),
            // ResNet's 7×7 stride-2 stem shape (wide accumulator blocks), and more output
            // channels than a block holds, the last group partial.
            (1, 16, 40, 3, 64, 7, 2, [3, 3]),
            (1, 9, 37, 3, 70, 7, 2, [3, 3]),
        ] {
            let out = [(h + 2 * p[0] - k) / s + 1, (w + 2 * p[1] - k) / s + 1];
            let x = data(n * h * w * cin, 11);
            let wt = data(k * k * cin * cout, 12);
            let bias = data(cout, 13);
            let res = data(n * out[0] * out[1] * cout, 14);
            let mut conv = SmallConvNhwc {
                window: WindowNhwc {
                    input: &x,
                    h,
                    w,
                    channels: cin,
                    kernel: [k, k],
                    stride: [s, s],
                    pads: p,
                    out,
                },
                input_nchw: false,
                weights: &wt,
                cout,
                tail: ChannelTail {
                    alpha: 0.5,
                    bias: Some(&bias),
                    residual: Some(&res),
                    res_before: cout.is_multiple_of(2),
                    relu: true,
                    clamp: Some((0.0, 1.0)),
                },
            };
            // Independent reference: f64 sums over the im2col rows.
            let kk = k * k * cin;
            let mut want = vec![0f32; res.len()];
            for img in 0..n {
                let mut cols = vec![0f32; out[0] * out[1] * kk];
                let xi = &x[img * h * w * cin..(img + 1) * h * w * cin];
                im2col_nhwc(
                    xi,
                    [h, w, cin],
                    [k, k],
                    [s, s],
                    p,
                    out,
                    0..out[0],
                    &mut cols,
                )
                .unwrap();
                for px in 0..out[0] * out[1] {
                    for co in 0..cout {
                        let acc: f64 = (0..kk)
                            .map(|t| cols[px * kk + t] as f64 * wt[t * cout + co] as f64)
                            .sum();
                        let i = (img * out[0] * out[1] + px) * cout + co;
                        let mut v = 0.5 * acc + bias[co] as f64;
                        if conv.tail.res_before {
                            v += res[i] as f64;
                        }
                        v = v.max(0.0);
                        if !conv.tail.res_before {
                            v += res[i] as f64;
                        }
                        want[i] = v.clamp(0.0, 1.0) as f32;
                    }
                }
            }
            // The same input as NCHW, read in place with `input_nchw`.
            let mut x_nchw = vec![0f32; x.len()];
            for img in 0..n {
                for pix in 0..h * w {
                    for ci in 0..cin {
                        x_nchw[(img * cin + ci) * h * w + pix] = x[(img * h * w + pix) * cin + ci];
                    }
                }
            }
            for nchw in [false, true] {
                if nchw {
                    conv.window.input = &x_nchw;
                    conv.input_nchw = true;
                }
                for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
                    if !isa.is_available() {
                        continue;
                    }
                    let mut y = vec![f32::NAN; want.len()];
                    small_conv_nhwc_with_isa(isa, &conv, &mut y, &ScopedThreads::new(3)).unwrap();
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "{isa:?} nchw {nchw} {h}x{w}x{cin}->{cout} k{k} s{s}: [{i}] {a} vs {b}"
                        );
                    }
                }
            }
            let mut y = vec![0f32; want.len() - 1];
            assert!(small_conv_nhwc(&conv, &mut y, &Sequential).is_err());
        }
    }

    #[test]
    fn im2col_rows_are_the_windows() {
        let (h, w, ch) = (5, 4, 3);
        let x = data(h * w * ch, 7);
        let (k, s, p) = ([3, 2], [2, 1], [1, 0]);
        let out = [3, 3];
        let mut cols = vec![f32::NAN; 2 * out[1] * k[0] * k[1] * ch];
        im2col_nhwc(&x, [h, w, ch], k, s, p, out, 1..3, &mut cols).unwrap();
        let kk = k[0] * k[1] * ch;
        for row in 0..2 * out[1] {
            let (oy, ox) = (1 + row / out[1], row % out[1]);
            for ky in 0..k[0] {
                for kx in 0..k[1] {
                    for c in 0..ch {
                        let iy = (oy * s[0] + ky) as isize - p[0] as isize;
                        let ix = (ox * s[1] + kx) as isize - p[1] as isize;
                        let want = if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            0.0
                        } else {
                            x[(iy as usize * w + ix as usize) * ch + c]
                        };
                        assert_eq!(cols[row * kk + (ky * k[1] + kx) * ch + c], want);
                    }
                }
            }
        }
        let e = im2col_nhwc(&x, [h, w, ch], k, s, p, out, 2..4, &mut cols).unwrap_err();
        assert!(e.to_string().contains("rows"), "{e}");
    }

    /// Any range of columns of the im2col is that slice of each of `im2col_nhwc`'s rows
    /// (itself checked against the windows above): ranges inside a tap, across taps and
    /// padding, the whole row, empty; strided and padded windows. Bad ranges are errors.
    #[test]
    fn im2col_columns_are_slices_of_the_rows() {
        let (h, w, ch) = (7, 6, 5);
        let x = data(h * w * ch, 11);
        for (k, s, p, out) in [
            ([3, 3], [1, 1], [1, 1], [7, 6]),
            ([3, 2], [2, 1], [1, 0], [4, 5]),
            ([1, 3], [2, 2], [0, 1], [4, 3]),
        ] {
            let kk = k[0] * k[1] * ch;
            let rows = out[0] * out[1];
            let mut full = vec![f32::NAN; rows * kk];
            im2col_nhwc(&x, [h, w, ch], k, s, p, out, 0..out[0], &mut full).unwrap();
            for cols in [0..kk, 0..1, 3..4, 2..13, 4..kk - 1, kk - 6..kk, 7..7, 1..kk] {
                for oy in [0..out[0], 1..3] {
                    let n = oy.len() * out[1];
                    let mut part = vec![f32::NAN; n * cols.len()];
                    im2col_nhwc_cols(
                        &x,
                        [h, w, ch],
                        k,
                        s,
                        p,
                        out,
                        oy.clone(),
                        cols.clone(),
                        &mut part,
                    )
                    .unwrap();
                    for r in 0..n {
                        let row = oy.start * out[1] + r;
                        assert_eq!(
                            &part[r * cols.len()..(r + 1) * cols.len()],
                            &full[row * kk + cols.start..row * kk + cols.end],
                            "window {k:?} stride {s:?} pads {p:?}, columns {cols:?}, row {row}"
                        );
                    }
                }
            }
            let mut part = vec![0f32; out[1] * 4];
            let bad = im2col_nhwc_cols(
                &x,
                [h, w, ch],
                k,
                s,
                p,
                out,
                0..1,
                kk - 2..kk + 2,
                &mut part,
            );
            assert!(bad.unwrap_err().to_string().contains("columns"));
            let short = im2col_nhwc_cols(&x, [h, w, ch], k, s, p, out, 0..1, 0..5, &mut part);
            assert!(short.is_err());
            #[allow(clippy::reversed_empty_ranges)]
            let reversed = im2col_nhwc_cols(&x, [h, w, ch], k, s, p, out, 0..1, 5..1, &mut part);
            assert!(reversed.is_err());
        }
    }
}
