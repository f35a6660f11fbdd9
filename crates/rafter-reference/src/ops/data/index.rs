//! Index-driven ops: gathers, scatters, one-hot, masks.

use super::layout::take_axis;
use super::{ints, norm_axis, norm_index, owned, reshaped, same, strides, Elem};
use crate::ops::{invalid, OpError};
use crate::{map_array, with_array, Tensor};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::ScatterReduction;

/// The coordinates of row-major position `flat` in `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = flat % shape[d];
        flat /= shape[d];
    }
    c
}

/// Index values of an integer (or, leniently, float) operand.
fn index_values(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    if t.dtype().is_float() {
        return Ok(t.to_f64_vec().into_iter().map(|v| v as i64).collect());
    }
    ints(t, what)
}

pub fn gather(x: &Tensor, ind: &Tensor, axis: i64) -> Result<Tensor, OpError> {
    let dims = x.shape();
    let axis = norm_axis(axis, dims.len())?;
    let idx: Vec<usize> = ints(ind, "indices")?
        .into_iter()
        .map(|i| norm_index(i, dims[axis]))
        .collect::<Result<_, _>>()?;
    let out: Vec<usize> = dims[..axis]
        .iter()
        .chain(ind.shape())
        .chain(&dims[axis + 1..])
        .copied()
        .collect();
    Ok(map_array!(x, a => reshaped(&take_axis(a, axis, &idx), &out)))
}

pub fn gather_elements(x: &Tensor, ind: &Tensor, axis: i64) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let axis = norm_axis(axis, r)?;
    let ishape = ind.shape().to_vec();
    if ishape.len() != r {
        return invalid(format!(
            "gather_elements: indices rank {} differs from data rank {r}",
            ishape.len()
        ));
    }
    let iv = ints(ind, "indices")?;
    with_array!(x, a => {
        let a = a.as_standard_layout();
        let src = a.as_slice().unwrap();
        let st = strides(a.shape());
        let mut out = Vec::with_capacity(iv.len());
        for (flat, &i) in iv.iter().enumerate() {
            let mut c = unravel(flat, &ishape);
            c[axis] = norm_index(i, a.shape()[axis])?;
            if c.iter().zip(a.shape()).any(|(&c, &d)| c >= d) {
                return invalid(format!("gather_elements: indices shape {ishape:?} exceeds data shape {:?}", a.shape()));
            }
            out.push(src[c.iter().zip(&st).map(|(c, s)| c * s).sum::<usize>()]);
        }
        Ok(Elem::wrap(ArrayD::from_shape_vec(IxDyn(&ishape), out).unwrap()))
    })
}

/// For GatherND and ScatterND: the flat offset into `data_shape` of every index tuple (the
/// last dim of `ind_shape`), tuples of batch `b` offset into batch `b` of the data.
fn nd_offsets(
    data_shape: &[usize],
    iv: &[i64],
    ind_shape: &[usize],
    batch_dims: usize,
) -> Result<(Vec<usize>, usize), OpError> {
    let q = ind_shape.len();
    let r = data_shape.len();
    let Some(&m) = ind_shape.last() else {
        return invalid("indices must have rank >= 1");
    };
    if batch_dims >= q || batch_dims + m > r || data_shape[..batch_dims] != ind_shape[..batch_dims]
    {
        return invalid(format!(
            "indices shape {ind_shape:?} with batch_dims {batch_dims} does not fit data shape {data_shape:?}"
        ));
    }
    let st = strides(data_shape);
    let batch_stride: usize = data_shape[batch_dims..].iter().product();
    let per_batch: usize = ind_shape[batch_dims..q - 1].iter().product();
    let inner: usize = data_shape[batch_dims + m..].iter().product();
    let n: usize = ind_shape[..q - 1].iter().product();
    let mut offs = Vec::with_capacity(n);
    for t in 0..n {
        let mut off = t / per_batch * batch_stride;
        for k in 0..m {
            off += norm_index(iv[t * m + k], data_shape[batch_dims + k])? * st[batch_dims + k];
        }
        offs.push(off);
    }
    Ok((offs, inner))
}

