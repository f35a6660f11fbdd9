//! Products with quantized weights: `y[M, N] = x[M, K] · Wᵀ (+ epilogue)`, where `W` is a
//! row-major `[N, K]` weight stored in one of ggml's block formats (the bytes of a GGUF
//! tensor, used in place) or in f32/f16/bf16, and `x` is f32.
//!
//! Why: an LLM's decode step multiplies one row of activations by every weight of the
//! model, about one multiply-add per weight byte or two it reads, so its speed is the
//! memory bandwidth divided by the weight bytes; keeping weights at 4-8 bits (instead of
//! widening them to f32 in memory) is what makes decode fast. Prefill multiplies many rows
//! by the same weights and is compute-bound.
//!
//! Two paths, chosen by M (up to [`DECODE_MAX_M`] rows run the decode path):
//! - **decode** (few rows, [`gemv`]): every row of W is read once, for all rows of x, by
//!   tasks that each stream a contiguous range of W's rows, prefetching 8 KiB ahead. x is
//!   first quantized to 8 bits, so the inner loops are integer dot products: AVX-512 VNNI
//!   `vpdpbusd` / `vpdpwssd` with AVX-512BW, VBMI and GFNI for the unpacking, for every
//!   block format ([`x86_vnni`]); AVX2 `vpmaddubsw` for Q4_0, Q8_0, Q4_K and Q6_K
//!   ([`x86_avx2`]; the other formats dequantize each row and run the f32 kernel against
//!   the dequantized activations there); portable Rust everywhere ([`gemv_scalar`], also
//!   the scalar model the vector kernels are tested against). f32/f16/bf16 weights are
//!   widened and FMA'd against unrounded f32 x ([`dense`]).
//! - **prefill** (many rows, [`gemm`]): compute-bound. On AVX-512 VNNI, block formats run
//!   an int8 GEMM ([`x86_vnni_gemm`]): each task unpacks panels of 32 weight rows into
//!   int8 with a float scale (and min) per 16 or 32 elements and runs `vpdpbusd` tiles over
//!   the quantized x. f32/f16/bf16 weights, and every format on CPUs without VNNI, are
//!   widened into f32 panels for the crate's f32 GEMM driver (block formats against the
//!   dequantized quantized activations). On CPUs with AMX-BF16 (unless `RAFTER_CPU_AMX=0`),
//!   every format but f32 runs [`x86_amx_bf16`] instead: weights dequantized per panel and
//!   split into bf16 `hi + lo` tiles, x into `hi + mid + lo` (exact), and as many
//!   `tdpbf16ps` products as keep the result at least as accurate as the AVX-512 path's.
//!   A caller that trades accuracy for speed ([`MatmulPrecision::Bf16`], PyTorch's bf16
//!   arithmetic) gets float weights' products with both operands rounded to bf16 on
//!   AVX512-BF16 ([`x86_bf16_gemm`]), twice the f32 FMA rate.
//!
//! **Block formats compute what ggml computes** (except on the AMX prefill GEMM, whose x
//! keeps 16 bits instead of ggml's 8: closer to the exact product). On every path and ISA, x is quantized
//! exactly as ggml's CPU backend quantizes activations on x86-64 for that weight type
//! (its `vec_dot_type`: Q8_0 per 32 with an f16 scale for Q4_0/Q5_0/Q8_0, Q8_1 with an f16
//! scale and f16 sum for Q4_1/Q5_1, Q8_K per 256 with an f32 scale for the K formats; see
//! [`act`]), and the products combine the same integers with the same scales as ggml's
//! dot products, so a result differs from llama.cpp's only by the order of f32 additions
//! (the tests hold every format, path and ISA to an f64 evaluation of ggml's model).
//!
//! The weights are always read in their GGUF layout, from wherever they lie (a memory map
//! of the file included): nothing is repacked ahead of time.
//!
//! The epilogue is [`crate::sgemm`]'s (bias, activation, residual, clamp), applied to each
//! output tile while it is hot; a decoder layer's residual add (`o_proj`, `down_proj`) costs
//! no extra pass over memory.

pub(crate) mod act;
mod dense;
mod finish;
mod gemm;
mod gemv;
mod gemv_scalar;
#[cfg(target_arch = "x86_64")]
mod x86_amx_bf16;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_bf16_gemm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_vnni;
#[cfg(target_arch = "x86_64")]
mod x86_vnni_gemm;

pub use rafter_quant::BlockFormat;

use crate::{check_epilogue, Epilogue, GemmError, Isa, MatMut, MatRef, Parallel};

