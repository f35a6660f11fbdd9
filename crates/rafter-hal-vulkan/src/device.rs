//! The Vulkan device: opening, memory kinds, limits, and the object every handle shares.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings, MemoryLocation};
use rafter_hal::{
    Buffer, Capabilities, Device, DeviceId, DeviceInfo, DeviceKind, Executable, ExecutableSpec,
    HalError, Limits, MemoryKind, MemoryKindInfo, Queue, Semaphore, TraceSink, FORMAT_SPIRV,
};

use crate::batch_tail::BatchTail;
use crate::breadcrumbs::{BreadcrumbMode, Breadcrumbs, BREADCRUMBS_ENV};
use crate::caps::VulkanCapabilities;
use crate::clock::DeviceClock;
use crate::error::VulkanError;
use crate::executable::{PipelineCache, VulkanExecutable};
use crate::instance::{self, InstanceOwner};
use crate::memory::VulkanBuffer;
use crate::queue::{run_monitor, SchedState, VulkanQueue};
use crate::semaphore::SemInner;
use crate::stall_probe::StallProbe;
use crate::validation::{self, Validation, ValidationLog, ValidationMessage};

/// How to open a [`VulkanDevice`].
#[derive(Clone, Default)]
pub struct VulkanDeviceOptions {
    /// The physical device by index in the loader's enumeration; `None` reads
    /// `RAFTER_VULKAN_DEVICE`, and without it prefers a discrete GPU.
    pub device_index: Option<usize>,
    /// Queues to create (clamped to what the compute family has); 0 means 1.
    pub queue_count: usize,
    /// Where the `VkPipelineCache` lives on disk: read when the device opens (ignored when
    /// it was written by another driver or device), written when the device is dropped and
    /// by [`VulkanDevice::save_pipeline_cache`]. `None` keeps the cache in memory only.
    pub pipeline_cache_path: Option<PathBuf>,
    /// The device's name in [`DeviceInfo`] and errors; empty means `vulkan`.
    pub name: String,
    /// Where GPU time goes: with a sink, every command buffer is recorded with a timestamp
    /// before and after each command, and each completed submission reports one
    /// [`TraceEvent`] per dispatch, copy and fill, timed by the GPU (its durations are the
    /// GPU's; they are placed on the host clock by reading the device clock from the host
    /// where `VK_EXT_calibrated_timestamps` allows, else by the completion time). Timestamps
    /// serialise nothing within a submission, but they cost a little, so tracing is off by
    /// default. A traced command buffer has one set of query slots: submitted again, it
    /// waits until its previous submission has retired and been reported, so traced calls
    /// of one recording run one at a time.
    pub trace_sink: Option<Arc<dyn TraceSink>>,
    /// Leave `storageBuffer16BitAccess` off even where the device has it: the device then
    /// behaves as one without 16-bit storage (f16 kernels are refused at load, by name),
    /// which tests and users can check on any GPU.
    pub disable_16bit_storage: bool,
    /// Leave `VK_KHR_cooperative_matrix` off even where the device has it (also set by the
    /// environment variable [`NO_COOP_ENV`] = `1`): kernels with a cooperative-matrix
    /// variant then load their plain module, for comparing the two on one GPU.
    pub disable_cooperative_matrix: bool,
    /// Run under the Khronos validation layer ([`Validation`]); `None` reads
    /// [`VALIDATION_ENV`](crate::VALIDATION_ENV). What the layer reports is kept:
    /// [`VulkanDevice::validation_messages`].
    pub validation: Option<Validation>,
    /// GPU progress markers for diagnosing hangs ([`BreadcrumbMode`]); `None` reads
    /// [`BREADCRUMBS_ENV`](crate::BREADCRUMBS_ENV). The watchdog's report
    /// ([`WATCHDOG_ENV`](crate::WATCHDOG_ENV)) and [`VulkanDevice::breadcrumbs`] read them.
    pub breadcrumbs: Option<BreadcrumbMode>,
    /// Whether a thread that will run the work a GPU value releases waits for it in the
    /// driver itself ([`SemaphoreImpl::wait_direct`](rafter_hal::SemaphoreImpl::wait_direct));
    /// `None` reads [`DIRECT_WAITS_ENV`], whose default is off.
    pub direct_waits: Option<bool>,
    /// How long such a thread first polls the semaphore's counter before it sleeps
    /// ([`SPIN_WAIT_ENV`]); `None` reads that variable, whose default is
    /// [`DEFAULT_SPIN_WAIT`] on a GPU and zero on a CPU implementation (lavapipe).
    pub spin_wait: Option<Duration>,
}

/// Set to `1` to open Vulkan devices without cooperative matrices
/// ([`VulkanDeviceOptions::disable_cooperative_matrix`]).
pub const NO_COOP_ENV: &str = "RAFTER_VULKAN_NO_COOP";

impl std::fmt::Debug for VulkanDeviceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanDeviceOptions")
            .field("device_index", &self.device_index)
            .field("queue_count", &self.queue_count)
            .field("pipeline_cache_path", &self.pipeline_cache_path)
            .field("name", &self.name)
            .field("trace_sink", &self.trace_sink.is_some())
            .field("disable_16bit_storage", &self.disable_16bit_storage)
            .field(
                "disable_cooperative_matrix",
                &self.disable_cooperative_matrix,
            )
            .field("validation", &self.validation)
            .field("breadcrumbs", &self.breadcrumbs)
            .field("direct_waits", &self.direct_waits)
            .finish()
    }
}

