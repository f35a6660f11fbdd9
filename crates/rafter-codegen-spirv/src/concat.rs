//! ONNX `Concat` of any number of tensors of any element type (copied as bits) along any
//! axis, the dims inside the axis static; the axis (a KV cache's `past + 1` rows: each
//! operand's length and the total are dim params, pushed per call) and the dims outside
//! it (a batch) may be symbolic.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]: output
//! element `i` is `(o, a, c)` of `outer × N × inner` (`N` the summed axis length), and reads
//! element `(o, a - off_k, c)` of the input `k` whose range `off_k..off_k + n_k` holds `a`.
//! Every input's address is computed and a chain of selects picks one (the inputs are
//! few), so there is one load and no branching per element.

use rafter_ir::{Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, DimParams, Element, Size};
use crate::matmul::{build, Prelude, R};

/// A generated concat kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct ConcatKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
    /// The symbolic axis lengths the kernel reads, in push order (empty for a static axis).
    pub dims: Vec<rafter_vulkan_section::DimParam>,
}

struct Layout {
    /// The elements, copied as bits through an unsigned register of their width.
    raw: Elem,
    /// Per input that may be non-empty: its binding and its length along the axis.
    parts: Vec<(usize, Size)>,
    /// The output's axis length.
    total: Size,
    inner: u32,
    bindings: usize,
    params: usize,
}

/// Generates a body holding one `concat{axis}` of body inputs of any element type, its
/// result the body's one output. The dims inside the axis must be static; the axis itself
/// and the dims outside it may be symbolic (a KV cache's `past + 1` rows, a batch).
pub fn concat(body: &Graph) -> Result<ConcatKernel, String> {
    let node = grid::one_node(body, "concat")?;
    let Op::Concat { axis } = node.op else {
        return Err(format!("op `{}` is not a concat", node.op.name()));
    };
    let Some(&out) = body.outputs.first().filter(|_| body.outputs.len() == 1) else {
        return Err("a concat kernel has one output".into());
    };
    if node.outputs.first().copied().flatten() != Some(out) {
        return Err("the concat's result must be the body's one output".into());
    }
    let out_ty = &body.value(out).ty;
    let rank = out_ty.rank();
    let a = grid::norm_axis(axis, rank, "concat")?;
    let out_dims = grid::static_dims_from(out_ty, a + 1, "concat result")?;
    let inner = grid::product_u32(&out_dims, "concat inner dims")?;
    let mut dims = DimParams::default();
    let mut parts = Vec::new();
    let mut offset = Some(0u64);
    for k in 0..node.inputs.len() {
        let binding = grid::body_input(body, node, k, &format!("concat operand {k}"))?;
        let ty = &body.value(body.inputs[binding]).ty;
        if ty.dtype != out_ty.dtype || ty.rank() != rank {
            return Err(format!("concat operand {k} is {ty}, the result {out_ty}"));
        }
        if grid::static_dims_from(ty, a + 1, "concat operand")? != out_dims {
            return Err(format!(
                "concat operand {k}'s inner dims differ from the result's"
            ));
        }
        let n = dims.dim(ty, binding, a)?;
        offset = match n {
            Size::Known(n) => offset.map(|o| o + n),
            Size::Param(_) => None,
        };
        if n != Size::Known(0) {
            parts.push((binding, n));
        }
    }
    let total = dims.dim(out_ty, body.inputs.len(), a)?;
    if let (Some(sum), Size::Known(t)) = (offset, total) {
        if sum != t || sum > u64::from(u32::MAX) {
            return Err(format!(
                "concat operands sum to {sum} along the axis, the result has {t}"
            ));
        }
    }
    if parts.is_empty() {
        return Err("concat of empty operands only".into());
    }
    let layout = Layout {
        raw: crate::bitcast::raw(out_ty.dtype),
        parts,
        total,
        inner,
        bindings: body.inputs.len() + 1,
        params: dims.params.len(),
    };
    if let Some(known) = out_ty.known_dims() {
        let known: Vec<u64> = known.iter().map(|&d| d as u64).collect();
        grid::product_u32(&known, "concat result")?;
    }
    let spirv = grid::module_with_params(layout.bindings, layout.params, |b, t, e| {
        element(b, t, &layout, e)
    })?;
    Ok(ConcatKernel {
        spirv,
        dims: dims.params,
    })
}

/// Output element `i = (o, a, c)`: each input's candidate address, the select chain by
/// `a`'s range, the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let u64 = t.u64;
    let mut off = b.constant_bit64(u64, 0);
    let mut parts = Vec::with_capacity(l.parts.len());
    for &(binding, n) in &l.parts {
        let n = grid::size_u64(b, t, &e, n)?;
        parts.push((binding, off, n));
        off = build(b.i_add(u64, None, off, n))?;
    }
    let bytes = l.raw.bytes();
    let src = grid::part_addr_sized(b, t, &e, &parts, (l.total, l.inner), bytes)?;
    let src = src.ok_or("concat without a non-empty operand")?;
    let i64t = b.type_int(64, 1);
    let v = elem::load_int(b, l.raw, i64t, src)?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i, bytes)?;
    elem::store_int(b, l.raw, i64t, dst, v)
}
