//! Conv, ConvTranspose and ConvInteger, N-d, through im2col / col2im and the blocked
//! matrix product.

use super::matmul::as_i32;
use super::{by_float, per_dim, positive, window_offsets, Real};
use crate::ops::data::layout::transpose;
use crate::ops::{arg, invalid, OpError};
use crate::Tensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayView2, ArrayViewMut2, IxDyn, LinalgScalar};
use rafter_ir::AutoPad;

/// The attributes Conv, ConvTranspose and ConvInteger share.
pub struct ConvParams<'a> {
    pub kernel_shape: &'a [i64],
    pub strides: &'a [i64],
    pub pads: &'a [i64],
    pub dilations: &'a [i64],
    pub group: i64,
    pub auto_pad: AutoPad,
}

/// Resolved sliding-window geometry.
#[derive(Debug, PartialEq)]
pub(crate) struct Geom {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pad_begin: Vec<i64>,
    pub out: Vec<usize>,
}

fn kernel_of(p: &ConvParams, w_kernel: &[usize]) -> Result<Vec<usize>, OpError> {
    if p.kernel_shape.is_empty() {
        return Ok(w_kernel.to_vec());
    }
    let k = positive(p.kernel_shape, "kernel_shape")?;
    if k != w_kernel {
        return invalid(format!(
            "kernel_shape {k:?} disagrees with the weight's kernel dims {w_kernel:?}"
        ));
    }
    Ok(k)
}

