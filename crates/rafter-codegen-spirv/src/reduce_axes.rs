//! ONNX `Reduce*` (every kind) of a static f32/f16 tensor whose `axes` are a tensor read
//! at run time: the opset-13 `ReduceSum` and every opset-18 reduction take `axes` as an
//! operand, and an exporter that does not fold it leaves a graph input (the compiler sizes
//! the result per call from its values, `rafter_opt::symbol_defs`). A body whose axes are
//! a folded constant goes to the elementwise generator's reduce instead.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. Each
//! reads the axes (a handful of integers) into a bit mask, negative ones from the end, so
//! the decomposition below is the same code whichever axes a call names:
//! - output element `i` is decomposed over the kept dims (innermost first) into the
//!   offset of its lane's first element; the output's linear order is the same with or
//!   without `keepdims` (a kept 1 adds nothing), so the output's dims are never needed;
//! - lane element `k` (of `len`, the product of the reduced dims) is decomposed over the
//!   reduced dims the same way, and the lane is folded in order in f32, as the reference
//!   does in f64: empty lanes give each reduction's identity (Sum 0, Prod 1, Max -inf,
//!   Min inf, Mean NaN, LogSum and LogSumExp -inf), Max and Min return NaN when the lane
//!   holds one, LogSumExp is shifted by the lane's largest finite element.
//!
//! A pointwise prologue (abs, neg, exp, log, sqrt, add, sub, mul, div of values of the
//! data's shape) fusion left in front of the reduce is evaluated at each lane element:
//! ONNX's function expansions of ReduceL1 and ReduceSumSquare (`abs` or `x * x`, then
//! `ReduceSum`) come that way.
//!
//! Empty axes reduce every axis, or with `noop_with_empty_axes` copy the input (a mask of
//! no axes, lanes of one element, summed). The axes' count is static (the operand's type),
//! their values are not.

use rafter_ir::{BinaryOp, DType, Graph, Op, ReduceKind, UnaryOp, ValueDef, ValueId};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{LoopControl, Word};

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

const GLSL_FABS: u32 = 4;
const GLSL_LOG: u32 = 28;
const GLSL_SQRT: u32 = 31;

/// A generated reduce-by-run-time-axes kernel; launched like an elementwise kernel (one
/// `u32` param, the output's element count).
#[derive(Debug, Clone)]
pub struct ReduceAxesKernel {
    /// The SPIR-V module (entry point `main`); bindings: the data, the axes, the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    kind: ReduceKind,
    /// The data's dims and row-major strides (every offset fits a `u32`).
    dims: Vec<u32>,
    strides: Vec<u32>,
    elem: Elem,
    out: Elem,
    /// The axes' element type and count; a count of 0 is a fixed mask ([`Layout::empty`]).
    axes: (Elem, u32),
    /// The mask of empty axes: every axis, or none for `noop_with_empty_axes`.
    empty: u32,
    /// The binding indices of the data and the axes (the output is binding 2).
    bindings: (usize, usize),
    /// The data's value, the reduce's operand (the data or a prologue result) and the
    /// prologue computing it.
    data: ValueId,
    operand: ValueId,
    steps: Vec<Step>,
}

/// Whether `body` ends in a `reduce` whose axes operand is a body input (read at run
/// time): the bodies [`reduce_axes`] generates rather than the elementwise reduce.
pub(crate) fn reads_axes(body: &Graph) -> bool {
    body.nodes.last().is_some_and(|n| {
        matches!(n.op, Op::Reduce { .. })
            && n.input(1)
                .is_some_and(|a| matches!(body.value(a).def, ValueDef::Input(_)))
    })
}

/// One node of the pointwise prologue fusion leaves in front of the reduce (ReduceL1 and
/// ReduceSumSquare exported as `abs` or `mul` then `ReduceSum`), evaluated per lane
/// element: its op, operands and result, and whether the result is f16 (rounded to it,
/// as if stored: see the crate docs).
struct Step {
    op: Op,
    args: Vec<ValueId>,
    out: ValueId,
    half: bool,
}

