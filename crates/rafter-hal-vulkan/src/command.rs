//! Translating a HAL command buffer into a recorded `VkCommandBuffer`, once.

use std::sync::Arc;

use ash::vk;
use rafter_hal::{
    BufferImpl, BufferRange, Command, CommandBuffer, FillPattern, HalError, MemoryKind, TraceKind,
};

use crate::breadcrumbs::{After, Progress};
use crate::device::Shared;
use crate::error::call_error;
use crate::executable::VulkanExecutable;
use crate::memory::VulkanBuffer;
use crate::stall_probe::StallProbe;

/// A HAL command buffer recorded for this device: its own pool and one primary command
/// buffer, recorded with `SIMULTANEOUS_USE` because the HAL lets one command buffer be
/// submitted again while an earlier submission of it still runs.
pub(crate) struct Prepared {
    shared: Arc<Shared>,
    pool: vk::CommandPool,
    pub(crate) raw: vk::CommandBuffer,
    /// With a trace sink: the timestamps around each command.
    pub(crate) timing: Option<Timing>,
    /// With breadcrumbs on: this command buffer's marker slot (see `breadcrumbs.rs`) and
    /// a short name per HAL command, for the report.
    pub(crate) crumbs: Option<(u32, Vec<String>)>,
    /// The argument blocks of the dispatches with more than [`INLINE_BINDINGS`] bindings
    /// (see there), written when recorded; it lives as long as the recording that points
    /// at it.
    arguments: Option<VulkanBuffer>,
}

/// The most bindings a dispatch passes inline: push constants then hold each binding's
/// 64-bit address, then the params. A dispatch with more bindings passes the same block
/// (addresses, then params, at the same offsets) through memory: the HAL writes it into a
/// host-visible buffer owned by the recording, and the push constants hold only that
/// block's 64-bit address. Vulkan guarantees 128 bytes of push constants (lavapipe's
/// limit), so 8 addresses leave 64 bytes of params; a generated module knows from its
/// binding count which form it reads (`rafter-codegen-spirv` keeps the same number).
pub const INLINE_BINDINGS: usize = 8;

/// The most bindings one dispatch takes through an argument block ([`INLINE_BINDINGS`]);
/// a bound on the block's size, far above what any generated kernel binds.
pub const MAX_BINDINGS: usize = 64;

/// Where a dispatch's argument block sits in the recording's argument buffer: blocks are
/// 16-byte aligned (each address is 8-byte aligned, as a 64-bit load needs).
const ARGUMENT_ALIGN: u64 = 16;

/// The bytes of `dispatch`'s argument block when it goes through memory, else `None`.
fn argument_block_len(dispatch: &rafter_hal::Dispatch) -> Option<u64> {
    (dispatch.bindings.len() > INLINE_BINDINGS)
        .then(|| (8 * dispatch.bindings.len() + dispatch.params.len()) as u64)
}

impl Prepared {
    /// How far the GPU got in this command buffer, from its breadcrumbs.
    pub(crate) fn progress(&self) -> Option<Progress<'_>> {
        let (slot, names) = self.crumbs.as_ref()?;
        let value = self.shared.breadcrumbs.as_ref().map(|c| c.read(*slot));
        Some(Progress { value, names })
    }
}

/// Timestamp queries `2i` (before) and `2i + 1` (after) of span `i`.
pub(crate) struct Timing {
    pub(crate) pool: vk::QueryPool,
    /// Queries in the pool: two per timed command.
    queries: u32,
    pub(crate) spans: Vec<Span>,
    /// Host-visible, coherent memory the command buffer's last commands copy the
    /// timestamps into (`vkCmdCopyQueryPoolResults`), where the monitor reads them. Not
    /// `vkGetQueryPoolResults`: on lavapipe that call from the monitor thread, while the
    /// queue ran later work, hung the queue (`rafter bench --device vulkan --trace` of a
    /// model split around CPU LRNs: 6 of 15 runs of 100 calls never ended, 0 of 15 with
    /// the results left unread; benchmarks/results/lavapipe-trace-hang-2026-11-30/).
    results: VulkanBuffer,
}

