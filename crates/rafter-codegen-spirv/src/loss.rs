//! ONNX `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` (the IR's `nll_loss` and
//! `softmax_cross_entropy`) of a static f32 or f16 input `[N, C, d...]` by i32 or i64
//! targets `[N, d...]`, with an optional per-class weight `[C]`, `ignore_index` and every
//! reduction; a cross-entropy's optional second result (the log-probabilities) included.
//!
//! One invocation per element of the loss, in the grid-stride loop of [`crate::grid`]:
//! with reduction `none` invocation `i` computes position `i`'s loss; with `sum` or `mean`
//! the loss is a scalar and its one invocation walks every position in order, adding the
//! losses and the weights applied (a mean is their quotient, the reference's `sum(loss) /
//! sum(weight)`, which is the position count without weights or `ignore_index`). The
//! losses these ops score are small (a batch of labels), so one serial pass is cheap next
//! to a dispatch; it keeps the sum's order fixed, where a tree would need a second launch.
//!
//! Per position the semantics are the reference's (`rafter-reference`'s `loss` module):
//! a target equal to `ignore_index` contributes 0 and weight 0; a negative target counts
//! from the end (NumPy indexing) for the input, while the weight is read at the target
//! clipped into `0..C` (`np.take(weight, target, mode="clip")`); a target outside the
//! classes (an error in the reference) gives NaN, never a read past the data. A
//! cross-entropy's log-probability is `x - max - log(sum(exp(x - max)))` over the classes
//! of the position, computed once per position and also stored there when the body asks
//! for the log-probabilities.

use rafter_ir::{DType, Graph, LossReduction, Op};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// GLSL.std.450 `Log` and `FMax`.
const LOG: u32 = 28;
const FMAX: u32 = 40;

/// A generated loss kernel; launched like an elementwise kernel (one `u32` param, the
/// loss's element count: the position count for reduction `none`, else 1).
#[derive(Debug, Clone)]
pub struct LossKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the loss,
    /// then the log-probabilities where the body has them.
    pub spirv: Vec<u32>,
}

struct Layout {
    elem: Elem,
    ids_elem: Elem,
    /// Binding indices of the input, the targets and the optional weight.
    x: usize,
    target: usize,
    weight: Option<usize>,
    /// Binding indices of the loss and of the optional log-probabilities.
    loss: usize,
    log_prob: Option<usize>,
    classes: u32,
    /// Elements per class of one sample (the product of `d...`).
    inner: u32,
    /// Positions: `N * inner`, the targets' element count.
    positions: u32,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    softmax: bool,
}

/// Generates a body holding one `nll_loss` or `softmax_cross_entropy` of static body
/// inputs, its results the body's outputs in order.
pub fn loss(body: &Graph) -> Result<LossKernel, String> {
    let node = grid::one_node(body, "loss")?;
    let (reduction, ignore_index, softmax) = match node.op {
        Op::NllLoss {
            reduction,
            ignore_index,
        } => (reduction, ignore_index, false),
        Op::SoftmaxCrossEntropy {
            reduction,
            ignore_index,
        } => (reduction, ignore_index, true),
        _ => return Err(format!("op `{}` is not a loss", node.op.name())),
    };
    let name = node.op.name();
    let input = |i: usize| grid::body_input(body, node, i, &format!("{name} operand {i}"));
    let (x, target) = (input(0)?, input(1)?);
    let weight = node.input(2).map(|_| input(2)).transpose()?;
    let x_ty = &body.value(body.inputs[x]).ty;
    let elem = Elem::of(x_ty.dtype).map_err(|e| format!("{name} input is {e}"))?;
    let ids_elem = match body.value(body.inputs[target]).ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => {
            return Err(format!(
                "{name} targets are {other}; i32 and i64 are generated"
            ))
        }
    };
    let dims = grid::static_dims(x_ty, &format!("{name} input"))?;
    if dims.len() < 2 || dims.contains(&0) {
        return Err(format!(
            "{name} input {dims:?} is not a non-empty [N, C, d...]"
        ));
    }
    grid::product_u32(&dims, &format!("{name} input"))?;
    if let Some(w) = weight {
        let w_ty = &body.value(body.inputs[w]).ty;
        if w_ty.dtype != x_ty.dtype || grid::static_dims(w_ty, "weight")? != [dims[1]] {
            return Err(format!("{name} weight is not {}[{}]", x_ty.dtype, dims[1]));
        }
    }
    let bindings = body.inputs.len();
    let log_prob = outputs(body, node, name)?.then_some(bindings + 1);
    let inner = grid::product_u32(&dims[2..], &format!("{name} input"))?;
    let layout = Layout {
        elem,
        ids_elem,
        x,
        target,
        weight,
        loss: bindings,
        log_prob,
        classes: dims[1] as u32,
        inner,
        positions: dims[0] as u32 * inner,
        reduction,
        ignore_index,
        softmax,
    };
    let spirv = grid::module(bindings + 1 + usize::from(log_prob.is_some()), |b, t, e| {
        element(b, t, &layout, e)
    })?;
    Ok(LossKernel { spirv })
}

