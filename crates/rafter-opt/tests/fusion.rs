//! Fusion rules, checked on the compiled program, each also checked for equivalence with
//! the reference executor.

mod common;

use common::{check_equivalent, parse, rand_f32};
use rafter_ir::program::{KernelKind, Program, Step, Storage};

/// `(kind, [op names of the body])` per kernel, in step order.
fn kernels(p: &Program) -> Vec<(KernelKind, Vec<String>)> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Dispatch { kernel, .. } => Some(&p.kernels[*kernel]),
            Step::Copy { .. } => None,
        })
        .map(|k| {
            let ops = k.body.nodes.iter().map(|n| describe(&n.op)).collect();
            (k.kind, ops)
        })
        .collect()
}

fn describe(op: &rafter_ir::Op) -> String {
    match op {
        rafter_ir::Op::Unary { op } => op.word().to_string(),
        rafter_ir::Op::Binary { op } => op.word().to_string(),
        other => other.name().to_string(),
    }
}

fn ops(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

const CONV_W: &str = "dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8, 0.9, \
                      -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, -0.8, 0.9]";

#[test]
fn conv_bias_relu_is_one_contraction_kernel() {
    let g = parse(&format!(
        r#"graph @cbr(%x: f32[1, 1, 5, 5]) -> (%y) {{
          const %w: f32[2, 1, 3, 3] = {CONV_W}
          const %b: f32[2, 1, 1] = dense [0.5, -0.25]
          %c: f32[1, 2, 5, 5] = conv{{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w, _)
          %a: f32[1, 2, 5, 5] = binary{{op = add}}(%c, %b)
          %y: f32[1, 2, 5, 5] = unary{{op = relu}}(%a)
        }}"#
    ));
    let p = check_equivalent(&g, vec![rand_f32(&[1, 1, 5, 5], 1)]);
    // On the CPU the convolution runs channels-last (`rafter_opt::layout`): a transpose on
    // each side, and the per-channel bias re-laid out as [1, 1, 1, 2] so the add still fuses.
    // With one input channel the input's transpose joins the convolution's kernel (the
    // "reordered stem input" rule: the runtime reads the NCHW input in place).
    assert_eq!(
        kernels(&p),
        vec![
            (
                KernelKind::Contraction,
                ops(&["transpose", "conv_nhwc", "add", "relu"])
            ),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
    // The weight (72 bytes) is a weight buffer; the bias (8 bytes) lives in the body.
    assert_eq!(p.weights.len(), 1);
    let body = &p.kernels[0].body;
    assert_eq!(body.inputs.len(), 2);
    assert!(body.constants.iter().any(|c| c.dims == [1, 1, 1, 2]));
    assert!(p.buffers.iter().any(|b| b.storage == Storage::Weight(0)));
}

#[test]
fn conv_residual_relu_and_matmul_bias_gelu() {
    let g = parse(&format!(
        r#"graph @res(%x: f32[1, 1, 5, 5], %r: f32[1, 2, 5, 5], %m: f32[3, 4]) -> (%y, %h) {{
          const %w: f32[2, 1, 3, 3] = {CONV_W}
          %c: f32[1, 2, 5, 5] = conv{{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w, _)
          %s: f32[1, 2, 5, 5] = unary{{op = exp}}(%r)
          %a: f32[1, 2, 5, 5] = binary{{op = add}}(%c, %s)
          %y: f32[1, 2, 5, 5] = unary{{op = relu}}(%a)
          const %k: f32[4, 2] = dense [0.5, -1.0, 0.25, 2.0, -0.5, 1.5, 0.75, -0.125]
          const %kb: f32[2] = dense [0.1, -0.1]
          %mm: f32[3, 2] = matmul(%m, %k)
          %mb: f32[3, 2] = binary{{op = add}}(%mm, %kb)
          %h: f32[3, 2] = gelu{{approximate = none}}(%mb)
        }}"#
    ));
    let p = check_equivalent(
        &g,
        vec![
            rand_f32(&[1, 1, 5, 5], 2),
            rand_f32(&[1, 2, 5, 5], 3),
            rand_f32(&[3, 4], 4),
        ],
    );
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::Elementwise, ops(&["exp"])),
            (KernelKind::DataMovement, ops(&["transpose"])),
            (
                KernelKind::Contraction,
                ops(&["transpose", "conv_nhwc", "add", "relu"])
            ),
            (KernelKind::Contraction, ops(&["matmul", "add", "gelu"])),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
}

