//! Losses, ai.onnx.ml ops and ops of their own kind (SwiGLU, Det, CenterCropPad, Col2Im,
//! AffineGrid, TensorScatter).

use super::cx::{axes, axis, prod, Cx, Res, R};
use super::shape::{int_vector, known_len};
use crate::{DType, Dim, LossReduction, Scalar, TensorType};

/// A required operand whose dtype must be a float type.
fn float_ty<'i>(cx: &Cx<'_, 'i, '_>, i: usize, what: &str) -> Result<&'i TensorType, String> {
    let t = cx.ty(i)?;
    if !t.dtype.is_float() {
        return Err(format!(
            "{what} (operand {i}) must be float, got {}",
            t.dtype
        ));
    }
    Ok(t)
}

/// Dims two operands must share: an error when both are known and differ.
fn same_dim(a: &Dim, b: &Dim, what: &str) -> Result<(), String> {
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) if x != y => Err(format!("{what}: {a} vs {b}")),
        _ => Ok(()),
    }
}

/// The values of operand `i` as dims (`len` of them), fresh symbols where unknown.
fn dims_of(cx: &mut Cx<'_, '_, '_>, i: usize, len: usize, what: &str) -> Result<Vec<Dim>, String> {
    let dims = match cx.values(i) {
        Some(v) if v.len() == len => v,
        _ => cx.fresh_n(len),
    };
    if let Some(d) = dims.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
        return Err(format!("{what} has negative value {d}"));
    }
    Ok(dims)
}

/// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (which adds log_prob).
pub(super) fn loss(cx: &mut Cx<'_, '_, '_>, reduction: LossReduction, log_prob: bool) -> R {
    cx.arity(2, 3)?;
    let x = float_ty(cx, 0, "input")?;
    if x.rank() < 2 {
        return Err(format!("input must be [N, C, d...], got {x}"));
    }
    let t = cx.int_ty(1, "target")?;
    if t.rank() + 1 != x.rank() {
        return Err(format!("target {t} must have one dim fewer than input {x}"));
    }
    same_dim(&t.dims[0], &x.dims[0], "target and input batch")?;
    for (a, b) in t.dims[1..].iter().zip(&x.dims[2..]) {
        same_dim(a, b, "target and input spatial dims")?;
    }
    if let Some(w) = cx.opt_ty(2) {
        if w.rank() != 1 || w.dtype != x.dtype {
            return Err(format!("weight must be a 1-D {} tensor, got {w}", x.dtype));
        }
        same_dim(&w.dims[0], &x.dims[1], "weight length and classes")?;
    }
    let dims = match reduction {
        LossReduction::None => t.dims.clone(),
        LossReduction::Sum | LossReduction::Mean => vec![],
    };
    let mut out = vec![Res::new(x.dtype, dims)];
    if log_prob {
        out.push(Res::of(x));
    }
    Ok(out)
}

pub(super) fn swiglu(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let a = float_ty(cx, 0, "a")?;
    let b = cx.ty(1)?;
    if a.dtype != b.dtype || a.rank() != b.rank() {
        return Err(format!(
            "a {a} and b {b} must have the same dtype and shape"
        ));
    }
    for (x, y) in a.dims.iter().zip(&b.dims) {
        same_dim(x, y, "a and b (no broadcasting)")?;
    }
    Ok(vec![Res::of(a)])
}

pub(super) fn det(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let x = float_ty(cx, 0, "x")?;
    let r = x.rank();
    if r < 2 {
        return Err(format!("x must be [..., M, M], got {x}"));
    }
    same_dim(&x.dims[r - 2], &x.dims[r - 1], "matrices must be square")?;
    Ok(vec![Res::new(x.dtype, x.dims[..r - 2].to_vec())])
}

