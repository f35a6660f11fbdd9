//! How fast the host reads a working set by its size: the measurement behind a CPU
//! profile's [`WeightCache`] (`rafter devices --profile`).
//!
//! Every worker thread (one per core, as the CPU device runs its kernels) sums its share
//! of a buffer over and over, for working sets from [`SIZES_MIB`]'s smallest to its
//! largest; the bandwidth steps down where the working set outgrows the last-level cache
//! (on the 2-core dev machine from 40-45 GB/s up to 64 MiB to 24-29 at 96-128 MiB and 18
//! from 256 MiB on). The cost model reads the curve at a program's weight footprint.

use std::time::Instant;

use rafter_opt::partition::device::{ReadPoint, WeightCache};

use crate::estimate::median;

/// Working-set sizes swept, MiB: from above a core's L2 to beyond any last-level cache
/// a host of today has in one socket, in steps of 1.5x or less.
const SIZES_MIB: [usize; 15] = [
    8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
];

/// Bytes each timed round reads at least (a small working set is read several times).
const ROUND_BYTES: usize = 256 << 20;

/// Rounds timed per size; each size's bandwidth is their median.
const ROUNDS: usize = 3;

/// How much faster than memory a working set must read to count as cached: below it the
/// step is noise (on a shared host memory bandwidth alone varies by 10%).
const CACHE_SPEEDUP: f64 = 1.25;

/// One size's measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepPoint {
    /// Working-set bytes.
    pub bytes: f64,
    /// Bytes read per second.
    pub bytes_per_s: f64,
}

/// Measures the host's read bandwidth at every working set of [`SIZES_MIB`] with
/// `threads` threads, up to a quarter of the memory available ([`sweep_limit`]: an
/// allocation Linux grants by overcommit could otherwise call the OOM killer on a small
/// host when its pages are written), and without the sizes the allocator refuses.
pub fn sweep(threads: usize) -> Vec<SweepPoint> {
    let threads = threads.max(1);
    let limit = sweep_limit(std::fs::read_to_string("/proc/meminfo").ok().as_deref());
    let Some(buffer) = SIZES_MIB
        .iter()
        .rev()
        .filter(|&&mib| mib << 20 <= limit)
        .find_map(|&mib| filled(mib << 20))
    else {
        return Vec::new();
    };
    SIZES_MIB
        .iter()
        .map(|&mib| mib << 20)
        .filter(|&bytes| bytes <= buffer.len() * 8)
        .map(|bytes| {
            let words = &buffer[..bytes / 8];
            let reps = ROUND_BYTES.div_ceil(bytes).max(2);
            let rounds: Vec<f64> = (0..ROUNDS).map(|_| round_s(words, threads, reps)).collect();
            SweepPoint {
                bytes: bytes as f64,
                bytes_per_s: (bytes * reps) as f64 / median(rounds),
            }
        })
        .collect()
}

/// The largest working set to sweep, bytes: a quarter of `MemAvailable` in `meminfo`
/// (Linux's `/proc/meminfo`), at most the largest size swept; 256 MiB when it does not say.
fn sweep_limit(meminfo: Option<&str>) -> usize {
    let largest = SIZES_MIB[SIZES_MIB.len() - 1] << 20;
    let available_kib = meminfo.and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
    });
    match available_kib {
        Some(kib) => (kib.saturating_mul(1024) / 4).min(largest),
        None => 256 << 20,
    }
}

