//! Kernel bodies of f32 elementwise ops as `rafter-kernels-cpu` tile programs.
//!
//! [`tile_program`] translates a body whose every node is an f32 elementwise op the tile
//! interpreter covers (see the match in `translate`) into a [`TileProgram`]; any other body
//! gives `None` and stays on the reference executor. [`run_tile`] runs one on tensors.
//!
//! # Operand and broadcast contract
//! - The program's inputs are the body's inputs, in order; each is passed with its run-time
//!   dims, row-major and contiguous. f32 constants of the body with more than one element
//!   are baked into the program as operands after the inputs; one-element constants become
//!   scalars.
//! - Every operand broadcasts NumPy-style (dims right-aligned, 1 repeats) to the output;
//!   the output's dims are the broadcast of the operands the output depends on
//!   ([`TileProgram::out_dims`]), which is what the reference executor's elementwise ops
//!   produce, so the result has the body output's type.
//! - Exactly one body output. Numerics: exact IEEE for add/sub/mul/div/min/max/neg/abs/
//!   sqrt/reciprocal/relu/clip (bitwise the reference's f32 results); `exp`, `log`, `tanh`,
//!   `erf`, `sigmoid` and GELU within a few ulp (erf 3.7e-7 absolute), see
//!   `rafter_kernels_cpu::tile`.
//!
//! Where it runs: the CPU device's native elementwise kernel (`native::elementwise`) runs
//! [`tile_program`]s on borrowed operands; [`tile_kernel`] is the tensor-path kernel (on
//! owned tensors, see `fallback`) used when a native kernel declines a call. Softmax and layer norm bodies have native kernels of their own
//! (`native::softmax`, `native::norm`).

use std::collections::HashMap;

use rafter_ir::{BinaryOp, DType, GeluApprox, Graph, Op, UnaryOp, ValueDef, ValueId};
use rafter_kernels_cpu::tile::{TileBinary, TileBuilder, TileProgram, TileUnary, TileVal};
#[cfg(any(test, feature = "interpreter"))]
use rafter_kernels_cpu::Parallel;
#[cfg(any(test, feature = "interpreter"))]
use rafter_reference::Tensor;

#[cfg(feature = "interpreter")]
use crate::fallback::TensorKernel;
#[cfg(feature = "interpreter")]
use crate::native::Par;

/// A tensor-path kernel running `body` as a tile program on the session's kernel threads.
#[cfg(feature = "interpreter")]
pub(crate) fn tile_kernel(body: &Graph, par: &Par) -> Option<TensorKernel> {
    let prog = tile_program(body)?;
    let par = par.clone();
    Some(std::sync::Arc::new(move |ins: &[Tensor]| {
        Ok(vec![run_tile(&prog, ins, &*par)?])
    }))
}

/// The tile program computing `body`, or `None` when some node is not an f32 elementwise
/// op the interpreter covers (or the body has other than one output).
pub(crate) fn tile_program(body: &Graph) -> Option<TileProgram> {
    let [out] = body.outputs.as_slice() else {
        return None;
    };
    let f32_value = |v: ValueId| body.value(v).ty.dtype == DType::F32;
    if !body.inputs.iter().all(|&v| f32_value(v)) {
        return None;
    }
    let mut b = TileBuilder::new(body.inputs.len());
    let mut vals: HashMap<ValueId, TileVal> = body
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| (v, b.input(i)))
        .collect();
    for node in &body.nodes {
        let [Some(y)] = node.outputs.as_slice() else {
            return None;
        };
        if !f32_value(*y) {
            return None;
        }
        let v = translate(body, node, &mut b, &mut vals)?;
        vals.insert(*y, v);
    }
    let out = operand(body, *out, &mut b, &mut vals)?;
    b.finish(out).ok()
}

