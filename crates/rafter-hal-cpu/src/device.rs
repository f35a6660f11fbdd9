//! The CPU device.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rafter_hal::{
    Buffer, Capabilities, Device, DeviceId, DeviceInfo, DeviceKind, Executable, ExecutableSpec,
    HalError, Limits, MemoryKind, MemoryKindInfo, Queue, Semaphore, SemaphoreError, TraceSink,
    FORMAT_CPU_KERNELS,
};

use crate::executable::{CpuExecutable, CpuKernels};
use crate::memory::{CpuBuffer, HostAllocation, ALIGNMENT};
use crate::queue::{CpuQueue, DeviceShared};
use crate::workers::{Pool, Worker};

/// How to build a [`CpuDevice`].
#[derive(Clone)]
pub struct CpuDeviceOptions {
    /// Worker threads that run commands; 0 means one per available core.
    pub worker_threads: usize,
    /// Number of queues (each has its own queue thread; all share the workers). At least 1.
    pub queue_count: usize,
    /// The device's name in [`DeviceInfo`], errors and thread names.
    pub name: String,
    /// Most bytes allocated at once, if limited.
    pub memory_limit: Option<u64>,
    /// Where dispatch, copy and fill spans are reported, if anywhere.
    pub trace_sink: Option<Arc<dyn TraceSink>>,
}

impl Default for CpuDeviceOptions {
    fn default() -> Self {
        CpuDeviceOptions {
            worker_threads: 0,
            queue_count: 1,
            name: "cpu".into(),
            memory_limit: None,
            trace_sink: None,
        }
    }
}

impl fmt::Debug for CpuDeviceOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuDeviceOptions")
            .field("worker_threads", &self.worker_threads)
            .field("queue_count", &self.queue_count)
            .field("name", &self.name)
            .field("memory_limit", &self.memory_limit)
            .field("trace_sink", &self.trace_sink.is_some())
            .finish()
    }
}

/// How long a helping host thread waits for another device's semaphore at a time before it
/// asks its `done` again (see `Device::help`): bounds how late it notices that its call
/// finished while it waited for work of another call.
pub const HELP_WAIT_SLICE: Duration = Duration::from_millis(1);

/// The CPU device: host memory, a pool of worker threads, and queues whose waiting
/// submissions start from their semaphores' callbacks.
///
/// - **Memory**: every [`MemoryKind`] is host memory, 64-byte aligned and zeroed, and
///   host-visible (so `HostVisibleShared` is zero-copy with the host and with any device that
///   can import host memory).
/// - **Executables**: format [`FORMAT_CPU_KERNELS`], made from [`CpuKernels`].
/// - **Queues**: see [`Queue::submit`]; submissions run as soon as their waits are reached,
///   concurrently with each other. Within a command buffer, commands between barriers run
///   concurrently, and a dispatch's workgroups are spread over the workers.
/// - **Drop**: closes the queues (pending submissions' signals fail with a device-lost
///   reason), lets running kernels finish (a kernel that never returns therefore blocks the
///   drop: kernels must terminate), skips work not yet started (failing its signals), and joins
///   every thread. Do not drop the device from inside one of its own kernels.
pub struct CpuDevice {
    info: DeviceInfo,
    shared: Arc<DeviceShared>,
    queues: Vec<Arc<CpuQueue>>,
    worker_threads: Mutex<Vec<JoinHandle<()>>>,
    allocated: Arc<AtomicU64>,
    /// The name a host thread lent by [`Device::help`] runs jobs under.
    host_worker: Arc<str>,
}

impl CpuDevice {
    /// Starts the device's threads.
    pub fn new(options: CpuDeviceOptions) -> Result<CpuDevice, HalError> {
        let workers = match options.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let queue_count = options.queue_count.max(1);
        let id = DeviceId::fresh();
        let info = cpu_info(id, &options);
        let shared = Arc::new(DeviceShared {
            id,
            name: options.name.clone(),
            pool: Pool::new(),
            workers,
            lost: AtomicBool::new(false),
            trace: options.trace_sink.clone(),
            waiting: Mutex::new(Vec::new()),
        });
        let mut device = CpuDevice {
            info,
            shared: shared.clone(),
            queues: Vec::new(),
            worker_threads: Mutex::new(Vec::new()),
            allocated: Arc::new(AtomicU64::new(0)),
            host_worker: format!("rafter-{}{}-host", options.name, id).into(),
        };
        let spawn_error =
            |e: std::io::Error| HalError::Unsupported(format!("spawning a thread: {e}"));
        // On an error below, dropping `device` stops the threads already started.
        for i in 0..workers {
            let name: Arc<str> = format!("rafter-{}{}-worker-{i}", options.name, id).into();
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || shared.pool.run_worker(Worker { name }))
                .map_err(spawn_error)?;
            device
                .worker_threads
                .get_mut()
                .expect("unshared")
                .push(handle);
        }
        for i in 0..queue_count {
            let name: Arc<str> = format!("{}:{i}", options.name).into();
            device
                .queues
                .push(Arc::new(CpuQueue::new(name, shared.clone())));
        }
        Ok(device)
    }

    /// Loads `kernels` as an executable called `name` (shorthand for
    /// [`Device::load_executable`] with [`CpuKernels::into_spec`]).
    pub fn load_kernels(&self, name: &str, kernels: CpuKernels) -> Result<Executable, HalError> {
        self.load_executable(&kernels.into_spec(name))
    }

    /// Number of worker threads.
    pub fn worker_threads(&self) -> usize {
        self.shared.workers
    }

    /// Bytes currently allocated by this device's live buffers.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }
}

