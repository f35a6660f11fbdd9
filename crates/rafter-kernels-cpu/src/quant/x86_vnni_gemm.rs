//! The int8 prefill GEMM for block-format weights on AVX-512 VNNI.
//!
//! Every block format is a weight `w = s q + t` per group of `G` elements (16 or 32), with
//! `q` a small unsigned integer (Q8's signed quants sign-flipped to `q + 128`), `s` a float
//! scale and `t` a float offset (the `_1`/K formats' mins, or `-s * offset` for the
//! symmetric formats, which is applied in integers instead). With x quantized as ggml does
//! (`x = dx xq`, [`super::act`]: per 32 elements for the 32-element formats, per 256 for
//! the K formats), a group's contribution is `dx s Σ q xq + t (dx Σ xq)`, where for the
//! `_1` formats `dx Σ xq` is ggml's f16 Q8_1 sum `s` instead.
//!
//! Each task owns a range of output columns (W rows) and, per panel of [`NR`] = 32 W rows
//! and [`KC`] elements of K:
//! 1. unpacks the rows' blocks into bytes of `q` in natural order plus `s`, `t` per group
//!    ([`unpack_row`]);
//! 2. transposes them into the `vpdpbusd` layout: per 4 consecutive k, 32 columns of 4
//!    bytes (two 64-byte vectors) — 16x16 dword transposes;
//! 3. runs the micro-kernel over all of the task's rows of x, [`MR`] at a time: per group,
//!    `G/4` steps of two weight vectors times `MR` broadcast activation quads into i32
//!    accumulators (started at `-offset Σ xq`), then per accumulator one convert, one
//!    multiply by the columns' `s` and one FMA by the row's `dx` into f32 accumulators
//!    (one more FMA for `t` where the format has mins).
//!
//! Partial sums over K live in y between K blocks; the last block's tile goes through the
//! epilogue.

use std::arch::x86_64::*;
use std::cell::RefCell;

use rafter_quant::layout::{self, k4_scale_min, q3_k_scales, read_f16};
use rafter_quant::BlockFormat;

use super::act::{quantize_rows, Act, ActType, QuantIsa};
use super::finish::{finish, YPtr};
use super::gemv::AlignedBytes;
use super::gemv_scalar::unpack256;
use super::{Path, QuantMatRef};
use crate::{Epilogue, MatMut, MatRef, Parallel};

/// Rows of x per micro-kernel call, at most (the tile buffer's rows).
const MR: usize = 6;

/// Rows of x per micro-kernel call (4..=6; 0: the default, [`MR`]). For the bench.
static ROWS_OVERRIDE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the micro-kernel's row count for later calls (0: default). For the bench.
pub(crate) fn set_rows(mr: usize) {
    ROWS_OVERRIDE.store(mr.min(MR), std::sync::atomic::Ordering::Relaxed);
}

/// Rows per micro-kernel call for groups of `g`: measured (`--gemm-rows 4,5,6`, M = 128,
/// gate/up and down, one Zen 5 thread): 6 rows beat 4 by 5-12% for the 32-groups (q8_0,
/// q4_0, q4_K); Q6_K's 16-groups ran best at 5 (6 lost 7-11% to 4).
fn tile_rows(g: usize) -> usize {
    match ROWS_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        0 if g == 32 => MR,
        0 => 5,
        v => v,
    }
}
/// Weight rows (output columns) per panel: two 16-lane vectors.
const NR: usize = 32;
/// Elements of K per panel: 16 KiB of quants, L1-resident while all rows of x pass.
const KC: usize = 512;

/// Every block format has a kernel here.
pub(crate) fn supports(_format: BlockFormat) -> bool {
    true
}

/// How a format maps onto `s q + t`: the group size, the integer offset folded into the
/// accumulators (`q - offset`), and whether it has float mins `t`.
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) g: usize,
    pub(crate) offset: i32,
    min: bool,
}

