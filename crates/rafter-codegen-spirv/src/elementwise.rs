//! Fused elementwise kernels on f32 and f16 buffers (computed in f32).

use std::collections::{HashMap, HashSet};

use rafter_ir::{
    BinaryOp, DType, Dim, GeluApprox, Graph, Op, ReduceKind, SoftmaxKind, UnaryOp, ValueDef,
    ValueId,
};
use rafter_vulkan_section::{dim_params, DimParam, Launch, MAX_DIM_PARAMS};
use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{
    BuiltIn, Decoration, LoopControl, MemoryAccess, MemorySemantics, Scope, SelectionControl,
    StorageClass, Word,
};

use crate::elem::{self, Elem};
use crate::matmul::begin_main;
use crate::CodegenError;

/// Invocations per workgroup of an elementwise kernel.
pub const WORKGROUP_SIZE: u32 = 64;

/// Invocations per workgroup of a row kernel ([`Launch::Rows`]: a layer norm, a softmax
/// over the last axis), which reduce a row together through workgroup memory.
pub const ROW_WORKGROUP_SIZE: u32 = 128;

/// The most elements one dispatch covers: element indices are 32-bit and SPIR-V treats
/// access-chain indices as signed, so indices stay below 2^31 (8 GiB of f32 per tensor).
const MAX_ELEMENTS: u64 = (1 << 31) - 1;

/// How a kernel input is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// One element per output element (the output's shape).
    Tensor,
    /// A single element, broadcast to every output element.
    Scalar,
    /// NumPy broadcasting of a smaller tensor (dims of 1, or missing leading dims) to the
    /// output's shape, or the input of a transpose: its element index is computed from the
    /// output's coordinates and per-dim strides (symbolic sizes come from dim params).
    Broadcast,
    /// Indexed by the position along a normalised lane (a layer norm's scale and bias).
    Lane,
    /// A layer norm's prologue operand repeating over x's leading dims: its dims, after
    /// leading 1s, are x's trailing dims, whole rows of them (BERT's position embeddings
    /// `[1, seq, 768]` added to `[batch, seq, 768]`). Its element index is x's flat index
    /// modulo its element count.
    Repeated,
    /// Bound but never read: the shape or axes operand of a reshape-like op.
    Unread,
}

/// A generated elementwise kernel and how to launch it.
#[derive(Debug, Clone)]
pub struct ElementwiseKernel {
    /// The SPIR-V module.
    pub spirv: Vec<u32>,
    /// Its one entry point's name.
    pub entry_point: String,
    /// How each body input is read, in binding order.
    pub inputs: Vec<Operand>,
    /// Number of outputs; their bindings follow the inputs'.
    pub outputs: usize,
    /// The symbolic sizes the kernel reads after the count (the artifact's dim params).
    pub dims: Vec<DimParam>,
    /// How it is launched: [`Launch::Elementwise`] (a grid over elements, or one invocation
    /// per lane), or [`Launch::Rows`] (a workgroup per row).
    pub launch: Launch,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
}

impl ElementwiseKernel {
    /// The push-constant params of a call: the count, then the kernel's dim params taken
    /// from `binding_dims` (each binding's dims, inputs then outputs).
    pub fn params_for(&self, count: u64, binding_dims: &[&[usize]]) -> Result<Vec<u8>, String> {
        let mut params = Self::params(count)?;
        params.extend(dim_params(&self.dims, binding_dims)?);
        Ok(params)
    }

    /// The push-constant params for `count` elements: one little-endian `u32`.
    pub fn params(count: u64) -> Result<Vec<u8>, String> {
        if count > MAX_ELEMENTS {
            return Err(format!(
                "{count} elements exceed the {MAX_ELEMENTS} one elementwise dispatch covers"
            ));
        }
        Ok((count as u32).to_le_bytes().to_vec())
    }

    /// The workgroup grid for `count` elements: enough workgroups for one element per
    /// invocation, capped at `max_x` (the device's limit; the grid-stride loop covers the
    /// rest).
    pub fn workgroups(count: u64, max_x: u32) -> [u32; 3] {
        let needed = count.div_ceil(WORKGROUP_SIZE as u64);
        [needed.min(max_x.max(1) as u64) as u32, 1, 1]
    }
}

/// Compiles an elementwise body: inputs and outputs f32 or f16 (mixed through `cast`), every
/// op elementwise, every input
/// and intermediate of the output's shape, of one element, or broadcast to the output or
/// read through a transpose (symbolic sizes from dim params, [`ElementwiseKernel::dims`]);
/// or with reshape-like ops, every value of the output's element count. A body that is one
/// `reduce` or softmax, or ends in a `layer_norm`, is compiled by row loops instead (same
/// launch: the count is the output's element count).
///
/// Supported ops: `identity`, `cast` between f32 and f16, every float `unary` (abs ... hard_swish),
/// the arithmetic `binary` ops (add, sub, mul, div, pow, mod, fmod, max, min, prelu),
/// `clip`, `leaky_relu`, `elu`, `selu`, `celu`, `hard_sigmoid`, `thresholded_relu`, `is_inf`,
/// `shrink`, `gelu`, `reshape`, `flatten`, `squeeze`, `unsqueeze`, `expand`, `transpose`;
/// a `reduce` (static shapes) after a pointwise prologue; `softmax`/`log_softmax`/`hardmax`
/// or `lp_norm` alone;
/// `layer_norm` after a pointwise prologue. Scalar constants are folded into the module, and
/// constants of up to [`MAX_CONST_ARRAY`] elements that broadcast to the output as arrays.
pub fn elementwise(body: &Graph) -> Result<ElementwiseKernel, CodegenError> {
    let error = |reason: String| CodegenError {
        kernel: body.name.clone(),
        reason,
    };
    let Some(&first_output) = body.outputs.first() else {
        return Err(error("the body has no outputs".into()));
    };
    if body
        .nodes
        .last()
        .is_some_and(|n| matches!(n.op, Op::Reduce { .. }))
    {
        return reduction(body).map_err(error);
    }
    if let [node] = &body.nodes[..] {
        if matches!(node.op, Op::Softmax { .. } | Op::LpNorm { .. }) {
            return softmax(body).map_err(error);
        }
    }
    if body
        .nodes
        .last()
        .is_some_and(|n| matches!(n.op, Op::LayerNorm { .. } | Op::RmsNorm { .. }))
    {
        return layer_norm(body).map_err(error);
    }
    // Ops first, so a reduction or a matmul is reported as such, not by its shapes.
    for node in &body.nodes {
        let known = is_pointwise(&node.op)
            || is_view(&node.op)
            || matches!(node.op, Op::Transpose { .. } | Op::Expand);
        if !known {
            return Err(error(format!(
                "op `{}` (node `{}`) is not generated for Vulkan yet",
                node.op.name(),
                node.name
            )));
        }
    }
    let shape = &body.value(first_output).ty.dims;
    // Classify every value: full shape, a single element, or broadcast to the output.
    let is_scalar = |v: ValueId| body.value(v).ty.num_elements().as_known() == Some(1);
    // Values read only as the shape or axes operand of a reshape-like op: never loaded.
    let mut meta: HashSet<ValueId> = HashSet::new();
    let mut data_uses: HashMap<ValueId, usize> = HashMap::new();
    for node in &body.nodes {
        for (k, v) in node.inputs.iter().enumerate() {
            if let Some(v) = v {
                if k > 0 && (is_view(&node.op) || matches!(node.op, Op::Expand)) {
                    meta.insert(*v);
                } else {
                    *data_uses.entry(*v).or_default() += 1;
                }
            }
        }
    }
    meta.retain(|v| !data_uses.contains_key(v) && !body.outputs.contains(v));
    let has_view = body.nodes.iter().any(|n| is_view(&n.op));
    // Inputs read through a transpose: strides per output dim from the permutation.
    let mut transposed: HashMap<ValueId, Vec<Stride>> = HashMap::new();
    for node in &body.nodes {
        let Op::Transpose { perm } = &node.op else {
            continue;
        };
        let (Some(Some(x)), Some(Some(y))) = (node.inputs.first(), node.outputs.first()) else {
            return Err(error(format!("transpose `{}` has no operand", node.name)));
        };
        let strides = (|| {
            if has_view
                || !body.inputs.contains(x)
                || data_uses.get(x) != Some(&1)
                || body.value(*y).ty.dims != *shape
            {
                return None;
            }
            transpose_strides(&body.value(*x).ty.dims, perm, shape)
        })()
        .ok_or_else(|| {
            error(format!(
                "transpose `{}` is generated only on a kernel input read once, to the \
                 output's shape, without reshapes in the kernel",
                node.name
            ))
        })?;
        transposed.insert(*x, strides);
    }
    // Per-axis scales and zero points of a quantize or dequantize: 1-D along its axis.
    for node in &body.nodes {
        for (v, strides) in quant_axis_strides(body, node, shape, has_view).map_err(error)? {
            transposed.insert(v, strides);
        }
    }
    let strides_of = |v: ValueId| -> Option<Vec<Stride>> {
        if let Some(t) = transposed.get(&v) {
            return Some(t.clone());
        }
        if has_view {
            return None;
        }
        broadcast_strides(&body.value(v).ty.dims, shape)
    };
    let out_count = count_through_views(body, first_output);
    // Reshape-like ops keep the linear order: with them, every value has the output's
    // element count (or one element).
    let linear = |v: ValueId| has_view && count_through_views(body, v) == out_count;
    // Constants of several elements broadcast to the output (a folded mask row): arrays in
    // the module, read through their strides like a broadcast input.
    let mut const_arrays: Vec<(ValueId, Vec<f32>, Vec<Stride>)> = Vec::new();
    for i in 0..body.values.len() {
        let v = ValueId(i as u32);
        let value = body.value(v);
        if meta.contains(&v) {
            continue;
        }
        Elem::of_any(value.ty.dtype)
            .map_err(|e| error(format!("value %{} (#{i}) is {e}", value.name)))?;
        // Constants are folded into the module: one literal, or an array of a few that
        // broadcasts to the output.
        if let ValueDef::Const(c) = value.def {
            let data = body.constant(c);
            let n = data.num_elements();
            if n != 1 {
                let array = strides_of(v)
                    .filter(|_| n <= MAX_CONST_ARRAY)
                    .zip(exact_f32s(data));
                let Some((strides, values)) = array else {
                    return Err(error(format!(
                        "constant %{} has {n} elements; only single-element constants and \
                         arrays of at most {MAX_CONST_ARRAY} broadcasting to the output are \
                         folded in",
                        value.name
                    )));
                };
                const_arrays.push((v, values, strides));
            }
        }
        if &value.ty.dims != shape && !is_scalar(v) && !linear(v) && strides_of(v).is_none() {
            return Err(error(format!(
                "value %{} of {} does not broadcast to the output's {} (dims must be equal \
                 or 1)",
                value.name,
                value.ty,
                body.value(first_output).ty
            )));
        }
    }
    // A body f32 registers cannot compute exactly is computed in 64-bit integers when every
    // value is an integer or bool (`integer`); otherwise it is refused with the reason.
    let int_mode = match check_integers(body, &meta) {
        Ok(()) => false,
        Err(why) => {
            crate::integer::check(body, &meta).map_err(|e| error(format!("{why}; {e}")))?;
            true
        }
    };
    if let (true, Some((v, ..))) = (int_mode, const_arrays.first()) {
        return Err(error(format!(
            "constant %{} of several elements in an integer kernel (only single-element \
             constants are folded into those)",
            body.value(*v).name
        )));
    }
    for &output in &body.outputs {
        if body.value(output).ty.dims != *shape {
            return Err(error(format!(
                "output %{} does not have the first output's dims",
                body.value(output).name
            )));
        }
    }
    let mut strides = Vec::with_capacity(body.inputs.len());
    let inputs: Vec<Operand> = body
        .inputs
        .iter()
        .map(|&v| {
            strides.push(None);
            if meta.contains(&v) {
                Operand::Unread
            } else if let Some(t) = transposed.get(&v) {
                *strides.last_mut().expect("pushed") = Some(t.clone());
                Operand::Broadcast
            } else if body.value(v).ty.dims == *shape || linear(v) {
                Operand::Tensor
            } else if is_scalar(v) {
                Operand::Scalar
            } else {
                *strides.last_mut().expect("pushed") = strides_of(v);
                Operand::Broadcast
            }
        })
        .collect();
    // Sizes the broadcast indexing needs: the output's dims and the strides' factors.
    let mut table = DimTable::default();
    if inputs.contains(&Operand::Broadcast) || !const_arrays.is_empty() {
        for d in shape {
            table.need(body, d).map_err(error)?;
        }
        let array_strides = const_arrays.iter().flat_map(|(_, _, s)| s);
        for d in strides
            .iter()
            .flatten()
            .flatten()
            .chain(array_strides)
            .flatten()
            .flatten()
        {
            table.need(body, d).map_err(error)?;
        }
    }
    let mut emitter = Emitter::new(body, &inputs, strides, shape.clone(), meta);
    emitter.int_mode = int_mode;
    for (v, values, strides) in const_arrays {
        emitter.lane_consts.push((v, values));
        emitter.const_strides.push((v, strides));
    }
    emitter.table = table;
    let dims = emitter.table.params.clone();
    let spirv = emitter.emit().map_err(error)?;
    Ok(ElementwiseKernel {
        spirv,
        entry_point: "main".into(),
        inputs,
        outputs: body.outputs.len(),
        dims,
        launch: Launch::Elementwise,
        workgroup_size: WORKGROUP_SIZE,
    })
}

