//! ONNX `GridSample` (the IR's `grid_sample`) of an `[N, C, in...]` tensor at the points
//! of a grid `[N, out..., r]` (r = 2 for images, 3 for volumes; any r), f32 or f16:
//! linear, nearest and cubic modes, zeros, border and reflection padding, and
//! `align_corners`. The result is `[N, C, out...]`.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]. The
//! semantics are the reference's (`rafter-reference`'s `grid_sample`, after ONNX's
//! `op_grid_sample.py`), computed in f32 where the reference uses f64:
//! - each grid coordinate (the last one for the innermost dim) is denormalised in f32 to
//!   `(g + 1) / 2 * (len - 1)` (aligned corners) or `((g + 1) * len - 1) / 2`, rounded
//!   half to even for nearest;
//! - outside `[lo, hi]` (`[0, len - 1]` aligned, else `[-0.5, len - 0.5]`) it is clamped
//!   to `[0, len - 1]` (border) or reflected into `[lo, hi]` (reflection);
//! - each dim contributes 1 (nearest), 2 (linear) or 4 (cubic, `a = -0.75`) taps of
//!   index and weight; a tap's index outside the input is dropped (zeros), clamped
//!   (border) or reflected and clamped (reflection);
//! - the result is the sum over the tensor product of the taps (unrolled: at most `4^r`
//!   loads) of the weights' product times the input there.

use rafter_ir::{GridPadding, GridSampleMode, Op};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};
use crate::window_nd::u32s;

/// GLSL.std.450 `RoundEven`, `Trunc`, `FAbs`, `Floor`, `FClamp`, `SClamp`.
const ROUND_EVEN: u32 = 2;
const TRUNC: u32 = 3;
const FABS: u32 = 4;
const FLOOR: u32 = 8;
const FCLAMP: u32 = 43;
const SCLAMP: u32 = 45;

/// The largest spatial dim generated, and the bound an index is clamped to before it is
/// converted to an integer (a conversion out of range is undefined in SPIR-V).
const MAX_DIM: u32 = 1 << 22;
const INDEX_BOUND: f32 = (1u32 << 24) as f32;

/// The most taps the unrolled product may have (cubic in 3-D: 64).
const MAX_TAPS: usize = 64;

/// A generated grid sample; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct GridSampleKernel {
    /// The SPIR-V module (entry point `main`); bindings: x, grid, then the output.
    pub spirv: Vec<u32>,
}

/// Everything the emitter needs, all static.
struct Layout {
    mode: GridSampleMode,
    padding: GridPadding,
    align: bool,
    /// Element types of x (and the output) and of the grid.
    elem: Elem,
    grid_elem: Elem,
    x: usize,
    g: usize,
    y: usize,
    channels: u32,
    input: Vec<u32>,
    /// Output points per image (the product of the grid's `out...`).
    points: u32,
}

/// One tap along one dim: the input index (a `u32`, 0 where dropped), whether it is
/// kept, and its weight (an f32).
#[derive(Clone, Copy)]
struct Tap {
    index: Word,
    kept: Word,
    weight: Word,
}

/// Generates a body holding one `grid_sample` of two body inputs (x, grid) with static
/// dims past the batch, its result the body's one output.
pub fn grid_sample(body: &rafter_ir::Graph) -> Result<GridSampleKernel, String> {
    let layout = layout(body)?;
    let spirv = grid::module(layout.y + 1, |b, t, e| element(b, t, &layout, e))?;
    Ok(GridSampleKernel { spirv })
}

