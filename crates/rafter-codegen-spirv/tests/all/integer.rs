//! Elementwise kernels on integers and bools: casts between floats and bool/i8/u8/i32/i64,
//! comparisons, logic and `where`, integer arithmetic in every integer type (the
//! `integer` module's i64 kernels), QuantizeLinear and DequantizeLinear, checked with spirv-val and run on the Vulkan device
//! (lavapipe in CI) against the reference executor, element for element (every one is
//! exact: no tolerance). Inputs hold the edges of each conversion: NaN, values past the
//! target's range, halves, negative values, integers f32 does not hold.

use crate::common;

use rafter_codegen_spirv::kernel_module;
use rafter_hal_vulkan::spirv_capabilities;
use rafter_ir::text::parse_graph;
use rafter_ir::{DType, Graph};
use rafter_reference::Tensor;
use rafter_vulkan_section::VulkanModule;

/// SPIR-V's `StorageBuffer8BitAccess` capability.
const STORAGE_BUFFER_8BIT: u32 = 4448;

/// Edge values of a float-to-integer cast (12 of them).
const FLOAT_EDGES: [f32; 12] = [
    f32::NAN,
    1e10,
    -1e10,
    -2.7,
    2.7,
    300.0,
    -129.5,
    127.9,
    0.5,
    -0.5,
    3e9,
    -0.0,
];

/// A body and its inputs' values (as f64, converted to each input's dtype).
struct Case {
    label: &'static str,
    text: String,
    inputs: Vec<Vec<f64>>,
}

fn case(label: &'static str, text: &str, inputs: Vec<Vec<f64>>) -> Case {
    Case {
        label,
        text: text.into(),
        inputs,
    }
}

