//! Reference kernels: RoiAlign and DeformConv.
//!
//! Numerics follow onnx/reference/ops (op_roi_align.py, op_deform_conv.py). RoiAlign
//! works in the operand's float type as NumPy does with float32 scalars; DeformConv samples
//! bilinearly in f64 (the reference's GridSample with align_corners=1 and zero padding)
//! and rounds once.

use super::contraction::{by_float, per_dim, positive, Real};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{Op, RoiPoolMode};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = ctx;
    let out = match op {
        Op::RoiAlign {
            mode,
            half_pixel,
            output_height,
            output_width,
            sampling_ratio,
            spatial_scale,
        } => {
            let p = RoiParams {
                max: *mode == RoiPoolMode::Max,
                half_pixel: *half_pixel,
                oh: *output_height,
                ow: *output_width,
                sampling_ratio: *sampling_ratio,
                spatial_scale: *spatial_scale as f64,
            };
            roi_align(inputs, &p)?
        }
        Op::DeformConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            offset_group,
        } => {
            let p = DeformParams {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                offset_group: *offset_group,
            };
            deform_conv(inputs, &p)?
        }
        _ => return unsupported(format!("`{}` is not a detection op", op.name())),
    };
    Ok(vec![Some(out)])
}

struct RoiParams {
    max: bool,
    half_pixel: bool,
    oh: i64,
    ow: i64,
    sampling_ratio: i64,
    spatial_scale: f64,
}

fn roi_align(inputs: &[Option<&Tensor>], p: &RoiParams) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    let dt = x.dtype();
    by_float!(dt, "roi_align", T => roi_align_t::<T>(inputs, p).map(|a| T::wrap(a, dt)))
}

/// One bilinear sample: the four flat offsets in a [H, W] plane and their weights.
#[derive(Clone, Copy)]
struct Tap<T> {
    pos: [usize; 4],
    w: [T; 4],
}

fn roi_align_t<T: Real>(inputs: &[Option<&Tensor>], p: &RoiParams) -> Result<ArrayD<T>, OpError> {
    let x = T::view(arg(inputs, 0)?)?;
    let rois = T::view(arg(inputs, 1)?)?;
    let bi = arg(inputs, 2)?
        .to_i64_vec()
        .ok_or_else(|| OpError::Invalid("batch_indices must be integers".into()))?;
    if x.ndim() != 4 || rois.ndim() != 2 || rois.shape()[1] != 4 || rois.shape()[0] != bi.len() {
        return invalid(format!(
            "roi_align of x {:?}, rois {:?}, {} batch indices",
            x.shape(),
            rois.shape(),
            bi.len()
        ));
    }
    if p.oh <= 0 || p.ow <= 0 {
        return invalid(format!("output size {}x{}", p.oh, p.ow));
    }
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (ph_n, pw_n) = (p.oh as usize, p.ow as usize);
    let x = x.as_standard_layout();
    let xs = x.as_slice().expect("standard layout");
    let rois: Vec<T> = rois.iter().copied().collect();
    let mut out = vec![T::zero(); bi.len() * c * ph_n * pw_n];
    let scale = T::of(p.spatial_scale);
    let offset = T::of(if p.half_pixel { 0.5 } else { 0.0 });
    let (hf, wf) = (T::of(h as f64), T::of(w as f64));
    for (r, &b) in bi.iter().enumerate() {
        if b < 0 || b as usize >= n {
            return invalid(format!("batch index {b} for batch {n}"));
        }
        let roi = &rois[r * 4..r * 4 + 4];
        let start_w = roi[0] * scale - offset;
        let start_h = roi[1] * scale - offset;
        let end_w = roi[2] * scale - offset;
        let end_h = roi[3] * scale - offset;
        let mut roi_w = end_w - start_w;
        let mut roi_h = end_h - start_h;
        if !p.half_pixel {
            // Malformed rois are forced to 1x1.
            roi_w = roi_w.max(T::one());
            roi_h = roi_h.max(T::one());
        }
        let bin_h = roi_h / T::of(ph_n as f64);
        let bin_w = roi_w / T::of(pw_n as f64);
        let grid = |size: T| -> usize {
            if p.sampling_ratio > 0 {
                p.sampling_ratio as usize
            } else {
                size.ceil().to64().max(0.0) as usize
            }
        };
        let (gh, gw) = (
            grid(roi_h / T::of(ph_n as f64)),
            grid(roi_w / T::of(pw_n as f64)),
        );
        let count = T::of((gh * gw).max(1) as f64);
        // The taps of every bin, shared by all channels.
        let mut taps: Vec<Option<Tap<T>>> = Vec::with_capacity(ph_n * pw_n * gh * gw);
        for ph in 0..ph_n {
            for pw in 0..pw_n {
                for iy in 0..gh {
                    let yy = start_h
                        + T::of(ph as f64) * bin_h
                        + T::of(iy as f64 + 0.5) * bin_h / T::of(gh as f64);
                    for ix in 0..gw {
                        let xx = start_w
                            + T::of(pw as f64) * bin_w
                            + T::of(ix as f64 + 0.5) * bin_w / T::of(gw as f64);
                        taps.push(bilinear_tap(yy, xx, h, w, hf, wf));
                    }
                }
            }
        }
        let bo = b as usize * c * h * w;
        for ch in 0..c {
            let plane = &xs[bo + ch * h * w..bo + (ch + 1) * h * w];
            let mut ti = 0;
            for ph in 0..ph_n {
                for pw in 0..pw_n {
                    let mut acc = T::zero();
                    let mut first = true;
                    for _ in 0..gh * gw {
                        let t = taps[ti];
                        ti += 1;
                        let vals = match t {
                            Some(t) => [0, 1, 2, 3].map(|k| t.w[k] * plane[t.pos[k]]),
                            None => [T::zero(); 4],
                        };
                        if p.max {
                            let v = vals[1..].iter().fold(vals[0], |m, &v| m.max(v));
                            acc = if first { v } else { acc.max(v) };
                            first = false;
                        } else {
                            acc = acc + vals[0] + vals[1] + vals[2] + vals[3];
                        }
                    }
                    if !p.max {
                        acc = acc / count;
                    }
                    out[((r * c + ch) * ph_n + ph) * pw_n + pw] = acc;
                }
            }
        }
    }
    Ok(ArrayD::from_shape_vec(IxDyn(&[bi.len(), c, ph_n, pw_n]), out).expect("sizes"))
}

