//! Calls spread over devices: a stream of whole calls shared by one session per device
//! (the model compiled for each device alone), for `rafter bench --device auto
//! --objective throughput --in-flight N`.
//!
//! Why whole calls: splitting one call across devices makes every call wait on crossings;
//! for throughput it is simpler and faster to keep every device busy with calls of its
//! own. Each device gets a thread keeping up to N of its calls in flight; the threads
//! take the next call number from one shared counter, so a faster device takes more
//! calls, in proportion to its speed.
//!
//! A device much slower than the others must not take a call the others would have
//! finished sooner: one 1.4 s CPU call of BERT-base f16 outlasts 200 calls on an H200
//! (0.64 s), and the stream would wait for it. So a device takes the next call only while
//! the calls left would keep the other devices busy at least as long as that call would
//! take on it ([`admit`]), with each device's time per call measured by its warm-up calls
//! (the rates come from measurements, never from a rule about which device is faster).
//! Every call's outputs are
//! checked against the first device's outputs for the same inputs, so a spread stream
//! cannot silently compute something else than the single-device run.

use anyhow::{bail, Result};
use rafter_runtime::{Session, Tensor};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest one call may take before it is reported as hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// One device's share of a spread stream.
pub struct DeviceShare {
    /// The device's name (`cpu`, `vulkan`).
    pub device: String,
    /// Calls it ran.
    pub calls: usize,
    /// Seconds of the stream during which it had no call in flight.
    pub idle_s: f64,
    /// Latencies (ms) of its calls, submission to outputs.
    pub latencies_ms: Vec<f64>,
}

/// A spread stream's outcome.
pub struct Spread {
    /// Wall time of the whole stream (s).
    pub wall_s: f64,
    /// Per device, in the order given.
    pub shares: Vec<DeviceShare>,
}

impl Spread {
    /// `spread: N calls, K in flight per device, T calls/s` then one line per device:
    /// `spread device D: C calls (P%), idle I% of the stream, latency median M ms`.
    pub fn lines(&self, in_flight: usize) -> Vec<String> {
        let total: usize = self.shares.iter().map(|s| s.calls).sum();
        let mut lines = vec![format!(
            "spread: {total} calls, {in_flight} in flight per device, {:.2} calls/s",
            total as f64 / self.wall_s.max(1e-12)
        )];
        for s in &self.shares {
            let mut xs = s.latencies_ms.clone();
            xs.sort_by(f64::total_cmp);
            let median = if xs.is_empty() { 0.0 } else { xs[xs.len() / 2] };
            lines.push(format!(
                "spread device {}: {} calls ({:.0}%), idle {:.1}% of the stream, latency median {:.3} ms",
                s.device,
                s.calls,
                100.0 * s.calls as f64 / total.max(1) as f64,
                100.0 * s.idle_s / self.wall_s.max(1e-12),
                median
            ));
        }
        lines
    }
}

