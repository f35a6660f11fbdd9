//! `rafter plan`: what a compiled program does — its kernels in dispatch order with the ops
//! fused into each, its buffers and weights, and each device's planned memory.

use crate::dims::{bounds, parse_dims};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use anyhow::{bail, Result};
use rafter_ir::program::{Kernel, Program, Step, Storage};
use rafter_ir::AttrValue;
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
    let mut out = render(&program);
    if model::file_kind(&args.model)? != FileKind::Artifact {
        let target = args.placement.apply(model::parse_target(&args.target)?)?;
        if target.placement().strategy == Strategy::CostModel {
            let at = out.find("\nbuffers: ").map_or(out.len(), |i| i + 1);
            let mut lines = cost_lines(&program, &target).join("\n");
            lines.push('\n');
            out.insert_str(at, &lines);
        }
    }
    if args.target == "vulkan" && !model::uses_vulkan(&program) {
        // Compiled for vulkan, yet nothing went there: say why for every kernel.
        let at = out.find("\nbuffers: ").map_or(out.len(), |i| i + 1);
        let mut lines = placement_lines(&program, true).join("\n");
        lines.push('\n');
        out.insert_str(at, &lines);
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
///   k0 `k0_matmul` on vulkan, 35.2 us: fastest here (cpu 3355.4 us)
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
    for (i, (k, c)) in p.kernels.iter().zip(&why).enumerate() {
        lines.push(format!(
            "  k{i} `{}` on {}, {}: {}",
            k.name,
            c.device,
            partition::micros(c.estimate_s),
            c.reason
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

/// The whole report; the last lines are the per-device memory lines.
pub fn render(p: &Program) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "program `{}`: {} inputs, {} outputs, {} kernels, {} buffers, {} steps",
        p.name,
        p.inputs.len(),
        p.outputs.len(),
        p.kernels.len(),
        p.buffers.len(),
        p.steps.len()
    ));
    for port in &p.inputs {
        line(format!("  input {}: {}", port.name, port.ty));
    }
    for port in &p.outputs {
        line(format!("  output {}: {}", port.name, port.ty));
    }
    if !p.bounds.is_empty() {
        let b: Vec<String> = p
            .bounds
            .iter()
            .map(|(s, n)| format!("{}<={n}", s.name()))
            .collect();
        line(format!("  bounds: {}", b.join(", ")));
    }
    line("steps:".into());
    for (i, step) in p.steps.iter().enumerate() {
        line(step_line(p, i, step));
    }
    for l in placement_lines(p, false) {
        line(l);
    }
    line(format!("buffers: {}", p.buffers.len()));
    for i in 0..p.buffers.len() {
        line(buffer_line(p, i));
    }
    line(format!(
        "weights: {} tensors, {} bytes",
        p.weights.len(),
        model::weight_bytes(p)
    ));
    for l in memory_lines(p) {
        line(l);
    }
    out
}

/// For a program using a device besides the CPU: kernels per device, each kernel left on
/// the CPU with the reason it could not go to the GPU, and the copies between devices.
///
/// ```text
/// placement: 7 kernels on vulkan, 2 on cpu
///   k3 `k3_reduce` stays on cpu: op `reduce` (node `r`) is not generated for Vulkan yet
///   cross-device copies: 2
/// ```
fn placement_lines(p: &Program, always: bool) -> Vec<String> {
    if !always && !model::uses_vulkan(p) {
        return Vec::new();
    }
    let on_vulkan = p.kernels.iter().filter(|k| k.device == "vulkan").count();
    let mut lines = vec![format!(
        "placement: {on_vulkan} kernels on vulkan, {} on cpu",
        p.kernels.len() - on_vulkan
    )];
    for (i, k) in p.kernels.iter().enumerate() {
        if k.device != "vulkan" {
            let why = model::vulkan_refusal(p, i)
                .unwrap_or_else(|| "placed there by the compiler".into());
            lines.push(format!("  k{i} `{}` stays on {}: {why}", k.name, k.device));
        }
    }
    let crossing = p
        .steps
        .iter()
        .filter(|s| match s {
            Step::Copy { src, dst } => buffer_device(p, *src) != buffer_device(p, *dst),
            Step::Dispatch { .. } => false,
        })
        .count();
    lines.push(format!("  cross-device copies: {crossing}"));
    lines
}

/// The device a buffer lives on: its arena's, or that of the first step touching it (the
/// runtime's rule for inputs, outputs and weights).
fn buffer_device(p: &Program, b: usize) -> String {
    if let Storage::Arena { arena, .. } = p.buffers[b].storage {
        return p.arenas[arena].device.clone();
    }
    if matches!(p.buffers[b].storage, Storage::Input(_)) {
        // An input lives where the first kernel reading it runs.
        for step in &p.steps {
            if let Step::Dispatch { kernel, args, .. } = step {
                if args.contains(&b) {
                    return p.kernels[*kernel].device.clone();
                }
            }
        }
    }
    for step in &p.steps {
        match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } if args.contains(&b) || results.contains(&Some(b)) => {
                return p.kernels[*kernel].device.clone()
            }
            Step::Copy { src, dst } if *dst == b => return buffer_device(p, *src),
            // First touched as a copy's source: an input or weight, on the host.
            Step::Copy { src, .. } if *src == b => return "cpu".into(),
            _ => {}
        }
    }
    "cpu".into()
}

