//! AVX-512 VNNI decode kernels: one weight row in its GGUF block layout against up to
//! [`MR`] rows of quantized activations, streaming the row once.
//!
//! The weights stay in ggml's layout (no repacking), so each kernel gathers what it needs
//! from a few unaligned 64-byte loads: `vpermt2b` pulls the quant bytes of several blocks
//! out of the loads (skipping the interleaved scales), `vpermt2w` + `vcvtph2ps` spread each
//! block's f16 scale over the lanes holding its products, and GFNI's `vgf2p8affineqb` does
//! the byte-wise shifts and bit moves of the unpacking in one instruction each. The
//! activations are rearranged once per call ([`prepare`]) into exactly the order the
//! unpacked weights come out in, with per-lane corrections for the formats' offsets, so the
//! inner loops are loads, a few unpacking instructions, `vpdpbusd` (or `vpmaddubsw` +
//! `vpdpwssd` where K formats scale sub-blocks) and one FMA per block group and row.
//!
//! Integer arithmetic is exactly [`super::gemv_scalar`]'s; only the f32 additions'
//! order differs (partial sums per lane).
//!
//! Layouts of the prepared activations ([`prepare`]), per row of x:
//! - `_0`/`_1` nibble formats, per group of 4 blocks (256 bytes): `x_lo[64]` (lane `b`'s 16
//!   bytes: block `b`'s elements 0..16), `x_hi[64]` (elements 16..32), then 16 lanes of
//!   `-offset * s` as i32 (Q4_0, Q5_0), where `s` is the sum of the 8 activations that
//!   lane's `vpdpbusd` multiplies, or (Q4_1, Q5_1) the block's Q8_1 sum `s` as f32 in its
//!   first lane and zeros in the other three (ggml's `x.m * y.s`), then 16 lanes of `dx`.
//! - Q8_0/Q8_1, per group of 4 blocks (384 bytes): the 128 activations, 32 lanes of
//!   `-128 * s` (weights are made unsigned by flipping their sign bit), 32 lanes of `dx`.
//! - K formats, per super-block (320 bytes): the 256 activations (Q4_K/Q5_K: in the order
//!   `0..32, 64..96 | 32..64, 96..128 | 128..160, 192..224 | 160..192, 224..256`, matching
//!   low and high nibbles of the 64-byte quant loads; others natural), 16 `i16` sums (per
//!   32 for Q4_K/Q5_K, per 16 otherwise), `dx: f32`, the super-block's sum as `i32`.
//!
//! Blocks past the last whole group of 4 (K not a multiple of 128) run the scalar model.

// The kernels index several small register arrays (weight rows x activation rows) with
// the same loop variables; iterator chains would hide the tile structure.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::Cell;

use rafter_quant::{layout, BlockFormat};

use super::act::Act;
use super::dense::MR;
use super::gemv::AlignedBytes;
use super::gemv_scalar;

/// Whether a format has kernels here.
pub(crate) fn supports(_format: BlockFormat) -> bool {
    true
}

/// Which kernel family a format belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Nibble,
    Q8,
    K,
}

fn family(format: BlockFormat) -> Family {
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            Family::Nibble
        }
        BlockFormat::Q8_0 | BlockFormat::Q8_1 => Family::Q8,
        _ => Family::K,
    }
}

const NIB_GROUP: usize = 256;
const Q8_GROUP: usize = 384;
const K_SB: usize = 320;

/// Prepared bytes per row of x.
fn row_bytes(format: BlockFormat, k: usize) -> usize {
    match family(format) {
        Family::Nibble => k / 128 * NIB_GROUP,
        Family::Q8 => k / 128 * Q8_GROUP,
        Family::K => k / 256 * K_SB,
    }
}

fn put_i32(b: &mut [u8], at: usize, v: i32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_f32(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Rearranges the quantized activations for `format`'s kernels (layouts in the module docs).
pub(crate) fn prepare(format: BlockFormat, act: &Act, aux: &mut AlignedBytes) {
    let rb = row_bytes(format, act.k);
    let buf = aux.reset(act.m * rb);
    for (r, out) in buf.chunks_exact_mut(rb.max(1)).enumerate().take(act.m) {
        let (x, dx, s16) = (act.row(r), act.scales(r), act.sums16(r));
        match family(format) {
            Family::Nibble => {
                let sx = act.block_sums(r);
                for (g, o) in out.chunks_exact_mut(NIB_GROUP).enumerate() {
                    // SAFETY: the VNNI path's features are available (prepare runs only
                    // for it); the group's 128 activations, 4 scales and 4 sums exist.
                    unsafe {
                        nibble_group_prep(
                            format,
                            &x[128 * g..][..128],
                            &dx[4 * g..][..4],
                            &sx[4 * g..][..4],
                            o,
                        )
                    };
                }
            }
            Family::Q8 => {
                for (g, o) in out.chunks_exact_mut(Q8_GROUP).enumerate() {
                    // SAFETY: as above.
                    unsafe { q8_group_prep(&x[128 * g..][..128], &dx[4 * g..][..4], o) };
                }
            }
            Family::K => {
                for (sb, o) in out.chunks_exact_mut(K_SB).enumerate() {
                    let xs = &x[256 * sb..][..256];
                    let sums = &s16[16 * sb..][..16];
                    let nibble_order = matches!(format, BlockFormat::Q4_K | BlockFormat::Q5_K);
                    for (c, src) in [0usize, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                        let src = if nibble_order { src } else { c };
                        for t in 0..32 {
                            o[32 * c + t] = xs[32 * src + t] as u8;
                        }
                    }
                    for j in 0..16 {
                        let v = if nibble_order {
                            if j < 8 {
                                sums[2 * j] + sums[2 * j + 1]
                            } else {
                                0
                            }
                        } else {
                            sums[j]
                        };
                        o[256 + 2 * j..258 + 2 * j].copy_from_slice(&(v as i16).to_le_bytes());
                    }
                    put_f32(o, 288, dx[sb]);
                    put_i32(o, 292, sums.iter().sum());
                    o[296..K_SB].fill(0);
                }
            }
        }
    }
}

/// One nibble-format group of prepared activations (layout in the module docs): the
/// split halves by `vpermb`, the lane sums by `vpdpbusd` with ones.
///
/// # Safety
/// AVX-512F/BW/VBMI/VNNI available; `o` holds [`NIB_GROUP`] bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
unsafe fn nibble_group_prep(format: BlockFormat, x: &[i8], dx: &[f32], sx: &[f32], o: &mut [u8]) {
    assert!(x.len() >= 128 && dx.len() >= 4 && sx.len() >= 4 && o.len() >= NIB_GROUP);
    // Output byte 16 b + t of x_lo is element 32 b + t; of x_hi, 32 b + 16 + t.
    let lo_idx: [u8; 64] = std::array::from_fn(|i| (32 * (i / 16) + i % 16) as u8);
    let hi_idx: [u8; 64] = std::array::from_fn(|i| (32 * (i / 16) + 16 + i % 16) as u8);
    // SAFETY: 128 bytes of x, NIB_GROUP of o, 4 floats of dx and sx (asserted).
    unsafe {
        let x0 = _mm512_loadu_si512(x.as_ptr().cast());
        let x1 = _mm512_loadu_si512(x.as_ptr().add(64).cast());
        let lo = _mm512_permutex2var_epi8(x0, table(lo_idx), x1);
        let hi = _mm512_permutex2var_epi8(x0, table(hi_idx), x1);
        let ones = _mm512_set1_epi8(1);
        let sums = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo),
            ones,
            hi,
        );
        let d4 = _mm_loadu_ps(dx.as_ptr());
        let dv = _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            _mm512_castps128_ps512(d4),
        );
        let third = match format {
            BlockFormat::Q4_0 => {
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<3>(sums))
            }
            BlockFormat::Q5_0 => {
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<4>(sums))
            }
            // Q4_1, Q5_1: s of block b in lane 4b.
            _ => _mm512_castps_si512(_mm512_maskz_permutexvar_ps(
                0x1111,
                _mm512_setr_epi32(0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0),
                _mm512_castps128_ps512(_mm_loadu_ps(sx.as_ptr())),
            )),
        };
        let op = o.as_mut_ptr();
        _mm512_storeu_si512(op.cast(), lo);
        _mm512_storeu_si512(op.add(64).cast(), hi);
        _mm512_storeu_si512(op.add(128).cast(), third);
        _mm512_storeu_ps(op.add(192).cast(), dv);
    }
}

