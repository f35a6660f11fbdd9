//! Shapes and data movement.

use super::*;
use crate::{DType, Op, PadMode, Scalar};

fn reshape() -> Op {
    Op::Reshape { allow_zero: false }
}

#[test]
fn reshape_rules() {
    let x = In::f32(&["2", "3", "4"]);
    assert_eq!(shape1(&reshape(), &[&x, &In::ints(&[6, -1])]), "f32[6, 4]");
    assert_eq!(
        shape1(&reshape(), &[&x, &In::ints_konst(&[0, -1])]),
        "f32[2, 12]"
    );
    assert_eq!(shape1(&reshape(), &[&x, &In::ints(&[24])]), "f32[24]");
    let zero = Op::Reshape { allow_zero: true };
    let e = In::f32(&["0", "3"]);
    assert_eq!(shape1(&zero, &[&e, &In::ints(&[3, 0])]), "f32[3, 0]");
    // Symbolic input, -1 not exactly solvable: fresh.
    let s = In::f32(&["seq", "6"]);
    assert_eq!(
        shape1(&reshape(), &[&s, &In::ints(&[-1, 4])]),
        "f32[reshape_0, 4]"
    );
    assert_eq!(
        shape1(&reshape(), &[&s, &In::ints(&[-1, 3])]),
        "f32[2*seq, 3]"
    );
    // Unknown target values of known length.
    assert_eq!(
        shape1(&reshape(), &[&s, &In::t(DType::I64, &["3"])]),
        "f32[reshape_0, reshape_1, reshape_2]"
    );
    // Values pass through reshapes of small integer tensors.
    let v = In::syms(&["batch", "seq"]);
    let r = run_all(&reshape(), &[&v, &In::ints(&[2, 1])], 1).unwrap();
    assert_eq!(r.types[0].to_string(), "i64[2, 1]");
    assert_eq!(fmt(r.syms[0].as_ref().unwrap()), "[batch, seq]");

    let e = err_all(&reshape(), &[&x, &In::ints(&[-1, -1])], 1);
    assert!(e.contains("more than one -1"), "{e}");
    let e = err_all(&reshape(), &[&x, &In::ints(&[5, -1])], 1);
    assert!(
        e.contains("cannot reshape [2, 3, 4] (24 elements) into [5, -1]"),
        "{e}"
    );
    let e = err_all(&reshape(), &[&x, &In::ints(&[5, 5])], 1);
    assert!(e.contains("25 elements"), "{e}");
    let e = err_all(&reshape(), &[&x, &In::ints(&[0, 0, 0, 0])], 1);
    assert!(e.contains("input has rank 3"), "{e}");
    let e = err_all(&reshape(), &[&x, &In::ints(&[-2, 12])], 1);
    assert!(e.contains("invalid value -2"), "{e}");
    let e = err_all(&reshape(), &[&x, &In::t(DType::I64, &["n"])], 1);
    assert!(e.contains("unknown length n"), "{e}");
    let e = err_all(&reshape(), &[&x, &In::floats(&[24.0])], 1);
    assert!(e.contains("must be integer"), "{e}");
    let e = err_all(&zero, &[&e_input(), &In::ints(&[0, -1])], 1);
    assert!(e.contains("next to a zero dim"), "{e}");
}

fn e_input() -> In {
    In::f32(&["0", "3"])
}

