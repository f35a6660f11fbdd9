//! Generated convolutions and pooling run on the Vulkan device (lavapipe in CI) and match
//! the reference executor: implicit-GEMM convolutions (strides, pads, dilations, 1×1, 7×7,
//! both tile sizes, several images) with their bias and fused tails, depthwise
//! convolution, max and average pooling and global pooling; and the classifier's `Gemm` with B transposed.

use crate::common;

use std::sync::Arc;

use rafter_codegen_spirv::{conv, matmul, to_bytes, ConvKernel};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::VulkanDevice;
use rafter_ir::text::parse_graph;
use rafter_reference::Tensor;

fn conv_op(k: [usize; 2], s: [usize; 2], pads: [usize; 4], d: [usize; 2], group: usize) -> String {
    format!(
        "conv{{kernel_shape = [{}, {}], strides = [{}, {}], pads = [{}, {}, {}, {}], \
         dilations = [{}, {}], group = {group}, auto_pad = explicit}}",
        k[0], k[1], s[0], s[1], pads[0], pads[1], pads[2], pads[3], d[0], d[1]
    )
}

fn dims(d: &[usize]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `body` (inputs in order, random in [-1, 1] unless given) on the device and
/// compares every output element with the reference executor.
fn check(device: &VulkanDevice, label: &str, body_text: &str, given: &[Option<Vec<f32>>]) {
    let body = parse_graph(body_text).unwrap_or_else(|e| panic!("{label}: {e}"));
    let kernel = conv(&body).unwrap_or_else(|e| panic!("{label}: {e}"));
    check_kernel(device, label, &body, &kernel, given);
}

fn check_kernel(
    device: &VulkanDevice,
    label: &str,
    body: &rafter_ir::Graph,
    kernel: &ConvKernel,
    given: &[Option<Vec<f32>>],
) {
    common::spirv_val(&kernel.spirv, label);
    let mut host = Vec::new();
    let mut tensors = Vec::new();
    for (i, &v) in body.inputs.iter().enumerate() {
        let d: Vec<usize> = body
            .value(v)
            .ty
            .dims
            .iter()
            .map(|x| x.as_known().unwrap() as usize)
            .collect();
        let len = d.iter().product::<usize>();
        let values = given
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| common::inputs_in((-1.0, 1.0), len, 31 + i as u64));
        tensors.push(Tensor::f32s(&d, values.clone()));
        host.push((d, values));
    }
    let want: Vec<f32> = rafter_reference::run(body, tensors).unwrap()[0]
        .to_f64_vec()
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let y_dims: Vec<usize> = body
        .value(body.outputs[0])
        .ty
        .dims
        .iter()
        .map(|x| x.as_known().unwrap() as usize)
        .collect();
    let got = run(device, kernel, &host, &y_dims, want.len());
    let bad: Vec<String> = (0..want.len())
        .filter(|&i| !common::close(got[i], want[i], 1e-5, 1e-5))
        .take(3)
        .map(|i| format!("[{i}] got {} want {}", got[i], want[i]))
        .collect();
    assert!(bad.is_empty(), "{label}: {} elements: {bad:?}", want.len());
}

fn run(
    device: &VulkanDevice,
    kernel: &ConvKernel,
    inputs: &[(Vec<usize>, Vec<f32>)],
    y_dims: &[usize],
    count: usize,
) -> Vec<f32> {
    let mut buffers: Vec<Buffer> = inputs
        .iter()
        .map(|(_, v)| common::upload(device, v))
        .collect();
    let y = device
        .allocate(count as u64 * 4, MemoryKind::HostVisibleShared)
        .unwrap();
    y.write_bytes(0, &vec![0xFF; count * 4]).unwrap();
    buffers.push(y.clone());
    let exe = device
        .load_executable(&ExecutableSpec {
            name: "conv".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(Arc::from(to_bytes(&kernel.spirv))),
        })
        .unwrap();
    let max = device.info().limits.max_workgroup_count;
    // The runtime's rule for every launch kind.
    let input_dims: Vec<&[usize]> = inputs.iter().map(|(d, _)| d.as_slice()).collect();
    let (params, grid) = kernel
        .launch
        .dispatch(&input_dims, y_dims, kernel.workgroup_size, max)
        .unwrap()
        .unwrap();
    let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
    let mut builder = device.create_command_buffer().unwrap();
    builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
    common::submit_and_wait(device, builder);
    common::f32s(&y.read_bytes(0, count as u64 * 4).unwrap())
}

