//! The prefill path: many rows of x, so every weight is reused M times and the product is
//! compute-bound.
//!
//! - On CPUs with AMX-BF16 (and AVX-512 VNNI), unless `RAFTER_CPU_AMX=0`, f16 and bf16
//!   weights run the bf16 tile GEMM of [`super::x86_amx_bf16`] (as accurate as the f32
//!   path, ~1.3x less CPU time on Qwen3-0.6B's prefill). Block formats stay on the int8
//!   GEMM below: through the tiles they gained only 1.05-1.15x (their dequantization costs
//!   as much as the VNNI product) and would no longer round x as ggml does, which the
//!   GGUF fixtures' agreement with llama.cpp rests on. The kernel itself takes every
//!   format (its tests cover them all).
//! - Otherwise, on AVX-512 VNNI, block formats run the int8 GEMM of [`super::x86_vnni_gemm`]: x
//!   quantized as ggml does ([`super::act`]), each task unpacking panels of 32 weight rows
//!   into int8 with a float scale (and min) per 16 or 32 elements, `vpdpbusd` tiles.
//! - With [`MatmulPrecision::Bf16`] (the caller's choice), f32/f16/bf16 weights on CPUs
//!   with AVX512-BF16 have both operands rounded to bf16: one tile product per multiply-add
//!   on AMX (f16/bf16), else [`super::x86_bf16_gemm`]'s `vdpbf16ps` at twice the f32 FMA
//!   rate.
//! - Everything else (f32/f16/bf16 weights, CPUs without VNNI) widens blocks of W into the
//!   f32 panels of [`crate::PackedB`] and runs the crate's f32 GEMM driver on them, exactly
//!   as the half-precision GEMM's many-rows path does: one `KC x NC` block of weights at a
//!   time per task, accumulated over K through `beta = 1`. Block formats multiply the
//!   activations quantized as ggml does and dequantized (as the decode path's fallback:
//!   see `gemv.rs`), so their results are ggml's on every CPU; f32/f16/bf16 weights
//!   multiply x unrounded.

use std::cell::RefCell;

use rafter_quant::layout::{self, read_f16};
use rafter_quant::{dequantize_row, BlockFormat};

use super::act::{quantize_rows, Act, ActType, QuantIsa};
use super::finish::YPtr;
use super::{dense, MatmulPrecision, Path, QuantMatRef, WeightFormat};
use crate::buffer::Aligned;
use crate::driver::run_raw;
use crate::kernel::{Isa, PANEL};
use crate::{BRef, Epilogue, MatMut, MatRef, PackedBRef, Parallel, Residual, Sequential};

/// Whether `format` runs the int8 GEMM on `path` (else the widened f32 GEMM).
#[cfg(target_arch = "x86_64")]
fn int8_gemm(path: Path, format: BlockFormat) -> bool {
    path == Path::Vnni512 && super::x86_vnni_gemm::supports(format)
}

/// Whether products at `precision` with `format` weights round both operands to bf16 on
/// `path`: asked for, a float format, and AVX512-BF16 present (AMX-BF16 implies it).
pub(crate) fn bf16_products(path: Path, precision: MatmulPrecision, format: WeightFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    return precision == MatmulPrecision::Bf16
        && path == Path::Vnni512
        && super::x86_bf16_gemm::supports(format)
        && super::x86_bf16_gemm::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, precision, format);
        false
    }
}

/// `y = x · Wᵀ` (then the epilogue) for many rows; shapes checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    isa: Isa,
    path: Path,
    precision: MatmulPrecision,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let rounded = bf16_products(path, precision, w.format);
        if path == Path::Vnni512
            && matches!(w.format, WeightFormat::F16 | WeightFormat::Bf16)
            && super::x86_amx_bf16::enabled()
        {
            return super::x86_amx_bf16::run(x, w, y, epilogue, par, rounded);
        }
        if rounded {
            return super::x86_bf16_gemm::run(x, w, y, epilogue, par);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = precision;
    run_avx(isa, path, x, w, y, epilogue, par)
}

/// [`run`] without AMX: the VNNI int8 GEMM or the widened f32 GEMM (also the tests'
/// baseline for the AMX kernel's accuracy).
pub(crate) fn run_avx(
    isa: Isa,
    path: Path,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    if let WeightFormat::Block(f) = w.format {
        #[cfg(target_arch = "x86_64")]
        if int8_gemm(path, f) {
            return super::x86_vnni_gemm::run(f, x, w, y, epilogue, par);
        }
        return dequantized_x(isa, path, f, x, w, y, epilogue, par);
    }
    widened(isa, x, w, 0, y, epilogue, par);
}

thread_local! {
    /// Per-thread f32 panels of one widened `KC x NC` block of W, and one decoded row.
    static WIDE: RefCell<(Aligned, Vec<f32>)> = RefCell::new((Aligned::new(0, 0), Vec::new()));
    /// The calling thread's quantized activations and their dequantized copy.
    static XQ: RefCell<(Act, Vec<f32>)> = RefCell::new((Act::default(), Vec::new()));
}

