//! The native recurrent kernel against the reference executor: LSTM, GRU and RNN on odd
//! sizes, every direction, both layouts, `sequence_lens`, peepholes, `input_forget`, clip
//! and non-default activations, with weights as program constants (prepared once, cached)
//! and as call inputs.

use std::time::Duration;

use bytes::Bytes;
use rafter_ir::{ConstData, DType, Graph, Op, RnnDirection, TensorType, ValueId};
use rafter_reference::Tensor;
use rafter_runtime::{Session, SessionOptions};

use super::operands::testing::le;
use crate::{devices, from_reference, to_reference};

fn ty(dtype: DType, d: &[usize]) -> TensorType {
    let d: Vec<i64> = d.iter().map(|&x| x as i64).collect();
    TensorType::known(dtype, &d)
}

struct Case {
    g: Graph,
    inputs: Vec<Tensor>,
    seed: u64,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            g: Graph::new("recurrent"),
            inputs: Vec::new(),
            seed: seed | 1,
        }
    }

    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.seed ^= self.seed << 13;
                self.seed ^= self.seed >> 7;
                self.seed ^= self.seed << 17;
                (((self.seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// A random f32 operand: a call input, or a program constant when `weight`.
    fn f32s(&mut self, dims: &[usize], scale: f32, weight: bool) -> ValueId {
        let v = self.values(dims.iter().product(), scale);
        let n = self.g.values.len();
        if weight {
            let c = ConstData::new(DType::F32, dims.to_vec(), Bytes::from(le(&v))).unwrap();
            self.g.add_const(format!("w{n}"), c)
        } else {
            self.inputs.push(Tensor::f32s(dims, v));
            self.g.add_input(format!("in{n}"), ty(DType::F32, dims))
        }
    }

    fn lens(&mut self, lens: &[i32]) -> ValueId {
        let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[lens.len()]), lens.to_vec());
        self.inputs.push(Tensor::I32(a.unwrap()));
        let n = self.g.values.len();
        self.g
            .add_input(format!("lens{n}"), ty(DType::I32, &[lens.len()]))
    }
}

/// Sizes and options of one recurrent node.
struct Spec {
    gates: usize,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dir: RnnDirection,
    layout: i64,
    bias: bool,
    lens: Option<Vec<i32>>,
    initial: bool,
    peep: bool,
    weights_const: bool,
}

/// Builds the node `op` for `s`, runs it natively and on the reference executor, compares
/// every result and checks that it ran natively.
fn check(op: Op, s: &Spec, seed: u64) {
    let mut c = Case::new(seed);
    let dirs = if s.dir == RnnDirection::Bidirectional {
        2
    } else {
        1
    };
    let (g, h) = (s.gates, s.hidden);
    let seq_batch = |a: usize, b: usize| {
        if s.layout == 0 {
            [a, b]
        } else {
            [b, a]
        }
    };
    let [x0, x1] = seq_batch(s.seq, s.batch);
    let x = c.f32s(&[x0, x1, s.input], 1.0, false);
    let w = c.f32s(&[dirs, g * h, s.input], 0.5, s.weights_const);
    let r = c.f32s(&[dirs, g * h, h], 0.5, s.weights_const);
    let b = s.bias.then(|| c.f32s(&[dirs, 2 * g * h], 0.5, true));
    let lens = s.lens.as_ref().map(|l| c.lens(l));
    let state_dims = if s.layout == 0 {
        [dirs, s.batch, h]
    } else {
        [s.batch, dirs, h]
    };
    let h0 = s.initial.then(|| c.f32s(&state_dims, 0.5, false));
    let is_lstm = g == 4;
    let c0 = (s.initial && is_lstm).then(|| c.f32s(&state_dims, 0.5, false));
    let p = (s.peep && is_lstm).then(|| c.f32s(&[dirs, 3 * h], 0.5, true));
    let mut ins = vec![Some(x), Some(w), Some(r), b, lens, h0];
    if is_lstm {
        ins.extend([c0, p]);
    }
    while ins.last() == Some(&None) {
        ins.pop();
    }
    let y_dims: Vec<usize> = if s.layout == 0 {
        vec![s.seq, dirs, s.batch, h]
    } else {
        vec![s.batch, s.seq, dirs, h]
    };
    let mut outs = vec![
        Some(("y".to_string(), ty(DType::F32, &y_dims))),
        Some(("y_h".to_string(), ty(DType::F32, &state_dims))),
    ];
    if is_lstm {
        outs.push(Some(("y_c".to_string(), ty(DType::F32, &state_dims))));
    }
    let results = c.g.add_node("rnn", op, ins, outs);
    c.g.outputs = results.into_iter().flatten().collect();
    let want = rafter_reference::run(&c.g, c.inputs.clone()).unwrap();
    let program = rafter_opt::compile(&c.g, &rafter_opt::CompileOptions::default()).unwrap();
    let devices = devices().unwrap();
    let session =
        Session::with_options(program, &devices, SessionOptions::new().kernel_threads(2)).unwrap();
    // Twice: the second call reads the prepared weights from the kernel's cache.
    for _ in 0..2 {
        let inputs = c
            .inputs
            .iter()
            .map(|t| from_reference(t).unwrap())
            .collect();
        let got = session.run(inputs, Duration::from_secs(60)).unwrap();
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = to_reference(g).unwrap();
            assert_eq!(g.shape(), w.shape(), "result {k}");
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "result {k} element {i}: {a} vs reference {b}"
                );
            }
        }
    }
    let stats = session.native_stats();
    assert!(stats.dispatches >= 2 && stats.fallbacks == 0, "{stats:?}");
}

