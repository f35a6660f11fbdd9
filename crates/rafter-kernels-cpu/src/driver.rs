//! The blocked GEMM driver: splits C into per-thread tasks, then runs the BLIS loop nest
//! (see the crate docs) in each task.

use std::cell::RefCell;
use std::ops::Range;

use crate::buffer::{with_scratch, Aligned};
use crate::kernel::{Blocking, Isa, Tile, TileEpilogue, PANEL};
use crate::pack::{pack_a, pack_b};
use crate::{BRef, Epilogue, MatMut, MatRef, Parallel};

/// Below this many multiply-adds a GEMM runs on the calling thread: waking threads would
/// cost more than it saves. (1M FMAs is ~10 us on one AVX-512 core; the persistent pool's
/// workers spin between back-to-back kernels, so handing them tasks costs a few
/// microseconds. At 4M, MobileNetV2's 144 → 32 projection on 28×28 (3.6M FMAs) ran on one
/// thread: 93 → 47 us a call on two, minimum of 6 alternated rounds of `rafter bench
/// --trace`.)
pub(crate) const MIN_PARALLEL_FMAS: usize = 1 << 20;

/// Pre-packed B (weights) of at least this many floats is streamed by several threads
/// even below [`MIN_PARALLEL_FMAS`]: a product with few rows (a classifier's single row,
/// a decoder's token) does ~1 multiply-add per weight it reads from memory, so one thread
/// is bound by its own memory bandwidth, not by the FMAs. 64K floats (256 KiB) take about
/// 20 us to stream on one thread, well above a pool wake-up. Measured (`rafter bench
/// --trace`, 2 threads): MobileNetV2's classifier 222-335 -> 138-158 us, ResNet-50's
/// 571-577 -> 284-326 us.
pub(crate) const MIN_PARALLEL_B_FLOATS: usize = 1 << 16;

/// Fixed cost of one task (taking it, waking a thread, cold caches), in FMAs' time.
const TASK_COST: usize = 1 << 15;

/// Packing one float costs about this many FMAs' time (a load, a store and some shuffling
/// against 16 FMAs a cycle); used to weigh duplicated packing when choosing a split.
const PACK_COST: usize = 8;

/// How many k steps ahead a task's very first tile prefetches its own pre-packed B (the one
/// micro-panel that no earlier tile prefetched): 64 steps of 16 floats are 4 KiB, about
/// 750 cycles of a 12x32 AVX-512 tile, which covers a DRAM access on a loaded machine.
const B_PREFETCH_K: usize = 64;

/// The C pointer, shared by tasks that write disjoint tiles.
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: tasks only write disjoint row x column ranges of C (see `run`), and the pointer
// outlives them (`Parallel::run` returns only when every task has returned).
unsafe impl Send for CPtr {}
// SAFETY: as above.
unsafe impl Sync for CPtr {}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    isa: Isa,
    bl: Blocking,
    alpha: f32,
    beta: f32,
    /// A's columns (B's rows): the panel stride of pre-packed B.
    k: usize,
    /// The end of the K range this context's tasks sum over (`k`, except in the partial
    /// products of a K split).
    k_end: usize,
    a: MatRef<'a>,
    /// The column of the full A that `a`'s column 0 holds (a K split's task-local part
    /// of A holds columns `a_col0..`; 0 otherwise).
    a_col0: usize,
    b: BRef<'a>,
    c: CPtr,
    ldc: usize,
    epi: Option<&'a Epilogue<'a>>,
    /// A is read in place (row-major, few rows) instead of packed.
    direct_a: bool,
    /// B is pre-packed weights, which come from memory on the first pass over them (a
    /// model's weights do not stay cached between calls; B packed per call is already in
    /// cache), so the kernels prefetch them (see `B_PREFETCH_K` and `Tile::pf_next`).
    prefetch_b: bool,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: BRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    // SAFETY: `c` is a checked row-major view (`MatMut::row_major`), borrowed mutably for
    // the whole call, so its slice covers rows x cols at `ld` and nothing else touches it.
    unsafe {
        run_raw(
            isa,
            alpha,
            a,
            b,
            beta,
            c.data.as_mut_ptr(),
            c.rows,
            c.cols,
            c.ld,
            epilogue,
            par,
        )
    }
}

