//! Breadcrumbs (issue 28's hang diagnostic): the GPU's progress markers read back after a
//! completed batch, and in the report while a batch waits on the GPU for another.
//!
//! A batch waiting for a *host* signal never reaches the GPU here (the scheduler keeps it
//! host-side until the value is resolvable, queue.rs), so "not started" is shown by a batch
//! waiting on the GPU for a long batch ahead of it: 16 copies of 64 MiB, hundreds of
//! milliseconds on lavapipe.

#[allow(dead_code)] // not every test file uses every helper
mod common;

use std::time::{Duration, Instant};

use rafter_hal::{CommandBuffer, Device, FillPattern, MemoryKind};
use rafter_hal_vulkan::{BreadcrumbMode, VulkanDevice, VulkanDeviceOptions};

const WAIT: Duration = Duration::from_secs(60);
const BIG: u64 = 64 << 20;
const COPIES: usize = 16;

fn device(test: &str, mode: BreadcrumbMode) -> Option<common::Checked> {
    common::device_with_or_skip(
        test,
        VulkanDeviceOptions {
            breadcrumbs: Some(mode),
            ..Default::default()
        },
    )
}

/// fill 4096, barrier, copy 4096, fill 8: four HAL commands, three markers.
fn small_batch(device: &VulkanDevice) -> CommandBuffer {
    let a = device.allocate(4096, MemoryKind::DeviceLocal).unwrap();
    let b = device.allocate(4096, MemoryKind::Host).unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    builder.fill(a.whole(), FillPattern::U32(7)).unwrap();
    builder.barrier();
    builder.copy(a.whole(), b.whole()).unwrap();
    builder
        .fill(b.range(0, 8).unwrap(), FillPattern::U8(1))
        .unwrap();
    builder.finish()
}

/// `COPIES` copies of `BIG` bytes, each behind a barrier.
fn long_batch(device: &VulkanDevice) -> CommandBuffer {
    let a = device.allocate(BIG, MemoryKind::DeviceLocal).unwrap();
    let b = device.allocate(BIG, MemoryKind::DeviceLocal).unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    for i in 0..COPIES {
        if i > 0 {
            builder.barrier();
        }
        builder.copy(a.whole(), b.whole()).unwrap();
    }
    builder.finish()
}

/// The report's lines for each in-flight batch (from "in flight seq" to the next).
fn batches(report: &str) -> Vec<String> {
    report
        .split("  in flight seq ")
        .skip(1)
        .map(|s| s.split("\n  semaphore ").next().unwrap_or(s).to_string())
        .collect()
}

#[test]
fn a_completed_batch_reads_started_and_finished_n_of_n() {
    let Some(device) = device("breadcrumbs_completed", BreadcrumbMode::Reuse) else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let commands = small_batch(&device);
    assert_eq!(device.breadcrumbs(&commands), None, "never submitted");
    let done = device.create_semaphore(0).unwrap();
    for round in 1..=2u64 {
        queue
            .submit(&commands, &[], &[(done.clone(), round)])
            .unwrap();
        done.wait(round, WAIT).unwrap();
        assert_eq!(
            device.breadcrumbs(&commands).as_deref(),
            Some("started: yes, last finished command #3 of 4 (fill 8), 4 of 4 done; finished"),
            "round {round}"
        );
    }
}

#[test]
fn a_batch_waiting_on_the_gpu_reads_not_started() {
    let Some(device) = device("breadcrumbs_not_started", BreadcrumbMode::Reuse) else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let long = long_batch(&device);
    let small = small_batch(&device);
    let first = device.create_semaphore(0).unwrap();
    let second = device.create_semaphore(0).unwrap();
    queue.submit(&long, &[], &[(first.clone(), 1)]).unwrap();
    queue
        .submit(&small, &[(first.clone(), 1)], &[(second.clone(), 1)])
        .unwrap();
    let start = Instant::now();
    let mut seen_running = false;
    let mut polls = 0;
    while first.value() < 1 && start.elapsed() < WAIT {
        let report = device.describe();
        if first.value() >= 1 {
            break; // the report may have been taken after the long batch completed
        }
        let flying = batches(&report);
        assert_eq!(flying.len(), 2, "{report}");
        polls += 1;
        let waiting = flying.iter().find(|b| b.contains("fill 8")).expect("small");
        assert!(
            waiting.contains("breadcrumbs: submission started: no")
                && waiting.contains(
                    "breadcrumbs: command buffer started: no, last finished command none of 4"
                )
                && waiting.contains("in flight in no other batch"),
            "{report}"
        );
        let running = flying.iter().find(|b| !b.contains("fill 8")).expect("long");
        if running.contains("submission started: yes, finished: no")
            && running.contains("running or next: #")
        {
            seen_running = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    second.wait(1, WAIT).unwrap();
    assert!(polls > 0, "the long batch finished before the first report");
    assert!(
        seen_running,
        "never saw the long batch started and unfinished"
    );
    let n = 2 * COPIES - 1;
    assert_eq!(
        device.breadcrumbs(&long),
        Some(format!(
            "started: yes, last finished command #{} of {n} (copy {BIG}), {n} of {n} done; \
             finished",
            n - 1
        ))
    );
    assert!(device
        .breadcrumbs(&small)
        .is_some_and(|s| s.contains("4 of 4 done")));
}

/// One command buffer in flight twice: flagged in reuse mode; rerecord mode gives each
/// submission its own `VkCommandBuffer`.
fn twice_in_flight(mode: BreadcrumbMode) -> String {
    let Some(device) = device("breadcrumbs_twice", mode) else {
        return String::new();
    };
    let queue = device.queue(0).unwrap();
    let long = long_batch(&device);
    let done = device.create_semaphore(0).unwrap();
    queue.submit(&long, &[], &[(done.clone(), 1)]).unwrap();
    queue.submit(&long, &[], &[(done.clone(), 2)]).unwrap();
    let report = device.describe();
    let flying = done.value() == 0;
    done.wait(2, WAIT).unwrap();
    if flying {
        report
    } else {
        String::new() // the first completed before the report: nothing to check
    }
}

#[test]
fn a_command_buffer_in_flight_twice_is_flagged_in_reuse_mode_only() {
    let report = twice_in_flight(BreadcrumbMode::Reuse);
    if !report.is_empty() {
        for batch in batches(&report) {
            assert!(batch.contains("ALSO IN FLIGHT in seq"), "{report}");
        }
    }
    let report = twice_in_flight(BreadcrumbMode::Rerecord);
    if !report.is_empty() {
        for batch in batches(&report) {
            assert!(batch.contains("in flight in no other batch"), "{report}");
            assert!(
                batch.contains("breadcrumbs: command buffer started"),
                "{report}"
            );
        }
    }
}

#[test]
fn off_adds_nothing() {
    let Some(device) = device("breadcrumbs_off", BreadcrumbMode::Off) else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let long = long_batch(&device);
    let done = device.create_semaphore(0).unwrap();
    queue.submit(&long, &[], &[(done.clone(), 1)]).unwrap();
    let report = device.describe();
    done.wait(1, WAIT).unwrap();
    assert!(!report.contains("breadcrumbs:"), "{report}");
    assert_eq!(device.breadcrumbs(&long), None);
}
