//! ONNX `CumSum` and `CumProd` (the IR's `cumulative`) of a static tensor along an axis
//! that is a constant or read from its binding at run time (ONNX makes it an input), with
//! `exclusive` and `reverse`: f32 and f16 data accumulated in f32, 8- to 64-bit integers
//! in 64-bit registers, wrapping, stored as their low bits (bit-exact with the reference's
//! wrapping sums and products).
//!
//! One invocation per lane (the elements along the axis at fixed other coordinates), in
//! the grid-stride loop of [`crate::grid`] over the output's elements: with the axis
//! known only at run time, its length `len` and the element stride `inner` are picked
//! from the static dims by the axis, and invocation `i` below `count / len` walks lane
//! `i` in order (from its end with `reverse`), storing each running total (the one before
//! the element with `exclusive`); the others run the walk zero times. An axis outside the
//! rank (an error in the reference) is taken as axis 0, so nothing is read past the data.

use rafter_ir::{DType, Graph, Op, ValueDef};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated cumulative kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct CumulativeKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// Where the axis comes from.
enum Axis {
    Const(i64),
    /// A body input of this element type (i32 or i64).
    Binding(usize, Elem),
}

struct Layout {
    elem: Elem,
    data: usize,
    axis: Axis,
    dims: Vec<u32>,
    prod: bool,
    exclusive: bool,
    reverse: bool,
    bindings: usize,
}

