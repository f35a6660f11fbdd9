//! A persistent worker pool: the [`Parallel`] the CPU runtime drives its kernels with.
//!
//! Why not [`ScopedThreads`](crate::ScopedThreads): spawning threads per call costs tens of
//! microseconds, and a transformer runs a few hundred kernels per call. Why not rayon: a
//! call from outside a rayon pool is injected into the pool and the caller sleeps on a
//! latch, so every kernel pays two cross-thread wake-ups. Here the caller takes tasks
//! itself, and workers spin for a short while after each job before they park, so
//! back-to-back kernels find them awake and no system call is made on the hot path.
//!
//! # Protocol
//! A job lives in an `Arc<Job>` published in `current`, announced by bumping `epoch`.
//! Its tasks are cut into one contiguous chunk per thread; a thread claims tasks with
//! `fetch_add` on its own chunk's counter first, then on the others' (stealing), so an index
//! below `tasks` is claimed exactly once. Owning a chunk keeps the same rows of consecutive
//! kernels on the same core: kernels split their output rows in order, so the rows a layer
//! reads are the ones the same core wrote into its L2 one kernel earlier. The caller takes tasks too, then waits until `done == tasks`
//! before it returns, so the borrowed closure outlives every call of it (the invariant
//! behind the one `unsafe` lifetime erasure below). A worker that joins late only sees
//! claimed-out indices and never calls the closure. One job runs at a time: a second
//! caller (another device thread) that finds the pool busy runs its tasks itself.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::parallel::{Parallel, Sequential};

/// How long a worker spins for the next job before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// Spin iterations (a few microseconds) before a waiting thread starts yielding its core.
const SPIN_BEFORE_YIELD: u32 = 4096;

type Task = dyn Fn(usize) + Sync;

struct Job {
    /// The caller's closure, its lifetime erased; valid until `done == tasks` (see the
    /// module docs).
    f: *const Task,
    /// One chunk of task indices per thread (see the module docs).
    chunks: Vec<Chunk>,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `f` points to a `Sync` closure, called only while the caller of `run` waits for
// it (see `Job::f`); the other fields are thread-safe.
unsafe impl Send for Job {}
// SAFETY: as for `Send`: shared between the workers, it only hands out task indices.
unsafe impl Sync for Job {}

/// Task indices `next..end`, claimed from the front.
struct Chunk {
    next: AtomicUsize,
    end: usize,
}

impl Job {
    fn new(f: *const Task, tasks: usize, threads: usize) -> Job {
        let chunks = (0..threads)
            .map(|p| Chunk {
                next: AtomicUsize::new(tasks * p / threads),
                end: tasks * (p + 1) / threads,
            })
            .collect();
        Job {
            f,
            chunks,
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        }
    }

    /// Claims and runs tasks until none are left: the chunk of thread `me` first, then the
    /// others' in turn.
    fn work(&self, me: usize) {
        let n = self.chunks.len();
        for q in (0..n).map(|d| (me + d) % n) {
            self.drain(&self.chunks[q]);
        }
    }

