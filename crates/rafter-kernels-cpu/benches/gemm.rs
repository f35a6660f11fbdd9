//! rafter's GEMM against the `gemm` crate and `matrixmultiply`, on GEMM shapes of the
//! benchmark models, alternating the contenders within each round so that load from other
//! processes hits them all alike. Medians over rounds.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench gemm            # everything
//! cargo bench -p rafter-kernels-cpu --bench gemm -- --rounds 21 --filter bert
//! ```
//!
//! The comparison uses AVX2/AVX-512 intrinsics for its peak measurement, so it is x86-64 only.

#[cfg(target_arch = "x86_64")]
#[path = "common/fma.rs"]
mod fma;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    use rafter_kernels_cpu::{
        sgemm_with_isa, Activation, BRef, Epilogue, Isa, MatMut, MatRef, PackedB, Parallel,
        Sequential,
    };
    use rayon::prelude::*;

    /// rafter's tasks on rayon's pool, the same pool the `gemm` crate uses, so thread start-up
    /// costs neither contender anything.
    struct Rayon(usize);

    impl Parallel for Rayon {
        fn threads(&self) -> usize {
            self.0
        }

        fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..tasks).into_par_iter().for_each(f);
        }
    }

    struct Shape {
        name: &'static str,
        m: usize,
        k: usize,
        n: usize,
    }

    const SHAPES: &[Shape] = &[
        Shape {
            name: "resnet50 conv2 3x3 (im2col)",
            m: 3136,
            k: 576,
            n: 64,
        },
        Shape {
            name: "resnet50 conv2 1x1 64->256",
            m: 3136,
            k: 64,
            n: 256,
        },
        Shape {
            name: "resnet50 conv2 1x1 256->64",
            m: 3136,
            k: 256,
            n: 64,
        },
        Shape {
            name: "resnet50 conv3 3x3",
            m: 784,
            k: 1152,
            n: 128,
        },
        Shape {
            name: "resnet50 conv4 3x3",
            m: 196,
            k: 2304,
            n: 256,
        },
        Shape {
            name: "resnet50 conv4 1x1 1024->256",
            m: 196,
            k: 1024,
            n: 256,
        },
        Shape {
            name: "resnet50 conv5 3x3",
            m: 49,
            k: 4608,
            n: 512,
        },
        Shape {
            name: "resnet50 conv5 1x1 512->2048",
            m: 49,
            k: 512,
            n: 2048,
        },
        // MobileNetV2's 1×1 convolutions of small K or N (pixels x in x out channels).
        Shape {
            name: "mobilenet_v2 project 32->16 at 112x112",
            m: 12544,
            k: 32,
            n: 16,
        },
        Shape {
            name: "mobilenet_v2 expand 16->96 at 112x112",
            m: 12544,
            k: 16,
            n: 96,
        },
        Shape {
            name: "mobilenet_v2 project 144->24 at 56x56",
            m: 3136,
            k: 144,
            n: 24,
        },
        Shape {
            name: "bert qkv/out proj",
            m: 128,
            k: 768,
            n: 768,
        },
        Shape {
            name: "bert ffn up",
            m: 128,
            k: 768,
            n: 3072,
        },
        Shape {
            name: "bert ffn down",
            m: 128,
            k: 3072,
            n: 768,
        },
        Shape {
            name: "decode proj",
            m: 1,
            k: 768,
            n: 768,
        },
        Shape {
            name: "decode ffn up",
            m: 1,
            k: 768,
            n: 3072,
        },
        Shape {
            name: "decode ffn down",
            m: 1,
            k: 3072,
            n: 768,
        },
    ];

    #[derive(Clone, Copy, PartialEq)]
    enum Who {
        /// rafter on an ISA, B pre-packed (weights) or packed per call.
        Rafter(Isa, bool),
        /// rafter, B pre-packed, with a fused bias + ReLU epilogue (a ResNet conv's): what
        /// the peers would need a second pass over C for.
        RafterFused(Isa),
        Gemm,
        MatrixMultiply,
    }

    impl Who {
        fn label(self) -> String {
            match self {
                Who::Rafter(isa, true) => format!("rafter {isa:?}"),
                Who::Rafter(isa, false) => format!("rafter {isa:?} (B packed per call)"),
                Who::RafterFused(isa) => format!("rafter {isa:?} +bias+relu"),
                Who::Gemm => "gemm 0.18".into(),
                Who::MatrixMultiply => "matrixmultiply 0.3".into(),
            }
        }
    }

    struct Data {
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
        packed: PackedB,
        bias: Vec<f32>,
    }

    fn call(who: Who, s: &Shape, d: &mut Data, threads: usize) {
        let (m, k, n) = (s.m, s.k, s.n);
        match who {
            Who::Rafter(isa, prepacked) => {
                let a = MatRef::row_major(&d.a, m, k, k).unwrap();
                let b = if prepacked {
                    BRef::from(&d.packed)
                } else {
                    BRef::Mat(MatRef::row_major(&d.b, k, n, n).unwrap())
                };
                let c = MatMut::row_major(&mut d.c, m, n, n).unwrap();
                let par: &dyn Parallel = if threads == 1 {
                    &Sequential
                } else {
                    &Rayon(threads)
                };
                sgemm_with_isa(isa, 1.0, a, b, 0.0, c, &Epilogue::none(), par).unwrap();
            }
            Who::RafterFused(isa) => {
                let a = MatRef::row_major(&d.a, m, k, k).unwrap();
                let c = MatMut::row_major(&mut d.c, m, n, n).unwrap();
                let par: &dyn Parallel = if threads == 1 {
                    &Sequential
                } else {
                    &Rayon(threads)
                };
                let epi = Epilogue {
                    bias: Some(&d.bias),
                    activation: Activation::Relu,
                    ..Epilogue::none()
                };
                sgemm_with_isa(isa, 1.0, a, (&d.packed).into(), 0.0, c, &epi, par).unwrap();
            }
            Who::Gemm => {
                let par = if threads == 1 {
                    gemm::Parallelism::None
                } else {
                    gemm::Parallelism::Rayon(threads)
                };
                // SAFETY: row-major m x k, k x n and m x n buffers of exactly those sizes.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        d.c.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        d.a.as_ptr(),
                        1,
                        k as isize,
                        d.b.as_ptr(),
                        1,
                        n as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    )
                }
            }
            Who::MatrixMultiply => {
                // SAFETY: as above.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        d.a.as_ptr(),
                        k as isize,
                        1,
                        d.b.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        d.c.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                }
            }
        }
        black_box(&d.c);
    }

    /// Seconds per call: `reps` calls timed together.
    fn sample(who: Who, s: &Shape, d: &mut Data, threads: usize, reps: usize) -> f64 {
        let t = Instant::now();
        for _ in 0..reps {
            call(who, s, d, threads);
        }
        t.elapsed().as_secs_f64() / reps as f64
    }

    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    }

    /// Measured FMA peak (GFLOP/s) of `threads` threads running independent FMA chains: the
    /// ceiling the fractions below are taken against, measured in the same run (other load on
    /// the machine lowers it as it lowers the GEMMs).
    fn peak(avx512: bool, threads: usize) -> f64 {
        let iters = 20_000_000;
        let lanes = if avx512 { 16 } else { 8 };
        let one = move || {
            // SAFETY: called only when the feature was detected.
            black_box(unsafe {
                if avx512 {
                    super::fma::fma_loop_avx512(iters)
                } else {
                    super::fma::fma_loop_avx2(iters)
                }
            });
        };
        let mut best: f64 = 0.0;
        for _ in 0..7 {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(one);
                }
            });
            let flops = (threads * iters * 12 * lanes * 2) as f64;
            best = best.max(flops / t.elapsed().as_secs_f64() / 1e9);
        }
        best
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().collect();
        let arg = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
        };
        let rounds: usize = arg("--rounds").map_or(11, |r| r.parse().expect("--rounds N"));
        let filter = arg("--filter").cloned().unwrap_or_default();
        let threads_list: Vec<usize> = arg("--threads").map_or(vec![1, 2], |t| {
            t.split(',')
                .map(|x| x.parse().expect("--threads 1,2"))
                .collect()
        });
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build_global()
            .unwrap();

        let has512 = Isa::Avx512.is_available();
        let has2 = Isa::Avx2.is_available();
        assert!(has2, "this bench compares AVX2 kernels");
        println!("detected ISA: {:?}; rounds: {rounds}", Isa::detect());
        let peaks: Vec<(usize, f64, f64)> = threads_list
            .iter()
            .map(|&t| (t, peak(false, t), if has512 { peak(true, t) } else { 0.0 }))
            .collect();
        for (t, p2, p5) in &peaks {
            println!(
                "measured FMA peak, {t} thread(s): AVX2 {p2:.1} GFLOP/s, AVX-512 {p5:.1} GFLOP/s"
            );
        }

        if args.iter().any(|a| a == "--micro") {
            for isa in [Isa::Avx2, Isa::Avx512]
                .into_iter()
                .filter(|i| i.is_available())
            {
                for kc in [64, 128, 192, 256, 384] {
                    let g: Vec<String> = (0..5)
                        .map(|_| {
                            format!(
                                "{:.1}",
                                rafter_kernels_cpu::bench_micro_kernel(isa, kc, 200_000)
                            )
                        })
                        .collect();
                    println!("micro-kernel {isa:?} kc={kc}: {} GFLOP/s", g.join(" "));
                }
            }
            return;
        }
        if let Some(spec) = arg("--tune") {
            // `--tune mc:kc:nc[:a],...`: alternate blockings (and A policy) within each round, per shape.
            let configs: Vec<[usize; 4]> = spec
                .split(',')
                .map(|c| {
                    let v: Vec<usize> = c
                        .split(':')
                        .map(|x| x.parse().expect("mc:kc:nc[:a]"))
                        .collect();
                    [v[0], v[1], v[2], v.get(3).copied().unwrap_or(0)]
                })
                .collect();
            let isa = arg("--isa").map_or(Isa::detect(), |i| {
                if i == "avx2" {
                    Isa::Avx2
                } else {
                    Isa::Avx512
                }
            });
            let threads = threads_list[0];
            println!("tuning {isa:?}, {threads} thread(s); best GFLOP/s per config: {spec}");
            for s in SHAPES.iter().filter(|s| s.name.contains(&filter)) {
                let a = vec![0.5f32; s.m * s.k];
                let b = vec![0.25f32; s.k * s.n];
                let packed = PackedB::pack(s.k, s.n, &b, s.n).unwrap();
                let mut d = Data {
                    a,
                    b,
                    c: vec![0.0; s.m * s.n],
                    packed,
                    bias: vec![0.1; s.n],
                };
                let w = Who::Rafter(isa, true);
                let mut times = vec![Vec::new(); configs.len()];
                for _ in 0..rounds {
                    for (i, c) in configs.iter().enumerate() {
                        rafter_kernels_cpu::set_blocking_override(c[0], c[1], c[2], c[3]);
                        times[i].push(sample(w, s, &mut d, threads, 5));
                    }
                }
                rafter_kernels_cpu::set_blocking_override(0, 0, 0, 0);
                let flops = 2.0 * (s.m * s.k * s.n) as f64;
                // Best of rounds: under time-slicing by other processes the fastest sample is the
                // one that ran alone, which is what a blocking choice should be judged on.
                let g: Vec<String> = times
                    .iter()
                    .map(|t| {
                        format!(
                            "{:.1}",
                            flops / t.iter().cloned().fold(f64::MAX, f64::min) / 1e9
                        )
                    })
                    .collect();
                println!("{:32} {}", s.name, g.join(" "));
            }
            return;
        }
        let mut who = vec![
            Who::Rafter(Isa::Avx2, true),
            Who::Rafter(Isa::Avx2, false),
            Who::Gemm,
        ];
        if has512 {
            who.insert(0, Who::Rafter(Isa::Avx512, true));
        }
        who.push(Who::MatrixMultiply);
        if args.iter().any(|a| a == "--epilogue") {
            if has512 {
                who.push(Who::RafterFused(Isa::Avx512));
            }
            who.push(Who::RafterFused(Isa::Avx2));
        }
        if let Some(only) = arg("--only") {
            // Profiling aid: one contender (by label substring), no ratio columns.
            who.retain(|w| w.label().contains(only.as_str()));
            for s in SHAPES.iter().filter(|s| s.name.contains(&filter)) {
                let a = vec![0.5f32; s.m * s.k];
                let b = vec![0.25f32; s.k * s.n];
                let packed = PackedB::pack(s.k, s.n, &b, s.n).unwrap();
                let mut d = Data {
                    a,
                    b,
                    c: vec![0.0; s.m * s.n],
                    packed,
                    bias: vec![0.1; s.n],
                };
                for &w in &who {
                    let threads = threads_list[0];
                    let mut t: Vec<f64> = (0..rounds)
                        .map(|_| sample(w, s, &mut d, threads, 20))
                        .collect();
                    let g = 2.0 * (s.m * s.k * s.n) as f64 / median(&mut t) / 1e9;
                    println!("{} {}: {g:.1} GFLOP/s", s.name, w.label());
                }
            }
            return;
        }

        // Two tables: medians over rounds (what a user sees on this shared machine) and the best
        // round (the uncontended speed: other processes time-slice the 2 cores in bursts).
        let header = |what: &str| {
            format!(
                "| shape | M | K | N | T | {} | rafter AVX2 / gemm | rafter AVX2 / 102·T | rafter AVX-512 / 102·T |\n|---|---:|---:|---:|---:|{}---:|---:|---:|",
                who.iter().map(|w| format!("{} {what}", w.label())).collect::<Vec<_>>().join(" | "),
                "---:|".repeat(who.len())
            )
        };
        let mut med_rows = Vec::new();
        let mut best_rows = Vec::new();
        for &threads in &threads_list {
            // The issue's nominal AVX2 FMA ceiling for this machine: 102 GFLOP/s per core.
            let nominal = 102.0 * threads as f64;
            for s in SHAPES.iter().filter(|s| s.name.contains(&filter)) {
                let mut seed = 1u32;
                let mut rnd = |len: usize| -> Vec<f32> {
                    (0..len)
                        .map(|_| {
                            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                        })
                        .collect()
                };
                let (a, b) = (rnd(s.m * s.k), rnd(s.k * s.n));
                let packed = PackedB::pack(s.k, s.n, &b, s.n).unwrap();
                let mut d = Data {
                    a,
                    b,
                    c: vec![0.0; s.m * s.n],
                    packed,
                    bias: vec![0.1; s.n],
                };
                let contenders: Vec<Who> = who
                    .iter()
                    .copied()
                    .filter(|w| threads == 1 || *w != Who::MatrixMultiply)
                    .collect();
                // Warm up and size each sample to about 3 ms.
                let reps: Vec<usize> = contenders
                    .iter()
                    .map(|&w| {
                        call(w, s, &mut d, threads);
                        let t = sample(w, s, &mut d, threads, 3);
                        ((Duration::from_millis(3).as_secs_f64() / t) as usize).clamp(1, 10_000)
                    })
                    .collect();
                let mut times = vec![Vec::new(); contenders.len()];
                for _ in 0..rounds {
                    for (i, &w) in contenders.iter().enumerate() {
                        times[i].push(sample(w, s, &mut d, threads, reps[i]));
                    }
                }
                let flops = 2.0 * (s.m * s.k * s.n) as f64;
                for (rows, best) in [(&mut med_rows, false), (&mut best_rows, true)] {
                    let gflops: Vec<Option<f64>> = who
                        .iter()
                        .map(|w| {
                            contenders.iter().position(|c| c == w).map(|i| {
                                let t = if best {
                                    times[i].iter().cloned().fold(f64::MAX, f64::min)
                                } else {
                                    median(&mut times[i])
                                };
                                flops / t / 1e9
                            })
                        })
                        .collect();
                    let get = |w: Who| gflops[who.iter().position(|x| *x == w).unwrap()];
                    let r2 = get(Who::Rafter(Isa::Avx2, true)).unwrap();
                    let r5 = get(Who::Rafter(Isa::Avx512, true));
                    rows.push(format!(
                        "| {} | {} | {} | {} | {threads} | {} | {:.2} | {:.0}% | {} |",
                        s.name,
                        s.m,
                        s.k,
                        s.n,
                        gflops
                            .iter()
                            .map(|g| g.map_or("—".into(), |g| format!("{g:.1}")))
                            .collect::<Vec<_>>()
                            .join(" | "),
                        r2 / get(Who::Gemm).unwrap(),
                        100.0 * r2 / nominal,
                        r5.map_or("—".into(), |g| format!("{:.0}%", 100.0 * g / nominal)),
                    ));
                }
            }
        }
        println!(
            "\nmedian of {rounds} rounds, GFLOP/s; 102·T = the nominal AVX2 peak of T cores\n"
        );
        println!("{}", header("median"));
        med_rows.iter().for_each(|r| println!("{r}"));
        println!("\nbest of {rounds} rounds, GFLOP/s\n");
        println!("{}", header("best"));
        best_rows.iter().for_each(|r| println!("{r}"));
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    x86::main()
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("the GEMM comparison bench is x86-64 only");
}
