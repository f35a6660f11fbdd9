//! The cost model's estimates set against a trace of real calls: per kernel class, per
//! device and per partition (a run of consecutive kernels on one device), and each
//! device's busy time and idle fraction while calls were in flight.
//!
//! `rafter bench --estimate` prints [`estimate_table`]; `rafter run --trace` and
//! `rafter bench --trace` print [`device_lines`]. Measured kernel times come from the
//! devices' trace spans: a dispatch spread over several worker threads gives one span per
//! thread, so a kernel's time in a call is the length of the union of its spans (the wall
//! time it held its device), and its measured time the median over the calls.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use rafter_compiler::Target;
use rafter_hal::{TraceEvent, TraceKind};
use rafter_ir::program::Program;
use rafter_ir::Symbol;
use rafter_opt::partition::{self, cost};

/// The device of a trace queue (`cpu:0` → `cpu`).
fn device_of(queue: &str) -> &str {
    queue.split(':').next().unwrap_or(queue)
}

/// Total length of the union of `spans` (start, end), seconds.
pub fn union_s(mut spans: Vec<(Instant, Instant)>) -> f64 {
    spans.sort_by_key(|s| s.0);
    let mut total = 0.0;
    let mut cur: Option<(Instant, Instant)> = None;
    for (a, b) in spans {
        match cur {
            Some((s, e)) if a <= e => cur = Some((s, e.max(b))),
            _ => {
                if let Some((s, e)) = cur {
                    total += (e - s).as_secs_f64();
                }
                cur = Some((a, b));
            }
        }
    }
    if let Some((s, e)) = cur {
        total += (e - s).as_secs_f64();
    }
    total
}

/// Each kernel's median time over `calls` (windows from submission to return, in order,
/// as [`handoffs`] takes them), from the dispatches of `events` within each window: the
/// typical time of a kernel, which the calibration's probes are rated by too (a call's
/// fastest run is not the sum of its kernels' fastest ones: on a shared machine each
/// kernel is disturbed at its own moments). A kernel counts in the calls it ran in.
fn median_by_kernel(events: &[TraceEvent], calls: &[(Instant, Instant)]) -> HashMap<String, f64> {
    let mut spans: HashMap<(&str, usize), Vec<(Instant, Instant)>> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == TraceKind::Dispatch) {
        let Some(call) = calls.partition_point(|c| c.0 <= e.start).checked_sub(1) else {
            continue;
        };
        if e.end <= calls[call].1 {
            spans
                .entry((&*e.name, call))
                .or_default()
                .push((e.start, e.end));
        }
    }
    let mut per_call: HashMap<String, Vec<f64>> = HashMap::new();
    for ((name, _), v) in spans {
        per_call
            .entry(name.to_string())
            .or_default()
            .push(union_s(v));
    }
    per_call.into_iter().map(|(k, v)| (k, median(v))).collect()
}

/// The median of `v` (not empty): the mean of the middle two of an even count.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

/// The `q`-quantile of sorted `xs` by linear interpolation between closest ranks.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let pos = q * (xs.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
}

/// Per device seen in `events`: seconds busy (the union of its spans: dispatches,
/// copies, fills) within the window from the first span of any device to the last.
pub fn device_busy(events: &[TraceEvent]) -> (f64, BTreeMap<String, f64>) {
    let Some(first) = events.iter().map(|e| e.start).min() else {
        return (0.0, BTreeMap::new());
    };
    let last = events.iter().map(|e| e.end).max().unwrap_or(first);
    let mut spans: BTreeMap<String, Vec<(Instant, Instant)>> = BTreeMap::new();
    for e in events {
        spans
            .entry(device_of(&e.queue).to_string())
            .or_default()
            .push((e.start, e.end));
    }
    let busy = spans.into_iter().map(|(d, v)| (d, union_s(v))).collect();
    ((last - first).as_secs_f64(), busy)
}

/// `device cpu: busy 12.3 ms of 15.0 ms (idle 18.0%)` per device in `events`.
pub fn device_lines(events: &[TraceEvent]) -> Vec<String> {
    let (window, busy) = device_busy(events);
    busy.iter()
        .map(|(d, b)| {
            let idle = if window > 0.0 {
                100.0 * (1.0 - b / window)
            } else {
                0.0
            };
            format!(
                "device {d}: busy {:.3} ms of {:.3} ms in flight (idle {idle:.1}%)",
                b * 1e3,
                window * 1e3
            )
        })
        .collect()
}

