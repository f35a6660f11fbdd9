//! ONNX `GatherND` of a tensor of any element type by i32 or i64 index tuples, with
//! `batch_dims` (the batch, the indexed axes and the indices' dims may be symbolic: dim
//! params pushed per call; the slice a tuple selects is static): output element `(p, t)` (`p` an index tuple's position among
//! the indices' leading dims, `t` a position in the slice it selects) reads the data at
//! `p`'s batch, the tuple's coordinates and `t`, as the reference does.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. The
//! elements are copied as bits through an unsigned register of their width (as
//! [`crate::bit_cast`]'s). A coordinate is wrapped as [`crate::gather`]'s (negative from
//! the end); one outside its axis (an error in the reference) reads coordinate 0, never
//! past the data.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, DimParams, Element, Size};
use crate::matmul::{build, Prelude, R};

/// A generated gather-nd kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct GatherNdKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
    /// The symbolic dims the kernel reads, in push order.
    pub dims: Vec<rafter_vulkan_section::DimParam>,
}

struct Layout {
    raw: Elem,
    ids_elem: Elem,
    data: usize,
    ids: usize,
    y: usize,
    /// Elements of the slice a tuple selects (static).
    inner: u32,
    /// Tuples per batch: the indices' dims between the batch and the tuple.
    per_batch: Vec<Size>,
    /// The data's dims past the batch (their product is a batch's elements).
    batch_dims: Vec<Size>,
    /// How many of `batch_dims` the tuple indexes.
    m: usize,
    params: usize,
}

/// Generates a body holding one `gather_nd` of body inputs, its result the body's one
/// output. The slice a tuple selects must be static; the batch dims, the axes the tuples
/// index and the indices' own dims may be symbolic (read as dim params per call).
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
    let b = usize::try_from(batch_dims).map_err(|_| "negative batch_dims".to_string())?;
    let (q, r) = (i_ty.rank(), d_ty.rank());
    let m = i_ty
        .dims
        .last()
        .and_then(|d| d.as_known())
        .ok_or_else(|| format!("gather_nd indices {i_ty}: the tuple length is not static"))?;
    let m = usize::try_from(m).map_err(|_| "negative tuple length".to_string())?;
    if q == 0 || b >= q || b.saturating_add(m) > r || d_ty.dims[..b] != i_ty.dims[..b] {
        return Err(format!(
            "indices {i_ty} with batch_dims {b} do not fit data {d_ty}"
        ));
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the gather_nd's result must be the body's one output".into());
    }
    let slice_ty = rafter_ir::TensorType {
        dtype: d_ty.dtype,
        dims: d_ty.dims[b + m..].to_vec(),
    };
    let inner = grid::static_dims(&slice_ty, "gather_nd slice")?;
    let mut dims = DimParams::default();
    let per_batch = (b..q - 1)
        .map(|a| dims.dim(i_ty, ids, a))
        .collect::<R<Vec<Size>>>()?;
    let batch_dims = (b..r)
        .map(|a| dims.dim(d_ty, data, a))
        .collect::<R<Vec<Size>>>()?;
    for ty in [d_ty, i_ty] {
        if let Some(k) = ty.known_dims() {
            let k: Vec<u64> = k.iter().map(|&d| d as u64).collect();
            grid::product_u32(&k, "gather_nd operand")?;
        }
    }
    let layout = Layout {
        raw: crate::bitcast::raw(d_ty.dtype),
        ids_elem,
        data,
        ids,
        y: body.inputs.len(),
        inner: grid::product_u32(&inner, "gather_nd slice")?,
        per_batch,
        batch_dims,
        m,
        params: dims.params.len(),
    };
    let spirv = grid::module_with_params(layout.y + 1, layout.params, |b, t, e| {
        element(b, t, &layout, e)
    })?;
    Ok(GatherNdKernel {
        spirv,
        dims: dims.params,
    })
}

/// The product of `sizes` as a `u64` value of the module.
fn product(b: &mut Builder, t: &Prelude, e: &Element, sizes: &[Size]) -> R<Word> {
    let mut p = b.constant_bit64(t.u64, 1);
    for &s in sizes {
        let v = grid::size_u64(b, t, e, s)?;
        p = build(b.i_mul(t.u64, None, p, v))?;
    }
    Ok(p)
}

/// Output element `i = (p, t)`: the batch's base, each tuple coordinate (wrapped) times
/// its stride, `t`; the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { u32, u64, .. } = *t;
    let (p, within) = grid::div_mod(b, u32, e.i, l.inner.max(1))?;
    let p = build(b.u_convert(u64, None, p))?;
    let per_batch = product(b, t, &e, &l.per_batch)?;
    let one = b.constant_bit64(u64, 1);
    let per_batch = build(b.ext_inst(
        u64,
        None,
        t.glsl,
        grid::GLSL_UMAX,
        [Arg::IdRef(per_batch), Arg::IdRef(one)],
    ))?;
    let batch = build(b.u_div(u64, None, p, per_batch))?;
    let bs = product(b, t, &e, &l.batch_dims)?;
    let mut flat = build(b.i_mul(u64, None, batch, bs))?;
    let within = build(b.u_convert(u64, None, within))?;
    flat = build(b.i_add(u64, None, flat, within))?;
    let m = b.constant_bit64(u64, l.m as u64);
    let tuple = build(b.i_mul(u64, None, p, m))?;
    for k in 0..l.m {
        let len = grid::size_u64(b, t, &e, l.batch_dims[k])?;
        let stride = product(b, t, &e, &l.batch_dims[k + 1..])?;
        let c = coordinate(b, t, l, e.addrs[l.ids], tuple, (k as u64, len))?;
        let term = build(b.i_mul(u64, None, c, stride))?;
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
    (k, n): (u64, Word),
) -> R<Word> {
    let Prelude { u64, bool, .. } = *t;
    let k = b.constant_bit64(u64, k);
    let at = build(b.i_add(u64, None, tuple, k))?;
    let at = grid::element_addr(b, u64, ids, at, l.ids_elem.bytes())?;
    let v = crate::gather::load_index_at(b, t, l.ids_elem, at)?;
    let zero = b.constant_bit64(u64, 0);
    let negative = build(b.s_less_than(bool, None, v, zero))?;
    let wrapped = build(b.i_add(u64, None, v, n))?;
    let v = build(b.select(u64, None, negative, wrapped, v))?;
    let valid = build(b.u_less_than(bool, None, v, n))?;
    build(b.select(u64, None, valid, v, zero))
}
