//! Activations quantized to 8 bits for the integer dot products.
//!
//! Each block of `blk` consecutive elements of a row of x (32 for the `_0`/`_1` weight
//! formats and for the prefill GEMM, 256 for the K formats' decode, as ggml's Q8_0 and Q8_K)
//! becomes `q = round_ties_even(x * 127 / amax)` in `[-127, 127]` with the scale
//! `d = amax / 127` kept in f32 (ggml's Q8_0 rounds `d` to f16; keeping f32 costs nothing
//! and loses nothing), where `amax` is the block's largest magnitude (`q = 0`, `d = 0` for
//! an all-zero block). Sums of every 16 consecutive quants ride along (ggml's Q8_K
//! `bsums`): the kernels use them for the formats' offsets and mins.
//!
//! Every path (scalar, AVX2, AVX-512) computes the same quants bit for bit: `amax` is exact,
//! `d` and `127 / amax` are one scalar division each, and the vector conversion rounds to
//! nearest even like `round_ties_even`.

use super::Shared;

/// Row-major quantized activations: `m` rows of `k` elements in blocks of `blk`.
#[derive(Default)]
pub(crate) struct Act {
    pub m: usize,
    pub k: usize,
    pub blk: usize,
    /// `m * k` quants, natural order.
    pub qs: Vec<i8>,
    /// `m * (k / blk)` block scales.
    pub d: Vec<f32>,
    /// `m * (k / 16)` sums of 16 quants.
    pub s16: Vec<i32>,
}

impl Act {
    /// Quants of row `r`.
    pub fn row(&self, r: usize) -> &[i8] {
        &self.qs[r * self.k..(r + 1) * self.k]
    }

    /// Scales of row `r`.
    pub fn scales(&self, r: usize) -> &[f32] {
        let nb = self.k / self.blk;
        &self.d[r * nb..(r + 1) * nb]
    }

    /// 16-sums of row `r`.
    pub fn sums16(&self, r: usize) -> &[i32] {
        let n = self.k / 16;
        &self.s16[r * n..(r + 1) * n]
    }

    /// Resizes for `m x k` in blocks of `blk` (contents unspecified until [`quantize_rows`]).
    pub fn reset(&mut self, m: usize, k: usize, blk: usize) {
        debug_assert!(k.is_multiple_of(blk) && blk.is_multiple_of(16));
        self.m = m;
        self.k = k;
        self.blk = blk;
        self.qs.resize(m * k, 0);
        self.d.resize(m * (k / blk), 0.0);
        self.s16.resize(m * (k / 16), 0);
    }
}

/// Which vector instructions quantize (any path gives the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuantIsa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl QuantIsa {
    pub fn of(path: super::Path) -> QuantIsa {
        match path {
            #[cfg(target_arch = "x86_64")]
            super::Path::Vnni512 => QuantIsa::Avx512,
            #[cfg(target_arch = "x86_64")]
            super::Path::Avx2 => QuantIsa::Avx2,
            super::Path::Scalar => QuantIsa::Scalar,
        }
    }
}

/// Quantizes row `r` of `act` from `x` (the row's `k` floats, contiguous).
pub(crate) fn quantize_row(isa: QuantIsa, x: &[f32], act_row: RowMut<'_>) {
    let RowMut { qs, d, s16, blk } = act_row;
    assert!(x.len() == qs.len() && d.len() * blk == qs.len() && s16.len() * 16 == qs.len());
    for (b, (xb, qb)) in x
        .chunks_exact(blk)
        .zip(qs.chunks_exact_mut(blk))
        .enumerate()
    {
        let amax = match isa {
            // SAFETY: the ISA was checked available (the path's); blk is a multiple of 16.
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512 => unsafe { x86::amax512(xb) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx2 => unsafe { x86::amax256(xb) },
            QuantIsa::Scalar => xb.iter().fold(0.0f32, |m, v| m.max(v.abs())),
        };
        let (scale, inv) = if amax > 0.0 {
            (amax / 127.0, 127.0 / amax)
        } else {
            (0.0, 0.0)
        };
        d[b] = scale;
        let sums = &mut s16[b * blk / 16..(b + 1) * blk / 16];
        match isa {
            // SAFETY: as above; qb and sums are sized for xb.
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512 => unsafe { x86::round512(xb, inv, qb, sums) },
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx2 => unsafe { x86::round256(xb, inv, qb, sums) },
            QuantIsa::Scalar => {
                for (q, &v) in qb.iter_mut().zip(xb) {
                    *q = (v * inv).round_ties_even() as i8;
                }
                for (s, q16) in sums.iter_mut().zip(qb.chunks_exact(16)) {
                    *s = q16.iter().map(|&q| q as i32).sum();
                }
            }
        }
    }
}

/// One row of an [`Act`], borrowed mutably.
pub(crate) struct RowMut<'a> {
    pub qs: &'a mut [i8],
    pub d: &'a mut [f32],
    pub s16: &'a mut [i32],
    pub blk: usize,
}

