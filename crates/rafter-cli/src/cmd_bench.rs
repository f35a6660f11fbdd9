//! `rafter bench`: times calls of a model on the runtime, in-process, after warm-up.
//!
//! Each timed call is one `Session::run` (submit, then wait for the outputs), so the time
//! includes everything a caller waits for but not the inputs' preparation: the inputs are
//! cloned before the clock starts. The last line is machine-readable and fixed:
//! `bench: median M ms, p10 A ms, p90 B ms, peak RSS R MB`, RSS being the whole process's
//! peak (weights included), from the kernel's high-water mark.

use crate::cmd_run::{gather_inputs, load, runtime_tensors, Executor, Source};
use crate::dims::{self, DimSpec};
use crate::estimate::{median, quantile};
use crate::host_load::{report_since, CpuTimes};
use crate::rss::Rss;
use anyhow::{bail, Result};
use rafter_reference::Bindings;
use rafter_runtime::{ChromeTrace, Session, SessionOptions};
use rafter_runtime_cpu::CpuDeviceOptions;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest one benchmarked call may take before it is reported as hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The model: an ONNX file (compiled in memory first) or a compiled artifact.
    model: PathBuf,
    /// Device to run on: `cpu`, or `vulkan` (an ONNX model is compiled for `--target
    /// vulkan`). An artifact runs on the devices it was compiled for.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Worker threads of the CPU device, and threads of one GEMM (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Untimed calls before timing.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed calls.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// An input as NAME=FILE.npy; repeat for several. Inputs not given are random.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// A symbolic dim's value (SYMBOL=N) for random inputs, or a bound to compile an ONNX
    /// model for (SYMBOL<=N).
    #[arg(long = "dim", value_name = "SYMBOL=N")]
    dims: Vec<String>,
    /// Seed of the random inputs (default 0, so runs are comparable).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run every CPU kernel on the reference executor (no fast GEMM path), to measure
    /// what the fast kernels buy.
    #[arg(long)]
    reference_kernels: bool,
    /// Write a Chrome trace of the timed calls to FILE, and print each device's busy time
    /// and idle fraction while calls were in flight. The timed calls are then traced: on a
    /// GPU, timestamps around every dispatch make them slower than untraced calls.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print the cost model's estimate of a call next to the measured median, per kernel
    /// class, per device and per partition (the call timed untraced unless `--trace`;
    /// the breakdown from each kernel's median over as many calls of a traced session).
    #[arg(long)]
    estimate: bool,
    /// Calls kept in flight: a stream of calls, each submitted while up to N-1 earlier
    /// ones still run, so a model split over devices overlaps calls. Prints the stream's
    /// throughput and per-call latency percentiles.
    #[arg(long, value_name = "N", default_value_t = 1)]
    in_flight: usize,
    #[command(flatten)]
    placement: crate::placement::PlacementArgs,
}

