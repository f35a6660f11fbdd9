//! Kernels over symbolic dims on the Vulkan device (lavapipe in CI), against the reference
//! executor, bit-exact: what an LLM export's attention bookkeeping holds once its batch and
//! sequence are symbolic (ORT GenAI's builder): `shape` of a symbolic tensor, `range` from
//! bound and folded scalars, a `concat` along a symbolic axis (a KV cache's `past + 1`
//! rows) of integers and bytes, a `slice` under symbolic leading axes, `gather` and
//! `gather_nd` over a symbolic batch and axis. Each body is generated once and run at
//! several sizes, the symbols' values reaching the kernel as dim params.

use crate::common;

use rafter_codegen_spirv::kernel_module;
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// A tensor of `dtype` and `dims` whose bytes are a pattern (any bits: integers as they
/// come, floats kept finite by masking the high bits of each byte).
fn pattern(dtype: DType, dims: &[usize], seed: usize) -> Tensor {
    let n: usize = dims.iter().product::<usize>() * dtype.size_of();
    let bytes: Vec<u8> = (0..n)
        .map(|k| ((k * 131 + seed * 17) % 251) as u8 & 0x3F)
        .collect();
    Tensor::from_le_bytes(dtype, dims, &bytes).unwrap()
}

fn i64s(dims: &[usize], v: &[i64]) -> Tensor {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::from_le_bytes(DType::I64, dims, &b).unwrap()
}

/// Generates `text`'s body, runs it at `inputs` on the device and on the reference, and
/// checks the bits agree.
fn check(device: &rafter_hal_vulkan::VulkanDevice, body: &rafter_ir::Graph, inputs: Vec<Tensor>) {
    let want = rafter_reference::run(body, inputs.clone())
        .unwrap_or_else(|e| panic!("reference: {e}"))
        .remove(0);
    let module = kernel_module(body, 0).unwrap_or_else(|e| panic!("{e}"));
    let words: Vec<u32> = module
        .spirv
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    common::spirv_val(&words, &body.name);
    let got = common::run_module(device, &module, &inputs, (want.dtype(), want.shape()));
    assert_eq!(
        got.to_le_bytes(),
        want.to_le_bytes(),
        "{} at {:?}",
        body.name,
        inputs
            .iter()
            .map(|t| t.shape().to_vec())
            .collect::<Vec<_>>()
    );
}

