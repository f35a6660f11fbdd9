//! Programs split across the CPU and a real Vulkan device (lavapipe in CI) by the
//! partitioner's placement machinery: a model forced across both devices at every cut
//! point, in both directions, with several calls in flight, and a `--memory-limit` that
//! forces a split; outputs must equal the single-device (CPU) run.
//!
//! Without a Vulkan device each test prints why and passes, unless `RAFTER_REQUIRE_VULKAN`
//! is set (CI installs lavapipe and sets it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rafter_compiler::CompileOptions;
use rafter_hal::Device;
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions, VulkanError};
use rafter_ir::program::{Program, Step, Storage};
use rafter_ir::text::parse_graph;
use rafter_ir::Graph;
use rafter_opt::partition::{PlacementOptions, Profiles, SharedMemory, Strategy};
use rafter_runtime::{DeviceSet, Session, SessionOptions, Tensor};

const WAIT: Duration = Duration::from_secs(120);

/// `cpu` and `vulkan`, or `None` after printing why the test is skipped.
fn devices_or_skip(test: &str) -> Option<DeviceSet> {
    match VulkanDevice::new(VulkanDeviceOptions::default()) {
        Ok(device) => Some(
            rafter_runtime_cpu::devices()
                .unwrap()
                .with("vulkan", Arc::new(device) as Arc<dyn Device>)
                .with_loader(rafter_runtime_vulkan::loader()),
        ),
        Err(error @ VulkanError::NoDevice { .. }) => {
            let required =
                std::env::var("RAFTER_REQUIRE_VULKAN").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "{test}: RAFTER_REQUIRE_VULKAN is set but: {error}"
            );
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(error) => panic!("{test}: opening the Vulkan device failed: {error}"),
    }
}

fn rand(dims: &[usize], seed: u32) -> Tensor {
    let n: usize = dims.iter().product();
    let v = (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            (x % 4001) as f32 / 1000.0 - 2.0
        })
        .collect();
    Tensor::f32s(dims, v)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn dense(n: usize, seed: usize) -> String {
    let v: Vec<String> = (0..n)
        .map(|i| format!("{:?}", (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 16.0))
        .collect();
    format!("dense [{}]", v.join(", "))
}

/// Kernels every device runs: matmul(+relu), sigmoid·x, matmul, tanh + add; the input
/// read twice, the last kernel reading a tensor made kernels before.
fn chain() -> Graph {
    parse_graph(&format!(
        r#"graph @chain(%x: f32[4, 8]) -> (%y, %m) {{
  const %w1: f32[8, 8] = {}
  const %w2: f32[8, 8] = {}
  %a: f32[4, 8] = matmul(%x, %w1)
  %r: f32[4, 8] = unary{{op = relu}}(%a)
  %s: f32[4, 8] = unary{{op = sigmoid}}(%r)
  %t: f32[4, 8] = binary{{op = mul}}(%s, %x)
  %m: f32[4, 8] = matmul(%t, %w2)
  %h: f32[4, 8] = unary{{op = tanh}}(%m)
  %y: f32[4, 8] = binary{{op = add}}(%h, %r)
}}"#,
        dense(64, 1),
        dense(64, 2)
    ))
    .unwrap()
}

/// `g` lowered for the host, then placed with `devices` (0 the host, 1 vulkan), planned
/// and packaged for the Vulkan target.
fn forced(g: &Graph, devices: &[usize]) -> rafter_compiler::Compiled {
    forced_with(g, devices, None)
}

/// As [`forced`], with the Vulkan device's link zero-copy in `zero_copy` memory, or not.
fn forced_with(
    g: &Graph,
    devices: &[usize],
    zero_copy: Option<SharedMemory>,
) -> rafter_compiler::Compiled {
    let target = rafter_compiler::target("vulkan").unwrap();
    let mut p: Program = rafter_opt::lower(g, &rafter_opt::LowerOptions::default()).unwrap();
    assert_eq!(p.kernels.len(), devices.len(), "{:#?}", p.kernels);
    let names = rafter_opt::place::device_names(target.accelerators());
    rafter_opt::place::apply_placement(&mut p, &names, devices, &[None, zero_copy]);
    rafter_opt::memplan::plan_memory(&mut p, &rafter_opt::memplan::PlanOptions::default()).unwrap();
    p.verify().unwrap();
    rafter_compiler::package(p, &target).unwrap()
}

fn session(c: &rafter_compiler::Compiled, devices: &DeviceSet) -> Session {
    let mut opts = SessionOptions::new();
    for (d, bytes) in c.executables() {
        opts = opts.executable(&d, bytes);
    }
    Session::with_options(c.program.clone(), devices, opts).unwrap()
}

