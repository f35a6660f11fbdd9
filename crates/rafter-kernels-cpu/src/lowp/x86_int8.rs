//! x86-64 int8 kernels: AVX-512 VNNI (`vpdpbusd`) and AVX2 (`vpmaddwd` on operands
//! widened to i16).
//!
//! Both hold `R` rows x `W` panels of i32 accumulators over all of K. Per k group (4
//! consecutive k) a panel is one 64-byte line: 16 lanes, each one column's 4 weights. The
//! 4 quantized activations of a row at that group are broadcast to every lane as one i32.
//! Helpers are `#[target_feature]` functions or macros (not closures, which would lose the
//! features).

use std::arch::x86_64::*;

use super::int8_gemm::I8Tile;
use super::int8_packed::GROUP_BYTES;
use crate::kernel::PANEL;

/// Prefetch distance in k groups (64 bytes each) per panel stream: 2 KiB ahead.
const PF_G: usize = 32;

/// Row stride of an [`I8Tile`]'s `out`.
const OUT_LD: usize = 64;

/// The VNNI kernel for `rows <= 8` rows and `np <= 4` panels.
///
/// # Safety
/// The [`I8Tile`] contract for `rows` and `np`; AVX-512F, BW and VNNI available.
pub(crate) unsafe fn tile_vnni(t: &I8Tile, rows: usize, np: usize) {
    debug_assert!((1..=8).contains(&rows) && (1..=4).contains(&np));
    // SAFETY: forwarded; each arm instantiates exactly `rows` rows.
    unsafe {
        match rows {
            1 => narrow_vnni::<1>(t, np),
            2 => narrow_vnni::<2>(t, np),
            3 => narrow_vnni::<3>(t, np),
            4 => narrow_vnni::<4>(t, np),
            5 => wide_vnni::<5>(t, np),
            6 => wide_vnni::<6>(t, np),
            7 => wide_vnni::<7>(t, np),
            _ => wide_vnni::<8>(t, np),
        }
    }
}

/// Up to 4 rows: all `np` panels in one pass (at most 16 accumulators).
///
/// # Safety
/// As [`tile_vnni`] with `R == rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn narrow_vnni<const R: usize>(t: &I8Tile, np: usize) {
    // SAFETY: forwarded; W == np panels are read.
    unsafe {
        match np {
            1 => kernel_vnni::<R, 1>(t, 0),
            2 => kernel_vnni::<R, 2>(t, 0),
            3 => kernel_vnni::<R, 3>(t, 0),
            _ => kernel_vnni::<R, 4>(t, 0),
        }
    }
}

/// 5..8 rows: at most 2 panels per pass (at most 16 accumulators), so two passes for more.
///
/// # Safety
/// As [`tile_vnni`] with `R == rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn wide_vnni<const R: usize>(t: &I8Tile, np: usize) {
    // SAFETY: forwarded; the passes read panels 0..2 and 2..np, all < np.
    unsafe {
        match np {
            1 => kernel_vnni::<R, 1>(t, 0),
            2 => kernel_vnni::<R, 2>(t, 0),
            3 => {
                kernel_vnni::<R, 2>(t, 0);
                kernel_vnni::<R, 1>(t, 2);
            }
            _ => {
                kernel_vnni::<R, 2>(t, 0);
                kernel_vnni::<R, 2>(t, 2);
            }
        }
    }
}

/// `R x 16W` accumulators from panels `w0..w0+W`, stored into `out` at column `16 w0`.
///
/// # Safety
/// The [`I8Tile`] contract with `R` rows and at least `w0 + W` panels; AVX-512F, BW, VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn kernel_vnni<const R: usize, const W: usize>(t: &I8Tile, w0: usize) {
    let mut acc = [[_mm512_setzero_si512(); W]; R];
    let b = t.b.wrapping_add(w0 * t.ps);
    let (a, lda, ps) = (t.a, t.lda, t.ps);
    for g in 0..t.kg {
        for w in 0..W {
            // A hint that never faults: the address may lie past B's end, so it is formed
            // with wrapping_add and never dereferenced.
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(w * ps + (g + PF_G) * GROUP_BYTES));
        }
        let mut bv = [_mm512_setzero_si512(); W];
        for (w, bw) in bv.iter_mut().enumerate() {
            // SAFETY: panel w < W, group g < kg: 64 bytes inside B; unaligned load.
            *bw = unsafe { _mm512_loadu_si512(b.add(w * ps + g * GROUP_BYTES).cast()) };
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row r < R, bytes 4g..4g+4 < lda of quantized A; unaligned read.
            let four = unsafe { a.add(r * lda + 4 * g).cast::<i32>().read_unaligned() };
            let av = _mm512_set1_epi32(four);
            for (acc_rw, &bw) in acc_r.iter_mut().zip(&bv) {
                // u8 activations (first operand) times i8 weights, 4 per lane, into i32.
                *acc_rw = _mm512_dpbusd_epi32(*acc_rw, av, bw);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (w, &x) in acc_r.iter().enumerate() {
            // SAFETY: row r < R <= 8, columns 16 (w0 + w) .. +16 <= 64 of `out`.
            unsafe { _mm512_storeu_si512(t.out.add(r * OUT_LD + (w0 + w) * PANEL).cast(), x) };
        }
    }
}

