//! Losses, ai.onnx.ml ops, SwiGLU, Det, CenterCropPad, Col2Im, AffineGrid, TensorScatter.

use super::*;
use crate::*;

#[test]
fn losses() {
    let x = In::f32(&["n", "5", "6", "7"]);
    let t = In::t(DType::I64, &["n", "6", "7"]);
    let w = In::f32(&["5"]);
    let nll = |reduction| Op::NllLoss {
        reduction,
        ignore_index: Some(-1),
    };
    assert_eq!(shape1(&nll(LossReduction::None), &[&x, &t]), "f32[n, 6, 7]");
    assert_eq!(shape1(&nll(LossReduction::Mean), &[&x, &t, &w]), "f32[]");
    let sce = Op::SoftmaxCrossEntropy {
        reduction: LossReduction::Sum,
        ignore_index: None,
    };
    assert_eq!(shapes(&sce, &[&x, &t], 2), ["f32[]", "f32[n, 5, 6, 7]"]);
    let bad_t = In::t(DType::I32, &["n", "6", "8"]);
    assert!(err_all(&nll(LossReduction::Sum), &[&x, &bad_t], 1).contains("spatial"));
    let float_t = In::f32(&["n", "6", "7"]);
    assert!(err_all(&nll(LossReduction::Sum), &[&x, &float_t], 1).contains("integer"));
    let bad_w = In::f32(&["4"]);
    assert!(err_all(&nll(LossReduction::Sum), &[&x, &t, &bad_w], 1).contains("weight"));
}

#[test]
fn misc_shapes() {
    let a = In::t(DType::F16, &["b", "4"]);
    assert_eq!(shape1(&Op::SwiGlu { alpha: 1.0 }, &[&a, &a]), "f16[b, 4]");
    let b = In::t(DType::F16, &["b", "1"]);
    assert!(err_all(&Op::SwiGlu { alpha: 1.0 }, &[&a, &b], 1).contains("broadcasting"));

    assert_eq!(shape1(&Op::Det, &[&In::f32(&["3", "2", "2"])]), "f32[3]");
    assert_eq!(shape1(&Op::Det, &[&In::f32(&["2", "2"])]), "f32[]");
    assert!(err_all(&Op::Det, &[&In::f32(&["2", "3"])], 1).contains("square"));

    let x = In::f32(&["20", "8", "3"]);
    let ccp = |axes: &[i64]| Op::CenterCropPad {
        axes: axes.to_vec(),
    };
    assert_eq!(
        shape1(&ccp(&[0, 1]), &[&x, &In::ints(&[10, 9])]),
        "f32[10, 9, 3]"
    );
    assert_eq!(
        shape1(&ccp(&[]), &[&x, &In::ints(&[1, 2, 3])]),
        "f32[1, 2, 3]"
    );
    let dynamic = In::t(DType::I64, &["2"]);
    assert_eq!(
        shape1(&ccp(&[-1, 0]), &[&x, &dynamic]),
        "f32[center_crop_pad_1, 8, center_crop_pad_0]"
    );
    assert!(err_all(&ccp(&[0]), &[&x, &In::ints(&[1, 2])], 1).contains("2 elements for 1"));

    let col = |strides: &[i64]| Op::Col2Im {
        dilations: vec![],
        pads: vec![],
        strides: strides.to_vec(),
    };
    let cols = In::f32(&["1", "10", "12"]);
    assert_eq!(
        shape1(
            &col(&[]),
            &[&cols, &In::ints(&[3, 4, 5]), &In::ints(&[1, 1, 5])]
        ),
        "f32[1, 2, 3, 4, 5]"
    );
    assert!(err_all(
        &col(&[]),
        &[&cols, &In::ints(&[3, 4]), &In::ints(&[3, 1])],
        1
    )
    .contains("multiple"));
    assert!(err_all(
        &col(&[1]),
        &[&cols, &In::ints(&[3, 4]), &In::ints(&[1, 2])],
        1
    )
    .contains("strides"));

    let theta = In::f32(&["n", "2", "3"]);
    assert_eq!(
        shape1(
            &Op::AffineGrid {
                align_corners: false
            },
            &[&theta, &In::syms(&["n", "3", "5", "6"])]
        ),
        "f32[n, 5, 6, 2]"
    );
    let theta3 = In::f32(&["2", "3", "4"]);
    assert_eq!(
        shape1(
            &Op::AffineGrid {
                align_corners: true
            },
            &[&theta3, &In::t(DType::I64, &["5"])]
        ),
        "f32[2, affine_grid_2, affine_grid_3, affine_grid_4, 3]"
    );

    let ts = Op::TensorScatter {
        axis: -2,
        mode: TensorScatterMode::Linear,
    };
    let past = In::f32(&["2", "1", "4", "5"]);
    let upd = In::f32(&["2", "1", "2", "5"]);
    assert_eq!(shape1(&ts, &[&past, &upd]), "f32[2, 1, 4, 5]");
    assert!(err_all(&ts, &[&upd, &past], 1).contains("4 > 2"));

    let x = In::f32(&["3", "4"]);
    assert_eq!(
        shape1(&Op::Binarizer { threshold: 0.5 }, &[&x]),
        "f32[3, 4]"
    );
    let idx = In::ints(&[0, 2]);
    assert_eq!(shape1(&Op::ArrayFeatureExtractor, &[&x, &idx]), "f32[3, 2]");
    assert_eq!(
        shape1(&Op::ArrayFeatureExtractor, &[&In::f32(&["4"]), &idx]),
        "f32[1, 2]"
    );
    let le = Op::LabelEncoder {
        int_keys: vec![1],
        float_keys: vec![],
        int_values: vec![],
        float_values: vec![0.5],
        default: Scalar::Float(DType::F64, 0.0),
    };
    assert_eq!(shape1(&le, &[&In::t(DType::I32, &["k"])]), "f64[k]");
}
