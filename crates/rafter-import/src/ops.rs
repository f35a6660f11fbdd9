//! Translation of each ONNX op (default domain, opsets 1..=28) to IR ops.
//!
//! [`registry`] holds one registration per op type, in family tables that sit beside the
//! code that builds each op (one file per family); this module has what every translation
//! shares: the per-node translator [`Tr`] (operands, emission of IR nodes) and helpers used
//! by several families.

mod contraction;
mod contrib;
mod contrib_attention;
mod contrib_conv;
mod contrib_gather;
mod contrib_qlinear;
mod contrib_quant;
mod control;
mod elementwise;
mod extra;
mod misc;
mod movement;
mod normalize;
mod pooling;
mod recurrent;
pub(crate) mod registry;

use registry::{OnnxOp, Translate};

use crate::convert::{norm_axes, norm_axis};
use crate::import::{Ctx, Scope};
use crate::node::NodeView;
use crate::ImportError;
use rafter_ir::{AutoPad, ConstData, DType, Dim, Op, TensorType, ValueId};

/// The input index of the `axes` operand, for the ops and opsets that take axes as an
/// input (constant axes become the op's attribute, others its operand).
pub(crate) fn axes_input_index(op: &str, opset: i64) -> Option<usize> {
    match op {
        "ReduceSum" | "Squeeze" | "Unsqueeze" if opset >= 13 => Some(1),
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset >= 18 =>
        {
            Some(1)
        }
        _ => None,
    }
}

/// Translates node `n` with its registered translation (`op`, found by the caller, which
/// has run its static check).
pub(crate) fn translate(
    cx: &mut Ctx<'_>,
    sc: &mut Scope,
    n: &NodeView<'_>,
    op: &OnnxOp,
) -> Result<(), ImportError> {
    Tr { cx, sc, n }.run(op)
}

/// Translation of one node.
pub(crate) struct Tr<'a, 'h, 'n> {
    cx: &'a mut Ctx<'h>,
    sc: &'a mut Scope,
    n: &'a NodeView<'n>,
}

pub(crate) type R<T = ()> = Result<T, ImportError>;

