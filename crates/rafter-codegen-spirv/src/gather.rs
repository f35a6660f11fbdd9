//! ONNX `Gather` of a tensor of any element type (f32, f16, bool, 8- to 64-bit integers:
//! a quantized model's u8 embedding tables, its bool masks) with static dims from the axis
//! inward along any axis, by i32 or i64 indices of any shape (symbolic dims allowed where
//! the dims before the axis are static; static where those are symbolic, a batch):
//! embedding lookups (BERT's word, position and token-type embeddings), a token picked
//! from a sequence, a channel selection.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. With
//! data dims `outer × n × inner` around the axis (`n` along it) and `m` indices, output
//! element `i` is `(o, j, c)` of `outer × m × inner`, and reads data `(o, ids[j], c)`. The
//! index count `m` is `count / (outer × inner)`, computed in the kernel, so the indices'
//! dims need no dim params. Indices are widened to 64 bits (an i32 one sign-extended); a
//! negative one counts from the end, as ONNX says. An index outside the axis after that is
//! invalid input, which a kernel cannot report: it reads position 0 instead of an address
//! past the data (a device address must never be dereferenced beyond its buffer) and
//! writes NaN (0 for integers and bools), so the output shows it.

use rafter_ir::{DType, Graph, Op, ValueDef};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, DimParams, Element, Size};
use crate::matmul::{build, Prelude, R};

/// A generated gather kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct GatherKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
    /// The symbolic dims the kernel reads (the axis' length), in push order.
    pub dims: Vec<rafter_vulkan_section::DimParam>,
}

/// The data's elements before the gather axis.
#[derive(Clone, Copy, PartialEq)]
enum Outer {
    /// Static: their count.
    Known(u32),
    /// Symbolic (a batch): the indices' element count is static instead.
    Symbolic { indices: u32 },
}

/// The data's shape around the axis, the element types, and where operands are bound.
struct Layout {
    outer: Outer,
    /// The axis' length (a param where symbolic: a sequence's first token).
    axis_len: Size,
    params: usize,
    inner: u32,
    elem: Elem,
    ids_elem: Elem,
    data: usize,
    ids: Ids,
    bindings: usize,
}

/// Where the indices come from.
enum Ids {
    /// A body input, by position.
    Bound(usize),
    /// A constant the compiler folded into the body (a few indices: it folds constants of
    /// at most 64 bytes), emitted into the module as literals.
    Folded(Vec<i64>),
}

/// Generates a body holding one `gather{axis}` of a static body input of any element type
/// (f32, f16, bool, 8- to 64-bit integers) by an i32 or i64 index body input, its result
/// the body's one output.
pub fn gather(body: &Graph) -> Result<GatherKernel, String> {
    let node = grid::one_node(body, "gather")?;
    let Op::Gather { axis } = node.op else {
        return Err(format!("op `{}` is not a gather", node.op.name()));
    };
    let input = |i: usize| grid::body_input(body, node, i, &format!("gather operand {i}"));
    let data = input(0)?;
    let data_ty = &body.value(body.inputs[data]).ty;
    let ids_value = node.input(1).ok_or("gather without indices")?;
    let ids = match &body.value(ids_value).def {
        ValueDef::Input(b) => Ids::Bound(*b),
        ValueDef::Const(c) => Ids::Folded(
            body.constant(*c)
                .to_i64s()
                .filter(|v| !v.is_empty())
                .ok_or("gather indices: a constant of no integers")?,
        ),
        _ => return Err("gather operand 1 is not a body input or constant".into()),
    };
    let ids_ty = &body.value(ids_value).ty;
    let ids_elem = match ids_ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => {
            return Err(format!(
                "gather indices are {other}; i32 and i64 are generated"
            ))
        }
    };
    // Any element type moves: floats as f32 values, integers and bools as their bits.
    let elem = Elem::of_any(data_ty.dtype).map_err(|e| format!("the gathered data is {e}"))?;
    let a = grid::norm_axis(axis, data_ty.rank(), "gather")?;
    let inner = grid::static_dims_from(data_ty, a + 1, "gathered data")?;
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the gather's result must be the body's one output".into());
    }
    let mut params = DimParams::default();
    let axis_len = params.dim(data_ty, data, a)?;
    // Symbolic dims before the axis (a batch) need the index count static: the kernel
    // splits the element index by it.
    let before = rafter_ir::TensorType {
        dtype: data_ty.dtype,
        dims: data_ty.dims[..a].to_vec(),
    };
    let outer = match grid::static_dims(&before, "gathered data") {
        Ok(before) => Outer::Known(grid::product_u32(&before, "gather outer dims")?),
        Err(why) => {
            let m = ids_ty
                .known_dims()
                .ok_or_else(|| format!("{why} and the indices' dims are not static"))?;
            let m: Vec<u64> = m.iter().map(|&d| d as u64).collect();
            Outer::Symbolic {
                indices: grid::product_u32(&m, "gather indices")?,
            }
        }
    };
    if let Some(all) = data_ty.known_dims() {
        let all: Vec<u64> = all.iter().map(|&d| d as u64).collect();
        grid::product_u32(&all, "gathered data")?;
    }
    let layout = Layout {
        outer,
        axis_len,
        inner: grid::product_u32(&inner, "gather inner dims")?,
        elem,
        ids_elem,
        data,
        ids,
        bindings: body.inputs.len() + 1,
        params: params.params.len(),
    };
    if layout.axis_len == Size::Known(0) || layout.outer == Outer::Known(0) || layout.inner == 0 {
        return Err(format!("gather from empty data {data_ty}"));
    }
    let spirv = grid::module_with_params(layout.bindings, layout.params, |b, t, e| {
        element(b, t, &layout, e)
    })?;
    Ok(GatherKernel {
        spirv,
        dims: params.params,
    })
}

