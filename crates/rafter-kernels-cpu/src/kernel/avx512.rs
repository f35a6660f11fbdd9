//! AVX-512F micro-kernel: a 12x32 tile of C in 24 zmm accumulators, reading two adjacent
//! 16-wide B panels per k step (so the packed-B layout is the one the AVX2 kernel reads).
//!
//! Per k step: 2 zmm loads of B, 12 broadcasts of A, 24 FMAs: 24 accumulators cover the
//! latency x throughput product of two 512-bit FMA ports, and 14 loads per 24 FMAs fit the
//! load ports. Tiles of at most 16 valid columns use a 12x16 variant that reads one panel
//! only (the next panel may not exist).
//!
//! Pre-packed weights come from memory on a model's every call (BERT-base's 435 MB do not
//! stay in the caches), so tiles that read them first are told to prefetch: the next
//! micro-panel into L2 while they compute (spread over a whole pass of row tiles), or their
//! own B ahead when nothing prefetched it (see the crate docs for what it buys).

use std::arch::x86_64::*;

use super::{Tile, TileEpilogue, PANEL};
use crate::Activation;

const MR: usize = 12;
// 0.693359375 exactly (355/512), so `n * LN2_HI` is exact for the n used here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// # Safety
/// The contract of [`super::Isa::tile`] with AVX-512F available.
pub(crate) unsafe fn tile(t: &Tile, packed_a: bool) {
    debug_assert!(t.mv >= 1 && t.mv <= MR && t.nv >= 1 && t.nv <= 2 * PANEL);
    // A tile as wide as its panels whose epilogue is a column one (a convolution's bias,
    // ReLU, clamp) finishes in registers (`CE`); see `kernel`.
    let full_width = t.nv == PANEL || t.nv == 2 * PANEL;
    let ce = full_width && (!packed_a || t.mv == MR) && t.column_epilogue().is_some();
    // Prefetch modes (bits): 1, this tile's own B ahead; 2, the next micro-panel into L2.
    let pf = (t.b_prefetch != 0) as u8 | (((t.pf_lines != 0) as u8) << 1);
    macro_rules! direct {
        ($w:literal, $pf:literal, $ce:literal) => {
            match t.mv {
                1 => kernel::<1, false, $w, $pf, $ce>(t),
                2 => kernel::<2, false, $w, $pf, $ce>(t),
                3 => kernel::<3, false, $w, $pf, $ce>(t),
                4 => kernel::<4, false, $w, $pf, $ce>(t),
                5 => kernel::<5, false, $w, $pf, $ce>(t),
                6 => kernel::<6, false, $w, $pf, $ce>(t),
                7 => kernel::<7, false, $w, $pf, $ce>(t),
                8 => kernel::<8, false, $w, $pf, $ce>(t),
                9 => kernel::<9, false, $w, $pf, $ce>(t),
                10 => kernel::<10, false, $w, $pf, $ce>(t),
                11 => kernel::<11, false, $w, $pf, $ce>(t),
                _ => kernel::<12, false, $w, $pf, $ce>(t),
            }
        };
    }
    macro_rules! by_pf {
        ($ce:literal) => {
            match (packed_a, t.nv > PANEL, pf) {
                (true, true, 0) => kernel::<MR, true, 2, 0, $ce>(t),
                (true, false, 0) => kernel::<MR, true, 1, 0, $ce>(t),
                (true, true, 1) => kernel::<MR, true, 2, 1, $ce>(t),
                (true, false, 1) => kernel::<MR, true, 1, 1, $ce>(t),
                (true, true, 2) => kernel::<MR, true, 2, 2, $ce>(t),
                (true, false, 2) => kernel::<MR, true, 1, 2, $ce>(t),
                (true, true, _) => kernel::<MR, true, 2, 3, $ce>(t),
                (true, false, _) => kernel::<MR, true, 1, 3, $ce>(t),
                (false, true, 0) => direct!(2, 0, $ce),
                (false, false, 0) => direct!(1, 0, $ce),
                (false, true, 1) => direct!(2, 1, $ce),
                (false, false, 1) => direct!(1, 1, $ce),
                (false, true, 2) => direct!(2, 2, $ce),
                (false, false, 2) => direct!(1, 2, $ce),
                (false, true, _) => direct!(2, 3, $ce),
                (false, false, _) => direct!(1, 3, $ce),
            }
        };
    }
    // SAFETY: (all arms) forwarded contract; the rows instantiated are the rows that exist
    // (`MR` padded rows when packed, exactly `mv` when direct), and the panels read are the
    // ones that exist (two only when more than 16 columns are valid); `CE` only for tiles
    // of `R` rows and `16 W` columns with a column epilogue.
    unsafe {
        if ce {
            by_pf!(true)
        } else {
            by_pf!(false)
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn kernel<
    const R: usize,
    const PACKED: bool,
    const W: usize,
    const PF: u8,
    const CE: bool,
>(
    t: &Tile,
) {
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    // With a column epilogue (`CE`), the accumulators start at the bias, and the ReLU and
    // clamp are applied in registers after the k loop, so the tile goes to C in one store
    // per vector. Spilled and finished out of line instead (below), MobileNetV2's K = 16–32
    // tiles paid a store and a load per accumulator besides the one to C: in registers,
    // MobileNetV2 ran at B/A 0.979 (18 of 20 alternated `rafter bench` rounds, Zen 5).
    let ce = if CE { t.column_epilogue() } else { None };
    if let Some(e) = ce {
        if !e.bias.is_null() {
            for acc_r in acc.iter_mut() {
                for (w, a) in acc_r.iter_mut().enumerate() {
                    // SAFETY: columns w*16..w*16+16 <= 16 W == nv are the tile's, and the
                    // bias covers them.
                    *a = unsafe { _mm512_loadu_ps(e.bias.add(w * PANEL)) };
                }
            }
        }
    }
    let mut a = t.a;
    let mut b = t.b;
    let rs = t.a_rs;
    let ps = t.b_ps;
    let pf = t.b_prefetch;
    let mut next = t.pf_next;
    let mut left = t.pf_lines;
    // Distance between consecutive k steps of A.
    let a_step = if PACKED { MR } else { 1 };
    // One k step, `u` steps ahead of `a`/`b`.
    macro_rules! step {
        ($u:expr) => {{
            let bu = b.add($u * PANEL);
            let mut bv = [_mm512_setzero_ps(); W];
            for (w, bw) in bv.iter_mut().enumerate() {
                *bw = _mm512_loadu_ps(bu.add(w * ps));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let ap = a.add($u * a_step + if PACKED { r } else { r * rs });
                let av = _mm512_set1_ps(*ap);
                for (acc_rw, &bw) in acc_r.iter_mut().zip(&bv) {
                    *acc_rw = _mm512_fmadd_ps(av, bw, *acc_rw);
                }
            }
        }};
    }
    // Prefetches are hints that never fault and are never dereferenced, so their addresses
    // are formed with `wrapping_add` and may run past B's end.
    macro_rules! prefetch_own {
        ($u:expr) => {
            if PF & 1 != 0 {
                // This tile's own B, `pf` floats ahead (`Tile::b_prefetch`).
                for w in 0..W {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(w * ps + pf + $u * PANEL).cast());
                }
            }
        };
    }
    // Unrolled by 4, as the AVX2 kernel: the rows of direct A are addressed once per 4 k
    // steps (constant offsets after that) instead of once per step, which cost about ten
    // integer instructions per 24 FMAs; measured 1-4% faster on BERT's shapes.
    for _ in 0..t.kc / 4 {
        if PF & 2 != 0 {
            // Two lines of the next micro-panel into L2 per 4 k steps (`Tile::pf_next`).
            for _ in 0..2 {
                if left > 0 {
                    _mm_prefetch::<_MM_HINT_T1>(next.cast());
                    next = next.wrapping_add(PANEL);
                    left -= 1;
                }
            }
        }
        prefetch_own!(0);
        prefetch_own!(1);
        prefetch_own!(2);
        prefetch_own!(3);
        // SAFETY: the 4 k steps read are < kc: inside A and B per the layout contract.
        unsafe {
            step!(0);
            step!(1);
            step!(2);
            step!(3);
            a = a.add(4 * a_step);
            b = b.add(4 * PANEL);
        }
    }
    for _ in 0..t.kc % 4 {
        prefetch_own!(0);
        // SAFETY: as above, one k step.
        unsafe {
            step!(0);
            a = a.add(a_step);
            b = b.add(PANEL);
        }
    }

    if let Some(e) = ce {
        let zero = _mm512_setzero_ps();
        let relu = matches!(e.act, Activation::Relu);
        let (lo, hi) = e.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        for (r, acc_r) in acc.iter().enumerate() {
            for (w, &accv) in acc_r.iter().enumerate() {
                let mut x = accv;
                if relu {
                    x = _mm512_max_ps(x, zero);
                }
                if e.clamp.is_some() {
                    // max(NaN, lo) is lo, as the general epilogue's clamp.
                    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
                }
                // SAFETY: r < R == mv rows, columns w*16..w*16+16 <= W*16 == nv (`CE`'s
                // contract, checked by `tile`).
                unsafe { _mm512_storeu_ps(t.c.add(r * t.ldc + w * PANEL), x) };
            }
        }
        return;
    }
    // Full tiles without an epilogue are stored straight from registers, every index
    // constant; see the AVX2 kernel. (With the epilogue inlined here too, the extra
    // registers it needs made LLVM keep the 24 accumulators in memory again.)
    if t.mv == R && t.nv == W * PANEL && t.epi.is_none() {
        let alpha = _mm512_set1_ps(t.alpha);
        let beta = _mm512_set1_ps(t.beta);
        for (r, acc_r) in acc.iter().enumerate() {
            for (w, &accv) in acc_r.iter().enumerate() {
                // SAFETY: r < R == mv rows, columns w*16..w*16+16 <= W*16 == nv.
                unsafe {
                    let cp = t.c.add(r * t.ldc + w * PANEL);
                    let mut x = if t.alpha == 1.0 {
                        accv
                    } else {
                        _mm512_mul_ps(accv, alpha)
                    };
                    if t.beta != 0.0 {
                        x = _mm512_fmadd_ps(_mm512_loadu_ps(cp), beta, x);
                    }
                    _mm512_storeu_ps(cp, x);
                }
            }
        }
        return;
    }
    // Otherwise spill the tile once, with constant indices, and finish it out of line: with the
    // epilogue inlined here (runtime row/column counts, GELU) LLVM kept `acc` in memory and
    // stored every accumulator on every k step, halving the kernel's speed.
    // Uninitialised: every row's first W panels are stored below, and the finishers read
    // no other element. (Zero-initialised, it cost a 1.5 KB `memset` call per tile, 0.9%
    // of MobileNetV2's `perf` samples, whose K = 16–32 tiles are short.)
    let mut tile = std::mem::MaybeUninit::<[[f32; 2 * PANEL]; R]>::uninit();
    let ab = tile.as_mut_ptr().cast::<f32>();
    for (r, acc_r) in acc.iter().enumerate() {
        for (w, &x) in acc_r.iter().enumerate() {
            // SAFETY: r < R and w < W <= 2: the 16 floats at row r, column 16 w are inside
            // the R x 32 tile.
            unsafe { _mm512_storeu_ps(ab.add(r * 2 * PANEL + w * PANEL), x) };
        }
    }
    // SAFETY: forwarded contract; `ab` holds R >= mv rows whose first 16 W >= nv columns
    // were stored above (row stride 32).
    unsafe {
        if t.mv == R && t.nv == W * PANEL {
            finish_full::<R, W>(t, ab)
        } else {
            finish(t, ab, 2 * PANEL)
        }
    }
}

/// [`finish`] for a full `R x 16W` tile: constant trip counts and no masks, so the epilogue
/// of a tile costs a few dozen instructions instead of a loop of masked, branchy ones (it was
/// up to 30% of a K = 64 tile). Out of line so that the k loop keeps its registers.
///
/// # Safety
/// The tile contract with `mv == R`, `nv == 16 W`; `ab` readable for R rows of 16 W floats,
/// row stride 32.
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn finish_full<const R: usize, const W: usize>(t: &Tile, ab: *const f32) {
    // (A column epilogue never comes here: such tiles finish in `kernel`'s registers.)
    let alpha = _mm512_set1_ps(t.alpha);
    let beta = _mm512_set1_ps(t.beta);
    for r in 0..R {
        for w in 0..W {
            // SAFETY: r < R == mv, columns w*16..w*16+16 <= 16 W == nv: inside the tile
            // and inside `ab`'s stored part.
            unsafe {
                let accv = _mm512_loadu_ps(ab.add(r * 2 * PANEL + w * PANEL));
                let cp = t.c.add(r * t.ldc + w * PANEL);
                let mut x = if t.alpha == 1.0 {
                    accv
                } else {
                    _mm512_mul_ps(accv, alpha)
                };
                if t.beta != 0.0 {
                    x = _mm512_fmadd_ps(_mm512_loadu_ps(cp), beta, x);
                }
                if let Some(e) = &t.epi {
                    x = epilogue(x, e, r, w * PANEL, 0xffff);
                }
                _mm512_storeu_ps(cp, x);
            }
        }
    }
}

/// `alpha * AB (+ beta C)` and the epilogue, from the spilled accumulators at `ab` (row
/// stride `ab_ld`), into C's `mv x nv` tile.
///
/// # Safety
/// `ab` readable for `mv` rows of `nv` (rounded up to 16) floats; the tile contract.
#[inline(never)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn finish(t: &Tile, ab: *const f32, ab_ld: usize) {
    let alpha = _mm512_set1_ps(t.alpha);
    let beta = _mm512_set1_ps(t.beta);
    for r in 0..t.mv {
        for col in (0..t.nv).step_by(PANEL) {
            let valid = (t.nv - col).min(PANEL);
            // Lanes inside the tile; masked accesses never touch memory outside them.
            let mask: __mmask16 = if valid == PANEL {
                0xffff
            } else {
                (1u16 << valid) - 1
            };
            // SAFETY: row r < mv, and only lanes of columns < nv are accessed (masked).
            unsafe {
                let accv = _mm512_loadu_ps(ab.add(r * ab_ld + col));
                let cp = t.c.add(r * t.ldc + col);
                let mut x = if t.alpha == 1.0 {
                    accv
                } else {
                    _mm512_mul_ps(accv, alpha)
                };
                if t.beta != 0.0 {
                    x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, cp), beta, x);
                }
                if let Some(e) = &t.epi {
                    x = epilogue(x, e, r, col, mask);
                }
                _mm512_mask_storeu_ps(cp, mask, x);
            }
        }
    }
}