pub fn gather_nd(x: &Tensor, ind: &Tensor, batch_dims: i64) -> Result<Tensor, OpError> {
    let iv = ints(ind, "indices")?;
    let ishape = ind.shape();
    let b = batch_dims.max(0) as usize;
    let (offs, inner) = nd_offsets(x.shape(), &iv, ishape, b)?;
    let m = *ishape.last().unwrap();
    let out_shape: Vec<usize> = ishape[..ishape.len() - 1]
        .iter()
        .chain(&x.shape()[b + m..])
        .copied()
        .collect();
    Ok(map_array!(x, a => {
        let a = a.as_standard_layout();
        let src = a.as_slice().unwrap();
        let mut out = Vec::with_capacity(offs.len() * inner);
        for &o in &offs {
            out.extend_from_slice(&src[o..o + inner]);
        }
        ArrayD::from_shape_vec(IxDyn(&out_shape), out).unwrap()
    }))
}

fn combine<T: Elem>(r: ScatterReduction) -> fn(T, T) -> T {
    match r {
        ScatterReduction::None => |_, n| n,
        ScatterReduction::Add => |o, n| o.plus(n),
        ScatterReduction::Mul => |o, n| o.times(n),
        ScatterReduction::Max => |o: T, n: T| {
            if o.is_nan() || (!n.is_nan() && o >= n) {
                o
            } else {
                n
            }
        },
        ScatterReduction::Min => |o: T, n: T| {
            if o.is_nan() || (!n.is_nan() && o <= n) {
                o
            } else {
                n
            }
        },
    }
}

pub fn scatter_elements(
    x: &Tensor,
    ind: &Tensor,
    upd: &Tensor,
    axis: i64,
    red: ScatterReduction,
) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let axis = norm_axis(axis, r)?;
    let ishape = ind.shape().to_vec();
    if ishape.len() != r || upd.shape() != &ishape[..] {
        return invalid(format!(
            "scatter_elements: data {:?}, indices {ishape:?}, updates {:?}",
            x.shape(),
            upd.shape()
        ));
    }
    let iv = ints(ind, "indices")?;
    with_array!(x, a => {
        let u = same(upd, "updates")?;
        let f = combine(red);
        let mut out = owned(a.view());
        let dims = out.shape().to_vec();
        let st = strides(&dims);
        let dst = out.as_slice_mut().unwrap();
        for (flat, (&i, &v)) in iv.iter().zip(u.iter()).enumerate() {
            let mut c = unravel(flat, &ishape);
            c[axis] = norm_index(i, dims[axis])?;
            if c.iter().zip(&dims).any(|(&c, &d)| c >= d) {
                return invalid(format!("scatter_elements: indices shape {ishape:?} exceeds data shape {dims:?}"));
            }
            let o: usize = c.iter().zip(&st).map(|(c, s)| c * s).sum();
            dst[o] = f(dst[o], v);
        }
        Ok(Elem::wrap(out))
    })
}

pub fn scatter_nd(
    x: &Tensor,
    ind: &Tensor,
    upd: &Tensor,
    red: ScatterReduction,
) -> Result<Tensor, OpError> {
    let iv = ints(ind, "indices")?;
    let ishape = ind.shape();
    let (offs, inner) = nd_offsets(x.shape(), &iv, ishape, 0)?;
    let m = *ishape.last().unwrap();
    let want: Vec<usize> = ishape[..ishape.len() - 1]
        .iter()
        .chain(&x.shape()[m..])
        .copied()
        .collect();
    if upd.shape() != &want[..] {
        return invalid(format!(
            "scatter_nd: updates shape {:?}, expected {want:?}",
            upd.shape()
        ));
    }
    with_array!(x, a => {
        let u = same(upd, "updates")?.as_standard_layout();
        let u = u.as_slice().unwrap();
        let f = combine(red);
        let mut out = owned(a.view());
        let dst = out.as_slice_mut().unwrap();
        for (j, &o) in offs.iter().enumerate() {
            for e in 0..inner {
                dst[o + e] = f(dst[o + e], u[j * inner + e]);
            }
        }
        Ok(Elem::wrap(out))
    })
}

