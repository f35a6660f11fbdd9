//! Chrome / Perfetto trace JSON from the HAL's trace events.
//!
//! [`ChromeTrace`] is a [`TraceSink`]: give it to the devices when they are opened
//! (`CpuDeviceOptions::trace_sink`), run calls, then [`write`](ChromeTrace::write) the file
//! (`trace.json`) and open it in Perfetto (ui.perfetto.dev) or `chrome://tracing`.
//!
//! Layout: one process (`pid`) per device, one track (`tid`) per device queue, named by
//! metadata events; one complete event (`"ph": "X"`) per dispatch span, named after the
//! kernel (the entry point), with category `dispatch` (copies and fills get `copy` / `fill`).
//! Timestamps are microseconds since the sink was created. The JSON is written by hand: the
//! format needs strings, numbers and flat objects only.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use rafter_hal::{TraceEvent, TraceKind, TraceSink};

use crate::error::{Result, RuntimeError};
use crate::host::lock;

/// Collects trace events and writes them as Chrome trace JSON.
#[derive(Debug)]
pub struct ChromeTrace {
    epoch: Instant,
    events: Mutex<Vec<TraceEvent>>,
}

impl Default for ChromeTrace {
    fn default() -> Self {
        ChromeTrace::new()
    }
}

impl ChromeTrace {
    /// An empty trace whose clock starts now.
    pub fn new() -> ChromeTrace {
        ChromeTrace {
            epoch: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        lock(&self.events).clone()
    }

    /// Forgets the events so far.
    pub fn clear(&self) {
        lock(&self.events).clear();
    }

    /// The trace as Chrome trace JSON (`{"traceEvents": [...]}`).
    pub fn to_json(&self) -> String {
        let mut events = self.events();
        events.sort_by_key(|e| e.start);
        // Devices (pids) and queues (tids), in order of first appearance.
        let mut devices: Vec<String> = Vec::new();
        let mut queues: Vec<(String, usize)> = Vec::new();
        for e in &events {
            let queue = e.queue.to_string();
            if !queues.iter().any(|(q, _)| *q == queue) {
                let device = device_of(&queue).to_string();
                let pid = match devices.iter().position(|d| *d == device) {
                    Some(i) => i,
                    None => {
                        devices.push(device);
                        devices.len() - 1
                    }
                };
                queues.push((queue, pid));
            }
        }
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut first = true;
        let mut push = |out: &mut String, line: String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
            out.push_str(&line);
        };
        for (i, d) in devices.iter().enumerate() {
            push(
                &mut out,
                format!(
                    "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                    i + 1,
                    string(&format!("device {d}"))
                ),
            );
        }
        for (i, (q, pid)) in queues.iter().enumerate() {
            push(
                &mut out,
                format!(
                    "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}",
                    pid + 1,
                    i + 1,
                    string(q)
                ),
            );
        }
        for e in &events {
            let (tid, (_, pid)) = queues
                .iter()
                .enumerate()
                .find(|(_, (q, _))| **q == *e.queue)
                .expect("collected above");
            let ts = micros(e.start.saturating_duration_since(self.epoch));
            let dur = micros(e.end.saturating_duration_since(e.start));
            let cat = match e.kind {
                TraceKind::Dispatch => "dispatch",
                TraceKind::Copy => "copy",
                TraceKind::Fill => "fill",
            };
            let mut line = String::new();
            let _ = write!(
                line,
                "{{\"name\":{},\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{ts},\"dur\":{dur},\"pid\":{},\"tid\":{},\
                 \"args\":{{\"executable\":{},\"thread\":{},\"workgroups\":{},\"failed\":{}}}}}",
                string(&e.name),
                pid + 1,
                tid + 1,
                string(&e.executable),
                string(&e.thread),
                e.workgroups,
                e.failed
            );
            push(&mut out, line);
        }
        out.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
        out
    }

    /// Writes [`to_json`](Self::to_json) to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json()).map_err(|e| RuntimeError::Trace {
            path: path.display().to_string(),
            msg: e.to_string(),
        })
    }
}

impl TraceSink for ChromeTrace {
    fn record(&self, event: TraceEvent) {
        lock(&self.events).push(event);
    }
}

/// The device part of a queue name (`cpu` of `cpu:0`).
fn device_of(queue: &str) -> &str {
    queue.rsplit_once(':').map_or(queue, |(d, _)| d)
}

/// Microseconds with nanosecond precision, as a JSON number.
fn micros(d: std::time::Duration) -> String {
    let ns = d.as_nanos();
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(string("a\"b\\c\nd\u{1}é"), "\"a\\\"b\\\\c\\nd\\u0001é\"");
        assert_eq!(
            micros(std::time::Duration::from_nanos(1_234_567)),
            "1234.567"
        );
        assert_eq!(device_of("cpu:0"), "cpu");
        assert_eq!(device_of("gpu"), "gpu");
    }
}
