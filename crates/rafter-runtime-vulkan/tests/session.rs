//! Programs compiled for `--target vulkan` on a real Vulkan device (lavapipe in CI): GPU
//! kernels from the artifact's SPIR-V, CPU fallback kernels, copies between the two, and a
//! submit that returns before the GPU work has run.
//!
//! Without a Vulkan device each test prints why and passes, unless `RAFTER_REQUIRE_VULKAN`
//! is set (CI installs lavapipe and sets it).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rafter_artifact::Artifact;
use rafter_compiler::CompileOptions;
use rafter_hal::{Device, Semaphore};
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions, VulkanError};
use rafter_ir::program::{Program, Step};
use rafter_ir::text::parse_graph;
use rafter_ir::Graph;
use rafter_runtime::{DeviceSet, RuntimeError, Session, SessionOptions, Tensor};
use rafter_runtime_cpu::{from_reference, to_reference};

const WAIT: Duration = Duration::from_secs(120);

/// Max |a - b| over two tensors of one shape.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The reference executor's outputs of `g` on `inputs` (the oracle).
fn reference_run(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let inputs = inputs.iter().map(|t| to_reference(t).unwrap()).collect();
    rafter_reference::run(g, inputs)
        .unwrap()
        .iter()
        .map(|t| from_reference(t).unwrap())
        .collect()
}

fn read_npy(path: &Path) -> Tensor {
    from_reference(&rafter_reference::npy::read_npy(path).unwrap()).unwrap()
}

/// The CPU device with its loader, and `vulkan` with the SPIR-V loader.
fn with_vulkan(device: Arc<VulkanDevice>) -> DeviceSet {
    rafter_runtime_cpu::devices()
        .unwrap()
        .with("vulkan", device as Arc<dyn Device>)
        .with_loader(rafter_runtime_vulkan::loader())
}

/// `cpu` and `vulkan`, or `None` after printing why the test is skipped.
fn devices_or_skip(test: &str) -> Option<(DeviceSet, Arc<VulkanDevice>)> {
    match VulkanDevice::new(VulkanDeviceOptions::default()) {
        Ok(device) => {
            let device = Arc::new(device);
            Some((with_vulkan(device.clone()), device))
        }
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

/// Compiles `g` for Vulkan and round-trips it through artifact bytes with its SPIR-V.
fn compile(g: &Graph) -> Artifact {
    let opts = CompileOptions {
        target: rafter_compiler::target("vulkan").unwrap(),
        ..CompileOptions::default()
    };
    rafter_compiler::compile(g, &opts)
        .unwrap()
        .to_artifact()
        .unwrap()
}

fn devices_of(p: &Program) -> Vec<&str> {
    p.kernels.iter().map(|k| k.device.as_str()).collect()
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

/// GPU (relu, relu·w) → CPU (log-sum-exp over an axis) → GPU (sigmoid): input, weight and both
/// ends on the GPU, a copy each way, the input also an output.
fn mixed_graph() -> Graph {
    let w: Vec<String> = (0..32)
        .map(|i| format!("{:?}", i as f32 * 0.25 - 4.0))
        .collect();
    parse_graph(&format!(
        r#"graph @mixed(%x: f32[4, 8]) -> (%y, %b, %x) {{
  const %w: f32[4, 8] = dense [{}]
  %a: f32[4, 8] = unary{{op = relu}}(%x)
  %b: f32[4, 8] = binary{{op = mul}}(%a, %w)
  %s: f32[4] = reduce{{kind = log_sum_exp, axes = [1], keep_dims = false, noop_with_empty_axes = false}}(%a)
  %y: f32[4] = unary{{op = sigmoid}}(%s)
}}"#,
        w.join(", ")
    ))
    .unwrap()
}

#[test]
fn a_mixed_gpu_cpu_program_matches_the_reference() {
    let Some((devices, _)) = devices_or_skip("a_mixed_gpu_cpu_program_matches_the_reference")
    else {
        return;
    };
    let g = mixed_graph();
    let artifact = compile(&g);
    assert_eq!(devices_of(artifact.program()), ["vulkan", "cpu", "vulkan"]);
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    // The later seeds run on the first call's recording (its GPU and CPU command buffers
    // submitted again, its buffers rewritten): the results must follow the new inputs.
    for seed in [1, 2, 3] {
        let x = rand(&[4, 8], seed);
        let want = reference_run(&g, std::slice::from_ref(&x));
        let got = session.run(vec![x], WAIT).unwrap();
        assert_eq!(got.len(), 3);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let d = max_abs_diff(a, b);
            assert!(d <= 1e-6, "seed {seed}, output {i}: max abs diff {d}");
        }
        let start = std::time::Instant::now();
        while session.idle_recordings() != 1 && start.elapsed() < WAIT {
            std::thread::yield_now();
        }
        assert_eq!(
            session.idle_recordings(),
            1,
            "seed {seed}: one recording, reused"
        );
    }
}

