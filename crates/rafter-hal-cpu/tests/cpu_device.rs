//! The CPU device through the HAL traits. Every ordering claim is checked through semaphores
//! (with timeouts, so a broken claim fails instead of hanging), never through timing.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rafter_hal::{
    Buffer, BufferRange, CommandBufferBuilder, Device, FillPattern, HalError, MemoryKind,
    MemoryTraceSink, Queue, Semaphore, SemaphoreError, TraceKind,
};
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions, CpuKernels, DispatchContext, ALIGNMENT};

/// Long enough never to expire when things work; a broken ordering fails after it.
const LONG: Duration = Duration::from_secs(20);

fn device(workers: usize) -> CpuDevice {
    CpuDevice::new(CpuDeviceOptions {
        worker_threads: workers,
        ..Default::default()
    })
    .unwrap()
}

fn f32_buffer(device: &CpuDevice, values: &[f32]) -> Buffer {
    let buffer = device
        .allocate(values.len() as u64 * 4, MemoryKind::HostVisibleShared)
        .unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    buffer.write_bytes(0, &bytes).unwrap();
    buffer
}

fn read_f32(buffer: &Buffer) -> Vec<f32> {
    buffer
        .read_bytes(0, buffer.size())
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Blocks (up to `LONG`) until `gate` reaches `value`; an error if it does not.
fn block_on(gate: &Semaphore, value: u64) -> Result<(), String> {
    gate.wait(value, LONG).map_err(|e| e.to_string())
}

/// A kernel that waits for `gate` to reach 1.
fn gated(gate: &Semaphore) -> impl Fn(&DispatchContext<'_>) -> Result<(), String> {
    let gate = gate.clone();
    move |_| block_on(&gate, 1)
}

/// c[i] = a[i] + b[i]; params: n (u32), chunk (u32) elements per workgroup.
fn vector_add(ctx: &DispatchContext<'_>) -> Result<(), String> {
    let n = ctx.param_u32(0)? as usize;
    let chunk = ctx.param_u32(1)? as usize;
    let start = (ctx.workgroup_index() as usize * chunk).min(n);
    let end = (start + chunk).min(n);
    let a = ctx.read_range(0, start * 4, (end - start) * 4)?;
    let b = ctx.read_range(1, start * 4, (end - start) * 4)?;
    let mut c = ctx.write_range(2, start * 4, (end - start) * 4)?;
    let (a, b) = (a.as_slice::<f32>()?, b.as_slice::<f32>()?);
    for (i, out) in c.as_mut_slice::<f32>()?.iter_mut().enumerate() {
        *out = a[i] + b[i];
    }
    Ok(())
}

/// Submits `cb` on `queue` with a fresh host semaphore to signal, and waits for it (up to
/// `timeout`): the work's failure, if any, is the wait's error.
fn submit_and_wait(
    queue: &Queue,
    cb: CommandBufferBuilder,
    timeout: Duration,
) -> Result<(), SemaphoreError> {
    let done = Semaphore::host(0);
    queue
        .submit(&cb.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    done.wait(1, timeout)
}

fn params(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn vector_add_over_many_workgroups() {
    let dev = device(3);
    let n = 1000u32;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let (ba, bb) = (f32_buffer(&dev, &a), f32_buffer(&dev, &b));
    let bc = dev.allocate(n as u64 * 4, MemoryKind::DeviceLocal).unwrap();
    let exe = dev
        .load_kernels("ew", CpuKernels::new().with_entry("vector_add", vector_add))
        .unwrap();
    let entry = exe.entry_index("vector_add").unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(
        &exe,
        entry,
        &[ba.whole(), bb.whole(), bc.whole()],
        &params(&[n, 64]),
        [n.div_ceil(64), 1, 1],
    )
    .unwrap();
    let cb = cb.finish();
    let done = dev.create_semaphore(0).unwrap();
    let queue = dev.queue(0).unwrap();
    queue.submit(&cb, &[], &[(done.clone(), 1)]).unwrap();
    done.wait(1, LONG).unwrap();
    let expected: Vec<f32> = (0..n).map(|i| 1.5 * i as f32).collect();
    assert_eq!(read_f32(&bc), expected);
    // A command buffer may be submitted again (its preparation is cached).
    queue
        .submit(&cb, &[(done.clone(), 1)], &[(done.clone(), 2)])
        .unwrap();
    done.wait(2, LONG).unwrap();
    assert_eq!(read_f32(&bc), expected);
}

#[test]
fn submit_returns_before_the_work_ends() {
    let dev = device(2);
    let gate = Semaphore::host(0);
    let exe = dev
        .load_kernels(
            "gated",
            CpuKernels::new().with_entry("wait_gate", gated(&gate)),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    let done = dev.create_semaphore(0).unwrap();
    dev.queue(0)
        .unwrap()
        .submit(&cb.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    // The kernel cannot finish before the gate opens, so submit must have returned first.
    assert_eq!(done.value(), 0);
    assert!(matches!(
        done.wait(1, Duration::from_millis(10)),
        Err(SemaphoreError::Timeout {
            value: 1,
            current: 0,
            ..
        })
    ));
    gate.signal(1).unwrap();
    done.wait(1, LONG).unwrap();
}

#[test]
fn a_waiting_submission_does_not_block_a_later_independent_one() {
    let dev = device(2);
    let ran_a = Arc::new(AtomicBool::new(false));
    let flag = ran_a.clone();
    let exe = dev
        .load_kernels(
            "k",
            CpuKernels::new()
                .with_entry("mark", move |_| {
                    flag.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .with_entry("nothing", |_| Ok(())),
        )
        .unwrap();
    let record = |entry| {
        let mut cb = dev.create_command_buffer().unwrap();
        cb.dispatch(&exe, entry, &[], &[], [1, 1, 1]).unwrap();
        cb.finish()
    };
    let queue = dev.queue(0).unwrap();
    let (dep, done_a, done_b) = (Semaphore::host(0), Semaphore::host(0), Semaphore::host(0));
    queue
        .submit(&record(0), &[(dep.clone(), 1)], &[(done_a.clone(), 1)])
        .unwrap();
    queue
        .submit(&record(1), &[], &[(done_b.clone(), 1)])
        .unwrap();
    done_b.wait(1, LONG).unwrap();
    assert_eq!(done_a.value(), 0);
    assert!(
        !ran_a.load(Ordering::SeqCst),
        "A ran before its wait was reached"
    );
    dep.signal(1).unwrap();
    done_a.wait(1, LONG).unwrap();
    assert!(ran_a.load(Ordering::SeqCst));
}

/// Kernel `i` of a rendezvous announces itself on `arrived[i]` and waits for every other.
fn rendezvous(
    arrived: Vec<Semaphore>,
    me: usize,
) -> impl Fn(&DispatchContext<'_>) -> Result<(), String> {
    move |_| {
        arrived[me].signal(1).map_err(|e| e.to_string())?;
        for (i, other) in arrived.iter().enumerate() {
            if i != me {
                other
                    .wait(1, LONG)
                    .map_err(|e| format!("kernel {me} waited for kernel {i}: {e}"))?;
            }
        }
        Ok(())
    }
}

#[test]
fn two_independent_submissions_overlap() {
    let dev = device(2);
    let arrived = vec![Semaphore::host(0), Semaphore::host(0)];
    let exe = dev
        .load_kernels(
            "meet",
            CpuKernels::new()
                .with_entry("a", rendezvous(arrived.clone(), 0))
                .with_entry("b", rendezvous(arrived.clone(), 1)),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let done = [Semaphore::host(0), Semaphore::host(0)];
    for (entry, done) in done.iter().enumerate() {
        let mut cb = dev.create_command_buffer().unwrap();
        cb.dispatch(&exe, entry, &[], &[], [1, 1, 1]).unwrap();
        queue
            .submit(&cb.finish(), &[], &[(done.clone(), 1)])
            .unwrap();
    }
    // Serialized execution would make one kernel time out and fail its semaphore.
    for done in &done {
        done.wait(1, LONG * 2).unwrap();
    }
}

#[test]
fn commands_between_barriers_run_concurrently() {
    let dev = device(2);
    let arrived = vec![Semaphore::host(0), Semaphore::host(0)];
    let exe = dev
        .load_kernels(
            "meet",
            CpuKernels::new()
                .with_entry("a", rendezvous(arrived.clone(), 0))
                .with_entry("b", rendezvous(arrived.clone(), 1)),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    cb.dispatch(&exe, 1, &[], &[], [1, 1, 1]).unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG * 2).unwrap();
}

#[test]
fn a_dispatch_runs_its_workgroups_in_parallel() {
    let workers = 4;
    let dev = device(workers);
    let count = Arc::new(AtomicU32::new(0));
    let all_started = Semaphore::host(0);
    let (c, all) = (count.clone(), all_started.clone());
    let exe = dev
        .load_kernels(
            "wide",
            CpuKernels::new().with_entry("meet", move |ctx| {
                if c.fetch_add(1, Ordering::SeqCst) + 1 == ctx.workgroup_count()[0] {
                    all.signal(1).map_err(|e| e.to_string())?;
                }
                block_on(&all, 1)
            }),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [workers as u32, 1, 1])
        .unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG * 2).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), workers as u32);
}

#[test]
fn workgroup_ids_cover_the_3d_grid_once() {
    let dev = device(3);
    let grid = [3u32, 4, 5];
    let out = dev.allocate(60 * 4, MemoryKind::Host).unwrap();
    let exe = dev
        .load_kernels(
            "grid",
            CpuKernels::new().with_entry("id", |ctx| {
                let [x, y, z] = ctx.workgroup_id();
                let i = ctx.workgroup_index() as usize;
                let mut slot = ctx.write_range(0, i * 4, 4)?;
                slot.as_mut_slice::<u32>()?[0] = 1 + x + 10 * y + 100 * z;
                Ok(())
            }),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[out.whole()], &[], grid).unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG).unwrap();
    let got: Vec<u32> = out
        .read_bytes(0, out.size())
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut expected = Vec::new();
    for z in 0..5 {
        for y in 0..4 {
            for x in 0..3 {
                expected.push(1 + x + 10 * y + 100 * z);
            }
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn writes_before_a_barrier_are_visible_after_it() {
    let dev = device(4);
    let tiles = 16u32;
    let x = dev
        .allocate(tiles as u64 * 64 * 4, MemoryKind::DeviceLocal)
        .unwrap();
    let y = dev
        .allocate(tiles as u64 * 64 * 4, MemoryKind::DeviceLocal)
        .unwrap();
    let finished = Arc::new(AtomicU32::new(0));
    let f = finished.clone();
    let exe = dev
        .load_kernels(
            "chain",
            CpuKernels::new()
                .with_entry("produce", move |ctx| {
                    let t = ctx.workgroup_index() as usize;
                    // Slow producers make a missing barrier visible to the consumer.
                    std::thread::sleep(Duration::from_millis(2));
                    let mut tile = ctx.write_range(0, t * 256, 256)?;
                    tile.as_mut_slice::<f32>()?.fill(t as f32 + 1.0);
                    f.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .with_entry("consume", move |ctx| {
                    if finished.load(Ordering::SeqCst) != ctx.param_u32(0)? {
                        return Err("consumer started before every producer finished".into());
                    }
                    let x = ctx.read(0)?;
                    let mut y = ctx.write(1)?;
                    for (o, i) in y
                        .as_mut_slice::<f32>()?
                        .iter_mut()
                        .zip(x.as_slice::<f32>()?)
                    {
                        *o = i * 2.0;
                    }
                    Ok(())
                }),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[x.whole()], &[], [tiles, 1, 1])
        .unwrap();
    cb.barrier();
    cb.dispatch(
        &exe,
        1,
        &[x.whole(), y.whole()],
        &params(&[tiles]),
        [1, 1, 1],
    )
    .unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG).unwrap();
    let got = read_f32(&y);
    for t in 0..tiles as usize {
        assert!(got[t * 64..(t + 1) * 64]
            .iter()
            .all(|&v| v == 2.0 * (t as f32 + 1.0)));
    }
}

#[test]
fn fill_and_copy() {
    let dev = device(2);
    let a = dev.allocate(64, MemoryKind::DeviceLocal).unwrap();
    let b = dev.allocate(64, MemoryKind::Host).unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.fill(a.range(0, 32).unwrap(), FillPattern::U32(0xA1B2_C3D4))
        .unwrap();
    cb.fill(a.range(32, 31).unwrap(), FillPattern::U8(7))
        .unwrap();
    cb.fill(a.range(63, 1).unwrap(), FillPattern::U8(9))
        .unwrap();
    cb.barrier();
    cb.copy(a.range(0, 40).unwrap(), b.range(8, 40).unwrap())
        .unwrap();
    cb.fill(b.range(0, 8).unwrap(), FillPattern::U16(0x0102))
        .unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG).unwrap();
    let mut expected_a: Vec<u8> = (0..8).flat_map(|_| 0xA1B2_C3D4u32.to_le_bytes()).collect();
    expected_a.extend([7u8; 31]);
    expected_a.push(9);
    assert_eq!(a.read_bytes(0, 64).unwrap(), expected_a);
    let mut expected_b: Vec<u8> = (0..4).flat_map(|_| [0x02u8, 0x01]).collect();
    expected_b.extend(&expected_a[..40]);
    expected_b.extend([0u8; 16]);
    assert_eq!(b.read_bytes(0, 64).unwrap(), expected_b);
}

#[test]
fn a_failing_kernel_fails_its_signals_and_everything_downstream() {
    let dev = device(2);
    let downstream_ran = Arc::new(AtomicBool::new(false));
    let later_ran = Arc::new(AtomicBool::new(false));
    let (d, l) = (downstream_ran.clone(), later_ran.clone());
    let exe = dev
        .load_kernels(
            "k",
            CpuKernels::new()
                .with_entry("fail", |_| Err("input 3 has NaN".to_string()))
                .with_entry("downstream", move |_| {
                    d.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .with_entry("later", move |_| {
                    l.store(true, Ordering::SeqCst);
                    Ok(())
                }),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    cb.barrier();
    cb.dispatch(&exe, 2, &[], &[], [1, 1, 1]).unwrap();
    let (failed, second) = (Semaphore::host(0), Semaphore::host(0));
    queue
        .submit(&cb.finish(), &[], &[(failed.clone(), 1)])
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 1, &[], &[], [1, 1, 1]).unwrap();
    queue
        .submit(&cb.finish(), &[(failed.clone(), 1)], &[(second.clone(), 1)])
        .unwrap();

    let reason = match failed.wait(1, LONG) {
        Err(SemaphoreError::Failed(reason)) => reason,
        other => panic!("expected a failure, got {other:?}"),
    };
    assert!(reason.contains("input 3 has NaN"), "{reason}");
    assert!(reason.contains("k::fail"), "{reason}");
    assert_eq!(
        second.wait(1, LONG),
        Err(SemaphoreError::Failed(reason.clone()))
    );
    assert!(
        !downstream_ran.load(Ordering::SeqCst),
        "downstream commands ran"
    );
    assert!(
        !later_ran.load(Ordering::SeqCst),
        "commands after the failure ran"
    );

    // A submission waiting on an already failed semaphore fails at once.
    let third = Semaphore::host(0);
    let empty = dev.create_command_buffer().unwrap().finish();
    queue
        .submit(&empty, &[(second.clone(), 1)], &[(third.clone(), 1)])
        .unwrap();
    assert_eq!(third.wait(1, LONG), Err(SemaphoreError::Failed(reason)));
}

#[test]
fn a_panicking_kernel_becomes_a_failed_semaphore_and_the_device_carries_on() {
    let dev = device(2);
    let exe = dev
        .load_kernels(
            "k",
            CpuKernels::new()
                .with_entry("boom", |_| panic!("kernel exploded"))
                .with_entry("fine", |_| Ok(())),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [4, 1, 1]).unwrap();
    let error = submit_and_wait(&queue, cb, LONG).unwrap_err().to_string();
    assert!(error.contains("panicked: kernel exploded"), "{error}");

    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 1, &[], &[], [4, 1, 1]).unwrap();
    let ok = Semaphore::host(0);
    queue.submit(&cb.finish(), &[], &[(ok.clone(), 1)]).unwrap();
    ok.wait(1, LONG).unwrap();
}

#[test]
fn out_of_range_and_malformed_commands_are_rejected_at_record_time() {
    let dev = device(1);
    let small = dev.allocate(1024, MemoryKind::DeviceLocal).unwrap();
    let big = dev.allocate(8192, MemoryKind::DeviceLocal).unwrap();
    let exe = dev
        .load_kernels("k", CpuKernels::new().with_entry("a", |_| Ok(())))
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    let too_long = BufferRange {
        buffer: small.clone(),
        offset: 0,
        len: 4096,
    };
    let error = cb
        .dispatch(
            &exe,
            0,
            &[big.whole(), big.whole(), too_long.clone()],
            &[],
            [1, 1, 1],
        )
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "binding 2: range 0..4096 exceeds buffer of 1024 bytes"
    );
    let overflow = BufferRange {
        buffer: small.clone(),
        offset: u64::MAX,
        len: 2,
    };
    assert!(matches!(
        cb.dispatch(&exe, 0, &[overflow], &[], [1, 1, 1]),
        Err(HalError::RangeOverflow { .. })
    ));
    assert_eq!(
        cb.dispatch(&exe, 3, &[], &[], [1, 1, 1])
            .unwrap_err()
            .to_string(),
        "unknown entry point 3: executable 'k' has 1 entry points"
    );
    assert!(matches!(
        exe.entry_index("missing"),
        Err(HalError::EntryPointNotFound { .. })
    ));
    assert!(matches!(
        cb.dispatch(&exe, 0, &[], &vec![0u8; 1 << 20], [1, 1, 1]),
        Err(HalError::LimitExceeded { .. })
    ));
    assert_eq!(
        cb.copy(too_long, big.range(0, 4096).unwrap())
            .unwrap_err()
            .to_string(),
        "copy source: range 0..4096 exceeds buffer of 1024 bytes"
    );
    assert!(matches!(
        cb.copy(big.range(0, 16).unwrap(), big.range(8, 16).unwrap()),
        Err(HalError::CopyOverlap { .. })
    ));
    assert!(matches!(
        cb.copy(big.range(0, 16).unwrap(), small.range(0, 8).unwrap()),
        Err(HalError::InvalidCommand(_))
    ));
    assert!(matches!(
        cb.fill(small.range(2, 8).unwrap(), FillPattern::U32(0)),
        Err(HalError::InvalidCommand(_))
    ));
    assert!(matches!(
        small.range(1000, 25),
        Err(HalError::OutOfRange { .. })
    ));
    assert!(matches!(
        small.read_bytes(1020, 8),
        Err(HalError::OutOfRange { .. })
    ));

    // An executable of another device.
    let other = device(1);
    let foreign = other
        .load_kernels("f", CpuKernels::new().with_entry("a", |_| Ok(())))
        .unwrap();
    assert!(matches!(
        cb.dispatch(&foreign, 0, &[], &[], [1, 1, 1]),
        Err(HalError::WrongDevice { .. })
    ));
    // A command buffer of another device.
    let foreign_cb = other.create_command_buffer().unwrap().finish();
    assert!(matches!(
        dev.queue(0).unwrap().submit(&foreign_cb, &[], &[]),
        Err(HalError::WrongDevice { .. })
    ));
    // Nothing invalid was recorded.
    assert!(cb.finish().commands().is_empty());
}

#[test]
fn conflicting_views_fail_the_dispatch_instead_of_racing() {
    let dev = device(2);
    let buffer = dev.allocate(256, MemoryKind::DeviceLocal).unwrap();
    let exe = dev
        .load_kernels(
            "k",
            CpuKernels::new()
                .with_entry("in_place_wrong", |ctx| {
                    let _input = ctx.read(0)?;
                    let _output = ctx.write(1)?;
                    Ok(())
                })
                .with_entry("in_place_right", |ctx| {
                    let mut data = ctx.write(0)?;
                    data.iter_mut().for_each(|b| *b += 1);
                    Ok(())
                }),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let run = |entry, bindings: &[BufferRange]| {
        let mut cb = dev.create_command_buffer().unwrap();
        cb.dispatch(&exe, entry, bindings, &[], [1, 1, 1]).unwrap();
        submit_and_wait(&queue, cb, LONG)
    };
    let error = run(0, &[buffer.whole(), buffer.range(128, 128).unwrap()]).unwrap_err();
    assert!(error.to_string().contains("aliasing rule"), "{error}");
    run(1, &[buffer.whole()]).unwrap();
    assert_eq!(buffer.read_bytes(0, 256).unwrap(), vec![1u8; 256]);
}

#[test]
fn a_non_monotonic_queue_signal_fails_the_semaphore() {
    let dev = device(1);
    let s = Semaphore::host(5);
    let empty = dev.create_command_buffer().unwrap().finish();
    dev.queue(0)
        .unwrap()
        .submit(&empty, &[], &[(s.clone(), 3)])
        .unwrap();
    // 6 is never reached: the wait ends only through the failure.
    let error = s.wait(6, LONG).unwrap_err().to_string();
    assert!(error.contains("does not advance the timeline"), "{error}");
}

#[test]
fn queues_wait_on_each_other() {
    let dev = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 2,
        queue_count: 2,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(dev.queue_count(), 2);
    assert!(matches!(
        dev.queue(2),
        Err(HalError::NoSuchQueue { index: 2, count: 2 })
    ));
    let (q0, q1) = (dev.queue(0).unwrap(), dev.queue(1).unwrap());
    assert_eq!((q0.name(), q1.name()), ("cpu:0", "cpu:1"));
    let a = dev.allocate(16, MemoryKind::HostVisibleShared).unwrap();
    let b = dev.allocate(16, MemoryKind::HostVisibleShared).unwrap();
    let (produced, consumed) = (Semaphore::host(0), Semaphore::host(0));
    // Submit the consumer first: it must wait for the producer on the other queue.
    let mut consume = dev.create_command_buffer().unwrap();
    consume.copy(a.whole(), b.whole()).unwrap();
    q1.submit(
        &consume.finish(),
        &[(produced.clone(), 1)],
        &[(consumed.clone(), 1)],
    )
    .unwrap();
    let mut produce = dev.create_command_buffer().unwrap();
    produce.fill(a.whole(), FillPattern::U8(42)).unwrap();
    q0.submit(&produce.finish(), &[], &[(produced.clone(), 1)])
        .unwrap();
    consumed.wait(1, LONG).unwrap();
    assert_eq!(b.read_bytes(0, 16).unwrap(), vec![42u8; 16]);
}

#[test]
fn dispatches_are_traced() {
    let sink = Arc::new(MemoryTraceSink::new());
    let dev = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 2,
        trace_sink: Some(sink.clone()),
        ..Default::default()
    })
    .unwrap();
    let buffer = dev.allocate(64, MemoryKind::Host).unwrap();
    let exe = dev
        .load_kernels("net", CpuKernels::new().with_entry("relu", |_| Ok(())))
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [5, 1, 1]).unwrap();
    cb.fill(buffer.whole(), FillPattern::U8(0)).unwrap();
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG).unwrap();
    let events = sink.take();
    let dispatches: Vec<_> = events
        .iter()
        .filter(|e| e.kind == TraceKind::Dispatch)
        .collect();
    assert_eq!(dispatches.iter().map(|e| e.workgroups).sum::<u64>(), 5);
    for e in &dispatches {
        assert_eq!(
            (&*e.queue, &*e.executable, &*e.name),
            ("cpu:0", "net", "relu")
        );
        assert!(e.start <= e.end && !e.failed);
        assert!(e.thread.contains("worker"), "{}", e.thread);
    }
    assert_eq!(
        events.iter().filter(|e| e.kind == TraceKind::Fill).count(),
        1
    );
}

/// A chain of one-workgroup dispatches separated by barriers runs on one worker: the
/// worker that finishes a segment keeps the next segment's job instead of waking another
/// thread for it (the trace names the thread of every dispatch). The chain's order still
/// holds: each kernel checks that the one before it ran. Without the kept job, a woken
/// worker took some step in 13 of 20 runs on a 2-core machine.
#[test]
fn a_chain_of_single_dispatches_stays_on_one_worker() {
    let sink = Arc::new(MemoryTraceSink::new());
    let dev = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 4,
        trace_sink: Some(sink.clone()),
        ..Default::default()
    })
    .unwrap();
    let count = Arc::new(AtomicU32::new(0));
    let c = count.clone();
    let exe = dev
        .load_kernels(
            "chain",
            CpuKernels::new().with_entry("step", move |ctx| {
                let expected = ctx.param_u32(0)?;
                match c.compare_exchange(expected, expected + 1, Ordering::SeqCst, Ordering::SeqCst)
                {
                    Ok(_) => Ok(()),
                    Err(seen) => Err(format!("step {expected} ran after {seen} steps")),
                }
            }),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    for i in 0..20u32 {
        if i > 0 {
            cb.barrier();
        }
        cb.dispatch(&exe, 0, &[], &params(&[i]), [1, 1, 1]).unwrap();
    }
    submit_and_wait(&dev.queue(0).unwrap(), cb, LONG).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 20);
    let threads: Vec<_> = sink
        .take()
        .into_iter()
        .filter(|e| e.kind == TraceKind::Dispatch)
        .map(|e| e.thread)
        .collect();
    assert_eq!(threads.len(), 20);
    assert!(threads.iter().all(|t| *t == threads[0]), "{threads:?}");
}

#[test]
fn allocation_kinds_alignment_and_limits() {
    let dev = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 1,
        memory_limit: Some(1000),
        ..Default::default()
    })
    .unwrap();
    for kind in MemoryKind::ALL {
        assert!(dev.info().memory_kind(kind).unwrap().host_visible);
        let buffer = dev.allocate(100, kind).unwrap();
        assert_eq!((buffer.size(), buffer.memory_kind()), (100, kind));
        let address = buffer
            .map_read(0, 100, |bytes| bytes.as_ptr() as usize)
            .unwrap();
        assert_eq!(address % ALIGNMENT, 0);
        assert_eq!(buffer.read_bytes(0, 100).unwrap(), vec![0u8; 100]);
    }
    let empty = dev.allocate(0, MemoryKind::Host).unwrap();
    assert_eq!(empty.read_bytes(0, 0).unwrap(), Vec::<u8>::new());
    let kept = dev.allocate(900, MemoryKind::DeviceLocal).unwrap();
    assert_eq!(dev.allocated_bytes(), 900);
    assert!(matches!(
        dev.allocate(200, MemoryKind::DeviceLocal),
        Err(HalError::OutOfMemory { .. })
    ));
    drop(kept);
    dev.allocate(200, MemoryKind::DeviceLocal).unwrap();
    assert!(matches!(
        dev.allocate(u64::MAX, MemoryKind::Host),
        Err(HalError::BufferTooLarge { .. })
    ));
}

