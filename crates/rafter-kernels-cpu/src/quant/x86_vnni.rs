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
//!   `-offset * s` as i32 (Q4_0, Q5_0) or `dx * s` as f32 (Q4_1, Q5_1), where `s` is the sum
//!   of the 8 activations that lane's `vpdpbusd` multiplies, then 16 lanes of `dx`.
//! - Q8_0/Q8_1, per group of 4 blocks (384 bytes): the 128 activations, 32 lanes of
//!   `-128 * s` (weights are made unsigned by flipping their sign bit), 32 lanes of `dx`.
//! - K formats, per super-block (320 bytes): the 256 activations (Q4_K/Q5_K: in the order
//!   `0..32, 64..96 | 32..64, 96..128 | 128..160, 192..224 | 160..192, 224..256`, matching
//!   low and high nibbles of the 64-byte quant loads; others natural), 16 `i16` sums (per
//!   32 for Q4_K/Q5_K, per 16 otherwise), `dx: f32`, the super-block's sum as `i32`.
//!
//! Blocks past the last whole group of 4 (K not a multiple of 128) run the scalar model.

use std::arch::x86_64::*;

use rafter_quant::BlockFormat;

use super::act::Act;
use super::dense::MR;
use super::gemv::AlignedBytes;
use super::gemv_scalar;

/// Whether a format has kernels here.
pub(crate) fn supports(format: BlockFormat) -> bool {
    !matches!(format, BlockFormat::Q2_K | BlockFormat::Q3_K)
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
                for (g, o) in out.chunks_exact_mut(NIB_GROUP).enumerate() {
                    let xg = &x[128 * g..][..128];
                    for b in 0..4 {
                        for t in 0..16 {
                            o[16 * b + t] = xg[32 * b + t] as u8;
                            o[64 + 16 * b + t] = xg[32 * b + 16 + t] as u8;
                        }
                    }
                    for i in 0..16 {
                        let (b, u) = (i / 4, i % 4);
                        let s: i32 = (0..4)
                            .map(|v| {
                                xg[32 * b + 4 * u + v] as i32 + xg[32 * b + 16 + 4 * u + v] as i32
                            })
                            .sum();
                        let d = dx[4 * g + b];
                        match format {
                            BlockFormat::Q4_0 => put_i32(o, 128 + 4 * i, -8 * s),
                            BlockFormat::Q5_0 => put_i32(o, 128 + 4 * i, -16 * s),
                            _ => put_f32(o, 128 + 4 * i, d * s as f32),
                        }
                        put_f32(o, 192 + 4 * i, d);
                    }
                }
            }
            Family::Q8 => {
                for (g, o) in out.chunks_exact_mut(Q8_GROUP).enumerate() {
                    let xg = &x[128 * g..][..128];
                    for (dst, &v) in o[..128].iter_mut().zip(xg) {
                        *dst = v as u8;
                    }
                    for i in 0..32 {
                        let s: i32 = xg[4 * i..4 * i + 4].iter().map(|&v| v as i32).sum();
                        put_i32(o, 128 + 4 * i, -128 * s);
                        put_f32(o, 256 + 4 * i, dx[4 * g + i / 8]);
                    }
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

/// `out[i * out_ld + c]` = row `r0 + i` of x times weight row `c`, for `i < m <= MR` and
/// the `w.len() / row_bytes` weight rows in `w`.
///
/// # Safety
/// `w` is whole rows of `format` blocks for `act.k` elements; rows `r0..r0 + m` of `act`
/// exist; `aux` was made by [`prepare`] for `format` from `act`; AVX-512F/BW/VBMI/VNNI,
/// GFNI and BMI2 are available.
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
    };
    // SAFETY (every arm): `t` describes `rows` whole weight rows, the prepared rows
    // r0..r0+m and an output of m rows of `rows` floats (asserted above); the features are
    // available (caller).
    macro_rules! rows {
        ($kern:ident, $($c:expr),*) => {
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
        BlockFormat::Q2_K | BlockFormat::Q3_K => unreachable!("not supported here"),
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
}

impl Tile {
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
}

/// Q4_0 (`KIND` 0), Q4_1 (1), Q5_0 (2), Q5_1 (3): groups of 4 blocks, one per 128-bit
/// lane; low nibbles and high nibbles each one `vpdpbusd` against the split activations.
/// Two groups an iteration, into separate accumulators (FMA latency).
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni,bmi2")]
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
    };
    let groups = t.k / 128;
    for n in 0..t.rows {
        let mut s0 = [_mm512_setzero_ps(); R];
        let mut s1 = [_mm512_setzero_ps(); R];
        let mut mins = [_mm512_setzero_ps(); R];
        // SAFETY: row n < rows; groups g < k / 128 lie inside it and inside each prepared
        // row (the Tile contract).
        unsafe {
            let w = t.w.add(n * t.wrow);
            let mut g = 0;
            while g + 2 <= groups {
                nibble_group::<KIND, R>(&c, w, t, g, &mut s0, &mut mins);
                nibble_group::<KIND, R>(&c, w, t, g + 1, &mut s1, &mut mins);
                g += 2;
            }
            if g < groups {
                nibble_group::<KIND, R>(&c, w, t, g, &mut s0, &mut mins);
            }
            for r in 0..R {
                t.store(
                    r,
                    n,
                    hsum(_mm512_add_ps(_mm512_add_ps(s0[r], s1[r]), mins[r])),
                );
            }
        }
    }
}

