//! ONNX `Split` of a static f32 or f16 tensor along any axis into any number of parts (the
//! part sizes read from the results' types, which inference took from the `split` operand
//! or the equal division).
//!
//! One invocation per *input* element, in the grid-stride loop of [`crate::grid`] run over
//! the input's count (the launch's count is the first result's, so the first part must not
//! be empty): element `i = (o, a, c)` of `outer × N × inner` goes to element
//! `(o, a - off_k, c)` of the part `k` whose range `off_k..off_k + n_k` holds `a`, picked by
//! a chain of selects on the store address as [`crate::concat`] picks its load address.

use rafter_ir::{Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated split kernel; launched like an elementwise kernel (one `u32` param, the
/// first result's element count).
#[derive(Debug, Clone)]
pub struct SplitKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the results.
    pub spirv: Vec<u32>,
}

struct Layout {
    elem: Elem,
    data: usize,
    /// Per non-empty result: its binding, its offset along the axis and its length there.
    parts: Vec<(usize, u32, u32)>,
    total: u32,
    inner: u32,
}

/// Generates a body holding one `split{axis}` of a static f32/f16 body input whose results
/// are the body's outputs, in order.
pub fn split(body: &Graph) -> Result<SplitKernel, String> {
    let node = grid::one_node(body, "split")?;
    let Op::Split { axis } = node.op else {
        return Err(format!("op `{}` is not a split", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "split data")?;
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of(ty.dtype).map_err(|e| format!("split data is {e}"))?;
    let dims = grid::static_dims(ty, "split data")?;
    grid::product_u32(&dims, "split data")?;
    let a = grid::norm_axis(axis, dims.len(), "split")?;
    let results: Vec<_> = node
        .outputs
        .iter()
        .map(|o| o.ok_or_else(|| "a split result is unused".to_string()))
        .collect::<R<_>>()?;
    if results != body.outputs {
        return Err("the split's results must be the body's outputs, in order".into());
    }
    let inputs = body.inputs.len();
    let mut parts = Vec::new();
    let mut offset = 0u64;
    for (k, &r) in results.iter().enumerate() {
        let rd = grid::static_dims(&body.value(r).ty, "split result")?;
        if rd.len() != dims.len() || rd[..a] != dims[..a] || rd[a + 1..] != dims[a + 1..] {
            return Err(format!(
                "split result {k} {rd:?} does not match the data {dims:?}"
            ));
        }
        if rd[a] > 0 {
            parts.push((inputs + k, offset as u32, rd[a] as u32));
        }
        offset += rd[a];
    }
    if offset != dims[a] {
        return Err(format!(
            "split results sum to {offset} along axis {a}, the data has {}",
            dims[a]
        ));
    }
    // The launch counts the first result: an empty one would launch nothing.
    let first = match parts.first() {
        Some(&(binding, _, n)) if binding == inputs => n,
        _ => return Err("a split whose first result is empty is not generated".into()),
    };
    let layout = Layout {
        elem,
        data,
        parts,
        total: dims[a] as u32,
        inner: grid::product_u32(&dims[a + 1..], "split inner dims")?,
    };
    let scale = (layout.total, first);
    let spirv = grid::module_scaled(inputs + results.len(), scale, 0, |b, t, e| {
        element(b, t, &layout, e)
    })?;
    Ok(SplitKernel { spirv })
}

/// Input element `i = (o, a, c)`: the load, each part's candidate address, the select
/// chain by `a`'s range, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u64, .. } = *t;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let src = grid::element_addr(b, u64, e.addrs[l.data], i64, l.elem.bytes())?;
    let v = elem::load(b, l.elem, f32, src)?;
    let dst = grid::part_addr(b, t, &e, &l.parts, (l.total, l.inner), l.elem.bytes())?;
    let dst = dst.ok_or("split without a non-empty result")?;
    elem::store(b, l.elem, f32, dst, v)
}
