//! What one CPU dispatch does: its parameters' layout, and the kernel and copy entry points
//! that read them.
//!
//! # Dispatch parameters
//! Every CPU dispatch the runtime records carries its call's facts in the push constants, as
//! little-endian `u64` words:
//!
//! ```text
//! call id | n_sym | n_sym symbol values (i64; i64::MIN = unbound) | n_ops | n_ops operands | n_extra | extra...
//! ```
//!
//! When the top bit of `n_sym` is set, no values follow: the dispatch belongs to a recording
//! that serves calls of several state lengths, and takes the call's values from the call
//! registry when it runs ([`rafter_runtime::DispatchArgs::symbols_at_run`]); its bindings of
//! length-sized buffers span their capacity, and [`KernelShared::run_kernel`] cuts each to
//! the bytes the call's dims give it before any path sees them.
//!
//! Symbols are the program's input symbols ([`Session::symbols`](rafter_runtime::Session::symbols)
//! order). An operand word says where each body input (then each body output) lives: in the
//! dispatch's binding `i`, in program weight `w` (read from the weight's `Bytes`, see
//! [`rafter_runtime::BytesBuffer`]), in the call's host slot for buffer `b`
//! (`Storage::Dynamic`), or absent (an unused optional result).
//!
//! # The paths of a kernel
//! [`KernelShared::run_kernel`] tries, in order:
//! 1. the **native** kernel chosen for the body when the session was built (`native`:
//!    slices borrowed from the binding views and weight bytes, results written in place);
//!    it declines shapes it does not cover;
//! 2. the **tensor path** (`fallback`): operands decoded into owned reference tensors, the
//!    body run by a host kernel (the caller's, or one of `fallback`'s accelerated ones) or
//!    else by the reference executor ([`rafter_reference::run_with`]), which checks every
//!    result against the body's types and binds data-dependent symbols; results encoded
//!    back into their bindings after checking that the sizes agree.
//!
//! # Results in place of operands
//! The memory planner may bind a result to the same arena bytes as an operand that the
//! dispatch reads for the last time (an elementwise kernel writing over its input). That is
//! safe on the tensor path because of an invariant [`KernelShared::run_kernel`] keeps: it
//! decodes every operand into an owned tensor, dropping each read view at once, before it
//! runs the body, and takes a write view of a result only after the body has returned. No
//! two views of one dispatch are ever live together, and every operand byte is read before
//! any result byte is written. A kernel that streams instead must read element `i` of an
//! operand before writing element `i` of a result bound to it, and must take one writable
//! view for the pair (see the HAL's aliasing rule).
//!
//! # Host slots
//! Buffers sized by values, and f32 inputs only CPU kernels read, live in the call's host
//! slot table ([`rafter_runtime::host`]), which a kernel finds through the call id in its
//! parameters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rafter_hal_cpu::DispatchContext;
use rafter_ir::program::Program;
use rafter_ir::{Bindings, ConstData, Dim, Symbol, TensorType};
use rafter_runtime::backend::UNBOUND;
use rafter_runtime::host::{lock, CallRegistry, Slots};
use rafter_runtime::Tensor;

#[cfg(feature = "interpreter")]
use crate::fallback::TensorKernel;
use crate::native::{self, NativeKernel};

/// The name of the built-in entry point that copies between buffers and host slots.
pub(crate) const COPY_ENTRY: &str = "rafter.copy";

/// Where one kernel operand lives, as encoded in a dispatch's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operand {
    Binding(usize),
    Weight(usize),
    Slot(usize),
    Absent,
    /// Range `i` of the call's foreign ranges: another device's host-visible memory, which a
    /// cross-device copy maps (see [`KernelShared::run_copy`]).
    Foreign(usize),
}

const TAG_SHIFT: u32 = 56;
const INDEX_MASK: u64 = (1 << TAG_SHIFT) - 1;

impl Operand {
    fn encode(self) -> u64 {
        let (tag, index) = match self {
            Operand::Binding(i) => (0u64, i),
            Operand::Weight(i) => (1, i),
            Operand::Slot(i) => (2, i),
            Operand::Absent => (3, 0),
            Operand::Foreign(i) => (4, i),
        };
        (tag << TAG_SHIFT) | (index as u64 & INDEX_MASK)
    }

