//! Fuzzes the ONNX importer with arbitrary bytes: it must return a model or an error, never
//! panic, hang or read out of bounds. An imported graph must also pass the verifier and
//! survive a text-format round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(model) = rafter_import::import_onnx_bytes(bytes, None, "fuzz input") {
        rafter_ir::verify(&model.graph).expect("imported graphs verify");
        let text = rafter_ir::text::print_graph(&model.graph);
        let back = rafter_ir::text::parse_graph(&text).expect("printed graphs parse");
        assert_eq!(back, model.graph, "text round trip");
    }
});
