//! A channels-last block of 1×1 and depthwise convolutions run band by band: MobileNet's
//! inverted residual, `expand 1×1 → depthwise k×k → project 1×1 (+ skip)`, or either half.
//!
//! Run one layer at a time, the block writes its widest tensor, the expansion (6× the
//! input's channels: 4.8 MB at MobileNetV2's 112×112×96), to memory and reads it back.
//! Here each thread walks its share of output rows in bands of a few rows: it expands just
//! the input rows the band's depthwise windows cover into a scratch buffer that stays in its
//! L2, runs the depthwise convolution over that buffer into a second one, and projects those
//! rows into the output. Expanded rows shared by consecutive bands (`kh - stride` of them) are kept,
//! not recomputed; only the first band of a thread's share recomputes its halo.
//!
//! Each stage is the crate's own kernel on a band: [`crate::sgemm_with_isa`] for the 1×1
//! stages (the activations are A as they are; the weight is B, pre-packed or not) and
//! [`crate::depthwise_nhwc_with_isa`] on a window whose input is the band's rows, both on
//! the calling thread.
//!
//! Measured (`cargo bench -p rafter-kernels-cpu --bench block_nhwc`, 2 threads, against the
//! three stages run separately, alternated): on a Zen 4 with a 32 MiB L3, which keeps the
//! expansion off DRAM either way, 709 → 581 µs on MobileNetV2's 112×112 block and
//! 0.99–1.10× on the others, 2369 → 2224 µs for all eight.
//!
//! The first stage may instead be a network's stem ([`BlockNhwc::stem`], a
//! `small_conv_nhwc` run a band of rows at a time), so the stem's output map never goes to
//! memory either. Fused so, MobileNetV2's stem and first block ran as fast as the two
//! kernels one after another (30 alternated `rafter bench` rounds, ratio 1.002) while the
//! activation arena fell from 2.41 to 1.10 MB: the stem's 1.6 MB map no longer needs one.
//!
//! A block of fewer than [`BAND_MIN_ROWS`] output rows (MobileNetV2's 7×7 blocks) runs
//! stage by stage over the whole map instead ([`whole_map`]): split into bands between two
//! threads, such a map recomputes too much of its expansion.

use std::cell::RefCell;
use std::sync::Mutex;

use crate::buffer::{with_pair, Aligned, ScratchPair};
use crate::common::{check_isa, check_len, ChannelTail, KernelError};
use crate::nhwc::{
    check_small_conv, depthwise_nhwc_with_isa, small_conv_rows_into, DepthwiseNhwc, SmallConvNhwc,
    SmallWeights, WindowNhwc,
};
use crate::{
    sgemm_with_isa, BRef, Epilogue, Isa, MatMut, MatRef, PackedB, Parallel, Residual, Sequential,
};

/// A 1×1, stride-1, unpadded convolution: `y[pixel] = alpha · x[pixel] · B`, then the
/// epilogue (bias, activation, clamp; a residual is the block's, not the stage's).
#[derive(Clone, Copy, Debug)]
pub struct Pointwise<'a> {
    /// `[in channels, out channels]`, row-major or pre-packed.
    pub weights: BRef<'a>,
    /// Scale of the product.
    pub alpha: f32,
    /// Bias, activation and clamp of the stage's result.
    pub epilogue: Epilogue<'a>,
}

/// The depthwise stage: window and filter (`[kh, kw, channels]`) and its tail (no residual).
#[derive(Clone, Copy, Debug)]
pub struct DepthwiseStage<'a> {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub stride: [usize; 2],
    /// Leading padding (top, left); trailing padding is whatever `out` implies.
    pub pads: [usize; 2],
    /// Output height and width.
    pub out: [usize; 2],
    /// `[kh, kw, channels]`.
    pub weights: &'a [f32],
    /// Bias, activation and clamp of the stage's result.
    pub tail: ChannelTail<'a>,
}

impl<'a> DepthwiseStage<'a> {
    /// The stage as a depthwise convolution over `input` (`h x w x channels` an image), with
    /// leading padding `pads` and output `out`: a band's rows, or the whole map.
    fn over(
        &self,
        input: &'a [f32],
        [h, w, channels]: [usize; 3],
        pads: [usize; 2],
        out: [usize; 2],
    ) -> DepthwiseNhwc<'a> {
        DepthwiseNhwc {
            window: WindowNhwc {
                input,
                h,
                w,
                channels,
                kernel: self.kernel,
                stride: self.stride,
                pads,
                out,
            },
            weights: self.weights,
            tail: self.tail,
        }
    }
}

