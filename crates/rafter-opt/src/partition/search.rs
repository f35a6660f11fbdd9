//! The partitioner: which device runs each kernel, searched with the cost model.
//!
//! A placement is scored by simulating one call ([`Model::evaluate`]): steps in program
//! order, each device running its kernels one after another, a kernel starting when its
//! device is free and its operands are there; a tensor crossing devices is copied once per
//! device that reads it, by the host (the host thread does the runtime's copies, so a
//! copy occupies the host's timeline); over a zero-copy link it is handed over in place,
//! which costs the host nothing where the device's memory is the host's and the handoff's
//! host work (a submission, a wake-up) where the device reaches host memory over a bus.
//! The call's inputs start on the host: the host writes each into the memory of the device
//! that first reads it (the first one a device gets pays the link's latency, the call's
//! round trip there), and the host reads the results back where they were made. Weights
//! are uploaded once per session and cost no time per call, only memory on every device
//! that reads them. The score is the call's
//! makespan (objective latency) or its busiest device's busy time (throughput: with calls
//! pipelined, the busiest device bounds the rate), after the memory check: a placement
//! that exceeds a device's memory limit (weights plus the peak of live tensors) ranks below
//! every one that fits, by how much it exceeds. A kernel's time on a device is the cost
//! model's, plus what it reads from memory that its calibration probe found in the cache
//! (its weights, once the device's weights outgrow the cache; a residual operand), where
//! the device's profile has a read sweep ([`crate::partition::device::WeightCache`]).
//!
//! The search is deterministic: starting candidates (greedy-by-support, everything on the
//! host, each kernel on its fastest device alone, and a dynamic programme over the
//! schedule whose state is the device of the kernel just placed, the boundary costs along
//! its best path), then local improvement that moves single kernels and runs of
//! consecutive kernels to another device while the score improves. The result replaces
//! the best of the placements a user gets without the cost model (all on the host,
//! greedy-by-support) only when it scores [`SPLIT_MARGIN`] better than it.

use std::collections::HashMap;

use rafter_ir::program::{Program, Step, Storage};

use super::cost::{
    bound_values, bytes, crossing_time, epilogue_operand_bytes, kernel_time, kernel_work,
    weight_bytes,
};
use super::device::{DeviceDescription, Link};

/// How much better than the best placement a user gets without the cost model (all on
/// the host, or greedy-by-support: [`Model::baselines`]) the model must score a placement
/// before the partitioner departs from that baseline. The model's estimate of a whole call
/// is within 25% of the measured call on every benchmark model, but its error on the
/// difference between two placements of one model is what decides a split, and a split
/// pays costs the model leaves out (another submission, a device idling between its
/// parts). On the H200 machine (2026-11-30, benchmarks/history/2026-11-30-partition.md)
/// BERT-base's split of its mask prelude onto the CPU, estimated 6.78 ms against about
/// 7.0 for the GPU alone, ran 6% behind it (6.36 against 6.00 ms, traced); the splits
/// that win are far beyond the margin (a model with CPU-only kernels mid-graph: 0.70 of
/// greedy-by-support; a model over a device's memory limit).
pub const SPLIT_MARGIN: f64 = 0.05;

/// What the partitioner minimises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Objective {
    /// One call's time, start to end.
    #[default]
    Latency,
    /// Calls per second with calls in flight: the busiest device's time per call.
    Throughput,
}

/// A placement's simulated cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Bytes by which placements exceed device memory limits (0: it fits).
    pub over_memory: u64,
    /// Seconds from the call's start to its last result.
    pub makespan_s: f64,
    /// Seconds each device (by index) is busy per call.
    pub busy_s: Vec<f64>,
    /// Bytes each device holds: its weights plus the peak of its live tensors.
    pub memory_bytes: Vec<u64>,
    /// Tensors crossing between devices per call, and their bytes.
    pub crossings: usize,
    /// Bytes crossing per call.
    pub crossing_bytes: f64,
    /// Each crossing, in the order the simulated call makes them.
    pub boundaries: Vec<Boundary>,
}