/// The prologue of `body` (every node before its last): ops [`step`] computes, on the
/// data input `data` or earlier results, each result of the data's dims.
fn prologue(body: &Graph, data: ValueId) -> R<Vec<Step>> {
    let want = &body.value(data).ty.dims;
    let mut known = vec![data];
    let mut steps = Vec::new();
    for n in &body.nodes[..body.nodes.len() - 1] {
        let supported = matches!(
            n.op,
            Op::Unary {
                op: UnaryOp::Abs | UnaryOp::Neg | UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sqrt
            } | Op::Binary {
                op: BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
            }
        );
        let args: Vec<ValueId> = n
            .inputs
            .iter()
            .copied()
            .collect::<Option<_>>()
            .unwrap_or_default();
        let out = match n.outputs.as_slice() {
            [Some(v)] => *v,
            _ => {
                return Err(format!(
                    "node `{}` before a reduce has not one result",
                    n.name
                ))
            }
        };
        let ty = &body.value(out).ty;
        if !supported
            || args.is_empty()
            || !args.iter().all(|a| known.contains(a))
            || &ty.dims != want
        {
            return Err(format!(
                "op `{}` (node `{}`) before a reduce by run-time axes is not generated for \
                 Vulkan yet",
                n.op.name(),
                n.name
            ));
        }
        let half = Elem::of(ty.dtype)
            .map_err(|e| format!("value %{} is {e}", body.value(out).name))?
            == Elem::F16;
        known.push(out);
        steps.push(Step {
            op: n.op.clone(),
            args,
            out,
            half,
        });
    }
    Ok(steps)
}

/// The result of prologue step `s` on its operands' values `x`.
fn step(b: &mut Builder, t: &Prelude, s: &Step, x: &[Word]) -> R<Word> {
    let Prelude {
        f32, glsl, bool, ..
    } = *t;
    let ext = |b: &mut Builder, op: u32| build(b.ext_inst(f32, None, glsl, op, [Arg::IdRef(x[0])]));
    let v = match (&s.op, x) {
        (Op::Unary { op: UnaryOp::Abs }, _) => ext(b, GLSL_FABS)?,
        (Op::Unary { op: UnaryOp::Sqrt }, _) => ext(b, GLSL_SQRT)?,
        (Op::Unary { op: UnaryOp::Log }, _) => ext(b, GLSL_LOG)?,
        (Op::Unary { op: UnaryOp::Neg }, _) => build(b.f_negate(f32, None, x[0]))?,
        (Op::Unary { op: UnaryOp::Exp }, _) => crate::epilogue_math::Math {
            b: &mut *b,
            f32,
            bool,
            glsl,
        }
        .exp(x[0])?,
        (Op::Binary { op: BinaryOp::Add }, [l, r]) => build(b.f_add(f32, None, *l, *r))?,
        (Op::Binary { op: BinaryOp::Sub }, [l, r]) => build(b.f_sub(f32, None, *l, *r))?,
        (Op::Binary { op: BinaryOp::Mul }, [l, r]) => build(b.f_mul(f32, None, *l, *r))?,
        (Op::Binary { op: BinaryOp::Div }, [l, r]) => build(b.f_div(f32, None, *l, *r))?,
        (op, _) => return Err(format!("op `{}` in a reduce prologue", op.name())),
    };
    if s.half {
        elem::round_to_half(b, f32, v)
    } else {
        Ok(v)
    }
}

