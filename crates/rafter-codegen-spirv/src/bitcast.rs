//! ONNX `BitCast` (the IR's `bit_cast`): each element's bytes reinterpreted as another type
//! of the same width, any shape. Nothing is computed on the values, so the element types
//! need no arithmetic support: the bits go through an unsigned integer register of the
//! width (8, 16, 32 or 64 bits), which is how f64 and bf16 data move here too.
//!
//! One invocation per element, in the grid-stride loop of [`crate::grid`]. A cast *to*
//! bool from another type is refused: its bytes may be neither 0 nor 1, which no bool
//! consumer expects.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated bit-cast kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct BitCastKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body input, then the output.
    pub spirv: Vec<u32>,
}

/// The unsigned element of `dtype`'s width, through which its bits are copied.
pub(crate) fn raw(dtype: DType) -> Elem {
    use DType::*;
    match dtype {
        Bool | I8 | U8 => Elem::U8,
        I16 | U16 | F16 | BF16 => Elem::U16,
        I32 | U32 | F32 => Elem::U32,
        I64 | U64 | F64 => Elem::U64,
    }
}

/// Generates a body holding one `bit_cast` of a body input, its result the body's one
/// output.
pub fn bit_cast(body: &Graph) -> Result<BitCastKernel, String> {
    let node = grid::one_node(body, "bit_cast")?;
    let Op::BitCast { to } = node.op else {
        return Err(format!("op `{}` is not a bit_cast", node.op.name()));
    };
    let x = grid::body_input(body, node, 0, "bit_cast operand")?;
    let from = body.value(body.inputs[x]).ty.dtype;
    let (src, dst) = (raw(from), raw(to));
    if src != dst {
        return Err(format!(
            "bit_cast from {from} to {to}: element sizes differ"
        ));
    }
    if to == DType::Bool && from != DType::Bool {
        return Err(format!(
            "bit_cast from {from} to bool (bytes other than 0 and 1)"
        ));
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the bit_cast's result must be the body's one output".into());
    }
    let bindings = body.inputs.len() + 1;
    let spirv = grid::module(bindings, |b, t, e| element(b, t, (src, x, bindings - 1), e))?;
    Ok(BitCastKernel { spirv })
}

/// Element `i`: its bits loaded from binding `x` and stored to binding `y` unchanged.
fn element(b: &mut Builder, t: &Prelude, (raw, x, y): (Elem, usize, usize), e: Element) -> R<()> {
    let i64t = b.type_int(64, 1);
    let i = build(b.u_convert(t.u64, None, e.i))?;
    let from = grid::element_addr(b, t.u64, e.addrs[x], i, raw.bytes())?;
    let to = grid::element_addr(b, t.u64, e.addrs[y], i, raw.bytes())?;
    let v = elem::load_int(b, raw, i64t, from)?;
    elem::store_int(b, raw, i64t, to, v)
}
