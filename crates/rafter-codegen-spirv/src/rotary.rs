//! ONNX `RotaryEmbedding` (and ORT's contrib op the importer maps onto it) on an f32
//! `x [batch, seq, heads * head_size]` or `[batch, heads, seq, head_size]` (heads and seq
//! static) with cos and sin caches `[positions, rot / 2]` (or `[batch, seq, rot / 2]`
//! without ids) and optional i32/i64 `position_ids [batch, seq]`: the rotary step of a
//! GenAI-style LLM's attention (its query and key, every decode step).
//!
//! One invocation per output element (the grid-stride launch of [`crate::grid`]). The
//! 3-D layout makes the element's `(batch, seq)` row `i / (heads * head_size)` without
//! knowing the sequence length, which is also the index of its position id (or, without
//! ids, its cache row); the 4-D one divides by the static head size, sequence length and
//! head count instead. An element past the rotary dims is copied; one inside reads its
//! pair partner and computes the reference's `c·x1 - s·x2` or `s·x1 + c·x2`, each product
//! rounded on its own (`NoContraction`: no fused multiply-add). A position id outside the
//! cache is invalid input, which a kernel cannot report: it reads row 0 and writes NaN.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::{Decoration, Word};

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated rotary-embedding kernel; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct RotaryKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// The geometry and where the operands are bound.
struct Layout {
    /// `heads * head_size`: one `(batch, seq)` row of x.
    row: u32,
    head: u32,
    half: u32,
    /// Cache rows.
    positions: u32,
    /// For a 4-D x `[batch, heads, seq, head_size]`: heads and seq (static); `None` for a
    /// 3-D one.
    heads_seq: Option<(u32, u32)>,
    interleaved: bool,
    x: usize,
    cos: usize,
    sin: usize,
    ids: Option<(usize, Elem)>,
    out: usize,
}

