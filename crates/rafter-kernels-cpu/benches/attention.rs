//! Prefill attention (`cached_attention`) on a Qwen3-0.6B layer's shape: 128 queries at
//! past 0, 16 query / 8 key-value heads of 128, the cache sized for 4096 positions (its row
//! stride is the model's), causal. Prints the median time per call over rounds and GFLOP/s
//! (4 flops per query head, key and element: the scores and the weighted sum). With one
//! thread it also reports the thread's own CPU time per call (from
//! `/proc/thread-self/schedstat` on Linux), which a loaded machine's time slicing does not
//! inflate.
//!
//! With `--decode P`, a decode step's attention instead: one query at past `P` over an
//! f16 cache (the GGUF default), for each of 28 layers' caches in turn (as a step of the
//! model reads them: about `28 * P * 4 KiB` bytes, more than the caches hold at P >= 256),
//! reported per layer call.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench attention -- --threads 1,2 --rounds 9
//! cargo bench -p rafter-kernels-cpu --bench attention -- --decode 192 --threads 2
//! cargo bench -p rafter-kernels-cpu --bench attention -- --decode 1000 --prefetch-rows 0,8,16,32
//! ```

use std::time::Instant;

use rafter_kernels_cpu::{
    cached_attention, set_attention_packing, set_attention_prefetch_rows, CachedAttention,
    Parallel, Sequential, WorkerPool,
};

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

/// Nanoseconds this thread has run on a CPU (Linux), or `None`.
fn thread_cpu_ns() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn median(mut v: Vec<f64>) -> f64 {
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
    let rounds: usize = arg("--rounds").map_or(7, |r| r.parse().expect("--rounds N"));
    let seq: usize = arg("--seq").map_or(128, |r| r.parse().expect("--seq N"));
    let threads: Vec<usize> = arg("--threads").map_or(vec![1, 2], |t| {
        t.split(',')
            .map(|v| v.parse().expect("--threads 1,2"))
            .collect()
    });
    if let Some(p) = arg("--decode") {
        // `--prefetch-rows R1,R2`: decode's prefetch distances to compare (rows ahead);
        // without it, the kernel's default.
        let ahead: Vec<Option<usize>> = arg("--prefetch-rows").map_or(vec![None], |t| {
            t.split(',')
                .map(|v| Some(v.parse().expect("--prefetch-rows 0,16")))
                .collect()
        });
        for r in ahead {
            if let Some(r) = r {
                set_attention_prefetch_rows(r);
                println!("prefetch {r} rows ahead:");
            }
            decode(p.parse().expect("--decode P"), rounds, &threads);
        }
        return;
    }
    let (q_heads, kv_heads, d, total) = (16, 8, 128, 4096);
    let a = CachedAttention {
        q_heads,
        kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        softcap: 0.0,
        window: None,
    };
    let mut seed = 0x2545_F491_4F6C_DD1D;
    let q = rnd(&mut seed, seq * q_heads * d);
    let k = rnd(&mut seed, total * kv_heads * d);
    let v = rnd(&mut seed, total * kv_heads * d);
    let mut out = vec![0f32; q.len()];
    let flops = 4.0 * (q_heads * d) as f64 * (seq * (seq + 1) / 2) as f64;
    for (&t, pack) in threads.iter().flat_map(|t| [(t, true), (t, false)]) {
        set_attention_packing(pack);
        let pool = WorkerPool::new(t).expect("pool");
        let par: &dyn Parallel = if t == 1 { &Sequential } else { &pool };
        let (mut wall, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let calls = 10;
            let (start, cpu0) = (Instant::now(), thread_cpu_ns());
            for _ in 0..calls {
                cached_attention(&a, &q, &k, &v, 0, &mut out, par).expect("attention");
            }
            wall.push(start.elapsed().as_secs_f64() / calls as f64);
            if let (Some(c0), Some(c1)) = (cpu0, thread_cpu_ns()) {
                cpu.push((c1 - c0) * 1e-9 / calls as f64);
            }
        }
        let w = median(wall);
        print!(
            "threads {t} seq {seq} packed {pack:5}: wall {:8.1} us ({:6.1} GFLOP/s)",
            w * 1e6,
            flops / w / 1e9
        );
        if t == 1 && !cpu.is_empty() {
            let c = median(cpu);
            print!(", CPU {:8.1} us ({:6.1} GFLOP/s)", c * 1e6, flops / c / 1e9);
        }
        println!();
    }
}

/// A decode step's attention at past `past` over 28 layers' f16 caches (see the module
/// docs): median wall time per layer call.
fn decode(past: usize, rounds: usize, threads: &[usize]) {
    let (q_heads, kv_heads, d, layers) = (16, 8, 128, 28);
    let a = CachedAttention {
        q_heads,
        kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        softcap: 0.0,
        window: None,
    };
    let mut seed = 0x2545_F491_4F6C_DD1D;
    let q = rnd(&mut seed, q_heads * d);
    let cache = |seed: &mut u64| -> Vec<half::f16> {
        rnd(seed, (past + 1) * kv_heads * d)
            .into_iter()
            .map(half::f16::from_f32)
            .collect()
    };
    let kv: Vec<(Vec<half::f16>, Vec<half::f16>)> = (0..layers)
        .map(|_| (cache(&mut seed), cache(&mut seed)))
        .collect();
    let mut out = vec![0f32; q.len()];
    for &t in threads {
        let pool = WorkerPool::new(t).expect("pool");
        let par: &dyn Parallel = if t == 1 { &Sequential } else { &pool };
        let mut wall = Vec::new();
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..10 {
                for (k, v) in &kv {
                    cached_attention(&a, &q, k, v, past, &mut out, par).expect("attention");
                }
            }
            wall.push(start.elapsed().as_secs_f64() / (10 * layers) as f64);
        }
        let w = median(wall);
        let bytes = 2.0 * ((past + 1) * kv_heads * d * 2) as f64;
        println!(
            "threads {t} decode past {past}: {:7.1} us per layer ({:5.1} GB/s of cache)",
            w * 1e6,
            bytes / w / 1e9
        );
    }
}
