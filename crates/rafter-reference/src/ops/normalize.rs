//! Reference kernels: softmax-like and normalisation ops.
//!
//! Every kernel computes in f64 and rounds once to the input's dtype (statistics outputs
//! take the dtype the graph gives them). Inputs must be floats.

use super::broadcast::broadcast_view;
use super::elementwise::{cast, from_f64s};
use super::reduce::{axes_mask, lanes, resolve_axis};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DType, Op, SoftmaxKind};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    if !x.dtype().is_float() {
        return unsupported(format!("`{}` on {}", op.name(), x.dtype()));
    }
    let shape = x.shape().to_vec();
    let rank = shape.len();
    let xs = floats(x);
    let opt = |i: usize| inputs.get(i).copied().flatten();
    let out = |v: Vec<f64>| Some(from_f64s(x.dtype(), &shape, v));
    Ok(match op {
        Op::Softmax { kind, axis } => {
            let mut mask = vec![false; rank];
            mask[resolve_axis(*axis, rank)?] = true;
            let half = half_steps(x.dtype());
            vec![out(map_lanes(&xs, &shape, &mask, |l, o| {
                softmax(*kind, l, o, half)
            }))]
        }
        Op::LayerNorm { axis, epsilon } => {
            let axis = resolve_axis(*axis, rank)?;
            let scale = param_to(arg(inputs, 1)?, &shape)?;
            let bias = opt(2).map(|b| param_to(b, &shape)).transpose()?;
            let cols: usize = shape[axis..].iter().product();
            let (mut y, mut means, mut inv_stds) = (xs.clone(), vec![], vec![]);
            if cols > 0 {
                for (i, row) in y.chunks_mut(cols).enumerate() {
                    let (mean, var) = mean_var(row);
                    let inv = 1.0 / (var + *epsilon as f64).sqrt();
                    for (j, v) in row.iter_mut().enumerate() {
                        let k = i * cols + j;
                        *v = (*v - mean) * inv * scale[k] + bias.as_ref().map_or(0.0, |b| b[k]);
                    }
                    means.push(mean);
                    inv_stds.push(inv);
                }
            }
            let stat_shape: Vec<usize> = (0..rank)
                .map(|i| if i < axis { shape[i] } else { 1 })
                .collect();
            let stat = |i: usize, v: Vec<f64>| {
                let d = ctx.output_type(i).map_or(x.dtype(), |t| t.dtype);
                ctx.wants(i).then(|| from_f64s(d, &stat_shape, v))
            };
            vec![out(y), stat(1, means), stat(2, inv_stds)]
        }
        Op::RmsNorm { axis, epsilon } => {
            let axis = resolve_axis(*axis, rank)?;
            let scale = param_to(arg(inputs, 1)?, &shape)?;
            let cols: usize = shape[axis..].iter().product();
            let mut y = xs;
            if cols > 0 {
                for (i, row) in y.chunks_mut(cols).enumerate() {
                    let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
                    let inv = 1.0 / (ms + *epsilon as f64).sqrt();
                    for (j, v) in row.iter_mut().enumerate() {
                        *v *= inv * scale[i * cols + j];
                    }
                }
            }
            vec![out(y)]
        }
        Op::GroupNorm {
            num_groups,
            epsilon,
        } => {
            let (n, c, spatial) = ncs(&shape)?;
            let g = *num_groups as usize;
            if *num_groups <= 0 || c % g != 0 {
                return invalid(format!(
                    "{c} channels do not split into {num_groups} groups"
                ));
            }
            let per_group = c / g;
            let scale = channel_param(arg(inputs, 1)?, c, Some(g))?;
            let bias = channel_param(arg(inputs, 2)?, c, Some(g))?;
            let mut y = xs;
            let chunk = per_group * spatial;
            if chunk > 0 {
                for (i, grp) in y.chunks_mut(chunk).enumerate() {
                    let (mean, var) = mean_var(grp);
                    let inv = 1.0 / (var + *epsilon as f64).sqrt();
                    for (j, v) in grp.iter_mut().enumerate() {
                        let ch = (i % g) * per_group + j / spatial;
                        *v = (*v - mean) * inv * scale[ch] + bias[ch];
                    }
                }
            }
            debug_assert_eq!(y.len(), n * c * spatial);
            vec![out(y)]
        }
        Op::InstanceNorm { epsilon } => {
            let (_, c, spatial) = ncs(&shape)?;
            let scale = channel_param(arg(inputs, 1)?, c, None)?;
            let bias = channel_param(arg(inputs, 2)?, c, None)?;
            let mut y = xs;
            if spatial > 0 {
                for (i, plane) in y.chunks_mut(spatial).enumerate() {
                    let ch = i % c;
                    let (mean, var) = mean_var(plane);
                    let inv = 1.0 / (var + *epsilon as f64).sqrt();
                    for v in plane.iter_mut() {
                        *v = (*v - mean) * inv * scale[ch] + bias[ch];
                    }
                }
            }
            vec![out(y)]
        }
        Op::BatchNorm { epsilon } => {
            let (_, c, spatial) = ncs(&shape)?;
            let p: Vec<Vec<f64>> = (1..5)
                .map(|i| channel_param(arg(inputs, i)?, c, None))
                .collect::<Result<_, _>>()?;
            let (scale, bias, mean, var) = (&p[0], &p[1], &p[2], &p[3]);
            let y = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let ch = (i / spatial.max(1)) % c;
                    scale[ch] * (v - mean[ch]) / (var[ch] + *epsilon as f64).sqrt() + bias[ch]
                })
                .collect();
            vec![out(y)]
        }
        Op::LpNorm { axis, p } => {
            let mut mask = vec![false; rank];
            mask[resolve_axis(*axis, rank)?] = true;
            let p = *p as f64;
            let y = map_lanes(&xs, &shape, &mask, |l, o| {
                let norm = match p {
                    1.0 => l.iter().map(|v| v.abs()).sum::<f64>(),
                    2.0 => l.iter().map(|v| v * v).sum::<f64>().sqrt(),
                    _ => l.iter().map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p),
                };
                for (o, &v) in o.iter_mut().zip(l) {
                    *o = if norm == 0.0 { 0.0 } else { v / norm };
                }
            });
            vec![out(y)]
        }
        Op::Lrn {
            alpha,
            beta,
            bias,
            size,
        } => {
            let (n, c, spatial) = ncs(&shape)?;
            if *size <= 0 {
                return invalid(format!("lrn size {size} must be positive"));
            }
            let size = *size as usize;
            let (below, above) = ((size - 1) / 2, size / 2); // floor and ceil of (size-1)/2
            let (alpha, beta, bias) = (*alpha as f64, *beta as f64, *bias as f64);
            let mut y = vec![0.0; xs.len()];
            for b in 0..n {
                for ch in 0..c {
                    let lo = ch.saturating_sub(below);
                    let hi = (ch + above).min(c - 1);
                    for s in 0..spatial {
                        let at = |k: usize| xs[(b * c + k) * spatial + s];
                        let sq: f64 = (lo..=hi).map(|k| at(k) * at(k)).sum();
                        y[(b * c + ch) * spatial + s] =
                            at(ch) / (bias + alpha / size as f64 * sq).powf(beta);
                    }
                }
            }
            vec![out(y)]
        }
        Op::MeanVarianceNorm { axes } => {
            let axes = if axes.is_empty() {
                vec![0, 2, 3]
            } else {
                axes.clone()
            };
            let mask = axes_mask(&axes, rank)?;
            // ONNX's function body: (x - mean) / (sqrt(var) + 1e-9).
            let y = map_lanes(&xs, &shape, &mask, |l, o| {
                let (mean, var) = mean_var(l);
                let d = var.sqrt() + 1e-9;
                for (o, &v) in o.iter_mut().zip(l) {
                    *o = (v - mean) / d;
                }
            });
            vec![out(y)]
        }
        _ => return unsupported(format!("`{}` is not a normalisation", op.name())),
    })
}