/// Block-format W on the widened path: x quantized as ggml does, dequantized (with the
/// `_1` formats' per-block corrections as `k / 32` more columns; see
/// [`Act::dequantize_row`]), times the widened W.
#[allow(clippy::too_many_arguments)]
fn dequantized_x(
    isa: Isa,
    path: Path,
    f: BlockFormat,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let (m, k) = (x.rows, x.cols);
    let mut fresh = None;
    XQ.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok();
        let (act, xd) = match guard.as_deref_mut() {
            Some(s) => s,
            None => fresh.insert((Act::default(), Vec::new())),
        };
        act.reset(m, k, ActType::of(f));
        quantize_rows(QuantIsa::of(path), &x, act, par);
        let extra = if act.kind == ActType::Q8_1 { k / 32 } else { 0 };
        let ld = k + extra;
        xd.resize(m * ld, 0.0);
        for (r, xr) in xd.chunks_exact_mut(ld).enumerate() {
            let (vals, corr) = xr.split_at_mut(k);
            act.dequantize_row(r, vals, corr);
        }
        let xv = MatRef {
            data: xd,
            rows: m,
            cols: ld,
            rs: ld,
            cs: 1,
        };
        widened(isa, xv, w, extra, y, epilogue, par);
    });
}

/// Width of one column block (W rows) of the widened path: 256 columns of a 512-deep block
/// are 512 KiB of f32, half of a Zen 4/5 L2 (the half GEMM's measured choice).
const WIDE_NC: usize = 256;

/// Depth of one widened block: a multiple of every block format's 256.
const WIDE_KC: usize = 512;

/// The widened path (see the module docs). x has W's `k` columns plus `extra` (the `_1`
/// formats' corrections, multiplied by the blocks' mins; 0 otherwise).
fn widened(
    isa: Isa,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    extra: usize,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let (m, n) = (x.rows, w.n);
    let k = w.k;
    debug_assert_eq!(x.cols, k + extra);
    let mr = isa.blocking().mr;
    let threads = par.threads().max(1);
    let blocks = n.div_ceil(WIDE_NC).div_ceil(threads) * threads;
    let width = n.div_ceil(blocks.min(n.div_ceil(32))).div_ceil(32) * 32;
    let tn = n.div_ceil(width);
    let tm = super::finish::row_ranges(tn, m.div_ceil(mr), threads);
    let yp = YPtr {
        ptr: y.data.as_mut_ptr(),
        ld: y.ld,
    };
    let y_ld = yp.ld;
    let task = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (i0, i1) = (ti * m / tm, (ti + 1) * m / tm);
        let (j0, j1) = (tj * width, ((tj + 1) * width).min(n));
        if i0 >= i1 || j0 >= j1 {
            return;
        }
        let epi_block = Epilogue {
            bias: epilogue.bias.map(|b| &b[j0..j1]),
            row_bias: epilogue.row_bias.map(|b| &b[i0..i1]),
            activation: epilogue.activation,
            // Element (i0, j0) exists, so the slice starts inside.
            residual: epilogue.residual.map(|r| Residual {
                data: &r.data[i0 * r.ld + j0..],
                ld: r.ld,
                before_activation: r.before_activation,
            }),
            clamp: epilogue.clamp,
        };
        let none = Epilogue::none();
        let np = (j1 - j0).div_ceil(PANEL);
        let mut pc = 0;
        while pc < k + extra {
            let kb = if pc < k { WIDE_KC.min(k - pc) } else { extra };
            let last = pc + kb >= k + extra;
            WIDE.with(|cell| {
                let mut fresh = (Aligned::new(0, 0), Vec::new());
                let mut guard = cell.try_borrow_mut().ok();
                let (panels, row) = match guard.as_deref_mut() {
                    Some(s) => s,
                    None => &mut fresh,
                };
                panels.grow(np * kb * PANEL);
                let panels = &mut panels.as_mut_slice()[..np * kb * PANEL];
                widen_block(&w, j0, j1, pc, kb, panels, row);
                let bref = PackedBRef::from_panels(kb, j1 - j0, panels)
                    .expect("the block is sized as panel_floats");
                // Element (i0, pc) of x exists: the view covers rows i0..i1, columns
                // pc..pc+kb.
                let a_block = MatRef {
                    data: &x.data[i0 * x.rs + pc * x.cs..],
                    rows: i1 - i0,
                    cols: kb,
                    rs: x.rs,
                    cs: x.cs,
                };
                // SAFETY: y's rows i0..i1, columns j0..j1 are inside y (a checked view) and
                // written by this task alone (tasks tile y disjointly); the block's epilogue
                // is the checked one restricted to the same rows and columns; B has kb rows
                // and j1 - j0 columns.
                unsafe {
                    run_raw(
                        isa,
                        1.0,
                        a_block,
                        BRef::Packed(bref),
                        if pc == 0 { 0.0 } else { 1.0 },
                        yp.at(i0, j0),
                        i1 - i0,
                        j1 - j0,
                        y_ld,
                        if last { &epi_block } else { &none },
                        &Sequential,
                    )
                }
            });
            pc += kb;
        }
    };
    let tasks = tm * tn;
    if tasks == 1 {
        task(0);
    } else {
        par.run(tasks, &task);
    }
}

