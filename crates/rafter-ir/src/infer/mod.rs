//! Shape and dtype inference with symbolic dims.
//!
//! Given an op and what is known of its operands (types, and for small integer tensors
//! their element values as [`Dim`]s), computes the result types and, where the result is
//! shape arithmetic, its element values. This is what keeps `seq` symbolic through
//! Shape → Gather → Unsqueeze → Concat → Reshape in exported models, so one import serves
//! every sequence length.
//!
//! Conventions:
//! - Semantics are ONNX's (latest opset), as normalised by [`Op`]'s docs.
//! - A dim that cannot be expressed as a polynomial of the operands' dims (data-dependent
//!   sizes, floor divisions of symbols, values that are not known) is a fresh symbol from
//!   the caller's [`Fresh`], named after the op.
//! - Symbols stand for sizes, so they are taken to be non-negative: `seq + 2 >= 2`.
//!   Slice bounds `>= 2^31 - 1` (or `<= -(2^31 - 1)`) mean "to the end" of a symbolic dim.
//! - Element values (`syms`) are given for integer and bool results of at most 1024
//!   elements, row-major, whatever their rank (Flatten of a shape vector is 2-D), and are
//!   read the same way from operands: [`InferInput::sym`] first, then integer constants.
//! - Malformed nodes (bad axes, rank mismatches, incompatible broadcasts, negative dims,
//!   missing operands) give an `Err` naming the problem; inference never panics, and
//!   arithmetic that would overflow `i64` is an error too.
//! - A result whose *rank* would depend on run-time values (squeeze without axes of a
//!   data-dependent dim, If branches of different ranks) cannot be typed in this IR, whose
//!   ranks are static; such errors start with [`DATA_DEPENDENT_RANK`] so that importers can
//!   report them as unsupported models rather than malformed ones.

mod arith;

/// Prefix of inference errors for results whose rank depends on run-time values.
pub const DATA_DEPENDENT_RANK: &str = "data-dependent rank";
mod control;
mod cx;
mod elementwise;
mod fused;
mod linalg;
mod llm;
mod misc;
mod nn;
mod shape;
mod signal;
#[cfg(test)]
mod tests;

use crate::{ConstData, Dim, Op, TensorType};
use cx::{Cx, MAX_SYM, R};

/// What is known of one operand at compile time.
#[derive(Clone, Copy, Debug)]
pub struct InferInput<'a> {
    pub ty: &'a TensorType,
    /// The elements (row-major) as dims, when the operand is a 0-D or 1-D integer tensor
    /// whose values are known symbolically (integer constants, shape arithmetic).
    pub sym: Option<&'a [Dim]>,
    /// The data when the operand is a constant (float scales, pad values, ...).
    pub konst: Option<&'a ConstData>,
}

/// Starts the error of an op whose result rank depends on axes known only at run time
/// (e.g. Squeeze with an axes operand of unknown length). Importers report such nodes as
/// unsupported rather than malformed.
pub const RUNTIME_AXES_RANK: &str = "rank depends on run-time axes";

/// Inference results for one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// One type per requested result.
    pub types: Vec<TensorType>,
    /// Symbolic element values per result, where known.
    pub syms: Vec<Option<Vec<Dim>>>,
}

/// Makes a fresh symbol for a dim inference cannot express (data-dependent sizes,
/// non-exact divisions). The argument is a hint for the name (e.g. the op name).
pub type Fresh<'a> = dyn FnMut(&str) -> Dim + 'a;

