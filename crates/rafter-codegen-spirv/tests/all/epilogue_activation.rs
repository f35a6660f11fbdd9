//! A generated matmul with a bias and a transcendental activation in its store path
//! (sigmoid, tanh, GELU in erf and tanh form: BERT's `MatMul, Add, Gelu`, a pooler's
//! `Gemm, Tanh`) matches the reference executor on the Vulkan device (lavapipe in CI),
//! over inputs that reach both tails of each activation.

use crate::common;

use std::sync::Arc;

use rafter_codegen_spirv::{matmul, to_bytes, MatmulKernel};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::VulkanDevice;
use rafter_ir::text::parse_graph;
use rafter_reference::{Bindings, Tensor};

/// `act(A·W + bias)` with `act` one node taking `%q`.
fn body(act: &str) -> rafter_ir::Graph {
    parse_graph(&format!(
        "graph @mm(%a: f32[b, m, 40], %w: f32[40, 24], %bias: f32[24]) -> (%y) {{
  %p: f32[b, m, 24] = matmul(%a, %w)
  %q: f32[b, m, 24] = binary{{op = add}}(%p, %bias)
  %y: f32[b, m, 24] = {act}(%q)
}}"
    ))
    .unwrap()
}

const ACTIVATIONS: [&str; 4] = [
    "unary{op = sigmoid}",
    "unary{op = tanh}",
    "gelu{approximate = none}",
    "gelu{approximate = tanh}",
];

/// Runs `kernel` on `inputs` (a, w, bias) and returns C's `c_len` elements.
fn run(
    device: &VulkanDevice,
    kernel: &MatmulKernel,
    inputs: &[&[f32]],
    dims: (&[usize], &[usize]),
    c_len: usize,
) -> Vec<f32> {
    let max = device.info().limits.max_workgroup_count;
    let launch = kernel.launch().unwrap();
    let (params, grid) = launch
        .matmul_dispatch(dims.0, dims.1, max)
        .unwrap()
        .expect("C is not empty");
    let mut buffers: Vec<Buffer> = inputs.iter().map(|v| common::upload(device, v)).collect();
    let bytes = c_len as u64 * 4;
    let cb = device
        .allocate(bytes, MemoryKind::HostVisibleShared)
        .unwrap();
    cb.write_bytes(0, &vec![0xFF; bytes as usize]).unwrap();
    buffers.push(cb.clone());
    let exe = device
        .load_executable(&ExecutableSpec {
            name: "matmul_activation".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(Arc::from(to_bytes(&kernel.spirv))),
        })
        .unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
    builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
    common::submit_and_wait(device, builder);
    common::f32s(&cb.read_bytes(0, bytes).unwrap())
}

#[test]
fn activation_epilogues_pass_spirv_val() {
    for act in ACTIVATIONS {
        let kernel = matmul(&body(act)).unwrap_or_else(|e| panic!("{act}: {e}"));
        assert_eq!((kernel.a_input, kernel.b_input, kernel.bindings), (0, 1, 4));
        common::spirv_val(&kernel.spirv, "matmul_activation");
    }
}

#[test]
fn activation_epilogues_match_the_reference() {
    let Some(device) = common::device_or_skip("matmul activation epilogues") else {
        return;
    };
    let (batch, m, k, n) = (2, 37, 40, 24);
    // Products up to ~±40 reach sigmoid's and tanh's saturation and GELU's erf tails; the
    // small ones exercise tanh's series near 0.
    let a = common::inputs_in((-2.0, 2.0), batch * m * k, 5);
    let w = common::inputs_in((-1.0, 1.0), k * n, 6);
    let bias = common::inputs_in((-0.5, 0.5), n, 7);
    for act in ACTIVATIONS {
        let g = body(act);
        let kernel = matmul(&g).unwrap();
        let got = run(
            &device,
            &kernel,
            &[&a, &w, &bias],
            (&[batch, m, k], &[k, n]),
            batch * m * n,
        );
        let inputs = vec![
            Tensor::f32s(&[batch, m, k], a.clone()),
            Tensor::f32s(&[k, n], w.clone()),
            Tensor::f32s(&[n], bias.clone()),
        ];
        let want = rafter_reference::run_with(&g, inputs, &mut Bindings::default())
            .unwrap()
            .remove(0)
            .to_f64_vec();
        // The product's own rounding (K = 40 terms) dominates: atol for the GEMM's sum
        // order, rtol for the activation's few ulp.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                common::close(*g, *w as f32, 2e-5, 2e-5),
                "{act} [{i}]: got {g}, want {w}"
            );
        }
    }
}

#[test]
fn activations_keep_nan_and_saturate() {
    // A row of A that is NaN, one of +1e30 and one of -1e30 (W all ones): the activation
    // sees NaN, +inf-scale and -inf-scale values, where an unguarded `exp` or `tanh`
    // overflows to NaN.
    let Some(device) = common::device_or_skip("matmul activation edge values") else {
        return;
    };
    let (m, k, n) = (3, 40, 24);
    let mut a = vec![f32::NAN; k];
    a.extend(std::iter::repeat_n(1e30f32, k));
    a.extend(std::iter::repeat_n(-1e30f32, k));
    let w = vec![1.0f32; k * n];
    let bias = vec![0.0f32; n];
    for (act, high, low) in [
        ("unary{op = sigmoid}", 1.0, 0.0),
        ("unary{op = tanh}", 1.0, -1.0),
        // GELU is the identity far above 0: the row's sum, 40 * 1e30 (finite in f32).
        ("gelu{approximate = none}", 4e31, 0.0),
    ] {
        let kernel = matmul(&body(act)).unwrap();
        let got = run(
            &device,
            &kernel,
            &[&a, &w, &bias],
            (&[1, m, k], &[k, n]),
            m * n,
        );
        for j in 0..n {
            assert!(got[j].is_nan(), "{act}: NaN row gave {}", got[j]);
            assert!(
                common::close(got[n + j], high, 0.0, 1e-5),
                "{act}: +1e30 * 40 row gave {}",
                got[n + j]
            );
            // GELU far below 0 is 0 or -0: erf is exactly -1 there, `0.5 x (1 + erf)` is x * 0.
            assert!(
                got[2 * n + j] == low || (low == 0.0 && got[2 * n + j].abs() == 0.0),
                "{act}: -1e30 * 40 row gave {}",
                got[2 * n + j]
            );
        }
    }
}
