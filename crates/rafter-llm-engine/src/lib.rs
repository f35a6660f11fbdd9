//! LLMs end to end: a Hugging Face folder or a GGUF file read, built into a decoder graph,
//! compiled (in memory, or into one `.rfa` artifact that also carries the tokenizer), and
//! bound to a CPU session whose KV caches are session state; its tokenizer and chat
//! template; and generation through `rafter-generate`'s loop.
//!
//! The CLI's `rafter generate` and `rafter compile`, the OpenAI-compatible server and the
//! Python package all open models through [`Llm::open`].

mod heap;
mod model;
pub mod vocab;

use std::io::Read;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rafter_artifact::Artifact;
use rafter_generate::{ChatRequest, ChatTemplate, GenerateParams, Generation, Message, Tokenizer};
use rafter_ir::{Dim, Symbol, WeightFormat};
use rafter_llm::graph::{BuildError, PAST, SEQ};
use rafter_llm::source::SourceFormat;
use rafter_llm::{build_decoder, DecoderOptions, Logits, ModelSource, SourceError, TensorMemory};
pub use rafter_runtime::MatmulPrecision;
use rafter_runtime::{RuntimeError, Session, SessionOptions};
use serde::{Deserialize, Serialize};

pub use heap::release_freed_heap;
pub use model::SessionModel;
pub use rafter_llm::KvType;

/// Why a model could not be opened or run; each names the file or step.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("building the decoder: {0}")]
    Build(#[from] BuildError),
    #[error("compiling the decoder: {0}")]
    Compile(#[from] rafter_compiler::Error),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("tokenizer of {path}: {source}")]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: rafter_generate::Error,
    },
    #[error("{path}: {msg}")]
    NoTokenizer { path: PathBuf, msg: String },
    #[error("{0}")]
    Gguf(#[from] rafter_gguf::GgufError),
    #[error(transparent)]
    Generate(#[from] rafter_generate::Error),
    #[error("{path}: {msg}")]
    Artifact { path: PathBuf, msg: String },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Options(String),
}

/// How to open (or compile) a model.
#[derive(Clone, Default)]
pub struct LlmOptions {
    /// The most positions (prompt and generated) a sequence may hold: the KV caches are
    /// allocated for it. Default: the model's trained context, at most [`DEFAULT_CONTEXT`].
    /// Fixed by the compile for an artifact (a different value is an error).
    pub context: Option<usize>,
    /// Kernel threads (0: one per core).
    pub threads: usize,
    /// Re-encode float weights (HF checkpoints) in this block format (`q8_0`, `q4_0`,
    /// `q4_k`, ...) while compiling; GGUF weights keep their types.
    pub weights: Option<WeightFormat>,
    /// The KV cache's element type; `None`: [`KvType::default_for`] the source (f16 for a
    /// GGUF, as llama.cpp; f32 for an HF folder). Fixed by the compile for an artifact (a
    /// different value is an error).
    pub kv_type: Option<KvType>,
    /// Where the CPU device reports each dispatch (a [`rafter_runtime::ChromeTrace`]).
    pub trace: Option<Arc<dyn rafter_hal::TraceSink>>,
    /// Keep an HF folder's, GGUF's or artifact's weights memory-mapped from the files
    /// instead of reading them into memory backed by huge pages (the default,
    /// [`TensorMemory::Resident`]: a decode step streams every weight, faster from huge
    /// pages). Mapped weights cost no copy at open and may be dropped and re-read by the
    /// kernel under memory pressure: what compiling to an artifact, or a device short of
    /// memory, wants.
    pub map_weights: bool,
    /// How the decoder's linear layers multiply float (f32/f16/bf16) weights on the CPU:
    /// [`MatmulPrecision::F32`] (the default: f32-accurate) or [`MatmulPrecision::Bf16`]
    /// (weights and activations rounded to bf16 as PyTorch's bf16 models compute, twice
    /// the f32 rate for prefill on CPUs with AVX512-BF16). Decode steps keep f32 products
    /// (they stream the weights at memory bandwidth either way); quantized weights always
    /// compute what ggml computes. A run-time choice: an artifact serves both.
    pub matmul_precision: MatmulPrecision,
}

impl LlmOptions {
    /// Where the weights go ([`LlmOptions::map_weights`]).
    fn weight_memory(&self) -> TensorMemory {
        if self.map_weights {
            TensorMemory::Mapped
        } else {
            TensorMemory::Resident
        }
    }
}

/// Default cap on the context when the caller names none (the KV caches are allocated for
/// it up front).
pub const DEFAULT_CONTEXT: usize = 4096;

/// The metadata section of an LLM artifact.
pub const METADATA_SECTION: &str = "llm";

/// What [`Llm::open`] is doing, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading and validating the files (weights read into memory, or mapped).
    Read,
    /// Building the decoder graph.
    Build,
    /// Compiling it.
    Compile,
    /// Binding it to the devices.
    Bind,
}

/// What an LLM artifact records besides its program: enough to generate without the
/// model's original files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmInfo {
    /// The layout of this record (1).
    pub format: u32,
    /// `Qwen3`, `Llama`, ... (the source's architecture).
    pub architecture: String,
    pub vocab_size: usize,
    /// The positions its KV caches hold.
    pub context: usize,
    /// The KV caches' element type (`f16`, `f32`; artifacts written before it was
    /// recorded have f32 caches).
    #[serde(default = "f32_word")]
    pub kv_type: String,
    /// The tokenizer ([`Tokenizer::to_json`]) as the artifact stores it. Filled only in the
    /// artifact's metadata section ([`CompiledLlm::write`] serialises it there); empty in
    /// memory ([`Llm::info`], [`CompiledLlm::info`]), where the tokenizer itself is at hand
    /// ([`Llm::tokenizer`]). Why: for a 151k-token vocabulary the JSON is ~8 MB, built and
    /// then kept for the life of the model for nothing but a write that `rafter generate`
    /// never makes.
    pub tokenizer: String,
}

