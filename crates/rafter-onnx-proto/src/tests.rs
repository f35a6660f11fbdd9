use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::tensor_shape_proto::{dimension, Dimension};

fn tensor(name: &str, dt: i32, dims: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: dt,
        dims: dims.to_vec(),
        ..Default::default()
    }
}

/// Encodes and decodes through a `Bytes` buffer, as loading from a file does.
fn roundtrip(t: &TensorProto) -> (TensorProto, Bytes) {
    let buf = Bytes::from(t.encode_to_vec());
    (decode_tensor_proto(buf.clone()).unwrap(), buf)
}

fn ptr_inside(inner: &[u8], outer: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

/// A unique scratch directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "rafter-onnx-proto-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small_model() -> ModelProto {
    let weight = TensorProto {
        raw_data: Bytes::from((0u8..24).collect::<Vec<_>>()),
        ..tensor("W", 1, &[2, 3])
    };
    let input = ValueInfoProto {
        name: "X".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto {
                    dim: vec![
                        Dimension {
                            value: Some(dimension::Value::DimParam("N".into())),
                            ..Default::default()
                        },
                        Dimension {
                            value: Some(dimension::Value::DimValue(3)),
                            ..Default::default()
                        },
                    ],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = NodeProto {
        input: vec!["X".into(), "W".into()],
        output: vec!["Y".into()],
        op_type: "Gemm".into(),
        attribute: vec![
            AttributeProto {
                name: "transB".into(),
                r#type: attribute_proto::AttributeType::Int as i32,
                i: 1,
                ..Default::default()
            },
            AttributeProto {
                name: "alpha".into(),
                r#type: attribute_proto::AttributeType::Float as i32,
                f: 0.5,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    ModelProto {
        ir_version: 10,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 21,
        }],
        producer_name: "test".into(),
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![node],
            initializer: vec![weight],
            input: vec![input],
            ..Default::default()
        }),
        functions: vec![FunctionProto {
            name: "f".into(),
            domain: "local".into(),
            input: vec!["a".into()],
            output: vec!["b".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn model_roundtrip_and_zero_copy() {
    let model = small_model();
    let buf = Bytes::from(model.encode_to_vec());
    let decoded = decode_model(buf.clone()).unwrap();
    assert_eq!(decoded, model);
    let g = decoded.graph.as_ref().unwrap();
    assert_eq!(g.node[0].op_type, "Gemm");
    assert_eq!(g.node[0].attribute[0].i, 1);
    let w = &g.initializer[0];
    assert!(ptr_inside(&w.raw_data, &buf), "raw_data was copied");
    let t = decode_tensor(w, None).unwrap();
    assert!(matches!(t.data, TensorBytes::Raw(_)));
    assert!(ptr_inside(&t.data, &buf));
    assert_eq!(t.dims, vec![2, 3]);
    assert_eq!(t.numel(), 6);
    assert_eq!(&t.data[..], &(0u8..24).collect::<Vec<_>>()[..]);
}

#[test]
fn load_model_file_maps_and_names_file() {
    let dir = TempDir::new();
    let path = dir.0.join("m.onnx");
    std::fs::write(&path, small_model().encode_to_vec()).unwrap();
    let (model, buf) = load_model_file(&path).unwrap();
    let w = &model.graph.as_ref().unwrap().initializer[0];
    assert!(ptr_inside(&w.raw_data, &buf));
    assert_eq!(model, small_model());

    let missing = dir.0.join("nope.onnx");
    let err = load_model_file(&missing).unwrap_err();
    assert!(matches!(err, ProtoError::Io { .. }));
    assert!(err.to_string().contains("nope.onnx"), "{err}");

    let garbage = dir.0.join("garbage.onnx");
    std::fs::write(&garbage, [0xffu8; 7]).unwrap();
    let err = load_model_file(&garbage).unwrap_err();
    assert!(matches!(err, ProtoError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("garbage.onnx"), "{err}");

    let empty = dir.0.join("empty.onnx");
    std::fs::write(&empty, []).unwrap();
    let (m, _) = load_model_file(&empty).unwrap();
    assert_eq!(m, ModelProto::default());
}

fn check(t: TensorProto, expected: &[u8]) {
    let (d, _) = roundtrip(&t);
    let out = decode_tensor(&d, None).unwrap();
    assert!(matches!(out.data, TensorBytes::Converted(_)));
    assert_eq!(&out.data[..], expected, "tensor {}", t.name);
    assert_eq!(out.dims, t.dims);
    assert_eq!(out.data_type, t.data_type);
}

#[test]
fn typed_fields() {
    check(
        TensorProto {
            float_data: vec![1.0, -2.5],
            ..tensor("f32", 1, &[2])
        },
        &[0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0],
    );
    check(
        TensorProto {
            double_data: vec![1.0],
            ..tensor("f64", 11, &[])
        },
        &[0, 0, 0, 0, 0, 0, 0xf0, 0x3f],
    );
    check(
        TensorProto {
            int32_data: vec![-2, 0x01020304],
            ..tensor("i32", 6, &[2, 1])
        },
        &[0xfe, 0xff, 0xff, 0xff, 4, 3, 2, 1],
    );
    check(
        TensorProto {
            int32_data: vec![-1, 127, -128],
            ..tensor("i8", 3, &[3])
        },
        &[0xff, 0x7f, 0x80],
    );
    check(
        TensorProto {
            int32_data: vec![255, 0, 7],
            ..tensor("u8", 2, &[3])
        },
        &[0xff, 0, 7],
    );
    check(
        TensorProto {
            int32_data: vec![-2, 0x1234],
            ..tensor("i16", 5, &[2])
        },
        &[0xfe, 0xff, 0x34, 0x12],
    );
    check(
        TensorProto {
            int32_data: vec![0xffff, 1],
            ..tensor("u16", 4, &[2])
        },
        &[0xff, 0xff, 1, 0],
    );
    // f16 1.0 = 0x3c00, -2.0 = 0xc000 (bit patterns stored as non-negative ints).
    check(
        TensorProto {
            int32_data: vec![0x3c00, 0xc000],
            ..tensor("f16", 10, &[2])
        },
        &[0x00, 0x3c, 0x00, 0xc0],
    );
    // bf16 1.0 = 0x3f80.
    check(
        TensorProto {
            int32_data: vec![0x3f80],
            ..tensor("bf16", 16, &[1])
        },
        &[0x80, 0x3f],
    );
    check(
        TensorProto {
            int32_data: vec![1, 0, 5],
            ..tensor("bool", 9, &[3])
        },
        &[1, 0, 1],
    );
    check(
        TensorProto {
            int64_data: vec![-1, 2],
            ..tensor("i64", 7, &[2])
        },
        &[
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0, 0, 0,
        ],
    );
    check(
        TensorProto {
            uint64_data: vec![0xdeadbeef, 1],
            ..tensor("u32", 12, &[2])
        },
        &[0xef, 0xbe, 0xad, 0xde, 1, 0, 0, 0],
    );
    check(
        TensorProto {
            uint64_data: vec![u64::MAX],
            ..tensor("u64", 13, &[1])
        },
        &[0xff; 8],
    );
    // Empty tensor.
    check(tensor("empty", 1, &[0, 4]), &[]);
}

#[test]
fn size_mismatch_names_tensor_and_sizes() {
    let t = TensorProto {
        float_data: vec![1.0, 2.0, 3.0],
        ..tensor("weights", 1, &[2, 2])
    };
    let err = decode_tensor(&t, None).unwrap_err();
    match &err {
        ProtoError::SizeMismatch {
            name,
            expected,
            actual,
            source_field,
            ..
        } => {
            assert_eq!(name, "weights");
            assert_eq!((*expected, *actual), (16, 12));
            assert_eq!(*source_field, "float_data");
        }
        other => panic!("unexpected {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("weights") && msg.contains("16") && msg.contains("12"),
        "{msg}"
    );

    let t = TensorProto {
        raw_data: Bytes::from_static(&[0; 5]),
        ..tensor("raw", 6, &[1])
    };
    assert!(matches!(
        decode_tensor(&t, None),
        Err(ProtoError::SizeMismatch {
            expected: 4,
            actual: 5,
            ..
        })
    ));
}

#[test]
fn bad_dims_and_dtypes() {
    let t = tensor("neg", 1, &[2, -1]);
    assert!(matches!(
        decode_tensor(&t, None),
        Err(ProtoError::NegativeDim { .. })
    ));
    let t = tensor("huge", 7, &[i64::MAX, i64::MAX]);
    assert!(matches!(
        decode_tensor(&t, None),
        Err(ProtoError::SizeOverflow { .. })
    ));
    let t = TensorProto {
        string_data: vec![b"hi".to_vec()],
        ..tensor("s", 8, &[1])
    };
    let err = decode_tensor(&t, None).unwrap_err();
    assert!(matches!(err, ProtoError::StringTensor { .. }));
    assert!(err.to_string().contains("unsupported dtype string"));
    for (dt, tn) in [
        (17, "FLOAT8E4M3FN"),
        (22, "INT4"),
        (21, "UINT4"),
        (23, "FLOAT4E2M1"),
        (14, "COMPLEX64"),
        (0, "UNDEFINED"),
        (99, "UNKNOWN"),
    ] {
        match decode_tensor(&tensor("x", dt, &[1]), None) {
            Err(ProtoError::UnsupportedDtype {
                data_type,
                type_name,
                ..
            }) => assert_eq!((data_type, type_name), (dt, tn)),
            other => panic!("dtype {dt}: {other:?}"),
        }
    }
}

#[test]
fn data_type_names_match_enum() {
    use tensor_proto::DataType;
    for code in 0..=28 {
        let dt = DataType::try_from(code).unwrap();
        let upper = format!("{dt:?}").to_uppercase();
        assert_eq!(data_type_name(code), upper);
    }
    assert_eq!(data_type_name(29), "UNKNOWN");
}

fn external(name: &str, dt: i32, dims: &[i64], kv: &[(&str, &str)]) -> TensorProto {
    TensorProto {
        data_location: tensor_proto::DataLocation::External as i32,
        external_data: kv
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..tensor(name, dt, dims)
    }
}

#[test]
fn external_data() {
    let dir = TempDir::new();
    std::fs::create_dir(dir.0.join("sub")).unwrap();
    let payload: Vec<u8> = (0u8..64).collect();
    std::fs::write(dir.0.join("sub/w.bin"), &payload).unwrap();
    let mut loader = TensorLoader::new(Some(&dir.0));

    let t = external(
        "a",
        1,
        &[2, 2],
        &[("location", "sub/w.bin"), ("offset", "8"), ("length", "16")],
    );
    let (t, _) = roundtrip(&t);
    let a = loader.decode(&t).unwrap();
    assert!(matches!(a.data, TensorBytes::External(_)));
    assert_eq!(&a.data[..], &payload[8..24]);

    // No length: takes exactly the expected size; second tensor reuses the map.
    let b = loader
        .decode(&external(
            "b",
            7,
            &[3],
            &[("location", "./sub/w.bin"), ("offset", "40")],
        ))
        .unwrap();
    assert_eq!(&b.data[..], &payload[40..64]);
    let c = loader
        .decode(&external("c", 2, &[4], &[("location", "sub/w.bin")]))
        .unwrap();
    assert_eq!(&c.data[..], &payload[0..4]);
    // Both slices point into the same cached map.
    assert_eq!(a.data.as_ptr() as usize, c.data.as_ptr() as usize + 8);

    // Model-file based loader resolves against the model's directory.
    let mut from_model = TensorLoader::for_model_file(dir.0.join("model.onnx"));
    assert_eq!(from_model.decode(&t).unwrap(), a);

    // Length disagrees with dims.
    let err = loader
        .decode(&external(
            "d",
            1,
            &[2],
            &[("location", "sub/w.bin"), ("length", "4")],
        ))
        .unwrap_err();
    assert!(
        matches!(
            err,
            ProtoError::SizeMismatch {
                expected: 8,
                actual: 4,
                ..
            }
        ),
        "{err}"
    );

    // Out of range.
    let err = loader
        .decode(&external(
            "e",
            1,
            &[4],
            &[
                ("location", "sub/w.bin"),
                ("offset", "60"),
                ("length", "16"),
            ],
        ))
        .unwrap_err();
    assert!(
        matches!(err, ProtoError::ExternalRange { file_len: 64, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("w.bin"), "{err}");

    // Missing file.
    let err = loader
        .decode(&external("f", 1, &[1], &[("location", "missing.bin")]))
        .unwrap_err();
    assert!(matches!(err, ProtoError::ExternalIo { .. }), "{err}");
    assert!(err.to_string().contains("missing.bin"), "{err}");

    // Escaping or malformed locations.
    for kv in [
        vec![("location", "../w.bin")],
        vec![("location", "sub/../../w.bin")],
        vec![("location", "/etc/passwd")],
        vec![("location", "")],
        vec![("offset", "0")],
        vec![("location", "sub/w.bin"), ("offset", "-1")],
    ] {
        let err = loader.decode(&external("g", 2, &[1], &kv)).unwrap_err();
        assert!(
            matches!(err, ProtoError::ExternalData { .. }),
            "{kv:?}: {err}"
        );
    }

    // No base directory.
    let err = decode_tensor(&t, None).unwrap_err();
    assert!(matches!(err, ProtoError::ExternalData { .. }), "{err}");
}

#[test]
fn data_containers_roundtrip() {
    let seq = SequenceProto {
        name: "s".into(),
        elem_type: sequence_proto::DataType::Tensor as i32,
        tensor_values: vec![TensorProto {
            int64_data: vec![1, 2],
            ..tensor("t", 7, &[2])
        }],
        ..Default::default()
    };
    let opt = OptionalProto {
        name: "o".into(),
        elem_type: optional_proto::DataType::Sequence as i32,
        sequence_value: Some(seq.clone()),
        ..Default::default()
    };
    let map = MapProto {
        name: "m".into(),
        key_type: 7,
        keys: vec![1, 2],
        values: Some(seq.clone()),
        ..Default::default()
    };
    assert_eq!(decode_sequence(seq.encode_to_vec().into()).unwrap(), seq);
    assert_eq!(decode_optional(opt.encode_to_vec().into()).unwrap(), opt);
    assert_eq!(decode_map(map.encode_to_vec().into()).unwrap(), map);
}

/// Bytes as written by a proto2 encoder (unpacked repeated ints, explicit
/// fields) decode the same: dims=[2,3] unpacked, data_type=1, name="x".
#[test]
fn decodes_unpacked_proto2_encoding() {
    let wire = [
        0x08, 2, 0x08, 3, // dims (tag 1, varint) x2, unpacked
        0x10, 1, // data_type
        0x42, 1, b'x', // name (tag 8)
        0x4a, 0, // raw_data (tag 9) empty
    ];
    let t = decode_tensor_proto(Bytes::copy_from_slice(&wire)).unwrap();
    assert_eq!(t.dims, vec![2, 3]);
    assert_eq!(t.data_type, 1);
    assert_eq!(t.name, "x");
}
