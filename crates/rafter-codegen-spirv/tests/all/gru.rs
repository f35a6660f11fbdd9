//! `gru` on the Vulkan device (lavapipe in CI) against the reference executor: forward,
//! reverse and bidirectional layers, both layouts, `linear_before_reset` either way,
//! `clip`, relu as a gate function, with and without a bias and initial state, `Y` and
//! `Y_h` each alone and together, and more (direction, batch) pairs than one workgroup
//! takes at a time. Within 2e-5 (sums reordered against the reference's, the epilogue's
//! sigmoid and tanh a few ulp off).

use crate::common;

use rafter_codegen_spirv::{gru, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

struct Case {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    direction: &'static str,
    layout: usize,
    lbr: bool,
    bias: bool,
    h0: bool,
    /// Extra attributes (`clip`, `activations`).
    extra: &'static str,
    y: bool,
    y_h: bool,
}

impl Case {
    fn dirs(&self) -> usize {
        if self.direction == "bidirectional" {
            2
        } else {
            1
        }
    }

    fn x_dims(&self) -> Vec<usize> {
        if self.layout == 0 {
            vec![self.seq, self.batch, self.input]
        } else {
            vec![self.batch, self.seq, self.input]
        }
    }

    fn y_dims(&self) -> Vec<usize> {
        let (s, d, b, h) = (self.seq, self.dirs(), self.batch, self.hidden);
        if self.layout == 0 {
            vec![s, d, b, h]
        } else {
            vec![b, s, d, h]
        }
    }

    fn state_dims(&self) -> Vec<usize> {
        let (d, b, h) = (self.dirs(), self.batch, self.hidden);
        if self.layout == 0 {
            vec![d, b, h]
        } else {
            vec![b, d, h]
        }
    }

    fn text(&self) -> String {
        let (d, h, i) = (self.dirs(), self.hidden, self.input);
        let mut params = vec![
            format!("%x: f32[{}]", common::dims_text(&self.x_dims())),
            format!("%w: f32[{d}, {}, {i}]", 3 * h),
            format!("%r: f32[{d}, {}, {h}]", 3 * h),
        ];
        let mut args = vec!["%x", "%w", "%r"];
        if self.bias {
            params.push(format!("%b: f32[{d}, {}]", 6 * h));
            args.push("%b");
        } else {
            args.push("_");
        }
        args.push("_");
        if self.h0 {
            params.push(format!(
                "%h0: f32[{}]",
                common::dims_text(&self.state_dims())
            ));
            args.push("%h0");
        }
        let mut results = Vec::new();
        let mut outs = Vec::new();
        if self.y {
            results.push(format!("%y: f32[{}]", common::dims_text(&self.y_dims())));
            outs.push("%y");
        } else {
            results.push("_".into());
        }
        if self.y_h {
            results.push(format!(
                "%yh: f32[{}]",
                common::dims_text(&self.state_dims())
            ));
            outs.push("%yh");
        }
        format!(
            "graph @g({}) -> ({}) {{\n  {} = gru{{direction = {}, hidden_size = {h}, layout = {}, linear_before_reset = {}{}}}({})\n}}",
            params.join(", "),
            outs.join(", "),
            results.join(", "),
            self.direction,
            self.layout,
            self.lbr,
            if self.extra.contains("activations") {
                format!("{}, activation_alpha = [], activation_beta = []", self.extra)
            } else {
                format!(
                    "{}, activations = [], activation_alpha = [], activation_beta = []",
                    self.extra
                )
            },
            args.join(", ")
        )
    }

    fn inputs(&self, seed: u64) -> Vec<Tensor> {
        let (d, h, i) = (self.dirs(), self.hidden, self.input);
        let t = |dims: Vec<usize>, range: f32, s: u64| {
            let n = dims.iter().product();
            Tensor::f32s(&dims, common::inputs_in((-range, range), n, seed + s))
        };
        let scale = 1.5 / (h as f32).sqrt();
        let mut v = vec![
            t(self.x_dims(), 1.0, 1),
            t(vec![d, 3 * h, i], scale, 2),
            t(vec![d, 3 * h, h], scale, 3),
        ];
        if self.bias {
            v.push(t(vec![d, 6 * h], 0.5, 4));
        }
        if self.h0 {
            v.push(t(self.state_dims(), 0.8, 5));
        }
        v
    }
}

fn check(case: &Case) {
    let text = case.text();
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = gru(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "gru");
    let Some(device) = common::device_or_skip("gru") else {
        return;
    };
    let inputs = case.inputs(11);
    let module = kernel_module(&g, 0).unwrap();
    let want = rafter_reference::run(&g, inputs.clone()).unwrap();
    let mut dims = Vec::new();
    if case.y {
        dims.push(case.y_dims());
    }
    if case.y_h {
        dims.push(case.state_dims());
    }
    let got = common::run_outputs(&device, &module, &inputs, DType::F32, &dims);
    assert_eq!(got.len(), want.len(), "{text}");
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        assert!(w.iter().any(|v| v.abs() > 0.1), "{text}: a degenerate case");
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                common::close(*a as f32, *b as f32, 2e-5, 2e-5),
                "{text}\noutput {o}, element {i}: {a} vs {b}"
            );
        }
    }
}