#[test]
fn executables_of_other_formats_are_refused() {
    let dev = device(1);
    let spirv = rafter_hal::ExecutableSpec {
        name: "shader".into(),
        format: rafter_hal::FORMAT_SPIRV.into(),
        payload: rafter_hal::ExecutablePayload::Bytes(vec![0u8; 4].into()),
    };
    assert!(matches!(
        dev.load_executable(&spirv),
        Err(HalError::UnsupportedExecutableFormat { .. })
    ));
    let twice = CpuKernels::new()
        .with_entry("a", |_| Ok(()))
        .with_entry("a", |_| Ok(()));
    assert!(matches!(
        dev.load_kernels("dup", twice),
        Err(HalError::InvalidExecutable { .. })
    ));
}

#[test]
fn dropping_the_device_with_work_in_flight_does_not_hang() {
    let dev = device(2);
    let exe = dev
        .load_kernels(
            "k",
            CpuKernels::new().with_entry("slow", |_| {
                std::thread::sleep(Duration::from_millis(2));
                Ok(())
            }),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let never = Semaphore::host(0);
    let (pending, running) = (Semaphore::host(0), Semaphore::host(0));
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [64, 1, 1]).unwrap();
    let cb = cb.finish();
    queue
        .submit(&cb, &[(never.clone(), 1)], &[(pending.clone(), 1)])
        .unwrap();
    queue.submit(&cb, &[], &[(running.clone(), 1)]).unwrap();

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(dev);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(LONG).expect("dropping the device hung");

    let error = pending.wait(1, LONG).unwrap_err().to_string();
    assert!(error.contains("device lost"), "{error}");
    // The running submission either finished or was cut short: never left pending.
    match running.wait(1, LONG) {
        Ok(()) => {}
        Err(SemaphoreError::Failed(reason)) => assert!(reason.contains("device lost"), "{reason}"),
        Err(other) => panic!("{other}"),
    }
    assert!(matches!(
        queue.submit(&cb, &[], &[]),
        Err(HalError::DeviceLost(_))
    ));
    // The semaphore the dropped device was waiting on still works.
    never.signal(1).unwrap();
}

