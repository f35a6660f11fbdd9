use crate::ops::OpCtx;
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{AutoPad, DType, Graph, Node, Op, PoolKind, TensorType};

/// Runs `op` on `inputs` with `outs` result slots typed as given.
pub(crate) fn run_op(op: Op, inputs: &[Option<&Tensor>], outs: &[DType]) -> Vec<Option<Tensor>> {
    let mut g = Graph::new("t");
    let outputs = outs
        .iter()
        .enumerate()
        .map(|(i, &d)| Some(g.add_input(format!("o{i}"), TensorType::known(d, &[]))))
        .collect();
    let node = Node {
        name: "n".into(),
        op: op.clone(),
        inputs: vec![],
        outputs,
    };
    let ctx = OpCtx {
        graph: &g,
        node: &node,
    };
    crate::ops::eval(&op, inputs, &ctx).expect("op runs")
}

fn run1(op: Op, inputs: &[&Tensor]) -> Tensor {
    let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
    run_op(op, &ins, &[DType::F32]).remove(0).unwrap()
}

fn f(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::f32s(shape, v.to_vec())
}

fn range(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    f(shape, &(0..n).map(|i| i as f32).collect::<Vec<_>>())
}

#[track_caller]
fn close(t: &Tensor, shape: &[usize], want: &[f64]) {
    assert_eq!(t.shape(), shape, "shape");
    let got = t.to_f64_vec();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}\n{got:?}"
        );
    }
}

#[test]
fn matmul_2d_and_promotion() {
    let a = f(&[2, 2], &[1., 2., 3., 4.]);
    let b = f(&[2, 2], &[5., 6., 7., 8.]);
    close(&run1(Op::MatMul, &[&a, &b]), &[2, 2], &[19., 22., 43., 50.]);
    let v = f(&[2], &[1., 2.]);
    close(&run1(Op::MatMul, &[&v, &a]), &[2], &[7., 10.]);
    close(&run1(Op::MatMul, &[&a, &v]), &[2], &[5., 11.]);
    close(&run1(Op::MatMul, &[&v, &v]), &[], &[5.]);
}

#[test]
fn matmul_batch_broadcast() {
    // a [2, 1, 2, 2] @ b [3, 2, 2] -> [2, 3, 2, 2]
    let a = range(&[2, 1, 2, 2]);
    let b = range(&[3, 2, 2]);
    let y = run1(Op::MatMul, &[&a, &b]);
    assert_eq!(y.shape(), &[2, 3, 2, 2]);
    let v = y.to_f64_vec();
    // y[1, 2] = [[4,5],[6,7]] @ [[8,9],[10,11]] = [[82, 91], [118, 131]]
    assert_eq!(&v[20..24], &[82., 91., 118., 131.]);
    // 1-D b against batched a: [2,1,2,2] @ [2] -> [2,1,2]
    let y = run1(Op::MatMul, &[&a, &f(&[2], &[1., 1.])]);
    close(&y, &[2, 1, 2], &[1., 5., 9., 13.]);
}

#[test]
fn matmul_ints_wrap() {
    let a = Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![i32::MAX, 1]).unwrap());
    let b = Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![1, 1]).unwrap());
    let y = run1(Op::MatMul, &[&a, &b]);
    assert_eq!(y.to_i64_vec().unwrap(), vec![i32::MIN as i64]);
}

#[test]
fn gemm_attributes() {
    let a = f(&[2, 2], &[1., 2., 3., 4.]);
    let b = f(&[2, 2], &[5., 7., 6., 8.]); // transposed
    let c = f(&[2], &[1., 2.]);
    let op = Op::Gemm {
        alpha: 2.0,
        beta: 0.5,
        trans_a: false,
        trans_b: true,
    };
    close(
        &run1(op.clone(), &[&a, &b, &c]),
        &[2, 2],
        &[38.5, 45., 86.5, 101.],
    );
    let ins = [Some(&a), Some(&b), None];
    let y = run_op(op, &ins, &[DType::F32]).remove(0).unwrap();
    close(&y, &[2, 2], &[38., 44., 86., 100.]);
}

