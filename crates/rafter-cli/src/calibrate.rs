//! `rafter devices --profile`: short calibration runs that give each device's cost
//! profile for the partitioner ([`rafter_opt::partition`]).
//!
//! Each calibration program is compiled and run through the same path as a model (the
//! compiler, the runtime session, the device's HAL), so what is measured is what a
//! kernel costs there, call overhead included:
//!
//! - per kernel class, probes shaped like the benchmark models' kernels
//!   ([`class_probes`]): GEMMs like BERT's projections and FFN, dense, 1x1 and depthwise
//!   convolutions like ResNet-50's and MobileNetV2's (on the CPU the 3x3 ones it runs by
//!   Winograd apart from the others), an elementwise add (bandwidth) and
//!   a fused chain of 32 elementwise ops (compute), an attention-score softmax, a head
//!   transpose. Two sizes per contraction class give its
//!   peak and its ramp (Hockney's n½); each rate is set against the work the cost model
//!   itself counts for the probe's main kernel (the one with the most flops,
//!   [`cost::kernel_work`]), so counting conventions cancel, timed by that kernel's own
//!   dispatches: the layout transposes a lone convolution gets on the CPU are kernels of
//!   their own in a model, estimated there, not part of the convolution's rate;
//! - a chain of 33 dependent 1x1 matmuls against a single one: the fixed cost of one
//!   dispatch (what each extra kernel of a call costs beyond its work).
//!
//! A class probe is rated by its kernels' own time on the device (the union of their
//! dispatch spans in the device's trace: GPU timestamps on Vulkan), not by the call's
//! wall time: a call also copies the probe's inputs to the device and its result back,
//! which on a discrete GPU costs far more than the kernel (on an H200, timing whole calls
//! rated its GEMMs at 0.6 TFLOP/s and its bandwidth at 10 GB/s, an order of magnitude
//! low, and `--target auto` kept models on the CPU). Those copies are the link's cost,
//! which the model charges apart. This is also what `rafter bench --estimate` measures
//! the estimates against.
//!
//! Whole calls' wall times (the dispatch chain, the link's probes, the split call that
//! decides zero-copy) are timed on devices opened without a trace sink: a traced Vulkan
//! command buffer writes timestamps around every dispatch, which slows a call of many
//! small kernels by half on an H200, and a fixed cost timed traced would be the trace's.
//!
//! The link to an accelerator is measured in situ: its rate from two `add` calls whose
//! inputs and result cross it, its latency as the handoffs between the devices in calls
//! split across them (the mean of the two directions' medians, [`link_handoff`]). It is zero-copy where the accelerator's own
//! memory is host-coherent (unified memory, lavapipe), and, on a discrete GPU that reaches
//! the host's cached memory, where a call split across the devices ran faster with its
//! crossings handed over in that memory than copied ([`host_memory_crossings`]). Each
//! figure is the median of several timed calls after warm-up (`rafter bench --estimate`
//! compares against its median call and each kernel's median likewise), and every class
//! probe is timed in two passes on fresh devices, keeping its faster one (single passes
//! let outliers of several times a probe's time into the fits).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rafter_hal::{TraceEvent, TraceKind};
use rafter_ir::program::KernelKind;
use rafter_opt::partition::cost::{self, KernelWork};
use rafter_opt::partition::device::{class_name, residual_factor};
use rafter_opt::partition::{
    ClassRate, CostProfile, DeviceDescription, Link, Residual, SharedMemory,
};
use rafter_reference::Bindings;
use rafter_runtime::{ChromeTrace, Session, SessionOptions};
use rafter_runtime_cpu::CpuDeviceOptions;

use crate::cmd_run::{random_inputs, runtime_tensors};
use crate::estimate::median;
use crate::model;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Timed calls per calibration program.
const CALLS: usize = 9;

/// What one calibration program costs on its device: each the median of [`CALLS`] timed
/// calls after warm-up, the typical call that `rafter bench --estimate` compares against
/// (on the H200 machine's 16-core host a kernel's median call ran 10-60% above its
/// fastest, `benchmarks/results/cost-experiments-2026-12-01/`, and a model's kernels, each disturbed at its own moments,
/// never all run at their fastest in one call: probes rated by their fastest calls put
/// ResNet-50's estimate at 0.69 of its fastest call).
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// Wall time of a whole call (submission, copies, kernels, completion), seconds,
    /// untraced.
    call_s: f64,
    /// The same, traced ([`link_in_situ`] says why it uses this one).
    traced_call_s: f64,
    /// Time the program's kernels held `target` in one call (the union of their dispatch
    /// spans on its queues), seconds; 0 when the device traced none.
    kernels_s: f64,
}

/// The devices a few calibration programs run on, opened once for them (a device per
/// program: on an H200 the 31st open in one process failed to find the device): once
/// with the trace sink their dispatches are timed by, once untraced for the calls' wall
/// time. A traced Vulkan command buffer writes timestamps around every dispatch, which
/// on the H200 made calls 1.4-1.6x slower (BERT-base 4.25 -> 6.0 ms, MobileNetV2 0.59 ->
/// 0.96), so a fixed cost timed traced (a dispatch's, the link's) would be the trace's.
struct Bench {
    target: String,
    /// Traced: kernels' own times and the handoffs between devices.
    devices: rafter_runtime::DeviceSet,
    /// Untraced: whole calls' wall time.
    plain: rafter_runtime::DeviceSet,
    sink: Arc<ChromeTrace>,
}

impl Bench {
    fn open(target: &str) -> Result<Bench> {
        let sink = Arc::new(ChromeTrace::new());
        let cpu = CpuDeviceOptions {
            trace_sink: Some(sink.clone() as Arc<dyn rafter_hal::TraceSink>),
            ..CpuDeviceOptions::default()
        };
        let devices = model::open_devices(target != "cpu", cpu)?;
        let plain = model::open_devices(target != "cpu", CpuDeviceOptions::default())?;
        Ok(Bench {
            target: target.to_string(),
            devices,
            plain,
            sink,
        })
    }

    /// Times `graph_text` compiled for this bench's target, tracing its dispatches on the
    /// way; with `only`, [`Timing::kernels_s`] counts that kernel's dispatches alone.
    fn time_call(&self, graph_text: &str, only: Option<&str>) -> Result<Timing> {
        let graph = parse_probe(graph_text)?;
        let options = rafter_compiler::CompileOptions {
            target: rafter_compiler::target(&self.target)?,
            half_compute: PROBE_HALF,
            ..Default::default()
        };
        let compiled = rafter_compiler::compile(&graph, &options)?;
        self.time_compiled(compiled, only, None)
    }

    /// The median call of `graph_text` lowered for the host and placed by hand: kernel
    /// `k` on `devices[k]` (0 the host, 1 this bench's accelerator), each tensor crossing
    /// zero-copy in `shared` memory, or copied when `None`.
    fn time_placed(
        &self,
        graph_text: &str,
        devices: &[usize],
        shared: Option<SharedMemory>,
    ) -> Result<f64> {
        let compiled = self.compile_placed(graph_text, devices, shared)?;
        Ok(self.time_compiled(compiled, None, None)?.call_s)
    }

    /// Every handoff between the devices (the gap from one device's last work to the
    /// other's first within a call, [`crate::estimate::handoffs`]) in [`CALLS`] calls of
    /// `graph_text` placed as in [`Bench::time_placed`], seconds.
    fn handoffs_placed(
        &self,
        graph_text: &str,
        devices: &[usize],
        shared: Option<SharedMemory>,
    ) -> Result<Vec<crate::estimate::Handoff>> {
        let compiled = self.compile_placed(graph_text, devices, shared)?;
        let mut gaps = Vec::new();
        self.time_compiled(compiled, None, Some(&mut gaps))?;
        Ok(gaps)
    }

    /// `graph_text` lowered for the host and placed by hand (see [`Bench::time_placed`]).
    fn compile_placed(
        &self,
        graph_text: &str,
        devices: &[usize],
        shared: Option<SharedMemory>,
    ) -> Result<rafter_compiler::Compiled> {
        let graph = parse_probe(graph_text)?;
        let target = rafter_compiler::target(&self.target)?;
        let mut p = rafter_opt::lower(&graph, &rafter_opt::LowerOptions::default())?;
        anyhow::ensure!(
            p.kernels.len() == devices.len(),
            "calibration graph lowers to {} kernels, not the {} placed",
            p.kernels.len(),
            devices.len()
        );
        let names = rafter_opt::place::device_names(target.accelerators());
        rafter_opt::place::apply_placement(&mut p, &names, devices, &[None, shared]);
        rafter_opt::memplan::plan_memory(&mut p, &rafter_opt::memplan::PlanOptions::default())?;
        Ok(rafter_compiler::package(p, &target)?)
    }

    /// Times `compiled` as [`Bench::time_call`] does; with `handoffs`, adds each timed
    /// call's handoffs between devices to it (seconds).
    fn time_compiled(
        &self,
        compiled: rafter_compiler::Compiled,
        only: Option<&str>,
        mut handoffs: Option<&mut Vec<crate::estimate::Handoff>>,
    ) -> Result<Timing> {
        let target = self.target.as_str();
        let executables = compiled.executables();
        let program = compiled.program;
        let opts = model::with_executables(SessionOptions::new(), &executables);
        let inputs = runtime_tensors(&random_inputs(&program.inputs, &Bindings::with([]), 1)?)?;
        let plain = Session::with_options(program.clone(), &self.plain, opts.clone())?;
        let session = Session::with_options(program, &self.devices, opts)?;
        for _ in 0..2 {
            plain.run(inputs.clone(), TIMEOUT)?;
            session.run(inputs.clone(), TIMEOUT)?;
        }
        let mut call_s = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let start = Instant::now();
            plain.run(inputs.clone(), TIMEOUT)?;
            call_s.push(start.elapsed().as_secs_f64());
        }
        let (mut traced_call_s, mut kernels_s) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            self.sink.clear();
            let call = inputs.clone();
            let start = Instant::now();
            session.run(call, TIMEOUT)?;
            let end = Instant::now();
            traced_call_s.push((end - start).as_secs_f64());
            let events = self.sink.events();
            if let Some(h) = handoffs.as_deref_mut() {
                h.extend(crate::estimate::handoffs(&events, &[(start, end)]));
            }
            let kernel_s = dispatch_time(&events, target, only);
            if kernel_s == 0.0 && dispatch_time(&events, target, None) > 0.0 {
                // A rate from the call's wall time instead would count the input copies
                // (see the module docs): never silently.
                anyhow::bail!(
                    "no dispatch of kernel `{}` in the trace",
                    only.unwrap_or("")
                );
            }
            kernels_s.push(kernel_s);
        }
        Ok(Timing {
            call_s: median(call_s),
            traced_call_s: median(traced_call_s),
            kernels_s: median(kernels_s),
        })
    }
}