/// [`run`] on a raw C: lets a caller that splits C into disjoint column blocks itself (the
/// half-precision GEMM, which widens one block of B at a time) run each block through this
/// driver without holding overlapping `&mut` slices.
///
/// # Safety
/// Element `(i, j)` of C, at `c + i * ldc + j`, must be valid for reads and writes for
/// `i < m`, `j < n` (`ldc >= n`), and no other thread may access those elements during the
/// call. The epilogue's operands must have been checked against `m x n` as
/// `sgemm_with_isa` checks them, and B must have `a.cols` rows and `n` columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_raw(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: BRef<'_>,
    beta: f32,
    c: *mut f32,
    m: usize,
    n: usize,
    ldc: usize,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    if m == 0 || n == 0 {
        return;
    }
    // alpha == 0: A and B are not read (BLAS semantics; they may hold NaN).
    let k = if alpha == 0.0 { 0 } else { a.cols };
    let bl = isa.blocking();
    // Row-contiguous A is read in place: packing it costs O(MK) copies that only pay off
    // when N is large, and measured here the kernels run as fast on A's rows as on packed
    // panels (up to 2x faster end to end on ResNet shapes, N = 64..256). Strided A
    // (a folded transpose) is packed.
    let direct_a = k > 0
        && a.cs == 1
        // The bench's tuning hook can force packing (1) to compare.
        && crate::kernel::BLOCKING_OVERRIDE[3].load(std::sync::atomic::Ordering::Relaxed) != 1;
    let ctx = Ctx {
        isa,
        bl,
        alpha,
        beta,
        k,
        k_end: k,
        a,
        a_col0: 0,
        b,
        c: CPtr(c),
        ldc,
        epi: (!epilogue.is_identity()).then_some(epilogue),
        direct_a,
        // The bench's tuning hook can turn prefetching off (1) to compare.
        prefetch_b: matches!(b, BRef::Packed(_))
            && crate::kernel::BLOCKING_OVERRIDE[4].load(std::sync::atomic::Ordering::Relaxed) != 1,
    };
    let packed_b = matches!(b, BRef::Packed(_));
    if let Some(grid) = forced_k_split(m, n, k, par.threads()) {
        // SAFETY: forwarded contract (C's elements valid and ours alone for the call).
        unsafe { run_k_split(&ctx, m, n, grid, None, par) };
        return;
    }
    let (tm, tn) = split(m, n, k, &bl, par.threads(), !direct_a, !packed_b);
    let task = |t: usize| {
        let ([i0, i1], [j0, j1]) = task_range(t, (tm, tn), m, n, bl.mr);
        if i0 < i1 && j0 < j1 {
            block(&ctx, i0, i1, j0, j1, 0);
        }
    };
    if tm * tn == 1 {
        task(0);
    } else {
        // Tasks cover disjoint row ranges (multiples of MR) x column ranges (multiples of
        // the packed panel width), which is what makes sharing `ctx.c` sound.
        par.run(tm * tn, &task);
    }
}

/// The rows and columns of C that task `t` of a `tm x tn` grid computes: row ranges in
/// whole `mr` tiles, column ranges in whole packed panels.
fn task_range(
    t: usize,
    (tm, tn): (usize, usize),
    m: usize,
    n: usize,
    mr: usize,
) -> ([usize; 2], [usize; 2]) {
    let (mt, nt) = (m.div_ceil(mr), n.div_ceil(PANEL));
    let (ti, tj) = (t / tn, t % tn);
    let rows = [ti * mt / tm * mr, (ti + 1) * mt / tm * mr].map(|i| i.min(m));
    let cols = [tj * nt / tn * PANEL, (tj + 1) * nt / tn * PANEL].map(|j| j.min(n));
    (rows, cols)
}

