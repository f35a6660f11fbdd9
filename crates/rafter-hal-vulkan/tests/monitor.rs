//! The monitor thread serves every kind of waiter: a CPU submission after GPU work (its
//! callback starts the CPU part), a host thread waiting for the GPU, a GPU batch signalling
//! another device's semaphore (signalled when the batch retires), a failure while waiting;
//! each is woken, in order, and nothing is left held.

mod common;

use std::time::Duration;

use rafter_hal::{Device, FillPattern, MemoryKind, Semaphore, SemaphoreError};
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};

const WAIT: Duration = Duration::from_secs(60);

/// GPU -> CPU -> GPU chains, several in flight: each CPU part starts from the monitor's
/// callback once the GPU's value is reached (it copies what the GPU wrote, so it fails the
/// comparison if it ran early), the last GPU part waits on the CPU's host signal, and a
/// host thread waits for the end through the monitor.
#[test]
fn monitor_serves_gpu_to_cpu_to_gpu_chains() {
    let Some(device) = common::device_or_skip("monitor_serves_gpu_to_cpu_to_gpu_chains") else {
        return;
    };
    let cpu = CpuDevice::new(CpuDeviceOptions {
        worker_threads: 2,
        ..Default::default()
    })
    .unwrap();
    let (gpu_queue, cpu_queue) = (device.queue(0).unwrap(), cpu.queue(0).unwrap());
    let slow = common::slow_commands(&device, 16 << 20, 8);
    let chains = 6;
    let mut pending = Vec::new();
    for chain in 0..chains {
        // The GPU writes the chain's number into host-visible memory after slow work; the
        // CPU copies it into its own buffer; the GPU then overwrites the shared word.
        let shared = device.allocate(256, MemoryKind::HostVisibleShared).unwrap();
        let copy = cpu.allocate(256, MemoryKind::HostVisibleShared).unwrap();
        let word = 100 + chain as u32;
        let mut builder = device.create_command_buffer().unwrap();
        builder
            .fill(shared.range(0, 256).unwrap(), FillPattern::U32(word))
            .unwrap();
        let write = builder.finish();
        let mut builder = cpu.create_command_buffer().unwrap();
        builder
            .copy(shared.range(0, 256).unwrap(), copy.range(0, 256).unwrap())
            .unwrap();
        let read = builder.finish();
        let mut builder = device.create_command_buffer().unwrap();
        builder
            .fill(shared.range(0, 256).unwrap(), FillPattern::U32(7))
            .unwrap();
        let overwrite = builder.finish();
        let (gpu_done, cpu_done, end) = (
            device.create_semaphore(0).unwrap(),
            Semaphore::host(0),
            device.create_semaphore(0).unwrap(),
        );
        let slow_done = device.create_semaphore(0).unwrap();
        // Submitted last-first: the CPU part and the overwrite wait for values nothing has
        // submitted yet.
        gpu_queue
            .submit(&overwrite, &[(cpu_done.clone(), 1)], &[(end.clone(), 1)])
            .unwrap();
        cpu_queue
            .submit(&read, &[(gpu_done.clone(), 1)], &[(cpu_done.clone(), 1)])
            .unwrap();
        gpu_queue
            .submit(&slow, &[], &[(slow_done.clone(), 1)])
            .unwrap();
        gpu_queue
            .submit(&write, &[(slow_done.clone(), 1)], &[(gpu_done.clone(), 1)])
            .unwrap();
        pending.push((end, copy, shared, word));
    }
    for (end, copy, shared, word) in pending {
        end.wait(1, WAIT).unwrap();
        let copied = copy.read_bytes(0, 256).unwrap();
        assert!(
            copied.chunks(4).all(|w| w == word.to_le_bytes()),
            "the CPU part ran before the GPU's value: {:?}",
            &copied[..8]
        );
        assert_eq!(shared.read_bytes(0, 4).unwrap(), 7u32.to_le_bytes());
    }
    assert_eq!(common::holds_nothing(&device), (0, 0, 0));
    drop(cpu);
}

/// A GPU batch that signals another device's (here the host's) semaphore: the monitor
/// signals it when the batch retires.
#[test]
fn monitor_signals_other_devices_semaphores() {
    let Some(device) = common::device_or_skip("monitor_signals_other_devices_semaphores") else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let slow = common::slow_commands(&device, 16 << 20, 4);
    let host = Semaphore::host(0);
    for value in 1..=5 {
        queue.submit(&slow, &[], &[(host.clone(), value)]).unwrap();
    }
    host.wait(5, WAIT).unwrap();
    assert_eq!(host.value(), 5);
    assert_eq!(common::holds_nothing(&device), (0, 0, 0));
}

/// A host wait for a GPU value that fails while the GPU works ends with the failure, and
/// the GPU's own later work still completes.
#[test]
fn monitor_reports_a_failure_while_the_gpu_works() {
    let Some(device) = common::device_or_skip("monitor_reports_a_failure_while_the_gpu_works")
    else {
        return;
    };
    let queue = device.queue(0).unwrap();
    let slow = common::slow_commands(&device, 16 << 20, 16);
    let (slow_done, gpu) = (
        device.create_semaphore(0).unwrap(),
        device.create_semaphore(0).unwrap(),
    );
    queue.submit(&slow, &[], &[(slow_done.clone(), 1)]).unwrap();
    queue
        .submit(&slow, &[(slow_done.clone(), 1)], &[(gpu.clone(), 1)])
        .unwrap();
    let waiter = {
        let gpu = gpu.clone();
        std::thread::spawn(move || gpu.wait(1, WAIT))
    };
    std::thread::sleep(Duration::from_millis(1));
    gpu.fail("the producer failed");
    match waiter.join().unwrap() {
        Err(SemaphoreError::Failed(reason)) => assert_eq!(reason, "the producer failed"),
        other => panic!("{other:?}"),
    }
    slow_done.wait(1, WAIT).unwrap();
    drop((gpu, slow_done));
    assert_eq!(common::holds_nothing(&device), (0, 0, 0));
}