fn cpu_info(id: DeviceId, options: &CpuDeviceOptions) -> DeviceInfo {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    DeviceInfo {
        id,
        name: options.name.clone(),
        kind: DeviceKind::Cpu,
        memory: MemoryKind::ALL
            .iter()
            .map(|&kind| MemoryKindInfo {
                kind,
                host_visible: true,
                host_coherent: true,
                capacity: options.memory_limit,
            })
            .collect(),
        limits: Limits {
            max_buffer_size: (isize::MAX as u64) & !(ALIGNMENT as u64 - 1),
            max_total_allocation: options.memory_limit,
            max_bindings: 256,
            max_push_constant_size: 4096,
            // x * y * z always fits in a u64.
            max_workgroup_count: [u32::MAX, 65535, 65535],
        },
        capabilities: Capabilities {
            dtypes: strings(&[
                "f32", "f64", "f16", "bf16", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64",
                "bool",
            ]),
            features: strings(&["host-memory"]),
            executable_formats: strings(&[FORMAT_CPU_KERNELS]),
            subgroup_size: None,
        },
        peak_flops: None,
        memory_bandwidth: None,
    }
}

impl Device for CpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, size: u64, kind: MemoryKind) -> Result<Buffer, HalError> {
        let max = self.info.limits.max_buffer_size;
        if size > max {
            return Err(HalError::BufferTooLarge { size, max });
        }
        let before = self.allocated.fetch_add(size, Ordering::Relaxed);
        if let Some(limit) = self.info.limits.max_total_allocation {
            if before.saturating_add(size) > limit {
                self.allocated.fetch_sub(size, Ordering::Relaxed);
                return Err(HalError::OutOfMemory {
                    size,
                    reason: format!(
                        "device '{}' has {before} of its {limit} bytes allocated",
                        self.info.name
                    ),
                });
            }
        }
        match HostAllocation::new(size as usize, self.allocated.clone()) {
            Ok(alloc) => Ok(Buffer::from_impl(Arc::new(CpuBuffer::new(
                alloc,
                kind,
                self.info.id,
            )))),
            Err(error) => {
                self.allocated.fetch_sub(size, Ordering::Relaxed);
                Err(error)
            }
        }
    }

    fn create_semaphore(&self, initial: u64) -> Result<Semaphore, HalError> {
        Ok(Semaphore::host(initial))
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
        let executable = CpuExecutable::load(spec, self.info.id, &self.info.name)?;
        Ok(Executable::from_impl(Arc::new(executable)))
    }

    /// Runs queued jobs on the calling thread (see `Pool::help`); traces name it
    /// `<device>-host`. While the pool has none but a submission waits for another
    /// device's work already under way (a GPU kernel's result), the thread waits for that
    /// semaphore itself
    /// ([`Semaphore::wait_direct`](rafter_hal::Semaphore::wait_direct), in slices of at
    /// most [`HELP_WAIT_SLICE`] so `done` is asked again) and starts the submission when it
    /// is reached, running its first work here: the handoff then costs the one wake-up of
    /// this thread by the signal. The submission's timepoint callbacks still start it if
    /// they come first (exactly one of them does).
    fn help(&self, done: &dyn Fn() -> bool) {
        let worker = Worker {
            name: self.host_worker.clone(),
        };
        let shared = &self.shared;
        let idle = || {
            if done() || shared.lost.load(Ordering::Acquire) {
                return false;
            }
            // The first wait that can be waited on directly; the others (a host's signal
            // to come, a backend without direct waits) are left to their callbacks.
            for (waiting, index, semaphore, value) in shared.unreached_waits() {
                match semaphore.wait_direct(value, HELP_WAIT_SLICE) {
                    Some(Ok(())) => {
                        waiting.mark_reached(index);
                        return true;
                    }
                    // Not yet: ask `done` again.
                    Some(Err(SemaphoreError::Timeout { .. })) => return true,
                    // Failed: so does the submission (its callback would say the same).
                    Some(Err(error)) => {
                        waiting.fail(&match error {
                            SemaphoreError::Failed(reason) => reason,
                            other => other.to_string(),
                        });
                        return true;
                    }
                    None => {}
                }
            }
            false
        };
        shared.pool.help(&worker, done, &idle);
    }

    /// Workers, loss, bytes allocated, jobs queued on the pool and submissions waiting on
    /// semaphores.
    fn describe(&self) -> String {
        let waiting = self
            .shared
            .lock_waiting()
            .iter()
            .filter(|w| w.pending())
            .count();
        format!(
            "cpu device '{}' ({}): {} workers, lost {}, {} bytes allocated, {} jobs queued, \
             {waiting} submissions waiting",
            self.info.name,
            self.info.id,
            self.shared.workers,
            self.shared.lost.load(Ordering::Acquire),
            self.allocated_bytes(),
            self.shared.pool.queued_jobs()
        )
    }
}

impl Drop for CpuDevice {
    fn drop(&mut self) {
        self.shared.lost.store(true, Ordering::Release);
        for queue in &self.queues {
            queue.close();
        }
        self.shared.pool.shutdown();
        for handle in self
            .worker_threads
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = handle.join();
        }
    }
}

impl fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuDevice")
            .field("id", &self.info.id)
            .field("name", &self.info.name)
            .field("workers", &self.shared.workers)
            .field("queues", &self.queues.len())
            .finish()
    }
}
