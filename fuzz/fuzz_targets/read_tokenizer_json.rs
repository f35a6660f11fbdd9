//! Fuzzes the Hugging Face tokenizer loader (rafter-generate's `Tokenizer::from_hf_files`,
//! the `tokenizers` crate behind it, and the chat template it carries): arbitrary bytes,
//! split at NUL bytes into tokenizer.json, tokenizer_config.json, generation_config.json and
//! chat_template.jinja (JSON text holds no raw NUL). A tokenizer or an error, never a panic
//! or a hang; what loads encodes, decodes, reloads from its stored form alike and renders
//! its template or fails cleanly.
//!
//! Seeds: `fuzz/seeds/read_tokenizer_json/` (`cargo test -p rafter-generate --test
//! fuzz_seeds` keeps them loading; `-- --ignored` rewrites them).
#![no_main]

#[path = "common/tokenizer_checks.rs"]
mod tokenizer_checks;

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rafter_generate::{HfTokenizerFiles, Tokenizer};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |&b| b == 0);
    let tokenizer_json = parts.next().unwrap_or_default();
    let tokenizer_config = parts.next();
    let generation_config = parts.next();
    let chat_template = parts.next();
    let files = HfTokenizerFiles {
        dir: Path::new("fuzz"),
        tokenizer_json,
        tokenizer_config,
        chat_template,
        generation_config,
    };
    if let Ok(tok) = Tokenizer::from_hf_files(files) {
        tokenizer_checks::exercise(&tok);
    }
});
