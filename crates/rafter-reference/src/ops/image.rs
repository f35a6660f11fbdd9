//! Reference kernels: image ops (Resize, GridSample, NonMaxSuppression).
//!
//! Numerics follow onnx/reference/ops (op_resize.py, op_grid_sample.py,
//! op_non_max_suppression.py): interpolation runs in f64 and rounds back to the input
//! dtype (integers round half to even and saturate).

use super::data::{ints, norm_axis, Elem};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::{with_array, Tensor};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{
    AspectPolicy, CoordTransform, GridPadding, GridSampleMode, NearestMode, Op, ResizeMode,
};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = ctx;
    let opt = |i: usize| inputs.get(i).copied().flatten().filter(|t| !t.is_empty());
    let out = match op {
        Op::Resize {
            mode,
            coordinate_transformation_mode,
            nearest_mode,
            cubic_coeff_a,
            exclude_outside,
            extrapolation_value,
            antialias,
            axes,
            keep_aspect_ratio_policy,
        } => {
            let p = ResizeParams {
                mode: *mode,
                ctm: *coordinate_transformation_mode,
                nearest_mode: *nearest_mode,
                cubic_a: *cubic_coeff_a as f64,
                exclude_outside: *exclude_outside,
                extrapolation: *extrapolation_value as f64,
                antialias: *antialias,
                policy: *keep_aspect_ratio_policy,
            };
            resize(arg(inputs, 0)?, opt(1), opt(2), opt(3), axes, &p)?
        }
        Op::GridSample {
            mode,
            padding_mode,
            align_corners,
        } => grid_sample(
            arg(inputs, 0)?,
            arg(inputs, 1)?,
            *mode,
            *padding_mode,
            *align_corners,
        )?,
        Op::NonMaxSuppression { center_point_box } => non_max_suppression(
            arg(inputs, 0)?,
            arg(inputs, 1)?,
            opt(2),
            opt(3),
            opt(4),
            *center_point_box != 0,
        )?,
        other => return unsupported(format!("`{}` is not an image op", other.name())),
    };
    Ok(vec![Some(out)])
}

// ---------------------------------------------------------------------------------------
// Resize
// ---------------------------------------------------------------------------------------

struct ResizeParams {
    mode: ResizeMode,
    ctm: CoordTransform,
    nearest_mode: NearestMode,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
    policy: AspectPolicy,
}

