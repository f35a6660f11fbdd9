//! Static memory planning: arena offsets and sizes, fixed at compile time.
//!
//! Every intermediate buffer of a [`Program`] lives in an arena (one per device and memory
//! kind, made by lowering). [`plan_memory`] gives each one an offset, so the runtime
//! allocates one block per arena per call and does no placement of its own:
//!
//! 1. **Liveness.** A buffer lives from the first step that touches it (its producer) to the
//!    last (its last reader), in step order ([`arena::liveness`]); one never read lives at its
//!    producing step only.
//! 2. **Sizes at the bounds.** A buffer's size is taken at the largest values of its dims
//!    when every symbol lies within the program's declared bounds (`--dim seq<=2048`), so the
//!    planned bytes hold every admissible call. A buffer whose dims name a symbol without a
//!    bound keeps `offset: None`: the runtime sizes it per call and places it above the
//!    arena's planned `size`.
//! 3. **In place.** An elementwise-only kernel whose result has the same dims and element
//!    size as an operand read for the last time by that step writes the result over the
//!    operand ([`in_place_sources`]). Legal because every element of the result is computed
//!    from the operand's element at the same index: a kernel that streams may read element `i`
//!    and then write it, and the CPU runtime reads every operand before writing any result.
//!    Broadcast operands (other dims) and kernels holding anything but elementwise ops never
//!    qualify, except a reshape-like kernel ([`Kernel::viewed_operand`]): its result is its
//!    operand's bytes under other dims, so placed over them it needs no dispatch, and the
//!    runtime skips it. The buffers so chained form one block, live from the first's producer to the
//!    last's last reader.
//! 4. **Offsets.** Blocks are placed "greedy by size" (TFLite's offset planner,
//!    [`arena::place`]): largest first, each into the smallest gap that holds it among the
//!    blocks live at the same time, else above them, every offset 64-byte aligned. Sorting by
//!    size makes the large activations, which dominate the total, pack against each other;
//!    best fit keeps the big holes for the big blocks. On CNN and transformer schedules it
//!    lands within a few percent of the lower bound.
//! 5. **Sizes.** The arena's `size` is the end of its highest block; its `lower_bound` is the
//!    most bytes live at one step ([`arena::peak`], in-place chains counted once), which no
//!    placement can beat: `size / lower_bound` is the planner's fragmentation.
//!
//! [`check_plan`] verifies the result independently: every planned buffer within its arena,
//! and no two buffers live at one step sharing a byte, but for a legal in-place pair.

use crate::fusion::op_class;
use crate::CompileError;
use rafter_ir::arena::{self, Block, Live, ARENA_ALIGN};
use rafter_ir::program::{Kernel, KernelKind, Program, Step, Storage};
use rafter_ir::{Dim, DimError, Symbol, TensorType};
use std::collections::HashMap;
use std::fmt;

/// Options of [`plan_memory`].
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Let elementwise kernels write results over operands they read last (default on).
    pub in_place: bool,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions { in_place: true }
    }
}

/// Plans arena offsets and sizes in place: every arena buffer whose size is bounded gets an
/// offset, every arena a `size` and `lower_bound` (see the module doc). Replaces any earlier
/// plan. The program must pass [`Program::verify`].
pub fn plan_memory(program: &mut Program, opts: &PlanOptions) -> Result<(), CompileError> {
    program.verify()?;
    let facts = Facts::new(program)?;
    let sources = if opts.in_place {
        in_place_sources(program, &facts)
    } else {
        vec![None; program.buffers.len()]
    };
    let roots = chain_roots(&sources);
    for a in 0..program.arenas.len() {
        plan_arena(program, a, &facts, &roots)?;
    }
    check_plan(program)
}

/// What planning knows of each buffer.
struct Facts {
    /// First and last step touching it.
    live: Vec<Option<Live>>,
    /// Bytes at the bounds, for arena buffers that a step touches and whose dims are all
    /// bounded.
    size: Vec<Option<u64>>,
}