pub(crate) fn spec(format: BlockFormat) -> Spec {
    let (g, offset, min) = match format {
        BlockFormat::Q4_0 => (32, 8, false),
        BlockFormat::Q5_0 => (32, 16, false),
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4_K | BlockFormat::Q5_K => {
            (32, 0, true)
        }
        BlockFormat::Q8_0 | BlockFormat::Q8_1 | BlockFormat::Q8_K => (32, 128, false),
        BlockFormat::Q6_K => (16, 32, false),
        BlockFormat::Q3_K => (16, 4, false),
        BlockFormat::Q2_K => (16, 0, true),
    };
    Spec { g, offset, min }
}

/// Per-call activation data, per row of x and group of K: `-offset Σ xq` (i32), the
/// group's `dx`, and `dx Σ xq` (for formats with mins).
#[derive(Default)]
struct XSide {
    act: Act,
    off: Vec<i32>,
    dx: Vec<f32>,
    dxs: Vec<f32>,
}

/// Per-thread panel buffers: the unpacked rows, their scales and offsets, and the
/// transposed panel.
#[derive(Default)]
struct PanelBufs {
    rows: AlignedBytes,
    s: Vec<f32>,
    t: Vec<f32>,
    panel: AlignedBytes,
    ps: Vec<f32>,
    pt: Vec<f32>,
}

thread_local! {
    static XS: RefCell<XSide> = RefCell::new(XSide::default());
    static PANEL: RefCell<PanelBufs> = RefCell::new(PanelBufs::default());
}

/// `y = x · Wᵀ` (then the epilogue) for block-format W; shapes checked by the caller, and
/// AVX-512F/BW/VBMI/VNNI, GFNI and BMI2 available ([`Path::Vnni512`]).
pub(crate) fn run(
    format: BlockFormat,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let mut fresh = None;
    XS.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let xs = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert(XSide::default()),
        };
        prepare_x(format, &x, xs, par);
        compute(format, xs, w, y, epilogue, par);
    });
}

/// Quantizes x as ggml does for `format` ([`super::act`]: per 32 with f16 scales for the
/// 32-element formats, per 256 with f32 scales for the K formats) and derives the
/// per-group arrays: a group's `dx` is its block's scale; the mins' multiplier `dx Σ xq` is
/// the Q8_1 `s` for the `_1` formats (ggml's `x.m * y.s`).
fn prepare_x(format: BlockFormat, x: &MatRef<'_>, xs: &mut XSide, par: &dyn Parallel) {
    let (m, k) = (x.rows, x.cols);
    let sp = spec(format);
    xs.act.reset(m, k, ActType::of(format));
    quantize_rows(QuantIsa::of(Path::Vnni512), x, &mut xs.act, par);
    let (ng, blk) = (k / sp.g, xs.act.blk);
    let q8_1 = xs.act.kind == ActType::Q8_1;
    xs.off.resize(m * ng, 0);
    xs.dx.resize(m * ng, 0.0);
    xs.dxs.resize(m * ng, 0.0);
    for r in 0..m {
        let (d, s, s16) = (xs.act.scales(r), xs.act.block_sums(r), xs.act.sums16(r));
        for gi in 0..ng {
            let sum: i32 = s16[gi * sp.g / 16..(gi + 1) * sp.g / 16].iter().sum();
            let b = gi * sp.g / blk;
            let dx = d[b];
            xs.off[r * ng + gi] = -sp.offset * sum;
            xs.dx[r * ng + gi] = dx;
            // Groups of the `_1` formats are whole Q8_1 blocks (g = blk = 32).
            xs.dxs[r * ng + gi] = if q8_1 { s[b] } else { dx * sum as f32 };
        }
    }
}

