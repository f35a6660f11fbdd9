//! Reference kernels: reductions, arg-reductions and cumulative sums/products.
//!
//! Every kernel first regroups the input into contiguous *lanes* (the elements that
//! reduce together), so all of them are linear in the input size. Float reductions
//! accumulate in f64 and round once to the tensor's dtype; integer ones wrap in the
//! dtype (computed exactly in i128 and truncated).

use super::elementwise::{Elem, Scalar};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{ArgKind, CumKind, DType, Op, ReduceKind};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    let y = match op {
        Op::Reduce {
            kind,
            axes,
            keep_dims,
            noop_with_empty_axes,
        } => {
            // Run-time axes come as operand 1 (the attribute is then empty).
            let rt;
            let axes = match inputs.get(1).copied().flatten() {
                Some(a) => {
                    rt = a.to_i64_vec().ok_or_else(|| {
                        OpError::Invalid(format!("axes must be integer, got {}", a.dtype()))
                    })?;
                    &rt
                }
                None => axes,
            };
            if axes.is_empty() && *noop_with_empty_axes {
                return Ok(vec![Some(x.clone())]);
            }
            let reduced = axes_mask(axes, x.shape().len())?;
            let out_shape = reduced_shape(x.shape(), &reduced, *keep_dims);
            if x.dtype() == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
                return unsupported(format!("reduce {} on bool", kind.word()));
            }
            crate::map_array!(x, a => reduce(a, *kind, &reduced, &out_shape))
        }
        Op::ArgReduce {
            kind,
            axis,
            keep_dims,
            select_last_index,
        } => {
            let axis = resolve_axis(*axis, x.shape().len())?;
            if x.shape()[axis] == 0 {
                return invalid("arg-reduction over an empty axis");
            }
            let mut reduced = vec![false; x.shape().len()];
            reduced[axis] = true;
            let out_shape = reduced_shape(x.shape(), &reduced, *keep_dims);
            let max = *kind == ArgKind::Max;
            let last = *select_last_index;
            Tensor::I64(crate::with_array!(x, a => arg_reduce(a, &reduced, &out_shape, max, last)))
        }
        Op::Cumulative {
            kind,
            exclusive,
            reverse,
        } => {
            let axis = arg(inputs, 1)?
                .to_i64_vec()
                .filter(|v| v.len() == 1)
                .ok_or_else(|| {
                    OpError::Invalid("cumulative axis must be an integer scalar".into())
                })?[0];
            let axis = resolve_axis(axis, x.shape().len())?;
            if x.dtype() == DType::Bool {
                return unsupported("cumulative on bool");
            }
            let prod = *kind == CumKind::Prod;
            crate::map_array!(x, a => cumulative(a, axis, prod, *exclusive, *reverse))
        }
        _ => return unsupported(format!("`{}` is not a reduction", op.name())),
    };
    Ok(vec![Some(y)])
}

