//! Host memory for the CPU device: 64-byte aligned allocations with run-time borrow tracking.
//!
//! # Why 64-byte alignment
//! Kernels use SIMD loads and stores; AVX-512 vectors are 64 bytes and so is a cache line on
//! every CPU we target. A 64-aligned base lets kernels use aligned vector accesses and keeps
//! two buffers (or two tiles written by two threads) off the same cache line (no false
//! sharing at buffer boundaries). It also satisfies every element type's alignment, so typed
//! views ([`BindingRead::as_slice`]) of ranges at aligned offsets always succeed.
//!
//! # Why large allocations are mapped
//! An allocation of [`MAPPED_FROM`] bytes or more is an anonymous memory mapping rather than
//! a heap block: the kernel hands out zero pages on first touch, so a buffer sized for a
//! bound (a KV cache for 4096 positions, an arena planned for the longest prompt) costs
//! resident memory only for the bytes a call actually writes. The heap's aligned
//! `alloc_zeroed` would memset (and so commit) every page up front. Pages are 4 KiB or
//! larger, so the mapping is also 64-byte aligned.
//!
//! # Why borrow tracking
//! Workgroups of a dispatch and commands of one barrier segment run on several threads at
//! once, each taking `&[u8]` or `&mut [u8]` views of buffer memory. Rust forbids a `&mut`
//! view overlapping any other live view; the HAL's aliasing rule (concurrent commands never
//! write bytes another reads or writes) is what makes that hold, and the runtime guarantees
//! it. Each allocation keeps the list of live views (a short `Vec` behind a `Mutex`, touched
//! once per view, not per element), and refuses a view that would overlap a live one with at
//! least one of them writing. A broken aliasing promise therefore fails the command with an
//! error instead of being a data race. The check catches overlaps that happen at the same
//! time; it cannot see overlaps that happen not to coincide.

use std::alloc::Layout;
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rafter_hal::{BufferImpl, DeviceId, HalError, MemoryKind};

/// Alignment of every CPU allocation, in bytes.
pub const ALIGNMENT: usize = 64;

/// Allocations of at least this many bytes are anonymous mappings (see the module docs).
pub const MAPPED_FROM: usize = 1 << 20;

/// Where an allocation's bytes live.
enum Backing {
    /// A heap block of this layout, freed with it.
    Heap(Layout),
    /// An anonymous mapping, unmapped when dropped; `ptr` points at its first byte.
    Mapped(#[allow(dead_code)] memmap2::MmapMut),
    /// Another device's buffer, through its persistent host-coherent mapping
    /// ([`rafter_hal::Buffer::host_address`]); held so the mapping outlives every view.
    Foreign(#[allow(dead_code)] rafter_hal::Buffer),
}

/// One aligned host allocation. Its bytes are only ever reached through [`HostBorrow`]s,
/// which [`HostAllocation::borrow`] hands out only when they conflict with no live one.
pub(crate) struct HostAllocation {
    ptr: NonNull<u8>,
    size: usize,
    backing: Backing,
    borrows: Mutex<BorrowSet>,
    accounting: Arc<AtomicU64>,
}

// SAFETY: the allocation is plain bytes owned by this struct; every access to them goes
// through `borrow`, which hands out overlapping views only when all of them are read-only.
unsafe impl Send for HostAllocation {}
// SAFETY: as above; the borrow set is behind a Mutex.
unsafe impl Sync for HostAllocation {}

#[derive(Default)]
struct BorrowSet {
    next_id: u64,
    live: Vec<LiveBorrow>,
}

struct LiveBorrow {
    id: u64,
    start: usize,
    end: usize,
    write: bool,
}

impl HostAllocation {
    /// Allocates `size` zeroed bytes, 64-byte aligned. `accounting` is the device's running
    /// total, already charged with `size` by the caller; it is credited back on drop.
    pub(crate) fn new(size: usize, accounting: Arc<AtomicU64>) -> Result<HostAllocation, HalError> {
        let (ptr, backing) = if size >= MAPPED_FROM {
            let mut map = memmap2::MmapOptions::new()
                .len(size)
                .map_anon()
                .map_err(|e| HalError::OutOfMemory {
                    size: size as u64,
                    reason: format!("anonymous mapping: {e}"),
                })?;
            let ptr = NonNull::new(map.as_mut_ptr()).expect("a mapping is never at address 0");
            (ptr, Backing::Mapped(map))
        } else {
            // A zero-size layout may not be passed to the allocator; give empty buffers one
            // (never exposed) cache line.
            let layout = Layout::from_size_align(size.max(1), ALIGNMENT).map_err(|e| {
                HalError::OutOfMemory {
                    size: size as u64,
                    reason: e.to_string(),
                }
            })?;
            // SAFETY: `layout` has non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(ptr).ok_or_else(|| HalError::OutOfMemory {
                size: size as u64,
                reason: "the system allocator returned null".into(),
            })?;
            (ptr, Backing::Heap(layout))
        };
        Ok(HostAllocation {
            ptr,
            size,
            backing,
            borrows: Mutex::new(BorrowSet::default()),
            accounting,
        })
    }