/// Several calls in flight on `s`, each compared with `want` (per seed).
fn check_in_flight(s: &Session, want: &BTreeMap<u32, Vec<Tensor>>, what: &str) {
    let handles: Vec<_> = want
        .keys()
        .map(|&seed| (seed, s.submit_to_wait(vec![rand(&[4, 8], seed)]).unwrap()))
        .collect();
    for (seed, h) in handles {
        let got = h.wait(WAIT).unwrap();
        for (i, (a, b)) in got.iter().zip(&want[&seed]).enumerate() {
            let d = max_abs_diff(a, b);
            assert!(
                d <= 1e-5,
                "{what}, seed {seed}, output {i}: max abs diff {d}"
            );
        }
    }
}

/// The all-CPU outputs for seeds 1..=4.
fn cpu_outputs(g: &Graph, devices: &DeviceSet) -> BTreeMap<u32, Vec<Tensor>> {
    let c = rafter_compiler::compile(g, &CompileOptions::default()).unwrap();
    let s = session(&c, devices);
    (1..=4)
        .map(|seed| (seed, s.run(vec![rand(&[4, 8], seed)], WAIT).unwrap()))
        .collect()
}

#[test]
fn a_model_cut_across_both_devices_at_every_point_matches_the_cpu_run() {
    let Some(devices) = devices_or_skip("a_model_cut_across_both_devices") else {
        return;
    };
    let g = chain();
    let want = cpu_outputs(&g, &devices);
    let n = rafter_opt::lower(&g, &rafter_opt::LowerOptions::default())
        .unwrap()
        .kernels
        .len();
    assert!(n >= 4, "the chain fuses into at least four kernels");
    let mut placements: Vec<Vec<usize>> = Vec::new();
    for cut in 0..=n {
        // GPU then CPU, and CPU then GPU, cut before kernel `cut`.
        placements.push((0..n).map(|k| usize::from(k < cut)).collect());
        placements.push((0..n).map(|k| usize::from(k >= cut)).collect());
    }
    placements.push((0..n).map(|k| k % 2).collect());
    placements.push((0..n).map(|k| 1 - k % 2).collect());
    for placement in placements {
        let c = forced(&g, &placement);
        let s = session(&c, &devices);
        check_in_flight(&s, &want, &format!("placement {placement:?}"));
    }
}

#[test]
fn a_memory_limit_splits_a_model_and_its_outputs_match_the_cpu_run() {
    let Some(devices) = devices_or_skip("a_memory_limit_splits_a_model") else {
        return;
    };
    let g = chain();
    let want = cpu_outputs(&g, &devices);
    // Dispatches cost 1 ms on the host and nothing on the GPU, crossings are free: the
    // cost model wants every kernel on the GPU, and a limit below that placement's memory
    // must move some (not all) kernels to the host.
    let mut profiles = Profiles::default();
    let mut cpu = rafter_opt::partition::DeviceDescription::default_for("cpu");
    cpu.profile.dispatch_s = 1e-3;
    let mut gpu = rafter_opt::partition::DeviceDescription::default_for("vulkan");
    gpu.link.as_mut().unwrap().latency_s = 0.0;
    gpu.profile.dispatch_s = 0.0;
    gpu.profile.barrier_s = 0.0;
    profiles.insert(cpu);
    profiles.insert(gpu);
    let placement = |limit: Option<u64>| PlacementOptions {
        strategy: Strategy::CostModel,
        profiles: profiles.clone(),
        memory_limits: limit
            .map(|l| BTreeMap::from([("vulkan".to_string(), l)]))
            .unwrap_or_default(),
        ..PlacementOptions::default()
    };
    let compile = |limit| {
        let target = rafter_compiler::target("vulkan")
            .unwrap()
            .with_placement(placement(limit));
        let opts = CompileOptions {
            target,
            ..CompileOptions::default()
        };
        rafter_compiler::compile(&g, &opts)
    };
    let whole = compile(None).unwrap();
    let on = |c: &rafter_compiler::Compiled| -> Vec<String> {
        c.program.kernels.iter().map(|k| k.device.clone()).collect()
    };
    assert!(on(&whole).iter().all(|d| d == "vulkan"), "{:?}", on(&whole));
    // The memory the all-GPU placement needs there, from the cost model.
    let lowered = rafter_opt::lower(&g, &rafter_opt::LowerOptions::default()).unwrap();
    let model = rafter_opt::partition::model(
        &lowered,
        &rafter_compiler::target("vulkan")
            .unwrap()
            .with_placement(placement(None)),
    );
    let all_gpu = model.evaluate(&vec![1; lowered.kernels.len()]).memory_bytes[1];
    let split = compile(Some(all_gpu - 1)).unwrap();
    let devs = on(&split);
    assert!(devs.iter().any(|d| d == "vulkan"), "{devs:?}");
    assert!(devs.iter().any(|d| d == "cpu"), "{devs:?}");
    let s = session(&split, &devices);
    check_in_flight(&s, &want, "memory-limited split");
    // Room for nothing on the GPU: the host (unlimited) takes every kernel.
    let none = compile(Some(100)).unwrap();
    assert!(on(&none).iter().all(|d| d == "cpu"), "{:?}", on(&none));
}

