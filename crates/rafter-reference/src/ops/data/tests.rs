use super::*;
use rafter_ir::{DType, DepthToSpaceMode, PadMode, ScatterReduction};

fn f(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::f32s(dims, v.to_vec())
}
fn i(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::i64s(dims, v.to_vec())
}
fn iota(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    f(dims, &(0..n).map(|x| x as f32).collect::<Vec<_>>())
}
fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

#[test]
fn reshape_zero_and_infer() {
    let x = iota(&[2, 3, 4]);
    let y = layout::reshape(&x, &[0, -1], false).unwrap();
    assert_eq!(y.shape(), &[2, 12]);
    assert_eq!(vals(&y), vals(&x));
    let e = iota(&[0, 3]);
    assert_eq!(layout::reshape(&e, &[3, 0], true).unwrap().shape(), &[3, 0]);
    assert!(layout::reshape(&x, &[5, -1], false).is_err());
    assert!(layout::reshape(&x, &[2, 3, 5], false).is_err());
    assert!(layout::reshape(&x, &[-1, -1], false).is_err());
}

#[test]
fn shape_start_end() {
    let x = iota(&[2, 3, 4, 5]);
    assert_eq!(
        layout::shape(&x, 0, None).to_i64_vec().unwrap(),
        [2, 3, 4, 5]
    );
    assert_eq!(
        layout::shape(&x, -3, Some(-1)).to_i64_vec().unwrap(),
        [3, 4]
    );
    assert_eq!(
        layout::shape(&x, -10, Some(10)).to_i64_vec().unwrap(),
        [2, 3, 4, 5]
    );
    assert_eq!(layout::shape(&x, 3, Some(1)).shape(), &[0]);
}

#[test]
fn transpose_every_dtype() {
    for d in DType::ALL {
        let bytes: Vec<u8> = (0..6 * d.size_of())
            .map(|k| {
                if d == DType::Bool {
                    (k % 2) as u8
                } else {
                    k as u8
                }
            })
            .collect();
        let x = Tensor::from_le_bytes(d, &[2, 3], &bytes).unwrap();
        let y = layout::transpose(&x, &[]).unwrap();
        assert_eq!(y.dtype(), d);
        assert_eq!(y.shape(), &[3, 2]);
        let back = layout::transpose(&y, &[1, 0]).unwrap();
        assert_eq!(back, x, "{d}");
        let s = layout::slice(&x, &[-1], &[i64::MIN], Some(&[1]), Some(&[-1])).unwrap();
        assert_eq!(s.shape(), &[2, 3]);
        let g = index::gather(&x, &i(&[2], &[-1, 0]), 1).unwrap();
        assert_eq!(g.shape(), &[2, 2]);
    }
    let x = iota(&[2, 3]);
    assert_eq!(
        vals(&layout::transpose(&x, &[]).unwrap()),
        [0., 3., 1., 4., 2., 5.]
    );
}

#[test]
fn squeeze_unsqueeze_flatten() {
    let x = iota(&[1, 3, 1, 2]);
    assert_eq!(layout::squeeze(&x, &[]).unwrap().shape(), &[3, 2]);
    assert_eq!(layout::squeeze(&x, &[-2]).unwrap().shape(), &[1, 3, 2]);
    assert!(layout::squeeze(&x, &[1]).is_err());
    let y = iota(&[3, 4]);
    assert_eq!(
        layout::unsqueeze(&y, &[0, 3]).unwrap().shape(),
        &[1, 3, 4, 1]
    );
    assert_eq!(layout::unsqueeze(&y, &[-1]).unwrap().shape(), &[3, 4, 1]);
    assert_eq!(layout::flatten(&x, 2).unwrap().shape(), &[3, 2]);
    assert_eq!(layout::flatten(&x, 0).unwrap().shape(), &[1, 6]);
    assert_eq!(layout::flatten(&x, -1).unwrap().shape(), &[3, 2]);
}

