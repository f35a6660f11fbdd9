//! Fuzzes the GGUF-embedded tokenizer: arbitrary bytes read as a GGUF file, its
//! `tokenizer.ggml.*` vocabulary (rafter-generate's `Tokenizer::from_gguf`: token, score and
//! type arrays, merges, special ids, the llama.cpp pre-tokenizer) built into a tokenizer, and
//! its chat template. A tokenizer or an error, never a panic or a hang; what loads encodes,
//! decodes, reloads from its stored form alike and renders its template or fails cleanly.
//!
//! Seeds: `fuzz/seeds/read_gguf_tokenizer/` (`cargo test -p rafter-generate --test
//! fuzz_seeds` keeps them loading; `-- --ignored` rewrites them).
#![no_main]

#[path = "common/tokenizer_checks.rs"]
mod tokenizer_checks;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rafter_generate::Tokenizer;
use rafter_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(Bytes::copy_from_slice(data)) else {
        return;
    };
    if let Ok(Some(tok)) = Tokenizer::from_gguf(&file) {
        tokenizer_checks::exercise(&tok);
    }
});
