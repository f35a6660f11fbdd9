//! ONNX Runtime's quantized (QLinear / QGemm) contrib ops that the static quantizer
//! (`quantize_static`, QOperator format) and ORT's own int8 graph rewrites emit, decomposed
//! at import with the rounding order of ORT's CPU kernels (MLAS):
//!
//! - `QGemm`: `matmul_integer` (+ the int32 bias C), scaled by `alpha * a_scale * b_scale`
//!   (`/ y_scale` when the output is quantized), then rounded half to even and offset by
//!   `y_zero_point` (MLAS's requantize: the zero point is added after rounding).
//! - `QLinearConcat`: each input dequantized, concatenated, quantized with Y's parameters
//!   (ORT requantizes each input through a lookup table of exactly that function).
//! - `QLinearAveragePool`: dequantize, average pool in f32, quantize (ORT's kernel).
//! - `QLinearGlobalAveragePool`: the zero-point-free integer sums over the image times
//!   `x_scale / (y_scale * image_size)`, rounded, plus `y_zero_point` (MLAS).
//! - `QLinearSoftmax`: dequantize, softmax, times `floor(1 / y_scale)` (ORT's kernel
//!   scales by that integer, not by `1 / y_scale`), rounded, plus `y_zero_point`.
//!
//! `channels_last` pools transpose to channels-first and back around the pool.

use super::registry::OnnxOp;
use super::{Tr, R};
use crate::node::NodeView;
use rafter_ir::{BinaryOp, DType, Op, PoolKind, ReduceKind, SoftmaxKind, UnaryOp, ValueId};

/// The QLinear / QGemm contrib ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("QGemm", qgemm).checked(check_qgemm),
    OnnxOp::new("QLinearConcat", qlinear_concat),
    OnnxOp::new("QLinearAveragePool", qlinear_average_pool),
    OnnxOp::new("QLinearGlobalAveragePool", qlinear_global_average_pool),
    OnnxOp::new("QLinearSoftmax", qlinear_softmax),
];

/// QGemm with `y_scale` needs `y_zero_point` (its type is the output's).
fn check_qgemm(n: &NodeView<'_>) -> Result<(), String> {
    if n.input_name(7).is_some() && n.input_name(8).is_none() {
        return Err("unsupported: y_scale without y_zero_point".into());
    }
    Ok(())
}

/// `QGemm` (A, a_scale, a_zp, B, b_scale, b_zp, C?, y_scale?, y_zp?): `alpha * op(A) @
/// op(B)` in integers (C, int32, added to the accumulator), float output unless `y_scale`.
fn qgemm(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let (mut a, a_scale, a_zp) = (t.req(0)?, t.req(1)?, t.inp(2)?);
    let (mut b, b_scale, b_zp) = (t.req(3)?, t.req(4)?, t.inp(5)?);
    let (c, y_scale, y_zp) = (t.inp(6)?, t.inp(7)?, t.inp(8)?);
    if n.flag("transA", false)? {
        a = t.transpose_last2("a_t", a)?;
    }
    if n.flag("transB", false)? {
        b = t.transpose_last2("b_t", b)?;
    }
    let alpha = n.f("alpha", 1.0)?;
    let a_zp = match (a_zp, b_zp) {
        (None, Some(_)) => Some(t.zero_like("a_zero", a)?),
        _ => a_zp,
    };
    let ins = super::trim(vec![Some(a), Some(b), a_zp, b_zp]);
    let mut acc = t.tmp("matmul_integer", Op::MatMulInteger, ins)?;
    if let Some(c) = c {
        acc = t.bin("bias", BinaryOp::Add, acc, c)?;
    }
    // ORT's order: (alpha * a_scale) * b_scale, then / y_scale.
    let alpha = t.scalar("alpha", alpha as f64, DType::F32)?;
    let s = t.bin("alpha_a_scale", BinaryOp::Mul, alpha, a_scale)?;
    let mut scale = t.bin("scale", BinaryOp::Mul, s, b_scale)?;
    if let Some(ys) = y_scale {
        scale = t.bin("requant_scale", BinaryOp::Div, scale, ys)?;
    }
    let f = t.tmp("to_float", Op::Cast { to: DType::F32 }, vec![Some(acc)])?;
    let Some(y_zp) = y_zp.filter(|_| y_scale.is_some()) else {
        return t.finish(Op::Binary { op: BinaryOp::Mul }, vec![Some(f), Some(scale)]);
    };
    let y = t.bin("scaled", BinaryOp::Mul, f, scale)?;
    t.round_plus_zero_point(y, y_zp)
}