/// Chooses a `tm x tn` grid of tasks (rows x columns) for `threads` threads.
///
/// A task's cost is its FMAs plus the packing it repeats (every column task packs its rows
/// of A, every row task packs its columns of B) plus streaming its A rows and B columns;
/// the grid's cost is its largest task times the rounds of tasks per thread. Grids of 4
/// tasks per thread are preferred when they cost at most 10% more than the best grid of
/// one task per thread: tasks are taken dynamically, so a thread that the OS preempts (the
/// CPU device shares the machine) holds up a quarter of the work instead of half of it.
fn split(
    m: usize,
    n: usize,
    k: usize,
    bl: &Blocking,
    threads: usize,
    packs_a: bool,
    packs_b: bool,
) -> (usize, usize) {
    // Columns are split in whole panels, not whole register tiles: 160 columns on two
    // threads are 80 and 80 (a task's last tile 16 wide), where tiles of 32 made 96 and 64
    // (MobileNetV2's 7×7 projections).
    let (mt, nt) = (m.div_ceil(bl.mr), n.div_ceil(PANEL));
    let streams_weights = !packs_b && k * n >= MIN_PARALLEL_B_FLOATS;
    if threads <= 1 || (m * n * k.max(1) < MIN_PARALLEL_FMAS && !streams_weights) {
        return (1, 1);
    }
    let best_for = |tasks: usize| -> Option<(usize, (usize, usize))> {
        let mut best = None;
        for tm in 1..=tasks.min(mt) {
            if !tasks.is_multiple_of(tm) || tasks / tm > nt {
                continue;
            }
            let tn = tasks / tm;
            let rows = mt.div_ceil(tm) * bl.mr;
            let cols = nt.div_ceil(tn) * PANEL;
            let pack = PACK_COST * k * (rows * packs_a as usize + cols * packs_b as usize);
            let task = rows * cols * k + pack + k * (rows + cols) + TASK_COST;
            let cost = task * tasks.div_ceil(threads);
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, (tm, tn)));
            }
        }
        best
    };
    let one = best_for(threads);
    let four = best_for(4 * threads);
    let forced = crate::kernel::BLOCKING_OVERRIDE[5].load(std::sync::atomic::Ordering::Relaxed);
    match (forced, one, four) {
        (1, Some((_, g)), _) | (4, _, Some((_, g))) => return g,
        _ => {}
    }
    match (one, four) {
        (Some((c1, g1)), Some((c4, g4))) => {
            if c4 * 10 <= c1 * 11 {
                g4
            } else {
                g1
            }
        }
        (Some((_, g)), None) | (None, Some((_, g))) => g,
        // Fewer tiles than threads in both directions at once cannot happen above
        // MIN_PARALLEL_FMAS unless K is huge: fall back to rows or columns alone.
        (None, None) => {
            if mt >= nt {
                (threads.min(mt), 1)
            } else {
                (1, threads.min(nt))
            }
        }
    }
}

/// [`sgemm_fill_a`](crate::sgemm_fill_a) splits K over the threads for products of at most
/// this many rows; callers with more rows use the row x column grid of [`split`].
pub const K_SPLIT_MAX_ROWS: usize = 96;

/// Each part of a K split sums at least this many k steps, so that a part's tiles still
/// run long loops and the partial sums to reduce stay few against the multiply-adds.
const K_SPLIT_MIN_DEPTH: usize = 256;

/// Producing a float of A in a task (an im2col copy) costs about this many FMAs' time, as
/// packing does ([`PACK_COST`]), and a float of partial sum written by one task and added
/// into C by another about this many (see [`fill_grid`]). The second is set from the
/// 16-core H200 host: split 2 ways, ResNet-50's 49 × 1,024 × 2,048 product (400 KB of
/// partial sums) ran 15-25% slower than unsplit, while its 49 × 4,608 × 512 convolution ran
/// as fast split 4 or 8 ways (`benches/few_rows.rs`); 48 keeps the first unsplit and picks 4
/// parts for the second.
const FILL_COST: usize = PACK_COST;
const PARTIAL_COST: usize = 48;

thread_local! {
    /// The partial sums of a K split (parts 1.., each `m x n`), on the calling thread,
    /// reused across calls so the split allocates nothing in steady state.
    static PARTIALS: RefCell<Aligned> = RefCell::new(Aligned::new(0, 0));
    /// A task's own part of A in a K split whose A is produced by the tasks.
    static A_PART: RefCell<Aligned> = RefCell::new(Aligned::new(0, 0));
}

/// What produces a K split's A: `fill(cols, dst)` writes columns `cols` of A's `m` rows,
/// row-major, into `dst` (`m · cols.len()` floats).
pub(crate) type FillA<'a> = &'a (dyn Fn(Range<usize>, &mut [f32]) + Sync);