#[test]
fn transpose_squeeze_unsqueeze_flatten() {
    let x = In::f32(&["a", "1", "3", "1"]);
    assert_eq!(
        shape1(&Op::Transpose { perm: vec![] }, &[&x]),
        "f32[1, 3, 1, a]"
    );
    assert_eq!(
        shape1(
            &Op::Transpose {
                perm: vec![2, 0, -1, 1]
            },
            &[&x]
        ),
        "f32[3, a, 1, 1]"
    );
    let e = err_all(
        &Op::Transpose {
            perm: vec![0, 0, 1, 2],
        },
        &[&x],
        1,
    );
    assert!(e.contains("not a permutation"), "{e}");
    let e = err_all(&Op::Transpose { perm: vec![0, 1] }, &[&x], 1);
    assert!(e.contains("2 entries for rank 4"), "{e}");

    assert_eq!(
        shape1(&Op::Squeeze { axes: vec![1, -1] }, &[&x]),
        "f32[a, 3]"
    );
    let k = In::f32(&["2", "1", "3", "1"]);
    assert_eq!(shape1(&Op::Squeeze { axes: vec![] }, &[&k]), "f32[2, 3]");
    let e = err_all(&Op::Squeeze { axes: vec![] }, &[&x], 1);
    assert!(e.contains("dim 0 is symbolic (a)"), "{e}");
    let e = err_all(&Op::Squeeze { axes: vec![2] }, &[&x], 1);
    assert!(e.contains("cannot squeeze axis 2 of size 3"), "{e}");
    // A symbolic dim may be squeezed when named.
    assert_eq!(
        shape1(&Op::Squeeze { axes: vec![0] }, &[&x]),
        "f32[1, 3, 1]"
    );

    assert_eq!(
        shape1(
            &Op::Unsqueeze { axes: vec![0, -1] },
            &[&In::f32(&["a", "b"])]
        ),
        "f32[1, a, b, 1]"
    );
    assert_eq!(
        shape1(
            &Op::Unsqueeze { axes: vec![1, 3] },
            &[&In::f32(&["a", "b"])]
        ),
        "f32[a, 1, b, 1]"
    );
    let e = err_all(&Op::Unsqueeze { axes: vec![1, 1] }, &[&In::f32(&["a"])], 1);
    assert!(e.contains("repeated"), "{e}");
    let e = err_all(&Op::Unsqueeze { axes: vec![3] }, &[&In::f32(&["a"])], 1);
    assert!(e.contains("axis 3 out of range for rank 2"), "{e}");
    // Values: scalar -> [1].
    assert_eq!(
        vals1(&Op::Unsqueeze { axes: vec![0] }, &[&In::sym_scalar("seq")]).unwrap(),
        "[seq]"
    );
    assert_eq!(
        vals1(&Op::Squeeze { axes: vec![0] }, &[&In::syms(&["seq"])]).unwrap(),
        "[seq]"
    );

    let y = In::f32(&["b", "3", "h", "w"]);
    assert_eq!(shape1(&Op::Flatten { axis: 1 }, &[&y]), "f32[b, 3*h*w]");
    assert_eq!(shape1(&Op::Flatten { axis: 0 }, &[&y]), "f32[1, 3*b*h*w]");
    assert_eq!(shape1(&Op::Flatten { axis: 4 }, &[&y]), "f32[3*b*h*w, 1]");
    assert_eq!(shape1(&Op::Flatten { axis: -2 }, &[&y]), "f32[3*b, h*w]");
    assert!(err_all(&Op::Flatten { axis: 5 }, &[&y], 1).contains("axis 5 out of range"));
    // Flatten of a shape vector keeps its values (as a 2-D [1, n] tensor).
    assert_eq!(
        vals1(&Op::Flatten { axis: 0 }, &[&In::syms(&["b", "s"])]).unwrap(),
        "[b, s]"
    );
}

