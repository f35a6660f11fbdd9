//! rafter's SPIR-V code generator: kernel bodies (small [`rafter_ir::Graph`]s) to Vulkan
//! compute shaders.
//!
//! # The kernel ABI (shared with `rafter-hal-vulkan`)
//!
//! A kernel takes no descriptors. Its push constants hold, in binding order, each buffer's
//! 64-bit device address (a `PhysicalStorageBuffer` pointer, SPIR-V 1.5 / Vulkan 1.2 core),
//! then the dispatch's `params`. Addressing buffers by pointer is what lets one tensor exceed
//! the device's `maxStorageBufferRange` (128 MiB on lavapipe): a pointer reaches the whole
//! allocation. Binding order is the body's inputs, then its outputs. Element addresses are
//! 64-bit integer arithmetic on the base (`Int64`, the device's `shaderInt64`): NVIDIA's
//! driver drops stores past byte 2^32 reached through an access chain into the buffer.
//!
//! # What is generated today
//!
//! **Element types.** Every kernel kind below reads and writes f32 or f16 buffers (the
//! kinds that only move bits, such as [`bit_cast`], [`gather_nd`], [`space_to_depth`] and
//! [`eye_like`], take any element type, and [`cumulative`] integers too). f16 is
//! storage only: loads widen to f32 (`OpFConvert`), stores narrow with round-to-nearest-even,
//! and all arithmetic and accumulation are f32 (the one place that knows the element type
//! is the private `elem` module). Only a module touching f16 declares
//! `StorageBuffer16BitAccess` (not `Float16`: nothing is computed in f16), so f32 kernels
//! still run on devices without 16-bit storage. Every f16 *value* of the body a fused
//! kernel computes (an op's result, a matmul's product before its epilogue) is rounded to
//! f16 as if it had been stored, so fusion never changes a result: the kernel agrees with
//! the op-by-op reference and CPU kernels, while arithmetic inside one op (a product's
//! accumulation, a softmax's or layer norm's sums) stays f32. An elementwise kernel may mix
//! f16 and f32 bindings through `cast`; a matmul, conv or window kernel takes one element
//! type for all its bindings. Constants folded into a module are decoded to f32 when it is
//! generated.
//!
//! *Placement of f16 kernels:* [`supports`] accepts them whatever the target device, since
//! the compiler does not know it; the Vulkan loader (`rafter-hal-vulkan`) reads each
//! module's capabilities and refuses one needing a feature the device lacks
//! (`storageBuffer16BitAccess`), naming the kernel and the feature, before the driver sees
//! it. Refusing at compile time would need the device at compile time, and a fallback
//! placement per device would double the artifact; desktop GPUs (NVIDIA, AMD, Intel) and
//! lavapipe have the feature (this crate's f16 tests assert lavapipe's).
//!
//! **Integers and bools (elementwise kernels only).** Bool, i8, u8, i32 and i64 bindings are
//! loaded and converted to f32 and stored back the way the reference's `cast` converts
//! (truncation toward zero, saturation, NaN to 0; nonzero or NaN is true). f32 holds every
//! bool, i8 and u8 exactly, so those values may flow through the ops that only move or
//! compare values: casts from floats or bools, comparisons (bool results), `and`/`or`/`xor`/
//! `not`/`is_nan`, `where`, reshapes, `expand`, `transpose`. Integer arithmetic (which
//! wraps), casts between integer types and any use of an i32 or i64 other than a cast to a
//! float (f32 holds them exactly only up to 2^24) cannot be computed that way: a body
//! whose every value is an integer or a bool is then an *integer kernel* (the private
//! `integer` module), every value an `i64` register, each result wrapped to its type:
//! wrapping add/sub/mul/neg/abs/sign, `div` (truncating), `mod`/`fmod`, min/max,
//! comparisons, bitwise ops and shifts (past the width or negative: 0, or -1 for a
//! negative value shifted right), casts between integer types, `where` and the moves, on
//! 8- to 64-bit signed and unsigned integers, bit-exact with the reference. A body mixing
//! floats with such integer values is refused with both reasons. A module with 8-bit
//! bindings declares `StorageBuffer8BitAccess`, with 16-bit integer bindings
//! `StorageBuffer16BitAccess`.
//!
//! **Quantization.** `quantize_linear` (`saturate(round_half_even(x / scale) + zero_point)`
//! to i8, u8, i16 or u16) and `dequantize_linear` (`(x - zero_point) * scale` from those)
//! are pointwise ops of the float kernels, per tensor (scalar scale and zero point) or per
//! axis (1-D parameters, kernel inputs, read with stride 1 along the axis); blocked
//! quantization and 32-bit quantized values stay on the CPU with the reason.
//!
//! [`elementwise`]: a fused chain of elementwise ops on `f32`/`f16`, each operand of the output's
//! shape, a single element broadcast to all (a scalar), or NumPy-broadcast or transposed,
//! read through per-dim strides from the output's coordinates; reshape-like ops (reshape,
//! flatten, squeeze, unsqueeze) keep linear order and expand is a broadcast. One invocation
//! per element over a 1-D grid, in a grid-stride loop, so any element count fits in the
//! device's workgroup-count limit; the count is the first `u32` param.
//!
//! Row kernels (the count param is still the output's element count):
//! - a `reduce` on a static shape (after an optional pointwise prologue): one invocation per
//!   output element loops over its lane (the elementwise launch);
//! - a softmax or log-softmax alone: max, sum of exponentials, write (a hardmax: the first
//!   maximum, then 1 there and 0 elsewhere; an `lp_norm`: the norm, then `x / norm`). Over
//!   the last axis a workgroup of [`ROW_WORKGROUP_SIZE`] invocations per lane (`Launch::Rows`, the grid the
//!   row count), each taking every 128th element and the partial results combined by a
//!   tree through workgroup memory; over another axis one invocation per lane;
//! - a `layer_norm` over the axes `axis..rank` with its scale and (optional) bias, after an
//!   optional pointwise prologue (the residual `add` fusion leaves in front of it): a
//!   workgroup per row like the softmax, three passes (mean, variance around it, write),
//!   the prologue evaluated at each element; the scale and bias are read per position in
//!   the row. Its optional mean and inverse deviation (ONNX LayerNormalization's) are
//!   stored per row by the workgroup's first invocation.
//!
//! **Symbolic dims.** Shapes may be symbolic (`batch`, `seq`): a kernel that needs a size
//! the body does not fix (a broadcast or transposed operand's strides, the output's
//! coordinates, a softmax or norm row length) reads it from a *dim param*, a `u32` pushed
//! after the count. [`ElementwiseKernel::dims`] lists them, each as an axis of one of the
//! kernel's bindings (`rafter_vulkan_section::DimParam`, carried in the artifact's `vulkan`
//! section), so the runtime pushes the call's actual size of that axis
//! (`rafter_vulkan_section::dim_params`, shared with the tests). Dims are matched symbolically:
//! an operand dim broadcasts where it is 1 and follows the output where it is the same
//! expression; anything else is refused with the value named. Kernels on static shapes
//! take no dim params and fold every size into the module.
//!
//! [`matmul`]: f32/f16 matrix products, a 64×64 (or 32×32) tile of C per workgroup staged
//! through workgroup memory with a 4×4 (2×2) register block per invocation (for long-K
//! products with few tiles, [`MatmulTile::Sliced`] splits K over four groups of one
//! workgroup and adds their partial sums through workgroup memory); B 2-D or
//! batched like A; a fused bias/scale/residual/relu epilogue whose operands may also be
//! broadcast to C (an attention mask `[b, 1, 1, s]` or `[b, 1, s, s]` added to scores
//! `[b, h, s, s]`) as long as C's batch dims inside the outermost are known.
//!
//! [`conv`]: 2-D convolutions and pooling on NCHW f32/f16 with static channel and spatial
//! dims: an ungrouped convolution as an implicit GEMM (the matmul kernel gathering B's
//! tiles from the image), with its bias and elementwise tail fused; depthwise convolution,
//! max, average (`count_include_pad` where every window lies in the padded input) and Lp
//! pooling and global pooling one invocation per output element; 1-D ones are generated as
//! the 2-D ones on `[N, C, 1, L]`. A 2-D `Gemm` is the
//! matmul kernel (B read transposed for `transB`).
//!
//! [`pool_nd`] and [`conv_nd`]: max, average and Lp pooling and direct (grouped)
//! convolution with a bias, with three or more spatial dims (3-D), f32/f16, static
//! channel and spatial dims, one invocation per output element walking its window's taps.
//!
//! [`conv_transpose`]: ONNX `ConvTranspose` with any number of static spatial dims (1-, 2-
//! and 3-D), f32/f16: strides, dilations, pads, `output_padding`, `output_shape`,
//! `auto_pad`, groups and a bias (bound or folded). One invocation per output element
//! *gathers* the taps that reach it (no atomics: each output is written once); the
//! geometry is the reference's.
//!
//! [`grid_sample`]: ONNX `GridSample` of a static `[N, C, in...]` f32/f16 tensor (4-D
//! images, 5-D volumes) at an f32/f16 grid: linear, nearest and cubic modes, zeros, border
//! and reflection padding, `align_corners`; one invocation per output element, the taps of
//! every dim unrolled (at most 64).
//!
//! A transposed convolution may end in a fused elementwise tail (a decoder's `relu`,
//! `sigmoid`, a clip, or a scale and shift by scalars or per-channel operands: the private
//! `tail` module); a tail reading operands per position is refused with that reason and
//! the kernel stays on the CPU, as does a grid sample with any tail.
//!
//! **Cooperative matrices.** An f16 matmul or implicit-GEMM convolution also comes as a
//! second module on `VK_KHR_cooperative_matrix` (16×16×16 f16·f16 + f32, subgroup scope,
//! 32-wide subgroups; the private `coop` module): the same kernel with the same launch,
//! which the artifact carries beside the plain one (`VulkanModule::coop`) and the runtime
//! loads where the device offers that configuration ([`COOP_SIDE`], [`COOP_SUBGROUP`]).
//!
//! Data-movement kernels share one grid-stride launch (the private `grid` module: one
//! invocation per output element, the elementwise launch) on f32/f16 data:
//!
//! [`gather`]: ONNX `Gather` along any axis of a static tensor by i32 or i64 indices of any
//! shape, symbolic dims included (negative ones from the end, an i32 sign-extended; an
//! index outside the axis gives NaN, never a read past the data).
//!
//! [`gather_elements`]: ONNX `GatherElements` along any axis, static data and i32/i64
//! indices, wrapped and checked as [`gather`]'s.
//!
//! [`scatter_elements`]: ONNX `ScatterElements` along any axis of a static f32/f16 tensor
//! by i32/i64 indices, every reduction; one invocation per output element walking the
//! updates that can reach it in order (no atomics, the reference's order).
//!
//! [`gather_nd`]: ONNX `GatherND` of a static tensor of any element type by i32/i64 index
//! tuples, `batch_dims` (bits copied as [`bit_cast`]'s).
//!
//! [`concat`]: ONNX `Concat` of any number of operands along any axis (dims from the axis
//! inward static; a symbolic batch outside it is fine).
//!
//! [`split`]: ONNX `Split` along any axis of a static tensor into any number of parts
//! (the first not empty: the launch counts it), one invocation per input element.
//!
//! [`pad`]: ONNX `Pad` of a static tensor with constant pads and axes, every mode
//! (constant, edge, reflect, wrap), negative pads cropping.
//!
//! [`trilu`]: ONNX `Trilu` of any stored element type (floats, bools, integers), the last
//! two dims static, `k` constant or read at run time.
//!
//! [`batch_norm`]: inference `BatchNormalization` on `[N, C, spatial...]` (C and spatial
//! static), its parameters kernel inputs or folded constants.
//!
//! [`arg_reduce`]: ONNX `ArgMax`/`ArgMin` along any axis of a static tensor, `keepdims` and
//! `select_last_index`, NaN winning as in the reference; the result is i64.
//!
//! [`reduce_axes`]: every ONNX `Reduce*` of a static f32/f16 tensor whose `axes` are read
//! at run time (an i64/i32 operand: opset-13 `ReduceSum`, every opset-18 reduction),
//! `keepdims` and `noop_with_empty_axes`.
//!
//! [`slice`]: ONNX `Slice` of a static f32/f16 tensor with constant starts, ends, axes and
//! steps (a fused QKV split); the epilogue of a product may end in sigmoid, tanh or GELU
//! (the private `epilogue_math` module).
//!
//! **Quantized products** (ONNX Runtime's quantization tools' output):
//!
//! [`dynamic_quantize`]: ONNX `DynamicQuantizeLinear` of an f32 tensor, one workgroup
//! (`Launch::Rows` over the whole tensor) finding the range by a tree and quantizing,
//! bit-exact with the reference (correctly rounded quotients).
//!
//! [`matmul_integer`]: ONNX `MatMulInteger` of u8/i8 operands by a shared 2-D B, zero
//! points per tensor, row or column (body inputs or folded constants), accumulated in i32
//! one invocation per output element (exact, where f32 accumulation is not past 2^24),
//! with the float epilogue ORT's `MatMulIntegerToFloat` and `DynamicQuantizeMatMul` import
//! as (cast, scale, bias, an activation).
//!
//! [`block_quant`]: the IR's `matmul_block_quant` (ORT's `MatMulNBits`, 4- or 8-bit
//! blocks), dequantized where read, one invocation per output element, with
//! `accuracy_level` 4's int8 rounding of A.
//!
//! [`qlinear_conv`]: ONNX `QLinearConv` of u8/i8 inputs and weights with any number of
//! static spatial dims, groups, pads, strides, dilations and `auto_pad`, weight scales and
//! zero points per tensor or per output channel, an i32 bias; one invocation per output
//! element summing in i32, requantized in f32 as ONNX Runtime does.
//!
//! [`gru`]: ONNX `GRU` and `LSTM` on f32, every direction and layout, `linear_before_reset`
//! (GRU), peepholes and `input_forget` (LSTM), `clip`, sigmoid/tanh/relu gates; one
//! workgroup per (direction, batch row) looping over the time steps with the hidden (and
//! cell) state in workgroup memory (`Launch::Rows`), at most [`GRU_MAX_HIDDEN`] units;
//! `sequence_lens` stays on the CPU.
//!
//! **Bindings.** A kernel binds at most [`MAX_BINDINGS`] buffers. Up to
//! [`INLINE_BINDINGS`] their addresses, then the params, are the push constants; with more,
//! the runtime writes that same block to memory and pushes its address, and the module
//! reads its arguments through it (an LSTM with states and peepholes binds 10).
//!
//! [`rotary`]: ONNX `RotaryEmbedding` of an f32 `[batch, seq, hidden]` or `[batch, heads,
//! seq, head_size]` (heads and seq static) by cos and sin caches (`[positions, rot / 2]`,
//! or `[batch, seq, rot / 2]` without position ids), with or without position ids,
//! interleaved or halves, one invocation per element.
//!
//! [`attention`]: ONNX `Attention` (and ORT's contrib attention ops imported to it) on
//! f32 or f16 queries, f16 keys and values under f32 queries: 3-D or 4-D, grouped heads,
//! causal, bool or float masks, sliding windows, `nonpad_kv_seqlen`, past and present
//! keys and values, softcap, every `qk_matmul_output_mode`; the key length static (at
//! most [`ATTENTION_MAX_KEYS`]); one invocation per query row, a stable three-pass
//! softmax over the row's scores kept in a private array.
//!
//! [`eye_like`]: ONNX `EyeLike` of a static 1- or 2-D shape, any result type (the bits of
//! one or zero stored as [`bit_cast`]'s).
//!
//! [`space_to_depth`]: ONNX `SpaceToDepth` of a static 4-D tensor of any element type
//! (bits copied as [`bit_cast`]'s).
//!
//! [`swiglu`]: the IR's `swiglu` (`a * sigmoid(alpha * a) * b`, ONNX SwiGLU) of two f32/f16
//! tensors of one shape, step by step as the reference rounds it.
//!
//! [`bit_cast`]: ONNX `BitCast` between types of one width (8 to 64 bits, f64 and bf16
//! included: the bits move through an unsigned register, nothing is computed).
//!
//! [`cumulative`]: ONNX `CumSum`/`CumProd` of a static tensor (f32/f16 accumulated in
//! f32, 8- to 64-bit integers wrapping in 64-bit registers) along an axis constant or
//! read at run time, `exclusive` and `reverse`; one invocation per lane.
//!
//! [`loss`]: ONNX `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` of a static
//! f32/f16 `[N, C, d...]` by i32/i64 targets, optional class weights, `ignore_index`,
//! every reduction and the cross-entropy's log-probabilities; one invocation per loss
//! element (a sum or mean one serial pass over the positions, in the reference's order).
//!
//! Subgroup reductions, reduces over symbolic dims, integer arithmetic
//! and f16 arithmetic (packed f16) come next. Multi-element constants folded
//! into a body (the compiler folds constants of 64 bytes or less: 32 f16 values) are kept
//! in the module as `Private` arrays where they are a conv's or matmul's bias (a row or
//! column of C) or a layer norm's scale or bias; elsewhere (an operand of an elementwise
//! chain) such a kernel stays on the CPU.
//!
//! Every module is SPIR-V 1.5 and is checked with `spirv-val --target-env vulkan1.3` in
//! this crate's tests.

