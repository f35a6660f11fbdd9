//! `Semaphore::wait_direct` on Vulkan semaphores: the waiting thread sleeps in the driver
//! itself, woken by the GPU's signal, or by the device's wake semaphore on a failure or a
//! device loss; `None` when nothing submitted will signal the value. And the spin that
//! comes first (`VulkanDeviceOptions::spin_wait`): a poll of the counter, bounded per wait.

mod common;

use std::time::{Duration, Instant};

use rafter_hal::{Device, FillPattern, MemoryKind, Semaphore, SemaphoreError};
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions};

const WAIT: Duration = Duration::from_secs(60);

fn direct(test: &str, on: bool) -> Option<common::Checked> {
    common::device_with_or_skip(
        test,
        VulkanDeviceOptions {
            direct_waits: Some(on),
            // These tests are about the sleep in the driver: no spin before it, whatever
            // the environment says.
            spin_wait: Some(Duration::ZERO),
            ..Default::default()
        },
    )
}

/// A device whose waiters poll for `spin` before they sleep, with direct waits off (a
/// spent budget then answers `None`, as on a GPU by default).
fn spinning(test: &str, spin: Duration) -> Option<common::Checked> {
    common::device_with_or_skip(
        test,
        VulkanDeviceOptions {
            direct_waits: Some(false),
            spin_wait: Some(spin),
            ..Default::default()
        },
    )
}

/// Slow commands that take at least `at_least` on this device (measured), and how long.
fn calibrated_slow_commands(
    device: &VulkanDevice,
    at_least: Duration,
) -> (rafter_hal::CommandBuffer, Duration) {
    let queue = device.queue(0).unwrap();
    let mut rounds = 4;
    loop {
        let commands = common::slow_commands(device, 64 << 20, rounds);
        let done = device.create_semaphore(0).unwrap();
        let start = Instant::now();
        queue.submit(&commands, &[], &[(done.clone(), 1)]).unwrap();
        done.wait(1, WAIT).unwrap();
        let took = start.elapsed();
        if took >= at_least || rounds >= 1024 {
            return (commands, took);
        }
        rounds *= 2;
    }
}

#[test]
fn a_direct_wait_needs_submitted_work_and_returns_once_the_gpu_signals() {
    let Some(device) = direct("a_direct_wait_needs_submitted_work", true) else {
        return;
    };
    let semaphore = device.create_semaphore(0).unwrap();
    // Nothing submitted signals 1 (the host might, later): no direct wait, at once.
    let start = Instant::now();
    assert!(semaphore.wait_direct(1, WAIT).is_none());
    assert!(Semaphore::host(0).wait_direct(1, WAIT).is_none());
    assert!(start.elapsed() < Duration::from_secs(1));

    let queue = device.queue(0).unwrap();
    queue
        .submit(
            &common::slow_commands(&device, 64 << 20, 8),
            &[],
            &[(semaphore.clone(), 1)],
        )
        .unwrap();
    match semaphore.wait_direct(1, WAIT) {
        Some(Ok(())) => {}
        other => panic!("{other:?}"),
    }
    assert!(semaphore.value() >= 1);
    // Reached: answered at once, from the counter.
    assert!(matches!(
        semaphore.wait_direct(1, Duration::ZERO),
        Some(Ok(()))
    ));

    // With direct waits off the caller is told to wait some other way.
    let Some(off) = direct("a_direct_wait_needs_submitted_work (off)", false) else {
        return;
    };
    let later = off.create_semaphore(0).unwrap();
    off.queue(0)
        .unwrap()
        .submit(
            &common::slow_commands(&off, 64 << 20, 1),
            &[],
            &[(later.clone(), 1)],
        )
        .unwrap();
    assert!(later.wait_direct(1, WAIT).is_none());
    later.wait(1, WAIT).unwrap();
}

#[test]
fn a_direct_wait_times_out_while_the_gpu_is_still_busy() {
    let Some(device) = direct("a_direct_wait_times_out", true) else {
        return;
    };
    let (commands, took) = calibrated_slow_commands(&device, Duration::from_millis(300));
    let semaphore = device.create_semaphore(0).unwrap();
    let start = Instant::now();
    device
        .queue(0)
        .unwrap()
        .submit(&commands, &[], &[(semaphore.clone(), 1)])
        .unwrap();
    let result = semaphore.wait_direct(1, Duration::from_millis(5));
    if start.elapsed() < took / 2 {
        match result {
            Some(Err(SemaphoreError::Timeout { value: 1, .. })) => {}
            other => panic!("{other:?}"),
        }
    } else {
        eprintln!("inconclusive: this thread ran too late to see the GPU busy");
    }
    semaphore.wait(1, WAIT).unwrap();
}

