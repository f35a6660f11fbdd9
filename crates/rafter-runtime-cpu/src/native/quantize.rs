//! Per-tensor `QuantizeLinear` (f32 → u8/i8) and `DequantizeLinear` (u8/i8 → f32) on
//! borrowed operands: the ops a QDQ-format model (ORT's `quantize_static`) has around every
//! convolution, and that QOperator models keep between their quantized ops.
//!
//! Numerics are the reference executor's (ONNX's, and ORT's MLAS): quantize divides in f32,
//! `round_half_even(x / scale) + zero_point` saturated to the output type (NaN gives the zero
//! point); dequantize computes `(x - zero_point) as f32 * scale`. Per-axis and blocked scales
//! are left to the reference path.

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op};

use super::qconv::{f32s, ints, range_of, round_half_even, Opnd, Q};
use super::{input_of, In, NativeKernel, Out};

struct QuantizeKernel {
    /// `true`: quantize (f32 in); `false`: dequantize (u8/i8 in, f32 out).
    quantize: bool,
    x: usize,
    scale: Opnd,
    zero_point: Option<Opnd>,
}

/// The kernel for a body that is one `quantize_linear` or `dequantize_linear` node.
pub(super) fn select(body: &Graph, _par: &super::Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let quantize = match node.op {
        Op::QuantizeLinear { block_size: 0, .. } => true,
        Op::DequantizeLinear { block_size: 0, .. } => false,
        _ => return None,
    };
    if body.outputs.len() != 1 || node.outputs.len() != 1 || node.inputs.len() > 3 {
        return None;
    }
    let x = if quantize {
        input_of(body, node.input(0), DType::F32)?
    } else {
        input_of(body, node.input(0), DType::U8)
            .or_else(|| input_of(body, node.input(0), DType::I8))?
    };
    let zero_point = match node.inputs.get(2).copied().flatten() {
        None => None,
        Some(v) => Some(Opnd::of(body, Some(v), Q)?),
    };
    Some(Arc::new(QuantizeKernel {
        quantize,
        x,
        scale: Opnd::of(body, node.input(1), &[DType::F32])?,
        zero_point,
    }))
}

impl NativeKernel for QuantizeKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let scale = f32s(self.scale.view(ins).bytes);
        // Without a zero point: 0, of the result's type (quantize) or none (dequantize).
        let (zps, zp_dtype): (Vec<i32>, DType) = match &self.zero_point {
            Some(zp) => {
                let zp = zp.view(ins);
                (ints(zp.dtype, zp.bytes).collect(), zp.dtype)
            }
            None => (vec![0], outs[0].dtype),
        };
        let x = &ins[self.x];
        if scale.len() != 1 || zps.len() != 1 || outs[0].dims != x.dims {
            return Ok(false);
        }
        let (s, z) = (scale[0], zps[0]);
        if self.quantize {
            if outs[0].dtype != zp_dtype || !Q.contains(&zp_dtype) {
                return Ok(false);
            }
            quantize(x.f32s()?, s, z, zp_dtype, outs[0].bytes_mut());
        } else {
            if outs[0].dtype != DType::F32 {
                return Ok(false);
            }
            let y = outs[0].f32s()?;
            for (d, v) in y.iter_mut().zip(ints(x.dtype, x.bytes())) {
                *d = (v - z) as f32 * s;
            }
        }
        Ok(true)
    }
}

/// `y = saturate(round_half_even(x / s) + z)` into u8 or i8 bytes.
fn quantize(x: &[f32], s: f32, z: i32, dtype: DType, y: &mut [u8]) {
    let (lo, hi) = range_of(dtype);
    // Clamping before rounding is the same as after: the bounds are integers and rounding
    // is monotone; it keeps the rounded value within the range the rounding trick needs.
    let (flo, fhi) = ((lo - z) as f32, (hi - z) as f32);
    for (d, &v) in y.iter_mut().zip(x) {
        let f = v / s;
        let f = if f.is_nan() { 0.0 } else { f.max(flo).min(fhi) };
        let q = round_half_even(f) as i32 + z;
        *d = q as u8; // i8 bytes: two's complement, the same low byte
    }
}

#[cfg(test)]
mod tests {
    use super::quantize;
    use rafter_ir::DType;

    /// Against the definition evaluated with `round_ties_even` and i64 saturation (the
    /// reference executor's), over ties, saturation and NaN.
    #[test]
    fn quantize_matches_the_definition() {
        let x = [
            -1e9f32,
            -300.0,
            -128.5,
            -127.5,
            -0.5,
            0.0,
            0.5,
            1.5,
            2.5,
            126.5,
            127.5,
            254.5,
            255.5,
            1e9,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.3,
            -0.7,
        ];
        for (dtype, zps) in [(DType::U8, [0, 128, 255]), (DType::I8, [-128, 0, 127])] {
            let (lo, hi) = match dtype {
                DType::U8 => (0i64, 255i64),
                _ => (-128, 127),
            };
            for z in zps {
                for s in [1.0f32, 0.5, 0.1, 3.0] {
                    let mut y = vec![0u8; x.len()];
                    quantize(&x, s, z, dtype, &mut y);
                    for (&v, &got) in x.iter().zip(&y) {
                        let r = (v / s).round_ties_even();
                        let r = if r.is_nan() { 0 } else { r as i64 };
                        let want = r.saturating_add(z as i64).clamp(lo, hi);
                        let got = match dtype {
                            DType::U8 => got as i64,
                            _ => got as i8 as i64,
                        };
                        assert_eq!(got, want, "x {v} s {s} zp {z} {dtype}");
                    }
                }
            }
        }
    }
}
