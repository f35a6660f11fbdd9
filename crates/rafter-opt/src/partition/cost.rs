//! The cost model: an estimate of each kernel on each device, and of each crossing
//! between devices, from a [`CostProfile`] and the kernel IR's shapes.
//!
//! A kernel's work is its floating-point operations and the bytes of its operands and
//! results ([`kernel_work`]), with every dim at its declared bound (`--dim seq<=2048`) and
//! an unbounded symbol taken as 1 (the smallest shape: a dynamic model is ranked by its
//! fixed part). Its time on a device is a roofline with a ramp plus the dispatch cost:
//!
//! ```text
//! t = dispatch_s + max((flops + half_flops) / flops_per_s + depth * depth_s, bytes / bytes_per_s)
//! ```
//!
//! where `depth` is a contraction's reduction length (the multiply-adds in series behind
//! one output): a kernel of few outputs and long sums cannot fill the device, whatever its
//! flops ([`KernelWork::detail_depth`]).
//!
//! with the class's rates ([`ClassRate`]). A tensor crossing from one device to another
//! costs the link's latency, the copy (`bytes / bytes_per_s`, none for a zero-copy link)
//! and the semaphore pair (`barrier_s` of the device waiting).

use std::collections::HashMap;

use rafter_ir::program::{cpu_winograd, ConvGeometry, Kernel, KernelKind, Program};
use rafter_ir::{Graph, Op, Symbol, TensorType};

use super::device::{ClassRate, CostProfile, DeviceDescription, Link, DETAIL_CLASSES};

/// What a kernel does, in the units the profiles rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelWork {
    /// The kernel's class (which rate applies).
    pub class: KernelKind,
    /// Its main detail class ([`DETAIL_CLASSES`]: that of its largest part), for reports.
    pub detail: Option<&'static str>,
    /// Flops of its nodes of each detail class (indexed as [`DETAIL_CLASSES`]): a fused
    /// kernel such as MobileNetV2's inverted-residual block holds a 1x1, a depthwise and
    /// another 1x1 convolution, each timed at its own class's rate.
    pub detail_flops: [f64; DETAIL_CLASSES.len()],
    /// Reduction depth of its nodes of each detail class (indexed as [`DETAIL_CLASSES`]):
    /// each node's flops over twice its outputs (a contraction's `K`, the multiply-adds in
    /// series behind one output), summed over the class's nodes, which run one after
    /// another. Rated by [`ClassRate::depth_s`].
    pub detail_depth: [f64; DETAIL_CLASSES.len()],
    /// Output width of its nodes of each detail class (indexed as [`DETAIL_CLASSES`]): a
    /// GEMM's N, a convolution's output channels, the flops-weighted geometric mean over
    /// the class's nodes; 0 without any. With flops and depth it places a part among its
    /// class's calibration probes ([`crate::partition::device::Residual::width`]).
    pub detail_width: [f64; DETAIL_CLASSES.len()],
    /// Floating-point (or integer) operations.
    pub flops: f64,
    /// Bytes of its operands and results (each read or written once).
    pub bytes: f64,
    /// Whether it computes in half precision (an f16 or bf16 result): its compute runs at
    /// the device's [`CostProfile::half_scale`] times the class rate.
    pub half: bool,
}

impl KernelWork {
    /// The output width of its main detail class's part (0 without one): where a probe
    /// of this work sits among its class's probes ([`KernelWork::detail_width`]).
    pub fn width(&self) -> f64 {
        self.detail
            .and_then(|d| DETAIL_CLASSES.iter().position(|&c| c == d))
            .map_or(0.0, |i| self.detail_width[i])
    }
}

/// Symbol values for the estimates: each bounded symbol at its smallest declared bound.
pub fn bound_values(p: &Program) -> HashMap<Symbol, i64> {
    let mut map: HashMap<Symbol, i64> = HashMap::new();
    for (s, b) in &p.bounds {
        let e = map.entry(s.clone()).or_insert(*b);
        *e = (*e).min(*b);
    }
    map
}

/// Elements of `ty` at `values` (an unbounded symbol counts as 1).
pub fn elements(ty: &TensorType, values: &HashMap<Symbol, i64>) -> f64 {
    ty.dims.iter().map(|d| dim_value(d, values)).product()
}

/// `d` at `values`, its unbounded symbols at 1.
fn dim_value(d: &rafter_ir::Dim, values: &HashMap<Symbol, i64>) -> f64 {
    let mut extended: Option<HashMap<Symbol, i64>> = None;
    for s in d.symbols() {
        if !values.contains_key(&s) {
            extended.get_or_insert_with(|| values.clone()).insert(s, 1);
        }
    }
    d.max_value(extended.as_ref().unwrap_or(values))
        .map_or(1.0, |x| x.max(0) as f64)
}

/// Bytes of `ty` at `values`.
pub fn bytes(ty: &TensorType, values: &HashMap<Symbol, i64>) -> f64 {
    elements(ty, values) * ty.dtype.size_of() as f64
}

