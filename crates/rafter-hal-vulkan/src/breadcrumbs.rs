//! Breadcrumbs: a diagnostic for GPU hangs (issue 28) that tells, for every batch still in
//! flight, whether the GPU started it and which of its commands it finished last.
//!
//! Why: the watchdog's report (`queue/watchdog.rs`) shows *which* batches never complete,
//! not whether the oldest one is stuck inside a dispatch (a kernel that spins) or never
//! started (the GPU busy with something else). With breadcrumbs on, the GPU writes 4-byte
//! markers into one host-visible, host-coherent buffer as it goes, and the report reads
//! them back.
//!
//! Two places write markers, each into its own 4-byte slot of that buffer:
//! - **the recorded command buffer** ([`Prepared`](crate::command::Prepared)): `0` before
//!   its first command ("started", behind no barrier), then after each non-barrier command
//!   `i` (behind a compute/transfer -> transfer barrier, so the marker follows the
//!   command's completion, and that of all earlier work on the queue: see [`After`]) `i + 1`. The slot starts at [`NEVER`]. In [`BreadcrumbMode::Reuse`] the command buffer
//!   is recorded once and may be in flight in two submissions at once (`SIMULTANEOUS_USE`):
//!   those submissions then share the slot, and the report says so.
//! - **each submission**: two tiny command buffers recorded for that submission alone, one
//!   submitted before the command buffer (writes `1`, behind no barrier: the batch's
//!   semaphore waits were met and the GPU reached it) and one after it (writes `2` behind a full
//!   barrier: every command of the batch completed). The slot starts at `0`. This is exact
//!   per submission whatever the mode.
//!
//! The modes ([`BREADCRUMBS_ENV`], read once when the device opens):
//! - `1` or `reuse`: command buffers recorded once with `SIMULTANEOUS_USE`, as without
//!   breadcrumbs; only the markers are added. A stall here is the stall of issue 28.
//! - `rerecord`: every submission records a fresh `VkCommandBuffer` (no `SIMULTANEOUS_USE`,
//!   never in flight twice), so its command markers are its own. This is also the other
//!   untested hypothesis: if the stall needs a command buffer in flight twice, it goes away
//!   in this mode.
//!
//! Off (unset or `0`), nothing of this runs: no buffer, no slots, no extra commands.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme, Allocator};
use gpu_allocator::MemoryLocation;
use rafter_hal::HalError;

use crate::device::Shared;
use crate::error::call_error;
use crate::stall_probe::StallProbe;

/// The environment variable that turns breadcrumbs on: `1` or `reuse`, `rerecord`; `0` or
/// unset is off. Read when a device opens, unless [`VulkanDeviceOptions::breadcrumbs`]
/// (crate::VulkanDeviceOptions) says otherwise.
pub const BREADCRUMBS_ENV: &str = "RAFTER_VULKAN_BREADCRUMBS";

/// How breadcrumbs are recorded (see the module docs of `breadcrumbs.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreadcrumbMode {
    /// No markers (the default).
    Off,
    /// Markers added to command buffers recorded once (`SIMULTANEOUS_USE`), plus a
    /// per-submission start and end marker.
    Reuse,
    /// A fresh command buffer recorded for every submission (no `SIMULTANEOUS_USE`), with
    /// the same markers.
    Rerecord,
}

impl BreadcrumbMode {
    /// The mode [`BREADCRUMBS_ENV`] asks for; a value it does not know is off, and says so.
    pub fn from_env() -> BreadcrumbMode {
        let Ok(text) = std::env::var(BREADCRUMBS_ENV) else {
            return BreadcrumbMode::Off;
        };
        BreadcrumbMode::parse(&text).unwrap_or_else(|e| {
            eprintln!("{BREADCRUMBS_ENV}={text:?}: {e}; breadcrumbs are off");
            BreadcrumbMode::Off
        })
    }

    fn parse(text: &str) -> Result<BreadcrumbMode, String> {
        match text.trim() {
            "" | "0" | "off" => Ok(BreadcrumbMode::Off),
            "1" | "reuse" => Ok(BreadcrumbMode::Reuse),
            "rerecord" => Ok(BreadcrumbMode::Rerecord),
            _ => Err("expected 0, 1 (= reuse) or rerecord".into()),
        }
    }
}

