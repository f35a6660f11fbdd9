//! Inputs the `import_onnx` fuzz target once crashed on (`fuzz/regressions/import_onnx/`),
//! replayed with the target's own checks: each imports or fails with an error, and what
//! imports verifies and survives a text round trip.

use std::path::Path;

use bytes::Bytes;
use rafter_import::import_onnx_bytes;

#[test]
fn past_fuzz_crashes_are_errors_or_models() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/import_onnx");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = Bytes::from(std::fs::read(&path).unwrap());
        let name = path.display().to_string();
        if let Ok(model) = import_onnx_bytes(bytes, None, &name) {
            rafter_ir::verify(&model.graph).unwrap();
            let text = rafter_ir::text::print_graph(&model.graph);
            let back = rafter_ir::text::parse_graph(&text).unwrap();
            assert_eq!(back, model.graph, "{name}: text round trip");
        }
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}
