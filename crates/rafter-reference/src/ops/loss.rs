//! Reference kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//!
//! Numerics follow ONNX's reference implementation (NumPy, `op_negative_log_likelihood_loss`
//! and `op_softmax_cross_entropy_loss`) step by step: each step is computed in f64 and
//! rounded to the input's dtype, as NumPy computes it in that dtype.
//!
//! One departure: NumPy's NegativeLogLikelihoodLoss forgets `ignore_index = -1` when there
//! is no weight and so averages over the ignored targets too; here, as in the op's ONNX
//! function body (and SoftmaxCrossEntropyLoss's reference), ignored targets never count.

use super::elementwise::from_f64s;
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use half::{bf16, f16};
use rafter_ir::{DType, LossReduction, Op};

/// Rounds an f64 to the precision of a float dtype (f16 and bf16 through f32, as NumPy
/// computes half-precision arithmetic in f32); the identity for f64 and non-floats.
pub(crate) fn rounder(d: DType) -> fn(f64) -> f64 {
    match d {
        DType::F32 => |v| v as f32 as f64,
        DType::F16 => |v| f16::from_f32(v as f32).to_f64(),
        DType::BF16 => |v| bf16::from_f32(v as f32).to_f64(),
        _ => |v| v,
    }
}

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let (reduction, ignore_index, softmax) = match op {
        Op::NllLoss {
            reduction,
            ignore_index,
        } => (*reduction, *ignore_index, false),
        Op::SoftmaxCrossEntropy {
            reduction,
            ignore_index,
        } => (*reduction, *ignore_index, true),
        _ => return unsupported(format!("`{}` is not a loss", op.name())),
    };
    let x = arg(inputs, 0)?;
    let target = arg(inputs, 1)?;
    let weight = inputs.get(2).copied().flatten();
    let d = x.dtype();
    if !d.is_float() {
        return unsupported(format!("`{}` on {d}", op.name()));
    }
    let shape = x.shape().to_vec();
    if shape.len() < 2 {
        return invalid(format!("input must be [N, C, d...], got {shape:?}"));
    }
    let want_t: Vec<usize> = [shape[0]].iter().chain(&shape[2..]).copied().collect();
    if target.shape() != &want_t[..] {
        return invalid(format!(
            "target has shape {:?}, expected {want_t:?}",
            target.shape()
        ));
    }
    let t = target.to_i64_vec().ok_or_else(|| {
        OpError::Invalid(format!("target must be integer, got {}", target.dtype()))
    })?;
    let w = match weight {
        Some(w) if w.dtype() != d || w.shape() != [shape[1]] => {
            return invalid(format!(
                "weight must be {d}[{}], got {}{:?}",
                shape[1],
                w.dtype(),
                w.shape()
            ))
        }
        Some(w) => Some(w.to_f64_vec()),
        None => None,
    };
    let r = rounder(d);
    let xs = x.to_f64_vec();
    let lp = if softmax {
        log_softmax(&xs, &shape, r)
    } else {
        xs
    };
    let loss = nll(&lp, &shape, &t, w.as_deref(), reduction, ignore_index, r)?;
    let loss_shape: &[usize] = match reduction {
        LossReduction::None => target.shape(),
        _ => &[],
    };
    let mut out = vec![Some(from_f64s(d, loss_shape, loss))];
    if softmax {
        out.push(ctx.wants(1).then(|| from_f64s(d, &shape, lp)));
    }
    Ok(out)
}

/// Log-softmax over axis 1 of [N, C, d...] as NumPy computes it: `x - max`, `exp`, the sum,
/// the quotient and the log, each rounded by `r`.
fn log_softmax(x: &[f64], shape: &[usize], r: fn(f64) -> f64) -> Vec<f64> {
    let (n, c) = (shape[0], shape[1]);
    let inner: usize = shape[2..].iter().product();
    let mut out = vec![0.0; x.len()];
    for i in 0..n {
        for k in 0..inner {
            let at = |j: usize| (i * c + j) * inner + k;
            let max = (0..c).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = (0..c).map(|j| r(r(x[at(j)] - max).exp())).collect();
            let sum = r(e.iter().sum());
            for (j, e) in e.iter().enumerate() {
                out[at(j)] = r(r(e / sum).ln());
            }
        }
    }
    out
}

