//! Softmax over the last axis of row-major f32 rows, with an optional additive mask
//! broadcast along the rows: the `add(scores, mask) -> softmax` body of every transformer
//! attention (scores `[batch, heads, q, k]`, mask `[batch, 1, 1, k]`), fused so the sum
//! `scores + mask` is never written out.
//!
//! Per row, three passes over a row that stays in L1 (a 128-key row is 512 bytes): `t = x +
//! mask` and its maximum; `e = exp(t - max)` and its sum; `e * (1 / sum)`. Subtracting the
//! maximum keeps `exp` in range for any scores. `exp` is `simd`'s polynomial (at
//! most 2 ulp), the sum is accumulated in f32 across vector lanes (16 partial sums per
//! AVX-512, 32 with the two accumulators), so results are within 4 ulp of the reference
//! executor's f64 softmax, plus `|x - max| 2^-24` relative from rounding `x - max` to f32
//! (measured in the tests). Probabilities below `f32::MIN_POSITIVE` (1.2e-38) come out as
//! 0: `exp` flushes denormal results (they cost a microcode assist each).
//!
//! Edge cases as the reference: a row whose every `x + mask` is `-inf` is all NaN (the
//! maximum is `-inf`, `-inf - -inf` is NaN); a NaN anywhere in a row makes the row NaN;
//! `-inf` entries of a row with a finite maximum get exactly 0.

use crate::common::{check_isa, check_len, par_blocks, Disjoint, KernelError};
use crate::simd::{exp, Simd};
use crate::{Isa, Parallel};

/// An additive mask broadcast over the rows of a softmax.
///
/// The rows of the softmax input are indexed by a multi-index `(i_0, .., i_{r-1})` over
/// `row_dims` (for scores `[b, h, q, k]`: `row_dims = [b, h, q]`, the row length is `k`).
/// Mask element `j` of row `i` is `data[sum_d i_d * strides[d] + j]`: stride 0 broadcasts
/// the mask along that dim. [`RowMask::broadcast`] derives the strides from NumPy
/// broadcasting of a mask shape.
#[derive(Clone, Debug)]
pub struct RowMask<'a> {
    data: &'a [f32],
    row_dims: Vec<usize>,
    strides: Vec<usize>,
    cols: usize,
}

impl<'a> RowMask<'a> {
    /// A mask with explicit per-row-dim strides (in elements). Checks that every row the
    /// softmax reads lies inside `data`.
    pub fn new(
        data: &'a [f32],
        row_dims: &[usize],
        strides: &[usize],
        cols: usize,
    ) -> Result<Self, KernelError> {
        if row_dims.len() != strides.len() {
            return Err(KernelError::Shape {
                what: "softmax mask".into(),
                detail: format!(
                    "{} row dims {row_dims:?} but {} strides {strides:?}",
                    row_dims.len(),
                    strides.len()
                ),
            });
        }
        if row_dims.contains(&0) || cols == 0 {
            return Ok(RowMask {
                data,
                row_dims: row_dims.to_vec(),
                strides: strides.to_vec(),
                cols,
            });
        }
        let last = row_dims
            .iter()
            .zip(strides)
            .try_fold(cols, |acc, (&d, &s)| {
                (d - 1).checked_mul(s).and_then(|v| v.checked_add(acc))
            });
        match last {
            Some(need) if need <= data.len() => Ok(RowMask {
                data,
                row_dims: row_dims.to_vec(),
                strides: strides.to_vec(),
                cols,
            }),
            _ => Err(KernelError::Shape {
                what: "softmax mask".into(),
                detail: format!(
                    "rows {row_dims:?} with strides {strides:?} and {cols} columns need {} \
                     elements, the mask has {}",
                    last.map_or("too many".to_string(), |n| n.to_string()),
                    data.len()
                ),
            }),
        }
    }

