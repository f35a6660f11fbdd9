//! Channels-last CPU convolutions (`rafter_opt::layout`): which convolutions become
//! `conv_nhwc`, where the transposes go, that the graph's interface is untouched, and that
//! compiled programs compute bitwise what the reference computes on the source graph.

mod common;

use common::{check_equivalent, parse, rand_f32};
use rafter_ir::{Graph, Op};
use rafter_opt::layout::channels_last;

/// `n` deterministic values as a `dense [...]` literal.
fn dense(n: usize, seed: u32) -> String {
    let v: Vec<String> = (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 40503)
                % 1000;
            format!("{:.3}", x as f32 / 500.0 - 1.0)
        })
        .collect();
    format!("dense [{}]", v.join(", "))
}

fn conv(k: usize, s: usize, p: usize, group: usize) -> String {
    format!(
        "conv{{kernel_shape = [{k}, {k}], strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], \
         dilations = [1, 1], group = {group}, auto_pad = explicit}}"
    )
}

/// A small residual CNN: a 3×3 stem on RGB, a 1×1, a residual add, a depthwise 3×3 with
/// ReLU6, a strided 3×3, and a pooling head.
fn cnn() -> Graph {
    parse(&format!(
        r#"graph @cnn(%x: f32[1, 3, 9, 9]) -> (%y) {{
          const %w1: f32[8, 3, 3, 3] = {w1}
          const %b1: f32[8] = {b1}
          %c1: f32[1, 8, 9, 9] = {c3}(%x, %w1, %b1)
          %r1: f32[1, 8, 9, 9] = unary{{op = relu}}(%c1)
          const %w2: f32[8, 8, 1, 1] = {w2}
          %c2: f32[1, 8, 9, 9] = {c1x1}(%r1, %w2)
          %a: f32[1, 8, 9, 9] = binary{{op = add}}(%c2, %r1)
          const %wd: f32[8, 1, 3, 3] = {wd}
          %d: f32[1, 8, 9, 9] = {dw}(%a, %wd)
          const %lo: f32[] = dense [0.0]
          const %hi: f32[] = dense [6.0]
          %r6: f32[1, 8, 9, 9] = clip(%d, %lo, %hi)
          const %w3: f32[16, 8, 3, 3] = {w3}
          %c3: f32[1, 16, 5, 5] = {c3s2}(%r6, %w3)
          %g: f32[1, 16, 1, 1] = global_pool{{kind = average, p = 2}}(%c3)
          const %shape: i64[2] = dense [1, 16]
          %y: f32[1, 16] = reshape{{allow_zero = false}}(%g, %shape)
        }}"#,
        w1 = dense(8 * 27, 1),
        b1 = dense(8, 2),
        w2 = dense(64, 3),
        wd = dense(72, 4),
        w3 = dense(16 * 72, 5),
        c3 = conv(3, 1, 1, 1),
        c1x1 = conv(1, 1, 0, 1),
        dw = conv(3, 1, 1, 8),
        c3s2 = conv(3, 2, 1, 1),
    ))
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

#[test]
fn a_cnn_body_runs_channels_last_between_two_transposes() {
    let mut g = cnn();
    assert!(channels_last(&mut g));
    rafter_ir::verify(&g).unwrap();
    assert_eq!(
        ops(&g),
        [
            "transpose",
            "conv_nhwc",
            "unary",
            "conv_nhwc",
            "binary",
            "conv_nhwc",
            "clip",
            "conv_nhwc",
            "transpose",
            "global_pool",
            "reshape"
        ]
    );
    // The weights are permuted to [kh, kw, C/g, M]; the interface keeps its names.
    let dims = |name: &str| {
        let v = g.values.iter().find(|v| v.name == name).unwrap();
        v.ty.known_dims().unwrap()
    };
    assert_eq!(dims("w1.hwio"), [3, 3, 3, 8]);
    assert_eq!(dims("wd.hwio"), [3, 3, 1, 8]);
    assert_eq!(dims("c3.nhwc"), [1, 5, 5, 16]);
    assert_eq!(dims("c3"), [1, 16, 5, 5]);
    assert_eq!(g.value(g.inputs[0]).name, "x");
    assert_eq!(g.value(g.outputs[0]).name, "y");
    // A second run finds nothing left to convert.
    assert!(!channels_last(&mut g));
}

