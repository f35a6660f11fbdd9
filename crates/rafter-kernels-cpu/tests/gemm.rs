//! Every kernel available on this machine (the scalar one always) against a naive f64
//! triple loop, over edge shapes, strides, betas, epilogues and thread splits.

use rafter_kernels_cpu::{
    sgemm, sgemm_fill_a_with_isa, sgemm_with_isa, Activation, BRef, Epilogue, GemmError, Isa,
    MatMut, MatRef, PackError, PackedB, PackedBRef, Parallel, Residual, ScopedThreads, Sequential,
    PACKED_B_HEADER_BYTES,
};

mod common;
use common::{gelu64, isas, Rng};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A case's expected C (f64) and each element's tolerance, row-major m x n.
struct Reference {
    want: Vec<f64>,
    tols: Vec<f64>,
}

/// One GEMM problem, with its operands stored with the given strides.
struct Case {
    m: usize,
    k: usize,
    n: usize,
    /// Extra elements per row of A, B, C (odd leading dimensions).
    pad: usize,
    /// A and B stored transposed (column-major), read through `MatRef::t`.
    trans: bool,
    alpha: f32,
    beta: f32,
    bias: bool,
    /// A per-row bias (a convolution's per-channel bias in `[Cout, pixels]` layout).
    row_bias: bool,
    act: Activation,
    /// None, Some(before_activation).
    res: Option<bool>,
    /// Clamp bounds applied last.
    clamp: Option<(f32, f32)>,
    /// Through `sgemm_fill_a` (A produced by a callback, per range of columns); needs
    /// `beta == 0`.
    fill: bool,
}

impl Case {
    fn new(m: usize, k: usize, n: usize) -> Case {
        Case {
            m,
            k,
            n,
            pad: 0,
            trans: false,
            alpha: 1.0,
            beta: 0.0,
            bias: false,
            row_bias: false,
            act: Activation::None,
            res: None,
            clamp: None,
            fill: false,
        }
    }

    fn run(&self, isa: Isa, par: &dyn Parallel, prepack: bool, seed: u64) {
        let Case { m, k, n, pad, .. } = *self;
        let mut rng = Rng(seed | 1);
        // A: m x k (or its transpose stored k x m), B: k x n (or n x k).
        let (ar, ac) = if self.trans { (k, m) } else { (m, k) };
        let (br, bc) = if self.trans { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ac + pad, bc + pad, n + pad);
        let a = rng.vec(ar.max(1) * lda);
        let b = rng.vec(br.max(1) * ldb);
        let c0: Vec<f32> = if self.beta == 0.0 {
            vec![f32::NAN; m * ldc] // beta == 0 must not read C
        } else {
            rng.vec(m * ldc)
        };
        let bias = rng.vec(n);
        let row_bias = rng.vec(m);
        let res = rng.vec(m * ldc);
        let at = |i: usize, p: usize| if self.trans { a[p * lda + i] } else { a[i * lda + p] } as f64;
        let bt = |p: usize, j: usize| if self.trans { b[j * ldb + p] } else { b[p * ldb + j] } as f64;

        let mut am = MatRef::row_major(&a, ar, ac, lda).unwrap();
        let mut bm = MatRef::row_major(&b, br, bc, ldb).unwrap();
        if self.trans {
            am = am.t();
            bm = bm.t();
        }
        let packed = prepack.then(|| PackedB::pack_mat(bm));
        let bref = match &packed {
            Some(p) => BRef::from(p),
            None => BRef::Mat(bm),
        };
        let epi = Epilogue {
            bias: self.bias.then_some(&bias[..]),
            row_bias: self.row_bias.then_some(&row_bias[..]),
            activation: self.act,
            residual: self
                .res
                .map(|before| Residual::row_major(&res, ldc, before)),
            clamp: self.clamp,
        };
        let mut c = c0.clone();
        let cm = MatMut::row_major(&mut c, m, n, ldc).unwrap();
        if self.fill {
            assert_eq!(self.beta, 0.0, "sgemm_fill_a only writes C");
            // Every range the driver asks for is inside 0..k, asked once per task.
            let fill = |cols: std::ops::Range<usize>, dst: &mut [f32]| {
                assert!(cols.start <= cols.end && cols.end <= k, "{cols:?} of {k}");
                assert_eq!(dst.len(), m * cols.len());
                for (i, row) in dst.chunks_exact_mut(cols.len().max(1)).enumerate() {
                    for (d, p) in row.iter_mut().zip(cols.clone()) {
                        *d = at(i, p) as f32;
                    }
                }
            };
            sgemm_fill_a_with_isa(isa, self.alpha, m, k, &fill, bref, cm, &epi, par).unwrap();
        } else {
            sgemm_with_isa(isa, self.alpha, am, bref, self.beta, cm, &epi, par).unwrap();
        }

        let expected = self.reference(seed, at, bt, &c0, &bias, &row_bias, &res);
        for i in 0..m {
            for j in 0..n {
                let (x, tol) = (expected.want[i * n + j], expected.tols[i * n + j]);
                let got = c[i * ldc + j] as f64;
                assert!(
                    (got - x).abs() <= tol,
                    "{isa:?} m={m} k={k} n={n} pad={pad} trans={} prepack={prepack} beta={} \
                     act={:?} res={:?} threads={}: C[{i},{j}] = {got}, expected {x} (tol {tol})",
                    self.trans,
                    self.beta,
                    self.act,
                    self.res,
                    par.threads(),
                );
            }
            // Padding between rows of C is never written.
            for j in n..ldc {
                let (got, was) = (c[i * ldc + j], c0[i * ldc + j]);
                assert!(
                    got.to_bits() == was.to_bits(),
                    "{isa:?}: C[{i},{j}] (padding) written"
                );
            }
        }
    }

