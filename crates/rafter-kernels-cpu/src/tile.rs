//! A vectorised tile interpreter for fused f32 elementwise chains.
//!
//! A [`TileProgram`] is a small register program (built with [`TileBuilder`]) over operands
//! that are the call's inputs, constant tensors baked into the program, or scalars. Each
//! operand is broadcast to the output shape NumPy-style (dims right-aligned, a dim of 1
//! repeats): a bias `[768]` against `[128, 768]`, a mask `[1, 1, 1, 128]` against
//! `[1, 12, 128, 128]`. [`run_f32`] turns the dims into per-dimension strides (0 =
//! broadcast), merges dims that are contiguous for every operand, and walks the output in
//! tiles of at most [`TILE`] elements of the innermost run. Each instruction runs over a
//! whole tile in one tight SIMD loop, reading operands in place (a broadcast one as a
//! splat) and writing a scratch register of `TILE` floats, so the interpretive dispatch
//! costs one `match` per instruction per tile and intermediates stay in L1 (a 10-register
//! program uses 40 KiB at most); the last instruction writes the output directly. Tiles
//! are split over [`Parallel`].
//!
//! Numerics: add, sub, mul, div, min, max, neg, abs, sqrt, reciprocal, relu and clip are
//! exact (IEEE, as the reference executor's f32 ops; min/max propagate NaN like NumPy);
//! exp, log, tanh, erf, sigmoid and the fused activations use `simd`'s
//! approximations (documented there: a few ulp; erf 3.7e-7 absolute).

use crate::activation::{gelu_erf_v, gelu_tanh_v};
use crate::common::{check_isa, par_blocks, Disjoint, KernelError};
use crate::simd::{erf, exp, log, sigmoid, tanh, Simd};
use crate::{Isa, Parallel};

/// Elements of the innermost run one tile covers (a multiple of every vector width).
pub const TILE: usize = 512;

/// A value in a [`TileBuilder`] program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileVal(Src);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Src {
    /// Operand `i`: the call's inputs, then the program's constant tensors.
    Operand(usize),
    /// A virtual register (before allocation) or a scratch register (after).
    Reg(usize),
    Scalar(f32),
}

