//! 3×3 stride-1 convolution by Winograd's minimal filtering, F(2×2, 3×3).
//!
//! Why: ResNet-style networks spend about half their multiply-adds in 3×3 stride-1
//! convolutions. As im2col + GEMM each output needs 9·Cin multiply-adds; F(2×2, 3×3)
//! computes a 2×2 output tile from a 4×4 input tile with 16 products per input channel
//! instead of 36, so the GEMM work drops 2.25× (the tile transforms are linear in the
//! tensor sizes, not in Cin·Cout).
//!
//! ```text
//! U[ξ][co][ci] = (G g G^T)[ξ]        g: the 3×3 filter, once per weight (WinogradWeights)
//! V[ξ][ci][t]  = (B^T d B)[ξ]        d: the 4×4 input tile t (zero outside the input)
//! M[ξ]         = U[ξ] · V[ξ]         16 GEMMs, Cout×Cin times Cin×tiles
//! Y[co][t]     = A^T M[·][co][t] A   the 2×2 output tile, then bias / relu / residual
//! ```
//!
//! With these transforms (Lavin & Gray 2015) the products are exact up to rounding; the
//! result differs from direct convolution by a few ulps of the sum of absolute products,
//! like any other summation order.

use std::sync::Mutex;

use crate::parallel::{Parallel, Sequential};
use crate::{sgemm, BRef, Epilogue, MatMut, MatRef};

/// Positions of a transformed 4×4 tile.
const XI: usize = 16;

/// 3×3 filters transformed for F(2×2, 3×3): `[16][cout][cin]`, each position a row-major
/// Cout×Cin matrix (the GEMMs' A operand). 16/9 the size of the filters.
#[derive(Clone, Debug)]
pub struct WinogradWeights {
    cout: usize,
    cin: usize,
    data: Vec<f32>,
}

impl WinogradWeights {
    /// Transforms OIHW filters `w` of `cout × cin × 3 × 3`.
    pub fn new(w: &[f32], cout: usize, cin: usize) -> Result<WinogradWeights, String> {
        let n = cout
            .checked_mul(cin)
            .and_then(|n| n.checked_mul(9))
            .ok_or("winograd: filter size overflows")?;
        if w.len() != n {
            return Err(format!(
                "winograd: filters hold {} values, {cout}x{cin}x3x3 needs {n}",
                w.len()
            ));
        }
        let mut data = vec![0f32; XI * cout * cin];
        for co in 0..cout {
            for ci in 0..cin {
                let g = &w[(co * cin + ci) * 9..][..9];
                // G g: 4×3, then (G g) G^T: 4×4. G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1].
                let mut gg = [[0f32; 3]; 4];
                for c in 0..3 {
                    let (a, b, d) = (g[c], g[3 + c], g[6 + c]);
                    gg[0][c] = a;
                    gg[1][c] = 0.5 * (a + b + d);
                    gg[2][c] = 0.5 * (a - b + d);
                    gg[3][c] = d;
                }
                for (r, row) in gg.iter().enumerate() {
                    let (a, b, d) = (row[0], row[1], row[2]);
                    let u = [a, 0.5 * (a + b + d), 0.5 * (a - b + d), d];
                    for (c, &v) in u.iter().enumerate() {
                        data[((r * 4 + c) * cout + co) * cin + ci] = v;
                    }
                }
            }
        }
        Ok(WinogradWeights { cout, cin, data })
    }

    /// Output channels.
    pub fn cout(&self) -> usize {
        self.cout
    }

    /// Input channels.
    pub fn cin(&self) -> usize {
        self.cin
    }
}

/// One 3×3 stride-1 convolution of a CHW image.
#[derive(Clone, Copy, Debug)]
pub struct Conv3x3<'a> {
    /// The input, `cin × h × w`.
    pub input: &'a [f32],
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Zero padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Per output channel, added to every output of the channel.
    pub bias: Option<&'a [f32]>,
    /// A tensor of the output's shape added before the relu (a skip connection).
    pub residual: Option<&'a [f32]>,
    /// `max(x, 0)` last.
    pub relu: bool,
}

impl Conv3x3<'_> {
    /// Output height and width.
    pub fn out_dims(&self) -> Result<(usize, usize), String> {
        let oh = (self.h + self.pads[0] + self.pads[2]).checked_sub(2);
        let ow = (self.w + self.pads[1] + self.pads[3]).checked_sub(2);
        match (oh, ow) {
            (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok((oh, ow)),
            _ => Err(format!(
                "winograd: a {}x{} input with pads {:?} is smaller than the 3x3 filter",
                self.h, self.w, self.pads
            )),
        }
    }
}

