//! LLMs end to end: a Hugging Face folder or a GGUF file read, built into a decoder graph,
//! compiled, and bound to a CPU session whose KV caches are session state; its tokenizer
//! and chat template; and generation through `rafter-generate`'s loop.
//!
//! The CLI's `rafter generate`, the OpenAI-compatible server and the Python package all
//! open models through [`Llm::open`].

mod model;
pub mod vocab;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use rafter_generate::{ChatRequest, ChatTemplate, GenerateParams, Generation, Message, Tokenizer};
use rafter_ir::{Dim, Symbol};
use rafter_llm::graph::{BuildError, PAST, SEQ};
use rafter_llm::source::SourceFormat;
use rafter_llm::{build_decoder, DecoderOptions, Logits, ModelSource, ModelSpec, SourceError};
use rafter_runtime::{RuntimeError, Session, SessionOptions};

pub use model::SessionModel;

/// Why a model could not be opened or run; each names the file or step.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("building the decoder: {0}")]
    Build(#[from] BuildError),
    #[error("compiling the decoder: {0}")]
    Compile(#[from] rafter_opt::CompileError),
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
    #[error("{0}")]
    Options(String),
}

/// How to open a model.
#[derive(Clone, Default)]
pub struct LlmOptions {
    /// The most positions (prompt and generated) a sequence may hold: the KV caches are
    /// allocated for it. Default: the model's trained context, at most 4096.
    pub context: Option<usize>,
    /// Kernel threads (0: one per core).
    pub threads: usize,
    /// Re-encode float weights (HF checkpoints) in this block format (`q8_0`, `q4_0`,
    /// `q4_k`, ...) while compiling; GGUF weights keep their types.
    pub weights: Option<rafter_ir::WeightFormat>,
    /// Where the CPU device reports each dispatch (a [`rafter_runtime::ChromeTrace`]).
    pub trace: Option<std::sync::Arc<dyn rafter_hal::TraceSink>>,
}

/// Default cap on the context when the caller names none (the KV caches are allocated for
/// it up front).
pub const DEFAULT_CONTEXT: usize = 4096;

/// What [`Llm::open`] is doing, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading and validating the files (weights memory-mapped).
    Read,
    /// Building the decoder graph.
    Build,
    /// Compiling it.
    Compile,
    /// Binding it to the devices.
    Bind,
}

/// An LLM ready to generate.
pub struct Llm {
    path: PathBuf,
    spec: ModelSpec,
    tokenizer: Tokenizer,
    session: Session,
    context: usize,
}

impl Llm {
    /// Opens an HF folder or a GGUF file: reads it, builds and compiles the decoder for
    /// `options.context` positions, binds it to the CPU, and builds its tokenizer.
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
        observe(Stage::Read);
        let source = ModelSource::open(&path)?;
        let tokenizer = tokenizer_of(&source, &path)?;
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
        let decoder = build_decoder(
            &source,
            &DecoderOptions {
                logits: Logits::Last,
                quantize: options.weights,
            },
        )?;
        observe(Stage::Compile);
        let n = context as i64;
        let past_seq = Dim::symbol(PAST).add(&Dim::symbol(SEQ));
        let compile = rafter_opt::CompileOptions {
            bounds: vec![(Symbol::new(PAST), n), (Symbol::new(SEQ), n)],
            dim_bounds: vec![(past_seq, n)],
            ..Default::default()
        };
        let program = rafter_opt::compile(&decoder.graph, &compile)?;
        observe(Stage::Bind);
        let devices = rafter_runtime_cpu::devices_with(rafter_runtime_cpu::CpuDeviceOptions {
            worker_threads: options.threads,
            trace_sink: options.trace.clone(),
            ..Default::default()
        })?;
        let mut session_options = SessionOptions::new();
        if options.threads > 0 {
            session_options = session_options.kernel_threads(options.threads);
        }
        let session = Session::with_options(program, &devices, session_options)?;
        Ok(Llm {
            path,
            spec: source.spec,
            tokenizer,
            session,
            context,
        })
    }

    /// The file or folder it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The architecture description.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The positions a sequence may hold (prompt and generated tokens).
    pub fn context(&self) -> usize {
        self.context
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
            .or(self.spec.chat_template.as_deref())
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
        let mut model = SessionModel::new(&self.session, self.context);
        Ok(rafter_generate::generate(
            &mut model,
            &self.tokenizer,
            prompt_ids,
            params,
            on_text,
        )?)
    }
}

/// The tokenizer a model ships: an HF folder's `tokenizer.json` (+ config), or a GGUF's
/// embedded vocabulary.
fn tokenizer_of(source: &ModelSource, path: &Path) -> Result<Tokenizer, EngineError> {
    let wrap = |source| EngineError::Tokenizer {
        path: path.to_path_buf(),
        source,
    };
    match &source.format {
        SourceFormat::HfFolder { dir } => {
            if !dir.join("tokenizer.json").is_file() {
                return Err(EngineError::NoTokenizer {
                    path: dir.clone(),
                    msg: "no tokenizer.json: rafter needs the model's Hugging Face tokenizer \
                          file next to config.json"
                        .into(),
                });
            }
            Tokenizer::from_hf_dir(dir).map_err(wrap)
        }
        SourceFormat::Gguf { .. } => {
            let file = source.gguf().expect("a GGUF source keeps its file");
            let vocab = vocab::gguf_vocab(file)?.ok_or_else(|| EngineError::NoTokenizer {
                path: path.to_path_buf(),
                msg: "the GGUF file has no embedded tokenizer (tokenizer.ggml.model)".into(),
            })?;
            Tokenizer::from_gguf_vocab(&vocab).map_err(wrap)
        }
    }
}
