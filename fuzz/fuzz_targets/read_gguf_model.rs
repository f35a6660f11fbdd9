//! Fuzzes the GGUF model source: arbitrary bytes read as a GGUF file and then as a model
//! (architecture metadata, tensor names and shapes): a model or an error, never a panic.
//! Whatever is accepted has a self-consistent spec and weights of the sizes their dtypes
//! and shapes give.
//!
//! Seeds: `fuzz/seeds/read_gguf_model/` (small valid Qwen3-MoE, Llama and Gemma 3 files).
//! Run with `cargo fuzz run read_gguf_model corpus/read_gguf_model seeds/read_gguf_model`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rafter_gguf::GgufFile;
use rafter_llm::ModelSource;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(Bytes::copy_from_slice(data)) else {
        return;
    };
    let Ok(model) = ModelSource::from_gguf(file, "fuzz.gguf") else {
        return;
    };
    model.spec.check().expect("accepted specs are consistent");
    for (_, w) in model.weights.iter() {
        let row = w.shape.last().copied().unwrap_or(1);
        assert_eq!(Some(w.bytes.len()), w.dtype.bytes_for(w.n_elements(), row));
    }
    let _ = model.spec.rope.inv_freq(model.spec.head_dim);
});
