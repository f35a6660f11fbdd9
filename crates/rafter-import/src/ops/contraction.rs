//! Contractions: MatMul, Gemm, convolutions, Einsum, the integer and quantize ops,
//! Attention and RotaryEmbedding.

use super::registry::OnnxOp;
use super::{lenient_axis, non_empty_or, trim, Tr, R};
use crate::convert::dtype_from_onnx;
use crate::node::NodeView;
use rafter_ir::{DType, Op};

/// The contraction ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("MatMul", |t| {
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(Op::MatMul, ins)
    }),
    OnnxOp::new("Gemm", |t| {
        let n = t.n;
        if n.opset < 7 {
            // Gemm-1/6 broadcast C only with `broadcast=1` (else C is [M, N]); the
            // IR's unidirectional broadcast of C covers both.
            n.flag("broadcast", false)?;
        }
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), t.inp(2)?];
        t.finish(
            Op::Gemm {
                alpha: n.f("alpha", 1.0)?,
                beta: n.f("beta", 1.0)?,
                trans_a: n.flag("transA", false)?,
                trans_b: n.flag("transB", false)?,
            },
            ins,
        )
    }),
    OnnxOp::new("Conv", conv),
    OnnxOp::new("ConvTranspose", |t| {
        let n = t.n;
        let (x, w) = (t.req(0)?, t.req(1)?);
        let c = t.conv_params(x, Some(w), true)?;
        let sp = t.rank(x).saturating_sub(2);
        let output_padding = non_empty_or(n.ints("output_padding")?, vec![0; sp]);
        let output_shape = n.ints("output_shape")?.unwrap_or_default();
        let ins = vec![Some(x), Some(w), t.inp(2)?];
        t.finish(
            Op::ConvTranspose {
                kernel_shape: c.kernel,
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                group: n.i("group", 1)?,
                auto_pad: c.auto_pad,
                output_padding,
                output_shape,
            },
            trim(ins),
        )
    }),
    OnnxOp::new("Einsum", |t| {
        let n = t.n;
        let equation = n
            .s_opt("equation")?
            .ok_or_else(|| n.invalid("missing required attribute `equation`"))?;
        let ins = t.all_inputs()?;
        t.finish(Op::Einsum { equation }, ins)
    }),
    OnnxOp::new("MatMulInteger", |t| {
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), t.inp(2)?, t.inp(3)?];
        t.finish(Op::MatMulInteger, trim(ins))
    }),
    OnnxOp::new("ConvInteger", conv),
    OnnxOp::new("QuantizeLinear", |t| {
        let n = t.n;
        let (x, scale, zp) = (t.req(0)?, t.req(1)?, t.inp(2)?);
        let axis = lenient_axis(n.i("axis", 1)?, t.rank(x));
        let od = n.i("output_dtype", 0)?;
        let output_dtype = if od != 0 {
            dtype_from_onnx(od as i32).map_err(|e| n.unsupported(format!("unsupported: {e}")))?
        } else if let Some(zp) = zp {
            t.dtype(zp)
        } else {
            DType::U8
        };
        t.finish(
            Op::QuantizeLinear {
                axis,
                block_size: n.i("block_size", 0)?,
                output_dtype,
            },
            trim(vec![Some(x), Some(scale), zp]),
        )
    })
    .checked(check_quantize),
    OnnxOp::new("DequantizeLinear", |t| {
        let n = t.n;
        let (x, scale, zp) = (t.req(0)?, t.req(1)?, t.inp(2)?);
        let axis = lenient_axis(n.i("axis", 1)?, t.rank(x));
        t.finish(
            Op::DequantizeLinear {
                axis,
                block_size: n.i("block_size", 0)?,
            },
            trim(vec![Some(x), Some(scale), zp]),
        )
    }),
    OnnxOp::new("DynamicQuantizeLinear", |t| {
        let x = t.req(0)?;
        t.finish(Op::DynamicQuantizeLinear, vec![Some(x)])
    }),
    OnnxOp::new("Attention", |t| {
        let n = t.n;
        let ins = t.all_inputs()?;
        if ins.len() < 3 || ins[..3].iter().any(Option::is_none) {
            return Err(n.invalid("Q, K and V are required"));
        }
        t.finish(
            Op::Attention {
                is_causal: n.flag("is_causal", false)?,
                kv_num_heads: n.i("kv_num_heads", 0)?,
                q_num_heads: n.i("q_num_heads", 0)?,
                qk_matmul_output_mode: n.i("qk_matmul_output_mode", 0)?,
                scale: n.f_opt("scale")?,
                softcap: n.f("softcap", 0.0)?,
                left_window_size: n.i("left_window_size", -1)?,
                right_window_size: n.i("right_window_size", -1)?,
            },
            trim(ins),
        )
    }),
    OnnxOp::new("RotaryEmbedding", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), Some(t.req(2)?), t.inp(3)?];
        t.finish(
            Op::RotaryEmbedding {
                interleaved: n.flag("interleaved", false)?,
                num_heads: n.i("num_heads", 0)?,
                rotary_embedding_dim: n.i("rotary_embedding_dim", 0)?,
            },
            trim(ins),
        )
    }),
];

/// QuantizeLinear's `output_dtype`, when given, is an element type the IR has.
fn check_quantize(n: &NodeView<'_>) -> Result<(), String> {
    if let Some(d) = n.attr("output_dtype").map(|a| a.i).filter(|&d| d != 0) {
        dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: output {e}"))?;
    }
    Ok(())
}

/// `Conv` and `ConvInteger` (same attributes, different IR ops).
fn conv(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let (x, w) = (t.req(0)?, t.req(1)?);
    let c = t.conv_params(x, Some(w), true)?;
    let op = if op == "Conv" {
        Op::Conv {
            kernel_shape: c.kernel,
            strides: c.strides,
            pads: c.pads,
            dilations: c.dilations,
            group: n.i("group", 1)?,
            auto_pad: c.auto_pad,
        }
    } else {
        Op::ConvInteger {
            kernel_shape: c.kernel,
            strides: c.strides,
            pads: c.pads,
            dilations: c.dilations,
            group: n.i("group", 1)?,
            auto_pad: c.auto_pad,
        }
    };
    let ins = vec![Some(x), Some(w), t.inp(2)?, t.inp(3)?];
    t.finish(op, trim(ins))
}
