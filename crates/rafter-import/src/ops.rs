//! Translation of each ONNX op (default domain, opsets 1..=28) to IR ops.

mod extra;

use crate::convert::{dtype_from_onnx, first_scalar, norm_axes, norm_axis, scalar_const};
use crate::import::{Ctx, Scope};
use crate::node::NodeView;
use crate::ImportError;
use rafter_ir::{
    rnn_activation, ArgKind, AspectPolicy, AutoPad, BinaryOp, ConstData, CoordTransform, CumKind,
    DType, DepthToSpaceMode, Dim, GeluApprox, GridPadding, GridSampleMode, LossReduction,
    NearestMode, Op, PadMode, PoolKind, ReduceKind, ResizeMode, RnnDirection, Scalar,
    ScatterReduction, SoftmaxKind, TensorScatterMode, TensorType, UnaryOp, ValueId,
};

/// Every default-domain op type the importer translates.
pub(crate) const SUPPORTED: &[&str] = &[
    // elementwise
    "Abs",
    "Neg",
    "Sqrt",
    "Exp",
    "Log",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Tanh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Erf",
    "Sigmoid",
    "Relu",
    "Not",
    "BitwiseNot",
    "IsNaN",
    "Softplus",
    "Softsign",
    "Mish",
    "HardSwish",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitShift",
    "PRelu",
    "Sum",
    "Max",
    "Min",
    "Mean",
    "Where",
    "Clip",
    "Cast",
    "CastLike",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "ThresholdedRelu",
    "Shrink",
    "Gelu",
    "IsInf",
    "Swish",
    "Identity",
    "Dropout",
    "Constant",
    // reductions and normalisations
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
    "CumSum",
    "CumProd",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    "LayerNormalization",
    "RMSNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "BatchNormalization",
    "LpNormalization",
    "LRN",
    "MeanVarianceNormalization",
    // contractions
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "Einsum",
    "MatMulInteger",
    "ConvInteger",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "Attention",
    "RotaryEmbedding",
    // pooling
    "MaxPool",
    "AveragePool",
    "LpPool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GlobalLpPool",
    "MaxUnpool",
    // shapes and data movement
    "Reshape",
    "Shape",
    "Size",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "GatherND",
    "ScatterElements",
    "Scatter",
    "ScatterND",
    "Expand",
    "Tile",
    "Pad",
    "ConstantOfShape",
    "Range",
    "OneHot",
    "Trilu",
    "TopK",
    "NonZero",
    "Compress",
    "Unique",
    "ReverseSequence",
    "DepthToSpace",
    "SpaceToDepth",
    "EyeLike",
    "Resize",
    "Upsample",
    "GridSample",
    "NonMaxSuppression",
    // losses and miscellany
    "NegativeLogLikelihoodLoss",
    "SoftmaxCrossEntropyLoss",
    "SwiGLU",
    "Det",
    "CenterCropPad",
    "Col2Im",
    "AffineGrid",
    "TensorScatter",
    // recurrent
    "LSTM",
    "GRU",
    "RNN",
    // signal processing, detection, quantized and stateful sequence ops
    "DFT",
    "STFT",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
    "MelWeightMatrix",
    "RoiAlign",
    "DeformConv",
    "QLinearMatMul",
    "QLinearConv",
    "LinearAttention",
    "CausalConvWithState",
    "BitCast",
    // control flow
    "If",
    "Loop",
    "Scan",
];

/// Every `ai.onnx.ml` op type the importer translates.
pub(crate) const ML_SUPPORTED: &[&str] = &["Binarizer", "ArrayFeatureExtractor", "LabelEncoder"];

/// The input index of the `axes` operand, for the ops and opsets that take axes as an
/// input (constant axes become the op's attribute, others its operand).
pub(crate) fn axes_input_index(op: &str, opset: i64) -> Option<usize> {
    match op {
        "ReduceSum" | "Squeeze" | "Unsqueeze" if opset >= 13 => Some(1),
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset >= 18 =>
        {
            Some(1)
        }
        _ => None,
    }
}

/// Index of a recurrent activation name in [`rnn_activation::NAMES`] (case-insensitive).
pub(crate) fn rnn_activation_index(name: &str) -> Option<i64> {
    rnn_activation::NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| i as i64)
}

fn unary_op(op: &str) -> Option<UnaryOp> {
    use UnaryOp::*;
    Some(match op {
        "Abs" => Abs,
        "Neg" => Neg,
        "Sqrt" => Sqrt,
        "Exp" => Exp,
        "Log" => Log,
        "Reciprocal" => Reciprocal,
        "Floor" => Floor,
        "Ceil" => Ceil,
        "Round" => Round,
        "Sign" => Sign,
        "Sin" => Sin,
        "Cos" => Cos,
        "Tan" => Tan,
        "Asin" => Asin,
        "Acos" => Acos,
        "Atan" => Atan,
        "Sinh" => Sinh,
        "Cosh" => Cosh,
        "Tanh" => Tanh,
        "Asinh" => Asinh,
        "Acosh" => Acosh,
        "Atanh" => Atanh,
        "Erf" => Erf,
        "Sigmoid" => Sigmoid,
        "Relu" => Relu,
        "Not" => Not,
        "BitwiseNot" => BitwiseNot,
        "IsNaN" => IsNaN,
        "Softplus" => Softplus,
        "Softsign" => Softsign,
        "Mish" => Mish,
        "HardSwish" => HardSwish,
        _ => return None,
    })
}

fn binary_op(op: &str) -> Option<BinaryOp> {
    use BinaryOp::*;
    Some(match op {
        "Add" => Add,
        "Sub" => Sub,
        "Mul" => Mul,
        "Div" => Div,
        "Pow" => Pow,
        "Equal" => Equal,
        "Less" => Less,
        "LessOrEqual" => LessOrEqual,
        "Greater" => Greater,
        "GreaterOrEqual" => GreaterOrEqual,
        "And" => And,
        "Or" => Or,
        "Xor" => Xor,
        "BitwiseAnd" => BitAnd,
        "BitwiseOr" => BitOr,
        "BitwiseXor" => BitXor,
        "PRelu" => PRelu,
        _ => return None,
    })
}

fn reduce_kind(op: &str) -> Option<ReduceKind> {
    use ReduceKind::*;
    Some(match op {
        "ReduceSum" => Sum,
        "ReduceMean" => Mean,
        "ReduceMax" => Max,
        "ReduceMin" => Min,
        "ReduceProd" => Prod,
        "ReduceL1" => L1,
        "ReduceL2" => L2,
        "ReduceLogSum" => LogSum,
        "ReduceLogSumExp" => LogSumExp,
        "ReduceSumSquare" => SumSquare,
        _ => return None,
    })
}

pub(crate) fn translate(
    cx: &mut Ctx<'_>,
    sc: &mut Scope,
    n: &NodeView<'_>,
) -> Result<(), ImportError> {
    Tr { cx, sc, n }.run()
}

/// Translation of one node.
struct Tr<'a, 'h, 'n> {
    cx: &'a mut Ctx<'h>,
    sc: &'a mut Scope,
    n: &'a NodeView<'n>,
}

type R<T = ()> = Result<T, ImportError>;