/// A calibration program's graph (an error here is a bug in the probe's text).
fn parse_probe(graph_text: &str) -> Result<rafter_ir::Graph> {
    rafter_ir::text::parse_graph(graph_text).map_err(|e| anyhow::anyhow!("calibration graph: {e}"))
}

/// Seconds the dispatches in `events` held `device`'s queues (`vulkan:0` is `vulkan`):
/// the length of the union of their spans, so a dispatch split over worker threads
/// counts once. With `only`, the dispatches of that kernel alone (`k1_conv_nhwc`, or a
/// numbered part of it, `k1_conv_nhwc#0`).
fn dispatch_time(events: &[TraceEvent], device: &str, only: Option<&str>) -> f64 {
    let named = |name: &str| {
        only.is_none_or(|k| name == k || name.strip_prefix(k).is_some_and(|r| r.starts_with('#')))
    };
    let spans = events
        .iter()
        .filter(|e| e.kind == TraceKind::Dispatch)
        .filter(|e| e.queue.split(':').next() == Some(device))
        .filter(|e| named(&e.name))
        .map(|e| (e.start, e.end))
        .collect();
    crate::estimate::union_s(spans)
}

/// One calibration program: its graph text and the work the cost model counts for it
/// (its kernels' flops and bytes at their shapes, from [`rafter_opt::partition::cost`]).
struct Probe {
    what: String,
    text: String,
}

fn probe(what: &str, text: String) -> Probe {
    Probe {
        what: what.to_string(),
        text: with_sink(&text),
    }
}

/// `text` with one more kernel after its result: a transpose of the last two dims (a
/// `relu` after a transpose probe, which a transpose would fold into). A call's result
/// lives in host memory, so the kernel writing it on a discrete GPU writes over PCIe (on an
/// H200 a lone 1.8 MB `relu` took 40 us, the same one mid-chain 7 us); the sink takes that
/// write, and the probe's own kernel writes device memory as a model's inner kernels do.
fn with_sink(text: &str) -> String {
    let Some((head, rest)) = text.split_once(") -> (%") else {
        return text.to_string();
    };
    let Some((out, rest)) = rest.split_once(')') else {
        return text.to_string();
    };
    let decl = format!("  %{out}: ");
    let Some(ty) = text
        .lines()
        .find_map(|l| l.strip_prefix(&decl[..]))
        .and_then(|l| l.split_once(" = ").map(|(t, _)| t.to_string()))
    else {
        return text.to_string();
    };
    let Some((dtype, dims)) = ty.strip_suffix(']').and_then(|t| t.split_once('[')) else {
        return text.to_string();
    };
    let mut dims: Vec<&str> = dims.split(", ").collect();
    let body = rest.trim_end().trim_end_matches('}');
    let line = if text.contains("= transpose{") || dims.len() < 2 {
        format!("  %sink: {ty} = unary{{op = relu}}(%{out})\n")
    } else {
        let r = dims.len();
        dims.swap(r - 2, r - 1);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        format!(
            "  %sink: {dtype}[{}] = transpose{{perm = {perm:?}}}(%{out})\n",
            dims.join(", ")
        )
    };
    format!("{head}) -> (%sink){body}{line}}}")
}

fn gemm(m: usize, k: usize, n: usize) -> Probe {
    gemm_of("f32", m, k, n)
}

/// A GEMM in `dtype` (`f32`, `f16`) of activations `a` by a constant weight `w`, as a
/// model's projections and FFNs are: the CPU compiler packs constant weights ahead of
/// time, and a weight given as an input is packed on every call (on the 2-core Zen 3 dev
/// machine the probes, weights as inputs, rated its GEMMs at 131 GFLOP/s where
/// BERT-base's FFN products ran at 178, and BERT-base's CPU estimate came out 1.34 of its
/// time). A bias is added, fused as in a model's projections. An f16 probe's weight is
/// the f32 constant cast to f16, which the compiler folds.
/// Products of two activations (attention) are [`batched_gemm`]'s.
fn gemm_of(dtype: &str, m: usize, k: usize, n: usize) -> Probe {
    let (weight, weight_lines) =
        constant_of(dtype, "w", &format!("{k}, {n}"), (1.0 / k as f32).sqrt());
    let (bias, bias_lines) = constant_of(dtype, "b", &format!("{n}"), 0.1);
    probe(
        &format!("gemm {dtype} {m}x{k}x{n}"),
        format!(
            "graph @gemm(%a: {dtype}[{m}, {k}]) -> (%y) {{\n{weight_lines}{bias_lines}  \
             %t: {dtype}[{m}, {n}] = matmul(%a, {weight})\n  \
             %y: {dtype}[{m}, {n}] = binary{{op = add}}(%t, {bias})\n}}"
        ),
    )
}

/// `n` of [`gemm_of`]'s f32 128x384x384 GEMMs (MiniLM-L6's projection, +bias) in a
/// chain, each multiplying the one before's result by the same constant weight: the
/// GEMM probe's kernel as a model runs it, after a kernel it depends on ([`lone_excess_s`]).
fn projection_chain(n: usize) -> Probe {
    let (m, k) = (128, 384);
    let (weight, weight_lines) =
        constant_of("f32", "w", &format!("{k}, {k}"), (1.0 / k as f32).sqrt());
    let (bias, bias_lines) = constant_of("f32", "b", &format!("{k}"), 0.1);
    let mut body = String::new();
    let mut prev = "%a".to_string();
    for i in 0..n {
        body.push_str(&format!(
            "  %t{i}: f32[{m}, {k}] = matmul({prev}, {weight})\n  \
             %y{i}: f32[{m}, {k}] = binary{{op = add}}(%t{i}, {bias})\n"
        ));
        prev = format!("%y{i}");
    }
    probe(
        &format!("chain of {n} gemm f32 {m}x{k}x{k}"),
        format!("graph @projections(%a: f32[{m}, {k}]) -> ({prev}) {{\n{weight_lines}{bias_lines}{body}}}"),
    )
}

/// A 2-D convolution of x [1, c, h, w] by `m` filters of `k`x`k` over `c / group`
/// channels, stride `s`, padding `k / 2`. The filters are a constant, as a model's are:
/// the CPU compiler transforms constant 3x3 filters for Winograd ahead of time and packs
/// the others, and a filter given as an input got neither (with it, and timed with its
/// layout transposes, the probe rated the H200 host's 3x3 convolutions at a third of
/// what those of a model ran at; on the 2-core dev machine 193 -> 595 GFLOP/s). It adds a
/// bias and a ReLU, fused as a model's convolutions (batch norm folded) fuse their
/// epilogue, so that the probe is the kernel a model runs (on the H200 machine the
/// epilogue changed no probe's time beyond run-to-run noise, on either device).
fn conv(c: usize, hw: usize, m: usize, k: usize, s: usize, group: usize) -> Probe {
    conv_of("f32", c, hw, m, k, s, group)
}

/// [`conv`] in `dtype` (`f32`, `f16`): an f16 probe's filter is the f32 constant cast to
/// f16, which the compiler folds into an f16 weight.
fn conv_of(dtype: &str, c: usize, hw: usize, m: usize, k: usize, s: usize, group: usize) -> Probe {
    let p = k / 2;
    let o = (hw + 2 * p - k) / s + 1;
    let cg = c / group;
    let scale = (2.0 / (cg * k * k) as f32).sqrt();
    let (filter, filter_lines) = constant_of(dtype, "w", &format!("{m}, {cg}, {k}, {k}"), scale);
    let (bias, bias_lines) = constant_of(dtype, "b", &format!("1, {m}, 1, 1"), 0.1);
    probe(
        &format!("conv {dtype} {c}x{hw}x{hw} -> {m} k{k} s{s} g{group}"),
        format!(
            "graph @conv(%x: {dtype}[1, {c}, {hw}, {hw}]) -> (%y) {{\n{filter_lines}{bias_lines}  \
             %c: {dtype}[1, {m}, {o}, {o}] = conv{{kernel_shape = [{k}, {k}], \
             strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], dilations = [1, 1], \
             group = {group}, auto_pad = explicit}}(%x, {filter})\n  \
             %t: {dtype}[1, {m}, {o}, {o}] = binary{{op = add}}(%c, {bias})\n  \
             %y: {dtype}[1, {m}, {o}, {o}] = unary{{op = relu}}(%t)\n}}"
        ),
    )
}

/// A constant `%NAME` of shape `dims` in `dtype`, its values in [-scale, scale) from
/// [`hex_f32s`]: the name to use and the lines that declare it (an f16 constant is the f32
/// one cast, which the compiler folds).
fn constant_of(dtype: &str, name: &str, dims: &str, scale: f32) -> (String, String) {
    let n = dims
        .split(", ")
        .map(|d| d.parse::<usize>().expect("a probe's dims are numbers"))
        .product();
    let decl = format!(
        "  const %{name}: f32[{dims}] = hex \"{}\"\n",
        hex_f32s(n, scale)
    );
    if dtype == "f32" {
        (format!("%{name}"), decl)
    } else {
        (
            format!("%{name}h"),
            format!("{decl}  %{name}h: {dtype}[{dims}] = cast{{to = {dtype}}}(%{name})\n"),
        )
    }
}