#[test]
fn layer_norm_takes_its_elementwise_prologue() {
    let g = parse(
        r#"graph @ln(%x: f32[2, 3, 4], %y: f32[2, 3, 4]) -> (%z) {
          const %scale: f32[4] = dense [1.0, 0.5, 2.0, -1.0]
          const %bias: f32[4] = dense [0.0, 0.1, 0.2, 0.3]
          %a: f32[2, 3, 4] = binary{op = add}(%x, %y)
          %z: f32[2, 3, 4] = layer_norm{axis = -1, epsilon = 1e-5}(%a, %scale, %bias)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[2, 3, 4], 5), rand_f32(&[2, 3, 4], 6)]);
    assert_eq!(
        kernels(&p),
        vec![(KernelKind::Reduction, ops(&["add", "layer_norm"]))]
    );
}

#[test]
fn five_elementwise_ops_are_one_kernel() {
    let g = parse(
        r#"graph @chain(%x: f32[3, 4], %y: f32[3, 4]) -> (%e) {
          const %two: f32[] = dense [2.0]
          %a: f32[3, 4] = unary{op = exp}(%x)
          %b: f32[3, 4] = binary{op = mul}(%a, %two)
          %c: f32[3, 4] = binary{op = add}(%b, %y)
          %d: f32[3, 4] = unary{op = tanh}(%c)
          %e: f32[3, 4] = unary{op = sigmoid}(%d)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[3, 4], 7), rand_f32(&[3, 4], 8)]);
    assert_eq!(
        kernels(&p),
        vec![(
            KernelKind::Elementwise,
            ops(&["exp", "mul", "add", "tanh", "sigmoid"])
        )]
    );
    // Only the kernel's operands and result cross memory.
    assert_eq!(p.buffers.len(), 3);
}

#[test]
fn no_fusion_that_would_duplicate_work() {
    // `a` feeds two reductions: fusing it into either would compute it twice (or store it
    // anyway), so it is its own kernel. The matmul's result feeds two ops: no epilogue.
    let g = parse(
        r#"graph @multi(%x: f32[3, 4], %m: f32[3, 4]) -> (%r1, %r2, %p, %q) {
          %a: f32[3, 4] = unary{op = exp}(%x)
          %r1: f32[3] = reduce{kind = sum, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%a)
          %r2: f32[3] = reduce{kind = max, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%a)
          const %k: f32[4, 4] = dense [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
          %mm: f32[3, 4] = matmul(%m, %k)
          %p: f32[3, 4] = unary{op = relu}(%mm)
          %q: f32[3, 4] = unary{op = neg}(%mm)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[3, 4], 9), rand_f32(&[3, 4], 10)]);
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::Elementwise, ops(&["exp"])),
            (KernelKind::Reduction, ops(&["reduce"])),
            (KernelKind::Reduction, ops(&["reduce"])),
            (KernelKind::Contraction, ops(&["matmul"])),
            (KernelKind::Elementwise, ops(&["relu"])),
            (KernelKind::Elementwise, ops(&["neg"])),
        ]
    );
}

#[test]
fn no_fusion_through_a_cycle_or_a_broadcast() {
    // `b` reads `a` directly and through a transpose (another kernel): putting `b` with `a`
    // would need the transpose both before and after that kernel.
    let g = parse(
        r#"graph @cyc(%x: f32[4, 4], %v: f32[4], %w: f32[3, 4]) -> (%b, %u) {
          %a: f32[4, 4] = unary{op = exp}(%x)
          %t: f32[4, 4] = transpose{perm = [1, 0]}(%a)
          %b: f32[4, 4] = binary{op = add}(%a, %t)
          %e: f32[4] = unary{op = exp}(%v)
          %u: f32[3, 4] = binary{op = mul}(%e, %w)
        }"#,
    );
    let p = check_equivalent(
        &g,
        vec![
            rand_f32(&[4, 4], 11),
            rand_f32(&[4], 12),
            rand_f32(&[3, 4], 13),
        ],
    );
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::Elementwise, ops(&["exp"])),
            (KernelKind::DataMovement, ops(&["transpose"])),
            (KernelKind::Elementwise, ops(&["add"])),
            // `e` is [4], `u` is [3, 4]: fusing would compute exp three times per element.
            (KernelKind::Elementwise, ops(&["exp"])),
            (KernelKind::Elementwise, ops(&["mul"])),
        ]
    );
}

#[test]
fn softmax_with_prologue_and_data_movement_alone() {
    let g = parse(
        r#"graph @sm(%x: f32[2, 5], %mask: f32[2, 5]) -> (%y) {
          const %scale: f32[] = dense [0.125]
          %s: f32[2, 5] = binary{op = mul}(%x, %scale)
          %m: f32[2, 5] = binary{op = add}(%s, %mask)
          %p: f32[2, 5] = softmax{kind = softmax, axis = -1}(%m)
          %y: f32[5, 2] = transpose{perm = [1, 0]}(%p)
        }"#,
    );
    let p = check_equivalent(&g, vec![rand_f32(&[2, 5], 14), rand_f32(&[2, 5], 15)]);
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::Reduction, ops(&["mul", "add", "softmax"])),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
}

