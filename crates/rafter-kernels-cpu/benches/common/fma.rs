//! What the GEMM benches measure their ceiling with: independent FMA chains, twelve per
//! thread (enough to cover the FMA latency on every x86 core rafter targets), so the result
//! is the FMA units' throughput at this moment, on this machine, under its current load.
//! Shared by `benches/gemm.rs` and `benches/bert_gemm.rs` (`#[path]` modules).

#![allow(dead_code)]

use std::arch::x86_64::*;

/// `iters` rounds of 12 independent 8-lane FMAs (AVX2+FMA); returns a value that depends
/// on all of them, so the loop is not optimised away.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn fma_loop_avx2(iters: usize) -> f32 {
    let mut acc = [_mm256_set1_ps(0.0); 12];
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(a, b, *x);
        }
    }
    let mut s = _mm256_setzero_ps();
    for x in acc {
        s = _mm256_add_ps(s, x);
    }
    _mm256_cvtss_f32(s)
}

/// [`fma_loop_avx2`] with 16-lane AVX-512 FMAs.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn fma_loop_avx512(iters: usize) -> f32 {
    let mut acc = [_mm512_set1_ps(0.0); 12];
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(a, b, *x);
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)),
    )
}
