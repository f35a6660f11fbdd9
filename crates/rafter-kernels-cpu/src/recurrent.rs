//! Building blocks of recurrent cells (LSTM, GRU, RNN), vectorised: the per-step product
//! of the hidden state with the transposed recurrent weights ([`gemv_accumulate`]) and the
//! gate activations ([`gate_activation`]).
//!
//! A recurrent layer's time steps are sequential, and each one is small (a few batch rows
//! times `hidden` by `gates * hidden`): a general GEMM spends more on packing and task
//! set-up than on the arithmetic. The step's product is therefore a GEMV in axpy form over
//! weights transposed once at load (`R^T`, row-major `[hidden, gates * hidden]`): the
//! output row stays in registers while the weight rows stream through, unit-stride.

use crate::common::{check_isa, check_len, KernelError};
use crate::simd::{lanes, sigmoid, tanh, Simd};
use crate::Isa;

/// A gate activation computed by [`gate_activation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFn {
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
}

/// `x = f(x)` in place, on the fastest ISA (a few ulp of the exact function, see `simd`).
pub fn gate_activation(f: GateFn, x: &mut [f32]) {
    gate_isa(Isa::detect(), f, x);
}

/// [`gate_activation`] on a given ISA.
pub fn gate_activation_with_isa(isa: Isa, f: GateFn, x: &mut [f32]) -> Result<(), KernelError> {
    check_isa(isa)?;
    gate_isa(isa, f, x);
    Ok(())
}

simd_dispatch!(fn gate_isa(f: GateFn, x: &mut [f32]) => gate_generic);

#[inline(always)]
fn gate_generic<S: Simd>(s: S, f: GateFn, x: &mut [f32]) {
    match f {
        GateFn::Sigmoid => map_in_place!(s, x, |v| sigmoid(s, v)),
        GateFn::Tanh => map_in_place!(s, x, |v| tanh(s, v)),
    }
}

/// `out[j] += sum_k x[k] * wt[k * n + j]` with `n = out.len()`: a row vector times a
/// row-major `[x.len(), n]` matrix, accumulated into `out`, on the fastest ISA.
pub fn gemv_accumulate(x: &[f32], wt: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    gemv_accumulate_with_isa(Isa::detect(), x, wt, out)
}

/// [`gemv_accumulate`] on a given ISA.
pub fn gemv_accumulate_with_isa(
    isa: Isa,
    x: &[f32],
    wt: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_isa(isa)?;
    check_len("gemv weights", wt.len(), x.len() * out.len())?;
    gemv_isa(isa, x, wt, out);
    Ok(())
}

simd_dispatch!(fn gemv_isa(x: &[f32], wt: &[f32], out: &mut [f32]) => gemv_generic);

/// Column blocks of four vectors keep four accumulators in registers over the whole `k`
/// loop; the last partial vectors go one at a time, masked.
#[inline(always)]
fn gemv_generic<S: Simd>(s: S, x: &[f32], wt: &[f32], out: &mut [f32]) {
    let l = lanes(s);
    let n = out.len();
    let mut j = 0;
    while j + 4 * l <= n {
        let mut acc = [
            s.load(&out[j..]),
            s.load(&out[j + l..]),
            s.load(&out[j + 2 * l..]),
            s.load(&out[j + 3 * l..]),
        ];
        for (k, &xk) in x.iter().enumerate() {
            let row = &wt[k * n + j..k * n + j + 4 * l];
            let xv = s.splat(xk);
            for (q, a) in acc.iter_mut().enumerate() {
                *a = s.fma(xv, s.load(&row[q * l..]), *a);
            }
        }
        for (q, a) in acc.iter().enumerate() {
            s.store(&mut out[j + q * l..], *a);
        }
        j += 4 * l;
    }
    while j < n {
        let w = l.min(n - j);
        let full = w == l;
        let load = |v: &[f32]| {
            if full {
                s.load(v)
            } else {
                s.load_partial(&v[..w], 0.0)
            }
        };
        let mut acc = load(&out[j..]);
        for (k, &xk) in x.iter().enumerate() {
            acc = s.fma(s.splat(xk), load(&wt[k * n + j..]), acc);
        }
        if full {
            s.store(&mut out[j..], acc);
        } else {
            s.store_partial(&mut out[j..j + w], acc);
        }
        j += w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;

    #[test]
    fn gemv_matches_f64_on_odd_sizes_for_every_isa() {
        for isa in isas() {
            for (k, n) in [(1, 1), (3, 5), (7, 17), (64, 256), (13, 97), (5, 131)] {
                let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect();
                let wt: Vec<f32> = (0..k * n)
                    .map(|i| ((i * 13 % 23) as f32 - 11.0) * 0.05)
                    .collect();
                let init: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
                let mut out = init.clone();
                gemv_accumulate_with_isa(isa, &x, &wt, &mut out).unwrap();
                for j in 0..n {
                    let want: f64 = init[j] as f64
                        + (0..k)
                            .map(|i| x[i] as f64 * wt[i * n + j] as f64)
                            .sum::<f64>();
                    assert!(
                        (out[j] as f64 - want).abs() < 1e-5,
                        "{isa:?} k={k} n={n} j={j}: {} vs {want}",
                        out[j]
                    );
                }
            }
        }
    }

    #[test]
    fn gemv_checks_lengths() {
        let e = gemv_accumulate(&[1.0; 3], &[0.0; 7], &mut [0.0; 2]).unwrap_err();
        assert!(e.to_string().contains("gemv weights"), "{e}");
    }

    #[test]
    fn gates_match_f64_for_every_isa() {
        for isa in isas() {
            let xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
            for f in [GateFn::Sigmoid, GateFn::Tanh] {
                let mut y = xs.clone();
                gate_activation_with_isa(isa, f, &mut y).unwrap();
                for (x, y) in xs.iter().zip(&y) {
                    let x = *x as f64;
                    let want = match f {
                        GateFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                        GateFn::Tanh => x.tanh(),
                    };
                    assert!((*y as f64 - want).abs() < 1e-6, "{isa:?} {f:?}({x}) = {y}");
                }
            }
        }
    }
}
