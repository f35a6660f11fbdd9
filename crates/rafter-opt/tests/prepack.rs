//! Weights pre-packed for the CPU GEMM (`rafter_opt::prepack`): which weights are packed,
//! their layout against `rafter-kernels-cpu`'s own packing, and that the compiled program
//! still computes bitwise what the reference executor computes on the source graph.

mod common;

use common::{check_equivalent, parse, rand_f32};
use rafter_ir::program::Storage;
use rafter_ir::{ConstData, Op};
use rafter_kernels_cpu::{MatRef, PackedB};

/// `n` deterministic values as a `dense [...]` literal.
fn dense(n: usize, seed: u32) -> String {
    let v: Vec<String> = (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 40503)
                % 1000;
            format!("{:.3}", x as f32 / 500.0 - 1.0)
        })
        .collect();
    format!("dense [{}]", v.join(", "))
}

fn f32s(c: &ConstData) -> Vec<f32> {
    c.bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn matmul_and_gemm_weights_are_packed_and_programs_stay_equivalent() {
    let g = parse(&format!(
        r#"graph @pp(%x: f32[2, 3, 9], %m: f32[5, 20], %r: f32[9, 4]) -> (%y, %z, %v, %q) {{
          const %w1: f32[9, 20] = {w1}
          const %b1: f32[20] = {b1}
          %mm: f32[2, 3, 20] = matmul(%x, %w1)
          %a: f32[2, 3, 20] = binary{{op = add}}(%mm, %b1)
          %y: f32[2, 3, 20] = unary{{op = relu}}(%a)
          const %w2: f32[7, 20] = {w2}
          const %c2: f32[7] = {c2}
          %z: f32[5, 7] = gemm{{alpha = 0.5, beta = 1, trans_a = false, trans_b = true}}(%m, %w2, %c2)
          const %w3: f32[9, 9] = {w3}
          %v: f32[2, 3, 9] = matmul(%x, %w3)
          %q: f32[9, 4] = matmul(%w3, %r)
        }}"#,
        w1 = dense(9 * 20, 1),
        b1 = dense(20, 2),
        w2 = dense(7 * 20, 3),
        c2 = dense(7, 4),
        w3 = dense(81, 5),
    ));
    let p = check_equivalent(
        &g,
        vec![
            rand_f32(&[2, 3, 9], 1),
            rand_f32(&[5, 20], 2),
            rand_f32(&[9, 4], 3),
        ],
    );
    let raw = |name: &str| {
        let v = g.values.iter().position(|v| v.name == name).unwrap();
        g.const_of(rafter_ir::ValueId(v as u32)).unwrap().clone()
    };
    // w1 [9, 20] → 2 panels of 9 x 16; w2 [7, 20] read transposed → B^T is [20, 7], one
    // panel of 20 x 16; w3 is also an A operand, so it stays raw; b1 is not a B.
    let weight_dims: Vec<Vec<usize>> = p.weights.iter().map(|w| w.dims.clone()).collect();
    assert!(weight_dims.contains(&vec![2, 9, 16]), "{weight_dims:?}");
    assert!(weight_dims.contains(&vec![1, 20, 16]), "{weight_dims:?}");
    assert!(weight_dims.contains(&vec![9, 9]), "{weight_dims:?}");
    assert!(weight_dims.contains(&vec![20]), "{weight_dims:?}");
    assert_eq!(p.weights.len(), 4);

    // The stored panels are exactly what the GEMM packs (zero-padded past N).
    let w1 = f32s(&raw("w1"));
    let want = PackedB::pack(9, 20, &w1, 20).unwrap();
    let got = p.weights.iter().find(|w| w.dims == [2, 9, 16]).unwrap();
    assert_eq!(f32s(got), want.panels());
    let w2 = f32s(&raw("w2"));
    let want = PackedB::pack_mat(MatRef::row_major(&w2, 7, 20, 20).unwrap().t());
    let got = p.weights.iter().find(|w| w.dims == [1, 20, 16]).unwrap();
    assert_eq!(f32s(got), want.panels());

    // Each packed weight's buffer has the packed type, and its kernel unpacks it first; the
    // gemm no longer transposes (the packing did).
    for (i, w) in p.weights.iter().enumerate() {
        let buffers: Vec<_> = p
            .buffers
            .iter()
            .filter(|b| b.storage == Storage::Weight(i))
            .collect();
        assert!(!buffers.is_empty());
        for b in buffers {
            let dims: Vec<i64> = w.dims.iter().map(|&d| d as i64).collect();
            assert_eq!(b.ty.known_dims().unwrap(), dims);
        }
    }
    let bodies: Vec<Vec<&str>> = p
        .kernels
        .iter()
        .map(|k| k.body.nodes.iter().map(|n| n.op.name()).collect())
        .collect();
    assert!(
        bodies.contains(&vec![
            "transpose",
            "reshape",
            "slice",
            "matmul",
            "binary",
            "unary"
        ]) || bodies.contains(&vec!["transpose", "reshape", "slice", "matmul", "binary"]),
        "{bodies:?}"
    );
    let gemm = p
        .kernels
        .iter()
        .flat_map(|k| &k.body.nodes)
        .find_map(|n| match n.op {
            Op::Gemm { trans_b, .. } => Some(trans_b),
            _ => None,
        });
    assert_eq!(gemm, Some(false));
}

