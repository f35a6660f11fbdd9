//! ONNX `Pad` of a static f32 or f16 tensor with constant pads (and axes), in every mode:
//! `constant` (the value a constant or read from its binding at run time), `edge`,
//! `reflect` and `wrap`; negative pads crop.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]: per dim,
//! output coordinate `o` reads input coordinate `x = o - pad_begin`, which the mode maps
//! into the input (edge: clamped; reflect: mirrored about the ends without repeating
//! them; wrap: modulo the dim, taken on `x + k·n >= 0` for a constant `k`, so no signed
//! remainder), or, for `constant`, marks the element as padding. The mapped coordinate is
//! clamped into the input in every mode, so no read leaves the buffer whatever the pads.

use rafter_ir::{Graph, Op, PadMode, ValueDef};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated pad kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct PadKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// The value padding takes in `constant` mode.
enum Fill {
    Const(f32),
    Binding(usize),
}

struct Layout {
    elem: Elem,
    data: usize,
    mode: PadMode,
    fill: Fill,
    /// Per dim: input size, output size, leading and trailing pads (negative: a crop).
    dims: Vec<(u64, u32, i64, i64)>,
    bindings: usize,
}

/// Generates a body holding one `pad` of a static f32/f16 body input with constant pads,
/// its result the body's one output.
pub fn pad(body: &Graph) -> Result<PadKernel, String> {
    let node = grid::one_node(body, "pad")?;
    let Op::Pad { mode } = node.op else {
        return Err(format!("op `{}` is not a pad", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "pad data")?;
    let ints = |i: usize| -> R<Option<Vec<i64>>> {
        let Some(v) = node.input(i) else {
            return Ok(None);
        };
        match body.value(v).def {
            ValueDef::Const(c) => body
                .constant(c)
                .to_i64s()
                .map(Some)
                .ok_or_else(|| format!("pad operand {i} is not integers")),
            _ => Err(format!(
                "pad operand {i} is not a constant (run-time pads are not generated)"
            )),
        }
    };
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of(ty.dtype).map_err(|e| format!("pad data is {e}"))?;
    let in_dims = grid::static_dims(ty, "pad data")?;
    let rank = in_dims.len();
    let pads = ints(1)?.ok_or("pad without pads")?;
    let axes = match ints(3)? {
        Some(a) => a
            .iter()
            .map(|&a| grid::norm_axis(a, rank, "pad"))
            .collect::<R<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", pads.len(), axes.len()));
    }
    let fill = match node.input(2).map(|v| &body.value(v).def) {
        None => Fill::Const(0.0),
        Some(ValueDef::Const(c)) => match body.constant(*c).to_f64s().as_slice() {
            [v] => Fill::Const(*v as f32),
            _ => return Err("the pad value is not one number".into()),
        },
        Some(ValueDef::Input(b)) => Fill::Binding(*b),
        Some(_) => return Err("the pad value is computed in the kernel".into()),
    };
    if let Fill::Binding(b) = fill {
        if body.value(body.inputs[b]).ty.dtype != ty.dtype {
            return Err("the pad value's type differs from the data's".into());
        }
    }
    let Some(&out) = body.outputs.first().filter(|_| body.outputs.len() == 1) else {
        return Err("a pad kernel has one output".into());
    };
    if node.outputs.first().copied().flatten() != Some(out) {
        return Err("the pad's result must be the body's one output".into());
    }
    let out_dims = grid::static_dims(&body.value(out).ty, "pad result")?;
    grid::product_u32(&out_dims, "pad result")?;
    grid::product_u32(&in_dims, "pad data")?;
    let mut lead = vec![0i64; rank];
    let mut total = vec![0i64; rank];
    for (k, &a) in axes.iter().enumerate() {
        lead[a] = pads[k];
        total[a] = pads[k] + pads[k + axes.len()];
    }
    if pads.iter().any(|p| p.unsigned_abs() >= 1 << 31) {
        return Err(format!("pads {pads:?} beyond 32 bits"));
    }
    for a in 0..rank {
        if out_dims.len() != rank || in_dims[a] as i64 + total[a] != out_dims[a] as i64 {
            return Err(format!(
                "pad of {in_dims:?} by {pads:?} does not give {out_dims:?}"
            ));
        }
        if in_dims[a] == 0 && out_dims[a] > 0 && mode != PadMode::Constant {
            return Err(format!("{mode:?} padding of an empty dim"));
        }
    }
    let layout = Layout {
        elem,
        data,
        mode,
        fill,
        dims: (0..rank)
            .map(|a| (in_dims[a], out_dims[a] as u32, lead[a], total[a] - lead[a]))
            .collect(),
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(PadKernel { spirv })
}

/// Output element `i`: per dim (innermost first) its coordinate mapped into the input, the
/// read (or the fill where a `constant` pad lies outside), the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let mut flat = b.constant_bit64(u64, 0);
    let mut inside = b.constant_true(bool);
    let mut rest = e.i;
    let mut stride = 1u64;
    for &(n, size, lead, trail) in l.dims.iter().rev() {
        let (q, o) = grid::div_mod(b, u32, rest, size.max(1))?;
        rest = q;
        let o = build(b.u_convert(u64, None, o))?;
        let lead_c = b.constant_bit64(u64, lead as u64);
        let x = build(b.i_sub(u64, None, o, lead_c))?;
        let (x, ok) = map_coord(b, t, l.mode, x, (n, lead, trail))?;
        if let Some(ok) = ok {
            inside = build(b.logical_and(bool, None, inside, ok))?;
        }
        let s = b.constant_bit64(u64, stride);
        let term = build(b.i_mul(u64, None, x, s))?;
        flat = build(b.i_add(u64, None, flat, term))?;
        stride *= n.max(1);
    }
    let src = grid::element_addr(b, u64, e.addrs[l.data], flat, l.elem.bytes())?;
    let v = elem::load(b, l.elem, f32, src)?;
    let v = if l.mode == PadMode::Constant {
        let fill = match l.fill {
            Fill::Const(c) => b.constant_bit32(f32, c.to_bits()),
            Fill::Binding(binding) => elem::load(b, l.elem, f32, e.addrs[binding])?,
        };
        build(b.select(f32, None, inside, v, fill))?
    } else {
        v
    };
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// Input coordinate `x` (a `u64` holding a signed value) mapped by `mode` into `0..n` and
/// clamped there, and for `constant` whether it was inside. ONNX crops first (negative
/// pads), then pads: only `wrap` sees the difference (its period is the cropped length).
fn map_coord(
    b: &mut Builder,
    t: &Prelude,
    mode: PadMode,
    x: Word,
    (n, lead, trail): (u64, i64, i64),
) -> R<(Word, Option<Word>)> {
    let Prelude { u64, bool, .. } = *t;
    let zero = b.constant_bit64(u64, 0);
    let last = b.constant_bit64(u64, n.saturating_sub(1));
    let nc = b.constant_bit64(u64, n.max(1));
    let (x, ok) = match mode {
        PadMode::Constant => (x, Some(build(b.u_less_than(bool, None, x, nc))?)),
        PadMode::Edge => (x, None),
        PadMode::Reflect => {
            // x < 0: -x; x > n - 1: 2(n - 1) - x.
            let neg = build(b.s_less_than(bool, None, x, zero))?;
            let mirrored = build(b.i_sub(u64, None, zero, x))?;
            let x = build(b.select(u64, None, neg, mirrored, x))?;
            let over = build(b.s_greater_than(bool, None, x, last))?;
            let twice = b.constant_bit64(u64, 2 * n.saturating_sub(1));
            let back = build(b.i_sub(u64, None, twice, x))?;
            (build(b.select(u64, None, over, back, x))?, None)
        }
        PadMode::Wrap => {
            // The cropped range lo..lo + m; x - lo >= -2^32 here (pads fit 32 bits), so
            // adding 2^32 rounded up to a multiple of m makes it non-negative without
            // changing it modulo m.
            let lo = (-lead).max(0) as u64;
            let m = n.saturating_sub(lo + (-trail).max(0) as u64).max(1);
            let k = (1u64 << 32).div_ceil(m) * m;
            let shift = b.constant_bit64(u64, k.wrapping_sub(lo));
            let shifted = build(b.i_add(u64, None, x, shift))?;
            let mc = b.constant_bit64(u64, m);
            let r = build(b.u_mod(u64, None, shifted, mc))?;
            let loc = b.constant_bit64(u64, lo);
            (build(b.i_add(u64, None, r, loc))?, None)
        }
    };
    // Clamp into 0..n (signed), so no read leaves the input whatever the mode or pads.
    let neg = build(b.s_less_than(bool, None, x, zero))?;
    let x = build(b.select(u64, None, neg, zero, x))?;
    let over = build(b.s_greater_than(bool, None, x, last))?;
    Ok((build(b.select(u64, None, over, last, x))?, ok))
}