/// What one timed command was.
pub(crate) struct Span {
    pub(crate) kind: TraceKind,
    pub(crate) executable: Arc<str>,
    pub(crate) name: Arc<str>,
    pub(crate) workgroups: u64,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: a `Prepared` is dropped when its HAL command buffer's last handle goes;
        // submissions hold a handle until they complete, so the GPU no longer uses it (nor
        // its query pool).
        unsafe {
            self.shared.device.destroy_command_pool(self.pool, None);
            if let Some(t) = &self.timing {
                self.shared.device.destroy_query_pool(t.pool, None);
            }
        }
        if let (Some((slot, _)), Some(crumbs)) = (&self.crumbs, &self.shared.breadcrumbs) {
            crumbs.give_back(*slot);
        }
    }
}

impl Timing {
    /// A pool of two timestamps for each of the command buffer's non-barrier commands.
    fn new(
        shared: &Arc<Shared>,
        command_buffer: &CommandBuffer,
    ) -> Result<Option<Timing>, HalError> {
        let count = command_buffer
            .commands()
            .iter()
            .filter(|c| !matches!(c, Command::Barrier))
            .count();
        if shared.trace.is_none() || count == 0 {
            return Ok(None);
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2 * count as u32);
        let queries = 2 * count as u32;
        let results = VulkanBuffer::new(
            shared.clone(),
            8 * queries as u64,
            MemoryKind::HostVisibleShared,
        )?;
        if results.host_address().is_none() {
            return Err(HalError::Unsupported(format!(
                "tracing reads GPU timestamps from host-visible, coherent memory, and device \
                 '{}' gave none",
                shared.name
            )));
        }
        // SAFETY: `info` lives across the call.
        let pool = unsafe { shared.device.create_query_pool(&info, None) }
            .map_err(|r| call_error("vkCreateQueryPool", r, 0))?;
        Ok(Some(Timing {
            pool,
            queries,
            spans: Vec::with_capacity(count),
            results,
        }))
    }

    /// Copies every timestamp into `results` once all are written (recorded after the last
    /// command, before the final barrier that makes transfer writes visible to the host).
    fn copy_results(&self, shared: &Shared, raw: vk::CommandBuffer) {
        let flags = vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT;
        // SAFETY: recording state, outside any render pass; the query range is the pool's;
        // `results` holds `8 * queries` bytes, is a transfer destination (`BUFFER_USAGE`)
        // and lives as long as the `Prepared` that owns this timing.
        unsafe {
            shared.device.cmd_copy_query_pool_results(
                raw,
                self.pool,
                0,
                self.queries,
                self.results.raw(),
                0,
                8,
                flags,
            )
        };
    }

    /// Writes the timestamp of the next span's start (`end == false`) or end.
    fn stamp(&self, shared: &Shared, raw: vk::CommandBuffer, end: bool) {
        let index = 2 * self.spans.len() as u32 + end as u32;
        // Start: once every earlier command has started; end: once this one completed.
        let stage = if end {
            vk::PipelineStageFlags2::ALL_COMMANDS
        } else {
            vk::PipelineStageFlags2::TOP_OF_PIPE
        };
        // SAFETY: recording state; the query index is below the pool's count (one pair
        // per non-barrier command) and was reset at the start of the command buffer.
        unsafe {
            shared
                .device
                .cmd_write_timestamp2(raw, stage, self.pool, index)
        };
    }

    /// The spans' GPU times in nanoseconds from the first start, once the submission
    /// completed, and the first start's raw ticks; `None` if the results are unavailable.
    pub(crate) fn read(&self, shared: &Shared) -> Option<(u64, Vec<(u64, u64)>)> {
        let mut ticks = vec![0u64; 2 * self.spans.len()];
        // The submission that copied them completed (this runs at retirement), and a later
        // submission of this command buffer waits for that (`queue.rs`,
        // `traced_and_in_flight`), so the bytes are this submission's.
        let ptr = self.results.host_address()?.as_ptr().cast::<u64>();
        for (i, t) in ticks.iter_mut().enumerate() {
            // SAFETY: the mapping holds `8 * queries` bytes (`Timing::new`) and `i <
            // ticks.len() == queries`; no submission writes it now (above); read unaligned.
            *t = unsafe { ptr.add(i).read_unaligned() };
        }
        let bits = shared.caps.timestamp_valid_bits;
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let period = shared.caps.timestamp_period_ps as f64 / 1000.0;
        let first = ticks.first().copied()? & mask;
        let ns = |t: u64| ((t & mask).wrapping_sub(first) & mask) as f64 * period;
        Some((
            first,
            ticks
                .chunks_exact(2)
                .map(|p| (ns(p[0]) as u64, ns(p[1]) as u64))
                .collect(),
        ))
    }
}

