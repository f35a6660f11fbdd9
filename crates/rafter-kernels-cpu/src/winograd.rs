//! 3×3 stride-1 convolution by Winograd's minimal filtering, F(2×2, 3×3).
//!
//! Why: ResNet-style networks spend about half their multiply-adds in 3×3 stride-1
//! convolutions. As im2col + GEMM each output needs 9·Cin multiply-adds; F(2×2, 3×3)
//! computes a 2×2 output tile from a 4×4 input tile with 16 products per input channel
//! instead of 36, so the GEMM work drops 2.25× (the tile transforms are linear in the
//! tensor sizes, not in Cin·Cout).
//!
//! ```text
//! U[ξ][co][ci] = (G g G^T)[ξ]        g: the 3×3 filter, once per weight (WinogradWeights)
//! V[ξ][ci][t]  = (B^T d B)[ξ]        d: the 4×4 input tile t (zero outside the input)
//! M[ξ]         = U[ξ] · V[ξ]         16 GEMMs, Cout×Cin times Cin×tiles
//! Y[co][t]     = A^T M[·][co][t] A   the 2×2 output tile, then bias / relu / residual
//! ```
//!
//! The work is cut into tasks of a few tile rows (and output channels), each running the
//! three steps on its block while it is in cache: the input transform writes `V` straight
//! in the GEMM's packed-panel layout, so nothing is packed per call. Both transforms are
//! vectorised over a tile row's tiles (`Simd`). Against the earlier whole-tensor passes
//! (16 GEMMs over the whole image, `V` packed by the GEMM, scalar transforms), 2 threads,
//! `cargo bench -p rafter-kernels-cpu --bench winograd`: 64 channels 56×56 0.95 → 0.85 ms,
//! 128 at 28×28 1.00 → 0.90, 256 at 14×14 1.20 → 0.77, 512 at 7×7 1.55 → 0.82.
//!
//! With these transforms (Lavin & Gray 2015) the products are exact up to rounding; the
//! result differs from direct convolution by a few ulps of the sum of absolute products,
//! like any other summation order.

use std::cell::RefCell;
use std::sync::Mutex;

use crate::buffer::Aligned;
use crate::common::Disjoint;
use crate::kernel::PANEL;
use crate::parallel::{Parallel, Sequential};
use crate::simd::{copy, Simd};
use crate::{sgemm, BRef, Epilogue, Isa, MatMut, MatRef, PackedBRef};

/// Positions of a transformed 4×4 tile.
const XI: usize = 16;

/// 3×3 filters transformed for F(2×2, 3×3): `[16][cout][cin]`, each position a row-major
/// Cout×Cin matrix (the GEMMs' A operand). 16/9 the size of the filters.
#[derive(Clone, Debug)]
pub struct WinogradWeights {
    cout: usize,
    cin: usize,
    data: Vec<f32>,
}

impl WinogradWeights {
    /// Transforms OIHW filters `w` of `cout × cin × 3 × 3`.
    pub fn new(w: &[f32], cout: usize, cin: usize) -> Result<WinogradWeights, String> {
        let n = cout
            .checked_mul(cin)
            .and_then(|n| n.checked_mul(9))
            .ok_or("winograd: filter size overflows")?;
        if w.len() != n {
            return Err(format!(
                "winograd: filters hold {} values, {cout}x{cin}x3x3 needs {n}",
                w.len()
            ));
        }
        let mut data = vec![0f32; XI * cout * cin];
        for co in 0..cout {
            for ci in 0..cin {
                let g: &[f32; 9] = w[(co * cin + ci) * 9..][..9].try_into().expect("9");
                for (xi, v) in filter_tile(g).into_iter().enumerate() {
                    data[(xi * cout + co) * cin + ci] = v;
                }
            }
        }
        Ok(WinogradWeights { cout, cin, data })
    }

    /// Output channels.
    pub fn cout(&self) -> usize {
        self.cout
    }

    /// Input channels.
    pub fn cin(&self) -> usize {
        self.cin
    }
}

