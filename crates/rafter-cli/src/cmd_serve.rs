//! `rafter serve`: an LLM behind an OpenAI-compatible HTTP API (see the rafter-server crate).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use rafter_llm_engine::{Llm, LlmOptions};
use rafter_server::{Server, ServerOptions};

use crate::cmd_generate::{parse_kv_type, parse_weights, stage_name};
use crate::progress::Steps;

#[derive(Args)]
pub struct ServeArgs {
    /// The model: a Hugging Face folder, a .gguf file, or an .rfa compiled from one.
    model: PathBuf,
    /// The address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on (0: a free one, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The most positions (prompt and completion) a request may use; the KV cache is
    /// allocated for it. Default: the model's context, at most 4096.
    #[arg(long)]
    context: Option<usize>,
    /// Kernel threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The name clients give as `model` (default: the model's file or folder name).
    #[arg(long)]
    model_name: Option<String>,
    /// Requests that may wait while one generates; more are answered 503 (queue_full).
    #[arg(long, default_value_t = 16)]
    max_queue: usize,
    /// Quantize an HF checkpoint's float weights while compiling (as `rafter generate`).
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
}

/// The default `model` name: the file name without its extension, or the folder's name.
fn default_model_name(path: &Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "rafter".to_string())
}

pub fn serve(args: ServeArgs) -> Result<ExitCode> {
    let model_name = args
        .model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&args.model));
    if model_name.is_empty() {
        bail!("--model-name must not be empty");
    }
    let steps = Steps::new(4);
    let options = LlmOptions {
        context: args.context,
        weights: parse_weights(args.weights.as_deref())?,
        kv_type: parse_kv_type(args.kv_type.as_deref())?,
        threads: args.threads,
        trace: None,
        map_weights: args.mmap,
        matmul_precision: args.matmul_precision,
    };
    let llm = Llm::open_observed(&args.model, &options, &mut |stage| {
        steps.step(stage_name(stage))
    })
    .with_context(|| format!("opening {}", args.model.display()))?;
    steps.finish();
    let context = llm.context();
    let server = Server::new(
        llm,
        ServerOptions {
            model_name: model_name.clone(),
            max_queue: args.max_queue,
        },
    )
    .context("starting the generation worker")?;
    if let Some(why) = server.chat_template_problem() {
        eprintln!("rafter serve: warning: /v1/chat/completions is off: {why}");
    }
    let addr = format!("{}:{}", args.host, args.port);
    rafter_server::run(server, &addr, |bound| {
        // One line on stdout, so scripts started with --port 0 can read the port.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "serve: {model_name} (context {context}) on http://{bound}/v1 (Ctrl-C stops)"
        );
        let _ = out.flush();
    })
    .with_context(|| format!("serving on {addr}"))?;
    eprintln!("rafter serve: stopped");
    Ok(ExitCode::SUCCESS)
}
