//! The cost-model partitioner with fixed profiles: IR in, placement out. The accelerator
//! here is a SIMULATION: `npu`, a device given only by a description (a restricted op set
//! and its own cost profile), with no code generator behind it; the placed programs are
//! checked by interpreting them (arenas as real bytes), not by running an `npu`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{check_equivalent_with, parse, rand_f32};
use rafter_ir::program::Program;
use rafter_ir::program::{Step, Storage};
use rafter_ir::Graph;
use rafter_opt::partition::{
    self, ClassRate, CostProfile, DeviceDescription, Link, Objective, PlacementOptions, Profiles,
    SharedMemory, Strategy,
};
use rafter_opt::{Backend, CompileOptions, Section, Target};

/// A simulated accelerator running kernels made only of the given ops.
struct Npu(&'static [&'static str]);

impl Backend for Npu {
    fn device(&self) -> &str {
        "npu"
    }
    fn supports(&self, body: &Graph) -> Result<(), String> {
        match body.nodes.iter().find(|n| !self.0.contains(&n.op.name())) {
            Some(n) => Err(format!("no `{}` on the simulated npu", n.op.name())),
            None => Ok(()),
        }
    }
    fn emit(&self, _: &Program) -> Result<Section, String> {
        Err("the npu is simulated".into())
    }
}

/// One rate for every class.
fn profile(flops: f64, bytes: f64, dispatch: f64) -> CostProfile {
    let classes = partition::device::CLASSES
        .into_iter()
        .map(|k| {
            let r = ClassRate {
                flops_per_s: flops,
                bytes_per_s: bytes,
                half_flops: 0.0,
                half_scale: None,
                depth_s: 0.0,
            };
            (partition::device::class_name(k), r)
        })
        .collect();
    CostProfile {
        classes,
        dispatch_s: dispatch,
        barrier_s: 0.0,
        half_scale: 1.0,
        dispatch_overlaps: false,
        residuals: Default::default(),
        weight_cache: None,
    }
}

/// A CPU of 10 GFLOP/s, 10 GB/s; an npu of `npu_flops`, 100 GB/s, behind `link`.
fn profiles(npu_flops: f64, link: Link) -> Profiles {
    let mut p = Profiles::default();
    p.insert(DeviceDescription {
        name: "cpu".into(),
        profile: profile(10e9, 10e9, 1e-6),
        memory_bytes: None,
        link: None,
    });
    p.insert(DeviceDescription {
        name: "npu".into(),
        profile: profile(npu_flops, 100e9, 1e-6),
        memory_bytes: None,
        link: Some(link),
    });
    p
}

fn slow_link() -> Link {
    Link {
        bytes_per_s: 1e9,
        latency_s: 50e-6,
        zero_copy: false,
        shared_memory: SharedMemory::Device,
    }
}

fn target(ops: &'static [&'static str], placement: PlacementOptions) -> Target {
    Target::cpu()
        .with(Arc::new(Npu(ops)))
        .with_placement(placement)
}

fn cost_model(profiles: Profiles) -> PlacementOptions {
    PlacementOptions {
        strategy: Strategy::CostModel,
        profiles,
        ..PlacementOptions::default()
    }
}

fn devices(p: &Program) -> Vec<&str> {
    p.kernels.iter().map(|k| k.device.as_str()).collect()
}

/// Lowers `g` for the host only (the partitioner's input).
fn lowered(g: &Graph) -> Program {
    rafter_opt::lower(g, &rafter_opt::LowerOptions::default()).unwrap()
}

/// Big matmul → transpose → relu → transpose → big matmul: the npu runs matmuls and
/// relu, not transposes, so greedy sends the relu back to the npu between two host
/// transposes (four crossings).
const MID_GRAPH: &str = r#"graph @g(%x: f32[256, 256], %w1: f32[256, 256], %w2: f32[256, 256]) -> (%y) {
  %a: f32[256, 256] = matmul(%x, %w1)
  %t: f32[256, 256] = transpose{perm = [1, 0]}(%a)
  %r: f32[256, 256] = unary{op = relu}(%t)
  %u: f32[256, 256] = transpose{perm = [1, 0]}(%r)
  %y: f32[256, 256] = matmul(%u, %w2)
}"#;

const NPU_OPS: &[&str] = &["matmul", "relu", "unary"];

