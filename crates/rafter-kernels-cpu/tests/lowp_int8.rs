//! The int8-weight GEMM on every kernel available here (the scalar one always), against
//! independent references: the packing against a quantization written out here
//! (`round_ties_even`, the documented panel layout); the kernels' i32 accumulators against
//! an i64 triple loop over the quantized operands (exact equality); integer-valued operands
//! whose quantization is exact end to end (exact equality); and random operands against an
//! f64 GEMM over the original f32 operands, within the worst-case quantization bound
//! derived in `gemm_i8`'s docs. Plus the byte format's validation.

use rafter_kernels_cpu::{
    gemm_i8, gemm_i8_accumulate_with_isa, gemm_i8_with_isa, Activation, Epilogue, GemmError,
    I8PackError, Isa, MatMut, MatRef, PackedI8B, PackedI8BRef, Parallel, Residual, ScopedThreads,
    Sequential, I8_MAX_K, PACKED_I8_B_HEADER_BYTES,
};

mod common;
use common::{gelu64, isas, Rng};

/// Reference quantization of a `k x n` B: `(q` row-major, scales`)`.
fn ref_quant_b(b: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; k * n];
    let mut scales = vec![0.0f32; n];
    for j in 0..n {
        let max = (0..k).map(|p| b[p * n + j].abs()).fold(0.0f32, f32::max);
        let s = max / 127.0;
        scales[j] = s;
        if s == 0.0 {
            continue;
        }
        for p in 0..k {
            q[p * n + j] = (b[p * n + j] / s).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
    }
    (q, scales)
}

/// Reference quantization of one row of A: `(qa, sa)`.
fn ref_quant_row(a: &[f32]) -> (Vec<u8>, f32) {
    let max = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let s = max / 127.0;
    if s == 0.0 {
        return (vec![128; a.len()], 0.0);
    }
    let q = a
        .iter()
        .map(|x| ((x / s).round_ties_even().clamp(-127.0, 127.0) as i32 + 128) as u8)
        .collect();
    (q, s)
}

/// Weight `(p, j)` in the documented panel layout `[ceil(N/16)][ceil(K/4)][16][4]`.
fn panel_q(panels: &[i8], k: usize, p: usize, j: usize) -> i8 {
    let kg = k.div_ceil(4);
    panels[(j / 16) * kg * 64 + (p / 4) * 64 + (j % 16) * 4 + p % 4]
}

#[test]
fn packing_quantizes_per_column_as_specified() {
    let mut rng = Rng(0x5eed);
    let (k, n) = (7, 37);
    let mut b = rng.vec(k * n);
    for p in 0..k {
        b[p * n + 3] = 0.0; // a zero column: scale 0, no division
        b[p * n + 4] = [127.0, 2.5, 3.5, -2.5, -127.0, 0.5, 1.5][p]; // scale 1, ties to even
        b[p * n + 5] = if p % 2 == 0 { -1e-3 } else { 1e-3 }; // +-127 extremes
        b[p * n + 6] = if p == 6 { 1e-44 } else { 0.0 }; // subnormal: scale underflows to 0
    }
    let packed = PackedI8B::pack(k, n, &b, n).unwrap();
    assert_eq!((packed.k(), packed.n()), (k, n));
    let (q, scales) = ref_quant_b(&b, k, n);
    assert_eq!(packed.scales().len(), n);
    for (j, (got, want)) in packed.scales().iter().zip(&scales).enumerate() {
        assert_eq!(got.to_bits(), want.to_bits(), "scale {j}");
    }
    let panels = packed.panels();
    assert_eq!(panels.len(), 3 * 2 * 64);
    for j in 0..48 {
        let mut sum = 0i32;
        for p in 0..8 {
            let got = panel_q(panels, k, p, j);
            if j >= n || p >= k {
                assert_eq!(got, 0, "padding ({p}, {j})");
                continue;
            }
            assert_eq!(got, q[p * n + j], "q({p}, {j}) of {}", b[p * n + j]);
            sum += got as i32;
        }
        if j < n {
            assert_eq!(packed.col_sums()[j], sum, "column sum {j}");
        }
    }
    let col = |j: usize| (0..k).map(|p| panel_q(panels, k, p, j)).collect::<Vec<_>>();
    assert_eq!(col(3), [0; 7]);
    assert_eq!(packed.scales()[3], 0.0);
    assert_eq!(col(4), [127, 2, 4, -2, -127, 0, 2]);
    assert_eq!(col(5), [-127, 127, -127, 127, -127, 127, -127]);
    assert_eq!((col(6), packed.scales()[6]), (vec![0; 7], 0.0));
    // A transposed view packs the same as the materialised matrix.
    let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    let packed_t = PackedI8B::pack_mat(MatRef::row_major(&bt, n, k, k).unwrap().t()).unwrap();
    assert_eq!(packed_t.as_bytes(), packed.as_bytes());
}

