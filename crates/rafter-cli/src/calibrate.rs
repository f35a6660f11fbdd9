//! `rafter devices --profile`: short calibration runs that give each device's cost
//! profile for the partitioner ([`rafter_opt::partition`]).
//!
//! Each calibration program is compiled and run through the same path as a model (the
//! compiler, the runtime session, the device's HAL), so what is measured is what a
//! kernel costs there, call overhead included:
//!
//! - a GEMM at two sizes (128³ and 512³): the contraction rate and its ramp (Hockney's
//!   n½, from the two times);
//! - a streaming add of 4 Mi f32 elements: bytes per second, and elements per second for
//!   the elementwise, reduction and data-movement classes;
//! - a one-element relu: the fixed cost of a dispatch.
//!
//! The link to an accelerator is the host's copy bandwidth (the runtime's cross-device
//! copies are host copies into mapped memory) with the accelerator's empty-call time as
//! its latency. Each figure is the median of several timed calls after warm-up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rafter_opt::partition::device::{class_name, CLASSES};
use rafter_opt::partition::{ClassRate, CostProfile, DeviceDescription, Link};
use rafter_reference::Bindings;
use rafter_runtime::{Session, SessionOptions};
use rafter_runtime_cpu::CpuDeviceOptions;

use crate::cmd_run::{gather_inputs, runtime_tensors};
use crate::model;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Timed calls per calibration program.
const CALLS: usize = 9;

/// Median seconds of one call of `graph_text` compiled for `target`.
fn time_call(graph_text: &str, target: &str) -> Result<f64> {
    let graph = rafter_ir::text::parse_graph(graph_text)
        .map_err(|e| anyhow::anyhow!("calibration graph: {e}"))?;
    let options = rafter_compiler::CompileOptions {
        target: rafter_compiler::target(target)?,
        ..Default::default()
    };
    let compiled = rafter_compiler::compile(&graph, &options)?;
    let executables = compiled.executables();
    let program = compiled.program;
    let devices = model::devices_for(&program, CpuDeviceOptions::default())?;
    let opts = model::with_executables(SessionOptions::new(), &executables);
    let mut bindings = Bindings::with([]);
    let inputs = runtime_tensors(&gather_inputs(
        &program.inputs,
        &[],
        &mut bindings,
        Some(1),
    )?)?;
    let session = Session::with_options(program, &devices, opts)?;
    for _ in 0..2 {
        session.run(inputs.clone(), TIMEOUT)?;
    }
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let call = inputs.clone();
        let start = Instant::now();
        session.run(call, TIMEOUT)?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[CALLS / 2])
}

fn gemm(n: usize) -> String {
    format!("graph @gemm(%a: f32[{n}, {n}], %b: f32[{n}, {n}]) -> (%y) {{\n  %y: f32[{n}, {n}] = matmul(%a, %b)\n}}")
}

const STREAM_ELEMS: usize = 4 << 20;

/// Measures `device` (`cpu` or an accelerator target name) and returns its description.
pub fn profile_device(device: &str) -> Result<DeviceDescription> {
    let ctx = |what: &str| format!("calibrating {device}: {what}");
    let empty = time_call(
        "graph @empty(%x: f32[1]) -> (%y) {\n  %y: f32[1] = unary{op = relu}(%x)\n}",
        device,
    )
    .with_context(|| ctx("empty dispatch"))?;
    let (n1, n2) = (128usize, 512usize);
    let t1 = time_call(&gemm(n1), device).with_context(|| ctx("gemm 128"))? - empty;
    let t2 = time_call(&gemm(n2), device).with_context(|| ctx("gemm 512"))? - empty;
    let (f1, f2) = (2.0 * (n1 as f64).powi(3), 2.0 * (n2 as f64).powi(3));
    // t = (f + n½) / F at both sizes.
    let flops = ((f2 - f1) / (t2 - t1).max(1e-9)).max(f2 / t2.max(1e-9));
    let half = (t1.max(0.0) * flops - f1).max(0.0);
    let stream = format!(
        "graph @stream(%a: f32[{STREAM_ELEMS}], %b: f32[{STREAM_ELEMS}]) -> (%y) {{\n  %y: f32[{STREAM_ELEMS}] = binary{{op = add}}(%a, %b)\n}}"
    );
    let ts = (time_call(&stream, device).with_context(|| ctx("streaming add"))? - empty).max(1e-9);
    let bytes_per_s = 12.0 * STREAM_ELEMS as f64 / ts;
    let elems_per_s = STREAM_ELEMS as f64 / ts;
    let classes: BTreeMap<&'static str, ClassRate> = CLASSES
        .into_iter()
        .map(|k| {
            let rate = match k {
                rafter_ir::program::KernelKind::Contraction => ClassRate {
                    flops_per_s: flops,
                    bytes_per_s,
                    half_flops: half,
                },
                rafter_ir::program::KernelKind::Opaque => ClassRate {
                    flops_per_s: elems_per_s / 10.0,
                    bytes_per_s: bytes_per_s / 10.0,
                    half_flops: 0.0,
                },
                _ => ClassRate {
                    flops_per_s: elems_per_s,
                    bytes_per_s,
                    half_flops: 0.0,
                },
            };
            (class_name(k), rate)
        })
        .collect();
    let link = (device != "cpu").then(|| Link {
        bytes_per_s: host_copy_bandwidth(),
        latency_s: empty,
        zero_copy: false,
    });
    Ok(DeviceDescription {
        name: device.to_string(),
        profile: CostProfile {
            classes,
            dispatch_s: empty,
            barrier_s: if device == "cpu" { 0.0 } else { empty / 2.0 },
        },
        memory_bytes: None,
        link,
    })
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
