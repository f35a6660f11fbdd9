//! The portable integer kernels of the decode path, one weight row against one row of
//! quantized activations: the fallback on every CPU and the scalar model the vector
//! kernels are held to (they compute the same integer dot products per block, so their
//! results differ from these only by the order of the f32 additions).
//!
//! Per block (32 elements) or super-block (256) the integer part is exact; the float part
//! is ggml's (`ggml_vec_dot_*` in ggml-cpu/arch/x86/quants.c), with the activations
//! quantized as ggml's `vec_dot_type` ([`super::act`]):
//! - `_0` formats: `(dw dx) (Σ q x - offset Σ x)`, `dw dx` the product of two f16 values
//!   (exact in f32);
//! - `_1` formats: `(dw dx) Σ q x + mw s`, with the activations' f16 `s` (Q8_1), not
//!   `dx Σ x`;
//! - K formats: `(dx dw) Σ_j sc_j Σ_j q x - (dx dmin) Σ_j m_j Σ_j x` over the sub-blocks
//!   `j`, `dx` the Q8_K f32 scale.

use rafter_quant::layout::{self, k4_scale_min, q3_k_scales, read_f16};
use rafter_quant::BlockFormat;

use super::act::Act;

/// `Σ_k w[k] x[k]` for one weight row `w` (whole blocks of `format`) and row `r` of `act`
/// (quantized as [`super::act::ActType::of`] `format`).
pub(crate) fn dot(format: BlockFormat, w: &[u8], act: &Act, r: usize) -> f32 {
    let (x, dx, sx, s16) = (act.row(r), act.scales(r), act.block_sums(r), act.sums16(r));
    let bb = format.block_bytes();
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        acc += match format.block_elems() {
            32 => block32(
                format,
                blk,
                &x[32 * b..][..32],
                dx[b],
                sx[b],
                s16[2 * b] + s16[2 * b + 1],
            ),
            _ => {
                let xs = &x[256 * b..][..256];
                let sums = &s16[16 * b..][..16];
                superblock(format, blk, xs, sums, dx[b])
            }
        };
    }
    acc
}

/// One 32-element block `b` against 32 quantized activations `x` with scale `dx`, Q8_1 sum
/// `s` (for the `_1` formats) and integer sum `sum`.
pub(crate) fn block32(format: BlockFormat, b: &[u8], x: &[i8], dx: f32, s: f32, sum: i32) -> f32 {
    let (q, offset) = unpack32(format, b);
    match format {
        BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
            let (d, m) = (read_f16(b, 0), read_f16(b, 2));
            d * dx * idot(&q, x) as f32 + m * s
        }
        _ => read_f16(b, 0) * dx * (idot(&q, x) - offset * sum) as f32,
    }
}

/// `Σ q x` in i32 (exact: at most 256 products of magnitude < 2^15).
fn idot<Q: Copy + Into<i32>>(q: &[Q], x: &[i8]) -> i32 {
    q.iter().zip(x).map(|(&q, &x)| q.into() * x as i32).sum()
}

/// The 32 unsigned (or, for Q8, signed) quants of a 32-element block and the offset its
/// values subtract (`value = d (q - offset)`; 0 for the formats with a min).
fn unpack32(format: BlockFormat, b: &[u8]) -> ([i32; 32], i32) {
    let mut q = [0i32; 32];
    let offset = match format {
        BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
            let qs = &b[if format == BlockFormat::Q4_0 { 2 } else { 4 }..][..16];
            for j in 0..16 {
                q[j] = (qs[j] & 0xF) as i32;
                q[j + 16] = (qs[j] >> 4) as i32;
            }
            if format == BlockFormat::Q4_0 {
                8
            } else {
                0
            }
        }
        BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            let (qh_at, qs_at) = if format == BlockFormat::Q5_0 {
                (layout::q5_0::QH, layout::q5_0::QS)
            } else {
                (layout::q5_1::QH, layout::q5_1::QS)
            };
            let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
            for j in 0..16 {
                q[j] = (b[qs_at + j] & 0xF) as i32 | ((((qh >> j) & 1) << 4) as i32);
                q[j + 16] = (b[qs_at + j] >> 4) as i32 | ((((qh >> (j + 16)) & 1) << 4) as i32);
            }
            if format == BlockFormat::Q5_0 {
                16
            } else {
                0
            }
        }
        _ => {
            let qs = if format == BlockFormat::Q8_0 {
                layout::q8_0::QS
            } else {
                layout::q8_1::QS
            };
            for (j, q) in q.iter_mut().enumerate() {
                *q = b[qs + j] as i8 as i32;
            }
            0
        }
    };
    (q, offset)
}