/// Runs `calls` calls of `inputs` spread over `sessions` (name, session), each device
/// keeping up to `in_flight` of its calls in flight. `call_s[i]` is device `i`'s time for
/// one call alone (its warm-up), which [`admit`] weighs. `reference` is the outputs of one
/// call on the first device; every call's outputs must be within `tolerance` (absolute,
/// scaled by the reference's largest magnitude) of it.
pub fn run_spread(
    sessions: &[(String, Session)],
    call_s: &[f64],
    inputs: &[Tensor],
    calls: usize,
    in_flight: usize,
    reference: &[Tensor],
    tolerance: f64,
) -> Result<Spread> {
    if sessions.is_empty() || in_flight == 0 {
        bail!("a spread stream needs a device and at least one call in flight");
    }
    if call_s.len() != sessions.len() {
        bail!(
            "internal error: {} call times for {} devices",
            call_s.len(),
            sessions.len()
        );
    }
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<Result<DeviceShare>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, (device, session))| {
                let next = &next;
                let pace = Pace {
                    call_s: call_s[i],
                    others_per_s: others_rate(call_s, i),
                };
                let check = move |i: usize, out: &[Tensor]| {
                    check_outputs(device, i, out, reference, tolerance)
                };
                scope.spawn(move || {
                    device_stream(
                        device, session, inputs, calls, in_flight, next, start, pace, &check,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a device's stream thread panicked"))
            })
            .collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let mut shares = results.into_iter().collect::<Result<Vec<_>>>()?;
    for s in &mut shares {
        // A device whose last call ended before the stream did was idle till the end.
        s.idle_s = s.idle_s.min(wall_s);
    }
    Ok(Spread { wall_s, shares })
}

/// Seconds of calls each of [`trial`]'s runs lasts, at its devices' pace.
const TRIAL_S: f64 = 0.25;

/// What [`trial`] measured: each device's rate alone and the spread's.
pub struct Trial {
    /// Calls per second of each device alone (in the sessions' order); `None` where
    /// not run: a device whose lone call was so slow that even `in_flight` of them at once
    /// could not beat a device measured before it.
    pub alone_per_s: Vec<Option<f64>>,
    /// Calls per second spread over every device.
    pub spread_per_s: f64,
}

impl Trial {
    /// The device the stream should run on alone, or `None` to spread: whichever the
    /// trial measured fastest.
    pub fn choice(&self) -> Option<usize> {
        let (best, rate) = self
            .alone_per_s
            .iter()
            .enumerate()
            .filter_map(|(d, r)| r.map(|r| (d, r)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        (rate > self.spread_per_s).then_some(best)
    }

    /// `spread trial: every device X calls/s, cpu alone Y calls/s, vulkan alone Z
    /// calls/s: spread` (or `: vulkan alone`).
    pub fn line(&self, names: &[&str]) -> String {
        let mut s = format!(
            "spread trial: every device {:.2} calls/s",
            self.spread_per_s
        );
        for (name, rate) in names.iter().zip(&self.alone_per_s) {
            match rate {
                Some(r) => s.push_str(&format!(", {name} alone {r:.2} calls/s")),
                None => s.push_str(&format!(", {name} alone not run (too slow)")),
            }
        }
        match self.choice() {
            Some(d) => s.push_str(&format!(": {} alone", names[d])),
            None => s.push_str(": spread"),
        }
        s
    }
}

/// Short streams on each device alone, then spread over every device: whether
/// spreading pays, and on which device a stream should otherwise run, is measured, not
/// assumed. The devices share the host: a CPU running calls slows an accelerator's host
/// threads (submissions, its monitor) and the CPU kernels of its own program, which the
/// warm-up's lone calls do not show; and a lone call's time ranks devices wrongly where
/// calls in flight overlap on one (a GPU) and not on the other. On the H200 machine a
/// spread of BERT-base f16 (the CPU at 6% of the GPU's rate) ran at 467 calls/s against
/// the GPU's 572 alone, and a model with CPU-only kernels in the GPU's program at 860
/// against 1,451. Each run lasts about [`TRIAL_S`] (at least two windows of `in_flight`
/// calls, at most `max_calls`), its calls' outputs checked as the stream's are. Devices
/// run alone in the order of their lone calls' times, and one whose `in_flight` calls
/// could not beat the best rate measured even if they overlapped entirely is not run
/// (lavapipe, seconds a call, next to a CPU).
pub fn trial(
    sessions: &[(String, Session)],
    call_s: &[f64],
    inputs: &[Tensor],
    in_flight: usize,
    reference: &[Tensor],
    tolerance: f64,
    max_calls: usize,
) -> Result<Trial> {
    let calls_for = |s: f64| {
        ((TRIAL_S / s.max(1e-6)).ceil() as usize)
            .max(2 * in_flight)
            .min(max_calls.max(1))
    };
    let rate = |calls: usize, s: &Spread| calls as f64 / s.wall_s.max(1e-12);
    let mut order: Vec<usize> = (0..sessions.len()).collect();
    order.sort_by(|&a, &b| call_s[a].total_cmp(&call_s[b]));
    let mut alone_per_s = vec![None; sessions.len()];
    let mut best = 0.0f64;
    for d in order {
        if in_flight as f64 / call_s[d].max(1e-9) < best {
            continue;
        }
        let calls = calls_for(call_s[d]);
        let one = run_spread(
            &sessions[d..=d],
            &call_s[d..=d],
            inputs,
            calls,
            in_flight,
            reference,
            tolerance,
        )?;
        let r = rate(calls, &one);
        best = best.max(r);
        alone_per_s[d] = Some(r);
    }
    let fastest = call_s.iter().copied().fold(f64::INFINITY, f64::min);
    let calls = calls_for(fastest);
    let all = run_spread(
        sessions, call_s, inputs, calls, in_flight, reference, tolerance,
    )?;
    Ok(Trial {
        alone_per_s,
        spread_per_s: rate(calls, &all),
    })
}

/// One device's pace against the others': what [`admit`] weighs.
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// Seconds this device takes for one call alone.
    call_s: f64,
    /// Calls per second the other devices complete together (0: no other device).
    others_per_s: f64,
}

/// Calls per second of every device but `me`, each at one call per `call_s`.
fn others_rate(call_s: &[f64], me: usize) -> f64 {
    call_s
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != me)
        .map(|(_, &s)| 1.0 / s.max(1e-9))
        .sum()
}

/// Whether a device with `queued` calls of its own in flight takes one more, with `left`
/// calls not yet taken (this one included): only if the other devices would stay busy
/// with the calls left at least as long as this call would take here (its queue first).
/// Alone, a device takes every call.
fn admit(pace: Pace, queued: usize, left: usize) -> bool {
    if pace.others_per_s <= 0.0 {
        return true;
    }
    let others_busy_s = left as f64 / pace.others_per_s;
    let mine_s = (queued + 1) as f64 * pace.call_s;
    mine_s <= others_busy_s
}

/// Takes the next call number from `next` if calls are left and [`admit`] agrees;
/// `Err(true)` when none are left, `Err(false)` when this device should not take one now.
fn take(next: &AtomicUsize, calls: usize, pace: Pace, queued: usize) -> Result<usize, bool> {
    let mut n = next.load(Ordering::Relaxed);
    loop {
        if n >= calls {
            return Err(true);
        }
        if !admit(pace, queued, calls - n) {
            return Err(false);
        }
        match next.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(n),
            Err(now) => n = now,
        }
    }
}

