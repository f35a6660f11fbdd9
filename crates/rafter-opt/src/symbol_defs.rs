//! Definitions of the symbols that shape arithmetic over symbolic inputs creates, so that
//! the buffers they size can be sized per call (and live on a GPU) rather than by their
//! producer on the host.
//!
//! Inference names a fresh symbol where a dim is not a polynomial of the inputs' symbols:
//! a strided convolution or pool over a symbolic height (`floor((h + 5) / 2)`), or a
//! broadcast of two different symbols (a residual `Add` of two such outputs). [`derive`]
//! walks the graph in order and, for each result dim that is a lone symbol nothing binds
//! yet, writes its definition from the op that made it, in terms of symbols bound before
//! (the inputs', or earlier definitions). Symbols it cannot define (data-dependent sizes:
//! NonZero, a Reshape to a computed shape, a ceil-mode pool) stay undefined, and the
//! buffers they size stay host-only (`Storage::Dynamic`) as before.
//!
//! A size an op takes from the *values* of a small graph input (a Reshape's target, an
//! Expand's shape, Pad's pads, Slice's bounds, Range's limits, Resize's scales, TopK's `k`, a
//! reduction's `axes`)
//! is defined too, as that one op ([`SymbolExpr::Values`]): the runtime re-runs its shape
//! inference on the call's input values when it binds the inputs, before any work runs.
//! Values computed by kernels (NonZero, Unique, or shape arithmetic inference does not
//! follow) are known only once their producer has run, and stay host-only.
//!
//! Each definition restates the output-size rule of ONNX for its op (the same one
//! inference and every executor apply); the runtime's executors check the tensors they
//! produce against the sizes these definitions give.

use std::collections::HashSet;

use rafter_ir::{AutoPad, Dim, Graph, Node, Op, Symbol, SymbolDef, SymbolExpr};

/// The definitions of the fresh symbols of `graph`'s results that follow from `bound`
/// (the symbols its inputs bind), in an order where each reads only symbols bound before.
pub fn derive(graph: &Graph, bound: &HashSet<Symbol>) -> Vec<SymbolDef> {
    let mut known = bound.clone();
    let mut defs = Vec::new();
    for (index, node) in graph.nodes.iter().enumerate() {
        let Some(&Some(out)) = node.outputs.first() else {
            continue;
        };
        let dims = graph.value(out).ty.dims.clone();
        for (axis, d) in dims.iter().enumerate() {
            let Some(s) = d.as_symbol() else { continue };
            if known.contains(s) {
                continue;
            }
            let expr = define(graph, node, axis, dims.len())
                .or_else(|| define_by_values(graph, index, axis));
            let Some(expr) = expr else {
                continue;
            };
            if expr.symbols().iter().all(|x| known.contains(x)) {
                known.insert(s.clone());
                defs.push(SymbolDef {
                    symbol: s.clone(),
                    expr,
                });
            }
        }
    }
    defs
}

/// Largest graph input (elements) whose values a definition reads at bind time.
const MAX_VALUE_ELEMENTS: i64 = 64;

/// Dim `axis` of node `index`'s first result as the op's shape inference on the values
/// it reads ([`SymbolExpr::Values`]), for the ops whose result sizes follow from operand
/// values (not from data, as NonZero's do). The values may be small graph inputs, or shape
/// arithmetic over them, over constants and over dims ([`value_slice`]): the body holds
/// the op and that arithmetic, which the runtime re-runs on the call's values.
fn define_by_values(g: &Graph, index: usize, axis: usize) -> Option<SymbolExpr> {
    let node = &g.nodes[index];
    let sized_by_values = matches!(
        node.op,
        Op::Reshape { .. }
            | Op::Expand
            | Op::Tile
            | Op::Pad { .. }
            | Op::Slice
            | Op::ConstantOfShape { .. }
            | Op::Range
            | Op::Resize { .. }
            | Op::TopK { .. }
            | Op::Split { .. }
            | Op::OneHot { .. }
            | Op::CenterCropPad { .. }
            | Op::Reduce { .. }
    );
    if !sized_by_values {
        return None;
    }
    let out = (*node.outputs.first()?)?;
    let nodes = value_slice(g, index)?;
    let (body, outer_in, _) = crate::lower::build_body(g, &nodes, &node.name, |v| v == out);
    let reads: Vec<usize> = outer_in
        .iter()
        .enumerate()
        .filter(|(_, &v)| is_small_input(g, v))
        .map(|(i, _)| i)
        .collect();
    // With neither input values nor arithmetic to re-run, inference already did all it can.
    if (reads.is_empty() && nodes.len() == 1) || body.outputs.len() != 1 {
        return None;
    }
    Some(SymbolExpr::Values {
        body,
        reads,
        output: 0,
        axis,
    })
}

