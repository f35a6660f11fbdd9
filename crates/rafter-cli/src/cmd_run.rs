//! `rafter run`: one call of a model on the CPU, or on the Vulkan GPU with CPU fallback.
//!
//! The model is an artifact (detected by its magic bytes), run by the runtime; or an ONNX
//! model, run by the reference executor, or (`--compiled`, `--trace`) compiled in memory
//! and run by the runtime. Inputs, outputs and flags are the same on every path.

use crate::dims::{self, DimSpec};
use crate::model::{self, FileKind};
use crate::progress::Steps;
use crate::rss;
use anyhow::{anyhow, bail, Context, Result};
use rafter_compiler::Target;
use rafter_ir::program::{Port, Program};
use rafter_ir::{DType, Graph};
use rafter_reference::npy;
use rafter_reference::{Bindings, Tensor};
use rafter_runtime::{ChromeTrace, Session, SessionOptions};
use rafter_runtime_cpu::{from_reference, to_reference, CpuDeviceOptions};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The built-in demo model: a 2-layer BERT-like encoder exported from PyTorch with dynamic
/// `batch` and `seq` (see tests/fixtures/bert_tiny/README.md).
const DEMO_MODEL: &[u8] = include_bytes!("../../../tests/fixtures/bert_tiny/model.onnx");

/// How long one call may run before `run` gives up on it: far beyond any model this CLI
/// runs, so it only ends a call the runtime failed to complete.
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(clap::Args)]
pub struct RunArgs {
    /// The model: an ONNX file or a compiled artifact (told apart by content, not by
    /// extension). Omit it to run the built-in demo encoder.
    model: Option<PathBuf>,
    /// Device to run on: `cpu`, or `vulkan` (an ONNX model is compiled for `--target vulkan`
    /// and run on the runtime). An artifact runs on the devices it was compiled for.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// An input as NAME=FILE.npy; repeat for several. Inputs not given are random.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// A symbolic dim's value as SYMBOL=N (e.g. --dim seq=128), for random inputs. With
    /// --compiled, SYMBOL<=N declares a bound to compile for.
    #[arg(long = "dim", value_name = "SYMBOL=N")]
    dims: Vec<String>,
    /// Seed of the random inputs (default: from the clock; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write each output to DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Run an ONNX model through the compiler and the runtime (in memory) instead of the
    /// reference executor. Artifacts always run on the runtime.
    #[arg(long)]
    compiled: bool,
    /// Write a Chrome trace of the call (one track per device queue, one slice per
    /// dispatch) to FILE; open it in ui.perfetto.dev. Implies --compiled.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print the process's resident memory (anonymous and file-backed) after loading the
    /// model and after the call: an artifact's weights are mapped, so they appear as
    /// file-backed pages, not as copies.
    #[arg(long)]
    memory_report: bool,
}

/// What runs the call.
pub(crate) enum Executor {
    /// The reference executor over the imported graph.
    Reference(Graph),
    /// The runtime over a compiled program, with its non-CPU executable sections.
    Runtime(Program, Vec<(String, bytes::Bytes)>),
}

impl Executor {
    fn inputs(&self) -> Vec<Port> {
        match self {
            Executor::Reference(g) => ports(g, &g.inputs),
            Executor::Runtime(p, _) => p.inputs.clone(),
        }
    }

    fn output_names(&self) -> Vec<String> {
        match self {
            Executor::Reference(g) => ports(g, &g.outputs).into_iter().map(|p| p.name).collect(),
            Executor::Runtime(p, _) => p.outputs.iter().map(|o| o.name.clone()).collect(),
        }
    }
}

