//! Reference kernels: QLinearMatMul and QLinearConv (u8/i8).
//!
//! Numerics follow onnx/reference/ops (op_qlinear_matmul.py, op_qlinear_conv.py): the
//! integer product of the zero-point-shifted operands (MatMulInteger / ConvInteger), times
//! `a_scale * b_scale / y_scale` computed in the scales' dtype, in f64 (NumPy promotes the
//! i32 product), plus y_zero_point, rounded half to even and saturated.

use super::contraction;
use super::elementwise::from_f64s;
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use half::f16;
use rafter_ir::{DType, Op};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let ins = |idx: &[usize]| -> Vec<Option<&Tensor>> {
        idx.iter()
            .map(|&i| inputs.get(i).copied().flatten())
            .collect()
    };
    for i in [0, 3, 7] {
        let d = arg(inputs, i)?.dtype();
        if !matches!(d, DType::U8 | DType::I8) {
            return unsupported(format!("`{}` of dtype {d}", op.name()));
        }
    }
    let (int_op, per_channel_axis) = match op {
        Op::QLinearMatMul => (Op::MatMulInteger, None),
        Op::QLinearConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => (
            Op::ConvInteger {
                kernel_shape: kernel_shape.clone(),
                strides: strides.clone(),
                pads: pads.clone(),
                dilations: dilations.clone(),
                group: *group,
                auto_pad: *auto_pad,
            },
            Some(1),
        ),
        _ => return unsupported(format!("`{}` is not a qlinear op", op.name())),
    };
    let prod = contraction::eval(&int_op, &ins(&[0, 3, 2, 5]), ctx)?
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| OpError::Invalid("integer product missing".into()))?;
    let shape = prod.shape().to_vec();
    let mut acc: Vec<i64> = prod.to_i64_vec().expect("i32 product");
    if let Some(b) = inputs.get(8).copied().flatten() {
        let bv = b
            .to_i64_vec()
            .filter(|v| Some(v.len()) == shape.get(1).copied())
            .ok_or_else(|| OpError::Invalid(format!("bias of shape {:?}", b.shape())))?;
        let inner: usize = shape[2..].iter().product();
        for (i, a) in acc.iter_mut().enumerate() {
            // The conv accumulates in i32 (wrapping as NumPy's astype does).
            *a = (*a as i32).wrapping_add(bv[(i / inner.max(1)) % bv.len()] as i32) as i64;
        }
    }
    let factor = scale_factor(arg(inputs, 1)?, arg(inputs, 4)?, arg(inputs, 6)?)?;
    let yzp = arg(inputs, 7)?;
    let zv = yzp.to_f64_vec();
    if zv.len() != 1 {
        return unsupported(format!("y_zero_point of shape {:?}", yzp.shape()));
    }
    let (lo, hi) = match yzp.dtype() {
        DType::I8 => (-128.0, 127.0),
        _ => (0.0, 255.0),
    };
    // The scale factor broadcasts as NumPy does: against the last dim for MatMul, per
    // output channel for Conv.
    let n = acc.len();
    let index = |i: usize| -> Result<usize, OpError> {
        if factor.len() == 1 {
            return Ok(0);
        }
        match per_channel_axis {
            Some(ax) => {
                let inner: usize = shape[ax + 1..].iter().product();
                Ok((i / inner.max(1)) % shape[ax])
            }
            None => Ok(i % shape.last().copied().unwrap_or(1)),
        }
    };
    if factor.len() != 1 {
        let want = match per_channel_axis {
            Some(ax) => shape[ax],
            None => shape.last().copied().unwrap_or(1),
        };
        if factor.len() != want {
            return invalid(format!(
                "{} scales for a result of shape {shape:?}",
                factor.len()
            ));
        }
    }
    let mut out = Vec::with_capacity(n);
    for (i, &a) in acc.iter().enumerate() {
        let v = a as f64 * factor[index(i)?] + zv[0];
        out.push(v.round_ties_even().clamp(lo, hi));
    }
    Ok(vec![Some(from_f64s(yzp.dtype(), &shape, out))])
}

