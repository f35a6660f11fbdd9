//! Reference kernels: recurrent ops (RNN, GRU, LSTM) with ONNX semantics: direction,
//! layout, activation lists (indices into `rafter_ir::rnn_activation::NAMES`) with their
//! alpha/beta values, clip, sequence_lens, initial states and peepholes.

use super::contraction::{by_float, Real};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{s, Array2, Array3, Array4, ArrayD, ArrayView2, Axis, Ix3};
use rafter_ir::rnn_activation::{self, Cell};
use rafter_ir::{DType, Op, RnnDirection};

/// One activation function with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Act {
    name: &'static str,
    alpha: f64,
    beta: f64,
}

impl Act {
    fn apply<T: Real>(self, x: T) -> T {
        let (a, b) = (T::of(self.alpha), T::of(self.beta));
        let (zero, one) = (T::zero(), T::one());
        match self.name {
            "Relu" => x.max(zero),
            "Tanh" => x.tanh(),
            "Sigmoid" => one / (one + (-x).exp()),
            "Affine" => a * x + b,
            "LeakyRelu" => {
                if x < zero {
                    a * x
                } else {
                    x
                }
            }
            "ThresholdedRelu" => {
                if x > a {
                    x
                } else {
                    zero
                }
            }
            "ScaledTanh" => a * (b * x).tanh(),
            "HardSigmoid" => (a * x + b).max(zero).min(one),
            "Elu" => {
                if x < zero {
                    a * (x.exp() - one)
                } else {
                    x
                }
            }
            "Softsign" => x / (one + x.abs()),
            "Softplus" => (one + x.exp()).ln(),
            _ => unreachable!("checked when resolving"),
        }
    }
}

/// The activations of each direction ([`rnn_activation::resolve`], shared with the CPU
/// runtime's native kernels).
fn resolve_acts(
    kind: Cell,
    dirs: usize,
    acts: &[i64],
    alpha: &[f32],
    beta: &[f32],
) -> Result<Vec<Vec<Act>>, OpError> {
    let resolved = match rnn_activation::resolve(kind, dirs, acts, alpha, beta) {
        Ok(r) => r,
        Err(e) if e.starts_with("recurrent activation index") => return unsupported(e),
        Err(e) => return invalid(e),
    };
    Ok(resolved
        .into_iter()
        .map(|dir| {
            dir.into_iter()
                .map(|a| Act {
                    name: a.name,
                    alpha: a.alpha as f64,
                    beta: a.beta as f64,
                })
                .collect()
        })
        .collect())
}