    /// Wraps another device's buffer that the host addresses directly (its
    /// [`host_address`](rafter_hal::Buffer::host_address)), so CPU kernels bind it like
    /// their own memory: the zero-copy boundary between the CPU and a device sharing its
    /// memory. Charges no accounting (the owning device does). `None` when the buffer has
    /// no such mapping.
    pub(crate) fn foreign(buffer: &rafter_hal::Buffer) -> Option<HostAllocation> {
        let ptr = buffer.host_address()?;
        let size = usize::try_from(buffer.size()).ok()?;
        Some(HostAllocation {
            ptr,
            size,
            backing: Backing::Foreign(buffer.clone()),
            borrows: Mutex::new(BorrowSet::default()),
            accounting: Arc::new(AtomicU64::new(size as u64)),
        })
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    fn borrows(&self) -> MutexGuard<'_, BorrowSet> {
        self.borrows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A view of `start..start + len`, or `Err(())` if it conflicts with a live view.
    /// The caller has checked the range against `size`.
    pub(crate) fn borrow(
        &self,
        start: usize,
        len: usize,
        write: bool,
    ) -> Result<HostBorrow<'_>, ()> {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.size),
            "HostAllocation::borrow: range {start}+{len} outside {} bytes (caller must check)",
            self.size
        );
        let end = start + len;
        let id = if len == 0 {
            None
        } else {
            let mut set = self.borrows();
            let conflict = set
                .live
                .iter()
                .any(|b| (write || b.write) && b.start < end && start < b.end);
            if conflict {
                return Err(());
            }
            set.next_id += 1;
            let id = set.next_id;
            set.live.push(LiveBorrow {
                id,
                start,
                end,
                write,
            });
            Some(id)
        };
        // SAFETY: `start <= size`, so the pointer stays within (or one past) the allocation.
        let ptr = unsafe { self.ptr.as_ptr().add(start) };
        Ok(HostBorrow {
            alloc: self,
            id,
            ptr,
            len,
        })
    }

    fn release(&self, id: u64) {
        let mut set = self.borrows();
        if let Some(pos) = set.live.iter().position(|b| b.id == id) {
            set.live.swap_remove(pos);
        }
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `new` with exactly this layout; no borrow can outlive
            // `self`. (A mapping is unmapped when `backing` drops.)
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        self.accounting
            .fetch_sub(self.size as u64, Ordering::Relaxed);
    }
}

/// A registered view of an allocation; deregisters itself on drop.
pub(crate) struct HostBorrow<'a> {
    alloc: &'a HostAllocation,
    id: Option<u64>,
    ptr: *mut u8,
    len: usize,
}

impl<'a> HostBorrow<'a> {
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies in the allocation (checked in `borrow`) and is
        // registered; no live writer overlaps it (a read borrow) or nothing else overlaps it
        // (a write borrow).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Only for borrows taken with `write = true` (the guard types ensure that).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; a write borrow is the only live view of its bytes, and
        // `&mut self` makes this the only slice derived from it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBorrow<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.alloc.release(id);
        }
    }
}

/// A read-only view of (part of) a bound buffer range. Derefs to `[u8]`.
pub struct BindingRead<'a>(pub(crate) HostBorrow<'a>);

/// A writable view of (part of) a bound buffer range. Derefs to `[u8]` mutably.
pub struct BindingWrite<'a>(pub(crate) HostBorrow<'a>);

impl Deref for BindingRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl Deref for BindingWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl DerefMut for BindingWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.bytes_mut()
    }
}

impl BindingRead<'_> {
    /// The bytes as a slice of `T`, if they are aligned for `T` and a whole number of `T`s.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], String> {
        cast(self.0.bytes())
    }
}

impl BindingWrite<'_> {
    /// The bytes as a slice of `T`, if they are aligned for `T` and a whole number of `T`s.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], String> {
        cast(self.0.bytes())
    }

    /// The bytes as a mutable slice of `T`, if they are aligned for `T` and a whole number of
    /// `T`s.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], String> {
        let bytes = self.0.bytes_mut();
        let len = bytes.len();
        // SAFETY: `T: Element` is plain data: every bit pattern is a valid `T`.
        let (head, body, tail) = unsafe { bytes.align_to_mut::<T>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(cast_error::<T>(len));
        }
        Ok(body)
    }
}

