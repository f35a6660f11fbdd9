//! ONNX `Concat` of any number of f32 or f16 tensors along any axis, the dims from the
//! axis inward static (the outer ones may be symbolic: a batch).
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]: output
//! element `i` is `(o, a, c)` of `outer × N × inner` (`N` the summed axis length), and reads
//! element `(o, a - off_k, c)` of the input `k` whose range `off_k..off_k + n_k` holds `a`.
//! Every input's address is computed and a chain of selects picks one (the inputs are
//! few), so there is one load and no branching per element.

use rafter_ir::{Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated concat kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct ConcatKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    elem: Elem,
    /// Per non-empty input: its binding, its offset along the axis and its length there.
    parts: Vec<(usize, u32, u32)>,
    /// The output's axis length.
    total: u32,
    inner: u32,
    bindings: usize,
}

/// Generates a body holding one `concat{axis}` of f32/f16 body inputs, its result the
/// body's one output.
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
    let elem = Elem::of(out_ty.dtype).map_err(|e| format!("concat result is {e}"))?;
    let rank = out_ty.rank();
    let a = grid::norm_axis(axis, rank, "concat")?;
    let out_dims = grid::static_dims_from(out_ty, a, "concat result")?;
    let inner = grid::product_u32(&out_dims[1..], "concat inner dims")?;
    let mut parts = Vec::new();
    let mut offset = 0u64;
    for k in 0..node.inputs.len() {
        let binding = grid::body_input(body, node, k, &format!("concat operand {k}"))?;
        let ty = &body.value(body.inputs[binding]).ty;
        if ty.dtype != out_ty.dtype || ty.rank() != rank {
            return Err(format!("concat operand {k} is {ty}, the result {out_ty}"));
        }
        let dims = grid::static_dims_from(ty, a, "concat operand")?;
        if dims[1..] != out_dims[1..] {
            return Err(format!(
                "concat operand {k}'s inner dims differ from the result's"
            ));
        }
        if dims[0] > 0 {
            parts.push((binding, offset as u32, dims[0] as u32));
        }
        offset += dims[0];
    }
    if offset != out_dims[0] || offset > u64::from(u32::MAX) {
        return Err(format!(
            "concat operands sum to {offset} along the axis, the result has {}",
            out_dims[0]
        ));
    }
    if parts.is_empty() {
        return Err("concat of empty operands only".into());
    }
    let layout = Layout {
        elem,
        parts,
        total: offset as u32,
        inner,
        bindings: body.inputs.len() + 1,
    };
    grid::product_u32(&out_dims, "concat result")?;
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(ConcatKernel { spirv })
}

/// Output element `i = (o, a, c)`: each input's candidate address, the select chain by
/// `a`'s range, the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u64, .. } = *t;
    let src = grid::part_addr(b, t, &e, &l.parts, (l.total, l.inner), l.elem.bytes())?;
    let src = src.ok_or("concat without a non-empty operand")?;
    let v = elem::load(b, l.elem, f32, src)?;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}