/// The most rows of x any product runs on the decode path (each weight row read once for
/// all rows); more rows run the prefill GEMM. Block formats use all of it, the float
/// formats switch at 8.
///
/// Measured on Zen 5 (`benches/quant_gemv.rs --m M --decode-max-m 1` against the default,
/// K x N = 1024 x 3072, weights streamed, one thread): at M = 8 the decode path took
/// 55-65% of the GEMM's time for every format; at M = 12-16 it still won for q8_0, q4_0
/// and q6_K (by 10-35%), tied for q4_K, and lost for f16 (1.5-1.6 ms against 1.2-1.5).
pub const DECODE_MAX_M: usize = 16;

/// Replaces [`DECODE_MAX_M`] when non-zero (see [`set_quant_decode_max_m`]).
static DECODE_MAX_M_OVERRIDE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Rows up to which `format` runs the decode path (see [`DECODE_MAX_M`]).
fn decode_max_m(format: WeightFormat) -> usize {
    let default = match format {
        WeightFormat::Block(_) => DECODE_MAX_M,
        _ => 8,
    };
    match DECODE_MAX_M_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        0 => default,
        v => v.min(default),
    }
}

/// Lowers the row count up to which quantized products run the decode path, for every
/// later call in the process (0 restores [`DECODE_MAX_M`]; values above it are capped,
/// 1 sends every `M >= 2` to the GEMM). For the bench, to measure the crossover.
#[doc(hidden)]
pub fn set_quant_decode_max_m(m: usize) {
    DECODE_MAX_M_OVERRIDE.store(m, std::sync::atomic::Ordering::Relaxed);
}

/// Sets how far ahead (bytes) the VNNI decode kernels prefetch the weight stream, for every
/// later call (0: off). For the bench's tuning runs.
#[doc(hidden)]
pub fn set_quant_prefetch_distance(bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    x86_vnni::set_prefetch_distance(bytes);
    let _ = bytes;
}

/// Sets the int8 GEMM micro-kernel's rows (1..=6; 0: default) for later calls. For the
/// bench's tuning runs.
#[doc(hidden)]
pub fn set_quant_gemm_rows(mr: usize) {
    #[cfg(target_arch = "x86_64")]
    x86_vnni_gemm::set_rows(mr);
    let _ = mr;
}

/// Forces the AMX-BF16 prefill GEMM off (`Some(false)`: the AVX-512 kernels), on where the
/// CPU and OS allow it (`Some(true)`), or back to the default (`None`: on where available
/// unless `RAFTER_CPU_AMX=0`) for later calls. For the bench's A/B runs and tests.
#[doc(hidden)]
pub fn set_quant_amx(on: Option<bool>) {
    #[cfg(target_arch = "x86_64")]
    x86_amx_bf16::force(on);
    let _ = on;
}

/// Sets the AMX-BF16 prefill GEMM's steps (32 elements of K) per K-block for later calls
/// (0: the default; at least K's steps: no K-blocking). For the bench's tuning runs.
#[doc(hidden)]
pub fn set_quant_amx_k_steps(steps: usize) {
    #[cfg(target_arch = "x86_64")]
    x86_amx_bf16::set_k_steps(steps);
    let _ = steps;
}

/// The AMX-BF16 tiles' measured peak on one thread, in GFLOP/s (2 per bf16 multiply-add):
/// `iters` rounds of 16 independent `tdpbf16ps` on register-resident tiles; `None` where
/// AMX-BF16 is unavailable. For the bench's fractions of peak.
#[doc(hidden)]
pub fn quant_amx_peak(iters: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    return x86_amx_bf16::peak(iters);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = iters;
        None
    }
}

/// Whether this process can run the AMX-BF16 prefill GEMM (CPU, OS and permission).
#[doc(hidden)]
pub fn quant_amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86_amx_bf16::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether prefill products (more than [`DECODE_MAX_M`] rows) with `format` weights at
/// [`MatmulPrecision::Bf16`] round their operands to bf16 on `isa` here (else they stay
/// [`MatmulPrecision::F32`]). For tests.
#[doc(hidden)]
pub fn quant_bf16_products(isa: Isa, format: WeightFormat) -> bool {
    isa.is_available() && gemm::bf16_products(Path::of(isa), MatmulPrecision::Bf16, format)
}

/// Sets whether the dense (f32/f16/bf16) decode kernels read several weight rows a pass
/// (`rows > 1`) or one (`rows == 1`, the default; same sums bit for bit), for later calls
/// (0: back to the default, or `RAFTER_CPU_DENSE_ROWS`). For the bench's A/B runs.
#[doc(hidden)]
pub fn set_quant_dense_rows(rows: usize) {
    dense::DENSE_ROWS.store(rows, std::sync::atomic::Ordering::Relaxed);
}

/// How a weight matrix's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Little-endian f32.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16 (the top half of an f32).
    Bf16,
    /// One of ggml's block formats; each row a whole number of blocks.
    Block(BlockFormat),
}

