//! Window kernels on `[N, C, spatial...]` tensors with three or more static spatial dims
//! (3-D: video and volumes), f32 or f16: max, average and Lp pooling, and direct
//! (grouped) convolution with an optional bias. 1- and 2-D ones are the window and
//! implicit-GEMM kernels' ([`crate::conv`]), which unroll a 2-D window.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`], walking
//! the window's taps in a loop (the tap's coordinates decoded from its index by the static
//! kernel shape). A tap at `o * stride - pad_begin + k * dilation` counts where it lies in
//! the input; the semantics are the reference's (`rafter-reference`'s `pool` and `conv`):
//! - max: the first tap inside, then each later one that is greater (0 without taps);
//! - average: the sum over the taps inside, divided by their count, or with
//!   `count_include_pad` by the count of taps before the trailing pad's end (a window
//!   hanging past it, with `ceil_mode`, does not count those);
//! - Lp: `(sum over the taps inside of |x|^p)^(1/p)` for an integer `p` of 1 to 8;
//! - convolution: the bias plus the sum over the group's input channels and the taps
//!   inside of `x * w`, accumulated in f32 (a direct convolution: these are rare enough
//!   that an implicit GEMM's tiling is not worth a 3-D variant yet).
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

/// A generated N-D window kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct WindowNdKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Max,
    Average { include_pad: bool },
    Lp { p: u32 },
    Conv(ConvOp),
}

/// A convolution's operands and channel geometry.
#[derive(Debug, Clone, PartialEq)]
struct ConvOp {
    w: usize,
    bias: Option<Bias>,
    /// Input channels, output channels, groups.
    c: u32,
    m: u32,
    group: u32,
}

/// Where a convolution's bias comes from: a body input, or a small constant the compiler
/// folded into the body (selected by the output channel).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Bias {
    Binding(usize),
    Const(Vec<f32>),
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

/// Whether `body` is a window op this module generates rather than the 2-D kernels: a
/// `pool` or `conv` whose input has three or more spatial dims.
pub(crate) fn applies(body: &Graph) -> bool {
    body.nodes.first().is_some_and(|n| {
        matches!(n.op, Op::Pool { .. } | Op::Conv { .. })
            && n.input(0).is_some_and(|v| body.value(v).ty.rank() >= 5)
    })
}

/// Generates the body ([`applies`]): a pooling or a convolution.
pub(crate) fn generate(body: &Graph) -> R<WindowNdKernel> {
    match body.nodes.first().map(|n| &n.op) {
        Some(Op::Conv { .. }) => conv_nd(body),
        _ => pool_nd(body),
    }
}

/// Generates a body holding one `pool` (max without indices, average, Lp) of a body input
/// with static channel and spatial dims, its result the body's one output.
pub fn pool_nd(body: &Graph) -> Result<WindowNdKernel, String> {
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
    let kernel = u32s_attr(kernel_shape, input.len(), 1, "kernel_shape")?;
    let (strides, dilations, pad_begin, pad_end) =
        geometry(&kernel, strides, dilations, pads, auto_pad, (&input, &out))?;
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
    Ok(WindowNdKernel { spirv })
}

pub(crate) fn u32s(v: &[u64]) -> R<Vec<u32>> {
    v.iter()
        .map(|&d| u32::try_from(d).map_err(|_| format!("pool dim {d} exceeds 32 bits")))
        .collect()
}

/// A per-dim attribute of `n` entries (`default` each where empty), below 2^16.
pub(crate) fn u32s_attr(v: &[i64], n: usize, default: u32, what: &str) -> R<Vec<u32>> {
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

/// Strides, dilations, leading and trailing pads of a window op, shared by pooling and
/// convolution.
type Geometry = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>);