/// `QLinearConcat` (Y_scale, Y_zp, then X, X_scale, X_zp per input), attribute `axis`.
fn qlinear_concat(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let count = n.num_inputs();
    if count < 5 || (count - 2) % 3 != 0 {
        return Err(n.invalid(format!(
            "{count} inputs; want Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point)"
        )));
    }
    let mut parts = Vec::new();
    for (k, i) in (2..count).step_by(3).enumerate() {
        parts.push(Some(t.dequant_operand(&format!("x{k}"), i)?));
    }
    let rank = t.rank(parts[0].expect("dequantized"));
    let axis = t.axis(n.i_req("axis")?, rank)?;
    let y = t.tmp("concat", Op::Concat { axis }, parts)?;
    let like = t.req(2)?;
    t.requantize(y, 0, like)
}

/// `QLinearAveragePool` (X, x_scale, x_zp, y_scale, y_zp) with AveragePool's attributes
/// and `channels_last`.
fn qlinear_average_pool(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let channels_last = n.flag("channels_last", false)?;
    let x = t.dequant_operand("x", 0)?;
    let x = if channels_last {
        t.as_channels_first("x_nchw", x)?
    } else {
        x
    };
    let mut c = t.conv_params(x, None, false)?;
    let count_include_pad = n.flag("count_include_pad", false)?;
    let ceil_mode = n.flag("ceil_mode", false)?;
    let x = if count_include_pad {
        t.pad_for_full_windows(x, &mut c, ceil_mode)?
    } else {
        x
    };
    let pool = Op::Pool {
        kind: PoolKind::Average,
        kernel_shape: c.kernel,
        strides: c.strides,
        pads: c.pads,
        dilations: c.dilations,
        auto_pad: c.auto_pad,
        ceil_mode: ceil_mode && !count_include_pad,
        count_include_pad,
        p: 0,
        storage_order: 0,
    };
    let mut y = t.tmp("pool", pool, vec![Some(x)])?;
    if channels_last {
        y = t.as_channels_last("y_nhwc", y)?;
    }
    let like = t.req(0)?;
    t.requantize(y, 3, like)
}

/// `QLinearGlobalAveragePool` (X, x_scale, x_zp, y_scale, y_zp), `channels_last`: as
/// MLAS, `round((sum(x) - x_zp * size) * (x_scale / (y_scale * size))) + y_zp`.
fn qlinear_global_average_pool(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let channels_last = n.flag("channels_last", false)?;
    let x = t.req(0)?;
    let rank = t.rank(x);
    if rank < 3 {
        return Err(n.invalid(format!("X has rank {rank}; want N, C and spatial dims")));
    }
    let spatial: Vec<i64> = if channels_last {
        (1..rank as i64 - 1).collect()
    } else {
        (2..rank as i64).collect()
    };
    let dims = &t.ty(x).dims;
    let size: Option<i64> = spatial
        .iter()
        .map(|&a| dims[a as usize].as_known())
        .product::<Option<i64>>();
    let Some(size) = size.filter(|&s| s > 0) else {
        return Err(n.unsupported(format!(
            "unsupported: X {} has spatial dims not known at import",
            t.ty(x)
        )));
    };
    let centred = t.centred("x", 0)?;
    let sum = t.tmp(
        "sum",
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: spatial,
            keep_dims: true,
            noop_with_empty_axes: false,
        },
        vec![Some(centred)],
    )?;
    let (xs, ys) = (t.req(1)?, t.req(3)?);
    let count = t.scalar("size", size as f64, DType::F32)?;
    let denom = t.bin("y_scale_size", BinaryOp::Mul, ys, count)?;
    let ratio = t.bin("ratio", BinaryOp::Div, xs, denom)?;
    let y = t.bin("scaled", BinaryOp::Mul, sum, ratio)?;
    match t.inp(4)? {
        Some(z) => t.round_plus_zero_point(y, z),
        None => {
            let one = t.scalar("one", 1.0, DType::F32)?;
            let q = Op::QuantizeLinear {
                axis: 1,
                block_size: 0,
                output_dtype: t.dtype(x),
            };
            t.finish(q, vec![Some(y), Some(one)])
        }
    }
}