/// The recorded form of `command_buffer`, recording it on first use. Errors are the
/// synchronous kind: nothing was submitted.
pub(crate) fn prepare(
    shared: &Arc<Shared>,
    command_buffer: &CommandBuffer,
) -> Result<Arc<Prepared>, HalError> {
    if let Some(prepared) = cached(command_buffer, shared) {
        return Ok(prepared);
    }
    let prepared: Arc<Prepared> = Arc::new(record(shared, command_buffer)?);
    // Two threads may race to record; the first stored wins and the other's is dropped.
    let _ = command_buffer.prepared().set(prepared.clone());
    Ok(cached(command_buffer, shared).unwrap_or(prepared))
}

pub(crate) fn cached(
    command_buffer: &CommandBuffer,
    shared: &Arc<Shared>,
) -> Option<Arc<Prepared>> {
    let any = command_buffer.prepared().get()?.clone();
    let prepared = any.downcast::<Prepared>().ok()?;
    Arc::ptr_eq(&prepared.shared, shared).then_some(prepared)
}

/// A buffer of this device behind a range, or the error naming the command.
fn resolve<'a>(
    shared: &Arc<Shared>,
    range: &'a BufferRange,
    what: String,
) -> Result<&'a VulkanBuffer, HalError> {
    range
        .buffer
        .downcast_ref::<VulkanBuffer>()
        .filter(|b| Arc::ptr_eq(b.shared(), shared))
        .ok_or_else(|| HalError::IncompatibleObject {
            what,
            device: shared.name.clone(),
            reason: "it is not a buffer of this Vulkan device".into(),
        })
}

/// Everything before completes, with its writes visible, before anything after starts.
fn full_barrier(
    shared: &Shared,
    raw: vk::CommandBuffer,
    dst_stage: vk::PipelineStageFlags2,
    dst_access: vk::AccessFlags2,
) {
    let barriers = [vk::MemoryBarrier2::default()
        .src_stage_mask(vk::PipelineStageFlags2::ALL_COMMANDS)
        .src_access_mask(vk::AccessFlags2::MEMORY_WRITE)
        .dst_stage_mask(dst_stage)
        .dst_access_mask(dst_access)];
    let dependency = vk::DependencyInfo::default().memory_barriers(&barriers);
    // SAFETY: `raw` is in the recording state; the arrays live across the call.
    unsafe { shared.device.cmd_pipeline_barrier2(raw, &dependency) };
}

/// The HAL's barrier between the commands of one command buffer: they are dispatches
/// (compute shaders), copies and fills (transfers), so the dependency names those stages
/// and their storage and transfer accesses, not `ALL_COMMANDS` and all memory. Host
/// access is ordered by the full barrier at the end of every command buffer and by the
/// semaphores. Measured on the H100 (RESULTS.md, "Narrow barriers"): BERT-base f16 3.68 ->
/// 2.89 ms, f32 5.65 -> 4.85 ms, MobileNetV2 f16 0.60 -> 0.44 ms a call, with identical
/// outputs; NVIDIA's driver turns the `ALL_COMMANDS` / `MEMORY_WRITE` form into a
/// heavier wait between every two dispatches.
fn command_barrier(shared: &Shared, raw: vk::CommandBuffer) {
    let stages = vk::PipelineStageFlags2::COMPUTE_SHADER | vk::PipelineStageFlags2::ALL_TRANSFER;
    let barriers = [vk::MemoryBarrier2::default()
        .src_stage_mask(stages)
        .src_access_mask(vk::AccessFlags2::SHADER_STORAGE_WRITE | vk::AccessFlags2::TRANSFER_WRITE)
        .dst_stage_mask(stages)
        .dst_access_mask(
            vk::AccessFlags2::SHADER_STORAGE_READ
                | vk::AccessFlags2::SHADER_STORAGE_WRITE
                | vk::AccessFlags2::TRANSFER_READ
                | vk::AccessFlags2::TRANSFER_WRITE,
        )];
    let dependency = vk::DependencyInfo::default().memory_barriers(&barriers);
    // SAFETY: `raw` is in the recording state; the arrays live across the call.
    unsafe { shared.device.cmd_pipeline_barrier2(raw, &dependency) };
}

