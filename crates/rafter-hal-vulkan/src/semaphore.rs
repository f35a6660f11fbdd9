//! Timeline semaphores: a `VkSemaphore` of timeline type plus the HAL's failure state.
//!
//! Vulkan's timeline semaphore is the counter; what Vulkan lacks is the HAL's sticky
//! *failure*, and callbacks at a value ([`SemaphoreImpl::notify_at`]) for other devices'
//! queues. Both live host-side here: the failure under a mutex, the callbacks in a list the
//! device's monitor thread fires when the GPU reaches their values (a host signal fires them
//! itself).

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ash::vk;
use rafter_hal::{HalError, SemaphoreError, SemaphoreImpl, TimepointCallback};

use crate::device::{create_timeline, Shared};
use crate::error::call_error;

pub(crate) struct SemState {
    pub(crate) failure: Option<String>,
    /// The value when the semaphore failed (what `value()` reports afterwards).
    frozen: u64,
    pub(crate) timepoints: Vec<(u64, TimepointCallback)>,
    /// A host signal made while GPU signals were still pending, applied by the monitor once
    /// they have landed (Vulkan forbids a host signal above a pending device signal).
    pub(crate) deferred_host_signal: Option<u64>,
}

/// A timeline semaphore of one Vulkan device.
pub(crate) struct SemInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) raw: vk::Semaphore,
    pub(crate) state: Mutex<SemState>,
    /// The largest value a submitted (`vkQueueSubmit2` returned) batch will signal. Written
    /// only under the scheduler lock. A wait for `v <= submitted_signal` may be handed to the
    /// GPU: the signal is already queued, so the wait cannot stall the queue on the host.
    pub(crate) submitted_signal: AtomicU64,
    /// The last value read from the driver (what `value()` says once the device is lost).
    last_value: AtomicU64,
    /// Whether `state.failure` is set: read without the state lock by the scheduler's
    /// readiness checks. A host signal holds that lock across `vkSignalSemaphore`, which
    /// took 15-35 us on the H200's driver, and the monitor, woken by the signal itself,
    /// used to wait for the lock there before it could submit the work that waited for
    /// the value (the CPU -> GPU handoff's largest part in a probed trace:
    /// benchmarks/results/handoff-probe-2026-11-30/).
    pub(crate) failed: AtomicBool,
}

