//! Few-row, long-K GEMMs (ResNet-50's layer4 on 7×7 maps: 49 pixel rows) against a 14×14
//! shape of the same FLOPs, as the CPU device runs them: pre-packed weights (`PackedB`),
//! row-major A read in place, on rafter's `WorkerPool`. Prints the median µs a call and
//! GFLOP/s per shape and thread count, each partition variant alternated within a round so
//! that load from other processes hits them alike.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench few_rows                      # 1 and 2 threads
//! cargo bench -p rafter-kernels-cpu --bench few_rows -- --threads 1,2,16 --sim 16 --cold 1024
//! ```
//!
//! - `--threads T,...`: real threads (a `WorkerPool` of T).
//! - `--sim T,...`: T threads simulated on one core: the GEMM is split for T threads, its
//!   tasks run one after another on the calling thread, each timed, and the time reported is
//!   the makespan of handing the timed tasks, in order, to whichever of T threads is free
//!   first (how the pool's shared queue hands them out). It shows how well the partition
//!   balances and what each task costs on its own; it cannot show contention for memory or
//!   shared cache (each task runs alone, with the caches the previous task left).
//! - `--cold MIB`: cycle through copies of each weight totalling at least MIB MiB, so that
//!   weights come from memory as they do inside a model (0, the default: one copy, hot).
//! - `--conv`: also time the whole convolution as `conv_nhwc` runs it (NHWC im2col spread
//!   over the threads by output rows, then the GEMM) for the 3×3 shapes.
//! - `--peak`: first, the FMA throughput of each real thread count (independent FMA chains
//!   on every thread, best of 5): whether T threads have T cores' FMA units (x86-64 only).
//! - `--fresh`: before each GEMM call, A is rewritten on the pool's threads (untimed), as a
//!   model's previous kernel leaves it: in other cores' caches.
//! - `--rounds N` (default 11), `--filter S` (shape names containing S).
//! - `--variants old,new,k4`: the few-row K split off (`old`, the row x column grid alone),
//!   chosen by the driver's rule (`new`, the default) or forced to N parts of K (`kN`,
//!   N >= 2), alternated within each round (see `set_few_rows_override`); `t1`, `t4`: the
//!   row x column grid forced to 1 or 4 tasks a thread (`set_split_override`); `f`, `fN`:
//!   with `--conv`, the convolution as `sgemm_fill_a` with each task copying its own
//!   columns (`im2col_nhwc_cols`), its K split by the driver's rule or into N parts.

#[cfg(target_arch = "x86_64")]
#[path = "common/fma.rs"]
mod fma;

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use rafter_kernels_cpu::{
    im2col_nhwc, im2col_nhwc_cols, sgemm, sgemm_fill_a, BRef, Epilogue, MatMut, MatRef, PackedB,
    Parallel, WorkerPool,
};

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    /// For a 3×3 convolution: the NHWC input `[h, w, c]`, stride and padding of its im2col.
    conv: Option<([usize; 3], usize)>,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "7x7 3x3 512->512",
        m: 49,
        k: 4608,
        n: 512,
        conv: Some(([7, 7, 512], 1)),
    },
    Shape {
        name: "14x14 3x3 256->256",
        m: 196,
        k: 2304,
        n: 256,
        conv: Some(([14, 14, 256], 1)),
    },
    Shape {
        name: "7x7 1x1 2048->512",
        m: 49,
        k: 2048,
        n: 512,
        conv: None,
    },
    Shape {
        name: "7x7 1x1 512->2048",
        m: 49,
        k: 512,
        n: 2048,
        conv: None,
    },
    Shape {
        name: "7x7 1x1 1024->2048 (s2)",
        m: 49,
        k: 1024,
        n: 2048,
        conv: None,
    },
];

/// `threads` threads simulated on the calling thread (see the module docs).
struct Sim {
    threads: usize,
    /// The makespan of every `run` since the last `take`, summed.
    makespan: Mutex<f64>,
}

