//! One block to f32, per format, with ggml's float expressions in ggml's order (which is
//! also gguf-py's), so results are bit-exact: products of f32 values never fused.

use crate::layout::{self, k4_scale_min, q3_k_scales, read_f16};
use crate::BlockFormat;

/// Dequantizes one block `b` (`format.block_bytes()` long) into `y` (`block_elems()`).
pub(crate) fn block(format: BlockFormat, b: &[u8], y: &mut [f32]) {
    match format {
        BlockFormat::Q4_0 => q4_0(b, y),
        BlockFormat::Q4_1 => q4_1(b, y),
        BlockFormat::Q5_0 => q5_0(b, y),
        BlockFormat::Q5_1 => q5_1(b, y),
        BlockFormat::Q8_0 => q8(b, layout::q8_0::QS, y),
        BlockFormat::Q8_1 => q8(b, layout::q8_1::QS, y),
        BlockFormat::Q2_K => q2_k(b, y),
        BlockFormat::Q3_K => q3_k(b, y),
        BlockFormat::Q4_K => q4_k(b, y),
        BlockFormat::Q5_K => q5_k(b, y),
        BlockFormat::Q6_K => q6_k(b, y),
        BlockFormat::Q8_K => q8_k(b, y),
    }
}

/// `(q - 8) * d`.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[layout::q4_0::QS..][..16];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// `q * d + m`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (read_f16(b, 0), read_f16(b, layout::q4_1::M));
    let qs = &b[layout::q4_1::QS..][..16];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = (q & 0xF) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The 5-bit quants of a Q5 block: nibbles plus bit `j` of `qh` as bit 4 of element `j`.
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &byte) in qs[..16].iter().enumerate() {
        q[j] = (byte & 0xF) | ((((qh >> j) << 4) & 0x10) as u8);
        q[j + 16] = (byte >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    q
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `(q - 16) * d`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let q = q5_values(read_u32(b, layout::q5_0::QH), &b[layout::q5_0::QS..]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = (q as i32 - 16) as f32 * d;
    }
}

/// `q * d + m`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (read_f16(b, 0), read_f16(b, layout::q5_1::M));
    let q = q5_values(read_u32(b, layout::q5_1::QH), &b[layout::q5_1::QS..]);
    for (y, &q) in y.iter_mut().zip(&q) {
        *y = q as f32 * d + m;
    }
}

/// `q * d` (Q8_0 and Q8_1, whose quants start at `qs`).
fn q8(b: &[u8], qs: usize, y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[qs..qs + 32]) {
        *y = q as i8 as f32 * d;
    }
}

/// Sub-block `j` of 16 (128-element halves, 4 shifts, 2 runs of 16):
/// `(d * sc) * q - dmin * m`.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (
        read_f16(b, layout::q2_k::D),
        read_f16(b, layout::q2_k::DMIN),
    );
    let scales = &b[..16];
    let qs = &b[layout::q2_k::QS..][..64];
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[32 * half..][..32];
        for shift in [0, 2, 4, 6] {
            for run in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let out = &mut y[128 * half + 32 * (shift / 2) + 16 * run..][..16];
                for (l, o) in out.iter_mut().enumerate() {
                    *o = dl * ((q[16 * run + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// `(d * (sc - 32)) * (q - 4 * !hbit)`.
fn q3_k(b: &[u8], y: &mut [f32]) {
    let d_all = read_f16(b, layout::q3_k::D);
    let scales = q3_k_scales(&b[layout::q3_k::SCALES..][..12]);
    let hm = &b[..32];
    let qs = &b[layout::q3_k::QS..][..64];
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[32 * half..][..32];
        for shift in [0, 2, 4, 6] {
            for run in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                let out = &mut y[128 * half + 32 * (shift / 2) + 16 * run..][..16];
                for (l, o) in out.iter_mut().enumerate() {
                    let low = ((q[16 * run + l] >> shift) & 3) as i32;
                    let high = if hm[16 * run + l] & m != 0 { 0 } else { 4 };
                    *o = dl * (low - high) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// `(d * sc) * q - dmin * m` per 32-element sub-block.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (read_f16(b, 0), read_f16(b, layout::q4_k::DMIN));
    let scales = &b[layout::q4_k::SCALES..][..12];
    let qs = &b[layout::q4_k::QS..][..128];
    for c in 0..4 {
        let (sc1, m1) = k4_scale_min(scales, 2 * c);
        let (sc2, m2) = k4_scale_min(scales, 2 * c + 1);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &qs[32 * c..][..32];
        let (lo, hi) = y[64 * c..][..64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * (q[l] & 0xF) as f32 - m1;
            hi[l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// As Q4_K with a fifth bit from `qh` (bits `2c` and `2c + 1` for chunk `c`).
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (read_f16(b, 0), read_f16(b, layout::q5_k::DMIN));
    let scales = &b[layout::q5_k::SCALES..][..12];
    let qh = &b[layout::q5_k::QH..][..32];
    let qs = &b[layout::q5_k::QS..][..128];
    for c in 0..4 {
        let (sc1, m1) = k4_scale_min(scales, 2 * c);
        let (sc2, m2) = k4_scale_min(scales, 2 * c + 1);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let q = &qs[32 * c..][..32];
        let (lo, hi) = y[64 * c..][..64].split_at_mut(32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            lo[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
            hi[l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `(d * sc) * (q - 32)` per 16-element sub-block.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, layout::q6_k::D);
    for half in 0..2 {
        let ql = &b[64 * half..][..64];
        let qh = &b[layout::q6_k::QH + 32 * half..][..32];
        let sc = &b[layout::q6_k::SCALES + 8 * half..][..8];
        let y = &mut y[128 * half..][..128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// `d * q` with an f32 `d`.
fn q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[layout::q8_k::QS..][..256]) {
        *y = d * q as i8 as f32;
    }
}
