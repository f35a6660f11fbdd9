//! ONNX `MatMulInteger` (u8/i8 operands, i32 result) on borrowed operands: the integer
//! product of ORT's `quantize_dynamic` models (BERT's projections, the quantized LSTM's
//! input and output layers) and of the com.microsoft `MatMulIntegerToFloat` /
//! `DynamicQuantizeMatMul` ops, which the importer decomposes into it.
//!
//! The product of `a - a_zp` and `b - b_zp` is computed exactly on the f32 GEMM
//! ([`super::exact_int`], as `ConvInteger` is), so it is the reference's integer product bit
//! for bit, at the speed of the crate's f32 GEMM and its ISA dispatch. The shifted B (a weight, with a fixed zero point) is computed once and
//! kept.
//!
//! A float tail the compiler fused after it — `cast` to f32, then the scale, bias and
//! residual of ORT's `MatMulIntegerToFloat` pattern (`mul` by a scalar, `add` of a
//! per-column `[N]` bias, `add` of a whole-output residual, relu or clip) — runs on the exact
//! integers in the order the body has it, `((f32(acc) · s) + bias) + residual`, so it is
//! the reference's f32 arithmetic bit for bit. A final `gelu` (BERT's feed-forward) runs
//! as one vectorised pass over the result ([`activation_in_place`], within the reference's
//! tolerance, not bit for bit); a final `tanh` (the pooler) as `f32::tanh`.
//!
//! Handled here: A `[..., M, K]` with a per-tensor zero point, B `[K, N]` (2-D, shared by
//! every batch of A) with a per-tensor or per-column (`[N]`) zero point. Other shapes
//! (batched B, per-row A zero points) go to the reference path.

use std::cell::RefCell;
use std::sync::Arc;

use rafter_ir::{DType, GeluApprox, Graph, Op, UnaryOp};
use rafter_kernels_cpu::{activation_in_place, Activation, UnaryFn};

use super::epilogue::{parse_chain_until, resolve, EpiOp, Resolved};

use super::exact_int::{exact_product, grow, ShiftedWeight};
use super::qconv::{ints, Opnd, View, Q};
use super::{input_of, known_dims, In, NativeKernel, Out, Par};

struct MatMulIntegerKernel {
    /// Body input index of A.
    a: usize,
    /// B: a body input, or a small constant the compiler copied into the body.
    b: Opnd,
    /// B's dims when it is a constant.
    b_const_dims: Option<Vec<usize>>,
    a_zp: Option<Opnd>,
    b_zp: Option<Opnd>,
    /// The f32 tail after a `cast` to f32 (`None`: the body ends at the i32 product).
    tail: Option<Vec<EpiOp>>,
    /// A gelu or tanh ending the tail.
    last: Option<Last>,
    par: Par,
    /// `b - b_zp` as f32, by the weight it was computed from (only when B is a program
    /// weight and its zero point fixed).
    shifted_b: ShiftedWeight,
}

