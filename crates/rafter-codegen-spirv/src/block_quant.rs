//! ONNX Runtime's `MatMulNBits` (the IR's `matmul_block_quant`): `a [..., K]` (f32) by a
//! weight kept packed as 4- or 8-bit blocks along K with an f32 scale and a packed zero
//! point per block, plus an optional bias: the projections of a GenAI-style 4-bit LLM.
//!
//! One invocation per output element `(r, j)` (the grid-stride launch of [`crate::grid`]):
//! it walks row `j`'s blocks, dequantizing each weight as `(q - zero_point) * scale` where
//! it is read, so the float weight matrix is never built. The sums follow the reference's
//! order (a sequential sum per block added to the row's total, then the bias), each step
//! `NoContraction`. At `accuracy_level` 4 each block of `a` is first rounded to int8 as
//! ORT's CPU kernel does (scale `max|a| / 127`, ties to even; the quotients correctly
//! rounded by [`crate::epilogue_math::Math::div_exact`]): the invocation finds the block's
//! `max|a|` in a first pass over it.

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::{Decoration, Word};

use crate::const_bytes::{self, Bytes, Reader};
use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// GLSL.std.450 instruction numbers used here.
const ROUND_EVEN: u32 = 2;
const FABS: u32 = 4;
const UMIN: u32 = 38;

/// A generated block-quantized matmul kernel; launched like an elementwise kernel (one
/// `u32` param, the output's element count).
#[derive(Debug, Clone)]
pub struct BlockQuantKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// The op's attributes and where its operands are bound.
struct Layout {
    k: u32,
    n: u32,
    bits: u32,
    block: u32,
    int8_a: bool,
    a: usize,
    b: usize,
    scales: usize,
    /// The packed zero points: a binding or a constant the compiler folded.
    zero_points: Option<Bytes>,
    bias: Option<usize>,
    out: usize,
}

impl Layout {
    fn k_blocks(&self) -> u32 {
        self.k.div_ceil(self.block)
    }
    /// Values per byte of the packed weights and zero points.
    fn per_byte(&self) -> u32 {
        8 / self.bits
    }
}

/// Generates a body holding one `matmul_block_quant` of body inputs, its result the body's
/// one output.
pub fn block_quant(body: &Graph) -> Result<BlockQuantKernel, String> {
    let node = grid::one_node(body, "matmul_block_quant")?;
    let Op::MatMulBlockQuant {
        k,
        n,
        bits,
        block_size,
        accuracy_level,
    } = node.op
    else {
        return Err(format!("op `{}` is not matmul_block_quant", node.op.name()));
    };
    if bits != 4 && bits != 8 {
        return Err(format!("{bits}-bit blocks: 4 and 8 are generated"));
    }
    let small = |v: i64, what: &str| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("{what} {v}"))
    };
    let input = |i: usize, what: &str| -> R<Option<usize>> {
        match node.input(i) {
            None => Ok(None),
            Some(_) => grid::body_input(body, node, i, what).map(Some),
        }
    };
    let need = |i: usize, what: &str| input(i, what)?.ok_or_else(|| format!("no {what}"));
    let layout = Layout {
        k: small(k, "K")?,
        n: small(n, "N")?,
        bits: bits as u32,
        block: small(block_size, "block size")?,
        int8_a: accuracy_level == 4,
        a: need(0, "A")?,
        b: need(1, "B")?,
        scales: need(2, "scales")?,
        zero_points: node
            .input(3)
            .map(|v| Bytes::of(body, v, "zero points"))
            .transpose()?,
        bias: input(4, "bias")?,
        out: body.inputs.len(),
    };
    let dtype = |i: usize| body.value(body.inputs[i]).ty.dtype;
    let want = [
        (Some(layout.a), DType::F32, "A"),
        (Some(layout.b), DType::U8, "B"),
        (Some(layout.scales), DType::F32, "scales"),
        (layout.bias, DType::F32, "bias"),
    ];
    if let Some(z) = node
        .input(3)
        .filter(|&z| body.value(z).ty.dtype != DType::U8)
    {
        return Err(format!(
            "zero points of type {}: u8 is generated",
            body.value(z).ty.dtype
        ));
    }
    for (i, t, what) in want {
        if let Some(i) = i.filter(|&i| dtype(i) != t) {
            return Err(format!("{what} of type {}: {t} is generated", dtype(i)));
        }
    }
    if body.outputs.len() != 1 {
        return Err("the product must be the body's one output".into());
    }
    let spirv = grid::module(layout.out + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(BlockQuantKernel { spirv })
}

