//! Low-precision weights: GEMMs whose B (the model's weight) is stored in 16 bits and
//! widened to f32 inside the kernels, accumulating in f32; or quantized to int8 per
//! column, multiplied by activations quantized to u8 per row, accumulating in i32.
//!
//! Why: a decoder generating one token multiplies one row of activations by every weight
//! of the model, about one multiply-add per weight it reads, so its speed is the memory
//! bandwidth divided by the weight bytes. Storing weights as f16 or bf16 halves those
//! bytes; widening them in registers costs an instruction per 16 weights, which the
//! memory-bound loop has to spare.
//!
//! Two paths, chosen by M (the crossover, per ISA and format, was measured: see
//! `direct_max_m` in `half_gemm.rs`; on AVX-512 the direct path won up to M = 128 without
//! an epilogue, and with a model's bias and GELU it runs up to M = 16):
//! - few rows (decode): the micro-kernel streams the 16-bit panels itself and converts on
//!   load (AVX-512F `vcvtph2ps` for f16, a zero-extend and shift for bf16; AVX2 with F16C;
//!   `half` in the scalar kernel). N is split over threads.
//! - many rows (prefill, BERT): the product is compute-bound and every weight is reused M
//!   times, so each `KC x NC` block of B is widened once into a per-thread f32 scratch in
//!   the panel layout of [`crate::PackedB`] and multiplied by the crate's f32 driver and
//!   micro-kernels, unchanged.
//!
//! The panel layout is [`crate::PackedB`]'s with 16-bit elements (`[ceil(N/16), K, 16]`),
//! so one k step of a 16-wide panel is one 32-byte load. On aarch64 the NEON ISA runs the
//! scalar half kernels (correct, not fast: no NEON half kernel is written yet).

//!
//! int8 ([`crate::PackedI8B`], [`crate::gemm_i8`]): symmetric per-column weight scales,
//! activations quantized dynamically per row with zero point 128, so that the `u8 x i8`
//! products fit AVX-512 VNNI's `vpdpbusd` (AVX2 widens both to i16 for `vpmaddwd`, exact;
//! a scalar kernel everywhere else). One kernel path for every M: tiles of up to 8 rows x
//! 64 columns, N (and M, when N has too few tiles) split over threads. The accumulation is
//! exact; the error is the two quantizations', bounded and measured in
//! [`crate::gemm_i8`]'s docs.

mod half_gemm;
mod half_packed;
mod int8_gemm;
mod int8_packed;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_int8;

pub use half_gemm::{gemm_half, gemm_half_with_isa, set_half_direct_max_m};
pub use half_packed::{
    HalfKind, HalfPackError, PackedHalfB, PackedHalfBRef, PACKED_HALF_B_HEADER_BYTES,
    PACKED_HALF_B_MAGIC,
};
pub use int8_gemm::{gemm_i8, gemm_i8_accumulate_with_isa, gemm_i8_with_isa};
pub use int8_packed::{
    I8PackError, PackedI8B, PackedI8BRef, I8_MAX_K, PACKED_I8_B_HEADER_BYTES, PACKED_I8_B_MAGIC,
};

/// A pointer shared by a GEMM's tasks, which write disjoint parts of one output (column
/// ranges, or row block × column range tiles; see `half_gemm` and `int8_gemm`).
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);
// SAFETY: the tasks holding a `Ptr` write disjoint parts of the output, and the pointer
// outlives them (`Parallel::run` returns only when every task has returned).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}
