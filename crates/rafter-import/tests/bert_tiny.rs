//! Imports the committed bert_tiny fixture (PyTorch export, opset 17, dynamic `batch` and
//! `seq`) and checks that the symbolic dims survive the shape arithmetic.

use rafter_import::import_onnx_file;
use rafter_ir::{DType, Dim, TensorType};
use std::path::Path;

#[test]
fn bert_tiny_keeps_batch_and_seq_symbolic() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny/model.onnx");
    let imported = import_onnx_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(imported.opset, 17);
    assert_eq!(imported.producer, "pytorch");
    let g = &imported.graph;
    let sym = |s: &str| Dim::symbol(s);
    let inputs: Vec<(&str, &TensorType)> = g
        .inputs
        .iter()
        .map(|&v| (g.value(v).name.as_str(), &g.value(v).ty))
        .collect();
    let bs = TensorType::new(DType::I64, vec![sym("batch"), sym("seq")]);
    assert_eq!(inputs, vec![("input_ids", &bs), ("attention_mask", &bs)]);
    assert_eq!(g.outputs.len(), 1);
    let out = g.value(g.outputs[0]);
    assert_eq!(out.name, "last_hidden_state");
    assert_eq!(out.ty.to_string(), "f32[batch, seq, 32]");
    // Weights are zero-copy slices of the mapped file, not converted copies.
    assert!(g.constant_bytes() > 10_000, "{}", g.constant_bytes());
}
