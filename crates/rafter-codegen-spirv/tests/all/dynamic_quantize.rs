//! `dynamic_quantize_linear` on the Vulkan device (lavapipe in CI), bit-exact against the
//! reference: ONNX's own cases (a .5 tie the driver's division would miss), tensors of
//! one sign (the range still includes 0), a constant tensor, many elements per invocation
//! and a symbolic shape, NaN elements, and the results the body does not output.

use crate::common;

use rafter_codegen_spirv::{dynamic_quantize, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn body(dims: &str) -> rafter_ir::Graph {
    let text = format!(
        "graph @q(%x: f32[{dims}]) -> (%y, %s, %z) {{\n  %y: u8[{dims}], %s: f32[], %z: u8[] = dynamic_quantize_linear(%x)\n}}"
    );
    parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Runs the body's kernel on `x` and compares all three results with the reference.
fn check(device: &rafter_hal_vulkan::VulkanDevice, g: &rafter_ir::Graph, x: Tensor) {
    let module = kernel_module(g, 0).unwrap();
    let want = rafter_reference::run(g, vec![x.clone()]).unwrap();
    let dims = vec![x.shape().to_vec(), vec![], vec![]];
    let got = common::run_typed_outputs(
        device,
        &module,
        &[x],
        &[DType::U8, DType::F32, DType::U8],
        &dims,
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_le_bytes(), w.to_le_bytes(), "output {i}");
    }
}

#[test]
fn dynamic_quantization_matches_the_reference() {
    let g = body("2, 3");
    let kernel = dynamic_quantize(&g).unwrap();
    common::spirv_val(&kernel.spirv, "dynamic_quantize");
    let Some(device) = common::device_or_skip("dynamic quantize") else {
        return;
    };
    let cases: [&[f32]; 5] = [
        // ONNX's test_dynamicquantizelinear: 25.5 is a tie that rounds to 26.
        &[0.0, 2.0, -3.0, -2.5, 1.34, 0.5],
        &[-1.0, -2.1, -1.3, -2.5, -3.34, -4.0],
        &[1.0, 2.1, 1.3, 2.5, 3.34, 4.0],
        &[0.0; 6],
        &[f32::NAN, 1.0, -1.0, 0.25, f32::NAN, 7.5],
    ];
    for x in cases {
        check(&device, &g, Tensor::f32s(&[2, 3], x.to_vec()));
    }
}

/// Far more elements than invocations (each takes many), the extremes anywhere, through
/// a symbolic dim.
#[test]
fn large_and_symbolic_tensors_match_the_reference() {
    let g = body("b, 384, 97");
    let Some(device) = common::device_or_skip("dynamic quantize large") else {
        return;
    };
    for (n, seed) in [(1usize, 3u64), (3, 11)] {
        let values = common::inputs_in((-7.5, 11.25), n * 384 * 97, seed);
        check(&device, &g, Tensor::f32s(&[n, 384, 97], values));
    }
}

/// Only the quantized tensor is an output: the scale and zero point are not written.
#[test]
fn a_body_without_the_scale_output_runs() {
    let g = parse_graph(
        "graph @q(%x: f32[5]) -> (%y) {\n  %y: u8[5], %s: f32[], %z: u8[] = dynamic_quantize_linear(%x)\n}",
    )
    .unwrap();
    let Some(device) = common::device_or_skip("dynamic quantize y only") else {
        return;
    };
    let module = kernel_module(&g, 0).unwrap();
    let x = Tensor::f32s(&[5], vec![-1.0, 0.5, 2.0, 3.0, -0.25]);
    let want = rafter_reference::run(&g, vec![x.clone()])
        .unwrap()
        .remove(0);
    let got = common::run_module(&device, &module, &[x], (DType::U8, &[5]));
    assert_eq!(got.to_le_bytes(), want.to_le_bytes());
}

#[test]
fn quantizations_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @q(%x: f16[4]) -> (%y, %s, %z) {\n  %y: u8[4], %s: f16[], %z: u8[] = dynamic_quantize_linear(%x)\n}",
            "f32 is generated",
        ),
        (
            "graph @q(%x: f32[]) -> (%y, %s, %z) {\n  %y: u8[], %s: f32[], %z: u8[] = dynamic_quantize_linear(%x)\n}",
            "scalar or an empty",
        ),
        (
            "graph @q(%x: f32[4]) -> (%s, %y) {\n  %y: u8[4], %s: f32[], %z: u8[] = dynamic_quantize_linear(%x)\n}",
            "first output",
        ),
    ];
    for (text, want) in cases {
        let e = dynamic_quantize(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
