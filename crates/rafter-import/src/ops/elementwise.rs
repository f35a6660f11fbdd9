//! Elementwise ops: unary and binary arithmetic, comparisons and logic (each a
//! registration with its IR op), activations, casts, Clip, the variadic Sum/Max/Min/Mean,
//! Identity, Dropout and Constant.

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::convert::{dtype_from_onnx, first_scalar, scalar_const};
use crate::node::NodeView;
use crate::ImportError;
use rafter_ir::{BinaryOp, ConstData, DType, Dim, GeluApprox, Op, Scalar, UnaryOp, ValueId};

/// The elementwise ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::unary("Abs", UnaryOp::Abs),
    OnnxOp::unary("Neg", UnaryOp::Neg),
    OnnxOp::unary("Sqrt", UnaryOp::Sqrt),
    OnnxOp::unary("Exp", UnaryOp::Exp),
    OnnxOp::unary("Log", UnaryOp::Log),
    OnnxOp::unary("Reciprocal", UnaryOp::Reciprocal),
    OnnxOp::unary("Floor", UnaryOp::Floor),
    OnnxOp::unary("Ceil", UnaryOp::Ceil),
    OnnxOp::unary("Round", UnaryOp::Round),
    OnnxOp::unary("Sign", UnaryOp::Sign),
    OnnxOp::unary("Sin", UnaryOp::Sin),
    OnnxOp::unary("Cos", UnaryOp::Cos),
    OnnxOp::unary("Tan", UnaryOp::Tan),
    OnnxOp::unary("Asin", UnaryOp::Asin),
    OnnxOp::unary("Acos", UnaryOp::Acos),
    OnnxOp::unary("Atan", UnaryOp::Atan),
    OnnxOp::unary("Sinh", UnaryOp::Sinh),
    OnnxOp::unary("Cosh", UnaryOp::Cosh),
    OnnxOp::unary("Tanh", UnaryOp::Tanh),
    OnnxOp::unary("Asinh", UnaryOp::Asinh),
    OnnxOp::unary("Acosh", UnaryOp::Acosh),
    OnnxOp::unary("Atanh", UnaryOp::Atanh),
    OnnxOp::unary("Erf", UnaryOp::Erf),
    OnnxOp::unary("Sigmoid", UnaryOp::Sigmoid),
    OnnxOp::unary("Relu", UnaryOp::Relu),
    OnnxOp::unary("Not", UnaryOp::Not),
    OnnxOp::unary("BitwiseNot", UnaryOp::BitwiseNot),
    OnnxOp::unary("IsNaN", UnaryOp::IsNaN),
    OnnxOp::unary("Softplus", UnaryOp::Softplus),
    OnnxOp::unary("Softsign", UnaryOp::Softsign),
    OnnxOp::unary("Mish", UnaryOp::Mish),
    OnnxOp::unary("HardSwish", UnaryOp::HardSwish),
    OnnxOp::binary("Add", BinaryOp::Add),
    OnnxOp::binary("Sub", BinaryOp::Sub),
    OnnxOp::binary("Mul", BinaryOp::Mul),
    OnnxOp::binary("Div", BinaryOp::Div),
    OnnxOp::binary("Pow", BinaryOp::Pow),
    OnnxOp::new("Mod", |t| {
        let n = t.n;
        let bop = if n.flag("fmod", false)? {
            BinaryOp::FMod
        } else {
            BinaryOp::Mod
        };
        let (a, b) = (t.req(0)?, t.req(1)?);
        t.finish(Op::Binary { op: bop }, vec![Some(a), Some(b)])
    }),
    OnnxOp::binary("Equal", BinaryOp::Equal),
    OnnxOp::binary("Less", BinaryOp::Less),
    OnnxOp::binary("LessOrEqual", BinaryOp::LessOrEqual),
    OnnxOp::binary("Greater", BinaryOp::Greater),
    OnnxOp::binary("GreaterOrEqual", BinaryOp::GreaterOrEqual),
    OnnxOp::binary("And", BinaryOp::And),
    OnnxOp::binary("Or", BinaryOp::Or),
    OnnxOp::binary("Xor", BinaryOp::Xor),
    OnnxOp::binary("BitwiseAnd", BinaryOp::BitAnd),
    OnnxOp::binary("BitwiseOr", BinaryOp::BitOr),
    OnnxOp::binary("BitwiseXor", BinaryOp::BitXor),
    OnnxOp::new("BitShift", |t| {
        let n = t.n;
        let bop = match n.s("direction", "")?.as_str() {
            "LEFT" => BinaryOp::ShiftLeft,
            "RIGHT" => BinaryOp::ShiftRight,
            d => return Err(n.invalid(format!("direction `{d}` is not LEFT or RIGHT"))),
        };
        let (a, b) = (t.req(0)?, t.req(1)?);
        t.finish(Op::Binary { op: bop }, vec![Some(a), Some(b)])
    }),
    OnnxOp::binary("PRelu", BinaryOp::PRelu),
    OnnxOp::new("Sum", |t| t.variadic(BinaryOp::Add, false)),
    OnnxOp::new("Max", |t| t.variadic(BinaryOp::Max, false)),
    OnnxOp::new("Min", |t| t.variadic(BinaryOp::Min, false)),
    OnnxOp::new("Mean", |t| t.variadic(BinaryOp::Add, true)),
    OnnxOp::new("Where", |t| {
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), Some(t.req(2)?)];
        t.finish(Op::Where, ins)
    }),
    OnnxOp::new("Clip", |t| t.clip()),
    OnnxOp::new("Cast", |t| {
        let n = t.n;
        let to = cast_to_code(n)?;
        let to =
            dtype_from_onnx(to).map_err(|e| n.unsupported(format!("unsupported: cast to {e}")))?;
        let x = t.req(0)?;
        t.finish(Op::Cast { to }, vec![Some(x)])
    })
    .checked(check_cast),
    OnnxOp::new("CastLike", |t| {
        let (x, target) = (t.req(0)?, t.req(1)?);
        let to = t.dtype(target);
        t.finish(Op::Cast { to }, vec![Some(x)])
    }),
    OnnxOp::new("LeakyRelu", |t| {
        let n = t.n;
        t.act(Op::LeakyRelu {
            alpha: n.f("alpha", 0.01)?,
        })
    }),
    OnnxOp::new("Elu", |t| {
        let n = t.n;
        t.act(Op::Elu {
            alpha: n.f("alpha", 1.0)?,
        })
    }),
    // Selu-1 had rounder defaults.
    OnnxOp::new("Selu", |t| {
        let n = t.n;
        let (alpha, gamma) = if n.opset < 6 {
            (n.f("alpha", 1.6732)?, n.f("gamma", 1.0507)?)
        } else {
            (n.f("alpha", 1.673_263_2)?, n.f("gamma", 1.050_701)?)
        };
        t.act(Op::Selu { alpha, gamma })
    }),
    OnnxOp::new("Celu", |t| {
        let n = t.n;
        t.act(Op::Celu {
            alpha: n.f("alpha", 1.0)?,
        })
    }),
    OnnxOp::new("HardSigmoid", |t| {
        let n = t.n;
        t.act(Op::HardSigmoid {
            alpha: n.f("alpha", 0.2)?,
            beta: n.f("beta", 0.5)?,
        })
    }),
    OnnxOp::new("ThresholdedRelu", |t| {
        let n = t.n;
        t.act(Op::ThresholdedRelu {
            alpha: n.f("alpha", 1.0)?,
        })
    }),
    OnnxOp::new("Shrink", |t| {
        let n = t.n;
        t.act(Op::Shrink {
            bias: n.f("bias", 0.0)?,
            lambd: n.f("lambd", 0.5)?,
        })
    }),
    OnnxOp::new("Gelu", |t| {
        let n = t.n;
        let approximate = match n.s("approximate", "none")?.as_str() {
            "none" => GeluApprox::None,
            "tanh" => GeluApprox::Tanh,
            a => return Err(n.invalid(format!("unknown approximate `{a}`"))),
        };
        t.act(Op::Gelu { approximate })
    }),
    OnnxOp::new("IsInf", |t| {
        let n = t.n;
        t.act(Op::IsInf {
            detect_negative: n.flag("detect_negative", true)?,
            detect_positive: n.flag("detect_positive", true)?,
        })
    }),
    OnnxOp::new("Swish", |t| t.swish()),
    OnnxOp::new("Identity", |t| {
        let x = t.req(0)?;
        t.finish(Op::Identity, vec![Some(x)])
    }),
    OnnxOp::new("Dropout", |t| t.dropout()).checked(check_dropout),
    OnnxOp::new("Constant", |t| t.constant()).checked(check_constant),
];