/// Quantizes all rows of `x` (`m x k`, any strides) into `act` (already [`Act::reset`]).
/// Rows are split over `par`'s threads when there are enough of them to pay for it.
pub(crate) fn quantize_rows(
    isa: QuantIsa,
    x: &crate::MatRef<'_>,
    act: &mut Act,
    par: &dyn crate::Parallel,
) {
    let (m, k, blk) = (act.m, act.k, act.blk);
    let nb = k / blk;
    let qs = Shared::new(&mut act.qs);
    let d = Shared::new(&mut act.d);
    let s16 = Shared::new(&mut act.s16);
    let rows = |r0: usize, r1: usize| {
        let mut copy = Vec::new();
        for r in r0..r1 {
            // SAFETY: row r's parts of the three arrays are written by this call alone (the
            // tasks below take disjoint row ranges).
            let row = unsafe {
                RowMut {
                    qs: qs.part(r * k..(r + 1) * k),
                    d: d.part(r * nb..(r + 1) * nb),
                    s16: s16.part(r * k / 16..(r + 1) * k / 16),
                    blk,
                }
            };
            if x.cs == 1 {
                quantize_row(isa, &x.data[r * x.rs..r * x.rs + k], row);
            } else {
                copy.clear();
                copy.extend((0..k).map(|c| x.data[r * x.rs + c * x.cs]));
                quantize_row(isa, &copy, row);
            }
        }
    };
    // ~1 ns an element: below 64K elements, waking threads costs more than it saves.
    let tasks = if m * k < 1 << 16 {
        1
    } else {
        par.threads().min(m)
    };
    if tasks <= 1 {
        rows(0, m);
    } else {
        par.run(tasks, &|t| rows(t * m / tasks, (t + 1) * m / tasks));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Largest magnitude of `x` (a multiple of 16 long).
    ///
    /// # Safety
    /// AVX-512F available.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn amax512(x: &[f32]) -> f32 {
        let mut m = _mm512_setzero_ps();
        for c in x.chunks_exact(16) {
            // SAFETY: 16 floats of c.
            let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            m = _mm512_max_ps(m, _mm512_abs_ps(v));
        }
        _mm512_reduce_max_ps(m)
    }

    /// `q = round_ties_even(x * inv)`, and the sums of every 16 quants.
    ///
    /// # Safety
    /// AVX-512F and BW available; `q.len() == x.len() == 16 * sums.len()`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn round512(x: &[f32], inv: f32, q: &mut [i8], sums: &mut [i32]) {
        let iv = _mm512_set1_ps(inv);
        for ((c, qc), s) in x.chunks_exact(16).zip(q.chunks_exact_mut(16)).zip(sums) {
            // SAFETY: 16 floats of c; 16 bytes of qc.
            unsafe {
                let v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), iv));
                *s = _mm512_reduce_add_epi32(v);
                _mm_storeu_si128(qc.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(v));
            }
        }
    }

    /// As [`amax512`] with AVX.
    ///
    /// # Safety
    /// AVX2 available.
    #[target_feature(enable = "avx2")]
    pub unsafe fn amax256(x: &[f32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            // SAFETY: 8 floats of c.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        }
        let mut t = [0.0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(t.as_mut_ptr(), m) };
        t.iter().fold(0.0f32, |a, &b| a.max(b))
    }

    /// As [`round512`] with AVX2.
    ///
    /// # Safety
    /// AVX2 available; `q.len() == x.len() == 16 * sums.len()`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn round256(x: &[f32], inv: f32, q: &mut [i8], sums: &mut [i32]) {
        let iv = _mm256_set1_ps(inv);
        for ((c, qc), s) in x.chunks_exact(16).zip(q.chunks_exact_mut(16)).zip(sums) {
            // SAFETY: 16 floats of c; 16 bytes of qc.
            unsafe {
                let a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), iv));
                let b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr().add(8)), iv));
                let t = _mm256_add_epi32(a, b);
                let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
                let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
                let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
                *s = _mm_cvtsi128_si32(t);
                // i32 -> i16 -> i8 with saturation; packs interleave 128-bit lanes.
                let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
                let w =
                    _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
                _mm_storeu_si128(qc.as_mut_ptr().cast(), w);
            }
        }
    }
}