    /// The f64 reference for this case's operands drawn from `seed`: each element of C and
    /// its tolerance, row-major m x n. The operands depend only on the case and the seed,
    /// not on the kernel, threads or pre-packing, and the tests run a case on every ISA and
    /// thread split with one seed: a large case's reference (at least `KEEP_MACS`
    /// multiply-adds) is computed on its first run and kept for the others. The naive
    /// triple loop, not the kernels, was most of this file's time: the BERT-sized case's
    /// reference ran 7 times on x86 and 4 under qemu on aarch64. Small ones, most cases, are
    /// cheap to redo and not kept (their number times their size would be ~100s of MB).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        &self,
        seed: u64,
        at: impl Fn(usize, usize) -> f64,
        bt: impl Fn(usize, usize) -> f64,
        c0: &[f32],
        bias: &[f32],
        row_bias: &[f32],
        res: &[f32],
    ) -> Arc<Reference> {
        const KEEP_MACS: usize = 1 << 20;
        static KEPT: Mutex<Option<HashMap<String, Arc<Reference>>>> = Mutex::new(None);
        let keep = self.m * self.k * self.n >= KEEP_MACS;
        let key = format!(
            "{} {} {} {} {} {:?} {:?} {} {} {:?} {:?} {:?} {seed}",
            self.m,
            self.k,
            self.n,
            self.pad,
            self.trans,
            self.alpha,
            self.beta,
            self.bias,
            self.row_bias,
            self.act,
            self.res,
            self.clamp,
        );
        if keep {
            if let Some(r) = KEPT.lock().unwrap().get_or_insert_default().get(&key) {
                return Arc::clone(r);
            }
        }
        let Case { m, k, n, pad, .. } = *self;
        let ldc = n + pad;
        let mut want = Vec::with_capacity(m * n);
        let mut tols = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let (mut dot, mut mag) = (0.0f64, 0.0f64);
                for p in 0..k {
                    dot += at(i, p) * bt(p, j);
                    mag += (at(i, p) * bt(p, j)).abs();
                }
                let alpha = self.alpha as f64;
                let mut x = alpha * dot;
                mag *= alpha.abs();
                if self.beta != 0.0 {
                    x += self.beta as f64 * c0[i * ldc + j] as f64;
                    mag += (self.beta as f64 * c0[i * ldc + j] as f64).abs();
                }
                if self.bias {
                    x += bias[j] as f64;
                    mag += bias[j].abs() as f64;
                }
                if self.row_bias {
                    x += row_bias[i] as f64;
                    mag += row_bias[i].abs() as f64;
                }
                let r = res[i * ldc + j] as f64;
                if self.res == Some(true) {
                    x += r;
                }
                x = match self.act {
                    Activation::None => x,
                    Activation::Relu => x.max(0.0),
                    Activation::GeluTanh => gelu64(x),
                };
                if self.res.is_some() {
                    mag += r.abs();
                }
                if self.res == Some(false) {
                    x += r;
                }
                if let Some((lo, hi)) = self.clamp {
                    x = x.max(lo as f64).min(hi as f64);
                }
                // Rounding grows with the length of the dot product; GELU's polynomial
                // exp adds a small relative error of its own.
                let tol = (8 + 2 * k) as f64 * f32::EPSILON as f64 * mag + 1e-6 * (1.0 + mag);
                want.push(x);
                tols.push(tol);
            }
        }
        let r = Arc::new(Reference { want, tols });
        if keep {
            KEPT.lock()
                .unwrap()
                .get_or_insert_default()
                .insert(key, Arc::clone(&r));
        }
        r
    }
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (7, 29, 13),
    (1, 768, 768),
    (2, 5, 17),
    (13, 33, 1),
    (6, 256, 16),
    (12, 300, 32),
    (25, 513, 40),  // crosses KC
    (150, 70, 100), // crosses MC
    (3, 20, 3100),  // crosses NC
    (1, 64, 31),
    (5, 3, 47),
    (97, 1, 63),
    (4, 0, 9), // K = 0: C = beta*C + epilogue
];