/// One Q8 group of prepared activations: the 128 quants, `-128` times each lane's sum,
/// and the lanes' scales.
///
/// # Safety
/// AVX-512F/BW/VNNI available; `o` holds [`Q8_GROUP`] bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_group_prep(x: &[i8], dx: &[f32], o: &mut [u8]) {
    assert!(x.len() >= 128 && dx.len() >= 4 && o.len() >= Q8_GROUP);
    // SAFETY: 128 bytes of x, Q8_GROUP of o, 4 floats of dx (asserted).
    unsafe {
        let op = o.as_mut_ptr();
        let ones = _mm512_set1_epi8(1);
        for h in 0..2 {
            let xv = _mm512_loadu_si512(x.as_ptr().add(64 * h).cast());
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xv);
            let corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sums));
            let dv = _mm512_setr_ps(
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
                dx[2 * h + 1],
            );
            _mm512_storeu_si512(op.add(64 * h).cast(), xv);
            _mm512_storeu_si512(op.add(128 + 64 * h).cast(), corr);
            _mm512_storeu_ps(op.add(256 + 64 * h).cast(), dv);
        }
    }
}

/// `out[i * out_ld + c]` = row `r0 + i` of x times weight row `c`, for `i < m <= MR` and
/// the `w.len() / row_bytes` weight rows in `w`.
///
/// # Safety
/// `w` is whole rows of `format` blocks for `act.k` elements; rows `r0..r0 + m` of `act`
/// exist; `aux` was made by [`prepare`] for `format` from `act`; AVX-512F/BW/VBMI/VNNI/
/// BITALG, GFNI and BMI2 are available.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_tile(
    format: BlockFormat,
    w: &[u8],
    act: &Act,
    aux: &[u8],
    r0: usize,
    m: usize,
    out: &mut [f32],
    out_ld: usize,
) {
    let k = act.k;
    let rb = row_bytes(format, k);
    let wrow = format.row_bytes(k).expect("whole blocks");
    let rows = w.len() / wrow.max(1);
    assert!(m <= MR && r0 + m <= act.m && aux.len() >= (r0 + m) * rb);
    assert!(
        w.len() == rows * wrow && (rows == 0 || m == 0 || out.len() >= (m - 1) * out_ld + rows)
    );
    if rows == 0 || m == 0 {
        return;
    }
    let a = aux[r0 * rb..].as_ptr();
    let t = Tile {
        w: w.as_ptr(),
        rows,
        wrow,
        k,
        a,
        rb,
        out: out.as_mut_ptr(),
        out_ld,
        pf_next: Cell::new(
            w.as_ptr()
                .wrapping_add(PREFETCH_DISTANCE.load(std::sync::atomic::Ordering::Relaxed)),
        ),
        pf_owed: Cell::new(0),
    };
    // Every arm's unsafe: `t` describes `rows` whole weight rows, the prepared rows
    // r0..r0+m and an output of m rows of `rows` floats (asserted above); the features are
    // available (caller).
    macro_rules! rows {
        ($kern:ident, $($c:expr),*) => {
            // SAFETY: see above (the tile's contract and the caller's features).
            unsafe {
                match m {
                    1 => $kern::<$($c,)* 1>(&t),
                    2 => $kern::<$($c,)* 2>(&t),
                    3 => $kern::<$($c,)* 3>(&t),
                    _ => $kern::<$($c,)* 4>(&t),
                }
            }
        };
    }
    match format {
        BlockFormat::Q4_0 => rows!(nibble, 0),
        BlockFormat::Q4_1 => rows!(nibble, 1),
        BlockFormat::Q5_0 => rows!(nibble, 2),
        BlockFormat::Q5_1 => rows!(nibble, 3),
        BlockFormat::Q8_0 => rows!(q8, 0),
        BlockFormat::Q8_1 => rows!(q8, 1),
        BlockFormat::Q4_K => rows!(q45k, false),
        BlockFormat::Q5_K => rows!(q45k, true),
        BlockFormat::Q6_K => rows!(q6k, 0),
        BlockFormat::Q8_K => rows!(q8k, 0),
        BlockFormat::Q2_K => rows!(q23k, false),
        BlockFormat::Q3_K => rows!(q23k, true),
    }
    // Blocks past the whole groups of 4 (32-element formats only).
    let bb = format.block_bytes();
    if format.block_elems() == 32 {
        let nb = k / 32;
        for c in 0..rows {
            let wr = &w[c * wrow..][..wrow];
            for b in nb / 4 * 4..nb {
                for i in 0..m {
                    let r = r0 + i;
                    let s = act.sums16(r);
                    out[i * out_ld + c] += gemv_scalar::block32(
                        format,
                        &wr[b * bb..][..bb],
                        &act.row(r)[32 * b..][..32],
                        act.scales(r)[b],
                        act.block_sums(r)[b],
                        s[2 * b] + s[2 * b + 1],
                    );
                }
            }
        }
    }
}