/// Checks the body and resolves its [`Layout`].
fn layout(body: &rafter_ir::Graph) -> R<Layout> {
    let node = grid::one_node(body, "grid_sample")?;
    let Op::GridSample {
        mode,
        padding_mode,
        align_corners,
    } = node.op
    else {
        return Err(format!("op `{}` is not a grid_sample", node.op.name()));
    };
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the grid_sample's result must be the body's one output".into());
    }
    let x = grid::body_input(body, node, 0, "grid_sample input")?;
    let g = grid::body_input(body, node, 1, "grid_sample grid")?;
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    let (x_ty, g_ty, y_ty) = (ty(x), ty(g), &body.value(body.outputs[0]).ty);
    let elem = Elem::of(x_ty.dtype).map_err(|e| format!("the grid_sample input is {e}"))?;
    let grid_elem = Elem::of(g_ty.dtype).map_err(|e| format!("the grid_sample grid is {e}"))?;
    if y_ty.dtype != x_ty.dtype {
        return Err("the grid_sample's result type differs from its input's".into());
    }
    let xs = u32s(&grid::static_dims_from(x_ty, 1, "grid_sample input")?)?;
    let gs = grid::static_dims_from(g_ty, 1, "grid_sample grid")?;
    let ys = grid::static_dims_from(y_ty, 1, "grid_sample output")?;
    grid::product_u32(&gs, "grid_sample grid")?;
    grid::product_u32(&ys, "grid_sample output")?;
    let r = xs.len() - 1;
    if r == 0 || gs.len() != r + 1 || gs[r] != r as u64 || ys[1..] != gs[..r] {
        return Err(format!(
            "grid {gs:?} and output {ys:?} do not fit an input of {r} spatial dims"
        ));
    }
    let taps = match mode {
        GridSampleMode::Nearest => 1usize,
        GridSampleMode::Linear => 2,
        GridSampleMode::Cubic => 4,
    };
    if taps.checked_pow(r as u32).is_none_or(|n| n > MAX_TAPS) {
        return Err(format!(
            "a {} grid sample in {r} dims is not generated (at most {MAX_TAPS} taps)",
            mode.word()
        ));
    }
    let input = xs[1..].to_vec();
    if input.iter().any(|&d| d == 0 || d > MAX_DIM) {
        return Err(format!(
            "grid_sample input dims {input:?} (1 to 2^22 generated)"
        ));
    }
    grid::product_u32(
        &grid::static_dims_from(x_ty, 1, "grid_sample input")?,
        "grid_sample input",
    )?;
    Ok(Layout {
        mode,
        padding: padding_mode,
        align: align_corners,
        elem,
        grid_elem,
        x,
        g,
        y: body.inputs.len(),
        channels: xs[0],
        input,
        points: grid::product_u32(&gs[..r], "grid_sample points")?,
    })
}

/// Output element `i` (`[img, c, point]`): the taps per dim from the grid, their product
/// over the plane, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude { f32, u32, u64, .. } = *t;
    let (plane, point) = grid::div_mod(b, u32, e.i, l.points)?;
    let (img, _) = grid::div_mod(b, u32, plane, l.channels)?;
    let r = l.input.len();
    // The grid's point: ((img * points + point) * r) as a u64.
    let img64 = build(b.u_convert(u64, None, img))?;
    let pts = b.constant_bit64(u64, u64::from(l.points));
    let at = build(b.i_mul(u64, None, img64, pts))?;
    let p64 = build(b.u_convert(u64, None, point))?;
    let at = build(b.i_add(u64, None, at, p64))?;
    let rc = b.constant_bit64(u64, r as u64);
    let at = build(b.i_mul(u64, None, at, rc))?;
    let mut taps = Vec::with_capacity(r);
    for dim in 0..r {
        // The innermost dim's coordinate comes first in the grid's last axis.
        let off = b.constant_bit64(u64, (r - 1 - dim) as u64);
        let gi = build(b.i_add(u64, None, at, off))?;
        let ga = grid::element_addr(b, u64, e.addrs[l.g], gi, l.grid_elem.bytes())?;
        let nv = elem::load(b, l.grid_elem, f32, ga)?;
        taps.push(dim_taps(b, t, l, dim, nv)?);
    }
    let v = combine(b, t, l, plane, &taps, e.addrs)?;
    let i = build(b.u_convert(u64, None, e.i))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.y], i, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, v)
}