/// The AVX2 kernel for `rows <= 4` rows and `np <= 2` panels: one panel and two rows per
/// pass (8 accumulators, 16 ymm registers in all).
///
/// # Safety
/// The [`I8Tile`] contract for `rows` and `np`; AVX2 available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn tile_avx2(t: &I8Tile, rows: usize, np: usize) {
    debug_assert!((1..=4).contains(&rows) && (1..=2).contains(&np));
    for w in 0..np {
        let mut r0 = 0;
        while r0 < rows {
            // SAFETY: forwarded; rows r0..r0+2 (or r0..r0+1) < rows, panel w < np.
            unsafe {
                if r0 + 2 <= rows {
                    kernel_avx2::<2>(t, w, r0);
                } else {
                    kernel_avx2::<1>(t, w, r0);
                }
            }
            r0 += 2;
        }
    }
}

/// `R x 16` accumulators of rows `r0..r0+R` from panel `w`, stored into `out`.
///
/// Per k group the panel's 64 bytes are sign-extended to four ymm of i16 (columns
/// `4s..4s+4`, 4 k each), and a row's 4 activations, zero-extended to i16, are broadcast
/// as one 64-bit pattern; `vpmaddwd` then adds each column's k pairs (0, 1) and (2, 3)
/// into two i32 lanes, which are summed once at the end.
///
/// # Safety
/// The [`I8Tile`] contract with rows `r0..r0+R` and panel `w`; AVX2 available.
#[target_feature(enable = "avx2")]
unsafe fn kernel_avx2<const R: usize>(t: &I8Tile, w: usize, r0: usize) {
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    let b = t.b.wrapping_add(w * t.ps);
    let a = t.a.wrapping_add(r0 * t.lda);
    for g in 0..t.kg {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add((g + PF_G) * GROUP_BYTES));
        let mut av = [_mm256_setzero_si256(); R];
        for (r, avr) in av.iter_mut().enumerate() {
            // SAFETY: row r0 + r, bytes 4g..4g+4 < lda of quantized A; unaligned read.
            let four = unsafe { a.add(r * t.lda + 4 * g).cast::<i32>().read_unaligned() };
            *avr = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(four)));
        }
        for s in 0..4 {
            // SAFETY: group g < kg of panel w: bytes 16s..16s+16 of its 64.
            let raw = unsafe { _mm_loadu_si128(b.add(g * GROUP_BYTES + 16 * s).cast()) };
            let bs = _mm256_cvtepi8_epi16(raw);
            for (acc_r, &avr) in acc.iter_mut().zip(&av) {
                acc_r[s] = _mm256_add_epi32(acc_r[s], _mm256_madd_epi16(avr, bs));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        // hadd of (columns 0..4, 4..8) gives [c0 c1 c4 c5 | c2 c3 c6 c7]; the permute puts
        // the 64-bit pairs back in order.
        let lo = _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc_r[0], acc_r[1]));
        let hi = _mm256_permute4x64_epi64::<0xD8>(_mm256_hadd_epi32(acc_r[2], acc_r[3]));
        // SAFETY: row r0 + r < rows <= 8, columns 16w .. 16w + 16 <= 32 of `out`'s 64.
        unsafe {
            let o = t.out.add((r0 + r) * OUT_LD + w * PANEL);
            _mm256_storeu_si256(o.cast(), lo);
            _mm256_storeu_si256(o.add(8).cast(), hi);
        }
    }
}
