//! Opening the test device, or skipping when the machine has no Vulkan.

use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions, VulkanError};

/// Set (to anything but `0`) to turn "no Vulkan device" from a skip into a failure; CI sets
/// it, because CI installs lavapipe and a silently skipped GPU suite proves nothing.
pub const REQUIRE_ENV: &str = "RAFTER_REQUIRE_VULKAN";

/// The device, or `None` after printing why the test is skipped.
pub fn device_or_skip(test: &str) -> Option<VulkanDevice> {
    device_with_or_skip(test, VulkanDeviceOptions::default())
}

pub fn device_with_or_skip(test: &str, options: VulkanDeviceOptions) -> Option<VulkanDevice> {
    match VulkanDevice::new(options) {
        Ok(device) => Some(device),
        Err(error @ VulkanError::NoDevice { .. }) => {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{test}: {REQUIRE_ENV} is set but: {error}");
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: opening the Vulkan device failed: {error}"),
    }
}