mod argreduce;
mod attention;
mod backend;
mod batch_norm;
mod bitcast;
mod block_quant;
mod concat;
mod const_bytes;
mod conv;
mod conv_transpose;
mod coop;
mod cumulative;
mod dynamic_quantize;
mod elem;
mod elementwise;
mod epilogue_math;
mod eye_like;
mod gather;
mod gather_elements;
mod gather_nd;
mod grid;
mod grid_sample;
mod gru;
mod integer;
mod loss;
mod matmul;
mod matmul_integer;
mod pad;
mod qlinear_conv;
mod reduce_axes;
mod rotary;
mod scatter_elements;
mod shape_range;
mod slice;
mod space_to_depth;
mod split;
mod swiglu;
mod tail;
mod trilu;
mod window;
mod window_nd;

pub use argreduce::{arg_reduce, ArgReduceKernel};
pub use attention::{attention, AttentionKernel, MAX_KEYS as ATTENTION_MAX_KEYS};
pub use backend::SpirvBackend;
pub use batch_norm::{batch_norm, BatchNormKernel};
pub use bitcast::{bit_cast, BitCastKernel};
pub use block_quant::{block_quant, BlockQuantKernel};
pub use concat::{concat, ConcatKernel};
pub use conv::{conv, ConvKernel};
pub use conv_transpose::{conv_transpose, ConvTransposeKernel};
pub use coop::{COOP_SIDE, COOP_SUBGROUP};
pub use cumulative::{cumulative, CumulativeKernel};
pub use dynamic_quantize::{dynamic_quantize, DynamicQuantizeKernel};
pub use elementwise::{
    elementwise, ElementwiseKernel, Operand, ROW_WORKGROUP_SIZE, WORKGROUP_SIZE,
};
pub use eye_like::{eye_like, EyeLikeKernel};
pub use gather::{gather, GatherKernel};
pub use gather_elements::{gather_elements, GatherElementsKernel};
pub use gather_nd::{gather_nd, GatherNdKernel};
pub use grid::{INLINE_BINDINGS, MAX_BINDINGS};
pub use grid_sample::{grid_sample, GridSampleKernel};
pub use gru::{gru, GruKernel, MAX_HIDDEN as GRU_MAX_HIDDEN};
pub use loss::{loss, LossKernel};
pub use matmul::{matmul, matmul_tiled, MatmulKernel, MatmulTile, MATMUL_TILE, SLICES};
pub use matmul_integer::{matmul_integer, MatmulIntegerKernel};
pub use pad::{pad, PadKernel};
pub use qlinear_conv::{qlinear_conv, QLinearConvKernel};
pub use reduce_axes::{reduce_axes, ReduceAxesKernel};
pub use rotary::{rotary, RotaryKernel};
pub use scatter_elements::{scatter_elements, ScatterElementsKernel};
pub use shape_range::{range, shape, ShapeRangeKernel};
pub use slice::{slice, SliceKernel};
pub use space_to_depth::{space_to_depth, SpaceToDepthKernel};
pub use split::{split, SplitKernel};
pub use swiglu::{swiglu, SwiGluKernel};
pub use trilu::{trilu, TriluKernel};
pub use window_nd::{conv_nd, pool_nd, WindowNdKernel};

