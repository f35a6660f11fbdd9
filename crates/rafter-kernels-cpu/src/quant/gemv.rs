//! The decode path: few rows of x, each weight row read once for all of them.
//!
//! N (W's rows) is split into contiguous ranges, so each task streams its part of W
//! sequentially; a task computes [`TILE`] outputs of every x row at a time into a small
//! buffer and stores them through the epilogue. Block-format weights multiply x quantized
//! as ggml does (once per call, before the tasks start; see [`super::act`]): with the
//! path's integer kernels, or, for formats a vector path has no kernel for, by
//! dequantizing each weight row to f32 against the dequantized activations.

use std::cell::RefCell;

use rafter_quant::layout::{self, read_f16};
use rafter_quant::{dequantize_row, BlockFormat};

use super::act::{quantize_rows, Act, ActType, QuantIsa};
use super::dense::{self, MR};
use super::finish::{finish, YPtr};
use super::gemv_scalar;
use super::{Path, QuantMatRef, WeightFormat, DECODE_MAX_M};
use crate::{Epilogue, MatMut, MatRef, Parallel};

/// Outputs per row a task computes before storing them.
const TILE: usize = 64;

/// Weight bytes below which one thread streams the whole matrix: 128 KiB take ~3 us at
/// DRAM speed, the order of waking a pool thread.
const MIN_PARALLEL_BYTES: usize = 128 << 10;

/// Per-thread buffers reused across calls: the quantized activations (on the calling
/// thread), the kernels' rearranged copy of them, and a contiguous f32 copy of x.
#[derive(Default)]
struct Scratch {
    act: Act,
    /// The x86 kernels' rearranged activations (other targets have no such kernels).
    #[cfg(target_arch = "x86_64")]
    aux: AlignedBytes,
    x: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// A dequantized weight row, per worker thread.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A byte buffer whose payload starts on a 64-byte boundary (the VNNI kernels' activation
/// groups are read as whole cache lines). Only the x86 kernels use one.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
pub(crate) struct AlignedBytes {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

#[cfg(target_arch = "x86_64")]
impl AlignedBytes {
    /// The payload resized to `len` bytes (contents unspecified).
    pub(crate) fn reset(&mut self, len: usize) -> &mut [u8] {
        if self.v.len() < len + 63 {
            self.v = vec![0; len + 63];
        }
        self.off = self.v.as_ptr().align_offset(64);
        self.len = len;
        &mut self.v[self.off..self.off + len]
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }

    /// The payload as it is (as [`AlignedBytes::as_slice`], writable).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Which kernels multiply a block format on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// The path's own integer kernels.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The portable integer kernels.
    Scalar,
    /// Dequantize each row to f32, then the path's f32 kernel.
    Dequant,
}

impl Kernel {
    fn of(
        path: Path,
        // Only the x86 paths have kernels that support some formats and not others.
        #[cfg_attr(not(target_arch = "x86_64"), expect(unused_variables))] format: BlockFormat,
    ) -> Kernel {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni512 if super::x86_vnni::supports(format) => Kernel::Vnni,
            #[cfg(target_arch = "x86_64")]
            Path::Vnni512 | Path::Avx2 if super::x86_avx2::supports(format) => Kernel::Avx2,
            Path::Scalar => Kernel::Scalar,
            #[allow(unreachable_patterns)]
            _ => Kernel::Dequant,
        }
    }
}

/// `y = x · Wᵀ` (then the epilogue) for `x.rows <= DECODE_MAX_M`; shapes checked by the
/// caller.
pub(crate) fn run(
    path: Path,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    debug_assert!(x.rows <= DECODE_MAX_M);
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let mut fresh = None;
    SCRATCH.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let s = match guard.as_deref_mut() {
            Some(s) => s,
            // Re-entered on this thread (a kernel calling a kernel): fresh buffers.
            None => fresh.insert(Scratch::default()),
        };
        run_with(path, &x, &w, yp, epi, par, s);
    });
}