fn ports(g: &Graph, ids: &[rafter_ir::ValueId]) -> Vec<Port> {
    ids.iter()
        .map(|&id| Port {
            name: g.value(id).name.clone(),
            ty: g.value(id).ty.clone(),
        })
        .collect()
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let target = model::parse_target(&args.device)
        .map_err(|_| anyhow!("unknown device `{}` (available: cpu, vulkan)", args.device))?;
    let mut dims = Vec::new();
    let source = match &args.model {
        Some(path) => Source::File(path.clone()),
        None => {
            println!(
                "no model given: running the built-in demo encoder (tests/fixtures/bert_tiny)"
            );
            dims.extend(["batch=1".to_string(), "seq=8".to_string()]);
            Source::Demo
        }
    };
    dims.extend(args.dims.iter().cloned());
    let specs = dims::parse_dims(&dims)?;
    let use_runtime = args.compiled || args.trace.is_some() || !target.is_cpu_only();
    let executor = load(&source, use_runtime, target.clone(), &specs, &args.inputs)?;
    if args.memory_report {
        rss::report("after load");
    }
    let values: Vec<DimSpec> = specs.into_iter().filter(|s| !s.is_bound).collect();
    let mut bindings = Bindings::with(dims::values_only(&values)?);
    let inputs = gather_inputs(&executor.inputs(), &args.inputs, &mut bindings, args.seed)?;
    let names = executor.output_names();
    let outputs = match executor {
        Executor::Reference(graph) => {
            let outputs = run_reference(&graph, inputs, &mut bindings)?;
            if args.memory_report {
                rss::report("after call");
            }
            outputs
        }
        Executor::Runtime(program, executables) => run_runtime(
            program,
            &executables,
            inputs,
            args.trace
                .as_deref()
                .map(|p| (p, &target, bindings.as_map())),
            args.memory_report,
        )?,
    };
    write_outputs(&names, &outputs, args.output_dir.as_deref())?;
    Ok(ExitCode::SUCCESS)
}

/// Where the model comes from.
pub(crate) enum Source {
    File(PathBuf),
    Demo,
}

/// The executor for `source`: an artifact's program; an ONNX model's graph, or its program
/// compiled now for `target` when `use_runtime` (with the bounds among `specs`).
pub(crate) fn load(
    source: &Source,
    use_runtime: bool,
    target: Target,
    specs: &[DimSpec],
    input_files: &[String],
) -> Result<Executor> {
    let bound_specs: Vec<DimSpec> = specs.iter().filter(|s| s.is_bound).cloned().collect();
    let graph = match source {
        Source::File(path) if model::file_kind(path)? == FileKind::Artifact => {
            if let Some(b) = bound_specs.first() {
                bail!(
                    "--dim {}<={}: an artifact's bounds were fixed when it was compiled",
                    b.symbol.name(),
                    b.value
                );
            }
            let artifact = model::open_artifact(path)?;
            let executables = model::artifact_executables(&artifact);
            let program = artifact.into_program();
            let known = dims::model_symbols(program.inputs.iter().map(|p| &p.ty));
            dims::check_symbols(specs, &[], &known)?;
            return Ok(Executor::Runtime(program, executables));
        }
        Source::File(path) => rafter_import::import_onnx_file(path)?.graph,
        Source::Demo => {
            rafter_import::import_onnx_bytes(bytes_static(), None, "built-in demo model")?.graph
        }
    };
    dims::check_symbols(
        specs,
        &[],
        &dims::model_symbols(graph.values.iter().map(|v| &v.ty)),
    )?;
    if !use_runtime {
        dims::values_only(&bound_specs)?;
        return Ok(Executor::Reference(graph));
    }
    let target = dims::with_nominal_sizes(target, &graph, specs, input_files)?;
    let steps = Steps::new(model::COMPILER_STAGES);
    let compiled = model::compile(&graph, target, dims::bounds(&bound_specs), &steps)?;
    let executables = compiled.executables();
    let program = compiled.program;
    let elapsed = steps.finish();
    println!(
        "compiled in {} ({})",
        model::human_time(elapsed),
        model::kernel_count(&program)
    );
    Ok(Executor::Runtime(program, executables))
}

fn run_reference(
    graph: &Graph,
    inputs: Vec<Tensor>,
    bindings: &mut Bindings,
) -> Result<Vec<Tensor>> {
    // Where the call's dims exceed what the model can reach, say so by the node that
    // limits them (the executor alone would report the first broken shape it meets).
    let mut values: Vec<(rafter_ir::Symbol, i64)> = bindings.as_map().into_iter().collect();
    values.sort_by(|a, b| a.0.name().cmp(b.0.name()));
    if let Err(e) = rafter_ir::check_at_values(graph, &values.iter().cloned().collect()) {
        let list: Vec<String> = values
            .iter()
            .map(|(s, v)| format!("{}={v}", s.name()))
            .collect();
        bail!(
            "the model does not hold together at {}: {e}",
            list.join(", ")
        );
    }
    let start = Instant::now();
    let outputs = rafter_reference::run_with(graph, inputs, bindings)?;
    println!(
        "ran in {} on cpu (reference executor)",
        model::human_time(start.elapsed())
    );
    Ok(outputs)
}

