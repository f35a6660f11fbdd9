//! Byte offsets inside each block and the decoders of the K formats' packed sub-block
//! scales: what the dequantizers, the quantizers and the CPU kernels all read.
//!
//! Offsets follow `ggml/src/ggml-common.h`; multi-byte fields are little-endian.

/// Q4_0: `d: f16`, then 16 bytes of nibbles (element `j` in the low nibble of byte `j`,
/// element `j + 16` in its high nibble).
pub mod q4_0 {
    /// Offset of the 16 quant bytes.
    pub const QS: usize = 2;
}

/// Q4_1: `d: f16, m: f16`, then nibbles as Q4_0.
pub mod q4_1 {
    /// Offset of the min.
    pub const M: usize = 2;
    /// Offset of the 16 quant bytes.
    pub const QS: usize = 4;
}

/// Q5_0: `d: f16, qh: u32` (bit `j` is element `j`'s fifth bit), then nibbles as Q4_0.
pub mod q5_0 {
    /// Offset of the high-bit word.
    pub const QH: usize = 2;
    /// Offset of the 16 quant bytes.
    pub const QS: usize = 6;
}

/// Q5_1: `d: f16, m: f16, qh: u32`, then nibbles as Q4_0.
pub mod q5_1 {
    /// Offset of the min.
    pub const M: usize = 2;
    /// Offset of the high-bit word.
    pub const QH: usize = 4;
    /// Offset of the 16 quant bytes.
    pub const QS: usize = 8;
}

/// Q8_0: `d: f16`, then 32 `i8`.
pub mod q8_0 {
    /// Offset of the 32 quants.
    pub const QS: usize = 2;
}

/// Q8_1: `d: f16, s: f16` (`d * sum(qs)`), then 32 `i8`.
pub mod q8_1 {
    /// Offset of the sum.
    pub const S: usize = 2;
    /// Offset of the 32 quants.
    pub const QS: usize = 4;
}

/// Q2_K: 16 bytes of (scale | min << 4), 64 bytes of 2-bit quants, `d: f16, dmin: f16`.
pub mod q2_k {
    /// Offset of the 64 quant bytes.
    pub const QS: usize = 16;
    /// Offset of the super-block scale.
    pub const D: usize = 80;
    /// Offset of the super-block min scale.
    pub const DMIN: usize = 82;
}

/// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales, `d: f16`.
pub mod q3_k {
    /// Offset of the 64 low-bit bytes.
    pub const QS: usize = 32;
    /// Offset of the 12 packed scales.
    pub const SCALES: usize = 96;
    /// Offset of the super-block scale.
    pub const D: usize = 108;
}

/// Q4_K: `d: f16, dmin: f16`, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
pub mod q4_k {
    /// Offset of the super-block min scale.
    pub const DMIN: usize = 2;
    /// Offset of the 12 packed scales and mins.
    pub const SCALES: usize = 4;
    /// Offset of the 128 quant bytes.
    pub const QS: usize = 16;
}

/// Q5_K: as Q4_K, with 32 bytes of fifth bits before the nibbles.
pub mod q5_k {
    /// Offset of the super-block min scale.
    pub const DMIN: usize = 2;
    /// Offset of the 12 packed scales and mins.
    pub const SCALES: usize = 4;
    /// Offset of the 32 high-bit bytes.
    pub const QH: usize = 16;
    /// Offset of the 128 quant bytes.
    pub const QS: usize = 48;
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 `i8` scales, `d: f16`.
pub mod q6_k {
    /// Offset of the 64 high-bit bytes.
    pub const QH: usize = 128;
    /// Offset of the 16 scales.
    pub const SCALES: usize = 192;
    /// Offset of the super-block scale.
    pub const D: usize = 208;
}

/// Q8_K: `d: f32`, 256 `i8`, 16 `i16` sums of 16 quants each.
pub mod q8_k {
    /// Offset of the 256 quants.
    pub const QS: usize = 4;
    /// Offset of the 16 sums.
    pub const BSUMS: usize = 260;
}

/// The f16 at `at` in `b`, as f32.
#[inline]
pub fn read_f16(b: &[u8], at: usize) -> f32 {
    crate::fp::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_K and Q5_K: the 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes
/// (ggml's `get_scale_min_k4`): sub-blocks 0..4 keep theirs in the low 6 bits of bytes
/// `j` and `j + 4`; 4..8 in the nibbles of byte `j + 4` and the top 2 bits of bytes
/// `j - 4` and `j`.
#[inline]
pub fn k4_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Q3_K: the 16 signed sub-block scales (6-bit values minus 32) from the 12 packed bytes:
/// scale `j`'s low 4 bits are a nibble of byte `j % 8` (low for `j < 8`), its high 2 bits
/// are bits `2 (j / 4)` of byte `8 + j % 4`.
pub fn q3_k_scales(scales: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = if j < 8 {
            scales[j] & 0xF
        } else {
            scales[j - 8] >> 4
        };
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_scales_unpack_each_sub_block() {
        // Pack known 6-bit (scale, min) pairs the way quantize_row_q4_K_ref does, unpack.
        let pairs: [(u8, u8); 8] = [
            (1, 62),
            (63, 0),
            (17, 33),
            (40, 8),
            (63, 63),
            (0, 1),
            (34, 21),
            (5, 60),
        ];
        let mut s = [0u8; 12];
        for (j, &(ls, lm)) in pairs.iter().enumerate() {
            if j < 4 {
                s[j] = ls;
                s[j + 4] = lm;
            } else {
                s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                s[j - 4] |= (ls >> 4) << 6;
                s[j] |= (lm >> 4) << 6;
            }
        }
        for (j, &p) in pairs.iter().enumerate() {
            assert_eq!(k4_scale_min(&s, j), p, "sub-block {j}");
        }
    }

    #[test]
    fn q3_k_scales_unpack_each_sub_block() {
        // Pack as quantize_row_q3_K_ref does.
        let want: [i8; 16] = std::array::from_fn(|j| (j as i8 * 7) % 64 - 32);
        let mut s = [0u8; 12];
        for (j, &w) in want.iter().enumerate() {
            let l = (w + 32) as u8;
            if j < 8 {
                s[j] = l & 0xF;
            } else {
                s[j - 8] |= (l & 0xF) << 4;
            }
            s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        assert_eq!(q3_k_scales(&s), want);
    }
}