use rafter_ir::program::Program;
use rafter_ir::Graph;
use rafter_vulkan_section::{VulkanModule, VulkanSection};

/// The device name kernels compiled here carry.
pub const DEVICE: &str = "vulkan";

/// Whether a kernel body can be generated, and if not, why (one line naming the value or
/// op). The partitioner sends a kernel to the Vulkan device only when this is `Ok`.
///
/// It runs the generator itself (a few microseconds for a fused elementwise body) rather
/// than a separate predicate, so the two can never disagree.
pub fn supports(body: &Graph) -> Result<(), String> {
    generate(body).map(|_| ())
}

/// The one generated form of a body: an elementwise (or reduce/softmax) kernel, or a matrix
/// product with its epilogue.
enum Generated {
    Elementwise(ElementwiseKernel),
    Matmul(MatmulKernel),
    Conv(ConvKernel),
    /// A kernel of the shared grid-stride launch ([`grid`]): gather, gather-nd, slice,
    /// gather-elements, concat, split, pad, trilu, batch norm, arg-reduce, reduce by
    /// run-time axes, cumulative sums and products, bit casts, eye-like, space-to-depth,
    /// swiglu, scatter-elements, losses, 3-D pooling and convolution, transposed
    /// convolution, grid sample.
    Grid(Vec<u32>),
    /// A grid-stride kernel that reads symbolic dims as params after the count (shape,
    /// range, and the data movement over symbolic dims).
    GridDims(Vec<u32>, Vec<rafter_vulkan_section::DimParam>),
    /// A kernel of workgroups of its own launch ([`dynamic_quantize`], [`gru`]).
    Rows(Vec<u32>, rafter_vulkan_section::Launch),
}

