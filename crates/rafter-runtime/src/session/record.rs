//! Recording a call: everything `Session::submit` prepares from the inputs' shapes alone
//! (see [`crate::recorded`]), in the order it happens: the call's buffer dims, its arenas,
//! its input and output allocations, one command buffer per run of steps on one device,
//! and one semaphore per command buffer.

use std::collections::HashMap;

use rafter_hal::{Buffer, BufferRange, CommandBufferBuilder, MemoryKind};
use rafter_ir::program::{Step, Storage};
use rafter_ir::{Symbol, TensorType};

use super::{DeviceUse, Home, Inner, Session};
use crate::backend::{CopyEnd, DispatchArgs, HostCopy, Operand};
use crate::error::{hal, Result, RuntimeError};
use crate::plan::{self, Access, Item, Region};
use crate::recorded::{Chunk, InputDest, OutputSource, Recorded};
use crate::Tensor;

/// Where each buffer of one call lives: its home, dims, byte size, and (once allocated)
/// its byte range and the allocation it is part of.
struct CallLayout {
    home: Vec<Home>,
    dims: Vec<Option<Vec<usize>>>,
    sizes: Vec<u64>,
    ranges: Vec<Option<BufferRange>>,
    /// `(allocation id, offset)`: what the barrier and chunk-ordering logic compares.
    alloc_of: Vec<Option<(usize, u64)>>,
    next_alloc: usize,
}

impl CallLayout {
    /// Buffer `b`'s range as a new allocation of its own.
    fn own_allocation(&mut self, b: usize, buffer: &Buffer) {
        self.ranges[b] = Some(buffer.whole());
        self.alloc_of[b] = Some((self.next_alloc, 0));
        self.next_alloc += 1;
    }

    /// The memory a step's access to buffer `b` touches, if any.
    fn region(&self, b: usize) -> Option<Region> {
        match self.home[b] {
            Home::Slot => Some(Region::Slot(b)),
            _ => self.alloc_of[b].map(|(alloc, offset)| Region::Memory {
                alloc,
                start: offset,
                end: offset + self.sizes[b],
            }),
        }
    }

    /// What `step` reads and writes.
    fn accesses(&self, step: &Step) -> Vec<Access> {
        let reads = step.reads().into_iter().map(|b| (b, false));
        let writes = step.writes().into_iter().map(|b| (b, true));
        reads
            .chain(writes)
            .filter_map(|(b, write)| self.region(b).map(|region| Access { region, write }))
            .collect()
    }

    /// The range of buffer `b` on the device running it (a weight's is the session's).
    fn range_of(&self, inner: &Inner, b: usize) -> BufferRange {
        match inner.program.buffers[b].storage {
            Storage::Weight(_) => inner.weight_buffers[b].as_ref().expect("bound").whole(),
            _ => self.ranges[b].clone().expect("allocated"),
        }
    }

    /// Where a dispatch finds buffer `b`.
    fn operand(&self, inner: &Inner, b: usize) -> Operand {
        match (&inner.program.buffers[b].storage, self.home[b]) {
            (_, Home::Slot) => Operand::Slot(b),
            (Storage::Weight(w), _) => Operand::Weight {
                index: *w,
                buffer: self.range_of(inner, b),
            },
            _ => Operand::Memory(self.ranges[b].clone().expect("allocated")),
        }
    }

    /// Where a host copy finds buffer `b`.
    fn copy_end(&self, inner: &Inner, b: usize) -> CopyEnd {
        match (&inner.program.buffers[b].storage, self.home[b]) {
            (_, Home::Slot) => CopyEnd::Slot(b),
            (Storage::Weight(w), _) => CopyEnd::Weight(*w),
            _ => CopyEnd::Memory(self.ranges[b].clone().expect("allocated")),
        }
    }
}

/// The dims of `ty` under `map`, as sizes.
fn eval_dims(ty: &TensorType, map: &HashMap<Symbol, i64>) -> Result<Vec<usize>, String> {
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

/// Bytes of a tensor of `ty` with `dims`, checked for overflow.
fn byte_size(ty: &TensorType, dims: &[usize]) -> Option<u64> {
    dims.iter().try_fold(ty.dtype.size_of() as u64, |acc, &d| {
        acc.checked_mul(d as u64)
    })
}

/// What every step encoder needs besides the step.
struct StepContext<'a> {
    layout: &'a CallLayout,
    use_: &'a DeviceUse,
    si: usize,
    call: u64,
    symbol_values: &'a [i64],
    /// The recording serves every length of the states (see [`super::lengths`]).
    symbols_at_run: bool,
}

