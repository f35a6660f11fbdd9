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
//!
//! Each key and value row is read once per item, for all the group's heads (keys outer,
//! heads inner; values summed two heads a pass), with keys and values prefetched a few
//! rows ahead. Read head by head, a decode step re-read them per head from L3 or DRAM: a
//! head's rows lie a cache row apart, so they map to few cache sets and are evicted before
//! the next head's pass. `benches/attention.rs --decode 1000` (2 threads, 28 layers' f16
//! caches, loaded Zen 5, alternated): 281-289 -> 208-210 us a layer; at 192 positions
//! (the caches mostly in L3) 21 us both.
//!
//! The cache may be f32 or f16 ([`KvElement`]). An f16 cache (llama.cpp's default) is read
//! at half the bytes and widened exactly in registers (`vcvtph2ps`) as it is loaded, and
//! its products are f16 products, as llama.cpp's are: its CPU attention without flash
//! attention (its default, and the run our GGUF references come from) multiplies the f16
//! cache with `ggml_mul_mat`, which first converts the other operand to f16. So each query
//! row is rounded to f16 (ties to even) before `q · k`, and the normalised softmax weights
//! are rounded before `Σ p v`; a product of two halves is exact in f32, and the sums stay
//! f32. The scale multiplies the dot product afterwards, as ggml's softmax applies it.

use half::f16;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct KvView {
    base: usize,
    stride: usize,
    head_stride: usize,
}

/// Calls with at least this many query rows copy each head's keys and values together.
const PACK_MIN_SEQ: usize = 8;

/// An element type a KV cache may be stored in: `f32`, or `half::f16` (widened exactly to
/// f32 as it is loaded). Sealed: the kernels implement it for these two.
pub trait KvElement: Copy + Send + Sync + sealed::Sealed {
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// The items of [`cached_attention`] on `isa`, monomorphised for this element.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn attend_isa(
        isa: Isa,
        a: &CachedAttention,
        q: &[f32],
        k: &[Self],
        v: &[Self],
        past: usize,
        first_item: usize,
        out: &mut [f32],
        kv: KvView,
    );
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// Vectors of f32 from a cache row of `Self` (partial: the missing lanes 0).
trait Widen: Copy {
    /// Whether the products with this cache are products of two `Self`s (see the module
    /// docs): the queries and the softmax weights are rounded to it first.
    const ROUNDS_OPERANDS: bool;
    fn load<S: Simd>(s: S, x: &[Self]) -> S::V;
    fn load_partial<S: Simd>(s: S, x: &[Self]) -> S::V;
}

impl Widen for f32 {
    const ROUNDS_OPERANDS: bool = false;
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f32]) -> S::V {
        s.load(x)
    }
    #[inline(always)]
    fn load_partial<S: Simd>(s: S, x: &[f32]) -> S::V {
        s.load_partial(x, 0.0)
    }
}

impl Widen for f16 {
    const ROUNDS_OPERANDS: bool = true;
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f16]) -> S::V {
        s.load_f16(x)
    }
    #[inline(always)]
    fn load_partial<S: Simd>(s: S, x: &[f16]) -> S::V {
        s.load_f16_partial(x)
    }
}

impl KvElement for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn attend_isa(
        isa: Isa,
        a: &CachedAttention,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        first_item: usize,
        out: &mut [f32],
        kv: KvView,
    ) {
        attend_isa_f32(isa, a, q, k, v, past, first_item, out, kv)
    }
}

