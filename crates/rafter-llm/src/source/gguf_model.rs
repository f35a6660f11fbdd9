//! A GGUF file → [`ModelSpec`] and canonical weights.
//!
//! Metadata keys are llama.cpp's (src/llama-arch.cpp `LLM_KV_NAMES`, read as
//! src/llama-model.cpp and src/models/{llama,qwen3,qwen3moe,gemma3}.cpp read them), with
//! llama.cpp's defaults where a key is optional: `{arch}.attention.head_count_kv`
//! defaults to the head count, `{arch}.attention.key_length` to `embedding_length /
//! head_count`, `{arch}.rope.freq_base` to 10000, `{arch}.rope.freq_base_swa` to 10000,
//! `{arch}.attention.sliding_window_pattern` to 6 (Gemma 3),
//! `{arch}.expert_feed_forward_length` to `feed_forward_length / expert_used_count`
//! (Qwen3-MoE). Where llama.cpp hard-codes semantics that HF configs carry, the spec
//! records llama.cpp's choice, since that is what the file was made for:
//!
//! * Qwen3-MoE: `norm_topk_prob` is true (models/qwen3moe.cpp passes `norm_w = true` to
//!   `build_moe_ffn`) and every layer is MoE (no `decoder_sparse_step`/`mlp_only_layers`).
//! * Gemma 3: attention scale `1/sqrt(head_dim)`, or `1/sqrt(embedding_length /
//!   head_count)` for the 62-layer 27B (models/gemma3.cpp; HF's `query_pre_attn_scalar`
//!   is not in the file). Embeddings scaled by `sqrt(embedding_length)`. Linear rope
//!   scaling applies to full-attention layers only (`get_rope_freq_scale`).
//! * YaRN: ggml multiplies cos/sin by `yarn_attn_factor * (1 + 0.1 ln(factor))`.
//!
//! Tensor names are llama.cpp's (`LLM_TENSOR_NAMES`): see [`GGUF_TO_HF`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rafter_gguf::{GgufFile, Value};

use super::error::SourceError;
use super::expected::{take_expected, Unsupported};
use super::weights::{
    Conventions, ExpertLayout, NormWeight, RopePairing, SourceFormat, TensorOrigin,
    UnsupportedTensor, WeightDtype, WeightTensor,
};
use super::ModelSource;
use crate::spec::{
    check_layer_count, Activation, Architecture, AttentionKind, FfnKind, GenerationDefaults,
    LayerSpec, ModelSpec, MoeSpec, RopeScaling, RopeSpec, SlidingWindow, TokenIds,
};

/// GGUF tensor names (per block, after `blk.N.`) and their HF names (after
/// `model.layers.N.`), from llama-arch.cpp and gguf-py's tensor_mapping.py. `ffn_norm` is
/// the pre-FFN norm: HF `post_attention_layernorm` for Llama/Qwen3, but
/// `pre_feedforward_layernorm` for Gemma 3, whose `post_attention_layernorm` is GGUF's
/// `post_attention_norm`.
pub const GGUF_TO_HF: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.experts.gate_proj"),
    ("ffn_up_exps", "mlp.experts.up_proj"),
    ("ffn_down_exps", "mlp.experts.down_proj"),
    // Written only with the converter's --fuse-qkv / --fuse-gate-up-exps; split on read.
    ("attn_qkv", "self_attn.qkv_proj"),
    ("ffn_gate_up_exps", "mlp.experts.gate_up_proj"),
];

/// Non-block tensors.
const GGUF_TOP_TO_HF: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

/// `name` split into its base and its kind suffix (`.weight` or `.bias`).
fn split_kind(name: &str) -> Option<(&str, &'static str)> {
    if let Some(base) = name.strip_suffix(".weight") {
        Some((base, "weight"))
    } else {
        name.strip_suffix(".bias").map(|base| (base, "bias"))
    }
}

