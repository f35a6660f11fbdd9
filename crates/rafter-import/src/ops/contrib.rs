//! ONNX Runtime's contrib ops (`com.microsoft`, opset 1) that fuse activations,
//! normalisations and matmuls: each is decomposed at import into IR ops with ORT's
//! semantics (`docs/ContribOperators.md` of microsoft/onnxruntime), so the compiler fuses
//! them again its own way. The quantized, QLinear/QGemm, attention and convolution
//! contrib ops are in `contrib_quant.rs`, `contrib_qlinear.rs`, `contrib_attention.rs` and
//! `contrib_conv.rs`; `docs/contrib-ops.md` lists them all.

use super::registry::OnnxOp;
use super::{Tr, R};
use crate::node::NodeView;
use rafter_ir::{BinaryOp, ConstData, DType, GeluApprox, Op, ReduceKind, Scalar, UnaryOp, ValueId};

/// ORT's default `epsilon` of SkipLayerNormalization, SkipSimplifiedLayerNormalization and
/// EmbedLayerNormalization (`kDefaultSkipLayerNormEpsilon`, `kDefaultEmbedLayerNormEpsilon`).
const SKIP_LN_EPSILON: f32 = 1e-12;

/// The fused activation, normalisation and matmul contrib ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("Gelu", |t| {
        t.act(Op::Gelu {
            approximate: GeluApprox::None,
        })
    }),
    OnnxOp::new("BiasGelu", |t| {
        let s = t.bias_sum()?;
        t.finish(
            Op::Gelu {
                approximate: GeluApprox::None,
            },
            vec![Some(s)],
        )
    }),
    OnnxOp::new("FastGelu", |t| {
        let s = t.bias_sum()?;
        t.finish(
            Op::Gelu {
                approximate: GeluApprox::Tanh,
            },
            vec![Some(s)],
        )
    }),
    OnnxOp::new("QuickGelu", quick_gelu),
    OnnxOp::new("BiasAdd", |t| {
        let (x, bias, skip) = (t.req(0)?, t.req(1)?, t.req(2)?);
        let s = t.bin("bias", BinaryOp::Add, x, bias)?;
        t.finish(Op::Binary { op: BinaryOp::Add }, vec![Some(s), Some(skip)])
    }),
    OnnxOp::new("FusedMatMul", fused_matmul).checked(check_fused_matmul),
    OnnxOp::new("SkipLayerNormalization", |t| t.skip_norm(false)).checked(check_no_statistics),
    OnnxOp::new("SkipSimplifiedLayerNormalization", |t| t.skip_norm(true))
        .checked(check_no_statistics),
    OnnxOp::new("EmbedLayerNormalization", embed_layer_norm),
];

/// ORT ops registered in the default ONNX domain (rather than `com.microsoft`) that
/// ONNX itself does not define.
pub(super) const ORT_DEFAULT_DOMAIN_OPS: &[OnnxOp] =
    &[OnnxOp::new("SimplifiedLayerNormalization", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axis = t.axis(n.i("axis", -1)?, t.rank(x))?;
        let ins = vec![Some(x), Some(t.req(1)?)];
        t.finish_k(
            Op::RmsNorm {
                axis,
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
            1,
        )
    })];

/// `Skip*LayerNormalization`'s mean and inverse-std outputs (1 and 2) are training
/// statistics rafter does not compute.
fn check_no_statistics(n: &NodeView<'_>) -> Result<(), String> {
    if n.has_output(1) || n.has_output(2) {
        return Err("unsupported: the mean / inv_std_var outputs (1, 2) are requested".into());
    }
    Ok(())
}

/// FusedMatMul's batch transposes (`transBatchA`/`transBatchB`) are not translated.
fn check_fused_matmul(n: &NodeView<'_>) -> Result<(), String> {
    for a in ["transBatchA", "transBatchB"] {
        if n.attr(a).is_some_and(|a| a.i != 0) {
            return Err(format!("unsupported: {a}=1"));
        }
    }
    Ok(())
}

/// `QuickGelu`: `x * sigmoid(alpha * x)`.
fn quick_gelu(t: &mut Tr<'_, '_, '_>) -> R {
    let alpha = t.n.f("alpha", 1.702)?;
    let x = t.req(0)?;
    let a = t.scalar("alpha", alpha as f64, t.dtype(x))?;
    let ax = t.bin("ax", BinaryOp::Mul, x, a)?;
    let s = t.un("sigmoid", UnaryOp::Sigmoid, ax)?;
    t.finish(Op::Binary { op: BinaryOp::Mul }, vec![Some(x), Some(s)])
}

