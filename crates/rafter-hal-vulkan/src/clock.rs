//! Placing GPU timestamps on the host's clock, for traces.
//!
//! A trace compares GPU spans with host spans (a CPU kernel that waits for a GPU kernel,
//! the handoff between them: `rafter bench --trace`), so a GPU timestamp must become an
//! `Instant`. Without help the monitor can only say "the batch's last command ended about
//! now, when I retired it", which puts every GPU span late by the monitor's own wake-up
//! and hides that wake-up from the handoff it belongs to (a consumer woken directly by the
//! GPU would even appear to start before its producer ended). With
//! `VK_EXT_calibrated_timestamps` and the device's own time domain, the device clock is
//! read on the host between two `Instant`s, which places any GPU timestamp on the host's
//! clock to within half that bracket (under a microsecond on lavapipe, whose device clock
//! is the host's monotonic clock).

use std::time::{Duration, Instant};

use ash::vk;

/// How many readings a calibration takes, keeping the narrowest bracket: a reading whose
/// thread was preempted between the two `Instant`s says little.
const TRIES: usize = 3;

/// The device clock's reader, when the device offers one.
pub(crate) struct DeviceClock {
    calibrated: ash::ext::calibrated_timestamps::Device,
}

impl DeviceClock {
    /// Whether `physical` can read its device clock on the host: the extension, and the
    /// `DEVICE` time domain among its calibrateable ones.
    pub(crate) fn supported(
        entry: &ash::Entry,
        instance: &ash::Instance,
        physical: vk::PhysicalDevice,
        has_extension: bool,
    ) -> bool {
        if !has_extension {
            return false;
        }
        let loader = ash::ext::calibrated_timestamps::Instance::new(entry, instance);
        // SAFETY: `physical` was enumerated from `instance`, which outlives the call.
        let domains = unsafe { loader.get_physical_device_calibrateable_time_domains(physical) };
        domains.is_ok_and(|d| d.contains(&vk::TimeDomainEXT::DEVICE))
    }

    /// The reader for a device created with the extension enabled.
    pub(crate) fn new(instance: &ash::Instance, device: &ash::Device) -> DeviceClock {
        DeviceClock {
            calibrated: ash::ext::calibrated_timestamps::Device::new(instance, device),
        }
    }

    /// A device timestamp (in ticks) and the host `Instant` it corresponds to, from the
    /// narrowest of a few brackets; `None` if the driver refuses.
    pub(crate) fn now(&self) -> Option<(u64, Instant)> {
        let info = [vk::CalibratedTimestampInfoEXT::default().time_domain(vk::TimeDomainEXT::DEVICE)];
        let mut best: Option<(u64, Instant, Duration)> = None;
        for _ in 0..TRIES {
            let before = Instant::now();
            // SAFETY: the device was created with VK_EXT_calibrated_timestamps enabled and
            // reports the DEVICE domain (`supported`); `info` lives across the call.
            let (ticks, _) = unsafe { self.calibrated.get_calibrated_timestamps(&info) }.ok()?;
            let after = Instant::now();
            let width = after - before;
            if best.is_none_or(|(_, _, w)| width < w) {
                best = Some((ticks[0], before + width / 2, width));
            }
        }
        best.map(|(ticks, at, _)| (ticks, at))
    }
}