/// The work of `kernel` at `values` (see the module doc).
pub fn kernel_work(kernel: &Kernel, values: &HashMap<Symbol, i64>) -> KernelWork {
    let body = &kernel.body;
    let gathered = gathered_bytes(body, values);
    let io = body.inputs.iter().chain(body.outputs.iter());
    let bytes = io
        .map(|&v| {
            let full = bytes(&body.value(v).ty, values);
            gathered.get(&v).map_or(full, |&g| full.min(g))
        })
        .sum();
    let mut flops = 0.0;
    let mut detail_flops = [0.0; DETAIL_CLASSES.len()];
    let mut detail_depth = [0.0; DETAIL_CLASSES.len()];
    // Per class: the flops-weighted sum of ln(width), and the flops it weighs.
    let mut log_width = [(0.0, 0.0); DETAIL_CLASSES.len()];
    for n in &body.nodes {
        let f = node_flops(body, n, values);
        flops += f;
        if let Some(d) = node_detail(body, n, values) {
            let i = DETAIL_CLASSES
                .iter()
                .position(|&c| c == d)
                .expect("a detail class");
            detail_flops[i] += f;
            if let Some(w) = node_width(body, n, values).filter(|&w| w >= 1.0 && f > 0.0) {
                log_width[i].0 += f * w.ln();
                log_width[i].1 += f;
            }
            let outputs: f64 = n
                .outputs
                .iter()
                .flatten()
                .map(|&v| elements(&body.value(v).ty, values))
                .sum();
            if outputs > 0.0 {
                detail_depth[i] += f / (2.0 * outputs);
            }
        }
    }
    let main = (0..DETAIL_CLASSES.len())
        .filter(|&i| detail_flops[i] > 0.0)
        .max_by(|&a, &b| detail_flops[a].total_cmp(&detail_flops[b]));
    // A kernel that only converts (a model's f16 input or output cast) does no arithmetic
    // in half precision: it runs at the class's own rate. Rated at the half scale, the
    // 1,000-logit f16 output cast of MobileNetV2 took 0.67 ms of a 1.6 ms call on the
    // H200 host's CPU (whose half scale, from an f16 GEMM, is 0.04), against 3 us measured.
    let converts_only = body
        .nodes
        .iter()
        .all(|n| matches!(n.op, Op::Cast { .. } | Op::BitCast { .. }));
    let half = !converts_only
        && body
            .outputs
            .iter()
            .any(|&v| body.value(v).ty.dtype.is_half());
    let detail_width = log_width.map(|(sum, f)| if f > 0.0 { (sum / f).exp() } else { 0.0 });
    KernelWork {
        class: kernel.kind,
        detail: main.map(|i| DETAIL_CLASSES[i]),
        detail_flops,
        detail_depth,
        detail_width,
        flops,
        bytes,
        half,
    }
}

/// How much the CPU's Winograd F(2x2, 3x3) grows a 3x3 filter, which it transforms on the
/// first call and reads transformed on every call: each 3x3 window becomes a 4x4 tile.
const WINOGRAD_FILTER_GROWTH: f64 = 16.0 / 9.0;

/// Bytes of weights `kernel` reads in one call, per body input (`weights[i]`: whether
/// input `i`, bound to the dispatch's argument `i`, is a weight; others 0): a table it only
/// gathers rows from counts the rows' bytes, and a kernel with a Winograd convolution
/// reads its largest weight, the filter, transformed ([`WINOGRAD_FILTER_GROWTH`]).
/// [`crate::partition::device::WeightCache`] charges these when a program's weights
/// outgrow the cache.
pub fn weight_bytes(kernel: &Kernel, weights: &[bool], values: &HashMap<Symbol, i64>) -> Vec<f64> {
    let body = &kernel.body;
    let gathered = gathered_bytes(body, values);
    let mut out: Vec<f64> = body
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if !weights.get(i).copied().unwrap_or(false) {
                return 0.0;
            }
            let full = bytes(&body.value(v).ty, values);
            gathered.get(&v).map_or(full, |&g| full.min(g))
        })
        .collect();
    let winograd = body
        .nodes
        .iter()
        .any(|n| node_detail(body, n, values) == Some("winograd_conv"));
    let filter = (0..out.len()).max_by(|&a, &b| out[a].total_cmp(&out[b]));
    if let Some(f) = filter.filter(|&f| winograd && out[f] > 0.0) {
        out[f] *= WINOGRAD_FILTER_GROWTH;
    }
    out
}

/// Bytes of the activations a contraction kernel reads in its elementwise epilogue only
/// (a residual added to a convolution's result), `weights[i]` marking the body inputs
/// that are weights (a bias is one, and costs nothing here). A probe has no such operand;
/// in a model it was made kernels earlier, and
/// [`crate::partition::device::WeightCache::epilogue_s`] charges its read. 0 for any
/// other kernel.
pub fn epilogue_operand_bytes(
    kernel: &Kernel,
    weights: &[bool],
    values: &HashMap<Symbol, i64>,
) -> f64 {
    if kernel.kind != KernelKind::Contraction {
        return 0.0;
    }
    let body = &kernel.body;
    body.inputs
        .iter()
        .enumerate()
        .filter(|&(i, _)| !weights.get(i).copied().unwrap_or(false))
        .filter(|&(_, &v)| {
            let mut uses = body
                .nodes
                .iter()
                .filter(|n| n.inputs.iter().flatten().any(|&u| u == v))
                .peekable();
            uses.peek().is_some() && uses.all(|n| KernelKind::of(&n.op) == KernelKind::Elementwise)
        })
        .map(|(_, &v)| bytes(&body.value(v).ty, values))
        .sum()
}

/// Tables the kernel only gathers rows from (operand 0 of a gather or embedding: a
/// token embedding's 47 MB table is not read whole), with the bytes the gathers read:
/// their results' size.
fn gathered_bytes(body: &Graph, values: &HashMap<Symbol, i64>) -> HashMap<rafter_ir::ValueId, f64> {
    let mut read: HashMap<rafter_ir::ValueId, f64> = HashMap::new();
    let mut other_use: std::collections::HashSet<rafter_ir::ValueId> = Default::default();
    for n in &body.nodes {
        let gather = matches!(
            n.op,
            Op::Gather { .. }
                | Op::Embedding { .. }
                | Op::GatherElements { .. }
                | Op::GatherNd { .. }
        );
        for (i, v) in n.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            if gather && i == 0 {
                let out: f64 = n
                    .outputs
                    .iter()
                    .flatten()
                    .map(|&o| bytes(&body.value(o).ty, values))
                    .sum();
                *read.entry(v).or_default() += out;
            } else {
                other_use.insert(v);
            }
        }
    }
    read.retain(|v, _| !other_use.contains(v));
    read
}

