//! A Hugging Face model folder: config files, chat template and safetensors weights.
//!
//! Weights come from `model.safetensors`, or from the shards a
//! `model.safetensors.index.json` lists (`model-0000N-of-0000M.safetensors`). Each file is
//! memory-mapped and its header parsed by the `safetensors` crate (which validates it:
//! header length, JSON, dtypes, offsets covering the data exactly); tensors are zero-copy
//! slices of the map. Names are canonicalised:
//!
//! * `Gemma3ForConditionalGeneration` prefixes the text model: `language_model.model.*`
//!   as saved by transformers 4 and by 5's `save_pretrained` (which reverts to the
//!   original format), `model.language_model.*` as transformers 5 holds it in memory;
//!   both become `model.*`, and `language_model.lm_head.weight` becomes
//!   `lm_head.weight`. Vision tower and projector tensors are left unused.
//! * transformers 5's fused MoE experts (`mlp.experts.gate_up_proj` of shape
//!   `[experts, 2 * moe_intermediate_size, hidden]` and `mlp.experts.down_proj` of
//!   `[experts, hidden, moe_intermediate_size]`, written with
//!   `save_pretrained(save_original_format=False)`) are split into per-expert tensors,
//!   zero-copy: expert `e`'s gate is the first half of its rows, its up projection the
//!   second (`chunk(2, dim=-1)` in `Qwen3MoeExperts.forward`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rafter_gguf::TensorMemory;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value};

use super::error::SourceError;
use super::expected::{take_expected, Unsupported};
use super::hf_config::read_spec;
use super::json::read_object;
use super::weights::{
    Conventions, ExpertLayout, NormWeight, RopePairing, SourceFormat, TensorOrigin,
    UnsupportedTensor, WeightDtype, WeightTensor,
};
use super::ModelSource;

/// Reads the model in folder `dir`.
pub(crate) fn open(dir: &Path, memory: TensorMemory) -> Result<ModelSource, SourceError> {
    let config_path = dir.join("config.json");
    let config = read_object(&config_path)?;
    let gen_path = dir.join("generation_config.json");
    let generation = match gen_path.is_file() {
        true => Some(read_object(&gen_path)?),
        false => None,
    };
    let mut spec = read_spec(
        &config_path,
        &config,
        generation.as_ref().map(|g| (gen_path.as_path(), g)),
    )?;
    spec.chat_template = chat_template(dir)?;

    let mut found = BTreeMap::new();
    let mut unsupported = Unsupported::new();
    for shard in weight_files(dir)? {
        read_shard(&shard, memory, &mut found, &mut unsupported)?;
    }
    let experts = match spec.moe {
        Some(_) => ExpertLayout::PerExpert,
        None => ExpertLayout::None,
    };
    if spec.tie_word_embeddings {
        // Tied: the output projection is the embedding, whatever lm_head a file carries.
        found.remove("lm_head.weight");
    }
    let (weights, unused) = take_expected(&spec, experts, found, &unsupported, dir, |name| {
        format!("'{name}' in the safetensors files")
    })?;
    let conventions = Conventions {
        rope_pairing: RopePairing::Halves,
        norm_weight: if spec.architecture.is_gemma() {
            NormWeight::OnePlus
        } else {
            NormWeight::Scale
        },
        experts,
    };
    Ok(ModelSource {
        spec,
        weights,
        conventions,
        format: SourceFormat::HfFolder {
            dir: dir.to_path_buf(),
        },
        unused,
        gguf: None,
    })
}

/// The chat template: `tokenizer_config.json`'s `chat_template` (a string, or a list of
/// named templates of which `default` is taken), else `chat_template.jinja`, else
/// `chat_template.json` (the order llama.cpp's converter uses, gguf-py `SpecialVocab`).
fn chat_template(dir: &Path) -> Result<Option<String>, SourceError> {
    let tok_config = dir.join("tokenizer_config.json");
    if tok_config.is_file() {
        let obj = read_object(&tok_config)?;
        if let Some(t) = template_value(&tok_config, obj.get("chat_template"))? {
            return Ok(Some(t));
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| SourceError::Io {
                path: jinja,
                source,
            });
    }
    let json = dir.join("chat_template.json");
    if json.is_file() {
        let obj = read_object(&json)?;
        return template_value(&json, obj.get("chat_template"));
    }
    Ok(None)
}

