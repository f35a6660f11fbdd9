//! Reductions, norms, contractions, convolution, pooling, resampling, recurrent cells.

use super::*;
use crate::*;

fn conv(
    kernel: &[i64],
    strides: &[i64],
    pads: &[i64],
    dil: &[i64],
    group: i64,
    auto_pad: AutoPad,
) -> Op {
    Op::Conv {
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        group,
        auto_pad,
    }
}

fn pool(kernel: &[i64], strides: &[i64], pads: &[i64], auto_pad: AutoPad, ceil: bool) -> Op {
    Op::Pool {
        kind: PoolKind::Max,
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![],
        auto_pad,
        ceil_mode: ceil,
        count_include_pad: false,
        p: 2,
        storage_order: 0,
    }
}

#[test]
fn reductions() {
    let x = In::f32(&["b", "s", "8"]);
    let red = |axes: &[i64], keep: bool| Op::Reduce {
        kind: ReduceKind::Mean,
        axes: axes.to_vec(),
        keep_dims: keep,
        noop_with_empty_axes: false,
    };
    assert_eq!(shape1(&red(&[-1], true), &[&x]), "f32[b, s, 1]");
    assert_eq!(shape1(&red(&[0, 2], false), &[&x]), "f32[s]");
    assert_eq!(shape1(&red(&[], false), &[&x]), "f32[]");
    assert_eq!(shape1(&red(&[], true), &[&x]), "f32[1, 1, 1]");
    assert!(err_all(&red(&[3], true), &[&x], 1).contains("axis 3 out of range for rank 3"));
    assert!(err_all(&red(&[1, -2], true), &[&x], 1).contains("repeated"));
    let arg = |axis: i64, keep: bool| Op::ArgReduce {
        kind: ArgKind::Max,
        axis,
        keep_dims: keep,
        select_last_index: false,
    };
    assert_eq!(shape1(&arg(1, true), &[&x]), "i64[b, 1, 8]");
    assert_eq!(shape1(&arg(-1, false), &[&x]), "i64[b, s]");
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: vec![0],
        keep_dims: true,
        noop_with_empty_axes: false,
    };
    assert_eq!(vals1(&sum, &[&In::syms(&["p", "s"])]).unwrap(), "[p + s]");
    // noop_with_empty_axes: empty axes make the identity (values included).
    let noop = |kind| Op::Reduce {
        kind,
        axes: vec![],
        keep_dims: false,
        noop_with_empty_axes: true,
    };
    assert_eq!(shape1(&noop(ReduceKind::Mean), &[&x]), "f32[b, s, 8]");
    assert_eq!(
        vals1(&noop(ReduceKind::Sum), &[&In::syms(&["p", "s"])]).unwrap(),
        "[p, s]"
    );
    assert_eq!(
        shape1(&noop(ReduceKind::Max), &[&x, &In::ints(&[-1])]),
        "f32[b, s]"
    );
    assert_eq!(
        shape1(&noop(ReduceKind::Max), &[&x, &In::t(DType::I64, &["0"])]),
        "f32[b, s, 8]"
    );
    let cum = Op::Cumulative {
        kind: CumKind::Sum,
        exclusive: false,
        reverse: false,
    };
    assert_eq!(shape1(&cum, &[&x, &In::scalar(1)]), "f32[b, s, 8]");
    assert_eq!(
        vals1(&cum, &[&In::ints(&[1, 2, 3]), &In::scalar(0)]).unwrap(),
        "[1, 3, 6]"
    );
    let excl = Op::Cumulative {
        kind: CumKind::Sum,
        exclusive: true,
        reverse: true,
    };
    assert_eq!(
        vals1(&excl, &[&In::ints(&[1, 2, 3]), &In::scalar(0)]).unwrap(),
        "[5, 3, 0]"
    );
    assert!(err_all(&cum, &[&x, &In::scalar(3)], 1).contains("out of range"));
}

