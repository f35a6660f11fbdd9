//! `rafter`: compile, run, plan, inspect and conformance-test models from the command line.

mod cache_sweep;
mod calibrate;
mod cmd_bench;
mod cmd_compile;
mod cmd_conformance;
mod cmd_devices;
mod cmd_generate;
mod cmd_inspect;
mod cmd_plan;
mod cmd_run;
mod cmd_serve;
mod dims;
mod estimate;
mod host_load;
mod model;
mod placement;
mod progress;
mod rss;
mod spread;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "rafter",
    version,
    about = "rafter: an AI compiler and heterogeneous runtime for on-device inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile an ONNX model into one artifact (.rfa) that `rafter run` loads directly.
    Compile(cmd_compile::CompileArgs),
    /// Run a model (ONNX or artifact) on inputs from .npy files (random inputs when none
    /// are given). Without a model, runs the built-in demo: a small BERT-like encoder.
    Run(cmd_run::RunArgs),
    /// Show a compiled program: kernels with their fused ops, buffers, weights and each
    /// device's planned memory.
    Plan(cmd_plan::PlanArgs),
    /// List the devices the HAL finds on this machine; with `--profile`, measure each
    /// one's costs for the cost-model placement (`--target auto`) and store them.
    Devices(cmd_devices::DevicesArgs),
    /// Time calls of a model on the runtime after warm-up; ends with
    /// `bench: median M ms, p10 A ms, p90 B ms, peak RSS R MB`.
    Bench(cmd_bench::BenchArgs),
    /// Show a model's inputs, outputs, op histogram, parameters and unsupported ops.
    Inspect {
        /// The model (.onnx).
        model: PathBuf,
        /// Also print the imported graph in rafter's IR text format (large constants elided).
        #[arg(long)]
        ir: bool,
    },
    /// Run ONNX's backend test suite and report every failing or skipped test.
    Conformance(cmd_conformance::ConformanceArgs),
    /// Generate text with an LLM (a Hugging Face folder or a .gguf file), streamed to stdout;
    /// ends with `generate: prompt P tokens at X tok/s, N tokens at Y tok/s, peak RSS R MB`.
    Generate(cmd_generate::GenerateArgs),
    /// Serve an LLM over an OpenAI-compatible HTTP API (/v1/models, /v1/completions,
    /// /v1/chat/completions, streamed or not; /health); requests queue in arrival order.
    Serve(cmd_serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compile(args) => cmd_compile::compile(args),
        Command::Run(args) => cmd_run::run(args),
        Command::Plan(args) => cmd_plan::plan(args),
        Command::Devices(args) => cmd_devices::devices(args),
        Command::Bench(args) => cmd_bench::bench(args),
        Command::Inspect { model, ir } => cmd_inspect::inspect(&model, ir),
        Command::Conformance(args) => cmd_conformance::conformance(args),
        Command::Generate(args) => cmd_generate::generate(args),
        Command::Serve(args) => cmd_serve::serve(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, each cause left out when the message before it
/// already says it (many errors format their source into their own message, and anyhow's
/// `{:#}` would repeat it).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if out.contains(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("not a valid ONNX model: {0}")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("invalid wire type value: 7")]
    struct Inner;

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let e = anyhow::Error::new(Outer(Inner)).context("reading x.onnx");
        assert_eq!(
            error_chain(&e),
            "reading x.onnx: not a valid ONNX model: invalid wire type value: 7"
        );
        let e = anyhow::Error::new(Inner).context("reading x.onnx");
        assert_eq!(
            error_chain(&e),
            "reading x.onnx: invalid wire type value: 7"
        );
    }
}
