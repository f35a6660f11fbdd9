//! `config.json` (+ `generation_config.json`) of a Hugging Face folder → [`ModelSpec`].
//!
//! Field names are those the current transformers release (5.x) writes, with the older
//! names it still reads: `rope_parameters` (5.x) or `rope_theta` + `rope_scaling` (4.x,
//! where the scaling kind is `rope_type` or, older still, `type`); Gemma 3's per-layer-type
//! `rope_parameters.{full,sliding}_attention` or `rope_local_base_freq`; `layer_types` or
//! `sliding_window_pattern` / `_sliding_window_pattern`; Qwen3-MoE's `num_experts` or
//! `num_local_experts`. `Gemma3ForConditionalGeneration` nests the text model's fields
//! under `text_config`; they are read from there, over the top level (as llama.cpp's
//! converter merges them). Fields a real config always has (sizes, layer and head counts,
//! vocabulary) are required; the rest default as transformers' config classes do.

use std::path::Path;

use serde_json::{Map, Value};

use super::error::SourceError;
use super::json::Fields;
use crate::spec::{
    check_layer_count, Activation, Architecture, AttentionKind, FfnKind, GenerationDefaults,
    LayerSpec, ModelSpec, MoeSpec, RopeScaling, RopeSpec, SlidingWindow, TokenIds,
};

/// The architecture a config describes: `architectures[0]`, else `model_type`.
pub(crate) fn architecture(
    path: &Path,
    config: &Map<String, Value>,
) -> Result<Architecture, SourceError> {
    let f = Fields::new(path, config, "any model");
    let class = match f.raw(&["architectures"]) {
        Some((_, Value::Array(list))) => list.first().and_then(Value::as_str),
        _ => None,
    };
    let model_type = f.str(&["model_type"])?;
    let found = class
        .and_then(Architecture::from_hf_class)
        .or_else(|| model_type.and_then(Architecture::from_hf_model_type));
    found.ok_or_else(|| SourceError::UnknownArchitecture {
        path: path.to_path_buf(),
        found: class
            .or(model_type)
            .unwrap_or("<no architectures or model_type>")
            .to_string(),
        supported: Architecture::supported_list(),
    })
}

