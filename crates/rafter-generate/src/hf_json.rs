//! Reading a `tokenizer.json` (Hugging Face's format) into a `tokenizers::Tokenizer`, after
//! checks that turn what the `tokenizers` crate would accept silently or panic on into errors
//! that name the file and the field.
//!
//! The crate (0.23) panics on a BPE merge whose two sides are in the vocabulary but whose
//! concatenation is longer than every vocabulary entry (it slices a buffer sized by the
//! longest entry before looking the result up), and on a merge whose right side does not
//! start with `continuing_subword_prefix`. It accepts ids of any size and two tokens with
//! one id, which leave the model's embedding rows and the decoder to disagree. Its
//! `TemplateProcessing` post-processor, read from JSON, is not validated either: a template
//! naming a special token the processor does not define, or a single-input template using
//! sequence `B`, panics at the first encode (found by fuzzing). Checking the
//! parsed JSON first costs one pass over the vocabulary; the crate then deserialises from the
//! same parsed value.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::{Error, Result};

/// Token ids must be below this. The largest vocabularies in use have about 262,144 tokens
/// (Gemma 3); an id in the millions is a corrupt file, and the model's embedding could not
/// have a row for it.
pub const MAX_TOKEN_ID: u32 = 1 << 24;

/// Parses and checks `text` (the contents of `file`, which errors name) as a tokenizer.json.
pub(crate) fn parse_tokenizer_json(text: &str, file: &str) -> Result<tokenizers::Tokenizer> {
    let bad = |message: String| Error::BadJson {
        path: file.into(),
        message,
    };
    let doc: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    check(&doc).map_err(bad)?;
    let added = added_ids(&doc);
    let tokenizer: tokenizers::Tokenizer =
        serde_json::from_value(doc).map_err(|e| Error::Tokenizer(format!("{file}: {e}")))?;
    check_added_ids(&added, &tokenizer).map_err(bad)?;
    Ok(tokenizer)
}

/// `added_tokens`' recorded ids, by position and content.
fn added_ids(doc: &Value) -> Vec<(usize, String, u64)> {
    let list = doc.get("added_tokens").and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, t)| {
            let id = t.get("id").and_then(Value::as_u64)?;
            let text = t.get("content").and_then(Value::as_str)?;
            Some((i, text.to_string(), id))
        })
        .collect()
}

/// The `tokenizers` crate ignores an added token's recorded id when the token is not in the
/// model's vocabulary: it numbers such tokens after the vocabulary's *count*, so a
/// vocabulary whose ids have gaps gives them ids that other tokens already hold (found by
/// fuzzing). The recorded ids are what the model's embedding rows and the config's BOS/EOS
/// ids mean, so a file whose ids the crate would renumber is refused.
fn check_added_ids(
    added: &[(usize, String, u64)],
    tokenizer: &tokenizers::Tokenizer,
) -> std::result::Result<(), String> {
    for (i, text, id) in added {
        let given = tokenizer.token_to_id(text).map(u64::from);
        if given != Some(*id) {
            let given = given.map_or("no id".to_string(), |g| format!("id {g}"));
            return Err(format!(
                "added_tokens[{i}] ({text:?}) records id {id}, but the tokenizer gives it \
                 {given} (are model.vocab's ids not 0..n-1?)"
            ));
        }
    }
    Ok(())
}

/// The checks the `tokenizers` crate lacks (see the module doc). Fields of unexpected shape
/// are left for the crate to reject with its own message.
fn check(doc: &Value) -> std::result::Result<(), String> {
    let Some(model) = doc.get("model") else {
        return Ok(());
    };
    let mut by_id: HashMap<u32, &str> = HashMap::new();
    let vocab = model.get("vocab").and_then(Value::as_object);
    if let Some(vocab) = vocab {
        for (text, id) in vocab {
            let Some(id) = id.as_u64() else { continue };
            let id = token_id(id, || format!("model.vocab[{text:?}]"))?;
            if let Some(other) = by_id.insert(id, text) {
                return Err(format!(
                    "model.vocab gives id {id} to both {other:?} and {text:?}"
                ));
            }
        }
    }
    if let Some(added) = doc.get("added_tokens").and_then(Value::as_array) {
        for (i, t) in added.iter().enumerate() {
            let (Some(id), Some(text)) = (
                t.get("id").and_then(Value::as_u64),
                t.get("content").and_then(Value::as_str),
            ) else {
                continue;
            };
            let id = token_id(id, || format!("added_tokens[{i}].id"))?;
            match by_id.insert(id, text) {
                Some(other) if other != text => {
                    return Err(format!(
                        "added_tokens[{i}] ({text:?}) has id {id}, which is already {other:?}'s"
                    ))
                }
                _ => {}
            }
        }
    }
    if let (Some(vocab), Some(merges)) = (vocab, model.get("merges").and_then(Value::as_array)) {
        let prefix = model
            .get("continuing_subword_prefix")
            .and_then(Value::as_str)
            .unwrap_or("");
        check_merges(merges, |t| vocab.contains_key(t), prefix)?;
    }
    if let Some(pp) = doc.get("post_processor") {
        check_post_processor(pp, "post_processor")?;
    }
    if let Some(decoder) = doc.get("decoder") {
        check_decoder(decoder, "decoder")?;
    }
    Ok(())
}

