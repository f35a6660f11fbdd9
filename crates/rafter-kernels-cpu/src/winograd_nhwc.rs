//! 3×3 stride-1 convolution of channels-last (NHWC) activations by Winograd F(2×2, 3×3).
//!
//! The same algorithm as [`crate::conv3x3`] (see `winograd.rs`), with the roles of the GEMM
//! operands swapped, which channels-last makes natural:
//!
//! ```text
//! U[ξ][ci][co] = (G g Gᵀ)[ξ]         once per weight, packed as the GEMMs' B
//! V[ξ][t][ci]  = (Bᵀ d B)[ξ]         d: the 4×4 input tile t, vectorised over channels
//! M[ξ]         = V[ξ] · U[ξ]         16 GEMMs, tiles×Cin times Cin×Cout, A read in place
//! Y[t][co]     = Aᵀ M[·][t][co] A    the 2×2 output pixels, then the tail
//! ```
//!
//! Both transforms load and store whole vectors of channels (a pixel's channels are
//! contiguous), `V` is the GEMMs' row-major A as written (no packing), and `U` is packed
//! once into B panels, so no step of a call packs anything. Work is cut into blocks of
//! tiles whose `V` and `M` stay in the core's L2, times ranges of output channels; since
//! each block reads the whole transformed filter of its channels again, the cut is the
//! one of the least estimated time over the threads, which favours few large blocks
//! (`Split`).

use std::cell::RefCell;

use crate::buffer::{with_pair, Aligned, ScratchPair};
use crate::common::ChannelTail;
use crate::common::{check_isa, check_len, Disjoint};
use crate::nhwc::VecTail;
use crate::simd::Simd;
use crate::winograd::filter_tile;
use crate::{
    sgemm_with_isa, BRef, Epilogue, Isa, KernelError, MatMut, MatRef, PackedBRef, Parallel,
    Sequential, PACKED_B_NR,
};

/// Positions of a transformed 4×4 tile.
const XI: usize = 16;

/// 3×3 filters transformed for F(2×2, 3×3), per position `ξ` a `Cin × Cout` B packed into
/// the GEMM's panels. 16/9 the size of the filters.
#[derive(Clone, Debug)]
pub struct WinogradNhwcWeights {
    cin: usize,
    cout: usize,
    /// `XI` packed Bs, `per` floats each, 64-byte aligned like every packed B: the GEMM
    /// loads each panel row as one vector, which must not split cache lines.
    panels: Aligned,
    per: usize,
}

impl WinogradNhwcWeights {
    /// Transforms channels-last filters `w` of `3 × 3 × cin × cout` (`conv_nhwc`'s layout).
    pub fn new(w: &[f32], cin: usize, cout: usize) -> Result<WinogradNhwcWeights, KernelError> {
        let n = cin
            .checked_mul(cout)
            .and_then(|n| n.checked_mul(9))
            .ok_or_else(|| KernelError::Shape {
                what: "winograd nhwc".into(),
                detail: format!("{cin}x{cout} filters overflow"),
            })?;
        check_len("winograd nhwc filters", w.len(), n)?;
        // Each transformed value goes straight to its place in position ξ's B panels
        // (panel q: columns 16q..16q+16 as a row-major cin × 16 block, zero past cout), so
        // no unpacked copy of the transformed filter is ever held.
        let per = cout.div_ceil(PACKED_B_NR) * cin * PACKED_B_NR;
        let mut panels = Aligned::new(0, XI * per);
        let p = panels.as_mut_slice();
        for ci in 0..cin {
            for co in 0..cout {
                let g: [f32; 9] = std::array::from_fn(|t| w[(t * cin + ci) * cout + co]);
                let at =
                    (co / PACKED_B_NR) * cin * PACKED_B_NR + ci * PACKED_B_NR + co % PACKED_B_NR;
                for (xi, v) in filter_tile(&g).into_iter().enumerate() {
                    p[xi * per + at] = v;
                }
            }
        }
        Ok(WinogradNhwcWeights {
            cin,
            cout,
            panels,
            per,
        })
    }

    /// Input channels.
    pub fn cin(&self) -> usize {
        self.cin
    }

