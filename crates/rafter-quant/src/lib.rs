//! ggml's quantized weight formats, for rafter's LLM path.
//!
//! GGUF files store most LLM weights in ggml's block formats (Q4_0, Q4_K, Q6_K, ...): each
//! row is a sequence of fixed-size blocks holding small integers and scales. rafter keeps
//! such weights quantized in memory and multiplies them directly (the kernels live in
//! `rafter-kernels-cpu`); this crate is the part both the importer and the kernels share:
//!
//! - [`BlockFormat`]: the closed set of formats, their block sizes and ggml type ids;
//! - [`dequantize_row`]: blocks to f32, **bit-exact** with gguf-py's dequantizers (and
//!   ggml's `dequantize_row_*`, which agree with them);
//! - [`quantize_row`]: f32 to blocks, **bit-exact** with ggml's reference quantizers
//!   (`quantize_row_*_ref`, what `llama-quantize` writes without an importance matrix), so
//!   `rafter compile --weights q4_k` produces the same bytes as llama.cpp;
//! - [`layout`]: the packed-scale decoders the kernels need too.
//!
//! Bit-exactness means reproducing ggml's float expressions in the same order, its
//! rounding helpers (`nearest_int`'s magic-number trick, `roundf`) and even what its C
//! casts do on x86-64 for out-of-range values (see [`fp`]); the tests hold every format to
//! vectors made by ggml's own C code and gguf-py (`tests/data/gen_reference.py`).
//!
//! Everything is safe, portable Rust with no dependency but `half`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod dequant;
mod format;
pub mod fp;
pub mod layout;
mod quant_k;
mod quant_legacy;

pub use format::{BlockFormat, QK_K};

/// What was wrong with a (de)quantization request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// `elems` is not a whole number of `format`'s blocks.
    NotBlockMultiple {
        /// The format.
        format: BlockFormat,
        /// The element count asked for.
        elems: usize,
    },
    /// The byte buffer does not hold exactly the blocks of `elems` elements.
    ByteLength {
        /// The format.
        format: BlockFormat,
        /// Elements of the row (the f32 side).
        elems: usize,
        /// Bytes those elements take.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A row so long its byte size overflows `usize`.
    TooLarge {
        /// The format.
        format: BlockFormat,
        /// The element count asked for.
        elems: usize,
    },
    /// A ggml type id that is not one of the block formats here.
    UnknownGgmlType(u32),
}

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantError::NotBlockMultiple { format, elems } => write!(
                f,
                "{format}: {elems} elements is not a multiple of its {}-element block",
                format.block_elems()
            ),
            QuantError::ByteLength {
                format,
                elems,
                expected,
                got,
            } => write!(
                f,
                "{format}: {elems} elements take {expected} bytes ({} blocks of {}), got {got}",
                elems / format.block_elems(),
                format.block_bytes()
            ),
            QuantError::TooLarge { format, elems } => {
                write!(f, "{format}: a row of {elems} elements is too large")
            }
            QuantError::UnknownGgmlType(id) => {
                write!(f, "ggml type {id} is not a supported block format")
            }
        }
    }
}

impl std::error::Error for QuantError {}

/// Checks that `bytes` holds exactly the blocks of `elems` elements of `format`.
fn check_lengths(format: BlockFormat, elems: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = format.row_bytes(elems)?;
    if bytes != expected {
        return Err(QuantError::ByteLength {
            format,
            elems,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Dequantizes the blocks in `bytes` into `out` (whose length is the element count),
/// bit-exactly as gguf-py's `dequantize` (and ggml's `dequantize_row_*`) do.
///
/// Q8_1 (which neither has a dequantizer for) gives `d * q`, the value ggml's dot
/// products use; its `s` field is not read.
pub fn dequantize_row(
    format: BlockFormat,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_lengths(format, out.len(), bytes.len())?;
    let blocks = bytes.chunks_exact(format.block_bytes());
    for (block, y) in blocks.zip(out.chunks_exact_mut(format.block_elems())) {
        dequant::block(format, block, y);
    }
    Ok(())
}

/// Quantizes `src` (a whole number of blocks) into `out`, bit-exactly as ggml's
/// `quantize_row_<format>_ref` does.
pub fn quantize_row(format: BlockFormat, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_lengths(format, src.len(), out.len())?;
    let blocks = out.chunks_exact_mut(format.block_bytes());
    for (x, y) in src.chunks_exact(format.block_elems()).zip(blocks) {
        match format {
            BlockFormat::Q4_0 => quant_legacy::q4_0(x, y),
            BlockFormat::Q4_1 => quant_legacy::q4_1(x, y),
            BlockFormat::Q5_0 => quant_legacy::q5_0(x, y),
            BlockFormat::Q5_1 => quant_legacy::q5_1(x, y),
            BlockFormat::Q8_0 => quant_legacy::q8_0(x, y),
            BlockFormat::Q8_1 => quant_legacy::q8_1(x, y),
            BlockFormat::Q2_K => quant_k::q2_k(x, y),
            BlockFormat::Q3_K => quant_k::q3_k(x, y),
            BlockFormat::Q4_K => quant_k::q4_k(x, y),
            BlockFormat::Q5_K => quant_k::q5_k(x, y),
            BlockFormat::Q6_K => quant_k::q6_k(x, y),
            BlockFormat::Q8_K => quant_k::q8_k(x, y),
        }
    }
    Ok(())
}