#[test]
fn shapes_all_isas_plain_and_prepacked() {
    for isa in isas() {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            for prepack in [false, true] {
                Case::new(m, k, n).run(isa, &Sequential, prepack, s as u64 + 1);
            }
        }
    }
}

#[test]
fn strides_transposes_and_betas() {
    for isa in isas() {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            for (pad, trans, beta) in [
                (3, false, 1.0),
                (1, true, 0.0),
                (5, true, 0.5),
                (7, false, 1.0),
            ] {
                let case = Case {
                    pad,
                    trans,
                    beta,
                    alpha: 1.5,
                    ..Case::new(m, k, n)
                };
                case.run(isa, &Sequential, s % 2 == 0, 100 + s as u64);
            }
        }
    }
}

#[test]
fn epilogues() {
    let acts = [Activation::None, Activation::Relu, Activation::GeluTanh];
    for isa in isas() {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            for act in acts {
                for res in [None, Some(true), Some(false)] {
                    for (bias, row_bias) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        let case = Case {
                            act,
                            res,
                            bias,
                            row_bias,
                            beta: 0.5,
                            pad: 2,
                            ..Case::new(m, k, n)
                        };
                        case.run(isa, &Sequential, s % 2 == 1, 200 + s as u64);
                    }
                }
            }
        }
    }
}

#[test]
fn clamp_epilogue() {
    // ReLU6 (relu + clamp to [0, 6]) and a two-sided clamp, with and without a residual,
    // on every kernel, on full and partial tiles.
    for isa in isas() {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            for (act, clamp) in [
                (Activation::Relu, (0.0, 6.0)),
                (Activation::None, (-0.5, 0.25)),
            ] {
                for res in [None, Some(true), Some(false)] {
                    let case = Case {
                        act,
                        res,
                        row_bias: true,
                        clamp: Some(clamp),
                        ..Case::new(m, k, n)
                    };
                    case.run(isa, &Sequential, s % 2 == 0, 300 + s as u64);
                }
            }
        }
    }
}

