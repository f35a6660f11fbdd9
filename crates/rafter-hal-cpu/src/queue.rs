//! CPU queues: submissions that start when their waits are reached, and executions that
//! run on the pool.
//!
//! `submit` validates and resolves the command buffer on the caller's thread. A submission
//! whose waits are all reached starts right there (its first segment's jobs are pushed onto
//! the pool; no command runs on the caller). Any other is registered as [`Waiting`], with a
//! timepoint callback on each wait semaphore, and `submit` returns: the callback that finds
//! the last wait reached starts it on the signalling thread (a CPU worker, another device's
//! monitor), which only pushes jobs. There is no queue thread to wake in between: a
//! GPU-to-CPU handoff used to cost the monitor's wake-up, the queue thread's, then a
//! worker's. A host thread that then waits for the work can run the pool's jobs itself
//! (`Device::help`), so a CPU-only call needs no thread to be woken at all; while the pool
//! has nothing for it, it waits for a waiting submission's semaphore itself
//! ([`rafter_hal::Semaphore::wait_direct`]) and runs what that releases.
//! A submission whose waits are all reached becomes an [`Execution`]: its first barrier
//! segment is pushed onto the worker pool, and the worker that finishes a segment's last job
//! pushes the next one, or signals (or fails) the signal semaphores after the last. A
//! submission waiting on a semaphore holds up nothing else, and independent submissions
//! share the pool.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use rafter_hal::{
    Command, CommandBuffer, DeviceId, HalError, QueueImpl, Semaphore, SemaphoreError, TraceEvent,
    TraceKind, TraceSink,
};

use crate::executable::{CpuExecutable, CpuKernel, DispatchContext, ResolvedRange};
use crate::memory::{CpuBuffer, HostAllocation};
use crate::workers::{Job, Pool, Worker};

/// State shared by the device, its queues, and running executions.
pub(crate) struct DeviceShared {
    pub(crate) id: DeviceId,
    pub(crate) name: String,
    pub(crate) pool: Pool,
    pub(crate) workers: usize,
    /// Set when the device is dropped: nothing new starts, pending work fails.
    pub(crate) lost: AtomicBool,
    pub(crate) trace: Option<Arc<dyn TraceSink>>,
    /// Submissions waiting for their waits (see [`Waiting`]): the only strong handles to
    /// them. An entry leaves as it starts or fails (`Waiting::take`), and the device's drop
    /// empties it (`CpuQueue::close`).
    pub(crate) waiting: Mutex<Vec<Arc<Waiting>>>,
}