fn floats() -> Vec<f64> {
    FLOAT_EDGES.iter().map(|&v| f64::from(v)).collect()
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for to in ["bool", "i8", "u8", "i32", "i64"] {
        cases.push(Case {
            label: "cast_f32_to_int",
            text: format!(
                "graph @k(%x: f32[12]) -> (%y) {{\n  %y: {to}[12] = cast{{to = {to}}}(%x)\n}}"
            ),
            inputs: vec![floats()],
        });
    }
    let ints = |lo: f64, hi: f64| -> Vec<f64> {
        (0..12)
            .map(|i| lo + (hi - lo) * f64::from(i) / 11.0)
            .map(f64::round)
            .collect()
    };
    cases.push(case(
        "cast_i8_to_f32",
        "graph @k(%x: i8[12]) -> (%y) {\n  %y: f32[12] = cast{to = f32}(%x)\n}",
        vec![ints(-128.0, 127.0)],
    ));
    cases.push(case(
        "cast_u8_to_f16",
        "graph @k(%x: u8[12]) -> (%y) {\n  %y: f16[12] = cast{to = f16}(%x)\n}",
        vec![ints(0.0, 255.0)],
    ));
    // 2^24 + 1 and 2^40 + 1 round to the nearest f32, as the reference's cast does.
    cases.push(case(
        "cast_i32_to_f32",
        "graph @k(%x: i32[4]) -> (%y) {\n  %y: f32[4] = cast{to = f32}(%x)\n}",
        vec![vec![16_777_217.0, -2_147_483_648.0, 2_147_483_647.0, -7.0]],
    ));
    cases.push(case(
        "cast_i64_to_f32_scaled",
        "graph @k(%x: i64[4], %s: f32[]) -> (%y) {\n  %c: f32[4] = cast{to = f32}(%x)\n  %y: f32[4] = binary{op = mul}(%c, %s)\n}",
        vec![vec![1_099_511_627_777.0, -3.0, 0.0, 123_456_789.0], vec![0.5]],
    ));
    cases.push(case(
        "cast_bool_to_f32_mask",
        "graph @k(%m: bool[6], %x: f32[6]) -> (%y) {\n  %c: f32[6] = cast{to = f32}(%m)\n  %y: f32[6] = binary{op = mul}(%c, %x)\n}",
        vec![vec![1.0, 0.0, 1.0, 1.0, 0.0, 0.0], vec![1.5, -2.0, 3.0, -4.0, 5.0, 6.0]],
    ));
    // Comparisons against NaN are false; the result feeds a where.
    let x = vec![1.0, f64::NAN, -2.0, 3.0, 0.0, 5.0];
    let y = vec![2.0, 1.0, -2.0, f64::NAN, -0.0, 4.0];
    for op in ["equal", "less", "less_equal", "greater", "greater_equal"] {
        cases.push(Case {
            label: "compare",
            text: format!(
                "graph @k(%x: f32[6], %z: f32[6]) -> (%y) {{\n  %y: bool[6] = binary{{op = {op}}}(%x, %z)\n}}"
            ),
            inputs: vec![x.clone(), y.clone()],
        });
    }
    cases.push(case(
        "less_where_broadcast",
        "graph @k(%x: f32[2, 3], %t: f32[3]) -> (%y) {\n  const %z: f32[] = dense [-1.0]\n  %m: bool[2, 3] = binary{op = less}(%x, %t)\n  %y: f32[2, 3] = where(%m, %x, %z)\n}",
        vec![vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vec![2.0, 5.0, 3.5]],
    ));
    let a = vec![1.0, 1.0, 0.0, 0.0];
    let b = vec![1.0, 0.0, 1.0, 0.0];
    for op in ["and", "or", "xor"] {
        cases.push(Case {
            label: "logic",
            text: format!(
                "graph @k(%a: bool[4], %b: bool[4]) -> (%y) {{\n  %c: bool[4] = binary{{op = {op}}}(%a, %b)\n  %y: bool[4] = unary{{op = not}}(%c)\n}}"
            ),
            inputs: vec![a.clone(), b.clone()],
        });
    }
    cases.push(case(
        "is_nan",
        "graph @k(%x: f32[12]) -> (%y) {\n  %y: bool[12] = unary{op = is_nan}(%x)\n}",
        vec![floats()],
    ));
    cases.push(case(
        "where_u8",
        "graph @k(%c: bool[4], %a: u8[4], %b: u8[4]) -> (%y) {\n  %y: u8[4] = where(%c, %a, %b)\n}",
        vec![
            a.clone(),
            vec![0.0, 255.0, 7.0, 128.0],
            vec![9.0, 1.0, 200.0, 3.0],
        ],
    ));
    // A quantization written out in ops: round(x / s) + z, clipped to u8, cast.
    cases.push(case(
        "quantize_chain_u8",
        "graph @k(%x: f32[12]) -> (%y) {\n  const %s: f32[] = dense [0.5]\n  const %z: f32[] = dense [128.0]\n  const %lo: f32[] = dense [0.0]\n  const %hi: f32[] = dense [255.0]\n  %d: f32[12] = binary{op = div}(%x, %s)\n  %r: f32[12] = unary{op = round}(%d)\n  %a: f32[12] = binary{op = add}(%r, %z)\n  %c: f32[12] = clip(%a, %lo, %hi)\n  %y: u8[12] = cast{to = u8}(%c)\n}",
        vec![vec![-70.0, -64.25, -0.25, 0.25, 0.75, 1.25, 63.0, 63.75, 64.0, 100.0, -1.0, 2.0]],
    ));
    cases.extend(arithmetic_cases());
    cases.extend(quantize_cases());
    cases
}

