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

/// A permutation of a row-major f32 tensor of `shape` that keeps the last axis last (output
/// axis `i` is input axis `perm[i]`, `perm[rank - 1] == rank - 1`): every output row is one
/// input row, copied whole. Attention's head split and merge, `[b, s, h, d] ↔ [b, h, s, d]`,
/// take this shape. Here the rows are split over the threads and each copy is a
/// fixed-width vector loop, where the runtime's byte-generic odometer copied them on one
/// thread with a `memcpy` call per row: MiniLM's head transposes (128×12 rows of 32 floats)
/// went from 6.3–9.9 to 6.5–7.8 µs (`rafter bench --trace`), the model 0.6% faster (20
/// alternated `rafter bench` rounds, B/A 0.994).
pub fn permute_rows_f32(
    x: &[f32],
    shape: &[usize],
    perm: &[usize],
    y: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let rank = shape.len();
    let n: usize = shape.iter().product();
    check_len("permute input", x.len(), n)?;
    check_len("permute output", y.len(), n)?;
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid || rank == 0 || perm[rank - 1] != rank - 1 {
        return Err(KernelError::Shape {
            what: "permute rows".into(),
            detail: format!("perm {perm:?} of {shape:?} does not keep the last axis last"),
        });
    }
    let inner = shape[rank - 1];
    if n == 0 || inner == 0 {
        return Ok(());
    }
    // Input strides of the output's outer axes, and their extents.
    let mut in_strides = vec![1usize; rank];
    for i in (0..rank - 1).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let outer: Vec<(usize, usize)> = perm[..rank - 1]
        .iter()
        .map(|&p| (shape[p], in_strides[p]))
        .collect();
    let dst = Disjoint::new(y);
    par_blocks(par, n / inner, inner, &|rows| {
        // The input offset of output row `rows.start`, then an odometer.
        let mut idx = vec![0usize; outer.len()];
        let (mut rest, mut base) = (rows.start, 0usize);
        for (d, &(extent, stride)) in outer.iter().enumerate().rev() {
            idx[d] = rest % extent;
            base += idx[d] * stride;
            rest /= extent;
        }
        // SAFETY: tasks get disjoint output rows, and this one writes only its own.
        let out = unsafe { dst.part(rows.start * inner..rows.end * inner) };
        for o in out.chunks_exact_mut(inner) {
            copy_row(&x[base..base + inner], o);
            for (d, &(extent, stride)) in outer.iter().enumerate().rev() {
                idx[d] += 1;
                base += stride;
                if idx[d] < extent {
                    break;
                }
                base -= stride * extent;
                idx[d] = 0;
            }
        }
    });
    Ok(())
}

/// `dst = src` (equal lengths) in 16-float chunks the compiler turns into vector moves,
/// where `copy_from_slice` of a runtime length is a `memcpy` call per row.
#[inline(always)]
fn copy_row(src: &[f32], dst: &mut [f32]) {
    let (s16, s_rest) = src.split_at(src.len() / 16 * 16);
    let (d16, d_rest) = dst.split_at_mut(s16.len());
    for (d, s) in d16.chunks_exact_mut(16).zip(s16.chunks_exact(16)) {
        let s: &[f32; 16] = s.try_into().expect("16");
        let d: &mut [f32; 16] = d.try_into().expect("16");
        *d = *s;
    }
    d_rest.copy_from_slice(s_rest);
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

    /// The permutation by definition: output element at multi-index `o` is input element at
    /// the index whose axis `perm[i]` is `o[i]`.
    fn permuted(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
        let rank = shape.len();
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let n = x.len();
        (0..n)
            .map(|flat| {
                let mut rest = flat;
                let mut o = vec![0; rank];
                for d in (0..rank).rev() {
                    o[d] = rest % out_shape[d];
                    rest /= out_shape[d];
                }
                let mut i = vec![0; rank];
                for d in 0..rank {
                    i[perm[d]] = o[d];
                }
                let at = i.iter().zip(shape).fold(0, |acc, (&v, &e)| acc * e + v);
                x[at]
            })
            .collect()
    }

    #[test]
    fn permuted_rows_match_the_definition() {
        // Attention's head split and merge (rows of 32, and of 17 to leave a remainder
        // after the 16-float chunks), a 4-axis shuffle, and rows of one element.
        for (shape, perm) in [
            (vec![2usize, 128, 12, 32], vec![0usize, 2, 1, 3]),
            (vec![1, 12, 128, 32], vec![0, 2, 1, 3]),
            (vec![3, 5, 7, 17], vec![2, 0, 1, 3]),
            (vec![4, 6, 1], vec![1, 0, 2]),
        ] {
            let x: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|i| i as f32)
                .collect();
            let want = permuted(&x, &shape, &perm);
            for threads in [1, 3] {
                let mut y = vec![f32::NAN; x.len()];
                permute_rows_f32(&x, &shape, &perm, &mut y, &ScopedThreads::new(threads)).unwrap();
                assert_eq!(y, want, "{shape:?} {perm:?}, {threads} threads");
            }
        }
    }

    #[test]
    fn permutations_that_move_the_last_axis_are_errors() {
        let x = vec![0f32; 24];
        let mut y = vec![0f32; 24];
        let e = permute_rows_f32(&x, &[2, 3, 4], &[0, 2, 1], &mut y, &Sequential).unwrap_err();
        assert!(
            e.to_string().contains("does not keep the last axis last"),
            "{e}"
        );
        assert!(permute_rows_f32(&x, &[2, 3, 4], &[0, 0, 2], &mut y, &Sequential).is_err());
        assert!(permute_rows_f32(&x[..23], &[2, 3, 4], &[1, 0, 2], &mut y, &Sequential).is_err());
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
