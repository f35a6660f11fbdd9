//! ONNX `MatMulInteger` (u8/i8 `A [..., M, K]` by a shared u8/i8 `B [K, N]`, zero points
//! per tensor, per row of A or per column of B; i32 result), and the float epilogue ONNX
//! Runtime's fused `MatMulIntegerToFloat` and `DynamicQuantizeMatMul` import as
//! (`cast` to f32, then `mul` by the scale and `add` of the bias, which fusion keeps in the
//! product's kernel, then the relu, sigmoid, tanh or GELU that may follow): the products
//! of dynamically quantized BERT and LSTM exports.
//!
//! One invocation per output element (the grid-stride launch of [`crate::grid`]), which
//! loops over K in i32: every product and sum is exact (wrapping, as the reference's
//! `mm_wrapping`) where the float matmul kernel's f32 accumulation is exact only below
//! 2^24. The epilogue's operands are scalars, `[N]` rows (a per-column scale or bias) or
//! of the result's own dims; each float step is one correctly rounded operation, decorated
//! `NoContraction` so the driver never fuses a multiply and an add into an FMA the
//! reference does not compute; the activations are the float matmul epilogue's formulas
//! ([`crate::epilogue_math`]), within a few ulp.

use rafter_ir::{BinaryOp, DType, Dim, GeluApprox, Graph, Op, UnaryOp, ValueDef, ValueId};
use rspirv::dr::Builder;
use rspirv::spirv::{Decoration, LoopControl, Word};

use crate::const_bytes::{self, Bytes};
use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, Element};
use crate::matmul::{build, Activation, Prelude, R};

/// A generated integer matmul kernel; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct MatmulIntegerKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// How an epilogue operand is read for output element `(row, n)`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Read {
    /// One element for all.
    Scalar,
    /// Element `n` (a per-column `[N]` scale or bias).
    Column,
    /// Element `i` (the result's own dims).
    Full,
}

/// One float step of the epilogue.
enum Step {
    /// `acc op operand` (or `operand op acc` where the accumulator is the right operand).
    Binary {
        op: BinaryOp,
        input: usize,
        read: Read,
        acc_left: bool,
    },
    /// `acc < 0 ? 0 : acc` (NaN kept).
    Relu,
    /// Sigmoid, tanh or GELU, the matmul epilogue's formulas
    /// ([`crate::epilogue_math`]).
    Activation(Activation),
}

/// The product's shape and operands, and the epilogue.
struct Layout {
    k: u32,
    n: u32,
    /// A's rows per batch, where a per-row zero point needs it.
    m: Option<u32>,
    a: (usize, Elem),
    b: (usize, Elem),
    /// Zero points: their bytes (a binding or a folded constant), type and reading.
    a_zp: Option<(Bytes, DType, Read)>,
    b_zp: Option<(Bytes, DType, Read)>,
    /// `None`: the i32 result is stored; else cast to f32 and these steps applied.
    epilogue: Option<Vec<Step>>,
    bindings: usize,
}

/// Generates a body whose first node is a `matmul_integer` of body inputs, optionally
/// followed by a cast to f32 and `mul`/`add`/`sub` steps, its last result the body's one
/// output.
pub fn matmul_integer(body: &Graph) -> Result<MatmulIntegerKernel, String> {
    let layout = plan(body)?;
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(MatmulIntegerKernel { spirv })
}

