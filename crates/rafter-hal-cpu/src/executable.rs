//! CPU executables: entry points that are Rust closures.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use rafter_hal::{
    DeviceId, ExecutableImpl, ExecutablePayload, ExecutableSpec, HalError, FORMAT_CPU_KERNELS,
};

use crate::memory::{BindingRead, BindingWrite, HostAllocation};

/// A CPU kernel: called once per workgroup of a dispatch, possibly on several worker threads
/// at once (hence `Send + Sync`). Returns `Err(message)` to fail the dispatch; a panic is
/// caught and fails it too. Either way the submission's signal semaphores fail with a message
/// naming the entry point and workgroup, followed by this message.
pub type CpuKernel = Arc<dyn Fn(&DispatchContext<'_>) -> Result<(), String> + Send + Sync>;

/// The contents of a [`FORMAT_CPU_KERNELS`] executable: named kernels, in entry-point order.
/// The compiler fills one with reference-kernel closures; [`CpuKernels::into_spec`] makes the
/// [`ExecutableSpec`] that [`Device::load_executable`](rafter_hal::Device::load_executable)
/// takes.
#[derive(Clone, Default)]
pub struct CpuKernels {
    entries: Vec<(String, CpuKernel)>,
}

impl CpuKernels {
    /// No entry points yet.
    pub fn new() -> CpuKernels {
        CpuKernels::default()
    }

    /// Adds an entry point (its index is the number of entries before it).
    pub fn with_entry(
        mut self,
        name: impl Into<String>,
        kernel: impl Fn(&DispatchContext<'_>) -> Result<(), String> + Send + Sync + 'static,
    ) -> CpuKernels {
        self.entries.push((name.into(), Arc::new(kernel)));
        self
    }

    /// Adds an entry point from an existing kernel handle.
    pub fn push(&mut self, name: impl Into<String>, kernel: CpuKernel) {
        self.entries.push((name.into(), kernel));
    }

    /// The number of entry points.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry point.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The spec for loading these kernels as an executable called `name`.
    pub fn into_spec(self, name: impl Into<String>) -> ExecutableSpec {
        ExecutableSpec {
            name: name.into(),
            format: FORMAT_CPU_KERNELS.to_string(),
            payload: ExecutablePayload::Native(Arc::new(self)),
        }
    }
}

impl fmt::Debug for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(name, _)| name))
            .finish()
    }
}

/// A loaded CPU executable.
pub struct CpuExecutable {
    name: Arc<str>,
    entry_names: Vec<String>,
    pub(crate) entry_arcs: Vec<Arc<str>>,
    pub(crate) kernels: Vec<CpuKernel>,
    device: DeviceId,
}

impl CpuExecutable {
    pub(crate) fn load(
        spec: &ExecutableSpec,
        device: DeviceId,
        device_name: &str,
    ) -> Result<CpuExecutable, HalError> {
        if spec.format != FORMAT_CPU_KERNELS {
            return Err(HalError::UnsupportedExecutableFormat {
                device: device_name.to_string(),
                format: spec.format.clone(),
            });
        }
        let invalid = |reason: String| HalError::InvalidExecutable {
            name: spec.name.clone(),
            reason,
        };
        let kernels = match &spec.payload {
            ExecutablePayload::Native(any) => {
                any.downcast_ref::<CpuKernels>().ok_or_else(|| {
                    invalid("the payload of a cpu-kernels executable must be a CpuKernels".into())
                })?
            }
            ExecutablePayload::Bytes(_) => {
                return Err(invalid(
                    "cpu-kernels executables are in-process closures, not serialized bytes".into(),
                ))
            }
        };
        for (i, (name, _)) in kernels.entries.iter().enumerate() {
            if kernels.entries[..i].iter().any(|(other, _)| other == name) {
                return Err(invalid(format!("entry point '{name}' is defined twice")));
            }
        }
        Ok(CpuExecutable {
            name: spec.name.as_str().into(),
            entry_names: kernels.entries.iter().map(|(n, _)| n.clone()).collect(),
            entry_arcs: kernels
                .entries
                .iter()
                .map(|(n, _)| n.as_str().into())
                .collect(),
            kernels: kernels.entries.iter().map(|(_, k)| k.clone()).collect(),
            device,
        })
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.name.clone()
    }
}