/// Generates a body holding one `rotary_embedding` of a 3-D f32 body input (static last
/// dim) or a 4-D one (static but for the batch), static caches and optional position ids, its result the body's one output.
pub fn rotary(body: &Graph) -> Result<RotaryKernel, String> {
    let node = grid::one_node(body, "rotary_embedding")?;
    let Op::RotaryEmbedding {
        interleaved,
        num_heads,
        rotary_embedding_dim,
    } = node.op
    else {
        return Err(format!("op `{}` is not rotary_embedding", node.op.name()));
    };
    let input = |i: usize, what: &str| grid::body_input(body, node, i, what);
    let (x, cos, sin) = (input(0, "x")?, input(1, "cos")?, input(2, "sin")?);
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    for (i, what) in [(x, "x"), (cos, "the cos cache"), (sin, "the sin cache")] {
        if ty(i).dtype != DType::F32 {
            return Err(format!("{what} is {}; f32 is generated", ty(i).dtype));
        }
    }
    let (row, head, heads_seq) = x_geometry(ty(x), num_heads)?;
    let rot = if rotary_embedding_dim > 0 {
        rotary_embedding_dim as u64
    } else {
        head
    };
    if rot > head || rot % 2 != 0 {
        return Err(format!("rotary dim {rot} for head size {head}"));
    }
    // [positions, rot / 2], or [batch, seq, rot / 2] read by (batch, seq) row.
    let cache = grid::static_dims(ty(cos), "the cos cache")?;
    let sin_cache = grid::static_dims(ty(sin), "the sin cache")?;
    let rows = cache.len().checked_sub(1).filter(|&n| (1..=2).contains(&n));
    let Some(rows) = rows.filter(|&n| cache[n] == rot / 2 && sin_cache == cache) else {
        return Err(format!("caches of dims {cache:?} for rotary dim {rot}"));
    };
    let ids = match node.input(3) {
        None => None,
        Some(_) => {
            let i = input(3, "position ids")?;
            let e = match ty(i).dtype {
                DType::I64 => Elem::I64,
                DType::I32 => Elem::I32,
                other => return Err(format!("position ids of type {other}")),
            };
            Some((i, e))
        }
    };
    if body.outputs.len() != 1 {
        return Err("the rotation must be the body's one output".into());
    }
    let layout = Layout {
        row: grid::product_u32(&[row], "x's rows")?,
        head: head as u32,
        half: (rot / 2) as u32,
        positions: grid::product_u32(&cache[..rows], "cache rows")?,
        heads_seq,
        interleaved,
        x,
        cos,
        sin,
        ids,
        out: body.inputs.len(),
    };
    let spirv = grid::module(layout.out + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(RotaryKernel { spirv })
}

/// x's row length, head size and, for a 4-D x, its heads and sequence length.
type XGeometry = (u64, u64, Option<(u32, u32)>);

/// x's geometry: the elements of one `(batch, seq)` row of a 3-D x (`heads * head_size`,
/// static) or of one head of a 4-D one (`head_size`), the head size, and for a 4-D x its
/// heads and sequence length (static: the element index is divided by them).
fn x_geometry(x: &rafter_ir::TensorType, num_heads: i64) -> R<XGeometry> {
    match x.dims.len() {
        3 => {
            let row = grid::static_dims_from(x, 2, "x")?[0];
            let heads = u64::try_from(num_heads)
                .ok()
                .filter(|&h| h > 0 && row % h == 0);
            let head = row / heads.ok_or_else(|| format!("{num_heads} heads of {row} values"))?;
            Ok((row, head, None))
        }
        4 => {
            let d = grid::static_dims_from(x, 1, "x")?;
            grid::product_u32(&d, "x's heads")?;
            Ok((d[2], d[2], Some((d[0] as u32, d[1] as u32))))
        }
        r => Err(format!(
            "x of rank {r}: [batch, seq, hidden] or [batch, heads, seq, head_size] is generated"
        )),
    }
}

/// Loads the f32 at element `index` (a `u32`) of the buffer at `base`.
fn load_f32(b: &mut Builder, t: &Prelude, base: Word, index: Word) -> R<Word> {
    let index = build(b.u_convert(t.u64, None, index))?;
    let at = grid::element_addr(b, t.u64, base, index, 4)?;
    elem::load(b, Elem::F32, t.f32, at)
}

/// `a * b` rounded on its own.
fn product(b: &mut Builder, f32: Word, x: Word, y: Word) -> R<Word> {
    let p = build(b.f_mul(f32, None, x, y))?;
    b.decorate(p, Decoration::NoContraction, []);
    Ok(p)
}

/// The `(batch, seq)` row of element `i` (its position id's index) and its place in its
/// head: for a 3-D x, `i / hidden` and `i % head`; for a 4-D one, `i = ((b * heads + h)
/// * seq + s) * head + t` gives row `b * seq + s`.
fn row_and_place(b: &mut Builder, t: &Prelude, l: &Layout, i: Word) -> R<(Word, Word)> {
    let u32 = t.u32;
    let Some((heads, seq)) = l.heads_seq else {
        let (row, col) = grid::div_mod(b, u32, i, l.row)?;
        return Ok((row, grid::div_mod(b, u32, col, l.head)?.1));
    };
    let (q, within) = grid::div_mod(b, u32, i, l.head)?;
    let (bh, s) = grid::div_mod(b, u32, q, seq)?;
    let (batch, _) = grid::div_mod(b, u32, bh, heads)?;
    let seq = b.constant_bit32(u32, seq);
    let row = build(b.i_mul(u32, None, batch, seq))?;
    Ok((build(b.i_add(u32, None, row, s))?, within))
}

/// Output element `i`: its row, its place `t` in the head, the cache row, the rotation.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let (u32, f32, bool) = (t.u32, t.f32, t.bool);
    let (row, within) = row_and_place(b, t, l, e.i)?;
    let c = |b: &mut Builder, v: u32| b.constant_bit32(u32, v);
    // The cache row: the position id, or the (batch, seq) row itself; checked.
    let (pos, valid) = match l.ids {
        None => {
            let n = b.constant_bit32(u32, l.positions);
            let valid = build(b.u_less_than(bool, None, row, n))?;
            let zero = b.constant_bit32(u32, 0);
            (build(b.select(u32, None, valid, row, zero))?, valid)
        }
        Some((ids, elem)) => {
            let j64 = build(b.u_convert(t.u64, None, row))?;
            let at = grid::element_addr(b, t.u64, e.addrs[ids], j64, elem.bytes())?;
            let id = crate::gather::load_index_at(b, t, elem, at)?;
            let n = b.constant_bit64(t.u64, u64::from(l.positions));
            let valid = build(b.u_less_than(bool, None, id, n))?;
            let zero = b.constant_bit64(t.u64, 0);
            let id = build(b.select(t.u64, None, valid, id, zero))?;
            (build(b.u_convert(u32, None, id))?, valid)
        }
    };
    // k: the pair's cache column; first: this element is the pair's first; partner: the
    // other element's offset from this one (+d or -d).
    let (k, first, partner_up) = if l.interleaved {
        let (k, odd) = grid::div_mod(b, u32, within, 2)?;
        let zero = c(b, 0);
        let first = build(b.i_equal(bool, None, odd, zero))?;
        (k, first, c(b, 1))
    } else {
        let half = c(b, l.half);
        let first = build(b.u_less_than(bool, None, within, half))?;
        let k = build(b.i_sub(u32, None, within, half))?;
        let k = build(b.select(u32, None, first, within, k))?;
        (k, first, half)
    };
    let rot = c(b, 2 * l.half);
    let rotated = build(b.u_less_than(bool, None, within, rot))?;
    // Outside the rotary dims k may pass the cache row: read column 0 there (unused).
    let zero = c(b, 0);
    let k = build(b.select(u32, None, rotated, k, zero))?;
    let half = c(b, l.half);
    let cache_at = build(b.i_mul(u32, None, pos, half))?;
    let cache_at = build(b.i_add(u32, None, cache_at, k))?;
    let (cv, sv) = (
        load_f32(b, t, e.addrs[l.cos], cache_at)?,
        load_f32(b, t, e.addrs[l.sin], cache_at)?,
    );
    let x = load_f32(b, t, e.addrs[l.x], e.i)?;
    // The partner: i + d for the first of a pair, i - d for the second; i outside.
    let up = build(b.i_add(u32, None, e.i, partner_up))?;
    let down = build(b.i_sub(u32, None, e.i, partner_up))?;
    let other = build(b.select(u32, None, first, up, down))?;
    let other = build(b.select(u32, None, rotated, other, e.i))?;
    let y = load_f32(b, t, e.addrs[l.x], other)?;
    // First: c·x - s·y (x1 = x, x2 = y); second: s·y + c·x (x1 = y, x2 = x).
    let cx = product(b, f32, cv, x)?;
    let sy = product(b, f32, sv, y)?;
    let minus = build(b.f_sub(f32, None, cx, sy))?;
    let plus = build(b.f_add(f32, None, sy, cx))?;
    let v = build(b.select(f32, None, first, minus, plus))?;
    let v = build(b.select(f32, None, rotated, v, x))?;
    let nan = b.constant_bit32(f32, 0x7FC0_0000);
    let v = build(b.select(f32, None, valid, v, nan))?;
    let i64v = build(b.u_convert(t.u64, None, e.i))?;
    let dst = grid::element_addr(b, t.u64, e.addrs[l.out], i64v, 4)?;
    elem::store(b, Elem::F32, f32, dst, v)
}
