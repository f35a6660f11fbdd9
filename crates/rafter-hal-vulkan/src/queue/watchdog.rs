//! A diagnostic for hangs: a text report of what the scheduler holds (deferred
//! submissions and what each waits for, in-flight batches and their waits, semaphores with
//! callbacks or a deferred host signal), each with its age and the driver's counters.
//!
//! Why: a stalled process shows only threads asleep in futexes and the monitor polling;
//! which semaphore value never came is what tells a lost wake-up from a missing signal or
//! a GPU batch blocked on a wait. The monitor prints the report once when
//! `RAFTER_VULKAN_WATCHDOG_S=N` is set and some submission has waited or run for N seconds;
//! the device's `Device::describe` includes it. With breadcrumbs on (`breadcrumbs.rs`,
//! `RAFTER_VULKAN_BREADCRUMBS`), each in-flight batch also says whether the GPU started it
//! and the last command it finished, and whether its `VkCommandBuffer` is in flight in
//! another batch too.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ash::vk;
use rafter_hal::{Command, Semaphore};

use super::{own, Wait};
use crate::device::Shared;
use crate::semaphore::SemInner;

/// The environment variable that arms the monitor's one-time report.
pub const WATCHDOG_ENV: &str = "RAFTER_VULKAN_WATCHDOG_S";

/// The report's threshold, if armed. A value that is not a positive number of seconds
/// disarms it, and says so (the monitor reads it once, when the device opens).
pub(crate) fn threshold() -> Option<Duration> {
    let text = std::env::var(WATCHDOG_ENV).ok()?;
    parse_threshold(&text)
        .map_err(|e| eprintln!("{WATCHDOG_ENV}={text:?}: {e}; the watchdog is off"))
        .ok()
}

fn parse_threshold(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
        _ => Err("expected a positive number of seconds".into()),
    }
}

/// Where one of this device's semaphores stands: the driver's counter, the highest value
/// submitted work will signal, a host signal waiting behind it, failure, callback values.
fn semaphore_state(inner: &SemInner) -> String {
    let state = inner.lock();
    format!(
        "counter {:?}, submitted signal {}, deferred host signal {:?}, failure {:?}, \
         callbacks at {:?}",
        inner.counter(),
        inner.submitted_signal.load(Ordering::Acquire),
        state.deferred_host_signal,
        state.failure,
        state.timepoints.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
    )
}

impl Shared {
    /// The age of the oldest deferred or in-flight submission.
    pub(crate) fn oldest_work(&self) -> Option<Duration> {
        let now = Instant::now();
        let state = self.lock_sched();
        let deferred = state.deferred.iter().map(|p| now - p.queued_at);
        let flying = state.in_flight.iter().map(|f| now - f.submitted_at);
        deferred.chain(flying).max()
    }

    /// One line describing a wait or signal point: whose semaphore, the value wanted, and
    /// where the semaphore stands.
    fn describe_point(&self, semaphore: &Semaphore, value: u64) -> String {
        match own(self, semaphore) {
            Some(inner) => format!(
                "vk sem {:?} wants {value}: {}",
                inner.raw,
                semaphore_state(inner)
            ),
            None => format!(
                "foreign sem {semaphore:?} wants {value}: value {}, failure {:?}",
                semaphore.value(),
                semaphore.failure()
            ),
        }
    }

