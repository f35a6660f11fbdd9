//! The stress run: rounds of sessions on fresh devices, many calls in flight, each output
//! checked against the reference executor, under the [`Watchdog`].
//!
//! Each round draws its shape at random from the seed: CPU worker threads (1-3), host
//! threads (1-4), calls a host thread keeps in flight (1-4, each on a random session and
//! data set, waited in a random order), sessions per model (1-2) and whether the Vulkan
//! device takes part. After a round every session must report no call in flight, and once
//! the sessions are gone the devices must hold nothing: no CPU buffer byte, no Vulkan
//! semaphore, batch or deferred submission.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rafter_hal::Device;
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};
use rafter_runtime::{DeviceSet, Session};

use crate::models::{self, Model};
use crate::rng::Rng;
use crate::rss::rss_kib;
use crate::watchdog::Watchdog;

/// What a run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long the rounds run (model selection comes on top).
    pub duration: Duration,
    pub seed: u64,
    /// Sessions on the Vulkan device too (if one opens).
    pub vulkan: bool,
    /// Models drawn per target.
    pub models_per_target: usize,
    /// The conformance data (`RAFTER_CONFORMANCE_DIR`).
    pub conformance_dir: PathBuf,
    /// The longest one call may take before the watchdog ends the run.
    pub deadline: Duration,
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct Report {
    pub rounds: u64,
    pub calls: u64,
    /// Calls whose output differed from the reference or that returned an error (first 20
    /// messages; `failure_count` has them all).
    pub failures: Vec<String>,
    pub failure_count: u64,
    /// Objects left behind after a round.
    pub leaks: Vec<String>,
    /// The models, `target: kind/test`.
    pub models: Vec<String>,
    /// Resident memory in KiB after model selection, after the first round, and at the end.
    pub rss_start_kib: u64,
    pub rss_first_round_kib: u64,
    pub rss_end_kib: u64,
    /// Whether any round had the Vulkan device.
    pub vulkan_rounds: u64,
}

/// Runs the stress rounds. Errors: no conformance data, or no model qualified.
pub fn run(config: &Config) -> Result<Report, String> {
    let mut rng = Rng::new(config.seed);
    let cases: Vec<_> = rafter_conformance::discover(&config.conformance_dir, None)?
        .into_iter()
        .filter(|c| c.kind != "light")
        .collect();
    let pick_budget = Duration::from_secs(20);
    let cpu_models = {
        let devices = cpu_set(2).1;
        models::pick(
            &cases,
            "cpu",
            &devices,
            &mut rng,
            config.models_per_target,
            pick_budget,
            1 << 20,
        )
    };
    let vulkan_models = if config.vulkan {
        pick_vulkan(&cases, &mut rng, config, pick_budget)
    } else {
        Vec::new()
    };
    if cpu_models.is_empty() {
        return Err("no conformance model qualified for the stress run".into());
    }
    let mut report = Report {
        models: cpu_models
            .iter()
            .chain(&vulkan_models)
            .map(|m| format!("{}: {}", m.target, m.name))
            .collect(),
        rss_start_kib: rss_kib().unwrap_or(0),
        ..Report::default()
    };
    let watchdog = Watchdog::start(config.deadline);
    let start = Instant::now();
    while start.elapsed() < config.duration {
        let left = config.duration.saturating_sub(start.elapsed());
        let round_len = Duration::from_secs(rng.range(3, 12) as u64).min(left);
        let use_vulkan = !vulkan_models.is_empty() && rng.chance(50);
        let models: Vec<&Model> = cpu_models
            .iter()
            .chain(if use_vulkan { &vulkan_models[..] } else { &[] })
            .collect();
        round(
            &watchdog,
            &models,
            use_vulkan,
            round_len,
            &mut rng,
            &mut report,
        )?;
        report.rounds += 1;
        report.vulkan_rounds += use_vulkan as u64;
        if report.rounds == 1 {
            report.rss_first_round_kib = rss_kib().unwrap_or(0);
        }
    }
    report.rss_end_kib = rss_kib().unwrap_or(0);
    Ok(report)
}

/// A CPU device of `workers` threads, and a set holding it.
fn cpu_set(workers: usize) -> (Arc<CpuDevice>, DeviceSet) {
    let device = Arc::new(
        CpuDevice::new(CpuDeviceOptions {
            worker_threads: workers,
            ..CpuDeviceOptions::default()
        })
        .expect("the CPU device opens"),
    );
    let set = DeviceSet::new()
        .with("cpu", device.clone() as Arc<dyn Device>)
        .with_loader(rafter_runtime_cpu::loader());
    (device, set)
}

#[cfg(feature = "vulkan")]
type VulkanHandle = Arc<rafter_hal_vulkan::VulkanDevice>;
#[cfg(not(feature = "vulkan"))]
type VulkanHandle = ();

/// Adds the Vulkan device to `set`, if one opens.
fn add_vulkan(set: &mut DeviceSet) -> Option<VulkanHandle> {
    #[cfg(feature = "vulkan")]
    {
        rafter_runtime_vulkan::add_device(set, Default::default()).ok()
    }
    #[cfg(not(feature = "vulkan"))]
    {
        let _ = set;
        None
    }
}