/// Output element `i`: its `(o, j, c)`, the index `ids[j]` wrapped and checked, the data
/// element `(o, index, c)`, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let (rest, c) = grid::div_mod(b, u32, e.i, l.inner)?;
    let (o, j) = match l.outer {
        Outer::Known(1) => (b.constant_bit32(u32, 0), rest),
        Outer::Known(outer) => {
            // m = count / (outer * inner): the index count, whatever the indices' dims.
            let span = b.constant_bit32(u32, outer * l.inner);
            let m = build(b.u_div(u32, None, e.count, span))?;
            (
                build(b.u_div(u32, None, rest, m))?,
                build(b.u_mod(u32, None, rest, m))?,
            )
        }
        Outer::Symbolic { indices } => grid::div_mod(b, u32, rest, indices.max(1))?,
    };
    let index = load_index(b, t, l, e.addrs, j)?;
    // Negative counts from the end; then one unsigned comparison checks both edges.
    let zero64 = b.constant_bit64(u64, 0);
    let n = grid::size_u64(b, t, &e, l.axis_len)?;
    let negative = build(b.s_less_than(bool, None, index, zero64))?;
    let wrapped = build(b.i_add(u64, None, index, n))?;
    let index = build(b.select(u64, None, negative, wrapped, index))?;
    let valid = build(b.u_less_than(bool, None, index, n))?;
    let index = build(b.select(u64, None, valid, index, zero64))?;
    // The element: data + ((o * n + index) * inner + c) * size.
    let o64 = build(b.u_convert(u64, None, o))?;
    let flat = build(b.i_mul(u64, None, o64, n))?;
    let flat = build(b.i_add(u64, None, flat, index))?;
    let inner = b.constant_bit64(u64, u64::from(l.inner));
    let flat = build(b.i_mul(u64, None, flat, inner))?;
    let c64 = build(b.u_convert(u64, None, c))?;
    let flat = build(b.i_add(u64, None, flat, c64))?;
    let src = grid::element_addr(b, u64, e.addrs[l.data], flat, l.elem.bytes())?;
    let at = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], at, l.elem.bytes())?;
    if matches!(l.elem, Elem::F32 | Elem::F16) {
        let v = elem::load(b, l.elem, f32, src)?;
        // An index out of range (an error in the reference) reads NaN, not memory.
        let nan = b.constant_bit32(f32, 0x7FC0_0000);
        let v = build(b.select(f32, None, valid, v, nan))?;
        elem::store(b, l.elem, f32, dst, v)
    } else {
        // Integers and bools keep their bits through an i64; out of range reads 0.
        let i64 = b.type_int(64, 1);
        let v = elem::load_int(b, l.elem, i64, src)?;
        let zero = b.constant_bit64(i64, 0);
        let v = build(b.select(i64, None, valid, v, zero))?;
        elem::store_int(b, l.elem, i64, dst, v)
    }
}

/// Index `j` as a `u64` holding its two's-complement 64-bit value.
fn load_index(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word], j: Word) -> R<Word> {
    let ids = match &l.ids {
        Ids::Bound(ids) => *ids,
        Ids::Folded(values) => {
            // A select chain over the few literals: `values[j]`.
            let mut v = b.constant_bit64(t.u64, values[0] as u64);
            for (k, &x) in values.iter().enumerate().skip(1) {
                let kc = b.constant_bit32(t.u32, k as u32);
                let here = build(b.i_equal(t.bool, None, j, kc))?;
                let xc = b.constant_bit64(t.u64, x as u64);
                v = build(b.select(t.u64, None, here, xc, v))?;
            }
            return Ok(v);
        }
    };
    let j64 = build(b.u_convert(t.u64, None, j))?;
    let at = grid::element_addr(b, t.u64, addrs[ids], j64, l.ids_elem.bytes())?;
    load_index_at(b, t, l.ids_elem, at)
}

/// The i32 or i64 index at byte address `at` as a `u64` holding its two's-complement
/// 64-bit value. An i32 is loaded as unsigned bits, zero-extended and sign-extended by
/// `(v ^ 2^31) - 2^31`: lavapipe's `OpSConvert` of the loaded i32 gave a zero-extended
/// value (tests/gather.rs caught it).
pub(crate) fn load_index_at(b: &mut Builder, t: &Prelude, ids: Elem, at: Word) -> R<Word> {
    let unsigned = if ids == Elem::I64 {
        Elem::U64
    } else {
        Elem::U32
    };
    let i64t = b.type_int(64, 1);
    let v = elem::load_int(b, unsigned, i64t, at)?;
    let v = build(b.bitcast(t.u64, None, v))?;
    if ids == Elem::I64 {
        return Ok(v);
    }
    let sign = b.constant_bit64(t.u64, 1 << 31);
    let flipped = build(b.bitwise_xor(t.u64, None, v, sign))?;
    build(b.i_sub(t.u64, None, flipped, sign))
}
