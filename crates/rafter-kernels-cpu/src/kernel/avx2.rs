//! AVX2 + FMA micro-kernel: a 6x16 tile of C in 12 ymm accumulators.
//!
//! Per k step: 2 loads of B (one 16-wide panel row), 6 broadcasts of A, 12 FMAs. 6x16 is the
//! classic Haswell/Zen shape: 12 accumulators cover the FMA latency x throughput product
//! (4 cycles x 2 ports = 8 independent chains at least) and leave registers for B and the
//! broadcast, and 2 loads + 6 broadcasts per 12 FMAs stays under the load ports' limit.
//! A tile of at most 8 columns (the last of an N = 8 mod 16 product: MobileNetV2's 24-channel
//! projections, a 1000-class classifier) runs 6x8, one vector wide, instead of computing
//! and masking off a zero half.

use std::arch::x86_64::*;

use super::{Tile, TileEpilogue, PANEL};
use crate::Activation;

const MR: usize = 6;
// 0.693359375 exactly (355/512), so `n * LN2_HI` is exact for the n used here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// # Safety
/// The contract of [`super::Isa::tile`] with AVX2 and FMA available.
pub(crate) unsafe fn tile(t: &Tile, packed_a: bool) {
    debug_assert!(t.mv >= 1 && t.mv <= MR && t.nv >= 1 && t.nv <= PANEL);
    // SAFETY (all arms): forwarded contract; rows instantiated match the rows that exist
    // (`MR` padded rows when packed, exactly `mv` rows when direct).
    macro_rules! rows_w {
        ($pf:literal, $w:literal) => {
            if packed_a {
                kernel::<MR, true, $pf, $w>(t)
            } else {
                match t.mv {
                    1 => kernel::<1, false, $pf, $w>(t),
                    2 => kernel::<2, false, $pf, $w>(t),
                    3 => kernel::<3, false, $pf, $w>(t),
                    4 => kernel::<4, false, $pf, $w>(t),
                    5 => kernel::<5, false, $pf, $w>(t),
                    _ => kernel::<6, false, $pf, $w>(t),
                }
            }
        };
    }
    // One vector of B per k step for a tile of at most 8 columns.
    macro_rules! rows {
        ($pf:literal) => {
            if t.nv <= 8 {
                rows_w!($pf, 1)
            } else {
                rows_w!($pf, 2)
            }
        };
    }
    // Prefetch modes (bits), as in the AVX-512 kernel: 1, this tile's own B ahead; 2, the
    // next micro-panel into L2.
    // SAFETY: the forwarded contract (see the top of this function).
    unsafe {
        match (t.b_prefetch != 0, t.pf_lines != 0) {
            (false, false) => rows!(0),
            (true, false) => rows!(1),
            (false, true) => rows!(2),
            (true, true) => rows!(3),
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize, const PACKED: bool, const PF: u8, const W: usize>(t: &Tile) {
    let mut acc = [[_mm256_setzero_ps(); W]; R];
    let mut a = t.a;
    let mut b = t.b;
    let rs = t.a_rs;
    let pf = t.b_prefetch;
    let mut next = t.pf_next;
    let mut left = t.pf_lines;
    // Distance between consecutive k steps of A.
    let a_step = if PACKED { MR } else { 1 };
    // One k step, `u` steps ahead of `a`/`b`.
    macro_rules! step {
        ($u:expr) => {{
            let bu = b.add($u * PANEL);
            let mut bv = [_mm256_setzero_ps(); W];
            for (w, bw) in bv.iter_mut().enumerate() {
                *bw = _mm256_loadu_ps(bu.add(w * 8));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let ap = a.add($u * a_step + if PACKED { r } else { r * rs });
                let av = _mm256_broadcast_ss(&*ap);
                for (acc_rw, &bw) in acc_r.iter_mut().zip(&bv) {
                    *acc_rw = _mm256_fmadd_ps(av, bw, *acc_rw);
                }
            }
        }};
    }
    // Unrolled by 4: measured 5-25% faster than the plain loop on the 6x16 tile (fewer
    // loop-carried pointer updates per FMA).
    for _ in 0..t.kc / 4 {
        // Prefetches (see `Tile::b_prefetch`, `Tile::pf_next`) are hints that never fault
        // and are never dereferenced, so their addresses use `wrapping_add` and may run
        // past B's end. One line of the next micro-panel per 4 k steps; this tile's own B
        // (one line per k step) ahead.
        if PF & 2 != 0 && left > 0 {
            _mm_prefetch::<_MM_HINT_T1>(next.cast());
            next = next.wrapping_add(PANEL);
            left -= 1;
        }
        if PF & 1 != 0 {
            for u in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pf + u * PANEL).cast());
            }
        }
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
        // SAFETY: as above, one k step.
        unsafe {
            step!(0);
            a = a.add(a_step);
            b = b.add(PANEL);
        }
    }

    // Full tiles without GELU are stored straight from registers, every index constant (no
    // early exit, so LLVM unrolls it and keeps `acc` in registers): with K = 64 (ResNet's
    // 1x1 convs) the spill-and-finish path below cost ~15% of the tile.
    if t.mv == R && t.nv == 8 * W && t.epi.is_none_or(|e| e.act != Activation::GeluTanh) {
        // SAFETY: a full R x 8W tile: C and the epilogue operands hold it (tile contract).
        unsafe { store_full(t, &acc) };
        return;
    }
    // Otherwise spill the tile once, with constant indices, and finish it out of line (see
    // the AVX-512 kernel: an inlined epilogue made LLVM store accumulators on every k step).
    let mut tile = [[0.0f32; PANEL]; R];
    for (acc_r, out_r) in acc.iter().zip(tile.iter_mut()) {
        for (w, &x) in acc_r.iter().enumerate() {
            // SAFETY: out_r holds 16 floats: W <= 2 vectors of 8.
            unsafe { _mm256_storeu_ps(out_r.as_mut_ptr().add(w * 8), x) };
        }
    }
    // SAFETY: forwarded contract; `tile` has R >= mv rows of 16 >= nv columns.
    unsafe { finish(t, &tile) }
}

