//! The reference implementation of every op, one module per op family.
//!
//! Each family's `eval` receives the node's operands (absent optional ones are `None`) and
//! returns one entry per node result (entries for results the node does not use may be
//! `None`). Kernels favour obviously-correct code over speed: they are the oracle.

use crate::Tensor;
use rafter_ir::{Graph, Node, Op};

pub mod bitcast;
pub mod broadcast;
pub mod contraction;
pub mod control;
pub mod data;
pub mod detection;
pub mod elementwise;
mod fft;
pub mod image;
pub mod loss;
pub mod misc;
pub mod normalize;
pub mod qlinear;
pub mod recurrent;
pub mod reduce;
pub mod signal;
pub mod stateful;
pub mod weights;

/// Why an op could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpError {
    /// A capability the reference executor lacks (dtype, mode): reported, never a crash.
    Unsupported(String),
    /// The operands are invalid for the op (bad shapes, out-of-range indices, ...).
    Invalid(String),
}

/// Shorthand for an `Invalid` error.
pub fn invalid<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError::Invalid(msg.into()))
}

/// Shorthand for an `Unsupported` error.
pub fn unsupported<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError::Unsupported(msg.into()))
}

/// What an op may need beyond its operands: the node (how many results are used) and the
/// graph (subgraph execution, value types).
pub struct OpCtx<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
}

impl OpCtx<'_> {
    /// Number of result slots of the node.
    pub fn num_outputs(&self) -> usize {
        self.node.outputs.len()
    }

    /// Whether result `i` is used.
    pub fn wants(&self, i: usize) -> bool {
        matches!(self.node.outputs.get(i), Some(Some(_)))
    }

    /// The IR type of result `i`, if used.
    pub fn output_type(&self, i: usize) -> Option<&rafter_ir::TensorType> {
        self.node
            .outputs
            .get(i)
            .copied()
            .flatten()
            .map(|id| &self.graph.value(id).ty)
    }
}

/// The operand at `i`, or an `Invalid` error naming it when absent.
pub fn arg<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, OpError> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| OpError::Invalid(format!("operand {i} is missing")))
}

/// Evaluates one op.
pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    use Op::*;
    match op {
        Identity
        | Unary { .. }
        | Binary { .. }
        | Where
        | Clip
        | Cast { .. }
        | LeakyRelu { .. }
        | Elu { .. }
        | Selu { .. }
        | Celu { .. }
        | HardSigmoid { .. }
        | ThresholdedRelu { .. }
        | Shrink { .. }
        | Gelu { .. }
        | IsInf { .. } => elementwise::eval(op, inputs, ctx),
        Reduce { .. } | ArgReduce { .. } | Cumulative { .. } => reduce::eval(op, inputs, ctx),
        Softmax { .. }
        | LayerNorm { .. }
        | RmsNorm { .. }
        | GroupNorm { .. }
        | InstanceNorm { .. }
        | BatchNorm { .. }
        | LpNorm { .. }
        | Lrn { .. }
        | MeanVarianceNorm { .. } => normalize::eval(op, inputs, ctx),
        MatMul
        | Gemm { .. }
        | Conv { .. }
        | ConvNhwc { .. }
        | ConvTranspose { .. }
        | Einsum { .. }
        | MatMulInteger
        | MatMulBlockQuant { .. }
        | ConvInteger { .. }
        | QuantizeLinear { .. }
        | DequantizeLinear { .. }
        | DynamicQuantizeLinear
        | Attention { .. }
        | RotaryEmbedding { .. }
        | Pool { .. }
        | GlobalPool { .. }
        | MaxUnpool { .. } => contraction::eval(op, inputs, ctx),
        Reshape { .. }
        | Shape { .. }
        | Size
        | Transpose { .. }
        | Squeeze { .. }
        | Unsqueeze { .. }
        | Flatten { .. }
        | Concat { .. }
        | Split { .. }
        | Slice
        | Gather { .. }
        | GatherElements { .. }
        | GatherNd { .. }
        | ScatterElements { .. }
        | ScatterNd { .. }
        | Expand
        | Tile
        | Pad { .. }
        | ConstantOfShape { .. }
        | Range
        | OneHot { .. }
        | Trilu { .. }
        | TopK { .. }
        | NonZero
        | Compress { .. }
        | Unique { .. }
        | ReverseSequence { .. }
        | DepthToSpace { .. }
        | SpaceToDepth { .. }
        | EyeLike { .. } => data::eval(op, inputs, ctx),
        Resize { .. } | GridSample { .. } | NonMaxSuppression { .. } => {
            image::eval(op, inputs, ctx)
        }
        NllLoss { .. } | SoftmaxCrossEntropy { .. } => loss::eval(op, inputs, ctx),
        SwiGlu { .. }
        | Det
        | CenterCropPad { .. }
        | Col2Im { .. }
        | AffineGrid { .. }
        | TensorScatter { .. }
        | Binarizer { .. }
        | ArrayFeatureExtractor
        | LabelEncoder { .. } => misc::eval(op, inputs, ctx),
        Lstm { .. } | Gru { .. } | Rnn { .. } => recurrent::eval(op, inputs, ctx),
        If { .. } | Loop { .. } | Scan { .. } => control::eval(op, inputs, ctx),
        Dft { .. } | Stft { .. } | Window { .. } | MelWeightMatrix { .. } => {
            signal::eval(op, inputs, ctx)
        }
        RoiAlign { .. } | DeformConv { .. } => detection::eval(op, inputs, ctx),
        QLinearMatMul | QLinearConv { .. } => qlinear::eval(op, inputs, ctx),
        LinearAttention { .. } | CausalConvWithState { .. } => stateful::eval(op, inputs, ctx),
        BitCast { .. } => bitcast::eval(op, inputs, ctx),
        Linear { .. } | Embedding { .. } | MoeFfn { .. } => weights::eval(op, inputs, ctx),
    }
}
