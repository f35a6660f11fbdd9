//! Weights as the graph builder sees them: canonical names, logical shapes, zero-copy
//! bytes, and the per-source [`Conventions`] that say how to use them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rafter_gguf::GgmlType;

/// The element type of a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    F32,
    F16,
    BF16,
    /// A ggml block-quantized type, stored as the GGUF file stores it (one of
    /// [`SUPPORTED_GGML_TYPES`]).
    Ggml(GgmlType),
}

/// The ggml block types rafter computes on: those in the Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q8_0
/// (and Q4_0/Q4_1/Q5_0/Q5_1) files in the wild. A GGUF tensor of any other block type is an
/// [`crate::source::SourceError::UnsupportedDtype`].
pub const SUPPORTED_GGML_TYPES: [GgmlType; 10] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
];

impl WeightDtype {
    /// The dtype of a GGUF tensor type, if rafter computes on it.
    pub fn from_ggml(ty: GgmlType) -> Option<WeightDtype> {
        match ty {
            GgmlType::F32 => Some(WeightDtype::F32),
            GgmlType::F16 => Some(WeightDtype::F16),
            GgmlType::BF16 => Some(WeightDtype::BF16),
            t if SUPPORTED_GGML_TYPES.contains(&t) => Some(WeightDtype::Ggml(t)),
            _ => None,
        }
    }

    /// "F32, F16, BF16, q8_0, ...": for error messages.
    pub fn supported_list() -> String {
        let mut names = vec!["F32".to_string(), "F16".into(), "BF16".into()];
        names.extend(SUPPORTED_GGML_TYPES.iter().map(|t| t.name().to_string()));
        names.join(", ")
    }

    /// Bytes taken by `elems` elements laid out in rows of `row` elements, or `None` if a
    /// row is not a whole number of blocks.
    pub fn bytes_for(self, elems: usize, row: usize) -> Option<usize> {
        match self {
            WeightDtype::F32 => elems.checked_mul(4),
            WeightDtype::F16 | WeightDtype::BF16 => elems.checked_mul(2),
            WeightDtype::Ggml(t) => {
                let block = t.block_elems() as usize;
                if row % block != 0 {
                    return None;
                }
                (elems / block).checked_mul(t.block_bytes() as usize)
            }
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightDtype::F32 => f.write_str("F32"),
            WeightDtype::F16 => f.write_str("F16"),
            WeightDtype::BF16 => f.write_str("BF16"),
            WeightDtype::Ggml(t) => f.write_str(t.name()),
        }
    }
}

/// Where a weight comes from, for messages and provenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorOrigin {
    /// The file holding the bytes.
    pub file: Arc<Path>,
    /// The tensor's name in that file (`blk.0.attn_q.weight`,
    /// `model.layers.0.self_attn.q_proj.weight`), with `[e]` appended for one expert of
    /// a stacked tensor.
    pub name: String,
}

/// A tensor stored in a dtype rafter does not compute on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedTensor {
    pub origin: TensorOrigin,
    /// The dtype's name in the file (`"I64"`, `"q3_K"`).
    pub dtype: String,
}

/// One weight: dtype, logical shape and bytes.
///
/// `shape` is outermost first, as PyTorch writes it: `[out, in]` for linear weights (the
/// bytes hold `out` rows of `in` elements; for block types each row is `in / block`
/// blocks), `[experts, out, in]` for stacked experts, `[n]` for norms. `bytes` is a
/// zero-copy slice of the memory-mapped file.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightTensor {
    pub dtype: WeightDtype,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
    pub origin: TensorOrigin,
}

impl WeightTensor {
    /// The number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Sub-tensor `i` along the outermost dimension (expert `i` of `[experts, out, in]`),
    /// zero-copy: the experts of a stacked tensor are contiguous, whatever the dtype.
    pub fn index_outer(&self, i: usize) -> Option<WeightTensor> {
        let (&outer, inner) = self.shape.split_first()?;
        if i >= outer || inner.is_empty() {
            return None;
        }
        let stride = self.bytes.len() / outer;
        Some(WeightTensor {
            dtype: self.dtype,
            shape: inner.to_vec(),
            bytes: self.bytes.slice(i * stride..(i + 1) * stride),
            origin: TensorOrigin {
                file: Arc::clone(&self.origin.file),
                name: format!("{}[{i}]", self.origin.name),
            },
        })
    }
}

impl WeightTensor {
    /// Rows `start..end` of a 2-D `[rows, cols]` tensor, or elements of a vector (a fused
    /// q/k/v bias), zero-copy (rows are contiguous, whole blocks for block types); `part`
    /// names the slice in the origin.
    pub fn rows(&self, start: usize, end: usize, part: &str) -> Option<WeightTensor> {
        let (rows, cols) = match self.shape[..] {
            [rows, cols] => (rows, Some(cols)),
            [rows] => (rows, None),
            _ => return None,
        };
        if start > end || end > rows {
            return None;
        }
        let stride = self.bytes.len() / rows.max(1);
        Some(WeightTensor {
            dtype: self.dtype,
            shape: match cols {
                Some(cols) => vec![end - start, cols],
                None => vec![end - start],
            },
            bytes: self.bytes.slice(start * stride..end * stride),
            origin: TensorOrigin {
                file: Arc::clone(&self.origin.file),
                name: format!("{}[{part}]", self.origin.name),
            },
        })
    }
}