/// The elements as f64, row-major.
fn floats(t: &Tensor) -> Vec<f64> {
    match cast(t, DType::F64) {
        Tensor::F64(a) => a.iter().copied().collect(),
        _ => unreachable!("cast to f64"),
    }
}

/// Population mean and variance.
fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var)
}

/// A parameter broadcast to `shape`, as f64, row-major.
fn param_to(p: &Tensor, shape: &[usize]) -> Result<Vec<f64>, OpError> {
    let Tensor::F64(a) = cast(p, DType::F64) else {
        unreachable!("cast to f64")
    };
    Ok(broadcast_view(&a, shape)?.iter().copied().collect())
}

/// A per-channel parameter of `c` elements; with `groups`, a per-group one (ONNX
/// GroupNormalization-18) is expanded to channels.
fn channel_param(p: &Tensor, c: usize, groups: Option<usize>) -> Result<Vec<f64>, OpError> {
    let v = floats(p);
    if v.len() == c {
        return Ok(v);
    }
    if let Some(g) = groups.filter(|&g| v.len() == g) {
        return Ok((0..c).map(|ch| v[ch / (c / g)]).collect());
    }
    invalid(format!(
        "parameter of shape {:?} does not match {c} channels",
        p.shape()
    ))
}

/// Batch, channel and spatial sizes of an [N, C, ...] tensor.
fn ncs(shape: &[usize]) -> Result<(usize, usize, usize), OpError> {
    if shape.len() < 2 {
        return invalid(format!("expected [N, C, ...], got shape {shape:?}"));
    }
    Ok((shape[0], shape[1], shape[2..].iter().product()))
}