/// Value `i` of a packed run of `bits`-bit values starting at byte `start`, as an f32.
fn unpack(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    (from, start): (Reader, Word),
    i: Word,
) -> R<Word> {
    let (byte, slot) = grid::div_mod(b, t.u32, i, l.per_byte())?;
    let at = build(b.i_add(t.u32, None, start, byte))?;
    let v = const_bytes::load_byte(b, t, from, at)?;
    let bits = b.constant_bit32(t.u32, l.bits);
    let shift = build(b.i_mul(t.u32, None, slot, bits))?;
    let v = build(b.shift_right_logical(t.u32, None, v, shift))?;
    let mask = b.constant_bit32(t.u32, (1 << l.bits) - 1);
    let v = build(b.bitwise_and(t.u32, None, v, mask))?;
    build(b.convert_u_to_f(t.f32, None, v))
}

/// A float operation of [`arith`].
#[derive(Clone, Copy)]
enum Fop {
    Add,
    Sub,
    Mul,
}

/// `x op y` on f32s, decorated `NoContraction` so the driver keeps the reference's
/// roundings (no fused multiply-add).
fn arith(b: &mut Builder, f32: Word, op: Fop, (x, y): (Word, Word)) -> R<Word> {
    let id = match op {
        Fop::Add => build(b.f_add(f32, None, x, y))?,
        Fop::Sub => build(b.f_sub(f32, None, x, y))?,
        Fop::Mul => build(b.f_mul(f32, None, x, y))?,
    };
    b.decorate(id, Decoration::NoContraction, []);
    Ok(id)
}

fn f32_ext(b: &mut Builder, t: &Prelude, inst: u32, x: Word) -> R<Word> {
    build(b.ext_inst(t.f32, None, t.glsl, inst, [rspirv::dr::Operand::IdRef(x)]))
}

/// Output element `i = (r, j)`: the sum over row `j`'s blocks, then the bias.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let (u32, f32) = (t.u32, t.f32);
    let (r, j) = grid::div_mod(b, u32, e.i, l.n)?;
    let kc = b.constant_bit32(u32, l.k);
    let a_row = build(b.i_mul(u32, None, r, kc))?;
    let kb = l.k_blocks();
    let (zero_u, blocks) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, kb));
    let zero_f = b.constant_bit32(f32, 0);
    let acc = grid::range_loop(
        b,
        t,
        (zero_u, blocks),
        &[(f32, zero_f)],
        &mut |b, blk, acc| {
            let inner = block_sum(b, t, l, &e, (a_row, j, blk))?;
            Ok(vec![arith(b, f32, Fop::Add, (acc[0], inner))?])
        },
    )?[0];
    let v = match l.bias {
        Some(bias) => {
            let j64 = build(b.u_convert(t.u64, None, j))?;
            let at = grid::element_addr(b, t.u64, e.addrs[bias], j64, 4)?;
            let x = elem::load(b, Elem::F32, f32, at)?;
            arith(b, f32, Fop::Add, (acc, x))?
        }
        None => arith(b, f32, Fop::Add, (acc, zero_f))?,
    };
    let i64v = build(b.u_convert(t.u64, None, e.i))?;
    let dst = grid::element_addr(b, t.u64, e.addrs[l.out], i64v, 4)?;
    elem::store(b, Elem::F32, f32, dst, v)
}