/// `n` f32s in [-scale, scale) from a fixed sequence, as the text format's little-endian
/// `hex` data.
fn hex_f32s(n: usize, scale: f32) -> String {
    let mut state = 0x2545_f491_u32;
    let mut out = String::with_capacity(n * 8);
    for _ in 0..n {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let unit = (state >> 8) as f32 / (1u32 << 24) as f32;
        for b in ((unit * 2.0 - 1.0) * scale).to_le_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

fn add(shape: &str) -> Probe {
    probe(
        &format!("add [{shape}]"),
        format!(
            "graph @add(%a: f32[{shape}], %b: f32[{shape}]) -> (%y) {{\n  \
             %y: f32[{shape}] = binary{{op = add}}(%a, %b)\n}}"
        ),
    )
}

/// `2 * pairs` elementwise ops chained on one tensor (`t = t * a + a`, repeated: bounded
/// for inputs in (-1, 1)), which the compiler fuses into one kernel: many operations per
/// element, where `add` has one, so its rate is the class's compute rate. Rated by `add` alone, a device's elementwise
/// compute was the rate of a memory-bound kernel (12 GFLOP/s for an H200), and fused
/// chains such as GELU were estimated many times their time.
fn fused_chain(shape: &str, pairs: usize) -> Probe {
    let mut body = String::new();
    let mut prev = "%a".to_string();
    for i in 0..pairs {
        body.push_str(&format!(
            "  %m{i}: f32[{shape}] = binary{{op = mul}}({prev}, %a)\n  \
             %s{i}: f32[{shape}] = binary{{op = add}}(%m{i}, %a)\n"
        ));
        prev = format!("%s{i}");
    }
    probe(
        &format!("{} fused elementwise ops on [{shape}]", 2 * pairs),
        format!("graph @chain(%a: f32[{shape}]) -> ({prev}) {{\n{body}}}"),
    )
}

fn softmax(shape: &str) -> Probe {
    probe(
        &format!("softmax [{shape}]"),
        format!(
            "graph @softmax(%a: f32[{shape}]) -> (%y) {{\n  \
             %y: f32[{shape}] = softmax{{kind = softmax, axis = -1}}(%a)\n}}"
        ),
    )
}

fn transpose(shape: [usize; 4]) -> Probe {
    let [a, b, c, d] = shape;
    probe(
        &format!("transpose [{a}, {b}, {c}, {d}]"),
        format!(
            "graph @transpose(%a: f32[{a}, {b}, {c}, {d}]) -> (%y) {{\n  \
             %y: f32[{a}, {c}, {b}, {d}] = transpose{{perm = [0, 2, 1, 3]}}(%a)\n}}"
        ),
    )
}

/// `n` dependent 1x1 matmuls: one kernel each, so the time per kernel beyond the first
/// is the fixed cost of a dispatch.
fn chain(n: usize) -> Probe {
    let mut body = String::new();
    let mut prev = "%x".to_string();
    for i in 0..n {
        body.push_str(&format!("  %t{i}: f32[1, 1] = matmul({prev}, %w)\n"));
        prev = format!("%t{i}");
    }
    probe(
        &format!("chain of {n} dispatches"),
        format!("graph @chain(%x: f32[1, 1], %w: f32[1, 1]) -> ({prev}) {{\n{body}}}"),
    )
}

/// A batched matmul `[b, m, k] x [b, k, n]`, as attention's scores and context.
fn batched_gemm(b: usize, m: usize, k: usize, n: usize) -> Probe {
    probe(
        &format!("batched gemm {b}x{m}x{k}x{n}"),
        format!(
            "graph @bgemm(%a: f32[{b}, {m}, {k}], %b: f32[{b}, {k}, {n}]) -> (%y) {{\n  \
             %y: f32[{b}, {m}, {n}] = matmul(%a, %b)\n}}"
        ),
    )
}

/// The probes rating each class, shaped like the benchmark models' kernels (BERT/MiniLM
/// projections, FFNs and attention products; MobileNetV2 and ResNet-50 stems, 1x1, 3x3 and
/// depthwise convolutions at each stage's size; attention-score softmax; head transposes).
/// A contraction class has probes across its models' range of sizes, so its fitted rate
/// and ramp are those of the shapes models run, not of one favourable shape (one 64-channel
/// 3x3 convolution rated a 16-core host at 3 TFLOP/s, twice what ResNet-50's convolutions
/// ran at). The 1x1 convolutions include ResNet-50's stage-2 512->128 over 28x28 and
/// stage-1 64->64 over 56x56: the probes' residuals carry over by flops, depth and output
/// width, and on the H200 machine's host the 512->128 one ran 157 us where the 512->2048
/// over 7x7 of the same flops and depth ran 93. A streaming class has two probes of the sizes models' activations have (0.4 to
/// 5 MB: in a GPU's L2 or a CPU's caches, where a model's intermediates are), so that the
/// slope between them is its bandwidth and the intercept its fixed cost per kernel (a lone
/// small transpose put both into one rate, 49 GB/s for an H200); elementwise adds a fused
/// chain for its compute rate.
///
/// On the CPU, the 3x3 convolutions it runs by Winograd (`rafter_ir::program::cpu_winograd`)
/// rate a class of their own, `winograd_conv`, and `conv` only the others: with one rate
/// for both, ResNet-50's call was estimated at 0.73 of its time on the H200 machine's host
/// (the Winograd probes' speed lifted the rate of the direct ones). Other devices run no
/// Winograd: their `conv` probes are all five, as before.
fn class_probes(device: &str) -> Vec<(&'static str, Vec<Probe>)> {
    let convs = if device == "cpu" {
        vec![
            ("conv", direct_conv_probes()),
            ("winograd_conv", winograd_conv_probes()),
        ]
    } else {
        vec![(
            "conv",
            vec![
                conv(3, 224, 32, 3, 2, 1),
                conv(512, 7, 512, 3, 1, 1),
                conv(256, 14, 256, 3, 1, 1),
                conv(128, 56, 128, 3, 2, 1),
                conv(64, 56, 64, 3, 1, 1),
            ],
        )]
    };
    let mut probes = vec![
        (
            "gemm",
            vec![
                gemm(128, 384, 384),
                batched_gemm(12, 128, 64, 128),
                gemm(128, 384, 1536),
                gemm(128, 768, 768),
                gemm(128, 768, 3072),
            ],
        ),
        (
            "pointwise_conv",
            vec![
                conv(144, 28, 32, 1, 1, 1),
                conv(512, 7, 2048, 1, 1, 1),
                conv(1024, 14, 256, 1, 1, 1),
                conv(256, 56, 64, 1, 1, 1),
                conv(128, 56, 256, 1, 1, 1),
                conv(512, 28, 128, 1, 1, 1),
                conv(64, 56, 64, 1, 1, 1),
            ],
        ),
    ];
    probes.extend(convs);
    probes.extend(other_probes());
    probes
}

/// The CPU's direct (not Winograd) convolutions, each of ResNet-50's and MobileNetV2's:
/// the two stems, ResNet-50's stride-2 3x3 convolutions of stages 2 to 4, and its 3x3 on
/// 7x7 maps (too few pixels for Winograd; their long K shows the depth cost). Six, so
/// that a plane through them (rate, ramp, depth cost) is not fitted to four points: with
/// four, one profile rated these convolutions 15-20% fast.
fn direct_conv_probes() -> Vec<Probe> {
    vec![
        conv(3, 224, 32, 3, 2, 1),
        conv(3, 224, 64, 7, 2, 1),
        conv(512, 7, 512, 3, 1, 1),
        conv(512, 14, 512, 3, 2, 1),
        conv(256, 28, 256, 3, 2, 1),
        conv(128, 56, 128, 3, 2, 1),
    ]
}

/// Convolutions the CPU runs by Winograd: ResNet-50's 3x3 stride-1 ones of stages 1 to 3
/// (231 MFLOP each), and two smaller ones of other flops, without which the fit has one
/// size only and no ramp.
fn winograd_conv_probes() -> Vec<Probe> {
    vec![
        conv(32, 16, 32, 3, 1, 1),
        conv(64, 28, 64, 3, 1, 1),
        conv(256, 14, 256, 3, 1, 1),
        conv(128, 28, 128, 3, 1, 1),
        conv(64, 56, 64, 3, 1, 1),
    ]
}

/// The depthwise convolutions' and the streaming classes' probes (the same on every
/// device).
fn other_probes() -> Vec<(&'static str, Vec<Probe>)> {
    vec![
        (
            "depthwise_conv",
            vec![
                conv(960, 7, 960, 3, 1, 960),
                conv(384, 14, 384, 3, 1, 384),
                conv(144, 56, 144, 3, 1, 144),
            ],
        ),
        (
            "elementwise",
            vec![
                add("128, 768"),
                add("1, 144, 56, 56"),
                fused_chain("1, 144, 56, 56", 16),
            ],
        ),
        (
            "reduction",
            vec![softmax("12, 128, 128"), softmax("12, 256, 256")],
        ),
        (
            "data_movement",
            vec![transpose([1, 128, 12, 64]), transpose([1, 512, 12, 64])],
        ),
    ]
}

/// How the probes compile half precision: as the graph has it, because the profile rates a
/// half-precision kernel as the partitioner places it. In a plan across devices a CPU
/// kernel computes in its graph's precision; only CPU-only compiles widen f16 to f32
/// (`rafter_opt::widen`), and their kernels are then f32 ones, rated as such.
const PROBE_HALF: rafter_compiler::HalfCompute = rafter_compiler::HalfCompute::AsIs;

/// The cost model's work for the single kernel of `probe`'s program compiled for
/// `target` (the contraction or the largest kernel when lowering split it).
fn probe_work(probe: &Probe, target: &str) -> Result<(KernelWork, String)> {
    let graph = rafter_ir::text::parse_graph(&probe.text)
        .map_err(|e| anyhow::anyhow!("calibration graph `{}`: {e}", probe.what))?;
    let options = rafter_compiler::CompileOptions {
        target: rafter_compiler::target(target)?,
        half_compute: PROBE_HALF,
        ..Default::default()
    };
    let program = rafter_compiler::compile(&graph, &options)?.program;
    let values = cost::bound_values(&program);
    // The first kernel of the most flops: a sink after it (see `with_sink`) may tie.
    let mut best: Option<(KernelWork, String)> = None;
    for k in &program.kernels {
        let w = cost::kernel_work(k, &values);
        if best.as_ref().is_none_or(|b| w.flops > b.0.flops) {
            best = Some((w, k.name.clone()));
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("calibration `{}` has no kernel", probe.what))
}

/// A probe's compute time: its kernels' traced time (the model adds the fixed dispatch
/// cost per kernel on top, so a small kernel is over- rather than under-estimated); when
/// the device traced nothing (a device without timestamps), the call's time beyond an
/// empty call's, as before tracing existed.
fn probe_seconds(t: Timing, empty_call_s: f64) -> f64 {
    let s = if t.kernels_s.is_finite() && t.kernels_s > 0.0 {
        t.kernels_s
    } else {
        t.call_s - empty_call_s
    };
    s.max(1e-9)
}

/// Passes over [`lone_excess_s`]'s pair of calls, the median pass kept: a difference of
/// two medians about a microsecond apart, which three passes put at 0.1 us in one H200
/// profile and 1.2 in another (2026-12-01: BERT-base's GPU estimate 1.07 and 0.98 of
/// its call); a pass costs about a millisecond of GPU time.
const EXCESS_PASSES: usize = 5;

/// What of every probe's measured time the cost model does not count as its kernel's work
/// on a device whose dispatch overlaps the kernel before (a GPU, where a kernel costs the
/// longer of the dispatch and its work, `CostProfile::with_dispatch`): what a kernel
/// alone in its call spans beyond the same kernel in a chain of dependent ones, as a
/// model runs it. A probe is the only kernel of its call. Measured on a real kernel (the
/// GEMM probe's 128x384x384, alone against 12 in a chain, traced): an empty kernel's
/// excess overstates it (on the H200, 2026-12-01, an empty kernel spanned 7.7 us alone
/// and 3.1 in a chain, the GEMM 20.8 and 19.2), and leaving out the whole empty
/// kernel's time as on a CPU (its floor) rated every GPU kernel of the H200's models 2-3
/// us short (MiniLM-L6's projections 17 us against 19 in a chain, its layer norms 2.8
/// against 4.1). On a CPU, which launches, then works, the floor is left out instead:
/// the model charges the dispatch on top of every kernel.
fn lone_excess_s(bench: &Bench) -> Result<f64> {
    const N: usize = 12;
    let (lone, chain) = (projection_chain(1), projection_chain(N));
    let lone_kernel = probe_work(&lone, &bench.target)?.1;
    let mut passes = Vec::with_capacity(EXCESS_PASSES);
    for _ in 0..EXCESS_PASSES {
        let one = bench.time_call(&lone.text, Some(&lone_kernel))?.kernels_s;
        // Every kernel of the chain: the union of their spans.
        let many = bench.time_call(&chain.text, None)?.kernels_s;
        passes.push(excess_of(one, many, N));
    }
    passes.sort_by(f64::total_cmp);
    Ok(passes[EXCESS_PASSES / 2])
}

/// A kernel's excess alone (`one_s`, traced) over its time in a chain of `n` (`chain_s`,
/// the chain's traced total): 0 when it is not slower alone or the device traced nothing.
fn excess_of(one_s: f64, chain_s: f64, n: usize) -> f64 {
    if !(one_s.is_finite() && chain_s.is_finite()) || chain_s <= 0.0 || n == 0 {
        return 0.0;
    }
    (one_s - chain_s / n as f64).max(0.0)
}

/// A probe's time `t` less `excess_s` ([`lone_excess_s`]), kept to half `t` at least (a
/// probe under twice the excess was disturbed, not free).
fn beyond(t: f64, excess_s: f64) -> f64 {
    (t - excess_s).max(0.5 * t)
}

/// The line `t = a + x / rate` through `(x, t)` points, by least squares on the relative
/// error (weights `1 / t²`: a 10 us probe counts as much as a 10 ms one), as `(rate, a)`.
/// A negative intercept is dropped (the line through the origin instead); `None` when the
/// points do not rise with `x`.
fn line_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (mut s, mut sx, mut sxx, mut st, mut sxt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, t) in points {
        let w = 1.0 / (t * t).max(1e-30);
        s += w;
        sx += w * x;
        sxx += w * x * x;
        st += w * t;
        sxt += w * x * t;
    }
    let det = s * sxx - sx * sx;
    let slope = if det > 1e-12 * s * sxx {
        (s * sxt - sx * st) / det
    } else {
        0.0
    };
    if det > 1e-12 * s * sxx && slope <= 0.0 {
        return None;
    }
    let intercept = if slope > 0.0 {
        (st - slope * sx) / s
    } else {
        -1.0
    };
    if intercept >= 0.0 {
        return Some((1.0 / slope, intercept));
    }
    // Through the origin: slope = Σ w x t / Σ w x².
    let slope = if sxx > 0.0 { sxt / sxx } else { 0.0 };
    (slope > 0.0).then(|| (1.0 / slope, 0.0))
}

/// Solves the 3x3 system `m x = v` by Gaussian elimination with partial pivoting; `None`
/// when it is singular.
fn solve3(mut m: [[f64; 3]; 3], mut v: [f64; 3]) -> Option<[f64; 3]> {
    for c in 0..3 {
        let p = (c..3).max_by(|&a, &b| m[a][c].abs().total_cmp(&m[b][c].abs()))?;
        if m[p][c].abs() < 1e-300 {
            return None;
        }
        m.swap(c, p);
        v.swap(c, p);
        let pivot = m[c];
        for r in c + 1..3 {
            let f = m[r][c] / pivot[c];
            for (x, p) in m[r].iter_mut().zip(pivot).skip(c) {
                *x -= f * p;
            }
            v[r] -= f * v[c];
        }
    }
    let mut x = [0.0; 3];
    for c in (0..3).rev() {
        let s: f64 = (c + 1..3).map(|k| m[c][k] * x[k]).sum();
        x[c] = (v[c] - s) / m[c][c];
    }
    x.iter().all(|x| x.is_finite()).then_some(x)
}

/// The plane `t = a + flops / rate + depth * depth_s` through `(flops, depth, t)` points
/// by least squares on the relative error (as [`line_fit`]), as `(rate, a, depth_s)`;
/// `None` unless the rate, the intercept and the depth cost all come out positive (the
/// probes then do not show a depth cost, and [`line_fit`] rates them).
fn depth_fit(points: &[(f64, f64, f64)]) -> Option<(f64, f64, f64)> {
    let mut m = [[0.0; 3]; 3];
    let mut v = [0.0; 3];
    for &(f, d, t) in points {
        let w = 1.0 / (t * t).max(1e-30);
        let x = [1.0, f, d];
        for ((row, vi), xi) in m.iter_mut().zip(v.iter_mut()).zip(x) {
            for (mij, xj) in row.iter_mut().zip(x) {
                *mij += w * xi * xj;
            }
            *vi += w * xi * t;
        }
    }
    let [a, inv_rate, depth_s] = solve3(m, v)?;
    (a >= 0.0 && inv_rate > 0.0 && depth_s > 0.0).then(|| (1.0 / inv_rate, a, depth_s))
}

/// A contraction class's rate from its probes `(work, seconds)`: the line through them
/// over flops gives the rate and the ramp (Hockney's n½: `t = (flops + half_flops) /
/// flops_per_s`). The line's intercept holds what every probe's time holds beyond its
/// kernel's work ([`lone_excess_s`]): only what exceeds `excess_s` is ramp. With no
/// rising line, the plain rate of the largest probe.
fn fit(points: &[(KernelWork, f64)], excess_s: f64) -> ClassRate {
    let last = points.last().expect("every class has a probe");
    let (wl, tl) = (last.0, last.1.max(1e-9));
    let bytes_per_s = points
        .iter()
        .map(|(w, t)| w.bytes / t.max(1e-9))
        .fold(wl.bytes.max(1.0) / tl, f64::max);
    let depth = |w: &KernelWork| w.detail_depth.iter().sum::<f64>();
    let planes: Vec<(f64, f64, f64)> = points
        .iter()
        .map(|(w, t)| (w.flops, depth(w), *t))
        .collect();
    let flops: Vec<(f64, f64)> = points.iter().map(|(w, t)| (w.flops, *t)).collect();
    let line = line_fit(&flops);
    // The relative squared error of a fit `t(flops, depth)` over the probes.
    let misfit = |t: &dyn Fn(f64, f64) -> f64| -> f64 {
        planes
            .iter()
            .map(|&(f, d, m)| ((t(f, d) - m) / m.max(1e-12)).powi(2))
            .sum()
    };
    let plane = depth_fit(&planes).filter(|&(rate, a, depth_s)| {
        // Only a depth cost that explains the probes: half the line's error or less (a
        // third parameter always fits noise a little better).
        let with = misfit(&|f, d| a + f / rate + d * depth_s);
        let without = line.map_or(f64::INFINITY, |(rate, a)| misfit(&|f, _| a + f / rate));
        with <= 0.5 * without
    });
    if let Some((flops_per_s, a, depth_s)) = plane {
        return ClassRate {
            flops_per_s,
            bytes_per_s,
            half_flops: (a - excess_s).max(0.0) * flops_per_s,
            half_scale: None,
            depth_s,
        };
    }
    match line {
        Some((flops_per_s, a)) => ClassRate {
            flops_per_s,
            // Bytes never bound these classes at the probes' shapes; the fastest probe's
            // streaming rate keeps the memory term below its compute term there.
            bytes_per_s,
            half_flops: (a - excess_s).max(0.0) * flops_per_s,
            half_scale: None,
            depth_s: 0.0,
        },
        None => ClassRate {
            flops_per_s: wl.flops.max(1.0) / tl,
            bytes_per_s,
            half_flops: 0.0,
            half_scale: None,
            depth_s: 0.0,
        },
    }
}

/// Each contraction probe's residual against its class's fitted `rate` ([`Residual`]):
/// its time beyond `excess_s` ([`lone_excess_s`]) over the fit's time for its work, kept
/// within 1/4 to 4 (a ratio beyond is a disturbed measurement, not a shape the fit
/// missed).
fn residuals(points: &[(KernelWork, f64)], rate: ClassRate, excess_s: f64) -> Vec<Residual> {
    points
        .iter()
        .map(|(w, t)| {
            let depth = w.detail_depth.iter().sum::<f64>();
            let fitted = cost::fitted_s(w.flops, depth, rate).max(1e-12);
            let own = beyond(*t, excess_s);
            Residual {
                flops: w.flops,
                depth,
                width: w.width(),
                ratio: (own / fitted).clamp(0.25, 4.0),
            }
        })
        .collect()
}

/// A streaming class's rates from probes of two sizes (or more): its bandwidth is the
/// slope of time over bytes between them, its operation rate the slope over flops. With
/// `chain` (elementwise), the last probe is a compute-heavy fused chain instead, whose
/// flops over its time beyond the streams' intercept give the operation rate (at least
/// the streaming probes' own). The intercept beyond `excess_s` ([`lone_excess_s`]) is the class's
/// own fixed cost, kept as ramp: a CPU kernel split over every core waits for the
/// slowest thread and wakes them all (11-26 us for the streaming classes on the H200
/// machine's 16-core host, in `rafter devices --profile`), which a single-threaded
/// tiny kernel's dispatch cost does not hold.
fn streaming_fit(points: &[(KernelWork, f64)], chain: bool, excess_s: f64) -> ClassRate {
    let (streams, compute) = if chain {
        points.split_at(points.len() - 1)
    } else {
        (points, &[][..])
    };
    let largest = streams.last().expect("every class has a probe");
    let line = |f: fn(&KernelWork) -> f64| -> (f64, f64) {
        let pts: Vec<(f64, f64)> = streams.iter().map(|(w, t)| (f(w), *t)).collect();
        line_fit(&pts).unwrap_or((f(&largest.0).max(1.0) / largest.1.max(1e-9), 0.0))
    };
    let (bytes_per_s, _) = line(|w| w.bytes);
    let (mut flops_per_s, intercept) = line(|w| w.flops);
    for (w, t) in compute {
        let beyond = (t - intercept).max(t / 2.0).max(1e-9);
        flops_per_s = flops_per_s.max(w.flops.max(1.0) / beyond);
    }
    ClassRate {
        flops_per_s,
        bytes_per_s,
        half_flops: (intercept - excess_s).max(0.0) * flops_per_s,
        half_scale: None,
        depth_s: 0.0,
    }
}

/// How many times each class's probes are timed (each keeps its faster median; see
/// [`profile_device`]).
const PROBE_PASSES: usize = 2;

/// Passes over the dispatch chain (a lone near-empty kernel against 33 of them), the
/// median pass kept: the difference of two calls' medians is noise-sized on an H200 (2.4
/// us a dispatch), and one profile of six measured it at 0, which rated every small GPU
/// kernel at half its time (MiniLM-L6's GPU estimate 0.72 of its call, 0.76-0.81 in the
/// others).
const DISPATCH_PASSES: usize = 3;

/// Set to `1` to print every probe's work and kept time (how a class's fit came out; a fit
/// that flips between calibrations shows here).
pub const PROBE_POINTS_ENV: &str = "RAFTER_PROFILE_POINTS";

/// Measures `device` (`cpu` or an accelerator target name) and returns its description.
pub fn profile_device(device: &str) -> Result<DeviceDescription> {
    let ctx = |what: &str| format!("calibrating {device}: {what}");
    let bench = Bench::open(device).with_context(|| ctx("opening the device"))?;
    let one = chain(1);
    let many = chain(33);
    let per_dispatch = |(empty, many): &(Timing, Timing)| (many.call_s - empty.call_s) / 32.0;
    let mut passes = Vec::with_capacity(DISPATCH_PASSES);
    for _ in 0..DISPATCH_PASSES {
        let empty = bench
            .time_call(&one.text, None)
            .with_context(|| ctx(&one.what))?;
        let t_many = bench
            .time_call(&many.text, None)
            .with_context(|| ctx(&many.what))?;
        passes.push((empty, t_many));
    }
    passes.sort_by(|a, b| per_dispatch(a).total_cmp(&per_dispatch(b)));
    let (t_one, t_many) = passes[DISPATCH_PASSES / 2];
    let empty = t_one.call_s;
    let dispatch_s = per_dispatch(&(t_one, t_many)).max(0.0);
    let floor_s = if t_many.kernels_s.is_finite() {
        t_many.kernels_s / 33.0
    } else {
        0.0
    };
    let excess_s = if device == "cpu" {
        floor_s
    } else {
        // Never more than an empty kernel's own excess alone (its start, which a kernel
        // with work hides part of): on lavapipe, where a GEMM takes 40 ms, the
        // difference of its two medians is noise of milliseconds.
        let empty_excess = excess_of(t_one.kernels_s, t_many.kernels_s, 33);
        lone_excess_s(&bench)
            .with_context(|| ctx("a GEMM alone and in a chain"))?
            .min(empty_excess)
    };
    if std::env::var(PROBE_POINTS_ENV).as_deref() == Ok("1") {
        eprintln!(
            "calibrate {device}: dispatch {:.2} us (untraced chain), an empty kernel traced \
             {:.2} us alone and {:.2} us in the chain; {:.2} us of every probe's time left out",
            dispatch_s * 1e6,
            t_one.kernels_s * 1e6,
            floor_s * 1e6,
            excess_s * 1e6
        );
    }
    let mut classes: BTreeMap<&'static str, ClassRate> = BTreeMap::new();
    let mut residual_points: BTreeMap<&'static str, Vec<Residual>> = BTreeMap::new();
    for (class, probes) in class_probes(device) {
        // A fresh device per class: with one device serving every probe's session in
        // turn, an H200's f16 GEMMs rated below its f32 ones and its bandwidth at a third
        // (not understood; with a device per class the rates matched the earlier ones from
        // a device per probe), so no device serves more than one class's few probes.
        // Two passes over the class's probes, each on a device of its own, each probe
        // keeping its faster time. On the H200 single passes rated random probes at 2-20x
        // their time in one profile out of two (a 1x1 convolution at 59 against 8 us, a
        // softmax at 146 against 7): the fit took them for a rate with no ramp and
        // MobileNetV2's GPU estimate fell from 1.1 to 0.56 of its time. Within a profile
        // of two passes the outliers fell in one pass only. Their likely cause, a traced
        // wait that returned before the monitor reported the call's spans (so a probe's
        // window lacked its own or held the previous call's), is fixed in
        // rafter-hal-vulkan (`SemInner::wait`); the second pass stays as insurance
        // against a transient on a shared machine, for twice the calibration's time.
        let mut points: Vec<(KernelWork, f64)> = Vec::new();
        for pass in 0..PROBE_PASSES {
            let bench = Bench::open(device).with_context(|| ctx("opening the device"))?;
            for (i, p) in probes.iter().enumerate() {
                let (work, kernel) = probe_work(p, device).with_context(|| ctx(&p.what))?;
                let t = bench
                    .time_call(&p.text, Some(&kernel))
                    .with_context(|| ctx(&p.what))?;
                let s = probe_seconds(t, empty);
                if std::env::var(PROBE_POINTS_ENV).as_deref() == Ok("1") {
                    eprintln!(
                        "calibrate {device}: {class} pass {pass} {}: {:.2} us",
                        p.what,
                        s * 1e6
                    );
                }
                if pass == 0 {
                    points.push((work, s));
                } else {
                    points[i].1 = points[i].1.min(s);
                }
            }
        }
        if std::env::var(PROBE_POINTS_ENV).as_deref() == Ok("1") {
            for (p, (w, t)) in probes.iter().zip(&points) {
                eprintln!(
                    "calibrate {device}: {class} probe {}: {:.4e} flops, {:.4e} bytes, depth \
                     {:.4e}, {:.2} us",
                    p.what,
                    w.flops,
                    w.bytes,
                    w.detail_depth.iter().sum::<f64>(),
                    t * 1e6
                );
            }
        }
        let rate = match class {
            "elementwise" => streaming_fit(&points, true, excess_s),
            "reduction" | "data_movement" => streaming_fit(&points, false, excess_s),
            _ => {
                let rate = fit(&points, excess_s);
                let near = residuals(&points, rate, excess_s);
                if std::env::var(PROBE_POINTS_ENV).as_deref() == Ok("1") {
                    for (p, r) in probes.iter().zip(&near) {
                        eprintln!(
                            "calibrate {device}: {class} residual {}: {:.3}",
                            p.what, r.ratio
                        );
                    }
                }
                residual_points.insert(class, near);
                rate
            }
        };
        classes.insert(class, rate);
    }
    // A contraction's probes are compute-bound, so their bytes per second say nothing of
    // the device's bandwidth: its memory term takes the streaming classes' rate (a kernel
    // with more bytes per flop than the probes, such as a GEMV, is bound by it).
    let streaming = ["elementwise", "reduction", "data_movement"]
        .iter()
        .map(|c| classes[c].bytes_per_s)
        .fold(0.0, f64::max);
    for c in [
        "gemm",
        "conv",
        "winograd_conv",
        "pointwise_conv",
        "depthwise_conv",
    ] {
        if let Some(r) = classes.get_mut(c) {
            r.bytes_per_s = r.bytes_per_s.max(streaming);
        }
    }
    // Kinds without probes of their own: a contraction as a GEMM; opaque kernels (run by
    // the interpreter) an order of magnitude below elementwise.
    let gemm = classes["gemm"];
    classes.insert(class_name(KernelKind::Contraction), gemm);
    let ew = classes["elementwise"];
    classes.insert(
        class_name(KernelKind::Opaque),
        ClassRate {
            flops_per_s: ew.flops_per_s / 10.0,
            bytes_per_s: ew.bytes_per_s / 10.0,
            half_flops: 0.0,
            half_scale: None,
            depth_s: 0.0,
        },
    );
    // The f16 probes in passes too, each scale the faster pass's: on the H200 one
    // profile's single pass timed them all at a third of their speed (f16 GEMMs at 0.9x
    // the f32 ones, against 3.0x in the profiles before and after it).
    let near = |class: &str| residual_points.get(class).map_or(&[][..], |v| &v[..]);
    let mut half_scale_of = 0.0f64;
    let mut conv_scales: BTreeMap<&'static str, f64> = BTreeMap::new();
    for _ in 0..PROBE_PASSES {
        let bench = Bench::open(device).with_context(|| ctx("opening the device"))?;
        let gemm = half_scale(&bench, &classes["gemm"], near("gemm"));
        half_scale_of = half_scale_of.max(gemm.with_context(|| ctx("f16 gemm"))?);
        for (class, p) in half_conv_probes() {
            let scale = class_half_scale(&bench, &p, &classes[class], near(class))
                .with_context(|| ctx(&p.what))?;
            let best = conv_scales.entry(class).or_insert(0.0);
            *best = best.max(scale);
        }
    }
    let half_scale = half_scale_of;
    for (class, scale) in conv_scales {
        classes
            .get_mut(class)
            .expect("a class with probes")
            .half_scale = Some(scale);
    }
    let weight_cache = if device == "cpu" {
        host_weight_cache()
    } else {
        None
    };
    let bench = Bench::open(device).with_context(|| ctx("opening the device"))?;
    let shared = if device == "cpu" {
        None
    } else {
        shared_memory(&bench, device)?
    };
    let mut handoff = None;
    let link = if device == "cpu" {
        None
    } else {
        handoff = link_handoff(&bench, shared).with_context(|| ctx("handoff"))?;
        let (bytes_per_s, latency_s) = match link_in_situ(&bench).with_context(|| ctx("link"))? {
            // A fixed cost fitted at zero is noise (every call has one): an empty call's.
            Some((rate, fixed)) => (
                rate,
                handoff.unwrap_or(if fixed > 0.0 { fixed } else { empty }),
            ),
            None => (host_copy_bandwidth(), handoff.unwrap_or(empty)),
        };
        Some(Link {
            bytes_per_s,
            latency_s,
            zero_copy: shared.is_some(),
            shared_memory: shared.unwrap_or_default(),
        })
    };
    Ok(DeviceDescription {
        name: device.to_string(),
        profile: CostProfile {
            classes,
            dispatch_s,
            // A crossing's handoff measured in place includes the waiting device's start
            // (`link_handoff`); without it, half an empty call stands for the semaphore
            // pair and the start.
            barrier_s: if device == "cpu" || handoff.is_some() {
                0.0
            } else {
                empty / 2.0
            },
            half_scale,
            // An accelerator's queue prepares the next dispatch while a kernel runs (see
            // `CostProfile::dispatch_overlaps`); the host launches, then works.
            dispatch_overlaps: device != "cpu",
            residuals: residual_points,
            weight_cache,
        },
        memory_bytes: None,
        link,
    })
}

/// The host's weight cache ([`crate::cache_sweep`]), swept with as many threads as the
/// CPU device runs kernels on.
fn host_weight_cache() -> Option<rafter_opt::partition::device::WeightCache> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let points = crate::cache_sweep::sweep(threads);
    if std::env::var(PROBE_POINTS_ENV).as_deref() == Ok("1") {
        for p in &points {
            eprintln!(
                "calibrate cpu: read sweep {:.0} MiB: {:.1} GB/s",
                p.bytes / 1048576.0,
                p.bytes_per_s / 1e9
            );
        }
    }
    crate::cache_sweep::weight_cache(&points)
}

/// The device's f16 GEMM rate over its f32 one (`f32` is the f32 class rate fitted
/// above), both at BERT's FFN shape: how much faster (GPU matrix units) or slower (a CPU
/// converting f16 in software) half-precision kernels run there. The f16 probe's whole
/// time, its lone excess ([`lone_excess_s`]) included, against the model's f32 time,
/// which leaves the excess out: an f16 kernel in a model keeps more of it than a scaled
/// f32 one (with the excess left out of both, the H200's scales came out 10-18% higher
/// and its f16 models' estimates fell: ResNet-50 f16 0.87 -> 0.80 of its call, 2026-12-01).
fn half_scale(bench: &Bench, f32: &ClassRate, near: &[Residual]) -> Result<f64> {
    let device = bench.target.as_str();
    let p = gemm_of("f16", 128, 768, 3072);
    let (work, kernel) = probe_work(&p, device)?;
    let t = bench.time_call(&p.text, Some(&kernel))?;
    let secs = probe_seconds(t, 0.0);
    let f32_secs = f32_model_secs(&work, f32, near);
    Ok((f32_secs / secs).clamp(1e-3, 1e3))
}

/// The time the cost model gives `work` at the f32 rate `f32` corrected by the class's
/// probe residuals `near` (without dispatch): the
/// f16 probes' scales are measured against it, so that it divided by the scale is what the
/// model says of an f16 kernel (`rafter_opt::partition::cost::kernel_time`).
fn f32_model_secs(work: &KernelWork, f32: &ClassRate, near: &[Residual]) -> f64 {
    let depth = work.detail_depth.iter().sum::<f64>();
    cost::fitted_s(work.flops, depth, *f32) * residual_factor(near, work.flops, depth, work.width())
}

/// An f16 probe per convolution class, the class's largest f32 probe in f16: their f16
/// kernels may use matrix units less than a GEMM's (in ResNet-50 on an H200 the f16
/// convolutions ran 1.5x as fast as the f32 ones, `bench --estimate` per class, where
/// the profile's f16 GEMM ran 3.4x), so each class gets its own scale.
fn half_conv_probes() -> Vec<(&'static str, Probe)> {
    vec![
        ("conv", conv_of("f16", 64, 56, 64, 3, 1, 1)),
        ("pointwise_conv", conv_of("f16", 128, 56, 256, 1, 1, 1)),
        ("depthwise_conv", conv_of("f16", 144, 56, 144, 3, 1, 144)),
    ]
}

/// The f16 probe `p`'s speed over the f32 class rate `f32` (time from the rate at its
/// work, over its measured time).
fn class_half_scale(bench: &Bench, p: &Probe, f32: &ClassRate, near: &[Residual]) -> Result<f64> {
    let device = bench.target.as_str();
    let (work, kernel) = probe_work(p, device)?;
    let t = bench.time_call(&p.text, Some(&kernel))?;
    let f32_secs = f32_model_secs(&work, f32, near);
    Ok((f32_secs / probe_seconds(t, 0.0)).clamp(1e-3, 1e3))
}

/// The memory `device` and the host both address, if any: its fastest (device-local)
/// memory where that is host-visible and coherent (unified-memory GPUs, lavapipe); else
/// the host's cached memory its kernels reach over the bus, where [`host_memory_crossings`]
/// measures that faster than copying (a discrete GPU). Then the compiler allocates tensors
/// crossing between them once, in that memory, and hands them over by semaphore alone
/// (`rafter_opt::place::apply_placement`). A discrete GPU's resizable BAR is host-visible
/// too, but the host reads it uncached over PCIe, so it is never the shared memory.
fn shared_memory(bench: &Bench, device: &str) -> Result<Option<SharedMemory>> {
    let Some(d) = bench.devices.get(device) else {
        anyhow::bail!("device `{device}` was not opened for calibration");
    };
    let coherent = |kind| {
        d.info()
            .memory_kind(kind)
            .is_some_and(|m| m.host_visible && m.host_coherent)
    };
    if coherent(rafter_hal::MemoryKind::DeviceLocal) {
        return Ok(Some(SharedMemory::Device));
    }
    if !coherent(rafter_hal::MemoryKind::Host) {
        return Ok(None);
    }
    // A probe that fails leaves the link copying (what it was before zero-copy in host
    // memory existed), said, rather than failing the whole profile.
    let (copied, shared) = match host_memory_crossings(bench) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("calibrate {device}: zero-copy in host memory not measured: {e:#}");
            return Ok(None);
        }
    };
    let zero_copy = shared < copied;
    eprintln!(
        "calibrate {device}: a split call crossing twice through host memory: {:.1} us \
         copied, {:.1} us zero-copy: {}",
        copied * 1e6,
        shared * 1e6,
        if zero_copy { "zero-copy" } else { "copies" }
    );
    Ok(zero_copy.then_some(SharedMemory::Host))
}

