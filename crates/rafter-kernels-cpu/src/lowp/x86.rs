//! x86-64 half-precision kernels: the direct (converting) micro-kernels and the block
//! widening, for AVX-512F and for AVX2 + FMA + F16C.
//!
//! The direct kernels hold `R` rows x `W` panels of C in registers over all of K: per k step
//! they load `W` 32-byte panel rows, widen them (f16: `vcvtph2ps`; bf16: zero-extend each
//! 16-bit value to 32 bits and shift it left 16, which is exactly bf16 -> f32), broadcast
//! `R` values of A and issue `R x W` FMAs. With one row (decode) that is one FMA per 16
//! weights, far below the FMA ports' rate: the loop waits on memory, and each stream of B
//! is prefetched [`PF_K`] k steps ahead. Helpers are `#[target_feature]` functions (not
//! closures, which would lose the features) so they inline into the kernels.

use std::arch::x86_64::*;

use super::half_gemm::DecodeTile;
use crate::kernel::PANEL;

/// Prefetch distance, in k steps (32 bytes each) per panel stream: 2 KiB ahead.
const PF_K: usize = 64;

/// Row stride of a [`DecodeTile`]'s `out`.
const OUT_LD: usize = 64;

/// 16 halves at `p` widened to a zmm.
///
/// # Safety
/// 32 bytes readable at `p`; AVX-512F available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16_512<const BF16: bool>(p: *const u16) -> __m512 {
    // SAFETY: 32 readable bytes (contract); unaligned load.
    let h = unsafe { _mm256_loadu_si256(p.cast()) };
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    } else {
        _mm512_cvtph_ps(h)
    }
}

/// 8 halves at `p` widened to a ymm.
///
/// # Safety
/// 16 bytes readable at `p`; AVX2 and F16C available.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_256<const BF16: bool>(p: *const u16) -> __m256 {
    // SAFETY: 16 readable bytes (contract); unaligned load.
    let h = unsafe { _mm_loadu_si128(p.cast()) };
    if BF16 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    } else {
        _mm256_cvtph_ps(h)
    }
}

/// The AVX-512 direct kernel for `rows <= 8` rows and `np <= 4` panels.
///
/// # Safety
/// The [`DecodeTile`] contract for `rows` and `np`; AVX-512F available.
pub(crate) unsafe fn tile_avx512(t: &DecodeTile, rows: usize, np: usize, bf16: bool) {
    debug_assert!((1..=8).contains(&rows) && (1..=4).contains(&np));
    macro_rules! by_rows {
        ($bf:literal) => {
            match rows {
                1 => narrow512::<1, $bf>(t, np),
                2 => narrow512::<2, $bf>(t, np),
                3 => narrow512::<3, $bf>(t, np),
                4 => narrow512::<4, $bf>(t, np),
                5 => wide512::<5, $bf>(t, np),
                6 => wide512::<6, $bf>(t, np),
                7 => wide512::<7, $bf>(t, np),
                _ => wide512::<8, $bf>(t, np),
            }
        };
    }
    // SAFETY: forwarded; each arm instantiates exactly `rows` rows.
    unsafe {
        if bf16 {
            by_rows!(true)
        } else {
            by_rows!(false)
        }
    }
}

/// Up to 4 rows: all `np` panels in one pass (at most 16 accumulators).
///
/// # Safety
/// As [`tile_avx512`] with `R == rows`.
#[target_feature(enable = "avx512f")]
unsafe fn narrow512<const R: usize, const BF16: bool>(t: &DecodeTile, np: usize) {
    // SAFETY: forwarded; W == np panels are read.
    unsafe {
        match np {
            1 => kernel512::<R, 1, BF16>(t, 0),
            2 => kernel512::<R, 2, BF16>(t, 0),
            3 => kernel512::<R, 3, BF16>(t, 0),
            _ => kernel512::<R, 4, BF16>(t, 0),
        }
    }
}

