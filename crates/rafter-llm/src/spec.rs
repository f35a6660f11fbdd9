//! [`ModelSpec`]: everything about a decoder-only LLM that is not a weight.
//!
//! A spec is the same whatever file it came from: the HF folder reader and the GGUF reader
//! both fill it in, with field names and units of transformers' configs (`rope_theta`,
//! `rms_norm_eps`, `num_key_value_heads`, ...). What differs between the sources is how
//! the weights must be *used* (rope pairing, norm offsets, expert layout); that lives in
//! [`crate::source::Conventions`], not here.

use std::fmt;

/// The architectures rafter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`, GGUF `qwen2`): Llama-style blocks with
    /// biases on the query, key and value projections.
    Qwen2,
    /// Qwen3 dense (`Qwen3ForCausalLM`, GGUF `qwen3`): Llama-style blocks with RMSNorm on
    /// each head's queries and keys.
    Qwen3,
    /// Qwen3 mixture of experts (`Qwen3MoeForCausalLM`, GGUF `qwen3moe`).
    Qwen3Moe,
    /// Llama 2/3.x and its family (SmolLM, TinyLlama; `LlamaForCausalLM`, GGUF `llama`),
    /// and Mistral (`MistralForCausalLM`: Llama's blocks, with a sliding window over every
    /// layer when its config sets one; Mistral's GGUFs are `llama` files).
    Llama,
    /// Gemma 2 (`Gemma2ForCausalLM`, GGUF `gemma2`): Gemma 3's blocks without q/k norms,
    /// a sliding window on every other layer (one rope for all), and soft-capped attention
    /// scores and logits.
    Gemma2,
    /// Gemma 3 text (`Gemma3ForCausalLM`, or the text model of
    /// `Gemma3ForConditionalGeneration`; GGUF `gemma3`).
    Gemma3,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 6] = [
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Llama,
        Architecture::Gemma2,
        Architecture::Gemma3,
    ];

    /// Gemma 2 and 3: `(1 + w)` norms, embeddings scaled by `sqrt(hidden)`, norms before
    /// and after attention and the MLP, GELU (tanh), `query_pre_attn_scalar`.
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }

    /// The `general.architecture` value of GGUF files of this architecture.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Llama => "llama",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// The architecture of a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Option<Architecture> {
        Self::ALL.into_iter().find(|a| a.gguf_name() == name)
    }

    /// The architecture of an HF config's `architectures[0]` class name.
    pub fn from_hf_class(class: &str) -> Option<Architecture> {
        Some(match class {
            "Qwen2ForCausalLM" => Architecture::Qwen2,
            "Qwen3ForCausalLM" => Architecture::Qwen3,
            "Qwen3MoeForCausalLM" => Architecture::Qwen3Moe,
            "LlamaForCausalLM" | "MistralForCausalLM" => Architecture::Llama,
            "Gemma2ForCausalLM" => Architecture::Gemma2,
            "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// The architecture of an HF config's `model_type`.
    pub fn from_hf_model_type(model_type: &str) -> Option<Architecture> {
        Some(match model_type {
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "qwen3_moe" => Architecture::Qwen3Moe,
            "llama" | "mistral" => Architecture::Llama,
            "gemma2" => Architecture::Gemma2,
            "gemma3" | "gemma3_text" => Architecture::Gemma3,
            _ => return None,
        })
    }

    /// "Qwen3, Qwen3Moe, Llama, Gemma3 (GGUF: qwen3, ...)": for error messages.
    pub fn supported_list() -> String {
        let hf: Vec<&str> = [
            "Qwen2ForCausalLM",
            "Qwen3ForCausalLM",
            "Qwen3MoeForCausalLM",
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "Gemma2ForCausalLM",
            "Gemma3ForCausalLM",
            "Gemma3ForConditionalGeneration",
        ]
        .to_vec();
        let gguf: Vec<&str> = Self::ALL.iter().map(|a| a.gguf_name()).collect();
        format!("HF {}; GGUF {}", hf.join(", "), gguf.join(", "))
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (HF `silu`; Llama, Qwen3).
    Silu,
    /// GELU with the tanh approximation (HF `gelu_pytorch_tanh`, ggml's `ggml_gelu`;
    /// Gemma 3).
    GeluTanh,
}

/// Which keys a layer's queries attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier position (causal).
    Full,
    /// The last [`SlidingWindow::size`] positions including the query's own: key `k` is
    /// visible to query `q` when `q - sliding_window < k <= q` (HF's sliding mask;
    /// llama.cpp's `LLAMA_SWA_TYPE_STANDARD`). Such layers use [`SlidingWindow::rope`].
    Sliding,
}

/// The feed-forward part of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// Gated MLP of [`ModelSpec::intermediate_size`].
    Dense,
    /// Routed experts ([`ModelSpec::moe`]).
    Moe,
}

/// What kind of attention and feed-forward one layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    pub attention: AttentionKind,
    pub ffn: FfnKind,
}

