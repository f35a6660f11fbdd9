//! `rotary_embedding` on the Vulkan device (lavapipe in CI), bit-exact against the
//! reference: halves and interleaved pairs, a partial rotary dim, with i64 and i32
//! position ids and without, a symbolic batch and sequence; a position id outside the
//! cache writes NaN.

use crate::common;

use rafter_codegen_spirv::{kernel_module, rotary};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

const HEADS: usize = 3;
const HEAD: usize = 8;
const POSITIONS: usize = 10;

fn ids(dtype: &str, values: &[i64]) -> Tensor {
    let bytes: Vec<u8> = if dtype == "i64" {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect()
    };
    let dt = if dtype == "i64" {
        DType::I64
    } else {
        DType::I32
    };
    Tensor::from_le_bytes(dt, &[2, 3], &bytes).unwrap()
}

/// Runs one rotation of x `[2, 3, 24]` and returns (got, want).
fn run(
    ids_dtype: Option<&str>,
    interleaved: bool,
    rot: usize,
    id_values: &[i64],
) -> Option<(Vec<f64>, Vec<f64>)> {
    let (cache_rows, extra, arg) = match ids_dtype {
        Some(d) => (POSITIONS, format!(", %p: {d}[b, s]"), ", %p"),
        None => (6, String::new(), ""),
    };
    let half = rot / 2;
    let text = format!(
        "graph @r(%x: f32[b, s, {hidden}], %c: f32[{cache_rows}, {half}], %n: f32[{cache_rows}, {half}]{extra}) -> (%y) {{\n  %y: f32[b, s, {hidden}] = rotary_embedding{{interleaved = {interleaved}, num_heads = {HEADS}, rotary_embedding_dim = {rot}}}(%x, %c, %n{arg})\n}}",
        hidden = HEADS * HEAD,
    );
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = rotary(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "rotary");
    let device = common::device_or_skip("rotary")?;
    let count = 2 * 3 * HEADS * HEAD;
    let mut inputs = vec![
        Tensor::f32s(
            &[2, 3, HEADS * HEAD],
            common::inputs_in((-3.0, 3.0), count, 1),
        ),
        Tensor::f32s(
            &[cache_rows, half],
            common::inputs_in((-1.0, 1.0), cache_rows * half, 2),
        ),
        Tensor::f32s(
            &[cache_rows, half],
            common::inputs_in((-1.0, 1.0), cache_rows * half, 3),
        ),
    ];
    if let Some(d) = ids_dtype {
        inputs.push(ids(d, id_values));
    }
    let module = kernel_module(&g, 0).unwrap();
    let got = common::run_module(
        &device,
        &module,
        &inputs,
        (DType::F32, &[2, 3, HEADS * HEAD]),
    );
    let want = rafter_reference::run(&g, inputs)
        .ok()
        .map(|mut w| w.remove(0).to_f64_vec());
    Some((got.to_f64_vec(), want.unwrap_or_default()))
}

#[test]
fn rotations_match_the_reference() {
    for ids_dtype in [Some("i64"), Some("i32"), None] {
        for interleaved in [false, true] {
            for rot in [HEAD, 4] {
                let Some((got, want)) = run(ids_dtype, interleaved, rot, &[0, 9, 3, 3, 7, 1])
                else {
                    return;
                };
                assert_eq!(
                    got, want,
                    "ids {ids_dtype:?}, interleaved {interleaved}, rot {rot}"
                );
            }
        }
    }
}

#[test]
fn a_position_outside_the_cache_writes_nan() {
    let Some((got, _)) = run(Some("i64"), false, HEAD, &[0, 10, -1, 3, 7, 1]) else {
        return;
    };
    let row = HEADS * HEAD;
    assert!(got[..row].iter().all(|v| !v.is_nan()));
    assert!(got[row..3 * row].iter().all(|v| v.is_nan()));
    assert!(got[3 * row..].iter().all(|v| !v.is_nan()));
}

/// A 4-D x `[batch, heads, seq, head_size]` (ONNX's other layout), with position ids
/// into a `[positions, rot / 2]` cache or without, reading a `[batch, seq, rot / 2]`
/// cache by (batch, seq): bit-exact with the reference.
#[test]
fn rotations_of_a_4d_x_match_the_reference() {
    let Some(device) = common::device_or_skip("rotary 4-D") else {
        return;
    };
    let (batch, seq) = (2usize, 3usize);
    for with_ids in [true, false] {
        for interleaved in [false, true] {
            for rot in [HEAD, 4] {
                let half = rot / 2;
                let (cache, extra, arg) = if with_ids {
                    (vec![POSITIONS, half], ", %p: i64[2, 3]", ", %p")
                } else {
                    (vec![batch, seq, half], "", "")
                };
                let c = cache
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let text = format!(
                    "graph @r(%x: f32[{batch}, {HEADS}, {seq}, {HEAD}], %c: f32[{c}], %n: f32[{c}]{extra}) -> (%y) {{\n  %y: f32[{batch}, {HEADS}, {seq}, {HEAD}] = rotary_embedding{{interleaved = {interleaved}, num_heads = 0, rotary_embedding_dim = {rot}}}(%x, %c, %n{arg})\n}}"
                );
                let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let kernel = rotary(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, "rotary_4d");
                let dims = [batch, HEADS, seq, HEAD];
                let count: usize = dims.iter().product();
                let rows: usize = cache.iter().product();
                let mut inputs = vec![
                    Tensor::f32s(&dims, common::inputs_in((-3.0, 3.0), count, 1)),
                    Tensor::f32s(&cache, common::inputs_in((-1.0, 1.0), rows, 2)),
                    Tensor::f32s(&cache, common::inputs_in((-1.0, 1.0), rows, 3)),
                ];
                if with_ids {
                    inputs.push(ids("i64", &[0, 9, 3, 3, 7, 1]));
                }
                let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
                let module = kernel_module(&g, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (DType::F32, &dims));
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
            }
        }
    }
}