/// Checks that every integer and bool value of an elementwise body is computed exactly in
/// the kernel's f32 registers (bools as 0.0 and 1.0):
/// - an integer or bool result comes from an op that only moves or compares values (a cast
///   from a float or a bool, `where`, a reshape-like op, `expand`, `transpose`), or a
///   comparison, logic op, `not` or `is_nan` yielding bool; integer arithmetic (which
///   wraps) and casts between integer types (which wrap too) are refused;
/// - an i32 or i64 value, which f32 holds exactly only up to 2^24, is read only by a cast
///   to a float (a load converts it with one rounding, as the reference's cast does).
fn check_integers(body: &Graph, meta: &HashSet<ValueId>) -> R<()> {
    let is_int = |v: ValueId| !body.value(v).ty.dtype.is_float();
    for node in &body.nodes {
        for out in node.outputs.iter().flatten() {
            let dtype = body.value(*out).ty.dtype;
            if dtype.is_float() {
                continue;
            }
            let source = node.input(0).map(|v| body.value(v).ty.dtype);
            let exact = match &node.op {
                Op::Cast { .. } => source.is_some_and(|d| d.is_float() || d == DType::Bool),
                Op::Where | Op::Identity | Op::Expand | Op::Transpose { .. } => true,
                // Rounded, shifted by an 8-bit zero point and saturated to the result's
                // range: an exact f32 integer.
                Op::QuantizeLinear { .. } => {
                    matches!(dtype, DType::I8 | DType::U8 | DType::I16 | DType::U16)
                }
                op if is_view(op) => true,
                Op::Binary { op } => {
                    dtype == DType::Bool
                        && (matches!(
                            op,
                            BinaryOp::Equal
                                | BinaryOp::Less
                                | BinaryOp::LessOrEqual
                                | BinaryOp::Greater
                                | BinaryOp::GreaterOrEqual
                        ) || (matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
                            && node
                                .inputs
                                .iter()
                                .flatten()
                                .all(|&v| body.value(v).ty.dtype == DType::Bool)))
                }
                Op::Unary { op } => {
                    dtype == DType::Bool && matches!(op, UnaryOp::Not | UnaryOp::IsNaN)
                }
                Op::IsInf { .. } => dtype == DType::Bool,
                _ => false,
            };
            if !exact {
                return Err(format!(
                    "node `{}`: op `{}` to {dtype} is not generated for Vulkan yet (integer \
                     values come only from casts of floats or bools, comparisons, logic \
                     and `where`)",
                    node.name,
                    node.op.name()
                ));
            }
        }
        let to_float = matches!(node.op, Op::Cast { to } if to.is_float());
        for (k, v) in node.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            let is_meta = k > 0 && (is_view(&node.op) || matches!(node.op, Op::Expand));
            if is_meta || meta.contains(&v) || !is_int(v) || to_float {
                continue;
            }
            let elem = Elem::of_any(body.value(v).ty.dtype)?;
            if elem.is_wide_int() {
                return Err(format!(
                    "value %{} is {}, read by `{}` (node `{}`): wide integers are generated \
                     only when cast to a float (f32 holds them exactly only up to 2^24)",
                    body.value(v).name,
                    body.value(v).ty.dtype,
                    node.op.name(),
                    node.name
                ));
            }
        }
    }
    // A body output that is an integer input passed through unchanged is fine; one that is
    // a wide integer computed here came from a cast of a float, checked above.
    Ok(())
}

/// The per-output-dim strides of a quantize's or dequantize's per-axis scale and zero
/// point (1-D, the size of the operand's `axis`): stride 1 along that axis, 0 elsewhere.
/// Empty for per-tensor parameters (one element, read as scalars) and other ops; an error
/// for blocked parameters or per-axis ones the kernel cannot index.
fn quant_axis_strides(
    body: &Graph,
    node: &rafter_ir::Node,
    shape: &[Dim],
    has_view: bool,
) -> R<Vec<(ValueId, Vec<Stride>)>> {
    let (axis, block_size) = match node.op {
        Op::QuantizeLinear {
            axis, block_size, ..
        }
        | Op::DequantizeLinear { axis, block_size } => (axis, block_size),
        _ => return Ok(Vec::new()),
    };
    let Some(Some(x)) = node.inputs.first() else {
        return Err(format!("node `{}` has no operand", node.name));
    };
    let rank = body.value(*x).ty.rank() as i64;
    let mut found = Vec::new();
    for &p in node.inputs.iter().skip(1).flatten() {
        let pty = &body.value(p).ty;
        if pty.num_elements().as_known() == Some(1) {
            continue;
        }
        if block_size > 0 {
            return Err(format!(
                "node `{}`: blocked quantization (block size {block_size}) is not generated \
                 for Vulkan yet",
                node.name
            ));
        }
        let ax = if axis < 0 { axis + rank } else { axis };
        let ok = (0..rank).contains(&ax)
            && pty.rank() == 1
            && body.value(*x).ty.dims == shape
            && body.inputs.contains(&p)
            && !has_view
            && pty.dims[0] == shape[ax as usize]
            && body
                .nodes
                .iter()
                .flat_map(|n| n.inputs.iter().flatten())
                .filter(|&&v| v == p)
                .count()
                == 1;
        if !ok {
            return Err(format!(
                "node `{}`: per-axis parameter %{} of {} is generated only as a kernel input \
                 of the axis' size, read once, on an operand of the output's shape, without \
                 reshapes in the kernel",
                node.name,
                body.value(p).name,
                pty
            ));
        }
        let mut strides: Vec<Stride> = vec![None; shape.len()];
        strides[ax as usize] = Some(Vec::new());
        found.push((p, strides));
    }
    Ok(found)
}

/// An input's stride along one output dim: `None` where it is broadcast (0), else the
/// product of the given dims (empty: 1).
type Stride = Option<Vec<Dim>>;

/// The most elements of a constant folded into a pointwise kernel as an array (a
/// `Private` array each invocation indexes).
const MAX_CONST_ARRAY: usize = 1024;

/// A constant's elements as f32s where each is exact there (floats, bools, integers within
/// 2^24): what a pointwise kernel's f32 registers hold.
fn exact_f32s(data: &rafter_ir::ConstData) -> Option<Vec<f32>> {
    let values = data.to_f64s();
    let exact = |x: f64| data.dtype.is_float() || (x as f32) as f64 == x;
    values
        .iter()
        .all(|&x| exact(x))
        .then(|| values.iter().map(|&x| x as f32).collect())
}

/// The symbolic sizes a kernel reads from its dim params, each found as an axis of one of
/// its bindings (whose size the runtime knows at every call).
#[derive(Debug, Default, Clone)]
struct DimTable {
    dims: Vec<Dim>,
    params: Vec<DimParam>,
}

impl DimTable {
    /// Adds `d` unless it is known or already there.
    fn need(&mut self, body: &Graph, d: &Dim) -> R<()> {
        if d.as_known().is_some() || self.dims.contains(d) {
            return Ok(());
        }
        let found = body
            .inputs
            .iter()
            .chain(&body.outputs)
            .enumerate()
            .find_map(|(b, &v)| {
                let axis = body.value(v).ty.dims.iter().position(|x| x == d)?;
                Some(DimParam {
                    binding: u16::try_from(b).ok()?,
                    axis: u16::try_from(axis).ok()?,
                })
            })
            .ok_or_else(|| {
                format!("symbolic dim `{d}` is not the size of a bound tensor's axis")
            })?;
        if self.params.len() == MAX_DIM_PARAMS {
            return Err(format!(
                "the kernel needs more than {MAX_DIM_PARAMS} symbolic sizes"
            ));
        }
        self.dims.push(d.clone());
        self.params.push(found);
        Ok(())
    }
}

/// One `reduce` node alone, on f32 of static shape: each invocation computes one output
/// element by a sequential loop over its lane (the reduced elements), in f32.
#[derive(Debug, Clone)]
struct ReducePlan {
    kind: ReduceKind,
    /// `(divisor, size, input stride)` per kept dim: the output index's coordinate there is
    /// `(o / divisor) % size`.
    kept: Vec<(u32, u32, u32)>,
    /// The same for the lane index over the reduced dims.
    reduced: Vec<(u32, u32, u32)>,
    /// Elements per lane.
    lane: u32,
}

/// Ops computed per element by [`Emitter::node`].
fn is_pointwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Identity
            | Op::Cast {
                to: DType::F32
                    | DType::F16
                    | DType::Bool
                    | DType::I8
                    | DType::U8
                    | DType::I32
                    | DType::I64
            }
            | Op::Where
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Clip
            | Op::LeakyRelu { .. }
            | Op::Elu { .. }
            | Op::Selu { .. }
            | Op::Celu { .. }
            | Op::HardSigmoid { .. }
            | Op::ThresholdedRelu { .. }
            | Op::Shrink { .. }
            | Op::IsInf { .. }
            | Op::Gelu { .. }
            | Op::QuantizeLinear { .. }
            | Op::DequantizeLinear { .. }
    )
}

/// A `reduce` (the body's last node) on f32 of static shape, with an optional prologue of
/// pointwise ops whose values and inputs all have the reduce operand's shape or one element.
fn reduction(body: &Graph) -> R<ElementwiseKernel> {
    let node = body.nodes.last().ok_or("no nodes")?;
    for p in &body.nodes[..body.nodes.len() - 1] {
        if !is_pointwise(&p.op) {
            return Err(format!(
                "op `{}` (node `{}`) before a reduce is not generated for Vulkan yet",
                p.op.name(),
                p.name
            ));
        }
    }
    let Op::Reduce {
        kind,
        axes,
        keep_dims: _,
        noop_with_empty_axes,
    } = &node.op
    else {
        return Err("not a reduce".into());
    };
    if *kind == ReduceKind::LogSumExp {
        return Err("reduce log_sum_exp is not generated for Vulkan yet".into());
    }
    let Some(Some(x)) = node.inputs.first() else {
        return Err("reduce without an operand".into());
    };
    if body.outputs.len() != 1 || node.outputs.first() != Some(&Some(body.outputs[0])) {
        return Err("a reduce kernel is generated with the reduce's result only".into());
    }
    // Axes: the attribute, or a constant operand folded into the body.
    let axes: Vec<i64> = match node.inputs.get(1).copied().flatten() {
        None => axes.clone(),
        Some(a) => match body.value(a).def {
            ValueDef::Const(c) => body
                .constant(c)
                .to_f64s()
                .iter()
                .map(|&v| v as i64)
                .collect(),
            _ => return Err("reduce axes given at run time are not generated yet".into()),
        },
    };
    if axes.is_empty() && *noop_with_empty_axes {
        return Err("a reduce over no axes (a copy) is not generated".into());
    }
    let xv = body.value(*x);
    let out = body.value(body.outputs[0]);
    for ty in [&xv.ty, &out.ty] {
        Elem::of(ty.dtype).map_err(|e| format!("reduce on {e}"))?;
    }
    let dims: Vec<u64> = xv
        .ty
        .dims
        .iter()
        .map(|d| d.as_known().and_then(|n| u64::try_from(n).ok()))
        .collect::<Option<_>>()
        .ok_or("reduce over symbolic dims is not generated yet")?;
    if dims.iter().product::<u64>() > MAX_ELEMENTS {
        return Err("reduce input too large for 32-bit indexing".into());
    }
    let rank = dims.len() as i64;
    let mut is_reduced = vec![axes.is_empty(); dims.len()];
    for &a in &axes {
        let a = if a < 0 { a + rank } else { a };
        if !(0..rank).contains(&a) {
            return Err(format!("reduce axis {a} out of range for rank {rank}"));
        }
        is_reduced[a as usize] = true;
    }
    let mut in_stride = vec![0u64; dims.len()];
    let mut stride = 1u64;
    for d in (0..dims.len()).rev() {
        in_stride[d] = stride;
        stride *= dims[d];
    }
    let plan_of = |want: bool| -> Vec<(u32, u32, u32)> {
        let mut divisor = 1u64;
        let mut v = Vec::new();
        for d in (0..dims.len()).rev() {
            if is_reduced[d] == want {
                v.push((divisor as u32, dims[d] as u32, in_stride[d] as u32));
                divisor *= dims[d];
            }
        }
        v
    };
    let lane: u64 = (0..dims.len())
        .filter(|&d| is_reduced[d])
        .map(|d| dims[d])
        .product();
    let plan = ReducePlan {
        kind: *kind,
        kept: plan_of(false),
        reduced: plan_of(true),
        lane: lane as u32,
    };
    // Every value but the result and the axes: f32, of the operand's dims or one element.
    let axes_value = node.inputs.get(1).copied().flatten();
    let one = |v: ValueId| body.value(v).ty.num_elements().as_known() == Some(1);
    for (i, value) in body.values.iter().enumerate() {
        let v = ValueId(i as u32);
        if Some(v) == axes_value || v == body.outputs[0] {
            continue;
        }
        Elem::of(value.ty.dtype).map_err(|e| format!("value %{} is {e}", value.name))?;
        if let ValueDef::Const(c) = value.def {
            if body.constant(c).num_elements() != 1 {
                return Err(format!(
                    "constant %{} has several elements; only single-element constants are \
                     folded in",
                    value.name
                ));
            }
        }
        if value.ty.dims != xv.ty.dims && !one(v) {
            return Err(format!(
                "value %{} of {} is neither the reduce operand's shape nor one element",
                value.name, value.ty
            ));
        }
    }
    let inputs: Vec<Operand> = body
        .inputs
        .iter()
        .map(|&v| {
            if body.value(v).ty.dims == xv.ty.dims {
                Operand::Tensor
            } else {
                Operand::Scalar
            }
        })
        .collect();
    let meta: HashSet<ValueId> = axes_value.into_iter().collect();
    let mut emitter = Emitter::new(body, &inputs, vec![None; inputs.len()], Vec::new(), meta);
    emitter.reduce = Some(plan);
    Ok(ElementwiseKernel {
        spirv: emitter.emit()?,
        entry_point: "main".into(),
        inputs,
        outputs: 1,
        dims: Vec::new(),
        launch: Launch::Elementwise,
        workgroup_size: WORKGROUP_SIZE,
    })
}

/// One `softmax`, `log_softmax` or `hardmax` alone, on f32: each invocation normalises one
/// lane (the elements along the axis) in three passes (max, sum of exponentials, write; a
/// hardmax's are in [`Emitter::hardmax_row`]). The launch
/// is the elementwise one (the count is the output's element count); the kernel divides it
/// by the lane length to get its rows. Symbolic sizes come from dim params.
#[derive(Debug, Clone)]
struct SoftmaxPlan {
    log: bool,
    /// A hardmax: 1 at the lane's first maximum (its first NaN, if any), 0 elsewhere.
    hard: bool,
    /// An `lp_norm` of this `p` (1 or 2): `x / norm`, 0 where the norm is 0.
    lp: Option<u32>,
    /// Elements along the axis.
    lane: Dim,
    /// Elements after the axis (the stride between a lane's elements): their product.
    inner: Vec<Dim>,
}