/// Most nodes of shape arithmetic a definition re-runs.
const MAX_SLICE_NODES: usize = 64;

/// Node `index` and the shape arithmetic its small operands come from, in graph order:
/// `None` where a small operand's values are not known before the call's work runs (a
/// kernel's result, a state, a large constant).
fn value_slice(g: &Graph, index: usize) -> Option<Vec<usize>> {
    let mut nodes = std::collections::BTreeSet::from([index]);
    for &v in g.nodes[index].inputs.iter().flatten() {
        if is_small_value(g, v) && !collect_arithmetic(g, v, &mut nodes) {
            return None;
        }
    }
    Some(nodes.into_iter().collect())
}

/// Whether `v`'s values are known on the host once the inputs are bound, adding the nodes
/// that compute them to `nodes`: small graph inputs, small constants, the results of
/// `Shape` and `Size` (dims only), and integer results of ops inference evaluates on known
/// element values (arithmetic, casts, gathers, concats, reshapes of such values).
fn collect_arithmetic(
    g: &Graph,
    v: rafter_ir::ValueId,
    nodes: &mut std::collections::BTreeSet<usize>,
) -> bool {
    match g.value(v).def {
        rafter_ir::ValueDef::Const(c) => {
            g.constant(c).bytes.len() <= crate::lower::INLINE_CONST_MAX_BYTES
        }
        rafter_ir::ValueDef::Input(_) => is_small_input(g, v),
        rafter_ir::ValueDef::Node { node, .. } => {
            let p = node.0 as usize;
            if nodes.contains(&p) {
                return true;
            }
            let op = &g.nodes[p].op;
            // Inference carries computed element values for integers only (a float range's
            // bounds cast from an input stay unknown to it).
            let computed_int = g.value(v).ty.dtype.is_int();
            if !is_value_arithmetic(op)
                || !computed_int
                || !is_small_value(g, v)
                || nodes.len() >= MAX_SLICE_NODES
            {
                return false;
            }
            nodes.insert(p);
            if matches!(op, Op::Shape { .. } | Op::Size) {
                return true;
            }
            g.nodes[p]
                .inputs
                .iter()
                .flatten()
                .all(|&u| collect_arithmetic(g, u, nodes))
        }
    }
}

/// Ops whose inference computes their results' element values from known operand values.
fn is_value_arithmetic(op: &Op) -> bool {
    matches!(
        op,
        Op::Shape { .. }
            | Op::Size
            | Op::Identity
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Where
            | Op::Clip
            | Op::Cast { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Slice
            | Op::Range
            | Op::Reduce { .. }
    )
}

/// Whether `v` is a small tensor (at most [`MAX_VALUE_ELEMENTS`] numbers, known dims, rank
/// at most 1): a shape, a count, bounds.
fn is_small_value(g: &Graph, v: rafter_ir::ValueId) -> bool {
    let ty = &g.value(v).ty;
    ty.rank() <= 1
        && (ty.dtype.is_int() || ty.dtype.is_float())
        && ty
            .known_dims()
            .is_some_and(|d| d.iter().product::<i64>() <= MAX_VALUE_ELEMENTS)
}

/// Whether `v` is a graph input of at most [`MAX_VALUE_ELEMENTS`] numbers (known dims, rank
/// at most 1): a shape, pads, bounds, scales or a count, cheap to read on the host.
fn is_small_input(g: &Graph, v: rafter_ir::ValueId) -> bool {
    let val = g.value(v);
    let rafter_ir::ValueDef::Input(i) = val.def else {
        return false;
    };
    // A state's values are the previous call's, not the caller's.
    if g.states.iter().any(|s| s.input == i) {
        return false;
    }
    is_small_value(g, v)
}

/// Dims of operand `i` of `node`, if present.
fn operand_dims<'g>(g: &'g Graph, node: &Node, i: usize) -> Option<&'g [Dim]> {
    node.inputs
        .get(i)
        .copied()
        .flatten()
        .map(|v| g.value(v).ty.dims.as_slice())
}

