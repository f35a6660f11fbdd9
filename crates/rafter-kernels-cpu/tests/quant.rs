//! The quantized-weight products (`quant_matmul`) on every ISA available here, for every
//! weight format, against f64 references over the dequantized weights
//! (`rafter_quant::dequantize_row`, itself bit-exact with gguf-py):
//!
//! - block formats quantize x as ggml does (every path and ISA); the reference is ggml's
//!   model of the product (`common/ggml.rs`, which `quant_ggml.rs` anchors to ggml's own
//!   outputs), so the only difference is the kernels' f32 rounding: the bound allows
//!   `(blocks + 16) * 2^-23` of `Σ|w x|`, well below one unit of any block's integer dot
//!   product (which these small K make at least ~1e-5 of it), so a wrong integer anywhere
//!   fails; the float formats multiply x unrounded;
//! - and every result is also held to the product with unrounded x, within the bound the
//!   activation rounding allows (per element half a step of `amax_blk / 127`, plus the f16
//!   rounding of the 32-element blocks' scale: `Σ_k |w_k| amax_blk(k) (1/254 + 2^-11)`).
//!
//! The AMX-BF16 prefill GEMM (on by default where the CPU has it) does not round x as ggml
//! does, so every test here turns it off ([`no_amx`]): these are the AVX-512/AVX2/portable
//! kernels' tests; the AMX kernel's own (against an f64 product with unrounded x, and
//! against these kernels' errors) are in `src/quant/x86_amx_bf16.rs`.

use rafter_kernels_cpu::set_quant_amx;
use rafter_kernels_cpu::{
    quant_matmul, quant_matmul_with_isa, Activation, BlockFormat, Epilogue, GemmError, Isa, MatMut,
    MatRef, MatmulPrecision, Parallel, QuantMatRef, Residual, ScopedThreads, Sequential,
    WeightFormat, DECODE_MAX_M,
};
use rafter_quant::{dequantize_row, quantize_row};

mod common;
use common::{ggml, isas, Rng};

/// Keeps prefill products on the kernels that round x as ggml does (for the whole test
/// process: every test here wants that).
fn no_amx() {
    set_quant_amx(Some(false));
}

fn formats() -> Vec<WeightFormat> {
    let mut f = vec![WeightFormat::F32, WeightFormat::F16, WeightFormat::Bf16];
    f.extend(BlockFormat::ALL.map(WeightFormat::Block));
    f
}

