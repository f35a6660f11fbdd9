//! The GEMMs of BERT-base and all-MiniLM-L6 (batch 1, seq 128) as the CPU runtime issues
//! them: weights pre-packed, the epilogue the compiler fuses (bias; bias + residual), on
//! rafter's [`WorkerPool`], plus the attention products (one sequential GEMM per head,
//! heads spread over the pool, B packed per call).
//!
//! The machine this runs on is shared (other processes compile on its two cores), so
//! driver variants are compared *within one run*: every round samples every variant of a
//! shape back to back, and the table reports medians over rounds of GFLOP/s, the best
//! round, and the median over rounds of the per-round time ratio against the first variant
//! (pairs taken milliseconds apart see the same load); the order of the variants rotates
//! from round to round. A short FMA probe on every pool thread runs before and after each
//! shape's group of samples; groups whose probes both reach 90% of the run's best probe
//! are "quiet" (nothing else had the cores), and the quiet columns repeat the medians
//! over those groups alone.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench bert_gemm -- --rounds 31
//! cargo bench -p rafter-kernels-cpu --bench bert_gemm -- --variants 'def=0:0:0:0,kc256=0:256:0:0'
//! ```
//!
//! `--cold 400` rotates each shape's product through 400 MB of copies of its weight, so
//! B streams from memory as it does in the model (BERT-base's weights, 435 MB, do not stay
//! in the L3 between calls).
//!
//! A variant is `name=mc:kc:nc:a[:pf[:hot[:split]]]`: cache blocks and A policy as in
//! `set_blocking_override` (0 keeps a default), `pf` = 1 turns B prefetching off
//! (`set_prefetch_override`), `hot` = 1 reuses one weight copy even with `--cold`, to see
//! what streaming the weights costs, `split` = 1 or 4 tasks per thread
//! (`set_split_override`).

use std::hint::black_box;
use std::time::Instant;

use rafter_kernels_cpu::{
    sgemm_with_isa, BRef, Epilogue, Isa, MatMut, MatRef, PackedB, Parallel, Residual, Sequential,
    WorkerPool,
};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `x W + bias` (QKV, FFN up).
    Bias,
    /// `x W + bias + residual` (attention output, FFN down).
    BiasResidual,
    /// `heads` independent `m x k x n` products with B packed per call, one task per head.
    Heads(usize),
}

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    kind: Kind,
    /// How many of this product one model call runs (for the time share column).
    per_call: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "bert qkv proj",
        m: 128,
        k: 768,
        n: 768,
        kind: Kind::Bias,
        per_call: 36,
    },
    Shape {
        name: "bert out proj +res",
        m: 128,
        k: 768,
        n: 768,
        kind: Kind::BiasResidual,
        per_call: 12,
    },
    Shape {
        name: "bert ffn up",
        m: 128,
        k: 768,
        n: 3072,
        kind: Kind::Bias,
        per_call: 12,
    },
    Shape {
        name: "bert ffn down +res",
        m: 128,
        k: 3072,
        n: 768,
        kind: Kind::BiasResidual,
        per_call: 12,
    },
    Shape {
        name: "bert attn QK^T x12",
        m: 128,
        k: 64,
        n: 128,
        kind: Kind::Heads(12),
        per_call: 12,
    },
    Shape {
        name: "bert attn PV x12",
        m: 128,
        k: 128,
        n: 64,
        kind: Kind::Heads(12),
        per_call: 12,
    },
    Shape {
        name: "minilm qkv proj",
        m: 128,
        k: 384,
        n: 384,
        kind: Kind::Bias,
        per_call: 18,
    },
    Shape {
        name: "minilm out proj +res",
        m: 128,
        k: 384,
        n: 384,
        kind: Kind::BiasResidual,
        per_call: 6,
    },
    Shape {
        name: "minilm ffn up",
        m: 128,
        k: 384,
        n: 1536,
        kind: Kind::Bias,
        per_call: 6,
    },
    Shape {
        name: "minilm ffn down +res",
        m: 128,
        k: 1536,
        n: 384,
        kind: Kind::BiasResidual,
        per_call: 6,
    },
];

struct Data {
    a: Vec<f32>,
    b: Vec<f32>,
    /// Distinct copies of the packed weight, used in turn (`--cold`), so that B comes
    /// from memory as in a model whose weights exceed the caches.
    packed: Vec<PackedB>,
    next: usize,
    bias: Vec<f32>,
    res: Vec<f32>,
    c: Vec<f32>,
}

