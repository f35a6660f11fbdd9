//! `C = A B (+ epilogue)` with B in int8 panels: dynamic quantization of A, the thread
//! split, the scalar kernel, and the dequantizing epilogue.

use super::int8_packed::{round_even_small, scale_of, PackedI8BRef, GROUP_BYTES, I8_MAX_K};
use super::Ptr;
use crate::kernel::{epilogue_scalar, Isa, PANEL};
use crate::{check_product, Epilogue, GemmError, MatMut, MatRef, Parallel};

/// The activations' zero point: `qa = round(a / sa) + 128` lies in `[1, 255]`, the u8
/// operand `vpdpbusd` wants; `sum_k qa qb - 128 colsum` removes the offset exactly.
const ZERO_POINT: i32 = 128;

/// Columns of one tile buffer, and rows of one pass over them.
const OUT_LD: usize = 64;
const OUT_ROWS: usize = 8;

/// Which int8 kernels an [`Isa`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// AVX-512F + BW + VNNI: `vpdpbusd zmm`, 64 `u8 x i8` products per instruction.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// AVX2: both operands sign/zero-extended to i16 and multiplied with `vpmaddwd`, which
    /// is exact (a pair sums to at most `2 * 255 * 127`). `vpmaddubsw` would be faster but
    /// saturates at 32767, so it is not used. Also what AVX-512 CPUs without VNNI run.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable Rust (also what NEON runs for now).
    Scalar,
}

impl Path {
    pub(crate) fn of(isa: Isa) -> Path {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512
                if std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512bw") =>
            {
                Path::Avx512Vnni
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx2 if std::arch::is_x86_feature_detected!("avx2") => Path::Avx2,
            _ => Path::Scalar,
        }
    }

    /// (rows per pass, columns per tile).
    fn tile(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Vnni => (8, 64),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => (4, 32),
            Path::Scalar => (4, 16),
        }
    }
}

/// One call of an int8 kernel: `rows x 16 np` raw i32 accumulators of `qA qB`, stored into
/// `out` (row stride [`OUT_LD`] i32s).
pub(crate) struct I8Tile {
    /// k groups (of 4) to accumulate.
    pub kg: usize,
    /// Row `r` of quantized A at `a + r * lda`, `4 kg` bytes (zero-padded past K).
    pub a: *const u8,
    pub lda: usize,
    /// Panel `w` of B at `b + w * ps`, `kg * 64` bytes.
    pub b: *const i8,
    pub ps: usize,
    pub out: *mut i32,
}

/// `C = A B`, then the epilogue, with B quantized to int8 per column and A quantized to
/// u8 per row on the fly; on the fastest int8 kernels this CPU has, with tasks run by `par`.
///
/// Why: int8 weights are a quarter of f32's bytes, so a decode step (one row of A, bound
/// by weight bandwidth) reads 4x fewer bytes, and `vpdpbusd` does 64 multiply-adds per
/// instruction where f32 FMA does 16.
///
/// `A` is `M x K` f32 (any strides), `B` is `K x N` packed by [`crate::PackedI8B`], C is
/// `M x N`, only written. Each row `m` of A is quantized as `sa = max|A[m,:]| / 127`,
/// `qa = round_half_even(a / sa) + 128` (a zero row gives `sa = 0`, `qa = 128`); products
/// accumulate exactly in i32, and `C[m][n] = sa[m] sb[n] (acc[m][n] - 128 colsum[n])`,
/// then the epilogue, [`crate::sgemm`]'s (bias, row bias, activation, residual, clamp),
/// applied in f32. A row of A holding NaN or an infinity gives a row of NaN before the
/// epilogue. Every ISA computes the same accumulators and the same f32 operations on them,
/// so results are bit-identical across ISAs and thread counts.
///
/// Accuracy: with `ea`, `eb` the rounding errors (at most half a step each), the result
/// differs from the exact product of the f32 operands by at most
/// `sum_k (sb[n] |A[m][k]| + sa[m] |B[k][n]|) / 2 + 3/4 K sa[m] sb[n]` (plus f32 rounding
/// of the dequantization and epilogue), a worst case that `tests/lowp_int8.rs` holds every
/// kernel to. Typical errors are far smaller: the roundings are independent, so they grow
/// as `sqrt(K)`, not `K`; on uniform random operands with K = 768 the RMS error was about
/// 0.55% of the RMS result (see the test `typical_error_is_reported`).
pub fn gemm_i8(
    a: MatRef<'_>,
    b: PackedI8BRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    gemm_i8_with_isa(Isa::detect(), a, b, c, epilogue, par)
}