#[test]
fn column_bias_epilogues() {
    // A convolution's epilogue: alpha 1, beta 0, a per-column bias, ReLU and/or a clamp
    // (ReLU6), no residual: the kernels' fast path for full tiles. Shapes of whole tiles
    // (AVX-512's 12 x 32 and 12 x 16, AVX2's 6 x 16) and the shared ones with partial tiles.
    let full = [(24, 16, 32), (36, 32, 16), (12, 7, 64), (18, 24, 48)];
    for isa in isas() {
        for (s, &(m, k, n)) in full.iter().chain(SHAPES.iter()).enumerate() {
            for (act, clamp) in [
                (Activation::None, None),
                (Activation::Relu, None),
                (Activation::None, Some((0.0, 6.0))),
                (Activation::Relu, Some((-0.25, 0.5))),
            ] {
                for bias in [true, false] {
                    let case = Case {
                        act,
                        bias,
                        clamp,
                        ..Case::new(m, k, n)
                    };
                    case.run(isa, &Sequential, s % 2 == 0, 400 + s as u64);
                }
            }
        }
    }
}

#[test]
fn gelu_extremes() {
    // Large |x| must neither overflow exp into NaN nor lose the identity/zero limits.
    for isa in isas() {
        let a = [1.0f32];
        let b = [
            -200.0f32, -30.0, -9.0, -1.0, 0.0, 1e-3, 2.5, 9.0, 30.0, 200.0, 1e30, -1e30,
        ];
        let mut c = vec![0.0f32; b.len()];
        let epi = Epilogue {
            activation: Activation::GeluTanh,
            ..Epilogue::none()
        };
        let am = MatRef::row_major(&a, 1, 1, 1).unwrap();
        let bm = MatRef::row_major(&b, 1, b.len(), b.len()).unwrap();
        let cm = MatMut::row_major(&mut c, 1, b.len(), b.len()).unwrap();
        sgemm_with_isa(isa, 1.0, am, bm.into(), 0.0, cm, &epi, &Sequential).unwrap();
        for (&x, &y) in b.iter().zip(&c) {
            let want = gelu64(x as f64);
            assert!(
                (y as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{isa:?}: gelu({x}) = {y}, expected {want}"
            );
        }
    }
}

#[test]
fn large_shapes_and_threads() {
    let pars: [&dyn Parallel; 3] = [&Sequential, &ScopedThreads::new(2), &ScopedThreads::new(3)];
    for isa in isas() {
        for (s, par) in pars.iter().enumerate() {
            let prepack = s != 1;
            // BERT FFN up-projection, with its GELU.
            let bert = Case {
                bias: true,
                act: Activation::GeluTanh,
                ..Case::new(128, 768, 3072)
            };
            if isa != Isa::Scalar || s == 0 {
                bert.run(isa, *par, prepack, 7);
            }
            // A ResNet-like conv as GEMM with residual and ReLU, and a decode-like GEMV.
            let res = Case {
                bias: true,
                act: Activation::Relu,
                res: Some(true),
                ..Case::new(196, 300, 72)
            };
            res.run(isa, *par, prepack, 8);
            Case::new(1, 768, 768).run(isa, *par, prepack, 9);
            Case {
                pad: 3,
                trans: true,
                beta: 1.0,
                ..Case::new(77, 129, 150)
            }
            .run(isa, *par, prepack, 10);
        }
    }
}

/// Pre-packed B over several K blocks (the kernels prefetch the next B micro-panel, across
/// K blocks too, on a task's first pass): the epilogue must apply once, after the last
/// block, on every edge: M past MC with a partial last row tile, N not a multiple of 16,
/// a K remainder block, one and several threads, prefetching on and off.
#[test]
fn prepacked_k_blocks_with_epilogue_and_prefetch() {
    let pars: [&dyn Parallel; 2] = [&Sequential, &ScopedThreads::new(2)];
    for isa in isas().into_iter().filter(|&i| i != Isa::Scalar) {
        for (s, &(m, k, n)) in [
            (130, 1100, 200),
            (128, 1536, 71),
            (13, 3072, 40),
            (97, 513, 33),
        ]
        .iter()
        .enumerate()
        {
            for (p, par) in pars.iter().enumerate() {
                for (res, act) in [
                    (Some(false), Activation::None),
                    (Some(true), Activation::GeluTanh),
                    (None, Activation::Relu),
                ] {
                    let case = Case {
                        bias: true,
                        res,
                        act,
                        ..Case::new(m, k, n)
                    };
                    case.run(isa, *par, true, 400 + (s * 2 + p) as u64);
                }
            }
        }
        // Prefetching is a hint only: the same results without it.
        rafter_kernels_cpu::set_prefetch_override(1);
        Case {
            bias: true,
            res: Some(false),
            ..Case::new(130, 1100, 200)
        }
        .run(isa, &ScopedThreads::new(2), true, 450);
        rafter_kernels_cpu::set_prefetch_override(0);
    }
}

#[test]
fn alpha_zero_reads_neither_a_nor_b() {
    for isa in isas() {
        let a = vec![f32::NAN; 6];
        let b = vec![f32::NAN; 6];
        let mut c = vec![2.0f32; 4];
        let am = MatRef::row_major(&a, 2, 3, 3).unwrap();
        let bm = MatRef::row_major(&b, 3, 2, 2).unwrap();
        let cm = MatMut::row_major(&mut c, 2, 2, 2).unwrap();
        sgemm_with_isa(
            isa,
            0.0,
            am,
            bm.into(),
            0.5,
            cm,
            &Epilogue::none(),
            &Sequential,
        )
        .unwrap();
        assert_eq!(c, vec![1.0; 4], "{isa:?}");
    }
}

#[test]
fn argument_errors_are_errors() {
    let a = vec![0.0f32; 12];
    assert!(matches!(
        MatRef::row_major(&a, 4, 4, 4),
        Err(GemmError::TooShort { .. })
    ));
    assert!(matches!(
        MatRef::row_major(&a, 2, 4, 3),
        Err(GemmError::Stride { .. })
    ));
    assert!(matches!(
        MatRef::strided(&a, 2, 2, usize::MAX, 1),
        Err(GemmError::TooShort { .. })
    ));
    let am = MatRef::row_major(&a, 3, 4, 4).unwrap();
    let bm = MatRef::row_major(&a, 3, 4, 4).unwrap();
    let mut c = vec![0.0f32; 16];
    let cm = MatMut::row_major(&mut c, 3, 4, 4).unwrap();
    let e = sgemm(1.0, am, bm.into(), 0.0, cm, &Epilogue::none(), &Sequential).unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "B", .. }), "{e}");
    let bm = MatRef::row_major(&a, 4, 3, 3).unwrap();
    let cm = MatMut::row_major(&mut c, 3, 3, 3).unwrap();
    let bias = [0.0f32; 2];
    let epi = Epilogue {
        bias: Some(&bias),
        ..Epilogue::none()
    };
    let e = sgemm(1.0, am, bm.into(), 0.0, cm, &epi, &Sequential).unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "bias", .. }), "{e}");
    let cm = MatMut::row_major(&mut c, 3, 3, 3).unwrap();
    let epi = Epilogue {
        row_bias: Some(&bias),
        ..Epilogue::none()
    };
    let e = sgemm(1.0, am, bm.into(), 0.0, cm, &epi, &Sequential).unwrap_err();
    assert!(
        matches!(
            e,
            GemmError::Shape {
                what: "row bias",
                ..
            }
        ),
        "{e}"
    );
    let cm = MatMut::row_major(&mut c, 3, 3, 3).unwrap();
    let short = [0.0f32; 5];
    let epi = Epilogue {
        residual: Some(Residual::row_major(&short, 3, true)),
        ..Epilogue::none()
    };
    let e = sgemm(1.0, am, bm.into(), 0.0, cm, &epi, &Sequential).unwrap_err();
    assert!(
        matches!(
            e,
            GemmError::TooShort {
                what: "residual",
                ..
            }
        ),
        "{e}"
    );
    let unavailable = Isa::all().iter().find(|i| !i.is_available());
    if let Some(&isa) = unavailable {
        let cm = MatMut::row_major(&mut c, 3, 3, 3).unwrap();
        let e = sgemm_with_isa(
            isa,
            1.0,
            am,
            bm.into(),
            0.0,
            cm,
            &Epilogue::none(),
            &Sequential,
        );
        assert_eq!(e.unwrap_err(), GemmError::IsaUnavailable(isa));
    }
}

