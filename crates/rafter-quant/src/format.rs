//! The closed set of block formats, their sizes and ggml type ids.

use crate::QuantError;

/// Elements in one K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// One of ggml's quantized block formats.
///
/// A row of `k` elements is `k / block_elems()` blocks of `block_bytes()` bytes, laid out
/// exactly as ggml writes them (`ggml/src/ggml-common.h`), so GGUF tensor data can be used
/// in place. The `_0`/`_1` formats have 32-element blocks with one f16 scale (and an f16
/// min for `_1`); the K formats have 256-element super-blocks whose sub-blocks carry
/// small integer scales under f16 super-scales. Q8_1 and Q8_K are the activation formats
/// ggml's dot products use (Q8_K keeps an f32 scale and per-16 sums).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 32 x 4 bits, `d * (q - 8)`; 18 bytes.
    Q4_0,
    /// 32 x 4 bits, `d * q + m`; 20 bytes.
    Q4_1,
    /// 32 x 5 bits, `d * (q - 16)`; 22 bytes.
    Q5_0,
    /// 32 x 5 bits, `d * q + m`; 24 bytes.
    Q5_1,
    /// 32 x int8, `d * q`; 34 bytes.
    Q8_0,
    /// 32 x int8 with `s = d * sum(q)`; 36 bytes.
    Q8_1,
    /// 256 x 2 bits in 16 sub-blocks with 4-bit scales and mins; 84 bytes.
    Q2_K,
    /// 256 x 3 bits in 16 sub-blocks with 6-bit scales; 110 bytes.
    Q3_K,
    /// 256 x 4 bits in 8 sub-blocks with 6-bit scales and mins; 144 bytes.
    Q4_K,
    /// 256 x 5 bits in 8 sub-blocks with 6-bit scales and mins; 176 bytes.
    Q5_K,
    /// 256 x 6 bits in 16 sub-blocks with int8 scales; 210 bytes.
    Q6_K,
    /// 256 x int8 with an f32 scale and 16 int16 sums; 292 bytes.
    Q8_K,
}

impl BlockFormat {
    /// Every format, in ggml type id order.
    pub const ALL: [BlockFormat; 12] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Q8_1,
        BlockFormat::Q2_K,
        BlockFormat::Q3_K,
        BlockFormat::Q4_K,
        BlockFormat::Q5_K,
        BlockFormat::Q6_K,
        BlockFormat::Q8_K,
    ];

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0
            | BlockFormat::Q8_1 => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q8_1 => 36,
            BlockFormat::Q2_K => 84,
            BlockFormat::Q3_K => 110,
            BlockFormat::Q4_K => 144,
            BlockFormat::Q5_K => 176,
            BlockFormat::Q6_K => 210,
            BlockFormat::Q8_K => 292,
        }
    }

    /// ggml's name of the type (`"q4_K"` style lowercase-with-K, as `ggml_type_name`
    /// prints it).
    pub const fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_0 => "q4_0",
            BlockFormat::Q4_1 => "q4_1",
            BlockFormat::Q5_0 => "q5_0",
            BlockFormat::Q5_1 => "q5_1",
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q8_1 => "q8_1",
            BlockFormat::Q2_K => "q2_K",
            BlockFormat::Q3_K => "q3_K",
            BlockFormat::Q4_K => "q4_K",
            BlockFormat::Q5_K => "q5_K",
            BlockFormat::Q6_K => "q6_K",
            BlockFormat::Q8_K => "q8_K",
        }
    }

    /// The format named `name` (any case: `Q4_K`, `q4_k`, `q4_K`).
    pub fn named(name: &str) -> Option<BlockFormat> {
        BlockFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name.trim()))
    }

    /// ggml's `enum ggml_type` value, as GGUF tensor infos store it.
    pub const fn ggml_type(self) -> u32 {
        match self {
            BlockFormat::Q4_0 => 2,
            BlockFormat::Q4_1 => 3,
            BlockFormat::Q5_0 => 6,
            BlockFormat::Q5_1 => 7,
            BlockFormat::Q8_0 => 8,
            BlockFormat::Q8_1 => 9,
            BlockFormat::Q2_K => 10,
            BlockFormat::Q3_K => 11,
            BlockFormat::Q4_K => 12,
            BlockFormat::Q5_K => 13,
            BlockFormat::Q6_K => 14,
            BlockFormat::Q8_K => 15,
        }
    }

    /// The block format of ggml type id `id`; an error for ids that are not block formats
    /// of this set (F32, F16, BF16, the IQ and TQ types, ids ggml does not define).
    pub fn from_ggml_type(id: u32) -> Result<BlockFormat, QuantError> {
        BlockFormat::ALL
            .into_iter()
            .find(|f| f.ggml_type() == id)
            .ok_or(QuantError::UnknownGgmlType(id))
    }

    /// Bytes of a row of `k` elements; an error when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Result<usize, QuantError> {
        self.check_elems(k)?;
        (k / self.block_elems())
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::TooLarge {
                format: self,
                elems: k,
            })
    }

    /// `Ok` when `k` elements are a whole number of blocks.
    pub(crate) fn check_elems(self, k: usize) -> Result<(), QuantError> {
        if !k.is_multiple_of(self.block_elems()) {
            return Err(QuantError::NotBlockMultiple {
                format: self,
                elems: k,
            });
        }
        Ok(())
    }

    /// Whether [`crate::quantize_row`] implements this format (all of them do).
    pub const fn can_quantize(self) -> bool {
        true
    }
}

impl std::fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_ggml_common_h() {
        // (elements, bytes) from the static_asserts of ggml-common.h.
        let want = [
            (32, 2 + 16),
            (32, 4 + 16),
            (32, 2 + 4 + 16),
            (32, 4 + 4 + 16),
            (32, 2 + 32),
            (32, 4 + 32),
            (256, 4 + 16 + 64),
            (256, 2 + 64 + 32 + 12),
            (256, 4 + 12 + 128),
            (256, 4 + 12 + 128 + 32),
            (256, 2 + 16 + 3 * 64),
            (256, 4 + 256 + 32),
        ];
        for (f, (e, b)) in BlockFormat::ALL.into_iter().zip(want) {
            assert_eq!((f.block_elems(), f.block_bytes()), (e, b), "{f}");
        }
    }

    #[test]
    fn ggml_ids_round_trip_and_others_fail() {
        for f in BlockFormat::ALL {
            assert_eq!(BlockFormat::from_ggml_type(f.ggml_type()), Ok(f));
            assert_eq!(BlockFormat::named(f.name()), Some(f));
            assert_eq!(BlockFormat::named(&f.name().to_uppercase()), Some(f));
        }
        for id in [0, 1, 4, 5, 16, 30, 39, 1000, u32::MAX] {
            assert_eq!(
                BlockFormat::from_ggml_type(id),
                Err(QuantError::UnknownGgmlType(id))
            );
        }
        assert_eq!(BlockFormat::named("f16"), None);
    }

    #[test]
    fn row_bytes_checks_the_block_multiple() {
        assert_eq!(BlockFormat::Q4_0.row_bytes(64), Ok(36));
        assert_eq!(BlockFormat::Q6_K.row_bytes(1024), Ok(840));
        assert_eq!(BlockFormat::Q4_0.row_bytes(0), Ok(0));
        assert_eq!(
            BlockFormat::Q4_K.row_bytes(100),
            Err(QuantError::NotBlockMultiple {
                format: BlockFormat::Q4_K,
                elems: 100
            })
        );
        assert!(BlockFormat::Q8_0.row_bytes(usize::MAX - 31).is_err());
    }
}
