//! ONNX `GRU` and `LSTM` on f32: forward, reverse and bidirectional, both layouts,
//! `linear_before_reset` either way (GRU), peepholes and `input_forget` (LSTM), `clip`, an
//! optional bias and initial state, sigmoid, tanh or relu gate functions; the recurrent
//! layers of speech models.
//!
//! An LSTM step is one phase (every unit's gates `i, o, f, c~` read only the old hidden
//! state and the unit's own cell state, which it updates in place) then the copy of the new
//! hidden state over the old. A full LSTM binds up to 11 buffers, past the 8 a dispatch
//! passes in push constants, so it reads its arguments through memory
//! ([`crate::matmul::push_block`]).
//!
//! A step needs the whole previous hidden state, so one workgroup runs one (direction,
//! batch row) pair through every time step: its invocations share the hidden units
//! (`j = lid, lid + 128, ...`), the state lives in workgroup memory, and barriers separate
//! the phases of a step: (A) the update and reset gates `z`, `r` of every unit, (B) the
//! candidate `h~` (reading every unit's `r`: `(r ⊙ h)·R_hᵀ`, or `r ⊙ (h·R_hᵀ + Rb_h)` with
//! `linear_before_reset`) and the new state `(1 - z) ⊙ h~ + z ⊙ h`, stored to `Y`, (C) the
//! new state copied over the old. The launch is [`Launch::Rows`] over the first result's
//! last dim (at least `directions × batch` rows: a workgroup past those does nothing, one
//! short of them loops over the rest). For the small recurrent layers of the corpus
//! (64–128 hidden units, tens of steps) this replaces two device round trips per layer;
//! it is not a fast kernel for wide layers, which would want the input projection of every
//! step as one matrix product first (as the CPU kernel does).
//!
//! Sums are f32 in index order, products and the bias added as the reference adds them
//! (`x·Wᵀ + Wb`, `h·Rᵀ + Rb`, then their sum); sigmoid and tanh are the matmul epilogue's
//! formulas ([`crate::epilogue_math`]), so results agree with the reference within the
//! rounding of a reordered sum. `sequence_lens` and the other ONNX gate functions stay on
//! the CPU, named.

use rafter_ir::rnn_activation::{self, Cell};
use rafter_ir::{DType, Graph, Op, RnnDirection};
use rafter_vulkan_section::Launch;
use rspirv::dr::Builder;
use rspirv::spirv::{BuiltIn, LoopControl, MemorySemantics, Scope, StorageClass, Word};

use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid;
use crate::matmul::{begin_main, build, builtin_v3, prelude, push_block, Prelude, R};
use crate::ROW_WORKGROUP_SIZE as WG;

/// The most hidden units a workgroup keeps (four `f32` arrays of that length in workgroup
/// memory: 16 KiB, Vulkan's guaranteed minimum).
pub const MAX_HIDDEN: u32 = 1024;

/// A generated GRU or LSTM kernel.
#[derive(Debug, Clone)]
pub struct GruKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then its outputs.
    pub spirv: Vec<u32>,
    /// [`Launch::Rows`] over the first result's last dim.
    pub launch: Launch,
}

/// A gate function.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
}

/// Which recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Gru { linear_before_reset: bool },
    Lstm { input_forget: bool },
}

/// The layer's shape and bindings.
struct Layout {
    kind: Kind,
    seq: u32,
    batch: u32,
    input: u32,
    hidden: u32,
    dirs: u32,
    reverse_only: bool,
    batch_first: bool,
    linear_before_reset: bool,
    clip: Option<f32>,
    /// f (the gates), g (the candidate) and, for the LSTM, h (the output's).
    acts: [Act; 3],
    x: usize,
    w: usize,
    r: usize,
    bias: Option<usize>,
    h0: Option<usize>,
    /// LSTM: the initial cell state and the peepholes.
    c0: Option<usize>,
    peep: Option<usize>,
    y: Option<usize>,
    y_h: Option<usize>,
    /// LSTM: the last cell state.
    y_c: Option<usize>,
    bindings: usize,
}

/// Generates a body that is one `gru` or `lstm` node of f32 body inputs.
pub fn gru(body: &Graph) -> Result<GruKernel, String> {
    let l = plan(body)?;
    let spirv = emit(&l)?;
    Ok(GruKernel {
        spirv,
        launch: Launch::Rows { lane_dims: 1 },
    })
}

