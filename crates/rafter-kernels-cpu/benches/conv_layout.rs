//! Layout probe: ResNet-50's 1×1 convolutions as NCHW (W·X, X packed per call) vs NHWC
//! (X·Wᵀ, Wᵀ pre-packed), 2 threads, alternating.
use std::time::Instant;

use rafter_kernels_cpu::{sgemm, Activation, BRef, Epilogue, MatMut, MatRef, PackedB, WorkerPool};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect()
}

fn main() {
    let pool = WorkerPool::new(2).unwrap();
    let shapes = [
        (64usize, 64usize, 56usize),
        (64, 256, 56),
        (256, 64, 56),
        (256, 128, 56),
        (128, 512, 28),
        (512, 128, 28),
        (256, 1024, 14),
        (1024, 256, 14),
        (512, 2048, 7),
        (2048, 512, 7),
    ];
    for &(cin, cout, hw) in &shapes {
        let p = hw * hw;
        let x = data(cin * p);
        let w = data(cout * cin);
        let bias = data(cout);
        // W^T [cin, cout]
        let mut wt = vec![0f32; cin * cout];
        for o in 0..cout {
            for i in 0..cin {
                wt[i * cout + o] = w[o * cin + i];
            }
        }
        let pb = PackedB::pack(cin, cout, &wt, cout).unwrap();
        let mut y = vec![0f32; cout * p];
        let mut t_nchw = vec![];
        let mut t_nhwc = vec![];
        for _ in 0..40 {
            let s = Instant::now();
            let a = MatRef::row_major(&w, cout, cin, cin).unwrap();
            let b = MatRef::row_major(&x, cin, p, p).unwrap();
            let e = Epilogue {
                row_bias: Some(&bias),
                activation: Activation::Relu,
                ..Epilogue::none()
            };
            sgemm(
                1.0,
                a,
                BRef::Mat(b),
                0.0,
                MatMut::row_major(&mut y, cout, p, p).unwrap(),
                &e,
                &pool,
            )
            .unwrap();
            t_nchw.push(s.elapsed().as_secs_f64() * 1e6);
            let s = Instant::now();
            let a = MatRef::row_major(&x, p, cin, cin).unwrap();
            let e = Epilogue {
                bias: Some(&bias),
                activation: Activation::Relu,
                ..Epilogue::none()
            };
            sgemm(
                1.0,
                a,
                BRef::Packed(pb.view()),
                0.0,
                MatMut::row_major(&mut y, p, cout, cout).unwrap(),
                &e,
                &pool,
            )
            .unwrap();
            t_nhwc.push(s.elapsed().as_secs_f64() * 1e6);
        }
        t_nchw.sort_by(f64::total_cmp);
        t_nhwc.sort_by(f64::total_cmp);
        let (a, b) = (t_nchw[20], t_nhwc[20]);
        let gf = 2.0 * (cin * cout * p) as f64 / 1e3;
        println!("{cin:5}->{cout:5} @{hw:3}: nchw {a:8.1} us ({:5.1} GF/s)  nhwc {b:8.1} us ({:5.1} GF/s)  ratio {:.2}", gf / a, gf / b, b / a);
    }
}
