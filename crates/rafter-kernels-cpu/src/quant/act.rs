//! Activations quantized to 8 bits for the integer dot products, exactly as ggml's CPU
//! backend quantizes them on x86-64 (the weight type's `vec_dot_type` in ggml-cpu.c, made
//! by that type's `from_float`), so that every product computes what llama.cpp computes:
//!
//! | weights | ggml activation type | block | scale `d` | per-block extra |
//! |---|---|---|---|---|
//! | Q4_0, Q5_0, Q8_0 (and Q8_1) | Q8_0 | 32 | `f16(amax / 127)` | |
//! | Q4_1, Q5_1 | Q8_1 | 32 | `f16(amax / 127)` | `s = f16((amax / 127) · Σ q)` |
//! | Q2_K .. Q6_K (and Q8_K) | Q8_K | 256 | `1 / (127 / amax)` in f32 | |
//!
//! The quants are `q = round_ties_even(x · (127 / amax))` for every type: that is what
//! ggml's x86 `quantize_row_q8_0`/`q8_1` compute (`_mm256_round_ps(.., _MM_ROUND_NEAREST)`
//! of `x * (127.f / maxScalar)`; the portable `_ref` versions differ, with `roundf` (ties
//! away from zero) of `x * (1 / d)`), and what `quantize_row_q8_K_ref` (the one x86 uses
//! for Q8_K) computes up to a sign: it scales by `-127 / max` with `max` the signed
//! element of largest magnitude and stores `d = 1 / iscale`, and round-to-nearest-even is
//! odd-symmetric, so `d q` is the same value either way. An all-zero block has `q = 0`,
//! `d = 0` (and `s = 0`).
//!
//! The Q8_0/Q8_1 scale is stored as f16 in ggml and the dot products multiply that value
//! (`GGML_FP16_TO_FP32(y.d)`); the Q8_1 `s` too (`x.m * y.s`, in place of `x.m * y.d * Σ
//! q`). [`Act`] keeps both as the f32 values of those f16s. Sums of every 16 consecutive
//! quants ride along (ggml's Q8_K `bsums`): the kernels use them for the formats' offsets
//! and mins.
//!
//! Every path (scalar, AVX2, AVX-512) computes the same quants bit for bit: `amax` is exact,
//! the scales are scalar operations on it, and the vector conversion rounds to nearest
//! even like `round_ties_even`.

use rafter_quant::fp::{f16_to_f32, f32_to_f16};
use rafter_quant::BlockFormat;

use super::Shared;

/// ggml's activation types (`vec_dot_type`) of the block formats (see the module docs).
#[allow(non_camel_case_types)] // ggml's names
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ActType {
    /// Per 32, f16 scale.
    #[default]
    Q8_0,
    /// Per 32, f16 scale and f16 `s = d Σ q`.
    Q8_1,
    /// Per 256, f32 scale.
    Q8_K,
}

impl ActType {
    /// The activation type ggml multiplies `format`'s weights with. ggml has no dot product
    /// for Q8_1 or Q8_K weights (they are activation types only); here they pair like the
    /// other formats of their block size and symmetry.
    pub fn of(format: BlockFormat) -> ActType {
        match format {
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => ActType::Q8_1,
            f if f.block_elems() == 32 => ActType::Q8_0,
            _ => ActType::Q8_K,
        }
    }

    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            ActType::Q8_0 | ActType::Q8_1 => 32,
            ActType::Q8_K => 256,
        }
    }
}

/// Row-major quantized activations: `m` rows of `k` elements in blocks of `blk`.
#[derive(Default)]
pub(crate) struct Act {
    pub m: usize,
    pub k: usize,
    pub kind: ActType,
    pub blk: usize,
    /// `m * k` quants, natural order.
    pub qs: Vec<i8>,
    /// `m * (k / blk)` block scales (the f16 values for Q8_0/Q8_1).
    pub d: Vec<f32>,
    /// `m * (k / blk)` Q8_1 sums `s` (the f16 values; zero for the other types).
    pub s: Vec<f32>,
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

    /// Q8_1 sums `s` of row `r` (zero for the other types).
    pub fn block_sums(&self, r: usize) -> &[f32] {
        let nb = self.k / self.blk;
        &self.s[r * nb..(r + 1) * nb]
    }

    /// 16-sums of row `r`.
    pub fn sums16(&self, r: usize) -> &[i32] {
        let n = self.k / 16;
        &self.s16[r * n..(r + 1) * n]
    }

    /// Resizes for `m x k` of `kind` (contents unspecified until [`quantize_rows`]).
    pub fn reset(&mut self, m: usize, k: usize, kind: ActType) {
        let blk = kind.block();
        debug_assert!(k.is_multiple_of(blk));
        self.m = m;
        self.k = k;
        self.kind = kind;
        self.blk = blk;
        self.qs.resize(m * k, 0);
        self.d.resize(m * (k / blk), 0.0);
        self.s.resize(m * (k / blk), 0.0);
        self.s16.resize(m * (k / 16), 0);
    }

