//! The elementwise tail fused after a per-element window kernel (a transposed
//! convolution's `relu`, a decoder's `sigmoid`, a per-channel scale and shift): the
//! matmul's epilogue chain ([`crate::matmul::epilogue`]) applied to one output element's
//! value, with operands that one output channel selects (a scalar, a per-channel binding
//! or folded constant). Operands indexed by position are refused: these kernels keep
//! no C matrix to index them by.

use rafter_ir::{BinaryOp, Graph, Node, TensorType, ValueId};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid;
use crate::matmul::{build, epilogue, Activation, CAxes, Prelude, Src, Step, R};

/// A parsed tail: its steps and the constant rows its `ConstRow` operands index.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tail {
    steps: Vec<Step>,
    const_rows: Vec<Vec<f32>>,
}

/// The tail `rest` after the value `y` (of type `c`, channels on axis 1), ending in the
/// body's one output; every operand must be one element or one value per channel.
pub(crate) fn parse(body: &Graph, rest: &[Node], y: ValueId, c: &TensorType) -> R<Tail> {
    let axes = CAxes {
        row: 1,
        col_is_last: false,
    };
    let mut const_rows = Vec::new();
    let (steps, last) = epilogue(body, rest, y, c, axes, &mut const_rows)?;
    if body.outputs != [last] {
        return Err("the body's one output must be the end of the fused tail".into());
    }
    for step in &steps {
        let srcs: Vec<&Src> = match step {
            Step::Binary(_, s, _) => vec![s],
            Step::Clip(lo, hi) => lo.iter().chain(hi.iter()).collect(),
            _ => Vec::new(),
        };
        if let Some(s) = srcs.iter().find(|s| !per_channel(s)) {
            return Err(format!(
                "a fused operand read as {s:?}: only scalars and per-channel operands \
                 follow this kernel"
            ));
        }
    }
    Ok(Tail { steps, const_rows })
}

/// Whether `s` is one element or one value per output channel.
fn per_channel(s: &Src) -> bool {
    matches!(
        s,
        Src::Const(_) | Src::Scalar(_) | Src::PerRow(_) | Src::ConstRow(_)
    )
}

/// `tail` applied to the value `x` of an element of output channel `m` (a `u32`);
/// `addrs` are the bindings' addresses, each of `elem`.
pub(crate) fn apply(
    b: &mut Builder,
    t: &Prelude,
    tail: &Tail,
    (x, m): (Word, Word),
    (addrs, elem): (&[Word], Elem),
) -> R<Word> {
    let Prelude { f32, bool, .. } = *t;
    let mut x = x;
    for step in &tail.steps {
        let load = |b: &mut Builder, s: &Src| operand(b, t, tail, s, m, (addrs, elem));
        x = match step {
            Step::Round => elem::round_to_half(b, f32, x)?,
            Step::Relu => {
                // `x < 0 ? 0 : x`, which keeps NaN.
                let zero = b.constant_bit32(f32, 0);
                let neg = build(b.f_ord_less_than(bool, None, x, zero))?;
                build(b.select(f32, None, neg, zero, x))?
            }
            Step::Activation(act) => {
                let mut math = crate::epilogue_math::Math {
                    b,
                    f32,
                    bool,
                    glsl: t.glsl,
                };
                match act {
                    Activation::Sigmoid => math.sigmoid(x)?,
                    Activation::Tanh => math.tanh(x)?,
                    Activation::Gelu { tanh_form } => math.gelu(x, *tanh_form)?,
                }
            }
            Step::Clip(lo, hi) => {
                if let Some(lo) = lo {
                    let lo = load(b, lo)?;
                    let below = build(b.f_ord_less_than(bool, None, x, lo))?;
                    x = build(b.select(f32, None, below, lo, x))?;
                }
                if let Some(hi) = hi {
                    let hi = load(b, hi)?;
                    let above = build(b.f_ord_greater_than(bool, None, x, hi))?;
                    x = build(b.select(f32, None, above, hi, x))?;
                }
                x
            }
            Step::Binary(op, s, x_left) => {
                let s = load(b, s)?;
                let (l, r) = if *x_left { (x, s) } else { (s, x) };
                match op {
                    BinaryOp::Add => build(b.f_add(f32, None, l, r))?,
                    BinaryOp::Sub => build(b.f_sub(f32, None, l, r))?,
                    BinaryOp::Mul => build(b.f_mul(f32, None, l, r))?,
                    BinaryOp::Div => build(b.f_div(f32, None, l, r))?,
                    _ => return Err(format!("fused op {op:?} is not generated")),
                }
            }
        };
    }
    Ok(x)
}

/// The value of operand `s` for output channel `m`.
fn operand(
    b: &mut Builder,
    t: &Prelude,
    tail: &Tail,
    s: &Src,
    m: Word,
    (addrs, elem): (&[Word], Elem),
) -> R<Word> {
    let Prelude { f32, u32, u64, .. } = *t;
    let at = |b: &mut Builder, i: usize, index: Word| -> R<Word> {
        let index = build(b.u_convert(u64, None, index))?;
        let addr = grid::element_addr(b, u64, addrs[i], index, elem.bytes())?;
        elem::load(b, elem, f32, addr)
    };
    match s {
        Src::Const(v) => Ok(b.constant_bit32(f32, v.to_bits())),
        Src::Scalar(i) => {
            let zero = b.constant_bit32(u32, 0);
            at(b, *i, zero)
        }
        Src::PerRow(i) => at(b, *i, m),
        Src::ConstRow(k) => {
            let mut v = b.constant_bit32(f32, 0f32.to_bits());
            for (j, &c) in tail.const_rows[*k].iter().enumerate() {
                let here = b.constant_bit32(u32, j as u32);
                let here = build(b.i_equal(t.bool, None, m, here))?;
                let c = b.constant_bit32(f32, c.to_bits());
                v = build(b.select(f32, None, here, c, v))?;
            }
            Ok(v)
        }
        other => Err(format!("a fused operand read as {other:?}")),
    }
}
