//! The prefill GEMM on AMX-BF16 tiles (Sapphire Rapids and later), for every weight format
//! but f32.
//!
//! Why: one `tdpbf16ps` does a 16x16 tile of 32-element bf16 dot products accumulated in
//! f32 (16 times the multiply-adds of an AVX-512 FMA per instruction), but bf16 keeps only
//! 8 significant bits. So the operands are split into bf16 parts: a weight `w = hi + lo`
//! (`hi` truncated, `lo` the rest rounded: 16 significant bits; exact for f16, whose 11
//! bits and exponent range bf16 pairs hold, and for bf16), x `= hi + mid + lo` exactly (8
//! bits each, the first two truncated), and each tile of y accumulates the products that
//! matter ([`Terms`]): for block formats `w_hi x_mid + w_hi x_hi + w_lo x_hi` (x to 16 bits,
//! against the int8 rounding of x on the VNNI kernel), for f16 five products (x exact, only
//! `w_lo x_lo`, below f32's rounding, dropped: the f32 path's accuracy), for bf16 three.
//! The weights are dequantized to f32 first (the scales, mins and block structure applied
//! there), so no per-group fold leaves the tiles (the AMX-INT8 attempt's bound); the
//! dequantization is done once per panel of 32 weight rows, K-block and call, into a
//! per-thread buffer (the weights stay as they are mapped), reused by every row of x. Tile arithmetic flushes bf16 subnormal inputs to zero
//! (below `2^-126`).
//!
//! Layout: weights are the A operand, so a panel is row-major: per 32 elements of K,
//! `[hi rows 0-15, hi 16-31, lo 0-15, lo 16-31]`, 1 KiB tiles of 16 rows x 32 bf16, written
//! by the dequantization without transposes. x is the B operand in the pair layout
//! (`[16 pairs of K][16 rows][2]` bf16), built once per call by 16x16 dword transposes:
//! per 16 rows and 32 elements, three tiles (hi, mid, lo). Per 32 rows of x and panel, four
//! f32 C tiles (`[weight rows][rows of x]`) stay in tile registers over a K-block (512
//! elements), are stored between K-blocks, and at the end are transposed and go through
//! the epilogue to y. Loop order per thread: chunks of 8 panels, K-blocks, panels, rows of
//! x: x's K-block stays in L2 across the chunk's panels (over all of K it did not at
//! K = 3072, and every panel re-read it from L3), a panel's K-block near while every row
//! of x multiplies it. For f16/bf16 the split of the next panel K-block is interleaved with
//! the current one's tile products (the tiles compute while the vector units convert; a
//! separate pass had cost ~20% of prefill GEMM time at 128 rows of x).
//!
//! On by default where CPUID reports AMX-TILE, AMX-BF16 and AVX512-BF16, the OS enables
//! the tile state (XCR0) and Linux grants the tile data permission (`arch_prctl`);
//! `RAFTER_CPU_AMX=0` keeps the AVX-512 kernels (VNNI int8 for block formats, the widened
//! f32 GEMM for float formats).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::finish::{finish, YPtr};
use super::gemv::AlignedBytes;
use super::x86_vnni_gemm::{scales_row, spec, transpose16, unpack_row, unpack_row_simd};
use super::{Path, QuantMatRef, WeightFormat};
use crate::{Epilogue, MatMut, MatRef, Parallel};

/// Weight rows per panel: two 16-column tiles of y.
const NR: usize = 32;
/// Rows of x per register block: two 16-row A tiles.
const MB: usize = 32;
/// K per tile product (16 pairs of bf16).
const KT: usize = 32;
/// Bytes of one tile (16 rows of 64 bytes).
const TILE: usize = 1024;

/// Forced choice for later calls: 0 follows `RAFTER_CPU_AMX` (on unless `0`), 1 off, 2 on
/// where available. For the bench's A/B runs and tests.
static FORCE: AtomicU8 = AtomicU8::new(0);

/// Forces the AMX kernel off (`Some(false)`), on where available (`Some(true)`), or back
/// to the default (`None`) for later calls.
pub(crate) fn force(on: Option<bool>) {
    FORCE.store(
        match on {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        },
        Ordering::Relaxed,
    );
}

/// Whether prefill GEMMs on the VNNI path run this kernel.
pub(crate) fn enabled() -> bool {
    match FORCE.load(Ordering::Relaxed) {
        1 => false,
        2 => available(),
        _ => {
            static ENV: OnceLock<bool> = OnceLock::new();
            *ENV.get_or_init(|| std::env::var("RAFTER_CPU_AMX").as_deref() != Ok("0"))
                && available()
        }
    }
}

/// Whether AMX-BF16 can run in this process (checked once: CPUID, XCR0, and the tile data
/// permission, which Linux grants per process).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(detect)
}

fn detect() -> bool {
    let (l1, l7) = (__cpuid(1), __cpuid_count(7, 0));
    let osxsave = l1.ecx & (1 << 27) != 0;
    // EDX bit 22: AMX-BF16, bit 24: AMX-TILE.
    let amx = l7.edx & (1 << 22) != 0 && l7.edx & (1 << 24) != 0;
    if !(osxsave && amx && std::arch::is_x86_feature_detected!("avx512bf16")) {
        return false;
    }
    let xcr0: u64;
    // SAFETY: OSXSAVE is set, so XGETBV with ECX = 0 is defined; it touches no memory.
    unsafe {
        let (lo, hi): (u32, u32);
        asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
        xcr0 = u64::from(hi) << 32 | u64::from(lo);
    }
    xcr0 & (3 << 17) == 3 << 17 && request_tile_permission()
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
/// instruction faults on Linux.
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: the syscall takes two integers and touches no user memory; `syscall`
    // clobbers rcx and r11, declared.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// x's B tiles: `[16-row block][32-element step][hi, lo]` tiles of `[16 pairs][16 rows][2]`
/// bf16 (zero past M rows and K columns), and 16 rows of x as f32 while they are built.
#[derive(Default)]
struct XTiles {
    tiles: AlignedBytes,
    rows: Vec<f32>,
}

/// Per-thread buffers: two panel K-blocks of A tiles (the one multiplied, the next being
/// packed), the C tiles of a chunk of panels, and a block-format row's unpacked form.
#[derive(Default)]
struct PanelBufs {
    panel: AlignedBytes,
    next: AlignedBytes,
    acc: AlignedBytes,
    row: RowScratch,
}

/// One block-format weight row's quants and per-group scales and offsets.
#[derive(Default)]
struct RowScratch {
    u: AlignedBytes,
    s: Vec<f32>,
    t: Vec<f32>,
}

thread_local! {
    static XS: RefCell<XTiles> = RefCell::new(XTiles::default());
    static BUFS: RefCell<PanelBufs> = RefCell::new(PanelBufs::default());
}

/// `y = x · Wᵀ` (then the epilogue), any weight format; shapes checked by the caller
/// (`k > 0`), the VNNI path's features and AMX ([`enabled`]) available. `rounded` (float
/// formats only): both operands rounded to bf16 (to nearest even) and one tile product
/// each, [`MatmulPrecision::Bf16`](crate::MatmulPrecision::Bf16)'s arithmetic, instead of
/// the accurate split.
pub(crate) fn run(
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
    rounded: bool,
) {
    let rounded = rounded && w.format().block_elems() == 1;
    let mut fresh = None;
    XS.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let xs = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert(XTiles::default()),
        };
        let kp = x.cols.next_multiple_of(KT);
        x_tiles(&x, kp, xs, rounded);
        compute(xs, kp, x.rows, w, y, epilogue, par, rounded);
    });
}

