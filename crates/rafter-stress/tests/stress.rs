//! The runtime stress suite (issue 28, item 2): many sessions and calls in flight on the
//! CPU device and, when one opens, the Vulkan device (lavapipe in CI), on random
//! conformance models, every output checked against the reference executor, under a
//! watchdog that prints the in-flight state and fails the run if a call hangs.
//!
//! Environment: `RAFTER_CONFORMANCE_DIR` (the test is skipped, saying so, without it),
//! `RAFTER_STRESS_SECS` (default 60: the rounds' time; model selection adds up to ~40 s),
//! `RAFTER_STRESS_SEED` (default from the clock, printed to replay a failure),
//! `RAFTER_STRESS_DEADLINE_SECS` (default 120: the longest a call may take),
//! `RAFTER_STRESS_MODELS` (default 8 per target).

use std::time::Duration;

use rafter_stress::stress::{run, Config};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn many_sessions_many_calls_in_flight_match_the_reference_without_hang_or_leak() {
    let Some(dir) = std::env::var_os("RAFTER_CONFORMANCE_DIR") else {
        eprintln!("skipped: RAFTER_CONFORMANCE_DIR is not set");
        return;
    };
    let seed = env_u64("RAFTER_STRESS_SEED").unwrap_or_else(rafter_stress::rng::clock_seed);
    let config = Config {
        duration: Duration::from_secs(env_u64("RAFTER_STRESS_SECS").unwrap_or(60)),
        seed,
        vulkan: true,
        models_per_target: env_u64("RAFTER_STRESS_MODELS").unwrap_or(8) as usize,
        conformance_dir: dir.into(),
        deadline: Duration::from_secs(env_u64("RAFTER_STRESS_DEADLINE_SECS").unwrap_or(120)),
    };
    eprintln!("stress: seed {seed} (RAFTER_STRESS_SEED={seed} replays it)");
    let report = run(&config).expect("the stress run starts");
    eprintln!("stress: models: {:?}", report.models);
    eprintln!(
        "stress: {} rounds ({} with vulkan), {} calls, {} failures, RSS KiB: {} after selection, {} after round 1, {} at the end",
        report.rounds,
        report.vulkan_rounds,
        report.calls,
        report.failure_count,
        report.rss_start_kib,
        report.rss_first_round_kib,
        report.rss_end_kib
    );
    assert!(report.calls > 0, "no call ran");
    assert!(
        report.failures.is_empty(),
        "seed {seed}: {} calls failed, first: {:#?}",
        report.failure_count,
        report.failures
    );
    assert!(
        report.leaks.is_empty(),
        "seed {seed}: leaks: {:#?}",
        report.leaks
    );
}