    fn decode(word: u64) -> Result<Operand, String> {
        let index = (word & INDEX_MASK) as usize;
        Ok(match word >> TAG_SHIFT {
            0 => Operand::Binding(index),
            1 => Operand::Weight(index),
            2 => Operand::Slot(index),
            3 => Operand::Absent,
            4 => Operand::Foreign(index),
            tag => return Err(format!("operand word with unknown tag {tag}")),
        })
    }
}

/// In the symbol count word: the values are the call registry's (see the module docs).
const SYMBOLS_AT_RUN: u64 = 1 << 63;

/// A dispatch's parameters, decoded.
#[derive(Debug, PartialEq)]
pub(crate) struct Params {
    pub(crate) call: u64,
    /// Whether `symbols` are to be taken from the call registry (they are empty here).
    pub(crate) symbols_at_run: bool,
    pub(crate) symbols: Vec<i64>,
    pub(crate) operands: Vec<Operand>,
    pub(crate) extra: Vec<u64>,
}

impl Params {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let flag = if self.symbols_at_run {
            SYMBOLS_AT_RUN
        } else {
            0
        };
        let mut words = vec![self.call, self.symbols.len() as u64 | flag];
        words.extend(self.symbols.iter().map(|&v| v as u64));
        words.push(self.operands.len() as u64);
        words.extend(self.operands.iter().map(|o| o.encode()));
        words.push(self.extra.len() as u64);
        words.extend(&self.extra);
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Params, String> {
        if bytes.len() % 8 != 0 {
            return Err(format!(
                "dispatch parameters are {} bytes, not whole u64 words",
                bytes.len()
            ));
        }
        // Read straight from the bytes: no staging vector of words per dispatch.
        let n_words = bytes.len() / 8;
        let word =
            |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<std::ops::Range<usize>, String> {
            let end = at.checked_add(n).ok_or("parameter count overflows")?;
            if end > n_words {
                return Err(format!("dispatch parameters end early ({n_words} words)"));
            }
            let range = at..end;
            at = end;
            Ok(range)
        };
        let call = word(take(1)?.start);
        let n_sym = word(take(1)?.start);
        let symbols_at_run = n_sym & SYMBOLS_AT_RUN != 0;
        let symbols = take((n_sym & !SYMBOLS_AT_RUN) as usize)?
            .map(|i| word(i) as i64)
            .collect();
        let n = word(take(1)?.start) as usize;
        let operands = take(n)?
            .map(|i| Operand::decode(word(i)))
            .collect::<Result<_, _>>()?;
        let n = word(take(1)?.start) as usize;
        let extra = take(n)?.map(word).collect();
        Ok(Params {
            call,
            symbols_at_run,
            symbols,
            operands,
            extra,
        })
    }
}

/// The dims of `ty` under `map`, as sizes.
pub(crate) fn eval_dims(ty: &TensorType, map: &HashMap<Symbol, i64>) -> Result<Vec<usize>, String> {
    ty.dims
        .iter()
        .enumerate()
        .map(|(i, d)| match d.eval(map) {
            Ok(v) if v >= 0 => usize::try_from(v).map_err(|e| format!("dim {i} `{d}`: {e}")),
            Ok(v) => Err(format!("dim {i} `{d}` is {v}")),
            Err(e) => Err(format!("dim {i} `{d}`: {e}")),
        })
        .collect()
}

/// A kernel's operand dims under one set of symbol values: what the native path needs of
/// the symbols. Evaluating them took ~1.3 µs of the ~2.3 µs a MiniLM dispatch spent before
/// its kernel ran (hashing each symbol's name, per dim, per operand), so each kernel keeps
/// the last set and reuses it while the symbols its dims mention repeat.
pub(crate) struct KernelDims {
    /// The positions (in the dispatch params' order) of the symbols the kernel's operand
    /// dims mention: only their values decide the dims, so only they key the cache (an LLM
    /// decode step changes `past` every call, which most kernels' dims never mention).
    used: Vec<usize>,
    /// The values of the `used` symbols these dims are for.
    values: Vec<i64>,
    /// Per body input: its dims, `None` where the symbols do not decide them.
    pub(crate) ins: Vec<Option<Vec<usize>>>,
    /// Per body result, likewise.
    pub(crate) outs: Vec<Option<Vec<usize>>>,
}

