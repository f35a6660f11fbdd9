//! `scatter_elements` on the Vulkan device (lavapipe in CI), against the reference
//! executor: every axis of a 3-D tensor, every reduction, duplicate and negative indices,
//! indices smaller than the data off the axis, NaNs, i32 and i64 indices, f32 and f16.

use crate::common;

use rafter_codegen_spirv::{kernel_module, scatter_elements};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn index_tensor(dtype: DType, dims: &[usize], v: &[i64]) -> Tensor {
    let bytes: Vec<u8> = if dtype == DType::I32 {
        v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    } else {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    Tensor::from_le_bytes(dtype, dims, &bytes).unwrap()
}

#[test]
fn scatter_elements_match_the_reference() {
    let Some(device) = common::device_or_skip("scatter_elements") else {
        return;
    };
    let dims = [3usize, 4, 5];
    let data: Vec<f32> = (0..60)
        .map(|i| {
            if i == 7 {
                f32::NAN
            } else {
                i as f32 * 0.25 - 3.0
            }
        })
        .collect();
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        for axis in -3i64..3 {
            let a = axis.rem_euclid(3) as usize;
            let n = dims[a] as i64;
            // Off the axis smaller than the data; along it, a length with duplicates.
            let mut out = [2usize, 3, 4];
            out[a] = 6;
            let count: usize = out.iter().product();
            let ids: Vec<i64> = (0..count as i64).map(|k| (k * 7) % (2 * n) - n).collect();
            let upd: Vec<f32> = (0..count)
                .map(|k| {
                    if k == 5 {
                        f32::NAN
                    } else {
                        k as f32 * 0.5 - 7.0
                    }
                })
                .collect();
            for reduction in ["none", "add", "mul", "max", "min"] {
                for (idt, idtype) in [("i64", DType::I64), ("i32", DType::I32)] {
                    let text = format!(
                        "graph @g(%x: {dt}[3, 4, 5], %i: {idt}[{o}], %u: {dt}[{o}]) -> (%y) {{\n  %y: {dt}[3, 4, 5] = scatter_elements{{axis = {axis}, reduction = {reduction}}}(%x, %i, %u)\n}}",
                        o = common::dims_text(&out)
                    );
                    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                    let kernel = scatter_elements(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                    common::spirv_val(&kernel.spirv, &format!("scatter_elements_{a}_{reduction}"));
                    let inputs = vec![
                        common::floats(dtype, &dims, &data),
                        index_tensor(idtype, &out, &ids),
                        common::floats(dtype, &out, &upd),
                    ];
                    let want = rafter_reference::run(&body, inputs.clone())
                        .unwrap()
                        .remove(0);
                    let module = kernel_module(&body, 0).unwrap();
                    let got = common::run_module(&device, &module, &inputs, (dtype, &dims));
                    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
                    for (k, (g, w)) in g.iter().zip(&w).enumerate() {
                        assert!(
                            common::close(*g as f32, *w as f32, 0.0, 1e-6),
                            "{text}: element {k}: {g} vs reference {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scatter_elements_of_integers_is_refused_with_the_reason() {
    let body = parse_graph(
        "graph @g(%x: i32[4], %i: i64[2], %u: i32[2]) -> (%y) {\n  %y: i32[4] = scatter_elements{axis = 0, reduction = none}(%x, %i, %u)\n}",
    )
    .unwrap();
    let e = scatter_elements(&body).unwrap_err();
    assert!(e.contains("i32"), "{e}");
}
