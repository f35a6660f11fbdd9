//! f32 pre-packed weights ([`PackedB`]) against f16 and bf16 weights ([`PackedHalfB`]) and
//! int8 weights ([`PackedI8B`], activations quantized per call) on the same products, side by side in one run: LLM decode (M = 1) and BERT-base's FFN up
//! projection at sequence 128 (M = 128).
//!
//! Weights stream from memory as in a model: every call uses the next of enough copies of
//! its weight to exceed the caches (`--cold MB`, 256 by default: with 64 MB, f16 4096x4096
//! still read at 79 GB/s, above this machine's ~44 GB/s DRAM, so part stayed cached). The machine is shared, so the
//! contenders alternate within every round (the order rotating from round to round), and
//! the table reports medians over rounds of the per-call time; GB/s counts the weight bytes
//! of the contender's own format (the memory traffic that the half formats halve and int8
//! quarters; int8's per-column scales and sums, 8 bytes per column, are counted too), and the
//! last column is the speedup over the shape's first row (f32; f16 direct with
//! `--crossover`).
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench lowp_gemm -- --rounds 7
//! cargo bench -p rafter-kernels-cpu --bench lowp_gemm -- --crossover   # direct vs widened
//! ```

use std::hint::black_box;
use std::time::Instant;

use rafter_kernels_cpu::{
    gemm_half_with_isa, gemm_i8_with_isa, set_half_direct_max_m, sgemm_with_isa, Epilogue,
    HalfKind, Isa, MatMut, MatRef, PackedB, PackedHalfB, PackedI8B, Parallel, WorkerPool,
};

struct Shape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "decode 768x768",
        m: 1,
        k: 768,
        n: 768,
    },
    Shape {
        name: "decode 768x3072",
        m: 1,
        k: 768,
        n: 3072,
    },
    Shape {
        name: "decode 3072x768",
        m: 1,
        k: 3072,
        n: 768,
    },
    Shape {
        name: "decode 4096x4096",
        m: 1,
        k: 4096,
        n: 4096,
    },
    Shape {
        name: "bert M=128 768x3072",
        m: 128,
        k: 768,
        n: 3072,
    },
];

/// One contender's weights: copies used in turn.
enum Weights {
    F32(Vec<PackedB>),
    Half(Vec<PackedHalfB>),
    I8(Vec<PackedI8B>),
}

struct Contender {
    name: String,
    w: Weights,
    /// Weight bytes of one copy (the contender's own format).
    bytes: usize,
    next: usize,
    /// `set_half_direct_max_m` while this contender runs (0: the default).
    direct_max: usize,
}