/// A copy of `bytes` at an address `4*q + misalign`.
fn placed(bytes: &[u8], misalign: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; bytes.len() + 8];
    let base = v.as_ptr() as usize;
    let off = (4 - base % 4) % 4 + misalign;
    v[off..off + bytes.len()].copy_from_slice(bytes);
    (v, off)
}

#[test]
fn packed_bytes_round_trip() {
    let (k, n) = (37, 45);
    let mut rng = Rng(5);
    let b = rng.vec(k * n);
    let a = rng.vec(3 * k);
    let packed = PackedB::pack(k, n, &b, n).unwrap();
    let bytes = packed.as_bytes();
    assert_eq!(&bytes[..4], b"RFPB");
    assert_eq!(
        bytes.len(),
        PACKED_B_HEADER_BYTES + 4 * k * n.div_ceil(16) * 16
    );

    let owned = PackedB::from_bytes(bytes).unwrap();
    assert_eq!(owned.as_bytes(), bytes);
    assert_eq!((owned.k(), owned.n()), (k, n));
    let (buf, off) = placed(bytes, 0);
    let view = PackedBRef::from_bytes(&buf[off..off + bytes.len()]).unwrap();

    let am = MatRef::row_major(&a, 3, k, k).unwrap();
    let mut outs = Vec::new();
    for bref in [
        BRef::Mat(MatRef::row_major(&b, k, n, n).unwrap()),
        (&packed).into(),
        (&owned).into(),
        view.into(),
    ] {
        let mut c = vec![0.0f32; 3 * n];
        let cm = MatMut::row_major(&mut c, 3, n, n).unwrap();
        sgemm(1.0, am, bref, 0.0, cm, &Epilogue::none(), &Sequential).unwrap();
        outs.push(c);
    }
    // Headerless panels (how a compiled program stores a packed weight) are the same B.
    let panels = PackedBRef::from_panels(k, n, packed.panels()).unwrap();
    let mut c = vec![0.0f32; 3 * n];
    let cm = MatMut::row_major(&mut c, 3, n, n).unwrap();
    sgemm(
        1.0,
        am,
        panels.into(),
        0.0,
        cm,
        &Epilogue::none(),
        &Sequential,
    )
    .unwrap();
    outs.push(c);
    let short = &packed.panels()[..packed.panels().len() - 1];
    let e = PackedBRef::from_panels(k, n, short).unwrap_err();
    assert!(matches!(e, PackError::Length { .. }), "{e}");
    // Same kernel, same panels: bit-identical.
    assert!(outs.iter().all(|c| c == &outs[0]));

    // Not 4-byte aligned: an error saying so, not undefined behaviour.
    let (buf, off) = placed(bytes, 1);
    let e = PackedBRef::from_bytes(&buf[off..off + bytes.len()]).unwrap_err();
    assert!(matches!(e, PackError::Misaligned { .. }), "{e}");
    // PackedB::from_bytes copies, so alignment does not matter to it.
    assert!(PackedB::from_bytes(&buf[off..off + bytes.len()]).is_ok());
}

