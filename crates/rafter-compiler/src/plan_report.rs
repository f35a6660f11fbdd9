//! The text `rafter plan` prints: what a compiled program does — its kernels in dispatch
//! order with the ops fused into each, its buffers and weights, and each device's planned
//! memory. Here rather than in the CLI so the command and the Python package's
//! `Model.plan()` print the same report from one renderer.

use rafter_ir::program::{Kernel, Program, Step, Storage};
use rafter_ir::AttrValue;

/// Whether a program uses the Vulkan device (a kernel or an arena there).
pub fn uses_vulkan(p: &Program) -> bool {
    p.kernels.iter().any(|k| k.device == "vulkan") || p.arenas.iter().any(|a| a.device == "vulkan")
}

/// Why kernel `k` of `p` cannot run on the Vulkan device, if it cannot (`None` when it can,
/// or when this build has no Vulkan target to ask).
pub fn vulkan_refusal(p: &Program, k: usize) -> Option<String> {
    let target = crate::target("vulkan").ok()?;
    let backend = target.accelerators().first()?;
    rafter_opt::place::support(p, k, backend.as_ref()).err()
}

/// The report `rafter plan` prints for `p`, as `rafter plan` and the Python package's
/// `Model.plan()` both show it. `target` is the target the program was compiled for, when
/// known: a program compiled for `vulkan` that put nothing there gets the reason for every
/// kernel, just before its buffers. The last lines are the per-device memory lines.
pub fn render(p: &Program, target: Option<&str>) -> String {
    let mut out = report(p);
    if target == Some("vulkan") && !uses_vulkan(p) {
        let at = out.find("\nbuffers: ").map_or(out.len(), |i| i + 1);
        let mut lines = placement_lines(p, true).join("\n");
        lines.push('\n');
        out.insert_str(at, &lines);
    }
    out
}

/// The report without the target's placement explanation.
fn report(p: &Program) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "program `{}`: {} inputs, {} outputs, {} kernels, {} buffers, {} steps",
        p.name,
        p.inputs.len(),
        p.outputs.len(),
        p.kernels.len(),
        p.buffers.len(),
        p.steps.len()
    ));
    for port in &p.inputs {
        line(format!("  input {}: {}", port.name, port.ty));
    }
    for port in &p.outputs {
        line(format!("  output {}: {}", port.name, port.ty));
    }
    if !p.bounds.is_empty() {
        let b: Vec<String> = p
            .bounds
            .iter()
            .map(|(s, n)| format!("{}<={n}", s.name()))
            .collect();
        line(format!("  bounds: {}", b.join(", ")));
    }
    line("steps:".into());
    let live = rafter_ir::arena::liveness(p);
    for (i, step) in p.steps.iter().enumerate() {
        line(step_line(p, i, step, &live));
    }
    for l in placement_lines(p, false) {
        line(l);
    }
    line(format!("buffers: {}", p.buffers.len()));
    for i in 0..p.buffers.len() {
        line(buffer_line(p, i));
    }
    line(format!(
        "weights: {} tensors, {} bytes",
        p.weights.len(),
        p.weights.iter().map(|w| w.bytes.len() as u64).sum::<u64>()
    ));
    for l in memory_lines(p) {
        line(l);
    }
    out
}

