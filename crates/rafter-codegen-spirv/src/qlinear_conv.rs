//! ONNX `QLinearConv`: a u8/i8 convolution of any number of spatial dims (grouped and
//! depthwise included) requantized to u8/i8, the convolutions ONNX Runtime's
//! `quantize_static` writes in its QOperator format.
//!
//! One invocation per output element (the grid-stride launch of [`crate::grid`]) walks its
//! window's taps over the group's channels, accumulating `(x - x_zp) * (w - w_zp[m])` in
//! wrapping i32 (exact, as the reference's and ORT's integer convolution). Padding reads
//! the input's zero point (the real value 0), i.e. contributes nothing once shifted, so a
//! tap outside the input is a select of 0 (its address clamped, never read past the data).
//!
//! Requantization follows the CPU kernel (`rafter-runtime-cpu`'s `qconv`, ONNX Runtime's
//! `MlasRequantizeOutput`): per output channel the f32 scale `x_scale * w_scale[m] /
//! y_scale` (the quotient correctly rounded, [`Math::div_exact`]), `acc + bias[m]` as f32
//! times it, clamped to the output type's range less the zero point, rounded half to even,
//! plus `y_zero_point`. The reference computes that last product in f64, so a result
//! within a rounding of a .5 tie may differ from it by one (ORT's own output is the f32
//! one).
//!
//! Scales, zero points, the bias and the weight may be body inputs or constants the
//! compiler folded into the body (read from a `Private` array); the input must be a body
//! input with static channel and spatial dims (the batch may be symbolic).

use rafter_ir::{DType, Graph, Op};
use rspirv::dr::Builder;
use rspirv::spirv::{Decoration, Word};

use crate::const_bytes::{self, Bytes, Reader};
use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};
use crate::window_nd;

/// GLSL.std.450 `RoundEven`.
const ROUND_EVEN: u32 = 2;

/// A generated quantized convolution; launched like an elementwise kernel (one `u32`
/// param, the output's element count).
#[derive(Debug, Clone)]
pub struct QLinearConvKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// An operand read by the kernel: its bytes (binding or folded constant), its type and
/// whether it holds one value per output channel (else one for all).
struct Param {
    bytes: Bytes,
    dtype: DType,
    per_channel: bool,
}

/// The convolution's geometry and operands.
struct Layout {
    /// Input channels and spatial dims.
    c: u32,
    input: Vec<u32>,
    /// Output channels and spatial dims.
    m: u32,
    out: Vec<u32>,
    kernel: Vec<u32>,
    strides: Vec<u32>,
    dilations: Vec<u32>,
    pad_begin: Vec<u32>,
    /// Channels per group, and output channels per group.
    cg: u32,
    mg: u32,
    x: (usize, Elem),
    w: Param,
    x_scale: Param,
    x_zp: Option<Param>,
    w_scale: Param,
    w_zp: Option<Param>,
    y_scale: Param,
    y_zp: Param,
    bias: Option<Param>,
    y: Elem,
    bindings: usize,
}

/// Generates a body that is one `qlinear_conv` node.
pub fn qlinear_conv(body: &Graph) -> Result<QLinearConvKernel, String> {
    let layout = plan(body)?;
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(QLinearConvKernel { spirv })
}