/// Checks that the body's outputs are the node's results in order (the loss, then a
/// cross-entropy's log-probabilities if it has them); returns whether it has them.
fn outputs(body: &Graph, node: &rafter_ir::Node, name: &str) -> R<bool> {
    let results: Vec<_> = node.outputs.iter().copied().flatten().collect();
    if node.outputs.first().copied().flatten().is_none() || results != body.outputs {
        return Err(format!("the {name}'s results must be the body's outputs"));
    }
    Ok(results.len() == 2)
}

/// Loss element `i`: the sum of the losses and of the weights over its positions (`i`
/// alone, or all of them), stored as the loss, the sum, or their quotient.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u32, u64, .. } = *t;
    let range = match l.reduction {
        LossReduction::None => {
            let one = b.constant_bit32(u32, 1);
            (e.i, build(b.i_add(u32, None, e.i, one))?)
        }
        _ => (b.constant_bit32(u32, 0), b.constant_bit32(u32, l.positions)),
    };
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let sums = grid::range_loop(
        b,
        t,
        range,
        &[(f32, zero), (f32, zero)],
        &mut |b, p, acc| {
            let (loss, w) = position(b, t, l, e.addrs, p)?;
            Ok(vec![
                build(b.f_add(f32, None, acc[0], loss))?,
                build(b.f_add(f32, None, acc[1], w))?,
            ])
        },
    )?;
    let v = match l.reduction {
        LossReduction::Mean => build(b.f_div(f32, None, sums[0], sums[1]))?,
        _ => sums[0],
    };
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.loss], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// Position `p`'s loss and the weight applied to it (see the module docs).
fn position(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word], p: Word) -> R<(Word, Word)> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let p64 = build(b.u_convert(u64, None, p))?;
    let at = grid::element_addr(b, u64, addrs[l.target], p64, l.ids_elem.bytes())?;
    let target = crate::gather::load_index_at(b, t, l.ids_elem, at)?;
    // The position's class 0 in x: (n * C) * inner + k, class j `j * inner` further.
    let (n, k) = grid::div_mod(b, u32, p, l.inner)?;
    let n = build(b.u_convert(u64, None, n))?;
    let span = b.constant_bit64(u64, u64::from(l.classes) * u64::from(l.inner));
    let base = build(b.i_mul(u64, None, n, span))?;
    let k = build(b.u_convert(u64, None, k))?;
    let base = build(b.i_add(u64, None, base, k))?;
    let c = b.constant_bit64(u64, u64::from(l.classes));
    let zero64 = b.constant_bit64(u64, 0);
    let negative = build(b.s_less_than(bool, None, target, zero64))?;
    let wrapped = build(b.i_add(u64, None, target, c))?;
    let class = build(b.select(u64, None, negative, wrapped, target))?;
    let valid = build(b.u_less_than(bool, None, class, c))?;
    let class = build(b.select(u64, None, valid, class, zero64))?;
    let lp = if l.softmax {
        log_softmax(b, t, l, addrs, base, class)?
    } else {
        let at = class_addr(b, t, l, addrs[l.x], base, class)?;
        elem::load(b, l.elem, f32, at)?
    };
    let w = weight(b, t, l, addrs, target)?;
    let loss = build(b.f_negate(f32, None, lp))?;
    let loss = build(b.f_mul(f32, None, loss, w))?;
    let loss = if l.elem == Elem::F16 {
        elem::round_to_half(b, f32, loss)?
    } else {
        loss
    };
    let nan = b.constant_bit32(f32, 0x7FC0_0000);
    let loss = build(b.select(f32, None, valid, loss, nan))?;
    let Some(ignore) = l.ignore_index else {
        return Ok((loss, w));
    };
    let ignore = b.constant_bit64(u64, ignore as u64);
    let ignored = build(b.i_equal(bool, None, target, ignore))?;
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    Ok((
        build(b.select(f32, None, ignored, zero, loss))?,
        build(b.select(f32, None, ignored, zero, w))?,
    ))
}

