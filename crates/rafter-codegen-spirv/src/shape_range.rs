//! ONNX `Shape` and `Range` on the GPU: the small integer tensors of shape arithmetic
//! (a sequence length, the positions `0..n` of a mask or of rotary embeddings) made where
//! the work that reads them runs, so a model's attention bookkeeping does not bounce
//! between devices.
//!
//! `Shape` writes the dims of its operand as i64s: a known dim is a literal, a symbolic
//! one a dim param of the operand's binding ([`grid::DimParams`]), pushed per call. `Range`
//! writes `start + i * delta` (ONNX's definition) for each output element `i`; `start` and
//! `delta` are scalar body inputs or constants the compiler folded into the body. Integer
//! ranges compute in 64-bit integers and are wrapped to their type on store; float ranges
//! compute in f32. The element count is the launch's count (the output's), so `limit`
//! never needs reading.

use rafter_ir::{DType, Graph, Op, ValueDef, ValueId};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, DimParams, Element, Size};
use crate::matmul::{build, Prelude, R};

/// A generated shape or range kernel: the module and the dim params it reads after the
/// count (launched like an elementwise kernel).
#[derive(Debug, Clone)]
pub struct ShapeRangeKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
    /// The symbolic dims the kernel reads, in push order.
    pub dims: Vec<rafter_vulkan_section::DimParam>,
}

/// The body's one output, which must be `node`'s first result.
fn single_output(body: &Graph, node: &rafter_ir::Node, op: &str) -> R<ValueId> {
    match body.outputs.as_slice() {
        [out] if node.outputs.first().copied().flatten() == Some(*out) => Ok(*out),
        _ => Err(format!("the {op}'s result must be the body's one output")),
    }
}

/// Generates a body holding one `shape{start, end}` of a body input.
pub fn shape(body: &Graph) -> Result<ShapeRangeKernel, String> {
    let node = grid::one_node(body, "shape")?;
    let Op::Shape { start, end } = node.op else {
        return Err(format!("op `{}` is not a shape", node.op.name()));
    };
    let out = single_output(body, node, "shape")?;
    if body.value(out).ty.dtype != DType::I64 {
        return Err(format!("shape result is {}", body.value(out).ty));
    }
    let data = grid::body_input(body, node, 0, "shape operand")?;
    let ty = &body.value(body.inputs[data]).ty;
    let rank = ty.rank() as i64;
    // ONNX: negative bounds count from the end; both are clamped to 0..=rank.
    let norm = |x: i64| if x < 0 { x + rank } else { x }.clamp(0, rank) as usize;
    let (from, to) = (norm(start), norm(end.unwrap_or(rank)));
    let mut params = DimParams::default();
    let sizes = (from..to.max(from))
        .map(|a| params.dim(ty, data, a))
        .collect::<R<Vec<Size>>>()?;
    if sizes.is_empty() {
        return Err("shape of no axes (an empty result)".into());
    }
    let y = body.inputs.len();
    let spirv = grid::module_with_params(y + 1, params.params.len(), |b, t, e| {
        let mut v = grid::size_u64(b, t, &e, sizes[0])?;
        for (j, &s) in sizes.iter().enumerate().skip(1) {
            let here = b.constant_bit32(t.u32, j as u32);
            let is = build(b.i_equal(t.bool, None, e.i, here))?;
            let d = grid::size_u64(b, t, &e, s)?;
            v = build(b.select(t.u64, None, is, d, v))?;
        }
        let i64t = b.type_int(64, 1);
        let v = build(b.bitcast(i64t, None, v))?;
        let at = build(b.u_convert(t.u64, None, e.i))?;
        let dst = grid::element_addr(b, t.u64, e.addrs[y], at, 8)?;
        elem::store_int(b, Elem::I64, i64t, dst, v)
    })?;
    Ok(ShapeRangeKernel {
        spirv,
        dims: params.params,
    })
}