/// What every kernel closure of a session shares.
pub(crate) struct KernelShared {
    pub(crate) program: Arc<Program>,
    pub(crate) symbols: Vec<Symbol>,
    /// Per kernel: the tensor-path kernel replacing the reference executor, if any (the
    /// caller's host kernel, or an accelerated one from `fallback`).
    #[cfg(feature = "interpreter")]
    pub(crate) tensor_kernels: Vec<Option<TensorKernel>>,
    /// Per kernel: the native kernel that computes it on borrowed bytes, if any (see the
    /// `native` module); shapes it does not cover fall through to the path below.
    pub(crate) native: Vec<Option<Arc<dyn NativeKernel>>>,
    pub(crate) native_stats: Arc<native::Stats>,
    pub(crate) registry: Arc<CallRegistry>,
    /// Per kernel: its operand dims under the symbol values of its last dispatch.
    pub(crate) dims: Vec<Mutex<Option<Arc<KernelDims>>>>,
}

impl KernelShared {
    pub(crate) fn bindings(&self, params: &Params) -> Result<Bindings, String> {
        if params.symbols.len() != self.symbols.len() {
            return Err(format!(
                "dispatch passes {} symbol values, the program has {} symbols",
                params.symbols.len(),
                self.symbols.len()
            ));
        }
        let mut bindings = Bindings::default();
        for (s, &v) in self.symbols.iter().zip(&params.symbols) {
            if v != UNBOUND {
                let v = usize::try_from(v).map_err(|_| format!("symbol `{}` is {v}", s.name()))?;
                bindings.unify(&Dim::from_symbol(s.clone()), v, "the call's inputs")?;
            }
        }
        Ok(bindings)
    }

    /// Kernel `k`'s operand dims for `params`' symbol values: the cached set when the values
    /// are the same, else evaluated (and cached).
    fn kernel_dims(&self, k: usize, params: &Params) -> Result<Arc<KernelDims>, String> {
        let cache = &self.dims[k];
        if let Some(d) = lock(cache).as_ref() {
            if params.symbols.len() == self.symbols.len()
                && d.used
                    .iter()
                    .zip(&d.values)
                    .all(|(&i, &v)| params.symbols[i] == v)
            {
                return Ok(d.clone());
            }
        }
        let bindings = self.bindings(params)?;
        let map = bindings.as_map();
        let body = &self.program.kernels[k].body;
        let of = |ids: &[rafter_ir::ValueId]| -> Vec<Option<Vec<usize>>> {
            ids.iter()
                .map(|&v| eval_dims(&body.value(v).ty, &map).ok())
                .collect()
        };
        let mut used: Vec<usize> = Vec::new();
        for &v in body.inputs.iter().chain(&body.outputs) {
            for d in &body.value(v).ty.dims {
                for s in d.symbols() {
                    if let Some(i) = self.symbols.iter().position(|t| *t == s) {
                        if !used.contains(&i) {
                            used.push(i);
                        }
                    }
                }
            }
        }
        let values = used.iter().map(|&i| params.symbols[i]).collect();
        let d = Arc::new(KernelDims {
            used,
            values,
            ins: of(&body.inputs),
            outs: of(&body.outputs),
        });
        *lock(cache) = Some(d.clone());
        Ok(d)
    }

    /// Program weight `w`.
    pub(crate) fn weight(&self, w: usize) -> Result<&ConstData, String> {
        self.program
            .weights
            .get(w)
            .ok_or_else(|| format!("weight {w} does not exist"))
    }

    /// Runs kernel `k` for one dispatch.
    pub(crate) fn run_kernel(&self, k: usize, ctx: &DispatchContext<'_>) -> Result<(), String> {
        let body = &self.program.kernels[k].body;
        let mut params = Params::decode(ctx.params())?;
        let (n_in, n_out) = (body.inputs.len(), body.outputs.len());
        if params.operands.len() != n_in + n_out {
            return Err(format!(
                "dispatch describes {} operands, the kernel has {n_in} inputs and {n_out} results",
                params.operands.len()
            ));
        }
        if !params.symbols_at_run {
            return self.run_kernel_with(k, ctx, &params);
        }
        // A recording for every state length: this call's values, and its bindings cut to
        // the bytes its dims give them (the range an exact-size recording binds).
        params.symbols = self.registry.symbols(params.call)?.to_vec();
        let dims = self.kernel_dims(k, &params)?;
        let mut lens: Vec<Option<usize>> = vec![None; ctx.binding_count()];
        for (i, operand) in params.operands.iter().enumerate() {
            let Operand::Binding(b) = *operand else {
                continue;
            };
            let (value, d) = match i.checked_sub(n_in) {
                None => (body.inputs[i], &dims.ins[i]),
                Some(j) => (body.outputs[j], &dims.outs[j]),
            };
            if let (Some(d), Some(len)) = (d, lens.get_mut(b)) {
                let size = body.value(value).ty.dtype.size_of();
                *len = d.iter().try_fold(size, |acc, &x| acc.checked_mul(x));
            }
        }
        ctx.with_binding_lens(&lens, |ctx| self.run_kernel_with(k, ctx, &params))
    }

