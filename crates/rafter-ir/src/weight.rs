//! How a weight operand of `linear`, `embedding` and `moe_ffn` is encoded.
//!
//! LLM weights arrive in many encodings: f32, f16 and bf16 tensors from Hugging Face
//! checkpoints, and ggml's block formats (Q4_K, Q8_0, ...) from GGUF files, where a row of
//! `K` values is `K / block_elems` blocks of `block_bytes` bytes each (scales and packed
//! integers together). *Choice:* the IR's dtypes stay element types (every dtype has a size
//! per element and every elementwise op is defined over it), and a block-quantized weight
//! is an ordinary `u8` tensor of raw blocks, `[rows..., row_bytes]`, that only the ops which
//! read weights interpret, through their `WeightFormat` attribute. So a quantized weight is
//! never dequantized ahead of time: the artifact stores the blocks as the model file had
//! them, the runtime maps them, and the kernels (or the reference executor, through
//! `rafter-quant`) decode them where they are read.
//!
//! This module holds only the layout table (how many values a block holds and how many
//! bytes it takes); the arithmetic of each format lives in `rafter-quant`.

use crate::attr::{AttrType, AttrValue};
use crate::DType;

/// The encoding of a weight operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

/// Every format with its text-format keyword (ggml's type names, lower case).
const WORDS: [(WeightFormat, &str); 13] = [
    (WeightFormat::F32, "f32"),
    (WeightFormat::F16, "f16"),
    (WeightFormat::BF16, "bf16"),
    (WeightFormat::Q4_0, "q4_0"),
    (WeightFormat::Q4_1, "q4_1"),
    (WeightFormat::Q5_0, "q5_0"),
    (WeightFormat::Q5_1, "q5_1"),
    (WeightFormat::Q8_0, "q8_0"),
    (WeightFormat::Q2K, "q2_k"),
    (WeightFormat::Q3K, "q3_k"),
    (WeightFormat::Q4K, "q4_k"),
    (WeightFormat::Q5K, "q5_k"),
    (WeightFormat::Q6K, "q6_k"),
];

impl WeightFormat {
    /// Every format, in declaration order.
    pub const ALL: [WeightFormat; 13] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::Q8_0,
        WeightFormat::Q2K,
        WeightFormat::Q3K,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
    ];

    /// The text-format keyword (`q4_k`, `bf16`, ...).
    pub fn word(self) -> &'static str {
        WORDS
            .iter()
            .find(|(f, _)| *f == self)
            .map(|(_, w)| *w)
            .expect("every format has a word")
    }

    pub fn from_word(w: &str) -> Option<WeightFormat> {
        WORDS.iter().find(|(_, x)| *x == w).map(|(f, _)| *f)
    }
}

/// Printed as a keyword; `f32`, `f16` and `bf16` read back as dtype tokens, so both parse.
impl AttrType for WeightFormat {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Word(self.word().to_string())
    }

    fn from_attr(v: AttrValue) -> Result<Self, String> {
        let word = match &v {
            AttrValue::Word(w) => w.clone(),
            AttrValue::DType(d) => d.name().to_string(),
            other => return Err(format!("expected WeightFormat, found {}", other.kind())),
        };
        WeightFormat::from_word(&word).ok_or_else(|| format!("unknown WeightFormat `{word}`"))
    }
}

impl WeightFormat {
    /// The dtype of the tensor holding weights in this format: the element type itself for
    /// f32/f16/bf16, `u8` (raw blocks) for the block formats.
    pub fn storage_dtype(self) -> DType {
        match self {
            WeightFormat::F32 => DType::F32,
            WeightFormat::F16 => DType::F16,
            WeightFormat::BF16 => DType::BF16,
            _ => DType::U8,
        }
    }

    /// Whether rows are stored as ggml blocks (the last dim counts bytes, not values).
    pub fn is_block(self) -> bool {
        self.storage_dtype() == DType::U8
    }

    /// Values per block (1 for the element formats), as ggml's `QK*` constants define them.
    pub fn block_elems(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 1,
            WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::Q8_0 => 32,
            WeightFormat::Q2K
            | WeightFormat::Q3K
            | WeightFormat::Q4K
            | WeightFormat::Q5K
            | WeightFormat::Q6K => 256,
        }
    }

    /// Bytes per block, as ggml's `block_*` structs lay them out (ggml-common.h).
    pub fn block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            // f16 scale + 16 bytes of nibbles
            WeightFormat::Q4_0 => 18,
            // f16 scale, f16 min + 16 bytes of nibbles
            WeightFormat::Q4_1 => 20,
            // f16 scale + 4 bytes of high bits + 16 bytes of nibbles
            WeightFormat::Q5_0 => 22,
            // f16 scale, f16 min + 4 + 16
            WeightFormat::Q5_1 => 24,
            // f16 scale + 32 int8
            WeightFormat::Q8_0 => 34,
            // 16 scale/min nibble pairs + 64 bytes of 2-bit quants + f16 d, dmin
            WeightFormat::Q2K => 84,
            // 32 bytes of high-bit masks + 64 of 2-bit quants + 12 of scales + f16 d
            WeightFormat::Q3K => 110,
            // f16 d, dmin + 12 bytes of 6-bit scales/mins + 128 bytes of nibbles
            WeightFormat::Q4K => 144,
            // f16 d, dmin + 12 + 32 bytes of high bits + 128 of nibbles
            WeightFormat::Q5K => 176,
            // 128 bytes of low nibbles + 64 of high bits + 16 int8 scales + f16 d
            WeightFormat::Q6K => 210,
        }
    }

    /// Bytes of one row of `k` values, or `None` when `k` is not a whole number of blocks
    /// (or the size overflows).
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        let be = self.block_elems();
        if !k.is_multiple_of(be) {
            return None;
        }
        (k / be).checked_mul(self.block_bytes())
    }

    /// Values in a row of `bytes` bytes, or `None` when `bytes` is not a whole number of
    /// blocks. For element formats the stored last dim already counts values.
    pub fn row_values(self, bytes: usize) -> Option<usize> {
        if !self.is_block() {
            return Some(bytes);
        }
        let bb = self.block_bytes();
        bytes
            .is_multiple_of(bb)
            .then(|| bytes / bb * self.block_elems())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_through_bytes() {
        for f in WeightFormat::ALL {
            let k = 512;
            let stored = if f.is_block() {
                f.row_bytes(k).unwrap()
            } else {
                k
            };
            assert_eq!(f.row_values(stored), Some(k), "{}", f.word());
        }
        assert_eq!(WeightFormat::Q4K.row_bytes(1024), Some(4 * 144));
        assert_eq!(WeightFormat::Q4K.row_bytes(1000), None);
        assert_eq!(WeightFormat::Q8_0.row_values(35), None);
    }

    #[test]
    fn attrs_read_words_and_dtype_tokens() {
        for f in WeightFormat::ALL {
            assert_eq!(WeightFormat::from_attr(f.to_attr()), Ok(f));
        }
        assert_eq!(
            WeightFormat::from_attr(AttrValue::DType(DType::BF16)),
            Ok(WeightFormat::BF16)
        );
        assert!(WeightFormat::from_attr(AttrValue::DType(DType::I8)).is_err());
        assert!(WeightFormat::from_attr(AttrValue::Int(3)).is_err());
    }
}
