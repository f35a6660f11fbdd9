//! Reductions and normalisations: the Reduce* family, ArgMax/ArgMin, cumulative sums,
//! softmaxes and every normalisation.

use super::registry::OnnxOp;
use super::{axes_input_index, Tr, R};
use crate::node::NodeView;
use rafter_ir::{ArgKind, CumKind, Dim, Op, ReduceKind, SoftmaxKind, ValueId};

/// The normalize ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::reduce("ReduceSum", ReduceKind::Sum),
    OnnxOp::reduce("ReduceMean", ReduceKind::Mean),
    OnnxOp::reduce("ReduceMax", ReduceKind::Max),
    OnnxOp::reduce("ReduceMin", ReduceKind::Min),
    OnnxOp::reduce("ReduceProd", ReduceKind::Prod),
    OnnxOp::reduce("ReduceL1", ReduceKind::L1),
    OnnxOp::reduce("ReduceL2", ReduceKind::L2),
    OnnxOp::reduce("ReduceLogSum", ReduceKind::LogSum),
    OnnxOp::reduce("ReduceLogSumExp", ReduceKind::LogSumExp),
    OnnxOp::reduce("ReduceSumSquare", ReduceKind::SumSquare),
    OnnxOp::new("ArgMax", arg_reduce),
    OnnxOp::new("ArgMin", arg_reduce),
    OnnxOp::new("CumSum", cumulative),
    OnnxOp::new("CumProd", cumulative),
    OnnxOp::new("Softmax", |t| t.softmax(SoftmaxKind::Softmax)),
    OnnxOp::new("LogSoftmax", |t| t.softmax(SoftmaxKind::LogSoftmax)),
    OnnxOp::new("Hardmax", |t| t.softmax(SoftmaxKind::Hardmax)),
    OnnxOp::new("LayerNormalization", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axis = t.axis(n.i("axis", -1)?, t.rank(x))?;
        let ins = vec![Some(x), Some(t.req(1)?), t.inp(2)?];
        t.finish_k(
            Op::LayerNorm {
                axis,
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
            3,
        )
    }),
    OnnxOp::new("RMSNormalization", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axis = t.axis(n.i("axis", -1)?, t.rank(x))?;
        let ins = vec![Some(x), Some(t.req(1)?)];
        t.finish_k(
            Op::RmsNorm {
                axis,
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
            1,
        )
    }),
    OnnxOp::new("GroupNormalization", |t| t.group_norm()),
    OnnxOp::new("InstanceNormalization", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), Some(t.req(2)?)];
        t.finish(
            Op::InstanceNorm {
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
        )
    }),
    OnnxOp::new("BatchNormalization", |t| t.batch_norm()).checked(check_batch_norm),
    OnnxOp::new("LpNormalization", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axis = t.axis(n.i("axis", -1)?, t.rank(x))?;
        t.finish(
            Op::LpNorm {
                axis,
                p: n.i("p", 2)?,
            },
            vec![Some(x)],
        )
    }),
    OnnxOp::new("LRN", |t| {
        let n = t.n;
        t.act(Op::Lrn {
            alpha: n.f("alpha", 1e-4)?,
            beta: n.f("beta", 0.75)?,
            bias: n.f("bias", 1.0)?,
            size: n.i_req("size")?,
        })
    }),
    OnnxOp::new("MeanVarianceNormalization", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axes = n.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
        let axes = t.axes(&axes, t.rank(x))?;
        t.finish(Op::MeanVarianceNorm { axes }, vec![Some(x)])
    }),
];

/// Only inference batch norm: no training mode, no training outputs.
fn check_batch_norm(n: &NodeView<'_>) -> Result<(), String> {
    if n.attr("training_mode").map(|a| a.i) == Some(1) {
        return Err("unsupported: training_mode=1 (only inference batch norm is supported)".into());
    }
    if n.opset < 7 && n.attr("is_test").map_or(0, |a| a.i) == 0 {
        return Err(
            "unsupported: is_test=0 (training mode: normalises with the batch's own \
             statistics; only inference batch norm is supported)"
                .into(),
        );
    }
    if (1..n.p.output.len()).any(|i| n.has_output(i)) {
        return Err(
            "unsupported: training outputs (running or saved mean/variance) are requested".into(),
        );
    }
    Ok(())
}

/// `ArgMax` and `ArgMin`.
fn arg_reduce(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let x = t.req(0)?;
    let kind = if op == "ArgMax" {
        ArgKind::Max
    } else {
        ArgKind::Min
    };
    let axis = t.axis(n.i("axis", 0)?, t.rank(x))?;
    t.finish(
        Op::ArgReduce {
            kind,
            axis,
            keep_dims: n.flag("keepdims", true)?,
            select_last_index: n.flag("select_last_index", false)?,
        },
        vec![Some(x)],
    )
}

/// `CumSum` and `CumProd`.
fn cumulative(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let kind = if op == "CumSum" {
        CumKind::Sum
    } else {
        CumKind::Prod
    };
    let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
    t.finish(
        Op::Cumulative {
            kind,
            exclusive: n.flag("exclusive", false)?,
            reverse: n.flag("reverse", false)?,
        },
        ins,
    )
}