/// Fills `xs.tiles` with x's B tiles (see [`XTiles`]; `rounded`: only the hi tiles, x
/// rounded to nearest).
fn x_tiles(x: &MatRef<'_>, kp: usize, xs: &mut XTiles, rounded: bool) {
    let (m, k) = (x.rows, x.cols);
    let (blocks, steps) = (m.div_ceil(16), kp / KT);
    let tiles = xs.tiles.reset(blocks * steps * 3 * TILE);
    xs.rows.resize(16 * kp, 0.0);
    for b in 0..blocks {
        for r in 0..16 {
            let row = &mut xs.rows[r * kp..][..kp];
            let i = b * 16 + r;
            if i < m {
                for (c, v) in row[..k].iter_mut().enumerate() {
                    *v = x.data[i * x.rs + c * x.cs];
                }
                row[k..].fill(0.0);
            } else {
                row.fill(0.0);
            }
        }
        for st in 0..steps {
            // SAFETY: AVX-512F/BF16 available (`available`); rows holds 16 rows of kp
            // floats, 32 from st * 32 < kp; the block's step holds 3 tiles.
            unsafe {
                x_step_tiles(
                    xs.rows.as_ptr().add(st * KT),
                    kp,
                    tiles.as_mut_ptr().add((b * steps + st) * 3 * TILE),
                    rounded,
                )
            };
        }
    }
}

/// Elements `v0 ++ v1` split into bf16 halves `hi + lo` (element order, 32 a vector): `hi`
/// is v truncated to bf16 (exact as f32, so `v - hi` is exact), `lo` the rest rounded to
/// nearest: 16 significant bits, the error at most `2^-16 |v|`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn split_vec(v0: __m512, v1: __m512) -> (__m512i, __m512i) {
    let (h0, h1) = (trunc(v0), trunc(v1));
    // h0/h1 are bf16 values, so their conversion is exact.
    let h = bits(_mm512_cvtne2ps_pbh(h1, h0));
    let l = bits(_mm512_cvtne2ps_pbh(
        _mm512_sub_ps(v1, h1),
        _mm512_sub_ps(v0, h0),
    ));
    (h, l)
}

/// `v` truncated to bf16 precision (as f32).
#[inline]
#[target_feature(enable = "avx512f")]
fn trunc(v: __m512) -> __m512 {
    let top = _mm512_set1_epi32(0xffff_0000u32 as i32);
    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top))
}

/// A bf16 vector's bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn bits(v: __m512bh) -> __m512i {
    // SAFETY: both are 64-byte vectors of plain bits; every bit pattern is valid for both.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// 16 rows of x (at stride `ld` floats) of 32 floats into three B tiles at `out`: `hi`,
/// `mid`, `lo` in the pair layout (`[16 pairs][16 rows][2]` bf16), `x = hi + mid + lo`
/// exactly (hi and mid truncated, lo the remaining at most 8 bits); `rounded`: only `hi`,
/// x rounded to nearest (mid and lo not written).
///
/// # Safety
/// AVX-512F/BF16 available; the 16 rows' 32 floats readable; `out` writable for 3 tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn x_step_tiles(rows: *const f32, ld: usize, out: *mut u8, rounded: bool) {
    let mut parts = [[_mm512_setzero_si512(); 16]; 3];
    if rounded {
        let hi = &mut parts[0];
        // A range loop, not iterators: closures would not inherit the target features.
        #[allow(clippy::needless_range_loop)]
        for r in 0..16 {
            // SAFETY: row r's 32 floats (caller).
            let (v0, v1) = unsafe {
                (
                    _mm512_loadu_ps(rows.add(r * ld)),
                    _mm512_loadu_ps(rows.add(r * ld + 16)),
                )
            };
            hi[r] = bits(_mm512_cvtne2ps_pbh(v1, v0));
        }
        transpose16(hi);
        for (q, v) in hi.iter().enumerate() {
            // SAFETY: tile 0 of out, row q (caller).
            unsafe { _mm512_storeu_si512(out.add(q * 64).cast(), *v) };
        }
        return;
    }
    // A range loop, not iterators: closures would not inherit this function's target
    // features, and their intrinsics would not inline.
    #[allow(clippy::needless_range_loop)]
    for r in 0..16 {
        // SAFETY: row r's 32 floats (caller).
        let v = unsafe {
            [
                _mm512_loadu_ps(rows.add(r * ld)),
                _mm512_loadu_ps(rows.add(r * ld + 16)),
            ]
        };
        let h = [trunc(v[0]), trunc(v[1])];
        let rest = [_mm512_sub_ps(v[0], h[0]), _mm512_sub_ps(v[1], h[1])];
        let m = [trunc(rest[0]), trunc(rest[1])];
        let l = [_mm512_sub_ps(rest[0], m[0]), _mm512_sub_ps(rest[1], m[1])];
        // Truncated values are bf16 values, so converting them is exact; so is lo's.
        parts[0][r] = bits(_mm512_cvtne2ps_pbh(h[1], h[0]));
        parts[1][r] = bits(_mm512_cvtne2ps_pbh(m[1], m[0]));
        parts[2][r] = bits(_mm512_cvtne2ps_pbh(l[1], l[0]));
    }
    for (pi, part) in parts.iter_mut().enumerate() {
        // Row r's dword q is its pair q; after the transpose vector q holds pair q of
        // every row.
        transpose16(part);
        for (q, v) in part.iter().enumerate() {
            // SAFETY: tile pi of out, row q (caller).
            unsafe { _mm512_storeu_si512(out.add(pi * TILE + q * 64).cast(), *v) };
        }
    }
}

/// Steps (32 elements of K) per K-block: 0 for the default ([`KS_DEFAULT`]), else the
/// value set for the bench's tuning runs; a value of at least K's steps keeps C in the tile
/// registers over all of K (the loop before K-blocking).
static KSTEPS: AtomicUsize = AtomicUsize::new(0);