/// A command-buffer slot's value before the command buffer ever ran.
pub(crate) const NEVER: u32 = u32::MAX;
/// Submission slot values.
const SUBMISSION_QUEUED: u32 = 0;
const SUBMISSION_STARTED: u32 = 1;
const SUBMISSION_FINISHED: u32 = 2;

/// Slots in the marker buffer (4 bytes each: 1 MiB). Command buffers and submissions alive
/// at once beyond this go without markers (the report says "no slot").
const SLOTS: u32 = 1 << 18;

/// The host address of the mapped marker buffer.
struct Words(NonNull<u32>);

// SAFETY: a persistent mapping of host-coherent memory owned by `Breadcrumbs`, valid from
// any thread while it lives; the host only reads and writes whole aligned words with
// volatile accesses, and a slot is written by the host only while no GPU work uses it.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

/// The device's marker buffer and its free slots.
pub(crate) struct Breadcrumbs {
    pub(crate) mode: BreadcrumbMode,
    buffer: vk::Buffer,
    allocation: Option<Allocation>,
    words: Words,
    free: Mutex<Vec<u32>>,
}

impl Breadcrumbs {
    /// The marker buffer, in host-visible, host-coherent memory. `mode` is not `Off`.
    pub(crate) fn open(
        device: &ash::Device,
        allocator: &mut Allocator,
        mode: BreadcrumbMode,
    ) -> Result<Breadcrumbs, String> {
        let size = SLOTS as u64 * 4;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: `info` lives across the call.
        let buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| format!("vkCreateBuffer: {r}"))?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        let allocation = allocator.allocate(&AllocationCreateDesc {
            name: "rafter breadcrumbs",
            requirements,
            location: MemoryLocation::GpuToCpu,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let coherent = |a: &Allocation| {
            a.memory_properties()
                .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
        };
        let allocation = match allocation {
            Ok(a) if coherent(&a) && a.mapped_ptr().is_some() => a,
            other => {
                let why = match &other {
                    Ok(_) => "no host-coherent mapped memory".to_string(),
                    Err(e) => format!("gpu-allocator: {e}"),
                };
                if let Ok(a) = other {
                    let _ = allocator.free(a);
                }
                // SAFETY: never bound or used.
                unsafe { device.destroy_buffer(buffer, None) };
                return Err(why);
            }
        };
        // SAFETY: the allocation satisfies `requirements` and is bound once, before use.
        let bound =
            unsafe { device.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        let ptr = allocation
            .mapped_ptr()
            .expect("checked above")
            .cast::<u32>();
        let this = Breadcrumbs {
            mode,
            buffer,
            allocation: Some(allocation),
            words: Words(ptr),
            free: Mutex::new((0..SLOTS).rev().collect()),
        };
        if let Err(r) = bound {
            let mut this = this;
            this.destroy(device, allocator);
            return Err(format!("vkBindBufferMemory: {r}"));
        }
        Ok(this)
    }

    /// Frees the buffer; called once, by the device's drop, when no GPU work is left.
    pub(crate) fn destroy(&mut self, device: &ash::Device, allocator: &mut Allocator) {
        // SAFETY: the device is idle and no command buffer recording into it is left.
        unsafe { device.destroy_buffer(self.buffer, None) };
        if let Some(allocation) = self.allocation.take() {
            let _ = allocator.free(allocation);
        }
    }

    /// A free slot, set to `initial`; `None` when all are taken.
    fn take(&self, initial: u32) -> Option<u32> {
        let slot = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        // SAFETY: `slot < SLOTS`, inside the mapping; the slot was free, so no GPU work
        // writes it.
        unsafe {
            self.words
                .0
                .as_ptr()
                .add(slot as usize)
                .write_volatile(initial)
        };
        Some(slot)
    }

    /// Returns a slot once nothing that writes it can still run.
    pub(crate) fn give_back(&self, slot: u32) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot);
    }

    /// A slot's current value (the GPU's writes reach host-coherent memory without a flush).
    pub(crate) fn read(&self, slot: u32) -> u32 {
        // SAFETY: `slot < SLOTS`, inside the mapping; an aligned word.
        unsafe { self.words.0.as_ptr().add(slot as usize).read_volatile() }
    }

    /// A free slot for a command buffer being recorded (starts at [`NEVER`]).
    pub(crate) fn take_command_slot(&self) -> Option<u32> {
        self.take(NEVER)
    }