/// One call on the runtime (the CPU device, and the Vulkan device when the program uses it),
/// traced into `trace` when given: the trace file, the target the program was compiled
/// for and the symbols' values, for the cost model's estimates set against the trace.
fn run_runtime(
    program: Program,
    executables: &[(String, bytes::Bytes)],
    inputs: Vec<Tensor>,
    trace: Option<(
        &Path,
        &rafter_compiler::Target,
        HashMap<rafter_ir::Symbol, i64>,
    )>,
    memory_report: bool,
) -> Result<Vec<Tensor>> {
    let sink = trace.as_ref().map(|_| Arc::new(ChromeTrace::new()));
    let devices = model::devices_for(
        &program,
        CpuDeviceOptions {
            trace_sink: sink.clone().map(|s| s as Arc<dyn rafter_hal::TraceSink>),
            ..CpuDeviceOptions::default()
        },
    )?;
    let kernels = program.kernels.len();
    let placement = model::placement_summary(&program);
    let options = model::with_executables(SessionOptions::new(), executables);
    let uses_vulkan = crate::model::uses_vulkan(&program);
    let opened = Instant::now();
    let session = Session::with_options(program, &devices, options)?;
    if uses_vulkan {
        crate::model::note_slow_open(opened.elapsed());
    }
    if memory_report {
        rss::report("after session open");
    }
    let inputs = runtime_tensors(&inputs)?;
    let start = Instant::now();
    let outputs = session.run(inputs, CALL_TIMEOUT)?;
    let took = start.elapsed();
    if memory_report {
        rss::report("after call");
    }
    println!(
        "ran in {} on {placement} (runtime, {kernels} kernels)",
        model::human_time(took)
    );
    if let (Some((path, target, values)), Some(sink)) = (trace, sink) {
        sink.write(path)?;
        let dispatches = sink
            .events()
            .iter()
            .filter(|e| e.kind == rafter_hal::TraceKind::Dispatch)
            .count();
        println!(
            "wrote trace {} ({dispatches} dispatch slices)",
            path.display()
        );
        let events = sink.events();
        for l in crate::estimate::device_lines(&events) {
            println!("{l}");
        }
        // One call: every handoff is within it.
        if let Some(l) = crate::estimate::handoff_line(&events, &[]) {
            println!("{l}");
        }
        let table = crate::estimate::estimate_table(
            session.program(),
            target,
            &values,
            &events,
            &[(start, start + took)],
            took.as_secs_f64(),
        );
        for l in table {
            println!("{l}");
        }
    }
    outputs
        .iter()
        .map(|t| to_reference(t).map_err(anyhow::Error::msg))
        .collect()
}

/// The inputs as the runtime's tensors (the command line reads and makes them as the
/// reference executor's, which also writes `.npy` files).
pub(crate) fn runtime_tensors(inputs: &[Tensor]) -> Result<Vec<rafter_runtime::Tensor>> {
    inputs
        .iter()
        .map(|t| from_reference(t).map_err(anyhow::Error::msg))
        .collect()
}

/// Prints each output's summary, and writes it to `dir/NAME.npy` when `dir` is given.
fn write_outputs(names: &[String], outputs: &[Tensor], dir: Option<&Path>) -> Result<()> {
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (name, t) in names.iter().zip(outputs) {
        println!("output {name}: {}", summary(t));
        if let Some(dir) = dir {
            let path = dir.join(format!("{}.npy", file_stem(name)));
            npy::write_npy(&path, t).with_context(|| format!("writing {}", path.display()))?;
            println!("  wrote {}", path.display());
        }
    }
    Ok(())
}

fn bytes_static() -> rafter_onnx_proto::Bytes {
    rafter_onnx_proto::Bytes::from_static(DEMO_MODEL)
}