/// A buffer of `bytes` (a whole number of words), every page written (so that reads hit
/// memory, not the shared zero page); `None` when it cannot be allocated.
fn filled(bytes: usize) -> Option<Vec<u64>> {
    let words = bytes / 8;
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(words).ok()?;
    v.extend((0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    Some(v)
}

/// Seconds for `threads` threads to read their shares of `words` `reps` times each.
fn round_s(words: &[u64], threads: usize, reps: usize) -> f64 {
    let share = words.len().div_ceil(threads);
    let start = Instant::now();
    let sum = std::thread::scope(|scope| {
        let handles: Vec<_> = words
            .chunks(share)
            .map(|part| scope.spawn(move || (0..reps).fold(0u64, |acc, _| acc ^ sum_of(part))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0u64, |a, b| a ^ b)
    });
    let s = start.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    s
}

/// The wrapping sum of `part`, in eight independent lanes (so the adds are not one chain
/// and the loop runs at the memory's speed, not the adder's latency).
fn sum_of(part: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = part.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(x);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    lanes.iter().fold(tail, |a, &l| a.wrapping_add(l))
}

/// The weight cache a sweep shows: the sweep itself, and the cache's speed, the median
/// over the working sets read at least [`CACHE_SPEEDUP`] times faster than the largest
/// (so that one noisy size does not set it). `None` when no working set reads that much
/// faster (no cache beyond the sizes swept, or a memory as fast).
pub fn weight_cache(points: &[SweepPoint]) -> Option<WeightCache> {
    let last = points.last()?;
    let fast: Vec<f64> = points
        .iter()
        .map(|p| p.bytes_per_s)
        .filter(|&b| b >= CACHE_SPEEDUP * last.bytes_per_s)
        .collect();
    if fast.is_empty() {
        return None;
    }
    Some(WeightCache {
        cache_bytes_per_s: median(fast),
        reads: points
            .iter()
            .map(|p| ReadPoint {
                bytes: p.bytes,
                bytes_per_s: p.bytes_per_s,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(bw: &[(f64, f64)]) -> Vec<SweepPoint> {
        bw.iter()
            .map(|&(mib, gbs)| SweepPoint {
                bytes: mib * 1048576.0,
                bytes_per_s: gbs * 1e9,
            })
            .collect()
    }

    /// The dev machine's sweep (2026-12-01): a step from 38 to 17 GB/s between 64 and
    /// 96 MiB.
    #[test]
    fn the_cache_speed_is_the_median_of_the_fast_sizes_and_the_sweep_is_kept() {
        let p = points(&[
            (8.0, 22.4),
            (16.0, 31.7),
            (32.0, 36.3),
            (48.0, 39.3),
            (64.0, 38.4),
            (96.0, 17.4),
            (128.0, 17.0),
            (256.0, 16.8),
            (1024.0, 16.5),
        ]);
        let c = weight_cache(&p).unwrap();
        // The median of the five sizes at 22.4-39.3 GB/s (>= 1.25 x 16.5).
        assert_eq!(c.cache_bytes_per_s, 36.3e9);
        assert_eq!(c.reads.len(), 9);
        assert_eq!(c.reads[5].bytes, 96.0 * 1048576.0);
        assert_eq!(c.reads[5].bytes_per_s, 17.4e9);
    }

    #[test]
    fn no_cache_when_no_working_set_reads_much_faster_than_memory() {
        let flat = points(&[(8.0, 20.0), (64.0, 19.0), (1024.0, 17.0)]);
        assert_eq!(weight_cache(&flat), None);
        // Still cached at the largest size swept: no memory speed seen.
        let all = points(&[(8.0, 40.0), (1024.0, 40.0)]);
        assert_eq!(weight_cache(&all), None);
        assert_eq!(weight_cache(&[]), None);
    }

    #[test]
    fn the_sweep_stays_within_a_quarter_of_the_available_memory() {
        let info = "MemTotal:       24000000 kB\nMemAvailable:    2097152 kB\n";
        assert_eq!(sweep_limit(Some(info)), 512 << 20);
        let big = "MemAvailable:   100000000 kB\n";
        assert_eq!(sweep_limit(Some(big)), 1024 << 20);
        assert_eq!(sweep_limit(Some("MemTotal: 1 kB\n")), 256 << 20);
        assert_eq!(sweep_limit(None), 256 << 20);
    }

    #[test]
    fn the_sum_counts_every_word_once() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(sum_of(&words), 231);
        assert_eq!(sum_of(&[]), 0);
    }

    /// A real round on one and on several threads takes a positive, finite time (how long
    /// is the benchmark's business, not a test's).
    #[test]
    fn a_round_reads_its_share_on_every_thread() {
        let words = filled(1 << 20).unwrap();
        for threads in [1, 3] {
            let s = round_s(&words, threads, 2);
            assert!(s.is_finite() && s > 0.0, "{s}");
        }
    }
}