/// A handoff between devices: producer, consumer, seconds.
pub type Handoff = (String, String, f64);

/// Handoffs between devices in `events`: a span that starts on a device idle since
/// another device's work ended, measured from that end (the producer's last work, then its
/// semaphore signal) to this start (the consumer's first work). For a zero-copy boundary
/// this is the whole cost of the crossing.
///
/// `calls` are the windows (submission to return) of calls made one after another, in
/// order: a handoff counts only when both ends lie in one call (by their starts), so the
/// gap from one call's last kernel to the next call's first, on another device, which
/// holds the host's wait, the outputs' read-back and the next submission, is not taken for
/// a crossing. Empty: every event is taken as one call's.
pub fn handoffs(events: &[TraceEvent], calls: &[(Instant, Instant)]) -> Vec<Handoff> {
    let call_of = |t: Instant| -> Option<usize> {
        if calls.is_empty() {
            return Some(0);
        }
        calls
            .partition_point(|(start, _)| *start <= t)
            .checked_sub(1)
    };
    let mut sorted: Vec<&TraceEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.start);
    // Per device: when its work so far ended, and the call of the span that ended last.
    let mut last_end: BTreeMap<&str, (Instant, Option<usize>)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in sorted {
        let d = device_of(&e.queue);
        let call = call_of(e.start);
        let other = last_end
            .iter()
            .filter(|(k, (t, _))| **k != d && *t <= e.start)
            .max_by_key(|(_, (t, _))| *t)
            .map(|(k, (t, c))| (*k, *t, *c));
        if let Some((from, o, from_call)) = other {
            let idle_since = last_end.get(d).is_none_or(|(own, _)| *own <= o);
            if idle_since && call.is_some() && from_call == call {
                out.push((from.to_string(), d.to_string(), (e.start - o).as_secs_f64()));
            }
        }
        let end = last_end.entry(d).or_insert((e.end, call));
        if e.end >= end.0 {
            *end = (e.end, call);
        }
    }
    out
}

/// `n, median M us, max X us` of `secs` (not empty).
fn spread(mut secs: Vec<f64>) -> String {
    secs.sort_by(f64::total_cmp);
    format!(
        "{}, median {:.1} us, max {:.1} us",
        secs.len(),
        secs[secs.len() / 2] * 1e6,
        secs[secs.len() - 1] * 1e6
    )
}

/// `handoffs between devices: 12, median 8.1 us, max 20.3 us (cpu->vulkan: 6, median ...;
/// vulkan->cpu: ...)`, or nothing without any: the two directions take different paths
/// (a host signal the GPU's queue waits on; a GPU signal a host thread wakes for).
pub fn handoff_line(events: &[TraceEvent], calls: &[(Instant, Instant)]) -> Option<String> {
    let h = handoffs(events, calls);
    if h.is_empty() {
        return None;
    }
    let mut ways: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for (from, to, s) in &h {
        ways.entry((from, to)).or_default().push(*s);
    }
    let ways: Vec<String> = ways
        .into_iter()
        .map(|((from, to), secs)| format!("{from}->{to}: {}", spread(secs)))
        .collect();
    Some(format!(
        "handoffs between devices: {} ({})",
        spread(h.iter().map(|x| x.2).collect()),
        ways.join("; ")
    ))
}

/// A row of the table: estimated and measured seconds per call.
#[derive(Default, Clone, Copy)]
struct Row {
    kernels: usize,
    estimate: f64,
    measured: f64,
}

impl Row {
    fn add(&mut self, estimate: f64, measured: f64) {
        self.kernels += 1;
        self.estimate += estimate;
        self.measured += measured;
    }

    fn line(&self, label: &str) -> String {
        let ratio = if self.measured > 0.0 {
            format!("{:.2}", self.estimate / self.measured)
        } else {
            "-".to_string()
        };
        format!(
            "  {label:<28} {:>4} kernels  est {:>9.3} ms  meas {:>9.3} ms  est/meas {ratio}",
            self.kernels,
            self.estimate * 1e3,
            self.measured * 1e3
        )
    }
}