/// `n x k` random weights in `format` (rows of varied scale, some all-zero blocks) and
/// their exact f32 values.
fn weights(format: WeightFormat, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut vals = Vec::with_capacity(n * k);
    for r in 0..n {
        let scale = [1.0, 0.01, 30.0, 0.5][r % 4];
        for c in 0..k {
            // Every 7th row has a zero run (an all-zero block in the block formats).
            let zero = r % 7 == 3 && (c / 32) % 3 == 1;
            vals.push(if zero { 0.0 } else { rng.f32() * scale });
        }
    }
    match format {
        WeightFormat::F32 => (vals.iter().flat_map(|v| v.to_le_bytes()).collect(), vals),
        WeightFormat::F16 => {
            let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        WeightFormat::Bf16 => {
            let h: Vec<half::bf16> = vals.iter().map(|&v| half::bf16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        WeightFormat::Block(f) => {
            let rb = f.row_bytes(k).unwrap();
            let mut bytes = vec![0u8; n * rb];
            let mut deq = vec![0.0f32; n * k];
            for r in 0..n {
                quantize_row(f, &vals[r * k..][..k], &mut bytes[r * rb..][..rb]).unwrap();
                dequantize_row(f, &bytes[r * rb..][..rb], &mut deq[r * k..][..k]).unwrap();
            }
            (bytes, deq)
        }
    }
}

struct Case<'a> {
    isa: Isa,
    format: WeightFormat,
    m: usize,
    k: usize,
    n: usize,
    par: &'a dyn Parallel,
    residual: bool,
}

fn check(c: &Case<'_>, rng: &mut Rng) {
    let (m, k, n) = (c.m, c.k, c.n);
    let (bytes, wdeq) = weights(c.format, n, k, rng);
    let mut x = rng.vec(m * k);
    // Varied magnitudes across blocks of x too.
    for (i, v) in x.iter_mut().enumerate() {
        *v *= [1.0, 4.0, 0.25][(i / 32) % 3];
    }
    let bias: Vec<f32> = rng.vec(n);
    let res: Vec<f32> = rng.vec(m * n);
    let w = QuantMatRef::new(c.format, &bytes, n, k).unwrap();
    let mut y = vec![f32::NAN; m * n];
    let epi = if c.residual {
        Epilogue {
            bias: Some(&bias),
            residual: Some(Residual::row_major(&res, n, false)),
            ..Epilogue::none()
        }
    } else {
        Epilogue::none()
    };
    quant_matmul_with_isa(
        c.isa,
        MatRef::row_major(&x, m, k, k).unwrap(),
        w,
        MatMut::row_major(&mut y, m, n, n).unwrap(),
        &epi,
        c.par,
    )
    .unwrap();
    let kind = match c.format {
        WeightFormat::Block(f) => Some(ggml::vec_dot_type(f)),
        _ => None,
    };
    let blk = kind.map(|t| t.block());
    let blocks = k / blk.unwrap_or(32).max(32);
    let xq: Vec<_> = x
        .chunks_exact(k.max(1))
        .map(|xr| kind.map(|t| ggml::quantize(t, xr)))
        .collect();
    for i in 0..m {
        for j in 0..n {
            let wr = &wdeq[j * k..][..k];
            let xr = &x[i * k..][..k];
            let mut y_unrounded = 0.0f64;
            let mut qbound = 0.0f64;
            for p in 0..k {
                y_unrounded += wr[p] as f64 * xr[p] as f64;
            }
            let (exact, mag) = match (&xq[i], c.format) {
                (Some(xq), WeightFormat::Block(f)) => {
                    let rb = f.row_bytes(k).unwrap();
                    ggml::product(&ggml::weight_row(f, &bytes[j * rb..][..rb], k), xq)
                }
                _ => (
                    y_unrounded,
                    wr.iter().zip(xr).map(|(w, x)| (w * x).abs() as f64).sum(),
                ),
            };
            if let Some(b) = blk {
                for (wb, xb) in wr.chunks(b).zip(xr.chunks(b)) {
                    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
                    qbound += wb.iter().map(|w| w.abs() as f64).sum::<f64>()
                        * amax
                        * (1.0 / 254.0 + 1.0 / 2048.0);
                }
            }
            let (extra, extra_mag) = if c.residual {
                let (b, r) = (bias[j] as f64, res[i * n + j] as f64);
                (b + r, b.abs() + r.abs() + exact.abs())
            } else {
                (0.0, 0.0)
            };
            let got = y[i * n + j] as f64;
            let tol = (blocks + 16) as f64 * f32::EPSILON as f64 * mag
                + 2.0 * f32::EPSILON as f64 * extra_mag
                + 1e-30;
            let what = format!(
                "{:?} {} m={m} k={k} n={n} threads={} residual={} y[{i}][{j}]",
                c.isa,
                c.format.name(),
                c.par.threads(),
                c.residual
            );
            assert!(
                (got - (exact + extra)).abs() <= tol,
                "{what}: got {got}, want {} (quantized-x reference), |diff| {} > tol {tol}",
                exact + extra,
                (got - exact - extra).abs()
            );
            assert!(
                (got - (y_unrounded + extra)).abs() <= qbound * 1.0001 + tol,
                "{what}: got {got}, want {} (unrounded x) within {}",
                y_unrounded + extra,
                qbound + tol
            );
        }
    }
}

fn ks(format: WeightFormat) -> Vec<usize> {
    match format.block_elems() {
        256 => vec![256, 768],
        // 3 blocks (tails of any 4-block grouping), 8 blocks, 24.
        32 => vec![96, 256, 768],
        _ => vec![1, 17, 96, 256, 771],
    }
}

#[test]
fn decode_every_format_isa_and_row_count() {
    no_amx();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let two = ScopedThreads::new(2);
    for isa in isas() {
        for format in formats() {
            for k in ks(format) {
                for (m, n) in [(1, 67), (3, 130), (4, 16), (DECODE_MAX_M, 33)] {
                    let par: &dyn Parallel = if n > 100 { &two } else { &Sequential };
                    let residual = m == 3;
                    check(
                        &Case {
                            isa,
                            format,
                            m,
                            k,
                            n,
                            par,
                            residual,
                        },
                        &mut rng,
                    );
                }
            }
        }
    }
}

#[test]
fn prefill_every_format_and_isa() {
    no_amx();
    let mut rng = Rng(0xD1B54A32D192ED03);
    let two = ScopedThreads::new(2);
    for isa in isas() {
        for format in formats() {
            let k = if format.block_elems() == 256 { 512 } else { 96 };
            check(
                &Case {
                    isa,
                    format,
                    m: 128,
                    k,
                    n: 50,
                    par: &two,
                    residual: true,
                },
                &mut rng,
            );
            check(
                &Case {
                    isa,
                    format,
                    m: DECODE_MAX_M + 1,
                    k,
                    n: 19,
                    par: &Sequential,
                    residual: false,
                },
                &mut rng,
            );
            // Every remainder of the 6- and 5-row micro-kernel tiles.
            for m in [22, 24, 25, 26] {
                let (n, par) = (33, &Sequential);
                check(
                    &Case {
                        isa,
                        format,
                        m,
                        k,
                        n,
                        par,
                        residual: false,
                    },
                    &mut rng,
                );
            }
            // Several K blocks (partial sums kept in y between them), a partial panel.
            let (m, k, n) = (21, 1280, 70);
            check(
                &Case {
                    isa,
                    format,
                    m,
                    k,
                    n,
                    par: &two,
                    residual: true,
                },
                &mut rng,
            );
        }
    }
}

#[test]
fn many_threads_split_large_weights() {
    no_amx();
    // Enough bytes to take the parallel path (>= 128 KiB), and more tasks than columns of
    // some tiles.
    let mut rng = Rng(42);
    let par = ScopedThreads::new(3);
    for format in [
        WeightFormat::Block(BlockFormat::Q4_0),
        WeightFormat::Block(BlockFormat::Q6_K),
        WeightFormat::F16,
    ] {
        check(
            &Case {
                isa: Isa::detect(),
                format,
                m: 1,
                k: 1024,
                n: 300,
                par: &par,
                residual: false,
            },
            &mut rng,
        );
    }
}

#[test]
fn empty_k_gives_the_epilogue_of_zeros() {
    no_amx();
    for format in [WeightFormat::Block(BlockFormat::Q4_K), WeightFormat::F16] {
        for m in [1, 20] {
            let (n, bias) = (70, (0..70).map(|j| j as f32).collect::<Vec<f32>>());
            let w = QuantMatRef::new(format, &[], n, 0).unwrap();
            let mut y = vec![f32::NAN; m * n];
            quant_matmul(
                MatRef::row_major(&[], m, 0, 0).unwrap(),
                w,
                MatMut::row_major(&mut y, m, n, n).unwrap(),
                &Epilogue {
                    bias: Some(&bias),
                    ..Epilogue::none()
                },
                &Sequential,
            )
            .unwrap();
            for (i, v) in y.iter().enumerate() {
                assert_eq!(*v, (i % n) as f32, "{} m={m}", format.name());
            }
        }
    }
}

#[test]
fn shape_errors_are_errors() {
    let bytes = vec![0u8; 2 * 18];
    let e = QuantMatRef::new(BlockFormat::Q4_0, &bytes, 2, 33).unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "W", .. }), "{e}");
    assert!(e.to_string().contains("q4_0"), "{e}");
    let e = QuantMatRef::new(BlockFormat::Q4_0, &bytes, 3, 32).unwrap_err();
    assert!(e.to_string().contains("54 bytes"), "{e}");
    let e = QuantMatRef::new(WeightFormat::F16, &bytes, 3, 7).unwrap_err();
    assert!(e.to_string().contains("42 bytes, the data has 36"), "{e}");
    assert!(QuantMatRef::new(BlockFormat::Q4_0, &bytes, usize::MAX, 32).is_err());

    let w = QuantMatRef::new(BlockFormat::Q4_0, &bytes, 2, 32).unwrap();
    let x = vec![0.0f32; 64];
    let mut y = vec![0.0f32; 4];
    // x has 64 columns, W rows 32.
    let e = quant_matmul(
        MatRef::row_major(&x, 1, 64, 64).unwrap(),
        w,
        MatMut::row_major(&mut y, 1, 2, 2).unwrap(),
        &Epilogue::none(),
        &Sequential,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "W", .. }), "{e}");
    // y is 2x2 but x·Wᵀ is 1x2.
    let e = quant_matmul(
        MatRef::row_major(&x, 1, 32, 32).unwrap(),
        w,
        MatMut::row_major(&mut y, 2, 2, 2).unwrap(),
        &Epilogue::none(),
        &Sequential,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "y", .. }), "{e}");
    // A bias of the wrong length.
    let bias = [0.0f32; 3];
    let e = quant_matmul(
        MatRef::row_major(&x, 1, 32, 32).unwrap(),
        w,
        MatMut::row_major(&mut y, 1, 2, 2).unwrap(),
        &Epilogue {
            bias: Some(&bias),
            ..Epilogue::none()
        },
        &Sequential,
    )
    .unwrap_err();
    assert!(matches!(e, GemmError::Shape { what: "bias", .. }), "{e}");
}