/// `a_scale * b_scale / y_scale` elementwise, each step rounded to the scales' dtype.
fn scale_factor(a: &Tensor, b: &Tensor, y: &Tensor) -> Result<Vec<f64>, OpError> {
    let dt = a.dtype();
    let round = |v: f64| -> f64 {
        match dt {
            DType::F16 => f16::from_f64(v).to_f64(),
            DType::F64 => v,
            _ => v as f32 as f64,
        }
    };
    let (av, bv, yv) = (a.to_f64_vec(), b.to_f64_vec(), y.to_f64_vec());
    if !a.dtype().is_float() || yv.len() != 1 {
        return unsupported(format!(
            "scales of dtype {} and shapes {:?}, {:?}, {:?}",
            a.dtype(),
            a.shape(),
            b.shape(),
            y.shape()
        ));
    }
    let n = av.len().max(bv.len());
    if (av.len() != 1 && av.len() != n) || (bv.len() != 1 && bv.len() != n) {
        return invalid(format!(
            "scales of shapes {:?} and {:?} do not broadcast",
            a.shape(),
            b.shape()
        ));
    }
    Ok((0..n)
        .map(|i| {
            let s = round(av[i % av.len()] * bv[i % bv.len()]);
            round(s / yv[0])
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use crate::ops::contraction::tests::run_op;
    use crate::Tensor;
    use ndarray::{ArrayD, IxDyn};
    use rafter_ir::{AutoPad, DType, Op};

    fn u8s(dims: &[usize], v: Vec<u8>) -> Tensor {
        Tensor::U8(ArrayD::from_shape_vec(IxDyn(dims), v).unwrap())
    }

    #[test]
    fn qlinear_matmul_requantizes() {
        // a = [[10, 12]] - 10 = [[0, 2]], b = [[3], [5]] - 1 = [[2], [4]]: product 8;
        // times 0.5 * 0.25 / 0.5 = 0.25 gives 2, plus zero point 100 = 102.
        let a = u8s(&[1, 2], vec![10, 12]);
        let b = u8s(&[2, 1], vec![3, 5]);
        let s = |v: f32| Tensor::f32s(&[], vec![v]);
        let (az, bz, yz) = (u8s(&[], vec![10]), u8s(&[], vec![1]), u8s(&[], vec![100]));
        let (a_s, b_s, y_s) = (s(0.5), s(0.25), s(0.5));
        let ins = [a, a_s, az, b, b_s, bz, y_s, yz];
        let ins: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
        let y = run_op(Op::QLinearMatMul, &ins, &[DType::U8])
            .remove(0)
            .unwrap();
        assert_eq!(y, u8s(&[1, 1], vec![102]));
    }

    #[test]
    fn qlinear_conv_adds_bias_and_saturates() {
        // x = [1, 2, 3, 4] (zero point 0), w = one 2x2 kernel of 1s (zero point 0), bias
        // 10: 20; scale 1 * 1 / 0.1 = 10 gives 200, plus zero point 100 saturates at 255.
        let x = u8s(&[1, 1, 2, 2], vec![1, 2, 3, 4]);
        let w = u8s(&[1, 1, 2, 2], vec![1, 1, 1, 1]);
        let s = |v: f32| Tensor::f32s(&[], vec![v]);
        let z = |v: u8| u8s(&[], vec![v]);
        let b = Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[1]), vec![10]).unwrap());
        let op = Op::QLinearConv {
            kernel_shape: vec![],
            strides: vec![],
            pads: vec![],
            dilations: vec![],
            group: 1,
            auto_pad: AutoPad::NotSet,
        };
        let ins = [x, s(1.0), z(0), w, s(1.0), z(0), s(0.1), z(100), b];
        let ins: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
        let y = run_op(op.clone(), &ins, &[DType::U8]).remove(0).unwrap();
        assert_eq!(y, u8s(&[1, 1, 1, 1], vec![255]));
        // Zero point 0 and y scale 1: 20.
        let mut ins = ins;
        let (one, zero) = (s(1.0), z(0));
        ins[6] = Some(&one);
        ins[7] = Some(&zero);
        let y = run_op(op, &ins, &[DType::U8]).remove(0).unwrap();
        assert_eq!(y, u8s(&[1, 1, 1, 1], vec![20]));
    }
}