/// The waiter sleeps in the driver on the semaphore and the device's wake semaphore, so a
/// host-side failure (which the driver never sees) or a device loss ends its wait long
/// before the GPU's work would have.
fn ends_early(test: &str, end: impl FnOnce(&VulkanDevice, &Semaphore), expect: &str) {
    let Some(device) = direct(test, true) else {
        return;
    };
    let wait = |s: &Semaphore| {
        s.wait_direct(1, WAIT)
            .expect("a direct wait without a spin sleeps in the driver, never hands back")
    };
    check_ended_early(&device, wait, end, expect);
}

/// Submits ~400 ms of work that signals a semaphore, waits for it with `wait` on another
/// thread, ends the wait with `end` 20 ms in, and checks that `wait` returned the failure
/// (its reason holding `expect`) long before the work could have finished.
fn check_ended_early(
    device: &VulkanDevice,
    wait: fn(&Semaphore) -> Result<(), SemaphoreError>,
    end: impl FnOnce(&VulkanDevice, &Semaphore),
    expect: &str,
) {
    let (commands, took) = calibrated_slow_commands(device, Duration::from_millis(400));
    let semaphore = device.create_semaphore(0).unwrap();
    device
        .queue(0)
        .unwrap()
        .submit(&commands, &[], &[(semaphore.clone(), 1)])
        .unwrap();
    let submitted = Instant::now();
    let waiter = {
        let semaphore = semaphore.clone();
        std::thread::spawn(move || (wait(&semaphore), Instant::now()))
    };
    std::thread::sleep(Duration::from_millis(20));
    let ended = Instant::now();
    end(device, &semaphore);
    let (result, returned) = waiter.join().unwrap();
    match result {
        Err(SemaphoreError::Failed(reason)) => assert!(reason.contains(expect), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Ended by the failure, not by the GPU's signal: well before the work could finish
    // (when the failure came early enough to tell).
    if ended - submitted < took / 2 {
        assert!(
            returned - ended < took / 2,
            "returned {:?} after the failure; the work takes {took:?}",
            returned - ended
        );
    }
}

#[test]
fn a_direct_wait_ends_when_the_semaphore_fails_meanwhile() {
    ends_early(
        "a_direct_wait_ends_when_the_semaphore_fails_meanwhile",
        |_, semaphore| semaphore.fail("stopped by the test"),
        "stopped by the test",
    );
}

#[test]
fn a_direct_wait_ends_when_the_device_is_lost_meanwhile() {
    ends_early(
        "a_direct_wait_ends_when_the_device_is_lost_meanwhile",
        |device, _| device.inject_device_loss("test"),
        "device lost",
    );
}

/// A spinning wait sees a value the GPU reaches within its budget; a wait for longer work
/// polls in the caller's slices until the budget is spent, then hands the wait back
/// (`None`), long before the work ends; a host wait for that work still completes.
#[test]
fn a_spinning_wait_returns_the_value_or_hands_back_once_its_budget_is_spent() {
    let budget = Duration::from_millis(60);
    let Some(device) = spinning("a_spinning_wait_returns_the_value", budget) else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let quick = device.create_semaphore(0).unwrap();
    queue
        .submit(
            &common::slow_commands(&device, 1 << 20, 1),
            &[],
            &[(quick.clone(), 1)],
        )
        .unwrap();
    // Within a budget of a minute, the poll alone sees the value.
    let Some(patient) = spinning("a_spinning_wait_returns_the_value (long)", WAIT) else {
        return;
    };
    let long_budget = patient.create_semaphore(0).unwrap();
    patient
        .queue(0)
        .unwrap()
        .submit(
            &common::slow_commands(&patient, 1 << 20, 1),
            &[],
            &[(long_budget.clone(), 1)],
        )
        .unwrap();
    match long_budget.wait_direct(1, WAIT) {
        Some(Ok(())) => {}
        other => panic!("{other:?}"),
    }
    quick.wait(1, WAIT).unwrap();

    let (commands, took) = calibrated_slow_commands(&device, Duration::from_millis(600));
    let semaphore = device.create_semaphore(0).unwrap();
    let start = Instant::now();
    queue
        .submit(&commands, &[], &[(semaphore.clone(), 1)])
        .unwrap();
    let mut slices = 0;
    let handed_back = loop {
        match semaphore.wait_direct(1, Duration::from_millis(5)) {
            Some(Err(SemaphoreError::Timeout { value: 1, .. })) => slices += 1,
            None => break start.elapsed(),
            Some(Ok(())) => {
                eprintln!("inconclusive: the work ended within the budget ({took:?})");
                return;
            }
            other => panic!("{other:?}"),
        }
        assert!(slices < 10_000, "the spin never ended");
    };
    if handed_back < took / 2 {
        assert!(
            handed_back >= budget && slices >= 2,
            "handed back after {handed_back:?} and {slices} slices; the budget is {budget:?}"
        );
    }
    // The budget is per wait: asked again, the thread is sent to sleep at once.
    assert!(semaphore.wait_direct(1, WAIT).is_none());
    semaphore.wait(1, WAIT).unwrap();
}

/// A spinning waiter notices a host-side failure and a device loss, which the driver never
/// signals, as soon as they happen.
fn spin_ends_early(test: &str, end: impl FnOnce(&VulkanDevice, &Semaphore), expect: &str) {
    let Some(device) = spinning(test, WAIT) else {
        return;
    };
    // The host wait spins first too (the value is due from submitted work).
    check_ended_early(&device, |s| s.wait(1, WAIT), end, expect);
}

#[test]
fn a_spinning_wait_ends_when_the_semaphore_fails_meanwhile() {
    spin_ends_early(
        "a_spinning_wait_ends_when_the_semaphore_fails_meanwhile",
        |_, semaphore| semaphore.fail("stopped by the test"),
        "stopped by the test",
    );
}

#[test]
fn a_spinning_wait_ends_when_the_device_is_lost_meanwhile() {
    spin_ends_early(
        "a_spinning_wait_ends_when_the_device_is_lost_meanwhile",
        |device, _| device.inject_device_loss("test"),
        "device lost",
    );
}

/// This thread's time on a CPU so far (Linux: `/proc/thread-self/schedstat`, nanoseconds);
/// `None` where that cannot be read.
fn thread_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// A direct wait sleeps in the driver: it must not spin on a core the GPU's own work may
/// need (lavapipe runs it on the host's cores). Mesa's runtime spins on a wait for any of
/// several semaphores, so the wait is for the one semaphore alone; a spinning waiter
/// would spend about all the wait on a CPU (less on a loaded machine, but far above 5%).
#[test]
fn a_direct_wait_sleeps_instead_of_spinning() {
    let Some(device) = direct("a_direct_wait_sleeps_instead_of_spinning", true) else {
        return;
    };
    let Some(_) = thread_cpu_time() else {
        eprintln!("inconclusive: no per-thread CPU time on this system");
        return;
    };
    let (commands, took) = calibrated_slow_commands(&device, Duration::from_millis(300));
    let semaphore = device.create_semaphore(0).unwrap();
    device
        .queue(0)
        .unwrap()
        .submit(&commands, &[], &[(semaphore.clone(), 1)])
        .unwrap();
    let (cpu_before, wall_before) = (thread_cpu_time().unwrap(), Instant::now());
    match semaphore.wait_direct(1, WAIT) {
        Some(Ok(())) => {}
        other => panic!("{other:?}"),
    }
    let (cpu, wall) = (
        thread_cpu_time().unwrap() - cpu_before,
        wall_before.elapsed(),
    );
    if wall < took / 4 {
        eprintln!("inconclusive: the work was nearly done before the wait ({wall:?} of {took:?})");
        return;
    }
    assert!(
        cpu < wall / 20,
        "the waiting thread was on a CPU {cpu:?} of the {wall:?} it waited"
    );
}

/// A CPU submission that waits for a host value and a Vulkan value, the way a split
/// model's CPU part waits for its inputs, leaves no Vulkan semaphore alive once it ran or
/// failed, with the CPU device still open: whether the Vulkan value came last, never came
/// (the host's wait failed first, and the CPU device's callback stays registered on the
/// Vulkan semaphore), or was waited for directly by a helping host thread. With the CPU
/// device's waiting submissions holding their semaphores past their start (rafter-stress:
/// "the Vulkan device still holds (semaphores, batches, deferred) = (1, 0, 0)"), each case
/// left one alive.
#[test]
fn a_cpu_submission_waiting_on_a_vulkan_semaphore_leaves_it_free_once_started_or_failed() {
    use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};
    let Some(device) = direct("a_cpu_submission_waiting_on_a_vulkan_semaphore", true) else {
        return;
    };
    let cpu = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 1,
        ..Default::default()
    })
    .unwrap();
    let cpu_queue = cpu.queue(0).unwrap();
    let output = cpu.allocate(64, MemoryKind::HostVisibleShared).unwrap();
    let mut builder = cpu.create_command_buffer().unwrap();
    builder
        .fill(output.range(0, 64).unwrap(), FillPattern::U32(7))
        .unwrap();
    let cpu_commands = builder.finish();
    let gpu_queue = device.queue(0).unwrap();
    let gpu_commands = common::slow_commands(&device, 64 << 20, 2);
    let ran = || output.read_bytes(0, 4).unwrap() == 7u32.to_le_bytes();

    // The host's value first, the GPU's last.
    {
        let (host, done) = (Semaphore::host(0), Semaphore::host(0));
        let gpu = device.create_semaphore(0).unwrap();
        cpu_queue
            .submit(
                &cpu_commands,
                &[(host.clone(), 1), (gpu.clone(), 1)],
                &[(done.clone(), 1)],
            )
            .unwrap();
        host.signal(1).unwrap();
        gpu_queue
            .submit(&gpu_commands, &[], &[(gpu.clone(), 1)])
            .unwrap();
        done.wait(1, WAIT).unwrap();
        assert!(ran());
    }
    assert_eq!(
        common::holds_nothing(&device),
        (0, 0, 0),
        "after a started submission"
    );

    // The host's wait fails; nothing will ever signal the GPU's value.
    output.write_bytes(0, &[0; 64]).unwrap();
    {
        let (host, done) = (Semaphore::host(0), Semaphore::host(0));
        let gpu = device.create_semaphore(0).unwrap();
        cpu_queue
            .submit(
                &cpu_commands,
                &[(gpu.clone(), 1), (host.clone(), 1)],
                &[(done.clone(), 1)],
            )
            .unwrap();
        host.fail("the producer failed");
        match done.wait(1, WAIT) {
            Err(SemaphoreError::Failed(reason)) => assert_eq!(reason, "the producer failed"),
            other => panic!("{other:?}"),
        }
        assert!(!ran());
    }
    assert_eq!(
        common::holds_nothing(&device),
        (0, 0, 0),
        "after a failed submission"
    );

    // A helper waits for the GPU's value in the driver and starts the work itself.
    {
        let (host, done) = (Semaphore::host(0), Semaphore::host(0));
        let gpu = device.create_semaphore(0).unwrap();
        cpu_queue
            .submit(
                &cpu_commands,
                &[(host.clone(), 1), (gpu.clone(), 1)],
                &[(done.clone(), 1)],
            )
            .unwrap();
        host.signal(1).unwrap();
        gpu_queue
            .submit(&gpu_commands, &[], &[(gpu.clone(), 1)])
            .unwrap();
        cpu.help(&|| done.value() >= 1);
        done.wait(1, WAIT).unwrap();
        assert!(ran());
    }
    assert_eq!(
        common::holds_nothing(&device),
        (0, 0, 0),
        "after a helper's direct wait"
    );
    drop(cpu);
}