/// The estimate-vs-measured table of `program` placed for `target`, with the symbols at
/// `values` (the inputs' dims): each kernel's estimate against its median time over the
/// traced `calls` (windows from submission to return) in `events`, and the whole call's
/// estimate against `call_s` (bench: its median untraced call, as a traced call runs
/// slower than users' calls do). Medians on both sides, as the calibration rates its
/// probes: the estimate is of a typical call.
pub fn estimate_table(
    program: &Program,
    target: &Target,
    values: &HashMap<Symbol, i64>,
    events: &[TraceEvent],
    calls: &[(Instant, Instant)],
    call_s: f64,
) -> Vec<String> {
    // The stored profiles, whatever the target (a single-device target compiles without
    // reading them, but its estimate needs them).
    let mut placement = target.placement().clone();
    match rafter_compiler::load_profiles() {
        Ok(p) => placement.profiles = p,
        Err(e) => eprintln!("estimate: {e}; using the built-in profiles"),
    }
    let target = target.clone().with_placement(placement);
    let m = partition::model_at(program, &target, values);
    let placement: Vec<usize> = program
        .kernels
        .iter()
        .map(|k| {
            m.devices()
                .iter()
                .position(|d| d.name == k.device)
                .unwrap_or(0)
        })
        .collect();
    let whole = m.evaluate(&placement);
    let measured = median_by_kernel(events, calls);
    let mut by_class: BTreeMap<String, Row> = BTreeMap::new();
    let mut by_device: BTreeMap<String, Row> = BTreeMap::new();
    let mut partitions: Vec<(String, Row)> = Vec::new();
    let mut kernels: Vec<KernelRow> = Vec::new();
    for (k, kernel) in program.kernels.iter().enumerate() {
        let d = placement[k];
        let work = cost::kernel_work(kernel, values);
        let est =
            m.times[k][d].unwrap_or_else(|| cost::kernel_time(&work, &m.devices()[d].profile));
        let meas = measured.get(&kernel.name).copied().unwrap_or(0.0);
        let class = work
            .detail
            .unwrap_or_else(|| partition::device::class_name(work.class));
        let device = &m.devices()[d].name;
        kernels.push(KernelRow {
            name: format!("{} ({device} {class})", kernel.name),
            estimate: est,
            measured: meas,
            flops: work.flops,
            bytes: work.bytes,
        });
        by_class
            .entry(format!("{device} {class}"))
            .or_default()
            .add(est, meas);
        by_device.entry(device.clone()).or_default().add(est, meas);
        match partitions.last_mut() {
            Some((dev, row)) if dev == device => row.add(est, meas),
            _ => {
                let mut row = Row::default();
                row.add(est, meas);
                partitions.push((device.clone(), row));
            }
        }
    }
    let mut lines = vec![format!(
        "estimate: call est {:.3} ms, measured {:.3} ms, est/meas {:.2}",
        whole.makespan_s * 1e3,
        call_s * 1e3,
        whole.makespan_s / call_s.max(1e-12)
    )];
    lines.push(" by class (kernel time, dispatch included):".into());
    lines.extend(by_class.iter().map(|(c, r)| r.line(c)));
    lines.push(" by device:".into());
    lines.extend(by_device.iter().map(|(d, r)| r.line(d)));
    if partitions.len() > 1 {
        lines.push(" by partition (runs of consecutive kernels on one device):".into());
        lines.extend(
            partitions
                .iter()
                .enumerate()
                .map(|(i, (d, r))| r.line(&format!("p{i} {d}"))),
        );
    }
    lines.extend(worst_kernels(kernels, listed_kernels()));
    lines
}

/// How many kernels [`estimate_table`] lists by error, unless [`LISTED_KERNELS_ENV`] says.
const WORST_KERNELS: usize = 8;

/// Set to a number to list that many kernels by error (`RAFTER_ESTIMATE_KERNELS=1000`:
/// every kernel, to set a whole model's kernels against their probes).
pub const LISTED_KERNELS_ENV: &str = "RAFTER_ESTIMATE_KERNELS";

/// [`WORST_KERNELS`], or the count [`LISTED_KERNELS_ENV`] gives (one that is not a count
/// is said, as a profile that does not load is, and the default kept).
fn listed_kernels() -> usize {
    let value = std::env::var(LISTED_KERNELS_ENV).ok();
    listed_kernels_from(value.as_deref()).unwrap_or_else(|e| {
        eprintln!("estimate: {e}; listing {WORST_KERNELS}");
        WORST_KERNELS
    })
}

