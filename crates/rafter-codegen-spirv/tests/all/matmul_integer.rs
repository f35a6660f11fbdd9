//! `matmul_integer` on the Vulkan device (lavapipe in CI), bit-exact against the
//! reference: u8 and i8 operands, zero points per tensor, per row of A and per column of
//! B, sums past 2^24 (where f32 accumulation would round), a symbolic batch, and the
//! float epilogue `MatMulIntegerToFloat` / `DynamicQuantizeMatMul` import as.

use crate::common;

use rafter_codegen_spirv::{kernel_module, matmul_integer};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// `count` bytes from a small generator, or all `fill` where given.
fn bytes(count: usize, seed: u64, fill: Option<u8>) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..count)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            fill.unwrap_or((s >> 56) as u8)
        })
        .collect()
}

fn int(dtype: DType, dims: &[usize], seed: u64, fill: Option<u8>) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_le_bytes(dtype, dims, &bytes(n, seed, fill)).unwrap()
}

/// Runs `text`'s kernel on `inputs` and checks its one output against the reference.
fn check(text: &str, inputs: Vec<Tensor>, out: (DType, &[usize])) {
    let g = parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = matmul_integer(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "matmul_integer");
    let Some(device) = common::device_or_skip("matmul integer") else {
        return;
    };
    let module = kernel_module(&g, 0).unwrap();
    let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
    let got = common::run_module(&device, &module, &inputs, out);
    assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
}

#[test]
fn integer_products_with_zero_points_match_the_reference() {
    for (at, bt, seed) in [
        ("u8", "u8", 1),
        ("u8", "i8", 2),
        ("i8", "i8", 3),
        ("i8", "u8", 4),
    ] {
        let dt = |s: &str| if s == "u8" { DType::U8 } else { DType::I8 };
        let text = format!(
            "graph @m(%a: {at}[5, 37], %b: {bt}[37, 9], %za: {at}[], %zb: {bt}[]) -> (%y) {{\n  %y: i32[5, 9] = matmul_integer(%a, %b, %za, %zb)\n}}"
        );
        let inputs = vec![
            int(dt(at), &[5, 37], seed, None),
            int(dt(bt), &[37, 9], seed + 10, None),
            int(dt(at), &[], seed + 20, None),
            int(dt(bt), &[], seed + 30, None),
        ];
        check(&text, inputs, (DType::I32, &[5, 9]));
    }
}

#[test]
fn per_row_and_per_column_zero_points_match_the_reference() {
    let text = "graph @m(%a: u8[2, 6, 40], %b: i8[40, 7], %za: u8[6], %zb: i8[7]) -> (%y) {\n  %y: i32[2, 6, 7] = matmul_integer(%a, %b, %za, %zb)\n}";
    let inputs = vec![
        int(DType::U8, &[2, 6, 40], 5, None),
        int(DType::I8, &[40, 7], 6, None),
        int(DType::U8, &[6], 7, None),
        int(DType::I8, &[7], 8, None),
    ];
    check(text, inputs, (DType::I32, &[2, 6, 7]));
}

/// 255 · -128 · 1024 = -33,423,360: past 2^24, exact only in integers.
#[test]
fn long_sums_stay_exact() {
    let text = "graph @m(%a: u8[3, 1024], %b: i8[1024, 5]) -> (%y) {\n  %y: i32[3, 5] = matmul_integer(%a, %b)\n}";
    let inputs = vec![
        int(DType::U8, &[3, 1024], 0, Some(255)),
        int(DType::I8, &[1024, 5], 0, Some(0x80)),
    ];
    check(text, inputs, (DType::I32, &[3, 5]));
}

/// The float epilogue of `DynamicQuantizeMatMul` on a symbolic batch: cast, scalar scale,
/// per-column bias, then a residual of the result's dims.
#[test]
fn the_float_epilogue_matches_the_reference() {
    let text = "graph @m(%a: u8[b, 4, 64], %b: i8[64, 48], %za: u8[], %s: f32[], %bias: f32[48], %r: f32[b, 4, 48]) -> (%y) {\n  %p: i32[b, 4, 48] = matmul_integer(%a, %b, %za)\n  %f: f32[b, 4, 48] = cast{to = f32}(%p)\n  %g: f32[b, 4, 48] = binary{op = mul}(%f, %s)\n  %h: f32[b, 4, 48] = binary{op = add}(%bias, %g)\n  %y: f32[b, 4, 48] = binary{op = sub}(%h, %r)\n}";
    let n = 3;
    let inputs = vec![
        int(DType::U8, &[n, 4, 64], 9, None),
        int(DType::I8, &[64, 48], 10, None),
        int(DType::U8, &[], 11, None),
        Tensor::f32s(&[], vec![0.0123]),
        Tensor::f32s(&[48], common::inputs_in((-2.0, 2.0), 48, 12)),
        Tensor::f32s(&[n, 4, 48], common::inputs_in((-1.0, 1.0), n * 4 * 48, 13)),
    ];
    check(text, inputs, (DType::F32, &[n, 4, 48]));
}