#[test]
fn a_global_pool_reads_the_channels_last_map_in_place() {
    // The "channels-last pooling head" rule: the NHWC -> NCHW transpose before a global
    // pool joins the pool's kernel, which the runtime runs on the NHWC map in place. When
    // the feature map is also a graph output, the transpose stays its own kernel (its
    // result is stored) and the pool reads it.
    for (outputs, fused) in [("%y", true), ("%y, %a", false)] {
        let g = parse(&format!(
            r#"graph @head(%x: f32[1, 1, 5, 5]) -> ({outputs}) {{
              const %w: f32[2, 1, 3, 3] = {CONV_W}
              %c: f32[1, 2, 5, 5] = conv{{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w, _)
              %a: f32[1, 2, 5, 5] = unary{{op = relu}}(%c)
              %y: f32[1, 2, 1, 1] = global_pool{{kind = average, p = 2}}(%a)
            }}"#
        ));
        let p = check_equivalent(&g, vec![rand_f32(&[1, 1, 5, 5], 7)]);
        let conv = (
            KernelKind::Contraction,
            ops(&["transpose", "conv_nhwc", "relu"]),
        );
        let expected = if fused {
            vec![
                conv,
                (KernelKind::Reduction, ops(&["transpose", "global_pool"])),
            ]
        } else {
            vec![
                conv,
                (KernelKind::DataMovement, ops(&["transpose"])),
                (KernelKind::Reduction, ops(&["global_pool"])),
            ]
        };
        assert_eq!(kernels(&p), expected, "outputs {outputs}");
    }
}

#[test]
fn a_resnet_stem_and_its_max_pool_run_channels_last() {
    // ResNet's stem: a 7×7 stride-2 convolution on RGB, ReLU, a 3×3 stride-2 max pool, then
    // a 1×1 convolution. The stem reads the NCHW input in place ("reordered stem input"),
    // and the max pool between the transposes the layout pass puts around it is one kernel
    // ("channels-last max pool"): no transpose runs on its own until the output's.
    let w7: Vec<String> = (0..8 * 3 * 49)
        .map(|i| format!("{:.3}", ((i * 37) % 101) as f32 / 50.0 - 1.0))
        .collect();
    let w1: Vec<String> = (0..4 * 8)
        .map(|i| format!("{:.3}", ((i * 13) % 17) as f32 / 8.0 - 1.0))
        .collect();
    let g = parse(&format!(
        r#"graph @stem(%x: f32[1, 3, 16, 16]) -> (%y) {{
          const %w7: f32[8, 3, 7, 7] = dense [{w7}]
          %c: f32[1, 8, 8, 8] = conv{{kernel_shape = [7, 7], strides = [2, 2], pads = [3, 3, 3, 3], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w7, _)
          %r: f32[1, 8, 8, 8] = unary{{op = relu}}(%c)
          %p: f32[1, 8, 4, 4] = pool{{kind = max, kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], dilations = [1, 1], auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, storage_order = 0}}(%p_in)
          const %w1: f32[4, 8, 1, 1] = dense [{w1}]
          %y: f32[1, 4, 4, 4] = conv{{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}}(%p, %w1, _)
        }}"#,
        w7 = w7.join(", "),
        w1 = w1.join(", "),
    )
    .replace("%p_in", "%r"));
    let p = check_equivalent(&g, vec![rand_f32(&[1, 3, 16, 16], 9)]);
    assert_eq!(
        kernels(&p),
        vec![
            (
                KernelKind::Contraction,
                ops(&["transpose", "conv_nhwc", "relu"])
            ),
            (
                KernelKind::Reduction,
                ops(&["transpose", "pool", "transpose"])
            ),
            // (The 1×1's weight is pre-packed: its unpacking prologue, `rafter_opt::prepack`.)
            (
                KernelKind::Contraction,
                ops(&["transpose", "reshape", "slice", "reshape", "conv_nhwc"])
            ),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
}

/// MobileNet's inverted residual on an `h×h` map: 1×1 expansion 8 → 24 with ReLU6, a 3×3
/// depthwise convolution with ReLU6, a 1×1 projection 24 → 8 and the skip add.
fn inverted_residual(h: usize) -> rafter_ir::Graph {
    let dense = |n: usize, seed: usize| {
        let v: Vec<String> = (0..n)
            .map(|i| format!("{:.3}", (((i + seed) * 37) % 101) as f32 / 100.0 - 0.5))
            .collect();
        format!("dense [{}]", v.join(", "))
    };
    let conv = |k: usize, p: usize, group: usize| {
        format!(
            "conv{{kernel_shape = [{k}, {k}], strides = [1, 1], pads = [{p}, {p}, {p}, {p}], \
             dilations = [1, 1], group = {group}, auto_pad = explicit}}"
        )
    };
    parse(&format!(
        r#"graph @block(%x: f32[1, 8, {h}, {h}]) -> (%y) {{
          const %lo: f32[] = dense [0.0]
          const %hi: f32[] = dense [6.0]
          const %we: f32[24, 8, 1, 1] = {we}
          const %be: f32[24] = {be}
          %e: f32[1, 24, {h}, {h}] = {c1}(%x, %we, %be)
          %e6: f32[1, 24, {h}, {h}] = clip(%e, %lo, %hi)
          const %wd: f32[24, 1, 3, 3] = {wd}
          %d: f32[1, 24, {h}, {h}] = {dw}(%e6, %wd)
          %d6: f32[1, 24, {h}, {h}] = clip(%d, %lo, %hi)
          const %wp: f32[8, 24, 1, 1] = {wp}
          %p: f32[1, 8, {h}, {h}] = {c1}(%d6, %wp)
          %y: f32[1, 8, {h}, {h}] = binary{{op = add}}(%p, %x)
        }}"#,
        we = dense(24 * 8, 1),
        be = dense(24, 2),
        wd = dense(24 * 9, 3),
        wp = dense(8 * 24, 4),
        c1 = conv(1, 0, 1),
        dw = conv(3, 1, 24),
    ))
}

