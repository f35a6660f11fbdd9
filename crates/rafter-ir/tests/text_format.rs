//! The text format: round trips, hand-written IR, errors, and random graphs.

use bytes::Bytes;
use half::{bf16, f16};
use rafter_ir::text::{
    parse_dim, parse_graph, parse_type, print_graph, print_graph_elided, ParseError, DENSE_LIMIT,
};
use rafter_ir::*;
use std::collections::HashMap;

fn t(dtype: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

fn k(n: i64) -> Dim {
    Dim::known(n)
}

fn s(name: &str) -> Dim {
    Dim::symbol(name)
}

fn out(name: &str, ty: TensorType) -> Option<(String, TensorType)> {
    Some((name.to_string(), ty))
}

/// Prints, parses, compares, and checks that printing is a fixed point.
#[track_caller]
fn round_trip(g: &Graph) -> String {
    let text = print_graph(g);
    let back = match parse_graph(&text) {
        Ok(b) => b,
        Err(e) => panic!("{e}\n--- text ---\n{text}"),
    };
    assert_eq!(&back, g, "--- text ---\n{text}");
    assert_eq!(print_graph(&back), text);
    text
}

fn const_of<T: Copy>(
    dtype: DType,
    dims: &[usize],
    xs: &[T],
    enc: impl Fn(T) -> Vec<u8>,
) -> ConstData {
    let bytes: Vec<u8> = xs.iter().flat_map(|&x| enc(x)).collect();
    ConstData::new(dtype, dims.to_vec(), Bytes::from(bytes)).unwrap()
}

fn every_dtype_constants(g: &mut Graph) -> Vec<ValueId> {
    let f32s = [
        1.0f32,
        -0.0,
        0.1,
        f32::MIN_POSITIVE / 8.0,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        3.4e-38,
    ];
    let mut v = vec![
        g.add_const(
            "c_f32",
            const_of(DType::F32, &[2, 4], &f32s, |x| x.to_le_bytes().to_vec()),
        ),
        g.add_const(
            "c_f64",
            const_of(
                DType::F64,
                &[3],
                &[0.1f64, -1e300, f64::NEG_INFINITY],
                |x| x.to_le_bytes().to_vec(),
            ),
        ),
        g.add_const(
            "c_f16",
            const_of(
                DType::F16,
                &[4],
                &[
                    f16::from_f32(0.1),
                    f16::MIN_POSITIVE_SUBNORMAL,
                    f16::MAX,
                    f16::NAN,
                ],
                |x| x.to_le_bytes().to_vec(),
            ),
        ),
        g.add_const(
            "c_bf16",
            const_of(
                DType::BF16,
                &[2],
                &[bf16::from_f32(3.3), bf16::NEG_INFINITY],
                |x| x.to_le_bytes().to_vec(),
            ),
        ),
        g.add_const(
            "c_i8",
            const_of(DType::I8, &[3], &[-128i8, 0, 127], |x| {
                x.to_le_bytes().to_vec()
            }),
        ),
        g.add_const("c_u8", const_of(DType::U8, &[2], &[0u8, 255], |x| vec![x])),
        g.add_const(
            "c_i16",
            const_of(DType::I16, &[2], &[i16::MIN, i16::MAX], |x| {
                x.to_le_bytes().to_vec()
            }),
        ),
        g.add_const(
            "c_u16",
            const_of(DType::U16, &[1], &[u16::MAX], |x| x.to_le_bytes().to_vec()),
        ),
        g.add_const(
            "c_i32",
            const_of(DType::I32, &[2], &[i32::MIN, 7], |x| {
                x.to_le_bytes().to_vec()
            }),
        ),
        g.add_const(
            "c_u32",
            const_of(DType::U32, &[1], &[u32::MAX], |x| x.to_le_bytes().to_vec()),
        ),
        g.add_const("c_i64", ConstData::from_i64s(&[i64::MIN, -1, 0, i64::MAX])),
        g.add_const(
            "c_u64",
            const_of(DType::U64, &[2], &[u64::MAX, 1], |x| {
                x.to_le_bytes().to_vec()
            }),
        ),
        g.add_const(
            "c_bool",
            const_of(DType::Bool, &[3], &[true, false, true], |x| vec![x as u8]),
        ),
        // Scalars and empty tensors.
        g.add_const(
            "c_scalar",
            const_of(DType::F32, &[], &[2.5f32], |x| x.to_le_bytes().to_vec()),
        ),
        g.add_const(
            "c_empty",
            const_of(DType::I64, &[0, 3], &[] as &[i64], |x| {
                x.to_le_bytes().to_vec()
            }),
        ),
    ];
    // Not representable as a list: a NaN with a payload, a bool byte of 2.
    v.push(g.add_const(
        "c_nan_payload",
        const_of(
            DType::F32,
            &[2],
            &[f32::from_bits(0x7fc0_0001), f32::from_bits(0xffc0_0000)],
            |x| x.to_le_bytes().to_vec(),
        ),
    ));
    v.push(g.add_const(
        "c_bool_2",
        ConstData::new(DType::Bool, vec![2], Bytes::from(vec![2u8, 1])).unwrap(),
    ));
    // Large: printed as hex.
    let big: Vec<f32> = (0..DENSE_LIMIT as u32 + 1)
        .map(|i| i as f32 * 0.25)
        .collect();
    v.push(g.add_const("c_big", ConstData::from_f32s(&big)));
    v
}

fn branch(name: &str, neg: bool) -> Graph {
    let mut b = Graph::new(name);
    // Names may repeat the outer graph's; subgraphs have their own scope.
    let x = b.add_input("x", t(DType::F32, &[s("seq")]));
    let cap = b.add_input("cap", t(DType::F32, &[]));
    if neg {
        let y = b.add_node(
            "neg",
            Op::Unary { op: UnaryOp::Neg },
            vec![Some(x)],
            vec![out("x_neg", t(DType::F32, &[s("seq")]))],
        )[0]
        .unwrap();
        b.outputs.push(y);
    } else {
        b.outputs.push(x);
    }
    b.outputs.push(cap);
    b
}

/// A graph with every dtype, dim kind, attribute kind and naming oddity.
fn full_graph() -> Graph {
    let mut g = Graph::new("main");
    let batch = s("batch");
    let seq = s("seq");
    let past = s("past");
    let x = g.add_input("x", t(DType::F32, &[batch.clone(), seq.clone(), k(32)]));
    let mask = g.add_input(
        "input.1",
        t(
            DType::I64,
            &[
                batch.clone(),
                past.add(&seq),
                seq.scale(2),
                batch.mul(&seq).mul(&k(768)),
                seq.sub(&k(1)),
            ],
        ),
    );
    let consts = every_dtype_constants(&mut g);
    // An input declared after constants: its id is not its position in the text.
    let late = g.add_input("late input", t(DType::Bool, &[]));

    let img = g.add_input("gpu_0/data_0", t(DType::F32, &[k(1), k(3), k(224), k(224)]));
    let w = g.add_const(
        "gpu_0/conv1_w_0",
        ConstData::new(DType::F32, vec![2, 3, 1, 1], Bytes::from(vec![0u8; 24])).unwrap(),
    );
    let conv = g.add_node(
        "conv1",
        Op::Conv {
            kernel_shape: vec![1, 1],
            strides: vec![2, 2],
            pads: vec![0, 0, 0, 0],
            dilations: vec![1, 1],
            group: 1,
            auto_pad: AutoPad::NotSet,
        },
        vec![Some(img), Some(w), None],
        vec![out(
            "onnx::Relu_12",
            t(DType::F32, &[k(1), k(2), k(112), k(112)]),
        )],
    )[0]
    .unwrap();
    let resize = g.add_node(
        "/model/Resize",
        Op::Resize {
            mode: ResizeMode::Linear,
            coordinate_transformation_mode: CoordTransform::HalfPixel,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: true,
            axes: vec![],
            keep_aspect_ratio_policy: AspectPolicy::Stretch,
        },
        vec![Some(conv), None, Some(consts[0]), None],
        vec![out("resized", t(DType::F32, &[k(1), k(2), s("h"), s("w")]))],
    )[0]
    .unwrap();
    let shape = g.add_node(
        "",
        Op::Shape {
            start: 0,
            end: Some(-1),
        },
        vec![Some(resize)],
        vec![out("", t(DType::I64, &[k(3)]))],
    )[0]
    .unwrap();
    let filled = g.add_node(
        "fill",
        Op::ConstantOfShape {
            value: Scalar::Float(DType::F16, 0.5),
        },
        vec![Some(shape)],
        vec![out("", t(DType::F16, &[k(1), k(2), s("h")]))],
    )[0]
    .unwrap();
    let q = t(DType::F32, &[batch.clone(), k(4), seq.clone(), k(8)]);
    let att = g.add_node(
        "attn \"quoted\"",
        Op::Attention {
            is_causal: true,
            kv_num_heads: 4,
            q_num_heads: 4,
            qk_matmul_output_mode: 0,
            scale: None,
            softcap: 0.0,
            left_window_size: -1,
            right_window_size: -1,
        },
        vec![Some(x), Some(x), Some(x), None, None, None, None],
        vec![out("y", q.clone()), None, None, out("qk", q.clone())],
    );
    let att2 = g.add_node(
        "attn2",
        Op::Attention {
            is_causal: false,
            kv_num_heads: 2,
            q_num_heads: 4,
            qk_matmul_output_mode: 1,
            scale: Some(0.125),
            softcap: f32::INFINITY,
            left_window_size: 3,
            right_window_size: 0,
        },
        vec![att[0], att[0], att[0], Some(mask)],
        vec![out("y", q.clone())],
    )[0]
    .unwrap();
    // Every other attribute kind: string, dtype, scalars of each variant, float lists.
    let e = g.add_node(
        "ein",
        Op::Einsum {
            equation: "bhqd,bhkd->bhqk \"\\\n\t\u{1}ü".into(),
        },
        vec![Some(att2), Some(att2)],
        vec![out("y", q.clone())],
    )[0]
    .unwrap();
    let cast = g.add_node(
        "cast",
        Op::Cast { to: DType::BF16 },
        vec![Some(e)],
        vec![out("weird name\nwith newline", t(DType::BF16, &[k(-1)]))],
    )[0]
    .unwrap();
    let more: Vec<Op> = vec![
        Op::ConstantOfShape {
            value: Scalar::Int(DType::I64, -3),
        },
        Op::ConstantOfShape {
            value: Scalar::Int(DType::I8, i64::MIN),
        },
        Op::ConstantOfShape {
            value: Scalar::UInt(DType::U64, u64::MAX),
        },
        Op::ConstantOfShape {
            value: Scalar::Bool(true),
        },
        Op::ConstantOfShape {
            value: Scalar::Float(DType::F64, f64::NEG_INFINITY),
        },
        Op::ConstantOfShape {
            value: Scalar::Float(DType::I32, 1.5),
        },
        Op::Lstm {
            direction: RnnDirection::Bidirectional,
            hidden_size: 16,
            layout: 0,
            input_forget: false,
            clip: Some(1e-7),
            activations: vec![1, 2, 0],
            activation_alpha: vec![0.5, 1e30, -0.0],
            activation_beta: vec![],
        },
        Op::Gemm {
            alpha: 1.0,
            beta: 0.0,
            trans_a: false,
            trans_b: true,
        },
        Op::Compress { axis: None },
        Op::Shape {
            start: -2,
            end: None,
        },
        Op::MatMul,
        Op::Binary {
            op: BinaryOp::GreaterOrEqual,
        },
        Op::Gelu {
            approximate: GeluApprox::None,
        },
    ];
    let mut last = cast;
    for (i, op) in more.into_iter().enumerate() {
        last = g.add_node(
            format!("n{i}"),
            op,
            vec![Some(last), None],
            vec![out(&format!("t{i}"), t(DType::F32, &[s("n")]))],
        )[0]
        .unwrap();
    }
    let r = g.add_node(
        "if0",
        Op::If {
            then_branch: Box::new(branch("then", true)),
            else_branch: Box::new(branch("", false)),
        },
        vec![Some(late), Some(last), Some(filled)],
        vec![
            out("x", t(DType::F32, &[s("seq")])),
            out("r2", t(DType::F32, &[])),
        ],
    );
    // A node without results, one with only unused results.
    g.add_node("sink", Op::Identity, vec![r[0]], vec![]);
    g.add_node("", Op::Identity, vec![], vec![None, None]);
    g.outputs = vec![r[0].unwrap(), x, consts[3], r[0].unwrap(), att[3].unwrap()];
    g
}

#[test]
fn full_graph_round_trips() {
    let g = full_graph();
    verify(&g).unwrap();
    let text = round_trip(&g);
    // Spot checks of the printed form.
    for needle in [
        "graph @main(%x#0: f32[batch, seq, 32], %input.1: i64[batch, past + seq, 2*seq, 768*batch*seq, seq - 1], %\"late input\"#20: bool[], %gpu_0/data_0: f32[1, 3, 224, 224]) -> (%x#45, %x#0, %c_bf16, %x#45, %qk) {\n",
        "const %c_f32#2: f32[2, 4] = dense [1.0, -0.0, 0.1, 1.469368e-39, 3.4028235e38, inf, nan, 3.4e-38]\n  const %c_f64: f64[3] = dense [0.1, -1e300, -inf]\n",
        "const %c_bool: bool[3] = dense [true, false, true]",
        "const %c_i64: i64[4] = dense [-9223372036854775808, -1, 0, 9223372036854775807]",
        "const %c_nan_payload: f32[2] = hex \"0100c07f0000c0ff\"",
        "const %c_big: f32[65] = hex \"000000000000803e",
        "= conv{kernel_shape = [1, 1], strides = [2, 2], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}(%gpu_0/data_0, %gpu_0/conv1_w_0, _) @conv1",
        "coordinate_transformation_mode = half_pixel",
        "%#",
        "shape{start = 0, end = -1}",
        "constant_of_shape{value = f16 0.5}",
        "constant_of_shape{value = u64 18446744073709551615}",
        "constant_of_shape{value = bool true}",
        "constant_of_shape{value = f64 -inf}",
        "softcap = 0.0, left_window_size = -1, right_window_size = -1}",
        "scale = 0.125, softcap = inf, left_window_size = 3, right_window_size = 0}",
        "%y#",
        "cast{to = bf16}",
        "activation_alpha = [0.5, 1.0000000150474662e30, -0.0], activation_beta = []",
        "compress(%",
        "  identity(%x#",
        "  _, _ = identity()\n",
        "if{then_branch = graph @then(%x: f32[seq], %cap: f32[]) -> (%x_neg, %cap) {\n",
        "}, else_branch = graph @\"\"(%x: f32[seq], %cap: f32[]) -> (%x, %cap) {\n  }}(",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    let short = print_graph_elided(&g);
    assert!(
        short.contains("const %c_big: f32[65] = dense elided"),
        "{short}"
    );
    let e = parse_graph(&short).unwrap_err();
    assert!(e.message.contains("elided"), "{e}");
}

#[test]
fn reordered_tables_round_trip() {
    // Node order and constant order that differ from value order (as after passes that
    // rewrite values in place): every definition gets an explicit id where needed.
    let mut g = full_graph();
    g.nodes.swap(0, 3);
    for (i, n) in g.nodes.iter().enumerate() {
        for (o, v) in n.outputs.iter().enumerate() {
            if let Some(v) = v {
                g.values[v.0 as usize].def = ValueDef::Node {
                    node: NodeId(i as u32),
                    output: o,
                };
            }
        }
    }
    g.constants.swap(1, 4);
    for v in &mut g.values {
        if let ValueDef::Const(c) = &mut v.def {
            c.0 = match c.0 {
                1 => 4,
                4 => 1,
                x => x,
            };
        }
    }
    // An orphan constant and a constant two values share.
    g.constants.push(ConstData::from_i64s(&[1, 2]));
    g.constants.push(ConstData::from_i64s(&[3]));
    let cid = ConstId(g.constants.len() as u32 - 1);
    for name in ["shared", "shared"] {
        g.values.push(Value {
            name: name.into(),
            ty: TensorType::known(DType::I64, &[1]),
            def: ValueDef::Const(cid),
        });
    }
    // A constant whose value's type differs from its data.
    g.constants.push(ConstData::from_i64s(&[5]));
    g.values.push(Value {
        name: "reshaped".into(),
        ty: TensorType::known(DType::I64, &[]),
        def: ValueDef::Const(ConstId(g.constants.len() as u32 - 1)),
    });
    let text = round_trip(&g);
    assert!(text.contains("const _ = dense<i64[2]> [1, 2]"), "{text}");
    assert!(
        text.contains("const %reshaped: i64[] = dense<i64[1]> [5]"),
        "{text}"
    );
}

#[test]
fn hand_written_ir_parses() {
    let src = r#"
        // A small block.
        graph @main(%x: f32[batch, seq, 32], %mask: i64[batch, seq]) -> (%y, %x) {
          const %w: f32[2, 2] = dense [1, 2.0, 3.5, -4e0]   // ints are fine in float lists
          %t0: f32[batch, seq, 32] = binary{op = add}(%x, %w) @"add 0"
          %y: f32[batch, seq, 32], _, %inv: f32[batch, seq, 1] =
              layer_norm{axis = -1, epsilon = 1e-5}(%t0, %w, _)
          %r: f32[batch*seq, 16 * (1 + 1)] = reshape{allow_zero = false}(%y, %mask)
        }
    "#;
    let mut want = Graph::new("main");
    let x = want.add_input("x", t(DType::F32, &[s("batch"), s("seq"), k(32)]));
    let mask = want.add_input("mask", t(DType::I64, &[s("batch"), s("seq")]));
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.5, -4.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let w = want.add_const(
        "w",
        ConstData::new(DType::F32, vec![2, 2], Bytes::from(bytes)).unwrap(),
    );
    let t0 = want.add_node(
        "add 0",
        Op::Binary { op: BinaryOp::Add },
        vec![Some(x), Some(w)],
        vec![out("t0", t(DType::F32, &[s("batch"), s("seq"), k(32)]))],
    )[0];
    let ln = want.add_node(
        "",
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        },
        vec![t0, Some(w), None],
        vec![
            out("y", t(DType::F32, &[s("batch"), s("seq"), k(32)])),
            None,
            out("inv", t(DType::F32, &[s("batch"), s("seq"), k(1)])),
        ],
    );
    want.add_node(
        "",
        Op::Reshape { allow_zero: false },
        vec![ln[0], Some(mask)],
        vec![out("r", t(DType::F32, &[s("batch").mul(&s("seq")), k(32)]))],
    );
    want.outputs = vec![ln[0].unwrap(), x];
    assert_eq!(parse_graph(src).unwrap(), want);
}

#[test]
fn hand_written_control_flow_and_ids() {
    let src = r#"
graph @loopy(%n: i64[], %"odd name": f32[4]) -> (%out#3, %"odd name") {
  %c: bool[] = cast{to = bool}(%n)
  %out#3: f32[4], %out#4: f32[4] = if{
    then_branch = graph @t(%v: f32[4]) -> (%v, %v) {},
    else_branch = graph @e(%v: f32[4]) -> (%w, %v) {
      %w: f32[4] = unary{op = neg}(%v) @neg
    }
  }(%c, %"odd name")
  const %#5: i64[] = dense [7]
  %#6: f32[4] = gemm{alpha = 1, beta = 0.5, trans_a = false, trans_b = true}(%out#4, %out#3, %#5)
}
"#;
    let g = parse_graph(src).unwrap();
    let mut then = Graph::new("t");
    let v = then.add_input("v", TensorType::known(DType::F32, &[4]));
    then.outputs = vec![v, v];
    let mut els = Graph::new("e");
    let v = els.add_input("v", TensorType::known(DType::F32, &[4]));
    let w = els.add_node(
        "neg",
        Op::Unary { op: UnaryOp::Neg },
        vec![Some(v)],
        vec![out("w", TensorType::known(DType::F32, &[4]))],
    )[0];
    els.outputs = vec![w.unwrap(), v];
    let mut want = Graph::new("loopy");
    let n = want.add_input("n", TensorType::known(DType::I64, &[]));
    let odd = want.add_input("odd name", TensorType::known(DType::F32, &[4]));
    let c = want.add_node(
        "",
        Op::Cast { to: DType::Bool },
        vec![Some(n)],
        vec![out("c", TensorType::known(DType::Bool, &[]))],
    )[0];
    let f4 = TensorType::known(DType::F32, &[4]);
    let r = want.add_node(
        "",
        Op::If {
            then_branch: Box::new(then),
            else_branch: Box::new(els),
        },
        vec![c, Some(odd)],
        vec![out("out", f4.clone()), out("out", f4.clone())],
    );
    let seven = want.add_const(
        "",
        ConstData::new(DType::I64, vec![], Bytes::from(7i64.to_le_bytes().to_vec())).unwrap(),
    );
    want.add_node(
        "",
        Op::Gemm {
            alpha: 1.0,
            beta: 0.5,
            trans_a: false,
            trans_b: true,
        },
        vec![r[1], r[0], Some(seven)],
        vec![out("", f4)],
    );
    want.outputs = vec![r[0].unwrap(), odd];
    assert_eq!(g, want);
    round_trip(&g);
}