/// The task split and the per-task panel loop.
fn compute(
    format: BlockFormat,
    xs: &XSide,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let (m, k, n) = (xs.act.m, xs.act.k, w.n());
    let panels = n.div_ceil(NR);
    let threads = par.threads().max(1);
    // Column ranges: a few per thread (load balance on a shared machine); rows split too
    // when there are fewer panels than threads.
    let tn = panels.min(2 * threads);
    let tm = super::finish::row_ranges(tn, m.div_ceil(MR), threads);
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (i0, i1) = (ti * m / tm, (ti + 1) * m / tm);
        let (p0, p1) = (tj * panels / tn, (tj + 1) * panels / tn);
        let mut fresh = None;
        PANEL.with(|cell| {
            let mut guard = cell.try_borrow_mut().ok();
            let bufs = match guard.as_deref_mut() {
                Some(b) => b,
                None => fresh.insert(PanelBufs::default()),
            };
            for p in p0..p1 {
                let j0 = p * NR;
                let cols = NR.min(n - j0);
                let mut pc = 0;
                while pc < k {
                    let kb = KC.min(k - pc);
                    pack_panel(format, &w, j0, cols, pc, kb, bufs);
                    let last = pc + kb >= k;
                    run_rows(
                        format,
                        xs,
                        bufs,
                        pc,
                        kb,
                        i0,
                        i1,
                        j0,
                        cols,
                        pc > 0,
                        last,
                        epi,
                        yp,
                    );
                    pc += kb;
                }
            }
        });
    };
    let tasks = tm * tn;
    if tasks <= 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// Unpacks and transposes W's rows `j0..j0 + cols` (zero rows past them), elements
/// `pc..pc + kb`, into `bufs.panel` (quants), `bufs.ps`, `bufs.pt` (`[group][32]` floats).
fn pack_panel(
    format: BlockFormat,
    w: &QuantMatRef<'_>,
    j0: usize,
    cols: usize,
    pc: usize,
    kb: usize,
    bufs: &mut PanelBufs,
) {
    let sp = spec(format);
    let ng = kb / sp.g;
    let rows = bufs.rows.reset(NR * kb);
    bufs.s.resize(NR * ng, 0.0);
    bufs.t.resize(NR * ng, 0.0);
    let (be, bb) = (format.block_elems(), format.block_bytes());
    for c in 0..NR {
        let u = &mut rows[c * kb..][..kb];
        let (s, t) = (&mut bufs.s[c * ng..][..ng], &mut bufs.t[c * ng..][..ng]);
        if c >= cols {
            u.fill(0);
            s.fill(0.0);
            t.fill(0.0);
            continue;
        }
        let bytes = &w.rows(j0 + c, j0 + c + 1)[pc / be * bb..(pc + kb) / be * bb];
        // SAFETY: the VNNI path's features (AVX-512F/BW/VL) are available.
        if !unsafe { unpack_row_simd(format, bytes, u) } {
            unpack_row(format, bytes, u, s, t);
        } else {
            scales_row(format, bytes, s, t);
        }
    }
    let panel = bufs.panel.reset(NR * kb);
    transpose(bufs.rows.as_slice(), kb, panel);
    bufs.ps.resize(ng * NR, 0.0);
    bufs.pt.resize(ng * NR, 0.0);
    for c in 0..NR {
        for gi in 0..ng {
            bufs.ps[gi * NR + c] = bufs.s[c * ng + gi];
            bufs.pt[gi * NR + c] = bufs.t[c * ng + gi];
        }
    }
}

