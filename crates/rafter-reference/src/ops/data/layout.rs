//! Shape ops and index-free data movement: reshape, transpose, concat, slice, pad, ...

use super::{norm_axis, owned, reshaped, same, Elem};
use crate::ops::broadcast::{broadcast_shapes, broadcast_view};
use crate::ops::{invalid, OpError};
use crate::{map_array, with_array, Tensor};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DepthToSpaceMode, PadMode};

/// Selects positions along `axis`: output position `j` holds input position `idx[j]`, or
/// `fill` where `idx[j]` is `None`. The building block of slice, gather, tile and pad.
pub(crate) fn take_axis_or<T: Clone>(
    a: &ArrayD<T>,
    axis: usize,
    idx: &[Option<usize>],
    fill: Option<T>,
) -> ArrayD<T> {
    let a = a.as_standard_layout();
    let src = a.as_slice().expect("standard layout");
    let shape = a.shape();
    let dim = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for i in idx {
            match i {
                Some(i) => {
                    let base = (o * dim + i) * inner;
                    out.extend_from_slice(&src[base..base + inner]);
                }
                None => out.extend(std::iter::repeat_n(
                    fill.clone().expect("a fill value for padded positions"),
                    inner,
                )),
            }
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = idx.len();
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sizes agree")
}

/// [`take_axis_or`] without padding.
pub(crate) fn take_axis<T: Clone>(a: &ArrayD<T>, axis: usize, idx: &[usize]) -> ArrayD<T> {
    let idx: Vec<Option<usize>> = idx.iter().map(|&i| Some(i)).collect();
    take_axis_or(a, axis, &idx, None)
}

fn product(shape: &[usize]) -> usize {
    shape.iter().product()
}

pub fn reshape(x: &Tensor, shape: &[i64], allow_zero: bool) -> Result<Tensor, OpError> {
    let in_shape = x.shape();
    let mut out = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer.is_some() => return invalid("reshape: more than one -1 in the shape"),
            -1 => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allow_zero => match in_shape.get(i) {
                Some(&d) => out.push(d),
                None => {
                    return invalid(format!(
                        "reshape: shape {shape:?} copies dim {i} of a rank-{} input",
                        in_shape.len()
                    ))
                }
            },
            s if s < 0 => return invalid(format!("reshape: negative dim {s} in {shape:?}")),
            s => out.push(s as usize),
        }
    }
    let total = x.len();
    if let Some(i) = infer {
        let known = product(&out);
        if known == 0 || total / known * known != total {
            return invalid(format!(
                "reshape: cannot infer the -1 of {shape:?} for input shape {in_shape:?}"
            ));
        }
        out[i] = total / known;
    }
    if product(&out) != total {
        return invalid(format!(
            "reshape: input shape {in_shape:?} ({total} elements) does not fit shape {shape:?}"
        ));
    }
    Ok(map_array!(x, a => reshaped(a, &out)))
}

pub fn shape(x: &Tensor, start: i64, end: Option<i64>) -> Tensor {
    let dims = x.shape();
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clamp(start);
    let e = clamp(end.unwrap_or(r)).max(s);
    let v: Vec<i64> = dims[s..e].iter().map(|&d| d as i64).collect();
    Tensor::i64s(&[v.len()], v)
}

pub fn transpose(x: &Tensor, perm: &[i64]) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let perm: Vec<usize> = if perm.is_empty() {
        (0..r).rev().collect()
    } else {
        perm.iter()
            .map(|&p| norm_axis(p, r))
            .collect::<Result<_, _>>()?
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return invalid(format!(
            "transpose: {perm:?} is not a permutation of rank {r}"
        ));
    }
    Ok(map_array!(x, a => owned(a.view().permuted_axes(IxDyn(&perm)))))
}

