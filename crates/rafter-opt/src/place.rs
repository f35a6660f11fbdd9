//! Device placement: which device runs each kernel, and the copies that device changes
//! need.
//!
//! [`place_on_devices`] rewrites a program lowered for the CPU (every kernel on `cpu`, one
//! host arena) for a [`Target`](crate::Target) with accelerators (`--target vulkan`):
//!
//! - **by support**: a kernel goes to the first accelerator whose backend generates code
//!   for its body ([`Backend::supports`]) when every buffer it touches is sized by the
//!   inputs ([`support`]); everything else stays on `cpu` (the CPU fallback). There is no
//!   cost model yet: a supported kernel always goes to the accelerator.
//! - **homes**: every buffer lives on the device of the step that first touches it (its
//!   producer; for a weight, its first reader; for an input, the first kernel reading it,
//!   whose copy step comes first), which is also the rule the runtime applies. An input first read by a GPU kernel is thus allocated on the GPU, and an output
//!   a GPU kernel produces is read back from GPU memory: no copy for either.
//! - **copies**: a step on device `d` that reads a buffer living elsewhere reads a replica
//!   on `d`, made by a `Step::Copy` right before the first such step (one replica per buffer
//!   and device; buffers are written once, so replicas never go stale). A weight's replica
//!   is another `Storage::Weight` buffer of the same weight: the runtime uploads it once per
//!   session, not per call.
//! - **arenas**: one per device and memory kind. On an accelerator, buffers touched only by
//!   its kernels live in `device_local` memory; those a cross-device copy writes live in
//!   `host_visible_shared` memory, which the host maps to do the copy (device-local and
//!   host-visible where the GPU has it: a resizable BAR, which the host writes fast and
//!   reads slowly); those a copy reads back to the host live in
//!   `host` memory (host-cached: reading uncached BAR memory from the CPU is very slow).
//! - **zero-copy**: over a link that shares memory with the host ([`apply_placement`]), a
//!   tensor crossing between the host and the device is no copy but one buffer both
//!   devices' kernels use in place: in `host_visible_shared` memory where that is the
//!   host's (unified memory), in `host` memory where the device reaches the host's cached
//!   memory over its bus (a discrete GPU).
//!
//! Copies run between the host and one accelerator; with several accelerators, a buffer
//! one makes and another reads would need a copy between the two, which the runtime does
//! not run yet (it refuses such a program by name).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rafter_ir::program::{Arena, BufferDecl, Program, Step, Storage};
use rafter_ir::{Symbol, TensorType};

use crate::backend::Backend;
pub use crate::backend::CPU;
pub use crate::partition::SharedMemory;

/// Whether kernel `k` of `p` can run on `backend`'s device; the error says briefly why not
/// (`rafter plan` prints it for every kernel that fell back to the CPU). Beyond what the
/// backend generates code for, a kernel off the host must touch only buffers the inputs
/// size (the host keeps the others in host slots) and bind every result.
pub fn support(p: &Program, k: usize, backend: &dyn Backend) -> Result<(), String> {
    let kernel = p
        .kernels
        .get(k)
        .ok_or_else(|| format!("kernel {k} does not exist"))?;
    let inputs = input_symbols(p);
    for step in &p.steps {
        let Step::Dispatch {
            kernel: sk,
            args,
            results,
        } = step
        else {
            continue;
        };
        if *sk != k {
            continue;
        }
        if results.iter().any(Option::is_none) {
            return Err("an optional result is unused".into());
        }
        for b in args.iter().chain(results.iter().flatten()) {
            let decl = &p.buffers[*b];
            if decl.storage == Storage::Dynamic || !sized_by(&decl.ty, &inputs) {
                return Err(value_sized(p, &decl.name, &decl.ty, &inputs));
            }
        }
    }
    backend.supports(&kernel.body)
}

