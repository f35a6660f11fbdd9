//! `rafter generate`: text from an LLM (a Hugging Face folder or a GGUF file), streamed to
//! stdout as it is produced.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use rafter_generate::{GenerateParams, Message, SamplerConfig};
use rafter_llm_engine::{Llm, LlmOptions, Stage};

use crate::progress::Steps;
use crate::rss::Rss;

#[derive(Args)]
pub struct GenerateArgs {
    /// The model: a Hugging Face folder (config.json, safetensors, tokenizer.json), a .gguf
    /// file, or an .rfa compiled from one by `rafter compile`.
    model: PathBuf,
    /// The prompt (with --chat, the user's message).
    #[arg(long, short = 'p', required_unless_present = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids instead: a file of ids separated by whitespace or commas
    /// (benchmarks feed exact lengths this way).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "chat"])]
    prompt_ids: Option<PathBuf>,
    /// Do not stop at end-of-generation tokens (generate exactly -n tokens, as benchmarks
    /// do).
    #[arg(long)]
    ignore_eos: bool,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    max_tokens: usize,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat.
    #[arg(long)]
    system: Option<String>,
    /// Sampling temperature; 0 is greedy (the default).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to p (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one (0: none).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty over the prompt and the generated tokens (1: none).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Seed of the sampler's random stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop at this string (not printed); may be repeated.
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// The most positions (prompt and generated) a sequence may hold; the KV caches are
    /// allocated for it. Default: the model's context, at most 4096.
    #[arg(long)]
    context: Option<usize>,
    /// Quantize an HF checkpoint's float weights while compiling: q8_0, q4_0, q4_1, q5_0,
    /// q5_1, q4_k, q5_k, q6_k (GGUF weights keep their types).
    #[arg(long, value_name = "FORMAT")]
    weights: Option<String>,
    /// LLMs: the KV cache's element type, f16 (half the cache's memory and decode traffic;
    /// the default for GGUF files, as in llama.cpp) or f32 (the default for Hugging Face
    /// folders: exactly transformers' f32).
    #[arg(long, value_name = "TYPE")]
    kv_type: Option<String>,
    /// Keep the model's weights memory-mapped from its files (no copy at open; the kernel
    /// may drop and re-read them under memory pressure) instead of reading them into
    /// memory backed by huge pages, which decodes faster
    #[arg(long)]
    mmap: bool,
    /// How the linear layers multiply float (f32/f16/bf16) weights on the CPU: f32
    /// (f32-accurate) or bf16 (weights and activations rounded to bf16, as PyTorch computes
    /// a bf16 model: twice the f32 rate for prompts on CPUs with AVX512-BF16; decode steps
    /// and quantized weights are unaffected)
    #[arg(long, value_name = "P", default_value = "f32")]
    matmul_precision: rafter_llm_engine::MatmulPrecision,
    /// Kernel threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Write the prompt's ids, the generated ids, the text and the timings as one JSON
    /// object to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Write a Chrome trace of every call (prefill and each decode step) to this file:
    /// one slice per kernel dispatch (open it in ui.perfetto.dev).
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// The progress bar's name for an engine stage.
pub fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Read => "reading the model",
        Stage::Build => "building the decoder",
        Stage::Compile => "compiling",
        Stage::Bind => "binding weights",
    }
}

/// `--kv-type TYPE`: the KV cache's element type (`None`: the source's default).
pub fn parse_kv_type(t: Option<&str>) -> Result<Option<rafter_llm_engine::KvType>> {
    let Some(t) = t else { return Ok(None) };
    rafter_llm_engine::KvType::from_word(t)
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("--kv-type {t}: expected f16 or f32"))
}

/// `--weights FORMAT`: a block format to quantize float weights to.
pub fn parse_weights(w: Option<&str>) -> Result<Option<rafter_ir::WeightFormat>> {
    let Some(w) = w else { return Ok(None) };
    rafter_ir::WeightFormat::from_word(&w.to_ascii_lowercase())
        .filter(|f| f.is_block())
        .map(Some)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--weights {w}: expected a block format (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, \
                 q5_k, q6_k)"
            )
        })
}