impl Facts {
    fn new(p: &Program) -> Result<Facts, CompileError> {
        let bounds = bounds_map(p)?;
        let live = across_devices(p, arena::liveness(p));
        let size = p
            .buffers
            .iter()
            .zip(&live)
            .enumerate()
            .map(|(b, (decl, live))| match decl.storage {
                Storage::Arena { .. } if live.is_some() => {
                    max_bytes(&decl.ty, &bounds, &p.dim_bounds)
                        .map_err(|e| plan_error(format!("buffer {b} `{}`: {e}", decl.name)))
                }
                _ => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        Ok(Facts { live, size })
    }

    /// The arena and planned size of buffer `b`, if it is a sized arena buffer.
    fn sized_arena(&self, p: &Program, b: usize) -> Option<(usize, u64)> {
        match p.buffers[b].storage {
            Storage::Arena { arena, .. } => self.size[b].map(|s| (arena, s)),
            _ => None,
        }
    }
}

/// `live` with every arena buffer that a step of another device touches (a copy between
/// the CPU and a GPU arena, which the CPU runs) made live for the whole call. Step order
/// is one device's order only: the devices run their steps concurrently, so bytes that
/// such a buffer shared with an earlier or later buffer of its arena would order the two
/// devices' work (the runtime's conflict check would make one wait for the other). BERT's
/// attention mask, computed on the CPU and copied into GPU memory, shared bytes with the
/// token ids the GPU's first kernels read, so the CPU's mask work waited for those kernels.
fn across_devices(p: &Program, mut live: Vec<Option<Live>>) -> Vec<Option<Live>> {
    let last = p.steps.len().saturating_sub(1);
    let arena_device = |b: usize| match p.buffers.get(b).map(|d| &d.storage) {
        Some(Storage::Arena { arena, .. }) => p.arenas.get(*arena).map(|a| a.device.as_str()),
        _ => None,
    };
    for step in &p.steps {
        let foreign: Vec<usize> = match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let device = p.kernels.get(*kernel).map(|k| k.device.as_str());
                args.iter()
                    .chain(results.iter().flatten())
                    .copied()
                    .filter(|&b| arena_device(b).is_some_and(|d| Some(d) != device))
                    .collect()
            }
            Step::Copy { src, dst } => {
                // The runtime runs a copy on the CPU unless both sides are memory of one
                // other device.
                let (a, b) = (arena_device(*src), arena_device(*dst));
                let runs_on = if a.is_some() && a == b {
                    a
                } else {
                    Some("cpu")
                };
                [*src, *dst]
                    .into_iter()
                    .filter(|&x| arena_device(x).is_some_and(|d| Some(d) != runs_on))
                    .collect()
            }
        };
        for b in foreign {
            if let Some(l) = live.get_mut(b).and_then(|l| l.as_mut()) {
                *l = (0, last);
            }
        }
    }
    live
}

fn plan_error(msg: String) -> CompileError {
    CompileError::Plan(msg)
}

/// The declared bounds by symbol (the smallest, if a symbol is bounded twice), and those
/// its definitions give a defined symbol.
fn bounds_map(p: &Program) -> Result<HashMap<Symbol, i64>, CompileError> {
    let mut map: HashMap<Symbol, i64> = HashMap::new();
    for (s, bound) in &p.bounds {
        if *bound < 0 {
            return Err(plan_error(format!(
                "symbol `{}` has a negative bound {bound}",
                s.name()
            )));
        }
        let entry = map.entry(s.clone()).or_insert(*bound);
        *entry = (*entry).min(*bound);
    }
    // Defined symbols (conv output sizes) are bounded by their definitions at the bounds.
    rafter_ir::symbol_def::extend_bounds(&p.symbol_defs, &mut map);
    Ok(map)
}