impl KvElement for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn attend_isa(
        isa: Isa,
        a: &CachedAttention,
        q: &[f32],
        k: &[f16],
        v: &[f16],
        past: usize,
        first_item: usize,
        out: &mut [f32],
        kv: KvView,
    ) {
        attend_isa_f16(isa, a, q, k, v, past, first_item, out, kv)
    }
}

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
    fn check<E>(
        &self,
        q: &[f32],
        k: &[E],
        v: &[E],
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
/// The cache is f32 or f16 ([`KvElement`]).
pub fn cached_attention<E: KvElement>(
    a: &CachedAttention,
    q: &[f32],
    k: &[E],
    v: &[E],
    past: usize,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    cached_attention_with_isa(Isa::detect(), a, q, k, v, past, out, par)
}

/// [`cached_attention`] on a given ISA.
#[allow(clippy::too_many_arguments)]
pub fn cached_attention_with_isa<E: KvElement>(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[E],
    v: &[E],
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
fn attention_with<E: KvElement>(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[E],
    v: &[E],
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
        E::attend_isa(isa, a, q, k, v, past, range.start, o, view);
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
fn attend_packed<E: KvElement>(
    isa: Isa,
    a: &CachedAttention,
    q: &[f32],
    k: &[E],
    v: &[E],
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
            E::attend_isa(isa, a, q, &kp, &vp, past, at, o, view);
        }
        item = end;
    }
}

simd_dispatch!(fn attend_isa_f32(
    a: &CachedAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    first_item: usize,
    out: &mut [f32],
    kv: KvView,
) => attend_generic);

simd_dispatch!(fn attend_isa_f16(
    a: &CachedAttention,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    past: usize,
    first_item: usize,
    out: &mut [f32],
    kv: KvView,
) => attend_generic);

/// Items `first_item..` of the call, as many as `out` holds segments for.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_generic<S: Simd, E: Widen>(
    s: S,
    a: &CachedAttention,
    q: &[f32],
    k: &[E],
    v: &[E],
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
    let ahead = PREFETCH_ROWS.load(Ordering::Relaxed);
    // The group's query rows, rounded to f16 for an f16 cache.
    let mut q16 = if E::ROUNDS_OPERANDS {
        vec![0.0; group * d]
    } else {
        Vec::new()
    };
    for (n, seg) in out.chunks_exact_mut(group * d).enumerate() {
        let item = first_item + n;
        let (row, g) = (item / a.kv_heads, item % a.kv_heads);
        let pos = past + row;
        let lo = a.window.map_or(0, |w| pos.saturating_sub(w));
        let keys = pos + 1 - lo;
        scores.clear();
        scores.resize(group * keys, 0.0);
        let mut qg = &q[row * qw + g * group * d..][..group * d];
        if E::ROUNDS_OPERANDS {
            round_f16(s, qg, &mut q16);
            qg = &q16;
        }
        // Scores of every query head of the group, four key rows at a time: each query
        // vector load serves four keys, and each key row is read from memory once for
        // the whole group (the next heads find it in L1). Taking the heads one at a time
        // over all keys instead re-read every key per head: a head's keys lie a cache row
        // apart, so they share few cache sets and are evicted before the next head's pass.
        let key = |j: usize| &k[at(lo + j, g)..][..d];
        let mut j = 0;
        while j + 4 <= keys {
            // Keys and values a few rows ahead (see [`PREFETCH_ROWS`]).
            for t in (j + ahead..(j + ahead + 4).min(keys)).filter(|_| ahead > 0) {
                prefetch(&k[at(lo + t, g)..][..d]);
                prefetch(&v[at(lo + t, g)..][..d]);
            }
            let rows = [key(j), key(j + 1), key(j + 2), key(j + 3)];
            for (h, qr) in qg.chunks_exact(d).enumerate() {
                let dots = dot4(s, qr, rows);
                for (t, dt) in dots.into_iter().enumerate() {
                    scores[h * keys + j + t] = dt * a.scale;
                }
            }
            j += 4;
        }
        for jj in j..keys {
            for (h, qr) in qg.chunks_exact(d).enumerate() {
                scores[h * keys + jj] = dot(s, qr, key(jj)) * a.scale;
            }
        }
        for sc in scores.chunks_exact_mut(keys) {
            if a.softcap > 0.0 {
                softcap(s, sc, a.softcap);
            }
            let sum = exp_normalise(s, sc);
            scale_weights(s, sc, 1.0 / sum, E::ROUNDS_OPERANDS);
        }
        // The weighted sums two heads at a time, each value row read once for both.
        let value = |j: usize| &v[at(lo + j, g)..][..d];
        let mut pairs = seg.chunks_exact_mut(2 * d);
        let mut h = 0;
        for o in &mut pairs {
            let (o0, o1) = o.split_at_mut(d);
            let p = [
                &scores[h * keys..][..keys],
                &scores[(h + 1) * keys..][..keys],
            ];
            weighted_rows2(s, p, value, [o0, o1]);
            h += 2;
        }
        let rest = pairs.into_remainder();
        if !rest.is_empty() {
            weighted_rows(s, &scores[h * keys..][..keys], value, rest);
        }
    }
}

