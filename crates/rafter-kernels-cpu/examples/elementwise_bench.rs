//! Micro benchmark of the softmax, layer norm, GELU and tile-interpreter kernels on BERT-base
//! shapes, against plain scalar loops, on every ISA this CPU has, with 1 and 2 threads.
//!
//! `cargo run --release -p rafter-kernels-cpu --example elementwise_bench [reps]`
//!
//! Prints the median of `reps` (default 41) timed calls per case, after warm-up. The
//! comparison against the reference executor lives in rafter-runtime (`tile` module's
//! ignored `bench_vs_reference` test), which has the reference as a dependency.

use std::hint::black_box;
use std::time::Instant;

use rafter_kernels_cpu::tile::{run_f32_with_isa, TileBinary, TileBuilder, TileUnary};
use rafter_kernels_cpu::{
    activation_in_place_with_isa, layer_norm_with_isa, softmax_with_isa, Isa, Parallel, RowMask,
    ScopedThreads, Sequential, UnaryFn, WorkerPool,
};

fn median_us(reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(977));
            ((h >> 8) % 20_001) as f32 / 5_000.0 - 2.0
        })
        .collect()
}

/// Plain loops, as one would write them without SIMD: the baseline.
mod naive {
    pub fn softmax(x: &[f32], mask: &[f32], y: &mut [f32], cols: usize) {
        for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
            let mut m = f32::NEG_INFINITY;
            for j in 0..cols {
                yr[j] = xr[j] + mask[j];
                m = m.max(yr[j]);
            }
            let mut s = 0.0;
            for v in yr.iter_mut() {
                *v = (*v - m).exp();
                s += *v;
            }
            for v in yr.iter_mut() {
                *v /= s;
            }
        }
    }

    pub fn layer_norm(x: &[f32], y: &mut [f32], cols: usize, g: &[f32], b: &[f32]) {
        for (xr, yr) in x.chunks(cols).zip(y.chunks_mut(cols)) {
            let n = cols as f32;
            let mean = xr.iter().sum::<f32>() / n;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
            let inv = 1.0 / (var + 1e-12).sqrt();
            for j in 0..cols {
                yr[j] = (xr[j] - mean) * inv * g[j] + b[j];
            }
        }
    }

    /// Abramowitz & Stegun 7.1.26, scalar.
    fn erf(x: f32) -> f32 {
        let a = x.abs();
        let t = 1.0 / (1.0 + 0.327_591_1 * a);
        let p = t
            * (0.254_829_6
                + t * (-0.284_496_72 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
        (1.0 - p * (-a * a).exp()).copysign(x)
    }

    pub fn gelu(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(41);
    let isas: Vec<Isa> = Isa::all()
        .iter()
        .copied()
        .filter(|i| i.is_available())
        .collect();
    let two = ScopedThreads::new(2);
    let pool = WorkerPool::new(2).expect("worker threads");
    let pars: [(&str, &dyn Parallel); 3] = [("1t", &Sequential), ("2t", &two), ("2p", &pool)];
    println!("1t: calling thread; 2t: ScopedThreads(2), spawns per call; 2p: WorkerPool(2)");
    println!("median of {reps} calls, microseconds");

    // Softmax: scores [12, 128, 128] + mask [1, 1, 1, 128].
    let (h, q, k) = (12, 128, 128);
    let x = data(h * q * k, 1);
    let mut mask = data(k, 2);
    mask[100..].fill(-10_000.0);
    let mut y = vec![0.0; x.len()];
    let t = median_us(reps, || naive::softmax(&x, &mask, &mut y, k));
    println!("softmax+mask [12,128,128]  naive 1t: {t:9.1}");
    let m = RowMask::broadcast(&mask, &[1, h, q], &[1, 1, 1, k], k).unwrap();
    for &isa in &isas {
        for (pn, par) in pars {
            let t2 = median_us(reps, || {
                softmax_with_isa(isa, &x, &mut y, k, Some(&m), par).unwrap()
            });
            println!(
                "softmax+mask [12,128,128]  {isa:?} {pn}: {t2:9.1}  ({:.1}x naive)",
                t / t2
            );
        }
    }

    // Layer norm [128, 768].
    let (rows, cols) = (128, 768);
    let x = data(rows * cols, 3);
    let g = data(cols, 4);
    let b = data(cols, 5);
    let mut y = vec![0.0; x.len()];
    let t = median_us(reps, || naive::layer_norm(&x, &mut y, cols, &g, &b));
    println!("layer_norm [128,768]       naive 1t: {t:9.1}");
    for &isa in &isas {
        for (pn, par) in pars {
            let t2 = median_us(reps, || {
                layer_norm_with_isa(isa, &x, &mut y, cols, &g, Some(&b), 1e-12, par).unwrap()
            });
            println!(
                "layer_norm [128,768]       {isa:?} {pn}: {t2:9.1}  ({:.1}x naive)",
                t / t2
            );
        }
    }

    // GELU (erf) [128, 3072]: in-place activation, and the tile interpreter running the
    // fused program and an unfused 5-instruction chain (x*(1/√2), erf, +1, *x, *0.5 with
    // the erf result kept alive so the fusion does not apply).
    let x = data(128 * 3072, 6);
    let mut y = x.clone();
    let t = median_us(reps, || {
        y.copy_from_slice(&x);
        naive::gelu(black_box(&mut y))
    });
    println!("gelu_erf [128,3072]        naive 1t: {t:9.1}  (incl. copy)");
    let mut fused = TileBuilder::new(1);
    let xin = fused.input(0);
    let gv = fused.unary(TileUnary::GeluErf, xin);
    let fused = fused.finish(gv).unwrap();
    let mut chain = TileBuilder::new(1);
    let xin = chain.input(0);
    let w = chain.binary(
        TileBinary::Mul,
        xin,
        chain.scalar(std::f32::consts::FRAC_1_SQRT_2),
    );
    let e = chain.unary(TileUnary::Erf, w);
    let p = chain.binary(TileBinary::Add, e, chain.scalar(1.0));
    let mx = chain.binary(TileBinary::Mul, p, xin);
    let hv = chain.binary(TileBinary::Mul, mx, chain.scalar(0.5));
    let zero = chain.binary(TileBinary::Mul, e, chain.scalar(0.0));
    let out = chain.binary(TileBinary::Add, hv, zero);
    let chain = chain.finish(out).unwrap();
    let dims = [128usize, 3072];
    for &isa in &isas {
        for (pn, par) in pars {
            let t2 = median_us(reps, || {
                y.copy_from_slice(&x);
                activation_in_place_with_isa(isa, UnaryFn::GeluErf, &mut y, par).unwrap()
            });
            let t3 = median_us(reps, || {
                run_f32_with_isa(isa, &fused, &[(&x, &dims)], &mut y, &dims, par).unwrap()
            });
            let t4 = median_us(reps, || {
                run_f32_with_isa(isa, &chain, &[(&x, &dims)], &mut y, &dims, par).unwrap()
            });
            println!(
                "gelu_erf [128,3072]        {isa:?} {pn}: in-place {t2:9.1} ({:.1}x naive), \
                 tile fused {t3:9.1}, tile 7-op chain {t4:9.1}",
                t / t2
            );
        }
    }

    // Tile: bias add [128, 768] + [768] and scores + mask [12,128,128] + [128].
    let x = data(128 * 768, 7);
    let bias = data(768, 8);
    let mut y = vec![0.0; x.len()];
    let mut add = TileBuilder::new(2);
    let s = add.binary(TileBinary::Add, add.input(0), add.input(1));
    let add = add.finish(s).unwrap();
    let t = median_us(reps, || {
        for (yr, xr) in y.chunks_mut(768).zip(x.chunks(768)) {
            for j in 0..768 {
                yr[j] = xr[j] + bias[j];
            }
        }
        black_box(&y);
    });
    println!("bias add [128,768]+[768]   naive 1t: {t:9.1}");
    for &isa in &isas {
        for (pn, par) in pars {
            let ins: [(&[f32], &[usize]); 2] = [(&x, &[128, 768]), (&bias, &[768])];
            let t2 = median_us(reps, || {
                run_f32_with_isa(isa, &add, &ins, &mut y, &[128, 768], par).unwrap()
            });
            println!(
                "bias add [128,768]+[768]   {isa:?} {pn}: {t2:9.1}  ({:.1}x naive)",
                t / t2
            );
        }
    }
}