/// Why buffer `name` of type `ty` lives in host memory: it is sized by tensor values. Names
/// the first symbol the inputs do not bind and the op whose result it first sizes, the op
/// that keeps everything sized by it on the host (`rafter plan` groups refusals by it).
fn value_sized(p: &Program, name: &str, ty: &TensorType, inputs: &HashSet<Symbol>) -> String {
    let plain = format!("buffer `{name}` is sized by tensor values (host memory only)");
    let Some(symbol) = ty
        .dims
        .iter()
        .flat_map(|d| d.symbols())
        .find(|s| !inputs.contains(s))
    else {
        return plain;
    };
    let origin = p.steps.iter().find_map(|step| {
        let Step::Dispatch {
            kernel, results, ..
        } = step
        else {
            return None;
        };
        let sized = results.iter().flatten().any(|&r| {
            p.buffers[r]
                .ty
                .dims
                .iter()
                .any(|d| d.symbols().contains(&symbol))
        });
        sized.then_some(*kernel)
    });
    let Some(k) = origin else { return plain };
    let body = &p.kernels[k].body;
    // The body's first node whose result carries the symbol made it.
    let node = body.nodes.iter().find(|n| {
        n.outputs.iter().flatten().any(|&v| {
            body.value(v)
                .ty
                .dims
                .iter()
                .any(|d| d.symbols().contains(&symbol))
        })
    });
    match node {
        Some(n) => format!(
            "buffer `{name}` is sized by `{}`, which only tensor values determine (host \
             memory only); it first sizes the result of op `{}` (node `{}`, kernel k{k})",
            symbol.name(),
            n.op.name(),
            n.name
        ),
        None => plain,
    }
}

/// Symbols bound before any work runs: the inputs', and those defined from them
/// ([`Program::symbol_defs`], evaluated on the host with the inputs).
fn input_symbols(p: &Program) -> HashSet<Symbol> {
    p.inputs
        .iter()
        .flat_map(|port| port.ty.dims.iter().flat_map(|d| d.symbols()))
        .chain(p.symbol_defs.iter().map(|d| d.symbol.clone()))
        .collect()
}

fn sized_by(ty: &TensorType, symbols: &HashSet<Symbol>) -> bool {
    ty.dims
        .iter()
        .flat_map(|d| d.symbols())
        .all(|s| symbols.contains(&s))
}

/// Moves every kernel an accelerator supports ([`support`]) to the first such, and adds
/// the arenas and copies that needs (see the module doc). `p` must be a program lowered
/// for the CPU and not yet memory-planned (arena offsets are dropped and must be planned
/// again).
pub fn place_on_devices(p: &mut Program, accelerators: &[Arc<dyn Backend>]) {
    let devices = greedy_devices(p, accelerators);
    let names = device_names(accelerators);
    apply_placement(p, &names, &devices, &vec![None; names.len()]);
}

/// The device names placement indexes: the host (0), then accelerator `i` as `i + 1`.
pub fn device_names(accelerators: &[Arc<dyn Backend>]) -> Vec<String> {
    std::iter::once(CPU.to_string())
        .chain(accelerators.iter().map(|b| b.device().to_string()))
        .collect()
}

/// Greedy-by-support: per kernel, the first accelerator supporting it ([`support`]), as
/// an index into [`device_names`]; 0 (the host) when none does.
pub fn greedy_devices(p: &Program, accelerators: &[Arc<dyn Backend>]) -> Vec<usize> {
    (0..p.kernels.len())
        .map(|k| {
            accelerators
                .iter()
                .position(|b| support(p, k, b.as_ref()).is_ok())
                .map_or(0, |i| i + 1)
        })
        .collect()
}

