//! ONNX `Slice` of a tensor of any element type (copied as bits) with constant starts,
//! ends, axes and steps, static dims from the first sliced axis inward (the leading axes
//! nothing slices may be symbolic: a batch, a sequence): the split of a fused QKV
//! projection before contrib `Attention` (BERT optimised by ONNX Runtime, the GenAI
//! builder's packed QKV), a sequence cut, a reversal (negative step).
//!
//! One invocation per output element, in a grid-stride loop over the count param (the
//! elementwise launch, [`crate::grid`]). With the slice resolved at generation time,
//! output coordinate `c_d` reads input element `base + sum_d c_d * step_d * stride_d`, where
//! `base = sum_d start_d * stride_d`. A negative step makes its term negative: the sum is
//! taken in wrapping 64-bit unsigned arithmetic, whose result is the non-negative index
//! (no signed division or remainder anywhere: NVIDIA has none for negative values).

use rafter_ir::{Graph, Op, ValueDef};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid;
use crate::matmul::{build, Prelude, R};

/// A generated slice kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct SliceKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// The resolved slice: where the data is bound, and per output dim its size and the input
/// element step (negative for a negative slice step).
struct Layout {
    elem: Elem,
    data: usize,
    bindings: usize,
    /// The first element read, `sum_d start_d * stride_d`.
    base: u64,
    /// Per output dim from the first sliced one: its size and the input elements one step
    /// along it moves.
    dims: Vec<(u32, i64)>,
    /// With leading axes nothing slices: the input elements one step of their combined
    /// index moves (the rest of the element index past `dims`).
    outer: Option<u64>,
}

/// Generates a body holding one `slice` of a static f32/f16 body input with constant
/// starts, ends and optional axes and steps, its result the body's one output.
pub fn slice(body: &Graph) -> Result<SliceKernel, String> {
    let node = grid::one_node(body, "slice")?;
    if !matches!(node.op, Op::Slice) {
        return Err(format!("op `{}` is not a slice", node.op.name()));
    }
    let data = grid::body_input(body, node, 0, "slice data")?;
    let constant = |i: usize| -> R<Option<Vec<i64>>> {
        let Some(v) = node.input(i) else {
            return Ok(None);
        };
        let value = body.value(v);
        match value.def {
            ValueDef::Const(c) => body.constant(c).to_i64s().map(Some).ok_or_else(|| {
                format!(
                    "slice operand {i} (%{}) is {}, not integers",
                    value.name, value.ty.dtype
                )
            }),
            _ => Err(format!(
                "slice operand {i} (%{}) is not a constant (a run-time slice is not \
                 generated)",
                value.name
            )),
        }
    };
    let starts = constant(1)?.ok_or("slice without starts")?;
    let ends = constant(2)?.ok_or("slice without ends")?;
    let in_ty = &body.value(body.inputs[data]).ty;
    let rank = in_ty.rank();
    let axes = constant(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = constant(4)?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(format!(
            "slice starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} differ \
             in length"
        ));
    }
    let elem = crate::bitcast::raw(in_ty.dtype);
    let norm = |axis: i64| {
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        usize::try_from(a)
            .ok()
            .filter(|&a| a < rank)
            .ok_or_else(|| format!("slice axis {axis} outside rank {rank}"))
    };
    // An axis taken whole (start 0, step 1, an end past any size) is not sliced.
    let whole = |k: usize| starts[k] == 0 && steps[k] == 1 && ends[k] >= i64::from(i32::MAX);
    let mut sliced = Vec::with_capacity(axes.len());
    for (k, &axis) in axes.iter().enumerate() {
        if !whole(k) {
            sliced.push(norm(axis)?);
        }
    }
    // Leading axes nothing slices may be symbolic (a batch, a sequence): the kernel walks
    // them as one outer index, never needing their sizes.
    let lead = (0..rank).find(|a| sliced.contains(a)).unwrap_or(rank);
    let Some(&out) = body.outputs.first().filter(|_| body.outputs.len() == 1) else {
        return Err("a slice kernel has one output".into());
    };
    if node.outputs.first().copied().flatten() != Some(out) {
        return Err("the slice's result must be the body's one output".into());
    }
    let out_ty = &body.value(out).ty;
    if out_ty.rank() != rank || in_ty.dims[..lead] != out_ty.dims[..lead] {
        return Err(format!(
            "slice of {in_ty} to {out_ty}: the leading dims differ"
        ));
    }
    let inner_ty = |ty: &rafter_ir::TensorType| rafter_ir::TensorType {
        dtype: ty.dtype,
        dims: ty.dims[lead..].to_vec(),
    };
    let in_dims = grid::static_dims(&inner_ty(in_ty), "slice data")?;
    let out_dims = grid::static_dims(&inner_ty(out_ty), "slice result")?;
    let rank = rank - lead;
    // The cuts past the leading axes: (axis from `lead`, start, end, step).
    let mut cuts = Vec::with_capacity(axes.len());
    for (k, &axis) in axes.iter().enumerate() {
        let a = norm(axis)?;
        if a >= lead {
            cuts.push((a - lead, starts[k], ends[k], steps[k]));
        }
    }
    if in_dims
        .iter()
        .chain(&out_dims)
        .any(|&d| d > u32::MAX as u64)
    {
        return Err(format!(
            "slice of dims {in_dims:?} to {out_dims:?}: a dim exceeds 32 bits"
        ));
    }
    let count: u64 = out_dims.iter().product();
    if count > u64::from(u32::MAX) {
        return Err(format!(
            "slice result of {count} elements exceeds 32-bit indexing"
        ));
    }
    // Per input axis: first index and step; untouched axes run 0.. with step 1.
    let mut first = vec![0i64; rank];
    let mut step = vec![1i64; rank];
    let mut seen = vec![false; rank];
    for &(a, start, end, s) in &cuts {
        if std::mem::replace(&mut seen[a], true) {
            return Err(format!("slice axis {} repeated", a + lead));
        }
        let d = in_dims[a] as i64;
        if s == 0 {
            return Err(format!("slice step 0 on axis {a}"));
        }
        let start = if start < 0 {
            start.saturating_add(d)
        } else {
            start
        };
        first[a] = if s > 0 {
            start.clamp(0, d)
        } else {
            start.max(0).min(d - 1)
        };
        step[a] = s;
        // The result type must hold the positions ONNX visits; the kernel trusts it.
        let end = if end < 0 { end.saturating_add(d) } else { end };
        let visits = if s > 0 {
            let e = end.clamp(0, d);
            ((e - first[a]).max(0) + s - 1) / s
        } else {
            let e = end.max(-1).min(d - 1);
            ((first[a] - e).max(0) - s - 1) / -s
        };
        if visits as u64 != out_dims[a] {
            return Err(format!(
                "slice axis {a} visits {visits} positions, the result dim is {}",
                out_dims[a]
            ));
        }
    }
    for a in 0..rank {
        if !seen[a] && in_dims[a] != out_dims[a] {
            return Err(format!("slice changes unsliced axis {a}"));
        }
    }
    // Row-major input strides; the base and per-dim moves in elements.
    let mut stride = vec![1i64; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        stride[a] = stride[a + 1] * in_dims[a + 1] as i64;
    }
    let base = (0..rank).map(|a| first[a] * stride[a]).sum::<i64>() as u64;
    let dims = (0..rank)
        .map(|a| (out_dims[a] as u32, step[a] * stride[a]))
        .collect();
    let layout = Layout {
        elem,
        data,
        bindings: body.inputs.len() + 1,
        base,
        dims,
        outer: (lead > 0).then(|| in_dims.iter().product::<u64>()),
    };
    let spirv = grid::module(layout.bindings, |b, t, e| {
        element(b, t, &layout, e.addrs, e.i)
    })?;
    Ok(SliceKernel { spirv })
}

