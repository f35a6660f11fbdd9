//! Pool (max with indices, average, Lp), GlobalPool and MaxUnpool, N-d.

use super::{by_float, per_dim, positive, strides_of, window_offsets, Real};
use crate::ops::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use num_traits::{One, Zero};
use rafter_ir::{AutoPad, Op, PoolKind};

/// Resolved pooling geometry.
#[derive(Debug, PartialEq)]
pub(crate) struct PoolGeom {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pad_begin: Vec<i64>,
    pub pad_end: Vec<i64>,
    pub out: Vec<usize>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn pool_geometry(
    in_sp: &[usize],
    kernel_shape: &[i64],
    strides: &[i64],
    pads: &[i64],
    dilations: &[i64],
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<PoolGeom, OpError> {
    let n = in_sp.len();
    if kernel_shape.len() != n {
        return invalid(format!(
            "kernel_shape {kernel_shape:?} for {n} spatial dims"
        ));
    }
    let kernel = positive(kernel_shape, "kernel_shape")?;
    let strides = positive(&per_dim(strides, n, 1, "strides")?, "strides")?;
    let dilations = positive(&per_dim(dilations, n, 1, "dilations")?, "dilations")?;
    let (mut pb, mut pe, mut out) = (vec![0i64; n], vec![0i64; n], vec![0usize; n]);
    for d in 0..n {
        let eff = ((kernel[d] - 1) * dilations[d] + 1) as i64;
        let (i, s) = (in_sp[d] as i64, strides[d] as i64);
        let o = match auto_pad {
            AutoPad::SameUpper | AutoPad::SameLower => {
                let o = (i + s - 1) / s;
                let total = ((o - 1) * s + eff - i).max(0);
                pb[d] = if auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                pe[d] = total - pb[d];
                o
            }
            AutoPad::Valid => (i - eff).div_euclid(s) + 1,
            AutoPad::NotSet => {
                let pads = per_dim(pads, 2 * n, 0, "pads")?;
                pb[d] = pads[d];
                pe[d] = pads[n + d];
                let span = i + pb[d] + pe[d] - eff;
                let mut o = if ceil_mode {
                    span.div_euclid(s) + (span.rem_euclid(s) != 0) as i64 + 1
                } else {
                    span.div_euclid(s) + 1
                };
                // The last window must start inside the input or its leading padding.
                if ceil_mode && (o - 1) * s >= i + pb[d] {
                    o -= 1;
                }
                o
            }
        };
        if o < 0 {
            return invalid(format!("pooling window larger than the input on dim {d}"));
        }
        out[d] = o as usize;
    }
    Ok(PoolGeom {
        kernel,
        strides,
        dilations,
        pad_begin: pb,
        pad_end: pe,
        out,
    })
}

impl PoolGeom {
    fn offsets(&self, in_sp: &[usize]) -> Vec<isize> {
        window_offsets(
            &self.kernel,
            &self.out,
            in_sp,
            &self.strides,
            &self.dilations,
            &self.pad_begin,
        )
    }

    /// Per output position, the number of taps inside the padded input (what average
    /// pooling divides by with count_include_pad).
    fn padded_counts(&self, in_sp: &[usize]) -> Vec<usize> {
        let per: Vec<Vec<usize>> = (0..self.out.len())
            .map(|d| {
                (0..self.out[d])
                    .map(|o| {
                        (0..self.kernel[d])
                            .filter(|&k| {
                                let c = (o * self.strides[d]) as i64 - self.pad_begin[d]
                                    + (k * self.dilations[d]) as i64;
                                c < in_sp[d] as i64 + self.pad_end[d]
                            })
                            .count()
                    })
                    .collect()
            })
            .collect();
        let mut v = Vec::with_capacity(self.out.iter().product());
        super::for_each_index(&self.out, |idx| {
            v.push(idx.iter().enumerate().map(|(d, &o)| per[d][o]).product());
        });
        v
    }
}

/// Max pooling of a contiguous [N, C, spatial...] buffer: values and, per output, the
/// row-major offset of the chosen element within its plane (-1 when none).
fn max_pool_core<T: Copy + PartialOrd + Default>(
    x: &[T],
    planes: usize,
    inp: usize,
    tab: &[isize],
    pn: usize,
) -> (Vec<T>, Vec<isize>) {
    let kn = tab.len().checked_div(pn).unwrap_or(0);
    let mut y = vec![T::default(); planes * pn];
    let mut arg = vec![-1isize; planes * pn];
    for pl in 0..planes {
        let src = &x[pl * inp..(pl + 1) * inp];
        let yo = &mut y[pl * pn..(pl + 1) * pn];
        let ao = &mut arg[pl * pn..(pl + 1) * pn];
        for k in 0..kn {
            for (p, &off) in tab[k * pn..(k + 1) * pn].iter().enumerate() {
                if off < 0 {
                    continue;
                }
                let v = src[off as usize];
                if ao[p] < 0 || v > yo[p] {
                    yo[p] = v;
                    ao[p] = off;
                }
            }
        }
    }
    (y, arg)
}

pub fn pool(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let Op::Pool {
        kind,
        kernel_shape,
        strides,
        pads,
        dilations,
        auto_pad,
        ceil_mode,
        count_include_pad,
        p,
        storage_order,
    } = op
    else {
        return unsupported("not a pool op");
    };
    let x = arg(inputs, 0)?;
    if x.shape().len() < 3 {
        return invalid(format!("pool input of shape {:?}", x.shape()));
    }
    let in_sp = x.shape()[2..].to_vec();
    let g = pool_geometry(
        &in_sp,
        kernel_shape,
        strides,
        pads,
        dilations,
        *auto_pad,
        *ceil_mode,
    )?;
    let tab = g.offsets(&in_sp);
    let planes = x.shape()[0] * x.shape()[1];
    let inp: usize = in_sp.iter().product();
    let pn: usize = g.out.iter().product();
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(&g.out);
    match kind {
        PoolKind::Max => {
            macro_rules! go {
                ($($v:ident),*) => {
                    match x {
                        $(Tensor::$v(a) => {
                            let a = a.as_standard_layout();
                            let (y, am) = max_pool_core(a.as_slice().expect("standard"), planes, inp, &tab, pn);
                            (Tensor::$v(arr(&shape, y)), am)
                        })*
                        Tensor::Bool(_) => return unsupported("max pool of bool"),
                    }
                };
            }
            let (y, am) = go!(F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64);
            let indices = if ctx.wants(1) {
                let col_major = *storage_order == 1;
                let ist = strides_of(&in_sp);
                let n = in_sp.len();
                let idx: Vec<i64> = am
                    .iter()
                    .enumerate()
                    .map(|(i, &off)| {
                        if off < 0 {
                            return -1;
                        }
                        let plane = (i / pn.max(1)) as i64 * inp as i64;
                        let mut off = off as usize;
                        if !col_major {
                            return plane + off as i64;
                        }
                        // Re-linearise the coordinates with the first spatial dim fastest.
                        let mut coord = vec![0usize; n];
                        for d in 0..n {
                            coord[d] = off / ist[d];
                            off %= ist[d];
                        }
                        let mut lin = 0usize;
                        let mut mul = 1usize;
                        for d in 0..n {
                            lin += coord[d] * mul;
                            mul *= in_sp[d];
                        }
                        plane + lin as i64
                    })
                    .collect();
                Some(Tensor::I64(arr(&shape, idx)))
            } else {
                None
            };
            Ok(vec![Some(y), indices])
        }
        PoolKind::Average | PoolKind::Lp => {
            let dt = x.dtype();
            let counts = if *count_include_pad && *kind == PoolKind::Average {
                Some(g.padded_counts(&in_sp))
            } else {
                None
            };
            let kn = tab.len().checked_div(pn).unwrap_or(0);
            let y = by_float!(dt, "average/lp pool", T => {
                let a = T::view(x)?;
                let a = a.as_standard_layout();
                let xs = a.as_slice().expect("standard");
                let mut y = vec![T::zero(); planes * pn];
                let mut cnt = vec![0usize; pn];
                let pw = *p as i32;
                for pl in 0..planes {
                    let src = &xs[pl * inp..(pl + 1) * inp];
                    let yo = &mut y[pl * pn..(pl + 1) * pn];
                    cnt.iter_mut().for_each(|c| *c = 0);
                    for k in 0..kn {
                        for (pi, &off) in tab[k * pn..(k + 1) * pn].iter().enumerate() {
                            if off >= 0 {
                                let v = src[off as usize];
                                yo[pi] += if *kind == PoolKind::Lp { v.abs().powi(pw) } else { v };
                                cnt[pi] += 1;
                            }
                        }
                    }
                    for (pi, v) in yo.iter_mut().enumerate() {
                        *v = if *kind == PoolKind::Lp {
                            v.powf(T::one() / T::of(*p as f64))
                        } else {
                            let c = counts.as_ref().map_or(cnt[pi], |c| c[pi]);
                            *v / T::of(c as f64)
                        };
                    }
                }
                Ok(T::wrap(arr(&shape, y), dt))
            })?;
            Ok(vec![Some(y)])
        }
    }
}

pub fn global_pool(inputs: &[Option<&Tensor>], kind: PoolKind, p: i64) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    if x.shape().len() < 2 {
        return invalid(format!("global pool input of shape {:?}", x.shape()));
    }
    let planes = x.shape()[0] * x.shape()[1];
    let inp: usize = x.shape()[2..].iter().product();
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.shape().len() - 2));
    if kind == PoolKind::Max {
        macro_rules! go {
            ($($v:ident),*) => {
                match x {
                    $(Tensor::$v(a) => {
                        let a = a.as_standard_layout();
                        let s = a.as_slice().expect("standard");
                        let tab: Vec<isize> = (0..inp as isize).collect();
                        let (y, _) = max_pool_core(s, planes, inp, &tab, 1);
                        Tensor::$v(ArrayD::from_shape_vec(IxDyn(&shape), y).expect("sizes"))
                    })*
                    Tensor::Bool(_) => return unsupported("max pool of bool"),
                }
            };
        }
        return Ok(go!(
            F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64
        ));
    }
    let dt = x.dtype();
    by_float!(dt, "global pool", T => {
        let a = T::view(x)?;
        let a = a.as_standard_layout();
        let s = a.as_slice().expect("standard");
        let y: Vec<T> = (0..planes)
            .map(|pl| {
                let src = &s[pl * inp..(pl + 1) * inp];
                if kind == PoolKind::Lp {
                    let sum: T = src.iter().map(|v| v.abs().powi(p as i32)).sum();
                    sum.powf(T::one() / T::of(p as f64))
                } else {
                    src.iter().copied().sum::<T>() / T::of(inp as f64)
                }
            })
            .collect();
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&shape), y).expect("sizes"), dt))
    })
}