#[test]
fn concat_and_split() {
    let op = Op::Concat { axis: -1 };
    assert_eq!(
        shape1(&op, &[&In::f32(&["b", "3"]), &In::f32(&["b", "n"])]),
        "f32[b, n + 3]"
    );
    assert_eq!(
        shape1(&op, &[&In::f32(&["b", "3"]), &In::f32(&["2", "4"])]),
        "f32[2, 7]"
    );
    let e = err_all(&op, &[&In::f32(&["2", "3"]), &In::f32(&["4", "3"])], 1);
    assert_eq!(e, "concat: dim 0 is 2 in operand 0 and 4 in operand 1");
    let e = err_all(&op, &[&In::f32(&["2", "3"]), &In::f32(&["3"])], 1);
    assert!(e.contains("rank 1, operand 0 has rank 2"), "{e}");
    let e = err_all(&op, &[&In::f32(&["2"]), &In::t(DType::I64, &["3"])], 1);
    assert!(e.contains("dtype"), "{e}");
    let e = err_all(&op, &[&In::f32(&[])], 1);
    assert!(e.contains("out of range for rank 0"), "{e}");
    assert!(err(&op, &[], 1).contains("at least 1"));

    let split = Op::Split { axis: 1 };
    let x = In::f32(&["b", "10"]);
    assert_eq!(
        shapes(&split, &[&x, &In::ints(&[3, 7])], 2),
        ["f32[b, 3]", "f32[b, 7]"]
    );
    assert_eq!(
        shapes(&split, &[&x], 3),
        ["f32[b, 4]", "f32[b, 4]", "f32[b, 2]"]
    );
    assert_eq!(shapes(&split, &[&x], 2), ["f32[b, 5]", "f32[b, 5]"]);
    let s = In::f32(&["b", "2*h"]);
    assert_eq!(shapes(&split, &[&s], 2), ["f32[b, h]", "f32[b, h]"]);
    let s = In::f32(&["b", "h"]);
    assert_eq!(
        shapes(&split, &[&s], 2),
        ["f32[b, split_0]", "f32[b, split_1]"]
    );
    assert_eq!(
        shapes(&split, &[&s, &In::t(DType::I64, &["2"])], 2),
        ["f32[b, split_0]", "f32[b, split_1]"]
    );
    let e = err_all(&split, &[&x, &In::ints(&[3, 6])], 2);
    assert!(e.contains("sum to 9, axis 1 has size 10"), "{e}");
    let e = err_all(&split, &[&x, &In::ints(&[3, 7])], 3);
    assert!(e.contains("2 sizes for 3 results"), "{e}");
    let e = err_all(&split, &[&In::f32(&["5"])], 1);
    assert!(e.contains("out of range"), "{e}");
    let e = err_all(&Op::Split { axis: 0 }, &[&In::f32(&["5"])], 4);
    assert!(e.contains("cannot be split into 4"), "{e}");
    // Values of a split shape vector.
    let r = run_all(
        &Op::Split { axis: 0 },
        &[&In::syms(&["b", "s", "h"]), &In::ints(&[2, 1])],
        2,
    )
    .unwrap();
    assert_eq!(fmt(r.syms[0].as_ref().unwrap()), "[b, s]");
    assert_eq!(fmt(r.syms[1].as_ref().unwrap()), "[h]");
}

