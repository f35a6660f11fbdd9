//! `trilu` on the Vulkan device (lavapipe in CI), against the reference executor: upper
//! and lower, `k` absent, constant or a run-time input (negative, past the matrix), f32,
//! f16, i64 and i8 data with a batch dim; bit-exact.

use crate::common;

use rafter_codegen_spirv::{kernel_module, trilu};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// `[2, 4, 5]` distinct values of `dtype` (negative ones included).
fn data(dtype: DType) -> Tensor {
    let v: Vec<i64> = (0..40).map(|i| i * 3 - 50).collect();
    let bytes: Vec<u8> = match dtype {
        DType::I64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I8 => v.iter().map(|&x| x as i8 as u8).collect(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x as f32).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
    };
    Tensor::from_le_bytes(dtype, &[2, 4, 5], &bytes).unwrap()
}

#[test]
fn trilus_match_the_reference() {
    let Some(device) = common::device_or_skip("trilu") else {
        return;
    };
    for (dt, dtype) in [
        ("f32", DType::F32),
        ("f16", DType::F16),
        ("i64", DType::I64),
        ("i8", DType::I8),
    ] {
        for upper in [true, false] {
            let head = format!("%y: {dt}[2, 4, 5] = trilu{{upper = {upper}}}");
            let mut cases = vec![
                (format!("graph @t(%x: {dt}[2, 4, 5]) -> (%y) {{\n  {head}(%x)\n}}"), None),
                (
                    format!("graph @t(%x: {dt}[2, 4, 5]) -> (%y) {{\n  const %k: i64[] = dense [-2]\n  {head}(%x, %k)\n}}"),
                    None,
                ),
            ];
            for k in [-3i64, 0, 2, 7] {
                cases.push((
                    format!(
                        "graph @t(%x: {dt}[2, 4, 5], %k: i64[]) -> (%y) {{\n  {head}(%x, %k)\n}}"
                    ),
                    Some(k),
                ));
            }
            for (text, k) in cases {
                let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let kernel = trilu(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, &format!("trilu_{dt}_{upper}"));
                let mut inputs = vec![data(dtype)];
                if let Some(k) = k {
                    inputs.push(Tensor::i64s(&[], vec![k]));
                }
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (dtype, &[2, 4, 5]));
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text} k={k:?}");
            }
        }
    }
}