/// Generates `body`; the error is the elementwise generator's reason unless the body is a
/// matmul, whose generator then says why not.
fn generate(body: &Graph) -> Result<Generated, String> {
    if body
        .nodes
        .first()
        .is_some_and(|n| n.op == rafter_ir::Op::MatMulInteger)
    {
        return matmul_integer(body).map(|k| Generated::Grid(k.spirv));
    }
    let is_matmul = body
        .nodes
        .first()
        .is_some_and(|n| matches!(n.op, rafter_ir::Op::MatMul | rafter_ir::Op::Gemm { .. }));
    if is_matmul {
        let tile = matmul_tile(body);
        return matmul_tiled(body, tile)
            .map(Generated::Matmul)
            .map_err(|e| e.reason);
    }
    if window_nd::applies(body) {
        return window_nd::generate(body).map(|k| Generated::Grid(k.spirv));
    }
    let is_window = body.nodes.first().is_some_and(|n| {
        matches!(
            n.op,
            rafter_ir::Op::Conv { .. }
                | rafter_ir::Op::Pool { .. }
                | rafter_ir::Op::GlobalPool { .. }
        )
    });
    if is_window {
        return conv(body).map(Generated::Conv).map_err(|e| e.reason);
    }
    // A transposed convolution or grid sample with a fused tail it does not take is refused
    // by its own generator, so the CPU fallback names that reason.
    match body.nodes.first().map(|n| &n.op) {
        Some(rafter_ir::Op::ConvTranspose { .. }) => {
            return conv_transpose(body).map(|k| Generated::Grid(k.spirv));
        }
        Some(rafter_ir::Op::GridSample { .. }) => {
            return grid_sample(body).map(|k| Generated::Grid(k.spirv));
        }
        _ => {}
    }
    if reduce_axes::reads_axes(body) {
        return reduce_axes(body).map(|k| Generated::Grid(k.spirv));
    }
    if let [n] = body.nodes.as_slice() {
        use rafter_ir::Op;
        if n.op == Op::DynamicQuantizeLinear {
            return dynamic_quantize(body).map(|k| Generated::Rows(k.spirv, k.launch));
        }
        if let Op::Gru { .. } | Op::Lstm { .. } = n.op {
            return gru(body).map(|k| Generated::Rows(k.spirv, k.launch));
        }
        match n.op {
            Op::Shape { .. } => return shape(body).map(|k| Generated::GridDims(k.spirv, k.dims)),
            Op::Range => return range(body).map(|k| Generated::GridDims(k.spirv, k.dims)),
            Op::Concat { .. } => {
                return concat(body).map(|k| Generated::GridDims(k.spirv, k.dims));
            }
            Op::Gather { .. } => {
                return gather(body).map(|k| Generated::GridDims(k.spirv, k.dims));
            }
            Op::Attention { .. } => {
                return attention(body).map(|k| Generated::GridDims(k.spirv, k.dims));
            }
            Op::GatherNd { .. } => {
                return gather_nd(body).map(|k| Generated::GridDims(k.spirv, k.dims));
            }
            _ => {}
        }
        let grid = match n.op {
            Op::GatherElements { .. } => Some(gather_elements(body).map(|k| k.spirv)),
            Op::Slice => Some(slice(body).map(|k| k.spirv)),
            Op::ArgReduce { .. } => Some(arg_reduce(body).map(|k| k.spirv)),
            Op::Split { .. } => Some(split(body).map(|k| k.spirv)),
            Op::Trilu { .. } => Some(trilu(body).map(|k| k.spirv)),
            Op::Pad { .. } => Some(pad(body).map(|k| k.spirv)),
            Op::QLinearConv { .. } => Some(qlinear_conv(body).map(|k| k.spirv)),
            Op::BatchNorm { .. } => Some(batch_norm(body).map(|k| k.spirv)),
            Op::MatMulBlockQuant { .. } => Some(block_quant(body).map(|k| k.spirv)),
            Op::RotaryEmbedding { .. } => Some(rotary(body).map(|k| k.spirv)),
            Op::Cumulative { .. } => Some(cumulative(body).map(|k| k.spirv)),
            Op::BitCast { .. } => Some(bit_cast(body).map(|k| k.spirv)),
            Op::SwiGlu { .. } => Some(swiglu(body).map(|k| k.spirv)),
            Op::EyeLike { .. } => Some(eye_like(body).map(|k| k.spirv)),
            Op::SpaceToDepth { .. } => Some(space_to_depth(body).map(|k| k.spirv)),
            Op::ScatterElements { .. } => Some(scatter_elements(body).map(|k| k.spirv)),
            Op::NllLoss { .. } | Op::SoftmaxCrossEntropy { .. } => {
                Some(loss(body).map(|k| k.spirv))
            }
            _ => None,
        };
        if let Some(spirv) = grid {
            return spirv.map(Generated::Grid);
        }
    }
    elementwise(body)
        .map(Generated::Elementwise)
        .map_err(|e| e.reason)
}