pub fn bench(args: BenchArgs) -> Result<ExitCode> {
    let target = crate::model::parse_target(&args.device).map_err(|_| {
        anyhow::anyhow!(
            "unknown device `{}` (available: cpu, vulkan, auto, a set such as cpu,vulkan)",
            args.device
        )
    })?;
    let target = args.placement.apply(target)?;
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if args.in_flight == 0 {
        bail!("--in-flight must be at least 1");
    }
    let specs = dims::parse_dims(&args.dims)?;
    if args.in_flight > 1
        && target.placement().objective == rafter_opt::partition::Objective::Throughput
        && target.backend("vulkan").is_some()
    {
        return bench_spread(&args, &specs);
    }
    let Executor::Runtime(program, executables) = load(
        &Source::File(args.model.clone()),
        true,
        target.clone(),
        &specs,
        &args.inputs,
    )?
    else {
        bail!("internal error: bench needs a compiled program");
    };
    let values: Vec<DimSpec> = specs.into_iter().filter(|s| !s.is_bound).collect();
    let mut bindings = Bindings::with(dims::values_only(&values)?);
    let inputs = runtime_tensors(&gather_inputs(
        &program.inputs,
        &args.inputs,
        &mut bindings,
        Some(args.seed),
    )?)?;

    // The timed calls are traced only for `--trace`: a traced Vulkan command buffer
    // writes timestamps around every dispatch, which slowed calls by half on an H200.
    // `--estimate` alone traces a second session's calls for its breakdown and measures
    // the call itself untraced.
    let (session, sink) = open_session(&args, &program, &executables, args.trace.is_some())?;
    for _ in 0..args.warmup {
        session.run(inputs.clone(), CALL_TIMEOUT)?;
    }
    if let Some(s) = &sink {
        s.clear();
    }
    let load_from = CpuTimes::now();
    if args.in_flight > 1 {
        let stream = run_stream(&session, &inputs, args.iters, args.in_flight)?;
        report_since(load_from, "timing");
        // Calls overlap: no window tells one's work from another's.
        report_trace(&args, &sink, &[])?;
        if args.estimate {
            eprintln!("estimate: not printed for a stream of calls (--in-flight > 1)");
        }
        println!("{}", stream.line(args.in_flight));
        return Ok(ExitCode::SUCCESS);
    }
    let timed = time_calls(&session, &inputs, args.iters)?;
    report_since(load_from, "timing");
    // Before `--estimate`'s traced session adds its own memory.
    let peak_kib = Rss::now().map(|r| r.peak_kib);
    report_trace(&args, &sink, &timed.windows)?;
    if args.estimate {
        // The breakdown needs a traced call: the timed ones where `--trace` traced them,
        // else as many calls of a traced session.
        let (events, windows) = match &sink {
            Some(sink) => (sink.events(), timed.windows.clone()),
            None => {
                let (traced, sink) = open_session(&args, &program, &executables, true)?;
                let sink = sink.expect("a traced session has a sink");
                for _ in 0..args.warmup {
                    traced.run(inputs.clone(), CALL_TIMEOUT)?;
                }
                sink.clear();
                let t = time_calls(&traced, &inputs, args.iters)?;
                (sink.events(), t.windows)
            }
        };
        // Medians: each kernel's over the traced calls, the call's over the timed ones.
        let lines = crate::estimate::estimate_table(
            session.program(),
            &target,
            &bindings.as_map(),
            &events,
            &windows,
            median(timed.times_ms.clone()) * 1e-3,
        );
        for l in lines {
            println!("{l}");
        }
    }
    let n = session.native_stats();
    eprintln!(
        "native: {} of {} kernels, {} dispatches, {} fallbacks, {} misaligned copies",
        n.kernels,
        session.program().kernels.len(),
        n.dispatches,
        n.fallbacks,
        n.misaligned_copies
    );
    let mut submits = timed.submits_ms;
    submits.sort_by(f64::total_cmp);
    eprintln!(
        "host: submit median {:.3} ms of the call (planning, allocation, recording)",
        quantile(&submits, 0.5)
    );
    println!("{}", summary_line(&timed.times_ms, peak_kib));
    Ok(ExitCode::SUCCESS)
}

/// A session of `program` on the devices it was compiled for; with `traced`, every
/// device reports its work to the returned trace.
fn open_session(
    args: &BenchArgs,
    program: &rafter_ir::program::Program,
    executables: &[(String, bytes::Bytes)],
    traced: bool,
) -> Result<(Session, Option<Arc<ChromeTrace>>)> {
    let sink = traced.then(|| Arc::new(ChromeTrace::new()));
    let devices = crate::model::devices_for(
        program,
        CpuDeviceOptions {
            worker_threads: args.threads,
            trace_sink: sink.clone().map(|s| s as Arc<dyn rafter_hal::TraceSink>),
            ..CpuDeviceOptions::default()
        },
    )?;
    let mut options = crate::model::with_executables(
        SessionOptions::new().kernel_threads(args.threads),
        executables,
    );
    if args.reference_kernels {
        options = options.reference_kernels();
    }
    let uses_vulkan = crate::model::uses_vulkan(program);
    let opened = Instant::now();
    let session = Session::with_options(program.clone(), &devices, options)?;
    if uses_vulkan {
        crate::model::note_slow_open(opened.elapsed());
    }
    Ok((session, sink))
}

/// What [`time_calls`] measured.
struct TimedCalls {
    /// Each call's wall time, ms.
    times_ms: Vec<f64>,
    /// Each call's window, for the trace's handoffs (`estimate::handoffs`).
    windows: Vec<(Instant, Instant)>,
    /// Time spent in `submit` (planning, allocation, recording, submission: the host's
    /// share of a call before any device work can finish), ms, to tell host overhead
    /// apart.
    submits_ms: Vec<f64>,
}