impl Session {
    fn input_error(&self, msg: String) -> RuntimeError {
        RuntimeError::Input {
            program: self.inner.program.name.clone(),
            msg,
        }
    }

    fn unsupported(&self, msg: String) -> RuntimeError {
        RuntimeError::Unsupported {
            program: self.inner.program.name.clone(),
            msg,
        }
    }

    /// Prepares a call for `inputs`' shapes: dims, arena placement, allocations and every
    /// chunk's command buffer. Reads only the inputs' shapes, so the result serves every
    /// later call of the same shapes (see [`crate::recorded`]); `call` is the recording
    /// call's number, which its CPU dispatches carry as their registry key.
    pub(super) fn record(
        &self,
        inputs: &[Tensor],
        key: Vec<Vec<usize>>,
        map: &HashMap<Symbol, i64>,
        symbol_values: &[i64],
        call: u64,
    ) -> Result<Recorded> {
        let mut layout = self.call_layout(inputs, map)?;
        let arenas = self.place_arenas(&mut layout, call)?;
        let (inputs, outputs) = self.allocate_io(&mut layout, call)?;
        self.bind_states(&mut layout, call)?;
        let (chunks, foreign) = self.record_chunks(&layout, symbol_values, call)?;
        let semaphores = self.chunk_semaphores(&chunks, call)?;
        Ok(Recorded {
            key,
            registry_key: call,
            semaphores,
            uses: 0,
            arenas,
            inputs,
            outputs,
            chunks,
            foreign,
        })
    }