/// Default steps per K-block: 16 (512 elements, two K-quant super-blocks), so that x's
/// K-block (3 tiles a step per 16 rows: 384 KiB at 128 rows) stays in L2 while every panel
/// of the chunk multiplies it, and a panel's K-block (4 tiles a step: 64 KiB) stays near
/// while every row block of x multiplies it. Without K-blocking, x's tiles over all of K
/// (2.3 MiB at 128 rows and K = 3072) left L2 for every panel; 8 steps measured slower
/// than 16 (C's tile loads and stores twice as often).
const KS_DEFAULT: usize = 16;

/// Panels per chunk: the C accumulators of a chunk (4 KiB per panel and 32 rows of x) stay
/// in L2 between K-blocks.
const CHUNK: usize = 8;

/// Sets the steps per K-block (0: the default) for later calls. For the bench's tuning.
pub(crate) fn set_k_steps(steps: usize) {
    KSTEPS.store(steps, Ordering::Relaxed);
}

/// The task split (column ranges of panels, and row ranges of x when there are fewer
/// panels than threads) and each task's loops: per chunk of panels, per K-block, each
/// panel's K-block is dequantized and split once into bf16 tiles and then multiplied by
/// every row block of x, C accumulating in memory between K-blocks (see [`KS_DEFAULT`]).
#[allow(clippy::too_many_arguments)]
fn compute(
    xs: &XTiles,
    kp: usize,
    m: usize,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
    rounded: bool,
) {
    let n = w.n();
    let panels = n.div_ceil(NR);
    let threads = par.threads().max(1);
    let blocks = m.div_ceil(MB);
    let steps = kp / KT;
    // A K-block is whole weight blocks (block formats' rows are unpacked per K-block).
    let per_block = (w.format().block_elems() / KT).max(1);
    let ks = match KSTEPS.load(Ordering::Relaxed) {
        0 => KS_DEFAULT,
        s => s,
    }
    .next_multiple_of(per_block)
    .min(steps);
    // Eight column ranges a thread: each panel is still dequantized once, and on a shared
    // machine a thread that lost its core leaves less behind (a profile of prefill on the
    // loaded 2-core VM showed one thread with 3x the other's samples at two a thread).
    let tn = panels.min(8 * threads);
    let tm = super::finish::row_ranges(tn, blocks, threads);
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let xt = xs.tiles.as_slice();
    let terms = match w.format() {
        _ if rounded => Terms::Rounded,
        WeightFormat::F16 => Terms::F16,
        WeightFormat::Bf16 => Terms::Bf16,
        _ => Terms::Three,
    };
    let dense = w.format().block_elems() == 1;
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (b0, b1) = (ti * blocks / tm, (ti + 1) * blocks / tm);
        let (p0, p1) = (tj * panels / tn, (tj + 1) * panels / tn);
        if p0 == p1 || b0 == b1 {
            return;
        }
        let nb = b1 - b0;
        // The task's panel K-blocks in order: per chunk of panels, per K-block, per panel.
        let jobs = Jobs { p0, p1, steps, ks };
        let mut fresh = None;
        BUFS.with(|cell| {
            let mut guard = cell.try_borrow_mut().ok();
            let bufs = match guard.as_deref_mut() {
                Some(b) => b,
                None => fresh.insert(PanelBufs::default()),
            };
            let _tiles = TileConfig::load();
            let mut out = [0.0f32; MB * NR];
            let mut job = jobs.first();
            pack_panel(
                &w,
                job.p,
                job.s0,
                job.s1,
                &mut bufs.panel,
                &mut bufs.row,
                rounded,
            );
            loop {
                if job.p == job.c0 && job.s0 == 0 {
                    bufs.acc.reset((job.c1 - job.c0) * nb * 4 * TILE);
                }
                let next = jobs.after(&job);
                // Dense formats pack the next panel K-block between the tile products of
                // this one's kernels, hiding the conversion behind the tiles' latency.
                let mut packer = match next {
                    Some(nj) if dense => Some(DensePacker::new(
                        &w,
                        &nj,
                        nb * (job.s1 - job.s0),
                        &mut bufs.next,
                        rounded,
                    )),
                    _ => None,
                };
                let panel = bufs.panel.as_slice();
                // The chunk's C tiles, written by the kernels' tile stores.
                let acc = bufs.acc.as_mut_slice().as_mut_ptr();
                for b in b0..b1 {
                    let rows = MB.min(m - b * MB);
                    let xb = xt[(b * 2 * steps + job.s0) * 3 * TILE..].as_ptr();
                    let at = ((job.p - job.c0) * nb + b - b0) * 4 * TILE;
                    let ctx = Block {
                        terms,
                        panel: panel.as_ptr(),
                        xb,
                        xblk: steps * 3 * TILE,
                        steps: job.s1 - job.s0,
                        // In bounds: acc holds (c1 - c0) nb blocks of 4 tiles.
                        c: acc.wrapping_add(at).cast(),
                        first: job.s0 == 0,
                    };
                    let mut between = || {
                        if let Some(pk) = packer.as_mut() {
                            // SAFETY: AVX-512F/BW/VL/BF16 available (`available`); the
                            // packer's source rows and buffer are as it was built with.
                            unsafe { pk.advance() };
                        }
                    };
                    // SAFETY: the tile config is loaded on this thread; x's tiles hold the
                    // 16-row blocks 2b (and 2b + 1 when rows > 16) of `steps` steps, of
                    // which s0..s1 are read; the panel holds s1 - s0 steps of 4 tiles; c is
                    // this block's 4 C tiles (4 KiB inside acc), read unless s0 = 0.
                    unsafe {
                        if rows > 16 {
                            kernel::<2, _>(&ctx, &mut between);
                        } else {
                            kernel::<1, _>(&ctx, &mut between);
                        }
                    }
                }
                if let Some(mut pk) = packer {
                    // SAFETY: as above.
                    unsafe { pk.finish() };
                } else if let Some(nj) = next {
                    pack_panel(
                        &w,
                        nj.p,
                        nj.s0,
                        nj.s1,
                        &mut bufs.next,
                        &mut bufs.row,
                        rounded,
                    );
                }
                if job.p + 1 == job.c1 && job.s1 == steps {
                    // The chunk's C is complete: through the epilogue to y.
                    for p in job.c0..job.c1 {
                        let j0 = p * NR;
                        let cols = NR.min(n - j0);
                        for b in b0..b1 {
                            let i0 = b * MB;
                            let rows = MB.min(m - i0);
                            let at = ((p - job.c0) * nb + b - b0) * 4 * TILE;
                            // SAFETY: AVX-512F available; the block's 4 C tiles (`at`, 4
                            // KiB, 64-byte aligned) were stored by its kernels; rows is
                            // 1..=32.
                            unsafe {
                                let c = &*acc.add(at).cast::<[f32; 1024]>();
                                transpose_c(c, rows.div_ceil(16), &mut out);
                            }
                            // SAFETY: rows i0..i0 + rows, columns j0..j0 + cols of y are in
                            // bounds and this task's alone; the epilogue was checked; out
                            // holds `rows` rows of NR floats; the VNNI path's ISA is
                            // available (callers).
                            unsafe { finish(Path::Vnni512, &out, NR, rows, cols, i0, j0, epi, yp) };
                        }
                    }
                }
                match next {
                    Some(nj) => {
                        std::mem::swap(&mut bufs.panel, &mut bufs.next);
                        job = nj;
                    }
                    None => break,
                }
            }
        });
    };
    let tasks = tm * tn;
    if tasks <= 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// One panel K-block of a task: panel `p` (weight rows `32 p..`), steps `s0..s1` of K,