/// Runs `iters` calls one after another (`iters` >= 1), each timed.
fn time_calls(
    session: &Session,
    inputs: &[rafter_runtime::Tensor],
    iters: usize,
) -> Result<TimedCalls> {
    let mut timed = TimedCalls {
        times_ms: Vec::with_capacity(iters),
        windows: Vec::with_capacity(iters),
        submits_ms: Vec::with_capacity(iters),
    };
    for _ in 0..iters {
        let call_inputs = inputs.to_vec();
        let start = Instant::now();
        let call = session.submit_to_wait(call_inputs)?;
        timed.submits_ms.push(start.elapsed().as_secs_f64() * 1e3);
        call.wait(CALL_TIMEOUT)?;
        let end = Instant::now();
        timed.times_ms.push((end - start).as_secs_f64() * 1e3);
        timed.windows.push((start, end));
    }
    Ok(timed)
}

/// Threads of the CPU's session in a spread when `--threads` is left at 0: every core
/// but one, which the GPU's host threads (its submissions, its monitor) need while the
/// CPU runs calls. With every core running CPU kernels both devices slowed: MobileNetV2
/// on the H200 machine's 16 cores spread at 2,276-2,300 calls/s with 16 kernel threads,
/// 2,342-2,446 with 15 or 14 (ResNet-50 557-573, 566-579).
fn spread_cpu_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_sub(1)
        .max(1)
}

/// How far (scaled by the largest magnitude) a spread call's outputs may be from the CPU
/// run's: the devices round differently (the Vulkan f16 kernels most).
const SPREAD_TOLERANCE: f64 = 2e-2;