/// Group `g` of the weight row at `w` into `sum` (and `mins`, for the `_1` formats).
///
/// # Safety
/// Group `g` lies inside the row and inside the prepared rows < R of `t`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni,bmi2")]
unsafe fn nibble_group<const KIND: u8, const R: usize>(
    c: &NibConsts,
    w: *const u8,
    t: &Tile,
    g: usize,
    sum: &mut [__m512; R],
    mins: &mut [__m512; R],
) {
    let bb = [18usize, 20, 22, 24][KIND as usize];
    let qh_at = [0usize, 0, 2, 4][KIND as usize];
    let five = KIND >= 2;
    let with_min = KIND % 2 == 1;
    let span = 4 * bb;
    // SAFETY: the group's span and prepared bytes are readable (caller).
    unsafe {
        let p = w.add(g * span);
        let l0 = _mm512_loadu_si512(p.cast());
        let l1 = _mm512_loadu_si512(p.add(span - 64).cast());
        let q = _mm512_permutex2var_epi8(l0, c.qidx, l1);
        let mut lo = _mm512_and_si512(q, c.low4);
        let mut hi = _mm512_gf2p8affine_epi64_epi8::<0>(q, c.shr4);
        if five {
            let h0 = p.add(qh_at).cast::<u32>().read_unaligned() as u64;
            let h1 = p.add(bb + qh_at).cast::<u32>().read_unaligned() as u64;
            let h2 = p.add(2 * bb + qh_at).cast::<u32>().read_unaligned() as u64;
            let h3 = p.add(3 * bb + qh_at).cast::<u32>().read_unaligned() as u64;
            let (h01, h23) = (h0 | h1 << 32, h2 | h3 << 32);
            const LO: u64 = 0x0000_FFFF_0000_FFFF;
            const HI: u64 = 0xFFFF_0000_FFFF_0000;
            let kl = _pext_u64(h01, LO) | _pext_u64(h23, LO) << 32;
            let kh = _pext_u64(h01, HI) | _pext_u64(h23, HI) << 32;
            lo = _mm512_mask_add_epi8(lo, kl, lo, c.sixteen);
            hi = _mm512_mask_add_epi8(hi, kh, hi, c.sixteen);
        }
        let dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(
            l0, c.didx, l1,
        )));
        let mw = if with_min {
            _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(
                l0, c.midx, l1,
            )))
        } else {
            _mm512_setzero_ps()
        };
        for r in 0..R {
            let ar = t.a.add(r * t.rb + g * NIB_GROUP);
            let third = _mm512_load_si512(ar.add(128).cast());
            let init = if with_min {
                _mm512_setzero_si512()
            } else {
                third
            };
            let acc = _mm512_dpbusd_epi32(init, lo, _mm512_load_si512(ar.cast()));
            let acc = _mm512_dpbusd_epi32(acc, hi, _mm512_load_si512(ar.add(64).cast()));
            let scale = _mm512_mul_ps(dw, _mm512_load_ps(ar.add(192).cast()));
            sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), scale, sum[r]);
            if with_min {
                mins[r] = _mm512_fmadd_ps(mw, _mm512_castsi512_ps(third), mins[r]);
            }
        }
    }
}