/// `alpha * AB (+ beta C)` and a GELU-free epilogue for a full tile, from registers.
///
/// # Safety
/// The tile contract with `mv == R`, `nv == 8 W`.
#[inline(always)]
unsafe fn store_full<const R: usize, const W: usize>(t: &Tile, acc: &[[__m256; W]; R]) {
    if let Some(e) = t.column_epilogue() {
        // A convolution's epilogue (see `Tile::column_epilogue`): the bias once per tile.
        // SAFETY: this kernel runs only where AVX2 and FMA are (the tile contract).
        let zero = unsafe { _mm256_setzero_ps() };
        let mut bias = [zero; W];
        if !e.bias.is_null() {
            for (w, b) in bias.iter_mut().enumerate() {
                // SAFETY: columns w*8..w*8+8 <= 8W == nv are the tile's.
                *b = unsafe { _mm256_loadu_ps(e.bias.add(w * 8)) };
            }
        }
        let relu = matches!(e.act, Activation::Relu);
        let (lo, hi) = e.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        // SAFETY: as above.
        let (lo, hi) = unsafe { (_mm256_set1_ps(lo), _mm256_set1_ps(hi)) };
        for (r, acc_r) in acc.iter().enumerate() {
            for (w, (&accv, &bw)) in acc_r.iter().zip(&bias).enumerate() {
                // SAFETY: as above.
                let x = unsafe {
                    let mut x = _mm256_add_ps(accv, bw);
                    if relu {
                        x = _mm256_max_ps(x, zero);
                    }
                    if e.clamp.is_some() {
                        // max(NaN, lo) is lo, as the general epilogue's clamp.
                        x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
                    }
                    x
                };
                // SAFETY: r < R == mv rows, columns w*8..w*8+8 <= 8W == nv.
                unsafe { _mm256_storeu_ps(t.c.add(r * t.ldc + w * 8), x) };
            }
        }
        return;
    }
    // SAFETY: this kernel runs only where AVX2 and FMA are (the tile contract).
    let (alpha, beta, ones) = unsafe {
        (
            _mm256_set1_ps(t.alpha),
            _mm256_set1_ps(t.beta),
            _mm256_set1_epi32(-1),
        )
    };
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, &accv) in acc_r.iter().enumerate() {
            // SAFETY: r < R == mv rows, columns v*8..v*8+8 <= 8W == nv.
            unsafe {
                let cp = t.c.add(r * t.ldc + v * 8);
                let mut x = if t.alpha == 1.0 {
                    accv
                } else {
                    _mm256_mul_ps(accv, alpha)
                };
                if t.beta != 0.0 {
                    x = _mm256_fmadd_ps(_mm256_loadu_ps(cp), beta, x);
                }
                if let Some(e) = &t.epi {
                    x = epilogue(x, e, r, v * 8, true, ones);
                }
                _mm256_storeu_ps(cp, x);
            }
        }
    }
}