fn softmax(body: &Graph) -> R<ElementwiseKernel> {
    let node = &body.nodes[0];
    let (kind, axis, lp) = match &node.op {
        Op::Softmax { kind, axis } => (*kind, axis, None),
        Op::LpNorm {
            axis,
            p: p @ (1 | 2),
        } => (SoftmaxKind::Softmax, axis, Some(*p as u32)),
        Op::LpNorm { p, .. } => return Err(format!("lp_norm with p = {p} (1 or 2)")),
        _ => return Err("not a softmax".into()),
    };
    let (log, hard) = match kind {
        SoftmaxKind::Softmax => (false, false),
        SoftmaxKind::LogSoftmax => (true, false),
        SoftmaxKind::Hardmax => (false, true),
    };
    let Some(Some(x)) = node.inputs.first() else {
        return Err("softmax without an operand".into());
    };
    if body.inputs != [*x] || body.outputs.len() != 1 {
        return Err("a softmax is generated alone, on a kernel input, with one result".into());
    }
    let xv = body.value(*x);
    Elem::of(xv.ty.dtype).map_err(|e| format!("softmax on {e}"))?;
    Elem::of(body.value(body.outputs[0]).ty.dtype).map_err(|e| format!("softmax to {e}"))?;
    let dims = &xv.ty.dims;
    if let Some(n) = xv.ty.num_elements().as_known() {
        if n as u64 > MAX_ELEMENTS {
            return Err("softmax input too large for 32-bit indexing".into());
        }
    }
    let rank = dims.len() as i64;
    let a = if *axis < 0 { axis + rank } else { *axis };
    if !(0..rank).contains(&a) {
        return Err(format!("softmax axis {axis} out of range for rank {rank}"));
    }
    let lane = dims[a as usize].clone();
    if lane.as_known() == Some(0) {
        return Err("softmax over an empty axis is not generated".into());
    }
    let inner: Vec<Dim> = dims[a as usize + 1..].to_vec();
    let mut table = DimTable::default();
    for d in std::iter::once(&lane).chain(&inner) {
        table.need(body, d)?;
    }
    let inputs = vec![Operand::Tensor];
    let mut emitter = Emitter::new(body, &inputs, vec![None], Vec::new(), HashSet::new());
    emitter.table = table;
    // Over the last axis, a workgroup per lane; else one invocation per lane.
    let (launch, workgroup_size) = if inner.is_empty() {
        emitter.rows = true;
        (Launch::Rows { lane_dims: 1 }, ROW_WORKGROUP_SIZE)
    } else {
        (Launch::Elementwise, WORKGROUP_SIZE)
    };
    emitter.softmax = Some(SoftmaxPlan {
        log,
        hard,
        lp,
        lane,
        inner,
    });
    let dims = emitter.table.params.clone();
    Ok(ElementwiseKernel {
        spirv: emitter.emit()?,
        entry_point: "main".into(),
        inputs,
        outputs: 1,
        dims,
        launch,
        workgroup_size,
    })
}

/// A `layer_norm` (the body's last node, its first result the body's one output) over the
/// axes `axis..rank` of x, after an optional pointwise prologue: each invocation normalises
/// one row (the normalised elements) in three passes (mean, variance, write), evaluating
/// the prologue at each element. Inputs are read per element (x's dims), per position in
/// the row (the scale and bias: the normalised dims), or once (one element).
#[derive(Debug, Clone)]
struct NormPlan {
    /// The normalised dims, whose product is the row length.
    lane: Vec<Dim>,
    epsilon: f32,
    /// An `rms_norm`: no mean is subtracted and there is no bias, `x / sqrt(mean(x²) + eps)
    /// * scale`.
    rms: bool,
    x: ValueId,
    scale: ValueId,
    bias: Option<ValueId>,
    /// The dims of each [`Operand::Repeated`] input, by input index: their product is the
    /// modulus of its index.
    repeated: Vec<(usize, Vec<Dim>)>,
    /// How many of a layer norm's statistics (its mean, then its inverse standard
    /// deviation: ONNX LayerNormalization's optional results, one per row) the body
    /// outputs after the normalised result, in that order.
    stats: usize,
}

fn layer_norm(body: &Graph) -> R<ElementwiseKernel> {
    let node = body.nodes.last().ok_or("no nodes")?;
    for p in &body.nodes[..body.nodes.len() - 1] {
        if !is_pointwise(&p.op) {
            return Err(format!(
                "op `{}` (node `{}`) before a layer_norm is not generated for Vulkan yet",
                p.op.name(),
                p.name
            ));
        }
    }
    let (axis, epsilon, rms) = match &node.op {
        Op::LayerNorm { axis, epsilon } => (axis, epsilon, false),
        Op::RmsNorm { axis, epsilon } => (axis, epsilon, true),
        _ => return Err("not a layer_norm or rms_norm".into()),
    };
    let (Some(Some(x)), Some(Some(scale))) = (node.inputs.first(), node.inputs.get(1)) else {
        return Err("layer_norm without its x and scale".into());
    };
    let bias = node.inputs.get(2).copied().flatten();
    if rms && bias.is_some() {
        return Err("an rms_norm with a bias operand".into());
    }
    // The normalised result, then optionally the mean and the inverse deviation, each the
    // body output of its position.
    let stats = body.outputs.len().saturating_sub(1);
    let in_order = body
        .outputs
        .iter()
        .enumerate()
        .all(|(i, &v)| node.outputs.get(i) == Some(&Some(v)));
    if body.outputs.is_empty() || stats > 2 || !in_order || (rms && stats > 0) {
        return Err(
            "a layer_norm kernel is generated with its normalised result, then optionally \
             its mean and inverse deviation, as the body's outputs in that order"
                .into(),
        );
    }
    let xv = body.value(*x);
    let dims = &xv.ty.dims;
    if body.value(body.outputs[0]).ty.dims != *dims {
        return Err("the layer_norm's result does not have x's dims".into());
    }
    if let Some(n) = xv.ty.num_elements().as_known() {
        if n as u64 > MAX_ELEMENTS {
            return Err("layer_norm input too large for 32-bit indexing".into());
        }
    }
    let rank = dims.len() as i64;
    let a = if *axis < 0 { axis + rank } else { *axis };
    if !(0..rank).contains(&a) {
        return Err(format!(
            "layer_norm axis {axis} out of range for rank {rank}"
        ));
    }
    let lane: Vec<Dim> = dims[a as usize..].to_vec();
    if lane.iter().any(|d| d.as_known() == Some(0)) {
        return Err("layer_norm over an empty row is not generated".into());
    }
    // A value indexed by the position in the row: the normalised dims, after leading 1s.
    let strip = |d: &[Dim]| -> Vec<Dim> {
        let ones = d.iter().take_while(|d| d.as_known() == Some(1)).count();
        d[ones..].to_vec()
    };
    let lane_dims = strip(&lane);
    let one = |v: ValueId| body.value(v).ty.num_elements().as_known() == Some(1);
    // Whole rows of x's trailing dims, repeated over its leading ones.
    let repeats = |d: &[Dim]| {
        let d = strip(d);
        d.len() > lane.len() && d.len() < dims.len() && dims.ends_with(&d)
    };
    let mut inputs = Vec::with_capacity(body.inputs.len());
    let mut repeated = Vec::new();
    for (i, &v) in body.inputs.iter().enumerate() {
        let ty = &body.value(v).ty;
        inputs.push(if ty.dims == *dims {
            Operand::Tensor
        } else if one(v) {
            Operand::Scalar
        } else if strip(&ty.dims) == lane_dims {
            Operand::Lane
        } else if repeats(&ty.dims) {
            repeated.push((i, strip(&ty.dims)));
            Operand::Repeated
        } else {
            return Err(format!(
                "input %{} of {} is neither x's shape, the normalised dims {lane:?}, x's \
                 trailing dims repeated over its leading ones, nor one element",
                body.value(v).name,
                ty
            ));
        });
    }
    // Constants of the normalised dims (a scale or bias of a few f16s the compiler folded
    // into the body) are kept in the module and read per position, like lane inputs.
    let mut lane_consts = Vec::new();
    for (i, value) in body.values.iter().enumerate() {
        let v = ValueId(i as u32);
        Elem::of(value.ty.dtype).map_err(|e| format!("value %{} is {e}", value.name))?;
        if let ValueDef::Const(c) = value.def {
            let n = body.constant(c).num_elements();
            if n != 1 {
                if strip(&value.ty.dims) != lane_dims || n > MAX_CONST_LANE {
                    return Err(format!(
                        "constant %{} has several elements and is not a vector of the \
                         normalised dims (of at most {MAX_CONST_LANE}); only those and \
                         single-element constants are folded in",
                        value.name
                    ));
                }
                let values = body.constant(c).to_f64s();
                lane_consts.push((v, values.into_iter().map(|x| x as f32).collect()));
            }
        }
        // Computed values: x's shape (the prologue) or the normalised dims' (per position).
        // The norm's own results (the optional mean and deviation) are not computed.
        if node.outputs.contains(&Some(v)) {
            continue;
        }
        if let ValueDef::Node { .. } = value.def {
            if value.ty.dims != *dims && strip(&value.ty.dims) != lane_dims && !one(v) {
                return Err(format!(
                    "value %{} of {} is neither x's shape nor the normalised dims'",
                    value.name, value.ty
                ));
            }
        }
    }
    let mut table = DimTable::default();
    for d in lane.iter().chain(repeated.iter().flat_map(|(_, d)| d)) {
        table.need(body, d)?;
    }
    let mut emitter = Emitter::new(
        body,
        &inputs,
        vec![None; inputs.len()],
        Vec::new(),
        HashSet::new(),
    );
    emitter.table = table;
    emitter.rows = true;
    emitter.lane_consts = lane_consts;
    let lane_dims_count = u8::try_from(rank - a).map_err(|_| "layer_norm over too many axes")?;
    emitter.norm = Some(NormPlan {
        lane,
        epsilon: *epsilon,
        rms,
        x: *x,
        scale: *scale,
        bias,
        repeated,
        stats,
    });
    let dims = emitter.table.params.clone();
    Ok(ElementwiseKernel {
        spirv: emitter.emit()?,
        entry_point: "main".into(),
        inputs,
        outputs: 1 + stats,
        dims,
        launch: Launch::Rows {
            lane_dims: lane_dims_count,
        },
        workgroup_size: ROW_WORKGROUP_SIZE,
    })
}

/// The most elements of a constant vector a layer norm keeps in its module.
const MAX_CONST_LANE: usize = 4096;

/// Ops that only reinterpret their first operand's elements in linear order (the others
/// are shapes or axes).
/// The element count of `v` as a dim expression, followed back through reshape-like ops
/// (and pointwise ops on the same dims) to the first value that is neither: a view has
/// its operand's count (ONNX
/// requires it; the runtime checks it when it binds a shape read from values), so a
/// reshape to dims the call's values give (`_reshape0 × _reshape1`) still counts as its
/// static operand's elements.
fn count_through_views(body: &Graph, mut v: ValueId) -> Dim {
    while let ValueDef::Node { node, .. } = body.value(v).def {
        let n = body.node(node);
        match n.inputs.first().copied().flatten() {
            Some(x) if is_view(&n.op) => v = x,
            // A pointwise op's result has its same-dims operand's elements.
            Some(x) if is_pointwise(&n.op) && body.value(x).ty.dims == body.value(v).ty.dims => {
                v = x
            }
            _ => break,
        }
    }
    body.value(v).ty.num_elements()
}

pub(crate) fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. }
    )
}

/// Whether `dims` has more elements than 32-bit indexing reaches, as far as known (symbolic
/// sizes are checked by the runtime, against the element count).
fn too_large(dims: &[Dim]) -> bool {
    let known: Option<Vec<u64>> = dims
        .iter()
        .map(|d| d.as_known().and_then(|n| u64::try_from(n).ok()))
        .collect();
    known.is_some_and(|k| {
        k.iter()
            .try_fold(1u64, |a, &n| a.checked_mul(n))
            .is_none_or(|n| n > MAX_ELEMENTS)
    })
}

/// The factors of a row-major stride: the dims after an axis, without known 1s.
fn stride_factors(after: &[Dim]) -> Vec<Dim> {
    after
        .iter()
        .filter(|d| d.as_known() != Some(1))
        .cloned()
        .collect()
}

/// Per output dim, the element stride in a tensor of `dims` that `perm` transposes to
/// `out` (output dim `d` is input axis `perm[d]`, of the same size).
fn transpose_strides(dims: &[Dim], perm: &[i64], out: &[Dim]) -> Option<Vec<Stride>> {
    if perm.len() != dims.len() || out.len() != dims.len() || too_large(dims) {
        return None;
    }
    perm.iter()
        .zip(out)
        .map(|(&p, n)| {
            let a = usize::try_from(p).ok().filter(|&a| a < dims.len())?;
            if dims[a] != *n {
                return None;
            }
            Some((n.as_known() != Some(1)).then(|| stride_factors(&dims[a + 1..])))
        })
        .collect()
}

/// Per output dim, the element stride of a tensor of `dims` broadcast (NumPy rules, dims
/// right-aligned) to the `out` shape: `None` where it is broadcast. `None` overall when it
/// does not broadcast (a dim neither the output's nor 1) or a size exceeds 32-bit indexing.
fn broadcast_strides(dims: &[Dim], out: &[Dim]) -> Option<Vec<Stride>> {
    if dims.len() > out.len() || too_large(out) {
        return None;
    }
    let lead = out.len() - dims.len();
    let mut strides = vec![None; out.len()];
    for d in lead..out.len() {
        let n = &dims[d - lead];
        if n.as_known() == Some(1) {
            continue;
        }
        if *n != out[d] {
            return None;
        }
        strides[d] = Some(stride_factors(&dims[d - lead + 1..]));
    }
    Some(strides)
}

