//! Products with ONNX Runtime's `MatMulNBits` weights: `y[M, N] = x[M, K] · Wᵀ (+ bias)`,
//! where `W` is `[N, K]` quantized along K in blocks of `block` elements (a power of two,
//! at least 16), each block `bits` (4 or 8) bits per element packed low bits first, with an f32
//! scale and an optional zero point per block (packed `bits`-bit per row of blocks; absent:
//! `2^(bits-1)`): `W[j, i] = (q - z) * s`.
//!
//! Why a kernel of its own rather than a repack into ggml's formats: ORT computes these
//! products in f32 (dequantized weights against unrounded activations) unless the model
//! asks for `accuracy_level` 4, and ggml's formats carry f16 scales and run against
//! 8-bit activations, which moves results by ~0.3%, far outside what ORT's own outputs
//! allow. So this kernel dequantizes each weight exactly as ORT (and the reference
//! executor) does, `(q - z) * s` in f32, and multiplies in f32:
//! - **few rows** (`M <=` [`NBITS_FUSED_MAX_M`]): every weight row is read once; each
//!   32-element chunk of a 4-bit block is unpacked into two vectors and FMA'd straight
//!   into per-row accumulators (AVX-512), or dequantized into a row buffer and dotted
//!   (portable Rust, any bits). Tasks take contiguous ranges of output columns.
//! - **many rows**: compute-bound; panels of [`PANEL`] weight rows are dequantized into
//!   f32 (tasks split the panel's rows) and multiplied by the crate's f32 GEMM.
//!
//! The weights are read in ORT's layout, in place: nothing is repacked ahead of time.

use crate::quant::Shared;
use crate::{dot16, sgemm, BRef, Epilogue, GemmError, MatMut, MatRef, Parallel};

/// The most rows of x the fused path takes; more run dequantized panels through the f32
/// GEMM.
pub const NBITS_FUSED_MAX_M: usize = 8;

/// Weight rows dequantized per GEMM call on the many-rows path.
const PANEL: usize = 128;

/// An `[N, K]` weight in `MatMulNBits`'s layout, borrowed (sizes checked at construction,
/// which is what makes the kernels' unchecked reads sound).
#[derive(Clone, Copy, Debug)]
pub struct NBitsRef<'a> {
    packed: &'a [u8],
    scales: &'a [f32],
    zero_points: Option<&'a [u8]>,
    n: usize,
    k: usize,
    bits: usize,
    block: usize,
    int8_activations: bool,
}

fn shape_err(what: &'static str, detail: String) -> GemmError {
    GemmError::Shape { what, detail }
}

impl<'a> NBitsRef<'a> {
    /// `packed` is `[n, ceil(k / block), block * bits / 8]` bytes, `scales` `[n, k_blocks]`,
    /// `zero_points` (if any) `[n, ceil(k_blocks * bits / 8)]` bytes.
    pub fn new(
        packed: &'a [u8],
        scales: &'a [f32],
        zero_points: Option<&'a [u8]>,
        n: usize,
        k: usize,
        bits: usize,
        block: usize,
    ) -> Result<Self, GemmError> {
        if bits != 4 && bits != 8 {
            return Err(shape_err("W", format!("{bits}-bit weights (4 or 8 only)")));
        }
        if block < 16 || !block.is_power_of_two() {
            return Err(shape_err(
                "W",
                format!("block size {block} is not a power of two >= 16"),
            ));
        }
        let w = NBitsRef {
            packed,
            scales,
            zero_points,
            n,
            k,
            bits,
            block,
            int8_activations: false,
        };
        let kb = w.k_blocks();
        let want = |what: &'static str, len: usize, expected: Option<usize>| {
            if expected == Some(len) {
                Ok(())
            } else {
                Err(shape_err(
                    what,
                    format!(
                        "{len} elements, but n {n}, k {k}, block {block}, {bits} bits take {}",
                        expected.map_or("too many".to_string(), |e| e.to_string())
                    ),
                ))
            }
        };
        want(
            "W",
            packed.len(),
            n.checked_mul(kb).and_then(|v| v.checked_mul(w.blob())),
        )?;
        want("scales", scales.len(), n.checked_mul(kb))?;
        if let Some(z) = zero_points {
            want("zero points", z.len(), n.checked_mul(w.zp_row()))?;
        }
        Ok(w)
    }

    /// The same weight, multiplied as ORT's CPU kernel does at `accuracy_level` 4
    /// (`SQNBIT_CompInt8`): each block of x first rounded to int8 with an f32 scale
    /// `max|x| / 127`, ties to even (see [`round_to_int8`]).
    pub fn with_int8_activations(self, on: bool) -> Self {
        NBitsRef {
            int8_activations: on,
            ..self
        }
    }

    /// Rows (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block)
    }

    /// Bytes of one packed block.
    fn blob(&self) -> usize {
        self.block * self.bits / 8
    }

    /// Bytes of one row's zero points.
    fn zp_row(&self) -> usize {
        (self.k_blocks() * self.bits).div_ceil(8)
    }

    /// The zero point of block `b` of row `j`, as f32.
    fn zero(&self, j: usize, b: usize) -> f32 {
        match self.zero_points {
            Some(z) => {
                let per = 8 / self.bits;
                let byte = z[j * self.zp_row() + b / per];
                ((byte >> (self.bits * (b % per))) & ((1u16 << self.bits) - 1) as u8) as f32
            }
            None => (1u32 << (self.bits - 1)) as f32,
        }
    }

    /// The packed bytes of block `b` of row `j`.
    fn block_bytes(&self, j: usize, b: usize) -> &'a [u8] {
        let blob = self.blob();
        &self.packed[(j * self.k_blocks() + b) * blob..][..blob]
    }

    /// Row `j` dequantized into `out` (`k` values): `(q - z) * s`, as ORT computes it.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        assert!(
            j < self.n && out.len() == self.k,
            "row {j} of {} into {}",
            self.n,
            out.len()
        );
        for b in 0..self.k_blocks() {
            let (s, z) = (self.scales[j * self.k_blocks() + b], self.zero(j, b));
            let start = b * self.block;
            let dst = &mut out[start..(start + self.block).min(self.k)];
            let bytes = self.block_bytes(j, b);
            if self.bits == 8 {
                for (o, &q) in dst.iter_mut().zip(bytes) {
                    *o = (q as f32 - z) * s;
                }
            } else {
                for (i, o) in dst.iter_mut().enumerate() {
                    let q = (bytes[i / 2] >> (4 * (i % 2))) & 15;
                    *o = (q as f32 - z) * s;
                }
            }
        }
    }
}