/// A K split forced by the bench's hook (`set_few_rows_override(N)`, N >= 2 parts) on a
/// plain GEMM, else `None`: plain GEMMs are not split over K by default. Measured on a
/// 16-core H200 host with A freshly written by other threads, as a model's layers leave
/// it, the row x column grid was as fast or faster on ResNet-50's 7×7-map products (49 ×
/// 4,608 × 512: 228 µs against 239-258 µs split 2-8 ways; the 1x1 ones 10-45% faster
/// unsplit): the reduction costs more than each task reading all of A saves.
fn forced_k_split(m: usize, n: usize, k: usize, threads: usize) -> Option<(usize, usize)> {
    let forced = crate::kernel::BLOCKING_OVERRIDE[6].load(std::sync::atomic::Ordering::Relaxed);
    if forced < 2 || threads <= 1 || m == 0 || n == 0 || k < 32 {
        return None;
    }
    let tk = forced.min(threads).min(k / 16);
    Some((tk, (threads / tk).clamp(1, n.div_ceil(PANEL))))
}

/// The grid `(tk, tn)` of a K split whose tasks produce their own part of A (see
/// [`run_k_split`]): `tk` parts of K times `tn` column blocks, `tk · tn <= threads`.
///
/// Each task fills its `m x k/tk` part of A (a column block of the same part fills it
/// again: `tn` copies in all) and adds an `m x n/tn` partial sum to the reduction, so more
/// parts of K cost less filling and more reduction. A task's cost in FMAs' time: its
/// multiply-adds on whole register tiles, [`FILL_COST`] per float of A it fills, one per
/// float of B, [`PARTIAL_COST`] per float of partial sum; the grid of the least cost wins,
/// parts of at least [`K_SPLIT_MIN_DEPTH`] only. The bench's hook (N >= 2) forces N parts.
pub(crate) fn fill_grid(
    m: usize,
    n: usize,
    k: usize,
    bl: &Blocking,
    threads: usize,
) -> (usize, usize) {
    let nt = n.div_ceil(PANEL);
    let forced = crate::kernel::BLOCKING_OVERRIDE[6].load(std::sync::atomic::Ordering::Relaxed);
    if threads <= 1 || m == 0 || nt == 0 {
        return (1, 1);
    }
    if forced >= 2 {
        let tk = forced.min(threads).min(k.div_ceil(16)).max(1);
        return (tk, (threads / tk).clamp(1, nt));
    }
    if m * n * k < MIN_PARALLEL_FMAS {
        return (1, 1);
    }
    let rows = m.div_ceil(bl.mr) * bl.mr;
    (1..=threads)
        .filter(|&tk| tk == 1 || k / tk >= K_SPLIT_MIN_DEPTH)
        .map(|tk| {
            let tn = (threads / tk).clamp(1, nt);
            let depth = k.div_ceil(tk);
            let cols = nt.div_ceil(tn) * PANEL;
            let partial = if tk > 1 { PARTIAL_COST * m * cols } else { 0 };
            let rounds = (tk * tn).div_ceil(threads);
            let cost =
                (rows * cols * depth + FILL_COST * m * depth + depth * cols + partial + TASK_COST)
                    * rounds;
            (cost, tk, tn)
        })
        .min()
        .map_or((1, 1), |(_, tk, tn)| (tk, tn))
}

/// Where part `part` of a K split into `tk` parts starts: K is cut at multiples of 16
/// (whole cache lines of A's rows) where it can be.
fn k_part_start(part: usize, tk: usize, k: usize) -> usize {
    if part >= tk {
        return k;
    }
    let steps = k.div_ceil(16);
    (part * steps / tk * 16).min(k)
}

/// The C pointer of a K split's partial sums.
#[derive(Clone, Copy)]
struct PPtr(*mut f32);
// SAFETY: tasks write disjoint column blocks of distinct parts, and the reduction reads
// them only after `Parallel::run` of the products has returned; the buffer outlives both.
unsafe impl Send for PPtr {}
// SAFETY: as above.
unsafe impl Sync for PPtr {}

impl PPtr {
    /// The pointer `off` floats on (a method, so closures capture the whole `PPtr`).
    fn at(self, off: usize) -> *mut f32 {
        self.0.wrapping_add(off)
    }
}