/// Generates a body holding one `cumulative` of a static body input, its result the
/// body's one output.
pub fn cumulative(body: &Graph) -> Result<CumulativeKernel, String> {
    let node = grid::one_node(body, "cumulative")?;
    let Op::Cumulative {
        kind,
        exclusive,
        reverse,
    } = node.op
    else {
        return Err(format!("op `{}` is not a cumulative", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "cumulative data")?;
    let axis = match node.input(1).map(|v| (v, &body.value(v).def)) {
        Some((_, ValueDef::Input(b))) => match body.value(body.inputs[*b]).ty.dtype {
            DType::I64 => Axis::Binding(*b, Elem::I64),
            DType::I32 => Axis::Binding(*b, Elem::I32),
            other => {
                return Err(format!(
                    "cumulative axis is {other}; i32 and i64 are generated"
                ))
            }
        },
        Some((_, ValueDef::Const(c))) => match body.constant(*c).to_i64s().as_deref() {
            Some([a]) => Axis::Const(*a),
            _ => return Err("cumulative axis is not one integer".into()),
        },
        _ => return Err("cumulative axis is computed in the kernel".into()),
    };
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of_any(ty.dtype).map_err(|e| format!("cumulative data is {e}"))?;
    if elem == Elem::Bool {
        return Err("cumulative of bool".into());
    }
    let dims = grid::static_dims(ty, "cumulative data")?;
    grid::product_u32(&dims, "cumulative data")?;
    if dims.is_empty() {
        return Err("cumulative of a scalar".into());
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the cumulative's result must be the body's one output".into());
    }
    let layout = Layout {
        elem,
        data,
        axis,
        dims: dims.iter().map(|&d| d as u32).collect(),
        prod: kind == rafter_ir::CumKind::Prod,
        exclusive,
        reverse,
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(CumulativeKernel { spirv })
}

/// The axis in `0..rank` as a `u32` (a negative one from the end, one outside the rank 0).
fn axis(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word]) -> R<Word> {
    let Prelude { u32, u64, bool, .. } = *t;
    let rank = l.dims.len() as i64;
    let a = match l.axis {
        Axis::Const(a) => {
            let a = if a < 0 { a + rank } else { a };
            return Ok(b.constant_bit32(u32, if (0..rank).contains(&a) { a as u32 } else { 0 }));
        }
        Axis::Binding(binding, ids) => crate::gather::load_index_at(b, t, ids, addrs[binding])?,
    };
    let (zero, r) = (b.constant_bit64(u64, 0), b.constant_bit64(u64, rank as u64));
    let negative = build(b.s_less_than(bool, None, a, zero))?;
    let wrapped = build(b.i_add(u64, None, a, r))?;
    let a = build(b.select(u64, None, negative, wrapped, a))?;
    let inside = build(b.u_less_than(bool, None, a, r))?;
    let a = build(b.select(u64, None, inside, a, zero))?;
    build(b.u_convert(u32, None, a))
}

/// The axis's length and the stride of its elements (the product of the dims inside
/// it), both at least 1, chosen among the static dims by the axis (`u32`s).
fn len_and_inner(b: &mut Builder, t: &Prelude, l: &Layout, axis: Word) -> R<(Word, Word)> {
    let Prelude { u32, bool, .. } = *t;
    let one = b.constant_bit32(u32, 1);
    let (mut len, mut inner) = (one, one);
    for (r, &d) in l.dims.iter().enumerate() {
        let here_r = b.constant_bit32(u32, r as u32);
        let here = build(b.i_equal(bool, None, axis, here_r))?;
        let d = b.constant_bit32(u32, d.max(1));
        let stride: u32 = l.dims[r + 1..].iter().product();
        let s = b.constant_bit32(u32, stride.max(1));
        len = build(b.select(u32, None, here, d, len))?;
        inner = build(b.select(u32, None, here, s, inner))?;
    }
    Ok((len, inner))
}

/// Invocation `i`: lane `i = (o, c)` if there is one, walked in order (see the module
/// docs).
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { u32, u64, bool, .. } = *t;
    let axis = axis(b, t, l, e.addrs)?;
    let (len, inner) = len_and_inner(b, t, l, axis)?;
    let lanes = build(b.u_div(u32, None, e.count, len))?;
    let has_lane = build(b.u_less_than(bool, None, e.i, lanes))?;
    let zero = b.constant_bit32(u32, 0);
    let steps = build(b.select(u32, None, has_lane, len, zero))?;
    let o = build(b.u_div(u32, None, e.i, inner))?;
    let c = build(b.u_mod(u32, None, e.i, inner))?;
    // The lane's first element: o * len * inner + c; element k is `k * inner` further.
    let o = build(b.u_convert(u64, None, o))?;
    let len64 = build(b.u_convert(u64, None, len))?;
    let inner64 = build(b.u_convert(u64, None, inner))?;
    let span = build(b.i_mul(u64, None, len64, inner64))?;
    let start = build(b.i_mul(u64, None, o, span))?;
    let c = build(b.u_convert(u64, None, c))?;
    let start = build(b.i_add(u64, None, start, c))?;
    let float = matches!(l.elem, Elem::F32 | Elem::F16);
    let i64t = b.type_int(64, 1);
    let (ty, init) = match (float, l.prod) {
        (true, p) => (
            t.f32,
            b.constant_bit32(t.f32, (if p { 1f32 } else { 0f32 }).to_bits()),
        ),
        (false, p) => (i64t, b.constant_bit64(i64t, u64::from(p))),
    };
    let (src, dst) = (e.addrs[l.data], e.addrs[l.bindings - 1]);
    grid::range_loop(b, t, (zero, steps), &[(ty, init)], &mut |b, j, acc| {
        let k = if l.reverse {
            let one = b.constant_bit32(u32, 1);
            let last = build(b.i_sub(u32, None, len, one))?;
            build(b.i_sub(u32, None, last, j))?
        } else {
            j
        };
        let k = build(b.u_convert(u64, None, k))?;
        let off = build(b.i_mul(u64, None, k, inner64))?;
        let at = build(b.i_add(u64, None, start, off))?;
        let (from, to) = (
            grid::element_addr(b, u64, src, at, l.elem.bytes())?,
            grid::element_addr(b, u64, dst, at, l.elem.bytes())?,
        );
        let next = step(b, l, (ty, float), acc[0], from)?;
        let out = if l.exclusive { acc[0] } else { next };
        if float {
            elem::store(b, l.elem, t.f32, to, out)?;
        } else {
            elem::store_int(b, l.elem, i64t, to, out)?;
        }
        Ok(vec![next])
    })?;
    Ok(())
}

/// The running total after the element at `from`: `acc + x` or `acc * x`, in f32 or in
/// a wrapping i64 register.
fn step(b: &mut Builder, l: &Layout, (ty, float): (Word, bool), acc: Word, from: Word) -> R<Word> {
    if float {
        let x = elem::load(b, l.elem, ty, from)?;
        return if l.prod {
            build(b.f_mul(ty, None, acc, x))
        } else {
            build(b.f_add(ty, None, acc, x))
        };
    }
    let x = elem::load_int(b, l.elem, ty, from)?;
    if l.prod {
        build(b.i_mul(ty, None, acc, x))
    } else {
        build(b.i_add(ty, None, acc, x))
    }
}
