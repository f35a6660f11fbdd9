//! The tail every submission ends with: a full barrier, then a 4-byte `vkCmdFillBuffer` into
//! a word of a small host-visible buffer (one word per queue), then a barrier making it
//! visible to the host. Only tests read the word ([`TAIL_MARK`] once a tail ran).
//!
//! Why (issue 28): on NVIDIA's Linux driver (580.159, H200), `rafter conformance --device
//! vulkan --threads 8` stalled in most runs: a tiny batch with no waits never completed
//! and every later batch on its queue queued behind it, while the GPU showed 100% busy.
//! Submissions ending in a compute dispatch and a barrier to the host stage stalled (5 of
//! 8 warm-cache runs), while the same runs with breadcrumbs' markers (a barrier and a fill
//! after the work) finished 23 of 23, each kind of marker alone too
//! (benchmarks/results/stall-2026-11-29-b.md). Neither re-recording command buffers, nor
//! serialising batches, nor locks around signals or pipeline creation helped. With the
//! tail, 200 of 200 runs finished; without it, 0 of 5 in the same call
//! (benchmarks/results/stall-2026-11-29-c.md). The tail
//! costs one barrier and one 4-byte fill per submission; `RAFTER_VULKAN_STALL_PROBE=
//! no-tail` leaves it out, to check the stall's return on a new driver.
//!
//! Synchronisation: a queue's tails all write that queue's own word, and each tail's
//! barrier orders its fill after everything submitted earlier on the queue, earlier
//! tails included, so no two fills race; queues never share a word.

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme, Allocator};
use gpu_allocator::MemoryLocation;

/// One word per queue, each in its own 64-byte line.
const WORD_STRIDE: u64 = 64;

/// What a tail writes (the buffer starts zeroed): lets a test see that tails run.
pub const TAIL_MARK: u32 = 0x7A11_7A11;

/// The tail command buffers (one per queue, recorded once) and the buffer they write.
pub(crate) struct BatchTail {
    buffer: vk::Buffer,
    allocation: Option<Allocation>,
    pool: vk::CommandPool,
    per_queue: Vec<vk::CommandBuffer>,
}

// The words are read through the allocation's persistent mapping (host-coherent, so the
// GPU's writes need no flush); see `word`.

impl BatchTail {
    /// Creates the buffer and records one tail per queue of `family`.
    pub(crate) fn open(
        device: &ash::Device,
        allocator: &mut Allocator,
        family: u32,
        queues: usize,
    ) -> Result<BatchTail, String> {
        let mut tail = BatchTail {
            buffer: vk::Buffer::null(),
            allocation: None,
            pool: vk::CommandPool::null(),
            per_queue: Vec::new(),
        };
        match tail.create(device, allocator, family, queues) {
            Ok(()) => Ok(tail),
            Err(e) => {
                tail.destroy(device, allocator);
                Err(e)
            }
        }
    }

