//! Device placement: which device runs each kernel, and the copies that device changes
//! need.
//!
//! [`place_on_devices`] rewrites a program lowered for the CPU (every kernel on `cpu`, one
//! host arena) for [`Target::Vulkan`](crate::Target::Vulkan):
//!
//! - **by support**: a kernel goes to `vulkan` when [`vulkan_support`] says the SPIR-V
//!   generator handles its body and every buffer it touches is sized by the inputs;
//!   everything else stays on `cpu` (the CPU fallback). There is no cost model yet: a
//!   supported kernel always goes to the GPU.
//! - **homes**: every buffer lives on the device of the step that first touches it (its
//!   producer; for a weight, its first reader; for an input, the first kernel reading it,
//!   whose copy step comes first), which is also the rule the runtime applies. An input first read by a GPU kernel is thus allocated on the GPU, and an output
//!   a GPU kernel produces is read back from GPU memory: no copy for either.
//! - **copies**: a step on device `d` that reads a buffer living elsewhere reads a replica
//!   on `d`, made by a `Step::Copy` right before the first such step (one replica per buffer
//!   and device; buffers are written once, so replicas never go stale). A weight's replica
//!   is another `Storage::Weight` buffer of the same weight: the runtime uploads it once per
//!   session, not per call.
//! - **arenas**: one per device and memory kind. On `vulkan`, buffers touched only by GPU
//!   kernels live in `device_local` memory; those a cross-device copy writes live in
//!   `host_visible_shared` memory, which the host maps to do the copy (the zero-copy memory
//!   of unified-memory and resizable-BAR GPUs); those a copy reads back to the host live in
//!   `host` memory (host-cached: reading uncached BAR memory from the CPU is very slow).

use std::collections::{HashMap, HashSet};

use rafter_ir::program::{Arena, BufferDecl, Program, Step, Storage};
use rafter_ir::{Symbol, TensorType};

/// The host device's name.
pub const CPU: &str = "cpu";
/// The Vulkan device's name.
pub const VULKAN: &str = rafter_codegen_spirv::DEVICE;

/// Whether kernel `k` of `p` can run on the Vulkan device; the error says briefly why not
/// (`rafter plan` prints it for every kernel that fell back to the CPU).
pub fn vulkan_support(p: &Program, k: usize) -> Result<(), String> {
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
                return Err(format!(
                    "buffer `{}` is sized by tensor values (host memory only)",
                    decl.name
                ));
            }
        }
    }
    rafter_codegen_spirv::supports(&kernel.body)
}

fn input_symbols(p: &Program) -> HashSet<Symbol> {
    p.inputs
        .iter()
        .flat_map(|port| port.ty.dims.iter().flat_map(|d| d.symbols()))
        .collect()
}

fn sized_by(ty: &TensorType, symbols: &HashSet<Symbol>) -> bool {
    ty.dims
        .iter()
        .flat_map(|d| d.symbols())
        .all(|s| symbols.contains(&s))
}

/// Moves every kernel [`vulkan_support`] accepts to `vulkan` and adds the arenas and copies
/// that needs (see the module doc). `p` must be a program lowered for the CPU and not yet
/// memory-planned (arena offsets are dropped and must be planned again).
pub fn place_on_devices(p: &mut Program) {
    let devices: Vec<&'static str> = (0..p.kernels.len())
        .map(|k| {
            if vulkan_support(p, k).is_ok() {
                VULKAN
            } else {
                CPU
            }
        })
        .collect();
    if !devices.contains(&VULKAN) {
        return;
    }
    for (kernel, &d) in p.kernels.iter_mut().zip(&devices) {
        kernel.device = d.to_string();
    }

    let old_steps = std::mem::take(&mut p.steps);
    let mut home: Vec<Option<&'static str>> = vec![None; p.buffers.len()];
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
    let mut replicas: HashMap<(usize, &'static str), usize> = HashMap::new();
    let mut weight_replicas: HashMap<(usize, &'static str), usize> = HashMap::new();
    // Arena buffers moved to `vulkan` (marked with this placeholder until arenas exist).
    let mut on_vulkan: HashSet<usize> = HashSet::new();
    let mut steps = Vec::with_capacity(old_steps.len());

    // The buffer holding `b` on device `d`: `b` itself, or a replica (made on first use).
    let mut local = |p: &mut Program,
                     steps: &mut Vec<Step>,
                     home: &mut Vec<Option<&'static str>>,
                     on_vulkan: &mut HashSet<usize>,
                     b: usize,
                     d: &'static str|
     -> usize {
        match home[b] {
            None => {
                home[b] = Some(d);
                return b;
            }
            Some(h) if h == d => return b,
            Some(_) => {}
        }
        let decl = p.buffers[b].clone();
        if let Storage::Weight(w) = decl.storage {
            return *weight_replicas.entry((w, d)).or_insert_with(|| {
                p.buffers.push(BufferDecl {
                    name: format!("{}@{d}", decl.name),
                    ..decl.clone()
                });
                home.push(Some(d));
                p.buffers.len() - 1
            });
        }
        *replicas.entry((b, d)).or_insert_with(|| {
            p.buffers.push(BufferDecl {
                name: format!("{}@{d}", decl.name),
                ty: decl.ty.clone(),
                storage: Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            });
            let r = p.buffers.len() - 1;
            home.push(Some(d));
            if d == VULKAN {
                on_vulkan.insert(r);
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
                    .map(|&b| local(p, &mut steps, &mut home, &mut on_vulkan, b, d))
                    .collect();
                for &r in results.iter().flatten() {
                    home[r] = Some(d);
                    if d == VULKAN && matches!(p.buffers[r].storage, Storage::Arena { .. }) {
                        on_vulkan.insert(r);
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
                let d = home[src].unwrap_or(CPU);
                home[src] = Some(d);
                home[dst] = Some(d);
                if d == VULKAN && matches!(p.buffers[dst].storage, Storage::Arena { .. }) {
                    on_vulkan.insert(dst);
                }
                steps.push(Step::Copy { src, dst });
            }
        }
    }
    p.steps = steps;

    // Arenas: 0 stays the CPU's; GPU-only buffers in `device_local`, buffers a
    // cross-device copy touches in `host_visible_shared`.
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
    let arena_of = |p: &mut Program, memory: &str| -> usize {
        if let Some(a) = p
            .arenas
            .iter()
            .position(|a| a.device == VULKAN && a.memory == memory)
        {
            return a;
        }
        p.arenas.push(Arena {
            device: VULKAN.to_string(),
            memory: memory.to_string(),
            size: None,
            lower_bound: None,
        });
        p.arenas.len() - 1
    };
    let mut on_vulkan: Vec<usize> = on_vulkan.into_iter().collect();
    on_vulkan.sort_unstable();
    for b in on_vulkan {
        // GPU results the host reads back go to host-cached memory: on a discrete GPU the
        // host-visible device memory (resizable BAR) is uncached for the CPU, and reading a
        // tensor from it there took orders of magnitude longer than the kernels (BERT-base
        // on the H100: 2.6 s per call). What the host writes for the GPU stays in
        // `host_visible_shared` (sequential writes are fast there, the GPU reads locally).
        let memory = if read_back.contains(&b) {
            "host"
        } else if crossing.contains(&b) {
            "host_visible_shared"
        } else {
            "device_local"
        };
        let a = arena_of(p, memory);
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
    let gpu_kernels: Vec<bool> = p.kernels.iter().map(|k| k.device != CPU).collect();
    crate::schedule::schedule_for_overlap(p, |k| gpu_kernels[k]);
    // A program wholly on the GPU keeps no empty CPU arena, so it names no CPU device.
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
