//! ONNX `Swish`-gated linear unit (the IR's `swiglu`): `a * sigmoid(alpha * a) * b` of
//! two f32 or f16 tensors of one shape (no broadcasting, as the op defines it).
//!
//! One invocation per element, in the grid-stride loop of [`crate::grid`], computed the
//! way the reference (NumPy) does, step by step: `1 / (1 + exp(-alpha * a))`, then
//! `(a * sigmoid) * b`; for f16 every step is rounded to f16 as NumPy's f16 arithmetic
//! rounds it (and `alpha` too), so the result matches the reference's roundings rather
//! than differing by an ulp or two. `exp` is the shared range-reduced one
//! ([`crate::epilogue_math`]).

use rafter_ir::{Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated swiglu kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct SwiGluKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// Generates a body holding one `swiglu` of two body inputs of one type and shape, its
/// result the body's one output.
pub fn swiglu(body: &Graph) -> Result<SwiGluKernel, String> {
    let node = grid::one_node(body, "swiglu")?;
    let Op::SwiGlu { alpha } = node.op else {
        return Err(format!("op `{}` is not a swiglu", node.op.name()));
    };
    let a = grid::body_input(body, node, 0, "swiglu operand 0")?;
    let g = grid::body_input(body, node, 1, "swiglu operand 1")?;
    let (ta, tg) = (
        &body.value(body.inputs[a]).ty,
        &body.value(body.inputs[g]).ty,
    );
    let elem = Elem::of(ta.dtype).map_err(|e| format!("swiglu operands are {e}"))?;
    if ta != tg {
        return Err("swiglu operands differ in type or shape".into());
    }
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the swiglu's result must be the body's one output".into());
    }
    let y = body.inputs.len();
    let spirv = grid::module(y + 1, |b, t, e| element(b, t, (elem, alpha), [a, g, y], e))?;
    Ok(SwiGluKernel { spirv })
}

/// Element `i` of the result from element `i` of both operands.
fn element(
    b: &mut Builder,
    t: &Prelude,
    (elem, alpha): (Elem, f32),
    [a, g, y]: [usize; 3],
    e: Element,
) -> R<()> {
    let Prelude { f32, u64, .. } = *t;
    let i = build(b.u_convert(u64, None, e.i))?;
    let addr = |b: &mut Builder, k: usize| grid::element_addr(b, u64, e.addrs[k], i, elem.bytes());
    let at = addr(b, a)?;
    let x = elem::load(b, elem, f32, at)?;
    let at = addr(b, g)?;
    let gate = elem::load(b, elem, f32, at)?;
    // Each step rounded to the element type, as NumPy computes it (f32: the identity).
    let r = |b: &mut Builder, v: Word| -> R<Word> {
        match elem {
            Elem::F16 => elem::round_to_half(b, f32, v),
            _ => Ok(v),
        }
    };
    let neg_alpha = b.constant_bit32(f32, (-alpha).to_bits());
    let neg_alpha = r(b, neg_alpha)?;
    let one = b.constant_bit32(f32, 1f32.to_bits());
    let z = build(b.f_mul(f32, None, neg_alpha, x))?;
    let z = r(b, z)?;
    let ez = Math {
        b: &mut *b,
        f32,
        bool: t.bool,
        glsl: t.glsl,
    }
    .exp(z)?;
    let ez = r(b, ez)?;
    let d = build(b.f_add(f32, None, one, ez))?;
    let d = r(b, d)?;
    let sig = build(b.f_div(f32, None, one, d))?;
    let sig = r(b, sig)?;
    let v = build(b.f_mul(f32, None, x, sig))?;
    let v = r(b, v)?;
    let v = build(b.f_mul(f32, None, v, gate))?;
    let at = addr(b, y)?;
    elem::store(b, elem, f32, at, v)
}