/// `C = epilogue(alpha A B + beta C)` as `tk x tn` tasks over parts of K and column blocks,
/// then a reduction (and the epilogue) over column blocks. With `fill`, each task first
/// produces its own part of A (`ctx.a` is not read): nothing of A is shared between cores
/// (an im2col's columns written by one thread and read by sixteen made a convolution's
/// copy and its product wait on each other's caches).
///
/// Part 0 computes `alpha A0 B0 + beta C` into C itself, parts 1.. `alpha Ap Bp` into
/// buffers of their own, without the epilogue; the reduction adds them into C, then runs
/// the epilogue through zero-depth tiles (which load C, as `beta = 1` does, and finish it
/// in registers: the kernels' own epilogue, bit for bit).
///
/// # Safety
/// As [`run_raw`]: `ctx.c` covers `m x n` at `ctx.ldc`, for this call alone. With `fill`,
/// `ctx.direct_a` is true (the tasks' parts of A are row-major).
unsafe fn run_k_split(
    ctx: &Ctx<'_>,
    m: usize,
    n: usize,
    (tk, tn): (usize, usize),
    fill: Option<FillA<'_>>,
    par: &dyn Parallel,
) {
    let k = ctx.k;
    let nt = n.div_ceil(PANEL);
    let cols = |jp: usize, parts: usize| -> (usize, usize) {
        (
            (jp * nt / parts * PANEL).min(n),
            ((jp + 1) * nt / parts * PANEL).min(n),
        )
    };
    let run = |partials: &mut Aligned| {
        partials.grow((tk - 1) * m * n);
        let pbase = PPtr(partials.as_mut_slice().as_mut_ptr());
        let part_ctx = |p: usize| -> Ctx<'_> {
            let k_end = k_part_start(p + 1, tk, k);
            if p == 0 {
                Ctx {
                    k_end,
                    epi: None,
                    ..*ctx
                }
            } else {
                Ctx {
                    k_end,
                    epi: None,
                    beta: 0.0,
                    // In bounds: part p's buffer is floats (p-1)·m·n.. of `partials`.
                    c: CPtr(pbase.at((p - 1) * m * n)),
                    ldc: n,
                    ..*ctx
                }
            }
        };
        let products = |t: usize| {
            let (p, jp) = (t / tn, t % tn);
            let (j0, j1) = cols(jp, tn);
            let p0 = k_part_start(p, tk, k);
            if j0 >= j1 {
                return;
            }
            let Some(fill) = fill else {
                block(&part_ctx(p), 0, m, j0, j1, p0);
                return;
            };
            let p1 = k_part_start(p + 1, tk, k);
            let own = |buf: &mut Aligned| {
                let w = p1 - p0;
                buf.grow(m * w);
                let a = &mut buf.as_mut_slice()[..m * w];
                fill(p0..p1, a);
                // Exactly m rows of w floats: every element the kernels read is inside.
                let a = MatRef {
                    data: a,
                    rows: m,
                    cols: w,
                    rs: w,
                    cs: 1,
                };
                let pc = Ctx {
                    a,
                    a_col0: p0,
                    ..part_ctx(p)
                };
                block(&pc, 0, m, j0, j1, p0);
            };
            A_PART.with(|cell| match cell.try_borrow_mut() {
                Ok(mut b) => own(&mut b),
                Err(_) => own(&mut Aligned::new(0, 0)),
            });
        };
        par.run(tk * tn, &products);
        // The reduction, in whole panels of columns per task, then the epilogue through
        // zero-depth tiles (which load C, as `beta = 1` does, and finish it in registers).
        let tr = par.threads().min(nt).max(1);
        let epi_ctx = ctx.epi.map(|_| Ctx {
            k: 0,
            k_end: 0,
            alpha: 1.0,
            beta: 1.0,
            prefetch_b: false,
            ..*ctx
        });
        let reduce = |t: usize| {
            let (j0, j1) = cols(t, tr);
            if j0 >= j1 {
                return;
            }
            for i in 0..m {
                // SAFETY: row i < m, columns j0..j1 <= n of C (the caller's contract) and of
                // each part's buffer ((tk-1)·m·n floats); this task alone touches these
                // columns, and the products have all returned.
                unsafe {
                    let crow =
                        std::slice::from_raw_parts_mut(ctx.c.0.add(i * ctx.ldc + j0), j1 - j0);
                    for p in 1..tk {
                        let prow = std::slice::from_raw_parts(
                            pbase.at((p - 1) * m * n + i * n + j0),
                            j1 - j0,
                        );
                        for (c, x) in crow.iter_mut().zip(prow) {
                            *c += *x;
                        }
                    }
                }
            }
            if let Some(e) = &epi_ctx {
                block(e, 0, m, j0, j1, 0);
            }
        };
        par.run(tr, &reduce);
    };
    PARTIALS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut p) => run(&mut p),
        Err(_) => run(&mut Aligned::new(0, 0)),
    });
}

