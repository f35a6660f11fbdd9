//! Reference kernel: BitCast (onnx/reference/ops/op_bitcast.py, NumPy's `view`).

use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use rafter_ir::Op;

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = ctx;
    let Op::BitCast { to } = op else {
        return unsupported(format!("`{}` is not bit_cast", op.name()));
    };
    let x = arg(inputs, 0)?;
    if x.dtype().size_of() != to.size_of() {
        return invalid(format!(
            "bit_cast from {} to {to}: element sizes differ",
            x.dtype()
        ));
    }
    let y = Tensor::from_le_bytes(*to, x.shape(), &x.to_le_bytes())
        .map_err(|e| OpError::Invalid(e.to_string()))?;
    Ok(vec![Some(y)])
}

#[cfg(test)]
mod tests {
    use crate::ops::contraction::tests::run_op;
    use crate::Tensor;
    use ndarray::{ArrayD, IxDyn};
    use rafter_ir::{DType, Op};

    #[test]
    fn bit_cast_reinterprets_bytes() {
        // 1.0f32 is 0x3f800000; -2.0 is 0xc0000000.
        let x = Tensor::f32s(&[2], vec![1.0, -2.0]);
        let y = run_op(Op::BitCast { to: DType::I32 }, &[Some(&x)], &[DType::I32])
            .remove(0)
            .unwrap();
        let want = vec![0x3f80_0000i32, 0xc000_0000u32 as i32];
        assert_eq!(
            y,
            Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[2]), want).unwrap())
        );
        let u = Tensor::I8(ArrayD::from_shape_vec(IxDyn(&[]), vec![-1i8]).unwrap());
        let y = run_op(Op::BitCast { to: DType::U8 }, &[Some(&u)], &[DType::U8])
            .remove(0)
            .unwrap();
        assert_eq!(
            y,
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[]), vec![255u8]).unwrap())
        );
    }
}
