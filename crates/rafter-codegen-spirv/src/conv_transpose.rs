//! ONNX `ConvTranspose` (the IR's `conv_transpose`) on `[N, C, spatial...]` tensors with
//! one to three (any number of) static spatial dims, f32 or f16: strides, dilations,
//! explicit pads, `output_padding`, `output_shape` and `auto_pad`, groups, and an optional
//! bias (a body input or a folded constant).
//!
//! The reference scatters: each input position adds `x * w` at output coordinate
//! `i * stride - pad_begin + k * dilation` (its col2im). A GPU scatter would need atomic
//! float adds, which Vulkan does not promise, so this kernel *gathers* instead: one
//! invocation per output element `y[n, m, o...]`, in the grid-stride loop of
//! [`crate::grid`], walks the group's input channels and the window's taps and keeps the
//! taps whose input coordinate `i = (o + pad_begin - k * dilation) / stride` is a whole
//! number inside the input. Each output is then written once, by one invocation, with the
//! same sum as the reference's (in another order, accumulated in f32).
//!
//! A fused elementwise tail (`relu`, `sigmoid`, scalar or per-channel operands: see
//! [`crate::tail`]) is applied to each element before it is stored.
//!
//! The output geometry (`pad_begin` per dim, which may be negative where `output_shape`
//! asks for more than the full output) is resolved as the reference's
//! `conv_transpose_geometry` resolves it, and checked against the IR's output type.

use rafter_ir::{AutoPad, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};
use crate::tail::{self, Tail};
use crate::window_nd::{bias_at, bias_operand, u32s, u32s_attr, Bias};

/// A generated transposed convolution; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct ConvTransposeKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// Everything the emitter needs, all static.
struct Layout {
    elem: Elem,
    /// Bindings of x, w, and the output.
    x: usize,
    w: usize,
    y: usize,
    bias: Option<Bias>,
    /// Input channels, output channels, groups.
    c: u32,
    m: u32,
    group: u32,
    input: Vec<u32>,
    out: Vec<u32>,
    geom: Geometry,
    /// The fused elementwise ops after the convolution (none: empty).
    tail: Tail,
}

/// Per spatial dim: window, stride, dilation, and where output coordinate 0 sits
/// (`pad_begin`, possibly negative).
#[derive(Debug, Clone, PartialEq)]
struct Geometry {
    kernel: Vec<u32>,
    strides: Vec<u32>,
    dilations: Vec<u32>,
    pad_begin: Vec<i32>,
}

/// The attributes of a `conv_transpose` node the geometry depends on.
struct Attrs<'a> {
    strides: &'a [i64],
    pads: &'a [i64],
    dilations: &'a [i64],
    auto_pad: AutoPad,
    output_padding: &'a [i64],
    output_shape: &'a [i64],
}