/// One kernel call: `rows` weight rows of `wrow` bytes from `w`, the prepared activation
/// rows from `a` (`rb` bytes each), results to `out` (row `i` at `out + i * out_ld`).
struct Tile {
    w: *const u8,
    rows: usize,
    wrow: usize,
    k: usize,
    a: *const u8,
    rb: usize,
    out: *mut f32,
    out_ld: usize,
    /// The next weight line to prefetch (a hint address, [`PREFETCH_DISTANCE`] ahead of
    /// the tile's start to begin with) and the bytes consumed but not yet prefetched for.
    pf_next: Cell<*const u8>,
    pf_owed: Cell<isize>,
}

impl Tile {
    /// Records that `bytes` more of the weight stream were consumed, prefetching one line
    /// per 64 bytes that far ahead: exactly one hint per line of the tile, spread evenly
    /// over the kernel's steps (weight rows are back to back, so the stream is linear
    /// even though two rows are consumed side by side).
    #[inline(always)]
    fn prefetch(&self, bytes: usize) {
        if PREFETCH_DISTANCE.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        let mut owed = self.pf_owed.get() + bytes as isize;
        let mut next = self.pf_next.get();
        while owed > 0 {
            // SAFETY: a prefetch hint; never dereferenced.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(next.cast()) };
            next = next.wrapping_add(64);
            owed -= 64;
        }
        self.pf_owed.set(owed);
        self.pf_next.set(next);
    }

    /// Stores row `i`'s result for weight row `c`.
    ///
    /// # Safety
    /// `i < m` and `c < rows` of the [`dot_tile`] call.
    #[inline(always)]
    unsafe fn store(&self, i: usize, c: usize, v: f32) {
        // SAFETY: inside `out` (caller).
        unsafe { *self.out.add(i * self.out_ld + c) = v };
    }
}

/// How far ahead of the bytes being unpacked the kernels prefetch a weight row, in bytes
/// (0: no prefetching); see [`prefetch`]. Settable for the bench's tuning runs.
static PREFETCH_DISTANCE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(PREFETCH_DEFAULT);

/// Measured (`benches/quant_gemv.rs --prefetch B`, gate/up 1024x3072 streamed, one
/// thread on a loaded Zen 5): q4_0 / q4_K / q6_K / q8_0 at 4.3 / 4.0 / 5.7 / 7.5 GB/s
/// without prefetching, 10.7 / 12.1 / 11.7 / 11.4 at 4 KiB, 17.2 / 20.6 / 16.7 / 17.0 at
/// 8 KiB, 13.6 / 21.3 / 16.9 / 18.1 at 16 KiB, against 15-20 GB/s for f16 and a measured
/// read bandwidth of 17-22 GB/s in the same runs.
const PREFETCH_DEFAULT: usize = 8192;

/// Sets [`PREFETCH_DISTANCE`] (0 turns prefetching off) for every later call; for the bench.
pub(crate) fn set_prefetch_distance(bytes: usize) {
    PREFETCH_DISTANCE.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// Prefetches the `bytes` of weights that lie [`PREFETCH_DISTANCE`] after `p` (one hint per
/// cache line). The weights stream from DRAM; the unpacking costs enough instructions per
/// byte that the out-of-order window alone covers too few bytes to hide DRAM's latency
/// (without this, streamed q4_0 ran at a third of the bandwidth f16 reached).
///
/// The addresses may lie past the weights' end: they are formed with `wrapping_add` and
/// only ever used as prefetch hints, which never fault.
///
/// Hints go to L2 (`T1`), here and in [`Tile::prefetch`]: the kernels' own loads bring
/// each line the last step into L1, and hints into L1 compete with those loads for the
/// core's miss buffers. `benches/quant_gemv.rs --threads 2 --formats q4_0,q6_k,f16 --shapes
/// gate/up,down,lm_head`, three alternated rounds on the 2-core Zen 4 VM: 25.6 GB/s on
/// average with `T0`, 27.6 with `T1` (better in 21 of 27 shape-rounds); end to end (q4_0,
/// five alternated pairs) median decode 57.3 -> 58.7 tok/s.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    let d = PREFETCH_DISTANCE.load(std::sync::atomic::Ordering::Relaxed);
    if d == 0 {
        return;
    }
    let mut off = 0;
    while off < bytes {
        // SAFETY: a prefetch hint; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(d + off).cast()) };
        off += 64;
    }
}

