//! ONNX `GatherElements` of a static f32 or f16 tensor by static i32 or i64 indices along
//! any axis: output element `i` (at coordinates `c` of the indices' shape) reads data at
//! `c` with `c[axis]` replaced by `indices[i]`.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. An index
//! is wrapped and checked as [`crate::gather`]'s: negative counts from the end, and one
//! outside the axis reads position 0 and writes NaN (never an address past the data).

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated gather-elements kernel; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct GatherElementsKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    elem: Elem,
    ids_elem: Elem,
    data: usize,
    ids: usize,
    axis: usize,
    /// The output's (the indices') dims and the data's row-major strides.
    out_dims: Vec<u32>,
    strides: Vec<u64>,
    axis_len: u64,
    bindings: usize,
}

/// Generates a body holding one `gather_elements{axis}` of static body inputs, its result
/// the body's one output.
pub fn gather_elements(body: &Graph) -> Result<GatherElementsKernel, String> {
    let node = grid::one_node(body, "gather_elements")?;
    let Op::GatherElements { axis } = node.op else {
        return Err(format!("op `{}` is not a gather_elements", node.op.name()));
    };
    let input = |i: usize| grid::body_input(body, node, i, &format!("gather_elements operand {i}"));
    let (data, ids) = (input(0)?, input(1)?);
    let data_ty = &body.value(body.inputs[data]).ty;
    let ids_ty = &body.value(body.inputs[ids]).ty;
    let ids_elem = match ids_ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => {
            return Err(format!(
                "gather_elements indices are {other}; i32 and i64 are generated"
            ))
        }
    };
    let elem = Elem::of(data_ty.dtype).map_err(|e| format!("gather_elements data is {e}"))?;
    let dims = grid::static_dims(data_ty, "gather_elements data")?;
    let out = grid::static_dims(ids_ty, "gather_elements indices")?;
    grid::product_u32(&dims, "gather_elements data")?;
    grid::product_u32(&out, "gather_elements indices")?;
    if out.len() != dims.len() {
        return Err("gather_elements indices and data differ in rank".into());
    }
    let a = grid::norm_axis(axis, dims.len(), "gather_elements")?;
    if dims[a] == 0 {
        return Err("gather_elements along an empty axis".into());
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the gather_elements' result must be the body's one output".into());
    }
    let mut strides = vec![1u64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let layout = Layout {
        elem,
        ids_elem,
        data,
        ids,
        axis: a,
        out_dims: out.iter().map(|&d| d as u32).collect(),
        strides,
        axis_len: dims[a],
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(GatherElementsKernel { spirv })
}

/// Output element `i`: its index, wrapped and checked; its coordinates, innermost first,
/// each times the data's stride (the index in place of the axis's); the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let at = grid::element_addr(b, u64, e.addrs[l.ids], i64, l.ids_elem.bytes())?;
    let index = crate::gather::load_index_at(b, t, l.ids_elem, at)?;
    let zero64 = b.constant_bit64(u64, 0);
    let n = b.constant_bit64(u64, l.axis_len);
    let negative = build(b.s_less_than(bool, None, index, zero64))?;
    let wrapped = build(b.i_add(u64, None, index, n))?;
    let index = build(b.select(u64, None, negative, wrapped, index))?;
    let valid = build(b.u_less_than(bool, None, index, n))?;
    let index = build(b.select(u64, None, valid, index, zero64))?;
    let stride = b.constant_bit64(u64, l.strides[l.axis]);
    let mut flat = build(b.i_mul(u64, None, index, stride))?;
    let mut rest = e.i;
    for d in (0..l.out_dims.len()).rev() {
        let (q, c) = grid::div_mod(b, u32, rest, l.out_dims[d].max(1))?;
        rest = q;
        if d == l.axis {
            continue;
        }
        let c = build(b.u_convert(u64, None, c))?;
        let s = b.constant_bit64(u64, l.strides[d]);
        let term = build(b.i_mul(u64, None, c, s))?;
        flat = build(b.i_add(u64, None, flat, term))?;
    }
    let src = grid::element_addr(b, u64, e.addrs[l.data], flat, l.elem.bytes())?;
    let v = elem::load(b, l.elem, f32, src)?;
    let nan = b.constant_bit32(f32, 0x7FC0_0000);
    let v = build(b.select(f32, None, valid, v, nan))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}