impl WeightFormat {
    /// Elements per block (1 for the float formats).
    pub fn block_elems(self) -> usize {
        match self {
            WeightFormat::Block(f) => f.block_elems(),
            _ => 1,
        }
    }

    /// Bytes of a row of `k` elements; an error when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Result<usize, GemmError> {
        let bytes = match self {
            WeightFormat::F32 => k.checked_mul(4),
            WeightFormat::F16 | WeightFormat::Bf16 => k.checked_mul(2),
            WeightFormat::Block(f) => f.row_bytes(k).ok(),
        };
        bytes.ok_or_else(|| GemmError::Shape {
            what: "W",
            detail: format!(
                "a {} row of {k} elements is not a whole number of {}-element blocks",
                self.name(),
                self.block_elems()
            ),
        })
    }

    /// The format's name (`f32`, `f16`, `bf16`, or ggml's, e.g. `q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Block(f) => f.name(),
        }
    }

    /// The format of ggml type id `id` (0 f32, 1 f16, 30 bf16, or a block format).
    pub fn from_ggml_type(id: u32) -> Option<WeightFormat> {
        match id {
            0 => Some(WeightFormat::F32),
            1 => Some(WeightFormat::F16),
            30 => Some(WeightFormat::Bf16),
            _ => BlockFormat::from_ggml_type(id)
                .ok()
                .map(WeightFormat::Block),
        }
    }
}

impl From<BlockFormat> for WeightFormat {
    fn from(f: BlockFormat) -> Self {
        WeightFormat::Block(f)
    }
}

/// A row-major `[N, K]` weight in a [`WeightFormat`]: row `n` is bytes
/// `n * row_bytes .. (n + 1) * row_bytes` of `data` (checked at construction, which is
/// what makes the kernels' unchecked reads sound).
#[derive(Clone, Copy, Debug)]
pub struct QuantMatRef<'a> {
    format: WeightFormat,
    data: &'a [u8],
    n: usize,
    k: usize,
    row_bytes: usize,
}

impl<'a> QuantMatRef<'a> {
    /// `n` rows of `k` elements in `format`, packed back to back in `data` (exactly
    /// `n * format.row_bytes(k)` bytes: a GGUF tensor's data).
    pub fn new(
        format: impl Into<WeightFormat>,
        data: &'a [u8],
        n: usize,
        k: usize,
    ) -> Result<Self, GemmError> {
        let format = format.into();
        let row_bytes = format.row_bytes(k)?;
        let expected = row_bytes.checked_mul(n);
        if expected != Some(data.len()) {
            return Err(GemmError::Shape {
                what: "W",
                detail: format!(
                    "{n} {} rows of {k} elements take {} bytes, the data has {}",
                    format.name(),
                    expected.map_or("too many".to_string(), |e| e.to_string()),
                    data.len()
                ),
            });
        }
        Ok(QuantMatRef {
            format,
            data,
            n,
            k,
            row_bytes,
        })
    }

    /// The storage format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Rows (output features).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of rows `n0..n1`.
    pub(crate) fn rows(&self, n0: usize, n1: usize) -> &'a [u8] {
        &self.data[n0 * self.row_bytes..n1 * self.row_bytes]
    }
}

/// `y = x · Wᵀ`, then the epilogue, on the fastest kernels this CPU has, with tasks run by
/// `par`. `x` is `M x K` (any strides), `W` is `[N, K]`, `y` is `M x N` (only written).
///
/// Block-format weights multiply x quantized to 8 bits as ggml does (see the module docs),
/// so the result differs from the f64 product of x and the dequantized W by that rounding:
/// per 32 (or 256) elements of x at most half a step of `max |x| / 127` (plus the f16
/// rounding of the 32-element scales), in practice ~0.3% of the product's magnitude for
/// random data (the tests bound it). f32/f16/bf16 weights multiply x unrounded,
/// accumulating in f32.
pub fn quant_matmul(
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    quant_matmul_with_isa(Isa::detect(), x, w, y, epilogue, par)
}

/// [`quant_matmul`] on a given ISA's kernels (tests hold every path to the references;
/// benches compare them).
pub fn quant_matmul_with_isa(
    isa: Isa,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    quant_matmul_with(isa, MatmulPrecision::F32, x, w, y, epilogue, par)
}