/// The C tile for a product: 64×64 when A's rows are known to be many (512 or more), else
/// 32×32, which measured 1.6× faster on BERT's M = 128 products on the H100 (more
/// workgroups to fill the GPU; `benchmarks/RESULTS.md`). A symbolic row count (a sequence
/// length) counts as few. With few rows, a K of [`SLICED_MIN_K`] or more and few columns
/// (1,024 or fewer: at M = 128 at most 128 tiles of 32×32, under one per multiprocessor of
/// a big GPU), K is also split over the workgroup ([`MatmulTile::Sliced`]).
fn matmul_tile(body: &Graph) -> MatmulTile {
    tile_for(known_mkn(body))
}

/// The least K split over a [`MatmulTile::Sliced`] workgroup. MiniLM-L6's 128x384x384
/// projections (48 tiles of 32×32 for the H200's 132 multiprocessors) ran 23-24 us a
/// product one slice deep and 14-15 us in four (the model 1.46-1.51 -> 1.22-1.27 ms a call,
/// three alternated rounds, `benchmarks/gpu/exp/sliced_exp.sh`, 2026-12-01); BERT-base's
/// products (K = 64 or 128 in attention, 768 or 3,072 elsewhere) took the same tiles either
/// way and ran the same (3.96-4.06 ms a call). (Letting N go to 2,048 did not speed MiniLM's 128x384x1536
/// FFN products: 49-50 us both ways.)
const SLICED_MIN_K: i64 = 384;

