//! What a model path holds, and the compile pipeline the commands share.
//!
//! A path is an artifact when its file starts with the artifact magic (`RAFTRFA\0`), and
//! an ONNX model otherwise: the extension decides nothing, so a renamed or extension-less
//! file still runs the right way.

use crate::progress::Steps;
use anyhow::{Context, Result};
use bytes::Bytes;
use rafter_artifact::{Artifact, MAGIC};
use rafter_compiler::{CompileOptions, Compiled, Stage, Target, WeightFormat};
use rafter_ir::program::Program;
use rafter_ir::{Graph, Symbol};
use rafter_runtime::{DeviceSet, SessionOptions};
use rafter_runtime_cpu::CpuDeviceOptions;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The two kinds of model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Onnx,
    Artifact,
}

/// Reads the first bytes of `path` to tell an artifact from an ONNX model.
pub fn file_kind(path: &Path) -> Result<FileKind> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut head = [0u8; MAGIC.len()];
    let mut filled = 0;
    while filled < head.len() {
        let n = file
            .read(&mut head[filled..])
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(if head[..filled] == MAGIC[..] {
        FileKind::Artifact
    } else {
        FileKind::Onnx
    })
}

/// Opens and validates an artifact (memory-mapped; checksums verified). The error names the
/// file and, for a corrupt file, the section and field at fault.
pub fn open_artifact(path: &Path) -> Result<Artifact> {
    Artifact::open(path).map_err(|e| anyhow::anyhow!("invalid artifact: {e}"))
}

/// `--target` values (`rafter_compiler::target`): `auto` takes the devices this machine
/// has (Vulkan only when a usable device is found).
pub fn parse_target(word: &str) -> Result<Target> {
    if word == "auto" {
        let mut names = vec!["cpu"];
        if vulkan_present() {
            names.push("vulkan");
        }
        let mut set = names.join(",");
        if names.len() == 1 {
            set = "cpu".into();
        }
        return Ok(rafter_compiler::target(&set)?);
    }
    Ok(rafter_compiler::target(word)?)
}

/// Whether a usable Vulkan device is present.
fn vulkan_present() -> bool {
    #[cfg(feature = "vulkan")]
    {
        rafter_hal_vulkan::list_devices()
            .is_ok_and(|l| l.iter().any(|c| c.missing_required().is_empty()))
    }
    #[cfg(not(feature = "vulkan"))]
    false
}

/// An artifact's executable sections, by device (each device's loader validates its own).
pub fn artifact_executables(artifact: &Artifact) -> Vec<(String, Bytes)> {
    artifact
        .devices()
        .filter_map(|d| Some((d.to_string(), artifact.executable(d)?)))
        .collect()
}

/// Whether a program uses the Vulkan device.
pub fn uses_vulkan(program: &Program) -> bool {
    program.kernels.iter().any(|k| k.device == "vulkan")
        || program.arenas.iter().any(|a| a.device == "vulkan")
}

/// The devices `program` needs: the CPU (with `cpu`), and the Vulkan device when a kernel
/// or arena is on `vulkan` (an error saying so when it cannot be opened). The CPU's trace
/// sink, if any, traces the Vulkan device too (timed by GPU timestamps).
pub fn devices_for(program: &Program, cpu: CpuDeviceOptions) -> Result<DeviceSet> {
    open_devices(uses_vulkan(program), cpu)
}

/// The CPU (with `cpu`) and, with `vulkan`, the Vulkan device (an error saying so when
/// it cannot be opened), sharing the CPU's trace sink.
pub fn open_devices(vulkan: bool, cpu: CpuDeviceOptions) -> Result<DeviceSet> {
    #[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
    let trace_sink = cpu.trace_sink.clone();
    #[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
    let mut set = rafter_runtime_cpu::devices_with(cpu)?;
    if vulkan {
        #[cfg(feature = "vulkan")]
        {
            let options = rafter_runtime_vulkan::VulkanDeviceOptions {
                trace_sink,
                pipeline_cache_path: pipeline_cache_path(),
                ..Default::default()
            };
            rafter_runtime_vulkan::add_device(&mut set, options).map_err(|e| {
                anyhow::anyhow!(
                    "the program runs kernels on `vulkan`, but the Vulkan device cannot be \
                     opened: {e}"
                )
            })?;
        }
        #[cfg(not(feature = "vulkan"))]
        anyhow::bail!(
            "the program runs kernels on `vulkan`, and this build has no Vulkan support \
             (built without the `vulkan` feature)"
        );
    }
    Ok(set)
}

/// Where the Vulkan pipeline cache lives between runs: `RAFTER_PIPELINE_CACHE` (empty:
/// none), else `$XDG_CACHE_HOME/rafter/vulkan-pipelines.bin` or
/// `~/.cache/rafter/vulkan-pipelines.bin`. Creating a model's GPU pipelines takes seconds on
/// some drivers (8.5 s for BERT-base on the H100's); with the cache, only the first run pays.
pub fn pipeline_cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RAFTER_PIPELINE_CACHE") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("rafter").join("vulkan-pipelines.bin"))
}

