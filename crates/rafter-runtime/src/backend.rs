//! The seam between the runtime and its device backends: executable loaders.
//!
//! The runtime drives devices only through the HAL ([`rafter_hal::Device`]). What it
//! cannot know is how a device runs a program's kernels: the CPU interprets or pattern-
//! matches kernel bodies into closures, a Vulkan device loads the SPIR-V modules of the
//! artifact's `vulkan` section, an NPU would load its own blobs. That knowledge lives in a
//! device backend crate (`rafter-runtime-cpu`, `rafter-runtime-vulkan`), which implements
//! [`ExecutableLoader`] and is registered with the [`DeviceSet`](crate::DeviceSet) next to
//! the device itself:
//!
//! ```text
//!  Session::new ─ for each device the program names ─► the set's loader that serves the
//!       │                                               device's kind (DeviceInfo::kind)
//!       │            ExecutableLoader::load(program, kernels on it, artifact section)
//!       ▼                                 │ validates the section, loads executables
//!  recording a call ─ per dispatch ─► LoadedKernels::record_dispatch(operands, dims)
//!                   ─ per host copy ─► LoadedKernels::record_host_copy (host devices only)
//! ```
//!
//! The runtime decides *where* buffers live and *when* steps run (homes, arenas, command
//! buffers, semaphores); a backend decides *how* one kernel is dispatched on its device.
//! The artifact treats every device's section as opaque bytes: the loader that reads them
//! is the one that validates them.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use rafter_hal::{BufferRange, CommandBufferBuilder, Device, DeviceInfo};
use rafter_ir::program::Program;
use rafter_ir::Symbol;

use crate::error::{Result, RuntimeError};
use crate::host::CallRegistry;
use crate::Tensor;

/// A host implementation of one kernel, replacing the backend's own for it: takes the
/// kernel's operands (body inputs, in order) and returns its results (body outputs, in
/// order), which the backend checks against the body's types. Registered with
/// [`SessionOptions::host_kernel`](crate::SessionOptions::host_kernel); only host (CPU)
/// backends run them.
pub type HostKernel = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>, String> + Send + Sync>;

/// How kernels are to be run, from [`SessionOptions`](crate::SessionOptions): the same for
/// every backend, each taking what applies to it.
#[derive(Clone, Default)]
pub struct KernelOptions {
    /// Host implementations of kernels, by kernel name.
    pub host_kernels: Vec<(String, HostKernel)>,
    /// Run every kernel on the backend's plain interpreter, no optimised kernels (to
    /// compare the two).
    pub reference_only: bool,
    /// Threads one kernel may use (0: one per available core).
    pub threads: usize,
    /// How products with float weights round their operands where a backend can trade
    /// accuracy for speed (see [`MatmulPrecision`]).
    pub matmul_precision: MatmulPrecision,
}

/// How a backend's matrix products with float (f32/f16/bf16) weights round their operands.
/// What each backend honours is its own: rafter's CPU takes it in the LLM decoder's linear
/// layers (prefill products; decode streams the weights at memory bandwidth either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// As accurate as f32 arithmetic on the unrounded operands (the default).
    #[default]
    F32,
    /// Both operands rounded to bf16 (8 significant bits), products accumulated in f32:
    /// PyTorch's arithmetic for a bf16 model, and twice the f32 rate on CPUs with
    /// AVX512-BF16.
    Bf16,
}

impl MatmulPrecision {
    /// Its name on command lines: `f32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<MatmulPrecision, String> {
        match s {
            "f32" => Ok(MatmulPrecision::F32),
            "bf16" => Ok(MatmulPrecision::Bf16),
            other => Err(format!(
                "unknown matmul precision `{other}` (expected f32 or bf16)"
            )),
        }
    }
}

impl fmt::Debug for KernelOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelOptions")
            .field(
                "host_kernels",
                &self.host_kernels.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("reference_only", &self.reference_only)
            .field("threads", &self.threads)
            .field("matmul_precision", &self.matmul_precision)
            .finish()
    }
}

/// What a loader is asked to load: the kernels of one program placed on one device.
pub struct LoadRequest<'a> {
    /// The whole program (kernel indices below are into its `kernels`).
    pub program: &'a Arc<Program>,
    /// The device's name in the program (`cpu`, `vulkan`).
    pub device_name: &'a str,
    /// The device.
    pub device: &'a Arc<dyn Device>,
    /// The kernels placed on this device, in program order (possibly none: a host device
    /// still records the call's host copies).
    pub kernels: &'a [usize],
    /// The device's executable section from the artifact, if one was given.
    pub section: Option<&'a Bytes>,
    /// The symbols the inputs bind, in the order [`DispatchArgs::symbol_values`] has them.
    pub symbols: &'a [Symbol],
    /// The session's per-call host state (see [`crate::host`]).
    pub calls: &'a Arc<CallRegistry>,
    /// How to run kernels (the session's options).
    pub options: &'a KernelOptions,
}

impl LoadRequest<'_> {
    /// An [`RuntimeError::Unsupported`] about this request's program.
    pub fn unsupported(&self, msg: impl Into<String>) -> RuntimeError {
        RuntimeError::Unsupported {
            program: self.program.name.clone(),
            msg: msg.into(),
        }
    }
}

/// A device backend's loader: turns the kernels a program places on a device of the kinds
/// it serves into something the runtime can record dispatches of.
pub trait ExecutableLoader: Send + Sync {
    /// A short name for errors and listings (`cpu-kernels`, `spirv`).
    fn name(&self) -> &str;

    /// Whether this loader runs kernels on `device` (by its kind).
    fn serves(&self, device: &DeviceInfo) -> bool;

