//! Translation of the signal-processing ops (DFT, STFT, windows, MelWeightMatrix), RoiAlign,
//! DeformConv, QLinearMatMul/QLinearConv, LinearAttention, CausalConvWithState and BitCast.

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::convert::{dtype_from_onnx, norm_axis};
use crate::node::NodeView;
use rafter_ir::{DType, LinearAttnRule, Op, RoiPoolMode, WindowKind};

/// The signal-processing, detection, quantized and stateful sequence ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("DFT", |t| t.dft()),
    OnnxOp::new("STFT", |t| t.stft()),
    OnnxOp::new("HannWindow", |t| t.window()).checked(check_output_datatype),
    OnnxOp::new("HammingWindow", |t| t.window()).checked(check_output_datatype),
    OnnxOp::new("BlackmanWindow", |t| t.window()).checked(check_output_datatype),
    OnnxOp::new("MelWeightMatrix", |t| t.mel_weight_matrix()).checked(check_output_datatype),
    OnnxOp::new("RoiAlign", |t| t.roi_align()),
    OnnxOp::new("DeformConv", |t| t.deform_conv()),
    OnnxOp::new("QLinearMatMul", |t| t.qlinear_matmul()),
    OnnxOp::new("QLinearConv", |t| t.qlinear_conv()),
    OnnxOp::new("LinearAttention", |t| t.linear_attention()),
    OnnxOp::new("CausalConvWithState", |t| t.causal_conv_with_state()),
    OnnxOp::new("BitCast", |t| t.bit_cast()).checked(check_bit_cast),
];

/// A dtype attribute, when given, names an element type the IR has.
fn check_dtype_attr(n: &NodeView<'_>, name: &str, what: &str) -> Result<(), String> {
    if let Some(d) = n.attr(name).map(|a| a.i) {
        dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: {what}{e}"))?;
    }
    Ok(())
}

/// BitCast's `to`.
fn check_bit_cast(n: &NodeView<'_>) -> Result<(), String> {
    check_dtype_attr(n, "to", "to: ")
}

/// A window's or mel matrix's `output_datatype`.
fn check_output_datatype(n: &NodeView<'_>) -> Result<(), String> {
    check_dtype_attr(n, "output_datatype", "")
}