/// Resolves `axis` (negative counts from the end) against `rank`.
pub fn resolve_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return invalid(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Which axes `axes` names (all of them when empty); repeated axes are an error.
pub fn axes_mask(axes: &[i64], rank: usize) -> Result<Vec<bool>, OpError> {
    if axes.is_empty() {
        return Ok(vec![true; rank]);
    }
    let mut mask = vec![false; rank];
    for &a in axes {
        let a = resolve_axis(a, rank)?;
        if std::mem::replace(&mut mask[a], true) {
            return invalid(format!("axis {a} is repeated in {axes:?}"));
        }
    }
    Ok(mask)
}

/// The shape after reducing the masked axes: 1 there with `keep_dims`, else removed.
pub fn reduced_shape(shape: &[usize], reduced: &[bool], keep_dims: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(reduced)
        .filter_map(|(&d, &r)| match (r, keep_dims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// The elements of `a` regrouped so that the masked axes vary fastest: lane `i` (the
/// elements that reduce into output `i`, in row-major order of the kept axes) is
/// `data[i * len..(i + 1) * len]`. Returns the data, the lane length and the permutation
/// applied (kept axes, then reduced axes).
pub fn lanes<T: Clone>(a: &ArrayD<T>, reduced: &[bool]) -> (Vec<T>, usize, Vec<usize>) {
    let rank = a.ndim();
    let perm: Vec<usize> = (0..rank)
        .filter(|&i| !reduced[i])
        .chain((0..rank).filter(|&i| reduced[i]))
        .collect();
    let len = (0..rank)
        .filter(|&i| reduced[i])
        .map(|i| a.shape()[i])
        .product();
    let data = a
        .view()
        .permuted_axes(IxDyn(&perm))
        .iter()
        .cloned()
        .collect();
    (data, len, perm)
}

fn reduce<T: Elem>(
    a: &ArrayD<T>,
    kind: ReduceKind,
    reduced: &[bool],
    out_shape: &[usize],
) -> ArrayD<T> {
    let (data, len, _) = lanes(a, reduced);
    let n: usize = out_shape.iter().product();
    let is_float = T::DTYPE.is_float();
    let mut out = Vec::with_capacity(n);
    if T::DTYPE == DType::Bool {
        let bools: Vec<bool> = data
            .iter()
            .map(|v| v.to_scalar() != Scalar::Int(0))
            .collect();
        for lane in (0..n).map(|i| &bools[i * len..(i + 1) * len]) {
            let r = if kind == ReduceKind::Max {
                lane.iter().any(|&b| b)
            } else {
                lane.iter().all(|&b| b)
            };
            out.push(T::from_scalar(Scalar::Int(r as i128)));
        }
    } else if is_float {
        let f: Vec<f64> = data.iter().map(|v| v.to_float()).collect();
        for lane in (0..n).map(|i| &f[i * len..(i + 1) * len]) {
            out.push(T::from_float(reduce_floats(kind, lane)));
        }
    } else {
        let ints: Vec<i128> = data
            .iter()
            .map(|v| match v.to_scalar() {
                Scalar::Int(i) => i,
                Scalar::Float(f) => f as i128,
            })
            .collect();
        for lane in (0..n).map(|i| &ints[i * len..(i + 1) * len]) {
            out.push(T::from_scalar(reduce_ints(kind, lane)));
        }
    }
    ArrayD::from_shape_vec(IxDyn(out_shape), out).expect("one result per lane")
}

/// One float lane, in f64. Empty lanes give each reduction's identity (Max: -inf,
/// Min: +inf, LogSum and LogSumExp: -inf, Mean: NaN).
fn reduce_floats(kind: ReduceKind, lane: &[f64]) -> f64 {
    use ReduceKind::*;
    let sum = |f: fn(f64) -> f64| lane.iter().map(|&x| f(x)).sum::<f64>();
    match kind {
        Sum => sum(|x| x),
        Mean => sum(|x| x) / lane.len() as f64,
        Prod => lane.iter().product(),
        L1 => sum(f64::abs),
        L2 => sum(|x| x * x).sqrt(),
        SumSquare => sum(|x| x * x),
        LogSum => sum(|x| x).ln(),
        LogSumExp => {
            // Shift by the largest finite element (as ONNX's reference does) so exp
            // cannot overflow; infinities and NaN then propagate on their own.
            let m = lane
                .iter()
                .copied()
                .filter(|x| x.is_finite())
                .fold(f64::NEG_INFINITY, f64::max);
            let m = if m.is_finite() { m } else { 0.0 };
            m + lane.iter().map(|&x| (x - m).exp()).sum::<f64>().ln()
        }
        Max | Min => {
            let max = kind == Max;
            let mut acc = if max {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
            for &x in lane {
                if x.is_nan() {
                    return x;
                }
                if (x > acc) == max && x != acc {
                    acc = x;
                }
            }
            acc
        }
    }
}

/// One integer lane: exact (wrapping) where the result is an integer, through f64
/// where it is not (Mean, L2, LogSum, LogSumExp truncate back to the dtype).
fn reduce_ints(kind: ReduceKind, lane: &[i128]) -> Scalar {
    use ReduceKind::*;
    let fold = |init: i128, f: fn(i128, i128) -> i128| {
        Scalar::Int(lane.iter().fold(init, |a, &x| f(a, x)))
    };
    match kind {
        Sum => fold(0, i128::wrapping_add),
        Prod => fold(1, i128::wrapping_mul),
        L1 => fold(0, |a, x| a.wrapping_add(x.wrapping_abs())),
        SumSquare => fold(0, |a, x| a.wrapping_add(x.wrapping_mul(x))),
        // Empty: -inf / +inf saturate to the dtype's min / max.
        Max => lane
            .iter()
            .max()
            .map_or(Scalar::Float(f64::NEG_INFINITY), |&m| Scalar::Int(m)),
        Min => lane
            .iter()
            .min()
            .map_or(Scalar::Float(f64::INFINITY), |&m| Scalar::Int(m)),
        Mean | L2 | LogSum | LogSumExp => {
            let f: Vec<f64> = lane.iter().map(|&x| x as f64).collect();
            Scalar::Float(reduce_floats(kind, &f))
        }
    }
}

/// Index of the max/min of each lane (first occurrence, or last with `last`); NaN wins
/// over every number, as in NumPy.
fn arg_reduce<T: Elem>(
    a: &ArrayD<T>,
    reduced: &[bool],
    out_shape: &[usize],
    max: bool,
    last: bool,
) -> ArrayD<i64> {
    let (data, len, _) = lanes(a, reduced);
    let n: usize = out_shape.iter().product();
    #[allow(clippy::eq_op)]
    let out = (0..n)
        .map(|i| {
            let lane = &data[i * len..(i + 1) * len];
            let order: Box<dyn Iterator<Item = usize>> = if last {
                Box::new((0..len).rev())
            } else {
                Box::new(0..len)
            };
            let mut best: Option<(usize, T)> = None;
            for j in order {
                let v = lane[j];
                if v != v {
                    best = Some((j, v));
                    break;
                }
                match best {
                    Some((_, b)) if !(if max { v > b } else { v < b }) => {}
                    _ => best = Some((j, v)),
                }
            }
            best.map_or(0, |(j, _)| j as i64)
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(out_shape), out).expect("one result per lane")
}

/// Running sums/products along `axis`; floats accumulate in f64, integers wrap.
fn cumulative<T: Elem>(
    a: &ArrayD<T>,
    axis: usize,
    prod: bool,
    exclusive: bool,
    reverse: bool,
) -> ArrayD<T> {
    let mut mask = vec![false; a.ndim()];
    mask[axis] = true;
    let (data, len, perm) = lanes(a, &mask);
    let mut out = data.clone();
    if len > 0 {
        let is_float = T::DTYPE.is_float();
        for (src, dst) in data.chunks(len).zip(out.chunks_mut(len)) {
            let order: Box<dyn Iterator<Item = usize>> = if reverse {
                Box::new((0..len).rev())
            } else {
                Box::new(0..len)
            };
            let (mut fa, mut ia) = if prod { (1.0f64, 1i128) } else { (0.0, 0) };
            for j in order {
                let (x, prev_f, prev_i) = (src[j].to_scalar(), fa, ia);
                match x {
                    Scalar::Float(f) => fa = if prod { fa * f } else { fa + f },
                    Scalar::Int(i) => {
                        ia = if prod {
                            ia.wrapping_mul(i)
                        } else {
                            ia.wrapping_add(i)
                        }
                    }
                }
                let (f, i) = if exclusive {
                    (prev_f, prev_i)
                } else {
                    (fa, ia)
                };
                dst[j] = if is_float {
                    T::from_float(f)
                } else {
                    T::from_scalar(Scalar::Int(i))
                };
            }
        }
    }
    let permuted_shape: Vec<usize> = perm.iter().map(|&p| a.shape()[p]).collect();
    let mut inverse = vec![0; perm.len()];
    for (j, &p) in perm.iter().enumerate() {
        inverse[p] = j;
    }
    ArrayD::from_shape_vec(IxDyn(&permuted_shape), out)
        .expect("same element count")
        .permuted_axes(IxDyn(&inverse))
        .as_standard_layout()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::Graph;

    fn run(op: Op, inputs: &[&Tensor]) -> Result<Tensor, OpError> {
        let graph = Graph::default();
        let node = rafter_ir::Node {
            name: "n".into(),
            op: op.clone(),
            inputs: vec![],
            outputs: vec![],
        };
        let ctx = OpCtx {
            graph: &graph,
            node: &node,
        };
        let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        Ok(eval(&op, &ins, &ctx)?.remove(0).unwrap())
    }

    fn arr<T: Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        T::wrap(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    }

    fn red(kind: ReduceKind, axes: &[i64], keep_dims: bool, x: &Tensor) -> Tensor {
        run(
            Op::Reduce {
                kind,
                axes: axes.to_vec(),
                keep_dims,
                noop_with_empty_axes: false,
            },
            &[x],
        )
        .unwrap()
    }

    fn f32s(t: &Tensor) -> (Vec<usize>, Vec<f32>) {
        let Tensor::F32(a) = t else { panic!("{t:?}") };
        (a.shape().to_vec(), a.iter().copied().collect())
    }

    #[test]
    fn sums_and_keep_dims() {
        let x = arr::<f32>(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            f32s(&red(ReduceKind::Sum, &[1], true, &x)),
            (vec![2, 1], vec![6.0, 15.0])
        );
        assert_eq!(
            f32s(&red(ReduceKind::Sum, &[0], false, &x)),
            (vec![3], vec![5.0, 7.0, 9.0])
        );
        assert_eq!(
            f32s(&red(ReduceKind::Mean, &[-2], false, &x)),
            (vec![3], vec![2.5, 3.5, 4.5])
        );
        assert_eq!(
            f32s(&red(ReduceKind::Prod, &[], false, &x)),
            (vec![], vec![720.0])
        );
        assert_eq!(
            f32s(&red(ReduceKind::Max, &[], true, &x)),
            (vec![1, 1], vec![6.0])
        );
        assert_eq!(
            f32s(&red(ReduceKind::SumSquare, &[1], false, &x)).1,
            [14.0, 77.0]
        );
        let l = f32s(&red(ReduceKind::LogSumExp, &[1], false, &x)).1;
        assert!((l[0] - 3.407_606).abs() < 1e-5);
        let big = arr::<f32>(&[2], vec![1000.0, 1000.0]);
        assert!((f32s(&red(ReduceKind::LogSumExp, &[], false, &big)).1[0] - 1000.693).abs() < 1e-3);
    }

    #[test]
    fn empty_reductions() {
        let x = arr::<f32>(&[2, 0, 4], vec![]);
        assert_eq!(
            f32s(&red(ReduceKind::Sum, &[1], true, &x)),
            (vec![2, 1, 4], vec![0.0; 8])
        );
        assert_eq!(
            f32s(&red(ReduceKind::Prod, &[1], false, &x)).1,
            vec![1.0; 8]
        );
        assert_eq!(
            f32s(&red(ReduceKind::Max, &[1], false, &x)).1,
            vec![f32::NEG_INFINITY; 8]
        );
        assert_eq!(
            f32s(&red(ReduceKind::Min, &[1], false, &x)).1,
            vec![f32::INFINITY; 8]
        );
        assert_eq!(
            f32s(&red(ReduceKind::LogSumExp, &[1], false, &x)).1,
            vec![f32::NEG_INFINITY; 8]
        );
        assert_eq!(f32s(&red(ReduceKind::Sum, &[0], false, &x)).0, vec![0, 4]);
        let i = arr::<i32>(&[0], vec![]);
        assert_eq!(
            red(ReduceKind::Max, &[], false, &i),
            arr::<i32>(&[], vec![i32::MIN])
        );
        assert_eq!(
            red(ReduceKind::Min, &[], false, &i),
            arr::<i32>(&[], vec![i32::MAX])
        );
        let b = arr::<bool>(&[0], vec![]);
        assert_eq!(
            red(ReduceKind::Max, &[], false, &b),
            arr::<bool>(&[], vec![false])
        );
        assert_eq!(
            red(ReduceKind::Min, &[], false, &b),
            arr::<bool>(&[], vec![true])
        );
    }

    #[test]
    fn int_and_bool_reductions() {
        let x = arr::<i8>(&[2, 2], vec![100, 100, -7, 2]);
        assert_eq!(
            red(ReduceKind::Sum, &[1], false, &x),
            arr::<i8>(&[2], vec![-56, -5])
        );
        assert_eq!(
            red(ReduceKind::Mean, &[1], false, &x),
            arr::<i8>(&[2], vec![100, -2])
        );
        assert_eq!(
            red(ReduceKind::Min, &[0], false, &x),
            arr::<i8>(&[2], vec![-7, 2])
        );
        let b = arr::<bool>(&[2, 2], vec![true, false, true, true]);
        assert_eq!(
            red(ReduceKind::Min, &[1], false, &b),
            arr::<bool>(&[2], vec![false, true])
        );
        assert_eq!(
            red(ReduceKind::Max, &[0], false, &b),
            arr::<bool>(&[2], vec![true, true])
        );
        assert!(run(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![0, 0],
                keep_dims: true,
                noop_with_empty_axes: false,
            },
            &[&x]
        )
        .is_err());
    }

    #[test]
    fn run_time_axes_operand() {
        // x = [[1, 2, 3], [4, 5, 6]]
        let x = arr::<f32>(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let op = |kind, keep_dims, noop_with_empty_axes| Op::Reduce {
            kind,
            axes: vec![],
            keep_dims,
            noop_with_empty_axes,
        };
        let axes = |v: &[i64]| Tensor::i64s(&[v.len()], v.to_vec());
        let go = |o: Op, a: &[i64]| f32s(&run(o, &[&x, &axes(a)]).unwrap());
        // Rows: 1+2+3 = 6, 4+5+6 = 15; negative axes count from the end.
        assert_eq!(
            go(op(ReduceKind::Sum, false, false), &[-1]),
            (vec![2], vec![6.0, 15.0])
        );
        // Columns' maxima, kept: [[4, 5, 6]].
        assert_eq!(
            go(op(ReduceKind::Max, true, false), &[0]),
            (vec![1, 3], vec![4.0, 5.0, 6.0])
        );
        // Both axes: 1*2*3*4*5*6 = 720.
        assert_eq!(
            go(op(ReduceKind::Prod, false, false), &[1, 0]),
            (vec![], vec![720.0])
        );
        // Empty axes reduce everything (21 / 6 = 3.5) unless noop makes the identity.
        assert_eq!(
            go(op(ReduceKind::Mean, true, false), &[]),
            (vec![1, 1], vec![3.5])
        );
        assert_eq!(
            go(op(ReduceKind::Mean, true, true), &[]),
            (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        // noop only matters for empty axes: the row sums again.
        assert_eq!(
            go(op(ReduceKind::Sum, false, true), &[1]),
            (vec![2], vec![6.0, 15.0])
        );
        assert!(run(op(ReduceKind::Sum, false, false), &[&x, &axes(&[2])]).is_err());
        let fl = arr::<f32>(&[1], vec![0.0]);
        assert!(run(op(ReduceKind::Sum, false, false), &[&x, &fl]).is_err());
    }

    #[test]
    fn large_reduction_is_fast() {
        let x = arr::<f32>(&[1000, 1000], vec![1.0; 1_000_000]);
        let t = std::time::Instant::now();
        for axes in [vec![0], vec![1], vec![]] {
            let r = red(ReduceKind::Sum, &axes, false, &x);
            assert!(f32s(&r).1.iter().all(|&v| v == 1000.0 || v == 1e6));
        }
        assert!(t.elapsed().as_secs_f64() < 5.0);
    }

    #[test]
    fn arg_reductions() {
        let x = arr::<f32>(&[2, 3], vec![1.0, 5.0, 5.0, 7.0, 2.0, 7.0]);
        let op = |kind, axis, keep_dims, select_last_index| Op::ArgReduce {
            kind,
            axis,
            keep_dims,
            select_last_index,
        };
        assert_eq!(
            run(op(ArgKind::Max, 1, false, false), &[&x]).unwrap(),
            Tensor::i64s(&[2], vec![1, 0])
        );
        assert_eq!(
            run(op(ArgKind::Max, -1, true, true), &[&x]).unwrap(),
            Tensor::i64s(&[2, 1], vec![2, 2])
        );
        assert_eq!(
            run(op(ArgKind::Min, 0, true, false), &[&x]).unwrap(),
            Tensor::i64s(&[1, 3], vec![0, 1, 0])
        );
        let n = arr::<f32>(&[3], vec![1.0, f32::NAN, 3.0]);
        assert_eq!(
            run(op(ArgKind::Max, 0, false, false), &[&n]).unwrap(),
            Tensor::i64s(&[], vec![1])
        );
    }

    #[test]
    fn cumulative_modes() {
        let x = arr::<i32>(&[2, 3], vec![1, 2, 3, 4, 5, 6]);
        let op = |kind, exclusive, reverse| Op::Cumulative {
            kind,
            exclusive,
            reverse,
        };
        let ax = |a: i64| Tensor::i64s(&[], vec![a]);
        assert_eq!(
            run(op(CumKind::Sum, false, false), &[&x, &ax(1)]).unwrap(),
            arr::<i32>(&[2, 3], vec![1, 3, 6, 4, 9, 15])
        );
        assert_eq!(
            run(op(CumKind::Sum, true, true), &[&x, &ax(-1)]).unwrap(),
            arr::<i32>(&[2, 3], vec![5, 3, 0, 11, 6, 0])
        );
        assert_eq!(
            run(op(CumKind::Prod, false, false), &[&x, &ax(0)]).unwrap(),
            arr::<i32>(&[2, 3], vec![1, 2, 3, 4, 10, 18])
        );
        let f = arr::<f32>(&[4], vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(
            run(op(CumKind::Prod, true, false), &[&f, &ax(0)]).unwrap(),
            arr::<f32>(&[4], vec![1.0, 1.0, 2.0, 6.0])
        );
    }
}
