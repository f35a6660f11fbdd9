mod common;

use rafter_hal::{Device, MemoryKind};

#[test]
fn device_opens_and_reports_capabilities() {
    let Some(device) = common::device_or_skip("device_opens_and_reports_capabilities") else {
        return;
    };
    let caps = device.capabilities();
    eprintln!("{}", caps.report());
    assert!(caps.missing_required().is_empty());
    assert!(caps.buffer_device_address && caps.timeline_semaphore && caps.synchronization2);
    let info = device.info();
    eprintln!("{info:#?}");
    assert!(info.capabilities.has_feature("buffer-device-address"));
    assert!(info.capabilities.supports_dtype("f32"));
    assert!(info.memory_kind(MemoryKind::DeviceLocal).is_some());
    assert!(info
        .memory_kind(MemoryKind::HostVisibleShared)
        .is_some_and(|m| m.host_visible));
    for listed in rafter_hal_vulkan::list_devices().expect("the loader works: the device opened") {
        eprintln!("listed: {} ({})", listed.device_name, listed.device_type);
    }
}

use std::sync::{mpsc, Arc};
use std::time::Duration;

use rafter_hal::{Buffer, FillPattern, HalError, Semaphore, SemaphoreError};
use rafter_hal_vulkan::{VulkanBuffer, VulkanDevice};

const WAIT: Duration = Duration::from_secs(30);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn buffer_with(device: &VulkanDevice, kind: MemoryKind, bytes: &[u8]) -> Buffer {
    let buffer = device.allocate(bytes.len() as u64, kind).unwrap();
    buffer.write_bytes(0, bytes).unwrap();
    buffer
}

#[test]
fn buffer_write_copy_read_round_trip() {
    let Some(device) = common::device_or_skip("buffer_write_copy_read_round_trip") else {
        return;
    };
    let data = pattern(1 << 20, 7);
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &data);
    let middle = device
        .allocate(data.len() as u64, MemoryKind::DeviceLocal)
        .unwrap();
    let dst = device
        .allocate(data.len() as u64 + 16, MemoryKind::Host)
        .unwrap();
    dst.write_bytes(0, &[0xAA; 16]).unwrap();
    let addresses: Vec<u64> = [&src, &middle, &dst]
        .iter()
        .map(|b| b.downcast_ref::<VulkanBuffer>().unwrap().device_address())
        .collect();
    assert!(addresses.iter().all(|&a| a != 0), "{addresses:x?}");

    let mut builder = device.create_command_buffer().unwrap();
    builder.copy(src.whole(), middle.whole()).unwrap();
    builder.barrier();
    builder
        .copy(middle.whole(), dst.range(16, data.len() as u64).unwrap())
        .unwrap();
    let commands = builder.finish();
    let done = device.create_semaphore(0).unwrap();
    let queue = device.queue(0).unwrap();
    queue.submit(&commands, &[], &[(done.clone(), 1)]).unwrap();
    done.wait(1, WAIT).unwrap();
    assert_eq!(dst.read_bytes(0, 16).unwrap(), vec![0xAA; 16]);
    assert!(dst.read_bytes(16, data.len() as u64).unwrap() == data);

    // The same command buffer again (it is recorded once and reused).
    src.write_bytes(0, &pattern(data.len(), 99)).unwrap();
    queue.submit(&commands, &[], &[(done.clone(), 2)]).unwrap();
    done.wait(2, WAIT).unwrap();
    assert!(dst.read_bytes(16, data.len() as u64).unwrap() == pattern(data.len(), 99));
}

