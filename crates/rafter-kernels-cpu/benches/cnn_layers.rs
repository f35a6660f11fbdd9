//! The CNN layers rafter computes directly rather than as GEMMs, 2 threads: ResNet-50's 7×7
//! stride-2 stem (`stem_conv`, NCHW, with bias and ReLU; and `small_conv_nhwc` writing NHWC
//! from the NCHW input), and MobileNetV2's 3×3 stride-2 RGB
//! stem (`small_conv_nhwc`, from NHWC and from NCHW input) and depthwise 3×3 layers
//! (`depthwise_nhwc`), with the model's bias and ReLU6. Prints the median µs a call, GFLOP/s and the
//! GB/s of one read of the input and one write of the output. Run it from two builds,
//! alternated, to compare kernel versions.
//!
//! Last, the depthwise stage as `block_nhwc` runs it: a band of a few interior rows held in
//! L2, on one thread (less noisy than two). With `BANDS_ONLY` set, only that part runs, 20
//! times over, for `perf record`.
use std::time::Instant;

use rafter_kernels_cpu::{
    depthwise_nhwc, small_conv_nhwc, stem_conv, ChannelTail, DepthwiseNhwc, Sequential,
    SmallConvNhwc, StemConv, WindowNhwc, WorkerPool,
};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1000.0 - 1.0)
        .collect()
}

/// The median seconds of 200 calls of `f`.
fn median(mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn report(what: &str, secs: f64, flops: f64, bytes: f64) {
    println!(
        "{what:<22}: {:7.1} us  {:5.1} GFLOP/s  {:5.1} GB/s",
        secs * 1e6,
        flops / secs / 1e9,
        bytes / secs / 1e9
    );
}

fn stem(pool: &WorkerPool) {
    let (hw, o, cin, cout) = (224usize, 112usize, 3usize, 32usize);
    let x = data(hw * hw * cin);
    let w = data(27 * cout);
    let b = data(cout);
    let mut y = vec![0f32; o * o * cout];
    for nchw in [false, true] {
        let conv = SmallConvNhwc {
            window: WindowNhwc {
                input: &x,
                h: hw,
                w: hw,
                channels: cin,
                kernel: [3, 3],
                stride: [2, 2],
                pads: [1, 1],
                out: [o, o],
            },
            input_nchw: nchw,
            weights: &w,
            cout,
            tail: ChannelTail {
                bias: Some(&b),
                clamp: Some((0.0, 6.0)),
                ..ChannelTail::default()
            },
        };
        let med = median(|| small_conv_nhwc(&conv, &mut y, pool).unwrap());
        let what = if nchw {
            "stem from NCHW"
        } else {
            "stem from NHWC"
        };
        let flops = 2.0 * 27.0 * y.len() as f64;
        report(what, med, flops, 4.0 * (x.len() + y.len()) as f64);
    }
}

fn resnet_stem(pool: &WorkerPool) {
    let (hw, o, cin, cout) = (224usize, 112usize, 3usize, 64usize);
    let x = data(cin * hw * hw);
    let w = data(cout * cin * 49);
    let b = data(cout);
    let mut y = vec![0f32; cout * o * o];
    let conv = StemConv {
        input: &x,
        cin,
        h: hw,
        w: hw,
        weights: &w,
        cout,
        kernel: [7, 7],
        stride: 2,
        pads: [3, 3],
        out: [o, o],
        bias: Some(&b),
        residual: None,
        res_before: false,
        relu: true,
        clamp: None,
    };
    let med = median(|| stem_conv(&conv, &mut y, pool).unwrap());
    let flops = 2.0 * 147.0 * y.len() as f64;
    let bytes = 4.0 * (x.len() + y.len()) as f64;
    report("resnet stem (NCHW)", med, flops, bytes);
    // The same convolution writing NHWC, reading the NCHW input in place.
    let direct = SmallConvNhwc {
        window: WindowNhwc {
            input: &x,
            h: hw,
            w: hw,
            channels: cin,
            kernel: [7, 7],
            stride: [2, 2],
            pads: [3, 3],
            out: [o, o],
        },
        input_nchw: true,
        weights: &w,
        cout,
        tail: ChannelTail {
            bias: Some(&b),
            relu: true,
            ..ChannelTail::default()
        },
    };
    let med = median(|| small_conv_nhwc(&direct, &mut y, pool).unwrap());
    report("resnet stem to NHWC", med, flops, bytes);
}

fn main() {
    if std::env::var_os("BANDS_ONLY").is_some() {
        for _ in 0..20 {
            bands();
        }
        return;
    }
    let pool = WorkerPool::new(2).unwrap();
    resnet_stem(&pool);
    stem(&pool);
    // (input size, channels, stride), in the model's order of first appearance.
    let shapes = [
        (112usize, 32usize, 1usize),
        (112, 96, 2),
        (56, 144, 1),
        (56, 144, 2),
        (28, 192, 1),
        (28, 192, 2),
        (14, 384, 1),
        (14, 576, 1),
        (14, 576, 2),
        (7, 960, 1),
    ];
    let mut total = 0.0;
    for &(hw, ch, s) in &shapes {
        let o = (hw + 2 - 3) / s + 1;
        let x = data(hw * hw * ch);
        let w = data(9 * ch);
        let b = data(ch);
        let mut y = vec![0f32; o * o * ch];
        let conv = depthwise3x3(&x, [hw, hw, ch], s, [1, 1], [o, o], &w, &b);
        let med = median(|| depthwise_nhwc(&conv, &mut y, &pool).unwrap());
        total += med;
        let flops = 2.0 * 9.0 * (o * o * ch) as f64;
        let what = format!("dw {hw}x{hw} c{ch} s{s}");
        report(&what, med, flops, 4.0 * (x.len() + y.len()) as f64);
    }
    println!("depthwise total {:.1} us", total * 1e6);
    bands();
}

/// A 3×3 depthwise convolution of stride `s` over `x` (`h x w x channels`) with bias and
/// ReLU6, MobileNetV2's.
fn depthwise3x3<'a>(
    x: &'a [f32],
    [h, w, channels]: [usize; 3],
    s: usize,
    pads: [usize; 2],
    out: [usize; 2],
    weights: &'a [f32],
    bias: &'a [f32],
) -> DepthwiseNhwc<'a> {
    DepthwiseNhwc {
        window: WindowNhwc {
            input: x,
            h,
            w,
            channels,
            kernel: [3, 3],
            stride: [s, s],
            pads,
            out,
        },
        weights,
        tail: ChannelTail {
            bias: Some(bias),
            clamp: Some((0.0, 6.0)),
            ..ChannelTail::default()
        },
    }
}