#[test]
fn strided_x_and_activation_epilogue() {
    no_amx();
    // x given transposed (column stride != 1) and a ReLU epilogue: against the same product
    // with contiguous x and the ReLU applied here.
    let mut rng = Rng(7);
    let (m, k, n) = (2, 256, 40);
    for format in [WeightFormat::Block(BlockFormat::Q4_K), WeightFormat::Bf16] {
        let (bytes, _) = weights(format, n, k, &mut rng);
        let w = QuantMatRef::new(format, &bytes, n, k).unwrap();
        let x = rng.vec(m * k);
        let xt: Vec<f32> = (0..k * m).map(|i| x[(i % m) * k + i / m]).collect();
        let mut y1 = vec![0.0f32; m * n];
        let mut y2 = vec![0.0f32; m * n];
        quant_matmul(
            MatRef::row_major(&x, m, k, k).unwrap(),
            w,
            MatMut::row_major(&mut y1, m, n, n).unwrap(),
            &Epilogue::none(),
            &Sequential,
        )
        .unwrap();
        quant_matmul(
            MatRef::row_major(&xt, k, m, m).unwrap().t(),
            w,
            MatMut::row_major(&mut y2, m, n, n).unwrap(),
            &Epilogue {
                activation: Activation::Relu,
                ..Epilogue::none()
            },
            &Sequential,
        )
        .unwrap();
        for (a, b) in y1.iter().zip(&y2) {
            assert_eq!(a.max(0.0), *b);
        }
    }
}

