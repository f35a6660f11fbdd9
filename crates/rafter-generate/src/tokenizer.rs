//! [`Tokenizer`]: text to token ids and back, from a Hugging Face folder or a GGUF vocabulary,
//! with the special tokens generation needs (BOS, EOS, the end-of-generation set) and the
//! chat template that came with it.

use std::path::Path;

use rafter_gguf::GgufFile;
use serde_json::Value;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::Replace;
use tokenizers::DecoderWrapper;

use crate::error::{Error, Result};
use crate::gguf_vocab::{GgufVocab, EOG_TEXTS};
use crate::hf_json::{parse_tokenizer_json, MAX_TOKEN_ID};
use crate::stream::StreamDecoder;

/// A tokenizer and what generation needs to know about its special tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    stop_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop_ids", &self.stop_ids)
            .field(
                "chat_template",
                &self.chat_template.as_ref().map(|t| t.len()),
            )
            .finish()
    }
}

/// SentencePiece's decoder: `▁` back to spaces, `<0xXX>` tokens back to bytes, and (when the
/// encoder added one) the first leading space dropped, as HF's Llama tokenizer and
/// llama.cpp's detokenizer do.
pub(crate) fn spm_decoder(strip_first_space: bool) -> DecoderWrapper {
    let mut parts: Vec<DecoderWrapper> = vec![
        Replace::new("\u{2581}", " ")
            .expect("a literal pattern always compiles")
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if strip_first_space {
        parts.push(Strip::new(' ', 1, 0).into());
    }
    DecSequence::new(parts).into()
}

/// A special token as tokenizer_config.json writes it: a string or `{"content": ...}`.
fn token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(m) => m.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// tokenizer_config.json's `chat_template`: a string, or a list of `{name, template}` of
/// which `default` is the one.
fn config_template(v: &Value, path: &Path) -> Result<Option<String>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(list) => {
            let named = |want: &str| {
                list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want).then(|| t.get("template")?.as_str())?
                })
            };
            Ok(named("default").map(str::to_string))
        }
        _ => Err(Error::BadJson {
            path: path.to_path_buf(),
            message: "chat_template is neither a string nor a list of named templates".into(),
        }),
    }
}

/// generation_config.json's `eos_token_id`: an id or a list of ids (absent or null: none).
fn ids_of(v: Option<&Value>, path: &Path) -> Result<Vec<u32>> {
    let one = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n < MAX_TOKEN_ID)
            .ok_or_else(|| Error::BadJson {
                path: path.to_path_buf(),
                message: format!("eos_token_id holds {v}, which is not a token id"),
            })
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// tokenizer_config.json's `add_bos_token` / `add_eos_token`, when set, decide what
/// encoding with special tokens adds (transformers rebuilds the post-processor from them);
/// a tokenizer.json that already agrees is left as it is.
fn apply_bos_eos_flags(
    tok: &mut tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
) -> Result<()> {
    if add_bos.is_none() && add_eos.is_none() {
        return Ok(());
    }
    let probe = tok.encode("a", true).map_err(Error::tok)?;
    let ids = probe.get_ids();
    let has_bos = bos.is_some() && ids.first() == bos.as_ref();
    let has_eos = eos.is_some() && ids.last() == eos.as_ref() && ids.len() > 1;
    let want_bos = add_bos.unwrap_or(has_bos) && bos.is_some();
    let want_eos = add_eos.unwrap_or(has_eos) && eos.is_some();
    if want_bos == has_bos && want_eos == has_eos {
        return Ok(());
    }
    let name = |id: u32| tok.id_to_token(id).unwrap_or_default();
    let mut single: Vec<String> = Vec::new();
    let mut specials = Vec::new();
    if want_bos {
        let b = bos.expect("want_bos implies bos");
        single.push(name(b));
        specials.push((name(b), b));
    }
    single.push("$A".into());
    if want_eos {
        let e = eos.expect("want_eos implies eos");
        single.push(name(e));
        specials.push((name(e), e));
    }
    let mut pair = single.clone();
    pair.extend(single.iter().map(|s| {
        if s == "$A" {
            "$B:1".to_string()
        } else {
            format!("{s}:1")
        }
    }));
    specials.dedup();
    let pp = tokenizers::processors::template::TemplateProcessing::builder()
        .try_single(single.join(" "))
        .and_then(|b| b.try_pair(pair.join(" ")))
        .map_err(Error::tok)?
        .special_tokens(specials)
        .build()
        .map_err(Error::tok)?;
    tok.with_post_processor(Some(pp));
    Ok(())
}