/// 5..8 rows: at most 2 panels per pass (at most 16 accumulators), so two passes for more.
///
/// # Safety
/// As [`tile_avx512`] with `R == rows`.
#[target_feature(enable = "avx512f")]
unsafe fn wide512<const R: usize, const BF16: bool>(t: &DecodeTile, np: usize) {
    // SAFETY: forwarded; the passes read panels 0..2 and 2..np, all < np.
    unsafe {
        match np {
            1 => kernel512::<R, 1, BF16>(t, 0),
            2 => kernel512::<R, 2, BF16>(t, 0),
            3 => {
                kernel512::<R, 2, BF16>(t, 0);
                kernel512::<R, 1, BF16>(t, 2);
            }
            _ => {
                kernel512::<R, 2, BF16>(t, 0);
                kernel512::<R, 2, BF16>(t, 2);
            }
        }
    }
}

/// `R x 16W` of C from panels `w0..w0+W`, stored raw into `out` at column `16 w0`.
///
/// # Safety
/// The [`DecodeTile`] contract with `R` rows and at least `w0 + W` panels; AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn kernel512<const R: usize, const W: usize, const BF16: bool>(t: &DecodeTile, w0: usize) {
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    let b = t.b.wrapping_add(w0 * t.ps);
    let (a, lda, ps) = (t.a, t.lda, t.ps);
    macro_rules! step {
        ($p:expr) => {{
            let p = $p;
            let mut bv = [_mm512_setzero_ps(); W];
            for (w, bw) in bv.iter_mut().enumerate() {
                *bw = load16_512::<BF16>(b.add(w * ps + p * PANEL));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(r * lda + p));
                for (acc_rw, &bw) in acc_r.iter_mut().zip(&bv) {
                    *acc_rw = _mm512_fmadd_ps(av, bw, *acc_rw);
                }
            }
        }};
    }
    let mut p = 0;
    // Two k steps per iteration: one 64-byte line of each panel, one prefetch per line.
    while p + 2 <= t.k {
        for w in 0..W {
            // A hint that never faults: the address may lie past B's end, so it is formed
            // with wrapping_add and never dereferenced.
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(w * ps + (p + PF_K) * PANEL).cast());
        }
        // SAFETY: k steps p, p + 1 < k: inside rows r < R of A and panels w < W of B.
        unsafe {
            step!(p);
            step!(p + 1);
        }
        p += 2;
    }
    if p < t.k {
        // SAFETY: as above, k step p < k.
        unsafe { step!(p) };
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (w, &x) in acc_r.iter().enumerate() {
            // SAFETY: row r < R <= 8, columns 16 (w0 + w) .. +16 <= 64 of `out`.
            unsafe { _mm512_storeu_ps(t.out.add(r * OUT_LD + (w0 + w) * PANEL), x) };
        }
    }
}

/// The AVX2 direct kernel for `rows <= 6` rows and `np <= 2` panels.
///
/// # Safety
/// The [`DecodeTile`] contract for `rows` and `np`; AVX2, FMA and F16C available.
pub(crate) unsafe fn tile_avx2(t: &DecodeTile, rows: usize, np: usize, bf16: bool) {
    debug_assert!((1..=6).contains(&rows) && (1..=2).contains(&np));
    macro_rules! by_rows {
        ($bf:literal) => {
            match (rows, np) {
                (1, 1) => kernel256::<1, 1, $bf>(t, 0),
                (1, _) => kernel256::<1, 2, $bf>(t, 0),
                (2, 1) => kernel256::<2, 1, $bf>(t, 0),
                (2, _) => kernel256::<2, 2, $bf>(t, 0),
                (3, _) => per_panel256::<3, $bf>(t, np),
                (4, _) => per_panel256::<4, $bf>(t, np),
                (5, _) => per_panel256::<5, $bf>(t, np),
                _ => per_panel256::<6, $bf>(t, np),
            }
        };
    }
    // SAFETY: forwarded; each arm instantiates exactly `rows` rows and at most `np` panels.
    unsafe {
        if bf16 {
            by_rows!(true)
        } else {
            by_rows!(false)
        }
    }
}