#[test]
fn fill_writes_patterns_and_rejects_unaligned_ranges() {
    let Some(device) = common::device_or_skip("fill_writes_patterns_and_rejects_unaligned_ranges")
    else {
        return;
    };
    let buffer = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 64]);
    let mut builder = device.create_command_buffer().unwrap();
    builder
        .fill(buffer.range(0, 16).unwrap(), FillPattern::U32(0xDEADBEEF))
        .unwrap();
    builder
        .fill(buffer.range(16, 8).unwrap(), FillPattern::U8(0x5A))
        .unwrap();
    builder
        .fill(buffer.range(24, 8).unwrap(), FillPattern::U16(0x1234))
        .unwrap();
    let done = device.create_semaphore(0).unwrap();
    let queue = device.queue(0).unwrap();
    queue
        .submit(&builder.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    done.wait(1, WAIT).unwrap();
    let bytes = buffer.read_bytes(0, 64).unwrap();
    assert_eq!(&bytes[..16], &0xDEADBEEFu32.to_le_bytes().repeat(4)[..]);
    assert_eq!(&bytes[16..24], &[0x5A; 8]);
    assert_eq!(&bytes[24..32], &[0x34, 0x12].repeat(4)[..]);
    assert_eq!(&bytes[32..], &[0u8; 32]);

    // vkCmdFillBuffer writes whole words: an unaligned byte fill is refused at submit,
    // synchronously, and nothing is signalled.
    let mut builder = device.create_command_buffer().unwrap();
    builder
        .fill(buffer.range(1, 3).unwrap(), FillPattern::U8(1))
        .unwrap();
    let error = queue
        .submit(&builder.finish(), &[], &[(done.clone(), 2)])
        .unwrap_err();
    assert!(
        matches!(error, HalError::Unsupported(ref m) if m.contains("4-byte")),
        "{error}"
    );
    assert_eq!(done.value(), 1);
    assert_eq!(done.failure(), None);
}

/// Every submission ends with the per-queue tail (a barrier and a fill: batch_tail.rs, the
/// fix for issue 28's NVIDIA stall): its word is written once a submission completed, on
/// each queue, whatever the submission held.
#[test]
fn every_submission_ends_with_its_queues_tail() {
    let Some(device) = common::device_or_skip("every_submission_ends_with_its_queues_tail") else {
        return;
    };
    if std::env::var(rafter_hal_vulkan::STALL_PROBE_ENV).is_ok_and(|v| v.trim() == "no-tail") {
        return;
    }
    for index in 0..device.queue_count() {
        if device.submission_tail_word(index).is_none() {
            return; // not host-readable here
        }
        assert_eq!(device.submission_tail_word(index), Some(0), "queue {index}");
        let buffer = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 16]);
        let mut builder = device.create_command_buffer().unwrap();
        builder
            .fill(buffer.range(0, 16).unwrap(), FillPattern::U32(7))
            .unwrap();
        let done = device.create_semaphore(0).unwrap();
        let queue = device.queue(index).unwrap();
        queue
            .submit(&builder.finish(), &[], &[(done.clone(), 1)])
            .unwrap();
        done.wait(1, WAIT).unwrap();
        assert_eq!(
            device.submission_tail_word(index),
            Some(rafter_hal_vulkan::TAIL_MARK),
            "queue {index}"
        );
    }
}

/// A copy of `src` into `dst` as a command buffer.
fn copy_commands(device: &VulkanDevice, src: &Buffer, dst: &Buffer) -> rafter_hal::CommandBuffer {
    let mut builder = device.create_command_buffer().unwrap();
    builder.copy(src.whole(), dst.whole()).unwrap();
    builder.finish()
}

#[test]
fn submit_waiting_on_a_host_signal_returns_at_once_and_runs_after_the_signal() {
    let Some(device) = common::device_or_skip("submit_waiting_on_a_host_signal") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(4096, 1));
    let dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 4096]);
    let go = device.create_semaphore(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    // Returns at once although nothing has signalled `go`: if submit blocked on the wait,
    // this thread would never reach the signal below and the test would hang.
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(go.clone(), 1)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    assert_eq!(
        done.value(),
        0,
        "the work cannot have run before its wait is signalled"
    );
    assert_eq!(go.value(), 0);
    assert!(matches!(
        done.wait(1, Duration::from_millis(50)),
        Err(SemaphoreError::Timeout { .. })
    ));
    assert_eq!(dst.read_bytes(0, 16).unwrap(), vec![0u8; 16]);

    // A later, independent submission on the same queue is not held up by the waiting one.
    let other_src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(256, 2));
    let other_dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 256]);
    let other = device.create_semaphore(0).unwrap();
    queue
        .submit(
            &copy_commands(&device, &other_src, &other_dst),
            &[],
            &[(other.clone(), 1)],
        )
        .unwrap();
    other.wait(1, WAIT).unwrap();
    assert_eq!(other_dst.read_bytes(0, 256).unwrap(), pattern(256, 2));
    assert_eq!(done.value(), 0, "still waiting for the host");

    go.signal(1).unwrap();
    done.wait(1, WAIT).unwrap();
    assert_eq!(dst.read_bytes(0, 4096).unwrap(), pattern(4096, 1));
}

