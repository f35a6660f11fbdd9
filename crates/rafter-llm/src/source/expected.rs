//! The canonical tensors a spec implies, with their shapes, and the check that a source
//! provides exactly those.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::SourceError;
use super::weights::{ExpertLayout, UnsupportedTensor, WeightDtype, WeightTensor, Weights};
use crate::spec::{FfnKind, ModelSpec};

/// The canonical name and logical shape of every tensor the graph needs.
pub(crate) fn expected_tensors(
    spec: &ModelSpec,
    experts: ExpertLayout,
) -> Vec<(String, Vec<usize>)> {
    let (h, v, hd) = (spec.hidden_size, spec.vocab_size, spec.head_dim);
    let (q, kv) = (spec.num_heads * hd, spec.num_kv_heads * hd);
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !spec.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    for (i, layer) in spec.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mut add =
            |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}.weight"), shape));
        add("input_layernorm", vec![h]);
        add("self_attn.q_proj", vec![q, h]);
        add("self_attn.k_proj", vec![kv, h]);
        add("self_attn.v_proj", vec![kv, h]);
        add("self_attn.o_proj", vec![h, q]);
        if spec.qk_norm {
            add("self_attn.q_norm", vec![hd]);
            add("self_attn.k_norm", vec![hd]);
        }
        add("post_attention_layernorm", vec![h]);
        if spec.sandwich_norms {
            add("pre_feedforward_layernorm", vec![h]);
            add("post_feedforward_layernorm", vec![h]);
        }
        match (layer.ffn, &spec.moe) {
            (FfnKind::Moe, Some(moe)) => {
                let (e, f) = (moe.num_experts, moe.intermediate_size);
                add("mlp.gate", vec![e, h]);
                if experts == ExpertLayout::Stacked {
                    add("mlp.experts.gate_proj", vec![e, f, h]);
                    add("mlp.experts.up_proj", vec![e, f, h]);
                    add("mlp.experts.down_proj", vec![e, h, f]);
                } else {
                    for x in 0..e {
                        add(&format!("mlp.experts.{x}.gate_proj"), vec![f, h]);
                        add(&format!("mlp.experts.{x}.up_proj"), vec![f, h]);
                        add(&format!("mlp.experts.{x}.down_proj"), vec![h, f]);
                    }
                }
            }
            _ => {
                let f = spec.intermediate_size;
                add("mlp.gate_proj", vec![f, h]);
                add("mlp.up_proj", vec![f, h]);
                add("mlp.down_proj", vec![h, f]);
            }
        }
    }
    out
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
