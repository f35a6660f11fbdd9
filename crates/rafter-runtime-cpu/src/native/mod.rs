//! Native CPU kernels on borrowed bytes.
//!
//! The tensor path ([`crate::dispatch`]) decodes every operand of a dispatch into an owned
//! `Tensor` (weights included), runs the body on the reference executor and encodes the
//! results back. A native kernel instead reads its operands as slices borrowed straight from
//! the dispatch's binding views and the weights' `Bytes` (the artifact's map), and writes its
//! results straight into the output bindings' views:
//!
//! ```text
//! session build:  select(body) ─ pattern match ─► Some(native kernel) | None (reference path)
//! per dispatch:   params → dims (symbols evaluated) → write views of the results
//!                 → read views of the operands → kernel.run(ins, outs)
//!                      Ok(true)   done
//!                      Ok(false)  shapes it does not cover: nothing written, views dropped,
//!                                 the reference path runs the whole body instead
//! ```
//!
//! One file per concern: [`operands`] (views, alignment, the misaligned-copy fallback),
//! [`epilogue`] (the elementwise tail fused into a contraction), [`matmul`], [`conv`],
//! [`conv_nhwc`], [`qconv`] (QLinearConv, ConvInteger), [`quantize`] (per-tensor Q/DQ,
//! DynamicQuantizeLinear), [`matmul_integer`] (MatMulInteger),
//! [`block_nhwc`] (a fused channels-last depthwise block), [`block_quant`] (MatMulNBits
//! weights), [`pool`], [`recurrent`] (LSTM, GRU, RNN), [`movement`] (reshape-likes,
//! transposes, concat, gather), [`norm`] (layer norm), [`lrn`] (local response normalisation), [`softmax`] (with an additive row
//! mask), [`cumulative`] (CumSum), [`elementwise`] (tile programs).
//!
//! # Aliasing
//! The memory planner binds a result to the bytes of an operand only in elementwise-only
//! kernels (see the `cpu` module and `rafter-hal-cpu`'s aliasing rule). Every other native
//! kernel holds all its views at once; the elementwise kernel copies its binding operands
//! (dropping each view) before it takes the result's writable view, so an in-place pair is
//! read whole before it is written. Should a view still be refused (the HAL checks every
//! view), the dispatch falls back to the reference path, which takes one view at a time.

mod block_nhwc;
mod block_quant;
mod cast;
mod conv;
mod conv_nhwc;
mod cumulative;
mod elementwise;
mod epilogue;
mod exact_int;
mod llm;
mod lrn;
mod matmul;
mod matmul_integer;
mod movement;
mod norm;
mod operands;
mod pool;
mod qconv;
mod quantize;
mod recurrent;
mod softmax;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rafter_hal_cpu::DispatchContext;
use rafter_ir::{DType, Graph, ValueDef, ValueId};

pub(crate) use operands::{In, Out};

use rafter_runtime::host::{lock, CallRegistry, Slots};
use rafter_runtime::{NativeStats, Tensor};

use crate::dispatch::{KernelDims, Operand, Params};

/// A kernel body computed natively on borrowed operands.
pub(crate) trait NativeKernel: Send + Sync {
    /// Computes the results from the operands (body inputs, then body outputs, in order).
    /// `Ok(false)`: these shapes are not covered; nothing has been written and the caller
    /// runs the reference path. `Err`: the operands are malformed (the dispatch fails).
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String>;