fn graph(text: &str) -> rafter_ir::Graph {
    parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn shape_reads_symbolic_dims_per_call() {
    let Some(device) = common::device_or_skip("shape") else {
        return;
    };
    let all = graph(
        "graph @shape_all(%x: f32[b, 3, s]) -> (%y) {\n  %y: i64[3] = shape{start = 0}(%x)\n}",
    );
    let part = graph(
        "graph @shape_part(%x: f32[b, 3, s]) -> (%y) {\n  %y: i64[2] = shape{start = -2, end = 3}(%x)\n}",
    );
    for (b, s) in [(1, 1), (2, 5), (7, 3)] {
        let x = pattern(DType::F32, &[b, 3, s], 0);
        check(&device, &all, vec![x.clone()]);
        check(&device, &part, vec![x]);
    }
}

#[test]
fn range_counts_from_bound_and_folded_scalars() {
    let Some(device) = common::device_or_skip("range") else {
        return;
    };
    for (dtype, start, delta) in [
        (DType::I64, -3i64, 2i64),
        (DType::I32, 5, -1),
        (DType::F32, 1, 3),
    ] {
        let text = format!(
            "graph @range(%a: {dtype}[], %l: {dtype}[], %d: {dtype}[]) -> (%y) {{\n  %y: {dtype}[n] = range(%a, %l, %d)\n}}"
        );
        let body = graph(&text);
        let scalar = |v: i64| match dtype {
            DType::I64 => Tensor::from_le_bytes(dtype, &[], &v.to_le_bytes()).unwrap(),
            DType::I32 => Tensor::from_le_bytes(dtype, &[], &(v as i32).to_le_bytes()).unwrap(),
            _ => Tensor::from_le_bytes(dtype, &[], &(v as f32).to_le_bytes()).unwrap(),
        };
        for count in [1i64, 4, 9] {
            let limit = start + count * delta;
            let inputs = vec![scalar(start), scalar(limit), scalar(delta)];
            check(&device, &body, inputs.clone());
            // The compiler folds small constants into the body: start and delta folded.
            let folded =
                common::fold_input(&common::fold_input(&body, 2, &inputs[2]), 0, &inputs[0]);
            check(&device, &folded, vec![inputs[1].clone()]);
        }
    }
}

#[test]
fn concat_along_a_symbolic_axis_copies_any_type() {
    let Some(device) = common::device_or_skip("concat") else {
        return;
    };
    for dtype in [DType::I64, DType::U8, DType::F16, DType::F32] {
        let text = format!(
            "graph @concat_sym(%p: {dtype}[b, past, 3], %n: {dtype}[b, 1, 3]) -> (%y) {{\n  %y: {dtype}[b, past + 1, 3] = concat{{axis = 1}}(%p, %n)\n}}"
        );
        let body = graph(&text);
        for (b, past) in [(1, 0), (1, 4), (3, 2)] {
            let inputs = vec![
                pattern(dtype, &[b, past, 3], 1),
                pattern(dtype, &[b, 1, 3], 2),
            ];
            check(&device, &body, inputs);
        }
    }
}

#[test]
fn slice_under_symbolic_leading_axes() {
    let Some(device) = common::device_or_skip("slice") else {
        return;
    };
    for dtype in [DType::F32, DType::I64, DType::Bool] {
        let text = format!(
            "graph @slice_sym(%x: {dtype}[b, s, 10], %st: i64[1], %en: i64[1], %ax: i64[1]) -> (%y) {{\n  %y: {dtype}[b, s, 4] = slice(%x, %st, %en, %ax)\n}}"
        );
        let body = graph(&text);
        let (st, en, ax) = (i64s(&[1], &[6]), i64s(&[1], &[10]), i64s(&[1], &[-1]));
        let body = common::fold_input(&body, 3, &ax);
        let body = common::fold_input(&body, 2, &en);
        let body = common::fold_input(&body, 1, &st);
        for (b, s) in [(1, 1), (2, 3)] {
            let x = match dtype {
                DType::Bool => {
                    let n = b * s * 10;
                    let bytes: Vec<u8> = (0..n).map(|k| (k % 3 == 0) as u8).collect();
                    Tensor::from_le_bytes(dtype, &[b, s, 10], &bytes).unwrap()
                }
                _ => pattern(dtype, &[b, s, 10], 3),
            };
            check(&device, &body, vec![x]);
        }
    }
}

#[test]
fn gathers_over_a_symbolic_batch_and_axis() {
    let Some(device) = common::device_or_skip("gather") else {
        return;
    };
    // A sequence's first row, by a folded index, of a [batch, seq, d] tensor.
    let first = graph(
        "graph @gather_sym(%x: f32[b, s, 4], %i: i64[1]) -> (%y) {\n  %y: f32[b, 1, 4] = gather{axis = 1}(%x, %i)\n}",
    );
    let first = common::fold_input(&first, 1, &i64s(&[1], &[0]));
    // Per-batch rows of a KV buffer with a zero row appended: [batch, past + 1, d].
    let rows = graph(
        "graph @gather_nd_sym(%x: i64[b, r, 3], %i: i64[b, p, 1]) -> (%y) {\n  %y: i64[b, p, 3] = gather_nd{batch_dims = 1}(%x, %i)\n}",
    );
    for (b, s) in [(1, 1), (3, 5)] {
        check(&device, &first, vec![pattern(DType::F32, &[b, s, 4], 4)]);
        let p = s + 2;
        let ids: Vec<i64> = (0..b * p)
            .map(|k| (k as i64 * 5) % (s as i64 + 1))
            .collect();
        let inputs = vec![
            pattern(DType::I64, &[b, s + 1, 3], 5),
            i64s(&[b, p, 1], &ids),
        ];
        check(&device, &rows, inputs);
    }
}

/// Runs `body` on the device and the reference and compares every output to float
/// rounding (the online softmax sums in another order than the reference's passes).
fn check_close(
    device: &rafter_hal_vulkan::VulkanDevice,
    body: &rafter_ir::Graph,
    inputs: Vec<Tensor>,
) {
    let want = rafter_reference::run(body, inputs.clone()).unwrap_or_else(|e| panic!("{e}"));
    let module = kernel_module(body, 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(!module.dims.is_empty(), "{}: no dim params", body.name);
    let dtypes: Vec<DType> = want.iter().map(|t| t.dtype()).collect();
    let dims: Vec<Vec<usize>> = want.iter().map(|t| t.shape().to_vec()).collect();
    let got = common::run_typed_outputs(device, &module, &inputs, &dtypes, &dims);
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        assert_eq!(g.len(), w.len());
        for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
            assert!(
                common::close(g as f32, w as f32, 2e-5, 2e-5),
                "{} output {o} element {i}: got {g}, want {w} at {:?}",
                body.name,
                inputs
                    .iter()
                    .map(|t| t.shape().to_vec())
                    .collect::<Vec<_>>()
            );
        }
    }
}

