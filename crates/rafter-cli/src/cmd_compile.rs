//! `rafter compile`: an ONNX model, or an LLM (a Hugging Face folder or a GGUF file), to one
//! artifact (`.rfa`) that `rafter run` / `rafter generate` load without the compiler.

use crate::dims::{bounds, parse_dims, split_sum_bounds};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use anyhow::{bail, Result};
use rafter_compiler::{CompileOptions, WeightFormat};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CompileArgs {
    /// The model: an .onnx file, or an LLM (a Hugging Face folder or a .gguf file).
    model: PathBuf,
    /// The artifact to write (default: the model's path with extension .rfa).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The machine to compile for: `cpu`; `vulkan` (kernels the SPIR-V generator supports
    /// on the GPU, the rest on the CPU; `rafter plan` shows which and why); `auto` (every
    /// device found, placed by the cost model); or a device set such as `cpu,vulkan`
    /// (placed by the cost model).
    #[arg(long, default_value = "cpu")]
    target: String,
    #[command(flatten)]
    placement: crate::placement::PlacementArgs,
    /// An upper bound of a symbolic dim, as SYMBOL<=N (seq<=2048); SYMBOL=N is the same
    /// bound; or of a sum (past+seq<=4096: for an LLM, the positions its KV caches hold).
    /// Memory is planned for the bounds; a call above one is rejected.
    #[arg(long = "dim", value_name = "SYMBOL<=N")]
    dims: Vec<String>,
    /// How the CPU stores matrix-product weights: `f32` (exact), or `f16` / `bf16` (half
    /// the bytes and memory; the products use the weights rounded to 16 bits, accumulating
    /// in f32). Convolution weights stay f32. `--target cpu` only.
    #[arg(long, default_value = "f32", value_name = "f32|f16|bf16")]
    cpu_weights: String,
    /// LLMs: quantize an HF checkpoint's float weights to this block format (q8_0, q4_0,
    /// q4_1, q5_0, q5_1, q4_k, q5_k, q6_k); GGUF weights keep their types.
    #[arg(long, value_name = "FORMAT")]
    weights: Option<String>,
    /// LLMs: the KV cache's element type, f16 (half the cache's memory and decode traffic;
    /// the default for GGUF files, as in llama.cpp) or f32 (the default for Hugging Face
    /// folders: exactly transformers' f32).
    #[arg(long, value_name = "TYPE")]
    kv_type: Option<String>,
}

pub fn compile(args: CompileArgs) -> Result<ExitCode> {
    if crate::cmd_generate::is_llm_source(&args.model)? {
        return compile_llm(args);
    }
    if args.weights.is_some() {
        bail!("--weights applies to LLMs (Hugging Face folders and GGUF files)");
    }
    if args.kv_type.is_some() {
        bail!("--kv-type applies to LLMs (Hugging Face folders and GGUF files)");
    }
    let target = args.placement.apply(model::parse_target(&args.target)?)?;
    let (dims, sums) = split_sum_bounds(&args.dims)?;
    let mut bounds = bounds(&parse_dims(&dims)?);
    for (sum, b) in &sums {
        for s in sum.symbols() {
            if !bounds.iter().any(|(x, _)| *x == s) {
                bounds.push((s, *b));
            }
        }
    }
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
    crate::dims::check_symbols(
        &parse_dims(&dims)?,
        &sums,
        &crate::dims::model_symbols(graph.values.iter().map(|v| &v.ty)),
    )?;
    let options = CompileOptions {
        target,
        bounds,
        dim_bounds: sums,
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

/// An LLM (HF folder or GGUF) to an artifact that carries its tokenizer.
fn compile_llm(args: CompileArgs) -> Result<ExitCode> {
    if args.target != "cpu" {
        bail!(
            "LLMs compile for --target cpu for now (got --target {})",
            args.target
        );
    }
    let (dims, sums) = split_sum_bounds(&args.dims)?;
    if !dims.is_empty() {
        bail!(
            "--dim {}: an LLM takes one bound, the positions its KV caches hold, as \
             --dim 'past+seq<=N'",
            dims.join(", ")
        );
    }
    let context = match sums.as_slice() {
        [] => None,
        [(sum, n)] if sum.to_string() == "past + seq" => Some(*n as usize),
        _ => bail!("an LLM takes one bound, --dim 'past+seq<=N'"),
    };
    let output = args.output.clone().unwrap_or_else(|| {
        let base = args.model.to_string_lossy();
        let base = base.trim_end_matches('/');
        PathBuf::from(base).with_extension("rfa")
    });
    if output == args.model {
        bail!(
            "the output {} would overwrite the model: pass -o with another path",
            output.display()
        );
    }
    let options = rafter_llm_engine::LlmOptions {
        context,
        weights: crate::cmd_generate::parse_weights(args.weights.as_deref())?,
        kv_type: crate::cmd_generate::parse_kv_type(args.kv_type.as_deref())?,
        // Read once to be written out: no copy into memory.
        map_weights: true,
        ..Default::default()
    };
    let steps = Steps::new(5);
    let compiled = rafter_llm_engine::compile(&args.model, &options, &mut |stage| {
        steps.step(crate::cmd_generate::stage_name(stage))
    })?;
    steps.step("writing the artifact");
    let artifact_bytes = compiled.write(&output)?;
    let program = &compiled.compiled.program;
    let elapsed = steps.finish();
    let kv: u64 = (0..program.states.len())
        .filter_map(|s| program.state_bytes(s))
        .sum();
    println!(
        "compiled {} -> {}: {}, {} weight bytes, {} KV-cache bytes ({}) for {} positions, \
         {} artifact bytes, {}",
        args.model.display(),
        output.display(),
        model::kernel_count(program),
        model::weight_bytes(program),
        kv,
        compiled.info.kv_type,
        compiled.info.context,
        artifact_bytes,
        model::human_time(elapsed)
    );
    Ok(ExitCode::SUCCESS)
}
