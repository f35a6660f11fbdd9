//! `concat` on the Vulkan device (lavapipe in CI), against the reference executor: every
//! axis of 1- to 3-D tensors, two to four operands of different lengths along the axis
//! (one of them empty, one repeated), f32 and f16, a symbolic outer dim.

use crate::common;

use rafter_codegen_spirv::{concat, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn show(d: &[usize]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Distinct values (exact in f16: multiples of 1/4 below 256), `seed` apart per operand.
fn tensor(dtype: DType, dims: &[usize], seed: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i + seed * 97) % 900) as f32 / 4.0)
        .collect();
    if dtype == DType::F16 {
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
    } else {
        Tensor::f32s(dims, v)
    }
}

#[test]
fn concats_match_the_reference() {
    let Some(device) = common::device_or_skip("concat") else {
        return;
    };
    let base = [2usize, 3, 4];
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        for rank in 1..=3 {
            for axis in -(rank as i64)..rank as i64 {
                let a = axis.rem_euclid(rank as i64) as usize;
                let lens = [2usize, 0, 3, 1];
                let shapes: Vec<Vec<usize>> = lens
                    .iter()
                    .map(|&l| {
                        let mut d = base[..rank].to_vec();
                        d[a] = l;
                        d
                    })
                    .collect();
                let mut out = base[..rank].to_vec();
                out[a] = lens.iter().sum();
                let params: Vec<String> = shapes
                    .iter()
                    .enumerate()
                    .map(|(k, d)| format!("%x{k}: {dt}[{}]", show(d)))
                    .collect();
                let text = format!(
                    "graph @c({}) -> (%y) {{\n  %y: {dt}[{}] = concat{{axis = {axis}}}(%x0, %x1, %x2, %x3)\n}}",
                    params.join(", "),
                    show(&out)
                );
                let body = parse_graph(&text).unwrap();
                let kernel = concat(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, &format!("concat_{rank}_{a}_{dt}"));
                let inputs: Vec<Tensor> = shapes
                    .iter()
                    .enumerate()
                    .map(|(k, d)| tensor(dtype, d, k))
                    .collect();
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (dtype, &out));
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
            }
        }
    }
}

/// A repeated operand and a symbolic outer dim (a batch), run at two sizes of it.
#[test]
fn a_concat_with_a_repeated_operand_and_a_symbolic_batch_matches_the_reference() {
    let body = parse_graph(
        "graph @c(%x: f32[b, 3, 2], %z: f32[b, 1, 2]) -> (%y) {\n  %y: f32[b, 7, 2] = concat{axis = 1}(%x, %z, %x)\n}",
    )
    .unwrap();
    let kernel = concat(&body).unwrap();
    common::spirv_val(&kernel.spirv, "concat_batch");
    let Some(device) = common::device_or_skip("concat batch") else {
        return;
    };
    let module = kernel_module(&body, 0).unwrap();
    for b in [1usize, 5] {
        let inputs = vec![
            tensor(DType::F32, &[b, 3, 2], 1),
            tensor(DType::F32, &[b, 1, 2], 2),
        ];
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let got = common::run_module(&device, &module, &inputs, (DType::F32, &[b, 7, 2]));
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "b = {b}");
    }
}

#[test]
fn concats_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @c(%x: f32[2, n], %z: f32[2, 3]) -> (%y) {\n  %y: f32[4, 3] = concat{axis = 0}(%x, %z)\n}",
            "dim n is not static",
        ),
        (
            "graph @c(%x: f32[2], %z: f16[3]) -> (%y) {\n  %y: f32[5] = concat{axis = 0}(%x, %z)\n}",
            "concat operand 1 is f16[3]",
        ),
    ];
    for (text, want) in cases {
        let e = concat(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