#[test]
fn slice_known_and_symbolic() {
    let x = In::f32(&["10", "s"]);
    let sl = |ins: &[&In]| shape1(&Op::Slice, ins);
    // Known dim: ONNX clamping.
    assert_eq!(sl(&[&x, &In::ints(&[2]), &In::ints(&[100])]), "f32[8, s]");
    assert_eq!(sl(&[&x, &In::ints(&[-3]), &In::ints(&[-1])]), "f32[2, s]");
    assert_eq!(sl(&[&x, &In::ints(&[8]), &In::ints(&[2])]), "f32[0, s]");
    assert_eq!(
        sl(&[
            &x,
            &In::ints(&[1]),
            &In::ints(&[10]),
            &In::ints(&[0]),
            &In::ints(&[3])
        ]),
        "f32[3, s]"
    );
    assert_eq!(
        sl(&[
            &x,
            &In::ints(&[-1]),
            &In::ints(&[i64::MIN]),
            &In::ints(&[0]),
            &In::ints(&[-1])
        ]),
        "f32[10, s]"
    );
    assert_eq!(
        sl(&[
            &x,
            &In::ints(&[9]),
            &In::ints(&[0]),
            &In::ints(&[0]),
            &In::ints(&[-2])
        ]),
        "f32[5, s]"
    );
    // Symbolic dim.
    let on1 = |s: i64, e: i64, st: i64| {
        sl(&[
            &x,
            &In::ints(&[s]),
            &In::ints(&[e]),
            &In::ints(&[1]),
            &In::ints(&[st]),
        ])
    };
    assert_eq!(on1(0, i64::MAX, 1), "f32[10, s]");
    assert_eq!(on1(0, i32::MAX as i64, 1), "f32[10, s]");
    assert_eq!(on1(-1, i64::MIN, -1), "f32[10, s]");
    assert_eq!(on1(0, -1, 1), "f32[10, slice_0]");
    assert_eq!(on1(0, 4, 1), "f32[10, slice_0]");
    assert_eq!(on1(5, 5, 1), "f32[10, 0]");
    assert_eq!(on1(0, i64::MAX, 2), "f32[10, slice_0]");
    let y = In::f32(&["2*n+1"]);
    // 1 .. end of 2n+1 by 2: n.
    assert_eq!(
        sl(&[
            &y,
            &In::ints(&[1]),
            &In::ints(&[i64::MAX]),
            &In::ints(&[0]),
            &In::ints(&[2])
        ]),
        "f32[n]"
    );
    // -1 .. end of n + 3 (provably >= 1).
    let z = In::f32(&["n+3"]);
    assert_eq!(
        sl(&[&z, &In::ints(&[-1]), &In::ints(&[i64::MAX])]),
        "f32[1]"
    );
    assert_eq!(sl(&[&z, &In::ints(&[0]), &In::ints(&[3])]), "f32[3]");
    assert_eq!(sl(&[&z, &In::ints(&[0]), &In::ints(&[-3])]), "f32[n]");
    // Unknown bounds: fresh dims on the sliced axes only.
    let unknown = In::t(DType::I64, &["1"]);
    assert_eq!(
        sl(&[&x, &unknown, &unknown, &In::ints(&[0])]),
        "f32[slice_0, s]"
    );
    // Unknown axes: every dim fresh.
    assert_eq!(
        sl(&[&x, &In::ints(&[0]), &In::ints(&[1]), &unknown]),
        "f32[slice_0, slice_1]"
    );
    // Optional operands absent.
    assert_eq!(
        shape1_opt(&[
            Some(&x),
            Some(&In::ints(&[1])),
            Some(&In::ints(&[3])),
            None,
            None
        ]),
        "f32[2, s]"
    );
    let e = err_all(
        &Op::Slice,
        &[
            &x,
            &In::ints(&[0]),
            &In::ints(&[1]),
            &In::ints(&[0]),
            &In::ints(&[0]),
        ],
        1,
    );
    assert!(e.contains("step 0 is 0"), "{e}");
    let e = err_all(&Op::Slice, &[&x, &In::ints(&[0, 1]), &In::ints(&[1])], 1);
    assert!(e.contains("starts has 2 values but ends has 1"), "{e}");
    let e = err_all(
        &Op::Slice,
        &[&x, &In::ints(&[0]), &In::ints(&[1]), &In::ints(&[2])],
        1,
    );
    assert!(e.contains("axis 2 out of range for rank 2"), "{e}");
    let e = err_all(&Op::Slice, &[&x, &In::ints(&[0])], 1);
    assert!(e.contains("expects 3 to 5 operands, got 2"), "{e}");
    // Values: reverse a shape vector.
    let v = In::syms(&["a", "b", "c"]);
    assert_eq!(
        vals1(
            &Op::Slice,
            &[
                &v,
                &In::ints(&[-1]),
                &In::ints(&[i64::MIN]),
                &In::ints(&[0]),
                &In::ints(&[-1])
            ]
        )
        .unwrap(),
        "[c, b, a]"
    );
}

fn shape1_opt(ins: &[Option<&In>]) -> String {
    run(&Op::Slice, ins, 1).unwrap().types[0].to_string()
}

