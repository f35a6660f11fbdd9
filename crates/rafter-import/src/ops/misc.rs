//! Losses and miscellany, and the `ai.onnx.ml` ops.

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::convert::first_scalar;
use rafter_ir::{ConstData, DType, LossReduction, Op, Scalar, TensorScatterMode};

/// The misc ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("NegativeLogLikelihoodLoss", loss),
    OnnxOp::new("SoftmaxCrossEntropyLoss", loss),
    OnnxOp::new("SwiGLU", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(
            Op::SwiGlu {
                alpha: n.f("alpha", 1.0)?,
            },
            ins,
        )
    }),
    OnnxOp::new("Det", |t| t.act(Op::Det)),
    OnnxOp::new("CenterCropPad", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axes = match n.ints("axes")? {
            Some(a) => t.axes(&a, t.rank(x))?,
            None => vec![],
        };
        let ins = vec![Some(x), Some(t.req(1)?)];
        t.finish(Op::CenterCropPad { axes }, ins)
    }),
    OnnxOp::new("Col2Im", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), Some(t.req(2)?)];
        t.finish(
            Op::Col2Im {
                dilations: n.ints("dilations")?.unwrap_or_default(),
                pads: n.ints("pads")?.unwrap_or_default(),
                strides: n.ints("strides")?.unwrap_or_default(),
            },
            ins,
        )
    }),
    OnnxOp::new("AffineGrid", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(
            Op::AffineGrid {
                align_corners: n.flag("align_corners", false)?,
            },
            ins,
        )
    }),
    OnnxOp::new("TensorScatter", |t| {
        let n = t.n;
        let past = t.req(0)?;
        let axis = t.axis(n.i("axis", -2)?, t.rank(past))?;
        let mode = match n.s("mode", "linear")?.as_str() {
            "linear" => TensorScatterMode::Linear,
            "circular" => TensorScatterMode::Circular,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let ins = trim(vec![Some(past), Some(t.req(1)?), t.inp(2)?]);
        t.finish(Op::TensorScatter { axis, mode }, ins)
    }),
];

/// The `ai.onnx.ml` ops.
pub(super) const ML_OPS: &[OnnxOp] = &[
    OnnxOp::new("Binarizer", |t| {
        let n = t.n;
        t.act(Op::Binarizer {
            threshold: n.f("threshold", 0.0)?,
        })
    }),
    OnnxOp::new("ArrayFeatureExtractor", |t| {
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(Op::ArrayFeatureExtractor, ins)
    }),
    OnnxOp::new("LabelEncoder", |t| t.label_encoder()),
];

/// `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` (same reduction and
/// ignore index).
fn loss(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let reduction = match n.s("reduction", "mean")?.as_str() {
        "none" => LossReduction::None,
        "sum" => LossReduction::Sum,
        "mean" => LossReduction::Mean,
        r => return Err(n.invalid(format!("unknown reduction `{r}`"))),
    };
    let ignore_index = n.i_opt("ignore_index")?;
    let ins = trim(vec![Some(t.req(0)?), Some(t.req(1)?), t.inp(2)?]);
    let op = if op == "NegativeLogLikelihoodLoss" {
        Op::NllLoss {
            reduction,
            ignore_index,
        }
    } else {
        Op::SoftmaxCrossEntropy {
            reduction,
            ignore_index,
        }
    };
    t.finish(op, ins)
}

impl Tr<'_, '_, '_> {
    /// ai.onnx.ml LabelEncoder with integer or float keys and values (attribute lists or,
    /// from version 4, tensors); string ones are unsupported.
    pub(super) fn label_encoder(&mut self) -> R {
        let n = self.n;
        if n.has("keys_strings") || n.has("values_strings") {
            return Err(n.unsupported("unsupported: string keys or values"));
        }
        let x = self.req(0)?;
        let xd = self.dtype(x);
        // Keys: (integers, floats); values: (integers, floats, output dtype).
        let (mut int_keys, mut float_keys) = (Vec::new(), Vec::new());
        if let Some(k) = n.ints("keys_int64s")? {
            int_keys = k;
        } else if let Some(k) = n.floats("keys_floats")? {
            float_keys = k.into_iter().map(f64::from).collect();
        } else if let Some(t) = self.ml_tensor("keys_tensor")? {
            match t.to_i64s() {
                Some(v) => int_keys = v,
                None => float_keys = t.to_f64s(),
            }
        } else {
            return Err(n.invalid("no keys (keys_int64s, keys_floats or keys_tensor)"));
        }
        let (mut int_values, mut float_values) = (Vec::new(), Vec::new());
        let default_int = n.i("default_int64", -1)?;
        let default_float = n.f("default_float", -0.0)? as f64;
        n.has("default_string");
        let default = if let Some(v) = n.ints("values_int64s")? {
            n.has("default_tensor");
            int_values = v;
            Scalar::Int(DType::I64, default_int)
        } else if let Some(v) = n.floats("values_floats")? {
            n.has("default_tensor");
            float_values = v.into_iter().map(f64::from).collect();
            Scalar::Float(DType::F32, default_float)
        } else if let Some(t) = self.ml_tensor("values_tensor")? {
            let out = t.dtype;
            if !(out.is_float() || out.is_signed_int()) {
                return Err(n.invalid(format!("values_tensor of dtype {out}")));
            }
            match t.to_i64s() {
                Some(v) => int_values = v,
                None => float_values = t.to_f64s(),
            }
            match self.ml_tensor("default_tensor")? {
                Some(d) => {
                    let s = first_scalar(&d).ok_or_else(|| n.invalid("empty default_tensor"))?;
                    if s.dtype() != out {
                        return Err(n.invalid(format!(
                            "default_tensor is {}, values_tensor is {out}",
                            s.dtype()
                        )));
                    }
                    s
                }
                None if out.is_float() => Scalar::Float(out, -0.0),
                None => Scalar::Int(out, -1),
            }
        } else {
            return Err(n.invalid("no values (values_int64s, values_floats or values_tensor)"));
        };
        let keys = int_keys.len() + float_keys.len();
        let values = int_values.len() + float_values.len();
        if keys != values {
            return Err(n.invalid(format!("{keys} keys but {values} values")));
        }
        if keys > 0 && xd.is_int() == int_keys.is_empty() {
            return Err(n.invalid(format!(
                "{} keys for an input of dtype {xd}",
                if int_keys.is_empty() {
                    "float"
                } else {
                    "integer"
                }
            )));
        }
        self.finish(
            Op::LabelEncoder {
                int_keys,
                float_keys,
                int_values,
                float_values,
                default,
            },
            vec![Some(x)],
        )
    }

    /// A tensor attribute of an ai.onnx.ml op as constant data; strings are unsupported.
    pub(super) fn ml_tensor(&mut self, name: &str) -> R<Option<ConstData>> {
        let Some(t) = self.n.tensor(name)? else {
            return Ok(None);
        };
        if t.data_type == 8 {
            return Err(self
                .n
                .unsupported(format!("unsupported: string tensor `{name}`")));
        }
        let what = format!("node `{}` ({}) {name}", self.n.name, self.n.op_type());
        self.cx.tensor_data(t, &what).map(Some)
    }
}