/// `alpha * AB (+ beta C)` and the epilogue, from the spilled accumulators, into C's
/// `mv x nv` tile.
///
/// # Safety
/// The tile contract; `ab.len() >= mv`.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish(t: &Tile, ab: &[[f32; PANEL]]) {
    let alpha = _mm256_set1_ps(t.alpha);
    let beta = _mm256_set1_ps(t.beta);
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let full = t.nv == PANEL;
    for (r, ab_r) in ab.iter().enumerate().take(t.mv) {
        for col in (0..t.nv).step_by(8) {
            // Lanes of this vector inside the tile's nv columns; masked accesses never touch
            // memory (nor fault) outside them.
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((t.nv - col) as i32), lanes);
            // SAFETY: row r < mv and the lanes loaded/stored are columns < nv (masked when
            // the tile is partial): inside C and the epilogue operands per the contract.
            unsafe {
                let accv = _mm256_loadu_ps(ab_r.as_ptr().add(col));
                let cp = t.c.add(r * t.ldc + col);
                let mut x = if t.alpha == 1.0 {
                    accv
                } else {
                    _mm256_mul_ps(accv, alpha)
                };
                if t.beta != 0.0 {
                    x = _mm256_fmadd_ps(load(cp, full, mask), beta, x);
                }
                if let Some(e) = &t.epi {
                    x = epilogue(x, e, r, col, full, mask);
                }
                if full {
                    _mm256_storeu_ps(cp, x);
                } else {
                    _mm256_maskstore_ps(cp, mask, x);
                }
            }
        }
    }
}

/// # Safety
/// `p` readable for 8 floats, or for the lanes set in `mask` when `!full`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load(p: *const f32, full: bool, mask: __m256i) -> __m256 {
    // SAFETY: forwarded.
    unsafe {
        if full {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, mask)
        }
    }
}

/// # Safety
/// The epilogue pointers readable at row `r`, columns `col..col+8` (masked when `!full`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn epilogue(
    mut x: __m256,
    e: &TileEpilogue,
    r: usize,
    col: usize,
    full: bool,
    mask: __m256i,
) -> __m256 {
    // SAFETY: forwarded.
    unsafe {
        if !e.bias.is_null() {
            x = _mm256_add_ps(x, load(e.bias.add(col), full, mask));
        }
        if !e.row_bias.is_null() {
            x = _mm256_add_ps(x, _mm256_set1_ps(*e.row_bias.add(r)));
        }
        let res = if e.res.is_null() {
            None
        } else {
            Some(load(e.res.add(r * e.res_ld + col), full, mask))
        };
        if let (Some(rv), true) = (res, e.res_before) {
            x = _mm256_add_ps(x, rv);
        }
        x = match e.act {
            Activation::None => x,
            Activation::Relu => _mm256_max_ps(x, _mm256_setzero_ps()),
            Activation::GeluTanh => gelu(x),
        };
        if let (Some(rv), false) = (res, e.res_before) {
            x = _mm256_add_ps(x, rv);
        }
        if let Some((lo, hi)) = e.clamp {
            // max(NaN, lo) is lo, as `x.max(lo)`.
            x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
        }
        x
    }
}

/// `x * sigmoid(2u)`, `u = sqrt(2/pi) (x + 0.044715 x^3)`: GELU's tanh form, since
/// `0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn gelu(x: __m256) -> __m256 {
    let x2 = _mm256_mul_ps(x, x);
    let inner = _mm256_fmadd_ps(_mm256_set1_ps(0.044715), x2, _mm256_set1_ps(1.0));
    let m2u = _mm256_mul_ps(_mm256_mul_ps(x, inner), _mm256_set1_ps(-2.0 * 0.797_884_6));
    let den = _mm256_add_ps(_mm256_set1_ps(1.0), exp(m2u));
    _mm256_div_ps(x, den)
}

/// `exp(x)` to about 2 ulp on [-87, 88] (inputs are clamped there): `2^n * p(r)` with
/// `x = n ln2 + r`, `|r| <= ln2 / 2`, `p` a degree-6 polynomial.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_cvtps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let nf = _mm256_cvtepi32_ps(n);
    // ln 2 split in two (Cephes) so that `n * LN2_HI` is exact.
    let r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(n, _mm256_set1_epi32(127)),
        23,
    ));
    _mm256_mul_ps(p, pow2n)
}