    /// Records the write of `value` into `slot`, after what `after` names has completed.
    pub(crate) fn record_write(
        &self,
        device: &ash::Device,
        raw: vk::CommandBuffer,
        slot: u32,
        value: u32,
        after: After,
    ) {
        let src_stage = match after {
            After::Nothing => vk::PipelineStageFlags2::NONE,
            After::ComputeAndTransfer => {
                vk::PipelineStageFlags2::COMPUTE_SHADER | vk::PipelineStageFlags2::ALL_TRANSFER
            }
            After::Everything => vk::PipelineStageFlags2::ALL_COMMANDS,
        };
        // SAFETY: `raw` is recording, outside a render pass; the arrays live across the
        // call; the 4 bytes at `4 * slot` lie inside the marker buffer (TRANSFER_DST),
        // which outlives every command buffer.
        unsafe {
            if after != After::Nothing {
                let barriers = [vk::MemoryBarrier2::default()
                    .src_stage_mask(src_stage)
                    .src_access_mask(vk::AccessFlags2::MEMORY_WRITE)
                    .dst_stage_mask(vk::PipelineStageFlags2::ALL_TRANSFER)
                    .dst_access_mask(vk::AccessFlags2::TRANSFER_WRITE)];
                let dependency = vk::DependencyInfo::default().memory_barriers(&barriers);
                device.cmd_pipeline_barrier2(raw, &dependency);
            }
            device.cmd_fill_buffer(raw, self.buffer, 4 * slot as u64, 4, value);
        }
    }
}

/// What a marker write waits for. A pipeline barrier's first scope is every command
/// submitted earlier *on the queue*, earlier batches included: a "finished" marker after
/// command `i` therefore means command `i` and all work before it on this queue completed
/// (exact for the oldest in-flight batch of a queue). "Started" markers wait for nothing
/// (only the batch's semaphore waits), so they tell whether the GPU reached the batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    Nothing,
    ComputeAndTransfer,
    Everything,
}

/// The per-submission markers: a slot and the two command buffers around the batch's own.
pub(crate) struct SubmissionCrumbs {
    shared: Arc<Shared>,
    pool: vk::CommandPool,
    pub(crate) before: vk::CommandBuffer,
    pub(crate) after: vk::CommandBuffer,
    pub(crate) slot: u32,
}

impl Drop for SubmissionCrumbs {
    fn drop(&mut self) {
        // SAFETY: dropped with its submission, which is released only after it completed
        // (or was never submitted), so the GPU no longer uses the pool's command buffers
        // or the slot.
        unsafe { self.shared.device.destroy_command_pool(self.pool, None) };
        if let Some(crumbs) = &self.shared.breadcrumbs {
            crumbs.give_back(self.slot);
        }
    }
}

impl SubmissionCrumbs {
    /// With breadcrumbs on and a slot free: a submission's start and end markers.
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Option<SubmissionCrumbs>, HalError> {
        let Some(crumbs) = &shared.breadcrumbs else {
            return Ok(None);
        };
        if shared.stall_probe == StallProbe::CommandMarkersOnly {
            return Ok(None);
        }
        let Some(slot) = crumbs.take(SUBMISSION_QUEUED) else {
            return Ok(None);
        };
        let device = &shared.device;
        let pool_info =
            vk::CommandPoolCreateInfo::default().queue_family_index(shared.queue_family);
        // SAFETY: `pool_info` lives across the call.
        let pool = match unsafe { device.create_command_pool(&pool_info, None) } {
            Ok(pool) => pool,
            Err(r) => {
                crumbs.give_back(slot);
                return Err(call_error("vkCreateCommandPool", r, 0));
            }
        };
        // From here the guard owns the pool and the slot.
        let mut this = SubmissionCrumbs {
            shared: shared.clone(),
            pool,
            before: vk::CommandBuffer::null(),
            after: vk::CommandBuffer::null(),
            slot,
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        // SAFETY: our pool, used by this thread only.
        let raws = unsafe { device.allocate_command_buffers(&alloc) }
            .map_err(|r| call_error("vkAllocateCommandBuffers", r, 0))?;
        (this.before, this.after) = (raws[0], raws[1]);
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        for (raw, value, after) in [
            (this.before, SUBMISSION_STARTED, After::Nothing),
            (this.after, SUBMISSION_FINISHED, After::Everything),
        ] {
            // SAFETY: fresh command buffers of our pool, recorded by this thread only.
            unsafe { device.begin_command_buffer(raw, &begin) }
                .map_err(|r| call_error("vkBeginCommandBuffer", r, 0))?;
            crumbs.record_write(device, raw, slot, value, after);
            if value == SUBMISSION_FINISHED {
                host_barrier(device, raw);
            }
            // SAFETY: recording state, ended once.
            unsafe { device.end_command_buffer(raw) }
                .map_err(|r| call_error("vkEndCommandBuffer", r, 0))?;
        }
        Ok(Some(this))
    }

    /// Where the submission stands, from its slot.
    pub(crate) fn state(&self) -> &'static str {
        match self.shared.breadcrumbs.as_ref().map(|c| c.read(self.slot)) {
            Some(SUBMISSION_QUEUED) => "started: no",
            Some(SUBMISSION_STARTED) => "started: yes, finished: no",
            Some(SUBMISSION_FINISHED) => "started: yes, finished: yes (all its commands)",
            _ => "started: ? (unexpected marker)",
        }
    }
}

