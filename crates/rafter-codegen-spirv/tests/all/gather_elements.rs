//! `gather_elements` on the Vulkan device (lavapipe in CI), against the reference
//! executor: every axis of a 3-D tensor, i32 and i64 indices (negative ones), indices
//! smaller than the data off the axis; an index outside the axis reads as NaN.

use crate::common;

use rafter_codegen_spirv::{gather_elements, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn show(d: &[usize]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn index_tensor(dtype: DType, dims: &[usize], v: &[i64]) -> Tensor {
    let bytes: Vec<u8> = if dtype == DType::I32 {
        v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    } else {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    Tensor::from_le_bytes(dtype, dims, &bytes).unwrap()
}

#[test]
fn gather_elements_match_the_reference() {
    let Some(device) = common::device_or_skip("gather_elements") else {
        return;
    };
    let dims = [3usize, 4, 5];
    let data = Tensor::f32s(&dims, (0..60).map(|i| i as f32 * 0.25 - 3.0).collect());
    for axis in -3i64..3 {
        let a = axis.rem_euclid(3) as usize;
        let n = dims[a] as i64;
        // Off the axis the indices may be smaller than the data; along it, any length.
        let out = [2usize, 3, 4];
        let count: usize = out.iter().product();
        let values: Vec<i64> = (0..count as i64).map(|k| (k * 7) % (2 * n) - n).collect();
        for (idt, dtype) in [("i64", DType::I64), ("i32", DType::I32)] {
            let text = format!(
                "graph @g(%x: f32[3, 4, 5], %i: {idt}[{o}]) -> (%y) {{\n  %y: f32[{o}] = gather_elements{{axis = {axis}}}(%x, %i)\n}}",
                o = show(&out)
            );
            let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let kernel = gather_elements(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
            common::spirv_val(&kernel.spirv, &format!("gather_elements_{a}_{idt}"));
            let inputs = vec![data.clone(), index_tensor(dtype, &out, &values)];
            let want = rafter_reference::run(&body, inputs.clone())
                .unwrap()
                .remove(0);
            let module = kernel_module(&body, 0).unwrap();
            let got = common::run_module(&device, &module, &inputs, (DType::F32, &out));
            assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
        }
    }
}

#[test]
fn an_index_outside_the_axis_reads_as_nan() {
    let body = parse_graph(
        "graph @g(%x: f32[2, 3], %i: i64[2, 2]) -> (%y) {\n  %y: f32[2, 2] = gather_elements{axis = 1}(%x, %i)\n}",
    )
    .unwrap();
    let Some(device) = common::device_or_skip("gather_elements out of range") else {
        return;
    };
    let module = kernel_module(&body, 0).unwrap();
    let data = Tensor::f32s(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let inputs = vec![data, index_tensor(DType::I64, &[2, 2], &[-1, 3, -4, 0])];
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &[2, 2])).to_f64_vec();
    assert_eq!((got[0], got[3]), (2.0, 3.0));
    assert!(got[1].is_nan() && got[2].is_nan(), "{got:?}");
}
