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

/// How long one calibration is used before the clock is read again: reading it is a driver
/// call (three, for the narrowest bracket) on the monitor's path to the batch's callbacks,
/// and the device clock drifts from the host's by parts per million at most: a
/// microsecond in this time, or far less.
const REUSE: Duration = Duration::from_millis(100);

/// The device clock's reader, when the device offers one.
pub(crate) struct DeviceClock {
    calibrated: ash::ext::calibrated_timestamps::Device,
    /// The last calibration: device ticks and the host `Instant` they correspond to.
    last: std::sync::Mutex<Option<(u64, Instant)>>,
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
            last: std::sync::Mutex::new(None),
        }
    }

    /// A device timestamp (in ticks) and the host `Instant` it corresponds to: the last
    /// calibration while it is younger than [`REUSE`], else a new one; `None` if the
    /// driver refuses.
    pub(crate) fn calibration(&self) -> Option<(u64, Instant)> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((ticks, at)) = *last {
            if at.elapsed() < REUSE {
                return Some((ticks, at));
            }
        }
        let fresh = self.read()?;
        *last = Some(fresh);
        Some(fresh)
    }

    /// Reads the device clock: the narrowest of a few brackets.
    fn read(&self) -> Option<(u64, Instant)> {
        let info =
            [vk::CalibratedTimestampInfoEXT::default().time_domain(vk::TimeDomainEXT::DEVICE)];
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