#[test]
fn gathers_and_scatters() {
    let data = In::f32(&["v", "h"]);
    let idx = In::t(DType::I64, &["b", "s"]);
    assert_eq!(
        shape1(&Op::Gather { axis: 0 }, &[&data, &idx]),
        "f32[b, s, h]"
    );
    assert_eq!(
        shape1(&Op::Gather { axis: 1 }, &[&data, &idx]),
        "f32[v, b, s]"
    );
    assert_eq!(
        shape1(&Op::Gather { axis: -1 }, &[&data, &In::scalar(0)]),
        "f32[v]"
    );
    let e = err_all(&Op::Gather { axis: 2 }, &[&data, &idx], 1);
    assert_eq!(e, "axis 2 out of range for rank 2");
    let e = err_all(
        &Op::Gather { axis: 0 },
        &[&In::f32(&["3"]), &In::ints(&[3])],
        1,
    );
    assert!(
        e.contains("index 3 out of range for axis 0 of size 3"),
        "{e}"
    );
    let e = err_all(&Op::Gather { axis: 0 }, &[&data, &In::f32(&["2"])], 1);
    assert!(e.contains("must be integer"), "{e}");
    // Negative and vector indices on a shape vector.
    assert_eq!(
        vals1(
            &Op::Gather { axis: 0 },
            &[&In::syms(&["b", "s", "h"]), &In::ints(&[-1, 0])]
        )
        .unwrap(),
        "[h, b]"
    );

    let ge = Op::GatherElements { axis: 1 };
    assert_eq!(
        shape1(
            &ge,
            &[&In::f32(&["3", "4"]), &In::t(DType::I64, &["3", "2"])]
        ),
        "f32[3, 2]"
    );
    assert!(
        err_all(&ge, &[&In::f32(&["3", "4"]), &In::t(DType::I64, &["3"])], 1)
            .contains("rank 1, data has rank 2")
    );

    let nd = Op::GatherNd { batch_dims: 0 };
    assert_eq!(
        shape1(
            &nd,
            &[&In::f32(&["2", "3", "4"]), &In::t(DType::I64, &["5", "2"])]
        ),
        "f32[5, 4]"
    );
    let nd1 = Op::GatherNd { batch_dims: 1 };
    assert_eq!(
        shape1(
            &nd1,
            &[&In::f32(&["2", "3", "4"]), &In::t(DType::I64, &["2", "1"])]
        ),
        "f32[2, 4]"
    );
    assert!(err_all(
        &nd,
        &[&In::f32(&["2", "3"]), &In::t(DType::I64, &["5", "3"])],
        1
    )
    .contains("must be in 1..=2"));
    assert!(err_all(
        &nd,
        &[&In::f32(&["2", "3"]), &In::t(DType::I64, &["5", "k"])],
        1
    )
    .contains("not known"));

    let sc = Op::ScatterElements {
        axis: 0,
        reduction: crate::ScatterReduction::None,
    };
    let ups = In::f32(&["1", "4"]);
    assert_eq!(
        shape1(
            &sc,
            &[&In::f32(&["3", "4"]), &In::t(DType::I64, &["1", "4"]), &ups]
        ),
        "f32[3, 4]"
    );
}