fn cast<T: Element>(bytes: &[u8]) -> Result<&[T], String> {
    // SAFETY: `T: Element` is plain data: every bit pattern is a valid `T`.
    let (head, body, tail) = unsafe { bytes.align_to::<T>() };
    if !head.is_empty() || !tail.is_empty() {
        return Err(cast_error::<T>(bytes.len()));
    }
    Ok(body)
}

fn cast_error<T>(len: usize) -> String {
    format!(
        "{len} bytes are not an aligned, whole slice of {}",
        std::any::type_name::<T>()
    )
}

/// Plain-data element types a binding can be viewed as.
///
/// # Safety
/// Implementors must be `Copy` types with no padding and no invalid bit patterns.
pub unsafe trait Element: Copy + Send + Sync + 'static {}

// SAFETY: primitive integers and floats have no padding and accept every bit pattern.
unsafe impl Element for u8 {}
// SAFETY: as above.
unsafe impl Element for i8 {}
// SAFETY: as above.
unsafe impl Element for u16 {}
// SAFETY: as above.
unsafe impl Element for i16 {}
// SAFETY: as above.
unsafe impl Element for u32 {}
// SAFETY: as above.
unsafe impl Element for i32 {}
// SAFETY: as above.
unsafe impl Element for u64 {}
// SAFETY: as above.
unsafe impl Element for i64 {}
// SAFETY: as above.
unsafe impl Element for f32 {}
// SAFETY: as above.
unsafe impl Element for f64 {}

/// A CPU device buffer: host memory, whatever its [`MemoryKind`].
pub struct CpuBuffer {
    pub(crate) alloc: Arc<HostAllocation>,
    kind: MemoryKind,
    device: DeviceId,
}

impl CpuBuffer {
    pub(crate) fn new(alloc: HostAllocation, kind: MemoryKind, device: DeviceId) -> CpuBuffer {
        CpuBuffer {
            alloc: Arc::new(alloc),
            kind,
            device,
        }
    }

    fn busy(offset: u64, len: u64) -> HalError {
        HalError::BufferBusy {
            what: "map".into(),
            start: offset,
            end: offset + len,
        }
    }
}

impl BufferImpl for CpuBuffer {
    fn size(&self) -> u64 {
        self.alloc.size() as u64
    }

    fn memory_kind(&self) -> MemoryKind {
        self.kind
    }

    fn host_visible(&self) -> bool {
        true
    }

    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn map_read(&self, offset: u64, len: u64, f: &mut dyn FnMut(&[u8])) -> rafter_hal::Result<()> {
        let borrow = self
            .alloc
            .borrow(offset as usize, len as usize, false)
            .map_err(|()| Self::busy(offset, len))?;
        f(borrow.bytes());
        Ok(())
    }

    fn map_write(
        &self,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> rafter_hal::Result<()> {
        let mut borrow = self
            .alloc
            .borrow(offset as usize, len as usize, true)
            .map_err(|()| Self::busy(offset, len))?;
        f(borrow.bytes_mut());
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("device", &self.device)
            .field("kind", &self.kind)
            .field("size", &self.alloc.size())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident memory of this process, in bytes (Linux).
    fn resident() -> Option<usize> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads resident pages from /proc, which Miri does not model"
    )]
    fn large_allocations_are_zero_aligned_and_resident_only_where_touched() {
        let size = 256 << 20;
        let before = resident();
        let a = HostAllocation::new(size, Arc::new(AtomicU64::new(size as u64))).unwrap();
        assert_eq!(a.ptr.as_ptr() as usize % ALIGNMENT, 0);
        {
            let mut w = a.borrow(size - 4096, 4096, true).unwrap();
            assert!(w.bytes().iter().all(|&b| b == 0));
            w.bytes_mut()[7] = 42;
        }
        assert_eq!(a.borrow(size - 4096, 8, false).unwrap().bytes()[7], 42);
        assert!(a
            .borrow(0, 8, false)
            .unwrap()
            .bytes()
            .iter()
            .all(|&b| b == 0));
        if let (Some(before), Some(after)) = (before, resident()) {
            // Other tests run in parallel threads, so leave a wide margin: the point is
            // that 256 MiB were not committed.
            assert!(
                after.saturating_sub(before) < 64 << 20,
                "{} MiB became resident for an untouched 256 MiB allocation",
                (after - before) >> 20
            );
        }
    }

    #[test]
    fn small_allocations_are_zero_and_aligned() {
        for size in [0, 1, 63, 4096, MAPPED_FROM - 1] {
            let a = HostAllocation::new(size, Arc::new(AtomicU64::new(size as u64))).unwrap();
            assert_eq!(a.ptr.as_ptr() as usize % ALIGNMENT, 0);
            assert!(a
                .borrow(0, size, false)
                .unwrap()
                .bytes()
                .iter()
                .all(|&b| b == 0));
        }
    }
}
