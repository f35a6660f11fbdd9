//! Max, average and Lp pooling of an f32 or f16 `[N, C, spatial...]` tensor with three or
//! more static spatial dims (3-D pooling: video and volumes); 1- and 2-D pooling is the
//! window kernel's ([`crate::conv`]), which unrolls its 2-D window.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`], walking
//! the window's taps in a loop (the tap's coordinates decoded from its index by the static
//! kernel shape). A tap at `o * stride - pad_begin + k * dilation` counts where it lies in
//! the input; the semantics are the reference's (`rafter-reference`'s `pool` module):
//! - max: the first tap inside, then each later one that is greater (0 without taps);
//! - average: the sum over the taps inside, divided by their count, or with
//!   `count_include_pad` by the count of taps before the trailing pad's end (a window
//!   hanging past it, with `ceil_mode`, does not count those);
//! - Lp: `(sum over the taps inside of |x|^p)^(1/p)` for an integer `p` of 1 to 8.
//!
//! The output's spatial dims are the IR's (shape inference applied `ceil_mode` and
//! `auto_pad`); the leading pads are resolved here as the reference resolves them.

use rafter_ir::{AutoPad, Graph, Op, PoolKind};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// GLSL.std.450 `FAbs` and `Sqrt` and `Pow`.
const FABS: u32 = 4;
const POW: u32 = 26;
const SQRT: u32 = 31;

/// A generated N-D pooling kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct PoolNdKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body input, then the output.
    pub spirv: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Max,
    Average { include_pad: bool },
    Lp { p: u32 },
}

/// Per spatial dim: input and output sizes, window, stride, dilation, pads.
struct Layout {
    kind: Kind,
    elem: Elem,
    x: usize,
    y: usize,
    input: Vec<u32>,
    out: Vec<u32>,
    kernel: Vec<u32>,
    strides: Vec<u32>,
    dilations: Vec<u32>,
    pad_begin: Vec<u32>,
    pad_end: Vec<u32>,
}

/// Whether `body` is a pooling this module generates rather than the window kernel: a
/// `pool` whose input has three or more spatial dims.
pub(crate) fn applies(body: &Graph) -> bool {
    body.nodes.first().is_some_and(|n| {
        matches!(n.op, Op::Pool { .. }) && n.input(0).is_some_and(|v| body.value(v).ty.rank() >= 5)
    })
}

