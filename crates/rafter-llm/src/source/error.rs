//! [`SourceError`]: what can go wrong reading a model, naming the file and the field or
//! tensor.

use std::path::PathBuf;

/// An error reading a model source. Every variant names the file (or folder) and the
/// field or tensor concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is neither a Hugging Face model folder (no config.json) nor a GGUF file", path.display())]
    NotAModel { path: PathBuf },

    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{}: unknown architecture '{found}' (supported: {supported})", path.display())]
    UnknownArchitecture {
        path: PathBuf,
        found: String,
        supported: String,
    },

    #[error("{}: missing field {field} (needed for {architecture})", path.display())]
    MissingField {
        path: PathBuf,
        /// The field, quoted, with alternative names: `'num_experts' (or 'num_local_experts')`.
        field: String,
        architecture: String,
    },

    #[error("{}: field '{field}': {reason}", path.display())]
    BadField {
        path: PathBuf,
        field: String,
        reason: String,
    },

    #[error("{}: {what} is not supported", path.display())]
    Unsupported { path: PathBuf, what: String },

    #[error("{}: inconsistent model: {reason}", path.display())]
    Inconsistent { path: PathBuf, reason: String },

    #[error("missing tensor '{name}' ({looked_for} in {})", path.display())]
    MissingTensor {
        /// The canonical (HF-style) name.
        name: String,
        /// What was looked for, in the file's own naming.
        looked_for: String,
        path: PathBuf,
    },

    #[error(
        "tensor '{name}' ({stored_as} in {}) has shape {found:?}, but the config implies {expected:?}",
        path.display()
    )]
    ShapeMismatch {
        name: String,
        stored_as: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        path: PathBuf,
    },

    #[error(
        "tensor '{stored_as}' in {} has dtype {dtype}, which rafter cannot compute (supported: {supported})",
        path.display()
    )]
    UnsupportedDtype {
        stored_as: String,
        dtype: String,
        supported: String,
        path: PathBuf,
    },

    #[error("{}: not a valid safetensors file: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },

    #[error(
        "{}: the index maps tensor '{tensor}' to {}, which does not contain it",
        index.display(), shard.display()
    )]
    IndexMismatch {
        index: PathBuf,
        tensor: String,
        shard: PathBuf,
    },

    #[error(transparent)]
    Gguf(#[from] rafter_gguf::GgufError),
}
