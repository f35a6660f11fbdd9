//! ResNet-50's 3×3 stride-1 convolutions (batch 1, pad 1): Winograd F(2×2, 3×3) against
//! im2col + the same packed GEMM, alternating in one run, 2 threads on a `WorkerPool`.
//! Prints per shape the median ms of each and the ratio.
//!
//! `cargo bench -p rafter-kernels-cpu --bench winograd`

use std::time::Instant;

use rafter_kernels_cpu::{
    conv3x3, sgemm, BRef, Conv3x3, Epilogue, MatMut, MatRef, Parallel, WinogradWeights, WorkerPool,
};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect()
}

/// im2col (pad 1) into `cols` (`cin*9 × h*w`) then `out = W · cols`.
fn im2col_conv(
    x: &[f32],
    w: &[f32],
    (c, h, wd): (usize, usize, usize),
    cols: &mut [f32],
    out: &mut [f32],
    par: &dyn Parallel,
) {
    for ci in 0..c {
        for ky in 0..3 {
            for kx in 0..3 {
                let row = &mut cols[((ci * 3 + ky) * 3 + kx) * h * wd..][..h * wd];
                for y in 0..h {
                    for xx in 0..wd {
                        let (iy, ix) =
                            (y as isize + ky as isize - 1, xx as isize + kx as isize - 1);
                        row[y * wd + xx] =
                            if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                0.0
                            } else {
                                x[(ci * h + iy as usize) * wd + ix as usize]
                            };
                    }
                }
            }
        }
    }
    let k = c * 9;
    let a = MatRef::row_major(w, c, k, k).unwrap();
    let b = MatRef::row_major(cols, k, h * wd, h * wd).unwrap();
    let o = MatMut::row_major(out, c, h * wd, h * wd).unwrap();
    sgemm(1.0, a, BRef::Mat(b), 0.0, o, &Epilogue::none(), par).unwrap();
}

fn median_ms(mut f: impl FnMut(), iters: usize) -> f64 {
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let pool = WorkerPool::new(2).unwrap();
    for &(c, hw) in &[(64usize, 56usize), (128, 28), (256, 14), (512, 7)] {
        let x = data(c * hw * hw);
        let w = data(c * c * 9);
        let ww = WinogradWeights::new(&w, c, c).unwrap();
        let mut out = vec![0f32; c * hw * hw];
        let mut cols = vec![0f32; c * 9 * hw * hw];
        let conv = Conv3x3 {
            input: &x,
            h: hw,
            w: hw,
            pads: [1; 4],
            bias: None,
            residual: None,
            relu: false,
        };
        let (mut wino, mut gemm) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            wino.push(median_ms(
                || conv3x3(&conv, &ww, &mut out, &pool).unwrap(),
                15,
            ));
            gemm.push(median_ms(
                || im2col_conv(&x, &w, (c, hw, hw), &mut cols, &mut out, &pool),
                15,
            ));
        }
        wino.sort_by(f64::total_cmp);
        gemm.sort_by(f64::total_cmp);
        let (wm, gm) = (wino[1], gemm[1]);
        let gflop = 2.0 * (c * c * 9 * hw * hw) as f64 / 1e9;
        println!(
            "conv3x3 {c}->{c} {hw}x{hw}: winograd {wm:.3} ms, im2col+gemm {gm:.3} ms, ratio {:.2}x ({:.0} vs {:.0} effective GFLOP/s)",
            gm / wm,
            gflop / wm * 1e3,
            gflop / gm * 1e3
        );
    }
}
