//! Devices and their queues.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::command::{CommandBuffer, CommandBufferBuilder};
use crate::error::Result;
use crate::executable::{Executable, ExecutableSpec};
use crate::memory::{Buffer, MemoryKind, MemoryKindInfo};
use crate::semaphore::Semaphore;

/// A process-unique device identity, used to check that objects are used by the device that
/// created them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(u64);

impl DeviceId {
    /// A new identity, never returned before in this process.
    pub fn fresh() -> DeviceId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeviceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The identity as a number (for names and traces).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// What sort of device this is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU (`rafter-hal-cpu`).
    Cpu,
    /// A Vulkan 1.3 device (`rafter-hal-vulkan`).
    Vulkan,
    /// A plug-in device (an NPU driver, say), named by its driver.
    Other(String),
}

/// Hard limits the device enforces; commands that exceed them are rejected at record time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest single buffer, in bytes.
    pub max_buffer_size: u64,
    /// Total bytes the device lets live at once, if limited.
    pub max_total_allocation: Option<u64>,
    /// Most buffer bindings one dispatch may take.
    pub max_bindings: usize,
    /// Most push-constant (`params`) bytes per dispatch.
    pub max_push_constant_size: usize,
    /// Largest workgroup grid per dimension.
    pub max_workgroup_count: [u32; 3],
}

/// What the device can run: an open record the partitioner consults. Devices fill the fields
/// they know; `features` holds named optional capabilities (`"subgroups"`,
/// `"cooperative-matrix"`, `"int8-dot"`) so a new one needs no new field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Element types the device computes in, by IR name (`"f32"`, `"f16"`, `"bf16"`, `"i8"`).
    pub dtypes: BTreeSet<String>,
    /// Named optional features.
    pub features: BTreeSet<String>,
    /// Executable formats [`Device::load_executable`] accepts (`"cpu-kernels"`, `"spirv"`).
    pub executable_formats: BTreeSet<String>,
    /// Subgroup (SIMD group, warp) size, where it means something.
    pub subgroup_size: Option<u32>,
}

impl Capabilities {
    /// Whether the device computes on `dtype` (`"f16"`, `"i8"`).
    pub fn supports_dtype(&self, dtype: &str) -> bool {
        self.dtypes.contains(dtype)
    }

    /// Whether the device has the optional `feature` (`"cooperative_matrix"`, ...).
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.contains(feature)
    }
}

/// Static description of a device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The process-unique identity.
    pub id: DeviceId,
    /// A human name (`"cpu"`, `"AMD Radeon 780M"`).
    pub name: String,
    /// What sort of device.
    pub kind: DeviceKind,
    /// The memory kinds the device offers, with their properties.
    pub memory: Vec<MemoryKindInfo>,
    /// Its limits (bindings, buffer sizes, workgroups).
    pub limits: Limits,
    /// Its dtypes, features and executable formats.
    pub capabilities: Capabilities,
    /// Roofline: peak arithmetic throughput in FLOP/s, if known (measured by
    /// `rafter devices --calibrate`).
    pub peak_flops: Option<f64>,
    /// Roofline: memory bandwidth in bytes/s, if known.
    pub memory_bandwidth: Option<f64>,
}

impl DeviceInfo {
    /// The properties of `kind`, if the device offers it.
    pub fn memory_kind(&self, kind: MemoryKind) -> Option<&MemoryKindInfo> {
        self.memory.iter().find(|m| m.kind == kind)
    }
}

/// A device: memory, queues, executables.
///
/// Every method returns at once; the only blocking calls in the HAL are host waits on a
/// [`Semaphore`] (and dropping a device, which waits for its running work to stop).
///
/// # Thread safety
/// Devices are `Send + Sync` and every method may be called concurrently from any thread.
///
/// # Object lifetimes
/// Buffers, semaphores, executables and command buffers are reference-counted handles and
/// may outlive the device object; using them with a dropped device fails with
/// [`HalError::DeviceLost`](crate::HalError::DeviceLost). Dropping a device stops accepting
/// work, fails the signal semaphores of submissions that have not run, waits for running
/// commands, and joins the device's threads.
pub trait Device: Send + Sync + fmt::Debug {
    /// The device's description.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `size` bytes of `kind`. Errors: [`HalError::UnsupportedMemoryKind`],
    /// [`HalError::BufferTooLarge`], [`HalError::OutOfMemory`].
    ///
    /// [`HalError::UnsupportedMemoryKind`]: crate::HalError::UnsupportedMemoryKind
    /// [`HalError::BufferTooLarge`]: crate::HalError::BufferTooLarge
    /// [`HalError::OutOfMemory`]: crate::HalError::OutOfMemory
    fn allocate(&self, size: u64, kind: MemoryKind) -> Result<Buffer>;

    /// A timeline semaphore starting at `initial`, of the device's native kind (usable by
    /// every device and the host all the same; see [`Semaphore`]).
    fn create_semaphore(&self, initial: u64) -> Result<Semaphore>;

    /// Number of queues; at least 1.
    fn queue_count(&self) -> usize;

    /// Queue `index`, or [`HalError::NoSuchQueue`](crate::HalError::NoSuchQueue).
    fn queue(&self, index: usize) -> Result<Queue>;

    /// Starts recording a command buffer for this device.
    fn create_command_buffer(&self) -> Result<CommandBufferBuilder> {
        Ok(CommandBufferBuilder::new(self.info()))
    }

