//! `matmul_block_quant` (ONNX Runtime's MatMulNBits) on the Vulkan device (lavapipe in
//! CI), against the reference within 1e-5 relative: 4- and 8-bit blocks, a partial last
//! block, with and without zero points and bias, a symbolic batch, and `accuracy_level` 4
//! (A rounded to int8 per block first).

use crate::common;

use rafter_codegen_spirv::{block_quant, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn bytes(count: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(7);
    (0..count)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

/// One case: `bits`, zero points, bias, the zero points folded, accuracy level.
fn run_case(
    device: &rafter_hal_vulkan::VulkanDevice,
    bits: usize,
    (zp, bias, folded): (bool, bool, bool),
    level: i64,
) {
    let (k, n, block, rows) = (80usize, 6usize, 32usize, 3usize);
    let kb = k.div_ceil(block);
    let blob = block * bits / 8;
    let zp_row = kb.div_ceil(8 / bits);
    let mut params = format!(
        "%a: f32[b, {k}], %w: u8[{n}, {kb}, {blob}], %s: f32[{}]",
        n * kb
    );
    let mut args = "%a, %w, %s".to_string();
    if zp {
        params += &format!(", %z: u8[{}]", n * zp_row);
        args += ", %z";
    } else if bias {
        args += ", _";
    }
    if bias {
        params += &format!(", %bias: f32[{n}]");
        args += ", %bias";
    }
    let text = format!(
        "graph @q({params}) -> (%y) {{\n  %y: f32[b, {n}] = matmul_block_quant{{k = {k}, n = {n}, bits = {bits}, block_size = {block}, accuracy_level = {level}}}({args})\n}}"
    );
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = block_quant(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "block_quant");
    let mut inputs = vec![
        Tensor::f32s(
            &[rows, k],
            common::inputs_in((-2.0, 2.0), rows * k, bits as u64),
        ),
        Tensor::from_le_bytes(DType::U8, &[n, kb, blob], &bytes(n * kb * blob, 3)).unwrap(),
        Tensor::f32s(&[n * kb], common::inputs_in((0.01, 0.2), n * kb, 4)),
    ];
    if zp {
        inputs
            .push(Tensor::from_le_bytes(DType::U8, &[n * zp_row], &bytes(n * zp_row, 5)).unwrap());
    }
    if bias {
        inputs.push(Tensor::f32s(&[n], common::inputs_in((-1.0, 1.0), n, 6)));
    }
    // A folded zero point: the compiler keeps initializers of 64 bytes or less in the body.
    let g = if folded && zp {
        common::fold_input(&g, 3, &inputs.remove(3))
    } else {
        g
    };
    common::spirv_val(&block_quant(&g).unwrap().spirv, "block_quant_folded");
    let module = kernel_module(&g, 0).unwrap();
    let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
    let got = common::run_module(device, &module, &inputs, (DType::F32, &[rows, n]));
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            common::close(*g as f32, w as f32, 1e-5, 1e-5),
            "{text}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn block_quantized_products_match_the_reference() {
    let Some(device) = common::device_or_skip("block quant") else {
        return;
    };
    for bits in [4, 8] {
        for (zp, bias) in [(false, false), (true, false), (false, true), (true, true)] {
            for level in [0, 4] {
                for folded in [false, true] {
                    run_case(&device, bits, (zp, bias, folded), level);
                }
            }
        }
    }
}
