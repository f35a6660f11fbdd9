//! `rafter plan`: what a compiled program does — its kernels in dispatch order with the ops
//! fused into each, its buffers and weights, and each device's planned memory. The report
//! is rendered by `rafter_compiler::plan_report`, which the Python package shares.

use crate::dims::{bounds, parse_dims};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use anyhow::{bail, Result};
use rafter_ir::program::Program;
use rafter_opt::partition::{self, Strategy};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// A compiled artifact, or an ONNX model (compiled in memory).
    model: PathBuf,
    /// The machine to compile for (ONNX models only): `cpu`, `vulkan`, `auto` or a device
    /// set (`cpu,vulkan`); with a cost-model target the plan shows each kernel's device,
    /// estimated time and the reason for the choice.
    #[arg(long, default_value = "cpu")]
    target: String,
    #[command(flatten)]
    placement: crate::placement::PlacementArgs,
    /// A symbol bound to compile for, SYMBOL<=N (ONNX models only).
    #[arg(long = "dim", value_name = "SYMBOL<=N")]
    dims: Vec<String>,
}

pub fn plan(args: PlanArgs) -> Result<ExitCode> {
    let program = load(&args)?;
    // The renderer is the compiler's, shared with the Python package's `Model.plan()`.
    let mut out = rafter_compiler::plan_report::render(&program, Some(&args.target));
    if model::file_kind(&args.model)? != FileKind::Artifact {
        let target = args.placement.apply(model::parse_target(&args.target)?)?;
        if target.placement().strategy == Strategy::CostModel {
            let at = out.find("\nbuffers: ").map_or(out.len(), |i| i + 1);
            let mut lines = cost_lines(&program, &target).join("\n");
            lines.push('\n');
            out.insert_str(at, &lines);
        }
    }
    print!("{out}");
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
    let target = args.placement.apply(model::parse_target(&args.target)?)?;
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

/// The cost model's account of a placement: each kernel's device, estimated time and
/// reason, the crossings, and per-device totals.
///
/// ```text
/// cost model (latency): estimated 1234.5 us per call, 2 crossings (524288 bytes)
///   without the cost model (...): cpu 3410.2 us, vulkan 1301.9 us; a split must be ...
///   k0 `k0_matmul` on vulkan, 35.2 us: fastest here (cpu 3355.4 us)
///   boundary `a` vulkan -> cpu: zero-copy, 21.0 us assumed
///   boundary `x` cpu -> vulkan: copy 262144 bytes, 47.2 us assumed
///   device cpu: 3 kernels, busy 160.3 us, memory 1048576 bytes
/// ```
fn cost_lines(p: &Program, target: &rafter_compiler::Target) -> Vec<String> {
    let why = partition::explain(p, target);
    let m = partition::model(p, target);
    let placement: Vec<usize> = p
        .kernels
        .iter()
        .map(|k| {
            m.devices()
                .iter()
                .position(|d| d.name == k.device)
                .unwrap_or(0)
        })
        .collect();
    let e = m.evaluate(&placement);
    let objective = match target.placement().objective {
        partition::Objective::Latency => "latency",
        partition::Objective::Throughput => "throughput",
    };
    let mut lines = vec![format!(
        "cost model ({objective}): estimated {} per call, {} crossings ({} bytes)",
        partition::micros(e.makespan_s),
        e.crossings,
        e.crossing_bytes as u64
    )];
    // What the placement was weighed against: a split replaces the better of these only
    // when estimated `SPLIT_MARGIN` better (`Model::search`).
    let baselines: Vec<String> = m
        .baselines()
        .into_iter()
        .map(|(name, p)| format!("{name} {}", partition::micros(m.evaluate(&p).makespan_s)))
        .collect();
    lines.push(format!(
        "  without the cost model (all on the cpu; greedy-by-support per accelerator): {}; \
         a split must be estimated {:.0}% faster than the better",
        baselines.join(", "),
        partition::SPLIT_MARGIN * 100.0
    ));
    for (i, (k, c)) in p.kernels.iter().zip(&why).enumerate() {
        lines.push(format!(
            "  k{i} `{}` on {}, {}: {}",
            k.name,
            c.device,
            partition::micros(c.estimate_s),
            c.reason
        ));
    }
    // Each boundary: handed over in place or copied, and the cost assumed for it.
    for b in &e.boundaries {
        let how = if b.zero_copy {
            "zero-copy".to_string()
        } else {
            format!("copy {} bytes", b.bytes as u64)
        };
        lines.push(format!(
            "  boundary `{}` {} -> {}: {how}, {} assumed",
            p.buffers[b.buffer].name,
            m.devices()[b.from].name,
            m.devices()[b.to].name,
            partition::micros(b.cost_s)
        ));
    }
    for (d, desc) in m.devices().iter().enumerate() {
        let n = placement.iter().filter(|&&x| x == d).count();
        lines.push(format!(
            "  device {}: {n} kernels, busy {}, memory {} bytes",
            desc.name,
            partition::micros(e.busy_s[d]),
            e.memory_bytes[d]
        ));
    }
    lines
}
