//! Embedding lookups (`gather` along axis 0 of a 2-D table by i64 indices) on the Vulkan
//! device (lavapipe in CI), against the reference executor: f32 and f16 tables, negative
//! indices, symbolic index dims; an index outside the table reads as NaN, never as memory
//! past the table.

mod common;

use half::f16;
use rafter_codegen_spirv::{gather, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// A `rows × cols` table of distinct values (exact in f16: multiples of 1/8 below 256).
fn table(dtype: DType, rows: usize, cols: usize) -> Tensor {
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| (i % 2000) as f32 / 8.0 - 100.0)
        .collect();
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, &[rows, cols], &bytes).unwrap()
        }
        _ => Tensor::f32s(&[rows, cols], values),
    }
}

fn ids(dims: &[usize], values: &[i64]) -> Tensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::from_le_bytes(DType::I64, dims, &bytes).unwrap()
}

#[test]
fn embedding_gathers_match_the_reference() {
    for dtype in ["f32", "f16"] {
        let text = format!(
            "graph @emb(%t: {dtype}[50, 24], %i: i64[b, s]) -> (%y) {{\n  %y: {dtype}[b, s, 24] = gather{{axis = 0}}(%t, %i)\n}}"
        );
        let body = parse_graph(&text).unwrap();
        let kernel = gather(&body).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        common::spirv_val(&kernel.spirv, &format!("gather_{dtype}"));
        let Some(device) = common::device_or_skip("embedding_gathers") else {
            return;
        };
        let module = kernel_module(&body, 0).unwrap();
        let dt = body.value(body.inputs[0]).ty.dtype;
        let index: Vec<i64> = vec![0, 49, -1, -50, 7, 7, 13, 25, 1, 2, 3, 48];
        let inputs = vec![table(dt, 50, 24), ids(&[2, 6], &index)];
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let got = common::run_module(&device, &module, &inputs, (dt, &[2, 6, 24]));
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{dtype}");
    }
}

#[test]
fn an_index_outside_the_table_reads_as_nan() {
    let body = parse_graph(
        "graph @emb(%t: f32[50, 24], %i: i64[n]) -> (%y) {\n  %y: f32[n, 24] = gather{axis = 0}(%t, %i)\n}",
    )
    .unwrap();
    let Some(device) = common::device_or_skip("gather out of range") else {
        return;
    };
    let module = kernel_module(&body, 0).unwrap();
    let inputs = vec![
        table(DType::F32, 50, 24),
        ids(&[4], &[3, 50, -51, i64::MIN]),
    ];
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &[4, 24])).to_f64_vec();
    let row3 = table(DType::F32, 50, 24).to_f64_vec()[3 * 24..4 * 24].to_vec();
    assert_eq!(got[..24], row3[..]);
    assert!(got[24..].iter().all(|v| v.is_nan()), "{:?}", &got[24..30]);
}

#[test]
fn gathers_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @g(%t: f32[5, 4], %i: i64[3]) -> (%y) {\n  %y: f32[5, 3] = gather{axis = 1}(%t, %i)\n}",
            "axis 1",
        ),
        (
            "graph @g(%t: i64[5, 4], %i: i64[3]) -> (%y) {\n  %y: i64[3, 4] = gather{axis = 0}(%t, %i)\n}",
            "the table is i64",
        ),
        (
            "graph @g(%t: f32[v, 4], %i: i64[3]) -> (%y) {\n  %y: f32[3, 4] = gather{axis = 0}(%t, %i)\n}",
            "table dim 0 is v",
        ),
    ];
    for (text, want) in cases {
        let e = gather(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
