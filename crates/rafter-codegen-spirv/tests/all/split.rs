//! `split` on the Vulkan device (lavapipe in CI), against the reference executor: every
//! axis of 1- to 3-D tensors, equal and uneven parts (an empty one after the first), f32
//! and f16; a split whose first part is empty says why.

use crate::common;

use rafter_codegen_spirv::{kernel_module, split};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn show(d: &[usize]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Distinct values, exact in f16 (multiples of 1/4 below 256).
fn tensor(dtype: DType, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (i % 900) as f32 / 4.0).collect();
    if dtype == DType::F16 {
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
    } else {
        Tensor::f32s(dims, v)
    }
}

/// Runs a one-split body with results of `parts` lengths along `axis` and compares every
/// result with the reference's.
fn check(
    device: &rafter_hal_vulkan::VulkanDevice,
    dt: &str,
    dims: &[usize],
    axis: i64,
    parts: &[usize],
) {
    let dtype = if dt == "f16" { DType::F16 } else { DType::F32 };
    let a = axis.rem_euclid(dims.len() as i64) as usize;
    let shapes: Vec<Vec<usize>> = parts
        .iter()
        .map(|&n| {
            let mut d = dims.to_vec();
            d[a] = n;
            d
        })
        .collect();
    let names: Vec<String> = (0..parts.len()).map(|k| format!("%y{k}")).collect();
    let typed: Vec<String> = shapes
        .iter()
        .zip(&names)
        .map(|(d, n)| format!("{n}: {dt}[{}]", show(d)))
        .collect();
    let sizes = parts
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "graph @s(%x: {dt}[{}]) -> ({}) {{\n  const %n: i64[{}] = dense [{sizes}]\n  {} = split{{axis = {axis}}}(%x, %n)\n}}",
        show(dims),
        names.join(", "),
        parts.len(),
        typed.join(", "),
    );
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = split(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, &format!("split_{a}_{dt}"));
    let inputs = vec![tensor(dtype, dims)];
    let want = rafter_reference::run(&body, inputs.clone()).unwrap();
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_outputs(device, &module, &inputs, dtype, &shapes);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "{text}: result {k}");
    }
}

#[test]
fn splits_match_the_reference() {
    let Some(device) = common::device_or_skip("split") else {
        return;
    };
    let base = [4usize, 6, 5];
    for dt in ["f32", "f16"] {
        for rank in 1..=3 {
            for axis in -(rank as i64)..rank as i64 {
                let a = axis.rem_euclid(rank as i64) as usize;
                let n = base[a];
                check(&device, dt, &base[..rank], axis, &[n / 2, n - n / 2]);
                check(&device, dt, &base[..rank], axis, &[1, 0, n - 2, 1]);
            }
        }
    }
}

#[test]
fn a_split_with_an_empty_first_part_says_why() {
    let text = "graph @s(%x: f32[4]) -> (%a, %b) {\n  const %n: i64[2] = dense [0, 4]\n  %a: f32[0], %b: f32[4] = split{axis = 0}(%x, %n)\n}";
    let e = split(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.contains("first result is empty"), "{e}");
}