#[test]
fn explicit_ids_reorder_values() {
    let src = "graph @g(%a#2: f32[]) -> (%b) {\n  %b#0: f32[] = identity(%a)\n  const %c#1: f32[] = dense [1.0]\n}";
    let g = parse_graph(src).unwrap();
    assert_eq!(
        g.values.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["b", "c", "a"]
    );
    assert_eq!(g.inputs, vec![ValueId(2)]);
    assert_eq!(g.outputs, vec![ValueId(0)]);
    assert_eq!(g.nodes[0].inputs, vec![Some(ValueId(2))]);
    assert_eq!(g.values[1].def, ValueDef::Const(ConstId(0)));
    round_trip(&g);
}

#[test]
fn types_and_dims_parse() {
    assert_eq!(
        parse_type("f32[]").unwrap(),
        TensorType::known(DType::F32, &[])
    );
    assert_eq!(
        parse_type("bf16[batch, past + seq, 2*seq, seq - 1]").unwrap(),
        t(
            DType::BF16,
            &[
                s("batch"),
                s("past").add(&s("seq")),
                s("seq").scale(2),
                s("seq").sub(&k(1))
            ]
        )
    );
    assert_eq!(
        parse_dim("(a + 1)*(a - 1)").unwrap(),
        s("a").mul(&s("a")).sub(&k(1))
    );
    assert_eq!(parse_dim("3*4 - 2").unwrap(), k(10));
}