/// The detail class of a kernel body: that of its first contraction or attention node,
/// `None` when it has neither.
pub fn detail_class(body: &Graph, values: &HashMap<Symbol, i64>) -> Option<&'static str> {
    body.nodes.iter().find_map(|n| node_detail(body, n, values))
}

/// The detail class of node `n` of `body`, if it is a contraction or attention.
fn node_detail(
    body: &Graph,
    n: &rafter_ir::Node,
    values: &HashMap<Symbol, i64>,
) -> Option<&'static str> {
    let dims = |i: usize| -> Vec<f64> {
        n.input(i).map_or_else(Vec::new, |v| {
            let t = &body.value(v).ty;
            t.dims.iter().map(|d| dim_value(d, values)).collect()
        })
    };
    match &n.op {
        Op::Attention { .. } => Some("attention"),
        Op::MatMul
        | Op::MatMulInteger
        | Op::Gemm { .. }
        | Op::Linear { .. }
        | Op::Einsum { .. }
        | Op::MoeFfn { .. } => Some("gemm"),
        _ if conv_geometry(body, n, values).is_some_and(|g| cpu_winograd(&g)) => {
            Some("winograd_conv")
        }
        // w [M, C/group, kernel...].
        Op::Conv { group, .. } | Op::ConvInteger { group, .. } => {
            let w = dims(1);
            let window: f64 = w.iter().skip(2).product();
            Some(conv_class(*group, w.get(1).copied(), window))
        }
        // w [kernel..., C/group, M].
        Op::ConvNhwc { group, .. } => {
            let w = dims(1);
            let r = w.len();
            let window: f64 = w.iter().take(r.saturating_sub(2)).product();
            Some(conv_class(*group, r.checked_sub(2).map(|i| w[i]), window))
        }
        Op::ConvTranspose { .. } => Some("conv"),
        _ => None,
    }
}

/// The output width of contraction node `n`: its result's channels (dim 1 of an NCHW
/// convolution's, else the last dim: a GEMM's N, a `conv_nhwc`'s channels).
fn node_width(body: &Graph, n: &rafter_ir::Node, values: &HashMap<Symbol, i64>) -> Option<f64> {
    let out = &body.value((*n.outputs.first()?)?).ty;
    let nchw = matches!(
        n.op,
        Op::Conv { .. } | Op::ConvInteger { .. } | Op::ConvTranspose { .. }
    );
    let i = if nchw { 1 } else { out.rank().checked_sub(1)? };
    out.dims.get(i).map(|d| dim_value(d, values))
}

/// The geometry of a 2-D `conv` (x NCHW, w `[M, C/group, kh, kw]`) or `conv_nhwc` (x NHWC,
/// w `[kh, kw, C/group, M]`) node, dims at `values`, for the CPU's Winograd rule
/// ([`cpu_winograd`]); `None` for any other node or rank.
fn conv_geometry(
    body: &Graph,
    n: &rafter_ir::Node,
    values: &HashMap<Symbol, i64>,
) -> Option<ConvGeometry> {
    let (strides, dilations, group, nhwc) = match &n.op {
        Op::Conv {
            strides,
            dilations,
            group,
            ..
        } => (strides, dilations, group, false),
        Op::ConvNhwc {
            strides,
            dilations,
            group,
            ..
        } => (strides, dilations, group, true),
        _ => return None,
    };
    let dims_of = |v: rafter_ir::ValueId| -> Vec<usize> {
        let t = &body.value(v).ty;
        t.dims
            .iter()
            .map(|d| dim_value(d, values) as usize)
            .collect()
    };
    let x = body.value(n.input(0)?).ty.dtype;
    let (xd, wd, yd) = (
        dims_of(n.input(0)?),
        dims_of(n.input(1)?),
        dims_of((*n.outputs.first()?)?),
    );
    if xd.len() != 4 || wd.len() != 4 || yd.len() != 4 {
        return None;
    }
    // An empty attribute is ONNX's default of 1 per spatial dim.
    let pair = |v: &[i64]| -> Option<[usize; 2]> {
        match v {
            [] => Some([1, 1]),
            &[a, b] => Some([usize::try_from(a).ok()?, usize::try_from(b).ok()?]),
            _ => None,
        }
    };
    let (window, in_channels, out_pixels) = if nhwc {
        ([wd[0], wd[1]], xd[3], yd[1] * yd[2])
    } else {
        ([wd[2], wd[3]], xd[1], yd[2] * yd[3])
    };
    Some(ConvGeometry {
        window,
        strides: pair(strides)?,
        dilations: pair(dilations)?,
        groups: usize::try_from(*group).ok()?,
        in_channels,
        out_pixels,
        dtype: x,
    })
}

/// `depthwise_conv` (one input channel per group, several groups), `pointwise_conv` (a
/// 1x1 window, one group: a GEMM over pixels) or `conv`.
fn conv_class(group: i64, channels_per_group: Option<f64>, window: f64) -> &'static str {
    if group > 1 && channels_per_group == Some(1.0) {
        "depthwise_conv"
    } else if group == 1 && window == 1.0 {
        "pointwise_conv"
    } else {
        "conv"
    }
}