    /// Output channels.
    pub fn cout(&self) -> usize {
        self.cout
    }

    /// Position `xi`'s B, columns `co0..co1` (`co0` a multiple of the panel width).
    fn b(&self, xi: usize, co0: usize, co1: usize) -> PackedBRef<'_> {
        let panel = self.cin * PACKED_B_NR;
        let (q0, q1) = (co0 / PACKED_B_NR, co1.div_ceil(PACKED_B_NR));
        let base = xi * self.per;
        PackedBRef::from_panels(
            self.cin,
            co1 - co0,
            &self.panels.as_slice()[base + q0 * panel..base + q1 * panel],
        )
        .expect("a whole number of panels")
    }
}

/// One 3×3 stride-1 convolution of an HWC image, with its tail.
#[derive(Clone, Copy, Debug)]
pub struct Conv3x3Nhwc<'a> {
    /// `h × w × cin`.
    pub input: &'a [f32],
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Zero padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// The fused tail.
    pub tail: ChannelTail<'a>,
}

/// Bytes of `V` and `M` a block may hold: three quarters of the core's L2
/// ([`crate::cache_size::l2_bytes`]), the rest for the filter's panels streaming through.
fn block_bytes() -> usize {
    crate::cache_size::l2_bytes() / 4 * 3
}

/// What reading a byte of the transformed filter costs a task, in multiply-adds' time
/// (a multiply-add counted as two flops, as [`Split::task_cost`] counts them): every block
/// reads all of its part's filter again, mostly from the shared L3, and a block of few
/// tiles does too little with it to hide that. Fitted on the 2-core Xeon (ResNet-50's
/// stage-3 convolution, 256 channels over 14x14, its filter 4.2 MB transformed): on 2
/// threads 4 blocks of 12 tiles and one of 1 took 1.28-1.33x the time of 2 blocks of 25
/// (48 such convolutions 45.3-46.6 against 35.1-35.5 ms,
/// `benchmarks/results/cpu-xeon-2026-12-01-winograd/wino_ab.txt`); [`Split::makespan`]
/// puts them at 1.27x with this cost, at 1.15x with half of it.
const FILTER_BYTE_COST: usize = 2;

/// What transforming one input value costs a task, in the same units: its 16 outputs of
/// adds and subtracts, loaded and stored a vector at a time.
const TRANSFORM_COST: usize = 8;

thread_local! {
    /// A task's `V` and `M`, grown only, 64-byte aligned: the transforms store and load
    /// them a channel vector at a time, and the GEMMs write `M` in vectors. With the
    /// filters' panels aligned too, ResNet-50 ran at B/A 0.979 against `Vec<f32>`s
    /// (faster in 12 of 12 alternated `rafter bench` rounds, Zen 5).
    static BLOCK: ScratchPair = RefCell::new((Aligned::new(0, 0), Aligned::new(0, 0)));
}

/// How the tiles and output channels are cut into tasks.
#[derive(Clone, Copy, Debug)]
struct Split {
    /// Tiles per block.
    tiles: usize,
    blocks: usize,
    /// Output channel ranges per block.
    parts: usize,
}

