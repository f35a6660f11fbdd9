//! A GGUF file's embedded tokenizer (`tokenizer.ggml.*`) as [`GgufVocab`].

use rafter_generate::GgufVocab;
use rafter_gguf::{GgufError, GgufFile};

/// Reads every `tokenizer.ggml.*` key [`GgufVocab`] holds (and `tokenizer.chat_template`);
/// errors name the key whose value has the wrong type. A file without `tokenizer.ggml.model`
/// has no tokenizer: `Ok(None)`. (The reader lives in rafter-generate, which the
/// `read_gguf_tokenizer` fuzz target builds without the compiler.)
pub fn gguf_vocab(f: &GgufFile) -> Result<Option<GgufVocab>, GgufError> {
    GgufVocab::from_gguf(f)
}