fn plan(body: &Graph) -> R<Layout> {
    let node = body.nodes.first().ok_or("an empty body")?;
    if node.op != Op::MatMulInteger {
        return Err(format!("op `{}` is not matmul_integer", node.op.name()));
    }
    let input = |i: usize, what: &str| grid::body_input(body, node, i, what);
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    let int8 = |i: usize, what: &str| match ty(i).dtype {
        DType::U8 => Ok(Elem::U8),
        DType::I8 => Ok(Elem::I8),
        other => Err(format!("{what} is {other}; u8 and i8 are generated")),
    };
    let (a, b) = (input(0, "A")?, input(1, "B")?);
    let (a_ty, b_ty) = (ty(a).clone(), ty(b).clone());
    let b_dims = grid::static_dims(&b_ty, "B")?;
    let [kb, n] = b_dims[..] else {
        return Err(format!(
            "B of rank {}: a shared 2-D B is generated",
            b_dims.len()
        ));
    };
    let rank = a_ty.dims.len();
    if rank < 2 {
        return Err(format!("A of rank {rank}"));
    }
    let k = a_ty.dims[rank - 1]
        .as_known()
        .filter(|&k| k as u64 == kb && k > 0)
        .ok_or_else(|| format!("A's K {} is not B's {kb}", a_ty.dims[rank - 1]))?;
    let m = a_ty.dims[rank - 2].as_known().map(|m| m as u32);
    let (k, n) = (k as u32, grid::product_u32(&[n], "N")?);
    if n == 0 {
        return Err("an empty N".into());
    }
    let zero_point = |i: usize, per: Option<u64>, what: &str| -> R<Option<(Bytes, DType, Read)>> {
        let Some(v) = node.input(i) else {
            return Ok(None);
        };
        let zt = &body.value(v).ty;
        if !matches!(zt.dtype, DType::U8 | DType::I8) {
            return Err(format!("{what} is {}; u8 and i8 are generated", zt.dtype));
        }
        let dims = grid::static_dims(zt, what)?;
        let len: u64 = dims.iter().product();
        let read = match len {
            1 => Read::Scalar,
            l if Some(l) == per && dims.len() == 1 => Read::Column,
            _ => return Err(format!("{what} of dims {dims:?}")),
        };
        Ok(Some((Bytes::of(body, v, what)?, zt.dtype, read)))
    };
    let a_zp = zero_point(2, m.map(u64::from), "A's zero point")?;
    let b_zp = zero_point(3, Some(u64::from(n)), "B's zero point")?;
    let epilogue = epilogue(body, node.outputs[0].ok_or("no result")?, n)?;
    Ok(Layout {
        k,
        n,
        m,
        a: (a, int8(a, "A")?),
        b: (b, int8(b, "B")?),
        a_zp,
        b_zp,
        epilogue,
        bindings: body.inputs.len() + 1,
    })
}

/// The nodes after the product: none (the i32 result is the output), or a cast to f32 and
/// binary steps each using the previous result once, the last the body's one output.
fn epilogue(body: &Graph, product: ValueId, n: u32) -> R<Option<Vec<Step>>> {
    let out_dims = &body.value(product).ty.dims;
    let last = |v: ValueId| body.outputs == [v];
    let rest = &body.nodes[1..];
    let Some((cast, steps)) = rest.split_first() else {
        return if last(product) {
            Ok(None)
        } else {
            Err("the product must be the body's one output".into())
        };
    };
    if cast.op != (Op::Cast { to: DType::F32 }) || cast.input(0) != Some(product) {
        return Err(format!(
            "node `{}` after the integer product: a cast to f32 is generated",
            cast.name
        ));
    }
    let mut acc = cast.outputs[0].ok_or("no cast result")?;
    let mut out = Vec::new();
    for s in steps {
        let unary = |step: Step| -> R<Step> {
            match s.inputs.as_slice() {
                [Some(v)] if *v == acc => Ok(step),
                _ => Err(format!("node `{}` does not take the product", s.name)),
            }
        };
        let op = match s.op {
            Op::Binary { op } => op,
            Op::Unary { op: UnaryOp::Relu } => {
                out.push(unary(Step::Relu)?);
                acc = s.outputs[0].ok_or("no result")?;
                continue;
            }
            Op::Unary {
                op: UnaryOp::Sigmoid,
            } => {
                out.push(unary(Step::Activation(Activation::Sigmoid))?);
                acc = s.outputs[0].ok_or("no result")?;
                continue;
            }
            Op::Unary { op: UnaryOp::Tanh } => {
                out.push(unary(Step::Activation(Activation::Tanh))?);
                acc = s.outputs[0].ok_or("no result")?;
                continue;
            }
            Op::Gelu { approximate } => {
                let tanh_form = matches!(approximate, GeluApprox::Tanh);
                out.push(unary(Step::Activation(Activation::Gelu { tanh_form }))?);
                acc = s.outputs[0].ok_or("no result")?;
                continue;
            }
            ref other => {
                return Err(format!(
                    "op `{}` in an integer product's epilogue",
                    other.name()
                ))
            }
        };
        if !matches!(op, BinaryOp::Mul | BinaryOp::Add | BinaryOp::Sub) {
            return Err(format!(
                "binary `{}` in an integer product's epilogue",
                op.word()
            ));
        }
        let (l, r) = (s.input(0), s.input(1));
        let (acc_left, other) = match (l == Some(acc), r == Some(acc)) {
            (true, false) => (true, r),
            (false, true) => (false, l),
            _ => return Err(format!("node `{}` does not take the product once", s.name)),
        };
        let other = other.ok_or("a missing operand")?;
        let ValueDef::Input(input) = body.value(other).def else {
            return Err(format!(
                "node `{}`: its operand is not a body input",
                s.name
            ));
        };
        let ty = &body.value(other).ty;
        if ty.dtype != DType::F32
            || body.value(s.outputs[0].ok_or("no result")?).ty.dims != *out_dims
        {
            return Err(format!(
                "node `{}`: f32 operands of the product's dims",
                s.name
            ));
        }
        out.push(Step::Binary {
            op,
            input,
            read: operand_read(&ty.dims, out_dims, n)?,
            acc_left,
        });
        acc = s.outputs[0].ok_or("no result")?;
    }
    if !last(acc) {
        return Err("the epilogue's last result must be the body's one output".into());
    }
    Ok(Some(out))
}