/// A kernel that records the thread it ran on, once per workgroup.
fn records_thread(
    ran_on: &Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
) -> impl Fn(&DispatchContext<'_>) -> Result<(), String> {
    let ran_on = ran_on.clone();
    move |_| {
        ran_on.lock().unwrap().push(std::thread::current().id());
        Ok(())
    }
}

#[test]
fn a_helping_host_thread_runs_queued_work_and_its_chain() {
    // One worker, held by a gated kernel, so the second submission's jobs stay queued
    // until the host helps: they must then all run on the host thread, in order.
    let dev = device(1);
    let gate = Semaphore::host(0);
    let (started, is_running) = mpsc::channel();
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let exe = dev
        .load_kernels(
            "help",
            CpuKernels::new()
                .with_entry("hold", {
                    let gate = gate.clone();
                    move |_| {
                        started.send(()).map_err(|e| e.to_string())?;
                        block_on(&gate, 1)
                    }
                })
                .with_entry("record", records_thread(&ran_on)),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let mut hold = dev.create_command_buffer().unwrap();
    hold.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    let held = Semaphore::host(0);
    queue
        .submit(&hold.finish(), &[], &[(held.clone(), 1)])
        .unwrap();
    is_running.recv_timeout(LONG).unwrap();
    let mut chain = dev.create_command_buffer().unwrap();
    for i in 0..3 {
        if i > 0 {
            chain.barrier();
        }
        chain.dispatch(&exe, 1, &[], &[], [1, 1, 1]).unwrap();
    }
    let done = Semaphore::host(0);
    queue
        .submit(&chain.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    dev.help(&|| done.value() >= 1);
    assert_eq!(
        done.value(),
        1,
        "help returned before the queued work was done"
    );
    let me = std::thread::current().id();
    assert_eq!(*ran_on.lock().unwrap(), vec![me; 3]);
    gate.signal(1).unwrap();
    held.wait(1, LONG).unwrap();
}

#[test]
fn help_leaves_work_whose_waits_are_not_reached() {
    let dev = device(1);
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let exe = dev
        .load_kernels(
            "later",
            CpuKernels::new().with_entry("record", records_thread(&ran_on)),
        )
        .unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    let (gate, done) = (Semaphore::host(0), Semaphore::host(0));
    dev.queue(0)
        .unwrap()
        .submit(&cb.finish(), &[(gate.clone(), 1)], &[(done.clone(), 1)])
        .unwrap();
    // Nothing is runnable: help returns at once, without running the gated work.
    dev.help(&|| false);
    assert!(ran_on.lock().unwrap().is_empty());
    assert_eq!(done.value(), 0);
    gate.signal(1).unwrap();
    done.wait(1, LONG).unwrap();
    assert_eq!(ran_on.lock().unwrap().len(), 1);
}

/// A device with `records_thread` as entry 0, its queue, and a command buffer of one
/// dispatch of it.
fn recording_device(
    ran_on: &Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
) -> (CpuDevice, Queue, rafter_hal::CommandBuffer) {
    let dev = device(1);
    let exe = dev
        .load_kernels(
            "record",
            CpuKernels::new().with_entry("record", records_thread(ran_on)),
        )
        .unwrap();
    let queue = dev.queue(0).unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, 0, &[], &[], [1, 1, 1]).unwrap();
    (dev, queue, cb.finish())
}

#[test]
fn work_submitted_for_a_helper_runs_on_it() {
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);
    // Let the worker start, run once and go back to sleep: a worker still starting up
    // finds pushed work on its own (under qemu it did), which is not what is tested here.
    let first = Semaphore::host(0);
    queue.submit(&cb, &[], &[(first.clone(), 1)]).unwrap();
    first.wait(1, LONG).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let done = Semaphore::host(0);
    rafter_hal::submit_then_wait(|| queue.submit(&cb, &[], &[(done.clone(), 1)])).unwrap();
    dev.help(&|| done.value() >= 1);
    done.wait(1, LONG).unwrap();
    let ran_on = ran_on.lock().unwrap();
    assert_eq!(ran_on.len(), 2);
    assert_eq!(ran_on[1], std::thread::current().id());
}