/// The tile value of body value `v`: a translated node result, an input, or an f32
/// constant (baked in).
fn operand(
    body: &Graph,
    v: ValueId,
    b: &mut TileBuilder,
    vals: &mut HashMap<ValueId, TileVal>,
) -> Option<TileVal> {
    if let Some(t) = vals.get(&v) {
        return Some(*t);
    }
    match body.value(v).def {
        ValueDef::Const(c) => {
            let c = body.constant(c);
            if c.dtype != DType::F32 {
                return None;
            }
            let data: Vec<f32> = c.to_f64s().into_iter().map(|x| x as f32).collect();
            let t = b.constant(data, c.dims.clone()).ok()?;
            vals.insert(v, t);
            Some(t)
        }
        _ => None,
    }
}

/// The value of a one-element float constant (an exponent, a clip bound).
fn scalar_const(body: &Graph, v: ValueId) -> Option<f64> {
    let c = body.const_of(v)?;
    if !c.dtype.is_float() || c.num_elements() != 1 {
        return None;
    }
    c.to_f64s().first().copied()
}

fn translate(
    body: &Graph,
    node: &rafter_ir::Node,
    b: &mut TileBuilder,
    vals: &mut HashMap<ValueId, TileVal>,
) -> Option<TileVal> {
    let mut arg = |i: usize| -> Option<TileVal> {
        let v = (*node.inputs.get(i)?)?;
        operand(body, v, b, vals)
    };
    let un = |op: UnaryOp| {
        Some(match op {
            UnaryOp::Abs => TileUnary::Abs,
            UnaryOp::Neg => TileUnary::Neg,
            UnaryOp::Sqrt => TileUnary::Sqrt,
            UnaryOp::Exp => TileUnary::Exp,
            UnaryOp::Log => TileUnary::Log,
            UnaryOp::Reciprocal => TileUnary::Recip,
            UnaryOp::Tanh => TileUnary::Tanh,
            UnaryOp::Erf => TileUnary::Erf,
            UnaryOp::Sigmoid => TileUnary::Sigmoid,
            UnaryOp::Relu => TileUnary::Relu,
            _ => return None,
        })
    };
    Some(match &node.op {
        Op::Identity => arg(0)?,
        Op::Unary { op } => {
            let op = un(*op)?;
            let x = arg(0)?;
            b.unary(op, x)
        }
        Op::Binary { op: BinaryOp::Pow } => {
            let e = scalar_const(body, (*node.inputs.get(1)?)?)?;
            let op = match e {
                1.0 => TileUnary::Copy,
                2.0 => TileUnary::Square,
                3.0 => TileUnary::Cube,
                0.5 => TileUnary::PowHalf,
                -1.0 => TileUnary::Recip,
                _ => return None,
            };
            let x = arg(0)?;
            b.unary(op, x)
        }
        Op::Binary { op } => {
            let op = match op {
                BinaryOp::Add => TileBinary::Add,
                BinaryOp::Sub => TileBinary::Sub,
                BinaryOp::Mul => TileBinary::Mul,
                BinaryOp::Div => TileBinary::Div,
                BinaryOp::Max => TileBinary::Max,
                BinaryOp::Min => TileBinary::Min,
                _ => return None,
            };
            let (x, y) = (arg(0)?, arg(1)?);
            b.binary(op, x, y)
        }
        Op::Clip => {
            let bound = |i: usize, none: f32| -> Option<f32> {
                match node.inputs.get(i).copied().flatten() {
                    None => Some(none),
                    Some(v) => scalar_const(body, v).map(|x| x as f32),
                }
            };
            let (lo, hi) = (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?);
            let x = arg(0)?;
            b.unary(TileUnary::Clip(lo, hi), x)
        }
        Op::Gelu { approximate } => {
            let op = match approximate {
                GeluApprox::None => TileUnary::GeluErf,
                GeluApprox::Tanh => TileUnary::GeluTanh,
            };
            let x = arg(0)?;
            b.unary(op, x)
        }
        Op::LeakyRelu { alpha } => {
            let x = arg(0)?;
            b.unary(TileUnary::LeakyRelu(*alpha), x)
        }
        _ => return None,
    })
}

