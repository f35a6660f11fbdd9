//! Layer norm and RMS norm over the last axis of row-major f32 rows (BERT's 768-wide
//! hidden rows, LLaMA-style RMS norms), rows split over [`Parallel`].
//!
//! Statistics match the reference executor (ONNX LayerNormalization computed in f64): each
//! row's sum and sum of squared deviations are accumulated in f64 lanes (one pass, shifted
//! by the row's first element so the squares do not cancel), so mean and `1/sqrt(var +
//! eps)` are the reference's to f64 rounding. The normalisation itself runs in f32 vector
//! FMAs, `((x - mean) * inv) * gamma + beta`: three roundings where the reference has one,
//! so results agree to a few ulp (tests hold them within 1e-6 relative of the largest term).

use crate::common::{check_isa, check_len, par_blocks, Disjoint, KernelError};
use crate::simd::Simd;
use crate::{Isa, Parallel};

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` per `cols`-element row of `x`
/// (biased variance, as ONNX), on the fastest ISA.
pub fn layer_norm(
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    layer_norm_with_isa(Isa::detect(), x, y, cols, gamma, beta, eps, par)
}

/// [`layer_norm`] on a given ISA.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_with_isa(
    isa: Isa,
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let rows = check_layer_norm(isa, x, y, cols, gamma, beta)?;
    let out = Disjoint::new(y);
    par_blocks(par, rows, cols, &|rs| {
        // SAFETY: `par_blocks` hands out disjoint row ranges.
        let yb = unsafe { out.part(rs.start * cols..rs.end * cols) };
        let xb = &x[rs.start * cols..rs.end * cols];
        layer_norm_isa(isa, xb, yb, cols, gamma, beta, eps as f64);
    });
    Ok(())
}

/// [`layer_norm`] of `x + addends[0] + addends[1] + ...`, the sum never stored: BERT's
/// embedding layer norm, which first adds the word, token-type and position embeddings.
/// Each addend repeats over `x`'s leading elements (a position embedding `[S, H]` added to
/// every batch entry of `[B, S, H]`): `x`'s length is a whole number of its lengths, and
/// its length a whole number of rows or a row a whole number of it. Each row is summed in
/// the addends' order, each add rounded to f32 as separate adds round, in a buffer of the
/// task's own, so the result is bitwise [`layer_norm`] of the summed tensor. Summing first
/// on one thread into a fresh tensor-sized buffer took BERT-base's 128x768 embedding norm
/// 5.5x a plain norm's time on a 2-core Xeon (128 against 23 us; `rafter bench
/// --device cpu --iters 200 --estimate` of a graph of two Adds and a LayerNormalization
/// over `[1, 128, 768]`, the kernel's traced median; 68 us with this).
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm(
    x: &[f32],
    addends: &[&[f32]],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    add_layer_norm_with_isa(Isa::detect(), x, addends, y, cols, gamma, beta, eps, par)
}

/// [`add_layer_norm`] on a given ISA.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm_with_isa(
    isa: Isa,
    x: &[f32],
    addends: &[&[f32]],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let rows = check_layer_norm(isa, x, y, cols, gamma, beta)?;
    for (i, a) in addends.iter().enumerate() {
        let n = a.len();
        let repeats = n > 0
            && x.len().is_multiple_of(n)
            && (n.is_multiple_of(cols) || cols.is_multiple_of(n));
        if !repeats && !x.is_empty() {
            return Err(KernelError::Shape {
                what: format!("layer norm addend {i}"),
                detail: format!(
                    "{n} elements do not repeat over {} in rows of {cols}",
                    x.len()
                ),
            });
        }
    }
    let out = Disjoint::new(y);
    par_blocks(par, rows, cols, &|rs| {
        // SAFETY: `par_blocks` hands out disjoint row ranges.
        let yb = unsafe { out.part(rs.start * cols..rs.end * cols) };
        let mut row = vec![0f32; cols];
        for (r, yr) in rs.zip(yb.chunks_exact_mut(cols)) {
            let start = r * cols;
            row.copy_from_slice(&x[start..start + cols]);
            for a in addends {
                add_repeating(&mut row, a, start);
            }
            layer_norm_isa(isa, &row, yr, cols, gamma, beta, eps as f64);
        }
    });
    Ok(())
}