/// Bytes of a `ty` at its largest under `bounds` (a dim equal to a bounded sum, such as
/// `past + seq`, takes that sum's bound); `None` when a dim names an unbounded symbol.
fn max_bytes(
    ty: &TensorType,
    bounds: &HashMap<Symbol, i64>,
    sums: &[(Dim, i64)],
) -> Result<Option<u64>, String> {
    let mut bytes = ty.dtype.size_of() as u64;
    for (i, d) in ty.dims.iter().enumerate() {
        let summed = sums.iter().find(|(s, _)| s == d).map(|(_, b)| *b);
        let v = match summed.map_or_else(|| d.max_value(bounds), Ok) {
            Ok(v) => v.max(0) as u64,
            Err(DimError::Unbound(_)) => return Ok(None),
            Err(e) => return Err(format!("dim {i} of {ty}: {e}")),
        };
        bytes = bytes
            .checked_mul(v)
            .ok_or_else(|| format!("{ty} at the bounds overflows u64 bytes"))?;
    }
    Ok(Some(bytes))
}

/// Per buffer, the operand whose bytes it takes over in place, chosen in step order: the
/// first operand of its kernel for which [`can_alias`] holds and that no other result has
/// taken.
fn in_place_sources(p: &Program, facts: &Facts) -> Vec<Option<usize>> {
    let mut source = vec![None; p.buffers.len()];
    let mut taken = vec![false; p.buffers.len()];
    for (si, step) in p.steps.iter().enumerate() {
        let Step::Dispatch { args, results, .. } = step else {
            continue;
        };
        for (r, out) in results.iter().enumerate() {
            let Some(out) = *out else { continue };
            let found = args
                .iter()
                .enumerate()
                .find(|&(a, &b)| !taken[b] && can_alias(p, facts, si, (a, b), (r, out)));
            if let Some((_, &b)) = found {
                source[out] = Some(b);
                taken[b] = true;
            }
        }
    }
    source
}

/// Whether step `si` may write its result `r` (buffer `out`) over its operand `a` (buffer
/// `b`): the step dispatches an [`elementwise_only`] kernel; both buffers are sized, in one
/// arena, of equal dims and element size; the operand is touched for the last time here
/// (and not written here), the result for the first; and the operand's port has the dims
/// of every result of the kernel (its index space), so each element is read at the index
/// it is written.
fn can_alias(
    p: &Program,
    facts: &Facts,
    si: usize,
    (a, b): (usize, usize),
    (r, out): (usize, usize),
) -> bool {
    let Some(Step::Dispatch {
        kernel, results, ..
    }) = p.steps.get(si)
    else {
        return false;
    };
    let Some(k) = p.kernels.get(*kernel) else {
        return false;
    };
    let (Some((arena_b, _)), Some((arena_out, _))) =
        (facts.sized_arena(p, b), facts.sized_arena(p, out))
    else {
        return false;
    };
    let same_layout =
        |x: &TensorType, y: &TensorType| x.dims == y.dims && x.dtype.size_of() == y.dtype.size_of();
    let (Some(&port_in), Some(&port_out)) = (k.body.inputs.get(a), k.body.outputs.get(r)) else {
        return false;
    };
    let port_ty = &k.body.value(port_in).ty;
    let lifetimes_meet = b != out
        && arena_b == arena_out
        && facts.live[b].map(|l| l.1) == Some(si)
        && facts.live[out].map(|l| l.0) == Some(si)
        && !results.contains(&Some(b));
    let elementwise = elementwise_only(k)
        && same_layout(&p.buffers[b].ty, &p.buffers[out].ty)
        && same_layout(port_ty, &k.body.value(port_out).ty)
        && k.body
            .outputs
            .iter()
            .all(|&o| k.body.value(o).ty.dims == port_ty.dims);
    // A reshape-like kernel's result is its operand's bytes under other dims: placed over
    // them, it needs no dispatch at all (the runtime skips it).
    let view = k.viewed_operand() == Some(a) && r == 0;
    lifetimes_meet && (elementwise || view)
}

/// Whether a kernel is elementwise and holds elementwise ops only.
fn elementwise_only(k: &Kernel) -> bool {
    k.kind == KernelKind::Elementwise
        && k.body
            .nodes
            .iter()
            .all(|n| op_class(&n.op) == KernelKind::Elementwise)
}