#[test]
fn norms() {
    let x = In::f32(&["b", "s", "32"]);
    let g = In::f32(&["32"]);
    let ln = Op::LayerNorm {
        axis: -1,
        epsilon: 1e-5,
    };
    assert_eq!(
        shapes(&ln, &[&x, &g, &g], 3),
        ["f32[b, s, 32]", "f32[b, s, 1]", "f32[b, s, 1]"]
    );
    let h = In::t(DType::F16, &["b", "s", "32"]);
    let ln1 = Op::LayerNorm {
        axis: 1,
        epsilon: 1e-5,
    };
    assert_eq!(
        shapes(&ln1, &[&h, &g], 2),
        ["f16[b, s, 32]", "f32[b, 1, 1]"]
    );
    assert!(err_all(&ln, &[&x, &g], 4).contains("has 3 result(s), 4 requested"));
    assert!(err_all(
        &Op::LayerNorm {
            axis: 3,
            epsilon: 0.0
        },
        &[&x, &g],
        1
    )
    .contains("axis 3"));
    assert_eq!(
        shape1(
            &Op::RmsNorm {
                axis: -1,
                epsilon: 0.0
            },
            &[&x, &g]
        ),
        "f32[b, s, 32]"
    );
    let y = In::f32(&["n", "6", "h", "w"]);
    let c = In::f32(&["6"]);
    assert_eq!(
        shape1(&Op::BatchNorm { epsilon: 0.0 }, &[&y, &c, &c, &c, &c]),
        "f32[n, 6, h, w]"
    );
    assert!(err_all(&Op::BatchNorm { epsilon: 0.0 }, &[&y, &c, &c], 1).contains("expects 5"));
    assert_eq!(
        shape1(&Op::InstanceNorm { epsilon: 0.0 }, &[&y, &c, &c]),
        "f32[n, 6, h, w]"
    );
    assert_eq!(
        shape1(
            &Op::GroupNorm {
                num_groups: 3,
                epsilon: 0.0
            },
            &[&y, &c, &c]
        ),
        "f32[n, 6, h, w]"
    );
    assert!(err_all(
        &Op::GroupNorm {
            num_groups: 4,
            epsilon: 0.0
        },
        &[&y, &c, &c],
        1
    )
    .contains("do not divide into 4 groups"));
    let sm = |kind, axis| Op::Softmax { kind, axis };
    assert_eq!(
        shape1(&sm(SoftmaxKind::LogSoftmax, -1), &[&x]),
        "f32[b, s, 32]"
    );
    assert!(err_all(&sm(SoftmaxKind::Softmax, 3), &[&x], 1).contains("axis 3"));
    assert_eq!(
        shape1(&Op::LpNorm { axis: 1, p: 2 }, &[&x]),
        "f32[b, s, 32]"
    );
    assert_eq!(
        shape1(
            &Op::Lrn {
                alpha: 1.0,
                beta: 1.0,
                bias: 1.0,
                size: 3
            },
            &[&y]
        ),
        "f32[n, 6, h, w]"
    );
    assert_eq!(
        shape1(
            &Op::MeanVarianceNorm {
                axes: vec![0, 2, 3]
            },
            &[&y]
        ),
        "f32[n, 6, h, w]"
    );
}

#[test]
fn matmul_and_gemm() {
    let mm = |a: &[&str], b: &[&str]| shape1(&Op::MatMul, &[&In::f32(a), &In::f32(b)]);
    assert_eq!(mm(&["3"], &["3"]), "f32[]");
    assert_eq!(mm(&["3"], &["b", "3", "4"]), "f32[b, 4]");
    assert_eq!(mm(&["b", "2", "3"], &["3"]), "f32[b, 2]");
    assert_eq!(
        mm(&["b", "1", "s", "k"], &["h", "k", "n"]),
        "f32[b, h, s, n]"
    );
    assert_eq!(mm(&["2", "3"], &["k", "5"]), "f32[2, 5]");
    let e = err_all(
        &Op::MatMul,
        &[&In::f32(&["2", "3"]), &In::f32(&["4", "5"])],
        1,
    );
    assert_eq!(e, "matmul: inner dims differ: 3 vs 4");
    let e = err_all(
        &Op::MatMul,
        &[&In::f32(&["2", "2", "3"]), &In::f32(&["3", "3", "5"])],
        1,
    );
    assert!(
        e.contains("broadcast: dim 0 is 2 in operand 0 and 3 in operand 1"),
        "{e}"
    );
    assert!(err_all(&Op::MatMul, &[&In::f32(&[]), &In::f32(&["3"])], 1).contains("rank at least 1"));
    let mi = Op::MatMulInteger;
    let q = In::t(DType::U8, &["b", "4"]);
    let w = In::t(DType::I8, &["4", "8"]);
    assert_eq!(shape1(&mi, &[&q, &w]), "i32[b, 8]");

    let gemm = |ta, tb| Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: ta,
        trans_b: tb,
    };
    let a = In::f32(&["k", "m"]);
    let b = In::f32(&["n", "k"]);
    assert_eq!(shape1(&gemm(true, true), &[&a, &b]), "f32[m, n]");
    assert_eq!(
        shape1(&gemm(true, true), &[&a, &b, &In::f32(&["n"])]),
        "f32[m, n]"
    );
    let a = In::f32(&["2", "3"]);
    assert_eq!(
        shape1(
            &gemm(false, false),
            &[&a, &In::f32(&["3", "4"]), &In::f32(&["1", "4"])]
        ),
        "f32[2, 4]"
    );
    assert!(err_all(
        &gemm(false, false),
        &[&a, &In::f32(&["3", "4"]), &In::f32(&["3"])],
        1
    )
    .contains("broadcast"));
    assert!(
        err_all(&gemm(false, false), &[&a, &In::f32(&["4", "4"])], 1).contains("inner dims differ")
    );
    assert!(err_all(&gemm(false, false), &[&In::f32(&["3"]), &a], 1).contains("rank 2"));
}