/// How each HAL memory kind maps onto gpu-allocator's locations.
///
/// `HostVisibleShared` is `CpuToGpu`, which prefers `DEVICE_LOCAL | HOST_VISIBLE |
/// HOST_COHERENT` (unified memory, resizable BAR) and falls back to host memory the device
/// reads over the bus; `Host` is `GpuToCpu`, which prefers cached host memory, the fast
/// way to read results back.
pub(crate) fn location(kind: MemoryKind) -> MemoryLocation {
    match kind {
        MemoryKind::DeviceLocal => MemoryLocation::GpuOnly,
        MemoryKind::HostVisibleShared => MemoryLocation::CpuToGpu,
        MemoryKind::Host => MemoryLocation::GpuToCpu,
    }
}

/// Buffer usage for every rafter buffer: kernels reach it by device address, copies and
/// fills by handle.
pub(crate) const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS.as_raw(),
);

/// What every handle of one device shares: the `VkDevice`, its allocator, queues, the
/// scheduler, and the registry of semaphores. Destroyed (and the `VkDevice` with it) when
/// the last buffer, semaphore, executable, queue or command buffer referring to it is gone.
pub(crate) struct Shared {
    pub(crate) id: DeviceId,
    pub(crate) name: String,
    pub(crate) caps: VulkanCapabilities,
    pub(crate) device: ash::Device,
    pub(crate) queue_family: u32,
    /// `VkQueue`s; externally synchronised by the scheduler lock, which every submit holds.
    pub(crate) queues: Vec<vk::Queue>,
    /// `None` only while the device is being destroyed.
    pub(crate) allocator: Mutex<Option<Allocator>>,
    /// The one pipeline layout: no descriptor sets, one push-constant range of
    /// `push_constant_size` bytes for compute.
    pub(crate) pipeline_layout: vk::PipelineLayout,
    pub(crate) push_constant_size: u32,
    pub(crate) pipeline_cache: PipelineCache,
    pub(crate) sched: Mutex<SchedState>,
    /// Host-signalled to wake the monitor thread out of `vkWaitSemaphores`.
    pub(crate) wake_semaphore: vk::Semaphore,
    wake_counter: Mutex<u64>,
    /// How many times the monitor has retired finished batches (and reported their GPU
    /// spans), with the condition variable a traced host wait sleeps on
    /// ([`Shared::await_reported`]).
    retire_epoch: Mutex<u64>,
    retire_passed: Condvar,
    /// Every semaphore this device created (weakly): the monitor fires their timepoints.
    pub(crate) semaphores: Mutex<Vec<Weak<SemInner>>>,
    /// Set once the device is lost (or reported lost): the reason.
    lost: Mutex<Option<String>>,
    lost_flag: AtomicBool,
    /// The public device object was dropped: no new work is accepted.
    pub(crate) closing: AtomicBool,
    /// Tells the monitor to finish: fail deferred work, drain running work, exit.
    pub(crate) shutdown: AtomicBool,
    /// Memory kinds and their properties, as gpu-allocator will place them.
    pub(crate) memory: Vec<MemoryKindInfo>,
    /// Receives GPU-timed events of completed submissions (see
    /// [`VulkanDeviceOptions::trace_sink`]); `None` also when the queue family has no
    /// timestamps.
    pub(crate) trace: Option<Arc<dyn TraceSink>>,
    /// Keeps the instance alive until the device is destroyed; holds the validation
    /// messages.
    pub(crate) instance: Arc<InstanceOwner>,
    /// The GPU progress markers, when on (`breadcrumbs.rs`).
    pub(crate) breadcrumbs: Option<Breadcrumbs>,
    /// What every submission ends with (`batch_tail.rs`: issue 28's NVIDIA stall).
    pub(crate) tail: BatchTail,
    /// Serialises every call that signals a timeline semaphore (`vkQueueSubmit2`,
    /// `vkSignalSemaphore`) across threads where [`SERIAL_SIGNALS_ENV`] asks for it;
    /// `None` by default. See [`Shared::signal_guard`].
    signal_lock: Option<Mutex<()>>,
    /// The diagnostic variant of the submission path in use (issue 28; off by default).
    pub(crate) stall_probe: StallProbe,
    /// With a trace sink and `VK_EXT_calibrated_timestamps`: reads the device clock, so
    /// GPU spans land where they happened on the host's clock (`clock.rs`).
    pub(crate) clock: Option<DeviceClock>,
    /// Whether [`SemaphoreImpl::wait_direct`](rafter_hal::SemaphoreImpl::wait_direct)
    /// waits in the driver on the caller's thread ([`DIRECT_WAITS_ENV`]).
    pub(crate) direct_waits: bool,
    /// How long a direct waiter polls the counter before sleeping ([`SPIN_WAIT_ENV`]).
    pub(crate) spin_wait: Duration,
}

/// `1` or `0`: whether a thread that will run the work a GPU value releases (the CPU
/// device's helper) waits for it in `vkWaitSemaphores` itself, woken by the GPU's signal,
/// or sleeps until the monitor thread, woken by the signal, wakes it. Default: off. On
/// lavapipe it shortens a GPU-to-CPU handoff (a median 19-23 us against 25-29 us through
/// the monitor, two loaded cores). Long traced runs with it on used to hang on lavapipe;
/// the cause was the monitor's `vkGetQueryPoolResults` (traced runs hung without it too),
/// replaced by a copy the command buffer makes itself (`Timing::copy_results`), after which
/// tests/direct_wait.rs's long loop ended every time. Off on NVIDIA in any case: its driver
/// spins in short waits and was measured missing wake-ups (issue 28), which is why host
/// waits go through the monitor there.
pub const DIRECT_WAITS_ENV: &str = "RAFTER_VULKAN_DIRECT_WAITS";