/// `C[i0..i1, j0..j1]` on the calling thread, summed over K from `p0` to `ctx.k_end`.
fn block(ctx: &Ctx<'_>, i0: usize, i1: usize, j0: usize, j1: usize, p0: usize) {
    let bl = ctx.bl;
    let k = ctx.k;
    let k_end = ctx.k_end;
    let kc_max = bl.kc.min(k_end - p0);
    let mc_max = bl.mc.min(i1 - i0).div_ceil(bl.mr) * bl.mr;
    let nc_max = bl.nc.min(j1 - j0).div_ceil(PANEL) * PANEL;
    let len_a = if ctx.direct_a { 0 } else { mc_max * kc_max };
    let len_b = if matches!(ctx.b, BRef::Packed(_)) {
        0
    } else {
        nc_max * kc_max
    };
    with_scratch(len_a, len_b, |abuf, bbuf| {
        for jc in (j0..j1).step_by(bl.nc) {
            let nc = bl.nc.min(j1 - jc);
            let mut pc = p0;
            loop {
                let kc = bl.kc.min(k_end - pc);
                let (b_ptr, b_ps) = match &ctx.b {
                    BRef::Packed(p) => {
                        let panels = p.panels();
                        // `jc` is a multiple of PANEL (task boundaries are multiples of it,
                        // NC of NR), so this is the start of a panel, `pc` rows down.
                        (
                            panels[(jc / PANEL) * k * PANEL + pc * PANEL..].as_ptr(),
                            k * PANEL,
                        )
                    }
                    BRef::Mat(bm) => {
                        pack_b(bm, pc, kc, jc, nc, bbuf, kc * PANEL);
                        (bbuf.as_ptr(), kc * PANEL)
                    }
                };
                let first = pc == p0;
                let last = pc + kc >= k_end;
                for ic in (i0..i1).step_by(bl.mc) {
                    let mc = bl.mc.min(i1 - ic);
                    if !ctx.direct_a {
                        pack_a(&ctx.a, ic, mc, pc - ctx.a_col0, kc, bl.mr, abuf);
                    }
                    // The first row block of a pass reads this K block of B from memory.
                    let cold = ic == i0;
                    macro_kernel(
                        ctx, abuf, b_ptr, b_ps, ic, mc, jc, nc, pc, kc, first, last, cold,
                    );
                }
                pc += kc;
                if pc >= k_end {
                    break;
                }
            }
        }
    });
}