/// [`gemm_i8`] on a given ISA's kernels (tests hold every path to the reference; benches
/// compare them). `Isa::Avx512` runs the VNNI kernel when the CPU has AVX-512 VNNI and BW,
/// else the AVX2 one; `Isa::Neon` runs the scalar kernel (no NEON int8 kernel yet).
pub fn gemm_i8_with_isa(
    isa: Isa,
    a: MatRef<'_>,
    b: PackedI8BRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    check_product(isa, &a, "the int8 B", [b.k(), b.n()], &c, epilogue)?;
    let (m, n) = (a.rows, b.n());
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (qa, sa) = quantize_rows(a);
    let epi = (!epilogue.is_identity()).then_some(epilogue);
    let sink = Sink::Dequant {
        c: Ptr(c.data.as_mut_ptr()),
        ldc: c.ld,
        sa: &sa,
        scales: b.scales(),
        sums: b.col_sums(),
        epi,
    };
    run(Path::of(isa), &qa, m, b, &sink, par);
    Ok(())
}

/// The raw i32 accumulators `acc[m][n] = sum_k qa[m][k] q[k][n]` of already quantized
/// activations (`qa`: `m x K` row-major u8, any values), into `acc` (`m x N` row-major).
/// For tests: it is what every kernel computes, exposed so that it can be compared with an
/// exact integer reference.
#[doc(hidden)]
pub fn gemm_i8_accumulate_with_isa(
    isa: Isa,
    qa: &[u8],
    m: usize,
    b: PackedI8BRef<'_>,
    acc: &mut [i32],
    par: &dyn Parallel,
) -> Result<(), GemmError> {
    if !isa.is_available() {
        return Err(GemmError::IsaUnavailable(isa));
    }
    let (k, n) = (b.k(), b.n());
    if qa.len() != m * k || acc.len() != m * n {
        return Err(GemmError::Shape {
            what: "accumulators",
            detail: format!(
                "{m} rows of K = {k}, N = {n} need {} activations and {} accumulators, got {} \
                 and {}",
                m * k,
                m * n,
                qa.len(),
                acc.len()
            ),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let kp = k.next_multiple_of(4);
    let mut padded = vec![0u8; m * kp];
    for (dst, src) in padded.chunks_exact_mut(kp).zip(qa.chunks_exact(k.max(1))) {
        dst[..k].copy_from_slice(&src[..k]);
    }
    let sink = Sink::Raw {
        acc: Ptr(acc.as_mut_ptr()),
        ld: n,
    };
    run(Path::of(isa), &padded, m, b, &sink, par);
    Ok(())
}

/// Each row of A quantized to u8 with zero point 128: `(qa, sa)`, `qa` being `m` rows of
/// `4 ceil(K/4)` bytes whose padding past K is 0 (so it adds nothing whatever B's padding
/// holds).
fn quantize_rows(a: MatRef<'_>) -> (Vec<u8>, Vec<f32>) {
    let (m, k) = (a.rows, a.cols);
    let kp = k.next_multiple_of(4);
    let mut qa = vec![0u8; m * kp];
    let mut sa = vec![0.0f32; m];
    let mut row = vec![0.0f32; k];
    for (i, (q, s)) in qa.chunks_exact_mut(kp.max(1)).zip(&mut sa).enumerate() {
        for (p, x) in row.iter_mut().enumerate() {
            *x = a.data[i * a.rs + p * a.cs];
        }
        let (mut max, mut finite) = (0.0f32, true);
        for &x in &row {
            finite &= x.is_finite();
            max = max.max(x.abs());
        }
        let scale = scale_of(max);
        if !finite {
            *s = f32::NAN;
            q[..k].fill(ZERO_POINT as u8);
        } else if scale == 0.0 {
            *s = 0.0;
            q[..k].fill(ZERO_POINT as u8);
        } else {
            *s = scale;
            for (d, &x) in q.iter_mut().zip(&row) {
                let r = round_even_small(x / scale).clamp(-127.0, 127.0);
                *d = (r as i32 + ZERO_POINT) as u8;
            }
        }
    }
    (qa, sa)
}

/// Where a tile's accumulators go.
enum Sink<'s> {
    /// Dequantized, through the epilogue, into C.
    Dequant {
        c: Ptr<f32>,
        ldc: usize,
        sa: &'s [f32],
        scales: &'s [f32],
        sums: &'s [i32],
        epi: Option<&'s Epilogue<'s>>,
    },
    /// As they are (for tests).
    Raw { acc: Ptr<i32>, ld: usize },
}

/// Whether a product is worth waking threads for: the f32 driver's rule in weight bytes
/// (enough multiply-adds, or enough weights to stream that one core's bandwidth is the
/// limit: 256 KiB, the f32 rule's byte count).
fn parallel_worth(m: usize, k: usize, n: usize) -> bool {
    m * n * k.max(1) >= crate::driver::MIN_PARALLEL_FMAS
        || k * n >= 4 * crate::driver::MIN_PARALLEL_B_FLOATS
}

/// Splits C into (row block, column tile range) tasks and runs the kernel of `path` on
/// each tile, `rows` rows at a time, then the sink. Columns first (each task streams its
/// own weights once per row pass); rows too when there are too few column tiles for the
/// threads and enough rows.
fn run(path: Path, qa: &[u8], m: usize, b: PackedI8BRef<'_>, sink: &Sink<'_>, par: &dyn Parallel) {
    let (k, n) = (b.k(), b.n());
    let kg = k.div_ceil(4);
    let lda = 4 * kg;
    let (rows, cols) = path.tile();
    let tiles = n.div_ceil(cols);
    let threads = if par.threads() > 1 && parallel_worth(m, k, n) {
        par.threads()
    } else {
        1
    };
    let tn = tiles.min(4 * threads);
    let tm = if tn < 2 * threads {
        (2 * threads).div_ceil(tn).min(m.div_ceil(rows))
    } else {
        1
    };
    let panels = b.panels();
    debug_assert!(k <= I8_MAX_K && qa.len() >= m * lda);
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        // Row blocks are whole passes, so only the last pass of C is short.
        let passes = m.div_ceil(rows);
        let (p0, p1) = (ti * passes / tm, (ti + 1) * passes / tm);
        let mut out = [[0i32; OUT_LD]; OUT_ROWS];
        for ci in tj * tiles / tn..(tj + 1) * tiles / tn {
            let j = ci * cols;
            let nv = cols.min(n - j);
            for r0 in (p0 * rows..(p1 * rows).min(m)).step_by(rows) {
                let mv = rows.min(m - r0);
                let t = I8Tile {
                    kg,
                    // Only formed, not read, when kg == 0 (qa may then be empty).
                    a: qa.as_ptr().wrapping_add(r0 * lda),
                    lda,
                    // j is a multiple of 16: the start of panel j / 16.
                    b: panels.as_ptr().wrapping_add(j / PANEL * kg * GROUP_BYTES),
                    ps: kg * GROUP_BYTES,
                    out: out.as_mut_ptr().cast(),
                };
                // SAFETY: rows r0..r0+mv < m of qa hold lda = 4 kg bytes; panels j/16 ..
                // j/16 + ceil(nv/16) exist in B (ceil(n/16) panels of kg * 64 bytes, and
                // j + nv <= n); `out` has 8 >= mv rows of 64 >= nv columns; the path's ISA
                // was checked available by the caller.
                unsafe { tile(path, &t, mv, nv.div_ceil(PANEL)) };
                // SAFETY: this task alone writes rows r0..r0+mv (its row block), columns
                // j..j+nv (its tiles) of the output, which are inside it.
                unsafe { finish(&out, r0, mv, j, nv, sink) };
            }
        }
    };
    let tasks = tm * tn;
    if tasks == 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// Runs the kernel of `path` on `rows x 16 np`.
///
/// # Safety
/// The [`I8Tile`] contract for `rows` (<= the path's rows) and `np` panels (<= the path's
/// columns / 16), with the path's ISA available.
unsafe fn tile(path: Path, t: &I8Tile, rows: usize, np: usize) {
    match path {
        // SAFETY (every arm): forwarded.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx512Vnni => unsafe { super::x86_int8::tile_vnni(t, rows, np) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Avx2 => unsafe { super::x86_int8::tile_avx2(t, rows, np) },
        // SAFETY: as the comment over the match says, for this arm too.
        Path::Scalar => unsafe { tile_scalar(t, rows, np) },
    }
}

/// The portable kernel: one panel at a time, i32 accumulation as the SIMD kernels do.
///
/// # Safety
/// The [`I8Tile`] contract for `rows <= 8` and `np <= 4` panels.
unsafe fn tile_scalar(t: &I8Tile, rows: usize, np: usize) {
    for w in 0..np {
        let mut acc = [[0i32; PANEL]; OUT_ROWS];
        for g in 0..t.kg {
            // SAFETY: panel w < np, group g < kg: 64 bytes inside the panel.
            let bg = unsafe { std::slice::from_raw_parts(t.b.add(w * t.ps + g * GROUP_BYTES), 64) };
            for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
                // SAFETY: row r < rows, bytes 4g..4g+4 < lda of quantized A.
                let ag = unsafe { std::slice::from_raw_parts(t.a.add(r * t.lda + 4 * g), 4) };
                for (s, bj) in acc_r.iter_mut().zip(bg.chunks_exact(4)) {
                    for (&x, &y) in ag.iter().zip(bj) {
                        *s += x as i32 * y as i32;
                    }
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            for (jj, &x) in acc_r.iter().enumerate() {
                // SAFETY: row r < rows <= 8, column 16w + jj < 64 of `out`.
                unsafe { *t.out.add(r * OUT_LD + w * PANEL + jj) = x };
            }
        }
    }
}

/// Dequantizes `mv x nv` accumulators, applies the epilogue and stores them at the
/// output's rows `r0..`, columns `j..` (or stores them raw). Scalar, in the same order for
/// every ISA, so results are bit-identical across kernels; the dequantization loop
/// vectorizes, and the epilogue is a small share of a few-row product (as in `gemm_half`).
///
/// # Safety
/// The output's rows `r0..r0+mv`, columns `j..j+nv` are in bounds and written by this
/// task alone; the epilogue was checked against C's shape.
unsafe fn finish(
    out: &[[i32; OUT_LD]; OUT_ROWS],
    r0: usize,
    mv: usize,
    j: usize,
    nv: usize,
    sink: &Sink<'_>,
) {
    for (r, out_r) in out.iter().enumerate().take(mv) {
        let i = r0 + r;
        match *sink {
            Sink::Raw { acc, ld } => {
                for (jj, &x) in out_r.iter().enumerate().take(nv) {
                    // SAFETY: forwarded contract.
                    unsafe { *acc.get().add(i * ld + j + jj) = x };
                }
            }
            Sink::Dequant {
                c,
                ldc,
                sa,
                scales,
                sums,
                epi,
            } => {
                let mut row = [0.0f32; OUT_LD];
                let cols = out_r[..nv]
                    .iter()
                    .zip(&scales[j..j + nv])
                    .zip(&sums[j..j + nv]);
                for (d, ((&acc, &sb), &sum)) in row.iter_mut().zip(cols) {
                    // Exact in i32: |acc| and |128 sum| are at most 255 * 127 * K and
                    // 128 * 127 * K, inside i32 for K <= I8_MAX_K.
                    *d = (sa[i] * sb) * (acc - ZERO_POINT * sum) as f32;
                }
                for (jj, &raw) in row.iter().enumerate().take(nv) {
                    let col = j + jj;
                    let mut x = raw;
                    if let Some(e) = epi {
                        let bias =
                            e.bias.map_or(0.0, |b| b[col]) + e.row_bias.map_or(0.0, |b| b[i]);
                        let (res, before) = e.residual.map_or((0.0, false), |r| {
                            (r.data[i * r.ld + col], r.before_activation)
                        });
                        x = epilogue_scalar(x, bias, e.activation, res, before);
                        if let Some((lo, hi)) = e.clamp {
                            x = x.max(lo).min(hi);
                        }
                    }
                    // SAFETY: forwarded contract.
                    unsafe { *c.get().add(i * ldc + col) = x };
                }
            }
        }
    }
}