#[test]
fn gpu_work_chains_through_semaphores_submitted_before_the_first_signal() {
    let Some(device) = common::device_or_skip("gpu_work_chains_through_semaphores") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let a = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(1024, 3));
    let b = device.allocate(1024, MemoryKind::DeviceLocal).unwrap();
    let c = buffer_with(&device, MemoryKind::Host, &[0u8; 1024]);
    let go = device.create_semaphore(0).unwrap();
    let middle = device.create_semaphore(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    // Submitted in reverse: the second step first, waiting on what the first will signal.
    queue
        .submit(
            &copy_commands(&device, &b, &c),
            &[(middle.clone(), 5)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    queue
        .submit(
            &copy_commands(&device, &a, &b),
            &[(go.clone(), 1)],
            &[(middle.clone(), 5)],
        )
        .unwrap();
    let (sender, receiver) = mpsc::channel();
    done.notify_at(1, Box::new(move |result| sender.send(result).unwrap()));
    assert_eq!((middle.value(), done.value()), (0, 0));
    // The hang report names both held-back submissions and what each waits for.
    let report = device.describe();
    assert!(report.contains("2 deferred submissions"), "{report}");
    assert!(report.contains("wants 5: counter Ok(0)"), "{report}");
    assert!(report.contains("wants 1: counter Ok(0)"), "{report}");
    assert!(report.contains("0 batches in flight"), "{report}");
    go.signal(1).unwrap();
    done.wait(1, WAIT).unwrap();
    assert_eq!(middle.value(), 5);
    assert_eq!(c.read_bytes(0, 1024).unwrap(), pattern(1024, 3));
    // The callback registered on a GPU-signalled value fires (from the monitor thread).
    assert_eq!(receiver.recv_timeout(WAIT).unwrap(), Ok(()));
}

#[test]
fn a_failed_wait_fails_every_downstream_semaphore_and_the_work_never_runs() {
    let Some(device) = common::device_or_skip("a_failed_wait_fails_downstream") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(512, 4));
    let dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 512]);
    let out = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 512]);
    let input = device.create_semaphore(0).unwrap();
    let middle = device.create_semaphore(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    // A host (CPU-device style) semaphore downstream too: failure crosses devices.
    let host_side = Semaphore::host(0);
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(input.clone(), 1)],
            &[(middle.clone(), 1)],
        )
        .unwrap();
    queue
        .submit(
            &copy_commands(&device, &dst, &out),
            &[(middle.clone(), 1)],
            &[(done.clone(), 1), (host_side.clone(), 1)],
        )
        .unwrap();
    input.fail("the producer's kernel failed");
    for semaphore in [&middle, &done, &host_side] {
        let error = semaphore.wait(1, WAIT).unwrap_err();
        assert_eq!(
            error,
            SemaphoreError::Failed("the producer's kernel failed".into()),
            "{semaphore:?}"
        );
    }
    assert_eq!(
        dst.read_bytes(0, 512).unwrap(),
        vec![0u8; 512],
        "the copy never ran"
    );
    assert_eq!(out.read_bytes(0, 512).unwrap(), vec![0u8; 512]);
    // A submission waiting on an already failed semaphore fails at once too.
    let late = device.create_semaphore(0).unwrap();
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(done.clone(), 1)],
            &[(late.clone(), 1)],
        )
        .unwrap();
    assert!(matches!(late.wait(1, WAIT), Err(SemaphoreError::Failed(_))));
}

