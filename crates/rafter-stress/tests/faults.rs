//! Fault injection through the HAL (issue 28, item 3), on the CPU device and, when one
//! opens, the Vulkan device: a failed dispatch, a device lost mid-call, a failed
//! allocation and a semaphore never signalled each reach the waiting caller as an error
//! naming the step and device; later calls on the same session work (or, once the device
//! is lost, fail at once and cleanly); and nothing leaks (the CPU device's allocated bytes
//! and the Vulkan device's live semaphores and batches return to zero).
//!
//! The model is `y = -(x + x)` over 4096 floats, so every output is checked by hand.
//! `faulted_calls_keep_rss_flat` (ignored: run with `--ignored`) makes 10,000 faulted calls
//! and reports the resident memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rafter_hal::Device;
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};
use rafter_ir::DType;
use rafter_runtime::{DeviceSet, Session, SessionOptions, Tensor};
use rafter_stress::fault::{Fault, FaultyDevice};

const N: usize = 4096;
const LONG: Duration = Duration::from_secs(60);

const MODEL: &str = "graph @main(%x: f32[4096]) -> (%y) {
  %t: f32[4096] = binary{op = add}(%x, %x)
  %y: f32[4096] = unary{op = neg}(%t)
}";

fn input(seed: f32) -> (Tensor, Vec<f32>) {
    let x: Vec<f32> = (0..N).map(|i| seed + i as f32 * 0.25).collect();
    let want = x.iter().map(|v| -(v + v)).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    (
        Tensor::from_le_bytes(DType::F32, &[N], &bytes).unwrap(),
        want,
    )
}

