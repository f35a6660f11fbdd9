//! ONNX Attention (opset 23 to 25, with 25's sliding window) and RotaryEmbedding.
//!
//! Intermediates are rounded to the operand dtype at the points where ONNX's reference
//! stores them, so f16/bf16 results track it closely.
//!
//! rafter's extension: keys and values narrower than the queries (an LLM's f16 KV cache
//! with f32 queries) are read as their exact widening, and the products with them are
//! products of two narrow operands, as llama.cpp's CPU attention computes them (its
//! `ggml_mul_mat` converts the other operand to the cache's type): the queries are
//! rounded to the keys' type before `q · k`, and the softmax weights to the values' type
//! before `Σ p v`; the sums and the result stay in the queries' type.

use super::{by_float, Real};
use crate::ops::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array4, ArrayD, Axis, Ix4, IxDyn};
use rafter_ir::{DType, Op};

/// A 3-D [batch, seq, heads * size] or 4-D [batch, heads, seq, size] operand as 4-D.
fn to_heads<T: Real>(t: &Tensor, heads: i64, what: &str) -> Result<Array4<T>, OpError> {
    let a = T::view(t)?.into_owned();
    match a.ndim() {
        4 => Ok(a.into_dimensionality::<Ix4>().expect("rank 4")),
        3 => {
            let (b, s, hid) = (a.shape()[0], a.shape()[1], a.shape()[2]);
            if heads <= 0 || hid % heads as usize != 0 {
                return invalid(format!(
                    "{what} hidden size {hid} is not a multiple of {heads} heads"
                ));
            }
            let h = heads as usize;
            let a = a
                .as_standard_layout()
                .into_owned()
                .into_shape_with_order(IxDyn(&[b, s, h, hid / h]))
                .expect("sizes");
            let a = a.permuted_axes(IxDyn(&[0, 2, 1, 3]));
            Ok(a.as_standard_layout()
                .into_owned()
                .into_dimensionality::<Ix4>()
                .expect("rank 4"))
        }
        r => invalid(format!("{what} must have rank 3 or 4, got {r}")),
    }
}

pub fn attention(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let q = arg(inputs, 0)?;
    let dt = q.dtype();
    by_float!(dt, "attention", T => attention_t::<T>(op, inputs, ctx, dt))
}