#[track_caller]
fn err(src: &str) -> ParseError {
    match parse_graph(src) {
        Ok(g) => panic!("parsed:\n{}", print_graph(&g)),
        Err(e) => e,
    }
}

#[track_caller]
fn check_err(src: &str, line: usize, col: usize, parts: &[&str]) {
    let e = err(src);
    assert_eq!((e.line, e.col), (line, col), "{e}");
    for p in parts {
        assert!(e.message.contains(p), "{e} lacks {p:?}");
    }
}

#[test]
fn errors_name_position_and_expectation() {
    // Unknown op.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = relu6(%x)\n}",
        2,
        15,
        &["expected an op name", "`relu6`"],
    );
    // Attribute of the wrong type.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = softmax{kind = softmax, axis = 1.5}(%x)\n}",
        2,
        39,
        &["attribute `axis` of `softmax`", "expected int, found float"],
    );
    // Unknown enum word.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = binary{op = plus}(%x, %x)\n}",
        2,
        22,
        &["unknown BinaryOp `plus`"],
    );
    // Missing attribute: reported at the op.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = cast(%x)\n}",
        2,
        15,
        &["attribute `to` of `cast`", "found none"],
    );
    // Unknown attribute.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = cast{to = f32, saturate = true}(%x)\n}",
        2,
        30,
        &[
            "unknown attribute `saturate` of `cast`",
            "expected one of to",
        ],
    );
    // Unknown value reference, in an operand and in the outputs.
    check_err(
        "graph @g(%x: f32[]) -> (%y) {\n  %y: f32[] = identity(%z)\n}",
        2,
        24,
        &[
            "expected a value defined in graph `@g`",
            "unknown value `%z`",
        ],
    );
    check_err(
        "graph @g(%x: f32[]) -> (%nope) {\n}",
        1,
        25,
        &["unknown value `%nope`"],
    );
    // Ambiguous and mismatched references.
    check_err(
        "graph @g(%x: f32[], %x: f32[]) -> (%x) {}",
        1,
        36,
        &["ambiguous", "%x#0, %x#1"],
    );
    check_err(
        "graph @g(%x: f32[], %y: f32[]) -> (%y#0) {}",
        1,
        36,
        &["value #0 is `%x#0`"],
    );
    check_err(
        "graph @g(%x#5: f32[]) -> () {}",
        1,
        10,
        &["expected a value id below 1", "#5"],
    );
    check_err(
        "graph @g(%x#1: f32[], %y#0: f32[], %z: f32[]) -> () {}",
        1,
        36,
        &["#1", "already taken by `%x#1`"],
    );
    // Bad dim expressions.
    check_err(
        "graph @g(%x: f32[batch +]) -> () {}",
        1,
        25,
        &["expected a dim", "found `]`"],
    );
    check_err(
        "graph @g(%x: f32[2.5]) -> () {}",
        1,
        18,
        &["expected a dim", "found `2.5`"],
    );
    check_err(
        "graph @g(%x: f32[batch seq]) -> () {}",
        1,
        24,
        &["expected `,` or `]`", "found `seq`"],
    );
    let e = parse_dim("2 * * seq").unwrap_err();
    assert_eq!((e.line, e.col), (1, 5), "{e}");
    // Types, constants, syntax.
    check_err(
        "graph @g(%x: float[]) -> () {}",
        1,
        14,
        &["expected a dtype", "found `float`"],
    );
    check_err(
        "graph @g(%x:f32[]) -> () {}",
        1,
        16,
        &["expected `:`", "`%x:f32`", "space"],
    );
    check_err(
        "graph @g() -> () {\n  const %c: f32[3] = dense [1.0, 2.0]\n}",
        2,
        28,
        &["expected 3 elements for f32[3], found 2"],
    );
    check_err(
        "graph @g() -> () {\n  const %c: u8[1] = dense [256]\n}",
        2,
        28,
        &["expected a u8 element in 0..=255, found 256"],
    );
    check_err(
        "graph @g() -> () {\n  const %c: i32[1] = hex \"000000\"\n}",
        2,
        26,
        &["expected 4 bytes for i32[1], found 3"],
    );
    check_err(
        "graph @g() -> () {\n  const %c: f32[n] = dense [1.0]\n}",
        2,
        22,
        &["known non-negative dims"],
    );
    check_err(
        "graph @g() -> () {\n  const _ = dense [1.0]\n}",
        2,
        13,
        &["needs its type"],
    );
    check_err(
        "graph @g() -> () {\n  %y: f32[] = identity(%x\n}",
        3,
        1,
        &["expected `,` or `)`", "found `}`"],
    );
    check_err(
        "graph @g() -> () {\n",
        2,
        1,
        &["expected a statement", "found end of input"],
    );
    check_err(
        "graph @g() -> () {} extra",
        1,
        21,
        &["expected end of input", "`extra`"],
    );
    check_err(
        "graph @g() -> () { \"unterminated }",
        1,
        20,
        &["unterminated string"],
    );
    check_err(
        "graph @g() -> () { $ }",
        1,
        20,
        &["unexpected character `$`"],
    );
    check_err(
        "graph g() -> () {}",
        1,
        7,
        &["expected a graph name `@name`", "`g`"],
    );
    check_err(
        "graph @g(%x: f32[]) -> () {\n  %y: f32[] = binary{op = add, op = sub}(%x, %x)\n}",
        2,
        32,
        &["duplicate attribute `op`"],
    );
    check_err(
        "graph @g(%x: f32[]) -> () {\n  %y: f32[] = if{then_branch = 3, else_branch = 4}(%x)\n}",
        2,
        18,
        &["attribute `then_branch` of `if`: expected graph, found int"],
    );
    // Errors inside subgraphs point into them.
    check_err(
        "graph @g(%c: bool[]) -> () {\n  if{then_branch = graph @t() -> () {\n    identity(%c)\n  }, else_branch = graph @e() -> () {}}(%c)\n}",
        3,
        14,
        &["unknown value `%c`", "graph `@t`"],
    );
}

