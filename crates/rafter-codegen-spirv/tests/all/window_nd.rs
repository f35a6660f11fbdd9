//! 3-D pooling and convolution (`pool` and `conv` with three spatial dims) on the Vulkan
//! device (lavapipe in CI), against the reference executor: max, average (pads counted or
//! not) and Lp (p = 1, 2, 3) pooling, strides, dilations, symmetric and asymmetric pads,
//! `ceil_mode` windows hanging past the padded input, `same_upper` padding; convolutions
//! ungrouped, grouped and depthwise with a bias bound, folded or absent; f32 and f16.

use crate::common;

use half::f16;
use rafter_codegen_spirv::{conv_nd, kernel_module, pool_nd};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

const X: [usize; 5] = [2, 2, 5, 6, 4];

/// One window configuration: kernel, strides, dilations, pads (begins then ends).
struct Window {
    k: [usize; 3],
    s: [usize; 3],
    d: [usize; 3],
    pads: [usize; 6],
}

/// The output's spatial dims, as the reference's `pool_geometry` computes them.
fn out_dims(w: &Window, ceil: bool) -> [usize; 3] {
    let mut o = [0; 3];
    for i in 0..3 {
        let eff = (w.k[i] - 1) * w.d[i] + 1;
        let span = X[2 + i] + w.pads[i] + w.pads[3 + i] - eff;
        let mut n = span / w.s[i] + 1;
        if ceil && span % w.s[i] != 0 {
            n += 1;
            if (n - 1) * w.s[i] >= X[2 + i] + w.pads[i] {
                n -= 1;
            }
        }
        o[i] = n;
    }
    o
}

fn run(device: &rafter_hal_vulkan::VulkanDevice, dtype: DType, attrs: &str, out: &[usize]) {
    let text = format!(
        "graph @p(%x: {dtype}[{}]) -> (%y) {{\n  %y: {dtype}[{}] = pool{{{attrs}, storage_order = 0}}(%x)\n}}",
        common::dims_text(&X),
        common::dims_text(out)
    );
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = pool_nd(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "pool_nd");
    let count: usize = X.iter().product();
    let values: Vec<f32> = (0..count)
        .map(|i| ((i * 53) % 41) as f32 * 0.25 - 5.0)
        .collect();
    let x = match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, &X, &bytes).unwrap()
        }
        _ => Tensor::f32s(&X, values),
    };
    let want = rafter_reference::run(&body, vec![x.clone()])
        .unwrap()
        .remove(0);
    assert_eq!(want.shape(), out, "{text}");
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(device, &module, &[x], (dtype, out));
    let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
    for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            common::close(*g as f32, w as f32, 1e-5, rtol),
            "{text}: element {k}: {g} vs reference {w}"
        );
    }
}

#[test]
fn pooling_3d_matches_the_reference() {
    let Some(device) = common::device_or_skip("pool_nd") else {
        return;
    };
    let windows = [
        Window {
            k: [2, 2, 2],
            s: [1, 1, 1],
            d: [1, 1, 1],
            pads: [0; 6],
        },
        Window {
            k: [3, 2, 2],
            s: [2, 2, 1],
            d: [1, 2, 1],
            pads: [1, 0, 1, 1, 1, 0],
        },
        Window {
            k: [2, 3, 2],
            s: [2, 3, 2],
            d: [2, 1, 1],
            pads: [0, 1, 0, 1, 0, 1],
        },
    ];
    for dtype in [DType::F32, DType::F16] {
        for w in &windows {
            for ceil in [false, true] {
                let out_sp = out_dims(w, ceil);
                let out = [X[0], X[1], out_sp[0], out_sp[1], out_sp[2]];
                let geom = format!(
                    "kernel_shape = [{}], strides = [{}], pads = [{}], dilations = [{}], auto_pad = explicit, ceil_mode = {ceil}",
                    common::dims_text(&w.k),
                    common::dims_text(&w.s),
                    common::dims_text(&w.pads),
                    common::dims_text(&w.d)
                );
                for (kind, inc, p) in [
                    ("max", false, 2),
                    ("average", false, 2),
                    ("average", true, 2),
                    ("lp", false, 1),
                    ("lp", false, 2),
                    ("lp", false, 3),
                ] {
                    let attrs =
                        format!("kind = {kind}, {geom}, count_include_pad = {inc}, p = {p}");
                    run(&device, dtype, &attrs, &out);
                }
            }
        }
    }
    // same_upper: the output is ceil(input / stride).
    let attrs = "kind = average, kernel_shape = [3, 3, 2], strides = [2, 2, 2], pads = [], dilations = [], auto_pad = same_upper, ceil_mode = false, count_include_pad = true, p = 2";
    run(&device, DType::F32, attrs, &[2, 2, 3, 3, 2]);
}