/// [`MID_GRAPH`] compiled for `t`: the placed program, checked to compute what the graph
/// does on random inputs.
fn mid_graph_equivalent(g: &Graph, t: Target) -> Program {
    check_equivalent_with(
        g,
        vec![
            rand_f32(&[256, 256], 1),
            rand_f32(&[256, 256], 2),
            rand_f32(&[256, 256], 3),
        ],
        &CompileOptions {
            target: t,
            ..CompileOptions::default()
        },
    )
}

#[test]
fn the_partitioner_beats_greedy_when_unsupported_kernels_sit_mid_graph() {
    let g = parse(MID_GRAPH);
    let opts = cost_model(profiles(1e12, slow_link()));
    let t = target(NPU_OPS, opts.clone());
    let p = lowered(&g);
    let m = partition::model(&p, &t);
    let greedy = m.greedy();
    let g_est = m.evaluate(&greedy);
    let (best, est) = m.search(Objective::Latency);
    let names = |v: &[usize]| -> Vec<&str> { v.iter().map(|&d| ["cpu", "npu"][d]).collect() };
    assert_eq!(names(&greedy), ["npu", "cpu", "npu", "cpu", "npu"]);
    assert_eq!(g_est.crossings, 4);
    // The relu stays between the transposes on the host: two crossings, not four.
    assert_eq!(names(&best), ["npu", "cpu", "cpu", "cpu", "npu"]);
    assert_eq!(est.crossings, 2);
    // Hand-computed: matmuls 2·256³ flops at 1 TFLOP/s = 33.554 us + 1 us dispatch each;
    // transposes and relu 2·256 KiB at 10 GB/s = 52.429 us + 1 us each; crossings of 256
    // KiB at 1 GB/s = 262.144 us + 50 us latency each. The host first writes the three
    // inputs (256 KiB each) into the npu's memory, 786 us, behind which the first matmul
    // runs (at 574 us to 609 us); the first crossing waits for the host, and the result
    // comes back (256 KiB) after the second matmul.
    let mm = 2.0 * 256f64.powi(3) / 1e12 + 1e-6;
    let host = 2.0 * 262144.0 / 10e9 + 1e-6;
    let up = 262144.0 / 1e9;
    let cross = up + 50e-6;
    let want = 3.0 * up + 2.0 * cross + 3.0 * host + mm + up;
    assert!(
        (est.makespan_s - want).abs() < 1e-9,
        "{} vs {want}",
        est.makespan_s
    );
    // Greedy: the relu on the npu (1 us + 512 KiB at 100 GB/s) for two more crossings.
    let greedy_want = want - host + (1e-6 + 2.0 * 262144.0 / 100e9) + 2.0 * cross;
    assert!(
        (g_est.makespan_s - greedy_want).abs() < 1e-9,
        "{}",
        g_est.makespan_s
    );
    assert!(est.makespan_s < 0.8 * g_est.makespan_s);
    // And through the compiler: the placed program computes what the graph does.
    let compiled = mid_graph_equivalent(&g, t);
    assert_eq!(devices(&compiled), ["npu", "cpu", "cpu", "cpu", "npu"]);
}

/// A split the model scores better than greedy-by-support, but by less than
/// [`partition::SPLIT_MARGIN`], does not replace it: the model's error on the difference
/// between two placements is larger than that (see the constant's doc).
#[test]
fn a_split_estimated_within_the_margin_keeps_greedy_by_support() {
    // Zero-copy in the npu's memory: a crossing costs the latency alone, so greedy's two
    // extra crossings (2 x 26 us) cost barely more than the relu on the host saves.
    let link = Link {
        bytes_per_s: 1e9,
        latency_s: 26e-6,
        zero_copy: true,
        shared_memory: SharedMemory::Device,
    };
    let t = target(NPU_OPS, cost_model(profiles(1e12, link)));
    let m = partition::model(&lowered(&parse(MID_GRAPH)), &t);
    let greedy = m.greedy();
    let split = vec![1, 0, 0, 0, 1];
    let (g, s) = (m.evaluate(&greedy), m.evaluate(&split));
    assert!(
        s.makespan_s < g.makespan_s
            && s.makespan_s > g.makespan_s * (1.0 - partition::SPLIT_MARGIN),
        "the split should be better, within the margin: {} vs {}",
        s.makespan_s,
        g.makespan_s
    );
    let (best, est) = m.search(Objective::Latency);
    assert_eq!(best, greedy);
    assert_eq!(est, g);
    // The same split with a slower link's crossings is far ahead, and kept (the test
    // above): the margin decides only near-ties.
}

