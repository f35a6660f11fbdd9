//! ONNX `SpaceToDepth` of a static 4-D `[N, C, H, W]` tensor of any element type: each
//! `blocksize × blocksize` block of pixels becomes channels, `y[n, (bh * bs + bw) * C + c,
//! h, w] = x[n, c, h * bs + bh, w * bs + bw]` (the reference's reshape to `[N, C, H/bs,
//! bs, W/bs, bs]`, permutation `[0, 3, 5, 1, 2, 4]` and reshape).
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]; the
//! bits are copied through an unsigned register of the element's width (as
//! [`crate::bit_cast`]'s), so every type moves unchanged.

use rafter_ir::{Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated space-to-depth kernel; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct SpaceToDepthKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body input, then the output.
    pub spirv: Vec<u32>,
}

struct Layout {
    raw: Elem,
    x: usize,
    y: usize,
    /// The input's `[N, C, H, W]` and the block size.
    dims: [u32; 4],
    bs: u32,
}

/// Generates a body holding one `space_to_depth` of a static 4-D body input, its result
/// the body's one output.
pub fn space_to_depth(body: &Graph) -> Result<SpaceToDepthKernel, String> {
    let node = grid::one_node(body, "space_to_depth")?;
    let Op::SpaceToDepth { blocksize } = node.op else {
        return Err(format!("op `{}` is not a space_to_depth", node.op.name()));
    };
    let x = grid::body_input(body, node, 0, "space_to_depth input")?;
    let ty = &body.value(body.inputs[x]).ty;
    let dims = grid::static_dims(ty, "space_to_depth input")?;
    grid::product_u32(&dims, "space_to_depth input")?;
    let &[n, c, h, w] = dims.as_slice() else {
        return Err(format!(
            "space_to_depth input of rank {} (4-D is generated)",
            dims.len()
        ));
    };
    let bs = u64::try_from(blocksize).unwrap_or(0);
    if bs == 0 || h % bs != 0 || w % bs != 0 {
        return Err(format!(
            "space_to_depth of {h}x{w} by blocksize {blocksize}"
        ));
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the space_to_depth's result must be the body's one output".into());
    }
    let layout = Layout {
        raw: crate::bitcast::raw(ty.dtype),
        x,
        y: body.inputs.len(),
        dims: [n as u32, c as u32, h as u32, w as u32],
        bs: bs as u32,
    };
    let spirv = grid::module(layout.y + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(SpaceToDepthKernel { spirv })
}

/// Output element `i = (n, oc, oh, ow)` with `oc = (bh * bs + bw) * C + c`: the input
/// element `(n, c, oh * bs + bh, ow * bs + bw)`, copied.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { u32, u64, .. } = *t;
    let [_, c, h, w] = l.dims;
    let (ow_n, oh_n) = (w / l.bs, h / l.bs);
    let (rest, ow) = grid::div_mod(b, u32, e.i, ow_n.max(1))?;
    let (rest, oh) = grid::div_mod(b, u32, rest, oh_n.max(1))?;
    let (n, oc) = grid::div_mod(b, u32, rest, (c * l.bs * l.bs).max(1))?;
    let (block, ch) = grid::div_mod(b, u32, oc, c.max(1))?;
    let (bh, bw) = grid::div_mod(b, u32, block, l.bs)?;
    let bs = b.constant_bit32(u32, l.bs);
    let row = build(b.i_mul(u32, None, oh, bs))?;
    let row = build(b.i_add(u32, None, row, bh))?;
    let col = build(b.i_mul(u32, None, ow, bs))?;
    let col = build(b.i_add(u32, None, col, bw))?;
    // ((n * C + c) * H + row) * W + col
    let cc = b.constant_bit32(u32, c);
    let flat = build(b.i_mul(u32, None, n, cc))?;
    let flat = build(b.i_add(u32, None, flat, ch))?;
    let hc = b.constant_bit32(u32, h);
    let flat = build(b.i_mul(u32, None, flat, hc))?;
    let flat = build(b.i_add(u32, None, flat, row))?;
    let wc = b.constant_bit32(u32, w);
    let flat = build(b.i_mul(u32, None, flat, wc))?;
    let flat = build(b.i_add(u32, None, flat, col))?;
    let flat = build(b.u_convert(u64, None, flat))?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let i64t = b.type_int(64, 1);
    let from = grid::element_addr(b, u64, e.addrs[l.x], flat, l.raw.bytes())?;
    let to = grid::element_addr(b, u64, e.addrs[l.y], i, l.raw.bytes())?;
    let v = elem::load_int(b, l.raw, i64t, from)?;
    elem::store_int(b, l.raw, i64t, to, v)
}
