//! Transposed convolution (`conv_transpose`) on the Vulkan device (lavapipe in CI),
//! against the reference executor: 1-, 2- and 3-D; strides, dilations, explicit and
//! asymmetric pads, `output_padding`, `output_shape` (which may ask for pads below zero)
//! and `same_upper`/`same_lower`; ungrouped, grouped and depthwise; a bias bound, folded
//! or absent; f32 and f16. Every module passes spirv-val.

use crate::common;

use rafter_codegen_spirv::{conv_transpose, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;

/// One configuration: x's dims, output channels per group, groups, kernel, and the
/// attributes as the IR text writes them (strides, pads, ...); `out` the output's
/// spatial dims.
struct Case {
    x: Vec<usize>,
    m_per_group: usize,
    group: usize,
    kernel: Vec<usize>,
    attrs: &'static str,
    out: Vec<usize>,
}

fn cases() -> Vec<Case> {
    vec![
        // 1-D, stride 2, asymmetric pads, output padding: 2 * 4 + 1 + 3 - 1 - 0 = 11.
        Case {
            x: vec![2, 3, 5],
            m_per_group: 2,
            group: 1,
            kernel: vec![3],
            attrs: "strides = [2], pads = [1, 0], dilations = [1], auto_pad = explicit, output_padding = [1], output_shape = []",
            out: vec![11],
        },
        // 2-D, two groups, strides and dilations: h 2*3+3-1-0 = 8, w 1*4+(2-1)*2+1-0-1 = 6.
        Case {
            x: vec![2, 4, 4, 5],
            m_per_group: 3,
            group: 2,
            kernel: vec![3, 2],
            attrs: "strides = [2, 1], pads = [1, 0, 0, 1], dilations = [1, 2], auto_pad = explicit, output_padding = [], output_shape = []",
            out: vec![8, 6],
        },
        // 2-D depthwise (4 groups of one channel), stride 3 with gaps between windows.
        Case {
            x: vec![1, 4, 3, 3],
            m_per_group: 1,
            group: 4,
            kernel: vec![2, 2],
            attrs: "strides = [3, 3], pads = [0, 0, 0, 0], dilations = [1, 1], auto_pad = explicit, output_padding = [], output_shape = []",
            out: vec![8, 8],
        },
        // output_shape larger than the full output: a negative leading pad.
        Case {
            x: vec![1, 2, 3, 3],
            m_per_group: 2,
            group: 1,
            kernel: vec![3, 3],
            attrs: "strides = [2, 2], pads = [], dilations = [], auto_pad = explicit, output_padding = [], output_shape = [10, 8]",
            out: vec![10, 8],
        },
        // same_upper and same_lower: the output is in * stride.
        Case {
            x: vec![1, 2, 3, 4],
            m_per_group: 2,
            group: 1,
            kernel: vec![3, 2],
            attrs: "strides = [2, 2], pads = [], dilations = [], auto_pad = same_upper, output_padding = [], output_shape = []",
            out: vec![6, 8],
        },
        Case {
            x: vec![1, 2, 3, 4],
            m_per_group: 2,
            group: 1,
            kernel: vec![3, 2],
            attrs: "strides = [2, 2], pads = [], dilations = [], auto_pad = same_lower, output_padding = [], output_shape = []",
            out: vec![6, 8],
        },
        // 3-D, strides, a dilation, pads (begins 1, 0, 0; ends 0, 1, 0): 2*2+2-1 = 5,
        // 1*3+(2-1)*2+1-1 = 5, 2*2+2 = 6.
        Case {
            x: vec![1, 2, 3, 4, 3],
            m_per_group: 2,
            group: 1,
            kernel: vec![2, 2, 2],
            attrs: "strides = [2, 1, 2], pads = [1, 0, 0, 0, 1, 0], dilations = [1, 2, 1], auto_pad = explicit, output_padding = [], output_shape = []",
            out: vec![5, 5, 6],
        },
    ]
}

fn run(device: &rafter_hal_vulkan::VulkanDevice, c: &Case, dtype: DType, bias: &str) {
    let m = c.m_per_group * c.group;
    let w_dims: Vec<usize> = [vec![c.x[1], c.m_per_group], c.kernel.clone()].concat();
    let y_dims: Vec<usize> = [vec![c.x[0], m], c.out.clone()].concat();
    let (b_in, b_arg) = match bias {
        "none" => (String::new(), ""),
        _ => (format!(", %b: {dtype}[{m}]"), ", %b"),
    };
    let text = format!(
        "graph @t(%x: {dtype}[{}], %w: {dtype}[{}]{b_in}) -> (%y) {{\n  %y: {dtype}[{}] = conv_transpose{{kernel_shape = [{}], {}, group = {}}}(%x, %w{b_arg})\n}}",
        common::dims_text(&c.x),
        common::dims_text(&w_dims),
        common::dims_text(&y_dims),
        common::dims_text(&c.kernel),
        c.attrs,
        c.group,
    );
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let count = |d: &[usize]| d.iter().product::<usize>();
    let xv: Vec<f32> = (0..count(&c.x))
        .map(|i| ((i * 37) % 19) as f32 * 0.25 - 2.0)
        .collect();
    let wv: Vec<f32> = (0..count(&w_dims))
        .map(|i| ((i * 11) % 7) as f32 * 0.125 - 0.375)
        .collect();
    let bv: Vec<f32> = (0..m).map(|i| i as f32 * 0.5 - 1.0).collect();
    let mut inputs = vec![
        common::floats(dtype, &c.x, &xv),
        common::floats(dtype, &w_dims, &wv),
    ];
    if bias != "none" {
        inputs.push(common::floats(dtype, &[m], &bv));
    }
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .remove(0);
    assert_eq!(want.shape(), y_dims, "{text}");
    let body = if bias == "const" {
        let b = inputs.pop().unwrap();
        common::fold_input(&body, 2, &b)
    } else {
        body
    };
    let kernel = conv_transpose(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "conv_transpose");
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(device, &module, &inputs, (dtype, &y_dims));
    let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
    for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            common::close(*g as f32, w as f32, 1e-4, rtol),
            "{text} (bias {bias}): element {k}: {g} vs reference {w}"
        );
    }
}