impl Split {
    /// The cut of `tiles` tiles and `cout` output channels over `threads` threads whose
    /// blocks' `V` and `M` fit `budget` bytes.
    ///
    /// Every block reads the whole transformed filter of its channels again, and every
    /// part transforms its block's input again: of the cuts into blocks that fit and
    /// channel ranges of at least 32 (powers of two), the one of the least
    /// [`Split::task_cost`] times rounds of tasks over the threads, the fewest tasks on a
    /// tie ([`Split::makespan`]). A block count made only from the budget (ResNet-50's
    /// stage 3 on 2 threads with a 384 KiB budget: 12 tiles a block, 5 blocks, the last
    /// of 1 tile) read the filter 5 times where 2 blocks of 25 (a 2 MiB L2's budget) read
    /// it twice, 1.28-1.33x as fast ([`FILTER_BYTE_COST`]).
    fn new(tiles: usize, cin: usize, cout: usize, threads: usize, budget: usize) -> Split {
        let threads = threads.max(1);
        let per_tile = XI * (cin + cout) * 4;
        let most = (budget / per_tile.max(1)).clamp(6, 96).min(tiles).max(1);
        let fewest = tiles.div_ceil(most);
        // Blocks of the most tiles that fit (the last one shorter), or cut evenly into
        // up to a round more blocks than the fewest.
        let sizes = || {
            std::iter::once(most)
                .chain((fewest..=(fewest + threads).min(tiles.max(1))).map(|b| tiles.div_ceil(b)))
        };
        let mut best: Option<(usize, usize, Split)> = None;
        let mut parts = 1;
        loop {
            for block in sizes() {
                let split = Split {
                    tiles: block,
                    blocks: tiles.div_ceil(block),
                    parts,
                };
                let (cost, tasks) = (
                    split.makespan(tiles, cin, cout, threads),
                    split.blocks * parts,
                );
                if best.is_none_or(|(c, t, _)| (cost, tasks) < (c, t)) {
                    best = Some((cost, tasks, split));
                }
            }
            if fewest * parts >= threads || cout / (2 * parts) < 32 {
                break;
            }
            parts *= 2;
        }
        best.expect("at least one cut").2
    }

    /// The cut's time over `threads` threads, in [`Split::task_cost`]'s units: the full
    /// blocks' tasks in rounds, then the last block's (shorter) tasks, in the slots the
    /// last round of full ones left idle where they fit.
    fn makespan(&self, tiles: usize, cin: usize, cout: usize, threads: usize) -> usize {
        let last = tiles - (self.blocks - 1) * self.tiles;
        let (full_tasks, last_tasks) = if last == self.tiles {
            (self.blocks * self.parts, 0)
        } else {
            ((self.blocks - 1) * self.parts, self.parts)
        };
        let rounds = full_tasks.div_ceil(threads);
        let idle = rounds * threads - full_tasks;
        let spill = last_tasks.saturating_sub(idle).div_ceil(threads);
        let short = Split {
            tiles: last,
            ..*self
        };
        rounds * self.task_cost(cin, cout) + spill * short.task_cost(cin, cout)
    }

    /// One task's time in multiply-adds' time: its block's 16 GEMMs (`tiles x cin` times
    /// `cin x` its channels), its part of the transformed filter read
    /// ([`FILTER_BYTE_COST`]) and its block's input transformed ([`TRANSFORM_COST`]).
    fn task_cost(&self, cin: usize, cout: usize) -> usize {
        let channels = (0..self.parts)
            .map(|s| {
                let (a, b) = self.channels(s, cout);
                b - a
            })
            .max()
            .unwrap_or(cout);
        XI * cin
            * (channels * (2 * self.tiles + 4 * FILTER_BYTE_COST) + TRANSFORM_COST * self.tiles)
    }

    /// Output channels of part `s`, cut at panel boundaries.
    fn channels(&self, s: usize, cout: usize) -> (usize, usize) {
        let cut = |i: usize| {
            if i == self.parts {
                cout
            } else {
                (cout * i / self.parts) / PACKED_B_NR * PACKED_B_NR
            }
        };
        (cut(s), cut(s + 1))
    }
}

/// Computes the convolution into `out` (`oh × ow × cout`) on the fastest ISA.
pub fn conv3x3_nhwc(
    conv: &Conv3x3Nhwc<'_>,
    weights: &WinogradNhwcWeights,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    conv3x3_nhwc_with_isa(Isa::detect(), conv, weights, out, par)
}

/// [`conv3x3_nhwc`] on a given ISA.
pub fn conv3x3_nhwc_with_isa(
    isa: Isa,
    conv: &Conv3x3Nhwc<'_>,
    weights: &WinogradNhwcWeights,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    conv3x3_nhwc_in_blocks(isa, conv, weights, out, par, block_bytes())
}