#[test]
fn a_program_without_its_vulkan_section_is_a_clear_error() {
    let Some((devices, _)) = devices_or_skip("a_program_without_its_vulkan_section") else {
        return;
    };
    let program = compile(&mixed_graph()).into_program();
    let err = Session::new(program, &devices).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("--target vulkan"), "{err}");
    // And a program needing `vulkan` on a set without it names the device.
    let program = compile(&mixed_graph()).into_program();
    let err = Session::new(program, &rafter_runtime_cpu::devices().unwrap()).unwrap_err();
    assert!(err.to_string().contains("vulkan"), "{err}");
}

/// The host returns from `submit_after` while the GPU work cannot have started: its first
/// submission waits on a gate the host signals only afterwards. Asserted through semaphore
/// values, not timing: right after submit every call semaphore is below its target; after
/// the gate opens they all reach it and the outputs are right.
#[test]
fn submit_returns_before_the_gpu_work_runs() {
    let Some((devices, vk)) = devices_or_skip("submit_returns_before_the_gpu_work_runs") else {
        return;
    };
    let g = parse_graph(
        r#"graph @gpu(%x: f32[1024], %z: f32[1024]) -> (%y) {
  %a: f32[1024] = binary{op = mul}(%x, %z)
  %y: f32[1024] = unary{op = tanh}(%a)
}"#,
    )
    .unwrap();
    let artifact = compile(&g);
    let program = artifact.program();
    assert_eq!(devices_of(program), ["vulkan"]);
    // First and last kernel on the GPU: inputs are written into, and the output read from,
    // GPU (host-visible) memory; no copy steps.
    assert!(!program.steps.iter().any(|s| matches!(s, Step::Copy { .. })));
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    let gate = vk.create_semaphore(0).unwrap();
    let (x, z) = (rand(&[1024], 5), rand(&[1024], 6));
    let handle = session
        .submit_after(vec![x.clone(), z.clone()], &[(gate.clone(), 1)])
        .unwrap();
    // Back from submit: the GPU work is still waiting for the gate.
    let targets: Vec<(Semaphore, u64)> = handle.semaphores().to_vec();
    assert!(!targets.is_empty());
    for (s, v) in &targets {
        assert!(
            s.value() < *v,
            "a call semaphore reached {v} before the gate opened"
        );
    }
    assert!(!handle.is_done());
    assert_eq!(gate.value(), 0);
    gate.signal(1).unwrap();
    handle.wait_done(WAIT).unwrap();
    for (s, v) in &targets {
        assert!(s.value() >= *v);
    }
    let got = handle.wait(WAIT).unwrap();
    let want = reference_run(&g, &[x, z]);
    let d = max_abs_diff(&got[0], &want[0]);
    assert!(d <= 1e-6, "max abs diff {d}");
}