impl SemInner {
    pub(crate) fn new(shared: Arc<Shared>, initial: u64) -> Result<Arc<SemInner>, HalError> {
        let raw = create_timeline(&shared.device, initial)
            .map_err(|r| call_error("vkCreateSemaphore", r, 0))?;
        let inner = Arc::new(SemInner {
            shared: shared.clone(),
            raw,
            state: Mutex::new(SemState {
                failure: None,
                frozen: initial,
                timepoints: Vec::new(),
                deferred_host_signal: None,
            }),
            submitted_signal: AtomicU64::new(initial),
            last_value: AtomicU64::new(initial),
            failed: AtomicBool::new(false),
        });
        shared
            .semaphores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&inner));
        Ok(inner)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SemState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The driver's counter value, or the device-lost reason.
    pub(crate) fn counter(&self) -> Result<u64, String> {
        if let Some(reason) = self.shared.lost_reason() {
            return Err(reason);
        }
        // SAFETY: `raw` is a live timeline semaphore of this device.
        match unsafe { self.shared.device.get_semaphore_counter_value(self.raw) } {
            Ok(value) => {
                self.last_value.fetch_max(value, Ordering::Relaxed);
                Ok(value)
            }
            Err(result) => {
                self.shared.check_lost("vkGetSemaphoreCounterValue", result);
                Err(format!("vkGetSemaphoreCounterValue: {result}"))
            }
        }
    }

    /// Host-signals the `VkSemaphore` to `value` (the caller checked monotonicity).
    fn host_signal(&self, value: u64) -> Result<(), String> {
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.raw)
            .value(value);
        let signal = self.shared.signal_guard();
        // SAFETY: `raw` is a live timeline semaphore; the caller holds the state lock and
        // checked that `value` exceeds the counter and every pending device signal.
        let result = unsafe { self.shared.device.signal_semaphore(&info) };
        drop(signal);
        match result {
            Ok(()) => {
                self.last_value.fetch_max(value, Ordering::Relaxed);
                Ok(())
            }
            Err(result) => {
                self.shared.check_lost("vkSignalSemaphore", result);
                Err(format!("vkSignalSemaphore: {result}"))
            }
        }
    }

    /// Takes the timepoints reached at `value` out of `state`.
    pub(crate) fn take_ready(state: &mut SemState, value: u64) -> Vec<TimepointCallback> {
        let (ready, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut state.timepoints)
            .into_iter()
            .partition(|(at, _)| *at <= value);
        state.timepoints = pending;
        ready.into_iter().map(|(_, cb)| cb).collect()
    }

    /// Monitor duty: applies a deferred host signal whose pending device signals have
    /// landed, and fires the timepoints the counter has reached. Returns the smallest value
    /// still awaited (what the monitor should wait for), if any.
    pub(crate) fn poll(&self) -> Option<u64> {
        let mut state = self.lock();
        if state.failure.is_some() {
            return None;
        }
        if state.timepoints.is_empty() && state.deferred_host_signal.is_none() {
            return None;
        }
        let mut value = match self.counter() {
            Ok(v) => v,
            Err(_) => return None, // the lost-device path fails everything
        };
        let mut host_signalled = false;
        if let Some(target) = state.deferred_host_signal {
            if value >= self.submitted_signal.load(Ordering::Acquire) {
                state.deferred_host_signal = None;
                if target > value && self.host_signal(target).is_ok() {
                    value = target;
                    host_signalled = true;
                }
            }
        }
        let ready = SemInner::take_ready(&mut state, value);
        let behind = state
            .deferred_host_signal
            .map(|_| self.submitted_signal.load(Ordering::Acquire));
        let next = state
            .timepoints
            .iter()
            .map(|(at, _)| *at)
            .chain(behind)
            .min();
        drop(state);
        for callback in ready {
            callback(Ok(()));
        }
        if host_signalled {
            // Deferred submissions waiting for the value can go to the GPU now, as after a
            // direct host signal (`signal`). Without this they waited for the monitor's
            // next pass: up to `MONITOR_TICK` (100 ms) when nothing else was in flight.
            self.shared.schedule();
        }
        next
    }
}

/// How often a host waiter looks at the driver's counter itself, should the monitor's
/// callback not come (it always should: this only bounds the damage of a bug).
const RECHECK: Duration = Duration::from_millis(20);

/// Where the monitor's callback leaves the outcome of a host wait, and wakes the waiter.
#[derive(Default)]
struct HostWakeup {
    outcome: Mutex<Option<Result<(), String>>>,
    changed: Condvar,
}

impl HostWakeup {
    fn set(&self, outcome: Result<(), String>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.changed.notify_all();
    }

    /// The outcome, once set; `None` after `timeout` without one.
    fn wait(&self, timeout: Duration) -> Option<Result<(), String>> {
        let guard = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, timeout, |o| o.is_none())
            .unwrap_or_else(|e| e.into_inner());
        guard.clone()
    }
}

impl SemInner {
    /// A host wait's result if it is known without waiting: failed, or `value` reached.
    fn settled(&self, value: u64) -> Option<Result<(), SemaphoreError>> {
        if let Some(reason) = self.failure() {
            return Some(Err(SemaphoreError::Failed(reason)));
        }
        match self.counter() {
            Ok(current) if current >= value => Some(Ok(())),
            Ok(_) => None,
            Err(reason) => Some(Err(SemaphoreError::Failed(reason))),
        }
    }
}

/// How long a direct wait sleeps in the driver at a time before it looks for a failure or
/// a device loss again: what noticing one can cost a thread in `wait_direct` (the CPU
/// device's helper asks again every millisecond anyway, `HELP_WAIT_SLICE`).
const DIRECT_SLICE: Duration = Duration::from_millis(2);

