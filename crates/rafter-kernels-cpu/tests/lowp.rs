//! The half-precision-weight GEMM on every kernel available here (the scalar one always)
//! against an f64 triple loop over the *rounded* weights, so the only error allowed is f32
//! accumulation order; the rounding itself against `half` and a bit-level RNE; and the
//! byte format's validation.

use half::{bf16, f16};

mod common;
use common::{gelu64, isas, Rng};
use rafter_kernels_cpu::{
    gemm_half, gemm_half_with_isa, set_half_direct_max_m, Activation, Epilogue, GemmError,
    HalfKind, HalfPackError, Isa, MatMut, MatRef, PackedHalfB, PackedHalfBRef, Parallel, Residual,
    ScopedThreads, Sequential, PACKED_HALF_B_HEADER_BYTES,
};

const KINDS: [HalfKind; 2] = [HalfKind::F16, HalfKind::Bf16];

/// `half`'s rounding of `x`, independently of the crate's packing code.
fn half_round(kind: HalfKind, x: f32) -> f32 {
    match kind {
        HalfKind::F16 => f16::from_f32(x).to_f32(),
        HalfKind::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

/// bf16 round-to-nearest-even written out on the bits (for finite, non-NaN x).
fn bf16_rne_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let lsb = (b >> 16) & 1;
    (b.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// The bits at `(p, j)` of packed panels.
fn panel_bits(panels: &[u16], k: usize, p: usize, j: usize) -> u16 {
    panels[(j / 16) * k * 16 + p * 16 + j % 16]
}

#[test]
fn packing_rounds_to_nearest_even_as_half_does() {
    let mut rng = Rng(0x5eed);
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        // f16 ties: halfway between 1 and 1 + 2^-10 rounds down to the even 1.0; halfway
        // between 1 + 2^-10 and 1 + 2^-9 rounds up to the even 1 + 2^-9.
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        // bf16 ties, likewise with 2^-8.
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        65504.0, // f16 max
        65520.0, // rounds to f16 infinity
        1e-7,    // f16 subnormal
        -3e-8,   // rounds to f16 -0 or the smallest subnormal
        1e30,    // f16 infinity, bf16 finite
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        3.3895314e38, // rounds to bf16 infinity
    ];
    let (k, n) = (5, 37);
    let mut b = rng.vec(k * n);
    b[..specials.len()].copy_from_slice(&specials);
    b[specials.len()] = f32::NAN;
    for kind in KINDS {
        let packed = PackedHalfB::pack(kind, k, n, &b, n).unwrap();
        assert_eq!((packed.k(), packed.n(), packed.kind()), (k, n, kind));
        let panels = packed.panels();
        assert_eq!(panels.len(), n.div_ceil(16) * k * 16);
        for p in 0..k {
            for j in 0..n.div_ceil(16) * 16 {
                let got = panel_bits(panels, k, p, j);
                if j >= n {
                    assert_eq!(got, 0, "{kind:?} padding ({p}, {j})");
                    continue;
                }
                let x = b[p * n + j];
                let want = match kind {
                    HalfKind::F16 => f16::from_f32(x).to_bits(),
                    HalfKind::Bf16 => bf16::from_f32(x).to_bits(),
                };
                if x.is_nan() {
                    assert!(kind.to_f32(got).is_nan(), "{kind:?} NaN stays NaN");
                    continue;
                }
                assert_eq!(got, want, "{kind:?} rounding of {x:e} at ({p}, {j})");
                if kind == HalfKind::Bf16 {
                    assert_eq!(got, bf16_rne_bits(x), "bf16 RNE of {x:e}");
                }
                assert_eq!(kind.to_f32(got).to_bits(), half_round(kind, x).to_bits());
            }
        }
    }
    // The ties, spelled out.
    assert_eq!(
        HalfKind::F16.to_f32(HalfKind::F16.from_f32(1.0 + 2f32.powi(-11))),
        1.0
    );
    assert_eq!(
        HalfKind::F16.to_f32(HalfKind::F16.from_f32(1.0 + 3.0 * 2f32.powi(-11))),
        1.0 + 2f32.powi(-9)
    );
    assert_eq!(
        HalfKind::Bf16.to_f32(HalfKind::Bf16.from_f32(1.0 + 2f32.powi(-8))),
        1.0
    );
    assert_eq!(
        HalfKind::Bf16.to_f32(HalfKind::Bf16.from_f32(1.0 + 3.0 * 2f32.powi(-8))),
        1.0 + 2f32.powi(-6)
    );
    assert!(HalfKind::F16
        .to_f32(HalfKind::F16.from_f32(65520.0))
        .is_infinite());
}

#[derive(Clone, Copy, Debug)]
enum Epi {
    None,
    BiasGelu,
    /// Bias, ReLU on `x + residual`, clamp to [-0.5, 2].
    BiasResidualReluClamp,
    RowBias,
}

/// Checks `gemm_half_with_isa` on one problem against the f64 reference over rounded B.
#[allow(clippy::too_many_arguments)]
fn check(
    isa: Isa,
    kind: HalfKind,
    m: usize,
    k: usize,
    n: usize,
    epi: Epi,
    trans_a: bool,
    par: &dyn Parallel,
    rng: &mut Rng,
) {
    let a = rng.vec(m * k);
    // Magnitudes up to 4 with some small ones, so f16 subnormals and rounding both matter.
    let b: Vec<f32> = rng.vec(k * n).iter().map(|x| x * 4.0).collect();
    let bias = rng.vec(n);
    let row_bias = rng.vec(m);
    let ldc = n + 3;
    let res = rng.vec(m * ldc);
    let packed = PackedHalfB::pack(kind, k, n, &b, n).unwrap();
    // A row-major, or stored K x M and read through its transpose.
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
        Epi::RowBias => Epilogue {
            row_bias: Some(&row_bias),
            ..Epilogue::none()
        },
    };
    // A scaled product with one of the epilogues (as an ONNX Gemm with alpha).
    let alpha = if matches!(epi, Epi::BiasGelu) {
        0.5
    } else {
        1.0
    };
    gemm_half_with_isa(
        isa,
        alpha,
        a_view,
        packed.view(),
        MatMut::row_major(&mut c, m, n, ldc).unwrap(),
        &e,
        par,
    )
    .unwrap();
    for i in 0..m {
        for j in 0..n {
            let (mut dot, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let bw = half_round(kind, b[p * n + j]) as f64;
                dot += a[i * k + p] as f64 * bw;
                mag += (a[i * k + p] as f64 * bw).abs();
            }
            dot *= alpha as f64;
            let r = res[i * ldc + j] as f64;
            let want = match epi {
                Epi::None => dot,
                Epi::BiasGelu => gelu64(dot + bias[j] as f64),
                Epi::BiasResidualReluClamp => (dot + bias[j] as f64 + r).max(0.0).clamp(-0.5, 2.0),
                Epi::RowBias => dot + row_bias[i] as f64,
            };
            // f32 accumulation of k products: at most about k ulps of the sum of magnitudes
            // (a worst-case bound, not a typical error), plus the epilogue's few roundings.
            let tol = (k as f64 + 4.0) * f32::EPSILON as f64 * (mag + 3.0) + 1e-6;
            let got = c[i * ldc + j] as f64;
            assert!(
                (got - want).abs() <= tol,
                "{isa:?} {kind:?} {m}x{k}x{n} {epi:?} trans_a={trans_a} threads={}: \
                 C[{i}][{j}] = {got}, want {want} (tol {tol:e})",
                par.threads()
            );
        }
        // Padding past n in C untouched (still NaN).
        for j in n..ldc {
            assert!(c[i * ldc + j].is_nan(), "{isa:?} wrote C[{i}][{j}] past N");
        }
    }
}

#[test]
fn half_gemm_matches_the_f64_reference_on_every_isa_and_path() {
    let mut rng = Rng(0xfeed_beef);
    let three = ScopedThreads::new(3);
    let pars: [&dyn Parallel; 2] = [&Sequential, &three];
    let rows = [1, 2, 3, 5, 7, 8, 9, 13, 40];
    // Both paths on every ISA: direct for every M (usize::MAX), and the widening path for
    // every M >= 2 (1). The override is process-wide, but the other tests here are correct
    // whichever path they get.
    for direct_max in [usize::MAX, 1] {
        set_half_direct_max_m(direct_max);
        each_isa_and_kind(&rows, &pars, &mut rng);
    }
    set_half_direct_max_m(0);
    // The measured defaults.
    each_isa_and_kind(&rows, &pars, &mut rng);
}

fn each_isa_and_kind(rows: &[usize], pars: &[&dyn Parallel], rng: &mut Rng) {
    let three = ScopedThreads::new(3);
    // K odd, below and above every KC (256 / 384 / 512); N not a multiple of 16, below and
    // above every direct tile width (16 / 32 / 64) and the widened block width.
    let kn = [
        (1, 1),
        (7, 17),
        (33, 50),
        (64, 80),
        (129, 33),
        (600, 70),
        (31, 300),
    ];
    for isa in isas() {
        for kind in KINDS {
            for &m in rows {
                for &(k, n) in &kn {
                    for &par in pars {
                        check(isa, kind, m, k, n, Epi::None, false, par, rng);
                    }
                }
            }
            // Epilogues and strided A on a few shapes of each path.
            for &(m, k, n) in &[(1, 77, 45), (3, 130, 33), (13, 65, 97), (40, 520, 40)] {
                for epi in [Epi::BiasGelu, Epi::BiasResidualReluClamp, Epi::RowBias] {
                    check(isa, kind, m, k, n, epi, false, &three, rng);
                }
                check(isa, kind, m, k, n, Epi::None, true, &three, rng);
                check(isa, kind, m, k, n, Epi::BiasGelu, true, &Sequential, rng);
            }
        }
    }
}

#[test]
fn k_zero_gives_the_epilogue_of_zero_and_gemm_half_uses_a_real_kernel() {
    let bias = [1.0f32, -2.0, 3.0];
    let packed = PackedHalfB::pack(HalfKind::Bf16, 0, 3, &[], 3).unwrap();
    for m in [1, 20] {
        let a: Vec<f32> = Vec::new();
        let mut c = vec![f32::NAN; m * 3];
        let e = Epilogue {
            bias: Some(&bias),
            activation: Activation::Relu,
            ..Epilogue::none()
        };
        gemm_half(
            1.0,
            MatRef::row_major(&a, m, 0, 0).unwrap(),
            packed.view(),
            MatMut::row_major(&mut c, m, 3, 3).unwrap(),
            &e,
            &Sequential,
        )
        .unwrap();
        for row in c.chunks(3) {
            assert_eq!(row, [1.0, 0.0, 3.0], "m = {m}");
        }
    }
}

#[test]
fn bad_shapes_are_errors_that_name_the_operand() {
    let packed = PackedHalfB::pack(HalfKind::F16, 4, 5, &[0.5; 20], 5).unwrap();
    let a = [1.0f32; 12];
    let mut c = [0.0f32; 15];
    let err = |r: Result<(), GemmError>| r.unwrap_err().to_string();
    // A is 3x3, B has 4 rows.
    let e = err(gemm_half(
        1.0,
        MatRef::row_major(&a, 3, 3, 3).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
        &Epilogue::none(),
        &Sequential,
    ));
    assert!(e.contains("B") && e.contains("4 rows"), "{e}");
    // C is 3x4, A*B is 3x5.
    let a4 = [1.0f32; 12];
    let e = err(gemm_half(
        1.0,
        MatRef::row_major(&a4, 3, 4, 4).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 4, 4).unwrap(),
        &Epilogue::none(),
        &Sequential,
    ));
    assert!(e.starts_with("C") && e.contains("3x5"), "{e}");
    // Bias of 4 for 5 columns.
    let bias = [0.0f32; 4];
    let e = err(gemm_half(
        1.0,
        MatRef::row_major(&a4, 3, 4, 4).unwrap(),
        packed.view(),
        MatMut::row_major(&mut c, 3, 5, 5).unwrap(),
        &Epilogue {
            bias: Some(&bias),
            ..Epilogue::none()
        },
        &Sequential,
    ));
    assert!(e.contains("bias") && e.contains("4 elements"), "{e}");
    // Packing from too short a slice.
    let e = PackedHalfB::pack(HalfKind::F16, 4, 5, &[0.0; 19], 5).unwrap_err();
    assert!(matches!(e, GemmError::TooShort { .. }), "{e}");
    // An ISA this CPU lacks.
    if let Some(&isa) = Isa::all().iter().find(|i| !i.is_available()) {
        let e = gemm_half_with_isa(
            isa,
            1.0,
            MatRef::row_major(&a4, 3, 4, 4).unwrap(),
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
    let b = rng.vec(k * n);
    for kind in KINDS {
        let packed = PackedHalfB::pack(kind, k, n, &b, n).unwrap();
        let bytes = packed.as_bytes();
        assert_eq!(bytes.len(), PACKED_HALF_B_HEADER_BYTES + 2 * 2 * 16 * k);
        assert_eq!(&bytes[..4], b"RFPH");
        let owned = PackedHalfB::from_bytes(bytes).unwrap();
        assert_eq!((owned.kind(), owned.k(), owned.n()), (kind, k, n));
        assert_eq!(owned.panels(), packed.panels());
        let view = PackedHalfBRef::from_bytes(bytes).unwrap();
        assert_eq!((view.kind(), view.k(), view.n()), (kind, k, n));
        assert_eq!(view.panels(), packed.panels());
        // Headerless panels.
        let v = PackedHalfBRef::from_panels(kind, k, n, packed.panels()).unwrap();
        assert_eq!(v.panels().len(), packed.panels().len());
        let e = PackedHalfBRef::from_panels(kind, k, n, &packed.panels()[1..]).unwrap_err();
        assert!(matches!(e, HalfPackError::Length { .. }), "{e}");

        // Misaligned in place: the panels one byte off a 2-byte boundary.
        let mut shifted = vec![0u8; bytes.len() + 2];
        let base = shifted.as_ptr() as usize;
        let off = if base.is_multiple_of(2) { 1 } else { 0 };
        shifted[off..off + bytes.len()].copy_from_slice(bytes);
        let e = PackedHalfBRef::from_bytes(&shifted[off..off + bytes.len()]).unwrap_err();
        assert!(matches!(e, HalfPackError::Misaligned { .. }), "{e}");
        assert!(e.to_string().contains("aligned"), "{e}");
        // The copying parser accepts the same bytes at any alignment.
        let copied = PackedHalfB::from_bytes(&shifted[off..off + bytes.len()]).unwrap();
        assert_eq!(copied.panels(), packed.panels());

        let corrupt = |at: usize, val: &[u8]| {
            let mut v = bytes.to_vec();
            v[at..at + val.len()].copy_from_slice(val);
            v
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (bytes[..31].to_vec(), "shorter than the 32-byte header"),
            (Vec::new(), "shorter"),
            (corrupt(0, b"RFPB"), "bad magic"),
            (corrupt(4, &2u32.to_le_bytes()), "version 2"),
            (corrupt(8, &8u32.to_le_bytes()), "panel width 8"),
            (corrupt(12, &0u32.to_le_bytes()), "element type 0"),
            (corrupt(12, &3u32.to_le_bytes()), "element type 3"),
            (corrupt(16, &10u64.to_le_bytes()), "10x21 needs"),
            (corrupt(24, &33u64.to_le_bytes()), "9x33 needs"),
            (corrupt(16, &u64::MAX.to_le_bytes()), "does not fit"),
            (bytes[..bytes.len() - 2].to_vec(), "needs"),
            ([bytes, &[0, 0]].concat(), "needs"),
        ];
        for (bad, what) in cases {
            for e in [
                PackedHalfB::from_bytes(&bad).unwrap_err(),
                // An aligned copy, so the header is what fails, not the alignment.
                {
                    let mut v = vec![0u8; bad.len() + 1];
                    let off = v.as_ptr() as usize % 2;
                    v[off..off + bad.len()].copy_from_slice(&bad);
                    PackedHalfBRef::from_bytes(&v[off..off + bad.len()]).unwrap_err()
                },
            ] {
                assert!(
                    e.to_string().contains(what),
                    "{kind:?}: expected '{what}' in '{e}'"
                );
            }
        }
    }
}
