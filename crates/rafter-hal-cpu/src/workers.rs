//! The command workers: N threads taking jobs (barrier segments of command buffers) from
//! one FIFO. Not to be confused with the kernels' own threads (`rafter_kernels_cpu::WorkerPool`,
//! one per session in `rafter-runtime-cpu`), across which one kernel splits its work.
//!
//! A job pushed by a worker of the same pool (the worker that finished a barrier
//! segment's last job pushing the next segment) is not queued: the worker keeps one of the
//! jobs and runs it as soon as its current job returns. A chain of small dependent kernels
//! (a transformer's mask arithmetic: ~20 kernels of a few microseconds) then runs on one
//! thread instead of waking another for every kernel: BERT's mask subgraph on two
//! threads took 0.31–0.37 ms a call before (37% of `perf` samples in futex waits and
//! wake-ups), 0.20–0.27 ms after (benchmarks/RESULTS.md, "Kernel-level measurements").

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

thread_local! {
    /// The pool this thread works for (its address), if it is a worker.
    static WORKER_OF: Cell<usize> = const { Cell::new(0) };
    /// The job this worker runs next, before looking at the queue.
    static NEXT: RefCell<Option<Job>> = const { RefCell::new(None) };
}

/// The worker running a job.
pub(crate) struct Worker {
    pub(crate) name: Arc<str>,
}

pub(crate) type Job = Box<dyn FnOnce(&Worker) + Send>;

pub(crate) struct Pool {
    state: Mutex<PoolState>,
    available: Condvar,
}

struct PoolState {
    jobs: VecDeque<Job>,
    shutdown: bool,
    /// How many of the queued jobs no worker was woken for: `push` leaves jobs for a host
    /// thread that is about to help. The helper runs one; the others are announced to the
    /// workers as soon as it starts it (see `help`), so independent jobs still run side by
    /// side.
    unannounced: usize,
}

impl PoolState {
    /// Takes the next job and says how many workers to wake for the jobs left queued
    /// that no one was woken for (all of them once a helper starts a job).
    fn take_announcing_rest(&mut self) -> (Option<Job>, usize) {
        let job = self.jobs.pop_front();
        let wake = if job.is_some() {
            self.unannounced.min(self.jobs.len())
        } else {
            0
        };
        if job.is_some() {
            self.unannounced = 0;
        }
        (job, wake)
    }
}

