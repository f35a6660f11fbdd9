//! The Vulkan backend of rafter's runtime: loads the SPIR-V modules of an artifact's
//! `vulkan` section on a [`rafter_hal_vulkan`] device and records their dispatches.
//!
//! The runtime (`rafter-runtime`) knows devices only through the HAL and the executable
//! loaders registered with its [`DeviceSet`]; this crate is the Vulkan device's loader
//! ([`SpirvLoader`]). Register both with [`add_device`]:
//!
//! ```no_run
//! let mut devices = rafter_runtime_cpu::devices()?;     // the host: copies, CPU fallback
//! rafter_runtime_vulkan::add_device(&mut devices, Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Each kernel the compiler placed on `vulkan` is one module of the section
//! ([`rafter_vulkan_section::VulkanSection`]): loaded as an executable of format
//! [`FORMAT_SPIRV`] (its cooperative-matrix variant where the device takes it), and
//! dispatched with the bindings' device addresses and the params its launch rule computes
//! from the call's dims ([`rafter_vulkan_section::Launch::dispatch`]), followed by the module's
//! dim params.

#![warn(missing_docs)]

mod loader;

use std::sync::Arc;

use rafter_hal::Device;
use rafter_hal_vulkan::{VulkanDevice, VulkanError};
use rafter_runtime::{DeviceSet, ExecutableLoader};

pub use loader::SpirvLoader;
pub use rafter_hal::FORMAT_SPIRV;
pub use rafter_hal_vulkan::VulkanDeviceOptions;

/// The Vulkan device's executable loader, to register with a [`DeviceSet`].
pub fn loader() -> Arc<dyn ExecutableLoader> {
    Arc::new(SpirvLoader)
}

/// Opens a Vulkan device with `options` and adds it to `devices` under its name (`vulkan`
/// unless `options.name` says otherwise), with the SPIR-V loader. Returns the device; the
/// error is the driver's (no Vulkan 1.3 device, a missing required feature).
pub fn add_device(
    devices: &mut DeviceSet,
    options: VulkanDeviceOptions,
) -> Result<Arc<VulkanDevice>, VulkanError> {
    let name = if options.name.is_empty() {
        "vulkan".to_string()
    } else {
        options.name.clone()
    };
    let device = Arc::new(VulkanDevice::new(options)?);
    devices.insert(name, device.clone() as Arc<dyn Device>);
    devices.register(loader());
    Ok(device)
}