fn template_value(path: &Path, v: Option<&Value>) -> Result<Option<String>, SourceError> {
    let bad = |reason: &str| SourceError::BadField {
        path: path.to_path_buf(),
        field: "chat_template".into(),
        reason: reason.into(),
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |want: Option<&str>| {
                list.iter().find_map(|item| {
                    let name = item.get("name").and_then(Value::as_str);
                    let template = item.get("template").and_then(Value::as_str)?;
                    (want.is_none() || name == want).then(|| template.to_string())
                })
            };
            named(Some("default"))
                .or_else(|| named(None))
                .map(Some)
                .ok_or_else(|| bad("a list without any {name, template} entry"))
        }
        Some(_) => Err(bad("expected a string or a list of {name, template}")),
    }
}

/// One weights file and, when an index lists it, the tensors the index says it holds.
struct Shard {
    path: PathBuf,
    index: Option<(PathBuf, Vec<String>)>,
}

/// The safetensors files of the folder: the index's shards, or `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<Shard>, SourceError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let index = read_object(&index_path)?;
        let map: &Map<String, Value> = match index.get("weight_map") {
            Some(Value::Object(m)) => m,
            _ => {
                return Err(SourceError::BadField {
                    path: index_path,
                    field: "weight_map".into(),
                    reason: "missing or not an object of tensor name → file".into(),
                })
            }
        };
        let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str().filter(|f| is_plain_file_name(f)) else {
                return Err(SourceError::BadField {
                    path: index_path,
                    field: format!("weight_map.{tensor}"),
                    reason: format!("expected a file name in the folder, found {file}"),
                });
            };
            by_file
                .entry(file.to_string())
                .or_default()
                .push(tensor.clone());
        }
        return Ok(by_file
            .into_iter()
            .map(|(file, tensors)| Shard {
                path: dir.join(file),
                index: Some((index_path.clone(), tensors)),
            })
            .collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![Shard {
            path: single,
            index: None,
        }]);
    }
    let hint = if dir.join("pytorch_model.bin").is_file() {
        " (pytorch_model.bin is not read: convert it to safetensors)"
    } else {
        ""
    };
    Err(SourceError::Io {
        path: single,
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no model.safetensors or model.safetensors.index.json{hint}"),
        ),
    })
}

/// A file name without directories (an index must not point outside its folder).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != ".."
}

/// Maps (or, [`TensorMemory::Resident`], reads into memory) one safetensors file and adds
/// its tensors (canonically named) to `found`.
fn read_shard(
    shard: &Shard,
    memory: TensorMemory,
    found: &mut BTreeMap<String, WeightTensor>,
    unsupported: &mut Unsupported,
) -> Result<(), SourceError> {
    let path = &shard.path;
    // Resident, the header (JSON, a few KB) comes along: it is read once, here.
    let bytes = rafter_gguf::read_file(path, memory).map_err(|source| SourceError::Io {
        path: path.clone(),
        source,
    })?;
    let views = read_safetensors(&bytes, path)?;
    if let Some((index, listed)) = &shard.index {
        let has = |t: &String| views.iter().any(|(name, _)| name == t);
        if let Some(missing) = listed.iter().find(|t| !has(t)) {
            return Err(SourceError::IndexMismatch {
                index: index.clone(),
                tensor: missing.clone(),
                shard: path.clone(),
            });
        }
    }
    for (name, view) in views {
        let canonical = canonical_name(&name);
        match view {
            Err(bad) => {
                unsupported.insert(canonical, bad);
            }
            Ok(tensor) => match fused_experts(&canonical) {
                Some(fused) => split_fused(fused, tensor, found, path)?,
                None => {
                    found.insert(canonical, tensor);
                }
            },
        }
    }
    Ok(())
}

