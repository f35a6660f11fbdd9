//! rafter's CPU micro-kernels.
//!
//! Today this crate holds the kernel that dominates CNN and transformer inference on the CPU:
//! a packed f32 GEMM, `C = act(alpha*A*B + beta*C + bias [+ residual]) [+ residual]`, in the
//! style of BLIS:
//!
//! ```text
//! for jc in N step NC            (B block lives in L3)
//!   for pc in K step KC          (pack B[pc.., jc..] into NR-wide panels, unless pre-packed)
//!     for ic in M step MC        (A block, lives in L2; packed into MR-tall panels only
//!                                 when A is strided, row-major A is read in place)
//!       for jr in NC step NR     (one B micro-panel, kc x NR, lives in L1)
//!         for ir in MC step MR   micro-kernel: an MR x NR tile of C held in registers
//! ```
//!
//! Reading row-major A in place departs from BLIS on purpose: measured on ResNet-50's
//! N = 64..256 GEMMs, packing A cost up to half the run time, and in place the kernels ran as
//! fast (see `benchmarks/RESULTS.md`, "CPU GEMM micro-kernel").
//!
//! Pre-packed weights are prefetched: a model's weights do not stay in the caches between
//! calls (BERT-base's are 435 MB), so on a task's first pass over a B micro-panel its row
//! tiles prefetch the next micro-panel into L2 while they compute, and a task's very first
//! tile prefetches its own B ahead: 7-12% faster on BERT's and MiniLM's GEMMs with weights
//! streamed from memory, 12-19% under load (`benchmarks/RESULTS.md`, "CPU GEMM on BERT
//! shapes").
//!
//! The epilogue (per-column or per-row bias, activation, residual add) runs on the tile while it is
//! still in registers, after the last K block, so a fused `Gemm + Add + Relu` writes C once.
//!
//! Weights are B. [`PackedB`] packs them once, at compile time, into exactly the panels the
//! micro-kernels read, and serialises to a validated byte layout so they can sit in the
//! artifact and be used from a memory map without a copy ([`PackedBRef::from_bytes`]); the
//! compiler stores the panels alone as a plain `[ceil(N/16), K, 16]` weight, which the
//! runtime reads in place through [`PackedBRef::from_panels`].
//!
//! Weights can also be stored in 16 bits ([`PackedHalfB`], f16 or bf16, same panel layout,
//! its own validated byte format) and multiplied by [`gemm_half`], which accumulates in f32:
//! few-row products (LLM decode, bound by weight bytes) stream the 16-bit panels through
//! micro-kernels that widen them on load; many-row ones may instead widen blocks of B into
//! f32 panels for the f32 driver (see the `lowp` module).
//!
//! Or in 8 bits ([`PackedI8B`]: int8 per-column symmetric quantization, packed for AVX-512
//! VNNI's `vpdpbusd`, with its own validated byte format), multiplied by [`gemm_i8`], which
//! quantizes each row of activations to u8 on the fly and accumulates exactly in i32; the
//! error is the quantization's, bounded in [`gemm_i8`]'s docs.
//!
//! The micro-kernel is chosen once per process by runtime feature detection ([`Isa::detect`]):
//! AVX-512F (12x32 tile) or AVX2+FMA (6x16) on x86-64, NEON (4x16) on aarch64, and a
//! portable scalar kernel everywhere (also reachable explicitly, for tests).
//!
//! Threads come from the caller through [`Parallel`], so rafter's CPU device drives the GEMM
//! on its own worker pool: [`WorkerPool`], persistent threads that spin briefly between jobs;
//! [`ScopedThreads`] is a simple implementation for tests and benches.

#![warn(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("rafter-kernels-cpu's packed-weight byte layout is little-endian only");

