//! Tokenizers against their references: the `tokenizers` library (ids committed in
//! tests/data/tokenizer_ids.json by scripts/gen_tokenizer_fixtures.py) for HF folders and
//! GGUF vocabularies, and llama.cpp's own tokenizations (the sdist's ggml-vocab-*.gguf.inp /
//! .out pairs) for GGUF vocabularies.

mod common;

use common::*;

/// Compares every text of the reference for one tokenizer; returns the mismatches.
fn mismatches(name: &str, tok: &rafter_generate::Tokenizer, with_special: bool) -> Vec<String> {
    let refs = data("tokenizer_ids.json");
    let texts = refs["texts"].as_array().unwrap();
    let want = &refs["tokenizers"][name][if with_special {
        "ids_with_special"
    } else {
        "ids"
    }];
    let mut bad = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let text = text.as_str().unwrap();
        let got = tok.encode(text, with_special).unwrap();
        let expect = ids(&want[i]);
        if got != expect {
            bad.push(format!(
                "{name} text {i} {text:?}:\n  got  {got:?}\n  want {expect:?}"
            ));
        }
    }
    bad
}

#[test]
fn hf_folders_match_the_tokenizers_library() {
    let mut bad = Vec::new();
    for name in VOCABS {
        let tok = hf_tokenizer(name);
        bad.extend(mismatches(name, tok, false));
        bad.extend(mismatches(name, tok, true));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn hf_decoding_matches_the_tokenizers_library() {
    let refs = data("tokenizer_ids.json");
    for name in VOCABS {
        let tok = hf_tokenizer(name);
        let r = &refs["tokenizers"][name];
        for (i, ids_v) in r["ids_with_special"].as_array().unwrap().iter().enumerate() {
            let ids = ids(ids_v);
            assert_eq!(
                tok.decode(&ids, true).unwrap(),
                r["decoded"][i].as_str().unwrap(),
                "{name} {i}"
            );
            assert_eq!(
                tok.decode(&ids, false).unwrap(),
                r["decoded_with_special"][i].as_str().unwrap(),
                "{name} {i}"
            );
        }
    }
}

/// The GGUF path follows llama.cpp, and transformers' GGUF conversion (the reference
/// tokenizer.json) departs from llama.cpp in two documented ways, so for those cases the
/// expectation is rebuilt from the reference tokenizer instead of read from the file:
/// - llama.cpp adds BOS for `pre = llama-bpe` when the file has no add_bos_token (as Llama 3's
///   own tokenizer.json does); transformers adds none;
/// - a SentencePiece vocabulary with add_space_prefix gets a `▁` before text that already
///   starts with a space in llama.cpp (and sentencepiece); transformers' Metaspace does not
///   add one then. So our ids for `text` must be the reference's for `" " + text`.
fn gguf_expectation(
    hf: &rafter_generate::Tokenizer,
    name: &str,
    text: &str,
    with_special: bool,
    reference: Vec<u32>,
) -> Vec<u32> {
    if name == "llama-spm" && text.starts_with(' ') {
        return hf.encode(&format!(" {text}"), with_special).unwrap();
    }
    if name == "llama-bpe" && with_special {
        return [
            vec![hf.token_to_id("<|begin_of_text|>").unwrap()],
            reference,
        ]
        .concat();
    }
    reference
}

#[test]
fn gguf_vocabularies_match_the_tokenizers_library() {
    let refs = data("tokenizer_ids.json");
    let texts = refs["texts"].as_array().unwrap();
    let mut bad = Vec::new();
    for name in VOCABS {
        let tok = gguf_tokenizer(name);
        let hf = hf_tokenizer(name);
        for with_special in [false, true] {
            let key = if with_special {
                "ids_with_special"
            } else {
                "ids"
            };
            for (i, text) in texts.iter().enumerate() {
                let text = text.as_str().unwrap();
                let want = gguf_expectation(
                    hf,
                    name,
                    text,
                    with_special,
                    ids(&refs["tokenizers"][name][key][i]),
                );
                let got = tok.encode(text, with_special).unwrap();
                if got != want {
                    bad.push(format!(
                        "{name} text {i} {text:?}:\n  got  {got:?}\n  want {want:?}"
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// llama.cpp's test texts split as its tests/test-tokenizer-0.cpp does.
fn llamacpp_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = cache_dir().join("llamacpp");
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(at) => {
                texts.push(rest[..at].to_string());
                rest = &rest[at + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                rest = "";
            }
        }
    }
    let outs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        outs.len(),
        "{name}: .inp and .out disagree on the number of tests"
    );
    texts.into_iter().zip(outs).collect()
}

#[test]
fn gguf_vocabularies_match_llama_cpp() {
    let mut bad = Vec::new();
    let mut total = 0;
    for name in ["qwen2", "llama-bpe", "llama-spm", "gpt-2"] {
        let mut tok = gguf_tokenizer(name).clone();
        // test-tokenizer-0: add_special = false, parse_special = false.
        tok.set_parse_special(false);
        for (text, want) in llamacpp_cases(name) {
            total += 1;
            let got = tok.encode(&text, false).unwrap();
            if got != want {
                bad.push(format!("{name} {text:?}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(total > 100, "only {total} llama.cpp cases");
    assert!(
        bad.is_empty(),
        "{} of {total} differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn streaming_decode_concatenates_to_the_full_decode() {
    let refs = data("tokenizer_ids.json");
    let mut texts: Vec<String> = refs["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    // And one long stream (the decoder drops tokens it no longer needs past 64).
    texts.push(texts.concat().repeat(3));
    for name in VOCABS {
        for tok in [hf_tokenizer(name), gguf_tokenizer(name)] {
            for text in &texts {
                let ids = tok.encode(text, true).unwrap();
                for skip in [true, false] {
                    let mut dec = tok.stream_decoder(skip);
                    let mut streamed = String::new();
                    for &id in &ids {
                        if let Some(piece) = dec.push(id).unwrap() {
                            assert!(
                                !piece.contains('\u{FFFD}'),
                                "{name}: broken character in {piece:?}"
                            );
                            streamed.push_str(&piece);
                        }
                    }
                    streamed.push_str(&dec.finish().unwrap());
                    assert_eq!(
                        streamed,
                        tok.decode(&ids, skip).unwrap(),
                        "{name} skip={skip} {text}"
                    );
                }
            }
        }
    }
}

#[test]
fn special_tokens_and_stop_ids() {
    let q = gguf_tokenizer("qwen2");
    let im_end = q.token_to_id("<|im_end|>").unwrap();
    assert!(
        q.stop_token_ids().contains(&im_end),
        "{:?}",
        q.stop_token_ids()
    );
    assert_eq!(q.encode("<|im_end|>", false).unwrap(), [im_end]);
    let mut q2 = q.clone();
    q2.set_parse_special(false);
    assert!(q2.encode("<|im_end|>", false).unwrap().len() > 1);
    let l = gguf_tokenizer("llama-spm");
    assert_eq!(l.bos_id(), Some(1));
    assert_eq!(l.encode("Hi", true).unwrap()[0], 1);
    assert_eq!(l.bos_token(), "<s>");
}

#[test]
fn a_folder_without_tokenizer_json_is_named() {
    let dir = std::env::temp_dir().join("rafter-generate-empty-hf");
    std::fs::create_dir_all(&dir).unwrap();
    let e = rafter_generate::Tokenizer::from_hf_dir(&dir)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("rafter-generate-empty-hf"),
        "{e}"
    );
}

/// llama.cpp's `smollm` rules (each digit alone, then GPT-2's regex) on the GPT-2 vocabulary
/// against SmolLM's own tokenizer.json pre-tokenizer on the same vocabulary.
#[test]
fn smollm_pre_tokenizer_matches_smollm_tokenizer_json() {
    let refs = data("tokenizer_ids.json");
    let texts = refs["texts"].as_array().unwrap();
    let mut vocab = gguf_vocab("gpt-2");
    vocab.pre = Some("smollm".into());
    let tok = rafter_generate::Tokenizer::from_gguf_vocab(&vocab).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let want = ids(&refs["tokenizers"]["smollm-on-gpt-2"]["ids"][i]);
        assert_eq!(
            tok.encode(text.as_str().unwrap(), false).unwrap(),
            want,
            "text {i} {text}"
        );
    }
    // The rules differ from gpt-2's on digits, so this checks something.
    assert_ne!(
        tok.encode("2024", false).unwrap(),
        gguf_tokenizer("gpt-2").encode("2024", false).unwrap()
    );
}

/// tokenizer_config.json's add_bos_token / add_eos_token override what tokenizer.json's
/// post-processor adds (as transformers' Llama tokenizers rebuild it), and the chat template
/// and generation_config.json's EOS ids are read.
#[test]
fn hf_config_flags_template_and_generation_config() {
    let src = cache_dir().join("llama-spm").join("hf");
    let dir = std::env::temp_dir().join(format!("rafter-generate-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": false,
            "add_eos_token": true, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 13]}"#,
    )
    .unwrap();
    let tok = rafter_generate::Tokenizer::from_hf_dir(&dir).unwrap();
    let plain = tok.encode("Hi", false).unwrap();
    assert_eq!(
        tok.encode("Hi", true).unwrap(),
        [plain.clone(), vec![2]].concat()
    );
    assert_eq!(
        tok.chat_template(),
        Some("{{ bos_token }}{{ messages[0].content }}")
    );
    assert_eq!(tok.stop_token_ids(), [2, 13]);
    assert_eq!(
        (tok.bos_token().as_str(), tok.eos_token().as_str()),
        ("<s>", "</s>")
    );
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": 7}"#).unwrap();
    let e = rafter_generate::Tokenizer::from_hf_dir(&dir)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("chat_template"),
        "{e}"
    );
    std::fs::write(dir.join("tokenizer_config.json"), "{").unwrap();
    let e = rafter_generate::Tokenizer::from_hf_dir(&dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
