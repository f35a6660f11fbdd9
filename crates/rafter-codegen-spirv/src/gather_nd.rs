//! ONNX `GatherND` of a static tensor of any element type by static i32 or i64 index
//! tuples, with `batch_dims`: output element `(p, t)` (`p` an index tuple's position among
//! the indices' leading dims, `t` a position in the slice it selects) reads the data at
//! `p`'s batch, the tuple's coordinates and `t`, as the reference does.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. The
//! elements are copied as bits through an unsigned register of their width (as
//! [`crate::bit_cast`]'s). A coordinate is wrapped as [`crate::gather`]'s (negative from
//! the end); one outside its axis (an error in the reference) reads coordinate 0, never
//! past the data.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated gather-nd kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct GatherNdKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    raw: Elem,
    ids_elem: Elem,
    data: usize,
    ids: usize,
    y: usize,
    /// Elements of the slice a tuple selects, tuples per batch, elements per batch.
    inner: u32,
    per_batch: u32,
    batch_stride: u64,
    /// The tuple's axes: their lengths and the data's strides along them.
    axes: Vec<(u64, u64)>,
}

/// Generates a body holding one `gather_nd` of static body inputs, its result the body's
/// one output.
pub fn gather_nd(body: &Graph) -> Result<GatherNdKernel, String> {
    let node = grid::one_node(body, "gather_nd")?;
    let Op::GatherNd { batch_dims } = node.op else {
        return Err(format!("op `{}` is not a gather_nd", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "gather_nd data")?;
    let ids = grid::body_input(body, node, 1, "gather_nd indices")?;
    let (d_ty, i_ty) = (
        &body.value(body.inputs[data]).ty,
        &body.value(body.inputs[ids]).ty,
    );
    let ids_elem = match i_ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => {
            return Err(format!(
                "gather_nd indices are {other}; i32 and i64 are generated"
            ))
        }
    };
    let dd = grid::static_dims(d_ty, "gather_nd data")?;
    let id = grid::static_dims(i_ty, "gather_nd indices")?;
    grid::product_u32(&dd, "gather_nd data")?;
    grid::product_u32(&id, "gather_nd indices")?;
    let b = usize::try_from(batch_dims).map_err(|_| "negative batch_dims".to_string())?;
    let (q, r) = (id.len(), dd.len());
    let m = id.last().map_or(usize::MAX, |&m| m as usize);
    if q == 0 || b >= q || b.saturating_add(m) > r || dd[..b] != id[..b] {
        return Err(format!(
            "indices {id:?} with batch_dims {b} do not fit data {dd:?}"
        ));
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the gather_nd's result must be the body's one output".into());
    }
    let stride = |a: usize| dd[a + 1..].iter().product::<u64>();
    let layout = Layout {
        raw: crate::bitcast::raw(d_ty.dtype),
        ids_elem,
        data,
        ids,
        y: body.inputs.len(),
        inner: dd[b + m..].iter().product::<u64>() as u32,
        per_batch: id[b..q - 1].iter().product::<u64>() as u32,
        batch_stride: dd[b..].iter().product(),
        axes: (b..b + m).map(|a| (dd[a], stride(a))).collect(),
    };
    let spirv = grid::module(layout.y + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(GatherNdKernel { spirv })
}

/// Output element `i = (p, t)`: the batch's base, each tuple coordinate (wrapped) times
/// its stride, `t`; the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { u32, u64, .. } = *t;
    let (p, within) = grid::div_mod(b, u32, e.i, l.inner.max(1))?;
    let (batch, _) = grid::div_mod(b, u32, p, l.per_batch.max(1))?;
    let batch = build(b.u_convert(u64, None, batch))?;
    let bs = b.constant_bit64(u64, l.batch_stride);
    let mut flat = build(b.i_mul(u64, None, batch, bs))?;
    let within = build(b.u_convert(u64, None, within))?;
    flat = build(b.i_add(u64, None, flat, within))?;
    let p = build(b.u_convert(u64, None, p))?;
    let m = b.constant_bit64(u64, l.axes.len() as u64);
    let tuple = build(b.i_mul(u64, None, p, m))?;
    for (k, &(len, stride)) in l.axes.iter().enumerate() {
        let c = coordinate(b, t, l, e.addrs[l.ids], tuple, (k as u64, len))?;
        let s = b.constant_bit64(u64, stride);
        let term = build(b.i_mul(u64, None, c, s))?;
        flat = build(b.i_add(u64, None, flat, term))?;
    }
    let i64t = b.type_int(64, 1);
    let from = grid::element_addr(b, u64, e.addrs[l.data], flat, l.raw.bytes())?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let to = grid::element_addr(b, u64, e.addrs[l.y], i, l.raw.bytes())?;
    let v = elem::load_int(b, l.raw, i64t, from)?;
    elem::store_int(b, l.raw, i64t, to, v)
}

/// Coordinate `k` of the tuple starting at index element `tuple` (a `u64`), wrapped from
/// the end where negative, 0 where outside its axis of length `len`.
fn coordinate(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    ids: Word,
    tuple: Word,
    (k, len): (u64, u64),
) -> R<Word> {
    let Prelude { u64, bool, .. } = *t;
    let k = b.constant_bit64(u64, k);
    let at = build(b.i_add(u64, None, tuple, k))?;
    let at = grid::element_addr(b, u64, ids, at, l.ids_elem.bytes())?;
    let v = crate::gather::load_index_at(b, t, l.ids_elem, at)?;
    let (zero, n) = (b.constant_bit64(u64, 0), b.constant_bit64(u64, len));
    let negative = build(b.s_less_than(bool, None, v, zero))?;
    let wrapped = build(b.i_add(u64, None, v, n))?;
    let v = build(b.select(u64, None, negative, wrapped, v))?;
    let valid = build(b.u_less_than(bool, None, v, n))?;
    build(b.select(u64, None, valid, v, zero))
}
