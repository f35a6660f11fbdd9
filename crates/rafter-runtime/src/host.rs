//! Per-call state in host memory that host-device kernels reach through their call id.
//!
//! A buffer whose size depends on tensor values (`Storage::Dynamic`, or an output whose
//! dims the inputs do not decide) cannot be allocated before the call runs. It lives in a
//! per-call table of host tensors, the call's [`Slots`], indexed by program buffer: its
//! producer stores the tensor it computed, consumers read it, and the caller reads an
//! output from it. An f32 input that only host kernels read goes there too, moved in as the
//! caller's own tensor, so it is never copied. Such buffers are touched only by kernels of
//! a host (CPU) device, which the session checks when it is created.
//!
//! Recorded command buffers are reused call after call, so a kernel cannot hold its call's
//! table: it finds it through the call id in its dispatch parameters, in the session's
//! [`CallRegistry`]. The registry also holds the other devices' memory ranges that a call's
//! cross-device copies map (a copy between the CPU and a GPU runs on the CPU and maps the
//! GPU's host-visible side). The session registers a call when it submits it and drops the
//! entry when all of its work has completed or failed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rafter_hal::BufferRange;

use crate::Tensor;

/// One call's host slot table, indexed by program buffer.
pub type Slots = Arc<Mutex<Vec<Option<Tensor>>>>;

/// One call's host slots, foreign ranges and symbol values.
struct CallState {
    slots: Slots,
    foreign: Arc<[BufferRange]>,
    symbols: Arc<[i64]>,
}

/// Live calls' host slot tables, foreign ranges and symbol values, by call id.
#[derive(Default)]
pub struct CallRegistry {
    calls: Mutex<HashMap<u64, CallState>>,
}

impl CallRegistry {
    /// Registers a call: its host slots, the other devices' buffer ranges that its
    /// cross-device copies map (by index, see [`CopyEnd::Foreign`](crate::CopyEnd)), and
    /// its value of each symbol (for dispatches recorded with
    /// [`DispatchArgs::symbols_at_run`](crate::DispatchArgs::symbols_at_run)).
    pub fn insert(&self, call: u64, slots: Slots, foreign: Vec<BufferRange>, symbols: &[i64]) {
        let state = CallState {
            slots,
            foreign: foreign.into(),
            symbols: symbols.into(),
        };
        lock(&self.calls).insert(call, state);
    }

    /// Forgets a call.
    pub fn remove(&self, call: u64) {
        lock(&self.calls).remove(&call);
    }

    /// The host slot table of `call`.
    pub fn slots(&self, call: u64) -> Result<Slots, String> {
        lock(&self.calls)
            .get(&call)
            .map(|c| c.slots.clone())
            .ok_or_else(|| {
                format!("call {call} has no host slot table (its session state is gone)")
            })
    }

    /// Foreign range `i` of `call`.
    pub fn foreign(&self, call: u64, i: usize) -> Result<BufferRange, String> {
        lock(&self.calls)
            .get(&call)
            .ok_or_else(|| format!("call {call} is not registered (its session state is gone)"))?
            .foreign
            .get(i)
            .cloned()
            .ok_or_else(|| format!("call {call} has no foreign range {i}"))
    }

    /// The symbol values `call` was submitted with.
    pub fn symbols(&self, call: u64) -> Result<Arc<[i64]>, String> {
        lock(&self.calls)
            .get(&call)
            .map(|c| c.symbols.clone())
            .ok_or_else(|| format!("call {call} is not registered (its session state is gone)"))
    }

    /// How many calls are registered (in flight).
    pub fn len(&self) -> usize {
        lock(&self.calls).len()
    }

    /// Whether no call is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Locks `m`, taking the data even if a panicking thread poisoned it: every structure the
/// runtime guards stays consistent between statements, and a kernel's panic is already
/// reported as the dispatch's failure.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
