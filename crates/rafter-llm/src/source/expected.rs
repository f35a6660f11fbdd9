//! The canonical tensors a spec implies, with their shapes, and the check that a source
//! provides exactly those.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::SourceError;
use super::weights::{ExpertLayout, UnsupportedTensor, WeightDtype, WeightTensor, Weights};
use crate::spec::{FfnKind, ModelSpec};

/// The canonical name and logical shape of every tensor the graph needs, generated lazily
/// so that a source missing tensors fails at the first one without listing them all.
pub(crate) fn expected_tensors(
    spec: &ModelSpec,
    experts: ExpertLayout,
) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
    let (h, v) = (spec.hidden_size, spec.vocab_size);
    let mut top = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !spec.tie_word_embeddings {
        top.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    let layers = (0..spec.num_layers).flat_map(move |i| layer_tensors(spec, experts, i));
    top.into_iter().chain(layers)
}

/// The tensors of layer `i`: attention and norms, then the MLP (dense, or the router and
/// each expert's projections, which are generated one expert at a time).
fn layer_tensors(
    spec: &ModelSpec,
    experts: ExpertLayout,
    i: usize,
) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
    let (h, hd) = (spec.hidden_size, spec.head_dim);
    let (q, kv) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let p = format!("model.layers.{i}");
    let name = move |n: &str| format!("{p}.{n}.weight");
    let mut out = vec![
        (name("input_layernorm"), vec![h]),
        (name("self_attn.q_proj"), vec![q, h]),
        (name("self_attn.k_proj"), vec![kv, h]),
        (name("self_attn.v_proj"), vec![kv, h]),
        (name("self_attn.o_proj"), vec![h, q]),
    ];
    let bias = |n: &str| format!("model.layers.{i}.self_attn.{n}.bias");
    if spec.qkv_bias {
        out.push((bias("q_proj"), vec![q]));
        out.push((bias("k_proj"), vec![kv]));
        out.push((bias("v_proj"), vec![kv]));
    }
    if spec.o_bias {
        out.push((bias("o_proj"), vec![h]));
    }
    if spec.qk_norm {
        out.push((name("self_attn.q_norm"), vec![hd]));
        out.push((name("self_attn.k_norm"), vec![hd]));
    }
    out.push((name("post_attention_layernorm"), vec![h]));
    if spec.sandwich_norms {
        out.push((name("pre_feedforward_layernorm"), vec![h]));
        out.push((name("post_feedforward_layernorm"), vec![h]));
    }
    let moe = match (spec.layers.get(i).map(|l| l.ffn), &spec.moe) {
        (Some(FfnKind::Moe), Some(moe)) => Some(moe),
        _ => None,
    };
    let mut per_expert = 0..0;
    match moe {
        Some(m) => {
            let (e, f) = (m.num_experts, m.intermediate_size);
            out.push((name("mlp.gate"), vec![e, h]));
            if experts == ExpertLayout::Stacked {
                out.push((name("mlp.experts.gate_proj"), vec![e, f, h]));
                out.push((name("mlp.experts.up_proj"), vec![e, f, h]));
                out.push((name("mlp.experts.down_proj"), vec![e, h, f]));
            } else {
                per_expert = 0..e;
            }
        }
        None => {
            let f = spec.intermediate_size;
            out.push((name("mlp.gate_proj"), vec![f, h]));
            out.push((name("mlp.up_proj"), vec![f, h]));
            out.push((name("mlp.down_proj"), vec![h, f]));
        }
    }
    let f = moe.map_or(0, |m| m.intermediate_size);
    let expert_tensors = per_expert.flat_map(move |x| {
        let e = |proj: &str| format!("model.layers.{i}.mlp.experts.{x}.{proj}.weight");
        [
            (e("gate_proj"), vec![f, h]),
            (e("up_proj"), vec![f, h]),
            (e("down_proj"), vec![h, f]),
        ]
    });
    out.into_iter().chain(expert_tensors)
}

/// Tensors a source holds in a dtype rafter cannot compute on, by canonical name: where
/// they are and the dtype's name. Reported only if the model needs them.
pub(crate) type Unsupported = BTreeMap<String, UnsupportedTensor>;

/// Moves the expected tensors out of `found` into canonical [`Weights`], checking each is
/// present with the expected shape. `looked_for` renders a canonical name in the
/// source's own naming for error messages. Returns the weights and the names of the
/// tensors left over (present in the source but unused).
pub(crate) fn take_expected(
    spec: &ModelSpec,
    experts: ExpertLayout,
    mut found: BTreeMap<String, WeightTensor>,
    unsupported: &Unsupported,
    path: &Path,
    looked_for: impl Fn(&str) -> String,
) -> Result<(Weights, Vec<String>), SourceError> {
    let mut weights = Weights::default();
    for (name, shape) in expected_tensors(spec, experts) {
        let Some(t) = found.remove(&name) else {
            if let Some(u) = unsupported.get(&name) {
                return Err(SourceError::UnsupportedDtype {
                    stored_as: u.origin.name.clone(),
                    dtype: u.dtype.clone(),
                    supported: WeightDtype::supported_list(),
                    path: u.origin.file.to_path_buf(),
                });
            }
            return Err(SourceError::MissingTensor {
                looked_for: looked_for(&name),
                name,
                path: path.to_path_buf(),
            });
        };
        if t.shape != shape {
            return Err(SourceError::ShapeMismatch {
                name,
                stored_as: t.origin.name.clone(),
                expected: shape,
                found: t.shape.clone(),
                path: t.origin.file.to_path_buf(),
            });
        }
        weights.insert(name, t);
    }
    Ok((weights, found.into_keys().collect()))
}