impl Pool {
    pub(crate) fn new() -> Pool {
        Pool {
            state: Mutex::new(PoolState {
                jobs: VecDeque::new(),
                shutdown: false,
                unannounced: 0,
            }),
            available: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues jobs. Jobs pushed after `shutdown` still run: workers exit only once the queue
    /// is empty, so every job's completion accounting happens.
    pub(crate) fn push(&self, mut jobs: Vec<Job>) {
        if self.is_current_worker() && !jobs.is_empty() && NEXT.with(|n| n.borrow().is_none()) {
            let kept = jobs.remove(0);
            NEXT.with(|n| *n.borrow_mut() = Some(kept));
        }
        let n = jobs.len();
        if n == 0 {
            return;
        }
        let mut state = self.lock();
        state.jobs.extend(jobs);
        // A host thread that will help next takes a job itself, and hands the others to
        // the workers when it starts it (see `help`): waking one now for the job it will
        // take would be wasted.
        if rafter_hal::submitter_will_wait() && !self.is_current_worker() {
            state.unannounced += n;
            return;
        }
        drop(state);
        // One wake-up per job, not all: on a 16-core machine `notify_all` woke every idle
        // worker to contend for two or three small jobs.
        for _ in 0..n {
            self.available.notify_one();
        }
    }

    /// Asks the workers to exit once the queue is empty.
    /// Jobs queued and not yet taken by a worker (for `Device::describe`).
    pub(crate) fn queued_jobs(&self) -> usize {
        self.lock().jobs.len()
    }

    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.available.notify_all();
    }

    fn is_current_worker(&self) -> bool {
        WORKER_OF.with(|w| w.get()) == self as *const Pool as usize
    }

    /// Runs queued jobs on the calling thread, as if it were one of the workers, until
    /// `done` returns true or the queue is empty. Why: a host thread about to block on a
    /// call's semaphore would otherwise leave the call's first job to a worker that
    /// `push` must wake, and then be woken itself at the end: two futex wake-ups, tens of
    /// microseconds each on a VM. Helping, it takes the job at once, keeps the chained
    /// segments on itself (see the module docs), and sees the call finish. A thread that is
    /// already a worker (of any pool) does not help: its kept job is its own pool's.
    ///
    /// When the queue is empty, `idle` is asked (on this thread, still lent to the pool, so
    /// jobs it pushes stay here): it may wait for work to become ready and return true to
    /// look again, or false to stop helping.
    pub(crate) fn help(&self, worker: &Worker, done: &dyn Fn() -> bool, idle: &dyn Fn() -> bool) {
        if WORKER_OF.with(|w| w.get()) != 0 {
            self.wake_for_queued();
            return;
        }
        WORKER_OF.with(|w| w.set(self as *const Pool as usize));
        /// Makes the thread a plain host thread again, on return or unwind.
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                WORKER_OF.with(|w| w.set(0));
            }
        }
        let _reset = Reset;
        loop {
            // A kept job is run before stopping, so none is left behind on this thread.
            if let Some(job) = NEXT.with(|n| n.borrow_mut().take()) {
                job(worker);
                continue;
            }
            if done() {
                break;
            }
            let (job, wake) = self.lock().take_announcing_rest();
            for _ in 0..wake {
                self.available.notify_one();
            }
            match job {
                Some(job) => job(worker),
                None => {
                    if !idle() {
                        break;
                    }
                }
            }
        }
        self.wake_for_queued();
    }

    /// Wakes a worker for each queued job: a helper leaving (at its deadline, once its call
    /// is done, or not helping at all) hands them over, as `push` woke no one for the jobs
    /// it pushed for that helper.
    fn wake_for_queued(&self) {
        let queued = {
            let mut state = self.lock();
            state.unannounced = 0;
            state.jobs.len()
        };
        for _ in 0..queued {
            self.available.notify_one();
        }
    }

    /// A worker thread's body.
    pub(crate) fn run_worker(&self, worker: Worker) {
        WORKER_OF.with(|w| w.set(self as *const Pool as usize));
        loop {
            // The job kept by the last one's `push` first (see the module docs).
            while let Some(job) = NEXT.with(|n| n.borrow_mut().take()) {
                job(&worker);
            }
            let job = {
                let mut state = self.lock();
                loop {
                    if let Some(job) = state.jobs.pop_front() {
                        state.unannounced = state.unannounced.min(state.jobs.len());
                        break job;
                    }
                    if state.shutdown {
                        return;
                    }
                    state = self
                        .available
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                }
            };
            job(&worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Two independent jobs pushed for a helper: the helper runs one and a worker must
    /// be woken for the other, or they run one after the other (the second only once the
    /// helper gets back to the queue).
    #[test]
    fn a_helper_hands_the_jobs_it_does_not_take_to_the_workers_at_once() {
        let pool = Arc::new(Pool::new());
        let worker_pool = pool.clone();
        let worker =
            std::thread::spawn(move || worker_pool.run_worker(Worker { name: "w".into() }));
        // Let the worker reach its wait, so only a wake-up can start it.
        std::thread::sleep(Duration::from_millis(50));
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<Job> = (0..2)
            .map(|_| {
                let (inside, most) = (inside.clone(), most.clone());
                Box::new(move |_: &Worker| {
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    let start = Instant::now();
                    while inside.load(Ordering::SeqCst) < 2
                        && start.elapsed() < Duration::from_millis(500)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    most.fetch_max(inside.load(Ordering::SeqCst), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    inside.fetch_sub(1, Ordering::SeqCst);
                }) as Job
            })
            .collect();
        rafter_hal::submit_then_wait(|| pool.push(jobs));
        pool.help(
            &Worker {
                name: "host".into(),
            },
            &|| false,
            &|| false,
        );
        // The worker may still be running the other job.
        let start = Instant::now();
        while inside.load(Ordering::SeqCst) > 0 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        pool.shutdown();
        worker.join().unwrap();
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "the two jobs did not overlap"
        );
    }
}
