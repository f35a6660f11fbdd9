//! The quantized-weight products compute what ggml computes, on every path and ISA.
//!
//! llama.cpp multiplies a block-format weight by activations quantized to its
//! `vec_dot_type` (Q8_0 with an f16 scale per 32, Q8_1 with an f16 scale and f16 sum per
//! 32, Q8_K with an f32 scale per 256), on the decode and the prefill path alike. The model
//! in `common/ggml.rs` writes that quantization out independently of the kernels, and:
//! - [`activation_model_is_ggmls`] holds the model to ggml's own quantizer, byte for byte
//!   (`data/ggml_products.txt`, made by `data/gen_ggml_products.py` from llama.cpp's
//!   x86-64 build);
//! - [`products_equal_ggmls_vec_dot`] holds `quant_matmul` to ggml's own dot products on
//!   those rows, for every format ggml has one for, ISA and path (M = 1, 3, 16 decode;
//!   17, 128 prefill);
//! - [`every_format_path_and_isa_follows_ggml`] holds every block format, ISA, path and
//!   several K to the f64 evaluation of the model, within a few f32 ulps ([`tol`]) of the
//!   accumulated magnitude `Σ |w_k x_k|`, and shows the bound is tight enough to reject
//!   the model's near misses: f32 instead of f16 activation scales, and the K formats'
//!   activations quantized per 32 instead of per 256 (what the prefill GEMM used to do).

use std::collections::HashMap;

use rafter_kernels_cpu::{
    quant_matmul_with_isa, BlockFormat, Epilogue, Isa, MatMut, MatRef, Parallel, QuantMatRef,
    ScopedThreads, Sequential, DECODE_MAX_M,
};
use rafter_quant::quantize_row;

mod common;
use common::ggml::{self, ActType, Variant};
use common::{isas, Rng};

/// The row counts tested: 1, 3 and [`DECODE_MAX_M`] run the decode path, 17 and 128 the
/// prefill path.
const MS: [usize; 5] = [1, 3, DECODE_MAX_M, DECODE_MAX_M + 1, 128];

/// How far a product of K elements may be from the f64 model: `8 + sqrt(K)` f32 ulps
/// (units of 2^-24) of the accumulated magnitude `mag = Σ |w_k x_k|`. The integer kernels
/// round each block's scale product once and add a few partial sums per lane; the widened
/// f32 GEMM (prefill without VNNI) adds K products in one chain per output, whose rounding
/// errors grow like `sqrt(K)`. Measured here (Zen 5): at most ~2.8 ulps on the decode
/// paths, ~4.1 on the VNNI GEMM and ~10.6 on the widened GEMM at K = 1280 (bound 43.8),
/// printed by [`every_format_path_and_isa_follows_ggml`]. The near misses it must reject
/// are ~100x larger (f16 rounding of a scale is 2^-12 relative).
fn tol(mag: f64, k: usize) -> f64 {
    (8.0 + (k as f64).sqrt()) * f64::from(f32::EPSILON) / 2.0 * mag + 1e-30
}

/// `y = x · Wᵀ` on `isa`'s kernels, x being `m` rows of W's K.
fn product(isa: Isa, x: &[f32], m: usize, w: QuantMatRef<'_>, par: &dyn Parallel) -> Vec<f32> {
    let (k, n) = (w.k(), w.n());
    let mut y = vec![f32::NAN; m * n];
    // The AMX-BF16 prefill GEMM does not round x as ggml does; these tests hold the other
    // kernels to ggml's model (the AMX kernel's tests are in its module).
    rafter_kernels_cpu::set_quant_amx(Some(false));
    quant_matmul_with_isa(
        isa,
        MatRef::row_major(x, m, k, k).unwrap(),
        w,
        MatMut::row_major(&mut y, m, n, n).unwrap(),
        &Epilogue::none(),
        par,
    )
    .unwrap();
    y
}

/// `data/ggml_products.txt`, parsed.
struct Fixture {
    k: usize,
    x: Vec<Vec<f32>>,
    act: HashMap<(String, usize), Vec<u8>>,
    w: HashMap<String, Vec<Vec<u8>>>,
    dot: HashMap<(String, usize), Vec<f32>>,
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex_f32s<'a>(words: impl Iterator<Item = &'a str>) -> Vec<f32> {
    words
        .map(|w| f32::from_bits(u32::from_str_radix(w, 16).unwrap()))
        .collect()
}