/// An output name as a file stem: every character outside `[A-Za-z0-9._-]` becomes `_`.
pub fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The model's inputs in order: from files where given (binding their symbols first), the
/// rest random with shapes from the bound symbols.
pub(crate) fn gather_inputs(
    ports: &[Port],
    given: &[String],
    bindings: &mut Bindings,
    seed: Option<u64>,
) -> Result<Vec<Tensor>> {
    let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
    let mut slots: Vec<Option<Tensor>> = vec![None; names.len()];
    for spec in given {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| anyhow!("--input `{spec}`: expected NAME=FILE.npy"))?;
        let pos = names.iter().position(|n| *n == name).ok_or_else(|| {
            anyhow!(
                "--input `{spec}`: the model has no input `{name}` (inputs: {})",
                names.join(", ")
            )
        })?;
        let t = npy::read_npy(Path::new(file))?;
        let ty = &ports[pos].ty;
        bindings
            .check(ty, &t, &format!("input `{name}` ({file})"))
            .map_err(anyhow::Error::msg)?;
        slots[pos] = Some(t);
    }
    if slots.iter().any(Option::is_none) {
        let seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        println!("random inputs with seed {seed} (repeat with --seed {seed})");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for (pos, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = Some(random_input(&ports[pos], bindings, &mut rng)?);
            }
        }
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("filled above"))
        .collect())
}

/// Random inputs for every port from `seed`, quietly: for calibration programs, whose
/// inputs no user repeats (`gather_inputs` prints the seed of a run's).
pub(crate) fn random_inputs(ports: &[Port], bindings: &Bindings, seed: u64) -> Result<Vec<Tensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    ports
        .iter()
        .map(|p| random_input(p, bindings, &mut rng))
        .collect()
}

fn random_input(v: &Port, bindings: &Bindings, rng: &mut impl Rng) -> Result<Tensor> {
    let env = bindings.as_map();
    let dims: Vec<usize> = v
        .ty
        .dims
        .iter()
        .map(|d| {
            d.eval(&env).map(|n| n as usize).map_err(|_| {
                let missing: Vec<String> = d.symbols().iter().filter(|s| bindings.get(s).is_none()).map(|s| format!("--dim {}=N", s.name())).collect();
                anyhow!("input `{}` has symbolic dim `{d}`: give its value with {} or pass the input with --input", v.name, missing.join(" "))
            })
        })
        .collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let dtype = v.ty.dtype;
    let t = if dtype.is_float() {
        let vals: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let f32s = Tensor::f32s(&dims, vals.iter().map(|&x| x as f32).collect());
        cast_f32(f32s, dtype)
    } else if dtype == DType::Bool {
        let bytes: Vec<u8> = (0..n).map(|_| rng.gen_range(0..2u8)).collect();
        Tensor::from_le_bytes(DType::Bool, &dims, &bytes)?
    } else {
        // Small non-negative integers: valid as token ids, indices and masks alike.
        let vals: Vec<i64> = (0..n).map(|_| rng.gen_range(0..10)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|&x| int_bytes(x, dtype)).collect();
        Tensor::from_le_bytes(dtype, &dims, &bytes)?
    };
    Ok(t)
}

fn int_bytes(x: i64, d: DType) -> Vec<u8> {
    x.to_le_bytes()[..d.size_of()].to_vec()
}

fn cast_f32(t: Tensor, d: DType) -> Tensor {
    let Tensor::F32(a) = t else {
        unreachable!("built as f32")
    };
    match d {
        DType::F64 => Tensor::F64(a.mapv(|x| x as f64)),
        DType::F16 => Tensor::F16(a.mapv(half::f16::from_f32)),
        DType::BF16 => Tensor::BF16(a.mapv(half::bf16::from_f32)),
        _ => Tensor::F32(a),
    }
}

/// `f32[1, 8, 32] mean 0.0123 min -1.2 max 2.3` (numeric summary of any dtype).
fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let shape = t
        .shape()
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if v.is_empty() {
        return format!("{}[{shape}] (empty)", t.dtype());
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{}[{shape}] mean {mean:.6} min {min:.6} max {max:.6}",
        t.dtype()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_file_names() {
        assert_eq!(file_stem("last_hidden_state"), "last_hidden_state");
        assert_eq!(file_stem("onnx::Add/12 x"), "onnx__Add_12_x");
    }
}
