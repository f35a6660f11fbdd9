//! Weights as buffers without a copy.
//!
//! A program's weights are `bytes::Bytes`; when the program comes from a memory-mapped
//! artifact (or a memory-mapped ONNX file) they are slices of the map. On a device whose
//! memory *is* host memory (the CPU), a weight needs no upload at all: [`BytesBuffer`] is a
//! HAL buffer whose bytes are the `Bytes` themselves, read-only.
//!
//! The CPU device's queue resolves bindings to its own allocation type, so a `BytesBuffer`
//! cannot be bound to a CPU dispatch. The runtime therefore passes a CPU kernel its weight
//! operands by index (in the dispatch's push constants, see the `cpu` module) and the kernel
//! reads the same `Bytes` the buffer wraps. Devices with their own memory (a GPU) get a
//! weight uploaded into a buffer of theirs once, when the session is created.

use std::any::Any;
use std::fmt;

use bytes::Bytes;
use rafter_hal::{BufferImpl, DeviceId, HalError, MemoryKind};

/// A read-only HAL buffer over `Bytes`: no allocation, no copy. Its
/// [`as_ptr`](BytesBuffer::as_ptr) is the `Bytes`' pointer.
pub struct BytesBuffer {
    bytes: Bytes,
    device: DeviceId,
}

impl BytesBuffer {
    /// Wraps `bytes` as a buffer of `device` (which must address host memory directly).
    pub fn new(bytes: Bytes, device: DeviceId) -> BytesBuffer {
        BytesBuffer { bytes, device }
    }

    /// The wrapped bytes (a reference-counted handle to the same memory).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The first byte's address: the same as the source `Bytes`'.
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
}

impl BufferImpl for BytesBuffer {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn memory_kind(&self) -> MemoryKind {
        MemoryKind::HostVisibleShared
    }

    fn host_visible(&self) -> bool {
        true
    }

    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn map_read(&self, offset: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> rafter_hal::Result<()> {
        // `Buffer::map_read` has checked the range.
        let start = offset as usize;
        f(&self.bytes[start..start + len as usize]);
        Ok(())
    }

    fn map_write(
        &self,
        _offset: u64,
        _len: u64,
        _f: &mut dyn FnMut(&mut [u8]),
    ) -> rafter_hal::Result<()> {
        Err(HalError::Unsupported(
            "a weight buffer wraps the program's bytes and is read-only".into(),
        ))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl fmt::Debug for BytesBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytesBuffer")
            .field("device", &self.device)
            .field("len", &self.bytes.len())
            .field("ptr", &self.bytes.as_ptr())
            .finish()
    }
}
