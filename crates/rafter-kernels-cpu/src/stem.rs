//! Direct convolution for networks' stems: few input channels (an image's 3), a large
//! window (ResNet's 7×7 stride 2, MobileNet's 3×3 stride 2), a large output map.
//!
//! Why not im2col + GEMM: with `Cin·KH·KW` = 27..147 the GEMM's K is short, and its B (the
//! im2col, 147 × 12,544 floats for ResNet-50) is written, packed and read again, three
//! passes over 7 MB for 236 M multiply-adds. Here the input is split once into its stride
//! phases (even and odd columns for stride 2), zero-padded, a few hundred KB that stay in
//! L2; then every tap of every output vector is one unaligned load from a phase row,
//! shared by a block of output channels.
//!
//! Output `(co, o, x)` reads padded input `(ci, o·s + ki, x·s + kj)`, which is element
//! `x + kj / s` of row `o·s + ki` of phase `kj % s` of channel `ci`.

use crate::common::{check_isa, check_len, Disjoint, KernelError};
use crate::simd::{copy, Simd, MAX_LANES};
use crate::spatial::Tail;
use crate::{Isa, Parallel};

/// Output channels computed together: each tap's input vectors are loaded once for all of
/// them.
const CO_BLOCK: usize = 8;

/// Output vectors (of the ISA's lanes) computed together per output row: with
/// [`CO_BLOCK`] channels, 16 accumulators.
const X_VECS: usize = 2;

/// A stride-1 or stride-2 convolution of one NCHW image with its tail: per output element
/// `clamp(act(conv + bias[co] (+ residual)) (+ residual))`.
#[derive(Clone, Copy, Debug)]
pub struct StemConv<'a> {
    /// `cin × h × w`.
    pub input: &'a [f32],
    /// Input channels.
    pub cin: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// `cout × cin × kh × kw` (OIHW).
    pub weights: &'a [f32],
    /// Output channels.
    pub cout: usize,
    /// Window height and width.
    pub kernel: [usize; 2],
    /// 1 or 2, along both axes.
    pub stride: usize,
    /// Leading padding (top, left); trailing padding is whatever `out` implies (zeros).
    pub pads: [usize; 2],
    /// Output height and width.
    pub out: [usize; 2],
    /// Per output channel.
    pub bias: Option<&'a [f32]>,
    /// Of the output's shape.
    pub residual: Option<&'a [f32]>,
    /// The residual is added before the activation (else after it).
    pub res_before: bool,
    /// `max(x, 0)` as the activation (else none).
    pub relu: bool,
    /// `x.max(lo).min(hi)`, last.
    pub clamp: Option<(f32, f32)>,
}

/// The phase planes of the padded input: `cin × stride` planes of `rows × width` floats.
struct Phases {
    rows: usize,
    width: usize,
    data: Vec<f32>,
}

/// Runs `conv` into `out` (`cout × out[0] × out[1]`) on the fastest ISA.
pub fn stem_conv(
    conv: &StemConv<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    stem_conv_with_isa(Isa::detect(), conv, out, par)
}

/// [`stem_conv`] on a given ISA.
pub fn stem_conv_with_isa(
    isa: Isa,
    conv: &StemConv<'_>,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let c = conv;
    let shape = |detail: String| KernelError::Shape {
        what: "stem convolution".into(),
        detail,
    };
    if !(1..=2).contains(&c.stride) || c.kernel.contains(&0) {
        return Err(shape(format!(
            "stride {} with a {:?} window (stride 1 or 2, a window of at least 1)",
            c.stride, c.kernel
        )));
    }
    let [oh, ow] = c.out;
    let p = oh * ow;
    check_len("stem input", c.input.len(), c.cin * c.h * c.w)?;
    check_len(
        "stem weights",
        c.weights.len(),
        c.cout * c.cin * c.kernel[0] * c.kernel[1],
    )?;
    check_len("stem output", out.len(), c.cout * p)?;
    if let Some(b) = c.bias {
        check_len("stem bias", b.len(), c.cout)?;
    }
    if let Some(r) = c.residual {
        check_len("stem residual", r.len(), out.len())?;
    }
    if p == 0 || c.cout == 0 {
        return Ok(());
    }
    let phases = phases(isa, c, par);
    let y = Disjoint::new(out);
    let blocks = c.cout.div_ceil(CO_BLOCK);
    // Tasks: channel blocks × bands of output rows, about 4 per thread.
    let bands = (4 * par.threads()).div_ceil(blocks).clamp(1, oh);
    par.run(blocks * bands, &|t| {
        let (b, band) = (t / bands, t % bands);
        let co0 = b * CO_BLOCK;
        let co1 = (co0 + CO_BLOCK).min(c.cout);
        // Tasks own disjoint (channel block, row band) pairs.
        let rows = (oh * band / bands)..(oh * (band + 1) / bands);
        stem_rows_isa(isa, c, &phases, co0..co1, rows, &y);
    });
    Ok(())
}