#[test]
fn packing_rejects_what_it_cannot_quantize() {
    let mut b = vec![0.5f32; 4 * 5];
    b[2 * 5 + 3] = f32::NAN;
    let e = PackedI8B::pack(4, 5, &b, 5).unwrap_err();
    assert_eq!(e, I8PackError::NonFinite { row: 2, col: 3 });
    assert!(e.to_string().contains("B[2][3] is not finite"), "{e}");
    b[2 * 5 + 3] = f32::NEG_INFINITY;
    assert!(PackedI8B::pack(4, 5, &b, 5).is_err());
    let e = PackedI8B::pack(4, 5, &b[..19], 5).unwrap_err();
    assert!(
        matches!(e, I8PackError::Matrix(GemmError::TooShort { .. })),
        "{e}"
    );
    let deep = vec![0.0f32; I8_MAX_K + 1];
    let e = PackedI8B::pack(I8_MAX_K + 1, 1, &deep, 1).unwrap_err();
    assert!(e.to_string().contains("deeper than 65536"), "{e}");
}

/// An i64 triple loop over quantized operands.
fn ref_acc(qa: &[u8], q: &[i8], m: usize, k: usize, n: usize) -> Vec<i64> {
    let mut acc = vec![0i64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                acc[i * n + j] += qa[i * k + p] as i64 * q[p * n + j] as i64;
            }
        }
    }
    acc
}

fn check_acc(isa: Isa, qa: &[u8], b: &[f32], m: usize, k: usize, n: usize, par: &dyn Parallel) {
    let packed = PackedI8B::pack(k, n, b, n).unwrap();
    let (q, _) = ref_quant_b(b, k, n);
    let want = ref_acc(qa, &q, m, k, n);
    let mut acc = vec![i32::MIN; m * n];
    gemm_i8_accumulate_with_isa(isa, qa, m, packed.view(), &mut acc, par).unwrap();
    for (x, (&got, &want)) in acc.iter().zip(&want).enumerate() {
        assert_eq!(
            got as i64,
            want,
            "{isa:?} {m}x{k}x{n} threads={}: acc[{}][{}]",
            par.threads(),
            x / n,
            x % n
        );
    }
}

#[test]
fn accumulators_equal_an_exact_integer_reference_on_every_isa() {
    let mut rng = Rng(0xacc);
    let three = ScopedThreads::new(3);
    let pars: [&dyn Parallel; 2] = [&Sequential, &three];
    // K below, at and past a multiple of 4 and of the prefetch distance; N not a multiple
    // of 16, below and above every tile width; the last shapes are large enough to be
    // split over threads (by columns, and by rows too for 40 x 70).
    let kn = [
        (1, 1),
        (3, 17),
        (4, 16),
        (7, 33),
        (64, 80),
        (129, 65),
        (259, 130),
        (600, 70),
        (259, 300),
    ];
    for isa in isas() {
        for m in [1, 2, 3, 5, 8, 9, 13, 40] {
            for &(k, n) in &kn {
                let mut qa: Vec<u8> = (0..m * k).map(|_| rng.next() as u8).collect();
                // Extremes: a row of 255s and a row of 0s.
                qa[..k].fill(255);
                if m > 2 {
                    qa[k..2 * k].fill(0);
                }
                let mut b = rng.vec(k * n);
                for p in 0..k {
                    b[p * n] = 1.0; // all 127
                    if n > 1 {
                        b[p * n + 1] = -1.0; // all -127
                    }
                }
                for &par in &pars {
                    check_acc(isa, &qa, &b, m, k, n, par);
                }
            }
        }
    }
}