impl SemInner {
    /// `wait_direct`'s wait: in `vkWaitSemaphores` on this thread, on this semaphore alone,
    /// in slices of [`DIRECT_SLICE`], each followed by a look at failure and loss.
    ///
    /// Why one semaphore, not this one or the device's wake semaphore (which failures and
    /// device loss signal) in one wait-any: Mesa's common Vulkan runtime, which lavapipe
    /// uses, can only spin on a wait for any of several timeline semaphores ("there's
    /// nothing better we can do than spin", `vk_sync.c`), and a single one it waits for on
    /// a condition variable. The spinning helper took a core from lavapipe's own threads
    /// for as long as the GPU work ran: on two loaded cores, traced split calls took a
    /// median 3.6-7.9 ms instead of 0.3 ms in some runs. (The monitor's own wait-any still
    /// spins on Mesa while work is in flight; the monitor must wake for any of them.)
    fn wait_in_driver(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        let start = Instant::now();
        loop {
            if let Some(done) = self.settled(value) {
                return done;
            }
            let waited = self.within(value, start, timeout)?;
            let slice = (timeout - waited).min(DIRECT_SLICE);
            let semaphores = [self.raw];
            let values = [value];
            let info = vk::SemaphoreWaitInfo::default()
                .semaphores(&semaphores)
                .values(&values);
            // SAFETY: `raw` is a live timeline semaphore of this device (`self` is
            // borrowed); the arrays outlive the call, which is bounded by `slice`.
            let result = unsafe {
                self.shared
                    .device
                    .wait_semaphores(&info, slice.as_nanos() as u64)
            };
            match result {
                Ok(()) | Err(vk::Result::TIMEOUT) => {}
                Err(result) => {
                    self.shared.check_lost("vkWaitSemaphores", result);
                    if let Some(reason) = self.shared.lost_reason() {
                        return Err(SemaphoreError::Failed(reason));
                    }
                    return Err(SemaphoreError::Failed(format!(
                        "vkWaitSemaphores: {result}"
                    )));
                }
            }
        }
    }
}