impl Tr<'_, '_, '_> {
    /// A dtype attribute (`output_datatype`, `to`), unsupported when not an IR dtype.
    fn dtype_attr(&self, name: &str, default: Option<i64>) -> R<DType> {
        let n = self.n;
        let code = match default {
            Some(d) => n.i(name, d)?,
            None => n.i_req(name)?,
        };
        dtype_from_onnx(code as i32).map_err(|e| n.unsupported(format!("unsupported: {name}: {e}")))
    }

    pub(super) fn dft(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let rank = self.rank(x);
        let len = self.inp(1)?;
        let inverse = n.flag("inverse", false)?;
        let onesided = n.flag("onesided", false)?;
        let norm = |a: i64| norm_axis(a, rank).map_err(|e| n.invalid(e));
        let (axis, axis_in) = if n.opset < 20 {
            (Some(norm(n.i("axis", 1)?)?), None)
        } else {
            match self.inp(2)? {
                None => (Some(norm(-2)?), None),
                Some(a) => match self.sc.known_i64s(a).as_deref() {
                    Some(&[v]) => (Some(norm(v)?), None),
                    Some(v) => return Err(n.invalid(format!("axis must be a scalar, got {v:?}"))),
                    None => (None, Some(a)),
                },
            }
        };
        if axis == Some(rank as i64 - 1) {
            return Err(n.invalid("the DFT axis cannot be the last (real/imaginary) dim"));
        }
        self.finish(
            Op::Dft {
                axis,
                inverse,
                onesided,
            },
            trim(vec![Some(x), len, axis_in]),
        )
    }

    pub(super) fn stft(&mut self) -> R {
        let ins = vec![
            Some(self.req(0)?),
            Some(self.req(1)?),
            self.inp(2)?,
            self.inp(3)?,
        ];
        let onesided = self.n.flag("onesided", true)?;
        self.finish(Op::Stft { onesided }, trim(ins))
    }

    pub(super) fn window(&mut self) -> R {
        let n = self.n;
        let kind = match n.op_type() {
            "HannWindow" => WindowKind::Hann,
            "HammingWindow" => WindowKind::Hamming,
            _ => WindowKind::Blackman,
        };
        let size = self.req(0)?;
        let op = Op::Window {
            kind,
            periodic: n.flag("periodic", true)?,
            dtype: self.dtype_attr("output_datatype", Some(1))?,
        };
        self.finish(op, vec![Some(size)])
    }

    pub(super) fn mel_weight_matrix(&mut self) -> R {
        let ins = (0..5)
            .map(|i| self.req(i).map(Some))
            .collect::<R<Vec<_>>>()?;
        let dtype = self.dtype_attr("output_datatype", Some(1))?;
        self.finish(Op::MelWeightMatrix { dtype }, ins)
    }

    pub(super) fn roi_align(&mut self) -> R {
        let n = self.n;
        let ins = vec![Some(self.req(0)?), Some(self.req(1)?), Some(self.req(2)?)];
        let mode = match n.s("mode", "avg")?.as_str() {
            "avg" => RoiPoolMode::Avg,
            "max" => RoiPoolMode::Max,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        // RoiAlign-10 has no coordinate_transformation_mode and behaves as
        // `output_half_pixel`; from opset 16 the default is `half_pixel`.
        let half_pixel = if n.opset >= 16 {
            match n
                .s("coordinate_transformation_mode", "half_pixel")?
                .as_str()
            {
                "half_pixel" => true,
                "output_half_pixel" => false,
                m => return Err(n.invalid(format!("unknown coordinate_transformation_mode `{m}`"))),
            }
        } else {
            false
        };
        self.finish(
            Op::RoiAlign {
                mode,
                half_pixel,
                output_height: n.i("output_height", 1)?,
                output_width: n.i("output_width", 1)?,
                sampling_ratio: n.i("sampling_ratio", 0)?,
                spatial_scale: n.f("spatial_scale", 1.0)?,
            },
            ins,
        )
    }

    pub(super) fn deform_conv(&mut self) -> R {
        let n = self.n;
        let (x, w, off) = (self.req(0)?, self.req(1)?, self.req(2)?);
        if self.rank(x) != 4 {
            return Err(n.unsupported(format!(
                "unsupported: DeformConv of rank {} (only 2-D is supported)",
                self.rank(x)
            )));
        }
        let c = self.conv_params(x, Some(w), true)?;
        let ins = vec![Some(x), Some(w), Some(off), self.inp(3)?, self.inp(4)?];
        self.finish(
            Op::DeformConv {
                kernel_shape: c.kernel,
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                group: n.i("group", 1)?,
                offset_group: n.i("offset_group", 1)?,
            },
            trim(ins),
        )
    }

    /// The 8 required operands of QLinearMatMul / QLinearConv, u8 or i8.
    fn qlinear_operands(&self) -> R<Vec<Option<rafter_ir::ValueId>>> {
        let ins = (0..8)
            .map(|i| self.req(i).map(Some))
            .collect::<R<Vec<_>>>()?;
        for i in [0, 3, 7] {
            let d = self.dtype(ins[i].expect("required"));
            if !matches!(d, DType::U8 | DType::I8) {
                return Err(self.n.unsupported(format!(
                    "unsupported: {} with {d} operand {i} (only u8 and i8)",
                    self.n.op_type()
                )));
            }
        }
        Ok(ins)
    }

    pub(super) fn qlinear_matmul(&mut self) -> R {
        let ins = self.qlinear_operands()?;
        self.finish(Op::QLinearMatMul, ins)
    }

    pub(super) fn qlinear_conv(&mut self) -> R {
        let mut ins = self.qlinear_operands()?;
        let (x, w) = (ins[0].expect("x"), ins[3].expect("w"));
        let c = self.conv_params(x, Some(w), true)?;
        ins.push(self.inp(8)?);
        self.finish(
            Op::QLinearConv {
                kernel_shape: c.kernel,
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                group: self.n.i("group", 1)?,
                auto_pad: c.auto_pad,
            },
            trim(ins),
        )
    }

    pub(super) fn linear_attention(&mut self) -> R {
        let n = self.n;
        let ins = vec![
            Some(self.req(0)?),
            Some(self.req(1)?),
            Some(self.req(2)?),
            self.inp(3)?,
            self.inp(4)?,
            self.inp(5)?,
        ];
        let update_rule = match n.s("update_rule", "gated_delta")?.as_str() {
            "linear" => LinearAttnRule::Linear,
            "gated" => LinearAttnRule::Gated,
            "delta" => LinearAttnRule::Delta,
            "gated_delta" => LinearAttnRule::GatedDelta,
            r => return Err(n.invalid(format!("unknown update_rule `{r}`"))),
        };
        // chunk_size is a tuning hint with no effect on the result.
        let _ = n.i("chunk_size", 64)?;
        self.finish(
            Op::LinearAttention {
                q_num_heads: n.i_req("q_num_heads")?,
                kv_num_heads: n.i_req("kv_num_heads")?,
                // 0 (the default) means 1/sqrt(head size), as an absent scale.
                scale: n.f_opt("scale")?.filter(|&s| s != 0.0),
                update_rule,
            },
            trim(ins),
        )
    }

    pub(super) fn causal_conv_with_state(&mut self) -> R {
        let n = self.n;
        let ins = vec![
            Some(self.req(0)?),
            Some(self.req(1)?),
            self.inp(2)?,
            self.inp(3)?,
        ];
        let silu = match n.s("activation", "none")?.as_str() {
            "none" => false,
            "silu" | "swish" => true,
            a => return Err(n.invalid(format!("unknown activation `{a}`"))),
        };
        self.finish(Op::CausalConvWithState { silu }, trim(ins))
    }

    pub(super) fn bit_cast(&mut self) -> R {
        let x = self.req(0)?;
        let to = self.dtype_attr("to", None)?;
        let from = self.dtype(x);
        if from.size_of() != to.size_of() {
            return Err(self
                .n
                .invalid(format!("BitCast from {from} to {to}: element sizes differ")));
        }
        self.finish(Op::BitCast { to }, vec![Some(x)])
    }
}
