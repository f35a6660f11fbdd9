//! `eye_like` on the Vulkan device (lavapipe in CI), against the reference executor:
//! diagonals above, on and below the main one (and past the matrix), square, wide and
//! tall shapes, a 1-D input, results of f32, f16, bf16, f64, i32, u8 and bool, bit-exact.

use crate::common;

use rafter_codegen_spirv::{eye_like, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[test]
fn eye_like_matches_the_reference() {
    let Some(device) = common::device_or_skip("eye_like") else {
        return;
    };
    let shapes: [&[usize]; 4] = [&[3, 4], &[5, 2], &[4, 4], &[3]];
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        for dims in shapes {
            for k in [-6i64, -1, 0, 2] {
                let show = dims
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let out = [dims[0], *dims.last().unwrap()];
                let text = format!(
                    "graph @g(%x: f32[{show}]) -> (%y) {{\n  %y: {dtype}[{}, {}] = eye_like{{dtype = {dtype}, k = {k}}}(%x)\n}}",
                    out[0], out[1]
                );
                let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let kernel = eye_like(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, "eye_like");
                let count: usize = dims.iter().product();
                let x = Tensor::f32s(dims, vec![7.0; count]);
                let want = rafter_reference::run(&body, vec![x.clone()])
                    .unwrap()
                    .remove(0);
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &[x], (dtype, &out));
                assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
            }
        }
    }
}