    /// A row-major mask of shape `mask_dims`, NumPy-broadcast against rows `row_dims`
    /// (dims right-aligned; a mask dim of 1 broadcasts). Its last dim must be the row
    /// length `cols` (a mask broadcast along the keys is not supported).
    /// E.g. scores `[1, 12, 128, 128]`, mask `[1, 1, 1, 128]`: `row_dims = [1, 12, 128]`,
    /// `mask_dims = [1, 1, 1, 128]`.
    pub fn broadcast(
        data: &'a [f32],
        row_dims: &[usize],
        mask_dims: &[usize],
        cols: usize,
    ) -> Result<Self, KernelError> {
        let shape_err = |detail: String| KernelError::Shape {
            what: "softmax mask".into(),
            detail,
        };
        let n: usize = mask_dims.iter().product();
        check_len("softmax mask", data.len(), n)?;
        let Some((&last, outer)) = mask_dims.split_last() else {
            return Err(shape_err(
                "a scalar mask; expected at least the key axis".into(),
            ));
        };
        if last != cols {
            return Err(shape_err(format!(
                "mask {mask_dims:?} has {last} keys, rows have {cols}"
            )));
        }
        if outer.len() > row_dims.len() {
            return Err(shape_err(format!(
                "mask {mask_dims:?} has more dims than rows {row_dims:?} plus the key axis"
            )));
        }
        // Row-major strides of the mask's outer dims, right-aligned against row_dims.
        let mut strides = vec![0usize; row_dims.len()];
        let mut stride = cols;
        let off = row_dims.len() - outer.len();
        for (k, &d) in outer.iter().enumerate().rev() {
            let rd = row_dims[off + k];
            if d == rd && d != 1 {
                strides[off + k] = stride;
            } else if d != 1 {
                return Err(shape_err(format!(
                    "mask {mask_dims:?} does not broadcast to rows {row_dims:?}"
                )));
            }
            stride *= d;
        }
        RowMask::new(data, row_dims, &strides, cols)
    }

    fn rows(&self) -> usize {
        self.row_dims.iter().product()
    }

    /// The mask row of softmax row `r`.
    fn row(&self, mut r: usize, cols: usize) -> &[f32] {
        let mut off = 0;
        for (&d, &s) in self.row_dims.iter().zip(&self.strides).rev() {
            off += (r % d) * s;
            r /= d;
        }
        &self.data[off..off + cols]
    }
}

/// `y[r] = softmax(x[r] + mask[r])` for each `cols`-element row `r` of `x`, on the
/// fastest ISA, rows split over `par`.
pub fn softmax(
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    softmax_with_isa(Isa::detect(), x, y, cols, mask, par)
}

/// [`softmax`] in place: `x[r] = softmax(x[r] + mask[r])`.
pub fn softmax_in_place(
    x: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(Isa::detect())?;
    run(Isa::detect(), None, x, cols, mask, par)
}

/// [`softmax`] on a given ISA (tests hold every path to the reference; benches compare).
pub fn softmax_with_isa(
    isa: Isa,
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    check_len("softmax output", y.len(), x.len())?;
    run(isa, Some(x), y, cols, mask, par)
}

fn run(
    isa: Isa,
    x: Option<&[f32]>,
    y: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    if cols == 0 {
        return if y.is_empty() {
            Ok(())
        } else {
            Err(KernelError::Shape {
                what: "softmax input".into(),
                detail: format!("{} elements in rows of 0", y.len()),
            })
        };
    }
    if !y.len().is_multiple_of(cols) {
        return Err(KernelError::Shape {
            what: "softmax input".into(),
            detail: format!(
                "{} elements is not a whole number of {cols}-element rows",
                y.len()
            ),
        });
    }
    let rows = y.len() / cols;
    if let Some(m) = mask {
        check_len("softmax mask rows", m.rows(), rows)?;
        check_len("softmax mask row", m.cols, cols)?;
    }
    let out = Disjoint::new(y);
    par_blocks(par, rows, cols, &|rs| {
        // SAFETY: `par_blocks` hands out disjoint row ranges.
        let yb = unsafe { out.part(rs.start * cols..rs.end * cols) };
        let xb = x.map(|x| &x[rs.start * cols..rs.end * cols]);
        rows_isa(isa, xb, yb, cols, mask, rs.start);
    });
    Ok(())
}