/// One tensor crossing between devices in a simulated call: what `rafter plan` prints as
/// "zero-copy" or "copy N bytes", with the cost the model assumed.
#[derive(Clone, Debug, PartialEq)]
pub struct Boundary {
    /// The program buffer crossing.
    pub buffer: usize,
    /// The device that makes it and the device that reads it (indices into the devices).
    pub from: usize,
    /// See `from`.
    pub to: usize,
    /// Its bytes.
    pub bytes: f64,
    /// Handed over by semaphore alone (one allocation both devices address), no copy.
    pub zero_copy: bool,
    /// Seconds from the producer's end to the consumer's possible start, as assumed.
    pub cost_s: f64,
}

impl Estimate {
    /// The score under `objective` (lower is better).
    pub fn score(&self, objective: Objective) -> f64 {
        match objective {
            Objective::Latency => self.makespan_s,
            Objective::Throughput => self.busy_s.iter().copied().fold(0.0, f64::max),
        }
    }

    fn better_than(&self, other: &Estimate, objective: Objective) -> bool {
        if self.over_memory != other.over_memory {
            return self.over_memory < other.over_memory;
        }
        // A relative margin keeps float noise from flipping decisions.
        self.score(objective) < other.score(objective) * (1.0 - 1e-9)
    }
}

/// One dispatch or copy step, as the simulation reads it.
#[derive(Clone, Debug)]
enum SimStep {
    Dispatch {
        kernel: usize,
        args: Vec<usize>,
        results: Vec<usize>,
    },
    Alias {
        src: usize,
        dst: usize,
    },
}

/// A program reduced to what scoring a placement needs, with its cost table.
pub struct Model {
    steps: Vec<SimStep>,
    /// Per kernel per device: estimated seconds (`None`: the device cannot run it).
    pub times: Vec<Vec<Option<f64>>>,
    buffer_bytes: Vec<f64>,
    weight: Vec<Option<usize>>,
    is_input: Vec<bool>,
    is_output: Vec<bool>,
    devices: Vec<DeviceDescription>,
    limits: Vec<Option<u64>>,
    /// Kernels in the order their steps run (the dynamic programme's order).
    order: Vec<usize>,
}

/// What one kernel reads from memory beyond its probe's: weights and epilogue operands.
#[derive(Clone, Debug, Default)]
struct Reads {
    /// The weight buffers its (first) dispatch reads and the bytes it reads of each a call
    /// ([`weight_bytes`]).
    weights: Vec<(usize, f64)>,
    /// Bytes of activations it reads in its epilogue only ([`epilogue_operand_bytes`]).
    epilogue: f64,
}

/// Per kernel, its [`Reads`].
fn kernel_reads(p: &Program, values: &HashMap<rafter_ir::Symbol, i64>) -> Vec<Reads> {
    let mut out: Vec<Option<Reads>> = vec![None; p.kernels.len()];
    for step in &p.steps {
        let Step::Dispatch { kernel, args, .. } = step else {
            continue;
        };
        if out[*kernel].is_some() {
            continue;
        }
        let is_weight: Vec<bool> = args
            .iter()
            .map(|&b| matches!(p.buffers[b].storage, Storage::Weight(_)))
            .collect();
        let k = &p.kernels[*kernel];
        let read = weight_bytes(k, &is_weight, values);
        out[*kernel] = Some(Reads {
            weights: args
                .iter()
                .zip(read)
                .filter(|&(_, r)| r > 0.0)
                .map(|(&b, r)| (b, r))
                .collect(),
            epilogue: epilogue_operand_bytes(k, &is_weight, values),
        });
    }
    out.into_iter().map(Option::unwrap_or_default).collect()
}

/// Per kernel, whether it is a reshape-like view the runtime does not dispatch: every
/// step dispatching it is one [`Program::per_call_view`] names (before the memory plan no
/// buffer has an offset yet; the plan then places the sized ones over their operand at
/// compile time, the session the others per call). Charged as a data-movement kernel,
/// BERT-base's 48 reshapes put 1.3 ms of its CPU estimate and 0.14 ms of its GPU one in
/// kernels that never run.
pub(crate) fn view_kernels(p: &Program) -> Vec<bool> {
    let live = rafter_ir::arena::liveness(p);
    let mut view: Vec<Option<bool>> = vec![None; p.kernels.len()];
    for (si, step) in p.steps.iter().enumerate() {
        let Step::Dispatch { kernel, .. } = step else {
            continue;
        };
        let here = p.per_call_view(si, &live).is_some();
        let v = &mut view[*kernel];
        *v = Some(v.unwrap_or(true) && here);
    }
    view.into_iter().map(|v| v.unwrap_or(false)).collect()
}

