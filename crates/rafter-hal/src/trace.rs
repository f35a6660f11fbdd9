//! Tracing hook: devices report what ran where and when.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a trace event covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// A kernel launch (one span per thread that ran workgroups of it).
    Dispatch,
    /// A buffer copy.
    Copy,
    /// A buffer fill.
    Fill,
}

/// One span of device work on one thread (a CPU worker) or one hardware queue.
///
/// A dispatch whose workgroups are spread over several threads gives one event per thread
/// that took part, each covering the workgroups that thread ran. Timestamps are host
/// [`Instant`]s so events from every device share one clock; the runtime converts them to
/// microseconds from its own epoch when it writes Chrome/Perfetto trace JSON.
#[derive(Debug, Clone)]
pub struct TraceEvent {
    /// The queue the work was submitted to (`"cpu:0"`).
    pub queue: Arc<str>,
    /// What the span covers.
    pub kind: TraceKind,
    /// The executable's name (empty for copies and fills).
    pub executable: Arc<str>,
    /// The entry point's name, or `"copy"` / `"fill"`.
    pub name: Arc<str>,
    /// When it started (host clock).
    pub start: Instant,
    /// When it ended (host clock).
    pub end: Instant,
    /// The thread (or hardware lane) that ran it (`"rafter-cpu#1-worker-3"`).
    pub thread: Arc<str>,
    /// How many workgroups this span ran (1 for copies and fills).
    pub workgroups: u64,
    /// The span ended in an error.
    pub failed: bool,
}

/// Receives trace events. Called from device threads while work runs, so `record` must be
/// cheap and must not block for long.
pub trait TraceSink: Send + Sync {
    /// Takes one event.
    fn record(&self, event: TraceEvent);
}

/// A sink that keeps every event in memory.
#[derive(Debug, Default)]
pub struct MemoryTraceSink {
    events: Mutex<Vec<TraceEvent>>,
}

impl MemoryTraceSink {
    /// An empty sink.
    pub fn new() -> MemoryTraceSink {
        MemoryTraceSink::default()
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Removes and returns the events so far.
    pub fn take(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl TraceSink for MemoryTraceSink {
    fn record(&self, event: TraceEvent) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }
}