    fn create(
        &mut self,
        device: &ash::Device,
        allocator: &mut Allocator,
        family: u32,
        queues: usize,
    ) -> Result<(), String> {
        let info = vk::BufferCreateInfo::default()
            .size(WORD_STRIDE * queues as u64)
            .usage(vk::BufferUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: `info` lives across the call.
        self.buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| format!("vkCreateBuffer: {r}"))?;
        // SAFETY: the buffer was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(self.buffer) };
        // Host-visible, as breadcrumbs' marker buffer, the configuration measured stall-free.
        let mut allocation = allocator
            .allocate(&AllocationCreateDesc {
                name: "rafter batch tail",
                requirements,
                location: MemoryLocation::GpuToCpu,
                linear: true,
                allocation_scheme: AllocationScheme::GpuAllocatorManaged,
            })
            .map_err(|e| format!("gpu-allocator: {e}"))?;
        if let Some(bytes) = allocation.mapped_slice_mut() {
            bytes.fill(0);
        }
        // SAFETY: the allocation satisfies `requirements`; the buffer is bound once.
        let bound = unsafe {
            device.bind_buffer_memory(self.buffer, allocation.memory(), allocation.offset())
        };
        self.allocation = Some(allocation);
        bound.map_err(|r| format!("vkBindBufferMemory: {r}"))?;
        let pool_info = vk::CommandPoolCreateInfo::default().queue_family_index(family);
        // SAFETY: `pool_info` lives across the call.
        self.pool = unsafe { device.create_command_pool(&pool_info, None) }
            .map_err(|r| format!("vkCreateCommandPool: {r}"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(queues as u32);
        // SAFETY: our pool; the device is not shared with other threads yet.
        self.per_queue = unsafe { device.allocate_command_buffers(&alloc) }
            .map_err(|r| format!("vkAllocateCommandBuffers: {r}"))?;
        for (queue, &raw) in self.per_queue.iter().enumerate() {
            record(device, raw, self.buffer, WORD_STRIDE * queue as u64)?;
        }
        Ok(())
    }

    /// The tail to submit after a batch's own command buffers on queue `queue`.
    pub(crate) fn command_buffer(&self, queue: usize) -> vk::CommandBuffer {
        self.per_queue[queue]
    }

    /// Queue `queue`'s word as the host sees it; `None` when the memory is not mapped
    /// host-coherent (then only the GPU can tell) or there is no such queue.
    pub(crate) fn word(&self, queue: usize) -> Option<u32> {
        let allocation = self.allocation.as_ref()?;
        let coherent = allocation
            .memory_properties()
            .contains(vk::MemoryPropertyFlags::HOST_COHERENT);
        let offset = WORD_STRIDE as usize * queue;
        if !coherent || queue >= self.per_queue.len() {
            return None;
        }
        let ptr = allocation.mapped_ptr()?.as_ptr().cast::<u8>();
        // SAFETY: `offset + 4 <= WORD_STRIDE * queues`, the buffer's size, inside the mapping,
        // which lives as long as `self`; an aligned word read volatile (the GPU writes it).
        Some(unsafe { ptr.add(offset).cast::<u32>().read_volatile() })
    }

    /// Frees everything; called once, by the device's drop when no GPU work is left (or
    /// by `open` on failure). Null handles are skipped by Vulkan.
    pub(crate) fn destroy(&mut self, device: &ash::Device, allocator: &mut Allocator) {
        // SAFETY: no GPU work uses the command buffers or the buffer any more; destroying
        // the pool frees its command buffers.
        unsafe {
            device.destroy_command_pool(self.pool, None);
            device.destroy_buffer(self.buffer, None);
        }
        self.per_queue.clear();
        if let Some(allocation) = self.allocation.take() {
            let _ = allocator.free(allocation);
        }
    }
}

/// Records one queue's tail: barrier, fill of the word at `offset`, host barrier.
fn record(
    device: &ash::Device,
    raw: vk::CommandBuffer,
    buffer: vk::Buffer,
    offset: u64,
) -> Result<(), String> {
    let begin =
        vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
    let before = [vk::MemoryBarrier2::default()
        .src_stage_mask(vk::PipelineStageFlags2::ALL_COMMANDS)
        .src_access_mask(vk::AccessFlags2::MEMORY_WRITE)
        .dst_stage_mask(vk::PipelineStageFlags2::ALL_TRANSFER)
        .dst_access_mask(vk::AccessFlags2::TRANSFER_WRITE)];
    let after = [vk::MemoryBarrier2::default()
        .src_stage_mask(vk::PipelineStageFlags2::ALL_TRANSFER)
        .src_access_mask(vk::AccessFlags2::TRANSFER_WRITE)
        .dst_stage_mask(vk::PipelineStageFlags2::HOST)
        .dst_access_mask(vk::AccessFlags2::HOST_READ)];
    // SAFETY: a fresh command buffer of our pool, recorded once by this thread; the arrays
    // live across the calls; the 4 bytes at `offset` lie inside `buffer` (TRANSFER_DST),
    // which lives as long as the command buffer.
    unsafe {
        device
            .begin_command_buffer(raw, &begin)
            .map_err(|r| format!("vkBeginCommandBuffer: {r}"))?;
        device.cmd_pipeline_barrier2(raw, &vk::DependencyInfo::default().memory_barriers(&before));
        device.cmd_fill_buffer(raw, buffer, offset, 4, TAIL_MARK);
        device.cmd_pipeline_barrier2(raw, &vk::DependencyInfo::default().memory_barriers(&after));
        device
            .end_command_buffer(raw)
            .map_err(|r| format!("vkEndCommandBuffer: {r}"))
    }
}