#[test]
fn expand_tile_pad() {
    let x = In::f32(&["1", "s", "1"]);
    assert_eq!(
        shape1(&Op::Expand, &[&x, &In::ints(&[2, 1, 1, 4])]),
        "f32[2, 1, s, 4]"
    );
    assert_eq!(
        shape1(&Op::Expand, &[&x, &In::syms(&["b", "1", "1"])]),
        "f32[b, s, 1]"
    );
    assert_eq!(
        shape1(&Op::Expand, &[&x, &In::t(DType::I64, &["3"])]),
        "f32[expand_0, expand_1, expand_2]"
    );
    assert_eq!(
        shape1(
            &Op::Expand,
            &[&In::f32(&["b", "3", "1"]), &In::t(DType::I64, &["2"])]
        ),
        "f32[b, 3, expand_0]"
    );
    let e = err_all(&Op::Expand, &[&In::f32(&["3"]), &In::ints(&[4])], 1);
    assert_eq!(e, "broadcast: dim 0 is 3 in operand 0 and 4 in operand 1");
    // Expand of a value.
    assert_eq!(
        vals1(&Op::Expand, &[&In::sym_scalar("s"), &In::ints(&[3])]).unwrap(),
        "[s, s, s]"
    );

    assert_eq!(
        shape1(&Op::Tile, &[&In::f32(&["s", "3"]), &In::ints(&[2, 2])]),
        "f32[2*s, 6]"
    );
    assert_eq!(
        shape1(
            &Op::Tile,
            &[&In::f32(&["s", "3"]), &In::t(DType::I64, &["2"])]
        ),
        "f32[tile_0, tile_1]"
    );
    assert!(
        err_all(&Op::Tile, &[&In::f32(&["s", "3"]), &In::ints(&[2])], 1)
            .contains("1 values for rank 2")
    );

    let pad = Op::Pad {
        mode: PadMode::Constant,
    };
    let y = In::f32(&["1", "3", "h", "w"]);
    assert_eq!(
        shape1(&pad, &[&y, &In::ints(&[0, 0, 1, 2, 0, 0, 1, -1])]),
        "f32[1, 3, h + 2, w + 1]"
    );
    assert_eq!(
        shape1(
            &pad,
            &[
                &y,
                &In::ints(&[1, 1, 1, 1]),
                &In::fscalar(0.0),
                &In::ints(&[-2, -1])
            ]
        ),
        "f32[1, 3, h + 2, w + 2]"
    );
    assert_eq!(
        run(
            &pad,
            &[Some(&y), Some(&In::t(DType::I64, &["8"])), None, None],
            1
        )
        .unwrap()
        .types[0]
            .to_string(),
        "f32[pad_0, pad_1, pad_2, pad_3]"
    );
    assert!(err_all(&pad, &[&y, &In::ints(&[1, 1])], 1).contains("expected 8"));
    let e = err_all(&pad, &[&In::f32(&["2"]), &In::ints(&[-2, -1])], 1);
    assert!(e.contains("negative"), "{e}");
}