/// The markers' writes made visible to the host.
fn host_barrier(device: &ash::Device, raw: vk::CommandBuffer) {
    let barriers = [vk::MemoryBarrier2::default()
        .src_stage_mask(vk::PipelineStageFlags2::ALL_TRANSFER)
        .src_access_mask(vk::AccessFlags2::TRANSFER_WRITE)
        .dst_stage_mask(vk::PipelineStageFlags2::HOST)
        .dst_access_mask(vk::AccessFlags2::HOST_READ)];
    let dependency = vk::DependencyInfo::default().memory_barriers(&barriers);
    // SAFETY: `raw` is recording; the arrays live across the call.
    unsafe { device.cmd_pipeline_barrier2(raw, &dependency) };
}

/// A command buffer's progress as its slot tells it, with its command names (one per HAL
/// command, barriers included).
pub(crate) struct Progress<'a> {
    pub(crate) value: Option<u32>,
    pub(crate) names: &'a [String],
}

impl fmt::Display for Progress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.names.len();
        let name = |i: usize| self.names.get(i).map(String::as_str).unwrap_or("?");
        match self.value {
            None => write!(f, "no slot (breadcrumbs off or out of slots)"),
            Some(NEVER) => write!(f, "started: no, last finished command none of {n}"),
            Some(0) => write!(
                f,
                "started: yes, last finished command none of {n}; running or next: #0 {}",
                name(0)
            ),
            Some(v) => {
                let last = v as usize - 1;
                write!(
                    f,
                    "started: yes, last finished command #{last} of {n} ({}), {v} of {n} done",
                    name(last)
                )?;
                match (last + 1..n).find(|&i| name(i) != "|") {
                    Some(next) => write!(f, "; running or next: #{next} {}", name(next)),
                    None => write!(f, "; finished"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BreadcrumbMode, Progress, NEVER};

    #[test]
    fn modes_parse() {
        assert_eq!(BreadcrumbMode::parse(" 1 "), Ok(BreadcrumbMode::Reuse));
        assert_eq!(BreadcrumbMode::parse("reuse"), Ok(BreadcrumbMode::Reuse));
        assert_eq!(
            BreadcrumbMode::parse("rerecord"),
            Ok(BreadcrumbMode::Rerecord)
        );
        assert_eq!(BreadcrumbMode::parse("0"), Ok(BreadcrumbMode::Off));
        assert!(BreadcrumbMode::parse("yes").is_err());
    }

    #[test]
    fn progress_names_the_last_finished_and_the_next_command() {
        let names: Vec<String> = ["k0_unary#0", "|", "copy 64", "fill 8"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let text = |value| {
            Progress {
                value,
                names: &names,
            }
            .to_string()
        };
        assert_eq!(
            text(Some(NEVER)),
            "started: no, last finished command none of 4"
        );
        assert_eq!(
            text(Some(0)),
            "started: yes, last finished command none of 4; running or next: #0 k0_unary#0"
        );
        assert_eq!(
            text(Some(1)),
            "started: yes, last finished command #0 of 4 (k0_unary#0), 1 of 4 done; \
             running or next: #2 copy 64"
        );
        assert_eq!(
            text(Some(4)),
            "started: yes, last finished command #3 of 4 (fill 8), 4 of 4 done; finished"
        );
    }
}