/// A `Strip` decoder (alone or inside a `Sequence`) may only strip from the start: with
/// `stop > 0` tokenizers 0.23 underflows on a token shorter than `stop` and slices past the
/// token when start and stop overlap (found by fuzzing). Real tokenizers (Llama 2, Mistral,
/// Gemma) strip one leading space and nothing at the end. Recognised by its `stop` field,
/// whatever its `type` says (see [`check_post_processor`]).
fn check_decoder(decoder: &Value, at: &str) -> std::result::Result<(), String> {
    if let Some(list) = decoder.get("decoders").and_then(Value::as_array) {
        for (i, d) in list.iter().enumerate() {
            check_decoder(d, &format!("{at}.decoders[{i}]"))?;
        }
    }
    match decoder.get("stop").and_then(Value::as_u64) {
        Some(stop) if stop > 0 => Err(format!(
            "{at} is a Strip decoder with stop = {stop}: stripping from the end of tokens is \
             not supported (only `stop: 0`)"
        )),
        _ => Ok(()),
    }
}

/// A `TemplateProcessing` post-processor (alone or inside a `Sequence`): its templates may
/// only name special tokens it defines, the single-input template only sequence `A`, and
/// each special token needs as many ids (valid ones) as tokens. Recognised by its fields,
/// not its `type`: the crate's untagged wrapper accepts any `type` string for it (a fuzzer
/// input spelled it "TemplateProcessising").
fn check_post_processor(pp: &Value, at: &str) -> std::result::Result<(), String> {
    if let Some(list) = pp.get("processors").and_then(Value::as_array) {
        for (i, p) in list.iter().enumerate() {
            check_post_processor(p, &format!("{at}.processors[{i}]"))?;
        }
    }
    if ["single", "pair", "special_tokens"]
        .iter()
        .any(|k| pp.get(k).is_some())
    {
        check_template_processing(pp, at)?;
    }
    Ok(())
}

fn check_template_processing(pp: &Value, at: &str) -> std::result::Result<(), String> {
    let specials = pp.get("special_tokens").and_then(Value::as_object);
    for (key, special) in specials.into_iter().flatten() {
        let ids = special.get("ids").and_then(Value::as_array);
        let tokens = special.get("tokens").and_then(Value::as_array);
        if let (Some(ids), Some(tokens)) = (ids, tokens) {
            if ids.len() != tokens.len() {
                return Err(format!(
                    "{at}.special_tokens[{key:?}] has {} ids but {} tokens",
                    ids.len(),
                    tokens.len()
                ));
            }
            for (i, id) in ids.iter().enumerate() {
                if let Some(id) = id.as_u64() {
                    token_id(id, || format!("{at}.special_tokens[{key:?}].ids[{i}]"))?;
                }
            }
        }
    }
    for field in ["single", "pair"] {
        let pieces = pp.get(field).and_then(Value::as_array);
        for (i, piece) in pieces.into_iter().flatten().enumerate() {
            if let Some(id) = piece.pointer("/SpecialToken/id").and_then(Value::as_str) {
                if !specials.is_some_and(|s| s.contains_key(id)) {
                    return Err(format!(
                        "{at}.{field}[{i}] names the special token {id:?}, which \
                         {at}.special_tokens does not define"
                    ));
                }
            }
            let sequence = piece.pointer("/Sequence/id").and_then(Value::as_str);
            if field == "single" && sequence == Some("B") {
                return Err(format!(
                    "{at}.single[{i}] uses sequence B, which a single input does not have"
                ));
            }
        }
    }
    Ok(())
}

fn token_id(id: u64, field: impl Fn() -> String) -> std::result::Result<u32, String> {
    u32::try_from(id)
        .ok()
        .filter(|&id| id < MAX_TOKEN_ID)
        .ok_or_else(|| {
            format!(
                "{} = {id} is not a token id (ids must be below {MAX_TOKEN_ID})",
                field()
            )
        })
}

