//! `C = A B (+ epilogue)` with B in f16/bf16 panels: the two paths described in the module
//! docs of [`crate::lowp`], their thread split, and the scalar kernels.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::half_packed::{HalfKind, PackedHalfBRef};
use super::Ptr;
use crate::buffer::Aligned;
use crate::driver::{run_raw, MIN_PARALLEL_B_FLOATS, MIN_PARALLEL_FMAS};
use crate::kernel::{epilogue_scalar, Isa, PANEL};
use crate::{
    check_product, BRef, Epilogue, GemmError, MatMut, MatRef, PackedBRef, Parallel, Residual,
    Sequential,
};

/// The most rows a product may have to run on the direct (converting) kernels of `path`;
/// larger ones widen blocks of B to f32 and run the f32 driver.
///
/// Measured with `benches/lowp_gemm.rs --crossover` (M = 4..128, K x N = 768 x 3072,
/// weights streamed, Zen 5): the AVX-512 direct kernel (8 x 32 tiles, B converted once per
/// 8 rows, re-read from L2) was faster than widening at every M, 9-10% at M = 128, and
/// even 6% faster than the f32 12x32 kernel on f32 weights at M = 128; so it runs up to the
/// largest M measured, 128. On the AVX2 kernels (measured on the same Zen 5 with
/// `--isa avx2`), `vcvtph2ps ymm` is dearer: f16 direct tied widening at M = 32 and was 26%
/// slower at M = 128, while bf16 direct (a shift) stayed 8-34% faster. The scalar path is
/// not tuned: its widened path runs the scalar f32 kernel.
///
/// In a model the products carry epilogues (bias, GELU). While the direct path applied them
/// in scalar code, BERT-base with bf16 weights at seq 128 (M = 128) ran faster with
/// AVX-512 products above 16 rows widened (57.4–62.2 against 62.5–63.1 ms). With the f32
/// kernel's vector epilogue (see `finish`), direct up to M = 128 took BERT-base from 57.0
/// to 51.2 ms with bf16 weights and from 56.0 to 51.4 with f16 (`rafter bench --threads
/// 2`, 10 and 6 alternated rounds, the new build faster in every one), level with f32
/// weights (52.3 ms).
fn direct_max_m(path: Path, kind: HalfKind) -> usize {
    match (path, kind) {
        #[cfg(target_arch = "x86_64")]
        (Path::Avx512, _) => 128,
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2, HalfKind::F16) => 32,
        #[cfg(target_arch = "x86_64")]
        (Path::Avx2, HalfKind::Bf16) => 128,
        (Path::Scalar, _) => 8,
    }
}

/// Replaces `direct_max_m` when non-zero (see [`set_half_direct_max_m`]).
static DIRECT_MAX_M_OVERRIDE: AtomicUsize = AtomicUsize::new(0);

/// Overrides the row count up to which half GEMMs run the direct kernels, for every later
/// call in the process (0 restores the measured defaults; `usize::MAX` sends every M to the
/// direct kernels, 1 sends M >= 2 to the widening path). For the bench, to measure the
/// crossover within one run, and for tests, to hold both paths to the reference.
#[doc(hidden)]
pub fn set_half_direct_max_m(m: usize) {
    DIRECT_MAX_M_OVERRIDE.store(m, Ordering::Relaxed);
}

/// Columns of one direct tile, and rows of one pass over them, per path.
const OUT_LD: usize = 64;
const OUT_ROWS: usize = 8;

/// Which half kernels an [`Isa`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// AVX-512F: `vcvtph2ps zmm` is part of AVX-512F itself.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 + FMA + F16C (`vcvtph2ps ymm`). Every AVX2 CPU shipped has F16C, but it is a
    /// separate CPUID bit, so it is checked; without it the scalar kernels run.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable Rust, `half` for the conversions (also what NEON runs for now).
    Scalar,
}