#[test]
fn an_inverted_residual_is_one_channels_last_kernel() {
    // The three convolutions, their clips and the skip add are one kernel ("channels-last
    // depthwise block"), behind the unpacking prologues of both 1×1 weights (the
    // projection's, then the expansion's: each packed weight's prologue goes first).
    let p = check_equivalent(&inverted_residual(10), vec![rand_f32(&[1, 8, 10, 10], 3)]);
    let block = [
        "transpose",
        "reshape",
        "slice",
        "reshape",
        "transpose",
        "reshape",
        "slice",
        "reshape",
        "conv_nhwc",
        "clip",
        "conv_nhwc",
        "clip",
        "conv_nhwc",
        "add",
    ];
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::DataMovement, ops(&["transpose"])),
            (KernelKind::Contraction, ops(&block)),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
}

#[test]
fn a_stem_and_its_depthwise_block_are_one_kernel_reading_the_nchw_input() {
    // MobileNet's first layers: a 3×3 stride-2 stem of 3 channels with ReLU6, a depthwise
    // 3×3 with ReLU6 and a 1×1 projection. One kernel reads the NCHW input through its
    // transpose, behind the projection weight's unpacking prologue.
    let dense = |n: usize, seed: usize| {
        let v: Vec<String> = (0..n)
            .map(|i| format!("{:.3}", (((i + seed) * 37) % 101) as f32 / 100.0 - 0.5))
            .collect();
        format!("dense [{}]", v.join(", "))
    };
    let g = parse(&format!(
        r#"graph @stem(%x: f32[1, 3, 16, 16]) -> (%y) {{
          const %lo: f32[] = dense [0.0]
          const %hi: f32[] = dense [6.0]
          const %ws: f32[8, 3, 3, 3] = {ws}
          %s: f32[1, 8, 8, 8] = conv{{kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %ws, _)
          %s6: f32[1, 8, 8, 8] = clip(%s, %lo, %hi)
          const %wd: f32[8, 1, 3, 3] = {wd}
          %d: f32[1, 8, 8, 8] = conv{{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 8, auto_pad = explicit}}(%s6, %wd, _)
          %d6: f32[1, 8, 8, 8] = clip(%d, %lo, %hi)
          const %wp: f32[4, 8, 1, 1] = {wp}
          %y: f32[1, 4, 8, 8] = conv{{kernel_shape = [1, 1], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}}(%d6, %wp, _)
        }}"#,
        ws = dense(8 * 27, 1),
        wd = dense(8 * 9, 2),
        wp = dense(4 * 8, 3),
    ));
    let p = check_equivalent(&g, vec![rand_f32(&[1, 3, 16, 16], 4)]);
    let block = [
        "transpose",
        "reshape",
        "slice",
        "reshape",
        "transpose",
        "conv_nhwc",
        "clip",
        "conv_nhwc",
        "clip",
        "conv_nhwc",
    ];
    assert_eq!(
        kernels(&p),
        vec![
            (KernelKind::Contraction, ops(&block)),
            (KernelKind::DataMovement, ops(&["transpose"])),
        ]
    );
}

#[test]
fn a_depthwise_block_on_a_small_map_is_one_kernel_too() {
    // Seven output rows: too few for bands, but the CPU runtime runs such a block stage by
    // stage over the whole map in one dispatch.
    let p = check_equivalent(&inverted_residual(7), vec![rand_f32(&[1, 8, 7, 7], 3)]);
    let convs: Vec<usize> = kernels(&p)
        .iter()
        .map(|(_, ops)| ops.iter().filter(|o| *o == "conv_nhwc").count())
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(convs, [3]);
}