struct Params<'a> {
    kind: Cell,
    direction: RnnDirection,
    hidden_size: i64,
    layout: i64,
    clip: Option<f32>,
    activations: &'a [i64],
    alpha: &'a [f32],
    beta: &'a [f32],
}

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let p = match op {
        Op::Rnn {
            direction,
            hidden_size,
            layout,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => Params {
            kind: Cell::Rnn,
            direction: *direction,
            hidden_size: *hidden_size,
            layout: *layout,
            clip: *clip,
            activations,
            alpha: activation_alpha,
            beta: activation_beta,
        },
        Op::Gru {
            direction,
            hidden_size,
            layout,
            linear_before_reset,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => Params {
            kind: Cell::Gru {
                linear_before_reset: *linear_before_reset,
            },
            direction: *direction,
            hidden_size: *hidden_size,
            layout: *layout,
            clip: *clip,
            activations,
            alpha: activation_alpha,
            beta: activation_beta,
        },
        Op::Lstm {
            direction,
            hidden_size,
            layout,
            input_forget,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => Params {
            kind: Cell::Lstm {
                input_forget: *input_forget,
            },
            direction: *direction,
            hidden_size: *hidden_size,
            layout: *layout,
            clip: *clip,
            activations,
            alpha: activation_alpha,
            beta: activation_beta,
        },
        _ => return unsupported(format!("`{}` is not a recurrent op", op.name())),
    };
    let x = arg(inputs, 0)?;
    let dt = x.dtype();
    by_float!(dt, "recurrent op", T => run::<T>(&p, inputs, ctx, dt))
}

/// A 3-D operand, with the first two axes swapped when `swap`.
fn three_d<T: Real>(t: &Tensor, swap: bool, what: &str) -> Result<Array3<T>, OpError> {
    let a = T::view(t)?
        .into_owned()
        .into_dimensionality::<Ix3>()
        .map_err(|_| OpError::Invalid(format!("{what} must have rank 3, got {:?}", t.shape())))?;
    Ok(if swap {
        a.permuted_axes([1, 0, 2]).as_standard_layout().into_owned()
    } else {
        a
    })
}

fn run<T: Real>(
    p: &Params,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
    dt: DType,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let opt = |i: usize| inputs.get(i).copied().flatten();
    let batch_first = p.layout != 0;
    let x = three_d::<T>(arg(inputs, 0)?, batch_first, "x")?; // [seq, batch, input]
    let w = three_d::<T>(arg(inputs, 1)?, false, "w")?; // [dirs, G*H, input]
    let r = three_d::<T>(arg(inputs, 2)?, false, "r")?; // [dirs, G*H, H]
    let (seq, batch, input) = x.dim();
    let dirs = match p.direction {
        RnnDirection::Bidirectional => 2,
        _ => 1,
    };
    let g = p.kind.gates();
    let hs = r.dim().2;
    if p.hidden_size > 0 && p.hidden_size as usize != hs {
        return invalid(format!(
            "hidden_size {} but r has shape {:?}",
            p.hidden_size,
            r.shape()
        ));
    }
    if w.dim() != (dirs, g * hs, input) || r.dim() != (dirs, g * hs, hs) {
        return invalid(format!(
            "w {:?} / r {:?} do not fit {dirs} direction(s), {g} gates, hidden {hs}, input {input}",
            w.shape(),
            r.shape()
        ));
    }
    let bias: Array2<T> = match opt(3) {
        Some(b) => T::view(b)?
            .into_owned()
            .into_shape_with_order((dirs, 2 * g * hs))
            .map_err(|_| OpError::Invalid(format!("b of shape {:?}", b.shape())))?,
        None => Array2::zeros((dirs, 2 * g * hs)),
    };
    let lens: Vec<usize> = match opt(4) {
        Some(l) => {
            let v = l
                .to_i64_vec()
                .filter(|v| v.len() == batch)
                .ok_or_else(|| OpError::Invalid("sequence_lens must be [batch] ints".into()))?;
            v.iter()
                .map(|&n| {
                    if n < 0 || n as usize > seq {
                        invalid(format!("sequence length {n} outside 0..={seq}"))
                    } else {
                        Ok(n as usize)
                    }
                })
                .collect::<Result<_, _>>()?
        }
        None => vec![seq; batch],
    };
    let state = |i: usize, what: &str| -> Result<Array3<T>, OpError> {
        match opt(i) {
            Some(t) => {
                let a = three_d::<T>(t, batch_first, what)?;
                if a.dim() != (dirs, batch, hs) {
                    return invalid(format!("{what} of shape {:?}", t.shape()));
                }
                Ok(a)
            }
            None => Ok(Array3::zeros((dirs, batch, hs))),
        }
    };
    let h0 = state(5, "initial_h")?;
    let is_lstm = matches!(p.kind, Cell::Lstm { .. });
    let c0 = if is_lstm {
        state(6, "initial_c")?
    } else {
        Array3::zeros((dirs, batch, hs))
    };
    let peep: Array2<T> = match opt(7).filter(|_| is_lstm) {
        Some(t) => T::view(t)?
            .into_owned()
            .into_shape_with_order((dirs, 3 * hs))
            .map_err(|_| OpError::Invalid(format!("p of shape {:?}", t.shape())))?,
        None => Array2::zeros((dirs, 3 * hs)),
    };
    let acts = resolve_acts(p.kind, dirs, p.activations, p.alpha, p.beta)?;
    let clip = |v: T| match p.clip {
        Some(c) => v.max(T::of(-c as f64)).min(T::of(c as f64)),
        None => v,
    };

    let mut y = Array4::<T>::zeros((seq, dirs, batch, hs));
    let mut yh = Array3::<T>::zeros((dirs, batch, hs));
    let mut yc = Array3::<T>::zeros((dirs, batch, hs));
    for (d, a) in acts.iter().enumerate() {
        let reverse = p.direction == RnnDirection::Reverse || d == 1;
        let (wd, rd) = (w.index_axis(Axis(0), d), r.index_axis(Axis(0), d));
        let wb = bias.slice(s![d, ..g * hs]);
        let rb = bias.slice(s![d, g * hs..]);
        let pd = peep.row(d);
        let mut h = h0.index_axis(Axis(0), d).to_owned();
        let mut c = c0.index_axis(Axis(0), d).to_owned();
        for step in 0..seq {
            // Time index per batch row (None once the row's sequence has ended).
            let t_of: Vec<Option<usize>> = lens
                .iter()
                .map(|&n| (step < n).then(|| if reverse { n - 1 - step } else { step }))
                .collect();
            let mut xs = Array2::<T>::zeros((batch, input));
            for (bi, t) in t_of.iter().enumerate() {
                if let Some(t) = *t {
                    xs.row_mut(bi).assign(&x.slice(s![t, bi, ..]));
                }
            }
            let xw = xs.dot(&wd.t()) + wb; // [batch, G*H]
            let hr = h.dot(&rd.t()) + rb; // [batch, G*H]
            let (hn, cn) = cell(p.kind, a, &clip, &xw, &hr, &h, &c, rd, rb, pd, hs);
            for (bi, t) in t_of.iter().enumerate() {
                if let Some(t) = *t {
                    h.row_mut(bi).assign(&hn.row(bi));
                    c.row_mut(bi).assign(&cn.row(bi));
                    y.slice_mut(s![t, d, bi, ..]).assign(&hn.row(bi));
                }
            }
        }
        yh.index_axis_mut(Axis(0), d).assign(&h);
        yc.index_axis_mut(Axis(0), d).assign(&c);
    }
    let round = |a: ArrayD<T>| T::wrap(a.mapv(|v| v.round_to(dt)), dt);
    let (y, yh, yc) = if batch_first {
        (
            y.permuted_axes([2, 0, 1, 3])
                .as_standard_layout()
                .into_owned()
                .into_dyn(),
            yh.permuted_axes([1, 0, 2])
                .as_standard_layout()
                .into_owned()
                .into_dyn(),
            yc.permuted_axes([1, 0, 2])
                .as_standard_layout()
                .into_owned()
                .into_dyn(),
        )
    } else {
        (y.into_dyn(), yh.into_dyn(), yc.into_dyn())
    };
    Ok(vec![
        ctx.wants(0).then(|| round(y)),
        ctx.wants(1).then(|| round(yh)),
        (is_lstm && ctx.wants(2)).then(|| round(yc)),
    ])
}

/// One step of the cell for every batch row: the new hidden (and cell) state.
/// `xw` = x·Wᵀ + Wb and `hr` = h·Rᵀ + Rb, both [batch, G*H].
#[allow(clippy::too_many_arguments)]
fn cell<T: Real>(
    kind: Cell,
    a: &[Act],
    clip: &dyn Fn(T) -> T,
    xw: &Array2<T>,
    hr: &Array2<T>,
    h: &Array2<T>,
    c: &Array2<T>,
    rd: ArrayView2<T>,
    rb: ndarray::ArrayView1<T>,
    pd: ndarray::ArrayView1<T>,
    hs: usize,
) -> (Array2<T>, Array2<T>) {
    let batch = h.nrows();
    let one = T::one();
    match kind {
        Cell::Rnn => {
            let hn = (xw + hr).mapv(|v| a[0].apply(clip(v)));
            (hn, c.clone())
        }
        Cell::Gru {
            linear_before_reset,
        } => {
            let (f, gf) = (a[0], a[1]);
            let z = (&xw.slice(s![.., ..hs]) + &hr.slice(s![.., ..hs])).mapv(|v| f.apply(clip(v)));
            let rg = (&xw.slice(s![.., hs..2 * hs]) + &hr.slice(s![.., hs..2 * hs]))
                .mapv(|v| f.apply(clip(v)));
            let xh = xw.slice(s![.., 2 * hs..]);
            let pre = if linear_before_reset {
                &xh + &(&rg * &hr.slice(s![.., 2 * hs..]))
            } else {
                let rh = rd.slice(s![2 * hs.., ..]);
                &xh + &((&rg * h).dot(&rh.t()) + rb.slice(s![2 * hs..]))
            };
            let ht = pre.mapv(|v| gf.apply(clip(v)));
            let mut hn = Array2::zeros((batch, hs));
            ndarray::Zip::from(&mut hn)
                .and(&z)
                .and(&ht)
                .and(h)
                .for_each(|o, &z, &ht, &hp| *o = (one - z) * ht + z * hp);
            (hn, c.clone())
        }
        Cell::Lstm { input_forget } => {
            let (f, gf, hf) = (a[0], a[1], a[2]);
            let pre = xw + hr; // gates i, o, f, c
            let (pi, po, pf) = (
                pd.slice(s![..hs]),
                pd.slice(s![hs..2 * hs]),
                pd.slice(s![2 * hs..]),
            );
            let mut hn = Array2::zeros((batch, hs));
            let mut cn = Array2::zeros((batch, hs));
            for b in 0..batch {
                for j in 0..hs {
                    let cp = c[[b, j]];
                    let i = f.apply(clip(pre[[b, j]] + pi[j] * cp));
                    let fg = if input_forget {
                        one - i
                    } else {
                        f.apply(clip(pre[[b, 2 * hs + j]] + pf[j] * cp))
                    };
                    let ct = gf.apply(clip(pre[[b, 3 * hs + j]]));
                    let cc = fg * cp + i * ct;
                    let o = f.apply(clip(pre[[b, hs + j]] + po[j] * cc));
                    cn[[b, j]] = cc;
                    hn[[b, j]] = o * hf.apply(cc);
                }
            }
            (hn, cn)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::contraction::tests::run_op;

    fn f(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::f32s(shape, v.to_vec())
    }

    fn rnn(direction: RnnDirection, activations: Vec<i64>, alpha: Vec<f32>, beta: Vec<f32>) -> Op {
        Op::Rnn {
            direction,
            hidden_size: 1,
            layout: 0,
            clip: None,
            activations,
            activation_alpha: alpha,
            activation_beta: beta,
        }
    }

    #[track_caller]
    fn close(t: &Tensor, shape: &[usize], want: &[f64]) {
        assert_eq!(t.shape(), shape);
        for (g, w) in t.to_f64_vec().iter().zip(want) {
            assert!(
                (g - w).abs() < 1e-5,
                "got {:?}, want {want:?}",
                t.to_f64_vec()
            );
        }
    }

    #[test]
    fn simple_rnn_directions_and_lengths() {
        let x = f(&[2, 1, 1], &[1., 1.]);
        let w = f(&[1, 1, 1], &[1.]);
        let r = f(&[1, 1, 1], &[1.]);
        let (h1, h2) = (1f64.tanh(), (1. + 1f64.tanh()).tanh());
        let out = |op, extra: &[Option<&Tensor>]| {
            let mut ins = vec![Some(&x), Some(&w), Some(&r)];
            ins.extend_from_slice(extra);
            run_op(op, &ins, &[DType::F32, DType::F32])
        };
        let o = out(rnn(RnnDirection::Forward, vec![], vec![], vec![]), &[]);
        close(o[0].as_ref().unwrap(), &[2, 1, 1, 1], &[h1, h2]);
        close(o[1].as_ref().unwrap(), &[1, 1, 1], &[h2]);
        let o = out(rnn(RnnDirection::Reverse, vec![], vec![], vec![]), &[]);
        close(o[0].as_ref().unwrap(), &[2, 1, 1, 1], &[h2, h1]);
        // Sequence length 1: the second step is zero and y_h is the first state.
        let lens = Tensor::I32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[1]), 1));
        let o = out(
            rnn(RnnDirection::Forward, vec![], vec![], vec![]),
            &[None, Some(&lens)],
        );
        close(o[0].as_ref().unwrap(), &[2, 1, 1, 1], &[h1, 0.]);
        close(o[1].as_ref().unwrap(), &[1, 1, 1], &[h1]);
        // Affine (index 3): h = 2 * (x + h) + 1.
        let o = out(rnn(RnnDirection::Forward, vec![3], vec![2.], vec![1.]), &[]);
        close(o[0].as_ref().unwrap(), &[2, 1, 1, 1], &[3., 9.]);
        // Bidirectional stacks both.
        let w2 = f(&[2, 1, 1], &[1., 1.]);
        let ins = [Some(&x), Some(&w2), Some(&w2)];
        let o = run_op(
            rnn(RnnDirection::Bidirectional, vec![], vec![], vec![]),
            &ins,
            &[DType::F32],
        );
        close(o[0].as_ref().unwrap(), &[2, 2, 1, 1], &[h1, h2, h2, h1]);
    }

    #[test]
    fn gru_and_lstm_with_zero_weights() {
        let x = f(&[2, 1, 1], &[1., 1.]);
        let h0 = f(&[1, 1, 1], &[1.]);
        let gru = Op::Gru {
            direction: RnnDirection::Forward,
            hidden_size: 1,
            layout: 0,
            linear_before_reset: false,
            clip: None,
            activations: vec![],
            activation_alpha: vec![],
            activation_beta: vec![],
        };
        let w = f(&[1, 3, 1], &[0.; 3]);
        let ins = [Some(&x), Some(&w), Some(&w), None, None, Some(&h0)];
        let o = run_op(gru, &ins, &[DType::F32, DType::F32]);
        close(o[0].as_ref().unwrap(), &[2, 1, 1, 1], &[0.5, 0.25]);
        let lstm = Op::Lstm {
            direction: RnnDirection::Forward,
            hidden_size: 1,
            layout: 1,
            input_forget: false,
            clip: None,
            activations: vec![],
            activation_alpha: vec![],
            activation_beta: vec![],
        };
        let w = f(&[1, 4, 1], &[0.; 4]);
        let xb = f(&[1, 1, 1], &[1.]); // layout 1: [batch, seq, input]
        let c0 = f(&[1, 1, 1], &[1.]);
        let ins = [Some(&xb), Some(&w), Some(&w), None, None, None, Some(&c0)];
        let o = run_op(lstm, &ins, &[DType::F32, DType::F32, DType::F32]);
        close(
            o[0].as_ref().unwrap(),
            &[1, 1, 1, 1],
            &[0.5 * 0.5f64.tanh()],
        );
        close(o[2].as_ref().unwrap(), &[1, 1, 1], &[0.5]);
    }
}