/// The sum over the tensor product of the per-dim taps of the weights' product times
/// `x[plane, index...]` (dropped taps add nothing).
fn combine(
    b: &mut Builder,
    t: &Prelude,
    l: &Layout,
    plane: Word,
    taps: &[Vec<Tap>],
    addrs: &[Word],
) -> R<Word> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let in_plane: u32 = l.input.iter().product();
    let p64 = build(b.u_convert(u64, None, plane))?;
    let span = b.constant_bit64(u64, u64::from(in_plane));
    let base = build(b.i_mul(u64, None, p64, span))?;
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let strides: Vec<u32> = (0..l.input.len())
        .map(|d| l.input[d + 1..].iter().product())
        .collect();
    // Every combination of one tap per dim, as (flat offset, kept, weight).
    let mut combos: Vec<(Word, Word, Word)> = vec![(
        b.constant_bit32(u32, 0),
        b.constant_true(bool),
        b.constant_bit32(f32, 1f32.to_bits()),
    )];
    for (dim, dim_taps) in taps.iter().enumerate() {
        let st = b.constant_bit32(u32, strides[dim]);
        let mut next = Vec::with_capacity(combos.len() * dim_taps.len());
        for &(off, kept, w) in &combos {
            for tap in dim_taps {
                let term = build(b.i_mul(u32, None, tap.index, st))?;
                let off = build(b.i_add(u32, None, off, term))?;
                let kept = build(b.logical_and(bool, None, kept, tap.kept))?;
                let w = build(b.f_mul(f32, None, w, tap.weight))?;
                next.push((off, kept, w));
            }
        }
        combos = next;
    }
    let mut sum = zero;
    for (off, kept, w) in combos {
        let off = build(b.u_convert(u64, None, off))?;
        let flat = build(b.i_add(u64, None, base, off))?;
        let xa = grid::element_addr(b, u64, addrs[l.x], flat, l.elem.bytes())?;
        let xv = elem::load(b, l.elem, f32, xa)?;
        let p = build(b.f_mul(f32, None, w, xv))?;
        let p = build(b.select(f32, None, kept, p, zero))?;
        sum = build(b.f_add(f32, None, sum, p))?;
    }
    Ok(sum)
}

/// `op(args)` of GLSL.std.450 on f32s (or of `ty`).
fn glsl(b: &mut Builder, t: &Prelude, ty: Word, op: u32, args: &[Word]) -> R<Word> {
    let args: Vec<Arg> = args.iter().map(|&a| Arg::IdRef(a)).collect();
    build(b.ext_inst(ty, None, t.glsl, op, args))
}

/// The taps along spatial dim `dim` for the normalised grid coordinate `nv` (an f32).
fn dim_taps(b: &mut Builder, t: &Prelude, l: &Layout, dim: usize, nv: Word) -> R<Vec<Tap>> {
    let Prelude { f32, bool, .. } = *t;
    let c = |b: &mut Builder, v: f32| b.constant_bit32(f32, v.to_bits());
    let len = l.input[dim] as f32;
    let one = c(b, 1.0);
    let half = c(b, 0.5);
    let g1 = build(b.f_add(f32, None, nv, one))?;
    // Multiplying by 0.5 is dividing by 2 exactly, as the reference's f32 arithmetic.
    let mut v = if l.align {
        let h = build(b.f_mul(f32, None, g1, half))?;
        let lm1 = c(b, len - 1.0);
        build(b.f_mul(f32, None, h, lm1))?
    } else {
        let lc = c(b, len);
        let s = build(b.f_mul(f32, None, g1, lc))?;
        let s = build(b.f_sub(f32, None, s, one))?;
        build(b.f_mul(f32, None, s, half))?
    };
    if l.mode == GridSampleMode::Nearest {
        v = glsl(b, t, f32, ROUND_EVEN, &[v])?;
    }
    let (lo, hi) = bounds(l, dim);
    let padded = match l.padding {
        GridPadding::Zeros => v,
        GridPadding::Border => {
            let (z, top) = (c(b, 0.0), c(b, len - 1.0));
            glsl(b, t, f32, FCLAMP, &[v, z, top])?
        }
        GridPadding::Reflection => reflect(b, t, v, (lo, hi))?,
    };
    let (lo_c, hi_c) = (c(b, lo), c(b, hi));
    let below = build(b.f_ord_less_than(bool, None, v, lo_c))?;
    let above = build(b.f_ord_greater_than(bool, None, v, hi_c))?;
    let out = build(b.logical_or(bool, None, below, above))?;
    let v = build(b.select(f32, None, out, padded, v))?;
    match l.mode {
        GridSampleMode::Nearest => {
            let i = to_int(b, t, v)?;
            Ok(vec![fetch(b, t, l, dim, i, one)?])
        }
        GridSampleMode::Linear => {
            let x0 = glsl(b, t, f32, FLOOR, &[v])?;
            let frac = build(b.f_sub(f32, None, v, x0))?;
            let rest = build(b.f_sub(f32, None, one, frac))?;
            let i0 = to_int(b, t, x0)?;
            let one_u = b.constant_bit32(t.u32, 1);
            let i1 = build(b.i_add(t.u32, None, i0, one_u))?;
            Ok(vec![
                fetch(b, t, l, dim, i0, rest)?,
                fetch(b, t, l, dim, i1, frac)?,
            ])
        }
        GridSampleMode::Cubic => {
            let x0 = glsl(b, t, f32, FLOOR, &[v])?;
            let frac = build(b.f_sub(f32, None, v, x0))?;
            let weights = cubic_weights(b, t, frac)?;
            let i0 = to_int(b, t, x0)?;
            let mut taps = Vec::with_capacity(4);
            for (k, w) in weights.into_iter().enumerate() {
                let d = b.constant_bit32(t.u32, (k as i32 - 1) as u32);
                let i = build(b.i_add(t.u32, None, i0, d))?;
                taps.push(fetch(b, t, l, dim, i, w)?);
            }
            Ok(taps)
        }
    }
}