/// Generates a body ending in a `reduce` of a static f32/f16 body input (after an
/// optional pointwise prologue, [`prologue`]) by axes that are the other body input (i64
/// or i32, rank 1), its result the body's one output.
pub fn reduce_axes(body: &Graph) -> Result<ReduceAxesKernel, String> {
    let node = body.nodes.last().ok_or("the body has no nodes")?;
    let Op::Reduce {
        kind,
        noop_with_empty_axes,
        ..
    } = node.op
    else {
        return Err(format!("op `{}` is not a reduce", node.op.name()));
    };
    let axes = grid::body_input(body, node, 1, "reduce axes")?;
    if body.inputs.len() != 2 {
        return Err("a reduce kernel binds the data and the axes".into());
    }
    let data = 1 - axes;
    let steps = prologue(body, body.inputs[data])?;
    let operand = node.input(0).ok_or("reduce without an operand")?;
    if operand != body.inputs[data] && !steps.iter().any(|s| s.out == operand) {
        return Err("the reduce's operand is neither the data nor the prologue's".into());
    }
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of(ty.dtype).map_err(|e| format!("reduce data is {e}"))?;
    let dims = grid::static_dims(ty, "reduce data")?;
    grid::product_u32(&dims, "reduce data")?;
    if dims.len() > 31 {
        return Err(format!("reduce of rank {} (at most 31)", dims.len()));
    }
    let axes_ty = &body.value(body.inputs[axes]).ty;
    let axes_elem = match axes_ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => return Err(format!("reduce axes are {other}")),
    };
    let count = match axes_ty.known_dims().as_deref() {
        Some(&[n]) => u32::try_from(n).map_err(|_| "too many reduce axes")?,
        _ => return Err(format!("reduce axes of {axes_ty} (rank 1, static)")),
    };
    let Some(&out) = body.outputs.first().filter(|_| body.outputs.len() == 1) else {
        return Err("a reduce kernel has one output".into());
    };
    if node.outputs.first().copied().flatten() != Some(out) {
        return Err("the reduce's result must be the body's one output".into());
    }
    let out_elem = Elem::of(body.value(out).ty.dtype).map_err(|e| format!("reduce to {e}"))?;
    let all = (1u32 << dims.len()) - 1;
    let noop = count == 0 && noop_with_empty_axes;
    let layout = Layout {
        // A copy: lanes of one element, summed.
        kind: if noop { ReduceKind::Sum } else { kind },
        strides: strides(&dims),
        dims: dims.iter().map(|&d| d as u32).collect(),
        elem,
        out: out_elem,
        axes: (axes_elem, count),
        empty: if noop { 0 } else { all },
        bindings: (data, axes),
        data: body.inputs[data],
        operand,
        steps,
    };
    let spirv = grid::module(3, |b, t, e| element(b, t, &layout, e))?;
    Ok(ReduceAxesKernel { spirv })
}

/// Row-major strides of `dims` (whose product fits a `u32`).
fn strides(dims: &[u64]) -> Vec<u32> {
    let mut s = vec![1u32; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1] as u32;
    }
    s
}

/// Output element `i`: the mask, the lane's first element and length, the fold, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u64, .. } = *t;
    let reduced = reduced_axes(b, t, l, &e)?;
    let (base, len) = walk(b, t, l, &reduced, e.i, false)?;
    let v = fold(b, t, l, &reduced, (base, len), e.addrs[l.bindings.0])?;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[2], i64, l.out.bytes())?;
    elem::store(b, l.out, f32, dst, v)
}

/// Per data axis, whether the call's axes name it (a `bool`).
fn reduced_axes(b: &mut Builder, t: &Prelude, l: &Layout, e: &Element) -> R<Vec<Word>> {
    let Prelude { u32, u64, bool, .. } = *t;
    let (axes_elem, count) = l.axes;
    let mut mask = b.constant_bit32(u32, if count == 0 { l.empty } else { 0 });
    if count > 0 {
        // In the axes' own width, never widened: an i32 axis of -1 widened to i64 by
        // `elem::load_int` (`OpSConvert`) came out unwrapped on lavapipe (this crate's
        // reduce_axes test; the cause is not pinned down).
        let wide = axes_elem == Elem::I64;
        let it = b.type_int(if wide { 64 } else { 32 }, 1);
        let int = |b: &mut Builder, v: u64| {
            if wide {
                b.constant_bit64(it, v)
            } else {
                b.constant_bit32(it, v as u32)
            }
        };
        let (rank, zero) = (int(b, l.dims.len() as u64), int(b, 0));
        let one = b.constant_bit32(u32, 1);
        for k in 0..count {
            let at = b.constant_bit64(u64, u64::from(k));
            let addr = grid::element_addr(b, u64, e.addrs[l.bindings.1], at, axes_elem.bytes())?;
            let a = elem::load_stored(b, axes_elem, it, addr)?;
            // A negative axis counts from the end.
            let neg = build(b.s_less_than(bool, None, a, zero))?;
            let wrapped = build(b.i_add(it, None, a, rank))?;
            let a = build(b.select(it, None, neg, wrapped, a))?;
            let a = if wide {
                build(b.u_convert(u32, None, a))?
            } else {
                build(b.bitcast(u32, None, a))?
            };
            let bit = build(b.shift_left_logical(u32, None, one, a))?;
            mask = build(b.bitwise_or(u32, None, mask, bit))?;
        }
    }
    let zero = b.constant_bit32(u32, 0);
    (0..l.dims.len())
        .map(|d| {
            let bit = b.constant_bit32(u32, 1 << d);
            let set = build(b.bitwise_and(u32, None, mask, bit))?;
            build(b.i_not_equal(bool, None, set, zero))
        })
        .collect()
}

