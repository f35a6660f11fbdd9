//! Native kernels against the reference executor: small graphs compiled by `rafter-opt`, run
//! through a session (so operands really are binding views and weight bytes), on random
//! data with odd sizes, strides, pads, groups, dilations and broadcasts; plus the fallback
//! path, misaligned weights, and malformed operands.

use std::time::Duration;

use bytes::Bytes;
use rafter_ir::{
    AutoPad, BinaryOp, ConstData, DType, Graph, Op, PoolKind, TensorType, UnaryOp, ValueId,
};
use rafter_reference::Tensor;

use super::operands::testing::{input, le};
use super::{select, Stats};
use crate::{devices, from_reference, to_reference};
use rafter_runtime::{NativeStats, RuntimeError, Session, SessionOptions};

struct Rng(u64);

impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

fn ty(d: &[usize]) -> TensorType {
    let d: Vec<i64> = d.iter().map(|&x| x as i64).collect();
    TensorType::known(DType::F32, &d)
}

/// A graph under construction, with the inputs to feed it.
struct Case {
    g: Graph,
    inputs: Vec<Tensor>,
    rng: Rng,
    /// [`Case::conv_weight`] makes graph inputs, not constants: the compiler's layout pass
    /// converts only convolutions of constant weights, so these stay NCHW.
    nchw: bool,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            g: Graph::new("native"),
            inputs: Vec::new(),
            rng: Rng(seed | 1),
            nchw: false,
        }
    }

    /// A case whose convolutions stay NCHW (see [`Case::nchw`]).
    fn with_layout(seed: u64, nchw: bool) -> Case {
        Case {
            nchw,
            ..Case::new(seed)
        }
    }

    /// A convolution's weight: a constant (the CPU compiles the convolution channels-last)
    /// or, for an NCHW case, an input.
    fn conv_weight(&mut self, dims: &[usize]) -> ValueId {
        if self.nchw {
            self.input(dims)
        } else {
            self.weight(dims)
        }
    }

    fn input(&mut self, dims: &[usize]) -> ValueId {
        let n = self.inputs.len();
        let v = self.rng.vec(dims.iter().product());
        self.inputs.push(Tensor::f32s(dims, v));
        self.g.add_input(format!("in{n}"), ty(dims))
    }

    fn weight(&mut self, dims: &[usize]) -> ValueId {
        let v = self.rng.vec(dims.iter().product());
        self.weight_of(dims, &v)
    }

    fn weight_of(&mut self, dims: &[usize], v: &[f32]) -> ValueId {
        let n = self.g.values.len();
        let c = ConstData::new(DType::F32, dims.to_vec(), Bytes::from(le(v))).unwrap();
        self.g.add_const(format!("w{n}"), c)
    }

    fn node(&mut self, op: Op, ins: &[ValueId], out: &[usize]) -> ValueId {
        self.node_opt(op, ins.iter().map(|&v| Some(v)).collect(), out)
    }

    fn node_opt(&mut self, op: Op, ins: Vec<Option<ValueId>>, out: &[usize]) -> ValueId {
        let n = self.g.nodes.len();
        let outs = self.g.add_node(
            format!("n{n}"),
            op,
            ins,
            vec![Some((format!("v{n}"), ty(out)))],
        );
        outs[0].unwrap()
    }

    /// Compiles and runs the graph with native kernels and checks every output against the
    /// reference executor; returns the session's counters.
    fn check(self, out: ValueId) -> NativeStats {
        self.check_on(out, 2)
    }

    /// [`Case::check`] with `threads` kernel threads.
    fn check_on(mut self, out: ValueId, threads: usize) -> NativeStats {
        self.g.outputs.push(out);
        let want = rafter_reference::run(&self.g, self.inputs.clone()).unwrap();
        let program = rafter_opt::compile(&self.g, &rafter_opt::CompileOptions::default()).unwrap();
        run_and_compare_on(program, self.inputs, &want, threads)
    }
}

/// One call of `session` on the reference executor's tensors (the tests' oracle's type).
fn call(session: &Session, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RuntimeError> {
    let inputs = inputs.iter().map(|t| from_reference(t).unwrap()).collect();
    let outputs = session.run(inputs, Duration::from_secs(60))?;
    Ok(outputs.iter().map(|t| to_reference(t).unwrap()).collect())
}

fn run_and_compare(
    program: rafter_ir::program::Program,
    inputs: Vec<Tensor>,
    want: &[Tensor],
) -> NativeStats {
    run_and_compare_on(program, inputs, want, 2)
}

fn run_and_compare_on(
    program: rafter_ir::program::Program,
    inputs: Vec<Tensor>,
    want: &[Tensor],
    threads: usize,
) -> NativeStats {
    let devices = devices().unwrap();
    let session = Session::with_options(
        program,
        &devices,
        SessionOptions::new().kernel_threads(threads),
    )
    .unwrap();
    let got = call(&session, inputs).unwrap();
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.shape(), w.shape());
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "element {i}: {a} vs reference {b}"
            );
        }
    }
    session.native_stats()
}

fn conv_op(strides: &[i64], pads: &[i64], dilations: &[i64], group: i64) -> Op {
    Op::Conv {
        kernel_shape: vec![],
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dilations.to_vec(),
        group,
        auto_pad: AutoPad::NotSet,
    }
}

fn add() -> Op {
    Op::Binary { op: BinaryOp::Add }
}

fn assert_native(s: NativeStats, dispatches: u64) {
    assert!(s.dispatches >= dispatches, "{s:?}");
    assert_eq!(s.fallbacks, 0, "{s:?}");
}

#[test]
fn matmul_with_bias_and_residual() {
    for (m, k, n) in [(5, 7, 9), (1, 17, 1), (33, 65, 17), (128, 64, 96)] {
        let mut c = Case::new(m as u64 * 31 + n as u64);
        let x = c.input(&[2, m, k]);
        let w = c.weight(&[k, n]);
        let b = c.weight(&[n]);
        let r = c.input(&[2, m, n]);
        let p = c.node(Op::MatMul, &[x, w], &[2, m, n]);
        let p = c.node(add(), &[p, b], &[2, m, n]);
        let p = c.node(add(), &[r, p], &[2, m, n]);
        assert_native(c.check(p), 1);
    }
}

#[test]
fn matmul_relu_and_scale() {
    let mut c = Case::new(3);
    let x = c.input(&[3, 8, 16]);
    let w = c.weight(&[16, 20]);
    let s = c.weight_of(&[], &[0.125]);
    let p = c.node(Op::MatMul, &[x, w], &[3, 8, 20]);
    let p = c.node(Op::Binary { op: BinaryOp::Mul }, &[p, s], &[3, 8, 20]);
    let p = c.node(Op::Unary { op: UnaryOp::Relu }, &[p], &[3, 8, 20]);
    assert_native(c.check(p), 1);
}

#[test]
fn batched_and_broadcast_matmuls() {
    for (sa, sb, so) in [
        (vec![2, 3, 5, 7], vec![2, 3, 7, 4], vec![2, 3, 5, 4]),
        (vec![2, 1, 5, 7], vec![3, 7, 4], vec![2, 3, 5, 4]),
        (vec![5, 7], vec![4, 7, 6], vec![4, 5, 6]),
        (vec![12, 16, 8], vec![12, 8, 16], vec![12, 16, 16]),
    ] {
        let mut c = Case::new(sa.len() as u64 + 7);
        let a = c.input(&sa);
        let b = c.input(&sb);
        let p = c.node(Op::MatMul, &[a, b], &so);
        assert_native(c.check(p), 1);
    }
    // Attention scores: (Q . K^T) * scale + mask, the mask one [seq, seq] matrix for every
    // head ([1, 1, s, s] against [1, h, s, s]); also a 2-D mask against a 3-D product.
    for (sa, sb, mask) in [
        (vec![1, 12, 16, 8], vec![1, 12, 8, 16], vec![1, 1, 16, 16]),
        (vec![3, 5, 7], vec![3, 7, 6], vec![5, 6]),
    ] {
        let so: Vec<usize> = sa[..sa.len() - 1]
            .iter()
            .copied()
            .chain([sb[sb.len() - 1]])
            .collect();
        let mut c = Case::new(sa.len() as u64 + 31);
        let a = c.input(&sa);
        let b = c.input(&sb);
        let m = c.input(&mask);
        let scale = c.weight_of(&[], &[0.125]);
        let p = c.node(Op::MatMul, &[a, b], &so);
        let p = c.node(Op::Binary { op: BinaryOp::Mul }, &[p, scale], &so);
        let p = c.node(add(), &[p, m], &so);
        assert_native(c.check(p), 1);
    }
}