#[test]
fn generators() {
    let cos = Op::ConstantOfShape {
        value: Scalar::Float(DType::F16, 0.0),
    };
    assert_eq!(shape1(&cos, &[&In::syms(&["b", "s"])]), "f16[b, s]");
    assert_eq!(
        shape1(&cos, &[&In::t(DType::I64, &["2"])]),
        "f16[constant_of_shape_0, constant_of_shape_1]"
    );
    let ones = Op::ConstantOfShape {
        value: Scalar::Int(DType::I64, 1),
    };
    assert_eq!(vals1(&ones, &[&In::ints(&[3])]).unwrap(), "[1, 1, 1]");
    assert!(err_all(&cos, &[&In::ints(&[2, -1])], 1).contains("negative value -1"));
    assert!(err_all(&cos, &[&In::t(DType::I64, &["n"])], 1).contains("unknown length"));

    let r = |a: &In, b: &In, c: &In| run_all(&Op::Range, &[a, b, c], 1).unwrap();
    let x = r(&In::scalar(2), &In::scalar(11), &In::scalar(3));
    assert_eq!(x.types[0].to_string(), "i64[3]");
    assert_eq!(fmt(x.syms[0].as_ref().unwrap()), "[2, 5, 8]");
    let x = r(&In::scalar(10), &In::scalar(4), &In::scalar(-2));
    assert_eq!(fmt(x.syms[0].as_ref().unwrap()), "[10, 8, 6]");
    let x = r(&In::scalar(10), &In::scalar(4), &In::scalar(2));
    assert_eq!(x.types[0].to_string(), "i64[0]");
    let x = r(&In::fscalar(0.0), &In::fscalar(1.0), &In::fscalar(0.3));
    assert_eq!(x.types[0].to_string(), "f32[4]");
    let x = r(&In::sym_scalar("s"), &In::scalar(0), &In::scalar(-1));
    assert_eq!(x.types[0].to_string(), "i64[s]");
    let x = r(&In::scalar(0), &In::sym_scalar("2*s"), &In::scalar(2));
    assert_eq!(x.types[0].to_string(), "i64[s]");
    let x = r(&In::scalar(0), &In::sym_scalar("s"), &In::scalar(2));
    assert_eq!(x.types[0].to_string(), "i64[range_0]");
    assert!(err_all(
        &Op::Range,
        &[&In::scalar(0), &In::scalar(3), &In::scalar(0)],
        1
    )
    .contains("delta is 0"));
    assert!(err_all(
        &Op::Range,
        &[&In::scalar(0), &In::fscalar(3.0), &In::scalar(1)],
        1
    )
    .contains("dtype"));

    let oh = Op::OneHot { axis: -1 };
    let idx = In::t(DType::I64, &["b", "s"]);
    assert_eq!(
        shape1(&oh, &[&idx, &In::scalar(10), &In::floats(&[0.0, 1.0])]),
        "f32[b, s, 10]"
    );
    assert_eq!(
        shape1(
            &Op::OneHot { axis: 0 },
            &[&idx, &In::fscalar(5.0), &In::floats(&[0.0, 1.0])]
        ),
        "f32[5, b, s]"
    );
    assert!(err_all(
        &Op::OneHot { axis: 3 },
        &[&idx, &In::scalar(3), &In::floats(&[0.0, 1.0])],
        1
    )
    .contains("out of range"));

    assert_eq!(
        shape1(
            &Op::EyeLike {
                dtype: DType::I32,
                k: 1
            },
            &[&In::f32(&["3", "n"])]
        ),
        "i32[3, n]"
    );
    assert!(err_all(
        &Op::EyeLike {
            dtype: DType::I32,
            k: 0
        },
        &[&In::f32(&["3"])],
        1
    )
    .contains("rank 2"));
}

#[test]
fn data_dependent_sizes() {
    let x = In::f32(&["b", "4"]);
    assert_eq!(shape1(&Op::NonZero, &[&x]), "i64[2, non_zero_0]");
    let topk = Op::TopK {
        axis: -1,
        largest: true,
        sorted: true,
    };
    assert_eq!(
        shapes(&topk, &[&x, &In::ints(&[3])], 2),
        ["f32[b, 3]", "i64[b, 3]"]
    );
    assert_eq!(
        shapes(&topk, &[&x, &In::t(DType::I64, &["1"])], 2),
        ["f32[b, top_k_0]", "i64[b, top_k_0]"]
    );
    assert!(err_all(&topk, &[&x, &In::ints(&[5])], 2).contains("larger than axis 1 of size 4"));

    let cond = In::t(DType::Bool, &["4"]);
    assert_eq!(
        shape1(&Op::Compress { axis: Some(1) }, &[&x, &cond]),
        "f32[b, compress_0]"
    );
    let known = In {
        ty: crate::TensorType::known(DType::Bool, &[3]),
        sym: Some(dims(&["1", "0", "1"])),
        konst: None,
    };
    assert_eq!(
        shape1(&Op::Compress { axis: Some(1) }, &[&x, &known]),
        "f32[b, 2]"
    );
    assert_eq!(
        shape1(&Op::Compress { axis: None }, &[&x, &cond]),
        "f32[compress_0]"
    );

    assert_eq!(
        shapes(
            &Op::Unique {
                axis: None,
                sorted: true
            },
            &[&x],
            4
        ),
        [
            "f32[unique_0]",
            "i64[unique_0]",
            "i64[4*b]",
            "i64[unique_0]"
        ]
    );
    assert_eq!(
        shapes(
            &Op::Unique {
                axis: Some(0),
                sorted: true
            },
            &[&x],
            3
        ),
        ["f32[unique_0, 4]", "i64[unique_0]", "i64[b]"]
    );
    let nms = Op::NonMaxSuppression {
        center_point_box: 0,
    };
    assert_eq!(
        shape1(
            &nms,
            &[&In::f32(&["1", "n", "4"]), &In::f32(&["1", "1", "n"])]
        ),
        "i64[non_max_suppression_0, 3]"
    );
    assert_eq!(
        shape1(
            &Op::ReverseSequence {
                batch_axis: 1,
                time_axis: 0
            },
            &[&In::f32(&["t", "b", "4"]), &In::t(DType::I64, &["b"])]
        ),
        "f32[t, b, 4]"
    );
    assert_eq!(shape1(&Op::Trilu { upper: true }, &[&x]), "f32[b, 4]");
    assert!(err_all(&Op::Trilu { upper: true }, &[&In::f32(&["3"])], 1).contains("rank at least 2"));
}

