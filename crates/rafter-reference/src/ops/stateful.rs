//! Reference kernels: stateful sequence ops (LinearAttention, CausalConvWithState).
//!
//! Numerics follow onnx/reference/ops (op_linear_attention.py,
//! op_causal_conv_with_state.py): LinearAttention runs its recurrence in f32 whatever the
//! operand dtype; the causal convolution accumulates in f32 (f64 for f64) and rounds to the
//! operand dtype before the optional SiLU, which is computed in f32.

use super::contraction::{by_float, Real};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DType, LinearAttnRule, Op};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = ctx;
    match op {
        Op::LinearAttention {
            q_num_heads,
            kv_num_heads,
            scale,
            update_rule,
        } => linear_attention(inputs, *q_num_heads, *kv_num_heads, *scale, *update_rule),
        Op::CausalConvWithState { silu } => causal_conv(inputs, *silu),
        _ => unsupported(format!("`{}` is not a stateful sequence op", op.name())),
    }
}

/// A [B, T, H*D] operand as f32 values and (B, T, H*D).
fn packed(t: &Tensor, what: &str) -> Result<(Vec<f32>, [usize; 3]), OpError> {
    if !t.dtype().is_float() {
        return unsupported(format!("{what} of dtype {}", t.dtype()));
    }
    let s = t.shape();
    if s.len() != 3 {
        return invalid(format!("{what} must be rank 3 (B, T, H*D), got {s:?}"));
    }
    let v = <f32 as Real>::view(t)?;
    Ok((v.iter().copied().collect(), [s[0], s[1], s[2]]))
}

fn linear_attention(
    inputs: &[Option<&Tensor>],
    hq: i64,
    hkv: i64,
    scale: Option<f32>,
    rule: LinearAttnRule,
) -> Result<Vec<Option<Tensor>>, OpError> {
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        return invalid(format!(
            "q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}"
        ));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let opt = |i: usize| inputs.get(i).copied().flatten();
    let qt = arg(inputs, 0)?;
    let (q, [b, t, qw]) = packed(qt, "query")?;
    let (k, ks) = packed(arg(inputs, 1)?, "key")?;
    let (v, vs) = packed(arg(inputs, 2)?, "value")?;
    if !qw.is_multiple_of(hq)
        || !vs[2].is_multiple_of(hkv)
        || ks[..2] != [b, t]
        || vs[..2] != [b, t]
    {
        return invalid(format!(
            "query [{b}, {t}, {qw}], key {ks:?}, value {vs:?} for {hq}/{hkv} heads"
        ));
    }
    let (dk, dv) = (qw / hq, vs[2] / hkv);
    if ks[2] != hkv * dk {
        return invalid(format!("key width {} for {hkv} heads of size {dk}", ks[2]));
    }
    let gating = matches!(rule, LinearAttnRule::Gated | LinearAttnRule::GatedDelta);
    let delta = matches!(rule, LinearAttnRule::Delta | LinearAttnRule::GatedDelta);
    let (decay, beta) = (opt(4), opt(5));
    if gating != decay.is_some() || delta != beta.is_some() {
        return invalid(format!(
            "update_rule `{}` with decay {} and beta {}",
            rule.word(),
            if decay.is_some() { "given" } else { "absent" },
            if beta.is_some() { "given" } else { "absent" }
        ));
    }
    // decay [B, T, Hkv] (per head) or [B, T, Hkv*dk] (per key dim).
    let decay = match decay {
        Some(d) => {
            let (dvals, ds) = packed(d, "decay")?;
            if ds[..2] != [b, t] || (ds[2] != hkv && ds[2] != hkv * dk) {
                return invalid(format!("decay of shape {ds:?}"));
            }
            Some((dvals, ds[2] / hkv))
        }
        None => None,
    };
    // beta [B, T, Hkv or 1].
    let beta = match beta {
        Some(bt) => {
            let (bv, bs) = packed(bt, "beta")?;
            if bs[..2] != [b, t] || (bs[2] != hkv && bs[2] != 1) {
                return invalid(format!("beta of shape {bs:?}"));
            }
            Some((bv, bs[2]))
        }
        None => None,
    };
    let (mut state, state_dt) = match opt(3) {
        Some(p) => {
            if p.shape() != [b, hkv, dk, dv] {
                return invalid(format!(
                    "past_state of shape {:?}, expected [{b}, {hkv}, {dk}, {dv}]",
                    p.shape()
                ));
            }
            let pv = <f32 as Real>::view(p)?;
            (pv.iter().copied().collect::<Vec<f32>>(), p.dtype())
        }
        None => (vec![0.0f32; b * hkv * dk * dv], qt.dtype()),
    };
    let scale = match scale {
        Some(s) if s != 0.0 => s,
        _ => 1.0 / (dk as f32).sqrt(),
    };
    let group = hq / hkv;
    let mut out = vec![0.0f32; b * t * hq * dv];
    let mut vt = vec![0.0f32; dv];
    for bi in 0..b {
        for ti in 0..t {
            let row = bi * t + ti;
            for h in 0..hkv {
                let s = &mut state[(bi * hkv + h) * dk * dv..(bi * hkv + h + 1) * dk * dv];
                let kt = &k[row * hkv * dk + h * dk..row * hkv * dk + (h + 1) * dk];
                vt.copy_from_slice(&v[row * hkv * dv + h * dv..row * hkv * dv + (h + 1) * dv]);
                if let Some((dvals, per)) = &decay {
                    for d in 0..dk {
                        let g = dvals[row * hkv * per + h * per + if *per == 1 { 0 } else { d }];
                        let e = g.exp();
                        for m in 0..dv {
                            s[d * dv + m] *= e;
                        }
                    }
                }
                if let Some((bv, per)) = &beta {
                    let bt = bv[row * per + if *per == 1 { 0 } else { h }];
                    for (m, vm) in vt.iter_mut().enumerate() {
                        let mut retrieved = 0.0f32;
                        for d in 0..dk {
                            retrieved += s[d * dv + m] * kt[d];
                        }
                        *vm = bt * (*vm - retrieved);
                    }
                }
                for d in 0..dk {
                    for m in 0..dv {
                        s[d * dv + m] += kt[d] * vt[m];
                    }
                }
                for qh in h * group..(h + 1) * group {
                    let qv = &q[row * hq * dk + qh * dk..row * hq * dk + (qh + 1) * dk];
                    for m in 0..dv {
                        let mut o = 0.0f32;
                        for d in 0..dk {
                            o += qv[d] * s[d * dv + m];
                        }
                        out[row * hq * dv + qh * dv + m] = scale * o;
                    }
                }
            }
        }
    }
    let y = ArrayD::from_shape_vec(IxDyn(&[b, t, hq * dv]), out).expect("sizes");
    let st = ArrayD::from_shape_vec(IxDyn(&[b, hkv, dk, dv]), state).expect("sizes");
    Ok(vec![
        Some(<f32 as Real>::wrap(y, qt.dtype())),
        Some(<f32 as Real>::wrap(st, state_dt)),
    ])
}