fn plan(body: &Graph) -> R<Layout> {
    let node = grid::one_node(body, "qlinear_conv")?;
    let Op::QLinearConv {
        kernel_shape,
        strides,
        pads,
        dilations,
        group,
        auto_pad,
    } = &node.op
    else {
        return Err(format!("op `{}` is not qlinear_conv", node.op.name()));
    };
    let int8 = |dtype: DType, what: &str| match dtype {
        DType::U8 => Ok(Elem::U8),
        DType::I8 => Ok(Elem::I8),
        other => Err(format!("{what} is {other}; u8 and i8 are generated")),
    };
    let x = grid::body_input(body, node, 0, "the quantized input")?;
    let x_ty = &body.value(body.inputs[x]).ty;
    let rank = x_ty.dims.len();
    if rank < 3 {
        return Err(format!(
            "an input of rank {rank}: [N, C, spatial...] is generated"
        ));
    }
    let xd = grid::static_dims_from(x_ty, 1, "the quantized input")?;
    let y_v = node.outputs.first().copied().flatten().ok_or("no result")?;
    if body.outputs != [y_v] {
        return Err("the convolution must be the body's one output".into());
    }
    let y_ty = &body.value(y_v).ty;
    if y_ty.dims.len() != rank || y_ty.dims[0] != x_ty.dims[0] {
        return Err("the result's rank or batch is not the input's".into());
    }
    let yd = grid::static_dims_from(y_ty, 1, "the result")?;
    let w_v = node.input(3).ok_or("no weight")?;
    let w_ty = &body.value(w_v).ty;
    let wd = grid::static_dims(w_ty, "the weight")?;
    if wd.len() != rank {
        return Err(format!(
            "a weight of rank {} for an input of rank {rank}",
            wd.len()
        ));
    }
    let u32_of = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} too large"));
    let (c, m, cg) = (
        u32_of(xd[0], "C")?,
        u32_of(yd[0], "M")?,
        u32_of(wd[1], "C/group")?,
    );
    let g = u32::try_from(*group)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| format!("group {group}"))?;
    if u64::from(m) != wd[0] || cg * g != c || m % g != 0 {
        return Err(format!(
            "a weight of dims {wd:?} for {c} input and {m} output channels in {g} groups"
        ));
    }
    let kernel = wd[2..]
        .iter()
        .map(|&k| u32_of(k, "kernel dim"))
        .collect::<R<Vec<u32>>>()?;
    if !kernel_shape.is_empty()
        && kernel_shape
            .iter()
            .map(|&k| k as u64)
            .ne(wd[2..].iter().copied())
    {
        return Err(format!(
            "kernel_shape {kernel_shape:?} is not the weight's {wd:?}"
        ));
    }
    let input = xd[1..]
        .iter()
        .map(|&v| u32_of(v, "input dim"))
        .collect::<R<Vec<u32>>>()?;
    let out = yd[1..]
        .iter()
        .map(|&v| u32_of(v, "output dim"))
        .collect::<R<Vec<u32>>>()?;
    grid::product_u32(&yd, "the result")?;
    grid::product_u32(&wd, "the weight")?;
    let (strides, dilations, pad_begin, _) =
        window_nd::geometry(&kernel, strides, dilations, pads, *auto_pad, (&input, &out))?;
    let param = |i: usize, dtypes: &[DType], what: &str| -> R<Option<Param>> {
        let Some(v) = node.input(i) else {
            return Ok(None);
        };
        let ty = &body.value(v).ty;
        if !dtypes.contains(&ty.dtype) {
            return Err(format!("{what} is {}", ty.dtype));
        }
        let dims = grid::static_dims(ty, what)?;
        let len: u64 = dims.iter().product();
        let per_channel = match len {
            1 => false,
            l if l == u64::from(m) && dims.len() == 1 => true,
            _ => return Err(format!("{what} of dims {dims:?}")),
        };
        Ok(Some(Param {
            bytes: Bytes::of(body, v, what)?,
            dtype: ty.dtype,
            per_channel,
        }))
    };
    let q = [DType::U8, DType::I8];
    let required = |p: Option<Param>, what: &str| p.ok_or_else(|| format!("no {what}"));
    let scalar = |p: Param, what: &str| {
        if p.per_channel && m != 1 {
            Err(format!("{what} per channel: one per tensor is generated"))
        } else {
            Ok(Param {
                per_channel: false,
                ..p
            })
        }
    };
    let x_scale = scalar(
        required(param(1, &[DType::F32], "x_scale")?, "x_scale")?,
        "x_scale",
    )?;
    let x_zp = param(2, &q, "x_zero_point")?
        .map(|p| scalar(p, "x_zero_point"))
        .transpose()?;
    let w_scale = required(param(4, &[DType::F32], "w_scale")?, "w_scale")?;
    let w_zp = param(5, &q, "w_zero_point")?;
    let y_scale = scalar(
        required(param(6, &[DType::F32], "y_scale")?, "y_scale")?,
        "y_scale",
    )?;
    let y_zp = scalar(
        required(param(7, &q, "y_zero_point")?, "y_zero_point")?,
        "y_zero_point",
    )?;
    let bias = param(8, &[DType::I32], "bias")?;
    if bias.as_ref().is_some_and(|b| !b.per_channel && m != 1) {
        return Err("a bias of one element: one per output channel is generated".into());
    }
    let bindings = body.inputs.len() + 1;
    if bindings > grid::MAX_BINDINGS {
        return Err(format!(
            "qlinear_conv with {bindings} buffers: a dispatch binds at most {} (scales and \
             zero points folded into the body as constants take none)",
            grid::MAX_BINDINGS
        ));
    }
    if y_zp.dtype != y_ty.dtype {
        return Err(format!(
            "y_zero_point is {} but the result {}",
            y_zp.dtype, y_ty.dtype
        ));
    }
    Ok(Layout {
        c,
        input,
        m,
        out,
        kernel,
        strides,
        dilations,
        pad_begin,
        cg,
        mg: m / g,
        x: (x, int8(x_ty.dtype, "the quantized input")?),
        w: Param {
            bytes: Bytes::of(body, w_v, "the weight")?,
            dtype: int8(w_ty.dtype, "the weight").map(|_| w_ty.dtype)?,
            per_channel: false,
        },
        x_scale,
        x_zp,
        w_scale,
        w_zp,
        y_scale,
        y_zp,
        bias,
        y: int8(y_ty.dtype, "the result")?,
        bindings,
    })
}