#[test]
fn conv_transpose_matches_the_reference() {
    let Some(device) = common::device_or_skip("conv_transpose") else {
        return;
    };
    for c in &cases() {
        for bias in ["input", "const", "none"] {
            run(&device, c, DType::F32, bias);
        }
        run(&device, c, DType::F16, "input");
    }
}

/// Shapes and attributes the kernel does not take are refused with a reason (the kernel
/// then stays on the CPU), never a panic.
#[test]
fn conv_transpose_refusals_name_the_reason() {
    // A symbolic spatial dim.
    let text = "graph @t(%x: f32[1, 2, n], %w: f32[2, 2, 3]) -> (%y) {\n  %y: f32[1, 2, m] = conv_transpose{kernel_shape = [3], strides = [1], pads = [0, 0], dilations = [1], auto_pad = explicit, output_padding = [], output_shape = [], group = 1}(%x, %w)\n}";
    let body = parse_graph(text).unwrap();
    let err = conv_transpose(&body).unwrap_err();
    assert!(err.contains("not static"), "{err}");
    // An output type the attributes disagree with.
    let text = "graph @t(%x: f32[1, 2, 4], %w: f32[2, 2, 3]) -> (%y) {\n  %y: f32[1, 2, 7] = conv_transpose{kernel_shape = [3], strides = [1], pads = [0, 0], dilations = [1], auto_pad = explicit, output_padding = [], output_shape = [], group = 1}(%x, %w)\n}";
    let body = parse_graph(text).unwrap();
    let err = conv_transpose(&body).unwrap_err();
    assert!(err.contains("attributes give 6"), "{err}");
    // A zero stride.
    let text = "graph @t(%x: f32[1, 2, 4], %w: f32[2, 2, 3]) -> (%y) {\n  %y: f32[1, 2, 6] = conv_transpose{kernel_shape = [3], strides = [0], pads = [0, 0], dilations = [1], auto_pad = explicit, output_padding = [], output_shape = [], group = 1}(%x, %w)\n}";
    let body = parse_graph(text).unwrap();
    assert!(conv_transpose(&body).unwrap_err().contains("zero"));
}