#[test]
fn packed_bytes_corruption_is_rejected() {
    let b: Vec<f32> = (0..40).map(|x| x as f32).collect();
    let good = PackedB::pack(5, 8, &b, 8).unwrap().as_bytes().to_vec();
    let set_word = |i: usize, w: u32| {
        let mut v = good.clone();
        v[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        v
    };
    type Expect = fn(&PackError) -> bool;
    let cases: Vec<(Vec<u8>, Expect)> = vec![
        (vec![], |e| matches!(e, PackError::TooShort { len: 0 })),
        (good[..31].to_vec(), |e| {
            matches!(e, PackError::TooShort { .. })
        }),
        (good[..good.len() - 1].to_vec(), |e| {
            matches!(e, PackError::Length { .. })
        }),
        ([good.clone(), vec![0; 4]].concat(), |e| {
            matches!(e, PackError::Length { .. })
        }),
        (set_word(0, u32::from_le_bytes(*b"RFPC")), |e| {
            matches!(e, PackError::BadMagic { .. })
        }),
        (set_word(1, 2), |e| matches!(e, PackError::Version(2))),
        (set_word(2, 8), |e| matches!(e, PackError::PanelWidth(8))),
        (set_word(3, 1), |e| matches!(e, PackError::Dtype(1))),
        (set_word(4, 6), |e| matches!(e, PackError::Length { .. })),
        (set_word(6, 17), |e| matches!(e, PackError::Length { .. })),
        (set_word(5, u32::MAX), |e| {
            matches!(e, PackError::Overflow { .. } | PackError::Length { .. })
        }),
        (set_word(7, u32::MAX), |e| {
            matches!(e, PackError::Overflow { .. } | PackError::Length { .. })
        }),
    ];
    for (i, (bytes, ok)) in cases.iter().enumerate() {
        let e = PackedB::from_bytes(bytes).unwrap_err();
        assert!(ok(&e), "case {i}: unexpected {e:?}");
        let (buf, off) = placed(bytes, 0);
        let e = PackedBRef::from_bytes(&buf[off..off + bytes.len()]).unwrap_err();
        assert!(ok(&e), "case {i} (view): unexpected {e:?}");
    }
}

#[test]
fn detect_is_cached_and_available() {
    let isa = Isa::detect();
    assert!(isa.is_available());
    assert_eq!(isa, Isa::detect());
}

#[test]
fn isa_names_round_trip() {
    // `RAFTER_CPU_ISA` names: every ISA by its own name, any case; others are no ISA.
    for &isa in Isa::all() {
        assert_eq!(Isa::named(isa.name()), Some(isa));
        assert_eq!(Isa::named(&isa.name().to_uppercase()), Some(isa));
    }
    assert_eq!(Isa::named("sse4"), None);
    assert_eq!(Isa::named(""), None);
}

/// Few-row products with A produced by the tasks (`sgemm_fill_a`, a 7×7-map convolution's
/// im2col) and plain ones with a forced K split (the bench's hook), against the f64
/// reference: ragged shapes (M not a multiple of any kernel's rows, N not of the 16-column
/// panel, K odd), 1, 2, 7 and 16 threads, the driver's own grid and 2, 3, 7 and 16 parts
/// of K, every epilogue (which runs once, after the reduction), B pre-packed and not.
#[test]
fn k_split_of_few_row_products() {
    let shapes = [
        (49, 4608, 512),
        (37, 1031, 203),
        (13, 777, 70),
        (96, 2049, 65),
        (1, 600, 33),
    ];
    let pars: [&dyn Parallel; 4] = [
        &Sequential,
        &ScopedThreads::new(2),
        &ScopedThreads::new(7),
        &ScopedThreads::new(16),
    ];
    let epilogues = [
        Case {
            bias: true,
            act: Activation::Relu,
            ..Case::new(0, 0, 0)
        },
        Case {
            bias: true,
            res: Some(true),
            act: Activation::GeluTanh,
            alpha: 0.5,
            ..Case::new(0, 0, 0)
        },
        Case {
            row_bias: true,
            res: Some(false),
            clamp: Some((-0.25, 0.25)),
            ..Case::new(0, 0, 0)
        },
    ];
    for isa in isas().into_iter().filter(|&i| i != Isa::Scalar) {
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            for (p, par) in pars.iter().enumerate() {
                for (e, epi) in epilogues.iter().enumerate() {
                    // One seed per shape and epilogue, not per thread split: the f64
                    // reference (most of this test's time, 4 minutes under qemu when each
                    // split drew its own operands) is then computed once and kept for every
                    // split and ISA; the splits differ in how they cut the work, not in data.
                    let seed = 900 + (s * 16 + e) as u64;
                    let case = Case { m, k, n, ..*epi };
                    let prepack = (s + p + e) % 2 == 0;
                    Case { fill: true, ..case }.run(isa, *par, prepack, seed);
                    for parts in [2, 3, 7, 16] {
                        rafter_kernels_cpu::set_few_rows_override(parts);
                        Case { fill: true, ..case }.run(isa, *par, prepack, seed);
                        case.run(isa, *par, !prepack, seed);
                        rafter_kernels_cpu::set_few_rows_override(0);
                    }
                }
            }
        }
    }
    // The scalar kernel, one shape: the split is the driver's, not a kernel's.
    for parts in [0, 3] {
        rafter_kernels_cpu::set_few_rows_override(parts);
        Case {
            fill: true,
            bias: true,
            ..Case::new(37, 1031, 203)
        }
        .run(Isa::Scalar, &ScopedThreads::new(7), true, 990);
        rafter_kernels_cpu::set_few_rows_override(0);
    }
}

