//! Reference kernels: SwiGLU, Det, CenterCropPad, Col2Im, AffineGrid, TensorScatter and the
//! ai.onnx.ml ops Binarizer, ArrayFeatureExtractor and LabelEncoder.
//!
//! Numerics follow ONNX's reference implementation (NumPy): float steps are computed in f64
//! and rounded to the dtype where NumPy rounds them, data movement is exact for every dtype.

use super::data::{ints, norm_axis, norm_index, same, strides, with_dtype, Elem};
use super::elementwise::{cast, from_f64s};
use super::loss::rounder;
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DType, Op, Scalar, TensorScatterMode};
use std::collections::HashMap;

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    let int_arg = |i: usize, what: &str| ints(arg(inputs, i)?, what);
    let y = match op {
        Op::SwiGlu { alpha } => swiglu(x, arg(inputs, 1)?, *alpha)?,
        Op::Det => det(x)?,
        Op::CenterCropPad { axes } => center_crop_pad(x, &int_arg(1, "shape")?, axes)?,
        Op::Col2Im {
            dilations,
            pads,
            strides,
        } => col2im(
            x,
            &int_arg(1, "image_shape")?,
            &int_arg(2, "block_shape")?,
            [dilations, pads, strides],
        )?,
        Op::AffineGrid { align_corners } => affine_grid(x, &int_arg(1, "size")?, *align_corners)?,
        Op::TensorScatter { axis, mode } => tensor_scatter(
            x,
            arg(inputs, 1)?,
            inputs.get(2).copied().flatten(),
            *axis,
            *mode,
        )?,
        Op::Binarizer { threshold } => binarizer(x, *threshold)?,
        Op::ArrayFeatureExtractor => array_feature_extractor(x, arg(inputs, 1)?)?,
        Op::LabelEncoder {
            int_keys,
            float_keys,
            int_values,
            float_values,
            default,
        } => label_encoder(x, int_keys, float_keys, int_values, float_values, default)?,
        _ => return unsupported(format!("`{}` is not handled by misc", op.name())),
    };
    Ok(vec![Some(y)])
}

fn float_only(what: &str, x: &Tensor) -> Result<DType, OpError> {
    let d = x.dtype();
    if d.is_float() {
        Ok(d)
    } else {
        unsupported(format!("`{what}` on {d}"))
    }
}

/// Row-major coordinates of a flat index.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = flat % shape[d].max(1);
        flat /= shape[d].max(1);
    }
    c
}

fn sizes(v: &[i64], what: &str) -> Result<Vec<usize>, OpError> {
    v.iter()
        .map(|&s| usize::try_from(s).map_err(|_| OpError::Invalid(format!("{what} has {s}"))))
        .collect()
}

/// `a * sigmoid(alpha * a) * b`, each NumPy step (`-alpha * a`, `exp`, `1 + _`, `1 / _`, the
/// two products) rounded to the dtype.
fn swiglu(a: &Tensor, b: &Tensor, alpha: f32) -> Result<Tensor, OpError> {
    let d = float_only("swiglu", a)?;
    if b.dtype() != d || b.shape() != a.shape() {
        return invalid(format!(
            "swiglu: b is {}{:?}, a is {d}{:?} (no broadcasting)",
            b.dtype(),
            b.shape(),
            a.shape()
        ));
    }
    let r = rounder(d);
    // NumPy turns the Python float into a's dtype before multiplying.
    let neg_alpha = -r(alpha as f64);
    let y = a
        .to_f64_vec()
        .into_iter()
        .zip(b.to_f64_vec())
        .map(|(a, b)| {
            let sig = r(1.0 / r(1.0 + r(r(neg_alpha * a).exp())));
            r(r(a * sig) * b)
        })
        .collect();
    Ok(from_f64s(d, a.shape(), y))
}

