//! Fuzzes the GGUF reader with arbitrary bytes: it must return a file or an error, never
//! panic, hang or read out of bounds. Whatever is accepted must be fully readable (every
//! metadata value and array element, every tensor's data of the size its type and dims
//! give) and, when our writer accepts it back, survive a write → read round trip.
//!
//! Seeds: `fuzz/seeds/read_gguf/` (committed: a gguf-py-written file with every value type
//! and six tensor types, and a nested-array file). Run with
//! `cargo fuzz run read_gguf corpus/read_gguf seeds/read_gguf -- -max_total_time=600`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rafter_gguf::{Array, GgufFile, GgufWriter, Value};

/// Reads every element of an array (strings, scalars, nested) and returns a checksum so
/// the reads are not optimised away.
fn touch(a: &Array) -> usize {
    let mut sum = a.len();
    if let Some(s) = a.as_strings() {
        sum += s.iter().map(str::len).sum::<usize>();
    } else if let Some(nested) = a.as_arrays() {
        sum += nested.iter().map(touch).sum::<usize>();
    } else if let Some(bytes) = a.scalar_bytes() {
        sum += bytes.len();
    }
    sum
}

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut sum = 0usize;
    for e in file.metadata() {
        if let Value::Array(a) = e.value() {
            sum += touch(a);
        }
        let found = file.entry(e.key()).expect("every key can be looked up");
        assert!(std::ptr::eq(found, e), "lookup finds the entry itself");
    }
    for t in file.tensors() {
        let d = file.tensor_data(t);
        assert_eq!(d.len() as u64, t.n_bytes(), "tensor data has the size its type gives");
        assert_eq!(t.data_start() % file.alignment(), 0, "tensor data is aligned");
        sum += d.len();
    }
    std::hint::black_box(sum);

    let mut w = GgufWriter::new();
    for e in file.metadata() {
        if w.add(e.key(), e.value().clone()).is_err() {
            return;
        }
    }
    for t in file.tensors() {
        if w.add_tensor(t.name(), t.dims(), t.ggml_type(), file.tensor_data(t)).is_err() {
            return;
        }
    }
    let rewritten = w.to_vec().expect("writer output");
    let again = GgufFile::from_bytes(rewritten.into()).expect("rewritten files read");
    assert_eq!(again.metadata().len(), file.metadata().len());
    for (a, b) in again.metadata().iter().zip(file.metadata()) {
        assert_eq!(a.key(), b.key());
        // NaN != NaN: compare floats bitwise through their debug form.
        assert_eq!(format!("{:?}", a.value()), format!("{:?}", b.value()));
    }
    for (a, b) in again.tensors().iter().zip(file.tensors()) {
        assert_eq!((a.name(), a.dims(), a.ggml_type()), (b.name(), b.dims(), b.ggml_type()));
        assert_eq!(again.tensor_data(a), file.tensor_data(b));
    }
});
