//! Sessions: a program bound to devices, and the calls submitted to it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rafter_hal::{
    Buffer, CommandBuffer, Device, DeviceKind, MemoryKind, Queue, Semaphore, SemaphoreError,
};
use rafter_ir::program::{Program, Step, Storage};
use rafter_ir::{Bindings, Symbol};

use crate::backend::{
    HostKernel, KernelOptions, LoadRequest, LoadedKernels, MatmulPrecision, NativeStats, UNBOUND,
};
use crate::devices::DeviceSet;
use crate::error::{hal, Result, RuntimeError};
use crate::host::{lock, CallRegistry, Slots};
use crate::recorded::{InputDest, Lease, OutputSource, Recorded, RecordedCache};
use crate::weights::BytesBuffer;
use crate::Tensor;

mod lengths;
mod record;
mod state;

/// How to build a [`Session`].
#[derive(Clone, Default)]
pub struct SessionOptions {
    host_kernels: Vec<(String, HostKernel)>,
    queue: usize,
    reference_only: bool,
    kernel_threads: usize,
    matmul_precision: MatmulPrecision,
    executables: Vec<(String, Bytes)>,
}

impl SessionOptions {
    /// The defaults: reference kernels off, a thread per core, queue 0.
    pub fn new() -> SessionOptions {
        SessionOptions::default()
    }

    /// Runs the CPU kernel called `kernel` with `f` instead of the backend's own kernel (a
    /// hand-written micro-kernel, or a test's instrumented kernel). `f` receives the kernel's
    /// operands and returns its results, which are checked against the kernel body's types.
    pub fn host_kernel(
        mut self,
        kernel: impl Into<String>,
        f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>, String> + Send + Sync + 'static,
    ) -> SessionOptions {
        self.host_kernels.push((kernel.into(), Arc::new(f)));
        self
    }

    /// Runs every kernel on its backend's plain interpreter (on the CPU, the reference
    /// executor), without the native kernels (to compare the two, or to rule the native
    /// kernels out when chasing a difference).
    pub fn reference_kernels(mut self) -> SessionOptions {
        self.reference_only = true;
        self
    }

    /// Threads one CPU kernel may use (default 0: one per available core).
    pub fn kernel_threads(mut self, threads: usize) -> SessionOptions {
        self.kernel_threads = threads;
        self
    }

    /// How products with float weights round their operands (default
    /// [`MatmulPrecision::F32`]; see there for what each backend honours).
    pub fn matmul_precision(mut self, precision: MatmulPrecision) -> SessionOptions {
        self.matmul_precision = precision;
        self
    }

    /// The executable section for `device` (an artifact's, e.g. the `vulkan` SPIR-V
    /// modules), which the device's loader reads and validates; [`Session::open`] passes
    /// the artifact's. Whether a device needs one is its loader's business (the CPU runs
    /// the kernel bodies the program carries; a GPU needs its section).
    pub fn executable(mut self, device: impl Into<String>, code: Bytes) -> SessionOptions {
        let device = device.into();
        self.executables.retain(|(d, _)| *d != device);
        self.executables.push((device, code));
        self
    }

    /// The queue index used on every device (default 0).
    pub fn queue(mut self, index: usize) -> SessionOptions {
        self.queue = index;
        self
    }

    /// What the loaders are told about running kernels.
    fn kernel_options(&self) -> KernelOptions {
        KernelOptions {
            host_kernels: self.host_kernels.clone(),
            reference_only: self.reference_only,
            threads: self.kernel_threads,
            matmul_precision: self.matmul_precision,
        }
    }
}