impl ResizeParams {
    /// Interpolation weights of the taps around a source coordinate, `ratio` in (0, 1]
    /// being its distance past the tap on its left.
    fn coeffs(&self, ratio: f64, scale: f64) -> Vec<f64> {
        let a = self.cubic_a;
        match (self.mode, self.antialias) {
            (ResizeMode::Nearest, _) => {
                let up = if ratio == ratio.trunc() {
                    true
                } else {
                    match self.nearest_mode {
                        NearestMode::RoundPreferFloor => ratio > 0.5,
                        NearestMode::RoundPreferCeil => ratio >= 0.5,
                        NearestMode::Floor => false,
                        NearestMode::Ceil => true,
                    }
                };
                vec![(!up) as u8 as f64, up as u8 as f64]
            }
            (ResizeMode::Linear, false) => vec![1.0 - ratio, ratio],
            (ResizeMode::Linear, true) => {
                let scale = scale.min(1.0);
                let start = (-1.0 / scale).floor() as i64 + 1;
                let n = 2 - 2 * start;
                let c: Vec<f64> = (start..start + n)
                    .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                    .collect();
                let s: f64 = c.iter().sum();
                c.into_iter().map(|v| v / s).collect()
            }
            (ResizeMode::Cubic, false) => {
                let r = ratio;
                let q = 1.0 - ratio;
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            (ResizeMode::Cubic, true) => {
                let scale = scale.min(1.0);
                let f = |x: f64| {
                    let x = x.abs();
                    let (x2, x3) = (x * x, x * x * x);
                    if x <= 1.0 {
                        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                    } else if x < 2.0 {
                        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / scale).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start)
                    .map(|i| f(scale * (i as f64 - ratio)))
                    .collect();
                let s: f64 = c.iter().sum();
                c.into_iter().map(|v| v / s).collect()
            }
        }
    }

    /// The source coordinate of output position `y` along one axis, and whether it lies
    /// outside the input (tf_crop_and_resize only).
    fn source(
        &self,
        y: f64,
        scale: f64,
        in_w: usize,
        out_w: usize,
        roi: (f64, f64),
    ) -> (f64, bool) {
        let in_f = in_w as f64;
        let out_f = scale * in_f;
        match self.ctm {
            CoordTransform::AlignCorners => {
                if out_f == 1.0 {
                    (0.0, false)
                } else {
                    (y * (in_f - 1.0) / (out_f - 1.0), false)
                }
            }
            CoordTransform::Asymmetric => (y / scale, false),
            CoordTransform::TfCropAndResize => {
                let x = if out_f == 1.0 {
                    (roi.1 - roi.0) * (in_f - 1.0) / 2.0
                } else {
                    y * (roi.1 - roi.0) * (in_f - 1.0) / (out_f - 1.0)
                };
                let x = x + roi.0 * (in_f - 1.0);
                (x, x < 0.0 || x > in_f - 1.0)
            }
            CoordTransform::PytorchHalfPixel => {
                if out_f == 1.0 {
                    (-0.5, false)
                } else {
                    ((y + 0.5) / scale - 0.5, false)
                }
            }
            CoordTransform::HalfPixel => ((y + 0.5) / scale - 0.5, false),
            CoordTransform::HalfPixelSymmetric => {
                let adjustment = out_w as f64 / out_f;
                let center = in_f / 2.0;
                let offset = center * (1.0 - adjustment);
                (offset + (y + 0.5) / scale - 0.5, false)
            }
        }
    }
}

/// Resizes `data` (row-major f64 of `shape`) along `axis` to `out_w` positions.
fn resize_axis(
    data: &[f64],
    shape: &[usize],
    axis: usize,
    scale: f64,
    out_w: usize,
    roi: (f64, f64),
    p: &ResizeParams,
) -> Result<Vec<f64>, OpError> {
    let in_w = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    if in_w == 0 && out_w > 0 {
        return invalid("resize: cannot resize an empty axis to a non-empty one");
    }
    // Per output position: the taps (source index, weight) and the extrapolation flag.
    let mut taps: Vec<(Vec<(usize, f64)>, bool)> = Vec::with_capacity(out_w);
    for y in 0..out_w {
        let (x, outside) = p.source(y as f64, scale, in_w, out_w, roi);
        let q = x.floor();
        let integer = x == q;
        let ratio = if integer { 1.0 } else { x - q };
        let mut c = p.coeffs(ratio, scale);
        let n = c.len() as i64;
        // The window of the `n` taps nearest `x`, ties to the smaller index. As in the
        // reference, it is found on `x` shifted by the edge padding, in f64: the shift can
        // round a coordinate a hair above an integer onto it, which moves the window.
        let pad = (n + 1) / 2;
        let xp = x + pad as f64;
        let pp = xp.floor();
        let frac = xp - pp;
        let offset = if n % 2 == 0 {
            if frac == 0.0 {
                -(n / 2)
            } else {
                -(n / 2) + 1
            }
        } else if frac <= 0.5 {
            -((n - 1) / 2)
        } else {
            -((n - 1) / 2) + 1
        };
        let first = pp as i64 + offset - pad;
        if p.exclude_outside {
            for (k, w) in c.iter_mut().enumerate() {
                let i = first + k as i64;
                if i < 0 || i >= in_w as i64 {
                    *w = 0.0;
                }
            }
            let s: f64 = c.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            c.iter_mut().for_each(|w| *w /= s);
        }
        let t = c
            .into_iter()
            .enumerate()
            .map(|(k, w)| ((first + k as i64).clamp(0, in_w as i64 - 1) as usize, w))
            .collect();
        taps.push((t, outside));
    }
    let mut out = Vec::with_capacity(outer * out_w * inner);
    for o in 0..outer {
        for (t, outside) in &taps {
            if *outside {
                out.extend(std::iter::repeat_n(p.extrapolation, inner));
                continue;
            }
            for i in 0..inner {
                let mut acc = 0.0;
                for &(s, w) in t {
                    acc += w * data[(o * in_w + s) * inner + i];
                }
                out.push(acc);
            }
        }
    }
    Ok(out)
}

fn resize(
    x: &Tensor,
    roi: Option<&Tensor>,
    scales: Option<&Tensor>,
    sizes: Option<&Tensor>,
    axes: &[i64],
    p: &ResizeParams,
) -> Result<Tensor, OpError> {
    if p.antialias && p.mode == ResizeMode::Nearest {
        return invalid("resize: antialias is not defined for nearest mode");
    }
    let shape = x.shape().to_vec();
    let r = shape.len();
    let axes: Vec<usize> = if axes.is_empty() {
        (0..r).collect()
    } else {
        axes.iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<_, _>>()?
    };
    let k = axes.len();
    let roi = match roi {
        Some(t) => {
            let v = t.to_f64_vec();
            if v.len() != 2 * k {
                return invalid(format!("resize: roi has {} values for {k} axes", v.len()));
            }
            let mut full = vec![0.0; r];
            full.extend(vec![1.0; r]);
            for (i, &d) in axes.iter().enumerate() {
                full[d] = v[i];
                full[r + d] = v[k + i];
            }
            Some(full)
        }
        None if p.ctm == CoordTransform::TfCropAndResize => {
            return invalid("resize: tf_crop_and_resize needs a roi")
        }
        None => None,
    };
    let mut scale = vec![1.0; r];
    let mut out = shape.clone();
    match (scales, sizes) {
        (Some(s), None) => {
            let s = s.to_f64_vec();
            if s.len() != k || s.iter().any(|&v| v <= 0.0) {
                return invalid(format!("resize: scales {s:?} for {k} axes"));
            }
            for (i, &d) in axes.iter().enumerate() {
                scale[d] = s[i];
                out[d] = (s[i] * shape[d] as f64) as usize;
            }
        }
        (None, Some(sz)) => {
            let sz = ints(sz, "sizes")?;
            if sz.len() != k || sz.iter().any(|&v| v < 0) {
                return invalid(format!("resize: sizes {sz:?} for {k} axes"));
            }
            for (i, &d) in axes.iter().enumerate() {
                scale[d] = sz[i] as f64 / shape[d] as f64;
                out[d] = sz[i] as usize;
            }
            if p.policy != AspectPolicy::Stretch {
                let it = axes.iter().map(|&d| scale[d]);
                let s = if p.policy == AspectPolicy::NotLarger {
                    it.fold(f64::INFINITY, f64::min)
                } else {
                    it.fold(f64::NEG_INFINITY, f64::max)
                };
                for &d in &axes {
                    scale[d] = s;
                    out[d] = (s * shape[d] as f64 + 0.5) as usize;
                }
            }
        }
        _ => return invalid("resize: exactly one of scales and sizes must be given"),
    }
    let mut cur_shape = shape.clone();
    let mut data = x.to_f64_vec();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    for &d in &axes {
        let rr = roi.as_ref().map_or((0.0, 1.0), |v| (v[d], v[r + d]));
        let identity = close(scale[d], 1.0)
            && out[d] == cur_shape[d]
            && (roi.is_none() || (rr.0 == 0.0 && close(rr.1, 1.0)));
        if identity {
            continue;
        }
        data = resize_axis(&data, &cur_shape, d, scale[d], out[d], rr, p)?;
        cur_shape[d] = out[d];
    }
    Ok(with_array!(x, _a => from_f64s(_a, &cur_shape, data)))
}

/// A tensor of `like`'s dtype from f64 values (rounded and saturated for integers).
fn from_f64s<T: Elem>(_like: &ArrayD<T>, shape: &[usize], v: Vec<f64>) -> Tensor {
    T::wrap(
        ArrayD::from_shape_vec(IxDyn(shape), v.into_iter().map(T::from_f64).collect())
            .expect("sizes agree"),
    )
}

// ---------------------------------------------------------------------------------------
// GridSample
// ---------------------------------------------------------------------------------------

fn gs_reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng) as i64;
        let r = dx - n as f64 * rng;
        if n % 2 == 0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng) as i64;
        let r = dx - n as f64 * rng;
        if n % 2 == 0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

