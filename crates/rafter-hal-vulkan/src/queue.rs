//! Queues, the scheduler that hands submissions to `vkQueueSubmit2`, and the monitor thread.
//!
//! # The submission model
//!
//! [`Queue::submit`](rafter_hal::Queue::submit) never blocks. A submission goes to the GPU
//! (`vkQueueSubmit2`, with its waits and signals as timeline-semaphore operations) as soon
//! as every wait is *resolvable*: the value is already reached, or a batch that signals it
//! has already been submitted. GPU work therefore waits on GPU work directly, with no host
//! round trip: a chain of submissions across queues is handed to the driver at once.
//!
//! A wait that nothing submitted will signal yet (a value the host will signal later, a
//! semaphore of another device) keeps the submission host-side, *deferred*, until the value
//! becomes resolvable; then it is submitted by whichever thread made it so (the host
//! thread's `signal`, the thread that signalled another device's semaphore, or the
//! monitor). Vulkan would accept
//! such a wait-before-signal at once, but two things forbid relying on it here:
//! - drivers process one `VkQueue`'s batches in order, so a batch waiting for a host signal
//!   stalls every later batch on that queue, independent ones included, which the HAL's
//!   ordering rule forbids (only semaphores order submissions);
//! - a batch, once submitted, cannot be withdrawn: if its wait semaphore *fails*, the HAL
//!   says its commands must not run, and a deferred batch simply never is submitted.
//!
//! Failure travels host-side: a failed wait fails a deferred submission's signal semaphores
//! without running it; for submitted work, a callback on each wait semaphore fails the
//! signals as soon as the wait fails (the GPU work itself still runs; its outputs are
//! marked failed). Signals on other devices' semaphores are host-signalled by the monitor
//! when the batch completes. A `vkQueueSubmit2` error or device loss fails the signals too.
//!
//! # The monitor thread
//!
//! One per device. It sleeps in `vkWaitSemaphores` (any of: a wake semaphore the host
//! signals, every in-flight batch's completion semaphore, every semaphore with callbacks
//! registered) and on waking retires completed batches (reporting their trace spans,
//! signalling other devices' semaphores, and releasing what they hold once a later batch on
//! the same queue has completed: see `RELEASE_GRACE`), fires callbacks whose values the GPU
//! reached, submits deferred work that became ready, and fails everything when the device
//! is lost. Retiring comes before the callbacks so that a batch's trace spans are usually
//! in the sink by the time whoever waits for it wakes (`rafter run --trace` reads them
//! right after its one call); a batch that completes between the two steps is reported on
//! the next pass. It is
//! the only thread that waits in the driver: host waits sleep on a condition variable its
//! callbacks wake.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use ash::vk;
use rafter_hal::{
    CommandBuffer, DeviceId, HalError, QueueImpl, Semaphore, SemaphoreError, TraceEvent, TraceSink,
};

use crate::breadcrumbs::SubmissionCrumbs;
use crate::command::{prepare, record, Prepared, Timing};
use crate::device::{create_timeline, Shared};
use crate::error::call_error;
use crate::semaphore::{SemInner, SemState};
use crate::stall_probe::StallProbe;

mod watchdog;
pub use watchdog::WATCHDOG_ENV;

/// How long the monitor sleeps at most before looking around again (a safety net: every
/// event that needs it also wakes it).
const MONITOR_TICK: Duration = Duration::from_millis(100);

/// The monitor's tick while it watches anything (in-flight batches, timepoints, deferred
/// signals, host waiters): short, because NVIDIA's driver (580, H100) was measured missing
/// semaphore wake-ups (a host wait often returned only at the end of its timeout although
/// the GPU had signalled long before: MobileNetV2 took 6.0 ms a call with 5 ms slices, 1.6 ms
/// with 200 µs ones, benchmarks/RESULTS.md), and every missed one stalls whatever waits on
/// the monitor (host waits, callbacks, deferred submissions, other devices) for a tick. The
/// monitor is the only thread that polls the driver: host waiters sleep on a condition
/// variable its callbacks wake (`SemInner::wait`).
const BUSY_TICK: Duration = Duration::from_micros(200);

