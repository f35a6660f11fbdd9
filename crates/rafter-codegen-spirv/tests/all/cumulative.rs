//! `cumulative` (ONNX CumSum/CumProd) on the Vulkan device (lavapipe in CI), against the
//! reference executor: every axis (negative ones too) of a 3-D tensor read at run time
//! from an i64 or i32 input or folded as a constant, sums and products, `exclusive` and
//! `reverse`, f32, f16, and i32/i64 values that wrap.

use crate::common;

use half::f16;
use rafter_codegen_spirv::{cumulative, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

const DIMS: [usize; 3] = [2, 3, 4];

/// `values` as a tensor of `DIMS` and `dtype`.
fn data(dtype: DType, values: &[i64]) -> Tensor {
    let bytes: Vec<u8> = match dtype {
        DType::F32 => values
            .iter()
            .flat_map(|&v| (v as f32 * 0.75).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v as f32 * 0.75).to_le_bytes())
            .collect(),
        DType::I32 => values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    Tensor::from_le_bytes(dtype, &DIMS, &bytes).unwrap()
}

fn scalar(dtype: DType, v: i64) -> Tensor {
    let bytes = if dtype == DType::I32 {
        (v as i32).to_le_bytes().to_vec()
    } else {
        v.to_le_bytes().to_vec()
    };
    Tensor::from_le_bytes(dtype, &[], &bytes).unwrap()
}

/// Runs one cumulative on the device and the reference; asserts they agree (exactly for
/// integers).
fn check(
    device: &rafter_hal_vulkan::VulkanDevice,
    dtype: DType,
    attrs: &str,
    axis: (i64, Option<DType>),
) {
    let (a, axis_ty) = axis;
    let d = "2, 3, 4";
    let text = match axis_ty {
        Some(at) => format!(
            "graph @g(%x: {dtype}[{d}], %a: {at}[]) -> (%y) {{\n  %y: {dtype}[{d}] = cumulative{{{attrs}}}(%x, %a)\n}}"
        ),
        None => format!(
            "graph @g(%x: {dtype}[{d}]) -> (%y) {{\n  const %a: i64[] = dense [{a}]\n  %y: {dtype}[{d}] = cumulative{{{attrs}}}(%x, %a)\n}}"
        ),
    };
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = cumulative(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "cumulative");
    // Large integers, so i32 products and sums wrap; small floats.
    let big = matches!(dtype, DType::I32 | DType::I64);
    let values: Vec<i64> = (0..24)
        .map(|i| {
            let v = (i * 7 % 11) - 5;
            if big {
                v * 0x3F5_1234_5678 + 3
            } else {
                v
            }
        })
        .collect();
    let mut inputs = vec![data(dtype, &values)];
    if let Some(at) = axis_ty {
        inputs.push(scalar(at, a));
    }
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap()
        .remove(0);
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(device, &module, &inputs, (dtype, &DIMS));
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    if big {
        assert_eq!(
            got.to_le_bytes(),
            want.to_le_bytes(),
            "{text}: {g:?} vs {w:?}"
        );
        return;
    }
    let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-6 };
    for (k, (g, w)) in g.iter().zip(&w).enumerate() {
        assert!(
            common::close(*g as f32, *w as f32, 1e-6, rtol),
            "{text}: element {k}: {g} vs reference {w}"
        );
    }
}

#[test]
fn cumulative_matches_the_reference() {
    let Some(device) = common::device_or_skip("cumulative") else {
        return;
    };
    for dtype in [DType::F32, DType::F16, DType::I32, DType::I64] {
        for kind in ["sum", "prod"] {
            for exclusive in [false, true] {
                for reverse in [false, true] {
                    let attrs =
                        format!("kind = {kind}, exclusive = {exclusive}, reverse = {reverse}");
                    for a in -3i64..3 {
                        check(&device, dtype, &attrs, (a, Some(DType::I64)));
                    }
                    check(&device, dtype, &attrs, (-1, Some(DType::I32)));
                    check(&device, dtype, &attrs, (1, None));
                }
            }
        }
    }
}

#[test]
fn cumulative_of_bool_is_refused_with_the_reason() {
    let body = parse_graph(
        "graph @g(%x: bool[3], %a: i64[]) -> (%y) {\n  %y: bool[3] = cumulative{kind = sum, exclusive = false, reverse = false}(%x, %a)\n}",
    )
    .unwrap();
    let e = cumulative(&body).unwrap_err();
    assert!(e.contains("bool"), "{e}");
}