#[test]
fn einsum() {
    let es = |eq: &str, ins: &[&In]| {
        shape1(
            &Op::Einsum {
                equation: eq.into(),
            },
            ins,
        )
    };
    let a = In::f32(&["b", "i", "k"]);
    let b = In::f32(&["b", "k", "j"]);
    assert_eq!(es("bik,bkj->bij", &[&a, &b]), "f32[b, i, j]");
    assert_eq!(es("bik,bkj", &[&a, &b]), "f32[i, j]");
    assert_eq!(es("ij->ji", &[&In::f32(&["2", "3"])]), "f32[3, 2]");
    assert_eq!(es("ii->i", &[&In::f32(&["3", "3"])]), "f32[3]");
    assert_eq!(es("ii", &[&In::f32(&["3", "3"])]), "f32[]");
    assert_eq!(
        es(
            "...ij,...jk->...ik",
            &[&In::f32(&["b", "h", "s", "d"]), &In::f32(&["1", "d", "t"])]
        ),
        "f32[b, h, s, t]"
    );
    assert_eq!(
        es(
            "...ij,jk",
            &[&In::f32(&["b", "s", "d"]), &In::f32(&["d", "e"])]
        ),
        "f32[b, s, e]"
    );
    assert_eq!(
        es("i, j -> ij", &[&In::f32(&["3"]), &In::f32(&["4"])]),
        "f32[3, 4]"
    );
    assert_eq!(
        es("Ba,aB", &[&In::f32(&["2", "3"]), &In::f32(&["3", "2"])]),
        "f32[]"
    );
    assert_eq!(es("Bab", &[&In::f32(&["2", "3", "4"])]), "f32[2, 3, 4]");
    let op = Op::Einsum {
        equation: "ij,jk->ik".into(),
    };
    assert!(err_all(&op, &[&In::f32(&["2", "3"]), &In::f32(&["4", "5"])], 1).contains("label `j`"));
    assert!(err_all(&op, &[&In::f32(&["2", "3"])], 1).contains("2 input terms, node has 1"));
    assert!(
        err_all(&op, &[&In::f32(&["2"]), &In::f32(&["2", "3"])], 1).contains("rank 1, term has 2")
    );
    let bad = Op::Einsum {
        equation: "ij->iz".into(),
    };
    assert!(err_all(&bad, &[&In::f32(&["2", "3"])], 1).contains("`z` is not in any input"));
    let bad = Op::Einsum {
        equation: "i1".into(),
    };
    assert!(err_all(&bad, &[&In::f32(&["2", "3"])], 1).contains("bad character"));
}

/// `conv_nhwc` infers what `conv` does, on channels-last axes, and names mismatches.
#[test]
fn channels_last_convolution() {
    let nhwc = |strides: &[i64], pads: &[i64], group: i64| Op::ConvNhwc {
        kernel_shape: vec![],
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![],
        group,
        auto_pad: AutoPad::NotSet,
    };
    let x = In::f32(&["n", "224", "224", "3"]);
    let w = In::f32(&["7", "7", "3", "64"]);
    let stem = nhwc(&[2, 2], &[3, 3, 3, 3], 1);
    assert_eq!(shape1(&stem, &[&x, &w]), "f32[n, 112, 112, 64]");
    assert_eq!(
        shape1(&stem, &[&x, &w, &In::f32(&["64"])]),
        "f32[n, 112, 112, 64]"
    );
    let s1 = nhwc(&[1, 1], &[1, 0, 1, 0], 1);
    let w3 = In::f32(&["3", "3", "3", "8"]);
    assert_eq!(
        shape1(&s1, &[&In::f32(&["n", "h", "w", "3"]), &w3]),
        "f32[n, h, w - 2, 8]"
    );
    let dw = nhwc(&[2, 2], &[1, 1, 1, 1], 32);
    let (x32, w32) = (
        In::f32(&["1", "10", "10", "32"]),
        In::f32(&["3", "3", "1", "32"]),
    );
    assert_eq!(shape1(&dw, &[&x32, &w32]), "f32[1, 5, 5, 32]");
    // The channels are x's last dim and w's third: an NCHW x does not fit.
    let e = err_all(&stem, &[&In::f32(&["1", "3", "224", "224"]), &w], 1);
    assert!(
        e.contains("x has 224 channels, weights expect 3 x 1 groups"),
        "{e}"
    );
    let e = err_all(&stem, &[&x, &w, &In::f32(&["64", "1"])], 1);
    assert!(e.contains("bias must be 1-D"), "{e}");
    let e = err_all(&stem, &[&x, &In::f32(&["7", "3", "64"])], 1);
    assert!(e.contains("weights have rank 3, x has rank 4"), "{e}");
}