#[test]
fn a_weight_with_a_non_b_reader_or_a_multiple_of_16_columns() {
    // N = 32: two whole panels, no slice. The same weight read by two matmuls as B is
    // packed once.
    let g = parse(&format!(
        r#"graph @pp2(%x: f32[3, 8], %y: f32[3, 8]) -> (%a, %b) {{
          const %w: f32[8, 32] = {w}
          %a: f32[3, 32] = matmul(%x, %w)
          %b: f32[3, 32] = matmul(%y, %w)
        }}"#,
        w = dense(8 * 32, 7),
    ));
    let p = check_equivalent(&g, vec![rand_f32(&[3, 8], 4), rand_f32(&[3, 8], 5)]);
    assert_eq!(p.weights.len(), 1);
    assert_eq!(p.weights[0].dims, vec![2, 8, 16]);
    for k in &p.kernels {
        let ops: Vec<&str> = k.body.nodes.iter().map(|n| n.op.name()).collect();
        assert_eq!(ops, ["transpose", "reshape", "matmul"]);
    }
}

#[test]
fn weights_read_by_a_copy_or_compiled_for_vulkan_stay_raw() {
    // `w` is also a graph output (a copy step reads it): it must stay raw.
    let g = parse(&format!(
        r#"graph @pp3(%x: f32[3, 8]) -> (%a, %w) {{
          const %w: f32[8, 20] = {w}
          %a: f32[3, 20] = matmul(%x, %w)
        }}"#,
        w = dense(8 * 20, 9),
    ));
    let p = check_equivalent(&g, vec![rand_f32(&[3, 8], 6)]);
    assert_eq!(p.weights.len(), 1);
    assert_eq!(p.weights[0].dims, vec![8, 20]);

    // Compiled for Vulkan nothing is packed (a matmul the GPU runs reads its weight there,
    // and `rafter plan` explains CPU fallbacks from their unrewritten bodies).
    let g = parse(&format!(
        r#"graph @pp4(%x: f32[3, 8]) -> (%a) {{
          const %w: f32[8, 20] = {w}
          %a: f32[3, 20] = matmul(%x, %w)
        }}"#,
        w = dense(8 * 20, 10),
    ));
    let opts = rafter_opt::CompileOptions {
        target: rafter_opt::Target::cpu()
            .with(std::sync::Arc::new(rafter_codegen_spirv::SpirvBackend)),
        ..rafter_opt::CompileOptions::default()
    };
    let p = rafter_opt::compile(&g, &opts).unwrap();
    assert!(p.weights.iter().all(|w| w.dims.len() == 2));
}

/// `n` deterministic values (as `dense` writes them).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 40503)
                % 1000;
            format!("{:.3}", x as f32 / 500.0 - 1.0).parse().unwrap()
        })
        .collect()
}