pub mod artifact_section;
mod block_nhwc;
mod buffer;
mod cache_size;
mod driver;
mod kernel;
mod lowp;
mod pack;
mod packed;
mod parallel;
#[macro_use]
mod simd;
mod activation;
mod attention;
mod common;
mod cumulative;
mod lrn;
mod moe;
mod nbits;
mod nhwc;
mod norm;
mod pool;
mod quant;
mod recurrent;
mod rope;
mod softmax;
mod spatial;
mod stem;
pub mod tile;
mod transpose;
mod winograd;
mod winograd_nhwc;

pub use attention::{
    cached_attention, cached_attention_with_isa, set_attention_packing,
    set_attention_prefetch_rows, CachedAttention, KvElement,
};
pub use block_nhwc::{block_nhwc, block_nhwc_with_isa, BlockNhwc, DepthwiseStage, Pointwise};
pub use common::dot16;
pub use driver::K_SPLIT_MAX_ROWS;
pub use kernel::Isa;
pub use lowp::{
    gemm_half, gemm_half_with_isa, gemm_i8, gemm_i8_with_isa, HalfKind, HalfPackError, I8PackError,
    PackedHalfB, PackedHalfBRef, PackedI8B, PackedI8BRef, I8_MAX_K, PACKED_HALF_B_HEADER_BYTES,
    PACKED_HALF_B_MAGIC, PACKED_I8_B_HEADER_BYTES, PACKED_I8_B_MAGIC,
};
#[doc(hidden)]
pub use lowp::{gemm_i8_accumulate_with_isa, set_half_direct_max_m};
pub use nbits::{nbits_matmul, round_to_int8, NBitsRef, NBITS_FUSED_MAX_M};
pub use nhwc::{
    depthwise_nhwc, depthwise_nhwc_with_isa, im2col_nhwc, im2col_nhwc_cols, max_pool_nhwc,
    max_pool_nhwc_with_isa, small_conv_nhwc, small_conv_nhwc_with_isa, DepthwiseNhwc, MaxPoolNhwc,
    SmallConvNhwc, WindowNhwc,
};
pub use packed::{
    PackError, PackedB, PackedBRef, PACKED_B_HEADER_BYTES, PACKED_B_MAGIC, PACKED_B_NR,
};
pub use parallel::{Parallel, ScopedThreads, Sequential};
pub use pool::WorkerPool;
#[doc(hidden)]
pub use quant::{
    quant_amx_available, quant_amx_peak, quant_bf16_products, set_quant_amx, set_quant_amx_k_steps,
    set_quant_decode_max_m, set_quant_dense_rows, set_quant_gemm_rows, set_quant_prefetch_distance,
};
pub use quant::{
    quant_matmul, quant_matmul_with, quant_matmul_with_isa, BlockFormat, MatmulPrecision,
    QuantMatRef, WeightFormat, DECODE_MAX_M,
};
pub use stem::{stem_conv, stem_conv_with_isa, StemConv};
pub use transpose::{permute_rows_f32, transpose_f32};
pub use winograd::{conv3x3, Conv3x3, WinogradWeights};
pub use winograd_nhwc::{conv3x3_nhwc, conv3x3_nhwc_with_isa, Conv3x3Nhwc, WinogradNhwcWeights};

pub use activation::{
    activation_in_place, activation_in_place_with_isa, gelu_erf, gelu_tanh, sigmoid_in_place, silu,
    UnaryFn,
};
pub use common::{ChannelTail, KernelError};
pub use cumulative::{cumulative, CumElem, Cumulative};
pub use lrn::{lrn, Lrn};
pub use moe::moe_route;
pub use norm::{
    add_layer_norm, add_layer_norm_with_isa, layer_norm, layer_norm_with_isa, rms_norm,
    rms_norm_with_isa,
};
pub use recurrent::{
    gate_activation, gate_activation_with_isa, gemv_accumulate, gemv_accumulate_with_isa, GateFn,
};
pub use rope::{rope, RopePairs};
pub use softmax::{softmax, softmax_in_place, softmax_with_isa, RowMask};
pub use spatial::{
    copy_strided, depthwise3x3, depthwise3x3_with_isa, max_pool2d, max_pool2d_with_isa,
    Depthwise3x3, MaxPool2d,
};