fn attention_t<T: Real>(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
    dt: DType,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let Op::Attention {
        is_causal,
        kv_num_heads,
        q_num_heads,
        qk_matmul_output_mode,
        scale,
        softcap,
        left_window_size,
        right_window_size,
    } = op
    else {
        return unsupported("not an attention op");
    };
    let opt = |i: usize| inputs.get(i).copied().flatten();
    let (q, k, v) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    let rank3 = q.shape().len() == 3;
    let r = |x: T| x.round_to(dt);
    // Rounding to a type at least as wide as `dt` after `r` changes nothing.
    let (kdt, vdt) = (k.dtype(), v.dtype());
    let qh = to_heads::<T>(q, *q_num_heads, "q")?;
    let mut kh = to_heads::<T>(k, *kv_num_heads, "k")?;
    let mut vh = to_heads::<T>(v, *kv_num_heads, "v")?;
    let (pk, pv) = (opt(4), opt(5));
    if pk.is_some() != pv.is_some() {
        return invalid("past_key and past_value must be given together");
    }
    let past_len = match pk {
        Some(p) => p.shape().get(2).copied().unwrap_or(0),
        None => 0,
    };
    if let (Some(pk), Some(pv)) = (pk, pv) {
        let pk = to_heads::<T>(pk, *kv_num_heads, "past_key")?;
        let pv = to_heads::<T>(pv, *kv_num_heads, "past_value")?;
        kh = ndarray::concatenate(Axis(2), &[pk.view(), kh.view()])
            .map_err(|e| OpError::Invalid(format!("past_key and k do not concatenate: {e}")))?;
        vh = ndarray::concatenate(Axis(2), &[pv.view(), vh.view()])
            .map_err(|e| OpError::Invalid(format!("past_value and v do not concatenate: {e}")))?;
    }
    let (b, hq, sq, dq) = qh.dim();
    let (kb, hkv, l, dk) = kh.dim();
    let (vb, vhh, vl, dv) = vh.dim();
    if kb != b || vb != b || vhh != hkv || vl != l || dk != dq || hkv == 0 || hq % hkv != 0 {
        return invalid(format!(
            "attention shapes q {:?}, k {:?}, v {:?} do not agree",
            qh.shape(),
            kh.shape(),
            vh.shape()
        ));
    }
    let reps = hq / hkv;
    let scale = scale.map_or(1.0 / (dq as f64).sqrt(), |s| s as f64);
    let sc = r(T::of(scale.sqrt()));
    let qs = qh.mapv(|x| r(x.round_to(kdt) * sc));
    let ks = kh.mapv(|x| r(x * sc));

    // The additive bias [b, hq, sq, l]: mask, causal frontier, padding.
    let neg = T::neg_infinity();
    let mut bias = Array4::<T>::zeros((b, hq, sq, l));
    if let Some(m) = opt(3) {
        let mask: ArrayD<T> = match m {
            Tensor::Bool(a) => a.mapv(|x| if x { T::zero() } else { neg }),
            _ => T::view(m)?.into_owned(),
        };
        if mask.ndim() == 0 || mask.shape()[mask.ndim() - 1] > l {
            return invalid(format!("attn_mask of shape {:?}", mask.shape()));
        }
        let ml = mask.shape()[mask.ndim() - 1];
        let mask = if ml < l {
            let mut sh = mask.shape().to_vec();
            *sh.last_mut().expect("rank >= 1") = l - ml;
            let pad = ArrayD::from_elem(IxDyn(&sh), neg);
            ndarray::concatenate(Axis(mask.ndim() - 1), &[mask.view(), pad.view()])
                .expect("shapes agree")
        } else {
            mask
        };
        let mb = mask.broadcast(IxDyn(&[b, hq, sq, l])).ok_or_else(|| {
            OpError::Invalid(format!(
                "attn_mask of shape {:?} does not broadcast to [{b}, {hq}, {sq}, {l}]",
                mask.shape()
            ))
        })?;
        bias.assign(&mb.into_dimensionality::<Ix4>().expect("rank 4"));
    }
    let nonpad: Option<Vec<i64>> = match opt(6) {
        Some(t) => Some(
            t.to_i64_vec()
                .filter(|v| v.len() == b)
                .ok_or_else(|| OpError::Invalid("nonpad_kv_seqlen must be [batch] ints".into()))?,
        ),
        None => None,
    };
    if *is_causal {
        for bi in 0..b {
            let off = match (&nonpad, pk) {
                (Some(np), None) => np[bi] - sq as i64,
                _ => past_len as i64,
            };
            for i in 0..sq {
                for j in 0..l {
                    if j as i64 > i as i64 + off {
                        bias.slice_mut(s![bi, .., i, j]).fill(neg);
                    }
                }
            }
        }
    }
    if *left_window_size >= 0 || *right_window_size >= 0 {
        // The sliding window, aligned like the causal frontier: a query at absolute
        // position `i + off` sees keys `j` with `-right <= i + off - j <= left`.
        for bi in 0..b {
            let off = match (&nonpad, pk) {
                (Some(np), None) => np[bi] - sq as i64,
                _ => past_len as i64,
            };
            for i in 0..sq {
                for j in 0..l {
                    let diff = i as i64 + off - j as i64;
                    if (*left_window_size >= 0 && diff > *left_window_size)
                        || (*right_window_size >= 0 && -diff > *right_window_size)
                    {
                        bias.slice_mut(s![bi, .., i, j]).fill(neg);
                    }
                }
            }
        }
    }
    if let Some(np) = &nonpad {
        for (bi, &n) in np.iter().enumerate() {
            for j in 0..l {
                if j as i64 >= n {
                    bias.slice_mut(s![bi, .., .., j]).fill(neg);
                }
            }
        }
    }

    let mode = *qk_matmul_output_mode;
    let mut y = Array4::<T>::zeros((b, hq, sq, dv));
    let mut qk_out = Array4::<T>::zeros((b, hq, sq, l));
    let mut qk = Array2::<T>::zeros((sq, l));
    let mut yo = Array2::<T>::zeros((sq, dv));
    for bi in 0..b {
        for h in 0..hq {
            let kvh = h / reps;
            let qm = qs.slice(s![bi, h, .., ..]);
            let km = ks.slice(s![bi, kvh, .., ..]);
            general_mat_mul(T::one(), &qm, &km.t(), T::zero(), &mut qk);
            qk.mapv_inplace(r);
            if *softcap > 0.0 {
                let c = T::of(*softcap as f64);
                qk.mapv_inplace(|x| r(r(r(x / c).tanh()) * c));
            }
            let bm = bias.slice(s![bi, h, .., ..]);
            let qkb = ndarray::Zip::from(&qk)
                .and(&bm)
                .map_collect(|&a, &c| r(a + c));
            let mut probs = qkb.clone();
            for (i, mut row) in probs.outer_iter_mut().enumerate() {
                let fully_masked = bm.row(i).iter().all(|&x| x == neg);
                let mx = row.iter().fold(neg, |m, &x| {
                    if x.is_nan() || m.is_nan() {
                        T::nan()
                    } else {
                        m.max(x)
                    }
                });
                if fully_masked || mx == neg {
                    row.fill(T::zero());
                    continue;
                }
                row.mapv_inplace(|x| r(r(x - mx).exp()));
                // NumPy reduces ml_dtypes' bf16 one rounded add at a time; f16 and wider
                // types accumulate in at least f32.
                let sum = if dt == DType::BF16 {
                    row.iter().fold(T::zero(), |acc, &x| r(acc + x))
                } else {
                    r(row.iter().copied().sum::<T>())
                };
                let sum = if sum == T::zero() { T::one() } else { sum };
                row.mapv_inplace(|x| r(x / sum).round_to(vdt));
            }
            let out = match mode {
                2 => &qkb,
                3 => &probs,
                _ => &qk,
            };
            qk_out.slice_mut(s![bi, h, .., ..]).assign(out);
            let vm = vh.slice(s![bi, kvh, .., ..]);
            general_mat_mul(T::one(), &probs, &vm, T::zero(), &mut yo);
            y.slice_mut(s![bi, h, .., ..]).assign(&yo.mapv(r));
        }
    }
    let y = if rank3 {
        y.permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(&[b, sq, hq * dv]))
            .expect("sizes")
    } else {
        y.into_dyn()
    };
    let want = |i: usize| ctx.wants(i);
    Ok(vec![
        Some(T::wrap(y, dt)),
        want(1).then(|| T::wrap(kh.into_dyn(), dt)),
        want(2).then(|| T::wrap(vh.into_dyn(), dt)),
        want(3).then(|| T::wrap(qk_out.into_dyn(), dt)),
    ])
}