/// `x` rounded to bf16 (to nearest even, as `vcvtne2ps2bf16`; `half`'s conversion is an
/// independent implementation of it), back in f64.
fn bf16(v: f32) -> f64 {
    half::bf16::from_f32(v).to_f64()
}

/// [`MatmulPrecision::Bf16`]: where this CPU runs the bf16 GEMM, every prefill result is
/// the f64 product of the bf16-rounded operands within f32 accumulation error (tight
/// enough that an unrounded operand fails: its difference is ~2^-9 of the terms); the
/// decode path (few rows) and CPUs without the kernel keep unrounded products. Shapes
/// cover row blocks of 16 and 32 and their tails, K below, at and past a multiple of 32,
/// N below, at and past the 12-row panels, strided x, the epilogue, and several threads.
#[test]
fn bf16_precision_rounds_weights_and_x_to_bf16() {
    no_amx();
    let mut rng = Rng(0x5eed_bf16);
    let threads = ScopedThreads::new(3);
    let pars: [&dyn Parallel; 2] = [&Sequential, &threads];
    let mut bf16_ran = false;
    for isa in isas() {
        for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::Bf16] {
            let rounded = rafter_kernels_cpu::quant_bf16_products(isa, format);
            bf16_ran |= rounded;
            for (ci, &(m, k, n)) in [
                (4, 64, 13),
                (17, 1, 5),
                (33, 31, 12),
                (32, 32, 25),
                (69, 100, 40),
                (16, 257, 3),
                (130, 96, 1),
            ]
            .iter()
            .enumerate()
            {
                let par = pars[ci % 2];
                let (bytes, wv) = weights(format, n, k, &mut rng);
                // x with a leading dimension past K.
                let ld = k + 3;
                let x: Vec<f32> = (0..m * ld)
                    .map(|i| rng.f32() * [1.0, 8.0, 0.125][i % 3])
                    .collect();
                let bias = rng.vec(n);
                let res = rng.vec(m * n);
                let epi = Epilogue {
                    bias: Some(&bias),
                    residual: Some(Residual::row_major(&res, n, false)),
                    ..Epilogue::none()
                };
                let mut y = vec![f32::NAN; m * n];
                rafter_kernels_cpu::quant_matmul_with(
                    isa,
                    MatmulPrecision::Bf16,
                    MatRef::row_major(&x, m, k, ld).unwrap(),
                    QuantMatRef::new(format, &bytes, n, k).unwrap(),
                    MatMut::row_major(&mut y, m, n, n).unwrap(),
                    &epi,
                    par,
                )
                .unwrap();
                let bf16_path = rounded && m > 8;
                for i in 0..m {
                    for j in 0..n {
                        let (mut want, mut mag) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let (w, xv) = (wv[j * k + p], x[i * ld + p]);
                            let t = if bf16_path {
                                bf16(w) * bf16(xv)
                            } else {
                                w as f64 * xv as f64
                            };
                            want += t;
                            mag += t.abs();
                        }
                        let want = want + bias[j] as f64 + res[i * n + j] as f64;
                        let mag = mag + (bias[j].abs() + res[i * n + j].abs()) as f64;
                        let bound = (k + 16) as f64 * 2f64.powi(-23) * mag;
                        let got = y[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= bound,
                            "{isa:?} {format:?} m{m} k{k} n{n} ({i}, {j}) bf16 path {bf16_path}: \
                             {got} vs {want} (bound {bound:.2e})"
                        );
                    }
                }
            }
        }
    }
    // Where the CPU has AVX512-BF16 (this machine class: Zen 4) the kernel must have run.
    #[cfg(target_arch = "x86_64")]
    let has_bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    let has_bf16 = false;
    assert!(
        bf16_ran || !has_bf16,
        "AVX512-BF16 present but the bf16 GEMM never ran"
    );
}
