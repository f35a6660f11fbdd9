//! AVX2 decode kernels (CPUs without AVX-512 VNNI): ggml's approach, block by block on the
//! natural activation layout. A block's quants become 32 unsigned bytes in element order,
//! `vpmaddubsw` multiplies them by the int8 activations into pairs of i16 and `vpmaddwd`
//! (by ones, or by the K formats' sub-block scales) sums pairs into i32 lanes; the formats'
//! offsets and mins come from the activations' 16-sums, in scalar code. Q8_0's signed
//! weights use `vpsignb` to move their signs onto the activations.
//!
//! Integer arithmetic is exactly [`super::gemv_scalar`]'s. Formats without a kernel here
//! (the `_1`, Q5 and Q2_K/Q3_K/Q8_K ones) run the dequantizing fallback.

use std::arch::x86_64::*;

use rafter_quant::layout::{self, k4_scale_min};
use rafter_quant::BlockFormat;

use super::act::Act;
use super::gemv::AlignedBytes;

/// Whether a format has a kernel here.
pub(crate) fn supports(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0 | BlockFormat::Q8_0 | BlockFormat::Q4_K | BlockFormat::Q6_K
    )
}

/// Nothing to rearrange: the kernels read the natural layout.
pub(crate) fn prepare(_format: BlockFormat, _act: &Act, aux: &mut AlignedBytes) {
    aux.reset(0);
}

/// `out[i * out_ld + c]` = row `r0 + i` of x times weight row `c`, for `i < m` and the
/// weight rows in `w`.
///
/// # Safety
/// `w` is whole rows of `format` blocks for `act.k` elements; rows `r0..r0 + m` of `act`
/// exist; AVX2, FMA and F16C are available.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_tile(
    format: BlockFormat,
    w: &[u8],
    act: &Act,
    _aux: &[u8],
    r0: usize,
    m: usize,
    out: &mut [f32],
    out_ld: usize,
) {
    let k = act.k;
    let wrow = format.row_bytes(k).expect("whole blocks");
    assert!(r0 + m <= act.m && w.len().is_multiple_of(wrow.max(1)));
    for (c, row) in w.chunks_exact(wrow).enumerate() {
        // The row a prefetch distance ahead, one hint per line (see `x86_vnni::prefetch`).
        super::x86_vnni::prefetch(row.as_ptr(), wrow);
        for i in 0..m {
            let r = r0 + i;
            let (x, dx, s16) = (act.row(r), act.scales(r), act.sums16(r));
            // SAFETY: `row` is one whole row and x, dx, s16 the activation row's arrays
            // (the kernels index them by whole blocks only); AVX2/FMA/F16C (caller).
            out[i * out_ld + c] = unsafe {
                match format {
                    BlockFormat::Q4_0 => q4_0(row, x, dx, s16),
                    BlockFormat::Q8_0 => q8_0(row, x, dx),
                    BlockFormat::Q4_K => q4_k(row, x, dx, s16),
                    BlockFormat::Q6_K => q6_k(row, x, dx, s16),
                    _ => unreachable!("not supported here"),
                }
            };
        }
    }
}

/// Sum of the 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The f16 at byte `at` of `b`, widened with F16C (inline, unlike a library call per block).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn read_f16(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Pairs of i16 summed into i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_pairs(p: __m256i) -> __m256i {
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// # Safety
/// `w` whole Q4_0 blocks, `x`/`dx`/`s16` the activation row's arrays; AVX2, FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0(w: &[u8], x: &[i8], dx: &[f32], s16: &[i32]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    // Two accumulators, alternate blocks: the FMA's latency, not its throughput, would
    // bound one.
    let mut acc = [_mm256_setzero_ps(); 2];
    for (b, blk) in w.chunks_exact(18).enumerate() {
        // SAFETY: 16 quant bytes of the block; 32 activations of block b.
        let (q, xv) = unsafe {
            (
                _mm_loadu_si128(blk.as_ptr().add(layout::q4_0::QS).cast()),
                _mm256_loadu_si256(x.as_ptr().add(32 * b).cast()),
            )
        };
        let lo = _mm_and_si128(q, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), low4);
        let wv = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
        let sums = sum_pairs(_mm256_maddubs_epi16(wv, xv));
        let corr = -8 * (s16[2 * b] + s16[2 * b + 1]);
        let sums = _mm256_add_epi32(sums, _mm256_zextsi128_si256(_mm_cvtsi32_si128(corr)));
        let scale = _mm256_set1_ps(read_f16(blk, 0) * dx[b]);
        acc[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[b % 2]);
    }
    hsum(_mm256_add_ps(acc[0], acc[1]))
}