/// Per buffer, the first buffer of its in-place chain (itself when it takes over nothing).
fn chain_roots(source: &[Option<usize>]) -> Vec<usize> {
    (0..source.len())
        .map(|mut b| {
            // A source is first touched before the step that first touches its taker
            // (`can_alias`), so chains end.
            while let Some(s) = source[b] {
                b = s;
            }
            b
        })
        .collect()
}

/// Plans arena `a`: one block per in-place chain of its sized buffers, placed by
/// [`arena::place`]; buffers left unsized get no offset.
fn plan_arena(
    p: &mut Program,
    a: usize,
    facts: &Facts,
    roots: &[usize],
) -> Result<(), CompileError> {
    // Per chain root: its block's index.
    let mut block_of: HashMap<usize, usize> = HashMap::new();
    let mut blocks: Vec<Block> = Vec::new();
    let mut members: Vec<(usize, usize)> = Vec::new(); // (buffer, block)
    for (b, &root) in roots.iter().enumerate() {
        let (Some((arena, size)), Some(live)) = (facts.sized_arena(p, b), facts.live[b]) else {
            continue;
        };
        if arena != a {
            continue;
        }
        let i = *block_of.entry(root).or_insert_with(|| {
            blocks.push(Block { size, live });
            blocks.len() - 1
        });
        let blk = &mut blocks[i];
        blk.size = blk.size.max(size);
        blk.live = (blk.live.0.min(live.0), blk.live.1.max(live.1));
        members.push((b, i));
    }
    let (offsets, end) = arena::place(&blocks, 0)
        .ok_or_else(|| plan_error(format!("arena {a}: offsets overflow u64")))?;
    for decl in &mut p.buffers {
        if let Storage::Arena { arena, offset } = &mut decl.storage {
            if *arena == a {
                *offset = None;
            }
        }
    }
    for (b, i) in members {
        p.buffers[b].storage = Storage::Arena {
            arena: a,
            offset: Some(offsets[i]),
        };
    }
    p.arenas[a].size = Some(end);
    p.arenas[a].lower_bound = Some(arena::peak(&blocks));
    Ok(())
}

/// Checks a planned program: each arena buffer with an offset is sized by the bounds, is
/// aligned and lies within its arena's `size`; and two of them live at one step share no
/// byte, unless they are a legal in-place pair (the same offset, live together only at the
/// one step that reads the first for the last time and writes the second, as
/// [`plan_memory`] would allow).
pub fn check_plan(p: &Program) -> Result<(), CompileError> {
    p.verify()?;
    let facts = Facts::new(p)?;
    let mut placed: Vec<Vec<(usize, u64, u64, Live)>> = vec![Vec::new(); p.arenas.len()];
    for (b, decl) in p.buffers.iter().enumerate() {
        let Storage::Arena {
            arena,
            offset: Some(offset),
        } = decl.storage
        else {
            continue;
        };
        let Some(live) = facts.live[b] else { continue };
        let what = || format!("buffer {b} `{}` at offset {offset}", decl.name);
        let size = facts.size[b]
            .ok_or_else(|| plan_error(format!("{} has no size under the bounds", what())))?;
        let limit = p.arenas.get(arena).and_then(|x| x.size);
        let end = offset.checked_add(size);
        if offset % ARENA_ALIGN != 0 || end.is_none() || limit.is_none() || end > limit {
            return Err(plan_error(format!(
                "{} ({size} bytes) is misaligned or outside arena {arena} of {limit:?} bytes",
                what()
            )));
        }
        placed[arena].push((b, offset, size, live));
    }
    for items in &placed {
        check_disjoint(p, &facts, items)?;
    }
    Ok(())
}