/// The window's [`Geometry`] from its attributes (empty lists default to 1); a zero window,
/// stride or dilation is refused.
pub(crate) fn geometry(
    kernel: &[u32],
    strides: &[i64],
    dilations: &[i64],
    pads: &[i64],
    auto_pad: AutoPad,
    (input, out): (&[u32], &[u32]),
) -> R<Geometry> {
    let n = input.len();
    let strides = u32s_attr(strides, n, 1, "strides")?;
    let dilations = u32s_attr(dilations, n, 1, "dilations")?;
    if kernel.contains(&0) || strides.contains(&0) || dilations.contains(&0) {
        return Err("a zero window, stride or dilation".into());
    }
    let (pad_begin, pad_end) =
        resolve_pads(pads, auto_pad, (input, out), (kernel, &strides, &dilations))?;
    Ok((strides, dilations, pad_begin, pad_end))
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
    let (o, rest) = grid::unflatten(b, u32, e.i, &l.out)?;
    let plane = rest;
    let in_plane: u32 = l.input.iter().product();
    let plane_id = plane;
    let plane = build(b.u_convert(u64, None, plane))?;
    let span = b.constant_bit64(u64, u64::from(in_plane));
    let base = build(b.i_mul(u64, None, plane, span))?;
    let v = match &l.kind {
        Kind::Conv(conv) => convolve(b, t, l, conv, (&o, plane_id), e.addrs)?,
        kind => {
            let taps: u32 = l.kernel.iter().product();
            let (zero_u, taps) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, taps));
            let zero = b.constant_bit32(f32, 0f32.to_bits());
            let accs = [(f32, zero), (f32, zero)];
            let sums = grid::range_loop(b, t, (zero_u, taps), &accs, &mut |b, k, acc| {
                let (at, inside, counted) = tap(b, t, l, &o, k)?;
                let flat = build(b.i_add(u64, None, base, at))?;
                let addr = grid::element_addr(b, u64, e.addrs[l.x], flat, l.elem.bytes())?;
                let v = elem::load(b, l.elem, f32, addr)?;
                accumulate(b, t, kind, (acc[0], acc[1]), v, (inside, counted))
            })?;
            finish(b, t, kind, sums[0], sums[1])?
        }
    };
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
    kind: &Kind,
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
        &Kind::Average { include_pad } => {
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
        &Kind::Lp { p } => {
            let a = build(b.ext_inst(f32, None, t.glsl, FABS, [Arg::IdRef(v)]))?;
            let mut pow = a;
            for _ in 1..p {
                pow = build(b.f_mul(f32, None, pow, a))?;
            }
            let add = build(b.select(f32, None, inside, pow, zero))?;
            Ok(vec![build(b.f_add(f32, None, acc, add))?, next_count])
        }
        Kind::Conv(_) => Err("a convolution is not accumulated as a pooling".into()),
    }
}

/// The pooled value from the walk's (value, count).
fn finish(b: &mut Builder, t: &Prelude, kind: &Kind, acc: Word, count: Word) -> R<Word> {
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
        &Kind::Lp { p } => {
            let inv = b.constant_bit32(f32, (1.0 / p as f32).to_bits());
            build(b.ext_inst(f32, None, t.glsl, POW, [Arg::IdRef(acc), Arg::IdRef(inv)]))
        }
        Kind::Conv(_) => Err("a convolution is not finished as a pooling".into()),
    }
}

/// Generates a body holding one `conv` of a body input with static channel and spatial
/// dims by a body-input filter `[M, C / group, kernel...]`, with an optional bias (a body
/// input or a folded constant), its result the body's one output.
pub fn conv_nd(body: &Graph) -> Result<WindowNdKernel, String> {
    let node = grid::one_node(body, "conv")?;
    let Op::Conv {
        ref kernel_shape,
        ref strides,
        ref pads,
        ref dilations,
        group,
        auto_pad,
    } = node.op
    else {
        return Err(format!("op `{}` is not a conv", node.op.name()));
    };
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the conv's result must be the body's one output".into());
    }
    let x = grid::body_input(body, node, 0, "conv input")?;
    let w = grid::body_input(body, node, 1, "conv filter")?;
    let (x_ty, w_ty) = (
        &body.value(body.inputs[x]).ty,
        &body.value(body.inputs[w]).ty,
    );
    let y_ty = &body.value(body.outputs[0]).ty;
    let elem = Elem::of(x_ty.dtype).map_err(|e| format!("the conv input is {e}"))?;
    if w_ty.dtype != x_ty.dtype || y_ty.dtype != x_ty.dtype {
        return Err("a conv kernel is generated on one element type".into());
    }
    let xd = u32s(&grid::static_dims_from(x_ty, 1, "conv input")?)?;
    let yd = u32s(&grid::static_dims_from(y_ty, 1, "conv output")?)?;
    let wd = u32s(&grid::static_dims(w_ty, "conv filter")?)?;
    grid::product_u32(
        &grid::static_dims_from(x_ty, 1, "conv input")?,
        "conv input",
    )?;
    grid::product_u32(
        &grid::static_dims_from(y_ty, 1, "conv output")?,
        "conv output",
    )?;
    let (c, m, n) = (xd[0], yd[0], xd.len() - 1);
    let groups = u32::try_from(group)
        .ok()
        .filter(|&g| g > 0 && c % g == 0 && m % g == 0);
    let group = groups.ok_or_else(|| format!("{group} groups of {c} -> {m} channels"))?;
    if wd.len() != n + 2 || wd[0] != m || wd[1] != c / group {
        return Err(format!(
            "filter {wd:?} for {c} -> {m} channels in {group} groups"
        ));
    }
    let kernel = wd[2..].to_vec();
    if !kernel_shape.is_empty() && u32s_attr(kernel_shape, n, 1, "kernel_shape")? != kernel {
        return Err("kernel_shape disagrees with the filter".into());
    }
    let bias = bias_operand(body, node, m)?;
    let (input, out) = (xd[1..].to_vec(), yd[1..].to_vec());
    let (strides, dilations, pad_begin, pad_end) =
        geometry(&kernel, strides, dilations, pads, auto_pad, (&input, &out))?;
    let layout = Layout {
        kind: Kind::Conv(ConvOp {
            w,
            bias,
            c,
            m,
            group,
        }),
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
    Ok(WindowNdKernel { spirv })
}

