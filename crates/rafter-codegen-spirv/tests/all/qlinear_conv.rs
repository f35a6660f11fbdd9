//! `qlinear_conv` on the Vulkan device (lavapipe in CI) against the reference executor:
//! u8 and i8 inputs, weights and results, pads, strides, dilations, groups (depthwise
//! included), per-channel weight scales and zero points, a bias, `auto_pad`, 1-D and 3-D
//! windows, and scales, zero points and weights folded into the body as constants.
//!
//! The kernel requantizes in f32 as ONNX Runtime does and the reference in f64, so a
//! result a rounding away from a .5 tie may differ by one: every element must be within
//! one of the reference and all but a handful (0.5%) equal to it. A wrong tap, channel,
//! zero point or scale moves most elements by more.

use crate::common;

use rafter_codegen_spirv::{kernel_module, qlinear_conv};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// `count` bytes from a small generator.
fn bytes(count: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..count)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

fn int(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_le_bytes(dtype, dims, &bytes(n, seed)).unwrap()
}

fn word(dtype: DType) -> &'static str {
    if dtype == DType::U8 {
        "u8"
    } else {
        "i8"
    }
}

/// One convolution case: shapes, attributes and operand types.
struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    y: Vec<usize>,
    attrs: String,
    xt: DType,
    wt: DType,
    yt: DType,
    per_channel: bool,
    bias: bool,
}

impl Case {
    fn text(&self) -> String {
        let m = self.w[0];
        let wq = if self.per_channel {
            format!("[{m}]")
        } else {
            "[]".into()
        };
        let bias = if self.bias {
            format!(", %b: i32[{m}]")
        } else {
            String::new()
        };
        let b_arg = if self.bias { ", %b" } else { "" };
        format!(
            "graph @q(%x: {xt}[{x}], %xs: f32[], %xz: {xt}[], %w: {wt}[{w}], %ws: f32{wq}, %wz: {wt}{wq}, %ys: f32[], %yz: {yt}[]{bias}) -> (%y) {{\n  %y: {yt}[{y}] = qlinear_conv{{{attrs}}}(%x, %xs, %xz, %w, %ws, %wz, %ys, %yz{b_arg})\n}}",
            xt = word(self.xt),
            wt = word(self.wt),
            yt = word(self.yt),
            x = common::dims_text(&self.x),
            w = common::dims_text(&self.w),
            y = common::dims_text(&self.y),
            attrs = self.attrs,
        )
    }

    fn inputs(&self, seed: u64) -> Vec<Tensor> {
        let m = self.w[0];
        let k: usize = self.w[1..].iter().product();
        let (xs, ws0) = (0.021f32, 0.0093f32);
        let wq: Vec<usize> = if self.per_channel { vec![m] } else { vec![] };
        let ws: Vec<f32> = (0..wq.iter().product())
            .map(|i| ws0 * (1.0 + 0.1 * i as f32))
            .collect();
        // A scale that spreads typical sums over the output range, saturating some.
        let ys = xs * ws0 * (k as f32).sqrt() * 90.0;
        let mut v = vec![
            int(self.xt, &self.x, seed),
            Tensor::f32s(&[], vec![xs]),
            int(self.xt, &[], seed + 1),
            int(self.wt, &self.w, seed + 2),
            Tensor::f32s(&wq, ws),
            int(self.wt, &wq, seed + 3),
            Tensor::f32s(&[], vec![ys]),
            int(self.yt, &[], seed + 4),
        ];
        if self.bias {
            let b: Vec<i32> = (0..m).map(|i| (i as i32 - 2) * 3001).collect();
            let bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
            v.push(Tensor::from_le_bytes(DType::I32, &[m], &bytes).unwrap());
        }
        v
    }
}

/// Every element within one of the reference, all but 0.5% equal.
fn assert_matches(got: &Tensor, want: &Tensor, what: &str) {
    let (g, w) = (got.to_i64_vec().unwrap(), want.to_i64_vec().unwrap());
    assert_eq!(g.len(), w.len(), "{what}");
    let mut off = 0;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1, "{what}: element {i}: {a} vs {b}");
        off += usize::from(a != b);
    }
    assert!(
        off * 200 <= g.len(),
        "{what}: {off} of {} elements off by one",
        g.len()
    );
    // The case exercises the range: not everything saturated or equal.
    let distinct: std::collections::BTreeSet<i64> = w.iter().copied().collect();
    assert!(
        distinct.len() > 8,
        "{what}: a degenerate case ({distinct:?})"
    );
}

/// The scalar scales and zero points (x_scale, x_zp, y_scale, y_zp) folded, as the
/// compiler folds such initializers of a quantized model: a dispatch binds at most 8
/// buffers.
const SCALARS: &[usize] = &[1, 2, 6, 7];

fn check(case: &Case, fold: &[usize]) {
    let text = case.text();
    let mut g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let mut inputs = case.inputs(7);
    // Fold from the last input so the earlier indices stay put.
    for &i in fold.iter().rev() {
        g = common::fold_input(&g, i, &inputs[i]);
        inputs.remove(i);
    }
    let kernel = qlinear_conv(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "qlinear_conv");
    let Some(device) = common::device_or_skip("qlinear conv") else {
        return;
    };
    let module = kernel_module(&g, 0).unwrap();
    let want = rafter_reference::run(&g, inputs.clone()).unwrap().remove(0);
    let got = common::run_module(&device, &module, &inputs, (case.yt, &case.y));
    assert_matches(&got, &want, &text);
}