/// `row += a` where `row` starts at element `start` of a tensor `a` repeats over: a
/// slice of `a` when it holds whole rows, else `a` over and over (a row holds whole
/// copies of it, [`add_layer_norm_with_isa`] checked).
fn add_repeating(row: &mut [f32], a: &[f32], start: usize) {
    if a.len() >= row.len() {
        let (off, len) = (start % a.len(), row.len());
        for (s, v) in row.iter_mut().zip(&a[off..off + len]) {
            *s += v;
        }
    } else {
        for part in row.chunks_exact_mut(a.len()) {
            for (s, v) in part.iter_mut().zip(a) {
                *s += v;
            }
        }
    }
}

/// `y = x / sqrt(mean(x^2) + eps) * gamma` per `cols`-element row, on the fastest ISA.
pub fn rms_norm(
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    rms_norm_with_isa(Isa::detect(), x, y, cols, gamma, eps, par)
}

/// [`rms_norm`] on a given ISA.
pub fn rms_norm_with_isa(
    isa: Isa,
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    eps: f32,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let rows = check_rows("rms norm", x, y, cols)?;
    check_len("rms norm gamma", gamma.len(), cols)?;
    let out = Disjoint::new(y);
    par_blocks(par, rows, cols, &|rs| {
        // SAFETY: `par_blocks` hands out disjoint row ranges.
        let yb = unsafe { out.part(rs.start * cols..rs.end * cols) };
        let xb = &x[rs.start * cols..rs.end * cols];
        rms_norm_isa(isa, xb, yb, cols, gamma, eps as f64);
    });
    Ok(())
}

/// The checks every layer norm makes of its operands; its number of rows.
fn check_layer_norm(
    isa: Isa,
    x: &[f32],
    y: &[f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
) -> Result<usize, KernelError> {
    check_isa(isa)?;
    let rows = check_rows("layer norm", x, y, cols)?;
    check_len("layer norm gamma", gamma.len(), cols)?;
    if let Some(b) = beta {
        check_len("layer norm beta", b.len(), cols)?;
    }
    Ok(rows)
}

fn check_rows(what: &str, x: &[f32], y: &[f32], cols: usize) -> Result<usize, KernelError> {
    check_len(&format!("{what} output"), y.len(), x.len())?;
    if cols == 0 {
        return if x.is_empty() {
            Ok(0)
        } else {
            Err(KernelError::Shape {
                what: format!("{what} input"),
                detail: format!("{} elements in rows of 0", x.len()),
            })
        };
    }
    if !x.len().is_multiple_of(cols) {
        return Err(KernelError::Shape {
            what: format!("{what} input"),
            detail: format!(
                "{} elements is not a whole number of {cols}-element rows",
                x.len()
            ),
        });
    }
    Ok(x.len() / cols)
}

simd_dispatch!(fn layer_norm_isa(
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f64,
) => layer_norm_generic);

#[inline(always)]
fn layer_norm_generic<S: Simd>(
    s: S,
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f64,
) {
    let n = cols as f64;
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        // Shifted sums: sum (x - k)^2 - (sum (x - k))^2 / n is n * var without the
        // cancellation of sum x^2 - n mean^2 when |mean| >> std.
        let k = xr[0] as f64;
        let (sum, sq) = s.sums_f64(xr, k);
        let d = sum - n * k;
        let mean = sum / n;
        let var = ((sq - d * d / n) / n).max(0.0);
        let inv = 1.0 / (var + eps).sqrt();
        // The mean in two f32 parts: `x - hi` is exact when x is near the mean (Sterbenz),
        // so a mean much larger than the spread loses nothing to its own rounding.
        let hi = mean as f32;
        let (vm, vl, vi) = (
            s.splat(hi),
            s.splat((mean - hi as f64) as f32),
            s.splat(inv as f32),
        );
        let mut i = 0;
        while i + S::LANES <= cols {
            let t = s.mul(s.sub(s.sub(s.load(&xr[i..]), vm), vl), vi);
            let b = beta.map_or(s.splat(0.0), |b| s.load(&b[i..]));
            s.store(&mut yr[i..], s.fma(t, s.load(&gamma[i..]), b));
            i += S::LANES;
        }
        if i < cols {
            let t = s.mul(s.sub(s.sub(s.load_partial(&xr[i..], 0.0), vm), vl), vi);
            let b = beta.map_or(s.splat(0.0), |b| s.load_partial(&b[i..], 0.0));
            let v = s.fma(t, s.load_partial(&gamma[i..], 0.0), b);
            s.store_partial(&mut yr[i..], v);
        }
    }
}

