//! rafter's hardware abstraction layer, in the spirit of IREE's HAL and Vulkan.
//!
//! The runtime drives every device through these types and nothing else; a device crate
//! (`rafter-hal-cpu`, `rafter-hal-vulkan`, a plug-in NPU driver) implements them. This crate
//! has no device code, only the contracts and the host timeline semaphore.
//!
//! # Objects
//! - [`Device`]: a description ([`DeviceInfo`]: memory kinds, limits, capabilities,
//!   roofline), allocation, semaphores, queues, command buffers and executables.
//! - [`Buffer`] of a [`MemoryKind`], bound to commands as [`BufferRange`]s, mapped by the host
//!   when host-visible.
//! - [`Semaphore`]: a timeline (a `u64` that only grows) with a sticky failure state. The
//!   only synchronisation primitive; one type serves every device.
//! - [`CommandBufferBuilder`] records dispatches, copies, fills and barriers, validated as
//!   they are recorded, into an immutable [`CommandBuffer`].
//! - [`Queue::submit`] runs a command buffer after its wait semaphores are reached and
//!   signals its signal semaphores when it completes. It returns at once.
//! - [`Executable`]: device code with named entry points, loaded from an [`ExecutableSpec`].
//!
//! # The rules, in one place
//! 1. **Nothing blocks but a host wait.** Allocation, recording and submission return at once;
//!    the host blocks only in [`Semaphore::wait`] (always with a timeout), and when dropping
//!    a device (which waits for its running commands).
//! 2. **Semaphores are the only ordering.** Between submissions, even on one queue; within a
//!    command buffer, barriers order segments and everything else may run concurrently.
//! 3. **Errors are synchronous or they are semaphore failures.** A call that can check its
//!    arguments returns [`HalError`] and leaves no trace. Failures while work runs fail the
//!    submission's signal semaphores; failure is sticky and flows through every submission
//!    that waits on a failed semaphore, so it reaches the host (and every other device) as
//!    [`SemaphoreError::Failed`] with the original reason, never as a hang.
//! 4. **Nothing reads or writes outside a buffer.** Ranges are validated when recorded and
//!    when mapped.
//! 5. **Handles keep what they need alive.** Everything is reference counted; a submission
//!    keeps its command buffer, buffers and executables alive until it completes.

#![warn(missing_docs)]

mod command;
mod device;
mod error;
mod executable;
mod memory;
mod semaphore;
mod trace;

pub use command::{Command, CommandBuffer, CommandBufferBuilder, Dispatch, FillPattern};
pub use device::{
    submit_then_wait, submitter_will_wait, Capabilities, Device, DeviceId, DeviceInfo, DeviceKind,
    Limits, Queue, QueueImpl,
};
pub use error::{HalError, Result, SemaphoreError};
pub use executable::{
    Executable, ExecutableImpl, ExecutablePayload, ExecutableSpec, FORMAT_CPU_KERNELS, FORMAT_SPIRV,
};
pub use memory::{check_range, Buffer, BufferImpl, BufferRange, MemoryKind, MemoryKindInfo};
pub use semaphore::{HostSemaphore, Semaphore, SemaphoreImpl, TimepointCallback};
pub use trace::{MemoryTraceSink, TraceEvent, TraceKind, TraceSink};