/// The negative log-likelihood of `target` under `x` (log-probabilities [N, C, d...]).
fn nll(
    x: &[f64],
    shape: &[usize],
    t: &[i64],
    w: Option<&[f64]>,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    r: fn(f64) -> f64,
) -> Result<Vec<f64>, OpError> {
    let (n, c) = (shape[0], shape[1]);
    let inner: usize = shape[2..].iter().product();
    let ignored = |tv: i64| ignore_index == Some(tv);
    // The weight each target's loss is scaled by (NumPy's `np.take(weight, target,
    // mode="clip")`), 0 where the target is ignored; none without weights or ignore_index.
    let gathered: Option<Vec<f64>> = match (w, ignore_index) {
        (Some(w), _) => Some(
            t.iter()
                .map(|&tv| match ignored(tv) {
                    true => 0.0,
                    false => w[tv.clamp(0, c.saturating_sub(1) as i64) as usize],
                })
                .collect(),
        ),
        (None, Some(_)) => Some(
            t.iter()
                .map(|&tv| if ignored(tv) { 0.0 } else { 1.0 })
                .collect(),
        ),
        (None, None) => None,
    };
    let mut loss = vec![0.0; n * inner];
    for i in 0..n {
        for k in 0..inner {
            let tv = t[i * inner + k];
            if ignored(tv) {
                continue;
            }
            // NumPy indexing: a negative class counts from the end.
            let cls = if tv < 0 { tv + c as i64 } else { tv };
            if !(0..c as i64).contains(&cls) {
                return invalid(format!("target {tv} is out of range for {c} classes"));
            }
            loss[i * inner + k] = -x[(i * c + cls as usize) * inner + k];
        }
    }
    let sum = |v: &[f64]| r(v.iter().sum());
    if let Some(g) = &gathered {
        for (l, g) in loss.iter_mut().zip(g) {
            *l = r(*l * g);
        }
        if reduction == LossReduction::Mean {
            return Ok(vec![r(sum(&loss) / sum(g))]);
        }
    }
    Ok(match reduction {
        LossReduction::None => loss,
        LossReduction::Sum => vec![sum(&loss)],
        LossReduction::Mean => vec![r(sum(&loss) / loss.len() as f64)],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::{Graph, Node, TensorType};

    /// Runs `op` with `outs` result slots.
    fn try_run(
        op: Op,
        ins: &[Option<&Tensor>],
        outs: usize,
    ) -> Result<Vec<Option<Tensor>>, OpError> {
        let mut g = Graph::new("t");
        let outputs = (0..outs)
            .map(|i| Some(g.add_input(format!("o{i}"), TensorType::known(DType::F32, &[]))))
            .collect();
        let node = Node {
            name: "n".into(),
            op: op.clone(),
            inputs: vec![],
            outputs,
        };
        eval(
            &op,
            ins,
            &OpCtx {
                graph: &g,
                node: &node,
            },
        )
    }

    fn run(op: Op, ins: &[Option<&Tensor>], outs: usize) -> Vec<Option<Tensor>> {
        try_run(op, ins, outs).expect("op runs")
    }

    fn vals(t: &Option<Tensor>) -> Vec<f64> {
        t.as_ref().unwrap().to_f64_vec()
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn nll_by_hand() {
        // N = 2, C = 3, d1 = 2.
        let x = Tensor::f32s(
            &[2, 3, 2],
            vec![
                1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0,
            ],
        );
        let t = Tensor::i64s(&[2, 2], vec![0, 2, 1, 1]);
        let w = Tensor::f32s(&[3], vec![0.5, 1.0, 2.0]);
        let nll = |reduction, ignore_index| Op::NllLoss {
            reduction,
            ignore_index,
        };
        // -x[0,0,0], -x[0,2,1], -x[1,1,0], -x[1,1,1]
        let y = run(nll(LossReduction::None, None), &[Some(&x), Some(&t)], 1);
        assert_eq!(y[0].as_ref().unwrap().shape(), &[2, 2]);
        close(&vals(&y[0]), &[-1.0, -6.0, -9.0, -10.0]);
        let y = run(nll(LossReduction::Sum, None), &[Some(&x), Some(&t)], 1);
        close(&vals(&y[0]), &[-26.0]);
        let y = run(nll(LossReduction::Mean, None), &[Some(&x), Some(&t)], 1);
        close(&vals(&y[0]), &[-6.5]);
        // Weighted mean: (-0.5 - 12 - 9 - 10) / (0.5 + 2 + 1 + 1) = -31.5 / 4.5 = -7.
        let y = run(
            nll(LossReduction::Mean, None),
            &[Some(&x), Some(&t), Some(&w)],
            1,
        );
        close(&vals(&y[0]), &[-7.0]);
        // Ignoring class 1: (-0.5 - 12) / 2.5 = -5; unweighted: (-1 - 6) / 2.
        let y = run(
            nll(LossReduction::Mean, Some(1)),
            &[Some(&x), Some(&t), Some(&w)],
            1,
        );
        close(&vals(&y[0]), &[-5.0]);
        let y = run(nll(LossReduction::Mean, Some(1)), &[Some(&x), Some(&t)], 1);
        close(&vals(&y[0]), &[-3.5]);
        let y = run(nll(LossReduction::None, Some(2)), &[Some(&x), Some(&t)], 1);
        close(&vals(&y[0]), &[-1.0, 0.0, -9.0, -10.0]);
        // An ignore_index of -1 still excludes the target from the mean.
        let t2 = Tensor::i64s(&[2, 2], vec![-1, 2, 1, 1]);
        let y = run(
            nll(LossReduction::Mean, Some(-1)),
            &[Some(&x), Some(&t2)],
            1,
        );
        close(&vals(&y[0]), &[-25.0 / 3.0]);
        // A target out of range is an error.
        let bad = Tensor::i64s(&[2, 2], vec![3, 0, 0, 0]);
        assert!(try_run(nll(LossReduction::Sum, None), &[Some(&x), Some(&bad)], 1).is_err());
    }

    #[test]
    fn softmax_cross_entropy_by_hand() {
        // One sample, two classes with scores 0 and ln 3: p = [1/4, 3/4].
        let l3 = 3f64.ln();
        let x = Tensor::F64(
            ndarray::ArrayD::from_shape_vec(vec![2, 2], vec![0.0, l3, l3, 0.0]).unwrap(),
        );
        let t = Tensor::i64s(&[2], vec![0, 0]);
        let sce = Op::SoftmaxCrossEntropy {
            reduction: LossReduction::Mean,
            ignore_index: None,
        };
        let y = run(sce, &[Some(&x), Some(&t)], 2);
        // loss = (ln 4 + ln(4/3)) / 2
        let want = (4f64.ln() + (4.0f64 / 3.0).ln()) / 2.0;
        close(&vals(&y[0]), &[want]);
        close(
            &vals(&y[1]),
            &[-(4f64.ln()), (0.75f64).ln(), (0.75f64).ln(), -(4f64.ln())],
        );
        assert_eq!(y[0].as_ref().unwrap().dtype(), DType::F64);
        // Without a second result, no log_prob.
        let sce = Op::SoftmaxCrossEntropy {
            reduction: LossReduction::Sum,
            ignore_index: Some(0),
        };
        let y = run(sce, &[Some(&x), Some(&t)], 1);
        close(&vals(&y[0]), &[0.0]);
        assert!(y[1].is_none());
    }
}