use thiserror::Error;

/// A read-only strided view of an f32 matrix: element `(i, j)` is `data[i*rs + j*cs]`.
///
/// General strides (not just a leading dimension) let the compiler fold a transpose into
/// the GEMM (`MatRef::t`) instead of materialising it: packing reads through the strides.
/// Construction checks that every element is inside `data`, which is what makes the
/// kernels' unchecked reads sound.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix with leading dimension `ld` (`ld >= cols`).
    pub fn row_major(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<Self, GemmError> {
        if ld < cols {
            return Err(GemmError::Stride {
                what: "row-major matrix",
                ld,
                cols,
            });
        }
        MatRef::strided(data, rows, cols, ld, 1)
    }

    /// A matrix with arbitrary row and column strides (in elements).
    pub fn strided(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> Result<Self, GemmError> {
        check_extent("matrix", data.len(), rows, cols, rs, cs)?;
        Ok(MatRef {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// The transpose, as a view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Rows (M for A, K for B).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (K for A, N for B).
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// The output matrix: row-major with leading dimension `ld` (unit column stride, so the
/// micro-kernels can load and store whole vectors of a C row).
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    ld: usize,
}

impl<'a> MatMut<'a> {
    /// A row-major output with leading dimension `ld` (`ld >= cols`).
    pub fn row_major(
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<Self, GemmError> {
        if ld < cols {
            return Err(GemmError::Stride {
                what: "output matrix",
                ld,
                cols,
            });
        }
        check_extent("output matrix", data.len(), rows, cols, ld, 1)?;
        Ok(MatMut {
            data,
            rows,
            cols,
            ld,
        })
    }
}

/// Where B comes from: a strided matrix (packed on the fly, per call) or weights packed ahead
/// of time (no packing work at run time at all).
#[derive(Clone, Copy, Debug)]
pub enum BRef<'a> {
    /// Any strided matrix: activations, or weights not packed ahead of time.
    Mat(MatRef<'a>),
    /// Weights packed by [`PackedB`]: the kernels read them as they are.
    Packed(PackedBRef<'a>),
}

impl<'a> From<MatRef<'a>> for BRef<'a> {
    fn from(m: MatRef<'a>) -> Self {
        BRef::Mat(m)
    }
}

impl<'a> From<&'a PackedB> for BRef<'a> {
    fn from(p: &'a PackedB) -> Self {
        BRef::Packed(p.view())
    }
}

impl<'a> From<PackedBRef<'a>> for BRef<'a> {
    fn from(p: PackedBRef<'a>) -> Self {
        BRef::Packed(p)
    }
}

impl BRef<'_> {
    fn rows(&self) -> usize {
        match self {
            BRef::Mat(m) => m.rows,
            BRef::Packed(p) => p.k(),
        }
    }

    fn cols(&self) -> usize {
        match self {
            BRef::Mat(m) => m.cols,
            BRef::Packed(p) => p.n(),
        }
    }
}

/// The activation applied in the epilogue, elementwise, while the tile is in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the tanh approximation (BERT's and
    /// GPT-2's); computed as `x * sigmoid(2u)`, with a polynomial `exp` in the vector kernels.
    GeluTanh,
}

/// A matrix added to the result in the epilogue, e.g. a ResNet or transformer skip
/// connection, so the add costs no extra pass over memory.
#[derive(Clone, Copy, Debug)]
pub struct Residual<'a> {
    data: &'a [f32],
    ld: usize,
    /// `true`: `act(x + r)` (ResNet's `relu(conv + skip)`); `false`: `act(x) + r`.
    pub before_activation: bool,
}