/// The determinant of each trailing square matrix, by LU decomposition with partial
/// pivoting (LAPACK's getrf, which NumPy calls), in f64.
fn det(x: &Tensor) -> Result<Tensor, OpError> {
    let d = float_only("det", x)?;
    let s = x.shape();
    let r = s.len();
    if r < 2 || s[r - 1] != s[r - 2] {
        return invalid(format!("det: x must be [..., M, M], got {s:?}"));
    }
    let m = s[r - 1];
    let v = x.to_f64_vec();
    let batch: usize = s[..r - 2].iter().product();
    let out = (0..batch)
        .map(|b| lu_det(v[b * m * m..(b + 1) * m * m].to_vec(), m))
        .collect();
    Ok(from_f64s(d, &s[..r - 2], out))
}

fn lu_det(mut a: Vec<f64>, m: usize) -> f64 {
    let mut det = 1.0;
    for k in 0..m {
        // The first row with the largest magnitude in column k (LAPACK's idamax).
        let mut p = k;
        for i in k + 1..m {
            if a[i * m + k].abs() > a[p * m + k].abs() {
                p = i;
            }
        }
        if p != k {
            for j in 0..m {
                a.swap(k * m + j, p * m + j);
            }
            det = -det;
        }
        let pivot = a[k * m + k];
        det *= pivot;
        if pivot == 0.0 {
            continue;
        }
        for i in k + 1..m {
            let f = a[i * m + k] / pivot;
            for j in k + 1..m {
                a[i * m + j] -= f * a[k * m + j];
            }
        }
    }
    det
}

fn center_crop_pad(x: &Tensor, shape: &[i64], axes: &[i64]) -> Result<Tensor, OpError> {
    let xs = x.shape().to_vec();
    let rank = xs.len();
    let axes: Vec<usize> = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter()
            .map(|&a| norm_axis(a, rank))
            .collect::<Result<_, _>>()?
    };
    if shape.len() != axes.len() {
        return invalid(format!(
            "center_crop_pad: {} sizes for {} axes",
            shape.len(),
            axes.len()
        ));
    }
    let mut out_shape = xs.clone();
    // Input coordinate = output coordinate + offset (negative where the axis is padded).
    let mut off = vec![0i64; rank];
    for (&a, &sh) in axes.iter().zip(shape) {
        if sh < 0 {
            return invalid(format!("center_crop_pad: negative size {sh}"));
        }
        let dim = xs[a] as i64;
        out_shape[a] = sh as usize;
        off[a] = if sh <= dim {
            (dim - sh) / 2
        } else {
            -((sh - dim) / 2)
        };
    }
    let ist = strides(&xs);
    with_dtype!(x.dtype(), T => {
        let src: Vec<T> = same::<T>(x, "x")?.iter().copied().collect();
        let n: usize = out_shape.iter().product();
        let mut out = vec![T::zero(); n];
        for (flat, o) in out.iter_mut().enumerate() {
            let c = unravel(flat, &out_shape);
            let mut at = 0;
            let inside = (0..rank).all(|k| {
                let i = c[k] as i64 + off[k];
                at += i.max(0) as usize * ist[k];
                (0..xs[k] as i64).contains(&i)
            });
            if inside {
                *o = src[at];
            }
        }
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sizes")))
    })
}