/// Runs `prog` on the body's input tensors (f32, contiguous), returning the output.
#[cfg(any(test, feature = "interpreter"))]
pub(crate) fn run_tile(
    prog: &TileProgram,
    ins: &[Tensor],
    par: &dyn Parallel,
) -> Result<Tensor, String> {
    let mut args: Vec<(&[f32], &[usize])> = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        let Tensor::F32(a) = t else {
            return Err(format!("operand {i}: expected f32, got {:?}", t.dtype()));
        };
        let data = a
            .as_slice()
            .ok_or_else(|| format!("operand {i} is not contiguous"))?;
        args.push((data, a.shape()));
    }
    let dims: Vec<&[usize]> = args.iter().map(|a| a.1).collect();
    let out_dims = prog.out_dims(&dims).map_err(|e| e.to_string())?;
    let mut out = vec![0.0f32; out_dims.iter().product()];
    rafter_kernels_cpu::tile::run_f32(prog, &args, &mut out, &out_dims, par)
        .map_err(|e| e.to_string())?;
    Ok(Tensor::f32s(&out_dims, out))
}

#[cfg(all(test, feature = "interpreter"))]
mod tests {
    use super::*;
    use rafter_ir::{ConstData, Symbol, TensorType};
    use rafter_kernels_cpu::{ScopedThreads, Sequential};

    fn known(shape: &[usize]) -> TensorType {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        TensorType::known(DType::F32, &dims)
    }

