//! Transformer activations as in-place f32 slice functions, vectorised and split over
//! [`Parallel`]: erf-GELU (BERT's `x/√2, erf, +1, *x, *0.5` body in one pass), tanh-GELU
//! (GPT-2), SiLU (LLaMA's gate) and sigmoid.
//!
//! Accuracy comes from `simd`'s functions: `erf` within 3.7e-7 absolute (so
//! erf-GELU within `0.5 |x| 3.7e-7` plus a few ulp of the result), `tanh`, `exp` and
//! sigmoid within a few ulp. Tests hold every ISA to f64 references of the same formulas
//! and to the reference executor's results.

use crate::common::{check_isa, par_blocks, Disjoint, KernelError};
use crate::simd::{erf, sigmoid, tanh, Simd};
use crate::{Isa, Parallel};

/// An elementwise activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryFn {
    /// `0.5 x (1 + erf(x / √2))`: ONNX Gelu (approximate = "none"), BERT.
    GeluErf,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`: ONNX Gelu (approximate = "tanh").
    GeluTanh,
    /// `x sigmoid(x)` (Swish with β = 1).
    Silu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
}

/// Applies `f` to every element of `x`, in place, on the fastest ISA.
pub fn activation_in_place(
    f: UnaryFn,
    x: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    activation_in_place_with_isa(Isa::detect(), f, x, par)
}

/// [`activation_in_place`] on a given ISA.
pub fn activation_in_place_with_isa(
    isa: Isa,
    f: UnaryFn,
    x: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    // Blocks of 1024 elements as the parallel unit (a multiple of every vector width).
    const BLOCK: usize = 1024;
    let n = x.len();
    let out = Disjoint::new(x);
    par_blocks(par, n.div_ceil(BLOCK), BLOCK, &|bs| {
        let r = bs.start * BLOCK..(bs.end * BLOCK).min(n);
        // SAFETY: `par_blocks` hands out disjoint block ranges.
        map_isa(isa, f, unsafe { out.part(r) });
    });
    Ok(())
}

/// `x = 0.5 x (1 + erf(x / √2))`, in place.
pub fn gelu_erf(x: &mut [f32], par: &dyn Parallel) -> Result<(), KernelError> {
    activation_in_place(UnaryFn::GeluErf, x, par)
}

/// `x = 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, in place.
pub fn gelu_tanh(x: &mut [f32], par: &dyn Parallel) -> Result<(), KernelError> {
    activation_in_place(UnaryFn::GeluTanh, x, par)
}

/// `x = x sigmoid(x)`, in place.
pub fn silu(x: &mut [f32], par: &dyn Parallel) -> Result<(), KernelError> {
    activation_in_place(UnaryFn::Silu, x, par)
}

/// `x = 1 / (1 + e^-x)`, in place.
pub fn sigmoid_in_place(x: &mut [f32], par: &dyn Parallel) -> Result<(), KernelError> {
    activation_in_place(UnaryFn::Sigmoid, x, par)
}

simd_dispatch!(fn map_isa(f: UnaryFn, x: &mut [f32]) => map_generic);

#[inline(always)]
fn map_generic<S: Simd>(s: S, f: UnaryFn, x: &mut [f32]) {
    match f {
        UnaryFn::GeluErf => map_in_place!(s, x, |v| gelu_erf_v(s, v)),
        UnaryFn::GeluTanh => map_in_place!(s, x, |v| gelu_tanh_v(s, v)),
        UnaryFn::Silu => map_in_place!(s, x, |v| s.mul(v, sigmoid(s, v))),
        UnaryFn::Sigmoid => map_in_place!(s, x, |v| sigmoid(s, v)),
    }
}

#[inline(always)]
pub(crate) fn gelu_erf_v<S: Simd>(s: S, x: S::V) -> S::V {
    let e = erf(s, s.mul(x, s.splat(std::f32::consts::FRAC_1_SQRT_2)));
    s.mul(s.mul(x, s.splat(0.5)), s.add(e, s.splat(1.0)))
}

#[inline(always)]
pub(crate) fn gelu_tanh_v<S: Simd>(s: S, x: S::V) -> S::V {
    // √(2/π) = 0.7978845608
    let u = s.mul(
        s.mul(x, s.splat(0.797_884_6)),
        s.fma(s.mul(x, x), s.splat(0.044_715), s.splat(1.0)),
    );
    s.mul(s.mul(x, s.splat(0.5)), s.add(tanh(s, u), s.splat(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::{erf64, isas};
    use crate::{ScopedThreads, Sequential};

    fn want(f: UnaryFn, x: f32) -> f64 {
        let x = x as f64;
        match f {
            UnaryFn::GeluErf => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
            UnaryFn::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryFn::Silu => x / (1.0 + (-x).exp()),
            UnaryFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        }
    }

    #[test]
    fn activations_match_f64_on_odd_lengths() {
        let fs = [
            UnaryFn::GeluErf,
            UnaryFn::GeluTanh,
            UnaryFn::Silu,
            UnaryFn::Sigmoid,
        ];
        for isa in isas() {
            for f in fs {
                for n in [0, 1, 7, 15, 16, 17, 1023, 1025, 40_000] {
                    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
                    let mut y = x.clone();
                    activation_in_place_with_isa(isa, f, &mut y, &ScopedThreads::new(2)).unwrap();
                    for (&x, &y) in x.iter().zip(&y) {
                        let w = want(f, x);
                        // erf's 3.7e-7 absolute error, scaled by 0.5|x| in GELU; tanh's
                        // ulp near -1 in `1 + tanh` (as the reference's f32 has); 4 ulp else.
                        let tol = match f {
                            UnaryFn::GeluErf => 0.5 * x.abs() as f64 * 4e-7 + 5e-7 * w.abs(),
                            UnaryFn::GeluTanh => 0.5 * x.abs() as f64 * 1.2e-7 + 5e-7 * w.abs(),
                            _ => 5e-7 * w.abs() + 1e-38,
                        };
                        assert!((y as f64 - w).abs() <= tol, "{isa:?} {f:?} {x}: {y} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn special_values() {
        for isa in isas() {
            let mut x = vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -100.0];
            activation_in_place_with_isa(isa, UnaryFn::GeluErf, &mut x, &Sequential).unwrap();
            assert_eq!(x[0], f32::INFINITY);
            assert!(x[1].is_nan() || x[1] == 0.0); // -inf * 0: NaN, as the reference
            assert!(x[2].is_nan());
            assert_eq!(x[3], 0.0);
            assert_eq!(x[4], 0.0);
            let mut x = vec![f32::INFINITY, f32::NEG_INFINITY, -100.0];
            activation_in_place_with_isa(isa, UnaryFn::Sigmoid, &mut x, &Sequential).unwrap();
            assert_eq!(&x[..2], &[1.0, 0.0]);
            assert!(x[2] >= 0.0 && x[2] < 1e-38); // e^-100 flushed to 0
        }
    }
}