/// A 64-byte vector from a byte table.
#[inline]
#[target_feature(enable = "avx512f")]
fn table(t: [u8; 64]) -> __m512i {
    // SAFETY: 64 bytes.
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// The `vpermt2b` index that gathers `lanes` runs of `run` quant bytes, run `i` starting at
/// byte `stride * i + offset` of a span of `span` bytes loaded as `[0, 64)` (first table)
/// and `[span - 64, span)` (second table).
fn gather_index(lanes: usize, run: usize, stride: usize, offset: usize, span: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    for (o, v) in idx.iter_mut().enumerate().take(lanes * run) {
        let s = stride * (o / run) + offset + o % run;
        *v = if s < 64 { s } else { 64 + s - (span - 64) } as u8;
    }
    idx
}

/// The `vpermt2w` index that spreads the f16 at byte `stride * i + offset` (`i < blocks`)
/// over `lanes` consecutive words, from the same two tables as [`gather_index`].
fn spread_index(
    blocks: usize,
    lanes: usize,
    stride: usize,
    offset: usize,
    span: usize,
) -> [u8; 64] {
    let mut idx = [0u8; 64];
    for o in 0..blocks * lanes {
        let s = stride * (o / lanes) + offset;
        let wi = if s < 64 {
            s / 2
        } else {
            32 + (s - (span - 64)) / 2
        };
        idx[2 * o..2 * o + 2].copy_from_slice(&(wi as u16).to_le_bytes());
    }
    idx
}

/// The `vpermt2w` index that puts the u32 at byte `stride * b + offset` (`b < 4`) into the
/// low half of qwords `2b` and `2b + 1`, from the tables of [`gather_index`].
fn qh_index(stride: usize, offset: usize, span: usize) -> [u8; 64] {
    let mut idx = [0u8; 64];
    for q in 0..8 {
        for w in 0..2 {
            let s = stride * (q / 2) + offset + 2 * w;
            let wi = if s < 64 {
                s / 2
            } else {
                32 + (s - (span - 64)) / 2
            };
            idx[8 * q + 2 * w..8 * q + 2 * w + 2].copy_from_slice(&(wi as u16).to_le_bytes());
        }
    }
    idx
}

/// `vgf2p8affineqb` matrix (one per qword) that moves bit `from` of each byte to bit `to`,
/// clearing the others.
const fn bit_move(from: u32, to: u32) -> u64 {
    (1u64 << from) << (8 * (7 - to))
}

/// `vgf2p8affineqb` matrix of a byte-wise logical shift right by 4.
const SHR4: u64 = 0x1020_4080_0000_0000;

/// `Σ` of a vector's f32 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// The constants of the nibble kernels, made once per call.
struct NibConsts {
    qidx: __m512i,
    didx: __m512i,
    midx: __m512i,
    low4: __m512i,
    shr4: __m512i,
    sixteen: __m512i,
    /// Q5: the `vpermt2w` index putting block `b`'s 32 fifth bits in qwords `2b`, `2b + 1`,
    /// and the `vpshufbitqmb` controls picking bit `t` (low nibbles) or `16 + t` (high) of
    /// them for byte `16 b + t`.
    qhidx: __m512i,
    lo_bits: __m512i,
    hi_bits: __m512i,
}

/// Q4_0 (`KIND` 0), Q4_1 (1), Q5_0 (2), Q5_1 (3): groups of 4 blocks, one per 128-bit
/// lane; low nibbles and high nibbles each one `vpdpbusd` against the split activations.
/// Two weight rows at a time share each load of the activations (loads, not arithmetic,
/// bounded this kernel: a group of one row is 2 weight and 4 activation loads); with one
/// or two rows of x, alternate groups go to separate accumulators (FMA latency).
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx512bitalg,gfni,bmi2")]
unsafe fn nibble<const KIND: u8, const R: usize>(t: &Tile) {
    let bb = [18usize, 20, 22, 24][KIND as usize];
    let qs = [2usize, 4, 6, 8][KIND as usize];
    let span = 4 * bb;
    let c = NibConsts {
        qidx: table(gather_index(4, 16, bb, qs, span)),
        didx: table(spread_index(4, 4, bb, 0, span)),
        midx: table(spread_index(4, 4, bb, 2, span)),
        low4: _mm512_set1_epi8(0x0F),
        shr4: _mm512_set1_epi64(SHR4 as i64),
        sixteen: _mm512_set1_epi8(16),
        qhidx: table(qh_index(bb, [0usize, 0, 2, 4][KIND as usize], span)),
        lo_bits: table(std::array::from_fn(|i| (i % 16) as u8)),
        hi_bits: table(std::array::from_fn(|i| (16 + i % 16) as u8)),
    };
    let mut n = 0;
    // SAFETY: rows n, n + 1 < rows (the Tile contract covers them).
    unsafe {
        while n + 2 <= t.rows {
            nibble_rows::<KIND, R, 2>(&c, t, n);
            n += 2;
        }
        if n < t.rows {
            nibble_rows::<KIND, R, 1>(&c, t, n);
        }
    }
}

/// Weight rows `n..n + NR` of the tile.
///
/// # Safety
/// `n + NR <= t.rows`; the [`Tile`] contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx512bitalg,gfni,bmi2")]
unsafe fn nibble_rows<const KIND: u8, const R: usize, const NR: usize>(
    c: &NibConsts,
    t: &Tile,
    n: usize,
) {
    let groups = t.k / 128;
    let alternate = R * NR <= 2;
    let mut s0 = [[_mm512_setzero_ps(); R]; NR];
    let mut s1 = [[_mm512_setzero_ps(); R]; NR];
    // SAFETY: rows n..n+NR lie inside the tile; groups g < k / 128 inside each row and
    // inside each prepared row (the Tile contract).
    unsafe {
        let w: [*const u8; NR] = std::array::from_fn(|j| t.w.add((n + j) * t.wrow));
        let mut g = 0;
        while g + 2 <= groups {
            nibble_group::<KIND, R, NR>(c, &w, t, g, &mut s0);
            let second = if alternate { &mut s1 } else { &mut s0 };
            nibble_group::<KIND, R, NR>(c, &w, t, g + 1, second);
            g += 2;
        }
        if g < groups {
            nibble_group::<KIND, R, NR>(c, &w, t, g, &mut s0);
        }
        for j in 0..NR {
            for r in 0..R {
                t.store(r, n + j, hsum(_mm512_add_ps(s0[j][r], s1[j][r])));
            }
        }
    }
}

/// Group `g` of the weight rows at `w` into `sum` (the `_1` formats' min terms included).
///
/// # Safety
/// Group `g` lies inside each row and inside the prepared rows < R of `t`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx512bitalg,gfni,bmi2")]
unsafe fn nibble_group<const KIND: u8, const R: usize, const NR: usize>(
    c: &NibConsts,
    w: &[*const u8; NR],
    t: &Tile,
    g: usize,
    sum: &mut [[__m512; R]; NR],
) {
    let bb = [18usize, 20, 22, 24][KIND as usize];
    let five = KIND >= 2;
    let with_min = KIND % 2 == 1;
    let span = 4 * bb;
    // SAFETY: the group's span and prepared bytes are readable (caller).
    unsafe {
        let mut lo = [_mm512_setzero_si512(); NR];
        let mut hi = [_mm512_setzero_si512(); NR];
        let mut dw = [_mm512_setzero_ps(); NR];
        let mut mw = [_mm512_setzero_ps(); NR];
        for j in 0..NR {
            let p = w[j].add(g * span);
            t.prefetch(span);
            let l0 = _mm512_loadu_si512(p.cast());
            let l1 = _mm512_loadu_si512(p.add(span - 64).cast());
            let q = _mm512_permutex2var_epi8(l0, c.qidx, l1);
            lo[j] = _mm512_and_si512(q, c.low4);
            hi[j] = _mm512_gf2p8affine_epi64_epi8::<0>(q, c.shr4);
            if five {
                let qh = _mm512_permutex2var_epi16(l0, c.qhidx, l1);
                let kl = _mm512_bitshuffle_epi64_mask(qh, c.lo_bits);
                let kh = _mm512_bitshuffle_epi64_mask(qh, c.hi_bits);
                lo[j] = _mm512_mask_add_epi8(lo[j], kl, lo[j], c.sixteen);
                hi[j] = _mm512_mask_add_epi8(hi[j], kh, hi[j], c.sixteen);
            }
            dw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(
                l0, c.didx, l1,
            )));
            if with_min {
                mw[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(
                    l0, c.midx, l1,
                )));
            }
        }
        for r in 0..R {
            let ar = t.a.add(r * t.rb + g * NIB_GROUP);
            let xlo = _mm512_load_si512(ar.cast());
            let xhi = _mm512_load_si512(ar.add(64).cast());
            let third = _mm512_load_si512(ar.add(128).cast());
            let dx = _mm512_load_ps(ar.add(192).cast());
            for j in 0..NR {
                let init = if with_min {
                    _mm512_setzero_si512()
                } else {
                    third
                };
                let acc = _mm512_dpbusd_epi32(init, lo[j], xlo);
                let acc = _mm512_dpbusd_epi32(acc, hi[j], xhi);
                let scale = _mm512_mul_ps(dw[j], dx);
                let mut s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), scale, sum[j][r]);
                if with_min {
                    s = _mm512_fmadd_ps(mw[j], _mm512_castsi512_ps(third), s);
                }
                sum[j][r] = s;
            }
        }
    }
}