    /// Runs kernel `k` for one dispatch whose `params` carry the call's symbol values.
    fn run_kernel_with(
        &self,
        k: usize,
        ctx: &DispatchContext<'_>,
        params: &Params,
    ) -> Result<(), String> {
        let body = &self.program.kernels[k].body;
        if let Some(native) = &self.native[k] {
            let dims = self.kernel_dims(k, params)?;
            let stats = &self.native_stats;
            let registry = &self.registry;
            if native::run(
                &**native,
                body,
                &self.program,
                params,
                &dims,
                ctx,
                stats,
                registry,
            )? {
                return Ok(());
            }
        }
        self.run_tensor_path(k, ctx, params)
    }

    /// Without the interpreter, a kernel no native kernel ran is an error naming it.
    #[cfg(not(feature = "interpreter"))]
    fn run_tensor_path(&self, k: usize, _: &DispatchContext<'_>, _: &Params) -> Result<(), String> {
        Err(format!(
            "kernel `{}`: no native kernel covers its body at these shapes, and this build \
             has no interpreter (rafter-runtime-cpu's `interpreter` feature)",
            self.program.kernels[k].name
        ))
    }

    /// The built-in copy: operand 0 to operand 1; `extra` is `[src buffer, src dims...]`.
    ///
    /// Either side may be [`Operand::Foreign`]: another device's host-visible buffer, mapped
    /// here. That is how data crosses between the CPU and a GPU: the copy runs on the CPU
    /// queue, after a semaphore wait on the GPU work that wrote the source (the GPU's
    /// command buffers end with a barrier that makes their writes visible to the host), and
    /// GPU work reading the destination waits on this copy's semaphore (the GPU queue submits
    /// it only once the semaphore is signalled, so the host writes come first).
    pub(crate) fn run_copy(&self, ctx: &DispatchContext<'_>) -> Result<(), String> {
        let params = Params::decode(ctx.params())?;
        let (&[src, dst], Some((&src_buffer, dims))) =
            (params.operands.as_slice(), params.extra.split_first())
        else {
            return Err("copy dispatch needs 2 operands and the source's buffer".into());
        };
        let decl = self
            .program
            .buffers
            .get(src_buffer as usize)
            .ok_or_else(|| format!("copy source buffer {src_buffer} does not exist"))?;
        let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        if let Some(done) = self.copy_bytes(ctx, &params, src, dst, &decl.name) {
            return done;
        }
        let tensor = match src {
            Operand::Binding(b) => {
                let view = ctx.read(b)?;
                Tensor::from_le_bytes(decl.ty.dtype, &dims, &view).map_err(|e| e.to_string())?
            }
            Operand::Weight(w) => {
                let c = self.weight(w)?;
                Tensor::from_le_bytes(c.dtype, &c.dims, &c.bytes).map_err(|e| e.to_string())?
            }
            Operand::Slot(b) => lock(&*self.registry.slots(params.call)?)
                .get(b)
                .cloned()
                .flatten()
                .ok_or_else(|| format!("host slot {b} has not been written"))?,
            Operand::Foreign(i) => {
                let range = self.registry.foreign(params.call, i)?;
                range
                    .buffer
                    .map_read(range.offset, range.len, |bytes| {
                        Tensor::from_le_bytes(decl.ty.dtype, &dims, bytes)
                    })
                    .map_err(|e| format!("mapping `{}` on its device: {e}", decl.name))?
                    .map_err(|e| e.to_string())?
            }
            Operand::Absent => return Err("copy has no source".into()),
        };
        match dst {
            Operand::Binding(b) => write_binding(ctx, b, &tensor, &decl.name),
            Operand::Slot(b) => store_slot(&self.registry.slots(params.call)?, b, tensor),
            Operand::Foreign(i) => {
                let range = self.registry.foreign(params.call, i)?;
                let bytes = tensor.le_bytes();
                if bytes.len() as u64 != range.len {
                    return Err(format!(
                        "copy of `{}` ({} bytes) into a {}-byte buffer on another device",
                        decl.name,
                        bytes.len(),
                        range.len
                    ));
                }
                range
                    .buffer
                    .write_bytes(range.offset, bytes)
                    .map_err(|e| format!("mapping the copy of `{}` on its device: {e}", decl.name))
            }
            _ => Err("copy destination must be a buffer or a host slot".into()),
        }
    }
}