/// The zero-padded input split into its stride phases (see the module docs); wide enough
/// that a vector starting at any output column's last tap stays inside its row. Built by
/// vectors, rows split over the threads.
fn phases(isa: Isa, c: &StemConv<'_>, par: &dyn Parallel) -> Phases {
    let (s, [kh, kw], [oh, ow]) = (c.stride, c.kernel, c.out);
    let rows = (oh - 1) * s + kh;
    // Output vectors reach column ow rounded up to X_VECS vectors of the widest ISA; a
    // multiple of its lanes itself, so the phase rows split by whole vectors.
    let v = MAX_LANES * X_VECS;
    let width = (ow.div_ceil(v) * v + (kw - 1) / s + 1).div_ceil(MAX_LANES) * MAX_LANES;
    let mut ph = Phases {
        rows,
        width,
        data: vec![0f32; c.cin * s * rows * width],
    };
    let out = Disjoint::new(&mut ph.data);
    let tasks = (4 * par.threads()).min(c.cin * rows);
    par.run(tasks, &|t| {
        let mut padded = vec![0f32; s * width];
        for i in (c.cin * rows * t / tasks)..(c.cin * rows * (t + 1) / tasks) {
            let (ci, r) = (i / rows, i % rows);
            let at = |phase: usize| ((ci * s + phase) * rows + r) * width;
            // SAFETY: each (channel, row) is one task's, and its phase rows are disjoint
            // from every other's (and from each other).
            let even = unsafe { out.part(at(0)..at(0) + width) };
            let odd = if s == 2 {
                // SAFETY: the odd phase row of this task: disjoint as above.
                unsafe { out.part(at(1)..at(1) + width) }
            } else {
                &mut []
            };
            phase_row_isa(isa, c, ci, r, &mut padded, even, odd);
        }
    });
    ph
}

