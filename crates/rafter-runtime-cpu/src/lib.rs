//! The CPU backend of rafter's runtime: runs a program's CPU kernels on a
//! [`rafter_hal_cpu`] device.
//!
//! The runtime (`rafter-runtime`) knows devices only through the HAL and the executable
//! loaders registered with its [`DeviceSet`]; this crate is the CPU's loader
//! ([`CpuLoader`]) and everything it dispatches to. Register it with the device:
//!
//! ```no_run
//! let devices = rafter_runtime_cpu::devices()?;          // the CPU device + its loader
//! # let program: rafter_ir::program::Program = unimplemented!();
//! let session = rafter_runtime::Session::new(program, &devices)?;
//! # Ok::<(), rafter_runtime::RuntimeError>(())
//! ```
//!
//! # The paths of a CPU kernel
//! - [`native`](crate::native) (*native kernels*): a kernel body a hand-written kernel
//!   covers (matmul/gemm and conv with their fused epilogues, channels-last convolutions
//!   and depthwise blocks, pooling, data movement, layer norm, softmax, elementwise bodies
//!   as tile programs) runs on slices borrowed from the dispatch's bindings and the
//!   weights' bytes, writing its results in place. Chosen per kernel when the session is
//!   built; shapes a kernel does not cover fall through, per call, to
//! - the *tensor path* (`dispatch`, `fallback`): operands decoded into owned tensors, the
//!   body run by an accelerated tensor kernel (a GEMM-first body, a single transpose or
//!   layer norm, an elementwise tile program) or by the reference executor, which covers
//!   every op. It is the `interpreter` feature (default on): a deploy-only build without it
//!   links no reference executor, and refuses, when the session loads, a program with a
//!   kernel no native kernel covers.
//!
//! # Threads
//! Two kinds of threads run CPU work, with two jobs. The device's **command workers**
//! (`rafter-hal-cpu`) run command buffers: each dispatch is one job on one worker. A
//! kernel splits its own work (GEMM tiles, rows of a convolution) over the session's
//! **kernel threads**, a [`rafter_kernels_cpu::WorkerPool`] whose caller, the command
//! worker running the dispatch, takes tasks too. Every kernel of a session, native or on
//! the tensor path, shares that one pool. So with more than one kernel thread a session's
//! dispatches run one after another (each with all the kernel threads), and only with one
//! do independent dispatches run side by side on the command workers.

#![warn(missing_docs)]

#[cfg(any(test, feature = "interpreter"))]
mod convert;
mod dispatch;
mod elementwise_tile;
#[cfg(feature = "interpreter")]
mod fallback;
mod loader;
mod native;
mod section;

use std::sync::Arc;

use rafter_hal_cpu::CpuDevice;
use rafter_runtime::{hal, DeviceSet, ExecutableLoader, Result};

#[cfg(any(test, feature = "interpreter"))]
pub use convert::{from_reference, to_reference};
pub use loader::CpuLoader;
pub use rafter_hal_cpu::CpuDeviceOptions;

/// Whether this build has the interpreter (the `interpreter` feature): without it, a kernel
/// no native kernel covers is refused when a session loads it.
pub const INTERPRETER: bool = cfg!(feature = "interpreter");

/// The CPU's executable loader, to register with a [`DeviceSet`].
pub fn loader() -> Arc<dyn ExecutableLoader> {
    Arc::new(CpuLoader)
}

/// A set holding one CPU device named `cpu`, with default options (a worker per core), and
/// the CPU's loader.
pub fn devices() -> Result<DeviceSet> {
    devices_with(CpuDeviceOptions::default())
}

/// A set holding one CPU device built with `options`, under `options.name` (`cpu` by
/// default), and the CPU's loader. Pass a [`rafter_runtime::ChromeTrace`] as `trace_sink`
/// to trace it.
pub fn devices_with(options: CpuDeviceOptions) -> Result<DeviceSet> {
    let name = options.name.clone();
    let device = CpuDevice::new(options).map_err(hal("opening the CPU device"))?;
    Ok(DeviceSet::new()
        .with(name, Arc::new(device))
        .with_loader(loader()))
}