/// in the chunk of panels `c0..c1`.
#[derive(Clone, Copy)]
struct Job {
    c0: usize,
    c1: usize,
    p: usize,
    s0: usize,
    s1: usize,
}

/// A task's panels `p0..p1` in chunks of [`CHUNK`], K in blocks of `ks` steps.
struct Jobs {
    p0: usize,
    p1: usize,
    steps: usize,
    ks: usize,
}

impl Jobs {
    fn first(&self) -> Job {
        Job {
            c0: self.p0,
            c1: (self.p0 + CHUNK).min(self.p1),
            p: self.p0,
            s0: 0,
            s1: self.ks.min(self.steps),
        }
    }

    /// The job after `j`: the next panel of its chunk, else the chunk's first panel at the
    /// next K-block, else the next chunk's first job.
    fn after(&self, j: &Job) -> Option<Job> {
        if j.p + 1 < j.c1 {
            return Some(Job { p: j.p + 1, ..*j });
        }
        if j.s1 < self.steps {
            return Some(Job {
                p: j.c0,
                s0: j.s1,
                s1: (j.s1 + self.ks).min(self.steps),
                ..*j
            });
        }
        (j.c1 < self.p1).then(|| Job {
            c0: j.c1,
            c1: (j.c1 + CHUNK).min(self.p1),
            p: j.c1,
            s0: 0,
            s1: self.ks.min(self.steps),
        })
    }
}

/// Packs a float-format panel K-block a few (row, step) units at a time, in row order:
/// `advance` does one share (the units over the calls the caller will make), `finish` the
/// rest.
struct DensePacker {
    format: WeightFormat,
    /// Weight row `32 p`'s first element of the K-block.
    src: *const u8,
    row_bytes: usize,
    /// Elements of K from the K-block's start.
    k: usize,
    /// Weight rows of the panel (the rest of the 32 are zero).
    cols: usize,
    steps: usize,
    dst: *mut u8,
    unit: usize,
    quota: usize,
    /// Weights rounded to bf16 into the hi slots alone (see [`emit_dense`]).
    rounded: bool,
}

impl DensePacker {
    /// A packer of job `j` into `buf`, its `32 x steps` units spread over `calls` calls of
    /// `advance`.
    fn new(
        w: &QuantMatRef<'_>,
        j: &Job,
        calls: usize,
        buf: &mut AlignedBytes,
        rounded: bool,
    ) -> DensePacker {
        let steps = j.s1 - j.s0;
        let es = dense_bytes(w.format());
        let j0 = j.p * NR;
        let row = w.rows(j0, j0 + 1);
        DensePacker {
            format: w.format(),
            src: row[j.s0 * KT * es..].as_ptr(),
            row_bytes: row.len(),
            k: w.k() - j.s0 * KT,
            cols: NR.min(w.n() - j0),
            steps,
            dst: buf.reset(steps * 4 * TILE).as_mut_ptr(),
            unit: 0,
            quota: (NR * steps).div_ceil(calls.max(1)),
            rounded,
        }
    }

    /// Packs the next share of units.
    ///
    /// # Safety
    /// AVX-512F/BW/VL/BF16 available; the weights and buffer it was built from alive and
    /// unmoved.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn advance(&mut self) {
        let end = (self.unit + self.quota).min(NR * self.steps);
        // SAFETY: caller.
        unsafe { self.run_to(end) };
    }

    /// Packs every remaining unit.
    ///
    /// # Safety
    /// As [`DensePacker::advance`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn finish(&mut self) {
        // SAFETY: caller.
        unsafe { self.run_to(NR * self.steps) };
    }

    /// # Safety
    /// As [`DensePacker::advance`]; `end <= 32 steps`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn run_to(&mut self, end: usize) {
        while self.unit < end {
            let (r, st) = (self.unit / self.steps, self.unit % self.steps);
            let run = (self.steps - st).min(end - self.unit);
            let dst = self.dst.wrapping_add(r * 64 + st * 4 * TILE);
            if r < self.cols {
                let e = st * KT;
                let es = dense_bytes(self.format);
                // SAFETY: row r (< cols, inside W) from element e of the K-block (< k:
                // steps cover K rounded up to 32); the buffer holds `steps` steps of 4
                // tiles, row r's slots among them (caller, `new`).
                unsafe {
                    emit_dense(
                        self.format,
                        self.src.add(r * self.row_bytes + e * es),
                        self.k - e,
                        run,
                        dst,
                        self.rounded,
                    )
                };
            } else {
                for s in 0..run {
                    // SAFETY: as above (zero slots for rows past the weights).
                    unsafe {
                        _mm512_storeu_si512(dst.add(s * 4 * TILE).cast(), _mm512_setzero_si512());
                        _mm512_storeu_si512(
                            dst.add(s * 4 * TILE + 2 * TILE).cast(),
                            _mm512_setzero_si512(),
                        );
                    }
                }
            }
            self.unit += run;
        }
    }
}

/// C tiles `c[xb][wt]` (`[16 weight rows][16 rows of x]` each) into `out[16 xb + r][16 wt
/// + c]` (rows of x by weight rows, y's layout).
///
/// # Safety
/// AVX-512F available; `xbs` is 1 or 2.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_c(c: &[f32; 1024], xbs: usize, out: &mut [f32; MB * NR]) {
    for xb in 0..xbs {
        for wt in 0..2 {
            let tile = &c[(xb * 2 + wt) * 256..][..256];
            let mut v: [__m512i; 16] = std::array::from_fn(|r| {
                // SAFETY: row r of the 256-float tile.
                unsafe { _mm512_loadu_si512(tile.as_ptr().add(r * 16).cast()) }
            });
            transpose16(&mut v);
            for (r, vr) in v.iter().enumerate() {
                // SAFETY: row 16 xb + r < 32 of out, columns 16 wt..16 wt + 16 <= 32.
                unsafe {
                    _mm512_storeu_si512(
                        out.as_mut_ptr().add((16 * xb + r) * NR + 16 * wt).cast(),
                        *vr,
                    )
                };
            }
        }
    }
}

