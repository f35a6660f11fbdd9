//! Timeline semaphores: the only synchronisation primitive of the HAL.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::SemaphoreError;

/// Called once when a semaphore reaches a value (`Ok`) or fails (`Err(Failed)`).
pub type TimepointCallback = Box<dyn FnOnce(Result<(), SemaphoreError>) + Send + 'static>;

/// What a semaphore backend implements. See [`Semaphore`] for the semantics every
/// implementation must honour.
///
/// # Thread safety
/// Every method may be called from any thread, concurrently.
pub trait SemaphoreImpl: Send + Sync + fmt::Debug + 'static {
    /// The current payload value. After a failure it stays at the last value reached.
    fn value(&self) -> u64;
    /// The failure reason, once failed.
    fn failure(&self) -> Option<String>;
    /// Advances the timeline to `value` from the host.
    fn signal(&self, value: u64) -> Result<(), SemaphoreError>;
    /// Fails the semaphore (the first reason wins; later calls do nothing).
    fn fail(&self, reason: String);
    /// Blocks the calling thread until `value` is reached, the semaphore fails, or `timeout`
    /// elapses.
    fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError>;
    /// [`wait`](Self::wait) for a thread that will start the work the value releases (a
    /// CPU device's helper waiting for a GPU kernel's result), where the backend can make
    /// the signal wake the calling thread itself, instead of waking a thread of the
    /// backend's that then wakes the caller (one wake-up instead of two: what a handoff
    /// between devices costs), and work that will signal `value` is already under way
    /// (so the wait ends without anyone else's help). `None`, without waiting, otherwise
    /// (the default); else what `wait` would return.
    fn wait_direct(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        let _ = (value, timeout);
        None
    }
    /// Registers `callback` to run exactly once: with `Ok(())` when the value reaches
    /// `value`, or with `Err(Failed)` when the semaphore fails. If either has already happened
    /// the callback runs immediately, on the calling thread. Otherwise it runs on the thread
    /// that signals or fails the semaphore, *after* the semaphore's internal lock is released.
    /// Callbacks must be short and must not block (send a message, push a job).
    fn notify_at(&self, value: u64, callback: TimepointCallback);
    /// For backends to recognise their own semaphores ([`Semaphore::downcast_ref`]).
    fn as_any(&self) -> &dyn Any;
}

/// A timeline semaphore: a `u64` counter that only grows, plus a failure state.
///
/// This is the only way work is ordered in the HAL. A queue submission waits until each of
/// its wait semaphores has reached its value and, when its work completes, signals each of
/// its signal semaphores to its value. The host does the same with [`Semaphore::wait`] and
/// [`Semaphore::signal`]. There is no implicit ordering between submissions, even on one
/// queue: two submissions with no semaphore between them may run in any order or at once.
///
/// # One type for every device
/// `Semaphore` is a handle to a [`SemaphoreImpl`], so each device backs it with its native
/// object: the CPU device uses [`HostSemaphore`] (a mutex and condition variable); a Vulkan
/// device wraps a timeline `VkSemaphore` (host signal = `vkSignalSemaphore`, host wait =
/// `vkWaitSemaphores`). A queue handed a semaphore it does not own waits on it through
/// [`SemaphoreImpl::notify_at`], so a CPU queue can wait for GPU work and a GPU queue for CPU
/// work, with no lockstep. Create semaphores through the device whose queues signal them most
/// ([`Device::create_semaphore`](crate::Device::create_semaphore)); [`Semaphore::host`] gives
/// a plain host semaphore.
///
/// # Semantics
/// - **Monotonic.** `signal(v)` requires `v > value()` (as Vulkan does); otherwise it returns
///   [`SemaphoreError::NotMonotonic`] and changes nothing. A timeline value is signalled by
///   exactly one producer (the host or one submission).
/// - **Reaching a value.** A wait for `v` is satisfied once `value() >= v`: signalling 5
///   releases waiters for 1..=5 at once.
/// - **Failure is sticky and propagates.** `fail(reason)` puts the semaphore in a failed state
///   for good: every current and future waiter (host waits, registered timepoints, queue
///   submissions) gets [`SemaphoreError::Failed`] with `reason`, even for values already
///   reached. A queue whose wait semaphore fails does not run its commands and fails its own
///   signal semaphores with the same reason, so one failed dispatch reaches the host and every
///   device downstream as an error, never as a hang. The first reason wins.
/// - **Memory ordering.** Everything the signaller did before `signal(v)` (host writes, the
///   completed work of a submission) happens-before everything a waiter does after its wait
///   for `v` returns `Ok`.
///
/// # Thread safety
/// `Semaphore` is `Clone + Send + Sync`; clones share the same timeline.
#[derive(Clone)]
pub struct Semaphore(Arc<dyn SemaphoreImpl>);

impl Semaphore {
    /// A host semaphore ([`HostSemaphore`]) starting at `initial`.
    pub fn host(initial: u64) -> Semaphore {
        Semaphore(Arc::new(HostSemaphore::new(initial)))
    }

    /// Wraps a backend's semaphore.
    pub fn from_impl(inner: Arc<dyn SemaphoreImpl>) -> Semaphore {
        Semaphore(inner)
    }

