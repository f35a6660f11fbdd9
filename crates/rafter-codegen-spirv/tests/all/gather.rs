//! `gather` on the Vulkan device (lavapipe in CI), against the reference executor:
//! embedding lookups (axis 0 of a 2-D table) on f32 and f16 tables, every axis of a 3-D
//! tensor by i32 and i64 indices of several shapes (scalar, symbolic, 2-D), negative
//! indices; integer and bool tables (a quantized model's u8 embeddings, its masks) bit for
//! bit; an index outside the axis reads as NaN, never as memory past the data.

use crate::common;

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
fn integer_and_bool_gathers_match_the_reference() {
    let Some(device) = common::device_or_skip("integer_gathers") else {
        return;
    };
    for (dt, dtype) in [
        ("u8", DType::U8),
        ("i8", DType::I8),
        ("bool", DType::Bool),
        ("i32", DType::I32),
        ("i64", DType::I64),
    ] {
        for axis in [0, 1] {
            let (rows, cols) = (13usize, 7usize);
            let out = if axis == 0 { [5, cols] } else { [rows, 5] };
            let text = format!(
                "graph @g(%t: {dt}[{rows}, {cols}], %i: i64[5]) -> (%y) {{\n  %y: {dt}[{}, {}] = gather{{axis = {axis}}}(%t, %i)\n}}",
                out[0], out[1]
            );
            let body = parse_graph(&text).unwrap();
            let kernel = gather(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
            common::spirv_val(&kernel.spirv, &format!("gather_{dt}_{axis}"));
            // Distinct bytes per element, with the sign bit set in some (a sign-extension
            // or truncation fault shows); bools are 0 or 1.
            let n = rows * cols;
            let bytes: Vec<u8> = (0..n)
                .flat_map(|k| {
                    let v = (k * 37 + 200) as u64;
                    let v = if dtype == DType::Bool { v & 1 } else { v % 256 };
                    let w = if matches!(dtype, DType::I32 | DType::I64) {
                        (v as i64 - 128) * 1_000_003
                    } else {
                        v as i64
                    };
                    w.to_le_bytes()[..dtype.size_of()].to_vec()
                })
                .collect();
            let t = Tensor::from_le_bytes(dtype, &[rows, cols], &bytes).unwrap();
            let inputs = vec![t, ids(&[5], &[0, -1, 3, 3, 4])];
            let want = rafter_reference::run(&body, inputs.clone())
                .unwrap()
                .remove(0);
            let module = kernel_module(&body, 0).unwrap();
            let got = common::run_module(&device, &module, &inputs, (dtype, &out));
            assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
        }
    }
}

#[test]
fn gathers_by_folded_constant_indices_match_the_reference() {
    // The compiler folds constants of at most 64 bytes into the body: a BERT pooler's
    // `[:, 0]` gather, or a few picked rows.
    let Some(device) = common::device_or_skip("folded_gathers") else {
        return;
    };
    for (ids, n) in [
        ("i64[] = dense [0]", 0),
        ("i64[5] = dense [3, -1, 0, 2, 3]", 5),
        ("i32[3] = dense [1, -2, 4]", 3),
    ] {
        let out = if n == 0 {
            "2, 24".to_string()
        } else {
            format!("2, {n}, 24")
        };
        let text = format!(
            "graph @g(%t: f32[2, 6, 24]) -> (%y) {{\n  const %i: {ids}\n  %y: f32[{out}] = gather{{axis = 1}}(%t, %i)\n}}"
        );
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let kernel = gather(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
        common::spirv_val(&kernel.spirv, "gather_folded");
        let values: Vec<f32> = (0..2 * 6 * 24).map(|i| i as f32 - 100.0).collect();
        let inputs = vec![Tensor::f32s(&[2, 6, 24], values)];
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let dims: Vec<usize> = out.split(", ").map(|d| d.parse().unwrap()).collect();
        let module = kernel_module(&body, 0).unwrap();
        let got = common::run_module(&device, &module, &inputs, (DType::F32, &dims));
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
    }
}

#[test]
fn gathers_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @g(%t: f32[5, 4], %i: i64[3]) -> (%y) {\n  %y: f32[5, 3] = gather{axis = 2}(%t, %i)\n}",
            "axis 2 outside rank 2",
        ),
        (
            "graph @g(%t: f64[5, 4], %i: i64[3]) -> (%y) {\n  %y: f64[3, 4] = gather{axis = 0}(%t, %i)\n}",
            "the gathered data is f64",
        ),
        (
            "graph @g(%t: f32[5, 4], %i: i16[3]) -> (%y) {\n  %y: f32[3, 4] = gather{axis = 0}(%t, %i)\n}",
            "indices are i16",
        ),
        (
            "graph @g(%t: f32[5, v], %i: i64[3]) -> (%y) {\n  %y: f32[3, v] = gather{axis = 0}(%t, %i)\n}",
            "dim v is not static",
        ),
    ];
    for (text, want) in cases {
        let e = gather(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

fn ids32(dims: &[usize], values: &[i32]) -> Tensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::from_le_bytes(DType::I32, dims, &bytes).unwrap()
}

/// Every axis (positive and negative) of a `[3, 5, 4]` tensor, by i32 and i64 indices of
/// shapes `[]`, `[4]` and `[2, 3]` holding negative ones: bit-exact with the reference.
#[test]
fn gathers_along_every_axis_by_i32_and_i64_indices_match_the_reference() {
    let dims = [3usize, 5, 4];
    let data: Vec<f32> = (0..60).map(|i| i as f32 * 0.5 - 7.0).collect();
    let data = Tensor::f32s(&dims, data);
    let Some(device) = common::device_or_skip("gather any axis") else {
        return;
    };
    for axis in -3i64..3 {
        let a = axis.rem_euclid(3) as usize;
        let n = dims[a] as i64;
        for id_dims in [vec![], vec![4usize], vec![2, 3]] {
            let count: usize = id_dims.iter().product();
            let values: Vec<i64> = (0..count as i64).map(|k| (k * 2) % (2 * n) - n).collect();
            for idt in ["i64", "i32"] {
                let mut out: Vec<usize> = dims[..a].to_vec();
                out.extend(&id_dims);
                out.extend(&dims[a + 1..]);
                let show = |d: &[usize]| {
                    d.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let text = format!(
                    "graph @g(%t: f32[3, 5, 4], %i: {idt}[{}]) -> (%y) {{\n  %y: f32[{}] = gather{{axis = {axis}}}(%t, %i)\n}}",
                    show(&id_dims),
                    show(&out)
                );
                let body = parse_graph(&text).unwrap();
                let kernel = gather(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, &format!("gather_axis{a}_{idt}"));
                let index = if idt == "i64" {
                    ids(&id_dims, &values)
                } else {
                    ids32(
                        &id_dims,
                        &values.iter().map(|&v| v as i32).collect::<Vec<_>>(),
                    )
                };
                let inputs = vec![data.clone(), index];
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (DType::F32, &out));
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
            }
        }
    }
}

/// An i32 index outside the axis (past either end after wrapping) reads as NaN on an inner
/// axis too.
#[test]
fn an_i32_index_outside_an_inner_axis_reads_as_nan() {
    let body = parse_graph(
        "graph @g(%t: f32[2, 5], %i: i32[3]) -> (%y) {\n  %y: f32[2, 3] = gather{axis = 1}(%t, %i)\n}",
    )
    .unwrap();
    let Some(device) = common::device_or_skip("gather i32 out of range") else {
        return;
    };
    let module = kernel_module(&body, 0).unwrap();
    let data = Tensor::f32s(&[2, 5], (0..10).map(|i| i as f32).collect());
    let inputs = vec![data, ids32(&[3], &[-1, 5, i32::MIN])];
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &[2, 3])).to_f64_vec();
    assert_eq!((got[0], got[3]), (4.0, 9.0));
    for k in [1, 2, 4, 5] {
        assert!(got[k].is_nan(), "{got:?}");
    }
}