/// Infers the types of a node's `num_outputs` results.
///
/// Errors name the problem (rank mismatch, incompatible broadcast, bad axis); the caller
/// adds the node's name and op.
pub fn infer_node(
    op: &Op,
    inputs: &[Option<InferInput<'_>>],
    num_outputs: usize,
    fresh: &mut Fresh<'_>,
) -> Result<Inferred, String> {
    let mut cx = Cx::new(op, inputs, num_outputs, fresh)?;
    let results = dispatch(&mut cx)?;
    if num_outputs > results.len() {
        return Err(format!(
            "has {} result(s), {num_outputs} requested",
            results.len()
        ));
    }
    let mut types = Vec::with_capacity(num_outputs);
    let mut syms = Vec::with_capacity(num_outputs);
    for (i, r) in results.into_iter().take(num_outputs).enumerate() {
        if let Some(d) =
            r.ty.dims
                .iter()
                .find(|d| d.as_known().is_some_and(|v| v < 0))
        {
            return Err(format!("result {i} would have negative dim {d}"));
        }
        let fits =
            cx::valued(r.ty.dtype) && cx::elem_count(&r.ty.dims).is_some_and(|n| n <= MAX_SYM);
        let sym = r
            .sym
            .filter(|s| fits && cx::elem_count(&r.ty.dims) == Some(s.len()));
        types.push(r.ty);
        syms.push(sym);
    }
    Ok(Inferred { types, syms })
}

fn dispatch(cx: &mut Cx<'_, '_, '_>) -> R {
    use elementwise as ew;
    match cx.op {
        Op::Identity => ew::identity(cx),
        Op::Unary { op } => ew::unary(cx, *op),
        Op::Binary { op } => ew::binary(cx, *op),
        Op::Where => ew::where_(cx),
        Op::Clip => ew::clip(cx),
        Op::Cast { to } => ew::cast(cx, *to),
        Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Selu { .. }
        | Op::Celu { .. }
        | Op::HardSigmoid { .. }
        | Op::ThresholdedRelu { .. }
        | Op::Shrink { .. }
        | Op::Gelu { .. } => ew::same(cx, 1, 1),
        Op::IsInf { .. } => ew::is_inf(cx),

        Op::Reduce {
            kind,
            axes,
            keep_dims,
            noop_with_empty_axes,
        } => nn::reduce(cx, *kind, axes, *keep_dims, *noop_with_empty_axes),
        Op::ArgReduce {
            axis, keep_dims, ..
        } => nn::arg_reduce(cx, *axis, *keep_dims),
        Op::Cumulative {
            kind,
            exclusive,
            reverse,
        } => nn::cumulative(cx, *kind, *exclusive, *reverse),
        Op::Softmax { axis, .. } | Op::LpNorm { axis, .. } => nn::along_axis(cx, *axis),
        Op::LayerNorm { axis, .. } => nn::layer_norm(cx, *axis),
        Op::RmsNorm { axis, .. } => nn::rms_norm(cx, *axis),
        Op::GroupNorm { num_groups, .. } => nn::group_norm(cx, *num_groups),
        Op::InstanceNorm { .. } => nn::channel_norm(cx, 3, 3),
        Op::BatchNorm { .. } => nn::channel_norm(cx, 5, 5),
        Op::Lrn { size, .. } => nn::lrn(cx, *size),
        Op::MeanVarianceNorm { axes } => nn::mean_variance_norm(cx, axes),

        Op::Linear { format } => llm::linear(cx, *format),
        Op::Embedding { format } => llm::embedding(cx, *format),
        Op::MoeFfn {
            top_k,
            gate_format,
            up_format,
            down_format,
            ..
        } => llm::moe_ffn(cx, *top_k, [*gate_format, *up_format, *down_format]),
        Op::MatMul => linalg::matmul(cx, None),
        Op::MatMulInteger => linalg::matmul(cx, Some(crate::DType::I32)),
        Op::MatMulBlockQuant {
            k,
            n,
            bits,
            block_size,
            ..
        } => linalg::matmul_block_quant(cx, *k, *n, *bits, *block_size),
        Op::Gemm {
            trans_a, trans_b, ..
        } => linalg::gemm(cx, *trans_a, *trans_b),
        Op::Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
        | Op::ConvNhwc {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
        | Op::ConvInteger {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => nn::conv(
            cx,
            &nn::ConvAttrs {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                auto_pad: *auto_pad,
            },
            matches!(cx.op, Op::ConvInteger { .. }).then_some(crate::DType::I32),
            if matches!(cx.op, Op::ConvNhwc { .. }) {
                nn::ConvLayout::ChannelsLast
            } else {
                nn::ConvLayout::ChannelsFirst
            },
        ),
        Op::ConvTranspose {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
            output_padding,
            output_shape,
        } => nn::conv_transpose(
            cx,
            &nn::ConvAttrs {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                auto_pad: *auto_pad,
            },
            output_padding,
            output_shape,
        ),
        Op::Einsum { equation } => linalg::einsum(cx, equation),
        Op::QuantizeLinear { output_dtype, .. } => linalg::quantize(cx, *output_dtype),
        Op::DequantizeLinear { .. } => linalg::dequantize(cx),
        Op::DynamicQuantizeLinear => linalg::dynamic_quantize(cx),
        Op::Attention {
            kv_num_heads,
            q_num_heads,
            ..
        } => linalg::attention(cx, *q_num_heads, *kv_num_heads),
        Op::RotaryEmbedding { .. } => ew::same(cx, 3, 4),

        Op::Pool {
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ceil_mode,
            ..
        } => nn::pool(
            cx,
            &nn::ConvAttrs {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: 1,
                auto_pad: *auto_pad,
            },
            *ceil_mode,
        ),
        Op::GlobalPool { .. } => nn::global_pool(cx),
        Op::MaxUnpool {
            kernel_shape,
            strides,
            pads,
        } => nn::max_unpool(cx, kernel_shape, strides, pads),

        Op::Reshape { allow_zero } => shape::reshape(cx, *allow_zero),
        Op::Shape { start, end } => shape::shape(cx, *start, *end),
        Op::Size => shape::size(cx),
        Op::Transpose { perm } => shape::transpose(cx, perm),
        Op::Squeeze { axes } => shape::squeeze(cx, axes),
        Op::Unsqueeze { axes } => shape::unsqueeze(cx, axes),
        Op::Flatten { axis } => shape::flatten(cx, *axis),
        Op::Concat { axis } => shape::concat(cx, *axis),
        Op::Split { axis } => shape::split(cx, *axis),
        Op::Slice => shape::slice(cx),
        Op::Gather { axis } => shape::gather(cx, *axis),
        Op::GatherElements { axis } => shape::gather_elements(cx, *axis),
        Op::GatherNd { batch_dims } => shape::gather_nd(cx, *batch_dims),
        Op::ScatterElements { .. } | Op::ScatterNd { .. } => shape::scatter(cx),
        Op::Expand => shape::expand(cx),
        Op::Tile => shape::tile(cx),
        Op::Pad { .. } => shape::pad(cx),
        Op::ConstantOfShape { value } => shape::constant_of_shape(cx, value),
        Op::Range => shape::range(cx),
        Op::OneHot { axis } => shape::one_hot(cx, *axis),
        Op::Trilu { .. } => shape::trilu(cx),
        Op::TopK { axis, .. } => shape::top_k(cx, *axis),
        Op::NonZero => shape::non_zero(cx),
        Op::Compress { axis } => shape::compress(cx, *axis),
        Op::Unique { axis, .. } => shape::unique(cx, *axis),
        Op::ReverseSequence {
            batch_axis,
            time_axis,
        } => shape::reverse_sequence(cx, *batch_axis, *time_axis),
        Op::DepthToSpace { blocksize, .. } => nn::depth_to_space(cx, *blocksize),
        Op::SpaceToDepth { blocksize } => nn::space_to_depth(cx, *blocksize),
        Op::EyeLike { dtype, .. } => shape::eye_like(cx, *dtype),
        Op::Resize {
            axes,
            keep_aspect_ratio_policy,
            ..
        } => nn::resize(cx, axes, *keep_aspect_ratio_policy),
        Op::GridSample { .. } => nn::grid_sample(cx),
        Op::NonMaxSuppression { .. } => shape::non_max_suppression(cx),

        Op::Dft {
            axis,
            inverse,
            onesided,
        } => signal::dft(cx, *axis, *inverse, *onesided),
        Op::Stft { onesided } => signal::stft(cx, *onesided),
        Op::Window { dtype, .. } => signal::window(cx, *dtype),
        Op::MelWeightMatrix { dtype } => signal::mel_weight_matrix(cx, *dtype),
        Op::RoiAlign {
            output_height,
            output_width,
            ..
        } => fused::roi_align(cx, *output_height, *output_width),
        Op::DeformConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            offset_group,
        } => fused::deform_conv(
            cx,
            &fused::deform_attrs(kernel_shape, strides, pads, dilations, *group),
            *offset_group,
        ),
        Op::QLinearMatMul => fused::qlinear_matmul(cx),
        Op::QLinearConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => fused::qlinear_conv(
            cx,
            &nn::ConvAttrs {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                auto_pad: *auto_pad,
            },
        ),
        Op::LinearAttention {
            q_num_heads,
            kv_num_heads,
            ..
        } => fused::linear_attention(cx, *q_num_heads, *kv_num_heads),
        Op::CausalConvWithState { .. } => fused::causal_conv_with_state(cx),
        Op::BitCast { to } => fused::bit_cast(cx, *to),

        Op::NllLoss { reduction, .. } => misc::loss(cx, *reduction, false),
        Op::SoftmaxCrossEntropy { reduction, .. } => misc::loss(cx, *reduction, true),
        Op::SwiGlu { .. } => misc::swiglu(cx),
        Op::Det => misc::det(cx),
        Op::CenterCropPad { axes } => misc::center_crop_pad(cx, axes),
        Op::Col2Im {
            dilations,
            pads,
            strides,
        } => misc::col2im(cx, dilations, pads, strides),
        Op::AffineGrid { .. } => misc::affine_grid(cx),
        Op::TensorScatter { axis, .. } => misc::tensor_scatter(cx, *axis),
        Op::Binarizer { .. } => misc::binarizer(cx),
        Op::ArrayFeatureExtractor => misc::array_feature_extractor(cx),
        Op::LabelEncoder { default, .. } => misc::label_encoder(cx, default),

        Op::Lstm {
            direction,
            hidden_size,
            layout,
            ..
        } => nn::rnn(cx, *direction, *hidden_size, *layout, 8, 3),
        Op::Gru {
            direction,
            hidden_size,
            layout,
            ..
        } => nn::rnn(cx, *direction, *hidden_size, *layout, 6, 2),
        Op::Rnn {
            direction,
            hidden_size,
            layout,
            ..
        } => nn::rnn(cx, *direction, *hidden_size, *layout, 6, 2),

        Op::If {
            then_branch,
            else_branch,
        } => control::if_(cx, then_branch, else_branch),
        Op::Loop { body } => control::loop_(cx, body),
        Op::Scan {
            body,
            num_scan_inputs,
            num_captures,
            scan_input_axes,
            scan_output_axes,
            ..
        } => control::scan(
            cx,
            body,
            *num_scan_inputs,
            *num_captures,
            scan_input_axes,
            scan_output_axes,
        ),
    }
}