/// When a completed batch's command buffer, buffers and semaphores may go. The driver's
/// queue thread may still touch a batch's objects after it signalled the batch's last
/// semaphore: lavapipe does (Mesa's common queue releases a submission's wait and signal
/// points after its signals), and destroying them at once crashed lavapipe's queue thread
/// within seconds under tests/stress.rs (SIGSEGV in libvulkan_lvp.so: 3 of 5 runs of one
/// seed, 3 of 6 runs of others). A batch is therefore released once a batch submitted
/// *later on the same queue* has completed (a queue processes its batches in order, so the
/// earlier one is behind it), or, on a queue that went idle, after this grace (a fixed
/// 2 ms grace alone still crashed 1 run in 6 on this loaded machine: time is no proof; the
/// grace only bounds how long an idle queue's last batch is held).
const RELEASE_GRACE: Duration = Duration::from_millis(20);

/// The scheduler's state, under `Shared::sched`.
#[derive(Default)]
pub(crate) struct SchedState {
    next_id: u64,
    /// Submissions whose waits are not all resolvable yet.
    pub(crate) deferred: Vec<Pending>,
    /// Submitted batches not yet known complete.
    pub(crate) in_flight: Vec<InFlight>,
    /// Completed batches whose handles are still held, with when they completed: released
    /// as [`RELEASE_GRACE`] says.
    pub(crate) retired: Vec<(Instant, InFlight)>,
    /// Counts `vkQueueSubmit2` calls: a batch's place in its queue's order.
    submit_seq: u64,
    /// Per queue, the largest `seq` of a completed batch.
    completed_seq: Vec<u64>,
    /// Completion semaphores free for reuse, with the last value each reached.
    pub(crate) completion_pool: Vec<(vk::Semaphore, u64)>,
}

/// A wait of a deferred submission.
enum Wait {
    /// A semaphore of this device: resolvable once reached or signalled by submitted work.
    Own { semaphore: Semaphore, value: u64 },
    /// Another device's (or a host) semaphore: resolvable once reached, learnt through a
    /// callback.
    Foreign(Arc<ForeignWait>),
}

struct ForeignWait {
    semaphore: Semaphore,
    value: u64,
    /// `None` until the callback fires: `Ok` reached, `Err` failed with the reason.
    outcome: Mutex<Option<Result<(), String>>>,
}

/// A submission not yet handed to the GPU.
pub(crate) struct Pending {
    id: u64,
    queue: usize,
    /// When `submit` queued it (for the watchdog's report).
    queued_at: Instant,
    command_buffer: CommandBuffer,
    prepared: Arc<Prepared>,
    /// With breadcrumbs on: this submission's start and end markers.
    crumbs: Option<SubmissionCrumbs>,
    waits: Vec<Wait>,
    signals: Vec<(Semaphore, u64)>,
}

/// A submitted batch. Holds everything the GPU may still touch (the command buffer with its
/// buffers and executables, the semaphores) until it completes.
pub(crate) struct InFlight {
    completion: (vk::Semaphore, u64),
    /// The queue it was submitted to, and its place in submission order.
    queue: usize,
    seq: u64,
    /// The queue's name, for trace events.
    queue_name: Arc<str>,
    /// When `vkQueueSubmit2` took it (for the watchdog's report).
    submitted_at: Instant,
    command_buffer: CommandBuffer,
    pub(crate) prepared: Arc<Prepared>,
    /// With breadcrumbs on: this submission's start and end markers.
    pub(crate) crumbs: Option<SubmissionCrumbs>,
    /// Its waits, held so the semaphores outlive the GPU's use of them.
    waits: Vec<(Semaphore, u64)>,
    signals: Vec<(Semaphore, u64)>,
    /// Signals the GPU cannot perform (other devices' semaphores): done at completion.
    foreign_signals: Vec<(Semaphore, u64)>,
}

impl InFlight {
    /// Its completion semaphore and the value it signals: back to the device's pool when
    /// the batch retires, or, for a batch a lost device never retired, when the device is
    /// dropped (the pool's semaphores are destroyed before the device).
    pub(crate) fn completion(&self) -> (vk::Semaphore, u64) {
        self.completion
    }

