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
//! dequantization is done once per panel of 32 weight rows and call, and the panel is then
//! reused by every row of x. Tile arithmetic flushes bf16 subnormal inputs to zero
//! (below `2^-126`).
//!
//! Layout: weights are the A operand, so a panel is row-major: per 32 elements of K,
//! `[hi rows 0-15, hi 16-31, lo 0-15, lo 16-31]`, 1 KiB tiles of 16 rows x 32 bf16, written
//! by the dequantization without transposes. x is the B operand in the pair layout
//! (`[16 pairs of K][16 rows][2]` bf16), built once per call by 16x16 dword transposes:
//! per 16 rows and 32 elements, three tiles (hi, mid, lo). Per 32 rows of x and panel, four
//! f32 C tiles (`[weight rows][rows of x]`) stay in tile registers over all of K, then are
//! transposed and go through the epilogue to y.
//!
//! On by default where CPUID reports AMX-TILE, AMX-BF16 and AVX512-BF16, the OS enables
//! the tile state (XCR0) and Linux grants the tile data permission (`arch_prctl`);
//! `RAFTER_CPU_AMX=0` keeps the AVX-512 kernels (VNNI int8 for block formats, the widened
//! f32 GEMM for float formats).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};
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

/// Per-thread buffers: the panel's A tiles, one weight row's quants and per-group scales
/// and offsets, and the C tiles of one register block.
#[derive(Default)]
struct PanelBufs {
    panel: AlignedBytes,
    u: AlignedBytes,
    s: Vec<f32>,
    t: Vec<f32>,
}

thread_local! {
    static XS: RefCell<XTiles> = RefCell::new(XTiles::default());
    static BUFS: RefCell<PanelBufs> = RefCell::new(PanelBufs::default());
}

/// `y = x · Wᵀ` (then the epilogue), any weight format; shapes checked by the caller
/// (`k > 0`), the VNNI path's features and AMX ([`enabled`]) available.
pub(crate) fn run(
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let mut fresh = None;
    XS.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let xs = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert(XTiles::default()),
        };
        let kp = x.cols.next_multiple_of(KT);
        x_tiles(&x, kp, xs);
        compute(xs, kp, x.rows, w, y, epilogue, par);
    });
}