impl Parallel for Sim {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let mut free = vec![0f64; self.threads];
        for i in 0..tasks {
            let t = Instant::now();
            f(i);
            let d = t.elapsed().as_secs_f64();
            let first = free
                .iter_mut()
                .min_by(|a, b| a.total_cmp(b))
                .expect("at least one thread");
            *first += d;
        }
        let span = free.into_iter().fold(0f64, f64::max);
        *self.makespan.lock().unwrap() += span;
    }
}

enum Threads {
    Real(WorkerPool),
    Sim(Sim),
}

impl Threads {
    fn par(&self) -> &dyn Parallel {
        match self {
            Threads::Real(p) => p,
            Threads::Sim(s) => s,
        }
    }

    fn label(&self) -> String {
        match self {
            Threads::Real(p) => format!("{}", p.threads()),
            Threads::Sim(s) => format!("{} (sim)", s.threads),
        }
    }
}

fn data(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

struct Case<'a> {
    s: &'a Shape,
    weights: Vec<PackedB>,
    a: Vec<f32>,
    x: Vec<f32>,
    c: Vec<f32>,
    next: usize,
}

impl Case<'_> {
    /// One call: the GEMM (or im2col + GEMM) on the next copy of the weights; returns the
    /// seconds it took and the seconds of its im2col (simulated ones for `Threads::Sim`).
    fn call(&mut self, th: &Threads, conv: bool, fresh: bool, fused: bool) -> (f64, f64) {
        let s = self.s;
        if fresh && !conv {
            self.rewrite_a(th.par());
        }
        let w = &self.weights[self.next];
        self.next = (self.next + 1) % self.weights.len();
        let par = th.par();
        let t = Instant::now();
        let mut im2col = 0.0;
        if conv && fused {
            // As `conv_nhwc` runs a few-row convolution: each task copies its own columns.
            let ([h, wd, ch], pad) = s.conv.expect("a convolution shape");
            let x = &self.x;
            let fill = |cols: std::ops::Range<usize>, dst: &mut [f32]| {
                im2col_nhwc_cols(
                    x,
                    [h, wd, ch],
                    [3, 3],
                    [1, 1],
                    [pad, pad],
                    [h, wd],
                    0..h,
                    cols,
                    dst,
                )
                .unwrap();
            };
            let c = MatMut::row_major(&mut self.c, s.m, s.n, s.n).unwrap();
            sgemm_fill_a(
                1.0,
                s.m,
                s.k,
                &fill,
                BRef::from(w),
                c,
                &Epilogue::none(),
                par,
            )
            .unwrap();
            black_box(&self.c);
            let total = match th {
                Threads::Real(_) => t.elapsed().as_secs_f64(),
                Threads::Sim(sim) => std::mem::take(&mut *sim.makespan.lock().unwrap()),
            };
            return (total, f64::NAN);
        }
        if conv {
            let ([h, wd, ch], pad) = s.conv.expect("a convolution shape");
            let out = [h, wd];
            let tasks = par.threads().min(h);
            let cols = Mutex::new(&mut self.a);
            let ptr = cols.lock().unwrap().as_mut_ptr() as usize;
            let per_row = wd * s.k;
            let x = &self.x;
            // As `conv_nhwc` does: output rows split over the threads, each task writing
            // its own rows of the columns.
            par.run(tasks, &|t| {
                let (lo, hi) = (h * t / tasks, h * (t + 1) / tasks);
                // SAFETY: tasks write disjoint row ranges [lo, hi) of the columns buffer
                // (`per_row` floats a row, h rows in all), which outlives `run`.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        (ptr as *mut f32).add(lo * per_row),
                        (hi - lo) * per_row,
                    )
                };
                im2col_nhwc(x, [h, wd, ch], [3, 3], [1, 1], [pad, pad], out, lo..hi, dst).unwrap();
            });
            im2col = match th {
                Threads::Real(_) => t.elapsed().as_secs_f64(),
                Threads::Sim(sim) => *sim.makespan.lock().unwrap(),
            };
        }
        let a = MatRef::row_major(&self.a, s.m, s.k, s.k).unwrap();
        let c = MatMut::row_major(&mut self.c, s.m, s.n, s.n).unwrap();
        sgemm(1.0, a, BRef::from(w), 0.0, c, &Epilogue::none(), par).unwrap();
        black_box(&self.c);
        let total = match th {
            Threads::Real(_) => t.elapsed().as_secs_f64(),
            Threads::Sim(sim) => std::mem::take(&mut *sim.makespan.lock().unwrap()),
        };
        (total, im2col)
    }
}