/// How many key rows ahead of the one being multiplied a decode-sized call prefetches
/// keys and values. A head's consecutive keys lie a cache row apart (2-4 KiB, at most two
/// to a page), which no hardware prefetcher follows, so without hints each key waits for
/// DRAM once the cache outgrows L3. Measured (`benches/attention.rs --decode 1000`, 2
/// threads, 28 layers' f16 caches, loaded Zen 5, one pass per key row already): 279-283 us
/// a layer without hints, 253-256 at 16 rows ahead, 253-264 at 48-192; quiet 2-core Zen 4
/// (`--prefetch-rows 0,4,8,16,32`): 441 us without, 368-404 at 4-32 rows ahead.
static PREFETCH_ROWS: AtomicUsize = AtomicUsize::new(16);

/// Sets [`PREFETCH_ROWS`] (0: no prefetching) for every later call in the process. For the
/// bench's tuning runs.
#[doc(hidden)]
pub fn set_attention_prefetch_rows(rows: usize) {
    PREFETCH_ROWS.store(rows, Ordering::Relaxed);
}

/// Hints the cache lines of `row` into L2 (a hint only: never faults, changes no result).
///
/// Into L2 (`T1`), not L1 (`T0`): a decode step issues a hint per cache line of every key
/// and value row a few rows ahead, and on Zen 4 hints into L1 stalled in the load queue
/// (`perf annotate`: the instruction after `prefetcht0` held a fifth of the kernel's
/// samples). `benches/attention.rs --decode 320|1000 --threads 2`, three alternated rounds
/// on the 2-core Zen 4 VM: 115-124 / 365-398 us a layer with `T0`, 95-112 / 307-363 with
/// `T1`; one thread at past 320: 207-221 -> 175 us. End to end (q4_0, 384 tokens after a
/// 128-token prompt, seven alternated pairs): median 51.8 -> 53.5 tok/s.
#[inline(always)]
fn prefetch<E>(row: &[E]) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = row.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(row);
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch hint of an address inside `row`; SSE is part of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.add(off))
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// The dot products of `q` with four rows.
#[inline(always)]
fn dot4<S: Simd, E: Widen>(s: S, q: &[f32], rows: [&[E]; 4]) -> [f32; 4] {
    let n = q.len();
    let mut acc = [s.splat(0.0); 4];
    let mut i = 0;
    while i + S::LANES <= n {
        let qv = s.load(&q[i..]);
        for (a, r) in acc.iter_mut().zip(&rows) {
            *a = s.fma(qv, E::load(s, &r[i..]), *a);
        }
        i += S::LANES;
    }
    if i < n {
        let qv = s.load_partial(&q[i..], 0.0);
        for (a, r) in acc.iter_mut().zip(&rows) {
            *a = s.fma(qv, E::load_partial(s, &r[i..]), *a);
        }
    }
    acc.map(|a| s.reduce_add(a))
}

/// The most vectors of `out` the weighted sums hold in registers at a time.
const MAX_ACCUMULATORS: usize = 8;

/// Vectors of `out` the weighted sums hold in registers across all the rows: a whole
/// 128-element head (8 vectors; 16 for two heads) where the ISA has 32 vector registers
/// (AVX-512), so that each value row is read in one pass: with 4 vectors, two passes each
/// read half of every row, 128 bytes every 2 KiB of the cache (a decode step's values on a
/// 2-core Zen 4 then streamed at ~10 GB/s). 4 on narrower ISAs (16 registers).
#[inline(always)]
fn accumulators<S: Simd>() -> usize {
    if S::LANES >= 16 {
        MAX_ACCUMULATORS
    } else {
        4
    }
}