/// One K-format super-block against 256 quantized activations (with their 16-sums) of
/// scale `dx`: `(dx d) Σ_j sc_j (Σ_j q x) - (dx dmin) Σ_j m_j (Σ_j x)`.
fn superblock(format: BlockFormat, b: &[u8], x: &[i8], s16: &[i32], dx: f32) -> f32 {
    let q = unpack256(format, b);
    match format {
        BlockFormat::Q4_K | BlockFormat::Q5_K => {
            let scales = &b[layout::q4_k::SCALES..][..12];
            let (mut a, mut m) = (0i32, 0i32);
            for j in 0..8 {
                let (sc, mn) = k4_scale_min(scales, j);
                a += sc as i32 * idot(&q[32 * j..][..32], &x[32 * j..][..32]);
                m += mn as i32 * (s16[2 * j] + s16[2 * j + 1]);
            }
            (dx * read_f16(b, 0)) * a as f32 - (dx * read_f16(b, layout::q4_k::DMIN)) * m as f32
        }
        BlockFormat::Q6_K => {
            let sc = &b[layout::q6_k::SCALES..][..16];
            let mut a = 0i32;
            for j in 0..16 {
                let dot = idot(&q[16 * j..][..16], &x[16 * j..][..16]) - 32 * s16[j];
                a += sc[j] as i8 as i32 * dot;
            }
            (dx * read_f16(b, layout::q6_k::D)) * a as f32
        }
        BlockFormat::Q3_K => {
            let sc = q3_k_scales(&b[layout::q3_k::SCALES..][..12]);
            let mut a = 0i32;
            for j in 0..16 {
                let dot = idot(&q[16 * j..][..16], &x[16 * j..][..16]) - 4 * s16[j];
                a += sc[j] as i32 * dot;
            }
            (dx * read_f16(b, layout::q3_k::D)) * a as f32
        }
        BlockFormat::Q2_K => {
            let (mut a, mut m) = (0i32, 0i32);
            for j in 0..16 {
                let sc = b[j];
                a += (sc & 0xF) as i32 * idot(&q[16 * j..][..16], &x[16 * j..][..16]);
                m += (sc >> 4) as i32 * s16[j];
            }
            (dx * read_f16(b, layout::q2_k::D)) * a as f32
                - (dx * read_f16(b, layout::q2_k::DMIN)) * m as f32
        }
        _ => {
            // Q8_K as a weight: an f32 scale and 256 i8.
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (dx * d) * idot(&q, x) as f32
        }
    }
}

/// The 256 quants of a K super-block in element order: unsigned, offset by the format's
/// constant where it has one (Q6_K `q + 32`, Q3_K `q + 4`); Q8_K's signed.
pub(crate) fn unpack256(format: BlockFormat, b: &[u8]) -> [i32; 256] {
    let mut q = [0i32; 256];
    match format {
        BlockFormat::Q4_K | BlockFormat::Q5_K => {
            let five = format == BlockFormat::Q5_K;
            let qs_at = if five {
                layout::q5_k::QS
            } else {
                layout::q4_k::QS
            };
            for c in 0..4 {
                for l in 0..32 {
                    let byte = b[qs_at + 32 * c + l];
                    let (mut lo, mut hi) = ((byte & 0xF) as i32, (byte >> 4) as i32);
                    if five {
                        let qh = b[layout::q5_k::QH + l];
                        lo |= (((qh >> (2 * c)) & 1) as i32) << 4;
                        hi |= (((qh >> (2 * c + 1)) & 1) as i32) << 4;
                    }
                    q[64 * c + l] = lo;
                    q[64 * c + 32 + l] = hi;
                }
            }
        }
        BlockFormat::Q6_K => {
            for h in 0..2 {
                let ql = &b[64 * h..][..64];
                let qh = &b[layout::q6_k::QH + 32 * h..][..32];
                for l in 0..32 {
                    let o = 128 * h + l;
                    q[o] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32;
                    q[o + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32;
                    q[o + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
                    q[o + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
                }
            }
        }
        BlockFormat::Q3_K => {
            let hm = &b[..32];
            for h in 0..2 {
                let qs = &b[layout::q3_k::QS + 32 * h..][..32];
                for s in 0..4 {
                    for l in 0..32 {
                        let low = ((qs[l] >> (2 * s)) & 3) as i32;
                        let high = ((hm[l] >> (4 * h + s)) & 1) as i32;
                        q[128 * h + 32 * s + l] = low + 4 * high;
                    }
                }
            }
        }
        BlockFormat::Q2_K => {
            for h in 0..2 {
                let qs = &b[layout::q2_k::QS + 32 * h..][..32];
                for s in 0..4 {
                    for l in 0..32 {
                        q[128 * h + 32 * s + l] = ((qs[l] >> (2 * s)) & 3) as i32;
                    }
                }
            }
        }
        _ => {
            for (j, q) in q.iter_mut().enumerate() {
                *q = b[layout::q8_k::QS + j] as i8 as i32;
            }
        }
    }
    q
}