/// One tensor of a safetensors file: a zero-copy view, or why there is none.
pub type TensorView = Result<WeightTensor, UnsupportedTensor>;

/// The tensors of one safetensors file held in `bytes` (named `path` in errors), by their
/// names in the file: each a zero-copy view, or its origin and dtype name when the dtype
/// is not F32, F16 or BF16. The header is validated by the `safetensors` crate; its errors
/// are wrapped with the file name.
pub fn read_safetensors(
    bytes: &Bytes,
    path: &Path,
) -> Result<Vec<(String, TensorView)>, SourceError> {
    let (header_len, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|source| SourceError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let data_start = 8 + header_len;
    let file: Arc<Path> = Arc::from(path);
    let mut out: Vec<_> = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let origin = TensorOrigin {
                file: Arc::clone(&file),
                name: name.clone(),
            };
            let view = match hf_dtype(info.dtype) {
                None => Err(UnsupportedTensor {
                    origin,
                    dtype: format!("{:?}", info.dtype),
                }),
                Some(dtype) => {
                    // read_metadata checked the offsets tile the data section exactly.
                    let (start, end) = info.data_offsets;
                    Ok(WeightTensor {
                        dtype,
                        shape: info.shape.clone(),
                        bytes: bytes.slice(data_start + start..data_start + end),
                        origin,
                    })
                }
            };
            (name, view)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn hf_dtype(d: Dtype) -> Option<WeightDtype> {
    match d {
        Dtype::F32 => Some(WeightDtype::F32),
        Dtype::F16 => Some(WeightDtype::F16),
        Dtype::BF16 => Some(WeightDtype::BF16),
        _ => None,
    }
}

/// The canonical name of an HF tensor name (strips Gemma 3's multimodal prefixes).
fn canonical_name(name: &str) -> String {
    for (prefix, replacement) in [
        ("language_model.model.", "model."),
        ("model.language_model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return format!("{replacement}{rest}");
        }
    }
    name.to_string()
}

/// A transformers 5 fused expert tensor: layer prefix and which one.
enum Fused<'a> {
    GateUp(&'a str),
    Down(&'a str),
}

fn fused_experts(name: &str) -> Option<Fused<'_>> {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    if let Some(prefix) = name.strip_suffix(".mlp.experts.gate_up_proj") {
        return Some(Fused::GateUp(prefix));
    }
    name.strip_suffix(".mlp.experts.down_proj").map(Fused::Down)
}

/// Splits a fused `[experts, rows, in]` tensor into per-expert canonical tensors.
fn split_fused(
    fused: Fused,
    tensor: WeightTensor,
    found: &mut BTreeMap<String, WeightTensor>,
    path: &Path,
) -> Result<(), SourceError> {
    let bad = |reason: String| SourceError::Inconsistent {
        path: path.to_path_buf(),
        reason: format!("fused expert tensor '{}': {reason}", tensor.origin.name),
    };
    if tensor.shape.len() != 3 {
        return Err(bad(format!("expected 3 dims, found {:?}", tensor.shape)));
    }
    let experts = tensor.shape[0];
    for e in 0..experts {
        let Some(expert) = tensor.index_outer(e) else {
            return Err(bad(format!("cannot take expert {e}")));
        };
        match fused {
            Fused::GateUp(prefix) => {
                let rows = expert.shape[0];
                if rows % 2 != 0 {
                    return Err(bad(format!("odd gate_up row count {rows}")));
                }
                let gate = expert.rows(0, rows / 2, "gate half");
                let up = expert.rows(rows / 2, rows, "up half");
                for (proj, part) in [("gate_proj", gate), ("up_proj", up)] {
                    let part = part.ok_or_else(|| bad(format!("cannot split expert {e}")))?;
                    found.insert(format!("{prefix}.mlp.experts.{e}.{proj}.weight"), part);
                }
            }
            Fused::Down(prefix) => {
                found.insert(format!("{prefix}.mlp.experts.{e}.down_proj.weight"), expert);
            }
        }
    }
    Ok(())
}