/// Reads the spec (without chat template, which comes from the tokenizer files).
pub(crate) fn read_spec(
    path: &Path,
    config: &Map<String, Value>,
    generation: Option<(&Path, &Map<String, Value>)>,
) -> Result<ModelSpec, SourceError> {
    let arch = architecture(path, config)?;
    let top = Fields::new(path, config, &format!("{arch}"));
    // Gemma3ForConditionalGeneration: the text model's fields live in text_config.
    let merged;
    let f = match top.nested("text_config")? {
        Some(text) => {
            let mut all = config.clone();
            all.extend(text.obj.iter().map(|(k, v)| (k.clone(), v.clone())));
            merged = all;
            Fields::new(path, &merged, &format!("{arch}"))
        }
        None => top,
    };

    let hidden_size = f.req_usize(&["hidden_size"])?;
    let num_layers = f.req_usize(&["num_hidden_layers"])?;
    check_layer_count(num_layers).map_err(|reason| f.bad("num_hidden_layers", reason))?;
    let num_heads = f.req_usize(&["num_attention_heads"])?;
    let num_kv_heads = f.usize(&["num_key_value_heads"])?.unwrap_or(num_heads);
    let head_dim = match f.usize(&["head_dim"])? {
        Some(d) => d,
        None if num_heads > 0 => hidden_size / num_heads,
        None => 0,
    };
    let vocab_size = f.req_usize(&["vocab_size"])?;
    let intermediate_size = f.req_usize(&["intermediate_size"])?;
    let max_position_embeddings = f
        .usize(&["max_position_embeddings"])?
        .unwrap_or(match arch {
            Architecture::Gemma3 => 131_072,
            Architecture::Gemma2 => 8192,
            Architecture::Llama => 2048,
            _ => 32_768,
        });
    let rms_norm_eps = f.f64(&["rms_norm_eps"])?.unwrap_or(match arch {
        Architecture::Llama
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Gemma2
        | Architecture::Gemma3 => 1e-6,
    });
    let tie_word_embeddings = f.bool(&["tie_word_embeddings"])?.unwrap_or(arch.is_gemma());

    reject_unsupported(&f, arch)?;
    let activation = activation(&f, arch)?;
    let (rope, local_rope) = rope(&f, arch, max_position_embeddings)?;
    let mistral = is_mistral(&f)?;
    let layer_attention = if mistral {
        mistral_attention(&f, num_layers)?
    } else {
        layer_attention(&f, arch, num_layers)?
    };
    let (moe, layer_ffn) = moe(&f, arch, num_layers)?;

    let sliding_window = if layer_attention.contains(&AttentionKind::Sliding) {
        let size = f.usize(&["sliding_window"])?.unwrap_or(4096);
        // Mistral's and Gemma 2's window layers use the model's one rope.
        let one_rope = mistral || arch == Architecture::Gemma2;
        let rope = match (one_rope, local_rope) {
            (true, _) => rope.clone(),
            (false, Some(local)) => local,
            (false, None) => RopeSpec::plain(10_000.0),
        };
        Some(SlidingWindow { size, rope })
    } else {
        None
    };
    // As transformers' attention classes build their projections: Qwen2's q/k/v always have
    // biases and its o none; Mistral's have none; every other class's four have biases
    // exactly when `attention_bias` is true.
    let attention_bias = !mistral && f.bool(&["attention_bias"])?.unwrap_or(false);
    let qkv_bias = arch == Architecture::Qwen2 || attention_bias;
    let o_bias = arch != Architecture::Qwen2 && attention_bias;

    let gemma = arch.is_gemma();
    let attention_scale = if gemma {
        let scalar = f.f64(&["query_pre_attn_scalar"])?.unwrap_or(256.0);
        scalar.powf(-0.5)
    } else {
        (head_dim as f64).powf(-0.5)
    };
    // Gemma 2's config classes default the caps to 50 and 30 (a `null` turns one off);
    // Gemma 3's to none.
    let softcap = |key: &str, gemma2_default: f64| -> Result<Option<f64>, SourceError> {
        Ok(match arch {
            Architecture::Gemma2 => match f.obj.get(key) {
                None => Some(gemma2_default),
                Some(_) => f.f64(&[key])?,
            },
            Architecture::Gemma3 => f.f64(&[key])?,
            _ => None,
        }
        .filter(|c| *c != 0.0))
    };

    let mut tokens = TokenIds {
        bos: f.ids(&["bos_token_id"])?.first().copied(),
        eos: f.ids(&["eos_token_id"])?,
        pad: f.ids(&["pad_token_id"])?.first().copied(),
    };
    let generation = match generation {
        Some((gpath, gconfig)) => read_generation(gpath, gconfig, &mut tokens, &arch)?,
        None => GenerationDefaults::default(),
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
        tie_word_embeddings,
        qk_norm: matches!(
            arch,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ),
        qkv_bias,
        o_bias,
        activation,
        layers: layer_attention
            .into_iter()
            .zip(layer_ffn)
            .map(|(attention, ffn)| LayerSpec { attention, ffn })
            .collect(),
        moe,
        sliding_window,
        attention_scale,
        attn_logit_softcapping: softcap("attn_logit_softcapping", 50.0)?,
        final_logit_softcapping: softcap("final_logit_softcapping", 30.0)?,
        embedding_scale: gemma.then(|| (hidden_size as f64).sqrt()),
        sandwich_norms: gemma,
        tokens,
        chat_template: None,
        generation,
    };
    spec.check().map_err(|reason| SourceError::Inconsistent {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(spec)
}

/// Config switches for features rafter's decoder does not implement.
fn reject_unsupported(f: &Fields, arch: Architecture) -> Result<(), SourceError> {
    let unsupported = |what: String| SourceError::Unsupported {
        path: f.path.to_path_buf(),
        what,
    };
    // Only Llama's MLP takes `mlp_bias` (`LlamaMLP`); the other classes' have no biases
    // whatever the config says.
    if arch == Architecture::Llama && !is_mistral(f)? && f.bool(&["mlp_bias"])? == Some(true) {
        return Err(unsupported(format!(
            "'mlp_bias: true' ({arch} with bias terms in the MLP)"
        )));
    }
    if f.bool(&["use_sliding_window"])? == Some(true) && !arch.is_gemma() {
        return Err(unsupported(format!(
            "'use_sliding_window: true' for {arch}"
        )));
    }
    if let Some(p) = f.f64(&["partial_rotary_factor"])? {
        if p != 1.0 {
            return Err(unsupported(format!(
                "'partial_rotary_factor: {p}' (partial rotary)"
            )));
        }
    }
    Ok(())
}

fn activation(f: &Fields, arch: Architecture) -> Result<Activation, SourceError> {
    let keys: &[&str] = if arch.is_gemma() {
        &["hidden_activation", "hidden_act"]
    } else {
        &["hidden_act"]
    };
    let default = if arch.is_gemma() {
        "gelu_pytorch_tanh"
    } else {
        "silu"
    };
    let name = f.str(keys)?.unwrap_or(default);
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
        other => Err(f.bad(
            keys[0],
            format!("activation '{other}' is not supported (silu, gelu_pytorch_tanh)"),
        )),
    }
}

/// The global rope and, for Gemma 3, the local (sliding-layer) rope.
fn rope(
    f: &Fields,
    arch: Architecture,
    max_pos: usize,
) -> Result<(RopeSpec, Option<RopeSpec>), SourceError> {
    let default_theta = match arch {
        Architecture::Gemma3 => 1_000_000.0,
        _ => 10_000.0,
    };
    if let Some(params) = f.nested("rope_parameters")? {
        let per_type = params.nested("full_attention")?;
        if let Some(full) = per_type {
            // transformers 5, per layer type (Gemma 3).
            let global = rope_from(&full, None, default_theta, max_pos)?;
            let local = match params.nested("sliding_attention")? {
                Some(s) => Some(rope_from(&s, None, 10_000.0, max_pos)?),
                None => None,
            };
            return Ok((global, local));
        }
        let global = rope_from(&params, f.f64(&["rope_theta"])?, default_theta, max_pos)?;
        let local = f.f64(&["rope_local_base_freq"])?.map(RopeSpec::plain);
        return Ok((global, local));
    }
    // transformers 4: rope_theta + rope_scaling.
    let theta = f.f64(&["rope_theta"])?.unwrap_or(default_theta);
    let global = match f.nested("rope_scaling")? {
        Some(scaling) => rope_from(&scaling, Some(theta), default_theta, max_pos)?,
        None => RopeSpec::plain(theta),
    };
    let local = f.f64(&["rope_local_base_freq"])?.map(RopeSpec::plain);
    Ok((global, local))
}

/// A rope from a `rope_parameters` / `rope_scaling` object.
fn rope_from(
    p: &Fields,
    theta_outside: Option<f64>,
    default_theta: f64,
    max_pos: usize,
) -> Result<RopeSpec, SourceError> {
    let theta = p
        .f64(&["rope_theta"])?
        .or(theta_outside)
        .unwrap_or(default_theta);
    let kind = p.str(&["rope_type", "type"])?.unwrap_or("default");
    let req = |key: &str| p.f64(&[key])?.ok_or_else(|| p.missing(&[key]));
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: req("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: req("factor")?,
            low_freq_factor: req("low_freq_factor")?,
            high_freq_factor: req("high_freq_factor")?,
            // transformers' standardize_rope_params defaults it to max_position_embeddings.
            original_max_position_embeddings: p
                .f64(&["original_max_position_embeddings"])?
                .unwrap_or(max_pos as f64),
        },
        "yarn" => {
            let original = p.f64(&["original_max_position_embeddings"])?.unwrap_or(max_pos as f64);
            let factor = match p.f64(&["factor"])? {
                Some(x) => x,
                None => max_pos as f64 / original,
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: p.f64(&["beta_fast"])?.filter(|b| *b != 0.0).unwrap_or(32.0),
                beta_slow: p.f64(&["beta_slow"])?.filter(|b| *b != 0.0).unwrap_or(1.0),
                attention_factor: p.f64(&["attention_factor"])?,
                mscale: p.f64(&["mscale"])?,
                mscale_all_dim: p.f64(&["mscale_all_dim"])?,
                truncate: p.bool(&["truncate"])?.unwrap_or(true),
            }
        }
        other => {
            return Err(SourceError::Unsupported {
                path: p.path.to_path_buf(),
                what: format!(
                    "rope scaling '{other}' (field '{}rope_type'; supported: default, linear, llama3, yarn)",
                    p.prefix
                ),
            })
        }
    };
    Ok(RopeSpec { theta, scaling })
}