fn plan(body: &Graph) -> R<Layout> {
    let node = body
        .nodes
        .first()
        .filter(|_| body.nodes.len() == 1)
        .ok_or("a recurrent kernel is one gru or lstm node")?;
    let (kind, direction, hidden_size, layout, clip, activations, alpha, beta) = match &node.op {
        Op::Gru {
            direction,
            hidden_size,
            layout,
            linear_before_reset,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => (
            Kind::Gru {
                linear_before_reset: *linear_before_reset,
            },
            direction,
            hidden_size,
            layout,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        ),
        Op::Lstm {
            direction,
            hidden_size,
            layout,
            input_forget,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => (
            Kind::Lstm {
                input_forget: *input_forget,
            },
            direction,
            hidden_size,
            layout,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        ),
        other => return Err(format!("op `{}` is not gru or lstm", other.name())),
    };
    let linear_before_reset = &matches!(
        kind,
        Kind::Gru {
            linear_before_reset: true
        }
    );
    let gates: u64 = match kind {
        Kind::Gru { .. } => 3,
        Kind::Lstm { .. } => 4,
    };
    let is_lstm = matches!(kind, Kind::Lstm { .. });
    let dirs: u32 = match direction {
        RnnDirection::Bidirectional => 2,
        _ => 1,
    };
    let input = |i: usize, what: &str| -> R<Option<usize>> {
        if node.input(i).is_none() {
            return Ok(None);
        }
        let b = grid::body_input(body, node, i, what)?;
        let ty = &body.value(body.inputs[b]).ty;
        if ty.dtype != DType::F32 {
            return Err(format!("{what} is {}; f32 is generated", ty.dtype));
        }
        Ok(Some(b))
    };
    let required = |i: usize, what: &str| input(i, what)?.ok_or_else(|| format!("no {what}"));
    let (x, w, r) = (required(0, "x")?, required(1, "w")?, required(2, "r")?);
    let bias = input(3, "the bias")?;
    if node.input(4).is_some() {
        return Err("sequence_lens: rows of one length are generated".into());
    }
    let h0 = input(5, "initial_h")?;
    let (c0, peep) = if is_lstm {
        (input(6, "initial_c")?, input(7, "the peepholes")?)
    } else {
        (None, None)
    };
    let dims = |b: usize, what: &str| grid::static_dims(&body.value(body.inputs[b]).ty, what);
    let xd = dims(x, "x")?;
    let batch_first = *layout != 0;
    let [a, bt, input_size] = xd[..] else {
        return Err(format!("x of rank {}", xd.len()));
    };
    let (seq, batch) = if batch_first { (bt, a) } else { (a, bt) };
    let rd = dims(r, "r")?;
    let hidden = *rd.get(2).ok_or("r of rank below 3")?;
    if *hidden_size > 0 && *hidden_size as u64 != hidden {
        return Err(format!("hidden_size {hidden_size} but r's {rd:?}"));
    }
    let want = |b: usize, what: &str, d: Vec<u64>| -> R<()> {
        let got = dims(b, what)?;
        if got != d {
            return Err(format!("{what} of dims {got:?}, not {d:?}"));
        }
        Ok(())
    };
    let d = u64::from(dirs);
    want(w, "w", vec![d, gates * hidden, input_size])?;
    want(r, "r", vec![d, gates * hidden, hidden])?;
    if let Some(b) = bias {
        want(b, "the bias", vec![d, 2 * gates * hidden])?;
    }
    if let Some(p) = peep {
        want(p, "the peepholes", vec![d, 3 * hidden])?;
    }
    let state_dims = if batch_first {
        vec![batch, d, hidden]
    } else {
        vec![d, batch, hidden]
    };
    if let Some(h) = h0 {
        want(h, "initial_h", state_dims.clone())?;
    }
    if let Some(c) = c0 {
        want(c, "initial_c", state_dims.clone())?;
    }
    if seq == 0 || batch == 0 || hidden == 0 || input_size == 0 {
        return Err("an empty sequence, batch, input or hidden state".into());
    }
    if hidden > u64::from(MAX_HIDDEN) {
        return Err(format!(
            "{hidden} hidden units: at most {MAX_HIDDEN} fit a workgroup's memory"
        ));
    }
    grid::product_u32(&xd, "x")?;
    grid::product_u32(&[seq, d, batch, hidden], "y")?;
    grid::product_u32(&[d, gates * hidden, input_size.max(hidden)], "w")?;
    let cell = match kind {
        Kind::Gru {
            linear_before_reset,
        } => Cell::Gru {
            linear_before_reset,
        },
        Kind::Lstm { input_forget } => Cell::Lstm { input_forget },
    };
    let resolved = rnn_activation::resolve(cell, dirs as usize, activations, alpha, beta)?;
    let act = |name: &str| match name {
        "Sigmoid" => Ok(Act::Sigmoid),
        "Tanh" => Ok(Act::Tanh),
        "Relu" => Ok(Act::Relu),
        other => Err(format!(
            "gate function {other}: sigmoid, tanh and relu are generated"
        )),
    };
    let per_dir = resolved
        .iter()
        .map(|a| match a.as_slice() {
            [f, g] if !is_lstm => Ok([act(f.name)?, act(g.name)?, Act::Tanh]),
            [f, g, h] if is_lstm => Ok([act(f.name)?, act(g.name)?, act(h.name)?]),
            _ => Err(format!("{} gate functions", a.len())),
        })
        .collect::<R<Vec<[Act; 3]>>>()?;
    let acts = *per_dir.first().ok_or("no directions")?;
    if per_dir.iter().any(|a| *a != acts) {
        return Err("different gate functions per direction".into());
    }
    let n_in = body.inputs.len();
    let bound = |i: usize| {
        let v = node.outputs.get(i).copied().flatten()?;
        body.outputs.iter().position(|&o| o == v).map(|p| n_in + p)
    };
    let (y, y_h) = (bound(0), bound(1));
    let y_c = if is_lstm { bound(2) } else { None };
    // The launch counts the first output's rows; every result has at least dirs × batch.
    if y.is_none() && y_h.is_none() && y_c.is_none() {
        return Err("no result is a body output".into());
    }
    let bindings = n_in + body.outputs.len();
    if bindings > grid::MAX_BINDINGS {
        return Err(format!(
            "{} with {bindings} buffers: a dispatch binds at most {}",
            node.op.name(),
            grid::MAX_BINDINGS
        ));
    }
    let u = |v: u64| v as u32;
    Ok(Layout {
        kind,
        seq: u(seq),
        batch: u(batch),
        input: u(input_size),
        hidden: u(hidden),
        dirs,
        reverse_only: *direction == RnnDirection::Reverse,
        batch_first,
        linear_before_reset: *linear_before_reset,
        clip: *clip,
        acts,
        x,
        w,
        r,
        bias,
        h0,
        c0,
        peep,
        y,
        y_h,
        y_c,
        bindings,
    })
}

/// The ids the emitter threads through its steps.
struct Cx {
    b: Builder,
    t: Prelude,
    addrs: Vec<Word>,
    lid: Word,
    /// Workgroup arrays: the state, the gates z and r, the new state.
    h: Word,
    z: Word,
    rg: Word,
    hn: Word,
    ptr_wg: Word,
}

/// One iteration of [`Cx::range`]: the emitter, the index, the carried values; returns
/// their next values.
type Step<'s> = dyn FnMut(&mut Cx, Word, &[Word]) -> R<Vec<Word>> + 's;

fn emit(l: &Layout) -> R<Vec<u32>> {
    let mut b = Builder::new();
    let t = prelude(&mut b);
    let nb = l.bindings as u32;
    let push = push_block(&mut b, &t, nb, 1);
    let lid_var = builtin_v3(&mut b, t.u32, BuiltIn::LocalInvocationId);
    let wg_var = builtin_v3(&mut b, t.u32, BuiltIn::WorkgroupId);
    let nwg_var = builtin_v3(&mut b, t.u32, BuiltIn::NumWorkgroups);
    let len = b.constant_bit32(t.u32, l.hidden);
    let arr = b.type_array(t.f32, len);
    let ptr_arr = b.type_pointer(None, StorageClass::Workgroup, arr);
    let mut shared = [0; 4];
    for s in &mut shared {
        *s = b.variable(ptr_arr, None, StorageClass::Workgroup, None);
    }
    let ptr_wg = b.type_pointer(None, StorageClass::Workgroup, t.f32);
    let mut interface = vec![push.var, lid_var, wg_var, nwg_var];
    interface.extend(shared);
    begin_main(&mut b, t.void, interface, [WG, 1, 1])?;
    build(b.begin_block(None))?;
    let addrs = (0..nb)
        .map(|i| push.member(&mut b, (t.u32, t.u64), i, true))
        .collect::<R<Vec<Word>>>()?;
    let v3 = b.type_vector(t.u32, 3);
    let first = |b: &mut Builder, var: Word| -> R<Word> {
        let v = build(b.load(v3, None, var, None, []))?;
        build(b.composite_extract(t.u32, None, v, [0]))
    };
    let lid = first(&mut b, lid_var)?;
    let wg = first(&mut b, wg_var)?;
    let nwg = first(&mut b, nwg_var)?;
    let mut cx = Cx {
        b,
        t,
        addrs,
        lid,
        h: shared[0],
        z: shared[1],
        rg: shared[2],
        hn: shared[3],
        ptr_wg,
    };
    // Each workgroup takes the (direction, batch row) pairs wg, wg + groups, ...: uniform
    // across the workgroup, so the barriers inside are reached by all its invocations.
    let pairs = cx.u(l.dirs * l.batch);
    cx.range((wg, pairs), Some(nwg), &[], &mut |cx, pair, _| {
        cx.pair(l, pair)?;
        Ok(Vec::new())
    })?;
    build(cx.b.ret())?;
    build(cx.b.end_function())?;
    Ok(rspirv::binary::Assemble::assemble(&cx.b.module()))
}

impl Cx {
    fn u(&mut self, v: u32) -> Word {
        self.b.constant_bit32(self.t.u32, v)
    }

    fn f(&mut self, v: f32) -> Word {
        self.b.constant_bit32(self.t.f32, v.to_bits())
    }

    fn barrier(&mut self) -> R<()> {
        let scope = self.u(Scope::Workgroup as u32);
        let semantics =
            (MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits();
        let semantics = self.u(semantics);
        build(self.b.control_barrier(scope, scope, semantics))
    }

    /// A loop `for v = from; v < to; v += step` (`step` a `u32` id, 1 when `None`)
    /// carrying the `f32` values `init` through `body`; returns their final values.
    fn range(
        &mut self,
        (from, to): (Word, Word),
        step: Option<Word>,
        init: &[Word],
        body: &mut Step<'_>,
    ) -> R<Vec<Word>> {
        let (u32, f32, bool) = (self.t.u32, self.t.f32, self.t.bool);
        let entry = self.b.id();
        build(self.b.branch(entry))?;
        build(self.b.begin_block(Some(entry)))?;
        let (header, cond, block, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let next = self.b.id();
        let nexts: Vec<Word> = init.iter().map(|_| self.b.id()).collect();
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(header)))?;
        let v = build(self.b.phi(u32, None, [(from, entry), (next, cont)]))?;
        let mut cur = Vec::with_capacity(init.len());
        for (&i, &n) in init.iter().zip(&nexts) {
            cur.push(build(self.b.phi(f32, None, [(i, entry), (n, cont)]))?);
        }
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;
        build(self.b.begin_block(Some(cond)))?;
        let more = build(self.b.u_less_than(bool, None, v, to))?;
        build(self.b.branch_conditional(more, block, merge, []))?;
        build(self.b.begin_block(Some(block)))?;
        let updated = body(self, v, &cur)?;
        build(self.b.branch(cont))?;
        build(self.b.begin_block(Some(cont)))?;
        for (&u, &n) in updated.iter().zip(&nexts) {
            build(self.b.copy_object(f32, Some(n), u))?;
        }
        let step = match step {
            Some(s) => s,
            None => self.u(1),
        };
        build(self.b.i_add(u32, Some(next), v, step))?;
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(merge)))?;
        Ok(cur)
    }

    /// `body(j)` for this invocation's hidden units `j = lid, lid + WG, ... < hidden`.
    fn units(&mut self, hidden: u32, body: &mut dyn FnMut(&mut Cx, Word) -> R<()>) -> R<()> {
        let (lid, to, wg) = (self.lid, self.u(hidden), self.u(WG));
        self.range((lid, to), Some(wg), &[], &mut |cx, j, _| {
            body(cx, j)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The address of `f32` element `k` (a `u32`) of binding `binding`.
    fn addr(&mut self, binding: usize, k: Word) -> R<Word> {
        let u64 = self.t.u64;
        let k64 = build(self.b.u_convert(u64, None, k))?;
        grid::element_addr(&mut self.b, u64, self.addrs[binding], k64, 4)
    }

    fn load(&mut self, binding: usize, k: Word) -> R<Word> {
        let at = self.addr(binding, k)?;
        elem::load(&mut self.b, Elem::F32, self.t.f32, at)
    }

    fn store(&mut self, binding: usize, k: Word, v: Word) -> R<()> {
        let at = self.addr(binding, k)?;
        elem::store(&mut self.b, Elem::F32, self.t.f32, at, v)
    }

    fn shared(&mut self, arr: Word, j: Word) -> R<Word> {
        let ptr = self.ptr_wg;
        build(self.b.access_chain(ptr, None, arr, [j]))
    }

    fn load_shared(&mut self, arr: Word, j: Word) -> R<Word> {
        let p = self.shared(arr, j)?;
        build(self.b.load(self.t.f32, None, p, None, []))
    }

    fn store_shared(&mut self, arr: Word, j: Word, v: Word) -> R<()> {
        let p = self.shared(arr, j)?;
        build(self.b.store(p, v, None, []))
    }

    fn add(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_add(self.t.f32, None, a, b))
    }

    fn mul(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_mul(self.t.f32, None, a, b))
    }

    /// `a * b` for `u32`s.
    fn imul(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.i_mul(self.t.u32, None, a, b))
    }

    fn iadd(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.i_add(self.t.u32, None, a, b))
    }

    /// `Σ_{k < len} a(k) * M[row + k]` in index order, `a(k)` emitted by `a`, `M` binding
    /// `m`.
    fn dot(
        &mut self,
        len: u32,
        m: usize,
        row: Word,
        a: &mut dyn FnMut(&mut Cx, Word) -> R<Word>,
    ) -> R<Word> {
        let (zero, to, init) = (self.u(0), self.u(len), self.f(0.0));
        let s = self.range((zero, to), None, &[init], &mut |cx, k, acc| {
            let av = a(cx, k)?;
            let at = cx.iadd(row, k)?;
            let mv = cx.load(m, at)?;
            let p = cx.mul(av, mv)?;
            Ok(vec![cx.add(acc[0], p)?])
        })?;
        Ok(s[0])
    }

    /// `act(clip(v))`.
    fn activate(&mut self, l: &Layout, act: Act, v: Word) -> R<Word> {
        self.activate_clipped(l.clip, act, v)
    }

    /// `act(clip(v))`, `clip` when `Some`.
    fn activate_clipped(&mut self, clip: Option<f32>, act: Act, v: Word) -> R<Word> {
        let (f32, bool) = (self.t.f32, self.t.bool);
        let v = match clip {
            None => v,
            Some(c) => {
                let (lo, hi) = (self.f(-c), self.f(c));
                let below = build(self.b.f_ord_less_than(bool, None, v, lo))?;
                let v = build(self.b.select(f32, None, below, lo, v))?;
                let above = build(self.b.f_ord_greater_than(bool, None, v, hi))?;
                build(self.b.select(f32, None, above, hi, v))?
            }
        };
        let mut m = Math {
            b: &mut self.b,
            f32,
            bool,
            glsl: self.t.glsl,
        };
        match act {
            Act::Sigmoid => m.sigmoid(v),
            Act::Tanh => m.tanh(v),
            Act::Relu => {
                let zero = self.f(0.0);
                let neg = build(self.b.f_ord_less_than(bool, None, v, zero))?;
                build(self.b.select(f32, None, neg, zero, v))
            }
        }
    }

    /// The state index `(d, bi, j)` of `initial_h` and `Y_h`.
    fn state_index(&mut self, l: &Layout, d: Word, bi: Word, j: Word) -> R<Word> {
        let hidden = self.u(l.hidden);
        let outer = if l.batch_first {
            let dirs = self.u(l.dirs);
            let o = self.imul(bi, dirs)?;
            self.iadd(o, d)?
        } else {
            let batch = self.u(l.batch);
            let o = self.imul(d, batch)?;
            self.iadd(o, bi)?
        };
        let o = self.imul(outer, hidden)?;
        self.iadd(o, j)
    }

    /// One (direction, batch row) pair through every step.
    fn pair(&mut self, l: &Layout, pair: Word) -> R<()> {
        let (u32, bool) = (self.t.u32, self.t.bool);
        let (d, bi) = grid::div_mod(&mut self.b, u32, pair, l.batch)?;
        let hidden = l.hidden;
        self.units(hidden, &mut |cx, j| {
            let v = match l.h0 {
                Some(h0) => {
                    let at = cx.state_index(l, d, bi, j)?;
                    cx.load(h0, at)?
                }
                None => cx.f(0.0),
            };
            let h = cx.h;
            cx.store_shared(h, j, v)?;
            if matches!(l.kind, Kind::Lstm { .. }) {
                let c = match l.c0 {
                    Some(c0) => {
                        let at = cx.state_index(l, d, bi, j)?;
                        cx.load(c0, at)?
                    }
                    None => cx.f(0.0),
                };
                let cs = cx.z;
                cx.store_shared(cs, j, c)?;
            }
            Ok(())
        })?;
        self.barrier()?;
        // The second direction of a bidirectional layer, or a reverse one, runs backwards.
        let reverse = if l.reverse_only {
            self.b.constant_true(bool)
        } else {
            let zero = self.u(0);
            build(self.b.i_not_equal(bool, None, d, zero))?
        };
        let (zero, seq) = (self.u(0), self.u(l.seq));
        self.range((zero, seq), None, &[], &mut |cx, step, _| {
            let last = cx.u(l.seq - 1);
            let back = build(cx.b.i_sub(u32, None, last, step))?;
            let time = build(cx.b.select(u32, None, reverse, back, step))?;
            match l.kind {
                Kind::Gru { .. } => cx.step(l, (d, bi, time))?,
                Kind::Lstm { input_forget } => cx.lstm_step(l, input_forget, (d, bi, time))?,
            }
            Ok(Vec::new())
        })?;
        if let Some(y_h) = l.y_h {
            self.units(hidden, &mut |cx, j| {
                let h = cx.h;
                let v = cx.load_shared(h, j)?;
                let at = cx.state_index(l, d, bi, j)?;
                cx.store(y_h, at, v)
            })?;
        }
        if let Some(y_c) = l.y_c {
            self.units(hidden, &mut |cx, j| {
                let c = cx.z;
                let v = cx.load_shared(c, j)?;
                let at = cx.state_index(l, d, bi, j)?;
                cx.store(y_c, at, v)
            })?;
        }
        // The next pair overwrites the state.
        self.barrier()
    }

    /// One time step of pair `(d, bi)` at time `time`.
    fn step(&mut self, l: &Layout, (d, bi, time): (Word, Word, Word)) -> R<()> {
        let (hs, gh) = (l.hidden, 3 * l.hidden);
        // x's row for (time, bi).
        let (t_outer, t_inner, inner_len) = if l.batch_first {
            (bi, time, l.seq)
        } else {
            (time, bi, l.batch)
        };
        let inner_len = self.u(inner_len);
        let x_row = self.imul(t_outer, inner_len)?;
        let x_row = self.iadd(x_row, t_inner)?;
        let input = self.u(l.input);
        let x_row = self.imul(x_row, input)?;
        // The direction's first rows of W, R and the bias.
        let dgh = {
            let g = self.u(gh);
            self.imul(d, g)?
        };
        let bias_at = |cx: &mut Cx, gate: u32, recurrent: bool, j: Word| -> R<Word> {
            let Some(b) = l.bias else {
                return Ok(cx.f(0.0));
            };
            let six = cx.u(2 * gh);
            let base = cx.imul(d, six)?;
            let off = cx.u(gate * hs + if recurrent { gh } else { 0 });
            let at = cx.iadd(base, off)?;
            let at = cx.iadd(at, j)?;
            cx.load(b, at)
        };
        // `x·W[gate]ᵀ + Wb` for unit j.
        let xw = |cx: &mut Cx, gate: u32, j: Word| -> R<Word> {
            let row = cx.u(gate * hs);
            let row = cx.iadd(dgh, row)?;
            let row = cx.iadd(row, j)?;
            let input = cx.u(l.input);
            let row = cx.imul(row, input)?;
            let s = cx.dot(l.input, l.w, row, &mut |cx, k| {
                let at = cx.iadd(x_row, k)?;
                cx.load(l.x, at)
            })?;
            let b = bias_at(cx, gate, false, j)?;
            cx.add(s, b)
        };
        // `a·R[gate]ᵀ + Rb` for unit j, `a(k)` emitted by `a`.
        let hr = |cx: &mut Cx, gate: u32, j: Word, a: &mut dyn FnMut(&mut Cx, Word) -> R<Word>| {
            let row = cx.u(gate * hs);
            let row = cx.iadd(dgh, row)?;
            let row = cx.iadd(row, j)?;
            let hidden = cx.u(hs);
            let row = cx.imul(row, hidden)?;
            let s = cx.dot(hs, l.r, row, a)?;
            let b = bias_at(cx, gate, true, j)?;
            cx.add(s, b)
        };
        let [f, g, _] = l.acts;
        // (A) the update and reset gates.
        self.units(hs, &mut |cx, j| {
            for (gate, arr) in [(0, cx.z), (1, cx.rg)] {
                let a = xw(cx, gate, j)?;
                let h = cx.h;
                let b = hr(cx, gate, j, &mut |cx, k| cx.load_shared(h, k))?;
                let v = cx.add(a, b)?;
                let v = cx.activate(l, f, v)?;
                cx.store_shared(arr, j, v)?;
            }
            Ok(())
        })?;
        self.barrier()?;
        // (B) the candidate and the new state.
        self.units(hs, &mut |cx, j| {
            let a = xw(cx, 2, j)?;
            let (h, rg) = (cx.h, cx.rg);
            let pre = if l.linear_before_reset {
                let rj = cx.load_shared(rg, j)?;
                let s = hr(cx, 2, j, &mut |cx, k| cx.load_shared(h, k))?;
                let s = cx.mul(rj, s)?;
                cx.add(a, s)?
            } else {
                let s = hr(cx, 2, j, &mut |cx, k| {
                    let rk = cx.load_shared(rg, k)?;
                    let hk = cx.load_shared(h, k)?;
                    cx.mul(rk, hk)
                })?;
                cx.add(a, s)?
            };
            let cand = cx.activate(l, g, pre)?;
            let z = cx.z;
            let zj = cx.load_shared(z, j)?;
            let hj = cx.load_shared(h, j)?;
            let one = cx.f(1.0);
            let keep = build(cx.b.f_sub(cx.t.f32, None, one, zj))?;
            let a = cx.mul(keep, cand)?;
            let b = cx.mul(zj, hj)?;
            let v = cx.add(a, b)?;
            let hn = cx.hn;
            cx.store_shared(hn, j, v)?;
            if let Some(y) = l.y {
                // Y[time, d, bi, j] (layout 0) or Y[bi, time, d, j] (layout 1).
                let dirs = cx.u(l.dirs);
                let at = if l.batch_first {
                    let seq = cx.u(l.seq);
                    let o = cx.imul(bi, seq)?;
                    let o = cx.iadd(o, time)?;
                    let o = cx.imul(o, dirs)?;
                    cx.iadd(o, d)?
                } else {
                    let batch = cx.u(l.batch);
                    let o = cx.imul(time, dirs)?;
                    let o = cx.iadd(o, d)?;
                    let o = cx.imul(o, batch)?;
                    cx.iadd(o, bi)?
                };
                let hidden = cx.u(hs);
                let at = cx.imul(at, hidden)?;
                let at = cx.iadd(at, j)?;
                cx.store(y, at, v)?;
            }
            Ok(())
        })?;
        self.barrier()?;
        // (C) the new state over the old.
        self.units(hs, &mut |cx, j| {
            let hn = cx.hn;
            let v = cx.load_shared(hn, j)?;
            let h = cx.h;
            cx.store_shared(h, j, v)
        })?;
        self.barrier()
    }

    /// The index of `Y[time, d, bi, j]` (layout 0) or `Y[bi, time, d, j]` (layout 1).
    fn y_index(&mut self, l: &Layout, (d, bi, time): (Word, Word, Word), j: Word) -> R<Word> {
        let dirs = self.u(l.dirs);
        let at = if l.batch_first {
            let seq = self.u(l.seq);
            let o = self.imul(bi, seq)?;
            let o = self.iadd(o, time)?;
            let o = self.imul(o, dirs)?;
            self.iadd(o, d)?
        } else {
            let batch = self.u(l.batch);
            let o = self.imul(time, dirs)?;
            let o = self.iadd(o, d)?;
            let o = self.imul(o, batch)?;
            self.iadd(o, bi)?
        };
        let hidden = self.u(l.hidden);
        let at = self.imul(at, hidden)?;
        self.iadd(at, j)
    }

    /// One LSTM time step of pair `(d, bi)` at time `time`, as the reference computes it:
    /// `pre = (x·Wᵀ + Wb) + (h·Rᵀ + Rb)` per gate (`i, o, f, c`), then
    /// `i = f(pre_i + P_i ⊙ c)`, `f = f(pre_f + P_f ⊙ c)` (`1 - i` with `input_forget`),
    /// `c' = f ⊙ c + i ⊙ g(pre_c)`, `o = f(pre_o + P_o ⊙ c')`, `h' = o ⊙ h(c')`, `clip`
    /// before `f` and `g` only. The cell state (workgroup array `z`) is per unit, so each
    /// unit updates its own in place; the new hidden state goes to `hn`, then over `h`.
    fn lstm_step(
        &mut self,
        l: &Layout,
        input_forget: bool,
        (d, bi, time): (Word, Word, Word),
    ) -> R<()> {
        let (hs, gh) = (l.hidden, 4 * l.hidden);
        let (t_outer, t_inner, inner_len) = if l.batch_first {
            (bi, time, l.seq)
        } else {
            (time, bi, l.batch)
        };
        let inner_len = self.u(inner_len);
        let x_row = self.imul(t_outer, inner_len)?;
        let x_row = self.iadd(x_row, t_inner)?;
        let input = self.u(l.input);
        let x_row = self.imul(x_row, input)?;
        let dgh = {
            let g = self.u(gh);
            self.imul(d, g)?
        };
        // `(x·W[gate]ᵀ + Wb) + (h·R[gate]ᵀ + Rb)` for unit j.
        let pre = |cx: &mut Cx, gate: u32, j: Word| -> R<Word> {
            let row = cx.u(gate * hs);
            let row = cx.iadd(dgh, row)?;
            let row = cx.iadd(row, j)?;
            let (input, hidden) = (cx.u(l.input), cx.u(hs));
            let w_row = cx.imul(row, input)?;
            let xw = cx.dot(l.input, l.w, w_row, &mut |cx, k| {
                let at = cx.iadd(x_row, k)?;
                cx.load(l.x, at)
            })?;
            let r_row = cx.imul(row, hidden)?;
            let h = cx.h;
            let hr = cx.dot(hs, l.r, r_row, &mut |cx, k| cx.load_shared(h, k))?;
            let (xw, hr) = match l.bias {
                None => (xw, hr),
                Some(b) => {
                    let two = cx.u(2 * gh);
                    let base = cx.imul(d, two)?;
                    let off = cx.u(gate * hs);
                    let at = cx.iadd(base, off)?;
                    let at = cx.iadd(at, j)?;
                    let wb = cx.load(b, at)?;
                    let roff = cx.u(gh);
                    let at = cx.iadd(at, roff)?;
                    let rb = cx.load(b, at)?;
                    (cx.add(xw, wb)?, cx.add(hr, rb)?)
                }
            };
            cx.add(xw, hr)
        };
        // `v + P[which] ⊙ c` (`which`: 0 input, 1 output, 2 forget), or `v` without peepholes.
        let peep = |cx: &mut Cx, which: u32, j: Word, c: Word, v: Word| -> R<Word> {
            let Some(p) = l.peep else {
                return Ok(v);
            };
            let three = cx.u(3 * hs);
            let base = cx.imul(d, three)?;
            let off = cx.u(which * hs);
            let at = cx.iadd(base, off)?;
            let at = cx.iadd(at, j)?;
            let pv = cx.load(p, at)?;
            let m = cx.mul(pv, c)?;
            cx.add(v, m)
        };
        let [f, g, h_act] = l.acts;
        self.units(hs, &mut |cx, j| {
            let cs = cx.z;
            let cp = cx.load_shared(cs, j)?;
            let pi = pre(cx, 0, j)?;
            let pi = peep(cx, 0, j, cp, pi)?;
            let i = cx.activate(l, f, pi)?;
            let fg = if input_forget {
                let one = cx.f(1.0);
                build(cx.b.f_sub(cx.t.f32, None, one, i))?
            } else {
                let pf = pre(cx, 2, j)?;
                let pf = peep(cx, 2, j, cp, pf)?;
                cx.activate(l, f, pf)?
            };
            let pc = pre(cx, 3, j)?;
            let ct = cx.activate(l, g, pc)?;
            let a = cx.mul(fg, cp)?;
            let b = cx.mul(i, ct)?;
            let cc = cx.add(a, b)?;
            let po = pre(cx, 1, j)?;
            let po = peep(cx, 1, j, cc, po)?;
            let o = cx.activate(l, f, po)?;
            let hc = cx.activate_clipped(None, h_act, cc)?;
            let hv = cx.mul(o, hc)?;
            cx.store_shared(cs, j, cc)?;
            let hn = cx.hn;
            cx.store_shared(hn, j, hv)?;
            if let Some(y) = l.y {
                let at = cx.y_index(l, (d, bi, time), j)?;
                cx.store(y, at, hv)?;
            }
            Ok(())
        })?;
        self.barrier()?;
        self.units(hs, &mut |cx, j| {
            let hn = cx.hn;
            let v = cx.load_shared(hn, j)?;
            let h = cx.h;
            cx.store_shared(h, j, v)
        })?;
        self.barrier()
    }
}