#[test]
fn squeeze_unsqueeze_axes_operand() {
    let graph = rafter_ir::Graph::default();
    let node = rafter_ir::Node {
        name: "n".into(),
        op: Op::Identity,
        inputs: vec![],
        outputs: vec![],
    };
    let ctx = OpCtx {
        graph: &graph,
        node: &node,
    };
    let go = |op: Op, x: &Tensor, axes: Option<&[i64]>| {
        let a = axes.map(|v| i(&[v.len()], v));
        eval(&op, &[Some(x), a.as_ref()], &ctx).map(|mut r| r.remove(0).unwrap())
    };
    let sq = Op::Squeeze { axes: vec![] };
    let unsq = Op::Unsqueeze { axes: vec![] };
    let x = iota(&[1, 3, 1, 2]);
    // The operand's axes, negative against x's rank: -4 is axis 0.
    let y = go(sq.clone(), &x, Some(&[-4])).unwrap();
    assert_eq!(y.shape(), &[3, 1, 2]);
    assert_eq!(vals(&y), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    // An empty operand drops every 1, as no axes do.
    assert_eq!(go(sq.clone(), &x, Some(&[])).unwrap().shape(), &[3, 2]);
    assert!(go(sq.clone(), &x, Some(&[1])).is_err());
    // Without the operand the attribute holds the axes.
    let y = go(Op::Squeeze { axes: vec![2] }, &x, None).unwrap();
    assert_eq!(y.shape(), &[1, 3, 2]);
    // Unsqueeze: negative against the output rank 4 + 2; unsorted is fine.
    let y = go(unsq.clone(), &iota(&[3, 4]), Some(&[-1, 1])).unwrap();
    assert_eq!(y.shape(), &[3, 1, 4, 1]);
    assert_eq!(vals(&y), vals(&iota(&[12])));
    assert!(go(unsq.clone(), &iota(&[3]), Some(&[0, 0])).is_err());
    assert!(go(unsq, &iota(&[3]), Some(&[2])).is_err());
}

#[test]
fn concat_and_split() {
    let a = iota(&[2, 2]);
    let b = f(&[2, 1], &[9., 8.]);
    let c = layout::concat(&[&a, &b], -1).unwrap();
    assert_eq!(vals(&c), [0., 1., 9., 2., 3., 8.]);
    assert!(layout::concat(&[&a, &i(&[2, 1], &[1, 2])], 1).is_err());
    let x = iota(&[7]);
    let parts = layout::split(&x, 0, None, 3).unwrap();
    let lens: Vec<usize> = parts.iter().map(|p| p.shape()[0]).collect();
    assert_eq!(lens, [3, 3, 1]);
    let parts = layout::split(&x, 0, Some(&[2, 5]), 2).unwrap();
    assert_eq!(vals(&parts[1]), [2., 3., 4., 5., 6.]);
    assert!(layout::split(&x, 0, Some(&[2, 2]), 2).is_err());
}

#[test]
fn slice_onnx_semantics() {
    let x = iota(&[10]);
    let s = |st: i64, en: i64, step: i64| {
        vals(&layout::slice(&x, &[st], &[en], None, Some(&[step])).unwrap())
    };
    assert_eq!(s(1, 4, 1), [1., 2., 3.]);
    assert_eq!(s(-3, i64::MAX, 1), [7., 8., 9.]);
    assert_eq!(s(8, 2, -2), [8., 6., 4.]);
    assert_eq!(
        s(-1, i64::MIN, -1),
        [9., 8., 7., 6., 5., 4., 3., 2., 1., 0.]
    );
    assert_eq!(s(20, -20, -3), [9., 6., 3., 0.]);
    assert_eq!(s(5, 2, 1), Vec::<f64>::new());
    let m = iota(&[3, 4]);
    let y = layout::slice(&m, &[1, -1], &[100, 0], Some(&[0, -1]), Some(&[1, -2])).unwrap();
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(vals(&y), [7., 5., 11., 9.]);
    assert!(layout::slice(&x, &[0], &[1], None, Some(&[0])).is_err());
}

#[test]
fn gathers() {
    let x = iota(&[3, 2]);
    let g = index::gather(&x, &i(&[2, 2], &[0, -1, 2, 1]), 0).unwrap();
    assert_eq!(g.shape(), &[2, 2, 2]);
    assert_eq!(vals(&g), [0., 1., 4., 5., 4., 5., 2., 3.]);
    assert!(index::gather(&x, &i(&[1], &[3]), 0).is_err());
    let ge = index::gather_elements(
        &f(&[2, 2], &[1., 2., 3., 4.]),
        &i(&[2, 2], &[0, 0, 1, -2]),
        1,
    )
    .unwrap();
    assert_eq!(vals(&ge), [1., 1., 4., 3.]);
    // GatherND with batch_dims = 1 (the ONNX example).
    let d = iota(&[2, 2, 2]);
    let g = index::gather_nd(&d, &i(&[2, 1], &[1, 0]), 1).unwrap();
    assert_eq!(g.shape(), &[2, 2]);
    assert_eq!(vals(&g), [2., 3., 4., 5.]);
    let g = index::gather_nd(&iota(&[2, 2]), &i(&[2, 2], &[0, 0, 1, 1]), 0).unwrap();
    assert_eq!(vals(&g), [0., 3.]);
}

#[test]
fn scatters() {
    let data = f(&[1, 5], &[1., 2., 3., 4., 5.]);
    let ind = i(&[1, 2], &[1, -4]);
    let upd = f(&[1, 2], &[1.1, 2.1]);
    let y = index::scatter_elements(&data, &ind, &upd, 1, ScatterReduction::Add).unwrap();
    assert_eq!(
        vals(&y)
            .iter()
            .map(|v| (v * 10.0).round())
            .collect::<Vec<_>>(),
        [10., 52., 30., 40., 50.]
    );
    let y = index::scatter_elements(&data, &ind, &upd, 1, ScatterReduction::None).unwrap();
    assert_eq!(vals(&y)[1] as f32, 2.1);
    let y = index::scatter_elements(&data, &ind, &upd, 1, ScatterReduction::Max).unwrap();
    assert_eq!(vals(&y)[1] as f32, 2.1);
    let y = index::scatter_elements(&data, &ind, &upd, 1, ScatterReduction::Min).unwrap();
    assert_eq!(vals(&y)[1] as f32, 1.1);
    let d = iota(&[4]);
    let y = index::scatter_nd(
        &d,
        &i(&[2, 1], &[1, 1]),
        &f(&[2], &[10., 20.]),
        ScatterReduction::Mul,
    )
    .unwrap();
    assert_eq!(vals(&y), [0., 200., 2., 3.]);
    let d = iota(&[2, 2]);
    let y = index::scatter_nd(
        &d,
        &i(&[1, 1], &[1]),
        &f(&[1, 2], &[7., 8.]),
        ScatterReduction::None,
    )
    .unwrap();
    assert_eq!(vals(&y), [0., 1., 7., 8.]);
}

#[test]
fn pad_modes() {
    let x = f(&[3], &[1., 2., 3.]);
    let p = |pads: &[i64], mode| vals(&layout::pad(&x, pads, None, None, mode).unwrap());
    assert_eq!(p(&[2, 1], PadMode::Constant), [0., 0., 1., 2., 3., 0.]);
    assert_eq!(p(&[2, 2], PadMode::Reflect), [3., 2., 1., 2., 3., 2., 1.]);
    assert_eq!(p(&[4, 0], PadMode::Reflect), [1., 2., 3., 2., 1., 2., 3.]);
    assert_eq!(p(&[2, 1], PadMode::Edge), [1., 1., 1., 2., 3., 3.]);
    assert_eq!(
        p(&[2, 4], PadMode::Wrap),
        [2., 3., 1., 2., 3., 1., 2., 3., 1.]
    );
    assert_eq!(p(&[-1, 1], PadMode::Edge), [2., 3., 3.]);
    let cv = f(&[], &[9.]);
    let y = layout::pad(&x, &[1, 0], Some(&cv), None, PadMode::Constant).unwrap();
    assert_eq!(vals(&y), [9., 1., 2., 3.]);
    let m = iota(&[2, 2]);
    let y = layout::pad(&m, &[1, 1], None, Some(&[-1]), PadMode::Constant).unwrap();
    assert_eq!(y.shape(), &[2, 4]);
    assert_eq!(vals(&y), [0., 0., 1., 0., 0., 2., 3., 0.]);
}

#[test]
fn top_k_ties_keep_lower_index() {
    let x = f(&[2, 4], &[1., 3., 3., 2., 5., 5., 5., f32::NAN]);
    let (v, idx) = sort::top_k(&x, 2, 1, true).unwrap();
    assert_eq!(idx.to_i64_vec().unwrap(), [1, 2, 3, 0]);
    assert_eq!(vals(&v)[..2], [3., 3.]);
    assert!(vals(&v)[2].is_nan());
    let (v, idx) = sort::top_k(&x, 3, -1, false).unwrap();
    assert_eq!(idx.to_i64_vec().unwrap(), [0, 3, 1, 0, 1, 2]);
    assert_eq!(vals(&v)[..3], [1., 2., 3.]);
    let (_, idx) = sort::top_k(&iota(&[3, 2]), 1, 0, true).unwrap();
    assert_eq!(idx.shape(), &[1, 2]);
    assert_eq!(idx.to_i64_vec().unwrap(), [2, 2]);
}

#[test]
fn unique_sorted_and_not() {
    let x = f(&[6], &[2., 1., 1., 3., 4., 3.]);
    let (y, idx, inv, cnt) = sort::unique(&x, None, true).unwrap();
    assert_eq!(vals(&y), [1., 2., 3., 4.]);
    assert_eq!(idx.to_i64_vec().unwrap(), [1, 0, 3, 4]);
    assert_eq!(inv.to_i64_vec().unwrap(), [1, 0, 0, 2, 3, 2]);
    assert_eq!(cnt.to_i64_vec().unwrap(), [2, 1, 2, 1]);
    let (y, idx, inv, cnt) = sort::unique(&x, None, false).unwrap();
    assert_eq!(vals(&y), [2., 1., 3., 4.]);
    assert_eq!(idx.to_i64_vec().unwrap(), [0, 1, 3, 4]);
    assert_eq!(inv.to_i64_vec().unwrap(), [0, 1, 1, 2, 3, 2]);
    assert_eq!(cnt.to_i64_vec().unwrap(), [1, 2, 2, 1]);
    let m = f(&[3, 2], &[1., 0., 0., 1., 1., 0.]);
    let (y, idx, inv, cnt) = sort::unique(&m, Some(0), true).unwrap();
    assert_eq!(y.shape(), &[2, 2]);
    assert_eq!(vals(&y), [0., 1., 1., 0.]);
    assert_eq!(idx.to_i64_vec().unwrap(), [1, 0]);
    assert_eq!(inv.to_i64_vec().unwrap(), [1, 0, 1]);
    assert_eq!(cnt.to_i64_vec().unwrap(), [1, 2]);
}

#[test]
fn creation_ops() {
    let r = create::range(&i(&[], &[10]), &i(&[], &[4]), &i(&[], &[-3])).unwrap();
    assert_eq!(r.to_i64_vec().unwrap(), [10, 7]);
    let r = create::range(&f(&[], &[1.]), &f(&[], &[2.]), &f(&[], &[0.3])).unwrap();
    assert_eq!(r.shape(), &[4]);
    let c = create::constant_of_shape(&[2, 1], rafter_ir::Scalar::Int(DType::I32, 7)).unwrap();
    assert_eq!(
        c,
        Tensor::I32(ndarray::ArrayD::from_elem(IxDyn(&[2, 1]), 7))
    );
    let e = create::eye_like(&iota(&[2, 3]), DType::U8, 1).unwrap();
    assert_eq!(vals(&e), [0., 1., 0., 0., 0., 1.]);
    let e = create::eye_like(&iota(&[3, 2]), DType::Bool, -1).unwrap();
    assert_eq!(vals(&e), [0., 0., 1., 0., 0., 1.]);
}

#[test]
fn one_hot_trilu_masks() {
    let oh = index::one_hot(
        &i(&[3], &[0, -1, 5]),
        &i(&[], &[3]),
        &f(&[2], &[0., 1.]),
        -1,
    )
    .unwrap();
    assert_eq!(oh.shape(), &[3, 3]);
    assert_eq!(vals(&oh), [1., 0., 0., 0., 0., 1., 0., 0., 0.]);
    let oh = index::one_hot(&i(&[2], &[1, 0]), &i(&[1], &[2]), &f(&[2], &[2., 5.]), 0).unwrap();
    assert_eq!(vals(&oh), [2., 5., 5., 2.]);
    let x = iota(&[3, 3]);
    assert_eq!(
        vals(&index::trilu(&x, 0, true).unwrap()),
        [0., 1., 2., 0., 4., 5., 0., 0., 8.]
    );
    assert_eq!(
        vals(&index::trilu(&x, -1, false).unwrap()),
        [0., 0., 0., 3., 0., 0., 6., 7., 0.]
    );
    let nz = index::non_zero(&f(&[2, 2], &[0., 1., 2., 0.]));
    assert_eq!(nz.shape(), &[2, 2]);
    assert_eq!(nz.to_i64_vec().unwrap(), [0, 1, 1, 0]);
    let cond =
        Tensor::Bool(ndarray::ArrayD::from_shape_vec(IxDyn(&[2]), vec![false, true]).unwrap());
    let c = index::compress(&iota(&[2, 3]), &cond, Some(0)).unwrap();
    assert_eq!(vals(&c), [3., 4., 5.]);
    let c = index::compress(&iota(&[2, 3]), &cond, None).unwrap();
    assert_eq!(vals(&c), [1.]);
    let rs = index::reverse_sequence(&iota(&[3, 2]), &i(&[2], &[3, 1]), 1, 0).unwrap();
    assert_eq!(vals(&rs), [4., 1., 2., 3., 0., 5.]);
}

#[test]
fn expand_tile_depth_space() {
    let x = f(&[3, 1], &[1., 2., 3.]);
    let e = layout::expand(&x, &[2, 1, 2]).unwrap();
    assert_eq!(e.shape(), &[2, 3, 2]);
    assert_eq!(vals(&e)[..6], [1., 1., 2., 2., 3., 3.]);
    let t = layout::tile(&f(&[2], &[1., 2.]), &[3]).unwrap();
    assert_eq!(vals(&t), [1., 2., 1., 2., 1., 2.]);
    let x = iota(&[1, 4, 1, 2]);
    let d = layout::depth_to_space(&x, 2, DepthToSpaceMode::Dcr).unwrap();
    assert_eq!(d.shape(), &[1, 1, 2, 4]);
    assert_eq!(vals(&d), [0., 2., 1., 3., 4., 6., 5., 7.]);
    let c = layout::depth_to_space(&x, 2, DepthToSpaceMode::Crd).unwrap();
    assert_eq!(vals(&c), [0., 2., 1., 3., 4., 6., 5., 7.]);
    let back = layout::space_to_depth(&d, 2).unwrap();
    assert_eq!(back, x);
}
