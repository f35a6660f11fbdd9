//! `rafter plan`: what a compiled program does — its kernels in dispatch order with the ops
//! fused into each, its buffers and weights, and each device's planned memory. The report
//! is rendered by `rafter_compiler::plan_report`, which the Python package shares.

use crate::dims::{bounds, parse_dims};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use anyhow::{bail, Result};
use rafter_ir::program::Program;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// A compiled artifact, or an ONNX model (compiled in memory).
    model: PathBuf,
    /// The machine to compile for (ONNX models only): `cpu` or `vulkan`.
    #[arg(long, default_value = "cpu")]
    target: String,
    /// A symbol bound to compile for, SYMBOL<=N (ONNX models only).
    #[arg(long = "dim", value_name = "SYMBOL<=N")]
    dims: Vec<String>,
}

pub fn plan(args: PlanArgs) -> Result<ExitCode> {
    let program = load(&args)?;
    // The renderer is the compiler's, shared with the Python package's `Model.plan()`.
    print!(
        "{}",
        rafter_compiler::plan_report::render(&program, Some(&args.target))
    );
    Ok(ExitCode::SUCCESS)
}

/// The artifact's program, or the ONNX model compiled now.
fn load(args: &PlanArgs) -> Result<Program> {
    if model::file_kind(&args.model)? == FileKind::Artifact {
        if !args.dims.is_empty() {
            bail!("--dim: an artifact's bounds were fixed when it was compiled");
        }
        return Ok(model::open_artifact(&args.model)?.into_program());
    }
    let target = model::parse_target(&args.target)?;
    let specs = parse_dims(&args.dims)?;
    let bounds = bounds(&specs);
    let steps = Steps::new(model::COMPILE_STEPS);
    let graph = model::import(&args.model, &steps)?;
    crate::dims::check_symbols(
        &specs,
        &[],
        &crate::dims::model_symbols(graph.values.iter().map(|v| &v.ty)),
    )?;
    let program = model::compile(&graph, target, bounds, &steps)?.program;
    steps.finish();
    Ok(program)
}