/// Microseconds a thread that will run the work a GPU value releases (the CPU device's
/// helper, [`SemaphoreImpl::wait_direct`](rafter_hal::SemaphoreImpl::wait_direct)) polls
/// the semaphore's counter (`vkGetSemaphoreCounterValue`) before it sleeps; `0` turns the
/// spin off. Why poll: a sleeping waiter is woken by the driver's interrupt path, which
/// on the H200's driver put 27-42 us between a GPU batch's end and the CPU's first work
/// (issue 26's bar is 20 us), where a poll sees the value within a microsecond or two.
/// CUDA's runtime makes the same trade by default (`cudaDeviceScheduleAuto` spins while
/// the machine has more cores than active contexts). The spin is bounded per wait, so a
/// long GPU segment costs one core this long and then the usual sleep; and it is off by
/// default on a CPU implementation of Vulkan (lavapipe), where the GPU's work runs on the
/// same cores the spin would take.
pub const SPIN_WAIT_ENV: &str = "RAFTER_VULKAN_SPIN_WAIT_US";

/// The longest a traced host wait waits for the monitor's report of what it waited for
/// (a monitor that stopped, as the device closes, must not hold it longer).
const REPORT_WAIT: Duration = Duration::from_millis(200);

/// [`SPIN_WAIT_ENV`]'s default on a GPU.
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_micros(1000);

/// The spin budget: `explicit`, else [`SPIN_WAIT_ENV`], else the default for the device
/// type. A malformed variable is reported and read as the default.
fn spin_wait(explicit: Option<Duration>, device_type: &str) -> Duration {
    if let Some(d) = explicit {
        return d;
    }
    let value = std::env::var(SPIN_WAIT_ENV).ok();
    let (budget, complaint) = parse_spin_wait(value.as_deref(), device_type);
    if let Some(complaint) = complaint {
        eprintln!("{complaint}");
    }
    budget
}

/// [`SPIN_WAIT_ENV`]'s `value` (`None`: unset) on a device of `device_type`: the budget,
/// and what to say when the value is malformed (the default is used then).
fn parse_spin_wait(value: Option<&str>, device_type: &str) -> (Duration, Option<String>) {
    let default = if device_type == "cpu" {
        Duration::ZERO
    } else {
        DEFAULT_SPIN_WAIT
    };
    match value {
        None => (default, None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(us) => (Duration::from_micros(us), None),
            Err(_) => (
                default,
                Some(format!(
                    "{SPIN_WAIT_ENV}={v:?}: expected microseconds; using {default:?}"
                )),
            ),
        },
    }
}

/// Set to `1` to serialise every call that signals a timeline semaphore (submissions and
/// host signals) under one device-wide lock ([`Shared::signal_guard`]), as vkd3d-proton
/// does for an NVIDIA Linux GPU hang under concurrent timeline signals (its commit 2a9c5fc5
/// "Add workaround for strange GPU hang on NV"). Off by default: on the H200 (driver
/// 580.159.04) the lock did not prevent issue 28's stall (the batch tail did: RESULTS.md),
/// and it put the GPU's submission in a CPU -> GPU handoff behind the CPU's
/// `vkSignalSemaphore` of the boundary value (15-35 us there): the handoff's median went
/// from 44-49 to 18-20 us without it (`rafter bench midgraph.onnx --device auto --trace`).
pub const SERIAL_SIGNALS_ENV: &str = "RAFTER_VULKAN_SERIAL_SIGNALS";