// ---------------------------------------------------------------------------------------
// Random graphs
// ---------------------------------------------------------------------------------------

/// SplitMix64: small, deterministic, good enough for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const NAMES: &[&str] = &[
    "x",
    "y",
    "input.1",
    "onnx::Reshape_12",
    "gpu_0/conv1_w_0",
    "",
    "a b",
    "q\"uote",
    "back\\slash",
    "x:",
    "a//b",
    "#3",
    "%",
    "@",
    "ünï",
    "tab\t",
    "1",
    "-",
    "_",
    "graph",
    "const",
    "dense",
    "->",
    "/model/layers.0/Add_output_0",
    "StatefulPartitionedCall/conv2d/BiasAdd:0",
    "nan",
    "inf",
];

const SYMBOLS: &[&str] = &["batch", "seq", "past", "_", "n1", "inf", "graph"];

fn rand_name(r: &mut Rng) -> String {
    if r.chance(1, 5) {
        format!("v{}", r.below(1000))
    } else {
        r.pick(NAMES).to_string()
    }
}

fn rand_dim(r: &mut Rng, depth: usize) -> Dim {
    match r.below(if depth == 0 { 2 } else { 6 }) {
        0 => Dim::known(*r.pick(&[0, 1, 3, 768, -1, 1 << 40])),
        1 => Dim::symbol(r.pick::<&str>(SYMBOLS)),
        2 => rand_dim(r, depth - 1).add(&rand_dim(r, depth - 1)),
        3 => rand_dim(r, depth - 1).sub(&rand_dim(r, depth - 1)),
        4 => rand_dim(r, depth - 1).scale(*r.pick(&[2, -3, 5])),
        _ => Dim::symbol(r.pick::<&str>(SYMBOLS)).mul(&rand_dim(r, depth - 1)),
    }
}