/// The files of a Hugging Face tokenizer, already read (see [`Tokenizer::from_hf_files`]).
#[derive(Debug, Clone, Copy)]
pub struct HfTokenizerFiles<'a> {
    /// The folder the files come from: errors name `dir/tokenizer.json` and so on.
    pub dir: &'a Path,
    /// `tokenizer.json`.
    pub tokenizer_json: &'a [u8],
    /// `tokenizer_config.json` (BOS/EOS, their flags, the chat template).
    pub tokenizer_config: Option<&'a [u8]>,
    /// `chat_template.jinja` (the template as newer transformers saves it; preferred).
    pub chat_template: Option<&'a [u8]>,
    /// `generation_config.json` (EOS ids).
    pub generation_config: Option<&'a [u8]>,
}

fn utf8<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| Error::BadJson {
        path: path.to_path_buf(),
        message: format!("not UTF-8 text: {e}"),
    })
}

fn parse_json(bytes: &[u8], path: &Path) -> Result<Value> {
    serde_json::from_str(utf8(bytes, path)?).map_err(|e| Error::BadJson {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read(path).map(Some).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl Tokenizer {
    /// Loads a Hugging Face model folder: `tokenizer.json` (required), and when present
    /// `tokenizer_config.json` (BOS/EOS, chat template), `chat_template.jinja` (the template
    /// as newer transformers saves it, preferred) and `generation_config.json` (EOS ids).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let Some(tokenizer_json) = read_opt(&dir.join("tokenizer.json"))? else {
            return Err(Error::Missing {
                path: dir.to_path_buf(),
                what: "tokenizer.json (the Hugging Face tokenizer)".into(),
            });
        };
        let config = read_opt(&dir.join("tokenizer_config.json"))?;
        let jinja = read_opt(&dir.join("chat_template.jinja"))?;
        let generation = read_opt(&dir.join("generation_config.json"))?;
        Self::from_hf_files(HfTokenizerFiles {
            dir,
            tokenizer_json: &tokenizer_json,
            tokenizer_config: config.as_deref(),
            chat_template: jinja.as_deref(),
            generation_config: generation.as_deref(),
        })
    }

    /// [`Tokenizer::from_hf_dir`] on files already read. Errors name the file and field.
    pub fn from_hf_files(files: HfTokenizerFiles<'_>) -> Result<Self> {
        let dir = files.dir;
        let file = dir.join("tokenizer.json");
        let text = utf8(files.tokenizer_json, &file)?;
        let mut inner = parse_tokenizer_json(text, &file.display().to_string())?;
        let config_path = dir.join("tokenizer_config.json");
        let config = match files.tokenizer_config {
            Some(bytes) => parse_json(bytes, &config_path)?,
            None => Value::Null,
        };
        let id = |key: &str| {
            config
                .get(key)
                .and_then(token_text)
                .and_then(|t| inner.token_to_id(t))
        };
        let bos = id("bos_token");
        let eos = id("eos_token");
        let flag = |key: &str| config.get(key).and_then(Value::as_bool);
        apply_bos_eos_flags(
            &mut inner,
            bos,
            eos,
            flag("add_bos_token"),
            flag("add_eos_token"),
        )?;
        let chat_template = match files.chat_template {
            Some(bytes) => Some(utf8(bytes, &dir.join("chat_template.jinja"))?.to_string()),
            None => config_template(
                config.get("chat_template").unwrap_or(&Value::Null),
                &config_path,
            )?,
        };
        let mut stop_ids: Vec<u32> = eos.into_iter().collect();
        if let Some(bytes) = files.generation_config {
            let gen_path = dir.join("generation_config.json");
            let gen = parse_json(bytes, &gen_path)?;
            stop_ids.extend(ids_of(gen.get("eos_token_id"), &gen_path)?);
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Tokenizer {
            inner,
            bos,
            eos,
            stop_ids,
            chat_template,
        })
    }

    /// Builds the tokenizer of a GGUF's embedded vocabulary, tokenizing as llama.cpp does
    /// (see [`GgufVocab::build_tokenizer`]). The end-of-generation set is EOS, EOT, EOM and
    /// the tokens llama.cpp recognises by text (`<|im_end|>`, `<end_of_turn>`, ...).
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self> {
        let inner = vocab.build_tokenizer()?;
        let mut stop_ids: Vec<u32> = [vocab.eos_token_id, vocab.eot_token_id, vocab.eom_token_id]
            .into_iter()
            .flatten()
            .collect();
        for t in EOG_TEXTS {
            if let Some(id) = inner.token_to_id(t) {
                stop_ids.push(id);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Tokenizer {
            inner,
            bos: vocab.bos_token_id,
            eos: vocab.eos_token_id,
            stop_ids,
            chat_template: vocab.chat_template.clone(),
        })
    }

    /// The tokenizer embedded in a GGUF file (`tokenizer.ggml.*`, see
    /// [`GgufVocab::from_gguf`]); `Ok(None)` when the file has none. Errors name the file.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<Self>> {
        let Some(vocab) = GgufVocab::from_gguf(f).map_err(|e| Error::Vocab(e.to_string()))? else {
            return Ok(None);
        };
        Self::from_gguf_vocab(&vocab)
            .map(Some)
            .map_err(|e| match e {
                Error::Vocab(m) => Error::Vocab(format!("{}: {m}", f.name())),
                Error::Tokenizer(m) => Error::Tokenizer(format!("{}: {m}", f.name())),
                other => other,
            })
    }

    /// The whole tokenizer as one JSON document (the `tokenizers` model, special ids, stop
    /// ids, chat template), for storing it with a compiled model; [`Tokenizer::from_json`]
    /// reads it back.
    pub fn to_json(&self) -> Result<String> {
        let inner = self
            .inner
            .to_string(false)
            .map_err(|e| Error::Tokenizer(format!("serialising the tokenizer: {e}")))?;
        let doc = serde_json::json!({
            "tokenizer": inner,
            "bos": self.bos,
            "eos": self.eos,
            "stop_ids": self.stop_ids,
            "chat_template": self.chat_template,
        });
        Ok(doc.to_string())
    }

    /// Reads a document [`Tokenizer::to_json`] wrote; an error says what is missing.
    pub fn from_json(json: &str) -> Result<Self> {
        let bad = |m: String| Error::Tokenizer(format!("stored tokenizer: {m}"));
        let doc: Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let inner = doc["tokenizer"]
            .as_str()
            .ok_or_else(|| bad("no `tokenizer` string".into()))?;
        let inner = parse_tokenizer_json(inner, "stored tokenizer")?;
        let id = |k: &str| -> Result<Option<u32>> {
            match &doc[k] {
                Value::Null => Ok(None),
                v => v
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| bad(format!("`{k}` is not a token id"))),
            }
        };
        let stop_ids = doc["stop_ids"]
            .as_array()
            .ok_or_else(|| bad("no `stop_ids` list".into()))?
            .iter()
            .map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("`stop_ids` holds something other than token ids".into()))?;
        let chat_template = doc["chat_template"].as_str().map(str::to_string);
        Ok(Tokenizer::from_parts(
            inner,
            id("bos")?,
            id("eos")?,
            stop_ids,
            chat_template,
        ))
    }

    /// Wraps a `tokenizers::Tokenizer` built elsewhere.
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        stop_ids: Vec<u32>,
        chat_template: Option<String>,
    ) -> Self {
        Tokenizer {
            inner,
            bos,
            eos,
            stop_ids,
            chat_template,
        }
    }

    /// Whether special tokens written in the text (`<|im_start|>`) become their ids (the
    /// default, as in `tokenizers` and llama.cpp's `parse_special`) or are tokenized as text.
    pub fn set_parse_special(&mut self, parse: bool) {
        self.inner.set_encode_special_tokens(!parse);
    }

    /// Token ids of `text`; `add_special` adds what the tokenizer adds around a sequence
    /// (BOS for Llama and Gemma, nothing for Qwen).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special).map_err(Error::tok)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`; `skip_special` leaves out special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(Error::tok)
    }

    /// An incremental detokenizer (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The text of BOS (`""` if none), as chat templates receive it.
    pub fn bos_token(&self) -> String {
        self.bos
            .and_then(|i| self.id_to_token(i))
            .unwrap_or_default()
    }

    /// The text of EOS (`""` if none), as chat templates receive it.
    pub fn eos_token(&self) -> String {
        self.eos
            .and_then(|i| self.id_to_token(i))
            .unwrap_or_default()
    }

    /// Token ids that end generation (EOS and the model's end-of-turn tokens).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The chat template that came with the tokenizer, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
