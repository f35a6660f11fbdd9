//! The tokenizer fuzz targets' committed seeds: `fuzz/seeds/read_gguf_tokenizer/*.gguf` (tiny
//! GGUF vocabularies of both kinds with chat templates) and
//! `fuzz/seeds/read_tokenizer_json/*.bin` (tokenizer.json, tokenizer_config.json,
//! generation_config.json and chat_template.jinja joined by NUL bytes, as the target splits
//! them). `write_fuzz_seeds` (ignored; run with `--ignored`) regenerates them from the tiny
//! vocabularies below; `fuzz_seeds_load` checks they still load, encode and render, so
//! mutations start from inputs that reach the tokenizer and the template.

use std::path::{Path, PathBuf};

use rafter_generate::{
    token_type, ChatRequest, ChatTemplate, GgufVocab, HfTokenizerFiles, Message, Tokenizer,
};
use rafter_gguf::{Array, GgufFile, GgufWriter, Value};
use tokenizers::models::unigram::Unigram;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Llama 2's template: a system prompt folded into the first turn, roles that must alternate
/// (else `raise_exception`), `.strip()` from Python.
const LLAMA2: &str = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

fn seeds(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

/// GPT-2's byte alphabet: printable bytes stand for themselves, the rest for 256 + n.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// A byte-level BPE (llama.cpp `gpt2`, Qwen 2's pre-tokenizer) with a few merges and ChatML.
pub fn tiny_bpe() -> GgufVocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let merges = [
        "H e", "l l", "ll o", "He llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![token_type::NORMAL; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.into());
        types.push(token_type::CONTROL);
    }
    tokens.push("<think>".into());
    types.push(token_type::USER_DEFINED);
    let n = tokens.len() as u32;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        token_type: Some(types),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        eos_token_id: Some(n - 2),
        padding_token_id: Some(n - 4),
        add_bos_token: Some(false),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    }
}

/// A SentencePiece vocabulary (llama.cpp `llama`): byte fallback, scored pieces, Llama 2's
/// template.
pub fn tiny_spm() -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![
        token_type::UNKNOWN,
        token_type::CONTROL,
        token_type::CONTROL,
    ];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    for (i, t) in [
        "▁", "H", "e", "l", "o", "w", "r", "d", "ll", "▁H", "llo", "▁He", "▁Hello",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(t.to_string());
        types.push(token_type::NORMAL);
        scores.push(-(i as f32));
    }
    GgufVocab {
        model: "llama".into(),
        tokens,
        token_type: Some(types),
        scores: Some(scores),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        chat_template: Some(LLAMA2.into()),
        ..Default::default()
    }
}

/// The vocabulary as GGUF metadata (no tensors), as llama.cpp's converter writes it.
pub fn vocab_gguf(v: &GgufVocab) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("tokenizer.ggml.{s}");
    let mut add = |key: String, value: Value| {
        w.add(&key, value).unwrap();
    };
    add("general.architecture".into(), Value::String("llama".into()));
    add(k("model"), Value::String(v.model.clone()));
    if let Some(p) = &v.pre {
        add(k("pre"), Value::String(p.clone()));
    }
    add(k("tokens"), Value::Array(Array::from_strings(&v.tokens)));
    if let Some(t) = &v.token_type {
        add(k("token_type"), Value::Array(Array::from_slice(t)));
    }
    if let Some(s) = &v.scores {
        add(k("scores"), Value::Array(Array::from_slice(s)));
    }
    if let Some(m) = &v.merges {
        add(k("merges"), Value::Array(Array::from_strings(m)));
    }
    for (name, id) in [
        ("bos_token_id", v.bos_token_id),
        ("eos_token_id", v.eos_token_id),
        ("unknown_token_id", v.unknown_token_id),
        ("padding_token_id", v.padding_token_id),
    ] {
        if let Some(id) = id {
            add(k(name), Value::U32(id));
        }
    }
    if let Some(b) = v.add_bos_token {
        add(k("add_bos_token"), Value::Bool(b));
    }
    if let Some(t) = &v.chat_template {
        add("tokenizer.chat_template".into(), Value::String(t.clone()));
    }
    w.to_vec().unwrap()
}