fn rand_type(r: &mut Rng) -> TensorType {
    let rank = r.below(4);
    TensorType::new(
        *r.pick(&DType::ALL),
        (0..rank).map(|_| rand_dim(r, 2)).collect(),
    )
}

fn rand_const(r: &mut Rng) -> ConstData {
    let dtype = *r.pick(&DType::ALL);
    let dims: Vec<usize> = match r.below(4) {
        0 => vec![],
        1 => vec![r.below(6)],
        2 => vec![r.below(4), r.below(4)],
        _ => vec![r.below(100)],
    };
    let n: usize = dims.iter().product::<usize>() * dtype.size_of();
    let bytes: Vec<u8> = (0..n)
        .map(|_| match dtype {
            // Mostly representable bools, sometimes not.
            DType::Bool if r.chance(9, 10) => r.below(2) as u8,
            _ => r.next() as u8,
        })
        .collect();
    ConstData::new(dtype, dims, Bytes::from(bytes)).unwrap()
}

fn rand_f64(r: &mut Rng) -> f64 {
    match r.below(6) {
        0 => *r.pick(&[
            0.0,
            -0.0,
            1.0,
            0.1,
            1e-7,
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            5e-324,
        ]),
        1 => r.below(100) as f64 - 50.0,
        _ => loop {
            let f = f64::from_bits(r.next());
            if !f.is_nan() {
                break f;
            }
        },
    }
}