/// A split model's calls, over and over, traced, with direct waits: GPU work, CPU work
/// that waits for it (started by a helping host thread waiting in the driver, or by the
/// monitor's callback), GPU work that waits for the CPU's, and a host wait for the end.
/// Long traced runs of such calls hung some of the time on lavapipe; this loop reproduced
/// it. By hand: `RAFTER_SPLIT_CALLS=N` calls (default 300); `RAFTER_SPLIT_DIRECT=0` turns
/// direct waits off, `RAFTER_SPLIT_TRACE=0` tracing, `RAFTER_SPLIT_AHEAD=N` keeps N more
/// calls in flight, `RAFTER_SPLIT_FRESH=1` records the GPU parts anew for each call.
///
/// What it found (lavapipe, Mesa 22.3.6, two loaded cores): runs of 3,000 calls did not end
/// in 6 of 9 (traced, direct waits), 1 of 7 (one call ahead), none untraced. The cause was
/// the monitor reading a retired batch's timestamps with `vkGetQueryPoolResults` while the
/// queue ran later work: plain traced `rafter bench` runs hung too, and never with the read
/// left out. The command buffers now copy their timestamps into host memory themselves
/// (`command.rs`, `Timing::copy_results`): 0 of 10 runs of 3,000 calls hung (with one call
/// ahead or not), against 3 of 6 before (2026-11-30).
#[test]
fn split_calls_with_direct_waits_and_tracing_never_hang() {
    use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};
    let calls: u64 = std::env::var("RAFTER_SPLIT_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let sink = std::sync::Arc::new(rafter_hal::MemoryTraceSink::new());
    let Some(device) = common::device_with_or_skip(
        "split_calls_with_direct_waits_and_tracing_never_hang",
        VulkanDeviceOptions {
            // `RAFTER_SPLIT_DIRECT=0`: the same calls without direct waits, for comparison.
            direct_waits: Some(std::env::var("RAFTER_SPLIT_DIRECT").as_deref() != Ok("0")),
            // `RAFTER_SPLIT_TRACE=0`: untraced.
            trace_sink: (std::env::var("RAFTER_SPLIT_TRACE").as_deref() != Ok("0"))
                .then(|| sink.clone() as std::sync::Arc<dyn rafter_hal::TraceSink>),
            ..Default::default()
        },
    ) else {
        return;
    };
    let cpu = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 1,
        trace_sink: Some(sink.clone()),
        ..Default::default()
    })
    .unwrap();
    let gpu_queue = device.queue(0).unwrap();
    let cpu_queue = cpu.queue(0).unwrap();
    let gpu_buffer = device.allocate(1 << 16, MemoryKind::DeviceLocal).unwrap();
    let fill = |pattern: u32| {
        let mut builder = device.create_command_buffer().unwrap();
        builder
            .fill(
                gpu_buffer.range(0, 1 << 16).unwrap(),
                FillPattern::U32(pattern),
            )
            .unwrap();
        builder.finish()
    };
    let (first, last) = (fill(1), fill(2));
    // The CPU part: a fill of a host buffer of the call's own (calls in flight together
    // would otherwise write one buffer at once, which the CPU device refuses).
    let cpu_part = || {
        let host_buffer = cpu
            .allocate(1 << 12, MemoryKind::HostVisibleShared)
            .unwrap();
        let mut builder = cpu.create_command_buffer().unwrap();
        builder
            .fill(host_buffer.range(0, 1 << 12).unwrap(), FillPattern::U32(3))
            .unwrap();
        builder.finish()
    };
    let devices: [&dyn Device; 2] = [&*device, &cpu];
    // `RAFTER_SPLIT_AHEAD=N`: the host waits for the call N before the last one, so the GPU
    // runs one call's work while the monitor retires (and reads the timings of) another's.
    let ahead: usize = std::env::var("RAFTER_SPLIT_AHEAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Each call's own semaphores (submissions on one queue are not ordered): what the GPU
    // part signals, what the CPU part signals, and the call's end.
    let mut in_flight = std::collections::VecDeque::new();
    let fresh = std::env::var("RAFTER_SPLIT_FRESH").as_deref() == Ok("1");
    for i in 1..=calls {
        let (a, b) = (
            device.create_semaphore(0).unwrap(),
            device.create_semaphore(0).unwrap(),
        );
        let c = cpu.create_semaphore(0).unwrap();
        // `RAFTER_SPLIT_FRESH=1`: the GPU parts recorded for each call (their own query
        // slots), instead of one pair of command buffers submitted again and again.
        let (first, last) = if fresh {
            (fill(1), fill(2))
        } else {
            (first.clone(), last.clone())
        };
        let middle = cpu_part();
        rafter_hal::submit_then_wait(|| {
            gpu_queue.submit(&first, &[], &[(a.clone(), 1)]).unwrap();
            cpu_queue
                .submit(&middle, &[(a.clone(), 1)], &[(c.clone(), 1)])
                .unwrap();
            gpu_queue
                .submit(&last, &[(c.clone(), 1)], &[(b.clone(), 1)])
                .unwrap();
        });
        in_flight.push_back((i, a, c, b));
        if in_flight.len() <= ahead {
            continue;
        }
        let (call, a, c, b) = in_flight.pop_front().unwrap();
        let start = Instant::now();
        let done = || start.elapsed() > Duration::from_secs(10) || b.value() >= 1;
        for d in devices {
            d.help(&done);
        }
        if let Err(error) = b.wait(1, Duration::from_secs(20)) {
            panic!(
                "call {call} of {calls} hung ({error}): a = {}, c = {}, b = {}; {}; {}; \
                 vulkan live objects {:?}",
                a.value(),
                c.value(),
                b.value(),
                device.describe(),
                cpu.describe(),
                device.live_objects()
            );
        }
        sink.take();
    }
    for (call, _, _, b) in in_flight {
        if let Err(error) = b.wait(1, Duration::from_secs(20)) {
            panic!("call {call} of {calls} hung ({error})");
        }
    }
}