simd_dispatch!(fn rms_norm_isa(
    x: &[f32],
    y: &mut [f32],
    cols: usize,
    gamma: &[f32],
    eps: f64,
) => rms_norm_generic);

#[inline(always)]
fn rms_norm_generic<S: Simd>(s: S, x: &[f32], y: &mut [f32], cols: usize, gamma: &[f32], eps: f64) {
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        let (_, sq) = s.sums_f64(xr, 0.0);
        let vi = s.splat((1.0 / (sq / cols as f64 + eps).sqrt()) as f32);
        let mut i = 0;
        while i + S::LANES <= cols {
            let g = s.mul(s.load(&gamma[i..]), vi);
            s.store(&mut yr[i..], s.mul(s.load(&xr[i..]), g));
            i += S::LANES;
        }
        if i < cols {
            let g = s.mul(s.load_partial(&gamma[i..], 0.0), vi);
            let v = s.mul(s.load_partial(&xr[i..], 0.0), g);
            s.store_partial(&mut yr[i..], v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::{ScopedThreads, Sequential};

    fn data(n: usize, seed: u32, scale: f32, offset: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(97));
                ((h >> 8) % 20_001) as f32 / 10_000.0 * scale - scale + offset
            })
            .collect()
    }

    /// The reference executor's layer norm: f64 two-pass, one rounding.
    fn naive_ln(x: &[f32], cols: usize, g: &[f32], b: Option<&[f32]>, eps: f32) -> Vec<f32> {
        let mut y = vec![];
        for row in x.chunks(cols) {
            let n = cols as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps as f64).sqrt();
            y.extend(row.iter().enumerate().map(|(j, &v)| {
                ((v as f64 - mean) * inv * g[j] as f64 + b.map_or(0.0, |b| b[j] as f64)) as f32
            }));
        }
        y
    }

    fn naive_rms(x: &[f32], cols: usize, g: &[f32], eps: f32) -> Vec<f32> {
        let mut y = vec![];
        for row in x.chunks(cols) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            y.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| (v as f64 * (inv * g[j] as f64)) as f32),
            );
        }
        y
    }

    /// Within `tol` relative of the larger of the result and the row's scale `s`.
    fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "{what}: element {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn layer_norm_matches_reference_numerics() {
        for isa in isas() {
            for cols in [1, 5, 16, 17, 33, 100, 768, 771] {
                for (scale, offset) in [(1.0, 0.0), (1e-3, 5.0), (100.0, -3.0), (1.0, 1e3)] {
                    let x = data(cols * 4, cols as u32, scale, offset);
                    let g = data(cols, 3, 1.0, 1.0);
                    let b = data(cols, 4, 0.5, 0.0);
                    let mut y = vec![0.0; x.len()];
                    layer_norm_with_isa(isa, &x, &mut y, cols, &g, Some(&b), 1e-12, &Sequential)
                        .unwrap();
                    let what = format!("{isa:?} {cols} {scale} {offset}");
                    close(&y, &naive_ln(&x, cols, &g, Some(&b), 1e-12), 2e-6, &what);
                    layer_norm_with_isa(
                        isa,
                        &x,
                        &mut y,
                        cols,
                        &g,
                        None,
                        1e-5,
                        &ScopedThreads::new(2),
                    )
                    .unwrap();
                    close(&y, &naive_ln(&x, cols, &g, None, 1e-5), 2e-6, &what);
                }
            }
        }
    }

    #[test]
    fn add_layer_norm_is_layer_norm_of_the_sum_bitwise() {
        for isa in isas() {
            let (batch, seq, cols) = (2, 5, 33);
            let n = batch * seq * cols;
            let x = data(n, 1, 2.0, 0.5);
            let word = data(n, 2, 1.0, 0.0);
            // A position embedding [seq, cols] repeating over the batch, and one shorter
            // than a row (a row holds three copies of it).
            let position = data(seq * cols, 3, 0.5, 0.1);
            let short = data(11, 4, 0.25, 0.0);
            let g = data(cols, 5, 1.0, 1.0);
            let b = data(cols, 6, 0.5, 0.0);
            let mut sum = x.clone();
            for (i, s) in sum.iter_mut().enumerate() {
                *s += word[i];
                *s += position[i % position.len()];
                *s += short[i % short.len()];
            }
            let mut want = vec![0.0; n];
            layer_norm_with_isa(isa, &sum, &mut want, cols, &g, Some(&b), 1e-12, &Sequential)
                .unwrap();
            for threads in [1, 3] {
                let mut y = vec![0.0; n];
                let addends = [&word[..], &position[..], &short[..]];
                let par = ScopedThreads::new(threads);
                add_layer_norm_with_isa(isa, &x, &addends, &mut y, cols, &g, Some(&b), 1e-12, &par)
                    .unwrap();
                assert_eq!(y, want, "{isa:?} on {threads} threads");
            }
            // No addends: the plain norm.
            let mut y = vec![0.0; n];
            add_layer_norm_with_isa(
                isa,
                &sum,
                &[],
                &mut y,
                cols,
                &g,
                Some(&b),
                1e-12,
                &Sequential,
            )
            .unwrap();
            assert_eq!(y, want, "{isa:?} without addends");
        }
    }

    #[test]
    fn an_addend_that_does_not_repeat_over_the_rows_is_an_error() {
        let x = vec![0.0; 24];
        let mut y = vec![0.0; 24];
        let g = [1.0; 6];
        // 4 elements neither hold whole 6-element rows nor fit a row whole times.
        let e =
            add_layer_norm(&x, &[&[0.0; 4]], &mut y, 6, &g, None, 1e-5, &Sequential).unwrap_err();
        assert!(e.to_string().contains("layer norm addend 0"), "{e}");
        // 18 elements hold whole rows but do not repeat over 24.
        let e = add_layer_norm(
            &x,
            &[&[0.0; 6], &[0.0; 18]],
            &mut y,
            6,
            &g,
            None,
            1e-5,
            &Sequential,
        )
        .unwrap_err();
        assert!(e.to_string().contains("layer norm addend 1"), "{e}");
        let e = add_layer_norm(&x, &[&[]], &mut y, 6, &g, None, 1e-5, &Sequential).unwrap_err();
        assert!(e.to_string().contains("addend 0"), "{e}");
    }

    #[test]
    fn constant_rows_normalise_to_beta() {
        for isa in isas() {
            let x = vec![7.25f32; 2 * 19];
            let g = vec![2.0; 19];
            let b: Vec<f32> = (0..19).map(|i| i as f32).collect();
            let mut y = vec![1.0; x.len()];
            layer_norm_with_isa(isa, &x, &mut y, 19, &g, Some(&b), 1e-5, &Sequential).unwrap();
            assert_eq!(&y[19..], &b[..], "{isa:?}");
        }
    }

    #[test]
    fn rms_norm_matches_reference_numerics() {
        for isa in isas() {
            for cols in [1, 7, 16, 31, 768, 4097] {
                let x = data(cols * 3, cols as u32 + 1, 3.0, 0.5);
                let g = data(cols, 5, 1.0, 0.0);
                let mut y = vec![0.0; x.len()];
                rms_norm_with_isa(isa, &x, &mut y, cols, &g, 1e-6, &ScopedThreads::new(2)).unwrap();
                close(
                    &y,
                    &naive_rms(&x, cols, &g, 1e-6),
                    1e-6,
                    &format!("{isa:?} {cols}"),
                );
            }
        }
    }

    #[test]
    fn bad_operands_are_errors() {
        let x = vec![0.0; 12];
        let mut y = vec![0.0; 12];
        let e = layer_norm(&x, &mut y, 4, &[1.0; 3], None, 1e-5, &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("layer norm gamma: expected 4 elements, got 3"),
            "{e}"
        );
        let e = layer_norm(&x, &mut y, 4, &[1.0; 4], Some(&[0.0; 5]), 1e-5, &Sequential);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("beta: expected 4 elements, got 5"));
        let e = rms_norm(&x, &mut y[..8], 4, &[1.0; 4], 1e-5, &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("rms norm output: expected 12 elements, got 8"),
            "{e}"
        );
        let e = rms_norm(&x, &mut y, 5, &[1.0; 5], 1e-5, &Sequential).unwrap_err();
        assert!(
            e.to_string().contains("whole number of 5-element rows"),
            "{e}"
        );
    }
}