/// For a program using a device besides the CPU: kernels per device with the share of the
/// estimated work ([`crate::plan_cost`]) on the GPU, each kernel left on the CPU with the
/// reason it could not go to the GPU, the reasons by how many kernels they keep on the CPU
/// (the first is the one to lift), and the copies between devices.
///
/// ```text
/// placement: 7 of 9 kernels on vulkan (77.8%), 95.1% of the estimated work
///   k3 `k3_reduce` stays on cpu: op `reduce` (node `r`) is not generated for Vulkan yet
///   ...
///   why kernels stay on cpu, by count:
///     2 kernels, 4.9% of the work: op `reduce` (node ...) is not generated for Vulkan yet
///   cross-device copies: 2
///   zero-copy boundaries: 1
/// ```
fn placement_lines(p: &Program, always: bool) -> Vec<String> {
    if !always && !uses_vulkan(p) {
        return Vec::new();
    }
    let seconds = crate::plan_cost::kernel_seconds(p);
    let total: f64 = seconds.iter().sum();
    let share = |s: f64| {
        if total > 0.0 {
            100.0 * s / total
        } else {
            0.0
        }
    };
    let on_vulkan = p.kernels.iter().filter(|k| k.device == "vulkan").count();
    let gpu_seconds: f64 = p
        .kernels
        .iter()
        .zip(&seconds)
        .filter(|(k, _)| k.device == "vulkan")
        .map(|(_, s)| s)
        .sum();
    let mut lines = vec![format!(
        "placement: {on_vulkan} of {} kernels on vulkan ({:.1}%), {:.1}% of the estimated work",
        p.kernels.len(),
        if p.kernels.is_empty() {
            0.0
        } else {
            100.0 * on_vulkan as f64 / p.kernels.len() as f64
        },
        share(gpu_seconds)
    )];
    // Reasons with the node names taken out, so one op's refusals count together.
    let mut by_reason: Vec<(String, usize, f64)> = Vec::new();
    for (i, k) in p.kernels.iter().enumerate() {
        if k.device != "vulkan" {
            let why = vulkan_refusal(p, i).unwrap_or_else(|| "placed there by the compiler".into());
            lines.push(format!("  k{i} `{}` stays on {}: {why}", k.name, k.device));
            let key = reason_key(&why);
            match by_reason.iter_mut().find(|(r, _, _)| *r == key) {
                Some(entry) => {
                    entry.1 += 1;
                    entry.2 += seconds[i];
                }
                None => by_reason.push((key, 1, seconds[i])),
            }
        }
    }
    if !by_reason.is_empty() {
        by_reason.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.total_cmp(&a.2)));
        lines.push("  why kernels stay on cpu, by count:".into());
        for (reason, n, s) in by_reason {
            lines.push(format!(
                "    {n} kernel{}, {:.1}% of the work: {reason}",
                if n == 1 { "" } else { "s" },
                share(s)
            ));
        }
    }
    let crossing = p
        .steps
        .iter()
        .filter(|s| match s {
            Step::Copy { src, dst } => buffer_device(p, *src) != buffer_device(p, *dst),
            Step::Dispatch { .. } => false,
        })
        .count();
    lines.push(format!("  cross-device copies: {crossing}"));
    // Tensors a kernel on one device works on in another device's memory: allocated once
    // where both address it, handed over by semaphore alone.
    let mut zero_copy: Vec<usize> = Vec::new();
    for step in &p.steps {
        if let Step::Dispatch {
            kernel,
            args,
            results,
        } = step
        {
            for &b in args.iter().chain(results.iter().flatten()) {
                if let Storage::Arena { arena, .. } = p.buffers[b].storage {
                    if p.arenas[arena].device != p.kernels[*kernel].device
                        && !zero_copy.contains(&b)
                    {
                        zero_copy.push(b);
                    }
                }
            }
        }
    }
    if !zero_copy.is_empty() {
        lines.push(format!("  zero-copy boundaries: {}", zero_copy.len()));
    }
    lines
}