impl DeviceShared {
    pub(crate) fn lock_waiting(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Waiting>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The waits not yet known reached of every waiting submission, oldest first, for a
    /// helper to wait on.
    pub(crate) fn unreached_waits(&self) -> Vec<(Arc<Waiting>, usize, Semaphore, u64)> {
        let registry = self.lock_waiting();
        let mut out = Vec::new();
        for w in registry.iter() {
            let slot = w.lock_slot();
            let Some(pending) = slot.as_ref() else {
                continue;
            };
            for (i, reached) in w.reached.iter().enumerate() {
                if !reached.load(Ordering::Acquire) {
                    let (semaphore, value) = &pending.waits[i];
                    out.push((w.clone(), i, semaphore.clone(), *value));
                }
            }
        }
        out
    }

    fn lost_reason(&self) -> String {
        format!(
            "device lost: device '{}' ({}) was dropped before the work completed",
            self.name, self.id
        )
    }
}

/// A submission not yet started: some waits are not reached. Each wait has a timepoint
/// callback on its semaphore; the callback that finds every wait reached starts the
/// submission right there, on the signalling thread (starting only pushes jobs onto the
/// pool), and the first to see a failure fails its signals. A host thread lent to the
/// device (`Device::help`) may also wait for one of the waits itself
/// ([`Semaphore::wait_direct`]) and mark it reached first, so the work starts on that
/// thread with one wake-up (the signal's) instead of a device thread's and then a
/// worker's. Whoever takes the submission out of its slot starts or fails it: exactly once.
///
/// Who holds what, so that nothing outlives the submission's start: the device's registry
/// ([`DeviceShared::waiting`]) holds the entry strongly, and the entry holds its wait
/// semaphores (as the queue thread's table once did) only while it is pending; the
/// callbacks it leaves on those semaphores hold it weakly. A semaphore's callback list
/// holding the entry strongly made a cycle (semaphore -> callback -> entry -> semaphore)
/// wherever a callback never fires: a wait whose value never comes once another wait
/// failed, or a Vulkan semaphore whose last handle goes (its drop would fire the orphaned
/// callbacks, but the cycle kept it alive). And a finished entry kept in the registry until
/// the next registration kept its semaphores alive after the work was done: rafter-stress
/// saw a Vulkan semaphore alive after its rounds.
pub(crate) struct Waiting {
    queue: Arc<str>,
    shared: Arc<DeviceShared>,
    /// The submission and its waits; `None` once started or failed, which drops the
    /// entry's handles to the wait semaphores.
    slot: Mutex<Option<Pending>>,
    /// Per wait: whether it is known reached.
    reached: Vec<AtomicBool>,
    /// Waits not yet known reached.
    outstanding: AtomicUsize,
}

/// What a [`Waiting`] holds until it starts or fails.
struct Pending {
    submission: Submission,
    waits: Vec<(Semaphore, u64)>,
}

impl Waiting {
    fn lock_slot(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it has not started or failed yet.
    pub(crate) fn pending(&self) -> bool {
        self.lock_slot().is_some()
    }

    /// The submission, for the one caller that starts or fails it (`None` for the others),
    /// and the entry leaves the registry. The wait semaphores' handles are dropped here, by
    /// the caller that took them, outside every lock: dropping a semaphore's last handle may
    /// run its orphaned callbacks.
    fn take(&self) -> Option<Submission> {
        let Pending { submission, waits } = self.lock_slot().take()?;
        self.shared
            .lock_waiting()
            .retain(|w| !std::ptr::eq(Arc::as_ptr(w), self));
        drop(waits);
        Some(submission)
    }

    /// Wait `index` is reached: starts the submission on this thread if it was the last.
    pub(crate) fn mark_reached(&self, index: usize) {
        if self.reached[index].swap(true, Ordering::AcqRel) {
            return;
        }
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(submission) = self.take() {
                let (queue, shared) = (self.queue.clone(), self.shared.clone());
                // An empty submission completes as it starts, running its signals'
                // callbacks, which may start the next one here: a long chain of them would
                // nest that deep, so past a few levels the start goes to the pool.
                if START_DEPTH.with(Cell::get) < MAX_START_DEPTH {
                    START_DEPTH.with(|d| d.set(d.get() + 1));
                    Execution::start(queue, shared, submission);
                    START_DEPTH.with(|d| d.set(d.get() - 1));
                } else {
                    let pool_shared = shared.clone();
                    pool_shared.pool.push(vec![Box::new(move |_: &Worker| {
                        Execution::start(queue, shared, submission)
                    })]);
                }
            }
        }
    }

