//! If, Loop, Scan: result types from subgraphs, rewritten into the outer symbols.

use super::*;
use crate::{DType, Graph, Op, TensorType};

/// A graph whose inputs have types `ins` and whose outputs are fresh inputs of types
/// `outs` (enough for inference, which only reads the types).
fn graph(name: &str, ins: &[TensorType], outs: &[TensorType]) -> Box<Graph> {
    let mut g = Graph::new(name);
    for (i, t) in ins.iter().enumerate() {
        g.add_input(format!("in{i}"), t.clone());
    }
    for (i, t) in outs.iter().enumerate() {
        let v = g.add_input(format!("out{i}"), t.clone());
        g.inputs.pop();
        g.outputs.push(v);
    }
    Box::new(g)
}

fn b() -> TensorType {
    ty(DType::Bool, &[])
}

#[test]
fn if_branches() {
    let cap = [ty(DType::F32, &["m", "4"])];
    let then_g = graph(
        "then",
        &cap,
        &[ty(DType::F32, &["m", "4"]), ty(DType::I64, &["2"])],
    );
    let else_g = graph(
        "else",
        &cap,
        &[ty(DType::F32, &["m", "4"]), ty(DType::I64, &["3"])],
    );
    let op = Op::If {
        then_branch: then_g,
        else_branch: else_g,
    };
    let cond = In::t(DType::Bool, &[]);
    let x = In::f32(&["seq", "4"]);
    assert_eq!(shapes(&op, &[&cond, &x], 2), ["f32[seq, 4]", "i64[if_0]"]);

    // A branch-local symbol does not leak out.
    let then_g = graph("then", &cap, &[ty(DType::F32, &["k", "4"])]);
    let else_g = graph("else", &cap, &[ty(DType::F32, &["k", "4"])]);
    let op = Op::If {
        then_branch: then_g,
        else_branch: else_g,
    };
    let r = shapes(&op, &[&cond, &x], 1);
    assert_eq!(r, ["f32[if_0, 4]"]);

    // A branch input typed with a polynomial maps back as a whole.
    let cap2 = [ty(DType::F32, &["p+s"])];
    let then_g = graph("then", &cap2, &[ty(DType::F32, &["p+s", "2"])]);
    let else_g = graph("else", &cap2, &[ty(DType::F32, &["p+s", "2"])]);
    let op = Op::If {
        then_branch: then_g,
        else_branch: else_g,
    };
    assert_eq!(
        shapes(&op, &[&cond, &In::f32(&["past+seq"])], 1),
        ["f32[past + seq, 2]"]
    );

    let then_g = graph("then", &cap, &[ty(DType::F32, &["m"])]);
    let else_g = graph("else", &cap, &[ty(DType::F16, &["m"])]);
    let op = Op::If {
        then_branch: then_g,
        else_branch: else_g,
    };
    let e = err_all(&op, &[&cond, &x], 1);
    assert!(e.contains("f32[m] in the then branch but f16[m]"), "{e}");
    let e = err_all(&op, &[&cond], 1);
    assert!(
        e.contains("takes 1 inputs, the node passes 0 captures"),
        "{e}"
    );
    let e = err_all(&op, &[&In::t(DType::Bool, &["2"]), &x], 1);
    assert!(e.contains("condition must hold one value"), "{e}");
}

#[test]
fn if_with_a_known_condition_is_typed_by_the_taken_branch() {
    let cap = [ty(DType::F32, &["m"])];
    let then_g = graph("then", &cap, &[ty(DType::F32, &[])]);
    let else_g = graph("else", &cap, &[ty(DType::F32, &["m"])]);
    let op = Op::If {
        then_branch: then_g,
        else_branch: else_g,
    };
    let x = In::f32(&["seq"]);
    let known = |v: bool| In {
        ty: ty(DType::Bool, &[]),
        sym: Some(vec![Dim::known(v as i64)]),
        konst: None,
    };
    assert_eq!(shapes(&op, &[&known(true), &x], 1), ["f32[]"]);
    assert_eq!(shapes(&op, &[&known(false), &x], 1), ["f32[seq]"]);
    // Unknown at import: the rank would depend on run-time data.
    let e = err_all(&op, &[&In::t(DType::Bool, &[]), &x], 1);
    assert!(e.starts_with(crate::infer::DATA_DEPENDENT_RANK), "{e}");
}