/// Operations of one node: `2 * outputs * reduction length` for contractions, one per
/// output element for elementwise ops and data movement, one per input element for
/// reductions.
fn node_flops(g: &Graph, n: &rafter_ir::Node, values: &HashMap<Symbol, i64>) -> f64 {
    let ty = |i: usize| n.input(i).map(|v| &g.value(v).ty);
    let elems = |t: Option<&TensorType>| t.map_or(0.0, |t| elements(t, values));
    let dim = |t: Option<&TensorType>, i: usize| -> f64 {
        t.and_then(|t| t.dims.get(i))
            .map_or(1.0, |d| dim_value(d, values))
    };
    let out: f64 = n
        .outputs
        .iter()
        .flatten()
        .map(|&v| elements(&g.value(v).ty, values))
        .sum();
    let last = |t: Option<&TensorType>| t.map_or(1.0, |t| dim(Some(t), t.rank().saturating_sub(1)));
    match &n.op {
        Op::MatMul | Op::MatMulInteger | Op::Linear { .. } => 2.0 * out * last(ty(0)),
        Op::Gemm { trans_a, .. } => {
            let k = if *trans_a {
                dim(ty(0), 0)
            } else {
                dim(ty(0), 1)
            };
            2.0 * out * k
        }
        // w [M, C/group, kernel...]: each output sums C/group * kernel products.
        Op::Conv { .. } | Op::ConvInteger { .. } => {
            2.0 * out * elems(ty(1)) / dim(ty(1), 0).max(1.0)
        }
        // w [kernel..., C/group, M].
        Op::ConvNhwc { .. } => {
            let w = ty(1);
            let m = w.map_or(1.0, |t| dim(Some(t), t.rank().saturating_sub(1)));
            2.0 * out * elems(w) / m.max(1.0)
        }
        // x [N, C, ...], w [C, M/group, kernel...]: each input spreads over M/group * kernel.
        Op::ConvTranspose { .. } => 2.0 * elems(ty(0)) * elems(ty(1)) / dim(ty(1), 0).max(1.0),
        // gate, up, down: three products of [H] x [F] per token and chosen expert.
        Op::MoeFfn { top_k, .. } => {
            let per_expert = elems(ty(2)) / dim(ty(2), 0).max(1.0);
            6.0 * dim(ty(0), 0) * *top_k as f64 * per_expert
        }
        op => match KernelKind::of(op) {
            KernelKind::Reduction => elems(ty(0)).max(out) * reduction_ops(op),
            _ => out * elementwise_ops(op),
        },
    }
}

/// Operations a function evaluated by approximation costs (range reduction and a
/// polynomial or rational fit: `exp`, `erf`, `tanh`, ... take about ten multiply-adds in
/// the CPU's and the SPIR-V kernels), in the units of a multiply or an add.
const APPROXIMATED_OPS: f64 = 10.0;

/// Operations per output element of an elementwise op: one for arithmetic, comparisons
/// and moves; [`APPROXIMATED_OPS`] for the transcendental functions (a GELU is an `erf`
/// and four arithmetic ops), four for a division or square root (their throughput is a
/// quarter of a multiply's). Counted so, a fused GELU is not rated as one add.
fn elementwise_ops(op: &Op) -> f64 {
    use rafter_ir::{BinaryOp as B, UnaryOp as U};
    match op {
        Op::Unary { op } => match op {
            U::Exp
            | U::Log
            | U::Sin
            | U::Cos
            | U::Tan
            | U::Asin
            | U::Acos
            | U::Atan
            | U::Sinh
            | U::Cosh
            | U::Tanh
            | U::Asinh
            | U::Acosh
            | U::Atanh
            | U::Erf
            | U::Sigmoid
            | U::Softplus
            | U::Mish => APPROXIMATED_OPS,
            U::Sqrt | U::Reciprocal => 4.0,
            _ => 1.0,
        },
        Op::Binary {
            op: B::Div | B::Pow | B::Mod | B::FMod,
        } => 4.0,
        Op::Gelu { .. } | Op::Elu { .. } | Op::Selu { .. } | Op::Celu { .. } => {
            APPROXIMATED_OPS + 4.0
        }
        _ => 1.0,
    }
}

/// Operations per input element of a reduction or normalisation: a softmax takes the
/// maximum, subtracts it, exponentiates, sums and scales (four ops and an `exp`); a layer
/// norm sums, centres, squares and sums, scales, and applies its scale and bias (seven); an
/// RMS norm four; an LRN squares and sums its window (two per channel of it), scales and
/// raises to a power (an approximated function) and divides; a plain reduction one.
fn reduction_ops(op: &Op) -> f64 {
    match op {
        Op::Lrn { size, .. } => 2.0 * (*size).max(1) as f64 + APPROXIMATED_OPS + 6.0,
        Op::Softmax { .. } => 4.0 + APPROXIMATED_OPS,
        Op::LayerNorm { .. } | Op::GroupNorm { .. } | Op::InstanceNorm { .. } => 7.0,
        Op::MeanVarianceNorm { .. } => 6.0,
        Op::RmsNorm { .. } | Op::LpNorm { .. } => 4.0,
        _ => 1.0,
    }
}

/// Seconds a part of `flops` and reduction `depth` takes at class rate `r` by the fit
/// alone (no dispatch, no residual, f32): its flops with the ramp, and its depth's steps.
pub fn fitted_s(flops: f64, depth: f64, r: ClassRate) -> f64 {
    (flops + r.half_flops) / r.flops_per_s + depth * r.depth_s
}