#[test]
fn convolution() {
    let x = In::f32(&["n", "3", "224", "224"]);
    let w = In::f32(&["64", "3", "7", "7"]);
    let c = conv(&[7, 7], &[2, 2], &[3, 3, 3, 3], &[], 1, AutoPad::NotSet);
    assert_eq!(shape1(&c, &[&x, &w]), "f32[n, 64, 112, 112]");
    assert_eq!(
        shape1(&c, &[&x, &w, &In::f32(&["64"])]),
        "f32[n, 64, 112, 112]"
    );
    // Kernel from the weights, dilation 2: 224 - 2*2 = 220.
    let w3 = In::f32(&["8", "3", "3", "3"]);
    let c = conv(&[], &[], &[], &[2, 2], 1, AutoPad::NotSet);
    assert_eq!(shape1(&c, &[&x, &w3]), "f32[n, 8, 220, 220]");
    // SAME: ceil(in / stride); VALID: floor((in - k) / s) + 1.
    let same = conv(&[3, 3], &[2, 2], &[], &[], 1, AutoPad::SameUpper);
    let y = In::f32(&["n", "3", "7", "h"]);
    assert_eq!(shape1(&same, &[&y, &w3]), "f32[n, 8, 4, conv_0]");
    let y2 = In::f32(&["n", "3", "7", "2*h"]);
    assert_eq!(shape1(&same, &[&y2, &w3]), "f32[n, 8, 4, h]");
    let valid = conv(&[3, 3], &[2, 2], &[9, 9, 9, 9], &[], 1, AutoPad::Valid);
    assert_eq!(shape1(&valid, &[&y, &w3]), "f32[n, 8, 3, conv_0]");
    // Symbolic input, stride 1: a polynomial.
    // pads are [h_begin, w_begin, h_end, w_end].
    let s1 = conv(&[3, 3], &[1, 1], &[1, 0, 1, 0], &[], 1, AutoPad::NotSet);
    assert_eq!(
        shape1(&s1, &[&In::f32(&["n", "3", "h", "w"]), &w3]),
        "f32[n, 8, h, w - 2]"
    );
    // Symbolic input, stride 2, exact: (2h + 1 + 2 - 3) / 2 + 1 = h + 1.
    let s2 = conv(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet);
    assert_eq!(
        shape1(&s2, &[&In::f32(&["n", "3", "2*h+1", "w"]), &w3]),
        "f32[n, 8, h + 1, conv_0]"
    );
    // Depthwise: group 32.
    let dw = conv(&[3, 3], &[1, 1], &[1, 1, 1, 1], &[], 32, AutoPad::NotSet);
    assert_eq!(
        shape1(
            &dw,
            &[
                &In::f32(&["1", "32", "10", "10"]),
                &In::f32(&["32", "1", "3", "3"])
            ]
        ),
        "f32[1, 32, 10, 10]"
    );
    // 1-D conv.
    let c1 = conv(&[3], &[], &[], &[], 1, AutoPad::NotSet);
    assert_eq!(
        shape1(
            &c1,
            &[&In::f32(&["1", "4", "10"]), &In::f32(&["2", "4", "3"])]
        ),
        "f32[1, 2, 8]"
    );
    let e = err_all(&c, &[&In::f32(&["n", "4", "10", "10"]), &w3], 1);
    assert!(e.contains("4 channels"), "{e}");
    let e = err_all(
        &c1,
        &[&In::f32(&["1", "4", "2"]), &In::f32(&["2", "4", "3"])],
        1,
    );
    assert!(e.contains("larger than the padded input"), "{e}");
    let e = err_all(
        &conv(&[3], &[0], &[], &[], 1, AutoPad::NotSet),
        &[&In::f32(&["1", "4", "10"]), &In::f32(&["2", "4", "3"])],
        1,
    );
    assert!(e.contains("strides must be positive"), "{e}");
    let e = err_all(
        &conv(&[3], &[], &[1], &[], 1, AutoPad::NotSet),
        &[&In::f32(&["1", "4", "10"]), &In::f32(&["2", "4", "3"])],
        1,
    );
    assert!(e.contains("pads has 1 values, expected 2"), "{e}");
    assert!(
        err_all(&c1, &[&In::f32(&["4", "10"]), &In::f32(&["2", "4"])], 1)
            .contains("rank at least 3")
    );

    let ci = Op::ConvInteger {
        kernel_shape: vec![],
        strides: vec![],
        pads: vec![],
        dilations: vec![],
        group: 1,
        auto_pad: AutoPad::NotSet,
    };
    assert_eq!(
        shape1(
            &ci,
            &[
                &In::t(DType::U8, &["1", "4", "10"]),
                &In::t(DType::U8, &["2", "4", "3"])
            ]
        ),
        "i32[1, 2, 8]"
    );

    let ct = |strides: &[i64], pads: &[i64], out_pad: &[i64], out_shape: &[i64], auto_pad| {
        Op::ConvTranspose {
            kernel_shape: vec![],
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: vec![],
            group: 1,
            auto_pad,
            output_padding: out_pad.to_vec(),
            output_shape: out_shape.to_vec(),
        }
    };
    let x = In::f32(&["n", "8", "h", "5"]);
    let w = In::f32(&["8", "4", "3", "3"]);
    // 2 * (h - 1) + 3 - 2 = 2h - 1; 2 * 4 + 1 + 3 - 2 = 10.
    assert_eq!(
        shape1(
            &ct(&[2, 2], &[1, 1, 1, 1], &[0, 1], &[], AutoPad::NotSet),
            &[&x, &w]
        ),
        "f32[n, 4, 2*h - 1, 10]"
    );
    assert_eq!(
        shape1(&ct(&[2, 2], &[], &[], &[], AutoPad::SameUpper), &[&x, &w]),
        "f32[n, 4, 2*h, 10]"
    );
    assert_eq!(
        shape1(&ct(&[2, 2], &[], &[], &[7, 9], AutoPad::NotSet), &[&x, &w]),
        "f32[n, 4, 7, 9]"
    );
    assert!(err_all(
        &ct(&[], &[], &[], &[], AutoPad::NotSet),
        &[&In::f32(&["n", "7", "h", "5"]), &w],
        1
    )
    .contains("7 channels"));
}