fn attrs(
    k: &[usize],
    s: &[usize],
    pads: &[usize],
    d: &[usize],
    group: usize,
    auto: &str,
) -> String {
    let list = |v: &[usize]| format!("[{}]", common::dims_text(v));
    format!(
        "kernel_shape = {}, strides = {}, pads = {}, dilations = {}, group = {group}, auto_pad = {auto}",
        list(k),
        list(s),
        list(pads),
        list(d)
    )
}

#[test]
fn convolutions_of_every_operand_type_match_the_reference() {
    use DType::{I8, U8};
    for (xt, wt, yt) in [(U8, I8, U8), (U8, U8, U8), (I8, I8, I8), (I8, U8, U8)] {
        let case = Case {
            x: vec![2, 3, 9, 9],
            w: vec![5, 3, 3, 3],
            y: vec![2, 5, 9, 9],
            attrs: attrs(&[3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1], 1, "explicit"),
            xt,
            wt,
            yt,
            per_channel: false,
            bias: true,
        };
        check(&case, SCALARS);
    }
}

#[test]
fn strides_dilations_groups_and_per_channel_scales_match_the_reference() {
    // Strided, dilated and asymmetrically padded, two groups, per-channel w scales and
    // zero points, no bias.
    let case = Case {
        x: vec![1, 4, 11, 10],
        w: vec![6, 2, 3, 2],
        y: vec![1, 6, 4, 5],
        attrs: attrs(&[3, 2], &[2, 2], &[1, 0, 0, 1], &[2, 1], 2, "explicit"),
        xt: DType::U8,
        wt: DType::I8,
        yt: DType::U8,
        per_channel: true,
        bias: false,
    };
    check(&case, SCALARS);
    // Depthwise with a bias, same_upper padding.
    let case = Case {
        x: vec![2, 8, 7, 7],
        w: vec![8, 1, 3, 3],
        y: vec![2, 8, 4, 4],
        attrs: attrs(&[3, 3], &[2, 2], &[], &[1, 1], 8, "same_upper"),
        xt: DType::U8,
        wt: DType::I8,
        yt: DType::I8,
        per_channel: true,
        bias: true,
    };
    check(&case, SCALARS);
}

#[test]
fn one_and_three_spatial_dims_match_the_reference() {
    let case = Case {
        x: vec![2, 3, 20],
        w: vec![4, 3, 5],
        y: vec![2, 4, 16],
        attrs: attrs(&[5], &[1], &[0, 0], &[1], 1, "explicit"),
        xt: DType::U8,
        wt: DType::I8,
        yt: DType::U8,
        per_channel: false,
        bias: true,
    };
    check(&case, SCALARS);
    let case = Case {
        x: vec![1, 2, 5, 6, 4],
        w: vec![3, 2, 3, 3, 3],
        y: vec![1, 3, 5, 6, 4],
        attrs: attrs(
            &[3, 3, 3],
            &[1, 1, 1],
            &[1, 1, 1, 1, 1, 1],
            &[1, 1, 1],
            1,
            "explicit",
        ),
        xt: DType::U8,
        wt: DType::I8,
        yt: DType::U8,
        per_channel: true,
        bias: true,
    };
    check(&case, SCALARS);
}

/// Scales, zero points, a small weight and the bias folded into the body, as the
/// compiler folds small initializers: read from the module's `Private` arrays.
#[test]
fn folded_operands_match_the_reference() {
    let case = Case {
        x: vec![1, 2, 8, 8],
        w: vec![4, 2, 2, 2],
        y: vec![1, 4, 7, 7],
        attrs: attrs(&[2, 2], &[1, 1], &[0, 0, 0, 0], &[1, 1], 1, "explicit"),
        xt: DType::U8,
        wt: DType::I8,
        yt: DType::U8,
        per_channel: true,
        bias: true,
    };
    // Everything but x: x_scale, x_zp, w (32 bytes), w_scale, w_zp, y_scale, y_zp, bias.
    check(&case, &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn convolutions_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @q(%x: u8[1, 2, 4, 4], %xs: f32[2], %xz: u8[], %w: i8[2, 2, 1, 1], %ws: f32[], %wz: i8[], %ys: f32[], %yz: u8[]) -> (%y) {\n  %y: u8[1, 2, 4, 4] = qlinear_conv{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %xs, %xz, %w, %ws, %wz, %ys, %yz)\n}",
            "x_scale per channel",
        ),
        (
            "graph @q(%x: u8[1, 2, s, 4], %xs: f32[], %xz: u8[], %w: i8[2, 2, 1, 1], %ws: f32[], %wz: i8[], %ys: f32[], %yz: u8[]) -> (%y) {\n  %y: u8[1, 2, s, 4] = qlinear_conv{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %xs, %xz, %w, %ws, %wz, %ys, %yz)\n}",
            "dim s is not static",
        ),
    ];
    for (text, want) in cases {
        let e =
            qlinear_conv(&parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"))).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    // Nine buffers (every operand a graph input, and the result) pass the 8 push
    // constants hold: their addresses go through the argument block.
    let nine = parse_graph("graph @q(%x: u8[1, 2, 4, 4], %xs: f32[], %xz: u8[], %w: i8[2, 2, 1, 1], %ws: f32[], %wz: i8[], %ys: f32[], %yz: u8[]) -> (%y) {\n  %y: u8[1, 2, 4, 4] = qlinear_conv{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %xs, %xz, %w, %ws, %wz, %ys, %yz)\n}").unwrap();
    qlinear_conv(&nine).unwrap_or_else(|e| panic!("nine bindings refused: {e}"));
}