fn literal(v: &[f32]) -> String {
    let v: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
    format!("dense [{}]", v.join(", "))
}

#[test]
fn sixteen_bit_weights_are_the_rounded_weights_packed_and_widened_by_the_body() {
    use rafter_ir::DType;
    use rafter_kernels_cpu::{HalfKind, PackedHalfB};
    use rafter_opt::prepack::WeightFormat;
    // A matmul weight (with bias and ReLU), a gemm weight read transposed, and a scaled
    // gemm's weight: all three become 16-bit panels; the bias stays f32.
    let src = |w1: &[f32], w2: &[f32], w3: &[f32]| {
        parse(&format!(
            r#"graph @h(%x: f32[2, 3, 9], %m: f32[5, 20]) -> (%y, %z, %s) {{
              const %w1: f32[9, 20] = {w1}
              const %b1: f32[20] = {b1}
              %mm: f32[2, 3, 20] = matmul(%x, %w1)
              %a: f32[2, 3, 20] = binary{{op = add}}(%mm, %b1)
              %y: f32[2, 3, 20] = unary{{op = relu}}(%a)
              const %w2: f32[7, 20] = {w2}
              %z: f32[5, 7] = gemm{{alpha = 1, beta = 1, trans_a = false, trans_b = true}}(%m, %w2)
              const %w3: f32[20, 6] = {w3}
              %s: f32[5, 6] = gemm{{alpha = 0.5, beta = 1, trans_a = false, trans_b = false}}(%m, %w3)
            }}"#,
            w1 = literal(w1),
            b1 = dense(20, 2),
            w2 = literal(w2),
            w3 = literal(w3),
        ))
    };
    let (w1, w2, w3) = (values(9 * 20, 1), values(7 * 20, 3), values(20 * 6, 4));
    let inputs = vec![rand_f32(&[2, 3, 9], 1), rand_f32(&[5, 20], 2)];
    for (format, kind, dtype) in [
        (WeightFormat::Bf16, HalfKind::Bf16, DType::BF16),
        (WeightFormat::F16, HalfKind::F16, DType::F16),
    ] {
        let opts = rafter_opt::CompileOptions {
            cpu_weights: format,
            ..rafter_opt::CompileOptions::default()
        };
        let p = rafter_opt::compile(&src(&w1, &w2, &w3), &opts).unwrap();
        let half: Vec<&ConstData> = p.weights.iter().filter(|w| w.dtype == dtype).collect();
        assert_eq!(half.len(), 3, "{format:?}");
        let want = PackedHalfB::pack(kind, 9, 20, &w1, 20).unwrap();
        let got = half.iter().find(|w| w.dims == [2, 9, 16]).unwrap();
        let bits: Vec<u16> = got
            .bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(bits, want.panels(), "{format:?}");
        assert!(p
            .weights
            .iter()
            .any(|w| w.dtype == DType::F32 && w.dims == [20]));
        // Every body reading 16-bit panels widens them first.
        for k in &p.kernels {
            if let Some(first) = k.body.nodes.first() {
                let reads_half = k
                    .body
                    .inputs
                    .iter()
                    .any(|&v| k.body.value(v).ty.dtype == dtype);
                if reads_half {
                    assert!(
                        matches!(first.op, Op::Cast { to: DType::F32 }),
                        "{}",
                        k.name
                    );
                }
            }
        }
        // The program computes what the reference computes with the weights rounded.
        let round =
            |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| kind.to_f32(kind.from_f32(x))).collect() };
        let rounded = src(&round(&w1), &round(&w2), &round(&w3));
        let want = rafter_reference::run(&rounded, inputs.clone()).unwrap();
        let got = common::interpret(&p, inputs.clone()).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            common::same_bits(a, b).unwrap_or_else(|e| panic!("{format:?} output {i}: {e}"));
        }
        // And the rounding changed the results (the test would not see a missing cast).
        let exact = rafter_reference::run(&src(&w1, &w2, &w3), inputs.clone()).unwrap();
        assert!(common::same_bits(&got[0], &exact[0]).is_err(), "{format:?}");
    }
}