/// A fused tail after the convolution: a per-channel scale (a body input `[1, M, 1, 1]`),
/// a scalar shift and a relu; a sigmoid; and, f16, a relu (each op's value rounded to
/// f16 as if stored). A tail operand read per position is refused.
#[test]
fn conv_transpose_with_a_fused_tail_matches_the_reference() {
    let Some(device) = common::device_or_skip("conv_transpose tail") else {
        return;
    };
    let head = "conv_transpose{kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 0, 0], dilations = [1, 1], auto_pad = explicit, output_padding = [1, 0], output_shape = [], group = 1}";
    let tails = [
        (DType::F32, ", %s: f32[1, 3, 1, 1]", "  %m: f32[2, 3, 7, 6] = binary{op = mul}(%c, %s)\n  %a: f32[2, 3, 7, 6] = binary{op = add}(%m, %k)\n  %y: f32[2, 3, 7, 6] = unary{op = relu}(%a)\n"),
        (DType::F32, "", "  %y: f32[2, 3, 7, 6] = unary{op = sigmoid}(%c)\n"),
        (DType::F16, "", "  %y: f16[2, 3, 7, 6] = unary{op = relu}(%c)\n"),
    ];
    for (dtype, extra, ops) in tails {
        let text = format!(
            "graph @t(%x: {dtype}[2, 2, 3, 3], %w: {dtype}[2, 3, 3, 3], %b: {dtype}[3]{extra}, %k: {dtype}[]) -> (%y) {{\n  %c: {dtype}[2, 3, 7, 6] = {head}(%x, %w, %b)\n{ops}}}"
        );
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let xv: Vec<f32> = (0..36)
            .map(|i| ((i * 37) % 19) as f32 * 0.25 - 2.0)
            .collect();
        let wv: Vec<f32> = (0..54)
            .map(|i| ((i * 11) % 7) as f32 * 0.125 - 0.375)
            .collect();
        let mut inputs = vec![
            common::floats(dtype, &[2, 2, 3, 3], &xv),
            common::floats(dtype, &[2, 3, 3, 3], &wv),
            common::floats(dtype, &[3], &[0.5, -0.25, 1.0]),
        ];
        if !extra.is_empty() {
            inputs.push(common::floats(dtype, &[1, 3, 1, 1], &[1.5, -2.0, 0.75]));
        }
        inputs.push(common::floats(dtype, &[], &[-0.5]));
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .remove(0);
        let kernel = conv_transpose(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
        common::spirv_val(&kernel.spirv, "conv_transpose_tail");
        let module = kernel_module(&body, 0).unwrap();
        let got = common::run_module(&device, &module, &inputs, (dtype, &[2, 3, 7, 6]));
        let rtol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
        for (k, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            assert!(
                common::close(*g as f32, w as f32, 1e-4, rtol),
                "{text}: element {k}: {g} vs reference {w}"
            );
        }
    }
    // A residual of the output's shape: read per position, which the kernel does not do.
    let text = format!(
        "graph @t(%x: f32[2, 2, 3, 3], %w: f32[2, 3, 3, 3], %r: f32[2, 3, 7, 6]) -> (%y) {{\n  %c: f32[2, 3, 7, 6] = {head}(%x, %w)\n  %y: f32[2, 3, 7, 6] = binary{{op = add}}(%c, %r)\n}}"
    );
    let body = parse_graph(&text).unwrap();
    let err = conv_transpose(&body).unwrap_err();
    assert!(err.contains("per-channel"), "{err}");
}