    /// Row `r` of the activations as ggml's dot products see them, in f32: `out[i] = d q`
    /// (exact for Q8_0/Q8_1, whose f16 scale times an 8-bit quant fits f32's mantissa;
    /// rounded once for Q8_K). For Q8_1, `corr[b]` is what the format's min must also be
    /// multiplied by, `s - d Σ q` of block `b` (exact: both terms are within an f16
    /// rounding of each other), so that `Σ w x' + Σ_b m_b corr_b` over weights
    /// `w = d_w q_w + m_b` is ggml's `Σ_b d_w d Σ q_w q + m_b s`; `corr` is left alone for
    /// the other types.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32], corr: &mut [f32]) {
        let (q, d, s, s16) = (
            self.row(r),
            self.scales(r),
            self.block_sums(r),
            self.sums16(r),
        );
        for ((o, qb), &db) in out
            .chunks_exact_mut(self.blk)
            .zip(q.chunks_exact(self.blk))
            .zip(d)
        {
            for (o, &q) in o.iter_mut().zip(qb) {
                *o = db * q as f32;
            }
        }
        if self.kind == ActType::Q8_1 {
            for (b, c) in corr.iter_mut().enumerate().take(d.len()) {
                let sum = s16[2 * b] + s16[2 * b + 1];
                *c = s[b] - d[b] * sum as f32;
            }
        }
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

/// A value rounded to f16 and back (ggml's `GGML_FP32_TO_FP16`, then `GGML_FP16_TO_FP32`
/// where the dot products read it).
fn via_f16(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// Quantizes one row of x (its `k` floats, contiguous) into `act_row`.
pub(crate) fn quantize_row(isa: QuantIsa, x: &[f32], act_row: RowMut<'_>) {
    let RowMut {
        qs,
        d,
        s,
        s16,
        kind,
    } = act_row;
    let blk = kind.block();
    assert!(
        x.len() == qs.len()
            && d.len() * blk == qs.len()
            && s.len() == d.len()
            && s16.len() * 16 == qs.len()
    );
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
            // SAFETY: as for AVX-512.
            QuantIsa::Avx2 => unsafe { x86::amax256(xb) },
            QuantIsa::Scalar => xb.iter().fold(0.0f32, |m, v| m.max(v.abs())),
        };
        // ggml: `id = maxScalar != 0.0f ? 127.f / maxScalar : 0.0f` (Q8_0/Q8_1), and
        // `iscale = -127.f / max` (Q8_K, zero blocks skipped).
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let sums = &mut s16[b * blk / 16..(b + 1) * blk / 16];
        match isa {
            // SAFETY: as above; qb and sums are sized for xb.
            #[cfg(target_arch = "x86_64")]
            QuantIsa::Avx512 => unsafe { x86::round512(xb, inv, qb, sums) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for AVX-512.
            QuantIsa::Avx2 => unsafe { x86::round256(xb, inv, qb, sums) },
            QuantIsa::Scalar => {
                for (q, &v) in qb.iter_mut().zip(xb) {
                    *q = cvt_i8(v * inv);
                }
                for (s, q16) in sums.iter_mut().zip(qb.chunks_exact(16)) {
                    *s = q16.iter().map(|&q| q as i32).sum();
                }
            }
        }
        match kind {
            ActType::Q8_0 | ActType::Q8_1 => {
                // `d = maxScalar / 127.f`, stored as f16; `s = d * Σ q` from the f32 `d`,
                // stored as f16.
                let d32 = amax / 127.0;
                d[b] = via_f16(d32);
                s[b] = if kind == ActType::Q8_1 {
                    via_f16(d32 * sums.iter().sum::<i32>() as f32)
                } else {
                    0.0
                };
            }
            ActType::Q8_K => {
                // `d = 1 / iscale`: the sign of ggml's iscale cancels in `d q`.
                d[b] = if amax != 0.0 { 1.0 / inv } else { 0.0 };
                s[b] = 0.0;
            }
        }
    }
}

/// `v` rounded to nearest even and saturated to i8 as x86's `cvtps2dq` + signed packs do:
/// NaN and values beyond i32 (the "integer indefinite" `i32::MIN`) give -128. Only a block
/// whose `127 / amax` overflows (amax below ~3.7e-38) gets there, and its scale is 0.
fn cvt_i8(v: f32) -> i8 {
    let r = v.round_ties_even();
    if r.abs() < 2_147_483_648.0 {
        (r as i32).clamp(-128, 127) as i8
    } else {
        -128
    }
}

/// One row of an [`Act`], borrowed mutably.
pub(crate) struct RowMut<'a> {
    pub qs: &'a mut [i8],
    pub d: &'a mut [f32],
    pub s: &'a mut [f32],
    pub s16: &'a mut [i32],
    pub kind: ActType,
}

/// Quantizes all rows of `x` (`m x k`, any strides) into `act` (already [`Act::reset`]).
/// Rows are split over `par`'s threads when there are enough of them to pay for it.
pub(crate) fn quantize_rows(
    isa: QuantIsa,
    x: &crate::MatRef<'_>,
    act: &mut Act,
    par: &dyn crate::Parallel,
) {
    let (m, k, kind) = (act.m, act.k, act.kind);
    let nb = k / act.blk;
    let qs = Shared::new(&mut act.qs);
    let d = Shared::new(&mut act.d);
    let s = Shared::new(&mut act.s);
    let s16 = Shared::new(&mut act.s16);
    let rows = |r0: usize, r1: usize| {
        let mut copy = Vec::new();
        for r in r0..r1 {
            // SAFETY: row r's parts of the four arrays are written by this call alone (the
            // tasks below take disjoint row ranges).
            let row = unsafe {
                RowMut {
                    qs: qs.part(r * k..(r + 1) * k),
                    d: d.part(r * nb..(r + 1) * nb),
                    s: s.part(r * nb..(r + 1) * nb),
                    s16: s16.part(r * k / 16..(r + 1) * k / 16),
                    kind,
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