fn fixture() -> Fixture {
    let text = include_str!("data/ggml_products.txt");
    let mut f = Fixture {
        k: 0,
        x: vec![],
        act: HashMap::new(),
        w: HashMap::new(),
        dot: HashMap::new(),
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut it = line.split_whitespace();
        match it.next().unwrap() {
            "k" => f.k = it.next().unwrap().parse().unwrap(),
            "x" => {
                let r: usize = it.next().unwrap().parse().unwrap();
                assert_eq!(r, f.x.len());
                f.x.push(hex_f32s(it));
            }
            "act" => {
                let (name, r) = (it.next().unwrap(), it.next().unwrap().parse().unwrap());
                f.act
                    .insert((name.to_string(), r), hex_bytes(it.next().unwrap()));
            }
            "w" => {
                let name = it.next().unwrap().to_string();
                let _row = it.next();
                f.w.entry(name)
                    .or_default()
                    .push(hex_bytes(it.next().unwrap()));
            }
            "dot" => {
                let (name, r) = (it.next().unwrap(), it.next().unwrap().parse().unwrap());
                f.dot.insert((name.to_string(), r), hex_f32s(it));
            }
            other => panic!("ggml_products.txt: unknown line kind {other:?}"),
        }
    }
    assert!(
        f.k > 0 && f.x.len() == 6 && f.w.len() == 10,
        "ggml_products.txt is incomplete"
    );
    f
}

#[test]
fn activation_model_is_ggmls() {
    let f = fixture();
    for kind in [ActType::Q8_0, ActType::Q8_1, ActType::Q8_K] {
        for (r, x) in f.x.iter().enumerate() {
            let want = &f.act[&(kind.name().to_string(), r)];
            let got = ggml::to_bytes(&ggml::quantize(kind, x));
            assert!(
                &got == want,
                "{} of x row {r}: the model's bytes differ from ggml's at byte {}",
                kind.name(),
                got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0)
            );
        }
    }
    // Row 1 holds rounding ties: the portable `_ref` quantizer's `roundf` would give other
    // quants there, so the fixture does pin the x86 rounding.
    let x = &f.x[1];
    let roundf: Vec<i8> = x
        .chunks(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let id = 1.0 / (amax / 127.0);
            b.iter().map(move |v| (v * id).round() as i8)
        })
        .collect();
    assert_ne!(roundf, ggml::quantize(ActType::Q8_0, x).q);
}

#[test]
fn products_equal_ggmls_vec_dot() {
    let f = fixture();
    let two = ScopedThreads::new(2);
    let k = f.k;
    let mut worst = 0.0f64;
    for isa in isas() {
        for (name, rows) in &f.w {
            let format = BlockFormat::named(name).unwrap();
            let kind = ggml::vec_dot_type(format);
            let n = rows.len();
            let w: Vec<u8> = rows.concat();
            let wrows: Vec<_> = rows
                .iter()
                .map(|b| ggml::weight_row(format, b, k))
                .collect();
            for m in MS {
                // Row i of x is fixture row i % 6.
                let x: Vec<f32> = (0..m).flat_map(|i| f.x[i % f.x.len()].clone()).collect();
                let par: &dyn Parallel = if m > 64 { &two } else { &Sequential };
                let y = product(isa, &x, m, QuantMatRef::new(format, &w, n, k).unwrap(), par);
                for i in 0..m {
                    let r = i % f.x.len();
                    let xq = ggml::quantize(kind, &f.x[r]);
                    let want = &f.dot[&(name.clone(), r)];
                    for j in 0..n {
                        let (model, mag) = ggml::product(&wrows[j], &xq);
                        let (got, ggml) = (y[i * n + j] as f64, want[j] as f64);
                        let what = format!("{isa:?} {name} m={m} y[{i}][{j}] (x row {r})");
                        // ggml's result carries its own f32 rounding: twice the bound.
                        assert!(
                            (got - ggml).abs() <= 2.0 * tol(mag, k),
                            "{what}: got {got}, ggml's vec_dot {ggml}, model {model}, \
                             |diff| {} > {}",
                            (got - ggml).abs(),
                            2.0 * tol(mag, k)
                        );
                        assert!(
                            (ggml - model).abs() <= tol(mag, k),
                            "{what}: ggml's vec_dot {ggml} is off the model {model}"
                        );
                        worst =
                            worst.max((got - ggml).abs() / (mag * f64::from(f32::EPSILON) / 2.0));
                    }
                }
            }
        }
    }
    println!("largest |rafter - ggml| over the fixture: {worst:.2} ulps of the magnitude");
}

/// `n x k` weights in `format` from random values (rows of varied scale, some all-zero
/// blocks).
fn weights(format: BlockFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = format.row_bytes(k).unwrap();
    let mut bytes = vec![0u8; n * rb];
    for (r, row) in bytes.chunks_exact_mut(rb).enumerate() {
        let scale = [1.0, 0.01, 30.0, 0.5][r % 4];
        let vals: Vec<f32> = (0..k)
            .map(|c| {
                let zero = r % 7 == 3 && (c / 32) % 3 == 1;
                if zero {
                    0.0
                } else {
                    rng.f32() * scale
                }
            })
            .collect();
        quantize_row(format, &vals, row).unwrap();
    }
    bytes
}

