//! `arg_reduce` (ONNX ArgMax/ArgMin) on the Vulkan device (lavapipe in CI), against the
//! reference executor: every axis of a 3-D tensor, keepdims or not, first or last index,
//! ties and NaNs (NaN wins, the first or last one), f32 and f16.

use crate::common;

use half::f16;
use rafter_codegen_spirv::{arg_reduce, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// A `[3, 4, 5]` tensor with ties (values in steps of 1 over a small range) and, with
/// `nans`, NaNs in some lanes of every axis.
fn data(dtype: DType, nans: bool) -> Tensor {
    let values: Vec<f32> = (0..60u32)
        .map(|i| {
            if nans && (i % 17 == 3 || i % 23 == 5) {
                f32::NAN
            } else {
                ((i * 7) % 5) as f32 - 2.0
            }
        })
        .collect();
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, &[3, 4, 5], &bytes).unwrap()
        }
        _ => Tensor::f32s(&[3, 4, 5], values),
    }
}

#[test]
fn arg_reduces_match_the_reference() {
    let Some(device) = common::device_or_skip("arg_reduce") else {
        return;
    };
    let dims = [3usize, 4, 5];
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        for kind in ["max", "min"] {
            for axis in -3i64..3 {
                for keep in [true, false] {
                    for last in [false, true] {
                        let a = axis.rem_euclid(3) as usize;
                        let out: Vec<usize> = (0..3)
                            .filter_map(|d| match (d == a, keep) {
                                (true, true) => Some(1),
                                (true, false) => None,
                                _ => Some(dims[d]),
                            })
                            .collect();
                        let shown = out.iter().map(|d| d.to_string()).collect::<Vec<_>>();
                        let text = format!(
                            "graph @a(%x: {dt}[3, 4, 5]) -> (%y) {{\n  %y: i64[{}] = arg_reduce{{kind = {kind}, axis = {axis}, keep_dims = {keep}, select_last_index = {last}}}(%x)\n}}",
                            shown.join(", ")
                        );
                        let body = parse_graph(&text).unwrap();
                        let kernel = arg_reduce(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                        common::spirv_val(&kernel.spirv, &format!("arg_{kind}_{a}_{keep}_{last}"));
                        let module = kernel_module(&body, 0).unwrap();
                        for nans in [false, true] {
                            let inputs = vec![data(dtype, nans)];
                            let want = rafter_reference::run(&body, inputs.clone())
                                .unwrap()
                                .remove(0);
                            let got =
                                common::run_module(&device, &module, &inputs, (DType::I64, &out));
                            assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text} nans={nans}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn arg_reduces_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @a(%x: f32[n, 4]) -> (%y) {\n  %y: i64[n, 1] = arg_reduce{kind = max, axis = 1, keep_dims = true, select_last_index = false}(%x)\n}",
            "dim n is not static",
        ),
        (
            "graph @a(%x: i32[3, 4]) -> (%y) {\n  %y: i64[3, 1] = arg_reduce{kind = max, axis = 1, keep_dims = true, select_last_index = false}(%x)\n}",
            "arg_reduce data is i32",
        ),
    ];
    for (text, want) in cases {
        let e = arg_reduce(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