/// `FusedMatMul`: `alpha * op(A) @ op(B)`, `op` transposing the last two dims when
/// `transA` / `transB`.
fn fused_matmul(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let (mut a, mut b) = (t.req(0)?, t.req(1)?);
    n.i("transBatchA", 0)?;
    n.i("transBatchB", 0)?;
    if n.flag("transA", false)? {
        a = t.transpose_last2("a_t", a)?;
    }
    if n.flag("transB", false)? {
        b = t.transpose_last2("b_t", b)?;
    }
    let alpha = n.f("alpha", 1.0)?;
    if alpha == 1.0 {
        return t.finish(Op::MatMul, vec![Some(a), Some(b)]);
    }
    let y = t.tmp("matmul", Op::MatMul, vec![Some(a), Some(b)])?;
    let s = t.scalar("alpha", alpha as f64, t.dtype(y))?;
    t.finish(Op::Binary { op: BinaryOp::Mul }, vec![Some(y), Some(s)])
}

/// `EmbedLayerNormalization`: word + position (+ segment) embeddings, layer-normalised;
/// output 1 is the mask index (per-batch count of mask ones, int32; zeros without a mask),
/// output 2 the embedding sum before normalisation.
fn embed_layer_norm(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let ids = t.req(0)?;
    let (seg_ids, word, pos) = (t.inp(1)?, t.req(2)?, t.req(3)?);
    let (seg, gamma, beta) = (t.inp(4)?, t.req(5)?, t.req(6)?);
    let (mask, pos_ids) = (t.inp(7)?, t.inp(8)?);
    let epsilon = n.f("epsilon", SKIP_LN_EPSILON)?;
    let mask_index_type = n.i("mask_index_type", 1)?;
    let we = t.tmp("word", Op::Gather { axis: 0 }, vec![Some(word), Some(ids)])?;
    let pe = match pos_ids {
        Some(p) => t.tmp("position", Op::Gather { axis: 0 }, vec![Some(pos), Some(p)])?,
        None => {
            // Positions 0..seq: the table's first `seq` rows, broadcast over the batch.
            let seq = t.tmp(
                "seq",
                Op::Shape {
                    start: 1,
                    end: Some(2),
                },
                vec![Some(ids)],
            )?;
            let (zero, axis) = (t.i64_const("zero", &[0]), t.i64_const("axis0", &[0]));
            t.tmp(
                "position",
                Op::Slice,
                vec![Some(pos), Some(zero), Some(seq), Some(axis)],
            )?
        }
    };
    let mut sum = t.bin("word_pos", BinaryOp::Add, we, pe)?;
    if let (Some(sid), Some(se)) = (seg_ids, seg) {
        let s = t.tmp("segment", Op::Gather { axis: 0 }, vec![Some(se), Some(sid)])?;
        sum = t.bin("embedding_sum", BinaryOp::Add, sum, s)?;
    }
    let out0 = n.out_names().into_iter().next().flatten();
    t.finish_outs(
        Op::LayerNorm { axis: -1, epsilon },
        vec![Some(sum), Some(gamma), Some(beta)],
        vec![out0],
    )?;
    if n.has_output(1) {
        if mask_index_type != 1 {
            return Err(n.unsupported(format!(
                "unsupported: mask_index output with mask_index_type={mask_index_type}"
            )));
        }
        let idx = match mask {
            Some(m) => {
                let s = t.tmp(
                    "mask_sum",
                    Op::Reduce {
                        kind: ReduceKind::Sum,
                        axes: vec![1],
                        keep_dims: false,
                        noop_with_empty_axes: false,
                    },
                    vec![Some(m)],
                )?;
                t.tmp("mask_index", Op::Cast { to: DType::I32 }, vec![Some(s)])?
            }
            None => {
                let b = t.tmp(
                    "batch",
                    Op::Shape {
                        start: 0,
                        end: Some(1),
                    },
                    vec![Some(ids)],
                )?;
                t.tmp(
                    "mask_index",
                    Op::ConstantOfShape {
                        value: Scalar::Int(DType::I32, 0),
                    },
                    vec![Some(b)],
                )?
            }
        };
        t.bind(1, idx)?;
    }
    t.bind(2, sum)
}

