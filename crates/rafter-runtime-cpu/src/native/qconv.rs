//! Quantized 2-D convolution (NCHW): ONNX `QLinearConv` (u8/i8 in, u8/i8 out) and
//! `ConvInteger` (u8/i8 in, i32 out), on borrowed operands.
//!
//! The integer product of the operands shifted by their zero points, `x - x_zp` and
//! `w - w_zp`, is computed exactly on the f32 GEMM over the im2col
//! ([`super::exact_int`]): the integer convolution bit for bit, at the speed of the crate's
//! tuned f32 GEMM and its ISA dispatch instead of a reference-style integer loop.
//!
//! Padding: ONNX pads the quantized input with its zero point (the real value 0), which
//! is 0 once shifted, so the f32 im2col's zero padding is right as it is.
//!
//! Requantization (`QLinearConv`) follows ONNX Runtime's (`qlinearconv.cc` with MLAS's
//! `MlasRequantizeOutput`): per output channel `m` the f32 scale `x_scale · w_scale[m] /
//! y_scale`; `acc + bias[m]` (i32) converted to f32, times that scale, clamped to the output
//! type's range less the zero point, rounded half to even, plus `y_zero_point`.
//! Per-tensor and per-channel (`[M]`) weight scales and zero points; groups (depthwise
//! included), pads, strides, dilations and auto_pad as the f32 convolution has them.

use std::cell::RefCell;
use std::sync::Arc;

use rafter_ir::{AutoPad, DType, Graph, Op, ValueId};

use super::conv::{geometry, im2col, Geom};
use super::exact_int::{exact_product, grow, ShiftedWeight};
use super::{input_of, In, NativeKernel, Out, Par};

/// What the kernel computes after the integer product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `QLinearConv`: operands x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias?.
    QLinear,
    /// `ConvInteger`: operands x, w, x_zp?, w_zp?; the i32 product is the result.
    Integer,
}

/// Where an operand comes from: a body input (an operand of the dispatch), or a small
/// constant the compiler copied into the body (scales, zero points, a bias).
#[derive(Clone, Debug)]
pub(super) enum Opnd {
    Input(usize),
    Const { dtype: DType, bytes: Vec<u8> },
}

/// An operand's elements for this dispatch.
pub(super) struct View<'a> {
    pub(super) dtype: DType,
    pub(super) bytes: &'a [u8],
    /// The program weight it is, if one (the same bytes every call).
    weight: Option<usize>,
}

impl Opnd {
    /// `v` as an input or constant of one of `dtypes`.
    pub(super) fn of(body: &Graph, v: Option<ValueId>, dtypes: &[DType]) -> Option<Opnd> {
        let v = v?;
        let dtype = body.value(v).ty.dtype;
        if !dtypes.contains(&dtype) {
            return None;
        }
        if let Some(i) = input_of(body, Some(v), dtype) {
            return Some(Opnd::Input(i));
        }
        let c = body.const_of(v)?;
        (c.dtype == dtype).then(|| Opnd::Const {
            dtype,
            bytes: c.bytes.to_vec(),
        })
    }

    pub(super) fn view<'a>(&'a self, ins: &'a [In<'a>]) -> View<'a> {
        match self {
            Opnd::Input(i) => View {
                dtype: ins[*i].dtype,
                bytes: ins[*i].bytes(),
                weight: ins[*i].weight,
            },
            Opnd::Const { dtype, bytes } => View {
                dtype: *dtype,
                bytes,
                weight: None,
            },
        }
    }
}

struct QConvKernel {
    mode: Mode,
    /// Body input index of x.
    x: usize,
    /// The weight: a body input, or (small ones) a constant the compiler copied in.
    w: Opnd,
    /// The weight's dims when it is a constant.
    w_const_dims: Option<Vec<usize>>,
    /// Each ONNX operand after x and w in ONNX order (`None`: absent): for `QLinearConv`
    /// x_scale, x_zp, w_scale, w_zp, y_scale, y_zp, bias; for `ConvInteger` x_zp, w_zp.
    rest: Vec<Option<Opnd>>,
    kernel_shape: Vec<i64>,
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
    group: i64,
    auto_pad: AutoPad,
    par: Par,
    /// The shifted weights `w - w_zp` as f32, by the weight they were computed from (only
    /// cached when the zero point is a constant or a weight, fixed for the program).
    shifted_w: ShiftedWeight,
}

pub(super) const Q: &[DType] = &[DType::U8, DType::I8];

