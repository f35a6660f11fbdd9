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

/// The bench's A/B knob (`set_quant_dense_rows`): 0 follows [`ROWS_ENV`], 1 makes
/// [`dot_tile1`] read one row at a time, 4 [`NR`] rows a pass.
pub(crate) static DENSE_ROWS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// `4` makes [`dot_tile1`] read [`NR`] weight rows a pass; by default it reads one row at
/// a time. Measured on a quiet 2-core Zen 4 (`benches/quant_gemv.rs --formats f16
/// --dense-rows 1,4`, weights streamed from DRAM), one row a pass took 0.54-0.90 the time
/// of four on every Qwen3-0.6B shape (the LM head 11.5 against 21.3 ms): rows of 2 KiB read
/// side by side make four short streams, where one row after another is one long stream
/// for the hardware prefetcher. The four-row pass had measured 1.10-1.30x faster on a
/// heavily loaded machine (6 GB/s of read bandwidth), where nothing was memory-bound.
pub const ROWS_ENV: &str = "RAFTER_CPU_DENSE_ROWS";

/// Whether [`dot_tile1`] reads several rows a pass (see [`ROWS_ENV`]).
fn multi_row() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match DENSE_ROWS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| std::env::var(ROWS_ENV).as_deref() == Ok("4")),
        rows => rows > 1,
    }
}

/// Weight rows a [`dot_tile1`] pass reads together (the x86 vector paths; other targets
/// read one row at a time).
#[cfg(target_arch = "x86_64")]
pub(crate) const NR: usize = 4;

/// `out[c] = Σ_k row_c[k] x[k]` for each row `c` of `rows` (whole rows of `k` elements in
/// `format`, back to back) against the single activation row `x[..k]`: the decode step's
/// shape (M = 1). The vector paths read [`NR`] weight rows a pass, so x is loaded once per
/// NR rows and NR × 2 independent accumulator chains keep enough loads in flight to stream
/// the weights at DRAM speed. Each row's sum is formed in exactly the order of
/// [`dot_rows`] with `m = 1` (same accumulators, same tail, same reduction), so the two
/// agree bit for bit.
pub(crate) fn dot_tile1(
    path: Path,
    format: WeightFormat,
    rows: &[u8],
    k: usize,
    x: &[f32],
    out: &mut [f32],
) {
    dot_tile1_rows(path, format, rows, k, x, out, multi_row())
}