/// The kernel for a body that is one `matmul_integer` node.
pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let node = body.nodes.first()?;
    if node.op != Op::MatMulInteger
        || body.outputs.len() != 1
        || node.outputs.len() != 1
        || node.inputs.len() < 2
        || node.inputs.len() > 4
    {
        return None;
    }
    let a = input_of(body, node.input(0), DType::U8)
        .or_else(|| input_of(body, node.input(0), DType::I8))?;
    let b = Opnd::of(body, node.input(1), Q)?;
    let b_const_dims = match b {
        Opnd::Const { .. } => Some(known_dims(body, node.input(1)?)?),
        Opnd::Input(_) => None,
    };
    let zp = |i: usize| -> Option<Option<Opnd>> {
        match node.inputs.get(i).copied().flatten() {
            None => Some(None),
            Some(v) => Some(Some(Opnd::of(body, Some(v), Q)?)),
        }
    };
    let mut last = None;
    let tail = match body.nodes.get(1) {
        None => None,
        Some(cast) => {
            let covered = cast.op == (Op::Cast { to: DType::F32 })
                && cast.inputs == [node.outputs[0]]
                && cast.outputs.len() == 1
                && super::read_once(body, node.outputs[0]?);
            if !covered {
                return None;
            }
            let (chain, cur, at) =
                parse_chain_until(body, cast.outputs[0]?, 2, |n| Last::of(&n.op).is_some())?;
            let out = match body.nodes.get(at) {
                None => cur,
                Some(g) if at + 1 == body.nodes.len() && g.outputs.len() == 1 => {
                    last = Last::of(&g.op);
                    g.outputs[0]?
                }
                Some(_) => return None,
            };
            if body.outputs != [out] || body.value(cur).ty.dtype != DType::F32 {
                return None;
            }
            Some(chain)
        }
    };
    Some(Arc::new(MatMulIntegerKernel {
        a,
        tail,
        last,
        b,
        b_const_dims,
        a_zp: zp(2)?,
        b_zp: zp(3)?,
        par: par.clone(),
        shifted_b: ShiftedWeight::default(),
    }))
}

/// The op that may end a float tail after the epilogue's part.
#[derive(Clone, Copy, Debug)]
enum Last {
    /// BERT's feed-forward activation: one vectorised pass.
    Gelu(UnaryFn),
    /// A pooler's activation (one row): `f32::tanh`, as the reference computes it.
    Tanh,
}

impl Last {
    fn of(op: &Op) -> Option<Last> {
        match op {
            Op::Gelu {
                approximate: GeluApprox::Tanh,
            } => Some(Last::Gelu(UnaryFn::GeluTanh)),
            Op::Gelu { .. } => Some(Last::Gelu(UnaryFn::GeluErf)),
            Op::Unary { op: UnaryOp::Tanh } => Some(Last::Tanh),
            _ => None,
        }
    }
}

thread_local! {
    /// Scratch reused across dispatches on this thread: shifted A, the f32 chunk product
    /// and (long reductions) the i32 accumulator.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    prod: Vec<f32>,
    acc: Vec<i32>,
}

impl MatMulIntegerKernel {
    /// `b[k, n] - b_zp[n]` as f32, cached when B is a weight and its zero point fixed.
    /// `key`: the program weight B is, if one and its zero point is fixed.
    fn shifted_b(&self, b: &View<'_>, zp: &[i32], key: Option<usize>, n: usize) -> Arc<Vec<f32>> {
        self.shifted_b.get(key, || {
            ints(b.dtype, b.bytes)
                .enumerate()
                .map(|(i, v)| (v - zp[(i % n) % zp.len()]) as f32)
                .collect()
        })
    }
}