    /// The batch completed: report its GPU timestamps to the trace sink (first, so they are
    /// there by the time a host thread waiting on a signal below wakes), host-signal the
    /// semaphores the GPU could not.
    fn complete(&self, shared: &Shared) {
        if let (Some(sink), Some(timing)) = (&shared.trace, &self.prepared.timing) {
            report(shared, sink.as_ref(), timing, &self.queue_name);
        }
        for (semaphore, value) in &self.foreign_signals {
            match semaphore.signal(*value) {
                Ok(()) | Err(SemaphoreError::Failed(_)) => {}
                Err(error) => semaphore.fail(format!(
                    "a Vulkan submission could not signal its semaphore: {error}"
                )),
            }
        }
    }

    /// The batch will never be known complete (device lost or dropped).
    pub(crate) fn fail_foreign(&self, reason: &str) {
        for (semaphore, _) in &self.foreign_signals {
            semaphore.fail(reason);
        }
    }
}

enum Readiness {
    Ready,
    Blocked,
    Failed(String),
}

/// Whether `pending` is traced and its command buffer's previous submission has not retired
/// yet. A traced command buffer's timestamps live in its one query pool, which every
/// submission resets as it starts: submitted again before the monitor has read the previous
/// submission's timestamps, it overwrote them, and the earlier submission was reported with
/// the later one's spans (tests/device.rs,
/// `a_traced_command_buffer_submitted_again_reports_every_submission`, failed so on
/// lavapipe: two submissions' spans starting at the same instant). Such a submission waits,
/// host-side, for that retirement: traced calls of one recording run one at a time.
fn traced_and_in_flight(pending: &Pending, in_flight: &[InFlight]) -> bool {
    pending.prepared.timing.is_some()
        && in_flight
            .iter()
            .any(|flight| Arc::ptr_eq(&flight.prepared, &pending.prepared))
}

/// This device's semaphore behind a handle, if it is one.
fn own<'a>(shared: &Shared, semaphore: &'a Semaphore) -> Option<&'a SemInner> {
    semaphore
        .downcast_ref::<SemInner>()
        .filter(|s| std::ptr::eq(Arc::as_ptr(&s.shared), shared))
}

fn fail_all(signals: &[(Semaphore, u64)], reason: &str) {
    for (semaphore, _) in signals {
        semaphore.fail(reason);
    }
}

/// `(semaphore, value)` pairs: waits or signals of one submission.
type Timepoints = Vec<(Semaphore, u64)>;

/// What a scheduling pass must do once the scheduler lock is released.
#[derive(Default)]
struct Actions {
    /// Signal semaphores to fail, with the reason.
    fail: Vec<(Timepoints, String)>,
    /// Newly submitted batches: their own unreached waits, and the signals to fail if one
    /// of those waits fails.
    watch: Vec<(Timepoints, Timepoints)>,
    /// Submissions whose `vkQueueSubmit2` failed, by id.
    errors: Vec<(u64, HalError)>,
    submitted: bool,
}

impl Shared {
    fn readiness(&self, pending: &Pending, in_flight: &[InFlight]) -> Readiness {
        match self.waits_readiness(pending) {
            Readiness::Ready if traced_and_in_flight(pending, in_flight) => Readiness::Blocked,
            other => other,
        }
    }

    fn waits_readiness(&self, pending: &Pending) -> Readiness {
        let mut blocked = false;
        for wait in &pending.waits {
            match wait {
                Wait::Own { semaphore, value } => {
                    let inner = own(self, semaphore).expect("classified as own");
                    // The flag, not the state lock: a host signal of this semaphore holds
                    // the lock across the driver call (see `SemInner::failed`).
                    if inner.failed.load(Ordering::Acquire) {
                        if let Some(reason) = inner.lock().failure.clone() {
                            return Readiness::Failed(reason);
                        }
                    }
                    if *value <= inner.submitted_signal.load(Ordering::Acquire) {
                        continue;
                    }
                    match inner.counter() {
                        Ok(current) if current >= *value => {}
                        Ok(_) => blocked = true,
                        Err(reason) => return Readiness::Failed(reason),
                    }
                }
                Wait::Foreign(cell) => {
                    match &*cell.outcome.lock().unwrap_or_else(|e| e.into_inner()) {
                        None => blocked = true,
                        Some(Ok(())) => {}
                        Some(Err(reason)) => return Readiness::Failed(reason.clone()),
                    }
                }
            }
        }
        if blocked {
            Readiness::Blocked
        } else {
            Readiness::Ready
        }
    }