/// `G g Gᵀ` of one 3×3 filter `g` (row-major), row-major 4×4:
/// `G = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1]`.
pub(crate) fn filter_tile(g: &[f32; 9]) -> [f32; 16] {
    let mut gg = [[0f32; 3]; 4];
    for c in 0..3 {
        let (a, b, d) = (g[c], g[3 + c], g[6 + c]);
        gg[0][c] = a;
        gg[1][c] = 0.5 * (a + b + d);
        gg[2][c] = 0.5 * (a - b + d);
        gg[3][c] = d;
    }
    let mut u = [0f32; 16];
    for (r, row) in gg.iter().enumerate() {
        let (a, b, d) = (row[0], row[1], row[2]);
        u[r * 4..r * 4 + 4].copy_from_slice(&[a, 0.5 * (a + b + d), 0.5 * (a - b + d), d]);
    }
    u
}

/// One 3×3 stride-1 convolution of a CHW image.
#[derive(Clone, Copy, Debug)]
pub struct Conv3x3<'a> {
    /// The input, `cin × h × w`.
    pub input: &'a [f32],
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Zero padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Per output channel, added to every output of the channel.
    pub bias: Option<&'a [f32]>,
    /// A tensor of the output's shape added before the relu (a skip connection).
    pub residual: Option<&'a [f32]>,
    /// `max(x, 0)` last.
    pub relu: bool,
}

impl Conv3x3<'_> {
    /// Output height and width.
    pub fn out_dims(&self) -> Result<(usize, usize), String> {
        let oh = (self.h + self.pads[0] + self.pads[2]).checked_sub(2);
        let ow = (self.w + self.pads[1] + self.pads[3]).checked_sub(2);
        match (oh, ow) {
            (Some(oh), Some(ow)) if oh > 0 && ow > 0 => Ok((oh, ow)),
            _ => Err(format!(
                "winograd: a {}x{} input with pads {:?} is smaller than the 3x3 filter",
                self.h, self.w, self.pads
            )),
        }
    }
}

/// Tiles a task aims for: 16 GEMMs of `Cout × Cin × tiles` per task, whose transformed
/// input (16·Cin·tiles floats) and products stay in the core's 2 MiB L2 for up to Cin = 256.
const BLOCK_TILES: usize = 96;

thread_local! {
    /// A task's transformed input (`V`, packed panels), products (`M`) and the input
    /// transform's rows, grown only, so
    /// a convolution called once per inference allocates nothing in steady state.
    static BLOCK: RefCell<(Aligned, Aligned, Vec<f32>)> =
        RefCell::new((Aligned::new(0, 0), Aligned::new(0, 0), Vec::new()));
}

/// How a convolution's work is cut into tasks: blocks of whole tile rows (so a task writes
/// whole output rows), times ranges of output channels when there are too few blocks to
/// keep every thread busy (each such task transforms its block's input again).
#[derive(Clone, Copy, Debug)]
struct Split {
    /// Tile rows per block.
    rows: usize,
    blocks: usize,
    /// Output channel ranges per block.
    parts: usize,
}

impl Split {
    fn new(th: usize, tw: usize, cout: usize, threads: usize) -> Split {
        let rows = (BLOCK_TILES / tw).clamp(1, th);
        let blocks = th.div_ceil(rows);
        let mut parts = 1;
        // One task per thread at least, output ranges of at least 32 channels (several
        // 12-row micro-tiles each). Not two per thread: every part transforms the whole
        // block's input again, and 256 channels at 14×14 took 1.03–1.15 ms in four parts
        // against 0.61–0.62 in two (`cargo bench -p rafter-kernels-cpu --bench winograd`,
        // 2 threads, alternated builds).
        while blocks * parts < threads && cout / (2 * parts) >= 32 {
            parts *= 2;
        }
        Split {
            rows,
            blocks,
            parts,
        }
    }

