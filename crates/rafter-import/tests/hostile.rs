//! Hostile ONNX files (issue 28, item 6): empty, truncated at every byte, nested past any
//! reasonable depth, tensors whose dims overflow a size computation or whose data runs
//! short. Each must be an error naming the file and what is wrong, never a panic, a stack
//! overflow or an allocation sized by the file's claims.

use bytes::Bytes;
use rafter_import::import_onnx_bytes;
use rafter_onnx_proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

const FLOAT: i32 = 1;

fn tensor(name: &str, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: FLOAT,
        raw_data: raw.into(),
        ..Default::default()
    }
}

fn model(graph: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

/// `y = Relu(w)` with a 4-float initializer `w`.
fn valid_graph(w: TensorProto) -> GraphProto {
    GraphProto {
        name: "g".into(),
        node: vec![NodeProto {
            op_type: "Relu".into(),
            name: "relu".into(),
            input: vec!["w".into()],
            output: vec!["y".into()],
            ..Default::default()
        }],
        initializer: vec![w],
        output: vec![ValueInfoProto {
            name: "y".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn import_err(bytes: Vec<u8>) -> String {
    match import_onnx_bytes(Bytes::from(bytes), None, "hostile.onnx") {
        Ok(_) => panic!("a hostile model imported"),
        Err(e) => e.to_string(),
    }
}

fn valid_bytes() -> Vec<u8> {
    model(valid_graph(tensor("w", &[4], vec![0; 16]))).encode_to_vec()
}

#[test]
fn the_valid_model_imports() {
    import_onnx_bytes(Bytes::from(valid_bytes()), None, "ok.onnx").unwrap();
}

#[test]
fn an_empty_file_is_not_a_model() {
    let e = import_err(Vec::new());
    assert!(e.starts_with("hostile.onnx: "), "{e}");
    assert!(e.contains("empty") || e.contains("no graph"), "{e}");
    // A model with an opset but no graph.
    let e = import_err(
        ModelProto {
            ir_version: 8,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    assert!(e.contains("no graph"), "{e}");
}

#[test]
fn truncated_at_every_byte_is_an_error() {
    let full = valid_bytes();
    for end in 0..full.len() {
        let r = std::panic::catch_unwind(|| {
            import_onnx_bytes(Bytes::copy_from_slice(&full[..end]), None, "cut.onnx")
        });
        match r {
            Ok(Ok(_)) => panic!("the model cut at byte {end} of {} imported", full.len()),
            Ok(Err(e)) => assert!(e.to_string().starts_with("cut.onnx: "), "{e}"),
            Err(_) => panic!("the model cut at byte {end} panicked"),
        }
    }
}

#[test]
fn subgraphs_nested_hundreds_deep_are_refused() {
    let mut g = valid_graph(tensor("w", &[4], vec![0; 16]));
    for i in 0..500 {
        g = GraphProto {
            name: format!("g{i}"),
            node: vec![NodeProto {
                op_type: "If".into(),
                input: vec!["c".into()],
                output: vec!["y".into()],
                attribute: vec![AttributeProto {
                    name: "then_branch".into(),
                    r#type: 5,
                    g: Some(g),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
    }
    // Encoding is recursive too: do it on a thread with room for it.
    let bytes = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let m = model(g);
            let b = m.encode_to_vec();
            // Dropping is recursive as well.
            std::mem::forget(m);
            b
        })
        .unwrap()
        .join()
        .unwrap();
    let e = import_err(bytes);
    assert!(e.contains("not a valid ONNX model"), "{e}");
}

#[test]
fn tensor_dims_that_overflow_or_lie_are_named_errors() {
    for (dims, raw) in [
        (vec![1i64 << 62, 4], vec![0u8; 16]),
        (vec![i64::MAX, i64::MAX], vec![0u8; 16]),
        (vec![-1, 4], vec![0u8; 16]),
        (vec![4], vec![0u8; 15]),
        (vec![1 << 40], Vec::new()),
    ] {
        let e = import_err(model(valid_graph(tensor("w", &dims, raw))).encode_to_vec());
        assert!(e.starts_with("hostile.onnx: "), "{dims:?}: {e}");
        assert!(
            e.contains("`w`") || e.contains("'w'") || e.contains(" w"),
            "{dims:?}: {e}"
        );
    }
}

#[test]
fn a_node_reading_an_undefined_value_names_it() {
    let mut g = valid_graph(tensor("w", &[4], vec![0; 16]));
    g.node[0].input = vec!["nowhere".into()];
    let e = import_err(model(g).encode_to_vec());
    assert!(e.contains("nowhere"), "{e}");
}

/// A graph input of element type `elem` and known `dims`.
fn typed_input(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(dimension::Value::DimValue(d)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Found by `fuzz/run_all.sh` (import_onnx, 2026-11-28): a Reshape whose shape operand
/// claims 2^40 elements made inference allocate 2^40 symbolic dims (an abort, not an
/// error). The same holds for every rank read from an operand's length.
#[test]
fn a_rank_read_from_a_huge_operand_length_is_refused() {
    const INT64: i32 = 7;
    for (op, second) in [
        ("Reshape", "shape"),
        ("Unsqueeze", "axes"),
        ("ConstantOfShape", ""),
    ] {
        let inputs = if second.is_empty() {
            vec!["s".to_string()]
        } else {
            vec!["x".to_string(), "s".to_string()]
        };
        let g = GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                op_type: op.into(),
                name: "n".into(),
                input: inputs,
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![
                typed_input("x", FLOAT, &[4]),
                typed_input("s", INT64, &[1 << 40]),
            ],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = import_err(model(g).encode_to_vec());
        assert!(e.contains("1099511627776"), "{op}: {e}");
        assert!(e.contains("rank"), "{op}: {e}");
    }
}