/// Applies `f(lane, out_lane)` to every lane along the masked axes of a row-major
/// `data` of shape `shape`, and returns the results in row-major order.
fn map_lanes(
    data: &[f64],
    shape: &[usize],
    mask: &[bool],
    mut f: impl FnMut(&[f64], &mut [f64]),
) -> Vec<f64> {
    let a = ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).expect("shape matches data");
    let (src, len, perm) = lanes(&a, mask);
    let mut dst = vec![0.0; src.len()];
    if len > 0 {
        for (l, o) in src.chunks(len).zip(dst.chunks_mut(len)) {
            f(l, o);
        }
    }
    let permuted: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mut inverse = vec![0; perm.len()];
    for (j, &p) in perm.iter().enumerate() {
        inverse[p] = j;
    }
    ArrayD::from_shape_vec(IxDyn(&permuted), dst)
        .expect("same element count")
        .permuted_axes(IxDyn(&inverse))
        .iter()
        .copied()
        .collect()
}

/// How ONNX's reference rounds half-precision softmax: after every step, to the dtype;
/// f16 sums accumulate in f32 (NumPy), bf16 sums round after every addition (ml_dtypes).
#[derive(Clone, Copy)]
struct HalfSteps {
    round: fn(f64) -> f64,
    round_each_add: bool,
}

fn half_steps(d: DType) -> Option<HalfSteps> {
    match d {
        DType::F16 => Some(HalfSteps {
            round: |v| f16::from_f32(v as f32).to_f64(),
            round_each_add: false,
        }),
        DType::BF16 => Some(HalfSteps {
            round: |v| bf16::from_f32(v as f32).to_f64(),
            round_each_add: true,
        }),
        _ => None,
    }
}