/// One weight row segment (whole blocks) into unsigned quants `u` (natural order) and the
/// per-group `s`, `t` of [`Spec`].
pub(crate) fn unpack_row(
    format: BlockFormat,
    bytes: &[u8],
    u: &mut [u8],
    s: &mut [f32],
    t: &mut [f32],
) {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let per = be / spec(format).g;
    for (b, blk) in bytes.chunks_exact(bb).enumerate() {
        let (u, s, t) = (
            &mut u[b * be..][..be],
            &mut s[b * per..][..per],
            &mut t[b * per..][..per],
        );
        match format {
            BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                let (qs, qh) = match format {
                    BlockFormat::Q4_0 => (layout::q4_0::QS, None),
                    BlockFormat::Q4_1 => (layout::q4_1::QS, None),
                    BlockFormat::Q5_0 => (layout::q5_0::QS, Some(layout::q5_0::QH)),
                    _ => (layout::q5_1::QS, Some(layout::q5_1::QH)),
                };
                let h = qh.map_or(0, |at| {
                    u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
                });
                for j in 0..16 {
                    u[j] = (blk[qs + j] & 0xF) | ((((h >> j) & 1) << 4) as u8);
                    u[j + 16] = (blk[qs + j] >> 4) | ((((h >> (j + 16)) & 1) << 4) as u8);
                }
                s[0] = read_f16(blk, 0);
                t[0] = if matches!(format, BlockFormat::Q4_1 | BlockFormat::Q5_1) {
                    read_f16(blk, 2)
                } else {
                    0.0
                };
            }
            BlockFormat::Q8_0 | BlockFormat::Q8_1 => {
                let qs = if format == BlockFormat::Q8_0 {
                    layout::q8_0::QS
                } else {
                    layout::q8_1::QS
                };
                for (o, &q) in u.iter_mut().zip(&blk[qs..qs + 32]) {
                    *o = q ^ 0x80;
                }
                s[0] = read_f16(blk, 0);
                t[0] = 0.0;
            }
            BlockFormat::Q8_K => {
                for (o, &q) in u.iter_mut().zip(&blk[layout::q8_k::QS..][..256]) {
                    *o = q ^ 0x80;
                }
                s.fill(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
                t.fill(0.0);
            }
            _ => {
                let q = unpack256(format, blk);
                for (o, &v) in u.iter_mut().zip(&q) {
                    *o = v as u8;
                }
                k_scales(format, blk, s, t);
            }
        }
    }
}

/// The per-group `s`, `t` of a row segment (what [`unpack_row`] writes besides the
/// quants).
pub(crate) fn scales_row(format: BlockFormat, bytes: &[u8], s: &mut [f32], t: &mut [f32]) {
    let bb = format.block_bytes();
    let per = format.block_elems() / spec(format).g;
    for (b, blk) in bytes.chunks_exact(bb).enumerate() {
        let (s, t) = (&mut s[b * per..][..per], &mut t[b * per..][..per]);
        match format {
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
                s[0] = read_f16(blk, 0);
                t[0] = read_f16(blk, 2);
            }
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 | BlockFormat::Q8_1 => {
                s[0] = read_f16(blk, 0);
                t[0] = 0.0;
            }
            BlockFormat::Q8_K => {
                s.fill(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
                t.fill(0.0);
            }
            _ => k_scales(format, blk, s, t),
        }
    }
}