fn run_with(
    path: Path,
    x: &MatRef<'_>,
    w: &QuantMatRef<'_>,
    y: YPtr,
    epi: Option<&Epilogue<'_>>,
    par: &dyn Parallel,
    s: &mut Scratch,
) {
    let (m, k) = (x.rows, x.cols);
    let kernel = match w.format {
        WeightFormat::Block(f) => Some((f, Kernel::of(path, f))),
        _ => None,
    };
    match kernel {
        Some((f, kern)) => {
            s.act.reset(m, k, ActType::of(f));
            quantize_rows(QuantIsa::of(path), x, &mut s.act, &crate::Sequential);
            if kern == Kernel::Dequant {
                dequantized(path, f, w, y, epi, par, s);
                return;
            }
            let act = &s.act;
            #[cfg(target_arch = "x86_64")]
            match kern {
                Kernel::Vnni => super::x86_vnni::prepare(f, act, &mut s.aux),
                Kernel::Avx2 => super::x86_avx2::prepare(f, act, &mut s.aux),
                _ => {}
            }
            #[cfg(target_arch = "x86_64")]
            let aux = s.aux.as_slice();
            drive(
                path,
                w,
                m,
                y,
                epi,
                par,
                &|rows, r0, mr, out, out_ld| match kern {
                    // SAFETY: `rows` is whole rows of W in format f; the activation rows
                    // r0..r0+mr exist; `aux` was prepared for f from `act`; the path's ISA is
                    // available (checked by the caller).
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Vnni => unsafe {
                        super::x86_vnni::dot_tile(f, rows, act, aux, r0, mr, out, out_ld)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as for VNNI.
                    Kernel::Avx2 => unsafe {
                        super::x86_avx2::dot_tile(f, rows, act, aux, r0, mr, out, out_ld)
                    },
                    _ => {
                        for (c, row) in rows.chunks_exact(w.row_bytes).enumerate() {
                            for i in 0..mr {
                                out[i * out_ld + c] = gemv_scalar::dot(f, row, act, r0 + i);
                            }
                        }
                    }
                },
            );
        }
        None => {
            let (xs, ldx) = contiguous(x, &mut s.x);
            let format = w.format;
            drive(path, w, m, y, epi, par, &|rows, r0, mr, out, out_ld| {
                let xr = &xs[r0 * ldx..];
                if mr == 1 {
                    // One x row (decode): several weight rows a pass.
                    let n = rows.len() / w.row_bytes;
                    dense::dot_tile1(path, format, rows, k, xr, &mut out[..n]);
                    return;
                }
                let mut o = [0.0f32; MR];
                for (c, row) in rows.chunks_exact(w.row_bytes).enumerate() {
                    dense::dot_rows(path, format, row, xr, ldx, mr, &mut o);
                    for (i, &v) in o.iter().enumerate().take(mr) {
                        out[i * out_ld + c] = v;
                    }
                }
            });
        }
    }
}

/// A block format this path has no integer kernel for: each weight row dequantized to f32
/// against the activations as ggml's dot products see them (`s.act`, quantized), dequantized
/// too ([`Act::dequantize_row`]), so the result is ggml's up to the f32 additions. For the
/// `_1` formats, one more element per block carries the min times the Q8_1 correction.
fn dequantized(
    path: Path,
    f: BlockFormat,
    w: &QuantMatRef<'_>,
    y: YPtr,
    epi: Option<&Epilogue<'_>>,
    par: &dyn Parallel,
    s: &mut Scratch,
) {
    let (m, k) = (s.act.m, s.act.k);
    let extra = if s.act.kind == ActType::Q8_1 {
        k / 32
    } else {
        0
    };
    let ldx = k + extra;
    s.x.resize(m * ldx, 0.0);
    for (r, xr) in s.x.chunks_exact_mut(ldx).enumerate() {
        let (vals, corr) = xr.split_at_mut(k);
        s.act.dequantize_row(r, vals, corr);
    }
    let xs = &s.x;
    let bb = f.block_bytes();
    drive(path, w, m, y, epi, par, &|rows, r0, mr, out, out_ld| {
        let xr = &xs[r0 * ldx..];
        let mut o = [0.0f32; MR];
        ROW.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(ldx, 0.0);
            for (c, row) in rows.chunks_exact(w.row_bytes).enumerate() {
                let (vals, mins) = buf.split_at_mut(k);
                dequantize_row(f, row, vals).expect("W rows are whole blocks");
                for (mn, blk) in mins.iter_mut().zip(row.chunks_exact(bb)) {
                    // The `_1` formats' min (Q4_1 and Q5_1 keep it at the same offset).
                    *mn = read_f16(blk, layout::q4_1::M);
                }
                dense::dot_rows_f32(path, &buf, xr, ldx, mr, &mut o);
                for (i, &v) in o.iter().enumerate().take(mr) {
                    out[i * out_ld + c] = v;
                }
            }
        });
    });
}

/// x's rows as contiguous f32 slices: x itself when its columns are contiguous, else a
/// copy in `buf`. Returns the data and its row stride.
fn contiguous<'a>(x: &'a MatRef<'_>, buf: &'a mut Vec<f32>) -> (&'a [f32], usize) {
    if x.cs == 1 {
        return (x.data, x.rs);
    }
    buf.clear();
    buf.extend((0..x.rows * x.cols).map(|i| x.data[(i / x.cols) * x.rs + (i % x.cols) * x.cs]));
    (buf, x.cols)
}

/// A decode kernel over a tile of weight rows (see [`drive`]).
type TileKernel<'a> = dyn Fn(&[u8], usize, usize, &mut [f32], usize) + Sync + 'a;

/// Runs `kernel(rows, r0, mr, out, out_ld)` — `out[i * out_ld + c]` = row `r0 + i` of x
/// times weight row `c` of `rows` (a tile of W's rows, back to back), for `i < mr <= MR` —
/// over all of W's rows and x's `m` rows, split over tasks by ranges of W's rows, and
/// stores the results through the epilogue.
#[allow(clippy::too_many_arguments)]
fn drive(
    path: Path,
    w: &QuantMatRef<'_>,
    m: usize,
    y: YPtr,
    epi: Option<&Epilogue<'_>>,
    par: &dyn Parallel,
    kernel: &TileKernel<'_>,
) {
    let n = w.n;
    let bytes = w.data.len();
    // Several ranges a thread: a busy core's share is taken over by the others.
    let tasks = if par.threads() > 1 && bytes >= MIN_PARALLEL_BYTES {
        (4 * par.threads()).min(n.div_ceil(TILE))
    } else {
        1
    };
    let task = |t: usize| {
        let (n0, n1) = (t * n / tasks, (t + 1) * n / tasks);
        let mut out = [0.0f32; DECODE_MAX_M * TILE];
        for j0 in (n0..n1).step_by(TILE) {
            let cols = TILE.min(n1 - j0);
            for r0 in (0..m).step_by(MR) {
                let mr = MR.min(m - r0);
                kernel(w.rows(j0, j0 + cols), r0, mr, &mut out[r0 * TILE..], TILE);
            }
            // SAFETY: y's rows 0..m, columns j0..j0+cols are in bounds (checked shapes) and
            // this task's alone (tasks own disjoint column ranges); the epilogue was
            // checked; `out` holds m rows of TILE floats; the path's ISA is available.
            unsafe { finish(path, &out, TILE, m, cols, 0, j0, epi, y) };
        }
    };
    if tasks == 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}