impl Shared {
    /// With [`SERIAL_SIGNALS_ENV`], held across every `vkQueueSubmit2` and
    /// `vkSignalSemaphore`: no two threads signal timeline semaphores at once (rafter's
    /// submissions, under the scheduler lock, otherwise race host signals, under each
    /// semaphore's lock, and the monitor's wake signal). Neither call waits for the GPU (a
    /// submission whose waits are not yet submitted is held host-side), so no thread holds
    /// the lock across GPU work. It is a leaf lock, taken right before the call and
    /// released right after, with no other lock taken while it is held. `None` (no lock)
    /// by default: see [`SERIAL_SIGNALS_ENV`] for why.
    pub(crate) fn signal_guard(&self) -> Option<MutexGuard<'_, ()>> {
        self.signal_lock
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether every submission records a fresh `VkCommandBuffer` (breadcrumbs' rerecord
    /// mode, or issue 28's rerecord probe) instead of reusing one recorded once.
    pub(crate) fn rerecords(&self) -> bool {
        self.stall_probe == StallProbe::Rerecord
            || matches!(&self.breadcrumbs, Some(c) if c.mode == BreadcrumbMode::Rerecord)
    }

    pub(crate) fn lock_sched(&self) -> MutexGuard<'_, SchedState> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the monitor thread (it re-reads everything it watches).
    /// Called by the monitor after each retire pass.
    pub(crate) fn note_retire_pass(&self) {
        *self.retire_epoch.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.retire_passed.notify_all();
    }

    /// Waits (at most [`REPORT_WAIT`]) until the batches that brought `semaphore` to its
    /// current value have been retired and their GPU spans reported.
    ///
    /// A batch counts while it is in flight (`Shared::reached_batch_in_flight`): the
    /// semaphore a host thread waited on can be signalled before the batch's completion
    /// semaphore, which the monitor retires by; counting retire passes instead (two after
    /// the call) let lavapipe's queue thread, preempted between those two signals on a
    /// loaded 2-core CI host, miss both passes and the wait return with no span reported.
    /// Once no such batch is in flight, one more pass is awaited: the pass that retired the
    /// last one reports its spans before it ends.
    pub(crate) fn await_reported(&self, semaphore: &SemInner) {
        let deadline = std::time::Instant::now() + REPORT_WAIT;
        loop {
            let epoch = *self.retire_epoch.lock().unwrap_or_else(|e| e.into_inner());
            if !self.reached_batch_in_flight(semaphore) {
                // With nothing in flight the monitor sleeps a long tick: wake it.
                self.wake();
                self.await_pass_after(epoch, deadline);
                return;
            }
            // The monitor waits on the batch's completion semaphore and passes when it is
            // signalled; no wake-up is needed (waking it would spin passes while the
            // signalling thread waits for a core).
            if !self.await_pass_after(epoch, deadline) {
                return;
            }
        }
    }

    /// Waits until a retire pass has ended after `epoch` (true), or until `deadline`.
    fn await_pass_after(&self, epoch: u64, deadline: std::time::Instant) -> bool {
        let mut current = self.retire_epoch.lock().unwrap_or_else(|e| e.into_inner());
        while *current <= epoch {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            current = self
                .retire_passed
                .wait_timeout(current, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    pub(crate) fn wake(&self) {
        let mut counter = self.wake_counter.lock().unwrap_or_else(|e| e.into_inner());
        *counter += 1;
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.wake_semaphore)
            .value(*counter);
        let signal = self.signal_guard();
        // SAFETY: the wake semaphore is a timeline semaphore of this device, only ever
        // host-signalled, here, under the counter lock, so values strictly increase.
        let result = unsafe { self.device.signal_semaphore(&info) };
        drop(signal);
        if let Err(result) = result {
            if result == vk::Result::ERROR_DEVICE_LOST {
                drop(counter);
                self.set_lost(format!("vkSignalSemaphore: {result}"));
            }
        }
    }

    /// The device-lost reason, once lost.
    pub(crate) fn lost_reason(&self) -> Option<String> {
        if !self.lost_flag.load(Ordering::Acquire) {
            return None;
        }
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks the device lost (the first reason wins) and wakes the monitor, which fails
    /// every semaphore and every submission that has not completed.
    pub(crate) fn set_lost(&self, reason: String) {
        {
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            if lost.is_none() {
                *lost = Some(format!(
                    "device lost: Vulkan device '{}' ({}): {reason}",
                    self.name, self.id
                ));
            }
        }
        self.lost_flag.store(true, Ordering::Release);
        self.wake();
    }

    /// Handles a failed Vulkan call on a running device: device loss marks the device.
    pub(crate) fn check_lost(&self, call: &str, result: vk::Result) {
        if result == vk::Result::ERROR_DEVICE_LOST {
            self.set_lost(format!("{call}: {result}"));
        }
    }

    /// Live semaphores of this device.
    pub(crate) fn live_semaphores(&self) -> Vec<Arc<SemInner>> {
        let mut registry = self.semaphores.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|w| w.strong_count() > 0);
        registry.iter().filter_map(Weak::upgrade).collect()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: this runs when the last handle is gone, so no command buffer, buffer or
        // semaphore of the device is in use by the host; `VulkanDevice::drop` waited for the
        // device to go idle, and nothing could be submitted after that. Objects are
        // destroyed before the device, and the allocator frees its memory before it too.
        unsafe {
            let _ = self.device.device_wait_idle();
            let state = self.sched.get_mut().unwrap_or_else(|e| e.into_inner());
            state.in_flight.clear();
            state.retired.clear();
            state.deferred.clear();
            for (semaphore, _) in state.completion_pool.drain(..) {
                self.device.destroy_semaphore(semaphore, None);
            }
            self.device.destroy_semaphore(self.wake_semaphore, None);
            self.device
                .destroy_pipeline_layout(self.pipeline_layout, None);
            self.pipeline_cache.destroy(&self.device);
            let allocator = self.allocator.get_mut().unwrap_or_else(|e| e.into_inner());
            if let (Some(crumbs), Some(allocator)) = (&mut self.breadcrumbs, allocator.as_mut()) {
                crumbs.destroy(&self.device, allocator);
            }
            if let Some(allocator) = allocator.as_mut() {
                self.tail.destroy(&self.device, allocator);
            }
            drop(
                self.allocator
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(),
            );
            self.device.destroy_device(None);
        }
        let _ = &self.instance;
    }
}

/// A Vulkan 1.3 device behind the [`rafter_hal::Device`] traits.
///
/// - **Memory** ([`MemoryKind`]): device-local, host-visible shared (device-local *and*
///   host-visible where the device has it: unified memory, resizable BAR; the zero-copy
///   path), and host (cached host memory, for read-back). Every buffer has a 64-bit device
///   address, so a buffer may be as large as `maxBufferSize`, far beyond
///   `maxStorageBufferRange`. Only host-coherent memory is mapped.
/// - **Executables**: SPIR-V ([`FORMAT_SPIRV`]); one compute pipeline per `GLCompute` entry
///   point, created through the device's pipeline cache. Kernels take no descriptors: the
///   push constants hold binding `i`'s device address (buffer address plus range offset,
///   a little-endian `u64`) at byte `8 * i`, and the dispatch's `params` after the last one.
/// - **Queues**: `vkQueueSubmit2` with timeline semaphores; see [`VulkanQueue`] for the
///   submission model (submission never blocks; GPU work waits on GPU work directly).
/// - **Drop**: fails work that never started, waits for submitted work, saves the pipeline
///   cache. Handles that outlive the device keep the `VkDevice` alive until they go.
pub struct VulkanDevice {
    shared: Arc<Shared>,
    info: DeviceInfo,
    queues: Vec<Arc<VulkanQueue>>,
    monitor: Mutex<Option<JoinHandle<()>>>,
}

impl VulkanDevice {
    /// Opens a device: loads the loader, picks the physical device, enables what rafter
    /// uses, creates queues, the allocator, the pipeline layout and cache, and starts the
    /// monitor thread. Without a usable device this is [`VulkanError::NoDevice`], whose
    /// message lists the drivers found and why each was refused.
    pub fn new(options: VulkanDeviceOptions) -> Result<VulkanDevice, VulkanError> {
        let validation = match options.validation {
            Some(validation) => validation,
            None => Validation::from_env()?,
        };
        let owner = instance::create_instance(validation)?;
        let candidates = instance::enumerate(&owner)?;
        let chosen = instance::select(candidates, options.device_index)?;
        let shared = Arc::new(create_shared(owner, chosen, &options)?);
        let info = device_info(&shared);
        let queues = (0..shared.queues.len())
            .map(|i| Arc::new(VulkanQueue::new(shared.clone(), i)))
            .collect();
        let monitor_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("rafter-{}{}-monitor", shared.name, shared.id))
            .spawn(move || run_monitor(monitor_shared))
            .map_err(|e| VulkanError::Other(format!("spawning the monitor thread: {e}")))?;
        Ok(VulkanDevice {
            shared,
            info,
            queues,
            monitor: Mutex::new(Some(handle)),
        })
    }

    /// Which validation the device runs under.
    pub fn validation(&self) -> Validation {
        self.shared.instance.validation
    }

    /// The validation layer's errors and warnings since the device opened (at most the
    /// first 200), and how many there were in all; empty without validation.
    pub fn validation_messages(&self) -> (Vec<ValidationMessage>, usize) {
        self.shared.instance.log.messages()
    }

    /// The device's validation log, which outlives the device: tests drop the device and
    /// then assert it is empty (destroying an object still in use is reported at the drop).
    pub fn validation_log(&self) -> ValidationLog {
        self.shared.instance.log.clone()
    }

    /// Makes one call the validation layer must report (a pipeline layout whose
    /// push-constant range is 6 bytes, not a multiple of 4: VUID-VkPushConstantRange-size-00297),
    /// harmless to the driver, which only stores the number. For the test that shows the
    /// messenger records what the layer says (a check that can fail).
    #[doc(hidden)]
    pub fn provoke_validation_error(&self) {
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(6)];
        let info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
        // SAFETY: `info` lives across the call; the layout is destroyed at once, unused. The
        // size breaks a valid-usage rule on purpose; drivers round or store it.
        unsafe {
            if let Ok(layout) = self.shared.device.create_pipeline_layout(&info, None) {
                self.shared.device.destroy_pipeline_layout(layout, None);
            }
        }
    }

    /// What the device offers: features, subgroups, cooperative matrix, limits, memory.
    pub fn capabilities(&self) -> &VulkanCapabilities {
        &self.shared.caps
    }

    /// How the pipeline cache was loaded: `loaded N bytes from PATH`, `empty (...)`.
    pub fn pipeline_cache_status(&self) -> &str {
        self.shared.pipeline_cache.status()
    }

    /// Writes the pipeline cache to its path now (also done on drop). Without a path this
    /// does nothing.
    pub fn save_pipeline_cache(&self) -> Result<(), HalError> {
        self.shared.pipeline_cache.save(&self.shared.device)
    }

    /// Reports the device lost, as the driver would: every semaphore of the device fails
    /// with `reason`, work not yet submitted never runs, and new submissions are refused.
    /// For tests of failure propagation (a real loss cannot be provoked on demand).
    #[doc(hidden)]
    pub fn inject_device_loss(&self, reason: &str) {
        self.shared.set_lost(format!("injected: {reason}"));
    }

    /// With breadcrumbs on ([`BreadcrumbMode::Reuse`]): how far the GPU got in the
    /// `VkCommandBuffer` recorded for `command_buffer` (its last submission's progress, or
    /// a mix of two submissions' when two were in flight at once), e.g. "started: yes, last
    /// finished command #2 of 3 (copy 64), 3 of 3 done; finished". `None` when breadcrumbs
    /// are off, in [`BreadcrumbMode::Rerecord`] (each submission records its own), or the
    /// command buffer was never submitted to this device.
    pub fn breadcrumbs(&self, command_buffer: &rafter_hal::CommandBuffer) -> Option<String> {
        let prepared = crate::command::cached(command_buffer, &self.shared)?;
        prepared.progress().map(|p| p.to_string())
    }

    /// The word queue `queue`'s submission tail writes (`batch_tail.rs`): 0 until a
    /// submission on that queue completed with its tail, [`TAIL_MARK`](crate::TAIL_MARK)
    /// after. For tests; `None` where the host cannot read it.
    pub fn submission_tail_word(&self, queue: usize) -> Option<u32> {
        self.shared.tail.word(queue)
    }

    /// What the device still holds: `(semaphores alive, batches submitted or completed
    /// whose objects are not yet released, deferred submissions)`. For leak checks: once
    /// every handle a caller held is gone and the work is done, the first and last are 0
    /// and the second drops to 0 within the release grace (see queue.rs).
    pub fn live_objects(&self) -> (usize, usize, usize) {
        let semaphores = self.shared.live_semaphores().len();
        let state = self.shared.lock_sched();
        (
            semaphores,
            state.in_flight.len() + state.retired.len(),
            state.deferred.len(),
        )
    }
}

fn create_shared(
    owner: Arc<InstanceOwner>,
    chosen: instance::Candidate,
    options: &VulkanDeviceOptions,
) -> Result<Shared, VulkanError> {
    let mut caps = chosen.caps;
    if options.disable_16bit_storage {
        caps.storage_buffer_16bit = false;
    }
    if options.disable_cooperative_matrix || std::env::var(NO_COOP_ENV).is_ok_and(|v| v == "1") {
        caps.cooperative_matrix = None;
    }
    if let Some(spec) = owner.layer_spec {
        if caps.cooperative_matrix.is_some() && !validation::layer_knows_cooperative_matrix(spec) {
            eprintln!(
                "Vulkan validation: the validation layer ({}) predates VK_KHR_cooperative_matrix \
                 (1.3.255); device '{}' leaves it off so the layer checks every kernel that runs",
                instance::version_string(spec),
                caps.device_name
            );
            caps.cooperative_matrix = None;
        }
    }
    let physical = chosen.physical;
    let (family, family_queues) = caps
        .compute_queue_family
        .expect("select() refuses devices without a compute queue");
    let queue_count = options.queue_count.clamp(1, family_queues as usize);
    let priorities = vec![1.0f32; queue_count];
    let queue_infos = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];