#[test]
fn semaphores_of_other_devices_are_waited_and_signalled_by_the_host() {
    let Some(device) = common::device_or_skip("semaphores_of_other_devices") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(2048, 5));
    let dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 2048]);
    let cpu_ready = Semaphore::host(0);
    let cpu_done = Semaphore::host(0);
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(cpu_ready.clone(), 3)],
            &[(cpu_done.clone(), 1)],
        )
        .unwrap();
    assert_eq!(cpu_done.value(), 0);
    let signaller = std::thread::spawn(move || cpu_ready.signal(3).unwrap());
    cpu_done.wait(1, WAIT).unwrap();
    signaller.join().unwrap();
    assert_eq!(dst.read_bytes(0, 2048).unwrap(), pattern(2048, 5));

    // A foreign wait that fails: the work never runs and the signal fails with the reason.
    let upstream = Semaphore::host(0);
    let downstream = device.create_semaphore(0).unwrap();
    dst.write_bytes(0, &[0u8; 2048]).unwrap();
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(upstream.clone(), 1)],
            &[(downstream.clone(), 1)],
        )
        .unwrap();
    upstream.fail("cpu kernel panicked");
    assert_eq!(
        downstream.wait(1, WAIT),
        Err(SemaphoreError::Failed("cpu kernel panicked".into()))
    );
    assert_eq!(dst.read_bytes(0, 2048).unwrap(), vec![0u8; 2048]);
}

#[test]
fn host_semaphore_operations() {
    let Some(device) = common::device_or_skip("host_semaphore_operations") else {
        return;
    };
    let semaphore = device.create_semaphore(3).unwrap();
    assert_eq!(semaphore.value(), 3);
    assert_eq!(
        semaphore.signal(3),
        Err(SemaphoreError::NotMonotonic {
            current: 3,
            requested: 3
        })
    );
    assert!(matches!(
        semaphore.wait(4, Duration::from_millis(20)),
        Err(SemaphoreError::Timeout {
            value: 4,
            current: 3,
            ..
        })
    ));
    let (sender, receiver) = mpsc::channel();
    semaphore.notify_at(6, Box::new(move |r| sender.send(r).unwrap()));
    semaphore.signal(7).unwrap();
    assert_eq!(receiver.recv_timeout(WAIT).unwrap(), Ok(()));
    semaphore.wait(5, WAIT).unwrap();
    // A waiter blocked in the driver learns of a failure within a wait slice.
    let waiter = {
        let semaphore = semaphore.clone();
        std::thread::spawn(move || semaphore.wait(100, WAIT))
    };
    std::thread::sleep(Duration::from_millis(20));
    semaphore.fail("gave up");
    assert_eq!(
        waiter.join().unwrap(),
        Err(SemaphoreError::Failed("gave up".into()))
    );
    assert_eq!(
        semaphore.value(),
        7,
        "the value stays at the last one reached"
    );
    assert_eq!(
        semaphore.signal(8),
        Err(SemaphoreError::Failed("gave up".into()))
    );
}

#[test]
fn device_loss_fails_pending_work_and_refuses_new_work() {
    let Some(device) = common::device_or_skip("device_loss_fails_pending_work") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(64, 6));
    let dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 64]);
    let go = device.create_semaphore(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    let cpu_done = Semaphore::host(0);
    let commands = copy_commands(&device, &src, &dst);
    queue
        .submit(
            &commands,
            &[(go.clone(), 1)],
            &[(done.clone(), 1), (cpu_done.clone(), 1)],
        )
        .unwrap();
    // The driver's VK_ERROR_DEVICE_LOST cannot be provoked on demand; this takes the same
    // path the monitor takes when a Vulkan call reports it.
    device.inject_device_loss("test");
    for semaphore in [&done, &cpu_done, &go] {
        match semaphore.wait(1, WAIT) {
            Err(SemaphoreError::Failed(reason)) => {
                assert!(reason.contains("device lost"), "{reason}")
            }
            other => panic!("{semaphore:?}: {other:?}"),
        }
    }
    assert!(matches!(
        queue.submit(&commands, &[], &[]),
        Err(HalError::DeviceLost(_))
    ));
    assert!(matches!(
        device.allocate(64, MemoryKind::Host),
        Err(HalError::DeviceLost(_))
    ));
}

