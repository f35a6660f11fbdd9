//! Shared by the integration tests: where the generated tokenizer data lives.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use rafter_generate::Tokenizer;

/// `.cache/llm-tokenizers` (or `$RAFTER_LLM_TOKENIZERS_DIR`), made by
/// scripts/gen_tokenizer_fixtures.py. Panics with the command to run when it is missing:
/// these tests must fail, not pass, without their data.
pub fn cache_dir() -> PathBuf {
    let dir = std::env::var_os("RAFTER_LLM_TOKENIZERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/llm-tokenizers")
        });
    if !dir.join("STAMP").is_file() {
        panic!(
            "{} has no generated tokenizers: run `python3 scripts/gen_tokenizer_fixtures.py` \
             from the repository root first (or set RAFTER_LLM_TOKENIZERS_DIR)",
            dir.display()
        );
    }
    dir
}

/// Committed reference data under tests/data/.
pub fn data(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The vocabularies the script makes.
pub const VOCABS: &[&str] = &["qwen2", "llama-bpe", "llama-spm", "gpt-2", "gemma3"];

pub fn gguf_vocab(name: &str) -> rafter_generate::GgufVocab {
    let path = cache_dir().join(name).join("vocab.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

type Cache = Mutex<HashMap<String, &'static Tokenizer>>;

/// Loads once per test binary (a 262k vocabulary takes a second or more to build).
fn cached(
    cache: &'static OnceLock<Cache>,
    key: &str,
    load: impl FnOnce() -> Tokenizer,
) -> &'static Tokenizer {
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(t) = map.lock().unwrap().get(key) {
        return t;
    }
    let t: &'static Tokenizer = Box::leak(Box::new(load()));
    map.lock().unwrap().entry(key.to_string()).or_insert(t)
}

pub fn hf_tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    cached(&CACHE, name, || {
        Tokenizer::from_hf_dir(cache_dir().join(name).join("hf"))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    })
}

pub fn gguf_tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    cached(&CACHE, name, || {
        Tokenizer::from_gguf_vocab(&gguf_vocab(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    })
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