    /// This call's dims and byte size of every buffer, and where each lives (an output
    /// whose dims only its values decide goes to a host slot).
    fn call_layout(&self, inputs: &[Tensor], map: &HashMap<Symbol, i64>) -> Result<CallLayout> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let nb = p.buffers.len();
        let mut home = inner.home.clone();
        let mut dims: Vec<Option<Vec<usize>>> = vec![None; nb];
        let mut sizes = vec![0u64; nb];
        for (b, decl) in p.buffers.iter().enumerate() {
            let d = match &decl.storage {
                Storage::Input(k) => Some(inputs[*k].shape().to_vec()),
                Storage::Weight(w) => Some(p.weights[*w].dims.clone()),
                Storage::Output(_) => match eval_dims(&decl.ty, map) {
                    Ok(d) => Some(d),
                    Err(_) => {
                        // Sized by the values: produced into a host slot, like Dynamic.
                        if let Home::Device(dev) = home[b] {
                            if !inner.devices[dev].is_cpu {
                                return Err(self.unsupported(format!(
                                    "output buffer {b} `{}` has dims {} that the inputs do not \
                                     determine, and it is written on a non-CPU device",
                                    decl.name, decl.ty
                                )));
                            }
                        }
                        home[b] = Home::Slot;
                        None
                    }
                },
                Storage::Arena { arena, .. } => {
                    let d = self.sized_dims(&decl.ty, map).map_err(|e| {
                        self.unsupported(format!(
                            "buffer {b} `{}` in arena {arena} has type {}: {e} (a size that \
                             depends on values needs Storage::Dynamic)",
                            decl.name, decl.ty
                        ))
                    })?;
                    Some(d)
                }
                Storage::Dynamic => None,
                Storage::State(_) => Some(self.sized_dims(&decl.ty, map).map_err(|e| {
                    self.input_error(format!("state buffer {b} `{}`: {e}", decl.name))
                })?),
            };
            if let Some(d) = &d {
                sizes[b] = byte_size(&decl.ty, d).ok_or_else(|| {
                    self.input_error(format!("buffer {b} `{}` of {d:?} overflows", decl.name))
                })?;
            }
            dims[b] = d;
        }
        Ok(CallLayout {
            home,
            dims,
            sizes,
            ranges: vec![None; nb],
            alloc_of: vec![None; nb],
            next_alloc: 0,
        })
    }

    /// The dims a recording sizes a buffer of `ty` by: under `map`, except that a
    /// recording serving every length of the states takes the dims a length sizes at
    /// their capacity (see [`super::lengths`]).
    fn sized_dims(
        &self,
        ty: &TensorType,
        map: &HashMap<Symbol, i64>,
    ) -> Result<Vec<usize>, String> {
        match &self.inner.length_free {
            Some(lf) if lf.mentions_length(ty) => lf.capacity_dims(ty, map),
            _ => eval_dims(ty, map),
        }
    }

    /// Arenas: offsets (compile-time or placed now) and one allocation each, taken from the
    /// arena pool when it holds one large enough. Returns `(arena, buffer)` per arena.
    fn place_arenas(&self, layout: &mut CallLayout, call: u64) -> Result<Vec<(usize, Buffer)>> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let nb = p.buffers.len();
        let mut arenas = Vec::with_capacity(p.arenas.len());
        let views = plan::views(p, &inner.live, &|b| layout.sizes[b]);
        for (a, arena) in p.arenas.iter().enumerate() {
            let members: Vec<usize> = (0..nb)
                .filter(|&b| layout.home[b] == Home::Arena(a))
                .collect();
            let fixed = |b: usize| match p.buffers[b].storage {
                Storage::Arena { offset, .. } => offset,
                _ => None,
            };
            let mut items: Vec<Item> = members
                .iter()
                .map(|&b| Item {
                    size: layout.sizes[b],
                    live: inner.live[b],
                    fixed: fixed(b),
                    view_of: None,
                })
                .collect();
            let index: HashMap<usize, usize> =
                members.iter().enumerate().map(|(i, &b)| (b, i)).collect();
            for (dst, src) in &views {
                if let (Some(&d), Some(&s)) = (index.get(dst), index.get(src)) {
                    items[d].view_of = Some(s);
                }
            }
            let (offsets, total) = plan::place(&items, arena.size).map_err(|e| {
                let b = members[e.item];
                self.input_error(format!(
                    "buffer {b} `{}` in arena {a}: {} (is a symbol above the bound the \
                     program was planned for?)",
                    p.buffers[b].name, e.msg
                ))
            })?;
            let use_ = &inner.devices[inner.arena_device[a]];
            let buffer = match inner.arena_pool.take(a, total) {
                Some(buffer) => buffer,
                None => use_
                    .device
                    .allocate(total, inner.arena_kind[a])
                    .map_err(hal(format!(
                        "call {call}: allocating arena {a} ({total} bytes) on `{}`",
                        use_.name
                    )))?,
            };
            arenas.push((a, buffer.clone()));
            let id = layout.next_alloc;
            layout.next_alloc += 1;
            for (&b, &offset) in members.iter().zip(&offsets) {
                if inner.live[b].is_some() {
                    let range = buffer.range(offset, layout.sizes[b]).map_err(hal(format!(
                        "call {call}: buffer `{}` in arena {a}",
                        p.buffers[b].name
                    )))?;
                    layout.ranges[b] = Some(range);
                    layout.alloc_of[b] = Some((id, offset));
                }
            }
        }
        Ok(arenas)
    }

    /// Inputs and outputs: their own allocations on the device that uses them (host-visible
    /// for inputs, which the host writes; host-cached for outputs, which it reads back).
    /// Returns where each input goes (an input that only CPU kernels read goes to its host
    /// slot as it is) and where each output is read from.
    #[allow(clippy::type_complexity)]
    fn allocate_io(
        &self,
        layout: &mut CallLayout,
        call: u64,
    ) -> Result<(Vec<(usize, InputDest)>, Vec<OutputSource>)> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let mut outputs: Vec<Option<OutputSource>> = vec![None; p.outputs.len()];
        let mut inputs: Vec<(usize, InputDest)> = Vec::new();
        for (b, decl) in p.buffers.iter().enumerate() {
            match (&decl.storage, layout.home[b]) {
                (Storage::Input(k), Home::Device(d)) => {
                    let use_ = &inner.devices[d];
                    let buffer = use_
                        .device
                        .allocate(layout.sizes[b], MemoryKind::HostVisibleShared)
                        .map_err(hal(format!(
                            "call {call}: input `{}` on `{}`",
                            decl.name, use_.name
                        )))?;
                    layout.own_allocation(b, &buffer);
                    inputs.push((*k, InputDest::Buffer(buffer)));
                }
                (Storage::Input(k), Home::Slot) => inputs.push((*k, InputDest::Slot(b))),
                (Storage::Output(k), Home::Device(d)) => {
                    let use_ = &inner.devices[d];
                    // Host-cached: the caller reads outputs back (see rafter-opt's place).
                    let buffer = use_
                        .device
                        .allocate(layout.sizes[b], MemoryKind::Host)
                        .map_err(hal(format!(
                            "call {call}: output `{}` on `{}`",
                            decl.name, use_.name
                        )))?;
                    layout.own_allocation(b, &buffer);
                    outputs[*k] = Some(OutputSource::Buffer {
                        range: buffer.whole(),
                        dtype: decl.ty.dtype,
                        dims: layout.dims[b].clone().expect("sized"),
                    });
                }
                (Storage::Output(k), Home::Slot) => outputs[*k] = Some(OutputSource::Slot(b)),
                _ => {}
            }
        }
        let outputs = outputs
            .into_iter()
            .map(|o| o.expect("verify: every output has a buffer, and it is written"))
            .collect();
        Ok((inputs, outputs))
    }

    /// State buffers: ranges at the start of their state's session allocation (the input
    /// and output of one state share it, so a step that extends the state conflicts with
    /// the ones reading it, and is ordered after them).
    fn bind_states(&self, layout: &mut CallLayout, call: u64) -> Result<()> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let base = layout.next_alloc;
        layout.next_alloc += p.states.len();
        for (b, decl) in p.buffers.iter().enumerate() {
            let Storage::State(s) = decl.storage else {
                continue;
            };
            let memory = &inner.state_memory[s];
            // At most the state's memory: a length-free recording sizes the state's input
            // (`past`) at its own bound, which may exceed the capacity the output allows.
            let len = layout.sizes[b].min(memory.buffer.size());
            let range = memory.buffer.range(0, len).map_err(hal(format!(
                "call {call}: state buffer `{}` ({len} bytes)",
                decl.name
            )))?;
            layout.ranges[b] = Some(range);
            layout.alloc_of[b] = Some((base + s, 0));
        }
        Ok(())
    }

    /// Consecutive steps on one device form a chunk (one command buffer, barriers where a
    /// step touches what an earlier step of its segment wrote, or writes what it read; on
    /// a GPU between every pair of steps); chunks wait on the earlier chunks they conflict
    /// with. Returns the chunks and the other devices' ranges that the call's cross-device
    /// copies map (`Operand::Foreign`).
    fn record_chunks(
        &self,
        layout: &CallLayout,
        symbol_values: &[i64],
        call: u64,
    ) -> Result<(Vec<Chunk>, Vec<BufferRange>)> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut chunk_accesses: Vec<Vec<Access>> = Vec::new();
        let mut foreign: Vec<BufferRange> = Vec::new();
        // Views placed over their operand, at compile time or for this call: the bytes are
        // already there, so no dispatch and no barrier (on a GPU each costs microseconds).
        let skip: Vec<bool> = p
            .steps
            .iter()
            .map(|s| p.is_placed_view(s) || plan::is_view_in_place(p, s, &layout.alloc_of))
            .collect();
        let mut si = 0;
        while si < p.steps.len() {
            if skip[si] {
                si += 1;
                continue;
            }
            let d = inner.step_device[si];
            let use_ = &inner.devices[d];
            let mut builder = use_
                .device
                .create_command_buffer()
                .map_err(hal(format!("call {call}: recording for `{}`", use_.name)))?;
            let mut segment: Vec<Access> = Vec::new();
            let mut all: Vec<Access> = Vec::new();
            while si < p.steps.len() && (skip[si] || inner.step_device[si] == d) {
                if skip[si] {
                    si += 1;
                    continue;
                }
                let acc = layout.accesses(&p.steps[si]);
                // On a CPU with one kernel thread, steps of one segment run concurrently on
                // the workers; with more, one after another, each split over the kernel
                // threads (`rafter-runtime-cpu`'s `serial_commands`). On a GPU,
                // every step waits for the one before: measured on the H100 (BERT-base,
                // f32), letting independent dispatches overlap (a transpose beside the
                // next projection) took 9.4 ms per call, a barrier between every pair
                // 8.1 ms; ResNet-50 and MobileNetV2 are chains, barriered either way.
                let serial =
                    use_.kernels.as_ref().is_some_and(|k| k.serial()) && !segment.is_empty();
                if serial || plan::any_conflict(&acc, &segment) {
                    builder.barrier();
                    segment.clear();
                }
                let cx = StepContext {
                    layout,
                    use_,
                    si,
                    call,
                    symbol_values,
                    symbols_at_run: inner.length_free.is_some(),
                };
                self.encode_step(&cx, &mut builder, &mut foreign)?;
                segment.extend(acc.iter().copied());
                all.extend(acc);
                si += 1;
            }
            let waits = chunk_accesses
                .iter()
                .enumerate()
                .filter(|(_, accesses)| plan::any_conflict(&all, accesses))
                .map(|(i, _)| i)
                .collect();
            chunks.push(Chunk {
                device: d,
                command_buffer: builder.finish(),
                waits,
            });
            chunk_accesses.push(all);
        }
        Ok((chunks, foreign))
    }

    /// Records step `cx.si` into `builder`.
    fn encode_step(
        &self,
        cx: &StepContext<'_>,
        builder: &mut CommandBufferBuilder,
        foreign: &mut Vec<BufferRange>,
    ) -> Result<()> {
        let inner = &*self.inner;
        match &inner.program.steps[cx.si] {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let buffers: Vec<Option<usize>> = args
                    .iter()
                    .map(|&b| Some(b))
                    .chain(results.iter().copied())
                    .collect();
                let operands: Vec<Operand> = buffers
                    .iter()
                    .map(|b| match b {
                        Some(b) => cx.layout.operand(inner, *b),
                        None => Operand::Absent,
                    })
                    .collect();
                let dims: Vec<&[usize]> = buffers
                    .iter()
                    .map(|b| b.and_then(|b| cx.layout.dims[b].as_deref()).unwrap_or(&[]))
                    .collect();
                cx.use_.kernels().record_dispatch(
                    builder,
                    &DispatchArgs {
                        call: cx.call,
                        step: cx.si,
                        kernel: *kernel,
                        symbol_values: cx.symbol_values,
                        symbols_at_run: cx.symbols_at_run,
                        operands: &operands,
                        dims: &dims,
                    },
                )
            }
            Step::Copy { src, dst } => self.encode_copy(cx, builder, foreign, *src, *dst),
        }
    }

    /// A copy: a device copy command between two memory ranges, or on a CPU the built-in
    /// copy entry, which also handles host slots and maps the other device's side of a
    /// cross-device copy.
    fn encode_copy(
        &self,
        cx: &StepContext<'_>,
        builder: &mut CommandBufferBuilder,
        foreign: &mut Vec<BufferRange>,
        src: usize,
        dst: usize,
    ) -> Result<()> {
        let inner = &*self.inner;
        let p = &*inner.program;
        let (layout, si) = (cx.layout, cx.si);
        let foreign_side = inner.step_foreign[si];
        let direct = foreign_side.is_none()
            && layout.home[src] != Home::Slot
            && layout.home[dst] != Home::Slot
            && !(cx.use_.is_cpu && matches!(p.buffers[src].storage, Storage::Weight(_)));
        if direct {
            let (src_range, dst_range) = (layout.range_of(inner, src), layout.range_of(inner, dst));
            if src_range.len != dst_range.len {
                return Err(self.input_error(format!(
                    "step {si} copies `{}` ({} bytes) into `{}` ({} bytes)",
                    p.buffers[src].name, src_range.len, p.buffers[dst].name, dst_range.len
                )));
            }
            if src_range.len > 0 {
                builder
                    .copy(src_range, dst_range)
                    .map_err(hal(format!("call {}: step {si}", cx.call)))?;
            }
            return Ok(());
        }
        let mut end = |b: usize| {
            if foreign_side == Some(b) {
                foreign.push(layout.ranges[b].clone().expect("allocated"));
                CopyEnd::Foreign(foreign.len() - 1)
            } else {
                layout.copy_end(inner, b)
            }
        };
        let (src_end, dst_end) = (end(src), end(dst));
        cx.use_.kernels().record_host_copy(
            builder,
            &HostCopy {
                call: cx.call,
                step: si,
                src: src_end,
                dst: dst_end,
                buffer: src,
                dims: layout.dims[src].as_deref(),
            },
        )
    }

    /// One timeline semaphore per chunk, made once: creating them per call cost 0.4 ms of
    /// ResNet-50's 0.5 ms `submit` on the H100 (`vkCreateSemaphore`; `benchmarks/RESULTS.md`,
    /// "Vulkan host work per call"). A chunk that a GPU
    /// chunk waits on signals a semaphore of that GPU: the CPU queue's host signal then
    /// hands the waiting work to the GPU at once, on the signalling thread, instead of
    /// through the GPU device's monitor thread, which may notice a CPU semaphore's callback
    /// only at its next tick.
    fn chunk_semaphores(&self, chunks: &[Chunk], call: u64) -> Result<Vec<rafter_hal::Semaphore>> {
        let inner = &*self.inner;
        let mut semaphores = Vec::with_capacity(chunks.len());
        for (i, c) in chunks.iter().enumerate() {
            let owner = chunks
                .iter()
                .filter(|later| later.waits.contains(&i))
                .map(|later| later.device)
                .find(|&d| d != c.device && !inner.devices[d].is_cpu)
                .unwrap_or(c.device);
            let use_ = &inner.devices[owner];
            semaphores.push(
                use_.device
                    .create_semaphore(0)
                    .map_err(hal(format!("call {call}: semaphore on `{}`", use_.name)))?,
            );
        }
        Ok(semaphores)
    }
}