/// Elementwise functions of one value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TileUnary {
    /// `x` (copies an operand to the output).
    Copy,
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `sqrt x`.
    Sqrt,
    /// `1 / sqrt x` (two roundings, as `reciprocal(sqrt x)`).
    Rsqrt,
    /// `1 / x`.
    Recip,
    /// `tanh x`.
    Tanh,
    /// `erf x`.
    Erf,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x < 0 ? 0 : x` (NaN stays NaN).
    Relu,
    /// `x < 0 ? alpha x : x`.
    LeakyRelu(f32),
    /// `x < lo ? lo : x > hi ? hi : x` (NaN stays NaN; use infinities for no bound).
    Clip(f32, f32),
    /// `x^2`, i.e. `pow(x, 2)`.
    Square,
    /// `x^3` as `x * x * x`.
    Cube,
    /// `pow(x, 0.5)`: `sqrt x`, but `pow(-0, 0.5) = +0` and `pow(-inf, 0.5) = +inf`.
    PowHalf,
    /// `0.5 x (1 + erf(x / √2))`.
    GeluErf,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
    /// `x sigmoid(x)`.
    Silu,
}

/// Elementwise functions of two values (broadcast).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileBinary {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// NumPy `maximum` (NaN-propagating).
    Max,
    /// NumPy `minimum` (NaN-propagating).
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Inst {
    Unary(TileUnary, Src),
    Binary(TileBinary, Src, Src),
}

/// Builds a [`TileProgram`]: each call appends one instruction and returns its value.
#[derive(Clone, Debug)]
pub struct TileBuilder {
    inputs: usize,
    consts: Vec<(Vec<f32>, Vec<usize>)>,
    insts: Vec<Inst>,
}

impl TileBuilder {
    /// A program of `inputs` call inputs.
    pub fn new(inputs: usize) -> Self {
        TileBuilder {
            inputs,
            consts: vec![],
            insts: vec![],
        }
    }

    /// Call input `i` (`i < inputs`; checked by [`TileBuilder::finish`]).
    pub fn input(&self, i: usize) -> TileVal {
        TileVal(Src::Operand(i))
    }

    /// A scalar constant.
    pub fn scalar(&self, v: f32) -> TileVal {
        TileVal(Src::Scalar(v))
    }

    /// A constant tensor of `dims` (row-major), broadcast like an input. One-element
    /// tensors become scalars.
    pub fn constant(&mut self, data: Vec<f32>, dims: Vec<usize>) -> Result<TileVal, KernelError> {
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(data.len()) {
            return Err(KernelError::Shape {
                what: "tile constant".into(),
                detail: format!("{} elements for dims {dims:?}", data.len()),
            });
        }
        if data.len() == 1 {
            return Ok(self.scalar(data[0]));
        }
        self.consts.push((data, dims));
        Ok(TileVal(Src::Operand(self.inputs + self.consts.len() - 1)))
    }

    /// `op(a)`.
    pub fn unary(&mut self, op: TileUnary, a: TileVal) -> TileVal {
        self.insts.push(Inst::Unary(op, a.0));
        TileVal(Src::Reg(self.insts.len() - 1))
    }

    /// `op(a, b)`.
    pub fn binary(&mut self, op: TileBinary, a: TileVal, b: TileVal) -> TileVal {
        self.insts.push(Inst::Binary(op, a.0, b.0));
        TileVal(Src::Reg(self.insts.len() - 1))
    }

    /// The program computing `out`. Drops instructions `out` does not depend on, fuses
    /// the erf-GELU chain (`x/√2` or `x·(1/√2)`, erf, +1, ·x, ·0.5, any operand order) into
    /// one instruction, and assigns scratch registers by liveness.
    pub fn finish(mut self, out: TileVal) -> Result<TileProgram, KernelError> {
        let total = self.inputs + self.consts.len();
        let bad = |s: &Src| matches!(*s, Src::Operand(i) if i >= total);
        let srcs = |i: &Inst| match *i {
            Inst::Unary(_, a) => vec![a],
            Inst::Binary(_, a, b) => vec![a, b],
        };
        if self
            .insts
            .iter()
            .flat_map(srcs)
            .chain([out.0])
            .any(|s| bad(&s))
        {
            return Err(KernelError::Shape {
                what: "tile program".into(),
                detail: format!("an operand index is not below {total} operands"),
            });
        }
        // Values from another builder: a register must be defined before its use.
        let n = self.insts.len();
        let late = |s: Src, at: usize| matches!(s, Src::Reg(r) if r >= at);
        if self
            .insts
            .iter()
            .enumerate()
            .any(|(i, inst)| srcs(inst).into_iter().any(|s| late(s, i)))
            || late(out.0, n)
        {
            return Err(KernelError::Shape {
                what: "tile program".into(),
                detail: "a value used before it is defined (from another builder?)".into(),
            });
        }
        let mut out = out.0;
        if !matches!(out, Src::Reg(_)) {
            self.insts.push(Inst::Unary(TileUnary::Copy, out));
            out = Src::Reg(self.insts.len() - 1);
        }
        let Src::Reg(out_v) = out else { unreachable!() };
        fuse_gelu_erf(&mut self.insts);
        // Live instructions: those `out` depends on.
        let n = self.insts.len();
        let mut live = vec![false; n];
        live[out_v] = true;
        for v in (0..=out_v).rev() {
            if live[v] {
                for s in srcs(&self.insts[v]) {
                    if let Src::Reg(r) = s {
                        live[r] = true;
                    }
                }
            }
        }
        let mut last_use = vec![0usize; n];
        for (v, inst) in self.insts.iter().enumerate() {
            if live[v] {
                for s in srcs(inst) {
                    if let Src::Reg(r) = s {
                        last_use[r] = v;
                    }
                }
            }
        }
        // Linear scan: a value's register is free after its last use; the destination
        // never shares a register with the instruction's own operands.
        let mut phys = vec![usize::MAX; n];
        let mut free: Vec<usize> = vec![];
        let mut regs = 0;
        let mut code = vec![];
        for v in 0..n {
            if !live[v] {
                continue;
            }
            let map = |s: Src| match s {
                Src::Reg(r) => Src::Reg(phys[r]),
                o => o,
            };
            let inst = match self.insts[v] {
                Inst::Unary(op, a) => Inst::Unary(op, map(a)),
                Inst::Binary(op, a, b) => Inst::Binary(op, map(a), map(b)),
            };
            let dst = if v == out_v {
                OUT
            } else {
                free.pop().unwrap_or_else(|| {
                    regs += 1;
                    regs - 1
                })
            };
            phys[v] = dst;
            code.push((inst, dst));
            for s in srcs(&self.insts[v]) {
                if let Src::Reg(r) = s {
                    if last_use[r] == v && phys[r] != OUT && !free.contains(&phys[r]) {
                        free.push(phys[r]);
                    }
                }
            }
        }
        let mut used = vec![false; total];
        for (inst, _) in &code {
            let (a, b) = match *inst {
                Inst::Unary(_, a) => (a, None),
                Inst::Binary(_, a, b) => (a, Some(b)),
            };
            for s in [Some(a), b].into_iter().flatten() {
                if let Src::Operand(k) = s {
                    used[k] = true;
                }
            }
        }
        Ok(TileProgram {
            inputs: self.inputs,
            consts: self.consts,
            code,
            regs,
            used,
        })
    }
}

/// The destination of the program's last instruction: the output itself.
const OUT: usize = usize::MAX;

/// Rewrites `mul(mul(add(erf(x/√2), 1), x), 0.5)` (operands of each commutative op in
/// either order, `x·(1/√2)` for `x/√2`) into `GeluErf(x)` when the intermediates have no
/// other use. The dead instructions are left for `finish`'s liveness pass.
fn fuse_gelu_erf(insts: &mut [Inst]) {
    let n = insts.len();
    let mut uses = vec![0usize; n];
    for i in insts.iter() {
        let (a, b) = match *i {
            Inst::Unary(_, a) => (a, None),
            Inst::Binary(_, a, b) => (a, Some(b)),
        };
        for s in [Some(a), b].into_iter().flatten() {
            if let Src::Reg(r) = s {
                uses[r] += 1;
            }
        }
    }
    let near = |v: f32, w: f32| (v - w).abs() <= 2e-7 * w;
    let is_scalar = |s: Src, w: f32| matches!(s, Src::Scalar(v) if near(v, w));
    // The (value, other) pair of a commutative binary op with one side matching.
    let split = |a: Src, b: Src, f: &dyn Fn(Src) -> bool| {
        if f(a) {
            Some((a, b))
        } else if f(b) {
            Some((b, a))
        } else {
            None
        }
    };
    for top in 0..n {
        let Inst::Binary(TileBinary::Mul, a, b) = insts[top] else {
            continue;
        };
        let single = |s: Src| matches!(s, Src::Reg(r) if uses[r] == 1);
        let Some((_, m)) = split(a, b, &|s| is_scalar(s, 0.5)) else {
            continue;
        };
        // m = mul(p, x) with p = add(e, 1), e = erf(w), w = x / √2 or x * (1/√2).
        let matched = (|| {
            let Src::Reg(mr) = m else { return None };
            if !single(m) {
                return None;
            }
            let Inst::Binary(TileBinary::Mul, c, d) = insts[mr] else {
                return None;
            };
            let is_p = |s: Src| -> bool {
                let Src::Reg(pr) = s else { return false };
                if !single(s) {
                    return false;
                }
                let Inst::Binary(TileBinary::Add, e1, e2) = insts[pr] else {
                    return false;
                };
                split(e1, e2, &|t| is_scalar(t, 1.0)).is_some_and(|(_, e)| {
                    matches!(e, Src::Reg(er) if single(e)
                        && matches!(insts[er], Inst::Unary(TileUnary::Erf, Src::Reg(_))))
                })
            };
            let (p, x) = split(c, d, &is_p)?;
            let Src::Reg(pr) = p else { return None };
            let Inst::Binary(_, e1, e2) = insts[pr] else {
                return None;
            };
            let (_, e) = split(e1, e2, &|t| is_scalar(t, 1.0))?;
            let Src::Reg(er) = e else { return None };
            let Inst::Unary(TileUnary::Erf, w) = insts[er] else {
                return None;
            };
            if !single(w) {
                return None;
            }
            let Src::Reg(wr) = w else { return None };
            let ok = match insts[wr] {
                Inst::Binary(TileBinary::Div, wx, k) => {
                    wx == x && is_scalar(k, std::f32::consts::SQRT_2)
                }
                Inst::Binary(TileBinary::Mul, u, v) => {
                    split(u, v, &|t| is_scalar(t, std::f32::consts::FRAC_1_SQRT_2))
                        .is_some_and(|(_, wx)| wx == x)
                }
                _ => false,
            };
            ok.then_some(x)
        })();
        if let Some(x) = matched {
            insts[top] = Inst::Unary(TileUnary::GeluErf, x);
        }
    }
}

/// A compiled elementwise program; run it with [`run_f32`].
#[derive(Clone, Debug)]
pub struct TileProgram {
    inputs: usize,
    consts: Vec<(Vec<f32>, Vec<usize>)>,
    /// Instructions with their destination register ([`OUT`] for the output).
    code: Vec<(Inst, usize)>,
    regs: usize,
    /// Which operands (inputs, then constants) the output depends on.
    used: Vec<bool>,
}

impl TileProgram {
    /// How many call inputs [`run_f32`] expects.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Instructions after dead-code removal and fusion (for tests and traces).
    pub fn len(&self) -> usize {
        self.code.len()
    }

    /// Whether the program has no instructions (never: the output is always computed).
    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// The output dims for inputs of `input_dims`: the NumPy broadcast of every input and
    /// constant the output depends on (the shape [`run_f32`] needs for `out_dims`).
    pub fn out_dims(&self, input_dims: &[&[usize]]) -> Result<Vec<usize>, KernelError> {
        if input_dims.len() != self.inputs {
            return Err(KernelError::Shape {
                what: "tile program inputs".into(),
                detail: format!(
                    "the program takes {}, got {}",
                    self.inputs,
                    input_dims.len()
                ),
            });
        }
        let all = input_dims
            .iter()
            .copied()
            .chain(self.consts.iter().map(|(_, d)| d.as_slice()));
        let mut out: Vec<usize> = vec![];
        for (k, dims) in all.enumerate() {
            if !self.used[k] {
                continue;
            }
            if dims.len() > out.len() {
                let mut wider = vec![1; dims.len() - out.len()];
                wider.extend_from_slice(&out);
                out = wider;
            }
            let off = out.len() - dims.len();
            for (j, &d) in dims.iter().enumerate() {
                let o = &mut out[off + j];
                if *o == 1 {
                    *o = d;
                } else if d != 1 && d != *o {
                    return Err(KernelError::Shape {
                        what: if k < self.inputs {
                            format!("tile input {k}")
                        } else {
                            format!("tile constant {}", k - self.inputs)
                        },
                        detail: format!("dims {dims:?} do not broadcast with {out:?}"),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Whether the program was fused into a single erf-GELU instruction.
    pub fn is_gelu_erf(&self) -> bool {
        matches!(
            self.code.as_slice(),
            [(Inst::Unary(TileUnary::GeluErf, _), _)]
        )
    }
}

/// Runs `prog` on `inputs` (each its row-major data and dims), writing `out` of
/// `out_dims` (row-major), on the fastest ISA.
///
/// Contract: every input (and constant) the output depends on broadcasts to `out_dims`
/// NumPy-style: its dims, right-aligned against `out_dims`, are each 1 or equal to the
/// output's; its data holds exactly the product of its dims. A mismatch is an error naming
/// the operand. Inputs the output does not depend on are not read or checked.
pub fn run_f32(
    prog: &TileProgram,
    inputs: &[(&[f32], &[usize])],
    out: &mut [f32],
    out_dims: &[usize],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    run_f32_with_isa(Isa::detect(), prog, inputs, out, out_dims, par)
}

/// One input of [`run_f32_over_output`].
#[derive(Clone, Copy, Debug)]
pub enum TileInput<'a> {
    /// Row-major data and its dims (broadcast to the output as in [`run_f32`]).
    Data(&'a [f32], &'a [usize]),
    /// The output buffer's contents on entry, as a tensor of the output's dims: a result
    /// computed in place over one of its operands, with no copy of that operand.
    Output,
}

/// [`run_f32`] where some inputs are the output buffer itself ([`TileInput::Output`]):
/// each tile's slice of the output is read into a scratch register before the tile writes
/// it. Sound because an `Output` input has the output's dims, so tile `t` reads exactly
/// the elements tile `t` writes, and no two tasks share a tile.
pub fn run_f32_over_output(
    prog: &TileProgram,
    inputs: &[TileInput<'_>],
    out: &mut [f32],
    out_dims: &[usize],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    run_tiles(Isa::detect(), prog, inputs, out, out_dims, par)
}

/// An operand's view: its data and its stride per (collapsed) output dim; `aliased`: the
/// output's own contents on entry ([`TileInput::Output`], `data` empty).
struct Operand<'a> {
    data: &'a [f32],
    strides: Vec<usize>,
    aliased: bool,
}

/// [`run_f32`] on a given ISA.
pub fn run_f32_with_isa(
    isa: Isa,
    prog: &TileProgram,
    inputs: &[(&[f32], &[usize])],
    out: &mut [f32],
    out_dims: &[usize],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let inputs: Vec<TileInput<'_>> = inputs.iter().map(|&(d, s)| TileInput::Data(d, s)).collect();
    run_tiles(isa, prog, &inputs, out, out_dims, par)
}

/// The tile loop behind [`run_f32_with_isa`] and [`run_f32_over_output`].
fn run_tiles(
    isa: Isa,
    prog: &TileProgram,
    inputs: &[TileInput<'_>],
    out: &mut [f32],
    out_dims: &[usize],
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    if inputs.len() != prog.inputs {
        return Err(KernelError::Shape {
            what: "tile program inputs".into(),
            detail: format!("the program takes {}, got {}", prog.inputs, inputs.len()),
        });
    }
    let total: Option<usize> = out_dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if total != Some(out.len()) {
        return Err(KernelError::Shape {
            what: "tile output".into(),
            detail: format!("{} elements for dims {out_dims:?}", out.len()),
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let rank = out_dims.len();
    let all = inputs.iter().map(|&i| match i {
        TileInput::Data(d, s) => (d, s, false),
        TileInput::Output => (&[][..], out_dims, true),
    });
    let all = all.chain(
        prog.consts
            .iter()
            .map(|(d, s)| (d.as_slice(), s.as_slice(), false)),
    );
    let mut ops = vec![];
    for (k, (data, dims, aliased)) in all.enumerate() {
        let what = || {
            if k < prog.inputs {
                format!("tile input {k}")
            } else {
                format!("tile constant {}", k - prog.inputs)
            }
        };
        if !prog.used[k] {
            // An operand the output does not depend on (e.g. a matmul's operands left in
            // its epilogue body's inputs): any shape, never read.
            ops.push(Operand {
                data,
                strides: vec![0; rank],
                aliased: false,
            });
            continue;
        }
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if !aliased && n != Some(data.len()) {
            return Err(KernelError::Shape {
                what: what(),
                detail: format!("{} elements for dims {dims:?}", data.len()),
            });
        }
        if dims.len() > rank {
            return Err(KernelError::Shape {
                what: what(),
                detail: format!("dims {dims:?} have more axes than the output {out_dims:?}"),
            });
        }
        let mut strides = vec![0usize; rank];
        let mut stride = 1;
        for (j, &d) in dims.iter().enumerate().rev() {
            let od = out_dims[rank - dims.len() + j];
            if d == od {
                strides[rank - dims.len() + j] = if d == 1 { 0 } else { stride };
            } else if d != 1 {
                return Err(KernelError::Shape {
                    what: what(),
                    detail: format!("dims {dims:?} do not broadcast to the output {out_dims:?}"),
                });
            }
            stride *= d;
        }
        ops.push(Operand {
            data,
            strides,
            aliased,
        });
    }
    // Merge dims (innermost first) that every operand walks contiguously, dropping 1s.
    let mut dims: Vec<usize> = vec![]; // collapsed, innermost first
    let mut strides: Vec<Vec<usize>> = vec![vec![]; ops.len()];
    for j in (0..rank).rev() {
        let d = out_dims[j];
        if d == 1 {
            continue;
        }
        let merge = !dims.is_empty()
            && ops.iter().zip(&strides).all(|(o, s)| {
                o.strides[j] == s.last().copied().unwrap_or(0) * dims.last().copied().unwrap_or(1)
            });
        if merge {
            *dims.last_mut().unwrap() *= d;
        } else {
            dims.push(d);
            for (o, s) in ops.iter().zip(&mut strides) {
                s.push(o.strides[j]);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        strides.iter_mut().for_each(|s| s.push(0));
    }
    for (o, s) in ops.iter_mut().zip(strides) {
        o.strides = s;
    }
    let inner = dims[0];
    let chunks = inner.div_ceil(TILE);
    let rows = out.len() / inner;
    let tiles = rows * chunks;
    let aliased = ops.iter().any(|o| o.aliased);
    let outp = Disjoint::new(out);
    let ops = &ops;
    let dims = &dims;
    par_blocks(par, tiles, TILE.min(inner), &|ts| {
        let mut regs: Vec<Vec<f32>> = vec![vec![0.0; TILE.min(inner)]; prog.regs];
        // The output's tile on entry, for each aliased operand (all read the same bytes).
        let mut entry = vec![0.0f32; if aliased { TILE.min(inner) } else { 0 }];
        let mut base = vec![0usize; ops.len()];
        for t in ts {
            let (row, chunk) = (t / chunks, t % chunks);
            let start = chunk * TILE;
            let len = TILE.min(inner - start);
            if aliased {
                let o = row * inner + start;
                // SAFETY: as for the output write below: this task's own tile, and the
                // part is dropped before the write takes it again.
                entry[..len].copy_from_slice(unsafe { outp.part(o..o + len) });
            }
            // Base offsets of this row in every operand.
            let mut r = row;
            base.fill(0);
            for (k, &d) in dims.iter().enumerate().skip(1) {
                let i = r % d;
                r /= d;
                for (b, o) in base.iter_mut().zip(ops) {
                    *b += i * o.strides[k];
                }
            }
            for &(inst, d) in &prog.code {
                let mut reg = if d == OUT {
                    vec![]
                } else {
                    std::mem::take(&mut regs[d])
                };
                let dst: &mut [f32] = if d == OUT {
                    let o = row * inner + start;
                    // SAFETY: tiles are disjoint ranges of the output and `par_blocks`
                    // hands each tile to one task.
                    unsafe { outp.part(o..o + len) }
                } else {
                    &mut reg[..len]
                };
                match inst {
                    Inst::Unary(op, a) => {
                        unary_isa(isa, op, arg(a, &regs, &entry, ops, &base, start, len), dst)
                    }
                    Inst::Binary(op, a, b) => {
                        let (a, b) = (
                            arg(a, &regs, &entry, ops, &base, start, len),
                            arg(b, &regs, &entry, ops, &base, start, len),
                        );
                        binary_isa(isa, op, a, b, dst)
                    }
                }
                if d != OUT {
                    regs[d] = reg;
                }
            }
        }
    });
    Ok(())
}

/// Operand `s` of an instruction over the tile `start..start + len` of the row whose
/// operand offsets are `base`; `entry`: the output's tile on entry (aliased operands).
fn arg<'a>(
    s: Src,
    regs: &'a [Vec<f32>],
    entry: &'a [f32],
    ops: &'a [Operand<'_>],
    base: &[usize],
    start: usize,
    len: usize,
) -> Arg<'a> {
    match s {
        Src::Scalar(v) => Arg::Splat(v),
        Src::Reg(r) => Arg::Slice(&regs[r][..len]),
        Src::Operand(k) if ops[k].aliased => Arg::Slice(&entry[..len]),
        Src::Operand(k) => {
            let o = &ops[k];
            // The innermost stride is 0 (broadcast) or 1: operands are row-major, so a
            // non-broadcast innermost dim is contiguous.
            debug_assert!(o.strides[0] <= 1);
            if o.strides[0] == 0 {
                Arg::Splat(o.data[base[k]])
            } else {
                Arg::Slice(&o.data[base[k] + start..base[k] + start + len])
            }
        }
    }
}

/// One operand of an instruction over one tile.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Slice(&'a [f32]),
    Splat(f32),
}

/// `d[i] = body(a[i])` for an operand slice or splat (a macro for the reason given at
/// `map_in_place!`).
macro_rules! map1 {
    ($s:ident, $a:expr, $d:expr, |$x:ident| $body:expr) => {{
        let d: &mut [f32] = $d;
        match $a {
            Arg::Slice(a) => {
                let lanes = $crate::simd::lanes($s);
                let mut dc = d.chunks_exact_mut(lanes);
                let mut ac = a.chunks_exact(lanes);
                for (dv, av) in (&mut dc).zip(&mut ac) {
                    let $x = $s.load(av);
                    let r = $body;
                    $s.store(dv, r);
                }
                let tail = dc.into_remainder();
                if !tail.is_empty() {
                    let $x = $s.load_partial(ac.remainder(), 0.0);
                    let r = $body;
                    $s.store_partial(tail, r);
                }
            }
            Arg::Splat(v) => {
                let $x = $s.splat(v);
                let r = $body;
                fill($s, d, r);
            }
        }
    }};
}

/// `d[i] = body(a[i], b[i])` for operand slices or splats.
macro_rules! map2 {
    ($s:ident, $a:expr, $b:expr, $d:expr, |$x:ident, $y:ident| $body:expr) => {{
        let d: &mut [f32] = $d;
        match ($a, $b) {
            (Arg::Slice(a), Arg::Slice(b)) => {
                let lanes = $crate::simd::lanes($s);
                let mut dc = d.chunks_exact_mut(lanes);
                let mut ac = a.chunks_exact(lanes);
                let mut bc = b.chunks_exact(lanes);
                for ((dv, av), bv) in (&mut dc).zip(&mut ac).zip(&mut bc) {
                    let ($x, $y) = ($s.load(av), $s.load(bv));
                    let r = $body;
                    $s.store(dv, r);
                }
                let tail = dc.into_remainder();
                if !tail.is_empty() {
                    let $x = $s.load_partial(ac.remainder(), 0.0);
                    let $y = $s.load_partial(bc.remainder(), 0.0);
                    let r = $body;
                    $s.store_partial(tail, r);
                }
            }
            (a @ Arg::Slice(_), Arg::Splat(y)) => {
                let $y = $s.splat(y);
                map1!($s, a, d, |$x| $body)
            }
            (Arg::Splat(x), b @ Arg::Slice(_)) => {
                let $x = $s.splat(x);
                map1!($s, b, d, |$y| $body)
            }
            (Arg::Splat(x), Arg::Splat(y)) => {
                let ($x, $y) = ($s.splat(x), $s.splat(y));
                let r = $body;
                fill($s, d, r);
            }
        }
    }};
}

simd_dispatch!(fn unary_isa(op: TileUnary, a: Arg<'_>, d: &mut [f32]) => unary_generic);
simd_dispatch!(fn binary_isa(op: TileBinary, a: Arg<'_>, b: Arg<'_>, d: &mut [f32]) => binary_generic);

#[inline(always)]
fn unary_generic<S: Simd>(s: S, op: TileUnary, a: Arg<'_>, d: &mut [f32]) {
    let zero = s.splat(0.0);
    match op {
        TileUnary::Copy => map1!(s, a, d, |x| x),
        TileUnary::Neg => map1!(s, a, d, |x| s.neg(x)),
        TileUnary::Abs => map1!(s, a, d, |x| s.abs(x)),
        TileUnary::Exp => map1!(s, a, d, |x| exp(s, x)),
        TileUnary::Log => map1!(s, a, d, |x| log(s, x)),
        TileUnary::Sqrt => map1!(s, a, d, |x| s.sqrt(x)),
        TileUnary::Rsqrt => map1!(s, a, d, |x| s.div(s.splat(1.0), s.sqrt(x))),
        TileUnary::Recip => map1!(s, a, d, |x| s.div(s.splat(1.0), x)),
        TileUnary::Tanh => map1!(s, a, d, |x| tanh(s, x)),
        TileUnary::Erf => map1!(s, a, d, |x| erf(s, x)),
        TileUnary::Sigmoid => map1!(s, a, d, |x| sigmoid(s, x)),
        TileUnary::Relu => map1!(s, a, d, |x| s.select_lt(x, zero, zero, x)),
        TileUnary::LeakyRelu(alpha) => {
            let al = s.splat(alpha);
            map1!(s, a, d, |x| s.select_lt(x, zero, s.mul(x, al), x))
        }
        TileUnary::Clip(lo, hi) => {
            let (l, h) = (s.splat(lo), s.splat(hi));
            map1!(s, a, d, |x| {
                let x = s.select_lt(x, l, l, x);
                s.select_lt(h, x, h, x)
            })
        }
        TileUnary::Square => map1!(s, a, d, |x| s.mul(x, x)),
        TileUnary::Cube => map1!(s, a, d, |x| s.mul(s.mul(x, x), x)),
        TileUnary::PowHalf => {
            let inf = s.splat(f32::INFINITY);
            map1!(s, a, d, |x| {
                // sqrt(-0) + 0 = +0; pow(-inf, 0.5) = +inf.
                let r = s.add(s.sqrt(x), zero);
                s.select_eq(x, s.splat(f32::NEG_INFINITY), inf, r)
            })
        }
        TileUnary::GeluErf => map1!(s, a, d, |x| gelu_erf_v(s, x)),
        TileUnary::GeluTanh => map1!(s, a, d, |x| gelu_tanh_v(s, x)),
        TileUnary::Silu => map1!(s, a, d, |x| s.mul(x, sigmoid(s, x))),
    }
}

#[inline(always)]
fn binary_generic<S: Simd>(s: S, op: TileBinary, a: Arg<'_>, b: Arg<'_>, d: &mut [f32]) {
    match op {
        TileBinary::Add => map2!(s, a, b, d, |x, y| s.add(x, y)),
        TileBinary::Sub => map2!(s, a, b, d, |x, y| s.sub(x, y)),
        TileBinary::Mul => map2!(s, a, b, d, |x, y| s.mul(x, y)),
        TileBinary::Div => map2!(s, a, b, d, |x, y| s.div(x, y)),
        // As the reference: a NaN operand wins, else `x >= y ? x : y` (max) and
        // `x >= y ? y : x` (min), so equal operands (+0 and -0) pick the same one.
        TileBinary::Max => map2!(s, a, b, d, |x, y| s.select_nan(
            y,
            y,
            s.select_lt(x, y, y, x)
        )),
        TileBinary::Min => map2!(s, a, b, d, |x, y| s.select_nan(
            x,
            x,
            s.select_lt(x, y, x, y)
        )),
    }
}

#[inline(always)]
fn fill<S: Simd>(s: S, d: &mut [f32], v: S::V) {
    let mut dc = d.chunks_exact_mut(S::LANES);
    for dv in &mut dc {
        s.store(dv, v);
    }
    let tail = dc.into_remainder();
    if !tail.is_empty() {
        s.store_partial(tail, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::tests::isas;
    use crate::{ScopedThreads, Sequential};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(977));
                ((h >> 8) % 20_001) as f32 / 5_000.0 - 2.0
            })
            .collect()
    }

    /// The broadcast index of output element `i` into an operand of `dims`.
    fn bidx(mut i: usize, out: &[usize], dims: &[usize]) -> usize {
        let (mut idx, mut stride) = (0, 1);
        for (k, &od) in out.iter().enumerate().rev() {
            let c = i % od;
            i /= od;
            if let Some(j) = (k + dims.len()).checked_sub(out.len()) {
                if dims[j] != 1 {
                    idx += c * stride;
                }
                stride *= dims[j];
            }
        }
        idx
    }

    #[test]
    fn bias_add_gelu_with_broadcast_matches_naive() {
        // y = gelu_erf(x + bias) * scale, x [3, 5, 37], bias [37], scale [3, 1, 1].
        let out = [3usize, 5, 37];
        let x = data(3 * 5 * 37, 1);
        let bias = data(37, 2);
        let scale = data(3, 3);
        let mut b = TileBuilder::new(3);
        let s = b.binary(TileBinary::Add, b.input(0), b.input(1));
        let g = b.unary(TileUnary::GeluErf, s);
        let y = b.binary(TileBinary::Mul, g, b.input(2));
        let p = b.finish(y).unwrap();
        let want: Vec<f32> = (0..x.len())
            .map(|i| {
                let v = x[i] + bias[bidx(i, &out, &[37])];
                let e = crate::simd::tests::erf64(v as f64 / 2f64.sqrt());
                (0.5 * v as f64 * (1.0 + e)) as f32 * scale[bidx(i, &out, &[3, 1, 1])]
            })
            .collect();
        for isa in isas() {
            let mut y = vec![0.0; x.len()];
            let ins: [(&[f32], &[usize]); 3] = [(&x, &out), (&bias, &[37]), (&scale, &[3, 1, 1])];
            run_f32_with_isa(isa, &p, &ins, &mut y, &out, &ScopedThreads::new(2)).unwrap();
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{isa:?} {i}: {g} vs {w}"
                );
            }
        }
    }

    /// A result computed over its own operand's bytes (`TileInput::Output`) equals the
    /// same program run on a copy: the aliased operand read twice, beside a broadcast one,
    /// over rows of several tiles with a tail, on several threads.
    #[test]
    fn output_aliased_input_matches_a_copy() {
        let out = [3usize, 5, 1000];
        let x = data(3 * 5 * 1000, 4);
        let bias = data(1000, 5);
        let mut b = TileBuilder::new(2);
        let sq = b.binary(TileBinary::Mul, b.input(0), b.input(0));
        let y = b.binary(TileBinary::Add, sq, b.input(1));
        let y = b.binary(TileBinary::Sub, y, b.input(0));
        let p = b.finish(y).unwrap();
        let mut want = vec![0.0; x.len()];
        let ins: [(&[f32], &[usize]); 2] = [(&x, &out), (&bias, &[1000])];
        run_f32(&p, &ins, &mut want, &out, &ScopedThreads::new(3)).unwrap();
        let mut y = x.clone();
        let ins = [TileInput::Output, TileInput::Data(&bias, &[1000])];
        run_f32_over_output(&p, &ins, &mut y, &out, &ScopedThreads::new(3)).unwrap();
        assert_eq!(y, want);
        assert_ne!(y, x, "the program changed every element");
    }

    /// Every op against its scalar definition, over long rows (several tiles with a
    /// tail) and a broadcast scalar operand.
    #[test]
    fn every_op_matches_scalar_definitions() {
        let n = 2 * TILE + 77;
        let mut x = data(n, 7);
        x[5] = f32::NAN;
        x[6] = -0.0;
        x[7] = f32::NEG_INFINITY;
        let mut y = data(n, 8);
        y[6] = 0.0; // max(-0, +0) is -0 and min(-0, +0) is +0 in the reference
        y[9] = f32::NAN;
        x[10] = 0.0;
        y[10] = -0.0;
        let un = [
            (TileUnary::Copy, (|v| v) as fn(f32) -> f32),
            (TileUnary::Neg, |v| -v),
            (TileUnary::Abs, f32::abs),
            (TileUnary::Sqrt, f32::sqrt),
            (TileUnary::Rsqrt, |v| 1.0 / v.sqrt()),
            (TileUnary::Recip, |v| 1.0 / v),
            (TileUnary::Relu, |v| if v < 0.0 { 0.0 } else { v }),
            (
                TileUnary::LeakyRelu(0.1),
                |v| if v < 0.0 { 0.1 * v } else { v },
            ),
            (TileUnary::Clip(-0.5, 1.0), |v| v.clamp(-0.5, 1.0)),
            (TileUnary::Square, |v| v * v),
            (TileUnary::Cube, |v| v * v * v),
            (TileUnary::PowHalf, |v| v.powf(0.5)),
            (TileUnary::Exp, f32::exp),
            (TileUnary::Log, f32::ln),
            (TileUnary::Tanh, f32::tanh),
            (TileUnary::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
            (TileUnary::Silu, |v| v / (1.0 + (-v).exp())),
        ];
        for isa in isas() {
            for (op, f) in un {
                let mut b = TileBuilder::new(1);
                let v = b.unary(op, b.input(0));
                let p = b.finish(v).unwrap();
                let mut out = vec![0.0; n];
                run_f32_with_isa(isa, &p, &[(&x, &[n])], &mut out, &[n], &Sequential).unwrap();
                for (i, (&g, &xv)) in out.iter().zip(&x).enumerate() {
                    let w = f(xv);
                    let ok = (g.is_nan() && w.is_nan())
                        || g == w
                        || (g - w).abs() <= 4e-7 * w.abs() + 1e-30;
                    assert!(ok, "{isa:?} {op:?} x[{i}] = {xv}: {g} vs {w}");
                }
            }
            let bin = [
                (TileBinary::Add, (|a, b| a + b) as fn(f32, f32) -> f32),
                (TileBinary::Sub, |a, b| a - b),
                (TileBinary::Mul, |a, b| a * b),
                (TileBinary::Div, |a, b| a / b),
                // The reference's NaN-propagating minmax, sign of zero included.
                (TileBinary::Max, |a: f32, b: f32| {
                    if a.is_nan() {
                        a
                    } else if b.is_nan() || b > a {
                        b
                    } else {
                        a
                    }
                }),
                (TileBinary::Min, |a: f32, b: f32| {
                    if a.is_nan() {
                        a
                    } else if b.is_nan() || a >= b {
                        b
                    } else {
                        a
                    }
                }),
            ];
            for (op, f) in bin {
                for scalar_b in [false, true] {
                    let mut b = TileBuilder::new(2);
                    let rhs = if scalar_b { b.scalar(0.75) } else { b.input(1) };
                    let v = b.binary(op, b.input(0), rhs);
                    let p = b.finish(v).unwrap();
                    let mut out = vec![0.0; n];
                    let ins: [(&[f32], &[usize]); 2] = [(&x, &[n]), (&y, &[n])];
                    run_f32_with_isa(isa, &p, &ins, &mut out, &[n], &Sequential).unwrap();
                    for i in 0..n {
                        let w = f(x[i], if scalar_b { 0.75 } else { y[i] });
                        let g = out[i];
                        assert!(
                            (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                            "{isa:?} {op:?} {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn erf_gelu_chain_is_fused_and_dead_code_dropped() {
        let mut b = TileBuilder::new(1);
        let x = b.input(0);
        let w = b.binary(TileBinary::Div, x, b.scalar(std::f32::consts::SQRT_2));
        let e = b.unary(TileUnary::Erf, w);
        let p1 = b.binary(TileBinary::Add, b.scalar(1.0), e);
        let m = b.binary(TileBinary::Mul, x, p1);
        let _dead = b.unary(TileUnary::Exp, x);
        let y = b.binary(TileBinary::Mul, m, b.scalar(0.5));
        let p = b.finish(y).unwrap();
        assert!(p.is_gelu_erf(), "{p:?}");
        // The same chain with the intermediate also an output-side use is not fused.
        let mut b = TileBuilder::new(1);
        let x = b.input(0);
        let w = b.binary(
            TileBinary::Mul,
            x,
            b.scalar(std::f32::consts::FRAC_1_SQRT_2),
        );
        let e = b.unary(TileUnary::Erf, w);
        let p1 = b.binary(TileBinary::Add, e, b.scalar(1.0));
        let m = b.binary(TileBinary::Mul, p1, x);
        let y = b.binary(TileBinary::Mul, b.scalar(0.5), m);
        let z = b.binary(TileBinary::Add, y, e);
        let p = b.finish(z).unwrap();
        assert!(!p.is_gelu_erf());
        assert_eq!(p.len(), 6);
    }

    #[test]
    fn registers_are_reused_and_constants_broadcast() {
        // ((x + c) * (x - c)) + ((x * 2) - c) with c a [4] constant against [6, 4].
        let mut b = TileBuilder::new(1);
        let x = b.input(0);
        let c = b.constant(vec![1.0, 2.0, 3.0, 4.0], vec![4]).unwrap();
        let a1 = b.binary(TileBinary::Add, x, c);
        let a2 = b.binary(TileBinary::Sub, x, c);
        let m = b.binary(TileBinary::Mul, a1, a2);
        let d = b.binary(TileBinary::Mul, x, b.scalar(2.0));
        let e = b.binary(TileBinary::Sub, d, c);
        let y = b.binary(TileBinary::Add, m, e);
        let p = b.finish(y).unwrap();
        assert!(p.regs <= 3, "{}", p.regs);
        let x: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let mut out = vec![0.0; 24];
        run_f32(&p, &[(&x, &[6, 4])], &mut out, &[6, 4], &Sequential).unwrap();
        for i in 0..24 {
            let (v, c) = (x[i], (i % 4 + 1) as f32);
            assert_eq!(out[i], (v + c) * (v - c) + (v * 2.0 - c));
        }
    }

    #[test]
    fn bad_operands_are_errors() {
        let mut b = TileBuilder::new(2);
        let v = b.binary(TileBinary::Add, b.input(0), b.input(1));
        let p = b.finish(v).unwrap();
        let x = vec![0.0; 12];
        let mut out = vec![0.0; 12];
        let e = run_f32(&p, &[(&x, &[3, 4])], &mut out, &[3, 4], &Sequential).unwrap_err();
        assert!(e.to_string().contains("the program takes 2, got 1"), "{e}");
        let bad: [(&[f32], &[usize]); 2] = [(&x, &[3, 4]), (&x[..3], &[3])];
        let e = run_f32(&p, &bad, &mut out, &[3, 4], &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("tile input 1: dims [3] do not broadcast"),
            "{e}"
        );
        let bad: [(&[f32], &[usize]); 2] = [(&x, &[3, 4]), (&x[..3], &[4])];
        let e = run_f32(&p, &bad, &mut out, &[3, 4], &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("tile input 1: 3 elements for dims [4]"),
            "{e}"
        );
        let ok: [(&[f32], &[usize]); 2] = [(&x, &[3, 4]), (&x, &[3, 4])];
        let e = run_f32(&p, &ok, &mut out[..11], &[3, 4], &Sequential).unwrap_err();
        assert!(
            e.to_string()
                .contains("tile output: 11 elements for dims [3, 4]"),
            "{e}"
        );
        // An input the output does not use may have any shape.
        let mut b = TileBuilder::new(2);
        let v = b.unary(TileUnary::Neg, b.input(1));
        let q = b.finish(v).unwrap();
        let ins: [(&[f32], &[usize]); 2] = [(&x[..5], &[7, 7]), (&x, &[3, 4])];
        run_f32(&q, &ins, &mut out, &[3, 4], &Sequential).unwrap();
        assert_eq!(q.out_dims(&[&[7, 7], &[3, 4]]).unwrap(), vec![3, 4]);
        let b = TileBuilder::new(1);
        assert!(b.finish(TileVal(Src::Operand(3))).is_err());
        let mut other = TileBuilder::new(1);
        let v = other.unary(TileUnary::Exp, other.input(0));
        let v = other.unary(TileUnary::Exp, v);
        let mut b = TileBuilder::new(1);
        let w = b.unary(TileUnary::Neg, v);
        let e = b.finish(w).unwrap_err();
        assert!(e.to_string().contains("used before it is defined"), "{e}");
        assert!(TileBuilder::new(1).finish(v).is_err());
        assert_eq!(p.out_dims(&[&[3, 1], &[2, 1, 4]]).unwrap(), vec![2, 3, 4]);
        let e = p.out_dims(&[&[3, 2], &[4]]).unwrap_err();
        assert!(e
            .to_string()
            .contains("tile input 1: dims [4] do not broadcast with [3, 2]"));
    }
}