/// The depthwise stage as a block runs it: one band of an image's interior rows, held in
/// L2, on one thread (`block_nhwc`'s bands of MobileNetV2's blocks: output rows a band
/// computes, width, channels, stride).
fn bands() {
    let shapes = [
        (11usize, 112usize, 32usize, 1usize),
        (2, 112, 96, 2),
        (4, 56, 144, 1),
        (4, 56, 144, 2),
        (8, 28, 192, 1),
        (4, 14, 576, 1),
    ];
    let mut total = 0.0;
    for &(rows, w, ch, s) in &shapes {
        let ow = (w + 2 - 3) / s + 1;
        let hin = (rows - 1) * s + 3;
        let x = data(hin * w * ch);
        let wt = data(9 * ch);
        let b = data(ch);
        let mut y = vec![0f32; rows * ow * ch];
        let conv = depthwise3x3(&x, [hin, w, ch], s, [0, 1], [rows, ow], &wt, &b);
        // A band is a few microseconds: time 20 of them per sample.
        let med = median(|| {
            for _ in 0..20 {
                depthwise_nhwc(&conv, &mut y, &Sequential).unwrap();
            }
        }) / 20.0;
        total += med;
        let flops = 2.0 * 9.0 * (rows * ow * ch) as f64;
        let what = format!("band {rows}x{ow} c{ch} s{s} 1T");
        report(&what, med, flops, 4.0 * (x.len() + y.len()) as f64);
    }
    println!("bands total {:.2} us", total * 1e6);
}