fn causal_conv(inputs: &[Option<&Tensor>], silu: bool) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    let dt = x.dtype();
    by_float!(dt, "causal_conv_with_state", T => causal_conv_t::<T>(inputs, silu, dt))
}

fn causal_conv_t<T: Real>(
    inputs: &[Option<&Tensor>],
    silu: bool,
    dt: DType,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = T::view(arg(inputs, 0)?)?;
    let w = T::view(arg(inputs, 1)?)?;
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || ws[2] == 0 {
        return invalid(format!(
            "causal_conv_with_state of input {xs:?} and weight {ws:?} (want [C, 1, k])"
        ));
    }
    let (b, c, l, k) = (xs[0], xs[1], xs[2], ws[2]);
    let bias: Option<Vec<T>> = match inputs.get(2).copied().flatten() {
        Some(t) => {
            let v: Vec<T> = T::view(t)?.iter().copied().collect();
            if v.len() != c {
                return invalid(format!("bias of shape {:?} for {c} channels", t.shape()));
            }
            Some(v)
        }
        None => None,
    };
    let past: Vec<T> = match inputs.get(3).copied().flatten() {
        Some(p) => {
            if p.shape() != [b, c, k - 1] {
                return invalid(format!(
                    "past_state of shape {:?}, expected [{b}, {c}, {}]",
                    p.shape(),
                    k - 1
                ));
            }
            T::view(p)?.iter().copied().collect()
        }
        None => vec![T::zero(); b * c * (k - 1)],
    };
    let x = x.as_standard_layout();
    let xv = x.as_slice().expect("standard layout");
    let wv: Vec<T> = w.iter().copied().collect();
    let pl = l + k - 1;
    let mut y = vec![T::zero(); b * c * l];
    let mut present = Vec::with_capacity(b * c * (k - 1));
    let mut padded = vec![T::zero(); pl];
    for bi in 0..b {
        for ch in 0..c {
            let row = bi * c + ch;
            padded[..k - 1].copy_from_slice(&past[row * (k - 1)..(row + 1) * (k - 1)]);
            padded[k - 1..].copy_from_slice(&xv[row * l..(row + 1) * l]);
            for t in 0..l {
                let mut acc = bias.as_ref().map_or(T::zero(), |bv| bv[ch]);
                for j in 0..k {
                    acc += wv[ch * k + j] * padded[t + j];
                }
                let acc = acc.round_to(dt);
                y[row * l + t] = if silu {
                    let a = acc.to64() as f32;
                    let s = 1.0f32 / (1.0f32 + (-a).exp());
                    T::of((a * s) as f64)
                } else {
                    acc
                };
            }
            present.extend_from_slice(&padded[pl - (k - 1)..]);
        }
    }
    let y = ArrayD::from_shape_vec(IxDyn(&[b, c, l]), y).expect("sizes");
    let st = ArrayD::from_shape_vec(IxDyn(&[b, c, k - 1]), present).expect("sizes");
    Ok(vec![Some(T::wrap(y, dt)), Some(T::wrap(st, dt))])
}