/// The quants of a row segment with vector instructions, for the formats that have such an
/// unpacking here (returns `false` for the others, which [`unpack_row`] handles).
///
/// # Safety
/// AVX-512F/BW/VL available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn unpack_row_simd(format: BlockFormat, bytes: &[u8], u: &mut [u8]) -> bool {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let nb = bytes.len() / bb;
    assert!(u.len() >= nb * be);
    let (src, dst) = (bytes.as_ptr(), u.as_mut_ptr());
    let low4 = _mm_set1_epi8(0x0F);
    let low4y = _mm256_set1_epi8(0x0F);
    // SAFETY: (every arm) block b's bytes are src[b * bb..][..bb] and its quants go to
    // dst[b * be..][..be], both inside the slices (asserted).
    unsafe {
        match format {
            BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                let (qs, qh) = match format {
                    BlockFormat::Q4_0 => (layout::q4_0::QS, usize::MAX),
                    BlockFormat::Q4_1 => (layout::q4_1::QS, usize::MAX),
                    BlockFormat::Q5_0 => (layout::q5_0::QS, layout::q5_0::QH),
                    _ => (layout::q5_1::QS, layout::q5_1::QH),
                };
                let sixteen = _mm_set1_epi8(16);
                for b in 0..nb {
                    let p = src.add(b * bb);
                    let q = _mm_loadu_si128(p.add(qs).cast());
                    let mut lo = _mm_and_si128(q, low4);
                    let mut hi = _mm_and_si128(_mm_srli_epi16::<4>(q), low4);
                    if qh != usize::MAX {
                        let h = p.add(qh).cast::<u32>().read_unaligned();
                        lo = _mm_mask_add_epi8(lo, h as u16, lo, sixteen);
                        hi = _mm_mask_add_epi8(hi, (h >> 16) as u16, hi, sixteen);
                    }
                    _mm_storeu_si128(dst.add(32 * b).cast(), lo);
                    _mm_storeu_si128(dst.add(32 * b + 16).cast(), hi);
                }
            }
            BlockFormat::Q8_0 | BlockFormat::Q8_1 => {
                let qs = if format == BlockFormat::Q8_0 {
                    layout::q8_0::QS
                } else {
                    layout::q8_1::QS
                };
                let flip = _mm256_set1_epi8(-128);
                for b in 0..nb {
                    let q = _mm256_loadu_si256(src.add(b * bb + qs).cast());
                    _mm256_storeu_si256(dst.add(32 * b).cast(), _mm256_xor_si256(q, flip));
                }
            }
            BlockFormat::Q8_K => {
                let flip = _mm512_set1_epi8(-128);
                for b in 0..nb {
                    for i in 0..4 {
                        let q =
                            _mm512_loadu_si512(src.add(b * bb + layout::q8_k::QS + 64 * i).cast());
                        _mm512_storeu_si512(
                            dst.add(256 * b + 64 * i).cast(),
                            _mm512_xor_si512(q, flip),
                        );
                    }
                }
            }
            BlockFormat::Q4_K | BlockFormat::Q5_K => {
                let five = format == BlockFormat::Q5_K;
                let qs = if five {
                    layout::q5_k::QS
                } else {
                    layout::q4_k::QS
                };
                let one = _mm256_set1_epi8(1);
                for b in 0..nb {
                    let p = src.add(b * bb);
                    let qh = if five {
                        _mm256_loadu_si256(p.add(layout::q5_k::QH).cast())
                    } else {
                        _mm256_setzero_si256()
                    };
                    for c in 0..4 {
                        let q = _mm256_loadu_si256(p.add(qs + 32 * c).cast());
                        let mut lo = _mm256_and_si256(q, low4y);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4y);
                        if five {
                            // Bits 2c and 2c + 1 of qh, as 16 in bytes.
                            let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32));
                            let h_lo = _mm256_slli_epi16::<4>(_mm256_and_si256(h, one));
                            let h_hi =
                                _mm256_slli_epi16::<3>(_mm256_and_si256(h, _mm256_set1_epi8(2)));
                            lo = _mm256_or_si256(lo, h_lo);
                            hi = _mm256_or_si256(hi, h_hi);
                        }
                        _mm256_storeu_si256(dst.add(256 * b + 64 * c).cast(), lo);
                        _mm256_storeu_si256(dst.add(256 * b + 64 * c + 32).cast(), hi);
                    }
                }
            }
            BlockFormat::Q6_K => {
                let three = _mm256_set1_epi8(3);
                for b in 0..nb {
                    let p = src.add(b * bb);
                    for h in 0..2 {
                        let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
                        let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                        let qh = _mm256_loadu_si256(p.add(layout::q6_k::QH + 32 * h).cast());
                        let pair = |s: i32| {
                            let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                            _mm256_slli_epi16::<4>(_mm256_and_si256(v, three))
                        };
                        let e = [
                            _mm256_or_si256(_mm256_and_si256(ql0, low4y), pair(0)),
                            _mm256_or_si256(_mm256_and_si256(ql1, low4y), pair(2)),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4y),
                                pair(4),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4y),
                                pair(6),
                            ),
                        ];
                        for (i, v) in e.iter().enumerate() {
                            _mm256_storeu_si256(dst.add(256 * b + 128 * h + 32 * i).cast(), *v);
                        }
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

