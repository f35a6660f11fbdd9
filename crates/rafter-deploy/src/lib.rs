//! rafter's deploy-only runtime: open a compiled artifact (`.rfa`) and run it.
//!
//! What an edge deployment links: the runtime ([`rafter_runtime`]), the CPU backend's
//! native kernels and, with the `vulkan` feature (default on), the Vulkan loader. No
//! importer, no compiler, no reference executor: an artifact is compiled elsewhere
//! (`rafter compile`), and a kernel no native CPU kernel covers is refused when the
//! session opens, naming it (the `interpreter` feature links the reference executor for
//! such artifacts).
//!
//! ```no_run
//! let session = rafter_deploy::open("model.rfa", &rafter_deploy::Options::default())?;
//! let x = rafter_deploy::read_npy("x.npy".as_ref())?;
//! let outputs = session.run(vec![x], std::time::Duration::from_secs(60))?;
//! # Ok::<(), rafter_deploy::DeployError>(())
//! ```

#![warn(missing_docs)]

use std::path::Path;

use rafter_artifact::Artifact;
use rafter_ir::program::Program;
use rafter_runtime::{DeviceSet, SessionOptions};
use rafter_runtime_cpu::CpuDeviceOptions;

pub use rafter_runtime::{CallHandle, RuntimeError, Session, Tensor};

/// What went wrong: the artifact, a device, the session, or a tensor file.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The artifact is missing, corrupt or of another version (the reader's message names
    /// the file, section and field).
    #[error("invalid artifact: {0}")]
    Artifact(#[from] rafter_artifact::ArtifactError),
    /// A device the artifact needs cannot be opened, or an input is missing.
    #[error("{0}")]
    Device(String),
    /// The session refused the program, or a call failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A `.npy` file could not be read.
    #[error(transparent)]
    Npy(#[from] rafter_ir::npy::NpyError),
    /// A tensor file's contents, or writing one.
    #[error("{path}: {msg}")]
    Tensor {
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
}

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Threads of the CPU device and of one CPU kernel (0: one per core).
    pub threads: usize,
}

/// The devices `program` names: the CPU (always: it runs copies and CPU kernels), and the
/// Vulkan device when a kernel or arena is on `vulkan`.
pub fn devices_for(program: &Program, options: &Options) -> Result<DeviceSet, DeployError> {
    let cpu = CpuDeviceOptions {
        worker_threads: options.threads,
        ..CpuDeviceOptions::default()
    };
    #[allow(unused_mut)]
    let mut set = rafter_runtime_cpu::devices_with(cpu)?;
    let on_vulkan = program.kernels.iter().any(|k| k.device == "vulkan")
        || program.arenas.iter().any(|a| a.device == "vulkan");
    if on_vulkan {
        #[cfg(feature = "vulkan")]
        rafter_runtime_vulkan::add_device(&mut set, Default::default()).map_err(|e| {
            DeployError::Device(format!(
                "the artifact runs kernels on `vulkan`, but the Vulkan device cannot be opened: {e}"
            ))
        })?;
        #[cfg(not(feature = "vulkan"))]
        return Err(DeployError::Device(
            "the artifact runs kernels on `vulkan`, and this build has no Vulkan support \
             (built without rafter-deploy's `vulkan` feature)"
                .into(),
        ));
    }
    Ok(set)
}

/// Opens the artifact at `path` (memory-mapped and validated; weights stay in the map)
/// and binds it to the devices it names.
pub fn open(path: impl AsRef<Path>, options: &Options) -> Result<Session, DeployError> {
    let artifact = Artifact::open(path)?;
    let devices = devices_for(artifact.program(), options)?;
    let session_options = SessionOptions::new().kernel_threads(options.threads);
    Ok(Session::from_artifact(artifact, &devices, session_options)?)
}

/// Reads a `.npy` file as a tensor.
pub fn read_npy(path: &Path) -> Result<Tensor, DeployError> {
    let (dtype, dims, payload) = rafter_ir::npy::read(path)?;
    Tensor::from_le_bytes(dtype, &dims, &payload).map_err(|e| DeployError::Tensor {
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

/// Writes a tensor as a `.npy` file.
pub fn write_npy(path: &Path, t: &Tensor) -> std::io::Result<()> {
    std::fs::write(
        path,
        rafter_ir::npy::encode(t.dtype(), t.shape(), t.le_bytes()),
    )
}
