//! The quantized-weight products (`quant_matmul`) on the shapes of a Qwen3-0.6B decode step
//! (M = 1) or prefill (`--m 128`), per weight format, against this machine's measured memory
//! read bandwidth (decode) or the f32 micro-kernel's peak (prefill).
//!
//! Weights stream from memory as in a model: every call uses the next of enough copies of
//! its weight to exceed the caches (`--cold MB`, 256 by default). The machine is shared, so
//! the formats alternate within every round and the table reports medians over rounds of
//! the per-call time. GB/s counts the weight bytes of the format itself. The read bandwidth
//! is measured in the same run with the same threads (a vectorised sum, best of
//! 10 over 256 MiB, half of them with software prefetching), before and after the table.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --threads 1,2 --rounds 9
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --m 128 --rounds 5
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --formats all --isa avx2
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --formats f16 --dense-rows 1,4
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --m 128 --amx 0,1
//! cargo bench -p rafter-kernels-cpu --bench quant_gemv -- --m 128 --formats f16 --hot --amx-ks 1000,8
//! ```

use std::hint::black_box;
use std::time::Instant;

use rafter_kernels_cpu::{
    bench_micro_kernel, quant_amx_available, quant_amx_peak, quant_matmul_with, set_quant_amx,
    set_quant_amx_k_steps, set_quant_decode_max_m, set_quant_dense_rows, set_quant_gemm_rows,
    set_quant_prefetch_distance, BlockFormat, Epilogue, Isa, MatMut, MatRef, MatmulPrecision,
    Parallel, QuantMatRef, WeightFormat, WorkerPool,
};

/// (K, N) of the products of one Qwen3-0.6B decoder step (q/k/v/o, gate/up/down) and the
/// tied LM head.
const SHAPES: &[(usize, usize, &str)] = &[
    (1024, 2048, "q_proj"),
    (1024, 1024, "k/v_proj"),
    (2048, 1024, "o_proj"),
    (1024, 3072, "gate/up"),
    (3072, 1024, "down"),
    (1024, 151936, "lm_head"),
    // Not a model shape: 64 weight rows, so the time is the per-call overhead (activation
    // quantization and rearrangement, task start); run it with `--shapes overhead`.
    (3072, 64, "overhead"),
    // The tiny Llama fixture's products (hidden 256, 4 query / 1 KV heads of 64, FFN 1024,
    // vocab 128,256), with `--shapes tiny_qo,tiny_kv,tiny_gateup,tiny_down,tiny_lmhead`.
    (256, 256, "tiny_qo"),
    (256, 64, "tiny_kv"),
    (256, 1024, "tiny_gateup"),
    (1024, 256, "tiny_down"),
    (256, 128256, "tiny_lmhead"),
];