/// The per-group `s`, `t` of a K super-block (8 groups of 32 or 16 of 16).
fn k_scales(format: BlockFormat, b: &[u8], s: &mut [f32], t: &mut [f32]) {
    match format {
        BlockFormat::Q4_K | BlockFormat::Q5_K => {
            let (d, dmin) = (read_f16(b, 0), read_f16(b, layout::q4_k::DMIN));
            for j in 0..8 {
                let (sc, m) = k4_scale_min(&b[layout::q4_k::SCALES..], j);
                s[j] = d * sc as f32;
                t[j] = -(dmin * m as f32);
            }
        }
        BlockFormat::Q6_K => {
            let d = read_f16(b, layout::q6_k::D);
            for j in 0..16 {
                s[j] = d * b[layout::q6_k::SCALES + j] as i8 as f32;
                t[j] = 0.0;
            }
        }
        BlockFormat::Q3_K => {
            let d = read_f16(b, layout::q3_k::D);
            let sc = q3_k_scales(&b[layout::q3_k::SCALES..][..12]);
            for j in 0..16 {
                s[j] = d * sc[j] as f32;
                t[j] = 0.0;
            }
        }
        _ => {
            // Q2_K
            let (d, dmin) = (
                read_f16(b, layout::q2_k::D),
                read_f16(b, layout::q2_k::DMIN),
            );
            for j in 0..16 {
                s[j] = d * (b[j] & 0xF) as f32;
                t[j] = -(dmin * (b[j] >> 4) as f32);
            }
        }
    }
}

/// `rows` (`NR` rows of `kb` bytes) into the panel: for each 4 consecutive k, `NR`
/// columns of 4 bytes.
fn transpose(rows: &[u8], kb: usize, panel: &mut [u8]) {
    let full = kb / 64 * 64;
    if full > 0 {
        // SAFETY: AVX-512F is available (the VNNI path); `rows` holds NR rows of kb bytes
        // and `panel` NR * kb bytes (asserted in the function).
        unsafe { transpose512(rows, kb, full, panel) };
    }
    for g in full / 4..kb / 4 {
        for c in 0..NR {
            panel[(g * NR + c) * 4..][..4].copy_from_slice(&rows[c * kb + 4 * g..][..4]);
        }
    }
}

/// The first `full` (a multiple of 64) bytes of every row, by 16x16 dword transposes.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f")]
unsafe fn transpose512(rows: &[u8], kb: usize, full: usize, panel: &mut [u8]) {
    assert!(rows.len() >= NR * kb && panel.len() >= NR * kb && full <= kb);
    for half in 0..NR / 16 {
        for chunk in 0..full / 64 {
            // SAFETY: rows 16 half + r < NR, bytes 64 chunk.. + 64 <= full <= kb.
            let mut v: [__m512i; 16] = std::array::from_fn(|r| unsafe {
                _mm512_loadu_si512(rows.as_ptr().add((16 * half + r) * kb + 64 * chunk).cast())
            });
            transpose16(&mut v);
            for (g, vg) in v.iter().enumerate() {
                let at = ((16 * chunk + g) * NR + 16 * half) * 4;
                // SAFETY: group 16 chunk + g < kb / 4, columns 16 half.. + 16 <= NR.
                unsafe { _mm512_storeu_si512(panel.as_mut_ptr().add(at).cast(), *vg) };
            }
        }
    }
}

/// Transposes a 16x16 matrix of dwords held as 16 row vectors.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(v: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for i in 0..4 {
        for j in 0..2 {
            v[4 * i + j] = _mm512_unpacklo_epi64(t[4 * i + j], t[4 * i + 2 + j]);
            v[4 * i + 2 + j] = _mm512_unpackhi_epi64(t[4 * i + j], t[4 * i + 2 + j]);
        }
    }
    // Now v[4 i + q] holds, per 128-bit lane L, rows 4i..4i+4 of column
    // 4L + [0, 2, 1, 3][q].
    for i in 0..2 {
        for q in 0..4 {
            t[8 * i + q] = _mm512_shuffle_i32x4::<0x88>(v[8 * i + q], v[8 * i + 4 + q]);
            t[8 * i + 4 + q] = _mm512_shuffle_i32x4::<0xDD>(v[8 * i + q], v[8 * i + 4 + q]);
        }
    }
    for q in 0..8 {
        let (a, b) = (t[q], t[8 + q]);
        let lo = _mm512_shuffle_i32x4::<0x88>(a, b);
        let hi = _mm512_shuffle_i32x4::<0xDD>(a, b);
        let (c_lo, c_hi) = column_of(q);
        v[c_lo] = lo;
        v[c_hi] = hi;
    }
}