/// Fewer small products than threads (two heads on eight threads): each product's rows are
/// split into bands, one task each, including a ragged last band and a mask broadcast over
/// the heads (the residual read at each band's rows).
#[test]
fn small_products_split_into_row_bands_for_more_threads_than_products() {
    for (m, k, n) in [(64usize, 128usize, 256usize), (50, 160, 256)] {
        let mut c = Case::new(m as u64 + 3);
        let a = c.input(&[1, 2, m, k]);
        let b = c.input(&[1, 2, k, n]);
        let mask = c.input(&[1, 1, m, n]);
        let scale = c.weight_of(&[], &[0.125]);
        let so = [1, 2, m, n];
        let p = c.node(Op::MatMul, &[a, b], &so);
        let p = c.node(Op::Binary { op: BinaryOp::Mul }, &[p, scale], &so);
        let p = c.node(add(), &[p, mask], &so);
        assert_native(c.check_on(p, 8), 1);
    }
}

#[test]
fn gemm_with_transposes_and_bias() {
    for (ta, tb) in [(false, true), (true, false), (false, false)] {
        let (m, k, n) = (3, 10, 7);
        let mut c = Case::new(11);
        let a = c.input(&if ta { [k, m] } else { [m, k] });
        let b = c.weight(&if tb { [n, k] } else { [k, n] });
        let bias = c.weight(&[n]);
        let op = Op::Gemm {
            alpha: 0.5,
            beta: 1.0,
            trans_a: ta,
            trans_b: tb,
        };
        let p = c.node(op, &[a, b, bias], &[m, n]);
        assert_native(c.check(p), 1);
    }
    // One row times a transposed weight (a classifier), long enough to split into tasks:
    // the dot-product path, with a bias then relu, and with a full C residual.
    for (k, n, relu) in [(1280usize, 1000usize, false), (300, 70, true)] {
        let mut c = Case::new(13 + n as u64);
        let a = c.input(&[1, k]);
        let b = c.weight(&[n, k]);
        let bias = if relu {
            c.weight(&[n])
        } else {
            c.input(&[1, n])
        };
        let op = Op::Gemm {
            alpha: 0.75,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let mut p = c.node(op, &[a, b, bias], &[1, n]);
        if relu {
            p = c.node(Op::Unary { op: UnaryOp::Relu }, &[p], &[1, n]);
        }
        assert_native(c.check(p), 1);
    }
}

#[test]
fn convolutions_match_the_reference() {
    // (input NCHW, out channels, kernel, strides, pads, dilations, group)
    type ConvCase = (
        [usize; 4],
        usize,
        [usize; 2],
        [i64; 2],
        [i64; 4],
        [i64; 2],
        usize,
    );
    let cases: &[ConvCase] = &[
        ([1, 3, 9, 7], 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ([2, 4, 10, 9], 6, [3, 3], [1, 1], [0, 1, 2, 0], [1, 1], 1),
        ([2, 4, 11, 10], 6, [3, 2], [2, 1], [0, 1, 2, 0], [1, 1], 1),
        ([1, 4, 12, 12], 4, [3, 3], [1, 2], [2, 2, 2, 2], [2, 2], 2),
        ([1, 8, 6, 5], 16, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
        ([1, 8, 7, 7], 4, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1),
        // Few input channels and a large window: the direct stem kernel (stride 2 and, with
        // a batch, stride 1).
        ([1, 3, 15, 15], 8, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1),
        ([2, 3, 17, 16], 10, [5, 5], [1, 1], [2, 1, 2, 3], [1, 1], 1),
        // What `rafter_ir::program::cpu_winograd` takes (3x3 stride 1, > 4 channels, >= 100
        // output pixels): Winograd F(2x2, 3x3), with a batch, odd sizes and uneven padding
        // (partial tiles).
        ([2, 5, 12, 11], 6, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ([1, 6, 13, 10], 4, [3, 3], [1, 1], [0, 1, 2, 0], [1, 1], 1),
        // The same with 3 channels: not Winograd (im2col + GEMM in NCHW, the direct small
        // convolution channels-last).
        ([1, 3, 13, 10], 4, [3, 3], [1, 1], [0, 1, 2, 0], [1, 1], 1),
        // A stem-like im2col above 2 MiB (27 x 20,022 floats) with short rows: built and
        // multiplied in blocks of output rows (the last one partial), per image.
        ([2, 3, 283, 281], 4, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1),
    ];
    for (i, &(xd, m, [kh, kw], s, p, d, g)) in cases.iter().enumerate() {
        let oh = (xd[2] + p[0] as usize + p[2] as usize - (kh - 1) * d[0] as usize - 1)
            / s[0] as usize
            + 1;
        let ow = (xd[3] + p[1] as usize + p[3] as usize - (kw - 1) * d[1] as usize - 1)
            / s[1] as usize
            + 1;
        let od = [xd[0], m, oh, ow];
        for (tail, nchw) in (0..5).flat_map(|t| [(t, false), (t, true)]) {
            let mut c = Case::with_layout(100 + i as u64 * 5 + tail, nchw);
            let x = c.input(&xd);
            let w = c.conv_weight(&[m, xd[1] / g, kh, kw]);
            let b = c.weight(&[m]);
            let op = conv_op(&s, &p, &d, g as i64);
            let y = match tail {
                // conv(x, w, b), relu
                0 => {
                    let y = c.node(op, &[x, w, b], &od);
                    c.node(Op::Unary { op: UnaryOp::Relu }, &[y], &od)
                }
                // conv(x, w, b) + residual, relu (ResNet)
                1 => {
                    let r = c.input(&od);
                    let y = c.node(op, &[x, w, b], &od);
                    let y = c.node(add(), &[y, r], &od);
                    c.node(Op::Unary { op: UnaryOp::Relu }, &[y], &od)
                }
                // conv(x, w, b), clip(0, 0.5): ReLU6's shape, clamped in the GEMM epilogue
                // (or in Winograd's pass after it)
                2 | 3 => {
                    let lo = c.weight_of(&[], &[if tail == 2 { 0.0 } else { -0.3 }]);
                    let hi = c.weight_of(&[], &[0.5]);
                    let y = c.node(op, &[x, w, b], &od);
                    c.node(Op::Clip, &[y, lo, hi], &od)
                }
                // conv(x, w) + per-channel bias [M, 1, 1], no activation
                _ => {
                    let cb = c.weight(&[m, 1, 1]);
                    let y = c.node(op, &[x, w], &od);
                    c.node(add(), &[y, cb], &od)
                }
            };
            assert_native(c.check(y), 1);
        }
    }
}

/// Convolutions on maps of at most `K_SPLIT_MAX_ROWS` pixels (ResNet-50's 7×7), channels
/// last, where each GEMM task copies its own columns of the im2col and K is split over the
/// threads (`sgemm_fill_a`): 3x3 at stride 1 and 2, a batch of two, every tail, on 1, 2, 7
/// and 16 threads (the split differs with each), against the reference executor.
#[test]
fn few_pixel_convolutions_split_k_over_the_threads() {
    for (i, (xd, s)) in [([1, 128, 7, 7], 1i64), ([2, 96, 14, 13], 2)]
        .into_iter()
        .enumerate()
    {
        let m = 72;
        let o = |n: usize| (n + 2 - 3) / s as usize + 1;
        let od = [xd[0], m, o(xd[2]), o(xd[3])];
        for threads in [1, 2, 7, 16] {
            for tail in 0..3 {
                let mut c = Case::new(700 + i as u64 * 16 + threads as u64 * 3 + tail);
                let x = c.input(&xd);
                let w = c.weight(&[m, xd[1], 3, 3]);
                let b = c.weight(&[m]);
                let y = c.node(conv_op(&[s, s], &[1; 4], &[1, 1], 1), &[x, w, b], &od);
                let y = match tail {
                    0 => c.node(Op::Unary { op: UnaryOp::Relu }, &[y], &od),
                    1 => {
                        let r = c.input(&od);
                        let y = c.node(add(), &[y, r], &od);
                        c.node(Op::Unary { op: UnaryOp::Relu }, &[y], &od)
                    }
                    _ => {
                        let lo = c.weight_of(&[], &[-0.3]);
                        let hi = c.weight_of(&[], &[0.5]);
                        c.node(Op::Clip, &[y, lo, hi], &od)
                    }
                };
                assert_native(c.check_on(y, threads), 1);
            }
        }
    }
}

#[test]
fn depthwise_convolutions_with_clip() {
    // Planes wider than a vector too (37, 38: full vectors and a masked tail).
    for (hw, s, p) in [
        (9usize, 1i64, 1i64),
        (10, 2, 1),
        (7, 1, 0),
        (5, 2, 2),
        (37, 1, 1),
        (38, 2, 1),
    ] {
        let (ch, k) = (6usize, 3usize);
        let o = (hw + 2 * p as usize - k) / s as usize + 1;
        let od = [1, ch, o, o];
        for nchw in [false, true] {
            let mut c = Case::with_layout(hw as u64 * 5 + s as u64, nchw);
            let x = c.input(&[1, ch, hw, hw]);
            let w = c.conv_weight(&[ch, 1, k, k]);
            let b = c.weight(&[ch]);
            let lo = c.weight_of(&[], &[0.0]);
            let hi = c.weight_of(&[], &[0.5]);
            let y = c.node(
                conv_op(&[s, s], &[p; 4], &[1, 1], ch as i64),
                &[x, w, b],
                &od,
            );
            let y = c.node(Op::Clip, &[y, lo, hi], &od);
            assert_native(c.check(y), 1);
        }
    }
    // Uneven padding (top 0, left 1, bottom 1, right 0), both strides, both layouts.
    for (s, o, nchw) in [
        (1i64, [7usize, 7], false),
        (2, [4, 4], false),
        (1, [7, 7], true),
        (2, [4, 4], true),
    ] {
        let mut c = Case::with_layout(91 + s as u64, nchw);
        let x = c.input(&[1, 3, 8, 8]);
        let w = c.conv_weight(&[3, 1, 3, 3]);
        let od = [1, 3, o[0], o[1]];
        let y = c.node(conv_op(&[s, s], &[0, 1, 1, 0], &[1, 1], 3), &[x, w], &od);
        assert_native(c.check(y), 1);
    }
    // Depthwise with a residual and no activation (MobileNetV2's `conv, binary.add` shape).
    let mut c = Case::new(77);
    let x = c.input(&[2, 4, 6, 6]);
    let w = c.weight(&[4, 1, 3, 3]);
    let r = c.input(&[2, 4, 6, 6]);
    let y = c.node(
        conv_op(&[1, 1], &[1, 1, 1, 1], &[1, 1], 4),
        &[x, w],
        &[2, 4, 6, 6],
    );
    let y = c.node(add(), &[y, r], &[2, 4, 6, 6]);
    assert_native(c.check(y), 1);
}

/// A channels-last depthwise block (`rafter_opt::fusion`): `[1×1 c → mid, ReLU6] →
/// depthwise 3×3 stride `s` with bias and ReLU6 → [1×1 mid → cout] (+ the input)`.
#[allow(clippy::too_many_arguments)]
fn depthwise_block(
    seed: u64,
    [n, c, hw]: [usize; 3],
    mid: Option<usize>,
    s: usize,
    cout: Option<usize>,
    skip: bool,
) -> NativeStats {
    let mut k = Case::new(seed);
    let x = k.input(&[n, c, hw, hw]);
    let lo = k.weight_of(&[], &[0.0]);
    let hi = k.weight_of(&[], &[6.0]);
    let one = || conv_op(&[1, 1], &[0; 4], &[1, 1], 1);
    let mut y = x;
    let m = mid.unwrap_or(c);
    if let Some(m) = mid {
        let (w, b) = (k.weight(&[m, c, 1, 1]), k.weight(&[m]));
        y = k.node(one(), &[y, w, b], &[n, m, hw, hw]);
        y = k.node(Op::Clip, &[y, lo, hi], &[n, m, hw, hw]);
    }
    let o = (hw + 2 - 3) / s + 1;
    let (w, b) = (k.weight(&[m, 1, 3, 3]), k.weight(&[m]));
    let dw = conv_op(&[s as i64; 2], &[1; 4], &[1, 1], m as i64);
    y = k.node(dw, &[y, w, b], &[n, m, o, o]);
    y = k.node(Op::Clip, &[y, lo, hi], &[n, m, o, o]);
    if let Some(co) = cout {
        let w = k.weight(&[co, m, 1, 1]);
        y = k.node(one(), &[y, w], &[n, co, o, o]);
        if skip {
            y = k.node(add(), &[y, x], &[n, co, o, o]);
        }
    }
    k.check(y)
}

#[test]
fn depthwise_blocks_run_as_one_kernel() {
    // Two images of odd width; the inverted residual with its skip, a strided expansion
    // without projection, and MobileNetV2's first block (depthwise then projection). Each
    // compiles to transpose → block → transpose, all three native.
    for stats in [
        depthwise_block(5, [2, 6, 11], Some(20), 1, Some(6), true),
        depthwise_block(6, [1, 5, 19], Some(17), 2, None, false),
        depthwise_block(7, [2, 16, 9], None, 1, Some(8), false),
        depthwise_block(8, [1, 8, 20], Some(48), 2, Some(12), false),
    ] {
        assert_eq!(stats.kernels, 3, "{stats:?}");
        assert_native(stats, 3);
    }
}

/// An image's stem as a depthwise block's first stage (`rafter_opt::fusion`): a 3×3
/// convolution of `cin` channels, stride `s`, with bias and ReLU6 → depthwise 3×3 with bias
/// and ReLU6 → [1×1 → `cout`].
fn stem_block(
    seed: u64,
    [n, cin, hw]: [usize; 3],
    s: usize,
    mid: usize,
    cout: Option<usize>,
) -> NativeStats {
    let mut k = Case::new(seed);
    let x = k.input(&[n, cin, hw, hw]);
    let lo = k.weight_of(&[], &[0.0]);
    let hi = k.weight_of(&[], &[6.0]);
    let o = (hw + 2 - 3) / s + 1;
    let (w, b) = (k.weight(&[mid, cin, 3, 3]), k.weight(&[mid]));
    let mut y = k.node(
        conv_op(&[s as i64; 2], &[1; 4], &[1, 1], 1),
        &[x, w, b],
        &[n, mid, o, o],
    );
    y = k.node(Op::Clip, &[y, lo, hi], &[n, mid, o, o]);
    let (w, b) = (k.weight(&[mid, 1, 3, 3]), k.weight(&[mid]));
    let dw = conv_op(&[1, 1], &[1; 4], &[1, 1], mid as i64);
    y = k.node(dw, &[y, w, b], &[n, mid, o, o]);
    y = k.node(Op::Clip, &[y, lo, hi], &[n, mid, o, o]);
    if let Some(co) = cout {
        let w = k.weight(&[co, mid, 1, 1]);
        y = k.node(
            conv_op(&[1, 1], &[0; 4], &[1, 1], 1),
            &[y, w],
            &[n, co, o, o],
        );
    }
    k.check(y)
}

#[test]
fn a_stem_and_its_depthwise_block_run_as_one_kernel() {
    // MobileNetV2's first layers in small (3 channels, stride 2, projection), two images of
    // odd width, one input channel, four, stride 1, and no projection. Each compiles to
    // block (reading the NCHW input in place) → transpose, both native.
    for stats in [
        stem_block(11, [1, 3, 20], 2, 16, Some(8)),
        stem_block(12, [2, 3, 33], 2, 12, Some(5)),
        stem_block(13, [1, 1, 17], 1, 8, Some(8)),
        stem_block(14, [1, 4, 18], 2, 24, None),
    ] {
        assert_eq!(stats.kernels, 2, "{stats:?}");
        assert_native(stats, 2);
    }
}

#[test]
fn same_upper_padding() {
    let mut c = Case::new(5);
    let x = c.input(&[1, 2, 7, 8]);
    let w = c.weight(&[3, 2, 3, 3]);
    let op = Op::Conv {
        kernel_shape: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![],
        dilations: vec![],
        group: 1,
        auto_pad: AutoPad::SameUpper,
    };
    let y = c.node(op, &[x, w], &[1, 3, 4, 4]);
    assert_native(c.check(y), 1);
}

/// A square 2-D max pool: window `k`, stride `s`, padding `p` on every side.
fn max_pool(k: i64, s: i64, p: i64, ceil_mode: bool) -> Op {
    Op::Pool {
        kind: PoolKind::Max,
        kernel_shape: vec![k, k],
        strides: vec![s, s],
        pads: vec![p; 4],
        dilations: vec![],
        auto_pad: AutoPad::NotSet,
        ceil_mode,
        count_include_pad: false,
        p: 2,
        storage_order: 0,
    }
}

#[test]
fn pooling() {
    for (hw, k, s, p, ceil, o) in [
        (11usize, 3i64, 2i64, 1i64, false, 6usize),
        (8, 2, 2, 0, false, 4),
        (10, 3, 2, 0, true, 5),
        // ResNet's 3x3 stride 2 pad 1, wider than a vector; stride 1 and 3.
        (40, 3, 2, 1, false, 20),
        (35, 3, 1, 1, false, 35),
        (35, 3, 3, 0, true, 12),
    ] {
        let mut c = Case::new(hw as u64);
        let x = c.input(&[2, 3, hw, hw]);
        let op = max_pool(k, s, p, ceil);
        let y = c.node(op, &[x], &[2, 3, o, o]);
        assert_native(c.check(y), 1);
    }
    for kind in [PoolKind::Average, PoolKind::Max] {
        let mut c = Case::new(9);
        let x = c.input(&[2, 5, 7, 3]);
        let y = c.node(Op::GlobalPool { kind, p: 2 }, &[x], &[2, 5, 1, 1]);
        assert_native(c.check(y), 1);
    }
}

#[test]
fn max_pool_between_layout_transposes_runs_on_nhwc() {
    // A channels-last max pool: NHWC -> NCHW, max pool, NCHW -> NHWC, fused into one kernel
    // that pools the NHWC map in place. ResNet's 3x3 stride 2 pad 1 over 64 channels, and a
    // ceil-mode window past the input over a partial vector of channels.
    for (d, k, s, p, ceil, o) in [
        (
            [1usize, 12usize, 14usize, 64usize],
            3i64,
            2i64,
            1i64,
            false,
            [6usize, 7usize],
        ),
        ([2, 9, 9, 19], 2, 2, 0, true, [5, 5]),
    ] {
        let mut c = Case::new(d[3] as u64);
        let x = c.input(&d);
        let xt = c.node(
            Op::Transpose {
                perm: vec![0, 3, 1, 2],
            },
            &[x],
            &[d[0], d[3], d[1], d[2]],
        );
        let op = max_pool(k, s, p, ceil);
        let y = c.node(op, &[xt], &[d[0], d[3], o[0], o[1]]);
        let y = c.node(
            Op::Transpose {
                perm: vec![0, 2, 3, 1],
            },
            &[y],
            &[d[0], o[0], o[1], d[3]],
        );
        let stats = c.check(y);
        assert_eq!(stats.kernels, 1, "{d:?}: {stats:?}");
        assert_native(stats, 1);
    }
}

#[test]
fn global_pool_reads_nhwc_through_its_transpose() {
    // A channels-last pooling head: NHWC -> NCHW transpose, then a global pool, fused into
    // one kernel that pools the NHWC tensor in place. Small (two images, a partial vector of
    // channels) and large enough to split its channels over the threads (300 channels:
    // 16-wide chunks and a short last one).
    for (d, kind) in [
        ([2, 3, 5, 40], PoolKind::Average),
        ([2, 3, 5, 40], PoolKind::Max),
        ([1, 16, 16, 300], PoolKind::Average),
        ([1, 16, 16, 300], PoolKind::Max),
    ] {
        let mut c = Case::new(d[3] as u64);
        let x = c.input(&d);
        let xt = c.node(
            Op::Transpose {
                perm: vec![0, 3, 1, 2],
            },
            &[x],
            &[d[0], d[3], d[1], d[2]],
        );
        let y = c.node(Op::GlobalPool { kind, p: 2 }, &[xt], &[d[0], d[3], 1, 1]);
        let stats = c.check(y);
        assert_eq!(stats.kernels, 1, "{d:?} {kind:?}: {stats:?}");
        assert_native(stats, 1);
    }
}

#[test]
fn movement_and_layer_norm() {
    let mut c = Case::new(21);
    let x = c.input(&[2, 3, 4, 5]);
    let y = c.node(
        Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        &[x],
        &[2, 4, 5, 3],
    );
    let y = c.node(Op::Flatten { axis: 2 }, &[y], &[8, 15]);
    let s = c.weight(&[15]);
    let b = c.weight(&[15]);
    let y = c.node(
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        },
        &[y, s, b],
        &[8, 15],
    );
    let y = c.node(Op::Transpose { perm: vec![1, 0] }, &[y], &[15, 8]);
    // The flatten's result is planned over the transpose's and never dispatched: three
    // native kernels, two dispatches.
    let stats = c.check(y);
    assert_eq!(stats.kernels, 3, "{stats:?}");
    assert_native(stats, 2);
}

#[test]
fn layer_norm_over_several_axes_without_bias() {
    // Normalised over the last two axes (axis 1 of 3), scale only.
    let mut c = Case::new(58);
    let d = [2, 7, 24];
    let x = c.input(&d);
    let g = c.weight(&[7, 24]);
    let y = c.node(
        Op::LayerNorm {
            axis: 1,
            epsilon: 1e-5,
        },
        &[x, g],
        &d,
    );
    let stats = c.check(y);
    assert_eq!(stats.kernels, 1, "{stats:?}");
    assert_native(stats, 1);
}

#[test]
fn sums_then_layer_norm() {
    // BERT's embeddings: word + token type + position, then a layer norm, in one kernel.
    let mut c = Case::new(57);
    let d = [1, 9, 24];
    let (w, t, p) = (c.input(&d), c.input(&d), c.input(&d));
    let s = c.weight(&[24]);
    let b = c.weight(&[24]);
    let y = c.node(add(), &[w, t], &d);
    let y = c.node(add(), &[p, y], &d);
    let y = c.node(
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-12,
        },
        &[y, s, b],
        &d,
    );
    let stats = c.check(y);
    assert_eq!(stats.kernels, 1, "the fused kernel is native: {stats:?}");
    assert_native(stats, 1);
}

#[test]
fn sums_with_a_broadcast_position_embedding_then_layer_norm() {
    // A batch of two sequences; the position embedding ([1, S, H], then [S, H]) is added
    // to each, as exported BERTs have it.
    for p_dims in [&[1usize, 9, 24][..], &[9, 24]] {
        let mut c = Case::new(58);
        let d = [2, 9, 24];
        let (w, t, p) = (c.input(&d), c.input(&d), c.input(p_dims));
        let s = c.weight(&[24]);
        let b = c.weight(&[24]);
        let y = c.node(add(), &[w, t], &d);
        let y = c.node(add(), &[y, p], &d);
        let op = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-12,
        };
        let y = c.node(op, &[y, s, b], &d);
        let stats = c.check(y);
        assert_eq!(stats.kernels, 1, "the fused kernel is native: {stats:?}");
        assert_native(stats, 1);
    }
}

#[test]
fn uncovered_shapes_fall_back_to_the_reference() {
    // A 1-D convolution: the conv kernel is selected by its body but falls back per call.
    let mut c = Case::new(31);
    let x = c.input(&[1, 2, 9]);
    let w = c.weight(&[3, 2, 3]);
    let op = Op::Conv {
        kernel_shape: vec![],
        strides: vec![1],
        pads: vec![1, 1],
        dilations: vec![1],
        group: 1,
        auto_pad: AutoPad::NotSet,
    };
    let y = c.node(op, &[x, w], &[1, 3, 9]);
    let y = c.node(Op::Unary { op: UnaryOp::Relu }, &[y], &[1, 3, 9]);
    let s = c.check(y);
    assert_eq!((s.kernels, s.dispatches, s.fallbacks), (1, 0, 1), "{s:?}");
    // A bias that is neither per channel nor full-size: the epilogue does not cover it.
    let mut c = Case::new(32);
    let x = c.input(&[4, 6]);
    let w = c.weight(&[6, 5]);
    let b = c.weight(&[4, 1]);
    let y = c.node(Op::MatMul, &[x, w], &[4, 5]);
    let y = c.node(add(), &[y, b], &[4, 5]);
    let s = c.check(y);
    assert_eq!((s.dispatches, s.fallbacks), (0, 1), "{s:?}");
}

#[test]
fn misaligned_weights_are_realigned_once_by_the_session() {
    let mut c = Case::new(41);
    let x = c.input(&[3, 8]);
    let w = c.weight(&[8, 4]);
    let y = c.node(Op::MatMul, &[x, w], &[3, 4]);
    c.g.outputs.push(y);
    let want = rafter_reference::run(&c.g, c.inputs.clone()).unwrap();
    let mut program = rafter_opt::compile(&c.g, &rafter_opt::CompileOptions::default()).unwrap();
    for weight in &mut program.weights {
        // The same bytes one byte into a fresh buffer: not 4-byte aligned.
        let mut shifted = vec![0u8; weight.bytes.len() + 4];
        let start = (0..4)
            .find(|&o| (shifted.as_ptr() as usize + o) % 4 != 0)
            .unwrap();
        shifted[start..start + weight.bytes.len()].copy_from_slice(&weight.bytes);
        let all = Bytes::from(shifted);
        weight.bytes = all.slice(start..start + weight.bytes.len());
        assert_ne!(weight.bytes.as_ptr() as usize % 4, 0);
    }
    // The session copies them to aligned memory when it is created, so no call copies a
    // weight to read it (the operand-level copy is covered in `operands`' tests).
    let s = run_and_compare(program, c.inputs, &want);
    assert_eq!(s.dispatches, 1, "{s:?}");
    assert_eq!(s.misaligned_copies, 0, "{s:?}");
}

#[test]
fn malformed_operands_are_errors() {
    // A conv body run directly on operands that contradict each other.
    let mut c = Case::new(51);
    let x = c.input(&[1, 2, 5, 5]);
    let w = c.weight(&[3, 2, 3, 3]);
    let y = c.node(
        conv_op(&[1, 1], &[1, 1, 1, 1], &[1, 1], 1),
        &[x, w],
        &[1, 3, 5, 5],
    );
    c.g.outputs.push(y);
    let program = rafter_opt::compile(&c.g, &rafter_opt::CompileOptions::default()).unwrap();
    let body = &program.kernels[0].body;
    let k = select(body, &super::pool(1), Default::default()).expect("a conv body is native");
    let stats = Stats::default();
    // Wrong byte lengths never reach the kernel: the operand check names the sizes.
    let short = le(&[0.0; 10]);
    let e = super::In::new(DType::F32, vec![1, 2, 5, 5], &short, &stats)
        .err()
        .unwrap();
    assert!(
        e.contains("40 bytes, but f32 [1, 2, 5, 5] needs 200"),
        "{e}"
    );
    // Shapes that do not fit together: not covered (the reference path reports them).
    let xb = le(&[0.5; 50]);
    let wb = le(&[0.5; 36]);
    let ins = [
        input(&[1, 2, 5, 5], &xb, &stats),
        input(&[2, 2, 3, 3], &wb, &stats),
    ];
    let mut yb = vec![0u8; 75 * 4];
    let mut outs = [super::Out::new(DType::F32, vec![1, 3, 5, 5], &mut yb[..]).unwrap()];
    assert!(!k.run(&ins, &mut outs).unwrap_or(true));
    // A matmul whose inner dims differ is an error naming them.
    let mut c = Case::new(52);
    let a = c.input(&[2, 3]);
    let b = c.input(&[3, 4]);
    let y = c.node(Op::MatMul, &[a, b], &[2, 4]);
    c.g.outputs.push(y);
    let mm = select(&c.g, &super::pool(1), Default::default()).unwrap();
    let (ab, bb) = (le(&[1.0; 6]), le(&[1.0; 12]));
    let ins = [input(&[2, 3], &ab, &stats), input(&[4, 3], &bb, &stats)];
    let mut yb = [0u8; 32];
    let mut outs = [super::Out::new(DType::F32, vec![2, 4], &mut yb[..]).unwrap()];
    let e = mm.run(&ins, &mut outs).unwrap_err();
    assert!(e.contains("inner dims differ"), "{e}");
}

/// BERT's erf GELU of `y` (dims `d`) as the exporter writes it: 0.5 y (1 + erf(y / sqrt 2)).
fn gelu_erf(c: &mut Case, y: ValueId, d: &[usize]) -> ValueId {
    let r2 = c.weight_of(&[], &[std::f32::consts::SQRT_2]);
    let half = c.weight_of(&[], &[0.5]);
    let one = c.weight_of(&[], &[1.0]);
    let t = c.node(Op::Binary { op: BinaryOp::Div }, &[y, r2], d);
    let t = c.node(Op::Unary { op: UnaryOp::Erf }, &[t], d);
    let t = c.node(add(), &[t, one], d);
    let t = c.node(Op::Binary { op: BinaryOp::Mul }, &[y, t], d);
    c.node(Op::Binary { op: BinaryOp::Mul }, &[t, half], d)
}

#[test]
fn elementwise_bodies_copy_their_operands() {
    // BERT's erf GELU, 0.5 x (1 + erf(x / sqrt 2)), with a broadcast bias add in front.
    let mut c = Case::new(61);
    let x = c.input(&[2, 5, 24]);
    let b = c.weight(&[24]);
    let d = [2, 5, 24];
    let y = c.node(add(), &[x, b], &d);
    let t = gelu_erf(&mut c, y, &d);
    assert_native(c.check(t), 1);
    let mut c = Case::new(62);
    let x = c.input(&[4]);
    let y = c.input(&[4]);
    let z = c.node(add(), &[x, y], &[4]);
    c.g.outputs.push(z);
    let k =
        select(&c.g, &super::pool(1), Default::default()).expect("an elementwise body is native");
    assert!(k.copies_operands());
}

/// The erf GELU of a softmax's result, in two programs: the result dying at the GELU (the
/// planner binds the GELU's result over it, and the kernel runs in place with no copy),
/// and the GELU plus the softmax's result again (one fused elementwise kernel that is not
/// a pure GELU: the copying path). Both against the reference; without the in-place path
/// the first fails (checked by making it return an error).
#[test]
fn gelu_runs_in_place_over_its_operand() {
    for read_again in [false, true] {
        let mut c = Case::new(63);
        let d = [3, 4, 40];
        let x = c.input(&d);
        let y = c.node(
            Op::Softmax {
                kind: rafter_ir::SoftmaxKind::Softmax,
                axis: -1,
            },
            &[x],
            &d,
        );
        let t = gelu_erf(&mut c, y, &d);
        let t = if read_again {
            c.node(add(), &[t, y], &d)
        } else {
            t
        };
        // A transpose after, so that the GELU's result is an arena buffer (not the output).
        let out = c.node(
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[t],
            &[3, 40, 4],
        );
        assert_native(c.check(out), 3);
    }
}

/// A softmax's result scaled by a weight and shifted by another input, dying there: the
/// planner binds the elementwise result over the softmax's bytes, and the kernel computes
/// over them with no copy (`run_over_output`), the other operands read through views. With
/// the other operand broadcast, and read twice. Against the reference; making
/// `run_over_output` return an error fails every case.
#[test]
fn elementwise_runs_over_its_operands_bytes() {
    for case in 0..3u64 {
        let mut c = Case::new(64 + case);
        let d = [3, 4, 40];
        let x = c.input(&d);
        let y = c.node(
            Op::Softmax {
                kind: rafter_ir::SoftmaxKind::Softmax,
                axis: -1,
            },
            &[x],
            &d,
        );
        let w = c.weight(if case == 0 { &[40] } else { &[3, 4, 40] });
        let t = c.node(Op::Binary { op: BinaryOp::Mul }, &[y, w], &d);
        let t = match case {
            2 => c.node(add(), &[t, y], &d),
            _ => c.node(add(), &[t, x], &d),
        };
        let out = c.node(
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[t],
            &[3, 40, 4],
        );
        assert_native(c.check(out), 3);
    }
}

#[test]
fn gather_rows_of_a_weight() {
    for axis in [0i64, 1, -1] {
        let mut c = Case::new(71);
        let data = c.weight(&[6, 5, 4]);
        let ids = c.g.add_input("ids", TensorType::known(DType::I64, &[2, 3]));
        c.inputs
            .push(Tensor::i64s(&[2, 3], vec![0, 3, -1, 2, 2, 1]));
        let out: &[usize] = match axis {
            0 => &[2, 3, 5, 4],
            1 => &[6, 2, 3, 4],
            _ => &[6, 5, 2, 3],
        };
        let y = c.node(Op::Gather { axis }, &[data, ids], out);
        assert_native(c.check(y), 1);
    }
    // Out of range: an error naming the index, never a panic.
    let mut c = Case::new(72);
    let data = c.weight(&[6, 5]);
    let ids = c.g.add_input("ids", TensorType::known(DType::I64, &[2]));
    c.inputs.push(Tensor::i64s(&[2], vec![1, 9]));
    let y = c.node(Op::Gather { axis: 0 }, &[data, ids], &[2, 5]);
    c.g.outputs.push(y);
    let program = rafter_opt::compile(&c.g, &rafter_opt::CompileOptions::default()).unwrap();
    let session = Session::with_options(
        program,
        &devices().unwrap(),
        SessionOptions::new().kernel_threads(1),
    )
    .unwrap();
    let e = call(&session, c.inputs).unwrap_err().to_string();
    assert!(
        e.contains("index 9 is out of range for a dim of size 6"),
        "{e}"
    );
}

#[test]
fn concat_of_inputs_and_constants() {
    for axis in [0i64, 1, -1] {
        let mut c = Case::new(81);
        let a = c.input(&[2, 3, 4]);
        let b = c.input(&[2, 3, 4]);
        let (kd, out): (&[usize], &[usize]) = match axis {
            0 => (&[1, 3, 4], &[5, 3, 4]),
            1 => (&[2, 1, 4], &[2, 7, 4]),
            _ => (&[2, 3, 1], &[2, 3, 9]),
        };
        // A small constant (at most 64 bytes): the compiler copies it into the body.
        let n: usize = kd.iter().product();
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let k = c.weight_of(kd, &v);
        let y = c.node(Op::Concat { axis }, &[a, k, b], out);
        assert_native(c.check(y), 1);
    }
}

#[test]
fn softmax_with_a_row_mask() {
    for (masked, mask_first) in [(false, false), (true, false), (true, true)] {
        let mut c = Case::new(91);
        let x = c.input(&[2, 3, 5, 17]);
        let y = if masked {
            let m = c.input(&[2, 1, 1, 17]);
            // Masked-out keys as attention masks write them: -inf and a large negative.
            if let Tensor::F32(a) = &mut c.inputs[1] {
                a[[1, 0, 0, 4]] = f32::NEG_INFINITY;
                a[[0, 0, 0, 7]] = -10_000.0;
            }
            let ops = if mask_first { [m, x] } else { [x, m] };
            let s = c.node(add(), &ops, &[2, 3, 5, 17]);
            c.node(
                Op::Softmax {
                    kind: rafter_ir::SoftmaxKind::Softmax,
                    axis: -1,
                },
                &[s],
                &[2, 3, 5, 17],
            )
        } else {
            c.node(
                Op::Softmax {
                    kind: rafter_ir::SoftmaxKind::Softmax,
                    axis: 3,
                },
                &[x],
                &[2, 3, 5, 17],
            )
        };
        assert_native(c.check(y), 1);
    }
}

#[test]
fn f16_sums_then_layer_norm_match_the_reference() {
    // BERT's embeddings exported in f16: the adds round to f16 as the reference's ops do,
    // the norm runs in f32 and rounds once, so the result is within an f16 ulp.
    // 48 columns: scale and bias (96 bytes) stay kernel inputs, not folded constants.
    let d = [1usize, 5, 48];
    let f16_ty = |d: &[usize]| {
        let d: Vec<i64> = d.iter().map(|&x| x as i64).collect();
        TensorType::known(DType::F16, &d)
    };
    let halves = |v: Vec<f32>| -> Vec<u8> {
        v.into_iter()
            .flat_map(|x| half::f16::from_f32(x * 3.0).to_le_bytes())
            .collect()
    };
    let mut rng = Rng(91);
    let mut g = Graph::new("f16_norm");
    let mut inputs = Vec::new();
    let mut ins = Vec::new();
    for i in 0..3 {
        let bytes = halves(rng.vec(240));
        inputs.push(Tensor::from_le_bytes(DType::F16, &d, &bytes).unwrap());
        ins.push(g.add_input(format!("e{i}"), f16_ty(&d)));
    }
    let mut weight = |g: &mut Graph, name: &str| {
        let c = ConstData::new(DType::F16, vec![48], Bytes::from(halves(rng.vec(48)))).unwrap();
        g.add_const(name, c)
    };
    let (s, b) = (weight(&mut g, "scale"), weight(&mut g, "bias"));
    let node = |g: &mut Graph, op: Op, args: Vec<Option<ValueId>>, name: &str| {
        g.add_node(
            name,
            op,
            args,
            vec![Some((format!("{name}_out"), f16_ty(&d)))],
        )[0]
        .unwrap()
    };
    let y = node(&mut g, add(), vec![Some(ins[0]), Some(ins[1])], "a0");
    let y = node(&mut g, add(), vec![Some(ins[2]), Some(y)], "a1");
    let norm = Op::LayerNorm {
        axis: -1,
        epsilon: 1e-12,
    };
    let y = node(&mut g, norm, vec![Some(y), Some(s), Some(b)], "ln");
    g.outputs.push(y);
    let want = rafter_reference::run(&g, inputs.clone()).unwrap();
    let program = rafter_opt::compile(&g, &rafter_opt::CompileOptions::default()).unwrap();
    let session = Session::with_options(
        program,
        &devices().unwrap(),
        SessionOptions::new().kernel_threads(2),
    )
    .unwrap();
    let got = call(&session, inputs).unwrap();
    assert_eq!(got[0].dtype(), DType::F16);
    for (i, (a, b)) in got[0]
        .to_f64_vec()
        .iter()
        .zip(want[0].to_f64_vec())
        .enumerate()
    {
        // One f16 ulp at |b| (2^-10 relative), and an absolute floor near zero.
        assert!(
            (a - b).abs() <= b.abs() / 1024.0 + 1e-3,
            "element {i}: {a} vs reference {b}"
        );
    }
    assert_native(session.native_stats(), 1);
}

#[test]
fn sixteen_bit_weights_run_natively_as_the_program_means() {
    use rafter_opt::prepack::WeightFormat;
    // A batched matmul with bias and ReLU, a single-row product (decode) and a scaled gemm
    // read transposed, with weights compiled to 16 bits: every kernel
    // runs natively (`gemm_half`) and matches the reference executor running the same
    // program (cast, unpack, f32 matmul).
    for format in [WeightFormat::Bf16, WeightFormat::F16] {
        let mut c = Case::new(41);
        let x = c.input(&[2, 5, 40]);
        let w = c.weight(&[40, 37]);
        let b = c.weight(&[37]);
        let mm = c.node(Op::MatMul, &[x, w], &[2, 5, 37]);
        let a = c.node(add(), &[mm, b], &[2, 5, 37]);
        let y = c.node(Op::Unary { op: UnaryOp::Relu }, &[a], &[2, 5, 37]);
        let r = c.input(&[1, 40]);
        let w2 = c.weight(&[40, 70]);
        let z = c.node(Op::MatMul, &[r, w2], &[1, 70]);
        let m = c.input(&[3, 40]);
        let w3 = c.weight(&[19, 40]);
        let gemm = Op::Gemm {
            alpha: 0.5,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let q = c.node(gemm, &[m, w3], &[3, 19]);
        c.g.outputs = vec![y, z, q];
        let opts = rafter_opt::CompileOptions {
            cpu_weights: format,
            ..rafter_opt::CompileOptions::default()
        };
        let program = rafter_opt::compile(&c.g, &opts).unwrap();
        let halves = program
            .weights
            .iter()
            .filter(|w| matches!(w.dtype, DType::F16 | DType::BF16))
            .count();
        assert_eq!(halves, 3, "{format:?}");
        let devices = devices().unwrap();
        let reference = Session::with_options(
            program.clone(),
            &devices,
            SessionOptions::new().reference_kernels(),
        )
        .unwrap();
        let want = call(&reference, c.inputs.clone()).unwrap();
        let stats = run_and_compare(program, c.inputs, &want);
        assert_eq!(stats.fallbacks, 0, "{format:?}: {stats:?}");
        assert!(stats.dispatches >= 3, "{format:?}: {stats:?}");
    }
}

/// `matmul_block_quant` (ORT's MatMulNBits) runs on the native kernel, not the reference
/// path, and matches the reference executor: decode and prefill row counts, 4 and 8 bits,
/// with and without zero points and bias, both accuracy levels ORT distinguishes.
#[test]
fn block_quant_matmuls_run_natively() {
    let (k, n, block) = (96usize, 40usize, 32usize);
    let kb = k.div_ceil(block);
    for (rows, bits, zp, bias, accuracy_level) in [
        (&[1usize][..], 4usize, true, false, 0i64),
        (&[2, 3][..], 4, false, true, 4),
        (&[20][..], 4, true, true, 0),
        (&[20][..], 8, true, false, 4),
        (&[1][..], 8, false, true, 0),
    ] {
        let mut c = Case::new(91 + bits as u64);
        let mut a_dims = rows.to_vec();
        a_dims.push(k);
        let a = c.input(&a_dims);
        let u8_const = |c: &mut Case, dims: &[usize]| {
            let len: usize = dims.iter().product();
            let v: Vec<u8> = c
                .rng
                .vec(len)
                .iter()
                .map(|x| ((x + 1.0) * 127.9) as u8)
                .collect();
            let name = format!("w{}", c.g.values.len());
            c.g.add_const(
                name,
                ConstData::new(DType::U8, dims.to_vec(), Bytes::from(v)).unwrap(),
            )
        };
        let b = u8_const(&mut c, &[n, kb, block * bits / 8]);
        let scales: Vec<f32> = c.rng.vec(n * kb).iter().map(|s| s * 0.1).collect();
        let scales = c.weight_of(&[n * kb], &scales);
        let zp = zp.then(|| u8_const(&mut c, &[n * (kb * bits).div_ceil(8)]));
        let bias = bias.then(|| c.weight(&[n]));
        let mut out = rows.to_vec();
        out.push(n);
        let op = Op::MatMulBlockQuant {
            k: k as i64,
            n: n as i64,
            bits: bits as i64,
            block_size: block as i64,
            accuracy_level,
        };
        let y = c.node_opt(op, vec![Some(a), Some(b), Some(scales), zp, bias], &out);
        assert_native(c.check(y), 1);
    }
}

impl Case {
    /// A constant of `dtype` from raw little-endian bytes.
    fn const_bytes(&mut self, dtype: DType, dims: &[usize], bytes: Vec<u8>) -> ValueId {
        let name = format!("c{}", self.g.values.len());
        let c = ConstData::new(dtype, dims.to_vec(), Bytes::from(bytes)).unwrap();
        self.g.add_const(name, c)
    }

    /// Random u8 or i8 bytes (the full range).
    fn quant_bytes(&mut self, len: usize) -> Vec<u8> {
        self.rng
            .vec(len)
            .iter()
            .map(|x| ((x + 1.0) * 127.99) as u8)
            .collect()
    }

    /// A node whose one result has `dtype`.
    fn typed_node(
        &mut self,
        op: Op,
        ins: Vec<Option<ValueId>>,
        dtype: DType,
        out: &[usize],
    ) -> ValueId {
        let n = self.g.nodes.len();
        let d: Vec<i64> = out.iter().map(|&x| x as i64).collect();
        let outs = self.g.add_node(
            format!("n{n}"),
            op,
            ins,
            vec![Some((format!("v{n}"), TensorType::known(dtype, &d)))],
        );
        outs[0].unwrap()
    }
}

fn qconv_op(strides: &[i64], pads: &[i64], dilations: &[i64], group: i64, integer: bool) -> Op {
    let (kernel_shape, strides, pads, dilations) =
        (vec![], strides.to_vec(), pads.to_vec(), dilations.to_vec());
    let auto_pad = AutoPad::NotSet;
    if integer {
        Op::ConvInteger {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
    } else {
        Op::QLinearConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
    }
}

/// `QuantizeLinear → QLinearConv → DequantizeLinear` (and `ConvInteger`) against the
/// reference executor, exactly: u8/i8 activations and weights, zero points at the ends of
/// their ranges, per-tensor and per-channel weight scales and zero points, groups
/// (depthwise included), odd sizes, strides, pads, dilations, a reduction longer than the
/// exact f32 chunk (K = 9·40 = 360 > 256), with and without a bias.
#[test]
fn quantized_convolutions_match_the_reference_exactly() {
    // (x dtype, x zp, w dtype, w zp per channel?, y dtype, y zp, [n, c, h, w], [m, k],
    //  strides, pads, dilations, group, bias)
    type QCase = (
        DType,
        u8,
        DType,
        bool,
        DType,
        u8,
        [usize; 4],
        [usize; 2],
        [i64; 2],
        [i64; 4],
        [i64; 2],
        usize,
        bool,
    );
    let cases: [QCase; 7] = [
        (
            DType::U8,
            0,
            DType::I8,
            false,
            DType::U8,
            128,
            [2, 16, 9, 7],
            [16, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            DType::U8,
            255,
            DType::U8,
            true,
            DType::U8,
            0,
            [1, 3, 11, 13],
            [8, 3],
            [2, 2],
            [1, 0, 2, 1],
            [1, 1],
            1,
            true,
        ),
        (
            DType::I8,
            0x80,
            DType::I8,
            true,
            DType::I8,
            0x80,
            [1, 6, 8, 8],
            [6, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            6,
            false,
        ),
        (
            DType::I8,
            127,
            DType::I8,
            false,
            DType::I8,
            0,
            [2, 8, 7, 9],
            [4, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            2,
            true,
        ),
        (
            DType::U8,
            17,
            DType::I8,
            true,
            DType::U8,
            255,
            [1, 40, 6, 5],
            [5, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            DType::U8,
            3,
            DType::I8,
            false,
            DType::U8,
            9,
            [1, 5, 12, 12],
            [7, 3],
            [1, 2],
            [2, 2, 2, 2],
            [2, 2],
            1,
            false,
        ),
        (
            DType::U8,
            1,
            DType::U8,
            false,
            DType::U8,
            1,
            [1, 4, 5, 5],
            [3, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            false,
        ),
    ];
    for (i, &(xd, xz, wd, per_ch, yd, yz, [n, c, h, w], [m, k], s, p, d, g, bias)) in
        cases.iter().enumerate()
    {
        for integer in [false, true] {
            let mut t = Case::new(200 + i as u64);
            let x = t.input(&[n, c, h, w]);
            let xs = t.weight_of(&[], &[0.02]);
            let xzp = t.const_bytes(xd, &[], vec![xz]);
            let xq = t.typed_node(
                Op::QuantizeLinear {
                    axis: 1,
                    block_size: 0,
                    output_dtype: xd,
                },
                vec![Some(x), Some(xs), Some(xzp)],
                xd,
                &[n, c, h, w],
            );
            let wbytes = t.quant_bytes(m * (c / g) * k * k);
            let wq = t.const_bytes(wd, &[m, c / g, k, k], wbytes);
            let nch = if per_ch { m } else { 1 };
            let zp_dims: &[usize] = if per_ch { &[m] } else { &[] };
            let wzp_bytes: Vec<u8> = match (wd, per_ch) {
                // The ends of the range, and the middle.
                (DType::U8, true) => (0..m).map(|j| [0u8, 255, 128][j % 3]).collect(),
                (DType::I8, true) => (0..m).map(|j| [0x80u8, 0x7f, 0][j % 3]).collect(),
                (DType::U8, false) => vec![131],
                _ => vec![0],
            };
            let wzp = t.const_bytes(wd, zp_dims, wzp_bytes);
            let dims_out = {
                let o = |len: usize, kk: usize, st: i64, pb: i64, pe: i64, dl: i64| {
                    (len + pb as usize + pe as usize - ((kk - 1) * dl as usize + 1)) / st as usize
                        + 1
                };
                [
                    n,
                    m,
                    o(h, k, s[0], p[0], p[2], d[0]),
                    o(w, k, s[1], p[1], p[3], d[1]),
                ]
            };
            let op = qconv_op(&s, &p, &d, g as i64, integer);
            if integer {
                let y = t.typed_node(
                    op,
                    vec![Some(xq), Some(wq), Some(xzp), Some(wzp)],
                    DType::I32,
                    &dims_out,
                );
                let s = t.check(y);
                assert!(s.dispatches >= 2, "{s:?}");
                assert_eq!(s.fallbacks, 0, "{s:?}");
                continue;
            }
            let ws_vals: Vec<f32> = (0..nch).map(|j| 0.003 + 0.001 * j as f32).collect();
            let ws = t.weight_of(zp_dims, &ws_vals);
            let ys = t.weight_of(&[], &[0.05]);
            let yzp = t.const_bytes(yd, &[], vec![yz]);
            let b = bias.then(|| {
                let v: Vec<u8> = (0..m)
                    .flat_map(|j| ((j as i32 - 3) * 997).to_le_bytes())
                    .collect();
                t.const_bytes(DType::I32, &[m], v)
            });
            let y = t.typed_node(
                op,
                vec![
                    Some(xq),
                    Some(xs),
                    Some(xzp),
                    Some(wq),
                    Some(ws),
                    Some(wzp),
                    Some(ys),
                    Some(yzp),
                    b,
                ],
                yd,
                &dims_out,
            );
            let yf = t.typed_node(
                Op::DequantizeLinear {
                    axis: 1,
                    block_size: 0,
                },
                vec![Some(y), Some(ys), Some(yzp)],
                DType::F32,
                &dims_out,
            );
            let s = t.check(yf);
            assert!(s.dispatches >= 2, "case {i}: {s:?}");
            assert_eq!(s.fallbacks, 0, "case {i}: {s:?}");
        }
    }
}

/// `DynamicQuantizeLinear → MatMulInteger` (ORT's `quantize_dynamic` pattern) against the
/// reference executor, bit for bit: u8/i8 weights, per-tensor and per-column weight zero
/// points at the ends of their ranges, batched A, reductions shorter and longer than the
/// exact f32 chunk (K = 600 > 256), all three DynamicQuantizeLinear results, and the fused
/// float tail of MatMulIntegerToFloat (cast, scale, bias; a gelu within tolerance).
#[test]
fn dynamic_quantized_matmuls_match_the_reference_exactly() {
    // (A dims, N, B dtype, per-column zero point?)
    let cases: [(&[usize], usize, DType, bool); 5] = [
        (&[3, 7], 5, DType::I8, false),
        (&[2, 4, 33], 17, DType::U8, true),
        (&[1, 600], 9, DType::I8, true),
        (&[5, 300], 64, DType::U8, false),
        (&[1, 1, 1], 1, DType::I8, true),
    ];
    for (c, &(a_dims, n, bd, per_col)) in cases.iter().enumerate() {
        for tail in [false, true] {
            let i = 2 * c + usize::from(tail);
            let mut t = Case::new(400 + i as u64);
            // A gelu ends every other float tail (BERT's feed-forward); it is not bit for bit.
            let gelu = tail && c % 2 == 1;
            let k = *a_dims.last().unwrap();
            let x = t.input(a_dims);
            let d: Vec<i64> = a_dims.iter().map(|&v| v as i64).collect();
            let outs = t.g.add_node(
                "dql",
                Op::DynamicQuantizeLinear,
                vec![Some(x)],
                vec![
                    Some(("xq".into(), TensorType::known(DType::U8, &d))),
                    Some(("xs".into(), TensorType::known(DType::F32, &[]))),
                    Some(("xz".into(), TensorType::known(DType::U8, &[]))),
                ],
            );
            let [xq, xs, xz] = [outs[0].unwrap(), outs[1].unwrap(), outs[2].unwrap()];
            let bbytes = t.quant_bytes(k * n);
            let b = t.const_bytes(bd, &[k, n], bbytes);
            let (zp_dims, zp_bytes): (&[usize], Vec<u8>) = match (bd, per_col) {
                (DType::U8, true) => (&[n], (0..n).map(|j| [0u8, 255, 128][j % 3]).collect()),
                (_, true) => (&[n], (0..n).map(|j| [0x80u8, 0x7f, 0][j % 3]).collect()),
                (DType::U8, false) => (&[], vec![255]),
                _ => (&[], vec![0x80]),
            };
            let bz = t.const_bytes(bd, zp_dims, zp_bytes);
            let mut y_dims = a_dims.to_vec();
            *y_dims.last_mut().unwrap() = n;
            let y = t.typed_node(
                Op::MatMulInteger,
                vec![Some(xq), Some(b), Some(xz), Some(bz)],
                DType::I32,
                &y_dims,
            );
            let y = if tail {
                // MatMulIntegerToFloat's decomposition: cast, scale, per-column bias.
                let yf = t.typed_node(
                    Op::Cast { to: DType::F32 },
                    vec![Some(y)],
                    DType::F32,
                    &y_dims,
                );
                let s = t.weight_of(&[], &[0.0123]);
                let ys = t.node(Op::Binary { op: BinaryOp::Mul }, &[yf, s], &y_dims);
                let bias = t.weight(&[n]);
                t.node(add(), &[ys, bias], &y_dims)
            } else {
                y
            };
            t.g.outputs.extend([y, xq, xs, xz]);
            let want = rafter_reference::run(&t.g, t.inputs.clone()).unwrap();
            let program =
                rafter_opt::compile(&t.g, &rafter_opt::CompileOptions::default()).unwrap();
            let devices = devices().unwrap();
            let opts = SessionOptions::new().kernel_threads(2);
            let session = Session::with_options(program, &devices, opts).unwrap();
            let got = call(&session, t.inputs).unwrap();
            assert_eq!(got.len(), want.len());
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.shape(), w.shape(), "case {i} output {j}");
                if (gelu || (tail && c == 4)) && j == 0 {
                    for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "case {i}: {a} vs {b}"
                        );
                    }
                } else {
                    assert_eq!(g.to_f64_vec(), w.to_f64_vec(), "case {i} output {j}");
                }
            }
            let s = session.native_stats();
            assert!(s.dispatches >= 2, "case {i}: {s:?}");
            assert_eq!(s.fallbacks, 0, "case {i}: {s:?}");
        }
    }
}

#[test]
fn cumulative_sums_and_products_against_the_reference() {
    use rafter_ir::CumKind;
    // Axis first, middle and last (inner > 1 and inner == 1), negative, every flavour; a
    // `[1, 64, 56, 56]` scan over the channels (the midgraph benchmark's) splits columns
    // over the threads.
    let shapes: [(&[usize], i64); 5] = [
        (&[4, 3, 5], 0),
        (&[4, 3, 5], 1),
        (&[4, 3, 5], -1),
        (&[2, 17, 1], 1),
        (&[1, 64, 56, 56], 1),
    ];
    let mut seed = 1;
    for (dims, axis) in shapes {
        for flags in 0..8 {
            seed += 1;
            let kind = if flags & 1 != 0 {
                CumKind::Prod
            } else {
                CumKind::Sum
            };
            let mut c = Case::new(seed);
            let x = c.input(dims);
            let axis = Bytes::from(axis.to_le_bytes().to_vec());
            let a =
                c.g.add_const("axis", ConstData::new(DType::I64, vec![], axis).unwrap());
            let op = Op::Cumulative {
                kind,
                exclusive: flags & 2 != 0,
                reverse: flags & 4 != 0,
            };
            let y = c.node(op, &[x, a], dims);
            assert_native(c.check(y), 1);
        }
    }
}

#[test]
fn cumulative_of_every_native_dtype_against_the_reference() {
    // Small integers (exact in f16 and in every sum here) so all dtypes agree with the
    // reference closely; axis 1 of [2, 9, 3] (inner > 1) and 2 of [2, 3, 9] (inner == 1).
    for dtype in [DType::F16, DType::F64, DType::I32, DType::I64] {
        for (dims, axis) in [([2usize, 9, 3], 1i64), ([2, 3, 9], 2)] {
            let n: usize = dims.iter().product();
            let vals: Vec<f64> = (0..n).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
            let bytes: Vec<u8> = match dtype {
                DType::F16 => vals
                    .iter()
                    .flat_map(|&v| half::f16::from_f64(v).to_le_bytes())
                    .collect(),
                DType::F64 => vals.iter().flat_map(|&v| v.to_le_bytes()).collect(),
                DType::I32 => vals
                    .iter()
                    .flat_map(|&v| (v as i32).to_le_bytes())
                    .collect(),
                _ => vals
                    .iter()
                    .flat_map(|&v| (v as i64).to_le_bytes())
                    .collect(),
            };
            let x = Tensor::from_le_bytes(dtype, &dims, &bytes).unwrap();
            let mut g = Graph::new("cum");
            let d: Vec<i64> = dims.iter().map(|&v| v as i64).collect();
            let xi = g.add_input("x", TensorType::known(dtype, &d));
            let a = g.add_const(
                "axis",
                ConstData::new(DType::I64, vec![], Bytes::from(axis.to_le_bytes().to_vec()))
                    .unwrap(),
            );
            let op = Op::Cumulative {
                kind: rafter_ir::CumKind::Sum,
                exclusive: true,
                reverse: true,
            };
            let y = g.add_node(
                "cum",
                op,
                vec![Some(xi), Some(a)],
                vec![Some(("y".into(), TensorType::known(dtype, &d)))],
            )[0]
            .unwrap();
            g.outputs.push(y);
            let want = rafter_reference::run(&g, vec![x.clone()]).unwrap();
            let program = rafter_opt::compile(&g, &rafter_opt::CompileOptions::default()).unwrap();
            let kernels = program.kernels.len();
            let stats = run_and_compare(program, vec![x], &want);
            // Every kernel (the scan, and any cast the compiler put around it) is native.
            assert_eq!(stats.kernels, kernels, "{dtype}: {stats:?}");
            assert_native(stats, 1);
        }
    }
}

#[test]
fn a_reshape_of_a_length_sized_buffer_is_placed_over_its_operand_per_call() {
    // The buffers' sizes follow `seq`, so the memory plan cannot place the reshape's
    // result over its operand at compile time; the session does, per call, and does not
    // dispatch the reshape. Two lengths: each call places its own.
    let g = rafter_ir::text::parse_graph(
        r#"graph @g(%x: f32[seq, 6], %w: f32[6, 6]) -> (%y) {
          %a: f32[seq, 6] = matmul(%x, %w)
          const %s: i64[3] = dense [0, 2, 3]
          %r: f32[seq, 2, 3] = reshape{allow_zero = false}(%a, %s)
          %y: f32[seq, 3, 2] = transpose{perm = [0, 2, 1]}(%r)
        }"#,
    )
    .unwrap();
    let program = rafter_opt::compile(&g, &rafter_opt::CompileOptions::default()).unwrap();
    let kernels = program.kernels.len();
    assert!(
        program.kernels.iter().any(|k| k.viewed_operand().is_some()),
        "the reshape stays a kernel of its own: {program:?}"
    );
    let devices = devices().unwrap();
    let session =
        Session::with_options(program, &devices, SessionOptions::new().kernel_threads(2)).unwrap();
    let mut rng = Rng(77);
    for seq in [5usize, 9] {
        let inputs = vec![
            Tensor::f32s(&[seq, 6], rng.vec(seq * 6)),
            Tensor::f32s(&[6, 6], rng.vec(36)),
        ];
        let want = rafter_reference::run(&g, inputs.clone()).unwrap();
        let before = session.native_stats().dispatches;
        let got = call(&session, inputs).unwrap();
        assert_eq!(got[0].shape(), want[0].shape());
        for (a, b) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{a} vs reference {b}"
            );
        }
        let dispatched = session.native_stats().dispatches - before;
        assert_eq!(
            dispatched,
            kernels as u64 - 1,
            "seq {seq}: every kernel but the reshape dispatched"
        );
    }
}