/// A product's M (A's rows), K and N where the body's first node knows them.
fn known_mkn(body: &Graph) -> (Option<i64>, Option<i64>, Option<i64>) {
    let dims_of = |i: usize| {
        body.nodes
            .first()
            .and_then(|n| n.input(i))
            .map(|v| body.value(v).ty.dims.clone())
    };
    let known = |dims: &Option<Vec<rafter_ir::Dim>>, from_end: usize| {
        dims.as_ref()
            .and_then(|d| d.len().checked_sub(from_end).and_then(|i| d[i].as_known()))
    };
    let (a, b) = (dims_of(0), dims_of(1));
    let transposed = body
        .nodes
        .first()
        .is_some_and(|n| matches!(n.op, rafter_ir::Op::Gemm { trans_b: true, .. }));
    let (k, n) = if transposed {
        (known(&b, 1), known(&b, 2))
    } else {
        (known(&b, 2), known(&b, 1))
    };
    (known(&a, 2), k, n)
}

/// The tile for a product of M rows, K deep and N columns (each `None` when symbolic).
fn tile_for((m, k, n): (Option<i64>, Option<i64>, Option<i64>)) -> MatmulTile {
    match m {
        Some(m) if m >= 512 => MatmulTile::Large,
        _ if k.is_some_and(|k| k >= SLICED_MIN_K) && n.is_some_and(|n| n <= 1024) => {
            MatmulTile::Sliced
        }
        _ => MatmulTile::Small,
    }
}

