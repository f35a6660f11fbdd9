//! Native kernels reading and writing host slots (buffers whose dims depend on values): a
//! transpose into a slot, then a matmul from that slot into another slot, then a reshape whose dims come from its shape operand, all native, against the
//! reference executor.

mod common;

use bytes::Bytes;
use common::{lower_per_node, LONG};
use rafter_ir::{ConstData, DType, Dim, Graph, Op, TensorType};
use rafter_runtime::{Session, SessionOptions, Tensor};

#[test]
fn native_kernels_read_and_write_host_slots() {
    let f32_ty = |dims: Vec<Dim>| TensorType::new(DType::F32, dims);
    let mut g = Graph::new("slots");
    let x = g.add_input("x", f32_ty(vec![Dim::known(3), Dim::symbol("n")]));
    let w: Vec<f32> = (0..15).map(|i| (i as f32 - 7.0) * 0.25).collect();
    let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w = g.add_const(
        "w",
        ConstData::new(DType::F32, vec![3, 5], Bytes::from(wb)).unwrap(),
    );
    // `_t` is bound by no input: the transpose's result lives in a host slot.
    let t = g.add_node(
        "t",
        Op::Transpose { perm: vec![1, 0] },
        vec![Some(x)],
        vec![Some((
            "t".into(),
            f32_ty(vec![Dim::symbol("_t"), Dim::known(3)]),
        ))],
    )[0]
    .unwrap();
    let y = g.add_node(
        "mm",
        Op::MatMul,
        vec![Some(t), Some(w)],
        vec![Some((
            "y".into(),
            f32_ty(vec![Dim::symbol("_t"), Dim::known(5)]),
        ))],
    )[0]
    .unwrap();
    // A reshape whose result dims come from its shape operand's values: [_t, 5] -> [5, _r].
    let shape = g.add_const("shape", ConstData::from_i64s(&[5, -1]));
    let y = g.add_node(
        "r",
        Op::Reshape { allow_zero: false },
        vec![Some(y), Some(shape)],
        vec![Some((
            "z".into(),
            f32_ty(vec![Dim::known(5), Dim::symbol("_r")]),
        ))],
    )[0]
    .unwrap();
    g.outputs.push(y);
    let xs: Vec<f32> = (0..21).map(|i| (i as f32 * 0.37).sin()).collect();
    let inputs = vec![Tensor::f32s(&[3, 7], xs)];
    let want = common::reference_run(&g, &inputs);
    let program = lower_per_node(&g);
    let devices = rafter_runtime_cpu::devices().unwrap();
    let session =
        Session::with_options(program, &devices, SessionOptions::new().kernel_threads(2)).unwrap();
    let got = session.run(inputs, LONG).unwrap();
    assert_eq!(got[0].shape(), &[5, 7]);
    for (a, b) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    let s = session.native_stats();
    assert_eq!((s.kernels, s.dispatches, s.fallbacks), (3, 3, 0), "{s:?}");
}