impl Path {
    pub(crate) fn of(isa: Isa) -> Path {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Path::Avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if std::arch::is_x86_feature_detected!("f16c") => Path::Avx2,
            _ => Path::Scalar,
        }
    }

    /// (rows per pass, columns per tile) of the direct kernel.
    fn tile(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => (8, 64),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => (6, 32),
            Path::Scalar => (4, 16),
        }
    }
}

/// One call of a direct (converting) kernel: `rows x 16 np` of `A B`, K deep, stored raw
/// into `out` (row stride [`OUT_LD`] floats).
pub(crate) struct DecodeTile {
    pub k: usize,
    /// Row `r` of A at `a + r * lda`, `k` contiguous floats.
    pub a: *const f32,
    pub lda: usize,
    /// Panel `w` of B at `b + w * ps`, `k * 16` contiguous halves.
    pub b: *const u16,
    pub ps: usize,
    pub out: *mut f32,
}

/// `C = alpha A B`, then the epilogue, with B in 16-bit panels; on the fastest kernels this CPU
/// has, with tasks run by `par`.
///
/// `A` is `M x K` f32 (any strides), `B` is `K x N` packed by [`crate::PackedHalfB`], C is
/// `M x N`, only written (no beta). Products accumulate in f32: the result differs from an
/// f32 GEMM over the *rounded* weights only by the order of the additions. The epilogue is
/// [`crate::sgemm`]'s (bias, row bias, activation, residual, clamp).
pub fn gemm_half(
    alpha: f32,
    a: MatRef<'_>,
    b: PackedHalfBRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    gemm_half_with_isa(Isa::detect(), alpha, a, b, c, epilogue, par)
}

/// [`gemm_half`] on a given ISA's kernels (tests hold every path to the reference; benches
/// compare them). `Isa::Avx2` runs the scalar half kernels when the CPU lacks F16C, and
/// `Isa::Neon` always does (no NEON half kernel yet); the f32 part of the many-rows path
/// runs on `isa` itself.
pub fn gemm_half_with_isa(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: PackedHalfBRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    check_product(
        isa,
        &a,
        "the half-precision B",
        [b.k(), b.n()],
        &c,
        epilogue,
    )?;
    let (m, k, n) = (a.rows, a.cols, b.n());
    if m == 0 || n == 0 {
        return Ok(());
    }
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let direct_max = match DIRECT_MAX_M_OVERRIDE.load(Ordering::Relaxed) {
        0 => direct_max_m(Path::of(isa), b.kind()),
        v => v,
    };
    if m <= direct_max || k == 0 {
        direct(Path::of(isa), alpha, a, b, c, epi, par);
    } else {
        widened(isa, alpha, a, b, c, epilogue, par);
    }
    Ok(())
}

/// Whether a product is worth waking threads for: the driver's rule (enough FMAs, or
/// enough weights to stream that one core's bandwidth is the limit).
fn parallel_worth(m: usize, k: usize, n: usize) -> bool {
    m * n * k.max(1) >= MIN_PARALLEL_FMAS || k * n >= MIN_PARALLEL_B_FLOATS
}