impl Tr<'_, '_, '_> {
    // ---- operands ----

    /// Operand `i`: `None` when absent or empty, an error when it names nothing.
    fn inp(&self, i: usize) -> R<Option<ValueId>> {
        let Some(name) = self.n.input_name(i) else {
            return Ok(None);
        };
        match self.sc.names.get(name) {
            Some(&v) => Ok(Some(v)),
            None => Err(ImportError::UndefinedInput {
                file: self.n.file.to_string(),
                node: self.n.name.clone(),
                op_type: self.n.op_type().to_string(),
                input: name.to_string(),
            }),
        }
    }

    fn req(&self, i: usize) -> R<ValueId> {
        self.inp(i)?.ok_or_else(|| {
            self.n.invalid(format!(
                "missing required input {i} (of {})",
                self.n.num_inputs()
            ))
        })
    }

    fn all_inputs(&self) -> R<Vec<Option<ValueId>>> {
        (0..self.n.num_inputs()).map(|i| self.inp(i)).collect()
    }

    fn ty(&self, v: ValueId) -> &TensorType {
        self.sc.ty(v)
    }

    fn rank(&self, v: ValueId) -> usize {
        self.ty(v).rank()
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.ty(v).dtype
    }

    /// `v` unless it is a constant with no elements (ONNX's "empty means absent").
    fn non_empty(&self, v: Option<ValueId>) -> Option<ValueId> {
        v.filter(|&v| self.sc.g.const_of(v).is_none_or(|c| c.num_elements() > 0))
    }

    fn axis(&self, axis: i64, rank: usize) -> R<i64> {
        norm_axis(axis, rank).map_err(|e| self.n.invalid(e))
    }

    fn axes(&self, axes: &[i64], rank: usize) -> R<Vec<i64>> {
        norm_axes(axes, rank).map_err(|e| self.n.invalid(e))
    }

    // ---- emission ----

    /// Emits the node's final IR op, whose results are the ONNX node's outputs.
    fn finish(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> R {
        let outs = self.n.out_names();
        self.finish_outs(op, inputs, outs)
    }

    /// Like [`Self::finish`] for an IR op with `k` results (extra ONNX outputs are absent).
    fn finish_k(&mut self, op: Op, inputs: Vec<Option<ValueId>>, k: usize) -> R {
        let mut outs = self.n.out_names();
        if outs[k.min(outs.len())..].iter().any(Option::is_some) {
            return Err(self.n.unsupported(format!(
                "unsupported: only the first {k} output(s) of {} are supported",
                self.n.op_type()
            )));
        }
        outs.truncate(k);
        self.finish_outs(op, inputs, outs)
    }

    fn finish_outs(
        &mut self,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outs: Vec<Option<String>>,
    ) -> R {
        let ids = self.cx.emit(
            self.sc,
            self.n,
            self.n.name.clone(),
            op,
            inputs,
            outs.clone(),
        )?;
        for (name, id) in outs.into_iter().zip(ids) {
            if let (Some(name), Some(id)) = (name, id) {
                self.sc.names.insert(name, id);
            }
        }
        Ok(())
    }

    /// Emits a helper op with one result named `<node>/<suffix>`.
    fn tmp(&mut self, suffix: &str, op: Op, inputs: Vec<Option<ValueId>>) -> R<ValueId> {
        let name = format!("{}/{suffix}", self.n.name);
        let ids = self
            .cx
            .emit(self.sc, self.n, name.clone(), op, inputs, vec![Some(name)])?;
        Ok(ids[0].expect("requested result"))
    }

    fn konst(&mut self, suffix: &str, data: ConstData) -> ValueId {
        self.sc.add_const(format!("{}/{suffix}", self.n.name), data)
    }

    fn i64_const(&mut self, suffix: &str, values: &[i64]) -> ValueId {
        self.konst(suffix, ConstData::from_i64s(values))
    }

    // ---- dispatch ----

    fn run(&mut self) -> R {
        let op = self.n.op_type().to_string();
        let n = self.n;
        if let Some(u) = unary_op(&op) {
            let x = self.req(0)?;
            return self.finish(Op::Unary { op: u }, vec![Some(x)]);
        }
        if let Some(b) = binary_op(&op) {
            let (a, mut b2) = (self.req(0)?, self.req(1)?);
            if n.opset < 7 {
                b2 = if b == BinaryOp::PRelu {
                    self.legacy_prelu_slope(a, b2)?
                } else {
                    self.legacy_broadcast(a, b2)?
                };
            }
            return self.finish(Op::Binary { op: b }, vec![Some(a), Some(b2)]);
        }
        if let Some(kind) = reduce_kind(&op) {
            return self.reduce(kind);
        }
        match op.as_str() {
            "Mod" => {
                let bop = if n.flag("fmod", false)? {
                    BinaryOp::FMod
                } else {
                    BinaryOp::Mod
                };
                let (a, b) = (self.req(0)?, self.req(1)?);
                self.finish(Op::Binary { op: bop }, vec![Some(a), Some(b)])
            }
            "BitShift" => {
                let bop = match n.s("direction", "")?.as_str() {
                    "LEFT" => BinaryOp::ShiftLeft,
                    "RIGHT" => BinaryOp::ShiftRight,
                    d => return Err(n.invalid(format!("direction `{d}` is not LEFT or RIGHT"))),
                };
                let (a, b) = (self.req(0)?, self.req(1)?);
                self.finish(Op::Binary { op: bop }, vec![Some(a), Some(b)])
            }
            "Sum" => self.variadic(BinaryOp::Add, false),
            "Max" => self.variadic(BinaryOp::Max, false),
            "Min" => self.variadic(BinaryOp::Min, false),
            "Mean" => self.variadic(BinaryOp::Add, true),
            "Where" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), Some(self.req(2)?)];
                self.finish(Op::Where, ins)
            }
            "Clip" => self.clip(),
            "Cast" => {
                let to = cast_to_code(n)?;
                let to = dtype_from_onnx(to)
                    .map_err(|e| n.unsupported(format!("unsupported: cast to {e}")))?;
                let x = self.req(0)?;
                self.finish(Op::Cast { to }, vec![Some(x)])
            }
            "CastLike" => {
                let (x, target) = (self.req(0)?, self.req(1)?);
                let to = self.dtype(target);
                self.finish(Op::Cast { to }, vec![Some(x)])
            }
            "LeakyRelu" => self.act(Op::LeakyRelu {
                alpha: n.f("alpha", 0.01)?,
            }),
            "Elu" => self.act(Op::Elu {
                alpha: n.f("alpha", 1.0)?,
            }),
            // Selu-1 had rounder defaults.
            "Selu" if n.opset < 6 => self.act(Op::Selu {
                alpha: n.f("alpha", 1.6732)?,
                gamma: n.f("gamma", 1.0507)?,
            }),
            "Selu" => self.act(Op::Selu {
                alpha: n.f("alpha", 1.673_263_2)?,
                gamma: n.f("gamma", 1.050_701)?,
            }),
            "Celu" => self.act(Op::Celu {
                alpha: n.f("alpha", 1.0)?,
            }),
            "HardSigmoid" => self.act(Op::HardSigmoid {
                alpha: n.f("alpha", 0.2)?,
                beta: n.f("beta", 0.5)?,
            }),
            "ThresholdedRelu" => self.act(Op::ThresholdedRelu {
                alpha: n.f("alpha", 1.0)?,
            }),
            "Shrink" => self.act(Op::Shrink {
                bias: n.f("bias", 0.0)?,
                lambd: n.f("lambd", 0.5)?,
            }),
            "Gelu" => {
                let approximate = match n.s("approximate", "none")?.as_str() {
                    "none" => GeluApprox::None,
                    "tanh" => GeluApprox::Tanh,
                    a => return Err(n.invalid(format!("unknown approximate `{a}`"))),
                };
                self.act(Op::Gelu { approximate })
            }
            "IsInf" => self.act(Op::IsInf {
                detect_negative: n.flag("detect_negative", true)?,
                detect_positive: n.flag("detect_positive", true)?,
            }),
            "Swish" => self.swish(),
            "Identity" => {
                let x = self.req(0)?;
                self.finish(Op::Identity, vec![Some(x)])
            }
            "Dropout" => self.dropout(),
            "Constant" => self.constant(),

            "ArgMax" | "ArgMin" => {
                let x = self.req(0)?;
                let kind = if op == "ArgMax" {
                    ArgKind::Max
                } else {
                    ArgKind::Min
                };
                let axis = self.axis(n.i("axis", 0)?, self.rank(x))?;
                self.finish(
                    Op::ArgReduce {
                        kind,
                        axis,
                        keep_dims: n.flag("keepdims", true)?,
                        select_last_index: n.flag("select_last_index", false)?,
                    },
                    vec![Some(x)],
                )
            }
            "CumSum" | "CumProd" => {
                let kind = if op == "CumSum" {
                    CumKind::Sum
                } else {
                    CumKind::Prod
                };
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::Cumulative {
                        kind,
                        exclusive: n.flag("exclusive", false)?,
                        reverse: n.flag("reverse", false)?,
                    },
                    ins,
                )
            }
            "Softmax" => self.softmax(SoftmaxKind::Softmax),
            "LogSoftmax" => self.softmax(SoftmaxKind::LogSoftmax),
            "Hardmax" => self.softmax(SoftmaxKind::Hardmax),
            "LayerNormalization" => {
                let x = self.req(0)?;
                let axis = self.axis(n.i("axis", -1)?, self.rank(x))?;
                let ins = vec![Some(x), Some(self.req(1)?), self.inp(2)?];
                self.finish_k(
                    Op::LayerNorm {
                        axis,
                        epsilon: n.f("epsilon", 1e-5)?,
                    },
                    ins,
                    3,
                )
            }
            "RMSNormalization" => {
                let x = self.req(0)?;
                let axis = self.axis(n.i("axis", -1)?, self.rank(x))?;
                let ins = vec![Some(x), Some(self.req(1)?)];
                self.finish_k(
                    Op::RmsNorm {
                        axis,
                        epsilon: n.f("epsilon", 1e-5)?,
                    },
                    ins,
                    1,
                )
            }
            "GroupNormalization" => self.group_norm(),
            "InstanceNormalization" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), Some(self.req(2)?)];
                self.finish(
                    Op::InstanceNorm {
                        epsilon: n.f("epsilon", 1e-5)?,
                    },
                    ins,
                )
            }
            "BatchNormalization" => self.batch_norm(),
            "LpNormalization" => {
                let x = self.req(0)?;
                let axis = self.axis(n.i("axis", -1)?, self.rank(x))?;
                self.finish(
                    Op::LpNorm {
                        axis,
                        p: n.i("p", 2)?,
                    },
                    vec![Some(x)],
                )
            }
            "LRN" => self.act(Op::Lrn {
                alpha: n.f("alpha", 1e-4)?,
                beta: n.f("beta", 0.75)?,
                bias: n.f("bias", 1.0)?,
                size: n.i_req("size")?,
            }),
            "MeanVarianceNormalization" => {
                let x = self.req(0)?;
                let axes = n.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
                let axes = self.axes(&axes, self.rank(x))?;
                self.finish(Op::MeanVarianceNorm { axes }, vec![Some(x)])
            }

            "MatMul" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(Op::MatMul, ins)
            }
            "Gemm" => {
                if n.opset < 7 {
                    // Gemm-1/6 broadcast C only with `broadcast=1` (else C is [M, N]); the
                    // IR's unidirectional broadcast of C covers both.
                    n.flag("broadcast", false)?;
                }
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), self.inp(2)?];
                self.finish(
                    Op::Gemm {
                        alpha: n.f("alpha", 1.0)?,
                        beta: n.f("beta", 1.0)?,
                        trans_a: n.flag("transA", false)?,
                        trans_b: n.flag("transB", false)?,
                    },
                    ins,
                )
            }
            "Conv" | "ConvInteger" => {
                let (x, w) = (self.req(0)?, self.req(1)?);
                let c = self.conv_params(x, Some(w), true)?;
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
                let ins = vec![Some(x), Some(w), self.inp(2)?, self.inp(3)?];
                self.finish(op, trim(ins))
            }
            "ConvTranspose" => {
                let (x, w) = (self.req(0)?, self.req(1)?);
                let c = self.conv_params(x, Some(w), true)?;
                let sp = self.rank(x).saturating_sub(2);
                let output_padding = non_empty_or(n.ints("output_padding")?, vec![0; sp]);
                let output_shape = n.ints("output_shape")?.unwrap_or_default();
                let ins = vec![Some(x), Some(w), self.inp(2)?];
                self.finish(
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
            }
            "Einsum" => {
                let equation = n
                    .s_opt("equation")?
                    .ok_or_else(|| n.invalid("missing required attribute `equation`"))?;
                let ins = self.all_inputs()?;
                self.finish(Op::Einsum { equation }, ins)
            }
            "MatMulInteger" => {
                let ins = vec![
                    Some(self.req(0)?),
                    Some(self.req(1)?),
                    self.inp(2)?,
                    self.inp(3)?,
                ];
                self.finish(Op::MatMulInteger, trim(ins))
            }
            "QuantizeLinear" => {
                let (x, scale, zp) = (self.req(0)?, self.req(1)?, self.inp(2)?);
                let axis = lenient_axis(n.i("axis", 1)?, self.rank(x));
                let od = n.i("output_dtype", 0)?;
                let output_dtype = if od != 0 {
                    dtype_from_onnx(od as i32)
                        .map_err(|e| n.unsupported(format!("unsupported: {e}")))?
                } else if let Some(zp) = zp {
                    self.dtype(zp)
                } else {
                    DType::U8
                };
                self.finish(
                    Op::QuantizeLinear {
                        axis,
                        block_size: n.i("block_size", 0)?,
                        output_dtype,
                    },
                    trim(vec![Some(x), Some(scale), zp]),
                )
            }
            "DequantizeLinear" => {
                let (x, scale, zp) = (self.req(0)?, self.req(1)?, self.inp(2)?);
                let axis = lenient_axis(n.i("axis", 1)?, self.rank(x));
                self.finish(
                    Op::DequantizeLinear {
                        axis,
                        block_size: n.i("block_size", 0)?,
                    },
                    trim(vec![Some(x), Some(scale), zp]),
                )
            }
            "DynamicQuantizeLinear" => {
                let x = self.req(0)?;
                self.finish(Op::DynamicQuantizeLinear, vec![Some(x)])
            }
            "Attention" => {
                let ins = self.all_inputs()?;
                if ins.len() < 3 || ins[..3].iter().any(Option::is_none) {
                    return Err(n.invalid("Q, K and V are required"));
                }
                self.finish(
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
            }
            "RotaryEmbedding" => {
                let ins = vec![
                    Some(self.req(0)?),
                    Some(self.req(1)?),
                    Some(self.req(2)?),
                    self.inp(3)?,
                ];
                self.finish(
                    Op::RotaryEmbedding {
                        interleaved: n.flag("interleaved", false)?,
                        num_heads: n.i("num_heads", 0)?,
                        rotary_embedding_dim: n.i("rotary_embedding_dim", 0)?,
                    },
                    trim(ins),
                )
            }

            "DFT" => self.dft(),
            "STFT" => self.stft(),
            "HannWindow" | "HammingWindow" | "BlackmanWindow" => self.window(),
            "MelWeightMatrix" => self.mel_weight_matrix(),
            "RoiAlign" => self.roi_align(),
            "DeformConv" => self.deform_conv(),
            "QLinearMatMul" => self.qlinear_matmul(),
            "QLinearConv" => self.qlinear_conv(),
            "LinearAttention" => self.linear_attention(),
            "CausalConvWithState" => self.causal_conv_with_state(),
            "BitCast" => self.bit_cast(),

            "MaxPool" | "AveragePool" | "LpPool" => self.pool(),
            "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
                let (kind, p) = match op.as_str() {
                    "GlobalAveragePool" => (PoolKind::Average, 0),
                    "GlobalMaxPool" => (PoolKind::Max, 0),
                    _ => (PoolKind::Lp, self.lp_p()?),
                };
                let x = self.req(0)?;
                self.finish(Op::GlobalPool { kind, p }, vec![Some(x)])
            }
            "MaxUnpool" => {
                let kernel_shape = n
                    .ints("kernel_shape")?
                    .ok_or_else(|| n.invalid("missing required attribute `kernel_shape`"))?;
                let sp = kernel_shape.len();
                let strides = non_empty_or(n.ints("strides")?, vec![1; sp]);
                let pads = non_empty_or(n.ints("pads")?, vec![0; 2 * sp]);
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), self.inp(2)?];
                self.finish(
                    Op::MaxUnpool {
                        kernel_shape,
                        strides,
                        pads,
                    },
                    trim(ins),
                )
            }

            "Reshape" => {
                let shape = if n.opset < 5 {
                    // Reshape-1: the shape is an attribute.
                    let s = n
                        .ints("shape")?
                        .ok_or_else(|| n.invalid("missing attribute `shape`"))?;
                    self.i64_const("shape", &s)
                } else {
                    self.req(1)?
                };
                let ins = vec![Some(self.req(0)?), Some(shape)];
                let allow_zero = n.opset >= 14 && n.flag("allowzero", false)?;
                self.finish(Op::Reshape { allow_zero }, ins)
            }
            "Shape" => {
                let x = self.req(0)?;
                let (start, end) = if n.opset >= 15 {
                    (n.i("start", 0)?, n.i_opt("end")?)
                } else {
                    (0, None)
                };
                self.finish(Op::Shape { start, end }, vec![Some(x)])
            }
            "Size" => {
                let x = self.req(0)?;
                self.finish(Op::Size, vec![Some(x)])
            }
            "Transpose" => {
                let x = self.req(0)?;
                let rank = self.rank(x) as i64;
                let perm = match n.ints("perm")? {
                    Some(p) if !p.is_empty() => self.axes(&p, rank as usize)?,
                    _ => (0..rank).rev().collect(),
                };
                self.finish(Op::Transpose { perm }, vec![Some(x)])
            }
            "Squeeze" | "Unsqueeze" => self.squeeze(op == "Unsqueeze"),
            "Flatten" => {
                let x = self.req(0)?;
                let rank = self.rank(x) as i64;
                let mut axis = n.i("axis", 1)?;
                if axis < 0 {
                    axis += rank;
                }
                if !(0..=rank).contains(&axis) {
                    return Err(n.invalid(format!(
                        "axis {} is out of range for rank {rank}",
                        n.i("axis", 1)?
                    )));
                }
                self.finish(Op::Flatten { axis }, vec![Some(x)])
            }
            "Concat" => {
                let ins = (0..n.num_inputs())
                    .map(|i| self.req(i).map(Some))
                    .collect::<R<Vec<_>>>()?;
                let first = ins
                    .first()
                    .copied()
                    .flatten()
                    .ok_or_else(|| n.invalid("no inputs"))?;
                // Concat-1 defaults to axis 1; from Concat-4 it is required.
                let axis = if n.opset < 4 {
                    n.i("axis", 1)?
                } else {
                    n.i_req("axis")?
                };
                let axis = self.axis(axis, self.rank(first))?;
                self.finish(Op::Concat { axis }, ins)
            }
            "Split" => self.split(),
            "Slice" => self.slice(),
            "Gather" | "GatherElements" => {
                let (data, idx) = (self.req(0)?, self.req(1)?);
                let axis = self.axis(n.i("axis", 0)?, self.rank(data))?;
                let op = if op == "Gather" {
                    Op::Gather { axis }
                } else {
                    Op::GatherElements { axis }
                };
                self.finish(op, vec![Some(data), Some(idx)])
            }
            "GatherND" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::GatherNd {
                        batch_dims: n.i("batch_dims", 0)?,
                    },
                    ins,
                )
            }
            "ScatterElements" | "Scatter" | "ScatterND" => {
                let data = self.req(0)?;
                let ins = vec![Some(data), Some(self.req(1)?), Some(self.req(2)?)];
                let reduction = match n.s("reduction", "none")?.as_str() {
                    "none" => ScatterReduction::None,
                    "add" => ScatterReduction::Add,
                    "mul" => ScatterReduction::Mul,
                    "max" => ScatterReduction::Max,
                    "min" => ScatterReduction::Min,
                    r => return Err(n.invalid(format!("unknown reduction `{r}`"))),
                };
                let op = if op == "ScatterND" {
                    Op::ScatterNd { reduction }
                } else {
                    Op::ScatterElements {
                        axis: self.axis(n.i("axis", 0)?, self.rank(data))?,
                        reduction,
                    }
                };
                self.finish(op, ins)
            }
            "Tile" if n.opset < 6 => self.tile1(),
            "Expand" | "Tile" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                let op = if op == "Expand" { Op::Expand } else { Op::Tile };
                self.finish(op, ins)
            }
            "Pad" => self.pad(),
            "ConstantOfShape" => {
                let shape = self.req(0)?;
                let value = match n.tensor("value")? {
                    Some(t) => {
                        let what = format!("node `{}` (ConstantOfShape) value", n.name);
                        let data = self.cx.tensor_data(t, &what)?;
                        first_scalar(&data)
                            .ok_or_else(|| n.invalid("attribute `value` has no elements"))?
                    }
                    None => Scalar::Float(DType::F32, 0.0),
                };
                self.finish(Op::ConstantOfShape { value }, vec![Some(shape)])
            }
            "Range" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), Some(self.req(2)?)];
                self.finish(Op::Range, ins)
            }
            "OneHot" => {
                let idx = self.req(0)?;
                let axis = self.axis(n.i("axis", -1)?, self.rank(idx) + 1)?;
                let ins = vec![Some(idx), Some(self.req(1)?), Some(self.req(2)?)];
                self.finish(Op::OneHot { axis }, ins)
            }
            "Trilu" => {
                let ins = trim(vec![Some(self.req(0)?), self.inp(1)?]);
                self.finish(
                    Op::Trilu {
                        upper: n.flag("upper", true)?,
                    },
                    ins,
                )
            }
            "TopK" => {
                let x = self.req(0)?;
                let k = if n.opset < 10 {
                    let k = n.i_req("k")?;
                    self.i64_const("k", &[k])
                } else {
                    self.req(1)?
                };
                let axis = self.axis(n.i("axis", -1)?, self.rank(x))?;
                self.finish(
                    Op::TopK {
                        axis,
                        largest: n.flag("largest", true)?,
                        sorted: n.flag("sorted", true)?,
                    },
                    vec![Some(x), Some(k)],
                )
            }
            "NonZero" => {
                let x = self.req(0)?;
                self.finish(Op::NonZero, vec![Some(x)])
            }
            "Compress" => {
                let (x, c) = (self.req(0)?, self.req(1)?);
                let axis = match n.i_opt("axis")? {
                    Some(a) => Some(self.axis(a, self.rank(x))?),
                    None => None,
                };
                self.finish(Op::Compress { axis }, vec![Some(x), Some(c)])
            }
            "Unique" => {
                let x = self.req(0)?;
                let axis = match n.i_opt("axis")? {
                    Some(a) => Some(self.axis(a, self.rank(x))?),
                    None => None,
                };
                self.finish(
                    Op::Unique {
                        axis,
                        sorted: n.flag("sorted", true)?,
                    },
                    vec![Some(x)],
                )
            }
            "ReverseSequence" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::ReverseSequence {
                        batch_axis: n.i("batch_axis", 1)?,
                        time_axis: n.i("time_axis", 0)?,
                    },
                    ins,
                )
            }
            "DepthToSpace" => {
                let mode = match n.s("mode", "DCR")?.as_str() {
                    "DCR" => DepthToSpaceMode::Dcr,
                    "CRD" => DepthToSpaceMode::Crd,
                    m => return Err(n.invalid(format!("unknown mode `{m}`"))),
                };
                self.act(Op::DepthToSpace {
                    blocksize: n.i_req("blocksize")?,
                    mode,
                })
            }
            "SpaceToDepth" => self.space_to_depth(),
            "EyeLike" => {
                let x = self.req(0)?;
                let dtype = match n.i_opt("dtype")? {
                    Some(d) => dtype_from_onnx(d as i32)
                        .map_err(|e| n.unsupported(format!("unsupported: {e}")))?,
                    None => self.dtype(x),
                };
                self.finish(
                    Op::EyeLike {
                        dtype,
                        k: n.i("k", 0)?,
                    },
                    vec![Some(x)],
                )
            }
            "Resize" => self.resize(false),
            "Upsample" => self.resize(true),
            "GridSample" => {
                let mode = match n.s("mode", "linear")?.as_str() {
                    "linear" | "bilinear" => GridSampleMode::Linear,
                    "nearest" => GridSampleMode::Nearest,
                    "cubic" | "bicubic" => GridSampleMode::Cubic,
                    m => return Err(n.invalid(format!("unknown mode `{m}`"))),
                };
                let padding_mode = match n.s("padding_mode", "zeros")?.as_str() {
                    "zeros" => GridPadding::Zeros,
                    "border" => GridPadding::Border,
                    "reflection" => GridPadding::Reflection,
                    m => return Err(n.invalid(format!("unknown padding_mode `{m}`"))),
                };
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::GridSample {
                        mode,
                        padding_mode,
                        align_corners: n.flag("align_corners", false)?,
                    },
                    ins,
                )
            }
            "NonMaxSuppression" => {
                let ins = vec![
                    Some(self.req(0)?),
                    Some(self.req(1)?),
                    self.inp(2)?,
                    self.inp(3)?,
                    self.inp(4)?,
                ];
                self.finish(
                    Op::NonMaxSuppression {
                        center_point_box: n.i("center_point_box", 0)?,
                    },
                    trim(ins),
                )
            }
            "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => {
                let reduction = match n.s("reduction", "mean")?.as_str() {
                    "none" => LossReduction::None,
                    "sum" => LossReduction::Sum,
                    "mean" => LossReduction::Mean,
                    r => return Err(n.invalid(format!("unknown reduction `{r}`"))),
                };
                let ignore_index = n.i_opt("ignore_index")?;
                let ins = trim(vec![Some(self.req(0)?), Some(self.req(1)?), self.inp(2)?]);
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
                self.finish(op, ins)
            }
            "SwiGLU" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::SwiGlu {
                        alpha: n.f("alpha", 1.0)?,
                    },
                    ins,
                )
            }
            "Det" => self.act(Op::Det),
            "CenterCropPad" => {
                let x = self.req(0)?;
                let axes = match n.ints("axes")? {
                    Some(a) => self.axes(&a, self.rank(x))?,
                    None => vec![],
                };
                let ins = vec![Some(x), Some(self.req(1)?)];
                self.finish(Op::CenterCropPad { axes }, ins)
            }
            "Col2Im" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?), Some(self.req(2)?)];
                self.finish(
                    Op::Col2Im {
                        dilations: n.ints("dilations")?.unwrap_or_default(),
                        pads: n.ints("pads")?.unwrap_or_default(),
                        strides: n.ints("strides")?.unwrap_or_default(),
                    },
                    ins,
                )
            }
            "AffineGrid" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(
                    Op::AffineGrid {
                        align_corners: n.flag("align_corners", false)?,
                    },
                    ins,
                )
            }
            "TensorScatter" => {
                let past = self.req(0)?;
                let axis = self.axis(n.i("axis", -2)?, self.rank(past))?;
                let mode = match n.s("mode", "linear")?.as_str() {
                    "linear" => TensorScatterMode::Linear,
                    "circular" => TensorScatterMode::Circular,
                    m => return Err(n.invalid(format!("unknown mode `{m}`"))),
                };
                let ins = trim(vec![Some(past), Some(self.req(1)?), self.inp(2)?]);
                self.finish(Op::TensorScatter { axis, mode }, ins)
            }
            "Binarizer" => self.act(Op::Binarizer {
                threshold: n.f("threshold", 0.0)?,
            }),
            "ArrayFeatureExtractor" => {
                let ins = vec![Some(self.req(0)?), Some(self.req(1)?)];
                self.finish(Op::ArrayFeatureExtractor, ins)
            }
            "LabelEncoder" => self.label_encoder(),
            "LSTM" | "GRU" | "RNN" => self.rnn(),
            "If" => self.if_op(),
            "Loop" => self.loop_op(),
            "Scan" => self.scan_op(),
            other => Err(n.unsupported(format!("unsupported op `{other}`"))),
        }
    }

    /// An op of one operand whose attributes are already built.
    fn act(&mut self, op: Op) -> R {
        let x = self.req(0)?;
        self.finish(op, vec![Some(x)])
    }

    // ---- legacy (before opset 7) forms ----

    /// The second operand of a binary op before opset 7, made ready for NumPy broadcasting.
    /// Without `broadcast=1` both operands have one shape. With it, B is a scalar, holds one
    /// element, or its dims match A's from `axis` on (the last ones without `axis`): B gets
    /// trailing unit dims so NumPy broadcasting lines it up at the same place.
    fn legacy_broadcast(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
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
    fn legacy_prelu_slope(&mut self, x: ValueId, slope: ValueId) -> R<ValueId> {
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

    /// Tile-1 (before opset 6): operands input, tiles, axis (scalars of the input's float
    /// type); repeats the input `tiles` times along `axis`.
    fn tile1(&mut self) -> R {
        let n = self.n;
        let (x, tiles, axis) = (self.req(0)?, self.req(1)?, self.req(2)?);
        let rank = self.rank(x);
        let axis = match self.sc.g.const_of(axis).map(|c| c.to_f64s()).as_deref() {
            Some(&[a]) => self.axis(a as i64, rank)? as usize,
            _ => {
                return Err(n.unsupported(format!(
                    "unsupported: dynamic axis (input `{}` is not a one-element constant)",
                    self.sc.g.value(axis).name
                )))
            }
        };
        let reps = match self.sc.g.const_of(tiles).map(|c| c.to_f64s()).as_deref() {
            Some(&[t]) => {
                let mut r = vec![1; rank];
                r[axis] = t as i64;
                self.i64_const("repeats", &r)
            }
            _ => {
                // [1]*axis ++ [tiles] ++ [1]*(rank - axis - 1), built at run time.
                let t = self.tmp("tiles_i64", Op::Cast { to: DType::I64 }, vec![Some(tiles)])?;
                let one = self.i64_const("one_elem", &[1]);
                let t = self.tmp(
                    "tiles_1d",
                    Op::Reshape { allow_zero: false },
                    vec![Some(t), Some(one)],
                )?;
                let mut parts = Vec::new();
                if axis > 0 {
                    parts.push(Some(self.i64_const("ones_before", &vec![1; axis])));
                }
                parts.push(Some(t));
                if axis + 1 < rank {
                    parts.push(Some(
                        self.i64_const("ones_after", &vec![1; rank - axis - 1]),
                    ));
                }
                self.tmp("repeats", Op::Concat { axis: 0 }, parts)?
            }
        };
        self.finish(Op::Tile, vec![Some(x), Some(reps)])
    }

    /// LpPool/GlobalLpPool's `p`: an int, but a float before opset 2.
    fn lp_p(&self) -> R<i64> {
        let n = self.n;
        if n.opset >= 2 {
            return n.i("p", 2);
        }
        let p = n.f("p", 2.0)?;
        if p.fract() != 0.0 || p < 1.0 {
            return Err(n.unsupported(format!("unsupported: p = {p} (only whole p >= 1)")));
        }
        Ok(p as i64)
    }

    fn batch_norm(&mut self) -> R {
        let n = self.n;
        let ins = (0..5)
            .map(|i| self.req(i).map(Some))
            .collect::<R<Vec<_>>>()?;
        // (BatchNormalization-1/6's is_test=0, training mode, is refused by static_check.)
        if n.opset < 9 && !n.flag("spatial", true)? {
            // spatial=0 keeps statistics per channel *and* position ([C, D1, ...]); that is
            // the per-channel batch norm only when there are no spatial dims.
            let x = ins[0].expect("required");
            if self.rank(x) > 2 {
                return Err(n.unsupported(format!(
                    "unsupported: spatial=0 (statistics per channel and position) on {}",
                    self.ty(x)
                )));
            }
        }
        self.finish_k(
            Op::BatchNorm {
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
            1,
        )
    }

    fn variadic(&mut self, op: BinaryOp, mean: bool) -> R {
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

    /// ai.onnx.ml LabelEncoder with integer or float keys and values (attribute lists or,
    /// from version 4, tensors); string ones are unsupported.
    fn label_encoder(&mut self) -> R {
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
    fn ml_tensor(&mut self, name: &str) -> R<Option<ConstData>> {
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

    fn space_to_depth(&mut self) -> R {
        let n = self.n;
        let b = n.i_req("blocksize")?;
        let crd = match n.s("mode", "DCR")?.as_str() {
            "DCR" => false,
            "CRD" => true,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let x = self.req(0)?;
        if !crd {
            return self.finish(Op::SpaceToDepth { blocksize: b }, vec![Some(x)]);
        }
        // The IR's space_to_depth is the DCR order; CRD is spelled out as
        // reshape [N, C, H/b, b, W/b, b] -> transpose -> reshape [N, C*b*b, H/b, W/b].
        let dims = self.ty(x).known_dims().filter(|d| d.len() == 4 && b > 0);
        let Some([nn, c, h, w]) = dims.as_deref().map(|d| [d[0], d[1], d[2], d[3]]) else {
            return Err(n.unsupported(
                "unsupported: SpaceToDepth mode CRD on an input whose shape is not known",
            ));
        };
        let split = self.i64_const("split_shape", &[nn, c, h / b, b, w / b, b]);
        let r = self.tmp(
            "split",
            Op::Reshape { allow_zero: true },
            vec![Some(x), Some(split)],
        )?;
        let t = self.tmp(
            "transpose",
            Op::Transpose {
                perm: vec![0, 1, 3, 5, 2, 4],
            },
            vec![Some(r)],
        )?;
        let merged = self.i64_const("merged_shape", &[nn, c * b * b, h / b, w / b]);
        self.finish(
            Op::Reshape { allow_zero: true },
            vec![Some(t), Some(merged)],
        )
    }

    fn clip(&mut self) -> R {
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

    fn swish(&mut self) -> R {
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

    fn dropout(&mut self) -> R {
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

    fn constant(&mut self) -> R {
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

    fn reduce(&mut self, kind: ReduceKind) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let from_input = axes_input_index(n.op_type(), n.opset).is_some();
        let noop = from_input && n.flag("noop_with_empty_axes", false)?;
        let keep_dims = n.flag("keepdims", true)?;
        let axes = if from_input {
            match self.inp(1)? {
                Some(a) => match self.sc.known_i64s(a) {
                    Some(k) => k,
                    // Known only at run time: the operand.
                    None => {
                        let op = Op::Reduce {
                            kind,
                            axes: vec![],
                            keep_dims,
                            noop_with_empty_axes: noop,
                        };
                        return self.finish(op, vec![Some(x), Some(a)]);
                    }
                },
                None => Vec::new(),
            }
        } else {
            n.ints("axes")?.unwrap_or_default()
        };
        if axes.is_empty() && noop {
            return self.finish(Op::Identity, vec![Some(x)]);
        }
        let mut axes = self.axes(&axes, self.rank(x))?;
        axes.sort_unstable();
        self.finish(
            Op::Reduce {
                kind,
                axes,
                keep_dims,
                noop_with_empty_axes: false,
            },
            vec![Some(x)],
        )
    }

    fn softmax(&mut self, kind: SoftmaxKind) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let rank = self.rank(x);
        let default_axis = if n.opset < 13 { 1 } else { -1 };
        let axis = self.axis(n.i("axis", default_axis)?, rank)?;
        if n.opset >= 13 || axis + 1 == rank as i64 {
            return self.finish(Op::Softmax { kind, axis }, vec![Some(x)]);
        }
        // Before opset 13 the input is coerced to 2-D at `axis` and normalised along the
        // flattened trailing dims.
        let flat = self.tmp("flat", Op::Flatten { axis }, vec![Some(x)])?;
        let sm = self.tmp("softmax2d", Op::Softmax { kind, axis: 1 }, vec![Some(flat)])?;
        let shape = self.tmp(
            "shape",
            Op::Shape {
                start: 0,
                end: None,
            },
            vec![Some(x)],
        )?;
        self.finish(
            Op::Reshape { allow_zero: true },
            vec![Some(sm), Some(shape)],
        )
    }

    fn group_norm(&mut self) -> R {
        let n = self.n;
        let (x, mut scale, mut bias) = (self.req(0)?, self.req(1)?, self.req(2)?);
        let num_groups = n.i_req("num_groups")?;
        if n.opset < 21 {
            // GroupNormalization-18 takes scale and bias per group; the IR (like opset 21)
            // takes them per channel: repeat each group's value C/G times.
            let c = self.ty(x).dims.get(1).and_then(Dim::as_known);
            match c {
                Some(c) if c == num_groups => {}
                Some(c) if num_groups > 0 && c % num_groups == 0 => {
                    let per = c / num_groups;
                    scale = self.per_channel(scale, "scale", num_groups, per, c)?;
                    bias = self.per_channel(bias, "bias", num_groups, per, c)?;
                }
                _ => {
                    return Err(n.unsupported(
                        "unsupported: GroupNormalization-18 per-group scale with an unknown \
                         or indivisible channel count",
                    ))
                }
            }
        }
        self.finish(
            Op::GroupNorm {
                num_groups,
                epsilon: n.f("epsilon", 1e-5)?,
            },
            vec![Some(x), Some(scale), Some(bias)],
        )
    }

    /// `[G]` → `[C]` by repeating each element `per` times.
    fn per_channel(&mut self, v: ValueId, what: &str, g: i64, per: i64, c: i64) -> R<ValueId> {
        let col = self.tmp(
            &format!("{what}_col"),
            Op::Unsqueeze { axes: vec![1] },
            vec![Some(v)],
        )?;
        let shape = self.i64_const(&format!("{what}_gshape"), &[g, per]);
        let wide = self.tmp(
            &format!("{what}_wide"),
            Op::Expand,
            vec![Some(col), Some(shape)],
        )?;
        let flat = self.i64_const(&format!("{what}_cshape"), &[c]);
        self.tmp(
            &format!("{what}_per_channel"),
            Op::Reshape { allow_zero: false },
            vec![Some(wide), Some(flat)],
        )
    }

    fn conv_params(&self, x: ValueId, w: Option<ValueId>, kernel_from_w: bool) -> R<ConvParams> {
        let n = self.n;
        let sp = self.rank(x).saturating_sub(2);
        let kernel = match n.ints("kernel_shape")? {
            Some(k) if !k.is_empty() => k,
            _ if kernel_from_w => w
                .and_then(|w| {
                    let dims = &self.ty(w).dims;
                    dims.get(2..)
                        .and_then(|d| d.iter().map(Dim::as_known).collect::<Option<Vec<_>>>())
                })
                .unwrap_or_default(),
            _ => return Err(n.invalid("missing required attribute `kernel_shape`")),
        };
        let sp = if kernel.is_empty() { sp } else { kernel.len() };
        Ok(ConvParams {
            kernel,
            strides: non_empty_or(n.ints("strides")?, vec![1; sp]),
            pads: non_empty_or(n.ints("pads")?, vec![0; 2 * sp]),
            dilations: non_empty_or(n.ints("dilations")?, vec![1; sp]),
            auto_pad: self.auto_pad()?,
        })
    }

    fn auto_pad(&self) -> R<AutoPad> {
        Ok(match self.n.s("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            a => return Err(self.n.invalid(format!("unknown auto_pad `{a}`"))),
        })
    }

    fn pool(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let c = self.conv_params(x, None, false)?;
        let (kind, p) = match n.op_type() {
            "MaxPool" => (PoolKind::Max, 0),
            "AveragePool" => (PoolKind::Average, 0),
            _ => (PoolKind::Lp, self.lp_p()?),
        };
        // AveragePool-1 has no count_include_pad (it never counts the padding).
        let count_include_pad = n.opset >= 7 && n.flag("count_include_pad", false)?;
        self.finish(
            Op::Pool {
                kind,
                kernel_shape: c.kernel,
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                auto_pad: c.auto_pad,
                ceil_mode: n.flag("ceil_mode", false)?,
                count_include_pad,
                p,
                storage_order: n.i("storage_order", 0)?,
            },
            vec![Some(x)],
        )
    }

    fn squeeze(&mut self, unsqueeze: bool) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let axes = if n.opset >= 13 {
            match self.inp(1)? {
                Some(a) => match self.sc.known_i64s(a) {
                    Some(k) => Some(k),
                    // Known only at run time: the operand.
                    None => {
                        let op = if unsqueeze {
                            Op::Unsqueeze { axes: vec![] }
                        } else {
                            Op::Squeeze { axes: vec![] }
                        };
                        return self.finish(op, vec![Some(x), Some(a)]);
                    }
                },
                None => None,
            }
        } else {
            n.ints("axes")?
        };
        let rank = self.rank(x);
        if unsqueeze {
            let axes = axes.ok_or_else(|| n.invalid("missing axes"))?;
            let mut axes = self.axes(&axes, rank + axes.len())?;
            axes.sort_unstable();
            self.finish(Op::Unsqueeze { axes }, vec![Some(x)])
        } else {
            let mut axes = self.axes(&axes.unwrap_or_default(), rank)?;
            axes.sort_unstable();
            self.finish(Op::Squeeze { axes }, vec![Some(x)])
        }
    }

    fn split(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let axis = if n.opset < 2 {
            n.i_opt("axis")?.ok_or_else(|| {
                n.unsupported("unsupported: Split-1 without `axis` (its default is unspecified)")
            })?
        } else {
            n.i("axis", 0)?
        };
        let axis = self.axis(axis, self.rank(x))?;
        let sizes = if n.opset < 2 {
            // Split-1: sizes from the attribute or from a second input of the data's
            // (float) type.
            match (n.ints("split")?.filter(|s| !s.is_empty()), self.inp(1)?) {
                (Some(_), Some(_)) => {
                    return Err(n.invalid("sizes given both as attribute `split` and as input"))
                }
                (Some(s), None) => Some(self.i64_const("split", &s)),
                (None, Some(v)) => {
                    Some(self.tmp("split_i64", Op::Cast { to: DType::I64 }, vec![Some(v)])?)
                }
                (None, None) => None,
            }
        } else if n.opset < 13 {
            match n.ints("split")? {
                Some(s) if !s.is_empty() => Some(self.i64_const("split", &s)),
                _ => None,
            }
        } else {
            let s = self.inp(1)?;
            self.non_empty(s)
        };
        if let Some(k) = n.i_opt("num_outputs")? {
            if k as usize != n.p.output.len() {
                return Err(n.invalid(format!(
                    "num_outputs is {k} but the node has {} outputs",
                    n.p.output.len()
                )));
            }
        }
        self.finish(Op::Split { axis }, trim(vec![Some(x), sizes]))
    }

    fn slice(&mut self) -> R {
        let n = self.n;
        let data = self.req(0)?;
        let ins = if n.opset < 10 {
            let starts = n
                .ints("starts")?
                .ok_or_else(|| n.invalid("missing required attribute `starts`"))?;
            let ends = n
                .ints("ends")?
                .ok_or_else(|| n.invalid("missing required attribute `ends`"))?;
            let starts = self.i64_const("starts", &starts);
            let ends = self.i64_const("ends", &ends);
            let axes = n.ints("axes")?.map(|a| self.i64_const("axes", &a));
            vec![Some(data), Some(starts), Some(ends), axes]
        } else {
            vec![
                Some(data),
                Some(self.req(1)?),
                Some(self.req(2)?),
                self.inp(3)?,
                self.inp(4)?,
            ]
        };
        self.finish(Op::Slice, trim(ins))
    }

    fn pad(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let mode = match n.s("mode", "constant")?.as_str() {
            "constant" => PadMode::Constant,
            "reflect" => PadMode::Reflect,
            "edge" => PadMode::Edge,
            "wrap" => PadMode::Wrap,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let ins = if n.opset < 11 {
            // Pad-1 calls them `paddings` (same layout).
            let key = if n.opset < 2 { "paddings" } else { "pads" };
            let pads = n
                .ints(key)?
                .ok_or_else(|| n.invalid(format!("missing required attribute `{key}`")))?;
            let pads = self.i64_const("pads", &pads);
            let value = n.f("value", 0.0)?;
            let cv = (mode == PadMode::Constant && value != 0.0)
                .then(|| self.konst("value", scalar_const(self.dtype(x), value as f64)));
            vec![Some(x), Some(pads), cv]
        } else {
            let cv = self.inp(2)?;
            vec![
                Some(x),
                Some(self.req(1)?),
                self.non_empty(cv),
                self.inp(3)?,
            ]
        };
        self.finish(Op::Pad { mode }, trim(ins))
    }

    fn resize(&mut self, upsample: bool) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let old = upsample || n.opset < 11;
        let (roi, scales, sizes) = if upsample && n.opset < 7 {
            // Upsample-1 scales the last two dims of a 4-D input.
            let h = n
                .f_opt("height_scale")?
                .ok_or_else(|| n.invalid("missing required attribute `height_scale`"))?;
            let w = n
                .f_opt("width_scale")?
                .ok_or_else(|| n.invalid("missing required attribute `width_scale`"))?;
            if self.rank(x) != 4 {
                return Err(n.invalid(format!("input must be 4-D, got {}", self.ty(x))));
            }
            let s = ConstData::from_f32s(&[1.0, 1.0, h, w]);
            (None, Some(self.konst("scales", s)), None)
        } else if upsample && n.opset < 9 {
            let s = n
                .floats("scales")?
                .ok_or_else(|| n.invalid("missing required attribute `scales`"))?;
            (
                None,
                Some(self.konst("scales", ConstData::from_f32s(&s))),
                None,
            )
        } else if old {
            (None, Some(self.req(1)?), None)
        } else {
            let (r, s, z) = (self.inp(1)?, self.inp(2)?, self.inp(3)?);
            (self.non_empty(r), self.non_empty(s), self.non_empty(z))
        };
        let mode = match n.s("mode", "nearest")?.as_str() {
            "nearest" => ResizeMode::Nearest,
            "linear" | "bilinear" => ResizeMode::Linear,
            "cubic" | "bicubic" => ResizeMode::Cubic,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let (ctm, nearest_mode) = if old {
            // Upsample and Resize-10 map like ONNX's 10→11 version converter does.
            (CoordTransform::Asymmetric, NearestMode::Floor)
        } else {
            let ctm = match n
                .s("coordinate_transformation_mode", "half_pixel")?
                .as_str()
            {
                "half_pixel" => CoordTransform::HalfPixel,
                "half_pixel_symmetric" => CoordTransform::HalfPixelSymmetric,
                "pytorch_half_pixel" => CoordTransform::PytorchHalfPixel,
                "align_corners" => CoordTransform::AlignCorners,
                "asymmetric" => CoordTransform::Asymmetric,
                "tf_crop_and_resize" => CoordTransform::TfCropAndResize,
                m => {
                    return Err(
                        n.unsupported(format!("unsupported: coordinate_transformation_mode `{m}`"))
                    )
                }
            };
            let nm = match n.s("nearest_mode", "round_prefer_floor")?.as_str() {
                "round_prefer_floor" => NearestMode::RoundPreferFloor,
                "round_prefer_ceil" => NearestMode::RoundPreferCeil,
                "floor" => NearestMode::Floor,
                "ceil" => NearestMode::Ceil,
                m => return Err(n.invalid(format!("unknown nearest_mode `{m}`"))),
            };
            (ctm, nm)
        };
        let axes = match n.ints("axes")? {
            Some(a) => self.axes(&a, self.rank(x))?,
            None => Vec::new(),
        };
        let keep_aspect_ratio_policy = match n.s("keep_aspect_ratio_policy", "stretch")?.as_str() {
            "stretch" => AspectPolicy::Stretch,
            "not_larger" => AspectPolicy::NotLarger,
            "not_smaller" => AspectPolicy::NotSmaller,
            p => return Err(n.invalid(format!("unknown keep_aspect_ratio_policy `{p}`"))),
        };
        self.finish(
            Op::Resize {
                mode,
                coordinate_transformation_mode: ctm,
                nearest_mode,
                cubic_coeff_a: n.f("cubic_coeff_a", -0.75)?,
                exclude_outside: n.flag("exclude_outside", false)?,
                extrapolation_value: n.f("extrapolation_value", 0.0)?,
                antialias: n.flag("antialias", false)?,
                axes,
                keep_aspect_ratio_policy,
            },
            trim(vec![Some(x), roi, scales, sizes]),
        )
    }

    fn rnn(&mut self) -> R {
        let n = self.n;
        let op = n.op_type();
        let direction = match n.s("direction", "forward")?.as_str() {
            "forward" => RnnDirection::Forward,
            "reverse" => RnnDirection::Reverse,
            "bidirectional" => RnnDirection::Bidirectional,
            d => return Err(n.invalid(format!("unknown direction `{d}`"))),
        };
        let num_dir = if direction == RnnDirection::Bidirectional {
            2
        } else {
            1
        };
        let ins = self.all_inputs()?;
        if ins.len() < 3 || ins[..3].iter().any(Option::is_none) {
            return Err(n.invalid("X, W and R are required"));
        }
        let hidden_size = match n.i_opt("hidden_size")? {
            Some(h) => h,
            None => ins[2]
                .and_then(|r| self.ty(r).dims.get(2).and_then(Dim::as_known))
                .ok_or_else(|| n.invalid("missing attribute `hidden_size`"))?,
        };
        let defaults: &[&str] = match op {
            "LSTM" => &["Sigmoid", "Tanh", "Tanh"],
            "GRU" => &["Sigmoid", "Tanh"],
            _ => &["Tanh"],
        };
        let names = n.strings("activations")?.unwrap_or_else(|| {
            (0..num_dir)
                .flat_map(|_| defaults.iter().map(|s| s.to_string()))
                .collect()
        });
        let activations = names
            .iter()
            .map(|s| {
                rnn_activation_index(s)
                    .ok_or_else(|| n.unsupported(format!("unsupported: activation `{s}`")))
            })
            .collect::<R<Vec<_>>>()?;
        let activation_alpha = n.floats("activation_alpha")?.unwrap_or_default();
        let activation_beta = n.floats("activation_beta")?.unwrap_or_default();
        let layout = n.i("layout", 0)?;
        let clip = n.f_opt("clip")?;
        if n.opset < 7 {
            // The *-1 forms' `output_sequence` only said whether Y is required.
            n.i("output_sequence", 0)?;
        }
        let op = match op {
            "LSTM" => Op::Lstm {
                direction,
                hidden_size,
                layout,
                input_forget: n.flag("input_forget", false)?,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
            "GRU" => Op::Gru {
                direction,
                hidden_size,
                layout,
                // GRU-1 has no linear_before_reset (GRU-3 added it, default 0).
                linear_before_reset: n.opset >= 3 && n.flag("linear_before_reset", false)?,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
            _ => Op::Rnn {
                direction,
                hidden_size,
                layout,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
        };
        self.finish(op, trim(ins))
    }

    // ---- control flow ----

    fn if_op(&mut self) -> R {
        let n = self.n;
        let cond = self.req(0)?;
        let (then_gp, else_gp) = (n.graph("then_branch")?, n.graph("else_branch")?);
        if let Some(&[c]) = self.sc.known_i64s(cond).as_deref() {
            // The condition is known at import time: only the taken branch is imported (the
            // other may not even type-check for these inputs).
            return self.inline_branch(if c != 0 { then_gp } else { else_gp });
        }
        let (caps, consts) = self.cx.captures(self.sc, &[then_gp, else_gp])?;
        for (gp, which) in [(then_gp, "then_branch"), (else_gp, "else_branch")] {
            if gp.output.len() != n.p.output.len() {
                return Err(n.invalid(format!(
                    "{which} has {} outputs, the node {}",
                    gp.output.len(),
                    n.p.output.len()
                )));
            }
        }
        let label = |w: &str| format!("{}/{w}", n.name);
        let then_branch = self.cx.import_body(
            self.sc,
            then_gp,
            &label("then_branch"),
            vec![],
            &caps,
            &consts,
        )?;
        let else_branch = self.cx.import_body(
            self.sc,
            else_gp,
            &label("else_branch"),
            vec![],
            &caps,
            &consts,
        )?;
        let mut ins = vec![Some(cond)];
        ins.extend(caps.iter().map(|(_, v)| Some(*v)));
        self.finish(
            Op::If {
                then_branch: Box::new(then_branch),
                else_branch: Box::new(else_branch),
            },
            ins,
        )
    }

    /// Imports a subgraph's nodes into the current graph; its outputs become the node's
    /// outputs (through Identity, so they carry the node's output names).
    fn inline_branch(&mut self, gp: &rafter_onnx_proto::GraphProto) -> R {
        let n = self.n;
        if gp.output.len() != n.p.output.len() {
            return Err(n.invalid(format!(
                "the taken branch has {} outputs, the node {}",
                gp.output.len(),
                n.p.output.len()
            )));
        }
        self.cx.import_nodes(self.sc, gp)?;
        for (k, o) in gp.output.iter().enumerate() {
            let v = self.cx.lookup_output(self.sc, &o.name)?;
            if !n.has_output(k) {
                continue;
            }
            let name = n.p.output[k].clone();
            let ids = self.cx.emit(
                self.sc,
                n,
                format!("{}/out{k}", n.name),
                Op::Identity,
                vec![Some(v)],
                vec![Some(name.clone())],
            )?;
            self.sc.names.insert(name, ids[0].expect("requested"));
        }
        Ok(())
    }

    /// Imports a loop-like body whose first `state.len()` outputs feed back into the
    /// inputs at `offset..`. Starts from the initial state types; where an iteration
    /// changes a dim, the body is re-imported with that dim as a fresh symbol.
    #[allow(clippy::too_many_arguments)]
    fn state_body(
        &mut self,
        gp: &rafter_onnx_proto::GraphProto,
        label: &str,
        prefix: Vec<TensorType>,
        mut state: Vec<TensorType>,
        suffix: Vec<TensorType>,
        out_offset: usize,
        caps: &[(String, ValueId)],
        consts: &[(String, ValueId)],
    ) -> R<rafter_ir::Graph> {
        let n = self.n;
        let mut generalized: Vec<Vec<bool>> = state.iter().map(|t| vec![false; t.rank()]).collect();
        for _round in 0..4 {
            let mut formal = prefix.clone();
            formal.extend(state.iter().cloned());
            formal.extend(suffix.iter().cloned());
            let body = self
                .cx
                .import_body(self.sc, gp, label, formal, caps, consts)?;
            if body.outputs.len() < out_offset + state.len() {
                return Err(n.invalid(format!(
                    "body has {} outputs, needs at least {}",
                    body.outputs.len(),
                    out_offset + state.len()
                )));
            }
            let mut changed = false;
            for (k, st) in state.iter_mut().enumerate() {
                let out = &body.value(body.outputs[out_offset + k]).ty;
                let name = gp.input.get(prefix.len() + k).map(|v| v.name.as_str());
                let name = name.unwrap_or("?");
                if out.dtype != st.dtype {
                    return Err(n.invalid(format!(
                        "loop-carried value `{name}` is {} on entry but the body returns {}",
                        st.dtype, out.dtype
                    )));
                }
                if out.rank() != st.rank() {
                    return Err(n.unsupported(format!(
                        "unsupported: loop-carried value `{name}` changes rank ({st} to {out})"
                    )));
                }
                for ((od, sd), g) in out.dims.iter().zip(&mut st.dims).zip(&mut generalized[k]) {
                    if od != sd && !*g {
                        *g = true;
                        *sd = self.cx.fresh("loop");
                        changed = true;
                    }
                }
            }
            if !changed {
                return Ok(body);
            }
        }
        Err(n.invalid("loop-carried types do not settle"))
    }

    fn loop_op(&mut self) -> R {
        let n = self.n;
        let gp = n.graph("body")?;
        let max_trip = self.inp(0)?;
        let cond = self.inp(1)?;
        let carried = (2..n.num_inputs())
            .map(|i| self.req(i))
            .collect::<R<Vec<_>>>()?;
        if gp.input.len() != 2 + carried.len() {
            return Err(n.invalid(format!(
                "body has {} inputs, expected 2 + {} loop-carried",
                gp.input.len(),
                carried.len()
            )));
        }
        let (caps, consts) = self.cx.captures(self.sc, &[gp])?;
        let prefix = vec![
            TensorType::known(DType::I64, &[]),
            TensorType::known(DType::Bool, &[]),
        ];
        let state = carried.iter().map(|&v| self.ty(v).clone()).collect();
        let label = format!("{}/body", n.name);
        let mut body = self.state_body(gp, &label, prefix, state, vec![], 1, &caps, &consts)?;
        let mut ins = vec![max_trip, cond];
        ins.extend(carried.iter().map(|&v| Some(v)));
        ins.extend(caps.iter().map(|(_, v)| Some(*v)));
        let nc = carried.len();
        let mut outs = n.out_names();
        let scan_outputs = gp.output.len().saturating_sub(1 + nc);
        if !caps.is_empty() && scan_outputs > 0 {
            // `loop` does not record how many trailing operands are captures; with both
            // captures and scan outputs that count is ambiguous. Pass the captures as
            // loop-carried values the body returns unchanged (their final values unused).
            let cap_inputs: Vec<ValueId> = body.inputs[2 + nc..].to_vec();
            body.outputs.splice(1 + nc..1 + nc, cap_inputs);
            let at = nc.min(outs.len());
            outs.splice(at..at, std::iter::repeat_n(None, caps.len()));
        }
        self.finish_outs(
            Op::Loop {
                body: Box::new(body),
            },
            ins,
            outs,
        )
    }

    fn scan_op(&mut self) -> R {
        let n = self.n;
        let gp = n.graph("body")?;
        let num_scan_inputs = n.i_req("num_scan_inputs")?;
        let ins = (0..n.num_inputs())
            .map(|i| self.req(i))
            .collect::<R<Vec<_>>>()?;
        let m = num_scan_inputs as usize;
        if m > ins.len() || num_scan_inputs < 0 {
            return Err(n.invalid(format!(
                "num_scan_inputs is {num_scan_inputs} but the node has {} inputs",
                ins.len()
            )));
        }
        let n_state = ins.len() - m;
        if gp.input.len() != ins.len() {
            return Err(n.invalid(format!(
                "body has {} inputs, the node {}",
                gp.input.len(),
                ins.len()
            )));
        }
        let in_axes = non_empty_or(n.ints("scan_input_axes")?, vec![0; m]);
        let in_dirs = non_empty_or(n.ints("scan_input_directions")?, vec![0; m]);
        if in_axes.len() != m || in_dirs.len() != m {
            return Err(n.invalid("scan_input_axes/directions do not match num_scan_inputs"));
        }
        let mut scan_input_axes = Vec::with_capacity(m);
        let mut slices = Vec::with_capacity(m);
        for (k, &v) in ins[n_state..].iter().enumerate() {
            let ty = self.ty(v).clone();
            let axis = self.axis(in_axes[k], ty.rank())?;
            let mut dims = ty.dims.clone();
            dims.remove(axis as usize);
            slices.push(TensorType::new(ty.dtype, dims));
            scan_input_axes.push(axis);
        }
        let (caps, consts) = self.cx.captures(self.sc, &[gp])?;
        let state = ins[..n_state].iter().map(|&v| self.ty(v).clone()).collect();
        let label = format!("{}/body", n.name);
        let body = self.state_body(gp, &label, vec![], state, slices, 0, &caps, &consts)?;
        let n_scan_out = body.outputs.len().saturating_sub(n_state);
        let out_axes = non_empty_or(n.ints("scan_output_axes")?, vec![0; n_scan_out]);
        let out_dirs = non_empty_or(n.ints("scan_output_directions")?, vec![0; n_scan_out]);
        if out_axes.len() != n_scan_out || out_dirs.len() != n_scan_out {
            return Err(n.invalid("scan_output_axes/directions do not match the scan outputs"));
        }
        let scan_output_axes = out_axes
            .iter()
            .enumerate()
            .map(|(k, &a)| {
                let r = body.value(body.outputs[n_state + k]).ty.rank() + 1;
                self.axis(a, r)
            })
            .collect::<R<Vec<_>>>()?;
        let mut operands: Vec<Option<ValueId>> = ins.iter().map(|&v| Some(v)).collect();
        operands.extend(caps.iter().map(|(_, v)| Some(*v)));
        self.finish(
            Op::Scan {
                body: Box::new(body),
                num_scan_inputs,
                num_captures: caps.len() as i64,
                scan_input_axes,
                scan_input_directions: in_dirs,
                scan_output_axes,
                scan_output_directions: out_dirs,
            },
            operands,
        )
    }
}

struct ConvParams {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
    auto_pad: AutoPad,
}

/// The attribute's value unless absent or empty.
fn non_empty_or(v: Option<Vec<i64>>, default: Vec<i64>) -> Vec<i64> {
    match v {
        Some(v) if !v.is_empty() => v,
        _ => default,
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

/// Drops trailing absent operands.
fn trim(mut ins: Vec<Option<ValueId>>) -> Vec<Option<ValueId>> {
    while matches!(ins.last(), Some(None)) {
        ins.pop();
    }
    ins
}

/// Normalises an axis when it is in range; per-tensor quantization ignores it otherwise.
fn lenient_axis(axis: i64, rank: usize) -> i64 {
    norm_axis(axis, rank).unwrap_or(axis)
}