/// Bytes of the distinct weight buffers read by the kernels `on` selects (a buffer that
/// several kernels read counts once, at the most any of them reads of it).
fn footprint(reads: &[Reads], on: impl Fn(usize) -> bool) -> f64 {
    let mut buffers: HashMap<usize, f64> = HashMap::new();
    for (_, read) in reads.iter().enumerate().filter(|&(k, _)| on(k)) {
        for &(b, bytes) in &read.weights {
            let e = buffers.entry(b).or_insert(0.0);
            *e = e.max(bytes);
        }
    }
    buffers.values().sum()
}

impl Model {
    /// The model of `p` over `devices` (index 0 the host), with `supported[k][d]` saying
    /// whether device `d` may run kernel `k` and `limits` the memory limit per device.
    pub fn new(
        p: &Program,
        devices: Vec<DeviceDescription>,
        supported: &[Vec<bool>],
        limits: Vec<Option<u64>>,
    ) -> Model {
        Model::new_at(p, devices, supported, limits, &bound_values(p))
    }

    /// As [`Model::new`], with the symbols at `values` (the dims of a call's actual
    /// inputs, to set estimates against measurements) instead of their bounds.
    pub fn new_at(
        p: &Program,
        devices: Vec<DeviceDescription>,
        supported: &[Vec<bool>],
        limits: Vec<Option<u64>>,
        values: &HashMap<rafter_ir::Symbol, i64>,
    ) -> Model {
        let reads = kernel_reads(p, values);
        // Each device's weights: those of every kernel it may run (an upper bound on any
        // placement's, so that a kernel's cost does not depend on where the others go).
        let footprints: Vec<f64> = (0..devices.len())
            .map(|d| footprint(&reads, |k| supported[k][d]))
            .collect();
        let views = view_kernels(p);
        let times = p
            .kernels
            .iter()
            .enumerate()
            .map(|(k, kernel)| {
                if views[k] {
                    return (0..devices.len())
                        .map(|d| supported[k][d].then_some(0.0))
                        .collect();
                }
                let work = kernel_work(kernel, values);
                let read: f64 = reads[k].weights.iter().map(|&(_, b)| b).sum();
                devices
                    .iter()
                    .enumerate()
                    .map(|(d, desc)| {
                        let cache = desc.profile.weight_cache.as_ref();
                        let memory = cache.map_or(0.0, |c| {
                            c.stream_s(read, footprints[d]) + c.epilogue_s(reads[k].epilogue)
                        });
                        supported[k][d].then(|| kernel_time(&work, &desc.profile) + memory)
                    })
                    .collect()
            })
            .collect();
        let mut order = Vec::new();
        let steps = p
            .steps
            .iter()
            .map(|s| match s {
                Step::Dispatch {
                    kernel,
                    args,
                    results,
                } => {
                    if !order.contains(kernel) {
                        order.push(*kernel);
                    }
                    SimStep::Dispatch {
                        kernel: *kernel,
                        args: args.clone(),
                        results: results.iter().flatten().copied().collect(),
                    }
                }
                Step::Copy { src, dst } => SimStep::Alias {
                    src: *src,
                    dst: *dst,
                },
            })
            .collect();
        Model {
            steps,
            times,
            buffer_bytes: p.buffers.iter().map(|b| bytes(&b.ty, values)).collect(),
            weight: p
                .buffers
                .iter()
                .map(|b| match b.storage {
                    Storage::Weight(w) => Some(w),
                    _ => None,
                })
                .collect(),
            is_input: p
                .buffers
                .iter()
                .map(|b| matches!(b.storage, Storage::Input(_)))
                .collect(),
            is_output: p
                .buffers
                .iter()
                .map(|b| matches!(b.storage, Storage::Output(_)))
                .collect(),
            devices,
            limits,
            order,
        }
    }