/// Q8_0 (`KIND` 0) and Q8_1 (1): groups of 4 blocks, two per vector; weights made
/// unsigned by flipping the sign bit (`w + 128`), the `128 Σ x` it adds removed by the
/// prepared per-lane corrections.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
unsafe fn q8<const KIND: u8, const R: usize>(t: &Tile) {
    let (k, a, rb) = (t.k, t.a, t.rb);
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
    let didx = table(didx);
    let flip = _mm512_set1_epi8(-128);
    for n in 0..t.rows {
        // SAFETY: row n < rows of the tile (the Tile contract).
        let w = unsafe { t.w.add(n * t.wrow) };
        let mut sum = [[_mm512_setzero_ps(); 2]; R];
        for g in 0..k / 128 {
            // SAFETY: group g (4 blocks) lies inside the row; prepared group g of rows < R
            // inside `a`.
            unsafe {
                let p = w.add(g * 4 * bb);
                let l0 = _mm512_loadu_si512(p.cast());
                let l1 = _mm512_loadu_si512(p.add(2 * bb - 64).cast());
                let l2 = _mm512_loadu_si512(p.add(2 * bb).cast());
                let l3 = _mm512_loadu_si512(p.add(4 * bb - 64).cast());
                let z0 = _mm512_xor_si512(_mm512_permutex2var_epi8(l0, qidx, l1), flip);
                let z1 = _mm512_xor_si512(_mm512_permutex2var_epi8(l2, qidx, l3), flip);
                let d = _mm512_permutex2var_epi16(l0, didx, l2);
                let dw0 = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
                let dw1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(d));
                for (r, s) in sum.iter_mut().enumerate() {
                    let ar = a.add(r * rb + g * Q8_GROUP);
                    let acc0 = _mm512_dpbusd_epi32(
                        _mm512_load_si512(ar.add(128).cast()),
                        z0,
                        _mm512_load_si512(ar.cast()),
                    );
                    let acc1 = _mm512_dpbusd_epi32(
                        _mm512_load_si512(ar.add(192).cast()),
                        z1,
                        _mm512_load_si512(ar.add(64).cast()),
                    );
                    let sc0 = _mm512_mul_ps(dw0, _mm512_load_ps(ar.add(256).cast()));
                    let sc1 = _mm512_mul_ps(dw1, _mm512_load_ps(ar.add(320).cast()));
                    s[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc0), sc0, s[0]);
                    s[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc1), sc1, s[1]);
                }
            }
        }
        for (r, s) in sum.iter().enumerate() {
            // SAFETY: r < m, n < rows.
            unsafe { t.store(r, n, hsum(_mm512_add_ps(s[0], s[1]))) };
        }
    }
}

/// The 8 six-bit scales (bytes 0..8) and mins (8..16) of a Q4_K/Q5_K super-block from its 12
/// packed bytes at `p` (ggml's `get_scale_min_k4` for all 8 at once).
///
/// # Safety
/// 16 bytes at `p` readable; SSSE3.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn k4_scales(p: *const u8) -> __m128i {
    // SAFETY: 16 bytes (12 scale bytes and 4 quant bytes, masked off below).
    let s = unsafe { _mm_loadu_si128(p.cast()) };
    // sc_j: j < 4: s[j] & 63; j >= 4: s[j+4] & 15 | (s[j-4] >> 6) << 4.
    // m_j:  j < 4: s[j+4] & 63; j >= 4: s[j+4] >> 4 | (s[j] >> 6) << 4.
    let v1 = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let v2 = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let low = _mm_and_si128(
        v1,
        _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0),
    );
    let nib = _mm_and_si128(
        _mm_srli_epi16::<4>(v1),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15),
    );
    let top = _mm_and_si128(_mm_srli_epi16::<2>(v2), _mm_set1_epi8(0x30));
    _mm_or_si128(_mm_or_si128(low, nib), top)
}