impl<'a> Residual<'a> {
    /// A row-major residual with leading dimension `ld`; its shape must be C's (checked
    /// by [`sgemm`]).
    pub fn row_major(data: &'a [f32], ld: usize, before_activation: bool) -> Self {
        Residual {
            data,
            ld,
            before_activation,
        }
    }
}

/// What happens to the `alpha*A*B + beta*C` tile before it is stored:
/// `clamp(act(x + bias[j] + row_bias[i] (+ residual)) (+ residual))`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// Per-column (output channel / feature) bias, length N.
    pub bias: Option<&'a [f32]>,
    /// Per-row bias, length M: a convolution's per-output-channel bias when C is laid out
    /// `[Cout, pixels]` (NCHW), as `C = W x im2col(X)` computes it.
    pub row_bias: Option<&'a [f32]>,
    /// Applied after the bias (and a residual added before activation).
    pub activation: Activation,
    /// A matrix of C's shape added before or after the activation.
    pub residual: Option<Residual<'a>>,
    /// `(lo, hi)`: the result is clamped to `[lo, hi]` last of all, after a residual added
    /// after the activation (ONNX `Clip`, MobileNet's ReLU6 as `Relu` with `(0, 6)`). A NaN
    /// becomes `lo`, as `x.max(lo).min(hi)` gives.
    pub clamp: Option<(f32, f32)>,
}

impl Epilogue<'_> {
    /// No bias, no activation, no residual: a plain GEMM.
    pub fn none() -> Self {
        Epilogue::default()
    }

    fn is_identity(&self) -> bool {
        self.bias.is_none()
            && self.row_bias.is_none()
            && self.activation == Activation::None
            && self.residual.is_none()
            && self.clamp.is_none()
    }
}