/// Where the two outputs of the last transpose stage for input `q` belong: the 64-bit
/// unpacks leave column `4L + [0, 2, 1, 3][q % 4]` in lane `L` of `v[4 i + q % 4]`, and the
/// lane shuffles then gather columns `c` and `c + 8` with `c = that + 4 (q / 4)`.
#[inline(always)]
fn column_of(q: usize) -> (usize, usize) {
    let c = [0, 2, 1, 3][q % 4] + 4 * (q / 4);
    (c, c + 8)
}

/// The micro-kernel over rows `i0..i1` of x for one packed panel.
#[allow(clippy::too_many_arguments)]
fn run_rows(
    format: BlockFormat,
    xs: &XSide,
    bufs: &PanelBufs,
    pc: usize,
    kb: usize,
    i0: usize,
    i1: usize,
    j0: usize,
    cols: usize,
    accumulate: bool,
    last: bool,
    epi: Option<&Epilogue<'_>>,
    y: YPtr,
) {
    let sp = spec(format);
    let k = xs.act.k;
    let ng_row = k / sp.g;
    let g0 = pc / sp.g;
    let ng = kb / sp.g;
    let mut tile = [0.0f32; MR * NR];
    let rows = tile_rows(sp.g);
    for r0 in (i0..i1).step_by(rows) {
        let mr = rows.min(i1 - r0);
        let kt = KTile {
            q: bufs.panel.as_slice().as_ptr(),
            s: bufs.ps.as_ptr(),
            t: bufs.pt.as_ptr(),
            groups: ng,
            x: xs.act.qs[r0 * k + pc..].as_ptr(),
            ldx: k,
            off: xs.off[r0 * ng_row + g0..].as_ptr(),
            dx: xs.dx[r0 * ng_row + g0..].as_ptr(),
            dxs: xs.dxs[r0 * ng_row + g0..].as_ptr(),
            ldg: ng_row,
            acc: tile.as_mut_ptr(),
        };
        if accumulate {
            for r in 0..mr {
                for c in 0..cols {
                    // SAFETY: y's row r0 + r, column j0 + c is in bounds and this task's.
                    tile[r * NR + c] = unsafe { *y.at(r0 + r, j0 + c) };
                }
            }
        }
        // SAFETY: the panel holds `ng` groups of NR columns; x rows r0..r0+mr hold the kb
        // quants from pc and their per-group arrays from g0; `tile` is MR x NR; the VNNI
        // features are available (the path).
        unsafe { kernel_rows(&kt, mr, sp, accumulate) };
        if last {
            // SAFETY: rows r0..r0+mr, columns j0..j0+cols of y are in bounds and this
            // task's alone; the epilogue was checked; the tile holds mr rows of NR floats.
            unsafe { finish(Path::Vnni512, &tile, NR, mr, cols, r0, j0, epi, y) };
        } else {
            for r in 0..mr {
                for c in 0..cols {
                    // SAFETY: as above.
                    unsafe { *y.at(r0 + r, j0 + c) = tile[r * NR + c] };
                }
            }
        }
    }
}

/// One micro-kernel call: a packed panel (`groups` groups), the rows of x, their per-group
/// arrays, and the `MR x NR` f32 accumulator tile.
struct KTile {
    q: *const u8,
    s: *const f32,
    t: *const f32,
    groups: usize,
    x: *const i8,
    ldx: usize,
    off: *const i32,
    dx: *const f32,
    dxs: *const f32,
    ldg: usize,
    acc: *mut f32,
}

/// Dispatches the kernel instance for `mr` rows, the group size and mins.
///
/// # Safety
/// The [`KTile`] pointers cover what [`run_rows`] says; VNNI features available.
unsafe fn kernel_rows(t: &KTile, mr: usize, sp: Spec, accumulate: bool) {
    macro_rules! go {
        ($g:expr, $min:expr) => {
            // SAFETY: forwarded.
            unsafe {
                match mr {
                    1 => kernel::<1, $g, $min>(t, accumulate),
                    2 => kernel::<2, $g, $min>(t, accumulate),
                    3 => kernel::<3, $g, $min>(t, accumulate),
                    4 => kernel::<4, $g, $min>(t, accumulate),
                    5 => kernel::<5, $g, $min>(t, accumulate),
                    _ => kernel::<6, $g, $min>(t, accumulate),
                }
            }
        };
    }
    match (sp.g, sp.min) {
        (32, false) => go!(32, false),
        (32, true) => go!(32, true),
        (16, false) => go!(16, false),
        _ => go!(16, true),
    }
}

