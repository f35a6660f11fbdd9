//! Memory: kinds, buffers, and byte ranges of buffers.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::device::DeviceId;
use crate::error::{HalError, Result};

/// Where a buffer's memory lives, as seen from one device.
///
/// A device lists the kinds it offers, with their properties, in
/// [`DeviceInfo::memory`](crate::DeviceInfo::memory); the runtime's memory planner keeps one
/// arena per device per kind. Code should test the properties ([`MemoryKindInfo`]) rather than
/// assume them from the kind: on a CPU every kind is plain host memory, on a discrete GPU only
/// `HostVisibleShared` and `Host` can be mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// Fastest for the device; may not be visible to the host at all (VRAM on a discrete GPU).
    /// Data reaches it by a [`copy`](crate::CommandBufferBuilder::copy) from a host-visible
    /// buffer. Where to put weights and intermediate activations.
    DeviceLocal,
    /// Memory that both the device and the host address directly, with no copy: unified
    /// memory on edge SoCs (the GPU shares DRAM with the CPU), resizable BAR on discrete GPUs
    /// (VRAM the CPU can map over PCIe), or plain host memory on a CPU device. **This is the
    /// zero-copy path**: a tensor produced by one device and consumed by another (or by the
    /// host) lives here, and the hand-off is a semaphore, not a transfer.
    HostVisibleShared,
    /// Host (system) memory the device can read or write, typically slower for it (a GPU
    /// reaching over PCIe). Staging buffers for uploads and downloads.
    Host,
}

impl MemoryKind {
    /// All kinds, in declaration order.
    pub const ALL: [MemoryKind; 3] = [
        MemoryKind::DeviceLocal,
        MemoryKind::HostVisibleShared,
        MemoryKind::Host,
    ];
}

/// Properties of one memory kind on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryKindInfo {
    /// The memory kind.
    pub kind: MemoryKind,
    /// The host can map buffers of this kind ([`Buffer::map_read`], [`Buffer::map_write`]).
    pub host_visible: bool,
    /// Host mappings need no explicit flush or invalidate (the backend does them inside
    /// `map_*` when this is false; callers never see the difference).
    pub host_coherent: bool,
    /// Total bytes of this kind, if the device knows.
    pub capacity: Option<u64>,
}

