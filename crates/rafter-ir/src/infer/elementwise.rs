//! Elementwise ops: same shape or NumPy broadcast, and the value arithmetic that shape
//! computations in exported graphs do with them.

use super::arith;
use super::cx::{broadcast_values, valued, Cx, Res, R};
use crate::{BinaryOp, DType, Dim, UnaryOp};

/// Result 0 has operand 0's type (activations, RotaryEmbedding, ...).
pub(super) fn same(cx: &mut Cx<'_, '_, '_>, min: usize, max: usize) -> R {
    cx.arity(min, max)?;
    Ok(vec![Res::of(cx.ty(0)?)])
}

pub(super) fn identity(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    Ok(vec![Res::of(cx.ty(0)?).with_sym(cx.values(0))])
}

pub(super) fn unary(cx: &mut Cx<'_, '_, '_>, op: UnaryOp) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let dtype = match op {
        UnaryOp::IsNaN => DType::Bool,
        _ => x.dtype,
    };
    let sym = if valued(dtype) {
        cx.values(0).and_then(|v| {
            v.iter()
                .map(|d| unary_value(op, d, x.dtype))
                .collect::<Option<Vec<_>>>()
        })
    } else {
        None
    };
    Ok(vec![Res::new(dtype, x.dims.clone()).with_sym(sym)])
}

fn unary_value(op: UnaryOp, d: &Dim, dtype: DType) -> Option<Dim> {
    let k = d.as_known();
    Some(match op {
        UnaryOp::Neg => arith::scale(d, -1)?,
        UnaryOp::Abs if arith::nonneg(d) => d.clone(),
        UnaryOp::Abs => Dim::known(k?.checked_abs()?),
        UnaryOp::Sign => Dim::known(k?.signum()),
        UnaryOp::Relu if arith::nonneg(d) => d.clone(),
        UnaryOp::Relu => Dim::known(k?.max(0)),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round if dtype.is_int() => d.clone(),
        UnaryOp::Not => Dim::known((k? == 0) as i64),
        UnaryOp::BitwiseNot => Dim::known(!k?),
        _ => return None,
    })
}

/// Result dtype of a binary op.
fn binary_dtype(op: BinaryOp, a: DType, b: DType) -> Result<DType, String> {
    use BinaryOp::*;
    if !matches!(op, Pow) && a != b {
        return Err(format!("operand dtypes differ: {a} and {b}"));
    }
    Ok(match op {
        Equal | Less | LessOrEqual | Greater | GreaterOrEqual | And | Or | Xor => DType::Bool,
        _ => a,
    })
}

pub(super) fn binary(cx: &mut Cx<'_, '_, '_>, op: BinaryOp) -> R {
    cx.arity(2, 2)?;
    let (a, b) = (cx.ty(0)?, cx.ty(1)?);
    let dtype = binary_dtype(op, a.dtype, b.dtype)?;
    let mut dims = cx.broadcast(&[(0, &a.dims), (1, &b.dims)])?;
    if op == BinaryOp::PRelu {
        // The slope broadcasts to x (unidirectionally): the result is x's shape.
        if dims.len() != a.rank() {
            return Err(format!(
                "prelu: slope of rank {} does not broadcast to x of rank {}",
                b.rank(),
                a.rank()
            ));
        }
        dims.clone_from(&a.dims);
    }
    let sym = if valued(dtype) {
        match (cx.values(0), cx.values(1)) {
            (Some(va), Some(vb)) => {
                broadcast_values(&dims, &[(&a.dims, &va), (&b.dims, &vb)], |x| {
                    binary_value(op, x[0], x[1], a.dtype)
                })
            }
            _ => None,
        }
    } else {
        None
    };
    Ok(vec![Res::new(dtype, dims).with_sym(sym)])
}

/// One element of a binary op on integer (or bool) values.
pub(super) fn binary_value(op: BinaryOp, a: &Dim, b: &Dim, dtype: DType) -> Option<Dim> {
    use BinaryOp::*;
    let (ka, kb) = (a.as_known(), b.as_known());
    let known = |f: fn(i64, i64) -> Option<i64>| f(ka?, kb?).map(Dim::known);
    let cmp = |f: fn(&i64, &i64) -> bool| Some(Dim::known(f(&ka?, &kb?) as i64));
    match op {
        Add => arith::add(a, b),
        Sub => arith::sub(a, b),
        Mul => arith::mul(a, b),
        // Integer division truncates; when the division is exact that is the quotient.
        Div => match (ka, kb) {
            (Some(x), Some(y)) => x.checked_div(y).map(Dim::known),
            _ => arith::div_exact(a, b),
        },
        Mod => known(|x, y| {
            let r = x.checked_rem(y)?;
            Some(if r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            })
        }),
        FMod => known(i64::checked_rem),
        Max => known(|x, y| Some(x.max(y))),
        Min => known(|x, y| Some(x.min(y))),
        Pow => known(|x, y| x.checked_pow(u32::try_from(y).ok()?)),
        Equal if a == b => Some(Dim::known(1)),
        // Symbolic comparisons decided by proof: sizes are non-negative, so e.g.
        // `seq == -1` is false (exported attention masks compare shapes with -1).
        Equal if lt(a, b) || lt(b, a) => Some(Dim::known(0)),
        Less | GreaterOrEqual if lt(a, b) || arith::le(b, a) => {
            Some(Dim::known((lt(a, b) == (op == Less)) as i64))
        }
        Greater | LessOrEqual if lt(b, a) || arith::le(a, b) => {
            Some(Dim::known((lt(b, a) == (op == Greater)) as i64))
        }
        Equal => cmp(i64::eq),
        Less => cmp(i64::lt),
        LessOrEqual => cmp(i64::le),
        Greater => cmp(i64::gt),
        GreaterOrEqual => cmp(i64::ge),
        And => known(|x, y| Some((x != 0 && y != 0) as i64)),
        Or => known(|x, y| Some((x != 0 || y != 0) as i64)),
        Xor => known(|x, y| Some(((x != 0) != (y != 0)) as i64)),
        BitAnd => known(|x, y| Some(x & y)),
        BitOr => known(|x, y| Some(x | y)),
        BitXor => known(|x, y| Some(x ^ y)),
        ShiftLeft | ShiftRight if !dtype.is_unsigned_int() => None,
        ShiftLeft => known(|x, y| x.checked_shl(u32::try_from(y).ok()?)),
        ShiftRight => known(|x, y| x.checked_shr(u32::try_from(y).ok()?)),
        PRelu => match ka? {
            x if x < 0 => known(|x, y| x.checked_mul(y)),
            _ => Some(a.clone()),
        },
    }
}