/// Generates a body holding one `pool` (max without indices, average, Lp) of a body input
/// with static channel and spatial dims, its result the body's one output.
pub fn pool_nd(body: &Graph) -> Result<PoolNdKernel, String> {
    let node = grid::one_node(body, "pool")?;
    let Op::Pool {
        kind,
        ref kernel_shape,
        ref strides,
        ref pads,
        ref dilations,
        auto_pad,
        count_include_pad,
        p,
        ..
    } = node.op
    else {
        return Err(format!("op `{}` is not a pool", node.op.name()));
    };
    let kind = match kind {
        PoolKind::Max => Kind::Max,
        PoolKind::Average => Kind::Average {
            include_pad: count_include_pad,
        },
        PoolKind::Lp => Kind::Lp {
            p: u32::try_from(p)
                .ok()
                .filter(|p| (1..=8).contains(p))
                .ok_or_else(|| format!("Lp pooling with p = {p} is not generated (1 to 8 are)"))?,
        },
    };
    if node.outputs.len() != 1
        || body.outputs.len() != 1
        || node.outputs[0] != Some(body.outputs[0])
    {
        return Err("max pooling with indices is not generated yet".into());
    }
    let x = grid::body_input(body, node, 0, "pool input")?;
    let x_ty = &body.value(body.inputs[x]).ty;
    let y_ty = &body.value(body.outputs[0]).ty;
    let elem = Elem::of(x_ty.dtype).map_err(|e| format!("the pool input is {e}"))?;
    if y_ty.dtype != x_ty.dtype {
        return Err("the pool's result type differs from its input's".into());
    }
    let input = u32s(&grid::static_dims_from(x_ty, 2, "pool input")?)?;
    let out = u32s(&grid::static_dims_from(y_ty, 2, "pool output")?)?;
    grid::product_u32(
        &grid::static_dims_from(x_ty, 1, "pool input")?,
        "pool input",
    )?;
    grid::product_u32(
        &grid::static_dims_from(y_ty, 1, "pool output")?,
        "pool output",
    )?;
    let n = input.len();
    let kernel = u32s_attr(kernel_shape, n, 1, "kernel_shape")?;
    let strides = u32s_attr(strides, n, 1, "strides")?;
    let dilations = u32s_attr(dilations, n, 1, "dilations")?;
    if kernel.contains(&0) || strides.contains(&0) || dilations.contains(&0) {
        return Err("a zero window, stride or dilation".into());
    }
    let (pad_begin, pad_end) = resolve_pads(
        pads,
        auto_pad,
        (&input, &out),
        (&kernel, &strides, &dilations),
    )?;
    let layout = Layout {
        kind,
        elem,
        x,
        y: body.inputs.len(),
        input,
        out,
        kernel,
        strides,
        dilations,
        pad_begin,
        pad_end,
    };
    let spirv = grid::module(layout.y + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(PoolNdKernel { spirv })
}

fn u32s(v: &[u64]) -> R<Vec<u32>> {
    v.iter()
        .map(|&d| u32::try_from(d).map_err(|_| format!("pool dim {d} exceeds 32 bits")))
        .collect()
}

/// A per-dim attribute of `n` entries (`default` each where empty), below 2^16.
fn u32s_attr(v: &[i64], n: usize, default: u32, what: &str) -> R<Vec<u32>> {
    if v.is_empty() {
        return Ok(vec![default; n]);
    }
    if v.len() != n {
        return Err(format!("{what} {v:?} for {n} spatial dims"));
    }
    v.iter()
        .map(|&a| {
            u32::try_from(a)
                .ok()
                .filter(|&a| a < 1 << 16)
                .ok_or_else(|| format!("{what} entry {a} is not generated"))
        })
        .collect()
}

/// The leading and trailing pads per dim: explicit (`pads`, all begins then all ends), or
/// `auto_pad`'s as the reference computes them from the output size.
fn resolve_pads(
    pads: &[i64],
    auto_pad: AutoPad,
    (input, out): (&[u32], &[u32]),
    (k, s, d): (&[u32], &[u32], &[u32]),
) -> R<(Vec<u32>, Vec<u32>)> {
    let n = input.len();
    match auto_pad {
        AutoPad::NotSet => {
            let all = u32s_attr(pads, 2 * n, 0, "pads")?;
            Ok((all[..n].to_vec(), all[n..].to_vec()))
        }
        AutoPad::Valid => Ok((vec![0; n], vec![0; n])),
        AutoPad::SameUpper | AutoPad::SameLower => {
            let (mut b, mut e) = (vec![0; n], vec![0; n]);
            for i in 0..n {
                let eff = (k[i] - 1) * d[i] + 1;
                let total = ((out[i].max(1) - 1) * s[i] + eff).saturating_sub(input[i]);
                b[i] = if auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                e[i] = total - b[i];
            }
            Ok((b, e))
        }
    }
}

/// Output element `i`: its plane and coordinates, the walk over the taps, the result.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u32, u64, .. } = *t;
    let n = l.input.len();
    let mut o = vec![0; n];
    let mut rest = e.i;
    for dim in (0..n).rev() {
        let (q, c) = grid::div_mod(b, u32, rest, l.out[dim].max(1))?;
        o[dim] = c;
        rest = q;
    }
    let plane = rest;
    let in_plane: u32 = l.input.iter().product();
    let plane = build(b.u_convert(u64, None, plane))?;
    let span = b.constant_bit64(u64, u64::from(in_plane));
    let base = build(b.i_mul(u64, None, plane, span))?;
    let taps: u32 = l.kernel.iter().product();
    let (zero_u, taps) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, taps));
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let sums = grid::range_loop(
        b,
        t,
        (zero_u, taps),
        &[(f32, zero), (f32, zero)],
        &mut |b, k, acc| {
            let (at, inside, counted) = tap(b, t, l, &o, k)?;
            let flat = build(b.i_add(u64, None, base, at))?;
            let addr = grid::element_addr(b, u64, e.addrs[l.x], flat, l.elem.bytes())?;
            let v = elem::load(b, l.elem, f32, addr)?;
            accumulate(b, t, l.kind, (acc[0], acc[1]), v, (inside, counted))
        },
    )?;
    let v = finish(b, t, l.kind, sums[0], sums[1])?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.y], i, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// Tap `k` of the window of the output at `o`: its element's offset in the plane (a
