//! Half precision computed in f32 on the CPU (`rafter_opt::widen`): which nodes run in
//! f32, where the casts go, that the interface is untouched, and that a widened f16 graph
//! computes exactly the f32 graph of the same values rounded once at its outputs (ONNX
//! Runtime's CPU semantics), both through the reference and compiled.

mod common;

use common::{interpret, parse};
use half::f16;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DType, Graph};
use rafter_opt::widen_half;
use rafter_reference::Tensor;

/// `n` deterministic values in [-1, 1) as a `dense [...]` literal, each exactly an f16.
fn dense(n: usize, seed: u32) -> String {
    let v: Vec<String> = (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 40503)
                % 1024;
            format!("{}", x as f32 / 512.0 - 1.0)
        })
        .collect();
    format!("dense [{}]", v.join(", "))
}

/// A small attention-like block in `t` (f16 or f32): a product with a weight, a bias and
/// GELU, a softmax, a reshape and transpose (data movement), an embedding gather from a
/// table, a comparison, a cast kept as it is, and a reduction.
fn block(t: &str) -> Graph {
    parse(&format!(
        r#"graph @block(%x: {t}[2, 8], %ids: i64[3]) -> (%y, %e, %m, %c) {{
          const %w: {t}[8, 6] = {w}
          const %b: {t}[6] = {b}
          const %table: {t}[5, 4] = {table}
          %h: {t}[2, 6] = matmul(%x, %w)
          %hb: {t}[2, 6] = binary{{op = add}}(%h, %b)
          %g: {t}[2, 6] = gelu{{approximate = none}}(%hb)
          %s: {t}[2, 6] = softmax{{axis = -1, kind = softmax}}(%g)
          const %shape: i64[3] = dense [2, 3, 2]
          %r: {t}[2, 3, 2] = reshape{{allow_zero = false}}(%s, %shape)
          %y: {t}[2, 2, 3] = transpose{{perm = [0, 2, 1]}}(%r)
          %e: {t}[3, 4] = gather{{axis = 0}}(%table, %ids)
          const %zero: {t}[] = dense [0.0]
          %m: bool[2, 6] = binary{{op = greater}}(%hb, %zero)
          %c: f32[2, 6] = cast{{to = f32}}(%g)
        }}"#,
        w = dense(48, 1),
        b = dense(6, 2),
        table = dense(20, 3),
    ))
}

fn inputs(dtype: DType) -> Vec<Tensor> {
    let xs: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
    let x = match dtype {
        DType::F16 => Tensor::F16(
            ArrayD::from_shape_vec(
                IxDyn(&[2, 8]),
                xs.iter().map(|&v| f16::from_f32(v)).collect(),
            )
            .unwrap(),
        ),
        _ => Tensor::f32s(&[2, 8], xs),
    };
    vec![x, Tensor::i64s(&[3], vec![4, 0, 2])]
}

fn node<'g>(g: &'g Graph, name: &str) -> &'g rafter_ir::Node {
    g.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

fn out_dtype(g: &Graph, n: &rafter_ir::Node) -> DType {
    g.value(n.outputs[0].unwrap()).ty.dtype
}