/// Sums the sliding blocks of `x` [N, C * prod(block), L] back into images
/// [N, C, image...], as NumPy's `col2im_naive_implementation`.
fn col2im(
    x: &Tensor,
    image: &[i64],
    block: &[i64],
    [dil, pads, stride]: [&Vec<i64>; 3],
) -> Result<Tensor, OpError> {
    let s = image.len();
    let or = |v: &Vec<i64>, len: usize, fill: i64| -> Result<Vec<i64>, OpError> {
        match v.len() {
            0 => Ok(vec![fill; len]),
            n if n == len => Ok(v.clone()),
            n => invalid(format!("col2im: {n} attribute values for {s} spatial dims")),
        }
    };
    let (dil, pads, st) = (or(dil, s, 1)?, or(pads, 2 * s, 0)?, or(stride, s, 1)?);
    let xs = x.shape();
    if xs.len() != 3 || block.len() != s {
        return invalid(format!(
            "col2im: input {xs:?}, image_shape {image:?}, block_shape {block:?}"
        ));
    }
    if dil.iter().chain(&st).chain(block).any(|&v| v < 1) || pads.iter().any(|&p| p < 0) {
        return invalid("col2im: block, dilations and strides must be positive, pads >= 0");
    }
    let image_u = sizes(image, "image_shape")?;
    let block_u = sizes(block, "block_shape")?;
    let bl: usize = block_u.iter().product();
    if !xs[1].is_multiple_of(bl) {
        return invalid(format!("col2im: {} rows for blocks of {bl}", xs[1]));
    }
    let (n, c, l) = (xs[0], xs[1] / bl, xs[2]);
    let mut dim_col = Vec::with_capacity(s);
    for i in 0..s {
        let span = image[i] + pads[i] + pads[i + s] - (dil[i] * (block[i] - 1) + 1);
        dim_col.push((span.div_euclid(st[i]) + 1).max(0) as usize);
    }
    if dim_col.iter().product::<usize>() != l {
        return invalid(format!(
            "col2im: {l} columns, but the image holds {dim_col:?} blocks"
        ));
    }
    let img: usize = image_u.iter().product();
    let ist = strides(&image_u);
    // For each (block offset, column): the flat image position it adds to, if inside.
    let mut target = Vec::with_capacity(bl * l);
    for k in 0..bl {
        let offset = unravel(k, &block_u);
        for col in 0..l {
            let ic = unravel(col, &dim_col);
            let mut at = Some(0usize);
            for i in 0..s {
                let p = ic[i] as i64 * st[i] - pads[i] + offset[i] as i64 * dil[i];
                at = match at {
                    Some(a) if (0..image[i]).contains(&p) => Some(a + p as usize * ist[i]),
                    _ => None,
                };
            }
            target.push(at);
        }
    }
    let mut out_shape = vec![n, c];
    out_shape.extend(&image_u);
    fn sum<T: Copy + Default>(
        v: &[T],
        out_len: usize,
        rows: usize,
        target: &[Option<usize>],
        img: usize,
        add: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        let mut out = vec![T::default(); out_len];
        let per = target.len();
        for b in 0..rows {
            for (j, t) in target.iter().enumerate() {
                if let Some(t) = t {
                    let o = &mut out[b * img + t];
                    *o = add(*o, v[b * per + j]);
                }
            }
        }
        out
    }
    let d = x.dtype();
    let rows = n * c;
    if d.is_float() {
        let r = rounder(d);
        let y = sum(&x.to_f64_vec(), rows * img, rows, &target, img, |a, b| {
            r(a + b)
        });
        Ok(from_f64s(d, &out_shape, y))
    } else if let (true, Some(v)) = (d.is_int(), x.to_i64_vec()) {
        let y = sum(&v, rows * img, rows, &target, img, i64::wrapping_add);
        Ok(cast(&Tensor::i64s(&out_shape, y), d))
    } else {
        unsupported(format!("`col2im` on {d}"))
    }
}

/// NumPy's `arange` of the normalised coordinates of `len` points: `start + i * delta`
/// with `delta = (start + step) - start`, as NumPy fills it.
fn grid_coords(len: usize, align_corners: bool) -> Vec<f64> {
    let (start, step) = if align_corners {
        if len == 1 {
            return vec![-1.0];
        }
        (-1.0, 2.0 / (len as f64 - 1.0))
    } else {
        let step = 2.0 / len as f64;
        (-1.0 + step / 2.0, step)
    };
    let delta = (start + step) - start;
    (0..len)
        .map(|i| match i {
            0 => start,
            1 => start + step,
            _ => start + i as f64 * delta,
        })
        .collect()
}