/// The canonical name of GGUF tensor `name` for `arch`, if it is one the graph uses.
fn canonical_name(name: &str, arch: Architecture) -> Option<String> {
    let (base, kind) = split_kind(name)?;
    if let Some(&(_, hf)) = GGUF_TOP_TO_HF.iter().find(|(g, _)| *g == base) {
        return Some(format!("{hf}.{kind}"));
    }
    let rest = base.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match part {
        "ffn_norm" if arch.is_gemma() => "pre_feedforward_layernorm",
        _ => GGUF_TO_HF.iter().find(|(g, _)| *g == part)?.1,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// The GGUF name of a canonical name, for "missing tensor" messages.
fn gguf_name(canonical: &str, arch: Architecture) -> String {
    let Some((base, kind)) = split_kind(canonical) else {
        return canonical.to_string();
    };
    if let Some(&(g, _)) = GGUF_TOP_TO_HF.iter().find(|(_, h)| *h == base) {
        return format!("{g}.{kind}");
    }
    if let Some(rest) = base.strip_prefix("model.layers.") {
        if let Some((layer, part)) = rest.split_once('.') {
            let g = match part {
                "pre_feedforward_layernorm" if arch.is_gemma() => Some("ffn_norm"),
                "post_attention_layernorm" if arch.is_gemma() => Some("post_attention_norm"),
                _ => GGUF_TO_HF.iter().find(|(_, h)| *h == part).map(|(g, _)| *g),
            };
            if let Some(g) = g {
                return format!("blk.{layer}.{g}.{kind}");
            }
        }
    }
    canonical.to_string()
}

/// Reads a GGUF model from an opened file.
pub(crate) fn from_file(file: GgufFile, path: &Path) -> Result<ModelSource, SourceError> {
    let arch_name = file.get_str("general.architecture")?;
    let arch = Architecture::from_gguf_name(arch_name).ok_or_else(|| {
        SourceError::UnknownArchitecture {
            path: path.to_path_buf(),
            found: arch_name.to_string(),
            supported: Architecture::supported_list(),
        }
    })?;
    if let Some(n) = file.get_opt::<u64>("split.count")?.filter(|&n| n > 1) {
        return Err(SourceError::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "a split GGUF (split.count = {n}; merge it with llama-gguf-split --merge)"
            ),
        });
    }
    let mut spec = read_spec(&file, arch, path)?;

    let file_arc: Arc<Path> = Arc::from(path);
    let mut found = BTreeMap::new();
    let mut unsupported = Unsupported::new();
    let mut fused_gate_up = false;
    for info in file.tensors() {
        let name = info.name();
        if name == "rope_freqs.weight" {
            continue;
        }
        let Some(canonical) = canonical_name(name, arch) else {
            continue;
        };
        let origin = TensorOrigin {
            file: Arc::clone(&file_arc),
            name: name.to_string(),
        };
        let Some(dtype) = WeightDtype::from_ggml(info.ggml_type()) else {
            let dtype = info.ggml_type().name().to_string();
            unsupported.insert(canonical, UnsupportedTensor { origin, dtype });
            continue;
        };
        let tensor = WeightTensor {
            dtype,
            shape: info.shape().iter().map(|&d| d as usize).collect(),
            bytes: file.tensor_data(info),
            origin,
        };
        match fused_kind(&canonical) {
            Some(Fused::Qkv) => split_qkv(&spec, &canonical, tensor, &mut found, path)?,
            Some(Fused::GateUpExps) => {
                fused_gate_up = true;
                split_gate_up_exps(&spec, &canonical, tensor, &mut found, path)?;
            }
            None => {
                found.insert(canonical, tensor);
            }
        }
    }
    spec.tie_word_embeddings = !found.contains_key("lm_head.weight");
    set_attention_biases(&mut spec, &found);
    let experts = match (&spec.moe, fused_gate_up) {
        (None, _) => ExpertLayout::None,
        (Some(_), false) => ExpertLayout::Stacked,
        (Some(moe), true) => {
            unstack_experts(&mut found, moe.num_experts);
            ExpertLayout::PerExpert
        }
    };
    let (weights, unused) = take_expected(&spec, experts, found, &unsupported, path, |name| {
        format!("GGUF tensor '{}'", gguf_name(name, arch))
    })?;
    let conventions = Conventions {
        rope_pairing: match arch {
            Architecture::Llama => RopePairing::Interleaved,
            _ => RopePairing::Halves,
        },
        norm_weight: NormWeight::Scale,
        experts,
    };
    Ok(ModelSource {
        spec,
        weights,
        conventions,
        format: SourceFormat::Gguf {
            path: path.to_path_buf(),
        },
        unused,
        gguf: Some(file),
    })
}