/// Word `index` (a `u32`) of a 4-byte operand as a `u32`.
fn load_word(b: &mut Builder, t: &Prelude, from: Reader, index: Word) -> R<Word> {
    match from {
        Reader::Addr(base) => {
            let i64t = b.type_int(64, 1);
            let index = build(b.u_convert(t.u64, None, index))?;
            let at = grid::element_addr(b, t.u64, base, index, 4)?;
            let v = elem::load_int(b, Elem::U32, i64t, at)?;
            build(b.u_convert(t.u32, None, v))
        }
        Reader::Private(_) => {
            // Four bytes, little-endian: the `Private` array is read a byte at a time.
            let four = b.constant_bit32(t.u32, 4);
            let first = build(b.i_mul(t.u32, None, index, four))?;
            let mut word = b.constant_bit32(t.u32, 0);
            for k in 0..4u32 {
                let kc = b.constant_bit32(t.u32, k);
                let at = build(b.i_add(t.u32, None, first, kc))?;
                let byte = const_bytes::load_byte(b, t, from, at)?;
                let shift = b.constant_bit32(t.u32, 8 * k);
                let byte = build(b.shift_left_logical(t.u32, None, byte, shift))?;
                word = build(b.bitwise_or(t.u32, None, word, byte))?;
            }
            Ok(word)
        }
    }
}

/// The index a [`Param`] is read at for output channel `m`.
fn at(b: &mut Builder, t: &Prelude, p: &Param, m: Word) -> Word {
    if p.per_channel {
        m
    } else {
        b.constant_bit32(t.u32, 0)
    }
}

/// An f32 [`Param`] for channel `m`.
fn load_f32(b: &mut Builder, t: &Prelude, e: &Element, p: &Param, m: Word) -> R<Word> {
    let from = p.bytes.reader(b, t, e.addrs);
    let i = at(b, t, p, m);
    let w = load_word(b, t, from, i)?;
    build(b.bitcast(t.f32, None, w))
}

/// An 8-bit zero point for channel `m` as an i32 (0 when absent).
fn load_zp(b: &mut Builder, t: &Prelude, e: &Element, p: Option<&Param>, m: Word) -> R<Word> {
    let i32t = b.type_int(32, 1);
    let Some(p) = p else {
        return Ok(b.constant_bit32(i32t, 0));
    };
    let from = p.bytes.reader(b, t, e.addrs);
    let i = at(b, t, p, m);
    const_bytes::load_int8(b, t, from, p.dtype, i)
}