fn f32_word() -> String {
    KvType::F32.word().into()
}

/// The current [`LlmInfo::format`].
const INFO_FORMAT: u32 = 1;

/// An LLM ready to generate.
pub struct Llm {
    path: PathBuf,
    info: LlmInfo,
    tokenizer: Tokenizer,
    session: Session,
}

/// A decoder compiled with what it needs to run, before it is bound to a device.
pub struct CompiledLlm {
    pub compiled: rafter_compiler::Compiled,
    pub info: LlmInfo,
    pub tokenizer: Tokenizer,
}

impl CompiledLlm {
    /// Writes the artifact (program, executables, weights, and the `llm` metadata with the
    /// tokenizer serialised into it); returns its length.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<u64, EngineError> {
        let info = LlmInfo {
            tokenizer: self.tokenizer.to_json()?,
            ..self.info.clone()
        };
        let meta = serde_json::to_vec(&info).expect("LlmInfo serialises");
        let writer = self.compiled.writer().metadata(METADATA_SECTION, meta);
        writer.write(&path).map_err(|e| EngineError::Artifact {
            path: path.as_ref().to_path_buf(),
            msg: e.to_string(),
        })
    }
}

/// Reads an HF folder or GGUF, builds and compiles its decoder for `options.context`
/// positions (not yet bound to devices).
pub fn compile(
    path: &Path,
    options: &LlmOptions,
    observe: &mut dyn FnMut(Stage),
) -> Result<CompiledLlm, EngineError> {
    observe(Stage::Read);
    let source = ModelSource::open_with(path, options.weight_memory())?;
    let tokenizer = tokenizer_of(&source, path)?;
    let context = options.context.unwrap_or_else(|| {
        source
            .spec
            .max_position_embeddings
            .clamp(1, DEFAULT_CONTEXT)
    });
    if context == 0 {
        return Err(EngineError::Options(
            "the context must hold at least 1 position".into(),
        ));
    }
    observe(Stage::Build);
    let kv_type = options
        .kv_type
        .unwrap_or_else(|| KvType::default_for(&source));
    let decoder = build_decoder(
        &source,
        &DecoderOptions {
            logits: Logits::Last,
            quantize: options.weights,
            kv_type: Some(kv_type),
        },
    )?;
    observe(Stage::Compile);
    let n = context as i64;
    let past_seq = Dim::symbol(PAST).add(&Dim::symbol(SEQ));
    let compile = rafter_compiler::CompileOptions {
        bounds: vec![(Symbol::new(PAST), n), (Symbol::new(SEQ), n)],
        dim_bounds: vec![(past_seq, n)],
        // The decoder's kernels read its f16 weights and KV cache as they are.
        half_compute: rafter_compiler::HalfCompute::AsIs,
        ..Default::default()
    };
    let compiled = rafter_compiler::compile(&decoder.graph, &compile)?;
    let info = LlmInfo {
        format: INFO_FORMAT,
        architecture: format!("{:?}", source.spec.architecture),
        vocab_size: source.spec.vocab_size,
        context,
        kv_type: kv_type.word().into(),
        // Serialised by `CompiledLlm::write`, the one reader (see `LlmInfo::tokenizer`).
        tokenizer: String::new(),
    };
    // The tokenizer is built and the graph holds the weights (slices of the map): the
    // GGUF's header is not read again, so its pages leave the resident set.
    if let Some(file) = source.gguf() {
        file.release_header_pages()
            .map_err(|source| EngineError::Io {
                path: path.to_path_buf(),
                source,
            })?;
    }
    Ok(CompiledLlm {
        compiled,
        info,
        tokenizer,
    })
}