/// W's rows `j0..j1`, elements `pc..pc + kb`, as f32 panels `[ceil((j1-j0)/16)][kb][16]`
/// (zero past the last row). `pc == k` is the block of the `_1` formats' mins, one per
/// block of the row.
fn widen_block(
    w: &QuantMatRef<'_>,
    j0: usize,
    j1: usize,
    pc: usize,
    kb: usize,
    panels: &mut [f32],
    row: &mut Vec<f32>,
) {
    row.resize(kb, 0.0);
    let be = w.format.block_elems();
    if pc >= w.k {
        let WeightFormat::Block(f) = w.format else {
            unreachable!("only block formats have the extra columns")
        };
        for q in 0..(j1 - j0).div_ceil(PANEL) {
            let panel = &mut panels[q * kb * PANEL..][..kb * PANEL];
            for jj in 0..PANEL {
                let j = j0 + q * PANEL + jj;
                for p in 0..kb {
                    panel[p * PANEL + jj] = if j < j1 {
                        let blk = &w.rows(j, j + 1)[p * f.block_bytes()..];
                        // Q4_1 and Q5_1 keep the min at the same offset.
                        read_f16(blk, layout::q4_1::M)
                    } else {
                        0.0
                    };
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if !matches!(w.format, WeightFormat::Block(_)) && std::arch::is_x86_feature_detected!("avx512f")
    {
        for q in 0..(j1 - j0).div_ceil(PANEL) {
            let panel = &mut panels[q * kb * PANEL..][..kb * PANEL];
            let r0 = j0 + q * PANEL;
            // SAFETY: AVX-512F checked; rows r0..min(r0 + 16, j1) of W exist.
            unsafe { widen_panel512(w, r0, (j1 - r0).min(PANEL), pc, kb, panel) };
        }
        return;
    }
    for q in 0..(j1 - j0).div_ceil(PANEL) {
        let panel = &mut panels[q * kb * PANEL..][..kb * PANEL];
        for jj in 0..PANEL {
            let j = j0 + q * PANEL + jj;
            if j >= j1 {
                for p in 0..kb {
                    panel[p * PANEL + jj] = 0.0;
                }
                continue;
            }
            let bytes = w.rows(j, j + 1);
            match w.format {
                WeightFormat::Block(f) => {
                    let (b0, b1) = (pc / be * f.block_bytes(), (pc + kb) / be * f.block_bytes());
                    dequantize_row(f, &bytes[b0..b1], row).expect("whole blocks");
                }
                format => {
                    for (p, v) in row.iter_mut().enumerate() {
                        *v = dense::widen(format, bytes, pc + p);
                    }
                }
            }
            for (p, &v) in row.iter().enumerate() {
                panel[p * PANEL + jj] = v;
            }
        }
    }
}

/// One panel of float-format weights: rows `r0..r0 + rows` (`rows <= 16`; zero columns
/// past them), elements `pc..pc + kb`, widened 16 rows x 16 elements at a time and
/// transposed in registers.
///
/// # Safety
/// AVX-512F available; rows `r0..r0 + rows` of `w` exist; `panel` holds `kb * 16` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn widen_panel512(
    w: &QuantMatRef<'_>,
    r0: usize,
    rows: usize,
    pc: usize,
    kb: usize,
    panel: &mut [f32],
) {
    use std::arch::x86_64::*;
    assert!(rows <= PANEL && panel.len() >= kb * PANEL && pc + kb <= w.k);
    let format = w.format;
    let full = kb / 16 * 16;
    for p in (0..full).step_by(16) {
        let mut v: [__m512i; 16] = std::array::from_fn(|r| {
            if r >= rows {
                return _mm512_setzero_si512();
            }
            let row = w.rows(r0 + r, r0 + r + 1).as_ptr();
            let e = pc + p;
            // SAFETY: elements e..e+16 <= pc + kb <= k of row r0 + r.
            unsafe {
                match format {
                    WeightFormat::F32 => _mm512_loadu_si512(row.add(4 * e).cast()),
                    WeightFormat::F16 => _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256(
                        row.add(2 * e).cast(),
                    ))),
                    _ => _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                        row.add(2 * e).cast(),
                    ))),
                }
            }
        });
        super::x86_vnni_gemm::transpose16(&mut v);
        for (i, vi) in v.iter().enumerate() {
            // SAFETY: panel row p + i < kb.
            unsafe { _mm512_storeu_si512(panel.as_mut_ptr().add((p + i) * PANEL).cast(), *vi) };
        }
    }
    for p in full..kb {
        for r in 0..PANEL {
            panel[p * PANEL + r] = if r < rows {
                dense::widen(format, w.rows(r0 + r, r0 + r + 1), pc + p)
            } else {
                0.0
            };
        }
    }
}
