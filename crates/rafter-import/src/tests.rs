//! Unit tests: tiny models built in memory with the prost structs.
//!
//! Translation tests use a stand-in for shape inference (the first operand's type, with a
//! few special cases) so they check the importer's own work; error tests that fail before
//! inference use the real entry points.

use crate::*;
use bytes::Bytes;
use rafter_ir::infer::{Fresh, InferInput, Inferred};
use rafter_ir::{
    AutoPad, BinaryOp, CoordTransform, DType, Dim, NearestMode, Op, PoolKind, ReduceKind,
    ResizeMode, Scalar, SoftmaxKind, TensorType, UnaryOp, ValueDef,
};
use rafter_onnx_proto::attribute_proto::AttributeType;
use rafter_onnx_proto::tensor_shape_proto::{dimension, Dimension};
use rafter_onnx_proto::*;

mod gather_block_quantized;

// ---- model builders ----

/// A tensor value declaration; dims are numbers, `?` (unknown) or parameter names.
fn tvi(name: &str, elem: i32, dims: &[&str]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: match *d {
                "?" => None,
                s => Some(match s.parse::<i64>() {
                    Ok(v) => dimension::Value::DimValue(v),
                    Err(_) => dimension::Value::DimParam(s.to_string()),
                }),
            },
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

fn f32_in(name: &str, dims: &[&str]) -> ValueInfoProto {
    tvi(name, 1, dims)
}

fn out(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        ..Default::default()
    }
}

fn node(
    op: &str,
    name: &str,
    ins: &[&str],
    outs: &[&str],
    attribute: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute,
        ..Default::default()
    }
}

fn attr(name: &str, ty: AttributeType) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: ty as i32,
        ..Default::default()
    }
}

fn ai(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        i,
        ..attr(name, AttributeType::Int)
    }
}

fn af(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        f,
        ..attr(name, AttributeType::Float)
    }
}

fn ais(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: ints.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

fn afs(name: &str, floats: &[f32]) -> AttributeProto {
    AttributeProto {
        floats: floats.to_vec(),
        ..attr(name, AttributeType::Floats)
    }
}

fn astr(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        s: s.as_bytes().to_vec(),
        ..attr(name, AttributeType::String)
    }
}

fn at(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

fn ag(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        g: Some(g),
        ..attr(name, AttributeType::Graph)
    }
}

fn t_f32(name: &str, dims: &[i64], vals: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 1,
        dims: dims.to_vec(),
        raw_data: Bytes::from(
            vals.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        ),
        ..Default::default()
    }
}

fn t_i64(name: &str, dims: &[i64], vals: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 7,
        dims: dims.to_vec(),
        int64_data: vals.to_vec(),
        ..Default::default()
    }
}

fn t_bool(name: &str, v: bool) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 9,
        int32_data: vec![v as i32],
        ..Default::default()
    }
}

fn graph(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: &[&str],
    inits: Vec<TensorProto>,
) -> GraphProto {
    GraphProto {
        name: "g".into(),
        node: nodes,
        input: inputs,
        output: outputs.iter().map(|o| out(o)).collect(),
        initializer: inits,
        ..Default::default()
    }
}

fn model(opset: i64, g: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: 8,
        producer_name: "unit-test".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(g),
        ..Default::default()
    }
}

fn bytes_of(m: &ModelProto) -> Bytes {
    Bytes::from(m.encode_to_vec())
}