/// A file's attention biases are there or not, as llama.cpp loads them (optional tensors
/// `attn_q.bias` ... `attn_output.bias`; the converter writes them for a checkpoint with
/// `attention_bias: true`): the first layer's say which. Qwen2's q/k/v biases are
/// required (set by the architecture), so a qwen2 file without them is an error.
fn set_attention_biases(spec: &mut ModelSpec, found: &BTreeMap<String, WeightTensor>) {
    let has = |proj: &str| found.contains_key(&format!("model.layers.0.self_attn.{proj}.bias"));
    spec.qkv_bias |= has("q_proj") || has("k_proj") || has("v_proj");
    spec.o_bias = has("o_proj");
}

/// Tensors the converter can fuse (`--fuse-qkv`, `--fuse-gate-up-exps`; conversion/base.py
/// `ModelBase.modify_tensors`): rafter splits them back, zero-copy.
enum Fused {
    /// `attn_qkv`: `torch.cat([q, k, v], dim=0)`, rows of q, then k, then v.
    Qkv,
    /// `ffn_gate_up_exps`: `torch.cat([gate, up], dim=1)` of `[experts, ff, hidden]`
    /// tensors, so each expert's gate rows then its up rows.
    GateUpExps,
}

fn fused_kind(canonical: &str) -> Option<Fused> {
    if canonical.ends_with(".self_attn.qkv_proj.weight")
        || canonical.ends_with(".self_attn.qkv_proj.bias")
    {
        Some(Fused::Qkv)
    } else if canonical.ends_with(".mlp.experts.gate_up_proj.weight") {
        Some(Fused::GateUpExps)
    } else {
        None
    }
}

fn fused_shape_error(
    name: &str,
    t: &WeightTensor,
    expected: Vec<usize>,
    path: &Path,
) -> SourceError {
    SourceError::ShapeMismatch {
        name: name.to_string(),
        stored_as: t.origin.name.clone(),
        expected,
        found: t.shape.clone(),
        path: path.to_path_buf(),
    }
}

/// `model.layers.N.self_attn.qkv_proj.weight` → q_proj, k_proj, v_proj.
fn split_qkv(
    spec: &ModelSpec,
    canonical: &str,
    t: WeightTensor,
    found: &mut BTreeMap<String, WeightTensor>,
    path: &Path,
) -> Result<(), SourceError> {
    let q = spec.num_heads * spec.head_dim;
    let kv = spec.num_kv_heads * spec.head_dim;
    // The weight `[q + 2kv, hidden]`, or its bias `[q + 2kv]`.
    let (prefix, kind, expected) = match canonical.strip_suffix("qkv_proj.bias") {
        Some(prefix) => (prefix, "bias", vec![q + 2 * kv]),
        None => (
            canonical.trim_end_matches("qkv_proj.weight"),
            "weight",
            vec![q + 2 * kv, spec.hidden_size],
        ),
    };
    if t.shape != expected {
        return Err(fused_shape_error(canonical, &t, expected, path));
    }
    for (proj, start, end) in [
        ("q_proj", 0, q),
        ("k_proj", q, q + kv),
        ("v_proj", q + kv, q + 2 * kv),
    ] {
        let part = t
            .rows(start, end, proj)
            .ok_or_else(|| fused_shape_error(canonical, &t, expected.clone(), path))?;
        found.insert(format!("{prefix}{proj}.{kind}"), part);
    }
    Ok(())
}

