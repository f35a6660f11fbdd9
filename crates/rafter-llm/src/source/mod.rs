//! Model sources: a Hugging Face folder or a GGUF file, read into one canonical view.
//!
//! [`ModelSource::open`] takes either and returns the same thing: a validated
//! [`ModelSpec`], the weights under canonical (HF-style) names with logical shapes and
//! zero-copy bytes ([`Weights`]), and the [`Conventions`] that say how the weights must be
//! used. Everything is checked before it is returned: the architecture is one rafter
//! supports, the config has the fields it needs, every tensor the spec implies is present
//! with the shape the spec implies and a dtype rafter computes on; errors
//! ([`SourceError`]) name the file and the field or tensor.
//!
//! # Where the two sources differ
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py` and its `conversion/` package in the
//! llama-cpp-python 0.3.36 sdist) changes the semantics of some weights on the way to
//! GGUF. Zero-copy views cannot undo that, so each change is a field of [`Conventions`]
//! the graph builder must honour:
//!
//! * **Llama Q/K rows are permuted** (conversion/llama.py: `LlamaModel.undo_permute =
//!   True`; `modify_tensors` applies `LlamaModel.permute` to `q_proj` and `k_proj`), and
//!   llama.cpp runs `llama` with ggml's "normal" rope that rotates adjacent pairs
//!   (src/llama-model.cpp, `llama_model_rope_type`: `LLM_ARCH_LLAMA` →
//!   `LLAMA_ROPE_TYPE_NORM`), where HF's `rotate_half` rotates element `j` with `j + d/2`.
//!   → [`RopePairing::Interleaved`] for GGUF Llama, [`RopePairing::Halves`] otherwise
//!   (Qwen3, Qwen3-MoE and Gemma 3 use NEOX rope in ggml and are not permuted).
//! * **Gemma norms hold `1 + w`** in GGUF (conversion/gemma.py: `Gemma3Model.norm_shift`
//!   returns 1.0 for every name ending in `norm.weight`, added in `modify_tensors`), while
//!   HF's `Gemma3RMSNorm` computes `x * (1 + w)` from the stored `w`.
//!   → [`NormWeight::OnePlus`] for HF Gemma 3, [`NormWeight::Scale`] otherwise.
//! * **MoE experts are stacked** `[experts, out, in]` in GGUF (conversion/qwen.py:
//!   `Qwen2MoeModel.modify_tensors` merges `mlp.experts.{e}.{w}.weight` with
//!   `torch.stack(datas, dim=0)` into `ffn_{gate,up,down}_exps`), one tensor per expert in
//!   HF. → [`ExpertLayout`]; [`Weights::expert`] reads either, zero-copy.
//! * **Tied output**: HF says so in `tie_word_embeddings`; a GGUF has no `output.weight`
//!   (llama.cpp then reuses `token_embd`, `TENSOR_DUPLICATED` in the model loaders). Both
//!   become [`ModelSpec::tie_word_embeddings`] with no `lm_head.weight`.
//! * **Llama 3 rope scaling** is the `rope_freqs.weight` tensor in GGUF
//!   (conversion/llama.py `generate_extra_tensors`), the `llama3` parameters in HF.
//!   → [`crate::spec::RopeScaling::FreqFactors`] vs `Llama3`; both give the same
//!   [`crate::spec::RopeSpec::inv_freq`].
//! * **Gemma 3 embedding rows** are trimmed to the tokenizer's size in GGUF
//!   (conversion/gemma.py: `data_torch[:n_vocab_real]`), so `vocab_size` can be smaller
//!   than the HF config's; the spec takes it from the file.
//!
//! * **Fused tensors** written with the converter's `--fuse-qkv` (`attn_qkv`: rows of q,
//!   then k, then v) and `--fuse-gate-up-exps` (`ffn_gate_up_exps`: each expert's gate
//!   rows then its up rows; conversion/base.py `ModelBase.modify_tensors`), and
//!   transformers 5's fused `mlp.experts.gate_up_proj`, are split into the canonical
//!   tensors zero-copy (rows of a tensor are contiguous, whole blocks for block types).
//!
//! Tensor names map as [`GGUF_TO_HF`] lists. The mapping and conventions are checked
//! against files made by llama.cpp's own converter (tests/real_converter.rs, with
//! tests/make_converted_models.py).

