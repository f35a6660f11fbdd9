//! The paths a test's model can take from imported graph to outputs.
//!
//! - [`Backend::Reference`]: the reference executor runs the imported graph directly (the
//!   oracle every other path is held to).
//! - [`Backend::Compiled`]: the whole "compile once, run asynchronously" pipeline —
//!   `rafter-opt` compiles the graph to a program, the program is written as artifact bytes
//!   and opened again through [`Artifact::from_bytes`] (so the artifact's writer, reader and
//!   validation are on the path), and a runtime [`Session`] on the CPU device runs each data
//!   set. A failure names the stage (`compile`, `artifact`, `session`, `run`).
//! - [`Backend::Vulkan`]: the compiled path for `--target vulkan`: kernels the SPIR-V
//!   generator supports run on the Vulkan device (their modules travel in the artifact's
//!   `vulkan` section), the rest on the CPU device.

use crate::suite::one_line;
use crate::Outcome;
use rafter_ir::Graph;
use rafter_reference::Tensor;
use rafter_runtime::{DeviceSet, RuntimeError, Session, SessionOptions};
use rafter_runtime_cpu::{from_reference, to_reference, CpuDeviceOptions};
use std::time::Duration;

/// Which path runs a test's model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The reference executor over the imported graph.
    #[default]
    Reference,
    /// Compile → artifact bytes → reopen → runtime session on the CPU device.
    Compiled,
    /// As `Compiled`, for `--target vulkan`, on the Vulkan and CPU devices.
    Vulkan,
}

impl Backend {
    /// The word the CLI and reports use.
    pub fn word(self) -> &'static str {
        match self {
            Backend::Reference => "reference",
            Backend::Compiled => "compiled",
            Backend::Vulkan => "compiled for vulkan",
        }
    }

    /// Whether the path compiles the model and runs it on the runtime.
    pub fn is_compiled(self) -> bool {
        self != Backend::Reference
    }
}

/// The longest a compiled call may take before the test fails (the suite's real CNNs take
/// seconds; a call that never completes is a runtime ordering bug, reported, not a hang).
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Devices the compiled path runs on: one CPU device shared by every test of a suite run,
/// with one worker thread, since the suite already runs one test per core.
/// For [`Backend::Vulkan`], the Vulkan device too, under `vulkan`.
pub(crate) fn suite_devices(backend: Backend) -> Result<DeviceSet, String> {
    #[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
    let mut set = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
        worker_threads: 1,
        ..CpuDeviceOptions::default()
    })
    .map_err(|e| format!("opening the CPU device: {e}"))?;
    if backend == Backend::Vulkan {
        #[cfg(feature = "vulkan")]
        rafter_runtime_vulkan::add_device(&mut set, Default::default())
            .map_err(|e| format!("opening the Vulkan device: {e}"))?;
        #[cfg(not(feature = "vulkan"))]
        return Err("this build has no Vulkan support (the `vulkan` feature)".into());
    }
    Ok(set)
}

/// A model ready to run data sets: the graph itself, or a session over its compiled form.
pub(crate) enum Prepared<'g> {
    Graph(&'g Graph),
    Session(Session),
}

impl<'g> Prepared<'g> {
    /// Prepares `graph` for `backend`; a compiled path that fails on the way is a
    /// [`Outcome::Fail`] naming the stage.
    pub(crate) fn new(
        graph: &'g Graph,
        backend: Backend,
        devices: Option<&DeviceSet>,
    ) -> Result<Prepared<'g>, Outcome> {
        match (backend, devices) {
            (Backend::Reference, _) => Ok(Prepared::Graph(graph)),
            (_, Some(devices)) => compile_session(graph, backend, devices)
                .map(Prepared::Session)
                .map_err(|e| Outcome::Fail(one_line(&e))),
            (_, None) => {
                let devices = suite_devices(backend).map_err(Outcome::Fail)?;
                Prepared::new(graph, backend, Some(&devices))
            }
        }
    }

    /// How many kernels the compiled model has (0 on the reference path).
    pub(crate) fn kernels(&self) -> usize {
        match self {
            Prepared::Graph(_) => 0,
            Prepared::Session(s) => s.program().kernels.len(),
        }
    }

    /// How many of the model's kernels run on the Vulkan device (0 on other paths).
    pub(crate) fn gpu_kernels(&self) -> usize {
        match self {
            Prepared::Graph(_) => 0,
            Prepared::Session(s) => s
                .program()
                .kernels
                .iter()
                .filter(|k| k.device == "vulkan")
                .count(),
        }
    }

    /// Runs one data set. Errors: a [`Outcome::Skip`] when the reference executor reports a
    /// missing capability, else a [`Outcome::Fail`].
    pub(crate) fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, Outcome> {
        match self {
            Prepared::Graph(g) => rafter_reference::run(g, inputs).map_err(|e| {
                if e.is_unsupported() {
                    Outcome::Skip(one_line(&e.to_string()))
                } else {
                    Outcome::Fail(one_line(&format!("run: {e}")))
                }
            }),
            Prepared::Session(s) => {
                let fail = |e: String| Outcome::Fail(one_line(&format!("run (compiled): {e}")));
                let inputs = inputs
                    .iter()
                    .map(from_reference)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(fail)?;
                let outputs = s
                    .run(inputs, CALL_TIMEOUT)
                    .map_err(|e| Outcome::Fail(one_line(&run_error(&e))))?;
                outputs
                    .iter()
                    .map(to_reference)
                    .collect::<Result<_, _>>()
                    .map_err(fail)
            }
        }
    }
}

/// `graph` compiled for `backend`'s target through `rafter-compiler` (program and every
/// device's section, the SPIR-V of its Vulkan kernels included), written as artifact
/// bytes, reopened and bound to `devices`.
fn compile_session(
    graph: &Graph,
    backend: Backend,
    devices: &DeviceSet,
) -> Result<Session, String> {
    let target = match backend {
        Backend::Vulkan => "vulkan",
        _ => "cpu",
    };
    let options = rafter_compiler::CompileOptions {
        target: rafter_compiler::target(target).map_err(|e| format!("compile: {e}"))?,
        ..rafter_compiler::CompileOptions::default()
    };
    let compiled = rafter_compiler::compile(graph, &options).map_err(|e| match e {
        rafter_compiler::Error::Codegen { .. } => format!("codegen: {e}"),
        e => format!("compile: {e}"),
    })?;
    let artifact = compiled
        .to_artifact()
        .map_err(|e| format!("artifact: {e}"))?;
    Session::from_artifact(artifact, devices, SessionOptions::new())
        .map_err(|e| format!("session: {e}"))
}

fn run_error(e: &RuntimeError) -> String {
    format!("run (compiled): {e}")
}