#[test]
fn pooling() {
    let x = In::f32(&["n", "c", "5", "5"]);
    assert_eq!(
        shape1(&pool(&[2, 2], &[2, 2], &[], AutoPad::NotSet, false), &[&x]),
        "f32[n, c, 2, 2]"
    );
    assert_eq!(
        shape1(&pool(&[2, 2], &[2, 2], &[], AutoPad::NotSet, true), &[&x]),
        "f32[n, c, 3, 3]"
    );
    // ceil_mode: a window that would start in the right padding is dropped.
    // in 4, k 2, s 2, pads 1/1: ceil((4 + 2 - 2) / 2) + 1 = 3, last start 4 >= 4 + 1? no: 3.
    let y = In::f32(&["1", "1", "4"]);
    assert_eq!(
        shape1(&pool(&[2], &[2], &[1, 1], AutoPad::NotSet, true), &[&y]),
        "f32[1, 1, 3]"
    );
    // in 5, k 3, s 2, pads 0/1: ceil((5 + 1 - 3) / 2) + 1 = 3; last start 4 < 5: 3.
    let z = In::f32(&["1", "1", "5"]);
    assert_eq!(
        shape1(&pool(&[3], &[2], &[0, 1], AutoPad::NotSet, true), &[&z]),
        "f32[1, 1, 3]"
    );
    // in 4, k 2, s 3, pads 0/2: ceil((4 + 2 - 2) / 3) + 1 = 3; last start 6 >= 4: 2.
    let w = In::f32(&["1", "1", "4"]);
    assert_eq!(
        shape1(&pool(&[2], &[3], &[0, 2], AutoPad::NotSet, true), &[&w]),
        "f32[1, 1, 2]"
    );
    assert_eq!(
        shape1(
            &pool(&[3, 3], &[2, 2], &[], AutoPad::SameLower, false),
            &[&x]
        ),
        "f32[n, c, 3, 3]"
    );
    assert_eq!(
        shapes(
            &pool(&[3, 3], &[1, 1], &[1, 1, 1, 1], AutoPad::NotSet, false),
            &[&In::f32(&["n", "c", "h", "w"])],
            2
        ),
        ["f32[n, c, h, w]", "i64[n, c, h, w]"]
    );
    assert!(
        err_all(&pool(&[], &[], &[], AutoPad::NotSet, false), &[&x], 1)
            .contains("kernel_shape is required")
    );
    assert!(
        err_all(&pool(&[2], &[], &[], AutoPad::NotSet, false), &[&x], 1)
            .contains("1 values, expected 2")
    );
    assert_eq!(
        shape1(
            &Op::GlobalPool {
                kind: PoolKind::Average,
                p: 2
            },
            &[&In::f32(&["n", "c", "h", "w"])]
        ),
        "f32[n, c, 1, 1]"
    );
    let up = Op::MaxUnpool {
        kernel_shape: vec![2, 2],
        strides: vec![2, 2],
        pads: vec![],
    };
    let idx = In::t(DType::I64, &["n", "c", "h", "3"]);
    assert_eq!(
        shape1(&up, &[&In::f32(&["n", "c", "h", "3"]), &idx]),
        "f32[n, c, 2*h, 6]"
    );
    assert_eq!(
        shape1(
            &up,
            &[
                &In::f32(&["n", "c", "h", "3"]),
                &idx,
                &In::syms(&["n", "c", "2*h+1", "7"])
            ]
        ),
        "f32[n, c, 2*h + 1, 7]"
    );
}