/// `model.layers.N.mlp.experts.gate_up_proj.weight` `[experts, 2·ff, hidden]` →
/// per-expert gate_proj and up_proj.
fn split_gate_up_exps(
    spec: &ModelSpec,
    canonical: &str,
    t: WeightTensor,
    found: &mut BTreeMap<String, WeightTensor>,
    path: &Path,
) -> Result<(), SourceError> {
    let Some(moe) = &spec.moe else {
        return Ok(());
    };
    let (e, f) = (moe.num_experts, moe.intermediate_size);
    let expected = vec![e, 2 * f, spec.hidden_size];
    if t.shape != expected {
        return Err(fused_shape_error(canonical, &t, expected, path));
    }
    let prefix = canonical.trim_end_matches("gate_up_proj.weight");
    for x in 0..e {
        let expert = t
            .index_outer(x)
            .ok_or_else(|| fused_shape_error(canonical, &t, expected.clone(), path))?;
        for (proj, start, end) in [("gate_proj", 0, f), ("up_proj", f, 2 * f)] {
            let part = expert
                .rows(start, end, proj)
                .ok_or_else(|| fused_shape_error(canonical, &t, expected.clone(), path))?;
            found.insert(format!("{prefix}{x}.{proj}.weight"), part);
        }
    }
    Ok(())
}

/// Replaces stacked `mlp.experts.{p}_proj.weight` tensors by per-expert views (when a
/// file fuses gate and up, so every projection is read one expert at a time).
fn unstack_experts(found: &mut BTreeMap<String, WeightTensor>, experts: usize) {
    let stacked: Vec<String> = found
        .keys()
        .filter(|k| {
            k.contains(".mlp.experts.") && k.split('.').nth(5).is_some_and(|p| p.ends_with("_proj"))
        })
        .cloned()
        .collect();
    for name in stacked {
        let Some(t) = found.remove(&name) else {
            continue;
        };
        let (prefix, proj) = name.rsplit_once(".mlp.experts.").unwrap_or((&name, ""));
        for x in 0..experts {
            if let Some(part) = t.index_outer(x) {
                found.insert(format!("{prefix}.mlp.experts.{x}.{proj}"), part);
            }
        }
    }
}

/// Metadata key reader for one architecture's `{arch}.*` keys.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'static str,
    path: &'a Path,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A count that llama.cpp also accepts as a per-layer array (`get_key_or_arr`); rafter
    /// needs it uniform across layers.
    fn count(&self, k: &str) -> Result<Option<usize>, SourceError> {
        let key = self.key(k);
        match self.file.get(&key) {
            Some(Value::Array(a)) => {
                let values: Vec<i128> = (0..a.len())
                    .filter_map(|i| {
                        a.as_typed::<u32>()
                            .and_then(|t| t.get(i))
                            .map(i128::from)
                            .or_else(|| a.as_typed::<i32>().and_then(|t| t.get(i)).map(i128::from))
                    })
                    .collect();
                match values.first() {
                    Some(&first)
                        if values.len() == a.len() && values.iter().all(|&v| v == first) =>
                    {
                        usize::try_from(first)
                            .map(Some)
                            .map_err(|_| self.bad(&key, "is negative"))
                    }
                    _ => Err(SourceError::Unsupported {
                        path: self.path.to_path_buf(),
                        what: format!("per-layer values of '{key}'"),
                    }),
                }
            }
            _ => Ok(self.file.get_opt::<usize>(&key)?),
        }
    }

    fn req_count(&self, k: &str) -> Result<usize, SourceError> {
        self.count(k)?.ok_or_else(|| self.missing(k))
    }

    fn f64(&self, k: &str) -> Result<Option<f64>, SourceError> {
        Ok(self.file.get_opt::<f64>(&self.key(k))?)
    }

    fn missing(&self, k: &str) -> SourceError {
        SourceError::MissingField {
            path: self.path.to_path_buf(),
            field: format!("'{}'", self.key(k)),
            architecture: self.arch.to_string(),
        }
    }

    fn bad(&self, key: &str, reason: &str) -> SourceError {
        SourceError::BadField {
            path: self.path.to_path_buf(),
            field: key.to_string(),
            reason: reason.to_string(),
        }
    }
}

