//! Fuzzes rafter-llm's safetensors reader (the `safetensors` crate's header validation
//! plus rafter's zero-copy views) with arbitrary bytes: an error or views whose byte
//! lengths match their dtype and shape, never a panic or out-of-bounds slice.
//!
//! Run with `cargo fuzz run read_safetensors corpus/read_safetensors seeds/read_safetensors`.
#![no_main]

use std::path::Path;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rafter_llm::source::read_safetensors;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let Ok(views) = read_safetensors(&bytes, Path::new("fuzz.safetensors")) else {
        return;
    };
    for (_, view) in views {
        if let Ok(t) = view {
            let row = t.shape.last().copied().unwrap_or(1);
            assert_eq!(Some(t.bytes.len()), t.dtype.bytes_for(t.n_elements(), row));
        }
    }
});
