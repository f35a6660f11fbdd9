//! RoiAlign, DeformConv, QLinearMatMul, QLinearConv, LinearAttention, CausalConvWithState
//! and BitCast.

use super::arith;
use super::cx::{ck, Cx, Res, R};
use super::linalg::matmul_dims;
use super::nn::{conv, ConvAttrs, ConvLayout};
use crate::{AutoPad, DType, Dim, TensorType};

/// Two dims that must agree when both are known.
fn same_dim(a: &Dim, b: &Dim, what: &str) -> Result<(), String> {
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) if x != y => Err(format!("{what}: {x} vs {y}")),
        _ => Ok(()),
    }
}

/// `hidden / heads`: exact, or a fresh symbol when symbolic.
fn per_head(cx: &mut Cx<'_, '_, '_>, hidden: &Dim, heads: i64, what: &str) -> Result<Dim, String> {
    if heads <= 0 {
        return Err(format!("{what}: head count must be positive, got {heads}"));
    }
    if let Some(d) = arith::div_exact(hidden, &Dim::known(heads)) {
        return Ok(d);
    }
    if hidden.is_known() {
        return Err(format!(
            "{what}: {hidden} is not divisible by {heads} heads"
        ));
    }
    Ok(cx.fresh())
}

pub(super) fn roi_align(cx: &mut Cx<'_, '_, '_>, oh: i64, ow: i64) -> R {
    cx.arity(3, 3)?;
    let x = cx.ranked(0, 4, "x")?;
    let rois = cx.ranked(1, 2, "rois")?;
    let bi = cx.ranked(2, 1, "batch_indices")?;
    cx.int_ty(2, "batch_indices")?;
    same_dim(&rois.dims[1], &Dim::known(4), "rois must be [num_rois, 4]")?;
    same_dim(&rois.dims[0], &bi.dims[0], "rois and batch_indices counts")?;
    if oh <= 0 || ow <= 0 {
        return Err(format!("output size {oh}x{ow} must be positive"));
    }
    let n = if rois.dims[0].is_known() {
        rois.dims[0].clone()
    } else {
        bi.dims[0].clone()
    };
    Ok(vec![Res::new(
        x.dtype,
        vec![n, x.dims[1].clone(), Dim::known(oh), Dim::known(ow)],
    )])
}

pub(super) fn deform_conv(cx: &mut Cx<'_, '_, '_>, a: &ConvAttrs<'_>, offset_group: i64) -> R {
    cx.arity(3, 5)?;
    let x = cx.ranked(0, 4, "x")?;
    let off = cx.ranked(2, 4, "offset")?;
    if offset_group <= 0 {
        return Err(format!("offset_group must be positive, got {offset_group}"));
    }
    if let Some(m) = cx.opt_ty(4) {
        if m.rank() != 4 {
            return Err(format!("mask must have rank 4, got {m}"));
        }
    }
    let mut res = cx.with_operands(&[Some(0), Some(1), Some(3)], |c| {
        conv(c, a, None, ConvLayout::ChannelsFirst)
    })?;
    let out = &mut res[0].ty.dims;
    for i in 0..2 {
        same_dim(
            &out[2 + i],
            &off.dims[2 + i],
            "offset spatial dims and the conv output",
        )?;
        if !out[2 + i].is_known() {
            out[2 + i] = off.dims[2 + i].clone();
        }
    }
    same_dim(&out[0], &x.dims[0], "batch")?;
    Ok(res)
}

fn quant_dtype(t: &TensorType, what: &str) -> Result<DType, String> {
    match t.dtype {
        DType::U8 | DType::I8 => Ok(t.dtype),
        d => Err(format!("{what} must be u8 or i8, got {d}")),
    }
}

pub(super) fn qlinear_matmul(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(8, 8)?;
    let (a, b) = (cx.ty(0)?, cx.ty(3)?);
    quant_dtype(a, "a")?;
    quant_dtype(b, "b")?;
    let out = quant_dtype(cx.ty(7)?, "y_zero_point")?;
    let dims = matmul_dims(cx, &a.dims, &b.dims)?;
    Ok(vec![Res::new(out, dims)])
}