/// The elements of [`crossing_probe`]'s tensors: 1 MiB of f32, about a CNN's mid-graph
/// activation.
const CROSSING_PROBE_ELEMS: usize = 1 << 18;

/// Three softmaxes over `[256, 1024]`, each its own kernel: placed GPU, host, GPU, the
/// call crosses devices twice mid-graph, as a model split around a host-only kernel does.
fn crossing_probe() -> Probe {
    let shape = format!("256, {}", CROSSING_PROBE_ELEMS / 256);
    let op = "softmax{kind = softmax, axis = -1}";
    // No sink kernel (see `with_sink`): both variants write the result alike.
    Probe {
        what: format!("split softmaxes [{shape}]"),
        text: format!(
            "graph @split(%a: f32[{shape}]) -> (%c) {{\n  \
             %x: f32[{shape}] = {op}(%a)\n  \
             %b: f32[{shape}] = {op}(%x)\n  \
             %c: f32[{shape}] = {op}(%b)\n}}"
        ),
    }
}

/// Where the accelerator's own memory is not the host's (a discrete GPU) but it reaches
/// the host's cached memory over its bus: the median call of [`crossing_probe`] with
/// its two crossings copied (the GPU's result written to host memory, copied into the
/// host's arena; the host's result copied into the GPU's host-visible memory) and with
/// them zero-copy in host memory (each handed over in place, the GPU's kernels reading
/// and writing host memory over the bus). The link is zero-copy when that is faster:
/// decided by measurement, since it trades host copies for kernels working across the
/// bus.
fn host_memory_crossings(bench: &Bench) -> Result<(f64, f64)> {
    let p = crossing_probe();
    let placed = [1, 0, 1];
    let copied = bench
        .time_placed(&p.text, &placed, None)
        .with_context(|| format!("{} with copies", p.what))?;
    let shared = bench
        .time_placed(&p.text, &placed, Some(SharedMemory::Host))
        .with_context(|| format!("{} zero-copy", p.what))?;
    Ok((copied, shared))
}

