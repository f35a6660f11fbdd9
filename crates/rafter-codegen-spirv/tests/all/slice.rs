//! The generated `slice` kernel matches the reference executor on the Vulkan device
//! (lavapipe in CI): a fused QKV split, negative starts and ends, a reversal (negative
//! step), several axes with steps, clamped out-of-range bounds, f16 data; and slices it
//! cannot generate are errors naming why.

use crate::common;

use rafter_codegen_spirv::{kernel_module, slice};
use rafter_ir::text::parse_graph;
use rafter_reference::Bindings;

/// A body slicing `%x` of `dtype[x_dims]` to `[y_dims]` with the given constant operands
/// (`None`: the operand is absent).
fn body(
    dtype: &str,
    x_dims: &str,
    y_dims: &str,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> rafter_ir::Graph {
    let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let n = starts.len();
    let mut consts = format!(
        "  const %s: i64[{n}] = dense [{}]\n  const %e: i64[{n}] = dense [{}]\n",
        list(starts),
        list(ends)
    );
    let mut operands = "%x, %s, %e".to_string();
    if let Some(a) = axes {
        consts += &format!("  const %a: i64[{n}] = dense [{}]\n", list(a));
        operands += ", %a";
    }
    if let Some(st) = steps {
        assert!(axes.is_some(), "steps come after axes");
        consts += &format!("  const %t: i64[{n}] = dense [{}]\n", list(st));
        operands += ", %t";
    }
    parse_graph(&format!(
        "graph @slice(%x: {dtype}[{x_dims}]) -> (%y) {{\n{consts}  %y: {dtype}[{y_dims}] = slice({operands})\n}}"
    ))
    .unwrap()
}

fn dims(g: &rafter_ir::Graph, v: rafter_ir::ValueId) -> Vec<usize> {
    g.value(v)
        .ty
        .dims
        .iter()
        .map(|d| d.as_known().unwrap() as usize)
        .collect()
}

/// Generates, validates and (with a device) runs `g`, checking every element against the
/// reference executor (a copy: equal bits, NaN never expected).
fn check(g: &rafter_ir::Graph, label: &str) {
    let module = kernel_module(g, 0).unwrap_or_else(|e| panic!("{label}: {e}"));
    let words: Vec<u32> = module
        .spirv
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    common::spirv_val(&words, label);
    let Some(device) = common::device_or_skip(label) else {
        return;
    };
    let x_dims = dims(g, g.inputs[0]);
    let n: usize = x_dims.iter().product();
    let dtype = g.value(g.inputs[0]).ty.dtype;
    // Distinct values (the index), so a wrong element shows.
    let x = rafter_reference::ops::elementwise::from_f64s(
        dtype,
        &x_dims,
        (0..n).map(|i| i as f64 * 0.25 - 7.0).collect(),
    );
    let want = rafter_reference::run_with(g, vec![x.clone()], &mut Bindings::default())
        .unwrap()
        .remove(0);
    let out = g.outputs[0];
    let got = common::run_module(&device, &module, &[x], (dtype, &dims(g, out)));
    assert_eq!(got.shape(), want.shape(), "{label}");
    assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{label}");
}

#[test]
fn slices_match_the_reference() {
    // BERT's fused QKV [2, 11, 192] split into its K third.
    check(
        &body(
            "f32",
            "2, 11, 192",
            "2, 11, 64",
            &[64],
            &[128],
            Some(&[2]),
            None,
        ),
        "qkv_split",
    );
    // Negative start and end (from the end), on axis -1.
    check(
        &body("f32", "3, 10", "3, 4", &[-6], &[-2], Some(&[-1]), None),
        "negative_bounds",
    );
    // A reversal: start past the end clamps to the last, end INT64_MIN to before the first.
    check(
        &body(
            "f32",
            "4, 7",
            "4, 7",
            &[100],
            &[i64::MIN],
            Some(&[1]),
            Some(&[-1]),
        ),
        "reversal",
    );
    // Two axes with steps 2 and -3, axes given out of order.
    check(
        &body(
            "f32",
            "5, 6, 9",
            "3, 6, 3",
            &[8, 0],
            &[0, 5],
            Some(&[2, 0]),
            Some(&[-3, 2]),
        ),
        "two_axes_steps",
    );
    // No axes (the first ones), ends past the dim clamp.
    check(
        &body("f32", "4, 3", "2, 3", &[2], &[1000], None, None),
        "default_axes",
    );
    // f16 data is copied as f16.
    check(
        &body("f16", "2, 8", "2, 3", &[1], &[7], Some(&[1]), Some(&[2])),
        "f16",
    );
}

#[test]
fn slices_it_cannot_generate_are_errors() {
    // A result type that disagrees with the positions visited.
    let g = body("f32", "4, 6", "4, 3", &[0], &[2], Some(&[1]), None);
    let e = slice(&g).unwrap_err();
    assert!(e.contains("visits 2 positions"), "{e}");
    // Step 0.
    let g = body("f32", "4, 6", "4, 6", &[0], &[6], Some(&[1]), Some(&[0]));
    let e = slice(&g).unwrap_err();
    assert!(e.contains("step 0"), "{e}");
    // Symbolic dims inside the first sliced axis (leading ones are fine).
    let g = parse_graph(
        "graph @s(%x: f32[6, n]) -> (%y) {
  const %s: i64[1] = dense [1]
  const %e: i64[1] = dense [3]
  const %a: i64[1] = dense [0]
  %y: f32[2, n] = slice(%x, %s, %e, %a)
}",
    )
    .unwrap();
    let e = slice(&g).unwrap_err();
    assert!(e.contains("not static"), "{e}");
    // Run-time starts.
    let g = parse_graph(
        "graph @s(%x: f32[4, 6], %s: i64[1]) -> (%y) {
  const %e: i64[1] = dense [3]
  const %a: i64[1] = dense [1]
  %y: f32[4, 2] = slice(%x, %s, %e, %a)
}",
    )
    .unwrap();
    let e = slice(&g).unwrap_err();
    assert!(e.contains("not a constant"), "{e}");
}