/// The kernel for a body that is one `qlinear_conv` or `conv_integer` node (u8/i8 operands).
pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let (mode, kernel_shape, strides, pads, dilations, group, auto_pad) = match &node.op {
        Op::QLinearConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => (
            Mode::QLinear,
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        ),
        Op::ConvInteger {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => (
            Mode::Integer,
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        ),
        _ => return None,
    };
    if body.outputs.len() != 1 || node.outputs.len() != 1 {
        return None;
    }
    let input = |i: usize| -> Option<usize> {
        let v = node.inputs.get(i).copied().flatten();
        input_of(body, v, DType::U8).or_else(|| input_of(body, v, DType::I8))
    };
    let operand = |i: usize, dtypes: &[DType], required: bool| -> Option<Option<Opnd>> {
        match node.inputs.get(i).copied().flatten() {
            None if required => None,
            None => Some(None),
            Some(v) => Opnd::of(body, Some(v), dtypes).map(Some),
        }
    };
    let f = &[DType::F32];
    let weight = |i: usize| -> Option<(Opnd, Option<Vec<usize>>)> {
        let v = node.inputs.get(i).copied().flatten();
        match Opnd::of(body, v, Q)? {
            Opnd::Input(j) => Some((Opnd::Input(j), None)),
            c => Some((c, Some(super::known_dims(body, v?)?))),
        }
    };
    let (x, (w, w_const_dims), rest) = match mode {
        Mode::QLinear => (
            input(0)?,
            weight(3)?,
            vec![
                operand(1, f, true)?,
                operand(2, Q, true)?,
                operand(4, f, true)?,
                operand(5, Q, true)?,
                operand(6, f, true)?,
                operand(7, Q, true)?,
                operand(8, &[DType::I32], false)?,
            ],
        ),
        Mode::Integer => (
            input(0)?,
            weight(1)?,
            vec![operand(2, Q, false)?, operand(3, Q, false)?],
        ),
    };
    Some(Arc::new(QConvKernel {
        mode,
        x,
        w,
        w_const_dims,
        rest,
        kernel_shape: kernel_shape.clone(),
        strides: strides.clone(),
        pads: pads.clone(),
        dilations: dilations.clone(),
        group: *group,
        auto_pad: *auto_pad,
        par: par.clone(),
        shifted_w: ShiftedWeight::default(),
    }))
}

/// The integer values of u8/i8 bytes.
pub(super) fn ints(dtype: DType, bytes: &[u8]) -> impl Iterator<Item = i32> + '_ {
    let signed = dtype == DType::I8;
    bytes
        .iter()
        .map(move |&b| if signed { b as i8 as i32 } else { b as i32 })
}

/// The f32 values of little-endian bytes.
pub(super) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// A zero point of one value, or of `len` (per channel); absent is 0. `None`: another
/// length (the reference path handles or reports it).
fn zero_points(t: Option<&View<'_>>, len: usize) -> Option<Vec<i32>> {
    let Some(t) = t else {
        return Some(vec![0]);
    };
    let v: Vec<i32> = ints(t.dtype, t.bytes).collect();
    (v.len() == 1 || v.len() == len).then_some(v)
}

/// The output range of a quantized result type.
pub(super) fn range_of(dtype: DType) -> (i32, i32) {
    match dtype {
        DType::I8 => (-128, 127),
        _ => (0, 255),
    }
}

thread_local! {
    /// Scratch reused across dispatches on this thread: shifted input, im2col, the f32
    /// product, and the i32 accumulator of long reductions.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    cols: Vec<f32>,
    prod: Vec<f32>,
    acc: Vec<i32>,
}

/// What the requantizing epilogue needs, per output channel.
struct Requant {
    bias: Option<Vec<i32>>,
    scale: Vec<f32>,
    zp: i32,
    lo: i32,
    hi: i32,
    signed: bool,
}

impl Requant {
    /// Output row of channel `m` from the exact integer products `acc` (one per pixel):
    /// `clamp((acc + bias) as f32 · scale) rounded half to even + zero point`.
    #[inline]
    fn row(&self, acc: impl Iterator<Item = i32>, m: usize, out: &mut [u8]) {
        // The accumulation is in i32 (ORT's, and NumPy's astype in the reference).
        let b = self.bias.as_ref().map_or(0, |b| b[m % b.len()]);
        let s = self.scale[m % self.scale.len()];
        let lo = (self.lo - self.zp) as f32;
        let hi = (self.hi - self.zp) as f32;
        let (zp, signed) = (self.zp, self.signed);
        for (v, a) in out.iter_mut().zip(acc) {
            let f = (a.wrapping_add(b) as f32 * s).max(lo).min(hi);
            let q = round_half_even(f) as i32 + zp;
            *v = if signed { q as i8 as u8 } else { q as u8 };
        }
    }
}

