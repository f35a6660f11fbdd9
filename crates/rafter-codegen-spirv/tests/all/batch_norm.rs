//! Inference `batch_norm` on the Vulkan device (lavapipe in CI), against the reference
//! executor: parameters as kernel inputs and as folded constants, f32 and f16, 3-D to 5-D
//! data, a symbolic batch.

use crate::common;

use rafter_codegen_spirv::{batch_norm, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn f16s(dims: &[usize], v: &[f32]) -> Tensor {
    let bytes: Vec<u8> = v
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
}

fn tensor(dtype: DType, dims: &[usize], v: Vec<f32>) -> Tensor {
    if dtype == DType::F16 {
        f16s(dims, &v)
    } else {
        Tensor::f32s(dims, v)
    }
}

/// Compares the kernel's result with the reference's within f32 (or f16) rounding.
fn check(
    device: &rafter_hal_vulkan::VulkanDevice,
    text: &str,
    inputs: Vec<Tensor>,
    out: &[usize],
    dtype: DType,
) {
    let body = parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = batch_norm(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "batch_norm");
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap()
        .remove(0)
        .to_f64_vec();
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(device, &module, &inputs, (dtype, out)).to_f64_vec();
    let tol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            common::close(*g as f32, *w as f32, tol, tol),
            "{text}: [{k}] got {g} want {w}"
        );
    }
}

#[test]
fn batch_norms_match_the_reference() {
    let Some(device) = common::device_or_skip("batch_norm") else {
        return;
    };
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        for (dims, shown) in [
            (vec![2usize, 3, 7], "b, 3, 7"),
            (vec![2, 3, 4, 5], "b, 3, 4, 5"),
            (vec![1, 3, 2, 2, 3], "b, 3, 2, 2, 3"),
        ] {
            let n: usize = dims.iter().product();
            let x = common::inputs_in((-3.0, 3.0), n, 5);
            let text = format!(
                "graph @bn(%x: {dt}[{shown}], %s: {dt}[3], %o: {dt}[3], %m: {dt}[3], %v: {dt}[3]) -> (%y) {{\n  %y: {dt}[{shown}] = batch_norm{{epsilon = 0.01}}(%x, %s, %o, %m, %v)\n}}"
            );
            let inputs = vec![
                tensor(dtype, &dims, x.clone()),
                tensor(dtype, &[3], vec![0.5, -1.5, 2.0]),
                tensor(dtype, &[3], vec![0.25, 0.0, -1.0]),
                tensor(dtype, &[3], vec![-0.5, 1.0, 0.125]),
                tensor(dtype, &[3], vec![1.0, 0.25, 4.0]),
            ];
            check(&device, &text, inputs, &dims, dtype);
            let text = format!(
                "graph @bn(%x: {dt}[{shown}]) -> (%y) {{\n  const %s: f32[3] = dense [0.5, -1.5, 2.0]\n  const %o: f32[3] = dense [0.25, 0.0, -1.0]\n  const %m: f32[3] = dense [-0.5, 1.0, 0.125]\n  const %v: f32[3] = dense [1.0, 0.25, 4.0]\n  %y: {dt}[{shown}] = batch_norm{{epsilon = 0.01}}(%x, %s, %o, %m, %v)\n}}"
            );
            check(&device, &text, vec![tensor(dtype, &dims, x)], &dims, dtype);
        }
    }
}
