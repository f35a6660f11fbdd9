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
//!   CPU-only by construction (see the `cpu` module).
//!
//! # Ordering
//! Consecutive steps on one device are recorded into one command buffer; a barrier goes
//! before a step that touches bytes (or a host slot) an earlier step of the same barrier
//! segment wrote, or writes bytes it read. Steps on another device form another command
//! buffer, which waits on the semaphores of the earlier ones it conflicts with. Nothing
//! orders one call against another.
//!
//! # Kernels
//! CPU kernels whose body a native kernel covers (matmul/gemm and conv with their fused
//! bias, residual, relu, clip or scale; depthwise conv; max and global pooling; reshapes,
//! transposes, concat, gather; layer norm; masked softmax; elementwise bodies as tile
//! programs) run on slices borrowed from the bindings and the weights' bytes, writing
//! results in place (the `native` module). Everything else, and shapes a native
//! kernel does not cover, runs its body on the reference executor, except bodies that start
//! with an f32 matmul, whose product goes through `rafter-kernels-cpu`'s GEMM (see the
//! `fast` module), and single f32 transposes and layer norms run hand-written loops
//! (`fast_ops`); [`SessionOptions::reference_kernels`] turns all of these off.
//!
//! # Tracing
//! [`ChromeTrace`] turns the devices' trace events into Chrome/Perfetto trace JSON.

mod cpu;
mod devices;
mod error;
mod fast;
mod fast_ops;
mod native;
mod plan;
mod recorded;
mod session;
mod tile;
mod trace;
mod weights;

pub use cpu::HostKernel;
pub use devices::DeviceSet;
pub use error::{Result, RuntimeError};
pub use native::NativeStats;
pub use session::{CallHandle, Session, SessionOptions};
pub use trace::ChromeTrace;
pub use weights::BytesBuffer;

pub use rafter_hal_cpu::CpuDeviceOptions;
pub use rafter_reference::Tensor;