fn affine_grid(theta: &Tensor, size: &[i64], align_corners: bool) -> Result<Tensor, OpError> {
    let d = float_only("affine_grid", theta)?;
    let ts = theta.shape();
    let sp = size.len().wrapping_sub(2);
    if !(size.len() == 4 || size.len() == 5)
        || ts.len() != 3
        || ts[1] != sp
        || ts[2] != sp + 1
        || size[0] != ts[0] as i64
    {
        return invalid(format!(
            "affine_grid: theta {ts:?} does not match size {size:?}"
        ));
    }
    let spatial = sizes(&size[2..], "size")?;
    let coords: Vec<Vec<f64>> = spatial
        .iter()
        .map(|&len| grid_coords(len, align_corners))
        .collect();
    let th = theta.to_f64_vec();
    let points: usize = spatial.iter().product();
    let mut out = Vec::with_capacity(ts[0] * points * sp);
    for b in 0..ts[0] {
        for p in 0..points {
            let idx = unravel(p, &spatial);
            // The homogeneous point (x, y[, z], 1): x runs along the last spatial axis.
            let mut hom: Vec<f64> = (0..sp)
                .map(|j| coords[sp - 1 - j][idx[sp - 1 - j]])
                .collect();
            hom.push(1.0);
            for i in 0..sp {
                let row = &th[(b * sp + i) * (sp + 1)..][..sp + 1];
                out.push(row.iter().zip(&hom).map(|(a, h)| a * h).sum());
            }
        }
    }
    let mut shape = vec![ts[0]];
    shape.extend(&spatial);
    shape.push(sp);
    Ok(from_f64s(d, &shape, out))
}

fn tensor_scatter(
    past: &Tensor,
    upd: &Tensor,
    write: Option<&Tensor>,
    axis: i64,
    mode: TensorScatterMode,
) -> Result<Tensor, OpError> {
    let ps = past.shape().to_vec();
    let us = upd.shape();
    let rank = ps.len();
    let axis = norm_axis(axis, rank)?;
    let fits = upd.dtype() == past.dtype()
        && us.len() == rank
        && axis > 0
        && (0..rank).all(|i| {
            if i == axis {
                us[i] <= ps[i]
            } else {
                us[i] == ps[i]
            }
        });
    if !fits {
        return invalid(format!(
            "tensor_scatter: update {}{us:?} does not fit past_cache {}{ps:?} along axis {axis}",
            upd.dtype(),
            past.dtype()
        ));
    }
    let batch = ps[0];
    let wi = match write {
        Some(w) => ints(w, "write_indices")?,
        None => vec![0; batch],
    };
    if wi.len() != batch {
        return invalid(format!(
            "tensor_scatter: {} write indices for a batch of {batch}",
            wi.len()
        ));
    }
    let (max, seq) = (ps[axis], us[axis]);
    let per_batch: usize = ps[1..axis].iter().product();
    let outer = batch * per_batch;
    let inner: usize = ps[axis + 1..].iter().product();
    with_dtype!(past.dtype(), T => {
        let mut out: Vec<T> = same::<T>(past, "past_cache")?.iter().copied().collect();
        let u: Vec<T> = same::<T>(upd, "update")?.iter().copied().collect();
        for o in 0..outer {
            let w = wi[o / per_batch];
            for s in 0..seq {
                let pos = w + s as i64;
                let pos = match mode {
                    TensorScatterMode::Circular => pos.rem_euclid(max as i64) as usize,
                    TensorScatterMode::Linear => norm_index(pos, max)?,
                };
                let dst = (o * max + pos) * inner;
                let src = (o * seq + s) * inner;
                out[dst..dst + inner].copy_from_slice(&u[src..src + inner]);
            }
        }
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&ps), out).expect("sizes")))
    })
}

/// `x > threshold ? 1 : 0` in x's dtype (NumPy compares in x's dtype, or in f64 for ints).
fn binarizer(x: &Tensor, threshold: f32) -> Result<Tensor, OpError> {
    let d = x.dtype();
    if d == DType::Bool {
        return unsupported("`binarizer` on bool");
    }
    let t = threshold as f64;
    let y = x
        .to_f64_vec()
        .into_iter()
        .map(|v| (v > t) as u8 as f64)
        .collect();
    Ok(from_f64s(d, x.shape(), y))
}