/// Whether `path` is an LLM source: a folder with `config.json`, or a GGUF file (by its
/// magic bytes).
pub fn is_llm_source(path: &std::path::Path) -> Result<bool> {
    if path.is_dir() {
        return Ok(path.join("config.json").is_file());
    }
    let mut head = Vec::new();
    use std::io::Read;
    std::fs::File::open(path)
        .with_context(|| format!("reading {}", path.display()))?
        .take(4)
        .read_to_end(&mut head)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(head == b"GGUF")
}

/// Token ids from a file (whitespace- or comma-separated), each below `vocab`.
fn read_ids(path: &std::path::Path, vocab: usize) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .enumerate()
        .map(|(i, t)| {
            let id: u32 = t.parse().map_err(|_| {
                anyhow::anyhow!("{}: entry {i} `{t}` is not a token id", path.display())
            })?;
            if id as usize >= vocab {
                bail!(
                    "{}: entry {i} is token {id}, beyond the vocabulary of {vocab}",
                    path.display()
                );
            }
            Ok(id)
        })
        .collect()
}

pub fn generate(args: GenerateArgs) -> Result<ExitCode> {
    let steps = Steps::new(4);
    let sink = args
        .trace
        .as_ref()
        .map(|_| std::sync::Arc::new(rafter_runtime::ChromeTrace::new()));
    let weights = parse_weights(args.weights.as_deref())?;
    let options = LlmOptions {
        context: args.context,
        weights,
        kv_type: parse_kv_type(args.kv_type.as_deref())?,
        threads: args.threads,
        trace: sink
            .clone()
            .map(|s| s as std::sync::Arc<dyn rafter_hal::TraceSink>),
        map_weights: args.mmap,
        matmul_precision: args.matmul_precision,
    };
    let llm = Llm::open_observed(&args.model, &options, &mut |stage| {
        steps.step(stage_name(stage))
    })
    .with_context(|| format!("opening {}", args.model.display()))?;
    steps.finish();

    let tok = llm.tokenizer();
    let prompt_ids = match &args.prompt_ids {
        Some(path) => read_ids(path, llm.info().vocab_size)?,
        None => {
            let prompt = args.prompt.clone().unwrap_or_default();
            let text = if args.chat {
                let mut messages = Vec::new();
                if let Some(s) = &args.system {
                    messages.push(Message::new("system", s.as_str()));
                }
                messages.push(Message::new("user", prompt.as_str()));
                llm.chat_prompt(&messages)?
            } else {
                prompt
            };
            // A chat template writes its own BOS where the model wants one.
            tok.encode(&text, !args.chat)?
        }
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let mut params = GenerateParams::new(tok, args.max_tokens);
    params.sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
    };
    params.stop_strings = args.stop.clone();
    if args.ignore_eos {
        params.stop_token_ids.clear();
    }

    let mut stdout = std::io::stdout().lock();
    let generation = llm.generate(&prompt_ids, &params, |piece| {
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        ControlFlow::Continue(())
    })?;
    let _ = writeln!(stdout);
    let t = &generation.timings;
    let peak = Rss::now().map_or_else(|| "?".to_string(), |r| format!("{}", r.peak_kib / 1024));
    let summary = format!(
        "generate: prompt {} tokens at {:.1} tok/s, {} tokens at {:.1} tok/s, peak RSS {peak} MB",
        t.prompt_tokens,
        t.prompt_tokens_per_second(),
        t.generated_tokens,
        t.generated_tokens_per_second(),
    );
    let _ = writeln!(stdout, "{summary}");
    if let (Some(path), Some(sink)) = (&args.trace, &sink) {
        sink.write(path)?;
    }
    if let Some(path) = &args.json_out {
        let json = serde_json::to_string_pretty(&generation)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