/// `conv(x, w, b) [+ r] [relu]` for one geometry.
#[allow(clippy::too_many_arguments)]
fn conv_case(
    device: &VulkanDevice,
    x: [usize; 4],
    m: usize,
    k: [usize; 2],
    s: [usize; 2],
    pads: [usize; 4],
    d: [usize; 2],
    tail: &str,
) {
    let oh = (x[2] + pads[0] + pads[2] - (k[0] - 1) * d[0] - 1) / s[0] + 1;
    let ow = (x[3] + pads[1] + pads[3] - (k[1] - 1) * d[1] - 1) / s[1] + 1;
    let y = [x[0], m, oh, ow];
    let label = format!("conv x{x:?} m{m} k{k:?} s{s:?} p{pads:?} d{d:?} {tail}");
    let op = conv_op(k, s, pads, d, 1);
    let (inputs, nodes) = match tail {
        "bias relu" => (
            format!(", %b: f32[{m}]"),
            format!(
                "%c: f32[{y}] = {op}(%x, %w, %b)\n  %y: f32[{y}] = unary{{op = relu}}(%c)",
                y = dims(&y)
            ),
        ),
        "residual" => (
            format!(", %r: f32[{}]", dims(&y)),
            format!(
                "%c: f32[{y}] = {op}(%x, %w, _)\n  %y: f32[{y}] = binary{{op = add}}(%c, %r)",
                y = dims(&y)
            ),
        ),
        _ => (
            String::new(),
            format!("%y: f32[{}] = {op}(%x, %w, _)", dims(&y)),
        ),
    };
    let text = format!(
        "graph @c(%x: f32[{}], %w: f32[{m}, {}, {}, {}]{inputs}) -> (%y) {{\n  {nodes}\n}}",
        dims(&x),
        x[1],
        k[0],
        k[1]
    );
    check(device, &label, &text, &[]);
}

#[test]
fn implicit_gemm_convolutions_match_the_reference() {
    let Some(device) = common::device_or_skip("implicit_gemm_convolutions") else {
        return;
    };
    // 3×3 same padding, two images, bias + relu.
    conv_case(
        &device,
        [2, 5, 9, 11],
        7,
        [3, 3],
        [1, 1],
        [1, 1, 1, 1],
        [1, 1],
        "bias relu",
    );
    // ResNet's stem: 7×7 stride 2 pad 3.
    conv_case(
        &device,
        [1, 3, 20, 18],
        8,
        [7, 7],
        [2, 2],
        [3, 3, 3, 3],
        [1, 1],
        "",
    );
    // 1×1 with a residual add; K = 16 is one staged step.
    conv_case(
        &device,
        [1, 16, 6, 6],
        40,
        [1, 1],
        [1, 1],
        [0, 0, 0, 0],
        [1, 1],
        "residual",
    );
    // Dilation, asymmetric pads, a 3×2 window, unequal strides.
    conv_case(
        &device,
        [1, 4, 13, 12],
        5,
        [3, 2],
        [2, 1],
        [2, 0, 1, 1],
        [2, 3],
        "bias relu",
    );
    // 1×1 stride 2 (ResNet's downsampling shortcut).
    conv_case(
        &device,
        [1, 8, 14, 14],
        12,
        [1, 1],
        [2, 2],
        [0, 0, 0, 0],
        [1, 1],
        "",
    );
    // ResNet's last stage in small: few tiles and K = 130·3·3 = 1,170 (past 1,024), so the
    // 16×16 tile with K split over the workgroup; K is not a multiple of the 4 × 16 round.
    conv_case(
        &device,
        [1, 130, 7, 7],
        20,
        [3, 3],
        [1, 1],
        [1, 1, 1, 1],
        [1, 1],
        "residual",
    );
    // Enough tiles for the 64×64 tile: 64 channels × 16,384 pixels.
    conv_case(
        &device,
        [1, 8, 128, 128],
        64,
        [1, 1],
        [1, 1],
        [0, 0, 0, 0],
        [1, 1],
        "bias relu",
    );
}