/// Integer arithmetic in every integer type (computed in 64-bit registers and wrapped):
/// overflow, zero and -1 divisors, every sign combination (-7 by 3, 7 by -3, -8 by -3, and
/// -100 by 5, a mixed-sign exact division whose `mod` must stay 0), shifts by negative
/// amounts and past the width. The values are converted to each type by the reference (wrapping or saturating
/// the same way for the kernel's input and the reference's).
fn arithmetic_cases() -> Vec<Case> {
    let a = vec![
        -128.0, 127.0, -7.0, 7.0, 0.0, -1.0, -8.0, -3.0, 100.0, -100.0, 3.0, 200.0,
    ];
    let b = vec![
        -1.0, 2.0, 3.0, -3.0, 5.0, 0.0, -3.0, 2.0, 0.0, 5.0, -5.0, 100.0,
    ];
    let shift = vec![
        0.0, 1.0, 7.0, 8.0, 31.0, 32.0, 63.0, 64.0, -1.0, 3.0, 2.0, 100.0,
    ];
    let mut cases = Vec::new();
    for dt in ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"] {
        let unsigned = dt.starts_with('u');
        let abs = |v: &Vec<f64>| v.iter().map(|x: &f64| x.abs()).collect::<Vec<_>>();
        let (x, y) = if unsigned {
            (abs(&a), abs(&b))
        } else {
            (a.clone(), b.clone())
        };
        for op in [
            "add", "sub", "mul", "div", "mod", "fmod", "max", "min", "bit_and", "bit_or", "bit_xor",
        ] {
            cases.push(Case {
                label: "int_binary",
                text: format!(
                    "graph @k(%a: {dt}[12], %b: {dt}[12]) -> (%y) {{\n  %y: {dt}[12] = binary{{op = {op}}}(%a, %b)\n}}"
                ),
                inputs: vec![x.clone(), y.clone()],
            });
        }
        for op in ["shift_left", "shift_right"] {
            let s = if unsigned { abs(&shift) } else { shift.clone() };
            cases.push(Case {
                label: "int_shift",
                text: format!(
                    "graph @k(%a: {dt}[12], %b: {dt}[12]) -> (%y) {{\n  %y: {dt}[12] = binary{{op = {op}}}(%a, %b)\n}}"
                ),
                inputs: vec![x.clone(), s],
            });
        }
        for op in ["less", "greater_equal", "equal"] {
            cases.push(Case {
                label: "int_compare",
                text: format!(
                    "graph @k(%a: {dt}[12], %b: {dt}[12]) -> (%y) {{\n  %y: bool[12] = binary{{op = {op}}}(%a, %b)\n}}"
                ),
                inputs: vec![x.clone(), y.clone()],
            });
        }
        cases.push(Case {
            label: "int_unary",
            text: format!(
                "graph @k(%a: {dt}[12]) -> (%y) {{\n  %y: {dt}[12] = unary{{op = bitwise_not}}(%a)\n}}"
            ),
            inputs: vec![x.clone()],
        });
    }
    // Broadcast operands, a scalar constant, a cast that wraps and a where, fused.
    cases.push(case(
        "int_fused",
        "graph @k(%a: i64[2, 3], %b: i64[3]) -> (%y) {\n  const %k: i64[] = dense [3]\n  %m: i64[2, 3] = binary{op = mul}(%a, %b)\n  %s: i64[2, 3] = binary{op = shift_left}(%m, %k)\n  %c: i32[2, 3] = cast{to = i32}(%s)\n  %p: bool[2, 3] = binary{op = less}(%s, %b)\n  %z: i32[2, 3] = unary{op = bitwise_not}(%c)\n  %y: i32[2, 3] = where(%p, %c, %z)\n}",
        vec![
            vec![1e15, -4.0, 2_147_483_647.0, 0.0, -9.0, 5.0],
            vec![3.0, -7.0, 2.0],
        ],
    ));
    cases
}

