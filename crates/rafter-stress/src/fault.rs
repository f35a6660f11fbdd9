//! Fault injection through the HAL: a [`Device`] wrapper whose next allocation or
//! submission fails the way a real device can.
//!
//! [`FaultyDevice`] forwards everything to the device it wraps (same identity, same
//! [`DeviceInfo`], so the wrapped device's loaders and command buffers work unchanged)
//! until a [`Fault`] is armed with [`FaultyDevice::arm`]. The armed fault fires once, on
//! the next operation of its kind:
//!
//! - [`Fault::Allocation`]: `allocate` returns [`HalError::OutOfMemory`] naming the device.
//! - [`Fault::Dispatch`]: the submission does not run; its signal semaphores fail with a
//!   reason naming the dispatch's device and queue, as a kernel that returned an error does.
//! - [`Fault::DeviceLost`]: as `Dispatch`, and from then on the device is lost: every
//!   allocation, submission and load returns [`HalError::DeviceLost`].
//! - [`Fault::NeverSignal`]: the submission is swallowed and its signals are never reached,
//!   so waiters time out; [`FaultyDevice::abandon_swallowed`] later fails them (as a driver
//!   reset would), releasing what the work held.
//!
//! Being a wrapper, it reaches every device the same way, the CPU's and Vulkan's: what is
//! injected is what the HAL contract says a device may do, not a device's internals.

use std::fmt;
use std::sync::{Arc, Mutex};

use rafter_hal::{
    Buffer, CommandBuffer, CommandBufferBuilder, Device, DeviceId, DeviceInfo, Executable,
    ExecutableSpec, HalError, MemoryKind, Queue, QueueImpl, Semaphore,
};

/// A failure to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Allocation,
    Dispatch,
    DeviceLost,
    NeverSignal,
}

#[derive(Default)]
struct FaultState {
    armed: Option<Fault>,
    lost: Option<String>,
    swallowed: Vec<(Semaphore, u64)>,
    fired: u64,
}

struct Shared {
    name: String,
    state: Mutex<FaultState>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lost(&self) -> Result<(), HalError> {
        match &self.lock().lost {
            Some(reason) => Err(HalError::DeviceLost(reason.clone())),
            None => Ok(()),
        }
    }

    /// Takes the armed fault if it is `kind` (or one of `kinds`).
    fn take(&self, kinds: &[Fault]) -> Option<Fault> {
        let mut state = self.lock();
        let fault = state.armed.filter(|f| kinds.contains(f))?;
        state.armed = None;
        state.fired += 1;
        Some(fault)
    }
}

/// A device that injects the armed [`Fault`] (see the module doc).
pub struct FaultyDevice {
    inner: Arc<dyn Device>,
    shared: Arc<Shared>,
}

impl FaultyDevice {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Device>) -> FaultyDevice {
        let name = inner.info().name.clone();
        FaultyDevice {
            inner,
            shared: Arc::new(Shared {
                name,
                state: Mutex::new(FaultState::default()),
            }),
        }
    }

    /// Arms `fault` for the next operation of its kind (replacing one armed before).
    pub fn arm(&self, fault: Fault) {
        self.shared.lock().armed = Some(fault);
    }

    /// Disarms the armed fault, if any.
    pub fn disarm(&self) {
        self.shared.lock().armed = None;
    }

    /// The fault armed and not yet fired.
    pub fn armed(&self) -> Option<Fault> {
        self.shared.lock().armed
    }

    /// How many faults have fired.
    pub fn fired(&self) -> u64 {
        self.shared.lock().fired
    }

    /// Fails every signal a [`Fault::NeverSignal`] swallowed, with `reason`; returns how
    /// many.
    pub fn abandon_swallowed(&self, reason: &str) -> usize {
        let swallowed = std::mem::take(&mut self.shared.lock().swallowed);
        for (semaphore, _) in &swallowed {
            semaphore.fail(format!(
                "device '{}': abandoned: {reason}",
                self.shared.name
            ));
        }
        swallowed.len()
    }
}

impl fmt::Debug for FaultyDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyDevice")
            .field("inner", &self.inner)
            .field("armed", &self.armed())
            .finish()
    }
}

impl Device for FaultyDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn allocate(&self, size: u64, kind: MemoryKind) -> Result<Buffer, HalError> {
        self.shared.lost()?;
        if self.shared.take(&[Fault::Allocation]).is_some() {
            return Err(HalError::OutOfMemory {
                size,
                reason: format!("device '{}': injected allocation failure", self.shared.name),
            });
        }
        self.inner.allocate(size, kind)
    }

    fn create_semaphore(&self, initial: u64) -> Result<Semaphore, HalError> {
        self.shared.lost()?;
        self.inner.create_semaphore(initial)
    }

    fn queue_count(&self) -> usize {
        self.inner.queue_count()
    }

    fn queue(&self, index: usize) -> Result<Queue, HalError> {
        let inner = self.inner.queue(index)?;
        Ok(Queue::from_impl(Arc::new(FaultyQueue {
            name: inner.name().to_string(),
            inner,
            shared: self.shared.clone(),
        })))
    }

    fn create_command_buffer(&self) -> Result<CommandBufferBuilder, HalError> {
        self.shared.lost()?;
        self.inner.create_command_buffer()
    }

    fn load_executable(&self, spec: &ExecutableSpec) -> Result<Executable, HalError> {
        self.shared.lost()?;
        self.inner.load_executable(spec)
    }

    fn help(&self, done: &dyn Fn() -> bool) {
        self.inner.help(done)
    }

    fn describe(&self) -> String {
        let state = self.shared.lock();
        format!(
            "faulty wrapper (armed {:?}, lost {:?}, {} swallowed signals, {} fired) over {}",
            state.armed,
            state.lost,
            state.swallowed.len(),
            state.fired,
            self.inner.describe()
        )
    }
}

/// A queue of a [`FaultyDevice`].
struct FaultyQueue {
    name: String,
    inner: Queue,
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultyQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyQueue({:?})", self.inner)
    }
}

impl QueueImpl for FaultyQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn device_id(&self) -> DeviceId {
        self.inner.device_id()
    }

    fn submit(
        &self,
        command_buffer: &CommandBuffer,
        waits: &[(Semaphore, u64)],
        signals: &[(Semaphore, u64)],
    ) -> Result<(), HalError> {
        self.shared.lost()?;
        let fault = self
            .shared
            .take(&[Fault::Dispatch, Fault::DeviceLost, Fault::NeverSignal]);
        let device = &self.shared.name;
        let queue = &self.name;
        let reason = match fault {
            None => return self.inner.submit(command_buffer, waits, signals),
            Some(Fault::NeverSignal) => {
                self.shared.lock().swallowed.extend_from_slice(signals);
                return Ok(());
            }
            Some(Fault::DeviceLost) => {
                let reason =
                    format!("device lost: device '{device}' was lost (injected) running a submission on queue '{queue}'");
                self.shared.lock().lost = Some(reason.clone());
                reason
            }
            Some(_) => format!(
                "dispatch failed on device '{device}', queue '{queue}': injected kernel failure"
            ),
        };
        for (semaphore, _) in signals {
            semaphore.fail(reason.clone());
        }
        Ok(())
    }
}