/// 3..6 rows: one panel per pass (at most 12 of the 16 ymm registers as accumulators).
///
/// # Safety
/// As [`tile_avx2`] with `R == rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn per_panel256<const R: usize, const BF16: bool>(t: &DecodeTile, np: usize) {
    for w0 in 0..np {
        // SAFETY: forwarded; panel w0 < np.
        unsafe { kernel256::<R, 1, BF16>(t, w0) };
    }
}

/// `R x 16W` of C from panels `w0..w0+W`, stored raw into `out` at column `16 w0`.
///
/// # Safety
/// The [`DecodeTile`] contract with `R` rows and at least `w0 + W` panels; AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel256<const R: usize, const W: usize, const BF16: bool>(t: &DecodeTile, w0: usize) {
    let mut acc = [[[_mm256_setzero_ps(); 2]; W]; R];
    let b = t.b.wrapping_add(w0 * t.ps);
    let (a, lda, ps) = (t.a, t.lda, t.ps);
    macro_rules! step {
        ($p:expr) => {{
            let p = $p;
            let mut bv = [[_mm256_setzero_ps(); 2]; W];
            for (w, bw) in bv.iter_mut().enumerate() {
                let bp = b.add(w * ps + p * PANEL);
                *bw = [load8_256::<BF16>(bp), load8_256::<BF16>(bp.add(8))];
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*a.add(r * lda + p));
                for (acc_rw, bw) in acc_r.iter_mut().zip(&bv) {
                    acc_rw[0] = _mm256_fmadd_ps(av, bw[0], acc_rw[0]);
                    acc_rw[1] = _mm256_fmadd_ps(av, bw[1], acc_rw[1]);
                }
            }
        }};
    }
    let mut p = 0;
    while p + 2 <= t.k {
        for w in 0..W {
            // A hint that never faults (address formed with wrapping_add, never read).
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(w * ps + (p + PF_K) * PANEL).cast());
        }
        // SAFETY: k steps p, p + 1 < k: inside rows r < R of A and panels w < W of B.
        unsafe {
            step!(p);
            step!(p + 1);
        }
        p += 2;
    }
    if p < t.k {
        // SAFETY: as above, k step p < k.
        unsafe { step!(p) };
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (w, x) in acc_r.iter().enumerate() {
            // SAFETY: row r < R <= 6, columns 16 (w0 + w) .. +16 <= 32 of `out`'s 64.
            unsafe {
                let o = t.out.add(r * OUT_LD + (w0 + w) * PANEL);
                _mm256_storeu_ps(o, x[0]);
                _mm256_storeu_ps(o.add(8), x[1]);
            }
        }
    }
}

/// `dst[i] = src[i]` widened to f32 (over the shorter of the two), 16 at a time.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn widen_avx512(bf16: bool, src: &[u16], dst: &mut [f32]) {
    let len = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= len {
        // SAFETY: i + 16 <= len: 16 halves readable in src, 16 floats writable in dst.
        unsafe {
            let x = if bf16 {
                load16_512::<true>(src.as_ptr().add(i))
            } else {
                load16_512::<false>(src.as_ptr().add(i))
            };
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), x);
        }
        i += 16;
    }
    widen_tail(bf16, &src[i..len], &mut dst[i..len]);
}

/// `dst[i] = src[i]` widened to f32 (over the shorter of the two), 8 at a time.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn widen_avx2(bf16: bool, src: &[u16], dst: &mut [f32]) {
    let len = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: i + 8 <= len: 8 halves readable in src, 8 floats writable in dst.
        unsafe {
            let x = if bf16 {
                load8_256::<true>(src.as_ptr().add(i))
            } else {
                load8_256::<false>(src.as_ptr().add(i))
            };
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), x);
        }
        i += 8;
    }
    widen_tail(bf16, &src[i..len], &mut dst[i..len]);
}

fn widen_tail(bf16: bool, src: &[u16], dst: &mut [f32]) {
    let kind = if bf16 {
        super::HalfKind::Bf16
    } else {
        super::HalfKind::F16
    };
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = kind.to_f32(s);
    }
}
