//! Concurrency stress of the Vulkan device's submission path (issue 28, items 1-3).
//!
//! Several host threads (a random number) keep a random number of *chains* in flight each.
//! A chain is 1-3 GPU copies through device-local buffers, ordered only by timeline
//! semaphores, submitted in a random order (so later steps are often deferred behind
//! earlier ones), started by a host signal on an own or a host (foreign) semaphore, with
//! an optional CPU hop in the middle (a host thread waits for the GPU step, then signals a
//! host semaphore the next GPU step waits on, as the runtime's CPU fallback does). Many
//! host threads therefore wait on GPU semaphores at once: the situation of the H100 stall.
//! Every chain's output is compared with its input; some chains are *faulted* (the start
//! semaphore fails instead of being signalled), and their end must fail with that reason,
//! their output untouched.
//!
//! A watchdog fails any chain not done within `DEADLINE` and prints the in-flight state:
//! every semaphore of the stuck chain with its value, failure, registered timepoints and
//! pending device signal. At the end, the device must hold no semaphore, batch or deferred
//! submission (`VulkanDevice::live_objects`): nothing leaks, faulted chains included.
//!
//! Duration: `RAFTER_STRESS_SECS` (default 15 s, what `cargo test` runs); the seed:
//! `RAFTER_STRESS_SEED` (default: from the clock, printed so a failure can be replayed).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rafter_hal::{Buffer, Device, MemoryKind, Queue, Semaphore, SemaphoreError};
use rafter_hal_vulkan::VulkanDevice;

/// The longest one chain may take before the watchdog fails the test (lavapipe under a
/// loaded 2-core CI machine takes milliseconds; a hang takes forever).
const DEADLINE: Duration = Duration::from_secs(60);

/// A small xorshift generator: reproducible from the printed seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// One chain in flight.
struct Chain {
    /// Started by the host: signalled to 1, or failed (a faulted chain).
    go: Semaphore,
    faulted: bool,
    /// Every semaphore of the chain in order, for the watchdog's report.
    semaphores: Vec<(String, Semaphore, u64)>,
    done: (Semaphore, u64),
    expected: Vec<u8>,
    output: Buffer,
    /// The CPU hop's thread, if the chain has one.
    hop: Option<std::thread::JoinHandle<()>>,
}

impl Chain {
    fn state(&self) -> String {
        self.semaphores
            .iter()
            .map(|(name, s, v)| {
                format!(
                    "  {name}: waits for {v}, value {}, failure {:?}, {s:?}\n",
                    s.value(),
                    s.failure()
                )
            })
            .collect()
    }
}

fn copy(device: &VulkanDevice, src: &Buffer, dst: &Buffer) -> rafter_hal::CommandBuffer {
    let mut builder = device.create_command_buffer().unwrap();
    builder.copy(src.whole(), dst.whole()).unwrap();
    builder.finish()
}

/// Builds and submits one chain (nothing runs until `go` is signalled).
fn start_chain(device: &VulkanDevice, queues: &[Queue], rng: &mut Rng, id: u64) -> Chain {
    let len = 4 * rng.range(1, 4096) as usize;
    let data = pattern(len, id);
    let steps = rng.range(1, 3) as usize;
    let input = device
        .allocate(len as u64, MemoryKind::HostVisibleShared)
        .unwrap();
    input.write_bytes(0, &data).unwrap();
    let mut buffers = vec![input];
    for _ in 1..steps {
        buffers.push(
            device
                .allocate(len as u64, MemoryKind::DeviceLocal)
                .unwrap(),
        );
    }
    let output = device.allocate(len as u64, MemoryKind::Host).unwrap();
    output.write_bytes(0, &vec![0u8; len]).unwrap();
    buffers.push(output.clone());

    let go = if rng.chance(50) {
        device.create_semaphore(0).unwrap()
    } else {
        Semaphore::host(0)
    };
    let mut semaphores = vec![("go".to_string(), go.clone(), 1)];
    // Step i waits on `waits[i]` and signals `signals[i]`; values are random, increasing.
    let mut waits = vec![(go.clone(), 1)];
    let mut signals = Vec::new();
    let mut hop = None;
    for step in 0..steps {
        let signal = (device.create_semaphore(0).unwrap(), rng.range(1, 1 << 40));
        semaphores.push((format!("step {step}"), signal.0.clone(), signal.1));
        signals.push(signal.clone());
        if step + 1 < steps {
            if rng.chance(30) && hop.is_none() {
                // A CPU hop: a host thread waits for this step, then signals the next one's
                // host semaphore (or fails it, passing the failure on).
                let relay = Semaphore::host(0);
                semaphores.push((format!("cpu hop after step {step}"), relay.clone(), 1));
                let (from, at) = signal.clone();
                let to = relay.clone();
                hop = Some(std::thread::spawn(move || match from.wait(at, DEADLINE) {
                    Ok(()) => to.signal(1).unwrap(),
                    Err(SemaphoreError::Failed(reason)) => to.fail(reason),
                    Err(other) => to.fail(format!("cpu hop: {other}")),
                }));
                waits.push((relay, 1));
            } else {
                waits.push(signal);
            }
        }
    }
    let mut order: Vec<usize> = (0..steps).collect();
    if rng.chance(50) {
        order.reverse();
    }
    for step in order {
        let queue = &queues[rng.range(0, queues.len() as u64 - 1) as usize];
        queue
            .submit(
                &copy(device, &buffers[step], &buffers[step + 1]),
                &[waits[step].clone()],
                &[signals[step].clone()],
            )
            .unwrap();
    }
    Chain {
        go,
        faulted: rng.chance(10),
        semaphores,
        done: signals.last().unwrap().clone(),
        expected: data,
        output,
        hop,
    }
}

