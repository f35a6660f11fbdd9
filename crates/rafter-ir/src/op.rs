//! The closed set of graph ops.
//!
//! One op per concept, with typed attributes. Importers erase the differences between
//! source-format versions (an ONNX Slice-1 with attributes and a Slice-13 with inputs are the
//! same `slice`), fold variadic forms into binary chains (Sum, Max, Mean), and drop
//! inference no-ops (Dropout). Operands are positional; optional ones may be absent
//! (`None` in [`crate::Node::inputs`]). Axes stored in attributes are non-negative unless
//! the op's doc says otherwise (some are resolved against a rank that is only known at run
//! time, e.g. `squeeze` with no axes).

use crate::attr::{AttrType, AttrValue, Scalar};
use crate::{attr_enum, DType, Graph, WeightFormat};

attr_enum! {
    /// Elementwise functions of one operand.
    UnaryOp {
        Abs => "abs", Neg => "neg", Sqrt => "sqrt", Exp => "exp", Log => "log",
        Reciprocal => "reciprocal", Floor => "floor", Ceil => "ceil",
        /// Rounds half to even, as ONNX Round does.
        Round => "round",
        Sign => "sign", Sin => "sin", Cos => "cos", Tan => "tan", Asin => "asin",
        Acos => "acos", Atan => "atan", Sinh => "sinh", Cosh => "cosh", Tanh => "tanh",
        Asinh => "asinh", Acosh => "acosh", Atanh => "atanh", Erf => "erf",
        Sigmoid => "sigmoid", Relu => "relu",
        /// Logical not of a bool tensor.
        Not => "not",
        BitwiseNot => "bitwise_not",
        /// Output is bool.
        IsNaN => "is_nan",
        Softplus => "softplus", Softsign => "softsign", Mish => "mish",
        HardSwish => "hard_swish",
    }
}

attr_enum! {
    /// Elementwise functions of two operands, with NumPy broadcasting.
    BinaryOp {
        Add => "add", Sub => "sub", Mul => "mul",
        /// Integer division truncates toward zero, as ONNX Div does.
        Div => "div",
        Pow => "pow",
        /// Integer remainder with the sign of the divisor (Python `%`, ONNX Mod fmod=0).
        Mod => "mod",
        /// Remainder with the sign of the dividend (C fmod, ONNX Mod fmod=1).
        FMod => "fmod",
        Max => "max", Min => "min",
        /// Comparisons produce bool.
        Equal => "equal", Less => "less", LessOrEqual => "less_equal",
        Greater => "greater", GreaterOrEqual => "greater_equal",
        /// Logical ops on bool.
        And => "and", Or => "or", Xor => "xor",
        BitAnd => "bit_and", BitOr => "bit_or", BitXor => "bit_xor",
        ShiftLeft => "shift_left", ShiftRight => "shift_right",
        /// `x < 0 ? slope * x : x`, slope broadcast to x.
        PRelu => "prelu",
    }
}

attr_enum! {
    /// Reductions over a set of axes.
    ReduceKind {
        Sum => "sum", Mean => "mean", Max => "max", Min => "min", Prod => "prod",
        L1 => "l1", L2 => "l2", LogSum => "log_sum", LogSumExp => "log_sum_exp",
        SumSquare => "sum_square",
    }
}

attr_enum! {
    ArgKind { Max => "max", Min => "min" }
}

attr_enum! {
    /// Softmax-like normalisations along one axis.
    SoftmaxKind { Softmax => "softmax", LogSoftmax => "log_softmax", Hardmax => "hardmax" }
}

attr_enum! {
    CumKind { Sum => "sum", Prod => "prod" }
}

attr_enum! {
    PoolKind { Max => "max", Average => "average", Lp => "lp" }
}

attr_enum! {
    /// How convolution and pooling derive padding when pads are not explicit.
    AutoPad { NotSet => "explicit", SameUpper => "same_upper", SameLower => "same_lower", Valid => "valid" }
}

attr_enum! {
    PadMode { Constant => "constant", Reflect => "reflect", Edge => "edge", Wrap => "wrap" }
}

attr_enum! {
    GeluApprox { None => "none", Tanh => "tanh" }
}