/// How an operand of `dims` broadcasts to the result's `out` dims (`n` columns).
fn operand_read(dims: &[Dim], out: &[Dim], n: u32) -> R<Read> {
    let one = |d: &Dim| d.as_known() == Some(1);
    if dims.iter().all(one) {
        return Ok(Read::Scalar);
    }
    if let Some((last, outer)) = dims.split_last() {
        if last.as_known() == Some(i64::from(n)) && outer.iter().all(one) {
            return Ok(Read::Column);
        }
    }
    if dims == out {
        return Ok(Read::Full);
    }
    Err(format!(
        "an epilogue operand of dims {dims:?} against {out:?}"
    ))
}

/// Output element `i`: `Σ_k (A[row, k] - za) * (B[k, n] - zb)` in i32, then the epilogue.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let (u32, u64) = (t.u32, t.u64);
    let i32t = b.type_int(32, 1);
    let (row, col) = grid::div_mod(b, u32, e.i, l.n)?;
    let za = match &l.a_zp {
        None => b.constant_bit32(i32t, 0),
        Some((z, dtype, read)) => {
            let at = match read {
                Read::Column => {
                    let m = l.m.ok_or("a per-row zero point of a symbolic M")?;
                    grid::div_mod(b, u32, row, m)?.1
                }
                _ => b.constant_bit32(u32, 0),
            };
            let from = z.reader(b, t, e.addrs);
            const_bytes::load_int8(b, t, from, *dtype, at)?
        }
    };
    let zb = match &l.b_zp {
        None => b.constant_bit32(i32t, 0),
        Some((z, dtype, read)) => {
            let at = if *read == Read::Column {
                col
            } else {
                b.constant_bit32(u32, 0)
            };
            let from = z.reader(b, t, e.addrs);
            const_bytes::load_int8(b, t, from, *dtype, at)?
        }
    };
    // A's row start in 64 bits: A may hold more than 2^32 elements where C does not.
    let kc = b.constant_bit64(u64, u64::from(l.k));
    let row64 = build(b.u_convert(u64, None, row))?;
    let a_row = build(b.i_mul(u64, None, row64, kc))?;
    let acc = k_loop(b, t, l.k, |b, k| {
        let k64 = build(b.u_convert(u64, None, k))?;
        let ai = build(b.i_add(u64, None, a_row, k64))?;
        let nc = b.constant_bit32(u32, l.n);
        let bk = build(b.i_mul(u32, None, k, nc))?;
        let bi = build(b.i_add(u32, None, bk, col))?;
        let bi = build(b.u_convert(u64, None, bi))?;
        let av = load_i32(b, t, e.addrs[l.a.0], l.a.1, ai)?;
        let bv = load_i32(b, t, e.addrs[l.b.0], l.b.1, bi)?;
        let av = build(b.i_sub(i32t, None, av, za))?;
        let bv = build(b.i_sub(i32t, None, bv, zb))?;
        build(b.i_mul(i32t, None, av, bv))
    })?;
    let i64v = build(b.u_convert(u64, None, e.i))?;
    let Some(steps) = &l.epilogue else {
        let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64v, 4)?;
        let i64t = b.type_int(64, 1);
        let wide = build(b.s_convert(i64t, None, acc))?;
        return elem::store_int(b, Elem::I32, i64t, dst, wide);
    };
    let mut v = build(b.convert_s_to_f(t.f32, None, acc))?;
    for s in steps {
        v = step(b, t, s, &e, (col, v))?;
    }
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64v, 4)?;
    elem::store(b, Elem::F32, t.f32, dst, v)
}