/// The link's latency as the partitioner charges it per crossing: the handoff between
/// the devices (the gap from the producer's last work to the consumer's first, in the
/// devices' traces) in calls of [`crossing_probe`] split GPU, host, GPU, its tensors
/// crossing as the link will carry them (`shared`: zero-copy in that memory; `None`:
/// copied, the copies being work of their own in the traces). The mean of the two
/// directions' medians: every island of kernels on another device is entered and left
/// once, so a split pays one of each per round trip (on the H200 machine, 18 us to the
/// GPU and 33-45 us back). `None` when the traces show no handoff (a device without
/// timestamps).
///
/// This replaced the intercept of [`link_in_situ`]'s line as the latency: a few percent
/// of noise on its smaller probe moved the intercept by tens of microseconds (an H200's
/// profiles said 6 to 60 us), and at 60 us `--device auto` kept a model whose three
/// CPU-only kernels sit between GPU blocks (six crossings a call) on the CPU (1.73-1.87
/// ms), where its split runs in 0.93. A handoff measured in place already holds the waiting device's start (its
/// submission, its wake-up), so the profile then charges no barrier on top
/// ([`CostProfile::barrier_s`] 0).
fn link_handoff(bench: &Bench, shared: Option<SharedMemory>) -> Result<Option<f64>> {
    let p = crossing_probe();
    let handoffs = bench
        .handoffs_placed(&p.text, &[1, 0, 1], shared)
        .with_context(|| p.what.clone())?;
    let mut by_direction: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for (from, to, secs) in handoffs {
        by_direction.entry((from, to)).or_default().push(secs);
    }
    if by_direction.is_empty() {
        return Ok(None);
    }
    let mut medians = Vec::new();
    for ((from, to), mut gaps) in by_direction {
        gaps.sort_by(f64::total_cmp);
        let median = gaps[gaps.len() / 2];
        eprintln!(
            "calibrate {}: handoffs {from} -> {to}: {}, median {:.1} us, max {:.1} us",
            bench.target,
            gaps.len(),
            median * 1e6,
            gaps[gaps.len() - 1] * 1e6
        );
        medians.push(median);
    }
    Ok(Some(medians.iter().sum::<f64>() / medians.len() as f64))
}