/// `[expand] → depthwise → [project] (+ residual)` over an NHWC input, or over a network's
/// stem: `stem conv → depthwise → [project]`.
#[derive(Clone, Copy, Debug)]
pub struct BlockNhwc<'a> {
    /// `n x h x w x channels`; empty with a `stem`.
    pub input: &'a [f32],
    /// A small convolution (`small_conv_nhwc`: an image's few channels, MobileNet's 3×3
    /// stride-2 stem) whose output, `n x h x w x channels`, is the block's input, computed a
    /// band at a time like an expansion: its map (1.6 MB at MobileNetV2's 112×112×32)
    /// never goes to memory. No residual; excludes `expand`.
    pub stem: Option<SmallConvNhwc<'a>>,
    /// Images.
    pub n: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub channels: usize,
    /// The 1×1 expansion before the depthwise stage, if any.
    pub expand: Option<Pointwise<'a>>,
    /// The depthwise stage, over the expansion's channels (or the input's).
    pub depthwise: DepthwiseStage<'a>,
    /// The 1×1 projection after it, if any (a block has at least one 1×1 stage).
    pub project: Option<Pointwise<'a>>,
    /// Of the output's shape, added by the last stage (a 1×1 projection): before its
    /// activation when the flag is set, else after it (before the clamp).
    pub residual: Option<(&'a [f32], bool)>,
}

/// Expanded rows a band aims to keep in scratch, in bytes: with the depthwise output and
/// the input rows, a band's working set stays well inside a 1 MiB L2.
const BAND_BYTES: usize = 192 * 1024;

thread_local! {
    /// Per-thread scratch: the band's expanded rows and its depthwise output, 64-byte
    /// aligned. Every stage reads and writes them a channel vector (one 64-byte line) at a
    /// time; from a `Vec<f32>` (malloc's 16-byte alignment) every such access split two
    /// lines. Aligned, MobileNetV2 ran at B/A 0.956 (faster in 17 of 20 alternated
    /// `rafter bench` rounds of 100 calls, Zen 5).
    static SCRATCH: ScratchPair = RefCell::new((Aligned::new(0, 0), Aligned::new(0, 0)));
}

/// Runs `block` into `out` (`n x oh x ow x out channels`) on the fastest ISA.
pub fn block_nhwc(
    block: &BlockNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    block_nhwc_with_isa(Isa::detect(), block, out, par)
}

/// The channel counts of a checked block: the depthwise stage's and the output's.
struct Channels {
    mid: usize,
    out: usize,
}

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        what: "block nhwc".into(),
        detail,
    }
}

/// Checks every operand against the block's shapes, so that no band can fail.
fn check(b: &BlockNhwc<'_>, out_len: usize) -> Result<Channels, KernelError> {
    let d = &b.depthwise;
    if d.kernel.contains(&0) || d.stride.contains(&0) || d.out.contains(&0) {
        return Err(shape_err(format!(
            "depthwise window {:?}, strides {:?}, output {:?} (all must be positive)",
            d.kernel, d.stride, d.out
        )));
    }
    if b.expand.is_none() && b.project.is_none() && b.stem.is_none() {
        return Err(shape_err("no 1x1 stage: run depthwise_nhwc instead".into()));
    }
    let input_len = b.n * b.h * b.w * b.channels;
    match &b.stem {
        None => check_len("block nhwc input", b.input.len(), input_len)?,
        Some(st) => {
            if b.expand.is_some() || !b.input.is_empty() {
                return Err(shape_err(
                    "a stem block takes no expansion and no input of its own".into(),
                ));
            }
            if st.tail.residual.is_some() || st.window.out != [b.h, b.w] || st.cout != b.channels {
                return Err(shape_err(format!(
                    "the stem makes {:?}x{} (residual: {}) for a {}x{}x{} block input",
                    st.window.out,
                    st.cout,
                    st.tail.residual.is_some(),
                    b.h,
                    b.w,
                    b.channels
                )));
            }
            if check_small_conv(st, input_len)? != b.n {
                return Err(shape_err(format!("the stem's input is not {} images", b.n)));
            }
        }
    }
    let mid = match &b.expand {
        Some(e) => {
            if e.weights.rows() != b.channels {
                return Err(shape_err(format!(
                    "expansion weight has {} rows for {} input channels",
                    e.weights.rows(),
                    b.channels
                )));
            }
            check_epilogue("expansion", e, e.weights.cols())?;
            e.weights.cols()
        }
        None => b.channels,
    };
    check_len(
        "block nhwc depthwise weights",
        d.weights.len(),
        d.kernel[0] * d.kernel[1] * mid,
    )?;
    if d.tail.residual.is_some() {
        return Err(shape_err("the depthwise stage takes no residual".into()));
    }
    d.tail.check("block nhwc depthwise", mid, 0)?;
    let cout = match &b.project {
        Some(p) => {
            if p.weights.rows() != mid {
                return Err(shape_err(format!(
                    "projection weight has {} rows for {mid} channels",
                    p.weights.rows()
                )));
            }
            check_epilogue("projection", p, p.weights.cols())?;
            p.weights.cols()
        }
        None => mid,
    };
    let expected = b.n * d.out[0] * d.out[1] * cout;
    check_len("block nhwc output", out_len, expected)?;
    if let Some((r, _)) = b.residual {
        if b.project.is_none() {
            return Err(shape_err("a residual needs a projection to add it".into()));
        }
        check_len("block nhwc residual", r.len(), expected)?;
    }
    Ok(Channels { mid, out: cout })
}