/// Decomposes `index` over the kept axes (`lane = false`: an output index) or the reduced
/// ones (`lane = true`: a position in the lane), innermost first; returns the data offset
/// it names and the product of the reduced axes' dims (the lane length).
fn walk(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    reduced: &[Word],
    index: Word,
    lane: bool,
) -> R<(Word, Word)> {
    let u32 = t.u32;
    let (zero, one) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, 1));
    let (mut rem, mut offset, mut len) = (index, zero, one);
    for d in (0..l.dims.len()).rev() {
        // A 0 dim divides as 1: no index ever decomposes over it.
        let size = b.constant_bit32(u32, l.dims[d].max(1));
        let (q, r) = (
            build(b.u_div(u32, None, rem, size))?,
            build(b.u_mod(u32, None, rem, size))?,
        );
        // `here`: this axis is one `index` runs over.
        let here = if lane {
            reduced[d]
        } else {
            build(b.logical_not(t.bool, None, reduced[d]))?
        };
        let coord = build(b.select(u32, None, here, r, zero))?;
        rem = build(b.select(u32, None, here, q, rem))?;
        let stride = b.constant_bit32(u32, l.strides[d]);
        let step = build(b.i_mul(u32, None, coord, stride))?;
        offset = build(b.i_add(u32, None, offset, step))?;
        let dim = b.constant_bit32(u32, l.dims[d]);
        let factor = build(b.select(u32, None, reduced[d], dim, one))?;
        len = build(b.i_mul(u32, None, len, factor))?;
    }
    Ok((offset, len))
}

/// The reduction of the lane at `base` of `len` elements (the passes, then the final
/// transform: Mean's division, L2's root, the logs).
fn fold(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    reduced: &[Word],
    (base, len): (Word, Word),
    data: Word,
) -> R<Word> {
    use ReduceKind::*;
    let Prelude {
        f32, glsl, bool, ..
    } = *t;
    let ext =
        |b: &mut Builder, op: u32, x: Word| build(b.ext_inst(f32, None, glsl, op, [Arg::IdRef(x)]));
    let lane = Lane {
        reduced,
        base,
        len,
        data,
    };
    let init = match l.kind {
        Prod => 1.0,
        Max | LogSumExp => f32::NEG_INFINITY,
        Min => f32::INFINITY,
        _ => 0.0,
    };
    let init = b.constant_bit32(f32, init.to_bits());
    match l.kind {
        Sum | Mean | LogSum => {
            let acc = pass(b, t, l, &lane, init, |b, acc, x| {
                build(b.f_add(f32, None, acc, x))
            })?;
            match l.kind {
                Mean => {
                    let n = build(b.convert_u_to_f(f32, None, len))?;
                    build(b.f_div(f32, None, acc, n))
                }
                LogSum => ext(b, GLSL_LOG, acc),
                _ => Ok(acc),
            }
        }
        L1 => pass(b, t, l, &lane, init, |b, acc, x| {
            let a = ext(b, GLSL_FABS, x)?;
            build(b.f_add(f32, None, acc, a))
        }),
        L2 | SumSquare => {
            let acc = pass(b, t, l, &lane, init, |b, acc, x| {
                let sq = build(b.f_mul(f32, None, x, x))?;
                build(b.f_add(f32, None, acc, sq))
            })?;
            if l.kind == L2 {
                ext(b, GLSL_SQRT, acc)
            } else {
                Ok(acc)
            }
        }
        Prod => pass(b, t, l, &lane, init, |b, acc, x| {
            build(b.f_mul(f32, None, acc, x))
        }),
        Max | Min => {
            let max = l.kind == Max;
            pass(b, t, l, &lane, init, |b, acc, x| {
                // NaN wins and stays; otherwise the strictly better element.
                let better = if max {
                    build(b.f_ord_greater_than(bool, None, x, acc))?
                } else {
                    build(b.f_ord_less_than(bool, None, x, acc))?
                };
                let x_nan = build(b.is_nan(bool, None, x))?;
                let acc_nan = build(b.is_nan(bool, None, acc))?;
                let take = build(b.logical_or(bool, None, x_nan, better))?;
                let v = build(b.select(f32, None, take, x, acc))?;
                build(b.select(f32, None, acc_nan, acc, v))
            })
        }
        LogSumExp => log_sum_exp(b, t, l, &lane, init),
    }
}