/// The elements of the link probes' tensors: 1 MiB and 16 MiB of f32.
const LINK_PROBE_ELEMS: [usize; 2] = [1 << 18, 1 << 22];

/// The link as a call crosses it: bytes per second and the fixed seconds a call's
/// crossings cost (the latency where [`link_handoff`] traced none), from two `add` probes of [`LINK_PROBE_ELEMS`] whose calls upload two
/// operands and read back one result. Each probe's call time less its kernels' time is
/// what its three copies took, `fixed + bytes / rate`; two sizes give both terms. `None`
/// when noise leaves no positive rate (the caller then falls back to a host copy and an
/// empty call).
///
/// A host `memcpy` and an empty call, which this replaced, undercounted what a model's
/// crossings take: on an H200 machine they said 6.6 GB/s and 47 us, so 170 us for a 0.8 MB
/// crossing, where a model split around CPU-only kernels spent ~260 us per crossing
/// (`bench --estimate`: its call less its kernels).
fn link_in_situ(bench: &Bench) -> Result<Option<(f64, f64)>> {
    let mut points = Vec::new();
    for n in LINK_PROBE_ELEMS {
        let p = add(&n.to_string());
        // Two passes, the faster kept, as the class probes: on the H200 machine a busy
        // host (its CPU calls 1.3-1.6x their usual time that run) timed the 16 MiB call
        // at 10.1 ms against 4.3-5.1, a link of 5.1 GB/s against 10-12.7, and put the
        // estimate of a model split around CPU kernels at 1.5x its call, whose zero-copy
        // crossings had run no slower.
        let mut copies = f64::INFINITY;
        for _ in 0..PROBE_PASSES {
            let t = bench.time_call(&p.text, None).context(p.what.clone())?;
            eprintln!(
                "calibrate {}: {}: call {:.1} us ({:.1} us traced), kernels {:.1} us",
                bench.target,
                p.what,
                t.call_s * 1e6,
                t.traced_call_s * 1e6,
                t.kernels_s * 1e6
            );
            // Timed traced, unlike the other calls' walls: on the H200 machine the
            // untraced calls of these probes ran 1.6-2x slower than the traced ones at 16
            // MiB (6.8-9.4 ms against 4.3-4.8, not explained yet), a rate of 5.5-7.8 GB/s
            // that made the partitioner keep a model with CPU kernels mid-graph on the
            // CPU, 1.7x slower than its split, whose zero-copy crossings run at the traced
            // rate (10-11.6 GB/s in six profiles; the split's estimate within 15% of its
            // untraced calls).
            copies = copies.min(t.traced_call_s - t.kernels_s);
        }
        points.push((3.0 * 4.0 * n as f64, copies));
    }
    let link = link_from(points[0], points[1]);
    if let Some((rate, fixed)) = link {
        eprintln!(
            "calibrate {}: calls copying {:.0} and {:.0} MB across the link: {:.1} GB/s, \
             {:.1} us fixed",
            bench.target,
            points[0].0 / 1e6,
            points[1].0 / 1e6,
            rate / 1e9,
            fixed * 1e6
        );
    }
    Ok(link)
}