/// `R` rows x 32 columns: i32 accumulation per group of `G`, then the float update.
///
/// # Safety
/// As [`kernel_rows`] with `R` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn kernel<const R: usize, const G: usize, const MIN: bool>(t: &KTile, accumulate: bool) {
    let mut accf = [[_mm512_setzero_ps(); 2]; R];
    // SAFETY: every pointer below stays inside what the caller guaranteed: groups
    // gi < t.groups of the panel and of each row's arrays, k steps inside the group.
    unsafe {
        if accumulate {
            for (r, a) in accf.iter_mut().enumerate() {
                a[0] = _mm512_loadu_ps(t.acc.add(r * NR));
                a[1] = _mm512_loadu_ps(t.acc.add(r * NR + 16));
            }
        }
        for gi in 0..t.groups {
            let mut acci = [[_mm512_setzero_si512(); 2]; R];
            for (r, a) in acci.iter_mut().enumerate() {
                let o = _mm512_set1_epi32(*t.off.add(r * t.ldg + gi));
                *a = [o, o];
            }
            for kg in 0..G / 4 {
                let wq = t.q.add((gi * G / 4 + kg) * NR * 4);
                let w0 = _mm512_load_si512(wq.cast());
                let w1 = _mm512_load_si512(wq.add(64).cast());
                for (r, a) in acci.iter_mut().enumerate() {
                    let quad =
                        t.x.add(r * t.ldx + gi * G + 4 * kg)
                            .cast::<i32>()
                            .read_unaligned();
                    let xb = _mm512_set1_epi32(quad);
                    a[0] = _mm512_dpbusd_epi32(a[0], w0, xb);
                    a[1] = _mm512_dpbusd_epi32(a[1], w1, xb);
                }
            }
            let s0 = _mm512_loadu_ps(t.s.add(gi * NR));
            let s1 = _mm512_loadu_ps(t.s.add(gi * NR + 16));
            let (t0, t1) = if MIN {
                (
                    _mm512_loadu_ps(t.t.add(gi * NR)),
                    _mm512_loadu_ps(t.t.add(gi * NR + 16)),
                )
            } else {
                (_mm512_setzero_ps(), _mm512_setzero_ps())
            };
            for r in 0..R {
                let dx = _mm512_set1_ps(*t.dx.add(r * t.ldg + gi));
                let f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(acci[r][0]), s0);
                let f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(acci[r][1]), s1);
                accf[r][0] = _mm512_fmadd_ps(f0, dx, accf[r][0]);
                accf[r][1] = _mm512_fmadd_ps(f1, dx, accf[r][1]);
                if MIN {
                    let dxs = _mm512_set1_ps(*t.dxs.add(r * t.ldg + gi));
                    accf[r][0] = _mm512_fmadd_ps(t0, dxs, accf[r][0]);
                    accf[r][1] = _mm512_fmadd_ps(t1, dxs, accf[r][1]);
                }
            }
        }
        for (r, a) in accf.iter().enumerate() {
            _mm512_storeu_ps(t.acc.add(r * NR), a[0]);
            _mm512_storeu_ps(t.acc.add(r * NR + 16), a[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_is_a_transpose() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let rows: Vec<u8> = (0..NR * 128).map(|i| (i * 7 + i / 128) as u8).collect();
        let mut panel = vec![0u8; NR * 128];
        transpose(&rows, 128, &mut panel);
        for g in 0..32 {
            for c in 0..NR {
                assert_eq!(
                    &panel[(g * NR + c) * 4..][..4],
                    &rows[c * 128 + 4 * g..][..4],
                    "group {g} column {c}"
                );
            }
        }
    }
}