/// QuantizeLinear and DequantizeLinear per tensor and per axis, to and from 8- and 16-bit
/// types, with ties (round half to even), saturation and NaN.
fn quantize_cases() -> Vec<Case> {
    let x = vec![
        -70.0,
        -64.25,
        -0.25,
        0.25,
        0.75,
        1.25,
        63.0,
        63.75,
        64.0,
        1e9,
        f64::NAN,
        2.5,
    ];
    let mut cases = Vec::new();
    for (dt, zp) in [("u8", 128.0), ("i8", -3.0), ("i16", 1000.0), ("u16", 7.0)] {
        cases.push(Case {
            label: "quantize",
            text: format!(
                "graph @k(%x: f32[12], %s: f32[], %z: {dt}[]) -> (%y) {{\n  %y: {dt}[12] = quantize_linear{{axis = 1, block_size = 0, output_dtype = {dt}}}(%x, %s, %z)\n}}"
            ),
            inputs: vec![x.clone(), vec![0.5], vec![zp]],
        });
        cases.push(Case {
            label: "dequantize",
            text: format!(
                "graph @k(%x: {dt}[12], %s: f32[], %z: {dt}[]) -> (%y) {{\n  %y: f32[12] = dequantize_linear{{axis = 1, block_size = 0}}(%x, %s, %z)\n}}"
            ),
            inputs: vec![
                vec![0.0, 1.0, 2.0, 3.0, 100.0, 127.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0],
                vec![0.37],
                vec![zp],
            ],
        });
    }
    cases.push(case(
        "quantize_axis",
        "graph @k(%x: f32[2, 3, 2], %s: f32[3], %z: i8[3]) -> (%y) {\n  %y: i8[2, 3, 2] = quantize_linear{axis = 1, block_size = 0, output_dtype = i8}(%x, %s, %z)\n}",
        vec![x.clone(), vec![0.5, 2.0, 0.1], vec![0.0, -5.0, 100.0]],
    ));
    cases.push(case(
        "dequantize_axis_f16",
        "graph @k(%x: u8[2, 3, 2], %s: f16[3], %z: u8[3]) -> (%y) {\n  %y: f16[2, 3, 2] = dequantize_linear{axis = 1, block_size = 0}(%x, %s, %z)\n}",
        vec![
            vec![0.0, 1.0, 2.0, 3.0, 100.0, 255.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0],
            vec![0.37, 3.0, 0.001],
            vec![0.0, 128.0, 255.0],
        ],
    ));
    cases.push(case(
        "quantize_f16",
        "graph @k(%x: f16[12], %s: f16[]) -> (%y) {\n  %y: u8[12] = quantize_linear{axis = 1, block_size = 0, output_dtype = u8}(%x, %s)\n}",
        vec![x.clone(), vec![0.3]],
    ));
    cases
}

fn dims_of(body: &Graph, v: rafter_ir::ValueId) -> Vec<usize> {
    body.value(v)
        .ty
        .dims
        .iter()
        .map(|d| d.as_known().expect("static dims") as usize)
        .collect()
}

/// `values` as a tensor of `dtype` (through the reference's own conversion).
fn tensor(dtype: DType, dims: &[usize], values: &[f64]) -> Tensor {
    rafter_reference::ops::elementwise::from_f64s(dtype, dims, values.to_vec())
}

fn words(module: &VulkanModule) -> Vec<u32> {
    module
        .spirv
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The body with a name saying which dtypes it converts (for messages).
fn name(c: &Case, body: &Graph) -> String {
    let out = body.value(body.outputs[0]).ty.dtype;
    format!("{}_{out}", c.label)
}

#[test]
fn every_integer_kernel_passes_spirv_val_and_declares_8_bit_storage_only_when_used() {
    for c in cases() {
        let body = parse_graph(&c.text).unwrap_or_else(|e| panic!("{}: {e}", c.label));
        let label = name(&c, &body);
        let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{label}: {e}"));
        let spirv = words(&module);
        common::spirv_val(&spirv, &format!("int_{label}"));
        let bytes = body
            .inputs
            .iter()
            .chain(&body.outputs)
            .any(|&v| body.value(v).ty.dtype.size_of() == 1);
        let caps = spirv_capabilities(&spirv).unwrap();
        assert_eq!(
            caps.contains(&STORAGE_BUFFER_8BIT),
            bytes,
            "{label}: {caps:?}"
        );
    }
}

/// Opcodes of the instructions in a SPIR-V module (after the 5-word header).
fn opcodes(words: &[u32]) -> Vec<u32> {
    let mut ops = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let (count, op) = (words[at] >> 16, words[at] & 0xffff);
        ops.push(op);
        at += count.max(1) as usize;
    }
    ops
}