/// Activations: random, a different magnitude per 32 elements, a zero block in some rows
/// and rounding ties (`127` and half-integers) in others.
fn activations(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x = rng.vec(m * k);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= [1.0, 4.0, 0.25, 30.0, 0.02][(i / 32) % 5];
    }
    for (r, row) in x.chunks_exact_mut(k).enumerate() {
        match r % 4 {
            1 => row[32..64].fill(0.0),
            2 => {
                for (c, v) in row[..64].iter_mut().enumerate() {
                    *v = if c % 32 == 5 {
                        127.0
                    } else {
                        (*v * 100.0).round() + 0.5
                    };
                }
            }
            _ => {}
        }
    }
    x
}

/// Per format: outputs checked, and how many the bound would reject had the activations
/// been quantized by the near-miss variant of the model.
#[derive(Default)]
struct Tally {
    outputs: usize,
    variant_rejected: usize,
}

#[test]
fn every_format_path_and_isa_follows_ggml() {
    let mut rng = Rng(0x2545F4914F6CDD1D);
    let two = ScopedThreads::new(2);
    let n = 70;
    let mut worst: HashMap<(String, &str), f64> = HashMap::new();
    let mut tally: HashMap<(BlockFormat, usize), Tally> = HashMap::new();
    for isa in isas() {
        for format in BlockFormat::ALL {
            let kind = ggml::vec_dot_type(format);
            let variant = if kind == ActType::Q8_K {
                Variant::Per32
            } else {
                Variant::F32Scale
            };
            let ks: &[usize] = if format.block_elems() == 256 {
                &[256, 1280]
            } else {
                &[96, 256, 1280]
            };
            for &k in ks {
                let w = weights(format, n, k, &mut rng);
                let rb = format.row_bytes(k).unwrap();
                let wrows: Vec<_> = w
                    .chunks_exact(rb)
                    .map(|b| ggml::weight_row(format, b, k))
                    .collect();
                for m in MS {
                    let x = activations(m, k, &mut rng);
                    let par: &dyn Parallel = if m > 64 { &two } else { &Sequential };
                    let y = product(isa, &x, m, QuantMatRef::new(format, &w, n, k).unwrap(), par);
                    let t = tally.entry((format, k)).or_default();
                    for (i, xr) in x.chunks_exact(k).enumerate() {
                        let xq = ggml::quantize(kind, xr);
                        let xv = ggml::quantize_variant(kind, xr, variant);
                        for (j, wr) in wrows.iter().enumerate() {
                            let (want, mag) = ggml::product(wr, &xq);
                            let got = y[i * n + j] as f64;
                            assert!(
                                (got - want).abs() <= tol(mag, k),
                                "{isa:?} {} k={k} m={m} y[{i}][{j}]: got {got}, ggml's model \
                                 {want}, |diff| {} > {} ({:.1} ulps of the magnitude)",
                                format.name(),
                                (got - want).abs(),
                                tol(mag, k),
                                (got - want).abs() / (mag * f64::from(f32::EPSILON) / 2.0)
                            );
                            let path = if m <= DECODE_MAX_M {
                                "decode"
                            } else {
                                "prefill"
                            };
                            let e = worst.entry((format!("{isa:?}"), path)).or_default();
                            *e = e.max((got - want).abs() / (mag * f64::from(f32::EPSILON) / 2.0));
                            let (near, _) = ggml::product(wr, &xv);
                            t.outputs += 1;
                            t.variant_rejected += usize::from((got - near).abs() > tol(mag, k));
                        }
                    }
                }
            }
        }
    }
    let mut paths: Vec<_> = worst.iter().collect();
    paths.sort_by(|a, b| a.0.cmp(b.0));
    for ((isa, path), e) in paths {
        println!("{isa} {path}: largest |rafter - model| {e:.2} ulps of the magnitude");
    }
    // The bound rejects the near misses: most outputs at K = 256 would fail it.
    let mut keys: Vec<_> = tally.keys().copied().collect();
    keys.sort_by_key(|(f, k)| (f.name(), *k));
    for key in keys {
        let t = &tally[&key];
        let share = t.variant_rejected as f64 / t.outputs as f64;
        println!(
            "{} k={}: {:.0}% of {} outputs would fail with {}",
            key.0.name(),
            key.1,
            100.0 * share,
            t.outputs,
            if ggml::vec_dot_type(key.0) == ActType::Q8_K {
                "activations per 32"
            } else {
                "f32 activation scales"
            }
        );
        if key.1 == 256 {
            assert!(
                share > 0.5,
                "{} k=256: only {:.0}% of outputs tell the variant apart",
                key.0.name(),
                100.0 * share
            );
        }
    }
}