/// Rotary position embedding: `theta_j = position * inv_freq[j]` for pair `j` of each
/// head (the pairing of elements is a [`crate::source::RopePairing`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// The base (`rope_theta`, GGUF `rope.freq_base`).
    pub theta: f64,
    /// Frequency scaling for long contexts.
    pub scaling: RopeScaling,
}

/// How the base frequencies `theta^(-2j/d)` are modified.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// None (HF `rope_type: "default"`).
    None,
    /// Positions divided by `factor` (HF `linear`; GGUF `rope.scaling.type = linear`).
    Linear { factor: f64 },
    /// Llama 3.1+'s per-frequency scaling (HF `llama3`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN (HF `yarn`, GGUF `rope.scaling.type = yarn`).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// Multiplies cos and sin; computed from `factor` (and `mscale`s) when absent.
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
    /// Per-pair divisors of the base frequencies: `inv_freq[j] = theta^(-2j/d) /
    /// factors[j]`. This is how GGUF carries Llama 3 scaling: llama.cpp's converter turns
    /// the `llama3` parameters into the `rope_freqs.weight` tensor
    /// (conversion/llama.py, `generate_extra_tensors`) and writes no scaling type.
    FreqFactors(Vec<f32>),
}

impl RopeSpec {
    /// A plain rope of base `theta`.
    pub fn plain(theta: f64) -> RopeSpec {
        RopeSpec {
            theta,
            scaling: RopeScaling::None,
        }
    }

    /// The base inverse frequencies `theta^(-2j/dim)`, `j < dim/2`.
    fn base_inv_freq(&self, dim: usize) -> Vec<f64> {
        (0..dim / 2)
            .map(|j| self.theta.powf(-((2 * j) as f64) / dim as f64))
            .collect()
    }

    /// The inverse frequency of each of the `dim/2` rotated pairs, after scaling, in f64.
    ///
    /// These follow transformers' `ROPE_INIT_FUNCTIONS` (`_compute_default_rope_parameters`,
    /// `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
    /// `_compute_yarn_parameters`), evaluated in f64; transformers evaluates them in f32,
    /// so a graph that must match it to the last ulp should round these to f32.
    pub fn inv_freq(&self, dim: usize) -> Vec<f64> {
        let base = self.base_inv_freq(dim);
        match &self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            } => {
                let low_wavelen = old_ctx / low_freq_factor;
                let high_wavelen = old_ctx / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old_ctx / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let d = dim as f64;
                let correction_dim = |rotations: f64| {
                    d * (original_max_position_embeddings
                        / (rotations * 2.0 * std::f64::consts::PI))
                        .ln()
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(d - 1.0);
                if low == high {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(j, &extrapolation)| {
                        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        let interpolation = extrapolation / factor;
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect()
            }
            RopeScaling::FreqFactors(factors) => base
                .iter()
                .zip(factors)
                .map(|(f, &k)| f / f64::from(k))
                .collect(),
        }
    }

    /// The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match &self.scaling {
            RopeScaling::Yarn {
                factor,
                attention_factor,
                mscale,
                mscale_all_dim,
                ..
            } => {
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(all)) if *m != 0.0 && *all != 0.0 => {
                        get_mscale(*factor, *m) / get_mscale(*factor, *all)
                    }
                    _ => get_mscale(*factor, 1.0),
                }
            }
            _ => 1.0,
        }
    }
}

/// Mixture-of-experts routing (Qwen3-MoE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    /// Experts per MoE layer (`num_experts`; GGUF `expert_count`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`; GGUF `expert_used_count`).
    pub experts_per_token: usize,
    /// Each expert's hidden size (`moe_intermediate_size`; GGUF
    /// `expert_feed_forward_length`).
    pub intermediate_size: usize,
    /// Whether the top-k routing weights are renormalised to sum to 1
    /// (`norm_topk_prob`; llama.cpp always does for `qwen3moe`).
    pub norm_topk_prob: bool,
}

/// Gemma 3's local attention.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Window length in tokens, the query's own included (`sliding_window`).
    pub size: usize,
    /// The rope of sliding layers (`rope_local_base_freq` = 10000, unscaled).
    pub rope: RopeSpec,
}

