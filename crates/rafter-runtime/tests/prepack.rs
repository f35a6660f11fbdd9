//! Weights pre-packed at compile time (`rafter_opt::prepack`) through the whole path: compile,
//! artifact file, memory map, native matmul reading the packed panels in place. Outputs are
//! checked against the reference executor on the source graph; a corrupt artifact and a
//! program whose packed weight disagrees with its kernel are errors, not panics.

mod common;

use common::{max_abs_diff, LONG};
use rafter_artifact::{Artifact, ReadOptions, SectionKind};
use rafter_ir::{ConstData, DType, Graph};
use rafter_runtime::{Session, SessionOptions, Tensor};

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

fn rand(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005) | 1;
    let v = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::f32s(dims, v)
}

/// A batched matmul with bias and relu (N = 50: a partial last panel), a classifier-like
/// one-row `gemm` with `transB` and a bias, and a five-row `gemm` with `transB`, whose
/// weights all get packed.
fn graph() -> Graph {
    let g = rafter_ir::text::parse_graph(&format!(
        r#"graph @packed(%x: f32[2, 3, 40], %v: f32[1, 40], %m: f32[5, 40]) -> (%y, %z, %u) {{
          const %w1: f32[40, 50] = {w1}
          const %b1: f32[50] = {b1}
          %mm: f32[2, 3, 50] = matmul(%x, %w1)
          %a: f32[2, 3, 50] = binary{{op = add}}(%mm, %b1)
          %y: f32[2, 3, 50] = unary{{op = relu}}(%a)
          const %w2: f32[10, 40] = {w2}
          const %c2: f32[10] = {c2}
          %z: f32[1, 10] = gemm{{alpha = 1, beta = 1, trans_a = false, trans_b = true}}(%v, %w2, %c2)
          const %w3: f32[33, 40] = {w3}
          %u: f32[5, 33] = gemm{{alpha = 0.5, beta = 1, trans_a = false, trans_b = true}}(%m, %w3, _)
        }}"#,
        w1 = dense(40 * 50, 1),
        b1 = dense(50, 2),
        w2 = dense(10 * 40, 3),
        c2 = dense(10, 4),
        w3 = dense(33 * 40, 5),
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    rafter_ir::verify(&g).unwrap();
    g
}

fn inputs() -> Vec<Tensor> {
    vec![rand(&[2, 3, 40], 1), rand(&[1, 40], 2), rand(&[5, 40], 3)]
}

fn packed_weights(a: &Artifact) -> Vec<usize> {
    (0..a.program().weights.len())
        .filter(|&w| a.program().weights[w].dims.len() == 3)
        .collect()
}

#[test]
fn packed_weights_run_in_place_from_the_map_and_match_the_reference() {
    let g = graph();
    let compiled =
        rafter_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{e}"));
    let path = std::env::temp_dir().join(format!("rafter-prepack-{}.rfa", std::process::id()));
    compiled.write(&path).unwrap();
    let artifact = Artifact::open(&path).unwrap();
    let packed = packed_weights(&artifact);
    assert_eq!(packed.len(), 3, "{:?}", artifact.weight_entries());
    for &w in &packed {
        // Panels start on a cache line of the map (weights are 64-byte aligned).
        let ptr = artifact.program().weights[w].bytes.as_ptr() as usize;
        assert_eq!(ptr % 64, 0, "weight {w}");
    }

    let want = common::reference_run(&g, &inputs());
    let devices = rafter_runtime_cpu::devices().unwrap();
    let session = Session::from_artifact(artifact, &devices, SessionOptions::new()).unwrap();
    let got = session.run(inputs(), LONG).unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(d <= 1e-4, "output {i}: max diff {d}");
    }
    let stats = session.native_stats();
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
    assert!(stats.dispatches >= 3, "{stats:?}");

    // The reference kernels run the same program by unpacking in the body.
    let reference = Session::with_options(
        session.program().clone(),
        &devices,
        SessionOptions::new().reference_kernels(),
    )
    .unwrap();
    let slow = reference.run(inputs(), LONG).unwrap();
    for (i, (a, b)) in slow.iter().zip(&want).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(d <= 1e-4, "reference path, output {i}: max diff {d}");
    }
    drop((session, reference));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_corrupt_packed_weight_is_an_error_not_a_panic() {
    let g = graph();
    let bytes = rafter_compiler::compile(&g, &Default::default())
        .unwrap()
        .to_bytes()
        .unwrap();
    let artifact = Artifact::from_bytes(bytes.clone().into()).unwrap();
    let w = packed_weights(&artifact)[0];
    let weights = artifact
        .sections()
        .iter()
        .find(|s| s.kind == SectionKind::Weights)
        .unwrap()
        .offset as usize;
    let entry = &artifact.weight_entries()[w];

    // A flipped byte in the panels: the weights section's checksum names it.
    let mut flipped = bytes.clone();
    flipped[weights + entry.offset as usize + 100] ^= 0x40;
    let e = Artifact::from_bytes(flipped.clone().into()).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(e.to_string().contains("weights"), "{e}");
    // Without checksums it reads (and runs: wrong numbers, no undefined behaviour).
    let lax = ReadOptions {
        verify_checksums: false,
    };
    let a = Artifact::from_bytes_with(flipped.into(), &lax).unwrap();
    let devices = rafter_runtime_cpu::devices().unwrap();
    let s = Session::from_artifact(a, &devices, SessionOptions::new()).unwrap();
    s.run(inputs(), LONG).unwrap();

    // The packed weight's dims in the weight table changed: the table no longer matches
    // its bytes, and the reader says which entry and why.
    let table = artifact
        .sections()
        .iter()
        .find(|s| s.kind == SectionKind::WeightTable)
        .unwrap()
        .offset as usize;
    let mut at = table + 8;
    for e in &artifact.weight_entries()[..w] {
        at += 24 + 8 * e.dims.len();
    }
    let mut bad = bytes.clone();
    let k = entry.dims[1] as u64;
    bad[at + 32..at + 40].copy_from_slice(&(k + 1).to_le_bytes()); // dims[1] = K + 1
    let e = Artifact::from_bytes_with(bad.into(), &lax).unwrap_err();
    assert!(e.to_string().contains(&format!("entry {w}")), "{e}");
}

#[test]
fn a_packed_weight_that_disagrees_with_its_kernel_fails_the_call() {
    // A hostile program: the packed weight is one row of panels short of what the kernel's
    // operand type says. The native kernel checks the bytes against the operand's dims, so
    // the call fails with a message instead of reading out of bounds.
    let g = graph();
    let mut program = rafter_opt::compile(&g, &rafter_opt::CompileOptions::default()).unwrap();
    let w = program
        .weights
        .iter()
        .position(|c| c.dims.len() == 3)
        .unwrap();
    let dims = program.weights[w].dims.clone();
    let short = vec![dims[0], dims[1] - 1, dims[2]];
    let n: usize = short.iter().product();
    program.weights[w] =
        ConstData::new(DType::F32, short.clone(), vec![0u8; 4 * n].into()).unwrap();
    for b in &mut program.buffers {
        if b.storage == rafter_ir::program::Storage::Weight(w) {
            let d: Vec<i64> = short.iter().map(|&d| d as i64).collect();
            b.ty = rafter_ir::TensorType::known(DType::F32, &d);
        }
    }
    let devices = rafter_runtime_cpu::devices().unwrap();
    let session = Session::new(program, &devices).unwrap();
    let e = session.run(inputs(), LONG).unwrap_err();
    assert!(e.to_string().contains("bytes"), "{e}");
}