/// Records `command_buffer` into a fresh `VkCommandBuffer` (with breadcrumbs, when on).
pub(crate) fn record(
    shared: &Arc<Shared>,
    command_buffer: &CommandBuffer,
) -> Result<Prepared, HalError> {
    let device = &shared.device;
    let pool_info = vk::CommandPoolCreateInfo::default().queue_family_index(shared.queue_family);
    // SAFETY: `pool_info` lives across the call.
    let pool = unsafe { device.create_command_pool(&pool_info, None) }
        .map_err(|r| call_error("vkCreateCommandPool", r, 0))?;
    // From here `prepared` owns the pool: an error below destroys it.
    let mut prepared = Prepared {
        shared: shared.clone(),
        pool,
        raw: vk::CommandBuffer::null(),
        timing: None,
        crumbs: None,
        arguments: None,
    };
    prepared.timing = Timing::new(shared, command_buffer)?;
    let argument_bytes: u64 = command_buffer
        .commands()
        .iter()
        .filter_map(|c| match c {
            Command::Dispatch(d) => argument_block_len(d),
            _ => None,
        })
        .map(|len| len.next_multiple_of(ARGUMENT_ALIGN))
        .sum();
    if argument_bytes > 0 {
        let buffer = VulkanBuffer::new(
            shared.clone(),
            argument_bytes,
            MemoryKind::HostVisibleShared,
        )?;
        if buffer.host_address().is_none() {
            return Err(HalError::Unsupported(format!(
                "dispatches of more than {INLINE_BINDINGS} bindings pass their addresses \
                 through a host-visible, coherent buffer, and device '{}' gave none",
                shared.name
            )));
        }
        prepared.arguments = Some(buffer);
    }
    let mut arguments_used = 0u64;
    let alloc = vk::CommandBufferAllocateInfo::default()
        .command_pool(pool)
        .level(vk::CommandBufferLevel::PRIMARY)
        .command_buffer_count(1);
    // SAFETY: the pool is ours and used by this thread only.
    prepared.raw = unsafe { device.allocate_command_buffers(&alloc) }
        .map_err(|r| call_error("vkAllocateCommandBuffers", r, 0))?[0];
    let raw = prepared.raw;
    // Breadcrumbs' rerecord mode records every submission afresh: never in flight twice.
    let usage = if shared.rerecords() {
        vk::CommandBufferUsageFlags::empty()
    } else {
        vk::CommandBufferUsageFlags::SIMULTANEOUS_USE
    };
    let begin = vk::CommandBufferBeginInfo::default().flags(usage);
    // SAFETY: a fresh command buffer of our pool, recorded by this thread only.
    unsafe { device.begin_command_buffer(raw, &begin) }
        .map_err(|r| call_error("vkBeginCommandBuffer", r, 0))?;
    if let Some(t) = &prepared.timing {
        // SAFETY: recording state, outside any render pass; the range is the pool's.
        unsafe { device.cmd_reset_query_pool(raw, t.pool, 0, t.queries) };
    }
    if shared.stall_probe == StallProbe::SerialBatches {
        // Issue 28's diagnostic: nothing of this batch starts before all earlier work on
        // the queue completed.
        full_barrier(
            shared,
            raw,
            vk::PipelineStageFlags2::ALL_COMMANDS,
            vk::AccessFlags2::MEMORY_READ | vk::AccessFlags2::MEMORY_WRITE,
        );
    }
    let crumbs = shared.breadcrumbs.as_ref();
    let slot = match shared.stall_probe {
        StallProbe::SubmissionMarkersOnly => None,
        _ => crumbs.and_then(|c| c.take_command_slot()),
    };
    if let Some(slot) = slot {
        prepared.crumbs = Some((slot, command_names(command_buffer.commands())));
    }
    let crumb = crumbs.zip(slot);
    if let Some((c, slot)) = crumb {
        c.record_write(device, raw, slot, 0, After::Nothing);
    }

    let mut bound = vk::Pipeline::null();
    let mut push = Vec::with_capacity(shared.push_constant_size as usize);
    for (index, command) in command_buffer.commands().iter().enumerate() {
        let timed = !matches!(command, Command::Barrier);
        if let (true, Some(t)) = (timed, &prepared.timing) {
            t.stamp(shared, raw, false);
        }
        let traced = prepared.timing.is_some();
        let arguments = prepared
            .arguments
            .as_ref()
            .map(|a| (a, &mut arguments_used));
        record_command(
            shared, raw, index, command, &mut bound, &mut push, arguments, traced,
        )?;
        if let (true, Some(t)) = (timed, &mut prepared.timing) {
            t.stamp(shared, raw, true);
            t.spans.push(Span::of(command));
        }
        if let (true, Some((c, slot))) = (timed, crumb) {
            c.record_write(
                device,
                raw,
                slot,
                index as u32 + 1,
                After::ComputeAndTransfer,
            );
        }
    }
    if let Some(t) = &prepared.timing {
        t.copy_results(shared, raw);
    }
    // Make every write visible to the host, which reads results after waiting on a signal
    // semaphore (a semaphore signal alone does not reach the host domain).
    full_barrier(
        shared,
        raw,
        vk::PipelineStageFlags2::HOST,
        vk::AccessFlags2::HOST_READ | vk::AccessFlags2::HOST_WRITE,
    );
    // SAFETY: recording state, ended once.
    unsafe { device.end_command_buffer(raw) }
        .map_err(|r| call_error("vkEndCommandBuffer", r, 0))?;
    Ok(prepared)
}

