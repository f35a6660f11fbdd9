//! ONNX `EyeLike`: a matrix of the input's static shape (`[n]` reads as `[n, n]`, as the
//! reference does) and of any element type, one on diagonal `k` (`col - row == k`) and
//! zero elsewhere. The input's values are never read.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]; the
//! element is stored as the bits of the type's one or zero through an unsigned register
//! of its width (as [`crate::bit_cast`]'s), so f64 and bf16 results need no float
//! arithmetic of their width.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated eye-like kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct EyeLikeKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body input, then the output.
    pub spirv: Vec<u32>,
}

/// The bits of one in `dtype`.
fn one_bits(dtype: DType) -> u64 {
    match dtype {
        DType::F64 => 1f64.to_bits(),
        DType::F32 => u64::from(1f32.to_bits()),
        DType::F16 => 0x3C00,
        DType::BF16 => 0x3F80,
        _ => 1,
    }
}

/// Generates a body holding one `eye_like` of a static 1- or 2-D body input, its result
/// the body's one output.
pub fn eye_like(body: &Graph) -> Result<EyeLikeKernel, String> {
    let node = grid::one_node(body, "eye_like")?;
    let Op::EyeLike { dtype, k } = node.op else {
        return Err(format!("op `{}` is not an eye_like", node.op.name()));
    };
    let x = grid::body_input(body, node, 0, "eye_like input")?;
    let dims = grid::static_dims(&body.value(body.inputs[x]).ty, "eye_like input")?;
    let cols = match dims.as_slice() {
        [n] | [_, n] => *n,
        _ => return Err(format!("eye_like input of rank {} (1- or 2-D)", dims.len())),
    };
    grid::product_u32(&[cols, cols.max(dims[0])], "eye_like result")?;
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the eye_like's result must be the body's one output".into());
    }
    if body.value(body.outputs[0]).ty.dtype != dtype {
        return Err("the eye_like's result type differs from its dtype".into());
    }
    let raw = crate::bitcast::raw(dtype);
    let y = body.inputs.len();
    let spirv = grid::module(y + 1, |b, t, e| {
        element(b, t, (raw, one_bits(dtype)), (cols as u32, k), y, e)
    })?;
    Ok(EyeLikeKernel { spirv })
}

/// Element `i = (row, col)`: one where `col - row == k`, else zero.
fn element(
    b: &mut Builder,
    t: &Prelude,
    (raw, one): (Elem, u64),
    (cols, k): (u32, i64),
    y: usize,
    e: Element,
) -> R<()> {
    let Prelude { u32, u64, bool, .. } = *t;
    let i64t = b.type_int(64, 1);
    let (row, col) = grid::div_mod(b, u32, e.i, cols.max(1))?;
    let row = build(b.u_convert(u64, None, row))?;
    let col = build(b.u_convert(u64, None, col))?;
    let d = build(b.i_sub(u64, None, col, row))?;
    let k = b.constant_bit64(u64, k as u64);
    let on = build(b.i_equal(bool, None, d, k))?;
    let (one, zero) = (b.constant_bit64(i64t, one), b.constant_bit64(i64t, 0));
    let v = build(b.select(i64t, None, on, one, zero))?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let to = grid::element_addr(b, u64, e.addrs[y], i, raw.bytes())?;
    elem::store_int(b, raw, i64t, to, v)
}