/// The address of class `class` (a `u64`) of the position whose class 0 is element `base`
/// of the tensor at `addr` (x's layout).
fn class_addr(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    addr: Word,
    base: Word,
    class: Word,
) -> R<Word> {
    let inner = b.constant_bit64(t.u64, u64::from(l.inner));
    let off = build(b.i_mul(t.u64, None, class, inner))?;
    let flat = build(b.i_add(t.u64, None, base, off))?;
    grid::element_addr(b, t.u64, addr, flat, l.elem.bytes())
}

/// The weight of `target` (clipped into the classes), 1 without weights.
fn weight(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word], target: Word) -> R<Word> {
    let Prelude { f32, u64, bool, .. } = *t;
    let Some(w) = l.weight else {
        return Ok(b.constant_bit32(f32, 1f32.to_bits()));
    };
    let zero = b.constant_bit64(u64, 0);
    let last = b.constant_bit64(u64, u64::from(l.classes) - 1);
    let below = build(b.s_less_than(bool, None, target, zero))?;
    let clipped = build(b.select(u64, None, below, zero, target))?;
    let above = build(b.s_greater_than(bool, None, clipped, last))?;
    let clipped = build(b.select(u64, None, above, last, clipped))?;
    let at = grid::element_addr(b, u64, addrs[w], clipped, l.elem.bytes())?;
    elem::load(b, l.elem, f32, at)
}

/// The log-probability of `class` at the position whose class 0 is element `base`: the
/// max over the classes, the sum of `exp(x - max)`, `x[class] - max - log(sum)`; every
/// class's is stored where the body has the log-probabilities.
fn log_softmax(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    addrs: &[Word],
    base: Word,
    class: Word,
) -> R<Word> {
    let Prelude { f32, u32, u64, .. } = *t;
    let ext = |b: &mut Builder, inst: u32, args: &[Word]| {
        build(b.ext_inst(f32, None, t.glsl, inst, args.iter().map(|&a| Arg::IdRef(a))))
    };
    let load = |b: &mut Builder, j: Word| -> R<(Word, Word)> {
        let j = build(b.u_convert(u64, None, j))?;
        let at = class_addr(b, t, l, addrs[l.x], base, j)?;
        Ok((j, elem::load(b, l.elem, f32, at)?))
    };
    let range = (b.constant_bit32(u32, 0), b.constant_bit32(u32, l.classes));
    let minus_inf = b.constant_bit32(f32, f32::NEG_INFINITY.to_bits());
    let max = grid::range_loop(b, t, range, &[(f32, minus_inf)], &mut |b, j, acc| {
        let (_, x) = load(b, j)?;
        Ok(vec![ext(b, FMAX, &[acc[0], x])?])
    })?[0];
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let sum = grid::range_loop(b, t, range, &[(f32, zero)], &mut |b, j, acc| {
        let (_, x) = load(b, j)?;
        let d = build(b.f_sub(f32, None, x, max))?;
        let ex = math(b, t).exp(d)?;
        Ok(vec![build(b.f_add(f32, None, acc[0], ex))?])
    })?[0];
    let log_sum = ext(b, LOG, &[sum])?;
    let lp_of = |b: &mut Builder, x: Word| -> R<Word> {
        let d = build(b.f_sub(f32, None, x, max))?;
        build(b.f_sub(f32, None, d, log_sum))
    };
    if let Some(out) = l.log_prob {
        grid::range_loop(b, t, range, &[], &mut |b, j, _| {
            let (j, x) = load(b, j)?;
            let y = lp_of(b, x)?;
            let at = class_addr(b, t, l, addrs[out], base, j)?;
            elem::store(b, l.elem, f32, at, y)?;
            Ok(Vec::new())
        })?;
    }
    let at = class_addr(b, t, l, addrs[l.x], base, class)?;
    let x = elem::load(b, l.elem, f32, at)?;
    let y = lp_of(b, x)?;
    if l.elem == Elem::F16 {
        // The reference rounds the log-probabilities to f16 before taking the loss.
        return elem::round_to_half(b, f32, y);
    }
    Ok(y)
}

/// The shared transcendental helpers over `b` (one `exp` formula for every kernel).
fn math<'a>(b: &'a mut Builder, t: &Prelude) -> Math<'a> {
    Math {
        b,
        f32: t.f32,
        bool: t.bool,
        glsl: t.glsl,
    }
}