    // Enable exactly what the device has of what rafter uses.
    let base = vk::PhysicalDeviceFeatures::default()
        .shader_int16(caps.shader_int16)
        .shader_int64(caps.shader_int64)
        .shader_float64(caps.shader_float64);
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
        .storage_buffer16_bit_access(caps.storage_buffer_16bit);
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
        .buffer_device_address(true)
        .timeline_semaphore(true)
        .storage_buffer8_bit_access(caps.storage_buffer_8bit)
        .shader_int8(caps.shader_int8)
        .shader_float16(caps.shader_float16)
        .vulkan_memory_model(caps.vulkan_memory_model);
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default()
        .synchronization2(true)
        .maintenance4(caps.maintenance4)
        .subgroup_size_control(caps.subgroup_size_control)
        .compute_full_subgroups(caps.compute_full_subgroups);
    let mut coop =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let mut extensions: Vec<*const std::ffi::c_char> = Vec::new();
    let mut features = vk::PhysicalDeviceFeatures2::default()
        .features(base)
        .push_next(&mut f11)
        .push_next(&mut f12)
        .push_next(&mut f13);
    if caps.cooperative_matrix.is_some() {
        extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        features = features.push_next(&mut coop);
    }
    // Traced devices read their clock on the host to place GPU spans (`clock.rs`).
    let calibrated = options.trace_sink.is_some()
        && DeviceClock::supported(
            &owner.entry,
            &owner.instance,
            physical,
            instance::has_extension(&owner, physical, ash::ext::calibrated_timestamps::NAME),
        );
    if calibrated {
        extensions.push(ash::ext::calibrated_timestamps::NAME.as_ptr());
    }
    let device_info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queue_infos)
        .enabled_extension_names(&extensions)
        .push_next(&mut features);
    // SAFETY: `physical` belongs to `owner.instance`; the create info and its chains are
    // locals that live across the call; every feature enabled was reported supported.
    let device = unsafe { owner.instance.create_device(physical, &device_info, None) }.map_err(
        |result| VulkanError::Call {
            call: "vkCreateDevice",
            result,
        },
    )?;
    // From here on, an error must destroy what was created: `Partial` does it.
    let mut partial = Partial {
        device: Some(device.clone()),
        semaphore: vk::Semaphore::null(),
        layout: vk::PipelineLayout::null(),
    };
    let queues: Vec<vk::Queue> = (0..queue_count as u32)
        // SAFETY: the queues were requested in `queue_infos` for this family.
        .map(|i| unsafe { device.get_device_queue(family, i) })
        .collect();

    let mut allocator = Allocator::new(&AllocatorCreateDesc {
        instance: owner.instance.clone(),
        device: device.clone(),
        physical_device: physical,
        debug_settings: AllocatorDebugSettings::default(),
        buffer_device_address: true,
        allocation_sizes: AllocationSizes::default(),
    })
    .map_err(|e| VulkanError::Other(format!("gpu-allocator: {e}")))?;

    partial.semaphore = create_timeline(&device, 0).map_err(|result| VulkanError::Call {
        call: "vkCreateSemaphore",
        result,
    })?;
    let push_constant_size = caps.limits.max_push_constants_size.min(256);
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .offset(0)
        .size(push_constant_size)];
    let layout_info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
    // SAFETY: `layout_info` lives across the call; the device is valid.
    partial.layout =
        unsafe { device.create_pipeline_layout(&layout_info, None) }.map_err(|result| {
            VulkanError::Call {
                call: "vkCreatePipelineLayout",
                result,
            }
        })?;
    let pipeline_cache = PipelineCache::open(&device, &caps, options.pipeline_cache_path.clone())
        .map_err(|result| VulkanError::Call {
        call: "vkCreatePipelineCache",
        result,
    })?;
    let memory = memory_kinds(&device, &caps);
    let name = if options.name.is_empty() {
        "vulkan".to_string()
    } else {
        options.name.clone()
    };
    let trace = options
        .trace_sink
        .clone()
        .filter(|_| caps.timestamp_valid_bits > 0);
    let mode = options.breadcrumbs.unwrap_or_else(BreadcrumbMode::from_env);
    let breadcrumbs = (mode != BreadcrumbMode::Off)
        .then(|| Breadcrumbs::open(&device, &mut allocator, mode))
        .and_then(|opened| {
            opened
                .map_err(|e| eprintln!("{BREADCRUMBS_ENV}: {e}; breadcrumbs are off"))
                .ok()
        });
    let tail = match BatchTail::open(&device, &mut allocator, family, queues.len()) {
        Ok(tail) => tail,
        Err(e) => {
            if let Some(mut crumbs) = breadcrumbs {
                crumbs.destroy(&device, &mut allocator);
            }
            // SAFETY: nothing uses the cache yet.
            unsafe { pipeline_cache.destroy(&device) };
            return Err(VulkanError::Other(format!("the submission tail: {e}")));
        }
    };
    let (wake_semaphore, pipeline_layout) = (partial.semaphore, partial.layout);
    partial.device = None;
    let clock = calibrated.then(|| DeviceClock::new(&owner.instance, &device));
    let direct_waits = options
        .direct_waits
        .unwrap_or_else(|| std::env::var(DIRECT_WAITS_ENV).as_deref() == Ok("1"));
    let spin_wait = spin_wait(options.spin_wait, caps.device_type);
    Ok(Shared {
        id: DeviceId::fresh(),
        name,
        caps,
        device,
        queue_family: family,
        queues,
        allocator: Mutex::new(Some(allocator)),
        pipeline_layout,
        push_constant_size,
        pipeline_cache,
        sched: Mutex::new(SchedState::default()),
        wake_semaphore,
        wake_counter: Mutex::new(0),
        retire_epoch: Mutex::new(0),
        retire_passed: Condvar::new(),
        semaphores: Mutex::new(Vec::new()),
        lost: Mutex::new(None),
        lost_flag: AtomicBool::new(false),
        closing: AtomicBool::new(false),
        shutdown: AtomicBool::new(false),
        memory,
        trace,
        instance: owner,
        breadcrumbs,
        tail,
        // The `exclusive` stall probe creates pipelines under the signal lock: it needs one.
        signal_lock: (std::env::var(SERIAL_SIGNALS_ENV).as_deref() == Ok("1")
            || StallProbe::from_env() == StallProbe::ExclusivePipelines)
            .then(|| Mutex::new(())),
        stall_probe: StallProbe::from_env(),
        clock,
        direct_waits,
        spin_wait,
    })
}

