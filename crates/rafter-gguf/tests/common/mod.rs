//! Comparing a [`GgufFile`] against a summary gguf-py wrote (see gen_vocab_summary.py).
#![allow(dead_code)]

use rafter_gguf::{Array, GgufFile, Value, ValueType};
use serde_json::Value as Json;

/// FNV-1a 64, as gen_vocab_summary.py computes it.
pub fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf29ce484222325;

pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// The array's elements encoded as the Python script encodes them, hashed.
pub fn array_hash(a: &Array) -> u64 {
    let mut h = FNV_OFFSET;
    if let Some(strings) = a.as_strings() {
        for s in strings.iter() {
            h = fnv1a(s.as_bytes(), h);
            h = fnv1a(&[0xff], h);
        }
    } else if let Some(bytes) = a.scalar_bytes() {
        // The file's little-endian encoding is what struct.pack produces.
        h = fnv1a(bytes, h);
    } else {
        panic!("nested arrays are not hashed");
    }
    h
}

/// Element `i` of an array as JSON (strings, integers, floats, bools).
pub fn element_json(a: &Array, i: usize) -> Json {
    if let Some(s) = a.as_strings() {
        return Json::from(s.get(i).unwrap());
    }
    match a.elem_type() {
        ValueType::U8 => Json::from(a.as_typed::<u8>().unwrap().get(i).unwrap()),
        ValueType::I8 => Json::from(a.as_typed::<i8>().unwrap().get(i).unwrap()),
        ValueType::U16 => Json::from(a.as_typed::<u16>().unwrap().get(i).unwrap()),
        ValueType::I16 => Json::from(a.as_typed::<i16>().unwrap().get(i).unwrap()),
        ValueType::U32 => Json::from(a.as_typed::<u32>().unwrap().get(i).unwrap()),
        ValueType::I32 => Json::from(a.as_typed::<i32>().unwrap().get(i).unwrap()),
        ValueType::U64 => Json::from(a.as_typed::<u64>().unwrap().get(i).unwrap()),
        ValueType::I64 => Json::from(a.as_typed::<i64>().unwrap().get(i).unwrap()),
        ValueType::F32 => Json::from(f64::from(a.as_typed::<f32>().unwrap().get(i).unwrap())),
        ValueType::F64 => Json::from(a.as_typed::<f64>().unwrap().get(i).unwrap()),
        ValueType::Bool => Json::from(a.as_typed::<bool>().unwrap().get(i).unwrap()),
        other => panic!("no JSON for {other}"),
    }
}

/// A scalar value as JSON, floats widened exactly (f32 → f64) as gguf-py does.
pub fn scalar_json(v: &Value) -> Json {
    match v {
        Value::F32(f) => Json::from(f64::from(*f)),
        Value::F64(f) => Json::from(*f),
        Value::Bool(b) => Json::from(*b),
        Value::String(s) => Json::from(s.as_str()),
        Value::U64(u) => Json::from(*u),
        other => Json::from(other.as_integer().unwrap() as i64),
    }
}

/// Asserts `file` reads as the summary `expected` says gguf-py read it.
pub fn assert_matches_summary(file: &GgufFile, expected: &Json) {
    let name = expected["file"].as_str().unwrap();
    assert_eq!(
        file.bytes().len() as u64,
        expected["size"].as_u64().unwrap(),
        "{name}: size"
    );
    assert_eq!(
        hex(fnv1a(file.bytes(), FNV_OFFSET)),
        expected["fnv1a64"],
        "{name}: same file"
    );
    assert_eq!(
        u64::from(file.version()),
        expected["version"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        file.alignment(),
        expected["alignment"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        file.data_offset(),
        expected["data_offset"].as_u64().unwrap(),
        "{name}: data offset"
    );

    let kvs = expected["kv"].as_array().unwrap();
    let keys: Vec<&str> = file.metadata().iter().map(|e| e.key()).collect();
    let want: Vec<&str> = kvs.iter().map(|kv| kv["key"].as_str().unwrap()).collect();
    assert_eq!(keys, want, "{name}: keys in order");
    for kv in kvs {
        let key = kv["key"].as_str().unwrap();
        let ctx = format!("{name}: {key}");
        let entry = file.entry(key).unwrap();
        assert_eq!(
            entry.offset(),
            kv["offset"].as_u64().unwrap(),
            "{ctx}: offset"
        );
        assert_eq!(entry.value().value_type().name(), kv["type"], "{ctx}: type");
        match entry.value() {
            Value::Array(a) if kv.get("nested").is_some() => {
                assert_eq!(a.len() as u64, kv["len"].as_u64().unwrap(), "{ctx}: len");
                let leaves: Vec<i64> = a
                    .as_arrays()
                    .unwrap()
                    .iter()
                    .flat_map(|sub| sub.as_typed::<i32>().unwrap().to_vec())
                    .map(i64::from)
                    .collect();
                let want: Vec<i64> = kv["leaves"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_i64().unwrap())
                    .collect();
                assert_eq!(leaves, want, "{ctx}: leaves");
            }
            Value::Array(a) => {
                assert_eq!(a.elem_type().name(), kv["elem_type"], "{ctx}: element type");
                let len = a.len();
                assert_eq!(len as u64, kv["len"].as_u64().unwrap(), "{ctx}: len");
                let first: Vec<Json> = (0..len.min(5)).map(|i| element_json(a, i)).collect();
                assert_eq!(Json::from(first), kv["first"], "{ctx}: first elements");
                let last: Vec<Json> = (len.saturating_sub(3)..len)
                    .map(|i| element_json(a, i))
                    .collect();
                assert_eq!(Json::from(last), kv["last"], "{ctx}: last elements");
                assert_eq!(hex(array_hash(a)), kv["fnv1a64"], "{ctx}: all elements");
            }
            Value::String(s) => {
                assert_eq!(s.len() as u64, kv["len"].as_u64().unwrap(), "{ctx}: len");
                assert_eq!(
                    hex(fnv1a(s.as_bytes(), FNV_OFFSET)),
                    kv["fnv1a64"],
                    "{ctx}: bytes"
                );
                if let Some(v) = kv.get("value") {
                    assert_eq!(s, v.as_str().unwrap(), "{ctx}");
                }
            }
            scalar => assert_eq!(scalar_json(scalar), kv["value"], "{ctx}: value"),
        }
    }

    let tensors = expected["tensors"].as_array().unwrap();
    assert_eq!(file.tensors().len(), tensors.len(), "{name}: tensor count");
    for (t, want) in file.tensors().iter().zip(tensors) {
        let ctx = format!("{name}: tensor {}", t.name());
        assert_eq!(t.name(), want["name"], "{ctx}");
        assert_eq!(
            u64::from(t.ggml_type().id()),
            want["type"].as_u64().unwrap(),
            "{ctx}: type"
        );
        let dims: Vec<u64> = want["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims(), &dims[..], "{ctx}: dims");
        assert_eq!(
            t.data_start(),
            want["data_offset"].as_u64().unwrap(),
            "{ctx}: data offset"
        );
        assert_eq!(
            t.n_bytes(),
            want["n_bytes"].as_u64().unwrap(),
            "{ctx}: bytes"
        );
        if let Some(n) = want.get("n_elements") {
            assert_eq!(t.n_elements(), n.as_u64().unwrap(), "{ctx}: elements");
        }
        if let Some(h) = want.get("data_fnv1a64") {
            assert_eq!(
                hex(fnv1a(&file.tensor_data(t), FNV_OFFSET)),
                *h,
                "{ctx}: data"
            );
        }
    }
}