impl Tr<'_, '_, '_> {
    /// Operand 0 plus operand 1 when present (the bias of BiasGelu / FastGelu).
    fn bias_sum(&mut self) -> R<ValueId> {
        let x = self.req(0)?;
        match self.inp(1)? {
            Some(b) => self.bin("bias", BinaryOp::Add, x, b),
            None => Ok(x),
        }
    }

    /// `SkipLayerNormalization` (`simplified`: `SkipSimplifiedLayerNormalization`):
    /// `s = input + skip (+ bias)`, then layer (RMS) norm over the last axis; output 3 is `s`.
    fn skip_norm(&mut self, simplified: bool) -> R {
        let n = self.n;
        let (x, skip, gamma) = (self.req(0)?, self.req(1)?, self.req(2)?);
        let (beta, bias) = if simplified {
            (None, self.inp(3)?)
        } else {
            (self.inp(3)?, self.inp(4)?)
        };
        let epsilon = n.f("epsilon", SKIP_LN_EPSILON)?;
        let mut s = self.bin("skip", BinaryOp::Add, x, skip)?;
        if let Some(b) = bias {
            s = self.bin("skip_bias", BinaryOp::Add, s, b)?;
        }
        let out0 = n.out_names().into_iter().next().flatten();
        if simplified {
            self.finish_outs(
                Op::RmsNorm { axis: -1, epsilon },
                vec![Some(s), Some(gamma)],
                vec![out0],
            )?;
        } else {
            self.finish_outs(
                Op::LayerNorm { axis: -1, epsilon },
                vec![Some(s), Some(gamma), beta],
                vec![out0],
            )?;
        }
        self.bind(3, s)
    }

    // ---- helpers of the decompositions ----

    /// Names ONNX output `i` (when the node has it) after `v`, through an identity.
    pub(super) fn bind(&mut self, i: usize, v: ValueId) -> R {
        if !self.n.has_output(i) {
            return Ok(());
        }
        let name = self.n.out_names()[i].clone();
        self.finish_outs(Op::Identity, vec![Some(v)], vec![name])
    }

    /// A rank-0 constant `value` of float type `dt`.
    pub(super) fn scalar(&mut self, suffix: &str, value: f64, dt: DType) -> R<ValueId> {
        let bytes: Vec<u8> = match dt {
            DType::F32 => (value as f32).to_le_bytes().to_vec(),
            DType::F64 => value.to_le_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
            other => {
                return Err(self
                    .n
                    .unsupported(format!("unsupported: element type {other} (want a float)")))
            }
        };
        let data = ConstData::new(dt, vec![], bytes.into()).expect("one element");
        Ok(self.konst(suffix, data))
    }

    pub(super) fn un(&mut self, suffix: &str, op: UnaryOp, x: ValueId) -> R<ValueId> {
        self.tmp(suffix, Op::Unary { op }, vec![Some(x)])
    }

    pub(super) fn bin(&mut self, suffix: &str, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        self.tmp(suffix, Op::Binary { op }, vec![Some(a), Some(b)])
    }

    /// `x` with its last two dims swapped.
    pub(super) fn transpose_last2(&mut self, suffix: &str, x: ValueId) -> R<ValueId> {
        let r = self.rank(x);
        if r < 2 {
            return Err(self
                .n
                .invalid(format!("cannot transpose an operand of rank {r}")));
        }
        let mut perm: Vec<i64> = (0..r as i64).collect();
        perm.swap(r - 2, r - 1);
        self.tmp(suffix, Op::Transpose { perm }, vec![Some(x)])
    }

    /// `x[..., start..end]` along `axis`.
    pub(super) fn slice_axis(
        &mut self,
        suffix: &str,
        x: ValueId,
        axis: i64,
        start: i64,
        end: i64,
    ) -> R<ValueId> {
        let s = self.i64_const(&format!("{suffix}_start"), &[start]);
        let e = self.i64_const(&format!("{suffix}_end"), &[end]);
        let a = self.i64_const(&format!("{suffix}_axis"), &[axis]);
        self.tmp(suffix, Op::Slice, vec![Some(x), Some(s), Some(e), Some(a)])
    }
}