/// A failed gate fails the call with its reason instead of running it.
#[test]
fn a_failed_gate_fails_the_call() {
    let Some((devices, vk)) = devices_or_skip("a_failed_gate_fails_the_call") else {
        return;
    };
    let g =
        parse_graph("graph @neg(%x: f32[16]) -> (%y) {\n  %y: f32[16] = unary{op = neg}(%x)\n}")
            .unwrap();
    let session = Session::from_artifact(compile(&g), &devices, SessionOptions::new()).unwrap();
    let gate = vk.create_semaphore(0).unwrap();
    let handle = session
        .submit_after(vec![rand(&[16], 1)], &[(gate.clone(), 1)])
        .unwrap();
    gate.fail("upstream call failed");
    let err = handle.wait(WAIT).unwrap_err();
    assert!(err.to_string().contains("upstream call failed"), "{err}");
}

/// The committed bert_tiny (PyTorch export, symbolic `batch` and `seq`) compiled for
/// Vulkan: its supported kernels on the GPU, the rest on the CPU, with copies between;
/// two calls in flight at once, each matching ONNX Runtime's outputs.
#[test]
fn bert_tiny_on_vulkan_matches_onnx_runtime() {
    let Some((devices, _)) = devices_or_skip("bert_tiny_on_vulkan_matches_onnx_runtime") else {
        return;
    };
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny");
    let g = rafter_import::import_onnx_file(&dir.join("model.onnx"))
        .unwrap()
        .graph;
    let artifact = compile(&g);
    let program = artifact.program();
    let on_gpu = devices_of(program)
        .iter()
        .filter(|d| **d == "vulkan")
        .count();
    assert!(
        on_gpu > 0 && on_gpu < program.kernels.len(),
        "{on_gpu} on the GPU"
    );
    // Only the embedding prologue (i64 index math, gathers, the embeddings' sum and its
    // layer norm) stays on the CPU: every encoder layer's products, head transposes,
    // softmax and layer norms run on the GPU over the symbolic `batch` and `seq`.
    let on_cpu: Vec<Vec<&str>> = program
        .kernels
        .iter()
        .filter(|k| k.device == "cpu")
        .map(|k| k.body.nodes.iter().map(|n| n.op.name()).collect())
        .collect();
    let count = |op: &str| on_cpu.iter().filter(|ops| ops.contains(&op)).count();
    for op in ["matmul", "softmax", "transpose"] {
        assert_eq!(count(op), 0, "a {op} kernel stays on the CPU: {on_cpu:?}");
    }
    assert!(count("layer_norm") <= 1, "{on_cpu:?}");
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    let calls: Vec<_> = ["seq7", "seq13"]
        .iter()
        .map(|case| {
            let read = |name: &str| read_npy(&dir.join(case).join(name));
            let inputs = vec![read("input_ids.npy"), read("attention_mask.npy")];
            (
                case,
                session.submit(inputs).unwrap(),
                read("last_hidden_state.npy"),
            )
        })
        .collect();
    for (case, handle, want) in calls {
        let out = handle.wait(WAIT).unwrap_or_else(|e| panic!("{case}: {e}"));
        let diff = max_abs_diff(&out[0], &want);
        assert!(diff <= 1e-4, "{case}: max |vulkan - ORT| = {diff}");
    }
}

/// A program wholly on the GPU (input written into GPU memory, output read from it, no
/// copies) needs no CPU device at all.
#[test]
fn a_program_wholly_on_the_gpu_runs_without_a_cpu_device() {
    let Some((_, vk)) = devices_or_skip("a_program_wholly_on_the_gpu") else {
        return;
    };
    let g = parse_graph(
        "graph @gelu(%x: f32[300]) -> (%y) {\n  %y: f32[300] = gelu{approximate = none}(%x)\n}",
    )
    .unwrap();
    let only_gpu = DeviceSet::new()
        .with("vulkan", vk as Arc<dyn Device>)
        .with_loader(rafter_runtime_vulkan::loader());
    let session = Session::from_artifact(compile(&g), &only_gpu, SessionOptions::new()).unwrap();
    assert_eq!(session.device_names(), ["vulkan"]);
    let x = rand(&[300], 9);
    let got = session.run(vec![x.clone()], WAIT).unwrap();
    let want = reference_run(&g, &[x]);
    let d = max_abs_diff(&got[0], &want[0]);
    assert!(d <= 1e-6, "max abs diff {d}");
}