fn conv_op(
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

#[test]
fn conv_padding_strides() {
    let x = range(&[1, 1, 5, 5]);
    let w = f(&[1, 1, 3, 3], &[1.; 9]);
    let y = run1(
        conv_op(&[3, 3], &[], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet),
        &[&x, &w],
    );
    #[rustfmt::skip]
    close(&y, &[1, 1, 5, 5], &[
        12., 21., 27., 33., 24., 33., 54., 63., 72., 51., 63., 99., 108., 117., 81.,
        93., 144., 153., 162., 111., 72., 111., 117., 123., 84.,
    ]);
    let y = run1(conv_op(&[], &[], &[], &[], 1, AutoPad::NotSet), &[&x, &w]);
    close(
        &y,
        &[1, 1, 3, 3],
        &[54., 63., 72., 99., 108., 117., 144., 153., 162.],
    );
    let y = run1(
        conv_op(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet),
        &[&x, &w],
    );
    close(
        &y,
        &[1, 1, 3, 3],
        &[12., 27., 24., 63., 108., 81., 72., 117., 84.],
    );
    let y = run1(
        conv_op(&[3, 3], &[2, 2], &[], &[], 1, AutoPad::SameLower),
        &[&x, &w],
    );
    close(
        &y,
        &[1, 1, 3, 3],
        &[12., 27., 24., 63., 108., 81., 72., 117., 84.],
    );
    // Asymmetric pads: [top=1, left=0, bottom=1, right=0], strides 2.
    let y = run1(
        conv_op(&[3, 3], &[2, 2], &[1, 0, 1, 0], &[], 1, AutoPad::NotSet),
        &[&x, &w],
    );
    close(&y, &[1, 1, 3, 2], &[21., 33., 99., 117., 111., 123.]);
}

#[test]
fn conv_group_bias_dilation() {
    let x = range(&[1, 2, 2, 2]);
    let w = f(&[2, 1, 1, 1], &[2., 3.]);
    let b = f(&[2], &[1., -1.]);
    let y = run1(
        conv_op(&[], &[], &[], &[], 2, AutoPad::NotSet),
        &[&x, &w, &b],
    );
    close(&y, &[1, 2, 2, 2], &[1., 3., 5., 7., 11., 14., 17., 20.]);
    // 1-D, dilation 2.
    let x = f(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let w = f(&[1, 1, 2], &[1., 1.]);
    let y = run1(conv_op(&[], &[], &[], &[2], 1, AutoPad::NotSet), &[&x, &w]);
    close(&y, &[1, 1, 3], &[4., 6., 8.]);
    // 3-D: a 2x2x2 ones kernel over a 2x2x3 ramp sums each window.
    let x = range(&[1, 1, 2, 2, 3]);
    let w = f(&[1, 1, 2, 2, 2], &[1.; 8]);
    let y = run1(conv_op(&[], &[], &[], &[], 1, AutoPad::NotSet), &[&x, &w]);
    close(
        &y,
        &[1, 1, 1, 1, 2],
        &[
            0. + 1. + 3. + 4. + 6. + 7. + 9. + 10.,
            2. + 4. + 5. + 7. + 8. + 10. + 11. + 1.,
        ],
    );
}

/// `conv_nhwc` by hand: channels-last data, `[kh, kw, C/g, M]` weights.
#[test]
fn conv_nhwc_by_hand() {
    let nhwc = |strides: &[i64], pads: &[i64], group: i64| Op::ConvNhwc {
        kernel_shape: vec![],
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![],
        group,
        auto_pad: AutoPad::NotSet,
    };
    // One channel: the same numbers as NCHW (3×3 ones, stride 2, pad 1 over a 5×5 ramp).
    let x = range(&[1, 5, 5, 1]);
    let w = f(&[3, 3, 1, 1], &[1.; 9]);
    let y = run1(nhwc(&[2, 2], &[1, 1, 1, 1], 1), &[&x, &w]);
    close(
        &y,
        &[1, 3, 3, 1],
        &[12., 27., 24., 63., 108., 81., 72., 117., 84.],
    );
    // Two groups of one channel, pixel (h, w) holding channels (2h + w, 4 + 2h + w):
    // channel 0 times 2 plus 1, channel 1 times 3 minus 1, interleaved per pixel.
    let x = f(&[1, 2, 2, 2], &[0., 4., 1., 5., 2., 6., 3., 7.]);
    let w = f(&[1, 1, 1, 2], &[2., 3.]);
    let b = f(&[2], &[1., -1.]);
    let y = run1(nhwc(&[], &[], 2), &[&x, &w, &b]);
    close(&y, &[1, 2, 2, 2], &[1., 11., 3., 14., 5., 17., 7., 20.]);
    // Mismatched ranks are an error, not a panic.
    let p = super::conv::ConvParams {
        kernel_shape: &[],
        strides: &[],
        pads: &[],
        dilations: &[],
        group: 1,
        auto_pad: AutoPad::NotSet,
    };
    let w3 = f(&[1, 1, 2], &[1., 1.]);
    assert!(super::conv::conv_nhwc(&[Some(&x), Some(&w3)], &p).is_err());
}

#[test]
fn conv_transpose_basic_and_output_shape() {
    let x = range(&[1, 1, 3, 3]);
    let w = f(&[1, 2, 3, 3], &[1.; 18]);
    let op = |strides: &[i64], out_pad: &[i64], out_shape: &[i64]| Op::ConvTranspose {
        kernel_shape: vec![],
        strides: strides.to_vec(),
        pads: vec![],
        dilations: vec![],
        group: 1,
        auto_pad: AutoPad::NotSet,
        output_padding: out_pad.to_vec(),
        output_shape: out_shape.to_vec(),
    };
    let y = run1(op(&[], &[], &[]), &[&x, &w]);
    #[rustfmt::skip]
    let one = [
        0., 1., 3., 3., 2., 3., 8., 15., 12., 7., 9., 21., 36., 27., 15.,
        9., 20., 33., 24., 13., 6., 13., 21., 15., 8.,
    ];
    let want: Vec<f64> = one.iter().chain(one.iter()).copied().collect();
    close(&y, &[1, 2, 5, 5], &want);
    // output_padding and output_shape give the same 10x8 result.
    let a = run1(op(&[3, 2], &[1, 1], &[]), &[&x, &w]);
    let b = run1(op(&[3, 2], &[], &[10, 8]), &[&x, &w]);
    assert_eq!(a.shape(), &[1, 2, 10, 8]);
    assert_eq!(a, b);
    let v = a.to_f64_vec();
    assert_eq!(&v[..8], &[0., 0., 1., 1., 3., 2., 2., 0.]);
    assert_eq!(&v[72..80], &[0.; 8]);
}

fn pool_op(
    kind: PoolKind,
    kernel: &[i64],
    strides: &[i64],
    pads: &[i64],
    ceil: bool,
    include_pad: bool,
) -> Op {
    Op::Pool {
        kind,
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![],
        auto_pad: AutoPad::NotSet,
        ceil_mode: ceil,
        count_include_pad: include_pad,
        p: 2,
        storage_order: 0,
    }
}

#[test]
fn max_pool_with_indices() {
    let x = range(&[1, 1, 4, 4]);
    let op = pool_op(PoolKind::Max, &[2, 2], &[2, 2], &[], false, false);
    let r = run_op(op, &[Some(&x)], &[DType::F32, DType::I64]);
    close(r[0].as_ref().unwrap(), &[1, 1, 2, 2], &[5., 7., 13., 15.]);
    assert_eq!(
        r[1].as_ref().unwrap().to_i64_vec().unwrap(),
        vec![5, 7, 13, 15]
    );
    // Column-major indices, second image offset by its plane.
    let x = range(&[2, 1, 2, 3]);
    let mut op = pool_op(PoolKind::Max, &[2, 2], &[1, 1], &[], false, false);
    if let Op::Pool { storage_order, .. } = &mut op {
        *storage_order = 1;
    }
    let r = run_op(op, &[Some(&x)], &[DType::F32, DType::I64]);
    close(r[0].as_ref().unwrap(), &[2, 1, 1, 2], &[4., 5., 10., 11.]);
    // (h=1, w=1) -> 1 + 1*2 = 3; (1, 2) -> 5; plus 6 for the second plane.
    assert_eq!(
        r[1].as_ref().unwrap().to_i64_vec().unwrap(),
        vec![3, 5, 9, 11]
    );
}

#[test]
fn pool_ceil_mode_and_padding() {
    let x = f(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let y = run1(
        pool_op(PoolKind::Average, &[2], &[2], &[], false, false),
        &[&x],
    );
    close(&y, &[1, 1, 2], &[1.5, 3.5]);
    let y = run1(
        pool_op(PoolKind::Average, &[2], &[2], &[], true, false),
        &[&x],
    );
    close(&y, &[1, 1, 3], &[1.5, 3.5, 5.]);
    let y = run1(pool_op(PoolKind::Max, &[2], &[2], &[], true, false), &[&x]);
    close(&y, &[1, 1, 3], &[2., 4., 5.]);
    // Padding, with and without counting it.
    let x = f(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let y = run1(
        pool_op(
            PoolKind::Average,
            &[3, 3],
            &[1, 1],
            &[1, 1, 1, 1],
            false,
            false,
        ),
        &[&x],
    );
    close(&y, &[1, 1, 2, 2], &[2.5; 4]);
    let y = run1(
        pool_op(
            PoolKind::Average,
            &[3, 3],
            &[1, 1],
            &[1, 1, 1, 1],
            false,
            true,
        ),
        &[&x],
    );
    close(&y, &[1, 1, 2, 2], &[10. / 9.; 4]);
    // ceil_mode: the last window starting in the end padding is dropped.
    let x = range(&[1, 1, 4]);
    let y = run1(
        pool_op(PoolKind::Max, &[2], &[2], &[0, 1], true, false),
        &[&x],
    );
    close(&y, &[1, 1, 2], &[1., 3.]);
    // Lp (p = 2).
    let x = f(&[1, 1, 2], &[3., -4.]);
    let y = run1(pool_op(PoolKind::Lp, &[2], &[1], &[], false, false), &[&x]);
    close(&y, &[1, 1, 1], &[5.]);
}

#[test]
fn global_pools() {
    let x = range(&[1, 2, 2, 2]);
    let y = run1(
        Op::GlobalPool {
            kind: PoolKind::Average,
            p: 2,
        },
        &[&x],
    );
    close(&y, &[1, 2, 1, 1], &[1.5, 5.5]);
    let y = run1(
        Op::GlobalPool {
            kind: PoolKind::Max,
            p: 2,
        },
        &[&x],
    );
    close(&y, &[1, 2, 1, 1], &[3., 7.]);
}

#[test]
fn max_unpool_places_values() {
    let x = f(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let i = Tensor::i64s(&[1, 1, 2, 2], vec![5, 7, 13, 15]);
    let op = Op::MaxUnpool {
        kernel_shape: vec![2, 2],
        strides: vec![2, 2],
        pads: vec![],
    };
    let y = run1(op, &[&x, &i]);
    let mut want = vec![0.; 16];
    want[5] = 1.;
    want[7] = 2.;
    want[13] = 3.;
    want[15] = 4.;
    close(&y, &[1, 1, 4, 4], &want);
}

#[test]
fn quantize_rounds_half_to_even_and_saturates() {
    let x = f(&[6], &[0., 1.5, 2.5, -1.5, 300., -300.]);
    let s = f(&[], &[1.]);
    let zp = Tensor::U8(ArrayD::from_elem(IxDyn(&[]), 128));
    let op = Op::QuantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: DType::U8,
    };
    let y = run1(op.clone(), &[&x, &s, &zp]);
    assert_eq!(y.dtype(), DType::U8);
    assert_eq!(y.to_i64_vec().unwrap(), vec![128, 130, 130, 126, 255, 0]);
    let zp8 = Tensor::I8(ArrayD::from_elem(IxDyn(&[]), 0));
    let y = run1(op.clone(), &[&x, &s, &zp8]);
    assert_eq!(y.to_i64_vec().unwrap(), vec![0, 2, 2, -2, 127, -128]);
    // Per axis.
    let x = f(&[2, 2], &[1., 2., 3., 4.]);
    let s = f(&[2], &[1., 2.]);
    let y = run1(op.clone(), &[&x, &s]);
    assert_eq!(y.to_i64_vec().unwrap(), vec![1, 1, 3, 2]);
    // Blocked along axis 1, block 2 (the last block short).
    let x = f(&[1, 5], &[2., 2., 2., 2., 2.]);
    let s = f(&[1, 3], &[1., 2., 4.]);
    let op = Op::QuantizeLinear {
        axis: 1,
        block_size: 2,
        output_dtype: DType::U8,
    };
    let y = run1(op, &[&x, &s]);
    assert_eq!(y.to_i64_vec().unwrap(), vec![2, 2, 1, 1, 0]);
}

#[test]
fn dequantize_and_dynamic_quantize() {
    let x = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0, 128, 255]).unwrap());
    let s = f(&[], &[2.]);
    let zp = Tensor::U8(ArrayD::from_elem(IxDyn(&[]), 128));
    let y = run1(
        Op::DequantizeLinear {
            axis: 1,
            block_size: 0,
        },
        &[&x, &s, &zp],
    );
    close(&y, &[3], &[-256., 0., 254.]);
    let x = f(&[3], &[0., 2., -1.]);
    let r = run_op(
        Op::DynamicQuantizeLinear,
        &[Some(&x)],
        &[DType::U8, DType::F32, DType::U8],
    );
    assert_eq!(
        r[0].as_ref().unwrap().to_i64_vec().unwrap(),
        vec![85, 255, 0]
    );
    close(r[1].as_ref().unwrap(), &[], &[3. / 255.]);
    assert_eq!(r[2].as_ref().unwrap().to_i64_vec().unwrap(), vec![85]);
}

#[test]
fn integer_contractions() {
    let a = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![10, 20]).unwrap());
    let b = Tensor::I8(ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![-1, 2]).unwrap());
    let za = Tensor::U8(ArrayD::from_elem(IxDyn(&[]), 10));
    let y = run1(Op::MatMulInteger, &[&a, &b, &za]);
    assert_eq!(y.dtype(), DType::I32);
    assert_eq!(y.to_i64_vec().unwrap(), vec![20]);
    let x = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 1, 3]), vec![1, 2, 3]).unwrap());
    let w = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 1, 2]), vec![1, 1]).unwrap());
    let zx = Tensor::U8(ArrayD::from_elem(IxDyn(&[]), 1));
    let op = Op::ConvInteger {
        kernel_shape: vec![],
        strides: vec![],
        pads: vec![1, 0],
        dilations: vec![],
        group: 1,
        auto_pad: AutoPad::NotSet,
    };
    // Padding is the zero point: x - zp = [0, 1, 2] with a leading 0.
    let y = run1(op, &[&x, &w, &zx]);
    assert_eq!(y.to_i64_vec().unwrap(), vec![0, 1, 3]);
}