/// A cast to an element type the IR has.
fn check_cast(n: &NodeView<'_>) -> Result<(), String> {
    if let Ok(to) = cast_to_code(n) {
        dtype_from_onnx(to).map_err(|e| format!("unsupported: cast to {e}"))?;
    }
    Ok(())
}

/// Dropout before opset 7 in training mode zeroes random elements.
fn check_dropout(n: &NodeView<'_>) -> Result<(), String> {
    let ratio = n.attr("ratio").map_or(0.5, |a| a.f);
    if n.opset < 7 && n.attr("is_test").map_or(0, |a| a.i) == 0 && ratio != 0.0 {
        return Err("unsupported: is_test=0 (training mode: zeroes random elements)".into());
    }
    Ok(())
}

/// A dense constant of an element type the IR has.
fn check_constant(n: &NodeView<'_>) -> Result<(), String> {
    if n.has("sparse_value") {
        return Err("unsupported: sparse tensor constants".into());
    }
    if n.has("value_string") || n.has("value_strings") {
        return Err("unsupported: string constants".into());
    }
    if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
        dtype_from_onnx(t.data_type).map_err(|e| format!("unsupported: {e}"))?;
    }
    Ok(())
}

impl Tr<'_, '_, '_> {
    /// A binary op; before opset 7 its second operand is made ready for NumPy
    /// broadcasting first (`broadcast`/`axis`, PRelu's per-channel slope).
    pub(super) fn binary(&mut self, op: BinaryOp) -> R {
        let (a, mut b) = (self.req(0)?, self.req(1)?);
        if self.n.opset < 7 {
            b = if op == BinaryOp::PRelu {
                self.legacy_prelu_slope(a, b)?
            } else {
                self.legacy_broadcast(a, b)?
            };
        }
        self.finish(Op::Binary { op }, vec![Some(a), Some(b)])
    }

    /// The second operand of a binary op before opset 7, made ready for NumPy broadcasting.
    /// Without `broadcast=1` both operands have one shape. With it, B is a scalar, holds one
    /// element, or its dims match A's from `axis` on (the last ones without `axis`): B gets
    /// trailing unit dims so NumPy broadcasting lines it up at the same place.
    pub(super) fn legacy_broadcast(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        let n = self.n;
        let axis = n.i_opt("axis")?;
        let (ta, tb) = (self.ty(a), self.ty(b));
        let (ra, rb) = (ta.rank(), tb.rank());
        if !n.flag("broadcast", false)? {
            let differ = |(x, y): (&Dim, &Dim)| matches!((x.as_known(), y.as_known()), (Some(x), Some(y)) if x != y);
            if ra != rb || ta.dims.iter().zip(&tb.dims).any(differ) {
                return Err(n.invalid(format!(
                    "operands {ta} and {tb} differ in shape but broadcast is not 1"
                )));
            }
            return Ok(b);
        }
        if tb.dims.iter().all(|d| d.as_known() == Some(1)) && rb <= ra {
            return Ok(b);
        }
        let start = match axis {
            None => ra.checked_sub(rb),
            Some(ax) => {
                let s = if ax < 0 { ax + ra as i64 } else { ax };
                usize::try_from(s).ok().filter(|&s| s + rb <= ra)
            }
        };
        let Some(start) = start else {
            return Err(n.invalid(format!(
                "B {tb} does not fit inside A {ta} (broadcast=1, axis {})",
                axis.map_or("unset".to_string(), |a| a.to_string())
            )));
        };
        let pad = (ra - start - rb) as i64;
        if pad == 0 {
            return Ok(b);
        }
        let axes = (rb as i64..rb as i64 + pad).collect();
        self.tmp("broadcast_b", Op::Unsqueeze { axes }, vec![Some(b)])
    }

    /// PRelu's slope before opset 7: one value, or one per channel (dim 1). A 1-D slope of C
    /// values becomes [C, 1, ...] so NumPy broadcasting applies it per channel.
    pub(super) fn legacy_prelu_slope(&mut self, x: ValueId, slope: ValueId) -> R<ValueId> {
        let n = self.n;
        let (tx, ts) = (self.ty(x), self.ty(slope));
        let rx = tx.rank();
        if ts.rank() != 1 || rx < 3 || ts.dims[0].as_known() == Some(1) {
            return Ok(slope);
        }
        if let (Some(c), Some(l)) = (tx.dims[1].as_known(), ts.dims[0].as_known()) {
            if c != l {
                return Err(n.invalid(format!(
                    "slope {ts} is neither one value nor one per channel of {tx}"
                )));
            }
        }
        let axes = (1..rx as i64 - 1).collect();
        self.tmp(
            "slope_per_channel",
            Op::Unsqueeze { axes },
            vec![Some(slope)],
        )
    }

    pub(super) fn variadic(&mut self, op: BinaryOp, mean: bool) -> R {
        let ins = (0..self.n.num_inputs())
            .map(|i| self.req(i))
            .collect::<R<Vec<_>>>()?;
        let Some(&first) = ins.first() else {
            return Err(self.n.invalid("needs at least one input"));
        };
        if ins.len() == 1 {
            return self.finish(Op::Identity, vec![Some(first)]);
        }
        let mut acc = first;
        for (k, &x) in ins[1..].iter().enumerate() {
            if k + 2 == ins.len() && !mean {
                return self.finish(Op::Binary { op }, vec![Some(acc), Some(x)]);
            }
            acc = self.tmp(
                &format!("acc{k}"),
                Op::Binary { op },
                vec![Some(acc), Some(x)],
            )?;
        }
        let count = self.konst("count", scalar_const(self.dtype(acc), ins.len() as f64));
        self.finish(
            Op::Binary { op: BinaryOp::Div },
            vec![Some(acc), Some(count)],
        )
    }

    pub(super) fn clip(&mut self) -> R {
        let x = self.req(0)?;
        let (lo, hi) = if self.n.opset < 11 {
            let dt = self.dtype(x);
            // Clip-6 defaults its bounds to the f32 range (so it clamps infinities); Clip-1
            // has no defaults.
            let default = |v: f32| (self.n.opset >= 6).then_some(v);
            let lo = self.n.f_opt("min")?.or(default(f32::MIN));
            let hi = self.n.f_opt("max")?.or(default(f32::MAX));
            let lo = lo.map(|v| self.konst("min", scalar_const(dt, v as f64)));
            let hi = hi.map(|v| self.konst("max", scalar_const(dt, v as f64)));
            (lo, hi)
        } else {
            (self.inp(1)?, self.inp(2)?)
        };
        self.finish(Op::Clip, trim(vec![Some(x), lo, hi]))
    }

    pub(super) fn swish(&mut self) -> R {
        let x = self.req(0)?;
        let alpha = self.n.f("alpha", 1.0)?;
        let scaled = if alpha == 1.0 {
            x
        } else {
            let a = self.konst("alpha", scalar_const(self.dtype(x), alpha as f64));
            self.tmp(
                "scaled",
                Op::Binary { op: BinaryOp::Mul },
                vec![Some(x), Some(a)],
            )?
        };
        let s = self.tmp(
            "sigmoid",
            Op::Unary {
                op: UnaryOp::Sigmoid,
            },
            vec![Some(scaled)],
        )?;
        self.finish(Op::Binary { op: BinaryOp::Mul }, vec![Some(x), Some(s)])
    }

    pub(super) fn dropout(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        // A ratio known to be 0 keeps everything, in training mode too.
        let zero_ratio = n.opset >= 12
            && self.inp(1)?.is_some_and(|r| {
                self.sc
                    .g
                    .const_of(r)
                    .is_some_and(|c| c.num_elements() == 1 && c.to_f64s().iter().all(|&v| v == 0.0))
            });
        if n.opset >= 12 && !zero_ratio {
            if let Some(tm) = self.inp(2)? {
                match self.sc.known_i64s(tm) {
                    Some(v) if v.iter().all(|&b| b == 0) => {}
                    Some(_) => {
                        return Err(n.unsupported("unsupported: training_mode=true"));
                    }
                    None => {
                        return Err(n.unsupported(
                            "unsupported: dynamic training_mode (input is not a constant)",
                        ))
                    }
                }
            }
        }
        let out = n.out_names();
        let y = out.first().cloned().flatten();
        self.finish_outs(Op::Identity, vec![Some(x)], vec![y])?;
        if n.has_output(1) {
            // The mask of an inference dropout keeps everything.
            let value = if n.opset >= 10 {
                Scalar::Bool(true)
            } else {
                let dt = self.dtype(x);
                first_scalar(&scalar_const(dt, 1.0)).expect("one element")
            };
            let shape = self.tmp(
                "shape",
                Op::Shape {
                    start: 0,
                    end: None,
                },
                vec![Some(x)],
            )?;
            let name = n.p.output[1].clone();
            let ids = self.cx.emit(
                self.sc,
                n,
                format!("{}/mask", n.name),
                Op::ConstantOfShape { value },
                vec![Some(shape)],
                vec![Some(name.clone())],
            )?;
            self.sc.names.insert(name, ids[0].expect("requested"));
        }
        Ok(())
    }

    pub(super) fn constant(&mut self) -> R {
        let n = self.n;
        let data = if let Some(t) = n.tensor("value")? {
            let what = format!("node `{}` (Constant) value", n.name);
            self.cx.tensor_data(t, &what)?
        } else if let Some(f) = n.f_opt("value_float")? {
            ConstData {
                dtype: DType::F32,
                dims: vec![],
                bytes: f.to_le_bytes().to_vec().into(),
            }
        } else if let Some(fs) = n.floats("value_floats")? {
            ConstData::from_f32s(&fs)
        } else if let Some(i) = n.i_opt("value_int")? {
            ConstData {
                dtype: DType::I64,
                dims: vec![],
                bytes: i.to_le_bytes().to_vec().into(),
            }
        } else if let Some(is) = n.ints("value_ints")? {
            ConstData::from_i64s(&is)
        } else {
            return Err(n.invalid("has no value attribute"));
        };
        let Some(name) = n.out_names().into_iter().next().flatten() else {
            return Ok(());
        };
        let v = self.sc.add_const(name.clone(), data);
        self.sc.names.insert(name, v);
        Ok(())
    }
}

/// The ONNX type code of Cast's `to`: an int, or before opset 6 (Cast-1) a type name such as
/// `FLOAT`.
pub(crate) fn cast_to_code(n: &NodeView<'_>) -> Result<i32, ImportError> {
    use rafter_onnx_proto::attribute_proto::AttributeType;
    let a = n
        .attr("to")
        .ok_or_else(|| n.invalid("missing required attribute `to`"))?;
    if n.opset < 6 && a.r#type == AttributeType::String as i32 {
        let name = String::from_utf8_lossy(&a.s).to_ascii_uppercase();
        return (1..=30)
            .find(|&c| rafter_onnx_proto::data_type_name(c) == name)
            .ok_or_else(|| n.invalid(format!("`to` names no element type: `{name}`")));
    }
    Ok(n.i_req("to")? as i32)
}