pub fn rotary(
    inputs: &[Option<&Tensor>],
    interleaved: bool,
    num_heads: i64,
    rotary_dim: i64,
) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    let dt = x.dtype();
    by_float!(dt, "rotary_embedding", T => rotary_t::<T>(inputs, interleaved, num_heads, rotary_dim, dt))
}

fn rotary_t<T: Real>(
    inputs: &[Option<&Tensor>],
    interleaved: bool,
    num_heads: i64,
    rotary_dim: i64,
    dt: DType,
) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    let r = |v: T| v.round_to(dt);
    let rank3 = x.shape().len() == 3;
    // [b, heads, seq, size]
    let xh = to_heads::<T>(x, num_heads, "x")?;
    let (b, h, sq, d) = xh.dim();
    let rot = if rotary_dim > 0 {
        rotary_dim as usize
    } else {
        d
    };
    if rot > d || rot % 2 != 0 {
        return invalid(format!("rotary_embedding_dim {rot} for head size {d}"));
    }
    let half = rot / 2;
    let cos = T::view(arg(inputs, 1)?)?.into_owned();
    let sin = T::view(arg(inputs, 2)?)?.into_owned();
    if cos.shape() != sin.shape() || cos.shape().last() != Some(&half) {
        return invalid(format!(
            "cos/sin caches of shapes {:?}, {:?} for rotary dim {rot}",
            cos.shape(),
            sin.shape()
        ));
    }
    let pos = match inputs.get(3).copied().flatten() {
        Some(p) => {
            let v = p
                .to_i64_vec()
                .ok_or_else(|| OpError::Invalid("position_ids must be integers".into()))?;
            if v.len() != b * sq {
                return invalid(format!("position_ids of shape {:?}", p.shape()));
            }
            Some(v)
        }
        None => None,
    };
    let cs = cos.as_standard_layout();
    let ss = sin.as_standard_layout();
    let (cs, ss) = (cs.as_slice().expect("std"), ss.as_slice().expect("std"));
    // Row of the caches for (batch, position).
    let row = |bi: usize, si: usize| -> Result<usize, OpError> {
        match &pos {
            Some(p) => {
                let i = p[bi * sq + si];
                if i < 0 || (i as usize + 1) * half > cs.len() {
                    return invalid(format!("position id {i} out of the cache"));
                }
                Ok(i as usize)
            }
            None => {
                if cs.len() != b * sq * half {
                    return invalid(
                        "cos/sin caches must be [batch, seq, dim/2] without position_ids",
                    );
                }
                Ok(bi * sq + si)
            }
        }
    };
    let mut out = xh.clone();
    for bi in 0..b {
        for si in 0..sq {
            let ro = row(bi, si)? * half;
            for hi in 0..h {
                let src = xh.slice(s![bi, hi, si, ..]);
                let mut dst = out.slice_mut(s![bi, hi, si, ..]);
                for i in 0..half {
                    let (c, sn) = (cs[ro + i], ss[ro + i]);
                    let (i1, i2) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let (x1, x2) = (src[i1], src[i2]);
                    dst[i1] = r(r(c * x1) - r(sn * x2));
                    dst[i2] = r(r(sn * x1) + r(c * x2));
                }
            }
        }
    }
    let out = if rank3 {
        out.permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(&[b, sq, h * d]))
            .expect("sizes")
    } else {
        out.into_dyn()
    };
    Ok(T::wrap(out, dt))
}