/// Round half to even of `f` (|f| ≤ 2²²; NaN gives 0): adding and subtracting 1.5 · 2²³
/// leaves the integer nearest `f`, ties to even (f32 arithmetic rounds to nearest even),
/// and unlike `round_ties_even` it vectorises on every x86-64 (no SSE4.1 needed).
#[inline]
pub(super) fn round_half_even(f: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    let f = if f.is_nan() { 0.0 } else { f };
    (f + MAGIC) - MAGIC
}

impl QConvKernel {
    /// Operand `i` of [`QConvKernel::rest`], if present.
    fn rest<'a>(&'a self, ins: &'a [In<'a>], i: usize) -> Option<View<'a>> {
        self.rest.get(i)?.as_ref().map(|o| o.view(ins))
    }

    /// `w - w_zp[m]` as f32 for every weight (`[M, K]`), cached when the weight is a
    /// program weight and its zero point fixed.
    fn shifted_weights(
        &self,
        w: &View<'_>,
        w_zp: &[i32],
        zp_fixed: bool,
        m: usize,
    ) -> Arc<Vec<f32>> {
        let k = w.bytes.len() / m.max(1);
        self.shifted_w.get(w.weight.filter(|_| zp_fixed), || {
            ints(w.dtype, w.bytes)
                .enumerate()
                .map(|(i, v)| (v - w_zp[(i / k.max(1)) % w_zp.len()]) as f32)
                .collect()
        })
    }

    /// The requantization of `QLinearConv` for `m` output channels, `None` for shapes the
    /// kernel does not cover (the reference path handles or reports them).
    fn requant(&self, ins: &[In<'_>], m: usize, y: DType) -> Option<Requant> {
        let scale = |i: usize| self.rest(ins, i).map(|v| f32s(v.bytes));
        let (xs, ws, ys) = (scale(0)?, scale(2)?, scale(4)?);
        if xs.len() != 1 || ys.len() != 1 || !(ws.len() == 1 || ws.len() == m) {
            return None;
        }
        let zp = zero_points(self.rest(ins, 5).as_ref(), 1)?;
        if zp.len() != 1 || self.rest(ins, 5)?.dtype != y {
            return None;
        }
        let bias = match self.rest(ins, 6) {
            None => None,
            Some(b) => {
                let v: Vec<i32> = b
                    .bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                if v.len() != m {
                    return None;
                }
                Some(v)
            }
        };
        let (lo, hi) = range_of(y);
        Some(Requant {
            bias,
            // ORT's order: x_scale · w_scale / y_scale, in f32.
            scale: ws.iter().map(|&w| xs[0] * w / ys[0]).collect(),
            zp: zp[0],
            lo,
            hi,
            signed: y == DType::I8,
        })
    }
}

impl NativeKernel for QConvKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let w = self.w.view(ins);
        let w_dims = match (&self.w, &self.w_const_dims) {
            (Opnd::Input(i), _) => ins[*i].dims.as_slice(),
            (_, Some(d)) => d.as_slice(),
            _ => return Ok(false),
        };
        let (&[n, c, h, wd], &[m, cg, kh, kw]) = (x.dims.as_slice(), w_dims) else {
            return Ok(false);
        };
        if !self.kernel_shape.is_empty() && self.kernel_shape != [kh as i64, kw as i64] {
            return Ok(false);
        }
        let g = usize::try_from(self.group).unwrap_or(0);
        if g == 0 || cg * g != c || m % g != 0 {
            return Ok(false);
        }
        let Some(geo) = geometry(
            [h, wd],
            [kh, kw],
            &self.strides,
            &self.pads,
            &self.dilations,
            self.auto_pad,
            false,
        ) else {
            return Ok(false);
        };
        let [oh, ow] = geo.out;
        if outs[0].dims != [n, m, oh, ow] {
            return Ok(false);
        }
        let (xzp_at, wzp_at) = match self.mode {
            Mode::QLinear => (1, 3),
            Mode::Integer => (0, 1),
        };
        let Some(x_zp) = zero_points(self.rest(ins, xzp_at).as_ref(), 1) else {
            return Ok(false);
        };
        let w_zp_view = self.rest(ins, wzp_at);
        let Some(w_zp) = zero_points(w_zp_view.as_ref(), m) else {
            return Ok(false);
        };
        let zp_fixed = match &self.rest[wzp_at] {
            None | Some(Opnd::Const { .. }) => true,
            Some(Opnd::Input(_)) => w_zp_view.as_ref().is_some_and(|v| v.weight.is_some()),
        };
        let y_dtype = outs[0].dtype;
        let requant = match self.mode {
            Mode::QLinear => match self.requant(ins, m, y_dtype) {
                Some(r) => Some(r),
                None => return Ok(false),
            },
            Mode::Integer if y_dtype == DType::I32 => None,
            Mode::Integer => return Ok(false),
        };
        if x.bytes().len() != n * c * h * wd {
            return Err(format!(
                "input of {} bytes, but {:?} needs {}",
                x.bytes().len(),
                x.dims,
                n * c * h * wd
            ));
        }
        if w.bytes.len() != m * cg * kh * kw {
            return Err(format!(
                "weight of {} bytes, but {:?} needs {}",
                w.bytes.len(),
                w_dims,
                m * cg * kh * kw
            ));
        }
        let wf = self.shifted_weights(&w, &w_zp, zp_fixed, m);
        let shape = Shape {
            n,
            c,
            h,
            w: wd,
            m,
            g,
            geo,
        };
        let y = outs[0].bytes_mut();
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => self.compute(x, x_zp[0], &wf, &shape, requant.as_ref(), y, &mut s),
            Err(_) => self.compute(
                x,
                x_zp[0],
                &wf,
                &shape,
                requant.as_ref(),
                y,
                &mut Scratch::default(),
            ),
        })?;
        Ok(true)
    }
}