fn rand_i64(r: &mut Rng) -> i64 {
    match r.below(3) {
        0 => *r.pick(&[0, 1, -1, i64::MIN, i64::MAX]),
        1 => r.below(10) as i64 - 3,
        _ => r.next() as i64,
    }
}

fn rand_string(r: &mut Rng) -> String {
    let pieces = [
        "abc", " ", "\"", "\\", "\n", "\t", "\u{7}", "ü", "->", "//", "{}", "%x",
    ];
    (0..r.below(5)).map(|_| *r.pick(&pieces)).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Float,
    Int,
    Bool,
    Floats,
    Ints,
    Str,
    DType,
    Scalar,
    Graph,
    Word(usize),
}

fn all_words() -> Vec<&'static str> {
    let mut w: Vec<&'static str> = Vec::new();
    w.extend(UnaryOp::ALL.iter().map(|x| x.word()));
    w.extend(BinaryOp::ALL.iter().map(|x| x.word()));
    w.extend(ReduceKind::ALL.iter().map(|x| x.word()));
    w.extend(ArgKind::ALL.iter().map(|x| x.word()));
    w.extend(SoftmaxKind::ALL.iter().map(|x| x.word()));
    w.extend(CumKind::ALL.iter().map(|x| x.word()));
    w.extend(PoolKind::ALL.iter().map(|x| x.word()));
    w.extend(AutoPad::ALL.iter().map(|x| x.word()));
    w.extend(PadMode::ALL.iter().map(|x| x.word()));
    w.extend(GeluApprox::ALL.iter().map(|x| x.word()));
    w.extend(ScatterReduction::ALL.iter().map(|x| x.word()));
    w.extend(ResizeMode::ALL.iter().map(|x| x.word()));
    w.extend(CoordTransform::ALL.iter().map(|x| x.word()));
    w.extend(NearestMode::ALL.iter().map(|x| x.word()));
    w.extend(AspectPolicy::ALL.iter().map(|x| x.word()));
    w.extend(DepthToSpaceMode::ALL.iter().map(|x| x.word()));
    w.extend(GridSampleMode::ALL.iter().map(|x| x.word()));
    w.extend(GridPadding::ALL.iter().map(|x| x.word()));
    w.extend(RnnDirection::ALL.iter().map(|x| x.word()));
    w.extend(WindowKind::ALL.iter().map(|x| x.word()));
    w.extend(RoiPoolMode::ALL.iter().map(|x| x.word()));
    w.extend(LinearAttnRule::ALL.iter().map(|x| x.word()));
    w.extend(LossReduction::ALL.iter().map(|x| x.word()));
    w.extend(TensorScatterMode::ALL.iter().map(|x| x.word()));
    w.extend(FfnActivation::ALL.iter().map(|x| x.word()));
    w.extend(WeightFormat::ALL.iter().map(|x| x.word()));
    w.sort();
    w.dedup();
    w
}