pub fn squeeze(x: &Tensor, axes: &[i64]) -> Result<Tensor, OpError> {
    let dims = x.shape();
    let drop: Vec<usize> = if axes.is_empty() {
        (0..dims.len()).filter(|&i| dims[i] == 1).collect()
    } else {
        let mut v = Vec::new();
        for &a in axes {
            let a = norm_axis(a, dims.len())?;
            if dims[a] != 1 {
                return invalid(format!("squeeze: dim {a} of {dims:?} is not 1"));
            }
            v.push(a);
        }
        v
    };
    let out: Vec<usize> = (0..dims.len())
        .filter(|i| !drop.contains(i))
        .map(|i| dims[i])
        .collect();
    Ok(map_array!(x, a => reshaped(a, &out)))
}

pub fn unsqueeze(x: &Tensor, axes: &[i64]) -> Result<Tensor, OpError> {
    let dims = x.shape();
    let r = dims.len() + axes.len();
    let mut ins = vec![false; r];
    for &a in axes {
        let a = norm_axis(a, r)?;
        if std::mem::replace(&mut ins[a], true) {
            return invalid(format!("unsqueeze: axis {a} repeated in {axes:?}"));
        }
    }
    let mut rest = dims.iter();
    let out: Vec<usize> = ins
        .iter()
        .map(|&i| if i { 1 } else { *rest.next().unwrap() })
        .collect();
    Ok(map_array!(x, a => reshaped(a, &out)))
}

pub fn flatten(x: &Tensor, axis: i64) -> Result<Tensor, OpError> {
    let dims = x.shape();
    let r = dims.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..=r).contains(&a) {
        return invalid(format!("flatten: axis {axis} out of range for rank {r}"));
    }
    let out = [product(&dims[..a as usize]), product(&dims[a as usize..])];
    Ok(map_array!(x, a => reshaped(a, &out)))
}

pub fn concat(all: &[&Tensor], axis: i64) -> Result<Tensor, OpError> {
    let Some(first) = all.first() else {
        return invalid("concat: no operands");
    };
    let r = first.shape().len();
    let axis = norm_axis(axis, r)?;
    for t in all {
        let s = t.shape();
        let ok = s.len() == r && (0..r).all(|i| i == axis || s[i] == first.shape()[i]);
        if !ok {
            return invalid(format!(
                "concat: shapes {:?} and {s:?} differ off axis {axis}",
                first.shape()
            ));
        }
    }
    with_array!(*first, a => concat_impl(a, all, axis))
}