/// Generates a body holding one `conv_transpose` of a body input with static channel and
/// spatial dims by a body-input filter `[C, M / group, kernel...]`, with an optional bias,
/// its result the body's one output.
pub fn conv_transpose(body: &Graph) -> Result<ConvTransposeKernel, String> {
    let layout = layout(body)?;
    let spirv = grid::module(layout.y + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(ConvTransposeKernel { spirv })
}

/// Checks the body and resolves its [`Layout`].
fn layout(body: &Graph) -> R<Layout> {
    let Some((node, rest)) = body.nodes.split_first() else {
        return Err("the body is empty".into());
    };
    let Op::ConvTranspose {
        ref kernel_shape,
        ref strides,
        ref pads,
        ref dilations,
        group,
        auto_pad,
        ref output_padding,
        ref output_shape,
    } = node.op
    else {
        return Err(format!("op `{}` is not a conv_transpose", node.op.name()));
    };
    let [Some(y)] = node.outputs.as_slice() else {
        return Err("the conv_transpose must have one result".into());
    };
    let y_ty = &body.value(*y).ty;
    let tail = if rest.is_empty() {
        if body.outputs != [*y] {
            return Err("the conv_transpose's result must be the body's one output".into());
        }
        Tail::default()
    } else {
        tail::parse(body, rest, *y, y_ty)?
    };
    let x = grid::body_input(body, node, 0, "conv_transpose input")?;
    let w = grid::body_input(body, node, 1, "conv_transpose filter")?;
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    let (x_ty, w_ty) = (ty(x), ty(w));
    let elem = Elem::of(x_ty.dtype).map_err(|e| format!("the conv_transpose input is {e}"))?;
    if w_ty.dtype != x_ty.dtype || y_ty.dtype != x_ty.dtype {
        return Err("a conv_transpose kernel is generated on one element type".into());
    }
    let xs = grid::static_dims_from(x_ty, 1, "conv_transpose input")?;
    let ys = grid::static_dims_from(y_ty, 1, "conv_transpose output")?;
    grid::product_u32(&xs, "conv_transpose input")?;
    grid::product_u32(&ys, "conv_transpose output")?;
    let (xd, yd) = (u32s(&xs)?, u32s(&ys)?);
    let ws = grid::static_dims(w_ty, "conv_transpose filter")?;
    grid::product_u32(&ws, "conv_transpose filter")?;
    let wd = u32s(&ws)?;
    let (c, n) = (xd[0], xd.len() - 1);
    let group = u32::try_from(group)
        .ok()
        .filter(|&g| g > 0 && c % g == 0)
        .ok_or_else(|| format!("{group} groups of {c} input channels"))?;
    if wd.len() != n + 2 || wd[0] != c || wd[1].checked_mul(group) != Some(yd[0]) {
        return Err(format!(
            "filter {wd:?} for {c} -> {} channels in {group} groups",
            yd[0]
        ));
    }
    let kernel = wd[2..].to_vec();
    if !kernel_shape.is_empty() && u32s_attr(kernel_shape, n, 1, "kernel_shape")? != kernel {
        return Err("kernel_shape disagrees with the filter".into());
    }
    let attrs = Attrs {
        strides,
        pads,
        dilations,
        auto_pad,
        output_padding,
        output_shape,
    };
    let (input, out) = (xd[1..].to_vec(), yd[1..].to_vec());
    let geom = geometry(kernel, &attrs, &input, &out)?;
    Ok(Layout {
        elem,
        x,
        w,
        y: body.inputs.len(),
        bias: bias_operand(body, node, yd[0])?,
        c,
        m: yd[0],
        group,
        input,
        out,
        geom,
        tail,
    })
}

/// An `i64` per-dim attribute of `n` entries (`default` each where empty).
fn per_dim(v: &[i64], n: usize, default: i64, what: &str) -> R<Vec<i64>> {
    match v.len() {
        0 => Ok(vec![default; n]),
        l if l == n => Ok(v.to_vec()),
        _ => Err(format!("{what} {v:?} for {n} spatial dims")),
    }
}

/// The [`Geometry`] as the reference's `conv_transpose_geometry` resolves it: the full
/// output `stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1` less the
/// pads, or, for an `output_shape` (or `same_*` auto padding, `in * stride`), the pads that
/// shape needs split with the odd one at the end (`same_upper`) or the beginning. The
/// output it implies must be the IR's `out`.
fn geometry(kernel: Vec<u32>, a: &Attrs, input: &[u32], out: &[u32]) -> R<Geometry> {
    let n = input.len();
    let strides = u32s_attr(a.strides, n, 1, "strides")?;
    let dilations = u32s_attr(a.dilations, n, 1, "dilations")?;
    if kernel.contains(&0) || strides.contains(&0) || dilations.contains(&0) {
        return Err("a zero window, stride or dilation".into());
    }
    let opad = per_dim(a.output_padding, n, 0, "output_padding")?;
    let oshape = match a.output_shape.len() {
        0 => None,
        l if l == n + 2 => Some(a.output_shape[2..].to_vec()),
        _ => Some(per_dim(a.output_shape, n, 0, "output_shape")?),
    };
    let pads = match a.auto_pad {
        AutoPad::Valid => vec![0; 2 * n],
        _ => per_dim(a.pads, 2 * n, 0, "pads")?,
    };
    let mut pad_begin = Vec::with_capacity(n);
    for d in 0..n {
        let eff = i64::from(kernel[d] - 1) * i64::from(dilations[d]) + 1;
        let (i, s) = (i64::from(input[d]), i64::from(strides[d]));
        let full = s * (i - 1) + opad[d] + eff;
        let target = match (&oshape, a.auto_pad) {
            (Some(o), _) => Some(o[d]),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(i * s),
            _ => None,
        };
        let (pb, o) = match target {
            Some(o) => {
                let total = full - o;
                let half = total.div_euclid(2);
                let pb = if a.auto_pad == AutoPad::SameUpper {
                    half
                } else {
                    total - half
                };
                (pb, o)
            }
            None => (pads[d], full - pads[d] - pads[n + d]),
        };
        // Coordinates are u32 holding signed values: keep them well inside i32.
        let reach = o + pb.abs() + eff;
        if reach >= 1 << 30 {
            return Err(format!("conv_transpose dim {d} reaches {reach}, past 2^30"));
        }
        if o != i64::from(out[d]) {
            return Err(format!(
                "conv_transpose output dim {d} is {} but the attributes give {o}",
                out[d]
            ));
        }
        let pb = i32::try_from(pb)
            .ok()
            .filter(|p| p.unsigned_abs() < 1 << 24)
            .ok_or_else(|| format!("conv_transpose pad {pb} is not generated"))?;
        pad_begin.push(pb);
    }
    Ok(Geometry {
        kernel,
        strides,
        dilations,
        pad_begin,
    })
}

/// Output element `i`: its plane (`n * M + m`) and coordinates, the walk over the group's
/// input channels and the taps, the bias, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u32, u64, .. } = *t;
    let (o, rest) = grid::unflatten(b, u32, e.i, &l.out)?;
    let (img, m) = grid::div_mod(b, u32, rest, l.m)?;
    let sum = gather(b, t, l, (img, m), &o, e.addrs)?;
    let v = match &l.bias {
        None => sum,
        Some(bias) => {
            let bv = bias_at(b, t, bias, m, (e.addrs, l.elem))?;
            build(b.f_add(f32, None, sum, bv))?
        }
    };
    let v = tail::apply(b, t, &l.tail, (v, m), (e.addrs, l.elem))?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.y], i, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// The sum over the group's input channels `c` and the taps `k` (`j = c * taps + k`) of