/// `sgemm_fill_a`'s arguments are checked like `sgemm`'s: an error, never a panic.
#[test]
fn fill_a_argument_errors() {
    let b = vec![0f32; 8 * 5];
    let bm = MatRef::row_major(&b, 8, 5, 5).unwrap();
    let mut c = vec![0f32; 3 * 5];
    let fill = |_: std::ops::Range<usize>, d: &mut [f32]| d.fill(1.0);
    let par = Sequential;
    let isa = Isa::Scalar;
    let cm = MatMut::row_major(&mut c, 3, 5, 5).unwrap();
    let err = sgemm_fill_a_with_isa(
        isa,
        1.0,
        3,
        7,
        &fill,
        BRef::Mat(bm),
        cm,
        &Epilogue::none(),
        &par,
    );
    assert!(
        matches!(err, Err(GemmError::Shape { what: "B", .. })),
        "{err:?}"
    );
    let cm = MatMut::row_major(&mut c, 3, 5, 5).unwrap();
    let err = sgemm_fill_a_with_isa(
        isa,
        1.0,
        2,
        8,
        &fill,
        BRef::Mat(bm),
        cm,
        &Epilogue::none(),
        &par,
    );
    assert!(
        matches!(err, Err(GemmError::Shape { what: "C", .. })),
        "{err:?}"
    );
    let bias = [0f32; 4];
    let epi = Epilogue {
        bias: Some(&bias),
        ..Epilogue::none()
    };
    let cm = MatMut::row_major(&mut c, 3, 5, 5).unwrap();
    let err = sgemm_fill_a_with_isa(isa, 1.0, 3, 8, &fill, BRef::Mat(bm), cm, &epi, &par);
    assert!(
        matches!(err, Err(GemmError::Shape { what: "bias", .. })),
        "{err:?}"
    );
    // And a well-formed call computes: A of ones times B of zeros plus nothing is zero.
    c.fill(f32::NAN);
    let cm = MatMut::row_major(&mut c, 3, 5, 5).unwrap();
    sgemm_fill_a_with_isa(
        isa,
        1.0,
        3,
        8,
        &fill,
        BRef::Mat(bm),
        cm,
        &Epilogue::none(),
        &par,
    )
    .unwrap();
    assert!(c.iter().all(|&x| x == 0.0), "{c:?}");
}