fn read_spec(file: &GgufFile, arch: Architecture, path: &Path) -> Result<ModelSpec, SourceError> {
    let k = Keys {
        file,
        arch: arch.gguf_name(),
        path,
    };
    let hidden_size = k.req_count("embedding_length")?;
    let num_layers = k.req_count("block_count")?;
    check_layer_count(num_layers).map_err(|reason| k.bad(&k.key("block_count"), &reason))?;
    let num_heads = k.req_count("attention.head_count")?;
    let num_kv_heads = k.count("attention.head_count_kv")?.unwrap_or(num_heads);
    let head_dim = match k.count("attention.key_length")? {
        Some(d) => d,
        None if num_heads > 0 => hidden_size / num_heads,
        None => 0,
    };
    if let Some(v) = k
        .count("attention.value_length")?
        .filter(|&v| v != head_dim)
    {
        return Err(SourceError::Unsupported {
            path: path.to_path_buf(),
            what: format!("value heads of {v} dims with key heads of {head_dim}"),
        });
    }
    if let Some(r) = k.count("rope.dimension_count")?.filter(|&r| r != head_dim) {
        return Err(SourceError::Unsupported {
            path: path.to_path_buf(),
            what: format!("partial rotary embedding ({r} of {head_dim} dims)"),
        });
    }
    let max_position_embeddings = k.req_count("context_length")?;
    let rms_norm_eps = k
        .f64("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| k.missing("attention.layer_norm_rms_epsilon"))?;
    let vocab_size = match k.count("vocab_size")? {
        Some(v) => v,
        None => match file.get_opt::<&rafter_gguf::Array>("tokenizer.ggml.tokens")? {
            Some(tokens) => tokens.len(),
            None => file
                .tensor("token_embd.weight")
                .and_then(|t| t.dims().get(1).copied())
                .map(|v| v as usize)
                .ok_or_else(|| k.missing("vocab_size"))?,
        },
    };
    let moe = match arch {
        Architecture::Qwen3Moe => {
            let experts_per_token = k.req_count("expert_used_count")?;
            let ff = k.count("feed_forward_length")?;
            let intermediate_size = match k.count("expert_feed_forward_length")? {
                Some(f) => f,
                None => match ff {
                    Some(ff) if experts_per_token > 0 => ff / experts_per_token,
                    _ => return Err(k.missing("expert_feed_forward_length")),
                },
            };
            Some(MoeSpec {
                num_experts: k.req_count("expert_count")?,
                experts_per_token,
                intermediate_size,
                norm_topk_prob: true,
            })
        }
        _ => None,
    };
    let intermediate_size = match moe {
        Some(_) => k.count("feed_forward_length")?.unwrap_or(0),
        None => k.req_count("feed_forward_length")?,
    };
    let rope = RopeSpec {
        theta: k.f64("rope.freq_base")?.unwrap_or(10_000.0),
        scaling: rope_scaling(&k, file, head_dim, max_position_embeddings)?,
    };

    let gemma = arch.is_gemma();
    let (attention, sliding_window) = if gemma {
        gemma_layers(&k, arch, num_layers, &rope)?
    } else {
        (vec![AttentionKind::Full; num_layers], None)
    };
    let ffn = if moe.is_some() {
        FfnKind::Moe
    } else {
        FfnKind::Dense
    };
    // llama.cpp's rule (from gemma_pytorch's configs): the 27B models scale by
    // hidden / heads (query_pre_attn_scalar 144 for Gemma 2, 168 for Gemma 3), the others
    // by head_dim.
    let gemma_27b = match arch {
        Architecture::Gemma2 => num_layers == 46,
        Architecture::Gemma3 => num_layers == 62,
        _ => false,
    };
    let attention_scale = if gemma_27b {
        ((hidden_size / num_heads.max(1)) as f64).powf(-0.5)
    } else {
        (head_dim as f64).powf(-0.5)
    };
    // llama.cpp caps Gemma 2's scores at 50 and logits at 30 when the file names no cap
    // (`llama_hparams`' defaults; only Gemma 2 turns attention capping on).
    let softcap = |key: &str, gemma2_default: f64| -> Result<Option<f64>, SourceError> {
        let default = (arch == Architecture::Gemma2).then_some(gemma2_default);
        Ok(k.f64(key)?.or(default).filter(|c| *c != 0.0))
    };

    let spec = ModelSpec {
        architecture: arch,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size,
        rms_norm_eps,
        rope,
        max_position_embeddings,
        tie_word_embeddings: false,
        qk_norm: matches!(
            arch,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ),
        qkv_bias: arch == Architecture::Qwen2,
        o_bias: false,
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        layers: attention
            .into_iter()
            .map(|attention| LayerSpec { attention, ffn })
            .collect(),
        moe,
        sliding_window,
        attention_scale,
        attn_logit_softcapping: softcap("attn_logit_softcapping", 50.0)?,
        final_logit_softcapping: softcap("final_logit_softcapping", 30.0)?,
        embedding_scale: gemma.then(|| (hidden_size as f64).sqrt()),
        sandwich_norms: gemma,
        tokens: tokens(file)?,
        chat_template: file
            .get_opt::<&str>("tokenizer.chat_template")?
            .map(str::to_string),
        generation: generation(file)?,
    };
    spec.check().map_err(|reason| SourceError::Inconsistent {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(spec)
}

/// `{arch}.rope.scaling.*`, or the `rope_freqs.weight` factors of Llama 3 files.
fn rope_scaling(
    k: &Keys,
    file: &GgufFile,
    head_dim: usize,
    context_length: usize,
) -> Result<RopeScaling, SourceError> {
    if let Some(info) = file.tensor("rope_freqs.weight") {
        let bad = |reason: String| SourceError::Inconsistent {
            path: k.path.to_path_buf(),
            reason: format!("tensor 'rope_freqs.weight': {reason}"),
        };
        if info.ggml_type() != rafter_gguf::GgmlType::F32
            || info.n_elements() != (head_dim / 2) as u64
        {
            return Err(bad(format!(
                "expected {} f32 values, found {} {}",
                head_dim / 2,
                info.n_elements(),
                info.ggml_type()
            )));
        }
        let data = file.tensor_data(info);
        let factors = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        return Ok(RopeScaling::FreqFactors(factors));
    }
    let kind = file.get_opt::<&str>(&k.key("rope.scaling.type"))?;
    let factor = match k.f64("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => k.f64("rope.scale_linear")?,
    }
    .filter(|&f| f != 0.0 && f != 1.0);
    // llama.cpp's default scaling type is "linear"; a factor of 0 or 1 means none.
    match kind.unwrap_or("linear") {
        "none" => Ok(RopeScaling::None),
        "linear" => Ok(factor.map_or(RopeScaling::None, |factor| RopeScaling::Linear { factor })),
        "yarn" => {
            let Some(factor) = factor else {
                return Ok(RopeScaling::None);
            };
            if let Some(ext) = k.f64("rope.scaling.yarn_ext_factor")?.filter(|&e| e != 1.0 && e >= 0.0) {
                return Err(SourceError::Unsupported {
                    path: k.path.to_path_buf(),
                    what: format!("YaRN extrapolation factor {ext} (only 1 is)"),
                });
            }
            let attn = k.f64("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0);
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: k
                    .count("rope.scaling.original_context_length")?
                    .unwrap_or(context_length) as f64,
                beta_fast: k.f64("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: k.f64("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor: Some(attn * (1.0 + 0.1 * factor.ln())),
                mscale: None,
                mscale_all_dim: None,
                truncate: true,
            })
        }
        other => Err(SourceError::Unsupported {
            path: k.path.to_path_buf(),
            what: format!(
                "rope scaling '{other}' (key '{}'; supported: none, linear, yarn, and Llama 3 rope_freqs)",
                k.key("rope.scaling.type")
            ),
        }),
    }
}

/// Gemma 3's sliding layers (as llama_model_gemma3::load_arch_hparams reads them).
fn gemma_layers(
    k: &Keys,
    arch: Architecture,
    n: usize,
    rope: &RopeSpec,
) -> Result<(Vec<AttentionKind>, Option<SlidingWindow>), SourceError> {
    // llama.cpp's `llama_model_gemma2`: a 4096 window when the file names none, every
    // other layer, the one rope base for all layers unless `rope.freq_base_swa` says.
    let gemma2 = arch == Architecture::Gemma2;
    let window = k
        .count("attention.sliding_window")?
        .unwrap_or(if gemma2 { 4096 } else { 0 });
    if window == 0 {
        return Ok((vec![AttentionKind::Full; n], None));
    }
    let pattern_key = k.key("attention.sliding_window_pattern");
    let kinds = match k.file.get(&pattern_key) {
        Some(Value::Array(a)) => {
            let flags = a
                .as_typed::<bool>()
                .filter(|f| f.len() == n)
                .ok_or_else(|| {
                    k.bad(&pattern_key, &format!("expected {n} bools (one per layer)"))
                })?;
            flags
                .iter()
                .map(|swa| {
                    if swa {
                        AttentionKind::Sliding
                    } else {
                        AttentionKind::Full
                    }
                })
                .collect()
        }
        _ => {
            let p = k
                .count("attention.sliding_window_pattern")?
                .unwrap_or(if gemma2 { 2 } else { 6 });
            // llama_hparams::set_swa_pattern(p, dense_first = false).
            (0..n)
                .map(|i| {
                    if p == 0 || i % p < p - 1 {
                        AttentionKind::Sliding
                    } else {
                        AttentionKind::Full
                    }
                })
                .collect()
        }
    };
    let rope = match (k.f64("rope.freq_base_swa")?, gemma2) {
        (Some(base), _) => RopeSpec::plain(base),
        (None, true) => rope.clone(),
        (None, false) => RopeSpec::plain(10_000.0),
    };
    Ok((kinds, Some(SlidingWindow { size: window, rope })))
}

/// `tokenizer.ggml.*_token_id`: end of generation is any of eos, eot, eom.
fn tokens(file: &GgufFile) -> Result<TokenIds, SourceError> {
    let id = |key: &str| file.get_opt::<u32>(key);
    let mut eos = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(t) = id(key)? {
            if !eos.contains(&t) {
                eos.push(t);
            }
        }
    }
    Ok(TokenIds {
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos,
        pad: id("tokenizer.ggml.padding_token_id")?,
    })
}

/// `general.sampling.*` (written by the converter from generation_config.json).
fn generation(file: &GgufFile) -> Result<GenerationDefaults, SourceError> {
    Ok(GenerationDefaults {
        do_sample: None,
        temperature: file.get_opt::<f64>("general.sampling.temp")?,
        top_k: file.get_opt::<u32>("general.sampling.top_k")?,
        top_p: file.get_opt::<f64>("general.sampling.top_p")?,
        min_p: file.get_opt::<f64>("general.sampling.min_p")?,
        repetition_penalty: file.get_opt::<f64>("general.sampling.penalty_repeat")?,
        max_new_tokens: None,
    })
}