attr_enum! {
    ScatterReduction { None => "none", Add => "add", Mul => "mul", Max => "max", Min => "min" }
}

attr_enum! {
    ResizeMode { Nearest => "nearest", Linear => "linear", Cubic => "cubic" }
}

attr_enum! {
    /// How an output coordinate maps back to an input coordinate in `resize`.
    CoordTransform {
        HalfPixel => "half_pixel", HalfPixelSymmetric => "half_pixel_symmetric",
        PytorchHalfPixel => "pytorch_half_pixel", AlignCorners => "align_corners",
        Asymmetric => "asymmetric", TfCropAndResize => "tf_crop_and_resize",
    }
}

attr_enum! {
    NearestMode {
        RoundPreferFloor => "round_prefer_floor", RoundPreferCeil => "round_prefer_ceil",
        Floor => "floor", Ceil => "ceil",
    }
}

attr_enum! {
    AspectPolicy { Stretch => "stretch", NotLarger => "not_larger", NotSmaller => "not_smaller" }
}

attr_enum! {
    DepthToSpaceMode { Dcr => "dcr", Crd => "crd" }
}

attr_enum! {
    GridSampleMode { Linear => "linear", Nearest => "nearest", Cubic => "cubic" }
}

attr_enum! {
    GridPadding { Zeros => "zeros", Border => "border", Reflection => "reflection" }
}

attr_enum! {
    RnnDirection { Forward => "forward", Reverse => "reverse", Bidirectional => "bidirectional" }
}

attr_enum! {
    /// The cosine-sum window of `window`.
    WindowKind { Hann => "hann", Hamming => "hamming", Blackman => "blackman" }
}

attr_enum! {
    /// How `roi_align` pools the samples of one bin.
    RoiPoolMode { Avg => "avg", Max => "max" }
}

attr_enum! {
    /// The recurrence of `linear_attention` (ONNX LinearAttention's `update_rule`).
    LinearAttnRule {
        Linear => "linear", Gated => "gated", Delta => "delta", GatedDelta => "gated_delta",
    }
}

attr_enum! {
    /// The gate activation of a gated feed-forward block (`moe_ffn`): SiLU (Llama, Qwen) or
    /// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`).
    FfnActivation { Silu => "silu", GeluTanh => "gelu_tanh" }
}

attr_enum! {
    /// How a loss combines its per-element values: kept as they are, summed, or averaged
    /// (a weighted average when the loss has weights or ignores some targets).
    LossReduction { None => "none", Sum => "sum", Mean => "mean" }
}

attr_enum! {
    /// Where `tensor_scatter` writes past the end of the cache axis: nowhere (an error) or
    /// wrapping around to its start.
    TensorScatterMode { Linear => "linear", Circular => "circular" }
}