/// Dequantizes W's rows `32 p..` (zero rows past W's, zero past K), steps `s0..s1` of
/// K, into `out`'s A tiles: per 32 elements of K, `[hi rows 0-15, hi 16-31, lo 0-15, lo
/// 16-31]`, each 16 rows of 32 bf16. For block formats `s0` and `s1` (or K's end) fall on
/// weight-block boundaries.
fn pack_panel(
    w: &QuantMatRef<'_>,
    p: usize,
    s0: usize,
    s1: usize,
    out: &mut AlignedBytes,
    scratch: &mut RowScratch,
    rounded: bool,
) {
    let (k, j0) = (w.k(), p * NR);
    let cols = NR.min(w.n() - j0);
    let format = w.format();
    let n_steps = s1 - s0;
    let panel = out.reset(n_steps * 4 * TILE);
    for r in 0..NR {
        // Row r's 64 bytes of hi at step st: st * 4 TILE + r * 64; lo 2 TILE further.
        let dst = panel.as_mut_ptr().wrapping_add(r * 64);
        if r >= cols {
            for st in 0..n_steps {
                panel[st * 4 * TILE + r * 64..][..64].fill(0);
                panel[st * 4 * TILE + 2 * TILE + r * 64..][..64].fill(0);
            }
            continue;
        }
        let bytes = w.rows(j0 + r, j0 + r + 1);
        match format {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
                let es = dense_bytes(format);
                let e0 = s0 * KT;
                // SAFETY: AVX-512F/BW/BF16 available; the row holds k elements, from e0
                // (< k) k - e0 of them; the panel holds n_steps steps of 4 tiles, row r's
                // 64-byte slots among them.
                unsafe {
                    emit_dense(
                        format,
                        bytes[e0 * es..].as_ptr(),
                        k - e0,
                        n_steps,
                        dst,
                        rounded,
                    )
                };
            }
            WeightFormat::Block(b) => {
                let sp = spec(b);
                let (be, bb) = (b.block_elems(), b.block_bytes());
                let (e0, e1) = (s0 * KT, (s1 * KT).min(k));
                let bytes = &bytes[e0 / be * bb..e1.div_ceil(be) * bb];
                let kk = e1 - e0;
                let ng = kk / sp.g;
                let u = scratch.u.reset(kk);
                scratch.s.resize(ng, 0.0);
                scratch.t.resize(ng, 0.0);
                // SAFETY: the VNNI path's features (AVX-512F/BW/VL) are available.
                if !unsafe { unpack_row_simd(b, bytes, u) } {
                    unpack_row(b, bytes, u, &mut scratch.s, &mut scratch.t);
                } else {
                    scales_row(b, bytes, &mut scratch.s, &mut scratch.t);
                }
                // SAFETY: AVX-512F/BF16 available; u holds kk quants, s/t kk / g groups
                // (kk = 32 n_steps: whole blocks of at least 32); row r's slots as above.
                unsafe { emit_block(u.as_ptr(), &scratch.s, &scratch.t, sp.g, sp.offset, kk, dst) };
            }
        }
    }
}

/// `steps` steps of a float-format row with `k` elements left from `src` (zero past them)
/// split into row r's hi and lo slots of the panel (`dst` = row r's slot in step 0), or
/// (`rounded`) rounded to bf16 into the hi slots alone.
///
/// # Safety
/// AVX-512F/BW/VL/BF16 available; `src` holds `k` elements of `format`; `dst` + st 4 TILE and
/// + st 4 TILE + 2 TILE hold 64 bytes for every step st < `steps`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn emit_dense(
    format: WeightFormat,
    src: *const u8,
    k: usize,
    steps: usize,
    dst: *mut u8,
    rounded: bool,
) {
    for st in 0..steps {
        // SAFETY: elements below k of the row (caller).
        let (v0, v1) = unsafe {
            (
                load_dense(format, src, st * KT, k),
                load_dense(format, src, st * KT + 16, k),
            )
        };
        if rounded {
            // SAFETY: step st's hi slot (caller).
            unsafe {
                _mm512_storeu_si512(
                    dst.add(st * 4 * TILE).cast(),
                    bits(_mm512_cvtne2ps_pbh(v1, v0)),
                )
            };
        } else {
            // SAFETY: step st's hi and lo slots (caller).
            unsafe { store_split(v0, v1, dst, st) };
        }
    }
}

/// Bytes of one element of a float format: 4 for f32, 2 for f16 and bf16.
#[inline]
fn dense_bytes(format: WeightFormat) -> usize {
    if format == WeightFormat::F32 {
        4
    } else {
        2
    }
}

/// Step `st`'s 32 elements `v0 ++ v1` of a weight row split into bf16 `hi + lo`
/// ([`split_vec`]) and stored in the row's hi and lo slots of the step (`dst` = the row's
/// slot in step 0): the tail that [`emit_dense`] and [`emit_block`] share.
///
/// # Safety
/// AVX-512F/BW/BF16 available; `dst + st 4 TILE` and `dst + st 4 TILE + 2 TILE` hold 64
/// bytes each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn store_split(v0: __m512, v1: __m512, dst: *mut u8, st: usize) {
    let (h, l) = split_vec(v0, v1);
    // SAFETY: the step's two slots (caller).
    unsafe {
        _mm512_storeu_si512(dst.add(st * 4 * TILE).cast(), h);
        _mm512_storeu_si512(dst.add(st * 4 * TILE + 2 * TILE).cast(), l);
    }
}

/// Elements `i..i + 16` of a float-format row of `k` as f32 (zero from `k`).
///
/// # Safety
/// AVX-512F/BW/VL available; `src` holds `k` elements of `format`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn load_dense(
    format: WeightFormat,
    src: *const u8,
    i: usize,
    k: usize,
) -> __m512 {
    let mask = if k >= i + 16 {
        0xffff
    } else if k > i {
        ((1u32 << (k - i)) - 1) as u16
    } else {
        0
    };
    // SAFETY: masked lanes are elements i..min(i + 16, k) (caller).
    unsafe {
        match format {
            WeightFormat::F32 => _mm512_maskz_loadu_ps(mask, src.cast::<f32>().add(i)),
            WeightFormat::F16 => {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src.cast::<i16>().add(i)))
            }
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(mask, src.cast::<i16>().add(i)),
            ))),
        }
    }
}