/// Output element `i`: its coordinates, the input element they read, the copy.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word], i: Word) -> R<()> {
    let Prelude { u32, u64, .. } = *t;
    let mut at = b.constant_bit64(u64, l.base);
    // Innermost dim first: c_d = (i / divisor) % size, all unsigned.
    let mut divisor = 1u64;
    for &(size, moves) in l.dims.iter().rev() {
        if size > 1 && moves != 0 {
            let mut c = i;
            if divisor != 1 {
                let d = b.constant_bit32(u32, divisor as u32);
                c = build(b.u_div(u32, None, c, d))?;
            }
            let n = b.constant_bit32(u32, size);
            c = build(b.u_mod(u32, None, c, n))?;
            let c = build(b.u_convert(u64, None, c))?;
            // Two's complement: adding `c * (moves as u64)` wraps to `at + c * moves`.
            let m = b.constant_bit64(u64, moves as u64);
            let term = build(b.i_mul(u64, None, c, m))?;
            at = build(b.i_add(u64, None, at, term))?;
        }
        divisor *= u64::from(size);
    }
    if let Some(moves) = l.outer {
        // The leading axes' combined index: what lies past the sliced dims.
        let d = b.constant_bit32(u32, divisor.max(1) as u32);
        let c = build(b.u_div(u32, None, i, d))?;
        let c = build(b.u_convert(u64, None, c))?;
        let m = b.constant_bit64(u64, moves);
        let term = build(b.i_mul(u64, None, c, m))?;
        at = build(b.i_add(u64, None, at, term))?;
    }
    let esize = b.constant_bit64(u64, l.elem.bytes() as u64);
    let off = build(b.i_mul(u64, None, at, esize))?;
    let src = build(b.i_add(u64, None, addrs[l.data], off))?;
    let i64t = b.type_int(64, 1);
    let v = elem::load_int(b, l.elem, i64t, src)?;
    let i64 = build(b.u_convert(u64, None, i))?;
    let off = build(b.i_mul(u64, None, i64, esize))?;
    let dst = build(b.i_add(u64, None, addrs[l.bindings - 1], off))?;
    elem::store_int(b, l.elem, i64t, dst, v)
}
