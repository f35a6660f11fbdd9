//! The shape arithmetic of a BERT / GPT export, node by node as the importer runs it.

use super::*;
use crate::{Op, SoftmaxKind};

fn shape_op() -> Op {
    Op::Shape {
        start: 0,
        end: None,
    }
}

#[test]
fn split_heads_merge_heads() {
    let x = In::f32(&["batch", "seq", "32"]);

    let shape = run_all(&shape_op(), &[&x], 1).unwrap();
    assert_eq!(shape.types[0].to_string(), "i64[3]");
    assert_eq!(fmt(shape.syms[0].as_ref().unwrap()), "[batch, seq, 32]");
    let shape = In::from(&shape, 0);

    let g0 = run_all(&Op::Gather { axis: 0 }, &[&shape, &In::scalar(0)], 1).unwrap();
    let g1 = run_all(&Op::Gather { axis: 0 }, &[&shape, &In::scalar(1)], 1).unwrap();
    assert_eq!(g0.types[0].to_string(), "i64[]");
    assert_eq!(fmt(g0.syms[0].as_ref().unwrap()), "[batch]");
    assert_eq!(fmt(g1.syms[0].as_ref().unwrap()), "[seq]");

    let unsq = Op::Unsqueeze { axes: vec![0] };
    let u0 = run_all(&unsq, &[&In::from(&g0, 0)], 1).unwrap();
    let u1 = run_all(&unsq, &[&In::from(&g1, 0)], 1).unwrap();
    assert_eq!(u0.types[0].to_string(), "i64[1]");
    assert_eq!(fmt(u1.syms[0].as_ref().unwrap()), "[seq]");

    let cat = run_all(
        &Op::Concat { axis: 0 },
        &[
            &In::from(&u0, 0),
            &In::from(&u1, 0),
            &In::ints(&[4]),
            &In::ints_konst(&[8]),
        ],
        1,
    )
    .unwrap();
    assert_eq!(cat.types[0].to_string(), "i64[4]");
    assert_eq!(fmt(cat.syms[0].as_ref().unwrap()), "[batch, seq, 4, 8]");

    let reshape = Op::Reshape { allow_zero: false };
    let heads = In::from(&run_all(&reshape, &[&x, &In::from(&cat, 0)], 1).unwrap(), 0);
    assert_eq!(heads.ty.to_string(), "f32[batch, seq, 4, 8]");

    let q = shape1(
        &Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[&heads],
    );
    assert_eq!(q, "f32[batch, 4, seq, 8]");
    let q = In::f32(&["batch", "4", "seq", "8"]);
    let kt = shape1(
        &Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        &[&heads],
    );
    assert_eq!(kt, "f32[batch, 4, 8, seq]");
    let kt = In::f32(&["batch", "4", "8", "seq"]);
    let scores = shape1(&Op::MatMul, &[&q, &kt]);
    assert_eq!(scores, "f32[batch, 4, seq, seq]");
    let scores = In::f32(&["batch", "4", "seq", "seq"]);
    let probs = shape1(
        &Op::Softmax {
            kind: SoftmaxKind::Softmax,
            axis: -1,
        },
        &[&scores],
    );
    assert_eq!(probs, "f32[batch, 4, seq, seq]");
    let ctx = shape1(&Op::MatMul, &[&scores, &q]);
    assert_eq!(ctx, "f32[batch, 4, seq, 8]");
    let ctx = In::f32(&["batch", "4", "seq", "8"]);
    let back = In::f32(&["batch", "seq", "4", "8"]);
    assert_eq!(
        shape1(
            &Op::Transpose {
                perm: vec![0, 2, 1, 3]
            },
            &[&ctx]
        ),
        back.ty.to_string()
    );

    // Merge heads: [0, 0, -1] copies batch and seq and solves 4*8.
    assert_eq!(
        shape1(&reshape, &[&back, &In::ints(&[0, 0, -1])]),
        "f32[batch, seq, 32]"
    );
    // ... or the symbolic target [batch, seq, 32] built by shape arithmetic.
    assert_eq!(
        shape1(&reshape, &[&back, &In::syms(&["batch", "seq", "32"])]),
        "f32[batch, seq, 32]"
    );
    // [-1, 32] folds batch and seq together.
    assert_eq!(
        shape1(&reshape, &[&back, &In::ints(&[-1, 32])]),
        "f32[batch*seq, 32]"
    );
    // [batch*seq, -1] solves 32 by exact division.
    assert_eq!(
        shape1(&reshape, &[&back, &In::syms(&["batch*seq", "-1"])]),
        "f32[batch*seq, 32]"
    );
}

