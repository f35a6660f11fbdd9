//! ggml's scalar conversions and rounding, reproduced bit for bit.
//!
//! The quantizers must round exactly as ggml's C does, including in corner cases (ties,
//! denormal inputs whose reciprocal overflows, values that make a C cast out of range), so
//! these helpers spell out what ggml's code computes on x86-64 rather than what Rust's
//! `as` would do.

/// f16 bits to f32: exact for every non-NaN value (ggml's, numpy's and `half`'s
/// conversions agree there).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to f16 bits as ggml's `GGML_FP32_TO_FP16` computes them (`ggml_compute_fp32_to_fp16`
/// in ggml-impl.h, after Maratyszcza's FP16): round to nearest even, overflow to infinity,
/// every NaN to `0x7E00` with the input's sign.
pub fn f32_to_f16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5 * 2^23 and reading
/// the low mantissa bits. Exact for `|x| <= 4194303`; beyond that (ggml asserts only in
/// debug builds) it returns the same wrapped value ggml's release build computes.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// A C cast of a float to a 32-bit integer on x86-64 (`cvttss2si`): truncation toward
/// zero, and the "integer indefinite" `i32::MIN` for NaN and out-of-range values (where
/// Rust's `as` would saturate). ggml casts floats to `int8_t`/`uint8_t` through this and
/// keeps the low byte.
#[inline]
pub fn c_trunc_i32(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// C's `roundf`: round half away from zero.
#[inline]
pub fn roundf(x: f32) -> f32 {
    x.round()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_to_f16_matches_half_for_every_non_nan_pattern_sampled() {
        // Every 4099th f32 bit pattern (a prime stride, so all exponents and many
        // mantissas), plus the neighbourhoods of the f16 range's edges.
        let mut checked = 0u64;
        let mut bits = 0u32;
        loop {
            let f = f32::from_bits(bits);
            if !f.is_nan() {
                assert_eq!(
                    f32_to_f16(f),
                    half::f16::from_f32(f).to_bits(),
                    "{f:e} ({bits:#x})"
                );
                checked += 1;
            }
            match bits.checked_add(4099) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for f in [
            65504.0f32,
            65519.99,
            65520.0,
            6.1035156e-5,
            5.9604645e-8,
            2.9802322e-8,
            2.9802326e-8,
        ] {
            for s in [1.0, -1.0] {
                let f = f * s;
                assert_eq!(f32_to_f16(f), half::f16::from_f32(f).to_bits(), "{f:e}");
            }
        }
        assert!(checked > 1_000_000);
        assert_eq!(f32_to_f16(f32::NAN), 0x7E00);
        assert_eq!(f32_to_f16(-f32::NAN), 0xFE00);
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.4999998), -2);
        assert_eq!(nearest_int(4194303.0), 4194303);
        assert_eq!(nearest_int(-4194303.0), -4194303);
    }

    #[test]
    fn c_casts_and_roundf() {
        assert_eq!(c_trunc_i32(-1.9), -1);
        assert_eq!(c_trunc_i32(f32::NAN), i32::MIN);
        assert_eq!(c_trunc_i32(f32::INFINITY), i32::MIN);
        assert_eq!(c_trunc_i32(3e9), i32::MIN);
        assert_eq!(c_trunc_i32(-2_147_483_648.0), i32::MIN);
        assert_eq!(roundf(2.5), 3.0);
        assert_eq!(roundf(-2.5), -3.0);
        assert_eq!(roundf(0.49999997), 0.0);
    }
}