    fn data(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 125.0
                - 4.0
        });
        Tensor::f32s(shape, v.collect())
    }

    /// Runs `g` on the reference executor and as a tile program; the results agree within
    /// `tol` relative to max(1, |reference|) (0: bitwise).
    fn same_as_reference(g: &Graph, inputs: Vec<Tensor>, tol: f64) {
        let prog = tile_program(g).expect("the tile path takes this body");
        let got = run_tile(&prog, &inputs, &ScopedThreads::new(2)).unwrap();
        let want = rafter_reference::run(g, inputs).unwrap();
        assert_eq!(got.shape(), want[0].shape(), "{}", g.name);
        for (i, (a, b)) in got
            .to_f64_vec()
            .iter()
            .zip(want[0].to_f64_vec())
            .enumerate()
        {
            let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * b.abs().max(1.0);
            assert!(ok, "{}: element {i}: {a} vs {b}", g.name);
        }
    }

    struct Body {
        g: Graph,
    }

    impl Body {
        fn new(name: &str) -> Self {
            Body {
                g: Graph::new(name),
            }
        }
        fn input(&mut self, shape: &[usize]) -> ValueId {
            let n = self.g.inputs.len();
            self.g.add_input(format!("x{n}"), known(shape))
        }
        fn scalar(&mut self, v: f32) -> ValueId {
            let n = self.g.values.len();
            self.g
                .add_const(format!("c{n}"), ConstData::from_f32s(&[v]))
        }
        fn node(&mut self, op: Op, ins: &[ValueId], out: &[usize]) -> ValueId {
            let n = self.g.nodes.len();
            let ins = ins.iter().map(|&v| Some(v)).collect();
            self.g.add_node(
                format!("n{n}"),
                op,
                ins,
                vec![Some((format!("v{n}"), known(out)))],
            )[0]
            .unwrap()
        }
        fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId, out: &[usize]) -> ValueId {
            self.node(Op::Binary { op }, &[a, b], out)
        }
        fn un(&mut self, op: UnaryOp, a: ValueId, out: &[usize]) -> ValueId {
            self.node(Op::Unary { op }, &[a], out)
        }
        fn finish(mut self, y: ValueId) -> Graph {
            self.g.outputs.push(y);
            self.g
        }
    }

    /// BERT's erf-GELU body: x / √2, erf, + 1, * x, * 0.5 (fused into one instruction).
    #[test]
    fn bert_gelu_body() {
        let s = [2, 5, 37];
        let mut b = Body::new("gelu");
        let x = b.input(&s);
        let r2 = b.scalar(std::f32::consts::SQRT_2);
        let one = b.scalar(1.0);
        let half = b.scalar(0.5);
        let w = b.bin(BinaryOp::Div, x, r2, &s);
        let e = b.un(UnaryOp::Erf, w, &s);
        let p = b.bin(BinaryOp::Add, e, one, &s);
        let m = b.bin(BinaryOp::Mul, x, p, &s);
        let y = b.bin(BinaryOp::Mul, m, half, &s);
        let g = b.finish(y);
        assert!(tile_program(&g).unwrap().is_gelu_erf());
        same_as_reference(&g, vec![data(&s, 1)], 1e-6);
    }

    /// Attention scores plus a broadcast mask: bitwise the reference.
    #[test]
    fn masked_scores_add() {
        let (s, m) = ([1, 4, 9, 9], [1, 1, 1, 9]);
        let mut b = Body::new("mask_add");
        let x = b.input(&s);
        let k = b.input(&m);
        let y = b.bin(BinaryOp::Add, x, k, &s);
        let g = b.finish(y);
        same_as_reference(&g, vec![data(&s, 1), data(&m, 2)], 0.0);
    }

    /// An unfused layer-norm tail and other exact ops: bias [8] and a [3, 1] column
    /// against [3, 8], pow 2 / 0.5, reciprocal, max/min, clip with constant bounds, a
    /// baked [8] constant: bitwise the reference.
    #[test]
    fn exact_ops_with_broadcast_are_bitwise() {
        let s = [3, 8];
        let mut b = Body::new("exact");
        let x = b.input(&s);
        let bias = b.input(&[8]);
        let col = b.input(&[3, 1]);
        let two = b.scalar(2.0);
        let halfp = b.scalar(0.5);
        let lo = b.scalar(-1.5);
        let hi = b.scalar(2.5);
        let w = b.g.add_const(
            "w",
            ConstData::from_f32s(&[1.0, -2.0, 3.0, 0.5, 0.25, 8.0, -1.0, 2.0]),
        );
        let t = b.bin(BinaryOp::Sub, x, col, &s);
        let sq = b.bin(BinaryOp::Pow, t, two, &s);
        let sq = b.bin(BinaryOp::Add, sq, bias, &s);
        let r = b.bin(BinaryOp::Pow, sq, halfp, &s);
        let r = b.un(UnaryOp::Reciprocal, r, &s);
        let r = b.bin(BinaryOp::Mul, r, w, &s);
        let r = b.bin(BinaryOp::Max, r, t, &s);
        let r = b.bin(BinaryOp::Min, r, x, &s);
        let r = b.node(Op::Clip, &[r, lo, hi], &s);
        let r = b.un(UnaryOp::Abs, r, &s);
        let r = b.un(UnaryOp::Neg, r, &s);
        let y = b.node(Op::Identity, &[r], &s);
        let g = b.finish(y);
        let bias_t = Tensor::f32s(&[8], (0..8).map(|i| i as f32 * 0.5 + 0.1).collect());
        same_as_reference(&g, vec![data(&s, 3), bias_t, data(&[3, 1], 4)], 0.0);
    }

    /// Transcendentals: within a few ulp of the reference.
    #[test]
    fn transcendental_ops() {
        let s = [4, 33];
        let mut b = Body::new("trans");
        let x = b.input(&s);
        let e = b.un(UnaryOp::Exp, x, &s);
        let l = b.un(UnaryOp::Log, e, &s);
        let t = b.un(UnaryOp::Tanh, l, &s);
        let sg = b.un(UnaryOp::Sigmoid, x, &s);
        let a = b.bin(BinaryOp::Add, t, sg, &s);
        let r = b.un(UnaryOp::Relu, a, &s);
        let g1 = b.node(
            Op::Gelu {
                approximate: GeluApprox::Tanh,
            },
            &[r],
            &s,
        );
        let y = b.node(Op::LeakyRelu { alpha: 0.2 }, &[g1], &s);
        let g = b.finish(y);
        same_as_reference(&g, vec![data(&s, 5)], 2e-6);
    }

    /// Runs the host kernel `k` and the reference on `g`; within `tol` as above.
    fn kernel_same_as_reference(k: &TensorKernel, g: &Graph, inputs: Vec<Tensor>, tol: f64) {
        let got = k(&inputs).unwrap();
        let want = rafter_reference::run(g, inputs).unwrap();
        assert_eq!(got[0].shape(), want[0].shape(), "{}", g.name);
        for (i, (a, b)) in got[0]
            .to_f64_vec()
            .iter()
            .zip(want[0].to_f64_vec())
            .enumerate()
        {
            let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * b.abs().max(1.0);
            assert!(ok, "{}: element {i}: {a} vs {b}", g.name);
        }
    }

    #[test]
    fn tile_kernel_takes_what_tile_program_takes() {
        let mut b = Body::new("add");
        let x = b.input(&[3, 4]);
        let k = b.input(&[4]);
        let y = b.bin(BinaryOp::Add, x, k, &[3, 4]);
        let g = b.finish(y);
        let kern = tile_kernel(&g, &crate::native::pool(2)).unwrap();
        kernel_same_as_reference(&kern, &g, vec![data(&[3, 4], 1), data(&[4], 2)], 0.0);
    }

    #[test]
    fn other_bodies_are_left_to_the_reference() {
        let s = [2, 3];
        // Pow with a non-constant exponent, and with an exponent it does not cover.
        let mut b = Body::new("pow");
        let x = b.input(&s);
        let e = b.input(&s);
        let y = b.bin(BinaryOp::Pow, x, e, &s);
        assert!(tile_program(&b.finish(y)).is_none());
        let mut b = Body::new("pow7");
        let x = b.input(&s);
        let e = b.scalar(7.0);
        let y = b.bin(BinaryOp::Pow, x, e, &s);
        assert!(tile_program(&b.finish(y)).is_none());
        // Softmax, and an f64 body.
        let mut b = Body::new("softmax");
        let x = b.input(&s);
        let y = b.node(
            Op::Softmax {
                kind: rafter_ir::SoftmaxKind::Softmax,
                axis: -1,
            },
            &[x],
            &s,
        );
        assert!(tile_program(&b.finish(y)).is_none());
        let mut b = Body::new("f64");
        let x = b.input(&s);
        let y = b.un(UnaryOp::Exp, x, &s);
        let mut g = b.finish(y);
        g.values.iter_mut().for_each(|v| v.ty.dtype = DType::F64);
        assert!(tile_program(&g).is_none());
    }

    #[test]
    fn bad_operands_are_errors() {
        let mut b = Body::new("add");
        let x = b.input(&[2, 3]);
        let k = b.input(&[3]);
        let y = b.bin(BinaryOp::Add, x, k, &[2, 3]);
        let p = tile_program(&b.finish(y)).unwrap();
        let e = run_tile(&p, &[data(&[2, 3], 1), data(&[4], 2)], &Sequential).unwrap_err();
        assert!(e.contains("tile input 1: dims [4] do not broadcast"), "{e}");
        let e = run_tile(&p, &[data(&[2, 3], 1)], &Sequential).unwrap_err();
        assert!(e.contains("the program takes 2, got 1"), "{e}");
        let i = Tensor::i64s(&[3], vec![1, 2, 3]);
        let e = run_tile(&p, &[data(&[2, 3], 1), i], &Sequential).unwrap_err();
        assert!(e.contains("operand 1: expected f32"), "{e}");
    }

    fn median_us(reps: usize, mut f: impl FnMut()) -> f64 {
        f();
        let mut t: Vec<f64> = (0..reps)
            .map(|_| {
                let s = std::time::Instant::now();
                f();
                s.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[reps / 2]
    }

    /// BERT-base's non-GEMM bodies on the reference executor, on the existing host kernel
    /// (layer norm), and on `rafter-kernels-cpu` (1 and 2 threads). Not a unit test:
    /// `cargo test --release -p rafter-runtime --lib tile::tests::bench_vs_reference --
    /// --ignored --nocapture [reps via RAFTER_BENCH_REPS]`.
    #[test]
    #[ignore]
    fn bench_vs_reference() {
        use rafter_kernels_cpu::{gelu_erf, layer_norm, softmax, RowMask};
        let reps: usize = std::env::var("RAFTER_BENCH_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(21);
        let two = ScopedThreads::new(2);
        let pars: [(&str, &dyn Parallel); 2] = [("1t", &Sequential), ("2t", &two)];
        let f32s = |t: &Tensor| match t {
            Tensor::F32(a) => a.as_slice().unwrap().to_vec(),
            _ => unreachable!(),
        };
        println!("median of {reps} calls, microseconds");

        // add(scores [1,12,128,128], mask [1,1,1,128]) -> softmax(-1)
        let (s, m) = ([1usize, 12, 128, 128], [1usize, 1, 1, 128]);
        let mut b = Body::new("attn_softmax");
        let x = b.input(&s);
        let k = b.input(&m);
        let a = b.bin(BinaryOp::Add, x, k, &s);
        let y = b.node(
            Op::Softmax {
                kind: rafter_ir::SoftmaxKind::Softmax,
                axis: -1,
            },
            &[a],
            &s,
        );
        let g = b.finish(y);
        let xs = data(&s, 1);
        let ms = data(&m, 2);
        let t_ref = median_us(reps, || {
            rafter_reference::run(&g, vec![xs.clone(), ms.clone()]).unwrap();
        });
        println!("add+softmax [1,12,128,128]: reference {t_ref:9.1}");
        let (xv, mv) = (f32s(&xs), f32s(&ms));
        let mask = RowMask::broadcast(&mv, &s[..3], &m, 128).unwrap();
        let mut out = vec![0.0; xv.len()];
        for (pn, par) in pars {
            let t = median_us(reps, || {
                softmax(&xv, &mut out, 128, Some(&mask), par).unwrap()
            });
            println!(
                "add+softmax [1,12,128,128]: kernel {pn} {t:9.1}  ({:.0}x)",
                t_ref / t
            );
        }

        // layer_norm(x [128,768], gamma, beta), eps 1e-12
        let (s, p) = ([1usize, 128, 768], [768usize]);
        let mut b = Body::new("layer_norm");
        let x = b.input(&s);
        let gm = b.input(&p);
        let bt = b.input(&p);
        let y = b.node(
            Op::LayerNorm {
                axis: -1,
                epsilon: 1e-12,
            },
            &[x, gm, bt],
            &s,
        );
        let g = b.finish(y);
        let ins = vec![data(&s, 3), data(&p, 4), data(&p, 5)];
        let t_ref = median_us(reps, || {
            rafter_reference::run(&g, ins.clone()).unwrap();
        });
        let host = crate::fallback::single_op::single_op_kernel(&g).unwrap();
        let t_host = median_us(reps, || {
            host(&ins).unwrap();
        });
        println!(
            "layer_norm [128,768]: reference {t_ref:9.1}, single_op tensor kernel {t_host:9.1}"
        );
        let (xv, gv, bv) = (f32s(&ins[0]), f32s(&ins[1]), f32s(&ins[2]));
        let mut out = vec![0.0; xv.len()];
        for (pn, par) in pars {
            let t = median_us(reps, || {
                layer_norm(&xv, &mut out, 768, &gv, Some(&bv), 1e-12, par).unwrap()
            });
            println!(
                "layer_norm [128,768]: kernel {pn} {t:9.1}  ({:.0}x reference, {:.1}x host)",
                t_ref / t,
                t_host / t
            );
        }

        // BERT's GELU body on [128, 3072], and a bias add [128,768] + [768].
        let s = [1usize, 128, 3072];
        let mut b = Body::new("gelu");
        let x = b.input(&s);
        let r2 = b.scalar(std::f32::consts::SQRT_2);
        let one = b.scalar(1.0);
        let half = b.scalar(0.5);
        let w = b.bin(BinaryOp::Div, x, r2, &s);
        let e = b.un(UnaryOp::Erf, w, &s);
        let p1 = b.bin(BinaryOp::Add, e, one, &s);
        let mm = b.bin(BinaryOp::Mul, x, p1, &s);
        let y = b.bin(BinaryOp::Mul, mm, half, &s);
        let g = b.finish(y);
        let ins = vec![data(&s, 6)];
        let t_ref = median_us(reps, || {
            rafter_reference::run(&g, ins.clone()).unwrap();
        });
        println!("gelu body [128,3072]: reference {t_ref:9.1}");
        let prog = tile_program(&g).unwrap();
        let xv = f32s(&ins[0]);
        let mut out = xv.clone();
        for (pn, par) in pars {
            let t = median_us(reps, || {
                run_tile(&prog, &ins, par).unwrap();
            });
            let t2 = median_us(reps, || {
                out.copy_from_slice(&xv);
                gelu_erf(&mut out, par).unwrap()
            });
            println!(
                "gelu body [128,3072]: tile program {pn} {t:9.1} ({:.0}x), in-place gelu_erf {t2:9.1} ({:.0}x)",
                t_ref / t,
                t_ref / t2
            );
        }
        let s = [1usize, 128, 768];
        let mut b = Body::new("bias_add");
        let x = b.input(&s);
        let bias = b.input(&[768]);
        let y = b.bin(BinaryOp::Add, x, bias, &s);
        let g = b.finish(y);
        let ins = vec![data(&s, 7), data(&[768], 8)];
        let t_ref = median_us(reps, || {
            rafter_reference::run(&g, ins.clone()).unwrap();
        });
        let prog = tile_program(&g).unwrap();
        println!("bias add [128,768]+[768]: reference {t_ref:9.1}");
        for (pn, par) in pars {
            let t = median_us(reps, || {
                run_tile(&prog, &ins, par).unwrap();
            });
            println!(
                "bias add [128,768]+[768]: tile program {pn} {t:9.1} ({:.0}x)",
                t_ref / t
            );
        }
    }

    /// Every bert_tiny kernel body the tile, softmax and layer-norm kernels take computes
    /// what the reference does, with its symbols bound to 7.
    #[test]
    fn bert_tiny_elementwise_bodies_match_the_reference() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/bert_tiny/model.onnx"
        );
        let graph = rafter_import::import_onnx_file(std::path::Path::new(path))
            .unwrap()
            .graph;
        let program = rafter_opt::compile(&graph, &rafter_opt::CompileOptions::default()).unwrap();
        let mut taken = [0usize; 2];
        for k in &program.kernels {
            // The epilogue of a matmul-rooted body (what `fallback::gemm_first::matmul_kernel` runs on the
            // reference executor after the GEMM): the body without its matmul, whose
            // product becomes the last input.
            let rest = (k.body.nodes.len() > 1 && k.body.nodes[0].op == Op::MatMul)
                .then(|| matmul_rest(&k.body))
                .flatten();
            let (which, kern, body) =
                if let Some(kern) = tile_kernel(&k.body, &crate::native::pool(2)) {
                    (0, kern, &k.body)
                } else if let Some((kern, rest)) = rest
                    .as_ref()
                    .and_then(|r| Some((tile_kernel(r, &crate::native::pool(2))?, r)))
                {
                    (1, kern, rest)
                } else {
                    continue;
                };
            let mut bind: HashMap<Symbol, i64> = HashMap::new();
            let inputs: Vec<Tensor> = body
                .inputs
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let dims: Vec<usize> = body
                        .value(v)
                        .ty
                        .dims
                        .iter()
                        .map(|d| {
                            for s in d.symbols() {
                                bind.insert(s, 7);
                            }
                            d.eval(&bind).unwrap() as usize
                        })
                        .collect();
                    data(&dims, i as u32 + 1)
                })
                .collect();
            kernel_same_as_reference(&kern, body, inputs, 2e-6);
            taken[which] += 1;
        }
        eprintln!("bert_tiny kernel bodies taken (tile, matmul epilogue as tile): {taken:?}");
        assert!(taken.iter().all(|&n| n > 0), "{taken:?}");
    }

    /// `body` without its first node (a matmul), whose result becomes the last input: as
    /// `fallback::gemm_first::rest_of` builds it.
    fn matmul_rest(body: &Graph) -> Option<Graph> {
        let product = body.nodes[0].outputs.first().copied().flatten()?;
        let mut g = body.clone();
        g.nodes.remove(0);
        g.values[product.0 as usize].def = ValueDef::Input(g.inputs.len());
        g.inputs.push(product);
        for v in g.values.iter_mut() {
            if let ValueDef::Node { node, output } = v.def {
                v.def = ValueDef::Node {
                    node: rafter_ir::NodeId(node.0.checked_sub(1)?),
                    output,
                };
            }
        }
        rafter_ir::verify::verify(&g).ok()?;
        Some(g)
    }
}