    /// The memory limit of device `d`, bytes.
    pub fn limit(&self, d: usize) -> Option<u64> {
        self.limits.get(d).copied().flatten()
    }

    /// The devices, index 0 the host.
    pub fn devices(&self) -> &[DeviceDescription] {
        &self.devices
    }

    /// Seconds for buffer `b` to cross from device `from` to device `to`, and the link it
    /// crosses; `None` when neither is the host (the runtime copies only between the host
    /// and one device).
    fn crossing(&self, b: usize, from: usize, to: usize) -> Option<(f64, Link)> {
        let accel = match (from, to) {
            (0, a) | (a, 0) => a,
            _ => return None,
        };
        let link = self.devices[accel].link?;
        let cost = crossing_time(self.buffer_bytes[b], &link, &self.devices[to]);
        Some((cost, link))
    }

    /// Each call input with the device of its first reader, in step order.
    fn first_readers(&self, placement: &[usize]) -> Vec<(usize, usize)> {
        let mut seen = vec![false; self.buffer_bytes.len()];
        let mut out = Vec::new();
        for step in &self.steps {
            if let SimStep::Dispatch { kernel, args, .. } = step {
                for &b in args {
                    if self.is_input[b] && !std::mem::replace(&mut seen[b], true) {
                        out.push((b, placement[*kernel]));
                    }
                }
            }
        }
        out
    }

    /// When the call's input `b` is ready in device `d`'s memory: the host writes it there
    /// (a copy on the host's timeline `host_free`, none for the host's own memory or a
    /// link whose device memory is the host's), and the call reaches `d` after its link's
    /// latency, the round trip of a submission.
    fn upload(&self, b: usize, d: usize, host_free: &mut f64) -> f64 {
        let Some(link) = self.devices[d].link.filter(|_| d != 0) else {
            return 0.0;
        };
        if !link.in_place() {
            *host_free += self.buffer_bytes[b] / link.bytes_per_s;
        }
        *host_free + link.latency_s
    }

    /// Seconds for the host to have the call's result `b` from device `d` (none for the
    /// host's own memory or a link whose device memory is the host's).
    fn download(&self, b: usize, d: usize) -> f64 {
        match self.devices[d].link {
            Some(link) if d != 0 && !link.in_place() => self.buffer_bytes[b] / link.bytes_per_s,
            _ => 0.0,
        }
    }

    /// Whether device `d`'s link to the host is zero-copy (the host's own is).
    pub fn zero_copy(&self, d: usize) -> bool {
        d == 0 || self.devices[d].link.is_some_and(|l| l.zero_copy)
    }