/// Special token ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIds {
    pub bos: Option<u32>,
    /// Every token that ends generation (HF `eos_token_id`, which may be a list; GGUF
    /// `eos_token_id`, `eot_token_id`, `eom_token_id`).
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

/// Default sampling settings shipped with the model (HF `generation_config.json`, GGUF
/// `general.sampling.*`). `None` means the file does not say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<u32>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<u32>,
}

/// A decoder-only transformer, described at the level the graph builder needs.
///
/// Every layer computes (pre-norm residual blocks; norms are RMSNorm with
/// [`rms_norm_eps`](Self::rms_norm_eps)):
///
/// ```text
/// h = embed(tokens) * embedding_scale
/// per layer:
///   a = attention(input_layernorm(h))          q/k/v/o projections (q/k/v biases if
///                                              qkv_bias, o's if o_bias), GQA,
///                                              q_norm/k_norm per head if qk_norm,
///                                              rope, scores * attention_scale
///   a = post_attention_layernorm(a)            only if sandwich_norms
///   h = h + a
///   m = mlp(pre-FFN norm(h))                   dense or MoE, gated with `activation`
///   m = post_feedforward_layernorm(m)          only if sandwich_norms
///   h = h + m
/// logits = lm_head(norm(h)), soft-capped by final_logit_softcapping if set
/// ```
///
/// The pre-FFN norm is `post_attention_layernorm` for Llama and Qwen3 (HF's name) and
/// `pre_feedforward_layernorm` for Gemma 2 and 3.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub architecture: Architecture,
    /// Rows of the embedding and of the output projection.
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention: `num_heads / num_kv_heads` query heads
    /// share each).
    pub num_kv_heads: usize,
    /// Dimension of each head (also the rotary dimension: partial rotary is not
    /// supported).
    pub head_dim: usize,
    /// Hidden size of dense MLPs.
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    /// The rope of full-attention layers.
    pub rope: RopeSpec,
    /// The context length the model was trained for.
    pub max_position_embeddings: usize,
    /// The output projection is the token embedding (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// RMSNorm over each head of queries and keys before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Biases on the query, key and value projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`; not Qwen2's).
    pub o_bias: bool,
    pub activation: Activation,
    /// One entry per layer.
    pub layers: Vec<LayerSpec>,
    /// Routing of MoE layers (present iff some layer is [`FfnKind::Moe`]).
    pub moe: Option<MoeSpec>,
    /// Local attention (present iff some layer is [`AttentionKind::Sliding`]).
    pub sliding_window: Option<SlidingWindow>,
    /// The factor attention scores `q·k` are multiplied by: `head_dim^-0.5`, or Gemma 3's
    /// `query_pre_attn_scalar^-0.5`.
    pub attention_scale: f64,
    /// `scores = cap * tanh(scores / cap)` before the softmax, if set.
    pub attn_logit_softcapping: Option<f64>,
    /// `logits = cap * tanh(logits / cap)`, if set.
    pub final_logit_softcapping: Option<f64>,
    /// Embeddings are multiplied by this (Gemma 3: `sqrt(hidden_size)`; transformers
    /// rounds it to the weights' dtype first, e.g. bf16).
    pub embedding_scale: Option<f64>,
    /// Gemma 3's extra norms: `post_attention_layernorm` after attention and
    /// `post_feedforward_layernorm` after the MLP, with `pre_feedforward_layernorm` before
    /// it.
    pub sandwich_norms: bool,
    pub tokens: TokenIds,
    /// The Jinja chat template, if the model ships one.
    pub chat_template: Option<String>,
    pub generation: GenerationDefaults,
}

/// The most layers a spec may have (llama.cpp's `LLAMA_MAX_LAYERS`). Checked before
/// anything per layer is allocated, so a hostile layer count is an error, not an
/// out-of-memory.
pub const MAX_LAYERS: usize = 512;

/// The most experts a MoE layer may have (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 1024;

/// The largest head dimension, head count or hidden size accepted (far above any real
/// model; it bounds what a hostile file can make the graph builder allocate).
pub const MAX_DIM: usize = 1 << 20;

/// Checks a layer count read from a file before per-layer data is built from it.
pub fn check_layer_count(n: usize) -> Result<(), String> {
    if n > MAX_LAYERS {
        return Err(format!("{n} layers (at most {MAX_LAYERS} are supported)"));
    }
    Ok(())
}