/// `y = x · Wᵀ (+ bias)`, with tasks run by `par`. `x` is `M x K` (any strides), `y` is
/// `M x N` (only written), `bias` has N values.
pub fn nbits_matmul(
    x: MatRef<'_>,
    w: NBitsRef<'_>,
    bias: Option<&[f32]>,
    y: MatMut<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    let (m, k, n) = (x.rows, x.cols, w.n);
    if k != w.k {
        return Err(shape_err(
            "W",
            format!("x is {m}x{k} but W has rows of {} elements", w.k),
        ));
    }
    if y.rows != m || y.cols != n {
        return Err(shape_err(
            "y",
            format!("x·Wᵀ is {m}x{n} but y is {}x{}", y.rows, y.cols),
        ));
    }
    if let Some(b) = bias.filter(|b| b.len() != n) {
        return Err(shape_err("bias", format!("{} values for n {n}", b.len())));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let rounded: Vec<f32>;
    let x = if w.int8_activations {
        rounded = (0..m)
            .flat_map(|r| {
                let mut row: Vec<f32> = (0..k).map(|c| x.data[r * x.rs + c * x.cs]).collect();
                row.chunks_mut(w.block).for_each(round_to_int8);
                row
            })
            .collect();
        MatRef::row_major(&rounded, m, k, k)?
    } else {
        x
    };
    if m <= NBITS_FUSED_MAX_M {
        fused(x, w, bias, y, par);
        Ok(())
    } else {
        panels(x, w, bias, y, par)
    }
}

/// The few-rows path: tasks over ranges of output columns, each weight row read once.
fn fused(x: MatRef<'_>, w: NBitsRef<'_>, bias: Option<&[f32]>, y: MatMut<'_>, par: &dyn Parallel) {
    let (m, k, n) = (x.rows, x.cols, w.n);
    // x as contiguous rows (the SIMD loads want unit stride).
    let xs: Vec<f32> = (0..m)
        .flat_map(|r| (0..k).map(move |c| (r, c)))
        .map(|(r, c)| x.data[r * x.rs + c * x.cs])
        .collect();
    let tasks = (par.threads() * 4).clamp(1, n);
    let (ld, ys) = (y.ld, Shared::new(y.data));
    let simd = Simd::detect(&w);
    par.run(tasks, &|t| {
        let (j0, j1) = (n * t / tasks, n * (t + 1) / tasks);
        let mut row = vec![0f32; if simd.is_some() { 0 } else { k }];
        let mut acc = [0f32; NBITS_FUSED_MAX_M];
        for j in j0..j1 {
            match simd {
                #[cfg(target_arch = "x86_64")]
                Some(Simd::Avx512Q4) => {
                    for r0 in (0..m).step_by(4) {
                        let mr = (m - r0).min(4);
                        // SAFETY: the ISA was detected (`Simd::detect`); `xs` holds m rows
                        // of k values; w is 4-bit with block % 32 == 0 (checked there).
                        unsafe { avx512::q4_rows(&w, j, &xs[r0 * k..], mr, &mut acc[r0..]) };
                    }
                }
                _ => {
                    w.dequantize_row(j, &mut row);
                    for (r, a) in acc[..m].iter_mut().enumerate() {
                        *a = dot16(&xs[r * k..][..k], &row);
                    }
                }
            }
            let b = bias.map_or(0.0, |b| b[j]);
            for (r, a) in acc[..m].iter().enumerate() {
                // SAFETY: element (r, j) is in y (checked shapes); column j belongs to
                // this task alone.
                unsafe { ys.part(r * ld + j..r * ld + j + 1)[0] = a + b };
            }
        }
    });
}

/// Replaces a block of activations by its int8 rounding, as ONNX Runtime's CPU MatMulNBits
/// quantizes them at `accuracy_level` 4: scale `max|x| / 127` (f32), `q = x * (127 /
/// max|x|)` rounded to nearest, ties to even; `q * scale` then stands for `x` in the f32
/// product, which gives ORT's int8 dot products up to f32 rounding.
pub fn round_to_int8(block: &mut [f32]) {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for v in block.iter_mut() {
        *v = (*v * inv).round_ties_even() * scale;
    }
}

/// The many-rows path: panels of weight rows dequantized to f32 (in parallel), each
/// multiplied by the f32 GEMM into its columns of y.
fn panels(
    x: MatRef<'_>,
    w: NBitsRef<'_>,
    bias: Option<&[f32]>,
    y: MatMut<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    let (m, k, n) = (x.rows, x.cols, w.n);
    let mut panel = vec![0f32; PANEL.min(n) * k];
    let ld = y.ld;
    for j0 in (0..n).step_by(PANEL) {
        let nb = PANEL.min(n - j0);
        {
            let rows = Shared::new(&mut panel[..nb * k]);
            let simd = Simd::detect(&w);
            par.run(nb, &|r| {
                // SAFETY: row r of the panel is written by this task alone.
                let out = unsafe { rows.part(r * k..(r + 1) * k) };
                match simd {
                    // SAFETY: the ISA was detected and w is 4-bit with block % 32 == 0
                    // (`Simd::detect`); out holds k values.
                    #[cfg(target_arch = "x86_64")]
                    Some(Simd::Avx512Q4) => unsafe { avx512::q4_dequantize_row(&w, j0 + r, out) },
                    _ => w.dequantize_row(j0 + r, out),
                }
            });
        }
        let b = MatRef::strided(&panel[..nb * k], k, nb, 1, k)?;
        let c = MatMut::row_major(&mut y.data[j0..], m, nb, ld)?;
        let epi = Epilogue {
            bias: bias.map(|b| &b[j0..j0 + nb]),
            ..Epilogue::none()
        };
        sgemm(1.0, x, BRef::Mat(b), 0.0, c, &epi, par)?;
    }
    Ok(())
}

/// The SIMD kernel a weight can use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    /// 4-bit weights with blocks of a multiple of 32, on AVX-512F/BW.
    #[cfg(target_arch = "x86_64")]
    Avx512Q4,
}