/// Q4_K (`FIVE` false) and Q5_K (true): per super-block two 64-byte quant loads give four
/// vectors of two 32-element sub-blocks each; `vpmaddubsw` against the prepared
/// activations, `vpdpwssd` with the sub-blocks' scales, and the mins from the 32-sums.
///
/// # Safety
/// [`dot_tile`]'s contract with `m == R`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,gfni")]
unsafe fn q45k<const FIVE: bool, const R: usize>(t: &Tile) {
    let (k, a, rb) = (t.k, t.a, t.rb);
    let (bb, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let low4 = _mm512_set1_epi8(0x0F);
    let shr4 = _mm512_set1_epi64(SHR4 as i64);
    // Scale index per vector: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7), 16 words each.
    let sidx = |a: u16, b: u16| {
        let mut t = [0u16; 32];
        t[..16].fill(a);
        t[16..].fill(b);
        // SAFETY: 64 bytes.
        unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
    };
    let sidx = [sidx(0, 2), sidx(1, 3), sidx(4, 6), sidx(5, 7)];
    // Fifth bits: vector v, half h takes bit 2 (2 (v / 2) + h) + v % 2 of qh.
    let hmove = |v: u32| {
        let lo = bit_move(4 * (v / 2) + v % 2, 4);
        let hi = bit_move(4 * (v / 2) + 2 + v % 2, 4);
        _mm512_setr_epi64(
            lo as i64, lo as i64, lo as i64, lo as i64, hi as i64, hi as i64, hi as i64, hi as i64,
        )
    };
    let hm = [hmove(0), hmove(1), hmove(2), hmove(3)];
    for n in 0..t.rows {
        // SAFETY: row n < rows of the tile (the Tile contract).
        let w = unsafe { t.w.add(n * t.wrow) };
        let mut sum = [_mm512_setzero_ps(); R];
        let mut mins = [_mm_setzero_ps(); R];
        for s in 0..k / 256 {
            // SAFETY: super-block s lies inside the row; prepared super-block s of rows < R
            // inside `a`.
            unsafe {
                let p = w.add(s * bb);
                let q0 = _mm512_loadu_si512(p.add(qs).cast());
                let q1 = _mm512_loadu_si512(p.add(qs + 64).cast());
                let mut v = [
                    _mm512_and_si512(q0, low4),
                    _mm512_gf2p8affine_epi64_epi8::<0>(q0, shr4),
                    _mm512_and_si512(q1, low4),
                    _mm512_gf2p8affine_epi64_epi8::<0>(q1, shr4),
                ];
                if FIVE {
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(16).cast()));
                    for (vi, h) in v.iter_mut().zip(&hm) {
                        *vi = _mm512_or_si512(*vi, _mm512_gf2p8affine_epi64_epi8::<0>(qh, *h));
                    }
                }
                let sm = k4_scales(p.add(4));
                let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
                let scv = [
                    _mm512_permutexvar_epi16(sidx[0], sc16),
                    _mm512_permutexvar_epi16(sidx[1], sc16),
                    _mm512_permutexvar_epi16(sidx[2], sc16),
                    _mm512_permutexvar_epi16(sidx[3], sc16),
                ];
                let m16 = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
                let d = _mm512_broadcastss_ps(dd);
                let dmin = _mm_broadcastss_ps(_mm_movehdup_ps(dd));
                for r in 0..R {
                    let ar = a.add(r * rb + s * K_SB);
                    let x = |i: usize| _mm512_load_si512(ar.add(64 * i).cast());
                    let acc0 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[0], x(0)), scv[0]),
                        _mm512_maddubs_epi16(v[1], x(1)),
                        scv[1],
                    );
                    let acc1 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[2], x(2)), scv[2]),
                        _mm512_maddubs_epi16(v[3], x(3)),
                        scv[3],
                    );
                    let acc = _mm512_add_epi32(acc0, acc1);
                    let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                    sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, dx), sum[r]);
                    let mi = _mm_madd_epi16(m16, _mm_load_si128(ar.add(256).cast()));
                    let dxm = _mm_mul_ps(dmin, _mm512_castps512_ps128(dx));
                    mins[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(mi), dxm, mins[r]);
                }
            }
        }
        for r in 0..R {
            let m = mins[r];
            let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_add_ss(m, _mm_movehdup_ps(m));
            // SAFETY: r < m, n < rows.
            unsafe { t.store(r, n, hsum(sum[r]) - _mm_cvtss_f32(m)) };
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
    let (k, a, rb) = (t.k, t.a, t.rb);
    let low4 = _mm512_set1_epi8(0x0F);
    let shr4 = _mm512_set1_epi64(SHR4 as i64);
    let two = |lo: u64, hi: u64| {
        _mm512_setr_epi64(
            lo as i64, lo as i64, lo as i64, lo as i64, hi as i64, hi as i64, hi as i64, hi as i64,
        )
    };
    // High pairs: low-nibble vector takes bits (0,1) | (2,3), high-nibble (4,5) | (6,7),
    // into bits 4, 5.
    let h_lo = two(
        bit_move(0, 4) | bit_move(1, 5),
        bit_move(2, 4) | bit_move(3, 5),
    );
    let h_hi = two(
        bit_move(4, 4) | bit_move(5, 5),
        bit_move(6, 4) | bit_move(7, 5),
    );
    let sidx = |s0: u16| {
        let t: [u16; 32] = std::array::from_fn(|i| s0 + i as u16 / 8);
        // SAFETY: 64 bytes.
        unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
    };
    let sidx = [sidx(0), sidx(4), sidx(8), sidx(12)];
    for n in 0..t.rows {
        // SAFETY: row n < rows of the tile (the Tile contract).
        let w = unsafe { t.w.add(n * t.wrow) };
        let mut sum = [_mm512_setzero_ps(); R];
        for s in 0..k / 256 {
            // SAFETY: super-block s lies inside the row; prepared super-block s of rows < R
            // inside `a`.
            unsafe {
                let p = w.add(s * 210);
                let mut v = [_mm512_setzero_si512(); 4];
                for h in 0..2 {
                    let ql = _mm512_loadu_si512(p.add(64 * h).cast());
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * h).cast()));
                    // (ql & 0x0F) | high pairs: ternary logic 0xEA is (a & b) | c.
                    v[2 * h] = _mm512_ternarylogic_epi32::<0xEA>(
                        ql,
                        low4,
                        _mm512_gf2p8affine_epi64_epi8::<0>(qh, h_lo),
                    );
                    v[2 * h + 1] = _mm512_or_si512(
                        _mm512_gf2p8affine_epi64_epi8::<0>(ql, shr4),
                        _mm512_gf2p8affine_epi64_epi8::<0>(qh, h_hi),
                    );
                }
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
                let sc = _mm512_castsi256_si512(sc16);
                let scv = [
                    _mm512_permutexvar_epi16(sidx[0], sc),
                    _mm512_permutexvar_epi16(sidx[1], sc),
                    _mm512_permutexvar_epi16(sidx[2], sc),
                    _mm512_permutexvar_epi16(sidx[3], sc),
                ];
                let d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(
                    p.add(208).cast::<u16>().read_unaligned() as i32,
                )));
                for r in 0..R {
                    let ar = a.add(r * rb + s * K_SB);
                    let x = |i: usize| _mm512_load_si512(ar.add(64 * i).cast());
                    let acc0 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[0], x(0)), scv[0]),
                        _mm512_maddubs_epi16(v[1], x(1)),
                        scv[1],
                    );
                    let acc1 = _mm512_dpwssd_epi32(
                        _mm512_madd_epi16(_mm512_maddubs_epi16(v[2], x(2)), scv[2]),
                        _mm512_maddubs_epi16(v[3], x(3)),
                        scv[3],
                    );
                    // 32 Σ_j sc_j bsum_j, in 8 lanes.
                    let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(
                        sc16,
                        _mm256_load_si256(ar.add(256).cast()),
                    ));
                    let acc = _mm512_sub_epi32(
                        _mm512_add_epi32(acc0, acc1),
                        _mm512_zextsi256_si512(corr),
                    );
                    let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                    sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, dx), sum[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: r < m, n < rows.
            unsafe { t.store(r, n, hsum(sum[r])) };
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
    let (k, a, rb) = (t.k, t.a, t.rb);
    let flip = _mm512_set1_epi8(-128);
    for n in 0..t.rows {
        // SAFETY: row n < rows of the tile (the Tile contract).
        let w = unsafe { t.w.add(n * t.wrow) };
        let mut sum = [_mm512_setzero_ps(); R];
        for s in 0..k / 256 {
            // SAFETY: super-block s lies inside the row; prepared super-block s of rows < R
            // inside `a`.
            unsafe {
                let p = w.add(s * 292);
                let v: [__m512i; 4] = std::array::from_fn(|i| {
                    _mm512_xor_si512(_mm512_loadu_si512(p.add(4 + 64 * i).cast()), flip)
                });
                let d = _mm512_set1_ps(p.cast::<f32>().read_unaligned());
                for r in 0..R {
                    let ar = a.add(r * rb + s * K_SB);
                    let init = _mm512_zextsi128_si512(_mm_cvtsi32_si128(
                        -128 * ar.add(292).cast::<i32>().read(),
                    ));
                    let mut acc = init;
                    for (i, vi) in v.iter().enumerate() {
                        acc =
                            _mm512_dpbusd_epi32(acc, *vi, _mm512_load_si512(ar.add(64 * i).cast()));
                    }
                    let dx = _mm512_set1_ps(ar.add(288).cast::<f32>().read());
                    sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, dx), sum[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: r < m, n < rows.
            unsafe { t.store(r, n, hsum(sum[r])) };
        }
    }
}