/// The pairwise check of [`check_plan`] within one arena.
fn check_disjoint(
    p: &Program,
    facts: &Facts,
    items: &[(usize, u64, u64, Live)],
) -> Result<(), CompileError> {
    let mut sorted = items.to_vec();
    sorted.sort_by_key(|&(b, offset, ..)| (offset, b));
    for (i, &(b1, o1, s1, l1)) in sorted.iter().enumerate() {
        // Only later-starting items can overlap bytes `o1..o1 + s1`.
        for &(b2, o2, s2, l2) in &sorted[i + 1..] {
            if o2 >= o1 + s1 {
                break;
            }
            if s1 == 0 || s2 == 0 || !arena::overlaps(l1, l2) {
                continue;
            }
            let legal =
                o1 == o2 && (in_place_pair(p, facts, b1, b2) || in_place_pair(p, facts, b2, b1));
            if !legal {
                return Err(plan_error(format!(
                    "buffers {b1} `{}` (bytes {o1}..{}, steps {l1:?}) and {b2} `{}` (bytes \
                     {o2}..{}, steps {l2:?}) are live together and overlap",
                    p.buffers[b1].name,
                    o1 + s1,
                    p.buffers[b2].name,
                    o2 + s2
                )));
            }
        }
    }
    Ok(())
}

/// Whether `out` may take over `b` in place: they are live together at one step only, the
/// last of `b` and the first of `out`, which reads `b` and writes `out` as [`can_alias`]
/// allows.
fn in_place_pair(p: &Program, facts: &Facts, b: usize, out: usize) -> bool {
    let (Some(lb), Some(lo)) = (facts.live[b], facts.live[out]) else {
        return false;
    };
    let si = lb.1;
    let Some(Step::Dispatch { args, results, .. }) = p.steps.get(si) else {
        return false;
    };
    let r = results.iter().position(|&x| x == Some(out));
    lo.0 == si
        && r.is_some_and(|r| {
            args.iter()
                .enumerate()
                .any(|(a, &x)| x == b && can_alias(p, facts, si, (a, b), (r, out)))
        })
}

/// One arena's plan, for `rafter plan` and reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaReport {
    pub arena: usize,
    pub device: String,
    pub memory: String,
    /// Planned bytes (`None`: planned per call).
    pub size: Option<u64>,
    /// The most bytes live at one step (`None`: planned per call).
    pub lower_bound: Option<u64>,
    /// Buffers with a compile-time offset.
    pub planned: usize,
    /// Buffers the runtime places per call (sizes depending on unbounded symbols), above
    /// `size`.
    pub per_call: usize,
}

impl ArenaReport {
    /// `size / lower_bound` (1 when both are 0); `None` when not planned.
    pub fn ratio(&self) -> Option<f64> {
        match (self.size, self.lower_bound) {
            (Some(0), Some(0)) => Some(1.0),
            (Some(s), Some(l)) if l > 0 => Some(s as f64 / l as f64),
            _ => None,
        }
    }
}

impl fmt::Display for ArenaReport {
    /// `memory cpu: arena 4096 bytes, lower bound 3900 bytes, ratio 1.050`, with `, plus N
    /// buffers placed per call` when some are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory {}: ", self.device)?;
        match (self.size, self.lower_bound, self.ratio()) {
            (Some(s), Some(l), Some(r)) => {
                write!(f, "arena {s} bytes, lower bound {l} bytes, ratio {r:.3}")?
            }
            _ => write!(f, "arena planned per call")?,
        }
        if self.per_call > 0 && self.size.is_some() {
            write!(f, ", plus {} buffers placed per call", self.per_call)?;
        }
        Ok(())
    }
}

/// Per arena: its device, memory kind, planned size and lower bound, and how many of its
/// buffers are planned statically or per call.
pub fn memory_report(p: &Program) -> Vec<ArenaReport> {
    p.arenas
        .iter()
        .enumerate()
        .map(|(a, arena)| {
            let mut report = ArenaReport {
                arena: a,
                device: arena.device.clone(),
                memory: arena.memory.clone(),
                size: arena.size,
                lower_bound: arena.lower_bound,
                planned: 0,
                per_call: 0,
            };
            for decl in &p.buffers {
                match decl.storage {
                    Storage::Arena {
                        arena,
                        offset: Some(_),
                    } if arena == a => report.planned += 1,
                    Storage::Arena {
                        arena,
                        offset: None,
                    } if arena == a => report.per_call += 1,
                    _ => {}
                }
            }
            report
        })
        .collect()
}