    /// A wait failed: the commands never run, the reason flows to the signals.
    pub(crate) fn fail(&self, reason: &str) {
        if let Some(submission) = self.take() {
            fail_all(&submission.signals, reason);
        }
    }
}

thread_local! {
    /// How many waiting submissions this thread is starting, nested (see `mark_reached`).
    static START_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Nesting past which a started submission's start is handed to the pool.
const MAX_START_DEPTH: usize = 8;

pub(crate) struct Submission {
    prepared: Arc<Prepared>,
    signals: Vec<(Semaphore, u64)>,
}

/// A CPU queue handle's implementation.
pub(crate) struct CpuQueue {
    name: Arc<str>,
    shared: Arc<DeviceShared>,
    /// False once the device is dropped: submissions are refused. Held while a waiting
    /// submission is registered, so `close` fails every one registered before it.
    open: Mutex<bool>,
}

impl CpuQueue {
    pub(crate) fn new(name: Arc<str>, shared: Arc<DeviceShared>) -> CpuQueue {
        CpuQueue {
            name,
            shared,
            open: Mutex::new(true),
        }
    }

    /// Stops accepting submissions and fails those still waiting (device dropped).
    pub(crate) fn close(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        *open = false;
        let waiting = std::mem::take(&mut *self.shared.lock_waiting());
        drop(open);
        let reason = self.shared.lost_reason();
        for entry in waiting {
            entry.fail(&reason);
        }
    }

    fn prepare(&self, command_buffer: &CommandBuffer) -> Result<Arc<Prepared>, HalError> {
        if let Some(prepared) = command_buffer.prepared().get() {
            if let Ok(prepared) = prepared.clone().downcast::<Prepared>() {
                return Ok(prepared);
            }
        }
        let prepared = Arc::new(Prepared::new(command_buffer, &self.shared)?);
        let _ = command_buffer.prepared().set(prepared.clone());
        Ok(prepared)
    }
}

impl QueueImpl for CpuQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn device_id(&self) -> DeviceId {
        self.shared.id
    }

    fn submit(
        &self,
        command_buffer: &CommandBuffer,
        waits: &[(Semaphore, u64)],
        signals: &[(Semaphore, u64)],
    ) -> Result<(), HalError> {
        if command_buffer.device_id() != self.shared.id {
            return Err(HalError::WrongDevice {
                what: "command buffer".into(),
                owner: command_buffer.device_id(),
                device: self.shared.id,
            });
        }
        let prepared = self.prepare(command_buffer)?;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(HalError::DeviceLost(format!(
                "queue '{}' is closed",
                self.name
            )));
        }
        let submission = Submission {
            prepared,
            signals: signals.to_vec(),
        };
        // Waits already reached (none, usually): start here. Starting only pushes the
        // first segment's jobs onto the pool, so `submit` still returns at once. (The
        // lock is not held while starting: completing an empty submission runs the signal
        // semaphores' callbacks. A device dropped meanwhile fails the execution as lost.)
        let reached = |(s, v): &(Semaphore, u64)| s.query().is_ok_and(|x| x >= *v);
        if waits.iter().all(reached) {
            drop(open);
            Execution::start(self.name.clone(), self.shared.clone(), submission);
            return Ok(());
        }
        let waiting = Arc::new(Waiting {
            queue: self.name.clone(),
            shared: self.shared.clone(),
            slot: Mutex::new(Some(Pending {
                submission,
                waits: waits.to_vec(),
            })),
            reached: waits.iter().map(|_| AtomicBool::new(false)).collect(),
            outstanding: AtomicUsize::new(waits.len()),
        });
        self.shared.lock_waiting().push(waiting.clone());
        drop(open);
        // Registered outside the lock: a callback may run at once, here (a wait reached
        // meanwhile), and start the submission. The callbacks hold the entry weakly (see
        // `Waiting`): one that comes after the submission started or failed finds it gone.
        let entry = Arc::downgrade(&waiting);
        drop(waiting);
        for (index, (semaphore, value)) in waits.iter().enumerate() {
            let entry: Weak<Waiting> = entry.clone();
            semaphore.notify_at(
                *value,
                Box::new(move |result| {
                    let Some(entry) = entry.upgrade() else {
                        return;
                    };
                    match result {
                        Ok(()) => entry.mark_reached(index),
                        Err(error) => entry.fail(&match error {
                            SemaphoreError::Failed(reason) => reason,
                            other => other.to_string(),
                        }),
                    }
                }),
            );
        }
        Ok(())
    }
}

impl std::fmt::Debug for CpuQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuQueue")
            .field("name", &self.name)
            .finish()
    }
}