impl Simd {
    fn detect(w: &NBitsRef<'_>) -> Option<Simd> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if w.bits == 4 && w.block.is_multiple_of(32) && has!("avx512f") && has!("avx512bw") {
                return Some(Simd::Avx512Q4);
            }
        }
        let _ = w;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::NBitsRef;
    use std::arch::x86_64::*;

    /// `acc[r] = x_r · W[j]` for the `mr` (1..=4) rows of `xs` (rows of `w.k` values, back
    /// to back).
    ///
    /// # Safety
    /// AVX-512F/BW must be available; `w` is 4-bit with `block % 32 == 0`; `xs` holds at
    /// least `mr * w.k` values and `acc` at least `mr`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q4_rows(
        w: &NBitsRef<'_>,
        j: usize,
        xs: &[f32],
        mr: usize,
        acc: &mut [f32],
    ) {
        // SAFETY: the caller's contract is the callee's.
        unsafe {
            match mr {
                1 => q4_rows_n::<1>(w, j, xs, acc),
                2 => q4_rows_n::<2>(w, j, xs, acc),
                3 => q4_rows_n::<3>(w, j, xs, acc),
                _ => q4_rows_n::<4>(w, j, xs, acc),
            }
        }
    }

    /// Row `j`'s block `b` zero point and scale, as f32 vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn block_params(row_z: Option<&[u8]>, row_s: &[f32], b: usize) -> (__m512, __m512) {
        let z = match row_z {
            Some(z) => ((z[b / 2] >> (4 * (b % 2))) & 15) as f32,
            None => 8.0,
        };
        (_mm512_set1_ps(z), _mm512_set1_ps(row_s[b]))
    }

    /// The 32 weights of the 16 packed bytes at `p`, `(q - z) * s`.
    ///
    /// # Safety
    /// 16 bytes at `p` must be readable; AVX-512F/BW available.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn unpack32(p: *const u8, z: __m512, s: __m512) -> (__m512, __m512) {
        let nib = _mm_set1_epi8(0x0f);
        // SAFETY: the caller's contract.
        let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let lo = _mm_and_si128(v, nib);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
        // Element 2i is the low nibble of byte i, 2i+1 the high one.
        let q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
        let q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
        (
            _mm512_mul_ps(_mm512_sub_ps(q0, z), s),
            _mm512_mul_ps(_mm512_sub_ps(q1, z), s),
        )
    }

    /// Masks of the two 16-lane halves of a 32-element chunk with `left` valid elements.
    fn masks(left: usize) -> (__mmask16, __mmask16) {
        if left >= 32 {
            (!0, !0)
        } else if left >= 16 {
            (!0, ((1u32 << (left - 16)) - 1) as u16)
        } else {
            (((1u32 << left) - 1) as u16, 0)
        }
    }

    /// One row's pieces: packed bytes, scales, zero points.
    fn row<'a>(w: &NBitsRef<'a>, j: usize) -> (&'a [u8], &'a [f32], Option<&'a [u8]>) {
        let kb = w.k_blocks();
        (
            &w.packed[j * kb * w.blob()..(j + 1) * kb * w.blob()],
            &w.scales[j * kb..(j + 1) * kb],
            w.zero_points
                .map(|z| &z[j * w.zp_row()..(j + 1) * w.zp_row()]),
        )
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn q4_rows_n<const MR: usize>(w: &NBitsRef<'_>, j: usize, xs: &[f32], acc: &mut [f32]) {
        let k = w.k;
        assert!(xs.len() >= MR * k && acc.len() >= MR);
        let (packed, scales, zps) = row(w, j);
        let mut a0 = [_mm512_setzero_ps(); MR];
        let mut a1 = [_mm512_setzero_ps(); MR];
        let chunks_per_block = w.block / 32;
        for c in 0..k.div_ceil(32) {
            let start = c * 32;
            // Chunk c's 16 bytes are bytes c * 16.. of the row (blocks are back to back,
            // block / 2 bytes each).
            let (z, s) = block_params(zps, scales, c / chunks_per_block);
            // SAFETY: the row holds k_blocks * block / 2 >= (c + 1) * 16 bytes.
            let (w0, w1) = unsafe { unpack32(packed.as_ptr().add(c * 16), z, s) };
            let (m0, m1) = masks(k - start);
            for (r, (s0, s1)) in a0.iter_mut().zip(a1.iter_mut()).enumerate() {
                // SAFETY: masked loads touch only elements start..min(start + 32, k) of
                // row r, inside xs (len >= MR * k).
                let (x0, x1) = unsafe {
                    let p = xs.as_ptr().add(r * k + start);
                    (
                        _mm512_maskz_loadu_ps(m0, p),
                        _mm512_maskz_loadu_ps(m1, p.wrapping_add(16)),
                    )
                };
                *s0 = _mm512_fmadd_ps(w0, x0, *s0);
                *s1 = _mm512_fmadd_ps(w1, x1, *s1);
            }
        }
        for ((a, s0), s1) in acc.iter_mut().zip(a0).zip(a1) {
            *a = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        }
    }

    /// Row `j` dequantized into `out` (`k` values).
    ///
    /// # Safety
    /// As [`q4_rows`]; `out.len() == w.k`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q4_dequantize_row(w: &NBitsRef<'_>, j: usize, out: &mut [f32]) {
        let k = w.k;
        assert_eq!(out.len(), k);
        let (packed, scales, zps) = row(w, j);
        let chunks_per_block = w.block / 32;
        for c in 0..k.div_ceil(32) {
            let start = c * 32;
            let (z, s) = block_params(zps, scales, c / chunks_per_block);
            // SAFETY: as in `q4_rows_n`; the masked stores write only elements
            // start..min(start + 32, k) of out.
            unsafe {
                let (w0, w1) = unpack32(packed.as_ptr().add(c * 16), z, s);
                let (m0, m1) = masks(k - start);
                let p = out.as_mut_ptr().add(start);
                _mm512_mask_storeu_ps(p, m0, w0);
                _mm512_mask_storeu_ps(p.wrapping_add(16), m1, w1);
            }
        }
    }
}