    /// Loads an executable. Errors:
    /// [`HalError::UnsupportedExecutableFormat`](crate::HalError::UnsupportedExecutableFormat)
    /// for a format the device does not know,
    /// [`HalError::InvalidExecutable`](crate::HalError::InvalidExecutable) for a bad payload.
    fn load_executable(&self, spec: &ExecutableSpec) -> Result<Executable>;

    /// Lends the calling thread to the device: runs queued work on it until `done` returns
    /// true (asked between pieces of work) or the device has none to give it. A host thread
    /// calls this before it blocks on a semaphore that the device's work will signal, so
    /// that work starts without waking a device thread, and the host sees it end without
    /// being woken. Devices whose work does not run on host threads (GPUs) keep the
    /// default, which does nothing; a piece of work that has started runs to its end.
    fn help(&self, done: &dyn Fn() -> bool) {
        let _ = done;
    }

    /// A human-readable dump of the device's live state (what it holds and what its
    /// pending work waits on), for diagnosing a hang: a stress test's watchdog prints it when
    /// a call passes its deadline. Devices with nothing more to say keep the default, which
    /// names the device. Never blocks for long (takes the device's locks briefly).
    fn describe(&self) -> String {
        format!("device '{}' ({})", self.info().name, self.info().id)
    }
}

thread_local! {
    /// Set while the thread runs [`submit_then_wait`]'s closure.
    static WILL_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `submit`, telling the queues it submits to that this thread will next wait for that
/// work and lend itself to the devices first ([`Device::help`]). A device whose work runs
/// on threads of its own may then leave the work queued for this thread instead of waking
/// one of them, as long as it hands the helper's spare work to its own threads: the jobs
/// still queued once the helper starts one (they may run side by side with it), and
/// whatever is queued when the helper leaves ([`submitter_will_wait`]). On a 2-vCPU VM the wake-up that the helper made
/// useless (an inter-processor interrupt, and a thread scheduled on the core where the
/// kernels' other worker was about to start) cost MobileNetV2 0.2–0.5% a call (two runs of
/// 30 alternated rounds: 0.998 and 0.995).
///
/// Only for a caller that does wait, whatever `submit` returns: work it left queued would
/// otherwise sit until the device's next wake-up.
pub fn submit_then_wait<R>(submit: impl FnOnce() -> R) -> R {
    /// Clears the flag on return or unwind.
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            WILL_WAIT.with(|w| w.set(self.0));
        }
    }
    let _reset = Reset(WILL_WAIT.with(|w| w.replace(true)));
    submit()
}

/// Whether the calling thread is inside [`submit_then_wait`]: what it submits now, it will
/// wait for next.
pub fn submitter_will_wait() -> bool {
    WILL_WAIT.with(|w| w.get())
}

/// What a device implements for one of its queues.
pub trait QueueImpl: Send + Sync + fmt::Debug + 'static {
    /// A name for traces and errors (`"cpu:0"`).
    fn name(&self) -> &str;
    /// The owning device.
    fn device_id(&self) -> DeviceId;
    /// See [`Queue::submit`].
    fn submit(
        &self,
        command_buffer: &CommandBuffer,
        waits: &[(Semaphore, u64)],
        signals: &[(Semaphore, u64)],
    ) -> Result<()>;
}

/// A device queue: where command buffers are submitted. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Queue(Arc<dyn QueueImpl>);

impl Queue {
    /// Wraps a device's queue implementation.
    pub fn from_impl(inner: Arc<dyn QueueImpl>) -> Queue {
        Queue(inner)
    }

    /// The queue's name (`"cpu:0"`), for errors and traces.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The device the queue belongs to.
    pub fn device_id(&self) -> DeviceId {
        self.0.device_id()
    }

    /// Submits `command_buffer` to run once every `(semaphore, value)` in `waits` is
    /// reached; when all its commands complete, each `(semaphore, value)` in `signals` is
    /// signalled.
    ///
    /// # Returns at once
    /// `submit` never blocks on device work, nor on the wait semaphores: it validates, enqueues
    /// and returns. The host learns of completion only by waiting on a signal semaphore.
    ///
    /// # Ordering
    /// Only semaphores order submissions. Submissions to the same queue with no semaphore
    /// between them may run concurrently and complete in any order; in particular a
    /// submission whose waits are not yet reached never holds up a later submission that
    /// does not depend on it.
    ///
    /// # Errors
    /// - Returned here (nothing enqueued, no semaphore touched): the command buffer was
    ///   recorded for another device, a binding's buffer is not usable by this device, the
    ///   device is lost.
    /// - Delivered through `signals`: if a wait semaphore fails, the commands do not run and
    ///   every signal semaphore fails with the same reason; if a command fails (a kernel
    ///   returns an error or panics), the rest of the command buffer is skipped and every
    ///   signal semaphore fails with a message naming the command and the cause. If a signal
    ///   would not advance its semaphore, that semaphore is failed. If the device is dropped
    ///   before the work runs, the signals fail with a device-lost reason.
    ///
    /// # Thread safety
    /// May be called from any thread, concurrently.
    pub fn submit(
        &self,
        command_buffer: &CommandBuffer,
        waits: &[(Semaphore, u64)],
        signals: &[(Semaphore, u64)],
    ) -> Result<()> {
        self.0.submit(command_buffer, waits, signals)
    }
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