#[test]
fn spatial_rearrangements() {
    let x = In::f32(&["n", "16", "h", "w"]);
    assert_eq!(
        shape1(
            &Op::DepthToSpace {
                blocksize: 2,
                mode: DepthToSpaceMode::Dcr
            },
            &[&x]
        ),
        "f32[n, 4, 2*h, 2*w]"
    );
    assert!(err_all(
        &Op::DepthToSpace {
            blocksize: 3,
            mode: DepthToSpaceMode::Crd
        },
        &[&x],
        1
    )
    .contains("not divisible by 9"));
    assert_eq!(
        shape1(
            &Op::SpaceToDepth { blocksize: 2 },
            &[&In::f32(&["n", "3", "2*h", "8"])]
        ),
        "f32[n, 12, h, 4]"
    );
    assert_eq!(
        shape1(
            &Op::SpaceToDepth { blocksize: 2 },
            &[&In::f32(&["n", "3", "h", "8"])]
        ),
        "f32[n, 12, space_to_depth_0, 4]"
    );

    let resize = |axes: &[i64], policy| Op::Resize {
        mode: ResizeMode::Nearest,
        coordinate_transformation_mode: CoordTransform::Asymmetric,
        nearest_mode: NearestMode::Floor,
        cubic_coeff_a: -0.75,
        exclude_outside: false,
        extrapolation_value: 0.0,
        antialias: false,
        axes: axes.to_vec(),
        keep_aspect_ratio_policy: policy,
    };
    let r = resize(&[], AspectPolicy::Stretch);
    let img = In::f32(&["n", "3", "h", "5"]);
    let scales = In::floats(&[1.0, 1.0, 2.0, 1.5]);
    assert_eq!(
        run(&r, &[Some(&img), None, Some(&scales)], 1)
            .unwrap()
            .types[0]
            .to_string(),
        "f32[n, 3, 2*h, 7]"
    );
    let scales = In::floats(&[1.0, 1.0, 0.5, 0.5]);
    assert_eq!(
        run(&r, &[Some(&img), None, Some(&scales)], 1)
            .unwrap()
            .types[0]
            .to_string(),
        "f32[n, 3, resize_0, 2]"
    );
    let sizes = In::syms(&["n", "3", "64", "s"]);
    assert_eq!(
        run(&r, &[Some(&img), None, None, Some(&sizes)], 1)
            .unwrap()
            .types[0]
            .to_string(),
        "f32[n, 3, 64, s]"
    );
    // Empty scales with sizes (older exports).
    assert_eq!(
        run(
            &r,
            &[
                Some(&img),
                Some(&In::floats(&[])),
                Some(&In::floats(&[])),
                Some(&sizes)
            ],
            1
        )
        .unwrap()
        .types[0]
            .to_string(),
        "f32[n, 3, 64, s]"
    );
    let r2 = resize(&[2, 3], AspectPolicy::NotLarger);
    let img = In::f32(&["1", "3", "10", "20"]);
    assert_eq!(
        run(&r2, &[Some(&img), None, None, Some(&In::ints(&[5, 5]))], 1)
            .unwrap()
            .types[0]
            .to_string(),
        "f32[1, 3, 3, 5]"
    );
    assert!(run(&r, &[Some(&img)], 1)
        .unwrap_err()
        .contains("needs scales"));
    assert!(run(&r, &[Some(&img), None, Some(&In::floats(&[2.0]))], 1)
        .unwrap_err()
        .contains("vector of 4 values"));

    let gs = Op::GridSample {
        mode: GridSampleMode::Linear,
        padding_mode: GridPadding::Zeros,
        align_corners: false,
    };
    assert_eq!(
        shape1(
            &gs,
            &[
                &In::f32(&["n", "c", "h", "w"]),
                &In::f32(&["n", "ho", "wo", "2"])
            ]
        ),
        "f32[n, c, ho, wo]"
    );
    assert!(err_all(
        &gs,
        &[
            &In::f32(&["n", "c", "h", "w"]),
            &In::f32(&["n", "ho", "wo", "3"])
        ],
        1
    )
    .contains("expected 2"));
}