impl NativeKernel for MatMulIntegerKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let a = &ins[self.a];
        let b = self.b.view(ins);
        let b_dims = match (&self.b, &self.b_const_dims) {
            (Opnd::Input(i), _) => ins[*i].dims.as_slice(),
            (_, Some(d)) => d.as_slice(),
            _ => return Ok(false),
        };
        let (&[kb, n], Some((&k, lead))) = (b_dims, a.dims.split_last()) else {
            return Ok(false);
        };
        let m: usize = lead.iter().product();
        let mut want = lead.to_vec();
        want.push(n);
        let y_dtype = if self.tail.is_some() {
            DType::F32
        } else {
            DType::I32
        };
        if k != kb || outs[0].dtype != y_dtype || outs[0].dims != want {
            return Ok(false);
        }
        let tail = match &self.tail {
            None => None,
            Some(chain) => match resolve(chain, ins, &want, want.len() - 1, None, false)? {
                Some(r) if matches!(r.act, Activation::None | Activation::Relu) => Some(r),
                _ => return Ok(false),
            },
        };
        if a.bytes().len() != m * k || b.bytes.len() != k * n {
            return Err(format!(
                "matmul_integer: operands of {} and {} bytes, but {:?} x {:?} needs {} and {}",
                a.bytes().len(),
                b.bytes.len(),
                a.dims,
                b_dims,
                m * k,
                k * n
            ));
        }
        let ints_of = |o: &Option<Opnd>| -> Vec<i32> {
            match o {
                None => vec![0],
                Some(o) => {
                    let v = o.view(ins);
                    ints(v.dtype, v.bytes).collect()
                }
            }
        };
        let (a_zp, b_zp) = (ints_of(&self.a_zp), ints_of(&self.b_zp));
        if a_zp.len() != 1 || (b_zp.len() != 1 && b_zp.len() != n) {
            return Ok(false);
        }
        let zp_fixed = match &self.b_zp {
            None | Some(Opnd::Const { .. }) => true,
            Some(Opnd::Input(i)) => ins[*i].weight.is_some(),
        };
        let key = match &self.b {
            Opnd::Input(i) => ins[*i].weight.filter(|_| zp_fixed),
            Opnd::Const { .. } => None,
        };
        if m * n == 0 {
            return Ok(true);
        }
        let bf = self.shifted_b(&b, &b_zp, key, n);
        let y = outs[0].bytes_mut();
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            self.compute(a, a_zp[0], &bf, [m, k, n], tail.as_ref(), y, s)
        })?;
        match self.last {
            None => {}
            Some(Last::Gelu(f)) => {
                let y = outs[0].f32s()?;
                activation_in_place(f, y, &*self.par).map_err(|e| format!("gelu: {e}"))?;
            }
            Some(Last::Tanh) => outs[0].f32s()?.iter_mut().for_each(|v| *v = v.tanh()),
        }
        Ok(true)
    }
}

impl MatMulIntegerKernel {
    /// `y[m, n] = Σ_k (a[m, k] - a_zp) · bf[k, n]` exactly ([`exact_product`]),
    /// written as i32, or through the f32 `tail`.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        a: &In<'_>,
        a_zp: i32,
        bf: &[f32],
        [m, k, n]: [usize; 3],
        tail: Option<&Resolved<'_>>,
        y: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let err = |e: rafter_kernels_cpu::GemmError| format!("matmul_integer: {e}");
        let Scratch { a: af, prod, acc } = scratch;
        let af = grow(af, m * k);
        for (d, v) in af.iter_mut().zip(ints(a.dtype, a.bytes())) {
            *d = (v - a_zp) as f32;
        }
        let product = exact_product(af, k, bf, [m, k, n], prod, acc, &*self.par).map_err(err)?;
        let exact = |i: usize| product.get(i);
        match tail {
            None => {
                for (i, d) in y.chunks_exact_mut(4).enumerate() {
                    d.copy_from_slice(&exact(i).to_le_bytes());
                }
            }
            Some(r) => {
                for (i, d) in y.chunks_exact_mut(4).enumerate() {
                    d.copy_from_slice(&apply_tail(r, exact(i) as f32, i, n).to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

/// The resolved tail on element `i` (column `i % n`) of the product, valued `v`: in the
/// body's order, `act(alpha · v + bias + residual_before) + residual_after`, clamped.
#[inline]
fn apply_tail(r: &Resolved<'_>, v: f32, i: usize, n: usize) -> f32 {
    let mut x = r.alpha * v;
    if let Some(b) = r.bias {
        x += b[(i % n) % b.len()];
    }
    let res = r.residual.map_or(0.0, |res| res[i % res.len()]);
    if r.res_before && r.residual.is_some() {
        x += res;
    }
    if r.act == Activation::Relu {
        x = x.max(0.0);
    }
    if !r.res_before && r.residual.is_some() {
        x += res;
    }
    match r.clamp {
        Some((lo, hi)) => x.max(lo).min(hi),
        None => x,
    }
}
