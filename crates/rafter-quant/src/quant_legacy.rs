//! ggml's reference quantizers of the 32-element formats (`quantize_row_q4_0_ref` ..
//! `quantize_row_q8_1_ref` in ggml-quants.c), one block per call. Each mirrors the C
//! expression by expression; the C casts go through [`c_trunc_i32`] (see [`crate::fp`]).

use crate::fp::{c_trunc_i32, f32_to_f16, roundf};
use crate::layout;

/// The element of largest magnitude (the first one on ties), as ggml's `amax`/`max` loop.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `min`/`max` loop of the `_1` formats (from `FLT_MAX` / `-FLT_MAX`).
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn put_f16(y: &mut [u8], at: usize, v: f32) {
    y[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// `1/d`, or 0 when `d` is 0 (ggml's `d ? 1.0f/d : 0.0f`).
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// `(int8_t)v` then `MIN(max, ..)` as an int: the nibble ggml stores (low byte kept).
fn clamped_i8(v: f32, max: i32) -> u8 {
    (c_trunc_i32(v) as i8 as i32).min(max) as u8
}

pub(crate) fn q4_0(x: &[f32], y: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    put_f16(y, 0, d);
    for j in 0..16 {
        let xi0 = clamped_i8(x[j] * id + 8.5, 15);
        let xi1 = clamped_i8(x[16 + j] * id + 8.5, 15);
        y[layout::q4_0::QS + j] = xi0 | (xi1 << 4);
    }
}

pub(crate) fn q4_1(x: &[f32], y: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_f16(y, 0, d);
    put_f16(y, layout::q4_1::M, min);
    for j in 0..16 {
        let xi0 = clamped_i8((x[j] - min) * id + 0.5, 15);
        let xi1 = clamped_i8((x[16 + j] - min) * id + 0.5, 15);
        y[layout::q4_1::QS + j] = xi0 | (xi1 << 4);
    }
}

/// Stores 32 five-bit values: nibbles at `qs`, fifth bits as the u32 at `qh`.
fn put_q5(y: &mut [u8], qh_at: usize, qs_at: usize, q: impl Fn(usize) -> u8) {
    let mut qh = 0u32;
    for j in 0..16 {
        let (xi0, xi1) = (q(j), q(16 + j));
        y[qs_at + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= (((xi0 & 0x10) >> 4) as u32) << j;
        qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
    }
    y[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
}

pub(crate) fn q5_0(x: &[f32], y: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    put_f16(y, 0, d);
    put_q5(y, layout::q5_0::QH, layout::q5_0::QS, |j| {
        clamped_i8(x[j] * id + 16.5, 31)
    });
}

pub(crate) fn q5_1(x: &[f32], y: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_f16(y, 0, d);
    put_f16(y, layout::q5_1::M, min);
    // `(uint8_t)(x0 + 0.5f)`: no clamp in ggml.
    put_q5(y, layout::q5_1::QH, layout::q5_1::QS, |j| {
        c_trunc_i32((x[j] - min) * id + 0.5) as u8
    });
}

/// The Q8 scale of a block: `max |x| / 127`.
fn q8_scale(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        // MAX(amax, fabsf(v)) = amax > |v| ? amax : |v|
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    amax / 127.0
}

pub(crate) fn q8_0(x: &[f32], y: &mut [u8]) {
    let d = q8_scale(x);
    let id = inverse(d);
    put_f16(y, 0, d);
    for (q, &v) in y[layout::q8_0::QS..].iter_mut().zip(x) {
        *q = c_trunc_i32(roundf(v * id)) as u8;
    }
}

pub(crate) fn q8_1(x: &[f32], y: &mut [u8]) {
    let d = q8_scale(x);
    let id = inverse(d);
    put_f16(y, 0, d);
    let mut sum = 0i32;
    for (q, &v) in y[layout::q8_1::QS..].iter_mut().zip(x) {
        *q = c_trunc_i32(roundf(v * id)) as u8;
        sum += *q as i8 as i32;
    }
    put_f16(y, layout::q8_1::S, sum as f32 * d);
}