/// GLSL.std.450 instruction numbers used here.
mod glsl {
    pub const ROUND_EVEN: u32 = 2;
    pub const TRUNC: u32 = 3;
    pub const FABS: u32 = 4;
    pub const FLOOR: u32 = 8;
    pub const CEIL: u32 = 9;
    pub const SIN: u32 = 13;
    pub const COS: u32 = 14;
    pub const TAN: u32 = 15;
    pub const ATAN: u32 = 18;
    pub const SINH: u32 = 19;
    pub const COSH: u32 = 20;
    pub const ASINH: u32 = 22;
    pub const ACOSH: u32 = 23;
    pub const ATANH: u32 = 24;
    pub const ATAN2: u32 = 25;
    pub const POW: u32 = 26;
    pub const LOG: u32 = 28;
    pub const SQRT: u32 = 31;
    pub const FMIN: u32 = 37;
    pub const FMAX: u32 = 40;
    pub const FCLAMP: u32 = 43;
}

pub(crate) type R<T> = Result<T, String>;

pub(crate) fn build<T>(r: Result<T, rspirv::dr::Error>) -> R<T> {
    r.map_err(|e| format!("rspirv: {e}"))
}

/// A `u32` in the kernel: a constant known at generation time, or a computed id. The
/// helpers on [`Emitter`] fold constants, so a static shape emits the same code it did
/// before sizes could come from params.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum U {
    C(u32),
    W(Word),
}

/// A row kernel's ids: the invocation's index in its workgroup and the workgroup-memory
/// scratch array (one f32 per invocation) its reductions go through.
#[derive(Clone, Copy, Debug)]
struct RowIds {
    lid: Word,
    scratch: Word,
    ptr_wg: Word,
}

pub(crate) struct Emitter<'a> {
    pub(crate) body: &'a Graph,
    inputs: &'a [Operand],
    /// Per input: its strides per output dim, for [`Operand::Broadcast`] inputs.
    strides: Vec<Option<Vec<Stride>>>,
    /// The output's dims (read only when an input is broadcast).
    out_shape: Vec<Dim>,
    /// Values never read (shape and axes operands of reshape-like ops).
    meta: HashSet<ValueId>,
    /// The symbolic sizes read from dim params, and their loaded values.
    table: DimTable,
    dim_words: Vec<Word>,
    /// Set for a reduction kernel ([`reduction`]): the loop body computes one lane.
    reduce: Option<ReducePlan>,
    /// Set for a softmax kernel ([`softmax`]): the loop runs over rows.
    softmax: Option<SoftmaxPlan>,
    /// Set for a layer-norm kernel ([`layer_norm`]): the loop runs over rows.
    norm: Option<NormPlan>,
    /// A workgroup per row ([`Launch::Rows`]): the loop runs over workgroups, each row's
    /// lanes strided over the workgroup's invocations and reduced through `row`.
    rows: bool,
    row: Option<RowIds>,
    /// Per binding (inputs, then outputs): its element type (`None`: not a float tensor,
    /// never loaded) and, once `emit` has read them, its base address (a `u64`).
    elems: Vec<Option<Elem>>,
    addrs: Vec<Word>,
    /// A layer norm's constant vectors of the normalised dims ([`layer_norm`]), and once
    /// declared, the `Private` arrays holding them.
    lane_consts: Vec<(ValueId, Vec<f32>)>,
    lane_const_vars: HashMap<ValueId, Word>,
    /// The constant arrays of the pointwise path (declared with the lane constants) and
    /// their strides over the output's dims.
    const_strides: Vec<(ValueId, Vec<Stride>)>,
    pub(crate) b: Builder,
    pub(crate) glsl: Word,
    void: Word,
    f32: Word,
    u32: Word,
    pub(crate) bool: Word,
    constants: HashMap<u32, Word>,
    u32_constants: HashMap<u32, Word>,
    /// Every value is an integer or bool computed as an `i64` (the `integer` module), not
    /// an f32.
    pub(crate) int_mode: bool,
}