/// A word on stderr when opening a session on Vulkan took long (`took`): that is pipeline
/// creation, which the pipeline cache makes a one-time cost.
pub fn note_slow_open(took: Duration) {
    if took.as_secs_f64() > 1.0 {
        let cache = pipeline_cache_path().map_or_else(
            || "no pipeline cache (RAFTER_PIPELINE_CACHE is empty)".to_string(),
            |p| format!("pipelines are cached in {} for the next run", p.display()),
        );
        eprintln!(
            "note: opening the session took {}, mostly creating GPU pipelines; {cache}",
            human_time(took)
        );
    }
}

/// `options` with `executables` added.
pub fn with_executables(
    mut options: SessionOptions,
    executables: &[(String, Bytes)],
) -> SessionOptions {
    for (device, code) in executables {
        options = options.executable(device.clone(), code.clone());
    }
    options
}

/// `98 kernels`, or `98 kernels (12 on vulkan)`.
pub fn kernel_count(program: &Program) -> String {
    let n = program.kernels.len();
    match program
        .kernels
        .iter()
        .filter(|k| k.device == "vulkan")
        .count()
    {
        0 => format!("{n} kernels"),
        v => format!("{n} kernels ({v} on vulkan)"),
    }
}

/// `cpu`, or `cpu+vulkan (N on vulkan)`: where a program's kernels run.
pub fn placement_summary(program: &Program) -> String {
    let on_vulkan = program
        .kernels
        .iter()
        .filter(|k| k.device == "vulkan")
        .count();
    if uses_vulkan(program) {
        format!("cpu+vulkan ({on_vulkan} on vulkan)")
    } else {
        "cpu".to_string()
    }
}

/// `--cpu-weights`: `f32`, `f16` or `bf16`.
pub fn parse_cpu_weights(word: &str) -> Result<WeightFormat> {
    match word {
        "f32" => Ok(WeightFormat::F32),
        "f16" => Ok(WeightFormat::F16),
        "bf16" => Ok(WeightFormat::Bf16),
        other => anyhow::bail!("--cpu-weights {other}: expected f32, f16 or bf16"),
    }
}

/// Imports an ONNX file, as a progress step.
pub fn import(path: &Path, steps: &Steps) -> Result<Graph> {
    steps.step("import");
    Ok(rafter_import::import_onnx_file(path)?.graph)
}

/// Compiles `graph` for `target` with `bounds`, a progress step per compiler stage.
pub fn compile(
    graph: &Graph,
    target: Target,
    bounds: Vec<(Symbol, i64)>,
    steps: &Steps,
) -> Result<Compiled> {
    compile_with(
        graph,
        CompileOptions {
            target,
            bounds,
            ..CompileOptions::default()
        },
        steps,
    )
}

/// [`compile`] with every option: the program and its devices' executable sections
/// (SPIR-V for `vulkan` kernels, generated now).
pub fn compile_with(graph: &Graph, options: CompileOptions, steps: &Steps) -> Result<Compiled> {
    crate::dims::check_bounds_reachable(graph, &options.bounds)?;
    let compiled = rafter_compiler::compile_observed(graph, &options, &mut |stage| {
        steps.step(match stage {
            Stage::Optimize => "optimise",
            Stage::Lower => "fuse and lower",
            Stage::PlanMemory => "plan memory",
        })
    })
    .context("compiling")?;
    Ok(compiled)
}

/// Progress steps of [`compile`]: one per compiler [`Stage`].
pub const COMPILER_STAGES: u64 = 3;

/// Progress steps of [`import`] and [`compile`] together.
pub const COMPILE_STEPS: u64 = 1 + COMPILER_STAGES;

/// Writes a compiled program as an artifact at `path`, as a progress step; returns the
/// file's length.
pub fn write_artifact(compiled: &Compiled, path: &Path, steps: &Steps) -> Result<u64> {
    steps.step("write weights");
    compiled
        .write(path)
        .with_context(|| format!("writing artifact {}", path.display()))
}

/// Total bytes of a program's weights.
pub fn weight_bytes(program: &Program) -> u64 {
    program.weights.iter().map(|w| w.bytes.len() as u64).sum()
}

/// `12.3 ms` or `4.56 s`.
pub fn human_time(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_magic_not_extension() {
        let dir = std::env::temp_dir().join(format!("rafter-cli-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let art = dir.join("model.onnx");
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[0; 56]);
        std::fs::write(&art, &bytes).unwrap();
        assert_eq!(file_kind(&art).unwrap(), FileKind::Artifact);
        let onnx = dir.join("model.rfa");
        std::fs::write(&onnx, b"\x08\x07").unwrap();
        assert_eq!(file_kind(&onnx).unwrap(), FileKind::Onnx);
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(file_kind(&empty).unwrap(), FileKind::Onnx);
        assert!(file_kind(&dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
