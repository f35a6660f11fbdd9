//! Cost-model placement: device descriptions, the cost model, and the partitioner that
//! searches placements with it.
//!
//! ```text
//!   Profiles (measured by `rafter devices --profile`, else built-in defaults)
//!        │ DeviceDescription per device: rates per kernel class, dispatch and barrier
//!        │ costs, memory capacity, the link to the host
//!        ▼
//!   cost model (cost.rs): kernel work at the dims' bounds ─► seconds per kernel per
//!        │ device; crossing = link latency + copy + semaphore
//!        ▼
//!   partitioner (search.rs): simulate a call per placement, search (greedy, all-host,
//!        │ fastest-alone, DP over the schedule, then local moves), memory limits first
//!        ▼
//!   device per kernel ─► place::apply_placement (homes, copies, arenas, as greedy)
//! ```
//!
//! A [`Target`](crate::Target) carries [`PlacementOptions`]: the default strategy is
//! greedy-by-support (`--target vulkan`, what placement did before the cost model);
//! [`Strategy::CostModel`] is `--target auto` and explicit device sets
//! (`--target cpu,vulkan`).

pub mod cost;
pub mod device;
pub mod search;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rafter_ir::program::Program;

pub use device::{
    ClassRate, CostProfile, DeviceDescription, Link, Profiles, Residual, SharedMemory,
};
pub use search::{Boundary, Estimate, Model, Objective, SPLIT_MARGIN};

use crate::backend::{Target, CPU};
use crate::place;
use crate::CompileError;

/// How placement chooses devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Each kernel on the first accelerator supporting it, else the host.
    #[default]
    Greedy,
    /// The partitioner over the cost model.
    CostModel,
}

/// What placement is asked to do, carried by the [`Target`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementOptions {
    /// Greedy or cost model.
    pub strategy: Strategy,
    /// Device descriptions by name (missing ones take the built-in default).
    pub profiles: Profiles,
    /// What the cost model minimises.
    pub objective: Objective,
    /// Memory limits by device name, bytes (`--memory-limit vulkan=2GiB`).
    pub memory_limits: BTreeMap<String, u64>,
    /// Fail when a kernel would run on the host although the target has accelerators
    /// (`--deny-fallback`).
    pub deny_fallback: bool,
    /// The sizes to partition for: symbol values of the calls the program will serve
    /// (`--dim seq=128`, or the shapes of `rafter bench`'s input files). Without them a
    /// symbol is costed at its smallest declared bound, an unbounded one at 1, which ranks
    /// BERT by a one-token call, where the CPU wins kernels that lose at 128 tokens.
    pub nominal: Vec<(rafter_ir::Symbol, i64)>,
}

/// Why each device can or cannot run each kernel: `supported[k][d]` with the reason
/// when not (`None`: it can).
fn support_table(p: &Program, target: &Target) -> Vec<Vec<Option<String>>> {
    (0..p.kernels.len())
        .map(|k| {
            std::iter::once(None)
                .chain(
                    target
                        .accelerators()
                        .iter()
                        .map(|b| place::support(p, k, b.as_ref()).err()),
                )
                .collect()
        })
        .collect()
}

/// The device descriptions for `target`'s devices (index 0 the host), and their limits.
fn descriptions(target: &Target) -> (Vec<DeviceDescription>, Vec<Option<u64>>) {
    let opts = target.placement();
    let names = place::device_names(target.accelerators());
    let devices: Vec<DeviceDescription> = names.iter().map(|n| opts.profiles.get(n)).collect();
    let limits = devices
        .iter()
        .map(|d| {
            let asked = opts.memory_limits.get(&d.name).copied();
            match (asked, d.memory_bytes) {
                (Some(a), Some(m)) => Some(a.min(m)),
                (a, m) => a.or(m),
            }
        })
        .collect();
    (devices, limits)
}

/// The cost model of `p` (lowered, every kernel on the host) for `target`.
pub fn model(p: &Program, target: &Target) -> Model {
    model_at(p, target, &placement_values(p, target))
}

/// The symbol values placement costs `p` at: the target's nominal sizes where given,
/// else each symbol's smallest declared bound ([`cost::bound_values`]), else 1.
pub fn placement_values(
    p: &Program,
    target: &Target,
) -> std::collections::HashMap<rafter_ir::Symbol, i64> {
    let mut values = cost::bound_values(p);
    for (s, v) in &target.placement().nominal {
        values.insert(s.clone(), *v);
    }
    values
}

/// As [`model`], with the symbols at `values` (a call's actual dims: `rafter bench
/// --estimate` sets these estimates against measured times).
pub fn model_at(
    p: &Program,
    target: &Target,
    values: &std::collections::HashMap<rafter_ir::Symbol, i64>,
) -> Model {
    model_with(p, target, &support_table(p, target), values)
}

/// As [`model_at`], with the support table already made (`table[k][d]`: why device `d`
/// cannot run kernel `k`, `None` when it can).
fn model_with(
    p: &Program,
    target: &Target,
    table: &[Vec<Option<String>>],
    values: &std::collections::HashMap<rafter_ir::Symbol, i64>,
) -> Model {
    let supported: Vec<Vec<bool>> = table
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .map(|(d, r)| r.is_none() && !(d == 0 && target.placement().deny_fallback))
                .collect()
        })
        .collect();
    let (devices, limits) = descriptions(target);
    Model::new_at(p, devices, &supported, limits, values)
}

