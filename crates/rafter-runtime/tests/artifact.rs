//! From an artifact file to outputs: the lowered bert_tiny written as an `.rfa`, mapped,
//! and run with its weights read in place from the map.

mod common;

use std::path::Path;

use common::{lower_per_node, max_abs_diff, read_npy, LONG};
use rafter_artifact::Artifact;
use rafter_runtime::{BytesBuffer, RuntimeError, Session};

#[test]
fn runs_a_mapped_artifact_with_weights_in_place() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny");
    let imported =
        rafter_import::import_onnx_file(&dir.join("model.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let program = lower_per_node(&imported.graph);
    let path = std::env::temp_dir().join(format!("rafter-runtime-{}.rfa", std::process::id()));
    rafter_compiler::package(program, &rafter_compiler::Target::cpu())
        .unwrap()
        .write(&path)
        .unwrap();
    let devices = rafter_runtime_cpu::devices().unwrap();

    let artifact = Artifact::open(&path).unwrap();
    let map = artifact.bytes().as_ptr_range();
    let session = Session::new(artifact.program().clone(), &devices).unwrap();
    let mut bound = 0;
    for i in 0..session.program().weights.len() {
        if let Some(buffer) = session.weight_buffer(i) {
            let ptr = buffer.downcast_ref::<BytesBuffer>().unwrap().as_ptr();
            assert!(map.contains(&ptr), "weight {i} is not in the map");
            bound += 1;
        }
    }
    assert!(bound > 10, "{bound} weights bound");

    let read = |name: &str| read_npy(&dir.join("seq7").join(name));
    let out = session
        .run(
            vec![read("input_ids.npy"), read("attention_mask.npy")],
            LONG,
        )
        .unwrap();
    assert!(max_abs_diff(&out[0], &read("last_hidden_state.npy")) <= 1e-4);

    // The one-call form, and its error for a file that is not an artifact.
    let session = Session::open(&path, &devices).unwrap();
    let out2 = session
        .run(
            vec![read("input_ids.npy"), read("attention_mask.npy")],
            LONG,
        )
        .unwrap();
    assert_eq!(out, out2);
    drop(session);
    let _ = std::fs::remove_file(&path);
    let e = Session::open(dir.join("model.onnx"), &devices).unwrap_err();
    assert!(matches!(e, RuntimeError::Artifact(_)), "{e}");
}
