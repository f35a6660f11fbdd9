//! Compiled programs, interpreted kernel by kernel, compute exactly what the reference
//! executor computes on the original graph.

mod common;

use common::{check_equivalent, interpret, parse, rand_f32, same_bits};
use rafter_ir::program::{KernelKind, Step, Storage};
use rafter_reference::Tensor;
use std::path::Path;

fn fixture(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

#[test]
fn bert_tiny_compiles_to_an_equivalent_fused_program() {
    let g = rafter_import::import_onnx_file(&fixture("bert_tiny/model.onnx"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph;
    for seq in ["seq7", "seq13"] {
        let read = |name: &str| {
            rafter_reference::npy::read_npy(&fixture(&format!("bert_tiny/{seq}/{name}.npy")))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let inputs = vec![read("input_ids"), read("attention_mask")];
        let p = check_equivalent(&g, inputs.clone());
        let count = |k: KernelKind| p.kernels.iter().filter(|x| x.kind == k).count();
        eprintln!(
            "bert_tiny {seq}: {} nodes -> {} kernels ({} contraction, {} elementwise, {} reduction, {} data movement, {} opaque), {} buffers, {} weights",
            g.nodes.len(),
            p.kernels.len(),
            count(KernelKind::Contraction),
            count(KernelKind::Elementwise),
            count(KernelKind::Reduction),
            count(KernelKind::DataMovement),
            count(KernelKind::Opaque),
            p.buffers.len(),
            p.weights.len()
        );
        // 16 matmuls, each a contraction kernel; most carry their bias add.
        assert_eq!(count(KernelKind::Contraction), 16);
        let with_epilogue = p
            .kernels
            .iter()
            .filter(|k| k.kind == KernelKind::Contraction && k.body.nodes.len() > 1)
            .count();
        assert!(with_epilogue >= 12, "{with_epilogue}");
        assert!(p.kernels.len() < g.nodes.len());
        // Symbols are bound by the inputs: nothing is dynamic.
        assert!(p.buffers.iter().all(|b| b.storage != Storage::Dynamic));
        // And the program reproduces the fixture's recorded output to rounding.
        let want = read("last_hidden_state");
        let got = &interpret(&p, inputs).unwrap()[0];
        let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
        assert_eq!(got.shape(), want.shape());
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "{worst}");
    }
}

#[test]
fn outputs_that_alias_inputs_constants_and_each_other_are_copies() {
    let g = parse(
        r#"graph @alias(%x: f32[2]) -> (%x, %y, %y, %c, %x) {
          const %c: f32[2] = dense [1.0, 2.0]
          %y: f32[2] = binary{op = add}(%x, %c)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[2], 1)]);
    let copies = p
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Copy { .. }))
        .count();
    assert_eq!(copies, 4);
    assert_eq!(p.kernels.len(), 1);
}

#[test]
fn data_dependent_sizes_are_dynamic_buffers() {
    let g = parse(
        r#"graph @nz(%x: f32[6]) -> (%y) {
          const %zero: f32[] = dense [0.0]
          %m: bool[6] = binary{op = greater}(%x, %zero)
          %nz: i64[1, nnz] = non_zero(%m)
          %f: i64[nnz] = squeeze{axes = [0]}(%nz)
          %g: f32[nnz] = gather{axis = 0}(%x, %f)
          %y: f32[nnz] = unary{op = exp}(%g)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[6], 2)]);
    let dynamic = p
        .buffers
        .iter()
        .filter(|b| b.storage == Storage::Dynamic)
        .count();
    assert_eq!(dynamic, 3, "{:#?}", p.buffers);
}

#[test]
fn folding_and_canonicalisation_keep_results_and_control_flow_runs() {
    let g = parse(
        r#"graph @mix(%x: f32[2, 3, 4], %c: bool[]) -> (%y, %z, %tt) {
          %s: i64[3] = shape{start = 0}(%x)
          const %i: i64[1] = dense [0]
          %b: i64[1] = gather{axis = 0}(%s, %i)
          const %rest: i64[1] = dense [-1]
          %shape: i64[2] = concat{axis = 0}(%b, %rest)
          %t1: f32[3, 2, 4] = transpose{perm = [1, 0, 2]}(%x)
          %t2: f32[2, 3, 4] = transpose{perm = [1, 0, 2]}(%t1)
          %t3: f32[3, 4, 2] = transpose{perm = [1, 2, 0]}(%x)
          %tt: f32[4, 3, 2] = transpose{perm = [1, 0, 2]}(%t3)
          const %one: f32[] = dense [1.0]
          %m: f32[2, 3, 4] = binary{op = mul}(%t2, %one)
          %r: f32[2, 12] = reshape{allow_zero = false}(%m, %shape)
          %y: f32[2, 12] = unary{op = tanh}(%r)
          %z: f32[2, 12] = if{then_branch = graph @t(%v: f32[2, 12]) -> (%w) {
            %w: f32[2, 12] = unary{op = neg}(%v)
          }, else_branch = graph @e(%v: f32[2, 12]) -> (%v) {
          }}(%c, %y)
        }"#,
    );
    for cond in [true, false] {
        let c = Tensor::Bool(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), cond));
        let p = check_equivalent(&g, vec![rand_f32(&[2, 3, 4], 3), c]);
        let ops: Vec<&str> = p
            .kernels
            .iter()
            .flat_map(|k| k.body.nodes.iter().map(|n| n.op.name()))
            .collect();
        assert_eq!(ops, ["transpose", "reshape", "unary", "if"]);
        let Some(rafter_ir::Op::Transpose { perm }) =
            p.kernels.first().map(|k| &k.body.nodes[0].op)
        else {
            panic!("no transpose")
        };
        assert_eq!(perm, &[2, 1, 0]);
    }
}

#[test]
fn unfused_lowering_is_equivalent_too() {
    let g = parse(
        r#"graph @plain(%x: f32[3, 4]) -> (%y) {
          %a: f32[3, 4] = unary{op = exp}(%x)
          %b: f32[3, 4] = unary{op = sin}(%a)
          %y: f32[3] = reduce{kind = sum, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%b)
        }"#,
    );
    let opts = rafter_opt::LowerOptions {
        fuse: false,
        ..Default::default()
    };
    let p = rafter_opt::lower(&g, &opts).unwrap();
    assert_eq!(p.kernels.len(), 3);
    let x = rand_f32(&[3, 4], 4);
    let want = rafter_reference::run(&g, vec![x.clone()]).unwrap();
    same_bits(&interpret(&p, vec![x]).unwrap()[0], &want[0]).unwrap();
}