/// Scratch a [`conv3x3`] call reuses (the transformed input and products), so a kernel
/// called once per inference does not allocate every time.
#[derive(Default, Debug)]
pub struct WinogradScratch {
    v: Vec<f32>,
    m: Vec<f32>,
}

/// Computes the convolution into `out` (`cout × oh × ow`), work split by `par`.
pub fn conv3x3(
    conv: &Conv3x3<'_>,
    weights: &WinogradWeights,
    out: &mut [f32],
    scratch: &mut WinogradScratch,
    par: &dyn Parallel,
) -> Result<(), String> {
    let (cin, cout) = (weights.cin, weights.cout);
    let (h, w) = (conv.h, conv.w);
    let (oh, ow) = conv.out_dims()?;
    let check = |what: &str, len: usize, want: usize| {
        if len == want {
            Ok(())
        } else {
            Err(format!("winograd: {what} holds {len} values, needs {want}"))
        }
    };
    check("input", conv.input.len(), cin * h * w)?;
    check("output", out.len(), cout * oh * ow)?;
    if let Some(b) = conv.bias {
        check("bias", b.len(), cout)?;
    }
    if let Some(r) = conv.residual {
        check("residual", r.len(), cout * oh * ow)?;
    }
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let tiles = th * tw;
    scratch.v.resize(XI * cin * tiles, 0.0);
    scratch.m.resize(XI * cout * tiles, 0.0);

    transform_input(conv, cin, (th, tw), &mut scratch.v, par);
    multiply(weights, tiles, &scratch.v, &mut scratch.m, par)?;
    transform_output(conv, cout, (oh, ow), (th, tw), &scratch.m, out, par);
    Ok(())
}

/// Splits `data` into `parts` chunks of `len` each, each behind a mutex, for tasks that
/// each write one chunk (`Parallel` hands out indices, not slices).
fn chunks(data: &mut [f32], len: usize) -> Vec<Mutex<&mut [f32]>> {
    data.chunks_mut(len.max(1)).map(Mutex::new).collect()
}

/// `V[ξ][ci][t] = (B^T d B)[ξ]` for every channel and tile; one task per channel.
fn transform_input(
    conv: &Conv3x3<'_>,
    cin: usize,
    (th, tw): (usize, usize),
    v: &mut [f32],
    par: &dyn Parallel,
) {
    let tiles = th * tw;
    let (h, w) = (conv.h, conv.w);
    let (pt, pl) = (conv.pads[0] as isize, conv.pads[1] as isize);
    // Positions ξ are the outer dim of V, so a channel's values are strided by cin*tiles;
    // each task writes its own channel's rows of every position through `rows`.
    let rows = chunks(v, tiles);
    par.run(cin, &|ci| {
        let plane = &conv.input[ci * h * w..][..h * w];
        let mut out: Vec<_> = (0..XI)
            .map(|xi| {
                rows[xi * cin + ci]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
            })
            .collect();
        // One tile row at a time, as whole rows: the 4 input rows under it (zero-padded to
        // the tiles' span), their vertical combinations (B^T d, contiguous loops), then
        // the horizontal ones per tile (stride-2 reads). Written this way the compiler
        // vectorises both across tiles.
        let span = 2 * tw + 2;
        let mut win = vec![0f32; 4 * span];
        let mut bd = vec![0f32; 4 * span];
        for ty in 0..th {
            for r in 0..4 {
                let dst = &mut win[r * span..][..span];
                dst.fill(0.0);
                let y = (2 * ty + r) as isize - pt;
                if y < 0 || y as usize >= h {
                    continue;
                }
                let src = &plane[y as usize * w..][..w];
                // Input column x lands at span position x + pl (when inside the span).
                let lo = (pl as usize).min(span);
                let n = w.min(span - lo);
                dst[lo..lo + n].copy_from_slice(&src[..n]);
            }
            let (w0, rest) = win.split_at(span);
            let (w1, rest) = rest.split_at(span);
            let (w2, w3) = rest.split_at(span);
            // B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] on rows.
            for x in 0..span {
                bd[x] = w0[x] - w2[x];
                bd[span + x] = w1[x] + w2[x];
                bd[2 * span + x] = w2[x] - w1[x];
                bd[3 * span + x] = w1[x] - w3[x];
            }
            let t0 = ty * tw;
            for k in 0..4 {
                let row = &bd[k * span..][..span];
                let (o0, rest) = out[k * 4..k * 4 + 4].split_at_mut(1);
                let (o1, rest) = rest.split_at_mut(1);
                let (o2, o3) = rest.split_at_mut(1);
                let (o0, o1) = (&mut o0[0][t0..t0 + tw], &mut o1[0][t0..t0 + tw]);
                let (o2, o3) = (&mut o2[0][t0..t0 + tw], &mut o3[0][t0..t0 + tw]);
                for t in 0..tw {
                    let (a, b, c, d) = (row[2 * t], row[2 * t + 1], row[2 * t + 2], row[2 * t + 3]);
                    o0[t] = a - c;
                    o1[t] = b + c;
                    o2[t] = c - b;
                    o3[t] = b - d;
                }
            }
        }
    });
}