/// BPE merges, as pairs `[left, right]` or legacy `"left right"` strings: both sides and
/// their concatenation (the right side's `prefix` dropped) must be tokens.
fn check_merges(
    merges: &[Value],
    in_vocab: impl Fn(&str) -> bool,
    prefix: &str,
) -> std::result::Result<(), String> {
    for (i, m) in merges.iter().enumerate() {
        let (left, right) = match m {
            Value::String(s) if s.starts_with("#version") => continue,
            Value::String(s) => match s.split(' ').collect::<Vec<_>>()[..] {
                [l, r] => (l, r),
                _ => return Err(format!("model.merges[{i}] = {s:?} is not \"left right\"")),
            },
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(l), Value::String(r)] => (l.as_str(), r.as_str()),
                _ => return Err(format!("model.merges[{i}] is not a pair of strings")),
            },
            _ => return Err(format!("model.merges[{i}] is neither a string nor a pair")),
        };
        check_merge(left, right, &in_vocab, prefix)
            .map_err(|e| format!("model.merges[{i}]: {e}"))?;
    }
    Ok(())
}

/// One merge `left right`: both sides and the merged token must be tokens; `prefix` is the
/// continuing-subword prefix the right side starts with (dropped when merging).
pub(crate) fn check_merge(
    left: &str,
    right: &str,
    in_vocab: impl Fn(&str) -> bool,
    prefix: &str,
) -> std::result::Result<(), String> {
    for side in [left, right] {
        if !in_vocab(side) {
            return Err(format!("{side:?} (of {left:?} + {right:?}) is not a token"));
        }
    }
    let Some(rest) = right.strip_prefix(prefix) else {
        return Err(format!(
            "{right:?} does not start with the continuing-subword prefix {prefix:?}"
        ));
    };
    let merged = format!("{left}{rest}");
    if !in_vocab(&merged) {
        return Err(format!(
            "{left:?} + {right:?} makes {merged:?}, which is not a token"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpe(vocab: &str, merges: &str, extra: &str) -> String {
        format!(
            r#"{{"added_tokens":[{extra}],"model":{{"type":"BPE","vocab":{{{vocab}}},"merges":[{merges}]}}}}"#
        )
    }

    fn err(json: &str) -> String {
        parse_tokenizer_json(json, "t/tokenizer.json")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_small_bpe_parses() {
        let t = parse_tokenizer_json(&bpe(r#""a":0,"b":1,"ab":2"#, r#""a b""#, ""), "t").unwrap();
        assert_eq!(t.encode("ab", false).unwrap().get_ids(), [2]);
        let t =
            parse_tokenizer_json(&bpe(r#""a":0,"b":1,"ab":2"#, r#"["a","b"]"#, ""), "t").unwrap();
        assert_eq!(t.encode("ab", false).unwrap().get_ids(), [2]);
    }

    /// tokenizers 0.23 panics on this one ("range end index 2 out of range").
    #[test]
    fn a_merge_whose_result_is_no_token_is_named() {
        let e = err(&bpe(r#""a":0,"b":1"#, r#""a b""#, ""));
        assert!(
            e.contains("t/tokenizer.json") && e.contains("model.merges[0]"),
            "{e}"
        );
        assert!(e.contains("\"ab\", which is not a token"), "{e}");
    }

    #[test]
    fn a_merge_of_unknown_tokens_is_named() {
        let e = err(&bpe(r#""a":0,"b":1,"ab":2"#, r#""a b","a zz""#, ""));
        assert!(e.contains("model.merges[1]") && e.contains("\"zz\""), "{e}");
        let e = err(&bpe(r#""a":0"#, r#""a b c""#, ""));
        assert!(
            e.contains("model.merges[0]") && e.contains("left right"),
            "{e}"
        );
    }

    /// The crate's builder slices the right side past the prefix unchecked.
    #[test]
    fn a_right_side_without_the_subword_prefix_is_named() {
        let json = r###"{"model":{"type":"BPE","continuing_subword_prefix":"##",
            "vocab":{"a":0,"é":1,"aé":2},"merges":["a é"]}}"###;
        let e = err(json);
        assert!(e.contains("model.merges[0]") && e.contains("\"##\""), "{e}");
    }

    fn with_template(single: &str, specials: &str) -> String {
        format!(
            r#"{{"model":{{"type":"BPE","vocab":{{"a":0,"<s>":1}},"merges":[]}},
            "post_processor":{{"type":"Sequence","processors":[{{"type":"ByteLevel",
            "add_prefix_space":false,"trim_offsets":false,"use_regex":true}},
            {{"type":"TemplateProcessing","single":[{single}],"pair":[],
            "special_tokens":{{{specials}}}}}]}}}}"#
        )
    }

    /// tokenizers 0.23 panics at the first encode on these ("no entry found for key",
    /// an index out of bounds): the fuzzer's crash input had a mutated special-token name.
    #[test]
    fn template_processing_is_checked() {
        let s = r#""<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}"#;
        let bos = r#"{"SpecialToken":{"id":"<s>","type_id":0}}"#;
        let a = r#"{"Sequence":{"id":"A","type_id":0}}"#;
        let t = parse_tokenizer_json(&with_template(&format!("{bos},{a}"), s), "t").unwrap();
        assert_eq!(t.encode("a", true).unwrap().get_ids(), [1, 0]);

        let typo = r#"{"SpecialToken":{"id":"+s>","type_id":0}}"#;
        let e = err(&with_template(&format!("{typo},{a}"), s));
        assert!(
            e.contains("t/tokenizer.json")
                && e.contains("post_processor.processors[1].single[0]")
                && e.contains("\"+s>\""),
            "{e}"
        );
        let b = r#"{"Sequence":{"id":"B","type_id":0}}"#;
        let e = err(&with_template(&format!("{a},{b}"), s));
        assert!(e.contains("single[1] uses sequence B"), "{e}");
        // The crate reads a processor of these fields whatever its `type` says.
        let misspelt = with_template(&format!("{typo},{a}"), s)
            .replace(r#""TemplateProcessing""#, r#""TemplateProcessising""#);
        let e = err(&misspelt);
        assert!(e.contains("single[0] names the special token"), "{e}");
        let uneven = r#""<s>":{"id":"<s>","ids":[1,1],"tokens":["<s>"]}"#;
        let e = err(&with_template(a, uneven));
        assert!(e.contains("has 2 ids but 1 tokens"), "{e}");
    }

    /// tokenizers 0.23 renumbers an added token missing from a gapped vocabulary onto an id
    /// another token holds (the fuzzer's second crash: a stored tokenizer then failed to
    /// reload).
    #[test]
    fn added_tokens_the_crate_would_renumber_are_named() {
        let added = r#"{"id":1,"content":"<x>","single_word":false,"lstrip":false,
            "rstrip":false,"normalized":false,"special":true}"#;
        let e = err(&bpe(r#""a":0,"b":2"#, "", added));
        assert!(
            e.contains("added_tokens[0] (\"<x>\") records id 1") && e.contains("gives it id 2"),
            "{e}"
        );
        // Dense ids: the added token follows the vocabulary, as the crate numbers it.
        let added = r#"{"id":2,"content":"<x>","single_word":false,"lstrip":false,
            "rstrip":false,"normalized":false,"special":true}"#;
        let t = parse_tokenizer_json(&bpe(r#""a":0,"b":1"#, "", added), "t").unwrap();
        assert_eq!(t.token_to_id("<x>"), Some(2));
    }

    /// tokenizers 0.23 underflows decoding an empty token through this decoder (the
    /// fuzzer's third crash).
    #[test]
    fn strip_decoders_that_cut_the_end_are_named() {
        let json = r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},
            "decoder":{"type":"Sequence","decoders":[{"type":"Fuse"},
            {"type":"Strip","content":" ","start":1,"stop":1}]}}"#;
        let e = err(json);
        assert!(
            e.contains("decoder.decoders[1] is a Strip decoder with stop = 1"),
            "{e}"
        );
        let json = json.replace(r#""stop":1"#, r#""stop":0"#);
        parse_tokenizer_json(&json, "t").unwrap();
    }

    #[test]
    fn huge_and_shared_ids_are_named() {
        let e = err(&bpe(r#""a":0,"b":4000000000"#, "", ""));
        assert!(e.contains("model.vocab[\"b\"] = 4000000000"), "{e}");
        let e = err(&bpe(r#""a":0,"b":0"#, "", ""));
        assert!(
            e.contains("id 0") && e.contains("\"a\"") && e.contains("\"b\""),
            "{e}"
        );
        let added = r#"{"id":1,"content":"<x>","special":true}"#;
        let e = err(&bpe(r#""a":0,"b":1"#, "", added));
        assert!(e.contains("added_tokens[0]") && e.contains("\"b\""), "{e}");
        let added = r#"{"id":16777216,"content":"<x>","special":true}"#;
        let e = err(&bpe(r#""a":0"#, "", added));
        assert!(e.contains("added_tokens[0].id = 16777216"), "{e}");
        // An added token repeating a vocabulary entry with its id is how files mark specials.
        let added = r#"{"id":1,"content":"b","single_word":false,"lstrip":false,
            "rstrip":false,"normalized":false,"special":true}"#;
        parse_tokenizer_json(&bpe(r#""a":0,"b":1"#, "", added), "t").unwrap();
    }
}