/// A refusal with what names one instance (backquoted names, `%value`s, `#n`s) replaced
/// by `…`, so the refusals of one op or dtype group together.
fn reason_key(why: &str) -> String {
    let mut out = String::with_capacity(why.len());
    let mut chars = why.chars().peekable();
    let mut in_name = false;
    while let Some(c) = chars.next() {
        if c == '`' {
            in_name = !in_name;
            if in_name {
                // Keep op names (`op `reduce``): they are what the reason is about.
                let word: String = chars.clone().take_while(|&c| c != '`').collect();
                if out.ends_with("op ") {
                    out.push('`');
                    out.push_str(&word);
                    out.push('`');
                    for _ in 0..=word.chars().count() {
                        chars.next();
                    }
                    in_name = false;
                } else {
                    out.push('…');
                }
            }
            continue;
        }
        if in_name {
            continue;
        }
        if (c == '%' || c == '#') && chars.peek().is_some_and(|n| !n.is_whitespace()) {
            out.push('…');
            while chars
                .peek()
                .is_some_and(|n| !n.is_whitespace() && *n != ')' && *n != ',')
            {
                chars.next();
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The device a buffer lives on: its arena's, or that of the first step touching it (the
/// runtime's rule for inputs, outputs and weights).
fn buffer_device(p: &Program, b: usize) -> String {
    if let Storage::Arena { arena, .. } = p.buffers[b].storage {
        return p.arenas[arena].device.clone();
    }
    if matches!(p.buffers[b].storage, Storage::Input(_)) {
        // An input lives where the first kernel reading it runs.
        for step in &p.steps {
            if let Step::Dispatch { kernel, args, .. } = step {
                if args.contains(&b) {
                    return p.kernels[*kernel].device.clone();
                }
            }
        }
    }
    for step in &p.steps {
        match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } if args.contains(&b) || results.contains(&Some(b)) => {
                return p.kernels[*kernel].device.clone()
            }
            Step::Copy { src, dst } if *dst == b => return buffer_device(p, *src),
            // First touched as a copy's source: an input or weight, on the host.
            Step::Copy { src, .. } if *src == b => return "cpu".into(),
            _ => {}
        }
    }
    "cpu".into()
}

/// `  3 k2 `attn_scores` contraction on cpu: matmul, binary.mul (b4, b7) -> (b8)` or
/// `  5 copy b8 -> b9`.
fn step_line(p: &Program, i: usize, step: &Step, live: &[Option<(usize, usize)>]) -> String {
    let buffers = |bs: &mut dyn Iterator<Item = Option<usize>>| -> String {
        bs.map(|b| b.map_or("_".to_string(), |b| format!("b{b}")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match step {
        Step::Dispatch {
            kernel,
            args,
            results,
        } => {
            let k = &p.kernels[*kernel];
            let line = format!(
                "  {i:>4} k{kernel} `{}` {} on {}: {} ({}) -> ({})",
                k.name,
                k.kind.word(),
                k.device,
                fused_ops(k).join(", "),
                buffers(&mut args.iter().map(|&b| Some(b))),
                buffers(&mut results.iter().copied())
            );
            if p.is_placed_view(step) {
                format!("{line} [a view: placed over its operand, never dispatched]")
            } else if p.per_call_view(i, live).is_some() {
                format!("{line} [a view: placed over its operand per call, never dispatched]")
            } else {
                line
            }
        }
        Step::Copy { src, dst } => {
            let (from, to) = (buffer_device(p, *src), buffer_device(p, *dst));
            if from == to {
                format!("  {i:>4} copy b{src} -> b{dst}")
            } else {
                format!("  {i:>4} copy b{src} -> b{dst} ({from} -> {to})")
            }
        }
    }
}

/// The ops of a kernel's body in order, with their kind where one op name covers several
/// (`binary.add`, `unary.gelu`, `reduce.mean`).
pub fn fused_ops(k: &Kernel) -> Vec<String> {
    k.body
        .nodes
        .iter()
        .map(|n| {
            let sub =
                n.op.attrs()
                    .into_iter()
                    .find_map(|(name, v)| match (name, v) {
                        ("op" | "kind" | "mode", AttrValue::Word(w)) => Some(w),
                        _ => None,
                    });
            match sub {
                Some(w) => format!("{}.{w}", n.op.name()),
                None => n.op.name().to_string(),
            }
        })
        .collect()
}

/// `  b3 `t7`: f32[batch, seq, 32] arena a0 offset 1024`.
fn buffer_line(p: &Program, i: usize) -> String {
    let b = &p.buffers[i];
    let storage = match &b.storage {
        Storage::Input(k) => format!("input {k}"),
        Storage::Output(k) => format!("output {k}"),
        Storage::Weight(w) => format!(
            "weight w{w} ({} bytes)",
            p.weights.get(*w).map_or(0, |c| c.bytes.len())
        ),
        Storage::Arena {
            arena,
            offset: Some(o),
        } => format!("arena a{arena} offset {o}"),
        Storage::Arena {
            arena,
            offset: None,
        } => format!("arena a{arena} (placed per call)"),
        Storage::Dynamic => "dynamic (sized by its producer)".to_string(),
        Storage::State(s) => match p.state_bytes(*s) {
            Some(bytes) => format!("state s{s} ({bytes} bytes at the bounds)"),
            None => format!("state s{s} (unbounded: declare a bound for its dims)"),
        },
    };
    format!("  b{i} `{}`: {} {storage}", b.name, b.ty)
}

/// Per device with an arena, in order of first appearance:
/// `memory DEVICE: arena A bytes, lower bound L bytes, ratio R` from the planned arenas,
/// or `memory DEVICE: arena unplanned (sized per call)` when any of its arenas is planned per
/// call. The compiler's planner fills these fields; this only adds them up.
pub fn memory_lines(p: &Program) -> Vec<String> {
    let mut devices: Vec<&str> = Vec::new();
    for a in &p.arenas {
        if !devices.contains(&a.device.as_str()) {
            devices.push(&a.device);
        }
    }
    let mut lines: Vec<String> = devices
        .into_iter()
        .map(|device| {
            let planned: Option<Vec<(u64, u64)>> = p
                .arenas
                .iter()
                .filter(|a| a.device == device)
                .map(|a| Some((a.size?, a.lower_bound?)))
                .collect();
            match planned {
                Some(sizes) => {
                    let size: u64 = sizes.iter().map(|s| s.0).sum();
                    let lower: u64 = sizes.iter().map(|s| s.1).sum();
                    format!(
                        "memory {device}: arena {size} bytes, lower bound {lower} bytes, ratio {}",
                        ratio(size, lower)
                    )
                }
                None => format!("memory {device}: arena unplanned (sized per call)"),
            }
        })
        .collect();
    if !p.states.is_empty() {
        let sizes: Option<Vec<u64>> = (0..p.states.len()).map(|s| p.state_bytes(s)).collect();
        lines.push(match sizes {
            Some(sizes) => format!(
                "memory state: {} bytes in {} states (kept across calls: KV caches), at the bounds",
                sizes.iter().sum::<u64>(),
                p.states.len()
            ),
            None => format!(
                "memory state: {} states, unbounded (declare a bound for their dims)",
                p.states.len()
            ),
        });
    }
    lines
}

/// `size / lower` with two decimals (`1.00` for an empty arena).
fn ratio(size: u64, lower: u64) -> String {
    if lower == 0 {
        return if size == 0 {
            "1.00".into()
        } else {
            "inf".into()
        };
    }
    format!("{:.2}", size as f64 / lower as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::program::Arena;

    fn arena(device: &str, size: Option<u64>, lower: Option<u64>) -> Arena {
        Arena {
            device: device.into(),
            memory: "host".into(),
            size,
            lower_bound: lower,
        }
    }

    #[test]
    fn memory_lines_sum_per_device() {
        let p = Program {
            arenas: vec![
                arena("cpu", Some(3000), Some(2000)),
                arena("vulkan", None, None),
                arena("cpu", Some(1000), Some(1000)),
            ],
            ..Program::default()
        };
        assert_eq!(
            memory_lines(&p),
            vec![
                "memory cpu: arena 4000 bytes, lower bound 3000 bytes, ratio 1.33",
                "memory vulkan: arena unplanned (sized per call)",
            ]
        );
    }

    #[test]
    fn reasons_group_without_instance_names() {
        assert_eq!(
            reason_key("op `reduce` (node `r7`) is not generated for Vulkan yet"),
            "op `reduce` (node …) is not generated for Vulkan yet"
        );
        assert_eq!(
            reason_key("value %x.3 (#12) is i64; only f32 and f16 are generated yet"),
            "value … (…) is i64; only f32 and f16 are generated yet"
        );
        assert_eq!(
            reason_key("buffer `t7` is sized by tensor values (host memory only)"),
            "buffer … is sized by tensor values (host memory only)"
        );
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(0, 0), "1.00");
        assert_eq!(ratio(150, 100), "1.50");
        assert_eq!(ratio(1, 0), "inf");
    }
}