/// The bilinear taps at (y, x) in an `h` x `w` plane, as RoiAlign's pre-calculation:
/// `None` (all weights zero) outside `[-1, h] x [-1, w]`, coordinates clamped at the far
/// edge.
fn bilinear_tap<T: Real>(y: T, x: T, h: usize, w: usize, hf: T, wf: T) -> Option<Tap<T>> {
    let neg1 = -T::one();
    if y < neg1 || y > hf || x < neg1 || x > wf {
        return None;
    }
    let mut y = y.max(T::zero());
    let mut x = x.max(T::zero());
    let mut y_low = y.to64() as usize;
    let mut x_low = x.to64() as usize;
    let y_high;
    let x_high;
    if y_low >= h.saturating_sub(1) {
        y_low = h.saturating_sub(1);
        y_high = y_low;
        y = T::of(y_low as f64);
    } else {
        y_high = y_low + 1;
    }
    if x_low >= w.saturating_sub(1) {
        x_low = w.saturating_sub(1);
        x_high = x_low;
        x = T::of(x_low as f64);
    } else {
        x_high = x_low + 1;
    }
    let ly = y - T::of(y_low as f64);
    let lx = x - T::of(x_low as f64);
    let hy = T::one() - ly;
    let hx = T::one() - lx;
    Some(Tap {
        pos: [
            y_low * w + x_low,
            y_low * w + x_high,
            y_high * w + x_low,
            y_high * w + x_high,
        ],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    })
}

struct DeformParams<'a> {
    kernel_shape: &'a [i64],
    strides: &'a [i64],
    pads: &'a [i64],
    dilations: &'a [i64],
    group: i64,
    offset_group: i64,
}

/// Bilinear sample of an `h` x `w` plane at (y, x) with zeros outside (GridSample with
/// align_corners=1, padding_mode=zeros).
fn sample_zero_padded(plane: &[f64], h: usize, w: usize, y: f64, x: f64) -> f64 {
    let (y0, x0) = (y.floor(), x.floor());
    let (dy, dx) = (y - y0, x - x0);
    let at = |yy: f64, xx: f64| -> f64 {
        if yy < 0.0 || xx < 0.0 || yy >= h as f64 || xx >= w as f64 {
            0.0
        } else {
            plane[yy as usize * w + xx as usize]
        }
    };
    (1.0 - dy) * (1.0 - dx) * at(y0, x0)
        + (1.0 - dy) * dx * at(y0, x0 + 1.0)
        + dy * (1.0 - dx) * at(y0 + 1.0, x0)
        + dy * dx * at(y0 + 1.0, x0 + 1.0)
}