/// A scalar operand of `range`: bound (loaded per call) or folded into the body.
enum Scalar {
    Bound(usize),
    Folded(rafter_ir::ConstData),
}

fn scalar(body: &Graph, node: &rafter_ir::Node, i: usize, what: &str) -> R<Scalar> {
    let v = node
        .input(i)
        .ok_or_else(|| format!("range without {what}"))?;
    let ty = &body.value(v).ty;
    if ty
        .known_dims()
        .is_none_or(|d| d.iter().product::<i64>() != 1)
    {
        return Err(format!("range {what} is {ty}, not one number"));
    }
    match body.value(v).def {
        ValueDef::Input(b) => Ok(Scalar::Bound(b)),
        ValueDef::Const(c) => Ok(Scalar::Folded(body.constant(c).clone())),
        _ => Err(format!("range {what} is not a body input")),
    }
}

/// Generates a body holding one `range(start, limit, delta)` of i32, i64 or f32 scalars.
pub fn range(body: &Graph) -> Result<ShapeRangeKernel, String> {
    let node = grid::one_node(body, "range")?;
    if node.op != Op::Range {
        return Err(format!("op `{}` is not a range", node.op.name()));
    }
    let out = single_output(body, node, "range")?;
    let dtype = body.value(out).ty.dtype;
    let elem = match dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        DType::F32 => Elem::F32,
        other => return Err(format!("range of {other}; i32, i64 and f32 are generated")),
    };
    let start = scalar(body, node, 0, "start")?;
    let delta = scalar(body, node, 2, "delta")?;
    let y = body.inputs.len();
    let spirv = grid::module(y + 1, |b, t, e| {
        let at = build(b.u_convert(t.u64, None, e.i))?;
        let dst = grid::element_addr(b, t.u64, e.addrs[y], at, elem.bytes())?;
        if elem == Elem::F32 {
            let s = load_f32(b, t, &e, &start)?;
            let d = load_f32(b, t, &e, &delta)?;
            let i = build(b.convert_u_to_f(t.f32, None, e.i))?;
            let step = build(b.f_mul(t.f32, None, i, d))?;
            let v = build(b.f_add(t.f32, None, s, step))?;
            return elem::store(b, elem, t.f32, dst, v);
        }
        let i64t = b.type_int(64, 1);
        let s = load_i64(b, &e, elem, i64t, &start)?;
        let d = load_i64(b, &e, elem, i64t, &delta)?;
        let i = build(b.bitcast(i64t, None, at))?;
        let step = build(b.i_mul(i64t, None, i, d))?;
        let v = build(b.i_add(i64t, None, s, step))?;
        elem::store_int(b, elem, i64t, dst, v)
    })?;
    Ok(ShapeRangeKernel {
        spirv,
        dims: Vec::new(),
    })
}

/// An integer scalar as an `i64` (wrapping arithmetic keeps an i32 range's low bits right).
fn load_i64(b: &mut Builder, e: &Element, elem: Elem, i64t: Word, s: &Scalar) -> R<Word> {
    match s {
        Scalar::Bound(k) => elem::load_int(b, elem, i64t, e.addrs[*k]),
        Scalar::Folded(c) => {
            let v = c.to_i64s().and_then(|v| v.first().copied());
            let v = v.ok_or("range operand is not an integer")?;
            Ok(b.constant_bit64(i64t, v as u64))
        }
    }
}

/// A float scalar as an `f32`.
fn load_f32(b: &mut Builder, t: &Prelude, e: &Element, s: &Scalar) -> R<Word> {
    match s {
        Scalar::Bound(k) => elem::load(b, Elem::F32, t.f32, e.addrs[*k]),
        Scalar::Folded(c) => {
            let bytes: [u8; 4] = c
                .bytes
                .get(..4)
                .and_then(|x| x.try_into().ok())
                .filter(|_| c.dtype == DType::F32)
                .ok_or("range operand is not an f32")?;
            Ok(b.constant_bit32(t.f32, u32::from_le_bytes(bytes)))
        }
    }
}