/// MaxUnpool as ONNX's reference does it: values are scattered by their flat indices into
/// the inferred unpooled shape `(in - 1) * stride - pads + kernel`, which is then placed at
/// the origin of a zero tensor of `output_shape` (when given).
pub fn max_unpool(
    inputs: &[Option<&Tensor>],
    kernel_shape: &[i64],
    strides: &[i64],
    pads: &[i64],
) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    let ind = arg(inputs, 1)?
        .to_i64_vec()
        .ok_or_else(|| OpError::Invalid("max_unpool indices must be integers".into()))?;
    if x.shape().len() < 3 || ind.len() != x.len() {
        return invalid(format!(
            "max_unpool input of shape {:?} with {} indices",
            x.shape(),
            ind.len()
        ));
    }
    let n = x.shape().len() - 2;
    let kernel = positive(kernel_shape, "kernel_shape")?;
    if kernel.len() != n {
        return invalid(format!(
            "kernel_shape {kernel_shape:?} for {n} spatial dims"
        ));
    }
    let strides = positive(&per_dim(strides, n, 1, "strides")?, "strides")?;
    let pads = per_dim(pads, 2 * n, 0, "pads")?;
    let mut inferred = x.shape()[..2].to_vec();
    for d in 0..n {
        let v = (x.shape()[d + 2] as i64 - 1) * strides[d] as i64 - pads[d] - pads[n + d]
            + kernel[d] as i64;
        if v < 0 {
            return invalid("negative unpooled size");
        }
        inferred.push(v as usize);
    }
    let out_shape: Vec<usize> = match inputs.get(2).copied().flatten() {
        Some(s) => s
            .to_i64_vec()
            .ok_or_else(|| OpError::Invalid("output_shape must be integers".into()))?
            .iter()
            .map(|&v| v.max(0) as usize)
            .collect(),
        None => inferred.clone(),
    };
    if out_shape.len() != inferred.len() {
        return invalid(format!("output_shape {out_shape:?} has the wrong rank"));
    }
    let total: usize = inferred.iter().product();
    let in_st = strides_of(&inferred);
    let out_st = strides_of(&out_shape);
    // Flat index in the inferred shape → flat index in the output (None when cropped).
    let place = |i: usize| -> Option<usize> {
        let mut rem = i;
        let mut o = 0;
        for d in 0..inferred.len() {
            let c = rem / in_st[d];
            rem %= in_st[d];
            if c >= out_shape[d] {
                return None;
            }
            o += c * out_st[d];
        }
        Some(o)
    };
    macro_rules! go {
        ($($v:ident),*) => {
            match x {
                $(Tensor::$v(a) => {
                    let mut y = ArrayD::from_elem(IxDyn(&out_shape), Default::default());
                    let ys = y.as_slice_mut().expect("standard");
                    for (&v, &i) in a.iter().zip(&ind) {
                        if i < 0 || i as usize >= total {
                            return invalid(format!("max_unpool index {i} out of range"));
                        }
                        if let Some(o) = place(i as usize) {
                            ys[o] = v;
                        }
                    }
                    Tensor::$v(y)
                })*
                Tensor::Bool(_) => return unsupported("max_unpool of bool"),
            }
        };
    }
    Ok(go!(
        F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64
    ))
}

fn arr<T>(shape: &[usize], v: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(shape), v).expect("sizes")
}