    /// The scheduler's state as text (see the module docs).
    pub(crate) fn describe(&self) -> String {
        let now = Instant::now();
        let mut out = String::new();
        let _ = writeln!(out, "Vulkan device '{}' ({}):", self.name, self.id);
        // Collected under the scheduler lock, described after it (describing takes
        // semaphore locks, which `submit_now` takes under the scheduler lock: same order).
        let (deferred, flying) = {
            let state = self.lock_sched();
            let deferred: Vec<_> = state
                .deferred
                .iter()
                .map(|p| {
                    let waits: Vec<(Semaphore, u64, Option<String>)> = p
                        .waits
                        .iter()
                        .map(|w| match w {
                            Wait::Own { semaphore, value } => (semaphore.clone(), *value, None),
                            Wait::Foreign(cell) => {
                                let outcome =
                                    cell.outcome.lock().unwrap_or_else(|e| e.into_inner());
                                (
                                    cell.semaphore.clone(),
                                    cell.value,
                                    Some(format!("{:?}", *outcome)),
                                )
                            }
                        })
                        .collect();
                    (p.id, p.queue, now - p.queued_at, waits, p.signals.clone())
                })
                .collect();
            let flying: Vec<_> = state
                .in_flight
                .iter()
                .map(|f| {
                    (
                        f.seq,
                        f.queue,
                        now - f.submitted_at,
                        f.completion,
                        f.waits.clone(),
                        f.signals.clone(),
                        describe_commands(f.command_buffer.commands()),
                        f.prepared.clone(),
                        f.crumbs.as_ref().map(|c| c.state()),
                    )
                })
                .collect();
            (deferred, flying)
        };
        let _ = writeln!(out, "  {} deferred submissions", deferred.len());
        for (id, queue, age, waits, signals) in deferred {
            let _ = writeln!(
                out,
                "  deferred #{id} on queue {queue}, queued {age:.3?} ago"
            );
            for (semaphore, value, outcome) in waits {
                let outcome = outcome
                    .map(|o| format!(" (callback outcome {o})"))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "    waits {}{outcome}",
                    self.describe_point(&semaphore, value)
                );
            }
            for (semaphore, value) in signals {
                let _ = writeln!(
                    out,
                    "    signals {}",
                    self.describe_point(&semaphore, value)
                );
            }
        }
        let _ = writeln!(out, "  {} batches in flight", flying.len());
        // Which batches share a `VkCommandBuffer` (a SIMULTANEOUS_USE one in flight twice).
        let raws: Vec<(u64, vk::CommandBuffer)> = flying.iter().map(|f| (f.0, f.7.raw)).collect();
        for (seq, queue, age, (completion, target), waits, signals, commands, prepared, crumbs) in
            flying
        {
            // SAFETY: completion semaphores live as long as `self`.
            let reached = unsafe { self.device.get_semaphore_counter_value(completion) };
            let _ = writeln!(
                out,
                "  in flight seq {seq} on queue {queue}, submitted {age:.3?} ago, completion \
                 {reached:?} of {target}"
            );
            for (semaphore, value) in waits {
                let _ = writeln!(out, "    waits {}", self.describe_point(&semaphore, value));
            }
            for (semaphore, value) in signals {
                let _ = writeln!(
                    out,
                    "    signals {}",
                    self.describe_point(&semaphore, value)
                );
            }
            let _ = writeln!(out, "    commands: {commands}");
            if let Some(submission) = crumbs {
                let _ = writeln!(out, "    breadcrumbs: submission {submission}");
            }
            if let Some(progress) = prepared.progress() {
                let _ = writeln!(out, "    breadcrumbs: command buffer {progress}");
            }
            let twins: Vec<u64> = raws
                .iter()
                .filter(|&&(other, raw)| other != seq && raw == prepared.raw)
                .map(|&(other, _)| other)
                .collect();
            let _ = if twins.is_empty() {
                writeln!(
                    out,
                    "    command buffer {:?} in flight in no other batch",
                    prepared.raw
                )
            } else {
                writeln!(
                    out,
                    "    command buffer {:?} ALSO IN FLIGHT in seq {twins:?} (its command \
                     breadcrumbs are shared with those)",
                    prepared.raw
                )
            };
        }
        for inner in self.live_semaphores() {
            let waited_on = {
                let state = inner.lock();
                !state.timepoints.is_empty() || state.deferred_host_signal.is_some()
            };
            if waited_on {
                let _ = writeln!(
                    out,
                    "  semaphore {:?}: {}",
                    inner.raw,
                    semaphore_state(&inner)
                );
            }
        }
        out
    }
}

/// The commands of a batch, briefly: each dispatch's kernel, grid and binding sizes.
fn describe_commands(commands: &[Command]) -> String {
    let parts: Vec<String> = commands
        .iter()
        .map(|command| match command {
            Command::Dispatch(d) => format!(
                "{}#{} {:?} bytes {:?} params {:02x?}",
                d.executable.name(),
                d.entry,
                d.workgroups,
                d.bindings.iter().map(|b| b.len).collect::<Vec<_>>(),
                d.params
            ),
            Command::Copy { src, .. } => format!("copy {}", src.len),
            Command::Fill { dst, .. } => format!("fill {}", dst.len),
            Command::Barrier => "|".to_string(),
        })
        .collect();
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::parse_threshold;
    use std::time::Duration;

    #[test]
    fn thresholds_are_positive_seconds() {
        assert_eq!(parse_threshold(" 2.5 "), Ok(Duration::from_millis(2500)));
        for bad in ["", "0", "-1", "ten", "inf", "NaN"] {
            assert!(parse_threshold(bad).is_err(), "{bad:?}");
        }
    }
}