/// Destroys what `create_shared` made so far when it fails half-way.
struct Partial {
    device: Option<ash::Device>,
    semaphore: vk::Semaphore,
    layout: vk::PipelineLayout,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(device) = self.device.take() {
            // SAFETY: nothing has used these objects; null handles are ignored by Vulkan.
            unsafe {
                device.destroy_pipeline_layout(self.layout, None);
                device.destroy_semaphore(self.semaphore, None);
                device.destroy_device(None);
            }
        }
    }
}

/// A timeline semaphore at `initial`.
pub(crate) fn create_timeline(
    device: &ash::Device,
    initial: u64,
) -> Result<vk::Semaphore, vk::Result> {
    let mut kind = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(initial);
    let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
    // SAFETY: `info` and its chain live across the call; timeline semaphores are enabled.
    unsafe { device.create_semaphore(&info, None) }
}

/// The memory type gpu-allocator picks for `location`, mirroring its search (first type
/// allowed for our buffers with the preferred flags, then with the required ones).
fn chosen_type(caps: &VulkanCapabilities, bits: u32, location: MemoryLocation) -> Option<usize> {
    use vk::MemoryPropertyFlags as F;
    let (preferred, required) = match location {
        MemoryLocation::GpuOnly => (F::DEVICE_LOCAL, F::DEVICE_LOCAL),
        MemoryLocation::CpuToGpu => (
            F::HOST_VISIBLE | F::HOST_COHERENT | F::DEVICE_LOCAL,
            F::HOST_VISIBLE | F::HOST_COHERENT,
        ),
        MemoryLocation::GpuToCpu => (
            F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
            F::HOST_VISIBLE | F::HOST_COHERENT,
        ),
        _ => (F::empty(), F::empty()),
    };
    let find = |flags: F| {
        caps.memory_types
            .iter()
            .enumerate()
            .position(|(i, t)| bits & (1 << i) != 0 && t.flags.contains(flags))
    };
    find(preferred).or_else(|| find(required))
}