#[test]
fn squeeze_unsqueeze_axes_operand() {
    let sq = Op::Squeeze { axes: vec![] };
    let unsq = Op::Unsqueeze { axes: vec![] };
    let x = In::f32(&["a", "1", "3", "1"]);
    // Known operand values act as the attribute would (negative against the rank).
    assert_eq!(shape1(&sq, &[&x, &In::ints(&[1, -1])]), "f32[a, 3]");
    assert_eq!(
        shape1(&unsq, &[&In::f32(&["a", "b"]), &In::ints(&[-1, 0])]),
        "f32[1, a, b, 1]"
    );
    // Run-time axes of known length 2: the rank is known. Squeeze: a, 1, 1 may be 1 and
    // 3 is not, so with 2 of 3 candidates going the dims are fresh.
    let two = In::t(DType::I64, &["2"]);
    assert_eq!(shape1(&sq, &[&x, &two]), "f32[squeeze_0, squeeze_1]");
    // Exactly as many candidates as axes: those go, the known non-1 dims stay.
    let k = In::f32(&["2", "1", "3", "1"]);
    assert_eq!(shape1(&sq, &[&k, &two]), "f32[2, 3]");
    let e = err_all(&sq, &[&In::f32(&["2", "1", "3"]), &two], 1);
    assert!(e.contains("cannot squeeze 2 axes"), "{e}");
    assert_eq!(
        shape1(&unsq, &[&In::f32(&["a", "b"]), &two]),
        "f32[unsqueeze_0, unsqueeze_1, unsqueeze_2, unsqueeze_3]"
    );
    // A scalar (or all-1 operand) unsqueezes to all 1s whatever the axes.
    assert_eq!(shape1(&unsq, &[&In::f32(&[]), &two]), "f32[1, 1]");
    // An empty axes operand: squeeze drops the 1s.
    let none = In::t(DType::I64, &["0"]);
    assert_eq!(shape1(&sq, &[&k, &none]), "f32[2, 3]");
    // Unknown length: the rank is unknown.
    let n = In::t(DType::I64, &["n"]);
    for op in [&sq, &unsq] {
        let e = err_all(op, &[&x, &n], 1);
        assert!(e.starts_with(crate::infer::RUNTIME_AXES_RANK), "{e}");
    }
    // Attribute and operand together, or a 2-D operand, are malformed.
    let e = err_all(&Op::Squeeze { axes: vec![1] }, &[&x, &two], 1);
    assert!(e.contains("both as the attribute"), "{e}");
    let e = err_all(&sq, &[&x, &In::t(DType::I64, &["1", "2"])], 1);
    assert!(e.contains("must be 1-D"), "{e}");
    // Values pass through.
    assert_eq!(
        vals1(&unsq, &[&In::sym_scalar("seq"), &In::t(DType::I64, &["1"])]).unwrap(),
        "[seq]"
    );
}
