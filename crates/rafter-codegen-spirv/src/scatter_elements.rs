//! ONNX `ScatterElements` (and the deprecated `Scatter` imported as it) of a static f32 or
//! f16 tensor by static i32 or i64 indices along any axis, every reduction (`none`,
//! `add`, `mul`, `max`, `min`).
//!
//! One invocation per *output* element, in the grid-stride loop of [`crate::grid`], so
//! no two invocations write one element and no atomics are needed: update `u` (at
//! coordinates `c` of the indices' shape) lands on the data at `c` with `c[axis]`
//! replaced by `indices[u]`, so the only updates that can reach output element `o` are
//! those at `o`'s coordinates off the axis, one per position `k` along the indices' axis.
//! The invocation starts from the data's value and walks `k` in order, combining each
//! update whose index names `o`'s axis position: the reference's order (flat order of the
//! updates), so `none` keeps the last duplicate as it does. An element outside the
//! indices' extent off the axis keeps the data's value. An index is wrapped as
//! [`crate::gather`]'s (negative from the end); one outside the axis matches no element.
//!
//! Max and min are the reference's: the value so far is kept when it is NaN or the update
//! is not NaN and not beyond it, else the update wins.

use rafter_ir::{DType, Graph, Op, ScatterReduction};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated scatter-elements kernel; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct ScatterElementsKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    elem: Elem,
    ids_elem: Elem,
    data: usize,
    ids: usize,
    updates: usize,
    axis: usize,
    reduction: ScatterReduction,
    /// The data's (and output's) dims and the indices' (the updates') dims.
    dims: Vec<u32>,
    ids_dims: Vec<u32>,
    bindings: usize,
}

/// Generates a body holding one `scatter_elements` of static body inputs, its result the
/// body's one output.
pub fn scatter_elements(body: &Graph) -> Result<ScatterElementsKernel, String> {
    let node = grid::one_node(body, "scatter_elements")?;
    let Op::ScatterElements { axis, reduction } = node.op else {
        return Err(format!("op `{}` is not a scatter_elements", node.op.name()));
    };
    let input =
        |i: usize| grid::body_input(body, node, i, &format!("scatter_elements operand {i}"));
    let (data, ids, updates) = (input(0)?, input(1)?, input(2)?);
    let ty = |b: usize| &body.value(body.inputs[b]).ty;
    let ids_elem = match ty(ids).dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => {
            return Err(format!(
                "scatter_elements indices are {other}; i32 and i64 are generated"
            ))
        }
    };
    let elem = Elem::of(ty(data).dtype).map_err(|e| format!("scatter_elements data is {e}"))?;
    let dims = grid::static_dims(ty(data), "scatter_elements data")?;
    let ids_dims = grid::static_dims(ty(ids), "scatter_elements indices")?;
    if ty(updates).dtype != ty(data).dtype || grid::static_dims(ty(updates), "updates")? != ids_dims
    {
        return Err(
            "scatter_elements updates differ from the indices' shape or the data's type".into(),
        );
    }
    if ids_dims.len() != dims.len() {
        return Err("scatter_elements indices and data differ in rank".into());
    }
    grid::product_u32(&dims, "scatter_elements data")?;
    grid::product_u32(&ids_dims, "scatter_elements indices")?;
    let a = grid::norm_axis(axis, dims.len(), "scatter_elements")?;
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the scatter_elements' result must be the body's one output".into());
    }
    let layout = Layout {
        elem,
        ids_elem,
        data,
        ids,
        updates,
        axis: a,
        reduction,
        dims: dims.iter().map(|&d| d as u32).collect(),
        ids_dims: ids_dims.iter().map(|&d| d as u32).collect(),
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(ScatterElementsKernel { spirv })
}