fn memory_kinds(device: &ash::Device, caps: &VulkanCapabilities) -> Vec<MemoryKindInfo> {
    let create = vk::BufferCreateInfo::default()
        .size(1 << 16)
        .usage(BUFFER_USAGE)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    let query = vk::DeviceBufferMemoryRequirements::default().create_info(&create);
    let mut reqs = vk::MemoryRequirements2::default();
    // SAFETY: Vulkan 1.3 core (maintenance4); the structures live across the call.
    unsafe { device.get_device_buffer_memory_requirements(&query, &mut reqs) };
    let bits = reqs.memory_requirements.memory_type_bits;
    let mut kinds = Vec::new();
    for kind in MemoryKind::ALL {
        let Some(index) = chosen_type(caps, bits, location(kind)) else {
            continue;
        };
        let flags = caps.memory_types[index].flags;
        let mappable = flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
            && flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT);
        kinds.push(MemoryKindInfo {
            kind,
            host_visible: mappable,
            host_coherent: mappable,
            capacity: caps
                .memory_heaps
                .get(caps.memory_types[index].heap as usize)
                .map(|h| h.size),
        });
    }
    kinds
}

fn device_info(shared: &Shared) -> DeviceInfo {
    let caps = &shared.caps;
    let limits = &caps.limits;
    // Push constants hold one u64 address per binding, then the params; past
    // `INLINE_BINDINGS` bindings the same block goes through memory (`command.rs`), so the
    // params' room is what the inline form leaves.
    let max_bindings = crate::command::MAX_BINDINGS;
    let max_params = shared.push_constant_size as usize - 8 * crate::command::INLINE_BINDINGS;
    DeviceInfo {
        id: shared.id,
        name: shared.name.clone(),
        kind: DeviceKind::Vulkan,
        memory: shared.memory.clone(),
        limits: Limits {
            // `maxBufferSize`, not `maxMemoryAllocationSize`: the latter is where the driver
            // *may* start refusing `vkAllocateMemory` with VK_ERROR_OUT_OF_DEVICE_MEMORY, not
            // a limit on valid use, and NVIDIA reports ~4 GiB there yet allocates more. Past
            // it (or past the heap, which gpu-allocator checks) allocation fails cleanly.
            max_buffer_size: limits.max_buffer_size,
            max_total_allocation: None,
            max_bindings,
            max_push_constant_size: max_params,
            max_workgroup_count: limits.max_compute_workgroup_count,
        },
        capabilities: Capabilities {
            dtypes: caps.dtypes().into_iter().map(String::from).collect(),
            features: caps.feature_names().into_iter().collect(),
            executable_formats: BTreeSet::from([FORMAT_SPIRV.to_string()]),
            subgroup_size: Some(caps.subgroup_size),
        },
        peak_flops: None,
        memory_bandwidth: None,
    }
}

