//! Per-tensor `QuantizeLinear` (f32 → u8/i8) and `DequantizeLinear` (u8/i8 → f32) on
//! borrowed operands: the ops a QDQ-format model (ORT's `quantize_static`) has around every
//! convolution, and that QOperator models keep between their quantized ops.
//!
//! Numerics are the reference executor's (ONNX's, and ORT's MLAS): quantize divides in f32,
//! `round_half_even(x / scale) + zero_point` saturated to the output type (NaN gives the zero
//! point); dequantize computes `(x - zero_point) as f32 * scale`. Per-axis and blocked scales
//! are left to the reference path.
//!
//! `DynamicQuantizeLinear` (ORT's `quantize_dynamic` models quantize every MatMul's
//! activations with it) derives a u8 scale and zero point from the tensor's range and
//! quantizes with them, as [`dynamic_quantize`] documents.

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

/// The kernel for a body that is one `quantize_linear`, `dequantize_linear` or
/// `dynamic_quantize_linear` node.
pub(super) fn select(body: &Graph, _par: &super::Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    if node.op == Op::DynamicQuantizeLinear {
        let x = input_of(body, node.input(0), DType::F32)?;
        let ok = body.outputs.len() == 3 && node.outputs.len() == 3 && node.inputs.len() == 1;
        return ok.then(|| Arc::new(DynamicQuantizeKernel { x }) as Arc<dyn NativeKernel>);
    }
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

/// ONNX `DynamicQuantizeLinear` (f32 → u8 with the scale and zero point it derives).
struct DynamicQuantizeKernel {
    x: usize,
}

impl NativeKernel for DynamicQuantizeKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let [y, scale, zp] = outs else {
            return Ok(false);
        };
        if y.dtype != DType::U8
            || y.dims != x.dims
            || scale.dtype != DType::F32
            || zp.dtype != DType::U8
            || !scale.dims.is_empty()
            || !zp.dims.is_empty()
        {
            return Ok(false);
        }
        let (s, z) = dynamic_quantize(x.f32s()?, y.bytes_mut());
        scale.bytes_mut().copy_from_slice(&s.to_le_bytes());
        zp.bytes_mut()[0] = z;
        Ok(true)
    }
}

/// ONNX `DynamicQuantizeLinear` into `y`; returns the scale and zero point. As the
/// reference executor computes it: the range `[min(0, min x), max(0, max x)]` (NaNs
/// ignored), `scale = range / 255` (1/255 for an all-zero range), `zp = round_half_even(
/// clamp(-min / scale, 0, 255))`, `y = clamp(round_half_even(x / scale) + zp, 0, 255)`, a
/// NaN giving 0.
fn dynamic_quantize(x: &[f32], y: &mut [u8]) -> (f32, u8) {
    let (mut lo, mut hi) = (0f32, 0f32);
    for &v in x {
        // Comparisons are false for NaN, which so leaves the range as it is.
        if v > hi {
            hi = v;
        }
        if v < lo {
            lo = v;
        }
    }
    let scale = if hi == lo { 1.0 } else { hi - lo } / 255.0;
    let zp = round_half_even((0.0 - lo / scale).clamp(0.0, 255.0));
    // Clamping before rounding equals clamping after (integer bounds, monotone rounding).
    let (flo, fhi) = (-zp, 255.0 - zp);
    for (d, &v) in y.iter_mut().zip(x) {
        let f = v / scale;
        *d = if f.is_nan() {
            0
        } else {
            (round_half_even(f.max(flo).min(fhi)) + zp) as u8
        };
    }
    (scale, zp as u8)
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

#[cfg(test)]
mod dynamic_tests {
    use super::dynamic_quantize;

    /// Against ONNX's definition evaluated in f64 where f32 is not needed (the scale and
    /// quotient are f32 operations in the definition, as in ORT and the reference).
    fn definition(x: &[f32]) -> (Vec<u8>, f32, u8) {
        let hi = x
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(0f32, f32::max);
        let lo = x
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(0f32, f32::min);
        let scale = if hi == lo { 1.0 } else { hi - lo } / 255.0;
        let zp = (-lo / scale).clamp(0.0, 255.0).round_ties_even();
        let y = x
            .iter()
            .map(|&v| {
                let q = (v / scale).round_ties_even() as f64 + zp as f64;
                if q.is_nan() {
                    0
                } else {
                    q.clamp(0.0, 255.0) as u8
                }
            })
            .collect();
        (y, scale, zp as u8)
    }

    #[test]
    fn dynamic_quantize_matches_the_definition() {
        let cases: Vec<Vec<f32>> = vec![
            vec![0.0, 2.0, -3.0, 1000.0, -1000.0, 0.5],
            vec![1.0, 2.5, 3.0, 255.0],
            vec![-1.0, -2.5, -3.0],
            vec![0.0; 5],
            vec![1.5, f32::NAN, -0.25, 0.7],
            vec![f32::INFINITY, 1.0],
            (0..97)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
                .collect(),
        ];
        for x in cases {
            let mut y = vec![0u8; x.len()];
            let (s, z) = dynamic_quantize(&x, &mut y);
            let (wy, ws, wz) = definition(&x);
            assert_eq!((y, s.to_bits(), z), (wy, ws.to_bits(), wz), "x {x:?}");
        }
        // ONNX's own example (test_dynamicquantizelinear): scale 0.0196078, zp 153.
        let x = [0.0f32, 2.0, -3.0, -2.5, 1.34, 0.5];
        let mut y = [0u8; 6];
        let (s, z) = dynamic_quantize(&x, &mut y);
        assert_eq!((y, z), ([153, 255, 0, 26, 221, 179], 153));
        assert!((s - 0.019_607_844).abs() < 1e-9);
    }
}
