//! Causal attention of a call's queries over a KV cache (an LLM's attention, prefill and
//! decode alike).
//!
//! The cache holds every position so far, seq-major: row `j` of `k` is the keys of all
//! key/value heads at position `j` (`[total, kv_heads * head_dim]`), so a call that appends
//! positions extends it without moving anything. Query row `i` of the call sits at
//! absolute position `past + i` and sees keys `lo..=past + i` (`lo` is 0, or the start of
//! its sliding window). Grouped-query attention: query head `h` reads key/value head
//! `h / (q_heads / kv_heads)`.
//!
//! Prefill-sized calls (at least `PACK_MIN_SEQ` query rows) first copy each key/value
//! head's rows together per task (see `attend_packed`): read in place, consecutive keys of
//! a head are a cache row (4 KiB) apart, each in its own page. One Qwen3-0.6B layer at
//! seq 128 went from 2.12-2.17 to 1.38-1.59 ms of thread CPU time (31 -> 42-49 GFLOP/s,
//! `benches/attention.rs`, one thread, three runs on a loaded Zen 5).
//!
//! Work is split into items `(query row, key/value head)`: an item computes the
//! `q_heads / kv_heads` query heads that share that key/value head, so each key row is
//! read once for the whole group while it is in L1, and the item's output is a contiguous
//! segment of the output row. Per query head, scores are computed four keys at a time into
//! a scratch row, soft-capped and normalised with one max and one vectorised `exp` pass,
//! then the value rows are summed into output vectors held in registers across the keys
//! (a decode step at 1000 cached positions: 395 -> 176 us on 2 threads, 16/8 heads of 128). Everything stays f32, with the reductions (dot
//! products, the softmax sum) in vector lanes; the tests hold it to an f64 reference.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::{check_isa, par_blocks, Disjoint, KernelError};
use crate::simd::{self, Simd};
use crate::{Isa, Parallel};

/// Whether prefill calls copy each key/value head's rows together first (see
/// [`attend_packed`]); cleared only by the bench, to compare in the same run.
static PACK_HEADS: AtomicBool = AtomicBool::new(true);

/// Copies each key/value head's rows together before prefill attention (`true`, the
/// default) or reads them in place, for every later call in the process. For the bench.
#[doc(hidden)]
pub fn set_attention_packing(on: bool) {
    PACK_HEADS.store(on, Ordering::Relaxed);
}

/// Where the keys and values of a call lie: row `j` (absolute position) of head `g` at
/// `(j - base) * stride + g * head_stride`.
#[derive(Clone, Copy)]
struct KvView {
    base: usize,
    stride: usize,
    head_stride: usize,
}

/// Calls with at least this many query rows copy each head's keys and values together.
const PACK_MIN_SEQ: usize = 8;

/// The shape and options of a [`cached_attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachedAttention {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads; divides `q_heads`.
    pub kv_heads: usize,
    /// Elements per head (of queries, keys and values alike).
    pub head_dim: usize,
    /// Multiplies `q · k` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// `score = softcap * tanh(score / softcap)` before the softmax when positive.
    pub softcap: f32,
    /// A query at position `p` sees keys `p - window ..= p` (`None`: every earlier key).
    pub window: Option<usize>,
}

impl CachedAttention {
    fn check(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        out: &[f32],
    ) -> Result<(usize, usize), KernelError> {
        let shape = |detail: String| KernelError::Shape {
            what: "cached attention".into(),
            detail,
        };
        if self.head_dim == 0 || self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(shape(format!(
                "{} query heads, {} key/value heads of {} elements",
                self.q_heads, self.kv_heads, self.head_dim
            )));
        }
        let (qw, kw) = (self.q_heads * self.head_dim, self.kv_heads * self.head_dim);
        if !q.len().is_multiple_of(qw) || out.len() != q.len() {
            return Err(shape(format!(
                "queries of {} and output of {} elements are not rows of {qw}",
                q.len(),
                out.len()
            )));
        }
        let seq = q.len() / qw;
        if k.len() != v.len() || !k.len().is_multiple_of(kw) {
            return Err(shape(format!(
                "keys of {} and values of {} elements are not rows of {kw}",
                k.len(),
                v.len()
            )));
        }
        let total = k.len() / kw;
        if past + seq > total {
            return Err(shape(format!(
                "{seq} queries after {past} cached positions need {} key rows, the cache has {total}",
                past + seq
            )));
        }
        Ok((seq, total))
    }
}

/// Attention of `q` (`[seq, q_heads * head_dim]`, row `i` at position `past + i`) over the
/// cache `k`, `v` (`[total, kv_heads * head_dim]`, `total >= past + seq`; rows past
/// `past + seq` are never read) into `out` (`[seq, q_heads * head_dim]`), on the fastest ISA.
pub fn cached_attention(
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    cached_attention_with_isa(Isa::detect(), a, q, k, v, past, out, par)
}