fn deform_conv(inputs: &[Option<&Tensor>], p: &DeformParams<'_>) -> Result<Tensor, OpError> {
    let (x, wt, off) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    let dt = x.dtype();
    if !dt.is_float() {
        return unsupported(format!("deform_conv of dtype {dt}"));
    }
    let (xs, ws, os) = (x.shape(), wt.shape(), off.shape());
    if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
        return unsupported(format!(
            "deform_conv is 2-D only: x {xs:?}, w {ws:?}, offset {os:?}"
        ));
    }
    let (n, ic, ih, iw) = (xs[0], xs[1], xs[2], xs[3]);
    let oc = ws[0];
    let (oh, ow) = (os[2], os[3]);
    let kernel: Vec<i64> = if p.kernel_shape.is_empty() {
        vec![ws[2] as i64, ws[3] as i64]
    } else {
        p.kernel_shape.to_vec()
    };
    let k = positive(&kernel, "kernel_shape")?;
    let (kh, kw) = (k[0], k[1]);
    let st = positive(&per_dim(p.strides, 2, 1, "strides")?, "strides")?;
    let dl = positive(&per_dim(p.dilations, 2, 1, "dilations")?, "dilations")?;
    let pads = per_dim(p.pads, 4, 0, "pads")?;
    let (group, og) = (p.group.max(1) as usize, p.offset_group.max(1) as usize);
    if ic != ws[1] * group
        || !oc.is_multiple_of(group)
        || !ic.is_multiple_of(og)
        || ws[2] != kh
        || ws[3] != kw
    {
        return invalid(format!(
            "deform_conv shapes x {xs:?}, w {ws:?}, group {group}, offset_group {og}"
        ));
    }
    if os[0] != n || os[1] != og * kh * kw * 2 {
        return invalid(format!(
            "offset of shape {os:?} for offset_group {og}, kernel {kernel:?}"
        ));
    }
    let exp = |i: usize, kk: usize, d: usize, s: usize, pb: i64, pe: i64| -> i64 {
        (i as i64 - ((kk - 1) * d + 1) as i64 + pb + pe) / s as i64 + 1
    };
    if oh as i64 != exp(ih, kh, dl[0], st[0], pads[0], pads[2])
        || ow as i64 != exp(iw, kw, dl[1], st[1], pads[1], pads[3])
    {
        return invalid("padding, dilation, stride and kernel shape disagree with the offset's");
    }
    let mask = match inputs.get(4).copied().flatten() {
        Some(m) => {
            if m.shape() != [n, og * kh * kw, oh, ow] {
                return invalid(format!("mask of shape {:?}", m.shape()));
            }
            Some(m.to_f64_vec())
        }
        None => None,
    };
    let bias = match inputs.get(3).copied().flatten() {
        Some(b) => {
            if b.len() != oc {
                return invalid(format!("bias of shape {:?} for {oc} channels", b.shape()));
            }
            Some(b.to_f64_vec())
        }
        None => None,
    };
    let (xv, wv, ov) = (x.to_f64_vec(), wt.to_f64_vec(), off.to_f64_vec());
    let (icg, ocg, ico) = (ws[1], oc / group, ic / og);
    let taps = kh * kw;
    // Sampled input values: [n, ic, kh, kw, oh, ow].
    let mut cols = vec![0.0f64; n * ic * taps * oh * ow];
    for b in 0..n {
        for c in 0..ic {
            let g = c / ico;
            let plane = &xv[(b * ic + c) * ih * iw..(b * ic + c + 1) * ih * iw];
            for t in 0..taps {
                let (ki, kj) = (t / kw, t % kw);
                for i in 0..oh {
                    for j in 0..ow {
                        // offset[b, g, ki, kj, {dy, dx}, i, j]
                        let oi =
                            |d: usize| (((b * og + g) * taps + t) * 2 + d) * oh * ow + i * ow + j;
                        let y =
                            (i * st[0]) as f64 - pads[0] as f64 + (ki * dl[0]) as f64 + ov[oi(0)];
                        let xx =
                            (j * st[1]) as f64 - pads[1] as f64 + (kj * dl[1]) as f64 + ov[oi(1)];
                        let mut v = sample_zero_padded(plane, ih, iw, y, xx);
                        if let Some(m) = &mask {
                            v *= m[((b * og + g) * taps + t) * oh * ow + i * ow + j];
                        }
                        cols[(((b * ic + c) * taps + t) * oh + i) * ow + j] = v;
                    }
                }
            }
        }
    }
    let mut out = vec![0.0f64; n * oc * oh * ow];
    for b in 0..n {
        for o in 0..oc {
            let g = o / ocg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = bias.as_ref().map_or(0.0, |bv| bv[o]);
                    for cl in 0..icg {
                        let c = g * icg + cl;
                        for t in 0..taps {
                            acc += wv[(o * icg + cl) * taps + t]
                                * cols[(((b * ic + c) * taps + t) * oh + i) * ow + j];
                        }
                    }
                    out[((b * oc + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    Ok(super::elementwise::from_f64s(dt, &[n, oc, oh, ow], out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::contraction::tests::run_op;
    use rafter_ir::DType;

    #[test]
    fn roi_align_averages_bilinear_samples() {
        // A 1x1x2x2 image [[0, 1], [2, 3]]; one roi covering it, one 1x1 bin sampled at
        // the 2x2 grid points (0.25, 0.25) .. (0.75, 0.75) without the half-pixel shift:
        // the bilinear values 0.75, 1.25, 1.75, 2.25 average to 1.5.
        let x = Tensor::f32s(&[1, 1, 2, 2], vec![0.0, 1.0, 2.0, 3.0]);
        let rois = Tensor::f32s(&[1, 4], vec![0.0, 0.0, 1.0, 1.0]);
        let bi = Tensor::i64s(&[1], vec![0]);
        let op = |mode| Op::RoiAlign {
            mode,
            half_pixel: false,
            output_height: 1,
            output_width: 1,
            sampling_ratio: 2,
            spatial_scale: 1.0,
        };
        let ins = [Some(&x), Some(&rois), Some(&bi)];
        let y = run_op(op(RoiPoolMode::Avg), &ins, &[DType::F32])
            .remove(0)
            .unwrap();
        assert_eq!(y.shape(), &[1, 1, 1, 1]);
        assert!((y.to_f64_vec()[0] - 1.5).abs() < 1e-6);
        // Max mode takes the largest weighted corner: at (0.75, 0.75) the corner 3 has
        // weight 0.5625, 1.6875.
        let y = run_op(op(RoiPoolMode::Max), &ins, &[DType::F32])
            .remove(0)
            .unwrap();
        assert!((y.to_f64_vec()[0] - 1.6875).abs() < 1e-6);
    }

    #[test]
    fn deform_conv_samples_at_offsets() {
        // 1x1x2x2 image [[1, 2], [3, 4]], a 1x1 kernel of weight 2, one output position
        // shifted by (0.5, 0.5): the centre value 2.5, times 2, plus bias 1 = 6; with a
        // mask of 0.5: 3.5.
        let x = Tensor::f32s(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let w = Tensor::f32s(&[1, 1, 1, 1], vec![2.0]);
        let off = Tensor::f32s(&[1, 2, 1, 1], vec![0.5, 0.5]);
        let b = Tensor::f32s(&[1], vec![1.0]);
        let mask = Tensor::f32s(&[1, 1, 1, 1], vec![0.5]);
        let op = Op::DeformConv {
            kernel_shape: vec![],
            strides: vec![2, 2],
            pads: vec![],
            dilations: vec![],
            group: 1,
            offset_group: 1,
        };
        let y = run_op(
            op.clone(),
            &[Some(&x), Some(&w), Some(&off), Some(&b)],
            &[DType::F32],
        )
        .remove(0)
        .unwrap();
        assert_eq!(y.shape(), &[1, 1, 1, 1]);
        assert!((y.to_f64_vec()[0] - 6.0).abs() < 1e-6);
        let ins = [Some(&x), Some(&w), Some(&off), Some(&b), Some(&mask)];
        let y = run_op(op, &ins, &[DType::F32]).remove(0).unwrap();
        assert!((y.to_f64_vec()[0] - 3.5).abs() < 1e-6);
    }
}
