//! Decode kernels for unquantized weights (f32, f16, bf16): one weight row against up to
//! [`MR`] rows of f32 activations, widening the weights on load and accumulating in f32.
//! The activations are not rounded, so these are exact up to the f32 additions' order.
//!
//! bf16 weights are widened (a zero-extend and a shift) rather than multiplied with
//! AVX512_BF16's `vdpbf16ps`: that instruction would round x to bf16 too (8 bits of
//! mantissa), and decode is bound by the weight bytes, not by the multiplies (these kernels
//! stream bf16 as fast as f16). For prefill, `vdpbf16ps` did 32 multiply-adds an instruction
//! at ~1.85 instructions/ns on this Zen 5 against FMA's 16 at ~2.8 (a throughput loop of 8
//! independent chains each), so only ~1.3x the f32 rate, not worth rounding x: prefill
//! widens to f32 panels instead (see `gemm.rs`).

use super::{Path, WeightFormat};

/// Activation rows one kernel call handles.
pub(crate) const MR: usize = 4;

/// `out[r] = Σ_k w[k] x_r[k]` for rows `r < m` (`m <= MR`), with `w` one row of `k`
/// elements in `format` (a float format) and row `r` of x at `x[r * ldx..][..k]`.
pub(crate) fn dot_rows(
    path: Path,
    format: WeightFormat,
    w: &[u8],
    x: &[f32],
    ldx: usize,
    m: usize,
    out: &mut [f32; MR],
) {
    let k = w.len() / elem_bytes(format);
    assert!(w.len() == k * elem_bytes(format));
    dot_rows_raw(path, format, w.as_ptr(), k, x, ldx, m, out);
}

/// [`dot_rows`] for a row already in f32 (a dequantized block-format row).
pub(crate) fn dot_rows_f32(
    path: Path,
    w: &[f32],
    x: &[f32],
    ldx: usize,
    m: usize,
    out: &mut [f32; MR],
) {
    dot_rows_raw(
        path,
        WeightFormat::F32,
        w.as_ptr().cast(),
        w.len(),
        x,
        ldx,
        m,
        out,
    );
}

/// The dispatch of [`dot_rows`]: `w` points at `k` readable elements of `format`.
#[allow(clippy::too_many_arguments)]
fn dot_rows_raw(
    path: Path,
    format: WeightFormat,
    w: *const u8,
    k: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    out: &mut [f32; MR],
) {
    assert!(m <= MR && (m == 0 || x.len() >= (m - 1) * ldx + k));
    match path {
        // SAFETY: the path's ISA was checked by the caller; the asserts above bound every
        // read (w holds k elements, each x row k floats).
        #[cfg(target_arch = "x86_64")]
        Path::Vnni512 => unsafe { x86::dot512(format, w, k, x.as_ptr(), ldx, m, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for AVX-512.
        Path::Avx2 => unsafe { x86::dot256(format, w, k, x.as_ptr(), ldx, m, out) },
        Path::Scalar => {
            // SAFETY: `w` holds k elements of `format` (callers).
            let w = unsafe { std::slice::from_raw_parts(w, k * elem_bytes(format)) };
            for (r, o) in out.iter_mut().enumerate().take(m) {
                let xr = &x[r * ldx..][..k];
                *o = (0..k).map(|i| widen(format, w, i) * xr[i]).sum();
            }
        }
    }
}

fn elem_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::F32 => 4,
        WeightFormat::F16 | WeightFormat::Bf16 => 2,
        WeightFormat::Block(_) => unreachable!("dense kernels take float formats"),
    }
}

