//! rafter's runtime: runs a compiled [`Program`](rafter_ir::program::Program) on HAL devices.
//!
//! ```text
//!  Session::new(program, &devices)          once: verify, open devices, bind weights
//!     │                                     (zero-copy on the CPU), build executables
//!     ▼
//!  session.submit(inputs) ─► CallHandle     per call, returns at once: check inputs, bind
//!     │                        │            symbols, size and place buffers, record every
//!     │                        │            step into command buffers, submit them chained
//!     │                        ▼            by timeline semaphores
//!     │                  handle.wait(t)     the one host wait: outputs, or the error
//!     ▼                                     naming the kernel that failed
//!  more calls, in flight at once (each has its own memory; weights are shared read-only)
//! ```
//!
//! # Memory of a call
//! - **Inputs and outputs** get their own allocations on the device that uses them
//!   (host-visible), per call.
//! - **Weights** are bound once, when the session is created. On a CPU device a weight is a
//!   [`BytesBuffer`] over the program's `Bytes` (memory-mapped from the artifact): no copy.
//! - **Arenas**: one allocation per arena per call. A buffer with a compile-time offset
//!   (`Storage::Arena { offset: Some(_) }`) goes there, after checking that it fits the size
//!   the arena was planned for; the others are placed per call by a first-fit over the
//!   program's liveness, above every compile-time buffer (see the `plan` module — the
//!   compiler's planner replaces it later).
//! - **Dynamic buffers** (`Storage::Dynamic`, and outputs whose dims the inputs do not
//!   determine) live in a per-call host slot table that CPU kernels read and write; they are
//!   touched only by host (CPU) kernels (see [`host`]).
//!
//! # Ordering
//! Consecutive steps on one device are recorded into one command buffer; a barrier goes
//! before a step that touches bytes (or a host slot) an earlier step of the same barrier
//! segment wrote, or writes bytes it read. Steps on another device form another command
//! buffer, which waits on the semaphores of the earlier ones it conflicts with. Nothing
//! orders one call against another.
//!
//! # Devices and backends
//! The runtime reaches devices only through the HAL ([`rafter_hal`]) and the executable
//! loaders registered with the [`DeviceSet`] ([`backend`]): `rafter-runtime-cpu` runs
//! kernels on the CPU device (native kernels on borrowed bytes, the reference executor as
//! their fallback), `rafter-runtime-vulkan` loads the artifact's SPIR-V on a Vulkan device.
//! A new device adds a backend crate and registers its loader; nothing here changes.
//!
//! # Tracing
//! [`ChromeTrace`] turns the devices' trace events into Chrome/Perfetto trace JSON.

#![warn(missing_docs)]

pub mod backend;
pub mod borrowed;
mod devices;
mod error;
pub mod host;
mod plan;
mod recorded;
mod session;
mod tensor;
mod trace;
mod weights;

pub use backend::{
    CopyEnd, DispatchArgs, ExecutableLoader, HostCopy, HostKernel, KernelOptions, LoadRequest,
    LoadedKernels, MatmulPrecision, NativeStats, Operand,
};
pub use borrowed::BorrowError;
pub use devices::DeviceSet;
pub use error::{hal, Result, RuntimeError};
pub use session::{CallHandle, Session, SessionOptions};
pub use tensor::{Element, Tensor, TensorError};
pub use trace::ChromeTrace;
pub use weights::{aligned, BytesBuffer, WEIGHT_ALIGN};