/// What each field of an op takes, found by asking `Op::from_parts`.
struct Field {
    name: &'static str,
    kind: Kind,
    /// Words the field accepts (for enum fields).
    words: Vec<&'static str>,
    optional: bool,
}

fn sample(kind: Kind, words: &[&'static str]) -> AttrValue {
    match kind {
        Kind::Float => AttrValue::Float(0.5),
        Kind::Int => AttrValue::Int(1),
        Kind::Bool => AttrValue::Bool(true),
        Kind::Floats => AttrValue::Floats(vec![0.5]),
        Kind::Ints => AttrValue::Ints(vec![1]),
        Kind::Str => AttrValue::Str("s".into()),
        Kind::DType => AttrValue::DType(DType::F32),
        Kind::Scalar => AttrValue::Scalar(Scalar::Bool(true)),
        Kind::Graph => AttrValue::Graph(Box::new(Graph::new("g"))),
        Kind::Word(i) => AttrValue::Word(words[i].to_string()),
    }
}

fn field_name(err: &str) -> &str {
    err.split('`').nth(1).unwrap()
}

fn discover(op: &'static str, words: &[&'static str]) -> Vec<Field> {
    let mut kinds = vec![
        Kind::Float,
        Kind::Int,
        Kind::Bool,
        Kind::Floats,
        Kind::Ints,
        Kind::Str,
    ];
    // Keywords before dtypes: a weight format's `f32`/`f16`/`bf16` read back as dtype
    // tokens, but its other keywords (`q4_k`) are words, so the field takes words.
    kinds.extend((0..words.len()).map(Kind::Word));
    kinds.extend([Kind::DType, Kind::Scalar, Kind::Graph]);
    let mut choice: HashMap<&'static str, usize> = HashMap::new();
    let built = loop {
        let res = Op::from_parts(op, |f| {
            let i = *choice.entry(f).or_insert(0);
            sample(kinds[i], words)
        });
        match res {
            Ok(op) => break op,
            Err(e) => {
                let f = field_name(&e).to_string();
                let c = choice.iter_mut().find(|(k, _)| **k == f).unwrap().1;
                *c += 1;
                assert!(*c < kinds.len(), "no attribute kind fits {op}.{f}");
            }
        }
    };
    let fields: Vec<&'static str> = built.attrs().iter().map(|(k, _)| *k).collect();
    fields
        .iter()
        .map(|&name| {
            let kind = kinds[choice[name]];
            let with = |v: AttrValue| {
                Op::from_parts(op, |f| {
                    if f == name {
                        v.clone()
                    } else {
                        sample(kinds[choice[f]], words)
                    }
                })
                .is_ok()
            };
            let accepted = match kind {
                Kind::Word(_) => words
                    .iter()
                    .copied()
                    .filter(|w| with(AttrValue::Word(w.to_string())))
                    .collect(),
                _ => vec![],
            };
            Field {
                name,
                kind,
                words: accepted,
                optional: with(AttrValue::None),
            }
        })
        .collect()
}

fn rand_attr(r: &mut Rng, f: &Field, depth: usize) -> AttrValue {
    if f.optional && r.chance(1, 3) {
        return AttrValue::None;
    }
    match f.kind {
        Kind::Float => AttrValue::Float(rand_f64(r)),
        Kind::Int => AttrValue::Int(rand_i64(r)),
        Kind::Bool => AttrValue::Bool(r.chance(1, 2)),
        Kind::Floats => AttrValue::Floats((0..r.below(4)).map(|_| rand_f64(r)).collect()),
        Kind::Ints => AttrValue::Ints((0..r.below(4)).map(|_| rand_i64(r)).collect()),
        Kind::Str => AttrValue::Str(rand_string(r)),
        Kind::DType => AttrValue::DType(*r.pick(&DType::ALL)),
        Kind::Scalar => {
            let d = *r.pick(&DType::ALL);
            AttrValue::Scalar(if d == DType::Bool {
                Scalar::Bool(r.chance(1, 2))
            } else if r.chance(1, 4) {
                // Float variant with any dtype: printed with a float literal.
                Scalar::Float(d, (r.below(9) as f64) * 0.5)
            } else if d.is_float() {
                Scalar::Float(d, rand_f64(r))
            } else if d.is_signed_int() {
                Scalar::Int(d, rand_i64(r))
            } else {
                Scalar::UInt(d, r.next())
            })
        }
        Kind::Graph => AttrValue::Graph(Box::new(rand_graph(r, depth + 1))),
        Kind::Word(_) => AttrValue::Word(r.pick(&f.words).to_string()),
    }
}