impl Tr<'_, '_, '_> {
    pub(super) fn batch_norm(&mut self) -> R {
        let n = self.n;
        let ins = (0..5)
            .map(|i| self.req(i).map(Some))
            .collect::<R<Vec<_>>>()?;
        // (BatchNormalization-1/6's is_test=0, training mode, is refused by static_check.)
        if n.opset < 9 && !n.flag("spatial", true)? {
            // spatial=0 keeps statistics per channel *and* position ([C, D1, ...]); that is
            // the per-channel batch norm only when there are no spatial dims.
            let x = ins[0].expect("required");
            if self.rank(x) > 2 {
                return Err(n.unsupported(format!(
                    "unsupported: spatial=0 (statistics per channel and position) on {}",
                    self.ty(x)
                )));
            }
        }
        self.finish_k(
            Op::BatchNorm {
                epsilon: n.f("epsilon", 1e-5)?,
            },
            ins,
            1,
        )
    }

    pub(super) fn reduce(&mut self, kind: ReduceKind) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let from_input = axes_input_index(n.op_type(), n.opset).is_some();
        let noop = from_input && n.flag("noop_with_empty_axes", false)?;
        let keep_dims = n.flag("keepdims", true)?;
        let axes = if from_input {
            match self.inp(1)? {
                Some(a) => match self.sc.known_i64s(a) {
                    Some(k) => k,
                    // Known only at run time: the operand.
                    None => {
                        let op = Op::Reduce {
                            kind,
                            axes: vec![],
                            keep_dims,
                            noop_with_empty_axes: noop,
                        };
                        return self.finish(op, vec![Some(x), Some(a)]);
                    }
                },
                None => Vec::new(),
            }
        } else {
            n.ints("axes")?.unwrap_or_default()
        };
        if axes.is_empty() && noop {
            return self.finish(Op::Identity, vec![Some(x)]);
        }
        let mut axes = self.axes(&axes, self.rank(x))?;
        axes.sort_unstable();
        self.finish(
            Op::Reduce {
                kind,
                axes,
                keep_dims,
                noop_with_empty_axes: false,
            },
            vec![Some(x)],
        )
    }

    pub(super) fn softmax(&mut self, kind: SoftmaxKind) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let rank = self.rank(x);
        let default_axis = if n.opset < 13 { 1 } else { -1 };
        let axis = self.axis(n.i("axis", default_axis)?, rank)?;
        if n.opset >= 13 || axis + 1 == rank as i64 {
            return self.finish(Op::Softmax { kind, axis }, vec![Some(x)]);
        }
        // Before opset 13 the input is coerced to 2-D at `axis` and normalised along the
        // flattened trailing dims.
        let flat = self.tmp("flat", Op::Flatten { axis }, vec![Some(x)])?;
        let sm = self.tmp("softmax2d", Op::Softmax { kind, axis: 1 }, vec![Some(flat)])?;
        let shape = self.tmp(
            "shape",
            Op::Shape {
                start: 0,
                end: None,
            },
            vec![Some(x)],
        )?;
        self.finish(
            Op::Reshape { allow_zero: true },
            vec![Some(sm), Some(shape)],
        )
    }

    pub(super) fn group_norm(&mut self) -> R {
        let n = self.n;
        let (x, mut scale, mut bias) = (self.req(0)?, self.req(1)?, self.req(2)?);
        let num_groups = n.i_req("num_groups")?;
        if n.opset < 21 {
            // GroupNormalization-18 takes scale and bias per group; the IR (like opset 21)
            // takes them per channel: repeat each group's value C/G times.
            let c = self.ty(x).dims.get(1).and_then(Dim::as_known);
            match c {
                Some(c) if c == num_groups => {}
                Some(c) if num_groups > 0 && c % num_groups == 0 => {
                    let per = c / num_groups;
                    scale = self.per_channel(scale, "scale", num_groups, per, c)?;
                    bias = self.per_channel(bias, "bias", num_groups, per, c)?;
                }
                _ => {
                    return Err(n.unsupported(
                        "unsupported: GroupNormalization-18 per-group scale with an unknown \
                         or indivisible channel count",
                    ))
                }
            }
        }
        self.finish(
            Op::GroupNorm {
                num_groups,
                epsilon: n.f("epsilon", 1e-5)?,
            },
            vec![Some(x), Some(scale), Some(bias)],
        )
    }

    /// `[G]` → `[C]` by repeating each element `per` times.
    pub(super) fn per_channel(
        &mut self,
        v: ValueId,
        what: &str,
        g: i64,
        per: i64,
        c: i64,
    ) -> R<ValueId> {
        let col = self.tmp(
            &format!("{what}_col"),
            Op::Unsqueeze { axes: vec![1] },
            vec![Some(v)],
        )?;
        let shape = self.i64_const(&format!("{what}_gshape"), &[g, per]);
        let wide = self.tmp(
            &format!("{what}_wide"),
            Op::Expand,
            vec![Some(col), Some(shape)],
        )?;
        let flat = self.i64_const(&format!("{what}_cshape"), &[c]);
        self.tmp(
            &format!("{what}_per_channel"),
            Op::Reshape { allow_zero: false },
            vec![Some(wide), Some(flat)],
        )
    }
}