fn concat_impl<T: Elem>(_: &ArrayD<T>, all: &[&Tensor], axis: usize) -> Result<Tensor, OpError> {
    let arrays: Vec<_> = all
        .iter()
        .map(|t| same::<T>(t, "a concat operand").map(|a| a.as_standard_layout()))
        .collect::<Result<_, _>>()?;
    let shape = arrays[0].shape();
    let outer = product(&shape[..axis]);
    let inner = product(&shape[axis + 1..]);
    let mut out_shape = shape.to_vec();
    out_shape[axis] = arrays.iter().map(|a| a.shape()[axis]).sum();
    let mut out = Vec::with_capacity(product(&out_shape));
    for o in 0..outer {
        for a in &arrays {
            let chunk = a.shape()[axis] * inner;
            out.extend_from_slice(&a.as_slice().unwrap()[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(T::wrap(
        ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sizes agree"),
    ))
}

pub fn split(
    x: &Tensor,
    axis: i64,
    sizes: Option<&[i64]>,
    num_outputs: usize,
) -> Result<Vec<Tensor>, OpError> {
    let axis = norm_axis(axis, x.shape().len())?;
    let dim = x.shape()[axis];
    let sizes: Vec<usize> = match sizes {
        Some(s) => {
            if s.iter().any(|&v| v < 0) || s.iter().sum::<i64>() != dim as i64 {
                return invalid(format!("split: sizes {s:?} do not sum to dim {dim}"));
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            if num_outputs == 0 {
                return invalid("split: no outputs");
            }
            let part = dim.div_ceil(num_outputs);
            let mut v = vec![part; num_outputs];
            let last = dim as i64 - (part * (num_outputs - 1)) as i64;
            if last < 0 {
                return invalid(format!(
                    "split: dim {dim} cannot be split into {num_outputs} parts"
                ));
            }
            v[num_outputs - 1] = last as usize;
            v
        }
    };
    let mut start = 0;
    let mut out = Vec::new();
    for s in sizes {
        let idx: Vec<usize> = (start..start + s).collect();
        out.push(map_array!(x, a => take_axis(a, axis, &idx)));
        start += s;
    }
    Ok(out)
}

/// The positions ONNX Slice visits along a dim of size `dim`.
pub(crate) fn slice_positions(start: i64, end: i64, step: i64, dim: usize) -> Vec<usize> {
    let d = dim as i64;
    let start = if start < 0 {
        start.saturating_add(d)
    } else {
        start
    };
    let end = if end < 0 { end.saturating_add(d) } else { end };
    let mut v = Vec::new();
    if step > 0 {
        let (s, e) = (start.clamp(0, d), end.clamp(0, d));
        let mut i = s;
        while i < e {
            v.push(i as usize);
            i += step;
        }
    } else {
        let (s, e) = (start.max(0).min(d - 1), end.max(-1).min(d - 1));
        let mut i = s;
        while i > e {
            v.push(i as usize);
            i += step;
        }
    }
    v
}

pub fn slice(
    x: &Tensor,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let n = starts.len();
    let default_axes: Vec<i64> = (0..n as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    let ones = vec![1; n];
    let steps = steps.unwrap_or(&ones);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return invalid(format!(
            "slice: starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} differ in length"
        ));
    }
    let mut out = x.clone();
    let mut seen = vec![false; r];
    for i in 0..n {
        let axis = norm_axis(axes[i], r)?;
        if std::mem::replace(&mut seen[axis], true) {
            return invalid(format!("slice: axis {axis} repeated"));
        }
        if steps[i] == 0 {
            return invalid("slice: step 0");
        }
        let idx = slice_positions(starts[i], ends[i], steps[i], x.shape()[axis]);
        out = map_array!(&out, a => take_axis(a, axis, &idx));
    }
    Ok(out)
}

pub fn expand(x: &Tensor, shape: &[i64]) -> Result<Tensor, OpError> {
    if shape.iter().any(|&d| d < 0) {
        return invalid(format!("expand: negative dim in {shape:?}"));
    }
    let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let out = broadcast_shapes(x.shape(), &shape)?;
    Ok(map_array!(x, a => owned(broadcast_view(a, &out)?)))
}

pub fn tile(x: &Tensor, repeats: &[i64]) -> Result<Tensor, OpError> {
    let dims = x.shape().to_vec();
    if repeats.len() != dims.len() || repeats.iter().any(|&r| r < 0) {
        return invalid(format!("tile: repeats {repeats:?} for shape {dims:?}"));
    }
    let mut out = x.clone();
    for (axis, (&d, &r)) in dims.iter().zip(repeats).enumerate() {
        let idx: Vec<usize> = (0..d * r as usize).map(|i| i % d).collect();
        out = map_array!(&out, a => take_axis(a, axis, &idx));
    }
    Ok(out)
}

/// Where output position `o` of a padded axis reads from (`None`: the constant).
fn pad_source(o: i64, begin: i64, n: i64, mode: PadMode) -> Option<usize> {
    let s = o - begin;
    if (0..n).contains(&s) {
        return Some(s as usize);
    }
    Some(match mode {
        PadMode::Constant => return None,
        PadMode::Edge => s.clamp(0, n - 1),
        PadMode::Wrap => s.rem_euclid(n),
        PadMode::Reflect if n == 1 => 0,
        PadMode::Reflect => {
            let p = 2 * (n - 1);
            let m = s.rem_euclid(p);
            if m >= n {
                p - m
            } else {
                m
            }
        }
    } as usize)
}

pub fn pad(
    x: &Tensor,
    pads: &[i64],
    constant: Option<&Tensor>,
    axes: Option<&[i64]>,
    mode: PadMode,
) -> Result<Tensor, OpError> {
    let r = x.shape().len();
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return invalid(format!("pad: {} pads for {} axes", pads.len(), axes.len()));
    }
    let constant = constant.filter(|c| !c.is_empty());
    with_array!(x, a => {
        let fill = match constant {
            Some(c) => *same(c, "pad's constant_value")?.iter().next().unwrap(),
            None => Elem::zero(),
        };
        pad_impl(a, pads, &axes, mode, fill)
    })
}

fn pad_impl<T: Elem>(
    a: &ArrayD<T>,
    pads: &[i64],
    axes: &[usize],
    mode: PadMode,
    fill: T,
) -> Result<Tensor, OpError> {
    let k = axes.len();
    let mut out = a.clone();
    for (i, &axis) in axes.iter().enumerate() {
        let (b, e) = (pads[i], pads[k + i]);
        let n = out.shape()[axis] as i64;
        // Negative pads crop first; the rest pads the cropped axis.
        let (cb, ce) = ((-b).max(0), (-e).max(0));
        if cb + ce > n {
            return invalid(format!("pad: pads {b}, {e} crop more than dim {n}"));
        }
        if cb > 0 || ce > 0 {
            let idx: Vec<usize> = (cb as usize..(n - ce) as usize).collect();
            out = take_axis(&out, axis, &idx);
        }
        let n = n - cb - ce;
        let (b, e) = (b.max(0), e.max(0));
        if b == 0 && e == 0 {
            continue;
        }
        if n == 0 && mode != PadMode::Constant {
            return invalid(format!("pad: cannot pad an empty axis in {mode:?} mode"));
        }
        let idx: Vec<Option<usize>> = (0..b + n + e).map(|o| pad_source(o, b, n, mode)).collect();
        out = take_axis_or(&out, axis, &idx, Some(fill));
    }
    Ok(T::wrap(out))
}

pub fn depth_to_space(x: &Tensor, bs: i64, mode: DepthToSpaceMode) -> Result<Tensor, OpError> {
    let &[b, c, h, w] = x.shape() else {
        return invalid(format!(
            "depth_to_space: input must be 4-D, got {:?}",
            x.shape()
        ));
    };
    let bs = bs as usize;
    if bs == 0 || c % (bs * bs) != 0 {
        return invalid(format!("depth_to_space: {c} channels, blocksize {bs}"));
    }
    let c2 = c / (bs * bs);
    let (tmp, perm) = match mode {
        DepthToSpaceMode::Dcr => ([b, bs, bs, c2, h, w], [0, 3, 4, 1, 5, 2]),
        DepthToSpaceMode::Crd => ([b, c2, bs, bs, h, w], [0, 1, 4, 2, 5, 3]),
    };
    let out = [b, c2, h * bs, w * bs];
    Ok(
        map_array!(x, a => reshaped(&owned(reshaped(a, &tmp).view().permuted_axes(IxDyn(&perm))), &out)),
    )
}

pub fn space_to_depth(x: &Tensor, bs: i64) -> Result<Tensor, OpError> {
    let &[b, c, h, w] = x.shape() else {
        return invalid(format!(
            "space_to_depth: input must be 4-D, got {:?}",
            x.shape()
        ));
    };
    let bs = bs as usize;
    if bs == 0 || h % bs != 0 || w % bs != 0 {
        return invalid(format!("space_to_depth: {h}x{w} with blocksize {bs}"));
    }
    let tmp = [b, c, h / bs, bs, w / bs, bs];
    let perm = [0, 3, 5, 1, 2, 4];
    let out = [b, c * bs * bs, h / bs, w / bs];
    Ok(
        map_array!(x, a => reshaped(&owned(reshaped(a, &tmp).view().permuted_axes(IxDyn(&perm))), &out)),
    )
}