/// Conv output geometry (ONNX Conv: SAME pads split with the odd one at the end for
/// SAME_UPPER, at the beginning for SAME_LOWER).
pub(crate) fn conv_geometry(
    p: &ConvParams,
    in_sp: &[usize],
    w_kernel: &[usize],
) -> Result<Geom, OpError> {
    let n = in_sp.len();
    let kernel = kernel_of(p, w_kernel)?;
    let strides = positive(&per_dim(p.strides, n, 1, "strides")?, "strides")?;
    let dilations = positive(&per_dim(p.dilations, n, 1, "dilations")?, "dilations")?;
    let (mut pb, mut pe) = (vec![0i64; n], vec![0i64; n]);
    match p.auto_pad {
        AutoPad::NotSet => {
            let pads = per_dim(p.pads, 2 * n, 0, "pads")?;
            pb.copy_from_slice(&pads[..n]);
            pe.copy_from_slice(&pads[n..]);
        }
        AutoPad::Valid => {}
        AutoPad::SameUpper | AutoPad::SameLower => {
            for d in 0..n {
                let eff = ((kernel[d] - 1) * dilations[d] + 1) as i64;
                let (i, s) = (in_sp[d] as i64, strides[d] as i64);
                let target = (i + s - 1) / s;
                let need = ((target - 1) * s + eff - i).max(0);
                pb[d] = if p.auto_pad == AutoPad::SameLower {
                    (need + 1) / 2
                } else {
                    need / 2
                };
                pe[d] = need - pb[d];
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    for d in 0..n {
        let eff = ((kernel[d] - 1) * dilations[d] + 1) as i64;
        let span = in_sp[d] as i64 + pb[d] + pe[d] - eff;
        if span < 0 {
            return invalid(format!(
                "kernel extent {eff} exceeds padded input {} on spatial dim {d}",
                span + eff
            ));
        }
        out.push((span / strides[d] as i64 + 1) as usize);
    }
    Ok(Geom {
        kernel,
        strides,
        dilations,
        pad_begin: pb,
        out,
    })
}

/// ConvTranspose output geometry: `pad_begin` is where output coordinate 0 sits.
pub(crate) fn conv_transpose_geometry(
    p: &ConvParams,
    in_sp: &[usize],
    w_kernel: &[usize],
    output_padding: &[i64],
    output_shape: &[i64],
) -> Result<Geom, OpError> {
    let n = in_sp.len();
    let kernel = kernel_of(p, w_kernel)?;
    let strides = positive(&per_dim(p.strides, n, 1, "strides")?, "strides")?;
    let dilations = positive(&per_dim(p.dilations, n, 1, "dilations")?, "dilations")?;
    let opad = per_dim(output_padding, n, 0, "output_padding")?;
    let oshape = if output_shape.len() == n + 2 {
        &output_shape[2..]
    } else {
        output_shape
    };
    let oshape = if oshape.is_empty() {
        None
    } else {
        Some(per_dim(oshape, n, 0, "output_shape")?)
    };
    let mut pb = vec![0i64; n];
    let mut out = vec![0usize; n];
    for d in 0..n {
        let eff = ((kernel[d] - 1) * dilations[d] + 1) as i64;
        let (i, s) = (in_sp[d] as i64, strides[d] as i64);
        let full = s * (i - 1) + opad[d] + eff;
        let target = match (&oshape, p.auto_pad) {
            (Some(o), _) => Some(o[d]),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(i * s),
            _ => None,
        };
        let o = match target {
            Some(o) => {
                let total = full - o;
                let half = total.div_euclid(2);
                pb[d] = if p.auto_pad == AutoPad::SameUpper {
                    half
                } else {
                    total - half
                };
                o
            }
            None => {
                let pads = if p.auto_pad == AutoPad::Valid {
                    vec![0; 2 * n]
                } else {
                    per_dim(p.pads, 2 * n, 0, "pads")?
                };
                pb[d] = pads[d];
                full - pads[d] - pads[n + d]
            }
        };
        if o < 0 {
            return invalid(format!("negative output size {o} on spatial dim {d}"));
        }
        out[d] = o as usize;
    }
    Ok(Geom {
        kernel,
        strides,
        dilations,
        pad_begin: pb,
        out,
    })
}

/// Checks the channel arithmetic and returns (channels per group, output channels per
/// group).
fn groups(
    c: usize,
    w0: usize,
    w1: usize,
    group: usize,
    transpose: bool,
) -> Result<(usize, usize), OpError> {
    if group == 0 {
        return invalid("group must be positive");
    }
    if transpose {
        // w: [C, M/group, k...]
        if w0 != c || !c.is_multiple_of(group) {
            return invalid(format!(
                "conv_transpose: input has {c} channels, weight {w0}, group {group}"
            ));
        }
        Ok((c / group, w1))
    } else {
        // w: [M, C/group, k...]
        if w1 * group != c || !w0.is_multiple_of(group) {
            return invalid(format!(
                "conv: input has {c} channels but weight is [{w0}, {w1}, ..] with group {group}"
            ));
        }
        Ok((w1, w0 / group))
    }
}

/// Direct convolution of contiguous `x` [N, C, in...] and `w` [M, C/group, k...].
pub(crate) fn conv_core<T: LinalgScalar>(
    x: &[T],
    xs: &[usize],
    w: &[T],
    ws: &[usize],
    g: &Geom,
    group: usize,
) -> Result<Vec<T>, OpError> {
    let (n, c, in_sp) = (xs[0], xs[1], &xs[2..]);
    let m = ws[0];
    let (cg, mg) = groups(c, ws[0], ws[1], group, false)?;
    let kn: usize = g.kernel.iter().product();
    let pn: usize = g.out.iter().product();
    let inp: usize = in_sp.iter().product();
    let pointwise = kn == 1
        && g.out == in_sp
        && g.pad_begin.iter().all(|&p| p == 0)
        && g.strides.iter().all(|&s| s == 1);
    let table = if pointwise {
        Vec::new()
    } else {
        window_offsets(
            &g.kernel,
            &g.out,
            in_sp,
            &g.strides,
            &g.dilations,
            &g.pad_begin,
        )
    };
    let mut out = vec![T::zero(); n * m * pn];
    let mut cols = if pointwise {
        Vec::new()
    } else {
        vec![T::zero(); cg * kn * pn]
    };
    for ni in 0..n {
        for gi in 0..group {
            let x_img = &x[(ni * c + gi * cg) * inp..(ni * c + (gi + 1) * cg) * inp];
            let colv = if pointwise {
                ArrayView2::from_shape((cg, pn), x_img).expect("sizes")
            } else {
                for ci in 0..cg {
                    let src = &x_img[ci * inp..(ci + 1) * inp];
                    for k in 0..kn {
                        let row = &mut cols[(ci * kn + k) * pn..(ci * kn + k + 1) * pn];
                        let tab = &table[k * pn..(k + 1) * pn];
                        for (r, &off) in row.iter_mut().zip(tab) {
                            *r = if off >= 0 {
                                src[off as usize]
                            } else {
                                T::zero()
                            };
                        }
                    }
                }
                ArrayView2::from_shape((cg * kn, pn), &cols[..]).expect("sizes")
            };
            let wsz = mg * cg * kn;
            let wv =
                ArrayView2::from_shape((mg, cg * kn), &w[gi * wsz..(gi + 1) * wsz]).expect("sizes");
            let o0 = (ni * m + gi * mg) * pn;
            let mut ov =
                ArrayViewMut2::from_shape((mg, pn), &mut out[o0..o0 + mg * pn]).expect("sizes");
            general_mat_mul(T::one(), &wv, &colv, T::zero(), &mut ov);
        }
    }
    Ok(out)
}

/// Transposed convolution of contiguous `x` [N, C, in...] and `w` [C, M/group, k...].
pub(crate) fn conv_transpose_core<T: LinalgScalar>(
    x: &[T],
    xs: &[usize],
    w: &[T],
    ws: &[usize],
    g: &Geom,
    group: usize,
) -> Result<Vec<T>, OpError> {
    let (n, c, in_sp) = (xs[0], xs[1], &xs[2..]);
    let (cg, mg) = groups(c, ws[0], ws[1], group, true)?;
    let m = mg * group;
    let kn: usize = g.kernel.iter().product();
    let inp: usize = in_sp.iter().product();
    let outp: usize = g.out.iter().product();
    let table = window_offsets(
        &g.kernel,
        in_sp,
        &g.out,
        &g.strides,
        &g.dilations,
        &g.pad_begin,
    );
    let mut out = vec![T::zero(); n * m * outp];
    let mut cols = ndarray::Array2::<T>::zeros((mg * kn, inp));
    for ni in 0..n {
        for gi in 0..group {
            let x0 = (ni * c + gi * cg) * inp;
            let xv = ArrayView2::from_shape((cg, inp), &x[x0..x0 + cg * inp]).expect("sizes");
            let wsz = cg * mg * kn;
            let wv =
                ArrayView2::from_shape((cg, mg * kn), &w[gi * wsz..(gi + 1) * wsz]).expect("sizes");
            general_mat_mul(T::one(), &wv.t(), &xv, T::zero(), &mut cols);
            let cs = cols.as_slice().expect("standard layout");
            for mi in 0..mg {
                let o0 = (ni * m + gi * mg + mi) * outp;
                let o_img = &mut out[o0..o0 + outp];
                for k in 0..kn {
                    let row = &cs[(mi * kn + k) * inp..(mi * kn + k + 1) * inp];
                    let tab = &table[k * inp..(k + 1) * inp];
                    for (&v, &off) in row.iter().zip(tab) {
                        if off >= 0 {
                            let o = &mut o_img[off as usize];
                            *o = *o + v;
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

fn check_ranks(x: &Tensor, w: &Tensor) -> Result<(), OpError> {
    if x.shape().len() < 3 || w.shape().len() != x.shape().len() {
        return invalid(format!(
            "conv input of shape {:?} and weight of shape {:?}",
            x.shape(),
            w.shape()
        ));
    }
    Ok(())
}

fn add_bias<T: Real>(out: &mut [T], b: &[T], n: usize, m: usize) -> Result<(), OpError> {
    if b.len() != m {
        return invalid(format!("bias has {} values for {m} channels", b.len()));
    }
    let per = out.len() / (n * m).max(1);
    for (i, chunk) in out.chunks_mut(per.max(1)).enumerate() {
        let bv = b[i % m];
        chunk.iter_mut().for_each(|v| *v += bv);
    }
    Ok(())
}

pub fn conv(inputs: &[Option<&Tensor>], p: &ConvParams) -> Result<Tensor, OpError> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let b = inputs.get(2).copied().flatten();
    check_ranks(x, w)?;
    let g = conv_geometry(p, &x.shape()[2..], &w.shape()[2..])?;
    let dt = x.dtype();
    by_float!(dt, "conv", T => {
        let xv = T::view(x)?;
        let xv = xv.as_standard_layout();
        let wv = T::view(w)?;
        let wv = wv.as_standard_layout();
        let mut out = conv_core(
            xv.as_slice().expect("standard"), x.shape(),
            wv.as_slice().expect("standard"), w.shape(), &g, p.group.max(1) as usize,
        )?;
        let (n, m) = (x.shape()[0], w.shape()[0]);
        if let Some(b) = b {
            let bv = T::view(b)?;
            let bv: Vec<T> = bv.iter().copied().collect();
            add_bias(&mut out, &bv, n, m)?;
        }
        let mut shape = vec![n, m];
        shape.extend(&g.out);
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&shape), out).expect("sizes"), dt))
    })
}

/// Conv with channels last (`conv_nhwc`): x [N, s..., C] and w [k..., C/group, M] are
/// permuted to Conv's layouts, convolved, and the result permuted back to [N, o..., M]. The
/// reference favours being evidently the same as `conv` over speed.
pub fn conv_nhwc(inputs: &[Option<&Tensor>], p: &ConvParams) -> Result<Tensor, OpError> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    check_ranks(x, w)?;
    let r = x.shape().len() as i64;
    // x: [N, s..., C] -> [N, C, s...]; w: [k..., I, M] -> [M, I, k...].
    let x_perm: Vec<i64> = [0, r - 1].into_iter().chain(1..r - 1).collect();
    let w_perm: Vec<i64> = [r - 1, r - 2].into_iter().chain(0..r - 2).collect();
    let y_perm: Vec<i64> = [0].into_iter().chain(2..r).chain([1]).collect();
    let xt = transpose(x, &x_perm)?;
    let wt = transpose(w, &w_perm)?;
    let mut args: Vec<Option<&Tensor>> = vec![Some(&xt), Some(&wt)];
    args.extend(inputs.get(2).copied());
    transpose(&conv(&args, p)?, &y_perm)
}

pub fn conv_transpose(
    inputs: &[Option<&Tensor>],
    p: &ConvParams,
    output_padding: &[i64],
    output_shape: &[i64],
) -> Result<Tensor, OpError> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let b = inputs.get(2).copied().flatten();
    check_ranks(x, w)?;
    let g = conv_transpose_geometry(
        p,
        &x.shape()[2..],
        &w.shape()[2..],
        output_padding,
        output_shape,
    )?;
    let dt = x.dtype();
    let group = p.group.max(1) as usize;
    by_float!(dt, "conv_transpose", T => {
        let xv = T::view(x)?;
        let xv = xv.as_standard_layout();
        let wv = T::view(w)?;
        let wv = wv.as_standard_layout();
        let mut out = conv_transpose_core(
            xv.as_slice().expect("standard"), x.shape(),
            wv.as_slice().expect("standard"), w.shape(), &g, group,
        )?;
        let (n, m) = (x.shape()[0], w.shape()[1] * group);
        if let Some(b) = b {
            let bv = T::view(b)?;
            let bv: Vec<T> = bv.iter().copied().collect();
            add_bias(&mut out, &bv, n, m)?;
        }
        let mut shape = vec![n, m];
        shape.extend(&g.out);
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&shape), out).expect("sizes"), dt))
    })
}