    /// Simulates one call under `placement` (device per kernel); see the module doc.
    pub fn evaluate(&self, placement: &[usize]) -> Estimate {
        let nd = self.devices.len();
        let nb = self.buffer_bytes.len();
        let mut free = vec![0.0f64; nd];
        let mut busy = vec![0.0f64; nd];
        let mut ready = vec![0.0f64; nb];
        let mut home: Vec<Option<usize>> = vec![None; nb];
        let mut replica: HashMap<(usize, usize), f64> = HashMap::new();
        // Memory: per (buffer, device) copy, the steps it is live over.
        let mut live: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
        let mut weights_on: Vec<HashMap<usize, f64>> = vec![HashMap::new(); nd];
        let mut invalid = 0u64;
        let (mut crossings, mut crossing_bytes) = (0usize, 0.0f64);
        let mut boundaries = Vec::new();
        let mut end = 0.0f64;
        // The host writes every input into the memory of the device that reads it first
        // before the call's first kernel.
        for (b, d) in self.first_readers(placement) {
            home[b] = Some(d);
            ready[b] = self.upload(b, d, &mut free[0]);
        }
        for (si, step) in self.steps.iter().enumerate() {
            match step {
                SimStep::Dispatch {
                    kernel,
                    args,
                    results,
                } => {
                    let d = placement[*kernel];
                    let mut start = free[d];
                    for &b in args {
                        if let Some(w) = self.weight[b] {
                            weights_on[d].insert(w, self.buffer_bytes[b]);
                            continue;
                        }
                        let h = *home[b].get_or_insert(d);
                        let at = if h == d {
                            ready[b]
                        } else if let Some(&t) = replica.get(&(b, d)) {
                            t
                        } else {
                            let Some((cost, link)) = self.crossing(b, h, d) else {
                                invalid += self.buffer_bytes[b] as u64 + 1;
                                continue;
                            };
                            crossings += 1;
                            crossing_bytes += self.buffer_bytes[b];
                            boundaries.push(Boundary {
                                buffer: b,
                                from: h,
                                to: d,
                                bytes: self.buffer_bytes[b],
                                zero_copy: link.zero_copy,
                                cost_s: cost,
                            });
                            // Where the device's memory is the host's, a handoff is a
                            // semaphore: the consumer waits, the host does no work. Else
                            // the host works for it: a copy, or, zero-copy in host memory,
                            // the submission and wake-up of the handoff (each a few tens
                            // of us on an H200 machine, which left unmodelled made the
                            // partitioner split MiniLM more and slower). Zero-copy
                            // either way, no second copy is held.
                            let at = if link.in_place() {
                                ready[b] + cost
                            } else {
                                let copy_start = ready[b].max(free[0]);
                                free[0] = copy_start + cost;
                                busy[0] += cost;
                                if !link.zero_copy {
                                    live.entry((b, d)).or_insert((si, si));
                                }
                                free[0]
                            };
                            replica.insert((b, d), at);
                            at
                        };
                        let l = live.entry((b, h)).or_insert((si, si));
                        l.1 = l.1.max(si);
                        if h != d && !self.zero_copy(h.max(d)) {
                            let l = live.entry((b, d)).or_insert((si, si));
                            l.1 = l.1.max(si);
                        }
                        start = start.max(at);
                    }
                    let t = self.times[*kernel][d].unwrap_or_else(|| {
                        invalid += 1;
                        0.0
                    });
                    let finish = start + t;
                    free[d] = finish;
                    busy[d] += t;
                    end = end.max(finish);
                    for &r in results {
                        home[r] = Some(d);
                        ready[r] = finish;
                        live.entry((r, d)).or_insert((si, si));
                    }
                }
                SimStep::Alias { src, dst } => {
                    let h = *home[*src].get_or_insert(0);
                    home[*dst] = Some(h);
                    ready[*dst] = ready[*src];
                    for b in [*src, *dst] {
                        let l = live.entry((b, h)).or_insert((si, si));
                        l.1 = l.1.max(si);
                    }
                }
            }
        }
        // The host reads the call's results where their devices left them.
        for (b, &h) in home.iter().enumerate() {
            if let (true, Some(h)) = (self.is_output[b], h) {
                end = end.max(ready[b] + self.download(b, h));
            }
        }
        // Graph inputs and results stay allocated for the whole call.
        let last = self.steps.len().saturating_sub(1);
        for ((b, _), l) in live.iter_mut() {
            if self.is_input[*b] {
                l.0 = 0;
            }
        }
        let memory = self.memory(&live, &weights_on, last);
        let over: u64 = memory
            .iter()
            .zip(&self.limits)
            .map(|(&m, l)| l.map_or(0, |l| m.saturating_sub(l)))
            .sum();
        Estimate {
            over_memory: over + invalid,
            makespan_s: end,
            busy_s: busy,
            memory_bytes: memory,
            crossings,
            crossing_bytes,
            boundaries,
        }
    }

    /// Per device: weight bytes plus the peak over steps of the live tensors' bytes.
    fn memory(
        &self,
        live: &HashMap<(usize, usize), (usize, usize)>,
        weights_on: &[HashMap<usize, f64>],
        steps: usize,
    ) -> Vec<u64> {
        let nd = self.devices.len();
        let mut delta = vec![vec![0.0f64; steps + 2]; nd];
        for (&(b, d), &(from, to)) in live {
            delta[d][from] += self.buffer_bytes[b];
            delta[d][to + 1] -= self.buffer_bytes[b];
        }
        (0..nd)
            .map(|d| {
                let mut cur = 0.0f64;
                let mut peak = 0.0f64;
                for x in &delta[d] {
                    cur += x;
                    peak = peak.max(cur);
                }
                let weights: f64 = weights_on[d].values().sum();
                (weights + peak) as u64
            })
            .collect()
    }