fn rnd(seed: &mut u32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (*seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn data(s: &Shape, cold_bytes: usize) -> Data {
    let heads = match s.kind {
        Kind::Heads(h) => h,
        _ => 1,
    };
    let mut seed = 7;
    let b = rnd(&mut seed, heads * s.k * s.n);
    let one = PackedB::pack(s.k, s.n, &b[..s.k * s.n], s.n).unwrap();
    let copies = cold_bytes.div_ceil(s.k * s.n * 4).max(1);
    let packed = vec![one; copies];
    Data {
        next: 0,
        a: rnd(&mut seed, heads * s.m * s.k),
        packed,
        b,
        bias: rnd(&mut seed, s.n),
        res: rnd(&mut seed, s.m * s.n),
        c: vec![0.0; heads * s.m * s.n],
    }
}

fn call(isa: Isa, s: &Shape, d: &mut Data, par: &WorkerPool, hot: bool) {
    let (m, k, n) = (s.m, s.k, s.n);
    match s.kind {
        Kind::Bias | Kind::BiasResidual => {
            let a = MatRef::row_major(&d.a, m, k, k).unwrap();
            let c = MatMut::row_major(&mut d.c, m, n, n).unwrap();
            let epi = Epilogue {
                bias: Some(&d.bias),
                residual: (s.kind == Kind::BiasResidual)
                    .then(|| Residual::row_major(&d.res, n, false)),
                ..Epilogue::none()
            };
            if !hot {
                d.next = (d.next + 1) % d.packed.len();
            }
            let b = BRef::from(&d.packed[d.next]);
            sgemm_with_isa(isa, 1.0, a, b, 0.0, c, &epi, par).unwrap();
        }
        Kind::Heads(h) => {
            let chunks: Vec<std::sync::Mutex<&mut [f32]>> =
                d.c.chunks_mut(m * n).map(std::sync::Mutex::new).collect();
            let (a, b) = (&d.a, &d.b);
            par.run(h, &|t| {
                let mut ct = chunks[t].lock().unwrap();
                let am = MatRef::row_major(&a[t * m * k..(t + 1) * m * k], m, k, k).unwrap();
                let bm = MatRef::row_major(&b[t * k * n..(t + 1) * k * n], k, n, n).unwrap();
                let cm = MatMut::row_major(&mut ct, m, n, n).unwrap();
                let e = Epilogue::none();
                sgemm_with_isa(isa, 1.0, am, bm.into(), 0.0, cm, &e, &Sequential).unwrap();
            });
        }
    }
    black_box(&d.c);
}

fn flops(s: &Shape) -> f64 {
    let heads = match s.kind {
        Kind::Heads(h) => h,
        _ => 1,
    };
    2.0 * (heads * s.m * s.k * s.n) as f64
}

#[cfg(target_arch = "x86_64")]
#[path = "common/fma.rs"]
mod fma;

/// GFLOP/s of independent AVX-512 FMA chains on every pool thread (about 2 ms): the ceiling
/// at this moment; 0 where there is no AVX-512 (other targets included).
fn fma_probe(
    #[cfg_attr(not(target_arch = "x86_64"), expect(unused_variables))] par: &WorkerPool,
) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let iters = 20_000;
        let t = Instant::now();
        par.run(par.threads(), &|_| {
            // SAFETY: AVX-512F was detected above.
            black_box(unsafe { fma::fma_loop_avx512(iters) });
        });
        return (par.threads() * iters * 12 * 16 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9;
    }
    0.0
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let rounds: usize = arg("--rounds").map_or(21, |r| r.parse().expect("--rounds N"));
    let threads: usize = arg("--threads").map_or(2, |r| r.parse().expect("--threads N"));
    let filter = arg("--filter").cloned().unwrap_or_default();
    // `--isa avx2` runs the AVX2 kernel (the issue's Zen 3 target) on an AVX-512 machine.
    let isa = match arg("--isa").map(|s| s.as_str()) {
        Some("avx2") => Isa::Avx2,
        Some("scalar") => Isa::Scalar,
        _ => Isa::detect(),
    };
    // `--cold MB`: rotate through this many MB of weight copies per shape (BERT-base's
    // weights are 435 MB, beyond the L3), instead of one copy that stays cached.
    let cold: usize = arg("--cold").map_or(0, |r| r.parse::<usize>().expect("--cold MB") << 20);
    let variants: Vec<(String, [usize; 7])> = arg("--variants")
        .map_or("default=0:0:0:0", |v| v.as_str())
        .split(',')
        .map(|v| {
            let (name, spec) = v.split_once('=').expect("name=mc:kc:nc:a");
            let x: Vec<usize> = spec.split(':').map(|x| x.parse().unwrap()).collect();
            let opt = |i: usize| x.get(i).copied().unwrap_or(0);
            (
                name.to_string(),
                [x[0], x[1], x[2], x[3], opt(4), opt(5), opt(6)],
            )
        })
        .collect();
    let pool = WorkerPool::new(threads).unwrap();
    let shapes: Vec<&Shape> = SHAPES.iter().filter(|s| s.name.contains(&filter)).collect();
    let mut datas: Vec<Data> = shapes.iter().map(|s| data(s, cold)).collect();
    // times[shape][variant][round], seconds per call.
    let mut times = vec![vec![Vec::new(); variants.len()]; shapes.len()];
    // probes[shape][round]: the lower of the probes around that group of samples.
    let mut probes = vec![Vec::new(); shapes.len()];
    let reps: Vec<usize> = shapes
        .iter()
        .zip(datas.iter_mut())
        .map(|(s, d)| {
            call(isa, s, d, &pool, false);
            let t = Instant::now();
            call(isa, s, d, &pool, false);
            ((2e-3 / t.elapsed().as_secs_f64()) as usize).clamp(1, 1000)
        })
        .collect();
    for round in 0..rounds {
        for (si, s) in shapes.iter().enumerate() {
            let before = fma_probe(&pool);
            // Each round starts with a different variant, so none is always the one that
            // runs first on a shape (or right after the probe).
            for i in 0..variants.len() {
                let vi = (i + round) % variants.len();
                let v = &variants[vi].1;
                rafter_kernels_cpu::set_blocking_override(v[0], v[1], v[2], v[3]);
                rafter_kernels_cpu::set_prefetch_override(v[4]);
                rafter_kernels_cpu::set_split_override(v[6]);
                let hot = v[5] == 1;
                call(isa, s, &mut datas[si], &pool, hot);
                let t = Instant::now();
                for _ in 0..reps[si] {
                    call(isa, s, &mut datas[si], &pool, hot);
                }
                times[si][vi].push(t.elapsed().as_secs_f64() / reps[si] as f64);
            }
            probes[si].push(before.min(fma_probe(&pool)));
        }
    }
    rafter_kernels_cpu::set_blocking_override(0, 0, 0, 0);
    rafter_kernels_cpu::set_prefetch_override(0);
    rafter_kernels_cpu::set_split_override(0);
    let all: Vec<f64> = probes.iter().flatten().copied().collect();
    let best_probe = all.iter().cloned().fold(0.0, f64::max);
    println!(
        "{isa:?}, {threads} thread(s), {rounds} rounds; FMA probe median {:.0} GFLOP/s (best {:.0})",
        median(&all),
        best_probe
    );
    let names: Vec<&str> = variants.iter().map(|(n, _)| n.as_str()).collect();
    println!(
        "| shape | M | K | N | {} | {} | quiet rounds | {} | {} |",
        names
            .iter()
            .map(|n| format!("{n} median (best) GFLOP/s"))
            .collect::<Vec<_>>()
            .join(" | "),
        names[1..]
            .iter()
            .map(|n| format!("{} / {n} time", names[0]))
            .collect::<Vec<_>>()
            .join(" | "),
        names
            .iter()
            .map(|n| format!("{n} quiet median"))
            .collect::<Vec<_>>()
            .join(" | "),
        names[1..]
            .iter()
            .map(|n| format!("{} / {n} quiet", names[0]))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    let mut total = vec![0.0; variants.len()];
    for (si, s) in shapes.iter().enumerate() {
        let f = flops(s);
        let cells: Vec<String> = times[si]
            .iter()
            .map(|t| {
                let best = t.iter().cloned().fold(f64::MAX, f64::min);
                format!("{:.1} ({:.1})", f / median(t) / 1e9, f / best / 1e9)
            })
            .collect();
        let ratios: Vec<String> = times[si][1..]
            .iter()
            .map(|t| {
                let r: Vec<f64> = times[si][0].iter().zip(t).map(|(a, b)| a / b).collect();
                format!("{:.3}", median(&r))
            })
            .collect();
        for (vi, t) in times[si].iter().enumerate() {
            total[vi] += median(t) * s.per_call as f64;
        }
        let quiet: Vec<usize> = (0..rounds)
            .filter(|&r| probes[si][r] >= 0.9 * best_probe)
            .collect();
        let pick = |t: &[f64]| -> Vec<f64> { quiet.iter().map(|&r| t[r]).collect() };
        let (qcells, qratios): (Vec<String>, Vec<String>) = if quiet.len() >= 3 {
            (
                times[si]
                    .iter()
                    .map(|t| format!("{:.1}", f / median(&pick(t)) / 1e9))
                    .collect(),
                times[si][1..]
                    .iter()
                    .map(|t| {
                        let (a, b) = (pick(&times[si][0]), pick(t));
                        let r: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a / b).collect();
                        format!("{:.3}", median(&r))
                    })
                    .collect(),
            )
        } else {
            (
                vec!["—".into(); variants.len()],
                vec!["—".into(); variants.len() - 1],
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.m,
            s.k,
            s.n,
            cells.join(" | "),
            ratios.join(" | "),
            quiet.len(),
            qcells.join(" | "),
            qratios.join(" | ")
        );
    }
    let ms: Vec<String> = names
        .iter()
        .zip(&total)
        .map(|(n, t)| format!("{n} {:.2} ms", t * 1e3))
        .collect();
    println!(
        "sum of medians x per-call counts (shapes shown): {}",
        ms.join(", ")
    );
}
