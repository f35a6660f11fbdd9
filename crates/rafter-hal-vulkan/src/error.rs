//! Errors of opening a Vulkan device.

use ash::vk;
use rafter_hal::HalError;

/// Why a Vulkan device could not be opened. Every variant is an ordinary error (a machine
/// without Vulkan is normal): nothing in this crate panics for want of a driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VulkanError {
    /// No loader, no instance, no physical device, or none of them usable. `drivers` says
    /// what was found and why each was refused.
    #[error("no Vulkan 1.3 device found (drivers: {drivers})")]
    NoDevice { drivers: String },
    /// The device picked by index lacks something rafter requires.
    #[error("Vulkan device {index} ('{name}') cannot be used: it lacks {missing}")]
    Unsuitable {
        index: usize,
        name: String,
        missing: String,
    },
    /// `RAFTER_VULKAN_DEVICE` (or the option) does not name a device.
    #[error("cannot select a Vulkan device: {reason}")]
    BadSelection { reason: String },
    /// A Vulkan call failed while opening the device.
    #[error("{call} failed: {result}")]
    Call {
        call: &'static str,
        result: vk::Result,
    },
    /// Something else went wrong while opening (the allocator, a thread).
    #[error("opening the Vulkan device: {0}")]
    Other(String),
}

impl From<VulkanError> for HalError {
    fn from(error: VulkanError) -> HalError {
        HalError::Unsupported(error.to_string())
    }
}

/// A `HalError` for a failed Vulkan call after the device is open: device loss is
/// [`HalError::DeviceLost`], allocation failures are out-of-memory, the rest unsupported.
pub(crate) fn call_error(call: &str, result: vk::Result, size: u64) -> HalError {
    match result {
        vk::Result::ERROR_DEVICE_LOST => HalError::DeviceLost(format!("{call}: {result}")),
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            HalError::OutOfMemory {
                size,
                reason: format!("{call}: {result}"),
            }
        }
        other => HalError::Unsupported(format!("{call} failed: {other}")),
    }
}