/// [`cached_attention`] on a given ISA.
#[allow(clippy::too_many_arguments)]
pub fn cached_attention_with_isa(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let pack = PACK_HEADS.load(Ordering::Relaxed);
    attention_with(isa, a, q, k, v, past, out, par, pack)
}

/// [`cached_attention_with_isa`], copying each head's keys and values together for
/// prefill-sized calls or not (`pack`).
#[allow(clippy::too_many_arguments)]
fn attention_with(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    out: &mut [f32],
    par: &dyn Parallel,
    pack: bool,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let (seq, total) = a.check(q, k, v, past, out)?;
    let group = a.q_heads / a.kv_heads;
    let segment = group * a.head_dim;
    let items = seq * a.kv_heads;
    // Per item: a group's scores over up to `past + seq` keys, and its outputs.
    let work = (past + seq).min(total) * segment * 2;
    let dst = Disjoint::new(out);
    if pack && seq >= PACK_MIN_SEQ {
        par_blocks(par, items, work, &|range| {
            attend_packed(isa, a, q, k, v, past, seq, range, &dst)
        });
        return Ok(());
    }
    let view = KvView {
        base: 0,
        stride: a.kv_heads * a.head_dim,
        head_stride: a.head_dim,
    };
    par_blocks(par, items, work, &|range| {
        // SAFETY: items map to consecutive, disjoint `segment`-element parts of `out`
        // (row-major `(row, kv head)` order), and `par_blocks` hands out disjoint ranges.
        let o = unsafe { dst.part(range.start * segment..range.end * segment) };
        attend_isa(isa, a, q, k, v, past, range.start, o, view);
    });
    Ok(())
}

/// Items `range` in `(kv head, row)` order (item `g * seq + row`): for each head in the
/// range, its keys and values over the range's rows are first copied into contiguous
/// per-thread rows, then every item of that head reads them there.
///
/// Why: in the cache a head's rows are a whole cache row apart (4 KiB for 8 heads of
/// 128), so each key read in place is in a different page and no prefetcher follows them.
#[allow(clippy::too_many_arguments)]
fn attend_packed(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    seq: usize,
    range: std::ops::Range<usize>,
    dst: &Disjoint,
) {
    let (d, kw) = (a.head_dim, a.kv_heads * a.head_dim);
    let segment = a.q_heads / a.kv_heads * d;
    let (mut kp, mut vp) = (Vec::new(), Vec::new());
    let mut item = range.start;
    while item < range.end {
        let g = item / seq;
        let end = range.end.min((g + 1) * seq);
        let (first_row, last_row) = (item % seq, (end - 1) % seq);
        let lo = a.window.map_or(0, |w| (past + first_row).saturating_sub(w));
        let hi = past + last_row;
        for (packed, src) in [(&mut kp, k), (&mut vp, v)] {
            packed.clear();
            for j in lo..=hi {
                packed.extend_from_slice(&src[j * kw + g * d..][..d]);
            }
        }
        let view = KvView {
            base: lo,
            stride: d,
            head_stride: 0,
        };
        for it in item..end {
            let at = (it % seq) * a.kv_heads + g;
            // SAFETY: `it -> at` is a bijection of the call's items, each `at` owns the
            // disjoint `segment`-element part `at` of `out`, and `par_blocks` hands out
            // disjoint ranges of items.
            let o = unsafe { dst.part(at * segment..(at + 1) * segment) };
            attend_isa(isa, a, q, &kp, &vp, past, at, o, view);
        }
        item = end;
    }
}

simd_dispatch!(fn attend_isa(
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    first_item: usize,
    out: &mut [f32],
    kv: KvView,
) => attend_generic);