#[test]
fn kv_cache_slices_and_positions() {
    // Key cache after concat: [batch, 4, past + seq, 8].
    let cat = shape1(
        &Op::Concat { axis: 2 },
        &[
            &In::f32(&["batch", "4", "past", "8"]),
            &In::f32(&["batch", "4", "seq", "8"]),
        ],
    );
    assert_eq!(cat, "f32[batch, 4, past + seq, 8]");
    let k = In::f32(&["batch", "4", "past+seq", "8"]);
    let slice = |s: &In, e: &In| shape1(&Op::Slice, &[&k, s, e, &In::ints(&[2]), &In::ints(&[1])]);
    // The new positions: past .. past + seq.
    assert_eq!(
        slice(&In::syms(&["past"]), &In::syms(&["past+seq"])),
        "f32[batch, 4, seq, 8]"
    );
    // Everything: 0 .. INT64_MAX.
    assert_eq!(
        slice(&In::ints(&[0]), &In::ints(&[i64::MAX])),
        "f32[batch, 4, past + seq, 8]"
    );
    // The last seq positions: -seq is not a constant, but past .. end is.
    assert_eq!(
        slice(&In::syms(&["past"]), &In::ints(&[i64::MAX])),
        "f32[batch, 4, seq, 8]"
    );
    // 0 .. past: provably within past + seq.
    assert_eq!(
        slice(&In::ints(&[0]), &In::syms(&["past"])),
        "f32[batch, 4, past, 8]"
    );
    // 0 .. 3 cannot be proved to fit in past + seq: a fresh symbol.
    assert_eq!(
        slice(&In::ints(&[0]), &In::ints(&[3])),
        "f32[batch, 4, slice_0, 8]"
    );

    // Positions: Range(past, past + seq, 1) and Range(0, seq, 1).
    let range = run_all(
        &Op::Range,
        &[
            &In::sym_scalar("past"),
            &In::sym_scalar("past+seq"),
            &In::scalar(1),
        ],
        1,
    )
    .unwrap();
    assert_eq!(range.types[0].to_string(), "i64[seq]");
    assert_eq!(
        shape1(
            &Op::Range,
            &[&In::scalar(0), &In::sym_scalar("seq"), &In::scalar(1)]
        ),
        "i64[seq]"
    );

    // The mask length past + seq from the two shapes.
    let total = run_all(
        &Op::Binary {
            op: crate::BinaryOp::Add,
        },
        &[&In::sym_scalar("past"), &In::sym_scalar("seq")],
        1,
    )
    .unwrap();
    assert_eq!(fmt(total.syms[0].as_ref().unwrap()), "[past + seq]");
}

#[test]
fn shape_vector_slicing_and_size() {
    let x = In::f32(&["batch", "seq", "32"]);
    let shape = In::from(&run_all(&shape_op(), &[&x], 1).unwrap(), 0);
    // shape[:2] → [batch, seq]; shape[-1:] → [32].
    assert_eq!(
        vals1(&Op::Slice, &[&shape, &In::ints(&[0]), &In::ints(&[2])]).unwrap(),
        "[batch, seq]"
    );
    assert_eq!(
        vals1(
            &Op::Slice,
            &[&shape, &In::ints(&[-1]), &In::ints(&[i64::MAX])]
        )
        .unwrap(),
        "[32]"
    );
    // Shape with start/end.
    let op = Op::Shape {
        start: 1,
        end: Some(-1),
    };
    assert_eq!(shape1(&op, &[&x]), "i64[1]");
    assert_eq!(vals1(&op, &[&x]).unwrap(), "[seq]");
    assert_eq!(vals1(&Op::Size, &[&x]).unwrap(), "[32*batch*seq]");
    // ReduceProd of the shape: the element count.
    let prod = Op::Reduce {
        kind: crate::ReduceKind::Prod,
        axes: vec![],
        keep_dims: false,
        noop_with_empty_axes: false,
    };
    assert_eq!(vals1(&prod, &[&shape]).unwrap(), "[32*batch*seq]");
    // seq * 32 / 4 as exact integer arithmetic.
    let mul = Op::Binary {
        op: crate::BinaryOp::Mul,
    };
    let div = Op::Binary {
        op: crate::BinaryOp::Div,
    };
    let m = In::from(
        &run_all(&mul, &[&In::sym_scalar("seq"), &In::scalar(32)], 1).unwrap(),
        0,
    );
    assert_eq!(vals1(&div, &[&m, &In::scalar(4)]).unwrap(), "[8*seq]");
    // Not exact: no value.
    assert_eq!(vals1(&div, &[&In::sym_scalar("seq"), &In::scalar(4)]), None);
}
