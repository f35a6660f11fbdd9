//! A GGUF's embedded vocabulary (`tokenizer.ggml.*`) and the `tokenizers::Tokenizer` that
//! tokenizes as llama.cpp does with it.
//!
//! Two kinds of vocabulary are supported, as llama.cpp names them in `tokenizer.ggml.model`:
//! - `gpt2`: byte-level BPE with explicit merges; the text is split first by the regular
//!   expressions of `tokenizer.ggml.pre` (see [`crate::pretokenize`]), each piece mapped to
//!   GPT-2's byte alphabet and merged by rank. That is the `tokenizers` BPE model behind a
//!   sequence of `Split` and `ByteLevel` pre-tokenizers.
//! - `llama`: SentencePiece-style BPE (Llama 2, TinyLlama, Gemma): no merges are stored; two
//!   adjacent pieces merge when their concatenation is in the vocabulary, the one with the
//!   highest score first, and a character that no piece covers falls back to `<0xXX>` byte
//!   tokens. That is a `tokenizers` BPE whose merge ranks are the merged pieces' scores (see
//!   [`crate::spm_merges`]), with byte fallback, a normaliser that writes spaces as `▁` and
//!   (with `add_space_prefix`) puts one `▁` before each run of text.
//!
//! In both, tokens of type CONTROL and UNKNOWN are special added tokens (matched in the text
//! only when special tokens are parsed), and USER_DEFINED ones plain added tokens (always
//! matched), as llama.cpp's `tokenizer_st_partition` does.

use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper};

use rafter_gguf::{GgufError, GgufFile};

use crate::error::{Error, Result};
use crate::hf_json::{check_merge, MAX_TOKEN_ID};
use crate::pretokenize::pre_tokenizer_spec;

/// llama.cpp's token types (`tokenizer.ggml.token_type`, gguf-py's `TokenType`).
pub mod token_type {
    /// An ordinary piece.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (BOS, EOS, chat markers): special.
    pub const CONTROL: i32 = 3;
    /// A token the model's authors added (`<think>`, whitespace runs): matched whole in text.
    pub const USER_DEFINED: i32 = 4;
    /// A reserved token never produced.
    pub const UNUSED: i32 = 5;
    /// A byte-fallback token `<0xXX>`.
    pub const BYTE: i32 = 6;
}