/// Whether `a < b` provably (for every binding of the symbols to sizes).
fn lt(a: &Dim, b: &Dim) -> bool {
    arith::add(a, &Dim::known(1)).is_some_and(|a1| arith::le(&a1, b))
}

pub(super) fn where_(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(3, 3)?;
    let (c, x, y) = (cx.ty(0)?, cx.ty(1)?, cx.ty(2)?);
    if c.dtype != DType::Bool {
        return Err(format!(
            "condition (operand 0) must be bool, got {}",
            c.dtype
        ));
    }
    if x.dtype != y.dtype {
        return Err(format!(
            "operand dtypes differ: {} and {}",
            x.dtype, y.dtype
        ));
    }
    let dims = cx.broadcast(&[(0, &c.dims), (1, &x.dims), (2, &y.dims)])?;
    let sym = match (valued(x.dtype), cx.values(0), cx.values(1), cx.values(2)) {
        (true, Some(vc), Some(vx), Some(vy)) => broadcast_values(
            &dims,
            &[(&c.dims, &vc), (&x.dims, &vx), (&y.dims, &vy)],
            |e| match e[0].as_known()? {
                0 => Some(e[2].clone()),
                _ => Some(e[1].clone()),
            },
        ),
        _ => None,
    };
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

pub(super) fn clip(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 3)?;
    let x = cx.ty(0)?;
    for i in 1..3 {
        if let Some(t) = cx.opt_ty(i) {
            if t.rank() > 1 || t.dims.first().is_some_and(|d| d.as_known() != Some(1)) {
                return Err(format!(
                    "clip bound (operand {i}) must be a scalar, got {t}"
                ));
            }
        }
    }
    let bound = |i: usize| -> Option<Option<i64>> {
        if cx.present(i) {
            cx.ints(i).map(|v| v.first().copied())
        } else {
            Some(None)
        }
    };
    let sym = match (valued(x.dtype), cx.values(0), bound(1), bound(2)) {
        (true, Some(v), Some(lo), Some(hi)) => v
            .iter()
            .map(|d| {
                let mut k = d.as_known()?;
                if let Some(lo) = lo {
                    k = k.max(lo);
                }
                if let Some(hi) = hi {
                    k = k.min(hi);
                }
                Some(Dim::known(k))
            })
            .collect(),
        _ => None,
    };
    Ok(vec![Res::of(x).with_sym(sym)])
}

pub(super) fn cast(cx: &mut Cx<'_, '_, '_>, to: DType) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let sym = if !valued(to) {
        None
    } else if valued(x.dtype) {
        cx.values(0)
            .and_then(|v| v.iter().map(|d| cast_value(d, to)).collect())
    } else {
        // Floats to ints truncate toward zero.
        cx.floats(0).and_then(|v| {
            v.iter()
                .map(|f| {
                    if to == DType::Bool {
                        return Some(Dim::known((*f != 0.0) as i64));
                    }
                    let t = f.trunc();
                    (t.is_finite() && t.abs() < (1u64 << 62) as f64)
                        .then(|| cast_value(&Dim::known(t as i64), to))
                        .flatten()
                })
                .collect()
        })
    };
    Ok(vec![Res::new(to, x.dims.clone()).with_sym(sym)])
}

/// An integer value converted to `to`: known numbers wrap as C casts do; symbolic values
/// are taken to fit (they are sizes).
fn cast_value(d: &Dim, to: DType) -> Option<Dim> {
    let Some(k) = d.as_known() else {
        return (to != DType::Bool).then(|| d.clone());
    };
    Some(Dim::known(match to {
        DType::Bool => (k != 0) as i64,
        DType::I8 => k as i8 as i64,
        DType::U8 => k as u8 as i64,
        DType::I16 => k as i16 as i64,
        DType::U16 => k as u16 as i64,
        DType::I32 => k as i32 as i64,
        DType::U32 => k as u32 as i64,
        _ => k,
    }))
}

pub(super) fn is_inf(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    Ok(vec![Res::new(DType::Bool, cx.ty(0)?.dims.clone())])
}
