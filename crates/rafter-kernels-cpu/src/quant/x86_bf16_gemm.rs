//! The prefill GEMM with bf16 products on AVX512-BF16 (Zen 4, Cooper Lake, Sapphire Rapids
//! and later), for f32/f16/bf16 weights when the caller asks for
//! [`MatmulPrecision::Bf16`](crate::MatmulPrecision::Bf16).
//!
//! Why: `vdpbf16ps` does 32 multiply-adds per 64-byte vector (two bf16 products summed
//! into each f32 lane), twice an f32 FMA's, and Zen 4 issues it as often as the FMA: with
//! both operands in bf16 a GEMM has twice the f32 GEMM's peak. Measured on the 2-core Zen
//! 4 VM (`cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --m 128 --formats f16
//! --threads 2 --precision f32,bf16`): 270-362 GFLOP/s on a Qwen3-0.6B layer's shapes
//! against 139-183 for the f32 products, 1.2-1.6x the two threads' f32 FMA peak. Rounding weights and
//! activations to bf16 (8 significant bits, products accumulated in f32) is what PyTorch
//! computes for a bf16 model and llama.cpp for BF16 weights; rafter's default keeps the
//! f32 path's accuracy (see [`super::gemm`]), this is the caller's trade.
//!
//! Layout: x is rounded (to nearest even) once per call into the pair layout of
//! `vdpbf16ps`'s lanes: per block of 16 rows, per pair of K, the 16 rows' elements `2p`
//! and `2p + 1` as 16 dwords (one 64-byte vector). Each task converts a panel of [`NR`]
//! weight rows to bf16 (row-major, K padded to 32 with zeros) and multiplies every block
//! of 32 rows of x by it: [`NR`] x 2 accumulators (a weight row's 16 + 16 rows of x), per
//! pair of K two vector loads of x and one broadcast dword per weight row. The panel (12
//! rows: 72 KiB at K = 3072) and x (768 KiB at 128 rows of K = 3072) stay in L2 while the
//! panel meets every block of x. `vdpbf16ps` treats bf16 subnormal inputs (below `2^-126`)
//! as zero.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::finish::{finish, YPtr};
use super::gemv::AlignedBytes;
use super::x86_amx_bf16::load_dense;
use super::x86_vnni_gemm::transpose16;
use super::{Path, QuantMatRef, WeightFormat};
use crate::{Epilogue, MatMut, MatRef, Parallel};

/// Weight rows per panel: the micro-kernel's broadcast operands.
const NR: usize = 12;
/// Rows of x per micro-kernel call: two 16-lane vectors.
const MB: usize = 32;
/// K is padded to this (one `vcvtne2ps2bf16` of 32 floats).
const KT: usize = 32;

/// Whether this CPU runs the kernel (AVX512-BF16 besides the VNNI path's features).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Whether `format` can run here: the float formats (block formats keep ggml's int8
/// products whatever the precision asked).
pub(crate) fn supports(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16
    )
}

thread_local! {
    /// The calling thread's x in the pair layout.
    static XP: RefCell<AlignedBytes> = RefCell::new(AlignedBytes::default());
    /// A task's bf16 panel.
    static PANEL: RefCell<AlignedBytes> = RefCell::new(AlignedBytes::default());
    /// A task's 16 rows of x (K padded with zeros) on their way into the pair layout:
    /// reused, since a fresh buffer per block per call (196 KiB at K = 3072) went to the
    /// system allocator's mmap every time (f16 prefill with bf16 products, `rafter
    /// generate qwen3-0.6b-shape-f16.gguf --prompt-ids prompt-128.txt -n 4 --threads 2
    /// --matmul-precision bf16`, seven alternated runs each: median 320 -> 333 tok/s).
    static ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y = x · Wᵀ` (then the epilogue) with bf16 products; shapes checked by the caller (`k >
/// 0`, `m > 0`), [`available`] and the VNNI path's features present, `w`'s format
/// [`supports`]ed.
pub(crate) fn run(
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    debug_assert!(supports(w.format()));
    let kp = x.cols.next_multiple_of(KT);
    let mut fresh = None;
    XP.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let xp = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert(AlignedBytes::default()),
        };
        pair_layout(&x, kp, xp, par);
        compute(xp.as_slice(), kp, x.rows, w, y, epilogue, par);
    });
}

/// Bytes of one 16-row block of x in the pair layout.
fn block_bytes(kp: usize) -> usize {
    kp / 2 * 64
}