/// Waits for a chain and checks it; a chain past the deadline fails with the state.
fn finish_chain(chain: Chain, worker: usize) {
    let (done, value) = &chain.done;
    let result = done.wait(*value, DEADLINE);
    let len = chain.expected.len() as u64;
    if chain.faulted {
        assert_eq!(
            result,
            Err(SemaphoreError::Failed("injected: start failed".into())),
            "worker {worker}: a faulted chain must fail with the injected reason\n{}",
            chain.state()
        );
        assert!(
            chain
                .output
                .read_bytes(0, len)
                .unwrap()
                .iter()
                .all(|&b| b == 0),
            "worker {worker}: a faulted chain's copies must not run"
        );
    } else {
        if let Err(error) = &result {
            panic!(
                "worker {worker}: chain failed or stalled: {error}\nin-flight state:\n{}",
                chain.state()
            );
        }
        assert!(
            chain.output.read_bytes(0, len).unwrap() == chain.expected,
            "worker {worker}: a chain's output differs from its input"
        );
    }
    if let Some(hop) = chain.hop {
        hop.join().unwrap();
    }
}

#[test]
fn many_threads_many_chains_in_flight_complete_checked_or_fail_cleanly() {
    let Some(device) = common::device_or_skip("stress") else {
        return;
    };
    let device = Arc::new(device);
    let secs = env_u64("RAFTER_STRESS_SECS").unwrap_or(15);
    let seed = env_u64("RAFTER_STRESS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    let mut rng = Rng(seed);
    let threads = rng.range(2, 8) as usize;
    eprintln!("stress: seed {seed}, {threads} threads, {secs} s (RAFTER_STRESS_SEED to replay)");
    let queues: Vec<Queue> = (0..device.queue_count())
        .map(|i| device.queue(i).unwrap())
        .collect();
    let end = Instant::now() + Duration::from_secs(secs);
    let chains = Arc::new(AtomicU64::new(0));
    let faulted = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    // A last resort should a host wait ignore its deadline: the process must not hang CI.
    let watchdog = {
        let finished = finished.clone();
        let limit = Duration::from_secs(secs) + DEADLINE * 2;
        std::thread::spawn(move || {
            let start = Instant::now();
            while !finished.load(Ordering::Acquire) {
                if start.elapsed() > limit {
                    eprintln!("stress: still running after {limit:?}: a wait ignored its deadline");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|worker| {
            let device = device.clone();
            let queues = queues.clone();
            let chains = chains.clone();
            let faulted = faulted.clone();
            let mut rng = Rng(seed ^ (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            std::thread::spawn(move || {
                let mut id = (worker as u64) << 32;
                while Instant::now() < end {
                    let in_flight = rng.range(1, 6);
                    let batch: Vec<Chain> = (0..in_flight)
                        .map(|_| {
                            id += 1;
                            start_chain(&device, &queues, &mut rng, id)
                        })
                        .collect();
                    for chain in &batch {
                        if chain.faulted {
                            chain.go.fail("injected: start failed");
                        } else {
                            chain.go.signal(1).unwrap();
                        }
                    }
                    for chain in batch {
                        chains.fetch_add(1, Ordering::Relaxed);
                        faulted.fetch_add(u64::from(chain.faulted), Ordering::Relaxed);
                        finish_chain(chain, worker);
                    }
                }
            })
        })
        .collect();
    let mut panicked = None;
    for worker in workers {
        if let Err(panic) = worker.join() {
            panicked.get_or_insert(panic);
        }
    }
    finished.store(true, Ordering::Release);
    watchdog.join().unwrap();
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    // Nothing leaks: with every chain's handles gone, the device holds no semaphore, no
    // deferred submission, and releases every completed batch within its grace.
    let settle = Instant::now();
    loop {
        let live = device.live_objects();
        if live == (0, 0, 0) {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(5),
            "the device still holds (semaphores, batches, deferred) = {live:?} after every \
             chain's handles were dropped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let total = chains.load(Ordering::Relaxed);
    eprintln!(
        "stress: {total} chains ({} faulted) on {threads} threads in {secs} s",
        faulted.load(Ordering::Relaxed)
    );
    assert!(total > 0);
}
