//! Recorded calls: one call's memory and command buffers, kept for the next call with the
//! same input shapes.
//!
//! Everything `Session::submit` prepares before it submits depends only on the inputs'
//! shapes: buffer dims, the arena plan, the input and output allocations, and every command
//! buffer (device addresses and dim params baked in). Measured on the H100, preparing it
//! took 1.0 ms of MobileNetV2's 1.6 ms call and 2.5 ms of BERT-base's 11.4 ms, and the GPU
//! cannot start before it ends. So a call's preparation is a [`Recorded`], lent to one call
//! at a time; once that call's work has completed and its handle has read the outputs (or
//! been dropped), it goes back to the session's [`RecordedCache`] and the next call of the
//! same shapes only writes its inputs and submits.
//!
//! Reuse is safe because a recording is exclusive: its arenas, input and output buffers
//! belong to one call in flight, exactly as freshly allocated ones would. Kernels never rely
//! on an arena's initial contents (the memory plan already reuses regions within one call).
//! A call that failed does not return its recording: a failed submission may leave work that
//! never ran or a device in an unknown state.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use rafter_hal::{Buffer, BufferRange, CommandBuffer, Semaphore};
use rafter_ir::DType;

use crate::host::lock;

/// Where one output of a call is read from.
#[derive(Clone, Debug)]
pub(crate) enum OutputSource {
    Buffer {
        range: BufferRange,
        dtype: DType,
        dims: Vec<usize>,
    },
    Slot(usize),
}

/// Where a call's input goes.
pub(crate) enum InputDest {
    /// Its bytes are written into this buffer.
    Buffer(Buffer),
    /// The tensor itself goes into host slot `b`, which only CPU kernels read, in place:
    /// no copy.
    Slot(usize),
}

/// One command buffer of a recorded call, for one device.
pub(crate) struct Chunk {
    pub(crate) device: usize,
    pub(crate) command_buffer: CommandBuffer,
    /// Earlier chunks whose work this one must wait for.
    pub(crate) waits: Vec<usize>,
}

/// A call's memory and recorded work for one set of input shapes.
pub(crate) struct Recorded {
    /// The input shapes this recording was made for.
    pub(crate) key: Vec<Vec<usize>>,
    /// The call number the CPU dispatches' params carry: the key of the call's host slots
    /// and foreign ranges in the registry (see `CallRegistry`). The call that records
    /// chooses it; later calls on this recording register under it again.
    pub(crate) registry_key: u64,
    /// Per chunk: the timeline semaphore its submission signals. Use `n` of the recording
    /// waits for and signals value `n` (a recording serves one call at a time, and only
    /// returns once every signal of its use has landed, so values only grow).
    pub(crate) semaphores: Vec<Semaphore>,
    /// How many calls have used the recording: the value the last one signalled.
    pub(crate) uses: u64,
    /// `(arena, buffer)`: the arenas' allocations.
    pub(crate) arenas: Vec<(usize, Buffer)>,
    /// `(input index, destination)`: where each input goes.
    pub(crate) inputs: Vec<(usize, InputDest)>,
    pub(crate) outputs: Vec<OutputSource>,
    pub(crate) chunks: Vec<Chunk>,
    /// Other devices' ranges that the call's cross-device copies map.
    pub(crate) foreign: Vec<BufferRange>,
}

/// Idle recordings kept per session: enough for a caller that keeps two calls in flight,
/// and a bound on the memory that idle arenas hold.
const IDLE_RECORDINGS: usize = 2;

/// The idle recordings of a session, most recently returned last.
#[derive(Default)]
pub(crate) struct RecordedCache {
    idle: Mutex<VecDeque<Recorded>>,
}

impl RecordedCache {
    /// The most recently returned idle recording for input shapes `key`, if any.
    pub(crate) fn take(&self, key: &[Vec<usize>]) -> Option<Recorded> {
        let mut idle = lock(&self.idle);
        let i = idle.iter().rposition(|r| r.key == key)?;
        idle.remove(i)
    }