/// `u64`, 0 where outside), whether it lies inside the input, and whether it counts for
/// an average with `count_include_pad` (before the trailing pad's end).
fn tap(b: &mut Builder, t: &Prelude, l: &Layout, o: &[Word], k: Word) -> R<(Word, Word, Word)> {
    let Prelude { u32, u64, bool, .. } = *t;
    let n = l.input.len();
    let mut rest = k;
    let mut inside = b.constant_true(bool);
    let mut counted = b.constant_true(bool);
    let mut flat = b.constant_bit32(u32, 0);
    let mut stride = 1u32;
    for dim in (0..n).rev() {
        let (q, kd) = grid::div_mod(b, u32, rest, l.kernel[dim])?;
        rest = q;
        // c' = o * s + k * d, the coordinate plus the leading pad (never negative).
        let s = b.constant_bit32(u32, l.strides[dim]);
        let d = b.constant_bit32(u32, l.dilations[dim]);
        let os = build(b.i_mul(u32, None, o[dim], s))?;
        let kd = build(b.i_mul(u32, None, kd, d))?;
        let c = build(b.i_add(u32, None, os, kd))?;
        let pb = b.constant_bit32(u32, l.pad_begin[dim]);
        let end = b.constant_bit32(u32, l.pad_begin[dim] + l.input[dim]);
        let pad_end = b.constant_bit32(u32, l.pad_begin[dim] + l.input[dim] + l.pad_end[dim]);
        let after = build(b.u_greater_than_equal(bool, None, c, pb))?;
        let before = build(b.u_less_than(bool, None, c, end))?;
        let here = build(b.logical_and(bool, None, after, before))?;
        inside = build(b.logical_and(bool, None, inside, here))?;
        let within = build(b.u_less_than(bool, None, c, pad_end))?;
        counted = build(b.logical_and(bool, None, counted, within))?;
        let c = build(b.i_sub(u32, None, c, pb))?;
        let st = b.constant_bit32(u32, stride);
        let term = build(b.i_mul(u32, None, c, st))?;
        flat = build(b.i_add(u32, None, flat, term))?;
        stride *= l.input[dim];
    }
    let zero = b.constant_bit32(u32, 0);
    let flat = build(b.select(u32, None, inside, flat, zero))?;
    Ok((build(b.u_convert(u64, None, flat))?, inside, counted))
}

/// The running (value, count) after a tap of value `v` (see the module docs).
fn accumulate(
    b: &mut Builder,
    t: &Prelude,
    kind: Kind,
    (acc, count): (Word, Word),
    v: Word,
    (inside, counted): (Word, Word),
) -> R<Vec<Word>> {
    let Prelude { f32, bool, .. } = *t;
    let (zero, one) = (
        b.constant_bit32(f32, 0f32.to_bits()),
        b.constant_bit32(f32, 1f32.to_bits()),
    );
    let inc = build(b.select(f32, None, inside, one, zero))?;
    let next_count = build(b.f_add(f32, None, count, inc))?;
    match kind {
        Kind::Max => {
            let none = build(b.f_ord_equal(bool, None, count, zero))?;
            let greater = build(b.f_ord_greater_than(bool, None, v, acc))?;
            let take = build(b.logical_or(bool, None, none, greater))?;
            let take = build(b.logical_and(bool, None, inside, take))?;
            Ok(vec![build(b.select(f32, None, take, v, acc))?, next_count])
        }
        Kind::Average { include_pad } => {
            let add = build(b.select(f32, None, inside, v, zero))?;
            let sum = build(b.f_add(f32, None, acc, add))?;
            let count = if include_pad {
                let inc = build(b.select(f32, None, counted, one, zero))?;
                build(b.f_add(f32, None, count, inc))?
            } else {
                next_count
            };
            Ok(vec![sum, count])
        }
        Kind::Lp { p } => {
            let a = build(b.ext_inst(f32, None, t.glsl, FABS, [Arg::IdRef(v)]))?;
            let mut pow = a;
            for _ in 1..p {
                pow = build(b.f_mul(f32, None, pow, a))?;
            }
            let add = build(b.select(f32, None, inside, pow, zero))?;
            Ok(vec![build(b.f_add(f32, None, acc, add))?, next_count])
        }
    }
}

/// The pooled value from the walk's (value, count).
fn finish(b: &mut Builder, t: &Prelude, kind: Kind, acc: Word, count: Word) -> R<Word> {
    let Prelude { f32, bool, .. } = *t;
    match kind {
        Kind::Max => {
            // No tap inside: the reference's default, 0.
            let zero = b.constant_bit32(f32, 0f32.to_bits());
            let none = build(b.f_ord_equal(bool, None, count, zero))?;
            build(b.select(f32, None, none, zero, acc))
        }
        Kind::Average { .. } => build(b.f_div(f32, None, acc, count)),
        Kind::Lp { p: 1 } => Ok(acc),
        Kind::Lp { p: 2 } => build(b.ext_inst(f32, None, t.glsl, SQRT, [Arg::IdRef(acc)])),
        Kind::Lp { p } => {
            let inv = b.constant_bit32(f32, (1.0 / p as f32).to_bits());
            build(b.ext_inst(f32, None, t.glsl, POW, [Arg::IdRef(acc), Arg::IdRef(inv)]))
        }
    }
}