impl SemInner {
    /// The spin phase of [`SemaphoreImpl::wait_direct`]: polls the counter until `value`,
    /// a failure, `timeout` or the end of this wait's budget. `None` once the budget is
    /// spent (the caller sleeps instead); a timeout inside the budget is
    /// `Some(Err(Timeout))`, so the caller asks again and the spin resumes.
    fn spin(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        let budget = self.shared.spin_wait;
        if budget.is_zero() {
            return None;
        }
        let start = Instant::now();
        // The spin budget counts per wait, across the slices a waiter asks in: this
        // thread's last (semaphore, value) and since when. Per thread, so two threads
        // waiting for different values cannot restart each other's budget.
        let key = (self as *const SemInner as usize, value);
        let since = SPIN_SINCE.with(|cell| match cell.get() {
            Some((k, at)) if k == key => at,
            _ => {
                cell.set(Some((key, start)));
                start
            }
        });
        let end = since + budget;
        if start >= end {
            return None;
        }
        let until = end.min(start + timeout);
        let mut polls = 0u32;
        loop {
            // A failure is sticky and host-side; a loss `counter` reports.
            if self.failed.load(Ordering::Acquire) {
                return self.settled(value);
            }
            match self.counter() {
                Ok(current) if current >= value => return Some(Ok(())),
                Ok(_) => {}
                Err(reason) => return Some(Err(SemaphoreError::Failed(reason))),
            }
            let now = Instant::now();
            if now >= until {
                return (now < end).then(|| self.timed_out(value, now - start));
            }
            polls += 1;
            if polls % YIELD_EVERY == 0 {
                // Lets a thread that shares this core (a CPU worker of a pipelined call)
                // run; the poll resumes after it.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

thread_local! {
    /// See [`SemInner::spin`]: the (semaphore address, value) this thread last spun for.
    static SPIN_SINCE: std::cell::Cell<Option<((usize, u64), Instant)>> =
        const { std::cell::Cell::new(None) };
}

/// How many counter polls a spinning waiter makes between yields of its core.
const YIELD_EVERY: u32 = 32;

impl SemInner {
    /// How long a wait for `value` begun at `start` has waited, or its timeout error once
    /// that is `timeout` or more.
    fn within(
        &self,
        value: u64,
        start: Instant,
        timeout: Duration,
    ) -> Result<Duration, SemaphoreError> {
        let waited = start.elapsed();
        if waited >= timeout {
            return self.timed_out(value, waited);
        }
        Ok(waited)
    }

    /// The timeout error of a wait for `value` that `waited`.
    fn timed_out<T>(&self, value: u64, waited: Duration) -> Result<T, SemaphoreError> {
        Err(SemaphoreError::Timeout {
            value,
            current: self.value(),
            waited,
        })
    }

    /// [`SemaphoreImpl::wait`] up to the value being reached (spinning first where that
    /// pays), without the traced device's wait for the monitor's report.
    fn wait_reached(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        let start = Instant::now();
        if let Some(done) = self.settled(value) {
            return done;
        }
        // The waiting thread sleeps on a host condition variable that the monitor's
        // callback (or a host signal, or a failure) wakes; only the monitor asks the driver.
        // Each waiter used to poll `vkWaitSemaphores` in 200 µs slices itself: NVIDIA's
        // driver spins in short waits, so with `--threads 8` eight waiters and the monitor
        // kept nine cores busy, starving the CPU fallback and the driver's pipeline
        // compiles (issue 28: the H100's `conformance --threads 8` runs slowed from 8 s to
        // 56 s or past 60 s).
        // A value due from submitted GPU work is polled for first (`Shared::spin_wait`):
        // the end of a call on the GPU then reaches its waiter without the driver's
        // interrupt-driven wake-up. A host signal to come is not spun for, nor is a value
        // on a traced device, whose wait ends with the monitor's report anyway (`wait`).
        if self.shared.trace.is_none() && self.submitted_signal.load(Ordering::Acquire) >= value {
            match self.spin(value, timeout) {
                Some(Err(SemaphoreError::Timeout { .. })) | None => {}
                Some(done) => return done,
            }
        }
        let wakeup = Arc::new(HostWakeup::default());
        let notified = wakeup.clone();
        self.notify_at(
            value,
            Box::new(move |result| {
                notified.set(result.map_err(|e| match e {
                    SemaphoreError::Failed(reason) => reason,
                    other => other.to_string(),
                }))
            }),
        );
        loop {
            let waited = start.elapsed();
            let left = timeout.saturating_sub(waited);
            match wakeup.wait(left.min(RECHECK)) {
                Some(Ok(())) => return Ok(()),
                Some(Err(reason)) => return Err(SemaphoreError::Failed(reason)),
                None => {}
            }
            // A safety net for a callback that never comes: look at the driver's counter.
            if let Some(done) = self.settled(value) {
                return done;
            }
            self.within(value, start, timeout)?;
        }
    }
}

impl SemaphoreImpl for SemInner {
    fn value(&self) -> u64 {
        let state = self.lock();
        if state.failure.is_some() {
            return state.frozen;
        }
        drop(state);
        self.counter()
            .unwrap_or_else(|_| self.last_value.load(Ordering::Relaxed))
    }

    fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn signal(&self, value: u64) -> Result<(), SemaphoreError> {
        let mut state = self.lock();
        if let Some(reason) = &state.failure {
            return Err(SemaphoreError::Failed(reason.clone()));
        }
        let current = self.counter().map_err(SemaphoreError::Failed)?;
        let pending = self.submitted_signal.load(Ordering::Acquire);
        // The value the timeline is already committed to reach: the counter, device signals
        // already submitted, and a host signal waiting behind them.
        let committed = current
            .max(pending)
            .max(state.deferred_host_signal.unwrap_or(0));
        if value <= committed {
            return Err(SemaphoreError::NotMonotonic {
                current: committed,
                requested: value,
            });
        }
        if pending > current {
            // Device signals are in flight: Vulkan forbids a host signal above them, so
            // this one lands when they have (the monitor applies it).
            state.deferred_host_signal = Some(value);
            drop(state);
            self.shared.wake();
            return Ok(());
        }
        self.host_signal(value).map_err(SemaphoreError::Failed)?;
        let ready = SemInner::take_ready(&mut state, value);
        drop(state);
        for callback in ready {
            callback(Ok(()));
        }
        // Work deferred until this value was signalled can go to the GPU now.
        self.shared.schedule();
        Ok(())
    }

    fn fail(&self, reason: String) {
        let mut state = self.lock();
        if state.failure.is_some() {
            return;
        }
        state.frozen = self
            .counter()
            .unwrap_or_else(|_| self.last_value.load(Ordering::Relaxed));
        state.failure = Some(reason.clone());
        self.failed.store(true, Ordering::Release);
        state.deferred_host_signal = None;
        let callbacks = std::mem::take(&mut state.timepoints);
        drop(state);
        for (_, callback) in callbacks {
            callback(Err(SemaphoreError::Failed(reason.clone())));
        }
        // Deferred submissions waiting on this semaphore now fail: the monitor rescans.
        self.shared.wake();
    }

    fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        let reached = self.wait_reached(value, timeout);
        if reached.is_ok() && self.shared.trace.is_some() {
            // On a traced device the wait ends once the GPU spans of what it waited for
            // are reported: what reads a call's trace right after its wait (`rafter run
            // --trace`, the calibration's probes) finds them there, and none of them turns
            // up late in the next call's window. A waiter that saw the counter first (a
            // value already reached, or a spinning waiter) returned ahead of the monitor:
            // the H200's calibration then found no span of a probe, or rated probes at up
            // to 20x their time.
            self.shared.await_reported(self);
        }
        reached
    }

    /// With a submitted batch that signals `value` (else `None`), the calling thread waits
    /// for it itself, so the GPU's signal reaches it with no monitor hop: first it polls
    /// the counter for what is left of this wait's spin budget (`Shared::spin_wait`), then,
    /// with direct waits on (`Shared::direct_waits`), it sleeps in `vkWaitSemaphores`;
    /// with them off, a spent budget answers `None` and the monitor's callback starts the
    /// work. A failure or device loss (which the driver never signals) is noticed between
    /// slices of at most [`DIRECT_SLICE`], which also bound what a driver's missed wake-up
    /// can cost.
    fn wait_direct(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        if !self.shared.direct_waits && self.shared.spin_wait.is_zero() {
            return None;
        }
        if let Some(done) = self.settled(value) {
            return Some(done);
        }
        if self.submitted_signal.load(Ordering::Acquire) < value {
            return None;
        }
        if let Some(done) = self.spin(value, timeout) {
            return Some(done);
        }
        self.shared
            .direct_waits
            .then(|| self.wait_in_driver(value, timeout))
    }

    fn notify_at(&self, value: u64, callback: TimepointCallback) {
        let mut state = self.lock();
        let result = if let Some(reason) = &state.failure {
            Err(SemaphoreError::Failed(reason.clone()))
        } else {
            match self.counter() {
                Ok(current) if current >= value => Ok(()),
                Ok(_) => {
                    state.timepoints.push((value, callback));
                    drop(state);
                    // The monitor must add this semaphore to what it waits on.
                    self.shared.wake();
                    return;
                }
                Err(reason) => Err(SemaphoreError::Failed(reason)),
            }
        };
        drop(state);
        callback(result);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for SemInner {
    fn drop(&mut self) {
        self.fire_orphaned_timepoints();
        // SAFETY: the last handle is gone; submissions hold handles to their semaphores
        // until they complete, so no pending GPU operation refers to it.
        unsafe { self.shared.device.destroy_semaphore(self.raw, None) };
    }
}

impl SemInner {
    /// Fires the timepoints still registered when the last handle goes. The monitor holds
    /// semaphores weakly, so the last handle can go (a call's handle dropped right after a
    /// host wait saw the value) before the monitor has fired the callbacks of a value the
    /// GPU already reached; without this they were lost, and a runtime call's memory was
    /// never recycled. No signal can come any more: a value reached now is `Ok`, any other
    /// never will be.
    fn fire_orphaned_timepoints(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let callbacks = std::mem::take(&mut state.timepoints);
        if callbacks.is_empty() {
            return;
        }
        let failure = state.failure.clone();
        let reached = match failure {
            Some(reason) => Err(reason),
            None => self.counter(),
        };
        for (value, callback) in callbacks {
            callback(match &reached {
                Ok(current) if *current >= value => Ok(()),
                Ok(current) => Err(SemaphoreError::Failed(format!(
                    "the semaphore was dropped at value {current}, before reaching {value}"
                ))),
                Err(reason) => Err(SemaphoreError::Failed(reason.clone())),
            });
        }
    }
}

impl fmt::Debug for SemInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("VulkanSemaphore")
            .field("device", &self.shared.name)
            .field("failure", &state.failure)
            .field("timepoints", &state.timepoints.len())
            .field(
                "submitted_signal",
                &self.submitted_signal.load(Ordering::Relaxed),
            )
            .finish()
    }
}
