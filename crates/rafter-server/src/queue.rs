//! The one generation worker and its queue.
//!
//! An [`Llm`] holds one session whose KV cache is the state of the sequence being generated,
//! so generations run one at a time. They run on a dedicated OS thread (a generation is
//! seconds of blocking compute that must stay off the async runtime), which takes jobs in
//! the order they were admitted (FIFO: a request never overtakes an earlier one). At most
//! `max_queue` jobs wait behind the running one; a request beyond that is refused at once
//! with a 503 rather than left to wait without bound.
//!
//! A job streams [`Event`]s back over a channel. It is cancelled when its receiver is gone
//! (a streaming client disconnected and its response body was dropped) or its
//! [`Ticket`] was dropped (the request's handler went away): a queued job is skipped, and a
//! running one stops before its next forward call, so at most one more token is computed.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use rafter_generate::{FinishReason, GenerateParams, LogitsModel, Timings};
use rafter_llm_engine::{Llm, SessionModel};
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;

/// What a job sends back.
#[derive(Debug)]
pub enum Event {
    /// Generated text, as it becomes final (never a broken character nor stop-string text).
    Text(String),
    /// The end: how the generation finished, or why it failed.
    Done(Result<Finished, ApiError>),
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Every sampled token, a stop token that ended the generation included.
    pub generated_ids: Vec<u32>,
    /// The text (what the stream's pieces add up to).
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// Counters for `/health`.
#[derive(Debug, Default)]
pub struct Stats {
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    /// Tokens computed by generations that were then cancelled.
    cancelled_tokens: AtomicU64,
    generated_tokens: AtomicU64,
}

/// A snapshot of the queue for `/health`.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStatus {
    /// Requests waiting for the model.
    pub queued: usize,
    /// 1 while a generation runs.
    pub running: usize,
    pub max_queue: usize,
    pub completed: u64,
    pub cancelled: u64,
    pub failed: u64,
    /// Refused because the queue was full.
    pub rejected: u64,
    pub generated_tokens: u64,
    pub cancelled_tokens: u64,
}

struct Job {
    /// For the log line.
    id: String,
    prompt_ids: Vec<u32>,
    params: GenerateParams,
    events: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    /// The server is shutting down: every job stops (see [`Queue::shut_down`]).
    stopping: Arc<AtomicBool>,
}

impl Job {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
            || self.events.is_closed()
            || self.stopping.load(Ordering::Relaxed)
    }
}

/// The handle of a queued job: its events, and cancellation when dropped.
pub struct Ticket {
    pub events: UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
}

#[cfg(test)]
impl Ticket {
    /// A ticket fed by the returned sender instead of the worker.
    pub(crate) fn for_test() -> (Ticket, UnboundedSender<Event>) {
        let (tx, events) = unbounded_channel();
        let ticket = Ticket {
            events,
            cancel: Arc::new(AtomicBool::new(false)),
        };
        (ticket, tx)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// The shared state of the queue and its worker.
struct Shared {
    /// Admitted jobs not yet finished (waiting, and the running one).
    admitted: AtomicUsize,
    running: AtomicBool,
    /// Set by [`Queue::shut_down`]; shared with every job.
    stopping: Arc<AtomicBool>,
    max_queue: usize,
    stats: Stats,
}

/// The FIFO queue in front of the worker thread.
pub struct Queue {
    jobs: Mutex<mpsc::Sender<Job>>,
    shared: Arc<Shared>,
}

impl Queue {
    /// Starts the worker thread over `llm`, with room for `max_queue` waiting jobs.
    pub fn start(llm: Arc<Llm>, max_queue: usize) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            admitted: AtomicUsize::new(0),
            running: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            max_queue,
            stats: Stats::default(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("rafter-serve-worker".into())
            .spawn(move || work(&llm, &rx, &worker))?;
        Ok(Queue {
            jobs: Mutex::new(tx),
            shared,
        })
    }

    /// Queues a generation, or refuses it with a 503 when `max_queue` jobs already wait.
    pub fn submit(
        &self,
        id: String,
        prompt_ids: Vec<u32>,
        params: GenerateParams,
    ) -> Result<Ticket, ApiError> {
        let s = &self.shared;
        if s.stopping.load(Ordering::Relaxed) {
            return Err(shutting_down());
        }
        let limit = s.max_queue + 1;
        if s.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            s.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(queue_full(s.max_queue));
        }
        let (events, rx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            id,
            prompt_ids,
            params,
            events,
            cancel: cancel.clone(),
            stopping: s.stopping.clone(),
        };
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job);
        if sent.is_err() {
            s.admitted.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::internal("the generation worker has stopped"));
        }
        Ok(Ticket { events: rx, cancel })
    }

    /// Stops the running generation within a token and every waiting one, each answered
    /// with a 503 `shutting_down` (so a server asked to stop does not first finish a long
    /// generation), and refuses new ones.
    pub fn shut_down(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    pub fn status(&self) -> QueueStatus {
        let s = &self.shared;
        let running = usize::from(s.running.load(Ordering::Acquire));
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueStatus {
            queued: s.admitted.load(Ordering::Acquire).saturating_sub(running),
            running,
            max_queue: s.max_queue,
            completed: load(&s.stats.completed),
            cancelled: load(&s.stats.cancelled),
            failed: load(&s.stats.failed),
            rejected: load(&s.stats.rejected),
            generated_tokens: load(&s.stats.generated_tokens),
            cancelled_tokens: load(&s.stats.cancelled_tokens),
        }
    }
}