    /// Output channels `co0..co1` of part `s`.
    fn channels(&self, s: usize, cout: usize) -> (usize, usize) {
        (cout * s / self.parts, cout * (s + 1) / self.parts)
    }
}

/// Computes the convolution into `out` (`cout × oh × ow`), work split by `par`.
///
/// Each task takes a block of tile rows and a range of output channels and runs the whole
/// pipeline on it while it is in cache: the input transform writes `V` straight into the
/// GEMM's packed-B panels (no packing pass), 16 single-threaded GEMMs multiply the
/// transformed filters (read in place) by them, and the output transform applies the
/// epilogue as it writes whole output rows.
pub fn conv3x3(
    conv: &Conv3x3<'_>,
    weights: &WinogradWeights,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), String> {
    conv3x3_with_isa(Isa::detect(), conv, weights, out, par)
}

/// [`conv3x3`] with the transforms on `isa` (which must be available).
fn conv3x3_with_isa(
    isa: Isa,
    conv: &Conv3x3<'_>,
    weights: &WinogradWeights,
    out: &mut [f32],
    par: &dyn Parallel,
) -> Result<(), String> {
    let (cin, cout) = (weights.cin, weights.cout);
    let (h, w) = (conv.h, conv.w);
    let (oh, ow) = conv.out_dims()?;
    let check = |what: &str, len: usize, want: usize| {
        if len == want {
            Ok(())
        } else {
            Err(format!("winograd: {what} holds {len} values, needs {want}"))
        }
    };
    check("input", conv.input.len(), cin * h * w)?;
    check("output", out.len(), cout * oh * ow)?;
    if let Some(b) = conv.bias {
        check("bias", b.len(), cout)?;
    }
    if let Some(r) = conv.residual {
        check("residual", r.len(), cout * oh * ow)?;
    }
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let split = Split::new(th, tw, cout, par.threads());
    let y = Disjoint::new(out);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    par.run(split.blocks * split.parts, &|t| {
        let (b, s) = (t / split.parts, t % split.parts);
        let ty0 = b * split.rows;
        let ty1 = (ty0 + split.rows).min(th);
        let (co0, co1) = split.channels(s, cout);
        let task = Task {
            isa,
            conv,
            weights,
            out: &y,
            oh,
            ow,
            tw,
            ty: (ty0, ty1),
            co: (co0, co1),
        };
        if let Err(e) = task.run() {
            failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    });
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One task: tile rows `ty` and output channels `co` of a convolution.
struct Task<'a> {
    isa: Isa,
    conv: &'a Conv3x3<'a>,
    weights: &'a WinogradWeights,
    out: &'a Disjoint<'a>,
    oh: usize,
    ow: usize,
    tw: usize,
    ty: (usize, usize),
    co: (usize, usize),
}

impl Task<'_> {
    fn run(&self) -> Result<(), String> {
        let cin = self.weights.cin;
        let tiles = (self.ty.1 - self.ty.0) * self.tw;
        let panels = tiles.div_ceil(PANEL);
        let v_len = XI * panels * cin * PANEL;
        let m_len = XI * (self.co.1 - self.co.0) * tiles;
        // The output transform's last vectors may read up to a vector (16 floats) past M.
        let m_slack = 16;
        let go = |v: &mut Aligned, m: &mut Aligned, work: &mut Vec<f32>| {
            grow(v, v_len);
            grow(m, m_len + m_slack);
            let (v, m) = (
                &mut v.as_mut_slice()[..v_len],
                &mut m.as_mut_slice()[..m_len + m_slack],
            );
            input_isa(self.isa, self, v, panels, work);
            self.multiply(v, m, tiles, panels)?;
            output_isa(self.isa, self, m, tiles);
            Ok(())
        };
        BLOCK.with(|cell| match cell.try_borrow_mut() {
            Ok(mut bufs) => {
                let (v, m, work) = &mut *bufs;
                go(v, m, work)
            }
            Err(_) => go(
                &mut Aligned::new(0, 0),
                &mut Aligned::new(0, 0),
                &mut Vec::new(),
            ),
        })
    }

    /// `M[ξ] = U[ξ] · V[ξ]` for the task's output channels: 16 GEMMs on this thread, the
    /// filters read in place (row-major A), the transformed input as packed B.
    fn multiply(
        &self,
        v: &[f32],
        m: &mut [f32],
        tiles: usize,
        panels: usize,
    ) -> Result<(), String> {
        let (cin, cout) = (self.weights.cin, self.weights.cout);
        let (co0, co1) = self.co;
        let rows = co1 - co0;
        for xi in 0..XI {
            let err = |e: crate::GemmError| format!("winograd GEMM {xi}: {e}");
            let a = MatRef::row_major(
                &self.weights.data[(xi * cout + co0) * cin..][..rows * cin],
                rows,
                cin,
                cin,
            )
            .map_err(err)?;
            let b = PackedBRef::from_panels(
                cin,
                tiles,
                &v[xi * panels * cin * PANEL..][..panels * cin * PANEL],
            )
            .map_err(|e| format!("winograd GEMM {xi}: {e}"))?;
            let c = MatMut::row_major(
                &mut m[xi * rows * tiles..][..rows * tiles],
                rows,
                tiles,
                tiles,
            )
            .map_err(err)?;
            sgemm(
                1.0,
                a,
                BRef::Packed(b),
                0.0,
                c,
                &Epilogue::none(),
                &Sequential,
            )
            .map_err(err)?;
        }
        Ok(())
    }
}

