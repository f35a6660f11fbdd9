//! MobileNetV2's inverted-residual blocks, 2 threads: `block_nhwc` (band by band, the
//! expansion kept in cache) against the same three stages run one after another over whole
//! tensors (`sgemm` → `depthwise_nhwc` → `sgemm`, as the runtime runs unfused layers), the
//! two alternated call by call. Prints the median µs a call of each and their ratio.
//!
//! ```sh
//! cargo bench -p rafter-kernels-cpu --bench block_nhwc
//! ```
use std::time::Instant;

use rafter_kernels_cpu::{
    block_nhwc, depthwise_nhwc, sgemm, small_conv_nhwc, Activation, BRef, BlockNhwc, ChannelTail,
    DepthwiseNhwc, DepthwiseStage, Epilogue, MatMut, MatRef, PackedB, Pointwise, Residual,
    SmallConvNhwc, WindowNhwc, WorkerPool,
};

/// A pre-packed 1×1 projection with a bias and no activation (a linear bottleneck).
fn projection<'a>(wp: &'a PackedB, bp: &'a [f32]) -> Pointwise<'a> {
    Pointwise {
        weights: BRef::Packed(wp.view()),
        alpha: 1.0,
        epilogue: Epilogue {
            bias: Some(bp),
            ..Epilogue::none()
        },
    }
}

fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect()
}

/// One block: input `h×w×c`, expansion to `mid` (none when `mid == c`), depthwise stride
/// `s`, projection to `cout`, a skip when the shapes allow.
struct Shape {
    h: usize,
    c: usize,
    mid: usize,
    s: usize,
    cout: usize,
}

fn main() {
    let pool = WorkerPool::new(2).expect("worker pool");
    let shapes = [
        Shape {
            h: 112,
            c: 32,
            mid: 32,
            s: 1,
            cout: 16,
        },
        Shape {
            h: 112,
            c: 16,
            mid: 96,
            s: 2,
            cout: 24,
        },
        Shape {
            h: 56,
            c: 24,
            mid: 144,
            s: 1,
            cout: 24,
        },
        Shape {
            h: 56,
            c: 24,
            mid: 144,
            s: 2,
            cout: 32,
        },
        Shape {
            h: 28,
            c: 32,
            mid: 192,
            s: 1,
            cout: 32,
        },
        Shape {
            h: 28,
            c: 32,
            mid: 192,
            s: 2,
            cout: 64,
        },
        Shape {
            h: 14,
            c: 64,
            mid: 384,
            s: 1,
            cout: 64,
        },
        Shape {
            h: 14,
            c: 96,
            mid: 576,
            s: 1,
            cout: 96,
        },
    ];
    println!("| block | separate µs | fused µs | separate / fused |");
    println!("|---|---:|---:|---:|");
    let (mut total_sep, mut total_fused) = (0.0, 0.0);
    for sh in &shapes {
        let (sep, fused) = run(sh, &pool);
        total_sep += sep;
        total_fused += fused;
        println!(
            "| {}×{}×{} → {} s{} → {} | {:.1} | {:.1} | {:.2} |",
            sh.h,
            sh.h,
            sh.c,
            sh.mid,
            sh.s,
            sh.cout,
            sep,
            fused,
            sep / fused
        );
    }
    println!(
        "| all | {total_sep:.1} | {total_fused:.1} | {:.2} |",
        total_sep / total_fused
    );
    let (sep, fused) = stem_block(&pool);
    println!(
        "| stem 3×224×224 → 32 s2, then 112×112×32 → dw → 16 | {sep:.1} | {fused:.1} | {:.2} |",
        sep / fused
    );
}

/// MobileNetV2's stem (`small_conv_nhwc` from NCHW) then its first block (depthwise and
/// projection), against the block with the stem as its first stage: median µs of each,
/// 300 alternated calls.
fn stem_block(pool: &WorkerPool) -> (f64, f64) {
    let (hw, o, c, co) = (224usize, 112usize, 32usize, 16usize);
    let x = data(3 * hw * hw, 1);
    let (ws, bs) = (data(27 * c, 2), data(c, 3));
    let (wd, bd) = (data(9 * c, 4), data(c, 5));
    let wp = PackedB::pack(c, co, &data(c * co, 6), co).expect("pack");
    let bp = data(co, 7);
    let relu6 = |b| ChannelTail {
        bias: Some(b),
        clamp: Some((0.0, 6.0)),
        ..ChannelTail::default()
    };
    let stem = SmallConvNhwc {
        window: WindowNhwc {
            input: &x,
            h: hw,
            w: hw,
            channels: 3,
            kernel: [3, 3],
            stride: [2, 2],
            pads: [1, 1],
            out: [o, o],
        },
        input_nchw: true,
        weights: &ws,
        cout: c,
        tail: relu6(&bs),
    };
    let block = BlockNhwc {
        input: &[],
        stem: None,
        n: 1,
        h: o,
        w: o,
        channels: c,
        expand: None,
        depthwise: DepthwiseStage {
            kernel: [3, 3],
            stride: [1, 1],
            pads: [1, 1],
            out: [o, o],
            weights: &wd,
            tail: relu6(&bd),
        },
        project: Some(projection(&wp, &bp)),
        residual: None,
    };
    let mut map = vec![0f32; o * o * c];
    let (mut y, mut y2) = (vec![0f32; o * o * co], vec![0f32; o * o * co]);
    let separate = || {
        small_conv_nhwc(&stem, &mut map, pool).unwrap();
        let b = BlockNhwc {
            input: &map,
            ..block
        };
        block_nhwc(&b, &mut y, pool).unwrap();
    };
    let fused_block = BlockNhwc {
        stem: Some(stem),
        ..block
    };
    let fused = || block_nhwc(&fused_block, &mut y2, pool).unwrap();
    let times = alternated(separate, fused);
    assert_eq!(y, y2, "fused and separate differ");
    times
}