/// `x[img, c, i...] * w[c, m % (M / group), k...]` where tap `k` reaches output `o`.
fn gather(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    (img, m): (Word, Word),
    o: &[Word],
    addrs: &[Word],
) -> R<Word> {
    let Prelude { f32, u32, u64, .. } = *t;
    let (cg, mg) = (l.c / l.group, l.m / l.group);
    let (g, mi) = grid::div_mod(b, u32, m, mg)?;
    // The group's first input channel, g * C/group, and its first plane, img * C + that.
    let cgc = b.constant_bit32(u32, cg);
    let first_c = build(b.i_mul(u32, None, g, cgc))?;
    let cc = b.constant_bit32(u32, l.c);
    let first = build(b.i_mul(u32, None, img, cc))?;
    let first = build(b.i_add(u32, None, first, first_c))?;
    let taps: u32 = l.geom.kernel.iter().product();
    let in_plane: u32 = l.input.iter().product();
    let (zero_u, count) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, cg * taps));
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let sum = grid::range_loop(b, t, (zero_u, count), &[(f32, zero)], &mut |b, j, acc| {
        let (ci, k) = grid::div_mod(b, u32, j, taps)?;
        let (at, inside) = source(b, t, l, o, k)?;
        let ch = build(b.i_add(u32, None, first, ci))?;
        let ch = build(b.u_convert(u64, None, ch))?;
        let span = b.constant_bit64(u64, u64::from(in_plane));
        let flat = build(b.i_mul(u64, None, ch, span))?;
        let flat = build(b.i_add(u64, None, flat, at))?;
        let xa = grid::element_addr(b, u64, addrs[l.x], flat, l.elem.bytes())?;
        let wi = filter_index(b, t, (first_c, ci), (mi, mg), (k, taps))?;
        let wa = grid::element_addr(b, u64, addrs[l.w], wi, l.elem.bytes())?;
        let xv = elem::load(b, l.elem, f32, xa)?;
        let wv = elem::load(b, l.elem, f32, wa)?;
        let p = build(b.f_mul(f32, None, xv, wv))?;
        let p = build(b.select(f32, None, inside, p, zero))?;
        Ok(vec![build(b.f_add(f32, None, acc[0], p))?])
    })?[0];
    Ok(sum)
}