#[test]
fn quantization() {
    let x = In::f32(&["b", "4"]);
    let q = Op::QuantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: DType::U8,
    };
    assert_eq!(shape1(&q, &[&x, &In::fscalar(0.1)]), "u8[b, 4]");
    let zp = In::t(DType::I8, &[]);
    assert_eq!(shape1(&q, &[&x, &In::fscalar(0.1), &zp]), "i8[b, 4]");
    let dq = Op::DequantizeLinear {
        axis: 1,
        block_size: 0,
    };
    let scale = In::t(DType::F16, &[]);
    assert_eq!(
        shape1(&dq, &[&In::t(DType::I8, &["b", "4"]), &scale]),
        "f16[b, 4]"
    );
    assert_eq!(
        shapes(&Op::DynamicQuantizeLinear, &[&x], 3),
        ["u8[b, 4]", "f32[]", "u8[]"]
    );
}

fn attention(q_heads: i64, kv_heads: i64) -> Op {
    Op::Attention {
        is_causal: true,
        kv_num_heads: kv_heads,
        q_num_heads: q_heads,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        left_window_size: -1,
        right_window_size: -1,
    }
}

#[test]
fn attention_3d_and_4d() {
    // 3-D, grouped-query: 8 query heads, 2 kv heads, head size 16, v head size 32.
    let q = In::f32(&["b", "s", "128"]);
    let k = In::f32(&["b", "t", "32"]);
    let v = In::f32(&["b", "t", "64"]);
    assert_eq!(
        shapes(&attention(8, 2), &[&q, &k, &v], 4),
        [
            "f32[b, s, 256]",
            "f32[b, 2, t, 16]",
            "f32[b, 2, t, 32]",
            "f32[b, 8, s, t]"
        ]
    );
    // 4-D with a cache.
    let q = In::f32(&["b", "8", "s", "16"]);
    let k = In::f32(&["b", "2", "s", "16"]);
    let v = In::f32(&["b", "2", "s", "16"]);
    let pk = In::f32(&["b", "2", "past", "16"]);
    let r = run(
        &attention(0, 0),
        &[Some(&q), Some(&k), Some(&v), None, Some(&pk), Some(&pk)],
        4,
    )
    .unwrap();
    let got: Vec<String> = r.types.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "f32[b, 8, s, 16]",
            "f32[b, 2, past + s, 16]",
            "f32[b, 2, past + s, 16]",
            "f32[b, 8, s, past + s]"
        ]
    );
    assert!(
        err_all(&attention(0, 2), &[&In::f32(&["b", "s", "128"]), &k, &v], 1)
            .contains("positive head count")
    );
    assert!(err_all(
        &attention(3, 2),
        &[
            &In::f32(&["b", "s", "128"]),
            &In::f32(&["b", "t", "32"]),
            &In::f32(&["b", "t", "32"])
        ],
        1
    )
    .contains("not divisible by 3 heads"));
    assert!(err_all(
        &attention(0, 0),
        &[
            &In::f32(&["b", "8", "s", "16"]),
            &In::f32(&["b", "3", "s", "16"]),
            &In::f32(&["b", "3", "s", "16"])
        ],
        1
    )
    .contains("not a multiple of 3"));
    assert!(err_all(
        &attention(0, 0),
        &[
            &In::f32(&["b", "8", "s", "16"]),
            &In::f32(&["b", "2", "s", "8"]),
            &v
        ],
        1
    )
    .contains("head sizes differ"));
    let rope = Op::RotaryEmbedding {
        interleaved: false,
        num_heads: 0,
        rotary_embedding_dim: 0,
    };
    let cache = In::f32(&["s", "8"]);
    assert_eq!(shape1(&rope, &[&q, &cache, &cache]), "f32[b, 8, s, 16]");
}