/// `op`'s result decorated `NoContraction`: each float step rounds as the CPU's does.
fn exact(b: &mut Builder, id: Word) -> Word {
    b.decorate(id, Decoration::NoContraction, []);
    id
}

/// Output element `i`: its image, channel and position, the integer sum over the window,
/// the requantization.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let i32t = b.type_int(32, 1);
    let i64t = b.type_int(64, 1);
    let mut dims = vec![l.m];
    dims.extend(&l.out);
    let (coords, image) = grid::unflatten(b, u32, e.i, &dims)?;
    let (ch, pos) = (coords[0], &coords[1..]);
    let (grp, _) = grid::div_mod(b, u32, ch, l.mg)?;
    // The first input channel of the image's group, as an element index of x (64-bit:
    // the input may hold more elements than the result).
    let in_plane: u64 = l.input.iter().map(|&d| u64::from(d)).product();
    let image64 = build(b.u_convert(u64, None, image))?;
    let cc = b.constant_bit64(u64, u64::from(l.c));
    let cg = b.constant_bit32(u32, l.cg);
    let first_c = build(b.i_mul(u32, None, grp, cg))?;
    let first_c = build(b.u_convert(u64, None, first_c))?;
    let x_base = build(b.i_mul(u64, None, image64, cc))?;
    let x_base = build(b.i_add(u64, None, x_base, first_c))?;
    let plane = b.constant_bit64(u64, in_plane);
    let x_base = build(b.i_mul(u64, None, x_base, plane))?;
    let taps: u32 = l.kernel.iter().product();
    let per_filter = l.cg * taps;
    let pf = b.constant_bit32(u32, per_filter);
    let w_base = build(b.i_mul(u32, None, ch, pf))?;
    let xzp = load_zp(b, t, &e, l.x_zp.as_ref(), ch)?;
    let wzp = load_zp(b, t, &e, l.w_zp.as_ref(), ch)?;
    let w_from = l.w.bytes.reader(b, t, e.addrs);
    let zero_i = b.constant_bit32(i32t, 0);
    let (from, to) = (b.constant_bit32(u32, 0), pf);
    let acc = grid::range_loop(b, t, (from, to), &[(i32t, zero_i)], &mut |b, k, cur| {
        let mut kdims = vec![l.cg];
        kdims.extend(&l.kernel);
        let (kc, _) = grid::unflatten(b, u32, k, &kdims)?;
        let (ci, tap) = (kc[0], &kc[1..]);
        // The tap's input position per dim, wrapping below 0 to a huge u32 so one unsigned
        // comparison finds it outside.
        let mut inside = None;
        let mut spatial = b.constant_bit32(u32, 0);
        for d in 0..l.input.len() {
            let s = b.constant_bit32(u32, l.strides[d]);
            let dl = b.constant_bit32(u32, l.dilations[d]);
            let pb = b.constant_bit32(u32, l.pad_begin[d]);
            let p = build(b.i_mul(u32, None, pos[d], s))?;
            let q = build(b.i_mul(u32, None, tap[d], dl))?;
            let p = build(b.i_add(u32, None, p, q))?;
            let p = build(b.i_sub(u32, None, p, pb))?;
            let n = b.constant_bit32(u32, l.input[d]);
            let ok = build(b.u_less_than(bool, None, p, n))?;
            inside = Some(match inside {
                None => ok,
                Some(prev) => build(b.logical_and(bool, None, prev, ok))?,
            });
            let sp = build(b.i_mul(u32, None, spatial, n))?;
            spatial = build(b.i_add(u32, None, sp, p))?;
        }
        let inside = inside.ok_or("no spatial dims")?;
        let zero_u = b.constant_bit32(u32, 0);
        let spatial = build(b.select(u32, None, inside, spatial, zero_u))?;
        let ci64 = build(b.u_convert(u64, None, ci))?;
        let xi = build(b.i_mul(u64, None, ci64, plane))?;
        let xi = build(b.i_add(u64, None, x_base, xi))?;
        let sp64 = build(b.u_convert(u64, None, spatial))?;
        let xi = build(b.i_add(u64, None, xi, sp64))?;
        let at = grid::element_addr(b, u64, e.addrs[l.x.0], xi, 1)?;
        let xv = elem::load_int(b, l.x.1, i64t, at)?;
        let xv = build(b.s_convert(i32t, None, xv))?;
        let xv = build(b.i_sub(i32t, None, xv, xzp))?;
        let xv = build(b.select(i32t, None, inside, xv, zero_i))?;
        let wi = build(b.i_add(u32, None, w_base, k))?;
        let wv = const_bytes::load_int8(b, t, w_from, l.w.dtype, wi)?;
        let wv = build(b.i_sub(i32t, None, wv, wzp))?;
        let term = build(b.i_mul(i32t, None, xv, wv))?;
        Ok(vec![build(b.i_add(i32t, None, cur[0], term))?])
    })?;
    let mut acc = acc[0];
    if let Some(bias) = &l.bias {
        let from = bias.bytes.reader(b, t, e.addrs);
        let i = at(b, t, bias, ch);
        let bv = load_word(b, t, from, i)?;
        let bv = build(b.bitcast(i32t, None, bv))?;
        acc = build(b.i_add(i32t, None, acc, bv))?;
    }
    // ORT's order: x_scale * w_scale / y_scale, each step rounded to f32.
    let xs = load_f32(b, t, &e, &l.x_scale, ch)?;
    let ws = load_f32(b, t, &e, &l.w_scale, ch)?;
    let ys = load_f32(b, t, &e, &l.y_scale, ch)?;
    let s = build(b.f_mul(f32, None, xs, ws))?;
    let s = exact(b, s);
    let mut math = Math {
        b,
        f32,
        bool,
        glsl: t.glsl,
    };
    let scale = math.div_exact(s, ys)?;
    let v = build(b.convert_s_to_f(f32, None, acc))?;
    let v = build(b.f_mul(f32, None, v, scale))?;
    let v = exact(b, v);
    let yzp = load_zp(b, t, &e, Some(&l.y_zp), ch)?;
    let yzp_f = build(b.convert_s_to_f(f32, None, yzp))?;
    let (lo, hi) = if l.y == Elem::I8 {
        (-128.0f32, 127.0f32)
    } else {
        (0.0, 255.0)
    };
    let (lo, hi) = (
        b.constant_bit32(f32, lo.to_bits()),
        b.constant_bit32(f32, hi.to_bits()),
    );
    let lo = build(b.f_sub(f32, None, lo, yzp_f))?;
    let hi = build(b.f_sub(f32, None, hi, yzp_f))?;
    // Ordered selects (GLSL's FClamp leaves NaN undefined); NaN, from a NaN scale, gives 0
    // as the CPU's rounding does.
    let below = build(b.f_ord_less_than(bool, None, v, lo))?;
    let v = build(b.select(f32, None, below, lo, v))?;
    let above = build(b.f_ord_greater_than(bool, None, v, hi))?;
    let v = build(b.select(f32, None, above, hi, v))?;
    let nan = build(b.is_nan(bool, None, v))?;
    let zero_f = b.constant_bit32(f32, 0);
    let v = build(b.select(f32, None, nan, zero_f, v))?;
    let v = build(b.ext_inst(
        f32,
        None,
        t.glsl,
        ROUND_EVEN,
        [rspirv::dr::Operand::IdRef(v)],
    ))?;
    let q = build(b.convert_f_to_s(i32t, None, v))?;
    let q = build(b.i_add(i32t, None, q, yzp))?;
    let q = build(b.s_convert(i64t, None, q))?;
    let i64v = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64v, 1)?;
    elem::store_int(b, l.y, i64t, dst, q)
}