fn rnd(seed: &mut u32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (*seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn call(isa: Isa, s: &Shape, a: &[f32], c: &mut [f32], w: &mut Contender, par: &dyn Parallel) {
    let am = MatRef::row_major(a, s.m, s.k, s.k).unwrap();
    let cm = MatMut::row_major(c, s.m, s.n, s.n).unwrap();
    let e = Epilogue::none();
    match &w.w {
        Weights::F32(v) => {
            w.next = (w.next + 1) % v.len();
            sgemm_with_isa(isa, 1.0, am, (&v[w.next]).into(), 0.0, cm, &e, par).unwrap();
        }
        Weights::Half(v) => {
            w.next = (w.next + 1) % v.len();
            set_half_direct_max_m(w.direct_max);
            gemm_half_with_isa(isa, 1.0, am, v[w.next].view(), cm, &e, par).unwrap();
            set_half_direct_max_m(0);
        }
        Weights::I8(v) => {
            w.next = (w.next + 1) % v.len();
            gemm_i8_with_isa(isa, am, v[w.next].view(), cm, &e, par).unwrap();
        }
    }
    black_box(&c);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let rounds: usize = arg("--rounds").map_or(7, |r| r.parse().expect("--rounds N"));
    let threads: usize = arg("--threads").map_or(2, |r| r.parse().expect("--threads N"));
    let cold: usize = arg("--cold").map_or(256, |r| r.parse().expect("--cold MB")) << 20;
    let crossover = args.iter().any(|a| a == "--crossover");
    let isa = arg("--isa").map_or(Isa::detect(), |s| Isa::named(s).expect("--isa name"));
    let pool = WorkerPool::new(threads).unwrap();

    // `--crossover`: M from decode to prefill, each half format on both paths.
    let cross_shapes: Vec<Shape> = [4usize, 8, 16, 32, 64, 128]
        .iter()
        .map(|&m| Shape {
            name: Box::leak(format!("M={m} 768x3072").into_boxed_str()),
            m,
            k: 768,
            n: 3072,
        })
        .collect();
    let shapes: Vec<&Shape> = if crossover {
        cross_shapes.iter().collect()
    } else {
        SHAPES.iter().collect()
    };

    println!(
        "{isa:?}, {threads} thread(s), {rounds} rounds, weights rotated through >= {} MiB; \
         median per call",
        cold >> 20
    );
    println!(
        "{:<22} {:<14} {:>10} {:>9} {:>8} {:>8}",
        "shape",
        "weights",
        "us",
        "GFLOP/s",
        "GB/s",
        if crossover { "speedup" } else { "vs f32" }
    );
    for s in shapes {
        let mut seed = 7;
        let b = rnd(&mut seed, s.k * s.n);
        let a = rnd(&mut seed, s.m * s.k);
        let mut c = vec![0.0f32; s.m * s.n];
        let copies = |bytes: usize| cold.div_ceil(bytes).max(2);
        let f32_bytes = s.k * s.n * 4;
        let half = |kind: HalfKind| {
            let one = PackedHalfB::pack(kind, s.k, s.n, &b, s.n).unwrap();
            vec![one; copies(f32_bytes / 2)]
        };
        let mut cs: Vec<Contender> = Vec::new();
        if crossover {
            for (kind, kname) in [(HalfKind::F16, "f16"), (HalfKind::Bf16, "bf16")] {
                for (direct_max, pname) in [(usize::MAX, "direct"), (1, "widened")] {
                    cs.push(Contender {
                        name: format!("{kname} {pname}"),
                        w: Weights::Half(half(kind)),
                        bytes: f32_bytes / 2,
                        next: 0,
                        direct_max,
                    });
                }
            }
        } else {
            let one = PackedB::pack(s.k, s.n, &b, s.n).unwrap();
            cs.push(Contender {
                name: "f32".into(),
                w: Weights::F32(vec![one; copies(f32_bytes)]),
                bytes: f32_bytes,
                next: 0,
                direct_max: 0,
            });
            for (kind, kname) in [(HalfKind::F16, "f16"), (HalfKind::Bf16, "bf16")] {
                cs.push(Contender {
                    name: kname.into(),
                    w: Weights::Half(half(kind)),
                    bytes: f32_bytes / 2,
                    next: 0,
                    direct_max: 0,
                });
            }
            let one = PackedI8B::pack(s.k, s.n, &b, s.n).unwrap();
            let i8_bytes = one.as_bytes().len();
            cs.push(Contender {
                name: "int8".into(),
                w: Weights::I8(vec![one; copies(i8_bytes)]),
                bytes: i8_bytes,
                next: 0,
                direct_max: 0,
            });
        }
        // Calls per sample: about 3 ms of the first contender.
        call(isa, s, &a, &mut c, &mut cs[0], &pool);
        let t = Instant::now();
        call(isa, s, &a, &mut c, &mut cs[0], &pool);
        let reps = ((3e-3 / t.elapsed().as_secs_f64()) as usize).clamp(2, 500);
        let mut times = vec![Vec::new(); cs.len()];
        for round in 0..rounds {
            for i in 0..cs.len() {
                let ci = (i + round) % cs.len();
                call(isa, s, &a, &mut c, &mut cs[ci], &pool);
                let t = Instant::now();
                for _ in 0..reps {
                    call(isa, s, &a, &mut c, &mut cs[ci], &pool);
                }
                times[ci].push(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        let base = median(&times[0]);
        for (ct, t) in cs.iter().zip(&times) {
            let med = median(t);
            println!(
                "{:<22} {:<14} {:>10.1} {:>9.1} {:>8.1} {:>7.2}x",
                s.name,
                ct.name,
                med * 1e6,
                2.0 * (s.m * s.k * s.n) as f64 / med / 1e9,
                ct.bytes as f64 / med / 1e9,
                base / med,
            );
        }
    }
}