/// The convolution's dims: input `[n, c, h, w]`, `m` filters in `g` groups, the window.
struct Shape {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    m: usize,
    g: usize,
    geo: Geom,
}

impl QConvKernel {
    /// Per image and group: im2col of the shifted input, the exact product in chunks of
    /// [`EXACT_K`] rows, then the result (requantized, or i32) written into `y`.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        x: &In<'_>,
        x_zp: i32,
        wf: &[f32],
        s: &Shape,
        requant: Option<&Requant>,
        y: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let err = |e: rafter_kernels_cpu::GemmError| format!("quantized conv: {e}");
        let Shape {
            n,
            c,
            h,
            w: wd,
            m,
            g,
            geo,
        } = *s;
        let [kh, kw] = geo.k;
        let [oh, ow] = geo.out;
        let (cg, mg, p) = (c / g, m / g, oh * ow);
        let kc = cg * kh * kw;
        let Scratch {
            x: xs,
            cols,
            prod,
            acc,
        } = scratch;
        let xs = grow(xs, n * c * h * wd);
        for (d, v) in xs.iter_mut().zip(ints(x.dtype, x.bytes())) {
            *d = (v - x_zp) as f32;
        }
        let direct =
            kh == 1 && kw == 1 && geo.s == [1, 1] && geo.pb == [0, 0] && [oh, ow] == [h, wd];
        for img in 0..n {
            for gi in 0..g {
                let x0 = (img * c + gi * cg) * h * wd;
                let xg = &xs[x0..x0 + cg * h * wd];
                let b_all: &[f32] = if direct {
                    xg
                } else {
                    let cols = grow(cols, kc * p);
                    im2col(xg, cg, [h, wd], &geo, 0..oh, cols, &self.par);
                    cols
                };
                let a_all = &wf[gi * mg * kc..(gi + 1) * mg * kc];
                let product = exact_product(a_all, kc, b_all, [mg, kc, p], prod, acc, &*self.par)
                    .map_err(err)?;
                let y0 = (img * m + gi * mg) * p;
                match requant {
                    Some(r) => {
                        let yg = &mut y[y0..y0 + mg * p];
                        for (mi, row) in yg.chunks_exact_mut(p).enumerate() {
                            r.row(product.run(mi * p, p), gi * mg + mi, row);
                        }
                    }
                    None => {
                        let yg = &mut y[y0 * 4..(y0 + mg * p) * 4];
                        for (i, v) in yg.chunks_exact_mut(4).enumerate() {
                            v.copy_from_slice(&product.get(i).to_le_bytes());
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::round_half_even;

    #[test]
    fn rounds_half_to_even() {
        for (f, want) in [
            (0.5f32, 0.0f32),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, -0.0),
            (-1.5, -2.0),
            (-2.5, -2.0),
            (2.4999, 2.0),
            (254.5, 254.0),
            (255.5, 256.0),
            (-127.5, -128.0),
            (f32::NAN, 0.0),
        ] {
            assert_eq!(round_half_even(f), want, "{f}");
            if !f.is_nan() {
                assert_eq!(round_half_even(f), f.round_ties_even(), "{f}");
            }
        }
    }
}