/// A raw pointer tasks share to write disjoint blocks of x's pair layout.
#[derive(Clone, Copy)]
struct Out(*mut u8);
// SAFETY: each task writes its own 16-row block of the buffer, which outlives the tasks
// (`Parallel::run` returns when all have returned).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// The address `off` bytes in (computed, not dereferenced; a method so that closures
    /// capture the whole `Sync` wrapper).
    fn at(self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

/// Rounds x to bf16 into `xp`: per 16-row block (rows past M zero), per pair `p` of K
/// (zero past K), 16 dwords holding row r's elements `2p` (low half) and `2p + 1`.
fn pair_layout(x: &MatRef<'_>, kp: usize, xp: &mut AlignedBytes, par: &dyn Parallel) {
    let blocks = x.rows.div_ceil(16);
    let out = Out(xp.reset(blocks * block_bytes(kp)).as_mut_ptr());
    let task = |b: usize| {
        let mut fresh = Vec::new();
        ROWS.with(|cell| {
            let mut guard = cell.try_borrow_mut().ok();
            let rows = guard.as_deref_mut().unwrap_or(&mut fresh);
            block_rows(x, b, kp, rows, out);
        });
    };
    if blocks == 1 || par.threads() <= 1 {
        (0..blocks).for_each(task);
    } else {
        par.run(blocks, &task);
    }
}

/// x's 16-row block `b` into the pair layout at `out` (see [`pair_layout`]), through
/// `rows` (16 rows of `kp` floats, zero past K and past M).
fn block_rows(x: &MatRef<'_>, b: usize, kp: usize, rows: &mut Vec<f32>, out: Out) {
    let (m, k) = (x.rows, x.cols);
    rows.clear();
    rows.resize(16 * kp, 0.0);
    for r in 0..16.min(m - b * 16) {
        let i = b * 16 + r;
        for (c, v) in rows[r * kp..][..k].iter_mut().enumerate() {
            *v = x.data[i * x.rs + c * x.cs];
        }
    }
    for c in 0..kp / KT {
        // SAFETY: AVX-512F/BW/BF16 available (callers); rows holds 16 rows of kp floats,
        // 32 from c * 32 < kp; block b's bytes c * 1024.. + 1024 are inside its
        // block_bytes(kp) and written by this task alone.
        unsafe {
            x_chunk(
                rows.as_ptr().add(c * KT),
                kp,
                out.at(b * block_bytes(kp) + c * 1024),
            )
        };
    }
}

/// 16 rows (at stride `ld` floats) of 32 floats, rounded to bf16, into 16 pair vectors at
/// `out` (vector q: every row's pair q).
///
/// # Safety
/// AVX-512F/BW/BF16 available; the rows' 32 floats readable; `out` writable for 1 KiB.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn x_chunk(rows: *const f32, ld: usize, out: *mut u8) {
    let mut v = [_mm512_setzero_si512(); 16];
    // A range loop, not iterators: closures would not inherit this function's target
    // features, and their intrinsics would not inline.
    #[allow(clippy::needless_range_loop)]
    for r in 0..16 {
        // SAFETY: row r's 32 floats (caller).
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_ps(rows.add(r * ld)),
                _mm512_loadu_ps(rows.add(r * ld + 16)),
            )
        };
        v[r] = bits(_mm512_cvtne2ps_pbh(hi, lo));
    }
    // Row r's dword q is its pair q; after the transpose vector q holds pair q of every row.
    transpose16(&mut v);
    for (q, vq) in v.iter().enumerate() {
        // SAFETY: 64 bytes at q * 64 < 1 KiB (caller).
        unsafe { _mm512_storeu_si512(out.add(q * 64).cast(), *vq) };
    }
}