fn grid_sample(
    x: &Tensor,
    grid: &Tensor,
    mode: GridSampleMode,
    padding: GridPadding,
    align: bool,
) -> Result<Tensor, OpError> {
    let xs = x.shape().to_vec();
    let gs = grid.shape().to_vec();
    if xs.len() < 3 || gs.len() != xs.len() || gs[0] != xs[0] || gs[gs.len() - 1] != xs.len() - 2 {
        return invalid(format!(
            "grid_sample: input {xs:?} and grid {gs:?} do not fit"
        ));
    }
    if !grid.dtype().is_float() {
        return invalid("grid_sample: grid must be a float tensor");
    }
    let (n, c) = (xs[0], xs[1]);
    let dims = &xs[2..];
    let r = dims.len();
    let spatial_in: usize = dims.iter().product();
    let out_sp = &gs[1..gs.len() - 1];
    let n_out: usize = out_sp.iter().product();
    let in_strides = super::data::strides(dims);
    let border: Vec<(f64, f64)> = dims
        .iter()
        .map(|&d| {
            if align {
                (0.0, d as f64 - 1.0)
            } else {
                (-0.5, d as f64 - 0.5)
            }
        })
        .collect();
    // Coordinates are denormalised in the grid's precision and kept in f32 like the
    // reference does.
    let grid_f32 = grid.dtype() != rafter_ir::DType::F64;
    let g = grid.to_f64_vec();
    let xv = x.to_f64_vec();
    let mut out = Vec::with_capacity(n * c * n_out);
    // The source position along each dim for one output point: per dim, taps of
    // (index or None for a zero, weight).
    let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![Vec::new(); r];
    let mut per_point: Vec<Vec<(usize, f64)>> = Vec::with_capacity(n_out);
    for b in 0..n {
        per_point.clear();
        for o in 0..n_out {
            let gp = &g[(b * n_out + o) * r..(b * n_out + o + 1) * r];
            for i in 0..r {
                let nv = gp[r - 1 - i];
                let len = dims[i] as f64;
                let mut v = if grid_f32 {
                    let nv = nv as f32;
                    (if align {
                        (nv + 1.0) / 2.0 * (len as f32 - 1.0)
                    } else {
                        ((nv + 1.0) * len as f32 - 1.0) / 2.0
                    }) as f64
                } else {
                    (if align {
                        (nv + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((nv + 1.0) * len - 1.0) / 2.0
                    }) as f32 as f64
                };
                if mode == GridSampleMode::Nearest {
                    v = v.round_ties_even();
                }
                let (lo, hi) = border[i];
                if v < lo || v > hi {
                    v = match padding {
                        GridPadding::Border => v.clamp(0.0, len - 1.0),
                        GridPadding::Reflection => gs_reflect(v, lo, hi) as f32 as f64,
                        GridPadding::Zeros => v,
                    };
                }
                let fetch = |i0: i64| -> Option<usize> {
                    let d = dims[i] as i64;
                    match padding {
                        GridPadding::Zeros => (0..d).contains(&i0).then_some(i0 as usize),
                        GridPadding::Border => Some(i0.clamp(0, d - 1) as usize),
                        GridPadding::Reflection => {
                            Some((gs_reflect(i0 as f64, lo, hi) as i64).clamp(0, d - 1) as usize)
                        }
                    }
                };
                taps[i].clear();
                match mode {
                    GridSampleMode::Nearest => taps[i].push((fetch(v as i64), 1.0)),
                    GridSampleMode::Linear => {
                        let x0 = v.floor();
                        let t = v - x0;
                        taps[i].push((fetch(x0 as i64), 1.0 - t));
                        taps[i].push((fetch(x0 as i64 + 1), t));
                    }
                    GridSampleMode::Cubic => {
                        let x0 = v.floor();
                        let cf = cubic_coeffs(v - x0);
                        for (k, w) in cf.into_iter().enumerate() {
                            taps[i].push((fetch(x0 as i64 - 1 + k as i64), w));
                        }
                    }
                }
            }
            // The tensor product of the per-dim taps, dropping zero-padded ones.
            let mut pts: Vec<(usize, f64)> = vec![(0, 1.0)];
            for (i, t) in taps.iter().enumerate() {
                let mut next = Vec::with_capacity(pts.len() * t.len());
                for &(off, w) in &pts {
                    for &(idx, tw) in t {
                        if let Some(idx) = idx {
                            next.push((off + idx * in_strides[i], w * tw));
                        }
                    }
                }
                pts = next;
            }
            per_point.push(pts);
        }
        for ch in 0..c {
            let base = (b * c + ch) * spatial_in;
            for pts in &per_point {
                out.push(pts.iter().map(|&(off, w)| w * xv[base + off]).sum::<f64>());
            }
        }
    }
    let mut out_shape = vec![n, c];
    out_shape.extend_from_slice(out_sp);
    Ok(with_array!(x, a => from_f64s(a, &out_shape, out)))
}

// ---------------------------------------------------------------------------------------
// NonMaxSuppression
// ---------------------------------------------------------------------------------------

/// Whether two boxes overlap by more than `thr` (intersection over union).
fn suppress(b1: &[f64], b2: &[f64], center: bool, thr: f64, f32_math: bool) -> bool {
    let q = |v: f64| if f32_math { v as f32 as f64 } else { v };
    let span = |b: &[f64], i: usize, j: usize| -> (f64, f64) {
        if center {
            let h = q(b[j] / 2.0);
            (q(b[i] - h), q(b[i] + h))
        } else {
            (b[i].min(b[j]), b[i].max(b[j]))
        }
    };
    let (xi, yi, xj, yj) = if center { (0, 1, 2, 3) } else { (1, 0, 3, 2) };
    let (x1min, x1max) = span(b1, xi, xj);
    let (x2min, x2max) = span(b2, xi, xj);
    let (ix0, ix1) = (x1min.max(x2min), x1max.min(x2max));
    if ix1 <= ix0 {
        return false;
    }
    let (y1min, y1max) = span(b1, yi, yj);
    let (y2min, y2max) = span(b2, yi, yj);
    let (iy0, iy1) = (y1min.max(y2min), y1max.min(y2max));
    if iy1 <= iy0 {
        return false;
    }
    let inter = q(q(ix1 - ix0) * q(iy1 - iy0));
    if inter <= 0.0 {
        return false;
    }
    let a1 = q(q(x1max - x1min) * q(y1max - y1min));
    let a2 = q(q(x2max - x2min) * q(y2max - y2min));
    let union = q(q(a1 + a2) - inter);
    if a1 <= 0.0 || a2 <= 0.0 || union <= 0.0 {
        return false;
    }
    q(inter / union) > thr
}

fn non_max_suppression(
    boxes: &Tensor,
    scores: &Tensor,
    max_out: Option<&Tensor>,
    iou: Option<&Tensor>,
    score_thr: Option<&Tensor>,
    center: bool,
) -> Result<Tensor, OpError> {
    let (&[nb, nbox, 4], &[sb, nc, sn]) = (boxes.shape(), scores.shape()) else {
        return invalid(format!(
            "non_max_suppression: boxes {:?} and scores {:?}",
            boxes.shape(),
            scores.shape()
        ));
    };
    if sb != nb || sn != nbox {
        return invalid(format!(
            "non_max_suppression: boxes {:?} and scores {:?} disagree",
            boxes.shape(),
            scores.shape()
        ));
    }
    let max_out = match max_out {
        Some(t) => ints(t, "max_output_boxes_per_class")?[0].max(0) as usize,
        None => 0,
    };
    let f32_math = boxes.dtype() != rafter_ir::DType::F64;
    let iou = iou.map_or(0.0, |t| t.to_f64_vec()[0]);
    let score_thr = score_thr.map(|t| t.to_f64_vec()[0]);
    let bv = boxes.to_f64_vec();
    let sv = scores.to_f64_vec();
    let mut sel: Vec<i64> = Vec::new();
    for b in 0..nb {
        for cl in 0..nc {
            let s = &sv[(b * nc + cl) * nbox..(b * nc + cl + 1) * nbox];
            let mut cand: Vec<usize> = (0..nbox)
                .filter(|&i| score_thr.is_none_or(|t| s[i] > t))
                .collect();
            // Highest score first; equal scores keep the lower index first.
            cand.sort_by(|&i, &j| s[j].total_cmp(&s[i]).then(i.cmp(&j)));
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= max_out {
                    break;
                }
                let bi = &bv[(b * nbox + i) * 4..(b * nbox + i + 1) * 4];
                let clash = kept.iter().any(|&j| {
                    let bj = &bv[(b * nbox + j) * 4..(b * nbox + j + 1) * 4];
                    suppress(bi, bj, center, iou, f32_math)
                });
                if !clash {
                    kept.push(i);
                    sel.extend([b as i64, cl as i64, i as i64]);
                }
            }
        }
    }
    Ok(Tensor::i64s(&[sel.len() / 3, 3], sel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: ResizeMode, ctm: CoordTransform) -> ResizeParams {
        ResizeParams {
            mode,
            ctm,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
            policy: AspectPolicy::Stretch,
        }
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.to_f64_vec().into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn resize_nearest_upsample() {
        let x = Tensor::f32s(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let s = Tensor::f32s(&[4], vec![1.0, 1.0, 2.0, 3.0]);
        let p = params(ResizeMode::Nearest, CoordTransform::Asymmetric);
        let y = resize(&x, None, Some(&s), None, &[], &p).unwrap();
        assert_eq!(y.shape(), &[1, 1, 4, 6]);
        assert_eq!(
            vals(&y),
            // Columns read 0, 1/3, 2/3, 1, 4/3, 5/3 → 0 0 1 1 1 1; rows 0, .5, 1, 1.5 → 0 0 1 1.
            [
                1., 1., 2., 2., 2., 2., 1., 1., 2., 2., 2., 2., 3., 3., 4., 4., 4., 4., 3., 3., 4.,
                4., 4., 4.
            ]
        );
    }

    #[test]
    fn resize_linear_half_pixel() {
        // 1-D [1, 2] upsampled x2 with half_pixel: positions -0.25, 0.25, 0.75, 1.25.
        let x = Tensor::f32s(&[2], vec![1.0, 2.0]);
        let s = Tensor::f32s(&[1], vec![2.0]);
        let p = params(ResizeMode::Linear, CoordTransform::HalfPixel);
        let y = resize(&x, None, Some(&s), None, &[], &p).unwrap();
        assert_eq!(vals(&y), [1.0, 1.25, 1.75, 2.0]);
        // align_corners with sizes: [1, 1.5, 2].
        let p = params(ResizeMode::Linear, CoordTransform::AlignCorners);
        let sz = Tensor::i64s(&[1], vec![3]);
        let y = resize(&x, None, None, Some(&sz), &[], &p).unwrap();
        assert_eq!(vals(&y), [1.0, 1.5, 2.0]);
    }

    /// The reference finds the tap window on the edge-padded coordinate; here position 2
    /// maps to 3 + 4e-16, which the padding shift rounds onto 5.0, so the window starts
    /// one tap early (onnx's op_resize gives 4.2857..., not 9.2857...).
    #[test]
    fn resize_window_follows_reference_rounding() {
        let x = Tensor::f32s(&[7], (0..7).map(|i| (i * i) as f32).collect());
        let s = Tensor::f32s(&[1], vec![0.8]);
        let mut p = params(ResizeMode::Linear, CoordTransform::HalfPixelSymmetric);
        p.antialias = true;
        let y = vals(&resize(&x, None, Some(&s), None, &[], &p).unwrap());
        let want = [0.5, 3.0, 4.285_714, 19.0, 30.5];
        assert!(
            y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-4),
            "{y:?}"
        );
    }

    #[test]
    fn resize_integers_round_half_even() {
        let x = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1u8, 2]).unwrap());
        let s = Tensor::f32s(&[1], vec![2.0]);
        let p = params(ResizeMode::Linear, CoordTransform::HalfPixel);
        let y = resize(&x, None, Some(&s), None, &[], &p).unwrap();
        // 1, 1.25, 1.75, 2 round to 1, 1, 2, 2.
        assert_eq!(y.to_f64_vec(), [1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn grid_sample_identity_and_zeros() {
        let x = Tensor::f32s(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        // align_corners: corners map exactly to pixels; (2, 2) is far outside → 0.
        let grid = Tensor::f32s(&[1, 1, 3, 2], vec![-1.0, -1.0, 1.0, 1.0, 3.0, 3.0]);
        let y = grid_sample(&x, &grid, GridSampleMode::Linear, GridPadding::Zeros, true).unwrap();
        assert_eq!(vals(&y), [1.0, 4.0, 0.0]);
        // Center of the image: average of all four.
        let grid = Tensor::f32s(&[1, 1, 1, 2], vec![0.0, 0.0]);
        let y = grid_sample(&x, &grid, GridSampleMode::Linear, GridPadding::Zeros, false).unwrap();
        assert_eq!(vals(&y), [2.5]);
    }

    #[test]
    fn nms_suppresses_overlaps() {
        let boxes = Tensor::f32s(
            &[1, 3, 4],
            vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 10.0, 1.0, 11.0],
        );
        let scores = Tensor::f32s(&[1, 1, 3], vec![0.9, 0.95, 0.5]);
        let y = non_max_suppression(
            &boxes,
            &scores,
            Some(&Tensor::i64s(&[1], vec![3])),
            Some(&Tensor::f32s(&[1], vec![0.5])),
            None,
            false,
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(y.to_i64_vec().unwrap(), [0, 0, 1, 0, 0, 2]);
    }
}