impl ExecutableImpl for CpuExecutable {
    fn name(&self) -> &str {
        &self.name
    }

    fn entry_points(&self) -> &[String] {
        &self.entry_names
    }

    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl fmt::Debug for CpuExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuExecutable")
            .field("name", &self.name)
            .field("entry_points", &self.entry_names)
            .field("device", &self.device)
            .finish()
    }
}

/// A bound buffer range, resolved to its host allocation.
#[derive(Clone)]
pub(crate) struct ResolvedRange {
    pub(crate) alloc: Arc<HostAllocation>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// What a kernel sees of its dispatch: its bindings, its push constants, and where this call
/// sits in the workgroup grid.
///
/// # Bindings and the aliasing rule
/// [`read`](Self::read) and [`write`](Self::write) (and their `_range` forms) return views of
/// the bound ranges; the views are registered with the buffer while they live. Rust's rule
/// applies across threads and commands: a writable view may not overlap any other live view,
/// and the HAL's aliasing rule makes that hold: the runtime never lets commands that may run
/// at the same time write bytes another reads or writes. What that means for a kernel:
/// - workgroups of one dispatch run concurrently, so each must take a writable view of only
///   the part it writes ([`write_range`](Self::write_range)), never the whole range;
/// - an in-place kernel, bound to the same bytes as input and output, must take one writable
///   view, not a read view of one binding and a write view of the other.
///
/// A view that would break the rule is refused with an error (the dispatch fails with it)
/// rather than creating a data race.
pub struct DispatchContext<'a> {
    pub(crate) entry: &'a str,
    pub(crate) bindings: &'a [ResolvedRange],
    pub(crate) params: &'a [u8],
    pub(crate) workgroup_id: [u32; 3],
    pub(crate) workgroup_count: [u32; 3],
}

impl<'a> DispatchContext<'a> {
    /// The entry point being run.
    pub fn entry_name(&self) -> &str {
        self.entry
    }

    /// This call's position in the grid, each coordinate below [`workgroup_count`](Self::workgroup_count).
    pub fn workgroup_id(&self) -> [u32; 3] {
        self.workgroup_id
    }

    /// The grid of the dispatch.
    pub fn workgroup_count(&self) -> [u32; 3] {
        self.workgroup_count
    }

    /// The workgroup id flattened, x fastest: `x + nx * (y + ny * z)`.
    pub fn workgroup_index(&self) -> u64 {
        let [x, y, z] = self.workgroup_id.map(u64::from);
        let [nx, ny, _] = self.workgroup_count.map(u64::from);
        x + nx * (y + ny * z)
    }

    /// The push constants of the dispatch.
    pub fn params(&self) -> &[u8] {
        self.params
    }

    /// The `index`-th little-endian `u32` of the push constants.
    pub fn param_u32(&self, index: usize) -> Result<u32, String> {
        self.param_bytes::<4>(index).map(u32::from_le_bytes)
    }

    /// The `index`-th little-endian `u64` of the push constants.
    pub fn param_u64(&self, index: usize) -> Result<u64, String> {
        self.param_bytes::<8>(index).map(u64::from_le_bytes)
    }