simd_dispatch!(fn rows_isa(
    x: Option<&[f32]>,
    y: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    row0: usize,
) => rows_generic);

/// Pass 1 of a row: `y[i..i+LANES] = t(i)` and the running maximum; `t` and `tail` (the
/// partial last vector, `fill` past the end) are expressions in `i` (and `fill`). A macro
/// so that the loads compile inside the `#[target_feature]` function (see
/// `map_in_place!`).
macro_rules! add_max {
    ($s:ident, $y:expr, |$i:ident| $t:expr, |$ti:ident, $fill:ident| $tail:expr) => {{
        let y: &mut [f32] = $y;
        let n = y.len();
        let lanes = $crate::simd::lanes($s);
        let mut vmax = $s.splat(f32::NEG_INFINITY);
        let mut $i = 0;
        while $i + lanes <= n {
            let v = $t;
            $s.store(&mut y[$i..], v);
            vmax = $s.max(vmax, v);
            $i += lanes;
        }
        if $i < n {
            let ($ti, $fill) = ($i, f32::NEG_INFINITY);
            let v = $tail;
            $s.store_partial(&mut y[$ti..], v);
            vmax = $s.max(vmax, v);
        }
        $s.reduce_max(vmax)
    }};
}

#[inline(always)]
fn rows_generic<S: Simd>(
    s: S,
    x: Option<&[f32]>,
    y: &mut [f32],
    cols: usize,
    mask: Option<&RowMask<'_>>,
    row0: usize,
) {
    for (r, yr) in y.chunks_exact_mut(cols).enumerate() {
        let m = mask.map(|m| m.row(row0 + r, cols));
        let xr = x.map(|x| &x[r * cols..(r + 1) * cols]);
        let max = match (xr, m) {
            (Some(xr), Some(m)) => add_max!(
                s,
                yr,
                |i| s.add(s.load(&xr[i..]), s.load(&m[i..])),
                |i, f| s.add(s.load_partial(&xr[i..], f), s.load_partial(&m[i..], f))
            ),
            (Some(xr), None) => add_max!(s, yr, |i| s.load(&xr[i..]), |i, f| s
                .load_partial(&xr[i..], f)),
            (None, Some(m)) => {
                // In place: read the row before overwriting it, one vector at a time.
                let mut vmax = s.splat(f32::NEG_INFINITY);
                let mut i = 0;
                while i + S::LANES <= cols {
                    let t = s.add(s.load(&yr[i..]), s.load(&m[i..]));
                    s.store(&mut yr[i..], t);
                    vmax = s.max(vmax, t);
                    i += S::LANES;
                }
                let mut max = s.reduce_max(vmax);
                for j in i..cols {
                    yr[j] += m[j];
                    max = if yr[j] > max { yr[j] } else { max };
                }
                max
            }
            (None, None) => row_max(s, yr),
        };
        exp_normalise(s, yr, max);
    }
}

#[inline(always)]
fn row_max<S: Simd>(s: S, y: &[f32]) -> f32 {
    let mut c = y.chunks_exact(S::LANES);
    let mut vmax = s.splat(f32::NEG_INFINITY);
    for v in &mut c {
        vmax = s.max(vmax, s.load(v));
    }
    if !c.remainder().is_empty() {
        vmax = s.max(vmax, s.load_partial(c.remainder(), f32::NEG_INFINITY));
    }
    s.reduce_max(vmax)
}