/// A block-format row (`k` unsigned quants `u`, per group of `g` the scale `s` and offset
/// `t`: `w = s (u - offset) + t`) split into row r's hi and lo slots (as [`emit_dense`]).
///
/// # Safety
/// AVX-512F/BF16 available; `u` holds `k` quants (`k` a multiple of 32 and of `g`), `s`
/// and `t` `k / g` floats; `dst` as for [`emit_dense`] with `kp = k`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn emit_block(
    u: *const u8,
    s: &[f32],
    t: &[f32],
    g: usize,
    offset: i32,
    k: usize,
    dst: *mut u8,
) {
    let off = _mm512_set1_epi32(offset);
    for st in 0..k / KT {
        // SAFETY: elements st 32..st 32 + 32 < k of u; their groups < k / g (caller).
        let (v0, v1) = unsafe {
            (
                scale16(u, s, t, g, off, st * KT),
                scale16(u, s, t, g, off, st * KT + 16),
            )
        };
        // SAFETY: step st's hi and lo slots (caller).
        unsafe { store_split(v0, v1, dst, st) };
    }
}

/// `s (u - offset) + t` for quants `e..e + 16` (one group: `g` is 16 or 32).
///
/// # Safety
/// AVX-512F available; `u` holds elements `e..e + 16`; `s`, `t` hold group `e / g`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scale16(u: *const u8, s: &[f32], t: &[f32], g: usize, off: __m512i, e: usize) -> __m512 {
    let gi = e / g;
    // SAFETY: elements e..e + 16 of u, group gi (caller).
    unsafe {
        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(u.add(e).cast()));
        let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, off));
        _mm512_fmadd_ps(
            _mm512_set1_ps(*s.get_unchecked(gi)),
            v,
            _mm512_set1_ps(*t.get_unchecked(gi)),
        )
    }
}

/// Which products a panel's tiles take (by weight format).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Terms {
    /// `w_hi x_mid + w_hi x_hi + w_lo x_hi`: 16 bits of w and of x (block formats, whose
    /// dequantized weights have up to 18 significant bits; x was int8 on the VNNI path).
    Three,
    /// `w_hi (x_lo + x_mid + x_hi) + w_lo (x_hi + x_mid)`: x exact, w (f16: 11 bits) exact;
    /// the dropped `w_lo x_lo` is below `2^-24` of the product, f32's own rounding.
    F16,
    /// `w (x_lo + x_mid + x_hi)`: a bf16 weight is its hi half; x exact.
    Bf16,
    /// `w_hi x_hi`, both rounded to bf16
    /// ([`MatmulPrecision::Bf16`](crate::MatmulPrecision::Bf16)).
    Rounded,
}

/// One register block's work: a panel's K-block against 32 (or 16) rows of x.
struct Block {
    terms: Terms,
    /// The panel's K-block: `steps` steps of 4 tiles.
    panel: *const u8,
    /// x's first 16-row block at the K-block's first step (3 tiles a step).
    xb: *const u8,
    /// Bytes from one 16-row block of x to the next.
    xblk: usize,
    steps: usize,
    /// The block's C tiles `[xb][weight tile]`, `[16 weight rows][16 rows of x]` floats.
    c: *mut f32,
    /// Whether C starts at zero (the first K-block) rather than from `c`.
    first: bool,
}

/// The panel's two 16-row A tiles of weights against `XB` (1 or 2) B tiles of 16 rows of
/// x over the block's steps, the products of `terms`, added to C (zero or loaded from
/// `c`) and stored back to `c`. C stays in tmm0-3 over the K-block; each A pair (tmm4-5)
/// is loaded once a step and multiplies every x part it takes in turn (tmm6-7).
///
/// # Safety
/// The tile config ([`TileConfig`]) is loaded on this thread; `panel` holds `steps` steps
/// of 4 tiles; `xb` (and `xb + xblk` for XB = 2) hold `steps` steps of 3 tiles; `c` holds
/// `XB * 2 * 256` floats (read unless `first`).
#[inline]
unsafe fn kernel<const XB: usize, F: FnMut()>(blk: &Block, between: &mut F) {
    let (panel, xb, xblk, c) = (blk.panel, blk.xb, blk.xblk, blk.c);
    // SAFETY: every tile access below reads one whole 1 KiB tile of the panel's step st
    // (4 tiles) or of x's blocks' step st (3 tiles), or reads or writes c's tiles (caller).
    unsafe {
        if blk.first {
            zero_c();
        } else {
            load_c::<XB>(c);
        }
        for st in 0..blk.steps {
            let a = panel.add(st * 4 * TILE);
            let b = xb.add(st * 3 * TILE);
            let bx = |part: usize| (b.add(part * TILE), b.add(xblk + part * TILE));
            let (hi, mid, lo) = (bx(0), bx(1), bx(2));
            load_a(a);
            match blk.terms {
                Terms::Three => {
                    products::<XB>(mid);
                    between();
                    products::<XB>(hi);
                    load_a(a.add(2 * TILE));
                    products::<XB>(hi);
                }
                Terms::F16 => {
                    products::<XB>(lo);
                    products::<XB>(mid);
                    between();
                    products::<XB>(hi);
                    load_a(a.add(2 * TILE));
                    products::<XB>(hi);
                    products::<XB>(mid);
                }
                Terms::Bf16 => {
                    products::<XB>(lo);
                    products::<XB>(mid);
                    between();
                    products::<XB>(hi);
                }
                Terms::Rounded => {
                    between();
                    products::<XB>(hi);
                }
            }
        }
        store_c::<XB>(c);
    }
}