fn array_feature_extractor(x: &Tensor, idx: &Tensor) -> Result<Tensor, OpError> {
    let xs = x.shape();
    let Some(&last) = xs.last() else {
        return invalid("array_feature_extractor: x must have rank >= 1");
    };
    let iv: Vec<usize> = ints(idx, "indices")?
        .into_iter()
        .map(|i| norm_index(i, last))
        .collect::<Result<_, _>>()?;
    let out_shape: Vec<usize> = match xs.len() {
        1 => vec![1, iv.len()],
        r => xs[..r - 1].iter().copied().chain([iv.len()]).collect(),
    };
    let outer: usize = xs[..xs.len() - 1].iter().product();
    with_dtype!(x.dtype(), T => {
        let v: Vec<T> = same::<T>(x, "x")?.iter().copied().collect();
        let out: Vec<T> = (0..outer)
            .flat_map(|o| iv.iter().map(move |&i| o * last + i))
            .map(|at| v[at])
            .collect();
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sizes")))
    })
}

/// A float as a map key: -0 and +0 are one key; NaN is none.
fn float_key(v: f64) -> Option<u64> {
    (!v.is_nan()).then(|| (v + 0.0).to_bits())
}

fn label_encoder(
    x: &Tensor,
    int_keys: &[i64],
    float_keys: &[f64],
    int_values: &[i64],
    float_values: &[f64],
    default: &Scalar,
) -> Result<Tensor, OpError> {
    let xd = x.dtype();
    let out = default.dtype();
    let values = if out.is_int() {
        int_values.len()
    } else {
        float_values.len()
    };
    // Position of each element's key (a later duplicate key wins, as in a Python dict).
    let found: Vec<Option<usize>> = if xd.is_int() && values == int_keys.len() {
        let map: HashMap<i64, usize> = int_keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        let v = x.to_i64_vec().expect("integer tensor");
        v.iter().map(|k| map.get(k).copied()).collect()
    } else if xd.is_float() && values == float_keys.len() {
        let map: HashMap<u64, usize> = float_keys
            .iter()
            .enumerate()
            .filter_map(|(i, &k)| Some((float_key(k)?, i)))
            .collect();
        let v = x.to_f64_vec();
        v.iter()
            .map(|&k| float_key(k).and_then(|k| map.get(&k).copied()))
            .collect()
    } else {
        return invalid(format!(
            "label_encoder: {xd} input with {} integer / {} float keys and {values} {out} values",
            int_keys.len(),
            float_keys.len()
        ));
    };
    if out.is_int() {
        let def = match *default {
            Scalar::Int(_, v) => v,
            Scalar::UInt(_, v) => v as i64,
            _ => default.as_f64() as i64,
        };
        let y = found
            .iter()
            .map(|f| f.map_or(def, |i| int_values[i]))
            .collect();
        Ok(cast(&Tensor::i64s(x.shape(), y), out))
    } else if out.is_float() {
        let def = default.as_f64();
        let y = found
            .iter()
            .map(|f| f.map_or(def, |i| float_values[i]))
            .collect();
        Ok(from_f64s(out, x.shape(), y))
    } else {
        unsupported(format!("`label_encoder` to {out}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn f(dims: &[usize], v: &[f32]) -> Tensor {
        Tensor::f32s(dims, v.to_vec())
    }

    #[track_caller]
    fn close(t: &Tensor, shape: &[usize], want: &[f64]) {
        assert_eq!(t.shape(), shape, "shape");
        let got = t.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-6 + 1e-6 * w.abs(),
                "{got:?} vs {want:?}"
            );
        }
    }

    #[test]
    fn swiglu_by_hand() {
        // a * sigmoid(alpha * a) * b: sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4.
        let l3 = 3f32.ln();
        let a = f(&[3], &[0.0, l3, 2.0 * l3]);
        let b = f(&[3], &[5.0, 2.0, -1.0]);
        let y = swiglu(&a, &b, 1.0).unwrap();
        close(
            &y,
            &[3],
            &[0.0, l3 as f64 * 0.75 * 2.0, -(2.0 * l3 as f64) * 0.9],
        );
        // alpha = 1/2 on 2 ln 3 gives sigmoid(ln 3) = 3/4.
        let y = swiglu(&a, &b, 0.5).unwrap();
        close(
            &y,
            &[3],
            &[
                0.0,
                l3 as f64 * 2.0 / (1.0 + 3f64.sqrt().recip()),
                -0.75 * 2.0 * l3 as f64,
            ],
        );
        // f16 stays f16, rounded step by step.
        let h = Tensor::F16(
            ndarray::ArrayD::from_shape_vec(vec![1], vec![f16::from_f32(1.0)]).unwrap(),
        );
        let y = swiglu(&h, &h, 1.0).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        // sigmoid(1) = 0.7310586 rounds to 0.731 (f16), and the product stays there.
        close(&y, &[1], &[f16::from_f32(0.731_058_6).to_f64()]);
        assert!(swiglu(&a, &f(&[1], &[1.0]), 1.0).is_err());
    }

    #[test]
    fn det_by_hand() {
        let x = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        close(&det(&x).unwrap(), &[], &[-2.0]);
        // A row swap is needed for the pivot; the second matrix is singular.
        let x = f(
            &[2, 3, 3],
            &[
                0.0, 2.0, 1.0, 1.0, 1.0, 1.0, 2.0, 0.0, 3.0, 1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 0.0,
                1.0, 1.0,
            ],
        );
        // 0*(3-0) - 2*(3-2) + 1*(0-2) = -4
        close(&det(&x).unwrap(), &[2], &[-4.0, 0.0]);
        assert!(det(&f(&[2, 3], &[0.0; 6])).is_err());
    }

    #[test]
    fn center_crop_pad_by_hand() {
        let x = f(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        // Crop 5 -> 2: start (5 - 2) / 2 = 1; pad 5 -> 8: 1 zero before, 2 after.
        close(&center_crop_pad(&x, &[2], &[]).unwrap(), &[2], &[2.0, 3.0]);
        close(
            &center_crop_pad(&x, &[8], &[0]).unwrap(),
            &[8],
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0],
        );
        let x = Tensor::i64s(&[2, 3], vec![1, 2, 3, 4, 5, 6]);
        let y = center_crop_pad(&x, &[1, 4], &[1, 0]).unwrap();
        assert_eq!(y.to_i64_vec().unwrap(), [0, 2, 5, 0]);
        assert_eq!(y.shape(), &[4, 1]);
        assert!(center_crop_pad(&x, &[1], &[]).is_err());
    }

    #[test]
    fn col2im_by_hand() {
        // One channel, a 1x3 image from 1x2 blocks with stride 1: two columns overlap at
        // the middle pixel.
        let x = f(&[1, 2, 2], &[1.0, 2.0, 10.0, 20.0]);
        let none = vec![];
        let y = col2im(&x, &[1, 3], &[1, 2], [&none, &none, &none]).unwrap();
        close(&y, &[1, 1, 1, 3], &[1.0, 12.0, 20.0]);
        // Padding one on the left and right: 4 blocks, the outer halves fall off.
        let x = f(&[1, 2, 4], &[1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]);
        let pads = vec![0, 1, 0, 1];
        let y = col2im(&x, &[1, 3], &[1, 2], [&none, &pads, &none]).unwrap();
        close(&y, &[1, 1, 1, 3], &[2.0 + 10.0, 3.0 + 20.0, 4.0 + 30.0]);
        let y = col2im(
            &Tensor::i64s(&[1, 2, 2], vec![1, 2, 10, 20]),
            &[1, 3],
            &[1, 2],
            [&none, &none, &none],
        )
        .unwrap();
        assert_eq!(y.to_i64_vec().unwrap(), [1, 12, 20]);
        assert!(col2im(&x, &[1, 4], &[1, 2], [&none, &none, &none]).is_err());
    }

    #[test]
    fn affine_grid_by_hand() {
        // Identity theta on a 2x2 grid: the pixel centres ±1/2 (or the corners ±1).
        let theta = f(&[1, 2, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let y = affine_grid(&theta, &[1, 1, 2, 2], false).unwrap();
        let h = 0.5;
        close(&y, &[1, 2, 2, 2], &[-h, -h, h, -h, -h, h, h, h]);
        let y = affine_grid(&theta, &[1, 1, 2, 2], true).unwrap();
        close(
            &y,
            &[1, 2, 2, 2],
            &[-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0],
        );
        // A translation and a scale: x' = 2x + 1, y' = y - 1, on a 1x3 grid (corners).
        let theta = f(&[1, 2, 3], &[2.0, 0.0, 1.0, 0.0, 1.0, -1.0]);
        let y = affine_grid(&theta, &[1, 3, 1, 3], true).unwrap();
        close(&y, &[1, 1, 3, 2], &[-1.0, -2.0, 1.0, -2.0, 3.0, -2.0]);
        // 3-D: (x, y, z, 1) with x along W.
        let theta = f(
            &[1, 3, 4],
            &[0., 0., 1., 0., 0., 1., 0., 0., 1., 0., 0., 0.],
        );
        let y = affine_grid(&theta, &[1, 1, 2, 1, 1], true).unwrap();
        // rows: x' = z, y' = y (= -1 with align_corners on a size-1 axis), z' = x
        close(&y, &[1, 2, 1, 1, 3], &[-1.0, -1.0, -1.0, 1.0, -1.0, -1.0]);
    }

    #[test]
    fn tensor_scatter_by_hand() {
        // Batch 2, cache length 3, one value per entry; write 2 entries.
        let past = f(&[2, 3, 1], &[0.0; 6]);
        let upd = f(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
        let w = Tensor::i64s(&[2], vec![1, 2]);
        let lin = tensor_scatter(&past, &upd, Some(&w), -2, TensorScatterMode::Linear);
        assert!(lin.is_err(), "2 + 1 is past the end");
        let y = tensor_scatter(&past, &upd, Some(&w), -2, TensorScatterMode::Circular).unwrap();
        close(&y, &[2, 3, 1], &[0.0, 1.0, 2.0, 4.0, 0.0, 3.0]);
        let y = tensor_scatter(&past, &upd, None, 1, TensorScatterMode::Linear).unwrap();
        close(&y, &[2, 3, 1], &[1.0, 2.0, 0.0, 3.0, 4.0, 0.0]);
    }

    #[test]
    fn ml_ops_by_hand() {
        let x = f(&[2, 3], &[0.5, 1.0, 1.5, -2.0, f32::NAN, 3.0]);
        close(
            &binarizer(&x, 1.0).unwrap(),
            &[2, 3],
            &[0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        );
        let xi = Tensor::i64s(&[3], vec![-1, 0, 7]);
        assert_eq!(
            binarizer(&xi, 0.0).unwrap().to_i64_vec().unwrap(),
            [0, 0, 1]
        );

        let idx = Tensor::i64s(&[2], vec![2, -3]);
        close(
            &array_feature_extractor(&x, &idx).unwrap(),
            &[2, 2],
            &[1.5, 0.5, 3.0, -2.0],
        );
        let v = f(&[3], &[7.0, 8.0, 9.0]);
        close(
            &array_feature_extractor(&v, &idx).unwrap(),
            &[1, 2],
            &[9.0, 7.0],
        );
        assert!(array_feature_extractor(&v, &Tensor::i64s(&[1], vec![3])).is_err());

        // Integer keys to floats, unknown ones to the default.
        let y = label_encoder(
            &Tensor::i64s(&[4], vec![3, 1, 5, 3]),
            &[1, 3],
            &[],
            &[],
            &[0.5, 1.5],
            &Scalar::Float(DType::F32, -0.0),
        )
        .unwrap();
        close(&y, &[4], &[1.5, 0.5, 0.0, 1.5]);
        // Float keys (-0 matches 0, NaN matches nothing) to i16.
        let y = label_encoder(
            &f(&[3], &[-0.0, f32::NAN, 2.5]),
            &[],
            &[0.0, 2.5],
            &[10, 20],
            &[],
            &Scalar::Int(DType::I16, -1),
        )
        .unwrap();
        assert_eq!(y.dtype(), DType::I16);
        assert_eq!(y.to_i64_vec().unwrap(), [10, -1, 20]);
    }
}
