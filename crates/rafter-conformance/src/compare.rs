//! Output comparison with ONNX's tolerance rule.

use rafter_reference::Tensor;

/// Relative and absolute tolerance, as in `numpy.testing.assert_allclose`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Default for Tolerance {
    /// ONNX's default for node and model tests.
    fn default() -> Tolerance {
        Tolerance {
            rtol: 1e-3,
            atol: 1e-7,
        }
    }
}

/// The least relative tolerance of a bf16 output: PyTorch's `torch.testing.assert_close`
/// default for bf16 (1.6e-2, two units in bf16's last place of 7 fraction bits). ONNX's
/// expected bf16 outputs round every op's result to bf16; the CPU target computes bf16
/// models in f32 and rounds once where a value leaves the chain (as ONNX Runtime's CPU
/// provider does), which is more accurate and lands up to two ulps from the per-op
/// rounding (ONNX's attention tests), beyond ONNX's 1e-3 (within which f16's 2^-10 ulp
/// fits).
pub const BF16_RTOL: f64 = 1.6e-2;

/// Compares one output. Integers and bools must match exactly; floats within `tol` (bf16
/// within at least [`BF16_RTOL`]), NaN where NaN is expected, and infinities exactly. The
/// error says where the first mismatch is and how many elements differ.
pub fn compare(actual: &Tensor, expected: &Tensor, tol: Tolerance) -> Result<(), String> {
    let tol = if expected.dtype() == rafter_ir::DType::BF16 {
        Tolerance {
            rtol: tol.rtol.max(BF16_RTOL),
            ..tol
        }
    } else {
        tol
    };
    if actual.dtype() != expected.dtype() {
        return Err(format!(
            "dtype {} but expected {}",
            actual.dtype(),
            expected.dtype()
        ));
    }
    if actual.shape() != expected.shape() {
        return Err(format!(
            "shape {:?} but expected {:?}",
            actual.shape(),
            expected.shape()
        ));
    }
    let exact = !actual.dtype().is_float();
    if exact && actual != expected {
        let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
        let bad: Vec<usize> = (0..a.len()).filter(|&i| a[i] != e[i]).collect();
        return Err(format!(
            "{} of {} elements differ; first at flat index {}: {} vs expected {}",
            bad.len(),
            a.len(),
            bad[0],
            a[bad[0]],
            e[bad[0]]
        ));
    }
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let mut bad = 0;
    let mut first = None;
    let mut worst: f64 = 0.0;
    for i in 0..a.len() {
        let ok = if e[i].is_nan() {
            a[i].is_nan()
        } else if e[i].is_infinite() {
            a[i] == e[i]
        } else {
            (a[i] - e[i]).abs() <= tol.atol + tol.rtol * e[i].abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert(i);
            worst = worst.max((a[i] - e[i]).abs());
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(format!(
            "{bad} of {} elements differ beyond rtol {} atol {}; first at flat index {i}: {} vs expected {}; max abs diff {worst:e}",
            a.len(),
            tol.rtol,
            tol.atol,
            a[i],
            e[i]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_outputs_are_compared_within_two_of_their_ulps() {
        // bf16 bit patterns: 0x3ef8 is 0.484375; a step is one ulp (2^-9) there.
        let t = |bits: u16| {
            Tensor::from_le_bytes(rafter_ir::DType::BF16, &[1], &bits.to_le_bytes()).unwrap()
        };
        // Two ulps off passes, four (beyond 1.6e-2 of the value) do not.
        compare(&t(0x3ef6), &t(0x3ef8), Tolerance::default()).unwrap();
        assert!(compare(&t(0x3ef4), &t(0x3ef8), Tolerance::default()).is_err());
    }

    #[test]
    fn float_tolerance() {
        let e = Tensor::f32s(&[3], vec![1.0, 100.0, f32::NAN]);
        let a = Tensor::f32s(&[3], vec![1.0005, 100.09, f32::NAN]);
        compare(&a, &e, Tolerance::default()).unwrap();
        let a = Tensor::f32s(&[3], vec![1.002, 100.0, f32::NAN]);
        let err = compare(&a, &e, Tolerance::default()).unwrap_err();
        assert!(err.starts_with("1 of 3 elements differ"), "{err}");
        let a = Tensor::f32s(&[3], vec![1.0, 100.0, 0.0]);
        assert!(compare(&a, &e, Tolerance::default()).is_err());
    }

    #[test]
    fn exact_for_ints_and_shape_checked() {
        let e = Tensor::i64s(&[2], vec![1, 2]);
        assert!(compare(&Tensor::i64s(&[2], vec![1, 3]), &e, Tolerance::default()).is_err());
        assert!(
            compare(&Tensor::i64s(&[1, 2], vec![1, 2]), &e, Tolerance::default())
                .unwrap_err()
                .contains("shape")
        );
        assert!(compare(
            &Tensor::f32s(&[2], vec![1.0, 2.0]),
            &e,
            Tolerance::default()
        )
        .unwrap_err()
        .contains("dtype"));
    }
}