    /// Greedy-by-support's placement under this model: each kernel on the first
    /// accelerator that runs it, else the host.
    pub fn greedy(&self) -> Vec<usize> {
        self.times
            .iter()
            .map(|t| (1..t.len()).find(|&d| t[d].is_some()).unwrap_or(0))
            .collect()
    }

    /// Each kernel on the device where it alone is fastest (ties: the lower index).
    fn fastest_alone(&self) -> Vec<usize> {
        self.times
            .iter()
            .map(|t| {
                let mut best = 0;
                for (d, x) in t.iter().enumerate() {
                    if let (Some(x), Some(b)) = (x, t[best]) {
                        if *x < b {
                            best = d;
                        }
                    }
                }
                best
            })
            .collect()
    }

    /// The dynamic programme over the schedule (module doc): for each device, the best
    /// placement of the kernels so far that puts the last one there, scored by the sum of
    /// kernel times and crossing costs along it.
    fn dynamic_programme(&self) -> Vec<usize> {
        let nd = self.devices.len();
        let nk = self.times.len();
        // Per device: (cost, placement so far, home device of each buffer).
        let mut states: Vec<Option<(f64, Vec<usize>)>> = vec![Some((0.0, vec![0; nk]))];
        states.resize(nd, None);
        let args_of = self.kernel_args();
        for &k in &self.order {
            let mut next: Vec<Option<(f64, Vec<usize>)>> = vec![None; nd];
            for (d, slot) in next.iter_mut().enumerate() {
                let Some(t) = self.times[k][d] else { continue };
                for (cost, placed) in states.iter().flatten() {
                    let mut c = cost + t;
                    for &(b, producer) in &args_of[k] {
                        let from = placed[producer];
                        if from != d {
                            c += self.crossing(b, from, d).map_or(f64::INFINITY, |(t, _)| t);
                        }
                    }
                    if slot.as_ref().is_none_or(|(best, _)| c < *best) {
                        let mut p = placed.clone();
                        p[k] = d;
                        *slot = Some((c, p));
                    }
                }
            }
            states = next;
        }
        states
            .into_iter()
            .flatten()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map_or_else(|| self.greedy(), |(_, p)| p)
    }

    /// Per kernel: its operands made by other kernels, with the producing kernel.
    fn kernel_args(&self) -> Vec<Vec<(usize, usize)>> {
        let mut producer: HashMap<usize, usize> = HashMap::new();
        let mut out = vec![Vec::new(); self.times.len()];
        for step in &self.steps {
            match step {
                SimStep::Dispatch {
                    kernel,
                    args,
                    results,
                } => {
                    for &b in args {
                        if let Some(&pk) = producer.get(&b) {
                            out[*kernel].push((b, pk));
                        }
                    }
                    for &r in results {
                        producer.insert(r, *kernel);
                    }
                }
                SimStep::Alias { src, dst } => {
                    if let Some(&pk) = producer.get(src) {
                        producer.insert(*dst, pk);
                    }
                }
            }
        }
        out
    }

    /// The placements a user gets without the cost model, by name: every kernel on the
    /// host (`cpu`), and per accelerator, each kernel there where it runs, else on the
    /// host (greedy-by-support with that accelerator alone: `--target vulkan`).
    pub fn baselines(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = vec![(self.devices[0].name.clone(), vec![0; self.times.len()])];
        for d in 1..self.devices.len() {
            let p = self
                .times
                .iter()
                .map(|t| if t[d].is_some() { d } else { 0 })
                .collect();
            out.push((self.devices[d].name.clone(), p));
        }
        out
    }

    /// The best placement found (see the module doc), with its estimate: the search's
    /// best where it beats the best of the [`Model::baselines`] by more than
    /// [`SPLIT_MARGIN`] (or fits memory where they do not), else that baseline.
    pub fn search(&self, objective: Objective) -> (Vec<usize>, Estimate) {
        let (placement, estimate) = self.search_all(objective);
        let Some((base, base_estimate)) = self
            .baselines()
            .into_iter()
            .map(|(_, p)| {
                let e = self.evaluate(&p);
                (p, e)
            })
            .reduce(|a, b| {
                if b.1.better_than(&a.1, objective) {
                    b
                } else {
                    a
                }
            })
        else {
            return (placement, estimate);
        };
        let clearly_better = if estimate.over_memory != base_estimate.over_memory {
            estimate.over_memory < base_estimate.over_memory
        } else {
            estimate.score(objective) < base_estimate.score(objective) * (1.0 - SPLIT_MARGIN)
        };
        if clearly_better {
            (placement, estimate)
        } else {
            (base, base_estimate)
        }
    }