    /// Keeps `recorded` for the next call of its shapes; beyond the bound, the oldest idle
    /// recording is dropped, and its arenas are returned through `evicted`.
    pub(crate) fn give(&self, recorded: Recorded, evicted: impl FnOnce(Vec<(usize, Buffer)>)) {
        let oldest = {
            let mut idle = lock(&self.idle);
            idle.push_back(recorded);
            (idle.len() > IDLE_RECORDINGS)
                .then(|| idle.pop_front())
                .flatten()
        };
        if let Some(oldest) = oldest {
            evicted(oldest.arenas);
        }
    }

    /// How many recordings are idle.
    pub(crate) fn len(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Arena buffers held by idle recordings.
    pub(crate) fn idle_arenas(&self) -> usize {
        lock(&self.idle).iter().map(|r| r.arenas.len()).sum()
    }
}

/// A recording lent to one call: it returns to the cache once both the call's work has
/// completed without failure and the call's handle is done with the outputs.
pub(crate) struct Lease {
    recorded: Mutex<Option<Recorded>>,
    /// The two holders still to release: the call's work and its handle.
    holders: AtomicUsize,
    failed: AtomicBool,
    home: Box<dyn Fn(Recorded) + Send + Sync>,
}

impl Lease {
    /// Lends `recorded`; `home` takes it back when both holders are done.
    pub(crate) fn new(recorded: Recorded, home: Box<dyn Fn(Recorded) + Send + Sync>) -> Lease {
        Lease {
            recorded: Mutex::new(Some(recorded)),
            holders: AtomicUsize::new(2),
            failed: AtomicBool::new(false),
            home,
        }
    }

    /// Marks the call failed: its recording is dropped instead of reused.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// One holder (the work, or the handle) is done.
    pub(crate) fn release(&self) {
        if self.holders.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let recorded = lock(&self.recorded).take();
        if let (false, Some(recorded)) = (self.failed.load(Ordering::Acquire), recorded) {
            (self.home)(recorded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn recording(key: usize) -> Recorded {
        Recorded {
            key: vec![vec![key]],
            registry_key: key as u64,
            semaphores: Vec::new(),
            uses: 0,
            arenas: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            chunks: Vec::new(),
            foreign: Vec::new(),
        }
    }

    #[test]
    fn cache_takes_by_shape_and_evicts_the_oldest() {
        let cache = RecordedCache::default();
        let evictions = std::cell::Cell::new(0);
        for k in [1, 2, 3] {
            cache.give(recording(k), |_| evictions.set(evictions.get() + 1));
        }
        assert_eq!(evictions.get(), 1);
        assert!(cache.take(&[vec![1]]).is_none(), "the oldest was evicted");
        assert_eq!(cache.take(&[vec![3]]).unwrap().registry_key, 3);
        assert!(cache.take(&[vec![3]]).is_none(), "taken once");
        assert_eq!(cache.take(&[vec![2]]).unwrap().registry_key, 2);
    }

    #[test]
    fn lease_returns_only_after_both_holders_and_no_failure() {
        let returned = Arc::new(AtomicUsize::new(0));
        let lease = |r: &Arc<AtomicUsize>| {
            let r = r.clone();
            Lease::new(
                recording(1),
                Box::new(move |_| {
                    r.fetch_add(1, Ordering::SeqCst);
                }),
            )
        };
        let ok = lease(&returned);
        ok.release();
        assert_eq!(
            returned.load(Ordering::SeqCst),
            0,
            "the handle still holds it"
        );
        ok.release();
        assert_eq!(returned.load(Ordering::SeqCst), 1);
        let failed = lease(&returned);
        failed.fail();
        failed.release();
        failed.release();
        assert_eq!(
            returned.load(Ordering::SeqCst),
            1,
            "a failed call's is dropped"
        );
    }
}