    fn drain(&self, chunk: &Chunk) {
        loop {
            let i = chunk.next.fetch_add(1, Ordering::Relaxed);
            if i >= chunk.end {
                return;
            }
            // SAFETY: `i < tasks` was claimed by this thread alone, and the caller of
            // `run` does not return (so `f` stays alive) until this task is counted done.
            let f = unsafe { &*self.f };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                lock(&self.panic).get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Shared {
    epoch: AtomicU64,
    current: Mutex<Option<Arc<Job>>>,
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// A fixed set of worker threads that, with the calling thread, run [`Parallel`] jobs.
pub struct WorkerPool {
    shared: Arc<Shared>,
    busy: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
}

impl WorkerPool {
    /// A pool running jobs on `threads` threads, the caller's included (so `threads - 1`
    /// workers are started; 0 counts as 1).
    pub fn new(threads: usize) -> std::io::Result<WorkerPool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            current: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = WorkerPool {
            shared: shared.clone(),
            busy: Mutex::new(()),
            workers: Vec::new(),
            threads,
        };
        for i in 1..threads {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("rafter-pool-{i}"))
                .spawn(move || worker(&shared, i))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }
}

/// Worker `me` (1.., the caller of `run` being 0) of the pool.
fn worker(shared: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        let epoch = wait_for_epoch(shared, seen);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = epoch;
        let job = lock(&shared.current).clone();
        if let Some(job) = job {
            job.work(me);
        }
    }
}

/// Spins, then parks, until `epoch` differs from `seen`; returns the new epoch.
fn wait_for_epoch(shared: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    loop {
        let e = shared.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        if start.elapsed() < SPIN {
            // Spin first (the next kernel usually follows within microseconds), but
            // yield now and then so an oversubscribed machine's other threads run.
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
            continue;
        }
        let guard = lock(&shared.sleep);
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        // Checked again under the lock: a publisher bumps the epoch, then takes this lock
        // to notify, so the bump is either seen here or the notification reaches the wait.
        let guard = if shared.epoch.load(Ordering::SeqCst) == seen {
            shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
        } else {
            guard
        };
        shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
    }
}

impl Parallel for WorkerPool {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 || self.workers.is_empty() {
            return Sequential.run(tasks, f);
        }
        let _busy = match self.busy.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Sequential.run(tasks, f),
        };
        // SAFETY: (lifetime erasure) the pointer is dereferenced only for claimed tasks,
        // and this function returns only after every task is done (the wait below).
        let f = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), *const Task>(f) };
        let job = Arc::new(Job::new(f, tasks, self.threads));
        *lock(&self.shared.current) = Some(job.clone());
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.shared.sleep);
            self.shared.wake.notify_all();
        }
        job.work(0);
        // The last tasks are running on workers: spin briefly, then yield, so that on an
        // oversubscribed machine the caller does not burn the core a worker needs.
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < tasks {
            if spins < SPIN_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *lock(&self.shared.current) = None;
        let panic = lock(&job.panic).take();
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = lock(&self.shared.sleep);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("threads", &self.threads)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pool: &WorkerPool, tasks: usize) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        pool.run(tasks, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        hits.into_iter().map(|h| h.into_inner()).collect()
    }

    #[test]
    fn every_task_runs_exactly_once() {
        let pool = WorkerPool::new(3).unwrap();
        for tasks in [0, 1, 2, 3, 7, 100, 1000] {
            assert_eq!(counts(&pool, tasks), vec![1; tasks], "{tasks} tasks");
        }
    }

    #[test]
    fn a_thread_takes_its_own_chunk_first_then_steals_in_turn() {
        // A static, so the closure is 'static like the `*const Task` a job holds.
        static ORDER: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        let f: &Task = &|i: usize| lock(&ORDER).push(i);
        // 10 tasks over 3 threads: chunks 0..3, 3..6, 6..10.
        let job = Job::new(f as *const Task, 10, 3);
        job.work(1);
        assert_eq!(*lock(&ORDER), vec![3, 4, 5, 6, 7, 8, 9, 0, 1, 2]);
        assert_eq!(job.done.load(Ordering::Relaxed), 10);
        // Every chunk is drained: another thread finds nothing to run.
        job.work(0);
        assert_eq!(lock(&ORDER).len(), 10);
    }

    #[test]
    fn workers_wake_after_parking() {
        let pool = WorkerPool::new(2).unwrap();
        std::thread::sleep(SPIN * 5);
        let threads = Mutex::new(std::collections::HashSet::new());
        // Slow tasks, so the woken worker takes some of them.
        pool.run(64, &|_| {
            lock(&threads).insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(1));
        });
        assert_eq!(lock(&threads).len(), 2);
    }

    #[test]
    fn concurrent_callers_both_finish() {
        let pool = Arc::new(WorkerPool::new(2).unwrap());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        assert_eq!(counts(&pool, 17), vec![1; 17]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = WorkerPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(50, &|i| {
                if i == 37 {
                    panic!("task 37");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(counts(&pool, 9), vec![1; 9]);
    }

    #[test]
    fn sums_match_sequential() {
        let pool = WorkerPool::new(4).unwrap();
        let data: Vec<u64> = (0..100_000).collect();
        let parts: Vec<AtomicU64> = (0..10).map(|_| AtomicU64::new(0)).collect();
        pool.run(10, &|t| {
            let s: u64 = data[t * 10_000..(t + 1) * 10_000].iter().sum();
            parts[t].store(s, Ordering::Relaxed);
        });
        let total: u64 = parts.iter().map(|p| p.load(Ordering::Relaxed)).sum();
        assert_eq!(total, data.iter().sum::<u64>());
    }
}