/// Seconds `work` takes on a device with `profile`. A kernel with contraction or
/// attention parts takes the sum of their times at their classes' rates, each corrected
/// by the residuals of the class's probes near it ([`CostProfile::correction`]) (its fused
/// elementwise epilogues ride on those passes and add nothing); any other kernel its
/// flops at its kind's rate. Either way, no less than its bytes at the main class's
/// bandwidth.
pub fn kernel_time(work: &KernelWork, profile: &CostProfile) -> f64 {
    // Half-precision compute runs at the class's own scale, else the device's.
    // A depth's steps run at the same scale as the flops: a GPU's f16 matrix units take
    // several of K's steps at once.
    let at_rate = |f: f64, depth: f64, r: ClassRate| {
        let t = fitted_s(f, depth, r);
        let scale = r.half_scale.unwrap_or(profile.half_scale);
        if work.half && scale > 0.0 {
            t / scale
        } else {
            t
        }
    };
    let r = profile.rate_of(work.detail, work.class);
    let parts: f64 = DETAIL_CLASSES
        .iter()
        .zip(work.detail_flops.iter().zip(&work.detail_depth))
        .zip(&work.detail_width)
        .filter(|((_, (&f, _)), _)| f > 0.0)
        .map(|((&c, (&f, &depth)), &width)| {
            let near = profile.correction(Some(c), work.class, f, depth, width);
            at_rate(f, depth, profile.rate_of(Some(c), work.class)) * near
        })
        .sum();
    // A kernel of no contraction runs its half-precision work no faster than f32 (its
    // bytes, already counted at their width, are what f16 saves): a GPU's matrix units,
    // which the device's scale measures, serve only products, and scaling a streaming
    // class's fixed cost by them rated the H200's f16 layer norms and softmaxes at half
    // their time (BERT-base f16's reductions 0.48 of their time, 2026-12-01). A device
    // slower at f16 (a CPU converting it) is slower at it everywhere it computes, but not
    // where it only moves elements: a gather or transpose of f16 copies two-byte elements
    // and converts none (BERT-base f16's embedding gathers on the H200 machine's host were
    // estimated at 0.99 ms, the CPU's GEMM f16 scale of 0.025 dividing them, and ran 0.02).
    let unscaled_half = work.class == KernelKind::DataMovement
        || (work.class != KernelKind::Contraction
            && profile.half_scale > 1.0
            && r.half_scale.is_none());
    let compute = if parts > 0.0 {
        parts
    } else if unscaled_half {
        fitted_s(work.flops, 0.0, r)
    } else {
        at_rate(work.flops, 0.0, r)
    };
    let memory = work.bytes / r.bytes_per_s;
    profile.with_dispatch(compute.max(memory))
}