#[test]
fn depthwise_convolution_with_bias_and_relu6_matches_the_reference() {
    let Some(device) = common::device_or_skip("depthwise_convolution") else {
        return;
    };
    for (s, x) in [(1, [1, 6, 9, 9]), (2, [2, 6, 10, 9])] {
        let y = [x[0], 6, (x[2] + 2 - 3) / s + 1, (x[3] + 2 - 3) / s + 1];
        let text = format!(
            "graph @dw(%x: f32[{}], %w: f32[6, 1, 3, 3], %b: f32[6], %lo: f32[], %hi: f32[]) \
             -> (%y) {{\n  %c: f32[{y}] = {}(%x, %w, %b)\n  \
             %y: f32[{y}] = clip(%c, %lo, %hi)\n}}",
            dims(&x),
            conv_op([3, 3], [s, s], [1, 1, 1, 1], [1, 1], 6),
            y = dims(&y)
        );
        // Inputs scaled so that both clip bounds bite.
        let len: usize = x.iter().product();
        let xs: Vec<f32> = common::inputs_in((-4.0, 4.0), len, 5);
        let given = [Some(xs), None, None, Some(vec![0.0]), Some(vec![0.5])];
        check(&device, &format!("depthwise s{s}"), &text, &given);
    }
}

#[test]
fn max_and_global_pooling_match_the_reference() {
    let Some(device) = common::device_or_skip("pooling") else {
        return;
    };
    let text = "graph @mp(%x: f32[1, 4, 11, 11]) -> (%y) {\n  %y: f32[1, 4, 6, 6] = \
                pool{kind = max, kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], \
                dilations = [1, 1], auto_pad = explicit, ceil_mode = false, \
                count_include_pad = false, p = 2, storage_order = 0}(%x)\n}";
    check(&device, "maxpool 3x3 s2 p1", text, &[]);
    for kind in ["average", "max"] {
        let text = format!(
            "graph @gp(%x: f32[2, 5, 7, 7]) -> (%y) {{\n  %y: f32[2, 5, 1, 1] = \
             global_pool{{kind = {kind}, p = 2}}(%x)\n}}"
        );
        check(&device, &format!("global {kind} pool"), &text, &[]);
    }
}

/// An average pool of `x` to `y` with the window `[kernel_shape, strides, pads, dilations]`.
fn avg_pool((x, y): (&str, &str), [k, s, pads, d]: [&str; 4], ceil: bool, inc: bool) -> String {
    format!(
        "graph @ap(%x: f32[{x}]) -> (%y) {{\n  %y: f32[{y}] = pool{{kind = average, \
         kernel_shape = [{k}], strides = [{s}], pads = [{pads}], dilations = [{d}], \
         auto_pad = explicit, ceil_mode = {ceil}, count_include_pad = {inc}, p = 2, \
         storage_order = 0}}(%x)\n}}"
    )
}