/// The count of kernels to list for the variable's `value` (unset: [`WORST_KERNELS`]).
fn listed_kernels_from(value: Option<&str>) -> Result<usize, String> {
    match value {
        None => Ok(WORST_KERNELS),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{LISTED_KERNELS_ENV}=`{v}` is not a count of kernels")),
    }
}

/// One kernel's estimate against its measured time, with the work the estimate rests on.
struct KernelRow {
    name: String,
    estimate: f64,
    measured: f64,
    flops: f64,
    bytes: f64,
}

/// The `n` kernels whose estimates miss by the most time (the ones a calibration should
/// look at first), largest first; nothing without a measured kernel.
fn worst_kernels(mut rows: Vec<KernelRow>, n: usize) -> Vec<String> {
    rows.retain(|r| r.measured > 0.0);
    if rows.is_empty() {
        return Vec::new();
    }
    rows.sort_by(|a, b| {
        let miss = |r: &KernelRow| (r.estimate - r.measured).abs();
        miss(b).total_cmp(&miss(a))
    });
    let mut lines = vec![format!(
        " kernels missed by the most time (of {}):",
        rows.len()
    )];
    lines.extend(rows.iter().take(n).map(|r| {
        format!(
            "  {:<44} est {:>8.3} ms  meas {:>8.3} ms  est/meas {:.2}  {:.3} GFLOP {:.2} MB",
            r.name,
            r.estimate * 1e3,
            r.measured * 1e3,
            r.estimate / r.measured,
            r.flops * 1e-9,
            r.bytes * 1e-6
        )
    }));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn event(queue: &str, name: &str, at: Instant, from_ms: u64, to_ms: u64) -> TraceEvent {
        TraceEvent {
            queue: Arc::from(queue),
            kind: TraceKind::Dispatch,
            executable: Arc::from(""),
            name: Arc::from(name),
            start: at + Duration::from_millis(from_ms),
            end: at + Duration::from_millis(to_ms),
            thread: Arc::from("t"),
            workgroups: 1,
            failed: false,
        }
    }

    #[test]
    fn the_listed_kernel_count_comes_from_the_variable_or_says_why_not() {
        assert_eq!(listed_kernels_from(None), Ok(8));
        assert_eq!(listed_kernels_from(Some("1000")), Ok(1000));
        assert_eq!(
            listed_kernels_from(Some("all")),
            Err("RAFTER_ESTIMATE_KERNELS=`all` is not a count of kernels".into())
        );
        assert!(listed_kernels_from(Some("-3")).is_err());
    }

    #[test]
    fn the_worst_kernels_are_those_missed_by_the_most_time() {
        let row = |name: &str, estimate: f64, measured: f64| KernelRow {
            name: name.into(),
            estimate,
            measured,
            flops: 2e9,
            bytes: 4e6,
        };
        let rows = vec![
            row("a", 1e-3, 1.1e-3),
            row("b", 1e-3, 3e-3),
            row("c", 5e-3, 1e-3),
            row("unmeasured", 9.0, 0.0),
        ];
        let lines = worst_kernels(rows, 2);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("(of 3)"), "{}", lines[0]);
        assert!(lines[1].trim_start().starts_with("c "), "{}", lines[1]);
        assert!(
            lines[1].contains("est/meas 5.00  2.000 GFLOP 4.00 MB"),
            "{}",
            lines[1]
        );
        assert!(lines[2].trim_start().starts_with("b "), "{}", lines[2]);
        assert!(worst_kernels(vec![row("u", 1.0, 0.0)], 2).is_empty());
    }

    #[test]
    fn a_kernel_on_several_threads_counts_its_wall_time_once() {
        let t = Instant::now();
        let events = [
            event("cpu:0", "k0", t, 0, 4),
            event("cpu:0", "k0", t, 1, 5),
            event("cpu:0", "k0", t, 10, 12),
            event("cpu:0", "k1", t, 5, 6),
        ];
        let ms = Duration::from_millis;
        let m = median_by_kernel(&events, &[(t, t + ms(8)), (t + ms(8), t + ms(16))]);
        // [0, 4] and [1, 5] overlap: 5 ms in the first call, then 2 ms: median 3.5.
        assert!((m["k0"] - 0.0035).abs() < 1e-9, "{:?}", m);
        assert!((m["k1"] - 0.001).abs() < 1e-9);
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&xs, 0.5), 3.0);
        assert!((quantile(&xs, 0.1) - 1.4).abs() < 1e-12);
        assert!((quantile(&xs, 0.9) - 4.6).abs() < 1e-12);
        assert_eq!(quantile(&[7.0], 0.9), 7.0);
    }

    #[test]
    fn a_kernels_measured_time_is_its_median_over_the_calls() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Three calls of 10 ms windows: k0 takes 2, 9 (a disturbed call) and 3 ms, the
        // last split over two threads ([20, 22] and [21, 23]); k1 runs in the first only.
        let events = [
            event("cpu:0", "k0", t, 0, 2),
            event("cpu:0", "k1", t, 2, 3),
            event("cpu:0", "k0", t, 10, 19),
            event("cpu:0", "k0", t, 20, 22),
            event("cpu:1", "k0", t, 21, 23),
        ];
        let calls = [
            (t, t + ms(10)),
            (t + ms(10), t + ms(20)),
            (t + ms(20), t + ms(30)),
        ];
        let m = median_by_kernel(&events, &calls);
        assert!((m["k0"] - 0.003).abs() < 1e-9, "{m:?}");
        assert!((m["k1"] - 0.001).abs() < 1e-9, "{m:?}");
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![5.0]), 5.0);
    }

    #[test]
    fn idle_is_the_share_of_the_window_a_device_did_nothing() {
        let t = Instant::now();
        let events = [
            event("cpu:0", "a", t, 0, 6),
            event("vulkan:0", "b", t, 2, 10),
            event("cpu:0", "c", t, 8, 10),
        ];
        let (window, busy) = device_busy(&events);
        assert!((window - 0.010).abs() < 1e-9);
        assert!((busy["cpu"] - 0.008).abs() < 1e-9);
        assert!((busy["vulkan"] - 0.008).abs() < 1e-9);
        let lines = device_lines(&events);
        assert_eq!(
            lines[0],
            "device cpu: busy 8.000 ms of 10.000 ms in flight (idle 20.0%)"
        );
    }

    #[test]
    fn a_handoff_runs_from_the_producers_end_to_the_consumers_start() {
        let t = Instant::now();
        // cpu 0-4 ms, vulkan waits and starts at 5, runs twice; cpu resumes at 9 ms (after
        // vulkan's 8): two handoffs, 1 ms each; vulkan's second span follows its own.
        let events = [
            event("cpu:0", "a", t, 0, 4),
            event("vulkan:0", "b", t, 5, 6),
            event("vulkan:0", "c", t, 6, 8),
            event("cpu:0", "d", t, 9, 10),
        ];
        let h = handoffs(&events, &[]);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h.iter().all(|x| (x.2 - 0.001).abs() < 1e-9), "{h:?}");
        assert_eq!((h[0].0.as_str(), h[0].1.as_str()), ("cpu", "vulkan"));
        assert_eq!((h[1].0.as_str(), h[1].1.as_str()), ("vulkan", "cpu"));
        assert_eq!(
            handoff_line(&events, &[]).unwrap(),
            "handoffs between devices: 2, median 1000.0 us, max 1000.0 us \
             (cpu->vulkan: 1, median 1000.0 us, max 1000.0 us; \
             vulkan->cpu: 1, median 1000.0 us, max 1000.0 us)"
        );
    }

    #[test]
    fn the_gap_between_two_calls_is_not_a_handoff() {
        let t = Instant::now();
        let ms = |m: u64| t + Duration::from_millis(m);
        // Two calls, each cpu (mask) -> vulkan: the second call's cpu span starts 2 ms
        // after the first call's vulkan span ended, on another device, but that gap is the
        // host's turnaround between calls, not a crossing.
        let events = [
            event("cpu:0", "a", t, 0, 1),
            event("vulkan:0", "b", t, 2, 4),
            event("cpu:0", "a", t, 6, 7),
            event("vulkan:0", "b", t, 8, 10),
        ];
        let calls = [(ms(0), ms(5)), (ms(5), ms(11))];
        let h = handoffs(&events, &calls);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h.iter().all(|x| x.0 == "cpu" && x.1 == "vulkan"), "{h:?}");
        assert!(h.iter().all(|x| (x.2 - 0.001).abs() < 1e-9), "{h:?}");
        // Without the calls' windows the gap counts, as a 2 ms vulkan -> cpu handoff.
        let all = handoffs(&events, &[]);
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all
            .iter()
            .any(|x| x.0 == "vulkan" && (x.2 - 0.002).abs() < 1e-9));
    }
}