/// Runs `$rows::<.., NR>(consts, t, n)` over the tile's weight rows two at a time (one
/// for an odd last row): two rows share each load of the activations.
macro_rules! row_pairs {
    ($rows:ident, $c:expr, $t:expr, $($p:tt),*) => {{
        let t: &Tile = $t;
        let mut n = 0;
        // SAFETY: rows n..n+NR < rows (the Tile contract covers them).
        unsafe {
            while n + 2 <= t.rows {
                $rows::<$($p,)* 2>($c, t, n);
                n += 2;
            }
            if n < t.rows {
                $rows::<$($p,)* 1>($c, t, n);
            }
        }
    }};
}

/// The weight row pointers `n..n + NR` of a tile.
///
/// # Safety
/// `n + NR <= t.rows`.
#[inline(always)]
unsafe fn row_ptrs<const NR: usize>(t: &Tile, n: usize) -> [*const u8; NR] {
    // SAFETY: inside the tile's weights (caller).
    std::array::from_fn(|j| unsafe { t.w.add((n + j) * t.wrow) })
}

/// Q8_0 (`KIND` 0) and Q8_1 (1): groups of 4 blocks, two per vector; weights made
/// unsigned by flipping the sign bit (`w + 128`), the `128 Σ x` it adds removed by the
/// prepared per-lane corrections.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
unsafe fn q8<const KIND: u8, const R: usize>(t: &Tile) {
    let bb = [34usize, 36][KIND as usize];
    let qs = [2usize, 4][KIND as usize];
    // Two blocks from loads at 0 and 2 bb - 64; the scales of four from the pairs' first
    // loads (the second pair's in the second table).
    let qidx = table(gather_index(2, 32, bb, qs, 2 * bb));
    let mut didx = spread_index(2, 8, bb, 0, 2 * bb);
    for o in 16..32 {
        let wi = 32 + (bb * ((o - 16) / 8)) / 2;
        didx[2 * o..2 * o + 2].copy_from_slice(&(wi as u16).to_le_bytes());
    }
    let c = [qidx, table(didx)];
    row_pairs!(q8_rows, &c, t, KIND, R);
}

/// Weight rows `n..n + NR` of a Q8 tile.
///
/// # Safety
/// `n + NR <= t.rows`; the [`Tile`] contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
unsafe fn q8_rows<const KIND: u8, const R: usize, const NR: usize>(
    c: &[__m512i; 2],
    t: &Tile,
    n: usize,
) {
    let bb = [34usize, 36][KIND as usize];
    let flip = _mm512_set1_epi8(-128);
    let mut sum = [[[_mm512_setzero_ps(); 2]; R]; NR];
    // SAFETY: groups g < k / 128 lie inside each row and each prepared row.
    unsafe {
        let w = row_ptrs::<NR>(t, n);
        for g in 0..t.k / 128 {
            let mut z = [[_mm512_setzero_si512(); 2]; NR];
            let mut dw = [[_mm512_setzero_ps(); 2]; NR];
            for j in 0..NR {
                let p = w[j].add(g * 4 * bb);
                t.prefetch(4 * bb);
                let l0 = _mm512_loadu_si512(p.cast());
                let l1 = _mm512_loadu_si512(p.add(2 * bb - 64).cast());
                let l2 = _mm512_loadu_si512(p.add(2 * bb).cast());
                let l3 = _mm512_loadu_si512(p.add(4 * bb - 64).cast());
                z[j][0] = _mm512_xor_si512(_mm512_permutex2var_epi8(l0, c[0], l1), flip);
                z[j][1] = _mm512_xor_si512(_mm512_permutex2var_epi8(l2, c[0], l3), flip);
                let d = _mm512_permutex2var_epi16(l0, c[1], l2);
                dw[j][0] = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
                dw[j][1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(d));
            }
            for r in 0..R {
                let ar = t.a.add(r * t.rb + g * Q8_GROUP);
                for h in 0..2 {
                    let x = _mm512_load_si512(ar.add(64 * h).cast());
                    let corr = _mm512_load_si512(ar.add(128 + 64 * h).cast());
                    let dx = _mm512_load_ps(ar.add(256 + 64 * h).cast());
                    for j in 0..NR {
                        let acc = _mm512_dpbusd_epi32(corr, z[j][h], x);
                        let sc = _mm512_mul_ps(dw[j][h], dx);
                        sum[j][r][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, sum[j][r][h]);
                    }
                }
            }
        }
        for j in 0..NR {
            for r in 0..R {
                t.store(r, n + j, hsum(_mm512_add_ps(sum[j][r][0], sum[j][r][1])));
            }
        }
    }
}

/// The 8 six-bit scales (bytes 0..8) and mins (8..16) of a Q4_K/Q5_K super-block from its 12
/// packed bytes at `p` (ggml's `get_scale_min_k4` for all 8 at once), in general-purpose
/// registers: the vector units are this loop's bottleneck, the integer ones idle.
///
/// # Safety
/// 12 bytes at `p` readable; SSE4.1.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn k4_scales(p: *const u8) -> __m128i {
    // SAFETY: bytes 0..12 at p.
    let (u0, u1, u2) = unsafe {
        (
            p.cast::<u32>().read_unaligned(),
            p.add(4).cast::<u32>().read_unaligned(),
            p.add(8).cast::<u32>().read_unaligned(),
        )
    };
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let sc_lo = u0 & M6;
    let sc_hi = (u2 & M4) | (((u0 >> 6) & M2) << 4);
    let m_lo = u1 & M6;
    let m_hi = ((u2 >> 4) & M4) | (((u1 >> 6) & M2) << 4);
    let lo = sc_lo as u64 | (sc_hi as u64) << 32;
    let hi = m_lo as u64 | (m_hi as u64) << 32;
    _mm_set_epi64x(hi as i64, lo as i64)
}