    /// The dims of the (single) result for these operands, when the kernel can tell them;
    /// needed only for results whose dims the symbols do not determine (host slots).
    fn out_dims(&self, _ins: &[In<'_>]) -> Option<Vec<usize>> {
        None
    }

    /// Whether the kernel takes its binding operands as copies, so that a result the
    /// planner bound over an operand (elementwise-only bodies) can be written in place.
    /// Only operands whose bytes a result shares are copied.
    fn copies_operands(&self) -> bool {
        false
    }

    /// Computes the kernel over its result's bytes when its one binding operand *is* the
    /// result (the planner's in-place pair), with no copy: `Ok(false)` when it cannot (the
    /// operand is then copied as usual). `y` holds the operand's values on entry.
    fn run_in_place(&self, _y: &mut Out<'_>) -> Result<bool, String> {
        Ok(false)
    }

    /// Computes the kernel when operand `aliased` *is* the result's bytes and has its dims
    /// (the planner's in-place pair) and the other operands are elsewhere: `y` holds the
    /// aliased operand's values on entry and `ins[aliased]` is a placeholder without data.
    /// `Ok(false)` when it cannot (the operand is then copied as usual). Saves the copy of
    /// the operand, which for a cheap elementwise body costs more than the body itself.
    fn run_over_output(
        &self,
        _ins: &[In<'_>],
        _aliased: usize,
        _y: &mut Out<'_>,
    ) -> Result<bool, String> {
        Ok(false)
    }

    /// For a concat of two body inputs `(prefix, tail, axis)`: when the prefix's bytes are
    /// the start of the result's (a KV cache the call extends, `Storage::State`), the
    /// dispatch writes only the tail after them ([`append`]).
    fn append_parts(&self) -> Option<(usize, usize, i64)> {
        None
    }
}

/// A state extended in place: when operand `prefix` of an [`NativeKernel::append_parts`]
/// kernel is the start of its result's bytes and every result dim before `axis` is 1 (so
/// the prefix is the result's leading rows), copies operand `tail` after it and returns
/// `true`. Nothing before the tail is read or written: appending to a cache costs the new
/// rows only, never a copy of the cache.
fn append(
    kernel: &dyn NativeKernel,
    body: &Graph,
    params: &Params,
    dims: &KernelDims,
    ctx: &DispatchContext<'_>,
    slots: Option<&Slots>,
) -> Result<bool, String> {
    let Some((prefix, tail, axis)) = kernel.append_parts() else {
        return Ok(false);
    };
    let n_in = body.inputs.len();
    let (Some(Operand::Binding(p)), Some(&tail), [Operand::Binding(r)]) = (
        params.operands.get(prefix),
        params.operands.get(tail),
        &params.operands[n_in..],
    ) else {
        return Ok(false);
    };
    let Some(out_dims) = dims.outs[0].as_deref() else {
        return Ok(false);
    };
    let rank = out_dims.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    let leading_ones = usize::try_from(axis)
        .ok()
        .filter(|&a| a < out_dims.len())
        .is_some_and(|a| out_dims[..a].iter().all(|&d| d == 1));
    if !leading_ones || !ctx.is_prefix_of(*p, *r) {
        return Ok(false);
    }
    let start = ctx.binding_len(*p);
    let write = |src: &[u8]| -> Result<bool, String> {
        if start + src.len() != ctx.binding_len(*r) {
            return Err(format!(
                "appending {} bytes after {start} to a result of {} bytes",
                src.len(),
                ctx.binding_len(*r)
            ));
        }
        ctx.write_range(*r, start, src.len())?.copy_from_slice(src);
        Ok(true)
    };
    match tail {
        Operand::Binding(t) if !ctx.bindings_overlap(t, *r) => write(&ctx.read(t)?),
        // The call's own input, read in place from its host slot.
        Operand::Slot(b) => {
            let Some(table) = slots else {
                return Ok(false);
            };
            let table = lock(table);
            match table.get(b).and_then(Option::as_ref) {
                Some(t) => write(t.le_bytes()),
                None => Err(format!("host slot {b} has not been written")),
            }
        }
        _ => Ok(false),
    }
}

/// How often the native path ran, fell back, or had to copy a misaligned operand.
#[derive(Default, Debug)]
pub(crate) struct Stats {
    pub(crate) native: AtomicU64,
    pub(crate) fallback: AtomicU64,
    pub(crate) misaligned_copies: AtomicU64,
}

impl Stats {
    pub(crate) fn snapshot(&self, kernels: usize) -> NativeStats {
        NativeStats {
            kernels,
            dispatches: self.native.load(Ordering::Relaxed),
            fallbacks: self.fallback.load(Ordering::Relaxed),
            misaligned_copies: self.misaligned_copies.load(Ordering::Relaxed),
        }
    }
}

/// The threads native kernels run their parallel work on: one persistent pool per session
/// (`rafter-kernels-cpu`'s `WorkerPool`, sized by the session's `kernel_threads`), shared
/// by all its kernels.
pub(crate) type Par = Arc<rafter_kernels_cpu::WorkerPool>;

use rafter_kernels_cpu::MatmulPrecision;

/// A pool of `threads` threads (the caller's included); one thread if workers cannot start.
pub(crate) fn pool(threads: usize) -> Par {
    Arc::new(
        rafter_kernels_cpu::WorkerPool::new(threads)
            .or_else(|_| rafter_kernels_cpu::WorkerPool::new(1))
            .expect("a one-thread pool starts no thread"),
    )
}

/// The native kernel for `body`, if one covers it, running its parallel work on `par`;
/// products with float weights at `precision` where a kernel offers the choice.
pub(crate) fn select(
    body: &Graph,
    par: &Par,
    precision: MatmulPrecision,
) -> Option<Arc<dyn NativeKernel>> {
    if body.nodes.is_empty() {
        return None;
    }
    if body.nodes.iter().all(|n| {
        rafter_ir::program::KernelKind::of(&n.op) == rafter_ir::program::KernelKind::Elementwise
    }) {
        // Elementwise-only bodies (by the memory planner's own classification) may have a
        // result bound over an operand: only the kernel
        // that copies its operands first takes them.
        return elementwise::select(body, par).or_else(|| cast::select(body));
    }
    llm::select(body, par, precision)
        .or_else(|| block_quant::select(body, par))
        .or_else(|| matmul::select(body, par))
        .or_else(|| conv::select(body, par))
        .or_else(|| qconv::select(body, par))
        .or_else(|| quantize::select(body, par))
        .or_else(|| matmul_integer::select(body, par))
        .or_else(|| conv_nhwc::select(body, par))
        .or_else(|| block_nhwc::select(body, par))
        .or_else(|| pool::select(body, par))
        .or_else(|| softmax::select(body, par))
        .or_else(|| cumulative::select(body, par))
        .or_else(|| movement::select(body, par))
        .or_else(|| norm::select(body, par))
        .or_else(|| lrn::select(body, par))
        .or_else(|| recurrent::select(body, par))
}

/// The bindings among `operands` (a dispatch's operand words).
fn bindings_of(operands: &[Operand]) -> Vec<usize> {
    operands
        .iter()
        .filter_map(|o| match o {
            Operand::Binding(b) => Some(*b),
            _ => None,
        })
        .collect()
}

/// [`NativeKernel::run_in_place`] when the body's one binding operand and its one result
/// are the same bytes: `true` when it ran, `false` to take the copying path.
fn run_in_place(
    kernel: &dyn NativeKernel,
    body: &Graph,
    params: &Params,
    dims: &KernelDims,
    ctx: &DispatchContext<'_>,
) -> Result<bool, String> {
    let n_in = body.inputs.len();
    let bindings = bindings_of(&params.operands[..n_in]);
    let ([b], [Operand::Binding(r)], [out]) = (
        bindings.as_slice(),
        &params.operands[n_in..],
        body.outputs.as_slice(),
    ) else {
        return Ok(false);
    };
    if !ctx.same_range(*b, *r) {
        return Ok(false);
    }
    let v = body.value(*out);
    let (Some(dims), Ok(mut view)) = (dims.outs[0].clone(), ctx.write(*r)) else {
        return Ok(false);
    };
    match Out::new(v.ty.dtype, dims, &mut view) {
        Some(mut y) => kernel.run_in_place(&mut y),
        None => Ok(false),
    }
}

/// [`NativeKernel::run_over_output`] when exactly one operand is the (single) result's
/// bytes with the result's dims, and every other operand is a weight or a binding that
/// does not overlap the result. `Ok(false)`: not that case, or the kernel declined.
fn run_over_output(
    kernel: &dyn NativeKernel,
    body: &Graph,
    program: &rafter_ir::program::Program,
    params: &Params,
    dims: &KernelDims,
    ctx: &DispatchContext<'_>,
    stats: &Stats,
) -> Result<bool, String> {
    let n_in = body.inputs.len();
    let ([Operand::Binding(r)], [out]) = (&params.operands[n_in..], body.outputs.as_slice()) else {
        return Ok(false);
    };
    let Some(out_dims) = dims.outs[0].clone() else {
        return Ok(false);
    };
    let mut aliased = None;
    for (i, &operand) in params.operands[..n_in].iter().enumerate() {
        match operand {
            Operand::Binding(b) if ctx.same_range(b, *r) => {
                let same_dims = dims.ins[i].as_deref() == Some(out_dims.as_slice());
                let f32s = body.value(body.inputs[i]).ty.dtype == DType::F32;
                if aliased.is_some() || !same_dims || !f32s {
                    return Ok(false);
                }
                aliased = Some(i);
            }
            Operand::Binding(b) if ctx.bindings_overlap(b, *r) => return Ok(false),
            Operand::Binding(_) | Operand::Weight(_) => {}
            _ => return Ok(false),
        }
    }
    let Some(aliased) = aliased else {
        return Ok(false);
    };
    let mut views = Vec::with_capacity(n_in);
    for (i, &operand) in params.operands[..n_in].iter().enumerate() {
        match operand {
            Operand::Binding(b) if i != aliased => match ctx.read(b) {
                Ok(view) => views.push(Some(view)),
                Err(_) => return Ok(false),
            },
            _ => views.push(None),
        }
    }
    let mut ins = Vec::with_capacity(n_in);
    for (i, (&operand, view)) in params.operands[..n_in].iter().zip(&views).enumerate() {
        let v = body.value(body.inputs[i]);
        if i == aliased {
            ins.push(In::from_f32s(out_dims.clone(), &[]));
            continue;
        }
        let Some(in_dims) = dims.ins[i].clone() else {
            return Ok(false);
        };
        let (bytes, weight): (&[u8], _) = match (operand, view) {
            (_, Some(view)) => (view, None),
            (Operand::Weight(w), None) => match program.weights.get(w) {
                Some(t) => (&t.bytes, Some(w)),
                None => return Err(format!("operand `{}`: weight {w} does not exist", v.name)),
            },
            _ => return Ok(false),
        };
        let input = In::new(v.ty.dtype, in_dims, bytes, stats)
            .map_err(|e| format!("operand `{}`: {e}", v.name))?;
        ins.push(input.of_weight(weight));
    }
    let Ok(mut view) = ctx.write(*r) else {
        return Ok(false);
    };
    let dtype = body.value(*out).ty.dtype;
    if operands::byte_len(dtype, &out_dims) != Some(view.len()) {
        return Ok(false);
    }
    match Out::new(dtype, out_dims, &mut view) {
        Some(mut y) => kernel.run_over_output(&ins, aliased, &mut y),
        None => Ok(false),
    }
}

/// The permutation of NCHW to NHWC (`rafter_opt::layout::TO_NHWC`; the runtime does not
/// depend on the compiler): a fused body that starts with it reads an NCHW tensor.
pub(crate) const TO_NHWC: [i64; 4] = [0, 2, 3, 1];
/// The permutation of NHWC to NCHW (`rafter_opt::layout::TO_NCHW`).
pub(crate) const TO_NCHW: [i64; 4] = [0, 3, 1, 2];

/// Whether body value `v` is read by exactly one node operand and is not a body output:
/// a value a fused kernel may keep to itself.
pub(crate) fn read_once(body: &Graph, v: ValueId) -> bool {
    !body.outputs.contains(&v)
        && body
            .nodes
            .iter()
            .flat_map(|n| &n.inputs)
            .filter(|&&i| i == Some(v))
            .count()
            == 1
}

/// The dims of body value `v` when all are known (and fit a `usize`).
pub(crate) fn known_dims(body: &Graph, v: ValueId) -> Option<Vec<usize>> {
    body.value(v)
        .ty
        .known_dims()?
        .into_iter()
        .map(|d| usize::try_from(d).ok())
        .collect()
}

/// The body input index of `v` when it is an input of dtype `dtype`.
pub(crate) fn input_of(body: &Graph, v: Option<ValueId>, dtype: DType) -> Option<usize> {
    let v = v?;
    match body.value(v).def {
        ValueDef::Input(i) if body.value(v).ty.dtype == dtype => Some(i),
        _ => None,
    }
}

/// Runs kernel `body` natively for one dispatch. `Ok(false)`: the reference path must run
/// it (nothing has been written).
///
/// Operands in host slots (`Storage::Dynamic`, sized by values) are read in place from the
/// slot table, whose lock is held for the whole kernel; results bound to host slots are
/// computed into a fresh vector and stored as a tensor, their dims given by the kernel
/// ([`NativeKernel::out_dims`]) when the symbols do not determine them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    kernel: &dyn NativeKernel,
    body: &Graph,
    program: &rafter_ir::program::Program,
    params: &Params,
    dims: &KernelDims,
    ctx: &DispatchContext<'_>,
    stats: &Stats,
    registry: &CallRegistry,
) -> Result<bool, String> {
    let n_in = body.inputs.len();
    let fallback = || {
        stats.fallback.fetch_add(1, Ordering::Relaxed);
        Ok(false)
    };
    let slots = if params
        .operands
        .iter()
        .any(|o| matches!(o, Operand::Slot(_)))
    {
        Some(registry.slots(params.call)?)
    } else {
        None
    };
    if append(kernel, body, params, dims, ctx, slots.as_ref())? {
        stats.native.fetch_add(1, Ordering::Relaxed);
        return Ok(true);
    }
    let mut guard = slots.as_ref().map(|s| lock(s));
    let table = guard.as_deref();
    // Binding operands a kernel takes as copies (see `copies_operands`): read into owned
    // f32 buffers, each view dropped before any result view is taken.
    let mut copies: Vec<Option<Vec<f32>>> = vec![None; n_in];
    if kernel.copies_operands() {
        if run_in_place(kernel, body, params, dims, ctx)?
            || run_over_output(kernel, body, program, params, dims, ctx, stats)?
        {
            stats.native.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let results = bindings_of(&params.operands[n_in..]);
        for (i, &operand) in params.operands[..n_in].iter().enumerate() {
            if let Operand::Binding(b) = operand {
                if !results.iter().any(|&r| ctx.bindings_overlap(b, r)) {
                    continue; // read through a view: no result shares its bytes
                }
                if body.value(body.inputs[i]).ty.dtype != DType::F32 {
                    return fallback();
                }
                let Ok(view) = ctx.read(b) else {
                    return fallback();
                };
                if view.len() % 4 != 0 {
                    return Err(format!(
                        "operand `{}`: {} bytes are not whole f32s",
                        body.value(body.inputs[i]).name,
                        view.len()
                    ));
                }
                copies[i] = Some(
                    view.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                );
            }
        }
    }
    // Read views of binding operands (weights need none, slots are tensors).
    let mut read_views = Vec::with_capacity(n_in);
    for (i, &operand) in params.operands[..n_in].iter().enumerate() {
        match operand {
            Operand::Binding(_) if copies[i].is_some() => read_views.push(None),
            Operand::Binding(b) => match ctx.read(b) {
                Ok(view) => read_views.push(Some(view)),
                Err(_) => return fallback(),
            },
            Operand::Weight(_) | Operand::Slot(_) => read_views.push(None),
            Operand::Absent | Operand::Foreign(_) => return fallback(),
        }
    }
    let mut ins = Vec::with_capacity(n_in);
    for (i, (&operand, view)) in params.operands[..n_in].iter().zip(&read_views).enumerate() {
        let v = body.value(body.inputs[i]);
        let what = |e: String| format!("operand `{}`: {e}", v.name);
        let input = match (operand, view) {
            (Operand::Slot(b), _) => {
                let t = table
                    .and_then(|t| t.get(b))
                    .and_then(Option::as_ref)
                    .ok_or_else(|| what(format!("host slot {b} has not been written")))?;
                let (Ok(data), DType::F32) = (t.as_slice::<f32>(), v.ty.dtype) else {
                    return fallback();
                };
                In::from_f32s(t.shape().to_vec(), data)
            }
            (Operand::Binding(_), None) => {
                let Some(dims) = dims.ins[i].clone() else {
                    return fallback();
                };
                let data = copies[i]
                    .as_deref()
                    .expect("a copy for every binding without a view");
                if dims.iter().product::<usize>() != data.len() {
                    return Err(what(format!(
                        "{} bytes, but {} {dims:?} needs {}",
                        data.len() * 4,
                        v.ty.dtype,
                        dims.iter().product::<usize>() * 4
                    )));
                }
                In::from_f32s(dims, data)
            }
            (operand, view) => {
                let Some(dims) = dims.ins[i].clone() else {
                    return fallback();
                };
                let bytes: &[u8] = match (operand, view) {
                    (_, Some(view)) => view,
                    (Operand::Weight(w), None) => {
                        &program
                            .weights
                            .get(w)
                            .ok_or_else(|| what(format!("weight {w} does not exist")))?
                            .bytes
                    }
                    _ => unreachable!("views exist for bindings, weights have none"),
                };
                let weight = match operand {
                    Operand::Weight(w) => Some(w),
                    _ => None,
                };
                In::new(v.ty.dtype, dims, bytes, stats)
                    .map_err(what)?
                    .of_weight(weight)
            }
        };
        ins.push(input);
    }
    // Results: dims from the symbols, else from the kernel; bindings get write views, host
    // slots a fresh vector.
    let mut write_views = Vec::with_capacity(body.outputs.len());
    let mut slot_outs: Vec<(usize, Tensor)> = Vec::new();
    let mut out_dims = Vec::with_capacity(body.outputs.len());
    for (j, &operand) in params.operands[n_in..].iter().enumerate() {
        let v = body.value(body.outputs[j]);
        let dims = match &dims.outs[j] {
            Some(d) => d.clone(),
            None => match kernel.out_dims(&ins) {
                Some(d) if body.outputs.len() == 1 => d,
                _ => return fallback(),
            },
        };
        let want = operands::byte_len(v.ty.dtype, &dims)
            .ok_or_else(|| format!("result `{}`: size overflows", v.name))?;
        match operand {
            Operand::Binding(b) => {
                if ctx.binding_len(b) != want {
                    return Err(format!(
                        "result `{}` ({} {dims:?}) is {want} bytes but its buffer holds {}",
                        v.name,
                        v.ty.dtype,
                        ctx.binding_len(b)
                    ));
                }
                match ctx.write(b) {
                    Ok(view) => write_views.push(view),
                    Err(_) => return fallback(),
                }
            }
            Operand::Slot(b) if v.ty.dtype == DType::F32 => {
                let t = Tensor::zeros(DType::F32, &dims)
                    .map_err(|e| format!("result `{}`: {e}", v.name))?;
                slot_outs.push((b, t));
            }
            _ => return fallback(),
        }
        out_dims.push(dims);
    }
    let mut outs = Vec::with_capacity(out_dims.len());
    {
        let (mut views, mut vecs) = (write_views.iter_mut(), slot_outs.iter_mut());
        for (j, dims) in out_dims.iter().enumerate() {
            let v = body.value(body.outputs[j]);
            let out = match params.operands[n_in + j] {
                Operand::Binding(_) => Out::new(
                    v.ty.dtype,
                    dims.clone(),
                    views.next().expect("one per binding"),
                ),
                _ => Some(Out::from_f32s(
                    dims.clone(),
                    vecs.next()
                        .expect("one per slot")
                        .1
                        .as_mut_slice::<f32>()
                        .expect("made f32 above"),
                )),
            };
            match out {
                Some(out) => outs.push(out),
                None => return fallback(),
            }
        }
    }
    if !kernel.run(&ins, &mut outs)? {
        return fallback();
    }
    drop((outs, ins));
    stats.native.fetch_add(1, Ordering::Relaxed);
    if let Some(table) = guard.as_deref_mut() {
        for (b, t) in slot_outs {
            let slot = table
                .get_mut(b)
                .ok_or_else(|| format!("host slot {b} does not exist"))?;
            *slot = Some(t);
        }
    }
    Ok(true)
}

#[cfg(all(test, feature = "interpreter"))]
mod recurrent_tests;
#[cfg(all(test, feature = "interpreter"))]
mod tests;
