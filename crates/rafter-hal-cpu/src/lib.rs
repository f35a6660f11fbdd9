//! rafter's CPU device: an implementation of the [`rafter_hal`] traits on host threads.
//!
//! ```text
//!  host ── Queue::submit ──► queue thread ── waits reached ──► worker pool (N threads)
//!                            (one per queue; holds            runs barrier segments;
//!                             waiting submissions)            signals / fails semaphores
//! ```
//!
//! Create a [`CpuDevice`] with [`CpuDeviceOptions`], load kernels ([`CpuKernels`]: closures
//! over a [`DispatchContext`]) and drive it through [`rafter_hal::Device`].

#![warn(missing_docs)]

mod device;
mod executable;
mod memory;
mod queue;
mod workers;

pub use device::{CpuDevice, CpuDeviceOptions};
pub use executable::{CpuExecutable, CpuKernel, CpuKernels, DispatchContext};
pub use memory::{BindingRead, BindingWrite, CpuBuffer, Element, ALIGNMENT};