/// GFLOP/s of `threads` threads running independent FMA chains, best of 5 (the FMA units'
/// throughput: T threads that share cores, SMT siblings, get less than T times one).
#[cfg(target_arch = "x86_64")]
fn peak(threads: usize) -> f64 {
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let iters = 10_000_000;
    let lanes = if avx512 { 16 } else { 8 };
    let one = move || {
        // SAFETY: each loop runs only where its instruction set was detected.
        black_box(unsafe {
            if avx512 {
                fma::fma_loop_avx512(iters)
            } else {
                fma::fma_loop_avx2(iters)
            }
        });
    };
    (0..5)
        .map(|_| {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(one);
                }
            });
            (threads * iters * 12 * lanes * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

#[cfg(not(target_arch = "x86_64"))]
fn peak(_threads: usize) -> f64 {
    f64::NAN
}

impl Case<'_> {
    /// Rewrites A (its values unchanged) in row chunks on the pool's threads, untimed: a
    /// model's GEMM reads an A that the previous kernel's tasks just wrote on other cores
    /// (`--fresh`), not one that every core already holds in its own cache.
    fn rewrite_a(&mut self, par: &dyn Parallel) {
        let len = self.a.len();
        let tasks = par.threads().max(1);
        let ptr = self.a.as_mut_ptr() as usize;
        par.run(tasks, &|t| {
            let (lo, hi) = (len * t / tasks, len * (t + 1) / tasks);
            // SAFETY: tasks touch disjoint ranges [lo, hi) of A, which outlives `run`.
            let part =
                unsafe { std::slice::from_raw_parts_mut((ptr as *mut f32).add(lo), hi - lo) };
            for x in part {
                *x = black_box(*x);
            }
        });
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let list = |name: &str, default: &str| -> Vec<usize> {
        arg(name)
            .map_or(default, |s| s.as_str())
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().expect("a comma-separated list of numbers"))
            .collect()
    };
    let rounds: usize = arg("--rounds").map_or(11, |r| r.parse().expect("--rounds N"));
    let filter = arg("--filter").cloned().unwrap_or_default();
    let cold_mib: usize = arg("--cold").map_or(0, |r| r.parse().expect("--cold MIB"));
    let conv = args.iter().any(|a| a == "--conv");
    let fresh = args.iter().any(|a| a == "--fresh");
    let variants: Vec<String> = arg("--variants")
        .map_or("new", |s| s.as_str())
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut threads: Vec<Threads> = list("--threads", "1,2")
        .into_iter()
        .map(|t| Threads::Real(WorkerPool::new(t).expect("worker threads")))
        .collect();
    threads.extend(list("--sim", "").into_iter().map(|t| {
        Threads::Sim(Sim {
            threads: t,
            makespan: Mutex::new(0.0),
        })
    }));
    println!(
        "ISA {:?}; {rounds} rounds; weights {}; variants {variants:?}",
        rafter_kernels_cpu::Isa::detect(),
        if cold_mib == 0 {
            "hot (one copy)".to_string()
        } else {
            format!("cycled over >= {cold_mib} MiB of copies")
        }
    );
    if args.iter().any(|a| a == "--peak") {
        for th in &threads {
            if let Threads::Real(p) = th {
                let t = p.threads();
                let g = peak(t);
                println!(
                    "FMA peak, {t} thread(s): {g:.0} GFLOP/s ({:.0} a thread)",
                    g / t as f64
                );
            }
        }
    }
    println!("| shape | M | K | N | what | threads | variant | median us | GFLOP/s |");
    println!("|---|---:|---:|---:|---|---|---|---:|---:|");
    for s in SHAPES.iter().filter(|s| s.name.contains(&filter)) {
        let b = data(s.k * s.n, 2);
        let bytes = s.k * s.n * 4;
        let copies = (cold_mib << 20).div_ceil(bytes).max(1);
        let one = PackedB::pack(s.k, s.n, &b, s.n).unwrap();
        let mut case = Case {
            s,
            weights: vec![one; copies],
            a: data(s.m * s.k, 1),
            x: s.conv
                .map_or(Vec::new(), |([h, w, c], _)| data(h * w * c, 3)),
            c: vec![0.0; s.m * s.n],
            next: 0,
        };
        let flops = 2.0 * (s.m * s.k * s.n) as f64;
        let whats: &[bool] = if conv && s.conv.is_some() {
            &[false, true]
        } else {
            &[false]
        };
        for &what in whats {
            for th in &threads {
                // Warm up, and size a round to about 20 ms of calls per variant.
                let mut reps = 1;
                for v in &variants {
                    set_variant(v);
                    let t = (0..3)
                        .map(|_| case.call(th, what, fresh, fused()).0)
                        .fold(f64::MAX, f64::min);
                    reps = ((0.02 / t) as usize).clamp(3, 2000);
                }
                let mut times = vec![Vec::new(); variants.len()];
                let mut im2cols = vec![Vec::new(); variants.len()];
                for _ in 0..rounds {
                    for (i, v) in variants.iter().enumerate() {
                        set_variant(v);
                        let (mut calls, mut ims): (Vec<f64>, Vec<f64>) = (0..reps)
                            .map(|_| case.call(th, what, fresh, fused()))
                            .unzip();
                        times[i].push(median(&mut calls));
                        im2cols[i].push(median(&mut ims));
                    }
                }
                for (i, v) in variants.iter().enumerate() {
                    let t = median(&mut times[i]);
                    let im = if what {
                        match median(&mut im2cols[i]) {
                            t if t.is_nan() => " (columns per task)".to_string(),
                            t => format!(" (im2col {:.1} us)", t * 1e6),
                        }
                    } else {
                        String::new()
                    };
                    println!(
                        "| {} | {} | {} | {} | {}{im} | {} | {v} | {:.1} | {:.1} |",
                        s.name,
                        s.m,
                        s.k,
                        s.n,
                        if what { "im2col+gemm" } else { "gemm" },
                        th.label(),
                        t * 1e6,
                        flops / t / 1e9
                    );
                }
            }
        }
    }
    set_variant("new");
}

static FUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the variant set last runs convolutions through `sgemm_fill_a` (`f`, `fN`).
fn fused() -> bool {
    FUSED.load(std::sync::atomic::Ordering::Relaxed)
}

fn set_variant(v: &str) {
    rafter_kernels_cpu::set_split_override(0);
    FUSED.store(v.starts_with('f'), std::sync::atomic::Ordering::Relaxed);
    match v {
        "f" => rafter_kernels_cpu::set_few_rows_override(0),
        f if f.starts_with('f') => rafter_kernels_cpu::set_few_rows_override(
            f[1..].parse::<usize>().expect("fN: N parts of K").max(2),
        ),
        "old" => rafter_kernels_cpu::set_few_rows_override(1),
        "new" => rafter_kernels_cpu::set_few_rows_override(0),
        "t1" | "t4" => {
            rafter_kernels_cpu::set_few_rows_override(1);
            rafter_kernels_cpu::set_split_override(if v == "t1" { 1 } else { 4 });
        }
        k if k.starts_with('k') => rafter_kernels_cpu::set_few_rows_override(
            k[1..].parse::<usize>().expect("kN: N parts of K").max(2),
        ),
        other => panic!("unknown variant {other} (old, new, kN, t1, t4, f, fN)"),
    }
}