/// `--in-flight N --objective throughput` on a target with several devices: whole calls
/// spread over one session per device (see [`crate::spread`]).
fn bench_spread(args: &BenchArgs, specs: &[DimSpec]) -> Result<ExitCode> {
    let mut sessions = Vec::new();
    let mut call_s = Vec::new();
    let mut reference = None;
    let mut call_inputs = None;
    for device in ["cpu", "vulkan"] {
        let target = crate::model::parse_target(device)?;
        let Executor::Runtime(program, executables) = load(
            &Source::File(args.model.clone()),
            true,
            target,
            specs,
            &args.inputs,
        )?
        else {
            bail!("internal error: bench needs a compiled program");
        };
        if call_inputs.is_none() {
            let values: Vec<DimSpec> = specs.iter().filter(|s| !s.is_bound).cloned().collect();
            let mut bindings = Bindings::with(dims::values_only(&values)?);
            call_inputs = Some(runtime_tensors(&gather_inputs(
                &program.inputs,
                &args.inputs,
                &mut bindings,
                Some(args.seed),
            )?)?);
        }
        let inputs = call_inputs.as_ref().expect("set above");
        let threads = match (device, args.threads) {
            ("cpu", 0) => spread_cpu_threads(),
            (_, t) => t,
        };
        let devices = crate::model::devices_for(
            &program,
            CpuDeviceOptions {
                worker_threads: threads,
                ..CpuDeviceOptions::default()
            },
        )?;
        let options = crate::model::with_executables(
            SessionOptions::new().kernel_threads(threads),
            &executables,
        );
        let session = Session::with_options(program, &devices, options)?;
        let mut out = None;
        // The fastest warm-up call: this device's time for one call alone, which the
        // spread weighs against the other devices' (spread.rs, `admit`).
        let mut fastest = f64::INFINITY;
        for _ in 0..args.warmup.max(1) {
            let at = Instant::now();
            out = Some(session.run(inputs.clone(), CALL_TIMEOUT)?);
            fastest = fastest.min(at.elapsed().as_secs_f64());
        }
        if reference.is_none() {
            reference = out;
        }
        call_s.push(fastest);
        sessions.push((device.to_string(), session));
    }
    let (Some(inputs), Some(reference)) = (call_inputs, reference) else {
        bail!("internal error: no device ran the model");
    };
    let trial = crate::spread::trial(
        &sessions,
        &call_s,
        &inputs,
        args.in_flight,
        &reference,
        SPREAD_TOLERANCE,
        args.iters,
    )?;
    let names: Vec<&str> = sessions.iter().map(|(n, _)| n.as_str()).collect();
    println!("{}", trial.line(&names));
    let chosen = match trial.choice() {
        None => 0..sessions.len(),
        Some(d) => d..d + 1,
    };
    let load_from = CpuTimes::now();
    let spread = crate::spread::run_spread(
        &sessions[chosen.clone()],
        &call_s[chosen],
        &inputs,
        args.iters,
        args.in_flight,
        &reference,
        SPREAD_TOLERANCE,
    )?;
    report_since(load_from, "timing");
    for l in spread.lines(args.in_flight) {
        println!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the trace (when asked) and prints each device's busy time and idle fraction,
/// and the handoffs between devices within the `calls` windows (see
/// [`crate::estimate::handoffs`]).
fn report_trace(
    args: &BenchArgs,
    sink: &Option<Arc<ChromeTrace>>,
    calls: &[(Instant, Instant)],
) -> Result<()> {
    let (Some(path), Some(sink)) = (&args.trace, sink) else {
        return Ok(());
    };
    sink.write(path)?;
    println!("wrote trace {}", path.display());
    for l in crate::estimate::device_lines(&sink.events()) {
        println!("{l}");
    }
    if let Some(l) = crate::estimate::handoff_line(&sink.events(), calls) {
        println!("{l}");
    }
    Ok(())
}

/// A stream of calls' outcome: wall time of the whole stream, per-call latencies (ms).
struct Stream {
    wall_s: f64,
    latencies_ms: Vec<f64>,
}

impl Stream {
    /// `stream: N calls, K in flight, T calls/s, latency median M ms, p10 A ms, p90 B ms,
    /// p99 C ms` (machine-readable, fixed).
    fn line(&self, in_flight: usize) -> String {
        let mut xs = self.latencies_ms.clone();
        xs.sort_by(f64::total_cmp);
        format!(
            "stream: {} calls, {in_flight} in flight, {:.2} calls/s, latency median {:.3} ms, \
             p10 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
            xs.len(),
            xs.len() as f64 / self.wall_s.max(1e-12),
            quantile(&xs, 0.5),
            quantile(&xs, 0.1),
            quantile(&xs, 0.9),
            quantile(&xs, 0.99)
        )
    }
}

/// Runs `calls` calls keeping up to `in_flight` submitted and unfinished: each call is
/// submitted as soon as the oldest of a full window finishes. A call's latency runs from
/// its submission to the return of the wait on it (calls are waited in order).
fn run_stream(
    session: &Session,
    inputs: &[rafter_runtime::Tensor],
    calls: usize,
    in_flight: usize,
) -> Result<Stream> {
    let mut window = std::collections::VecDeque::with_capacity(in_flight);
    let mut latencies_ms = Vec::with_capacity(calls);
    let start = Instant::now();
    let mut submitted = 0;
    while latencies_ms.len() < calls {
        while submitted < calls && window.len() < in_flight {
            let at = Instant::now();
            window.push_back((at, session.submit(inputs.to_vec())?));
            submitted += 1;
        }
        let (at, call) = window.pop_front().expect("a call is in flight");
        call.wait(CALL_TIMEOUT)?;
        latencies_ms.push(at.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Stream {
        wall_s: start.elapsed().as_secs_f64(),
        latencies_ms,
    })
}

/// The final `bench:` line for call times in ms (any order, at least one).
fn summary_line(times_ms: &[f64], peak_kib: Option<u64>) -> String {
    let mut xs = times_ms.to_vec();
    xs.sort_by(f64::total_cmp);
    let rss = match peak_kib {
        Some(k) => format!("{:.1} MB", k as f64 * 1024.0 / 1e6),
        None => "unavailable".to_string(),
    };
    format!(
        "bench: median {:.3} ms, p10 {:.3} ms, p90 {:.3} ms, peak RSS {rss}",
        quantile(&xs, 0.5),
        quantile(&xs, 0.1),
        quantile(&xs, 0.9)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_line_has_the_documented_form() {
        let line = summary_line(&[3.0, 1.0, 2.0], Some(1000));
        assert_eq!(
            line,
            "bench: median 2.000 ms, p10 1.200 ms, p90 2.800 ms, peak RSS 1.0 MB"
        );
    }
}