/// `n` values in [-1, 1] that f16 represents exactly (multiples of 1/512), as IR text.
fn f16_dense(n: usize, seed: usize) -> String {
    (0..n)
        .map(|i| {
            let k = (i * 2_654_435_761 + seed * 40_503) % 1025;
            format!("{:?}", (k as f32 - 512.0) / 512.0)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `t` rounded to f16.
fn to_f16(t: &Tensor) -> Tensor {
    let bytes: Vec<u8> = t
        .to_f64_vec()
        .iter()
        .flat_map(|&v| half::f16::from_f64(v).to_le_bytes())
        .collect();
    Tensor::from_le_bytes(rafter_ir::DType::F16, t.shape(), &bytes).unwrap()
}

/// Compiles `g` (an f16 model) for Vulkan, checks every kernel was placed on the GPU and
/// its ops include `ops`, runs it through a session on two inputs, and compares with the
/// reference executor's f16 results. Tolerance: 4 f16 ulps at each expected element. The
/// kernels round every f16 value at op boundaries as the reference does, so they differ
/// only where an f32 sum in another order crosses a rounding boundary (1 ulp) or in a
/// softmax, which the reference rounds step by step as ONNX's does (up to 4 ulps; the
/// codegen crate's tests/f16.rs measures each kind).
fn f16_model_matches_the_reference(g: &Graph, x_dims: &[usize], ops: &[&str]) {
    let Some((devices, _)) = devices_or_skip(&g.name) else {
        return;
    };
    let artifact = compile(g);
    let program = artifact.program();
    assert!(
        devices_of(program).iter().all(|d| *d == "vulkan"),
        "{}: {:?}",
        g.name,
        program
            .kernels
            .iter()
            .filter(|k| k.device != "vulkan")
            .map(|k| (&k.name, rafter_codegen_spirv::supports(&k.body)))
            .collect::<Vec<_>>()
    );
    let placed: Vec<&str> = program
        .kernels
        .iter()
        .flat_map(|k| k.body.nodes.iter().map(|n| n.op.name()))
        .collect();
    for op in ops {
        assert!(
            placed.contains(op),
            "{}: no {op} kernel in {placed:?}",
            g.name
        );
    }
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    for seed in [3, 4] {
        let x = to_f16(&rand(x_dims, seed));
        let want = reference_run(g, std::slice::from_ref(&x));
        let got = session.run(vec![x], WAIT).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.dtype(), b.dtype(), "output {i}");
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            // One f16 ulp at x (the f16 subnormal spacing below the smallest normal).
            let ulp = |x: f64| 2f64.powi((x.abs().log2().floor() as i32).max(-14) - 10);
            let bad = (0..b.len())
                .filter(|&j| {
                    let ok = (a[j] - b[j]).abs() <= 4.0 * ulp(b[j]);
                    !ok
                })
                .map(|j| format!("[{j}] got {} want {}", a[j], b[j]))
                .take(3)
                .collect::<Vec<_>>();
            assert!(bad.is_empty(), "{} output {i}: {bad:?}", g.name);
        }
    }
}

/// A transformer block's core in f16: projection with bias and residual, layer norm,
/// attention scores scaled by 1/8 (as attention's 1/sqrt(d) keeps softmax's logits small:
/// unscaled, the f16 rounding of logits near 30 alone moves the softmax by percents),
/// softmax, and an f32 output through a cast; wholly on the GPU. (Hidden size 48: its bias
/// and norm weights are weight buffers; bert_tiny's, of 32 f16s, are folded into bodies.)
#[test]
fn an_f16_transformer_block_on_vulkan_matches_the_reference() {
    let g = parse_graph(&format!(
        r#"graph @f16_block(%x: f16[2, 8, 48]) -> (%y, %p) {{
  const %w: f16[48, 48] = dense [{}]
  const %b: f16[48] = dense [{}]
  const %g: f16[48] = dense [{}]
  const %beta: f16[48] = dense [{}]
  const %k: f16[] = dense [0.125]
  %m: f16[2, 8, 48] = matmul(%x, %w)
  %mb: f16[2, 8, 48] = binary{{op = add}}(%m, %b)
  %r: f16[2, 8, 48] = binary{{op = add}}(%mb, %x)
  %n: f16[2, 8, 48] = layer_norm{{axis = -1, epsilon = 1e-5}}(%r, %g, %beta)
  %t: f16[2, 48, 8] = transpose{{perm = [0, 2, 1]}}(%n)
  %s: f16[2, 8, 8] = matmul(%n, %t)
  %sc: f16[2, 8, 8] = binary{{op = mul}}(%s, %k)
  %y: f16[2, 8, 8] = softmax{{kind = softmax, axis = -1}}(%sc)
  %p: f32[2, 8, 8] = cast{{to = f32}}(%y)
}}"#,
        f16_dense(48 * 48, 1),
        f16_dense(48, 2),
        f16_dense(48, 3),
        f16_dense(48, 4)
    ))
    .unwrap();
    f16_model_matches_the_reference(&g, &[2, 8, 48], &["matmul", "layer_norm", "softmax"]);
}