#[test]
fn loops() {
    let body_ins = [
        ty(DType::I64, &[]),
        b(),
        ty(DType::F32, &["k", "4"]),
        ty(DType::F32, &["4", "4"]),
    ];
    let body = graph(
        "body",
        &body_ins,
        &[b(), ty(DType::F32, &["k", "4"]), ty(DType::F32, &["4"])],
    );
    let op = Op::Loop { body };
    let x = In::f32(&["seq", "4"]);
    let w = In::f32(&["4", "4"]);
    let trips = In::scalar(10);
    let r = run(&op, &[Some(&trips), None, Some(&x), Some(&w)], 2).unwrap();
    let got: Vec<String> = r.types.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["f32[seq, 4]", "f32[10, 4]"]);
    // A condition can stop the loop early: the scan length is fresh.
    let cond = In::t(DType::Bool, &[]);
    let r = run(&op, &[Some(&trips), Some(&cond), Some(&x), Some(&w)], 2).unwrap();
    assert_eq!(r.types[1].to_string(), "f32[loop_0, 4]");
    // A symbolic trip count (Shape → Gather) is the scan length.
    let r = run(
        &op,
        &[Some(&In::sym_scalar("seq")), None, Some(&x), Some(&w)],
        2,
    )
    .unwrap();
    assert_eq!(r.types[1].to_string(), "f32[seq, 4]");

    // A carried value that grows each iteration gets a fresh dim.
    let body = graph(
        "body",
        &body_ins,
        &[b(), ty(DType::F32, &["k+1", "4"]), ty(DType::F32, &["k"])],
    );
    let op = Op::Loop { body };
    let r = run(&op, &[Some(&trips), None, Some(&x), Some(&w)], 2).unwrap();
    let got: Vec<String> = r.types.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["f32[loop_0, 4]", "f32[10, loop_1]"]);

    let e = run(&op, &[Some(&trips), None, Some(&x)], 2).unwrap_err();
    assert!(e.contains("body takes 4 inputs, the node passes 3"), "{e}");
    let e = run(&op, &[Some(&trips), None, Some(&x), Some(&w)], 3).unwrap_err();
    assert!(e.contains("2 result(s), 3 requested"), "{e}");
}

#[test]
fn scans() {
    // State f32[h]; scan input f32[b, t, d] over axis 1; body emits f32[bb, 8] per step.
    let body = graph(
        "body",
        &[ty(DType::F32, &["hh"]), ty(DType::F32, &["bb", "dd"])],
        &[ty(DType::F32, &["hh"]), ty(DType::F32, &["bb", "8"])],
    );
    let scan = |out_axes: Vec<i64>| Op::Scan {
        body: body.clone(),
        num_scan_inputs: 1,
        num_captures: 0,
        scan_input_axes: vec![1],
        scan_input_directions: vec![],
        scan_output_axes: out_axes,
        scan_output_directions: vec![],
    };
    let s = In::f32(&["h"]);
    let x = In::f32(&["b", "t", "d"]);
    assert_eq!(
        shapes(&scan(vec![]), &[&s, &x], 2),
        ["f32[h]", "f32[t, b, 8]"]
    );
    assert_eq!(
        shapes(&scan(vec![-1]), &[&s, &x], 2),
        ["f32[h]", "f32[b, 8, t]"]
    );
    assert_eq!(
        shapes(&scan(vec![1]), &[&s, &x], 2),
        ["f32[h]", "f32[b, t, 8]"]
    );
    let e = err_all(&scan(vec![]), &[&x], 2);
    assert!(e.contains("body takes 2 inputs, the node passes 1"), "{e}");
    let e = err_all(&scan(vec![3]), &[&s, &x], 2);
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn bad_subgraph_ids_are_errors() {
    let mut g = Graph::new("broken");
    g.outputs.push(crate::ValueId(7));
    let op = Op::If {
        then_branch: Box::new(g.clone()),
        else_branch: Box::new(g),
    };
    let e = err_all(&op, &[&In::t(DType::Bool, &[])], 1);
    assert!(e.contains("value id 7 is out of range"), "{e}");
}
