//! `space_to_depth` on the Vulkan device (lavapipe in CI), against the reference executor:
//! block sizes 1, 2 and 3, f32, f16, i64 and u8 data, bit-exact.

use crate::common;

use rafter_codegen_spirv::{kernel_module, space_to_depth};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[test]
fn space_to_depth_matches_the_reference() {
    let Some(device) = common::device_or_skip("space_to_depth") else {
        return;
    };
    for (dtype, bs, dims) in [
        (DType::F32, 2usize, [2usize, 3, 4, 6]),
        (DType::F32, 3, [1, 2, 6, 3]),
        (DType::F32, 1, [1, 2, 2, 3]),
        (DType::F16, 2, [2, 2, 2, 4]),
        (DType::I64, 2, [1, 3, 4, 2]),
        (DType::U8, 2, [2, 1, 4, 4]),
    ] {
        let count: usize = dims.iter().product();
        let out = [dims[0], dims[1] * bs * bs, dims[2] / bs, dims[3] / bs];
        let bytes: Vec<u8> = (0..count * dtype.size_of())
            .map(|k| (k * 89 % 251) as u8 & 0x7F)
            .collect();
        let x = Tensor::from_le_bytes(dtype, &dims, &bytes).unwrap();
        let show = |d: &[usize]| {
            d.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            "graph @g(%x: {dtype}[{}]) -> (%y) {{\n  %y: {dtype}[{}] = space_to_depth{{blocksize = {bs}}}(%x)\n}}",
            show(&dims),
            show(&out)
        );
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let kernel = space_to_depth(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
        common::spirv_val(&kernel.spirv, "space_to_depth");
        let want = rafter_reference::run(&body, vec![x.clone()])
            .unwrap()
            .remove(0);
        let module = kernel_module(&body, 0).unwrap();
        let got = common::run_module(&device, &module, &[x], (dtype, &out));
        assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
    }
}
