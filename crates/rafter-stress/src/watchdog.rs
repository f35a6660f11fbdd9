//! A watchdog over calls in flight: a hang becomes a failure with a diagnosis.
//!
//! Each call is registered with the semaphores its completion waits on
//! ([`CallHandle::semaphores`](rafter_runtime::CallHandle::semaphores)). A thread checks
//! the registry; when a call passes the deadline it prints, for every call in flight, its
//! age and each semaphore's value, target and failure, then every device's
//! [`describe`](rafter_hal::Device::describe) dump, and ends the process with status 3: a
//! hung call cannot be cancelled, and a stress test must fail, not stall.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rafter_hal::{Device, Semaphore};

struct Entry {
    label: String,
    started: Instant,
    semaphores: Vec<(Semaphore, u64)>,
}

#[derive(Default)]
struct State {
    calls: Mutex<HashMap<u64, Entry>>,
    devices: Mutex<Vec<(String, Arc<dyn Device>)>>,
    next: AtomicU64,
    stop: AtomicBool,
}

/// The registry of calls in flight, and the thread that watches it (stopped on drop).
pub struct Watchdog {
    state: Arc<State>,
    deadline: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A registered call; unregisters on drop.
pub struct Watched {
    state: Arc<State>,
    id: u64,
}

impl Drop for Watched {
    fn drop(&mut self) {
        lock(&self.state.calls).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watchdog {
    /// Starts watching: any call registered longer than `deadline` ends the process.
    pub fn start(deadline: Duration) -> Watchdog {
        let state = Arc::new(State::default());
        let watched = state.clone();
        let thread = std::thread::Builder::new()
            .name("rafter-stress-watchdog".into())
            .spawn(move || {
                while !watched.stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(200));
                    let late = lock(&watched.calls)
                        .values()
                        .any(|e| e.started.elapsed() > deadline);
                    if late {
                        eprintln!("{}", dump(&watched, deadline));
                        std::process::exit(3);
                    }
                }
            })
            .expect("spawning the watchdog thread");
        Watchdog {
            state,
            deadline,
            thread: Some(thread),
        }
    }

    /// The deadline a call has.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Sets the devices whose state a dump prints.
    pub fn set_devices(&self, devices: Vec<(String, Arc<dyn Device>)>) {
        *lock(&self.state.devices) = devices;
    }

    /// Registers a call until the returned guard is dropped.
    pub fn watch(&self, label: String, semaphores: &[(Semaphore, u64)]) -> Watched {
        let id = self.state.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.state.calls).insert(
            id,
            Entry {
                label,
                started: Instant::now(),
                semaphores: semaphores.to_vec(),
            },
        );
        Watched {
            state: self.state.clone(),
            id,
        }
    }

    /// Calls registered now.
    pub fn in_flight(&self) -> usize {
        lock(&self.state.calls).len()
    }

    /// What the watchdog would print now.
    pub fn dump(&self) -> String {
        dump(&self.state, self.deadline)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn dump(state: &State, deadline: Duration) -> String {
    let mut out =
        format!("watchdog: a call passed its deadline of {deadline:?}; calls in flight:\n");
    let calls = lock(&state.calls);
    let mut entries: Vec<_> = calls.values().collect();
    entries.sort_by_key(|e| e.started);
    for e in entries {
        let _ = writeln!(out, "- {} (for {:?})", e.label, e.started.elapsed());
        for (s, target) in &e.semaphores {
            let _ = writeln!(
                out,
                "    waits for {target}: value {}, failure {:?}, {s:?}",
                s.value(),
                s.failure()
            );
        }
    }
    drop(calls);
    out.push_str("devices:\n");
    for (name, device) in lock(&state.devices).iter() {
        let _ = writeln!(out, "- {name}: {}", device.describe());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dump_names_each_call_and_what_its_semaphores_wait_for() {
        let watchdog = Watchdog::start(Duration::from_secs(3600));
        let stuck = Semaphore::host(0);
        let failed = Semaphore::host(0);
        failed.fail("kernel `relu_0` failed");
        let guard = watchdog.watch(
            "node/test_relu on cpu".into(),
            &[(stuck.clone(), 7), (failed, 1)],
        );
        let dump = watchdog.dump();
        assert!(dump.contains("- node/test_relu on cpu (for "), "{dump}");
        assert!(
            dump.contains("waits for 7: value 0, failure None"),
            "{dump}"
        );
        assert!(
            dump.contains("failure Some(\"kernel `relu_0` failed\")"),
            "{dump}"
        );
        assert_eq!(watchdog.in_flight(), 1);
        drop(guard);
        assert_eq!(watchdog.in_flight(), 0);
        assert!(!watchdog.dump().contains("test_relu"));
    }
}
