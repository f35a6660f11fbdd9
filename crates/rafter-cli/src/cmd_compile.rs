//! `rafter compile`: an ONNX model to one artifact (`.rfa`) that `rafter run` loads without
//! the compiler.

use crate::dims::{bounds, parse_dims};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use anyhow::{bail, Result};
use rafter_compiler::{CompileOptions, WeightFormat};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CompileArgs {
    /// The model (.onnx).
    model: PathBuf,
    /// The artifact to write (default: the model's path with extension .rfa).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The machine to compile for: `cpu`, or `vulkan` (kernels the SPIR-V generator supports
    /// on the GPU, the rest on the CPU; `rafter plan` shows which and why).
    #[arg(long, default_value = "cpu")]
    target: String,
    /// An upper bound of a symbolic dim, as SYMBOL<=N (seq<=2048); SYMBOL=N is the same
    /// bound. Memory is planned for the bounds; a call above one is rejected.
    #[arg(long = "dim", value_name = "SYMBOL<=N")]
    dims: Vec<String>,
    /// How the CPU stores matrix-product weights: `f32` (exact), or `f16` / `bf16` (half
    /// the bytes and memory; the products use the weights rounded to 16 bits, accumulating
    /// in f32). Convolution weights stay f32. `--target cpu` only.
    #[arg(long, default_value = "f32", value_name = "f32|f16|bf16")]
    cpu_weights: String,
}

pub fn compile(args: CompileArgs) -> Result<ExitCode> {
    let target = model::parse_target(&args.target)?;
    let bounds = bounds(&parse_dims(&args.dims)?);
    let cpu_weights = model::parse_cpu_weights(&args.cpu_weights)?;
    if cpu_weights != WeightFormat::F32 && !target.is_cpu_only() {
        bail!(
            "--cpu-weights {} applies to --target cpu only (got --target {})",
            args.cpu_weights,
            args.target
        );
    }
    if model::file_kind(&args.model)? == FileKind::Artifact {
        bail!(
            "{} is already a compiled artifact (compile takes an .onnx model)",
            args.model.display()
        );
    }
    let output = args
        .output
        .unwrap_or_else(|| args.model.with_extension("rfa"));
    if output == args.model {
        bail!(
            "the output {} would overwrite the model: pass -o with another path",
            output.display()
        );
    }
    let steps = Steps::new(model::COMPILE_STEPS + 1);
    let graph = model::import(&args.model, &steps)?;
    let options = CompileOptions {
        target,
        bounds,
        cpu_weights,
        ..CompileOptions::default()
    };
    let compiled = model::compile_with(&graph, options, &steps)?;
    let artifact_bytes = model::write_artifact(&compiled, &output, &steps)?;
    let program = &compiled.program;
    let elapsed = steps.finish();
    println!(
        "compiled {} -> {}: {}, {} weight bytes, {} artifact bytes, {}",
        args.model.display(),
        output.display(),
        model::kernel_count(program),
        model::weight_bytes(program),
        artifact_bytes,
        model::human_time(elapsed)
    );
    Ok(ExitCode::SUCCESS)
}