fn check_epilogue(what: &str, p: &Pointwise<'_>, cols: usize) -> Result<(), KernelError> {
    if p.epilogue.residual.is_some() || p.epilogue.row_bias.is_some() {
        return Err(shape_err(format!(
            "the {what}'s epilogue takes no residual or row bias"
        )));
    }
    if let Some(bias) = p.epilogue.bias {
        check_len(&format!("block nhwc {what} bias"), bias.len(), cols)?;
    }
    Ok(())
}

/// [`block_nhwc`] on a given ISA.
pub fn block_nhwc_with_isa(
    isa: Isa,
    block: &BlockNhwc<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let ch = check(block, out.len())?;
    if out.is_empty() {
        return Ok(());
    }
    // Stage weights not packed ahead of time (a caller's raw weights; the compiler now
    // pre-packs every 1×1 weight of a block) are packed once here: handed to every band's
    // GEMM as they were, they were packed again for every band (`pack_b` was 3.3% of
    // MobileNetV2's samples under `perf` on a Zen 5, when its projections came raw).
    let packed = |p: &Option<Pointwise<'_>>| match p.map(|p| p.weights) {
        Some(BRef::Mat(m)) => Some(PackedB::pack_mat(m)),
        _ => None,
    };
    let (expand_packed, project_packed) = (packed(&block.expand), packed(&block.project));
    let stem_weights = block.stem.as_ref().map(SmallWeights::new);
    let mut block = *block;
    for (stage, pk) in [
        (&mut block.expand, &expand_packed),
        (&mut block.project, &project_packed),
    ] {
        if let (Some(st), Some(pk)) = (stage.as_mut(), pk) {
            st.weights = BRef::Packed(pk.view());
        }
    }
    let block = &block;
    let oh = block.depthwise.out[0];
    if oh < BAND_MIN_ROWS && block.stem.is_none() {
        return whole_map(isa, block, &ch, out, par);
    }
    // Each image's rows in one contiguous share per thread (a share's bands reuse their
    // overlapping expanded rows; only its first band recomputes a halo). Four shares per
    // thread, for stealing, made MobileNetV2 slower: 2.48–2.56 → 2.72–2.81 ms (4
    // alternated `rafter bench` runs, Zen 5).
    let parts = par.threads().clamp(1, oh);
    let tasks = block.n * parts;
    let row_len = block.depthwise.out[1] * ch.out;
    let mut shares: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(tasks);
    let mut rest = out;
    for t in 0..tasks {
        let rows = share(oh, parts, t % parts);
        let (part, tail) = rest.split_at_mut(rows.len() * row_len);
        shares.push(Mutex::new(part));
        rest = tail;
    }
    let err = Mutex::new(None);
    par.run(tasks, &|t| {
        let mut dst = shares[t].lock().unwrap_or_else(|p| p.into_inner());
        let rows = share(oh, parts, t % parts);
        let r = with_pair(&SCRATCH, |s| {
            let stem = block.stem.as_ref().zip(stem_weights.as_ref());
            run_share(isa, block, stem, &ch, t / parts, rows.clone(), &mut dst, s)
        });
        if let Err(e) = r {
            err.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Blocks of fewer output rows run [`whole_map`], not band by band. Split between two
/// threads, a 7×7 map's bands recompute a third of its expansion and both threads read every
/// weight: MobileNetV2's four 7×7 blocks took 1320 µs so against 1127 run as separate
/// kernels (`rafter bench --trace`, 2 threads, 40 calls).
pub const BAND_MIN_ROWS: usize = 8;

/// A block on a small map, stage after stage over the whole map, each stage split over the
/// threads its own way (the GEMMs by columns, the depthwise stage by channels, as the
/// separate kernels are), in one dispatch: the expanded map (188 KB at MobileNetV2's
/// 7×7×960) and the depthwise output live in the calling thread's scratch, where the
/// separate kernels wrote them to the memory plan's arena and paid two more dispatches.
fn whole_map(
    isa: Isa,
    b: &BlockNhwc<'_>,
    ch: &Channels,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let d = &b.depthwise;
    let (pixels, mid) = (b.n * b.h * b.w, ch.mid);
    let out_pixels = b.n * d.out[0] * d.out[1];
    with_pair(&SCRATCH, |(expanded, dw_out)| {
        let dw_in: &[f32] = match &b.expand {
            Some(e) => {
                expanded.grow(pixels * mid);
                let y = &mut expanded.as_mut_slice()[..pixels * mid];
                let a =
                    MatRef::row_major(b.input, pixels, b.channels, b.channels).map_err(gemm_err)?;
                let c = MatMut::row_major(y, pixels, mid, mid).map_err(gemm_err)?;
                sgemm_with_isa(isa, e.alpha, a, e.weights, 0.0, c, &e.epilogue, par)
                    .map_err(gemm_err)?;
                &expanded.as_slice()[..pixels * mid]
            }
            None => b.input,
        };
        let conv = d.over(dw_in, [b.h, b.w, mid], d.pads, d.out);
        let Some(p) = &b.project else {
            return depthwise_nhwc_with_isa(isa, &conv, out, par);
        };
        dw_out.grow(out_pixels * mid);
        let dw_out = &mut dw_out.as_mut_slice()[..out_pixels * mid];
        depthwise_nhwc_with_isa(isa, &conv, dw_out, par)?;
        let e = Epilogue {
            residual: b
                .residual
                .map(|(r, before)| Residual::row_major(r, ch.out, before)),
            ..p.epilogue
        };
        let a = MatRef::row_major(dw_out, out_pixels, mid, mid).map_err(gemm_err)?;
        let c = MatMut::row_major(out, out_pixels, ch.out, ch.out).map_err(gemm_err)?;
        sgemm_with_isa(isa, p.alpha, a, p.weights, 0.0, c, &e, par).map_err(gemm_err)
    })
}

/// Output rows of part `p` of `parts` of an image of `oh` rows.
fn share(oh: usize, parts: usize, p: usize) -> std::ops::Range<usize> {
    oh * p / parts..oh * (p + 1) / parts
}

/// Output rows a band computes: about [`BAND_BYTES`] of expanded rows.
fn band_rows(b: &BlockNhwc<'_>, mid: usize) -> usize {
    let d = &b.depthwise;
    let row_bytes = (b.w * mid * 4).max(1);
    let rows_in = (BAND_BYTES / row_bytes).max(d.kernel[0] + d.stride[0]);
    ((rows_in - d.kernel[0]) / d.stride[0] + 1).max(1)
}

fn gemm_err(e: crate::GemmError) -> KernelError {
    shape_err(e.to_string())
}

/// The expanded rows held in scratch: input rows `lo..hi`, stored from the buffer's start.
struct Held {
    lo: usize,
    hi: usize,
}

/// Output rows `rows` of image `img`, band by band, into `dst` (those rows' elements).
#[allow(clippy::too_many_arguments)]
fn run_share(
    isa: Isa,
    b: &BlockNhwc<'_>,
    stem: Option<(&SmallConvNhwc<'_>, &SmallWeights)>,
    ch: &Channels,
    img: usize,
    rows: std::ops::Range<usize>,
    dst: &mut [f32],
    (held_buf, dw_buf): &mut (Aligned, Aligned),
) -> Result<(), KernelError> {
    let d = &b.depthwise;
    let (w, c0, mid) = (b.w, b.channels, ch.mid);
    let [oh, ow] = d.out;
    let plane = match stem {
        Some(_) => &[][..],
        None => &b.input[img * b.h * w * c0..][..b.h * w * c0],
    };
    let band = band_rows(b, mid);
    let mut held = Held { lo: 0, hi: 0 };
    for o0 in rows.clone().step_by(band) {
        let o1 = (o0 + band).min(rows.end);
        // Input rows the band's windows cover, inside the image.
        let top = (o0 * d.stride[0]) as isize - d.pads[0] as isize;
        let lo = top.max(0) as usize;
        let bottom = ((o1 - 1) * d.stride[0] + d.kernel[0]) as isize - d.pads[0] as isize;
        let hi = (bottom.clamp(0, b.h as isize) as usize).max(lo);
        let dw_in: &[f32] = match (&b.expand, stem) {
            (Some(e), _) => {
                let expand = |rows: std::ops::Range<usize>, out: &mut [f32]| {
                    let pixels = rows.len() * w;
                    let x = &plane[rows.start * w * c0..rows.end * w * c0];
                    let a = MatRef::row_major(x, pixels, c0, c0).map_err(gemm_err)?;
                    let c = MatMut::row_major(out, pixels, mid, mid).map_err(gemm_err)?;
                    sgemm_with_isa(isa, e.alpha, a, e.weights, 0.0, c, &e.epilogue, &Sequential)
                        .map_err(gemm_err)
                };
                held_rows(w * mid, lo..hi, &mut held, held_buf, &expand)?;
                &held_buf.as_slice()[..(hi - lo) * w * mid]
            }
            (None, Some((st, sw))) => {
                let first = img * b.h;
                let conv = |rows: std::ops::Range<usize>, out: &mut [f32]| {
                    small_conv_rows_into(isa, st, sw, first + rows.start..first + rows.end, out);
                    Ok(())
                };
                held_rows(w * mid, lo..hi, &mut held, held_buf, &conv)?;
                &held_buf.as_slice()[..(hi - lo) * w * mid]
            }
            (None, None) => &plane[lo * w * c0..hi * w * c0],
        };
        let pads = [(lo as isize - top) as usize, d.pads[1]];
        let conv = d.over(dw_in, [hi - lo, w, mid], pads, [o1 - o0, ow]);
        let local = (o0 - rows.start) * ow * ch.out..(o1 - rows.start) * ow * ch.out;
        let Some(p) = &b.project else {
            depthwise_nhwc_with_isa(isa, &conv, &mut dst[local], &Sequential)?;
            continue;
        };
        let pixels = (o1 - o0) * ow;
        dw_buf.grow(pixels * mid);
        let dw_out = &mut dw_buf.as_mut_slice()[..pixels * mid];
        depthwise_nhwc_with_isa(isa, &conv, dw_out, &Sequential)?;
        let global = (img * oh + o0) * ow * ch.out..(img * oh + o1) * ow * ch.out;
        let e = Epilogue {
            residual: b
                .residual
                .map(|(r, before)| Residual::row_major(&r[global], ch.out, before)),
            ..p.epilogue
        };
        let a = MatRef::row_major(dw_out, pixels, mid, mid).map_err(gemm_err)?;
        let c = MatMut::row_major(&mut dst[local], pixels, ch.out, ch.out).map_err(gemm_err)?;
        sgemm_with_isa(isa, p.alpha, a, p.weights, 0.0, c, &e, &Sequential).map_err(gemm_err)?;
    }
    Ok(())
}

/// Computes a block's first-stage rows (the expansion's or the stem's) into a buffer.
type RowsFn<'a> = dyn Fn(std::ops::Range<usize>, &mut [f32]) -> Result<(), KernelError> + 'a;

/// Makes `buf` hold the first stage's rows `need` (a window that only moves down), `row`
/// elements each: rows already held are moved to the front, the rest computed by
/// `compute(rows, out)`.
fn held_rows(
    row: usize,
    need: std::ops::Range<usize>,
    held: &mut Held,
    buf: &mut Aligned,
    compute: &RowsFn<'_>,
) -> Result<(), KernelError> {
    buf.grow(need.len() * row);
    let buf = buf.as_mut_slice();
    if held.lo <= need.start && need.start < held.hi {
        buf.copy_within((need.start - held.lo) * row..(held.hi - held.lo) * row, 0);
        held.hi = held.hi.min(need.end);
    } else {
        held.hi = need.start;
    }
    held.lo = need.start;
    if held.hi < need.end {
        let new = held.hi..need.end;
        let at = (new.start - held.lo) * row;
        compute(new.clone(), &mut buf[at..at + new.len() * row])?;
        held.hi = need.end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::winograd::tests::data;
    use crate::{Activation, PackedB, ScopedThreads};

    /// One stage's tail in f64: `clamp(act(alpha·acc + bias (+ r)) (+ r))`.
    fn tail(
        acc: f64,
        alpha: f32,
        bias: f64,
        relu: bool,
        res: Option<(f64, bool)>,
        clamp: Option<(f32, f32)>,
    ) -> f32 {
        let mut v = alpha as f64 * acc + bias;
        if let Some((r, true)) = res {
            v += r;
        }
        if relu {
            v = v.max(0.0);
        }
        if let Some((r, false)) = res {
            v += r;
        }
        if let Some((lo, hi)) = clamp {
            v = v.max(lo as f64).min(hi as f64);
        }
        v as f32
    }

    /// A 1×1 convolution of `[pixels, cin]` by `[cin, cout]`, in f64, rounded to f32.
    fn pointwise(
        x: &[f32],
        cin: usize,
        w: &[f32],
        cout: usize,
        bias: &[f32],
        res: Option<(&[f32], bool)>,
    ) -> Vec<f32> {
        let pixels = x.len() / cin;
        let mut y = vec![0f32; pixels * cout];
        for p in 0..pixels {
            for j in 0..cout {
                let acc: f64 = (0..cin)
                    .map(|i| x[p * cin + i] as f64 * w[i * cout + j] as f64)
                    .sum();
                let r = res.map(|(r, before)| (r[p * cout + j] as f64, before));
                y[p * cout + j] = tail(acc, 1.0, bias[j] as f64, false, r, Some((0.0, 6.0)));
            }
        }
        y
    }

    /// The depthwise stage over `[n, h, w, c]`, in f64, with bias and a 0..6 clamp.
    #[allow(clippy::too_many_arguments)]
    fn depthwise(
        x: &[f32],
        [n, h, w, c]: [usize; 4],
        k: usize,
        s: usize,
        p: usize,
        [oh, ow]: [usize; 2],
        wt: &[f32],
        bias: &[f32],
    ) -> Vec<f32> {
        let mut y = vec![0f32; n * oh * ow * c];
        for img in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..c {
                        let mut acc = 0f64;
                        for ky in 0..k {
                            for kx in 0..k {
                                let iy = (oy * s + ky) as isize - p as isize;
                                let ix = (ox * s + kx) as isize - p as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xi = ((img * h + iy as usize) * w + ix as usize) * c + ch;
                                acc += x[xi] as f64 * wt[(ky * k + kx) * c + ch] as f64;
                            }
                        }
                        let i = ((img * oh + oy) * ow + ox) * c + ch;
                        y[i] = tail(acc, 1.0, bias[ch] as f64, false, None, Some((0.0, 6.0)));
                    }
                }
            }
        }
        y
    }

    /// The block `[expand c→mid] → depthwise k×k/s → [project mid→cout] (+ input)` on
    /// `n` images of `h×w`, every ISA, 1 and 3 threads, against the stage-by-stage reference.
    #[allow(clippy::too_many_arguments)]
    fn case(
        n: usize,
        h: usize,
        w: usize,
        c: usize,
        mid: Option<usize>,
        k: usize,
        s: usize,
        cout: Option<usize>,
        skip: bool,
        packed: bool,
    ) {
        let p = k / 2;
        let [oh, ow] = [(h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1];
        let x = data(n * h * w * c, 1);
        let m = mid.unwrap_or(c);
        let (we, be) = (data(c * m, 2), data(m, 3));
        let (wd, bd) = (data(k * k * m, 4), data(m, 5));
        let co = cout.unwrap_or(m);
        let (wp, bp) = (data(m * co, 6), data(co, 7));
        let expanded = match mid {
            Some(_) => pointwise(&x, c, &we, m, &be, None),
            None => x.clone(),
        };
        let dw = depthwise(&expanded, [n, h, w, m], k, s, p, [oh, ow], &wd, &bd);
        let want = match cout {
            Some(_) => pointwise(&dw, m, &wp, co, &bp, skip.then_some((&x[..], false))),
            None => dw,
        };
        let (pe, pp) = (
            PackedB::pack(c, m, &we, m).unwrap(),
            PackedB::pack(m, co, &wp, co).unwrap(),
        );
        let weights = |raw: &'static str| -> BRef<'_> {
            match (raw, packed) {
                ("e", true) => BRef::Packed(pe.view()),
                ("e", false) => BRef::Mat(MatRef::row_major(&we, c, m, m).unwrap()),
                (_, true) => BRef::Packed(pp.view()),
                _ => BRef::Mat(MatRef::row_major(&wp, m, co, co).unwrap()),
            }
        };
        let clamp6 = |bias| Epilogue {
            bias: Some(bias),
            activation: Activation::None,
            clamp: Some((0.0, 6.0)),
            ..Epilogue::none()
        };
        let block = BlockNhwc {
            input: &x,
            stem: None,
            n,
            h,
            w,
            channels: c,
            expand: mid.map(|_| Pointwise {
                weights: weights("e"),
                alpha: 1.0,
                epilogue: clamp6(&be),
            }),
            depthwise: DepthwiseStage {
                kernel: [k, k],
                stride: [s, s],
                pads: [p, p],
                out: [oh, ow],
                weights: &wd,
                tail: ChannelTail {
                    bias: Some(&bd),
                    clamp: Some((0.0, 6.0)),
                    ..ChannelTail::default()
                },
            },
            project: cout.map(|_| Pointwise {
                weights: weights("p"),
                alpha: 1.0,
                epilogue: clamp6(&bp),
            }),
            residual: skip.then_some((&x[..], false)),
        };
        for isa in isas() {
            for threads in [1, 3] {
                let mut got = vec![f32::NAN; want.len()];
                block_nhwc_with_isa(isa, &block, &mut got, &ScopedThreads::new(threads)).unwrap();
                for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - r).abs() <= 1e-4 * (1.0 + r.abs()),
                        "{isa:?}, {threads} threads, {n}x{h}x{w}x{c} {mid:?} k{k}s{s} {cout:?}: element {i}: {g} vs {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn inverted_residual_with_skip() {
        // Rows of 19 pixels: bands end mid-image and shares start mid-band.
        case(2, 23, 19, 24, Some(144), 3, 1, Some(24), true, true);
        case(1, 9, 7, 5, Some(30), 3, 1, Some(5), true, false);
    }

    #[test]
    fn many_bands_reuse_their_held_rows() {
        // 32 KB expanded rows: bands of 4 output rows, so a share walks many bands, keeping
        // two rows from one band to the next (stride 2: one) in the buffer.
        case(1, 60, 16, 8, Some(512), 3, 1, Some(8), true, true);
        case(1, 61, 16, 8, Some(512), 3, 2, Some(8), false, true);
    }

    #[test]
    fn small_maps_run_stage_by_stage() {
        // Fewer than BAND_MIN_ROWS output rows: MobileNetV2's 7×7 block with its skip, the
        // 14×14 → 7×7 stride-2 one on two images, and the halves.
        case(1, 7, 7, 16, Some(96), 3, 1, Some(16), true, true);
        case(2, 14, 14, 24, Some(72), 3, 2, Some(40), false, true);
        case(1, 5, 6, 8, None, 3, 1, Some(8), false, false);
        case(1, 7, 7, 16, Some(48), 3, 1, None, false, true);
    }

    #[test]
    fn strided_blocks_and_halves() {
        case(1, 31, 29, 16, Some(96), 3, 2, Some(24), false, true);
        // Expansion and depthwise only; depthwise and projection only (t = 1).
        case(1, 30, 17, 8, Some(40), 3, 2, None, false, false);
        case(2, 21, 33, 32, None, 3, 1, Some(16), false, true);
        case(1, 12, 12, 20, Some(36), 5, 2, Some(20), false, true);
    }

    /// A stem block (`stem conv → depthwise 3×3 → [project]`) against the stem run whole by
    /// `small_conv_nhwc`, then the block without it: the same arithmetic, so equal bit for bit.
    fn stem_case(n: usize, [h, w]: [usize; 2], cout: usize, project: Option<usize>) {
        use crate::nhwc::small_conv_nhwc_with_isa;
        let (cin, o) = (3, [(h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1]);
        let x = data(n * cin * h * w, 1);
        let (ws, bs) = (data(27 * cout, 2), data(cout, 3));
        let (wd, bd) = (data(9 * cout, 4), data(cout, 5));
        let co = project.unwrap_or(cout);
        let (wp, bp) = (data(cout * co, 6), data(co, 7));
        let clamp6 = |bias| ChannelTail {
            bias: Some(bias),
            clamp: Some((0.0, 6.0)),
            ..ChannelTail::default()
        };
        let stem = SmallConvNhwc {
            window: WindowNhwc {
                input: &x,
                h,
                w,
                channels: cin,
                kernel: [3, 3],
                stride: [2, 2],
                pads: [1, 1],
                out: o,
            },
            input_nchw: true,
            weights: &ws,
            cout,
            tail: clamp6(&bs),
        };
        let rest = BlockNhwc {
            input: &[],
            stem: None,
            n,
            h: o[0],
            w: o[1],
            channels: cout,
            expand: None,
            depthwise: DepthwiseStage {
                kernel: [3, 3],
                stride: [1, 1],
                pads: [1, 1],
                out: o,
                weights: &wd,
                tail: clamp6(&bd),
            },
            project: project.map(|_| Pointwise {
                weights: BRef::Mat(MatRef::row_major(&wp, cout, co, co).unwrap()),
                alpha: 1.0,
                epilogue: Epilogue {
                    bias: Some(&bp),
                    ..Epilogue::none()
                },
            }),
            residual: None,
        };
        for isa in isas() {
            let mut map = vec![0f32; n * o[0] * o[1] * cout];
            small_conv_nhwc_with_isa(isa, &stem, &mut map, &Sequential).unwrap();
            let mut want = vec![0f32; n * o[0] * o[1] * co];
            let unfused = BlockNhwc {
                input: &map,
                ..rest
            };
            if project.is_some() {
                block_nhwc_with_isa(isa, &unfused, &mut want, &Sequential).unwrap();
            } else {
                let d = &rest.depthwise;
                let conv = DepthwiseNhwc {
                    window: WindowNhwc {
                        input: &map,
                        h: o[0],
                        w: o[1],
                        channels: cout,
                        kernel: d.kernel,
                        stride: d.stride,
                        pads: d.pads,
                        out: d.out,
                    },
                    weights: d.weights,
                    tail: d.tail,
                };
                depthwise_nhwc_with_isa(isa, &conv, &mut want, &Sequential).unwrap();
            }
            let fused = BlockNhwc {
                stem: Some(stem),
                ..rest
            };
            for threads in [1, 3] {
                let mut got = vec![f32::NAN; want.len()];
                block_nhwc_with_isa(isa, &fused, &mut got, &ScopedThreads::new(threads)).unwrap();
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(g, r)| g.to_bits() == r.to_bits()),
                    "{isa:?}, {threads} threads, {n}x3x{h}x{w} -> {cout} {project:?}"
                );
            }
        }
    }

    #[test]
    fn stem_blocks_match_the_stem_then_the_block() {
        // Odd sizes: bands and shares end mid-image; MobileNetV2's channels (32 -> 16) and
        // ones leaving partial vectors; one without a projection.
        stem_case(2, [45, 37], 32, Some(16));
        stem_case(1, [23, 50], 20, Some(7));
        stem_case(1, [30, 30], 24, None);
    }

    /// A 1×4×4×8 input through a 3×3 depthwise stage and nothing else, for the error tests
    /// to add or break a stage.
    fn depthwise_only_4x4x8<'a>(input: &'a [f32], wd: &'a [f32]) -> BlockNhwc<'a> {
        BlockNhwc {
            input,
            stem: None,
            n: 1,
            h: 4,
            w: 4,
            channels: 8,
            expand: None,
            depthwise: DepthwiseStage {
                kernel: [3, 3],
                stride: [1, 1],
                pads: [1, 1],
                out: [4, 4],
                weights: wd,
                tail: ChannelTail::default(),
            },
            project: None,
            residual: None,
        }
    }

    #[test]
    fn bad_stem_blocks_are_errors() {
        use crate::nhwc::{SmallConvNhwc, WindowNhwc};
        let (img, ws, wd) = (data(3 * 8 * 8, 1), data(27 * 8, 2), data(9 * 8, 3));
        let stem = SmallConvNhwc {
            window: WindowNhwc {
                input: &img,
                h: 8,
                w: 8,
                channels: 3,
                kernel: [3, 3],
                stride: [2, 2],
                pads: [1, 1],
                out: [4, 4],
            },
            input_nchw: true,
            weights: &ws,
            cout: 8,
            tail: ChannelTail::default(),
        };
        let block = BlockNhwc {
            stem: Some(stem),
            ..depthwise_only_4x4x8(&[], &wd)
        };
        let mut out = vec![0f32; 4 * 4 * 8];
        block_nhwc(&block, &mut out, &Sequential).unwrap();
        let err = |b: &BlockNhwc<'_>| block_nhwc(b, &mut out.clone(), &Sequential).unwrap_err();
        let own_input = BlockNhwc {
            input: &img[..4 * 4 * 8],
            ..block
        };
        let e = err(&own_input);
        assert!(e.to_string().contains("no input of its own"), "{e}");
        let wider = BlockNhwc {
            stem: Some(SmallConvNhwc { cout: 4, ..stem }),
            ..block
        };
        let e = err(&wider);
        assert!(e.to_string().contains("the stem makes [4, 4]x4"), "{e}");
        let short_weights = BlockNhwc {
            stem: Some(SmallConvNhwc {
                weights: &ws[1..],
                ..stem
            }),
            ..block
        };
        let e = err(&short_weights);
        assert!(e.to_string().contains("small conv weights"), "{e}");
    }

    #[test]
    fn bad_blocks_are_errors() {
        let x = data(4 * 4 * 8, 1);
        let wd = data(9 * 8, 2);
        let wp = data(8 * 4, 3);
        let block = depthwise_only_4x4x8(&x, &wd);
        let mut out = vec![0f32; 4 * 4 * 4];
        let e = block_nhwc(&block, &mut out, &Sequential).unwrap_err();
        assert!(e.to_string().contains("no 1x1 stage"), "{e}");
        // A residual is added by the projection only.
        let expand = Pointwise {
            weights: BRef::Mat(MatRef::row_major(&wp, 8, 4, 4).unwrap()),
            alpha: 1.0,
            epilogue: Epilogue::none(),
        };
        let no_project = BlockNhwc {
            channels: 8,
            expand: Some(expand),
            residual: Some((&x[..16 * 4], false)),
            depthwise: DepthwiseStage {
                weights: &wd[..9 * 4],
                ..block.depthwise
            },
            ..block
        };
        let e = block_nhwc(&no_project, &mut out, &Sequential).unwrap_err();
        assert!(
            e.to_string().contains("a residual needs a projection"),
            "{e}"
        );
        let wrong = Pointwise {
            weights: BRef::Mat(MatRef::row_major(&wp, 4, 8, 8).unwrap()),
            alpha: 1.0,
            epilogue: Epilogue::none(),
        };
        let e = block_nhwc(
            &BlockNhwc {
                project: Some(wrong),
                ..block
            },
            &mut out,
            &Sequential,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("projection weight has 4 rows for 8 channels"),
            "{e}"
        );
        let right = Pointwise {
            weights: BRef::Mat(MatRef::row_major(&wp, 8, 4, 4).unwrap()),
            ..wrong
        };
        let e = block_nhwc(
            &BlockNhwc {
                project: Some(right),
                ..block
            },
            &mut out[..10],
            &Sequential,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("block nhwc output: expected 64 elements, got 10"),
            "{e}"
        );
        block_nhwc(
            &BlockNhwc {
                project: Some(right),
                ..block
            },
            &mut out,
            &Sequential,
        )
        .unwrap();
    }
}
