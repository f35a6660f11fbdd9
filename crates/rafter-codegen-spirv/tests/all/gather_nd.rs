//! `gather_nd` on the Vulkan device (lavapipe in CI), against the reference executor:
//! tuples naming single elements, rows and whole slices, `batch_dims` 0 to 2, negative
//! coordinates, i32 and i64 indices, f32, f16 and i64 data, bit-exact.

use crate::common;

use rafter_codegen_spirv::{gather_nd, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn list(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn gather_nd_matches_the_reference() {
    let Some(device) = common::device_or_skip("gather_nd") else {
        return;
    };
    let data = [2usize, 3, 4, 5];
    // (batch_dims, indices' dims)
    let cases: [(usize, &[usize]); 6] = [
        (0, &[3, 4]),
        (0, &[2, 2, 2]),
        (0, &[5, 1]),
        (1, &[2, 3, 2]),
        (1, &[2, 1]),
        (2, &[2, 3, 4, 2]),
    ];
    for dtype in [DType::F32, DType::F16, DType::I64] {
        for (b, ids) in cases {
            for idt in [DType::I64, DType::I32] {
                let m = *ids.last().unwrap();
                let mut out: Vec<usize> = ids[..ids.len() - 1].to_vec();
                out.extend(&data[b + m..]);
                let text = format!(
                    "graph @g(%x: {dtype}[{}], %i: {idt}[{}]) -> (%y) {{\n  %y: {dtype}[{}] = gather_nd{{batch_dims = {b}}}(%x, %i)\n}}",
                    list(&data),
                    list(ids),
                    list(&out)
                );
                let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let kernel = gather_nd(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, "gather_nd");
                let count: usize = data.iter().product();
                let bytes: Vec<u8> = (0..count * dtype.size_of())
                    .map(|k| (k * 131 % 251) as u8 & 0x3F)
                    .collect();
                let x = Tensor::from_le_bytes(dtype, &data, &bytes).unwrap();
                // Coordinate k of each tuple within its axis, negative every third one.
                let n: usize = ids.iter().product();
                let values: Vec<i64> = (0..n)
                    .map(|j| {
                        let len = data[b + j % m] as i64;
                        let v = (j as i64 * 7) % len;
                        if j % 3 == 0 {
                            v - len
                        } else {
                            v
                        }
                    })
                    .collect();
                let ib: Vec<u8> = match idt {
                    DType::I32 => values
                        .iter()
                        .flat_map(|&v| (v as i32).to_le_bytes())
                        .collect(),
                    _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                let inputs = vec![x, Tensor::from_le_bytes(idt, ids, &ib).unwrap()];
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (dtype, &out));
                assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
            }
        }
    }
}
