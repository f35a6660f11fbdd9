//! Recurrent cells' activations (ONNX `RNN`, `GRU`, `LSTM`): the names stored by index in
//! `Op::Lstm::activations` and friends, each cell's defaults, and how the `activations`,
//! `activation_alpha` and `activation_beta` lists resolve into one activation per gate
//! function and direction. The reference executor and the CPU runtime's native kernels both
//! read the attributes through [`resolve`], so they cannot disagree on them.

/// Activation names, in the order their indices are stored.
pub const NAMES: &[&str] = &[
    "Relu",
    "Tanh",
    "Sigmoid",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
];

/// Which recurrent cell, with the variant flag its op carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell {
    Rnn,
    Gru { linear_before_reset: bool },
    Lstm { input_forget: bool },
}

impl Cell {
    /// Gates per hidden unit: the row blocks of `W`, `R` and `B`.
    pub fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm { .. } => 4,
        }
    }

    /// ONNX's default activations of one direction (f, g[, h]).
    pub fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru { .. } => &["Sigmoid", "Tanh"],
            Cell::Lstm { .. } => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// One activation function with its parameters (0 where the function takes none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activation {
    pub name: &'static str,
    pub alpha: f32,
    pub beta: f32,
}

/// (uses alpha, uses beta, default alpha, default beta) of the function `name`.
fn params(name: &str) -> (bool, bool, f32, f32) {
    match name {
        "Affine" => (true, true, 1.0, 0.0),
        "LeakyRelu" => (true, false, 0.01, 0.0),
        "ThresholdedRelu" => (true, false, 1.0, 0.0),
        "ScaledTanh" => (true, true, 1.0, 1.0),
        "HardSigmoid" => (true, true, 0.2, 0.5),
        "Elu" => (true, false, 1.0, 0.0),
        _ => (false, false, 0.0, 0.0),
    }
}

/// The activations of each of `dirs` directions from the op's lists (indices into
/// [`NAMES`]; empty: the cell's defaults; one direction's list for a bidirectional op is
/// used for both). Alpha and beta values are consumed in list order by the functions that
/// take them, as onnxruntime reads them; a missing one is the function's default. Errors
/// name an index outside [`NAMES`] or a list of the wrong length.
pub fn resolve(
    cell: Cell,
    dirs: usize,
    activations: &[i64],
    alpha: &[f32],
    beta: &[f32],
) -> Result<Vec<Vec<Activation>>, String> {
    let per = cell.default_activations().len();
    let mut names: Vec<&'static str> = if activations.is_empty() {
        cell.default_activations().repeat(dirs)
    } else {
        activations
            .iter()
            .map(|&a| {
                usize::try_from(a)
                    .ok()
                    .and_then(|i| NAMES.get(i).copied())
                    .ok_or_else(|| format!("recurrent activation index {a}"))
            })
            .collect::<Result<_, _>>()?
    };
    if names.len() == per && dirs == 2 {
        names = names.repeat(2);
    }
    if names.len() != per * dirs {
        return Err(format!(
            "{} activations for {dirs} direction(s) of {per}",
            names.len()
        ));
    }
    let (mut ai, mut bi) = (0, 0);
    let all: Vec<Activation> = names
        .into_iter()
        .map(|name| {
            let (takes_alpha, takes_beta, mut a, mut b) = params(name);
            if takes_alpha {
                a = alpha.get(ai).copied().unwrap_or(a);
                ai += 1;
            }
            if takes_beta {
                b = beta.get(bi).copied().unwrap_or(b);
                bi += 1;
            }
            Activation {
                name,
                alpha: a,
                beta: b,
            }
        })
        .collect();
    Ok(all.chunks(per).map(<[Activation]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(name: &str) -> i64 {
        NAMES.iter().position(|n| *n == name).unwrap() as i64
    }

    #[test]
    fn defaults_fill_each_direction() {
        let lstm = Cell::Lstm {
            input_forget: false,
        };
        let acts = resolve(lstm, 2, &[], &[], &[]).unwrap();
        assert_eq!(acts.len(), 2);
        let names: Vec<_> = acts[1].iter().map(|a| a.name).collect();
        assert_eq!(names, ["Sigmoid", "Tanh", "Tanh"]);
    }

    #[test]
    fn parameters_are_consumed_in_order_by_the_functions_that_take_them() {
        // GRU, two directions: LeakyRelu takes alpha 0.5; Tanh nothing; HardSigmoid takes
        // the second alpha and the first beta; ScaledTanh the rest, beta defaulting.
        let acts = [
            index("LeakyRelu"),
            index("Tanh"),
            index("HardSigmoid"),
            index("ScaledTanh"),
        ];
        let gru = Cell::Gru {
            linear_before_reset: false,
        };
        let r = resolve(gru, 2, &acts, &[0.5, 0.25, 2.0], &[0.75]).unwrap();
        assert_eq!(
            r[0],
            [
                Activation {
                    name: "LeakyRelu",
                    alpha: 0.5,
                    beta: 0.0
                },
                Activation {
                    name: "Tanh",
                    alpha: 0.0,
                    beta: 0.0
                },
            ]
        );
        assert_eq!(
            r[1],
            [
                Activation {
                    name: "HardSigmoid",
                    alpha: 0.25,
                    beta: 0.75
                },
                Activation {
                    name: "ScaledTanh",
                    alpha: 2.0,
                    beta: 1.0
                },
            ]
        );
    }

    #[test]
    fn bad_lists_are_named() {
        let e = resolve(Cell::Rnn, 1, &[99], &[], &[]).unwrap_err();
        assert!(e.contains("index 99"), "{e}");
        let e = resolve(Cell::Rnn, 1, &[1, 1], &[], &[]).unwrap_err();
        assert!(e.contains("2 activations for 1 direction(s) of 1"), "{e}");
    }
}