/// How the prefill path (more than a few rows of x) multiplies f32/f16/bf16 weights.
/// Block formats always compute what ggml computes, and the decode path (few rows: the
/// product is bound by reading the weights, not by arithmetic) always keeps f32 products.
/// (`rafter_runtime::MatmulPrecision` is the session-level twin the CPU loader maps to
/// this: the runtime does not depend on the CPU kernels.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// x unrounded, weights exact (f16/bf16 widen to f32), f32 accumulation; on AMX the
    /// tiles' bf16 products are split so that the result is as accurate.
    #[default]
    F32,
    /// Weights and x rounded to bf16 (to nearest even; 8 significant bits), products
    /// accumulated in f32: what PyTorch computes for a bf16 model and llama.cpp for BF16
    /// weights. Where the CPU has AVX512-BF16 (Zen 4, Sapphire Rapids): `vdpbf16ps` at
    /// twice the f32 FMA rate, or on AMX-BF16 one tile product where the accurate path
    /// takes three to five; elsewhere the products stay [`MatmulPrecision::F32`].
    Bf16,
}

impl MatmulPrecision {
    /// Its name on command lines and in options: `f32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Bf16 => "bf16",
        }
    }

    /// The precision called `name` ([`MatmulPrecision::name`]).
    pub fn from_name(name: &str) -> Option<MatmulPrecision> {
        match name {
            "f32" => Some(MatmulPrecision::F32),
            "bf16" => Some(MatmulPrecision::Bf16),
            _ => None,
        }
    }
}

/// [`quant_matmul_with_isa`] with float weights' prefill products at `precision`.
pub fn quant_matmul_with(
    isa: Isa,
    precision: MatmulPrecision,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    if !isa.is_available() {
        return Err(GemmError::IsaUnavailable(isa));
    }
    let (m, k, n) = (x.rows, x.cols, w.n);
    if k != w.k {
        return Err(GemmError::Shape {
            what: "W",
            detail: format!("x is {m}x{k} but W has rows of {} elements", w.k),
        });
    }
    if y.rows != m || y.cols != n {
        return Err(GemmError::Shape {
            what: "y",
            detail: format!("x·Wᵀ is {m}x{n} but y is {}x{}", y.rows, y.cols),
        });
    }
    check_epilogue(m, n, epilogue)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let path = Path::of(isa);
    if k == 0 {
        // An empty sum: y is the epilogue of zeros.
        let yp = finish::YPtr {
            ptr: y.data.as_mut_ptr(),
            ld: y.ld,
        };
        let zeros = [0.0f32; 16 * 64];
        for i0 in (0..m).step_by(16) {
            for j0 in (0..n).step_by(64) {
                // SAFETY: rows i0.., columns j0.. of y are in bounds (checked shapes) and
                // written by this call alone; the epilogue was checked; `zeros` holds 16
                // rows of 64 floats; the path's ISA is available.
                unsafe {
                    finish::finish(
                        path,
                        &zeros,
                        64,
                        16.min(m - i0),
                        64.min(n - j0),
                        i0,
                        j0,
                        Some(epilogue),
                        yp,
                    )
                };
            }
        }
        return Ok(());
    }
    if m <= decode_max_m(w.format) {
        gemv::run(path, x, w, y, epilogue, par);
    } else {
        gemm::run(isa, path, precision, x, w, y, epilogue, par);
    }
    Ok(())
}

/// Which quantized kernels an [`Isa`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// AVX-512F/BW/VL/VBMI/VNNI/BITALG, GFNI and BMI2 (Ice Lake, Zen 4 and later):
    /// `vpdpbusd` on
    /// 64-byte vectors.
    #[cfg(target_arch = "x86_64")]
    Vnni512,
    /// AVX2 + FMA + F16C: `vpmaddubsw`/`vpmaddwd` on 32-byte vectors.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable Rust (also NEON for now).
    Scalar,
}

impl Path {
    pub(crate) fn of(isa: Isa) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match isa {
                Isa::Avx512
                    if has!("avx512bw")
                        && has!("avx512vl")
                        && has!("avx512vnni")
                        && has!("avx512vbmi")
                        && has!("avx512bitalg")
                        && has!("gfni")
                        && has!("bmi2")
                        && avx2 =>
                {
                    return Path::Vnni512
                }
                Isa::Avx512 | Isa::Avx2 if avx2 => return Path::Avx2,
                _ => {}
            }
        }
        let _ = isa;
        Path::Scalar
    }
}

/// A slice that parallel tasks write disjoint parts of (rows of the quantized activations,
/// column ranges of y).
pub(crate) struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: parts are handed out only through `part`, whose contract is that parts used
// concurrently do not overlap; the slice outlives the tasks (`Parallel::run` returns only
// when every task has).
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// Elements `r`.
    ///
    /// # Safety
    /// No other part overlapping `r` may be alive at the same time, and the slice this was
    /// made from must still be alive and not otherwise borrowed.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, r: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "part {r:?} of {}",
            self.len
        );
        // SAFETY: in bounds (checked above); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }
}