/// `  3 k2 `attn_scores` contraction on cpu: matmul, binary.mul (b4, b7) -> (b8)` or
/// `  5 copy b8 -> b9`.
fn step_line(p: &Program, i: usize, step: &Step) -> String {
    let buffers = |bs: &mut dyn Iterator<Item = Option<usize>>| -> String {
        bs.map(|b| b.map_or("_".to_string(), |b| format!("b{b}")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match step {
        Step::Dispatch {
            kernel,
            args,
            results,
        } => {
            let k = &p.kernels[*kernel];
            let line = format!(
                "  {i:>4} k{kernel} `{}` {} on {}: {} ({}) -> ({})",
                k.name,
                k.kind.word(),
                k.device,
                fused_ops(k).join(", "),
                buffers(&mut args.iter().map(|&b| Some(b))),
                buffers(&mut results.iter().copied())
            );
            if p.is_placed_view(step) {
                format!("{line} [a view: placed over its operand, never dispatched]")
            } else {
                line
            }
        }
        Step::Copy { src, dst } => {
            let (from, to) = (buffer_device(p, *src), buffer_device(p, *dst));
            if from == to {
                format!("  {i:>4} copy b{src} -> b{dst}")
            } else {
                format!("  {i:>4} copy b{src} -> b{dst} ({from} -> {to})")
            }
        }
    }
}

/// The ops of a kernel's body in order, with their kind where one op name covers several
/// (`binary.add`, `unary.gelu`, `reduce.mean`).
pub fn fused_ops(k: &Kernel) -> Vec<String> {
    k.body
        .nodes
        .iter()
        .map(|n| {
            let sub =
                n.op.attrs()
                    .into_iter()
                    .find_map(|(name, v)| match (name, v) {
                        ("op" | "kind" | "mode", AttrValue::Word(w)) => Some(w),
                        _ => None,
                    });
            match sub {
                Some(w) => format!("{}.{w}", n.op.name()),
                None => n.op.name().to_string(),
            }
        })
        .collect()
}

/// `  b3 `t7`: f32[batch, seq, 32] arena a0 offset 1024`.
fn buffer_line(p: &Program, i: usize) -> String {
    let b = &p.buffers[i];
    let storage = match &b.storage {
        Storage::Input(k) => format!("input {k}"),
        Storage::Output(k) => format!("output {k}"),
        Storage::Weight(w) => format!(
            "weight w{w} ({} bytes)",
            p.weights.get(*w).map_or(0, |c| c.bytes.len())
        ),
        Storage::Arena {
            arena,
            offset: Some(o),
        } => format!("arena a{arena} offset {o}"),
        Storage::Arena {
            arena,
            offset: None,
        } => format!("arena a{arena} (placed per call)"),
        Storage::Dynamic => "dynamic (sized by its producer)".to_string(),
        Storage::State(s) => match p.state_bytes(*s) {
            Some(bytes) => format!("state s{s} ({bytes} bytes at the bounds)"),
            None => format!("state s{s} (unbounded: declare a bound for its dims)"),
        },
    };
    format!("  b{i} `{}`: {} {storage}", b.name, b.ty)
}

/// Per device with an arena, in order of first appearance:
/// `memory DEVICE: arena A bytes, lower bound L bytes, ratio R` from the planned arenas,
/// or `memory DEVICE: arena unplanned (sized per call)` when any of its arenas is planned per
/// call. The compiler's planner fills these fields; this only adds them up.
pub fn memory_lines(p: &Program) -> Vec<String> {
    let mut devices: Vec<&str> = Vec::new();
    for a in &p.arenas {
        if !devices.contains(&a.device.as_str()) {
            devices.push(&a.device);
        }
    }
    let mut lines: Vec<String> = devices
        .into_iter()
        .map(|device| {
            let planned: Option<Vec<(u64, u64)>> = p
                .arenas
                .iter()
                .filter(|a| a.device == device)
                .map(|a| Some((a.size?, a.lower_bound?)))
                .collect();
            match planned {
                Some(sizes) => {
                    let size: u64 = sizes.iter().map(|s| s.0).sum();
                    let lower: u64 = sizes.iter().map(|s| s.1).sum();
                    format!(
                        "memory {device}: arena {size} bytes, lower bound {lower} bytes, ratio {}",
                        ratio(size, lower)
                    )
                }
                None => format!("memory {device}: arena unplanned (sized per call)"),
            }
        })
        .collect();
    if !p.states.is_empty() {
        let sizes: Option<Vec<u64>> = (0..p.states.len()).map(|s| p.state_bytes(s)).collect();
        lines.push(match sizes {
            Some(sizes) => format!(
                "memory state: {} bytes in {} states (kept across calls: KV caches), at the bounds",
                sizes.iter().sum::<u64>(),
                p.states.len()
            ),
            None => format!(
                "memory state: {} states, unbounded (declare a bound for their dims)",
                p.states.len()
            ),
        });
    }
    lines
}

/// `size / lower` with two decimals (`1.00` for an empty arena).
fn ratio(size: u64, lower: u64) -> String {
    if lower == 0 {
        return if size == 0 {
            "1.00".into()
        } else {
            "inf".into()
        };
    }
    format!("{:.2}", size as f64 / lower as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::program::Arena;

    fn arena(device: &str, size: Option<u64>, lower: Option<u64>) -> Arena {
        Arena {
            device: device.into(),
            memory: "host".into(),
            size,
            lower_bound: lower,
        }
    }

    #[test]
    fn memory_lines_sum_per_device() {
        let p = Program {
            arenas: vec![
                arena("cpu", Some(3000), Some(2000)),
                arena("vulkan", None, None),
                arena("cpu", Some(1000), Some(1000)),
            ],
            ..Program::default()
        };
        assert_eq!(
            memory_lines(&p),
            vec![
                "memory cpu: arena 4000 bytes, lower bound 3000 bytes, ratio 1.33",
                "memory vulkan: arena unplanned (sized per call)",
            ]
        );
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(0, 0), "1.00");
        assert_eq!(ratio(150, 100), "1.50");
        assert_eq!(ratio(1, 0), "inf");
    }
}