struct Schema {
    ops: Vec<(&'static str, Vec<Field>)>,
}

fn rand_op(r: &mut Rng, depth: usize) -> Op {
    let schema = schema();
    loop {
        let (name, fields) = r.pick(&schema.ops);
        if depth >= 2 && fields.iter().any(|f| f.kind == Kind::Graph) {
            continue;
        }
        return rand_op_named(r, name, fields, depth);
    }
}

fn rand_op_named(r: &mut Rng, name: &str, fields: &[Field], depth: usize) -> Op {
    let mut vals: HashMap<&str, AttrValue> = fields
        .iter()
        .map(|f| (f.name, rand_attr(r, f, depth)))
        .collect();
    Op::from_parts(name, |f| vals.remove(f).unwrap()).unwrap()
}

fn schema() -> &'static Schema {
    static SCHEMA: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let words = all_words();
        Schema {
            ops: Op::NAMES
                .iter()
                .map(|&n| (n, discover(n, &words)))
                .collect(),
        }
    })
}

fn rand_graph(r: &mut Rng, depth: usize) -> Graph {
    let mut g = Graph::new(rand_name(r));
    let mut vals: Vec<ValueId> = Vec::new();
    let steps = if depth == 0 {
        3 + r.below(12)
    } else {
        r.below(4)
    };
    for _ in 0..r.below(3) {
        vals.push(g.add_input(rand_name(r), rand_type(r)));
    }
    for _ in 0..steps {
        match r.below(6) {
            0 => vals.push(g.add_input(rand_name(r), rand_type(r))),
            1 => vals.push(g.add_const(rand_name(r), rand_const(r))),
            _ => {
                let inputs = (0..r.below(4))
                    .map(|_| {
                        if vals.is_empty() || r.chance(1, 4) {
                            None
                        } else {
                            Some(*r.pick(&vals))
                        }
                    })
                    .collect();
                let outputs = (0..r.below(4))
                    .map(|_| {
                        if r.chance(1, 4) {
                            None
                        } else {
                            Some((rand_name(r), rand_type(r)))
                        }
                    })
                    .collect();
                let name = if r.chance(1, 3) {
                    String::new()
                } else {
                    rand_name(r)
                };
                let op = rand_op(r, depth);
                vals.extend(g.add_node(name, op, inputs, outputs).into_iter().flatten());
            }
        }
    }
    if !vals.is_empty() {
        g.outputs = (0..r.below(4)).map(|_| *r.pick(&vals)).collect();
    }
    // Now and then, tables out of value order (as after in-place rewrites).
    if r.chance(1, 4) && g.nodes.len() > 1 {
        let (a, b) = (r.below(g.nodes.len()), r.below(g.nodes.len()));
        g.nodes.swap(a, b);
        for (i, n) in g.nodes.iter().enumerate() {
            for (o, v) in n.outputs.iter().enumerate() {
                if let Some(v) = v {
                    g.values[v.0 as usize].def = ValueDef::Node {
                        node: NodeId(i as u32),
                        output: o,
                    };
                }
            }
        }
    }
    if r.chance(1, 4) && g.constants.len() > 1 {
        g.constants.reverse();
        let n = g.constants.len() as u32;
        for v in &mut g.values {
            if let ValueDef::Const(c) = &mut v.def {
                c.0 = n - 1 - c.0;
            }
        }
    }
    g
}

#[test]
fn random_graphs_round_trip() {
    let mut r = Rng(0x5eed);
    for i in 0..400 {
        let g = rand_graph(&mut r, 0);
        let text = print_graph(&g);
        let back = parse_graph(&text).unwrap_or_else(|e| panic!("graph {i}: {e}\n{text}"));
        // NaN-free attributes, so equality is exact.
        assert_eq!(back, g, "graph {i}:\n{text}");
    }
}

#[test]
fn every_op_round_trips() {
    let mut r = Rng(7);
    for (name, fields) in &schema().ops {
        for _ in 0..5 {
            let op = rand_op_named(&mut r, name, fields, 0);
            assert_eq!(op.name(), *name);
            let mut g = Graph::new("g");
            let x = g.add_input("x", TensorType::known(DType::F32, &[2]));
            let y = g.add_node(
                "n",
                op,
                vec![Some(x)],
                vec![out("y", TensorType::known(DType::F32, &[2]))],
            )[0];
            g.outputs = vec![y.unwrap()];
            round_trip(&g);
        }
    }
}

/// The `read_ir_text` fuzz target's graph seed: the printed [`full_graph`] (every op kind,
/// dtype and control flow). `cargo test -p rafter-ir --test text_format -- --ignored`
/// rewrites it; `tests/fuzz_seeds.rs` checks every seed still parses.
#[test]
#[ignore = "rewrites fuzz/seeds/read_ir_text/graph_full.txt"]
fn write_fuzz_seed() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/read_ir_text");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("graph_full.txt"), round_trip(&full_graph())).unwrap();
}