/// Average pooling with and without pads counted: symmetric and asymmetric pads,
/// dilation, and `ceil_mode` windows hanging past the input (not counting pads).
#[test]
fn average_pooling_matches_the_reference() {
    let Some(device) = common::device_or_skip("average pooling") else {
        return;
    };
    for inc in [false, true] {
        let text = avg_pool(
            ("1, 4, 11, 11", "1, 4, 6, 6"),
            ["3, 3", "2, 2", "1, 1, 1, 1", "1, 1"],
            false,
            inc,
        );
        check(&device, &format!("avgpool 3x3 s2 p1 inc={inc}"), &text, &[]);
        let text = avg_pool(
            ("2, 3, 7, 6", "2, 3, 4, 4"),
            ["3, 2", "1, 2", "0, 1, 1, 2", "2, 1"],
            false,
            inc,
        );
        check(
            &device,
            &format!("avgpool dilated asymmetric inc={inc}"),
            &text,
            &[],
        );
    }
    let text = avg_pool(
        ("1, 2, 5, 5", "1, 2, 3, 3"),
        ["2, 2", "2, 2", "0, 0, 0, 0", "1, 1"],
        true,
        false,
    );
    check(&device, "avgpool ceil_mode", &text, &[]);
}

/// Lp pooling (p = 1, 2, 3) with pads (which add 0) and strides.
#[test]
fn lp_pooling_matches_the_reference() {
    let Some(device) = common::device_or_skip("lp pooling") else {
        return;
    };
    for p in [1, 2, 3] {
        let text = format!(
            "graph @lp(%x: f32[1, 3, 9, 8]) -> (%y) {{\n  %y: f32[1, 3, 5, 4] = pool{{kind = lp, \
             kernel_shape = [3, 2], strides = [2, 2], pads = [1, 0, 1, 0], dilations = [1, 1], \
             auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = {p}, \
             storage_order = 0}}(%x)\n}}"
        );
        check(&device, &format!("lppool p={p}"), &text, &[]);
    }
}

/// Counting pads where a `ceil_mode` window hangs past the padded input would divide by
/// fewer taps than the window: refused with the reason, never a wrong mean.
#[test]
fn average_pooling_counting_pads_past_the_padding_says_why() {
    let text = avg_pool(
        ("1, 2, 5, 5", "1, 2, 3, 3"),
        ["2, 2", "2, 2", "0, 0, 0, 0", "1, 1"],
        true,
        true,
    );
    let e = conv(&parse_graph(&text).unwrap()).unwrap_err();
    assert!(e.reason.contains("past the padded input"), "{e}");
}

/// 1-D convolutions and pooling, generated as the 2-D ones on `[N, C, 1, L]`: an
/// implicit-GEMM convolution with bias and relu, a depthwise one, max and average pooling
/// with strides, pads and dilation, a global pool.
#[test]
fn one_d_convolutions_and_pooling_match_the_reference() {
    let Some(device) = common::device_or_skip("1-D windows") else {
        return;
    };
    let cases = [
        "graph @c(%x: f32[2, 4, 10], %w: f32[6, 4, 3], %b: f32[6]) -> (%y) {\n  \
         %c: f32[2, 6, 5] = conv{kernel_shape = [3], strides = [2], pads = [1, 1], \
         dilations = [1], group = 1, auto_pad = explicit}(%x, %w, %b)\n  \
         %y: f32[2, 6, 5] = unary{op = relu}(%c)\n}",
        "graph @d(%x: f32[1, 3, 12], %w: f32[3, 1, 3]) -> (%y) {\n  \
         %y: f32[1, 3, 8] = conv{kernel_shape = [3], strides = [1], pads = [0, 0], \
         dilations = [2], group = 3, auto_pad = explicit}(%x, %w, _)\n}",
        "graph @m(%x: f32[2, 3, 11]) -> (%y) {\n  %y: f32[2, 3, 6] = pool{kind = max, \
         kernel_shape = [3], strides = [2], pads = [1, 1], dilations = [1], \
         auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, \
         storage_order = 0}(%x)\n}",
        "graph @a(%x: f32[2, 3, 11]) -> (%y) {\n  %y: f32[2, 3, 5] = pool{kind = average, \
         kernel_shape = [3], strides = [2], pads = [1, 0], dilations = [1], \
         auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, \
         storage_order = 0}(%x)\n}",
        "graph @g(%x: f32[2, 5, 7]) -> (%y) {\n  %y: f32[2, 5, 1] = \
         global_pool{kind = average, p = 2}(%x)\n}",
    ];
    for (k, text) in cases.iter().enumerate() {
        check(&device, &format!("1-D case {k}"), text, &[]);
    }
}