/// `QLinearSoftmax` (X, X_scale, x_zp, y_scale, y_zp), attribute `axis` (opset-13
/// meaning when `opset >= 13`, else the 2-D coercion is refused unless axis is last).
fn qlinear_softmax(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let x = t.req(0)?;
    let rank = t.rank(x);
    let axis = t.axis(n.i("axis", -1)?, rank)?;
    let opset = n.i("opset", 13)?;
    if opset < 13 && axis != rank as i64 - 1 {
        return Err(n.unsupported(format!(
            "unsupported: opset {opset} softmax over axes {axis}.. (only the last axis)"
        )));
    }
    let xf = t.dequant_operand("x", 0)?;
    let kind = SoftmaxKind::Softmax;
    let p = t.tmp("softmax", Op::Softmax { kind, axis }, vec![Some(xf)])?;
    // ORT multiplies by floor(1 / y_scale) (its lookup-table kernel's integer scale).
    let one = t.scalar("one_f", 1.0, DType::F32)?;
    let y_scale = t.req(3)?;
    let inv = t.bin("inv_y_scale", BinaryOp::Div, one, y_scale)?;
    let inv = t.un("floor_inv_y_scale", UnaryOp::Floor, inv)?;
    let y = t.bin("scaled", BinaryOp::Mul, p, inv)?;
    match t.inp(4)? {
        Some(z) => t.round_plus_zero_point(y, z),
        None => {
            let z = t.zero_like("y_zero", x)?;
            t.round_plus_zero_point(y, z)
        }
    }
}

impl Tr<'_, '_, '_> {
    /// ORT's QLinearAveragePool with `count_include_pad` divides every window by the
    /// kernel size, also the windows `ceil_mode` adds past the end padding (ONNX's
    /// AveragePool counts only the padding there). So `x` (`[N, C, spatial...]`) is
    /// padded with zeros to hold every window whole, and the pool then has no padding.
    fn pad_for_full_windows(
        &mut self,
        x: ValueId,
        c: &mut super::ConvParams,
        ceil_mode: bool,
    ) -> R<ValueId> {
        let n = self.n;
        if c.auto_pad != rafter_ir::AutoPad::NotSet {
            return Err(n.unsupported("unsupported: count_include_pad with auto_pad"));
        }
        let dims = &self.ty(x).dims;
        let sp = c.kernel.len();
        let (mut begins, mut ends) = (vec![0i64; 2], vec![0i64; 2]);
        for i in 0..sp {
            let Some(size) = dims.get(2 + i).and_then(|d| d.as_known()) else {
                return Err(n.unsupported(format!(
                    "unsupported: count_include_pad with X {} not known at import",
                    self.ty(x)
                )));
            };
            let (k, s) = (c.kernel[i], c.strides[i]);
            let (pb, pe) = (c.pads[i], c.pads[sp + i]);
            let span = size + pb + pe - k;
            let mut out = if ceil_mode {
                (span + s - 1) / s + 1
            } else {
                span / s + 1
            };
            // As ORT: no window may start in the end padding.
            if ceil_mode && (out - 1) * s >= size + pb {
                out -= 1;
            }
            begins.push(pb);
            ends.push(((out - 1) * s + k - size - pb).max(0));
        }
        let pads = self.i64_const("full_window_pads", &[begins, ends].concat());
        let mode = rafter_ir::PadMode::Constant;
        let y = self.tmp("full_windows", Op::Pad { mode }, vec![Some(x), Some(pads)])?;
        c.pads = vec![0; 2 * sp];
        Ok(y)
    }

    /// The node's output: `y` rounded half to even, plus zero point `z` (saturated to z's
    /// type), as MLAS's requantize does.
    pub(super) fn round_plus_zero_point(&mut self, y: ValueId, z: ValueId) -> R {
        let one = self.scalar("one", 1.0, DType::F32)?;
        let q = Op::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: self.dtype(z),
        };
        self.finish(q, vec![Some(y), Some(one), Some(z)])
    }

    /// A scalar zero of `like`'s element type.
    pub(super) fn zero_like(&mut self, suffix: &str, like: ValueId) -> R<ValueId> {
        let dt = self.dtype(like);
        let z = rafter_ir::ConstData::new(dt, vec![], vec![0u8; dt.size_of()].into())
            .map_err(|e| self.n.invalid(e.to_string()))?;
        Ok(self.konst(suffix, z))
    }

    /// `[N, spatial..., C]` to `[N, C, spatial...]`.
    pub(super) fn as_channels_first(&mut self, suffix: &str, x: ValueId) -> R<ValueId> {
        let r = self.rank(x) as i64;
        let perm: Vec<i64> = [0, r - 1].into_iter().chain(1..r - 1).collect();
        self.tmp(suffix, Op::Transpose { perm }, vec![Some(x)])
    }

    /// `[N, C, spatial...]` to `[N, spatial..., C]`.
    pub(super) fn as_channels_last(&mut self, suffix: &str, x: ValueId) -> R<ValueId> {
        let r = self.rank(x) as i64;
        let perm: Vec<i64> = [0].into_iter().chain(2..r).chain([1]).collect();
        self.tmp(suffix, Op::Transpose { perm }, vec![Some(x)])
    }
}