/// A bf16 vector's bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn bits(v: __m512bh) -> __m512i {
    // SAFETY: both are 64-byte vectors of plain bits; every bit pattern is valid for both.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// Bits as a bf16 vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn bh(v: __m512i) -> __m512bh {
    // SAFETY: as for [`bits`].
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// The task split (column ranges of panels; row ranges of x when there are fewer panels
/// than threads) and each task's loop: per panel, convert it, multiply every 32-row block
/// of x by it, and finish the block's tile of y through the epilogue.
fn compute(
    xp: &[u8],
    kp: usize,
    m: usize,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let n = w.n();
    let panels = n.div_ceil(NR);
    let threads = par.threads().max(1);
    let blocks = m.div_ceil(MB);
    // Eight column ranges a thread: on a shared machine a thread that lost its core
    // leaves less behind (as the AMX kernel's split).
    let tn = panels.min(8 * threads);
    let tm = super::finish::row_ranges(tn, blocks, threads);
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let xblk = block_bytes(kp);
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (b0, b1) = (ti * blocks / tm, (ti + 1) * blocks / tm);
        let (p0, p1) = (tj * panels / tn, (tj + 1) * panels / tn);
        if p0 == p1 || b0 == b1 {
            return;
        }
        let mut fresh = None;
        PANEL.with(|cell| {
            let mut guard = cell.try_borrow_mut().ok();
            let buf = match guard.as_deref_mut() {
                Some(b) => b,
                None => fresh.insert(AlignedBytes::default()),
            };
            let panel = buf.reset(NR * kp * 2);
            let mut out = [0.0f32; MB * 16];
            for p in p0..p1 {
                let j0 = p * NR;
                let cols = NR.min(n - j0);
                // SAFETY: AVX-512F/BW/VL/BF16 available (caller); the panel holds NR rows
                // of kp bf16; rows j0..j0 + cols of w exist.
                unsafe { pack_panel(&w, j0, cols, kp, panel) };
                for b in b0..b1 {
                    let i0 = b * MB;
                    let rows = MB.min(m - i0);
                    let xb = xp[2 * b * xblk..].as_ptr();
                    // SAFETY: AVX-512F/BF16 available; x's pair layout holds 16-row blocks
                    // 2b (and 2b + 1 when rows > 16) of kp / 2 pairs at xblk bytes apart;
                    // the panel holds NR rows of kp bf16.
                    unsafe {
                        if rows > 16 {
                            kernel::<2>(xb, xblk, panel.as_ptr(), kp, &mut out);
                        } else {
                            kernel::<1>(xb, xblk, panel.as_ptr(), kp, &mut out);
                        }
                    }
                    // SAFETY: rows i0..i0 + rows, columns j0..j0 + cols of y are in bounds
                    // and this task's alone; the epilogue was checked; out holds `rows`
                    // rows of 16 floats; the VNNI path's ISA is available (callers).
                    unsafe { finish(Path::Vnni512, &out, 16, rows, cols, i0, j0, epi, yp) };
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

/// W's rows `j0..j0 + cols` rounded to bf16 into `panel`'s first `cols` rows of `kp`
/// elements (zero past K), the rest of its [`NR`] rows zero.
///
/// # Safety
/// AVX-512F/BW/VL/BF16 available; `panel` holds `NR * kp` bf16 (`kp` a multiple of 32 and
/// at least K); `cols <= NR` rows from `j0` exist in `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_panel(w: &QuantMatRef<'_>, j0: usize, cols: usize, kp: usize, panel: &mut [u8]) {
    let (k, format) = (w.k(), w.format());
    let src = w.rows(j0, j0 + cols);
    let rb = w.row_bytes();
    for r in 0..NR {
        let dst = panel[r * kp * 2..][..kp * 2].as_mut_ptr();
        if r >= cols {
            panel[r * kp * 2..][..kp * 2].fill(0);
            continue;
        }
        let row = src[r * rb..].as_ptr();
        for i in (0..kp).step_by(KT) {
            // SAFETY: load_dense reads elements i.. below k only (its mask); dst holds kp
            // bf16, 32 from i.
            unsafe {
                let lo = load_dense(format, row, i, k);
                let hi = load_dense(format, row, i + 16, k);
                _mm512_storeu_si512(dst.add(i * 2).cast(), bits(_mm512_cvtne2ps_pbh(hi, lo)));
            }
        }
    }
}

/// `out[16 h + r][j]` = the dot product of x's row `16 h + r` of the block at `xb` with the
/// panel's row j, for `h < XB`, `j < NR` (columns NR..16 of out unspecified).
///
/// # Safety
/// AVX-512F/BF16 available; `xb` holds XB 16-row blocks of `kp / 2` pair vectors at
/// `xblk` bytes apart; `panel` holds NR rows of `kp` bf16 (`kp` even).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel<const XB: usize>(
    xb: *const u8,
    xblk: usize,
    panel: *const u8,
    kp: usize,
    out: &mut [f32; MB * 16],
) {
    let mut acc = [[_mm512_setzero_ps(); XB]; NR];
    let row_bytes = kp * 2;
    for p in 0..kp / 2 {
        let mut xv = [bh(_mm512_setzero_si512()); XB];
        for (h, v) in xv.iter_mut().enumerate() {
            // SAFETY: pair vector p of block h (caller).
            *v = bh(unsafe { _mm512_loadu_si512(xb.add(h * xblk + p * 64).cast()) });
        }
        // A range loop: closures would not inherit the target features.
        #[allow(clippy::needless_range_loop)]
        for j in 0..NR {
            // SAFETY: row j's elements 2p and 2p + 1 (caller); unaligned read of 4 bytes.
            let pair = unsafe {
                panel
                    .add(j * row_bytes + p * 4)
                    .cast::<i32>()
                    .read_unaligned()
            };
            let wv = bh(_mm512_set1_epi32(pair));
            for h in 0..XB {
                acc[j][h] = _mm512_dpbf16_ps(acc[j][h], xv[h], wv);
            }
        }
    }
    // Range loops: closures would not inherit the target features.
    #[allow(clippy::needless_range_loop)]
    for h in 0..XB {
        // Rows: weight rows j (padded to 16 with zeros), lanes: rows of x.
        let mut v = [_mm512_setzero_si512(); 16];
        for j in 0..NR {
            v[j] = _mm512_castps_si512(acc[j][h]);
        }
        transpose16(&mut v);
        for (r, vr) in v.iter().enumerate() {
            // SAFETY: row 16 h + r < 32 of out.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add((16 * h + r) * 16).cast(), *vr) };
        }
    }
}
