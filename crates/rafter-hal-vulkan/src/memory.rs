//! Buffers: a `VkBuffer` bound to gpu-allocator memory, with its 64-bit device address.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, RwLock};

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use rafter_hal::{BufferImpl, DeviceId, HalError, MemoryKind};

use crate::device::{location, Shared, BUFFER_USAGE};
use crate::error::call_error;

/// The host address of a mapped allocation.
#[derive(Clone, Copy)]
struct MappedPtr(NonNull<u8>);

// SAFETY: the pointer is a persistent mapping of device memory owned by the buffer; it is
// valid from any thread for the buffer's life, and every access goes through the buffer's
// `map_lock`, which serialises host writers against host readers.
unsafe impl Send for MappedPtr {}
// SAFETY: as above.
unsafe impl Sync for MappedPtr {}

/// A Vulkan buffer. Kernels reach it by [`device_address`](VulkanBuffer::device_address);
/// copies and fills by its handle.
pub struct VulkanBuffer {
    shared: Arc<Shared>,
    buffer: vk::Buffer,
    allocation: Mutex<Option<Allocation>>,
    address: u64,
    size: u64,
    kind: MemoryKind,
    /// Host-visible *and* coherent: only such memory is mapped, so no flush or invalidate
    /// (which works on whole atoms and could discard a neighbour's unflushed writes) is
    /// ever needed.
    mapped: Option<MappedPtr>,
    memory_flags: vk::MemoryPropertyFlags,
    /// Host mappings: readers share, a writer is alone.
    map_lock: RwLock<()>,
}

impl VulkanBuffer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        size: u64,
        kind: MemoryKind,
    ) -> Result<VulkanBuffer, HalError> {
        // Vulkan has no empty buffers; an empty HAL buffer gets 4 bytes nobody can reach.
        let vk_size = size.max(4);
        let info = vk::BufferCreateInfo::default()
            .size(vk_size)
            .usage(BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let device = &shared.device;
        // SAFETY: `info` lives across the call; the size is within maxBufferSize (checked by
        // `allocate`).
        let buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| call_error("vkCreateBuffer", r, size))?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(buffer) };
        let allocated = {
            let mut guard = shared.allocator.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(allocator) => allocator
                    .allocate(&AllocationCreateDesc {
                        name: "rafter buffer",
                        requirements,
                        location: location(kind),
                        linear: true,
                        allocation_scheme: AllocationScheme::GpuAllocatorManaged,
                    })
                    .map_err(|e| {
                        let max = shared.caps.limits.max_memory_allocation_size;
                        let beyond = if requirements.size > max {
                            format!(" (the driver's maxMemoryAllocationSize is {max} bytes)")
                        } else {
                            String::new()
                        };
                        HalError::OutOfMemory {
                            size,
                            reason: format!("gpu-allocator: {e}{beyond}"),
                        }
                    }),
                None => Err(HalError::DeviceLost("the device is being destroyed".into())),
            }
        };
        let allocation = match allocated {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer was never bound or used.
                unsafe { device.destroy_buffer(buffer, None) };
                return Err(e);
            }
        };
        // SAFETY: the allocation satisfies `requirements` (size, alignment, type bits) and
        // is bound exactly once, before any use.
        let bound =
            unsafe { device.bind_buffer_memory(buffer, allocation.memory(), allocation.offset()) };
        let memory_flags = allocation.memory_properties();
        let mapped = allocation
            .mapped_ptr()
            .filter(|_| memory_flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT))
            .map(|p| MappedPtr(p.cast()));
        let mut this = VulkanBuffer {
            shared: shared.clone(),
            buffer,
            allocation: Mutex::new(Some(allocation)),
            address: 0,
            size,
            kind,
            mapped,
            memory_flags,
            map_lock: RwLock::new(()),
        };
        bound.map_err(|r| call_error("vkBindBufferMemory", r, size))?;
        let address_info = vk::BufferDeviceAddressInfo::default().buffer(buffer);
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage, bound memory allocated with
        // the device-address flag (gpu-allocator's `buffer_device_address`).
        this.address = unsafe { device.get_buffer_device_address(&address_info) };
        Ok(this)
    }

    /// The buffer's 64-bit device address: what kernels are given in push constants.
    pub fn device_address(&self) -> u64 {
        self.address
    }

    pub(crate) fn raw(&self) -> vk::Buffer {
        self.buffer
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The memory type's flags (for tests and `rafter devices`).
    pub fn memory_flags(&self) -> vk::MemoryPropertyFlags {
        self.memory_flags
    }

    /// The mapped bytes `offset..offset + len`. The HAL wrapper has checked the range.
    fn bytes(&self, offset: u64, len: u64) -> Result<*mut u8, HalError> {
        let mapped = self
            .mapped
            .ok_or(HalError::NotHostVisible { kind: self.kind })?;
        debug_assert!(offset + len <= self.size);
        // SAFETY: `offset <= size` and the mapping covers the whole allocation, which is at
        // least `size` bytes; offsets fit `usize` because the mapping does.
        Ok(unsafe { mapped.0.as_ptr().add(offset as usize) })
    }
}

impl BufferImpl for VulkanBuffer {
    fn size(&self) -> u64 {
        self.size
    }

    fn memory_kind(&self) -> MemoryKind {
        self.kind
    }

    fn host_visible(&self) -> bool {
        self.mapped.is_some()
    }

    fn device_id(&self) -> DeviceId {
        self.shared.id
    }

    fn map_read(&self, offset: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> Result<(), HalError> {
        let ptr = self.bytes(offset, len)?;
        let _guard = self.map_lock.read().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ptr..ptr+len` lies in the coherent mapping (checked by `Buffer::map_read`
        // and `bytes`); host writers are excluded by the lock. Device work writing the range
        // concurrently is a contract violation the HAL documents (stale data, no UB in the
        // sense of the host's memory model, as the memory is shared with another agent).
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
        f(bytes);
        Ok(())
    }

    fn map_write(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), HalError> {
        let ptr = self.bytes(offset, len)?;
        let _guard = self.map_lock.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: as in `map_read`, and the write lock makes this the only host access.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len as usize) };
        f(bytes);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    /// The coherent persistent mapping (only coherent memory is mapped, see `mapped`).
    /// A host-side kernel writing through it bypasses `map_lock`; the runtime orders such
    /// kernels against every other access by semaphores.
    fn host_address(&self) -> Option<NonNull<u8>> {
        self.mapped.map(|p| p.0)
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone, and submissions hold handles to every buffer they
        // use until they complete, so the device no longer uses it.
        unsafe { self.shared.device.destroy_buffer(self.buffer, None) };
        let allocation = self
            .allocation
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(allocation) = allocation {
            let mut guard = self
                .shared
                .allocator
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(allocator) = guard.as_mut() {
                let _ = allocator.free(allocation);
            }
        }
    }
}

impl fmt::Debug for VulkanBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanBuffer")
            .field("size", &self.size)
            .field("kind", &self.kind)
            .field("address", &format_args!("{:#x}", self.address))
            .field("mapped", &self.mapped.is_some())
            .finish()
    }
}