fn rnd(seed: &mut u64, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// A weight copy: on the heap, or (`--mmap`) written to a file and memory-mapped, as a
/// model's GGUF weights are (page-cache pages, not anonymous memory).
enum Weights {
    Heap(Vec<u8>),
    Map(memmap2::Mmap),
}

impl Weights {
    fn new(bytes: &[u8], file: Option<usize>) -> Weights {
        let Some(i) = file else {
            return Weights::Heap(bytes.to_vec());
        };
        let path = std::env::temp_dir().join(format!("quant_gemv_{}_{i}.bin", std::process::id()));
        std::fs::write(&path, bytes).expect("write the weight file");
        let f = std::fs::File::open(&path).expect("open the weight file");
        // SAFETY: the file is this run's own, never written again while mapped.
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&f) }.expect("mmap");
        let _ = std::fs::remove_file(&path);
        Weights::Map(map)
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Weights::Heap(v) => v,
            Weights::Map(m) => m,
        }
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `n x k` weights in `format`, built from random floats.
fn weights(format: WeightFormat, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let rb = format.row_bytes(k).unwrap();
    let mut out = vec![0u8; n * rb];
    // Rows in chunks, so the f32 source stays small for the LM head.
    for (r0, chunk) in out.chunks_mut(rb * 256).enumerate() {
        let rows = chunk.len() / rb;
        let src = rnd(seed, rows * k);
        let _ = r0;
        match format {
            WeightFormat::F32 => {
                for (o, v) in chunk.chunks_exact_mut(4).zip(&src) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            WeightFormat::F16 => {
                for (o, v) in chunk.chunks_exact_mut(2).zip(&src) {
                    o.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            WeightFormat::Bf16 => {
                for (o, v) in chunk.chunks_exact_mut(2).zip(&src) {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            WeightFormat::Block(f) => {
                for (o, s) in chunk.chunks_exact_mut(rb).zip(src.chunks_exact(k)) {
                    rafter_quant::quantize_row(f, s, o).unwrap();
                }
            }
        }
    }
    out
}

/// Sums `x` with four AVX-512 (or AVX2) accumulators: a pure streaming read, prefetching
/// `pf` bytes ahead when non-zero (on a loaded machine software prefetching raised the
/// streaming read itself by up to a third, so the bench reports the better of both).
/// Other targets sum in scalar code, without prefetching.
fn read_sum(
    x: &[f32],
    #[cfg_attr(not(target_arch = "x86_64"), expect(unused_variables))] pf: usize,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn sum512(x: &[f32], pf: usize) -> f32 {
            let mut a = [_mm512_setzero_ps(); 8];
            for c in x.chunks_exact(128) {
                if pf > 0 {
                    for l in 0..8 {
                        let p = c
                            .as_ptr()
                            .wrapping_add(16 * l)
                            .cast::<i8>()
                            .wrapping_add(pf);
                        // A prefetch hint, never dereferenced (safe inside the
                        // target-feature function).
                        _mm_prefetch::<_MM_HINT_T0>(p);
                    }
                }
                for (i, ai) in a.iter_mut().enumerate() {
                    // SAFETY: 16 floats of the 128-float chunk.
                    *ai = _mm512_add_ps(*ai, unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * i)) });
                }
            }
            let s = a
                .iter()
                .fold(_mm512_setzero_ps(), |s, v| _mm512_add_ps(s, *v));
            _mm512_reduce_add_ps(s)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F checked.
            return unsafe { sum512(x, pf) };
        }
    }
    x.iter().sum()
}