#[test]
fn work_submitted_for_a_helper_that_leaves_at_once_goes_to_a_worker() {
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);
    // Let the worker run once and go back to sleep, so only a wake-up can start it again.
    let first = Semaphore::host(0);
    queue.submit(&cb, &[], &[(first.clone(), 1)]).unwrap();
    first.wait(1, LONG).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Pushed without waking the worker, for this thread; which leaves without helping.
    let done = Semaphore::host(0);
    rafter_hal::submit_then_wait(|| queue.submit(&cb, &[], &[(done.clone(), 1)])).unwrap();
    dev.help(&|| true);
    done.wait(1, Duration::from_secs(5)).unwrap();
    let ran_on = ran_on.lock().unwrap();
    assert_eq!(ran_on.len(), 2);
    assert_ne!(ran_on[1], std::thread::current().id());
}

#[test]
fn bindings_cut_to_live_lengths_see_only_their_first_bytes() {
    let dev = device(1);
    let a = f32_buffer(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let kernel = move |ctx: &DispatchContext<'_>| {
        let (cut, whole) = ctx.with_binding_lens(&[Some(8), None], |c| {
            let cut = c.read(0).map(|v| v.as_slice::<f32>().unwrap().to_vec());
            // Past the cut is out of range, as past an exact-size binding.
            assert!(c.read_range(0, 8, 4).is_err());
            (cut, c.binding_len(1))
        });
        // A length above the bound range leaves it as bound; the original context is whole.
        let longer = ctx.with_binding_lens(&[Some(1 << 20)], |c| c.binding_len(0));
        record
            .lock()
            .unwrap()
            .push((cut?, whole, longer, ctx.binding_len(0)));
        Ok(())
    };
    let exe = dev
        .load_kernels("cut", CpuKernels::new().with_entry("cut", kernel))
        .unwrap();
    let entry = exe.entry_index("cut").unwrap();
    let mut cb = dev.create_command_buffer().unwrap();
    cb.dispatch(&exe, entry, &[a.whole(), a.whole()], &[], [1, 1, 1])
        .unwrap();
    let queue = dev.queue(0).unwrap();
    submit_and_wait(&queue, cb, LONG).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.as_slice(), &[(vec![1.0, 2.0], 24, 24, 24)]);
}

