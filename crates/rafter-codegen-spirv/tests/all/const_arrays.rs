//! Constants of several elements folded into pointwise kernels (a BERT export's folded
//! mask row: `and` of an 11-element bool constant, then `where`), on the Vulkan device
//! against the reference executor, bit-exact; and the refusals that remain.

use crate::common;

use rafter_codegen_spirv::{elementwise, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_reference::Tensor;

#[test]
fn broadcast_constant_arrays_match_the_reference() {
    let Some(device) = common::device_or_skip("const_arrays") else {
        return;
    };
    let mask = "graph @mask(%m: bool[b, 11], %x: f32[b, 11]) -> (%y) {
  const %keep: bool[11] = dense [1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1]
  const %low: f32[] = dense [-10000.0]
  %a: bool[b, 11] = binary{op = and}(%m, %keep)
  %y: f32[b, 11] = where(%a, %x, %low)
}";
    let scale = "graph @scale(%x: f32[2, 3, 4]) -> (%y) {
  const %s: f32[3, 1] = dense [0.5, -2.0, 3.25]
  const %t: f32[4] = dense [1.0, 2.0, 3.0, 4.0]
  %p: f32[2, 3, 4] = binary{op = mul}(%x, %s)
  %y: f32[2, 3, 4] = binary{op = add}(%p, %t)
}";
    for text in [mask, scale] {
        let body = parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{text}: {e}"));
        for b in [1usize, 3] {
            let inputs: Vec<Tensor> = body
                .inputs
                .iter()
                .enumerate()
                .map(|(k, &v)| {
                    let ty = &body.value(v).ty;
                    let dims: Vec<usize> = ty
                        .dims
                        .iter()
                        .map(|d| d.as_known().map_or(b, |n| n as usize))
                        .collect();
                    let n = dims.iter().product();
                    let values = common::inputs_in((-2.0, 2.0), n, k as u64 + 7);
                    common::floats(ty.dtype, &dims, &values)
                })
                .collect();
            let want = rafter_reference::run(&body, inputs.clone())
                .unwrap()
                .remove(0);
            let got = common::run_module(&device, &module, &inputs, (want.dtype(), want.shape()));
            assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text} at b = {b}");
        }
    }
}

#[test]
fn constants_that_cannot_be_arrays_are_refused_with_a_reason() {
    // An i64 constant beyond f32's exact integers, and integer kernels.
    let cases = [
        (
            "graph @g(%x: i64[3]) -> (%y) {\n  const %c: i64[3] = dense [16777217, 1, 2]\n  %f: f32[3] = cast{to = f32}(%c)\n  %y: f32[3] = cast{to = f32}(%x)\n}",
            "has 3 elements",
        ),
        (
            "graph @g(%x: i64[3]) -> (%y) {\n  const %c: i64[3] = dense [1, 2, 3]\n  %y: i64[3] = binary{op = add}(%x, %c)\n}",
            "integer kernel",
        ),
    ];
    for (text, want) in cases {
        let body = parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let e = elementwise(&body)
            .err()
            .unwrap_or_else(|| panic!("accepted {text}"));
        assert!(e.reason.contains(want), "{}", e.reason);
    }
}
