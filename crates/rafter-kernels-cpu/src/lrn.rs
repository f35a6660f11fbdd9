//! Local response normalisation across channels (ONNX LRN, as AlexNet and GoogLeNet place
//! it between convolutions) over NC... f32 tensors, channel rows split over [`Parallel`].
//!
//! `y[n,c,s] = x[n,c,s] / (bias + alpha / size * sum(x[n,k,s]^2))^beta` for the channels
//! `k` in `c - floor((size-1)/2) ..= c + ceil((size-1)/2)` clipped to the tensor. One task
//! owns whole output rows (one channel's spatial plane), sums the window's squares row by
//! row (contiguous, so the loops vectorise) and scales. Sums are f32 where the reference
//! executor sums in f64: results agree to a few ulp. `beta` 0.75 (every published model's)
//! and 0.5 take `sqrt`s, which vectorise; others take `powf`.

use crate::common::{check_len, par_blocks, Disjoint, KernelError};
use crate::Parallel;

/// The LRN's attributes (ONNX's names and defaults are the caller's business).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lrn {
    /// The sum of squares' scale (divided by `size`, as ONNX defines it).
    pub alpha: f32,
    /// The denominator's exponent.
    pub beta: f32,
    /// Added to the scaled sum before the exponent.
    pub bias: f32,
    /// The window's length in channels (positive).
    pub size: usize,
}

/// LRN of `x` (`batch` x `channels` x `spatial`, row-major) into `y` (same shape).
pub fn lrn(
    x: &[f32],
    y: &mut [f32],
    batch: usize,
    channels: usize,
    spatial: usize,
    p: &Lrn,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let len = batch * channels * spatial;
    check_len("lrn input", x.len(), len)?;
    check_len("lrn output", y.len(), len)?;
    if p.size == 0 {
        return Err(KernelError::Shape {
            what: "lrn".into(),
            detail: "size must be positive".into(),
        });
    }
    let (below, above) = ((p.size - 1) / 2, p.size / 2);
    let scale = p.alpha / p.size as f32;
    let out = Disjoint::new(y);
    par_blocks(par, batch * channels, spatial * p.size, &|rows| {
        let mut sum = vec![0f32; spatial];
        for row in rows {
            let (n, c) = (row / channels, row % channels);
            let plane = |k: usize| &x[(n * channels + k) * spatial..][..spatial];
            sum.fill(0.0);
            for k in c.saturating_sub(below)..=(c + above).min(channels - 1) {
                for (s, &v) in sum.iter_mut().zip(plane(k)) {
                    *s += v * v;
                }
            }
            // SAFETY: `par_blocks` hands each task disjoint row ranges, and row `row`'s
            // output plane is `row * spatial ..` of `y`.
            let yr = unsafe { out.part(row * spatial..(row + 1) * spatial) };
            scale_row(plane(c), &sum, yr, p.bias, scale, p.beta);
        }
    });
    Ok(())
}

/// `y = x * (bias + scale * sum)^-beta`.
fn scale_row(x: &[f32], sum: &[f32], y: &mut [f32], bias: f32, scale: f32, beta: f32) {
    let it = y.iter_mut().zip(x).zip(sum);
    if beta == 0.75 {
        for ((y, &x), &s) in it {
            let d = bias + scale * s;
            let r = d.sqrt();
            *y = x / (r * r.sqrt());
        }
    } else if beta == 0.5 {
        for ((y, &x), &s) in it {
            *y = x / (bias + scale * s).sqrt();
        }
    } else {
        for ((y, &x), &s) in it {
            *y = x / (bias + scale * s).powf(beta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sequential;

    /// ONNX's definition in f64, written out by the loop the spec gives.
    fn reference(x: &[f32], n: usize, c: usize, s: usize, p: &Lrn) -> Vec<f32> {
        let (below, above) = ((p.size - 1) / 2, p.size / 2);
        let mut y = vec![0.0; x.len()];
        for b in 0..n {
            for ch in 0..c {
                for i in 0..s {
                    let at = |k: usize| x[(b * c + k) * s + i] as f64;
                    let lo = ch.saturating_sub(below);
                    let hi = (ch + above).min(c - 1);
                    let sq: f64 = (lo..=hi).map(|k| at(k) * at(k)).sum();
                    let d = p.bias as f64 + p.alpha as f64 / p.size as f64 * sq;
                    y[(b * c + ch) * s + i] = (at(ch) / d.powf(p.beta as f64)) as f32;
                }
            }
        }
        y
    }

    fn data(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect()
    }

    #[test]
    fn matches_the_definition_for_every_window_and_beta() {
        let (n, c, s) = (2, 7, 13);
        let x = data(n * c * s);
        for size in [1, 2, 3, 4, 5, 9] {
            for beta in [0.75, 0.5, 0.6, 1.0] {
                let p = Lrn {
                    alpha: 0.3,
                    beta,
                    bias: 1.5,
                    size,
                };
                let mut y = vec![f32::NAN; x.len()];
                lrn(&x, &mut y, n, c, s, &p, &Sequential).unwrap();
                let want = reference(&x, n, c, s, &p);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                        "size {size} beta {beta} at {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn threads_split_rows_without_changing_results() {
        let (n, c, s) = (1, 64, 56 * 56);
        let x = data(n * c * s);
        let p = Lrn {
            alpha: 1e-4,
            beta: 0.75,
            bias: 2.0,
            size: 5,
        };
        let mut one = vec![0.0; x.len()];
        lrn(&x, &mut one, n, c, s, &p, &Sequential).unwrap();
        let pool = crate::WorkerPool::new(3).unwrap();
        let mut many = vec![0.0; x.len()];
        lrn(&x, &mut many, n, c, s, &p, &pool).unwrap();
        assert_eq!(one, many);
    }

    #[test]
    fn bad_lengths_and_sizes_are_errors() {
        let p = Lrn {
            alpha: 1.0,
            beta: 0.75,
            bias: 1.0,
            size: 3,
        };
        let e = lrn(&[0.0; 5], &mut [0.0; 6], 1, 2, 3, &p, &Sequential).unwrap_err();
        assert!(e.to_string().contains("lrn input"), "{e}");
        let zero = Lrn { size: 0, ..p };
        let e = lrn(&[0.0; 6], &mut [0.0; 6], 1, 2, 3, &zero, &Sequential).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
    }
}