    /// The best placement of the candidates and local improvement, with no margin.
    fn search_all(&self, objective: Objective) -> (Vec<usize>, Estimate) {
        let candidates = [
            self.greedy(),
            vec![0; self.times.len()],
            self.fastest_alone(),
            self.dynamic_programme(),
        ];
        let mut best: Option<(Vec<usize>, Estimate)> = None;
        for c in candidates {
            let e = self.evaluate(&c);
            if best
                .as_ref()
                .is_none_or(|(_, b)| e.better_than(b, objective))
            {
                best = Some((c, e));
            }
        }
        let (mut placement, mut estimate) = best.expect("four candidates");
        self.improve(&mut placement, &mut estimate, objective);
        (placement, estimate)
    }

    /// Local improvement: moves of one kernel, then of runs of 2, 4, 8, ... consecutive
    /// kernels (schedule order) to another device, kept while they improve the score.
    fn improve(&self, placement: &mut Vec<usize>, estimate: &mut Estimate, objective: Objective) {
        const PASSES: usize = 6;
        let n = self.order.len();
        for _ in 0..PASSES {
            let mut changed = false;
            for i in 0..n {
                for d in 0..self.devices.len() {
                    let mut len = 1;
                    while i + len <= n {
                        let run = &self.order[i..i + len];
                        if run
                            .iter()
                            .all(|&k| placement[k] == d || self.times[k][d].is_none())
                        {
                            len *= 2;
                            continue;
                        }
                        let mut trial = placement.clone();
                        for &k in run {
                            if self.times[k][d].is_some() {
                                trial[k] = d;
                            }
                        }
                        let e = self.evaluate(&trial);
                        if e.better_than(estimate, objective) {
                            *placement = trial;
                            *estimate = e;
                            changed = true;
                        }
                        len *= 2;
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lowered(text: &str) -> Program {
        let g = rafter_ir::text::parse_graph(text).unwrap();
        crate::lower(&g, &crate::LowerOptions::default()).unwrap()
    }

    /// The reshape kernels of `p`, each with whether [`view_kernels`] makes it free.
    fn reshapes(p: &Program) -> Vec<bool> {
        let views = view_kernels(p);
        let found: Vec<bool> = (0..p.kernels.len())
            .filter(|&k| p.kernels[k].viewed_operand().is_some())
            .map(|k| views[k])
            .collect();
        assert!(!found.is_empty(), "no reshape kernel in {p:?}");
        found
    }

    #[test]
    fn a_reshape_is_free_only_where_its_operand_dies() {
        // The product is read by the reshape alone: its result is placed over it.
        let alone = lowered(
            r#"graph @g(%x: f32[seq, 6], %w: f32[6, 6]) -> (%y) {
              %a: f32[seq, 6] = matmul(%x, %w)
              const %s: i64[3] = dense [0, 2, 3]
              %r: f32[seq, 2, 3] = reshape{allow_zero = false}(%a, %s)
              %y: f32[seq, 3, 2] = transpose{perm = [0, 2, 1]}(%r)
            }"#,
        );
        assert_eq!(reshapes(&alone), vec![true]);
        // The product is also read after the reshape: the reshape copies it.
        let shared = lowered(
            r#"graph @g(%x: f32[seq, 6], %w: f32[6, 6]) -> (%y, %z) {
              %a: f32[seq, 6] = matmul(%x, %w)
              const %s: i64[3] = dense [0, 2, 3]
              %r: f32[seq, 2, 3] = reshape{allow_zero = false}(%a, %s)
              %y: f32[seq, 3, 2] = transpose{perm = [0, 2, 1]}(%r)
              %z: f32[seq, 6] = matmul(%a, %w)
            }"#,
        );
        assert_eq!(reshapes(&shared), vec![false]);
    }
}
