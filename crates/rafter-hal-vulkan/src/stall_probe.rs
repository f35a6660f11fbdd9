//! Diagnostic variants of the submission path: each changes one thing about how work
//! reaches the GPU, so an A/B run can tell what a behaviour needs: issue 28's NVIDIA stall
//! (scripts/stall_ab.sh) and what a GPU -> CPU handoff waits for (`early-signal`). Read once
//! when a device opens from [`STALL_PROBE_ENV`]; off by default, and off costs nothing. Not
//! for production use: each variant trades throughput or safety for isolation.

/// The environment variable choosing a [`StallProbe`]: `exclusive`, `serial`, `rerecord`,
/// `submission-markers`, `command-markers`, `no-tail` or `early-signal` (unset, empty or
/// `0`: off).
pub const STALL_PROBE_ENV: &str = "RAFTER_VULKAN_STALL_PROBE";

/// One change to the submission path, for isolating the stall's cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallProbe {
    /// As in production.
    Off,
    /// Pipeline creation holds the device-wide signal lock: no submission or host signal
    /// while the driver compiles.
    ExclusivePipelines,
    /// Every command buffer starts with a full barrier, so a batch's commands start only
    /// after all earlier work on the queue completed: no two batches execute at once.
    SerialBatches,
    /// Every submission records a fresh `VkCommandBuffer` without `SIMULTANEOUS_USE` (no
    /// breadcrumb markers either): no command buffer is ever in flight twice.
    Rerecord,
    /// With breadcrumbs on (`RAFTER_VULKAN_BREADCRUMBS=1`): only each submission's two
    /// marker command buffers (a fill before the batch, a full barrier and a fill after),
    /// no markers between commands. Warm runs with all markers never stalled.
    SubmissionMarkersOnly,
    /// With breadcrumbs on: only the markers between commands (a barrier and a fill after
    /// each command), no per-submission marker command buffers.
    CommandMarkersOnly,
    /// Submissions without the tail (`batch_tail.rs`), the fix for the stall: for checking
    /// that the stall still needs it (on a new driver, say).
    NoTail,
    /// Each submission goes as two batches of one `vkQueueSubmit2`: its own command
    /// buffers with its signals, then the tail with the completion signal, so the consumer
    /// of a signal does not wait for the tail (whose first barrier still orders it after
    /// the batch, which is what retirement needs). For measuring what the tail adds to a
    /// GPU -> CPU handoff; a first batch ending in a dispatch is what stalled on issue 28's
    /// driver, so this is not stall-free there.
    EarlySignal,
}

impl StallProbe {
    /// Parses [`STALL_PROBE_ENV`]'s value.
    pub fn parse(value: &str) -> Result<StallProbe, String> {
        match value.trim() {
            "" | "0" => Ok(StallProbe::Off),
            "exclusive" => Ok(StallProbe::ExclusivePipelines),
            "serial" => Ok(StallProbe::SerialBatches),
            "rerecord" => Ok(StallProbe::Rerecord),
            "submission-markers" => Ok(StallProbe::SubmissionMarkersOnly),
            "command-markers" => Ok(StallProbe::CommandMarkersOnly),
            "no-tail" => Ok(StallProbe::NoTail),
            "early-signal" => Ok(StallProbe::EarlySignal),
            other => Err(format!(
                "{STALL_PROBE_ENV}={other:?}: expected exclusive, serial, rerecord, submission-markers, \
                 command-markers, no-tail, early-signal or 0"
            )),
        }
    }

    /// The variant the environment asks for; an unknown value is reported on stderr and
    /// treated as off (a diagnostic knob must not stop a device from opening).
    pub(crate) fn from_env() -> StallProbe {
        match std::env::var(STALL_PROBE_ENV) {
            Ok(value) => StallProbe::parse(&value).unwrap_or_else(|e| {
                eprintln!("rafter-hal-vulkan: ignoring {e}");
                StallProbe::Off
            }),
            Err(_) => StallProbe::Off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_variant_and_rejects_others() {
        assert_eq!(StallProbe::parse(""), Ok(StallProbe::Off));
        assert_eq!(StallProbe::parse("0"), Ok(StallProbe::Off));
        assert_eq!(
            StallProbe::parse("exclusive"),
            Ok(StallProbe::ExclusivePipelines)
        );
        assert_eq!(StallProbe::parse(" serial"), Ok(StallProbe::SerialBatches));
        assert_eq!(StallProbe::parse("rerecord"), Ok(StallProbe::Rerecord));
        assert_eq!(
            StallProbe::parse("submission-markers"),
            Ok(StallProbe::SubmissionMarkersOnly)
        );
        assert_eq!(
            StallProbe::parse("command-markers"),
            Ok(StallProbe::CommandMarkersOnly)
        );
        assert_eq!(StallProbe::parse("no-tail"), Ok(StallProbe::NoTail));
        assert_eq!(
            StallProbe::parse("early-signal"),
            Ok(StallProbe::EarlySignal)
        );
        let err = StallProbe::parse("1").unwrap_err();
        assert!(
            err.contains(STALL_PROBE_ENV) && err.contains("serial"),
            "{err}"
        );
    }
}
