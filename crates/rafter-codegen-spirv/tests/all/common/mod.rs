//! Test helpers: spirv-val, the Vulkan device (or a skip), running a kernel.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rafter_codegen_spirv::{to_bytes, ElementwiseKernel};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions, VulkanError};
use rafter_ir::DType;
use rafter_reference::Tensor;
use rafter_vulkan_section::{dim_params, Launch, VulkanModule};

/// Checks `words` with `spirv-val --target-env vulkan1.3`. Without spirv-val (Debian:
/// `spirv-tools`) prints a note and passes, unless `RAFTER_REQUIRE_SPIRV_VAL` is set (CI).
pub fn spirv_val(words: &[u32], name: &str) {
    let dir = std::env::temp_dir().join(format!("rafter-spirv-val-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One file per call: tests run in parallel and may validate modules of one name.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{name}-{call}.spv"));
    std::fs::write(&path, to_bytes(words)).unwrap();
    // scripts/test.sh points RAFTER_SPIRV_VAL at the venv's SPIRV-Tools (Debian 12's
    // 2023.1 predates SPV_KHR_cooperative_matrix); otherwise the one on PATH.
    let program = std::env::var("RAFTER_SPIRV_VAL").unwrap_or_else(|_| "spirv-val".into());
    match Command::new(&program)
        .args(["--target-env", "vulkan1.3"])
        .arg(&path)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "spirv-val rejects {name} ({}):\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            let required =
                std::env::var("RAFTER_REQUIRE_SPIRV_VAL").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "RAFTER_REQUIRE_SPIRV_VAL is set but spirv-val cannot run: {e}"
            );
            eprintln!("note: spirv-val not found ({e}); {name} not validated (apt-get install spirv-tools)");
            return;
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// The Vulkan device, or `None` after printing why the test is skipped. With
/// `RAFTER_REQUIRE_VULKAN` set (CI, which installs lavapipe) a missing device fails instead.
pub fn device_or_skip(test: &str) -> Option<VulkanDevice> {
    device_with_or_skip(test, VulkanDeviceOptions::default())
}