pub fn one_hot(
    ind: &Tensor,
    depth: &Tensor,
    values: &Tensor,
    axis: i64,
) -> Result<Tensor, OpError> {
    let iv = index_values(ind, "indices")?;
    let depth = super::int_scalar(depth, "depth")?;
    if depth < 0 {
        return invalid(format!("one_hot: negative depth {depth}"));
    }
    if values.len() != 2 {
        return invalid(format!(
            "one_hot: values must hold 2 elements, got {:?}",
            values.shape()
        ));
    }
    let ishape = ind.shape();
    let axis = norm_axis(axis, ishape.len() + 1)?;
    let outer: usize = ishape[..axis].iter().product();
    let inner: usize = ishape[axis..].iter().product();
    let mut out_shape = ishape.to_vec();
    out_shape.insert(axis, depth as usize);
    Ok(map_array!(values, v => {
        let (off, on) = (v.iter().next().copied().unwrap(), v.iter().nth(1).copied().unwrap());
        let mut out = Vec::with_capacity(outer * depth as usize * inner);
        for o in 0..outer {
            for d in 0..depth {
                for i in 0..inner {
                    let mut k = iv[o * inner + i];
                    if k < 0 {
                        k += depth;
                    }
                    out.push(if k == d { on } else { off });
                }
            }
        }
        ArrayD::from_shape_vec(IxDyn(&out_shape), out).unwrap()
    }))
}

pub fn trilu(x: &Tensor, k: i64, upper: bool) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    if r < 2 {
        return invalid(format!(
            "trilu: input must have rank >= 2, got {:?}",
            x.shape()
        ));
    }
    fn go<T: Elem>(a: &ArrayD<T>, k: i64, upper: bool) -> ArrayD<T> {
        let r = a.ndim();
        let mut out = owned(a.view());
        for (idx, v) in out.indexed_iter_mut() {
            let d = idx[r - 1] as i64 - idx[r - 2] as i64;
            if (upper && d < k) || (!upper && d > k) {
                *v = T::zero();
            }
        }
        out
    }
    Ok(map_array!(x, a => go(a, k, upper)))
}

pub fn non_zero(x: &Tensor) -> Tensor {
    let shape = x.shape().to_vec();
    let r = shape.len();
    let flat: Vec<usize> = with_array!(x, a => a
        .iter()
        .enumerate()
        .filter(|(_, v)| **v != Elem::zero())
        .map(|(i, _)| i)
        .collect());
    let n = flat.len();
    let mut out = vec![0i64; r * n];
    for (j, &f) in flat.iter().enumerate() {
        for (d, c) in unravel(f, &shape).into_iter().enumerate() {
            out[d * n + j] = c as i64;
        }
    }
    Tensor::i64s(&[r, n], out)
}

pub fn compress(x: &Tensor, cond: &Tensor, axis: Option<i64>) -> Result<Tensor, OpError> {
    let keep: Vec<usize> = cond
        .to_f64_vec()
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != 0.0)
        .map(|(i, _)| i)
        .collect();
    let (x, axis) = match axis {
        Some(a) => (x.clone(), norm_axis(a, x.shape().len())?),
        None => (map_array!(x, a => reshaped(a, &[a.len()])), 0),
    };
    let dim = x.shape()[axis];
    if keep.last().is_some_and(|&i| i >= dim) {
        return invalid(format!(
            "compress: condition selects index {} of a dim of size {dim}",
            keep.last().unwrap()
        ));
    }
    Ok(map_array!(&x, a => take_axis(a, axis, &keep)))
}

pub fn reverse_sequence(
    x: &Tensor,
    lens: &Tensor,
    batch_axis: i64,
    time_axis: i64,
) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let (ba, ta) = (norm_axis(batch_axis, r)?, norm_axis(time_axis, r)?);
    let lens = ints(lens, "sequence_lens")?;
    let (nb, nt) = (x.shape()[ba], x.shape()[ta]);
    if lens.len() != nb || lens.iter().any(|&l| l < 0 || l as usize > nt) {
        return invalid(format!(
            "reverse_sequence: lengths {lens:?} for {nb} batches of {nt} steps"
        ));
    }
    Ok(
        map_array!(x, a => ArrayD::from_shape_fn(a.raw_dim(), |idx| {
            let l = lens[idx[ba]] as usize;
            let t = idx[ta];
            if t < l {
                let mut s = idx.clone();
                s[ta] = l - 1 - t;
                a[s]
            } else {
                a[idx]
            }
        })),
    )
}