/// [`conv3x3_nhwc_with_isa`] with blocks of `V` and `M` of at most `budget` bytes (the
/// tests cut the same convolution in several ways).
fn conv3x3_nhwc_in_blocks(
    isa: Isa,
    conv: &Conv3x3Nhwc<'_>,
    weights: &WinogradNhwcWeights,
    out: &mut [f32],
    par: &dyn Parallel,
    budget: usize,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let c = conv;
    let (cin, cout) = (weights.cin, weights.cout);
    let shape = |detail: String| KernelError::Shape {
        what: "winograd nhwc".into(),
        detail,
    };
    let oh = (c.h + c.pads[0] + c.pads[2]).checked_sub(2);
    let ow = (c.w + c.pads[1] + c.pads[3]).checked_sub(2);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(shape(format!(
            "a {}x{} input with pads {:?} is smaller than the 3x3 filter",
            c.h, c.w, c.pads
        )));
    };
    check_len("winograd nhwc input", c.input.len(), c.h * c.w * cin)?;
    check_len("winograd nhwc output", out.len(), oh * ow * cout)?;
    c.tail.check("winograd nhwc", cout, out.len())?;
    if out.is_empty() || cin == 0 {
        if cin == 0 && !out.is_empty() {
            return Err(shape("no input channels".into()));
        }
        return Ok(());
    }
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let tiles = th * tw;
    let split = Split::new(tiles, cin, cout, par.threads(), budget);
    let task = Task {
        c,
        weights,
        oh,
        ow,
        tw,
        tiles,
        split,
        out: Disjoint::new(out),
    };
    par.run(split.blocks * split.parts, &|i| {
        let (b, s) = (i / split.parts, i % split.parts);
        with_pair(&BLOCK, |(v, m)| task.run(isa, b, s, v, m))
    });
    Ok(())
}

struct Task<'a> {
    c: &'a Conv3x3Nhwc<'a>,
    weights: &'a WinogradNhwcWeights,
    oh: usize,
    ow: usize,
    tw: usize,
    tiles: usize,
    split: Split,
    out: Disjoint<'a>,
}

impl Task<'_> {
    /// Block `b`, output channels of part `s`: input transform, 16 GEMMs, output transform.
    fn run(&self, isa: Isa, b: usize, s: usize, v: &mut Aligned, m: &mut Aligned) {
        let (cin, cout) = (self.weights.cin, self.weights.cout);
        let t0 = b * self.split.tiles;
        let t1 = (t0 + self.split.tiles).min(self.tiles);
        let bt = t1 - t0;
        let (co0, co1) = self.split.channels(s, cout);
        let cp = co1 - co0;
        if bt == 0 || cp == 0 {
            return;
        }
        v.grow(XI * bt * cin);
        m.grow(XI * bt * cp);
        let (v, m) = (
            &mut v.as_mut_slice()[..XI * bt * cin],
            &mut m.as_mut_slice()[..XI * bt * cp],
        );
        input_isa(isa, self, t0..t1, v);
        for xi in 0..XI {
            let a = MatRef::row_major(&v[xi * bt * cin..(xi + 1) * bt * cin], bt, cin, cin)
                .expect("block shape");
            let c = MatMut::row_major(&mut m[xi * bt * cp..(xi + 1) * bt * cp], bt, cp, cp)
                .expect("block shape");
            let bref = BRef::Packed(self.weights.b(xi, co0, co1));
            sgemm_with_isa(isa, 1.0, a, bref, 0.0, c, &Epilogue::none(), &Sequential)
                .expect("shapes checked by construction");
        }
        output_isa(isa, self, t0..t1, (co0, co1), m);
    }
}

