//! Hostile tokenizer files and chat templates (issue 28, item 6): empty, truncated and
//! malformed tokenizer.json and its companions, ids past any vocabulary, merges of tokens
//! that do not exist, GGUF vocabularies whose arrays disagree, templates that loop, raise,
//! recurse or render without end. Each is an error naming the file (or template) and the
//! field, never a panic, a hang or an allocation sized by the input.

use std::path::{Path, PathBuf};

use rafter_generate::{ChatRequest, ChatTemplate, HfTokenizerFiles, Message, Tokenizer};
use rafter_gguf::{Array, GgufFile, GgufWriter, Value};

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The valid byte-level BPE seed's four files.
fn bpe_files() -> [String; 3] {
    let bytes = seed("read_tokenizer_json", "bpe_chatml.bin");
    let parts: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .collect();
    [parts[0].clone(), parts[1].clone(), parts[2].clone()]
}

fn dir() -> PathBuf {
    PathBuf::from("models/hostile")
}

fn load(json: &str, config: Option<&str>, generation: Option<&str>) -> Result<Tokenizer, String> {
    let dir = dir();
    Tokenizer::from_hf_files(HfTokenizerFiles {
        dir: &dir,
        tokenizer_json: json.as_bytes(),
        tokenizer_config: config.map(str::as_bytes),
        chat_template: None,
        generation_config: generation.map(str::as_bytes),
    })
    .map_err(|e| e.to_string())
}

#[track_caller]
fn load_err(json: &str, config: Option<&str>, generation: Option<&str>) -> String {
    match load(json, config, generation) {
        Ok(_) => panic!("a hostile tokenizer loaded: {json:.200}"),
        Err(e) => e,
    }
}

#[test]
fn the_valid_seed_loads() {
    let [json, config, generation] = bpe_files();
    load(&json, Some(&config), Some(&generation)).unwrap();
}

#[test]
fn empty_truncated_and_malformed_tokenizer_json_name_the_file() {
    let [json, ..] = bpe_files();
    let file = "models/hostile/tokenizer.json";
    let mut cases: Vec<String> = vec![
        String::new(),
        "   ".into(),
        "not json".into(),
        "[]".into(),
        "{}".into(),
        r#"{"model": 7}"#.into(),
        r#"{"model": {"type": "BPE"}}"#.into(),
        r#"{"model": {"type": "Martian", "vocab": {}}}"#.into(),
    ];
    for end in (1..json.len()).step_by(97) {
        if json.is_char_boundary(end) {
            cases.push(json[..end].to_string());
        }
    }
    for case in &cases {
        let e = load_err(case, None, None);
        assert!(e.contains(file), "{case:.60?}: {e}");
    }
    let dir = dir();
    let e = Tokenizer::from_hf_files(HfTokenizerFiles {
        dir: &dir,
        tokenizer_json: b"{\"model\": \xff}",
        tokenizer_config: None,
        chat_template: None,
        generation_config: None,
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains(file) && e.contains("UTF-8"), "{e}");
}

#[test]
fn malformed_companion_files_are_named() {
    let [json, ..] = bpe_files();
    for config in ["", "{", "[1, 2", r#"{"chat_template": 7}"#] {
        let e = load_err(&json, Some(config), None);
        assert!(e.contains("tokenizer_config.json"), "{config:?}: {e}");
    }
    for generation in [
        "",
        r#"{"eos_token_id": 4294967296}"#,
        r#"{"eos_token_id": -1}"#,
        r#"{"eos_token_id": [2, "x"]}"#,
        r#"{"eos_token_id": 99999999999}"#,
    ] {
        let e = load_err(&json, None, Some(generation));
        assert!(e.contains("generation_config.json"), "{generation:?}: {e}");
        if !generation.is_empty() {
            assert!(e.contains("eos_token_id"), "{generation:?}: {e}");
        }
    }
}

/// A tokenizer.json with `vocab` and `merges` replaced.
fn with_model(vocab: serde_json::Value, merges: serde_json::Value) -> String {
    let [json, ..] = bpe_files();
    let mut doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    doc["model"]["vocab"] = vocab;
    doc["model"]["merges"] = merges;
    doc["added_tokens"] = serde_json::json!([]);
    doc["post_processor"] = serde_json::Value::Null;
    doc.to_string()
}

#[test]
fn huge_or_shared_ids_are_named() {
    use serde_json::json;
    for (vocab, field) in [
        (json!({"a": 0, "b": 4_000_000_000u64}), "model.vocab[\"b\"]"),
        (json!({"a": 0, "b": 16_777_216}), "model.vocab[\"b\"]"),
        (json!({"a": 0, "b": 1u64 << 40}), "model.vocab"),
        (json!({"a": 0, "b": 0}), "model.vocab gives id 0"),
    ] {
        let e = load_err(&with_model(vocab, json!([])), None, None);
        assert!(
            e.contains("models/hostile/tokenizer.json") && e.contains(field),
            "{field}: {e}"
        );
    }
}

#[test]
fn merges_of_tokens_not_in_the_vocabulary_are_named() {
    use serde_json::json;
    let vocab = json!({"a": 0, "b": 1, "ab": 2});
    for (merges, what) in [
        (json!(["a b", "a zz"]), "model.merges[1]"),
        (json!([["a", "b"], ["zz", "a"]]), "model.merges[1]"),
        (json!(["b a"]), "\"ba\", which is not a token"),
        (json!(["a b c"]), "model.merges[0]"),
    ] {
        let e = load_err(&with_model(vocab.clone(), merges), None, None);
        assert!(
            e.contains("models/hostile/tokenizer.json") && e.contains(what),
            "{what}: {e}"
        );
    }
}

/// The valid GGUF seed's metadata with `edit` applied, read back as a file named `name`.
fn gguf_with(edit: impl FnOnce(&mut Vec<(String, Value)>)) -> GgufFile {
    let valid = seed("read_gguf_tokenizer", "spm_llama2.gguf");
    let f = GgufFile::from_bytes(valid.into()).unwrap();
    let mut meta: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .map(|e| (e.key().to_string(), e.value().clone()))
        .collect();
    edit(&mut meta);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(&k, v).unwrap();
    }
    GgufFile::from_bytes_named(w.to_vec().unwrap().into(), "hostile.gguf").unwrap()
}