simd_dispatch!(fn phase_row_isa(c: &StemConv<'_>, ci: usize, r: usize, padded: &mut [f32], even: &mut [f32], odd: &mut [f32]) => phase_row);

/// Row `r` of channel `ci`'s phases: the input row zero-padded into `padded` (`stride`
/// phase rows long), then split into `even` and `odd` (stride 2) or copied to `even`.
#[inline(always)]
fn phase_row<S: Simd>(
    sd: S,
    c: &StemConv<'_>,
    ci: usize,
    r: usize,
    padded: &mut [f32],
    even: &mut [f32],
    odd: &mut [f32],
) {
    let l = S::LANES;
    let pl = c.pads[1];
    let Some(y) = r.checked_sub(c.pads[0]).filter(|&y| y < c.h) else {
        return; // a row of padding: the phases are zero already
    };
    // Padded column k is input column k - pl.
    let n = c.w.min(padded.len().saturating_sub(pl));
    padded.fill(0.0);
    copy(
        sd,
        &c.input[(ci * c.h + y) * c.w..][..n],
        &mut padded[pl..pl + n],
    );
    if odd.is_empty() {
        copy(sd, padded, even);
        return;
    }
    for i in (0..even.len()).step_by(l) {
        let (e, o) = sd.deinterleave(sd.load(&padded[2 * i..]), sd.load(&padded[2 * i + l..]));
        sd.store(&mut even[i..], e);
        sd.store(&mut odd[i..], o);
    }
}

simd_dispatch!(fn stem_rows_isa(c: &StemConv<'_>, ph: &Phases, cos: std::ops::Range<usize>, rows: std::ops::Range<usize>, y: &Disjoint<'_>) => stem_rows);

/// Output rows `rows` of channels `cos` (at most [`CO_BLOCK`]).
#[inline(always)]
fn stem_rows<S: Simd>(
    s: S,
    c: &StemConv<'_>,
    ph: &Phases,
    cos: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    y: &Disjoint<'_>,
) {
    let l = S::LANES;
    let [kh, kw] = c.kernel;
    let ow = c.out[1];
    let st = c.stride;
    let taps = c.cin * kh * kw;
    // The block's filters tap-major: wt[tap][j] for channel cos.start + j (zero past n_co).
    let mut wt = vec![0f32; taps * CO_BLOCK];
    for (j, co) in cos.clone().enumerate() {
        for t in 0..taps {
            wt[t * CO_BLOCK + j] = c.weights[co * taps + t];
        }
    }
    // Where each tap reads for output row 0, column 0: row ki of phase kj % s of channel
    // ci, element kj / s. Output row o reads `o · s` phase rows further down.
    let mut tap_at = Vec::with_capacity(taps);
    for ci in 0..c.cin {
        for ki in 0..kh {
            for kj in 0..kw {
                let plane = (ci * st + kj % st) * ph.rows * ph.width;
                tap_at.push(plane + ki * ph.width + kj / st);
            }
        }
    }
    for o in rows {
        let row_off = o * st * ph.width;
        let mut x0 = 0;
        // Whole blocks of X_VECS vectors, then one vector at a time: a row of 112 columns is
        // 3.5 blocks of AVX-512's 32, and a padded last block wasted 1/8 of the FMAs.
        while x0 < ow {
            if ow - x0 > (X_VECS - 1) * l {
                stem_block::<S, X_VECS>(s, c, ph, &cos, &tap_at, &wt, o, row_off, x0, y);
                x0 += X_VECS * l;
            } else {
                stem_block::<S, 1>(s, c, ph, &cos, &tap_at, &wt, o, row_off, x0, y);
                x0 += l;
            }
        }
    }
}

/// `XV` output vectors from column `x0` of output row `o`, for channels `cos`: every tap's
/// input vectors loaded once and multiplied by each channel's broadcast weight.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn stem_block<S: Simd, const XV: usize>(
    s: S,
    c: &StemConv<'_>,
    ph: &Phases,
    cos: &std::ops::Range<usize>,
    tap_at: &[usize],
    wt: &[f32],
    o: usize,
    row_off: usize,
    x0: usize,
    y: &Disjoint<'_>,
) {
    let l = S::LANES;
    let [oh, ow] = c.out;
    let data = &ph.data[..];
    let zero = s.splat(0.0);
    let mut acc = [[zero; XV]; CO_BLOCK];
    for (&at, w) in tap_at.iter().zip(wt.chunks_exact(CO_BLOCK)) {
        let at = at + row_off + x0;
        // (A loop, not `array::from_fn`: a closure is compiled without this function's
        // target features, and its loads would become calls.)
        let mut xv = [zero; XV];
        for (v, x) in xv.iter_mut().enumerate() {
            *x = s.load(&data[at + v * l..]);
        }
        for (acc_j, &wj) in acc.iter_mut().zip(w) {
            let wv = s.splat(wj);
            for (a, &v) in acc_j.iter_mut().zip(&xv) {
                *a = s.fma(wv, v, *a);
            }
        }
    }
    for (j, acc_j) in acc.iter().enumerate().take(cos.len()) {
        let co = cos.start + j;
        let base = co * oh * ow + o * ow;
        // SAFETY: row `o` of channel `co` belongs to this task alone: tasks own disjoint
        // (channel block, row band) pairs (`stem_conv_with_isa`).
        let orow = unsafe { y.part(base..base + ow) };
        let rrow = c.residual.map(|r| &r[base..base + ow]);
        let bias = c.bias.map_or(0.0, |b| b[co]);
        let tail = Tail::new(s, bias, 1.0, c.res_before, c.relu, c.clamp);
        for (v, &a) in acc_j.iter().enumerate() {
            let x = x0 + v * l;
            if x >= ow {
                break;
            }
            tail.store(s, a, rrow, orow, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::spatial::tests::out_size;
    use crate::winograd::tests::data;
    use crate::ScopedThreads;

    #[test]
    fn stem_matches_direct_loops() {
        // (cin, cout, h, w, k, stride, pads t l b r)
        let cases = [
            (3, 64, 23, 21, 7, 2, [3, 3, 3, 3]), // ResNet's stem, small
            (3, 13, 17, 40, 3, 2, [1, 1, 1, 1]), // MobileNet's, partial channel block
            (2, 9, 10, 35, 3, 1, [1, 1, 1, 1]),  // stride 1
            (1, 5, 9, 9, 5, 2, [0, 2, 1, 0]),    // uneven padding
            (4, 8, 5, 5, 1, 1, [0, 0, 0, 0]),    // 1×1
            (3, 8, 9, 100, 7, 2, [3, 3, 3, 3]),  // wide rows: whole and single-vector blocks
        ];
        for isa in isas() {
            for (ci, &(cin, cout, h, w, k, st, p)) in cases.iter().enumerate() {
                let (oh, ow) = (
                    out_size(h, p[0], p[2], k, st),
                    out_size(w, p[1], p[3], k, st),
                );
                let x = data(cin * h * w, 1 + ci as u32);
                let wts = data(cout * cin * k * k, 2 + ci as u32);
                let bias = data(cout, 3);
                let res = data(cout * oh * ow, 4);
                for variant in 0..3 {
                    let conv = StemConv {
                        input: &x,
                        cin,
                        h,
                        w,
                        weights: &wts,
                        cout,
                        kernel: [k, k],
                        stride: st,
                        pads: [p[0], p[1]],
                        out: [oh, ow],
                        bias: (variant > 0).then_some(&bias[..]),
                        residual: (variant == 2).then_some(&res[..]),
                        res_before: true,
                        relu: variant > 0,
                        clamp: (variant == 1).then_some((0.0, 0.5)),
                    };
                    let mut out = vec![f32::NAN; cout * oh * ow];
                    stem_conv_with_isa(isa, &conv, &mut out, &ScopedThreads::new(3)).unwrap();
                    for co in 0..cout {
                        for o in 0..oh {
                            for q in 0..ow {
                                let mut acc = conv.bias.map_or(0.0, |b| b[co] as f64);
                                for c in 0..cin {
                                    for ki in 0..k {
                                        for kj in 0..k {
                                            let iy = (o * st + ki) as isize - p[0] as isize;
                                            let ix = (q * st + kj) as isize - p[1] as isize;
                                            if iy < 0
                                                || ix < 0
                                                || iy as usize >= h
                                                || ix as usize >= w
                                            {
                                                continue;
                                            }
                                            acc += x[(c * h + iy as usize) * w + ix as usize]
                                                as f64
                                                * wts[((co * cin + c) * k + ki) * k + kj] as f64;
                                        }
                                    }
                                }
                                let i = (co * oh + o) * ow + q;
                                if variant == 2 {
                                    acc += res[i] as f64;
                                }
                                if variant > 0 {
                                    acc = acc.max(0.0);
                                }
                                if variant == 1 {
                                    acc = acc.min(0.5);
                                }
                                assert!(
                                    (out[i] as f64 - acc).abs() <= 1e-4,
                                    "{isa:?} case {ci} v{variant} at {co},{o},{q}: {} vs {acc}",
                                    out[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = [0.0; 3 * 4 * 4];
        let w = [0.0; 2 * 3 * 9];
        let conv = StemConv {
            input: &x,
            cin: 3,
            h: 4,
            w: 4,
            weights: &w,
            cout: 2,
            kernel: [3, 3],
            stride: 3,
            pads: [1, 1],
            out: [2, 2],
            bias: None,
            residual: None,
            res_before: false,
            relu: false,
            clamp: None,
        };
        let e = stem_conv(&conv, &mut [0.0; 8], &crate::Sequential).unwrap_err();
        assert!(e.to_string().contains("stride 3"), "{e}");
        let short = StemConv {
            stride: 2,
            weights: &w[..50],
            ..conv
        };
        let e = stem_conv(&short, &mut [0.0; 8], &crate::Sequential).unwrap_err();
        assert!(e.to_string().contains("stem weights"), "{e}");
    }
}