/// One epilogue step on the value `v` of output element `(.., col)`.
fn step(b: &mut Builder, t: &Prelude, s: &Step, e: &Element, (col, v): (Word, Word)) -> R<Word> {
    let (u32, u64, f32) = (t.u32, t.u64, t.f32);
    let (op, input, read, acc_left) = match *s {
        Step::Binary {
            op,
            input,
            read,
            acc_left,
        } => (op, input, read, acc_left),
        Step::Relu => {
            let zero = b.constant_bit32(f32, 0);
            let neg = build(b.f_ord_less_than(t.bool, None, v, zero))?;
            return build(b.select(f32, None, neg, zero, v));
        }
        Step::Activation(act) => {
            let mut m = Math {
                b,
                f32,
                bool: t.bool,
                glsl: t.glsl,
            };
            return match act {
                Activation::Sigmoid => m.sigmoid(v),
                Activation::Tanh => m.tanh(v),
                Activation::Gelu { tanh_form } => m.gelu(v, tanh_form),
            };
        }
    };
    let at = match read {
        Read::Scalar => b.constant_bit32(u32, 0),
        Read::Column => col,
        Read::Full => e.i,
    };
    let at = build(b.u_convert(u64, None, at))?;
    let src = grid::element_addr(b, u64, e.addrs[input], at, 4)?;
    let x = elem::load(b, Elem::F32, f32, src)?;
    let (l, r) = if acc_left { (v, x) } else { (x, v) };
    let v = match op {
        BinaryOp::Mul => build(b.f_mul(f32, None, l, r))?,
        BinaryOp::Add => build(b.f_add(f32, None, l, r))?,
        _ => build(b.f_sub(f32, None, l, r))?,
    };
    b.decorate(v, Decoration::NoContraction, []);
    Ok(v)
}

/// The 8-bit element `index` (a `u64`) of the buffer at `base`, as an i32.
fn load_i32(b: &mut Builder, t: &Prelude, base: Word, e: Elem, index: Word) -> R<Word> {
    let i64t = b.type_int(64, 1);
    let at = grid::element_addr(b, t.u64, base, index, 1)?;
    let v = elem::load_int(b, e, i64t, at)?;
    let i32t = b.type_int(32, 1);
    build(b.s_convert(i32t, None, v))
}

/// `Σ_{k < len} term(k)` in wrapping i32, `term` emitting into the loop's body.
fn k_loop(
    b: &mut Builder,
    t: &Prelude,
    len: u32,
    term: impl FnOnce(&mut Builder, Word) -> R<Word>,
) -> R<Word> {
    let (u32, bool) = (t.u32, t.bool);
    let i32t = b.type_int(32, 1);
    let (zero_u, zero_i) = (b.constant_bit32(u32, 0), b.constant_bit32(i32t, 0));
    let (entry, header, cond, body, cont, merge) = (b.id(), b.id(), b.id(), b.id(), b.id(), b.id());
    let (next_k, next_acc) = (b.id(), b.id());
    build(b.branch(entry))?;
    build(b.begin_block(Some(entry)))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(header)))?;
    let k = build(b.phi(u32, None, [(zero_u, entry), (next_k, cont)]))?;
    let acc = build(b.phi(i32t, None, [(zero_i, entry), (next_acc, cont)]))?;
    build(b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(b.branch(cond))?;
    build(b.begin_block(Some(cond)))?;
    let n = b.constant_bit32(u32, len);
    let more = build(b.u_less_than(bool, None, k, n))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    let p = term(b, k)?;
    build(b.i_add(i32t, Some(next_acc), acc, p))?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    let one = b.constant_bit32(u32, 1);
    build(b.i_add(u32, Some(next_k), k, one))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    Ok(acc)
}