/// What a GGUF file stores under `tokenizer.ggml.*` and `tokenizer.chat_template`.
///
/// The field names are those of the GGUF keys (`tokenizer.ggml.` dropped), so a reader of the
/// metadata fills it field by field; `Deserialize` reads the same shape from JSON (what
/// scripts/gen_tokenizer_fixtures.py dumps).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` or `llama` (others are rejected by name).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` vocabulary (`qwen2`, `llama-bpe`,
    /// `smollm`, `gpt-2`, `default`, ...); absent means `default`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the pieces, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: a [`token_type`] per token; absent means all NORMAL.
    pub token_type: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores`: a score per token (SentencePiece vocabularies need them).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs by rank (byte-level BPE needs them).
    pub merges: Option<Vec<String>>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    /// End of turn (`<|eot_id|>`, `<|im_end|>`, ...).
    pub eot_token_id: Option<u32>,
    /// End of message (Llama 3's `<|eom_id|>`).
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; absent means llama.cpp's default for the model.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece); absent means true for `llama`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// The vocabulary's kinds of model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VocabKind {
    ByteLevelBpe,
    SentencePiece,
}

/// Token texts llama.cpp treats as end of generation whatever the metadata says
/// (src/llama-vocab.cpp, the EOG list). Only those present in a vocabulary apply.
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

impl GgufVocab {
    /// Reads every `tokenizer.ggml.*` key the struct holds (and `tokenizer.chat_template`);
    /// errors name the file and the key whose value has the wrong type. A file without
    /// `tokenizer.ggml.model` has no tokenizer: `Ok(None)`. Whether the arrays agree is
    /// checked when the tokenizer is built ([`GgufVocab::build_tokenizer`]).
    pub fn from_gguf(f: &GgufFile) -> std::result::Result<Option<GgufVocab>, GgufError> {
        let k = |s: &str| format!("tokenizer.ggml.{s}");
        let Some(model) = f.get_opt::<&str>(&k("model"))? else {
            return Ok(None);
        };
        let strings = |s: &str| -> std::result::Result<Vec<String>, GgufError> {
            Ok(f.get_string_array(&k(s))?
                .iter()
                .map(str::to_string)
                .collect())
        };
        let opt_u32 = |s: &str| f.get_opt::<u32>(&k(s));
        let opt_bool = |s: &str| f.get_opt::<bool>(&k(s));
        Ok(Some(GgufVocab {
            model: model.to_string(),
            pre: f.get_opt::<&str>(&k("pre"))?.map(str::to_string),
            tokens: strings("tokens")?,
            token_type: match f.get(&k("token_type")) {
                Some(_) => Some(f.get_i32_array(&k("token_type"))?.to_vec()),
                None => None,
            },
            scores: match f.get(&k("scores")) {
                Some(_) => Some(f.get_f32_array(&k("scores"))?.to_vec()),
                None => None,
            },
            merges: match f.get(&k("merges")) {
                Some(_) => Some(strings("merges")?),
                None => None,
            },
            bos_token_id: opt_u32("bos_token_id")?,
            eos_token_id: opt_u32("eos_token_id")?,
            unknown_token_id: opt_u32("unknown_token_id")?,
            padding_token_id: opt_u32("padding_token_id")?,
            eot_token_id: opt_u32("eot_token_id")?,
            eom_token_id: opt_u32("eom_token_id")?,
            add_bos_token: opt_bool("add_bos_token")?,
            add_eos_token: opt_bool("add_eos_token")?,
            add_space_prefix: opt_bool("add_space_prefix")?,
            chat_template: f
                .get_opt::<&str>("tokenizer.chat_template")?
                .map(str::to_string),
        }))
    }

    pub(crate) fn kind(&self) -> Result<VocabKind> {
        match self.model.as_str() {
            "gpt2" => Ok(VocabKind::ByteLevelBpe),
            "llama" => Ok(VocabKind::SentencePiece),
            other => Err(Error::Vocab(format!(
                "tokenizer.ggml.model {other:?} is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)"
            ))),
        }
    }

    /// The type of token `id` (NORMAL when the file has no types).
    pub fn type_of(&self, id: usize) -> i32 {
        self.token_type
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(token_type::NORMAL)
    }

    /// Whether encoding adds BOS: the file's flag, else llama.cpp's default (true for
    /// SentencePiece and for the pre-tokenizers llama.cpp turns it on for).
    pub fn adds_bos(&self) -> bool {
        self.add_bos_token.unwrap_or_else(|| {
            self.model == "llama"
                || matches!(
                    self.pre.as_deref(),
                    Some(
                        "llama3"
                            | "llama-v3"
                            | "llama-bpe"
                            | "falcon3"
                            | "falcon-h1"
                            | "pixtral"
                            | "midm-2.0"
                            | "lfm2"
                            | "jina-v5-nano"
                            | "tekken"
                            | "chameleon"
                    )
                )
        })
    }

    fn check(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(Error::Vocab("tokenizer.ggml.tokens is empty".into()));
        }
        if n > MAX_TOKEN_ID as usize {
            return Err(Error::Vocab(format!(
                "tokenizer.ggml.tokens has {n} entries; ids must be below {MAX_TOKEN_ID}"
            )));
        }
        if let Some(t) = &self.token_type {
            if t.len() != n {
                return Err(Error::Vocab(format!(
                    "tokenizer.ggml.token_type has {} entries for {n} tokens",
                    t.len()
                )));
            }
        }
        if let Some(s) = &self.scores {
            if s.len() != n {
                return Err(Error::Vocab(format!(
                    "tokenizer.ggml.scores has {} entries for {n} tokens",
                    s.len()
                )));
            }
        }
        for (name, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("unknown_token_id", self.unknown_token_id),
            ("padding_token_id", self.padding_token_id),
            ("eot_token_id", self.eot_token_id),
            ("eom_token_id", self.eom_token_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(Error::Vocab(format!(
                        "tokenizer.ggml.{name} = {id} is past the {n} tokens"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A `tokenizers::Tokenizer` that tokenizes as llama.cpp does with this vocabulary
    /// (special tokens parsed in the text; see [`crate::Tokenizer::set_parse_special`]).
    pub fn build_tokenizer(&self) -> Result<tokenizers::Tokenizer> {
        self.check()?;
        let kind = self.kind()?;
        let vocab: tokenizers::models::bpe::Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        if vocab.len() != self.tokens.len() {
            return Err(Error::Vocab(format!(
                "tokenizer.ggml.tokens has {} duplicate entries",
                self.tokens.len() - vocab.len()
            )));
        }
        let mut tok = match kind {
            VocabKind::ByteLevelBpe => self.byte_level(vocab)?,
            VocabKind::SentencePiece => self.sentencepiece(vocab)?,
        };
        self.add_special_tokens(&mut tok)?;
        if let Some(pp) = self.post_processor()? {
            tok.with_post_processor(Some(pp));
        }
        Ok(tok)
    }

    fn byte_level(&self, vocab: tokenizers::models::bpe::Vocab) -> Result<tokenizers::Tokenizer> {
        let pre = self.pre.as_deref().unwrap_or("default");
        let spec = pre_tokenizer_spec(pre).ok_or_else(|| {
            Error::Vocab(format!(
                "tokenizer.ggml.pre {pre:?} is not supported for a gpt2 vocabulary"
            ))
        })?;
        let merges = self
            .merges
            .as_ref()
            .ok_or_else(|| Error::Vocab("a gpt2 vocabulary needs tokenizer.ggml.merges".into()))?;
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (left, right) = split_merge(m).ok_or_else(|| {
                    Error::Vocab(format!(
                        "tokenizer.ggml.merges[{i}] = {m:?} is not \"left right\""
                    ))
                })?;
                // The tokenizers crate panics on a merge whose result is no token.
                check_merge(&left, &right, |t| vocab.contains_key(t), "")
                    .map_err(|e| Error::Vocab(format!("tokenizer.ggml.merges[{i}]: {e}")))?;
                Ok((left, right))
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(Error::tok)?;
        let mut tok = tokenizers::Tokenizer::new(bpe);
        let mut pres: Vec<PreTokenizerWrapper> = Vec::new();
        for p in spec.patterns {
            let split = Split::new(
                SplitPattern::Regex(p.to_string()),
                tokenizers::SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(Error::tok)?;
            pres.push(split.into());
        }
        pres.push(ByteLevel::new(false, false, false).into());
        tok.with_pre_tokenizer(Some(PreSequence::new(pres)));
        tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
        Ok(tok)
    }

    fn sentencepiece(
        &self,
        vocab: tokenizers::models::bpe::Vocab,
    ) -> Result<tokenizers::Tokenizer> {
        let scores = self.scores.as_ref().ok_or_else(|| {
            Error::Vocab("a llama (SentencePiece) vocabulary needs tokenizer.ggml.scores".into())
        })?;
        let merges = crate::spm_merges::merges_from_scores(&self.tokens, scores);
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = self.unknown_token_id {
            builder = builder.unk_token(self.tokens[unk as usize].clone());
        }
        let mut tok = tokenizers::Tokenizer::new(builder.build().map_err(Error::tok)?);
        // llama.cpp: a space before each run of text that starts the input or follows a
        // special token (the normaliser runs on each piece between added tokens), then every
        // space written as U+2581.
        let replace = Replace::new(" ", "\u{2581}").map_err(Error::tok)?;
        let norm: NormalizerWrapper = if self.add_space_prefix.unwrap_or(true) {
            NormSequence::new(vec![Prepend::new("\u{2581}".into()).into(), replace.into()]).into()
        } else {
            replace.into()
        };
        tok.with_normalizer(Some(norm)).map_err(Error::tok)?;
        tok.with_decoder(Some(crate::tokenizer::spm_decoder(
            self.add_space_prefix.unwrap_or(true),
        )));
        Ok(tok)
    }

    fn add_special_tokens(&self, tok: &mut tokenizers::Tokenizer) -> Result<()> {
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (id, text) in self.tokens.iter().enumerate() {
            match self.type_of(id) {
                token_type::CONTROL | token_type::UNKNOWN => {
                    special.push(AddedToken::from(text.clone(), true).normalized(false))
                }
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(text.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        // EOG texts llama.cpp forces to CONTROL.
        for (id, text) in self.tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&text.as_str())
                && !matches!(self.type_of(id), token_type::CONTROL | token_type::UNKNOWN)
            {
                special.push(AddedToken::from(text.clone(), true).normalized(false));
            }
        }
        tok.add_special_tokens(special).map_err(Error::tok)?;
        tok.add_tokens(user).map_err(Error::tok)?;
        Ok(())
    }

    fn post_processor(&self) -> Result<Option<TemplateProcessing>> {
        let bos = self.adds_bos().then_some(self.bos_token_id).flatten();
        let eos = self
            .add_eos_token
            .unwrap_or(false)
            .then_some(self.eos_token_id)
            .flatten();
        if bos.is_none() && eos.is_none() {
            return Ok(None);
        }
        let name = |id: u32| self.tokens[id as usize].clone();
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = Vec::new();
        if let Some(b) = bos {
            single.push(name(b));
            pair.push(name(b));
            specials.push((name(b), b));
        }
        single.push("$A".to_string());
        pair.push("$A".to_string());
        if let Some(e) = eos {
            single.push(name(e));
            pair.push(name(e));
            specials.push((name(e), e));
        }
        if let Some(b) = bos {
            pair.push(format!("{}:1", name(b)));
        }
        pair.push("$B:1".to_string());
        if let Some(e) = eos {
            pair.push(format!("{}:1", name(e)));
        }
        specials.dedup();
        TemplateProcessing::builder()
            .try_single(single.join(" "))
            .and_then(|b| b.try_pair(pair.join(" ")))
            .map_err(Error::tok)?
            .special_tokens(specials)
            .build()
            .map(Some)
            .map_err(Error::tok)
    }
}

/// `"left right"` into its two sides at the first space after the first character (llama.cpp
/// splits the same way, so a merge whose left side is a space-like piece still parses).
fn split_merge(m: &str) -> Option<(String, String)> {
    let first = m.chars().next()?;
    let pos = m[first.len_utf8()..].find(' ')? + first.len_utf8();
    Some((m[..pos].to_string(), m[pos + 1..].to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_after_the_first_character() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ".into(), "t".into())));
        assert_eq!(split_merge("  a"), Some((" ".into(), "a".into())));
        assert_eq!(split_merge("ab"), None);
    }

    #[test]
    fn unknown_models_and_pres_are_named() {
        let v = GgufVocab {
            model: "t5".into(),
            tokens: vec!["a".into()],
            ..Default::default()
        };
        let e = v.build_tokenizer().unwrap_err().to_string();
        assert!(e.contains("\"t5\""), "{e}");
        let v = GgufVocab {
            model: "gpt2".into(),
            pre: Some("martian".into()),
            tokens: vec!["a".into()],
            merges: Some(vec![]),
            ..Default::default()
        };
        let e = v.build_tokenizer().unwrap_err().to_string();
        assert!(e.contains("\"martian\""), "{e}");
    }

    #[test]
    fn inconsistent_vocabularies_are_errors() {
        let v = GgufVocab {
            model: "llama".into(),
            tokens: vec!["a".into(), "b".into()],
            scores: Some(vec![0.0]),
            ..Default::default()
        };
        assert!(v
            .build_tokenizer()
            .unwrap_err()
            .to_string()
            .contains("scores has 1"));
        let v = GgufVocab {
            model: "llama".into(),
            tokens: vec!["a".into()],
            scores: Some(vec![0.0]),
            eos_token_id: Some(7),
            ..Default::default()
        };
        assert!(v
            .build_tokenizer()
            .unwrap_err()
            .to_string()
            .contains("eos_token_id = 7"));
        let v = GgufVocab {
            model: "gpt2".into(),
            tokens: vec!["a".into()],
            merges: Some(vec!["ab".into()]),
            ..Default::default()
        };
        assert!(v
            .build_tokenizer()
            .unwrap_err()
            .to_string()
            .contains("merges[0]"));
    }

    /// A hand-made SentencePiece vocabulary: the best-scored merge wins, unknown characters
    /// fall back to bytes, and the leading space marker is added.
    #[test]
    fn sentencepiece_merges_by_score_with_byte_fallback() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u32 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
        }
        for t in ["▁", "a", "b", "ab", "▁a", "▁ab"] {
            tokens.push(t.into());
            types.push(1);
        }
        // Scores: "ab" (-1) beats "▁a" (-2); "▁ab" (-3) is reachable either way.
        let mut scores = vec![0.0; tokens.len()];
        let set = |s: &mut Vec<f32>, t: &str, v: f32| {
            let i = tokens.iter().position(|x| x == t).unwrap();
            s[i] = v;
        };
        set(&mut scores, "▁", -10.0);
        set(&mut scores, "a", -10.0);
        set(&mut scores, "b", -10.0);
        set(&mut scores, "ab", -1.0);
        set(&mut scores, "▁a", -2.0);
        set(&mut scores, "▁ab", -3.0);
        let v = GgufVocab {
            model: "llama".into(),
            tokens: tokens.clone(),
            token_type: Some(types),
            scores: Some(scores),
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            unknown_token_id: Some(0),
            ..Default::default()
        };
        let tok = v.build_tokenizer().unwrap();
        let enc = tok.encode("ab é", false).unwrap();
        let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
        // "▁ab▁é": ab merges first, then ▁+ab; "é" (C3 A9) is not a piece: bytes.
        assert_eq!(enc.get_ids(), [id("▁ab"), id("▁"), 3 + 0xC3, 3 + 0xA9]);
        let enc = tok.encode("ab", true).unwrap();
        assert_eq!(enc.get_ids(), [1, id("▁ab")]);
        assert_eq!(
            tok.decode(&[1, id("▁ab"), id("▁"), 3 + 0xC3, 3 + 0xA9], true)
                .unwrap(),
            "ab é"
        );
    }
}