/// Few rows: each task streams its column tiles of B once per pass of up to 8 rows,
/// converting on load.
fn direct(
    path: Path,
    alpha: f32,
    a: MatRef<'_>,
    b: PackedHalfBRef<'_>,
    c: MatMut<'_>,
    epi: Option<&Epilogue<'_>>,
    par: &dyn Parallel,
) {
    let (m, k, n) = (a.rows, a.cols, b.n());
    // The kernels read rows of A contiguously; a strided A (few rows) is copied first.
    let copy;
    let (a_data, lda): (&[f32], usize) = if a.cs == 1 || k == 0 {
        (a.data, a.rs)
    } else {
        copy = (0..m * k)
            .map(|x| a.data[(x / k) * a.rs + (x % k) * a.cs])
            .collect::<Vec<f32>>();
        (&copy, k)
    };
    let (rows, cols) = path.tile();
    let tiles = n.div_ceil(cols);
    let tasks = if par.threads() > 1 && parallel_worth(m, k, n) {
        tiles.min(4 * par.threads())
    } else {
        1
    };
    let (cp, ldc) = (Ptr(c.data.as_mut_ptr()), c.ld);
    let panels = b.panels();
    let task = |t: usize| {
        let mut out = [[0.0f32; OUT_LD]; OUT_ROWS];
        for ti in t * tiles / tasks..(t + 1) * tiles / tasks {
            let j = ti * cols;
            let nv = cols.min(n - j);
            for r0 in (0..m).step_by(rows) {
                let mv = rows.min(m - r0);
                let dt = DecodeTile {
                    k,
                    // Only formed, not read, when k == 0 (A may then be empty).
                    a: a_data.as_ptr().wrapping_add(r0 * lda),
                    lda,
                    // j is a multiple of 16: the start of panel j / 16.
                    b: panels.as_ptr().wrapping_add(j / PANEL * k * PANEL),
                    ps: k * PANEL,
                    out: out.as_mut_ptr().cast(),
                };
                // SAFETY: rows r0..r0+mv < m of A hold k floats at `lda` (a checked view, or
                // the contiguous copy); panels j/16 .. j/16 + ceil(nv/16) exist in B (its
                // panel count is ceil(n/16) and j + nv <= n); `out` has 8 >= mv rows of
                // 64 >= nv columns; the path's ISA is available (checked by the caller).
                unsafe { tile(path, b.kind(), &dt, mv, nv.div_ceil(PANEL)) };
                // SAFETY: this task alone writes columns j..j+nv (its tiles), rows < m; the
                // path's ISA is available.
                unsafe { finish(path, &out, alpha, r0, mv, j, nv, epi, cp, ldc) };
            }
        }
    };
    if tasks == 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// Runs the direct kernel of `path` on `rows x 16 np`.
///
/// # Safety
/// The [`DecodeTile`] contract for `rows` (<= the path's rows) and `np` panels (<= the
/// path's columns / 16), with the path's ISA available.
unsafe fn tile(path: Path, kind: HalfKind, t: &DecodeTile, rows: usize, np: usize) {
    #[cfg(target_arch = "x86_64")]
    let bf16 = kind == HalfKind::Bf16;
    match path {
        // SAFETY (both arms): forwarded.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx512 => unsafe { super::x86::tile_avx512(t, rows, np, bf16) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx2 => unsafe { super::x86::tile_avx2(t, rows, np, bf16) },
        // SAFETY: forwarded.
        Path::Scalar => unsafe { tile_scalar(t, rows, np, kind) },
    }
}

/// The portable direct kernel: one panel at a time, each B row widened once for all rows.
///
/// # Safety
/// The [`DecodeTile`] contract for `rows <= 8` and `np <= 4` panels.
unsafe fn tile_scalar(t: &DecodeTile, rows: usize, np: usize, kind: HalfKind) {
    for w in 0..np {
        let mut acc = [[0.0f32; PANEL]; OUT_ROWS];
        for p in 0..t.k {
            let mut brow = [0.0f32; PANEL];
            for (jj, x) in brow.iter_mut().enumerate() {
                // SAFETY: panel w < np, row p < k, column jj < 16: inside the panel.
                *x = kind.to_f32(unsafe { *t.b.add(w * t.ps + p * PANEL + jj) });
            }
            for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
                // SAFETY: row r < rows, column p < k of A.
                let av = unsafe { *t.a.add(r * t.lda + p) };
                for (s, bv) in acc_r.iter_mut().zip(brow) {
                    *s += av * bv;
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            for (jj, &x) in acc_r.iter().enumerate() {
                // SAFETY: row r < rows <= 8, column 16w + jj < 64 of `out`.
                unsafe { *t.out.add(r * OUT_LD + w * PANEL + jj) = x };
            }
        }
    }
}

/// Scales `mv x nv` raw results by alpha, applies the epilogue and stores them at C's rows `r0..`,
/// columns `j..`: with AVX-512, the f32 kernel's vector epilogue; else in scalar code, which
/// with few rows is a small share of a call. With the scalar epilogue (GELU's `exp` per
/// element), BERT-base's products of 128 rows had run faster widened than direct.
///
/// # Safety
/// C's rows `r0..r0+mv`, columns `j..j+nv` are in bounds at `ldc` and written by this
/// task alone; the epilogue was checked against C's shape; `path`'s ISA is available.
#[allow(clippy::too_many_arguments)]
unsafe fn finish(
    path: Path,
    out: &[[f32; OUT_LD]; OUT_ROWS],
    alpha: f32,
    r0: usize,
    mv: usize,
    j: usize,
    nv: usize,
    epi: Option<&Epilogue<'_>>,
    c: Ptr<f32>,
    ldc: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if path == Path::Avx512 {
        let tile = crate::kernel::Tile {
            kc: 0,
            a: std::ptr::null(),
            a_rs: 0,
            b: std::ptr::null(),
            b_ps: 0,
            b_prefetch: 0,
            pf_next: std::ptr::null(),
            pf_lines: 0,
            // SAFETY: (of the offsets) row r0 < m and column j < n of C, checked by the caller.
            c: unsafe { c.get().add(r0 * ldc + j) },
            ldc,
            mv,
            nv,
            alpha,
            beta: 0.0,
            epi: epi.map(|e| crate::kernel::TileEpilogue::at(e, r0, j)),
        };
        // SAFETY: `out` holds mv <= 8 rows of 64 >= nv (rounded up to 16) floats at
        // stride OUT_LD; the tile's C and epilogue regions are the caller's `mv x nv` block,
        // in bounds and this task's alone; AVX-512 is available (the path's ISA).
        unsafe { crate::kernel::avx512::finish(&tile, out.as_ptr().cast(), OUT_LD) };
        return;
    }
    let _ = path; // (read above on x86-64 only)
    for (r, out_r) in out.iter().enumerate().take(mv) {
        let i = r0 + r;
        for (jj, &raw) in out_r.iter().enumerate().take(nv) {
            let col = j + jj;
            let mut x = alpha * raw;
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
            // SAFETY: forwarded contract.
            unsafe { *c.get().add(i * ldc + col) = x };
        }
    }
}

thread_local! {
    /// Per-thread f32 copy of one widened `KC x NC` block of B, reused across calls.
    static WIDE: RefCell<Aligned> = RefCell::new(Aligned::new(0, 0));
}

/// Target width of one column block: a 512 x 256 f32 block is 512 KiB, half of a Zen 4/5
/// L2, so the driver's micro-panels come from L2 right after being written. (128 measured
/// the same at M = 32..128 on Zen 5.)
const WIDE_NC: usize = 256;

/// Many rows: each task owns a block of columns (and of rows, when there are fewer column
/// blocks than threads), widens its B one K block at a time into f32 panels and runs the f32
/// driver on them, accumulating over K blocks through beta = 1.
fn widened(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: PackedHalfBRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let (m, k, n) = (a.rows, a.cols, b.n());
    let path = Path::of(isa);
    let bl = isa.blocking();
    let kc = bl.kc;
    let threads = if parallel_worth(m, k, n) {
        par.threads()
    } else {
        1
    };
    // Column blocks: a multiple of the thread count when possible, so that no thread waits
    // on a last round of one block; each a multiple of 32 columns (whole AVX-512 tiles).
    let max_blocks = n.div_ceil(32);
    let blocks = n.div_ceil(WIDE_NC).div_ceil(threads) * threads;
    let width = n.div_ceil(blocks.min(max_blocks)).div_ceil(32) * 32;
    let tn = n.div_ceil(width);
    // Too few column blocks for the threads: split rows too (each row block widens its own
    // copy of B, which M large enough to get here amortises).
    let tm = if tn < threads {
        (threads / tn).min(m.div_ceil(bl.mr))
    } else {
        1
    };
    let cp = Ptr(c.data.as_mut_ptr());
    let ldc = c.ld;
    let panels = b.panels();
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (i0, i1) = (ti * m / tm, (ti + 1) * m / tm);
        let (j0, j1) = (tj * width, ((tj + 1) * width).min(n));
        if i0 >= i1 || j0 >= j1 {
            return;
        }
        let np = (j1 - j0).div_ceil(PANEL);
        let q0 = j0 / PANEL;
        let epi_block = Epilogue {
            bias: epilogue.bias.map(|x| &x[j0..j1]),
            row_bias: epilogue.row_bias.map(|x| &x[i0..i1]),
            activation: epilogue.activation,
            // Element (i0, j0) exists (i0 < m, j0 < n), so the slice starts inside.
            residual: epilogue.residual.map(|r| Residual {
                data: &r.data[i0 * r.ld + j0..],
                ld: r.ld,
                before_activation: r.before_activation,
            }),
            clamp: epilogue.clamp,
        };
        let none = Epilogue::none();
        let mut pc = 0;
        while pc < k {
            let kb = kc.min(k - pc);
            let last = pc + kb >= k;
            with_wide(np * kb * PANEL, |wide| {
                for (q, dst) in wide.chunks_exact_mut(kb * PANEL).enumerate() {
                    let src = &panels[(q0 + q) * k * PANEL + pc * PANEL..][..kb * PANEL];
                    widen(path, b.kind(), src, dst);
                }
                let bref = PackedBRef::from_panels(kb, j1 - j0, wide)
                    .expect("the block is sized by panel_floats");
                // Element (i0, pc) of A exists (i0 < m, pc < k): the view starts inside it
                // and covers rows i0..i1, columns pc..pc+kb of A.
                let a_block = MatRef {
                    data: &a.data[i0 * a.rs + pc * a.cs..],
                    rows: i1 - i0,
                    cols: kb,
                    rs: a.rs,
                    cs: a.cs,
                };
                // SAFETY: C's rows i0..i1, columns j0..j1 are inside C (a checked view) and
                // written by this task alone (tasks tile C disjointly); the block's epilogue
                // is the checked epilogue restricted to the same rows and columns; B has kb
                // rows and j1 - j0 columns.
                unsafe {
                    run_raw(
                        isa,
                        alpha,
                        a_block,
                        BRef::Packed(bref),
                        if pc == 0 { 0.0 } else { 1.0 },
                        cp.get().add(i0 * ldc + j0),
                        i1 - i0,
                        j1 - j0,
                        ldc,
                        if last { &epi_block } else { &none },
                        &Sequential,
                    )
                }
            });
            pc += kb;
        }
    };
    let tasks = tm * tn;
    if tasks == 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// Runs `f` on this thread's widening buffer, grown to `len` floats (a fresh one if the
/// thread's is in use).
fn with_wide(len: usize, f: impl FnOnce(&mut [f32])) {
    let mut f = Some(f);
    WIDE.with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            if buf.as_slice().len() < len {
                *buf = Aligned::new(0, len);
            }
            if let Some(f) = f.take() {
                f(&mut buf.as_mut_slice()[..len]);
            }
        }
    });
    if let Some(f) = f.take() {
        f(Aligned::new(0, len).as_mut_slice());
    }
}

/// `dst[i] = src[i]` widened to f32, exactly.
pub(crate) fn widen(path: Path, kind: HalfKind, src: &[u16], dst: &mut [f32]) {
    match path {
        // SAFETY (both arms): the path's ISA was checked available by the GEMM's caller.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx512 => unsafe { super::x86::widen_avx512(kind == HalfKind::Bf16, src, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx2 => unsafe { super::x86::widen_avx2(kind == HalfKind::Bf16, src, dst) },
        Path::Scalar => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = kind.to_f32(s);
            }
        }
    }
}
