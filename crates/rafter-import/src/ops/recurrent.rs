//! Recurrent layers: LSTM, GRU, RNN.

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::node::NodeView;
use rafter_ir::{rnn_activation, Dim, Op, RnnDirection, ValueId};

/// The recurrent ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("LSTM", |t| t.rnn()).checked(check_activations),
    OnnxOp::new("GRU", |t| t.rnn()).checked(check_activations),
    OnnxOp::new("RNN", |t| t.rnn()).checked(check_activations),
];

/// Every activation named is one rafter computes.
fn check_activations(n: &NodeView<'_>) -> Result<(), String> {
    if let Some(a) = n.attr("activations") {
        for s in &a.strings {
            let s = String::from_utf8_lossy(s);
            if rnn_activation_index(&s).is_none() {
                return Err(format!("unsupported: activation function `{s}`"));
            }
        }
    }
    Ok(())
}

impl Tr<'_, '_, '_> {
    pub(super) fn rnn(&mut self) -> R {
        let ins = self.all_inputs()?;
        self.rnn_of(self.n.op_type(), ins)
    }

    /// The recurrent layer `op` (`LSTM`, `GRU`, `RNN`) of the node's attributes on the
    /// ONNX operands `ins` (X, W, R, B?, ...).
    pub(super) fn rnn_of(&mut self, op: &str, ins: Vec<Option<ValueId>>) -> R {
        let n = self.n;
        let direction = match n.s("direction", "forward")?.as_str() {
            "forward" => RnnDirection::Forward,
            "reverse" => RnnDirection::Reverse,
            "bidirectional" => RnnDirection::Bidirectional,
            d => return Err(n.invalid(format!("unknown direction `{d}`"))),
        };
        let num_dir = if direction == RnnDirection::Bidirectional {
            2
        } else {
            1
        };
        if ins.len() < 3 || ins[..3].iter().any(Option::is_none) {
            return Err(n.invalid("X, W and R are required"));
        }
        let hidden_size = match n.i_opt("hidden_size")? {
            Some(h) => h,
            None => ins[2]
                .and_then(|r| self.ty(r).dims.get(2).and_then(Dim::as_known))
                .ok_or_else(|| n.invalid("missing attribute `hidden_size`"))?,
        };
        let defaults: &[&str] = match op {
            "LSTM" => &["Sigmoid", "Tanh", "Tanh"],
            "GRU" => &["Sigmoid", "Tanh"],
            _ => &["Tanh"],
        };
        let names = n.strings("activations")?.unwrap_or_else(|| {
            (0..num_dir)
                .flat_map(|_| defaults.iter().map(|s| s.to_string()))
                .collect()
        });
        let activations = names
            .iter()
            .map(|s| {
                rnn_activation_index(s)
                    .ok_or_else(|| n.unsupported(format!("unsupported: activation `{s}`")))
            })
            .collect::<R<Vec<_>>>()?;
        let activation_alpha = n.floats("activation_alpha")?.unwrap_or_default();
        let activation_beta = n.floats("activation_beta")?.unwrap_or_default();
        let layout = n.i("layout", 0)?;
        let clip = n.f_opt("clip")?;
        if n.opset < 7 {
            // The *-1 forms' `output_sequence` only said whether Y is required.
            n.i("output_sequence", 0)?;
        }
        let op = match op {
            "LSTM" => Op::Lstm {
                direction,
                hidden_size,
                layout,
                input_forget: n.flag("input_forget", false)?,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
            "GRU" => Op::Gru {
                direction,
                hidden_size,
                layout,
                // GRU-1 has no linear_before_reset (GRU-3 added it, default 0).
                linear_before_reset: n.opset >= 3 && n.flag("linear_before_reset", false)?,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
            _ => Op::Rnn {
                direction,
                hidden_size,
                layout,
                clip,
                activations,
                activation_alpha,
                activation_beta,
            },
        };
        self.finish(op, trim(ins))
    }
}

/// Index of a recurrent activation name in [`rnn_activation::NAMES`] (case-insensitive).
pub(crate) fn rnn_activation_index(name: &str) -> Option<i64> {
    rnn_activation::NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| i as i64)
}
