//! QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (integer types; ONNX's float8
//! and int4 types are not IR dtypes).

use super::{by_float, Real};
use crate::ops::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::DType;

/// The inclusive range of an integer quantisation dtype.
fn quant_range(dt: DType) -> Option<(i64, i64)> {
    Some(match dt {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        DType::U16 => (0, 65535),
        DType::I16 => (-32768, 32767),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => return None,
    })
}

/// For each element of an array of shape `shape`, the index of its scale / zero point:
/// per tensor (one value), per axis (a 1-D tensor along `axis`) or blocked (a tensor like
/// `shape` with `axis` divided into blocks of `block_size`).
fn param_index(
    shape: &[usize],
    pshape: &[usize],
    axis: i64,
    block_size: i64,
) -> Result<Vec<usize>, OpError> {
    let total: usize = shape.iter().product();
    let plen: usize = pshape.iter().product();
    if plen == 1 {
        return Ok(vec![0; total]);
    }
    let r = shape.len() as i64;
    let ax = if axis < 0 { axis + r } else { axis };
    if ax < 0 || ax >= r {
        return invalid(format!("quantisation axis {axis} for rank {r}"));
    }
    let ax = ax as usize;
    let mut idx = Vec::with_capacity(total);
    if block_size <= 0 {
        if pshape.len() != 1 || pshape[0] != shape[ax] {
            return invalid(format!(
                "per-axis scale of shape {pshape:?} for axis {ax} of shape {shape:?}"
            ));
        }
        super::for_each_index(shape, |i| idx.push(i[ax]));
        return Ok(idx);
    }
    let bs = block_size as usize;
    let ok = pshape.len() == shape.len()
        && (0..shape.len()).all(|d| {
            if d == ax {
                pshape[d] == shape[d].div_ceil(bs)
            } else {
                pshape[d] == shape[d]
            }
        });
    if !ok {
        return invalid(format!(
            "blocked scale of shape {pshape:?} for shape {shape:?}, axis {ax}, block {bs}"
        ));
    }
    let pst = super::strides_of(pshape);
    super::for_each_index(shape, |i| {
        idx.push(
            i.iter()
                .enumerate()
                .map(|(d, &c)| if d == ax { c / bs } else { c } * pst[d])
                .sum(),
        )
    });
    Ok(idx)
}

pub fn quantize(
    inputs: &[Option<&Tensor>],
    axis: i64,
    block_size: i64,
    output_dtype: DType,
    ctx: &OpCtx,
) -> Result<Tensor, OpError> {
    let (x, scale) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let zp = inputs.get(2).copied().flatten();
    let out_dt = match zp {
        Some(z) => z.dtype(),
        None => ctx
            .output_type(0)
            .map(|t| t.dtype)
            .filter(|d| quant_range(*d).is_some())
            .or(Some(output_dtype).filter(|d| quant_range(*d).is_some()))
            .unwrap_or(DType::U8),
    };
    let Some((lo, hi)) = quant_range(out_dt) else {
        return unsupported(format!("quantize to dtype {out_dt}"));
    };
    let sidx = param_index(x.shape(), scale.shape(), axis, block_size)?;
    let zps: Vec<i64> = match zp {
        Some(z) => z
            .to_i64_vec()
            .ok_or_else(|| OpError::Invalid("zero point must be an integer".into()))?,
        None => vec![0],
    };
    let zidx = match zp {
        Some(z) => param_index(x.shape(), z.shape(), axis, block_size)?,
        None => vec![0; x.len()],
    };
    let dt = x.dtype();
    // NumPy divides in the promoted dtype of x and the scale.
    let rd = if scale.dtype() == dt { dt } else { DType::F32 };
    let q: Vec<i64> = by_float!(dt, "quantize", T => {
        let xv = T::view(x)?;
        let sv = T::view(scale)?;
        let sv: Vec<T> = sv.iter().copied().collect();
        Ok(xv
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                // x / scale in the operand dtype, rounded half to even, then shifted and
                // saturated.
                let r = (v / sv[sidx[i]]).round_to(rd).to64().round_ties_even();
                let r = if r.is_nan() { 0 } else { r as i64 };
                r.saturating_add(zps[zidx[i]]).clamp(lo, hi)
            })
            .collect())
    })?;
    let shape = IxDyn(x.shape());
    Ok(match out_dt {
        DType::U8 => Tensor::U8(arr(shape, q.iter().map(|&v| v as u8))),
        DType::I8 => Tensor::I8(arr(shape, q.iter().map(|&v| v as i8))),
        DType::U16 => Tensor::U16(arr(shape, q.iter().map(|&v| v as u16))),
        DType::I16 => Tensor::I16(arr(shape, q.iter().map(|&v| v as i16))),
        DType::I32 => Tensor::I32(arr(shape, q.iter().map(|&v| v as i32))),
        DType::U32 => Tensor::U32(arr(shape, q.iter().map(|&v| v as u32))),
        other => return unsupported(format!("quantize to dtype {other}")),
    })
}

fn arr<T>(shape: IxDyn, v: impl Iterator<Item = T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(shape, v.collect()).expect("sizes")
}

pub fn dequantize(
    inputs: &[Option<&Tensor>],
    axis: i64,
    block_size: i64,
    ctx: &OpCtx,
) -> Result<Tensor, OpError> {
    let (x, scale) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let xs = x
        .to_i64_vec()
        .filter(|_| x.dtype() != DType::Bool)
        .ok_or_else(|| OpError::Unsupported(format!("dequantize of dtype {}", x.dtype())))?;
    let zp = inputs.get(2).copied().flatten();
    let zps: Vec<i64> = match zp {
        Some(z) => z
            .to_i64_vec()
            .ok_or_else(|| OpError::Invalid("zero point must be an integer".into()))?,
        None => vec![0],
    };
    let zidx = match zp {
        Some(z) => param_index(x.shape(), z.shape(), axis, block_size)?,
        None => vec![0; x.len()],
    };
    let sidx = param_index(x.shape(), scale.shape(), axis, block_size)?;
    let out_dt = ctx
        .output_type(0)
        .map(|t| t.dtype)
        .filter(|d| d.is_float())
        .unwrap_or(scale.dtype());
    let work = if scale.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    by_float!(work, "dequantize", T => {
        let sv = T::view(scale)?;
        let sv: Vec<T> = sv.iter().copied().collect();
        let y: Vec<T> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let d = (v - zps[zidx[i]]) as f64;
                T::of(d) * sv[sidx[i]]
            })
            .collect();
        Ok(T::wrap(ArrayD::from_shape_vec(IxDyn(x.shape()), y).expect("sizes"), out_dt))
    })
}

pub fn dynamic_quantize(inputs: &[Option<&Tensor>]) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    let xv = f32::view(x)?;
    let (qmin, qmax) = (0f32, 255f32);
    let maxx = xv.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    let minx = xv.iter().fold(0f32, |m, &v| if v < m { v } else { m });
    let scale = if maxx == minx { 1.0 } else { maxx - minx } / (qmax - qmin);
    let zp = (qmin - minx / scale).clamp(qmin, qmax).round_ties_even();
    let y = xv.mapv(|v| ((v / scale).round_ties_even() + zp).clamp(qmin, qmax) as u8);
    let scale_t = f32::wrap(ArrayD::from_elem(IxDyn(&[]), scale), x.dtype());
    Ok(vec![
        Some(Tensor::U8(y)),
        Some(scale_t),
        Some(Tensor::U8(ArrayD::from_elem(IxDyn(&[]), zp as u8))),
    ])
}