#[test]
fn integer_products_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @m(%a: u8[2, 4, 3], %b: u8[2, 3, 5]) -> (%y) {\n  %y: i32[2, 4, 5] = matmul_integer(%a, %b)\n}",
            "shared 2-D B",
        ),
        (
            "graph @m(%a: u8[4, 3], %b: u8[3, 5]) -> (%y) {\n  %p: i32[4, 5] = matmul_integer(%a, %b)\n  %y: i32[4, 5] = binary{op = add}(%p, %p)\n}",
            "a cast to f32",
        ),
        (
            "graph @m(%a: u8[s, 3], %b: u8[3, 5], %z: u8[s]) -> (%y) {\n  %y: i32[s, 5] = matmul_integer(%a, %b, %z)\n}",
            "dim s is not static",
        ),
    ];
    for (text, want) in cases {
        let e = matmul_integer(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

/// Zero points the compiler folded into the body (small initializers): a scalar one of A
/// and a per-column i8 one of B, read from the module.
#[test]
fn folded_zero_points_match_the_reference() {
    let text = "graph @m(%a: u8[b, 5, 33], %b: i8[33, 9], %za: u8[], %zb: i8[9]) -> (%y) {\n  %y: i32[b, 5, 9] = matmul_integer(%a, %b, %za, %zb)\n}";
    let g = parse_graph(text).unwrap();
    let (za, zb) = (
        int(DType::U8, &[], 21, None),
        int(DType::I8, &[9], 22, None),
    );
    let g = common::fold_input(&common::fold_input(&g, 3, &zb), 2, &za);
    let kernel = matmul_integer(&g).unwrap();
    common::spirv_val(&kernel.spirv, "matmul_integer_folded");
    let Some(device) = common::device_or_skip("matmul integer folded") else {
        return;
    };
    let inputs = vec![
        int(DType::U8, &[2, 5, 33], 23, None),
        int(DType::I8, &[33, 9], 24, None),
    ];
    let module = kernel_module(&g, 0).unwrap();
    let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
    let got = common::run_module(&device, &module, &inputs, (DType::I32, &[2, 5, 9]));
    assert_eq!(got.to_le_bytes(), want.to_le_bytes());
}

/// The activations fusion leaves after a quantized product's bias (a pooler's tanh, an
/// FFN's GELU, an LSTM gate's relu or sigmoid): within 1e-5 of the reference, the
/// formulas being the float matmul epilogue's.
#[test]
fn activations_in_the_epilogue_match_the_reference() {
    let Some(device) = common::device_or_skip("matmul integer activations") else {
        return;
    };
    for act in [
        "unary{op = relu}",
        "unary{op = tanh}",
        "unary{op = sigmoid}",
        "gelu{approximate = none}",
        "gelu{approximate = tanh}",
    ] {
        let text = format!(
            "graph @m(%a: u8[7, 40], %b: i8[40, 12], %s: f32[], %bias: f32[12]) -> (%y) {{\n  %p: i32[7, 12] = matmul_integer(%a, %b)\n  %f: f32[7, 12] = cast{{to = f32}}(%p)\n  %g: f32[7, 12] = binary{{op = mul}}(%f, %s)\n  %h: f32[7, 12] = binary{{op = add}}(%g, %bias)\n  %y: f32[7, 12] = {act}(%h)\n}}"
        );
        let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        common::spirv_val(&matmul_integer(&g).unwrap().spirv, "matmul_integer_act");
        let inputs = vec![
            int(DType::U8, &[7, 40], 31, None),
            int(DType::I8, &[40, 12], 32, None),
            Tensor::f32s(&[], vec![0.0007]),
            Tensor::f32s(&[12], common::inputs_in((-3.0, 3.0), 12, 33)),
        ];
        let module = kernel_module(&g, 0).unwrap();
        let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
        let got = common::run_module(&device, &module, &inputs, (DType::F32, &[7, 12]));
        for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            assert!(
                common::close(*g as f32, w as f32, 1e-5, 1e-5),
                "{act}: element {i}: {g} vs {w}"
            );
        }
    }
}