impl fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOptions")
            .field(
                "host_kernels",
                &self.host_kernels.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("queue", &self.queue)
            .field("reference_only", &self.reference_only)
            .field("kernel_threads", &self.kernel_threads)
            .field("matmul_precision", &self.matmul_precision)
            .field(
                "executables",
                &self
                    .executables
                    .iter()
                    .map(|(d, b)| (d, b.len()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One device a session uses.
struct DeviceUse {
    name: String,
    device: Arc<dyn Device>,
    queue: Queue,
    /// A host device (the CPU): its memory is the host's, it runs host copies and kernels
    /// that touch host slots.
    is_cpu: bool,
    /// Its kernels, as its loader loaded them (`None` for a device that runs no kernel and
    /// records no host copy).
    kernels: Option<Arc<dyn LoadedKernels>>,
}

impl DeviceUse {
    /// The loaded kernels, which every device that records a step has.
    fn kernels(&self) -> &dyn LoadedKernels {
        self.kernels
            .as_deref()
            .expect("a device that records steps has loaded kernels")
    }
}

/// Where a buffer lives, decided when the session is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    /// Allocated per call on device `d` (inputs and outputs), or a weight on device `d`.
    Device(usize),
    /// A slice of arena `a`'s per-call allocation.
    Arena(usize),
    /// A host slot (`Storage::Dynamic`, or an output whose dims depend on values).
    Slot,
    /// The session's state `s` (`Storage::State`), kept across calls.
    State(usize),
    /// No step touches it.
    Unused,
}

struct Inner {
    program: Arc<Program>,
    devices: Vec<DeviceUse>,
    step_device: Vec<usize>,
    /// Per step: for a copy between a CPU and another device (run on the CPU), the buffer
    /// on the other device, which the copy maps.
    step_foreign: Vec<Option<usize>>,
    home: Vec<Home>,
    /// Per buffer of `Storage::Weight`: the weight on the device that reads it (a
    /// [`BytesBuffer`] on a CPU, uploaded once elsewhere; shared by the weight's buffers on
    /// one device).
    weight_buffers: Vec<Option<Buffer>>,
    arena_device: Vec<usize>,
    arena_kind: Vec<MemoryKind>,
    /// Per buffer: first and last step that touch it.
    live: Vec<Option<(usize, usize)>>,
    symbols: Vec<Symbol>,
    registry: Arc<CallRegistry>,
    /// Arena allocations of completed calls, reused by later ones.
    arena_pool: Arc<ArenaPool>,
    /// Recordings of completed calls, reused by later calls of the same input shapes.
    recorded: Arc<RecordedCache>,
    next_call: AtomicU64,
    /// Per `Program::states` entry: its memory, allocated once.
    state_memory: Vec<state::StateMemory>,
    /// The states' lengths and the last call on them (see [`state`]).
    tracker: state::SharedTracker,
    /// Set when one recording serves every length of the states (see [`lengths`]): the
    /// recordings are then not keyed by the lengths.
    length_free: Option<lengths::LengthFree>,
    /// How many calls were recorded (see [`Session::recordings_made`]).
    recordings_made: AtomicU64,
    /// How many input tensors calls wrote into input buffers (see [`Session::inputs_written`]).
    inputs_written: AtomicU64,
}

/// Arena buffers of recordings evicted from the session's [`RecordedCache`], kept per arena
/// for the next recording (calls of new shapes).
///
/// Allocating every arena afresh cost a measurable share of each call (zeroed host memory
/// and its page faults on the CPU, buffer creation on Vulkan: `rafter bench` reports the
/// time spent in `submit`). A buffer comes here only with a recording whose last call
/// completed successfully, so no device can still touch it; concurrent calls each take
/// their own (the pool only ever holds idle buffers). Kernels never rely on an arena's
/// initial contents: the memory plan already reuses regions within one call.
#[derive(Default)]
struct ArenaPool {
    free: Mutex<Vec<Vec<Buffer>>>,
}

/// Idle buffers kept per arena: enough for a caller that keeps two calls in flight.
const POOLED_PER_ARENA: usize = 2;

impl ArenaPool {
    /// An idle buffer of arena `arena` with at least `bytes` bytes, if one is pooled.
    fn take(&self, arena: usize, bytes: u64) -> Option<Buffer> {
        let mut free = lock(&self.free);
        let list = free.get_mut(arena)?;
        let i = list.iter().position(|b| b.size() >= bytes)?;
        Some(list.swap_remove(i))
    }

    /// Returns a completed call's arena buffers.
    fn give(&self, buffers: Vec<(usize, Buffer)>) {
        let mut free = lock(&self.free);
        for (arena, buffer) in buffers {
            if free.len() <= arena {
                free.resize_with(arena + 1, Vec::new);
            }
            if free[arena].len() < POOLED_PER_ARENA {
                free[arena].push(buffer);
            }
        }
    }
}

/// A program bound to devices: weights in place, executables loaded, ready for calls.
///
/// `Session` is `Send + Sync` and cheap to clone; calls may be submitted from any thread
/// and any number may be in flight at once: each call has its own memory (inputs, outputs,
/// arenas, host slots), weights are shared read-only, and a call's work is ordered only
/// against itself, so independent calls overlap on the devices.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("program", &self.inner.program.name)
            .field(
                "devices",
                &self
                    .inner
                    .devices
                    .iter()
                    .map(|d| &d.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn memory_kind(word: &str) -> Option<MemoryKind> {
    Some(match word {
        "device_local" => MemoryKind::DeviceLocal,
        "host_visible_shared" => MemoryKind::HostVisibleShared,
        "host" => MemoryKind::Host,
        _ => return None,
    })
}

impl Session {
    /// Binds `program` to `devices` with default options.
    pub fn new(program: Program, devices: &DeviceSet) -> Result<Session> {
        Session::with_options(program, devices, SessionOptions::default())
    }

    /// Opens the artifact at `path` (memory-mapped and validated) and binds its program to
    /// `devices`: the weights the kernels read are slices of the map.
    pub fn open(path: impl AsRef<std::path::Path>, devices: &DeviceSet) -> Result<Session> {
        let artifact = rafter_artifact::Artifact::open(path)
            .map_err(|e| RuntimeError::Artifact(e.to_string()))?;
        Session::from_artifact(artifact, devices, SessionOptions::default())
    }

    /// Binds an artifact's program to `devices` with its executable sections added to
    /// `options` (where `options` has none for that device).
    pub fn from_artifact(
        artifact: rafter_artifact::Artifact,
        devices: &DeviceSet,
        mut options: SessionOptions,
    ) -> Result<Session> {
        for device in artifact.devices().map(str::to_string).collect::<Vec<_>>() {
            if !options.executables.iter().any(|(d, _)| *d == device) {
                let code = artifact.executable(&device).expect("listed");
                options = options.executable(device, code);
            }
        }
        Session::with_options(artifact.into_program(), devices, options)
    }

    /// Verifies `program`, opens the devices it names, binds its weights (zero-copy on a CPU
    /// device), and builds each device's executable.
    pub fn with_options(
        mut program: Program,
        devices: &DeviceSet,
        options: SessionOptions,
    ) -> Result<Session> {
        program.verify()?;
        for weight in &mut program.weights {
            let element = weight.dtype.size_of();
            weight.bytes = crate::weights::aligned(std::mem::take(&mut weight.bytes), element);
        }
        let program_name = program.name.clone();
        let unsupported = |msg: String| RuntimeError::Unsupported {
            program: program_name.clone(),
            msg,
        };

        // Devices, in the order the program first names them.
        let mut names: Vec<&str> = Vec::new();
        for name in program
            .kernels
            .iter()
            .map(|k| k.device.as_str())
            .chain(program.arenas.iter().map(|a| a.device.as_str()))
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        // The host device runs copies that touch no arena (inputs, outputs, weights, host
        // slots), and every copy between a CPU and another device: the program's first CPU
        // device, or else the set's.
        let needs_host = program.steps.iter().any(|s| match s {
            Step::Copy { src, dst } => [src, dst]
                .iter()
                .all(|&&b| !matches!(program.buffers[b].storage, Storage::Arena { .. })),
            Step::Dispatch { .. } => false,
        }) || (program.steps.iter().any(|s| matches!(s, Step::Copy { .. }))
            && (program.kernels.iter().any(|k| k.device != "cpu")
                || program.arenas.iter().any(|a| a.device != "cpu")));
        let missing = |device: &str| RuntimeError::MissingDevice {
            device: device.to_string(),
            found: match devices.names() {
                n if n.is_empty() => "none".to_string(),
                n => n.join(", "),
            },
        };
        let open = |name: &str| -> Result<DeviceUse> {
            let device = devices.get(name).ok_or_else(|| missing(name))?.clone();
            let queue = device
                .queue(options.queue)
                .map_err(hal(format!("device `{name}`")))?;
            Ok(DeviceUse {
                name: name.to_string(),
                is_cpu: device.info().kind == DeviceKind::Cpu,
                device,
                queue,
                kernels: None,
            })
        };
        let mut uses: Vec<DeviceUse> = names.into_iter().map(open).collect::<Result<_>>()?;
        let mut host = uses.iter().position(|d| d.is_cpu);
        if needs_host && host.is_none() {
            let cpu = devices
                .names()
                .into_iter()
                .find(|n| {
                    devices
                        .get(n)
                        .is_some_and(|d| d.info().kind == DeviceKind::Cpu)
                })
                .ok_or_else(|| missing("cpu"))?;
            uses.push(open(cpu)?);
            host = Some(uses.len() - 1);
        }
        let device_index = |name: &str| uses.iter().position(|d| d.name == name).expect("opened");
        let arena_device: Vec<usize> = program
            .arenas
            .iter()
            .map(|a| device_index(&a.device))
            .collect();
        let arena_kind = program
            .arenas
            .iter()
            .enumerate()
            .map(|(i, a)| {
                memory_kind(&a.memory).ok_or_else(|| {
                    unsupported(format!("arena {i}: unknown memory kind `{}`", a.memory))
                })
            })
            .collect::<Result<Vec<_>>>()?;

        // Each step's device and each buffer's home (the device of the first step touching
        // it), in step order. A copy runs where its source lives, or where its destination's
        // arena is; one between a CPU and another device runs on the CPU, mapping the other
        // side (`step_foreign`).
        let storage = |b: usize| &program.buffers[b].storage;
        let nb = program.buffers.len();
        let host_cpu =
            || host.expect("a CPU device is open when copies or non-CPU devices are used");
        let mut live: Vec<Option<(usize, usize)>> = vec![None; nb];
        let mut home: Vec<Home> = program
            .buffers
            .iter()
            .map(|b| match b.storage {
                Storage::Arena { arena, .. } => Home::Arena(arena),
                Storage::Dynamic => Home::Slot,
                Storage::State(s) => Home::State(s),
                _ => Home::Unused,
            })
            .collect();
        // An input lives where the first kernel reading it runs, even when an output copy
        // of it comes first (the compiler's rule too, `rafter_opt::place`).
        for step in &program.steps {
            if let Step::Dispatch { kernel, args, .. } = step {
                for &b in args {
                    if matches!(storage(b), Storage::Input(_)) && home[b] == Home::Unused {
                        home[b] = Home::Device(device_index(&program.kernels[*kernel].device));
                    }
                }
            }
        }
        // An f32 input that only CPU kernels read is not copied into a buffer of its own:
        // the call's tensor goes into its host slot as it is, and the kernels read it there
        // in place (MobileNetV2's 600 KB image took ~20 µs a call to copy).
        for (b, decl) in program.buffers.iter().enumerate() {
            let Home::Device(d) = home[b] else {
                continue;
            };
            let cpu_only = program.steps.iter().all(|step| match step {
                Step::Dispatch { kernel, args, .. } => {
                    !args.contains(&b)
                        || uses[device_index(&program.kernels[*kernel].device)].is_cpu
                }
                Step::Copy { src, dst } => *src != b && *dst != b,
            });
            if matches!(decl.storage, Storage::Input(_))
                && decl.ty.dtype == rafter_ir::DType::F32
                && uses[d].is_cpu
                && cpu_only
            {
                home[b] = Home::Slot;
            }
        }
        // Whether the host maps buffer `b`, living at `home` on device `owner`, coherently:
        // an arena of a host-visible kind, an input (`HostVisibleShared`) or an output
        // (`Host`, see `allocate_io`).
        let host_addressable = |b: usize, home: Home, owner: &DeviceUse| {
            let kind = match (home, storage(b)) {
                (Home::Arena(a), _) => arena_kind[a],
                (Home::Device(_), Storage::Input(_)) => MemoryKind::HostVisibleShared,
                (Home::Device(_), Storage::Output(_)) => MemoryKind::Host,
                _ => return false,
            };
            kind != MemoryKind::DeviceLocal
                && owner
                    .device
                    .info()
                    .memory_kind(kind)
                    .is_some_and(|m| m.host_visible && m.host_coherent)
        };
        let mut step_device: Vec<usize> = Vec::with_capacity(program.steps.len());
        let mut step_foreign: Vec<Option<usize>> = vec![None; program.steps.len()];
        // A state lives on the device of the first step touching it.
        let mut state_device: Vec<Option<usize>> = vec![None; program.states.len()];
        for (si, step) in program.steps.iter().enumerate() {
            let device_of = |home: Home| match home {
                Home::Device(d) => Some(d),
                Home::Arena(a) => Some(arena_device[a]),
                Home::Slot => Some(host_cpu()),
                Home::State(s) => state_device[s],
                Home::Unused => None,
            };
            let d = match step {
                Step::Dispatch { kernel, .. } => device_index(&program.kernels[*kernel].device),
                Step::Copy { src, dst } => match (device_of(home[*src]), device_of(home[*dst])) {
                    (Some(a), Some(b)) if a == b => a,
                    (Some(a), Some(b)) if uses[a].is_cpu && uses[b].is_cpu => b,
                    (Some(a), Some(b)) if uses[a].is_cpu || uses[b].is_cpu => {
                        let (cpu, foreign) = if uses[a].is_cpu { (a, *dst) } else { (b, *src) };
                        if home[foreign] == Home::Slot
                            || matches!(storage(foreign), Storage::Weight(_))
                        {
                            return Err(unsupported(format!(
                                "step {si} copies `{}` between devices `{}` and `{}`: the \
                                     side off the CPU must be an arena, input or output buffer",
                                program.buffers[foreign].name, uses[a].name, uses[b].name
                            )));
                        }
                        step_foreign[si] = Some(foreign);
                        cpu
                    }
                    (Some(a), Some(b)) => {
                        return Err(unsupported(format!(
                            "step {si} copies `{}` from device `{}` to device `{}`: copies \
                                 between two non-CPU devices are not supported",
                            program.buffers[*src].name, uses[a].name, uses[b].name
                        )))
                    }
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => host_cpu(),
                },
            };
            step_device.push(d);
            for b in step.reads().into_iter().chain(step.writes()) {
                live[b] = Some(live[b].map_or((si, si), |(first, _)| (first, si)));
                if step_foreign[si] == Some(b) {
                    continue;
                }
                let here = match home[b] {
                    Home::Unused => {
                        home[b] = Home::Device(d);
                        d
                    }
                    Home::Device(h) => h,
                    Home::Arena(a) => arena_device[a],
                    Home::State(s) => *state_device[s].get_or_insert(d),
                    Home::Slot => {
                        if !uses[d].is_cpu {
                            return Err(unsupported(format!(
                                "step {si} on device `{}` uses buffer {b} `{}`, whose size \
                                 depends on values and which therefore lives in host memory: \
                                 only CPU kernels may touch it",
                                uses[d].name, program.buffers[b].name
                            )));
                        }
                        d
                    }
                };
                // CPU devices share host memory: any of them may touch another's buffers.
                // A CPU kernel may also work in place on another device's buffer the host
                // addresses directly: a zero-copy boundary, which the compiler chose from
                // the topology (`rafter_opt::place`), handed over by semaphores alone.
                let shared = uses[d].is_cpu && host_addressable(b, home[b], &uses[here]);
                if here != d && !(uses[here].is_cpu && uses[d].is_cpu) && !shared {
                    return Err(unsupported(format!(
                        "step {si} runs on device `{}` but buffer {b} `{}` lives on device `{}`: \
                         cross-device access needs a copy step",
                        uses[d].name, program.buffers[b].name, uses[here].name
                    )));
                }
            }
        }

        // Symbols the inputs bind, then those the states bind, passed with every dispatch.
        let mut symbols: Vec<Symbol> = Vec::new();
        let bound_by = program.inputs.iter().map(|p| &p.ty);
        let bound_by = bound_by.chain(program.states.iter().map(|st| &st.input_ty));
        for ty in bound_by {
            for d in &ty.dims {
                for s in d.symbols() {
                    if !symbols.contains(&s) {
                        symbols.push(s);
                    }
                }
            }
        }
        // Then the symbols defined from them (conv output sizes), bound with the inputs.
        for def in &program.symbol_defs {
            if !symbols.contains(&def.symbol) {
                symbols.push(def.symbol.clone());
            }
        }

        // States: one allocation each, at capacity, on the device that uses it.
        let mut state_memory = Vec::with_capacity(program.states.len());
        for (s, st) in program.states.iter().enumerate() {
            let (capacity, bytes) = state::capacity(&program, s).map_err(&unsupported)?;
            let device = state_device[s].or(host).unwrap_or(0);
            let use_ = uses.get(device).ok_or_else(|| missing("cpu"))?;
            let kind = if use_.is_cpu {
                MemoryKind::Host
            } else {
                MemoryKind::DeviceLocal
            };
            let buffer = use_
                .device
                .allocate(bytes.max(1), kind)
                .map_err(hal(format!(
                    "allocating state `{}` ({bytes} bytes) on `{}`",
                    st.name, use_.name
                )))?;
            state_memory.push(state::StateMemory { buffer, capacity });
        }
        let tracker = Arc::new(std::sync::Mutex::new(state::Tracker {
            lengths: vec![0; program.states.len()],
            ..state::Tracker::default()
        }));

        // Host kernels must name kernels of the program.
        for (name, _) in &options.host_kernels {
            if !program.kernels.iter().any(|k| k.name == *name) {
                return Err(unsupported(format!(
                    "host kernel for unknown kernel `{name}`"
                )));
            }
        }
        let program = Arc::new(program);
        let length_free = lengths::LengthFree::plan(&program, uses.iter().all(|u| u.is_cpu))
            .filter(|_| !lengths::keyed_by_request());
        let registry = Arc::new(CallRegistry::default());
        let kernel_options = options.kernel_options();
        // Each device's kernels, through the loader registered for its kind. A host device
        // loads even without kernels: it records the call's host copies.
        for use_ in uses.iter_mut() {
            let mine: Vec<usize> = (0..program.kernels.len())
                .filter(|&k| program.kernels[k].device == use_.name)
                .collect();
            if mine.is_empty() && !use_.is_cpu {
                continue;
            }
            let loader = devices.loader_for(use_.device.as_ref()).ok_or_else(|| {
                unsupported(format!(
                    "device `{}` ({:?}) runs {} of the program's kernels, but no executable \
                     loader for it is registered (registered: {})",
                    use_.name,
                    use_.device.info().kind,
                    mine.len(),
                    match devices.loader_names() {
                        n if n.is_empty() => "none".to_string(),
                        n => n.join(", "),
                    }
                ))
            })?;
            let section = options
                .executables
                .iter()
                .find(|(d, _)| *d == use_.name)
                .map(|(_, code)| code);
            use_.kernels = Some(loader.load(&LoadRequest {
                program: &program,
                device_name: &use_.name,
                device: &use_.device,
                kernels: &mine,
                section,
                symbols: &symbols,
                calls: &registry,
                options: &kernel_options,
            })?);
        }

        // Weights: wrapped where the device addresses host memory, uploaded elsewhere (once
        // per weight and device).
        let mut weight_buffers: Vec<Option<Buffer>> = vec![None; nb];
        let mut uploaded: HashMap<(usize, usize), Buffer> = HashMap::new();
        for (b, decl) in program.buffers.iter().enumerate() {
            let (Storage::Weight(w), Home::Device(d)) = (&decl.storage, home[b]) else {
                continue;
            };
            if let Some(buffer) = uploaded.get(&(*w, d)) {
                weight_buffers[b] = Some(buffer.clone());
                continue;
            }
            let use_ = &uses[d];
            let bytes = program.weights[*w].bytes.clone();
            let buffer = if use_.is_cpu {
                Buffer::from_impl(Arc::new(BytesBuffer::new(bytes, use_.device.info().id)))
            } else {
                let context = format!("uploading weight `{}` to `{}`", decl.name, use_.name);
                let buffer = use_
                    .device
                    .allocate(bytes.len() as u64, MemoryKind::HostVisibleShared)
                    .map_err(hal(context.clone()))?;
                buffer.write_bytes(0, &bytes).map_err(hal(context))?;
                buffer
            };
            uploaded.insert((*w, d), buffer.clone());
            weight_buffers[b] = Some(buffer);
        }

        Ok(Session {
            inner: Arc::new(Inner {
                program,
                devices: uses,
                step_device,
                step_foreign,
                home,
                weight_buffers,
                arena_device,
                arena_kind,
                live,
                symbols,
                registry,
                arena_pool: Arc::new(ArenaPool::default()),
                recorded: Arc::new(RecordedCache::default()),
                next_call: AtomicU64::new(1),
                state_memory,
                tracker,
                length_free,
                recordings_made: AtomicU64::new(0),
                inputs_written: AtomicU64::new(0),
            }),
        })
    }

    /// The program this session runs.
    pub fn program(&self) -> &Program {
        &self.inner.program
    }

    /// The symbols the inputs bind, in the order their values are passed to kernels.
    pub fn symbols(&self) -> &[Symbol] {
        &self.inner.symbols
    }

    /// How many kernels run natively on borrowed bytes, and how often they ran, fell back to
    /// their backend's interpreter, or copied a misaligned operand (summed over the
    /// devices whose backends keep such counters).
    pub fn native_stats(&self) -> NativeStats {
        self.inner
            .devices
            .iter()
            .filter_map(|d| d.kernels.as_ref()?.native_stats())
            .fold(NativeStats::default(), |a, b| a + b)
    }

    /// The names of the devices the session uses.
    pub fn device_names(&self) -> Vec<&str> {
        self.inner.devices.iter().map(|d| d.name.as_str()).collect()
    }

    /// The buffer holding weight `index` on the (first) device that reads it, if any kernel
    /// reads it. On a CPU device it is a [`BytesBuffer`] over the program's own bytes.
    pub fn weight_buffer(&self, index: usize) -> Option<&Buffer> {
        let p = &self.inner.program;
        (0..p.buffers.len())
            .filter(|&b| p.buffers[b].storage == Storage::Weight(index))
            .find_map(|b| self.inner.weight_buffers[b].as_ref())
    }

    /// Submits one call and returns at once: validates `inputs` against the signature,
    /// sizes and allocates this call's memory, records all its work into command buffers and
    /// submits them, chained by semaphores. [`CallHandle::wait`] gives the outputs.
    pub fn submit(&self, inputs: Vec<Tensor>) -> Result<CallHandle> {
        self.submit_after(inputs, &[])
    }

    /// [`submit`](Session::submit), with the call's work starting only once every
    /// `(semaphore, value)` of `after` is reached (another call's
    /// [`CallHandle::semaphores`], a host-signalled gate). Returns at once all the same; a
    /// failed semaphore fails the call.
    pub fn submit_after(
        &self,
        inputs: Vec<Tensor>,
        after: &[(Semaphore, u64)],
    ) -> Result<CallHandle> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let input_error = |msg: String| RuntimeError::Input {
            program: p.name.clone(),
            msg,
        };

        // Inputs against the signature; symbols bound on the way.
        if inputs.len() != p.inputs.len() {
            let names: Vec<String> = p.inputs.iter().map(|i| format!("`{}`", i.name)).collect();
            return Err(input_error(format!(
                "expected {} inputs ({}), got {}",
                p.inputs.len(),
                names.join(", "),
                inputs.len()
            )));
        }
        let mut bindings = Bindings::default();
        // A stateful session takes one call at a time through its states: the tracker stays
        // locked until the call is submitted, so calls read the lengths in submit order.
        let state_error = |msg: String| RuntimeError::State {
            program: p.name.clone(),
            msg,
        };
        let mut tracker = (!p.states.is_empty()).then(|| lock(&inner.tracker));
        if let Some(t) = &tracker {
            if let Some(reason) = &t.poisoned {
                return Err(state_error(format!(
                    "the session's state is unknown after a failed call ({reason}): reset it \
                     (Session::reset_state) before the next call"
                )));
            }
            state::bind_lengths(p, t, &mut bindings).map_err(input_error)?;
        }
        for (port, t) in p.inputs.iter().zip(&inputs) {
            bindings
                .check(&port.ty, t, &format!("input `{}`", port.name))
                .map_err(input_error)?;
        }
        // Symbols defined from the inputs' (conv output sizes) and from the values of small
        // inputs (a Reshape's target shape): on the host, before any work.
        let input_values = |name: &str| {
            let k = p.inputs.iter().position(|port| port.name == name)?;
            let t = inputs.get(k)?;
            let bytes = Bytes::copy_from_slice(t.le_bytes());
            rafter_ir::ConstData::new(t.dtype(), t.shape().to_vec(), bytes).ok()
        };
        rafter_ir::bind_defined(&p.symbol_defs, &mut bindings, &input_values)
            .map_err(input_error)?;
        for (s, bound) in &p.bounds {
            if let Some(v) = bindings.get(s) {
                if v > *bound {
                    return Err(input_error(format!(
                        "the inputs make `{}` = {v}, above its declared bound {bound}",
                        s.name()
                    )));
                }
            }
        }
        let map = bindings.as_map();
        for (d, bound) in &p.dim_bounds {
            if let Ok(v) = d.eval(&map) {
                if v > *bound {
                    return Err(input_error(format!(
                        "the call makes `{d}` = {v}, above its declared bound {bound}"
                    )));
                }
            }
        }
        let lengths = match &tracker {
            Some(_) => state::new_lengths(p, &inner.state_memory, &map).map_err(state_error)?,
            None => Vec::new(),
        };
        let symbol_values: Vec<i64> = inner
            .symbols
            .iter()
            .map(|s| bindings.get(s).unwrap_or(UNBOUND))
            .collect();

        let call = inner.next_call.fetch_add(1, Ordering::Relaxed);
        let mut key: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        // Sizes taken from input values shape the call as the inputs' dims do.
        let by_values: Vec<usize> = p
            .symbol_defs
            .iter()
            .filter(|d| matches!(d.expr, rafter_ir::SymbolExpr::Values { .. }))
            .filter_map(|d| {
                bindings
                    .get(&d.symbol)
                    .and_then(|v| usize::try_from(v).ok())
            })
            .collect();
        if !by_values.is_empty() {
            key.push(by_values);
        }
        let mut after = after.to_vec();
        if let Some(t) = &tracker {
            // The states' lengths shape the call too, unless one recording serves them all;
            // and it reads what the last call left.
            if inner.length_free.is_none() {
                key.push(t.lengths.clone());
            }
            after.extend(t.last.iter().cloned());
        }
        let recorded = match inner.recorded.take(&key) {
            Some(recorded) => recorded,
            None => {
                inner.recordings_made.fetch_add(1, Ordering::Relaxed);
                self.record(&inputs, key, &map, &symbol_values, call)?
            }
        };
        let handle = self.launch(recorded, inputs, &after, &symbol_values, call)?;
        if let Some(t) = tracker.as_mut() {
            t.lengths = lengths;
            t.last = handle.done.clone();
        }
        // Unlocked first: a callback may run at once (the call already failed).
        drop(tracker);
        if !p.states.is_empty() {
            state::poison_on_failure(&inner.tracker, &handle.done);
        }
        Ok(handle)
    }

    /// The length of each state along its growth axis (the positions a KV cache holds), as
    /// of the calls submitted so far; 0 for states that do not grow.
    pub fn state_lengths(&self) -> Vec<usize> {
        lock(&self.inner.tracker).lengths.clone()
    }

    /// Forgets the session's state: growing states become empty (the next call starts at
    /// position 0), fixed-size ones are zeroed, and a failed call's poison is cleared.
    /// Waits up to `timeout` for the last call on the state to finish first.
    pub fn reset_state(&self, timeout: Duration) -> Result<()> {
        let inner = &*self.inner;
        let mut t = lock(&inner.tracker);
        state::wait_last(&inner.program.name, &t, timeout)?;
        for (s, m) in inner.state_memory.iter().enumerate() {
            if m.capacity.is_none() {
                let zeros = vec![0u8; m.buffer.size() as usize];
                m.buffer.write_bytes(0, &zeros).map_err(hal(format!(
                    "zeroing state `{}`",
                    inner.program.states[s].name
                )))?;
            }
        }
        t.lengths.iter_mut().for_each(|l| *l = 0);
        t.poisoned = None;
        t.last.clear();
        Ok(())
    }

    /// Shortens every growing state to at most `len` positions (a conversation rewound, a
    /// shared prompt prefix kept): the next call continues at position `len`. An error if
    /// the state is unknown after a failed call.
    pub fn truncate_state(&self, len: usize) -> Result<()> {
        let mut t = lock(&self.inner.tracker);
        if let Some(reason) = &t.poisoned {
            return Err(RuntimeError::State {
                program: self.inner.program.name.clone(),
                msg: format!("the state is unknown after a failed call ({reason}): reset it"),
            });
        }
        t.lengths.iter_mut().for_each(|l| *l = (*l).min(len));
        Ok(())
    }

    /// Runs one call on `recorded`: writes the inputs, registers the call's host slots
    /// and symbol values, and submits the chunks, chained by fresh semaphores. The recording goes back to the
    /// cache once the work has completed and the handle is done (see [`Lease`]).
    fn launch(
        &self,
        mut recorded: Recorded,
        inputs: Vec<Tensor>,
        after: &[(Semaphore, u64)],
        symbol_values: &[i64],
        call: u64,
    ) -> Result<CallHandle> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let nb = p.buffers.len();
        let mut table: Vec<Option<Tensor>> = vec![None; nb];
        let mut inputs: Vec<Option<Tensor>> = inputs.into_iter().map(Some).collect();
        for (k, dest) in &recorded.inputs {
            match dest {
                InputDest::Buffer(buffer) => {
                    let t = inputs[*k].as_ref().expect("each input has one destination");
                    inner.inputs_written.fetch_add(1, Ordering::Relaxed);
                    buffer.write_bytes(0, t.le_bytes()).map_err(|e| {
                        hal(format!(
                            "call {call}: writing input `{}`",
                            p.inputs[*k].name
                        ))(e)
                    })?;
                }
                InputDest::Slot(b) => table[*b] = inputs[*k].take(),
            }
        }

        // This use's value of the recording's semaphores (one per chunk, timeline: each
        // use signals the next value), the slot table, then submission.
        recorded.uses += 1;
        let value = recorded.uses;
        let semaphores = recorded.semaphores.clone();
        let slots: Slots = Arc::new(Mutex::new(table));
        let registry_key = recorded.registry_key;
        inner.registry.insert(
            registry_key,
            slots.clone(),
            recorded.foreign.clone(),
            symbol_values,
        );
        let outputs = recorded.outputs.clone();
        let submissions: Vec<(usize, CommandBuffer, Vec<usize>)> = recorded
            .chunks
            .iter()
            .map(|c| (c.device, c.command_buffer.clone(), c.waits.clone()))
            .collect();
        let (cache, pool) = (inner.recorded.clone(), inner.arena_pool.clone());
        let lease = Arc::new(Lease::new(
            recorded,
            Box::new(move |recorded| cache.give(recorded, |arenas| pool.give(arenas))),
        ));
        if submissions.is_empty() {
            inner.registry.remove(registry_key);
            lease.release();
        } else {
            // Once every submission has completed or failed: drop the registry entry, and
            // release the work's hold on the recording (a failure keeps it from reuse).
            let remaining = Arc::new(AtomicUsize::new(submissions.len()));
            for s in &semaphores {
                let (remaining, registry, lease) =
                    (remaining.clone(), inner.registry.clone(), lease.clone());
                s.notify_at(
                    value,
                    Box::new(move |result| {
                        if result.is_err() {
                            lease.fail();
                        }
                        if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                            registry.remove(registry_key);
                            lease.release();
                        }
                    }),
                );
            }
        }
        for (i, (device, command_buffer, chunk_waits)) in submissions.iter().enumerate() {
            let mut waits: Vec<(Semaphore, u64)> = chunk_waits
                .iter()
                .map(|&w| (semaphores[w].clone(), value))
                .collect();
            // Chunks that wait on no other chunk start the call: they take `after`.
            if waits.is_empty() {
                waits.extend(after.iter().cloned());
            }
            let use_ = &inner.devices[*device];
            if let Err(e) =
                use_.queue
                    .submit(command_buffer, &waits, &[(semaphores[i].clone(), value)])
            {
                let reason = format!("call {call}: submitting to `{}`: {e}", use_.name);
                for s in &semaphores[i..] {
                    s.fail(reason.clone());
                }
                lease.release();
                return Err(hal(format!("call {call}: submitting to `{}`", use_.name))(
                    e,
                ));
            }
        }
        Ok(CallHandle {
            program: p.name.clone(),
            output_names: p.outputs.iter().map(|o| o.name.clone()).collect(),
            call,
            done: semaphores.into_iter().map(|s| (s, value)).collect(),
            devices: inner.devices.iter().map(|d| d.device.clone()).collect(),
            outputs,
            slots,
            lease: Some(lease),
        })
    }

    /// Submits a call and waits for its outputs.
    pub fn run(&self, inputs: Vec<Tensor>, timeout: Duration) -> Result<Vec<Tensor>> {
        self.submit_to_wait(inputs)?.wait(timeout)
    }

    /// [`Session::submit`] for a caller that waits on the handle next (from this thread):
    /// the devices are told so ([`rafter_hal::submit_then_wait`]), and the CPU device leaves
    /// the call's first work to this thread instead of waking one of its own. A caller that
    /// may not wait must use `submit`.
    pub fn submit_to_wait(&self, inputs: Vec<Tensor>) -> Result<CallHandle> {
        let submitted = rafter_hal::submit_then_wait(|| self.submit(inputs));
        if submitted.is_err() {
            // A submission that failed part-way may have left work queued for this thread:
            // stop "helping" at once, which hands it to the devices' threads.
            for use_ in &self.inner.devices {
                use_.device.help(&|| true);
            }
        }
        submitted
    }

    /// How many arena buffers of completed calls wait to be reused by the next calls: those
    /// of idle recordings (see [`Session::idle_recordings`]) and those pooled from evicted
    /// recordings (at most two per arena), so a caller can see that steady-state calls
    /// allocate nothing.
    pub fn idle_arenas(&self) -> usize {
        let pooled: usize = lock(&self.inner.arena_pool.free).iter().map(Vec::len).sum();
        pooled + self.inner.recorded.idle_arenas()
    }

    /// How many recorded calls (memory and command buffers for one set of input shapes)
    /// wait for the next call of their shapes, which then only writes its inputs and
    /// submits. At most two are kept.
    pub fn idle_recordings(&self) -> usize {
        self.inner.recorded.len()
    }

    /// How many calls were recorded (dims, memory, command buffers prepared) rather than
    /// served by an idle recording: once per input shape in steady state, and for a
    /// stateful program whose recordings cannot serve every state length (see
    /// [`Session::records_every_length`]), once per length too.
    pub fn recordings_made(&self) -> u64 {
        self.inner.recordings_made.load(Ordering::Relaxed)
    }

    /// Per input, whether calls bind it in place: only CPU kernels read it, straight from
    /// the caller's tensor (a [`Tensor::borrowed`] is then never copied). Any other input
    /// is written into the call's input buffer ([`Session::inputs_written`] counts those).
    pub fn input_in_place(&self) -> Vec<bool> {
        let p = &*self.inner.program;
        let mut in_place = vec![false; p.inputs.len()];
        for (b, decl) in p.buffers.iter().enumerate() {
            if let Storage::Input(k) = decl.storage {
                if let Some(flag) = in_place.get_mut(k) {
                    *flag = self.inner.home[b] == Home::Slot;
                }
            }
        }
        in_place
    }

    /// How many input tensors calls have copied into input buffers so far (one per input
    /// not bound in place, per call; for a GPU, the upload).
    pub fn inputs_written(&self) -> u64 {
        self.inner.inputs_written.load(Ordering::Relaxed)
    }

    /// Whether one recording serves every length of the session's states (an LLM's
    /// decode steps reuse one recording as the KV cache grows): true for a stateful
    /// program on CPU devices whose outputs, copies and per-call placements do not depend
    /// on the states' lengths.
    pub fn records_every_length(&self) -> bool {
        self.inner.length_free.is_some()
    }

    /// How many calls still have work in flight (submitted, not yet completed or failed).
    pub fn calls_in_flight(&self) -> usize {
        self.inner.registry.len()
    }
}

/// A call in flight. [`wait`](CallHandle::wait) blocks until all of its work is done and
/// returns its outputs. Dropping a handle does not cancel the call: its work runs to the end
/// and its memory is freed then.
pub struct CallHandle {
    program: String,
    output_names: Vec<String>,
    call: u64,
    done: Vec<(Semaphore, u64)>,
    /// The devices the call runs on, which a waiting thread helps (`wait_done`).
    devices: Vec<Arc<dyn Device>>,
    outputs: Vec<OutputSource>,
    slots: Slots,
    /// The call's recording, released when the handle is done with the outputs.
    lease: Option<Arc<Lease>>,
}

impl Drop for CallHandle {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

impl fmt::Debug for CallHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallHandle")
            .field("program", &self.program)
            .field("call", &self.call)
            .field("done", &self.done)
            .finish()
    }
}

impl CallHandle {
    /// The call's number within its session (1, 2, ...).
    pub fn id(&self) -> u64 {
        self.call
    }

    /// The `(semaphore, value)` pairs every one of which is reached when the call's work is
    /// done (one per submission); any of them fails if the call fails. Other work may wait
    /// on them.
    pub fn semaphores(&self) -> &[(Semaphore, u64)] {
        &self.done
    }

    /// Whether all of the call's work has finished (successfully or not). Never blocks.
    pub fn is_done(&self) -> bool {
        self.done
            .iter()
            .all(|(s, v)| s.failure().is_some() || s.value() >= *v)
    }

    /// Blocks until the call's work is done, or `timeout`. Repeatable; does not take the
    /// outputs.
    pub fn wait_done(&self, timeout: Duration) -> Result<()> {
        // The waiting thread first runs the call's queued work itself (`Device::help`): on
        // the CPU that saves waking a device thread to start the call and being woken at its
        // end. It stops helping at the deadline, or once the call is done or failed.
        let start = Instant::now();
        let done = || {
            start.elapsed() >= timeout
                || self
                    .done
                    .iter()
                    .all(|(s, v)| s.query().map_or(true, |x| x >= *v))
        };
        for device in &self.devices {
            device.help(&done);
        }
        let left = timeout.saturating_sub(start.elapsed());
        Semaphore::wait_all(&self.done, left).map_err(|e| match e {
            SemaphoreError::Failed(reason) => RuntimeError::CallFailed {
                program: self.program.clone(),
                call: self.call,
                reason,
            },
            other => RuntimeError::Timeout {
                program: self.program.clone(),
                call: self.call,
                msg: other.to_string(),
            },
        })
    }

    /// Waits (once) for the call to finish and returns its outputs, in the program's output
    /// order. A failed kernel is an error whose message names it. Once it has returned
    /// outputs, the call holds none of its inputs: a [`Tensor::borrowed`]'s owner has been
    /// dropped.
    pub fn wait(self, timeout: Duration) -> Result<Vec<Tensor>> {
        self.wait_done(timeout)?;
        let mut slots = lock(&self.slots);
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for (k, source) in self.outputs.iter().enumerate() {
            let err = |msg: String| RuntimeError::Output {
                program: self.program.clone(),
                call: self.call,
                output: self.output_names[k].clone(),
                msg,
            };
            let t = match source {
                OutputSource::Buffer { range, dtype, dims } => range
                    .buffer
                    .map_read(range.offset, range.len, |bytes| {
                        Tensor::from_le_bytes(*dtype, dims, bytes)
                    })
                    .map_err(|e| err(e.to_string()))?
                    .map_err(|e| err(e.to_string()))?,
                OutputSource::Slot(b) => slots
                    .get_mut(*b)
                    .and_then(Option::take)
                    .ok_or_else(|| err("its producer stored nothing".into()))?,
            };
            outputs.push(t);
        }
        // The call's work is done, so no kernel reads the table any more: drop the rest of
        // it (borrowed inputs go back to their owners, host intermediates are freed) now,
        // not when the completion callback drops the registry's entry. A semaphore wakes
        // its waiters before it runs its callbacks, so that callback may still be pending
        // when this thread returns, and a caller may count on its input being released.
        slots.clear();
        Ok(outputs)
    }
}