/// How `node`'s first result's dim `axis` (of a result of rank `rank`) follows from its
/// operands' dims, where this module knows the op's rule.
fn define(g: &Graph, node: &Node, axis: usize, rank: usize) -> Option<SymbolExpr> {
    match &node.op {
        Op::Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ..
        } => {
            // x [N, C, spatial...], w [M, C/g, kernel...].
            let i = axis.checked_sub(2)?;
            let input = operand_dims(g, node, 0)?.get(axis)?;
            let kernel = window_kernel(kernel_shape, operand_dims(g, node, 1)?, 2, i)?;
            let w = Window::new(strides, pads, dilations, rank - 2, i)?;
            window_out(input, kernel, &w, *auto_pad)
        }
        Op::ConvNhwc {
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ..
        } => {
            // x [N, spatial..., C], w [kernel..., C/g, M].
            let i = axis.checked_sub(1).filter(|_| axis + 1 < rank)?;
            let input = operand_dims(g, node, 0)?.get(axis)?;
            let kernel = window_kernel(kernel_shape, operand_dims(g, node, 1)?, 0, i)?;
            let w = Window::new(strides, pads, dilations, rank - 2, i)?;
            window_out(input, kernel, &w, *auto_pad)
        }
        Op::Pool {
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ceil_mode: false,
            ..
        } => {
            let i = axis.checked_sub(2)?;
            let input = operand_dims(g, node, 0)?.get(axis)?;
            let kernel = *kernel_shape.get(i)?;
            let w = Window::new(strides, pads, dilations, rank - 2, i)?;
            window_out(input, kernel, &w, *auto_pad)
        }
        Op::Binary { .. } | Op::Where => broadcast(g, node, axis, rank),
        _ => None,
    }
}

/// The kernel extent of spatial axis `i`: the attribute, else the weight's dim (known).
fn window_kernel(kernel_shape: &[i64], w: &[Dim], first: usize, i: usize) -> Option<i64> {
    match kernel_shape.get(i) {
        Some(&k) => Some(k),
        None if kernel_shape.is_empty() => w.get(first + i)?.as_known(),
        None => None,
    }
}

/// Stride, dilation and pads of one spatial axis, after ONNX's defaults.
struct Window {
    stride: i64,
    dilation: i64,
    pad_begin: i64,
    pad_end: i64,
}

impl Window {
    fn new(strides: &[i64], pads: &[i64], dilations: &[i64], n: usize, i: usize) -> Option<Self> {
        let pick = |v: &[i64], at: usize, default: i64| {
            if v.is_empty() {
                Some(default)
            } else {
                v.get(at).copied()
            }
        };
        let w = Window {
            stride: pick(strides, i, 1)?,
            dilation: pick(dilations, i, 1)?,
            pad_begin: pick(pads, i, 0)?,
            pad_end: pick(pads, i + n, 0)?,
        };
        (w.stride > 0 && w.dilation > 0).then_some(w)
    }
}

/// A window's output size over `input`: `ceil(in / s)` for SAME padding, else
/// `floor((in + pads - extent) / s) + 1`, written as one floor division.
fn window_out(input: &Dim, kernel: i64, w: &Window, auto_pad: AutoPad) -> Option<SymbolExpr> {
    let s = w.stride;
    let (num, den) = match auto_pad {
        AutoPad::SameUpper | AutoPad::SameLower => (input.add(&Dim::known(s - 1)), s),
        AutoPad::Valid | AutoPad::NotSet => {
            let (pb, pe) = match auto_pad {
                AutoPad::Valid => (0, 0),
                _ => (w.pad_begin, w.pad_end),
            };
            let extent = (kernel - 1).checked_mul(w.dilation)?.checked_add(1)?;
            let shift = pb.checked_add(pe)?.checked_sub(extent)?.checked_add(s)?;
            (input.add(&Dim::known(shift)), s)
        }
    };
    Some(SymbolExpr::FloorDiv { num, den })
}

/// A broadcast of exactly two different dims (after dropping 1s) at `axis` of a
/// right-aligned broadcast to rank `rank`.
fn broadcast(g: &Graph, node: &Node, axis: usize, rank: usize) -> Option<SymbolExpr> {
    let mut seen: Vec<&Dim> = Vec::new();
    for i in 0..node.inputs.len() {
        let dims = operand_dims(g, node, i)?;
        let Some(at) = (axis + dims.len()).checked_sub(rank) else {
            continue;
        };
        let d = &dims[at];
        if d.as_known() == Some(1) || seen.contains(&d) {
            continue;
        }
        seen.push(d);
    }
    match seen.as_slice() {
        [a, b] => Some(SymbolExpr::Broadcast {
            a: (*a).clone(),
            b: (*b).clone(),
        }),
        _ => None,
    }
}