/// Median µs of (separate stages, fused block), 300 alternated calls each.
fn run(sh: &Shape, pool: &WorkerPool) -> (f64, f64) {
    let (h, c, mid, s, co) = (sh.h, sh.c, sh.mid, sh.s, sh.cout);
    let oh = (h + 2 - 3) / s + 1;
    let expand = mid != c;
    let skip = s == 1 && c == co;
    let x = data(h * h * c, 1);
    let we = PackedB::pack(c, mid, &data(c * mid, 2), mid).expect("pack");
    let wp = PackedB::pack(mid, co, &data(mid * co, 3), co).expect("pack");
    let (be, bd, bp) = (data(mid, 4), data(mid, 5), data(co, 6));
    let wd = data(9 * mid, 7);
    let relu6 = |b| Epilogue {
        bias: Some(b),
        activation: Activation::None,
        clamp: Some((0.0, 6.0)),
        ..Epilogue::none()
    };
    let dw_tail = ChannelTail {
        bias: Some(&bd),
        clamp: Some((0.0, 6.0)),
        ..ChannelTail::default()
    };
    let block = BlockNhwc {
        input: &x,
        stem: None,
        n: 1,
        h,
        w: h,
        channels: c,
        expand: expand.then(|| Pointwise {
            weights: BRef::Packed(we.view()),
            alpha: 1.0,
            epilogue: relu6(&be),
        }),
        depthwise: DepthwiseStage {
            kernel: [3, 3],
            stride: [s, s],
            pads: [1, 1],
            out: [oh, oh],
            weights: &wd,
            tail: dw_tail,
        },
        project: Some(projection(&wp, &bp)),
        residual: skip.then_some((&x[..], false)),
    };
    let mut e = vec![0f32; h * h * mid];
    let mut d = vec![0f32; oh * oh * mid];
    let mut y = vec![0f32; oh * oh * co];
    let mut y2 = vec![0f32; oh * oh * co];
    let separate = || {
        let dw_in: &[f32] = if expand {
            let a = MatRef::row_major(&x, h * h, c, c).unwrap();
            let cm = MatMut::row_major(&mut e, h * h, mid, mid).unwrap();
            sgemm(1.0, a, BRef::Packed(we.view()), 0.0, cm, &relu6(&be), pool).unwrap();
            &e
        } else {
            &x
        };
        let conv = DepthwiseNhwc {
            window: WindowNhwc {
                input: dw_in,
                h,
                w: h,
                channels: mid,
                kernel: [3, 3],
                stride: [s, s],
                pads: [1, 1],
                out: [oh, oh],
            },
            weights: &wd,
            tail: dw_tail,
        };
        depthwise_nhwc(&conv, &mut d, pool).unwrap();
        let a = MatRef::row_major(&d, oh * oh, mid, mid).unwrap();
        let cm = MatMut::row_major(&mut y, oh * oh, co, co).unwrap();
        let epi = Epilogue {
            bias: Some(&bp),
            residual: skip.then(|| Residual::row_major(&x, co, false)),
            ..Epilogue::none()
        };
        sgemm(1.0, a, BRef::Packed(wp.view()), 0.0, cm, &epi, pool).unwrap();
    };
    let fused = || block_nhwc(&block, &mut y2, pool).unwrap();
    let times = alternated(separate, fused);
    let diff = y
        .iter()
        .zip(&y2)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-3, "fused and separate differ by {diff}");
    times
}

/// Median µs a call of `a` and of `b`: 20 warm-up calls each, then 300 alternated.
fn alternated(mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        a();
        b();
    }
    for _ in 0..300 {
        let t = Instant::now();
        a();
        ta.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b();
        tb.push(t.elapsed().as_secs_f64());
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e6
    };
    (med(ta), med(tb))
}
