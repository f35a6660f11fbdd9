//! `lstm` on the Vulkan device (lavapipe in CI) against the reference executor: forward,
//! reverse and bidirectional layers, both layouts, peepholes, `input_forget`, `clip`, relu
//! as a gate function, with and without the bias and initial states, `Y`, `Y_h` and `Y_c`
//! alone and together. An LSTM with every operand but `sequence_lens` binds 10 buffers (7 inputs, 3 outputs), past the 8 a
//! dispatch passes in push constants, so every case here with more than 8 goes through
//! the argument block in memory. Within 2e-5 (sums reordered against the reference's,
//! the epilogue's sigmoid and tanh a few ulp off).

use crate::common;

use rafter_codegen_spirv::{gru, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[derive(Clone)]
struct Case {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    direction: &'static str,
    layout: usize,
    bias: bool,
    h0: bool,
    c0: bool,
    peep: bool,
    /// Extra attributes (`clip`, `activations`, `input_forget`).
    input_forget: bool,
    extra: &'static str,
    y: bool,
    y_h: bool,
    y_c: bool,
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
        let state = common::dims_text(&self.state_dims());
        let mut params = vec![
            format!("%x: f32[{}]", common::dims_text(&self.x_dims())),
            format!("%w: f32[{d}, {}, {i}]", 4 * h),
            format!("%r: f32[{d}, {}, {h}]", 4 * h),
        ];
        let mut args = vec!["%x", "%w", "%r"];
        let mut opt = |on: bool, name: &'static str, ty: String| {
            if on {
                params.push(format!("{name}: f32[{ty}]"));
                args.push(name);
            } else {
                args.push("_");
            }
        };
        opt(self.bias, "%b", format!("{d}, {}", 8 * h));
        opt(false, "%l", String::new());
        opt(self.h0, "%h0", state.clone());
        opt(self.c0, "%c0", state.clone());
        opt(self.peep, "%p", format!("{d}, {}", 3 * h));
        while args.last() == Some(&"_") {
            args.pop();
        }
        let mut results = Vec::new();
        let mut outs = Vec::new();
        for (on, name, dims) in [
            (self.y, "%y", common::dims_text(&self.y_dims())),
            (self.y_h, "%yh", state.clone()),
            (self.y_c, "%yc", state.clone()),
        ] {
            if on {
                results.push(format!("{name}: f32[{dims}]"));
                outs.push(name);
            } else {
                results.push("_".into());
            }
        }
        while results.last().map(String::as_str) == Some("_") {
            results.pop();
        }
        let acts = if self.extra.contains("activations") {
            format!(
                "{}, activation_alpha = [], activation_beta = []",
                self.extra
            )
        } else {
            format!(
                "{}, activations = [], activation_alpha = [], activation_beta = []",
                self.extra
            )
        };
        format!(
            "graph @g({}) -> ({}) {{\n  {} = lstm{{direction = {}, hidden_size = {h}, layout = {}, input_forget = {}{acts}}}({})\n}}",
            params.join(", "),
            outs.join(", "),
            results.join(", "),
            self.direction,
            self.layout,
            self.input_forget,
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
            t(vec![d, 4 * h, i], scale, 2),
            t(vec![d, 4 * h, h], scale, 3),
        ];
        if self.bias {
            v.push(t(vec![d, 8 * h], 0.5, 4));
        }
        if self.h0 {
            v.push(t(self.state_dims(), 0.8, 5));
        }
        if self.c0 {
            v.push(t(self.state_dims(), 1.5, 6));
        }
        if self.peep {
            v.push(t(vec![d, 3 * h], 0.7, 7));
        }
        v
    }

    fn bindings(&self) -> usize {
        3 + [
            self.bias, self.h0, self.c0, self.peep, self.y, self.y_h, self.y_c,
        ]
        .iter()
        .filter(|&&b| b)
        .count()
    }
}

fn check(case: &Case) {
    let text = case.text();
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = gru(&g).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "lstm");
    let Some(device) = common::device_or_skip("lstm") else {
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
    if case.y_c {
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

fn case(direction: &'static str, layout: usize) -> Case {
    Case {
        seq: 7,
        batch: 3,
        input: 10,
        hidden: 16,
        direction,
        layout,
        bias: true,
        h0: true,
        c0: true,
        peep: true,
        input_forget: false,
        extra: "",
        y: true,
        y_h: true,
        y_c: true,
    }
}

#[test]
fn every_direction_and_layout_matches_the_reference() {
    for direction in ["forward", "reverse", "bidirectional"] {
        for layout in [0, 1] {
            let c = case(direction, layout);
            assert_eq!(c.bindings(), 10);
            check(&c);
        }
    }
}

#[test]
fn optional_operands_and_results_match_the_reference() {
    // The corpus's form: no peepholes (9 bindings).
    check(&Case {
        peep: false,
        ..case("forward", 0)
    });
    // No bias, states or peepholes, only Y_c (4 bindings: push constants).
    check(&Case {
        bias: false,
        h0: false,
        c0: false,
        peep: false,
        y: false,
        y_h: false,
        ..case("bidirectional", 0)
    });
    // Only Y_h, with input_forget.
    check(&Case {
        y: false,
        y_c: false,
        input_forget: true,
        ..case("reverse", 1)
    });
}

#[test]
fn clip_and_relu_gates_match_the_reference() {
    check(&Case {
        extra: ", clip = 0.5",
        ..case("forward", 0)
    });
    // Sigmoid gates, a relu candidate, a tanh output (indices into rnn_activation::NAMES).
    check(&Case {
        extra: ", activations = [2, 0, 1]",
        ..case("reverse", 0)
    });
}

/// Wider than the workgroup (160 hidden units over 128 invocations) and more pairs.
#[test]
fn a_wide_layer_matches_the_reference() {
    check(&Case {
        seq: 4,
        batch: 5,
        input: 70,
        hidden: 160,
        ..case("bidirectional", 0)
    });
}
