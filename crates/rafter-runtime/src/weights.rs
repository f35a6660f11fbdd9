//! Weights as buffers without a copy.
//!
//! A program's weights are `bytes::Bytes`; when the program comes from a memory-mapped
//! artifact (or a memory-mapped ONNX file) they are slices of the map. On a device whose
//! memory *is* host memory (the CPU), a weight needs no upload at all: [`BytesBuffer`] is a
//! HAL buffer whose bytes are the `Bytes` themselves, read-only.
//!
//! The CPU device's queue resolves bindings to its own allocation type, so a `BytesBuffer`
//! cannot be bound to a CPU dispatch. The runtime therefore passes a CPU kernel its weight
//! operands by index (in the dispatch's push constants, see `rafter-runtime-cpu`) and the kernel
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

/// Where a weight copied by [`aligned`] starts: a cache line.
pub const WEIGHT_ALIGN: usize = 64;

/// `bytes`, or a copy of them starting on a [`WEIGHT_ALIGN`] boundary where they do not
/// start on a multiple of `element` bytes (the weight's element size), which kernels need
/// to read them in place.
///
/// Weights from an artifact start page-aligned in its map; weights of an ONNX model
/// compiled in memory are slices of the protobuf and may start anywhere. Kernels would copy
/// a misaligned operand on *every* call to read it as `f32`s: all-MiniLM-L6's 47 MB
/// embedding table made 25 of a 50 ms call (`rafter bench model.onnx`). Copying once, when
/// the session is created, costs that copy once. Weights already element-aligned are kept
/// as they are (bound without a copy).
pub fn aligned(bytes: Bytes, element: usize) -> Bytes {
    if bytes.as_ptr() as usize % element.max(1) == 0 {
        return bytes;
    }
    let mut copy = vec![0u8; bytes.len() + WEIGHT_ALIGN];
    let start = copy.as_ptr().align_offset(WEIGHT_ALIGN);
    copy[start..start + bytes.len()].copy_from_slice(&bytes);
    Bytes::from(copy).slice(start..start + bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_weights_are_copied_to_an_aligned_start_and_aligned_ones_are_kept() {
        let backing = Bytes::from((0..=255u8).cycle().take(10_000).collect::<Vec<u8>>());
        for offset in 0..WEIGHT_ALIGN {
            let w = backing.slice(offset..offset + 4_000);
            let a = aligned(w.clone(), 4);
            assert_eq!(a, w, "offset {offset}: same bytes");
            if w.as_ptr() as usize % 4 == 0 {
                assert_eq!(
                    a.as_ptr(),
                    w.as_ptr(),
                    "an f32-aligned weight is not copied"
                );
            } else {
                assert_eq!(a.as_ptr() as usize % WEIGHT_ALIGN, 0, "offset {offset}");
            }
        }
        assert!(aligned(Bytes::new(), 8).is_empty());
    }
}