/// A command buffer resolved for the CPU: buffers to host allocations, entries to kernels,
/// split into barrier segments. Cached in the command buffer, so done once.
pub(crate) struct Prepared {
    segments: Vec<Vec<PreparedCommand>>,
}

enum PreparedCommand {
    Dispatch(Arc<PreparedDispatch>),
    Copy {
        index: usize,
        src: ResolvedRange,
        dst: ResolvedRange,
    },
    Fill {
        index: usize,
        dst: ResolvedRange,
        pattern: Vec<u8>,
    },
}

struct PreparedDispatch {
    index: usize,
    executable: Arc<str>,
    entry: Arc<str>,
    kernel: CpuKernel,
    bindings: Vec<ResolvedRange>,
    params: Vec<u8>,
    workgroups: [u32; 3],
    total: u64,
}

impl Prepared {
    fn new(command_buffer: &CommandBuffer, shared: &DeviceShared) -> Result<Prepared, HalError> {
        // Another device's buffers that the host addresses directly (zero-copy
        // boundaries), wrapped once per buffer so every binding of one buffer shares one
        // allocation (and its borrow set, which the aliasing checks rely on).
        let mut foreign: Vec<(rafter_hal::Buffer, Arc<HostAllocation>)> = Vec::new();
        let mut resolve = |range: &rafter_hal::BufferRange,
                           what: String|
         -> Result<ResolvedRange, HalError> {
            // Recording validated the range against the buffer's size.
            range.validate(&what)?;
            let alloc = match range.buffer.downcast_ref::<CpuBuffer>() {
                Some(buffer) => buffer.alloc.clone(),
                None => match foreign.iter().find(|(b, _)| b.same_buffer(&range.buffer)) {
                    Some((_, alloc)) => alloc.clone(),
                    None => {
                        let alloc = HostAllocation::foreign(&range.buffer).ok_or_else(|| {
                            HalError::IncompatibleObject {
                                what: what.clone(),
                                device: shared.name.clone(),
                                reason: format!(
                                    "its buffer ({:?}) is neither CPU host memory nor mapped \
                                     persistently for the host",
                                    range.buffer
                                ),
                            }
                        })?;
                        let alloc = Arc::new(alloc);
                        foreign.push((range.buffer.clone(), alloc.clone()));
                        alloc
                    }
                },
            };
            Ok(ResolvedRange {
                alloc,
                offset: range.offset as usize,
                len: range.len as usize,
            })
        };
        let mut segments = vec![Vec::new()];
        for (index, command) in command_buffer.commands().iter().enumerate() {
            let prepared = match command {
                Command::Barrier => {
                    segments.push(Vec::new());
                    continue;
                }
                Command::Dispatch(dispatch) => {
                    let executable = dispatch
                        .executable
                        .downcast_ref::<CpuExecutable>()
                        .ok_or_else(|| HalError::IncompatibleObject {
                            what: format!("executable '{}'", dispatch.executable.name()),
                            device: shared.name.clone(),
                            reason: "it is not a CPU executable".into(),
                        })?;
                    let kernel = executable.kernels.get(dispatch.entry).ok_or_else(|| {
                        HalError::UnknownEntryPoint {
                            executable: dispatch.executable.name().to_string(),
                            entry: dispatch.entry,
                            count: executable.kernels.len(),
                        }
                    })?;
                    let bindings = dispatch
                        .bindings
                        .iter()
                        .enumerate()
                        .map(|(i, b)| resolve(b, format!("command {index}: binding {i}")))
                        .collect::<Result<Vec<_>, _>>()?;
                    PreparedCommand::Dispatch(Arc::new(PreparedDispatch {
                        index,
                        executable: executable.name_arc(),
                        entry: executable.entry_arcs[dispatch.entry].clone(),
                        kernel: kernel.clone(),
                        bindings,
                        params: dispatch.params.clone(),
                        workgroups: dispatch.workgroups,
                        total: dispatch.workgroup_total(),
                    }))
                }
                Command::Copy { src, dst } => PreparedCommand::Copy {
                    index,
                    src: resolve(src, format!("command {index}: copy source"))?,
                    dst: resolve(dst, format!("command {index}: copy destination"))?,
                },
                Command::Fill { dst, pattern } => PreparedCommand::Fill {
                    index,
                    dst: resolve(dst, format!("command {index}: fill destination"))?,
                    pattern: pattern.bytes(),
                },
            };
            segments.last_mut().expect("never empty").push(prepared);
        }
        segments.retain(|s| !s.is_empty());
        Ok(Prepared { segments })
    }
}