impl<'a> Emitter<'a> {
    fn new(
        body: &'a Graph,
        inputs: &'a [Operand],
        strides: Vec<Option<Vec<Stride>>>,
        out_shape: Vec<Dim>,
        meta: HashSet<ValueId>,
    ) -> Emitter<'a> {
        let mut b = Builder::new();
        // Element addresses are 64-bit integer arithmetic (see `emit`).
        let crate::matmul::Prelude {
            glsl,
            void,
            f32,
            u32,
            bool,
            ..
        } = crate::matmul::prelude(&mut b);
        let elems = body
            .inputs
            .iter()
            .chain(&body.outputs)
            .map(|&v| Elem::of_any(body.value(v).ty.dtype).ok())
            .collect();
        Emitter {
            body,
            inputs,
            strides,
            out_shape,
            meta,
            table: DimTable::default(),
            dim_words: Vec::new(),
            reduce: None,
            softmax: None,
            norm: None,
            rows: false,
            row: None,
            elems,
            addrs: Vec::new(),
            lane_consts: Vec::new(),
            lane_const_vars: HashMap::new(),
            const_strides: Vec::new(),
            b,
            glsl,
            void,
            f32,
            u32,
            bool,
            constants: HashMap::new(),
            u32_constants: HashMap::new(),
            int_mode: false,
        }
    }

    fn f(&mut self, value: f32) -> Word {
        let bits = value.to_bits();
        if let Some(&id) = self.constants.get(&bits) {
            return id;
        }
        let id = self.b.constant_bit32(self.f32, bits);
        self.constants.insert(bits, id);
        id
    }

    /// The byte address (a `u64`) of element `index` (a `u32`) of binding `binding`.
    fn address(&mut self, binding: usize, index: Word) -> R<Word> {
        let elem = self.elem(binding)?;
        let base = *self
            .addrs
            .get(binding)
            .ok_or("binding address not loaded")?;
        let u64 = self.b.type_int(64, 0);
        let size = self.b.constant_bit64(u64, elem.bytes() as u64);
        let wide = build(self.b.u_convert(u64, None, index))?;
        let offset = build(self.b.i_mul(u64, None, wide, size))?;
        build(self.b.i_add(u64, None, base, offset))
    }

    fn elem(&self, binding: usize) -> R<Elem> {
        self.elems
            .get(binding)
            .copied()
            .flatten()
            .ok_or_else(|| format!("binding {binding} is not a float tensor"))
    }

    /// Element `index` of binding `binding`, as an f32 (an `i64` in an integer kernel).
    fn load(&mut self, binding: usize, index: Word) -> R<Word> {
        let address = self.address(binding, index)?;
        let elem = self.elem(binding)?;
        if self.int_mode {
            let i64 = self.i64();
            return elem::load_int(&mut self.b, elem, i64, address);
        }
        elem::load(&mut self.b, elem, self.f32, address)
    }

    /// Stores the f32 `v` as element `index` of binding `binding`.
    fn store(&mut self, binding: usize, index: Word, v: Word) -> R<()> {
        let address = self.address(binding, index)?;
        let elem = self.elem(binding)?;
        if self.int_mode {
            let i64 = self.i64();
            return elem::store_int(&mut self.b, elem, i64, address, v);
        }
        elem::store(&mut self.b, elem, self.f32, address, v)
    }

    fn u(&mut self, value: u32) -> Word {
        if let Some(&id) = self.u32_constants.get(&value) {
            return id;
        }
        let id = self.b.constant_bit32(self.u32, value);
        self.u32_constants.insert(value, id);
        id
    }

    fn uw(&mut self, v: U) -> Word {
        match v {
            U::C(c) => self.u(c),
            U::W(w) => w,
        }
    }

    fn umul(&mut self, a: U, b: U) -> R<U> {
        Ok(match (a, b) {
            (U::C(0), _) | (_, U::C(0)) => U::C(0),
            (U::C(1), x) | (x, U::C(1)) => x,
            (U::C(x), U::C(y)) => U::C(x.wrapping_mul(y)),
            (x, y) => {
                let (x, y) = (self.uw(x), self.uw(y));
                U::W(build(self.b.i_mul(self.u32, None, x, y))?)
            }
        })
    }

    fn uadd(&mut self, a: U, b: U) -> R<U> {
        Ok(match (a, b) {
            (U::C(0), x) | (x, U::C(0)) => x,
            (U::C(x), U::C(y)) => U::C(x.wrapping_add(y)),
            (x, y) => {
                let (x, y) = (self.uw(x), self.uw(y));
                U::W(build(self.b.i_add(self.u32, None, x, y))?)
            }
        })
    }

    fn udiv(&mut self, a: U, b: U) -> R<U> {
        Ok(match (a, b) {
            (x, U::C(1)) => x,
            (U::C(x), U::C(y)) if y != 0 => U::C(x / y),
            (x, y) => {
                let (x, y) = (self.uw(x), self.uw(y));
                U::W(build(self.b.u_div(self.u32, None, x, y))?)
            }
        })
    }

    fn umod(&mut self, a: U, b: U) -> R<U> {
        Ok(match (a, b) {
            (_, U::C(1)) => U::C(0),
            (U::C(x), U::C(y)) if y != 0 => U::C(x % y),
            (x, y) => {
                let (x, y) = (self.uw(x), self.uw(y));
                U::W(build(self.b.u_mod(self.u32, None, x, y))?)
            }
        })
    }

    /// A size: its value if known, else its dim param (loaded at the kernel's start).
    fn dim(&self, d: &Dim) -> R<U> {
        if let Some(n) = d.as_known() {
            return u32::try_from(n)
                .map(U::C)
                .map_err(|_| format!("dim {n} does not fit in 32 bits"));
        }
        self.table
            .dims
            .iter()
            .position(|x| x == d)
            .and_then(|i| self.dim_words.get(i))
            .map(|&w| U::W(w))
            .ok_or_else(|| format!("symbolic dim `{d}` has no param"))
    }

    /// The product of `dims`.
    fn product(&mut self, dims: &[Dim]) -> R<U> {
        let mut p = U::C(1);
        for d in dims {
            let d = self.dim(d)?;
            p = self.umul(p, d)?;
        }
        Ok(p)
    }

    fn ext(&mut self, inst: u32, args: &[Word]) -> R<Word> {
        let (f32, glsl) = (self.f32, self.glsl);
        build(
            self.b
                .ext_inst(f32, None, glsl, inst, args.iter().map(|&a| Arg::IdRef(a))),
        )
    }

    fn add(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_add(self.f32, None, a, b))
    }
    fn sub(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_sub(self.f32, None, a, b))
    }
    fn mul(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_mul(self.f32, None, a, b))
    }
    /// `a / b` as the driver divides (within Vulkan's 2.5 ulp): for the kernels' own
    /// arithmetic (means, normalisations, sigmoid), which the reference checks within a
    /// tolerance.
    fn div(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_div(self.f32, None, a, b))
    }

    /// `a / b` correctly rounded ([`crate::epilogue_math::Math::div_exact`]): for ONNX's
    /// `Div`, `Reciprocal` and the quotient a quantization rounds.
    fn div_exact(&mut self, a: Word, b: Word) -> R<Word> {
        self.math().div_exact(a, b)
    }
    fn lt(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_less_than(self.bool, None, a, b))
    }
    fn gt(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_greater_than(self.bool, None, a, b))
    }
    fn ge(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_greater_than_equal(self.bool, None, a, b))
    }
    fn eq(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_equal(self.bool, None, a, b))
    }
    fn is_nan(&mut self, a: Word) -> R<Word> {
        build(self.b.is_nan(self.bool, None, a))
    }
    fn select(&mut self, cond: Word, a: Word, b: Word) -> R<Word> {
        build(self.b.select(self.f32, None, cond, a, b))
    }
    fn and(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.logical_and(self.bool, None, a, b))
    }

    /// The transcendental helpers shared with the matmul epilogue
    /// ([`crate::epilogue_math`]), over this emitter's builder: one copy of each formula.
    fn math(&mut self) -> crate::epilogue_math::Math<'_> {
        crate::epilogue_math::Math {
            b: &mut self.b,
            f32: self.f32,
            bool: self.bool,
            glsl: self.glsl,
        }
    }

    /// `e^x`, range-reduced ([`crate::epilogue_math::Math::exp`]: within 3 ulp on
    /// lavapipe where a plain `Exp` was 60 ulp off, 0 or infinity outside
    /// [-104, ln(f32::MAX)], NaN kept).
    fn exp(&mut self, x: Word) -> R<Word> {
        self.math().exp(x)
    }
    /// `exp(x) - 1`.
    fn expm1(&mut self, x: Word) -> R<Word> {
        let e = self.exp(x)?;
        let one = self.f(1.0);
        self.sub(e, one)
    }
    /// `nan(x) ? x : y`: keeps NaN where a GLSL built-in (clamp, min, max) leaves it undefined.
    fn keep_nan(&mut self, x: Word, y: Word) -> R<Word> {
        let nan = self.is_nan(x)?;
        self.select(nan, x, y)
    }

    /// C's `fmod`, also where `b` is infinite (`fmod(a, ±inf) = a` for finite `a`): drivers
    /// may lower `OpFRem` to `a - b * trunc(a / b)`, which is NaN there (lavapipe's is).
    fn fmod(&mut self, a: Word, b: Word) -> R<Word> {
        let r = build(self.b.f_rem(self.f32, None, a, b))?;
        let b_inf = build(self.b.is_inf(self.bool, None, b))?;
        let a_inf = build(self.b.is_inf(self.bool, None, a))?;
        let a_nan = self.is_nan(a)?;
        let a_special = build(self.b.logical_or(self.bool, None, a_inf, a_nan))?;
        let a_finite = build(self.b.logical_not(self.bool, None, a_special))?;
        let keep_a = self.and(b_inf, a_finite)?;
        self.select(keep_a, a, r)
    }

    /// `tanh` clamped to ±10, with its series near 0
    /// ([`crate::epilogue_math::Math::tanh`]).
    fn tanh(&mut self, x: Word) -> R<Word> {
        self.math().tanh(x)
    }

    /// erf, a few ulp, exactly ±1 at |x| >= 4 as f32 erf rounds
    /// ([`crate::epilogue_math::Math::erf`]).
    fn erf(&mut self, x: Word) -> R<Word> {
        self.math().erf(x)
    }

    /// `sqrt((1 - x) * (1 + x))`, which keeps its precision as |x| nears 1.
    fn one_minus_square_root(&mut self, x: Word) -> R<Word> {
        let one = self.f(1.0);
        let a = self.sub(one, x)?;
        let b = self.add(one, x)?;
        let p = self.mul(a, b)?;
        self.ext(glsl::SQRT, &[p])
    }

    /// `log(1 + exp(x))` without overflow: `max(x, 0) + log1p(exp(-|x|))`.
    fn softplus(&mut self, x: Word) -> R<Word> {
        let zero = self.f(0.0);
        let one = self.f(1.0);
        let m = self.ext(glsl::FMAX, &[x, zero])?;
        let a = self.ext(glsl::FABS, &[x])?;
        let na = build(self.b.f_negate(self.f32, None, a))?;
        let e = self.exp(na)?;
        let l1 = self.add(one, e)?;
        let l = self.ext(glsl::LOG, &[l1])?;
        // log1p(e) for small e: `1 + e` rounds away e's low bits and a driver's log near 1
        // has a large relative error (lavapipe's), so the series e - e²/2 + ... + e⁵/5,
        // exact to f32 for e < 1/32.
        let mut p = self.f(0.2);
        for c in [-0.25f32, 1.0 / 3.0, -0.5, 1.0] {
            let t = self.mul(p, e)?;
            let c = self.f(c);
            p = self.add(t, c)?;
        }
        let series = self.mul(p, e)?;
        let limit = self.f(1.0 / 32.0);
        let small = self.lt(e, limit)?;
        let l = self.select(small, series, l)?;
        let r = self.add(m, l)?;
        self.keep_nan(x, r)
    }

    /// NumPy `maximum`/`minimum`: NaN in either operand gives NaN.
    fn minmax(&mut self, max: bool, a: Word, b: Word) -> R<Word> {
        let pick_a = if max { self.ge(a, b)? } else { self.ge(b, a)? };
        let r = self.select(pick_a, a, b)?;
        let r = self.keep_nan(b, r)?;
        self.keep_nan(a, r)
    }

    fn unary(&mut self, op: UnaryOp, x: Word) -> R<Word> {
        use UnaryOp::*;
        let zero = self.f(0.0);
        let one = self.f(1.0);
        Ok(match op {
            Abs => self.ext(glsl::FABS, &[x])?,
            Neg => build(self.b.f_negate(self.f32, None, x))?,
            Sqrt => self.ext(glsl::SQRT, &[x])?,
            Exp => self.exp(x)?,
            Log => self.ext(glsl::LOG, &[x])?,
            Reciprocal => self.div_exact(one, x)?,
            Floor => self.ext(glsl::FLOOR, &[x])?,
            Ceil => self.ext(glsl::CEIL, &[x])?,
            Round => self.ext(glsl::ROUND_EVEN, &[x])?,
            Sign => {
                let minus = self.f(-1.0);
                let neg = self.lt(x, zero)?;
                let r = self.select(neg, minus, x)?;
                let pos = self.gt(x, zero)?;
                self.select(pos, one, r)?
            }
            Sin => self.ext(glsl::SIN, &[x])?,
            Cos => self.ext(glsl::COS, &[x])?,
            Tan => self.ext(glsl::TAN, &[x])?,
            // Through atan2, as Vulkan defines their precision: drivers' own asin/acos
            // polynomials can be off by 3e-4 (lavapipe's are).
            Asin => {
                let r = self.one_minus_square_root(x)?;
                self.ext(glsl::ATAN2, &[x, r])?
            }
            Acos => {
                let r = self.one_minus_square_root(x)?;
                self.ext(glsl::ATAN2, &[r, x])?
            }
            Atan => self.ext(glsl::ATAN, &[x])?,
            Sinh => self.ext(glsl::SINH, &[x])?,
            Cosh => self.ext(glsl::COSH, &[x])?,
            Tanh => self.tanh(x)?,
            Asinh => self.ext(glsl::ASINH, &[x])?,
            Acosh => self.ext(glsl::ACOSH, &[x])?,
            Atanh => self.ext(glsl::ATANH, &[x])?,
            Erf => self.erf(x)?,
            Sigmoid => {
                // 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below: never exp of a large
                // positive number.
                let a = self.ext(glsl::FABS, &[x])?;
                let na = build(self.b.f_negate(self.f32, None, a))?;
                let e = self.exp(na)?;
                let d = self.add(one, e)?;
                let pos = self.div(one, d)?;
                let neg = self.div(e, d)?;
                let ge = self.ge(x, zero)?;
                self.select(ge, pos, neg)?
            }
            Relu => {
                let neg = self.lt(x, zero)?;
                self.select(neg, zero, x)?
            }
            Softplus => self.softplus(x)?,
            Softsign => {
                let a = self.ext(glsl::FABS, &[x])?;
                let d = self.add(one, a)?;
                self.div(x, d)?
            }
            Mish => {
                let s = self.softplus(x)?;
                let t = self.tanh(s)?;
                self.mul(x, t)?
            }
            HardSwish => {
                let sixth = self.f(1.0 / 6.0);
                let half = self.f(0.5);
                let t = self.mul(x, sixth)?;
                let t = self.add(t, half)?;
                let t = self.ext(glsl::FMIN, &[t, one])?;
                let t = self.ext(glsl::FMAX, &[t, zero])?;
                self.mul(x, t)?
            }
            // Bools are 0.0 and 1.0 here (see `check_integers`).
            Not => self.sub(one, x)?,
            IsNaN => {
                let nan = build(self.b.is_nan(self.bool, None, x))?;
                self.select(nan, one, zero)?
            }
            BitwiseNot => return Err("unary.bitwise_not works on integers, not f32".to_string()),
        })
    }

    fn binary(&mut self, op: BinaryOp, a: Word, b: Word) -> R<Word> {
        use BinaryOp::*;
        let zero = self.f(0.0);
        Ok(match op {
            Add => self.add(a, b)?,
            Sub => self.sub(a, b)?,
            Mul => self.mul(a, b)?,
            Div => self.div_exact(a, b)?,
            FMod => self.fmod(a, b)?,
            Mod => {
                // fmod, moved into the divisor's sign (NumPy's divmod).
                let r = self.fmod(a, b)?;
                let nonzero = build(self.b.f_ord_not_equal(self.bool, None, r, zero))?;
                let r_neg = self.lt(r, zero)?;
                let b_neg = self.lt(b, zero)?;
                let differ = build(self.b.logical_not_equal(self.bool, None, r_neg, b_neg))?;
                let fix = self.and(nonzero, differ)?;
                let moved = self.add(r, b)?;
                self.select(fix, moved, r)?
            }
            Pow => self.pow(a, b)?,
            Max => self.minmax(true, a, b)?,
            Min => self.minmax(false, a, b)?,
            PRelu => {
                let neg = self.lt(a, zero)?;
                let scaled = self.mul(a, b)?;
                self.select(neg, scaled, a)?
            }
            // Comparisons yield a bool, 1.0 or 0.0 (ordered: false against NaN); the logic
            // ops take bools, 1.0 or 0.0 (see `check_integers`).
            Equal | Less | LessOrEqual | Greater | GreaterOrEqual => {
                let (t, f) = (a, b);
                let bool = self.bool;
                let c = match op {
                    Equal => build(self.b.f_ord_equal(bool, None, t, f))?,
                    Less => build(self.b.f_ord_less_than(bool, None, t, f))?,
                    LessOrEqual => build(self.b.f_ord_less_than_equal(bool, None, t, f))?,
                    Greater => build(self.b.f_ord_greater_than(bool, None, t, f))?,
                    _ => build(self.b.f_ord_greater_than_equal(bool, None, t, f))?,
                };
                let one = self.f(1.0);
                self.select(c, one, zero)?
            }
            And => self.mul(a, b)?,
            Or => self.minmax(true, a, b)?,
            Xor => {
                let differ = build(self.b.f_ord_not_equal(self.bool, None, a, b))?;
                let one = self.f(1.0);
                self.select(differ, one, zero)?
            }
            other => {
                return Err(format!(
                    "binary.{} works on integers; only f32 arithmetic is generated yet",
                    other.word()
                ))
            }
        })
    }

    /// C `powf` on top of GLSL `pow`, which is undefined for a negative base and for a
    /// zero base with a non-positive exponent.
    fn pow(&mut self, x: Word, y: Word) -> R<Word> {
        let zero = self.f(0.0);
        let one = self.f(1.0);
        let two = self.f(2.0);
        let inf = self.f(f32::INFINITY);
        let nan = self.f(f32::NAN);
        let ax = self.ext(glsl::FABS, &[x])?;
        let p = self.ext(glsl::POW, &[ax, y])?;
        // Zero base: 0 for y > 0, inf for y < 0.
        let y_neg = self.lt(y, zero)?;
        let at_zero = self.select(y_neg, inf, zero)?;
        let base_zero = self.eq(ax, zero)?;
        let p = self.select(base_zero, at_zero, p)?;
        // Negative base: defined for integral y, negative for odd y.
        let fy = self.ext(glsl::FLOOR, &[y])?;
        let integral = self.eq(fy, y)?;
        let half = build(self.b.f_rem(self.f32, None, y, two))?;
        let odd = build(self.b.f_ord_not_equal(self.bool, None, half, zero))?;
        let negated = build(self.b.f_negate(self.f32, None, p))?;
        let signed = self.select(odd, negated, p)?;
        let negative_base = self.select(integral, signed, nan)?;
        let x_neg = self.lt(x, zero)?;
        let r = self.select(x_neg, negative_base, p)?;
        // x^0 = 1 for every x, NaN included.
        let y_zero = self.eq(y, zero)?;
        self.select(y_zero, one, r)
    }

    /// The value of `node`'s result `out` on `args`: [`Self::node`], rounded to f16 when
    /// `out` is f16. Every f16 value a fused kernel computes is rounded as if it had been
    /// stored, so fusion never changes a result (the reference, the CPU kernels and ONNX
    /// round each f16 op's result); arithmetic inside an op stays f32.
    fn node_value(
        &mut self,
        node: &rafter_ir::Node,
        args: &[Option<Word>],
        out: ValueId,
    ) -> R<Word> {
        if self.int_mode {
            return self.int_node(node, args, out);
        }
        if matches!(node.op, Op::QuantizeLinear { .. }) {
            return self.quantize(node, args, out);
        }
        let v = self.node(&node.op, args, &node.name)?;
        if self.body.value(out).ty.dtype == DType::F16 {
            return elem::round_to_half(&mut self.b, self.f32, v);
        }
        Ok(v)
    }

    /// ONNX QuantizeLinear of `args` (x, scale, zero point?) to `out`'s integer type:
    /// `saturate(round_half_even(x / scale) + zero_point)`, NaN rounding to 0, as the
    /// reference does. The quotient is rounded to f16 when x and the scale both are f16
    /// (NumPy divides in their common type; f32's quotient rounded once more to f16 is
    /// the f16 quotient, f32 having over twice f16's precision). Every step is exact in
    /// f32 past the division: the result is an integer of at most 16 bits.
    fn quantize(&mut self, node: &rafter_ir::Node, args: &[Option<Word>], out: ValueId) -> R<Word> {
        let (lo, hi) = match self.body.value(out).ty.dtype {
            DType::I8 => (-128.0, 127.0),
            DType::U8 => (0.0, 255.0),
            DType::I16 => (-32768.0, 32767.0),
            DType::U16 => (0.0, 65535.0),
            other => return Err(format!("node `{}`: quantize to {other}", node.name)),
        };
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| format!("node `{}`: operand {i} is missing", node.name))
        };
        let (x, scale) = (arg(0)?, arg(1)?);
        let mut q = self.div_exact(x, scale)?;
        let dtype_of = |i: usize| node.input(i).map(|v| self.body.value(v).ty.dtype);
        if dtype_of(0) == Some(DType::F16) && dtype_of(1) == Some(DType::F16) {
            q = elem::round_to_half(&mut self.b, self.f32, q)?;
        }
        let r = self.ext(glsl::ROUND_EVEN, &[q])?;
        let zero = self.f(0.0);
        let nan = self.is_nan(r)?;
        let mut r = self.select(nan, zero, r)?;
        if let Some(zp) = args.get(2).copied().flatten() {
            r = self.add(r, zp)?;
        }
        let (lo, hi) = (self.f(lo), self.f(hi));
        self.ext(glsl::FCLAMP, &[r, lo, hi])
    }

    /// The value of node `op` on `args` (absent optional operands are `None`).
    fn node(&mut self, op: &Op, args: &[Option<Word>], name: &str) -> R<Word> {
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| format!("node `{name}`: operand {i} is missing"))
        };
        let zero = self.f(0.0);
        let one = self.f(1.0);
        Ok(match op {
            // Reshape-like ops and transposes move no value: their operand was read at the
            // right element (linear order, or through the transpose's strides).
            Op::Identity
            | Op::Reshape { .. }
            | Op::Flatten { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Transpose { .. }
            // An expand is a broadcast, which every value gets by being read at the
            // output's coordinates.
            | Op::Expand => arg(0)?,
            // f32 to f16 rounds in `node_value`, as every f16 result does; an integer or a
            // bool is already its f32 value.
            Op::Cast { to: DType::F32 | DType::F16 } => arg(0)?,
            // Nonzero or NaN is true, as the reference's cast.
            Op::Cast { to: DType::Bool } => {
                let x = arg(0)?;
                let set = build(self.b.f_unord_not_equal(self.bool, None, x, zero))?;
                self.select(set, one, zero)?
            }
            // Truncated toward zero, NaN to 0, saturated at the type's range (the store
            // saturates i32 and i64 at their maxima, which f32 does not hold).
            Op::Cast { to } => {
                let (lo, hi) = match to {
                    DType::I8 => (-128.0, 127.0),
                    DType::U8 => (0.0, 255.0),
                    DType::I32 => (-(2f32.powi(31)), 2f32.powi(31)),
                    DType::I64 => (-(2f32.powi(63)), 2f32.powi(63)),
                    other => return Err(format!("node `{name}`: a cast to {other}")),
                };
                let x = arg(0)?;
                let nan = build(self.b.is_nan(self.bool, None, x))?;
                let x = self.select(nan, zero, x)?;
                let t = self.ext(glsl::TRUNC, &[x])?;
                let (lo, hi) = (self.f(lo), self.f(hi));
                self.ext(glsl::FCLAMP, &[t, lo, hi])?
            }
            // ONNX DequantizeLinear: (x - zero_point) * scale, the difference exact (8- or
            // 16-bit integers; wider ones are refused by `check_integers`), one rounding.
            Op::DequantizeLinear { .. } => {
                let mut x = arg(0)?;
                if let Some(zp) = args.get(2).copied().flatten() {
                    x = self.sub(x, zp)?;
                }
                self.mul(x, arg(1)?)?
            }
            Op::Where => {
                let cond = arg(0)?;
                let set = build(self.b.f_ord_not_equal(self.bool, None, cond, zero))?;
                self.select(set, arg(1)?, arg(2)?)?
            }
            Op::Unary { op } => self.unary(*op, arg(0)?)?,
            Op::Binary { op } => self.binary(*op, arg(0)?, arg(1)?)?,
            Op::IsInf {
                detect_negative,
                detect_positive,
            } => {
                // 1.0 (true) at an infinity of a detected sign.
                let x = arg(0)?;
                let inf = build(self.b.is_inf(self.bool, None, x))?;
                let neg = self.lt(x, zero)?;
                let sign_ok = match (detect_negative, detect_positive) {
                    (true, true) => inf,
                    (true, false) => self.and(inf, neg)?,
                    (false, true) => {
                        let pos = build(self.b.logical_not(self.bool, None, neg))?;
                        self.and(inf, pos)?
                    }
                    (false, false) => self.b.constant_false(self.bool),
                };
                let one = self.f(1.0);
                self.select(sign_ok, one, zero)?
            }
            Op::Clip => {
                let mut v = arg(0)?;
                if let Some(lo) = args.get(1).copied().flatten() {
                    let below = self.lt(v, lo)?;
                    v = self.select(below, lo, v)?;
                }
                if let Some(hi) = args.get(2).copied().flatten() {
                    let above = self.gt(v, hi)?;
                    v = self.select(above, hi, v)?;
                }
                v
            }
            Op::LeakyRelu { alpha } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let neg = self.lt(x, zero)?;
                let scaled = self.mul(a, x)?;
                self.select(neg, scaled, x)?
            }
            Op::Elu { alpha } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let e = self.expm1(x)?;
                let scaled = self.mul(a, e)?;
                let pos = self.gt(x, zero)?;
                self.select(pos, x, scaled)?
            }
            Op::Selu { alpha, gamma } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let g = self.f(*gamma);
                let e = self.expm1(x)?;
                let scaled = self.mul(a, e)?;
                let pos = self.gt(x, zero)?;
                let v = self.select(pos, x, scaled)?;
                self.mul(g, v)?
            }
            Op::Celu { alpha } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let m = self.ext(glsl::FMAX, &[x, zero])?;
                let q = self.div(x, a)?;
                let e = self.expm1(q)?;
                let s = self.mul(a, e)?;
                let n = self.ext(glsl::FMIN, &[s, zero])?;
                let r = self.add(m, n)?;
                self.keep_nan(x, r)?
            }
            Op::HardSigmoid { alpha, beta } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let bb = self.f(*beta);
                let t = self.mul(a, x)?;
                let v = self.add(t, bb)?;
                let c = self.ext(glsl::FCLAMP, &[v, zero, one])?;
                self.keep_nan(v, c)?
            }
            Op::ThresholdedRelu { alpha } => {
                let x = arg(0)?;
                let a = self.f(*alpha);
                let above = self.gt(x, a)?;
                self.select(above, x, zero)?
            }
            Op::Shrink { bias, lambd } => {
                let x = arg(0)?;
                let l = self.f(*lambd);
                let nl = self.f(-*lambd);
                let bias = self.f(*bias);
                let below = self.lt(x, nl)?;
                let above = self.gt(x, l)?;
                let plus = self.add(x, bias)?;
                let minus = self.sub(x, bias)?;
                let r = self.select(above, minus, zero)?;
                self.select(below, plus, r)?
            }
            Op::Gelu { approximate } => {
                let x = arg(0)?;
                let half = self.f(0.5);
                let inner = match approximate {
                    GeluApprox::None => {
                        let k = self.f(std::f32::consts::FRAC_1_SQRT_2);
                        let s = self.mul(x, k)?;
                        self.erf(s)?
                    }
                    GeluApprox::Tanh => {
                        let k = self.f((2.0f64 / std::f64::consts::PI).sqrt() as f32);
                        let c = self.f(0.044715);
                        let x2 = self.mul(x, x)?;
                        let x3 = self.mul(x2, x)?;
                        let t = self.mul(c, x3)?;
                        let t = self.add(x, t)?;
                        let t = self.mul(k, t)?;
                        self.tanh(t)?
                    }
                };
                let t = self.add(one, inner)?;
                let hx = self.mul(half, x)?;
                self.mul(hx, t)?
            }
            other => {
                return Err(format!(
                    "node `{name}`: op `{}` is not an elementwise op this generator knows",
                    other.name()
                ))
            }
        })
    }

    fn emit(mut self) -> R<Vec<u32>> {
        let body = self.body;
        let bindings = body.inputs.len() + body.outputs.len();
        let (f32, u32) = (self.f32, self.u32);
        let b = &mut self.b;

        // struct { float data[]; } in PhysicalStorageBuffer: what each address points to.
        let array = b.type_runtime_array(f32);
        b.decorate(array, Decoration::ArrayStride, [Arg::LiteralBit32(4)]);
        let block = b.type_struct([array]);
        b.decorate(block, Decoration::Block, []);
        b.member_decorate(block, 0, Decoration::Offset, [Arg::LiteralBit32(0)]);
        let ptr_block = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, block);

        // Push constants: one pointer per binding, then the element count, then the dim
        // params; past `INLINE_BINDINGS` bindings the same block lives in memory and the
        // push constants hold its address (`matmul::push_block` says why).
        let n_dims = self.table.params.len();
        let table = bindings > crate::grid::INLINE_BINDINGS;
        let u64 = b.type_int(64, 0);
        let mut members = vec![ptr_block; bindings];
        members.extend(std::iter::repeat_n(u32, 1 + n_dims));
        if table {
            members = vec![u64];
        }
        let push = b.type_struct(members.iter().copied());
        b.decorate(push, Decoration::Block, []);
        for (i, _) in members.iter().enumerate() {
            let offset = if i < bindings {
                8 * i
            } else {
                8 * bindings + 4 * (i - bindings)
            };
            b.member_decorate(
                push,
                i as u32,
                Decoration::Offset,
                [Arg::LiteralBit32(offset as u32)],
            );
        }
        let ptr_push = b.type_pointer(None, StorageClass::PushConstant, push);
        let push_var = b.variable(ptr_push, None, StorageClass::PushConstant, None);
        let ptr_push_block = b.type_pointer(None, StorageClass::PushConstant, ptr_block);
        let ptr_push_u32 = b.type_pointer(None, StorageClass::PushConstant, u32);

        let v3 = b.type_vector(u32, 3);
        let ptr_in_v3 = b.type_pointer(None, StorageClass::Input, v3);
        let gid_var = b.variable(ptr_in_v3, None, StorageClass::Input, None);
        b.decorate(
            gid_var,
            Decoration::BuiltIn,
            [Arg::BuiltIn(BuiltIn::GlobalInvocationId)],
        );
        let groups_var = b.variable(ptr_in_v3, None, StorageClass::Input, None);
        b.decorate(
            groups_var,
            Decoration::BuiltIn,
            [Arg::BuiltIn(BuiltIn::NumWorkgroups)],
        );

        let mut interface = vec![push_var, gid_var, groups_var];
        let vectors: Vec<Vec<f32>> = self.lane_consts.iter().map(|(_, v)| v.clone()).collect();
        let vars = crate::matmul::declare_const_rows(b, f32, u32, &vectors);
        interface.extend(&vars);
        for ((v, _), var) in self.lane_consts.iter().zip(vars) {
            self.lane_const_vars.insert(*v, var);
        }
        // A row kernel: its workgroup and invocation ids and the reduction's scratch.
        let row_vars = if self.rows {
            let wg_var = b.variable(ptr_in_v3, None, StorageClass::Input, None);
            b.decorate(
                wg_var,
                Decoration::BuiltIn,
                [Arg::BuiltIn(BuiltIn::WorkgroupId)],
            );
            let lid_var = b.variable(ptr_in_v3, None, StorageClass::Input, None);
            b.decorate(
                lid_var,
                Decoration::BuiltIn,
                [Arg::BuiltIn(BuiltIn::LocalInvocationId)],
            );
            let len = b.constant_bit32(u32, ROW_WORKGROUP_SIZE);
            let arr = b.type_array(f32, len);
            let ptr_arr = b.type_pointer(None, StorageClass::Workgroup, arr);
            let scratch = b.variable(ptr_arr, None, StorageClass::Workgroup, None);
            let ptr_wg = b.type_pointer(None, StorageClass::Workgroup, f32);
            interface.extend([wg_var, lid_var, scratch]);
            Some((wg_var, lid_var, scratch, ptr_wg))
        } else {
            None
        };

        let local_size = if self.rows {
            ROW_WORKGROUP_SIZE
        } else {
            WORKGROUP_SIZE
        };
        begin_main(&mut self.b, self.void, interface, [local_size, 1, 1])?;

        let entry = build(self.b.begin_block(None))?;
        let groups = build(self.b.load(v3, None, groups_var, None, []))?;
        let groups_x = build(self.b.composite_extract(u32, None, groups, [0]))?;
        // The grid-stride loop's stride uses NumWorkgroups read as at least 1: a stride of 0
        // would never end the loop. Defensive only: the HAL never records a zero-sized grid,
        // and this clamp did not cure the NVIDIA stall of issue 28 it was written for
        // (benchmarks/results/stall-2026-11-28-1700.md). A smaller stride than the grid's
        // only overlaps workgroups' elements (same values written), never skips any.
        let one = self.u(1);
        let glsl = self.glsl;
        let groups_x = build(self.b.ext_inst(
            u32,
            None,
            glsl,
            41, // UMax
            [Arg::IdRef(groups_x), Arg::IdRef(one)],
        ))?;
        let (first, stride) = match row_vars {
            // Rows: workgroup w takes rows w, w + groups, ...
            Some((wg_var, lid_var, scratch, ptr_wg)) => {
                let wg = build(self.b.load(v3, None, wg_var, None, []))?;
                let first = build(self.b.composite_extract(u32, None, wg, [0]))?;
                let lid = build(self.b.load(v3, None, lid_var, None, []))?;
                let lid = build(self.b.composite_extract(u32, None, lid, [0]))?;
                self.row = Some(RowIds {
                    lid,
                    scratch,
                    ptr_wg,
                });
                (first, groups_x)
            }
            None => {
                let gid = build(self.b.load(v3, None, gid_var, None, []))?;
                let first = build(self.b.composite_extract(u32, None, gid, [0]))?;
                let local = self.u(WORKGROUP_SIZE);
                (first, build(self.b.i_mul(u32, None, groups_x, local))?)
            }
        };
        // Member `i` of the argument block: read from the push constants, or through the
        // block's pushed address.
        let table_base = if table {
            let ptr = self.b.type_pointer(None, StorageClass::PushConstant, u64);
            let zero = self.u(0);
            let p = build(self.b.access_chain(ptr, None, push_var, [zero]))?;
            Some(build(self.b.load(u64, None, p, None, []))?)
        } else {
            None
        };
        let member = |this: &mut Self, i: usize, ty: Word, inline_ptr: Word| -> R<Word> {
            let Some(base) = table_base else {
                let index = this.u(i as u32);
                let p = build(this.b.access_chain(inline_ptr, None, push_var, [index]))?;
                return build(this.b.load(ty, None, p, None, []));
            };
            let (offset, align) = if i < bindings {
                (8 * i, 8)
            } else {
                (8 * bindings + 4 * (i - bindings), 4)
            };
            let offset = this.b.constant_bit64(u64, offset as u64);
            let at = build(this.b.i_add(u64, None, base, offset))?;
            let p_ty = this
                .b
                .type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
            let p = build(this.b.convert_u_to_ptr(p_ty, None, at))?;
            let align = [Arg::LiteralBit32(align)];
            build(this.b.load(ty, None, p, Some(MemoryAccess::ALIGNED), align))
        };
        let count = member(&mut self, bindings, u32, ptr_push_u32)?;
        for j in 0..n_dims {
            let w = member(&mut self, bindings + 1 + j, u32, ptr_push_u32)?;
            self.dim_words.push(w);
        }
        // Row lengths of a softmax or layer norm (and the softmax's inner stride).
        let softmax_sizes = match self.softmax.clone() {
            Some(plan) => Some((self.dim(&plan.lane)?, self.product(&plan.inner)?)),
            None => None,
        };
        let norm_lane = match self.norm.clone() {
            Some(plan) => Some(self.product(&plan.lane)?),
            None => None,
        };
        let mut bases = Vec::with_capacity(bindings);
        for i in 0..bindings {
            if table {
                // The table holds plain 64-bit addresses.
                let address = member(&mut self, i, u64, ptr_push_block)?;
                bases.push(build(self.b.convert_u_to_ptr(ptr_block, None, address))?);
                self.addrs.push(address);
            } else {
                let base = member(&mut self, i, ptr_block, ptr_push_block)?;
                bases.push(base);
                self.addrs
                    .push(build(self.b.convert_ptr_to_u(u64, None, base))?);
            }
        }
        let zero_index = self.u(0);

        // Scalars (single-element inputs and constants) are read once, before the loop.
        let mut values: HashMap<ValueId, Word> = HashMap::new();
        for (i, (&input, kind)) in body.inputs.iter().zip(self.inputs).enumerate() {
            if *kind == Operand::Scalar {
                let v = self.load(i, zero_index)?;
                values.insert(input, v);
            }
        }
        for (i, value) in body.values.iter().enumerate() {
            let v = ValueId(i as u32);
            if self.meta.contains(&v) || self.lane_const_vars.contains_key(&v) {
                continue;
            }
            if let ValueDef::Const(c) = value.def {
                let data = body.constant(c);
                let v = data
                    .to_f64s()
                    .first()
                    .copied()
                    .ok_or_else(|| format!("constant %{} is empty", value.name))?;
                let id = if self.int_mode {
                    let v = data
                        .to_i64s()
                        .and_then(|v| v.first().copied())
                        .ok_or_else(|| format!("constant %{} is not an integer", value.name))?;
                    self.i64_const(v)
                } else {
                    self.f(v as f32)
                };
                values.insert(ValueId(i as u32), id);
            }
        }

        let (header, cond, body_label, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let next = self.b.id();
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(header)))?;
        let index = build(self.b.phi(u32, None, [(first, entry), (next, cont)]))?;
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;

        build(self.b.begin_block(Some(cond)))?;
        let bool_ty = self.bool;
        let bound = match (softmax_sizes, norm_lane) {
            // One invocation per lane: the rows are count / lane.
            (Some((lane, _)), _) | (None, Some(lane)) => {
                let lane = self.uw(lane);
                build(self.b.u_div(u32, None, count, lane))?
            }
            (None, None) => count,
        };
        let in_range = build(self.b.u_less_than(bool_ty, None, index, bound))?;
        build(self.b.branch_conditional(in_range, body_label, merge, []))?;

        build(self.b.begin_block(Some(body_label)))?;
        if let (Some(plan), Some((lane, inner))) = (self.softmax.clone(), softmax_sizes) {
            self.softmax_row(&plan, (lane, inner), index)?;
            build(self.b.branch(cont))?;
            return self.finish_loop(cont, next, index, stride, header, merge);
        }
        if let (Some(plan), Some(lane)) = (self.norm.clone(), norm_lane) {
            self.norm_row(&plan, lane, index, &values)?;
            build(self.b.branch(cont))?;
            return self.finish_loop(cont, next, index, stride, header, merge);
        }
        if let Some(plan) = self.reduce.clone() {
            let result = self.reduce_lane(&plan, index)?;
            self.store(body.inputs.len(), index, result)?;
            build(self.b.branch(cont))?;
            return self.finish_loop(cont, next, index, stride, header, merge);
        }
        // Element addresses are computed as 64-bit integers, `base + index * size`, not by
        // access chains into the block's runtime array: with those (32- or 64-bit index)
        // NVIDIA's driver (580, H100) never wrote an element past byte 2^32 of a buffer
        // (rafter-hal-vulkan's tests/big_buffer.rs).
        for (i, (&input, kind)) in body.inputs.iter().zip(self.inputs).enumerate() {
            let at = match kind {
                Operand::Tensor => index,
                Operand::Scalar | Operand::Unread => continue,
                Operand::Lane | Operand::Repeated => {
                    return Err("a row operand outside a norm".into())
                }
                Operand::Broadcast => {
                    let strides = self.strides[i].clone().ok_or("broadcast without strides")?;
                    self.broadcast_at(&strides, index)?
                }
            };
            let v = self.load(i, at)?;
            values.insert(input, v);
        }
        for (v, strides) in self.const_strides.clone() {
            let at = self.broadcast_at(&strides, index)?;
            let var = self.lane_const_vars[&v];
            let ptr_private = self.b.type_pointer(None, StorageClass::Private, self.f32);
            let p = build(self.b.access_chain(ptr_private, None, var, [at]))?;
            let x = build(self.b.load(self.f32, None, p, None, []))?;
            values.insert(v, x);
        }
        for node in &body.nodes {
            let args: Vec<Option<Word>> = node
                .inputs
                .iter()
                .map(|v| v.and_then(|v| values.get(&v).copied()))
                .collect();
            if node.outputs.len() != 1 || node.outputs[0].is_none() {
                return Err(format!("node `{}` must have exactly one result", node.name));
            }
            let out = node.outputs[0].expect("checked");
            let result = self.node_value(node, &args, out)?;
            values.insert(out, result);
        }
        for (o, &output) in body.outputs.iter().enumerate() {
            let v = *values
                .get(&output)
                .ok_or_else(|| format!("output %{} is never computed", body.value(output).name))?;
            self.store(body.inputs.len() + o, index, v)?;
        }
        build(self.b.branch(cont))?;

        self.finish_loop(cont, next, index, stride, header, merge)
    }

    /// The element index, in a tensor broadcast to the output through `strides`, of the
    /// output's element `index`: the sum over dims of
    /// `((index / out_stride) % out_dim) * in_stride`.
    fn broadcast_at(&mut self, strides: &[Stride], index: Word) -> R<Word> {
        let mut at = U::C(0);
        let mut out_stride = U::C(1);
        let out_shape = self.out_shape.clone();
        for d in (0..out_shape.len()).rev() {
            let n = self.dim(&out_shape[d])?;
            if n != U::C(1) {
                if let Some(factors) = &strides[d] {
                    let mut c = self.udiv(U::W(index), out_stride)?;
                    // The outermost coordinate is below its dim already.
                    if d != 0 {
                        c = self.umod(c, n)?;
                    }
                    let k = self.product(factors)?;
                    c = self.umul(c, k)?;
                    at = self.uadd(at, c)?;
                }
            }
            out_stride = self.umul(out_stride, n)?;
        }
        Ok(self.uw(at))
    }

    /// The grid-stride loop's continue block and the function's end.
    fn finish_loop(
        mut self,
        cont: Word,
        next: Word,
        index: Word,
        stride: Word,
        header: Word,
        merge: Word,
    ) -> R<Vec<u32>> {
        let u32 = self.u32;
        build(self.b.begin_block(Some(cont)))?;
        build(self.b.i_add(u32, Some(next), index, stride))?;
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(merge)))?;
        build(self.b.ret())?;
        build(self.b.end_function())?;
        Ok(self.b.module().assemble())
    }

    /// `sum over parts of ((v / divisor) % size) * stride`: an element index from a linear
    /// index and a plan of `(divisor, size, stride)` parts.
    fn strided(&mut self, v: Word, parts: &[(u32, u32, u32)]) -> R<Word> {
        let u32 = self.u32;
        let mut at: Option<Word> = None;
        for &(divisor, size, stride) in parts {
            if size == 1 {
                continue;
            }
            let mut c = v;
            if divisor != 1 {
                let d = self.u(divisor);
                c = build(self.b.u_div(u32, None, c, d))?;
            }
            let n = self.u(size);
            c = build(self.b.u_mod(u32, None, c, n))?;
            if stride != 1 {
                let k = self.u(stride);
                c = build(self.b.i_mul(u32, None, c, k))?;
            }
            at = Some(match at {
                Some(a) => build(self.b.i_add(u32, None, a, c))?,
                None => c,
            });
        }
        Ok(match at {
            Some(a) => a,
            None => self.u(0),
        })
    }

    /// A structured loop `for k in 0..n` carrying one f32 accumulator from `init`;
    /// `step(self, k, acc)` emits the body and returns the next accumulator. Returns the
    /// final accumulator; the builder is left in the block after the loop.
    fn lane_loop(
        &mut self,
        n: U,
        init: Word,
        step: &mut dyn FnMut(&mut Self, Word, Word) -> R<Word>,
    ) -> R<Word> {
        self.lane_loop_from(U::C(0), U::C(1), n, init, step)
    }

    /// A loop over the `n` elements of a row: all of them in one invocation, or in a row
    /// kernel this invocation's share (`k = lid, lid + workgroup size, ...`).
    fn row_loop(
        &mut self,
        n: U,
        init: Word,
        step: &mut dyn FnMut(&mut Self, Word, Word) -> R<Word>,
    ) -> R<Word> {
        match self.row {
            Some(ids) => {
                self.lane_loop_from(U::W(ids.lid), U::C(ROW_WORKGROUP_SIZE), n, init, step)
            }
            None => self.lane_loop(n, init, step),
        }
    }

    /// In a row kernel, combines every invocation's `v` (max or sum) through workgroup
    /// memory in a tree and returns the result to all; else `v`. Called in uniform control
    /// flow (every invocation of the workgroup reaches it).
    fn combine(&mut self, v: Word, max: bool) -> R<Word> {
        let Some(ids) = self.row else {
            return Ok(v);
        };
        let (f32, bool_ty) = (self.f32, self.bool);
        let slot = build(
            self.b
                .access_chain(ids.ptr_wg, None, ids.scratch, [ids.lid]),
        )?;
        build(self.b.store(slot, v, None, []))?;
        self.barrier()?;
        let mut half = ROW_WORKGROUP_SIZE / 2;
        while half >= 1 {
            let h = self.u(half);
            let active = build(self.b.u_less_than(bool_ty, None, ids.lid, h))?;
            let (then, done) = (self.b.id(), self.b.id());
            build(self.b.selection_merge(done, SelectionControl::NONE))?;
            build(self.b.branch_conditional(active, then, done, []))?;
            build(self.b.begin_block(Some(then)))?;
            let other = build(self.b.i_add(self.u32, None, ids.lid, h))?;
            let other = build(self.b.access_chain(ids.ptr_wg, None, ids.scratch, [other]))?;
            let a = build(self.b.load(f32, None, slot, None, []))?;
            let b = build(self.b.load(f32, None, other, None, []))?;
            let r = if max {
                self.ext(glsl::FMAX, &[a, b])?
            } else {
                self.add(a, b)?
            };
            build(self.b.store(slot, r, None, []))?;
            build(self.b.branch(done))?;
            build(self.b.begin_block(Some(done)))?;
            self.barrier()?;
            half /= 2;
        }
        let zero = self.u(0);
        let first = build(self.b.access_chain(ids.ptr_wg, None, ids.scratch, [zero]))?;
        let r = build(self.b.load(f32, None, first, None, []))?;
        // Every invocation has read the result before the scratch is reused.
        self.barrier()?;
        Ok(r)
    }

    fn barrier(&mut self) -> R<()> {
        let scope = self.u(Scope::Workgroup as u32);
        let semantics =
            self.u((MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits());
        build(self.b.control_barrier(scope, scope, semantics))
    }

    /// [`Self::lane_loop`] over `k = from, from + by, ... < n`.
    fn lane_loop_from(
        &mut self,
        from: U,
        by: U,
        n: U,
        init: Word,
        step: &mut dyn FnMut(&mut Self, Word, Word) -> R<Word>,
    ) -> R<Word> {
        let (f32, u32, bool_ty) = (self.f32, self.u32, self.bool);
        let pre = self.b.selected_block().ok_or("no current block")?;
        let pre_label = self
            .b
            .module_ref()
            .functions
            .last()
            .and_then(|f| f.blocks.get(pre))
            .and_then(|b| b.label_id())
            .ok_or("no label")?;
        let zero = self.uw(from);
        let one = self.uw(by);
        let limit = self.uw(n);
        let (header, cond, body, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let (k_next, acc_next) = (self.b.id(), self.b.id());
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(header)))?;
        let k = build(self.b.phi(u32, None, [(zero, pre_label), (k_next, cont)]))?;
        let acc = build(self.b.phi(f32, None, [(init, pre_label), (acc_next, cont)]))?;
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;

        build(self.b.begin_block(Some(cond)))?;
        let in_range = build(self.b.u_less_than(bool_ty, None, k, limit))?;
        build(self.b.branch_conditional(in_range, body, merge, []))?;

        build(self.b.begin_block(Some(body)))?;
        let next = step(self, k, acc)?;
        build(self.b.branch(cont))?;

        build(self.b.begin_block(Some(cont)))?;
        build(self.b.copy_object(f32, Some(acc_next), next))?;
        build(self.b.i_add(u32, Some(k_next), k, one))?;
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(merge)))?;
        Ok(acc)
    }

    /// Softmax (or log-softmax) of row `r`: max, sum of `exp(x - max)`, then each output.
    fn softmax_row(&mut self, plan: &SoftmaxPlan, (lane, inner): (U, U), r: Word) -> R<()> {
        let start = self.lane_start((lane, inner), r)?;
        if plan.hard {
            return self.hardmax_row((lane, inner), start);
        }
        if let Some(p) = plan.lp {
            return self.lp_norm_row((lane, inner), start, p);
        }
        let at = |e: &mut Self, k: Word| -> R<Word> {
            let off = e.umul(U::W(k), inner)?;
            let at = e.uadd(start, off)?;
            Ok(e.uw(at))
        };
        let load = |e: &mut Self, k: Word| -> R<Word> {
            let at = at(e, k)?;
            e.load(0, at)
        };
        let minus_inf = self.f(f32::NEG_INFINITY);
        let m = self.row_loop(lane, minus_inf, &mut |e, k, acc| {
            let x = load(e, k)?;
            e.ext(glsl::FMAX, &[acc, x])
        })?;
        let m = self.combine(m, true)?;
        let zero = self.f(0.0);
        let sum = self.row_loop(lane, zero, &mut |e, k, acc| {
            let x = load(e, k)?;
            let d = e.sub(x, m)?;
            let ex = e.exp(d)?;
            e.add(acc, ex)
        })?;
        let sum = self.combine(sum, false)?;
        let log_sum = if plan.log {
            Some(self.ext(glsl::LOG, &[sum])?)
        } else {
            None
        };
        self.row_loop(lane, zero, &mut |e, k, acc| {
            let x = load(e, k)?;
            let d = e.sub(x, m)?;
            let y = match log_sum {
                Some(l) => e.sub(d, l)?,
                // Correctly rounded: an f16 output's rounding sees the f32 quotient.
                None => {
                    let ex = e.exp(d)?;
                    e.div_exact(ex, sum)?
                }
            };
            let at = at(e, k)?;
            e.store(1, at, y)?;
            Ok(acc)
        })?;
        Ok(())
    }

    /// The first element of lane `r` of a softmax: with `outer = r / inner` and
    /// `i = r % inner`, `outer * lane * inner + i` (its k-th element is `k * inner` further).
    fn lane_start(&mut self, (lane, inner): (U, U), r: Word) -> R<U> {
        let i = self.umod(U::W(r), inner)?;
        let outer = self.udiv(U::W(r), inner)?;
        let row = self.umul(lane, inner)?;
        let outer = self.umul(outer, row)?;
        self.uadd(outer, i)
    }

    /// Hardmax of the lane at `start`, as the reference's (NumPy's argmax): whether it holds
    /// a NaN, its largest number, the first position holding the NaN or that number (as
    /// the largest `-k`, exact in f32 below 2^24 elements), then 1 there and 0 elsewhere.
    /// Each pass combines over the workgroup in a row kernel.
    fn hardmax_row(&mut self, (lane, inner): (U, U), start: U) -> R<()> {
        let load = |e: &mut Self, k: Word| -> R<Word> {
            let off = e.umul(U::W(k), inner)?;
            let at = e.uadd(start, off)?;
            let at = e.uw(at);
            e.load(0, at)
        };
        let (zero, one, minus_inf) = (self.f(0.0), self.f(1.0), self.f(f32::NEG_INFINITY));
        let nan = self.row_loop(lane, zero, &mut |e, k, acc| {
            let x = load(e, k)?;
            let n = e.is_nan(x)?;
            e.select(n, one, acc)
        })?;
        let nan = self.combine(nan, true)?;
        let nan = self.eq(nan, one)?;
        let m = self.row_loop(lane, minus_inf, &mut |e, k, acc| {
            let x = load(e, k)?;
            let n = e.is_nan(x)?;
            let x = e.select(n, minus_inf, x)?;
            e.ext(glsl::FMAX, &[acc, x])
        })?;
        let m = self.combine(m, true)?;
        let first = self.row_loop(lane, minus_inf, &mut |e, k, acc| {
            let x = load(e, k)?;
            let is_nan = e.is_nan(x)?;
            let is_max = e.eq(x, m)?;
            let hit = build(e.b.select(e.bool, None, nan, is_nan, is_max))?;
            let kf = build(e.b.convert_u_to_f(e.f32, None, k))?;
            let neg = build(e.b.f_negate(e.f32, None, kf))?;
            let key = e.select(hit, neg, minus_inf)?;
            e.ext(glsl::FMAX, &[acc, key])
        })?;
        let first = self.combine(first, true)?;
        self.row_loop(lane, zero, &mut |e, k, acc| {
            let kf = build(e.b.convert_u_to_f(e.f32, None, k))?;
            let neg = build(e.b.f_negate(e.f32, None, kf))?;
            let hit = e.eq(neg, first)?;
            let y = e.select(hit, one, zero)?;
            let off = e.umul(U::W(k), inner)?;
            let at = e.uadd(start, off)?;
            let at = e.uw(at);
            e.store(1, at, y)?;
            Ok(acc)
        })?;
        Ok(())
    }

    /// `lp_norm` of the lane at `start`, as the reference's: the norm (the sum of `|x|`, or
    /// the root of the sum of squares), then `x / norm`, 0 where the norm is 0.
    fn lp_norm_row(&mut self, (lane, inner): (U, U), start: U, p: u32) -> R<()> {
        let at = |e: &mut Self, k: Word| -> R<Word> {
            let off = e.umul(U::W(k), inner)?;
            let at = e.uadd(start, off)?;
            Ok(e.uw(at))
        };
        let zero = self.f(0.0);
        let sum = self.row_loop(lane, zero, &mut |e, k, acc| {
            let i = at(e, k)?;
            let x = e.load(0, i)?;
            let t = if p == 1 {
                e.ext(glsl::FABS, &[x])?
            } else {
                e.mul(x, x)?
            };
            e.add(acc, t)
        })?;
        let sum = self.combine(sum, false)?;
        let norm = if p == 1 {
            sum
        } else {
            self.ext(glsl::SQRT, &[sum])?
        };
        let is_zero = self.eq(norm, zero)?;
        self.row_loop(lane, zero, &mut |e, k, acc| {
            let i = at(e, k)?;
            let x = e.load(0, i)?;
            let y = e.div_exact(x, norm)?;
            let y = e.select(is_zero, zero, y)?;
            e.store(1, i, y)?;
            Ok(acc)
        })?;
        Ok(())
    }

    /// The values `wanted` of a layer norm's prologue at element `k` of the row starting at
    /// element `start`: loads the inputs they need (per element or per row position) and
    /// evaluates the prologue nodes on the way.
    fn norm_values(
        &mut self,
        (start, k): (U, Word),
        invariant: &HashMap<ValueId, Word>,
        wanted: &[ValueId],
    ) -> R<HashMap<ValueId, Word>> {
        let body = self.body;
        let prologue = &body.nodes[..body.nodes.len() - 1];
        // The values `wanted` depends on.
        let mut needed: HashSet<ValueId> = wanted.iter().copied().collect();
        for n in prologue.iter().rev() {
            if n.outputs.iter().flatten().any(|o| needed.contains(o)) {
                needed.extend(n.inputs.iter().flatten().copied());
            }
        }
        let mut values = invariant.clone();
        let flat = self.uadd(start, U::W(k))?;
        let at = self.uw(flat);
        for (i, (&input, kind)) in body.inputs.iter().zip(self.inputs).enumerate() {
            let index = match kind {
                _ if !needed.contains(&input) => continue,
                Operand::Tensor => at,
                Operand::Lane => k,
                Operand::Repeated => {
                    let dims = self
                        .norm
                        .as_ref()
                        .and_then(|n| n.repeated.iter().find(|(j, _)| *j == i))
                        .map(|(_, d)| d.clone())
                        .ok_or("a repeated operand without its dims")?;
                    let count = self.product(&dims)?;
                    let index = self.umod(flat, count)?;
                    self.uw(index)
                }
                _ => continue,
            };
            let v = self.load(i, index)?;
            values.insert(input, v);
        }
        // In value order, so the module's bytes do not depend on the map's order.
        let mut lane_consts: Vec<(ValueId, Word)> = self
            .lane_const_vars
            .iter()
            .filter(|(v, _)| needed.contains(v))
            .map(|(&v, &var)| (v, var))
            .collect();
        lane_consts.sort_by_key(|(v, _)| v.0);
        for (v, var) in lane_consts {
            let ptr_private = self.b.type_pointer(None, StorageClass::Private, self.f32);
            let p = build(self.b.access_chain(ptr_private, None, var, [k]))?;
            let x = build(self.b.load(self.f32, None, p, None, []))?;
            values.insert(v, x);
        }
        for n in prologue {
            let Some(Some(out)) = n.outputs.first() else {
                return Err(format!("node `{}` has no result", n.name));
            };
            if !needed.contains(out) {
                continue;
            }
            let args: Vec<Option<Word>> = n
                .inputs
                .iter()
                .map(|v| v.and_then(|v| values.get(&v).copied()))
                .collect();
            let result = self.node_value(n, &args, *out)?;
            values.insert(*out, result);
        }
        Ok(values)
    }

    /// Layer or RMS norm of row `r` (`lane` elements): the mean (0 for an rms_norm), the
    /// variance around it, then `(x - mean) / sqrt(var + epsilon) * scale + bias` per element.
    fn norm_row(
        &mut self,
        plan: &NormPlan,
        lane: U,
        r: Word,
        invariant: &HashMap<ValueId, Word>,
    ) -> R<()> {
        let f32 = self.f32;
        let start = self.umul(U::W(r), lane)?;
        let lane_word = self.uw(lane);
        let n = build(self.b.convert_u_to_f(f32, None, lane_word))?;
        let zero = self.f(0.0);
        let x_of = |e: &mut Self, k: Word| -> R<Word> {
            let v = e.norm_values((start, k), invariant, &[plan.x])?;
            v.get(&plan.x)
                .copied()
                .ok_or_else(|| "x is never computed".into())
        };
        // An rms_norm measures the spread around 0 (its mean pass is skipped).
        let mean = if plan.rms {
            zero
        } else {
            let sum = self.row_loop(lane, zero, &mut |e, k, acc| {
                let x = x_of(e, k)?;
                e.add(acc, x)
            })?;
            let sum = self.combine(sum, false)?;
            self.div(sum, n)?
        };
        let squares = self.row_loop(lane, zero, &mut |e, k, acc| {
            let x = x_of(e, k)?;
            let d = e.sub(x, mean)?;
            let d2 = e.mul(d, d)?;
            e.add(acc, d2)
        })?;
        let squares = self.combine(squares, false)?;
        let var = self.div(squares, n)?;
        let eps = self.f(plan.epsilon);
        let var = self.add(var, eps)?;
        let dev = self.ext(glsl::SQRT, &[var])?;
        let one = self.f(1.0);
        let inv = self.div(one, dev)?;
        let out = self.body.inputs.len();
        self.norm_stats(plan, r, [mean, inv])?;
        let mut wanted = vec![plan.x, plan.scale];
        wanted.extend(plan.bias);
        self.row_loop(lane, zero, &mut |e, k, acc| {
            let v = e.norm_values((start, k), invariant, &wanted)?;
            let get = |id: ValueId| {
                v.get(&id)
                    .copied()
                    .ok_or_else(|| format!("%{} is never computed", e.body.value(id).name))
            };
            let (x, scale) = (get(plan.x)?, get(plan.scale)?);
            let bias = plan.bias.map(get).transpose()?;
            let d = e.sub(x, mean)?;
            let y = e.mul(d, inv)?;
            let mut y = e.mul(y, scale)?;
            if let Some(b) = bias {
                y = e.add(y, b)?;
            }
            let at = e.uadd(start, U::W(k))?;
            let at = e.uw(at);
            e.store(out, at, y)?;
            Ok(acc)
        })?;
        Ok(())
    }

    /// Stores row `r`'s mean and inverse deviation into the statistics outputs the plan
    /// has ([`NormPlan::stats`]); in a row kernel only invocation 0 stores (every one holds
    /// the same combined values).
    fn norm_stats(&mut self, plan: &NormPlan, r: Word, stats: [Word; 2]) -> R<()> {
        if plan.stats == 0 {
            return Ok(());
        }
        let done = self.b.id();
        if let Some(ids) = self.row {
            let zero = self.u(0);
            let first = build(self.b.i_equal(self.bool, None, ids.lid, zero))?;
            let then = self.b.id();
            build(self.b.selection_merge(done, SelectionControl::NONE))?;
            build(self.b.branch_conditional(first, then, done, []))?;
            build(self.b.begin_block(Some(then)))?;
        }
        let out = self.body.inputs.len();
        for (j, &v) in stats.iter().enumerate().take(plan.stats) {
            self.store(out + 1 + j, r, v)?;
        }
        if self.row.is_some() {
            build(self.b.branch(done))?;
            build(self.b.begin_block(Some(done)))?;
        }
        Ok(())
    }

    /// Reduces the lane of output element `o` (a loop over the reduced elements) and
    /// returns the result. Leaves the builder in a new block after the loop.
    fn reduce_lane(&mut self, plan: &ReducePlan, o: Word) -> R<Word> {
        let body_graph = self.body;
        let reduce_node = body_graph.nodes.last().ok_or("no nodes")?;
        let x_value = reduce_node.inputs[0].ok_or("reduce without an operand")?;
        // Loop-invariant values: single-element inputs and constants.
        let mut invariant: HashMap<ValueId, Word> = HashMap::new();
        for (i, (&input, kind)) in body_graph.inputs.iter().zip(self.inputs).enumerate() {
            if *kind == Operand::Scalar {
                let zero_index = self.u(0);
                let v = self.load(i, zero_index)?;
                invariant.insert(input, v);
            }
        }
        for (i, value) in body_graph.values.iter().enumerate() {
            let v = ValueId(i as u32);
            if let (ValueDef::Const(c), false) = (value.def, self.meta.contains(&v)) {
                let data = body_graph.constant(c);
                let x = data.to_f64s().first().copied().ok_or("empty constant")?;
                let id = self.f(x as f32);
                invariant.insert(v, id);
            }
        }
        let (f32, u32, bool_ty) = (self.f32, self.u32, self.bool);
        let lane_base = self.strided(o, &plan.kept)?;
        let pre = self.b.selected_block().ok_or("no current block")?;
        let pre_label = self
            .b
            .module_ref()
            .functions
            .last()
            .and_then(|f| f.blocks.get(pre))
            .and_then(|b| b.label_id())
            .ok_or("no label")?;
        use ReduceKind::*;
        let init = match plan.kind {
            Prod => self.f(1.0),
            Max => self.f(f32::NEG_INFINITY),
            Min => self.f(f32::INFINITY),
            _ => self.f(0.0),
        };
        let zero = self.u(0);
        let one = self.u(1);
        let lane = self.u(plan.lane);
        let (header, cond, body, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let (r_next, acc_next) = (self.b.id(), self.b.id());
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(header)))?;
        let r = build(self.b.phi(u32, None, [(zero, pre_label), (r_next, cont)]))?;
        let acc = build(self.b.phi(f32, None, [(init, pre_label), (acc_next, cont)]))?;
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;

        build(self.b.begin_block(Some(cond)))?;
        let in_range = build(self.b.u_less_than(bool_ty, None, r, lane))?;
        build(self.b.branch_conditional(in_range, body, merge, []))?;

        build(self.b.begin_block(Some(body)))?;
        let offset = self.strided(r, &plan.reduced)?;
        let index = build(self.b.i_add(u32, None, lane_base, offset))?;
        // The lane element of every full-shape input, then the prologue at that element.
        let mut values = invariant.clone();
        for (i, (&input, kind)) in body_graph.inputs.iter().zip(self.inputs).enumerate() {
            if *kind == Operand::Tensor {
                let v = self.load(i, index)?;
                values.insert(input, v);
            }
        }
        for n in &body_graph.nodes[..body_graph.nodes.len() - 1] {
            let args: Vec<Option<Word>> = n
                .inputs
                .iter()
                .map(|v| v.and_then(|v| values.get(&v).copied()))
                .collect();
            let out = n
                .outputs
                .first()
                .copied()
                .flatten()
                .ok_or("a node without a result")?;
            let result = self.node_value(n, &args, out)?;
            values.insert(out, result);
        }
        let x = *values
            .get(&x_value)
            .ok_or("the reduce operand is never computed")?;
        let step = match plan.kind {
            Sum | Mean | LogSum => self.add(acc, x)?,
            L1 => {
                let a = self.ext(glsl::FABS, &[x])?;
                self.add(acc, a)?
            }
            L2 | SumSquare => {
                let sq = self.mul(x, x)?;
                self.add(acc, sq)?
            }
            Prod => self.mul(acc, x)?,
            Max => self.minmax(true, acc, x)?,
            Min => self.minmax(false, acc, x)?,
            LogSumExp => return Err("log_sum_exp".into()),
        };
        build(self.b.branch(cont))?;

        build(self.b.begin_block(Some(cont)))?;
        build(self.b.copy_object(f32, Some(acc_next), step))?;
        build(self.b.i_add(u32, Some(r_next), r, one))?;
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(merge)))?;
        Ok(match plan.kind {
            Mean => {
                let n = self.f(plan.lane as f32);
                self.div(acc, n)?
            }
            L2 => self.ext(glsl::SQRT, &[acc])?,
            LogSum => self.ext(glsl::LOG, &[acc])?,
            _ => acc,
        })
    }
}
