//! A file written by gguf-py's GGUFWriter (every value type, a nested array, alignment
//! 64, tensors of six ggml types; made by gen_gguf_py_sample.py) reads as gguf-py's
//! GGUFReader read it, and our writer reproduces it byte for byte.

mod common;

use std::path::PathBuf;

use rafter_gguf::{GgufFile, GgufWriter, TensorMemory};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn summary() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("gguf_py_sample.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn reads_what_gguf_py_wrote() {
    let file = GgufFile::open(fixture("gguf_py_sample.gguf")).unwrap();
    common::assert_matches_summary(&file, &summary());
    assert_eq!(
        file.get_u64("test.u64").unwrap(),
        18_000_000_000_000_000_000
    );
    assert_eq!(
        file.get_i64("test.i64").unwrap(),
        -9_000_000_000_000_000_000
    );
    assert_eq!(file.get_f32("test.f32").unwrap(), 0.1f32);
    assert_eq!(file.get_str("test.str").unwrap(), "héllo, 世界 🌍");
    let strings = file.get_string_array("test.str_array").unwrap();
    assert_eq!(
        strings.iter().collect::<Vec<_>>(),
        ["a", "", "ü", "<0x0A>", "Ġthe"]
    );
    assert_eq!(
        file.get_f32_array("test.f32_array").unwrap().to_vec(),
        [0.5, -1.5, 3.25]
    );
}

/// Opened with its tensor data copied into memory, the file reads the same: the summary
/// gguf-py wrote (every tensor's values), and every tensor's bytes equal to the mapped
/// file's, at the same alignment within the data section.
#[test]
fn resident_tensor_data_read_as_mapped() {
    let path = fixture("gguf_py_sample.gguf");
    let mapped = GgufFile::open(&path).unwrap();
    let resident = GgufFile::open_with(&path, TensorMemory::Resident).unwrap();
    common::assert_matches_summary(&resident, &summary());
    assert!(resident.tensors().iter().any(|t| t.n_bytes() > 0));
    for t in resident.tensors() {
        let (a, b) = (mapped.tensor_data(t), resident.tensor_data(t));
        assert_eq!(a, b, "tensor {}", t.name());
        assert_eq!(b.len() as u64, t.n_bytes(), "tensor {}", t.name());
        if b.is_empty() {
            continue;
        }
        let from_section = t.data_start() - resident.data_offset();
        assert_eq!(
            (b.as_ptr() as u64) % resident.alignment(),
            from_section % resident.alignment(),
            "tensor {}",
            t.name()
        );
    }
    // The header still reads through the map after its pages are handed back.
    resident.release_header_pages().unwrap();
    assert_eq!(resident.get_str("test.str").unwrap(), "héllo, 世界 🌍");
}

/// Rewriting the file with our writer, entry by entry and tensor by tensor, gives the same
/// bytes: the writer lays files out exactly as gguf-py does.
#[test]
fn writer_reproduces_gguf_py_layout() {
    let original = std::fs::read(fixture("gguf_py_sample.gguf")).unwrap();
    let file = GgufFile::from_bytes(original.clone().into()).unwrap();
    let mut w = GgufWriter::new();
    for e in file.metadata() {
        w.add(e.key(), e.value().clone()).unwrap();
    }
    for t in file.tensors() {
        w.add_tensor(t.name(), t.dims(), t.ggml_type(), file.tensor_data(t))
            .unwrap();
    }
    let rewritten = w.to_vec().unwrap();
    assert_eq!(rewritten.len(), original.len());
    assert!(
        rewritten == original,
        "rewritten file differs from gguf-py's"
    );
}