pub(super) fn center_crop_pad(cx: &mut Cx<'_, '_, '_>, ax: &[i64]) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let s = int_vector(cx, 1, "shape")?;
    let ax: Vec<usize> = if ax.is_empty() {
        (0..x.rank()).collect()
    } else {
        axes(ax, x.rank())?
    };
    if s.dims[0].as_known().is_some_and(|n| n != ax.len() as i64) {
        return Err(format!(
            "shape (operand 1) has {} elements for {} axes",
            s.dims[0],
            ax.len()
        ));
    }
    let sizes = dims_of(cx, 1, ax.len(), "shape")?;
    let mut dims = x.dims.clone();
    for (a, d) in ax.into_iter().zip(sizes) {
        dims[a] = d;
    }
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn col2im(
    cx: &mut Cx<'_, '_, '_>,
    dilations: &[i64],
    pads: &[i64],
    strides: &[i64],
) -> R {
    cx.arity(3, 3)?;
    let x = cx.ranked(0, 3, "input")?;
    let img = int_vector(cx, 1, "image_shape")?;
    let blk = int_vector(cx, 2, "block_shape")?;
    let n = known_len(img, 1, "image_shape")?;
    same_dim(
        &blk.dims[0],
        &img.dims[0],
        "block_shape and image_shape lengths",
    )?;
    for (list, len, what) in [(dilations, n, "dilations"), (strides, n, "strides")] {
        if !list.is_empty() && list.len() != len {
            return Err(format!(
                "{what} has {} values for {n} spatial dims",
                list.len()
            ));
        }
        if list.iter().any(|&v| v < 1) {
            return Err(format!("{what} must be positive, got {list:?}"));
        }
    }
    if !pads.is_empty() && pads.len() != 2 * n {
        return Err(format!(
            "pads has {} values for {n} spatial dims",
            pads.len()
        ));
    }
    let image = dims_of(cx, 1, n, "image_shape")?;
    let block = dims_of(cx, 2, n, "block_shape")?;
    let per_channel = prod(&block)?;
    if per_channel.as_known() == Some(0) {
        return Err("block_shape has a zero".into());
    }
    let channels = match x.dims[1].div_exact(&per_channel) {
        Some(c) => c,
        None if x.dims[1].is_known() && per_channel.is_known() => {
            return Err(format!(
                "input has {} rows, not a multiple of the block size {per_channel}",
                x.dims[1]
            ))
        }
        None => cx.fresh(),
    };
    let mut dims = vec![x.dims[0].clone(), channels];
    dims.extend(image);
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn affine_grid(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let theta = float_ty(cx, 0, "theta")?;
    if theta.rank() != 3 {
        return Err(format!("theta must be [N, 2, 3] or [N, 3, 4], got {theta}"));
    }
    let size = int_vector(cx, 1, "size")?;
    let len = known_len(size, 1, "size")?;
    if len != 4 && len != 5 {
        return Err(format!("size must have 4 or 5 elements, got {len}"));
    }
    let sp = len - 2;
    same_dim(&theta.dims[1], &Dim::known(sp as i64), "theta rows")?;
    same_dim(&theta.dims[2], &Dim::known(sp as i64 + 1), "theta columns")?;
    let vals = dims_of(cx, 1, len, "size")?;
    same_dim(&vals[0], &theta.dims[0], "size[0] and theta's batch")?;
    let mut dims = vec![theta.dims[0].clone()];
    dims.extend_from_slice(&vals[2..]);
    dims.push(Dim::known(sp as i64));
    Ok(vec![Res::new(theta.dtype, dims)])
}

pub(super) fn tensor_scatter(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 3)?;
    let past = cx.ty(0)?;
    let upd = cx.ty(1)?;
    if past.rank() < 2 {
        return Err(format!("past_cache must have rank >= 2, got {past}"));
    }
    let a = axis(ax, past.rank())?;
    if a == 0 {
        return Err("axis must not be the batch axis 0".into());
    }
    if upd.dtype != past.dtype || upd.rank() != past.rank() {
        return Err(format!("update {upd} does not match past_cache {past}"));
    }
    for (i, (p, u)) in past.dims.iter().zip(&upd.dims).enumerate() {
        match (p.as_known(), u.as_known()) {
            (Some(p), Some(u)) if i == a && u > p => {
                return Err(format!("update has {u} > {p} entries along axis {a}"))
            }
            _ if i != a => same_dim(p, u, "update and past_cache")?,
            _ => {}
        }
    }
    if cx.present(2) {
        let w = int_vector(cx, 2, "write_indices")?;
        same_dim(&w.dims[0], &past.dims[0], "write_indices length and batch")?;
    }
    Ok(vec![Res::of(past)])
}

pub(super) fn binarizer(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err("x must be a number, got bool".into());
    }
    Ok(vec![Res::of(x)])
}

pub(super) fn array_feature_extractor(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let idx = cx.int_ty(1, "indices")?;
    let count = prod(&idx.dims)?;
    let dims = match x.rank() {
        0 => return Err("x must have rank >= 1".into()),
        1 => vec![Dim::known(1), count],
        r => {
            let mut d = x.dims[..r - 1].to_vec();
            d.push(count);
            d
        }
    };
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn label_encoder(cx: &mut Cx<'_, '_, '_>, default: &Scalar) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let out = default.dtype();
    if !(x.dtype.is_int() || x.dtype.is_float()) || !(out.is_int() || out.is_float()) {
        return Err(format!(
            "maps {} to {out}: only numbers are supported",
            x.dtype
        ));
    }
    Ok(vec![Res::new(out, x.dims.clone())])
}