/// The device side of a buffer: what a backend implements.
///
/// # Thread safety
/// Implementations are `Send + Sync`: a buffer is referenced by command buffers in flight on
/// device threads while the host holds it too.
///
/// # Contract for `map_read` / `map_write`
/// The [`Buffer`] wrapper has already checked that `offset..offset + len` lies within
/// `size()`. The implementation makes device writes visible before calling `f` (invalidate)
/// and host writes visible to later device work after `f` returns (flush). It returns
/// [`HalError::NotHostVisible`] for memory the host cannot map, and may return
/// [`HalError::BufferBusy`] when the range is in use by a conflicting device access the
/// implementation can detect.
pub trait BufferImpl: Send + Sync + fmt::Debug + 'static {
    /// Size in bytes, fixed for the buffer's life.
    fn size(&self) -> u64;
    /// The memory kind it was allocated with.
    fn memory_kind(&self) -> MemoryKind;
    /// Whether the host can map it.
    fn host_visible(&self) -> bool;
    /// The device that allocated it.
    fn device_id(&self) -> DeviceId;
    /// Calls `f` with the bytes `offset..offset + len`, readable.
    fn map_read(&self, offset: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> Result<()>;
    /// Calls `f` with the bytes `offset..offset + len`, writable.
    fn map_write(&self, offset: u64, len: u64, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// For backends to recognise their own buffers ([`Buffer::downcast_ref`]).
    fn as_any(&self) -> &dyn Any;
    /// The first byte of a persistent, host-coherent mapping of the whole buffer, valid
    /// for the buffer's life, if it has one (unified memory, resizable BAR, host memory).
    /// This is what lets another device's host-side kernels (the CPU device's) work on the
    /// buffer in place: a zero-copy boundary between devices. Whoever dereferences it must
    /// order its accesses against the device's own by semaphores, as for `map_*`.
    fn host_address(&self) -> Option<std::ptr::NonNull<u8>> {
        None
    }
}

/// A device buffer: a fixed number of bytes of one [`MemoryKind`].
///
/// A cheap, reference-counted handle (`Clone` shares the same memory). The memory is freed
/// when the last handle is dropped; command buffers hold handles to every buffer they bind,
/// so a buffer lives at least until the work that uses it has completed. Contents of a fresh
/// buffer are unspecified by the HAL (a device may document that it zeroes them).
#[derive(Clone)]
pub struct Buffer(Arc<dyn BufferImpl>);

impl Buffer {
    /// Wraps a backend's buffer.
    pub fn from_impl(inner: Arc<dyn BufferImpl>) -> Buffer {
        Buffer(inner)
    }

    /// The backend object, for backends to recognise their own buffers.
    pub fn downcast_ref<T: BufferImpl>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.0.size()
    }

    /// The memory kind it was allocated from.
    pub fn memory_kind(&self) -> MemoryKind {
        self.0.memory_kind()
    }

    /// Whether the host can map it.
    pub fn host_visible(&self) -> bool {
        self.0.host_visible()
    }

    /// The device that owns it.
    pub fn device_id(&self) -> DeviceId {
        self.0.device_id()
    }

    /// The buffer's persistent host-coherent mapping, if any ([`BufferImpl::host_address`]).
    pub fn host_address(&self) -> Option<std::ptr::NonNull<u8>> {
        self.0.host_address()
    }

    /// Whether two handles refer to the same buffer.
    pub fn same_buffer(&self, other: &Buffer) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }

    /// The range `offset..offset + len`, checked against the size.
    pub fn range(&self, offset: u64, len: u64) -> Result<BufferRange> {
        let range = BufferRange {
            buffer: self.clone(),
            offset,
            len,
        };
        range.validate("range")?;
        Ok(range)
    }

    /// The whole buffer as a range.
    pub fn whole(&self) -> BufferRange {
        BufferRange {
            buffer: self.clone(),
            offset: 0,
            len: self.size(),
        }
    }

    /// Maps `offset..offset + len` for reading and calls `f` with the bytes.
    ///
    /// Host mapping is only meaningful when no device work writing this range is in flight:
    /// wait on the semaphore that the producing submission signals first. (Devices that can
    /// detect a conflicting access report [`HalError::BufferBusy`]; others give stale data.)
    pub fn map_read<R>(&self, offset: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        check_range("map", offset, len, self.size())?;
        let mut f = Some(f);
        let mut out = None;
        self.0.map_read(offset, len, &mut |bytes| {
            if let Some(f) = f.take() {
                out = Some(f(bytes));
            }
        })?;
        out.ok_or_else(|| {
            HalError::Unsupported("buffer implementation did not call map_read's closure".into())
        })
    }

    /// Maps `offset..offset + len` for writing and calls `f` with the bytes. Writes are visible
    /// to device work submitted after this returns. Same rules as [`Buffer::map_read`] about
    /// device work in flight (reading *or* writing the range).
    pub fn map_write<R>(&self, offset: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        check_range("map", offset, len, self.size())?;
        let mut f = Some(f);
        let mut out = None;
        self.0.map_write(offset, len, &mut |bytes| {
            if let Some(f) = f.take() {
                out = Some(f(bytes));
            }
        })?;
        out.ok_or_else(|| {
            HalError::Unsupported("buffer implementation did not call map_write's closure".into())
        })
    }

    /// Copies `len` bytes at `offset` out of the buffer.
    pub fn read_bytes(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.map_read(offset, len, |bytes| bytes.to_vec())
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.map_write(offset, data.len() as u64, |bytes| {
            bytes.copy_from_slice(data)
        })
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A byte range of a buffer: what commands bind.
///
/// Fields are public so ranges are easy to build; every HAL entry point that takes one
/// ([`CommandBufferBuilder::dispatch`](crate::CommandBufferBuilder::dispatch), `copy`, `fill`)
/// validates it against the buffer's size and returns [`HalError::OutOfRange`] rather than
/// ever touching bytes outside the buffer. [`Buffer::range`] validates on construction.
#[derive(Clone, Debug)]
pub struct BufferRange {
    /// The buffer.
    pub buffer: Buffer,
    /// The first byte, from the buffer's start.
    pub offset: u64,
    /// The length in bytes.
    pub len: u64,
}

impl BufferRange {
    /// One past the last byte (`offset + len`, saturating).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// Checks the range against the buffer; `what` names it in the error (`"binding 2"`).
    pub fn validate(&self, what: &str) -> Result<()> {
        check_range(what, self.offset, self.len, self.buffer.size())
    }

    /// A sub-range, `offset` relative to this range's start, checked to lie within it.
    pub fn sub_range(&self, offset: u64, len: u64) -> Result<BufferRange> {
        check_range("sub-range", offset, len, self.len)?;
        Ok(BufferRange {
            buffer: self.buffer.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// Whether two ranges share at least one byte of the same buffer.
    pub fn overlaps(&self, other: &BufferRange) -> bool {
        self.buffer.same_buffer(&other.buffer)
            && self.len > 0
            && other.len > 0
            && self.offset < other.end()
            && other.offset < self.end()
    }
}

/// Checks `offset..offset + len` against `size`.
pub fn check_range(what: &str, offset: u64, len: u64, size: u64) -> Result<()> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| HalError::RangeOverflow {
            what: what.to_string(),
            offset,
            len,
        })?;
    if end > size {
        return Err(HalError::OutOfRange {
            what: what.to_string(),
            start: offset,
            end,
            size,
        });
    }
    Ok(())
}
