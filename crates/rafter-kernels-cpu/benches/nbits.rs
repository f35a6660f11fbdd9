//! `nbits_matmul` (ONNX Runtime's MatMulNBits layout) on a 4096 x 4096 weight, 4-bit, block
//! 32, with zero points, at M = 1 (decode) and M = 128 (prefill), per thread count, at
//! accuracy level 0 (f32) and 4 (int8 activations). The same shapes through ONNX Runtime:
//! `scripts/bench_matmul_nbits_ort.py` (run both in one session, alternating, on a shared
//! machine). Reports medians over calls; GB/s counts the packed weights, scales and zero
//! points read per call.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench nbits -- [ITERS]
//! ```

use std::hint::black_box;
use std::time::Instant;

use rafter_kernels_cpu::{nbits_matmul, MatMut, MatRef, NBitsRef, WorkerPool};

fn main() {
    let iters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let (k, n, block) = (4096usize, 4096usize, 32usize);
    let kb = k / block;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let packed: Vec<u8> = (0..n * kb * block / 2).map(|_| next() as u8).collect();
    let scales: Vec<f32> = (0..n * kb).map(|_| (next() % 1000) as f32 * 2e-5).collect();
    let zps: Vec<u8> = (0..n * kb / 2).map(|_| next() as u8).collect();
    let bytes = packed.len() + scales.len() * 4 + zps.len();
    for threads in [1, 2] {
        let pool = WorkerPool::new(threads).unwrap();
        for m in [1usize, 128] {
            for int8 in [false, true] {
                let x: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; m * n];
                let w = NBitsRef::new(&packed, &scales, Some(&zps), n, k, 4, block)
                    .unwrap()
                    .with_int8_activations(int8);
                let mut times = Vec::new();
                let calls = if m == 1 { iters * 10 } else { iters };
                for i in 0..calls + 3 {
                    let t = Instant::now();
                    nbits_matmul(
                        MatRef::row_major(&x, m, k, k).unwrap(),
                        w,
                        None,
                        MatMut::row_major(&mut y, m, n, n).unwrap(),
                        &pool,
                    )
                    .unwrap();
                    black_box(&y);
                    if i >= 3 {
                        times.push(t.elapsed().as_secs_f64());
                    }
                }
                times.sort_by(f64::total_cmp);
                let med = times[times.len() / 2];
                println!(
                    "threads {threads} m {m:3} accuracy_level {}: median {:8.3} ms, {:6.1} GB/s of weights, {:6.1} GFLOP/s",
                    if int8 { 4 } else { 0 },
                    med * 1e3,
                    bytes as f64 / med / 1e9,
                    2.0 * (m * n * k) as f64 / med / 1e9
                );
            }
        }
    }
}