/// The constants of the K kernels: four scale-spreading `vpshufb` controls, four bit-moving
/// matrices (Q5_K's fifth bits, Q6_K's high pairs), and the nibble helpers.
struct KConsts {
    sidx: [__m512i; 4],
    hm: [__m512i; 4],
    low4: __m512i,
    shr4: __m512i,
}

/// A `vpshufb` control that fills each 128-bit lane `l` with copies of word `words[l]` of
/// that lane (whose source holds the same 8 words in every lane).
#[inline]
#[target_feature(enable = "avx512f")]
fn spread_words(words: [u8; 4]) -> __m512i {
    let t: [u8; 64] = std::array::from_fn(|i| 2 * words[i / 16] + (i % 2) as u8);
    // SAFETY: 64 bytes.
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// A qword vector: the low four qwords `lo`, the high four `hi`.
#[inline]
#[target_feature(enable = "avx512f")]
fn two(lo: u64, hi: u64) -> __m512i {
    _mm512_setr_epi64(
        lo as i64, lo as i64, lo as i64, lo as i64, hi as i64, hi as i64, hi as i64, hi as i64,
    )
}

/// Q4_K (`FIVE` false) and Q5_K (true): per super-block two 64-byte quant loads give four
/// vectors of two 32-element sub-blocks each; `vpmaddubsw` against the prepared
/// activations, `vpdpwssd` with the sub-blocks' scales, and the mins from the 32-sums.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q45k<const FIVE: bool, const R: usize>(t: &Tile) {
    // Fifth bits: vector v, half h takes bit 4 (v / 2) + 2 h + v % 2 of qh.
    let hmove = |v: u32| {
        two(
            bit_move(4 * (v / 2) + v % 2, 4),
            bit_move(4 * (v / 2) + 2 + v % 2, 4),
        )
    };
    let c = KConsts {
        sidx: [
            spread_words([0, 0, 2, 2]),
            spread_words([1, 1, 3, 3]),
            spread_words([4, 4, 6, 6]),
            spread_words([5, 5, 7, 7]),
        ],
        hm: [hmove(0), hmove(1), hmove(2), hmove(3)],
        low4: _mm512_set1_epi8(0x0F),
        shr4: _mm512_set1_epi64(SHR4 as i64),
    };
    row_pairs!(q45k_rows, &c, t, FIVE, R);
}

/// Weight rows `n..n + NR` of a Q4_K/Q5_K tile.
///
/// # Safety
/// `n + NR <= t.rows`; the [`Tile`] contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q45k_rows<const FIVE: bool, const R: usize, const NR: usize>(
    c: &KConsts,
    t: &Tile,
    n: usize,
) {
    let (bb, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let mut sum = [[_mm512_setzero_ps(); R]; NR];
    let mut mins = [[_mm_setzero_ps(); R]; NR];
    // SAFETY: super-blocks s < k / 256 lie inside each row and each prepared row.
    unsafe {
        let w = row_ptrs::<NR>(t, n);
        for s in 0..t.k / 256 {
            let mut v = [[_mm512_setzero_si512(); 4]; NR];
            let mut scv = [[_mm512_setzero_si512(); 4]; NR];
            let mut m16 = [_mm_setzero_si128(); NR];
            let mut d = [_mm512_setzero_ps(); NR];
            let mut dmin = [_mm_setzero_ps(); NR];
            for j in 0..NR {
                let p = w[j].add(s * bb);
                t.prefetch(bb);
                let q0 = _mm512_loadu_si512(p.add(qs).cast());
                let q1 = _mm512_loadu_si512(p.add(qs + 64).cast());
                v[j] = [
                    _mm512_and_si512(q0, c.low4),
                    _mm512_gf2p8affine_epi64_epi8::<0>(q0, c.shr4),
                    _mm512_and_si512(q1, c.low4),
                    _mm512_gf2p8affine_epi64_epi8::<0>(q1, c.shr4),
                ];
                if FIVE {
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(16).cast()));
                    for (vi, h) in v[j].iter_mut().zip(&c.hm) {
                        *vi = _mm512_or_si512(*vi, _mm512_gf2p8affine_epi64_epi8::<0>(qh, *h));
                    }
                }
                let sm = k4_scales(p.add(4));
                let sc8 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
                for (o, idx) in scv[j].iter_mut().zip(&c.sidx) {
                    *o = _mm512_shuffle_epi8(sc8, *idx);
                }
                m16[j] = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
                d[j] = _mm512_broadcastss_ps(dd);
                dmin[j] = _mm_broadcastss_ps(_mm_movehdup_ps(dd));
            }
            for r in 0..R {
                let ar = t.a.add(r * t.rb + s * K_SB);
                let x: [__m512i; 4] =
                    std::array::from_fn(|i| _mm512_load_si512(ar.add(64 * i).cast()));
                let xs = _mm_load_si128(ar.add(256).cast());
                let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                for j in 0..NR {
                    let acc0 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][0], x[0]), scv[j][0]),
                        _mm512_maddubs_epi16(v[j][1], x[1]),
                        scv[j][1],
                    );
                    let acc1 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][2], x[2]), scv[j][2]),
                        _mm512_maddubs_epi16(v[j][3], x[3]),
                        scv[j][3],
                    );
                    let acc = _mm512_add_epi32(acc0, acc1);
                    sum[j][r] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(acc),
                        _mm512_mul_ps(d[j], dx),
                        sum[j][r],
                    );
                    let mi = _mm_madd_epi16(m16[j], xs);
                    let dxm = _mm_mul_ps(dmin[j], _mm512_castps512_ps128(dx));
                    mins[j][r] = _mm_fmadd_ps(_mm_cvtepi32_ps(mi), dxm, mins[j][r]);
                }
            }
        }
        for j in 0..NR {
            for r in 0..R {
                let m = mins[j][r];
                let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_add_ss(m, _mm_movehdup_ps(m));
                t.store(r, n + j, hsum(sum[j][r]) - _mm_cvtss_f32(m));
            }
        }
    }
}

