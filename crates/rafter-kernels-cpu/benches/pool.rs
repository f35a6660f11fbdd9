//! Overhead of one `Parallel::run` of 2 near-empty tasks: a persistent `WorkerPool`
//! against `ScopedThreads` (threads spawned per call) and a rayon pool, alternating.
//!
//! `cargo bench -p rafter-kernels-cpu --bench pool`

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rafter_kernels_cpu::{Parallel, ScopedThreads, WorkerPool};

/// Median microseconds per call over `rounds` rounds of `calls` calls.
fn median_us(rounds: usize, calls: usize, mut call: impl FnMut()) -> f64 {
    let mut per: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                call();
            }
            t.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

fn main() {
    let threads = 2;
    let pool = WorkerPool::new(threads).expect("pool");
    let scoped = ScopedThreads::new(threads);
    let rayon = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon");
    let sink = AtomicU64::new(0);
    let task = |i: usize| {
        sink.fetch_add(black_box(i as u64), Ordering::Relaxed);
    };
    for round in 0..3 {
        let p = median_us(9, 2000, || pool.run(2, &task));
        let s = median_us(9, 200, || scoped.run(2, &task));
        let r = median_us(9, 2000, || {
            rayon.scope(|sc| {
                sc.spawn(|_| task(1));
                task(0);
            })
        });
        println!(
            "round {round}: WorkerPool {p:.2} us/call, ScopedThreads {s:.2} us/call, rayon scope {r:.2} us/call"
        );
    }
}