/// Seconds for `bytes` to cross `link` to a device waiting with `waiter`'s barrier cost.
/// The bytes cross the link's bus unless the device's memory is the host's
/// ([`Link::in_place`]): a copy moves them, and a zero-copy tensor in host memory is
/// reached over the bus by the device's kernels, at the link's rate either way.
pub fn crossing_time(bytes: f64, link: &Link, waiter: &DeviceDescription) -> f64 {
    let copy = if link.in_place() {
        0.0
    } else {
        bytes / link.bytes_per_s
    };
    link.latency_s + copy + waiter.profile.barrier_s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn program(text: &str) -> Program {
        let g = rafter_ir::text::parse_graph(text).unwrap();
        crate::lower(&g, &crate::LowerOptions::default()).unwrap()
    }

    fn profile(flops: f64, bw: f64, half: f64, dispatch: f64) -> CostProfile {
        let mut classes = BTreeMap::new();
        for k in super::super::device::CLASSES {
            classes.insert(
                super::super::device::class_name(k),
                ClassRate {
                    flops_per_s: flops,
                    bytes_per_s: bw,
                    half_flops: half,
                    half_scale: None,
                    depth_s: 0.0,
                },
            );
        }
        CostProfile {
            classes,
            dispatch_s: dispatch,
            barrier_s: 0.0,
            half_scale: 1.0,
            dispatch_overlaps: false,
            residuals: BTreeMap::new(),
            weight_cache: None,
        }
    }

    /// A contraction part shaped like a calibration probe takes that probe's residual;
    /// a part far from it, the fit alone.
    #[test]
    fn a_part_near_a_probe_takes_its_residual() {
        let gemm = DETAIL_CLASSES.iter().position(|&c| c == "gemm").unwrap();
        let work = |flops: f64| {
            let mut detail_flops = [0.0; DETAIL_CLASSES.len()];
            let mut detail_depth = [0.0; DETAIL_CLASSES.len()];
            detail_flops[gemm] = flops;
            detail_depth[gemm] = 384.0;
            KernelWork {
                class: KernelKind::Contraction,
                detail: Some("gemm"),
                detail_flops,
                detail_depth,
                detail_width: Default::default(),
                flops,
                bytes: 1e3,
                half: false,
            }
        };
        // 1e12 FLOP/s, no dispatch: 1e8 flops take 100 us by the fit.
        let mut p = profile(1e12, 1e12, 0.0, 0.0);
        p.classes.insert("gemm", p.rate(KernelKind::Contraction));
        assert!((kernel_time(&work(1e8), &p) - 1e-4).abs() < 1e-12);
        p.residuals.insert(
            "gemm",
            vec![super::super::device::Residual {
                flops: 1e8,
                depth: 384.0,
                width: 0.0,
                ratio: 2.0,
            }],
        );
        let at_probe = kernel_time(&work(1e8), &p);
        assert!(
            (at_probe - 1e-4 * 2f64.powf(1.0 / 1.1)).abs() < 1e-12,
            "{at_probe}"
        );
        let far = kernel_time(&work(1e10), &p);
        assert!((far - 1e-2).abs() < 1e-9, "{far}");
    }

    /// A GPU-like profile prepares the next launch while a kernel runs: a kernel costs
    /// the longer of its dispatch and its work; a CPU-like one, their sum.
    #[test]
    fn an_overlapped_dispatch_costs_the_longer_of_it_and_the_work() {
        let work = KernelWork {
            class: KernelKind::Elementwise,
            detail: None,
            detail_flops: Default::default(),
            detail_depth: Default::default(),
            detail_width: Default::default(),
            flops: 0.0,
            bytes: 4e4,
            half: false,
        };
        // 40 KB at 1e10 B/s: 4 us of work.
        let mut p = profile(1e12, 1e10, 0.0, 3e-6);
        assert!((kernel_time(&work, &p) - 7e-6).abs() < 1e-12);
        p.dispatch_overlaps = true;
        assert!((kernel_time(&work, &p) - 4e-6).abs() < 1e-12);
        // A kernel shorter than its dispatch costs the dispatch.
        p.dispatch_s = 5e-6;
        assert!((kernel_time(&work, &p) - 5e-6).abs() < 1e-12);
    }

    #[test]
    fn a_matmul_counts_two_flops_per_multiply_add_and_its_io_bytes() {
        let p = program(
            "graph @g(%a: f32[8, 16], %b: f32[16, 4]) -> (%y) {\n  %y: f32[8, 4] = matmul(%a, %b)\n}",
        );
        let w = kernel_work(&p.kernels[0], &bound_values(&p));
        assert_eq!(w.class, KernelKind::Contraction);
        assert_eq!(w.detail, Some("gemm"));
        assert_eq!(w.flops, 2.0 * 8.0 * 4.0 * 16.0);
        assert_eq!(w.bytes, 4.0 * (8.0 * 16.0 + 16.0 * 4.0 + 8.0 * 4.0));
    }

    fn conv_detail(c: i64, m: i64, k: i64, group: i64) -> Option<&'static str> {
        let cg = c / group;
        let p = k / 2;
        let text = format!(
            "graph @g(%x: f32[1, {c}, 8, 8], %w: f32[{m}, {cg}, {k}, {k}]) -> (%y) {{\n  \
             %y: f32[1, {m}, 8, 8] = conv{{kernel_shape = [{k}, {k}], strides = [1, 1], \
             pads = [{p}, {p}, {p}, {p}], dilations = [1, 1], group = {group}, \
             auto_pad = explicit}}(%x, %w)\n}}"
        );
        let g = rafter_ir::text::parse_graph(&text).unwrap();
        detail_class(&g, &HashMap::new())
    }

    #[test]
    fn convolutions_are_told_apart_by_window_and_groups() {
        assert_eq!(conv_detail(16, 32, 3, 1), Some("conv"));
        assert_eq!(conv_detail(16, 32, 1, 1), Some("pointwise_conv"));
        assert_eq!(conv_detail(16, 16, 3, 16), Some("depthwise_conv"));
        // Grouped but not depthwise (two channels per group): a convolution.
        assert_eq!(conv_detail(16, 16, 3, 8), Some("conv"));
    }

    /// The detail class of a 3x3 `conv` (or, with `nhwc`, `conv_nhwc`) of `c` to 32
    /// channels on an `hw`x`hw` map in `dtype`, stride `s`, padding 1.
    fn conv3x3_detail(c: usize, hw: usize, s: usize, dtype: &str, nhwc: bool) -> &'static str {
        let o = (hw + 2 - 3) / s + 1;
        let attrs = format!(
            "kernel_shape = [3, 3], strides = [{s}, {s}], pads = [1, 1, 1, 1], \
             dilations = [1, 1], group = 1, auto_pad = explicit"
        );
        let text = if nhwc {
            format!(
                "graph @g(%x: {dtype}[1, {hw}, {hw}, {c}], %w: {dtype}[3, 3, {c}, 32]) -> (%y) {{\n  \
                 %y: {dtype}[1, {o}, {o}, 32] = conv_nhwc{{{attrs}}}(%x, %w)\n}}"
            )
        } else {
            format!(
                "graph @g(%x: {dtype}[1, {c}, {hw}, {hw}], %w: {dtype}[32, {c}, 3, 3]) -> (%y) {{\n  \
                 %y: {dtype}[1, 32, {o}, {o}] = conv{{{attrs}}}(%x, %w)\n}}"
            )
        };
        let g = rafter_ir::text::parse_graph(&text).unwrap();
        detail_class(&g, &HashMap::new()).unwrap()
    }

    #[test]
    fn winograd_convolutions_are_a_class_of_their_own() {
        for nhwc in [false, true] {
            // 10x10 = 100 output pixels, the CPU's threshold (`cpu_winograd`), and above.
            assert_eq!(conv3x3_detail(16, 10, 1, "f32", nhwc), "winograd_conv");
            assert_eq!(conv3x3_detail(64, 56, 1, "f32", nhwc), "winograd_conv");
            // Too few pixels (ResNet-50's 7x7), stride 2, an RGB stem, half precision:
            // direct convolutions, as the CPU runs them.
            assert_eq!(conv3x3_detail(512, 7, 1, "f32", nhwc), "conv");
            assert_eq!(conv3x3_detail(128, 56, 2, "f32", nhwc), "conv");
            assert_eq!(conv3x3_detail(3, 56, 1, "f32", nhwc), "conv");
            assert_eq!(conv3x3_detail(64, 56, 1, "f16", nhwc), "conv");
        }
    }

    #[test]
    fn a_winograd_convolution_takes_its_rate_else_the_convolutions() {
        // Two kernels of the same flops: ResNet-50's stage-1 3x3 (Winograd on the CPU) and
        // a stride-2 one of the same output size (direct).
        let conv = |s: usize, hw: usize| {
            program(&format!(
                "graph @g(%x: f32[1, 64, {hw}, {hw}], %w: f32[64, 64, 3, 3]) -> (%y) {{\n  \
                 %y: f32[1, 64, 56, 56] = conv{{kernel_shape = [3, 3], strides = [{s}, {s}], \
                 pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, \
                 auto_pad = explicit}}(%x, %w)\n}}"
            ))
        };
        let (wino, direct) = (conv(1, 56), conv(2, 111));
        let w = kernel_work(&wino.kernels[0], &bound_values(&wino));
        let d = kernel_work(&direct.kernels[0], &bound_values(&direct));
        assert_eq!(w.detail, Some("winograd_conv"));
        assert_eq!(d.detail, Some("conv"));
        assert_eq!(w.flops, d.flops);
        let rate = |flops_per_s: f64| ClassRate {
            flops_per_s,
            bytes_per_s: 1e15,
            half_flops: 0.0,
            half_scale: None,
            depth_s: 0.0,
        };
        let mut p = profile(1e9, 1e15, 0.0, 0.0);
        // Without a rate of its own (a GPU's profile, an older CPU one): the conv rate.
        p.classes.insert("conv", rate(1e11));
        assert_eq!(kernel_time(&w, &p), kernel_time(&d, &p));
        assert!((kernel_time(&w, &p) - w.flops / 1e11).abs() < 1e-12);
        // With one, only the Winograd convolution takes it.
        p.classes.insert("winograd_conv", rate(2e11));
        assert!((kernel_time(&w, &p) - w.flops / 2e11).abs() < 1e-12);
        assert!((kernel_time(&d, &p) - d.flops / 1e11).abs() < 1e-12);
    }

    #[test]
    fn a_gathered_table_counts_the_rows_read() {
        let p = program(
            "graph @g(%t: f32[1000, 8], %i: i64[2]) -> (%y) {\n  \
             %y: f32[2, 8] = gather{axis = 0}(%t, %i)\n}",
        );
        let w = kernel_work(&p.kernels[0], &bound_values(&p));
        // Rows read (2 x 8 f32) + indices (2 i64) + result (2 x 8 f32), not the table.
        assert_eq!(w.bytes, 64.0 + 16.0 + 64.0);
    }

    #[test]
    fn symbolic_dims_take_their_bound_and_unbounded_ones_count_as_one() {
        let mut p = program(
            "graph @g(%x: f32[n, m, 8]) -> (%y) {\n  %y: f32[n, m, 8] = unary{op = relu}(%x)\n}",
        );
        p.bounds = vec![(Symbol::new("n"), 10)];
        let w = kernel_work(&p.kernels[0], &bound_values(&p));
        assert_eq!(w.flops, 80.0);
        assert_eq!(w.bytes, 2.0 * 4.0 * 80.0);
    }

    #[test]
    fn a_cumulative_sum_streams_its_tensor_in_and_out_once() {
        // CumSum over the channels of `[1, 64, 56, 56]` (the midgraph benchmark's): one add
        // per element, the tensor read once and written once; its constant axis is copied
        // into the body, so it is no operand. On the default CPU profile it is memory
        // bound: 1.6 MB at 10 GB/s, 0.16 ms.
        let p = program(
            "graph @g(%x: f32[1, 64, 56, 56]) -> (%y) {\n  \
             const %a: i64[] = dense [1]\n  \
             %y: f32[1, 64, 56, 56] = cumulative{kind = sum, exclusive = false, \
             reverse = false}(%x, %a)\n}",
        );
        let k = &p.kernels[0];
        assert_eq!(k.kind, KernelKind::Reduction);
        let w = kernel_work(k, &bound_values(&p));
        let n = 64.0 * 56.0 * 56.0;
        assert_eq!(w.flops, n);
        assert_eq!(w.bytes, 2.0 * 4.0 * n);
        let cpu = DeviceDescription::default_for(crate::backend::CPU);
        let t = kernel_time(&w, &cpu.profile);
        let r = cpu.profile.rate(KernelKind::Reduction);
        let compute = (w.flops + r.half_flops) / r.flops_per_s;
        let want = cpu.profile.dispatch_s + (w.bytes / r.bytes_per_s).max(compute);
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
        assert!(t < 1e-3, "{t}");
    }

    #[test]
    fn an_lrn_counts_its_window_and_its_power_per_element() {
        // The midgraph benchmark's LRN (size 5): two ops per window channel, the power
        // (an approximated function), scale, bias and division: 2 * 5 + 10 + 6.
        let p = program(
            "graph @g(%x: f32[1, 64, 56, 56]) -> (%y) {\n  \
             %y: f32[1, 64, 56, 56] = lrn{alpha = 0.0001, beta = 0.75, bias = 2.0, \
             size = 5}(%x)\n}",
        );
        let w = kernel_work(&p.kernels[0], &bound_values(&p));
        assert_eq!(w.flops, 26.0 * 64.0 * 56.0 * 56.0);
    }

    #[test]
    fn time_is_the_roofline_with_ramp_plus_dispatch() {
        let w = KernelWork {
            class: KernelKind::Contraction,
            detail: None,
            detail_flops: [0.0; DETAIL_CLASSES.len()],
            detail_depth: [0.0; DETAIL_CLASSES.len()],
            detail_width: [0.0; DETAIL_CLASSES.len()],
            flops: 1e9,
            bytes: 1e6,
            half: false,
        };
        // Compute bound: (1e9 + 1e9) / 1e12 = 2 ms, memory 1e6 / 1e9 = 1 ms.
        let t = kernel_time(&w, &profile(1e12, 1e9, 1e9, 1e-5));
        assert!((t - 2.01e-3).abs() < 1e-12, "{t}");
        // Memory bound on a slow bus.
        let t = kernel_time(&w, &profile(1e12, 1e8, 0.0, 0.0));
        assert!((t - 1e-2).abs() < 1e-12, "{t}");
    }

    #[test]
    fn a_deep_narrow_product_pays_for_its_depth() {
        // ResNet-50's last 3x3 convolution: 512 x 7 x 7 outputs, each a sum of 4,608
        // products. Its depth is counted per output, and a class's depth cost adds to its
        // compute time (a plain product of the same flops but depth 64 pays little).
        let deep = program(
            "graph @g(%x: f32[1, 512, 7, 7], %w: f32[512, 512, 3, 3]) -> (%y) {\n  \
             %y: f32[1, 512, 7, 7] = conv{kernel_shape = [3, 3], strides = [1, 1], \
             pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %w)\n}",
        );
        let w = kernel_work(&deep.kernels[0], &bound_values(&deep));
        let conv = DETAIL_CLASSES.iter().position(|&c| c == "conv").unwrap();
        assert_eq!(w.detail_depth[conv], 4608.0);
        let mut p = profile(1e12, 1e15, 0.0, 0.0);
        let plain = kernel_time(&w, &p);
        assert!((plain - w.flops / 1e12).abs() < 1e-15);
        for r in p.classes.values_mut() {
            r.depth_s = 1e-8;
        }
        let t = kernel_time(&w, &p);
        assert!((t - plain - 4608.0 * 1e-8).abs() < 1e-15, "{t} vs {plain}");
    }

    #[test]
    fn a_cast_to_half_is_not_half_precision_compute() {
        // MobileNetV2 f16's output: 1,000 logits cast to f16. Only arithmetic with a half
        // result runs at the half scale; a conversion runs at the class's rate.
        let cast = program(
            "graph @g(%x: f32[1, 1000]) -> (%y) {\n  %y: f16[1, 1000] = cast{to = f16}(%x)\n}",
        );
        let w = kernel_work(&cast.kernels[0], &bound_values(&cast));
        assert!(!w.half);
        let add = program(
            "graph @g(%x: f16[1, 1000]) -> (%y) {\n  %y: f16[1, 1000] = binary{op = add}(%x, %x)\n}",
        );
        assert!(kernel_work(&add.kernels[0], &bound_values(&add)).half);
        let mut p = profile(1e12, 1e12, 1e6, 0.0);
        p.half_scale = 0.04;
        let t = kernel_time(&w, &p);
        assert!((t - (1e3 + 1e6) / 1e12).abs() < 1e-15, "{t}");
    }

    #[test]
    fn half_precision_compute_runs_at_the_half_scale() {
        let w = KernelWork {
            class: KernelKind::Contraction,
            detail: None,
            detail_flops: [0.0; DETAIL_CLASSES.len()],
            detail_depth: [0.0; DETAIL_CLASSES.len()],
            detail_width: [0.0; DETAIL_CLASSES.len()],
            flops: 1e9,
            bytes: 1e3,
            half: true,
        };
        let mut p = profile(1e12, 1e12, 0.0, 0.0);
        assert!((kernel_time(&w, &p) - 1e-3).abs() < 1e-12);
        // A CPU converting f16 in software, 20x slower; a GPU's matrix units, 4x faster.
        p.half_scale = 0.05;
        assert!((kernel_time(&w, &p) - 2e-2).abs() < 1e-12);
        p.half_scale = 4.0;
        assert!((kernel_time(&w, &p) - 2.5e-4).abs() < 1e-12);
        // A kernel of no contraction (a layer norm) gains nothing from matrix units, but
        // loses what a device slow at f16 loses.
        let norm = KernelWork {
            class: KernelKind::Reduction,
            ..w
        };
        assert!((kernel_time(&norm, &p) - 1e-3).abs() < 1e-12);
        p.half_scale = 0.05;
        assert!((kernel_time(&norm, &p) - 2e-2).abs() < 1e-12);
        // A kernel that only moves elements (an f16 gather) converts none: unscaled on
        // either device.
        let gather = KernelWork {
            class: KernelKind::DataMovement,
            ..w
        };
        assert!((kernel_time(&gather, &p) - 1e-3).abs() < 1e-12);
        p.half_scale = 4.0;
        assert!((kernel_time(&gather, &p) - 1e-3).abs() < 1e-12);
        // An f32 kernel is not scaled.
        let f32_work = KernelWork { half: false, ..w };
        assert!((kernel_time(&f32_work, &p) - 1e-3).abs() < 1e-12);
        // A class with a scale of its own (f16 convolutions gaining less than GEMMs).
        for r in p.classes.values_mut() {
            r.half_scale = Some(2.0);
        }
        assert!((kernel_time(&w, &p) - 5e-4).abs() < 1e-12);
        assert!((kernel_time(&f32_work, &p) - 1e-3).abs() < 1e-12);
    }

    #[test]
    fn a_kernel_with_an_f16_result_is_half() {
        let p = program(
            "graph @g(%a: f16[4, 8], %b: f16[8, 2]) -> (%y) {\n  %y: f16[4, 2] = matmul(%a, %b)\n}",
        );
        assert!(kernel_work(&p.kernels[0], &bound_values(&p)).half);
    }

    #[test]
    fn a_crossing_pays_the_bus_unless_the_devices_memory_is_the_hosts() {
        let waiter = DeviceDescription::default_for("cpu");
        let mut link = Link {
            bytes_per_s: 1e9,
            latency_s: 1e-5,
            zero_copy: false,
            shared_memory: crate::partition::SharedMemory::Device,
        };
        let t = crossing_time(1e6, &link, &waiter);
        assert!((t - (1e-5 + 1e-3 + 1e-6)).abs() < 1e-12, "{t}");
        link.zero_copy = true;
        let t = crossing_time(1e6, &link, &waiter);
        assert!((t - (1e-5 + 1e-6)).abs() < 1e-12, "{t}");
        // Shared in host memory (a discrete GPU): no copy step, but the bytes still cross
        // the bus inside the kernels.
        link.shared_memory = crate::partition::SharedMemory::Host;
        let t = crossing_time(1e6, &link, &waiter);
        assert!((t - (1e-5 + 1e-3 + 1e-6)).abs() < 1e-12, "{t}");
    }
}