pub fn conv_integer(inputs: &[Option<&Tensor>], p: &ConvParams) -> Result<Tensor, OpError> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    check_ranks(x, w)?;
    let mut xi = as_i32(x)?;
    let mut wi = as_i32(w)?;
    if let Some(zp) = inputs.get(2).copied().flatten() {
        let zp = as_i32(zp)?;
        if zp.len() != 1 {
            return invalid(format!(
                "x_zero_point must be a scalar, got shape {:?}",
                zp.shape()
            ));
        }
        let z = zp.iter().next().copied().unwrap_or(0);
        xi.mapv_inplace(|v| v - z);
    }
    if let Some(zp) = inputs.get(3).copied().flatten() {
        let zp = as_i32(zp)?;
        let m = wi.shape()[0];
        if zp.len() == 1 {
            let z = zp.iter().next().copied().unwrap_or(0);
            wi.mapv_inplace(|v| v - z);
        } else if zp.len() == m {
            let zv: Vec<i32> = zp.iter().copied().collect();
            for (i, mut oc) in wi.outer_iter_mut().enumerate() {
                oc.mapv_inplace(|v| v - zv[i]);
            }
        } else {
            return invalid(format!("w_zero_point of shape {:?}", zp.shape()));
        }
    }
    let g = conv_geometry(p, &x.shape()[2..], &w.shape()[2..])?;
    let xi = xi.as_standard_layout();
    let wi = wi.as_standard_layout();
    let out = conv_core(
        xi.as_slice().expect("standard"),
        x.shape(),
        wi.as_slice().expect("standard"),
        w.shape(),
        &g,
        p.group.max(1) as usize,
    )?;
    let mut shape = vec![x.shape()[0], w.shape()[0]];
    shape.extend(&g.out);
    Ok(Tensor::I32(
        ArrayD::from_shape_vec(IxDyn(&shape), out).expect("sizes"),
    ))
}