fn floats(dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    common::floats(DType::F32, dims, &common::inputs_in((-2.0, 2.0), n, seed))
}

/// Attention over symbolic query and key lengths (the online softmax): ORT GenAI's
/// per-sequence GQA (3-D, grouped heads, a bool mask over the present rows), and a
/// causal 4-D step with a symbolic past and the present outputs.
#[test]
fn attention_over_symbolic_lengths_matches_the_reference() {
    let Some(device) = common::device_or_skip("attention") else {
        return;
    };
    let gqa = graph(
        "graph @attention_gqa(%q: f32[b, s, 32], %k: f32[b, r, 16], %v: f32[b, r, 16], %m: bool[b, 1, s, r]) -> (%y) {\n  %y: f32[b, s, 32] = attention{is_causal = false, kv_num_heads = 2, q_num_heads = 4, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v, %m)\n}",
    );
    for (seed, (b, s, r)) in [(1usize, 1usize, 3usize), (2, 3, 6), (1, 4, 9)]
        .into_iter()
        .enumerate()
    {
        let seed = seed as u64 * 4;
        // Key j visible to query i where j <= i + r - s (causal over the present rows),
        // and a row of the second batch with no visible key at all.
        let mask: Vec<u8> = (0..b * s * r)
            .map(|x| {
                let (bi, rest) = (x / (s * r), x % (s * r));
                let (i, j) = (rest / r, rest % r);
                u8::from(j + s <= i + r && !(bi == 1 && i == 0))
            })
            .collect();
        let inputs = vec![
            floats(&[b, s, 32], seed),
            floats(&[b, r, 16], seed + 1),
            floats(&[b, r, 16], seed + 2),
            Tensor::from_le_bytes(DType::Bool, &[b, 1, s, r], &mask).unwrap(),
        ];
        check_close(&device, &gqa, inputs);
    }
    let step = graph(
        "graph @attention_past(%q: f32[b, 2, s, 4], %k: f32[b, 1, s, 4], %v: f32[b, 1, s, 4], %pk: f32[b, 1, p, 4], %pv: f32[b, 1, p, 4]) -> (%y, %a, %c) {\n  %y: f32[b, 2, s, 4], %a: f32[b, 1, p + s, 4], %c: f32[b, 1, p + s, 4] = attention{is_causal = true, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v, _, %pk, %pv)\n}",
    );
    for (seed, (b, s, p)) in [(1usize, 1usize, 0usize), (1, 1, 5), (2, 3, 4)]
        .into_iter()
        .enumerate()
    {
        let seed = 100 + seed as u64 * 5;
        let inputs = vec![
            floats(&[b, 2, s, 4], seed),
            floats(&[b, 1, s, 4], seed + 1),
            floats(&[b, 1, s, 4], seed + 2),
            floats(&[b, 1, p, 4], seed + 3),
            floats(&[b, 1, p, 4], seed + 4),
        ];
        check_close(&device, &step, inputs);
    }
}