/// Whether `path` is a rafter artifact (by its magic bytes).
fn is_artifact(path: &Path) -> Result<bool, EngineError> {
    if path.is_dir() {
        return Ok(false);
    }
    let io = |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = Vec::with_capacity(8);
    std::fs::File::open(path)
        .map_err(io)?
        .take(8)
        .read_to_end(&mut head)
        .map_err(io)?;
    Ok(head == rafter_artifact::MAGIC)
}

impl Llm {
    /// Opens an LLM: an `.rfa` compiled by [`compile`] (`rafter compile`), or an HF folder
    /// or GGUF file, which is compiled in memory for `options.context` positions. Binds it
    /// to the CPU.
    pub fn open(path: impl AsRef<Path>, options: &LlmOptions) -> Result<Llm, EngineError> {
        Llm::open_observed(path, options, &mut |_| {})
    }

    /// [`Llm::open`], calling `observe` as each [`Stage`] starts.
    pub fn open_observed(
        path: impl AsRef<Path>,
        options: &LlmOptions,
        observe: &mut dyn FnMut(Stage),
    ) -> Result<Llm, EngineError> {
        let path = path.as_ref().to_path_buf();
        if is_artifact(&path)? {
            return Llm::from_artifact(path, options, observe);
        }
        let c = compile(&path, options, observe)?;
        observe(Stage::Bind);
        let mut session_options = session_options(options);
        for (device, code) in c.compiled.executables() {
            session_options = session_options.executable(device, code);
        }
        let session =
            Session::with_options(c.compiled.program, &devices(options)?, session_options)?;
        // The graph, the GGUF's metadata and the compiler's intermediates are freed by now.
        release_freed_heap();
        Ok(Llm {
            path,
            info: c.info,
            tokenizer: c.tokenizer,
            session,
        })
    }

    fn from_artifact(
        path: PathBuf,
        options: &LlmOptions,
        observe: &mut dyn FnMut(Stage),
    ) -> Result<Llm, EngineError> {
        let bad = |msg: String| EngineError::Artifact {
            path: path.clone(),
            msg,
        };
        observe(Stage::Read);
        let artifact = if options.map_weights {
            Artifact::open(&path).map_err(|e| bad(e.to_string()))?
        } else {
            // The whole artifact into memory backed by huge pages (see
            // `LlmOptions::map_weights`); its checksums read every byte either way.
            let bytes = rafter_gguf::read_file(&path, TensorMemory::Resident)
                .map_err(|e| bad(e.to_string()))?;
            Artifact::from_bytes(bytes).map_err(|e| bad(e.to_string()))?
        };
        let meta = artifact.metadata(METADATA_SECTION).ok_or_else(|| {
            bad(
                "not an LLM artifact (no `llm` metadata section): compile an HF folder or \
                 GGUF file with `rafter compile`"
                    .into(),
            )
        })?;
        let mut info: LlmInfo = serde_json::from_slice(&meta)
            .map_err(|e| bad(format!("the `llm` metadata section: {e}")))?;
        if info.format != INFO_FORMAT {
            return Err(bad(format!(
                "the `llm` metadata has layout {}, this build reads {INFO_FORMAT}",
                info.format
            )));
        }
        if let Some(c) = options.context.filter(|&c| c != info.context) {
            return Err(EngineError::Options(format!(
                "the artifact was compiled for a context of {} positions; a context of {c} \
                 needs a new compile",
                info.context
            )));
        }
        if let Some(k) = options.kv_type.filter(|k| k.word() != info.kv_type) {
            return Err(EngineError::Options(format!(
                "the artifact was compiled with an {} KV cache; an {k} cache needs a new \
                 compile",
                info.kv_type
            )));
        }
        let tokenizer =
            Tokenizer::from_json(&info.tokenizer).map_err(|source| EngineError::Tokenizer {
                path: path.clone(),
                source,
            })?;
        // Built: the JSON is not kept in memory (see `LlmInfo::tokenizer`).
        info.tokenizer = String::new();
        observe(Stage::Bind);
        let session =
            Session::from_artifact(artifact, &devices(options)?, session_options(options))?;
        release_freed_heap();
        Ok(Llm {
            path,
            info,
            tokenizer,
            session,
        })
    }