/// `m + log(sum(exp(x - m)))` with `m` the lane's largest finite element (0 when none is
/// finite), the reference's shift.
fn log_sum_exp(b: &mut Builder, t: &Prelude, l: &Layout, lane: &Lane, init: Word) -> R<Word> {
    let Prelude {
        f32, bool, glsl, ..
    } = *t;
    let m = pass(b, t, l, lane, init, |b, acc, x| {
        let inf = build(b.is_inf(bool, None, x))?;
        let nan = build(b.is_nan(bool, None, x))?;
        let odd = build(b.logical_or(bool, None, inf, nan))?;
        let better = build(b.f_ord_greater_than(bool, None, x, acc))?;
        let not_odd = build(b.logical_not(bool, None, odd))?;
        let take = build(b.logical_and(bool, None, not_odd, better))?;
        build(b.select(f32, None, take, x, acc))
    })?;
    let zero = b.constant_bit32(f32, 0);
    let finite = build(b.is_inf(bool, None, m))?;
    let m = build(b.select(f32, None, finite, zero, m))?;
    let sum = pass(b, t, l, lane, zero, |b, acc, x| {
        let d = build(b.f_sub(f32, None, x, m))?;
        let e = crate::epilogue_math::Math {
            b: &mut *b,
            f32,
            bool,
            glsl,
        }
        .exp(d)?;
        build(b.f_add(f32, None, acc, e))
    })?;
    let log = build(b.ext_inst(f32, None, glsl, GLSL_LOG, [Arg::IdRef(sum)]))?;
    build(b.f_add(f32, None, m, log))
}

/// The lane one output element folds: the per-axis masks, its first element's offset, its
/// length and the data's address.
struct Lane<'a> {
    reduced: &'a [Word],
    base: Word,
    len: Word,
    data: Word,
}

/// `for k in 0..len: acc = step(acc, x_k)` from `init`, in lane order; returns `acc`.
/// Leaves the builder in a new block after the loop.
fn pass(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    lane: &Lane,
    init: Word,
    fold_step: impl FnOnce(&mut Builder, Word, Word) -> R<Word>,
) -> R<Word> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let (zero, one) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, 1));
    let pre = b.id();
    build(b.branch(pre))?;
    build(b.begin_block(Some(pre)))?;
    let (header, cond, body, cont, merge) = (b.id(), b.id(), b.id(), b.id(), b.id());
    let (k_next, acc_next) = (b.id(), b.id());
    build(b.branch(header))?;
    build(b.begin_block(Some(header)))?;
    let k = build(b.phi(u32, None, [(zero, pre), (k_next, cont)]))?;
    let acc = build(b.phi(f32, None, [(init, pre), (acc_next, cont)]))?;
    build(b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(b.branch(cond))?;
    build(b.begin_block(Some(cond)))?;
    let more = build(b.u_less_than(bool, None, k, lane.len))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    let (offset, _) = walk(b, t, l, lane.reduced, k, true)?;
    let at = build(b.i_add(u32, None, lane.base, offset))?;
    let at = build(b.u_convert(u64, None, at))?;
    let addr = grid::element_addr(b, u64, lane.data, at, l.elem.bytes())?;
    let x = elem::load(b, l.elem, f32, addr)?;
    let mut values = vec![(l.data, x)];
    for s in &l.steps {
        let args: Vec<Word> = s
            .args
            .iter()
            .map(|a| values.iter().find(|(v, _)| v == a).map(|&(_, w)| w))
            .collect::<Option<_>>()
            .ok_or("a prologue operand is never computed")?;
        let v = step(b, t, s, &args)?;
        values.push((s.out, v));
    }
    let x = values
        .iter()
        .find(|(v, _)| *v == l.operand)
        .map(|&(_, w)| w)
        .ok_or("the reduce operand is never computed")?;
    let next = fold_step(b, acc, x)?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    build(b.copy_object(f32, Some(acc_next), next))?;
    build(b.i_add(u32, Some(k_next), k, one))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    Ok(acc)
}