fn case(direction: &'static str, layout: usize, lbr: bool) -> Case {
    Case {
        seq: 7,
        batch: 3,
        input: 10,
        hidden: 16,
        direction,
        layout,
        lbr,
        bias: true,
        h0: true,
        extra: "",
        y: true,
        y_h: true,
    }
}

#[test]
fn every_direction_and_layout_matches_the_reference() {
    for direction in ["forward", "reverse", "bidirectional"] {
        for layout in [0, 1] {
            for lbr in [false, true] {
                check(&case(direction, layout, lbr));
            }
        }
    }
}

#[test]
fn optional_operands_and_results_match_the_reference() {
    // No bias, no initial state, only Y_h.
    check(&Case {
        bias: false,
        h0: false,
        y: false,
        ..case("bidirectional", 0, false)
    });
    // Only Y.
    check(&Case {
        y_h: false,
        ..case("forward", 1, true)
    });
}

#[test]
fn clip_and_relu_gates_match_the_reference() {
    check(&Case {
        extra: ", clip = 0.5",
        ..case("forward", 0, false)
    });
    // Sigmoid gates, a relu candidate (indices into rnn_activation::NAMES).
    check(&Case {
        extra: ", activations = [2, 0]",
        ..case("reverse", 0, true)
    });
}

/// Wider than the workgroup (160 hidden units over 128 invocations), a long input, and
/// more pairs than a small grid: the strided unit loop and the pair loop.
#[test]
fn a_wide_layer_matches_the_reference() {
    check(&Case {
        seq: 4,
        batch: 5,
        input: 70,
        hidden: 160,
        ..case("bidirectional", 0, false)
    });
}

#[test]
fn layers_the_kernel_cannot_do_say_why() {
    let text = "graph @g(%x: f32[3, 1, 2], %w: f32[1, 6, 2], %r: f32[1, 6, 2], %l: i32[1]) -> (%y) {\n  %y: f32[3, 1, 1, 2] = gru{direction = forward, hidden_size = 2, layout = 0, linear_before_reset = false, activations = [], activation_alpha = [], activation_beta = []}(%x, %w, %r, _, %l)\n}";
    let e = gru(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.contains("sequence_lens"), "{e}");
    let text = "graph @g(%x: f32[3, 1, 2], %w: f32[1, 6, 2], %r: f32[1, 6, 2]) -> (%y) {\n  %y: f32[3, 1, 1, 2] = gru{direction = forward, hidden_size = 2, layout = 0, linear_before_reset = false, activations = [2, 10], activation_alpha = [], activation_beta = []}(%x, %w, %r)\n}";
    let e = gru(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.contains("Softplus"), "{e}");
}
