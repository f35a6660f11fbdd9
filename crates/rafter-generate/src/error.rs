//! The crate's error type: every failure names what and where (file, field, token, template).

use std::path::PathBuf;

/// Errors of tokenizer loading, templating, sampling and generation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (tokenizer.json, tokenizer_config.json, ...) is malformed.
    #[error("{path}: {message}")]
    BadJson { path: PathBuf, message: String },
    /// A folder lacks a file generation needs.
    #[error("{path}: missing {what}")]
    Missing { path: PathBuf, what: String },
    /// The `tokenizers` library rejected a tokenizer or an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A GGUF vocabulary is inconsistent or of a kind we do not support.
    #[error("GGUF vocabulary: {0}")]
    Vocab(String),
    /// A chat template failed to compile or render (including the template's own
    /// `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// Sampling parameters out of range or logits of the wrong size.
    #[error("sampling: {0}")]
    Sampling(String),
    /// The prompt does not fit the model's context.
    #[error("prompt of {prompt} tokens does not fit the model's context of {max_context} tokens")]
    PromptTooLong { prompt: usize, max_context: usize },
    /// The prompt has no token (a model needs at least one position to predict from).
    #[error("empty prompt: encode some text or add a BOS token")]
    EmptyPrompt,
    /// The model failed during a forward call.
    #[error("model: {0}")]
    Model(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn tok(e: impl std::fmt::Display) -> Self {
        Error::Tokenizer(e.to_string())
    }
}