/// Loads the C tiles from `c` (as [`store_c`] writes them).
///
/// # Safety
/// A tile config is loaded on this thread; `c` holds `XB * 2 * 256` floats.
#[inline(always)]
unsafe fn load_c<const XB: usize>(c: *const f32) {
    // SAFETY: reads XB * 2 tiles of 1 KiB inside c (caller).
    unsafe {
        asm!(
            "tileloadd tmm0, [{c} + {s64} * 1]",
            "tileloadd tmm1, [{c} + {s64} * 1 + 1024]",
            c = in(reg) c,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        );
        if XB == 2 {
            asm!(
                "tileloadd tmm2, [{c} + {s64} * 1 + 2048]",
                "tileloadd tmm3, [{c} + {s64} * 1 + 3072]",
                c = in(reg) c,
                s64 = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Zeroes the C tiles.
///
/// # Safety
/// A tile config is loaded on this thread.
#[inline(always)]
unsafe fn zero_c() {
    // SAFETY: tile registers only (config loaded: caller).
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        )
    };
}

/// The A pair (weight rows 0-15 and 16-31 of one part) from `a` into tmm4-5.
///
/// # Safety
/// A tile config is loaded on this thread; `a` holds two 1 KiB tiles.
#[inline(always)]
unsafe fn load_a(a: *const u8) {
    // SAFETY: reads 2 KiB from a (caller).
    unsafe {
        asm!(
            "tileloadd tmm4, [{a} + {s64} * 1]",
            "tileloadd tmm5, [{a} + {s64} * 1 + 1024]",
            a = in(reg) a,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// Loads x tiles `b.0` (and `b.1` for XB = 2) into tmm6-7 and accumulates their products
/// with tmm4-5 into the C tiles.
///
/// # Safety
/// A tile config is loaded on this thread; `b.0` (and `b.1`) hold a 1 KiB tile.
#[inline(always)]
unsafe fn products<const XB: usize>(b: (*const u8, *const u8)) {
    // SAFETY: reads one tile from b.0 (and b.1) (caller); the rest is tile registers.
    unsafe {
        if XB == 2 {
            asm!(
                "tileloadd tmm6, [{b0} + {s64} * 1]",
                "tileloadd tmm7, [{b1} + {s64} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                b0 = in(reg) b.0,
                b1 = in(reg) b.1,
                s64 = in(reg) 64usize,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tileloadd tmm6, [{b0} + {s64} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                b0 = in(reg) b.0,
                s64 = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Stores the C tiles to `c` (tiles `[xb][weight tile]`, 16 rows of 64 bytes each).
///
/// # Safety
/// A tile config is loaded on this thread; `c` holds `XB * 2 * 256` floats.
#[inline(always)]
unsafe fn store_c<const XB: usize>(c: *mut f32) {
    // SAFETY: writes XB * 2 tiles of 1 KiB inside c (caller).
    unsafe {
        asm!(
            "tilestored [{c} + {s64} * 1], tmm0",
            "tilestored [{c} + {s64} * 1 + 1024], tmm1",
            c = in(reg) c,
            s64 = in(reg) 64usize,
            options(nostack),
        );
        if XB == 2 {
            asm!(
                "tilestored [{c} + {s64} * 1 + 2048], tmm2",
                "tilestored [{c} + {s64} * 1 + 3072], tmm3",
                c = in(reg) c,
                s64 = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

/// The tiles' peak (see `quant_amx_peak`): `iters` rounds of 16 `tdpbf16ps` (16 x 16 x 32
/// multiply-adds each) into four C tiles, round-robin so that each waits on a product
/// three others back (hiding the latency), operands never reloaded.
pub(crate) fn peak(iters: usize) -> Option<f64> {
    if !available() || iters == 0 {
        return None;
    }
    let _tiles = TileConfig::load();
    let zero = [0u8; TILE];
    // SAFETY: the config is loaded; the loads read the 1 KiB `zero`; the rest is tile
    // registers.
    unsafe {
        asm!(
            "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
            "tileloadd tmm4, [{z} + {s64} * 1]",
            "tileloadd tmm5, [{z} + {s64} * 1]",
            "tileloadd tmm6, [{z} + {s64} * 1]",
            "tileloadd tmm7, [{z} + {s64} * 1]",
            z = in(reg) zero.as_ptr(),
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
    let start = std::time::Instant::now();
    for _ in 0..iters {
        // SAFETY: tile registers only.
        unsafe {
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm5, tmm6",
                "tdpbf16ps tmm2, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
    }
    let s = start.elapsed().as_secs_f64();
    Some((iters * 16 * 2 * 16 * 16 * 32) as f64 / s / 1e9)
}

/// The thread's tile configuration while alive (`tilerelease` on drop, which returns the
/// tile state to its initial, cheap-to-switch state): all eight tiles 16 rows x 64 bytes
/// (tmm0-3 the f32 C tiles, tmm4-5 A, tmm6-7 B).
struct TileConfig;

impl TileConfig {
    fn load() -> TileConfig {
        let mut cfg = [0u8; 64];
        cfg[0] = 1; // palette 1
        for t in 0..8 {
            cfg[16 + 2 * t..][..2].copy_from_slice(&64u16.to_le_bytes());
            cfg[48 + t] = 16;
        }
        // SAFETY: AMX is available and permitted (`enabled`); cfg is a valid 64-byte
        // palette-1 configuration (rows <= 16, colsb <= 64, reserved bytes zero).
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly)) };
        TileConfig
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        // SAFETY: AMX is available (a config was loaded); touches no memory.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[cfg(test)]
mod tests {
    use rafter_quant::{dequantize_row, quantize_row, BlockFormat};

    use super::*;
    use crate::{Isa, ScopedThreads};

    fn values(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// `n x k` weights of `format` from `v`, and their exact values as f64.
    fn encode(format: WeightFormat, v: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<f64>) {
        match format {
            WeightFormat::F32 => (
                v.iter().flat_map(|f| f.to_le_bytes()).collect(),
                v.iter().map(|&f| f as f64).collect(),
            ),
            WeightFormat::F16 => {
                let h: Vec<half::f16> = v.iter().map(|&f| half::f16::from_f32(f)).collect();
                (
                    h.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f64()).collect(),
                )
            }
            WeightFormat::Bf16 => {
                let h: Vec<half::bf16> = v.iter().map(|&f| half::bf16::from_f32(f)).collect();
                (
                    h.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|x| x.to_f64()).collect(),
                )
            }
            WeightFormat::Block(b) => {
                let rb = b.row_bytes(k).unwrap();
                let mut bytes = vec![0u8; n * rb];
                let mut deq = vec![0f32; n * k];
                for r in 0..n {
                    quantize_row(b, &v[r * k..][..k], &mut bytes[r * rb..][..rb]).unwrap();
                    dequantize_row(b, &bytes[r * rb..][..rb], &mut deq[r * k..][..k]).unwrap();
                }
                (bytes, deq.iter().map(|&f| f as f64).collect())
            }
        }
    }

    fn formats() -> Vec<WeightFormat> {
        let mut v = vec![WeightFormat::F16, WeightFormat::Bf16];
        v.extend(BlockFormat::ALL.into_iter().map(WeightFormat::Block));
        v
    }

    /// Every format, ragged M (tile and register-block edges), N (panel and chunk edges) and
    /// K (32 steps, K-blocks of several sizes), on 1, 2 and 3 threads, against an f64 product of x and the exact weights, with a bias: the error must
    /// stay within `2^-14` (block formats) or `2^-20` (f16, bf16) of `|bias| + Σ |x w|` per
    /// output (a kernel that drops a needed product errs by `2^-16` to `2^-9`, wrong tiles or
    /// layouts by far more). Also
    /// reports the AVX-512 path's error on the same data for comparison, and checks that the
    /// AMX error is no larger than it for block formats (whose x there is rounded to int8).
    #[test]
    fn amx_matches_f64_reference_on_ragged_shapes() {
        if !available() {
            eprintln!("AMX-BF16 unavailable: skipped");
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for format in formats() {
            let be = format.block_elems();
            let ks: Vec<usize> = if be == 1 {
                vec![1, 31, 33, 100, 300, 1100]
            } else if be == 32 {
                vec![32, 96, 288]
            } else {
                vec![256, 768]
            };
            let mut worst = (0.0f64, 0.0f64);
            // 16 bits of w and x for block formats; float formats as exact as f32 sums.
            let tol = if be == 1 {
                2f64.powi(-20)
            } else {
                2f64.powi(-14)
            };
            for &k in &ks {
                for &(m, n) in &[
                    (1, 1),
                    (15, 17),
                    (17, 32),
                    (33, 45),
                    (70, 70),
                    (48, 33),
                    (130, 300),
                ] {
                    let wv = values(n * k, &mut seed);
                    let x = values(m * k, &mut seed);
                    let bias = values(n, &mut seed);
                    let (bytes, wd) = encode(format, &wv, n, k);
                    let wq = QuantMatRef::new(format, &bytes, n, k).unwrap();
                    let xr = MatRef {
                        data: &x,
                        rows: m,
                        cols: k,
                        rs: k,
                        cs: 1,
                    };
                    let epi = Epilogue {
                        bias: Some(&bias),
                        ..Epilogue::none()
                    };
                    let mut y = vec![f32::NAN; m * n];
                    let mut yb = vec![f32::NAN; m * n];
                    // K-blocks of one step (rounded up to whole weight blocks), three, and
                    // the default; one thread, two, and three (row ranges when a column
                    // range is too few).
                    for (threads, ks) in [(1, 1), (2, 3), (3, 0), (1, 0), (2, 0)] {
                        let par = ScopedThreads::new(threads);
                        set_k_steps(ks);
                        run(
                            xr,
                            wq,
                            MatMut::row_major(&mut y, m, n, n).unwrap(),
                            &epi,
                            &par,
                            false,
                        );
                        super::super::gemm::run_avx(
                            Isa::Avx512,
                            Path::Vnni512,
                            xr,
                            wq,
                            MatMut::row_major(&mut yb, m, n, n).unwrap(),
                            &epi,
                            &par,
                        );
                        for i in 0..m {
                            for j in 0..n {
                                let (mut want, mut mag) = (bias[j] as f64, (bias[j] as f64).abs());
                                for p in 0..k {
                                    let t = x[i * k + p] as f64 * wd[j * k + p];
                                    want += t;
                                    mag += t.abs();
                                }
                                let err = (y[i * n + j] as f64 - want).abs();
                                let errb = (yb[i * n + j] as f64 - want).abs();
                                worst.0 = worst.0.max(err / mag.max(1e-30));
                                worst.1 = worst.1.max(errb / mag.max(1e-30));
                                assert!(
                                    err <= mag * tol,
                                    "{} m={m} n={n} k={k} threads={threads} ks={ks} ({i},{j}): {} vs {want}",
                                    format.name(),
                                    y[i * n + j]
                                );
                            }
                        }
                    }
                }
            }
            set_k_steps(0);
            eprintln!(
                "{}: worst |err| / (|b| + Σ|x w|): AMX {:.2e}, AVX-512 {:.2e}",
                format.name(),
                worst.0,
                worst.1
            );
            // Block formats: far closer than int8 x; float formats: within the f32 sums'
            // rounding of the AVX-512 path (a different order of additions).
            let bound = if be == 1 { 2.0 * worst.1 } else { worst.1 };
            {
                assert!(worst.0 <= bound, "{}: AMX less accurate", format.name());
            }
        }
    }

    /// `rounded` (bf16 precision): for f16 and bf16 weights on ragged shapes and threads,
    /// every output is the f64 product of the bf16-rounded (to nearest even, `half`'s
    /// conversion) x and weights within f32 summation error (`(k + 16) 2^-23` of `|b| +
    /// Σ|x w|`), and over all outputs 8x closer to it than to the exact product (unrounded
    /// operands fail that); block formats ignore the flag (their results equal the
    /// unrounded run's bit for bit).
    #[test]
    fn amx_rounded_is_the_product_of_bf16_operands() {
        if !available() {
            eprintln!("AMX-BF16 unavailable: skipped");
            return;
        }
        let bf = |v: f64| half::bf16::from_f64(v).to_f64();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for format in [
            WeightFormat::F16,
            WeightFormat::Bf16,
            WeightFormat::Block(BlockFormat::Q4_0),
        ] {
            for &(m, n, k) in &[
                (17usize, 33usize, 31usize),
                (33, 45, 100),
                (130, 70, 1100),
                (48, 300, 64),
            ] {
                let k = if format.block_elems() > 1 {
                    k.next_multiple_of(32)
                } else {
                    k
                };
                let wv = values(n * k, &mut seed);
                let x = values(m * k, &mut seed);
                let bias = values(n, &mut seed);
                let (bytes, wd) = encode(format, &wv, n, k);
                let wq = QuantMatRef::new(format, &bytes, n, k).unwrap();
                let xr = MatRef {
                    data: &x,
                    rows: m,
                    cols: k,
                    rs: k,
                    cs: 1,
                };
                let epi = Epilogue {
                    bias: Some(&bias),
                    ..Epilogue::none()
                };
                for threads in [1, 3] {
                    let par = ScopedThreads::new(threads);
                    let mut y = vec![f32::NAN; m * n];
                    run(
                        xr,
                        wq,
                        MatMut::row_major(&mut y, m, n, n).unwrap(),
                        &epi,
                        &par,
                        true,
                    );
                    if format.block_elems() > 1 {
                        let mut yu = vec![f32::NAN; m * n];
                        run(
                            xr,
                            wq,
                            MatMut::row_major(&mut yu, m, n, n).unwrap(),
                            &epi,
                            &par,
                            false,
                        );
                        assert_eq!(y, yu, "{}: block formats are never rounded", format.name());
                        continue;
                    }
                    // Summed over the outputs: the distance to the rounded operands'
                    // product and to the unrounded one.
                    let (mut near, mut far) = (0.0f64, 0.0f64);
                    for i in 0..m {
                        for j in 0..n {
                            let (mut want, mut mag) = (bias[j] as f64, (bias[j] as f64).abs());
                            let mut exact = bias[j] as f64;
                            for p in 0..k {
                                let t = bf(x[i * k + p] as f64) * bf(wd[j * k + p]);
                                want += t;
                                mag += t.abs();
                                exact += x[i * k + p] as f64 * wd[j * k + p];
                            }
                            let err = (y[i * n + j] as f64 - want).abs();
                            near += err;
                            far += (y[i * n + j] as f64 - exact).abs();
                            assert!(
                                err <= mag * (k + 16) as f64 * 2f64.powi(-23),
                                "{} m={m} n={n} k={k} threads={threads} ({i},{j}): {} vs {want}",
                                format.name(),
                                y[i * n + j]
                            );
                        }
                    }
                    assert!(
                        8.0 * near < far,
                        "{} m={m} n={n} k={k}: {near:.2e} from the rounded operands' product, \
                         {far:.2e} from the exact one: operands not rounded?",
                        format.name()
                    );
                }
            }
        }
    }
}