    fn param_bytes<const N: usize>(&self, index: usize) -> Result<[u8; N], String> {
        index
            .checked_mul(N)
            .and_then(|start| self.params.get(start..start.checked_add(N)?))
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                format!(
                    "push constant {index} ({N} bytes) is past the end of {} bytes of params",
                    self.params.len()
                )
            })
    }

    /// The number of bindings.
    pub fn binding_count(&self) -> usize {
        self.bindings.len()
    }

    /// The length in bytes of binding `index`'s range (0 if there is no such binding).
    pub fn binding_len(&self, index: usize) -> usize {
        self.bindings.get(index).map_or(0, |b| b.len)
    }

    /// Whether bindings `a` and `b` share a byte (ranges of one allocation that
    /// intersect); false for a missing binding. A kernel that copies operands to write its
    /// result over them needs the copy only for operands that do.
    pub fn bindings_overlap(&self, a: usize, b: usize) -> bool {
        match (self.bindings.get(a), self.bindings.get(b)) {
            (Some(x), Some(y)) => {
                Arc::ptr_eq(&x.alloc, &y.alloc)
                    && x.offset < y.offset + y.len
                    && y.offset < x.offset + x.len
            }
            _ => false,
        }
    }

    /// Whether bindings `a` and `b` are the same bytes (one allocation, offset and length).
    pub fn same_range(&self, a: usize, b: usize) -> bool {
        match (self.bindings.get(a), self.bindings.get(b)) {
            (Some(x), Some(y)) => {
                Arc::ptr_eq(&x.alloc, &y.alloc) && x.offset == y.offset && x.len == y.len
            }
            _ => false,
        }
    }

    /// Whether binding `a`'s bytes are the start of binding `b`'s (one allocation, same
    /// offset, `a` no longer than `b`): a state that a kernel extends in place.
    pub fn is_prefix_of(&self, a: usize, b: usize) -> bool {
        match (self.bindings.get(a), self.bindings.get(b)) {
            (Some(x), Some(y)) => {
                Arc::ptr_eq(&x.alloc, &y.alloc) && x.offset == y.offset && x.len <= y.len
            }
            _ => false,
        }
    }

    /// Runs `f` on this dispatch with binding `i` cut to its first `lens[i]` bytes where
    /// `lens[i]` is `Some` and shorter than the bound range (others as bound). Why: a
    /// recording that serves calls of several state lengths binds buffers sized by those
    /// lengths at their capacity, and the kernel, which knows the call's dims, sees only
    /// the live bytes, exactly the range an exact-size binding would have given it.
    pub fn with_binding_lens<R>(
        &self,
        lens: &[Option<usize>],
        f: impl FnOnce(&DispatchContext<'_>) -> R,
    ) -> R {
        let bindings: Vec<ResolvedRange> = self
            .bindings
            .iter()
            .enumerate()
            .map(|(i, b)| ResolvedRange {
                alloc: b.alloc.clone(),
                offset: b.offset,
                len: lens
                    .get(i)
                    .copied()
                    .flatten()
                    .map_or(b.len, |l| l.min(b.len)),
            })
            .collect();
        f(&DispatchContext {
            entry: self.entry,
            bindings: &bindings,
            params: self.params,
            workgroup_id: self.workgroup_id,
            workgroup_count: self.workgroup_count,
        })
    }

    /// A read-only view of the whole of binding `index`.
    pub fn read(&self, index: usize) -> Result<BindingRead<'_>, String> {
        let len = self.binding(index)?.len;
        self.read_range(index, 0, len)
    }

    /// A writable view of the whole of binding `index` (only for single-workgroup dispatches
    /// or bindings one workgroup owns; see the aliasing rule above).
    pub fn write(&self, index: usize) -> Result<BindingWrite<'_>, String> {
        let len = self.binding(index)?.len;
        self.write_range(index, 0, len)
    }

    /// A read-only view of `offset..offset + len` within binding `index`'s range.
    pub fn read_range(
        &self,
        index: usize,
        offset: usize,
        len: usize,
    ) -> Result<BindingRead<'_>, String> {
        self.view(index, offset, len, false).map(BindingRead)
    }

    /// A writable view of `offset..offset + len` within binding `index`'s range.
    pub fn write_range(
        &self,
        index: usize,
        offset: usize,
        len: usize,
    ) -> Result<BindingWrite<'_>, String> {
        self.view(index, offset, len, true).map(BindingWrite)
    }

    fn binding(&self, index: usize) -> Result<&'a ResolvedRange, String> {
        self.bindings.get(index).ok_or_else(|| {
            format!(
                "binding {index} does not exist: the dispatch has {} bindings",
                self.bindings.len()
            )
        })
    }

    fn view(
        &self,
        index: usize,
        offset: usize,
        len: usize,
        write: bool,
    ) -> Result<crate::memory::HostBorrow<'a>, String> {
        let binding = self.binding(index)?;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= binding.len)
            .ok_or_else(|| {
                format!(
                    "binding {index}: range {offset}..{} exceeds the bound {} bytes",
                    offset.saturating_add(len),
                    binding.len
                )
            })?;
        let start = binding.offset + offset;
        binding.alloc.borrow(start, len, write).map_err(|()| {
            format!(
                "binding {index}: {} view of bytes {offset}..{end} conflicts with a live view \
                 of the same memory (aliasing rule)",
                if write { "writable" } else { "read-only" }
            )
        })
    }
}