#[test]
fn einsum_forms() {
    let a = range(&[2, 3]);
    let b = range(&[3, 2]);
    let e = |eq: &str| Op::Einsum {
        equation: eq.into(),
    };
    let mm = run1(Op::MatMul, &[&a, &b]).to_f64_vec();
    close(&run1(e("ij,jk->ik"), &[&a, &b]), &[2, 2], &mm);
    close(&run1(e("ij,jk"), &[&a, &b]), &[2, 2], &mm);
    close(
        &run1(e("ij->ji"), &[&a]),
        &[3, 2],
        &[0., 3., 1., 4., 2., 5.],
    );
    close(&run1(e("ij->"), &[&a]), &[], &[15.]);
    let sq = range(&[3, 3]);
    close(&run1(e("ii->i"), &[&sq]), &[3], &[0., 4., 8.]);
    close(&run1(e("ii"), &[&sq]), &[], &[12.]);
    let v = f(&[3], &[1., 2., 3.]);
    close(&run1(e("i,i"), &[&v, &v]), &[], &[14.]);
    let bt = range(&[2, 2, 3]);
    let y = run1(e("...ij->...ji"), &[&bt]);
    close(
        &y,
        &[2, 3, 2],
        &[0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.],
    );
    let y = run1(e("bij,bjk->bik"), &[&bt, &range(&[2, 3, 1])]);
    close(&y, &[2, 2, 1], &[5., 14., 86., 122.]);
}