/// All tiles of one packed `mc x kc` A block against one `kc x nc` B block.
#[allow(clippy::too_many_arguments)]
fn macro_kernel(
    ctx: &Ctx<'_>,
    abuf: &[f32],
    b_ptr: *const f32,
    b_ps: usize,
    ic: usize,
    mc: usize,
    jc: usize,
    nc: usize,
    pc: usize,
    kc: usize,
    first: bool,
    last: bool,
    cold: bool,
) {
    let bl = ctx.bl;
    let tiles = mc.div_ceil(bl.mr);
    for jr in (0..nc).step_by(bl.nr) {
        let nv = bl.nr.min(nc - jr);
        let j = jc + jr;
        // The B micro-panel after this one, in the order a task first reads them: the next
        // one of this K block, else the first one of the next K block (same columns).
        let next = if !(cold && ctx.prefetch_b) {
            None
        } else if jr + bl.nr < nc {
            let panels = (nc - jr - bl.nr).div_ceil(PANEL).min(bl.nr / PANEL);
            Some((b_ptr.wrapping_add((jr + bl.nr) / PANEL * b_ps), kc, panels))
        } else if pc + kc < ctx.k_end {
            let panels = nc.div_ceil(PANEL).min(bl.nr / PANEL);
            Some((
                b_ptr.wrapping_add(kc * PANEL),
                bl.kc.min(ctx.k_end - pc - kc),
                panels,
            ))
        } else {
            None
        };
        for ir in (0..mc).step_by(bl.mr) {
            let mv = bl.mr.min(mc - ir);
            let i = ic + ir;
            let a_ptr = if ctx.direct_a {
                // In bounds: row i < m, column pc - a_col0 < A's columns (checked at
                // construction; a K split's part of A holds columns a_col0..k_end).
                ctx.a.data[i * ctx.a.rs + pc - ctx.a_col0..].as_ptr()
            } else {
                // Panel ir / mr of the packed block starts at (ir / mr) * kc * mr.
                abuf[ir * kc..].as_ptr()
            };
            let epi = if last {
                ctx.epi.map(|e| TileEpilogue::at(e, i, j))
            } else {
                None
            };
            // Tile t of this pass prefetches its share of the next micro-panel: the tiles are
            // split evenly over its panels, and each panel's rows over its tiles.
            let (pf_next, pf_lines) = match next {
                Some((base, rows, panels)) => {
                    let per_panel = (tiles / panels).max(1);
                    let (t, p) = (ir / bl.mr, (ir / bl.mr) / per_panel);
                    let share = rows.div_ceil(per_panel);
                    let start = (t % per_panel) * share;
                    if p < panels && start < rows {
                        let ptr = base.wrapping_add(p * b_ps + start * PANEL);
                        (ptr, share.min(rows - start).min(kc.div_ceil(2)))
                    } else {
                        (std::ptr::null(), 0)
                    }
                }
                None => (std::ptr::null(), 0),
            };
            let t = Tile {
                kc,
                a: a_ptr,
                a_rs: ctx.a.rs,
                // Panel jr / PANEL of the B block.
                b: b_ptr.wrapping_add(jr / PANEL * b_ps),
                b_ps,
                // The task's first tile reads a micro-panel nobody prefetched: it fetches
                // its own B ahead. Later micro-panels were prefetched by the tiles before.
                b_prefetch: if ctx.prefetch_b && cold && ir == 0 && jr == 0 && first {
                    B_PREFETCH_K * PANEL
                } else {
                    0
                },
                pf_next,
                pf_lines,
                // SAFETY: i < m and j < n, so the offset is inside C's slice.
                c: unsafe { ctx.c.0.add(i * ctx.ldc + j) },
                ldc: ctx.ldc,
                mv,
                nv,
                alpha: ctx.alpha,
                beta: if first { ctx.beta } else { 1.0 },
                epi,
            };
            // SAFETY: the tile satisfies the kernel layout contract: A is either packed into
            // `abuf` (MR rows, kc deep, zero-padded) or `mv` in-bounds rows of row-major A
            // with kc columns from pc; B points at ceil(nv/16) panels of kc rows (packed by
            // `pack_b` or validated PackedB panels); C and the epilogue operands cover
            // rows i..i+mv, columns j..j+nv (shapes checked in `sgemm_with_isa`); this task
            // alone writes that region of C; the ISA was checked available.
            unsafe { ctx.isa.tile(&t, !ctx.direct_a) };
        }
    }
}