/// `M[ξ] = U[ξ] · V[ξ]`: 16 GEMMs, run as parallel tasks (each on one thread) when there
/// are enough of them, else one after another with the threads inside each.
fn multiply(
    weights: &WinogradWeights,
    tiles: usize,
    v: &[f32],
    m: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), String> {
    let (cin, cout) = (weights.cin, weights.cout);
    let gemm = |xi: usize, c: &mut [f32], inner: &dyn Parallel| -> Result<(), String> {
        let err = |e: crate::GemmError| format!("winograd GEMM {xi}: {e}");
        let a = MatRef::row_major(
            &weights.data[xi * cout * cin..][..cout * cin],
            cout,
            cin,
            cin,
        )
        .map_err(err)?;
        let b = MatRef::row_major(&v[xi * cin * tiles..][..cin * tiles], cin, tiles, tiles)
            .map_err(err)?;
        let c = MatMut::row_major(c, cout, tiles, tiles).map_err(err)?;
        sgemm(1.0, a, BRef::Mat(b), 0.0, c, &Epilogue::none(), inner).map_err(err)
    };
    let outs = chunks(m, cout * tiles);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    par.run(XI, &|xi| {
        let mut c = outs[xi].lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = gemm(xi, &mut c, &Sequential) {
            failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    });
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `Y = A^T M A` per output channel and tile, then bias, residual and relu; one task per
/// output channel.
fn transform_output(
    conv: &Conv3x3<'_>,
    cout: usize,
    (oh, ow): (usize, usize),
    (th, tw): (usize, usize),
    m: &[f32],
    out: &mut [f32],
    par: &dyn Parallel,
) {
    let tiles = th * tw;
    let planes = chunks(out, oh * ow);
    par.run(cout, &|co| {
        let mut plane = planes[co].lock().unwrap_or_else(|e| e.into_inner());
        let bias = conv.bias.map_or(0.0, |b| b[co]);
        let residual = conv.residual.map(|r| &r[co * oh * ow..][..oh * ow]);
        // Per tile row: the column combinations (A^T on the 4 rows of ξ) as contiguous
        // loops over tiles, then the row combinations into a full-width output row pair
        // (stride-2 writes), then bias / residual / relu over the rows that exist.
        let span = 2 * tw;
        let mut am = vec![0f32; 2 * 4 * tw];
        let mut ys = vec![0f32; 2 * span];
        for ty in 0..th {
            let t0 = ty * tw;
            let mrow = |xi: usize| &m[(xi * cout + co) * tiles + t0..][..tw];
            for c in 0..4 {
                let (m0, m1, m2, m3) = (mrow(c), mrow(4 + c), mrow(8 + c), mrow(12 + c));
                let (top, bottom) = am.split_at_mut(4 * tw);
                let (top, bottom) = (&mut top[c * tw..][..tw], &mut bottom[c * tw..][..tw]);
                for t in 0..tw {
                    top[t] = m0[t] + m1[t] + m2[t];
                    bottom[t] = m1[t] - m2[t] - m3[t];
                }
            }
            for r in 0..2 {
                let a = &am[r * 4 * tw..][..4 * tw];
                let (c0, c1, c2, c3) = (&a[..tw], &a[tw..2 * tw], &a[2 * tw..3 * tw], &a[3 * tw..]);
                let y = &mut ys[r * span..][..span];
                for t in 0..tw {
                    y[2 * t] = c0[t] + c1[t] + c2[t];
                    y[2 * t + 1] = c1[t] - c2[t] - c3[t];
                }
            }
            for r in 0..2 {
                let oy = 2 * ty + r;
                if oy >= oh {
                    continue;
                }
                let dst = &mut plane[oy * ow..][..ow];
                let src = &ys[r * span..][..ow];
                match residual {
                    Some(res) => {
                        let res = &res[oy * ow..][..ow];
                        for x in 0..ow {
                            dst[x] = src[x] + bias + res[x];
                        }
                    }
                    None => {
                        for x in 0..ow {
                            dst[x] = src[x] + bias;
                        }
                    }
                }
                if conv.relu {
                    for v in dst.iter_mut() {
                        // `x < 0 ? 0 : x` keeps NaN, like the reference's relu.
                        if *v < 0.0 {
                            *v = 0.0;
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScopedThreads;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Direct convolution in f64, with the absolute-product sum for the tolerance.
    #[allow(clippy::too_many_arguments)]
    fn direct(
        x: &[f32],
        wts: &[f32],
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        pads: [usize; 4],
        bias: Option<&[f32]>,
        residual: Option<&[f32]>,
        relu: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
        let mut y = vec![0f64; cout * oh * ow];
        let mut mag = vec![0f64; cout * oh * ow];
        for co in 0..cout {
            for oy in 0..oh {
                for ox in 0..ow {
                    let i = (co * oh + oy) * ow + ox;
                    let mut s = bias.map_or(0.0, |b| b[co] as f64);
                    let mut a = s.abs();
                    for ci in 0..cin {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let iy = oy as isize + ky as isize - pads[0] as isize;
                                let ix = ox as isize + kx as isize - pads[1] as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= w {
                                    continue;
                                }
                                let p = x[(ci * h + iy as usize) * w + ix as usize] as f64
                                    * wts[((co * cin + ci) * 3 + ky) * 3 + kx] as f64;
                                s += p;
                                a += p.abs();
                            }
                        }
                    }
                    if let Some(r) = residual {
                        s += r[i] as f64;
                        a += (r[i] as f64).abs();
                    }
                    y[i] = if relu { s.max(0.0) } else { s };
                    mag[i] = a;
                }
            }
        }
        (y, mag)
    }

    fn case(cin: usize, cout: usize, h: usize, w: usize, pads: [usize; 4], epi: bool) {
        let x = data(cin * h * w, 1);
        let wts = data(cout * cin * 9, 2);
        let bias = data(cout, 3);
        let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
        let res = data(cout * oh * ow, 4);
        let conv = Conv3x3 {
            input: &x,
            h,
            w,
            pads,
            bias: epi.then_some(&bias[..]),
            residual: epi.then_some(&res[..]),
            relu: epi,
        };
        let ww = WinogradWeights::new(&wts, cout, cin).unwrap();
        let mut out = vec![f32::NAN; cout * oh * ow];
        let mut scratch = WinogradScratch::default();
        conv3x3(&conv, &ww, &mut out, &mut scratch, &ScopedThreads::new(3)).unwrap();
        let (want, mag) = direct(
            &x,
            &wts,
            (cin, cout),
            (h, w),
            pads,
            conv.bias,
            conv.residual,
            epi,
        );
        for i in 0..out.len() {
            // The transforms add a few roundings per term on top of the summation's.
            let tol = 16.0 * f32::EPSILON as f64 * mag[i] + 1e-6;
            assert!(
                (out[i] as f64 - want[i]).abs() <= tol,
                "{cin}->{cout} {h}x{w} pads {pads:?}: out[{i}] = {}, want {}",
                out[i],
                want[i]
            );
        }
    }

    #[test]
    fn matches_direct_convolution() {
        case(3, 5, 8, 8, [1, 1, 1, 1], false);
        case(4, 6, 7, 9, [1, 1, 1, 1], true); // odd output sizes: partial tiles
        case(2, 3, 5, 6, [0, 0, 0, 0], true); // no padding
        case(16, 8, 14, 14, [1, 1, 1, 1], true);
        case(1, 1, 3, 3, [0, 0, 0, 0], false); // one output
        case(5, 7, 6, 4, [2, 1, 0, 1], true); // uneven padding
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(WinogradWeights::new(&[0.0; 17], 1, 2)
            .unwrap_err()
            .contains("needs 18"));
        let ww = WinogradWeights::new(&[0.0; 18], 1, 2).unwrap();
        let x = [0.0; 2 * 4 * 4];
        let conv = Conv3x3 {
            input: &x,
            h: 4,
            w: 4,
            pads: [1; 4],
            bias: None,
            residual: None,
            relu: false,
        };
        let mut s = WinogradScratch::default();
        let e = conv3x3(&conv, &ww, &mut [0.0; 15], &mut s, &Sequential).unwrap_err();
        assert!(e.contains("output holds 15"), "{e}");
        let tiny = Conv3x3 {
            h: 1,
            w: 1,
            pads: [0; 4],
            input: &x[..2],
            ..conv
        };
        assert!(conv3x3(&tiny, &ww, &mut [], &mut s, &Sequential)
            .unwrap_err()
            .contains("smaller than the 3x3"));
    }
}