#[test]
fn accumulators_do_not_overflow_at_the_deepest_k() {
    // 255 * 127 * 65536 = 2_122_383_360 < 2^31: the largest magnitude an accumulator holds.
    let (m, k, n) = (2, I8_MAX_K, 18);
    let mut b = vec![0.0f32; k * n];
    for p in 0..k {
        for j in 0..n {
            b[p * n + j] = if j % 2 == 0 { 3.0 } else { -3.0 };
        }
    }
    let mut qa = vec![255u8; m * k];
    qa[k..].fill(1);
    for isa in isas() {
        check_acc(isa, &qa, &b, m, k, n, &ScopedThreads::new(3));
    }
    let packed = PackedI8B::pack(k, n, &b, n).unwrap();
    let mut acc = vec![0i32; m * n];
    gemm_i8_accumulate_with_isa(Isa::Scalar, &qa, m, packed.view(), &mut acc, &Sequential).unwrap();
    assert_eq!(acc[0], 2_122_383_360);
    assert_eq!(acc[1], -2_122_383_360);
}

#[test]
fn integer_valued_operands_give_exact_results_on_every_isa() {
    // Rows of A and columns of B that hold +-127 have scale exactly 1, so quantization is
    // the identity and C is the exact integer product (|C| < 2^24, exact in f32).
    let mut rng = Rng(0x1e7);
    let int = |rng: &mut Rng| (rng.next() % 255) as f32 - 127.0;
    for isa in isas() {
        for &(m, k, n) in &[(1, 5, 17), (3, 7, 33), (13, 130, 70), (40, 259, 45)] {
            let mut a: Vec<f32> = (0..m * k).map(|_| int(&mut rng)).collect();
            let mut b: Vec<f32> = (0..k * n).map(|_| int(&mut rng)).collect();
            for i in 0..m {
                a[i * k + i % k] = if i % 2 == 0 { 127.0 } else { -127.0 };
            }
            if m > 2 {
                a[2 * k..3 * k].fill(0.0); // a zero row: C's row is exactly 0 (plus bias)
            }
            for p in 0..k {
                b[p * n + 2] = 0.0; // a zero column
            }
            for j in 0..n {
                b[(j % k) * n + j] = if j % 3 == 0 { -127.0 } else { 127.0 };
            }
            b[(2 % k) * n + 2] = 0.0;
            let bias: Vec<f32> = (0..n).map(|j| j as f32 - 8.0).collect();
            let packed = PackedI8B::pack(k, n, &b, n).unwrap();
            let mut c = vec![f32::NAN; m * n];
            gemm_i8_with_isa(
                isa,
                MatRef::row_major(&a, m, k, k).unwrap(),
                packed.view(),
                MatMut::row_major(&mut c, m, n, n).unwrap(),
                &Epilogue {
                    bias: Some(&bias),
                    ..Epilogue::none()
                },
                &ScopedThreads::new(3),
            )
            .unwrap();
            for i in 0..m {
                for j in 0..n {
                    let dot: i64 = (0..k)
                        .map(|p| a[i * k + p] as i64 * b[p * n + j] as i64)
                        .sum();
                    assert_eq!(
                        c[i * n + j],
                        dot as f32 + bias[j],
                        "{isa:?} {m}x{k}x{n} C[{i}][{j}]"
                    );
                }
            }
        }
    }
}