/// One lane of softmax, log-softmax or hardmax, in f64. For f16 and bf16 (`half`), follow
/// ONNX's reference step by step instead (`x - max`, `exp`, the sum, the quotient and the
/// log each rounded to the dtype), so results agree to the last half-precision bit.
fn softmax(kind: SoftmaxKind, l: &[f64], o: &mut [f64], half: Option<HalfSteps>) {
    if kind == SoftmaxKind::Hardmax {
        // One at the first maximum (the first NaN, if any, as NumPy's argmax).
        let mut best = 0;
        for (i, &v) in l.iter().enumerate() {
            if l[best].is_nan() {
                break;
            }
            if v.is_nan() || v > l[best] {
                best = i;
            }
        }
        for (i, o) in o.iter_mut().enumerate() {
            *o = (i == best) as u8 as f64;
        }
        return;
    }
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log = kind == SoftmaxKind::LogSoftmax;
    if let Some(HalfSteps {
        round: r,
        round_each_add,
    }) = half
    {
        for (o, &v) in o.iter_mut().zip(l) {
            *o = r(r(v - m).exp());
        }
        let s = if round_each_add {
            o.iter().fold(0.0, |a, &v| r(a + v))
        } else {
            r(o.iter().sum::<f64>())
        };
        for o in o.iter_mut() {
            *o = if log { r(r(*o / s).ln()) } else { r(*o / s) };
        }
        return;
    }
    let s: f64 = l.iter().map(|&v| (v - m).exp()).sum();
    for (o, &v) in o.iter_mut().zip(l) {
        *o = if log {
            v - m - s.ln()
        } else {
            (v - m).exp() / s
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: Op, inputs: &[Option<&Tensor>]) -> Result<Vec<Option<Tensor>>, OpError> {
        let graph = rafter_ir::Graph::default();
        let node = rafter_ir::Node {
            name: "n".into(),
            op: op.clone(),
            inputs: vec![],
            outputs: vec![],
        };
        eval(
            &op,
            inputs,
            &OpCtx {
                graph: &graph,
                node: &node,
            },
        )
    }

    fn f32s(t: &Tensor) -> Vec<f32> {
        let Tensor::F32(a) = t else { panic!("{t:?}") };
        a.iter().copied().collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    fn y(op: Op, inputs: &[&Tensor]) -> Vec<f32> {
        let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        f32s(run(op, &ins).unwrap()[0].as_ref().unwrap())
    }

    #[test]
    fn softmax_family() {
        let x = Tensor::f32s(&[2, 2], vec![0.0, 1.0, 1000.0, 1000.0]);
        let sm = |kind, axis| Op::Softmax { kind, axis };
        let s = y(sm(SoftmaxKind::Softmax, -1), &[&x]);
        close(&s, &[0.268_941_42, 0.731_058_6, 0.5, 0.5]);
        let s = y(sm(SoftmaxKind::LogSoftmax, 1), &[&x]);
        close(
            &s,
            &[
                -1.313_261_7,
                -0.313_261_7,
                -std::f32::consts::LN_2,
                -std::f32::consts::LN_2,
            ],
        );
        assert_eq!(y(sm(SoftmaxKind::Hardmax, 0), &[&x]), [0.0, 0.0, 1.0, 1.0]);
        assert_eq!(y(sm(SoftmaxKind::Hardmax, 1), &[&x]), [0.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn layer_and_rms_norm() {
        let x = Tensor::f32s(&[2, 2], vec![1.0, 3.0, 2.0, 2.0]);
        let scale = Tensor::f32s(&[2], vec![1.0, 2.0]);
        let bias = Tensor::f32s(&[2], vec![0.5, 0.0]);
        let op = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-12,
        };
        let r = run(op, &[Some(&x), Some(&scale), Some(&bias)]).unwrap();
        close(&f32s(r[0].as_ref().unwrap()), &[-0.5, 2.0, 0.5, 0.0]);
        let r = run(
            Op::RmsNorm {
                axis: 1,
                epsilon: 0.0,
            },
            &[Some(&x), Some(&scale)],
        )
        .unwrap();
        let rms = (5.0f32).sqrt();
        close(
            &f32s(r[0].as_ref().unwrap()),
            &[1.0 / rms, 6.0 / rms, 1.0, 2.0],
        );
    }

    #[test]
    fn channel_norms() {
        // [N=1, C=2, 2]
        let x = Tensor::f32s(&[1, 2, 2], vec![1.0, 3.0, 5.0, 5.0]);
        let ones = Tensor::f32s(&[2], vec![1.0, 1.0]);
        let zeros = Tensor::f32s(&[2], vec![0.0, 0.0]);
        let r = y(Op::InstanceNorm { epsilon: 1e-12 }, &[&x, &ones, &zeros]);
        close(&r, &[-1.0, 1.0, 0.0, 0.0]);
        let one = Tensor::f32s(&[1], vec![2.0]);
        let zero = Tensor::f32s(&[1], vec![0.0]);
        let r = y(
            Op::GroupNorm {
                num_groups: 1,
                epsilon: 0.0,
            },
            &[&x, &one, &zero],
        );
        // mean 3.5, var 2.75
        let s = 2.0 / 2.75f32.sqrt();
        close(&r, &[-2.5 * s, -0.5 * s, 1.5 * s, 1.5 * s]);
        let mean = Tensor::f32s(&[2], vec![1.0, 5.0]);
        let var = Tensor::f32s(&[2], vec![4.0, 1.0]);
        let r = y(
            Op::BatchNorm { epsilon: 0.0 },
            &[&x, &ones, &ones, &mean, &var],
        );
        close(&r, &[1.0, 2.0, 1.0, 1.0]);
    }

    #[test]
    fn lp_lrn_mvn() {
        let x = Tensor::f32s(&[2, 2], vec![3.0, 4.0, 0.0, 0.0]);
        close(
            &y(Op::LpNorm { axis: 1, p: 2 }, &[&x]),
            &[0.6, 0.8, 0.0, 0.0],
        );
        close(
            &y(Op::LpNorm { axis: -1, p: 1 }, &[&x]),
            &[3.0 / 7.0, 4.0 / 7.0, 0.0, 0.0],
        );
        // LRN over 3 channels, size 3: channel 1 sees all three.
        let x = Tensor::f32s(&[1, 3, 1, 1], vec![1.0, 2.0, 3.0]);
        let r = y(
            Op::Lrn {
                alpha: 3.0,
                beta: 1.0,
                bias: 1.0,
                size: 3,
            },
            &[&x],
        );
        close(&r, &[1.0 / 6.0, 2.0 / 15.0, 3.0 / 14.0]);
        let x = Tensor::f32s(&[2, 1], vec![1.0, 3.0]);
        let r = y(Op::MeanVarianceNorm { axes: vec![0] }, &[&x]);
        close(&r, &[-1.0, 1.0]);
        assert!(run(
            Op::LpNorm { axis: 0, p: 2 },
            &[Some(&Tensor::i64s(&[1], vec![1]))]
        )
        .is_err());
    }
}
