//! Opening the test device, or skipping when the machine has no Vulkan; with validation on
//! (`RAFTER_VULKAN_VALIDATION`), failing the test on any validation message.

use std::ops::Deref;
use std::time::{Duration, Instant};

use rafter_hal::{Device, FillPattern, MemoryKind};
use rafter_hal_vulkan::{ValidationLog, VulkanDevice, VulkanDeviceOptions, VulkanError};

/// Set (to anything but `0`) to turn "no Vulkan device" from a skip into a failure; CI sets
/// it, because CI installs lavapipe and a silently skipped GPU suite proves nothing.
pub const REQUIRE_ENV: &str = "RAFTER_REQUIRE_VULKAN";

/// A test's device. Dropping it drops the device, then fails the test if the validation
/// layer reported anything over the device's life (messages about destroying objects in
/// use arrive during the drop).
pub struct Checked {
    device: Option<VulkanDevice>,
    log: ValidationLog,
    test: String,
}

impl Deref for Checked {
    type Target = VulkanDevice;
    fn deref(&self) -> &VulkanDevice {
        self.device.as_ref().expect("present until dropped")
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        drop(self.device.take());
        let (messages, total) = self.log.messages();
        if total > 0 && !std::thread::panicking() {
            let list: Vec<String> = messages.iter().map(|m| format!("  {m}")).collect();
            panic!(
                "{}: {total} Vulkan validation messages:\n{}",
                self.test,
                list.join("\n")
            );
        }
    }
}

/// The device, or `None` after printing why the test is skipped.
// Each test crate compiles this module and uses a subset of it (direct_wait.rs not this).
#[allow(dead_code)]
pub fn device_or_skip(test: &str) -> Option<Checked> {
    device_with_or_skip(test, VulkanDeviceOptions::default())
}

pub fn device_with_or_skip(test: &str, options: VulkanDeviceOptions) -> Option<Checked> {
    match VulkanDevice::new(options) {
        Ok(device) => Some(Checked {
            log: device.validation_log(),
            device: Some(device),
            test: test.to_string(),
        }),
        Err(error @ VulkanError::NoDevice { .. }) => {
            let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{test}: {REQUIRE_ENV} is set but: {error}");
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: opening the Vulkan device failed: {error}"),
    }
}

/// `rounds` fills of a device buffer of `bytes`, one after another: GPU work that takes a
/// while, for tests of what waits for it.
#[allow(dead_code)]
pub fn slow_commands(
    device: &VulkanDevice,
    bytes: u64,
    rounds: usize,
) -> rafter_hal::CommandBuffer {
    let buffer = device.allocate(bytes, MemoryKind::DeviceLocal).unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    for i in 0..rounds {
        if i > 0 {
            builder.barrier();
        }
        builder
            .fill(buffer.range(0, bytes).unwrap(), FillPattern::U32(i as u32))
            .unwrap();
    }
    builder.finish()
}

/// What the device still holds (semaphores, batches, deferred), once it holds nothing or
/// after 5 s: retired batches are released after a grace.
#[allow(dead_code)]
pub fn holds_nothing(device: &VulkanDevice) -> (usize, usize, usize) {
    let start = Instant::now();
    loop {
        let live = device.live_objects();
        if live == (0, 0, 0) || start.elapsed() > Duration::from_secs(5) {
            return live;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