/// The canonical weights of a model, by canonical (HF-style) name.
///
/// Names are those of a transformers checkpoint of the architecture without any wrapper
/// prefix: `model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`,
/// `model.layers.{i}.mlp.gate.weight` (the MoE router), `model.norm.weight`,
/// `lm_head.weight` (absent when tied). Experts are
/// `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight` when stored one by one,
/// or `model.layers.{i}.mlp.experts.{gate,up,down}_proj.weight` of shape
/// `[experts, out, in]` when stacked ([`ExpertLayout`]); [`Weights::expert`] reads either.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    pub(crate) tensors: BTreeMap<String, WeightTensor>,
}

/// One of an expert's three projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

impl ExpertProj {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ExpertProj::Gate => "gate_proj",
            ExpertProj::Up => "up_proj",
            ExpertProj::Down => "down_proj",
        }
    }
}

impl Weights {
    /// The weight named `name`.
    pub fn get(&self, name: &str) -> Option<&WeightTensor> {
        self.tensors.get(name)
    }

    /// All weights in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &WeightTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The number of weights.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total bytes of all weights.
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes.len()).sum()
    }

    /// Projection `proj` of expert `expert` in layer `layer`, shape `[out, in]`, zero-copy
    /// whether the source stores experts one by one or stacked.
    pub fn expert(&self, layer: usize, expert: usize, proj: ExpertProj) -> Option<WeightTensor> {
        let p = proj.name();
        if let Some(t) = self.get(&format!(
            "model.layers.{layer}.mlp.experts.{expert}.{p}.weight"
        )) {
            return Some(t.clone());
        }
        self.get(&format!("model.layers.{layer}.mlp.experts.{p}.weight"))?
            .index_outer(expert)
    }

    pub(crate) fn insert(&mut self, name: String, tensor: WeightTensor) {
        self.tensors.insert(name, tensor);
    }
}

/// How the elements of each head are paired for rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// Element `j` rotates with element `j + head_dim/2` (HF's `rotate_half`; ggml's NEOX
    /// mode). Every HF checkpoint, and GGUF Qwen3, Qwen3-MoE and Gemma 3.
    Halves,
    /// Element `2j` rotates with `2j + 1` (ggml's "normal" mode). GGUF Llama: its
    /// converter permutes the rows of `q_proj` and `k_proj` within each head
    /// (conversion/llama.py, `LlamaModel.permute`, applied in `modify_tensors` since
    /// `undo_permute = True`) so that interleaved pairs of the permuted weights are HF's
    /// half pairs: permuted row `2j + t` of a head is HF row `j + t * head_dim/2`. Scores
    /// `q·k` are unchanged by the permutation (queries and keys are permuted alike, values
    /// are not), so interleaved rope on the permuted weights equals HF's model exactly.
    Interleaved,
}

/// How stored RMSNorm weights scale the normalised activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormWeight {
    /// `x * w`: the weight is the scale (Llama, Qwen; every GGUF).
    Scale,
    /// `x * (1 + w)`: HF Gemma 3 stores the offset from 1 (`Gemma3RMSNorm`). llama.cpp's
    /// converter adds the 1 when writing GGUF (conversion/gemma.py,
    /// `Gemma3Model.norm_shift`, applied in `modify_tensors` to every `*norm.weight`,
    /// q/k norms included), so GGUF Gemma 3 norms are [`NormWeight::Scale`].
    OnePlus,
}

/// How experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertLayout {
    /// No MoE layers.
    None,
    /// One `[out, in]` tensor per expert and projection (HF checkpoints; transformers 5's
    /// fused `gate_up_proj`/`down_proj` are split into these zero-copy).
    PerExpert,
    /// One `[experts, out, in]` tensor per projection (GGUF `ffn_{gate,up,down}_exps`:
    /// the converter stacks HF's experts with `torch.stack(datas, dim=0)`,
    /// conversion/qwen.py `Qwen2MoeModel.modify_tensors`).
    Stacked,
}

/// Everything about *how to use* the weights that depends on where they came from. The
/// graph builder must honour each field; the spec alone is the same for both sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conventions {
    pub rope_pairing: RopePairing,
    pub norm_weight: NormWeight,
    pub experts: ExpertLayout,
}

/// Where the model was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// A Hugging Face folder.
    HfFolder { dir: PathBuf },
    /// A GGUF file.
    Gguf { path: PathBuf },
}