simd_dispatch!(fn input_isa(task: &Task<'_>, v: &mut [f32], panels: usize, work: &mut Vec<f32>) => transform_input);
simd_dispatch!(fn output_isa(task: &Task<'_>, m: &[f32], tiles: usize) => transform_output);

/// `V[ξ][ci][t] = (B^T d B)[ξ]` for every input channel and tile of the task's block,
/// written as the panels of 16 tiles that the GEMM streams: `v[ξ][t / 16][ci][t % 16]`.
///
/// Per channel and tile row: the 4 input rows under it, zero-padded and split into even
/// and odd columns (so a tile's columns a b c d are `e[t] o[t] e[t+1] o[t+1]`), their
/// horizontal combinations, then the vertical ones into `vals[ξ][t]`, all in whole vectors
/// over the row's tiles; then each 16-tile run is copied into its panel.
#[inline(always)]
fn transform_input<S: Simd>(
    s: S,
    task: &Task<'_>,
    v: &mut [f32],
    panels: usize,
    work: &mut Vec<f32>,
) {
    let l = S::LANES;
    let (conv, tw, cin) = (task.conv, task.tw, task.weights.cin);
    let (h, w) = (conv.h, conv.w);
    let (pt, pl) = (conv.pads[0] as isize, conv.pads[1]);
    // Tiles per row rounded up to whole vectors; even/odd rows one vector longer (t + 1).
    let twv = tw.div_ceil(l) * l;
    let span = panels * PANEL;
    // A tile row's vectors may run `twv - tw` past its tiles, into the next row's (written
    // after) or past the block's end.
    let stride = span + twv;
    // The block's input rows for one channel, zero-padded: padded row rr is input row
    // 2 ty0 + rr - pt, padded column k input column k - pl (rows long enough for the last
    // vector's reads at 2 t + 2 + lanes). Padding stays zero across channels: only the
    // input's own columns of its own rows are ever written.
    let region_rows = 2 * (task.ty.1 - task.ty.0) + 2;
    let rw = 2 * twv + 2 * l;
    work.resize(XI * stride + region_rows * rw, 0.0);
    let (vals, region) = work.split_at_mut(XI * stride);
    region.fill(0.0);
    let input_rows: Vec<(usize, usize)> = (0..region_rows)
        .filter_map(|rr| {
            let y = (2 * task.ty.0 + rr) as isize - pt;
            (y >= 0 && (y as usize) < h).then_some((rr, y as usize))
        })
        .collect();
    for ci in 0..cin {
        let plane = &conv.input[ci * h * w..][..h * w];
        // Copied whole before any row is read back, so the reads below do not wait on
        // just-issued stores.
        for &(rr, y) in &input_rows {
            copy(s, &plane[y * w..][..w], &mut region[rr * rw + pl..][..w]);
        }
        for ty in task.ty.0..task.ty.1 {
            let l0 = (ty - task.ty.0) * tw;
            for t in (0..twv).step_by(l) {
                // Per input row: a tile's columns a b c d are even[t], odd[t], even[t + 1],
                // odd[t + 1] of the padded row; B = [1 0 0 0; 0 1 -1 1; -1 1 1 0; 0 0 0 -1]
                // on them: a - c, b + c, c - b, b - d.
                // (No closures here: a closure is compiled without this function's target
                // features, and its intrinsics would become calls; see `simd`'s macros.)
                let mut hz = [[s.splat(0.0); 4]; 4];
                for (r, hr) in hz.iter_mut().enumerate() {
                    let src = &region[(2 * (ty - task.ty.0) + r) * rw..][..rw];
                    let (e0, o0) = s.deinterleave(s.load(&src[2 * t..]), s.load(&src[2 * t + l..]));
                    let (e1, o1) =
                        s.deinterleave(s.load(&src[2 * t + 2..]), s.load(&src[2 * t + 2 + l..]));
                    *hr = [s.sub(e0, e1), s.add(o0, e1), s.sub(e1, o0), s.sub(o0, o1)];
                }
                // B^T on the rows: r0 - r2, r1 + r2, r2 - r1, r1 - r3; ξ = 4 k + j.
                let [h0, h1, h2, h3] = hz;
                for (j, (((r0, r1), r2), r3)) in h0.into_iter().zip(h1).zip(h2).zip(h3).enumerate()
                {
                    let at = |k: usize| (4 * k + j) * stride + l0 + t;
                    s.store(&mut vals[at(0)..], s.sub(r0, r2));
                    s.store(&mut vals[at(1)..], s.add(r1, r2));
                    s.store(&mut vals[at(2)..], s.sub(r2, r1));
                    s.store(&mut vals[at(3)..], s.sub(r1, r3));
                }
            }
        }
        for xi in 0..XI {
            for q in 0..panels {
                let at = ((xi * panels + q) * cin + ci) * PANEL;
                let src = &vals[xi * stride + q * PANEL..][..PANEL];
                copy(s, src, &mut v[at..at + PANEL]);
            }
        }
    }
}

/// `Y = A^T M A` per output channel and tile of the task's block, then bias, residual and
/// relu, written as whole output rows: per channel and tile row, the column combinations
/// over the row's tiles, the row combinations interleaved into the output row pair, then
/// the epilogue, all in whole vectors.
#[inline(always)]
fn transform_output<S: Simd>(s: S, task: &Task<'_>, m: &[f32], tiles: usize) {
    let l = S::LANES;
    let (conv, tw, oh, ow) = (task.conv, task.tw, task.oh, task.ow);
    let (co0, co1) = task.co;
    let rows = co1 - co0;
    let (y0, y1) = (2 * task.ty.0, (2 * task.ty.1).min(oh));
    let twv = tw.div_ceil(l) * l;
    // top[j], bottom[j]: 4 rows each; pair: the two output rows (2 twv each).
    let mut buf = vec![0f32; 8 * twv + 4 * twv];
    let (tb, pair) = buf.split_at_mut(8 * twv);
    let zero = s.splat(0.0);
    for co in co0..co1 {
        // SAFETY: tasks own disjoint (channel, tile row) ranges (`Split`), so output rows
        // y0..y1 of channel `co` are written by this task alone.
        let dst = unsafe { task.out.part((co * oh + y0) * ow..(co * oh + y1) * ow) };
        let bias = s.splat(conv.bias.map_or(0.0, |b| b[co]));
        let res = conv
            .residual
            .map(|r| &r[(co * oh + y0) * ow..(co * oh + y1) * ow]);
        for ty in task.ty.0..task.ty.1 {
            let l0 = (ty - task.ty.0) * tw;
            // A^T = [1 1 1 0; 0 1 -1 -1] on the rows of the 4×4 product. (Reads past the
            // row's tiles land in the next row or the buffer's slack: `Task::run`.)
            for j in 0..4 {
                for t in (0..twv).step_by(l) {
                    let at = |xi: usize| (xi * rows + co - co0) * tiles + l0 + t;
                    let (m0, m1) = (s.load(&m[at(j)..]), s.load(&m[at(4 + j)..]));
                    let (m2, m3) = (s.load(&m[at(8 + j)..]), s.load(&m[at(12 + j)..]));
                    s.store(&mut tb[j * twv + t..], s.add(s.add(m0, m1), m2));
                    s.store(&mut tb[(4 + j) * twv + t..], s.sub(s.sub(m1, m2), m3));
                }
            }
            // Then on its columns, interleaved into the output row pair.
            for r in 0..2 {
                let q = &tb[4 * r * twv..][..4 * twv];
                let p = &mut pair[2 * r * twv..][..2 * twv];
                for t in (0..twv).step_by(l) {
                    let (q0, q1) = (s.load(&q[t..]), s.load(&q[twv + t..]));
                    let (q2, q3) = (s.load(&q[2 * twv + t..]), s.load(&q[3 * twv + t..]));
                    let even = s.add(s.add(q0, q1), q2);
                    let odd = s.sub(s.sub(q1, q2), q3);
                    let (lo, hi) = s.interleave(even, odd);
                    s.store(&mut p[2 * t..], lo);
                    s.store(&mut p[2 * t + l..], hi);
                }
            }
            for r in 0..2 {
                let oy = 2 * ty + r;
                if oy >= oh {
                    continue;
                }
                let at = (oy - y0) * ow;
                let d = &mut dst[at..at + ow];
                let src = &pair[2 * r * twv..];
                let rrow = res.map(|res| &res[at..at + ow]);
                for x in (0..ow).step_by(l) {
                    let full = x + l <= ow;
                    let mut vv = s.add(s.load(&src[x..]), bias);
                    if let Some(rr) = rrow {
                        let rv = if full {
                            s.load(&rr[x..])
                        } else {
                            s.load_partial(&rr[x..], 0.0)
                        };
                        vv = s.add(vv, rv);
                    }
                    if conv.relu {
                        // `x < 0 ? 0 : x` keeps NaN, like the reference's relu.
                        vv = s.select_lt(vv, zero, zero, vv);
                    }
                    if full {
                        s.store(&mut d[x..], vv);
                    } else {
                        s.store_partial(&mut d[x..], vv);
                    }
                }
            }
        }
    }
}

/// Grows `buf` to at least `len` floats (contents unspecified).
fn grow(buf: &mut Aligned, len: usize) {
    if buf.as_slice().len() < len {
        *buf = Aligned::new(0, len);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ScopedThreads;

    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Direct convolution in f64, with the absolute-product sum for the tolerance.
    #[allow(clippy::too_many_arguments)]
    fn direct(
        x: &[f32],
        wts: &[f32],
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        pads: [usize; 4],
        bias: Option<&[f32]>,
        residual: Option<&[f32]>,
        relu: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
        let mut y = vec![0f64; cout * oh * ow];
        let mut mag = vec![0f64; cout * oh * ow];
        for co in 0..cout {
            for oy in 0..oh {
                for ox in 0..ow {
                    let i = (co * oh + oy) * ow + ox;
                    let mut s = bias.map_or(0.0, |b| b[co] as f64);
                    let mut a = s.abs();
                    for ci in 0..cin {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let iy = oy as isize + ky as isize - pads[0] as isize;
                                let ix = ox as isize + kx as isize - pads[1] as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= w {
                                    continue;
                                }
                                let p = x[(ci * h + iy as usize) * w + ix as usize] as f64
                                    * wts[((co * cin + ci) * 3 + ky) * 3 + kx] as f64;
                                s += p;
                                a += p.abs();
                            }
                        }
                    }
                    if let Some(r) = residual {
                        s += r[i] as f64;
                        a += (r[i] as f64).abs();
                    }
                    y[i] = if relu { s.max(0.0) } else { s };
                    mag[i] = a;
                }
            }
        }
        (y, mag)
    }

    fn case(cin: usize, cout: usize, h: usize, w: usize, pads: [usize; 4], epi: bool) {
        let x = data(cin * h * w, 1);
        let wts = data(cout * cin * 9, 2);
        let bias = data(cout, 3);
        let (oh, ow) = (h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2);
        let res = data(cout * oh * ow, 4);
        let conv = Conv3x3 {
            input: &x,
            h,
            w,
            pads,
            bias: epi.then_some(&bias[..]),
            residual: epi.then_some(&res[..]),
            relu: epi,
        };
        let ww = WinogradWeights::new(&wts, cout, cin).unwrap();
        for isa in crate::simd::tests::isas() {
            let mut out = vec![f32::NAN; cout * oh * ow];
            conv3x3_with_isa(isa, &conv, &ww, &mut out, &ScopedThreads::new(3)).unwrap();
            check(&conv, &x, &wts, (cin, cout), (h, w), pads, &out, isa);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        conv: &Conv3x3<'_>,
        x: &[f32],
        wts: &[f32],
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        pads: [usize; 4],
        out: &[f32],
        isa: Isa,
    ) {
        let (want, mag) = direct(
            x,
            wts,
            (cin, cout),
            (h, w),
            pads,
            conv.bias,
            conv.residual,
            conv.relu,
        );
        for i in 0..out.len() {
            // The transforms add a few roundings per term on top of the summation's.
            let tol = 16.0 * f32::EPSILON as f64 * mag[i] + 1e-6;
            assert!(
                (out[i] as f64 - want[i]).abs() <= tol,
                "{isa:?} {cin}->{cout} {h}x{w} pads {pads:?}: out[{i}] = {}, want {}",
                out[i],
                want[i]
            );
        }
    }

    #[test]
    fn matches_direct_convolution() {
        case(3, 5, 8, 8, [1, 1, 1, 1], false);
        case(4, 6, 7, 9, [1, 1, 1, 1], true); // odd output sizes: partial tiles
        case(2, 3, 5, 6, [0, 0, 0, 0], true); // no padding
        case(16, 8, 14, 14, [1, 1, 1, 1], true);
        case(1, 1, 3, 3, [0, 0, 0, 0], false); // one output
        case(5, 7, 6, 4, [2, 1, 0, 1], true); // uneven padding
        case(3, 4, 40, 40, [1, 1, 1, 1], true); // several blocks of tile rows
        case(8, 64, 10, 10, [1, 1, 1, 1], true); // output channels split into parts
        case(2, 3, 5, 140, [1, 1, 1, 1], true); // rows wider than the transforms' chunks
        case(6, 70, 13, 11, [1, 0, 1, 2], false); // both, odd sizes
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(WinogradWeights::new(&[0.0; 17], 1, 2)
            .unwrap_err()
            .contains("needs 18"));
        let ww = WinogradWeights::new(&[0.0; 18], 1, 2).unwrap();
        let x = [0.0; 2 * 4 * 4];
        let conv = Conv3x3 {
            input: &x,
            h: 4,
            w: 4,
            pads: [1; 4],
            bias: None,
            residual: None,
            relu: false,
        };
        let e = conv3x3(&conv, &ww, &mut [0.0; 15], &Sequential).unwrap_err();
        assert!(e.contains("output holds 15"), "{e}");
        let tiny = Conv3x3 {
            h: 1,
            w: 1,
            pads: [0; 4],
            input: &x[..2],
            ..conv
        };
        assert!(conv3x3(&tiny, &ww, &mut [], &Sequential)
            .unwrap_err()
            .contains("smaller than the 3x3"));
    }
}
