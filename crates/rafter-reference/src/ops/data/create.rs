//! Ops that create tensors: ConstantOfShape, Range, EyeLike.

use super::{with_dtype, Elem};
use crate::ops::{invalid, OpError};
use crate::{with_array, Tensor};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{DType, Scalar};

fn dims(shape: &[i64]) -> Result<Vec<usize>, OpError> {
    if shape.iter().any(|&d| d < 0) {
        return invalid(format!("negative dim in shape {shape:?}"));
    }
    Ok(shape.iter().map(|&d| d as usize).collect())
}

pub fn constant_of_shape(shape: &[i64], value: Scalar) -> Result<Tensor, OpError> {
    let shape = dims(shape)?;
    Ok(with_dtype!(value.dtype(), T => {
        T::wrap(ArrayD::from_elem(IxDyn(&shape), T::from_scalar(value)))
    }))
}

/// `start, start + delta, ...` below `limit` (above it for a negative delta), in the
/// operands' dtype. Integers step exactly; floats are computed in f64 as NumPy's arange.
pub fn range(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<Tensor, OpError> {
    let d = start.dtype();
    if limit.dtype() != d || delta.dtype() != d {
        return invalid("range: start, limit and delta differ in dtype");
    }
    let one = |t: &Tensor, what: &str| -> Result<f64, OpError> {
        match t.to_f64_vec()[..] {
            [v] => Ok(v),
            _ => invalid(format!("range: {what} must be a scalar")),
        }
    };
    if d.is_int() {
        let (s, l, st) = (
            super::int_scalar(start, "start")?,
            super::int_scalar(limit, "limit")?,
            super::int_scalar(delta, "delta")?,
        );
        if st == 0 {
            return invalid("range: delta is 0");
        }
        let diff = l as i128 - s as i128;
        let st128 = st as i128;
        let n = if (diff > 0) == (st > 0) && diff != 0 {
            ((diff.abs() + st128.abs() - 1) / st128.abs()) as usize
        } else {
            0
        };
        fn go<T: Elem>(_: &ArrayD<T>, s: i64, st: i64, n: usize) -> Tensor {
            let v = (0..n as i64)
                .map(|i| T::from_i64(s.wrapping_add(i.wrapping_mul(st))))
                .collect();
            T::wrap(ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap())
        }
        return Ok(with_array!(start, a => go(a, s, st, n)));
    }
    if d == DType::Bool {
        return invalid("range: bool operands");
    }
    let (s, l, st) = (
        one(start, "start")?,
        one(limit, "limit")?,
        one(delta, "delta")?,
    );
    if st == 0.0 {
        return invalid("range: delta is 0");
    }
    let n = ((l - s) / st).ceil().max(0.0) as usize;
    fn go<T: Elem>(_: &ArrayD<T>, s: f64, st: f64, n: usize) -> Tensor {
        let v = (0..n).map(|i| T::from_f64(s + i as f64 * st)).collect();
        T::wrap(ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap())
    }
    Ok(with_array!(start, a => go(a, s, st, n)))
}

pub fn eye_like(x: &Tensor, dtype: DType, k: i64) -> Result<Tensor, OpError> {
    let (r, c) = match *x.shape() {
        [n] => (n, n),
        [r, c] => (r, c),
        ref s => return invalid(format!("eye_like: input must be 2-D, got {s:?}")),
    };
    Ok(with_dtype!(dtype, T => {
        T::wrap(ArrayD::from_shape_fn(IxDyn(&[r, c]), |i| {
            if i[1] as i64 - i[0] as i64 == k { T::one() } else { T::zero() }
        }))
    }))
}