    /// Hands `pending` to the GPU. Called with the scheduler lock held (`state`).
    fn submit_now(&self, state: &mut SchedState, pending: Pending, actions: &mut Actions) {
        let stage = vk::PipelineStageFlags2::ALL_COMMANDS;
        let mut wait_infos = Vec::new();
        let mut watch_waits = Vec::new();
        for wait in &pending.waits {
            if let Wait::Own { semaphore, value } = wait {
                let inner = own(self, semaphore).expect("classified as own");
                let reached = inner.counter().is_ok_and(|c| c >= *value);
                if !reached {
                    wait_infos.push(
                        vk::SemaphoreSubmitInfo::default()
                            .semaphore(inner.raw)
                            .value(*value)
                            .stage_mask(stage),
                    );
                    watch_waits.push((semaphore.clone(), *value));
                }
            }
        }
        // Own signals: checked and made pending under their state locks, held across the
        // submit, so no host signal can slip in between (Vulkan forbids a host signal at or
        // above a pending device signal). Only this function takes several semaphore locks,
        // always under the scheduler lock, so they cannot deadlock.
        let mut signal_infos = Vec::new();
        let mut guards: Vec<(&SemInner, MutexGuard<'_, SemState>, u64)> = Vec::new();
        let mut foreign_signals = Vec::new();
        let mut not_monotonic = Vec::new();
        for (semaphore, value) in &pending.signals {
            let Some(inner) = own(self, semaphore) else {
                foreign_signals.push((semaphore.clone(), *value));
                continue;
            };
            if guards.iter().any(|(g, _, _)| std::ptr::eq(*g, inner)) {
                not_monotonic.push((
                    semaphore.clone(),
                    format!("semaphore signalled twice by one submission (value {value})"),
                ));
                continue;
            }
            let sem_state = inner.lock();
            if sem_state.failure.is_some() {
                continue; // failed for good: nothing to signal
            }
            let committed = inner
                .counter()
                .unwrap_or(0)
                .max(inner.submitted_signal.load(Ordering::Acquire))
                .max(sem_state.deferred_host_signal.unwrap_or(0));
            if *value <= committed {
                not_monotonic.push((
                    semaphore.clone(),
                    format!(
                        "a Vulkan submission's signal to {value} does not advance the timeline \
                     (already committed to {committed})"
                    ),
                ));
                continue;
            }
            signal_infos.push(
                vk::SemaphoreSubmitInfo::default()
                    .semaphore(inner.raw)
                    .value(*value)
                    .stage_mask(stage),
            );
            guards.push((inner, sem_state, *value));
        }
        let completion = match state.completion_pool.pop() {
            Some((semaphore, last)) => Ok((semaphore, last + 1)),
            None => create_timeline(&self.device, 0).map(|s| (s, 1)),
        };
        let completion = match completion {
            Ok(c) => c,
            Err(result) => {
                drop(guards);
                self.check_lost("vkCreateSemaphore", result);
                let error = call_error("vkCreateSemaphore", result, 0);
                actions.fail.push((
                    pending.signals.clone(),
                    format!("submission failed: {error}"),
                ));
                actions.errors.push((pending.id, error));
                return;
            }
        };
        let completion_info = [vk::SemaphoreSubmitInfo::default()
            .semaphore(completion.0)
            .value(completion.1)
            .stage_mask(stage)];
        let main = vk::CommandBufferSubmitInfo::default().command_buffer(pending.prepared.raw);
        let mut buffers = match &pending.crumbs {
            // Breadcrumbs: the submission's own start and end markers around its commands.
            Some(c) => vec![
                vk::CommandBufferSubmitInfo::default().command_buffer(c.before),
                main,
                vk::CommandBufferSubmitInfo::default().command_buffer(c.after),
            ],
            None => vec![main],
        };
        let tail = [vk::CommandBufferSubmitInfo::default()
            .command_buffer(self.tail.command_buffer(pending.queue))];
        let early_signal = self.stall_probe == StallProbe::EarlySignal;
        if !early_signal {
            signal_infos.push(completion_info[0]);
            if self.stall_probe != StallProbe::NoTail {
                buffers.push(tail[0]);
            }
        }
        let mut submits = vec![vk::SubmitInfo2::default()
            .wait_semaphore_infos(&wait_infos)
            .command_buffer_infos(&buffers)
            .signal_semaphore_infos(&signal_infos)];
        if early_signal {
            // The tail's first barrier orders it (and so the completion signal) after
            // every command of the first batch.
            submits.push(
                vk::SubmitInfo2::default()
                    .command_buffer_infos(&tail)
                    .signal_semaphore_infos(&completion_info),
            );
        }
        let signal = self.signal_guard();
        // SAFETY: the queue is externally synchronised by the scheduler lock we hold; the
        // command buffer was recorded with SIMULTANEOUS_USE (or, in breadcrumbs' rerecord
        // mode, for this submission alone, as were the breadcrumb command buffers) and
        // stays alive in `InFlight`;
        // every wait is either reached or signalled by an already submitted batch; every
        // signal value exceeds the counter and all pending signals (checked above under the
        // semaphore's lock, still held); the arrays live across the call.
        let result = unsafe {
            self.device
                .queue_submit2(self.queues[pending.queue], &submits, vk::Fence::null())
        };
        drop(signal);
        if let Err(result) = result {
            drop(guards);
            // The completion value was never signalled; return the semaphore unchanged.
            state.completion_pool.push((completion.0, completion.1 - 1));
            self.check_lost("vkQueueSubmit2", result);
            let error = call_error("vkQueueSubmit2", result, 0);
            actions.fail.push((
                pending.signals.clone(),
                format!("submission failed: {error}"),
            ));
            actions.errors.push((pending.id, error));
            return;
        }
        for (inner, sem_state, value) in guards {
            inner.submitted_signal.fetch_max(value, Ordering::AcqRel);
            drop(sem_state);
        }
        for (semaphore, reason) in not_monotonic {
            actions.fail.push((vec![(semaphore, 0)], reason));
        }
        if !watch_waits.is_empty() {
            actions.watch.push((watch_waits, pending.signals.clone()));
        }
        actions.submitted = true;
        let waits = pending
            .waits
            .iter()
            .map(|w| match w {
                Wait::Own { semaphore, value } => (semaphore.clone(), *value),
                Wait::Foreign(cell) => (cell.semaphore.clone(), cell.value),
            })
            .collect();
        state.submit_seq += 1;
        let seq = state.submit_seq;
        state.in_flight.push(InFlight {
            completion,
            queue: pending.queue,
            seq,
            queue_name: Arc::from(format!("{}:{}", self.name, pending.queue)),
            submitted_at: Instant::now(),
            command_buffer: pending.command_buffer,
            prepared: pending.prepared,
            crumbs: pending.crumbs,
            waits,
            signals: pending.signals,
            foreign_signals,
        });
    }

    /// Submits every deferred submission that became ready (repeatedly: a submission's
    /// signals may make others ready) and fails those whose waits failed. Callbacks and
    /// semaphore failures run after the scheduler lock is released. Returns the submissions
    /// whose `vkQueueSubmit2` failed.
    pub(crate) fn schedule(&self) -> Vec<(u64, HalError)> {
        let mut actions = Actions::default();
        {
            let mut state = self.lock_sched();
            let stop = if let Some(reason) = self.lost_reason() {
                Some(reason)
            } else if self.shutdown.load(Ordering::Acquire) {
                Some(format!(
                    "device lost: Vulkan device '{}' ({}) was dropped before the work could run",
                    self.name, self.id
                ))
            } else {
                None
            };
            if let Some(reason) = stop {
                for pending in state.deferred.drain(..) {
                    actions.fail.push((pending.signals, reason.clone()));
                }
            }
            loop {
                let mut progressed = false;
                let mut i = 0;
                while i < state.deferred.len() {
                    match self.readiness(&state.deferred[i], &state.in_flight) {
                        Readiness::Blocked => i += 1,
                        Readiness::Failed(reason) => {
                            let pending = state.deferred.remove(i);
                            actions.fail.push((pending.signals, reason));
                        }
                        Readiness::Ready => {
                            let pending = state.deferred.remove(i);
                            self.submit_now(&mut state, pending, &mut actions);
                            progressed = true;
                        }
                    }
                }
                if !progressed {
                    break;
                }
            }
        }
        for (signals, reason) in &actions.fail {
            fail_all(signals, reason);
        }
        for (waits, signals) in actions.watch {
            let signals = Arc::new(signals);
            for (semaphore, value) in waits {
                let signals = signals.clone();
                semaphore.notify_at(
                    value,
                    Box::new(move |result| {
                        if let Err(error) = result {
                            let reason = match error {
                                SemaphoreError::Failed(reason) => reason,
                                other => other.to_string(),
                            };
                            fail_all(&signals, &reason);
                        }
                    }),
                );
            }
        }
        if actions.submitted {
            self.wake();
        }
        actions.errors
    }

    /// Retires completed batches. Returns whether any did.
    fn retire(&self) -> bool {
        let done: Vec<InFlight> = {
            let mut state = self.lock_sched();
            let mut done = Vec::new();
            let mut i = 0;
            while i < state.in_flight.len() {
                let (semaphore, value) = state.in_flight[i].completion;
                // SAFETY: a live completion semaphore of this device.
                let reached = unsafe { self.device.get_semaphore_counter_value(semaphore) };
                match reached {
                    Ok(current) if current >= value => {
                        let flight = state.in_flight.remove(i);
                        state.completion_pool.push(flight.completion);
                        done.push(flight);
                    }
                    Ok(_) => i += 1,
                    Err(result) => {
                        self.check_lost("vkGetSemaphoreCounterValue", result);
                        break;
                    }
                }
            }
            done
        };
        let any = !done.is_empty();
        for flight in &done {
            flight.complete(self);
        }
        let now = Instant::now();
        let released: Vec<(Instant, InFlight)> = {
            let mut state = self.lock_sched();
            for flight in &done {
                if state.completed_seq.len() <= flight.queue {
                    state.completed_seq.resize(flight.queue + 1, 0);
                }
                let seen = &mut state.completed_seq[flight.queue];
                *seen = (*seen).max(flight.seq);
            }
            state
                .retired
                .extend(done.into_iter().map(|flight| (now, flight)));
            let completed = std::mem::take(&mut state.completed_seq);
            let (old, young) =
                std::mem::take(&mut state.retired)
                    .into_iter()
                    .partition(|(at, flight)| {
                        flight.seq < completed[flight.queue]
                            || now.duration_since(*at) >= RELEASE_GRACE
                    });
            state.completed_seq = completed;
            state.retired = young;
            old
        };
        // Dropped outside the scheduler lock: a semaphore's drop may fire callbacks, which
        // may schedule.
        drop(released);
        any
    }

    /// Whether a batch that signals `semaphore` at a value its counter has reached is still
    /// in flight: complete on the GPU (its signal happened) but not yet retired, so its
    /// GPU spans are not reported yet ([`Shared::await_reported`]).
    pub(crate) fn reached_batch_in_flight(&self, semaphore: &SemInner) -> bool {
        let Ok(counter) = semaphore.counter() else {
            return false;
        };
        self.lock_sched().in_flight.iter().any(|flight| {
            flight.signals.iter().any(|(signalled, value)| {
                *value <= counter
                    && signalled
                        .downcast_ref::<SemInner>()
                        .is_some_and(|inner| std::ptr::eq(inner, semaphore))
            })
        })
    }

    /// Device lost: fail every semaphore of the device, every pending submission's signals
    /// and every in-flight batch's signals.
    fn fail_everything(&self, reason: &str) {
        let (deferred, flying): (Vec<Pending>, Vec<Vec<(Semaphore, u64)>>) = {
            let mut state = self.lock_sched();
            (
                state.deferred.drain(..).collect(),
                state.in_flight.iter().map(|f| f.signals.clone()).collect(),
            )
        };
        for pending in deferred {
            fail_all(&pending.signals, reason);
        }
        for signals in flying {
            fail_all(&signals, reason);
        }
        for semaphore in self.live_semaphores() {
            rafter_hal::SemaphoreImpl::fail(&*semaphore, reason.to_string());
        }
    }
}

/// One trace event per timed command of a completed submission. The GPU's clock is not the
/// host's: where the device clock can be read on the host (`clock.rs`), the first span's
/// start is placed by it; otherwise the last command is taken to end now (the monitor
/// retires batches promptly, but its wake-up then counts as GPU time) and the others are
/// placed by their GPU times before it.
fn report(shared: &Shared, sink: &dyn TraceSink, timing: &Timing, queue: &Arc<str>) {
    let Some((first, times)) = timing.read(shared) else {
        return;
    };
    let now = Instant::now();
    let last = times.iter().map(|&(_, end)| end).max().unwrap_or(0);
    // When the first span started, on the host's clock.
    let origin = shared
        .clock
        .as_ref()
        .and_then(|clock| clock.calibration())
        .and_then(|(ticks, at)| {
            let bits = shared.caps.timestamp_valid_bits;
            let mask = if bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            let period = shared.caps.timestamp_period_ps as f64 / 1000.0;
            // The calibration may be older or newer than the span: the shorter way round
            // the counter's wrap says which.
            let ahead = (first & mask).wrapping_sub(ticks & mask) & mask;
            if ahead <= mask / 2 {
                at.checked_add(Duration::from_nanos((ahead as f64 * period) as u64))
            } else {
                let behind = (ticks & mask).wrapping_sub(first & mask) & mask;
                at.checked_sub(Duration::from_nanos((behind as f64 * period) as u64))
            }
        })
        .unwrap_or_else(|| now - Duration::from_nanos(last));
    let at = |ns: u64| origin + Duration::from_nanos(ns);
    let thread: Arc<str> = Arc::from("gpu");
    for (span, &(start, end)) in timing.spans.iter().zip(&times) {
        sink.record(TraceEvent {
            queue: queue.clone(),
            kind: span.kind,
            executable: span.executable.clone(),
            name: span.name.clone(),
            start: at(start),
            end: at(end.max(start)),
            thread: thread.clone(),
            workgroups: span.workgroups,
            failed: false,
        });
    }
}

/// The monitor thread's body (see the module docs).
pub(crate) fn run_monitor(shared: Arc<Shared>) {
    let mut lost_handled = false;
    let watchdog = watchdog::threshold();
    let mut reported = false;
    loop {
        if let (Some(limit), false) = (watchdog, reported) {
            if shared.oldest_work().is_some_and(|age| age >= limit) {
                eprintln!(
                    "{WATCHDOG_ENV}: work older than {limit:?}\n{}",
                    shared.describe()
                );
                reported = true;
            }
        }
        // SAFETY: the wake semaphore lives as long as `shared`.
        let wake_seen = unsafe {
            shared
                .device
                .get_semaphore_counter_value(shared.wake_semaphore)
        }
        .unwrap_or(0);
        if let Some(reason) = shared.lost_reason() {
            if !lost_handled {
                shared.fail_everything(&reason);
                lost_handled = true;
            }
        }
        shared.schedule();
        if shared.retire() {
            // A traced submission held until its command buffer's previous submission
            // retired (`traced_and_in_flight`) can go now.
            shared.schedule();
        }
        shared.note_retire_pass();
        let mut waits: Vec<(vk::Semaphore, u64)> = vec![(shared.wake_semaphore, wake_seen + 1)];
        // Held until after the wait, so no semaphore waited on is destroyed meanwhile.
        let live = shared.live_semaphores();
        for semaphore in &live {
            if let Some(value) = semaphore.poll() {
                waits.push((semaphore.raw, value));
            }
        }
        let releasing = {
            let state = shared.lock_sched();
            if shared.shutdown.load(Ordering::Acquire)
                && state.deferred.is_empty()
                && (state.in_flight.is_empty() || lost_handled)
            {
                break;
            }
            waits.extend(state.in_flight.iter().map(|f| f.completion));
            !state.retired.is_empty()
        };
        // Only the wake semaphore: idle, sleep long; anything else: tick short.
        let tick = if waits.len() > 1 || releasing {
            BUSY_TICK
        } else {
            MONITOR_TICK
        };
        let (semaphores, values): (Vec<_>, Vec<_>) = waits.into_iter().unzip();
        let info = vk::SemaphoreWaitInfo::default()
            .flags(vk::SemaphoreWaitFlags::ANY)
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: every semaphore is a live timeline semaphore of this device: the wake
        // semaphore lives as long as `shared`, `live` holds the registry's, and completion
        // semaphores are destroyed only with `shared`. The arrays live across the call,
        // which is bounded by the tick.
        let result = unsafe { shared.device.wait_semaphores(&info, tick.as_nanos() as u64) };
        match result {
            Ok(()) | Err(vk::Result::TIMEOUT) => {}
            Err(result) => {
                shared.check_lost("vkWaitSemaphores", result);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        drop(live);
    }
    // The batches retired last still hold handles (to `shared` too): release them.
    std::thread::sleep(RELEASE_GRACE);
    let retired = std::mem::take(&mut shared.lock_sched().retired);
    drop(retired);
}

/// One queue of a [`VulkanDevice`](crate::VulkanDevice). See the module docs of this file
/// for how submissions reach the GPU.
pub struct VulkanQueue {
    shared: Arc<Shared>,
    index: usize,
    name: String,
}

impl VulkanQueue {
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> VulkanQueue {
        let name = format!("{}:{index}", shared.name);
        VulkanQueue {
            shared,
            index,
            name,
        }
    }
}

impl QueueImpl for VulkanQueue {
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
        let shared = &self.shared;
        if shared.closing.load(Ordering::Acquire) {
            return Err(HalError::DeviceLost(format!(
                "Vulkan device '{}' was dropped",
                shared.name
            )));
        }
        if let Some(reason) = shared.lost_reason() {
            return Err(HalError::DeviceLost(reason));
        }
        if command_buffer.device_id() != shared.id {
            return Err(HalError::WrongDevice {
                what: "command buffer".into(),
                owner: command_buffer.device_id(),
                device: shared.id,
            });
        }
        // Breadcrumbs' rerecord mode (and issue 28's rerecord probe): a fresh
        // `VkCommandBuffer` for every submission.
        let prepared = if shared.rerecords() {
            Arc::new(record(shared, command_buffer)?)
        } else {
            prepare(shared, command_buffer)?
        };
        let crumbs = SubmissionCrumbs::new(shared)?;
        let mut foreign = Vec::new();
        let classified = waits
            .iter()
            .map(|(semaphore, value)| {
                if own(shared, semaphore).is_some() {
                    Wait::Own {
                        semaphore: semaphore.clone(),
                        value: *value,
                    }
                } else {
                    let cell = Arc::new(ForeignWait {
                        semaphore: semaphore.clone(),
                        value: *value,
                        outcome: Mutex::new(None),
                    });
                    foreign.push((cell.clone(), *value));
                    Wait::Foreign(cell)
                }
            })
            .collect();
        let id = {
            let mut state = shared.lock_sched();
            if shared.closing.load(Ordering::Acquire) {
                return Err(HalError::DeviceLost(format!(
                    "Vulkan device '{}' was dropped",
                    shared.name
                )));
            }
            state.next_id += 1;
            let id = state.next_id;
            state.deferred.push(Pending {
                id,
                queue: self.index,
                queued_at: Instant::now(),
                command_buffer: command_buffer.clone(),
                prepared,
                crumbs,
                waits: classified,
                signals: signals.to_vec(),
            });
            id
        };
        for (cell, value) in foreign {
            let weak: Weak<Shared> = Arc::downgrade(shared);
            let target = cell.clone();
            cell.semaphore.notify_at(
                value,
                Box::new(move |result| {
                    let outcome = result.map_err(|e| match e {
                        SemaphoreError::Failed(reason) => reason,
                        other => other.to_string(),
                    });
                    *target.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
                    // Submitted here, on the signalling thread (the CPU worker that finished
                    // the work waited for): a `vkQueueSubmit2` is bounded work, and handing
                    // it to the monitor instead costs a monitor wake-up (the H100's traces
                    // showed ~77 µs between BERT-base's CPU mask and the GPU's next kernel,
                    // before and after this change, as far as their cross-device placement
                    // tells; its own effect on the call was not isolated: RESULTS.md).
                    // Callbacks run after the signaller's locks are released, so `schedule`
                    // may lock.
                    // Its submission errors reach the submissions' signal semaphores.
                    if let Some(shared) = weak.upgrade() {
                        shared.schedule();
                    }
                }),
            );
        }
        let errors = shared.schedule();
        match errors.into_iter().find(|(failed, _)| *failed == id) {
            Some((_, error)) => Err(error),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for VulkanQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanQueue")
            .field("name", &self.name)
            .finish()
    }
}