fn queue_full(max_queue: usize) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "The server is busy: one generation runs and {max_queue} requests wait for the \
             model (rafter serve --max-queue {max_queue}). Please retry shortly."
        ),
        kind: "server_error",
        param: None,
        code: Some("queue_full"),
    }
}

fn shutting_down() -> ApiError {
    ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        message: "The server is shutting down; the generation was stopped.".into(),
        kind: "server_error",
        param: None,
        code: Some("shutting_down"),
    }
}

/// The worker thread: jobs in order until the queue is dropped.
fn work(llm: &Llm, jobs: &mpsc::Receiver<Job>, shared: &Shared) {
    while let Ok(job) = jobs.recv() {
        if job.stopping.load(Ordering::Relaxed) {
            shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            shared.admitted.fetch_sub(1, Ordering::AcqRel);
            let _ = job.events.send(Event::Done(Err(shutting_down())));
            continue;
        }
        if job.cancelled() {
            // Its client left while it waited.
            shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            shared.admitted.fetch_sub(1, Ordering::AcqRel);
            eprintln!("rafter serve: {} cancelled before it started", job.id);
            continue;
        }
        shared.running.store(true, Ordering::Release);
        let start = Instant::now();
        let mut steps = 0usize;
        let outcome =
            catch_unwind(AssertUnwindSafe(|| run(llm, &job, &mut steps))).unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown");
                Err(ApiError::internal(format!(
                    "the generation panicked: {why}"
                )))
            });
        let outcome = match outcome {
            Ok(f)
                if f.finish_reason == FinishReason::Cancelled
                    && job.stopping.load(Ordering::Relaxed) =>
            {
                eprintln!("rafter serve: {} stopped by the shutdown", job.id);
                Err(shutting_down())
            }
            other => other,
        };
        let stats = &shared.stats;
        let secs = start.elapsed().as_secs_f64();
        match &outcome {
            Ok(f) if f.finish_reason == FinishReason::Cancelled => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                stats
                    .cancelled_tokens
                    .fetch_add(steps as u64, Ordering::Relaxed);
                eprintln!(
                    "rafter serve: {} cancelled by its client after {steps} tokens ({secs:.2} s)",
                    job.id
                );
            }
            Ok(f) => {
                stats.completed.fetch_add(1, Ordering::Relaxed);
                let t = &f.timings;
                eprintln!(
                    "rafter serve: {} {} prompt + {} completion tokens, {:?}, prefill {:.0} ms, \
                     {:.1} tok/s ({secs:.2} s)",
                    job.id,
                    t.prompt_tokens,
                    t.generated_tokens,
                    f.finish_reason,
                    t.prompt_seconds * 1e3,
                    t.generated_tokens_per_second(),
                );
            }
            // Stopped by the shutdown (logged above): not a failure of the generation.
            Err(e) if e.code == Some("shutting_down") => {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                stats
                    .cancelled_tokens
                    .fetch_add(steps as u64, Ordering::Relaxed);
            }
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("rafter serve: {} failed: {}", job.id, e.message);
            }
        }
        stats
            .generated_tokens
            .fetch_add(steps as u64, Ordering::Relaxed);
        // Free the slot before answering, so a client that sends its next request as soon
        // as this one ends finds room.
        shared.running.store(false, Ordering::Release);
        shared.admitted.fetch_sub(1, Ordering::AcqRel);
        let _ = job.events.send(Event::Done(outcome));
    }
}

/// Runs one generation on the session; `steps` counts the tokens computed.
fn run(llm: &Llm, job: &Job, steps: &mut usize) -> Result<Finished, ApiError> {
    let mut model = Cancellable {
        inner: SessionModel::new(llm.session(), llm.context()),
        job,
        steps,
    };
    let result = rafter_generate::generate(
        &mut model,
        llm.tokenizer(),
        &job.prompt_ids,
        &job.params,
        |piece| {
            if job.events.send(Event::Text(piece.to_string())).is_err() || job.cancelled() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    );
    match result {
        Ok(g) => Ok(Finished {
            generated_ids: g.generated_ids,
            text: g.text,
            finish_reason: g.finish_reason,
            timings: g.timings,
        }),
        // The model refused the next step because the job was cancelled.
        Err(_) if job.cancelled() => Ok(Finished {
            generated_ids: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Cancelled,
            timings: Timings::default(),
        }),
        Err(e) => Err(ApiError::internal(format!("generation failed: {e}"))),
    }
}

/// The session's model, checking before each forward call whether the job was cancelled:
/// a cancelled generation stops within one token even while its text is held back (an
/// unfinished character, or a possible stop string) and no piece goes out.
struct Cancellable<'a> {
    inner: SessionModel<'a>,
    job: &'a Job,
    /// Forward calls made: the prefill's token, then one per decode step.
    steps: &'a mut usize,
}

#[derive(Debug, thiserror::Error)]
#[error("cancelled: the client went away")]
struct Cancelled;

impl LogitsModel for Cancellable<'_> {
    fn forward(
        &mut self,
        tokens: &[u32],
    ) -> Result<&[f32], Box<dyn std::error::Error + Send + Sync>> {
        if self.job.cancelled() {
            return Err(Box::new(Cancelled));
        }
        *self.steps += 1;
        self.inner.forward(tokens)
    }

    fn reset(&mut self) {
        self.inner.reset()
    }

    fn max_context(&self) -> usize {
        self.inner.max_context()
    }
}
