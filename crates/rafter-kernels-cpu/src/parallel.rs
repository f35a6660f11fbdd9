//! The "parallel for" the GEMM is driven by, supplied by the caller so that rafter's CPU
//! device runs kernels on its own worker pool instead of a thread pool of this crate's.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs independent tasks, possibly concurrently.
pub trait Parallel: Sync {
    /// How many tasks can run at once; the GEMM splits its work into about this many
    /// tasks (1 means: do not split).
    fn threads(&self) -> usize;

    /// Calls `f(i)` once for every `i` in `0..tasks`, in any order and on any threads, and
    /// returns when all calls have returned.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync));
}

/// Everything on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Parallel for Sequential {
    fn threads(&self) -> usize {
        1
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..tasks).for_each(f);
    }
}

/// `threads - 1` scoped threads spawned per call plus the caller, taking tasks from a shared
/// counter. Simple and dependency-free, for tests and benches; spawning costs some tens of
/// microseconds per call, which a persistent pool (rafter's device) does not pay.
#[derive(Clone, Copy, Debug)]
pub struct ScopedThreads {
    threads: usize,
}

impl ScopedThreads {
    /// Up to `threads` threads per call (the caller's included); 0 counts as 1.
    pub fn new(threads: usize) -> ScopedThreads {
        ScopedThreads {
            threads: threads.max(1),
        }
    }
}

impl Parallel for ScopedThreads {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let workers = self.threads.min(tasks);
        if workers <= 1 {
            return Sequential.run(tasks, f);
        }
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            f(i);
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                s.spawn(work);
            }
            work();
        });
    }
}
