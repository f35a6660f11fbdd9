//! llama.cpp's vocabulary GGUFs (models/ggml-vocab-*.gguf in its source tree, written by
//! gguf-py; 19 files, v2 and v3, up to 262k-token vocabularies) read as gguf-py's reader
//! reads them: every key, offset, type and value, every array element (by hash).
//!
//! The files are not committed (up to 16 MB each); the test needs llama.cpp's source
//! tree in `RAFTER_LLAMA_CPP_DIR` (vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist).
//! Without it the test prints a note and passes, unless `RAFTER_REQUIRE_LLAMA_CPP=1`.
//! The committed summary comes from gen_vocab_summary.py.

mod common;

use std::path::PathBuf;

use rafter_gguf::GgufFile;

fn llama_cpp_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RAFTER_LLAMA_CPP_DIR").map(PathBuf::from);
    let required = std::env::var("RAFTER_REQUIRE_LLAMA_CPP").is_ok_and(|v| v == "1");
    match dir {
        Some(d) if d.join("models").is_dir() => Some(d),
        other => {
            let msg = format!(
                "vocab_gguf_py: RAFTER_LLAMA_CPP_DIR ({other:?}) is not llama.cpp's source tree \
                 (it needs models/ggml-vocab-*.gguf)"
            );
            assert!(!required, "{msg}, and RAFTER_REQUIRE_LLAMA_CPP=1");
            eprintln!("{msg}; skipping");
            None
        }
    }
}

#[test]
fn vocab_files_match_gguf_py() {
    let Some(dir) = llama_cpp_dir() else { return };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vocab_summary.json");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let files = summary["files"].as_array().unwrap();
    assert!(files.len() >= 19, "summary lists every vocabulary file");
    for expected in files {
        let name = expected["file"].as_str().unwrap();
        let file =
            GgufFile::open(dir.join("models").join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        common::assert_matches_summary(&file, expected);
    }
}

/// The typed getters on a real vocabulary: Qwen2's 151,936 tokens, token types and
/// special ids, as the summary records them.
#[test]
fn qwen2_vocab_through_getters() {
    let Some(dir) = llama_cpp_dir() else { return };
    let file = GgufFile::open(dir.join("models/ggml-vocab-qwen2.gguf")).unwrap();
    assert_eq!(file.get_str("general.architecture").unwrap(), "qwen2");
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    let tokens = file.get_string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 151_936);
    assert_eq!(tokens.get(0), Some("!"));
    let types = file.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), tokens.len());
    let eos = file.get_u32("tokenizer.ggml.eos_token_id").unwrap();
    assert_eq!(tokens.get(eos as usize), Some("<|endoftext|>"));
    assert!(file
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
}
