//! Writer → reader round trips: every value type, nested and string arrays, every ggml
//! type's tensors, non-default alignments, through memory and through a file.

use rafter_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value, ValueType};

/// Deterministic filler bytes (a 64-bit LCG), so tensor data is not all zeros.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(255)),
        ("v.i8", Value::I8(-128)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f32", Value::F32(-0.0)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("v.bool", Value::Bool(false)),
        ("v.str", Value::String("ünïcödé \u{1F600}".into())),
        ("v.empty_str", Value::String(String::new())),
        ("v.u8s", Value::Array(Array::from_slice(&[0u8, 1, 255]))),
        (
            "v.i64s",
            Value::Array(Array::from_slice(&[i64::MIN, 0, i64::MAX])),
        ),
        ("v.f64s", Value::Array(Array::from_slice(&[1.5f64, -2.25]))),
        ("v.bools", Value::Array(Array::from_slice(&[true, false]))),
        ("v.empty", Value::Array(Array::from_slice::<u32>(&[]))),
        (
            "v.strs",
            Value::Array(Array::from_strings(&["", "a", "<|im_end|>", "日本語"])),
        ),
        (
            "v.nested",
            Value::Array(Array::from_arrays(vec![
                Array::from_slice(&[1i32, 2]),
                Array::from_strings(&["x"]),
                Array::from_arrays(vec![Array::from_slice(&[0.5f32])]),
            ])),
        ),
    ]
}

/// What was written for each tensor: name, dims, type, data.
type Written = Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>;

fn build(alignment: Option<u32>) -> (GgufWriter, Written) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.add("general.alignment", a).unwrap();
    }
    for (k, v) in all_values() {
        w.add(k, v).unwrap();
    }
    let mut tensors = Vec::new();
    for (i, ty) in GgmlType::all().enumerate() {
        let row = u64::from(ty.block_elems()) * 2;
        let dims = vec![row, 3, (i % 2 + 1) as u64];
        let n = ty.bytes_for(dims.iter().product()).unwrap() as usize;
        let data = bytes(n, i as u64);
        let name = format!("t{i}.{}", ty.name());
        w.add_tensor(&name, &dims, ty, data.clone()).unwrap();
        tensors.push((name, dims, ty, data));
    }
    (w, tensors)
}

fn check(file: &GgufFile, tensors: &Written, alignment: u64) {
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), alignment);
    for (k, v) in all_values() {
        assert_eq!(file.get(k), Some(&v), "{k}");
    }
    assert_eq!(file.tensors().len(), tensors.len());
    for (info, (name, dims, ty, data)) in file.tensors().iter().zip(tensors) {
        assert_eq!(info.name(), name);
        assert_eq!(info.dims(), &dims[..]);
        assert_eq!(info.ggml_type(), *ty);
        assert_eq!(info.offset() % alignment, 0, "{name} aligned");
        assert_eq!(
            info.data_start() % alignment,
            0,
            "{name} aligned in the file"
        );
        assert_eq!(&file.tensor_data(info)[..], &data[..], "{name} data");
        assert_eq!(file.tensor(name), Some(info));
    }
}

#[test]
fn round_trip_in_memory_default_and_custom_alignment() {
    for alignment in [None, Some(1), Some(8), Some(64), Some(4096)] {
        let (w, tensors) = build(alignment);
        let file = GgufFile::from_bytes(w.to_vec().unwrap().into()).unwrap();
        check(&file, &tensors, alignment.map_or(32, u64::from));
    }
}