/// A convolution's optional bias (operand 2) for `m` output channels: a body input, or a
/// folded constant of `m` values; a bias computed in the body is refused.
pub(crate) fn bias_operand(body: &Graph, node: &rafter_ir::Node, m: u32) -> R<Option<Bias>> {
    let bias = match node.input(2).map(|v| &body.value(v).def) {
        None => return Ok(None),
        Some(rafter_ir::ValueDef::Input(i)) => Bias::Binding(*i),
        Some(rafter_ir::ValueDef::Const(id)) => Bias::Const(
            body.constant(*id)
                .to_f64s()
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        ),
        Some(_) => return Err("the conv bias is computed in the kernel".into()),
    };
    if let Bias::Const(v) = &bias {
        if v.len() != m as usize {
            return Err(format!("a bias of {} values for {m} channels", v.len()));
        }
    }
    Ok(Some(bias))
}

/// The convolution at output coordinates `o` of output plane `plane` (`n * M + m`): the
/// bias plus the walk over the group's channels and the taps (`j = c * taps + tap`).
fn convolve(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    conv: &ConvOp,
    (o, plane): (&[Word], Word),
    addrs: &[Word],
) -> R<Word> {
    let Prelude { f32, u32, u64, .. } = *t;
    let (img, m) = grid::div_mod(b, u32, plane, conv.m)?;
    let (cg, mg) = (conv.c / conv.group, conv.m / conv.group);
    let (g, _) = grid::div_mod(b, u32, m, mg)?;
    // The group's first input plane, n * C + g * C/group, and the filter's row m.
    let cc = b.constant_bit32(u32, conv.c);
    let first = build(b.i_mul(u32, None, img, cc))?;
    let cgc = b.constant_bit32(u32, cg);
    let gc = build(b.i_mul(u32, None, g, cgc))?;
    let first = build(b.i_add(u32, None, first, gc))?;
    let taps: u32 = l.kernel.iter().product();
    let in_plane: u32 = l.input.iter().product();
    let row = b.constant_bit32(u32, cg * taps);
    let w_row = build(b.i_mul(u32, None, m, row))?;
    let zero_u = b.constant_bit32(u32, 0);
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let sum = grid::range_loop(b, t, (zero_u, row), &[(f32, zero)], &mut |b, j, acc| {
        let (c, k) = grid::div_mod(b, u32, j, taps)?;
        let (at, inside, _) = tap(b, t, l, o, k)?;
        let ch = build(b.i_add(u32, None, first, c))?;
        let ch = build(b.u_convert(u64, None, ch))?;
        let span = b.constant_bit64(u64, u64::from(in_plane));
        let flat = build(b.i_mul(u64, None, ch, span))?;
        let flat = build(b.i_add(u64, None, flat, at))?;
        let xa = grid::element_addr(b, u64, addrs[l.x], flat, l.elem.bytes())?;
        let wi = build(b.i_add(u32, None, w_row, j))?;
        let wi = build(b.u_convert(u64, None, wi))?;
        let wa = grid::element_addr(b, u64, addrs[conv.w], wi, l.elem.bytes())?;
        let (xv, wv) = (
            elem::load(b, l.elem, f32, xa)?,
            elem::load(b, l.elem, f32, wa)?,
        );
        let p = build(b.f_mul(f32, None, xv, wv))?;
        let p = build(b.select(f32, None, inside, p, zero))?;
        Ok(vec![build(b.f_add(f32, None, acc[0], p))?])
    })?[0];
    match &conv.bias {
        None => Ok(sum),
        Some(bias) => {
            let v = bias_at(b, t, bias, m, (addrs, l.elem))?;
            build(b.f_add(f32, None, sum, v))
        }
    }
}

/// The bias of output channel `m` (a `u32`): read from its binding at `m`, or selected
/// among the folded constant's values.
pub(crate) fn bias_at(
    b: &mut Builder,
    t: &Prelude,
    bias: &Bias,
    m: Word,
    (addrs, elem): (&[Word], Elem),
) -> R<Word> {
    let Prelude { f32, u32, u64, .. } = *t;
    match bias {
        Bias::Binding(i) => {
            let m64 = build(b.u_convert(u64, None, m))?;
            let at = grid::element_addr(b, u64, addrs[*i], m64, elem.bytes())?;
            elem::load(b, elem, f32, at)
        }
        Bias::Const(values) => {
            let mut v = b.constant_bit32(f32, 0f32.to_bits());
            for (j, &x) in values.iter().enumerate() {
                let here = b.constant_bit32(u32, j as u32);
                let here = build(b.i_equal(t.bool, None, m, here))?;
                let x = b.constant_bit32(f32, x.to_bits());
                v = build(b.select(f32, None, here, x, v))?;
            }
            Ok(v)
        }
    }
}