fn spec(gates: usize, dir: RnnDirection) -> Spec {
    Spec {
        gates,
        seq: 5,
        batch: 3,
        input: 7,
        hidden: 9,
        dir,
        layout: 0,
        bias: true,
        lens: None,
        initial: true,
        peep: false,
        weights_const: true,
    }
}

fn lstm(dir: RnnDirection, layout: i64, input_forget: bool, clip: Option<f32>) -> Op {
    Op::Lstm {
        direction: dir,
        hidden_size: 0,
        layout,
        input_forget,
        clip,
        activations: vec![],
        activation_alpha: vec![],
        activation_beta: vec![],
    }
}

fn gru(dir: RnnDirection, layout: i64, linear_before_reset: bool) -> Op {
    Op::Gru {
        direction: dir,
        hidden_size: 0,
        layout,
        linear_before_reset,
        clip: None,
        activations: vec![],
        activation_alpha: vec![],
        activation_beta: vec![],
    }
}

#[test]
fn lstm_every_direction_with_peepholes_and_lengths() {
    for (i, dir) in [
        RnnDirection::Forward,
        RnnDirection::Reverse,
        RnnDirection::Bidirectional,
    ]
    .into_iter()
    .enumerate()
    {
        let s = Spec {
            peep: true,
            ..spec(4, dir)
        };
        check(lstm(dir, 0, false, None), &s, 10 + i as u64);
        let s = Spec {
            lens: Some(vec![5, 2, 0]),
            ..spec(4, dir)
        };
        check(lstm(dir, 0, false, None), &s, 20 + i as u64);
    }
}

#[test]
fn lstm_batch_first_input_forget_clip_and_weight_inputs() {
    let dir = RnnDirection::Bidirectional;
    let s = Spec {
        layout: 1,
        weights_const: false,
        lens: Some(vec![3, 5, 1]),
        peep: true,
        ..spec(4, dir)
    };
    check(lstm(dir, 1, true, Some(0.7)), &s, 31);
    // 17 inputs, 33 hidden units (partial vectors), one batch row, no bias or state.
    let s = Spec {
        seq: 4,
        batch: 1,
        input: 17,
        hidden: 33,
        bias: false,
        initial: false,
        ..spec(4, RnnDirection::Forward)
    };
    check(lstm(RnnDirection::Forward, 0, false, None), &s, 32);
}

#[test]
fn lstm_with_other_activations() {
    // HardSigmoid (0.3, 0.4) for gates, Affine (2, 0.1) for the candidate, Softsign for h.
    let op = Op::Lstm {
        direction: RnnDirection::Forward,
        hidden_size: 9,
        layout: 0,
        input_forget: false,
        clip: None,
        activations: vec![act("HardSigmoid"), act("Affine"), act("Softsign")],
        activation_alpha: vec![0.3, 2.0],
        activation_beta: vec![0.4, 0.1],
    };
    check(op, &spec(4, RnnDirection::Forward), 41);
}

fn act(name: &str) -> i64 {
    rafter_ir::rnn_activation::NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap() as i64
}

#[test]
fn gru_both_reset_placements_every_direction() {
    for (i, dir) in [
        RnnDirection::Forward,
        RnnDirection::Reverse,
        RnnDirection::Bidirectional,
    ]
    .into_iter()
    .enumerate()
    {
        for lbr in [false, true] {
            let seed = 50 + 2 * i as u64 + u64::from(lbr);
            check(gru(dir, 0, lbr), &spec(3, dir), seed);
            let s = Spec {
                layout: 1,
                lens: Some(vec![4, 0, 5]),
                ..spec(3, dir)
            };
            check(gru(dir, 1, lbr), &s, seed + 100);
        }
    }
}

#[test]
fn rnn_with_tanh_and_leaky_relu() {
    let op = |acts: Vec<i64>, alpha: Vec<f32>| Op::Rnn {
        direction: RnnDirection::Bidirectional,
        hidden_size: 9,
        layout: 0,
        clip: Some(1.5),
        activations: acts,
        activation_alpha: alpha,
        activation_beta: vec![],
    };
    let s = spec(1, RnnDirection::Bidirectional);
    check(op(vec![], vec![]), &s, 61);
    check(op(vec![act("LeakyRelu"), act("Tanh")], vec![0.2]), &s, 62);
}