/// A MobileNet-like f16 conv net: strided conv + bias + ReLU6, depthwise, pointwise conv
/// with a residual, max and global pooling, a classifier gemm (transB), wholly on the GPU.
#[test]
fn an_f16_conv_net_on_vulkan_matches_the_reference() {
    let conv = |k: usize, s: usize, p: usize, group: usize| {
        format!(
            "conv{{kernel_shape = [{k}, {k}], strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], \
             dilations = [1, 1], group = {group}, auto_pad = explicit}}"
        )
    };
    let g = parse_graph(&format!(
        r#"graph @f16_convnet(%x: f16[2, 3, 16, 16]) -> (%y) {{
  const %w1: f16[8, 3, 3, 3] = dense [{}]
  const %b1: f16[8] = dense [{}]
  const %wd: f16[8, 1, 3, 3] = dense [{}]
  const %w2: f16[8, 8, 1, 1] = dense [{}]
  const %lo: f16[] = dense [0.0]
  const %hi: f16[] = dense [6.0]
  const %wc: f16[40, 8] = dense [{}]
  const %bc: f16[40] = dense [{}]
  %c1: f16[2, 8, 8, 8] = {}(%x, %w1, %b1)
  %a1: f16[2, 8, 8, 8] = clip(%c1, %lo, %hi)
  %d: f16[2, 8, 8, 8] = {}(%a1, %wd, _)
  %a2: f16[2, 8, 8, 8] = unary{{op = relu}}(%d)
  %c2: f16[2, 8, 8, 8] = {}(%a2, %w2, _)
  %r: f16[2, 8, 8, 8] = binary{{op = add}}(%c2, %a1)
  %mp: f16[2, 8, 4, 4] = pool{{kind = max, kernel_shape = [2, 2], strides = [2, 2], pads = [0, 0, 0, 0], dilations = [1, 1], auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, storage_order = 0}}(%r)
  %gp: f16[2, 8, 1, 1] = global_pool{{kind = average, p = 2}}(%mp)
  %f: f16[2, 8] = flatten{{axis = 1}}(%gp)
  %y: f16[2, 40] = gemm{{alpha = 1.0, beta = 1.0, trans_a = false, trans_b = true}}(%f, %wc, %bc)
}}"#,
        f16_dense(8 * 27, 5),
        f16_dense(8, 6),
        f16_dense(72, 7),
        f16_dense(64, 8),
        f16_dense(320, 9),
        f16_dense(40, 10),
        conv(3, 2, 1, 1),
        conv(3, 1, 1, 8),
        conv(1, 1, 0, 1),
    ))
    .unwrap();
    f16_model_matches_the_reference(
        &g,
        &[2, 3, 16, 16],
        &["conv", "pool", "global_pool", "gemm"],
    );
}

