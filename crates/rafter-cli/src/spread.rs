//! Calls spread over devices: a stream of whole calls shared by one session per device
//! (the model compiled for each device alone), for `rafter bench --device auto
//! --objective throughput --in-flight N`.
//!
//! Why whole calls: splitting one call across devices makes every call wait on crossings;
//! for throughput it is simpler and faster to keep every device busy with calls of its
//! own. Each device gets a thread keeping up to N of its calls in flight; the threads
//! take the next call number from one shared counter, so a faster device takes more
//! calls, in proportion to its speed, with no estimate needed. Every call's outputs are
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
/// keeping up to `in_flight` of its calls in flight. `reference` is the outputs of one
/// call on the first device; every call's outputs must be within `tolerance` (absolute,
/// scaled by the reference's largest magnitude) of it.
pub fn run_spread(
    sessions: &[(String, Session)],
    inputs: &[Tensor],
    calls: usize,
    in_flight: usize,
    reference: &[Tensor],
    tolerance: f64,
) -> Result<Spread> {
    if sessions.is_empty() || in_flight == 0 {
        bail!("a spread stream needs a device and at least one call in flight");
    }
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<Result<DeviceShare>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .iter()
            .map(|(device, session)| {
                let next = &next;
                scope.spawn(move || {
                    device_stream(device, session, inputs, calls, in_flight, next, start).and_then(
                        |(share, outputs)| {
                            for (i, out) in outputs.iter().enumerate() {
                                check_outputs(device, i, out, reference, tolerance)?;
                            }
                            Ok(share)
                        },
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

/// One device's thread: takes call numbers from `next` until `calls` are taken, keeping
/// up to `in_flight` submitted; returns its share and its calls' outputs.
fn device_stream(
    device: &str,
    session: &Session,
    inputs: &[Tensor],
    calls: usize,
    in_flight: usize,
    next: &AtomicUsize,
    start: Instant,
) -> Result<(DeviceShare, Vec<Vec<Tensor>>)> {
    let mut window = VecDeque::with_capacity(in_flight);
    let mut latencies_ms = Vec::new();
    let mut outputs = Vec::new();
    // Idle time: gaps with nothing of this device's in flight.
    let mut idle_s = 0.0;
    let mut idle_since = Some(start);
    loop {
        while window.len() < in_flight && next.fetch_add(1, Ordering::Relaxed) < calls {
            let at = Instant::now();
            if let Some(since) = idle_since.take() {
                idle_s += (at - since).as_secs_f64();
            }
            window.push_back((at, session.submit(inputs.to_vec())?));
        }
        let Some((at, call)) = window.pop_front() else {
            break;
        };
        outputs.push(call.wait(CALL_TIMEOUT)?);
        let done = Instant::now();
        latencies_ms.push((done - at).as_secs_f64() * 1e3);
        if window.is_empty() {
            idle_since = Some(done);
        }
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
    Ok((share, outputs))
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
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
        let diff = g
            .iter()
            .zip(&w)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        if diff.is_nan() || diff > tolerance * scale {
            bail!(
                "spread call {i} on {device}: output {k} differs from the single-device run by \
                 {diff:e} (largest magnitude {scale:e}, tolerance {tolerance})"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