    /// Validates the request's section (when given) against the program and loads the
    /// kernels. Errors name the kernel, the section and the field at fault.
    fn load(&self, request: &LoadRequest<'_>) -> Result<Arc<dyn LoadedKernels>>;
}

/// Where one operand of a dispatch lives, as the runtime placed it.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A range of this device's memory (an input, output or arena buffer).
    Memory(BufferRange),
    /// Program weight `index`; `buffer` is its buffer on this device (on a host device a
    /// read-only wrapper of the program's own bytes, elsewhere an upload).
    Weight {
        /// The program weight.
        index: usize,
        /// Its buffer on this device.
        buffer: BufferRange,
    },
    /// The call's host slot of program buffer `b` (host devices only, see [`crate::host`]).
    Slot(usize),
    /// An unused optional result.
    Absent,
}

/// One dispatch to record.
#[derive(Debug)]
pub struct DispatchArgs<'a> {
    /// The call's registry key (see [`crate::host`]).
    pub call: u64,
    /// The program step, for errors.
    pub step: usize,
    /// The program kernel.
    pub kernel: usize,
    /// The call's value of each symbol (the [`LoadRequest::symbols`] order;
    /// [`UNBOUND`] where the inputs do not bind it).
    pub symbol_values: &'a [i64],
    /// Whether the dispatch must take the symbol values from the call registry when it
    /// runs ([`CallRegistry::symbols`](crate::host::CallRegistry::symbols)), not
    /// `symbol_values`: the recording serves calls whose states' lengths differ, its
    /// length-sized buffers bound at their capacity (the kernel cuts them to the call's
    /// dims). Only CPU devices are asked to.
    pub symbols_at_run: bool,
    /// The kernel body's inputs, then its outputs.
    pub operands: &'a [Operand],
    /// The call's dims of each operand (empty where the inputs do not decide them).
    pub dims: &'a [&'a [usize]],
}

/// Marks a symbol the inputs did not bind, in [`DispatchArgs::symbol_values`].
pub const UNBOUND: i64 = i64::MIN;

/// One end of a copy the HAL's copy command cannot do.
#[derive(Clone, Debug)]
pub enum CopyEnd {
    /// A range of the host device's memory.
    Memory(BufferRange),
    /// Program weight `w`, read from the program's bytes.
    Weight(usize),
    /// The call's host slot of program buffer `b`.
    Slot(usize),
    /// The call's foreign range `i`: another device's host-visible memory, mapped by the
    /// host (registered with the call, see [`CallRegistry::foreign`]).
    Foreign(usize),
}

/// A copy that runs on a host device's queue: it touches a host slot, reads a weight from
/// the program's bytes, or crosses to another device's memory.
#[derive(Debug)]
pub struct HostCopy<'a> {
    /// The call's registry key (see [`crate::host`]).
    pub call: u64,
    /// The program step, for errors.
    pub step: usize,
    /// Where the bytes come from.
    pub src: CopyEnd,
    /// Where they go.
    pub dst: CopyEnd,
    /// The source's program buffer (its type is the copied tensor's).
    pub buffer: usize,
    /// The source's dims in this call, when the inputs decide them.
    pub dims: Option<&'a [usize]>,
}

/// Kernels loaded on one device, ready to be recorded into command buffers.
pub trait LoadedKernels: Send + Sync {
    /// Records one dispatch of [`DispatchArgs::kernel`] into `builder`.
    fn record_dispatch(
        &self,
        builder: &mut CommandBufferBuilder,
        dispatch: &DispatchArgs<'_>,
    ) -> Result<()>;

    /// Records a [`HostCopy`]. Only a host device's backend implements it; the session
    /// sends such copies to the host device.
    fn record_host_copy(
        &self,
        builder: &mut CommandBufferBuilder,
        copy: &HostCopy<'_>,
    ) -> Result<()> {
        let _ = builder;
        Err(RuntimeError::Unsupported {
            program: String::new(),
            msg: format!("step {}: this device cannot record a host copy", copy.step),
        })
    }

    /// Whether every dispatch must wait for the one before (a barrier between every pair),
    /// not only for those it depends on. A GPU driver may run independent dispatches
    /// slower side by side than in order (see `rafter-runtime-vulkan`); a CPU whose
    /// kernels split over several threads has no threads left for a second one.
    fn serial(&self) -> bool {
        false
    }

    /// Counters of the backend's optimised kernels, if it keeps any.
    fn native_stats(&self) -> Option<NativeStats> {
        None
    }
}

/// A snapshot of a session's native-kernel counters ([`crate::Session::native_stats`]):
/// how many kernels a backend runs with an optimised ("native") implementation on
/// borrowed bytes, and how often those ran or fell back to its interpreter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeStats {
    /// Kernels (by body) that have a native implementation.
    pub kernels: usize,
    /// Dispatches computed natively.
    pub dispatches: u64,
    /// Dispatches of native kernels that fell back to the interpreter (shapes not
    /// covered, an operand in a host slot, a refused view).
    pub fallbacks: u64,
    /// Operands copied because their bytes were not aligned for their element type.
    pub misaligned_copies: u64,
}

impl std::ops::Add for NativeStats {
    type Output = NativeStats;

    fn add(self, o: NativeStats) -> NativeStats {
        NativeStats {
            kernels: self.kernels + o.kernels,
            dispatches: self.dispatches + o.dispatches,
            fallbacks: self.fallbacks + o.fallbacks,
            misaligned_copies: self.misaligned_copies + o.misaligned_copies,
        }
    }
}