/// Another device's semaphore, as the CPU device sees one: a host semaphore whose
/// `wait_direct` waits for it on the caller's thread once `armed` says that work which will
/// signal it is under way (a submitted GPU batch), and counts those waits. Its callbacks
/// come [`CALLBACK_HOP`] late, from another thread, as a device's monitor would bring them
/// (a host semaphore runs them on the signalling thread at once, which would always beat
/// the helper's wake-up).
#[derive(Debug)]
struct OtherDevice {
    inner: rafter_hal::HostSemaphore,
    armed: AtomicBool,
    direct_waits: AtomicU32,
}

impl rafter_hal::SemaphoreImpl for OtherDevice {
    fn value(&self) -> u64 {
        self.inner.value()
    }
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
    fn signal(&self, value: u64) -> Result<(), SemaphoreError> {
        self.inner.signal(value)
    }
    fn fail(&self, reason: String) {
        self.inner.fail(reason)
    }
    fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        self.inner.wait(value, timeout)
    }
    fn wait_direct(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        self.direct_waits.fetch_add(1, Ordering::Relaxed);
        Some(self.inner.wait(value, timeout))
    }
    fn notify_at(&self, value: u64, callback: rafter_hal::TimepointCallback) {
        self.inner.notify_at(
            value,
            Box::new(move |result| {
                std::thread::spawn(move || {
                    std::thread::sleep(CALLBACK_HOP);
                    callback(result)
                });
            }),
        )
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// How late [`OtherDevice`]'s callbacks come.
const CALLBACK_HOP: Duration = Duration::from_secs(2);

fn other_device(armed: bool) -> (Arc<OtherDevice>, Semaphore) {
    let other = Arc::new(OtherDevice {
        inner: rafter_hal::HostSemaphore::new(0),
        armed: AtomicBool::new(armed),
        direct_waits: AtomicU32::new(0),
    });
    (other.clone(), Semaphore::from_impl(other))
}

#[test]
fn a_helper_waits_for_another_devices_work_itself_and_runs_what_it_releases() {
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);
    let (other, gate) = other_device(true);
    let done = Semaphore::host(0);
    queue
        .submit(&cb, &[(gate.clone(), 1)], &[(done.clone(), 1)])
        .unwrap();
    let signaller = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            gate.signal(1).unwrap();
        })
    };
    // The pool is empty, but a submission waits for the other device: help waits for it
    // and runs the released work here (the worker is not woken for it).
    dev.help(&|| done.value() >= 1);
    signaller.join().unwrap();
    done.wait(1, LONG).unwrap();
    assert!(other.direct_waits.load(Ordering::Relaxed) >= 1);
    let ran_on = ran_on.lock().unwrap();
    assert_eq!(ran_on.len(), 1);
    assert_eq!(ran_on[0], std::thread::current().id());
}