#[test]
fn attention_small() {
    let q = f(&[1, 1, 1, 2], &[1., 0.]);
    let k = f(&[1, 1, 2, 2], &[1., 0., 0., 1.]);
    let v = f(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
    let op = |causal: bool| Op::Attention {
        is_causal: causal,
        kv_num_heads: 0,
        q_num_heads: 0,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        left_window_size: -1,
        right_window_size: -1,
    };
    let a = (1.0f64 / 2f64.sqrt()).exp();
    let (p0, p1) = (a / (a + 1.), 1. / (a + 1.));
    let y = run1(op(false), &[&q, &k, &v]);
    close(&y, &[1, 1, 1, 2], &[p0 + 3. * p1, 2. * p0 + 4. * p1]);
    // Causal, two queries: the first sees key 0 only.
    let q2 = f(&[1, 1, 2, 2], &[1., 0., 1., 0.]);
    let y = run1(op(true), &[&q2, &k, &v]);
    close(
        &y,
        &[1, 1, 2, 2],
        &[1., 2., p0 + 3. * p1, 2. * p0 + 4. * p1],
    );
    // Boolean mask hiding key 0 sends everything to v1; 3-D layout with 1 head.
    let m = Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![false, true]).unwrap());
    let q3 = f(&[1, 1, 2], &[1., 0.]);
    let k3 = f(&[1, 2, 2], &[1., 0., 0., 1.]);
    let v3 = f(&[1, 2, 2], &[1., 2., 3., 4.]);
    let mut o = op(false);
    if let Op::Attention {
        q_num_heads,
        kv_num_heads,
        ..
    } = &mut o
    {
        *q_num_heads = 1;
        *kv_num_heads = 1;
    }
    let y = run1(o, &[&q3, &k3, &v3, &m]);
    close(&y, &[1, 1, 2], &[3., 4.]);
}