/// Whether `d`'s memory is the host's (lavapipe, unified memory): what makes a boundary
/// zero-copy.
fn shares_host_memory(devices: &DeviceSet) -> bool {
    devices
        .get("vulkan")
        .and_then(|d| {
            d.info()
                .memory_kind(rafter_hal::MemoryKind::DeviceLocal)
                .map(|m| m.host_visible && m.host_coherent)
        })
        .unwrap_or(false)
}

/// Every cut of [`chain`] across the two devices, and two alternating placements.
fn cut_placements(g: &Graph) -> Vec<Vec<usize>> {
    let n = rafter_opt::lower(g, &rafter_opt::LowerOptions::default())
        .unwrap()
        .kernels
        .len();
    let mut placements: Vec<Vec<usize>> = Vec::new();
    for cut in 1..n {
        placements.push((0..n).map(|k| usize::from(k < cut)).collect());
        placements.push((0..n).map(|k| usize::from(k >= cut)).collect());
    }
    placements.push((0..n).map(|k| k % 2).collect());
    placements.push((0..n).map(|k| 1 - k % 2).collect());
    placements
}

/// The zero-copy boundaries of `c`: kernels' operands in another device's arena, each of
/// which must be of `memory`; panics on a kernel's result that is copied.
fn zero_copy_boundaries(c: &rafter_compiler::Compiled, memory: &str, what: &str) -> usize {
    let p = &c.program;
    let mut shared = 0;
    for step in &p.steps {
        match step {
            Step::Copy { src, .. } => assert!(
                !matches!(p.buffers[*src].storage, Storage::Arena { .. }),
                "{what}: a kernel's result `{}` is copied",
                p.buffers[*src].name
            ),
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                for &b in args.iter().chain(results.iter().flatten()) {
                    if let Storage::Arena { arena, .. } = p.buffers[b].storage {
                        if p.arenas[arena].device != p.kernels[*kernel].device {
                            assert_eq!(p.arenas[arena].memory, memory, "{what}");
                            shared += 1;
                        }
                    }
                }
            }
        }
    }
    shared
}

/// A discrete GPU's zero-copy (`SharedMemory::Host`): crossing tensors live in the Vulkan
/// device's host-cached `host` memory, which its kernels reach by address and the CPU's
/// kernels read and write in place. On lavapipe that memory is host memory, so this runs
/// the real thing; on a discrete GPU the kernels reach it over the bus.
#[test]
fn zero_copy_boundaries_in_host_memory_at_every_cut_point_match_the_cpu_run() {
    let Some(devices) = devices_or_skip("zero_copy_in_host_memory") else {
        return;
    };
    let g = chain();
    let want = cpu_outputs(&g, &devices);
    for placement in cut_placements(&g) {
        let c = forced_with(&g, &placement, Some(SharedMemory::Host));
        let what = format!("zero-copy placement {placement:?} in host memory");
        assert!(zero_copy_boundaries(&c, "host", &what) > 0, "{what}: none");
        let s = session(&c, &devices);
        check_in_flight(&s, &want, &what);
    }
}

#[test]
fn zero_copy_boundaries_at_every_cut_point_match_the_cpu_run_without_copies() {
    let Some(devices) = devices_or_skip("zero_copy_boundaries") else {
        return;
    };
    if !shares_host_memory(&devices) {
        eprintln!("skipping zero_copy_boundaries: this Vulkan device's memory is not the host's");
        return;
    }
    let g = chain();
    let want = cpu_outputs(&g, &devices);
    for placement in cut_placements(&g) {
        let c = forced_with(&g, &placement, Some(SharedMemory::Device));
        // No tensor a kernel makes is copied: each crossing one is allocated once, in the
        // device's host-visible arena, and both devices' kernels work on it in place.
        let what = format!("zero-copy placement {placement:?}");
        assert!(
            zero_copy_boundaries(&c, "host_visible_shared", &what) > 0,
            "{what}: no zero-copy boundary"
        );
        let s = session(&c, &devices);
        check_in_flight(&s, &want, &what);
    }
}