/// One device's thread: takes call numbers from `next` until `calls` are taken (or
/// [`admit`] says the others will finish the rest sooner), keeping up to `in_flight`
/// submitted, and checks each call's outputs with `check` (its number on this device,
/// its outputs) as it ends: kept for a check at the end, every call's outputs stayed
/// alive through the stream (79 MB for 200 BERT-base calls).
#[allow(clippy::too_many_arguments)]
fn device_stream(
    device: &str,
    session: &Session,
    inputs: &[Tensor],
    calls: usize,
    in_flight: usize,
    next: &AtomicUsize,
    start: Instant,
    pace: Pace,
    check: &dyn Fn(usize, &[Tensor]) -> Result<()>,
) -> Result<DeviceShare> {
    let mut window = VecDeque::with_capacity(in_flight);
    let mut latencies_ms = Vec::new();
    // Idle time: gaps with nothing of this device's in flight.
    let mut idle_s = 0.0;
    let mut idle_since = Some(start);
    loop {
        while window.len() < in_flight && take(next, calls, pace, window.len()).is_ok() {
            let at = Instant::now();
            if let Some(since) = idle_since.take() {
                idle_s += (at - since).as_secs_f64();
            }
            window.push_back((at, session.submit(inputs.to_vec())?));
        }
        let Some((at, call)) = window.pop_front() else {
            break;
        };
        let outputs = call.wait(CALL_TIMEOUT)?;
        let done = Instant::now();
        latencies_ms.push((done - at).as_secs_f64() * 1e3);
        // The next calls go to the device before this one's outputs are checked: the check
        // (a pass over every output) then overlaps the device's work instead of delaying
        // it. Checked first, midgraph's 0.8 MB output held its GPU stream on the H200 at
        // ~1,000 calls/s where the same session alone streamed ~1,400.
        while window.len() < in_flight && take(next, calls, pace, window.len()).is_ok() {
            window.push_back((Instant::now(), session.submit(inputs.to_vec())?));
        }
        if window.is_empty() {
            idle_since = Some(done);
        }
        check(latencies_ms.len() - 1, &outputs)?;
    }
    if let Some(since) = idle_since {
        // Idle from its last call (or the start) to the stream's end, measured later by
        // the caller's wall clock: count up to now.
        idle_s += since.elapsed().as_secs_f64();
    }
    let share = DeviceShare {
        device: device.to_string(),
        calls: latencies_ms.len(),
        idle_s,
        latencies_ms,
    };
    Ok(share)
}