/// # Safety
/// The epilogue pointers readable at row `r`, columns `col..col+16` where `mask` is set.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn epilogue(
    mut x: __m512,
    e: &TileEpilogue,
    r: usize,
    col: usize,
    mask: __mmask16,
) -> __m512 {
    // SAFETY: forwarded.
    unsafe {
        if !e.bias.is_null() {
            x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, e.bias.add(col)));
        }
        if !e.row_bias.is_null() {
            x = _mm512_add_ps(x, _mm512_set1_ps(*e.row_bias.add(r)));
        }
        let res = if e.res.is_null() {
            None
        } else {
            Some(_mm512_maskz_loadu_ps(mask, e.res.add(r * e.res_ld + col)))
        };
        if let (Some(rv), true) = (res, e.res_before) {
            x = _mm512_add_ps(x, rv);
        }
        x = match e.act {
            Activation::None => x,
            Activation::Relu => _mm512_max_ps(x, _mm512_setzero_ps()),
            Activation::GeluTanh => gelu(x),
        };
        if let (Some(rv), false) = (res, e.res_before) {
            x = _mm512_add_ps(x, rv);
        }
        if let Some((lo, hi)) = e.clamp {
            // max(NaN, lo) is lo, as `x.max(lo)`.
            x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
        }
        x
    }
}

/// GELU's tanh form as `x / (1 + exp(-2u))`; see the AVX2 kernel.
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu(x: __m512) -> __m512 {
    let x2 = _mm512_mul_ps(x, x);
    let inner = _mm512_fmadd_ps(_mm512_set1_ps(0.044715), x2, _mm512_set1_ps(1.0));
    let m2u = _mm512_mul_ps(_mm512_mul_ps(x, inner), _mm512_set1_ps(-2.0 * 0.797_884_6));
    let den = _mm512_add_ps(_mm512_set1_ps(1.0), exp(m2u));
    _mm512_div_ps(x, den)
}

/// `exp(x)` on [-87, 88] (clamped): `2^n * p(r)`, as in the AVX2 kernel.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
    let nf = _mm512_cvtepi32_ps(n);
    let r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_add_epi32(n, _mm512_set1_epi32(127)),
        23,
    ));
    _mm512_mul_ps(p, pow2n)
}