#[test]
fn recurrent() {
    let x = In::f32(&["t", "b", "10"]);
    let lstm = |direction, layout| Op::Lstm {
        direction,
        hidden_size: 20,
        layout,
        input_forget: false,
        clip: None,
        activations: vec![],
        activation_alpha: vec![],
        activation_beta: vec![],
    };
    let w = In::f32(&["2", "80", "10"]);
    let r = In::f32(&["2", "80", "20"]);
    assert_eq!(
        shapes(&lstm(RnnDirection::Bidirectional, 0), &[&x, &w, &r], 3),
        ["f32[t, 2, b, 20]", "f32[2, b, 20]", "f32[2, b, 20]"]
    );
    let xb = In::f32(&["b", "t", "10"]);
    assert_eq!(
        shapes(&lstm(RnnDirection::Bidirectional, 1), &[&xb, &w, &r], 2),
        ["f32[b, t, 2, 20]", "f32[b, 2, 20]"]
    );
    assert!(err_all(&lstm(RnnDirection::Forward, 0), &[&x, &w, &r], 1).contains("directions"));
    let gru = Op::Gru {
        direction: RnnDirection::Forward,
        hidden_size: 0,
        layout: 0,
        linear_before_reset: false,
        clip: None,
        activations: vec![],
        activation_alpha: vec![],
        activation_beta: vec![],
    };
    let w1 = In::f32(&["1", "48", "10"]);
    let r1 = In::f32(&["1", "48", "16"]);
    assert_eq!(
        shapes(&gru, &[&x, &w1, &r1], 2),
        ["f32[t, 1, b, 16]", "f32[1, b, 16]"]
    );
    assert!(err_all(&gru, &[&x, &w1, &r1], 3).contains("2 result(s), 3 requested"));
    let rnn = Op::Rnn {
        direction: RnnDirection::Reverse,
        hidden_size: 4,
        layout: 2,
        clip: None,
        activations: vec![],
        activation_alpha: vec![],
        activation_beta: vec![],
    };
    assert!(err_all(&rnn, &[&x, &w1, &r1], 1).contains("layout must be 0 or 1"));
}

#[test]
fn reduce_axes_operand() {
    let red = |keep: bool, noop: bool| Op::Reduce {
        kind: ReduceKind::Sum,
        axes: vec![],
        keep_dims: keep,
        noop_with_empty_axes: noop,
    };
    let x = In::f32(&["b", "1", "8"]);
    // Known operand values act as the attribute.
    assert_eq!(
        shape1(&red(true, false), &[&x, &In::ints(&[-1, 0])]),
        "f32[1, 1, 1]"
    );
    assert_eq!(
        shape1(&red(false, false), &[&x, &In::ints(&[2])]),
        "f32[b, 1]"
    );
    // Run-time axes, keep_dims: same rank, each dim itself or 1 (known 1 stays 1).
    let two = In::t(DType::I64, &["2"]);
    assert_eq!(
        shape1(&red(true, false), &[&x, &two]),
        "f32[reduce_0, 1, reduce_1]"
    );
    // The length does not matter with keep_dims, even with noop.
    let n = In::t(DType::I64, &["n"]);
    assert_eq!(
        shape1(&red(true, true), &[&x, &n]),
        "f32[reduce_0, 1, reduce_1]"
    );
    // Without keep_dims the rank is rank - len.
    assert_eq!(shape1(&red(false, false), &[&x, &two]), "f32[reduce_0]");
    assert_eq!(
        shape1(&red(false, false), &[&In::f32(&["1", "1", "1"]), &two]),
        "f32[1]"
    );
    assert_eq!(
        shape1(&red(false, false), &[&x, &In::t(DType::I64, &["3"])]),
        "f32[]"
    );
    let e = err_all(&red(false, false), &[&x, &In::t(DType::I64, &["4"])], 1);
    assert!(e.contains("4 axes to reduce for rank 3"), "{e}");
    // Unknown length without keep_dims: unknown rank.
    for noop in [false, true] {
        let e = err_all(&red(false, noop), &[&x, &n], 1);
        assert!(e.starts_with(crate::infer::RUNTIME_AXES_RANK), "{e}");
    }
    // Known-empty operand: everything reduced, or the identity with noop.
    let none = In::t(DType::I64, &["0"]);
    assert_eq!(shape1(&red(false, false), &[&x, &none]), "f32[]");
    assert_eq!(shape1(&red(true, false), &[&x, &none]), "f32[1, 1, 1]");
    assert_eq!(shape1(&red(false, true), &[&x, &none]), "f32[b, 1, 8]");
    let e = err_all(
        &Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
            keep_dims: true,
            noop_with_empty_axes: false,
        },
        &[&x, &two],
        1,
    );
    assert!(e.contains("both as the attribute"), "{e}");
    let e = err_all(&red(true, false), &[&x, &In::f32(&["1"])], 1);
    assert!(e.contains("must be integer"), "{e}");
}
