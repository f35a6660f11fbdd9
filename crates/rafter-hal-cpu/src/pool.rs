//! The worker pool: N threads taking jobs from one FIFO.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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
}

impl Pool {
    pub(crate) fn new() -> Pool {
        Pool {
            state: Mutex::new(PoolState {
                jobs: VecDeque::new(),
                shutdown: false,
            }),
            available: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues jobs. Jobs pushed after `shutdown` still run: workers exit only once the queue
    /// is empty, so every job's completion accounting happens.
    pub(crate) fn push(&self, jobs: Vec<Job>) {
        let n = jobs.len();
        self.lock().jobs.extend(jobs);
        if n == 1 {
            self.available.notify_one();
        } else if n > 1 {
            self.available.notify_all();
        }
    }

    /// Asks the workers to exit once the queue is empty.
    pub(crate) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.available.notify_all();
    }

    /// A worker thread's body.
    pub(crate) fn run_worker(&self, worker: Worker) {
        loop {
            let job = {
                let mut state = self.lock();
                loop {
                    if let Some(job) = state.jobs.pop_front() {
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
