//! Rotary position embedding over rows of heads (an LLM's queries and keys).
//!
//! Row `i` of `x` (`[rows, heads * head_dim]`) is rotated by the angles whose cosines and
//! sines are row `i` of `cos` and `sin` (`[rows, head_dim / 2]`). Pair `j` of a head is
//! elements `(j, j + head_dim/2)` ([`RopePairs::Halves`], HF's `rotate_half`, ggml's NEOX
//! mode) or `(2j, 2j + 1)` ([`RopePairs::Interleaved`], ggml's normal mode):
//! `(a, b) -> (a cos - b sin, a sin + b cos)`, in f32 as transformers computes it.

use crate::common::{par_blocks, Disjoint, KernelError};
use crate::Parallel;

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// `(j, j + head_dim / 2)`.
    Halves,
    /// `(2j, 2j + 1)`.
    Interleaved,
}

/// Rotates `x` into `y` (same length). `x` holds rows of `heads` heads of `head_dim`
/// (even) elements; `cos` and `sin` hold `head_dim / 2` angles per row.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    y: &mut [f32],
    heads: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    pairs: RopePairs,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let bad = |detail: String| KernelError::Shape {
        what: "rope".into(),
        detail,
    };
    let width = heads * head_dim;
    if width == 0 || !head_dim.is_multiple_of(2) || !x.len().is_multiple_of(width) {
        return Err(bad(format!(
            "{} elements are not rows of {heads} heads of {head_dim} (even) elements",
            x.len()
        )));
    }
    let (rows, half) = (x.len() / width, head_dim / 2);
    if cos.len() != rows * half || sin.len() != rows * half {
        return Err(bad(format!(
            "{rows} rows need cos/sin tables of {} elements, got {} and {}",
            rows * half,
            cos.len(),
            sin.len()
        )));
    }
    if y.len() != x.len() {
        return Err(KernelError::Length {
            what: "rope output".into(),
            expected: x.len(),
            got: y.len(),
        });
    }
    let out = Disjoint::new(y);
    par_blocks(par, rows, width, &|rs| {
        // SAFETY: `par_blocks` hands out disjoint row ranges.
        let yb = unsafe { out.part(rs.start * width..rs.end * width) };
        for (r, yr) in rs.clone().zip(yb.chunks_exact_mut(width)) {
            let xr = &x[r * width..(r + 1) * width];
            let (c, s) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            for (xh, yh) in xr.chunks_exact(head_dim).zip(yr.chunks_exact_mut(head_dim)) {
                rotate_head(xh, yh, c, s, pairs);
            }
        }
    });
    Ok(())
}

#[inline]
fn rotate_head(x: &[f32], y: &mut [f32], cos: &[f32], sin: &[f32], pairs: RopePairs) {
    let half = cos.len();
    for j in 0..half {
        let (i1, i2) = match pairs {
            RopePairs::Halves => (j, j + half),
            RopePairs::Interleaved => (2 * j, 2 * j + 1),
        };
        let (a, b) = (x[i1], x[i2]);
        y[i1] = a * cos[j] - b * sin[j];
        y[i2] = a * sin[j] + b * cos[j];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sequential;

    #[test]
    fn rotates_the_pairs_each_mode_names() {
        // One row, two heads of 4: angles 90° and 0° for pairs 0 and 1.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let (cos, sin) = ([0.0, 1.0], [1.0, 0.0]);
        let mut y = [0.0; 8];
        rope(&x, &mut y, 2, 4, &cos, &sin, RopePairs::Halves, &Sequential).unwrap();
        // Halves: pair 0 = (x0, x2) rotated 90° -> (-x2, x0); pair 1 = (x1, x3) unchanged.
        assert_eq!(y, [-3.0, 2.0, 1.0, 4.0, -7.0, 6.0, 5.0, 8.0]);
        rope(
            &x,
            &mut y,
            2,
            4,
            &cos,
            &sin,
            RopePairs::Interleaved,
            &Sequential,
        )
        .unwrap();
        // Interleaved: pair 0 = (x0, x1) -> (-x1, x0); pair 1 = (x2, x3) unchanged.
        assert_eq!(y, [-2.0, 1.0, 3.0, 4.0, -6.0, 5.0, 7.0, 8.0]);
    }

    #[test]
    fn bad_tables_are_errors() {
        let x = [0.0; 8];
        let mut y = [0.0; 8];
        let e = rope(
            &x,
            &mut y,
            2,
            4,
            &[0.0; 3],
            &[0.0; 3],
            RopePairs::Halves,
            &Sequential,
        )
        .unwrap_err();
        assert!(e.to_string().contains("need cos/sin tables of 2"), "{e}");
        assert!(rope(
            &x,
            &mut y,
            3,
            4,
            &[0.0; 2],
            &[0.0; 2],
            RopePairs::Halves,
            &Sequential
        )
        .is_err());
        assert!(rope(
            &x,
            &mut y,
            2,
            3,
            &[0.0; 2],
            &[0.0; 2],
            RopePairs::Halves,
            &Sequential
        )
        .is_err());
    }
}
