//! Choosing the next token from logits: greedy, or a seeded draw after repetition penalty,
//! top-k, top-p, min-p and temperature.
//!
//! The filters run in llama.cpp's default chain order (common/sampling, `penalties` ->
//! `top_k` -> `top_p` -> `min_p` -> `temperature` -> `dist`): top-p and min-p judge the
//! temperature-1 distribution and temperature only reshapes what survives them. (HF's
//! `generate` applies temperature before top-k/top-p; with temperature 1, or with only top-k,
//! the two orders agree.) The repetition penalty is HF's: every token seen in the prompt or
//! generated so far has a positive logit divided by the penalty and a negative one multiplied
//! by it.
//!
//! Cost per token over a 152k-262k vocabulary: one copy of the logits, one pass for top-k (a
//! k-entry heap that almost every logit fails to enter) or for min-p (a threshold against the
//! maximum), and a sort of the few survivors. Only top-p without top-k or min-p, and pure
//! temperature sampling, need the normaliser over the whole vocabulary: one vectorisable
//! `exp` pass ([`fast_exp`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// Sampling parameters. `temperature <= 0` is greedy (argmax after the repetition penalty;
/// the other filters then do not matter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// 1 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 turns it off.
    pub min_p: f32,
    /// HF's repetition penalty over the prompt and the generated tokens; 1 turns it off.
    pub repetition_penalty: f32,
    /// Seed of the random stream (ChaCha8): the same seed, logits and history give the same
    /// tokens on every machine.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Plain sampling from softmax(logits / temperature), no filter.
    pub fn temperature(temperature: f32, seed: u64) -> Self {
        SamplerConfig {
            temperature,
            seed,
            ..Self::greedy()
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Sampling(what));
        if !self.temperature.is_finite() {
            return bad(format!("temperature {} is not finite", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} is not in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p {} is not in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty {} is not a positive number",
                self.repetition_penalty
            ));
        }
        Ok(())
    }

    fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// A seeded sampler with the token history the repetition penalty needs.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    /// One bit per token id seen (prompt and generated).
    seen_bits: Vec<u64>,
    seen: Vec<u32>,
    max_seen: Option<u32>,
    work: Vec<f32>,
    cands: Vec<(f32, u32)>,
    weights: Vec<f32>,
    /// Scratch of the top-p selection, kept across calls (no per-token allocation).
    wc: Vec<(f32, u32)>,
    edge: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self> {
        cfg.check()?;
        Ok(Sampler {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            seen_bits: Vec::new(),
            seen: Vec::new(),
            max_seen: None,
            work: Vec::new(),
            cands: Vec::new(),
            weights: Vec::new(),
            wc: Vec::new(),
            edge: Vec::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token of the prompt or of the output, for the repetition penalty.
    pub fn accept(&mut self, id: u32) {
        let (w, b) = (id as usize / 64, id % 64);
        if w >= self.seen_bits.len() {
            self.seen_bits.resize(w + 1, 0);
        }
        if self.seen_bits[w] & (1 << b) == 0 {
            self.seen_bits[w] |= 1 << b;
            self.seen.push(id);
            self.max_seen = self.max_seen.max(Some(id));
        }
    }

    /// Forgets the history (a new prompt).
    pub fn reset(&mut self) {
        self.seen_bits.clear();
        self.seen.clear();
        self.max_seen = None;
        self.rng = ChaCha8Rng::seed_from_u64(self.cfg.seed);
    }

    /// Picks the next token.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        // Without a penalty the logits are read in place (no copy of the vocabulary).
        let mut work = std::mem::take(&mut self.work);
        let src: &[f32] = if self.cfg.repetition_penalty == 1.0 {
            self.check(logits)?;
            logits
        } else {
            self.penalize(logits, &mut work)?;
            &work
        };
        let token = if self.cfg.is_greedy() {
            argmax(src)
        } else if self.unfiltered() {
            self.draw_all(src)
        } else {
            let m = self.filter(src);
            let inv_t = 1.0 / self.cfg.temperature;
            let mut weights = std::mem::take(&mut self.weights);
            weights.clear();
            weights.extend(self.cands.iter().map(|c| fast_exp((c.0 - m) * inv_t)));
            let i = draw(&weights, self.uniform());
            self.weights = weights;
            self.cands[i].1
        };
        self.work = work;
        Ok(token)
    }

    /// The distribution [`Sampler::sample`] draws from: `(token, probability)`, most likely
    /// first (greedy: the argmax with probability 1). Does not consume randomness.
    pub fn distribution(&mut self, logits: &[f32]) -> Result<Vec<(u32, f32)>> {
        let mut work = std::mem::take(&mut self.work);
        self.penalize(logits, &mut work)?;
        if self.cfg.is_greedy() {
            let best = argmax(&work);
            self.work = work;
            return Ok(vec![(best, 1.0)]);
        }
        if self.unfiltered() {
            self.cands.clear();
            self.cands
                .extend(work.iter().enumerate().map(|(i, &v)| (v, i as u32)));
        } else {
            self.filter(&work);
        }
        self.work = work;
        sort_desc(&mut self.cands);
        let t = self.cfg.temperature as f64;
        let m = self.cands[0].0 as f64;
        let w: Vec<f64> = self
            .cands
            .iter()
            .map(|c| ((c.0 as f64 - m) / t).exp())
            .collect();
        let z: f64 = w.iter().sum();
        Ok(self
            .cands
            .iter()
            .zip(&w)
            .map(|(c, w)| (c.1, (w / z) as f32))
            .collect())
    }

    /// Logits must be non-empty and cover every token of the history.
    fn check(&self, logits: &[f32]) -> Result<()> {
        if logits.is_empty() {
            return Err(Error::Sampling("empty logits".into()));
        }
        match self.max_seen {
            Some(id) if id as usize >= logits.len() => Err(Error::Sampling(format!(
                "token {id} of the history is past the {} logits",
                logits.len()
            ))),
            _ => Ok(()),
        }
    }

    fn unfiltered(&self) -> bool {
        self.cfg.top_k == 0 && self.cfg.top_p >= 1.0 && self.cfg.min_p <= 0.0
    }

    /// Copies the logits into `work`, applying the repetition penalty to seen tokens.
    fn penalize(&self, logits: &[f32], work: &mut Vec<f32>) -> Result<()> {
        self.check(logits)?;
        work.clear();
        work.extend_from_slice(logits);
        let p = self.cfg.repetition_penalty;
        if p != 1.0 {
            for &id in &self.seen {
                let v = &mut work[id as usize];
                *v = if *v > 0.0 { *v / p } else { *v * p };
            }
        }
        Ok(())
    }

    /// Fills `cands` with what top-k, top-p and min-p keep (in no particular order) and
    /// returns the largest logit among them.
    fn filter(&mut self, work: &[f32]) -> f32 {
        let cfg = self.cfg;
        let n = work.len();
        self.cands.clear();
        let top_k = cfg.top_k > 0 && cfg.top_k < n;
        let m = if top_k {
            top_k_into(work, cfg.top_k, &mut self.cands);
            self.cands[0].0
        } else {
            max(work)
        };
        if cfg.top_p < 1.0 {
            // Candidates as (weight exp(v - m), id) and the normaliser of the current set.
            let mut wc = std::mem::take(&mut self.wc);
            wc.clear();
            let z;
            if top_k {
                wc.extend(self.cands.iter().map(|c| (fast_exp(c.0 - m), c.1)));
                z = wc.iter().map(|c| c.0).sum::<f32>();
            } else {
                let mut w = std::mem::take(&mut self.weights);
                w.clear();
                w.extend(work.iter().map(|&v| fast_exp(v - m)));
                z = sum(&w);
                bucket_nucleus(work, &w, m, cfg.top_p * z, &mut wc, &mut self.edge);
                self.weights = w;
            }
            let keep = if top_k {
                nucleus(&mut wc, cfg.top_p * z)
            } else {
                wc.len()
            };
            self.cands.clear();
            self.cands
                .extend(wc[..keep].iter().map(|c| (work[c.1 as usize], c.1)));
            self.wc = wc;
        } else if !top_k {
            // min-p alone (no filter at all never comes here).
            let floor = m + cfg.min_p.ln();
            self.cands.extend(
                work.iter()
                    .enumerate()
                    .filter(|(_, &v)| v >= floor)
                    .map(|(i, &v)| (v, i as u32)),
            );
        }
        if cfg.min_p > 0.0 {
            let floor = m + cfg.min_p.ln();
            self.cands.retain(|c| c.0 >= floor);
        }
        m
    }

    /// A draw from softmax(work / temperature) over the whole vocabulary.
    fn draw_all(&mut self, work: &[f32]) -> u32 {
        let inv_t = 1.0 / self.cfg.temperature;
        let m = max(work);
        let mut weights = std::mem::take(&mut self.weights);
        weights.clear();
        weights.extend(work.iter().map(|&v| fast_exp((v - m) * inv_t)));
        let i = draw(&weights, self.uniform());
        self.weights = weights;
        i as u32
    }

    /// A uniform number in [0, 1) with 53 random bits.
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Index drawn with probability proportional to `weights` for a uniform `u` in [0, 1):
/// sums of 256-weight blocks first (vectorised), then a scan inside the chosen block.
fn draw(weights: &[f32], u: f64) -> usize {
    const BLOCK: usize = 256;
    let sums: Vec<f64> = weights.chunks(BLOCK).map(|c| sum(c) as f64).collect();
    let total: f64 = sums.iter().sum();
    let target = u * total;
    let mut cum = 0.0f64;
    for (b, &s) in sums.iter().enumerate() {
        if target < cum + s {
            for (i, &w) in weights[b * BLOCK..].iter().take(BLOCK).enumerate() {
                cum += w as f64;
                if target < cum {
                    return b * BLOCK + i;
                }
            }
            break;
        }
        cum += s;
    }
    // Rounding left target at the very top: the last token with any weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
}

/// The sum of `v`, in 16 lanes (vectorisable).
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = v.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..16 {
            acc[j] += c[j];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// First index of the largest value (NaN never wins): a vectorisable maximum, then its
/// first position.
fn argmax(v: &[f32]) -> u32 {
    let m = max(v);
    v.iter().position(|&x| x == m).unwrap_or(0) as u32
}

/// The largest value, in 16 lanes (vectorisable; NaN is skipped).
fn max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = v.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..16 {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    acc.iter()
        .chain(rest)
        .copied()
        .fold(f32::NEG_INFINITY, |a, x| if x > a { x } else { a })
}

/// Moves the top-p nucleus to the front of `c` (pairs of weight and id) and returns its
/// size: the fewest heaviest candidates whose weights reach `need`, all of them if they never
/// do. Quickselect on the weight mass: expected linear time, no sort.
fn nucleus(c: &mut [(f32, u32)], mut need: f32) -> usize {
    let (mut lo, mut hi) = (0, c.len());
    while hi - lo > 32 {
        let s = &mut c[lo..hi];
        let pivot = median3(s[0].0, s[s.len() / 2].0, s[s.len() - 1].0);
        // Three-way partition: [> pivot][== pivot][< pivot].
        let (gt, eq) = partition3(s, pivot);
        let mass_gt: f32 = s[..gt].iter().map(|x| x.0).sum();
        if mass_gt >= need {
            hi = lo + gt;
            continue;
        }
        need -= mass_gt;
        let mass_eq = pivot * (eq - gt) as f32;
        if mass_eq >= need {
            // Part of a run of equal weights: the lowest ids, as a sorted order would take.
            s[gt..eq].sort_unstable_by_key(|x| x.1);
            let take = ((need / pivot).ceil() as usize).clamp(1, eq - gt);
            return lo + gt + take;
        }
        need -= mass_eq;
        lo += eq;
    }
    sort_desc(&mut c[lo..hi]);
    for (i, x) in c[lo..hi].iter().enumerate() {
        need -= x.0;
        if need <= 0.0 {
            return lo + i + 1;
        }
    }
    hi
}

/// The candidates top-p must look at, without sorting the vocabulary: weights are
/// bucketed by how far their logit lies below the maximum (1/8 nat per bucket), the bucket
/// in which the cumulative mass reaches `need` found, and every token at or above it
/// The tokens of buckets strictly above it are all in the nucleus; [`nucleus`] picks the
/// rest within the boundary bucket. Leaves the nucleus in `above` as (weight, id), in no
/// order.
fn bucket_nucleus(
    work: &[f32],
    w: &[f32],
    m: f32,
    need: f32,
    above: &mut Vec<(f32, u32)>,
    at_edge: &mut Vec<(f32, u32)>,
) {
    const BUCKETS: usize = 256;
    const PER_NAT: f32 = 8.0;
    let bucket = |v: f32| (((m - v) * PER_NAT) as usize).min(BUCKETS - 1);
    let mut mass = [0.0f32; BUCKETS];
    for (&v, &x) in work.iter().zip(w) {
        mass[bucket(v)] += x;
    }
    let mut cum = 0.0f32;
    let mut edge = BUCKETS - 1;
    for (b, &x) in mass.iter().enumerate() {
        if cum + x >= need {
            edge = b;
            break;
        }
        cum += x;
    }
    above.clear();
    at_edge.clear();
    for (i, (&v, &x)) in work.iter().zip(w).enumerate() {
        match bucket(v).cmp(&edge) {
            std::cmp::Ordering::Less => above.push((x, i as u32)),
            std::cmp::Ordering::Equal => at_edge.push((x, i as u32)),
            std::cmp::Ordering::Greater => {}
        }
    }
    let take = nucleus(at_edge, need - cum);
    above.extend_from_slice(&at_edge[..take]);
}

fn median3(a: f32, b: f32, c: f32) -> f32 {
    a.max(b).min(a.min(b).max(c))
}

/// Reorders `s` into `[> pivot][== pivot][< pivot]`; returns the two boundaries.
fn partition3(s: &mut [(f32, u32)], pivot: f32) -> (usize, usize) {
    let (mut gt, mut i, mut lt) = (0, 0, s.len());
    while i < lt {
        if s[i].0 > pivot {
            s.swap(gt, i);
            gt += 1;
            i += 1;
        } else if s[i].0 < pivot {
            lt -= 1;
            s.swap(i, lt);
        } else {
            i += 1;
        }
    }
    (gt, lt)
}

/// Sorts candidates most likely first; equal logits keep the lower id first.
fn sort_desc(c: &mut [(f32, u32)]) {
    c.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
}

/// The `k` largest values (ties: lower id), most likely first.
fn top_k_into(v: &[f32], k: usize, out: &mut Vec<(f32, u32)>) {
    // A min-heap of the best k so far, keyed so that the worst (smallest value, then larger
    // id) is on top.
    #[derive(PartialEq)]
    struct Key(f32, u32);
    impl Eq for Key {}
    impl PartialOrd for Key {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Key {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
        }
    }
    let mut heap: BinaryHeap<Reverse<Key>> = BinaryHeap::with_capacity(k + 1);
    let mut floor = f32::NEG_INFINITY;
    for (i, &x) in v.iter().enumerate() {
        if heap.len() < k {
            heap.push(Reverse(Key(x, i as u32)));
            if heap.len() == k {
                floor = heap.peek().map(|r| r.0 .0).unwrap_or(f32::NEG_INFINITY);
            }
        } else if x > floor {
            heap.pop();
            heap.push(Reverse(Key(x, i as u32)));
            floor = heap.peek().map(|r| r.0 .0).unwrap_or(f32::NEG_INFINITY);
        }
    }
    out.extend(heap.into_iter().map(|r| (r.0 .0, r.0 .1)));
    sort_desc(out);
}

/// e^x for x <= 0, relative error below 1e-7 (exactly 0 below -87): 2^n times a degree-7
/// polynomial for e^r, |r| <= ln2/2. Branch-free, so loops over it vectorise.
#[inline]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 0.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(cfg: SamplerConfig, logits: &[f32]) -> Vec<(u32, f32)> {
        Sampler::new(cfg).unwrap().distribution(logits).unwrap()
    }

    fn close(a: &[(u32, f32)], b: &[(u32, f64)]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.0, y.0, "{a:?} vs {b:?}");
            assert!((x.1 as f64 - y.1).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn fast_exp_matches_std() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = fast_exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(fast_exp(-200.0), fast_exp(-87.0));
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        assert_eq!(s.sample(&[0.0, 3.0, -1.0, 3.0]).unwrap(), 1);
    }

    // Logits ln(4), ln(3), ln(2), ln(1): probabilities 0.4, 0.3, 0.2, 0.1.
    fn l4() -> Vec<f32> {
        [4.0f32, 3.0, 2.0, 1.0].iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn top_k_renormalises_the_k_best() {
        let cfg = SamplerConfig {
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        close(&dist(cfg, &l4()), &[(0, 4.0 / 7.0), (1, 3.0 / 7.0)]);
    }

    #[test]
    fn top_p_keeps_the_prefix_that_reaches_p() {
        // 0.4 + 0.3 = 0.7 >= 0.65: two tokens.
        let cfg = SamplerConfig {
            top_p: 0.65,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        close(&dist(cfg, &l4()), &[(0, 4.0 / 7.0), (1, 3.0 / 7.0)]);
        // 0.7 < 0.75: three.
        let cfg = SamplerConfig {
            top_p: 0.75,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        close(
            &dist(cfg, &l4()),
            &[(0, 4.0 / 9.0), (1, 3.0 / 9.0), (2, 2.0 / 9.0)],
        );
    }

    #[test]
    fn top_p_over_a_large_vocabulary_counts_the_whole_tail() {
        // 1000 tokens at logit 0 and one at ln(1000): the top token holds exactly half.
        let mut v = vec![0.0f32; 1001];
        v[500] = 1000f32.ln();
        let cfg = SamplerConfig {
            top_p: 0.499,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        close(&dist(cfg, &v), &[(500, 1.0)]);
        // 0.5 + 0.0005 reaches 0.5004: the best token and the first of the tail.
        let cfg = SamplerConfig {
            top_p: 0.5004,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        let d = dist(cfg, &v);
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].0, 0);
    }

    #[test]
    fn min_p_is_relative_to_the_best() {
        // 0.2 / 0.4 = 0.5 >= 0.5 stays; 0.1 / 0.4 = 0.25 goes.
        let cfg = SamplerConfig {
            min_p: 0.5,
            temperature: 1.0,
            ..SamplerConfig::greedy()
        };
        close(
            &dist(cfg, &l4()),
            &[(0, 4.0 / 9.0), (1, 3.0 / 9.0), (2, 2.0 / 9.0)],
        );
    }

    #[test]
    fn temperature_reshapes_after_the_filters() {
        // top-k 2 keeps ln4, ln3; at T=0.5 the weights are 16 and 9.
        let cfg = SamplerConfig {
            top_k: 2,
            temperature: 0.5,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::greedy()
        };
        close(&dist(cfg, &l4()), &[(0, 16.0 / 25.0), (1, 9.0 / 25.0)]);
        // top-p 0.65 judges the T=1 distribution (two tokens), then T=2: weights 2, sqrt(3).
        let cfg = SamplerConfig {
            top_p: 0.65,
            temperature: 2.0,
            ..SamplerConfig::greedy()
        };
        let z = 2.0 + 3f64.sqrt();
        close(&dist(cfg, &l4()), &[(0, 2.0 / z), (1, 3f64.sqrt() / z)]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            repetition_penalty: 2.0,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg).unwrap();
        s.accept(0);
        s.accept(2);
        s.accept(0);
        // logits [2, 1, -1, 0] -> [1, 1, -2, 0]
        let d = s.distribution(&[2.0, 1.0, -1.0, 0.0]).unwrap();
        let e = [1f64.exp(), 1f64.exp(), (-2f64).exp(), 1.0];
        let z: f64 = e.iter().sum();
        close(
            &d,
            &[(0, e[0] / z), (1, e[1] / z), (3, e[3] / z), (2, e[2] / z)],
        );
        // Greedy after the penalty: token 0 (2 -> 1) ties with token 1; the first wins.
        let mut g = Sampler::new(SamplerConfig {
            repetition_penalty: 3.0,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        g.accept(0);
        assert_eq!(g.sample(&[2.0, 1.0, -1.0, 0.0]).unwrap(), 1);
    }

    #[test]
    fn bad_parameters_and_inputs_are_errors() {
        for cfg in [
            SamplerConfig {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 1.5,
                ..Default::default()
            },
            SamplerConfig {
                min_p: -0.1,
                ..Default::default()
            },
            SamplerConfig {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                temperature: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(cfg).is_err(), "{cfg:?}");
        }
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert!(s.sample(&[]).is_err());
        s.accept(10);
        assert!(s
            .sample(&[0.0; 4])
            .unwrap_err()
            .to_string()
            .contains("token 10"));
    }

    /// Draws at temperature T match softmax(logits / T): every frequency within 5 standard
    /// errors, and Pearson's chi-square below the 0.999 quantile for 7 degrees of freedom.
    #[test]
    fn temperature_draws_match_softmax() {
        let logits = [1.0f32, 0.5, 0.0, -0.5, 2.0, -3.0, 0.2, 1.5];
        for &(t, seed) in &[(0.7f32, 1u64), (1.0, 2), (1.8, 3)] {
            let mut s = Sampler::new(SamplerConfig::temperature(t, seed)).unwrap();
            let n = 200_000usize;
            let mut counts = [0usize; 8];
            for _ in 0..n {
                counts[s.sample(&logits).unwrap() as usize] += 1;
            }
            let w: Vec<f64> = logits
                .iter()
                .map(|&l| (l as f64 / t as f64).exp())
                .collect();
            let z: f64 = w.iter().sum();
            let mut chi2 = 0.0;
            for i in 0..8 {
                let p = w[i] / z;
                let expect = p * n as f64;
                let se = (n as f64 * p * (1.0 - p)).sqrt();
                assert!(
                    (counts[i] as f64 - expect).abs() < 5.0 * se,
                    "T={t} token {i}: {} draws, expected {expect:.0} ± {se:.0}",
                    counts[i]
                );
                chi2 += (counts[i] as f64 - expect).powi(2) / expect;
            }
            assert!(chi2 < 24.32, "T={t}: chi-square {chi2}");
        }
    }

    /// The quickselect nucleus keeps the same set as sorting and accumulating (ties broken
    /// by the lower id), on vocabularies with runs of equal logits.
    #[test]
    fn nucleus_matches_a_sorted_prefix() {
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for round in 0..200 {
            let n = 1 + (next() % 5000) as usize;
            // Quantised logits: many ties.
            let c: Vec<(f32, u32)> = (0..n)
                .map(|i| (((next() % 64) as f32) / 8.0 - 4.0, i as u32))
                .collect();
            let m = c.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = c.iter().map(|x| fast_exp(x.0 - m) as f64).sum();
            let p = (next() % 1000) as f64 / 1000.0 * 0.98 + 0.01;
            let mut sorted = c.clone();
            sort_desc(&mut sorted);
            let mut cum = 0.0f64;
            let mut want = sorted.len();
            for (i, x) in sorted.iter().enumerate() {
                cum += fast_exp(x.0 - m) as f64;
                if cum >= p * z {
                    want = i + 1;
                    break;
                }
            }
            let mut got: Vec<(f32, u32)> = c.iter().map(|x| (fast_exp(x.0 - m), x.1)).collect();
            let k = nucleus(&mut got, (p * z) as f32);
            let mut got_ids: Vec<u32> = got[..k].iter().map(|x| x.1).collect();
            let mut want_ids: Vec<u32> = sorted[..want].iter().map(|x| x.1).collect();
            got_ids.sort_unstable();
            want_ids.sort_unstable();
            if got_ids != want_ids {
                // Only f32 rounding right at the boundary may move it by one token.
                let edge: f64 = sorted[..want]
                    .iter()
                    .map(|x| fast_exp(x.0 - m) as f64)
                    .sum();
                assert!(
                    ((edge - p * z) / z).abs() < 1e-5 && k.abs_diff(want) <= 1,
                    "round {round}: {k} vs {want}"
                );
            }
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 20.0).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..Default::default()
            })
            .unwrap();
            (0..50)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn filtered_draws_follow_the_distribution() {
        let logits = l4();
        let cfg = SamplerConfig {
            top_k: 3,
            top_p: 0.9,
            min_p: 0.3,
            temperature: 0.9,
            seed: 5,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let d = s.distribution(&logits).unwrap();
        let n = 100_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits).unwrap() as usize] += 1;
        }
        for (id, p) in d {
            let se = (n as f64 * p as f64 * (1.0 - p as f64)).sqrt().max(1.0);
            assert!((counts[id as usize] as f64 - p as f64 * n as f64).abs() < 5.0 * se);
        }
        assert_eq!(counts[3], 0, "min-p removed token 3");
    }
}