    /// The backend object, for devices to recognise their own semaphores.
    pub fn downcast_ref<T: SemaphoreImpl>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// Whether two handles refer to the same semaphore.
    pub fn same_semaphore(&self, other: &Semaphore) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }

    /// The current value (the last reached, even after a failure). Never blocks.
    pub fn value(&self) -> u64 {
        self.0.value()
    }

    /// The failure reason, if the semaphore has failed. Never blocks.
    pub fn failure(&self) -> Option<String> {
        self.0.failure()
    }

    /// `Ok(value)`, or `Err(Failed)` once failed. Never blocks.
    pub fn query(&self) -> Result<u64, SemaphoreError> {
        match self.0.failure() {
            Some(reason) => Err(SemaphoreError::Failed(reason)),
            None => Ok(self.0.value()),
        }
    }

    /// Advances the timeline to `value` from the host, releasing every waiter for a value
    /// `<= value`. Errors: [`SemaphoreError::NotMonotonic`] if `value <= self.value()`,
    /// [`SemaphoreError::Failed`] if the semaphore has failed.
    pub fn signal(&self, value: u64) -> Result<(), SemaphoreError> {
        self.0.signal(value)
    }

    /// Fails the semaphore with `reason`: every current and future waiter gets
    /// [`SemaphoreError::Failed`]. Does nothing if it has already failed (the first reason
    /// is kept).
    pub fn fail(&self, reason: impl Into<String>) {
        self.0.fail(reason.into())
    }

    /// Blocks until the semaphore reaches `value` (`Ok`), fails (`Failed`, even if `value`
    /// was reached), or `timeout` elapses (`Timeout`). `Duration::MAX` waits without limit;
    /// prefer a finite timeout so a lost signal is an error, not a hang.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        self.0.wait(value, timeout)
    }

    /// [`wait`](Self::wait) with the calling thread woken by the signal itself, for a
    /// thread that will run the work the value releases; `None` at once where the backend
    /// cannot, or nothing that will signal `value` is under way yet
    /// ([`SemaphoreImpl::wait_direct`]).
    pub fn wait_direct(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        self.0.wait_direct(value, timeout)
    }

    /// Waits for every `(semaphore, value)` pair, within one overall `timeout`.
    pub fn wait_all(pairs: &[(Semaphore, u64)], timeout: Duration) -> Result<(), SemaphoreError> {
        let start = Instant::now();
        for (semaphore, value) in pairs {
            let left = timeout.saturating_sub(start.elapsed());
            semaphore.wait(*value, left)?;
        }
        Ok(())
    }

    /// Registers a callback for when `value` is reached or the semaphore fails; see
    /// [`SemaphoreImpl::notify_at`] for where it runs. This is how queues wait without
    /// blocking a thread per wait.
    pub fn notify_at(&self, value: u64, callback: TimepointCallback) {
        self.0.notify_at(value, callback)
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The host implementation of a timeline semaphore: a `Mutex` around the value, failure and
/// pending timepoints, and a `Condvar` for blocking host waits. Used by the CPU device, and by
/// any device for semaphores only the host and CPU queues touch.
pub struct HostSemaphore {
    state: Mutex<HostState>,
    changed: Condvar,
}

struct HostState {
    value: u64,
    failure: Option<String>,
    timepoints: Vec<(u64, TimepointCallback)>,
}

impl HostSemaphore {
    /// A semaphore at `initial`, not failed.
    pub fn new(initial: u64) -> HostSemaphore {
        HostSemaphore {
            state: Mutex::new(HostState {
                value: initial,
                failure: None,
                timepoints: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HostState> {
        // Callbacks run outside the lock, so a poisoned lock can only come from a panic in
        // this file's own short critical sections; the state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SemaphoreImpl for HostSemaphore {
    fn value(&self) -> u64 {
        self.lock().value
    }

    fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn signal(&self, value: u64) -> Result<(), SemaphoreError> {
        let ready = {
            let mut state = self.lock();
            if let Some(reason) = &state.failure {
                return Err(SemaphoreError::Failed(reason.clone()));
            }
            if value <= state.value {
                return Err(SemaphoreError::NotMonotonic {
                    current: state.value,
                    requested: value,
                });
            }
            state.value = value;
            let (ready, pending) = std::mem::take(&mut state.timepoints)
                .into_iter()
                .partition(|(at, _)| *at <= value);
            state.timepoints = pending;
            ready
        };
        self.changed.notify_all();
        for (_, callback) in ready {
            callback(Ok(()));
        }
        Ok(())
    }

    fn fail(&self, reason: String) {
        let callbacks = {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            state.failure = Some(reason.clone());
            std::mem::take(&mut state.timepoints)
        };
        self.changed.notify_all();
        for (_, callback) in callbacks {
            callback(Err(SemaphoreError::Failed(reason.clone())));
        }
    }

    fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut state = self.lock();
        loop {
            if let Some(reason) = &state.failure {
                return Err(SemaphoreError::Failed(reason.clone()));
            }
            if state.value >= value {
                return Ok(());
            }
            match deadline {
                None => {
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(SemaphoreError::Timeout {
                            value,
                            current: state.value,
                            waited: now - start,
                        });
                    }
                    state = self
                        .changed
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    fn notify_at(&self, value: u64, callback: TimepointCallback) {
        let result = {
            let mut state = self.lock();
            if let Some(reason) = &state.failure {
                Err(SemaphoreError::Failed(reason.clone()))
            } else if state.value >= value {
                Ok(())
            } else {
                state.timepoints.push((value, callback));
                return;
            }
        };
        callback(result);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl fmt::Debug for HostSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("HostSemaphore")
            .field("value", &state.value)
            .field("failure", &state.failure)
            .field("timepoints", &state.timepoints.len())
            .finish()
    }
}
