//! `swiglu` on the Vulkan device (lavapipe in CI), against the reference executor: f32
//! and f16, alpha 1 and 1.702, inputs over a wide range (exp saturating both ways), NaN.

use crate::common;

use half::f16;
use rafter_codegen_spirv::{kernel_module, swiglu};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn floats(dtype: DType, values: &[f32]) -> Tensor {
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, &[values.len()], &bytes).unwrap()
        }
        _ => Tensor::f32s(&[values.len()], values.to_vec()),
    }
}

#[test]
fn swiglu_matches_the_reference() {
    let Some(device) = common::device_or_skip("swiglu") else {
        return;
    };
    let n = 301usize;
    let a: Vec<f32> = (0..n)
        .map(|i| {
            if i == 17 {
                f32::NAN
            } else {
                (i as f32 - 150.0) * 0.4
            }
        })
        .collect();
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 37) % 29) as f32 * 0.25 - 3.0)
        .collect();
    for (dt, dtype, rtol) in [("f32", DType::F32, 1e-5), ("f16", DType::F16, 1e-3)] {
        for alpha in [1.0f32, 1.702] {
            let text = format!(
                "graph @g(%a: {dt}[{n}], %b: {dt}[{n}]) -> (%y) {{\n  %y: {dt}[{n}] = swiglu{{alpha = {alpha}}}(%a, %b)\n}}"
            );
            let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let kernel = swiglu(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
            common::spirv_val(&kernel.spirv, &format!("swiglu_{dt}"));
            let inputs = vec![floats(dtype, &a), floats(dtype, &g)];
            let want = rafter_reference::run(&body, inputs.clone())
                .unwrap()
                .remove(0);
            let module = kernel_module(&body, 0).unwrap();
            let got = common::run_module(&device, &module, &inputs, (dtype, &[n]));
            for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                assert!(
                    common::close(*g as f32, w as f32, 1e-6, rtol),
                    "{text}: element {k}: {g} vs reference {w}"
                );
            }
        }
    }
}

#[test]
fn swiglu_with_broadcasting_is_refused() {
    let body = parse_graph(
        "graph @g(%a: f32[2, 3], %b: f32[3]) -> (%y) {\n  %y: f32[2, 3] = swiglu{alpha = 1.0}(%a, %b)\n}",
    );
    if let Ok(body) = body {
        assert!(swiglu(&body).is_err());
    }
}