/// Block `blk` of row `j` dotted with row `a_row` of A: `Σ a · (q - z) · s` in order.
fn block_sum(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    e: &Element,
    (a_row, j, blk): (Word, Word, Word),
) -> R<Word> {
    let (u32, f32) = (t.u32, t.f32);
    let kb = l.k_blocks();
    let bs = b.constant_bit32(u32, l.block);
    let start = build(b.i_mul(u32, None, blk, bs))?;
    let kc = b.constant_bit32(u32, l.k);
    let rest = build(b.i_sub(u32, None, kc, start))?;
    let len = build(b.ext_inst(
        u32,
        None,
        t.glsl,
        UMIN,
        [
            rspirv::dr::Operand::IdRef(bs),
            rspirv::dr::Operand::IdRef(rest),
        ],
    ))?;
    // Row j's block: scale, zero point, packed bytes.
    let kbc = b.constant_bit32(u32, kb);
    let jk = build(b.i_mul(u32, None, j, kbc))?;
    let sb = build(b.i_add(u32, None, jk, blk))?;
    let s64 = build(b.u_convert(t.u64, None, sb))?;
    let at = grid::element_addr(b, t.u64, e.addrs[l.scales], s64, 4)?;
    let s = elem::load(b, Elem::F32, f32, at)?;
    let z = match &l.zero_points {
        Some(zp) => {
            let row_bytes = b.constant_bit32(u32, kb.div_ceil(l.per_byte()));
            let zs = build(b.i_mul(u32, None, j, row_bytes))?;
            let from = zp.reader(b, t, e.addrs);
            unpack(b, t, l, (from, zs), blk)?
        }
        None => b.constant_bit32(f32, ((1u32 << (l.bits - 1)) as f32).to_bits()),
    };
    let blob = b.constant_bit32(u32, l.block * l.bits / 8);
    let packed = build(b.i_mul(u32, None, sb, blob))?;
    let a_start = build(b.i_add(u32, None, a_row, start))?;
    let load_a = |b: &mut Builder, i: Word| -> R<Word> {
        let at = build(b.i_add(u32, None, a_start, i))?;
        let at = build(b.u_convert(t.u64, None, at))?;
        let at = grid::element_addr(b, t.u64, e.addrs[l.a], at, 4)?;
        elem::load(b, Elem::F32, f32, at)
    };
    let zero_u = b.constant_bit32(u32, 0);
    let zero_f = b.constant_bit32(f32, 0);
    let int8 = if l.int8_a {
        Some(int8_scale(b, t, (zero_u, len), &load_a)?)
    } else {
        None
    };
    let sum = grid::range_loop(b, t, (zero_u, len), &[(f32, zero_f)], &mut |b, i, acc| {
        let q = unpack(b, t, l, (Reader::Addr(e.addrs[l.b]), packed), i)?;
        let d = arith(b, f32, Fop::Sub, (q, z))?;
        let w = arith(b, f32, Fop::Mul, (d, s))?;
        let mut x = load_a(b, i)?;
        if let Some((inv, scale)) = int8 {
            let y = arith(b, f32, Fop::Mul, (x, inv))?;
            let y = f32_ext(b, t, ROUND_EVEN, y)?;
            x = arith(b, f32, Fop::Mul, (y, scale))?;
        }
        let p = arith(b, f32, Fop::Mul, (x, w))?;
        Ok(vec![arith(b, f32, Fop::Add, (acc[0], p))?])
    })?;
    Ok(sum[0])
}

/// ORT's int8 rounding of a block of A: `(127 / max|a|, max|a| / 127)`, the first 0 where
/// the block is all 0 (`max` ignores NaN, as `f32::max`).
fn int8_scale(
    b: &mut Builder,
    t: &Prelude,
    range: (Word, Word),
    load_a: &dyn Fn(&mut Builder, Word) -> R<Word>,
) -> R<(Word, Word)> {
    let (f32, bool) = (t.f32, t.bool);
    let zero = b.constant_bit32(f32, 0);
    let amax = grid::range_loop(b, t, range, &[(f32, zero)], &mut |b, i, acc| {
        let x = load_a(b, i)?;
        let x = f32_ext(b, t, FABS, x)?;
        let wins = build(b.f_ord_greater_than(bool, None, x, acc[0]))?;
        Ok(vec![build(b.select(f32, None, wins, x, acc[0]))?])
    })?[0];
    let levels = b.constant_bit32(f32, 127f32.to_bits());
    let mut m = Math {
        b,
        f32,
        bool,
        glsl: t.glsl,
    };
    let scale = m.div_exact(amax, levels)?;
    let inv = m.div_exact(levels, amax)?;
    let positive = build(b.f_ord_greater_than(bool, None, amax, zero))?;
    let inv = build(b.select(f32, None, positive, inv, zero))?;
    Ok((inv, scale))
}