#[test]
fn compute_runs_in_f32_and_the_interface_keeps_its_types() {
    let src = block("f16");
    let mut g = src.clone();
    assert!(widen_half(&mut g));
    rafter_ir::verify(&g).unwrap();
    // Names and types of inputs and outputs are the source's.
    for (a, b) in g
        .inputs
        .iter()
        .chain(&g.outputs)
        .zip(src.inputs.iter().chain(&src.outputs))
    {
        assert_eq!(g.value(*a).name, src.value(*b).name);
        assert_eq!(g.value(*a).ty, src.value(*b).ty);
    }
    // Computing nodes and the movement that follows them run in f32; the product's weight
    // and bias were widened at compile time (constants, not casts).
    for name in ["h", "hb", "g", "s", "r", "y"] {
        let n = g
            .nodes
            .iter()
            .find(|n| g.value(n.outputs[0].unwrap()).name == format!("{name}.f32"))
            .unwrap_or_else(|| panic!("{name} not widened"));
        assert_eq!(out_dtype(&g, n), DType::F32, "{name}");
    }
    let w = g.values.iter().find(|v| v.name == "w.f32").unwrap();
    assert!(matches!(w.def, rafter_ir::ValueDef::Const(_)));
    // The gather from a constant table stays f16: it reads rows, not a widened table.
    let e = g.value(g.outputs[1]);
    assert_eq!(e.ty.dtype, DType::F16);
    assert!(g.values.iter().all(|v| v.name != "table.f32"));
    // Casts: one for the f16 input, one back for each f16 output computed in f32; the
    // model's own cast reads the f32 GELU through its f16 form.
    let casts: Vec<(String, DType)> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, rafter_ir::Op::Cast { .. }))
        .map(|n| {
            (
                g.value(n.outputs[0].unwrap()).name.clone(),
                out_dtype(&g, n),
            )
        })
        .collect();
    for want in [
        ("x.f32".to_string(), DType::F32),
        ("y".to_string(), DType::F16),
        ("g".to_string(), DType::F16),
        ("c".to_string(), DType::F32),
    ] {
        assert!(casts.contains(&want), "{want:?} in {casts:?}");
    }
    assert_eq!(casts.len(), 4, "{casts:?}");
    let _ = node(&g, "x.f32.cast");
    // A second run finds nothing left to widen.
    assert!(!widen_half(&mut g));
}

/// Rounds an f32 tensor to f16 (what a cast at a widened chain's end does).
fn to_f16(t: &Tensor) -> Tensor {
    match t {
        Tensor::F32(a) => Tensor::F16(a.mapv(f16::from_f32)),
        other => other.clone(),
    }
}

#[test]
fn a_widened_graph_is_the_f32_graph_rounded_once() {
    let mut g = block("f16");
    assert!(widen_half(&mut g));
    let got = rafter_reference::run(&g, inputs(DType::F16)).unwrap();
    // The same graph in f32 (every f16 constant and input value is exactly an f32 one).
    let want = rafter_reference::run(&block("f32"), inputs(DType::F32)).unwrap();
    let (y, e, m, c) = (&got[0], &got[1], &got[2], &got[3]);
    assert_eq!(y.to_le_bytes(), to_f16(&want[0]).to_le_bytes(), "y");
    assert_eq!(e.to_le_bytes(), to_f16(&want[1]).to_le_bytes(), "e");
    assert_eq!(m.to_le_bytes(), want[2].to_le_bytes(), "m");
    // The model's cast to f32 reads the GELU rounded to f16 (its operand is f16).
    assert_eq!(c.to_le_bytes(), {
        let Tensor::F32(a) = &want[3] else {
            panic!("f32")
        };
        Tensor::F32(a.mapv(|v| f16::from_f32(v).to_f32())).to_le_bytes()
    });
    // And the compiled program computes the same bits, each cast between f32 and f16 a
    // kernel of its own (the CPU's native kernels cover it alone, not fused).
    let p = rafter_opt::compile(&block("f16"), &rafter_opt::CompileOptions::default()).unwrap();
    for k in &p.kernels {
        if k.body
            .nodes
            .iter()
            .any(|n| matches!(n.op, rafter_ir::Op::Cast { .. }))
        {
            assert_eq!(k.body.nodes.len(), 1, "{}", k.name);
        }
    }
    let run = interpret(&p, inputs(DType::F16)).unwrap();
    for (i, (a, b)) in run.iter().zip(&got).enumerate() {
        assert_eq!(a.to_le_bytes(), b.to_le_bytes(), "compiled output {i}");
    }
}

#[test]
fn as_is_keeps_half_compute_and_f32_graphs_are_untouched() {
    let opts = rafter_opt::CompileOptions {
        half_compute: rafter_opt::HalfCompute::AsIs,
        ..Default::default()
    };
    let p = rafter_opt::compile(&block("f16"), &opts).unwrap();
    let matmul = p
        .kernels
        .iter()
        .flat_map(|k| k.body.nodes.iter().map(move |n| (k, n)))
        .find(|(_, n)| matches!(n.op, rafter_ir::Op::MatMul))
        .unwrap();
    assert_eq!(
        matmul.0.body.value(matmul.1.outputs[0].unwrap()).ty.dtype,
        DType::F16
    );
    let mut f32_graph = block("f32");
    assert!(!widen_half(&mut f32_graph));
    assert_eq!(f32_graph, block("f32"));
}