/// Places the kernels of `p` (lowered for the host, not memory-planned) on `target`'s
/// devices by its [`PlacementOptions`]; returns the cost model's estimate when the cost
/// model chose. Errors: `--deny-fallback` with a kernel no accelerator runs (named, with
/// each accelerator's reason), or memory limits no placement meets.
pub fn place_for_target(
    p: &mut Program,
    target: &Target,
) -> Result<Option<Estimate>, CompileError> {
    let opts = target.placement();
    let names = place::device_names(target.accelerators());
    if opts.deny_fallback {
        let table = support_table(p, target);
        for (k, row) in table.iter().enumerate() {
            if row[1..].iter().all(Option::is_some) {
                let why: Vec<String> = row[1..]
                    .iter()
                    .zip(&names[1..])
                    .map(|(r, n)| format!("{n}: {}", r.as_deref().unwrap_or("")))
                    .collect();
                return Err(CompileError::Placement(format!(
                    "--deny-fallback: kernel `{}` would run on the cpu ({})",
                    p.kernels[k].name,
                    why.join("; ")
                )));
            }
        }
    }
    match opts.strategy {
        Strategy::Greedy => {
            let devices = place::greedy_devices(p, target.accelerators());
            let zero_copy = zero_copy_links(&descriptions(target).0);
            place::apply_placement(p, &names, &devices, &zero_copy);
            Ok(None)
        }
        Strategy::CostModel => {
            let m = model(p, target);
            let (placement, estimate) = m.search(opts.objective);
            if estimate.over_memory > 0 {
                return Err(CompileError::Placement(memory_message(&m, &estimate)));
            }
            place::apply_placement(p, &names, &placement, &zero_copy_links(m.devices()));
            Ok(Some(estimate))
        }
    }
}

/// Per device, the memory it shares with the host if its link is zero-copy (the topology
/// the descriptions give: `place::apply_placement` then allocates crossing tensors once,
/// in that memory).
fn zero_copy_links(devices: &[DeviceDescription]) -> Vec<Option<SharedMemory>> {
    devices
        .iter()
        .map(|d| d.link.and_then(|l| l.shared()))
        .collect()
}

fn memory_message(m: &Model, e: &Estimate) -> String {
    let mut s = String::from("no placement fits the memory limits:");
    for (d, (desc, bytes)) in m.devices().iter().zip(&e.memory_bytes).enumerate() {
        let _ = write!(s, " {} needs {bytes} bytes", desc.name);
        if let Some(l) = m.limit(d) {
            let _ = write!(s, " (limit {l})");
        }
        s.push(';');
    }
    s.pop();
    s
}

/// One kernel's placement, explained (`rafter plan`).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelChoice {
    /// The device it runs on.
    pub device: String,
    /// Estimated seconds on that device.
    pub estimate_s: f64,
    /// Why it runs there.
    pub reason: String,
}

/// Why each kernel of a placed program `p` runs where it does, for `target`: the devices
/// that cannot run it (with their reasons) and the estimates of those that can.
pub fn explain(p: &Program, target: &Target) -> Vec<KernelChoice> {
    let table = support_table(p, target);
    let (devices, _) = descriptions(target);
    let values = placement_values(p, target);
    let greedy = target.placement().strategy == Strategy::Greedy;
    // The partitioner's own estimates (weights beyond a cache included); a device it may
    // not use for a kernel, the kernel's time there alone.
    let m = model_with(p, target, &table, &values);
    p.kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let work = cost::kernel_work(kernel, &values);
            let times: Vec<f64> = devices
                .iter()
                .enumerate()
                .map(|(d, desc)| {
                    m.times[k][d].unwrap_or_else(|| cost::kernel_time(&work, &desc.profile))
                })
                .collect();
            let on = devices
                .iter()
                .position(|d| d.name == kernel.device)
                .unwrap_or(0);
            let mut reasons: Vec<String> = Vec::new();
            for (d, why) in table[k].iter().enumerate() {
                if d == on {
                    continue;
                }
                let name = &devices[d].name;
                match why {
                    Some(why) => reasons.push(format!("{name} cannot: {why}")),
                    None => reasons.push(format!("{name} {}", micros(times[d]))),
                }
            }
            let rule = if greedy {
                if on == 0 {
                    "no accelerator runs it"
                } else {
                    "first accelerator that runs it"
                }
            } else {
                let fastest = (0..devices.len())
                    .filter(|&d| table[k][d].is_none())
                    .all(|d| times[on] <= times[d]);
                if fastest {
                    "fastest here"
                } else {
                    "slower alone, but saves crossings"
                }
            };
            let mut reason = rule.to_string();
            if !reasons.is_empty() {
                let _ = write!(reason, " ({})", reasons.join("; "));
            }
            KernelChoice {
                device: devices
                    .get(on)
                    .map_or_else(|| CPU.to_string(), |d| d.name.clone()),
                estimate_s: times[on],
                reason,
            }
        })
        .collect()
}

/// `12.3 us`.
pub fn micros(s: f64) -> String {
    format!("{:.1} us", s * 1e6)
}