#[test]
fn round_trip_through_a_file() {
    let (w, tensors) = build(None);
    let path =
        std::env::temp_dir().join(format!("rafter-gguf-roundtrip-{}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    check(&file, &tensors, 32);
    assert_eq!(file.name(), path.display().to_string());
    // Tensor data stays valid after the file is gone: the map holds the pages.
    let t = &file.tensors()[0];
    assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes());
}

#[test]
fn typed_getters_convert_and_name_the_key_on_mismatch() {
    let (w, _) = build(None);
    let file = GgufFile::from_bytes_named(w.to_vec().unwrap().into(), "model.gguf").unwrap();
    assert_eq!(file.get_u64("v.u8").unwrap(), 255);
    assert_eq!(file.get_i32("v.i16").unwrap(), -32768);
    assert_eq!(file.get_f64("v.f32").unwrap(), 0.0);
    assert_eq!(file.get_f32("v.u8").unwrap(), 255.0);
    assert_eq!(file.get_opt::<u32>("absent").unwrap(), None);

    let e = file.get_u32("v.u64").unwrap_err().to_string();
    assert!(e.starts_with("model.gguf: at byte "), "{e}");
    assert!(
        e.contains("'v.u64' holds u64 18446744073709551615, expected an integer that fits in u32"),
        "{e}"
    );
    let e = file.get_u32("absent").unwrap_err().to_string();
    assert_eq!(e, "model.gguf: metadata key 'absent' is missing");
    let e = file.get_str("v.u32").unwrap_err().to_string();
    assert!(
        e.contains("'v.u32' holds u32 4294967295, expected a string"),
        "{e}"
    );
    let e = file.get_i32_array("v.strs").unwrap_err().to_string();
    assert!(
        e.contains("'v.strs': array element type is str, expected i32"),
        "{e}"
    );
    let e = file.get_string_array("v.u8").unwrap_err().to_string();
    assert!(e.contains("'v.u8' holds u8 255, expected an array"), "{e}");

    let nested = file.get_array("v.nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    let subs = nested.as_arrays().unwrap();
    assert_eq!(subs[0].as_typed::<i32>().unwrap().to_vec(), [1, 2]);
    assert_eq!(subs[1].as_strings().unwrap().get(0), Some("x"));
}

#[test]
fn writer_rejects_what_readers_would() {
    let mut w = GgufWriter::new();
    w.add("a", 1u32).unwrap();
    let e = w.add("a", 2u32).err().unwrap().to_string();
    assert!(e.contains("duplicate metadata key 'a'"), "{e}");
    let e = w.add("", 2u32).err().unwrap().to_string();
    assert!(e.contains("must not be empty"), "{e}");
    let e = w.add("general.alignment", 24u32).err().unwrap().to_string();
    assert!(e.contains("power-of-two u32, got u32"), "{e}");
    let e = w.add("general.alignment", 32u64).err().unwrap().to_string();
    assert!(e.contains("power-of-two u32, got u64"), "{e}");

    w.add_tensor("x", &[32, 2], GgmlType::Q8_0, vec![0u8; 68])
        .unwrap();
    let e = w
        .add_tensor("x", &[32], GgmlType::Q8_0, vec![0u8; 34])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("duplicate tensor name 'x'"), "{e}");
    let e = w
        .add_tensor("y", &[32], GgmlType::Q8_0, vec![0u8; 33])
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tensor 'y' (q8_0, dims [32]) needs 34 bytes, got 33"),
        "{e}"
    );
    let e = w
        .add_tensor("z", &[31], GgmlType::Q8_0, vec![])
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("rows of 31 elements are not a whole number of 32-element blocks"),
        "{e}"
    );
    let long = "n".repeat(64);
    let e = w
        .add_tensor(&long, &[1], GgmlType::F32, vec![0u8; 4])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("ggml allows at most 63"), "{e}");
    let e = w
        .add_tensor("d", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0u8; 4])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("has 5 dims"), "{e}");
}

#[test]
fn empty_file_has_no_padding_and_no_tensors() {
    let w = GgufWriter::new();
    let raw = w.to_vec().unwrap();
    assert_eq!(raw.len(), 24, "magic, version, two counts");
    let file = GgufFile::from_bytes(raw.into()).unwrap();
    assert!(file.metadata().is_empty() && file.tensors().is_empty());
    assert_eq!(file.data_offset(), 32);
}

/// The fuzz target's committed seeds are valid files (so mutations start deep in them).
#[test]
fn fuzz_seeds_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/read_gguf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!file.tensors().is_empty(), "{}", path.display());
        n += 1;
    }
    assert!(n >= 2);
}

/// The header's pages handed back: whole pages below the data offset (none for a file in
/// memory), and every value and tensor still reads as written afterwards (the pages come
/// back from the file).
#[test]
fn released_header_pages_read_back_the_same() {
    let (mut w, tensors) = build(None);
    // A vocabulary-like string array makes the header span several pages.
    let words: Vec<String> = (0..20_000).map(|i| format!("token-{i}")).collect();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    w.add("big.strs", Value::Array(Array::from_strings(&refs)))
        .unwrap();
    let in_memory = GgufFile::from_bytes(w.to_vec().unwrap().into()).unwrap();
    assert_eq!(in_memory.release_header_pages().unwrap(), 0);
    let path =
        std::env::temp_dir().join(format!("rafter-gguf-release-{}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let released = file.release_header_pages().unwrap();
    if cfg!(target_os = "linux") {
        // 20,000 strings of 8 + ~10 bytes: well over 4 pages of any size up to 64 KiB.
        let header = file.data_offset() as usize;
        assert!(released > 0 && released <= header, "{released} of {header}");
        assert!(
            header - released < 65536,
            "whole pages below {header}: {released}"
        );
    } else {
        assert_eq!(released, 0);
    }
    check(&file, &tensors, 32);
    let Some(Value::Array(a)) = file.get("big.strs") else {
        panic!("big.strs is missing");
    };
    assert_eq!(a, &Array::from_strings(&refs));
    std::fs::remove_file(&path).unwrap();
}
