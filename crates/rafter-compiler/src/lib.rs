//! rafter's compile driver: one call from a graph to an artifact.
//!
//! ```text
//!  Graph ─► rafter-opt (passes, fusion, lowering, placement over the target's backends,
//!           memory plan) ─► Program ─► each device's Backend::emit (the CPU descriptor,
//!           the SPIR-V modules, ...) ─► Compiled { program, sections } ─► .rfa / Artifact
//! ```
//!
//! Every frontend goes through [`compile`]: the command line (`rafter compile`, `rafter
//! run --compiled`), the conformance runner, and next the Python package and the LLM
//! path, which build their [`Graph`] themselves (see `rafter_ir::GraphBuilder`) rather than
//! import a file. Targets are named here ([`target`]): `cpu`, and `vulkan` when the crate
//! is built with its `vulkan` feature (the default). A new device adds its backend crate
//! and one arm to [`target`].

#![warn(missing_docs)]

mod profiles;

pub use profiles::{load_profiles, load_profiles_from, profiles_path, save_profiles};

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rafter_artifact::{Artifact, ArtifactError, ArtifactWriter};
use rafter_ir::program::Program;
use rafter_ir::Graph;
use rafter_opt::partition::{PlacementOptions, Strategy};
use rafter_opt::{Backend, CompileError, Section};

pub mod plan_cost;
pub mod plan_report;

pub use rafter_opt::prepack::WeightFormat;
pub use rafter_opt::{CompileOptions, HalfCompute, Stage, Target};

/// Why compiling failed: the stage and what it names.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A target this build does not know.
    #[error("unknown target `{name}` (available: {})", known.join(", "))]
    UnknownTarget {
        /// The name asked for.
        name: String,
        /// The targets this build has.
        known: Vec<&'static str>,
    },
    /// The optimiser or lowering failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A device backend could not generate its section.
    #[error("generating code for `{device}`: {msg}")]
    Codegen {
        /// The device whose backend failed.
        device: String,
        /// The backend's message (naming the kernel).
        msg: String,
    },
    /// A kernel runs on a device the target has no backend for.
    #[error("kernel `{kernel}` runs on `{device}`, which target `{target}` has no backend for")]
    NoBackend {
        /// The first kernel on that device.
        kernel: String,
        /// The device.
        device: String,
        /// The target's name.
        target: String,
    },
    /// A device profile file that cannot be read or parsed (the message names it).
    #[error("device profiles: {0}")]
    Profiles(String),
    /// Writing or reading the artifact.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
}

/// The targets this build compiles for, by name (besides `auto` and device sets).
pub fn target_names() -> Vec<&'static str> {
    let mut names = vec!["cpu"];
    if cfg!(feature = "vulkan") {
        names.push("vulkan");
    }
    names
}

/// The accelerator backend for device `name`, if this build has one (`None` for `cpu`).
fn accelerator(name: &str) -> Result<Option<Arc<dyn Backend>>, Error> {
    match name {
        "cpu" => Ok(None),
        #[cfg(feature = "vulkan")]
        "vulkan" => Ok(Some(Arc::new(rafter_codegen_spirv::SpirvBackend))),
        _ => Err(Error::UnknownTarget {
            name: name.to_string(),
            known: target_names(),
        }),
    }
}

/// The target called `name`:
/// - `cpu` (every kernel on the host), or `vulkan` (kernels the SPIR-V generator
///   supports on the Vulkan device, the rest on the CPU: greedy-by-support);
/// - `auto`: every device this build has, placed by the cost model
///   ([`rafter_opt::partition`]) with the stored profiles ([`load_profiles`]);
/// - a device set, `cpu,vulkan`: those devices, placed by the cost model.
pub fn target(name: &str) -> Result<Target, Error> {
    if name == "auto" {
        return target(&target_names().join(","));
    }
    if !name.contains(',') {
        return Ok(match accelerator(name)? {
            Some(b) => Target::cpu().with(b),
            None => Target::cpu(),
        });
    }
    let mut t = Target::cpu();
    let mut seen: Vec<&str> = Vec::new();
    for device in name.split(',').map(str::trim) {
        if seen.contains(&device) {
            continue;
        }
        seen.push(device);
        if let Some(b) = accelerator(device)? {
            t = t.with(b);
        }
    }
    if t.is_cpu_only() {
        return Ok(t);
    }
    let placement = PlacementOptions {
        strategy: Strategy::CostModel,
        profiles: load_profiles()?,
        ..PlacementOptions::default()
    };
    Ok(t.with_placement(placement))
}

/// A compiled program with each device's executable section: what an artifact holds.
#[derive(Debug)]
pub struct Compiled {
    /// The compiled program (weights are slices of the model's bytes).
    pub program: Program,
    /// `(device, section)` for every device a kernel runs on, sorted by device.
    pub sections: Vec<(String, Section)>,
}

/// Compiles `graph` for `options.target`: optimise, lower, place, plan memory
/// ([`rafter_opt::compile`]), then each device's code generation.
pub fn compile(graph: &Graph, options: &CompileOptions) -> Result<Compiled, Error> {
    compile_observed(graph, options, &mut |_| {})
}

/// [`compile`], calling `observe` as each compiler [`Stage`] starts (a progress bar).
pub fn compile_observed(
    graph: &Graph,
    options: &CompileOptions,
    observe: &mut dyn FnMut(Stage),
) -> Result<Compiled, Error> {
    let program = rafter_opt::compile_observed(graph, options, observe)?;
    package(program, &options.target)
}