#[test]
fn attention_sliding_window() {
    // Zero queries and keys give uniform weights over the keys a window lets through;
    // v = [1, 2, 3] so each output is the mean of the visible values.
    let q = f(&[1, 1, 3, 1], &[0., 0., 0.]);
    let v = f(&[1, 1, 3, 1], &[1., 2., 3.]);
    let op = |left, right| Op::Attention {
        is_causal: false,
        kv_num_heads: 0,
        q_num_heads: 0,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        left_window_size: left,
        right_window_size: right,
    };
    // Keys at or after the query: means of [1, 2, 3], [2, 3], [3].
    close(
        &run1(op(0, -1), &[&q, &q, &v]),
        &[1, 1, 3, 1],
        &[2., 2.5, 3.],
    );
    // Keys at or before it: [1], [1, 2], [1, 2, 3].
    close(
        &run1(op(-1, 0), &[&q, &q, &v]),
        &[1, 1, 3, 1],
        &[1., 1.5, 2.],
    );
    // One key either side: [1, 2], [1, 2, 3], [2, 3].
    close(
        &run1(op(1, 1), &[&q, &q, &v]),
        &[1, 1, 3, 1],
        &[1.5, 2., 2.5],
    );
}

#[test]
fn rotary_embedding_rotates() {
    let x = f(&[1, 1, 1, 4], &[1., 0., 2., 5.]);
    let cos = f(&[1, 1, 1], &[0.]);
    let sin = f(&[1, 1, 1], &[1.]);
    let op = Op::RotaryEmbedding {
        interleaved: false,
        num_heads: 0,
        rotary_embedding_dim: 2,
    };
    let y = run1(op, &[&x, &cos, &sin]);
    close(&y, &[1, 1, 1, 4], &[0., 1., 2., 5.]);
    // Full rotation, interleaved pairs, with position ids into a 2-row cache.
    let x = f(&[1, 1, 1, 2], &[1., 2.]);
    let cos = f(&[2, 1], &[1., 0.]);
    let sin = f(&[2, 1], &[0., 1.]);
    let pos = Tensor::i64s(&[1, 1], vec![1]);
    let op = Op::RotaryEmbedding {
        interleaved: true,
        num_heads: 0,
        rotary_embedding_dim: 0,
    };
    let y = run1(op, &[&x, &cos, &sin, &pos]);
    close(&y, &[1, 1, 1, 2], &[-2., 1.]);
}

