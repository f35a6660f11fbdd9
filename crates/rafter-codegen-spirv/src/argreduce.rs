//! ONNX `ArgMax`/`ArgMin` of an f32 or f16 tensor with static dims, along any axis, with or
//! without `keepdims` (the output's linear order is the same either way) and
//! `select_last_index`; the result is i64.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]: with
//! data dims `outer × n × inner` around the axis, output element `i = (o, c)` scans lane
//! `(o, 0..n, c)` in order, keeping the best value and its position. The comparison is the
//! reference's (NumPy's): the first extreme wins, or the last with `select_last_index`,
//! and a NaN beats every number (the first NaN, or the last), so a scan from the front
//! takes a new element when
//! - first: the best so far is not NaN and the element is NaN or strictly better;
//! - last: the element is NaN, or the best so far is not NaN and the element is at least
//!   as good.

use rafter_ir::{ArgKind, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::{LoopControl, Word};

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated arg-reduce kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct ArgReduceKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    len: u32,
    inner: u32,
    elem: Elem,
    max: bool,
    last: bool,
    data: usize,
    bindings: usize,
}

/// Generates a body holding one `arg_reduce` of a static f32/f16 body input, its i64
/// result the body's one output.
pub fn arg_reduce(body: &Graph) -> Result<ArgReduceKernel, String> {
    let node = grid::one_node(body, "arg_reduce")?;
    let Op::ArgReduce {
        kind,
        axis,
        select_last_index,
        ..
    } = node.op
    else {
        return Err(format!("op `{}` is not an arg_reduce", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "arg_reduce data")?;
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of(ty.dtype).map_err(|e| format!("arg_reduce data is {e}"))?;
    let dims = grid::static_dims(ty, "arg_reduce data")?;
    let a = grid::norm_axis(axis, dims.len(), "arg_reduce")?;
    grid::product_u32(&dims, "arg_reduce data")?;
    let Some(&out) = body.outputs.first().filter(|_| body.outputs.len() == 1) else {
        return Err("an arg-reduce kernel has one output".into());
    };
    if node.outputs.first().copied().flatten() != Some(out) {
        return Err("the arg_reduce's result must be the body's one output".into());
    }
    if body.value(out).ty.dtype != rafter_ir::DType::I64 {
        return Err("an arg_reduce result other than i64".into());
    }
    let len = dims[a] as u32;
    if len == 0 {
        return Err("arg_reduce over an empty axis".into());
    }
    let layout = Layout {
        len,
        inner: grid::product_u32(&dims[a + 1..], "arg_reduce inner dims")?,
        elem,
        max: kind == ArgKind::Max,
        last: select_last_index,
        data,
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(ArgReduceKernel { spirv })
}

/// Output element `i = (o, c)`: the lane's first element, the scan over the rest, the
/// position stored as an i64.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u32, u64, .. } = *t;
    let (o, c) = grid::div_mod(b, u32, e.i, l.inner)?;
    // The lane's first element: (o * n) * inner + c; element k is inner further each.
    let o64 = build(b.u_convert(u64, None, o))?;
    let span = b.constant_bit64(u64, u64::from(l.len) * u64::from(l.inner));
    let base = build(b.i_mul(u64, None, o64, span))?;
    let c64 = build(b.u_convert(u64, None, c))?;
    let base = build(b.i_add(u64, None, base, c64))?;
    let addr = grid::element_addr(b, u64, e.addrs[l.data], base, l.elem.bytes())?;
    let first = elem::load(b, l.elem, f32, addr)?;
    let zero = b.constant_bit32(u32, 0);
    let best = if l.len == 1 {
        zero
    } else {
        scan(b, t, l, addr, first)?
    };
    let best = build(b.u_convert(u64, None, best))?;
    let i64t = b.type_int(64, 1);
    let best = build(b.bitcast(i64t, None, best))?;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, 8)?;
    elem::store_int(b, Elem::I64, i64t, dst, best)
}

/// `for k in 1..n`: element `k` of the lane at `addr` against the best so far (`first`
/// at position 0); returns the best position (a `u32`).
fn scan(b: &mut Builder, t: &Prelude, l: &Layout, addr: Word, first: Word) -> R<Word> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let (zero, one) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, 1));
    let n = b.constant_bit32(u32, l.len);
    let pre = b.id();
    build(b.branch(pre))?;
    build(b.begin_block(Some(pre)))?;
    let (header, cond, body, cont, merge) = (b.id(), b.id(), b.id(), b.id(), b.id());
    let (k_next, v_next, p_next) = (b.id(), b.id(), b.id());
    build(b.branch(header))?;
    build(b.begin_block(Some(header)))?;
    let k = build(b.phi(u32, None, [(one, pre), (k_next, cont)]))?;
    let best = build(b.phi(f32, None, [(first, pre), (v_next, cont)]))?;
    let pos = build(b.phi(u32, None, [(zero, pre), (p_next, cont)]))?;
    build(b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(b.branch(cond))?;
    build(b.begin_block(Some(cond)))?;
    let more = build(b.u_less_than(bool, None, k, n))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    let k64 = build(b.u_convert(u64, None, k))?;
    let inner = b.constant_bit64(u64, u64::from(l.inner));
    let step = build(b.i_mul(u64, None, k64, inner))?;
    let at = grid::element_addr(b, u64, addr, step, l.elem.bytes())?;
    let v = elem::load(b, l.elem, f32, at)?;
    let take = takes(b, bool, l, v, best)?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    build(b.select(f32, Some(v_next), take, v, best))?;
    build(b.select(u32, Some(p_next), take, k, pos))?;
    build(b.i_add(u32, Some(k_next), k, one))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    Ok(pos)
}

/// Whether element `v` replaces the best so far (see the module docs for the rule).
fn takes(b: &mut Builder, bool: Word, l: &Layout, v: Word, best: Word) -> R<Word> {
    let v_nan = build(b.is_nan(bool, None, v))?;
    let best_nan = build(b.is_nan(bool, None, best))?;
    let best_num = build(b.logical_not(bool, None, best_nan))?;
    // Ordered comparisons: false with a NaN, which the explicit terms handle.
    let better = match (l.max, l.last) {
        (true, false) => build(b.f_ord_greater_than(bool, None, v, best))?,
        (true, true) => build(b.f_ord_greater_than_equal(bool, None, v, best))?,
        (false, false) => build(b.f_ord_less_than(bool, None, v, best))?,
        (false, true) => build(b.f_ord_less_than_equal(bool, None, v, best))?,
    };
    if l.last {
        let num_better = build(b.logical_and(bool, None, best_num, better))?;
        build(b.logical_or(bool, None, v_nan, num_better))
    } else {
        let either = build(b.logical_or(bool, None, v_nan, better))?;
        build(b.logical_and(bool, None, best_num, either))
    }
}