/// Rate and fixed cost of the line through two (bytes, seconds) points; `None` unless the
/// rate comes out positive and finite (the fixed cost is clamped at zero).
fn link_from((b0, t0): (f64, f64), (b1, t1): (f64, f64)) -> Option<(f64, f64)> {
    let rate = (b1 - b0) / (t1 - t0);
    (rate.is_finite() && rate > 0.0).then(|| (rate, (t0 - b0 / rate).max(0.0)))
}

/// The host's copy bandwidth, bytes per second (median of a few 64 MiB copies).
fn host_copy_bandwidth() -> f64 {
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    src.len() as f64 / times[2].max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split call runs both ways on a real Vulkan device (lavapipe in CI: its `host`
    /// memory is what a discrete GPU's kernels would reach over the bus).
    #[test]
    fn host_memory_crossings_time_the_split_call_both_ways() {
        let Ok(bench) = Bench::open("vulkan") else {
            eprintln!("skipping host_memory_crossings: no Vulkan device");
            return;
        };
        if bench.devices.get("vulkan").is_none() {
            eprintln!("skipping host_memory_crossings: no Vulkan device");
            return;
        }
        let (copied, shared) = host_memory_crossings(&bench).unwrap();
        assert!(copied.is_finite() && copied > 0.0, "{copied}");
        assert!(shared.is_finite() && shared > 0.0, "{shared}");
    }

    #[test]
    fn the_crossing_probe_lowers_to_three_kernels_one_per_placed_device() {
        let p = crossing_probe();
        let g = rafter_ir::text::parse_graph(&p.text).unwrap();
        let lowered = rafter_opt::lower(&g, &rafter_opt::LowerOptions::default()).unwrap();
        assert_eq!(lowered.kernels.len(), 3, "{:#?}", lowered.kernels);
    }

    fn work(flops: f64, bytes: f64) -> KernelWork {
        KernelWork {
            class: KernelKind::Elementwise,
            detail: None,
            detail_flops: Default::default(),
            detail_depth: Default::default(),
            detail_width: Default::default(),
            flops,
            bytes,
            half: false,
        }
    }

    #[test]
    fn a_plane_through_flops_and_depth_gives_the_depth_cost() {
        // t = 5 us + flops / 1e12 + depth * 10 ns: a wide product, a deep narrow one (the
        // last 3x3 convolution's K of 4608), and between.
        let t = |f: f64, d: f64| 5e-6 + f / 1e12 + d * 1e-8;
        let pts = [
            (2.3e8, 576.0, t(2.3e8, 576.0)),
            (2.3e8, 4608.0, t(2.3e8, 4608.0)),
            (1.0e8, 1024.0, t(1.0e8, 1024.0)),
            (4.0e6, 2048.0, t(4.0e6, 2048.0)),
        ];
        let (rate, a, depth_s) = depth_fit(&pts).unwrap();
        assert!((rate / 1e12 - 1.0).abs() < 1e-6, "{rate}");
        assert!((a - 5e-6).abs() < 1e-12, "{a}");
        assert!((depth_s / 1e-8 - 1.0).abs() < 1e-6, "{depth_s}");
        // Times that fall with depth show no depth cost: the line rates them.
        let flat: Vec<(f64, f64, f64)> = pts
            .iter()
            .map(|&(f, d, _)| (f, d, 5e-6 + f / 1e12 - d * 1e-10))
            .collect();
        assert!(depth_fit(&flat).is_none());
        // Through `fit`: a depth cost the probes show is kept; within 2% noise of a line,
        // a tiny depth cost that a third parameter fits is not.
        let deep = |f: f64, d: f64, t: f64| {
            let mut w = work(f, 1e3);
            w.detail_depth[0] = d;
            (w, t)
        };
        let shown: Vec<(KernelWork, f64)> = pts.iter().map(|&(f, d, t)| deep(f, d, t)).collect();
        assert!((fit(&shown, 0.0).depth_s / 1e-8 - 1.0).abs() < 1e-6);
        let noise = [1.02, 0.98, 1.01, 0.99];
        let noisy: Vec<(KernelWork, f64)> = pts
            .iter()
            .zip(noise)
            .map(|(&(f, d, _), n)| deep(f, d, (5e-6 + f / 1e12 + d * 1e-11) * n))
            .collect();
        assert_eq!(fit(&noisy, 0.0).depth_s, 0.0);
    }

    #[test]
    fn the_link_is_the_line_through_two_crossing_times() {
        // 1 MB in 110 us and 9 MB in 510 us: 20 GB/s, 60 us fixed.
        let (rate, fixed) = link_from((1e6, 110e-6), (9e6, 510e-6)).unwrap();
        assert!((rate - 2e10).abs() < 1e3, "{rate}");
        assert!((fixed - 60e-6).abs() < 1e-12, "{fixed}");
        // Noise that makes the larger copy no slower gives no link.
        assert_eq!(link_from((1e6, 110e-6), (9e6, 100e-6)), None);
        assert_eq!(link_from((1e6, 110e-6), (9e6, 110e-6)), None);
        // A fixed cost below zero (a fast small call) is clamped.
        assert_eq!(link_from((1e6, 10e-6), (2e6, 110e-6)).unwrap().1, 0.0);
    }

    /// Every probe ends in a sink kernel that writes the call's result, and is rated by
    /// its own kernel, not the sink.
    #[test]
    fn probes_are_rated_by_their_kernel_before_the_sink() {
        for p in [
            add("2, 8"),
            transpose([1, 4, 2, 8]),
            softmax("2, 4, 8"),
            gemm(4, 8, 16),
            batched_gemm(2, 4, 8, 4),
            conv(4, 8, 4, 3, 1, 1),
            conv_of("f16", 4, 8, 4, 1, 1, 1),
            fused_chain("2, 8", 4),
        ] {
            assert!(p.text.contains("-> (%sink)"), "{}", p.text);
            let graph = rafter_ir::text::parse_graph(&p.text).unwrap();
            let program = rafter_compiler::compile(&graph, &Default::default())
                .unwrap()
                .program;
            assert!(program.kernels.len() >= 2, "{}: {}", p.what, p.text);
            let (_, kernel) = probe_work(&p, "cpu").unwrap();
            assert_ne!(
                Some(&kernel),
                program.kernels.last().map(|k| &k.name),
                "{}: rated by the sink",
                p.what
            );
        }
    }

    #[test]
    fn a_kernels_lone_excess_is_its_time_alone_beyond_its_share_of_a_chain() {
        // 20.8 us alone, 230.4 over a chain of 12 (19.2 each): 1.6 us.
        assert!((excess_of(20.8e-6, 230.4e-6, 12) - 1.6e-6).abs() < 1e-12);
        // Not slower alone: nothing left out.
        assert_eq!(excess_of(18e-6, 230.4e-6, 12), 0.0);
        // Nothing traced: nothing to leave out.
        assert_eq!(excess_of(f64::NAN, 230.4e-6, 12), 0.0);
        assert_eq!(excess_of(20.8e-6, 0.0, 12), 0.0);
        // A probe is never rated below half its measured time.
        assert_eq!(beyond(3e-6, 2e-6), 1.5e-6);
        assert!((beyond(10e-6, 2e-6) - 8e-6).abs() < 1e-12);
    }

    #[test]
    fn the_projection_chain_is_n_dependent_gemms_of_the_probes_shape() {
        for n in [1, 12] {
            let p = projection_chain(n);
            let graph = rafter_ir::text::parse_graph(&p.text).expect(&p.what);
            let matmuls = graph
                .nodes
                .iter()
                .filter(|node| node.op.name() == "matmul")
                .count();
            assert_eq!(matmuls, n, "{}", p.what);
        }
    }

    #[test]
    fn a_probes_residual_is_its_time_beyond_the_floor_over_the_fits() {
        let rate = ClassRate {
            flops_per_s: 1e12,
            bytes_per_s: 1e11,
            half_flops: 0.0,
            half_scale: None,
            depth_s: 0.0,
        };
        // 1e8 flops: 100 us by the fit; measured 202 us with a 2 us floor: 2x. One at
        // 20x the fit is kept at 4; one measured at its floor at 1/4.
        let points = [
            (work(1e8, 1e6), 202e-6),
            (work(1e8, 1e6), 2e-3),
            (work(1e8, 1e6), 2e-6),
        ];
        let r = residuals(&points, rate, 2e-6);
        assert!((r[0].ratio - 2.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r[1].ratio, 4.0);
        assert_eq!(r[2].ratio, 0.25);
        assert_eq!(r[0].flops, 1e8);
    }

    #[test]
    fn a_line_through_the_probes_gives_rate_and_intercept() {
        // t = 2 us + x / 1e9.
        let pts: Vec<(f64, f64)> = [1e3, 1e4, 1e5]
            .iter()
            .map(|&x| (x, 2e-6 + x / 1e9))
            .collect();
        let (rate, a) = line_fit(&pts).unwrap();
        assert!((rate / 1e9 - 1.0).abs() < 1e-9, "{rate}");
        assert!((a - 2e-6).abs() < 1e-12, "{a}");
        // A negative intercept: the line through the origin instead.
        let (rate, a) = line_fit(&[(1e6, 1e-3), (2e6, 3e-3)]).unwrap();
        assert_eq!(a, 0.0);
        assert!(rate > 5e8 && rate < 1e9, "{rate}");
        // Points that do not rise with x have no rate.
        assert!(line_fit(&[(1e6, 2e-3), (2e6, 1e-3)]).is_none());
        assert!(line_fit(&[(1e6, 2e-3)]).is_some_and(|(r, _)| (r / 5e8 - 1.0).abs() < 1e-9));
    }

    #[test]
    fn a_contraction_ramp_excludes_the_floor_charged_as_dispatch() {
        // t = 10 us + flops / 1e12; the device's floor is 4 us: ramp 6 us of flops.
        let pts: Vec<(KernelWork, f64)> = [1e6, 1e8, 1e9]
            .iter()
            .map(|&f| (work(f, 1e3), 10e-6 + f / 1e12))
            .collect();
        let r = fit(&pts, 4e-6);
        assert!((r.flops_per_s / 1e12 - 1.0).abs() < 1e-9, "{r:?}");
        assert!((r.half_flops - 6e6).abs() < 1.0, "{r:?}");
        // A floor above the intercept leaves no ramp.
        assert_eq!(fit(&pts, 20e-6).half_flops, 0.0);
    }

    #[test]
    fn streaming_classes_take_rates_from_slopes_and_the_chain() {
        // Two adds: 2 us fixed + bytes at 1e11 B/s; the chain: 320e6 flops in 2 us + 1 ms.
        let pts = [
            (work(1e6, 12e6), 2e-6 + 12e6 / 1e11),
            (work(16e6, 192e6), 2e-6 + 192e6 / 1e11),
            (work(320e6, 8e6), 1.002e-3),
        ];
        let r = streaming_fit(&pts, true, 2e-6);
        assert!((r.bytes_per_s / 1e11 - 1.0).abs() < 1e-9, "{r:?}");
        assert!((r.flops_per_s / 320e9 - 1.0).abs() < 1e-6, "{r:?}");
        assert!(r.half_flops.abs() < 1.0, "{r:?}");
        // An intercept above the floor (a CPU waking its threads) stays as ramp: 8 us.
        let r = streaming_fit(&pts, true, -6e-6);
        assert!((r.half_flops / r.flops_per_s - 8e-6).abs() < 1e-12, "{r:?}");
        // Without a chain both rates are slopes of the same probes.
        let r = streaming_fit(&pts[..2], false, 0.0);
        assert!(
            (r.flops_per_s / (15e6 / (180e6 / 1e11)) - 1.0).abs() < 1e-9,
            "{r:?}"
        );
    }

    #[test]
    fn the_elementwise_chain_is_one_fused_kernel_counted_by_the_cost_model() {
        let p = fused_chain("2, 8", 16);
        let (w, _) = probe_work(&p, "cpu").unwrap();
        assert_eq!(w.class, KernelKind::Elementwise);
        assert_eq!(w.flops, 32.0 * 16.0, "{w:?}");
        let graph = rafter_ir::text::parse_graph(&p.text).unwrap();
        let program = rafter_compiler::compile(&graph, &Default::default())
            .unwrap()
            .program;
        assert_eq!(
            program.kernels.len(),
            2,
            "the chain must fuse into one kernel (and the sink its own)"
        );
    }

    /// On the CPU each convolution class's probes are convolutions the cost model puts in
    /// that class (so the Winograd ones rate `winograd_conv` and only they do); other
    /// devices have no `winograd_conv` class and rate every 3x3 probe as `conv`.
    #[test]
    fn conv_probes_are_of_their_class() {
        let classes = |device: &str| -> Vec<&'static str> {
            class_probes(device).into_iter().map(|(c, _)| c).collect()
        };
        assert!(classes("cpu").contains(&"winograd_conv"));
        assert!(!classes("vulkan").contains(&"winograd_conv"));
        assert_eq!(
            class_probes("vulkan")
                .iter()
                .find(|(c, _)| *c == "conv")
                .map(|(_, p)| p.len()),
            Some(5)
        );
        for (class, probes) in class_probes("cpu") {
            if !class.ends_with("conv") {
                continue;
            }
            for p in probes {
                let (w, _) = probe_work(&p, "cpu").unwrap();
                assert_eq!(w.detail, Some(class), "{}", p.what);
            }
        }
    }

    /// The conv probes' filters and the GEMM probes' weights are constants (folded into
    /// the program's weights, as a model's are), and the kernel a conv probe is rated by
    /// is its convolution (not the layout transposes around it, which a model's plan
    /// costs as kernels of their own).
    #[test]
    fn conv_and_gemm_probes_have_constant_weights() {
        for p in [
            conv(64, 8, 16, 3, 1, 1),
            conv(16, 8, 32, 1, 1, 1),
            conv(16, 8, 16, 3, 1, 16),
            conv_of("f16", 16, 8, 16, 3, 1, 1),
        ] {
            let graph = rafter_ir::text::parse_graph(&p.text).unwrap();
            assert_eq!(graph.inputs.len(), 1, "{}: only x is an input", p.what);
            let program = rafter_compiler::compile(&graph, &Default::default())
                .unwrap()
                .program;
            assert!(
                !program.weights.is_empty(),
                "{}: the filter is a weight",
                p.what
            );
            let (w, kernel) = probe_work(&p, "cpu").unwrap();
            assert!(w.flops > 0.0, "{}: {w:?}", p.what);
            assert!(kernel.contains("conv"), "{}: main kernel {kernel}", p.what);
        }
        // The GEMM probes multiply by a constant weight, as a model's projections do;
        // the batched one (attention) multiplies two inputs.
        for p in [gemm(8, 16, 32), gemm_of("f16", 8, 16, 32)] {
            let graph = rafter_ir::text::parse_graph(&p.text).unwrap();
            assert_eq!(graph.inputs.len(), 1, "{}: only a is an input", p.what);
            let program = rafter_compiler::compile(&graph, &Default::default())
                .unwrap()
                .program;
            assert!(!program.weights.is_empty(), "{}: the weight", p.what);
            let (w, _) = probe_work(&p, "cpu").unwrap();
            assert!(w.flops >= 2.0 * 8.0 * 16.0 * 32.0, "{}: {w:?}", p.what);
        }
        // The bias (and a convolution's ReLU) fuse into the probe's main kernel, as a
        // model's epilogues do, so the probe's time holds them.
        for (p, ops) in [
            (conv(16, 8, 32, 1, 1, 1), &["add", "relu"][..]),
            (conv(64, 8, 16, 3, 1, 1), &["add", "relu"][..]),
            (gemm(8, 16, 32), &["add"][..]),
        ] {
            let graph = rafter_ir::text::parse_graph(&p.text).unwrap();
            let program = rafter_compiler::compile(&graph, &Default::default())
                .unwrap()
                .program;
            let (_, name) = probe_work(&p, "cpu").unwrap();
            let kernel = program.kernels.iter().find(|k| k.name == name).unwrap();
            let body = rafter_ir::text::print_graph(&kernel.body);
            for op in ops {
                assert!(body.contains(op), "{}: {op} not fused into {body}", p.what);
            }
        }
        let graph = rafter_ir::text::parse_graph(&batched_gemm(2, 4, 8, 4).text).unwrap();
        assert_eq!(graph.inputs.len(), 2);
        let h = hex_f32s(3, 0.5);
        assert_eq!(h.len(), 24);
        let v: Vec<f32> = (0..3)
            .map(|i| {
                let b = u32::from_str_radix(&h[i * 8..i * 8 + 8], 16).unwrap();
                f32::from_le_bytes(b.to_be_bytes())
            })
            .collect();
        assert!(v.iter().all(|x| x.abs() < 0.5) && v[0] != v[1], "{v:?}");
    }
}