/// Generates the `vulkan` executable section of `program`: one module per kernel whose
/// device is [`DEVICE`], in kernel order.
pub fn program_section(program: &Program) -> Result<VulkanSection, CodegenError> {
    let mut modules = Vec::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        if kernel.device != DEVICE {
            continue;
        }
        let module = module(&kernel.body, k as u32).map_err(|reason| CodegenError {
            kernel: kernel.name.clone(),
            reason,
        })?;
        modules.push(module);
    }
    Ok(VulkanSection { modules })
}

/// The module of one kernel body (kernel index `kernel` in its program): the SPIR-V and
/// how to launch it. [`program_section`] calls it for every Vulkan kernel; tests call it
/// to run one body.
pub fn kernel_module(body: &Graph, kernel: u32) -> Result<VulkanModule, CodegenError> {
    module(body, kernel).map_err(|reason| CodegenError {
        kernel: body.name.clone(),
        reason,
    })
}

fn module(body: &Graph, kernel: u32) -> Result<VulkanModule, String> {
    Ok(match generate(body)? {
        Generated::Elementwise(g) => VulkanModule {
            kernel,
            launch: g.launch,
            workgroup_size: g.workgroup_size,
            entry_point: g.entry_point,
            dims: g.dims,
            spirv: to_bytes(&g.spirv).into(),
            coop: None,
        },
        Generated::Matmul(g) => VulkanModule {
            kernel,
            launch: g.launch()?,
            workgroup_size: 256,
            entry_point: "main".into(),
            dims: Vec::new(),
            spirv: to_bytes(&g.spirv).into(),
            coop: g.coop.map(|c| to_bytes(&c).into()),
        },
        Generated::Grid(spirv) => VulkanModule {
            kernel,
            launch: rafter_vulkan_section::Launch::Elementwise,
            workgroup_size: WORKGROUP_SIZE,
            entry_point: "main".into(),
            dims: Vec::new(),
            spirv: to_bytes(&spirv).into(),
            coop: None,
        },
        Generated::GridDims(spirv, dims) => VulkanModule {
            kernel,
            launch: rafter_vulkan_section::Launch::Elementwise,
            workgroup_size: WORKGROUP_SIZE,
            entry_point: "main".into(),
            dims,
            spirv: to_bytes(&spirv).into(),
            coop: None,
        },
        Generated::Rows(spirv, launch) => VulkanModule {
            kernel,
            launch,
            workgroup_size: ROW_WORKGROUP_SIZE,
            entry_point: "main".into(),
            dims: Vec::new(),
            spirv: to_bytes(&spirv).into(),
            coop: None,
        },
        Generated::Conv(g) => VulkanModule {
            kernel,
            launch: g.launch,
            workgroup_size: g.workgroup_size,
            entry_point: "main".into(),
            dims: Vec::new(),
            spirv: to_bytes(&g.spirv).into(),
            coop: g.coop.map(|c| to_bytes(&c).into()),
        },
    })
}