fn values(t: &Tensor) -> Vec<f32> {
    t.le_bytes()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs one call and checks its output by hand.
fn call_ok(session: &Session, seed: f32) {
    let (x, want) = input(seed);
    let out = session.run(vec![x], LONG).expect("the call succeeds");
    assert_eq!(values(&out[0]), want);
}

fn call_err(session: &Session, timeout: Duration) -> String {
    let (x, _) = input(1.0);
    match session.submit(vec![x]) {
        Ok(handle) => handle
            .wait(timeout)
            .expect_err("the faulted call fails")
            .to_string(),
        Err(e) => e.to_string(),
    }
}

/// The test's devices: the CPU device (wrapped unless `vulkan` is given) and, for the
/// Vulkan target, the wrapped Vulkan device.
struct Rig {
    cpu: Arc<CpuDevice>,
    faulty: Arc<FaultyDevice>,
    #[cfg(feature = "vulkan")]
    vulkan: Option<Arc<rafter_hal_vulkan::VulkanDevice>>,
    devices: DeviceSet,
    target: &'static str,
}

impl Rig {
    fn cpu() -> Rig {
        let cpu = Arc::new(
            CpuDevice::new(CpuDeviceOptions {
                worker_threads: 2,
                ..CpuDeviceOptions::default()
            })
            .unwrap(),
        );
        let faulty = Arc::new(FaultyDevice::new(cpu.clone()));
        let devices = DeviceSet::new()
            .with("cpu", faulty.clone() as Arc<dyn Device>)
            .with_loader(rafter_runtime_cpu::loader());
        Rig {
            cpu,
            faulty,
            #[cfg(feature = "vulkan")]
            vulkan: None,
            devices,
            target: "cpu",
        }
    }

    #[cfg(feature = "vulkan")]
    fn vulkan() -> Option<Rig> {
        let vulkan = Arc::new(rafter_hal_vulkan::VulkanDevice::new(Default::default()).ok()?);
        let cpu = Arc::new(CpuDevice::new(CpuDeviceOptions::default()).unwrap());
        let faulty = Arc::new(FaultyDevice::new(vulkan.clone()));
        let devices = DeviceSet::new()
            .with("cpu", cpu.clone() as Arc<dyn Device>)
            .with("vulkan", faulty.clone() as Arc<dyn Device>)
            .with_loader(rafter_runtime_cpu::loader())
            .with_loader(rafter_runtime_vulkan::loader());
        Some(Rig {
            cpu,
            faulty,
            vulkan: Some(vulkan),
            devices,
            target: "vulkan",
        })
    }

    fn session(&self) -> Result<Session, String> {
        let graph = rafter_ir::text::parse_graph(MODEL).map_err(|e| e.to_string())?;
        let options = rafter_compiler::CompileOptions {
            target: rafter_compiler::target(self.target).map_err(|e| e.to_string())?,
            ..rafter_compiler::CompileOptions::default()
        };
        let compiled = rafter_compiler::compile(&graph, &options).map_err(|e| e.to_string())?;
        if self.target == "vulkan" {
            let on_gpu = compiled
                .program
                .kernels
                .iter()
                .filter(|k| k.device == "vulkan")
                .count();
            assert!(on_gpu > 0, "the Vulkan target placed no kernel on the GPU");
        }
        let artifact = compiled.to_artifact().map_err(|e| e.to_string())?;
        Session::from_artifact(artifact, &self.devices, SessionOptions::new())
            .map_err(|e| e.to_string())
    }

    /// Waits (up to 5 s, the Vulkan device retires batches after a grace) for the devices
    /// to hold nothing; panics naming what is left.
    fn assert_released(&self) {
        let start = Instant::now();
        loop {
            let cpu = self.cpu.allocated_bytes();
            #[cfg(feature = "vulkan")]
            let gpu = self.vulkan.as_ref().map_or((0, 0, 0), |v| v.live_objects());
            #[cfg(not(feature = "vulkan"))]
            let gpu = (0, 0, 0);
            if cpu == 0 && gpu == (0, 0, 0) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "leak: the CPU device holds {cpu} bytes; the Vulkan device (semaphores, batches, deferred) = {gpu:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn rigs() -> Vec<Rig> {
    #[allow(unused_mut)]
    let mut rigs = vec![Rig::cpu()];
    #[cfg(feature = "vulkan")]
    match Rig::vulkan() {
        Some(r) => rigs.push(r),
        None => eprintln!("no Vulkan device: the Vulkan half is skipped"),
    }
    rigs
}

#[test]
fn a_failed_dispatch_names_device_and_queue_and_the_session_recovers() {
    for rig in rigs() {
        let session = rig.session().unwrap();
        call_ok(&session, 0.5);
        rig.faulty.arm(Fault::Dispatch);
        let err = call_err(&session, LONG);
        let device = &rig.faulty.info().name;
        assert!(
            err.contains(&format!("dispatch failed on device '{device}', queue '"))
                && err.contains("injected kernel failure"),
            "{}: {err}",
            rig.target
        );
        assert_eq!(rig.faulty.fired(), 1);
        for i in 0..5 {
            call_ok(&session, i as f32);
        }
        drop(session);
        rig.assert_released();
    }
}

#[test]
fn a_device_lost_mid_call_fails_that_call_and_every_later_one_cleanly() {
    for rig in rigs() {
        let session = rig.session().unwrap();
        call_ok(&session, 0.5);
        rig.faulty.arm(Fault::DeviceLost);
        let err = call_err(&session, LONG);
        let device = &rig.faulty.info().name;
        assert!(
            err.contains(&format!("device '{device}' was lost (injected)")),
            "{}: {err}",
            rig.target
        );
        for _ in 0..3 {
            let start = Instant::now();
            let err = call_err(&session, LONG);
            assert!(
                err.contains("device lost"),
                "{}: later call: {err}",
                rig.target
            );
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "a later call hung"
            );
        }
        drop(session);
        rig.assert_released();
    }
}

/// Arms an allocation failure and opens a session and makes its first call: the session
/// allocates its weights when it opens and its first arena on the first call, so one of
/// the two fails; the error must name the device. A call after it works.
fn opening_allocation_fails(rig: &Rig) {
    rig.faulty.arm(Fault::Allocation);
    let device = rig.faulty.info().name.clone();
    let err = match rig.session() {
        Err(err) => err,
        Ok(session) => {
            assert!(
                rig.faulty.armed().is_some(),
                "{}: opening fired the fault yet succeeded",
                rig.target
            );
            let err = call_err(&session, LONG);
            call_ok(&session, 2.0);
            err
        }
    };
    assert!(
        err.contains(&format!("device '{device}': injected allocation failure")),
        "{}: {err}",
        rig.target
    );
}

#[test]
fn a_failed_allocation_is_an_error_naming_the_device_and_leaks_nothing() {
    for rig in rigs() {
        opening_allocation_fails(&rig);
        assert_eq!(
            rig.faulty.fired(),
            1,
            "{}: the allocation was never asked for",
            rig.target
        );
        let session = rig.session().unwrap();
        call_ok(&session, 3.0);
        drop(session);
        rig.assert_released();
    }
}

#[test]
fn a_semaphore_never_signalled_times_out_then_the_session_recovers() {
    for rig in rigs() {
        let session = rig.session().unwrap();
        call_ok(&session, 0.5);
        rig.faulty.arm(Fault::NeverSignal);
        let start = Instant::now();
        let err = call_err(&session, Duration::from_millis(300));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the timed-out wait overran"
        );
        assert!(
            err.contains("call 2") && err.contains("time"),
            "{}: {err}",
            rig.target
        );
        // Later calls do not wait on the lost one.
        call_ok(&session, 4.0);
        assert!(rig.faulty.abandon_swallowed("test over") > 0);
        call_ok(&session, 5.0);
        drop(session);
        rig.assert_released();
    }
}

/// 10,000 faults (a failed dispatch, a never-signalled call then abandoned, an allocation
/// failing as a session opens, in turn, each followed by a good call); RSS must stay flat.
#[test]
#[ignore = "on demand: 10,000 faults (about a minute)"]
fn faulted_calls_keep_rss_flat() {
    let rig = Rig::cpu();
    let session = rig.session().unwrap();
    let faults = [Fault::Dispatch, Fault::NeverSignal, Fault::Allocation];
    let mut rss = Vec::new();
    for i in 0..10_000usize {
        let fault = faults[i % faults.len()];
        rig.faulty.arm(fault);
        match fault {
            // The session's arenas are pooled: a warm call allocates nothing, and a session
            // that opens does.
            Fault::Allocation => {
                opening_allocation_fails(&rig);
            }
            Fault::NeverSignal => {
                call_err(&session, Duration::from_millis(1));
                rig.faulty.abandon_swallowed("abandoned by the RSS test");
            }
            _ => {
                call_err(&session, LONG);
            }
        }
        assert_eq!(rig.faulty.armed(), None);
        call_ok(&session, i as f32);
        if i % 1000 == 999 {
            rss.push(rafter_stress::rss::rss_kib().unwrap_or(0));
        }
    }
    eprintln!("RSS KiB after every 1000 faulted calls: {rss:?}");
    let growth = rss.last().unwrap().saturating_sub(rss[0]);
    assert!(
        growth < 4096,
        "RSS grew {growth} KiB over 9,000 faults: {rss:?}"
    );
    drop(session);
    rig.assert_released();
}