/// The four files joined by NUL bytes (absent trailing files dropped).
fn joined(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

fn tokenizer_json(t: &tokenizers::Tokenizer) -> String {
    t.to_string(false).unwrap()
}

/// A BERT-style WordPiece tokenizer, made by the tokenizers crate itself.
fn tiny_wordpiece() -> String {
    let vocab: tokenizers::models::bpe::Vocab = [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "he", "##llo", ",",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| (t.to_string(), i as u32))
    .collect();
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut t = tokenizers::Tokenizer::new(model);
    t.with_normalizer(Some(BertNormalizer::default())).unwrap();
    t.with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer_json(&t)
}

/// A Unigram tokenizer with SentencePiece's metaspace pre-tokenizer.
fn tiny_unigram() -> String {
    let pieces = [
        ("<unk>", 0.0),
        ("▁", -2.0),
        ("▁Hello", -1.0),
        ("▁world", -1.5),
        ("h", -3.0),
    ];
    let vocab = pieces.iter().map(|(p, s)| (p.to_string(), *s)).collect();
    let model = Unigram::from(vocab, Some(0), false).unwrap();
    let mut t = tokenizers::Tokenizer::new(model);
    t.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    t.with_decoder(Some(Metaspace::new('▁', PrependScheme::Always, true)));
    tokenizer_json(&t)
}

#[test]
#[ignore = "writes the committed seeds; run explicitly to regenerate them"]
fn write_fuzz_seeds() {
    let gguf = seeds("read_gguf_tokenizer");
    std::fs::create_dir_all(&gguf).unwrap();
    std::fs::write(gguf.join("bpe_chatml.gguf"), vocab_gguf(&tiny_bpe())).unwrap();
    std::fs::write(gguf.join("spm_llama2.gguf"), vocab_gguf(&tiny_spm())).unwrap();

    let json = seeds("read_tokenizer_json");
    std::fs::create_dir_all(&json).unwrap();
    let bpe = tokenizer_json(&tiny_bpe().build_tokenizer().unwrap());
    let config = serde_json::json!({ "eos_token": "<|im_end|>", "chat_template": CHATML });
    let generation = r#"{"eos_token_id": [265, 267]}"#;
    std::fs::write(
        json.join("bpe_chatml.bin"),
        joined(&[&bpe, &config.to_string(), generation]),
    )
    .unwrap();
    let spm = tokenizer_json(&tiny_spm().build_tokenizer().unwrap());
    let config = r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true, "add_eos_token": false}"#;
    std::fs::write(
        json.join("spm_llama2.bin"),
        joined(&[&spm, config, r#"{"eos_token_id": 2}"#, LLAMA2]),
    )
    .unwrap();
    std::fs::write(json.join("wordpiece.bin"), tiny_wordpiece()).unwrap();
    std::fs::write(json.join("unigram.bin"), tiny_unigram()).unwrap();
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// Encodes a greeting to something, and renders the template when there is one.
fn works(tok: &Tokenizer, what: &Path) {
    let ids = tok.encode("Hello world", true).unwrap();
    assert!(!ids.is_empty(), "{}", what.display());
    let text = tok
        .decode(&ids, true)
        .unwrap()
        .to_lowercase()
        .replace('▁', " ");
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words, ["hello", "world"], "{}: {ids:?}", what.display());
    if let Some(source) = tok.chat_template() {
        let t = ChatTemplate::new(source, &tok.bos_token(), &tok.eos_token()).unwrap();
        let req = ChatRequest::new(&[
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello."),
        ]);
        let prompt = t
            .render(&req)
            .unwrap_or_else(|e| panic!("{}: {e}", what.display()));
        assert!(
            prompt.contains("Hi") && prompt.contains("Hello."),
            "{prompt}"
        );
    }
}

#[test]
fn fuzz_seeds_load() {
    for path in files_in(&seeds("read_gguf_tokenizer")) {
        let bytes = std::fs::read(&path).unwrap();
        let f = GgufFile::from_bytes_named(bytes.into(), &path.display().to_string()).unwrap();
        let tok = Tokenizer::from_gguf(&f)
            .unwrap()
            .expect("a seed has a tokenizer");
        works(&tok, &path);
    }
    for path in files_in(&seeds("read_tokenizer_json")) {
        let bytes = std::fs::read(&path).unwrap();
        let mut parts = bytes.splitn(4, |&b| b == 0);
        let files = HfTokenizerFiles {
            dir: &path,
            tokenizer_json: parts.next().unwrap(),
            tokenizer_config: parts.next(),
            generation_config: parts.next(),
            chat_template: parts.next(),
        };
        let tok = Tokenizer::from_hf_files(files).unwrap_or_else(|e| panic!("{e}"));
        works(&tok, &path);
    }
}