#[cfg(test)]
mod tests {
    use crate::ops::contraction::tests::run_op;
    use crate::Tensor;
    use rafter_ir::{DType, LinearAttnRule, Op};

    #[test]
    fn linear_attention_accumulates_outer_products() {
        // One head, dk = dv = 1, scale 1, rule linear: S_t = S_{t-1} + k_t v_t, o_t = q_t S_t.
        // k = [1, 2], v = [3, 4], q = [1, 1], past 10: S = 13, 21; o = 13, 21.
        let q = Tensor::f32s(&[1, 2, 1], vec![1.0, 1.0]);
        let k = Tensor::f32s(&[1, 2, 1], vec![1.0, 2.0]);
        let v = Tensor::f32s(&[1, 2, 1], vec![3.0, 4.0]);
        let past = Tensor::f32s(&[1, 1, 1, 1], vec![10.0]);
        let op = |update_rule| Op::LinearAttention {
            q_num_heads: 1,
            kv_num_heads: 1,
            scale: Some(1.0),
            update_rule,
        };
        let ins = [Some(&q), Some(&k), Some(&v), Some(&past)];
        let r = run_op(op(LinearAttnRule::Linear), &ins, &[DType::F32, DType::F32]);
        assert_eq!(r[0].as_ref().unwrap().to_f64_vec(), [13.0, 21.0]);
        assert_eq!(r[1].as_ref().unwrap().to_f64_vec(), [21.0]);
        // Delta with beta 0.5 and no past: S_1 = 0 + 1 * 0.5 * (3 - 0) = 1.5;
        // S_2 = 1.5 + 2 * 0.5 * (4 - 2 * 1.5) = 2.5.
        let beta = Tensor::f32s(&[1, 2, 1], vec![0.5, 0.5]);
        let ins = [Some(&q), Some(&k), Some(&v), None, None, Some(&beta)];
        let r = run_op(op(LinearAttnRule::Delta), &ins, &[DType::F32, DType::F32]);
        assert_eq!(r[0].as_ref().unwrap().to_f64_vec(), [1.5, 2.5]);
        // Gated with decay ln 0.5: S_1 = 3, S_2 = 1.5 + 8 = 9.5.
        let decay = Tensor::f32s(&[1, 2, 1], vec![0.5f32.ln(); 2]);
        let ins = [Some(&q), Some(&k), Some(&v), None, Some(&decay)];
        let r = run_op(op(LinearAttnRule::Gated), &ins, &[DType::F32, DType::F32]);
        let o = r[0].as_ref().unwrap().to_f64_vec();
        assert!(
            (o[0] - 3.0).abs() < 1e-6 && (o[1] - 9.5).abs() < 1e-5,
            "{o:?}"
        );
    }

    #[test]
    fn causal_conv_carries_state() {
        // One channel, kernel [1, 2], past [5], x = [1, 2, 3], bias 1:
        // y = [5*1 + 1*2, 1*1 + 2*2, 2*1 + 3*2] + 1 = [8, 6, 9]; present = [3].
        let x = Tensor::f32s(&[1, 1, 3], vec![1.0, 2.0, 3.0]);
        let w = Tensor::f32s(&[1, 1, 2], vec![1.0, 2.0]);
        let b = Tensor::f32s(&[1], vec![1.0]);
        let past = Tensor::f32s(&[1, 1, 1], vec![5.0]);
        let ins = [Some(&x), Some(&w), Some(&b), Some(&past)];
        let r = run_op(
            Op::CausalConvWithState { silu: false },
            &ins,
            &[DType::F32; 2],
        );
        assert_eq!(r[0].as_ref().unwrap().to_f64_vec(), [8.0, 6.0, 9.0]);
        assert_eq!(r[1].as_ref().unwrap().to_f64_vec(), [3.0]);
        // Without past state or bias, with SiLU: conv [2, 5, 8] -> x * sigmoid(x).
        let ins = [Some(&x), Some(&w)];
        let r = run_op(
            Op::CausalConvWithState { silu: true },
            &ins,
            &[DType::F32; 2],
        );
        let y = r[0].as_ref().unwrap().to_f64_vec();
        for (got, c) in y.iter().zip([2.0f64, 5.0, 8.0]) {
            assert!((got - c / (1.0 + (-c).exp())).abs() < 1e-5, "{y:?}");
        }
        assert_eq!(r[1].as_ref().unwrap().to_f64_vec(), [3.0]);
    }
}