/// Timing probe for a VGG-19 conv1_2-sized layer (`cargo test -- --ignored vgg_layer`).
#[test]
#[ignore]
fn vgg_layer_timing() {
    let x = Tensor::f32s(&[1, 64, 224, 224], vec![0.5; 64 * 224 * 224]);
    let w = Tensor::f32s(&[64, 64, 3, 3], vec![0.01; 64 * 64 * 9]);
    let t = std::time::Instant::now();
    let y = run1(
        conv_op(&[3, 3], &[], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet),
        &[&x, &w],
    );
    eprintln!("conv 64x224x224 3x3: {:?}", t.elapsed());
    assert_eq!(y.shape(), &[1, 64, 224, 224]);
}

/// MatMulBlockQuant against values computed by hand: k = 3 in one block of 16 (padded),
/// 4-bit weights rows [1, 2, 3] and [15, 0, 8], scales 0.5 and 2, zero points 1 and 8.
#[test]
fn matmul_block_quant_matches_hand_computed_values() {
    let op = Op::MatMulBlockQuant {
        k: 3,
        n: 2,
        bits: 4,
        block_size: 16,
        accuracy_level: 0,
    };
    let mut b = vec![0u8; 16];
    b[..2].copy_from_slice(&[0x21, 0x03]);
    b[8..10].copy_from_slice(&[0x0F, 0x08]);
    let b = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2, 1, 8]), b).unwrap());
    let a = f(&[2, 3], &[1.0, 2.0, 3.0, 0.0, 1.0, -1.0]);
    let scales = f(&[2], &[0.5, 2.0]);
    let zp = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1, 8]).unwrap());
    let bias = f(&[2], &[1.0, -1.0]);
    let ins = [Some(&a), Some(&b), Some(&scales), Some(&zp), Some(&bias)];
    let y = run_op(op.clone(), &ins, &[DType::F32]).remove(0).unwrap();
    // W = [[0, 0.5, 1], [14, -16, 0]]; a @ W^T + bias.
    assert_eq!(y, f(&[2, 2], &[5.0, -19.0, 0.5, -17.0]));
    // Without zero points, 8: row 0 is [-3.5, -3, -2.5].
    let ins = [Some(&a), Some(&b), Some(&scales)];
    let y = run_op(op.clone(), &ins, &[DType::F32]).remove(0).unwrap();
    assert_eq!(y, f(&[2, 2], &[-17.0, 14.0 - 32.0, -0.5, -16.0]));
    // accuracy_level 4: a's row [1, 2, 3] becomes [42, 85, 127] * 3/127 (1 * 127/3 =
    // 42.33, 2 * 127/3 = 84.67), so y[0] = [0.5*85*3/127 + 3 + 1, (14*42 - 16*85)*3/127 - 1];
    // row [0, 1, -1] is exact (1 * 127/1 = 127).
    let Op::MatMulBlockQuant {
        k,
        n,
        bits,
        block_size,
        ..
    } = op
    else {
        unreachable!()
    };
    let op4 = Op::MatMulBlockQuant {
        k,
        n,
        bits,
        block_size,
        accuracy_level: 4,
    };
    let ins = [Some(&a), Some(&b), Some(&scales), Some(&zp), Some(&bias)];
    let Tensor::F32(y) = run_op(op4, &ins, &[DType::F32]).remove(0).unwrap() else {
        panic!("f32 output")
    };
    let want = [127.5 / 127.0 + 4.0, -2316.0 / 127.0 - 1.0, 0.5, -17.0];
    for (g, w) in y.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{y:?} vs {want:?}");
    }
}