#[test]
fn dequantized_results_match_the_reference_quantization_bit_for_bit() {
    // The whole path, activation quantization included, against the reference: the
    // documented formula `(sa sb) * (sum_k (qa - 128) q)` evaluated in f32 in that order.
    let mut rng = Rng(0xb17);
    for isa in isas() {
        for &(m, k, n) in &[(1, 5, 17), (3, 130, 33), (13, 67, 70), (40, 259, 45)] {
            let mut a = rng.vec(m * k);
            // A row whose scale is 1, with ties: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2.
            if m > 1 && k >= 4 {
                a[k..2 * k].fill(0.0);
                a[k..k + 4].copy_from_slice(&[127.0, 2.5, 3.5, -2.5]);
            }
            if m > 2 {
                a[2 * k..3 * k].fill(0.0);
            }
            let b = rng.vec(k * n);
            let packed = PackedI8B::pack(k, n, &b, n).unwrap();
            let (q, sb) = ref_quant_b(&b, k, n);
            let mut c = vec![f32::NAN; m * n];
            gemm_i8_with_isa(
                isa,
                MatRef::row_major(&a, m, k, k).unwrap(),
                packed.view(),
                MatMut::row_major(&mut c, m, n, n).unwrap(),
                &Epilogue::none(),
                &ScopedThreads::new(3),
            )
            .unwrap();
            for i in 0..m {
                let (qa, sa) = ref_quant_row(&a[i * k..(i + 1) * k]);
                if m > 1 && k >= 4 && i == 1 {
                    assert_eq!(&qa[..4], &[255, 130, 132, 126]);
                }
                for j in 0..n {
                    let dot: i64 = (0..k)
                        .map(|p| (qa[p] as i64 - 128) * q[p * n + j] as i64)
                        .sum();
                    let want = (sa * sb[j]) * dot as f32;
                    assert_eq!(
                        c[i * n + j].to_bits(),
                        want.to_bits(),
                        "{isa:?} {m}x{k}x{n} C[{i}][{j}] = {}, want {want}",
                        c[i * n + j]
                    );
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Epi {
    None,
    BiasGelu,
    /// Bias, ReLU on `x + residual`, clamp to [-0.5, 2].
    BiasResidualReluClamp,
    /// Row bias, residual added after the activation (none).
    RowBiasResidualAfter,
}

/// Checks `gemm_i8_with_isa` on one problem against an f64 GEMM over the original f32
/// operands, within the quantization bound. Returns C.
#[allow(clippy::too_many_arguments)]
fn check(
    isa: Isa,
    m: usize,
    k: usize,
    n: usize,
    epi: Epi,
    trans_a: bool,
    par: &dyn Parallel,
    rng: &mut Rng,
) -> Vec<f32> {
    let mut a = rng.vec(m * k);
    // Columns of B on different scales, some zero, some with negative extremes.
    let mut b: Vec<f32> = rng.vec(k * n);
    for p in 0..k {
        for j in 0..n {
            b[p * n + j] *= [4.0, 0.01, 1.0, 300.0][j % 4];
        }
        if n > 3 {
            b[p * n + 3] = 0.0;
        }
    }
    if n > 5 {
        b[(k / 2) * n + 5] = -5000.0; // one outlier: its column's scale is coarse
    }
    if m > 1 {
        a[k..2 * k].fill(0.0); // a zero row
    }
    if m > 2 {
        for p in 0..k {
            a[2 * k + p] = if p % 3 == 0 { -2.0 } else { 2.0 }; // +-max everywhere
        }
    }
    let bias = rng.vec(n);
    let row_bias = rng.vec(m);
    let ldc = n + 3;
    let res = rng.vec(m * ldc);
    let packed = PackedI8B::pack(k, n, &b, n).unwrap();
    let a_store: Vec<f32> = if trans_a {
        (0..k * m).map(|x| a[(x % m) * k + x / m]).collect()
    } else {
        a.clone()
    };
    let a_view = if trans_a {
        MatRef::row_major(&a_store, k, m, m).unwrap().t()
    } else {
        MatRef::row_major(&a_store, m, k, k).unwrap()
    };
    let mut c = vec![f32::NAN; m * ldc];
    let e = match epi {
        Epi::None => Epilogue::none(),
        Epi::BiasGelu => Epilogue {
            bias: Some(&bias),
            activation: Activation::GeluTanh,
            ..Epilogue::none()
        },
        Epi::BiasResidualReluClamp => Epilogue {
            bias: Some(&bias),
            activation: Activation::Relu,
            residual: Some(Residual::row_major(&res, ldc, true)),
            clamp: Some((-0.5, 2.0)),
            ..Epilogue::none()
        },
        Epi::RowBiasResidualAfter => Epilogue {
            row_bias: Some(&row_bias),
            residual: Some(Residual::row_major(&res, ldc, false)),
            ..Epilogue::none()
        },
    };
    gemm_i8_with_isa(
        isa,
        a_view,
        packed.view(),
        MatMut::row_major(&mut c, m, n, ldc).unwrap(),
        &e,
        par,
    )
    .unwrap();
    let eps = f32::EPSILON as f64;
    for i in 0..m {
        let sa = (0..k)
            .map(|p| a[i * k + p].abs() as f64)
            .fold(0.0, f64::max)
            / 127.0;
        for j in 0..n {
            let sb = (0..k)
                .map(|p| b[p * n + j].abs() as f64)
                .fold(0.0, f64::max)
                / 127.0;
            let (mut dot, mut mag, mut quant) = (0.0f64, 0.0f64, 0.75 * k as f64 * sa * sb);
            for p in 0..k {
                let (x, y) = (a[i * k + p] as f64, b[p * n + j] as f64);
                dot += x * y;
                mag += (x * y).abs();
                quant += (sb * x.abs() + sa * y.abs()) / 2.0;
            }
            let r = res[i * ldc + j] as f64;
            let (want, lipschitz) = match epi {
                Epi::None => (dot, 1.0),
                // GELU-tanh's slope lies in [-0.13, 1.13].
                Epi::BiasGelu => (gelu64(dot + bias[j] as f64), 1.13),
                Epi::BiasResidualReluClamp => {
                    ((dot + bias[j] as f64 + r).max(0.0).clamp(-0.5, 2.0), 1.0)
                }
                Epi::RowBiasResidualAfter => (dot + row_bias[i] as f64 + r, 1.0),
            };
            // The quantization bound (gemm_i8's docs), through the activation's slope, plus
            // f32 rounding of the dequantization and the epilogue (a few ulps of the
            // magnitudes involved).
            let tol = lipschitz * quant * (1.0 + 1e-6) + 16.0 * eps * (mag + quant + 3.0);
            let got = c[i * ldc + j] as f64;
            assert!(
                (got - want).abs() <= tol,
                "{isa:?} {m}x{k}x{n} {epi:?} trans_a={trans_a} threads={}: \
                 C[{i}][{j}] = {got}, want {want} (tol {tol:e})",
                par.threads()
            );
        }
        for j in n..ldc {
            assert!(c[i * ldc + j].is_nan(), "{isa:?} wrote C[{i}][{j}] past N");
        }
    }
    c
}

#[test]
fn int8_gemm_is_within_the_quantization_bound_of_the_f64_reference() {
    let mut rng = Rng(0xfeed_beef);
    let three = ScopedThreads::new(3);
    let pars: [&dyn Parallel; 2] = [&Sequential, &three];
    let kn = [
        (1, 1),
        (7, 17),
        (33, 50),
        (64, 80),
        (129, 33),
        (600, 70),
        (31, 300),
        (259, 300),
    ];
    for isa in isas() {
        for m in [1, 2, 3, 13, 40] {
            for &(k, n) in &kn {
                for &par in &pars {
                    check(isa, m, k, n, Epi::None, false, par, &mut rng);
                }
            }
        }
        for &(m, k, n) in &[(1, 77, 45), (3, 130, 33), (13, 65, 97), (40, 520, 40)] {
            for epi in [
                Epi::BiasGelu,
                Epi::BiasResidualReluClamp,
                Epi::RowBiasResidualAfter,
            ] {
                check(isa, m, k, n, epi, false, &three, &mut rng);
            }
            check(isa, m, k, n, Epi::None, true, &three, &mut rng);
            check(isa, m, k, n, Epi::BiasGelu, true, &Sequential, &mut rng);
        }
    }
}

#[test]
fn every_isa_and_thread_count_gives_bit_identical_results() {
    let (m, k, n) = (13, 259, 300);
    let mut results = Vec::new();
    for isa in isas() {
        for threads in [1, 2, 3] {
            // Same seed: same operands.
            let c = check(
                isa,
                m,
                k,
                n,
                Epi::BiasGelu,
                false,
                &ScopedThreads::new(threads),
                &mut Rng(99),
            );
            results.push((isa, threads, c));
        }
    }
    let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (isa, threads, c) in &results[1..] {
        assert!(
            bits(c) == bits(&results[0].2),
            "{isa:?} with {threads} threads differs from {:?}",
            results[0].0
        );
    }
}

#[test]
fn typical_error_is_reported() {
    // Uniform random operands, K = 768 (BERT-base's hidden size): the RMS error relative to
    // the RMS result, the figure gemm_i8's docs quote. Not a bound, a measurement.
    let (m, k, n) = (8, 768, 256);
    let mut rng = Rng(2024);
    let a = rng.vec(m * k);
    let b = rng.vec(k * n);
    let packed = PackedI8B::pack(k, n, &b, n).unwrap();
    let mut c = vec![0.0f32; m * n];
    gemm_i8(
        MatRef::row_major(&a, m, k, k).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, m, n, n).unwrap(),
        &Epilogue::none(),
        &Sequential,
    )
    .unwrap();
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            err2 += (c[i * n + j] as f64 - dot).powi(2);
            ref2 += dot * dot;
        }
    }
    let rel = (err2 / ref2).sqrt();
    println!("int8 GEMM, uniform operands, K = {k}: RMS error / RMS result = {rel:.5}");
    assert!(rel < 0.01, "relative RMS error {rel}");
}

#[test]
fn non_finite_activations_give_a_nan_row() {
    let (m, k, n) = (3, 9, 20);
    let mut rng = Rng(5);
    let mut a = rng.vec(m * k);
    a[k + 4] = f32::INFINITY;
    let packed = PackedI8B::pack(k, n, &rng.vec(k * n), n).unwrap();
    for isa in isas() {
        let mut c = vec![0.0f32; m * n];
        gemm_i8_with_isa(
            isa,
            MatRef::row_major(&a, m, k, k).unwrap(),
            packed.view(),
            MatMut::row_major(&mut c, m, n, n).unwrap(),
            &Epilogue::none(),
            &Sequential,
        )
        .unwrap();
        assert!(c[n..2 * n].iter().all(|x| x.is_nan()), "{isa:?}");
        assert!(c[..n].iter().chain(&c[2 * n..]).all(|x| x.is_finite()));
    }
}

#[test]
fn k_zero_gives_the_epilogue_of_zero() {
    let bias = [1.0f32, -2.0, 3.0];
    let packed = PackedI8B::pack(0, 3, &[], 3).unwrap();
    for isa in isas() {
        for m in [1, 20] {
            let mut c = vec![f32::NAN; m * 3];
            let e = Epilogue {
                bias: Some(&bias),
                activation: Activation::Relu,
                ..Epilogue::none()
            };
            gemm_i8_with_isa(
                isa,
                MatRef::row_major(&[], m, 0, 0).unwrap(),
                packed.view(),
                MatMut::row_major(&mut c, m, 3, 3).unwrap(),
                &e,
                &Sequential,
            )
            .unwrap();
            for row in c.chunks(3) {
                assert_eq!(row, [1.0, 0.0, 3.0], "{isa:?} m = {m}");
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors_that_name_the_operand() {
    let packed = PackedI8B::pack(4, 5, &[0.5; 20], 5).unwrap();
    let a = [1.0f32; 12];
    let mut c = [0.0f32; 15];
    let err = |r: Result<(), GemmError>| r.unwrap_err().to_string();
    let e = err(gemm_i8(
        MatRef::row_major(&a, 3, 3, 3).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
        &Epilogue::none(),
        &Sequential,
    ));
    assert!(e.contains("B") && e.contains("int8 B has 4 rows"), "{e}");
    let e = err(gemm_i8(
        MatRef::row_major(&a, 3, 4, 4).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 4, 4).unwrap(),
        &Epilogue::none(),
        &Sequential,
    ));
    assert!(e.starts_with("C") && e.contains("3x5"), "{e}");
    let bias = [0.0f32; 4];
    let e = err(gemm_i8(
        MatRef::row_major(&a, 3, 4, 4).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
        &Epilogue {
            bias: Some(&bias),
            ..Epilogue::none()
        },
        &Sequential,
    ));
    assert!(e.contains("bias") && e.contains("4 elements"), "{e}");
    let res = [0.0f32; 14];
    let e = err(gemm_i8(
        MatRef::row_major(&a, 3, 4, 4).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
        &Epilogue {
            residual: Some(Residual::row_major(&res, 5, false)),
            ..Epilogue::none()
        },
        &Sequential,
    ));
    assert!(
        e.contains("residual") && e.contains("the slice has 14"),
        "{e}"
    );
    let mut acc = [0i32; 15];
    let e = err(gemm_i8_accumulate_with_isa(
        Isa::Scalar,
        &[0u8; 11],
        3,
        packed.view(),
        &mut acc,
        &Sequential,
    ));
    assert!(e.contains("accumulators") && e.contains("got 11"), "{e}");
    if let Some(&isa) = Isa::all().iter().find(|i| !i.is_available()) {
        let e = gemm_i8_with_isa(
            isa,
            MatRef::row_major(&a, 3, 4, 4).unwrap(),
            packed.view(),
            MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
            &Epilogue::none(),
            &Sequential,
        )
        .unwrap_err();
        assert_eq!(e, GemmError::IsaUnavailable(isa));
    }
}

#[test]
fn bytes_round_trip_and_bad_bytes_are_errors_never_panics() {
    let mut rng = Rng(77);
    let (k, n) = (9, 21);
    let (np, kg) = (32, 3);
    let b = rng.vec(k * n);
    let packed = PackedI8B::pack(k, n, &b, n).unwrap();
    let bytes = packed.as_bytes();
    assert_eq!(bytes.len(), PACKED_I8_B_HEADER_BYTES + 8 * np + np * kg * 4);
    assert_eq!(&bytes[..4], b"RFQ8");
    let owned = PackedI8B::from_bytes(bytes).unwrap();
    assert_eq!((owned.k(), owned.n()), (k, n));
    assert_eq!(owned.as_bytes(), bytes);
    let view = PackedI8BRef::from_bytes(bytes).unwrap();
    assert_eq!((view.k(), view.n()), (k, n));
    assert_eq!(view.panels(), packed.panels());
    assert_eq!(view.scales(), packed.scales());
    assert_eq!(view.col_sums(), packed.col_sums());
    // The panels start on a cache line in owned storage.
    assert!((packed.panels().as_ptr() as usize).is_multiple_of(64));

    // Headerless parts.
    let (s, c, p) = (packed.scales(), packed.col_sums(), packed.panels());
    PackedI8BRef::from_parts(k, n, s, c, p).unwrap();
    for (e, what) in [
        (
            PackedI8BRef::from_parts(k, n, &s[1..], c, p).unwrap_err(),
            "needs 84 bytes of scales, got 80",
        ),
        (
            PackedI8BRef::from_parts(k, n, s, &c[1..], p).unwrap_err(),
            "of column sums",
        ),
        (
            PackedI8BRef::from_parts(k, n, s, c, &p[1..]).unwrap_err(),
            "needs 384 bytes of panels, got 383",
        ),
    ] {
        assert!(e.to_string().contains(what), "expected '{what}' in '{e}'");
    }

    // Misaligned in place: the scales off a 4-byte boundary.
    let mut shifted = vec![0u8; bytes.len() + 8];
    let off = 4 - shifted.as_ptr() as usize % 4 + 1;
    shifted[off..off + bytes.len()].copy_from_slice(bytes);
    let e = PackedI8BRef::from_bytes(&shifted[off..off + bytes.len()]).unwrap_err();
    assert!(matches!(e, I8PackError::Misaligned { .. }), "{e}");
    assert!(e.to_string().contains("aligned"), "{e}");
    let copied = PackedI8B::from_bytes(&shifted[off..off + bytes.len()]).unwrap();
    assert_eq!(copied.as_bytes(), bytes);

    let corrupt = |at: usize, val: &[u8]| {
        let mut v = bytes.to_vec();
        v[at..at + val.len()].copy_from_slice(val);
        v
    };
    let scales_at = PACKED_I8_B_HEADER_BYTES;
    let sums_at = scales_at + 4 * np;
    let panels_at = sums_at + 4 * np;
    // Weight (4, 2): panel 0, group 1, column 2, lane 0.
    let w42 = panels_at + 64 + 2 * 4;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (bytes[..31].to_vec(), "shorter than the 32-byte header"),
        (Vec::new(), "shorter"),
        (corrupt(0, b"RFQ4"), "bad magic"),
        (corrupt(4, &2u32.to_le_bytes()), "version 2"),
        (corrupt(8, &8u32.to_le_bytes()), "panel width 8"),
        (corrupt(12, &2u32.to_le_bytes()), "k group 2"),
        (corrupt(16, &13u64.to_le_bytes()), "13x21 needs"),
        (corrupt(24, &33u64.to_le_bytes()), "9x33 needs"),
        (
            corrupt(16, &(1u64 << 17).to_le_bytes()),
            "deeper than 65536",
        ),
        (corrupt(24, &u64::MAX.to_le_bytes()), "does not fit"),
        (bytes[..bytes.len() - 1].to_vec(), "bytes in all"),
        ([bytes, &[0, 0, 0, 0]].concat(), "bytes in all"),
        (
            corrupt(scales_at + 4 * 7, &f32::NAN.to_le_bytes()),
            "scale of column 7 is NaN",
        ),
        (
            corrupt(scales_at + 4 * 8, &(-1.0f32).to_le_bytes()),
            "scale of column 8 is -1",
        ),
        (
            corrupt(sums_at + 4 * 2, &(packed.col_sums()[2] + 1).to_le_bytes()),
            "column 2 sum",
        ),
        (corrupt(w42, &[0x80]), "weight (4, 2) is -128"),
        (corrupt(w42, &[bytes[w42].wrapping_add(1)]), "column 2 sum"),
    ];
    for (bad, what) in cases {
        for e in [
            PackedI8B::from_bytes(&bad).unwrap_err(),
            // An aligned copy, so the content is what fails, not the alignment.
            {
                let mut v = vec![0u8; bad.len() + 4];
                let off = (4 - v.as_ptr() as usize % 4) % 4;
                v[off..off + bad.len()].copy_from_slice(&bad);
                PackedI8BRef::from_bytes(&v[off..off + bad.len()]).unwrap_err()
            },
        ] {
            assert!(e.to_string().contains(what), "expected '{what}' in '{e}'");
        }
    }
}