fn fail_all(signals: &[(Semaphore, u64)], reason: &str) {
    for (semaphore, _) in signals {
        semaphore.fail(reason);
    }
}

/// A submission whose waits are reached, running segment by segment on the pool.
struct Execution {
    queue: Arc<str>,
    shared: Arc<DeviceShared>,
    prepared: Arc<Prepared>,
    signals: Vec<(Semaphore, u64)>,
    /// Jobs of the current segment not yet finished.
    remaining: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

impl Execution {
    fn start(queue: Arc<str>, shared: Arc<DeviceShared>, submission: Submission) {
        let execution = Arc::new(Execution {
            queue,
            shared,
            prepared: submission.prepared,
            signals: submission.signals,
            remaining: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        execution.run_segment(0);
    }

    fn record_error(&self, message: String) {
        let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if error.is_none() {
            *error = Some(message);
        }
        self.failed.store(true, Ordering::Release);
    }

    /// Whether jobs should stop taking new work (a failure, or the device dropped).
    fn should_stop(&self) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return true;
        }
        if self.shared.lost.load(Ordering::Acquire) {
            self.record_error(self.shared.lost_reason());
            return true;
        }
        false
    }

    /// Pushes segment `index` (skipping empty ones), or completes.
    fn run_segment(self: &Arc<Self>, mut index: usize) {
        loop {
            // Completion first: work that finished before a drop is not reported lost.
            if index >= self.prepared.segments.len() || self.should_stop() {
                self.complete();
                return;
            }
            let jobs = self.jobs(index);
            if jobs.is_empty() {
                index += 1;
                continue;
            }
            self.remaining.store(jobs.len(), Ordering::Release);
            self.shared.pool.push(jobs);
            return;
        }
    }

