//! Every generated module passes spirv-val; unsupported bodies are errors, not bad modules.

use crate::common;

use rafter_codegen_spirv::{elementwise, Operand};
use rafter_ir::text::parse_graph;

#[test]
fn every_supported_op_passes_spirv_val() {
    for case in common::op_cases() {
        let body = parse_graph(&case.text).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let kernel = elementwise(&body).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        common::spirv_val(&kernel.spirv, &case.label);
    }
}

#[test]
fn single_element_inputs_are_broadcast_scalars() {
    let body = parse_graph(
        "graph @k(%x: f32[n, 4], %s: f32[], %t: f32[1, 1]) -> (%y) {\n  %a: f32[n, 4] = binary{op = add}(%x, %s)\n  %y: f32[n, 4] = binary{op = mul}(%a, %t)\n}",
    )
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    assert_eq!(
        kernel.inputs,
        [Operand::Tensor, Operand::Scalar, Operand::Scalar]
    );
    assert_eq!(kernel.outputs, 1);
}

#[test]
fn unsupported_bodies_are_errors_naming_the_cause() {
    let cases = [
        // Integer bodies: what stays refused is tested in tests/integer.rs.
        (
            "graph @k(%x: f32[n, 4], %b: f32[m, 4]) -> (%y) {\n  %y: f32[n, 4] = binary{op = add}(%x, %b)\n}",
            "does not broadcast",
        ),
        (
            "graph @k(%x: f32[4, 3], %b: f32[4]) -> (%y) {\n  %y: f32[4, 3] = binary{op = add}(%x, %b)\n}",
            "does not broadcast",
        ),
        (
            "graph @k(%x: f32[n, 3]) -> (%y) {\n  %y: f32[3] = reduce{kind = sum, axes = [0], keep_dims = false, noop_with_empty_axes = false}(%x)\n}",
            "symbolic dims",
        ),
        (
            "graph @k(%x: f32[2]) -> (%y) {\n  const %c: i32[2] = dense [16777217, 2]\n  %f: f32[2] = cast{to = f32}(%c)\n  %y: f32[2] = binary{op = add}(%x, %f)\n}",
            "single-element constants",
        ),
    ];
    for (text, expected) in cases {
        let body = parse_graph(text).unwrap();
        let error = elementwise(&body).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn smaller_static_inputs_are_broadcast_by_strides() {
    let body = parse_graph(
        "graph @k(%x: f32[4, 3, 8], %b: f32[8], %c: f32[4, 1, 1], %d: f32[3, 1]) -> (%y) {\n  %a: f32[4, 3, 8] = binary{op = add}(%x, %b)\n  %e: f32[4, 3, 1] = binary{op = mul}(%c, %d)\n  %y: f32[4, 3, 8] = binary{op = sub}(%a, %e)\n}",
    )
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    assert_eq!(
        kernel.inputs,
        [
            Operand::Tensor,
            Operand::Broadcast,
            Operand::Broadcast,
            Operand::Broadcast
        ]
    );
    common::spirv_val(&kernel.spirv, "broadcast_strides");
}

/// The same sweep on f16 buffers (f32 arithmetic): every op's module passes spirv-val with
/// 16-bit storage.
#[test]
fn every_supported_op_on_f16_passes_spirv_val() {
    for case in common::op_cases() {
        let text = case.text.replace("f32", "f16");
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let kernel = elementwise(&body).unwrap_or_else(|e| panic!("{} f16: {e}", case.label));
        common::spirv_val(&kernel.spirv, &format!("{}_f16", case.label));
    }
}