/// `C = epilogue(alpha A B)` where A (`m x k`, few rows) is produced by `fill` (see
/// [`crate::sgemm_fill_a`]; operands checked there). On one thread, or when the grid has a
/// single part of K, A is filled whole into a scratch buffer on the calling thread and the
/// product runs on the row x column grid; otherwise as a K split whose tasks fill their own
/// parts of A.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_fill(
    isa: Isa,
    alpha: f32,
    m: usize,
    k: usize,
    fill: FillA<'_>,
    b: BRef<'_>,
    c: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let n = c.cols;
    if m == 0 || n == 0 {
        return;
    }
    let bl = isa.blocking();
    let (tk, tn) = if alpha == 0.0 || k == 0 {
        (1, 1)
    } else {
        fill_grid(m, n, k, &bl, par.threads())
    };
    if tk <= 1 {
        let whole = |buf: &mut Aligned| {
            buf.grow(m * k);
            let a = &mut buf.as_mut_slice()[..m * k];
            fill(0..k, a);
            // Exactly m rows of k floats.
            let a = MatRef {
                data: a,
                rows: m,
                cols: k,
                rs: k,
                cs: 1,
            };
            run(isa, alpha, a, b, 0.0, c, epilogue, par);
        };
        return A_PART.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => whole(&mut buf),
            Err(_) => whole(&mut Aligned::new(0, 0)),
        });
    }
    let ctx = Ctx {
        isa,
        bl,
        alpha,
        beta: 0.0,
        k,
        k_end: k,
        // Not read: every task reads its own part (`a_col0` set per task).
        a: MatRef {
            data: &[],
            rows: 0,
            cols: 0,
            rs: 0,
            cs: 1,
        },
        a_col0: 0,
        b,
        c: CPtr(c.data.as_mut_ptr()),
        ldc: c.ld,
        epi: (!epilogue.is_identity()).then_some(epilogue),
        direct_a: true,
        prefetch_b: matches!(b, BRef::Packed(_))
            && crate::kernel::BLOCKING_OVERRIDE[4].load(std::sync::atomic::Ordering::Relaxed) != 1,
    };
    // SAFETY: `c` is a checked row-major view borrowed mutably for the call (its slice
    // covers m x n at `ld`), and `direct_a` is set with `fill` given. (An element `fill`
    // failed to write would hold a stale float, a wrong result but no undefined one.)
    unsafe { run_k_split(&ctx, m, n, (tk, tn), Some(fill), par) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_split_in_whole_panels() {
        // MobileNetV2's 7×7 projection: 49 x 160 (K = 960) on two threads of the AVX-512
        // blocking (12 x 32 tiles). Whole 32-wide tiles made 96 + 64 columns.
        let bl = Blocking {
            mr: 12,
            nr: 32,
            mc: 144,
            kc: 256,
            nc: 512,
        };
        let grid = split(49, 160, 960, &bl, 2, false, false);
        assert_eq!(grid, (1, 2));
        let cols: Vec<[usize; 2]> = (0..2).map(|t| task_range(t, grid, 49, 160, 12).1).collect();
        assert_eq!(cols, [[0, 80], [80, 160]]);
        // Rows in whole tiles, the last one partial.
        assert_eq!(task_range(1, (2, 1), 49, 160, 12).0, [24, 49]);
    }

    #[test]
    fn a_single_row_against_large_packed_weights_is_split_over_the_threads() {
        let bl = Isa::Scalar.blocking();
        // A classifier: 1 × 1280 times pre-packed 1280 × 500 weights (640K FMAs, below
        // MIN_PARALLEL_FMAS, but 2.5 MB of weights to stream).
        let (tm, tn) = split(1, 500, 1280, &bl, 2, false, false);
        assert_eq!(tm, 1);
        assert!(tn >= 2, "{tn} column tasks");
        // A product below MIN_PARALLEL_FMAS with B packed per call stays on one thread (B
        // was just written, it is in cache), as does one with small weights.
        assert_eq!(split(1, 500, 1280, &bl, 2, false, true), (1, 1));
        assert_eq!(split(1, 64, 64, &bl, 2, false, false), (1, 1));
        // One thread never splits.
        assert_eq!(split(1, 500, 1280, &bl, 1, false, false), (1, 1));
    }

    #[test]
    fn few_row_convolutions_split_k_and_wide_products_do_not() {
        let bl = Blocking {
            mr: 12,
            nr: 32,
            mc: 144,
            kc: 256,
            nc: 512,
        };
        // ResNet-50's 3x3 convolution on a 7x7 map, 16 threads: 4 parts of K x 4 column
        // blocks of 128 (the fastest measured, with 8 parts, on the 16-core host).
        assert_eq!(fill_grid(49, 512, 4608, &bl, 16), (4, 4));
        // Its 1x1 of 1,024 -> 2,048 channels: the partial sums would be 400 KB, unsplit.
        assert_eq!(fill_grid(49, 2048, 1024, &bl, 16).0, 1);
        // One thread, or a product too small to spread: never.
        assert_eq!(fill_grid(49, 512, 4608, &bl, 1), (1, 1));
        assert_eq!(fill_grid(4, 16, 600, &bl, 16), (1, 1));
        // Parts of K are never shorter than K_SPLIT_MIN_DEPTH.
        let (tk, tn) = fill_grid(49, 512, 700, &bl, 16);
        assert!(tk == 1 || 700 / tk >= K_SPLIT_MIN_DEPTH, "{tk}");
        assert!(tk * tn <= 16);
        // Plain GEMMs are split over K only when the bench forces it.
        assert_eq!(forced_k_split(49, 512, 4608, 16), None);
        // The public predicate callers choose `sgemm_fill_a` by, on this CPU's kernel.
        assert!(crate::fill_a_splits_k(49, 512, 4608, 16));
        assert!(!crate::fill_a_splits_k(49, 512, 4608, 1));
    }

    #[test]
    fn k_parts_cover_k_in_order() {
        for (k, tk) in [(4608, 4), (1031, 7), (600, 16), (17, 3), (32, 2)] {
            let starts: Vec<usize> = (0..=tk).map(|p| k_part_start(p, tk, k)).collect();
            assert_eq!((starts[0], starts[tk]), (0, k), "{starts:?}");
            assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
            // Cut at whole cache lines of A's rows, but the end.
            assert!(starts[..tk].iter().all(|s| s % 16 == 0), "{starts:?}");
        }
    }
}