/// Puts kernel `k` on device `names[devices[k]]` (`names[0]` is the host) and adds the
/// homes, copies and arenas that needs (see the module doc). The caller has checked that
/// each device supports its kernels.
///
/// `zero_copy[d]`: where device `d` and the host address the same memory, if they do (the
/// topology says so). Then a tensor crossing between the host and `d` is no copy: it is
/// allocated once, in `d`'s arena of that memory, the host's kernels work on it in place,
/// and the runtime hands it over by semaphore alone. [`SharedMemory::Device`] (unified
/// memory, lavapipe's host memory): the `host_visible_shared` arena, and this holds for an
/// arena tensor one side makes and the other reads, for an input `d` reads first and the
/// host later, and for an output `d` makes and the host reads. [`SharedMemory::Host`] (a
/// discrete GPU reaching host memory over its bus): the `host` arena, for arena tensors
/// and outputs (an input lives in the device's host-visible memory, which the host reads
/// uncached, so a host read of it still copies). Other crossings (a weight, an input the
/// host reads first) copy.
pub fn apply_placement(
    p: &mut Program,
    names: &[String],
    devices: &[usize],
    zero_copy: &[Option<SharedMemory>],
) {
    if devices.iter().all(|&d| d == 0) {
        return;
    }
    let shared_with = |d: usize| zero_copy.get(d).copied().flatten().filter(|_| d != 0);
    let zero_copy_with = |d: usize| shared_with(d).is_some();
    for (kernel, &d) in p.kernels.iter_mut().zip(devices) {
        kernel.device = names[d].clone();
    }

    let old_steps = std::mem::take(&mut p.steps);
    let mut home: Vec<Option<usize>> = vec![None; p.buffers.len()];
    // An input lives where the first kernel reading it runs (the output copies of inputs
    // that lowering puts first must not pull it to the CPU).
    for step in &old_steps {
        if let Step::Dispatch { kernel, args, .. } = step {
            for &b in args {
                if matches!(p.buffers[b].storage, Storage::Input(_)) && home[b].is_none() {
                    home[b] = Some(devices[*kernel]);
                }
            }
        }
    }
    // Zero-copy boundaries: arena tensors whose kernels run on the host and on one device
    // sharing its memory live on that device, in memory both address (`shared`).
    let mut shared: HashSet<usize> = HashSet::new();
    for (b, touched) in touching_devices(p, &old_steps, devices) {
        let accels: Vec<usize> = touched.iter().copied().filter(|&d| d != 0).collect();
        if touched.contains(&0) && accels.len() == 1 && zero_copy_with(accels[0]) {
            home[b] = Some(accels[0]);
            shared.insert(b);
        }
    }
    let mut replicas: HashMap<(usize, usize), usize> = HashMap::new();
    let mut weight_replicas: HashMap<(usize, usize), usize> = HashMap::new();
    // Arena buffers moved to an accelerator, with its device (their arenas are made below).
    let mut off_host: HashMap<usize, usize> =
        shared.iter().map(|&b| (b, home[b].expect("set"))).collect();
    let mut steps = Vec::with_capacity(old_steps.len());

    // The buffer holding `b` on device `d`: `b` itself, or a replica (made on first use).
    let mut local = |p: &mut Program,
                     steps: &mut Vec<Step>,
                     home: &mut Vec<Option<usize>>,
                     off_host: &mut HashMap<usize, usize>,
                     b: usize,
                     d: usize|
     -> usize {
        match home[b] {
            None => {
                home[b] = Some(d);
                return b;
            }
            Some(h) if h == d => return b,
            // The host reads, in place, what a zero-copy device made or was given.
            Some(h)
                if d == 0
                    && zero_copy_with(h)
                    && (shared.contains(&b)
                        || matches!(p.buffers[b].storage, Storage::Output(_))
                        || (matches!(p.buffers[b].storage, Storage::Input(_))
                            && shared_with(h) == Some(SharedMemory::Device))) =>
            {
                return b
            }
            Some(_) => {}
        }
        let decl = p.buffers[b].clone();
        if let Storage::Weight(w) = decl.storage {
            return *weight_replicas.entry((w, d)).or_insert_with(|| {
                p.buffers.push(BufferDecl {
                    name: format!("{}@{}", decl.name, names[d]),
                    ..decl.clone()
                });
                home.push(Some(d));
                p.buffers.len() - 1
            });
        }
        *replicas.entry((b, d)).or_insert_with(|| {
            p.buffers.push(BufferDecl {
                name: format!("{}@{}", decl.name, names[d]),
                ty: decl.ty.clone(),
                storage: Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            });
            let r = p.buffers.len() - 1;
            home.push(Some(d));
            if d != 0 {
                off_host.insert(r, d);
            }
            steps.push(Step::Copy { src: b, dst: r });
            r
        })
    };

    for step in old_steps {
        match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let d = devices[kernel];
                let args = args
                    .iter()
                    .map(|&b| local(p, &mut steps, &mut home, &mut off_host, b, d))
                    .collect();
                for &r in results.iter().flatten() {
                    if shared.contains(&r) {
                        continue;
                    }
                    home[r] = Some(d);
                    if d != 0 && matches!(p.buffers[r].storage, Storage::Arena { .. }) {
                        off_host.insert(r, d);
                    }
                }
                steps.push(Step::Dispatch {
                    kernel,
                    args,
                    results,
                });
            }
            Step::Copy { src, dst } => {
                // A graph output that repeats another value: copied where the value lives.
                let d = home[src].unwrap_or(0);
                home[src] = Some(d);
                home[dst] = Some(d);
                if d != 0 && matches!(p.buffers[dst].storage, Storage::Arena { .. }) {
                    off_host.insert(dst, d);
                }
                steps.push(Step::Copy { src, dst });
            }
        }
    }
    p.steps = steps;

    // Arenas: 0 stays the CPU's; an accelerator's buffers in `device_local` memory, those
    // a cross-device copy touches in `host_visible_shared`, those it reads back in `host`.
    let mut crossing: HashSet<usize> = HashSet::new();
    let mut read_back: HashSet<usize> = HashSet::new();
    for step in &p.steps {
        if let Step::Copy { src, dst } = *step {
            if home[src] != home[dst] {
                crossing.insert(src);
                crossing.insert(dst);
                read_back.insert(src);
            }
        }
    }
    let arena_of = |p: &mut Program, device: &str, memory: &str| -> usize {
        if let Some(a) = p
            .arenas
            .iter()
            .position(|a| a.device == device && a.memory == memory)
        {
            return a;
        }
        p.arenas.push(Arena {
            device: device.to_string(),
            memory: memory.to_string(),
            size: None,
            lower_bound: None,
        });
        p.arenas.len() - 1
    };
    let mut off_host: Vec<(usize, usize)> = off_host.into_iter().collect();
    off_host.sort_unstable();
    for (b, d) in off_host {
        // Results the host reads back go to host-cached memory: on a discrete GPU the
        // host-visible device memory (resizable BAR) is uncached for the CPU, and reading a
        // tensor from it there took orders of magnitude longer than the kernels (BERT-base
        // on the H100: 2.6 s per call). What the host writes for the device stays in
        // `host_visible_shared` (sequential writes are fast there, the device reads locally).
        let memory = if shared.contains(&b) {
            shared_with(d).map_or("host_visible_shared", SharedMemory::arena_memory)
        } else if read_back.contains(&b) {
            "host"
        } else if crossing.contains(&b) {
            "host_visible_shared"
        } else {
            "device_local"
        };
        let a = arena_of(p, &names[d], memory);
        p.buffers[b].storage = Storage::Arena {
            arena: a,
            offset: None,
        };
    }
    for decl in &mut p.buffers {
        if let Storage::Arena { offset, .. } = &mut decl.storage {
            *offset = None;
        }
    }
    let off_cpu: Vec<bool> = p.kernels.iter().map(|k| k.device != CPU).collect();
    crate::schedule::schedule_for_overlap(p, |k| off_cpu[k]);
    // A program wholly off the CPU keeps no empty CPU arena, so it names no CPU device.
    let cpu_arena_used = p
        .buffers
        .iter()
        .any(|b| matches!(b.storage, Storage::Arena { arena: 0, .. }));
    if !cpu_arena_used && !p.kernels.iter().any(|k| k.device == CPU) {
        p.arenas.remove(0);
        for decl in &mut p.buffers {
            if let Storage::Arena { arena, .. } = &mut decl.storage {
                *arena -= 1;
            }
        }
    }
}

/// For each arena buffer, the devices (indices, by `devices` per kernel) of the
/// dispatches that read or write it.
fn touching_devices(
    p: &Program,
    steps: &[Step],
    devices: &[usize],
) -> Vec<(usize, HashSet<usize>)> {
    let mut touched: Vec<HashSet<usize>> = vec![HashSet::new(); p.buffers.len()];
    for step in steps {
        if let Step::Dispatch {
            kernel,
            args,
            results,
        } = step
        {
            for &b in args.iter().chain(results.iter().flatten()) {
                touched[b].insert(devices[*kernel]);
            }
        }
    }
    let mut out: Vec<(usize, HashSet<usize>)> = touched
        .into_iter()
        .enumerate()
        .filter(|(b, _)| matches!(p.buffers[*b].storage, Storage::Arena { .. }))
        .collect();
    out.sort_by_key(|(b, _)| *b);
    out
}