/// `g` as `model.half()` exports it: every f32 value, constant and cast target f16, the
/// constants saturated to f16's range (PyTorch builds an f16 model's mask constant from
/// f16's minimum, not f32's, which would round to -inf).
fn to_half_model(mut g: Graph) -> Graph {
    use rafter_ir::{ConstData, DType, Op};
    for v in &mut g.values {
        if v.ty.dtype == DType::F32 {
            v.ty.dtype = DType::F16;
        }
    }
    for c in &mut g.constants {
        if c.dtype == DType::F32 {
            let bytes: Vec<u8> = c
                .to_f64s()
                .iter()
                .flat_map(|&x| half::f16::from_f64(x.clamp(-65504.0, 65504.0)).to_le_bytes())
                .collect();
            *c = ConstData::new(DType::F16, c.dims.clone(), bytes.into()).unwrap();
        }
    }
    for n in &mut g.nodes {
        if let Op::Cast { to } = &mut n.op {
            if *to == DType::F32 {
                *to = DType::F16;
            }
        }
    }
    g
}

/// bert_tiny converted to f16 (see [`to_half_model`]) and compiled for Vulkan: the same
/// kernels as in f32 run on the GPU (every encoder kernel), and the output matches the
/// reference executor's f16 run, and ONNX Runtime's f32 one at f16's precision.
#[test]
fn bert_tiny_in_f16_on_vulkan_matches_the_reference() {
    let Some((devices, _)) = devices_or_skip("bert_tiny_in_f16_on_vulkan") else {
        return;
    };
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny");
    let g = rafter_import::import_onnx_file(&dir.join("model.onnx"))
        .unwrap()
        .graph;
    let f32_gpu = devices_of(compile(&g).program())
        .iter()
        .filter(|d| **d == "vulkan")
        .count();
    let g = to_half_model(g);
    let artifact = compile(&g);
    let program = artifact.program();
    let on_cpu: Vec<(String, String)> = program
        .kernels
        .iter()
        .filter(|k| k.device == "cpu")
        .map(|k| {
            let why = rafter_codegen_spirv::supports(&k.body)
                .err()
                .unwrap_or_default();
            (k.name.clone(), why)
        })
        .collect();
    let on_gpu = program.kernels.len() - on_cpu.len();
    assert_eq!(on_gpu, f32_gpu, "f16 leaves more on the CPU: {on_cpu:?}");
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    for case in ["seq7", "seq13"] {
        let read = |name: &str| read_npy(&dir.join(case).join(name));
        let inputs = vec![read("input_ids.npy"), read("attention_mask.npy")];
        let got = session.run(inputs.clone(), WAIT).unwrap().remove(0);
        let want = reference_run(&g, &inputs).remove(0);
        let ort = read("last_hidden_state.npy");
        // Four f16 ulps at the output's largest magnitude (layer-normed, a few units): the
        // kernels' softmaxes differ from the reference's by up to 4 ulps (it rounds each
        // step, as ONNX's does) and two layers carry that on; ORT's f32 output differs
        // from any f16 run by the rounding of the weights and of every op's result.
        let top = ort.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let tol = 4.0 * 2f64.powi(top.log2().floor() as i32 - 10);
        for (what, other) in [("the reference's f16 run", &want), ("ORT's f32 run", &ort)] {
            let d = max_abs_diff(&got, other);
            assert!(d <= tol, "{case}: max |vulkan f16 - {what}| = {d} > {tol}");
        }
    }
}