/// 3-D convolutions: ungrouped and grouped (2 and depthwise 4), strides, dilations,
/// pads, with a bias read from its binding, folded as a constant, or none; f32 and f16.
#[test]
fn convolution_3d_matches_the_reference() {
    let Some(device) = common::device_or_skip("conv_nd") else {
        return;
    };
    let x_dims = [2usize, 4, 5, 6, 4];
    let w = Window {
        k: [2, 3, 2],
        s: [1, 2, 1],
        d: [2, 1, 1],
        pads: [1, 0, 1, 0, 1, 1],
    };
    let out_sp = {
        let mut o = [0; 3];
        for i in 0..3 {
            let eff = (w.k[i] - 1) * w.d[i] + 1;
            o[i] = (x_dims[2 + i] + w.pads[i] + w.pads[3 + i] - eff) / w.s[i] + 1;
        }
        o
    };
    for dtype in [DType::F32, DType::F16] {
        for (group, m) in [(1usize, 3usize), (2, 6), (4, 4)] {
            for bias in ["input", "const", "none"] {
                let cg = x_dims[1] / group;
                let w_dims = [m, cg, w.k[0], w.k[1], w.k[2]];
                let y_dims = [x_dims[0], m, out_sp[0], out_sp[1], out_sp[2]];
                let (b_in, b_arg) = match bias {
                    "none" => (String::new(), ""),
                    _ => (format!(", %b: {dtype}[{m}]"), ", %b"),
                };
                let text = format!(
                    "graph @c(%x: {dtype}[{}], %w: {dtype}[{}]{b_in}) -> (%y) {{\n  %y: {dtype}[{}] = conv{{kernel_shape = [{}], strides = [{}], pads = [{}], dilations = [{}], group = {group}, auto_pad = explicit}}(%x, %w{b_arg})\n}}",
                    common::dims_text(&x_dims),
                    common::dims_text(&w_dims),
                    common::dims_text(&y_dims),
                    common::dims_text(&w.k),
                    common::dims_text(&w.s),
                    common::dims_text(&w.pads),
                    common::dims_text(&w.d)
                );
                let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let count = |d: &[usize]| d.iter().product::<usize>();
                let xv: Vec<f32> = (0..count(&x_dims))
                    .map(|i| ((i * 37) % 19) as f32 * 0.25 - 2.0)
                    .collect();
                let wv: Vec<f32> = (0..count(&w_dims))
                    .map(|i| ((i * 11) % 7) as f32 * 0.125 - 0.375)
                    .collect();
                let bv: Vec<f32> = (0..m).map(|i| i as f32 * 0.5 - 1.0).collect();
                let mut inputs = vec![
                    common::floats(dtype, &x_dims, &xv),
                    common::floats(dtype, &w_dims, &wv),
                ];
                if bias != "none" {
                    inputs.push(common::floats(dtype, &[m], &bv));
                }
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let body = if bias == "const" {
                    let b = inputs.pop().unwrap();
                    common::fold_input(&body, 2, &b)
                } else {
                    body
                };
                let kernel = conv_nd(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, "conv_nd");
                let module = kernel_module(&body, 0).unwrap();
                let got = common::run_module(&device, &module, &inputs, (dtype, &y_dims));
                let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
                for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                    assert!(
                        common::close(*g as f32, w as f32, 1e-4, rtol),
                        "{text} (bias {bias}): element {k}: {g} vs reference {w}"
                    );
                }
            }
        }
    }
}