/// Output element `i`: its coordinates; whether they lie inside the indices off the axis
/// and the flat index of the update at axis position 0 there; the walk along the axis.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let mut rest = e.i;
    let mut inside = b.constant_true(bool);
    let mut first = b.constant_bit32(u32, 0);
    let mut pos = first;
    let mut stride = 1u32;
    for d in (0..l.dims.len()).rev() {
        let (q, c) = grid::div_mod(b, u32, rest, l.dims[d].max(1))?;
        rest = q;
        if d == l.axis {
            pos = c;
        } else {
            let n = b.constant_bit32(u32, l.ids_dims[d]);
            let fits = build(b.u_less_than(bool, None, c, n))?;
            inside = build(b.logical_and(bool, None, inside, fits))?;
            let s = b.constant_bit32(u32, stride);
            let term = build(b.i_mul(u32, None, c, s))?;
            first = build(b.i_add(u32, None, first, term))?;
        }
        stride *= l.ids_dims[d];
    }
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let src = grid::element_addr(b, u64, e.addrs[l.data], i64, l.elem.bytes())?;
    let v = elem::load(b, l.elem, f32, src)?;
    let zero = b.constant_bit32(u32, 0);
    let len = b.constant_bit32(u32, l.ids_dims[l.axis]);
    let steps = build(b.select(u32, None, inside, len, zero))?;
    let axis_stride: u32 = l.ids_dims[l.axis + 1..].iter().product();
    let v = grid::range_loop(b, t, (zero, steps), &[(f32, v)], &mut |b, k, acc| {
        let s = b.constant_bit32(u32, axis_stride);
        let off = build(b.i_mul(u32, None, k, s))?;
        let u = build(b.i_add(u32, None, first, off))?;
        let u = build(b.u_convert(u64, None, u))?;
        let at = grid::element_addr(b, u64, e.addrs[l.ids], u, l.ids_elem.bytes())?;
        let index = crate::gather::load_index_at(b, t, l.ids_elem, at)?;
        let here = names(b, t, l, index, pos)?;
        let at = grid::element_addr(b, u64, e.addrs[l.updates], u, l.elem.bytes())?;
        let update = elem::load(b, l.elem, f32, at)?;
        let combined = combine(b, t, l.reduction, acc[0], update)?;
        // The reference combines in the data's type: an f16 total is rounded each step.
        let combined = match l.elem {
            Elem::F16 => elem::round_to_half(b, f32, combined)?,
            _ => combined,
        };
        Ok(vec![build(b.select(f32, None, here, combined, acc[0]))?])
    })?[0];
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// Whether `index` (a `u64` two's-complement value), wrapped from the end where negative,
/// is axis position `pos` (a `u32`).
fn names(b: &mut Builder, t: &Prelude, l: &Layout, index: Word, pos: Word) -> R<Word> {
    let Prelude { u64, bool, .. } = *t;
    let zero = b.constant_bit64(u64, 0);
    let n = b.constant_bit64(u64, u64::from(l.dims[l.axis]));
    let negative = build(b.s_less_than(bool, None, index, zero))?;
    let wrapped = build(b.i_add(u64, None, index, n))?;
    let index = build(b.select(u64, None, negative, wrapped, index))?;
    let pos = build(b.u_convert(u64, None, pos))?;
    build(b.i_equal(bool, None, index, pos))
}

/// The value so far `old` combined with `new` by the reduction (see the module docs).
fn combine(b: &mut Builder, t: &Prelude, r: ScatterReduction, old: Word, new: Word) -> R<Word> {
    let Prelude { f32, bool, .. } = *t;
    let keep_if = |b: &mut Builder, beyond: Word| -> R<Word> {
        let old_nan = build(b.is_nan(bool, None, old))?;
        let new_nan = build(b.is_nan(bool, None, new))?;
        let new_num = build(b.logical_not(bool, None, new_nan))?;
        let keep = build(b.logical_and(bool, None, new_num, beyond))?;
        let keep = build(b.logical_or(bool, None, old_nan, keep))?;
        build(b.select(f32, None, keep, old, new))
    };
    match r {
        ScatterReduction::None => Ok(new),
        ScatterReduction::Add => build(b.f_add(f32, None, old, new)),
        ScatterReduction::Mul => build(b.f_mul(f32, None, old, new)),
        ScatterReduction::Max => {
            let ge = build(b.f_ord_greater_than_equal(bool, None, old, new))?;
            keep_if(b, ge)
        }
        ScatterReduction::Min => {
            let le = build(b.f_ord_less_than_equal(bool, None, old, new))?;
            keep_if(b, le)
        }
    }
}
