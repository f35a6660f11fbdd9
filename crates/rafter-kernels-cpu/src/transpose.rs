//! Batched 2-D transposes of f32 matrices, the shape every NCHW ↔ NHWC layout change takes
//! once its axes are merged (`[C, H·W] → [H·W, C]` per image).
//!
//! The output is split into blocks of rows over the threads, and each block is written in
//! [`TILE`]×[`TILE`] tiles, so a tile's reads touch `TILE` input rows once, while their cache
//! lines are resident, and its writes fill whole output lines. ResNet-50's `[64, 3136]`
//! transpose took 237 µs a call element by element on one thread, 106 µs so (2 threads,
//! `rafter bench resnet50.rfa --trace`; `benchmarks/RESULTS.md`, "CNN direct kernels and
//! transposes on an AVX-512 machine").

use crate::common::{check_len, par_blocks, Disjoint, KernelError};
use crate::Parallel;

/// Tile edge, in elements: 16 f32 are one 64-byte cache line.
const TILE: usize = 16;

/// `y[b][c][r] = x[b][r][c]` for `batch` matrices of `rows × cols` (`x` is
/// `batch × rows × cols`, `y` is `batch × cols × rows`).
pub fn transpose_f32(
    x: &[f32],
    [batch, rows, cols]: [usize; 3],
    y: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let n = batch * rows * cols;
    check_len("transpose input", x.len(), n)?;
    check_len("transpose output", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    // Items: (matrix, block of TILE output rows), each writing its own output rows.
    let blocks = cols.div_ceil(TILE);
    let dst = Disjoint::new(y);
    par_blocks(par, batch * blocks, TILE * rows, &|items| {
        for item in items {
            let (b, c0) = (item / blocks, item % blocks * TILE);
            let c1 = (c0 + TILE).min(cols);
            let xs = &x[b * rows * cols..(b + 1) * rows * cols];
            let span = b * rows * cols + c0 * rows..b * rows * cols + c1 * rows;
            // SAFETY: items are disjoint, and item (b, c0) writes only output rows c0..c1 of
            // matrix b.
            let out = unsafe { dst.part(span) };
            block(xs, rows, cols, c0..c1, out);
        }
    });
    Ok(())
}

/// Output rows `cs` (input columns) of one `rows × cols` matrix `x`, into `out`
/// (`cs.len() × rows`), a `TILE`-row strip of the input at a time.
fn block(x: &[f32], rows: usize, cols: usize, cs: std::ops::Range<usize>, out: &mut [f32]) {
    let w = cs.len();
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        if w == TILE && r1 - r0 == TILE {
            // A whole tile: fixed bounds, so the copy is unrolled and unchecked.
            let mut t = [[0f32; TILE]; TILE];
            for (i, row) in t.iter_mut().enumerate() {
                let at = (r0 + i) * cols + cs.start;
                row.copy_from_slice(&x[at..at + TILE]);
            }
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                let o: &mut [f32; TILE] = (&mut o[r0..r0 + TILE]).try_into().expect("TILE");
                for (i, v) in o.iter_mut().enumerate() {
                    *v = t[i][j];
                }
            }
        } else {
            for (j, o) in out.chunks_exact_mut(rows).enumerate() {
                for r in r0..r1 {
                    o[r] = x[r * cols + cs.start + j];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScopedThreads, Sequential};

    #[test]
    fn matches_the_definition() {
        // Whole tiles, partial tiles on both axes, one row, one column, several matrices.
        for &(b, r, c) in &[
            (1usize, 64usize, 3136usize),
            (2, 37, 21),
            (1, 1, 40),
            (3, 40, 1),
            (1, 16, 16),
            (2, 33, 50),
        ] {
            let x: Vec<f32> = (0..b * r * c).map(|i| i as f32).collect();
            for threads in [1, 3] {
                let mut y = vec![f32::NAN; x.len()];
                transpose_f32(&x, [b, r, c], &mut y, &ScopedThreads::new(threads)).unwrap();
                for m in 0..b {
                    for i in 0..r {
                        for j in 0..c {
                            assert_eq!(y[(m * c + j) * r + i], x[(m * r + i) * c + j]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let x = vec![0f32; 12];
        let mut y = vec![0f32; 12];
        assert!(transpose_f32(&x[..11], [1, 3, 4], &mut y, &Sequential).is_err());
        assert!(transpose_f32(&x, [1, 3, 4], &mut y[..10], &Sequential).is_err());
        assert!(transpose_f32(&x, [2, 3, 4], &mut y, &Sequential).is_err());
    }
}