/// Stand-in shape inference: every result gets the first operand's type, except for ops
/// whose dtype or rank obviously differs.
fn stub(
    op: &Op,
    ins: &[Option<InferInput<'_>>],
    n: usize,
    fresh: &mut Fresh<'_>,
) -> Result<Inferred, String> {
    let first = ins
        .iter()
        .flatten()
        .next()
        .map(|i| i.ty.clone())
        .unwrap_or_else(|| TensorType::known(DType::F32, &[]));
    let ty = match op {
        Op::Shape { .. } => TensorType::known(DType::I64, &[first.rank() as i64]),
        Op::Cast { to } => TensorType::new(*to, first.dims.clone()),
        Op::ConstantOfShape { value } => TensorType::new(value.dtype(), vec![fresh("cos")]),
        Op::Flatten { .. } => TensorType::new(first.dtype, vec![fresh("flat"), fresh("flat")]),
        Op::Binary {
            op: BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater,
        } => TensorType::new(DType::Bool, first.dims.clone()),
        _ => first,
    };
    Ok(Inferred {
        types: vec![ty; n],
        syms: vec![None; n],
    })
}

fn import_stub(m: &ModelProto) -> Result<Imported, ImportError> {
    import_onnx_bytes_with(bytes_of(m), None, "t.onnx", Box::new(stub))
}

fn import_real(m: &ModelProto) -> Result<Imported, ImportError> {
    import_onnx_bytes(bytes_of(m), None, "t.onnx")
}

fn ok(m: &ModelProto) -> Graph {
    import_stub(m).unwrap_or_else(|e| panic!("{e}")).graph
}

fn err(m: &ModelProto) -> ImportError {
    match import_stub(m) {
        Ok(_) => panic!("import succeeded"),
        Err(e) => e,
    }
}

/// `(op name, operand names)` of every node.
fn ops(g: &Graph) -> Vec<(String, Vec<String>)> {
    g.nodes
        .iter()
        .map(|n| {
            let ins = n
                .inputs
                .iter()
                .map(|i| i.map(|v| g.value(v).name.clone()).unwrap_or_default())
                .collect();
            (n.op.name().to_string(), ins)
        })
        .collect()
}

fn const_ints(g: &Graph, name: &str) -> Vec<i64> {
    let v = g
        .values
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no value {name}"));
    g.const_of(rafter_ir::ValueId(v as u32))
        .unwrap_or_else(|| panic!("{name} is not a constant"))
        .to_i64s()
        .unwrap()
}

fn unary_model(op: &str, opset: i64, attrs: Vec<AttributeProto>) -> ModelProto {
    model(
        opset,
        graph(
            vec![node(op, "n", &["x"], &["y"], attrs)],
            vec![f32_in("x", &["2", "3", "4"])],
            &["y"],
            vec![],
        ),
    )
}

// ---- error cases ----

#[test]
fn random_bytes_and_truncated_files_are_not_models() {
    let e = import_onnx_bytes(
        Bytes::from_static(&[0xff, 0x12, 0x99, 0x01, 0x7f]),
        None,
        "junk.onnx",
    )
    .unwrap_err();
    assert!(matches!(e, ImportError::Decode { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("junk.onnx: not a valid ONNX model: "),
        "{e}"
    );
    let m = model(
        17,
        graph(
            vec![node("Relu", "r", &["x"], &["y"], vec![])],
            vec![f32_in("x", &["4"])],
            &["y"],
            vec![t_f32("w", &[64], &[1.0; 64])],
        ),
    );
    let full = bytes_of(&m);
    let cut = full.slice(..full.len() / 2);
    let e = import_onnx_bytes(cut, None, "cut.onnx").unwrap_err();
    assert!(
        e.to_string().contains("cut.onnx: not a valid ONNX model"),
        "{e}"
    );

    let dir = std::env::temp_dir().join(format!("rafter-import-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("garbage.onnx");
    std::fs::write(&p, [0xffu8; 9]).unwrap();
    let e = import_onnx_file(&p).unwrap_err();
    assert!(
        e.to_string()
            .contains("garbage.onnx: not a valid ONNX model"),
        "{e}"
    );
    let e = import_onnx_file(&dir.join("missing.onnx")).unwrap_err();
    assert!(matches!(e, ImportError::Io { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_initializer_names_node_and_input() {
    let m = model(
        17,
        graph(
            vec![node("Conv", "X", &["x", "w"], &["y"], vec![])],
            vec![f32_in("x", &["1", "3", "8", "8"])],
            &["y"],
            vec![],
        ),
    );
    let e = import_real(&m).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.onnx: node `X` (Conv) input `w` is not defined by any node, initializer or graph input"
    );
    // Unnamed nodes are reported as OpType_<index>; a missing graph output too.
    let m = model(
        17,
        graph(
            vec![node("Relu", "", &["x"], &["y"], vec![])],
            vec![f32_in("x", &["4"])],
            &["z"],
            vec![],
        ),
    );
    let e = import_real(&m).unwrap_err();
    assert!(matches!(e, ImportError::UndefinedOutput { .. }), "{e}");
    assert!(e.to_string().contains("output `z` is not defined"), "{e}");
    let m = model(
        17,
        graph(
            vec![node("Relu", "", &["q"], &["y"], vec![])],
            vec![],
            &["y"],
            vec![],
        ),
    );
    assert!(import_real(&m)
        .unwrap_err()
        .to_string()
        .contains("node `Relu_0` (Relu) input `q`"));
}

#[test]
fn tensor_size_must_match_dims() {
    let mut w = t_f32("w", &[2, 3], &[0.0; 6]);
    w.raw_data = Bytes::from(vec![0u8; 20]);
    let m = model(
        17,
        graph(
            vec![node("Add", "a", &["x", "w"], &["y"], vec![])],
            vec![f32_in("x", &["2", "3"])],
            &["y"],
            vec![w],
        ),
    );
    let e = import_real(&m).unwrap_err();
    assert!(matches!(e, ImportError::Tensor { .. }), "{e}");
    let s = e.to_string();
    assert!(s.starts_with("t.onnx: initializer `w`: "), "{s}");
    assert!(
        s.contains("expected 24 bytes, but raw_data holds 20 bytes"),
        "{s}"
    );

    // The same in a Constant node's value.
    let mut t = t_i64("", &[3], &[1, 2]);
    t.name = String::new();
    let m = model(
        17,
        graph(
            vec![node("Constant", "c", &[], &["k"], vec![at("value", t)])],
            vec![],
            &["k"],
            vec![],
        ),
    );
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string().contains("node `c` (Constant) value") && e.to_string().contains("int64_data"),
        "{e}"
    );
}

#[test]
fn unknown_op_is_unsupported() {
    let m = unary_model("Foo", 17, vec![]);
    let e = import_real(&m).unwrap_err();
    match &e {
        ImportError::UnsupportedOp { node, op_type, .. } => {
            assert_eq!((node.as_str(), op_type.as_str()), ("n", "Foo"))
        }
        other => panic!("{other}"),
    }
    assert!(
        e.to_string()
            .contains("node `n` (Foo): unsupported op `Foo`"),
        "{e}"
    );
    let e = import_real(&unary_model("SequenceEmpty", 17, vec![])).unwrap_err();
    assert!(
        e.to_string().contains("sequence values are not supported"),
        "{e}"
    );
}

#[test]
fn foreign_domains_are_unsupported() {
    for (domain, op, why) in [
        (
            "ai.onnx.ml",
            "TreeEnsemble",
            "unsupported op in domain `ai.onnx.ml`".to_string(),
        ),
        (
            "org.example",
            "Relu",
            "unsupported op in domain `org.example`".into(),
        ),
        (
            "com.microsoft",
            "SparseAttention",
            "unsupported op `SparseAttention` in domain `com.microsoft` (not among the contrib ops \
             rafter translates; see docs/contrib-ops.md)"
                .into(),
        ),
    ] {
        let mut m = unary_model(op, 17, vec![]);
        m.graph.as_mut().unwrap().node[0].domain = domain.into();
        m.opset_import.push(OperatorSetIdProto {
            domain: domain.into(),
            version: 1,
        });
        let e = import_real(&m).unwrap_err();
        assert!(matches!(e, ImportError::UnsupportedOp { .. }), "{e}");
        assert_eq!(e.to_string(), format!("t.onnx: node `n` ({op}): {why}"));
    }
    // A contrib op rafter translates, with an attribute value it does not.
    let mut m = unary_model("FusedMatMul", 17, vec![ai("transBatchA", 1)]);
    m.graph.as_mut().unwrap().node[0].domain = "com.microsoft".into();
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("node `n` (FusedMatMul): unsupported: transBatchA=1"),
        "{e}"
    );
    // FusedConv names an activation MLAS does not fuse.
    let mut m = unary_model("FusedConv", 17, vec![astr("activation", "Swish")]);
    m.graph.as_mut().unwrap().node[0].domain = "com.microsoft".into();
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("node `n` (FusedConv): unsupported: activation `Swish`"),
        "{e}"
    );
    // QGemm with a y_scale but no y_zero_point has no output type to quantize to.
    let mut m = unary_model("QGemm", 17, vec![]);
    let node = &mut m.graph.as_mut().unwrap().node[0];
    node.domain = "com.microsoft".into();
    node.input = ["x", "x", "x", "x", "x", "x", "", "x"]
        .map(String::from)
        .to_vec();
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("node `n` (QGemm): unsupported: y_scale without y_zero_point"),
        "{e}"
    );
    // A model of ai.onnx.ml only still names the node, not the missing opset.
    let mut m = unary_model("TreeEnsemble", 17, vec![]);
    m.graph.as_mut().unwrap().node[0].domain = "ai.onnx.ml".into();
    m.opset_import[0].domain = "ai.onnx.ml".into();
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("unsupported op in domain `ai.onnx.ml`"),
        "{e}"
    );
    // "ai.onnx" is the default domain.
    let mut m = unary_model("Relu", 17, vec![]);
    m.graph.as_mut().unwrap().node[0].domain = "ai.onnx".into();
    ok(&m);
}

#[test]
fn opset_range_is_checked() {
    let e = import_real(&unary_model("Relu", 0, vec![])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.onnx: opset 0 is older than the oldest supported (1)"
    );
    let e = import_real(&unary_model("Relu", 29, vec![])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.onnx: opset 29 is newer than the newest supported (28)"
    );
    let mut m = unary_model("Relu", 17, vec![]);
    m.opset_import.clear();
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("no opset of the default ONNX domain"),
        "{e}"
    );
    ok(&unary_model("Relu", 7, vec![]));
    ok(&unary_model("Relu", 28, vec![]));
}

#[test]
fn cycles_are_reported_with_their_nodes() {
    let m = model(
        17,
        graph(
            vec![
                node("Relu", "head", &["x"], &["h"], vec![]),
                node("Add", "a", &["h", "d"], &["c"], vec![]),
                node("Neg", "b", &["c"], &["d"], vec![]),
            ],
            vec![f32_in("x", &["4"])],
            &["c"],
            vec![],
        ),
    );
    let e = import_real(&m).unwrap_err();
    match &e {
        ImportError::Cycle { nodes, .. } => {
            assert_eq!(nodes, &["`a` (Add)".to_string(), "`b` (Neg)".to_string()])
        }
        other => panic!("{other}"),
    }
    assert!(
        e.to_string()
            .ends_with("has a cycle: `a` (Add) -> `b` (Neg) -> `a` (Add)"),
        "{e}"
    );
    // A self-loop.
    let m = model(
        17,
        graph(
            vec![node("Add", "s", &["x", "y"], &["y"], vec![])],
            vec![f32_in("x", &["4"])],
            &["y"],
            vec![],
        ),
    );
    assert!(import_real(&m)
        .unwrap_err()
        .to_string()
        .contains("`s` (Add) -> `s` (Add)"));
}

#[test]
fn unsorted_nodes_are_sorted() {
    let m = model(
        17,
        graph(
            vec![
                node("Neg", "second", &["h"], &["y"], vec![]),
                node("Relu", "first", &["x"], &["h"], vec![]),
            ],
            vec![f32_in("x", &["4"])],
            &["y"],
            vec![],
        ),
    );
    let g = ok(&m);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
}

#[test]
fn unsupported_input_types() {
    let seq = ValueInfoProto {
        name: "s".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::SequenceType(type_proto::Sequence {
                elem_type: Some(Box::new(tvi("", 1, &["2"]).r#type.unwrap())),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let map = ValueInfoProto {
        name: "s".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::MapType(type_proto::Map {
                key_type: 7,
                value_type: None,
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let opt = ValueInfoProto {
        name: "s".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::OptionalType(type_proto::Optional {
                elem_type: None,
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut unranked = tvi("s", 1, &[]);
    if let Some(type_proto::Value::TensorType(t)) =
        unranked.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.shape = None;
    }
    let cases = [
        (seq, "sequence values are not supported"),
        (map, "map values are not supported"),
        (opt, "optional values are not supported"),
        (tvi("s", 8, &["2"]), "element type STRING is not supported"),
        (
            tvi("s", 17, &["2"]),
            "element type FLOAT8E4M3FN is not supported",
        ),
        (unranked, "unknown rank"),
    ];
    for (vi, want) in cases {
        let m = model(
            17,
            graph(
                vec![node("Identity", "i", &["s"], &["y"], vec![])],
                vec![vi],
                &["y"],
                vec![],
            ),
        );
        let e = import_real(&m).unwrap_err();
        assert!(matches!(e, ImportError::UnsupportedInput { .. }), "{e}");
        assert!(
            e.to_string().starts_with("t.onnx: graph input `s`: "),
            "{e}"
        );
        assert!(e.to_string().contains(want), "{e} / {want}");
    }
}

#[test]
fn sparse_tensors_are_unsupported() {
    let mut g = graph(vec![], vec![], &[], vec![]);
    g.sparse_initializer.push(SparseTensorProto {
        values: Some(t_f32("sp", &[1], &[1.0])),
        indices: Some(t_i64("", &[1], &[0])),
        dims: vec![4],
    });
    let e = import_real(&model(17, g)).unwrap_err();
    assert!(
        e.to_string()
            .contains("`sp`: sparse initializers are not supported"),
        "{e}"
    );
    let mut sparse = attr("sparse_value", AttributeType::SparseTensor);
    sparse.sparse_tensor = Some(SparseTensorProto::default());
    let m = model(
        17,
        graph(
            vec![node("Constant", "c", &[], &["k"], vec![sparse])],
            vec![],
            &["k"],
            vec![],
        ),
    );
    let e = import_real(&m).unwrap_err();
    assert!(
        e.to_string()
            .contains("node `c` (Constant): unsupported: sparse"),
        "{e}"
    );
}

#[test]
fn shape_errors_name_the_node() {
    let m = model(
        17,
        graph(
            vec![node("Add", "adder", &["x", "x"], &["y"], vec![])],
            vec![f32_in("x", &["4"])],
            &["y"],
            vec![],
        ),
    );
    let e = import_onnx_bytes_with(
        bytes_of(&m),
        None,
        "t.onnx",
        Box::new(|_, _, _, _| Err("no".to_string())),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.onnx: node `adder` (Add): shape inference failed: no"
    );
}

// ---- graph inputs, constants, outputs ----

#[test]
fn inputs_symbols_and_initializers() {
    let mut g = graph(
        vec![node("Add", "a", &["x", "w"], &["y"], vec![])],
        vec![
            tvi("x", 1, &["batch size", "?", "3"]),
            // Old IR versions list weights as inputs too.
            f32_in("w", &["3"]),
        ],
        &["y", "x", "w"],
        vec![t_f32("w", &[3], &[1.0, 2.0, 3.0])],
    );
    g.name = String::new();
    let m = model(17, g);
    let buf = bytes_of(&m);
    let imp = import_onnx_bytes_with(buf.clone(), None, "dir/m.onnx", Box::new(stub)).unwrap();
    assert_eq!(imp.opset, 17);
    assert_eq!(imp.producer, "unit-test");
    let g = &imp.graph;
    assert_eq!(g.name, "m");
    assert_eq!(g.inputs.len(), 1);
    let x = g.value(g.inputs[0]);
    assert_eq!(x.name, "x");
    assert_eq!(x.ty.to_string(), "f32[batch_size, x_d1, 3]");
    // The initializer is a constant that shares the model's bytes.
    let w = g.values.iter().find(|v| v.name == "w").unwrap();
    let ValueDef::Const(c) = w.def else {
        panic!("w is not a constant")
    };
    let data = &g.constant(c).bytes;
    let (lo, hi) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
    assert!(
        (lo..hi).contains(&(data.as_ptr() as usize)),
        "weights were copied"
    );
    // Outputs may be graph inputs and initializers directly.
    let outs: Vec<&str> = g
        .outputs
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    assert_eq!(outs, ["y", "x", "w"]);
}

#[test]
fn constant_forms() {
    let m = model(
        17,
        graph(
            vec![
                node(
                    "Constant",
                    "c0",
                    &[],
                    &["t"],
                    vec![at("value", t_i64("", &[2], &[4, 5]))],
                ),
                node("Constant", "c1", &[], &["f"], vec![af("value_float", 1.5)]),
                node(
                    "Constant",
                    "c2",
                    &[],
                    &["fs"],
                    vec![afs("value_floats", &[1.0, 2.0])],
                ),
                node("Constant", "c3", &[], &["i"], vec![ai("value_int", 7)]),
                node(
                    "Constant",
                    "c4",
                    &[],
                    &["is"],
                    vec![ais("value_ints", &[1, 2, 3])],
                ),
            ],
            vec![],
            &["t", "f", "fs", "i", "is"],
            vec![],
        ),
    );
    let g = ok(&m);
    assert!(g.nodes.is_empty());
    let ty = |n: &str| {
        g.values
            .iter()
            .find(|v| v.name == n)
            .unwrap()
            .ty
            .to_string()
    };
    assert_eq!(ty("t"), "i64[2]");
    assert_eq!(ty("f"), "f32[]");
    assert_eq!(ty("fs"), "f32[2]");
    assert_eq!(ty("i"), "i64[]");
    assert_eq!(ty("is"), "i64[3]");
    assert_eq!(const_ints(&g, "t"), [4, 5]);
    assert_eq!(const_ints(&g, "i"), [7]);
}

// ---- op translations ----

#[test]
fn slice_attributes_become_operands() {
    let m = model(
        9,
        graph(
            vec![node(
                "Slice",
                "s",
                &["x"],
                &["y"],
                vec![ais("starts", &[1]), ais("ends", &[3]), ais("axes", &[-1])],
            )],
            vec![f32_in("x", &["4", "4"])],
            &["y"],
            vec![],
        ),
    );
    let g = ok(&m);
    assert_eq!(
        ops(&g),
        [(
            "slice".to_string(),
            vec![
                "x".into(),
                "s/starts".into(),
                "s/ends".into(),
                "s/axes".into()
            ]
        )]
    );
    assert_eq!(const_ints(&g, "s/starts"), [1]);
    assert_eq!(const_ints(&g, "s/axes"), [-1]);
    // Slice-13 takes inputs as they are.
    let m = model(
        13,
        graph(
            vec![node("Slice", "s", &["x", "st", "en"], &["y"], vec![])],
            vec![f32_in("x", &["4"])],
            &["y"],
            vec![t_i64("st", &[1], &[0]), t_i64("en", &[1], &[2])],
        ),
    );
    assert_eq!(ops(&ok(&m))[0].1, ["x", "st", "en"]);
}

#[test]
fn reduce_axes_attribute_and_input() {
    let op_of = |g: &Graph| g.nodes.last().unwrap().op.clone();
    // Attribute form (ReduceMean before opset 18), negative axes normalised.
    let g = ok(&unary_model(
        "ReduceMean",
        13,
        vec![ais("axes", &[-1, 0]), ai("keepdims", 0)],
    ));
    assert_eq!(
        op_of(&g),
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![0, 2],
            keep_dims: false,
            noop_with_empty_axes: false,
        }
    );
    // Input form with a constant.
    let mk = |opset: i64, axes_const: bool, noop: bool| {
        let mut attrs = vec![];
        if noop {
            attrs.push(ai("noop_with_empty_axes", 1));
        }
        let mut inputs = vec![f32_in("x", &["2", "3"])];
        let mut inits = vec![];
        if axes_const {
            inits.push(t_i64("axes", &[1], &[1]));
        } else {
            inputs.push(tvi("axes", 7, &["1"]));
        }
        model(
            opset,
            graph(
                vec![node("ReduceSum", "r", &["x", "axes"], &["y"], attrs)],
                inputs,
                &["y"],
                inits,
            ),
        )
    };
    let g = ok(&mk(13, true, false));
    assert_eq!(
        op_of(&g),
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keep_dims: true,
            noop_with_empty_axes: false,
        }
    );
    // Axes known only at run time: the operand, with noop_with_empty_axes kept.
    for noop in [false, true] {
        let g = ok(&mk(13, false, noop));
        assert_eq!(
            op_of(&g),
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![],
                keep_dims: true,
                noop_with_empty_axes: noop,
            }
        );
        assert_eq!(ops(&g)[0].1, ["x", "axes"]);
    }
    // noop_with_empty_axes without axes is an identity.
    let m = model(
        18,
        graph(
            vec![node(
                "ReduceMax",
                "r",
                &["x"],
                &["y"],
                vec![ai("noop_with_empty_axes", 1)],
            )],
            vec![f32_in("x", &["2"])],
            &["y"],
            vec![],
        ),
    );
    assert_eq!(op_of(&ok(&m)), Op::Identity);
    // Without axes and without noop everything is reduced.
    let g = ok(&unary_model("ReduceL2", 18, vec![]));
    assert_eq!(
        op_of(&g),
        Op::Reduce {
            kind: ReduceKind::L2,
            axes: vec![],
            keep_dims: true,
            noop_with_empty_axes: false,
        }
    );
    // With real inference: an axes operand of unknown length decides the rank when
    // keepdims=0, which is unsupported; of known length it types the result.
    let mk_real = |len: &str, keep: i64| {
        model(
            18,
            graph(
                vec![node(
                    "ReduceMax",
                    "r",
                    &["x", "axes"],
                    &["y"],
                    vec![ai("keepdims", keep)],
                )],
                vec![f32_in("x", &["2", "3"]), tvi("axes", 7, &[len])],
                &["y"],
                vec![],
            ),
        )
    };
    let e = import_real(&mk_real("n", 0)).unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    assert!(
        e.to_string()
            .contains("node `r` (ReduceMax): unsupported: rank depends on run-time axes"),
        "{e}"
    );
    let g = import_real(&mk_real("1", 0)).unwrap().graph;
    assert_eq!(g.value(g.outputs[0]).ty.rank(), 1);
    let g = import_real(&mk_real("n", 1)).unwrap().graph;
    assert_eq!(g.value(g.outputs[0]).ty.rank(), 2);
}

#[test]
fn squeeze_unsqueeze_axes() {
    let g = ok(&unary_model("Unsqueeze", 11, vec![ais("axes", &[-1, 0])]));
    assert_eq!(g.nodes[0].op, Op::Unsqueeze { axes: vec![0, 4] });
    let m = model(
        13,
        graph(
            vec![node("Squeeze", "s", &["x", "a"], &["y"], vec![])],
            vec![f32_in("x", &["1", "3", "1"])],
            &["y"],
            vec![t_i64("a", &[1], &[-1])],
        ),
    );
    assert_eq!(ok(&m).nodes[0].op, Op::Squeeze { axes: vec![2] });
    let g = ok(&unary_model("Squeeze", 13, vec![]));
    assert_eq!(g.nodes[0].op, Op::Squeeze { axes: vec![] });
    // Axes known only at run time become the operand.
    for op in ["Squeeze", "Unsqueeze"] {
        let m = model(
            13,
            graph(
                vec![node(op, "s", &["x", "a"], &["y"], vec![])],
                vec![f32_in("x", &["1", "3"]), tvi("a", 7, &["1"])],
                &["y"],
                vec![],
            ),
        );
        let g = ok(&m);
        let want = if op == "Squeeze" {
            Op::Squeeze { axes: vec![] }
        } else {
            Op::Unsqueeze { axes: vec![] }
        };
        assert_eq!(g.nodes[0].op, want);
        assert_eq!(ops(&g)[0].1, ["x", "a"]);
    }
}

#[test]
fn split_sizes_attribute_input_and_num_outputs() {
    let mk = |opset: i64, ins: &[&str], attrs: Vec<AttributeProto>, inits: Vec<TensorProto>| {
        model(
            opset,
            graph(
                vec![node("Split", "sp", ins, &["a", "b"], attrs)],
                vec![f32_in("x", &["5", "2"])],
                &["a", "b"],
                inits,
            ),
        )
    };
    let g = ok(&mk(11, &["x"], vec![ais("split", &[2, 3])], vec![]));
    assert_eq!(ops(&g)[0].1, ["x", "sp/split"]);
    assert_eq!(const_ints(&g, "sp/split"), [2, 3]);
    assert_eq!(g.nodes[0].outputs.len(), 2);
    let g = ok(&mk(
        13,
        &["x", "s"],
        vec![ai("axis", -2)],
        vec![t_i64("s", &[2], &[1, 4])],
    ));
    assert_eq!(g.nodes[0].op, Op::Split { axis: 0 });
    assert_eq!(ops(&g)[0].1, ["x", "s"]);
    let g = ok(&mk(18, &["x"], vec![ai("num_outputs", 2)], vec![]));
    assert_eq!(ops(&g)[0].1, ["x"]);
    let e = err(&mk(18, &["x"], vec![ai("num_outputs", 3)], vec![]));
    assert!(e.to_string().contains("num_outputs is 3"), "{e}");
}

#[test]
fn pad2_and_clip6_attributes_become_operands() {
    let g = ok(&unary_model(
        "Pad",
        10,
        vec![
            ais("pads", &[0, 1, 0, 0, 1, 0]),
            af("value", 2.5),
            astr("mode", "constant"),
        ],
    ));
    assert_eq!(ops(&g)[0].1, ["x", "n/pads", "n/value"]);
    assert_eq!(const_ints(&g, "n/pads"), [0, 1, 0, 0, 1, 0]);
    let g = ok(&unary_model(
        "Pad",
        10,
        vec![ais("pads", &[0; 6]), astr("mode", "reflect")],
    ));
    assert_eq!(ops(&g)[0].1, ["x", "n/pads"]);
    assert_eq!(
        g.nodes[0].op,
        Op::Pad {
            mode: rafter_ir::PadMode::Reflect
        }
    );

    let g = ok(&unary_model(
        "Clip",
        9,
        vec![af("min", -1.0), af("max", 6.0)],
    ));
    assert_eq!(
        ops(&g)[0],
        (
            "clip".into(),
            vec!["x".into(), "n/min".into(), "n/max".into()]
        )
    );
    let min = g.values.iter().find(|v| v.name == "n/min").unwrap();
    assert_eq!(min.ty.to_string(), "f32[]");
    // Clip-6..10 default a missing bound to the f32 range; Clip-1 leaves it open.
    let g = ok(&unary_model("Clip", 9, vec![af("max", 6.0)]));
    assert_eq!(ops(&g)[0].1, ["x", "n/min", "n/max"]);
    let g = ok(&unary_model("Clip", 1, vec![af("max", 6.0)]));
    assert_eq!(ops(&g)[0].1, ["x", "", "n/max"]);
}

#[test]
fn upsample_becomes_resize() {
    let g = ok(&unary_model(
        "Upsample",
        7,
        vec![afs("scales", &[1.0, 2.0, 2.0]), astr("mode", "linear")],
    ));
    match &g.nodes[0].op {
        Op::Resize {
            mode,
            coordinate_transformation_mode,
            nearest_mode,
            ..
        } => {
            assert_eq!(*mode, ResizeMode::Linear);
            assert_eq!(*coordinate_transformation_mode, CoordTransform::Asymmetric);
            assert_eq!(*nearest_mode, NearestMode::Floor);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ops(&g)[0].1, ["x", "", "n/scales"]);
    // Resize-13 with an empty roi and scales and given sizes.
    let m = model(
        13,
        graph(
            vec![node("Resize", "r", &["x", "", "sc", "sz"], &["y"], vec![])],
            vec![f32_in("x", &["1", "1", "2", "2"])],
            &["y"],
            vec![t_f32("sc", &[0], &[]), t_i64("sz", &[4], &[1, 1, 4, 4])],
        ),
    );
    let g = ok(&m);
    assert_eq!(ops(&g)[0].1, ["x", "", "", "sz"]);
    assert!(matches!(
        g.nodes[0].op,
        Op::Resize {
            coordinate_transformation_mode: CoordTransform::HalfPixel,
            nearest_mode: NearestMode::RoundPreferFloor,
            ..
        }
    ));
}

#[test]
fn dropout_is_identity_with_an_all_true_mask() {
    let m = model(
        13,
        graph(
            vec![node("Dropout", "d", &["x", "r"], &["y", "mask"], vec![])],
            vec![f32_in("x", &["2", "2"])],
            &["y", "mask"],
            vec![t_f32("r", &[], &[0.5])],
        ),
    );
    let g = ok(&m);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["identity", "shape", "constant_of_shape"]);
    assert_eq!(
        g.nodes[2].op,
        Op::ConstantOfShape {
            value: Scalar::Bool(true)
        }
    );
    let mask = g.value(g.outputs[1]);
    assert_eq!((mask.name.as_str(), mask.ty.dtype), ("mask", DType::Bool));
    // training_mode=true is not an inference dropout.
    let m = model(
        13,
        graph(
            vec![node("Dropout", "d", &["x", "", "t"], &["y"], vec![])],
            vec![f32_in("x", &["2"])],
            &["y"],
            vec![t_bool("t", true)],
        ),
    );
    assert!(err(&m).to_string().contains("training_mode"));
    // ... unless the ratio is a constant 0: training keeps everything then, whatever
    // training_mode is at run time.
    let m = model(
        13,
        graph(
            vec![node(
                "Dropout",
                "d",
                &["x", "r", "t"],
                &["y", "mask"],
                vec![],
            )],
            vec![f32_in("x", &["2"]), tvi("t", 9, &[])],
            &["y", "mask"],
            vec![t_f32("r", &[], &[0.0])],
        ),
    );
    let g = ok(&m);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["identity", "shape", "constant_of_shape"]);
    // A run-time training_mode with a nonzero or run-time ratio stays unsupported.
    let m = model(
        13,
        graph(
            vec![node("Dropout", "d", &["x", "r", "t"], &["y"], vec![])],
            vec![f32_in("x", &["2"]), f32_in("r", &[]), tvi("t", 9, &[])],
            &["y"],
            vec![],
        ),
    );
    let e = err(&m);
    assert!(e.is_unsupported(), "{e}");
    assert!(e.to_string().contains("dynamic training_mode"), "{e}");
}

#[test]
fn old_softmax_coerces_to_2d() {
    let g = ok(&unary_model("Softmax", 11, vec![]));
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["flatten", "softmax", "shape", "reshape"]);
    assert_eq!(g.nodes[0].op, Op::Flatten { axis: 1 });
    assert_eq!(
        g.nodes[1].op,
        Op::Softmax {
            kind: SoftmaxKind::Softmax,
            axis: 1
        }
    );
    assert_eq!(ops(&g)[3].1, ["n/softmax2d", "n/shape"]);
    assert_eq!(g.value(g.outputs[0]).name, "y");
    // On the last axis the coercion changes nothing.
    let g = ok(&unary_model("LogSoftmax", 11, vec![ai("axis", 2)]));
    assert_eq!(
        g.nodes[..].iter().map(|n| n.op.clone()).collect::<Vec<_>>(),
        [Op::Softmax {
            kind: SoftmaxKind::LogSoftmax,
            axis: 2
        }]
    );
    let g = ok(&unary_model("Hardmax", 13, vec![]));
    assert_eq!(
        g.nodes[0].op,
        Op::Softmax {
            kind: SoftmaxKind::Hardmax,
            axis: 2
        }
    );
}

#[test]
fn variadic_ops_become_binary_chains() {
    let mk = |op: &str, n: usize, dt: i32| {
        let names: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        model(
            13,
            graph(
                vec![node(op, "v", &refs, &["y"], vec![])],
                names.iter().map(|n| tvi(n, dt, &["3"])).collect(),
                &["y"],
                vec![],
            ),
        )
    };
    let g = ok(&mk("Sum", 3, 1));
    assert_eq!(
        ops(&g),
        [
            ("binary".to_string(), vec!["x0".to_string(), "x1".into()]),
            (
                "binary".to_string(),
                vec!["v/acc0".to_string(), "x2".into()]
            ),
        ]
    );
    assert_eq!(g.value(g.outputs[0]).name, "y");
    let g = ok(&mk("Max", 1, 1));
    assert_eq!(g.nodes[0].op, Op::Identity);
    let g = ok(&mk("Min", 2, 1));
    assert_eq!(g.nodes[0].op, Op::Binary { op: BinaryOp::Min });
    let g = ok(&mk("Mean", 2, 10));
    assert_eq!(
        ops(&g)[1],
        (
            "binary".to_string(),
            vec!["v/acc0".into(), "v/count".into()]
        )
    );
    assert_eq!(g.nodes[1].op, Op::Binary { op: BinaryOp::Div });
    let count = g.values.iter().find(|v| v.name == "v/count").unwrap();
    assert_eq!(count.ty.to_string(), "f16[]");
    let ValueDef::Const(c) = count.def else {
        panic!()
    };
    assert_eq!(g.constant(c).to_f64s(), [2.0]);
}

#[test]
fn elementwise_variants() {
    let two = |op: &str, attrs: Vec<AttributeProto>, dt: i32| {
        model(
            13,
            graph(
                vec![node(op, "n", &["a", "b"], &["y"], attrs)],
                vec![tvi("a", dt, &["3"]), tvi("b", 7, &["3"])],
                &["y"],
                vec![],
            ),
        )
    };
    assert_eq!(
        ok(&two("Mod", vec![], 7)).nodes[0].op,
        Op::Binary { op: BinaryOp::Mod }
    );
    assert_eq!(
        ok(&two("Mod", vec![ai("fmod", 1)], 7)).nodes[0].op,
        Op::Binary { op: BinaryOp::FMod }
    );
    assert_eq!(
        ok(&two("BitShift", vec![astr("direction", "RIGHT")], 7)).nodes[0].op,
        Op::Binary {
            op: BinaryOp::ShiftRight
        }
    );
    assert_eq!(
        ok(&two("LessOrEqual", vec![], 7)).nodes[0].op,
        Op::Binary {
            op: BinaryOp::LessOrEqual
        }
    );
    assert_eq!(
        ok(&two("BitwiseXor", vec![], 7)).nodes[0].op,
        Op::Binary {
            op: BinaryOp::BitXor
        }
    );
    // CastLike casts to the target's dtype and drops the target.
    let g = ok(&two("CastLike", vec![], 1));
    assert_eq!(g.nodes[0].op, Op::Cast { to: DType::I64 });
    assert_eq!(ops(&g)[0].1, ["a"]);
    assert_eq!(
        ok(&unary_model("Not", 13, vec![])).nodes[0].op,
        Op::Unary { op: UnaryOp::Not }
    );
    assert_eq!(
        ok(&unary_model("Selu", 13, vec![])).nodes[0].op,
        Op::Selu {
            alpha: 1.673_263_2,
            gamma: 1.050_701
        }
    );
    assert_eq!(
        ok(&unary_model("Gelu", 20, vec![astr("approximate", "tanh")])).nodes[0].op,
        Op::Gelu {
            approximate: rafter_ir::GeluApprox::Tanh
        }
    );
    let e = err(&unary_model("Cast", 13, vec![ai("to", 8)]));
    assert!(
        e.to_string()
            .contains("unsupported: cast to element type STRING"),
        "{e}"
    );
}

#[test]
fn conv_and_pool_attributes() {
    let m = model(
        11,
        graph(
            vec![node(
                "Conv",
                "c",
                &["x", "w"],
                &["y"],
                vec![astr("auto_pad", "SAME_UPPER")],
            )],
            vec![f32_in("x", &["1", "3", "8", "8"])],
            &["y"],
            vec![t_f32("w", &[4, 3, 3, 3], &[0.0; 108])],
        ),
    );
    assert_eq!(
        ok(&m).nodes[0].op,
        Op::Conv {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![0, 0, 0, 0],
            dilations: vec![1, 1],
            group: 1,
            auto_pad: AutoPad::SameUpper,
        }
    );
    let g = ok(&unary_model(
        "MaxPool",
        12,
        vec![
            ais("kernel_shape", &[2]),
            ais("strides", &[2]),
            ai("ceil_mode", 1),
        ],
    ));
    assert_eq!(
        g.nodes[0].op,
        Op::Pool {
            kind: PoolKind::Max,
            kernel_shape: vec![2],
            strides: vec![2],
            pads: vec![0, 0],
            dilations: vec![1],
            auto_pad: AutoPad::NotSet,
            ceil_mode: true,
            count_include_pad: false,
            p: 0,
            storage_order: 0,
        }
    );
    let g = ok(&unary_model("GlobalLpPool", 12, vec![ai("p", 3)]));
    assert_eq!(
        g.nodes[0].op,
        Op::GlobalPool {
            kind: PoolKind::Lp,
            p: 3
        }
    );
    let e = err(&unary_model("AveragePool", 12, vec![]));
    assert!(e.to_string().contains("kernel_shape"), "{e}");
}

#[test]
fn batch_norm_training_is_unsupported() {
    let mk = |attrs: Vec<AttributeProto>, outs: &[&str]| {
        model(
            15,
            graph(
                vec![node(
                    "BatchNormalization",
                    "bn",
                    &["x", "s", "b", "m", "v"],
                    outs,
                    attrs,
                )],
                vec![f32_in("x", &["1", "2", "3"])],
                &["y"],
                ["s", "b", "m", "v"]
                    .iter()
                    .map(|n| t_f32(n, &[2], &[1.0, 1.0]))
                    .collect(),
            ),
        )
    };
    let g = ok(&mk(vec![af("epsilon", 1e-3)], &["y"]));
    assert_eq!(g.nodes[0].op, Op::BatchNorm { epsilon: 1e-3 });
    let e = err(&mk(vec![ai("training_mode", 1)], &["y"]));
    assert!(
        e.to_string()
            .contains("node `bn` (BatchNormalization): unsupported: training_mode=1"),
        "{e}"
    );
    let e = err(&mk(vec![], &["y", "rm", "rv"]));
    assert!(e.to_string().contains("training outputs"), "{e}");
}

#[test]
fn if_captures_become_operands() {
    let then_g = graph(
        vec![node("Add", "t_add", &["a", "k"], &["t_out"], vec![])],
        vec![],
        &["t_out"],
        vec![],
    );
    let else_g = graph(
        vec![node("Neg", "e_neg", &["b"], &["e_out"], vec![])],
        vec![],
        &["e_out"],
        vec![],
    );
    let m = model(
        13,
        graph(
            vec![
                node("Relu", "ra", &["x"], &["a"], vec![]),
                node("Relu", "rb", &["x"], &["b"], vec![]),
                node(
                    "If",
                    "branch",
                    &["c"],
                    &["y"],
                    vec![ag("then_branch", then_g), ag("else_branch", else_g)],
                ),
            ],
            vec![f32_in("x", &["3"]), tvi("c", 9, &[])],
            &["y"],
            vec![t_f32("k", &[3], &[1.0, 2.0, 3.0])],
        ),
    );
    let g = ok(&m);
    let node = g.nodes.last().unwrap();
    // cond, then the captures in order of first use; the constant `k` is copied instead.
    assert_eq!(ops(&g).last().unwrap().1, ["c", "a", "b"]);
    let Op::If {
        then_branch,
        else_branch,
    } = &node.op
    else {
        panic!("{:?}", node.op)
    };
    for br in [then_branch, else_branch] {
        let names: Vec<&str> = br
            .inputs
            .iter()
            .map(|&v| br.value(v).name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(br.outputs.len(), 1);
    }
    assert_eq!(then_branch.constants.len(), 1);
    assert_eq!(else_branch.constants.len(), 0);
    rafter_ir::verify(&g).unwrap();
}

#[test]
fn if_with_a_known_condition_is_inlined() {
    let then_g = graph(
        vec![node("Neg", "t", &["x"], &["t_out"], vec![])],
        vec![],
        &["t_out"],
        vec![],
    );
    let else_g = graph(
        vec![node("Foo", "never", &["x"], &["e_out"], vec![])],
        vec![],
        &["e_out"],
        vec![],
    );
    let m = model(
        13,
        graph(
            vec![node(
                "If",
                "branch",
                &["c"],
                &["y"],
                vec![ag("then_branch", then_g), ag("else_branch", else_g)],
            )],
            vec![f32_in("x", &["3"])],
            &["y"],
            vec![t_bool("c", true)],
        ),
    );
    let g = ok(&m);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["unary", "identity"]);
    assert_eq!(g.value(g.outputs[0]).name, "y");
}

fn loop_model(with_scan_output: bool) -> ModelProto {
    // for i in 0..M: acc = acc + step  (step is captured); optionally emit acc per iteration.
    let mut outs = vec!["cond_out", "acc_out"];
    if with_scan_output {
        outs.push("scan_out");
    }
    let mut nodes = vec![
        node("Identity", "ci", &["cond_in"], &["cond_out"], vec![]),
        node("Add", "add", &["acc_in", "step"], &["acc_out"], vec![]),
    ];
    if with_scan_output {
        nodes.push(node("Identity", "so", &["acc_in"], &["scan_out"], vec![]));
    }
    let body = graph(
        nodes,
        vec![
            tvi("i", 7, &[]),
            tvi("cond_in", 9, &[]),
            f32_in("acc_in", &["2"]),
        ],
        &outs,
        vec![],
    );
    let mut node_outs = vec!["acc_final"];
    if with_scan_output {
        node_outs.push("stacked");
    }
    model(
        13,
        graph(
            vec![
                node("Relu", "r", &["x"], &["step"], vec![]),
                node(
                    "Loop",
                    "loop",
                    &["m", "", "x"],
                    &node_outs,
                    vec![ag("body", body)],
                ),
            ],
            vec![f32_in("x", &["2"]), tvi("m", 7, &[])],
            &node_outs,
            vec![],
        ),
    )
}

#[test]
fn loop_captures_are_explicit() {
    let g = ok(&loop_model(false));
    let node = g.nodes.last().unwrap();
    assert_eq!(ops(&g).last().unwrap().1, ["m", "", "x", "step"]);
    let Op::Loop { body } = &node.op else {
        panic!()
    };
    let names: Vec<&str> = body
        .inputs
        .iter()
        .map(|&v| body.value(v).name.as_str())
        .collect();
    assert_eq!(names, ["i", "cond_in", "acc_in", "step"]);
    assert_eq!(body.value(body.inputs[0]).ty.to_string(), "i64[]");
    assert_eq!(body.outputs.len(), 2);

    // With scan outputs too, the captures are passed as loop-carried values so the split
    // between carried values and captures is not ambiguous.
    let g = ok(&loop_model(true));
    let node = g.nodes.last().unwrap();
    let Op::Loop { body } = &node.op else {
        panic!()
    };
    let outs: Vec<&str> = body
        .outputs
        .iter()
        .map(|&v| body.value(v).name.as_str())
        .collect();
    assert_eq!(outs, ["cond_out", "acc_out", "step", "scan_out"]);
    assert_eq!(node.outputs.len(), 3);
    assert!(node.outputs[1].is_none());
    let outs: Vec<&str> = g
        .outputs
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    assert_eq!(outs, ["acc_final", "stacked"]);
}

#[test]
fn loop_carried_dims_that_change_become_symbols() {
    // acc grows by concatenation each iteration: its dim is generalised to a fresh symbol.
    let body = graph(
        vec![
            node("Identity", "ci", &["cond_in"], &["cond_out"], vec![]),
            node(
                "Concat",
                "cat",
                &["acc_in", "acc_in"],
                &["acc_out"],
                vec![ai("axis", 0)],
            ),
        ],
        vec![
            tvi("i", 7, &[]),
            tvi("cond_in", 9, &[]),
            f32_in("acc_in", &["2"]),
        ],
        &["cond_out", "acc_out"],
        vec![],
    );
    let m = model(
        13,
        graph(
            vec![node(
                "Loop",
                "loop",
                &["m", "", "x"],
                &["y"],
                vec![ag("body", body)],
            )],
            vec![f32_in("x", &["2"]), tvi("m", 7, &[])],
            &["y"],
            vec![],
        ),
    );
    // Stand-in inference that knows Concat doubles axis 0.
    let infer = |op: &Op, ins: &[Option<InferInput<'_>>], n: usize, f: &mut Fresh<'_>| {
        if let Op::Concat { .. } = op {
            let t = ins[0].unwrap().ty;
            let d = t.dims[0].scale(2);
            return Ok(Inferred {
                types: vec![TensorType::new(t.dtype, vec![d])],
                syms: vec![None],
            });
        }
        stub(op, ins, n, f)
    };
    let g = import_onnx_bytes_with(bytes_of(&m), None, "t.onnx", Box::new(infer))
        .unwrap()
        .graph;
    let Op::Loop { body } = &g.nodes[0].op else {
        panic!()
    };
    let acc = &body.value(body.inputs[2]).ty;
    let sym = acc.dims[0]
        .as_symbol()
        .expect("a symbol")
        .name()
        .to_string();
    assert!(sym.starts_with("_loop"), "{sym}");
}

#[test]
fn scan_versions() {
    let body = graph(
        vec![node("Add", "add", &["s_in", "xs"], &["s_out"], vec![])],
        vec![f32_in("s_in", &["2"]), f32_in("xs", &["2"])],
        &["s_out", "s_out"],
        vec![],
    );
    let mk = |opset: i64, ins: &[&str]| {
        model(
            opset,
            graph(
                vec![node(
                    "Scan",
                    "scan",
                    ins,
                    &["final", "all"],
                    vec![ag("body", body.clone()), ai("num_scan_inputs", 1)],
                )],
                vec![f32_in("s0", &["2"]), f32_in("seq", &["5", "2"])],
                &["final", "all"],
                vec![],
            ),
        )
    };
    let e = err(&mk(8, &["", "s0", "seq"]));
    assert!(e.to_string().contains("unsupported: Scan-8"), "{e}");
    let g = ok(&mk(9, &["s0", "seq"]));
    let Op::Scan {
        body,
        num_scan_inputs,
        num_captures,
        scan_input_axes,
        scan_output_axes,
        ..
    } = &g.nodes[0].op
    else {
        panic!()
    };
    assert_eq!((*num_scan_inputs, *num_captures), (1, 0));
    assert_eq!(
        (scan_input_axes.as_slice(), scan_output_axes.as_slice()),
        (&[0][..], &[0][..])
    );
    // The scanned input arrives one slice at a time.
    assert_eq!(body.value(body.inputs[1]).ty.to_string(), "f32[2]");
}

#[test]
fn check_support_lists_everything() {
    let body = graph(
        vec![node("Bar", "inner_bar", &["x"], &["d"], vec![])],
        vec![],
        &["d"],
        vec![],
    );
    let mut ml = node("TreeEnsemble", "tree", &["x"], &["b"], vec![]);
    ml.domain = "ai.onnx.ml".into();
    let m = model(
        17,
        graph(
            vec![
                node("Foo", "foo", &["x"], &["f"], vec![]),
                ml,
                node(
                    "If",
                    "if",
                    &["c"],
                    &["d2"],
                    vec![ag("then_branch", body.clone()), ag("else_branch", body)],
                ),
                node("ReduceSum", "rs", &["x", "axes"], &["r"], vec![]),
                node("Relu", "fine", &["x"], &["y"], vec![]),
            ],
            vec![
                f32_in("x", &["2"]),
                tvi("c", 9, &[]),
                tvi("axes", 7, &["1"]),
                tvi("s", 8, &["1"]),
            ],
            &["y"],
            vec![],
        ),
    );
    let found = check_support(&m);
    let lines: Vec<String> = found.iter().map(|u| u.to_string()).collect();
    assert_eq!(
        lines,
        [
            "graph input `s`: element type STRING is not supported",
            "node `foo` (Foo): unsupported op `Foo`: not in rafter's op set",
            "node `tree` (TreeEnsemble): unsupported op in domain `ai.onnx.ml`",
            "node `inner_bar` (Bar): unsupported op `Bar`: not in rafter's op set",
            "node `inner_bar` (Bar): unsupported op `Bar`: not in rafter's op set",
        ]
    );
    assert_eq!(found[3].graph, "g/if/then_branch");
    let mut old = m.clone();
    old.opset_import[0].version = 0;
    assert_eq!(
        check_support(&old)[0].to_string(),
        "opset 0 is older than the oldest supported (1)"
    );
    assert!(check_support(&unary_model("Relu", 17, vec![])).is_empty());
}

#[test]
fn fresh_symbols_are_unique_and_avoid_declared_names() {
    let m = model(
        17,
        graph(
            vec![
                node("NonZero", "nz", &["x"], &["a"], vec![]),
                node("NonZero", "nz2", &["x"], &["b"], vec![]),
            ],
            vec![tvi("x", 1, &["_nz0"])],
            &["a", "b"],
            vec![],
        ),
    );
    let infer = |_: &Op, _: &[Option<InferInput<'_>>], n: usize, f: &mut Fresh<'_>| {
        Ok(Inferred {
            types: vec![TensorType::new(DType::I64, vec![Dim::known(1), f("nz")]); n],
            syms: vec![None; n],
        })
    };
    let g = import_onnx_bytes_with(bytes_of(&m), None, "t.onnx", Box::new(infer))
        .unwrap()
        .graph;
    let a = g.value(g.outputs[0]).ty.to_string();
    let b = g.value(g.outputs[1]).ty.to_string();
    assert_eq!((a.as_str(), b.as_str()), ("i64[1, _nz1]", "i64[1, _nz2]"));
}

#[test]
fn external_data_is_resolved_next_to_the_model() {
    let dir = std::env::temp_dir().join(format!("rafter-import-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let weights: Vec<u8> = [0.5f32, 1.5, 2.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut blob = vec![0u8; 16];
    blob.extend_from_slice(&weights);
    std::fs::write(dir.join("w.bin"), &blob).unwrap();
    let kv = |k: &str, v: &str| StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    let w = TensorProto {
        name: "w".into(),
        data_type: 1,
        dims: vec![3],
        data_location: tensor_proto::DataLocation::External as i32,
        external_data: vec![
            kv("location", "w.bin"),
            kv("offset", "16"),
            kv("length", "12"),
        ],
        ..Default::default()
    };
    let m = model(
        17,
        graph(
            vec![node("Add", "a", &["x", "w"], &["y"], vec![])],
            vec![f32_in("x", &["3"])],
            &["y"],
            vec![w],
        ),
    );
    let path = dir.join("m.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let g = import_onnx_file(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .graph;
    assert_eq!(g.constants[0].to_f64s(), [0.5, 1.5, 2.5]);
    assert!(check_support_file(&path).unwrap().is_empty());
    // Without a base directory external data cannot be found.
    let e = import_onnx_bytes(bytes_of(&m), None, "mem").unwrap_err();
    assert!(e.to_string().contains("mem: initializer `w`"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn attributes_the_ir_cannot_express_are_rejected() {
    // An attribute the translation never reads would be silently dropped: reject it.
    let e = err(&unary_model("Relu", 17, vec![ai("mystery", 1)]));
    assert!(
        e.to_string()
            .contains("node `n` (Relu): unsupported: attribute `mystery`"),
        "{e}"
    );
    // Precision knobs are fine.
    let m = model(
        17,
        graph(
            vec![node(
                "LayerNormalization",
                "ln",
                &["x", "s"],
                &["y"],
                vec![ai("stash_type", 1)],
            )],
            vec![f32_in("x", &["2", "4"])],
            &["y"],
            vec![t_f32("s", &[4], &[1.0; 4])],
        ),
    );
    ok(&m);
    let m = model(
        25,
        graph(
            vec![node(
                "Attention",
                "att",
                &["q", "q", "q"],
                &["y"],
                vec![ai("left_window_size", 2)],
            )],
            vec![f32_in("q", &["1", "2", "4", "8"])],
            &["y"],
            vec![],
        ),
    );
    // Attention-25's sliding window is carried by the op.
    let g = ok(&m);
    assert!(matches!(
        g.nodes[0].op,
        Op::Attention {
            left_window_size: 2,
            right_window_size: -1,
            ..
        }
    ));
}

#[test]
fn dft_axis_forms_are_normalised() {
    // DFT-17 takes the axis as an attribute; DFT-20 as an input, folded when constant and
    // defaulting to -2.
    let x = || f32_in("x", &["1", "8", "6", "1"]);
    let m = model(
        17,
        graph(
            vec![node(
                "DFT",
                "d",
                &["x"],
                &["y"],
                vec![ai("axis", 2), ai("onesided", 1)],
            )],
            vec![x()],
            &["y"],
            vec![],
        ),
    );
    let g = import_real(&m).unwrap().graph;
    assert_eq!(
        g.nodes[0].op,
        Op::Dft {
            axis: Some(2),
            inverse: false,
            onesided: true
        }
    );
    assert_eq!(g.value(g.outputs[0]).ty.to_string(), "f32[1, 8, 4, 2]");
    let m = model(
        20,
        graph(
            vec![node("DFT", "d", &["x"], &["y"], vec![])],
            vec![x()],
            &["y"],
            vec![],
        ),
    );
    let g = import_real(&m).unwrap().graph;
    assert!(matches!(g.nodes[0].op, Op::Dft { axis: Some(2), .. }));
    let axis = t_i64("a", &[], &[1]);
    let m = model(
        20,
        graph(
            vec![node(
                "DFT",
                "d",
                &["x", "", "a"],
                &["y"],
                vec![ai("inverse", 1)],
            )],
            vec![x()],
            &["y"],
            vec![axis],
        ),
    );
    let g = import_real(&m).unwrap().graph;
    assert!(matches!(
        g.nodes[0].op,
        Op::Dft {
            axis: Some(1),
            inverse: true,
            ..
        }
    ));
    assert_eq!(g.value(g.outputs[0]).ty.to_string(), "f32[1, 8, 6, 2]");
}

#[test]
fn space_to_depth_crd_is_spelled_out() {
    let m = model(
        28,
        graph(
            vec![node(
                "SpaceToDepth",
                "s2d",
                &["x"],
                &["y"],
                vec![ai("blocksize", 2), astr("mode", "CRD")],
            )],
            vec![f32_in("x", &["1", "3", "4", "6"])],
            &["y"],
            vec![],
        ),
    );
    let g = ok(&m);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(names, ["reshape", "transpose", "reshape"]);
    assert_eq!(const_ints(&g, "s2d/split_shape"), [1, 3, 2, 2, 3, 2]);
    assert_eq!(const_ints(&g, "s2d/merged_shape"), [1, 12, 2, 3]);
    let g = ok(&unary_model("SpaceToDepth", 13, vec![ai("blocksize", 2)]));
    assert_eq!(g.nodes[0].op, Op::SpaceToDepth { blocksize: 2 });
}

#[test]
fn losses_and_misc_ops_translate() {
    let m = model(
        22,
        graph(
            vec![
                node(
                    "NegativeLogLikelihoodLoss",
                    "nll",
                    &["x", "t", "w"],
                    &["l"],
                    vec![astr("reduction", "sum"), ai("ignore_index", -1)],
                ),
                node(
                    "SoftmaxCrossEntropyLoss",
                    "sce",
                    &["x", "t"],
                    &["s", "lp"],
                    vec![],
                ),
                node(
                    "TensorScatter",
                    "ts",
                    &["x", "x"],
                    &["c"],
                    vec![astr("mode", "circular")],
                ),
                node(
                    "CenterCropPad",
                    "ccp",
                    &["x", "sh"],
                    &["cc"],
                    vec![ais("axes", &[-1])],
                ),
            ],
            vec![
                f32_in("x", &["2", "3", "4"]),
                tvi("t", 7, &["2", "4"]),
                f32_in("w", &["3"]),
                tvi("sh", 7, &["1"]),
            ],
            &["l", "s", "lp", "c", "cc"],
            vec![],
        ),
    );
    let g = import_real(&m).unwrap_or_else(|e| panic!("{e}")).graph;
    assert_eq!(
        g.nodes[0].op,
        Op::NllLoss {
            reduction: rafter_ir::LossReduction::Sum,
            ignore_index: Some(-1),
        }
    );
    assert_eq!(
        g.nodes[1].op,
        Op::SoftmaxCrossEntropy {
            reduction: rafter_ir::LossReduction::Mean,
            ignore_index: None,
        }
    );
    let tys: Vec<String> = g
        .outputs
        .iter()
        .map(|&v| g.value(v).ty.to_string())
        .collect();
    assert_eq!(
        tys,
        [
            "f32[]",
            "f32[]",
            "f32[2, 3, 4]",
            "f32[2, 3, 4]",
            "f32[2, 3, _center_crop_pad0]"
        ]
    );
    assert_eq!(
        g.nodes[2].op,
        Op::TensorScatter {
            axis: 1,
            mode: rafter_ir::TensorScatterMode::Circular,
        }
    );
    assert_eq!(g.nodes[3].op, Op::CenterCropPad { axes: vec![2] });
}

#[test]
fn ai_onnx_ml_ops_import() {
    let ml = |op: &str, ins: &[&str], attrs: Vec<AttributeProto>| {
        let mut n = node(op, "n", ins, &["y"], attrs);
        n.domain = "ai.onnx.ml".into();
        n
    };
    // A model of ai.onnx.ml only (no default-domain opset), as ONNX's ml tests are.
    let mut m = model(
        1,
        graph(
            vec![ml("Binarizer", &["x"], vec![af("threshold", 0.5)])],
            vec![f32_in("x", &["2", "3"])],
            &["y"],
            vec![],
        ),
    );
    m.opset_import[0].domain = "ai.onnx.ml".into();
    let g = import_real(&m).unwrap_or_else(|e| panic!("{e}")).graph;
    assert_eq!(g.nodes[0].op, Op::Binarizer { threshold: 0.5 });

    let encoder = |attrs| {
        let mut m = model(
            17,
            graph(
                vec![ml("LabelEncoder", &["x"], attrs)],
                vec![tvi("x", 7, &["5"])],
                &["y"],
                vec![],
            ),
        );
        m.opset_import.push(OperatorSetIdProto {
            domain: "ai.onnx.ml".into(),
            version: 4,
        });
        import_real(&m)
    };
    let g = encoder(vec![
        ais("keys_int64s", &[1, 2]),
        afs("values_floats", &[0.5, 1.5]),
        af("default_float", 7.0),
    ])
    .unwrap_or_else(|e| panic!("{e}"))
    .graph;
    assert_eq!(
        g.nodes[0].op,
        Op::LabelEncoder {
            int_keys: vec![1, 2],
            float_keys: vec![],
            int_values: vec![],
            float_values: vec![0.5, 1.5],
            default: Scalar::Float(DType::F32, 7.0),
        }
    );
    assert_eq!(g.value(g.outputs[0]).ty.to_string(), "f32[5]");
    // Tensor values take their dtype; the default is -1 of it.
    let g = encoder(vec![
        at("keys_tensor", t_i64("k", &[2], &[1, 2])),
        at("values_tensor", t_i64("v", &[2], &[10, 20])),
    ])
    .unwrap_or_else(|e| panic!("{e}"))
    .graph;
    assert_eq!(
        g.nodes[0].op,
        Op::LabelEncoder {
            int_keys: vec![1, 2],
            float_keys: vec![],
            int_values: vec![10, 20],
            float_values: vec![],
            default: Scalar::Int(DType::I64, -1),
        }
    );
    let strings = AttributeProto {
        strings: vec![b"a".to_vec()],
        ..attr("keys_strings", AttributeType::Strings)
    };
    let e = encoder(vec![strings, ais("values_int64s", &[1])]).unwrap_err();
    assert!(e.to_string().contains("string keys"), "{e}");
    let e = encoder(vec![
        ais("keys_int64s", &[1, 2]),
        ais("values_int64s", &[1]),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("2 keys but 1 values"), "{e}");
    let e = encoder(vec![afs("keys_floats", &[1.0]), ais("values_int64s", &[1])]).unwrap_err();
    assert!(
        e.to_string()
            .contains("float keys for an input of dtype i64"),
        "{e}"
    );
}