    /// The file or folder it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the model is (architecture, vocabulary, context).
    pub fn info(&self) -> &LlmInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The positions a sequence may hold (prompt and generated tokens).
    pub fn context(&self) -> usize {
        self.info.context
    }

    /// The decoder's session (its KV caches are its state).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The chat template rendered over `messages` with the generation prompt appended, as
    /// transformers' `apply_chat_template` does. An error when the model has no template.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String, EngineError> {
        let source = self
            .tokenizer
            .chat_template()
            .ok_or_else(|| EngineError::NoTokenizer {
                path: self.path.clone(),
                msg: "the model has no chat template (tokenizer_config.json's `chat_template`, \
                      chat_template.jinja, or GGUF `tokenizer.chat_template`)"
                    .into(),
            })?;
        let template = ChatTemplate::new(
            source,
            &self.tokenizer.bos_token(),
            &self.tokenizer.eos_token(),
        )?;
        let mut request = ChatRequest::new(messages);
        request.add_generation_prompt = true;
        Ok(template.render(&request)?)
    }

    /// Generates from `prompt_ids` (the KV cache is reset first), streaming text pieces to
    /// `on_text`.
    pub fn generate(
        &self,
        prompt_ids: &[u32],
        params: &GenerateParams,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        let mut model = SessionModel::new(&self.session, self.info.context);
        Ok(rafter_generate::generate(
            &mut model,
            &self.tokenizer,
            prompt_ids,
            params,
            on_text,
        )?)
    }
}

fn devices(options: &LlmOptions) -> Result<rafter_runtime::DeviceSet, EngineError> {
    Ok(rafter_runtime_cpu::devices_with(
        rafter_runtime_cpu::CpuDeviceOptions {
            // One command worker: a decoder's kernels run one after another, each split
            // over the session's kernel threads; a command worker per core as well put
            // three busy threads on two cores (2-core Zen 4, q4_0: prefill 236-247 ->
            // 285-321 tok/s, decode 49.8-51.3 -> 51.8-52.2 with one).
            worker_threads: 1,
            trace_sink: options.trace.clone(),
            ..Default::default()
        },
    )?)
}

fn session_options(options: &LlmOptions) -> SessionOptions {
    let o = SessionOptions::new().matmul_precision(options.matmul_precision);
    if options.threads > 0 {
        o.kernel_threads(options.threads)
    } else {
        o
    }
}

/// The tokenizer a model ships: an HF folder's `tokenizer.json` (+ config), or a GGUF's
/// embedded vocabulary.
fn tokenizer_of(source: &ModelSource, path: &Path) -> Result<Tokenizer, EngineError> {
    let wrap = |source| EngineError::Tokenizer {
        path: path.to_path_buf(),
        source,
    };
    let mut tok = match &source.format {
        SourceFormat::HfFolder { dir } => {
            if !dir.join("tokenizer.json").is_file() {
                return Err(EngineError::NoTokenizer {
                    path: dir.clone(),
                    msg: "no tokenizer.json: rafter needs the model's Hugging Face tokenizer \
                          file next to config.json"
                        .into(),
                });
            }
            Tokenizer::from_hf_dir(dir).map_err(wrap)?
        }
        SourceFormat::Gguf { .. } => {
            let file = source.gguf().expect("a GGUF source keeps its file");
            let vocab = vocab::gguf_vocab(file)?.ok_or_else(|| EngineError::NoTokenizer {
                path: path.to_path_buf(),
                msg: "the GGUF file has no embedded tokenizer (tokenizer.ggml.model)".into(),
            })?;
            Tokenizer::from_gguf_vocab(&vocab).map_err(wrap)?
        }
    };
    // A template the spec knows (from a sibling file) where the tokenizer has none.
    if tok.chat_template().is_none() {
        if let Some(t) = &source.spec.chat_template {
            let json = tok.to_json().map_err(wrap)?;
            let mut doc: serde_json::Value = serde_json::from_str(&json).expect("own JSON");
            doc["chat_template"] = serde_json::Value::String(t.clone());
            tok = Tokenizer::from_json(&doc.to_string()).map_err(wrap)?;
        }
    }
    Ok(tok)
}
