//! The decoder's pieces: embedding, attention with its KV cache, feed-forward (dense or
//! MoE), and the output head, written as rafter-ir ops following transformers' modeling
//! code for each architecture (see [`crate::spec::ModelSpec`] for the layer formula).

use rafter_ir::{BinaryOp, DType, FfnActivation, GeluApprox, Op, UnaryOp, ValueId, WeightFormat};

use super::builder::Builder;
use super::quantize::requantize;
use super::{stack_experts, weight_constant, weight_f32, BuildError, KvType, Logits, Present};
use crate::source::{ExpertLayout, ExpertProj, ModelSource, NormWeight, RopePairing, WeightTensor};
use crate::spec::{Activation, AttentionKind, FfnKind, RopeSpec};

/// Builds one decoder into a [`Builder`].
pub(super) struct Decoder<'a> {
    b: &'a mut Builder,
    src: &'a ModelSource,
    ids: ValueId,
    /// The embedding table's constant and format (the tied output head reads it too).
    table: Option<(ValueId, WeightFormat)>,
    /// cos and sin `[1, seq, head_dim/2]` per distinct rope (global, local).
    ropes: Vec<(RopeSpec, ValueId, ValueId)>,
    /// The call's positions as f32 `[seq, 1]`: `past .. past + seq`.
    positions: ValueId,
    /// `[past + seq]` (i64): the cache length after this call, attention's
    /// `nonpad_kv_seqlen`; one value for every layer.
    kv_len: ValueId,
    /// The block format float weights are re-encoded in, if any.
    quantize: Option<WeightFormat>,
    /// The KV cache's element type.
    kv_type: KvType,
}