#[test]
fn a_helper_leaves_work_that_nothing_under_way_will_release() {
    // The other device's value is not under way (`wait_direct` says `None`): help returns
    // at once, and the submission starts from its callback when the value comes.
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);
    let (other, gate) = other_device(false);
    let done = Semaphore::host(0);
    queue
        .submit(&cb, &[(gate.clone(), 1)], &[(done.clone(), 1)])
        .unwrap();
    dev.help(&|| false);
    assert!(ran_on.lock().unwrap().is_empty());
    assert_eq!(other.direct_waits.load(Ordering::Relaxed), 0);
    gate.signal(1).unwrap();
    done.wait(1, LONG).unwrap();
    assert_eq!(ran_on.lock().unwrap().len(), 1);
}

#[test]
fn a_helper_waiting_for_another_device_sees_its_failure_and_the_work_never_runs() {
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);
    let (_, gate) = other_device(true);
    let done = Semaphore::host(0);
    queue
        .submit(&cb, &[(gate.clone(), 1)], &[(done.clone(), 1)])
        .unwrap();
    let failer = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            gate.fail("the other device failed");
        })
    };
    // `done` fails, so `done()` stays false: help must still return once nothing is left.
    dev.help(&|| done.value() >= 1);
    failer.join().unwrap();
    match done.wait(1, LONG) {
        Err(SemaphoreError::Failed(reason)) => assert_eq!(reason, "the other device failed"),
        other => panic!("{other:?}"),
    }
    assert!(ran_on.lock().unwrap().is_empty());
}