/// # Safety
/// `w` whole Q8_0 blocks, `x`/`dx` the activation row's arrays; AVX2, FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0(w: &[u8], x: &[i8], dx: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    for (b, blk) in w.chunks_exact(34).enumerate() {
        // SAFETY: 32 quants of the block; 32 activations of block b.
        let (wv, xv) = unsafe {
            (
                _mm256_loadu_si256(blk.as_ptr().add(layout::q8_0::QS).cast()),
                _mm256_loadu_si256(x.as_ptr().add(32 * b).cast()),
            )
        };
        // |w| * (x with w's sign): unsigned times signed, as vpmaddubsw needs.
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        let scale = _mm256_set1_ps(read_f16(blk, 0) * dx[b]);
        acc[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_pairs(p)), scale, acc[b % 2]);
    }
    hsum(_mm256_add_ps(acc[0], acc[1]))
}

/// # Safety
/// `w` whole Q4_K super-blocks, `x`/`dx`/`s16` the activation row's arrays; AVX2, FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(w: &[u8], x: &[i8], dx: &[f32], s16: &[i32]) -> f32 {
    let low4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (sb, blk) in w.chunks_exact(144).enumerate() {
        let scales = &blk[layout::q4_k::SCALES..][..12];
        let xs = &x[256 * sb..][..256];
        let mut ai = _mm256_setzero_si256();
        let mut mi = 0i32;
        for c in 0..4 {
            let (sc1, m1) = k4_scale_min(scales, 2 * c);
            let (sc2, m2) = k4_scale_min(scales, 2 * c + 1);
            // SAFETY: 32 quant bytes of chunk c; activations 64c..64c+64 of the block.
            let (q, x1, x2) = unsafe {
                (
                    _mm256_loadu_si256(blk.as_ptr().add(layout::q4_k::QS + 32 * c).cast()),
                    _mm256_loadu_si256(xs.as_ptr().add(64 * c).cast()),
                    _mm256_loadu_si256(xs.as_ptr().add(64 * c + 32).cast()),
                )
            };
            let lo = _mm256_and_si256(q, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x1), _mm256_set1_epi16(sc1 as i16));
            let p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x2), _mm256_set1_epi16(sc2 as i16));
            ai = _mm256_add_epi32(ai, _mm256_add_epi32(p1, p2));
            let s = &s16[16 * sb + 4 * c..][..4];
            mi += m1 as i32 * (s[0] + s[1]) + m2 as i32 * (s[2] + s[3]);
        }
        let (d, dmin) = (read_f16(blk, 0), read_f16(blk, layout::q4_k::DMIN));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(d * dx[sb]), acc);
        mins += dmin * dx[sb] * mi as f32;
    }
    hsum(acc) - mins
}

/// # Safety
/// `w` whole Q6_K super-blocks, `x`/`dx`/`s16` the activation row's arrays; AVX2, FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(w: &[u8], x: &[i8], dx: &[f32], s16: &[i32]) -> f32 {
    let low4 = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for (sb, blk) in w.chunks_exact(210).enumerate() {
        let sc = &blk[layout::q6_k::SCALES..][..16];
        let xs = &x[256 * sb..][..256];
        let mut ai = _mm256_setzero_si256();
        for h in 0..2 {
            // SAFETY: bytes of half h of the block's ql and qh.
            let (ql0, ql1, qh) = unsafe {
                (
                    _mm256_loadu_si256(blk.as_ptr().add(64 * h).cast()),
                    _mm256_loadu_si256(blk.as_ptr().add(64 * h + 32).cast()),
                    _mm256_loadu_si256(blk.as_ptr().add(layout::q6_k::QH + 32 * h).cast()),
                )
            };
            let pair = |s: i32| {
                let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                _mm256_slli_epi16::<4>(_mm256_and_si256(v, three))
            };
            let e = [
                _mm256_or_si256(_mm256_and_si256(ql0, low4), pair(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4), pair(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), pair(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4), pair(6)),
            ];
            for (i, ev) in e.iter().enumerate() {
                let j = 8 * h + 2 * i; // sub-blocks j, j + 1
                                       // SAFETY: activations 128h + 32i .. + 32 of the block.
                let xv = unsafe { _mm256_loadu_si256(xs.as_ptr().add(128 * h + 32 * i).cast()) };
                let scv = _mm256_setr_m128i(
                    _mm_set1_epi16(sc[j] as i8 as i16),
                    _mm_set1_epi16(sc[j + 1] as i8 as i16),
                );
                ai = _mm256_add_epi32(ai, _mm256_madd_epi16(_mm256_maddubs_epi16(*ev, xv), scv));
            }
        }
        let corr: i32 = (0..16).map(|j| sc[j] as i8 as i32 * s16[16 * sb + j]).sum();
        let ai = _mm256_add_epi32(ai, _mm256_zextsi128_si256(_mm_cvtsi32_si128(-32 * corr)));
        let d = read_f16(blk, layout::q6_k::D);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(d * dx[sb]), acc);
    }
    hsum(acc)
}