/// Whether `got` (call `i` on `device`) is within `tolerance` of `want`, scaled by the
/// largest magnitude of each output of `want`.
fn check_outputs(
    device: &str,
    i: usize,
    got: &[Tensor],
    want: &[Tensor],
    tolerance: f64,
) -> Result<()> {
    if got.len() != want.len() {
        bail!(
            "spread call {i} on {device}: {} outputs, the single-device run has {}",
            got.len(),
            want.len()
        );
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if g.shape() != w.shape() {
            bail!(
                "spread call {i} on {device}: output {k} has shape {:?}, the single-device run {:?}",
                g.shape(),
                w.shape()
            );
        }
        let (scale, diff) = scale_and_diff(g, w);
        let scale = scale.max(1e-30);
        if diff.is_nan() || diff > tolerance * scale {
            bail!(
                "spread call {i} on {device}: output {k} differs from the single-device run by \
                 {diff:e} (largest magnitude {scale:e}, tolerance {tolerance})"
            );
        }
    }
    Ok(())
}

/// The largest magnitude of `want` and the largest difference between `got` and `want`
/// (same shape). f32 outputs, the usual case, are compared in place: converting both to
/// `f64` vectors allocated ~3 MB a call for a 0.8 MB output, on the thread that keeps the
/// device's calls in flight. A NaN difference comes out NaN.
fn scale_and_diff(got: &Tensor, want: &Tensor) -> (f64, f64) {
    let fold = |pairs: &mut dyn Iterator<Item = (f64, f64)>| {
        pairs.fold((0.0f64, 0.0f64), |(scale, diff), (g, w)| {
            let d = (g - w).abs();
            // `max` would drop a NaN: keep it.
            let diff = if d.is_nan() || diff.is_nan() {
                f64::NAN
            } else {
                diff.max(d)
            };
            (scale.max(w.abs()), diff)
        })
    };
    match (got.as_slice::<f32>(), want.as_slice::<f32>()) {
        (Ok(g), Ok(w)) => fold(&mut g.iter().zip(w).map(|(&g, &w)| (g as f64, w as f64))),
        _ => {
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            fold(&mut g.into_iter().zip(w))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_keeps_whatever_ran_fastest() {
        let t = |alone: Vec<f64>, spread: f64| Trial {
            alone_per_s: alone.into_iter().map(Some).collect(),
            spread_per_s: spread,
        };
        assert_eq!(t(vec![540.0, 1880.0], 2300.0).choice(), None);
        // The spread slower than the GPU alone (BERT-base f16 on the H200 machine).
        assert_eq!(t(vec![37.0, 570.0], 467.0).choice(), Some(1));
        // The device fastest alone, not the one whose lone call was quickest.
        assert_eq!(t(vec![466.0, 1520.0], 860.0).choice(), Some(1));
        let names = ["cpu", "vulkan"];
        assert_eq!(
            t(vec![37.0, 570.0], 467.0).line(&names),
            "spread trial: every device 467.00 calls/s, cpu alone 37.00 calls/s, vulkan alone \
             570.00 calls/s: vulkan alone"
        );
        // A device not run alone is never chosen alone.
        let skipped = Trial {
            alone_per_s: vec![Some(100.0), None],
            spread_per_s: 90.0,
        };
        assert_eq!(skipped.choice(), Some(0));
        assert!(skipped
            .line(&names)
            .contains("vulkan alone not run (too slow)"));
    }

    #[test]
    fn outputs_check_catches_a_difference() {
        let want = vec![Tensor::f32s(&[3], vec![1.0, -2.0, 4.0])];
        let close = vec![Tensor::f32s(&[3], vec![1.0, -2.0, 4.0001])];
        let far = vec![Tensor::f32s(&[3], vec![1.0, -2.5, 4.0])];
        assert!(check_outputs("cpu", 0, &close, &want, 1e-3).is_ok());
        let e = check_outputs("vulkan", 7, &far, &want, 1e-3).unwrap_err();
        assert!(e.to_string().contains("spread call 7 on vulkan"), "{e}");
        let shape = vec![Tensor::f32s(&[1, 3], vec![1.0, -2.0, 4.0])];
        assert!(check_outputs("cpu", 0, &shape, &want, 1e-3).is_err());
        // A NaN anywhere fails, first or last.
        for nan in [vec![f32::NAN, -2.0, 4.0], vec![1.0, -2.0, f32::NAN]] {
            let got = vec![Tensor::f32s(&[3], nan)];
            assert!(check_outputs("cpu", 0, &got, &want, 1e-3).is_err());
        }
        // Other dtypes take the f64 path: the scale is the reference's largest magnitude.
        let want = vec![Tensor::i64s(&[2], vec![100, -3])];
        let near = vec![Tensor::i64s(&[2], vec![100, -3])];
        let off = vec![Tensor::i64s(&[2], vec![100, 0])];
        assert!(check_outputs("cpu", 0, &near, &want, 1e-3).is_ok());
        assert!(check_outputs("cpu", 0, &off, &want, 1e-3).is_err());
        assert_eq!(
            scale_and_diff(&off[0], &want[0]),
            (100.0, 3.0),
            "scale and difference"
        );
    }

    #[test]
    fn lines_give_each_device_its_share() {
        let s = Spread {
            wall_s: 2.0,
            shares: vec![
                DeviceShare {
                    device: "cpu".into(),
                    calls: 10,
                    idle_s: 0.5,
                    latencies_ms: vec![3.0, 1.0, 2.0],
                },
                DeviceShare {
                    device: "vulkan".into(),
                    calls: 30,
                    idle_s: 0.0,
                    latencies_ms: vec![1.0],
                },
            ],
        };
        let l = s.lines(2);
        assert_eq!(
            l[0],
            "spread: 40 calls, 2 in flight per device, 20.00 calls/s"
        );
        assert_eq!(
            l[1],
            "spread device cpu: 10 calls (25%), idle 25.0% of the stream, latency median 2.000 ms"
        );
        assert!(l[2].starts_with("spread device vulkan: 30 calls (75%), idle 0.0%"));
    }

    #[test]
    fn a_device_alone_takes_every_call() {
        let pace = Pace {
            call_s: 10.0,
            others_per_s: others_rate(&[10.0], 0),
        };
        assert!(admit(pace, 100, 1));
    }

    #[test]
    fn a_slow_device_leaves_a_short_stream_to_the_fast_one() {
        // BERT-base f16 measured on an H200 machine: 1.44 s a call on the CPU, 3.9 ms on
        // the GPU. 200 calls keep the GPU busy ~0.8 s: the CPU must take none of them.
        let times = [1.44, 0.0039];
        let cpu = Pace {
            call_s: times[0],
            others_per_s: others_rate(&times, 0),
        };
        let gpu = Pace {
            call_s: times[1],
            others_per_s: others_rate(&times, 1),
        };
        assert!(!admit(cpu, 0, 200));
        assert!(admit(gpu, 3, 200));
        // A stream long enough to keep the GPU busy for longer than a CPU call: the CPU
        // helps, and stops once the calls left would end sooner on the GPU.
        assert!(admit(cpu, 0, 2000));
        assert!(!admit(cpu, 0, 300));
    }

    #[test]
    fn take_stops_at_the_last_call_and_when_not_admitted() {
        let next = AtomicUsize::new(0);
        let fast = Pace {
            call_s: 0.001,
            others_per_s: 0.0,
        };
        assert_eq!(take(&next, 2, fast, 0), Ok(0));
        assert_eq!(take(&next, 2, fast, 0), Ok(1));
        assert_eq!(take(&next, 2, fast, 0), Err(true));
        let slow = Pace {
            call_s: 1.0,
            others_per_s: 1000.0,
        };
        let next = AtomicUsize::new(0);
        assert_eq!(take(&next, 10, slow, 0), Err(false));
        assert_eq!(
            next.load(Ordering::Relaxed),
            0,
            "a refused call stays for the others"
        );
    }
}