/// [`dot_tile1`] with the multi-row pass on (`multi`, where the path has one) or off.
fn dot_tile1_rows(
    path: Path,
    format: WeightFormat,
    rows: &[u8],
    k: usize,
    x: &[f32],
    out: &mut [f32],
    multi: bool,
) {
    // Only the x86 paths have a multi-row kernel.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = multi;
    let rb = k * elem_bytes(format);
    assert!(
        x.len() >= k && rb > 0 && rows.len().is_multiple_of(rb) && out.len() >= rows.len() / rb
    );
    let n = rows.len() / rb;
    // Rows done by the multi-row paths; the rest (all of them off x86) one at a time.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut c = 0;
    #[cfg(target_arch = "x86_64")]
    {
        // The multi-row kernel of the path, when asked for.
        type Rows4 = unsafe fn(WeightFormat, *const u8, usize, usize, *const f32, &mut [f32]);
        let rows4: Option<Rows4> = match path {
            _ if !multi => None,
            Path::Vnni512 => Some(x86::rows512x4),
            Path::Avx2 => Some(x86::rows256x4),
            _ => None,
        };
        if let Some(rows4) = rows4 {
            while c + NR <= n {
                // SAFETY: rows c..c+NR are whole rows of `rows` (c + NR <= n); x holds k
                // floats (asserted); the kernel's features (AVX-512F/BW, or AVX2/FMA/F16C)
                // were checked by the caller when it chose `path`.
                unsafe {
                    rows4(
                        format,
                        rows.as_ptr().add(c * rb),
                        rb,
                        k,
                        x.as_ptr(),
                        &mut out[c..c + NR],
                    )
                };
                c += NR;
            }
        }
    }
    let mut o = [0.0f32; MR];
    for (row, oc) in rows[c * rb..].chunks_exact(rb).zip(&mut out[c..n]) {
        dot_rows_raw(path, format, row.as_ptr(), k, x, k, 1, &mut o);
        *oc = o[0];
    }
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

    /// Four weight rows (`w`, `w + rb`, `w + 2 rb`, `w + 3 rb`, each `k` elements of
    /// `format`) against one x row: `out[c]` = row c · x. Per row, the accumulators, tail and
    /// reduction are those of [`rows512`] with R = 1, so the sums are bit-identical to it.
    ///
    /// # Safety
    /// The four rows readable; x holds `k` floats; `out` has 4 elements; AVX-512F and BW.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn rows512x4(
        format: WeightFormat,
        w: *const u8,
        rb: usize,
        k: usize,
        x: *const f32,
        out: &mut [f32],
    ) {
        let eb = if format == WeightFormat::F32 { 4 } else { 2 };
        let rp = [
            w,
            w.wrapping_add(rb),
            w.wrapping_add(2 * rb),
            w.wrapping_add(3 * rb),
        ];
        let mut acc = [[_mm512_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i + 32 <= k {
            // SAFETY: elements i..i+32 < k of each row and of x.
            unsafe {
                let x0 = _mm512_loadu_ps(x.add(i));
                let x1 = _mm512_loadu_ps(x.add(i + 16));
                for (a, &p) in acc.iter_mut().zip(&rp) {
                    crate::quant::x86_vnni::prefetch(p.wrapping_add(i * eb), 32 * eb);
                    a[0] = _mm512_fmadd_ps(load16(format, p, i, 0xffff), x0, a[0]);
                    a[1] = _mm512_fmadd_ps(load16(format, p, i + 16, 0xffff), x1, a[1]);
                }
            }
            i += 32;
        }
        while i < k {
            let lanes = (k - i).min(16);
            let mask = ((1u32 << lanes) - 1) as __mmask16;
            // SAFETY: the masked lanes are elements i..i+lanes <= k.
            unsafe {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(i));
                for (a, &p) in acc.iter_mut().zip(&rp) {
                    a[0] = _mm512_fmadd_ps(load16(format, p, i, mask), xv, a[0]);
                }
            }
            i += lanes;
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
        }
    }

    /// [`rows512x4`] on AVX2: four rows against one x row, each row's sum in the order of
    /// [`dot256`] with m = 1 (bit-identical to it).
    ///
    /// # Safety
    /// As [`rows512x4`], with AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows256x4(
        format: WeightFormat,
        w: *const u8,
        rb: usize,
        k: usize,
        x: *const f32,
        out: &mut [f32],
    ) {
        let rp = [
            w,
            w.wrapping_add(rb),
            w.wrapping_add(2 * rb),
            w.wrapping_add(3 * rb),
        ];
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i + 16 <= k {
            // SAFETY: elements i..i+16 < k of each row and of x.
            unsafe {
                let x0 = _mm256_loadu_ps(x.add(i));
                let x1 = _mm256_loadu_ps(x.add(i + 8));
                for (a, &p) in acc.iter_mut().zip(&rp) {
                    a[0] = _mm256_fmadd_ps(load8(format, p, i), x0, a[0]);
                    a[1] = _mm256_fmadd_ps(load8(format, p, i + 8), x1, a[1]);
                }
            }
            i += 16;
        }
        let mut t = [0.0f32; 8];
        for ((o, a), &p) in out.iter_mut().zip(&acc).zip(&rp) {
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(t.as_mut_ptr(), _mm256_add_ps(a[0], a[1])) };
            let mut s: f32 = t.iter().sum();
            for j in i..k {
                // SAFETY: element j < k of this row and of x.
                s += unsafe { super::widen_ptr(format, p, j) * *x.add(j) };
            }
            *o = s;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;

    /// Each path the machine runs (the portable one always).
    fn paths() -> Vec<Path> {
        let mut v = vec![Path::Scalar];
        for isa in [Isa::Avx2, Isa::Avx512] {
            let p = Path::of(isa);
            if !v.contains(&p) {
                v.push(p);
            }
        }
        v
    }

    fn encode(format: WeightFormat, v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&f| match format {
                WeightFormat::F32 => f.to_le_bytes().to_vec(),
                WeightFormat::F16 => half::f16::from_f32(f).to_bits().to_le_bytes().to_vec(),
                _ => half::bf16::from_f32(f).to_bits().to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// `dot_tile1` on odd row counts and lengths (tails of the 4-row pass and of the
    /// 32/16-element steps) against a scalar f64 reference of the widened weights, and
    /// bit-equal to the one-row kernel `dot_rows` with m = 1.
    #[test]
    fn dot_tile1_matches_scalar_reference_and_dot_rows() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::Bf16] {
            for k in [1, 7, 16, 31, 32, 33, 47, 64, 100, 1029] {
                for n in [1, 3, 4, 5, 9, 13] {
                    let wf: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
                    let x: Vec<f32> = (0..k).map(|_| rnd()).collect();
                    let w = encode(format, &wf);
                    let rb = k * elem_bytes(format);
                    for (path, multi) in paths().into_iter().flat_map(|p| [(p, false), (p, true)]) {
                        let mut out = vec![f32::NAN; n];
                        dot_tile1_rows(path, format, &w, k, &x, &mut out, multi);
                        for c in 0..n {
                            let row = &w[c * rb..][..rb];
                            let want: f64 = (0..k)
                                .map(|i| widen(format, row, i) as f64 * x[i] as f64)
                                .sum();
                            let tol = 1e-5 * (k as f64).sqrt() + 1e-6;
                            assert!(
                                (out[c] as f64 - want).abs() <= tol,
                                "{format:?} {path:?} {multi} k={k} n={n} row {c}: {} vs {want}",
                                out[c]
                            );
                            let mut o = [0.0f32; MR];
                            dot_rows(path, format, row, &x, k, 1, &mut o);
                            assert_eq!(
                                out[c].to_bits(),
                                o[0].to_bits(),
                                "{format:?} {path:?} {multi} k={k} n={n} row {c}: not the one-row sum"
                            );
                        }
                    }
                }
            }
        }
    }
}