impl ModelSpec {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }

    /// The rope of layer `layer` (sliding layers use the local rope).
    pub fn rope_for_layer(&self, layer: usize) -> &RopeSpec {
        match (self.layers.get(layer), &self.sliding_window) {
            (
                Some(LayerSpec {
                    attention: AttentionKind::Sliding,
                    ..
                }),
                Some(w),
            ) => &w.rope,
            _ => &self.rope,
        }
    }

    /// Checks the spec is self-consistent, returning what is not.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} is 0"));
            }
        }
        check_layer_count(self.num_layers)?;
        let bounded = [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
        ];
        for (name, v) in bounded {
            if v > MAX_DIM {
                return Err(format!("{name} {v} exceeds {MAX_DIM}"));
            }
        }
        // Every tensor the spec implies must have an element count that fits in u64.
        let fits = |dims: &[usize]| {
            dims.iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
                .is_some_and(|n| n <= i64::MAX as u64)
        };
        let q = self.num_heads * self.head_dim;
        if !fits(&[self.vocab_size, self.hidden_size]) || !fits(&[q, self.hidden_size]) {
            return Err(format!(
                "vocab_size {} / hidden_size {} give tensors too large to address",
                self.vocab_size, self.hidden_size
            ));
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {} is odd; rope needs pairs",
                self.head_dim
            ));
        }
        if self.layers.len() != self.num_layers {
            return Err(format!(
                "{} layer kinds for {} layers",
                self.layers.len(),
                self.num_layers
            ));
        }
        let any_moe = self.layers.iter().any(|l| l.ffn == FfnKind::Moe);
        match (&self.moe, any_moe) {
            (Some(m), _) if m.experts_per_token == 0 || m.experts_per_token > m.num_experts => {
                return Err(format!(
                    "{} experts per token out of {} experts",
                    m.experts_per_token, m.num_experts
                ))
            }
            (Some(m), _) if m.intermediate_size == 0 => {
                return Err("moe_intermediate_size is 0".into())
            }
            (Some(m), _) if m.num_experts > MAX_EXPERTS || m.intermediate_size > MAX_DIM => {
                return Err(format!(
                    "{} experts of size {} (at most {MAX_EXPERTS} experts of {MAX_DIM})",
                    m.num_experts, m.intermediate_size
                ))
            }
            (None, true) => return Err("MoE layers without MoE parameters".into()),
            _ => {}
        }
        if self.layers.iter().any(|l| l.ffn == FfnKind::Dense) && self.intermediate_size == 0 {
            return Err("intermediate_size is 0".into());
        }
        let any_sliding = self
            .layers
            .iter()
            .any(|l| l.attention == AttentionKind::Sliding);
        match (&self.sliding_window, any_sliding) {
            (Some(w), _) if w.size == 0 => return Err("sliding_window is 0".into()),
            (None, true) => return Err("sliding layers without a sliding window".into()),
            _ => {}
        }
        if let RopeScaling::FreqFactors(f) = &self.rope.scaling {
            if f.len() != self.head_dim / 2 {
                return Err(format!(
                    "{} rope frequency factors for head_dim {}",
                    f.len(),
                    self.head_dim
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's rope_freqs (conversion/llama.py, generate_extra_tensors) applied as
    /// divisors reproduce HF's llama3 inverse frequencies.
    #[test]
    fn llama3_scaling_equals_gguf_freq_factors() {
        let (theta, dim) = (500_000.0, 64);
        let (factor, low, high, old) = (32.0, 1.0, 4.0, 8192.0);
        let hf = RopeSpec {
            theta,
            scaling: RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: old,
            },
        };
        // The converter's loop, transcribed: factor per frequency.
        let factors: Vec<f32> = (0..dim / 2)
            .map(|j| {
                let freq = 1.0 / f64::powf(theta, (2 * j) as f64 / dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor as f32
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect();
        let gguf = RopeSpec {
            theta,
            scaling: RopeScaling::FreqFactors(factors),
        };
        for (a, b) in hf.inv_freq(dim).iter().zip(gguf.inv_freq(dim)) {
            assert!((a - b).abs() <= a.abs() * 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn plain_and_linear_rope() {
        let r = RopeSpec::plain(10_000.0);
        let f = r.inv_freq(4);
        assert_eq!(f, vec![1.0, 0.01]);
        let lin = RopeSpec {
            theta: 10_000.0,
            scaling: RopeScaling::Linear { factor: 8.0 },
        };
        assert_eq!(lin.inv_freq(4), vec![0.125, 0.00125]);
        assert_eq!(lin.attention_factor(), 1.0);
    }
}