impl KernelShared {
    /// A copy between another device's buffer and one of this device's bindings as one
    /// `memcpy` of the bytes, mapped on one side and viewed on the other: the crossing of
    /// a split model. The tensor path decodes the source into a fresh `Tensor` and encodes
    /// it again (three passes over the bytes and an allocation; on an H200 machine a
    /// 0.8 MB crossing took ~200 us of host time). `None` for other operand pairs (host
    /// slots hold tensors; weights are never copied across), which take the tensor path.
    ///
    /// The two sides' lengths are compared first: they differ only in a malformed program
    /// (`Program::verify` compares a copy's dtype and rank, not its dims), but a program
    /// comes from an artifact file, and unchecked the mismatch would panic in
    /// `copy_from_slice` on a worker thread. It is an error naming the buffer and both
    /// sizes (tested in `rafter-runtime-vulkan`'s `tests/session.rs`, on lavapipe).
    fn copy_bytes(
        &self,
        ctx: &DispatchContext<'_>,
        params: &Params,
        src: Operand,
        dst: Operand,
        name: &str,
    ) -> Option<Result<(), String>> {
        let sized = |foreign: u64, here: usize| {
            if foreign == here as u64 {
                Ok(())
            } else {
                Err(format!(
                    "copy of `{name}` across devices: {foreign} bytes on the other device, \
                     {here} bytes here"
                ))
            }
        };
        let foreign = |i| self.registry.foreign(params.call, i);
        let mapping = |e| format!("mapping `{name}` on its device: {e}");
        match (src, dst) {
            (Operand::Foreign(i), Operand::Binding(b)) => Some((|| {
                let range = foreign(i)?;
                let mut out = ctx.write(b).map_err(|e| format!("result `{name}`: {e}"))?;
                sized(range.len, out.len())?;
                range
                    .buffer
                    .map_read(range.offset, range.len, |bytes| out.copy_from_slice(bytes))
                    .map_err(mapping)
            })()),
            (Operand::Binding(b), Operand::Foreign(i)) => Some((|| {
                let range = foreign(i)?;
                let view = ctx.read(b)?;
                sized(range.len, view.len())?;
                range
                    .buffer
                    .write_bytes(range.offset, &view)
                    .map_err(mapping)
            })()),
            _ => None,
        }
    }
}

/// Writes result `name`, tensor `t`, into binding `b`, whose length must be the tensor's.
pub(crate) fn write_binding(
    ctx: &DispatchContext<'_>,
    b: usize,
    t: &Tensor,
    name: &str,
) -> Result<(), String> {
    let bytes = t.le_bytes();
    let len = ctx.binding_len(b);
    if bytes.len() != len {
        return Err(format!(
            "result `{name}` ({} {:?}) is {} bytes but its buffer holds {len}",
            t.dtype(),
            t.shape(),
            bytes.len()
        ));
    }
    ctx.write(b)
        .map_err(|e| format!("result `{name}`: {e}"))?
        .copy_from_slice(bytes);
    Ok(())
}

/// Stores `t` in host slot `b`.
pub(crate) fn store_slot(slots: &Slots, b: usize, t: Tensor) -> Result<(), String> {
    let mut slots = lock(slots);
    let slot = slots
        .get_mut(b)
        .ok_or_else(|| format!("host slot {b} does not exist"))?;
    *slot = Some(t);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip() {
        let p = Params {
            call: 7,
            symbols_at_run: false,
            symbols: vec![13, UNBOUND, 0],
            operands: vec![
                Operand::Binding(0),
                Operand::Weight(5),
                Operand::Slot(9),
                Operand::Absent,
                Operand::Foreign(4),
            ],
            extra: vec![1, 2],
        };
        assert_eq!(Params::decode(&p.encode()).unwrap(), p);
        let bytes = p.encode();
        assert!(Params::decode(&bytes[..bytes.len() - 8])
            .unwrap_err()
            .contains("end early"));
        assert!(Params::decode(&bytes[..5]).is_err());
    }
}