/// On a device without `storageBuffer16BitAccess` (lavapipe with it switched off), a
/// program with f16 GPU kernels is refused when the session loads them, naming the first
/// such kernel and the feature; the driver never sees the module.
#[test]
fn f16_kernels_on_a_device_without_16_bit_storage_are_refused_by_name() {
    let test = "f16_kernels_on_a_device_without_16_bit_storage";
    let Some((_, _)) = devices_or_skip(test) else {
        return;
    };
    let options = VulkanDeviceOptions {
        disable_16bit_storage: true,
        ..VulkanDeviceOptions::default()
    };
    let device = Arc::new(VulkanDevice::new(options).unwrap());
    assert!(!device.capabilities().storage_buffer_16bit);
    let devices = with_vulkan(device);
    let g = parse_graph("graph @h(%x: f16[64]) -> (%y) {\n  %y: f16[64] = unary{op = relu}(%x)\n}")
        .unwrap();
    let artifact = compile(&g);
    let kernel = artifact.program().kernels[0].name.clone();
    let Err(err) = Session::from_artifact(artifact, &devices, SessionOptions::new()) else {
        panic!("an f16 kernel must be refused");
    };
    let message = err.to_string();
    assert!(message.contains(&kernel), "{message}");
    assert!(message.contains("storageBuffer16BitAccess"), "{message}");
    // The same program on f32 loads and runs there.
    let g = parse_graph("graph @h(%x: f32[64]) -> (%y) {\n  %y: f32[64] = unary{op = relu}(%x)\n}")
        .unwrap();
    let session = Session::from_artifact(compile(&g), &devices, SessionOptions::new()).unwrap();
    let x = rand(&[64], 5);
    let got = session.run(vec![x.clone()], WAIT).unwrap();
    assert_eq!(got, reference_run(&g, &[x]));
}

/// `x [4]` copied into `a` (on `first`'s arena), then into `b` (on the other device's
/// arena) of `b_len` floats, then into the output: copies only, no kernels.
fn relay_program(first: &str, b_len: i64) -> Program {
    use rafter_ir::program::{Arena, BufferDecl, Port, Storage};
    use rafter_ir::{DType, TensorType};
    let ty = |n: i64| TensorType::known(DType::F32, &[n]);
    let arena = |device: &str| Arena {
        device: device.into(),
        memory: "host_visible_shared".into(),
        size: None,
        lower_bound: None,
    };
    let buffer = |name: &str, n: i64, storage: Storage| BufferDecl {
        name: name.into(),
        ty: ty(n),
        storage,
    };
    let in_arena = |arena: usize| Storage::Arena {
        arena,
        offset: None,
    };
    let second = if first == "cpu" { "vulkan" } else { "cpu" };
    Program {
        name: "relay".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: ty(4),
        }],
        outputs: vec![Port {
            name: "y".into(),
            ty: ty(b_len),
        }],
        buffers: vec![
            buffer("x", 4, Storage::Input(0)),
            buffer("a", 4, in_arena(0)),
            buffer("b", b_len, in_arena(1)),
            buffer("y", b_len, Storage::Output(0)),
        ],
        arenas: vec![arena(first), arena(second)],
        steps: vec![
            Step::Copy { src: 0, dst: 1 },
            Step::Copy { src: 1, dst: 2 },
            Step::Copy { src: 2, dst: 3 },
        ],
        ..Program::default()
    }
}

/// A copy between the CPU and the GPU whose sides disagree in size fails the call with an
/// error naming the buffer and both sizes, in both directions: the CPU's copy entry maps
/// the GPU side and checks the lengths (`rafter_runtime_cpu`'s `copy_bytes`). Only a
/// malformed program has one (`Program::verify` compares a copy's dtype and rank, not its
/// dims), but a program can come from any artifact file. The same relay with matching
/// sizes runs, so the error is the mismatch's.
#[test]
fn a_cross_device_copy_of_mismatched_sizes_fails_the_call_by_name() {
    let Some((devices, _)) = devices_or_skip("a_cross_device_copy_of_mismatched_sizes") else {
        return;
    };
    let x = Tensor::f32s(&[4], vec![1.0, 2.0, 3.0, 4.0]);
    for first in ["cpu", "vulkan"] {
        let session = Session::new(relay_program(first, 4), &devices).unwrap();
        assert_eq!(session.run(vec![x.clone()], WAIT).unwrap(), vec![x.clone()]);
        let session = Session::new(relay_program(first, 3), &devices).unwrap();
        let e = session.run(vec![x.clone()], WAIT).unwrap_err().to_string();
        let (here, there) = if first == "cpu" { (16, 12) } else { (12, 16) };
        let want = format!(
            "copy of `a` across devices: {there} bytes on the other device, {here} bytes here"
        );
        assert!(e.contains(&want), "{first} first: want `{want}` in: {e}");
    }
}