pub fn device_with_or_skip(test: &str, options: VulkanDeviceOptions) -> Option<VulkanDevice> {
    match VulkanDevice::new(options) {
        Ok(device) => Some(device),
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

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Loads `kernel` on `device`.
pub fn load(
    device: &VulkanDevice,
    kernel: &ElementwiseKernel,
    name: &str,
) -> rafter_hal::Executable {
    device
        .load_executable(&ExecutableSpec {
            name: name.to_string(),
            format: FORMAT_SPIRV.to_string(),
            payload: ExecutablePayload::Bytes(Arc::from(to_bytes(&kernel.spirv))),
        })
        .unwrap()
}

/// Runs `kernel` over `count` elements with `inputs` (host-visible buffers, as the HAL's
/// zero-copy path) and returns the output buffers.
pub fn run(
    device: &VulkanDevice,
    kernel: &ElementwiseKernel,
    inputs: &[Buffer],
    count: u64,
) -> Vec<Buffer> {
    assert!(
        kernel.dims.is_empty(),
        "a kernel with dim params runs through run_shaped"
    );
    run_shaped(device, kernel, inputs, count, &[])
}

/// [`run`] for a kernel that reads sizes from its dim params: `binding_dims` are every
/// binding's dims (inputs, then outputs), as the runtime passes them.
pub fn run_shaped(
    device: &VulkanDevice,
    kernel: &ElementwiseKernel,
    inputs: &[Buffer],
    count: u64,
    binding_dims: &[&[usize]],
) -> Vec<Buffer> {
    let executable = load(device, kernel, "kernel");
    let outputs: Vec<Buffer> = (0..kernel.outputs)
        .map(|_| {
            device
                .allocate(count * 4, MemoryKind::HostVisibleShared)
                .unwrap()
        })
        .collect();
    let bindings: Vec<_> = inputs.iter().chain(&outputs).map(Buffer::whole).collect();
    let max_x = device.info().limits.max_workgroup_count[0];
    let mut builder = device.create_command_buffer().unwrap();
    let (params, grid) = match kernel.launch {
        // A workgroup per row of the first output (the runtime's rule).
        launch @ Launch::Rows { .. } => {
            let (mut params, grid) = launch
                .rows_dispatch(binding_dims[inputs.len()], max_x)
                .unwrap()
                .expect("a non-empty output");
            params.extend(rafter_vulkan_section::dim_params(&kernel.dims, binding_dims).unwrap());
            (params, grid)
        }
        _ => (
            kernel.params_for(count, binding_dims).unwrap(),
            ElementwiseKernel::workgroups(count, max_x),
        ),
    };
    builder
        .dispatch(&executable, 0, &bindings, &params, grid)
        .unwrap();
    submit_and_wait(device, builder);
    outputs
}

pub fn upload(device: &VulkanDevice, values: &[f32]) -> Buffer {
    let buffer = device
        .allocate(values.len() as u64 * 4, MemoryKind::HostVisibleShared)
        .unwrap();
    buffer.write_bytes(0, &f32_bytes(values)).unwrap();
    buffer
}

/// Whether `got` matches `want` within `atol + rtol * |want|` (NaN matches NaN, infinities
/// must match exactly).
pub fn close(got: f32, want: f32, atol: f32, rtol: f32) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}

/// One op to sweep: a label, a kernel body in the IR text format, the input domain, and the
/// tolerance `(atol, rtol)` against the reference executor.
pub struct OpCase {
    pub label: String,
    pub text: String,
    pub domain: (f32, f32),
    pub tolerance: (f32, f32),
}

fn unary_case(op: &str, domain: (f32, f32), tolerance: (f32, f32)) -> OpCase {
    OpCase {
        label: format!("unary_{op}"),
        text: format!(
            "graph @unary_{op}(%x: f32[n]) -> (%y) {{\n  %y: f32[n] = unary{{op = {op}}}(%x)\n}}"
        ),
        domain,
        tolerance,
    }
}

fn node_case(label: &str, node: &str, domain: (f32, f32), tolerance: (f32, f32)) -> OpCase {
    OpCase {
        label: label.to_string(),
        text: format!("graph @{label}(%x: f32[n]) -> (%y) {{\n  %y: f32[n] = {node}(%x)\n}}"),
        domain,
        tolerance,
    }
}

fn binary_case(op: &str, domain: (f32, f32), tolerance: (f32, f32)) -> OpCase {
    OpCase {
        label: format!("binary_{op}"),
        text: format!(
            "graph @binary_{op}(%a: f32[n], %b: f32[n]) -> (%y) {{\n  %y: f32[n] = binary{{op = {op}}}(%a, %b)\n}}"
        ),
        domain,
        tolerance,
    }
}

/// Every op the elementwise generator supports, one kernel each, plus fused and broadcast
/// bodies. Tolerances: exact-ish for arithmetic, looser for transcendental functions, whose
/// precision Vulkan leaves to the driver (a few ulp; lavapipe's LLVM approximations).
pub fn op_cases() -> Vec<OpCase> {
    let exact = (0.0, 0.0);
    let close = (1e-6, 1e-6);
    let transcendental = (2e-6, 2e-5);
    let mut cases = vec![
        unary_case("abs", (-5.0, 5.0), exact),
        unary_case("neg", (-5.0, 5.0), exact),
        unary_case("sqrt", (0.0, 100.0), close),
        unary_case("exp", (-20.0, 20.0), transcendental),
        unary_case("log", (1e-3, 100.0), transcendental),
        unary_case("reciprocal", (0.1, 10.0), close),
        unary_case("floor", (-5.0, 5.0), exact),
        unary_case("ceil", (-5.0, 5.0), exact),
        unary_case("round", (-5.0, 5.0), exact),
        unary_case("sign", (-5.0, 5.0), exact),
        unary_case("sin", (-6.0, 6.0), transcendental),
        unary_case("cos", (-6.0, 6.0), transcendental),
        unary_case("tan", (-1.4, 1.4), transcendental),
        unary_case("asin", (-1.0, 1.0), transcendental),
        unary_case("acos", (-1.0, 1.0), transcendental),
        unary_case("atan", (-10.0, 10.0), transcendental),
        unary_case("sinh", (-5.0, 5.0), transcendental),
        unary_case("cosh", (-5.0, 5.0), transcendental),
        unary_case("tanh", (-20.0, 20.0), transcendental),
        unary_case("asinh", (-10.0, 10.0), transcendental),
        unary_case("acosh", (1.0, 10.0), transcendental),
        unary_case("atanh", (-0.99, 0.99), transcendental),
        unary_case("erf", (-5.0, 5.0), transcendental),
        unary_case("sigmoid", (-30.0, 30.0), transcendental),
        unary_case("relu", (-5.0, 5.0), exact),
        unary_case("softplus", (-30.0, 30.0), transcendental),
        unary_case("softsign", (-5.0, 5.0), close),
        unary_case("mish", (-10.0, 10.0), transcendental),
        unary_case("hard_swish", (-5.0, 5.0), close),
        binary_case("add", (-5.0, 5.0), exact),
        binary_case("sub", (-5.0, 5.0), exact),
        binary_case("mul", (-5.0, 5.0), exact),
        binary_case("div", (0.5, 5.0), close),
        binary_case("pow", (0.1, 3.0), transcendental),
        binary_case("mod", (-5.0, 5.0), close),
        binary_case("fmod", (-5.0, 5.0), close),
        binary_case("max", (-5.0, 5.0), exact),
        binary_case("min", (-5.0, 5.0), exact),
        binary_case("prelu", (-5.0, 5.0), exact),
        node_case("leaky_relu", "leaky_relu{alpha = 0.1}", (-5.0, 5.0), close),
        node_case("elu", "elu{alpha = 1.5}", (-5.0, 5.0), transcendental),
        node_case(
            "selu",
            "selu{alpha = 1.67, gamma = 1.05}",
            (-5.0, 5.0),
            transcendental,
        ),
        node_case("celu", "celu{alpha = 0.7}", (-5.0, 5.0), transcendental),
        node_case(
            "hard_sigmoid",
            "hard_sigmoid{alpha = 0.2, beta = 0.5}",
            (-5.0, 5.0),
            close,
        ),
        node_case(
            "thresholded_relu",
            "thresholded_relu{alpha = 0.5}",
            (-5.0, 5.0),
            exact,
        ),
        node_case(
            "shrink",
            "shrink{bias = 0.3, lambd = 0.5}",
            (-5.0, 5.0),
            close,
        ),
        node_case(
            "gelu",
            "gelu{approximate = none}",
            (-6.0, 6.0),
            transcendental,
        ),
        node_case(
            "gelu_tanh",
            "gelu{approximate = tanh}",
            (-6.0, 6.0),
            transcendental,
        ),
    ];
    cases.push(OpCase {
        label: "clip_scalar_bounds".into(),
        text: "graph @clip(%x: f32[n], %lo: f32[]) -> (%y) {\n  const %hi: f32[] = dense [1.5]\n  %y: f32[n] = clip(%x, %lo, %hi)\n}".into(),
        domain: (-5.0, 5.0),
        tolerance: exact,
    });
    cases.push(OpCase {
        label: "fused_gelu_chain".into(),
        // What rafter-opt fuses out of BERT's erf GELU (kernel k51 of bert_tiny).
        text: "graph @gelu_chain(%x: f32[b, s, 128]) -> (%y) {\n  const %sqrt2: f32[] = dense [1.4142135]\n  const %one: f32[] = dense [1.0]\n  const %half: f32[] = dense [0.5]\n  %t0: f32[b, s, 128] = binary{op = div}(%x, %sqrt2)\n  %t1: f32[b, s, 128] = unary{op = erf}(%t0)\n  %t2: f32[b, s, 128] = binary{op = add}(%t1, %one)\n  %t3: f32[b, s, 128] = binary{op = mul}(%x, %t2)\n  %y: f32[b, s, 128] = binary{op = mul}(%t3, %half)\n}".into(),
        domain: (-6.0, 6.0),
        tolerance: transcendental,
    });
    cases.push(OpCase {
        label: "two_outputs_scalar_input".into(),
        text: "graph @two(%x: f32[n], %s: f32[1]) -> (%y, %z) {\n  %y: f32[n] = binary{op = mul}(%x, %s)\n  %z: f32[n] = unary{op = exp}(%y)\n}".into(),
        domain: (-2.0, 2.0),
        tolerance: transcendental,
    });
    cases
}

/// Deterministic inputs in `domain`, with the domain's ends and zero among them.
pub fn inputs_in(domain: (f32, f32), count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let (lo, hi) = domain;
    (0..count)
        .map(|i| match i {
            0 => lo,
            1 => hi,
            2 if lo <= 0.0 && hi >= 0.0 => 0.0,
            _ => {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                lo + (hi - lo) * unit
            }
        })
        .collect()
}

/// Runs `module` on `inputs` and returns its first output, of `out_dtype` and `out_dims`.
pub fn run_module(
    device: &VulkanDevice,
    module: &VulkanModule,
    inputs: &[Tensor],
    (out_dtype, out_dims): (DType, &[usize]),
) -> Tensor {
    run_outputs(device, module, inputs, out_dtype, &[out_dims.to_vec()]).remove(0)
}

/// Runs `module` on `inputs` and returns its outputs, all of `out_dtype`, of `out_dims`.
pub fn run_outputs(
    device: &VulkanDevice,
    module: &VulkanModule,
    inputs: &[Tensor],
    out_dtype: DType,
    out_dims: &[Vec<usize>],
) -> Vec<Tensor> {
    let dtypes = vec![out_dtype; out_dims.len()];
    run_typed_outputs(device, module, inputs, &dtypes, out_dims)
}

/// [`run_outputs`] with each output of its own element type (`dtypes[i]` for output `i`).
pub fn run_typed_outputs(
    device: &VulkanDevice,
    module: &VulkanModule,
    inputs: &[Tensor],
    dtypes: &[DType],
    out_dims: &[Vec<usize>],
) -> Vec<Tensor> {
    let mut buffers: Vec<Buffer> = inputs
        .iter()
        .map(|t| {
            let bytes = t.to_le_bytes();
            let b = device
                .allocate(bytes.len().max(4) as u64, MemoryKind::HostVisibleShared)
                .unwrap();
            b.write_bytes(0, &bytes).unwrap();
            b
        })
        .collect();
    let sizes: Vec<usize> = out_dims
        .iter()
        .zip(dtypes)
        .map(|(d, t)| d.iter().product::<usize>() * t.size_of())
        .collect();
    let outs: Vec<Buffer> = sizes
        .iter()
        .map(|&n| {
            let y = device
                .allocate(n.max(4) as u64, MemoryKind::HostVisibleShared)
                .unwrap();
            // NaN everywhere (0xFF bytes), so an element the kernel never writes fails.
            y.write_bytes(0, &vec![0xFF; n]).unwrap();
            y
        })
        .collect();
    buffers.extend(outs.iter().cloned());
    let exe = device
        .load_executable(&ExecutableSpec {
            name: "f16".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(Arc::from(&module.spirv[..])),
        })
        .unwrap();
    let max = device.info().limits.max_workgroup_count;
    let input_dims: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let (mut params, grid) = module
        .launch
        .dispatch(&input_dims, &out_dims[0], module.workgroup_size, max)
        .unwrap()
        .expect("a non-empty output");
    let mut binding_dims = input_dims.clone();
    binding_dims.extend(out_dims.iter().map(|d| d.as_slice()));
    params.extend(dim_params(&module.dims, &binding_dims).unwrap());
    let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
    let mut builder = device.create_command_buffer().unwrap();
    builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
    submit_and_wait(device, builder);
    outs.iter()
        .zip(sizes.iter().zip(out_dims.iter().zip(dtypes)))
        .map(|(y, (&n, (d, &out_dtype)))| {
            let bytes = if n == 0 {
                Vec::new()
            } else {
                y.read_bytes(0, n as u64).unwrap()
            };
            Tensor::from_le_bytes(out_dtype, d, &bytes).unwrap()
        })
        .collect()
}

/// Submits `builder`'s commands to queue 0 and waits for them (five minutes at most:
/// lavapipe runs the big cases on the CPU).
pub fn submit_and_wait(device: &VulkanDevice, builder: rafter_hal::CommandBufferBuilder) {
    let done = device.create_semaphore(0).unwrap();
    device
        .queue(0)
        .unwrap()
        .submit(&builder.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    done.wait(1, Duration::from_secs(300)).unwrap();
}

/// `body` with its input `input` replaced by a constant holding `value` (as the compiler
/// folds a small initializer into a kernel body); later inputs move down by one.
pub fn fold_input(body: &rafter_ir::Graph, input: usize, value: &Tensor) -> rafter_ir::Graph {
    let mut g = body.clone();
    let v = g.inputs.remove(input);
    let bytes = bytes::Bytes::from(value.to_le_bytes());
    let data = rafter_ir::ConstData::new(value.dtype(), value.shape().to_vec(), bytes).unwrap();
    g.constants.push(data);
    let cid = rafter_ir::ConstId(g.constants.len() as u32 - 1);
    g.values[v.0 as usize].def = rafter_ir::ValueDef::Const(cid);
    for &later in &g.inputs[input..] {
        if let rafter_ir::ValueDef::Input(i) = &mut g.values[later.0 as usize].def {
            *i -= 1;
        }
    }
    g
}

/// `dims` as the IR text writes a shape's dims: `2, 3, 4`.
pub fn dims_text(dims: &[usize]) -> String {
    dims.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `values` as a tensor of `dims` and `dtype`: f16 (rounded), bool (nonzero is true), else
/// f32.
pub fn floats(dtype: DType, dims: &[usize], values: &[f32]) -> Tensor {
    let bytes: Vec<u8> = match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::Bool => values.iter().map(|&v| u8::from(v > 0.0)).collect(),
        _ => return Tensor::f32s(dims, values.to_vec()),
    };
    Tensor::from_le_bytes(dtype, dims, &bytes).unwrap()
}