#[test]
fn unsupported_convolutions_say_why() {
    let text = format!(
        "graph @g(%x: f32[1, 4, 5, 5], %w: f32[6, 2, 3, 3]) -> (%y) {{\n  \
         %y: f32[1, 6, 3, 3] = {}(%x, %w, _)\n}}",
        conv_op([3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 2)
    );
    let e = conv(&parse_graph(&text).unwrap()).unwrap_err();
    assert!(e.reason.contains("grouped convolution (group 2"), "{e}");
    let text = "graph @g(%x: f32[1, 4, s, 5], %w: f32[6, 4, 3, 3]) -> (%y) {\n  \
                %y: f32[1, 6, s, 3] = conv{kernel_shape = [3, 3], strides = [1, 1], \
                pads = [1, 0, 1, 0], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %w, _)\n}";
    let e = conv(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.reason.contains("symbolic channel or spatial dims"), "{e}");
}

#[test]
fn a_bias_folded_into_the_body_is_read_from_the_module() {
    let Some(device) = common::device_or_skip("const_bias") else {
        return;
    };
    // The compiler copies small constants (this bias) into the kernel body.
    let text = format!(
        "graph @cb(%x: f32[1, 3, 6, 6], %w: f32[4, 3, 1, 1]) -> (%y) {{\n  \
         const %b: f32[4] = dense [0.5, -1.25, 2.0, 0.0]\n  \
         %y: f32[1, 4, 6, 6] = {}(%x, %w, %b)\n}}",
        conv_op([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1)
    );
    check(&device, "1x1 conv, constant bias", &text, &[]);
    let text = format!(
        "graph @cb(%x: f32[1, 4, 6, 6], %w: f32[4, 1, 3, 3]) -> (%y) {{\n  \
         const %b: f32[4] = dense [0.5, -1.25, 2.0, 0.0]\n  \
         %y: f32[1, 4, 6, 6] = {}(%x, %w, %b)\n}}",
        conv_op([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4)
    );
    check(&device, "depthwise, constant bias", &text, &[]);
}

#[test]
fn a_classifier_gemm_with_transposed_b_matches_the_reference() {
    let Some(device) = common::device_or_skip("gemm_trans_b") else {
        return;
    };
    for (trans_b, alpha, b_dims) in [(true, 0.5, "70, 40"), (false, 1.0, "40, 70")] {
        let text = format!(
            "graph @fc(%a: f32[3, 40], %b: f32[{b_dims}], %c: f32[70]) -> (%y) {{\n  \
             %y: f32[3, 70] = gemm{{alpha = {alpha:?}, beta = 1.0, trans_a = false, \
             trans_b = {trans_b}}}(%a, %b, %c)\n}}"
        );
        let body = parse_graph(&text).unwrap();
        let mm = matmul(&body).unwrap();
        common::spirv_val(&mm.spirv, "gemm");
        let kernel = ConvKernel {
            launch: mm.launch().unwrap(),
            spirv: mm.spirv,
            workgroup_size: 256,
            coop: None,
        };
        check_kernel(
            &device,
            &format!("gemm transB={trans_b}"),
            &body,
            &kernel,
            &[],
        );
    }
    let text = "graph @fc(%a: f32[3, 40], %b: f32[70, 40], %c: f32[70]) -> (%y) {\n  \
                %y: f32[3, 70] = gemm{alpha = 1.0, beta = 0.5, trans_a = false, \
                trans_b = true}(%a, %b, %c)\n}";
    let e = matmul(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.reason.contains("beta 0.5"), "{e}");
}