/// rafter's extension: f16 keys and values with f32 queries (an LLM's f16 KV cache) are
/// read as their exact widening, and the products are f16 products as llama.cpp's are:
/// the queries rounded to f16 before `q · k`, the softmax weights before `Σ p v`. Against
/// that definition computed here in f64; the result is f32 and differs from attention
/// over the widened cache with f32 products.
#[test]
fn attention_with_f16_keys_and_values_rounds_its_products_operands() {
    let vals = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 1.7)
            .collect()
    };
    let qf = vals(32, 0.1);
    let (kf, vf) = (vals(40, 0.5), vals(40, 0.9));
    let h16 = |x: f32| half::f16::from_f32(x);
    let half = |x: &[f32]| {
        Tensor::F16(
            ArrayD::from_shape_vec(IxDyn(&[1, 5, 8]), x.iter().map(|&x| h16(x)).collect()).unwrap(),
        )
    };
    let widened = |x: &[f32]| {
        let w: Vec<f32> = x.iter().map(|&x| h16(x).to_f32()).collect();
        f(&[1, 5, 8], &w)
    };
    let op = Op::Attention {
        is_causal: true,
        kv_num_heads: 2,
        q_num_heads: 4,
        qk_matmul_output_mode: 0,
        scale: None,
        softcap: 0.0,
        left_window_size: -1,
        right_window_size: -1,
    };
    let q = f(&[1, 2, 16], &qf);
    let narrow = run1(op.clone(), &[&q, &half(&kf), &half(&vf)]);
    let wide = run1(op, &[&q, &widened(&kf), &widened(&vf)]);
    assert_eq!(narrow.dtype(), DType::F32);
    let Tensor::F32(got) = &narrow else {
        unreachable!()
    };
    let Tensor::F32(exact) = &wide else {
        unreachable!()
    };
    // 2 query rows, 4 query heads of 4 over 2 key/value heads; causal from the first key.
    let r16 = |x: f64| half::f16::from_f64(x).to_f64();
    let w = |x: &[f32], j: usize, g: usize, t: usize| r16(x[j * 8 + g * 4 + t] as f64);
    let mut moved = 0f64;
    for i in 0..2 {
        for h in 0..4 {
            let g = h / 2;
            let sc: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..4)
                        .map(|t| r16(qf[i * 16 + h * 4 + t] as f64) * w(&kf, j, g, t))
                        .sum::<f64>()
                        * 0.5
                })
                .collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for t in 0..4 {
                // A weight within f32 noise (2e-6 relative) of an f16 rounding boundary
                // may round either way: its two candidates apart, times the value, is slack.
                let (mut want, mut slack) = (0f64, 0f64);
                for (j, e) in e.iter().enumerate() {
                    let (p, x) = (e / sum, w(&vf, j, g, t));
                    want += r16(p) * x;
                    slack += (r16(p * (1.0 + 2e-6)) - r16(p * (1.0 - 2e-6))) * x.abs();
                }
                let at = [0, i, h * 4 + t];
                let o = got[IxDyn(&at)] as f64;
                assert!(
                    (o - want).abs() <= 1e-6 * (1.0 + want.abs()) + slack,
                    "{at:?}: {o} vs {want}"
                );
                moved = moved.max((o - exact[IxDyn(&at)] as f64).abs());
            }
        }
    }
    assert!(moved > 1e-5, "the f16 roundings changed nothing ({moved})");
}