#[test]
fn a_submission_released_by_the_last_of_several_waits_runs_once() {
    // Two waits signalled from two threads at once: whichever callback finds both reached
    // starts the work, exactly once.
    for _ in 0..50 {
        let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (_dev, queue, cb) = recording_device(&ran_on);
        let (a, b, done) = (Semaphore::host(0), Semaphore::host(0), Semaphore::host(0));
        queue
            .submit(&cb, &[(a.clone(), 1), (b.clone(), 1)], &[(done.clone(), 1)])
            .unwrap();
        let threads: Vec<_> = [a, b]
            .into_iter()
            .map(|s| std::thread::spawn(move || s.signal(1).unwrap()))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        done.wait(1, LONG).unwrap();
        assert_eq!(ran_on.lock().unwrap().len(), 1);
    }
}

/// A semaphore that says when its last handle is gone (as a Vulkan device counts its live
/// semaphores), and, once `armed`, lets a helper wait for it directly (as a Vulkan
/// semaphore with submitted work does). Its callbacks run at once, on the signalling
/// thread, like a host semaphore's.
#[derive(Debug)]
struct Tracked {
    inner: rafter_hal::HostSemaphore,
    armed: AtomicBool,
    dropped: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

impl rafter_hal::SemaphoreImpl for Tracked {
    fn value(&self) -> u64 {
        self.inner.value()
    }
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
    fn signal(&self, value: u64) -> Result<(), SemaphoreError> {
        self.inner.signal(value)
    }
    fn fail(&self, reason: String) {
        self.inner.fail(reason)
    }
    fn wait(&self, value: u64, timeout: Duration) -> Result<(), SemaphoreError> {
        self.inner.wait(value, timeout)
    }
    fn wait_direct(&self, value: u64, timeout: Duration) -> Option<Result<(), SemaphoreError>> {
        self.armed
            .load(Ordering::Acquire)
            .then(|| self.inner.wait(value, timeout))
    }
    fn notify_at(&self, value: u64, callback: rafter_hal::TimepointCallback) {
        self.inner.notify_at(value, callback)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A tracked semaphore and the flag its drop sets.
fn tracked(armed: bool) -> (Semaphore, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let semaphore = Semaphore::from_impl(Arc::new(Tracked {
        inner: rafter_hal::HostSemaphore::new(0),
        armed: AtomicBool::new(armed),
        dropped: dropped.clone(),
    }));
    (semaphore, dropped)
}

/// Once a waiting submission started or failed, the CPU device holds none of its wait
/// semaphores: with the device still alive, the caller's dropping its last handle frees
/// the semaphore (a Vulkan device counts it as live until then, and rafter-stress calls one
/// still alive after its round a leak). Three ways a submission with two waits, one of them
/// another device's, leaves the waiting state: the other device's value comes first and the
/// host's last; the host's wait fails first and the other device's value never comes (its
/// callback stays registered on it); a helper waits for the other device's value itself.
#[test]
fn a_submission_holds_no_wait_semaphore_once_it_started_or_failed() {
    let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dev, queue, cb) = recording_device(&ran_on);

    // The other device's value first, the host's last: the work runs.
    let (other, other_dropped) = tracked(false);
    let host = Semaphore::host(0);
    let done = Semaphore::host(0);
    queue
        .submit(
            &cb,
            &[(host.clone(), 1), (other.clone(), 1)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    other.signal(1).unwrap();
    host.signal(1).unwrap();
    done.wait(1, LONG).unwrap();
    drop(other);
    assert!(
        other_dropped.load(Ordering::Acquire),
        "the device still holds a started submission's wait semaphore"
    );

    // The host's wait fails; the other device's value never comes.
    let (other, other_dropped) = tracked(false);
    let host = Semaphore::host(0);
    let done = Semaphore::host(0);
    queue
        .submit(
            &cb,
            &[(other.clone(), 1), (host.clone(), 1)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    host.fail("the producer failed");
    match done.wait(1, LONG) {
        Err(SemaphoreError::Failed(reason)) => assert_eq!(reason, "the producer failed"),
        other => panic!("{other:?}"),
    }
    drop(other);
    assert!(
        other_dropped.load(Ordering::Acquire),
        "a failed submission's callback keeps its other wait semaphore alive"
    );

    // A helper waits for the other device's value itself and starts the work.
    let (other, other_dropped) = tracked(true);
    let host = Semaphore::host(0);
    let done = Semaphore::host(0);
    queue
        .submit(
            &cb,
            &[(host.clone(), 1), (other.clone(), 1)],
            &[(done.clone(), 1)],
        )
        .unwrap();
    host.signal(1).unwrap();
    let signaller = {
        let other = other.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            other.signal(1).unwrap();
        })
    };
    dev.help(&|| done.value() >= 1);
    signaller.join().unwrap();
    done.wait(1, LONG).unwrap();
    drop(other);
    assert!(
        other_dropped.load(Ordering::Acquire),
        "the device still holds a helper-started submission's wait semaphore"
    );
    assert_eq!(ran_on.lock().unwrap().len(), 2);
    assert!(
        dev.describe().contains("0 submissions waiting"),
        "{}",
        dev.describe()
    );
}