/// A discrete accelerator reaching host memory over its bus (`shared_memory=host`): the
/// crossings of the best split are no copies but tensors in the npu's `host` arena, which
/// both devices' kernels use in place; the estimate still pays the bus (the same bytes at
/// the link's rate) but not the host's copy work.
#[test]
fn a_link_shared_in_host_memory_places_crossings_in_the_host_arena_without_copies() {
    let g = parse(MID_GRAPH);
    let estimate = |shared: Option<SharedMemory>| {
        let mut link = slow_link();
        link.zero_copy = shared.is_some();
        link.shared_memory = shared.unwrap_or_default();
        let t = target(NPU_OPS, cost_model(profiles(1e12, link)));
        let m = partition::model(&lowered(&g), &t);
        let (best, est) = m.search(Objective::Latency);
        (best, est, t)
    };
    let (copy_best, copy_est, _) = estimate(None);
    let (host_best, host_est, t) = estimate(Some(SharedMemory::Host));
    let (_, device_est, _) = estimate(Some(SharedMemory::Device));
    assert_eq!(host_best, copy_best);
    assert!(host_est.boundaries.iter().all(|b| b.zero_copy));
    // The same bytes cross the bus at the same rate; only the host's copying is gone, and
    // a link whose memory is the host's pays no bus at all.
    assert!(host_est.makespan_s <= copy_est.makespan_s + 1e-12);
    assert!(device_est.makespan_s < host_est.makespan_s);
    let compiled = mid_graph_equivalent(&g, t);
    assert_eq!(devices(&compiled), ["npu", "cpu", "cpu", "cpu", "npu"]);
    let mut shared = 0;
    for step in &compiled.steps {
        match step {
            Step::Copy { src, .. } => assert!(
                !matches!(compiled.buffers[*src].storage, Storage::Arena { .. }),
                "a kernel's result `{}` is copied",
                compiled.buffers[*src].name
            ),
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                for &b in args.iter().chain(results.iter().flatten()) {
                    if let Storage::Arena { arena, .. } = compiled.buffers[b].storage {
                        let a = &compiled.arenas[arena];
                        if a.device != compiled.kernels[*kernel].device {
                            assert_eq!((a.device.as_str(), a.memory.as_str()), ("npu", "host"));
                            shared += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(
        shared, 2,
        "the host reads one crossing and writes the other, in place"
    );
}

#[test]
fn a_slow_accelerator_loses_to_the_host_and_the_program_compiles_for_the_cpu() {
    // An npu no faster than the host behind a slow link: crossings only cost.
    let g = parse(MID_GRAPH);
    let t = target(NPU_OPS, cost_model(profiles(10e9, slow_link())));
    let m = partition::model(&lowered(&g), &t);
    let (best, _) = m.search(Objective::Latency);
    assert_eq!(best, [0, 0, 0, 0, 0]);
    let p = rafter_opt::compile(
        &g,
        &CompileOptions {
            target: t,
            ..CompileOptions::default()
        },
    )
    .unwrap();
    assert!(devices(&p).iter().all(|d| *d == "cpu"));
}

/// Four equal matmuls in a chain.
const CHAIN: &str = r#"graph @g(%x: f32[128, 128], %w: f32[128, 128]) -> (%y) {
  %a: f32[128, 128] = matmul(%x, %w)
  %b: f32[128, 128] = matmul(%a, %w)
  %c: f32[128, 128] = matmul(%b, %w)
  %y: f32[128, 128] = matmul(%c, %w)
}"#;

#[test]
fn throughput_balances_stages_where_latency_keeps_one_device() {
    // Host and npu equally fast, a cheap zero-copy link: for one call a split only adds
    // the crossing; with calls in flight two balanced stages halve the busiest device.
    let link = Link {
        bytes_per_s: 1e9,
        latency_s: 1e-6,
        zero_copy: true,
        shared_memory: SharedMemory::Device,
    };
    let mut prof = profiles(10e9, link);
    prof.devices.get_mut("npu").unwrap().profile = profile(10e9, 10e9, 1e-6);
    let t = target(&["matmul"], cost_model(prof));
    let m = partition::model(&lowered(&parse(CHAIN)), &t);
    let (lat, lat_est) = m.search(Objective::Latency);
    assert!(lat.iter().all(|&d| d == lat[0]), "{lat:?}");
    assert_eq!(lat_est.crossings, 0);
    let (thr, thr_est) = m.search(Objective::Throughput);
    let on_npu = thr.iter().filter(|&&d| d == 1).count();
    assert_eq!(on_npu, 2, "{thr:?}");
    let busiest = |e: &partition::Estimate| e.score(Objective::Throughput);
    assert!(
        busiest(&thr_est) < 0.6 * busiest(&lat_est),
        "{thr_est:?} {lat_est:?}"
    );
}

/// Two matmuls in a chain, each by its own 4 MiB constant weight (`%w1`, `%w2`).
fn two_weighted_matmuls() -> Graph {
    let w = |n: &str| {
        format!(
            "const %{n}: f32[1024, 1024] = hex \"{}\"",
            "00".repeat(4 << 20)
        )
    };
    parse(&format!(
        "graph @g(%x: f32[1, 1024]) -> (%y) {{\n  {}\n  {}\n  %a: f32[1, 1024] = matmul(%x, %w1)\n  %y: f32[1, 1024] = matmul(%a, %w2)\n}}",
        w("w1"),
        w("w2")
    ))
}

#[test]
fn memory_limits_force_a_split_and_an_impossible_one_names_the_devices() {
    // Two 4 MiB weights; the npu holds 6 MiB: one matmul must leave it.
    let g = two_weighted_matmuls();
    let mut opts = cost_model(profiles(1e12, slow_link()));
    let t = target(&["matmul"], opts.clone());
    let m = partition::model(&lowered(&g), &t);
    assert_eq!(
        m.search(Objective::Latency).0,
        [1, 1],
        "unlimited: both on the npu"
    );
    opts.memory_limits = BTreeMap::from([("npu".to_string(), 6 << 20)]);
    let t = target(&["matmul"], opts.clone());
    let m = partition::model(&lowered(&g), &t);
    let (p, e) = m.search(Objective::Latency);
    assert_eq!(p.iter().filter(|&&d| d == 1).count(), 1, "{p:?}");
    assert_eq!(e.over_memory, 0);
    assert!(e.memory_bytes[1] <= 6 << 20, "{e:?}");
    opts.memory_limits =
        BTreeMap::from([("npu".to_string(), 1 << 20), ("cpu".to_string(), 1 << 20)]);
    let t = target(&["matmul"], opts);
    let err = rafter_opt::compile(
        &g,
        &CompileOptions {
            target: t,
            ..CompileOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no placement fits the memory limits"), "{err}");
    assert!(err.contains("(limit 1048576)"), "{err}");
}

#[test]
fn deny_fallback_names_the_kernel_and_why() {
    let g = parse(MID_GRAPH);
    let t = target(
        NPU_OPS,
        PlacementOptions {
            deny_fallback: true,
            ..PlacementOptions::default()
        },
    );
    let err = rafter_opt::compile(
        &g,
        &CompileOptions {
            target: t,
            ..CompileOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--deny-fallback: kernel `"), "{err}");
    assert!(
        err.contains("would run on the cpu (npu: no `transpose` on the simulated npu)"),
        "{err}"
    );
}

#[test]
fn placement_is_deterministic_for_a_profile_and_explained() {
    let g = parse(MID_GRAPH);
    let t = target(NPU_OPS, cost_model(profiles(1e12, slow_link())));
    let p = lowered(&g);
    let first = partition::model(&p, &t).search(Objective::Latency);
    for _ in 0..3 {
        assert_eq!(partition::model(&p, &t).search(Objective::Latency), first);
    }
    let mut placed = p.clone();
    partition::place_for_target(&mut placed, &t).unwrap();
    let why = partition::explain(&placed, &t);
    assert_eq!(why[0].device, "npu");
    assert!(
        why[0].reason.starts_with("fastest here (cpu "),
        "{}",
        why[0].reason
    );
    assert!(
        why[1].reason.contains("npu cannot: no `transpose`"),
        "{}",
        why[1].reason
    );
    assert!(
        why[2]
            .reason
            .starts_with("slower alone, but saves crossings"),
        "{}",
        why[2].reason
    );
}

/// Weights beyond a device's cache cost each kernel reading them the difference between
/// memory and cache speed at the program's weight footprint; within it, nothing.
#[test]
fn weights_beyond_the_cache_cost_their_reads_at_the_footprints_speed() {
    use rafter_opt::partition::device::{ReadPoint, WeightCache};
    // Two 4 MiB weights (8 MiB in all), each read by one matmul.
    let p = lowered(&two_weighted_matmuls());
    let mib = (1u64 << 20) as f64;
    let times = |cache: Option<WeightCache>| {
        let mut profiles = profiles(1e12, slow_link());
        let mut cpu = profiles.get("cpu");
        cpu.profile.weight_cache = cache;
        profiles.insert(cpu);
        let t = target(&["matmul"], cost_model(profiles));
        let m = partition::model(&p, &t);
        (m.times[0][0].unwrap(), m.times[1][0].unwrap())
    };
    let sweep = |points: &[(f64, f64)]| WeightCache {
        cache_bytes_per_s: 40e9,
        reads: points
            .iter()
            .map(|&(m, gbs)| ReadPoint {
                bytes: m * mib,
                bytes_per_s: gbs * 1e9,
            })
            .collect(),
    };
    let (a0, b0) = times(None);
    // The 8 MiB footprint halfway (in log size) between 4 MiB at 40 GB/s and 16 MiB at
    // 10: 25 GB/s, so each 4 MiB weight costs 4 MiB * (1/25 - 1/40) per GB more.
    let (a, b) = times(Some(sweep(&[(4.0, 40.0), (16.0, 10.0)])));
    let extra = 4.0 * mib * (1.0 / 25e9 - 1.0 / 40e9);
    assert!((a - a0 - extra).abs() < 1e-9, "{a} {a0} {extra}");
    assert!((b - b0 - extra).abs() < 1e-9, "{b} {b0} {extra}");
    // A cache that holds both weights: no extra.
    let (a, b) = times(Some(sweep(&[(16.0, 40.0), (64.0, 10.0)])));
    assert_eq!((a, b), (a0, b0));
}

/// A residual added in a contraction's epilogue is an operand its probe lacks: the model
/// charges its bytes at memory speed; a bias (a weight) and the contraction's own operands
/// are not charged so. Each kernel's output width is its result's channels.
#[test]
fn a_residual_epilogue_operand_is_charged_and_widths_are_output_channels() {
    use partition::cost::{epilogue_operand_bytes, kernel_work};
    let src = format!(
        r#"graph @g(%x: f32[1, 64, 8, 8], %r: f32[1, 32, 8, 8]) -> (%y) {{
  const %w: f32[32, 64, 1, 1] = hex "{}"
  const %b: f32[1, 32, 1, 1] = hex "{}"
  %c: f32[1, 32, 8, 8] = conv{{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w)
  %t: f32[1, 32, 8, 8] = binary{{op = add}}(%c, %b)
  %s: f32[1, 32, 8, 8] = binary{{op = add}}(%t, %r)
  %y: f32[1, 32, 8, 8] = unary{{op = relu}}(%s)
}}"#,
        "0000003f".repeat(2048),
        "cdcccc3d".repeat(32)
    );
    let p = lowered(&parse(&src));
    let values = Default::default();
    let (k, args) = p
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Dispatch { kernel, args, .. }
                if p.kernels[*kernel].kind == rafter_ir::program::KernelKind::Contraction =>
            {
                Some((*kernel, args.clone()))
            }
            _ => None,
        })
        .expect("a contraction kernel");
    let weights: Vec<bool> = args
        .iter()
        .map(|&b| matches!(p.buffers[b].storage, Storage::Weight(_)))
        .collect();
    assert!(weights.iter().any(|&w| w), "{:?}", p.kernels[k].body);
    // The residual's 32 * 8 * 8 f32s, not the convolution's input or the bias.
    assert_eq!(
        epilogue_operand_bytes(&p.kernels[k], &weights, &values),
        8192.0
    );
    assert_eq!(kernel_work(&p.kernels[k], &values).width(), 32.0);
}