pub(super) fn qlinear_conv(cx: &mut Cx<'_, '_, '_>, a: &ConvAttrs<'_>) -> R {
    cx.arity(8, 9)?;
    quant_dtype(cx.ty(0)?, "x")?;
    quant_dtype(cx.ty(3)?, "w")?;
    let out = quant_dtype(cx.ty(7)?, "y_zero_point")?;
    let mut res = cx.with_operands(&[Some(0), Some(3), Some(8)], |c| {
        conv(c, a, None, ConvLayout::ChannelsFirst)
    })?;
    res[0].ty.dtype = out;
    Ok(res)
}

pub(super) fn linear_attention(cx: &mut Cx<'_, '_, '_>, q_heads: i64, kv_heads: i64) -> R {
    cx.arity(3, 6)?;
    let q = cx.ranked(0, 3, "query")?;
    let k = cx.ranked(1, 3, "key")?;
    let v = cx.ranked(2, 3, "value")?;
    if q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0 {
        return Err(format!(
            "q_num_heads {q_heads} must be a positive multiple of kv_num_heads {kv_heads}"
        ));
    }
    for t in [k, v] {
        same_dim(&t.dims[0], &q.dims[0], "batch")?;
        same_dim(&t.dims[1], &q.dims[1], "sequence length")?;
    }
    let dk = per_head(cx, &q.dims[2], q_heads, "query")?;
    let kdk = per_head(cx, &k.dims[2], kv_heads, "key")?;
    same_dim(&dk, &kdk, "query and key head sizes")?;
    let dv = per_head(cx, &v.dims[2], kv_heads, "value")?;
    let state = vec![q.dims[0].clone(), Dim::known(kv_heads), dk, dv.clone()];
    let state_dtype = match cx.opt_ty(3) {
        Some(p) => {
            if p.rank() != 4 {
                return Err(format!("past_state must have rank 4, got {p}"));
            }
            for (a, b) in p.dims.iter().zip(&state) {
                same_dim(a, b, "past_state shape")?;
            }
            p.dtype
        }
        None => q.dtype,
    };
    let out = vec![
        q.dims[0].clone(),
        q.dims[1].clone(),
        ck(arith::scale(&dv, q_heads))?,
    ];
    Ok(vec![Res::new(q.dtype, out), Res::new(state_dtype, state)])
}

pub(super) fn causal_conv_with_state(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 4)?;
    let x = cx.ranked(0, 3, "input")?;
    let w = cx.ranked(1, 3, "weight")?;
    same_dim(&w.dims[0], &x.dims[1], "weight channels")?;
    same_dim(
        &w.dims[1],
        &Dim::known(1),
        "weight must be [channels, 1, k]",
    )?;
    if let Some(b) = cx.opt_ty(2) {
        if b.rank() != 1 {
            return Err(format!("bias must be 1-D, got {b}"));
        }
    }
    let k1 = ck(arith::add_k(&w.dims[2], -1))?;
    if let Some(p) = cx.opt_ty(3) {
        if p.rank() != 3 {
            return Err(format!("past_state must have rank 3, got {p}"));
        }
        same_dim(&p.dims[2], &k1, "past_state length")?;
    }
    let state = vec![x.dims[0].clone(), x.dims[1].clone(), k1];
    Ok(vec![Res::of(x), Res::new(x.dtype, state)])
}

pub(super) fn bit_cast(cx: &mut Cx<'_, '_, '_>, to: DType) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.dtype.size_of() != to.size_of() {
        return Err(format!(
            "bit_cast from {} ({} bytes) to {to} ({} bytes)",
            x.dtype,
            x.dtype.size_of(),
            to.size_of()
        ));
    }
    Ok(vec![Res::new(to, x.dims.clone())])
}

/// The conv attributes of a DeformConv (explicit padding).
pub(super) fn deform_attrs<'a>(
    kernel_shape: &'a [i64],
    strides: &'a [i64],
    pads: &'a [i64],
    dilations: &'a [i64],
    group: i64,
) -> ConvAttrs<'a> {
    ConvAttrs {
        kernel_shape,
        strides,
        pads,
        dilations,
        group,
        auto_pad: AutoPad::NotSet,
    }
}