/// A GEMM's arguments did not fit together. Every variant says which operand and sizes
/// (each variant's message is its documentation).
#[allow(missing_docs)]
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GemmError {
    #[error("{what}: leading dimension {ld} is smaller than its {cols} columns")]
    Stride {
        what: &'static str,
        ld: usize,
        cols: usize,
    },
    #[error("{what}: {rows}x{cols} with strides ({rs}, {cs}) needs {needed} elements, the slice has {len}")]
    TooShort {
        what: &'static str,
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
        needed: usize,
        len: usize,
    },
    #[error("{what}: shape mismatch, {detail}")]
    Shape { what: &'static str, detail: String },
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}

fn check_extent(
    what: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Result<(), GemmError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let needed = (rows - 1)
        .checked_mul(rs)
        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
        .and_then(|last| last.checked_add(1));
    match needed {
        Some(needed) if needed <= len => Ok(()),
        _ => Err(GemmError::TooShort {
            what,
            rows,
            cols,
            rs,
            cs,
            needed: needed.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// `C = act(alpha*A*B + beta*C + bias (+ residual)) (+ residual)`, on the fastest kernel this
/// CPU has, with tasks run by `par`.
///
/// `A` is M x K, `B` is K x N (strided or pre-packed), `C` is M x N. With `beta == 0`, C is
/// only written, never read (so it may hold garbage, NaN included), as BLAS specifies.
pub fn sgemm(
    alpha: f32,
    a: MatRef<'_>,
    b: BRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    sgemm_with_isa(Isa::detect(), alpha, a, b, beta, c, epilogue, par)
}

/// [`sgemm`] on a given kernel: tests use it to hold every path (the scalar one included) to
/// the reference on any machine, and benches to compare paths.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with_isa(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: BRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    check_product(isa, &a, "B", [b.rows(), b.cols()], &c, epilogue)?;
    driver::run(isa, alpha, a, b, beta, c, epilogue, par);
    Ok(())
}

/// Checks a product's arguments, shared by every GEMM entry point: the ISA is available,
/// B (`b_dims`, named `b_name` in the error) has A's columns as rows, C is `A·B`'s shape, and
/// the epilogue's operands fit C.
pub(crate) fn check_product(
    isa: Isa,
    a: &MatRef<'_>,
    b_name: &str,
    [b_rows, n]: [usize; 2],
    c: &MatMut<'_>,
    epilogue: &Epilogue<'_>,
) -> Result<(), GemmError> {
    if !isa.is_available() {
        return Err(GemmError::IsaUnavailable(isa));
    }
    let (m, k) = (a.rows, a.cols);
    if b_rows != k {
        return Err(GemmError::Shape {
            what: "B",
            detail: format!("A is {m}x{k} but {b_name} has {b_rows} rows"),
        });
    }
    if c.rows != m || c.cols != n {
        return Err(GemmError::Shape {
            what: "C",
            detail: format!("A*B is {m}x{n} but C is {}x{}", c.rows, c.cols),
        });
    }
    check_epilogue(m, n, epilogue)
}

/// `C = epilogue(alpha A B)` for a few-row A (`m x k`) that the caller produces on demand:
/// `fill_a(cols, dst)` must write columns `cols` of all `m` rows of A into `dst`, row-major
/// (`m · cols.len()` floats), and may be called from any thread, for any ranges.
///
/// For a convolution whose im2col has few rows (ResNet-50's 7×7 maps: 49 pixels, K =
/// 4,608), so that the copy is not written by one thread and read by every other: on
/// several threads K is split over the tasks, each filling only its own part of A, and the
/// partial sums are reduced into C before the epilogue runs (see the driver's
/// `run_k_split`). Meant for `m <= `[`K_SPLIT_MAX_ROWS`]; larger A is better filled once and
/// passed to [`sgemm`]. C is only written (`beta = 0`).
#[allow(clippy::too_many_arguments)]
pub fn sgemm_fill_a(
    alpha: f32,
    m: usize,
    k: usize,
    fill_a: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync),
    b: BRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    sgemm_fill_a_with_isa(Isa::detect(), alpha, m, k, fill_a, b, c, epilogue, par)
}

/// Whether [`sgemm_fill_a`] splits an `m x k` by `k x n` product over K on `threads`
/// threads (this CPU's kernel). Where it does not, it fills A whole on the calling thread,
/// and a caller that can fill A faster itself (an im2col spread over the threads by
/// output rows) is better off doing so and calling [`sgemm`].
pub fn fill_a_splits_k(m: usize, n: usize, k: usize, threads: usize) -> bool {
    driver::fill_grid(m, n, k, &Isa::detect().blocking(), threads).0 > 1
}

/// [`sgemm_fill_a`] on a given kernel (tests hold every kernel to the reference).
#[allow(clippy::too_many_arguments)]
pub fn sgemm_fill_a_with_isa(
    isa: Isa,
    alpha: f32,
    m: usize,
    k: usize,
    fill_a: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync),
    b: BRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    if !isa.is_available() {
        return Err(GemmError::IsaUnavailable(isa));
    }
    if b.rows() != k {
        return Err(GemmError::Shape {
            what: "B",
            detail: format!("A is {m}x{k} but B has {} rows", b.rows()),
        });
    }
    if c.rows != m || c.cols != b.cols() {
        return Err(GemmError::Shape {
            what: "C",
            detail: format!("A*B is {m}x{} but C is {}x{}", b.cols(), c.rows, c.cols),
        });
    }
    check_epilogue(m, c.cols, epilogue)?;
    driver::run_fill(isa, alpha, m, k, fill_a, b, c, epilogue, par);
    Ok(())
}

/// Checks an epilogue's operands against an `m x n` C (shared by every GEMM entry point).
pub(crate) fn check_epilogue(m: usize, n: usize, epilogue: &Epilogue<'_>) -> Result<(), GemmError> {
    if let Some(bias) = epilogue.bias {
        if bias.len() != n {
            return Err(GemmError::Shape {
                what: "bias",
                detail: format!("{} elements for {n} columns", bias.len()),
            });
        }
    }
    if let Some(bias) = epilogue.row_bias {
        if bias.len() != m {
            return Err(GemmError::Shape {
                what: "row bias",
                detail: format!("{} elements for {m} rows", bias.len()),
            });
        }
    }
    if let Some(r) = &epilogue.residual {
        if r.ld < n {
            return Err(GemmError::Stride {
                what: "residual",
                ld: r.ld,
                cols: n,
            });
        }
        check_extent("residual", r.data.len(), m, n, r.ld, 1)?;
    }
    Ok(())
}

/// Times the micro-kernel alone on operands resident in L1/L2 (`iters` tiles of depth `kc`),
/// returning GFLOP/s: the ceiling the blocked driver can reach. For the bench binary.
#[doc(hidden)]
pub fn bench_micro_kernel(isa: Isa, kc: usize, iters: usize) -> f64 {
    let bl = isa.blocking();
    let a = buffer::Aligned::new(0, bl.mr * kc);
    let b = buffer::Aligned::new(0, bl.nr * kc);
    let mut c = vec![0.0f32; bl.mr * bl.nr];
    let t = kernel::Tile {
        kc,
        a: a.as_slice().as_ptr(),
        a_rs: 0,
        b: b.as_slice().as_ptr(),
        b_ps: kc * kernel::PANEL,
        b_prefetch: 0,
        pf_next: std::ptr::null(),
        pf_lines: 0,
        c: c.as_mut_ptr(),
        ldc: bl.nr,
        mv: bl.mr,
        nv: bl.nr,
        alpha: 1.0,
        beta: 1.0,
        epi: None,
    };
    assert!(isa.is_available());
    let start = std::time::Instant::now();
    for _ in 0..iters {
        // SAFETY: packed A of MR x kc, B of nr/16 panels of kc rows, C of MR x NR, all owned
        // above; the ISA is available.
        unsafe { isa.tile(&t, true) };
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(&c);
    (2 * bl.mr * bl.nr * kc * iters) as f64 / secs / 1e9
}

/// Turns off (1) or back on (0) the kernels' prefetching of pre-packed B for every later
/// GEMM in the process. For the bench only, to compare within one run.
#[doc(hidden)]
pub fn set_prefetch_override(mode: usize) {
    kernel::BLOCKING_OVERRIDE[4].store(mode, std::sync::atomic::Ordering::Relaxed);
}

/// Forces the GEMM's split into tasks to 1 or 4 tasks per thread (0: the default rule) for
/// every later GEMM in the process. For the bench only.
#[doc(hidden)]
pub fn set_split_override(tasks_per_thread: usize) {
    kernel::BLOCKING_OVERRIDE[5].store(tasks_per_thread, std::sync::atomic::Ordering::Relaxed);
}

/// Turns the few-row K split of the GEMM driver off (1: the row x column grid alone), back
/// to its rule (0), or forces it to `mode >= 2` parts of K where it applies, for every
/// later GEMM in the process. For the bench only, to compare within one run.
#[doc(hidden)]
pub fn set_few_rows_override(mode: usize) {
    kernel::BLOCKING_OVERRIDE[6].store(mode, std::sync::atomic::Ordering::Relaxed);
}

/// Overrides the cache blocking (MC, KC, NC; 0 keeps a kernel's default) and how row-major
/// A is read (0: the default rule, 1: packed, 2: in place) for every later
/// GEMM in the process. For tuning from the bench only.
#[doc(hidden)]
pub fn set_blocking_override(mc: usize, kc: usize, nc: usize, a_policy: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    kernel::BLOCKING_OVERRIDE[3].store(a_policy, Relaxed);
    kernel::BLOCKING_OVERRIDE[0].store(mc, Relaxed);
    kernel::BLOCKING_OVERRIDE[1].store(kc, Relaxed);
    kernel::BLOCKING_OVERRIDE[2].store(nc, Relaxed);
}