/// Items `first_item..` of the call, as many as `out` holds segments for.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_generic<S: Simd>(
    s: S,
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    first_item: usize,
    out: &mut [f32],
    kv: KvView,
) {
    let d = a.head_dim;
    let group = a.q_heads / a.kv_heads;
    let qw = a.q_heads * d;
    let at = |j: usize, g: usize| (j - kv.base) * kv.stride + g * kv.head_stride;
    let mut scores = Vec::new();
    for (n, seg) in out.chunks_exact_mut(group * d).enumerate() {
        let item = first_item + n;
        let (row, g) = (item / a.kv_heads, item % a.kv_heads);
        let pos = past + row;
        let lo = a.window.map_or(0, |w| pos.saturating_sub(w));
        let keys = pos + 1 - lo;
        scores.clear();
        scores.resize(group * keys, 0.0);
        // Scores of every query head of the group, four key rows at a time (each query
        // vector load serves four keys).
        let key = |j: usize| &k[at(lo + j, g)..][..d];
        for h in 0..group {
            let qr = &q[row * qw + (g * group + h) * d..][..d];
            let sc = &mut scores[h * keys..(h + 1) * keys];
            let mut j = 0;
            while j + 4 <= keys {
                let dots = dot4(s, qr, [key(j), key(j + 1), key(j + 2), key(j + 3)]);
                for (t, dt) in dots.into_iter().enumerate() {
                    sc[j + t] = dt * a.scale;
                }
                j += 4;
            }
            for (jj, v) in sc.iter_mut().enumerate().skip(j) {
                *v = dot(s, qr, key(jj)) * a.scale;
            }
        }
        for (h, o) in seg.chunks_exact_mut(d).enumerate() {
            let sc = &mut scores[h * keys..(h + 1) * keys];
            if a.softcap > 0.0 {
                softcap(s, sc, a.softcap);
            }
            let sum = exp_normalise(s, sc);
            let inv = 1.0 / sum;
            sc.iter_mut().for_each(|p| *p *= inv);
            weighted_rows(s, sc, |j| &v[at(lo + j, g)..][..d], o);
        }
    }
}

/// The dot products of `q` with four rows.
#[inline(always)]
fn dot4<S: Simd>(s: S, q: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
    let n = q.len();
    let mut acc = [s.splat(0.0); 4];
    let mut i = 0;
    while i + S::LANES <= n {
        let qv = s.load(&q[i..]);
        for (a, r) in acc.iter_mut().zip(&rows) {
            *a = s.fma(qv, s.load(&r[i..]), *a);
        }
        i += S::LANES;
    }
    if i < n {
        let qv = s.load_partial(&q[i..], 0.0);
        for (a, r) in acc.iter_mut().zip(&rows) {
            *a = s.fma(qv, s.load_partial(&r[i..], 0.0), *a);
        }
    }
    acc.map(|a| s.reduce_add(a))
}

/// `out = Σ_j p[j] · row(j)`, a slice of four vectors of `out` at a time held in registers
/// across all the rows (rather than loaded and stored once per row).
#[inline(always)]
fn weighted_rows<'r, S: Simd>(s: S, p: &[f32], row: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    let d = out.len();
    let block = 4 * S::LANES;
    let mut c = 0;
    while c < d {
        let width = block.min(d - c);
        let mut acc = [s.splat(0.0); 4];
        for (j, &pj) in p.iter().enumerate() {
            let r = &row(j)[c..c + width];
            let pv = s.splat(pj);
            for (t, a) in acc.iter_mut().enumerate() {
                let at = t * S::LANES;
                if at + S::LANES <= width {
                    *a = s.fma(pv, s.load(&r[at..]), *a);
                } else if at < width {
                    *a = s.fma(pv, s.load_partial(&r[at..], 0.0), *a);
                }
            }
        }
        let o = &mut out[c..c + width];
        for (t, a) in acc.iter().enumerate() {
            let at = t * S::LANES;
            if at + S::LANES <= width {
                s.store(&mut o[at..], *a);
            } else if at < width {
                s.store_partial(&mut o[at..], *a);
            }
        }
        c += width;
    }
}

#[inline(always)]
fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let mut acc = [s.splat(0.0); 4];
    let mut i = 0;
    while i + 4 * S::LANES <= n {
        for (t, acc) in acc.iter_mut().enumerate() {
            let o = i + t * S::LANES;
            *acc = s.fma(s.load(&a[o..]), s.load(&b[o..]), *acc);
        }
        i += 4 * S::LANES;
    }
    while i + S::LANES <= n {
        acc[0] = s.fma(s.load(&a[i..]), s.load(&b[i..]), acc[0]);
        i += S::LANES;
    }
    if i < n {
        acc[1] = s.fma(
            s.load_partial(&a[i..], 0.0),
            s.load_partial(&b[i..], 0.0),
            acc[1],
        );
    }
    let sum = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    s.reduce_add(sum)
}

/// `x = cap * tanh(x / cap)`.
#[inline(always)]
fn softcap<S: Simd>(s: S, x: &mut [f32], cap: f32) {
    let (vc, vi) = (s.splat(cap), s.splat(1.0 / cap));
    let mut i = 0;
    while i + S::LANES <= x.len() {
        let t = simd::tanh(s, s.mul(s.load(&x[i..]), vi));
        s.store(&mut x[i..], s.mul(t, vc));
        i += S::LANES;
    }
    for v in &mut x[i..] {
        *v = cap * (*v / cap).tanh();
    }
}