    fn job_done(self: &Arc<Self>, segment: usize) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.run_segment(segment + 1);
        }
    }

    fn jobs(self: &Arc<Self>, segment: usize) -> Vec<Job> {
        let mut jobs: Vec<Job> = Vec::new();
        for command in &self.prepared.segments[segment] {
            match command {
                PreparedCommand::Dispatch(dispatch) => {
                    let tasks = dispatch.total.min(self.shared.workers as u64);
                    let next = Arc::new(AtomicU64::new(0));
                    for _ in 0..tasks {
                        let execution = self.clone();
                        let dispatch = dispatch.clone();
                        let next = next.clone();
                        jobs.push(Box::new(move |worker: &Worker| {
                            execution.run_dispatch(worker, &dispatch, &next);
                            execution.job_done(segment);
                        }));
                    }
                }
                PreparedCommand::Copy { index, src, dst } => {
                    let execution = self.clone();
                    let (index, src, dst) = (*index, src.clone(), dst.clone());
                    jobs.push(Box::new(move |worker: &Worker| {
                        execution.run_transfer(worker, TraceKind::Copy, index, || {
                            let from = src.alloc.borrow(src.offset, src.len, false);
                            let to = dst.alloc.borrow(dst.offset, dst.len, true);
                            match (from, to) {
                                (Ok(from), Ok(mut to)) => {
                                    to.bytes_mut().copy_from_slice(from.bytes());
                                    Ok(())
                                }
                                _ => Err("copy: source or destination is in use by a \
                                          conflicting access (aliasing rule)"
                                    .to_string()),
                            }
                        });
                        execution.job_done(segment);
                    }));
                }
                PreparedCommand::Fill {
                    index,
                    dst,
                    pattern,
                } => {
                    let execution = self.clone();
                    let (index, dst, pattern) = (*index, dst.clone(), pattern.clone());
                    jobs.push(Box::new(move |worker: &Worker| {
                        execution.run_transfer(worker, TraceKind::Fill, index, || {
                            let mut to =
                                dst.alloc.borrow(dst.offset, dst.len, true).map_err(|()| {
                                    "fill: destination is in use by a conflicting access \
                                 (aliasing rule)"
                                        .to_string()
                                })?;
                            for chunk in to.bytes_mut().chunks_exact_mut(pattern.len()) {
                                chunk.copy_from_slice(&pattern);
                            }
                            Ok(())
                        });
                        execution.job_done(segment);
                    }));
                }
            }
        }
        jobs
    }

    /// One pool task of a dispatch: takes workgroups from the shared counter until none are
    /// left, the execution fails, or the device is dropped.
    fn run_dispatch(&self, worker: &Worker, dispatch: &PreparedDispatch, next: &AtomicU64) {
        let start = Instant::now();
        let mut ran = 0u64;
        let mut failed = false;
        let [nx, ny, _] = dispatch.workgroups.map(u64::from);
        while !self.should_stop() {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= dispatch.total {
                break;
            }
            let id = [
                (i % nx) as u32,
                ((i / nx) % ny) as u32,
                (i / (nx * ny)) as u32,
            ];
            let context = DispatchContext {
                entry: &dispatch.entry,
                bindings: &dispatch.bindings,
                params: &dispatch.params,
                workgroup_id: id,
                workgroup_count: dispatch.workgroups,
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| (dispatch.kernel)(&context)));
            ran += 1;
            let message = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(message)) => message,
                Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
            };
            self.record_error(format!(
                "dispatch of '{}::{}' (command {}) failed in workgroup {:?}: {message}",
                dispatch.executable, dispatch.entry, dispatch.index, id
            ));
            failed = true;
            break;
        }
        if ran > 0 {
            self.trace(TraceEvent {
                queue: self.queue.clone(),
                kind: TraceKind::Dispatch,
                executable: dispatch.executable.clone(),
                name: dispatch.entry.clone(),
                start,
                end: Instant::now(),
                thread: worker.name.clone(),
                workgroups: ran,
                failed,
            });
        }
    }

    fn run_transfer(
        &self,
        worker: &Worker,
        kind: TraceKind,
        index: usize,
        body: impl FnOnce() -> Result<(), String>,
    ) {
        if self.should_stop() {
            return;
        }
        let start = Instant::now();
        let result = body();
        let failed = result.is_err();
        if let Err(message) = result {
            self.record_error(format!("command {index}: {message}"));
        }
        self.trace(TraceEvent {
            queue: self.queue.clone(),
            kind,
            executable: "".into(),
            name: if kind == TraceKind::Copy {
                "copy"
            } else {
                "fill"
            }
            .into(),
            start,
            end: Instant::now(),
            thread: worker.name.clone(),
            workgroups: 1,
            failed,
        });
    }

    fn trace(&self, event: TraceEvent) {
        if let Some(sink) = &self.shared.trace {
            sink.record(event);
        }
    }

    /// Signals or fails every signal semaphore.
    fn complete(&self) {
        let error = self.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match error {
            Some(reason) => fail_all(&self.signals, &reason),
            None => {
                for (semaphore, value) in &self.signals {
                    match semaphore.signal(*value) {
                        Ok(()) | Err(SemaphoreError::Failed(_)) => {}
                        Err(error) => semaphore.fail(format!(
                            "queue '{}' could not signal its semaphore: {error}",
                            self.queue
                        )),
                    }
                }
            }
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
