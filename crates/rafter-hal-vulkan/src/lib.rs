//! rafter's Vulkan 1.3 device: an implementation of the [`rafter_hal`] traits on `ash`.
//!
//! ```text
//!  host ── Queue::submit ──► scheduler ── waits resolvable ──► vkQueueSubmit2 ──► GPU
//!          (never blocks)    (deferred host-side while a            (timeline waits and
//!                             wait has no submitted signal)          signals, GPU to GPU)
//!                                                  monitor thread ◄── vkWaitSemaphores(any)
//!                                   (retires batches, fires callbacks, fails on device loss)
//! ```
//!
//! Why it is shaped this way:
//! - **Device addresses, not descriptors.** Kernels get each binding as a 64-bit
//!   `PhysicalStorageBuffer` pointer in push constants, so a tensor is bounded by
//!   `maxBufferSize`, not by `maxStorageBufferRange` (128 MiB on lavapipe, 4 GiB on most
//!   GPUs), and a dispatch needs no descriptor set updates.
//! - **Timeline semaphores only.** The HAL's one synchronisation primitive maps onto
//!   Vulkan's; host waits are `vkWaitSemaphores`, host signals `vkSignalSemaphore`. The HAL's
//!   sticky failure state lives beside the `VkSemaphore` (see [`queue`](crate::VulkanQueue)
//!   for how failures travel).
//! - **gpu-allocator** for memory, **synchronization2** for barriers and submission, an
//!   on-disk **pipeline cache** so a second run does not recompile every kernel.
//!
//! Open a device with [`VulkanDevice::new`]; without a usable driver it returns
//! [`VulkanError::NoDevice`] naming what it found, never panics. [`list_devices`] describes
//! every physical device, usable or not, with what a missing feature disables.

mod batch_tail;
mod breadcrumbs;
mod caps;
mod clock;
mod command;
mod device;
mod error;
mod executable;
mod instance;
mod memory;
mod queue;
mod semaphore;
mod stall_probe;
mod validation;

pub use batch_tail::TAIL_MARK;
pub use breadcrumbs::{BreadcrumbMode, BREADCRUMBS_ENV};
pub use caps::{CoopMatrixShape, MemoryHeapInfo, MemoryTypeInfo, VulkanCapabilities, VulkanLimits};
pub use command::{INLINE_BINDINGS, MAX_BINDINGS};
pub use device::{
    VulkanDevice, VulkanDeviceOptions, DEFAULT_SPIN_WAIT, DIRECT_WAITS_ENV, NO_COOP_ENV,
    SERIAL_SIGNALS_ENV, SPIN_WAIT_ENV,
};
pub use error::VulkanError;
pub use executable::{
    spirv_capabilities, spirv_entry_points, spirv_push_constant_bytes, spirv_workgroup_bytes,
    VulkanExecutable,
};
pub use instance::{list_devices, DEVICE_ENV};
pub use memory::VulkanBuffer;
pub use queue::{VulkanQueue, WATCHDOG_ENV};
pub use stall_probe::{StallProbe, STALL_PROBE_ENV};
pub use validation::{Validation, ValidationLog, ValidationMessage, VALIDATION_ENV};