/// Generates the executable sections of an already compiled `program` (every kernel
/// placed on the host or one of `target`'s accelerators).
pub fn package(program: Program, target: &Target) -> Result<Compiled, Error> {
    let mut devices: Vec<&str> = program.kernels.iter().map(|k| k.device.as_str()).collect();
    devices.sort_unstable();
    devices.dedup();
    let mut sections = Vec::with_capacity(devices.len());
    for device in devices {
        let backend = target.backend(device).ok_or_else(|| {
            let kernel = program.kernels.iter().find(|k| k.device == device);
            Error::NoBackend {
                kernel: kernel.map_or_else(String::new, |k| k.name.clone()),
                device: device.to_string(),
                target: target.name(),
            }
        })?;
        let section = backend.emit(&program).map_err(|msg| Error::Codegen {
            device: device.to_string(),
            msg,
        })?;
        sections.push((device.to_string(), section));
    }
    Ok(Compiled { program, sections })
}

impl Compiled {
    /// The sections as `(device, bytes)`, as a runtime session takes them
    /// (`SessionOptions::executable`).
    pub fn executables(&self) -> Vec<(String, Bytes)> {
        self.sections
            .iter()
            .map(|(d, s)| (d.clone(), Bytes::from(s.bytes.clone())))
            .collect()
    }

    /// An artifact writer for the program and its sections.
    pub fn writer(&self) -> ArtifactWriter<'_> {
        let mut w = ArtifactWriter::new(&self.program);
        for (device, s) in &self.sections {
            w = w.executable(device, s.bytes.clone(), s.align);
        }
        w
    }

    /// The artifact's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, Error> {
        Ok(self.writer().to_vec()?)
    }

    /// Writes the artifact to `path` (replacing a file there atomically); returns its
    /// length.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<u64, Error> {
        Ok(self.writer().write(path)?)
    }

    /// The artifact, in memory: written and read back through the validating reader, so
    /// an in-memory run takes the same path as a file.
    pub fn to_artifact(&self) -> Result<Artifact, Error> {
        Ok(Artifact::from_bytes(Bytes::from(self.to_bytes()?))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_kernels_cpu::artifact_section::CpuDescriptor;

    fn graph() -> Graph {
        rafter_ir::text::parse_graph(
            "graph @g(%x: f32[64]) -> (%y) {\n  %r: f32[64] = unary{op = relu}(%x)\n  %y: f32[64] = unary{op = neg}(%r)\n}",
        )
        .unwrap()
    }

    #[test]
    fn a_cpu_compile_carries_the_cpu_descriptor_into_the_artifact() {
        let c = compile(&graph(), &CompileOptions::default()).unwrap();
        assert_eq!(c.sections.len(), 1);
        let a = c.to_artifact().unwrap();
        assert_eq!(a.devices().collect::<Vec<_>>(), ["cpu"]);
        let d = CpuDescriptor::decode(&a.executable("cpu").unwrap(), "cpu").unwrap();
        assert_eq!(d.kernels as usize, a.program().kernels.len());
        assert_eq!(c.executables()[0].0, "cpu");
    }

    #[test]
    fn targets_by_name() {
        assert!(target("cpu").unwrap().is_cpu_only());
        let e = target("npu").unwrap_err().to_string();
        assert!(e.starts_with("unknown target `npu` (available: cpu"), "{e}");
        #[cfg(feature = "vulkan")]
        {
            let vk = target("vulkan").unwrap();
            assert_eq!(vk.name(), "vulkan");
            let options = CompileOptions {
                target: vk,
                ..CompileOptions::default()
            };
            let c = compile(&graph(), &options).unwrap();
            let devices: Vec<&str> = c.sections.iter().map(|(d, _)| d.as_str()).collect();
            assert_eq!(
                devices,
                ["vulkan"],
                "an elementwise chain runs wholly on the GPU"
            );
            assert_eq!(c.sections[0].1.align, 4);
            c.to_artifact().unwrap();
        }
    }

    #[test]
    fn auto_and_device_sets_place_by_the_cost_model() {
        use rafter_opt::partition::Strategy;
        std::env::set_var("RAFTER_DEVICE_PROFILES", "");
        assert_eq!(
            target("cpu").unwrap().placement().strategy,
            Strategy::Greedy
        );
        assert!(target("cpu,cpu").unwrap().is_cpu_only());
        let e = target("cpu,npu").unwrap_err().to_string();
        assert!(e.starts_with("unknown target `npu`"), "{e}");
        #[cfg(feature = "vulkan")]
        {
            assert_eq!(
                target("vulkan").unwrap().placement().strategy,
                Strategy::Greedy
            );
            for name in ["auto", "cpu,vulkan", "vulkan,cpu"] {
                let t = target(name).unwrap();
                assert_eq!(t.placement().strategy, Strategy::CostModel, "{name}");
                assert_eq!(t.name(), "vulkan");
            }
        }
    }

    #[test]
    fn a_kernel_on_a_device_without_a_backend_is_an_error() {
        let mut p = rafter_opt::compile(&graph(), &CompileOptions::default()).unwrap();
        p.kernels[0].device = "npu".into();
        let e = package(p, &Target::cpu()).unwrap_err().to_string();
        assert!(
            e.contains("runs on `npu`, which target `cpu` has no backend for"),
            "{e}"
        );
    }
}