/// Short names of commands, for breadcrumb reports: `kernel#entry [x, y, z]`, `copy N`,
/// `fill N`, `|` for a barrier.
fn command_names(commands: &[Command]) -> Vec<String> {
    commands
        .iter()
        .map(|command| match command {
            Command::Dispatch(d) => {
                format!("{}#{} {:?}", d.executable.name(), d.entry, d.workgroups)
            }
            Command::Copy { src, .. } => format!("copy {}", src.len),
            Command::Fill { dst, .. } => format!("fill {}", dst.len),
            Command::Barrier => "|".to_string(),
        })
        .collect()
}

impl Span {
    fn of(command: &Command) -> Span {
        match command {
            Command::Dispatch(d) => Span {
                kind: TraceKind::Dispatch,
                executable: Arc::from(d.executable.name()),
                name: Arc::from(d.executable.name()),
                workgroups: d.workgroups.iter().map(|&w| w as u64).product(),
            },
            Command::Copy { .. } => Span {
                kind: TraceKind::Copy,
                executable: Arc::from(""),
                name: Arc::from("copy"),
                workgroups: 1,
            },
            Command::Fill { .. } | Command::Barrier => Span {
                kind: TraceKind::Fill,
                executable: Arc::from(""),
                name: Arc::from("fill"),
                workgroups: 1,
            },
        }
    }
}