/// Q6_K: per 128-element half, one 64-byte load of low nibbles and the 32 bytes of high
/// bit pairs (broadcast, moved into place by GFNI per 256-bit half) give two vectors of
/// four 16-element sub-blocks; `vpmaddubsw` on the unsigned `q + 32`, `vpdpwssd` with the
/// int8 scales, and `32 Σ sc_j bsum_j` subtracted once per super-block.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q6k<const UNUSED: u8, const R: usize>(t: &Tile) {
    // High pairs: the low-nibble vector takes bits (0,1) | (2,3), the high-nibble one
    // (4,5) | (6,7), into bits 4, 5.
    let h_lo = two(
        bit_move(0, 4) | bit_move(1, 5),
        bit_move(2, 4) | bit_move(3, 5),
    );
    let h_hi = two(
        bit_move(4, 4) | bit_move(5, 5),
        bit_move(6, 4) | bit_move(7, 5),
    );
    let c = KConsts {
        sidx: [
            spread_words([0, 1, 2, 3]),
            spread_words([4, 5, 6, 7]),
            spread_words([0, 1, 2, 3]),
            spread_words([4, 5, 6, 7]),
        ],
        hm: [h_lo, h_hi, h_lo, h_hi],
        low4: _mm512_set1_epi8(0x0F),
        shr4: _mm512_set1_epi64(SHR4 as i64),
    };
    row_pairs!(q6k_rows, &c, t, R);
}

/// Weight rows `n..n + NR` of a Q6_K tile.
///
/// # Safety
/// `n + NR <= t.rows`; the [`Tile`] contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q6k_rows<const R: usize, const NR: usize>(c: &KConsts, t: &Tile, n: usize) {
    let mut sum = [[_mm512_setzero_ps(); R]; NR];
    // SAFETY: super-blocks s < k / 256 lie inside each row and each prepared row.
    unsafe {
        let w = row_ptrs::<NR>(t, n);
        for s in 0..t.k / 256 {
            let mut v = [[_mm512_setzero_si512(); 4]; NR];
            let mut scv = [[_mm512_setzero_si512(); 4]; NR];
            let mut sc16 = [_mm256_setzero_si256(); NR];
            let mut d = [_mm512_setzero_ps(); NR];
            for j in 0..NR {
                let p = w[j].add(s * 210);
                t.prefetch(210);
                for h in 0..2 {
                    let ql = _mm512_loadu_si512(p.add(64 * h).cast());
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h).cast()));
                    // (ql & 0x0F) | high pairs: ternary logic 0xEA is (a & b) | c.
                    v[j][2 * h] = _mm512_ternarylogic_epi32::<0xEA>(
                        ql,
                        c.low4,
                        _mm512_gf2p8affine_epi64_epi8::<0>(qh, c.hm[0]),
                    );
                    v[j][2 * h + 1] = _mm512_or_si512(
                        _mm512_gf2p8affine_epi64_epi8::<0>(ql, c.shr4),
                        _mm512_gf2p8affine_epi64_epi8::<0>(qh, c.hm[1]),
                    );
                }
                sc16[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
                // Sub-blocks 0..8 in every lane for the first half, 8..16 for the second.
                let first = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16[j]));
                let second = _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16[j]));
                for (i, (o, idx)) in scv[j].iter_mut().zip(&c.sidx).enumerate() {
                    *o = _mm512_shuffle_epi8(if i < 2 { first } else { second }, *idx);
                }
                d[j] = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(
                    p.add(208).cast::<u16>().read_unaligned() as i32,
                )));
            }
            for r in 0..R {
                let ar = t.a.add(r * t.rb + s * K_SB);
                let x: [__m512i; 4] =
                    std::array::from_fn(|i| _mm512_load_si512(ar.add(64 * i).cast()));
                let bsums = _mm256_load_si256(ar.add(256).cast());
                let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                for j in 0..NR {
                    let acc0 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][0], x[0]), scv[j][0]),
                        _mm512_maddubs_epi16(v[j][1], x[1]),
                        scv[j][1],
                    );
                    let acc1 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][2], x[2]), scv[j][2]),
                        _mm512_maddubs_epi16(v[j][3], x[3]),
                        scv[j][3],
                    );
                    // 32 Σ_j sc_j bsum_j, in 8 lanes.
                    let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16[j], bsums));
                    let acc = _mm512_sub_epi32(
                        _mm512_add_epi32(acc0, acc1),
                        _mm512_zextsi256_si512(corr),
                    );
                    sum[j][r] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(acc),
                        _mm512_mul_ps(d[j], dx),
                        sum[j][r],
                    );
                }
            }
        }
        for j in 0..NR {
            for r in 0..R {
                t.store(r, n + j, hsum(sum[j][r]));
            }
        }
    }
}

/// Q2_K (`THREE` false) and Q3_K (true): per 128-element half, the 32 bytes of 2-bit quants
/// (and Q3_K's 32 bytes of high bits, whose bits `4 h + s` belong to this half) broadcast
/// to both 256-bit halves and moved into place by GFNI, giving two vectors of four
/// 16-element sub-blocks each, natural order; then as Q6_K: `vpmaddubsw`, `vpdpwssd` with
/// the sub-block scales, Q3_K's offset 4 and Q2_K's mins through the 16-sums.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q23k<const THREE: bool, const R: usize>(t: &Tile) {
    // Vector v (0, 1) of a half holds shifts 2v (lower 256 bits) and 2v + 1 (upper).
    let low = |v: u32| {
        two(
            bit_move(4 * v, 0) | bit_move(4 * v + 1, 1),
            bit_move(4 * v + 2, 0) | bit_move(4 * v + 3, 1),
        )
    };
    let c = KConsts {
        sidx: [
            spread_words([0, 1, 2, 3]),
            spread_words([4, 5, 6, 7]),
            spread_words([0, 1, 2, 3]),
            spread_words([4, 5, 6, 7]),
        ],
        hm: [
            low(0),
            low(1),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        ],
        low4: _mm512_setzero_si512(),
        shr4: _mm512_setzero_si512(),
    };
    row_pairs!(q23k_rows, &c, t, THREE, R);
}