simd_dispatch!(fn input_isa(task: &Task<'_>, tiles: std::ops::Range<usize>, v: &mut [f32]) => transform_input);
simd_dispatch!(fn output_isa(task: &Task<'_>, tiles: std::ops::Range<usize>, co: (usize, usize), m: &[f32]) => transform_output);

/// `V[ξ][t][ci] = (Bᵀ d B)[ξ]` for the block's tiles, a vector of channels at a time.
/// `Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]`.
#[inline(always)]
fn transform_input<S: Simd>(s: S, task: &Task<'_>, tiles: std::ops::Range<usize>, v: &mut [f32]) {
    let c = task.c;
    let cin = task.weights.cin;
    let bt = tiles.len();
    let zero = s.splat(0.0);
    for (tl, t) in tiles.enumerate() {
        let (ty, tx) = (t / task.tw, t % task.tw);
        let iy0 = (2 * ty) as isize - c.pads[0] as isize;
        let ix0 = (2 * tx) as isize - c.pads[1] as isize;
        let inside = iy0 >= 0 && ix0 >= 0 && iy0 + 4 <= c.h as isize && ix0 + 4 <= c.w as isize;
        for c0 in (0..cin).step_by(S::LANES) {
            let lanes = S::LANES.min(cin - c0);
            let mut d = [zero; 16];
            for i in 0..4 {
                let iy = iy0 + i as isize;
                if !inside && (iy < 0 || iy >= c.h as isize) {
                    continue;
                }
                for j in 0..4 {
                    let ix = ix0 + j as isize;
                    if !inside && (ix < 0 || ix >= c.w as isize) {
                        continue;
                    }
                    let at = (iy as usize * c.w + ix as usize) * cin + c0;
                    d[i * 4 + j] = if lanes == S::LANES {
                        s.load(&c.input[at..])
                    } else {
                        s.load_partial(&c.input[at..at + lanes], 0.0)
                    };
                }
            }
            // Bᵀ d: rows.
            let mut r = [zero; 16];
            for j in 0..4 {
                let (d0, d1, d2, d3) = (d[j], d[4 + j], d[8 + j], d[12 + j]);
                r[j] = s.sub(d0, d2);
                r[4 + j] = s.add(d1, d2);
                r[8 + j] = s.sub(d2, d1);
                r[12 + j] = s.sub(d1, d3);
            }
            // (Bᵀ d) B: columns, stored at V[ξ][tl][c0..].
            for i in 0..4 {
                let (r0, r1, r2, r3) = (r[i * 4], r[i * 4 + 1], r[i * 4 + 2], r[i * 4 + 3]);
                let u = [s.sub(r0, r2), s.add(r1, r2), s.sub(r2, r1), s.sub(r1, r3)];
                for (j, &x) in u.iter().enumerate() {
                    let at = ((i * 4 + j) * bt + tl) * cin + c0;
                    if lanes == S::LANES {
                        s.store(&mut v[at..], x);
                    } else {
                        s.store_partial(&mut v[at..at + lanes], x);
                    }
                }
            }
        }
    }
}

/// `Y = Aᵀ M A` for the block's tiles and output channels `co`, with the tail.
/// `Aᵀ = [1 1 1 0; 0 1 -1 -1]`.
#[inline(always)]
fn transform_output<S: Simd>(
    s: S,
    task: &Task<'_>,
    tiles: std::ops::Range<usize>,
    (co0, co1): (usize, usize),
    m: &[f32],
) {
    let c = task.c;
    let cout = task.weights.cout;
    let cp = co1 - co0;
    let bt = tiles.len();
    let tail = VecTail::new(s, &c.tail);
    for (tl, t) in tiles.enumerate() {
        let (ty, tx) = (t / task.tw, t % task.tw);
        for k0 in (0..cp).step_by(S::LANES) {
            let lanes = S::LANES.min(cp - k0);
            let mut q = [s.splat(0.0); 16];
            for (xi, v) in q.iter_mut().enumerate() {
                let at = (xi * bt + tl) * cp + k0;
                *v = if lanes == S::LANES {
                    s.load(&m[at..])
                } else {
                    s.load_partial(&m[at..at + lanes], 0.0)
                };
            }
            // Aᵀ q: two rows of four.
            let mut r = [s.splat(0.0); 8];
            for j in 0..4 {
                let (q0, q1, q2, q3) = (q[j], q[4 + j], q[8 + j], q[12 + j]);
                r[j] = s.add(s.add(q0, q1), q2);
                r[4 + j] = s.sub(s.sub(q1, q2), q3);
            }
            let bias = tail.bias(s, c.tail.bias, co0 + k0, lanes);
            for dy in 0..2 {
                let oy = 2 * ty + dy;
                if oy >= task.oh {
                    break;
                }
                let (r0, r1, r2, r3) = (r[dy * 4], r[dy * 4 + 1], r[dy * 4 + 2], r[dy * 4 + 3]);
                let px = [s.add(s.add(r0, r1), r2), s.sub(s.sub(r1, r2), r3)];
                for (dx, &acc) in px.iter().enumerate() {
                    let ox = 2 * tx + dx;
                    if ox >= task.ow {
                        break;
                    }
                    let at = (oy * task.ow + ox) * cout + co0 + k0;
                    // SAFETY: tasks own disjoint (tile, channel range) pairs, so no two
                    // write the same output elements.
                    let out = unsafe { task.out.part(at..at + lanes) };
                    let res = c.tail.residual.map(|r| &r[at..at + lanes]);
                    tail.store(s, acc, bias, res, out, lanes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::winograd::tests::data;
    use crate::ScopedThreads;

    /// Direct NHWC 3×3 convolution in f64, with the tail.
    fn direct(c: &Conv3x3Nhwc<'_>, w: &[f32], cin: usize, cout: usize) -> Vec<f32> {
        let (oh, ow) = (
            c.h + c.pads[0] + c.pads[2] - 2,
            c.w + c.pads[1] + c.pads[3] - 2,
        );
        let mut y = vec![0f32; oh * ow * cout];
        for oy in 0..oh {
            for ox in 0..ow {
                for co in 0..cout {
                    let mut acc = 0f64;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let iy = (oy + ky) as isize - c.pads[0] as isize;
                            let ix = (ox + kx) as isize - c.pads[1] as isize;
                            if iy < 0 || ix < 0 || iy >= c.h as isize || ix >= c.w as isize {
                                continue;
                            }
                            for ci in 0..cin {
                                let xv = c.input[(iy as usize * c.w + ix as usize) * cin + ci];
                                acc += xv as f64 * w[((ky * 3 + kx) * cin + ci) * cout + co] as f64;
                            }
                        }
                    }
                    let i = (oy * ow + ox) * cout + co;
                    y[i] = c.tail.reference(acc, co, i) as f32;
                }
            }
        }
        y
    }

    fn case(cin: usize, cout: usize, h: usize, w: usize, pads: [usize; 4], tail: bool) {
        let x = data(h * w * cin, 1);
        let wt = data(9 * cin * cout, 2);
        let bias = data(cout, 3);
        let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
        let res = data(oh * ow * cout, 4);
        let conv = Conv3x3Nhwc {
            input: &x,
            h,
            w,
            pads,
            tail: ChannelTail {
                alpha: if tail { 0.5 } else { 1.0 },
                bias: tail.then_some(&bias[..]),
                residual: tail.then_some(&res[..]),
                res_before: cout.is_multiple_of(2),
                relu: tail,
                clamp: (tail && !cin.is_multiple_of(2)).then_some((0.0, 2.0)),
            },
        };
        let want = direct(&conv, &wt, cin, cout);
        let weights = WinogradNhwcWeights::new(&wt, cin, cout).unwrap();
        // Sums of |products| bound the rounding of any summation order.
        let scale = (cin * 9) as f32;
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
            if !isa.is_available() {
                continue;
            }
            // Blocks of the fewest tiles (6), of the fallback L2's budget, and one block.
            for (threads, budget) in [
                (1, 0),
                (3, 0),
                (1, 384 << 10),
                (3, 384 << 10),
                (3, 64 << 20),
            ] {
                let mut y = vec![f32::NAN; want.len()];
                let par = ScopedThreads::new(threads);
                conv3x3_nhwc_in_blocks(isa, &conv, &weights, &mut y, &par, budget).unwrap();
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale * (1.0 + b.abs()),
                        "{isa:?} {cin}->{cout} {h}x{w} {pads:?} tail {tail} threads {threads} \
                         budget {budget}: [{i}] {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn matches_direct_convolution() {
        // ResNet's pad-1 shape, odd sizes (partial tiles), channel counts that leave
        // partial vectors and partial panels, no padding and uneven padding, several
        // blocks (many tiles with many channels) and split output channels (few tiles).
        case(16, 32, 8, 8, [1; 4], true);
        case(5, 7, 7, 9, [1; 4], true);
        case(19, 33, 5, 4, [0, 1, 2, 0], false);
        case(8, 8, 3, 3, [0; 4], true);
        case(64, 48, 30, 30, [1; 4], true);
        case(64, 128, 4, 4, [1; 4], false);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let w = data(9 * 4 * 4, 1);
        let e = WinogradNhwcWeights::new(&w[..10], 4, 4).unwrap_err();
        assert!(e.to_string().contains("filters"), "{e}");
        let weights = WinogradNhwcWeights::new(&w, 4, 4).unwrap();
        let x = data(5 * 5 * 4, 2);
        let conv = Conv3x3Nhwc {
            input: &x,
            h: 5,
            w: 5,
            pads: [0; 4],
            tail: ChannelTail::default(),
        };
        let mut y = vec![0f32; 9 * 4 + 1];
        let e = conv3x3_nhwc(&conv, &weights, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("output"), "{e}");
        let small = Conv3x3Nhwc {
            h: 1,
            w: 1,
            input: &x[..4],
            ..conv
        };
        let e = conv3x3_nhwc(&small, &weights, &mut y, &Sequential).unwrap_err();
        assert!(e.to_string().contains("smaller"), "{e}");
    }

    /// Every cut covers each tile and output channel once, in blocks that fit the budget
    /// (or of the fewest tiles, 6) and channel ranges of at least 32.
    #[test]
    fn a_split_covers_every_tile_and_channel_in_blocks_that_fit() {
        for tiles in [1, 4, 49, 196, 784] {
            for c in [16, 64, 256, 512] {
                for threads in [1, 2, 3, 16] {
                    for budget in [32 << 10, 384 << 10, 1536 << 10] {
                        let s = Split::new(tiles, c, c, threads, budget);
                        let what = format!(
                            "{tiles} tiles, {c} channels, {threads} threads, {budget} B: {s:?}"
                        );
                        assert!(
                            s.blocks * s.tiles >= tiles && (s.blocks - 1) * s.tiles < tiles,
                            "{what}"
                        );
                        let fit = (budget / (XI * 2 * c * 4)).clamp(6, 96);
                        assert!(s.tiles <= fit, "{what}");
                        assert!(s.parts.is_power_of_two(), "{what}");
                        assert!(s.parts == 1 || c / s.parts >= 32, "{what}");
                        let mut next = 0;
                        for part in 0..s.parts {
                            let (a, b) = s.channels(part, c);
                            assert_eq!(a, next, "{what}");
                            next = b;
                        }
                        assert_eq!(next, c, "{what}");
                    }
                }
            }
        }
    }

    /// ResNet-50's stage-3 convolution (256 channels over 14x14: 49 tiles) with a 2 MiB L2:
    /// 2 blocks of 25 tiles, which read the 4.2 MB transformed filter twice (a budget-only
    /// cut took 5 blocks, the last of 1 tile, and ran 1.33x as long on 2 threads). On 16
    /// threads the 2 blocks are cut into channel ranges, one task a thread.
    #[test]
    fn few_large_blocks_read_the_filter_few_times() {
        let s = Split::new(49, 256, 256, 2, 1536 << 10);
        assert_eq!((s.tiles, s.blocks, s.parts), (25, 2, 1), "{s:?}");
        let s = Split::new(49, 256, 256, 16, 1536 << 10);
        assert_eq!((s.blocks, s.blocks * s.parts), (2, 16), "{s:?}");
        // One thread: the fewest blocks that fit (12 tiles of 32 KiB in 384 KiB).
        let s = Split::new(49, 256, 256, 1, 384 << 10);
        assert_eq!((s.blocks, s.parts), (5, 1), "{s:?}");
        // Two threads, the same budget: 4 full blocks in 2 rounds, the 1-tile one in the
        // round's idle slot, against 6 even blocks of 9 in 3 rounds.
        let s = Split::new(49, 256, 256, 2, 384 << 10);
        assert_eq!((s.tiles, s.blocks, s.parts), (12, 5, 1), "{s:?}");
    }
}