/// `y = exp(y - max) / sum(exp(y - max))`.
#[inline(always)]
fn exp_normalise<S: Simd>(s: S, y: &mut [f32], max: f32) {
    let vm = s.splat(max);
    let (mut acc0, mut acc1) = (s.splat(0.0), s.splat(0.0));
    let mut c = y.chunks_exact_mut(2 * S::LANES);
    for v in &mut c {
        let (a, b) = v.split_at_mut(S::LANES);
        let ea = exp(s, s.sub(s.load(a), vm));
        let eb = exp(s, s.sub(s.load(b), vm));
        s.store(a, ea);
        s.store(b, eb);
        acc0 = s.add(acc0, ea);
        acc1 = s.add(acc1, eb);
    }
    let rest = c.into_remainder();
    let mut rc = rest.chunks_exact_mut(S::LANES);
    for v in &mut rc {
        let e = exp(s, s.sub(s.load(v), vm));
        s.store(v, e);
        acc0 = s.add(acc0, e);
    }
    let tail = rc.into_remainder();
    if !tail.is_empty() {
        // Lanes past the end load -inf, whose exp is exactly 0.
        let e = exp(s, s.sub(s.load_partial(tail, f32::NEG_INFINITY), vm));
        s.store_partial(tail, e);
        acc1 = s.add(acc1, e);
    }
    let inv = s.splat(1.0 / s.reduce_add(s.add(acc0, acc1)));
    let mut c = y.chunks_exact_mut(S::LANES);
    for v in &mut c {
        s.store(v, s.mul(s.load(v), inv));
    }
    let tail = c.into_remainder();
    if !tail.is_empty() {
        let v = s.mul(s.load_partial(tail, 0.0), inv);
        s.store_partial(tail, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::{ScopedThreads, Sequential};

    /// The reference executor's softmax: in f64, rounded once; and per element the
    /// tolerance: 4 ulp plus what rounding `t - max` to f32 costs (`|t - max|` 2^-24
    /// relative).
    fn naive(x: &[f32], mask: impl Fn(usize, usize) -> f32, cols: usize) -> Vec<(f32, f32)> {
        let mut y = vec![];
        for (r, row) in x.chunks(cols).enumerate() {
            let t: Vec<f64> = row
                .iter()
                .enumerate()
                .map(|(j, &v)| (v + mask(r, j)) as f64)
                .collect();
            let m = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = t.iter().map(|v| (v - m).exp()).sum();
            y.extend(t.iter().map(|v| {
                let tol = if (v - m).is_finite() {
                    6e-8 * (8.0 + (v - m).abs())
                } else {
                    0.0
                };
                (((v - m).exp() / s) as f32, tol as f32)
            }));
        }
        y
    }

    pub(crate) fn data(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((h >> 8) % 20_001) as f32 / 10_000.0 * scale - scale
            })
            .collect()
    }

    fn close(got: &[f32], want: &[(f32, f32)], what: &str) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &(w, tol))) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * w.abs() + 1e-37;
            assert!(ok, "{what}: element {i}: {g} vs {w}");
        }
    }

    #[test]
    fn matches_naive_on_odd_lengths_and_magnitudes() {
        for isa in isas() {
            for cols in [1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 128, 129] {
                for scale in [1e-3, 1.0, 30.0, 1e4] {
                    let x = data(cols * 5, cols as u32, scale);
                    let mut y = vec![0.0; x.len()];
                    softmax_with_isa(isa, &x, &mut y, cols, None, &Sequential).unwrap();
                    close(
                        &y,
                        &naive(&x, |_, _| 0.0, cols),
                        &format!("{isa:?} {cols} {scale}"),
                    );
                }
            }
        }
    }

    #[test]
    fn masks_broadcast_like_bert() {
        // scores [2, 3, 4, 19], mask [2, 1, 1, 19] with -inf and -10000 entries.
        let (b, h, q, k) = (2, 3, 4, 19);
        let x = data(b * h * q * k, 5, 4.0);
        let mut m = data(b * k, 9, 1.0);
        m[3] = f32::NEG_INFINITY;
        m[k + 7] = -10_000.0;
        m[k + 18] = f32::NEG_INFINITY;
        let mask = RowMask::broadcast(&m, &[b, h, q], &[b, 1, 1, k], k).unwrap();
        let want = naive(&x, |r, j| m[(r / (h * q)) * k + j], k);
        for isa in isas() {
            let mut y = vec![0.0; x.len()];
            softmax_with_isa(isa, &x, &mut y, k, Some(&mask), &ScopedThreads::new(3)).unwrap();
            close(&y, &want, &format!("{isa:?}"));
            assert_eq!(y[3], 0.0);
        }
        let mut y = x.clone();
        softmax_in_place(&mut y, k, Some(&mask), &Sequential).unwrap();
        close(&y, &want, "in place");
        // A per-query mask [b, 1, q, k] through explicit strides.
        let mq = data(b * q * k, 11, 2.0);
        let mask = RowMask::new(&mq, &[b, h, q], &[q * k, 0, k], k).unwrap();
        let want = naive(&x, |r, j| mq[(r / (h * q)) * q * k + (r % q) * k + j], k);
        let mut y = vec![0.0; x.len()];
        softmax(&x, &mut y, k, Some(&mask), &Sequential).unwrap();
        close(&y, &want, "per-query mask");
    }

    #[test]
    fn degenerate_rows() {
        for isa in isas() {
            // All equal: uniform. All -inf: NaN (as the reference). One +large: one-hot.
            let cols = 21;
            let mut x = vec![3.5f32; cols];
            x.extend(vec![f32::NEG_INFINITY; cols]);
            let mut hot = vec![-1e30f32; cols];
            hot[20] = 1e30;
            x.extend(hot);
            let mut y = vec![0.0; x.len()];
            softmax_with_isa(isa, &x, &mut y, cols, None, &Sequential).unwrap();
            assert!(
                y[..cols].iter().all(|&v| (v - 1.0 / 21.0).abs() < 1e-7),
                "{isa:?}"
            );
            assert!(y[cols..2 * cols].iter().all(|v| v.is_nan()), "{isa:?}");
            assert_eq!(y[3 * cols - 1], 1.0);
            assert!(y[2 * cols..3 * cols - 1].iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn bad_operands_are_errors() {
        let x = vec![0.0; 12];
        let mut y = vec![0.0; 11];
        let e = softmax(&x, &mut y, 4, None, &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("softmax output: expected 12 elements, got 11"),
            "{e}"
        );
        let mut y = vec![0.0; 12];
        let e = softmax(&x, &mut y, 5, None, &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a whole number of 5-element rows"),
            "{e}"
        );
        let m = vec![0.0; 4];
        let e = RowMask::broadcast(&m, &[3], &[1, 5], 5).unwrap_err();
        assert!(e.to_string().contains("expected 5 elements, got 4"), "{e}");
        let e = RowMask::broadcast(&m, &[3], &[2, 2], 4).unwrap_err();
        assert!(e.to_string().contains("has 2 keys, rows have 4"), "{e}");
        let e = RowMask::new(&m, &[3], &[1], 4).unwrap_err();
        assert!(
            e.to_string().contains("need 6 elements, the mask has 4"),
            "{e}"
        );
        let mask = RowMask::broadcast(&m, &[2], &[1, 4], 4).unwrap();
        let e = softmax(&x, &mut y, 4, Some(&mask), &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("mask rows: expected 3 elements, got 2"),
            "{e}"
        );
        let mask = RowMask::broadcast(&m[..2], &[6], &[1, 2], 2).unwrap();
        assert!(softmax(&x, &mut y, 2, Some(&mask), &Sequential).is_ok());
        let e = softmax(&x, &mut y, 3, Some(&mask), &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("mask rows: expected 4 elements, got 6"),
            "{e}"
        );
        let mask = RowMask::broadcast(&m, &[3], &[1, 4], 4).unwrap();
        let e = softmax(&x[..9], &mut y[..9], 3, Some(&mask), &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("mask row: expected 3 elements, got 4"),
            "{e}"
        );
    }
}