impl<'a> Decoder<'a> {
    /// `past_key` (any layer's) gives the cached length `past`.
    pub fn new(
        b: &'a mut Builder,
        src: &'a ModelSource,
        ids: ValueId,
        past_key: ValueId,
        quantize: Option<WeightFormat>,
        kv_type: KvType,
    ) -> Result<Decoder<'a>, BuildError> {
        let (positions, kv_len) = positions(b, ids, past_key)?;
        Ok(Decoder {
            b,
            src,
            ids,
            table: None,
            ropes: Vec::new(),
            positions,
            kv_len,
            quantize,
            kv_type,
        })
    }

    /// The source's tensor `name`, or an error naming it.
    fn tensor(&self, name: &str) -> Result<&'a WeightTensor, BuildError> {
        self.src
            .weights
            .get(name)
            .ok_or_else(|| BuildError::Weight {
                name: name.into(),
                msg: "missing from the model source".into(),
            })
    }

    fn weight(&mut self, name: &str) -> Result<(ValueId, WeightFormat), BuildError> {
        let t = self.tensor(name)?;
        let (format, data) = self.encoded(t)?;
        Ok((self.b.constant(name, data), format))
    }

    /// A weight as a constant, re-encoded in the requested block format if any.
    fn encoded(
        &self,
        t: &WeightTensor,
    ) -> Result<(WeightFormat, rafter_ir::ConstData), BuildError> {
        match self.quantize {
            Some(q) => match requantize(t, q)? {
                Some(qt) => weight_constant(&qt),
                None => weight_constant(t),
            },
            None => weight_constant(t),
        }
    }

    /// `linear(x, W)` for weight `name`.
    fn linear(&mut self, node: &str, x: ValueId, name: &str) -> Result<ValueId, BuildError> {
        let (w, format) = self.weight(name)?;
        self.b.op(node, Op::Linear { format }, &[x, w])
    }

    /// `linear(x, W) + b` for weight `name`, with the bias `bias` when the model has one
    /// (added in f32, whatever the bias's stored type: transformers' f32 reference adds it
    /// in the matrix product's f32 output).
    fn linear_biased(
        &mut self,
        node: &str,
        x: ValueId,
        name: &str,
        bias: Option<String>,
    ) -> Result<ValueId, BuildError> {
        let y = self.linear(node, x, name)?;
        let Some(bias) = bias else {
            return Ok(y);
        };
        let t = self.tensor(&bias)?;
        let b = weight_f32(t)?;
        let b = self.b.f32s(&bias, &b);
        self.binary(&format!("{node}.bias"), BinaryOp::Add, y, b)
    }

    /// RMSNorm over the last axis with the scale `name` (as the source's convention says).
    fn norm(&mut self, node: &str, x: ValueId, name: &str) -> Result<ValueId, BuildError> {
        let t = self.tensor(name)?;
        let mut scale = weight_f32(t)?;
        if self.src.conventions.norm_weight == NormWeight::OnePlus {
            // Gemma3RMSNorm: x * (1 + w), the sum taken in f32.
            scale.iter_mut().for_each(|w| *w += 1.0);
        }
        let s = self.b.f32s(name, &scale);
        let axis = self.b.ty(x).rank() as i64 - 1;
        let epsilon = self.src.spec.rms_norm_eps as f32;
        self.b.op(node, Op::RmsNorm { axis, epsilon }, &[x, s])
    }

    fn binary(
        &mut self,
        node: &str,
        op: BinaryOp,
        a: ValueId,
        c: ValueId,
    ) -> Result<ValueId, BuildError> {
        self.b.op(node, Op::Binary { op }, &[a, c])
    }

    fn unary(&mut self, node: &str, op: UnaryOp, a: ValueId) -> Result<ValueId, BuildError> {
        self.b.op(node, Op::Unary { op }, &[a])
    }

    /// Token embeddings, scaled for Gemma.
    pub fn embed(&mut self) -> Result<ValueId, BuildError> {
        let (table, format) = self.weight("model.embed_tokens.weight")?;
        self.table = Some((table, format));
        let x = self
            .b
            .op("embed", Op::Embedding { format }, &[table, self.ids])?;
        match self.src.spec.embedding_scale {
            Some(s) => {
                let k = self.b.f32_scalar("embed.scale", s as f32);
                self.binary("embed.scaled", BinaryOp::Mul, x, k)
            }
            None => Ok(x),
        }
    }

    /// The cos and sin of `rope` at this call's positions, `[1, seq, head_dim/2]` each.
    fn rope(&mut self, layer: usize) -> Result<(ValueId, ValueId), BuildError> {
        let spec = &self.src.spec;
        let rope = spec.rope_for_layer(layer).clone();
        if let Some((_, c, s)) = self.ropes.iter().find(|(r, _, _)| *r == rope) {
            return Ok((*c, *s));
        }
        let tag = format!("rope{}", self.ropes.len());
        // transformers computes inv_freq and the angles in f32.
        let inv: Vec<f32> = rope
            .inv_freq(spec.head_dim)
            .iter()
            .map(|&f| f as f32)
            .collect();
        let inv = self.b.f32s(&format!("{tag}.inv_freq"), &inv);
        let angles = self.binary(&format!("{tag}.angles"), BinaryOp::Mul, self.positions, inv)?;
        let mut cos = self.unary(&format!("{tag}.cos"), UnaryOp::Cos, angles)?;
        let mut sin = self.unary(&format!("{tag}.sin"), UnaryOp::Sin, angles)?;
        let factor = rope.attention_factor();
        if factor != 1.0 {
            let k = self.b.f32_scalar(&format!("{tag}.factor"), factor as f32);
            cos = self.binary(&format!("{tag}.cos_scaled"), BinaryOp::Mul, cos, k)?;
            sin = self.binary(&format!("{tag}.sin_scaled"), BinaryOp::Mul, sin, k)?;
        }
        let unsq = |d: &mut Self, v: ValueId, n: &str| -> Result<ValueId, BuildError> {
            d.b.op(n, Op::Unsqueeze { axes: vec![0] }, &[v])
        };
        let cos = unsq(self, cos, &format!("{tag}.cos3"))?;
        let sin = unsq(self, sin, &format!("{tag}.sin3"))?;
        self.ropes.push((rope, cos, sin));
        Ok((cos, sin))
    }

    /// RMSNorm of each head of `x` `[1, seq, heads*d]` (Qwen3's and Gemma 3's q/k norms).
    fn head_norm(
        &mut self,
        node: &str,
        x: ValueId,
        heads: usize,
        name: &str,
    ) -> Result<ValueId, BuildError> {
        let d = self.src.spec.head_dim as i64;
        let split = self
            .b
            .i64s(&format!("{node}.split"), &[0, 0, heads as i64, d]);
        let merge = self
            .b
            .i64s(&format!("{node}.merge"), &[0, 0, heads as i64 * d]);
        let x4 = self.b.op(
            &format!("{node}.heads"),
            Op::Reshape { allow_zero: false },
            &[x, split],
        )?;
        let n = self.norm(node, x4, name)?;
        self.b.op(
            &format!("{node}.merged"),
            Op::Reshape { allow_zero: false },
            &[n, merge],
        )
    }

    /// One layer: returns the residual stream after it and the layer's new KV cache.
    pub fn layer(
        &mut self,
        l: usize,
        x: ValueId,
        past_k: ValueId,
        past_v: ValueId,
    ) -> Result<(ValueId, Present), BuildError> {
        let spec = &self.src.spec;
        let (hq, hkv) = (spec.num_heads, spec.num_kv_heads);
        let kind = spec.layers[l];
        let (sandwich, qk_norm) = (spec.sandwich_norms, spec.qk_norm);
        let p = format!("model.layers.{l}");
        let n = |s: &str| format!("layers.{l}.{s}");

        // Attention.
        let h = self.norm(&n("attn_norm"), x, &format!("{p}.input_layernorm.weight"))?;
        let proj = |name: &str| format!("{p}.self_attn.{name}.weight");
        let bias = |on: bool, name: &str| on.then(|| format!("{p}.self_attn.{name}.bias"));
        let (qkv_bias, o_bias) = (spec.qkv_bias, spec.o_bias);
        let mut q = self.linear_biased(&n("q"), h, &proj("q_proj"), bias(qkv_bias, "q_proj"))?;
        let mut k = self.linear_biased(&n("k"), h, &proj("k_proj"), bias(qkv_bias, "k_proj"))?;
        let v = self.linear_biased(&n("v"), h, &proj("v_proj"), bias(qkv_bias, "v_proj"))?;
        if qk_norm {
            q = self.head_norm(&n("q_norm"), q, hq, &format!("{p}.self_attn.q_norm.weight"))?;
            k = self.head_norm(
                &n("k_norm"),
                k,
                hkv,
                &format!("{p}.self_attn.k_norm.weight"),
            )?;
        }
        let (cos, sin) = self.rope(l)?;
        let interleaved = self.src.conventions.rope_pairing == RopePairing::Interleaved;
        let rot = |heads: usize| Op::RotaryEmbedding {
            interleaved,
            num_heads: heads as i64,
            rotary_embedding_dim: 0,
        };
        let q = self.b.op(&n("q_rope"), rot(hq), &[q, cos, sin])?;
        let k = self.b.op(&n("k_rope"), rot(hkv), &[k, cos, sin])?;
        let (k, v) = match self.kv_type {
            KvType::F32 => (k, v),
            // Rounded once as they enter the cache (f32 -> f16, nearest-even).
            KvType::F16 => {
                let to = Op::Cast { to: DType::F16 };
                let k = self.b.op(&n("k_cache_f16"), to.clone(), &[k])?;
                let v = self.b.op(&n("v_cache_f16"), to, &[v])?;
                (k, v)
            }
        };
        let present_k = self
            .b
            .op(&n("present_key"), Op::Concat { axis: 1 }, &[past_k, k])?;
        let present_v = self
            .b
            .op(&n("present_value"), Op::Concat { axis: 1 }, &[past_v, v])?;
        let total = self.kv_len;
        let window = match (kind.attention, &spec.sliding_window) {
            (AttentionKind::Sliding, Some(w)) => w.size as i64 - 1,
            _ => -1,
        };
        let attn = Op::Attention {
            is_causal: true,
            kv_num_heads: hkv as i64,
            q_num_heads: hq as i64,
            qk_matmul_output_mode: 0,
            scale: Some(spec.attention_scale as f32),
            softcap: spec.attn_logit_softcapping.unwrap_or(0.0) as f32,
            left_window_size: window,
            right_window_size: -1,
        };
        let a = self.b.node(
            &n("attention"),
            attn,
            &[
                Some(q),
                Some(present_k),
                Some(present_v),
                None,
                None,
                None,
                Some(total),
            ],
        )?;
        let mut o = self.linear_biased(&n("o"), a, &proj("o_proj"), bias(o_bias, "o_proj"))?;
        if sandwich {
            o = self.norm(
                &n("attn_post_norm"),
                o,
                &format!("{p}.post_attention_layernorm.weight"),
            )?;
        }
        let x = self.binary(&n("attn_residual"), BinaryOp::Add, x, o)?;

        // Feed-forward.
        let pre = if sandwich {
            format!("{p}.pre_feedforward_layernorm.weight")
        } else {
            format!("{p}.post_attention_layernorm.weight")
        };
        let h = self.norm(&n("ffn_norm"), x, &pre)?;
        let mut m = match kind.ffn {
            FfnKind::Dense => self.dense_ffn(l, h)?,
            FfnKind::Moe => self.moe_ffn(l, h)?,
        };
        if sandwich {
            m = self.norm(
                &n("ffn_post_norm"),
                m,
                &format!("{p}.post_feedforward_layernorm.weight"),
            )?;
        }
        let x = self.binary(&n("ffn_residual"), BinaryOp::Add, x, m)?;
        Ok((x, (present_k, present_v)))
    }

    /// `down(act(gate(h)) * up(h))`.
    fn dense_ffn(&mut self, l: usize, h: ValueId) -> Result<ValueId, BuildError> {
        let p = format!("model.layers.{l}.mlp");
        let n = |s: &str| format!("layers.{l}.{s}");
        let g = self.linear(&n("gate"), h, &format!("{p}.gate_proj.weight"))?;
        let u = self.linear(&n("up"), h, &format!("{p}.up_proj.weight"))?;
        let a = match self.src.spec.activation {
            Activation::Silu => {
                let s = self.unary(&n("gate_sigmoid"), UnaryOp::Sigmoid, g)?;
                self.binary(&n("gate_silu"), BinaryOp::Mul, g, s)?
            }
            Activation::GeluTanh => self.b.op(
                &n("gate_gelu"),
                Op::Gelu {
                    approximate: GeluApprox::Tanh,
                },
                &[g],
            )?,
        };
        let m = self.binary(&n("gated"), BinaryOp::Mul, a, u)?;
        self.linear(&n("down"), m, &format!("{p}.down_proj.weight"))
    }

    /// Routed experts over the tokens of the call, as `[seq, hidden]` rows.
    fn moe_ffn(&mut self, l: usize, h: ValueId) -> Result<ValueId, BuildError> {
        let spec = &self.src.spec;
        let moe = spec
            .moe
            .clone()
            .ok_or_else(|| BuildError::Node(format!("layer {l} is MoE without MoE parameters")))?;
        let hidden = spec.hidden_size as i64;
        let act = match spec.activation {
            Activation::Silu => FfnActivation::Silu,
            Activation::GeluTanh => FfnActivation::GeluTanh,
        };
        let p = format!("model.layers.{l}.mlp");
        let n = |s: &str| format!("layers.{l}.{s}");
        let rows = self.b.i64s(&n("moe.rows"), &[-1, hidden]);
        let back = self.b.i64s(&n("moe.back"), &[1, -1, hidden]);
        let h2 = self.b.op(
            &n("moe.tokens"),
            Op::Reshape { allow_zero: false },
            &[h, rows],
        )?;
        let logits = self.linear(&n("router"), h2, &format!("{p}.gate.weight"))?;
        let mut experts = Vec::with_capacity(3);
        for proj in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
            let (format, data) = match self.src.conventions.experts {
                ExpertLayout::Stacked => {
                    let name = format!("{p}.experts.{}.weight", proj_name(proj));
                    let t = self.tensor(&name)?;
                    self.encoded(t)?
                }
                _ => {
                    let parts = (0..moe.num_experts)
                        .map(|e| {
                            self.src
                                .weights
                                .expert(l, e, proj)
                                .ok_or_else(|| BuildError::Weight {
                                    name: format!("{p}.experts.{e}.{}.weight", proj_name(proj)),
                                    msg: "missing from the model source".into(),
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    let parts = match self.quantize {
                        Some(q) => parts
                            .iter()
                            .map(|p| Ok(requantize(p, q)?.unwrap_or_else(|| p.clone())))
                            .collect::<Result<Vec<_>, BuildError>>()?,
                        None => parts,
                    };
                    stack_experts(&parts)?
                }
            };
            let c = self
                .b
                .constant(&format!("{p}.experts.{}", proj_name(proj)), data);
            experts.push((c, format));
        }
        let op = Op::MoeFfn {
            top_k: moe.experts_per_token as i64,
            normalize: moe.norm_topk_prob,
            activation: act,
            gate_format: experts[0].1,
            up_format: experts[1].1,
            down_format: experts[2].1,
        };
        let y = self.b.op(
            &n("moe"),
            op,
            &[h2, logits, experts[0].0, experts[1].0, experts[2].0],
        )?;
        self.b
            .op(&n("moe.out"), Op::Reshape { allow_zero: false }, &[y, back])
    }

    /// Final norm, output projection (tied to the embedding or not), soft-capping.
    pub fn head(&mut self, x: ValueId, logits: Logits) -> Result<ValueId, BuildError> {
        let x = match logits {
            Logits::All => x,
            Logits::Last => {
                // x[:, -1:, :] as a gather of position -1 (kept as an axis of 1).
                let index = self.b.i64s("last.index", &[-1]);
                self.b.op("last", Op::Gather { axis: 1 }, &[x, index])?
            }
        };
        let h = self.norm("final_norm", x, "model.norm.weight")?;
        let (w, format) = if self.src.spec.tie_word_embeddings {
            self.table
                .ok_or_else(|| BuildError::Node("the head is built before the embedding".into()))?
        } else {
            self.weight("lm_head.weight")?
        };
        // The last node is named `logits`, the name callers look for.
        match self.src.spec.final_logit_softcapping {
            None => self.b.op("logits", Op::Linear { format }, &[h, w]),
            Some(cap) => {
                let y = self.b.op("logits.raw", Op::Linear { format }, &[h, w])?;
                let c = self.b.f32_scalar("logits.cap", cap as f32);
                let s = self.binary("logits.scaled", BinaryOp::Div, y, c)?;
                let t = self.unary("logits.tanh", UnaryOp::Tanh, s)?;
                self.binary("logits", BinaryOp::Mul, t, c)
            }
        }
    }
}

fn proj_name(p: ExpertProj) -> &'static str {
    match p {
        ExpertProj::Gate => "gate_proj",
        ExpertProj::Up => "up_proj",
        ExpertProj::Down => "down_proj",
    }
}

/// The call's positions `past .. past + seq` as f32 `[seq, 1]`, `past` read from the
/// cache's length and `seq` from the tokens; and `[past + seq]` as i64.
fn positions(
    b: &mut Builder,
    ids: ValueId,
    past_key: ValueId,
) -> Result<(ValueId, ValueId), BuildError> {
    let dim1 = Op::Shape {
        start: 1,
        end: Some(2),
    };
    let past = b.op("positions.past", dim1.clone(), &[past_key])?;
    let seq = b.op("positions.seq", dim1, &[ids])?;
    let squeeze = Op::Squeeze { axes: vec![0] };
    let start = b.op("positions.start", squeeze.clone(), &[past])?;
    let count = b.op("positions.count", squeeze, &[seq])?;
    let end = b.op(
        "positions.end",
        Op::Binary { op: BinaryOp::Add },
        &[start, count],
    )?;
    let one = b.i64s("positions.one", &[1]);
    let one = b.op("positions.step", Op::Squeeze { axes: vec![0] }, &[one])?;
    let pos = b.op("positions", Op::Range, &[start, end, one])?;
    let pos = b.op(
        "positions.f32",
        Op::Cast {
            to: rafter_ir::DType::F32,
        },
        &[pos],
    )?;
    let col = b.op("positions.col", Op::Unsqueeze { axes: vec![1] }, &[pos])?;
    let kv_len = b.op("kv_len", Op::Unsqueeze { axes: vec![0] }, &[end])?;
    Ok((col, kv_len))
}