fn set(meta: &mut [(String, Value)], key: &str, value: Value) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap().1 = value;
}

#[track_caller]
fn gguf_err(f: &GgufFile) -> String {
    match Tokenizer::from_gguf(f) {
        Ok(_) => panic!("a hostile GGUF vocabulary loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn gguf_arrays_that_disagree_in_length_are_named() {
    assert!(Tokenizer::from_gguf(&gguf_with(|_| {})).unwrap().is_some());
    let e = gguf_err(&gguf_with(|m| {
        set(
            m,
            "tokenizer.ggml.scores",
            Value::Array(Array::from_slice(&[0.0f32; 5])),
        )
    }));
    assert!(
        e.contains("hostile.gguf")
            && e.contains("tokenizer.ggml.scores has 5 entries for 272 tokens"),
        "{e}"
    );
    let e = gguf_err(&gguf_with(|m| {
        set(
            m,
            "tokenizer.ggml.token_type",
            Value::Array(Array::from_slice(&[1i32; 300])),
        )
    }));
    assert!(
        e.contains("hostile.gguf") && e.contains("tokenizer.ggml.token_type has 300 entries"),
        "{e}"
    );
    let e = gguf_err(&gguf_with(|m| {
        set(
            m,
            "tokenizer.ggml.tokens",
            Value::Array(Array::from_strings(&["a", "b"])),
        )
    }));
    assert!(
        e.contains("hostile.gguf") && e.contains("for 2 tokens"),
        "{e}"
    );
}

#[test]
fn gguf_fields_of_the_wrong_type_or_range_are_named() {
    let e = gguf_err(&gguf_with(|m| {
        set(
            m,
            "tokenizer.ggml.scores",
            Value::Array(Array::from_strings(&["x"])),
        )
    }));
    assert!(
        e.contains("hostile.gguf") && e.contains("tokenizer.ggml.scores"),
        "{e}"
    );
    let e = gguf_err(&gguf_with(|m| {
        set(m, "tokenizer.ggml.eos_token_id", Value::U32(1 << 30))
    }));
    assert!(
        e.contains("hostile.gguf") && e.contains("eos_token_id = 1073741824"),
        "{e}"
    );
    let e = gguf_err(&gguf_with(|m| {
        m.retain(|(k, _)| k != "tokenizer.ggml.tokens")
    }));
    assert!(
        e.contains("hostile.gguf") && e.contains("tokenizer.ggml.tokens"),
        "{e}"
    );
    let e = gguf_err(&gguf_with(|m| {
        set(m, "tokenizer.ggml.model", Value::String("t5".into()))
    }));
    assert!(e.contains("hostile.gguf") && e.contains("\"t5\""), "{e}");
}

#[test]
fn gguf_merges_of_unknown_tokens_are_named() {
    let bpe = GgufFile::from_bytes(seed("read_gguf_tokenizer", "bpe_chatml.gguf").into()).unwrap();
    let mut meta: Vec<(String, Value)> = bpe
        .metadata()
        .iter()
        .map(|e| (e.key().to_string(), e.value().clone()))
        .collect();
    for (merges, what) in [
        (vec!["H e", "H zz"], "tokenizer.ggml.merges[1]: \"zz\""),
        (
            vec!["e H"],
            "tokenizer.ggml.merges[0]: \"e\" + \"H\" makes \"eH\"",
        ),
        (
            vec!["He"],
            "tokenizer.ggml.merges[0] = \"He\" is not \"left right\"",
        ),
    ] {
        set(
            &mut meta,
            "tokenizer.ggml.merges",
            Value::Array(Array::from_strings(&merges)),
        );
        let mut w = GgufWriter::new();
        for (k, v) in &meta {
            w.add(k, v.clone()).unwrap();
        }
        let f = GgufFile::from_bytes_named(w.to_vec().unwrap().into(), "hostile.gguf").unwrap();
        let e = gguf_err(&f);
        assert!(
            e.contains("hostile.gguf") && e.contains(what),
            "{what}: {e}"
        );
    }
}

#[track_caller]
fn render_err(source: &str) -> String {
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let req = ChatRequest::new(&[Message::new("user", "hi")]);
    match t.render(&req) {
        Ok(out) => panic!("a hostile template rendered {} bytes", out.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_template_that_loops_runs_out_of_fuel() {
    let start = std::time::Instant::now();
    let e = render_err(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    );
    assert!(e.contains("chat template") && e.contains("fuel"), "{e}");
    assert!(start.elapsed().as_secs() < 60, "{:?}", start.elapsed());
}

#[test]
fn a_template_that_raises_says_what() {
    let e = render_err(
        "{% if messages|length < 2 %}{{ raise_exception('need two turns') }}{% endif %}",
    );
    assert!(
        e.contains("chat template") && e.contains("need two turns"),
        "{e}"
    );
}

#[test]
fn a_template_that_recurses_is_stopped() {
    let e = render_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(
        e.contains("chat template") && e.contains("recursion"),
        "{e}"
    );
}

#[test]
fn a_template_that_renders_without_end_is_cut_off() {
    let e = render_err("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    assert!(e.contains("chat template") && e.contains("bytes"), "{e}");
    let e = render_err("{{ messages | tojson(indent=1000000000000) }}");
    assert!(e.contains("chat template") && e.contains("indent"), "{e}");
    let e = render_err("{{ 'x' * 1000000000 }}");
    assert!(
        e.contains("chat template") && e.contains("too large"),
        "{e}"
    );
}

#[test]
fn a_template_with_bad_syntax_names_the_line() {
    let e = ChatTemplate::new("line one\n{% for m in messages %}\n{{ m.content }", "", "")
        .unwrap_err()
        .to_string();
    assert!(e.contains("chat template") && e.contains("line"), "{e}");
}

/// Inputs the `read_tokenizer_json` fuzz target once crashed on
/// (`fuzz/regressions/read_tokenizer_json/`, the target's NUL-separated file layout): each
/// is now an error naming the file and field.
#[test]
fn past_fuzz_crashes_are_named_errors() {
    let crashes =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/read_tokenizer_json");
    let mut n = 0;
    for entry in std::fs::read_dir(&crashes).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let mut parts = bytes.splitn(4, |&b| b == 0);
        let d = dir();
        let result = Tokenizer::from_hf_files(HfTokenizerFiles {
            dir: &d,
            tokenizer_json: parts.next().unwrap_or_default(),
            tokenizer_config: parts.next(),
            generation_config: parts.next(),
            chat_template: parts.next(),
        });
        let e = result
            .err()
            .unwrap_or_else(|| panic!("{}: loaded", path.display()));
        assert!(
            e.to_string().contains("models/hostile/tokenizer.json"),
            "{}: {e}",
            path.display()
        );
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", crashes.display());
}