/// Fills `xs.tiles` with x's B tiles (see [`XTiles`]).
fn x_tiles(x: &MatRef<'_>, kp: usize, xs: &mut XTiles) {
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
/// exactly (hi and mid truncated, lo the remaining at most 8 bits).
///
/// # Safety
/// AVX-512F/BF16 available; the 16 rows' 32 floats readable; `out` writable for 3 tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn x_step_tiles(rows: *const f32, ld: usize, out: *mut u8) {
    let mut parts = [[_mm512_setzero_si512(); 16]; 3];
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

/// The task split (column ranges of panels, and row ranges of x when there are fewer
/// panels than threads) and each task's panel loop.
fn compute(
    xs: &XTiles,
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
    let steps = kp / KT;
    // Eight column ranges a thread: each panel is still dequantized once, and on a shared
    // machine a thread that lost its core leaves less behind (a profile of prefill on the
    // loaded 2-core VM showed one thread with 3x the other's samples at two a thread).
    let tn = panels.min(8 * threads);
    let tm = if tn < threads {
        (threads / tn).min(blocks)
    } else {
        1
    };
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let xt = xs.tiles.as_slice();
    let terms = match w.format() {
        WeightFormat::F16 => Terms::F16,
        WeightFormat::Bf16 => Terms::Bf16,
        _ => Terms::Three,
    };
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (b0, b1) = (ti * blocks / tm, (ti + 1) * blocks / tm);
        let (p0, p1) = (tj * panels / tn, (tj + 1) * panels / tn);
        let mut fresh = None;
        BUFS.with(|cell| {
            let mut guard = cell.try_borrow_mut().ok();
            let bufs = match guard.as_deref_mut() {
                Some(b) => b,
                None => fresh.insert(PanelBufs::default()),
            };
            let _tiles = TileConfig::load();
            let mut c = [0.0f32; 4 * 256];
            let mut out = [0.0f32; MB * NR];
            for p in p0..p1 {
                let j0 = p * NR;
                let cols = NR.min(n - j0);
                pack_panel(&w, j0, cols, kp, bufs);
                let panel = bufs.panel.as_slice();
                for b in b0..b1 {
                    let i0 = b * MB;
                    let rows = MB.min(m - i0);
                    let xb = xt[(i0 / 16) * steps * 3 * TILE..].as_ptr();
                    // SAFETY: the tile config is loaded on this thread; x's tiles hold the
                    // 16-row blocks i0 / 16 (and the next when rows > 16) of `steps` steps;
                    // the panel holds `steps` steps of 4 tiles; c holds 4 C tiles.
                    unsafe {
                        if rows > 16 {
                            kernel::<2>(terms, panel.as_ptr(), xb, steps, c.as_mut_ptr());
                        } else {
                            kernel::<1>(terms, panel.as_ptr(), xb, steps, c.as_mut_ptr());
                        }
                        transpose_c(&c, rows.div_ceil(16), &mut out);
                    }
                    // SAFETY: rows i0..i0 + rows, columns j0..j0 + cols of y are in bounds
                    // and this task's alone; the epilogue was checked; out holds `rows`
                    // rows of NR floats; the VNNI path's ISA is available (callers).
                    unsafe { finish(Path::Vnni512, &out, NR, rows, cols, i0, j0, epi, yp) };
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

/// Dequantizes W's rows `j0..j0 + cols` (zero rows past them, zero past K up to `kp`) into
/// `bufs.panel`'s A tiles: per 32 elements of K, `[hi rows 0-15, hi 16-31, lo 0-15, lo
/// 16-31]`, each 16 rows of 32 bf16.
fn pack_panel(w: &QuantMatRef<'_>, j0: usize, cols: usize, kp: usize, bufs: &mut PanelBufs) {
    let k = w.k();
    let format = w.format();
    let panel = bufs.panel.reset(kp / KT * 4 * TILE);
    for r in 0..NR {
        // Row r's 64 bytes of hi at step st: st * 4 TILE + r * 64; lo 2 TILE further.
        let dst = panel.as_mut_ptr().wrapping_add(r * 64);
        if r >= cols {
            for st in 0..kp / KT {
                panel[st * 4 * TILE + r * 64..][..64].fill(0);
                panel[st * 4 * TILE + 2 * TILE + r * 64..][..64].fill(0);
            }
            continue;
        }
        let bytes = w.rows(j0 + r, j0 + r + 1);
        match format {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
                // SAFETY: AVX-512F/BW/BF16 available; the row holds k elements; the panel
                // holds kp / 32 steps of 4 tiles, row r's 64-byte slots among them.
                unsafe { emit_dense(format, bytes.as_ptr(), k, kp, dst) };
            }
            WeightFormat::Block(b) => {
                let sp = spec(b);
                let ng = k / sp.g;
                let u = bufs.u.reset(k);
                bufs.s.resize(ng, 0.0);
                bufs.t.resize(ng, 0.0);
                // SAFETY: the VNNI path's features (AVX-512F/BW/VL) are available.
                if !unsafe { unpack_row_simd(b, bytes, u) } {
                    unpack_row(b, bytes, u, &mut bufs.s, &mut bufs.t);
                } else {
                    scales_row(b, bytes, &mut bufs.s, &mut bufs.t);
                }
                // SAFETY: AVX-512F/BF16 available; u holds k quants, s/t k / g groups
                // (k = kp: whole blocks of at least 32); row r's slots as above.
                unsafe { emit_block(u.as_ptr(), &bufs.s, &bufs.t, sp.g, sp.offset, k, dst) };
            }
        }
    }
}

/// A float-format row of `k` elements (zero up to `kp`) split into row r's hi and lo
/// slots of the panel (`dst` = row r's slot in step 0).
///
/// # Safety
/// AVX-512F/BW/VL/BF16 available; `src` holds `k` elements of `format`; `dst` + st 4 TILE and
/// + st 4 TILE + 2 TILE hold 64 bytes for every step st < kp / 32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn emit_dense(format: WeightFormat, src: *const u8, k: usize, kp: usize, dst: *mut u8) {
    for st in 0..kp / KT {
        // SAFETY: elements below k of the row (caller).
        let (v0, v1) = unsafe {
            (
                load_dense(format, src, st * KT, k),
                load_dense(format, src, st * KT + 16, k),
            )
        };
        let (h, l) = split_vec(v0, v1);
        // SAFETY: step st's hi and lo slots (caller).
        unsafe {
            _mm512_storeu_si512(dst.add(st * 4 * TILE).cast(), h);
            _mm512_storeu_si512(dst.add(st * 4 * TILE + 2 * TILE).cast(), l);
        }
    }
}

/// Elements `i..i + 16` of a float-format row of `k` as f32 (zero from `k`).
///
/// # Safety
/// AVX-512F/BW/VL available; `src` holds `k` elements of `format`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_dense(format: WeightFormat, src: *const u8, i: usize, k: usize) -> __m512 {
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
        let (h, l) = split_vec(v0, v1);
        // SAFETY: step st's hi and lo slots (caller).
        unsafe {
            _mm512_storeu_si512(dst.add(st * 4 * TILE).cast(), h);
            _mm512_storeu_si512(dst.add(st * 4 * TILE + 2 * TILE).cast(), l);
        }
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
}

/// The panel's two 16-row A tiles of weights against `XB` (1 or 2) B tiles of 16 rows of
/// x over `steps` 32-element steps of K, the products of `terms`, stored to `c` as tiles
/// `[xb][weight tile]` of `[16 weight rows][16 rows of x]` floats. C stays in tmm0-3 over
/// all of K; each A pair (tmm4-5) is loaded once a step and multiplies every x part it
/// takes in turn (tmm6-7).
///
/// # Safety
/// The tile config ([`TileConfig`]) is loaded on this thread; `panel` holds `steps` steps
/// of 4 tiles; `xb` holds `XB` blocks of `steps` steps of 3 tiles; `c` holds `XB * 2 * 256`
/// floats.
#[inline]
unsafe fn kernel<const XB: usize>(
    terms: Terms,
    panel: *const u8,
    xb: *const u8,
    steps: usize,
    c: *mut f32,
) {
    let xblk = steps * 3 * TILE;
    // SAFETY: every tile access below reads one whole 1 KiB tile of the panel's step st
    // (4 tiles) or of x's blocks' step st (3 tiles), or writes c's tiles (caller).
    unsafe {
        zero_c();
        for st in 0..steps {
            let a = panel.add(st * 4 * TILE);
            let b = xb.add(st * 3 * TILE);
            let bx = |part: usize| (b.add(part * TILE), b.add(xblk + part * TILE));
            let (hi, mid, lo) = (bx(0), bx(1), bx(2));
            load_a(a);
            match terms {
                Terms::Three => {
                    products::<XB>(mid);
                    products::<XB>(hi);
                    load_a(a.add(2 * TILE));
                    products::<XB>(hi);
                }
                Terms::F16 => {
                    products::<XB>(lo);
                    products::<XB>(mid);
                    products::<XB>(hi);
                    load_a(a.add(2 * TILE));
                    products::<XB>(hi);
                    products::<XB>(mid);
                }
                Terms::Bf16 => {
                    products::<XB>(lo);
                    products::<XB>(mid);
                    products::<XB>(hi);
                }
            }
        }
        store_c::<XB>(c);
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

    /// Every format, ragged M (tile and register-block edges), N (panel edges) and K (32
    /// steps) against an f64 product of x and the exact weights, with a bias: the error must
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
                vec![1, 31, 33, 100, 300]
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
                for &(m, n) in &[(1, 1), (15, 17), (17, 32), (33, 45), (70, 70), (48, 33)] {
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
                    for threads in [1, 3] {
                        let par = ScopedThreads::new(threads);
                        run(
                            xr,
                            wq,
                            MatMut::row_major(&mut y, m, n, n).unwrap(),
                            &epi,
                            &par,
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
                                    "{} m={m} n={n} k={k} threads={threads} ({i},{j}): {} vs {want}",
                                    format.name(),
                                    y[i * n + j]
                                );
                            }
                        }
                    }
                }
            }
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
}