#[test]
fn dropping_the_device_fails_work_that_never_ran() {
    let Some(device) = common::device_or_skip("dropping_the_device_fails_work") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(64, 8));
    let dst = buffer_with(&device, MemoryKind::HostVisibleShared, &[0u8; 64]);
    let go = device.create_semaphore(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    queue
        .submit(
            &copy_commands(&device, &src, &dst),
            &[(go.clone(), 1)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    let info = device.info().clone();
    drop(device);
    match done.wait(1, WAIT) {
        Err(SemaphoreError::Failed(reason)) => assert!(reason.contains("dropped"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Handles outlive the device: the queue refuses work, the buffers still map.
    let empty = rafter_hal::CommandBufferBuilder::new(&info).finish();
    assert!(matches!(
        queue.submit(&empty, &[], &[]),
        Err(HalError::DeviceLost(_))
    ));
    assert_eq!(dst.read_bytes(0, 64).unwrap(), vec![0u8; 64]);
    go.signal(1).unwrap();
}

/// A device reporting to a fresh trace sink, and the sink; `None` (the test skipped, said
/// why) without a device or timestamps.
fn traced_device(test: &str) -> Option<(common::Checked, Arc<rafter_hal::MemoryTraceSink>)> {
    let sink = Arc::new(rafter_hal::MemoryTraceSink::new());
    let options = rafter_hal_vulkan::VulkanDeviceOptions {
        trace_sink: Some(sink.clone()),
        ..Default::default()
    };
    let device = common::device_with_or_skip(test, options)?;
    if device.capabilities().timestamp_valid_bits == 0 {
        eprintln!("skipping {test}: the queue family has no timestamps");
        return None;
    }
    Some((device, sink))
}

#[test]
fn a_trace_sink_gets_gpu_timed_events_per_command() {
    let Some((device, sink)) = traced_device("trace_sink") else {
        return;
    };
    let data = pattern(4 << 20, 3);
    let src = buffer_with(&device, MemoryKind::HostVisibleShared, &data);
    let dst = device
        .allocate(data.len() as u64, MemoryKind::DeviceLocal)
        .unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    builder.copy(src.whole(), dst.whole()).unwrap();
    builder.barrier();
    builder
        .fill(dst.whole(), rafter_hal::FillPattern::U32(7))
        .unwrap();
    let done = device.create_semaphore(0).unwrap();
    device
        .queue(0)
        .unwrap()
        .submit(&builder.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    done.wait(1, WAIT).unwrap();
    // Events are reported when the monitor retires the batch, just after the signal.
    let start = std::time::Instant::now();
    while sink.events().len() < 2 && start.elapsed() < WAIT {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let events = sink.events();
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [rafter_hal::TraceKind::Copy, rafter_hal::TraceKind::Fill]
    );
    for e in &events {
        assert!(e.end >= e.start, "{e:?}");
        assert_eq!(&*e.queue, "vulkan:0");
        assert!(!e.failed);
    }
}

/// One traced command buffer submitted many times back to back: its timestamps live in one
/// query pool that each submission resets, so each submission waits (host-side) until the
/// previous one's timestamps are read. Every submission is reported, once, with its own
/// spans (without the wait, reports read timestamps a later submission had reset: spans
/// went missing or repeated, and lavapipe hung in long traced runs).
#[test]
fn a_traced_command_buffer_submitted_again_reports_every_submission() {
    let Some((device, sink)) = traced_device("traced_resubmission") else {
        return;
    };
    let dst = device.allocate(4 << 20, MemoryKind::DeviceLocal).unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    builder
        .fill(dst.whole(), rafter_hal::FillPattern::U32(1))
        .unwrap();
    builder.barrier();
    builder
        .fill(dst.whole(), rafter_hal::FillPattern::U32(2))
        .unwrap();
    let commands = builder.finish();
    let queue = device.queue(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    let n = 24u64;
    for i in 1..=n {
        queue.submit(&commands, &[], &[(done.clone(), i)]).unwrap();
    }
    done.wait(n, WAIT).unwrap();
    let start = std::time::Instant::now();
    while (sink.events().len() as u64) < 2 * n && start.elapsed() < WAIT {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut events = sink.events();
    assert_eq!(
        events.len() as u64,
        2 * n,
        "every submission's two fills, once"
    );
    events.sort_by_key(|e| e.start);
    for e in &events {
        assert!(e.end >= e.start, "{e:?}");
    }
    // One submission after another on one queue: no two spans start together.
    for pair in events.windows(2) {
        assert!(pair[1].start > pair[0].start, "{:?}", pair);
    }
}

#[test]
fn timepoints_of_a_dropped_semaphore_still_fire() {
    let Some(device) = common::device_or_skip("timepoints_of_a_dropped_semaphore_still_fire")
    else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let a = buffer_with(&device, MemoryKind::HostVisibleShared, &pattern(256, 5));
    let b = buffer_with(&device, MemoryKind::Host, &[0u8; 256]);
    // A value the GPU reaches, with every handle dropped right after the host saw it
    // (before or after the monitor fires the callback): the callback fires, with Ok.
    for _ in 0..20 {
        let done = device.create_semaphore(0).unwrap();
        let (sender, receiver) = mpsc::channel();
        done.notify_at(1, Box::new(move |result| sender.send(result).unwrap()));
        queue
            .submit(&copy_commands(&device, &a, &b), &[], &[(done.clone(), 1)])
            .unwrap();
        done.wait(1, WAIT).unwrap();
        drop(done);
        assert_eq!(receiver.recv_timeout(WAIT).unwrap(), Ok(()));
    }
    // A value nothing will signal: dropping the semaphore fails the callback, naming why.
    let never = device.create_semaphore(0).unwrap();
    let (sender, receiver) = mpsc::channel();
    never.notify_at(3, Box::new(move |result| sender.send(result).unwrap()));
    drop(never);
    match receiver.recv_timeout(WAIT).unwrap() {
        Err(SemaphoreError::Failed(reason)) => {
            assert!(reason.contains("dropped at value 0"), "{reason}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// The cooperative-matrix variants load only where the device offers exactly the
/// configuration they are written for (16×16×16 f16·f16 + f32 at subgroup scope, 32-wide
/// subgroups); otherwise the loader names what is missing. Checked on the real device's
/// capabilities with the configuration list edited (the same function the loader calls).
#[test]
fn cooperative_matrix_modules_need_the_exact_configuration() {
    let Some(device) = common::device_or_skip("cooperative_matrix_configuration") else {
        return;
    };
    // A module declaring Shader and CooperativeMatrixKHR (OpCapability, opcode 17).
    let module = [
        0x0723_0203,
        0x0001_0500,
        0,
        10,
        0,
        2 << 16 | 17,
        1,
        2 << 16 | 17,
        6022,
    ];
    let shape = |c: &str, subgroup_scope: bool| rafter_hal_vulkan::CoopMatrixShape {
        m: 16,
        n: 16,
        k: 16,
        a: "f16".into(),
        b: "f16".into(),
        c: c.into(),
        result: c.into(),
        subgroup_scope,
    };
    let mut caps = device.capabilities().clone();
    caps.subgroup_size = 32;
    caps.cooperative_matrix = Some(vec![shape("f16", true), shape("f32", true)]);
    assert!(caps.has_coop_f16());
    assert!(caps.missing_for_module(&module).unwrap().is_empty());
    for (what, edit) in [
        ("no extension", (None, 32)),
        (
            "f16 accumulators only",
            (Some(vec![shape("f16", true)]), 32),
        ),
        (
            "workgroup scope only",
            (Some(vec![shape("f32", false)]), 32),
        ),
        ("64-wide subgroups", (Some(vec![shape("f32", true)]), 64)),
    ] {
        caps.cooperative_matrix = edit.0;
        caps.subgroup_size = edit.1;
        assert!(!caps.has_coop_f16(), "{what}");
        let missing = caps.missing_for_module(&module).unwrap();
        assert!(
            missing.len() == 1 && missing[0].starts_with("cooperativeMatrix"),
            "{what}: {missing:?}"
        );
    }
}

/// Validation on demand: the layer's report of a deliberately invalid call reaches the
/// device's log with its id, and a device without validation logs nothing for it. Skipped
/// when the machine lacks the layer (CI installs it: Debian's vulkan-validationlayers).
#[test]
fn the_validation_layer_reports_an_invalid_call_into_the_log() {
    let options = rafter_hal_vulkan::VulkanDeviceOptions {
        validation: Some(rafter_hal_vulkan::Validation::Core),
        ..Default::default()
    };
    let device = match rafter_hal_vulkan::VulkanDevice::new(options) {
        Ok(device) => device,
        Err(error)
            if error
                .to_string()
                .contains("VK_LAYER_KHRONOS_validation layer") =>
        {
            eprintln!("skipping: {error}");
            return;
        }
        Err(error @ rafter_hal_vulkan::VulkanError::NoDevice { .. }) => {
            let required =
                std::env::var(common::REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "{error}");
            eprintln!("skipping: {error}");
            return;
        }
        Err(error) => panic!("{error}"),
    };
    assert_eq!(device.validation_messages().1, 0);
    device.provoke_validation_error();
    let (messages, total) = device.validation_messages();
    assert_eq!(total, 1, "{messages:?}");
    assert_eq!(messages[0].severity, "error");
    assert_eq!(messages[0].id, "VUID-VkPushConstantRange-size-00297");
    let log = device.validation_log();
    drop(device);
    assert_eq!(log.messages().1, 1, "the log outlives the device");

    let off = rafter_hal_vulkan::VulkanDevice::new(rafter_hal_vulkan::VulkanDeviceOptions {
        validation: Some(rafter_hal_vulkan::Validation::Off),
        ..Default::default()
    })
    .unwrap();
    off.provoke_validation_error();
    assert_eq!(off.validation_messages().1, 0);
}

/// On a traced device a host wait returns only once the monitor has reported the batch's
/// GPU spans, even with the spin wait on (`VulkanDeviceOptions::spin_wait`): what reads
/// a call's trace right after its wait (`rafter run --trace`, the calibration's probes)
/// must find the call's spans there, and no late span of it in the next call's window.
/// A spinning waiter saw the counter before the monitor's report: the H200's calibration
/// then found no span of a probe, or rated probes at up to 20x their time.
#[test]
fn a_traced_host_wait_returns_with_the_batchs_spans_reported() {
    let sink = Arc::new(rafter_hal::MemoryTraceSink::new());
    let options = rafter_hal_vulkan::VulkanDeviceOptions {
        trace_sink: Some(sink.clone()),
        spin_wait: Some(std::time::Duration::from_secs(1)),
        ..Default::default()
    };
    let Some(device) = common::device_with_or_skip("traced_host_wait", options) else {
        return;
    };
    if device.capabilities().timestamp_valid_bits == 0 {
        eprintln!("skipping traced_host_wait: the queue family has no timestamps");
        return;
    }
    let dst = device.allocate(1 << 20, MemoryKind::DeviceLocal).unwrap();
    let queue = device.queue(0).unwrap();
    let done = device.create_semaphore(0).unwrap();
    for value in 1..=20u64 {
        let mut builder = device.create_command_buffer().unwrap();
        builder
            .fill(dst.whole(), rafter_hal::FillPattern::U32(value as u32))
            .unwrap();
        sink.take();
        queue
            .submit(&builder.finish(), &[], &[(done.clone(), value)])
            .unwrap();
        done.wait(value, WAIT).unwrap();
        let kinds: Vec<_> = sink.events().iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [rafter_hal::TraceKind::Fill], "submission {value}");
    }
}