/// Vulkan models: those with at least one kernel on the Vulkan device.
fn pick_vulkan(
    cases: &[rafter_conformance::TestCase],
    rng: &mut Rng,
    config: &Config,
    budget: Duration,
) -> Vec<Model> {
    let (_cpu, mut devices) = cpu_set(2);
    if add_vulkan(&mut devices).is_none() {
        eprintln!("stress: no Vulkan device opens; CPU only");
        return Vec::new();
    }
    models::pick(
        cases,
        "vulkan",
        &devices,
        rng,
        config.models_per_target * 2,
        budget,
        1 << 20,
    )
    .into_iter()
    .filter(|m| m.gpu_kernels() > 0)
    .take(config.models_per_target)
    .collect()
}

/// One round: fresh devices and sessions, host threads driving calls until `len` passes,
/// then the leak checks.
fn round(
    watchdog: &Watchdog,
    models: &[&Model],
    use_vulkan: bool,
    len: Duration,
    rng: &mut Rng,
    report: &mut Report,
) -> Result<(), String> {
    let workers = rng.range(1, 3);
    let host_threads = rng.range(1, 4);
    let max_in_flight = rng.range(1, 4);
    let (cpu, mut devices) = cpu_set(workers);
    let vulkan = if use_vulkan {
        add_vulkan(&mut devices)
    } else {
        None
    };
    #[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
    let mut watched: Vec<(String, Arc<dyn Device>)> = vec![("cpu".into(), cpu.clone())];
    #[cfg(feature = "vulkan")]
    if let Some(v) = &vulkan {
        watched.push(("vulkan".into(), v.clone()));
    }
    watchdog.set_devices(watched);
    let mut sessions: Vec<(usize, Session)> = Vec::new();
    for (i, model) in models.iter().enumerate() {
        for _ in 0..rng.range(1, 2) {
            sessions.push((i, model.session(&devices)?));
        }
    }
    let calls = AtomicU64::new(0);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let end = Instant::now() + len;
    let seeds: Vec<u64> = (0..host_threads).map(|_| rng.next_u64()).collect();
    std::thread::scope(|s| {
        for seed in &seeds {
            let (sessions, calls, failures) = (&sessions, &calls, &failures);
            s.spawn(move || {
                let mut rng = Rng::new(*seed);
                while Instant::now() < end {
                    let n = rng.range(1, max_in_flight);
                    let mut batch = Vec::new();
                    for _ in 0..n {
                        let (m, session) = &sessions[rng.range(0, sessions.len() - 1)];
                        let model = models[*m];
                        let set = rng.range(0, model.sets.len() - 1);
                        let label = format!("{} on {} (data set {set})", model.name, model.target);
                        match session.submit(model.sets[set].inputs.clone()) {
                            Ok(handle) => {
                                let guard = watchdog.watch(label.clone(), handle.semaphores());
                                batch.push((label, model, set, handle, guard));
                            }
                            Err(e) => failures
                                .lock()
                                .unwrap()
                                .push(format!("{label}: submit: {e}")),
                        }
                    }
                    rng.shuffle(&mut batch);
                    for (label, model, set, handle, guard) in batch {
                        let result = handle
                            .wait(watchdog.deadline() + Duration::from_secs(5))
                            .map_err(|e| e.to_string())
                            .and_then(|outputs| model.check(set, &outputs));
                        drop(guard);
                        calls.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = result {
                            failures.lock().unwrap().push(format!("{label}: {e}"));
                        }
                    }
                }
            });
        }
    });
    let round_calls = calls.into_inner();
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "stress: round {}: {} cpu workers, {host_threads} host threads, <= {max_in_flight} in flight each, {} sessions{}: {round_calls} calls, {} failures, RSS {} KiB",
        report.rounds + 1,
        workers,
        sessions.len(),
        if vulkan.is_some() { " (with vulkan)" } else { "" },
        failures.len(),
        rss_kib().unwrap_or(0)
    );
    report.calls += round_calls;
    report.failure_count += failures.len() as u64;
    for f in failures {
        if report.failures.len() < 20 {
            report.failures.push(f);
        }
    }
    // A call's bookkeeping ends in a completion callback that may run just after its
    // waiter returned (on the Vulkan device, on the semaphore monitor's thread): give the
    // callbacks the same grace as the devices' releases before calling it a leak.
    let grace = Instant::now();
    while sessions.iter().any(|(_, s)| s.calls_in_flight() != 0)
        && grace.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for (m, session) in &sessions {
        if session.calls_in_flight() != 0 {
            report.leaks.push(format!(
                "round {}: a session of {} still has {} calls in flight",
                report.rounds + 1,
                models[*m].name,
                session.calls_in_flight()
            ));
        }
    }
    drop(sessions);
    drop(devices);
    watchdog.set_devices(Vec::new());
    if let Some(leak) = wait_released(&cpu, vulkan.as_ref()) {
        report
            .leaks
            .push(format!("round {}: {leak}", report.rounds + 1));
    }
    Ok(())
}

/// Waits up to 5 s for the devices to hold nothing; the leak if they still do.
fn wait_released(cpu: &CpuDevice, vulkan: Option<&VulkanHandle>) -> Option<String> {
    let start = Instant::now();
    loop {
        let mut leak = None;
        if cpu.allocated_bytes() != 0 {
            leak = Some(format!(
                "the CPU device still holds {} bytes",
                cpu.allocated_bytes()
            ));
        }
        #[cfg(feature = "vulkan")]
        if let Some(v) = vulkan {
            let live = v.live_objects();
            if live != (0, 0, 0) {
                leak = Some(format!(
                    "the Vulkan device still holds (semaphores, batches, deferred) = {live:?}"
                ));
            }
        }
        #[cfg(not(feature = "vulkan"))]
        let _ = vulkan;
        if leak.is_none() || start.elapsed() > Duration::from_secs(5) {
            return leak;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