#[test]
fn compiled_channels_last_programs_match_the_reference_bitwise() {
    let p = check_equivalent(&cnn(), vec![rand_f32(&[1, 3, 9, 9], 7)]);
    let convs: Vec<&str> = p
        .kernels
        .iter()
        .flat_map(|k| &k.body.nodes)
        .filter(|n| matches!(n.op, Op::Conv { .. } | Op::ConvNhwc { .. }))
        .map(|n| n.op.name())
        .collect();
    assert_eq!(convs, ["conv_nhwc"; 4]);
    // The ungrouped convolutions' weights are pre-packed ([ceil(M/16), kh·kw·C, 16]), but the
    // 3-channel stem's (computed directly) and the depthwise one's stay raw.
    let dims: Vec<Vec<usize>> = p.weights.iter().map(|w| w.dims.clone()).collect();
    for want in [
        vec![3, 3, 3, 8],
        vec![1, 8, 16],
        vec![1, 72, 16],
        vec![3, 3, 1, 8],
    ] {
        assert!(dims.contains(&want), "{want:?} in {dims:?}");
    }
}

#[test]
fn a_convolution_output_keeps_its_name_and_layout() {
    let src = format!(
        r#"graph @out(%x: f32[2, 4, 6, 5]) -> (%y, %z) {{
          const %w: f32[6, 4, 3, 3] = {w}
          %y: f32[2, 6, 6, 5] = {c}(%x, %w)
          %z: f32[2, 6, 6, 5] = unary{{op = relu}}(%y)
        }}"#,
        w = dense(6 * 36, 1),
        c = conv(3, 1, 1, 1),
    );
    let mut g = parse(&src);
    assert!(channels_last(&mut g));
    rafter_ir::verify(&g).unwrap();
    let names: Vec<&str> = g
        .outputs
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    assert_eq!(names, ["y", "z"]);
    for &v in &g.outputs {
        assert_eq!(g.value(v).ty.known_dims().unwrap(), [2, 6, 6, 5]);
    }
    check_equivalent(&parse(&src), vec![rand_f32(&[2, 4, 6, 5], 3)]);
}

#[test]
fn grouped_dilated_and_vulkan_convolutions_stay_nchw() {
    let src = format!(
        r#"graph @keep(%x: f32[1, 4, 12, 12], %v: f32[4, 4, 1, 1]) -> (%a, %c, %d) {{
          const %wg: f32[4, 2, 3, 3] = {wg}
          %a: f32[1, 4, 12, 12] = {grouped}(%x, %wg)
          const %wd: f32[4, 4, 3, 3] = {wd}
          %c: f32[1, 4, 8, 8] = conv{{kernel_shape = [3, 3], strides = [1, 1], pads = [0, 0, 0, 0], dilations = [2, 2], group = 1, auto_pad = explicit}}(%x, %wd)
          %d: f32[1, 4, 12, 12] = {c1}(%x, %v)
        }}"#,
        wg = dense(72, 1),
        wd = dense(144, 3),
        grouped = conv(3, 1, 1, 2),
        c1 = conv(1, 1, 0, 1),
    );
    let mut g = parse(&src);
    assert!(!channels_last(&mut g), "{:?}", ops(&g));
    let mut opts = rafter_opt::CompileOptions {
        target: rafter_opt::Target::cpu()
            .with(std::sync::Arc::new(rafter_codegen_spirv::SpirvBackend)),
        ..Default::default()
    };
    let p = rafter_opt::compile(&cnn(), &opts).unwrap();
    assert!(p
        .kernels
        .iter()
        .flat_map(|k| &k.body.nodes)
        .all(|n| !matches!(n.op, Op::ConvNhwc { .. })));
    opts.target = rafter_opt::Target::cpu();
    let p = rafter_opt::compile(&cnn(), &opts).unwrap();
    assert!(p
        .kernels
        .iter()
        .flat_map(|k| &k.body.nodes)
        .any(|n| matches!(n.op, Op::ConvNhwc { .. })));
}

#[test]
fn a_shared_weight_and_bias_are_relaid_once() {
    let src = format!(
        r#"graph @tied(%x: f32[1, 6, 5, 5]) -> (%z) {{
          const %w: f32[6, 6, 3, 3] = {w}
          const %b: f32[6, 1, 1] = {b}
          %c1: f32[1, 6, 5, 5] = {c}(%x, %w)
          %a1: f32[1, 6, 5, 5] = binary{{op = add}}(%c1, %b)
          %c2: f32[1, 6, 5, 5] = {c}(%a1, %w)
          %z: f32[1, 6, 5, 5] = binary{{op = add}}(%c2, %b)
        }}"#,
        w = dense(6 * 54, 1),
        b = dense(6, 2),
        c = conv(3, 1, 1, 1),
    );
    let mut g = parse(&src);
    assert!(channels_last(&mut g));
    let named = |name: &str| g.values.iter().filter(|v| v.name == name).count();
    assert_eq!((named("w.hwio"), named("b.nhwc")), (1, 1));
    assert_eq!(
        ops(&g),
        [
            "transpose",
            "conv_nhwc",
            "binary",
            "conv_nhwc",
            "binary",
            "transpose"
        ]
    );
    check_equivalent(&parse(&src), vec![rand_f32(&[1, 6, 5, 5], 5)]);
}