/// Weight rows `n..n + NR` of a Q2_K/Q3_K tile.
///
/// # Safety
/// `n + NR <= t.rows`; the [`Tile`] contract.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q23k_rows<const THREE: bool, const R: usize, const NR: usize>(
    c: &KConsts,
    t: &Tile,
    n: usize,
) {
    let bb = if THREE { 110 } else { 84 };
    let qs_at = if THREE {
        layout::q3_k::QS
    } else {
        layout::q2_k::QS
    };
    let mut sum = [[_mm512_setzero_ps(); R]; NR];
    let mut mins = [[_mm512_setzero_ps(); R]; NR];
    // SAFETY: super-blocks s < k / 256 lie inside each row and each prepared row.
    unsafe {
        let w = row_ptrs::<NR>(t, n);
        for s in 0..t.k / 256 {
            let mut v = [[_mm512_setzero_si512(); 4]; NR];
            let mut scv = [[_mm512_setzero_si512(); 4]; NR];
            let mut sc16 = [_mm256_setzero_si256(); NR];
            let mut m16 = [_mm256_setzero_si256(); NR];
            let mut d = [_mm512_setzero_ps(); NR];
            let mut dmin = [_mm512_setzero_ps(); NR];
            for j in 0..NR {
                let p = w[j].add(s * bb);
                t.prefetch(bb);
                let hm = if THREE {
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()))
                } else {
                    _mm512_setzero_si512()
                };
                for h in 0..2 {
                    let qs =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(qs_at + 32 * h).cast()));
                    for vi in 0..2 {
                        let mut q = _mm512_gf2p8affine_epi64_epi8::<0>(qs, c.hm[vi]);
                        if THREE {
                            // High bits 4h + 2vi (lower half), 4h + 2vi + 1 (upper) to bit 2.
                            let b = (4 * h + 2 * vi) as u32;
                            let mv = two(bit_move(b, 2), bit_move(b + 1, 2));
                            q = _mm512_or_si512(q, _mm512_gf2p8affine_epi64_epi8::<0>(hm, mv));
                        }
                        v[j][2 * h + vi] = q;
                    }
                }
                let (sc, mn) = if THREE {
                    // The 16 six-bit scales (ggml's kmask trick, in GPRs), minus 32.
                    let at = p.add(layout::q3_k::SCALES).cast::<u32>();
                    let (a0, a1, t2) = (
                        at.read_unaligned(),
                        at.add(1).read_unaligned(),
                        at.add(2).read_unaligned(),
                    );
                    const M2: u32 = 0x0303_0303;
                    const M4: u32 = 0x0f0f_0f0f;
                    let s0 = (a0 & M4) | ((t2 & M2) << 4);
                    let s1 = (a1 & M4) | (((t2 >> 2) & M2) << 4);
                    let s2 = ((a0 >> 4) & M4) | (((t2 >> 4) & M2) << 4);
                    let s3 = ((a1 >> 4) & M4) | (((t2 >> 6) & M2) << 4);
                    let b = _mm_sub_epi8(
                        _mm_setr_epi32(s0 as i32, s1 as i32, s2 as i32, s3 as i32),
                        _mm_set1_epi8(32),
                    );
                    (_mm256_cvtepi8_epi16(b), _mm256_setzero_si256())
                } else {
                    let b = _mm_loadu_si128(p.cast());
                    (
                        _mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0x0F))),
                        _mm256_cvtepu8_epi16(_mm_and_si128(
                            _mm_srli_epi16::<4>(b),
                            _mm_set1_epi8(0x0F),
                        )),
                    )
                };
                sc16[j] = sc;
                m16[j] = mn;
                let first = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc));
                let second = _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc));
                for (i, (o, idx)) in scv[j].iter_mut().zip(&c.sidx).enumerate() {
                    *o = _mm512_shuffle_epi8(if i < 2 { first } else { second }, *idx);
                }
                // Q2_K: d, dmin at 80, 82; Q3_K: d alone at 108, the block's last two bytes
                // (read as 16 bits: 32 would run past the weight's end).
                let bits = if THREE {
                    p.add(layout::q3_k::D).cast::<u16>().read_unaligned() as i32
                } else {
                    p.add(layout::q2_k::D).cast::<i32>().read_unaligned()
                };
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
                d[j] = _mm512_broadcastss_ps(dd);
                dmin[j] = _mm512_broadcastss_ps(_mm_movehdup_ps(dd));
            }
            for r in 0..R {
                let ar = t.a.add(r * t.rb + s * K_SB);
                let x: [__m512i; 4] =
                    std::array::from_fn(|i| _mm512_load_si512(ar.add(64 * i).cast()));
                let bsums = _mm256_load_si256(ar.add(256).cast());
                let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                for j in 0..NR {
                    let acc0 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][0], x[0]), scv[j][0]),
                        _mm512_maddubs_epi16(v[j][1], x[1]),
                        scv[j][1],
                    );
                    let acc1 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[j][2], x[2]), scv[j][2]),
                        _mm512_maddubs_epi16(v[j][3], x[3]),
                        scv[j][3],
                    );
                    let mut acc = _mm512_add_epi32(acc0, acc1);
                    if THREE {
                        // 4 Σ_j sc_j bsum_j.
                        let corr = _mm256_slli_epi32::<2>(_mm256_madd_epi16(sc16[j], bsums));
                        acc = _mm512_sub_epi32(acc, _mm512_zextsi256_si512(corr));
                    } else {
                        let mi = _mm256_madd_epi16(m16[j], bsums);
                        let f = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(mi));
                        mins[j][r] = _mm512_fmadd_ps(f, _mm512_mul_ps(dmin[j], dx), mins[j][r]);
                    }
                    sum[j][r] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(acc),
                        _mm512_mul_ps(d[j], dx),
                        sum[j][r],
                    );
                }
            }
        }
        for j in 0..NR {
            for r in 0..R {
                t.store(r, n + j, hsum(_mm512_sub_ps(sum[j][r], mins[j][r])));
            }
        }
    }
}

/// Q8_K as a weight: an f32 scale and 256 int8 per super-block, sign-flipped to unsigned
/// as in [`q8`], `128 Σ x` removed through the prepared super-block sum.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8k<const UNUSED: u8, const R: usize>(t: &Tile) {
    let flip = _mm512_set1_epi8(-128);
    for n in 0..t.rows {
        let mut sum = [0.0f32; R];
        // SAFETY: row n < rows; super-blocks s < k / 256 inside it and each prepared row.
        unsafe {
            let w = t.w.add(n * t.wrow);
            for s in 0..t.k / 256 {
                let p = w.add(s * 292);
                t.prefetch(292);
                let v: [__m512i; 4] = std::array::from_fn(|i| {
                    _mm512_xor_si512(_mm512_loadu_si512(p.add(4 + 64 * i).cast()), flip)
                });
                let d = p.cast::<f32>().read_unaligned();
                for (r, sr) in sum.iter_mut().enumerate() {
                    let ar = t.a.add(r * t.rb + s * K_SB);
                    let total = ar.add(292).cast::<i32>().read();
                    let mut acc = _mm512_setzero_si512();
                    for (i, vi) in v.iter().enumerate() {
                        acc =
                            _mm512_dpbusd_epi32(acc, *vi, _mm512_load_si512(ar.add(64 * i).cast()));
                    }
                    // The flipped sign bits add 128 Σ x, removed in integers: the lanes
                    // alone are far larger than the dot product, so their float sum would
                    // cancel.
                    let dot = _mm512_reduce_add_epi32(acc) - 128 * total;
                    let dx = ar.add(288).cast::<f32>().read();
                    *sr += dot as f32 * (d * dx);
                }
            }
            for (r, &sr) in sum.iter().enumerate() {
                t.store(r, n, sr);
            }
        }
    }
}