/// Declares the op enum with its text-format names and the generic attribute view.
macro_rules! define_ops {
    ($(
        $(#[$meta:meta])*
        $variant:ident $word:literal $({ $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? })?
    ),* $(,)?) => {
        /// A graph op. See the module docs for conventions.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Op {
            $( $(#[$meta])* $variant $({ $($(#[$fmeta])* $field: $ty),* })? ),*
        }

        impl Op {
            /// Every op name of the text format.
            pub const NAMES: &'static [&'static str] = &[$($word),*];

            /// The op's name in the text format.
            pub fn name(&self) -> &'static str {
                match self { $( Op::$variant { .. } => $word ),* }
            }

            /// The attributes as (name, value) pairs, in declaration order.
            #[allow(unused_variables)]
            pub fn attrs(&self) -> Vec<(&'static str, AttrValue)> {
                match self {
                    $( Op::$variant $({ $($field),* })? => vec![
                        $($( (stringify!($field), AttrType::to_attr($field)) ),*)?
                    ] ),*
                }
            }

            /// Builds an op from its name and attributes. `take` is asked for each field by
            /// name and returns `AttrValue::None` for absent ones.
            #[allow(unused_mut, unused_variables)]
            pub fn from_parts(
                name: &str,
                mut take: impl FnMut(&'static str) -> AttrValue,
            ) -> Result<Op, String> {
                match name {
                    $( $word => Ok(Op::$variant $({ $(
                        $field: AttrType::from_attr(take(stringify!($field)))
                            .map_err(|e| format!("attribute `{}` of `{}`: {e}", stringify!($field), $word))?
                    ),* })? ), )*
                    other => Err(format!("unknown op `{other}`")),
                }
            }
        }
    };
}

define_ops! {
    // ---- elementwise ----
    /// Operand: x. Output: x unchanged (kept for graph outputs that alias inputs).
    Identity "identity",
    Unary "unary" { op: UnaryOp },
    /// Operands: a, b (broadcast).
    Binary "binary" { op: BinaryOp },
    /// Operands: cond (bool), x, y (broadcast). `cond ? x : y`.
    Where "where",
    /// Operands: x, min?, max? (scalars).
    Clip "clip",
    /// Operand: x. Converts to `to` (floats to ints truncate toward zero).
    Cast "cast" { to: DType },
    LeakyRelu "leaky_relu" { alpha: f32 },
    Elu "elu" { alpha: f32 },
    Selu "selu" { alpha: f32, gamma: f32 },
    Celu "celu" { alpha: f32 },
    /// `max(0, min(1, alpha*x + beta))`.
    HardSigmoid "hard_sigmoid" { alpha: f32, beta: f32 },
    ThresholdedRelu "thresholded_relu" { alpha: f32 },
    Shrink "shrink" { bias: f32, lambd: f32 },
    Gelu "gelu" { approximate: GeluApprox },
    /// Output bool.
    IsInf "is_inf" { detect_negative: bool, detect_positive: bool },

    // ---- reductions and normalisations ----
    /// Operands: x, axes? (i64 1-D). With the `axes` operand the axes are known only at run
    /// time (negative ones resolved against x's rank) and the `axes` attribute must be
    /// empty; without it the attribute holds them. Empty axes reduce every axis, unless
    /// `noop_with_empty_axes`, which makes the op the identity.
    Reduce "reduce" {
        kind: ReduceKind, axes: Vec<i64>, keep_dims: bool, noop_with_empty_axes: bool,
    },
    /// Operand: x. Output i64 indices.
    ArgReduce "arg_reduce" { kind: ArgKind, axis: i64, keep_dims: bool, select_last_index: bool },
    /// Operands: x, axis (scalar int).
    Cumulative "cumulative" { kind: CumKind, exclusive: bool, reverse: bool },
    /// Operand: x. Normalises along one axis (ONNX opset >= 13 semantics).
    Softmax "softmax" { kind: SoftmaxKind, axis: i64 },
    /// Operands: x, scale, bias?. Normalises over axes `axis..rank`. Outputs: y, mean?, inv_std_dev?.
    LayerNorm "layer_norm" { axis: i64, epsilon: f32 },
    /// Operands: x, scale. Normalises over axes `axis..rank`.
    RmsNorm "rms_norm" { axis: i64, epsilon: f32 },
    /// Operands: x, scale, bias (per group or per channel as ONNX opset 21).
    GroupNorm "group_norm" { num_groups: i64, epsilon: f32 },
    /// Operands: x, scale, bias (per channel).
    InstanceNorm "instance_norm" { epsilon: f32 },
    /// Inference batch norm. Operands: x, scale, bias, mean, var.
    BatchNorm "batch_norm" { epsilon: f32 },
    /// Operand: x. Lp-normalises along `axis`.
    LpNorm "lp_norm" { axis: i64, p: i64 },
    /// Local response normalisation across channels.
    Lrn "lrn" { alpha: f32, beta: f32, bias: f32, size: i64 },
    MeanVarianceNorm "mean_variance_norm" { axes: Vec<i64> },

    // ---- contractions ----
    /// Operands: a, b with NumPy matmul semantics (batched, broadcast, 1-D promotion).
    MatMul "matmul",
    /// Operands: a, b, c?. `alpha * op(a) @ op(b) + beta * c`.
    Gemm "gemm" { alpha: f32, beta: f32, trans_a: bool, trans_b: bool },
    /// Operands: x [N, C, spatial...], w [M, C/group, kernel...], b? [M].
    /// `pads` holds all begins then all ends; `kernel_shape` may be empty (taken from w).
    Conv "conv" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, auto_pad: AutoPad,
    },
    /// Conv with channels last, the layout rafter's CPU convolution kernels read:
    /// x [N, spatial..., C], w [kernel..., C/group, M], b? [M]; result [N, spatial..., M].
    /// Attributes as `conv`. The compiler's layout pass (`rafter_opt::layout`) rewrites CPU
    /// convolutions into it; importers never produce it.
    ConvNhwc "conv_nhwc" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, auto_pad: AutoPad,
    },
    /// Operands: x, w [C, M/group, kernel...], b?.
    ConvTranspose "conv_transpose" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, auto_pad: AutoPad, output_padding: Vec<i64>, output_shape: Vec<i64>,
    },
    /// A linear layer over a weight in any [`WeightFormat`]. Operands: x [..., K] (f32),
    /// w, bias? [N] (f32). Result f32 [..., N] = x · dequant(w)ᵀ (+ bias). `w` is [N, K] of
    /// the format's dtype for f32/f16/bf16, or `u8` [N, K / block_elems * block_bytes] of
    /// raw ggml blocks: the weight stays encoded and is decoded where it is read.
    Linear "linear" { format: WeightFormat },
    /// Rows of a table in any [`WeightFormat`] (a token embedding). Operands: table [V, H]
    /// stored as for `linear`'s weight, ids (i32/i64, any shape; each in `0..V`). Result f32
    /// [ids..., H]. An id outside the table is an error.
    Embedding "embedding" { format: WeightFormat },
    /// A mixture-of-experts gated feed-forward block (Qwen3-MoE, Mixtral). Operands:
    /// x [T, H] (f32), router_logits [T, E] (f32), gate [E, F, H], up [E, F, H],
    /// down [E, H, F] (each in its format, stored per expert as `linear`'s weight).
    /// Per token: p = softmax(router_logits) in f32; the `top_k` largest p (ties to the
    /// lower expert index), divided by their sum when `normalize`; the result is
    /// `Σ p_e · down_e(act(gate_e · x) ⊙ (up_e · x))` over the chosen experts. Only the
    /// chosen experts' weights are read. Result f32 [T, H].
    MoeFfn "moe_ffn" {
        top_k: i64, normalize: bool, activation: FfnActivation,
        gate_format: WeightFormat, up_format: WeightFormat, down_format: WeightFormat,
    },
    /// Operands: the einsum's inputs.
    Einsum "einsum" { equation: String },
    /// Operands: a, b, a_zero_point?, b_zero_point?. Output i32.
    MatMulInteger "matmul_integer",
    /// A matmul with block-quantized weights kept packed (ONNX Runtime's MatMulNBits
    /// layout), so a call streams `bits`-bit weights instead of a float matrix.
    /// Operands: a [..., k] (f32), b (u8 [n, k_blocks, block_size * bits / 8]: row `j`'s
    /// blocks of `block_size` elements along k, packed low bits first), scales (f32,
    /// n * k_blocks), zero_points? (u8, each row's k_blocks zero points packed the same
    /// way; absent: 2^(bits-1)), bias? [n]. Output [..., n]:
    /// `a @ ((b - zero_point) * scale)^T + bias`. `k_blocks = ceil(k / block_size)`.
    /// `accuracy_level` is ORT's: 4 first rounds each block of `a` to int8 with an f32 scale
    /// `max|a| / 127` (ties to even), as ORT's CPU kernel does then; any other value
    /// multiplies `a` unrounded.
    MatMulBlockQuant "matmul_block_quant" { k: i64, n: i64, bits: i64, block_size: i64, accuracy_level: i64 },
    /// Operands: x, w, x_zero_point?, w_zero_point?. Output i32.
    ConvInteger "conv_integer" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, auto_pad: AutoPad,
    },
    /// Operands: x, y_scale, y_zero_point?. `axis` is resolved against x's rank.
    QuantizeLinear "quantize_linear" { axis: i64, block_size: i64, output_dtype: DType },
    /// Operands: x, x_scale, x_zero_point?.
    DequantizeLinear "dequantize_linear" { axis: i64, block_size: i64 },
    /// Operand: x (f32). Outputs: y (u8), scale, zero point.
    DynamicQuantizeLinear "dynamic_quantize_linear",
    /// ONNX Attention (opset 23). Operands: q, k, v, attn_mask?, past_key?, past_value?,
    /// nonpad_kv_seqlen?. Outputs: y, present_key?, present_value?, qk_matmul_output?.
    /// One extension: with an f32 `q`, `k` and `v` (and the pasts) may be f16 or bf16, read
    /// as if cast to f32 first (exact), so an LLM's KV cache can be stored narrow and read
    /// in place rather than widened into a copy every call.
    Attention "attention" {
        is_causal: bool, kv_num_heads: i64, q_num_heads: i64, qk_matmul_output_mode: i64,
        scale: Option<f32>, softcap: f32,
        /// Attention-25 sliding window: a query at absolute position `p` sees keys
        /// `p - left_window_size ..= p + right_window_size`; -1 leaves that side unbounded.
        left_window_size: i64, right_window_size: i64,
    },
    /// Operands: x, cos_cache, sin_cache, position_ids?.
    RotaryEmbedding "rotary_embedding" { interleaved: bool, num_heads: i64, rotary_embedding_dim: i64 },

    // ---- pooling ----
    /// Operand: x [N, C, spatial...]. Outputs: y, indices? (max only).
    Pool "pool" {
        kind: PoolKind, kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>,
        dilations: Vec<i64>, auto_pad: AutoPad, ceil_mode: bool, count_include_pad: bool,
        p: i64, storage_order: i64,
    },
    /// Operand: x. Pools every spatial dim to 1.
    GlobalPool "global_pool" { kind: PoolKind, p: i64 },
    /// Operands: x, indices, output_shape?.
    MaxUnpool "max_unpool" { kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64> },

    // ---- shapes and data movement ----
    /// Operands: data, shape (i64). A 0 copies the input dim unless `allow_zero`; -1 infers.
    Reshape "reshape" { allow_zero: bool },
    /// Operand: x. Output i64 [end - start] holding dims `start..end` (negative counts from the end).
    Shape "shape" { start: i64, end: Option<i64> },
    /// Operand: x. Output i64 scalar element count.
    Size "size",
    Transpose "transpose" { perm: Vec<i64> },
    /// Operands: x, axes? (i64 1-D). Empty axes remove every dim of size 1. With the `axes`
    /// operand the axes are known only at run time (negative ones resolved against x's
    /// rank) and the `axes` attribute must be empty; without it the attribute holds them.
    Squeeze "squeeze" { axes: Vec<i64> },
    /// Operands: x, axes? (i64 1-D). `axes` index the output (attribute: non-negative).
    /// With the `axes` operand the axes are known only at run time (negative ones resolved
    /// against the output rank) and the `axes` attribute must be empty; without it the
    /// attribute holds them.
    Unsqueeze "unsqueeze" { axes: Vec<i64> },
    /// Operand: x. Output 2-D [prod(dims[..axis]), prod(dims[axis..])].
    Flatten "flatten" { axis: i64 },
    Concat "concat" { axis: i64 },
    /// Operands: x, split? (i64 sizes). Without sizes the axis is split into as many equal
    /// parts as there are outputs (the last one smaller when it does not divide).
    Split "split" { axis: i64 },
    /// Operands: data, starts, ends, axes?, steps?.
    Slice "slice",
    /// Operands: data, indices (negative indices count from the end).
    Gather "gather" { axis: i64 },
    GatherElements "gather_elements" { axis: i64 },
    GatherNd "gather_nd" { batch_dims: i64 },
    /// Operands: data, indices, updates.
    ScatterElements "scatter_elements" { axis: i64, reduction: ScatterReduction },
    ScatterNd "scatter_nd" { reduction: ScatterReduction },
    /// Operands: data, shape (broadcast to).
    Expand "expand",
    /// Operands: data, repeats.
    Tile "tile",
    /// Operands: data, pads (i64, begins then ends), constant_value?, axes?.
    Pad "pad" { mode: PadMode },
    /// Operand: shape (i64 1-D).
    ConstantOfShape "constant_of_shape" { value: Scalar },
    /// Operands: start, limit, delta (scalars).
    Range "range",
    /// Operands: indices, depth, values [off, on].
    OneHot "one_hot" { axis: i64 },
    /// Operands: x, k?.
    Trilu "trilu" { upper: bool },
    /// Operands: x, k (i64 [1]). Outputs: values, indices.
    TopK "top_k" { axis: i64, largest: bool, sorted: bool },
    /// Operand: x. Output i64 [rank, nnz].
    NonZero "non_zero",
    /// Operands: x, condition (bool 1-D). No axis: flattens first.
    Compress "compress" { axis: Option<i64> },
    /// Operand: x. Outputs: y, indices?, inverse_indices?, counts?.
    Unique "unique" { axis: Option<i64>, sorted: bool },
    /// Operands: x, sequence_lens.
    ReverseSequence "reverse_sequence" { batch_axis: i64, time_axis: i64 },
    DepthToSpace "depth_to_space" { blocksize: i64, mode: DepthToSpaceMode },
    SpaceToDepth "space_to_depth" { blocksize: i64 },
    /// Operand: x (2-D). Output dtype `dtype`, ones on diagonal `k`.
    EyeLike "eye_like" { dtype: DType, k: i64 },
    /// Operands: x, roi?, scales?, sizes?.
    Resize "resize" {
        mode: ResizeMode, coordinate_transformation_mode: CoordTransform,
        nearest_mode: NearestMode, cubic_coeff_a: f32, exclude_outside: bool,
        extrapolation_value: f32, antialias: bool, axes: Vec<i64>,
        keep_aspect_ratio_policy: AspectPolicy,
    },
    /// Operands: x, grid.
    GridSample "grid_sample" { mode: GridSampleMode, padding_mode: GridPadding, align_corners: bool },
    /// Operands: boxes, scores, max_output_boxes_per_class?, iou_threshold?, score_threshold?.
    NonMaxSuppression "non_max_suppression" { center_point_box: i64 },

    // ---- losses ----
    /// ONNX NegativeLogLikelihoodLoss. Operands: input [N, C, d...] (float), target
    /// [N, d...] (i32 or i64), weight? [C]. `loss[n, d] = -input[n, target[n, d], d] *
    /// weight[target[n, d]]` (weight 1 without the operand), 0 where the target equals
    /// `ignore_index`. Output: the losses (shape of target) for `none`, else a scalar: their
    /// sum, or for `mean` the sum divided by the sum of the weights applied.
    NllLoss "nll_loss" { reduction: LossReduction, ignore_index: Option<i64> },
    /// ONNX SoftmaxCrossEntropyLoss: `nll_loss` of the log-softmax of scores over axis 1.
    /// Operands: scores [N, C, d...], labels [N, d...] (i32 or i64), weights? [C].
    /// Outputs: loss (as `nll_loss`), log_prob? (the log-softmax, shape of scores).
    SoftmaxCrossEntropy "softmax_cross_entropy" { reduction: LossReduction, ignore_index: Option<i64> },

    // ---- miscellany ----
    /// Operands: a, b (same shape and dtype, no broadcasting). `a * sigmoid(alpha * a) * b`.
    SwiGlu "swiglu" { alpha: f32 },
    /// Operand: x [..., M, M]. Output [...]: the determinant of each matrix.
    Det "det",
    /// Operands: x, shape (i32/i64 1-D, one size per axis of `axes`). Crops each axis in
    /// `axes` to its size around the centre, or zero-pads it around the centre, as ONNX
    /// CenterCropPad (an odd difference leaves the extra element at the end). `axes` are
    /// non-negative; empty means every axis.
    CenterCropPad "center_crop_pad" { axes: Vec<i64> },
    /// Operands: input [N, C * prod(block_shape), L], image_shape (i64 [S]), block_shape
    /// (i64 [S]). Output [N, C, image_shape...]: the sliding blocks summed back into the
    /// image (the inverse of im2col). `pads` holds all begins then all ends; empty
    /// `dilations`, `pads` or `strides` mean 1s, 0s and 1s.
    Col2Im "col2im" { dilations: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> },
    /// Operands: theta [N, 2, 3] or [N, 3, 4], size (i64 [4]: N, C, H, W, or [5]: N, C, D,
    /// H, W). Output [N, H, W, 2] or [N, D, H, W, 3]: theta applied to the normalised
    /// coordinates (x, y[, z], 1) of each output point.
    AffineGrid "affine_grid" { align_corners: bool },
    /// Operands: past_cache, update, write_indices? (i64 [batch], zeros when absent).
    /// Output: past_cache with `update` written along `axis` (non-negative; every other
    /// dim equal) from `write_indices[b]` on, for every batch index b of axis 0.
    TensorScatter "tensor_scatter" { axis: i64, mode: TensorScatterMode },

    // ---- ai.onnx.ml ----
    /// Operand: x (float or int). `x > threshold ? 1 : 0` in x's dtype.
    Binarizer "binarizer" { threshold: f32 },
    /// Operands: x, indices (i64; negative count from the end). Gathers along x's last
    /// axis with the indices flattened: output [x.dims[..-1]..., len], or [1, len] for a
    /// 1-D x.
    ArrayFeatureExtractor "array_feature_extractor",
    /// Operand: x (integer or float). Maps each element equal to `keys[i]` to `values[i]`
    /// and every other element to `default`, whose dtype is the output's. The keys are
    /// `int_keys` for integer x and `float_keys` for float x; the values `int_values` for an
    /// integer output and `float_values` for a float one.
    LabelEncoder "label_encoder" {
        int_keys: Vec<i64>, float_keys: Vec<f64>, int_values: Vec<i64>, float_values: Vec<f64>,
        default: Scalar,
    },

    // ---- recurrent ----
    /// Operands: x, w, r, b?, sequence_lens?, initial_h?, (initial_c?, p? for lstm).
    /// Outputs: y?, y_h?, (y_c? for lstm).
    Lstm "lstm" { direction: RnnDirection, hidden_size: i64, layout: i64, input_forget: bool, clip: Option<f32>, activations: Vec<i64>, activation_alpha: Vec<f32>, activation_beta: Vec<f32> },
    Gru "gru" { direction: RnnDirection, hidden_size: i64, layout: i64, linear_before_reset: bool, clip: Option<f32>, activations: Vec<i64>, activation_alpha: Vec<f32>, activation_beta: Vec<f32> },
    Rnn "rnn" { direction: RnnDirection, hidden_size: i64, layout: i64, clip: Option<f32>, activations: Vec<i64>, activation_alpha: Vec<f32>, activation_beta: Vec<f32> },

    // ---- signal processing ----
    /// Operands: x [..., 1 or 2] (real, or complex as (re, im) in the last dim),
    /// dft_length? (int scalar), axis? (int scalar, only when the `axis` attribute is
    /// `None`; negative counts from the end of x's full rank). Transforms along `axis`
    /// (never the last dim) after zero-padding or truncating it to dft_length. Forward:
    /// output [..., 2], `onesided` keeps bins `0..=len/2`. Inverse (scaled by 1/len):
    /// output [..., 2], or with `onesided` the one-sided spectrum's real signal [..., 1].
    Dft "dft" { axis: Option<i64>, inverse: bool, onesided: bool },
    /// Operands: signal [batch, len, 1 or 2], frame_step (int scalar), window? [frame_len],
    /// frame_length? (int scalar). Output [batch, frames, bins, 2] with
    /// `frames = 1 + (len - frame_len) / frame_step`.
    Stft "stft" { onesided: bool },
    /// Operand: size (int scalar). Output 1-D [size] of `dtype`; a `periodic` window has
    /// period `size`, a symmetric one `size - 1`.
    Window "window" { kind: WindowKind, periodic: bool, dtype: DType },
    /// Operands: num_mel_bins, dft_length, sample_rate (int scalars), lower_edge_hertz,
    /// upper_edge_hertz (float scalars). Output [dft_length / 2 + 1, num_mel_bins] of `dtype`.
    MelWeightMatrix "mel_weight_matrix" { dtype: DType },

    // ---- detection and deformable convolution ----
    /// Operands: x [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R].
    /// Output [R, C, output_height, output_width]. `half_pixel` shifts roi coordinates by
    /// -0.5 (ONNX's `half_pixel` mode; opset 10 behaves as `output_half_pixel`).
    RoiAlign "roi_align" {
        mode: RoiPoolMode, half_pixel: bool, output_height: i64, output_width: i64,
        sampling_ratio: i64, spatial_scale: f32,
    },
    /// Operands: x [N, C, H, W], w [M, C/group, kH, kW], offset [N, offset_group*kH*kW*2,
    /// oH, oW], b? [M], mask? [N, offset_group*kH*kW, oH, oW]. 2-D only; `kernel_shape`
    /// may be empty (taken from w); `pads` holds begins then ends.
    DeformConv "deform_conv" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, offset_group: i64,
    },

    // ---- quantized contractions ----
    /// Operands: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point
    /// (u8/i8; scales per tensor or per row of a / column of b). Output: y_zero_point's dtype.
    QLinearMatMul "qlinear_matmul",
    /// Operands: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
    /// b? (i32). Conv attributes as `conv`; w_scale and w_zero_point per tensor or per
    /// output channel. Output: y_zero_point's dtype.
    QLinearConv "qlinear_conv" {
        kernel_shape: Vec<i64>, strides: Vec<i64>, pads: Vec<i64>, dilations: Vec<i64>,
        group: i64, auto_pad: AutoPad,
    },

    // ---- stateful sequence ops ----
    /// ONNX LinearAttention. Operands: query [B, T, Hq*dk], key [B, T, Hkv*dk], value
    /// [B, T, Hkv*dv], past_state? [B, Hkv, dk, dv], decay? [B, T, Hkv or Hkv*dk] (log
    /// space; gated rules only), beta? [B, T, Hkv or 1] (delta rules only). Outputs:
    /// output [B, T, Hq*dv], present_state [B, Hkv, dk, dv]. `scale` `None` is 1/sqrt(dk).
    LinearAttention "linear_attention" {
        q_num_heads: i64, kv_num_heads: i64, scale: Option<f32>, update_rule: LinearAttnRule,
    },
    /// Causal depthwise 1-D convolution with carried state. Operands: x [B, C, L],
    /// w [C, 1, k], bias? [C], past_state? [B, C, k-1] (zeros when absent). Outputs:
    /// y [B, C, L] (SiLU applied when `silu`), present_state [B, C, k-1] (the last k-1
    /// positions of past_state ++ x).
    CausalConvWithState "causal_conv_with_state" { silu: bool },

    // ---- reinterpretation ----
    /// Operand: x. Reinterprets each element's bytes as `to` (same element size).
    BitCast "bit_cast" { to: DType },

    // ---- control flow (subgraphs capture outer values as explicit operands) ----
    /// Operands: cond, captures... The branches take the captures as inputs, in order.
    If "if" { then_branch: Box<Graph>, else_branch: Box<Graph> },
    /// Operands: max_trip_count?, cond?, loop-carried..., captures...
    /// Body inputs: iteration (i64 scalar), cond (bool scalar), loop-carried..., captures...
    /// Body outputs: cond, loop-carried..., scan outputs...
    Loop "loop" { body: Box<Graph> },
    /// Operands: state..., scan inputs..., captures... Body inputs: state..., scan slices...,
    /// captures... Body outputs: state..., scan output slices...
    Scan "scan" {
        body: Box<Graph>, num_scan_inputs: i64, num_captures: i64,
        scan_input_axes: Vec<i64>, scan_input_directions: Vec<i64>,
        scan_output_axes: Vec<i64>, scan_output_directions: Vec<i64>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for n in Op::NAMES {
            assert!(seen.insert(n), "duplicate op name {n}");
        }
    }

    #[test]
    fn attrs_round_trip_through_parts() {
        let op = Op::Conv {
            kernel_shape: vec![3, 3],
            strides: vec![1, 2],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group: 1,
            auto_pad: AutoPad::NotSet,
        };
        let mut map: HashMap<&str, AttrValue> = op.attrs().into_iter().collect();
        let back = Op::from_parts("conv", |k| map.remove(k).unwrap_or(AttrValue::None)).unwrap();
        assert_eq!(back, op);
        let err = Op::from_parts("conv", |_| AttrValue::None).unwrap_err();
        assert!(err.contains("kernel_shape"), "{err}");
        assert_eq!(
            Op::from_parts("relu6", |_| AttrValue::None).unwrap_err(),
            "unknown op `relu6`"
        );
        assert_eq!(
            Op::from_parts("matmul", |_| AttrValue::None).unwrap(),
            Op::MatMul
        );
    }
}