/// `x = exp(x - max x)`; returns the sum. A row of only `-inf` scores cannot occur (every
/// query sees at least its own key).
#[inline(always)]
fn exp_normalise<S: Simd>(s: S, x: &mut [f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let vm = s.splat(max);
    let mut acc = s.splat(0.0);
    let mut i = 0;
    while i + S::LANES <= x.len() {
        let e = simd::exp(s, s.sub(s.load(&x[i..]), vm));
        s.store(&mut x[i..], e);
        acc = s.add(acc, e);
        i += S::LANES;
    }
    let mut sum = s.reduce_add(acc);
    for v in &mut x[i..] {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScopedThreads, Sequential};

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The definition, in f64.
    fn reference(a: &CachedAttention, q: &[f32], k: &[f32], v: &[f32], past: usize) -> Vec<f64> {
        let d = a.head_dim;
        let (qw, kw) = (a.q_heads * d, a.kv_heads * d);
        let seq = q.len() / qw;
        let group = a.q_heads / a.kv_heads;
        let mut out = vec![0f64; q.len()];
        for i in 0..seq {
            let pos = past + i;
            let lo = a.window.map_or(0, |w| pos.saturating_sub(w));
            for h in 0..a.q_heads {
                let g = h / group;
                let mut sc: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let s: f64 = (0..d)
                            .map(|t| q[i * qw + h * d + t] as f64 * k[j * kw + g * d + t] as f64)
                            .sum();
                        let s = s * a.scale as f64;
                        if a.softcap > 0.0 {
                            a.softcap as f64 * (s / a.softcap as f64).tanh()
                        } else {
                            s
                        }
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                sc.iter_mut().for_each(|x| *x = (*x - m).exp());
                let sum: f64 = sc.iter().sum();
                for (jj, p) in sc.iter().enumerate() {
                    let j = lo + jj;
                    for t in 0..d {
                        out[i * qw + h * d + t] += p / sum * v[j * kw + g * d + t] as f64;
                    }
                }
            }
        }
        out
    }

    fn check(a: CachedAttention, seq: usize, past: usize, spare: usize) {
        let d = a.head_dim;
        let total = past + seq + spare;
        let q = data(seq * a.q_heads * d, 1);
        let k = data(total * a.kv_heads * d, 2);
        let v = data(total * a.kv_heads * d, 3);
        let want = reference(&a, &q, &k, &v, past);
        for isa in simd::tests::isas() {
            for (threads, pack) in [(1, true), (3, true), (1, false), (3, false)] {
                let mut out = vec![f32::NAN; q.len()];
                let r = if threads == 1 {
                    attention_with(isa, &a, &q, &k, &v, past, &mut out, &Sequential, pack)
                } else {
                    let par = ScopedThreads::new(threads);
                    attention_with(isa, &a, &q, &k, &v, past, &mut out, &par, pack)
                };
                r.unwrap();
                for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (o as f64 - w).abs() <= 2e-6 * (1.0 + w.abs()),
                        "{a:?} seq {seq} past {past} {isa:?} x{threads} pack {pack}: element {i}: {o} vs {w}"
                    );
                }
            }
        }
    }

    fn attn(q_heads: usize, kv_heads: usize, head_dim: usize) -> CachedAttention {
        CachedAttention {
            q_heads,
            kv_heads,
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            softcap: 0.0,
            window: None,
        }
    }

    #[test]
    fn prefill_and_decode_match_the_definition() {
        // Grouped (4 query heads per key/value head), a head size with a vector tail.
        check(attn(8, 2, 40), 7, 0, 0);
        check(attn(8, 2, 40), 1, 9, 3);
        check(attn(4, 4, 64), 5, 6, 0);
        check(attn(6, 1, 16), 1, 0, 5);
        // Long enough to copy heads together (PACK_MIN_SEQ), after cached positions too.
        check(attn(8, 2, 40), 19, 0, 0);
        check(attn(6, 3, 24), 9, 5, 2);
    }

    #[test]
    fn windows_and_softcaps() {
        let mut a = attn(4, 2, 32);
        a.window = Some(3);
        check(a, 6, 4, 0);
        check(a, 11, 4, 0);
        check(a, 1, 20, 2);
        a.softcap = 2.5;
        check(a, 4, 2, 1);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let a = attn(4, 2, 8);
        let q = vec![0.0; 32];
        let kv = vec![0.0; 16 * 3];
        let mut out = vec![0.0; 32];
        // 1 query after 3 cached positions needs 4 key rows; the cache has 3.
        let e = cached_attention(&a, &q, &kv, &kv, 3, &mut out, &Sequential).unwrap_err();
        assert!(e.to_string().contains("need 4 key rows"), "{e}");
        let e =
            cached_attention(&attn(3, 2, 8), &q, &kv, &kv, 0, &mut out, &Sequential).unwrap_err();
        assert!(e.to_string().contains("3 query heads"), "{e}");
        let mut short = vec![0.0; 31];
        assert!(cached_attention(&a, &q, &kv, &kv, 0, &mut short, &Sequential).is_err());
    }
}