/// The coordinate range of dim `dim` that needs no padding.
fn bounds(l: &Layout, dim: usize) -> (f32, f32) {
    let len = l.input[dim] as f32;
    if l.align {
        (0.0, len - 1.0)
    } else {
        (-0.5, len - 0.5)
    }
}

/// `v` (an integral f32) as an i32 held in a `u32`, as the reference's `as i64`: NaN is
/// 0, and a value past ±2^24 (beyond every input index) is clamped there first, since
/// converting an out-of-range float is undefined.
fn to_int(b: &mut Builder, t: &Prelude, v: Word) -> R<Word> {
    let Prelude { f32, u32, bool, .. } = *t;
    let zero = b.constant_bit32(f32, 0f32.to_bits());
    let nan = build(b.is_nan(bool, None, v))?;
    let v = build(b.select(f32, None, nan, zero, v))?;
    let (lo, hi) = (
        b.constant_bit32(f32, (-INDEX_BOUND).to_bits()),
        b.constant_bit32(f32, INDEX_BOUND.to_bits()),
    );
    let v = glsl(b, t, f32, FCLAMP, &[v, lo, hi])?;
    let i32t = b.type_int(32, 1);
    let i = build(b.convert_f_to_s(i32t, None, v))?;
    build(b.bitcast(u32, None, i))
}

/// The tap of weight `w` at index `i` (an i32 in a `u32`) of dim `dim`, padded: kept only
/// inside the input (zeros), clamped into it (border), or reflected into `[lo, hi]`,
/// truncated and clamped (reflection).
fn fetch(b: &mut Builder, t: &Prelude, l: &Layout, dim: usize, i: Word, w: Word) -> R<Tap> {
    let Prelude { f32, u32, bool, .. } = *t;
    let i32t = b.type_int(32, 1);
    let zero = b.constant_bit32(u32, 0);
    let last = b.constant_bit32(u32, l.input[dim] - 1);
    let clamp = |b: &mut Builder, i: Word| -> R<Word> {
        let s = build(b.bitcast(i32t, None, i))?;
        let (z, top) = (
            b.constant_bit32(i32t, 0),
            b.constant_bit32(i32t, l.input[dim] - 1),
        );
        let s = glsl(b, t, i32t, SCLAMP, &[s, z, top])?;
        build(b.bitcast(u32, None, s))
    };
    let (index, kept) = match l.padding {
        GridPadding::Zeros => {
            // An unsigned compare: a negative index wraps past the last.
            let kept = build(b.u_less_than_equal(bool, None, i, last))?;
            (build(b.select(u32, None, kept, i, zero))?, kept)
        }
        GridPadding::Border => (clamp(b, i)?, b.constant_true(bool)),
        GridPadding::Reflection => {
            let s = build(b.bitcast(i32t, None, i))?;
            let f = build(b.convert_s_to_f(f32, None, s))?;
            let f = reflect(b, t, f, bounds(l, dim))?;
            let f = glsl(b, t, f32, TRUNC, &[f])?;
            let i = to_int(b, t, f)?;
            (clamp(b, i)?, b.constant_true(bool))
        }
    };
    Ok(Tap {
        index,
        kept,
        weight: w,
    })
}