/// Why a body could not be compiled to SPIR-V. The message names the node or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot generate SPIR-V for kernel `{kernel}`: {reason}")]
pub struct CodegenError {
    pub kernel: String,
    pub reason: String,
}

/// A module's words as the little-endian bytes an artifact stores and
/// `rafter_hal::ExecutablePayload::Bytes` carries.
pub fn to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_rows_and_columns_with_a_k_of_384_or_more_split_k() {
        let (m, s) = (Some(128), Some);
        // MiniLM-L6's projections and FFN-down, BERT-base's projections.
        assert_eq!(tile_for((m, s(384), s(384))), MatmulTile::Sliced);
        assert_eq!(tile_for((m, s(1536), s(384))), MatmulTile::Sliced);
        assert_eq!(tile_for((None, s(768), s(768))), MatmulTile::Sliced);
        // Short K, many columns, or an unknown K or N: one slice.
        assert_eq!(tile_for((m, s(256), s(384))), MatmulTile::Small);
        assert_eq!(tile_for((m, s(384), s(1536))), MatmulTile::Small);
        assert_eq!(tile_for((m, None, s(384))), MatmulTile::Small);
        assert_eq!(tile_for((m, s(768), None)), MatmulTile::Small);
        // Many rows: the large tile whatever K.
        assert_eq!(tile_for((Some(512), s(768), s(768))), MatmulTile::Large);
    }
}