impl Device for VulkanDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, size: u64, kind: MemoryKind) -> Result<Buffer, HalError> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(HalError::DeviceLost(reason));
        }
        if !self.shared.memory.iter().any(|m| m.kind == kind) {
            return Err(HalError::UnsupportedMemoryKind {
                device: self.shared.name.clone(),
                kind,
            });
        }
        let max = self.info.limits.max_buffer_size;
        if size > max {
            return Err(HalError::BufferTooLarge { size, max });
        }
        let buffer = VulkanBuffer::new(self.shared.clone(), size, kind)?;
        Ok(Buffer::from_impl(Arc::new(buffer)))
    }

    fn create_semaphore(&self, initial: u64) -> Result<Semaphore, HalError> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(HalError::DeviceLost(reason));
        }
        let inner = SemInner::new(self.shared.clone(), initial)?;
        Ok(Semaphore::from_impl(inner))
    }

    fn queue_count(&self) -> usize {
        self.queues.len()
    }

    fn queue(&self, index: usize) -> Result<Queue, HalError> {
        let queue = self.queues.get(index).ok_or(HalError::NoSuchQueue {
            index,
            count: self.queues.len(),
        })?;
        Ok(Queue::from_impl(queue.clone()))
    }

    fn load_executable(&self, spec: &ExecutableSpec) -> Result<Executable, HalError> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(HalError::DeviceLost(reason));
        }
        let executable = VulkanExecutable::load(self.shared.clone(), spec)?;
        Ok(Executable::from_impl(Arc::new(executable)))
    }

    /// Loss, the live object counts ([`VulkanDevice::live_objects`]), the scheduler's
    /// deferred and in-flight batches with what each waits for, and every live
    /// semaphore with its value, failure, host timepoints registered on it and the highest
    /// value a submitted batch will signal: a waiter stuck below that value waits on the
    /// GPU; one above it waits on a signal nobody has submitted yet.
    fn describe(&self) -> String {
        let (semaphores, batches, deferred) = self.live_objects();
        let mut out = format!(
            "vulkan device '{}' ({}): lost {:?}, {semaphores} semaphores, {batches} batches in flight or retired, {deferred} deferred submissions\n",
            self.info.name,
            self.info.id,
            self.shared.lost_reason()
        );
        // The scheduler's view (what each deferred or in-flight batch waits for, with ages
        // and the driver's counters; also printed by the monitor under `WATCHDOG_ENV`).
        out.push_str(&self.shared.describe());
        for semaphore in self.shared.live_semaphores() {
            out.push_str(&format!(
                "  value {}: {semaphore:?}\n",
                rafter_hal::SemaphoreImpl::value(&*semaphore)
            ));
        }
        out
    }
}

impl Drop for VulkanDevice {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake();
        let handle = self
            .monitor
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
        // The monitor drained submitted work unless the device was lost; then wait for the
        // GPU (a lost device returns at once) and drop what is left.
        // SAFETY: no other thread submits (closing is set under the scheduler lock's
        // protocol: every submit checks it while holding the lock).
        let _ = unsafe { self.shared.device.device_wait_idle() };
        let leftovers = std::mem::take(&mut self.shared.lock_sched().in_flight);
        let reason = self
            .shared
            .lost_reason()
            .unwrap_or_else(|| format!("device '{}' was dropped", self.shared.name));
        let mut completions = Vec::with_capacity(leftovers.len());
        for flight in leftovers {
            flight.fail_foreign(&reason);
            completions.push(flight.completion());
        }
        // Their completion semaphores join the pool, which `Shared::drop` destroys before
        // the device (a lost device's batches never retired to return them).
        self.shared.lock_sched().completion_pool.extend(completions);
        let _ = self.shared.pipeline_cache.save(&self.shared.device);
        let (_, total) = self.validation_messages();
        if total > 0 {
            eprintln!(
                "Vulkan validation: {total} messages on device '{}' (each id printed once \
                 above)",
                self.shared.name
            );
        }
    }
}

impl fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .field("physical", &self.shared.caps.device_name)
            .field("queues", &self.queues.len())
            .finish()
    }
}

// `Shared` is only reached through `Arc` by handles that must be `Send + Sync`; its Vulkan
// handles are plain integers and ash's function tables are `Send + Sync`.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Shared>();
};

#[cfg(test)]
mod spin_wait_tests {
    use super::*;

    #[test]
    fn the_spin_budget_reads_microseconds_and_refuses_anything_else() {
        assert_eq!(parse_spin_wait(None, "discrete"), (DEFAULT_SPIN_WAIT, None));
        assert_eq!(parse_spin_wait(None, "cpu"), (Duration::ZERO, None));
        assert_eq!(
            parse_spin_wait(Some(" 250 "), "cpu"),
            (Duration::from_micros(250), None)
        );
        assert_eq!(
            parse_spin_wait(Some("0"), "discrete"),
            (Duration::ZERO, None)
        );
        for bad in ["", "1ms", "-5", "1.5"] {
            let (budget, complaint) = parse_spin_wait(Some(bad), "integrated");
            assert_eq!(budget, DEFAULT_SPIN_WAIT, "{bad:?}");
            let complaint = complaint.unwrap_or_default();
            assert!(
                complaint.contains(SPIN_WAIT_ENV) && complaint.contains("microseconds"),
                "{bad:?}: {complaint}"
            );
        }
        assert_eq!(
            spin_wait(Some(Duration::from_micros(7)), "cpu"),
            Duration::from_micros(7)
        );
    }
}