/// `out = Σ_j p[j] · row(j)`, a slice of [`accumulators`] vectors of `out` at a time held in
/// registers across all the rows (rather than loaded and stored once per row).
#[inline(always)]
fn weighted_rows<'r, S: Simd, E: Widen + 'r>(
    s: S,
    p: &[f32],
    row: impl Fn(usize) -> &'r [E],
    out: &mut [f32],
) {
    let d = out.len();
    let block = accumulators::<S>() * S::LANES;
    let mut c = 0;
    while c < d {
        let width = block.min(d - c);
        let mut acc = [s.splat(0.0); MAX_ACCUMULATORS];
        for (j, &pj) in p.iter().enumerate() {
            let r = &row(j)[c..c + width];
            let pv = s.splat(pj);
            for (t, a) in acc.iter_mut().enumerate().take(accumulators::<S>()) {
                let at = t * S::LANES;
                if at + S::LANES <= width {
                    *a = s.fma(pv, E::load(s, &r[at..]), *a);
                } else if at < width {
                    *a = s.fma(pv, E::load_partial(s, &r[at..]), *a);
                }
            }
        }
        let o = &mut out[c..c + width];
        for (t, a) in acc.iter().enumerate().take(accumulators::<S>()) {
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

/// [`weighted_rows`] for two heads sharing the rows: `out[h] = Σ_j p[h][j] · row(j)`, each
/// row's vectors loaded once for both. Every output element is summed in the same order as
/// [`weighted_rows`] sums it, so the results are the same bits.
#[inline(always)]
fn weighted_rows2<'r, S: Simd, E: Widen + 'r>(
    s: S,
    p: [&[f32]; 2],
    row: impl Fn(usize) -> &'r [E],
    mut out: [&mut [f32]; 2],
) {
    let d = out[0].len();
    let block = accumulators::<S>() * S::LANES;
    let mut c = 0;
    while c < d {
        let width = block.min(d - c);
        let mut acc = [[s.splat(0.0); MAX_ACCUMULATORS]; 2];
        for (j, (&p0, &p1)) in p[0].iter().zip(p[1]).enumerate() {
            let r = &row(j)[c..c + width];
            let pv = [s.splat(p0), s.splat(p1)];
            for t in 0..accumulators::<S>() {
                let at = t * S::LANES;
                let x = if at + S::LANES <= width {
                    E::load(s, &r[at..])
                } else if at < width {
                    E::load_partial(s, &r[at..])
                } else {
                    break;
                };
                for (a, pv) in acc.iter_mut().zip(pv) {
                    a[t] = s.fma(pv, x, a[t]);
                }
            }
        }
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            let o = &mut o[c..c + width];
            for (t, a) in a.iter().enumerate().take(accumulators::<S>()) {
                let at = t * S::LANES;
                if at + S::LANES <= width {
                    s.store(&mut o[at..], *a);
                } else if at < width {
                    s.store_partial(&mut o[at..], *a);
                }
            }
        }
        c += width;
    }
}

#[inline(always)]
fn dot<S: Simd, E: Widen>(s: S, a: &[f32], b: &[E]) -> f32 {
    let n = a.len();
    let mut acc = [s.splat(0.0); 4];
    let mut i = 0;
    while i + 4 * S::LANES <= n {
        for (t, acc) in acc.iter_mut().enumerate() {
            let o = i + t * S::LANES;
            *acc = s.fma(s.load(&a[o..]), E::load(s, &b[o..]), *acc);
        }
        i += 4 * S::LANES;
    }
    while i + S::LANES <= n {
        acc[0] = s.fma(s.load(&a[i..]), E::load(s, &b[i..]), acc[0]);
        i += S::LANES;
    }
    if i < n {
        acc[1] = s.fma(
            s.load_partial(&a[i..], 0.0),
            E::load_partial(s, &b[i..]),
            acc[1],
        );
    }
    let sum = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    s.reduce_add(sum)
}

/// `out = x`, each element rounded to the nearest f16 (ties to even).
#[inline(always)]
fn round_f16<S: Simd>(s: S, x: &[f32], out: &mut [f32]) {
    let mut i = 0;
    while i + S::LANES <= x.len() {
        s.store(&mut out[i..], s.round_f16(s.load(&x[i..])));
        i += S::LANES;
    }
    if i < x.len() {
        s.store_partial(&mut out[i..], s.round_f16(s.load_partial(&x[i..], 0.0)));
    }
}

/// `p *= inv` (the softmax's normalisation), then each weight rounded to the nearest f16
/// when `to_f16`.
#[inline(always)]
fn scale_weights<S: Simd>(s: S, p: &mut [f32], inv: f32, to_f16: bool) {
    let vi = s.splat(inv);
    let mut i = 0;
    while i + S::LANES <= p.len() {
        let w = s.mul(s.load(&p[i..]), vi);
        s.store(&mut p[i..], if to_f16 { s.round_f16(w) } else { w });
        i += S::LANES;
    }
    for w in &mut p[i..] {
        *w *= inv;
        if to_f16 {
            *w = f16::from_f32(*w).to_f32();
        }
    }
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

    /// The definition, in f64, and per element a slack. With `f16_products` (an f16 cache),
    /// the queries and the normalised weights are rounded to f16 (ties to even) first; a
    /// weight within f32 noise (4e-6 relative) of a rounding boundary may round either way
    /// in the kernel, and the slack is what that can move the element (the weight's two
    /// candidate halves apart, times the value).
    fn reference(
        a: &CachedAttention,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        f16_products: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let round = |x: f64| f16::from_f64(x).to_f64();
        let d = a.head_dim;
        let (qw, kw) = (a.q_heads * d, a.kv_heads * d);
        let seq = q.len() / qw;
        let group = a.q_heads / a.kv_heads;
        let mut out = vec![0f64; q.len()];
        let mut slack = vec![0f64; q.len()];
        let qv = |x: f32| {
            if f16_products {
                round(x as f64)
            } else {
                x as f64
            }
        };
        for i in 0..seq {
            let pos = past + i;
            let lo = a.window.map_or(0, |w| pos.saturating_sub(w));
            for h in 0..a.q_heads {
                let g = h / group;
                let mut sc: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let s: f64 = (0..d)
                            .map(|t| qv(q[i * qw + h * d + t]) * k[j * kw + g * d + t] as f64)
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
                    let p = p / sum;
                    let (w, spread) = if f16_products {
                        let (below, above) = (round(p * (1.0 - 4e-6)), round(p * (1.0 + 4e-6)));
                        (round(p), above - below)
                    } else {
                        (p, 0.0)
                    };
                    for t in 0..d {
                        let x = v[j * kw + g * d + t] as f64;
                        out[i * qw + h * d + t] += w * x;
                        slack[i * qw + h * d + t] += spread * x.abs();
                    }
                }
            }
        }
        (out, slack)
    }

    /// The kernel against the definition, with an f32 cache and with the same cache
    /// rounded to f16 (round-to-nearest-even, as the graph's cast writes it; the definition
    /// then computes on the rounded values, with the f16 products' roundings).
    fn check(a: CachedAttention, seq: usize, past: usize, spare: usize) {
        let d = a.head_dim;
        let total = past + seq + spare;
        let q = data(seq * a.q_heads * d, 1);
        let k = data(total * a.kv_heads * d, 2);
        let v = data(total * a.kv_heads * d, 3);
        check_cache(&a, &q, &k, &v, seq, past);
        let halves = |x: &[f32]| x.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let (kh, vh) = (halves(&k), halves(&v));
        check_cache(&a, &q, &kh, &vh, seq, past);
    }

    fn check_cache<E: KvElement>(
        a: &CachedAttention,
        q: &[f32],
        k: &[E],
        v: &[E],
        seq: usize,
        past: usize,
    ) {
        let widen = |x: &[E]| x.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
        let f16_products = std::mem::size_of::<E>() == 2;
        let (want, slack) = reference(a, q, &widen(k), &widen(v), past, f16_products);
        if f16_products && past + seq > 1 {
            // The roundings matter at this tolerance: without them the definition differs
            // (with one key its weight is 1 and the output that key's value, rounded or not).
            let (exact, _) = reference(a, q, &widen(k), &widen(v), past, false);
            let moved = want.iter().zip(&exact).any(|(w, x)| (w - x).abs() > 1e-5);
            assert!(
                moved,
                "{a:?} seq {seq} past {past}: f16 roundings change nothing"
            );
        }
        let a = *a;
        for isa in simd::tests::isas() {
            for (threads, pack) in [(1, true), (3, true), (1, false), (3, false)] {
                let mut out = vec![f32::NAN; q.len()];
                let r = if threads == 1 {
                    attention_with(isa, &a, q, k, v, past, &mut out, &Sequential, pack)
                } else {
                    let par = ScopedThreads::new(threads);
                    attention_with(isa, &a, q, k, v, past, &mut out, &par, pack)
                };
                r.unwrap();
                for (i, ((&o, &w), &sl)) in out.iter().zip(&want).zip(&slack).enumerate() {
                    assert!(
                        (o as f64 - w).abs() <= 2e-6 * (1.0 + w.abs()) + sl,
                        "{a:?} seq {seq} past {past} {isa:?} x{threads} pack {pack} {}: element {i}: {o} vs {w}",
                        std::any::type_name::<E>()
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
        // An odd group (a pair of heads, then one), decoding past more keys than the
        // prefetch distance.
        check(attn(6, 2, 24), 1, 40, 0);
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
        let kh = vec![f16::ZERO; 16 * 3];
        let e = cached_attention(&a, &q, &kh, &kh, 3, &mut out, &Sequential).unwrap_err();
        assert!(e.to_string().contains("need 4 key rows"), "{e}");
    }

    /// The f16 widening loads against `half`'s conversion, full and partial, at every ISA:
    /// normals, subnormals, zeros of both signs, infinities.
    #[test]
    fn f16_loads_widen_exactly() {
        let bits: Vec<u16> = (0..40u16)
            .map(|i| match i {
                0 => 0x0000,
                1 => 0x8000,
                2 => 0x0001,
                3 => 0x83ff,
                4 => 0x7c00,
                5 => 0xfc00,
                6 => 0x7bff,
                _ => i.wrapping_mul(0x9e37) & 0x7bff | (i & 1) << 15,
            })
            .collect();
        let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
        let want: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        for isa in simd::tests::isas() {
            for n in 0..=h.len() {
                let mut got = vec![f32::NAN; n];
                widen_isa(isa, &h[..n], &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} n {n} element {i}");
                }
            }
        }
    }

    /// f16 rounding against `half`'s conversion (ties to even), full and partial, at every
    /// ISA: ties both ways, subnormals, overflow to infinity, NaN.
    #[test]
    fn f16_rounding_matches_half() {
        let mut x: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0 + 2f32.powi(-11),       // a tie: to 1.0 (even)
            1.0 + 3.0 * 2f32.powi(-11), // a tie: up to 1 + 2^-9
            2f32.powi(-24) * 0.5,       // half the smallest subnormal: to 0
            2f32.powi(-24) * 1.5,       // a subnormal tie: to 2 * 2^-24
            65504.0,
            65519.0,
            65520.0, // rounds to infinity
            -1e9,
            f32::INFINITY,
            f32::NAN,
        ];
        x.extend(data(45, 7).iter().map(|v| v * 3.0));
        let want: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        for isa in simd::tests::isas() {
            for n in 0..=x.len() {
                let mut got = vec![0.5f32; n];
                round_isa(isa, &x[..n], &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                    assert!(same, "{isa:?} n {n} element {i} ({}): {g} vs {w}", x[i]);
                }
            }
        }
    }

    simd_dispatch!(fn round_isa(x: &[f32], out: &mut [f32]) => round_f16);

    simd_dispatch!(fn widen_isa(x: &[f16], out: &mut [f32]) => widen_generic);

    #[inline(always)]
    fn widen_generic<S: Simd>(s: S, x: &[f16], out: &mut [f32]) {
        let mut i = 0;
        while i + S::LANES <= x.len() {
            s.store(&mut out[i..], f16::load(s, &x[i..]));
            i += S::LANES;
        }
        if i < x.len() {
            s.store_partial(&mut out[i..], f16::load_partial(s, &x[i..]));
        }
    }
}