/// Records one command into `raw`.
#[allow(clippy::too_many_arguments)]
fn record_command(
    shared: &Arc<Shared>,
    raw: vk::CommandBuffer,
    index: usize,
    command: &Command,
    bound: &mut vk::Pipeline,
    push: &mut Vec<u8>,
    arguments: Option<(&VulkanBuffer, &mut u64)>,
    traced: bool,
) -> Result<(), HalError> {
    let device = &shared.device;
    {
        match command {
            // Traced: a full barrier, so each command's start timestamp follows the end of
            // the commands before it.
            Command::Barrier if traced => full_barrier(
                shared,
                raw,
                vk::PipelineStageFlags2::ALL_COMMANDS,
                vk::AccessFlags2::MEMORY_READ | vk::AccessFlags2::MEMORY_WRITE,
            ),
            Command::Barrier => command_barrier(shared, raw),
            Command::Dispatch(dispatch) => {
                let executable = dispatch
                    .executable
                    .downcast_ref::<VulkanExecutable>()
                    .filter(|e| Arc::ptr_eq(e.shared(), shared))
                    .ok_or_else(|| HalError::IncompatibleObject {
                        what: format!(
                            "command {index}: executable '{}'",
                            dispatch.executable.name()
                        ),
                        device: shared.name.clone(),
                        reason: "it is not an executable of this Vulkan device".into(),
                    })?;
                let pipeline = executable.pipeline(dispatch.entry)?;
                push.clear();
                for (i, binding) in dispatch.bindings.iter().enumerate() {
                    let buffer = resolve(shared, binding, format!("command {index}: binding {i}"))?;
                    let address = buffer.device_address() + binding.offset;
                    push.extend_from_slice(&address.to_le_bytes());
                }
                push.extend_from_slice(&dispatch.params);
                if let Some(len) = argument_block_len(dispatch) {
                    // Past the inline bindings: the block goes to memory, its address into
                    // the push constants.
                    let (buffer, used) = arguments.ok_or_else(|| {
                        HalError::InvalidCommand(format!(
                            "command {index}: no argument buffer for {} bindings",
                            dispatch.bindings.len()
                        ))
                    })?;
                    let offset = *used;
                    *used += len.next_multiple_of(ARGUMENT_ALIGN);
                    buffer.map_write(offset, len, &mut |bytes| bytes.copy_from_slice(push))?;
                    push.clear();
                    push.extend_from_slice(&(buffer.device_address() + offset).to_le_bytes());
                }
                while push.len() % 4 != 0 {
                    push.push(0);
                }
                if (push.len() as u64) < executable.push_bytes
                    && shared.instance.validation != crate::Validation::Off
                {
                    shared.instance.log.report(
                        "RAFTER-push-constants-unset",
                        format!(
                            "command {index}: dispatch of '{}' entry {} pushes {} bytes ({} \
                             bindings + {} param bytes) but the module declares {} bytes of \
                             push constants: the rest are undefined (maintenance4)",
                            dispatch.executable.name(),
                            dispatch.entry,
                            push.len(),
                            dispatch.bindings.len(),
                            dispatch.params.len(),
                            executable.push_bytes
                        ),
                    );
                }
                if push.len() > shared.push_constant_size as usize {
                    return Err(HalError::LimitExceeded {
                        what: format!(
                            "command {index}: push-constant bytes (8 per binding + params)"
                        ),
                        value: push.len() as u64,
                        max: shared.push_constant_size as u64,
                    });
                }
                if dispatch.workgroups.contains(&0) {
                    return Ok(());
                }
                // SAFETY: recording state; the pipeline and layout belong to this device and
                // the executable (which the HAL command buffer keeps alive) outlives the
                // recording; the push range lies inside the layout's range.
                unsafe {
                    if pipeline != *bound {
                        device.cmd_bind_pipeline(raw, vk::PipelineBindPoint::COMPUTE, pipeline);
                        *bound = pipeline;
                    }
                    if !push.is_empty() {
                        device.cmd_push_constants(
                            raw,
                            shared.pipeline_layout,
                            vk::ShaderStageFlags::COMPUTE,
                            0,
                            push,
                        );
                    }
                    let [x, y, z] = dispatch.workgroups;
                    device.cmd_dispatch(raw, x, y, z);
                }
            }
            Command::Copy { src, dst } => {
                let from = resolve(shared, src, format!("command {index}: copy source"))?;
                let to = resolve(shared, dst, format!("command {index}: copy destination"))?;
                if src.len == 0 {
                    return Ok(());
                }
                let region = [vk::BufferCopy {
                    src_offset: src.offset,
                    dst_offset: dst.offset,
                    size: src.len,
                }];
                // SAFETY: recording state; both ranges were validated against the buffers'
                // sizes when recorded, and the buffers outlive the command buffer.
                unsafe { device.cmd_copy_buffer(raw, from.raw(), to.raw(), &region) };
            }
            Command::Fill { dst, pattern } => {
                let to = resolve(shared, dst, format!("command {index}: fill destination"))?;
                if dst.len == 0 {
                    return Ok(());
                }
                if dst.offset % 4 != 0 || dst.len % 4 != 0 {
                    return Err(HalError::Unsupported(format!(
                        "command {index}: fill of {}..{}: the Vulkan device fills whole \
                         4-byte words (vkCmdFillBuffer), so offset and length must be \
                         multiples of 4",
                        dst.offset,
                        dst.end()
                    )));
                }
                let word = match *pattern {
                    FillPattern::U8(v) => u32::from_le_bytes([v; 4]),
                    FillPattern::U16(v) => {
                        let [a, b] = v.to_le_bytes();
                        u32::from_le_bytes([a, b, a, b])
                    }
                    FillPattern::U32(v) => v,
                };
                // SAFETY: recording state; the range is in bounds and 4-byte aligned.
                unsafe { device.cmd_fill_buffer(raw, to.raw(), dst.offset, dst.len, word) };
            }
        }
    }
    Ok(())
}