/// Element `i` of a float-format row, as f32 (exact).
pub(crate) fn widen(format: WeightFormat, w: &[u8], i: usize) -> f32 {
    match format {
        WeightFormat::F32 => {
            f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
        }
        WeightFormat::F16 => {
            half::f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32()
        }
        WeightFormat::Bf16 => {
            f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16)
        }
        WeightFormat::Block(_) => unreachable!("dense kernels take float formats"),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{WeightFormat, MR};

    /// 16 weights from `w` (element offset `i`) as f32, the first `lanes` (rest zero).
    ///
    /// # Safety
    /// Elements `i..i + lanes` of `w` readable; AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(format: WeightFormat, w: *const u8, i: usize, mask: __mmask16) -> __m512 {
        // SAFETY: masked loads touch only the `mask` lanes, inside the row.
        unsafe {
            match format {
                WeightFormat::F32 => _mm512_maskz_loadu_ps(mask, w.cast::<f32>().add(i)),
                WeightFormat::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                    mask,
                    w.cast::<i16>().add(i).cast(),
                )),
                _ => {
                    let h = _mm256_maskz_loadu_epi16(mask, w.cast::<i16>().add(i).cast());
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
                }
            }
        }
    }

    /// # Safety
    /// `w` holds `k` elements of `format`; rows `r < m` of x hold `k` floats at `ldx`;
    /// AVX-512F and BW available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dot512(
        format: WeightFormat,
        w: *const u8,
        k: usize,
        x: *const f32,
        ldx: usize,
        m: usize,
        out: &mut [f32; MR],
    ) {
        // SAFETY: forwarded; each arm reads exactly m rows.
        unsafe {
            match m {
                1 => rows512::<1>(format, w, k, x, ldx, out),
                2 => rows512::<2>(format, w, k, x, ldx, out),
                3 => rows512::<3>(format, w, k, x, ldx, out),
                _ => rows512::<4>(format, w, k, x, ldx, out),
            }
        }
    }

    /// # Safety
    /// As [`dot512`] with `m == R`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn rows512<const R: usize>(
        format: WeightFormat,
        w: *const u8,
        k: usize,
        x: *const f32,
        ldx: usize,
        out: &mut [f32; MR],
    ) {
        // Two accumulators a row: FMA latency over 32 elements an iteration.
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let mut i = 0;
        while i + 32 <= k {
            // Bytes of this iteration's weights (64 or 128), prefetched a distance ahead.
            let eb = if format == WeightFormat::F32 { 4 } else { 2 };
            crate::quant::x86_vnni::prefetch(w.wrapping_add(i * eb), 32 * eb);
            // SAFETY: elements i..i+32 < k of w and of each x row.
            unsafe {
                let w0 = load16(format, w, i, 0xffff);
                let w1 = load16(format, w, i + 16, 0xffff);
                for (r, a) in acc.iter_mut().enumerate() {
                    let xr = x.add(r * ldx + i);
                    a[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), a[0]);
                    a[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr.add(16)), a[1]);
                }
            }
            i += 32;
        }
        while i < k {
            let lanes = (k - i).min(16);
            let mask = ((1u32 << lanes) - 1) as __mmask16;
            // SAFETY: the masked lanes are elements i..i+lanes <= k.
            unsafe {
                let wv = load16(format, w, i, mask);
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_maskz_loadu_ps(mask, x.add(r * ldx + i));
                    a[0] = _mm512_fmadd_ps(wv, xv, a[0]);
                }
            }
            i += lanes;
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
        }
    }

    /// 8 weights from element `i` as f32.
    ///
    /// # Safety
    /// Elements `i..i + 8` of `w` readable; AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(format: WeightFormat, w: *const u8, i: usize) -> __m256 {
        // SAFETY: 8 elements from i.
        unsafe {
            match format {
                WeightFormat::F32 => _mm256_loadu_ps(w.cast::<f32>().add(i)),
                WeightFormat::F16 => {
                    _mm256_cvtph_ps(_mm_loadu_si128(w.cast::<u16>().add(i).cast()))
                }
                _ => {
                    let h = _mm_loadu_si128(w.cast::<u16>().add(i).cast());
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
                }
            }
        }
    }

    /// # Safety
    /// As [`dot512`], with AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot256(
        format: WeightFormat,
        w: *const u8,
        k: usize,
        x: *const f32,
        ldx: usize,
        m: usize,
        out: &mut [f32; MR],
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let mut i = 0;
        while i + 16 <= k {
            // SAFETY: elements i..i+16 < k of w and of the m x rows.
            unsafe {
                let w0 = load8(format, w, i);
                let w1 = load8(format, w, i + 8);
                for (r, a) in acc.iter_mut().enumerate().take(m) {
                    let xr = x.add(r * ldx + i);
                    a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a[0]);
                    a[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr.add(8)), a[1]);
                }
            }
            i += 16;
        }
        let mut t = [0.0f32; 8];
        for (r, (o, a)) in out.iter_mut().zip(&acc).enumerate().take(m) {
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(t.as_mut_ptr(), _mm256_add_ps(a[0], a[1])) };
            let mut s: f32 = t.iter().sum();
            for j in i..k {
                // SAFETY: element j < k of row r and of w.
                s += unsafe { super::widen_ptr(format, w, j) * *x.add(r * ldx + j) };
            }
            *o = s;
        }
    }
}

/// [`widen`] through a raw pointer, for the vector kernels' tails.
///
/// # Safety
/// Element `i` of `w` readable.
#[cfg(target_arch = "x86_64")]
unsafe fn widen_ptr(format: WeightFormat, w: *const u8, i: usize) -> f32 {
    let size = elem_bytes(format);
    // SAFETY: element i's bytes are readable (caller).
    let bytes = unsafe { std::slice::from_raw_parts(w.add(i * size), size) };
    match format {
        WeightFormat::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        _ => widen(format, bytes, 0),
    }
}