/// No integer kernel uses SPIR-V's signed division instructions: NVIDIA's driver computed the
/// 64-bit `OpSRem` of a negative divisor as if it were unsigned (7 rem -3 = 7), so division
/// and remainders go through unsigned magnitudes with the signs applied after.
#[test]
fn integer_division_emits_no_signed_division_instruction() {
    const SIGNED_DIVISION: [(u32, &str); 3] = [(135, "OpSDiv"), (138, "OpSRem"), (139, "OpSMod")];
    let mut divisions = 0;
    for c in cases() {
        let body = parse_graph(&c.text).unwrap();
        let label = name(&c, &body);
        let ops = opcodes(&words(&kernel_module(&body, 0).unwrap()));
        for (op, what) in SIGNED_DIVISION {
            assert!(!ops.contains(&op), "{label} ({}): emits {what}", c.text);
        }
        divisions += usize::from(ops.contains(&134) || ops.contains(&137)); // OpUDiv, OpUMod
    }
    assert!(
        divisions >= 24,
        "only {divisions} kernels divide: the check saw too little"
    );
}

#[test]
fn integer_kernels_match_the_reference_exactly() {
    let Some(device) = common::device_or_skip("integer_kernels_match_the_reference_exactly") else {
        return;
    };
    assert!(
        device.capabilities().storage_buffer_8bit,
        "{} lacks storageBuffer8BitAccess: 8-bit kernels cannot run on it",
        device.capabilities().device_name
    );
    for c in cases() {
        let body = parse_graph(&c.text).unwrap();
        let label = name(&c, &body);
        let module = kernel_module(&body, 0).unwrap();
        let inputs: Vec<Tensor> = body
            .inputs
            .iter()
            .zip(&c.inputs)
            .map(|(&v, values)| tensor(body.value(v).ty.dtype, &dims_of(&body, v), values))
            .collect();
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap_or_else(|e| panic!("{label}: reference: {e}"))
            .remove(0);
        let out = body.outputs[0];
        let got = common::run_module(
            &device,
            &module,
            &inputs,
            (body.value(out).ty.dtype, &dims_of(&body, out)),
        );
        assert_eq!(got.dtype(), want.dtype(), "{label}");
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        for (i, (g, w)) in g.iter().zip(&w).enumerate() {
            let same = g == w || (g.is_nan() && w.is_nan());
            assert!(
                same,
                "{label}: [{i}] got {g} want {w} (inputs {:?})",
                c.inputs
            );
        }
    }
}

#[test]
fn integer_bodies_mixing_floats_and_blocked_quantization_stay_off_with_a_reason() {
    let refused = [
        // Integer arithmetic whose result is then used as a float: neither kernel kind.
        (
            "graph @k(%a: u8[4], %b: u8[4]) -> (%y) {\n  %c: u8[4] = binary{op = add}(%a, %b)\n  %y: f32[4] = cast{to = f32}(%c)\n}",
            "an integer kernel takes no float value",
        ),
        (
            "graph @k(%a: i32[4], %b: i32[4]) -> (%y) {\n  %y: i32[4] = binary{op = pow}(%a, %b)\n}",
            "is not generated for integers yet",
        ),
        (
            "graph @k(%x: f32[4, 4], %s: f32[2, 4]) -> (%y) {\n  %y: u8[4, 4] = quantize_linear{axis = 0, block_size = 2, output_dtype = u8}(%x, %s)\n}",
            "blocked quantization",
        ),
        (
            "graph @k(%x: i32[4], %s: f32[]) -> (%y) {\n  %y: f32[4] = dequantize_linear{axis = 0, block_size = 0}(%x, %s)\n}",
            "wide integers",
        ),
    ];
    for (text, expected) in refused {
        let body = parse_graph(text).unwrap();
        let e = kernel_module(&body, 0).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    }
}