impl Tr<'_, '_, '_> {
    // ---- operands ----

    /// Operand `i`: `None` when absent or empty, an error when it names nothing.
    fn inp(&self, i: usize) -> R<Option<ValueId>> {
        let Some(name) = self.n.input_name(i) else {
            return Ok(None);
        };
        match self.sc.names.get(name) {
            Some(&v) => Ok(Some(v)),
            None => Err(ImportError::UndefinedInput {
                file: self.n.file.to_string(),
                node: self.n.name.clone(),
                op_type: self.n.op_type().to_string(),
                input: name.to_string(),
            }),
        }
    }

    fn req(&self, i: usize) -> R<ValueId> {
        self.inp(i)?.ok_or_else(|| {
            self.n.invalid(format!(
                "missing required input {i} (of {})",
                self.n.num_inputs()
            ))
        })
    }

    fn all_inputs(&self) -> R<Vec<Option<ValueId>>> {
        (0..self.n.num_inputs()).map(|i| self.inp(i)).collect()
    }

    fn ty(&self, v: ValueId) -> &TensorType {
        self.sc.ty(v)
    }

    fn rank(&self, v: ValueId) -> usize {
        self.ty(v).rank()
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.ty(v).dtype
    }

    /// `v` unless it is a constant with no elements (ONNX's "empty means absent").
    fn non_empty(&self, v: Option<ValueId>) -> Option<ValueId> {
        v.filter(|&v| self.sc.g.const_of(v).is_none_or(|c| c.num_elements() > 0))
    }

    fn axis(&self, axis: i64, rank: usize) -> R<i64> {
        norm_axis(axis, rank).map_err(|e| self.n.invalid(e))
    }

    fn axes(&self, axes: &[i64], rank: usize) -> R<Vec<i64>> {
        norm_axes(axes, rank).map_err(|e| self.n.invalid(e))
    }

    // ---- emission ----

    /// Emits the node's final IR op, whose results are the ONNX node's outputs.
    fn finish(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> R {
        let outs = self.n.out_names();
        self.finish_outs(op, inputs, outs)
    }

    /// Like [`Self::finish`] for an IR op with `k` results (extra ONNX outputs are absent).
    fn finish_k(&mut self, op: Op, inputs: Vec<Option<ValueId>>, k: usize) -> R {
        let mut outs = self.n.out_names();
        if outs[k.min(outs.len())..].iter().any(Option::is_some) {
            return Err(self.n.unsupported(format!(
                "unsupported: only the first {k} output(s) of {} are supported",
                self.n.op_type()
            )));
        }
        outs.truncate(k);
        self.finish_outs(op, inputs, outs)
    }

    fn finish_outs(
        &mut self,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outs: Vec<Option<String>>,
    ) -> R {
        let ids = self.cx.emit(
            self.sc,
            self.n,
            self.n.name.clone(),
            op,
            inputs,
            outs.clone(),
        )?;
        for (name, id) in outs.into_iter().zip(ids) {
            if let (Some(name), Some(id)) = (name, id) {
                self.sc.names.insert(name, id);
            }
        }
        Ok(())
    }

    /// Emits a helper op with one result named `<node>/<suffix>`.
    fn tmp(&mut self, suffix: &str, op: Op, inputs: Vec<Option<ValueId>>) -> R<ValueId> {
        let name = format!("{}/{suffix}", self.n.name);
        let ids = self
            .cx
            .emit(self.sc, self.n, name.clone(), op, inputs, vec![Some(name)])?;
        Ok(ids[0].expect("requested result"))
    }

    fn konst(&mut self, suffix: &str, data: ConstData) -> ValueId {
        self.sc.add_const(format!("{}/{suffix}", self.n.name), data)
    }

    fn i64_const(&mut self, suffix: &str, values: &[i64]) -> ValueId {
        self.konst(suffix, ConstData::from_i64s(values))
    }

    // ---- dispatch ----

    /// Translates the node with its registered translation.
    fn run(&mut self, op: &OnnxOp) -> R {
        match op.translate {
            Translate::Unary(u) => {
                let x = self.req(0)?;
                self.finish(Op::Unary { op: u }, vec![Some(x)])
            }
            Translate::Binary(b) => self.binary(b),
            Translate::Reduce(kind) => self.reduce(kind),
            Translate::Custom(f) => f(self),
        }
    }

    /// An op of one operand whose attributes are already built.
    fn act(&mut self, op: Op) -> R {
        let x = self.req(0)?;
        self.finish(op, vec![Some(x)])
    }

    // ---- shared by several families ----

    /// A convolution's or pool's window attributes (`kernel_shape`, taken from the weight
    /// `w` when absent and `kernel_from_w`; strides, pads, dilations with their defaults).
    fn conv_params(&self, x: ValueId, w: Option<ValueId>, kernel_from_w: bool) -> R<ConvParams> {
        let n = self.n;
        let sp = self.rank(x).saturating_sub(2);
        let kernel = match n.ints("kernel_shape")? {
            Some(k) if !k.is_empty() => k,
            _ if kernel_from_w => w
                .and_then(|w| {
                    let dims = &self.ty(w).dims;
                    dims.get(2..)
                        .and_then(|d| d.iter().map(Dim::as_known).collect::<Option<Vec<_>>>())
                })
                .unwrap_or_default(),
            _ => return Err(n.invalid("missing required attribute `kernel_shape`")),
        };
        let sp = if kernel.is_empty() { sp } else { kernel.len() };
        Ok(ConvParams {
            kernel,
            strides: non_empty_or(n.ints("strides")?, vec![1; sp]),
            pads: non_empty_or(n.ints("pads")?, vec![0; 2 * sp]),
            dilations: non_empty_or(n.ints("dilations")?, vec![1; sp]),
            auto_pad: self.auto_pad()?,
        })
    }

    /// The `auto_pad` attribute.
    fn auto_pad(&self) -> R<AutoPad> {
        Ok(match self.n.s("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            a => return Err(self.n.invalid(format!("unknown auto_pad `{a}`"))),
        })
    }
}

/// A window's attributes ([`Tr::conv_params`]).
pub(super) struct ConvParams {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
    auto_pad: AutoPad,
}

/// The attribute's value unless absent or empty.
pub(super) fn non_empty_or(v: Option<Vec<i64>>, default: Vec<i64>) -> Vec<i64> {
    match v {
        Some(v) if !v.is_empty() => v,
        _ => default,
    }
}

/// Drops trailing absent operands.
pub(super) fn trim(mut ins: Vec<Option<ValueId>>) -> Vec<Option<ValueId>> {
    while matches!(ins.last(), Some(None)) {
        ins.pop();
    }
    ins
}

/// Normalises an axis when it is in range; per-tensor quantization ignores it otherwise.
pub(super) fn lenient_axis(axis: i64, rank: usize) -> i64 {
    norm_axis(axis, rank).unwrap_or(axis)
}