/// Per-layer attention kinds: Gemma 3's `layer_types` or sliding pattern; full elsewhere.
fn layer_attention(
    f: &Fields,
    arch: Architecture,
    n: usize,
) -> Result<Vec<AttentionKind>, SourceError> {
    if let Some(types) = f.strings(&["layer_types"])? {
        if types.len() != n {
            return Err(f.bad(
                "layer_types",
                format!("{} entries for {n} layers", types.len()),
            ));
        }
        let kinds = types
            .iter()
            .map(|t| match *t {
                "full_attention" => Ok(AttentionKind::Full),
                "sliding_attention" if arch.is_gemma() => Ok(AttentionKind::Sliding),
                other => Err(f.bad(
                    "layer_types",
                    format!("layer type '{other}' is not supported for {arch}"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(kinds);
    }
    let pattern = match arch {
        // transformers' Gemma2Config: even layers slide.
        Architecture::Gemma2 => 2,
        // transformers' Gemma3TextConfig: layer i slides unless (i + 1) % pattern == 0.
        Architecture::Gemma3 => f
            .usize(&["sliding_window_pattern", "_sliding_window_pattern"])?
            .unwrap_or(6),
        _ => return Ok(vec![AttentionKind::Full; n]),
    };
    Ok((0..n)
        .map(|i| {
            if pattern != 0 && (i + 1) % pattern == 0 {
                AttentionKind::Full
            } else {
                AttentionKind::Sliding
            }
        })
        .collect())
}

/// Whether the config is Mistral's (`MistralForCausalLM` / `mistral`): read as Llama, but
/// with its own sliding-window rule ([`mistral_attention`]).
fn is_mistral(f: &Fields) -> Result<bool, SourceError> {
    let class = match f.raw(&["architectures"]) {
        Some((_, Value::Array(list))) => list.first().and_then(Value::as_str),
        _ => None,
    };
    Ok(match class {
        Some(c) => c == "MistralForCausalLM",
        None => f.str(&["model_type"])? == Some("mistral"),
    })
}

/// Mistral's layers: every one attends within `sliding_window` when the config sets one
/// (transformers' `MistralModel` builds a sliding-window mask whenever
/// `config.sliding_window` is not null, and `MistralConfig` defaults it to 4096:
/// Mistral-7B-v0.1), else all are causal over the whole context (v0.2 and later write
/// `null`). Mistral's GGUFs are `llama` files, which llama.cpp runs without a window.
fn mistral_attention(f: &Fields, n: usize) -> Result<Vec<AttentionKind>, SourceError> {
    let windowed = match f.obj.get("sliding_window") {
        None => true,
        Some(Value::Null) => false,
        Some(_) => f.usize(&["sliding_window"])?.is_some(),
    };
    let kind = if windowed {
        AttentionKind::Sliding
    } else {
        AttentionKind::Full
    };
    Ok(vec![kind; n])
}

/// MoE routing and which layers are MoE (Qwen3-MoE's `decoder_sparse_step` and
/// `mlp_only_layers`, as `Qwen3MoeDecoderLayer` decides).
fn moe(
    f: &Fields,
    arch: Architecture,
    n: usize,
) -> Result<(Option<MoeSpec>, Vec<FfnKind>), SourceError> {
    if arch != Architecture::Qwen3Moe {
        return Ok((None, vec![FfnKind::Dense; n]));
    }
    let num_experts = f.req_usize(&["num_experts", "num_local_experts"])?;
    let spec = MoeSpec {
        num_experts,
        experts_per_token: f.req_usize(&["num_experts_per_tok"])?,
        intermediate_size: f.req_usize(&["moe_intermediate_size"])?,
        norm_topk_prob: f.bool(&["norm_topk_prob"])?.unwrap_or(false),
    };
    let step = f.usize(&["decoder_sparse_step"])?.unwrap_or(1);
    let dense_only = f.usizes(&["mlp_only_layers"])?.unwrap_or_default();
    let kinds = (0..n)
        .map(|i| {
            let sparse =
                !dense_only.contains(&i) && num_experts > 0 && step > 0 && (i + 1) % step == 0;
            if sparse {
                FfnKind::Moe
            } else {
                FfnKind::Dense
            }
        })
        .collect::<Vec<_>>();
    let any_moe = kinds.contains(&FfnKind::Moe);
    Ok((any_moe.then_some(spec), kinds))
}

/// `generation_config.json`: sampling defaults, and special ids that override config.json's.
fn read_generation(
    path: &Path,
    config: &Map<String, Value>,
    tokens: &mut TokenIds,
    arch: &Architecture,
) -> Result<GenerationDefaults, SourceError> {
    let g = Fields::new(path, config, &format!("{arch}"));
    if let Some(bos) = g.ids(&["bos_token_id"])?.first() {
        tokens.bos = Some(*bos);
    }
    let eos = g.ids(&["eos_token_id"])?;
    if !eos.is_empty() {
        tokens.eos = eos;
    }
    if let Some(pad) = g.ids(&["pad_token_id"])?.first() {
        tokens.pad = Some(*pad);
    }
    let u32_of = |key: &str| -> Result<Option<u32>, SourceError> {
        match g.usize(&[key])? {
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| g.bad(key, format!("{v} does not fit in u32"))),
            None => Ok(None),
        }
    };
    Ok(GenerationDefaults {
        do_sample: g.bool(&["do_sample"])?,
        temperature: g.f64(&["temperature"])?,
        top_k: u32_of("top_k")?,
        top_p: g.f64(&["top_p"])?,
        min_p: g.f64(&["min_p"])?,
        repetition_penalty: g.f64(&["repetition_penalty"])?,
        max_new_tokens: u32_of("max_new_tokens")?,
    })
}