/// `x` reflected into `[lo, hi]` as the reference's `gs_reflect`: below, `dx = lo - x`
/// splits into `n` whole ranges and a rest `r`, giving `lo + r` for even `n` and `hi - r`
/// for odd; above, mirrored; inside (or NaN), `x`.
fn reflect(b: &mut Builder, t: &Prelude, x: Word, (lo, hi): (f32, f32)) -> R<Word> {
    let Prelude { f32, bool, .. } = *t;
    let c = |b: &mut Builder, v: f32| b.constant_bit32(f32, v.to_bits());
    let rng = hi - lo;
    if rng <= 0.0 {
        return Ok(c(b, lo));
    }
    let (lo_c, hi_c, rng_c, half) = (c(b, lo), c(b, hi), c(b, rng), c(b, 0.5));
    let below = build(b.f_ord_less_than(bool, None, x, lo_c))?;
    let above = build(b.f_ord_greater_than(bool, None, x, hi_c))?;
    let d_lo = build(b.f_sub(f32, None, lo_c, x))?;
    let d_hi = build(b.f_sub(f32, None, x, hi_c))?;
    let dx = build(b.select(f32, None, below, d_lo, d_hi))?;
    let q = build(b.f_div(f32, None, dx, rng_c))?;
    let n = glsl(b, t, f32, TRUNC, &[q])?;
    let nr = build(b.f_mul(f32, None, n, rng_c))?;
    let r = build(b.f_sub(f32, None, dx, nr))?;
    // n is even where floor(n / 2) == n / 2 (exact below 2^24).
    let h = build(b.f_mul(f32, None, n, half))?;
    let fh = glsl(b, t, f32, FLOOR, &[h])?;
    let even = build(b.f_ord_equal(bool, None, h, fh))?;
    let from_lo = build(b.f_add(f32, None, lo_c, r))?;
    let from_hi = build(b.f_sub(f32, None, hi_c, r))?;
    // Below: even -> lo + r, odd -> hi - r; above: even -> hi - r, odd -> lo + r.
    let to_lo = build(b.logical_equal(bool, None, even, below))?;
    let reflected = build(b.select(f32, None, to_lo, from_lo, from_hi))?;
    let outside = build(b.logical_or(bool, None, below, above))?;
    build(b.select(f32, None, outside, reflected, x))
}

/// The reference's cubic convolution weights (`a = -0.75`) of the taps at -1, 0, 1, 2 for
/// the fraction `frac` in `[0, 1)`.
fn cubic_weights(b: &mut Builder, t: &Prelude, frac: Word) -> R<[Word; 4]> {
    let f32 = t.f32;
    let x = glsl(b, t, f32, FABS, &[frac])?;
    let one = b.constant_bit32(f32, 1f32.to_bits());
    let two = b.constant_bit32(f32, 2f32.to_bits());
    let x1 = build(b.f_add(f32, None, x, one))?;
    let ox = build(b.f_sub(f32, None, one, x))?;
    let tx = build(b.f_sub(f32, None, two, x))?;
    Ok([
        outer(b, f32, x1)?,
        inner(b, f32, x)?,
        inner(b, f32, ox)?,
        outer(b, f32, tx)?,
    ])
}

/// Cubic weight for a distance `d` in `[0, 1]`: `((a + 2) d - (a + 3)) d² + 1`.
fn inner(b: &mut Builder, f32: Word, d: Word) -> R<Word> {
    let a = -0.75f32;
    let (a2, a3) = (
        b.constant_bit32(f32, (a + 2.0).to_bits()),
        b.constant_bit32(f32, (a + 3.0).to_bits()),
    );
    let one = b.constant_bit32(f32, 1f32.to_bits());
    let v = build(b.f_mul(f32, None, a2, d))?;
    let v = build(b.f_sub(f32, None, v, a3))?;
    let v = build(b.f_mul(f32, None, v, d))?;
    let v = build(b.f_mul(f32, None, v, d))?;
    build(b.f_add(f32, None, v, one))
}

/// Cubic weight for a distance `d` in `[1, 2]`: `((a d - 5a) d + 8a) d - 4a`.
fn outer(b: &mut Builder, f32: Word, d: Word) -> R<Word> {
    let a = -0.75f32;
    let k = |b: &mut Builder, v: f32| b.constant_bit32(f32, v.to_bits());
    let (ac, a5, a8, a4) = (k(b, a), k(b, 5.0 * a), k(b, 8.0 * a), k(b, 4.0 * a));
    let v = build(b.f_mul(f32, None, ac, d))?;
    let v = build(b.f_sub(f32, None, v, a5))?;
    let v = build(b.f_mul(f32, None, v, d))?;
    let v = build(b.f_add(f32, None, v, a8))?;
    let v = build(b.f_mul(f32, None, v, d))?;
    build(b.f_sub(f32, None, v, a4))
}