/// Read bandwidth in GB/s of `threads` tasks summing their part of `buf`: best of 5 runs
/// each without and with software prefetching.
fn read_bw(buf: &[f32], par: &dyn Parallel, threads: usize) -> f64 {
    let mut best = f64::MAX;
    for run in 0..10 {
        let pf = if run % 2 == 0 { 0 } else { 8192 };
        let t = Instant::now();
        par.run(threads, &|i| {
            let part = &buf[i * buf.len() / threads..(i + 1) * buf.len() / threads];
            black_box(read_sum(part, pf));
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    (buf.len() * 4) as f64 / best / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let rounds: usize = arg("--rounds").map_or(7, |r| r.parse().expect("--rounds N"));
    let threads: Vec<usize> = arg("--threads")
        .map_or("1,2".to_string(), |s| s.clone())
        .split(',')
        .map(|t| t.parse().expect("--threads 1,2"))
        .collect();
    let m: usize = arg("--m").map_or(1, |r| r.parse().expect("--m M"));
    let cold: usize = arg("--cold").map_or(256, |r| r.parse().expect("--cold MB")) << 20;
    // `--hot`: one copy of each weight (cache-resident when small), minimum over rounds:
    // the kernels' own throughput, robust to a loaded machine's preemptions.
    let hot = args.iter().any(|a| a == "--hot");
    let mapped = args.iter().any(|a| a == "--mmap");
    let cold = if hot { 0 } else { cold };
    let isa = arg("--isa").map_or(Isa::detect(), |s| Isa::named(s).expect("--isa name"));
    let fmt_arg = arg("--formats").map_or("f16,q8_0,q4_0,q4_K,q6_K".to_string(), |s| s.clone());
    let shape_filter = arg("--shapes").cloned();
    // `--prefetch B1,B2,..`: the decode kernels' prefetch distances to compare (each format
    // runs once per distance within every round; 0 turns prefetching off).
    let distances: Vec<Option<usize>> = arg("--prefetch").map_or(vec![None], |d| {
        d.split(',')
            .map(|v| Some(v.parse().expect("--prefetch B1,B2")))
            .collect()
    });
    // `--gemm-rows R1,R2`: the int8 GEMM micro-kernel's rows to compare (as `--prefetch`).
    let gemm_rows: Vec<Option<usize>> = arg("--gemm-rows").map_or(vec![None], |d| {
        d.split(',')
            .map(|v| Some(v.parse().expect("--gemm-rows R1,R2")))
            .collect()
    });
    // `--dense-rows 1,4`: the dense (f32/f16/bf16) decode kernels reading one weight row a
    // pass (1) or several (anything else, the default), compared as `--prefetch`.
    let dense_rows: Vec<Option<usize>> = arg("--dense-rows").map_or(vec![None], |d| {
        d.split(',')
            .map(|v| Some(v.parse().expect("--dense-rows R1,R2")))
            .collect()
    });
    // `--amx 0,1`: the prefill GEMM on the AVX-512 kernels (0) or AMX-BF16 tiles (1, where
    // available), compared as `--prefetch`.
    let amx: Vec<Option<bool>> = arg("--amx").map_or(vec![None], |d| {
        d.split(',')
            .map(|v| Some(v.parse::<u8>().expect("--amx 0,1") == 1))
            .collect()
    });
    // `--amx-ks S1,S2`: the AMX GEMM's steps (32 elements of K) per K-block to compare (as
    // `--prefetch`; at least K / 32: no K-blocking, C in the tile registers over all of K).
    let amx_ks: Vec<Option<usize>> = arg("--amx-ks").map_or(vec![None], |d| {
        d.split(',')
            .map(|v| Some(v.parse().expect("--amx-ks S1,S2")))
            .collect()
    });
    // `--precision f32,bf16`: the float formats' prefill products (`MatmulPrecision`),
    // compared as `--prefetch`.
    let precisions: Vec<MatmulPrecision> =
        arg("--precision").map_or(vec![MatmulPrecision::F32], |d| {
            d.split(',')
                .map(|v| MatmulPrecision::from_name(v).expect("--precision f32,bf16"))
                .collect()
        });
    if amx.contains(&Some(true)) && !quant_amx_available() {
        println!("AMX-BF16 is not available here: `amx1` runs the AVX-512 kernels");
    }
    // `--decode-max-m M`: rows up to which the decode path runs (crossover measurements).
    if let Some(d) = arg("--decode-max-m") {
        set_quant_decode_max_m(d.parse().expect("--decode-max-m M"));
    }
    let formats: Vec<WeightFormat> = if fmt_arg == "all" {
        let mut v = vec![WeightFormat::F32, WeightFormat::F16, WeightFormat::Bf16];
        v.extend(BlockFormat::ALL.map(WeightFormat::Block));
        v
    } else {
        fmt_arg
            .split(',')
            .map(|s| match s {
                "f32" => WeightFormat::F32,
                "f16" => WeightFormat::F16,
                "bf16" => WeightFormat::Bf16,
                _ => WeightFormat::Block(BlockFormat::named(s).expect("--formats name")),
            })
            .collect()
    };
    let max_threads = *threads.iter().max().unwrap();
    let pools: Vec<(usize, WorkerPool)> = threads
        .iter()
        .map(|&t| (t, WorkerPool::new(t).unwrap()))
        .collect();
    // 256 MiB, the size the weights rotate through.
    let bw_buf = vec![1.0f32; 1 << 26];
    let bw_before: Vec<f64> = pools.iter().map(|(t, p)| read_bw(&bw_buf, p, *t)).collect();
    for ((t, _), bw) in pools.iter().zip(&bw_before) {
        println!("read bandwidth, {t} thread(s): {bw:.1} GB/s (best of 10, 256 MiB)");
    }
    let peak1 = if m > 1 {
        let g = bench_micro_kernel(isa, 256, 2_000_000);
        println!("f32 micro-kernel peak, 1 thread: {g:.0} GFLOP/s (prefill fractions are of threads x this)");
        g
    } else {
        0.0
    };
    if m > 1 {
        if let Some(g) = quant_amx_peak(2_000_000) {
            println!("AMX-BF16 tdpbf16ps peak, 1 thread: {g:.0} GFLOP/s (f16 weights take 5 products, bf16 3, block formats 3)");
        }
    }
    if hot {
        println!("{isa:?}, M = {m}, {rounds} rounds, one copy of each weight; minimum per call");
    } else {
        println!(
            "{isa:?}, M = {m}, {rounds} rounds, weights rotated through >= {} MiB; median per call",
            cold >> 20
        );
    }
    println!(
        "{:<8} {:<16} {:<6} {:>10} {:>9} {:>8}",
        "threads",
        "shape KxN",
        "format",
        "us",
        if m == 1 { "GB/s" } else { "GFLOP/s" },
        if m == 1 { "of read" } else { "of f32pk" },
    );
    let mut seed = 0x1234_5678_9abc_def1u64;
    let x = rnd(&mut seed, m * 3072);
    for &(k, n, name) in SHAPES {
        match &shape_filter {
            Some(f) if !f.split(',').any(|s| s == name) => continue,
            None if name == "overhead" || name.starts_with("tiny_") => continue,
            _ => {}
        }
        // Every format's copies, generated once per shape.
        let copies: Vec<Vec<Weights>> = formats
            .iter()
            .map(|&f| {
                let one = weights(f, n, k, &mut seed);
                let c = cold.div_ceil(one.len()).max(1);
                (0..c)
                    .map(|i| Weights::new(&one, mapped.then_some(i)))
                    .collect()
            })
            .collect();
        // Contenders: (format index, prefetch distance, GEMM rows, dense rows, AMX, AMX
        // K-steps, precision).
        let mut contenders = Vec::new();
        for fi in 0..formats.len() {
            for &d in &distances {
                for &g in &gemm_rows {
                    for &dr in &dense_rows {
                        for &a in &amx {
                            for &ks in &amx_ks {
                                for &pr in &precisions {
                                    contenders.push((fi, d, g, dr, a, ks, pr));
                                }
                            }
                        }
                    }
                }
            }
        }
        let mut y = vec![0.0f32; m * n];
        for (pi, (t, pool)) in pools.iter().enumerate() {
            let mut times = vec![Vec::new(); contenders.len()];
            for round in 0..rounds + 1 {
                for ci in 0..contenders.len() {
                    let ci = (ci + round) % contenders.len();
                    let (fi, dist, rows, drows, a, ks, pr) = contenders[ci];
                    set_quant_amx(a);
                    set_quant_amx_k_steps(ks.unwrap_or(0));
                    if let Some(r) = drows {
                        set_quant_dense_rows(r);
                    }
                    if let Some(d) = dist {
                        set_quant_prefetch_distance(d);
                    }
                    if let Some(r) = rows {
                        set_quant_gemm_rows(r);
                    }
                    let f = formats[fi];
                    let start = Instant::now();
                    for w in &copies[fi] {
                        let wr = QuantMatRef::new(f, w.bytes(), n, k).unwrap();
                        quant_matmul_with(
                            isa,
                            pr,
                            MatRef::row_major(&x[..m * k], m, k, k).unwrap(),
                            wr,
                            MatMut::row_major(&mut y, m, n, n).unwrap(),
                            &Epilogue::none(),
                            pool,
                        )
                        .unwrap();
                    }
                    black_box(&y);
                    if round > 0 {
                        times[ci].push(start.elapsed().as_secs_f64() / copies[fi].len() as f64);
                    }
                }
            }
            for (ci, &(fi, dist, rows, drows, a, ks, pr)) in contenders.iter().enumerate() {
                let f = &formats[fi];
                let s = if hot {
                    times[ci].iter().cloned().fold(f64::MAX, f64::min)
                } else {
                    median(&times[ci])
                };
                let bytes = copies[fi][0].bytes().len() as f64;
                let (rate, frac) = if m == 1 {
                    let gbs = bytes / s / 1e9;
                    (gbs, gbs / bw_before[pi])
                } else {
                    let gf = 2.0 * (m * n * k) as f64 / s / 1e9;
                    (gf, gf / (peak1 * *t as f64))
                };
                let mut name = f.name().to_string();
                if let Some(d) = dist {
                    name += &format!(" pf{d}");
                }
                if let Some(r) = rows {
                    name += &format!(" mr{r}");
                }
                if let Some(r) = drows {
                    name += &format!(" dr{r}");
                }
                if let Some(a) = a {
                    name += if a { " amx1" } else { " amx0" };
                }
                if let Some(ks) = ks {
                    name += &format!(" ks{ks}");
                }
                if precisions.len() > 1 {
                    name += &format!(" {}", pr.name());
                }
                println!(
                    "{:<8} {:<16} {:<6} {:>10.1} {:>9.1} {:>8.2}",
                    t,
                    format!("{k}x{n}"),
                    name,
                    s * 1e6,
                    rate,
                    frac
                );
            }
        }
    }
    let _ = max_threads;
    for (t, p) in &pools {
        println!(
            "read bandwidth after, {t} thread(s): {:.1} GB/s",
            read_bw(&bw_buf, p, *t)
        );
    }
}