mod error;
mod expected;
mod gguf_model;
mod hf_config;
mod hf_folder;
mod json;
mod weights;

use std::path::Path;

use rafter_gguf::{GgufFile, TensorMemory};

pub use error::SourceError;
pub use gguf_model::GGUF_TO_HF;
pub use hf_folder::{read_safetensors, TensorView};
pub use weights::{
    Conventions, ExpertLayout, ExpertProj, NormWeight, RopePairing, SourceFormat, TensorOrigin,
    UnsupportedTensor, WeightDtype, WeightTensor, Weights, SUPPORTED_GGML_TYPES,
};

use crate::spec::ModelSpec;

/// A model read from a Hugging Face folder or a GGUF file, validated and ready for the
/// graph builder.
#[derive(Clone, Debug)]
pub struct ModelSource {
    /// Everything that is not a weight.
    pub spec: ModelSpec,
    /// The weights under canonical names, exactly the ones the spec implies.
    pub weights: Weights,
    /// How the weights must be used (differs between sources; see the module docs).
    pub conventions: Conventions,
    /// Where the model came from.
    pub format: SourceFormat,
    /// Tensors in the files that the model does not use (vision towers, a tied
    /// `lm_head`, ...), by canonical name or, when they have none, the file's name.
    pub unused: Vec<String>,
    gguf: Option<GgufFile>,
}

impl ModelSource {
    /// Reads a model: a folder is read as a Hugging Face model (it needs `config.json`),
    /// a file as GGUF. The weights are memory-mapped ([`TensorMemory::Mapped`]).
    pub fn open(path: impl AsRef<Path>) -> Result<ModelSource, SourceError> {
        Self::open_with(path, TensorMemory::Mapped)
    }

    /// [`ModelSource::open`], with the weights where `memory` says: mapped from the files,
    /// or copied into memory backed by huge pages ([`TensorMemory::Resident`]: what a run
    /// that streams them every decode step wants).
    pub fn open_with(
        path: impl AsRef<Path>,
        memory: TensorMemory,
    ) -> Result<ModelSource, SourceError> {
        let path = path.as_ref();
        if path.is_dir() {
            if !path.join("config.json").is_file() {
                return Err(SourceError::NotAModel {
                    path: path.to_path_buf(),
                });
            }
            return hf_folder::open(path, memory);
        }
        let file = GgufFile::open_with(path, memory)?;
        gguf_model::from_file(file, path)
    }

    /// Reads a Hugging Face folder (`config.json`, optional `generation_config.json`,
    /// `tokenizer_config.json` or `chat_template.jinja`, and `model.safetensors` or the
    /// shards of `model.safetensors.index.json`), its weights memory-mapped.
    pub fn from_hf_folder(dir: impl AsRef<Path>) -> Result<ModelSource, SourceError> {
        hf_folder::open(dir.as_ref(), TensorMemory::Mapped)
    }

    /// Memory-maps and reads a GGUF file.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<ModelSource, SourceError> {
        let path = path.as_ref();
        let file = GgufFile::open(path)?;
        gguf_model::from_file(file, path)
    }

    /// Reads an already opened GGUF file; `path` names it in errors.
    pub fn from_gguf(file: GgufFile, path: impl AsRef<Path>) -> Result<ModelSource, SourceError> {
        gguf_model::from_file(file, path.as_ref())
    }

    /// The GGUF file, for what the spec does not carry (the tokenizer's
    /// `tokenizer.ggml.*` vocabulary); `None` for HF folders.
    pub fn gguf(&self) -> Option<&GgufFile> {
        self.gguf.as_ref()
    }
}
