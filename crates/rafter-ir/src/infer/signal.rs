//! Signal processing: DFT, STFT, windows, mel weight matrix.

use super::arith;
use super::cx::{axis, ck, Cx, Res, R};
use crate::{DType, Dim, TensorType};

/// A scalar operand's value as a dim: the known value, or a fresh symbol.
fn scalar_dim(cx: &mut Cx<'_, '_, '_>, i: usize) -> Dim {
    match cx.scalar(i) {
        Some(d) => d,
        None => cx.fresh(),
    }
}

/// `d / 2 + 1` (the one-sided bin count): known, or a fresh symbol.
fn half_plus_one(cx: &mut Cx<'_, '_, '_>, d: &Dim) -> Dim {
    match d.as_known() {
        Some(n) => Dim::known(n / 2 + 1),
        None => cx.fresh(),
    }
}

/// Checks the last dim of a signal is 1 (real) or 2 (complex).
fn complex_last(t: &TensorType, what: &str) -> Result<(), String> {
    match t.dims.last().and_then(Dim::as_known) {
        Some(1 | 2) | None => Ok(()),
        Some(c) => Err(format!(
            "{what} must end in a dim of 1 (real) or 2 (complex), got {c}"
        )),
    }
}

fn float_dtype(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be a float tensor, got {}", t.dtype))
    }
}

pub(super) fn dft(cx: &mut Cx<'_, '_, '_>, ax: Option<i64>, inverse: bool, onesided: bool) -> R {
    cx.arity(1, 3)?;
    let x = cx.ty(0)?;
    float_dtype(x, "dft input")?;
    let r = x.rank();
    if r < 2 {
        return Err(format!("dft input must have rank at least 2, got {r}"));
    }
    complex_last(x, "dft input")?;
    let ax = match ax {
        Some(a) => Some(axis(a, r)?),
        None => {
            if !cx.present(2) {
                return Err("dft: no axis attribute and no axis operand".into());
            }
            match cx.ints(2).as_deref() {
                Some([a]) => Some(axis(*a, r)?),
                Some(v) => return Err(format!("dft axis must be a scalar, got {v:?}")),
                None => None,
            }
        }
    };
    if ax == Some(r - 1) {
        return Err("dft axis cannot be the last (real/imaginary) dim".into());
    }
    let has_len = cx.present(1);
    let len = if has_len {
        Some(scalar_dim(cx, 1))
    } else {
        None
    };
    let mut dims = Vec::with_capacity(r);
    for (i, d) in x.dims[..r - 1].iter().enumerate() {
        let out = match ax {
            Some(a) if a == i => {
                let l = match &len {
                    Some(l) => l.clone(),
                    None if inverse && onesided => {
                        ck(arith::add_k(d, -1).and_then(|m| arith::scale(&m, 2)))?
                    }
                    None => d.clone(),
                };
                if onesided && !inverse {
                    half_plus_one(cx, &l)
                } else {
                    l
                }
            }
            Some(_) => d.clone(),
            // The axis is known only at run time: a dim keeps its size only when no
            // transform can change it.
            None if !has_len && !onesided => d.clone(),
            None => cx.fresh(),
        };
        dims.push(out);
    }
    dims.push(Dim::known(if inverse && onesided { 1 } else { 2 }));
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn stft(cx: &mut Cx<'_, '_, '_>, onesided: bool) -> R {
    cx.arity(2, 4)?;
    let x = cx.ranked(0, 3, "stft signal")?;
    float_dtype(x, "stft signal")?;
    complex_last(x, "stft signal")?;
    cx.int_ty(1, "frame_step")?;
    if let Some(w) = cx.opt_ty(2) {
        if w.rank() != 1 {
            return Err(format!("stft window must be 1-D, got {w}"));
        }
    }
    let frame_len = if cx.present(3) {
        scalar_dim(cx, 3)
    } else if let Some(w) = cx.opt_ty(2) {
        w.dims[0].clone()
    } else {
        x.dims[1].clone()
    };
    let step = cx.scalar(1).and_then(|d| d.as_known());
    let frames = match (x.dims[1].as_known(), frame_len.as_known(), step) {
        (Some(n), Some(f), Some(s)) if s > 0 => {
            let k = arith::floor_div(n - f, s).ok_or("stft: bad frame_step")?;
            if k < 0 {
                return Err(format!(
                    "stft: frame length {f} exceeds the signal length {n}"
                ));
            }
            Dim::known(k + 1)
        }
        (_, _, Some(s)) if s <= 0 => return Err(format!("frame_step must be positive, got {s}")),
        _ => cx.fresh(),
    };
    let bins = if onesided {
        half_plus_one(cx, &frame_len)
    } else {
        frame_len
    };
    Ok(vec![Res::new(
        x.dtype,
        vec![x.dims[0].clone(), frames, bins, Dim::known(2)],
    )])
}

pub(super) fn window(cx: &mut Cx<'_, '_, '_>, dtype: DType) -> R {
    cx.arity(1, 1)?;
    let s = cx.int_ty(0, "size")?;
    if s.rank() > 1 || s.dims.iter().any(|d| d.as_known().is_some_and(|v| v != 1)) {
        return Err(format!("window size must be a scalar, got {s}"));
    }
    if !dtype.is_float() && !dtype.is_int() {
        return Err(format!("window dtype {dtype} is not numeric"));
    }
    let n = scalar_dim(cx, 0);
    if n.as_known().is_some_and(|v| v < 0) {
        return Err(format!("window size {n} is negative"));
    }
    Ok(vec![Res::new(dtype, vec![n])])
}

pub(super) fn mel_weight_matrix(cx: &mut Cx<'_, '_, '_>, dtype: DType) -> R {
    cx.arity(5, 5)?;
    for (i, what) in [(0, "num_mel_bins"), (1, "dft_length"), (2, "sample_rate")] {
        cx.int_ty(i, what)?;
    }
    for i in 3..5 {
        float_dtype(cx.ty(i)?, "edge frequency")?;
    }
    let mel = scalar_dim(cx, 0);
    let len = scalar_dim(cx, 1);
    let bins = half_plus_one(cx, &len);
    Ok(vec![Res::new(dtype, vec![bins, mel])])
}
