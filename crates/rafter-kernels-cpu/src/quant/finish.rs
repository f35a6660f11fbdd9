//! What the quantized products' kernels share at their ends: storing a tile of raw
//! products into y with the epilogue applied, and the prefill GEMMs' split of rows into
//! tasks.

use super::Path;
use crate::kernel::epilogue_scalar;
use crate::Epilogue;

/// Where y lives: its pointer and leading dimension, shared by tasks that write disjoint
/// tiles.
#[derive(Clone, Copy)]
pub(crate) struct YPtr {
    pub ptr: *mut f32,
    pub ld: usize,
}

impl YPtr {
    /// The address of y's element `(i, j)` (computed, not dereferenced; a method so that
    /// closures capture the whole `Sync` wrapper, not the raw field).
    pub(crate) fn at(self, i: usize, j: usize) -> *mut f32 {
        self.ptr.wrapping_add(i * self.ld + j)
    }
}

// SAFETY: tasks holding a `YPtr` write disjoint tiles of y, which outlives them
// (`Parallel::run` returns only when every task has returned).
unsafe impl Send for YPtr {}
// SAFETY: as above.
unsafe impl Sync for YPtr {}

/// How many row ranges of x the prefill GEMMs split their work into, given `column_ranges`
/// ranges of W's rows and `row_blocks` register blocks of x: more than one only when there
/// are fewer column ranges than `threads`, so that every thread gets a task.
pub(crate) fn row_ranges(column_ranges: usize, row_blocks: usize, threads: usize) -> usize {
    if column_ranges < threads {
        (threads / column_ranges.max(1)).min(row_blocks)
    } else {
        1
    }
}

/// Writes `rows x cols` raw results (`out[r * out_ld + c]`) to y's rows `i0..`, columns
/// `j0..`, through the epilogue (`None`: stored as they are).
///
/// # Safety
/// y's rows `i0..i0 + rows`, columns `j0..j0 + cols` are in bounds and written by this task
/// alone; the epilogue was checked against y's shape; `out` holds `rows` rows of at least
/// `cols.next_multiple_of(16)` floats at `out_ld`; `path`'s ISA is available.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn finish(
    path: Path,
    out: &[f32],
    out_ld: usize,
    rows: usize,
    cols: usize,
    i0: usize,
    j0: usize,
    epi: Option<&Epilogue<'_>>,
    y: YPtr,
) {
    debug_assert!(rows == 0 || out.len() >= (rows - 1) * out_ld + cols.next_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    if path == Path::Vnni512 {
        let tile = crate::kernel::Tile {
            kc: 0,
            a: std::ptr::null(),
            a_rs: 0,
            b: std::ptr::null(),
            b_ps: 0,
            b_prefetch: 0,
            pf_next: std::ptr::null(),
            pf_lines: 0,
            // In bounds by the caller's contract.
            c: y.ptr.wrapping_add(i0 * y.ld + j0),
            ldc: y.ld,
            mv: rows,
            nv: cols,
            alpha: 1.0,
            beta: 0.0,
            epi: epi.map(|e| crate::kernel::TileEpilogue::at(e, i0, j0)),
        };
        // SAFETY: `out` holds `rows` rows of `cols` (rounded up to 16) floats at `out_ld`;
        // the tile's C and epilogue regions are the caller's block, in bounds and this
        // task's alone; AVX-512F is available (part of the path).
        unsafe { crate::kernel::avx512::finish(&tile, out.as_ptr(), out_ld) };
        return;
    }
    let _ = path;
    for r in 0..rows {
        let i = i0 + r;
        for c in 0..cols {
            let col = j0 + c;
            let mut x = out[r * out_ld + c];
            if let Some(e) = epi {
                let bias = e.bias.map_or(0.0, |b| b[col]) + e.row_bias.map_or(0.0, |b| b[i]);
                let (res, before) = e.residual.map_or((0.0, false), |r| {
                    (r.data[i * r.ld + col], r.before_activation)
                });
                x = epilogue_scalar(x, bias, e.activation, res, before);
                if let Some((lo, hi)) = e.clamp {
                    x = x.max(lo).min(hi);
                }
            }
            // SAFETY: in bounds and this task's alone (caller).
            unsafe { *y.ptr.add(i * y.ld + col) = x };
        }
    }
}