/// The filter element `w[first_c + ci, mi, k]` of `[C, mg, taps]` as a `u64` index.
fn filter_index(
    b: &mut Builder,
    t: &Prelude,
    (first_c, ci): (Word, Word),
    (mi, mg): (Word, u32),
    (k, taps): (Word, u32),
) -> R<Word> {
    let Prelude { u32, u64, .. } = *t;
    let c = build(b.i_add(u32, None, first_c, ci))?;
    let c = build(b.u_convert(u64, None, c))?;
    let (mi, k) = (
        build(b.u_convert(u64, None, mi))?,
        build(b.u_convert(u64, None, k))?,
    );
    let mg = b.constant_bit64(u64, u64::from(mg));
    let taps = b.constant_bit64(u64, u64::from(taps));
    let row = build(b.i_mul(u64, None, c, mg))?;
    let row = build(b.i_add(u64, None, row, mi))?;
    let row = build(b.i_mul(u64, None, row, taps))?;
    build(b.i_add(u64, None, row, k))
}

/// Where tap `k` of output `o` reads: per dim `p = o + pad_begin - k * dilation`, which
/// must be a non-negative multiple of the stride with `p / stride` inside the input.
/// Returns the input element's offset in its plane (a `u64`, 0 where it reads nothing)
/// and whether it reads one.
fn source(b: &mut Builder, t: &Prelude, l: &Layout, o: &[Word], k: Word) -> R<(Word, Word)> {
    let Prelude { u32, u64, bool, .. } = *t;
    let g = &l.geom;
    let mut rest = k;
    let mut inside = b.constant_true(bool);
    let mut flat = b.constant_bit32(u32, 0);
    let mut stride = 1u32;
    for dim in (0..l.input.len()).rev() {
        let (q, kd) = grid::div_mod(b, u32, rest, g.kernel[dim])?;
        rest = q;
        // p = o + pad_begin - k * d, as two's complement in a u32.
        let pb = b.constant_bit32(u32, g.pad_begin[dim] as u32);
        let d = b.constant_bit32(u32, g.dilations[dim]);
        let kd = build(b.i_mul(u32, None, kd, d))?;
        let p = build(b.i_add(u32, None, o[dim], pb))?;
        let p = build(b.i_sub(u32, None, p, kd))?;
        let zero = b.constant_bit32(u32, 0);
        let nonneg = build(b.s_greater_than_equal(bool, None, p, zero))?;
        let p = build(b.select(u32, None, nonneg, p, zero))?;
        let (i, r) = grid::div_mod(b, u32, p, g.strides[dim])?;
        let whole = build(b.i_equal(bool, None, r, zero))?;
        let end = b.constant_bit32(u32, l.input[dim]);
        let within = build(b.u_less_than(bool, None, i, end))?;
        for ok in [nonneg, whole, within] {
            inside = build(b.logical_and(bool, None, inside, ok))?;
        }
        let st = b.constant_bit32(u32, stride);
        let term = build(b.i_mul(u32, None, i, st))?;
        flat = build(b.i_add(u32, None, flat, term))?;
        stride *= l.input[dim];
    }
    let zero = b.constant_bit32(u32, 0);
    let flat = build(b.select(u32, None, inside, flat, zero))?;
    Ok((build(b.u_convert(u64, None, flat))?, inside))
}
