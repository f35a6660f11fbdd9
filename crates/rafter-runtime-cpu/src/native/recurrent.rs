//! Recurrent layers (LSTM, GRU, RNN) with ONNX semantics, natively: a body of one
//! `lstm`/`gru`/`rnn` node on f32 operands.
//!
//! The work splits as ONNX Runtime's and every fast RNN kernel splits it:
//! - the input projection of every time step at once, `X·Wᵀ + bias`, one GEMM per
//!   direction on weights packed once per session (`rafter-kernels-cpu`'s [`PackedB`]);
//! - per step and batch row, the recurrent product `h·Rᵀ` as a GEMV over `Rᵀ` transposed
//!   once per session ([`gemv_accumulate`]), added to the step's projection;
//! - the gates, vectorised for sigmoid and tanh ([`gate_activation`]), any other ONNX
//!   activation (with its alpha/beta) element by element.
//!
//! Semantics follow the reference executor (`rafter-reference`'s recurrent ops): `clip` on
//! every activation's input, `input_forget`, peepholes (`i, o, f`), both layouts, reverse
//! and bidirectional directions, `sequence_lens` (a row's outputs past its length are zero
//! and its final state is the one after its last step). GRU's `linear_before_reset` picks
//! where the reset gate applies. Anything else (non-f32 operands, unknown shapes) falls back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rafter_ir::rnn_activation::{self, Cell};
use rafter_ir::{DType, Graph, Op, RnnDirection, ValueDef};
use rafter_kernels_cpu::{
    gate_activation, gemv_accumulate, sgemm, Epilogue, GateFn, MatMut, MatRef, PackedB,
};

use super::{In, NativeKernel, Out, Par};

/// One activation: vectorised for sigmoid and tanh, else ONNX's formula per element.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Gate(GateFn),
    Other {
        name: &'static str,
        alpha: f32,
        beta: f32,
    },
}

impl Act {
    /// `x = act(clip(x))` in place.
    fn apply(self, clip: Option<f32>, x: &mut [f32]) {
        if let Some(c) = clip {
            x.iter_mut().for_each(|v| *v = v.max(-c).min(c));
        }
        match self {
            Act::Gate(f) => gate_activation(f, x),
            Act::Other { name, alpha, beta } => x
                .iter_mut()
                .for_each(|v| *v = scalar_act(name, alpha, beta, *v)),
        }
    }
}

/// ONNX's recurrent activations other than sigmoid and tanh (names as in
/// `rafter_ir::rnn_activation::NAMES`; unknown names never reach here, see [`resolve`]).
fn scalar_act(name: &str, a: f32, b: f32, x: f32) -> f32 {
    match name {
        "Relu" => x.max(0.0),
        "Affine" => a * x + b,
        "LeakyRelu" if x < 0.0 => a * x,
        "ThresholdedRelu" if x <= a => 0.0,
        "ScaledTanh" => a * (b * x).tanh(),
        "HardSigmoid" => (a * x + b).clamp(0.0, 1.0),
        "Elu" if x < 0.0 => a * (x.exp() - 1.0),
        "Softsign" => x / (1.0 + x.abs()),
        "Softplus" => (1.0 + x.exp()).ln(),
        _ => x,
    }
}

/// The activations of each direction ([`rnn_activation::resolve`], shared with the
/// reference executor); `None` for an index or count the op cannot have (the reference path
/// then reports it).
fn resolve(
    cell: Cell,
    dirs: usize,
    acts: &[i64],
    alpha: &[f32],
    beta: &[f32],
) -> Option<Vec<Vec<Act>>> {
    let resolved = rnn_activation::resolve(cell, dirs, acts, alpha, beta).ok()?;
    Some(
        resolved
            .into_iter()
            .map(|dir| {
                dir.into_iter()
                    .map(|a| match a.name {
                        "Sigmoid" => Act::Gate(GateFn::Sigmoid),
                        "Tanh" => Act::Gate(GateFn::Tanh),
                        name => Act::Other {
                            name,
                            alpha: a.alpha,
                            beta: a.beta,
                        },
                    })
                    .collect()
            })
            .collect(),
    )
}

/// One direction's weights, prepared once: `Wᵀ` packed for the GEMM, `Rᵀ` row-major
/// `[hidden, gates * hidden]` for the GEMV (GRU: the z/r columns and the h columns apart,
/// since the h part multiplies a different vector when `linear_before_reset` is 0).
struct DirWeights {
    w: PackedB,
    r: Vec<f32>,
    r_h: Vec<f32>,
}

/// `[rows, cols]` row-major rows `rows.start..rows.end` of `m`, transposed.
fn transpose_rows(m: &[f32], cols: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
    let n = rows.len();
    let mut t = vec![0.0; cols * n];
    for (j, row) in rows.enumerate() {
        for k in 0..cols {
            t[k * n + j] = m[row * cols + k];
        }
    }
    t
}

/// Every direction's prepared weights, shared by the calls that use them.
type Prepared = Arc<Vec<DirWeights>>;

struct RecurrentKernel {
    cell: Cell,
    direction: RnnDirection,
    batch_first: bool,
    clip: Option<f32>,
    acts: Vec<Vec<Act>>,
    /// Body input index of each node operand (x, w, r, b, sequence_lens, initial_h,
    /// initial_c, p); `None` when absent.
    ins: [Option<usize>; 8],
    /// Body output index of each node result (y, y_h, y_c).
    outs: [Option<usize>; 3],
    /// Prepared weights per (w, r) program weight pair: the same bytes on every call.
    cache: Mutex<HashMap<(usize, usize), Prepared>>,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let (cell, direction, hidden, layout, clip, acts, alpha, beta) = match &node.op {
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
            Cell::Lstm {
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
            Cell::Gru {
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
        Op::Rnn {
            direction,
            hidden_size,
            layout,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        } => (
            Cell::Rnn,
            direction,
            hidden_size,
            layout,
            clip,
            activations,
            activation_alpha,
            activation_beta,
        ),
        _ => return None,
    };
    let _ = hidden; // checked against R's shape per call
    let dirs = if *direction == RnnDirection::Bidirectional {
        2
    } else {
        1
    };
    let acts = resolve(cell, dirs, acts, alpha, beta)?;
    let mut ins = [None; 8];
    for (i, v) in node.inputs.iter().enumerate().take(8) {
        let Some(v) = *v else { continue };
        let value = body.value(v);
        let want = if i == 4 { DType::I32 } else { DType::F32 };
        match value.def {
            ValueDef::Input(k) if value.ty.dtype == want => ins[i] = Some(k),
            _ => return None,
        }
    }
    if node.inputs.len() > 8 || ins[0].is_none() || ins[1].is_none() || ins[2].is_none() {
        return None;
    }
    let mut outs = [None; 3];
    for (j, v) in node.outputs.iter().enumerate().take(3) {
        if let Some(v) = *v {
            outs[j] = body.outputs.iter().position(|&o| o == v);
        }
    }
    Some(Arc::new(RecurrentKernel {
        cell,
        direction: *direction,
        batch_first: *layout != 0,
        clip: *clip,
        acts,
        ins,
        outs,
        cache: Mutex::new(HashMap::new()),
        par: par.clone(),
    }))
}

/// The sizes of one call.
#[derive(Clone, Copy)]
struct Dims {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dirs: usize,
}

impl Dims {
    /// Row of `[seq, batch]` (layout 0) or `[batch, seq]` (layout 1) data for (t, b).
    fn row(&self, batch_first: bool, t: usize, b: usize) -> usize {
        if batch_first {
            b * self.seq + t
        } else {
            t * self.batch + b
        }
    }

    /// Offset of Y's (t, d, b) row: `[seq, dirs, batch, H]` or `[batch, seq, dirs, H]`.
    fn y_at(&self, batch_first: bool, t: usize, d: usize, b: usize) -> usize {
        let r = if batch_first {
            (b * self.seq + t) * self.dirs + d
        } else {
            (t * self.dirs + d) * self.batch + b
        };
        r * self.hidden
    }

    /// Offset of a state's (d, b) row: `[dirs, batch, H]` or `[batch, dirs, H]`.
    fn state_at(&self, batch_first: bool, d: usize, b: usize) -> usize {
        let r = if batch_first {
            b * self.dirs + d
        } else {
            d * self.batch + b
        };
        r * self.hidden
    }
}

impl RecurrentKernel {
    fn operand<'a>(&self, ins: &'a [In<'a>], i: usize) -> Option<&'a In<'a>> {
        self.ins[i].map(|k| &ins[k])
    }

    /// The call's sizes, or `None` when the operands do not fit an ONNX recurrent op.
    fn dims(&self, ins: &[In<'_>]) -> Option<Dims> {
        let x = self.operand(ins, 0)?;
        let r = self.operand(ins, 2)?;
        let w = self.operand(ins, 1)?;
        let (&[a, b, input], &[dirs, gh, hidden]) = (x.dims.as_slice(), r.dims.as_slice()) else {
            return None;
        };
        let (seq, batch) = if self.batch_first { (b, a) } else { (a, b) };
        let want_dirs = if self.direction == RnnDirection::Bidirectional {
            2
        } else {
            1
        };
        let g = self.cell.gates();
        if dirs != want_dirs || gh != g * hidden || w.dims != [dirs, g * hidden, input] {
            return None;
        }
        Some(Dims {
            seq,
            batch,
            input,
            hidden,
            dirs,
        })
    }

    /// Each direction's prepared weights: from the cache when W and R are program weights.
    fn weights(&self, w: &In<'_>, r: &In<'_>, d: Dims) -> Result<Prepared, String> {
        let key = w.weight.zip(r.weight);
        if let Some(k) = key {
            if let Some(p) = self.cache.lock().map_err(|e| e.to_string())?.get(&k) {
                return Ok(p.clone());
            }
        }
        let (ws, rs) = (w.f32s()?, r.f32s()?);
        let (h, gh) = (d.hidden, self.cell.gates() * d.hidden);
        let split = match self.cell {
            Cell::Gru { .. } => 2 * h,
            _ => gh,
        };
        let prepared: Vec<DirWeights> = (0..d.dirs)
            .map(|dir| {
                let wd = &ws[dir * gh * d.input..(dir + 1) * gh * d.input];
                let rd = &rs[dir * gh * h..(dir + 1) * gh * h];
                let wt = MatRef::row_major(wd, gh, d.input, d.input)
                    .map_err(|e| format!("W: {e}"))?
                    .t();
                Ok(DirWeights {
                    w: PackedB::pack_mat(wt),
                    r: transpose_rows(rd, h, 0..split),
                    r_h: transpose_rows(rd, h, split..gh),
                })
            })
            .collect::<Result<_, String>>()?;
        let prepared = Arc::new(prepared);
        if let Some(k) = key {
            self.cache
                .lock()
                .map_err(|e| e.to_string())?
                .insert(k, prepared.clone());
        }
        Ok(prepared)
    }

    /// Per batch row, the number of steps it runs (`sequence_lens`, else `seq`).
    fn lengths(&self, ins: &[In<'_>], d: Dims) -> Result<Vec<usize>, String> {
        let Some(l) = self.operand(ins, 4) else {
            return Ok(vec![d.seq; d.batch]);
        };
        if l.dims != [d.batch] {
            return Err(format!(
                "sequence_lens has dims {:?}, want [{}]",
                l.dims, d.batch
            ));
        }
        l.bytes()
            .chunks_exact(4)
            .map(|c| {
                let n = i32::from_le_bytes(c.try_into().expect("4 bytes"));
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= d.seq)
                    .ok_or_else(|| format!("sequence length {n} outside 0..={}", d.seq))
            })
            .collect()
    }

    /// An optional `[dirs, batch, H]`-shaped (layout-ordered) operand, checked.
    fn state<'a>(&self, ins: &'a [In<'a>], i: usize, d: Dims) -> Result<Option<&'a [f32]>, String> {
        let Some(t) = self.operand(ins, i) else {
            return Ok(None);
        };
        let want = if self.batch_first {
            [d.batch, d.dirs, d.hidden]
        } else {
            [d.dirs, d.batch, d.hidden]
        };
        if t.dims != want {
            return Err(format!(
                "state operand {i} has dims {:?}, want {want:?}",
                t.dims
            ));
        }
        t.f32s().map(Some)
    }
}

/// Mutable views of the results the body wants (y, y_h, y_c), zeroed.
struct Results<'o> {
    y: Option<&'o mut [f32]>,
    yh: Option<&'o mut [f32]>,
    yc: Option<&'o mut [f32]>,
}

impl NativeKernel for RecurrentKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let Some(d) = self.dims(ins) else {
            return Ok(false);
        };
        let (w, r) = (
            self.operand(ins, 1).expect("W is required"),
            self.operand(ins, 2).expect("R is required"),
        );
        let x = self.operand(ins, 0).expect("X is required").f32s()?;
        let (h, g) = (d.hidden, self.cell.gates());
        let gh = g * h;
        let bias = match self.operand(ins, 3) {
            Some(b) if b.dims != [d.dirs, 2 * gh] => {
                return Err(format!(
                    "B has dims {:?}, want [{}, {}]",
                    b.dims,
                    d.dirs,
                    2 * gh
                ))
            }
            Some(b) => Some(b.f32s()?),
            None => None,
        };
        let peep = match self
            .operand(ins, 7)
            .filter(|_| matches!(self.cell, Cell::Lstm { .. }))
        {
            Some(p) if p.dims != [d.dirs, 3 * h] => {
                return Err(format!(
                    "P has dims {:?}, want [{}, {}]",
                    p.dims,
                    d.dirs,
                    3 * h
                ))
            }
            Some(p) => Some(p.f32s()?),
            None => None,
        };
        let lens = self.lengths(ins, d)?;
        let h0 = self.state(ins, 5, d)?;
        let c0 = match self.cell {
            Cell::Lstm { .. } => self.state(ins, 6, d)?,
            _ => None,
        };
        let weights = self.weights(w, r, d)?;

        // Results: split `outs` into the wanted views.
        let mut views: [Option<&mut [f32]>; 3] = [None, None, None];
        {
            let mut taken: Vec<Option<&mut Out<'_>>> = outs.iter_mut().map(Some).collect();
            for (j, o) in self.outs.iter().enumerate() {
                if let Some(k) = *o {
                    if let Some(out) = taken[k].take() {
                        views[j] = Some(out.f32s()?);
                    }
                }
            }
        }
        let [y, yh, yc] = views;
        let mut res = Results { y, yh, yc };
        let n_y = d.seq * d.dirs * d.batch * h;
        let n_s = d.dirs * d.batch * h;
        for (v, n) in [(&mut res.y, n_y), (&mut res.yh, n_s), (&mut res.yc, n_s)] {
            if let Some(v) = v.as_deref_mut() {
                if v.len() != n {
                    return Ok(false);
                }
                v.fill(0.0);
            }
        }

        let rows = d.seq * d.batch;
        let mut xw = vec![0.0f32; rows * gh];
        for dir in 0..d.dirs {
            let dw = &weights[dir];
            // Projection bias: Wb + Rb, except GRU's h columns (Rb_h goes with h·R_hᵀ).
            let mut pb = vec![0.0f32; gh];
            let mut rb_h = vec![0.0f32; h];
            if let Some(b) = bias {
                let bd = &b[dir * 2 * gh..(dir + 1) * 2 * gh];
                let rec_cols = match self.cell {
                    Cell::Gru { .. } => 2 * h,
                    _ => gh,
                };
                for j in 0..gh {
                    pb[j] = bd[j] + if j < rec_cols { bd[gh + j] } else { 0.0 };
                }
                if rec_cols < gh {
                    rb_h.copy_from_slice(&bd[gh + rec_cols..2 * gh]);
                }
            }
            let a = MatRef::row_major(x, rows, d.input, d.input).map_err(|e| format!("X: {e}"))?;
            let c = MatMut::row_major(&mut xw, rows, gh, gh).map_err(|e| e.to_string())?;
            let ep = Epilogue {
                bias: Some(&pb),
                ..Epilogue::none()
            };
            sgemm(1.0, a, (&dw.w).into(), 0.0, c, &ep, &*self.par)
                .map_err(|e| format!("input projection: {e}"))?;
            let reverse = self.direction == RnnDirection::Reverse || dir == 1;
            let p = peep.map(|p| &p[dir * 3 * h..(dir + 1) * 3 * h]);
            let step = Step {
                kernel: self,
                d,
                dir,
                reverse,
                weights: dw,
                acts: &self.acts[dir],
                rb_h: &rb_h,
                peep: p,
            };
            step.run_direction(&xw, &lens, h0, c0, &mut res)?;
        }
        Ok(true)
    }
}

/// One direction's recurrence.
struct Step<'a> {
    kernel: &'a RecurrentKernel,
    d: Dims,
    dir: usize,
    reverse: bool,
    weights: &'a DirWeights,
    acts: &'a [Act],
    rb_h: &'a [f32],
    peep: Option<&'a [f32]>,
}

impl Step<'_> {
    fn run_direction(
        &self,
        xw: &[f32],
        lens: &[usize],
        h0: Option<&[f32]>,
        c0: Option<&[f32]>,
        res: &mut Results<'_>,
    ) -> Result<(), String> {
        let (d, bf) = (self.d, self.kernel.batch_first);
        let (h, gh) = (d.hidden, self.kernel.cell.gates() * d.hidden);
        let mut hs = vec![0.0f32; d.batch * h];
        let mut cs = vec![0.0f32; d.batch * h];
        for b in 0..d.batch {
            let at = d.state_at(bf, self.dir, b);
            if let Some(h0) = h0 {
                hs[b * h..(b + 1) * h].copy_from_slice(&h0[at..at + h]);
            }
            if let Some(c0) = c0 {
                cs[b * h..(b + 1) * h].copy_from_slice(&c0[at..at + h]);
            }
        }
        let mut pre = vec![0.0f32; gh];
        let mut scratch = vec![0.0f32; 2 * h];
        let max_len = lens.iter().copied().max().unwrap_or(0);
        for s in 0..max_len {
            for b in 0..d.batch {
                if s >= lens[b] {
                    continue;
                }
                let t = if self.reverse { lens[b] - 1 - s } else { s };
                let row = d.row(bf, t, b);
                pre.copy_from_slice(&xw[row * gh..(row + 1) * gh]);
                let (hb, cb) = (&mut hs[b * h..(b + 1) * h], &mut cs[b * h..(b + 1) * h]);
                self.cell_step(&mut pre, hb, cb, &mut scratch)?;
                if let Some(y) = res.y.as_deref_mut() {
                    let at = d.y_at(bf, t, self.dir, b);
                    y[at..at + h].copy_from_slice(hb);
                }
            }
        }
        for b in 0..d.batch {
            let at = d.state_at(bf, self.dir, b);
            if let Some(yh) = res.yh.as_deref_mut() {
                yh[at..at + h].copy_from_slice(&hs[b * h..(b + 1) * h]);
            }
            if let Some(yc) = res.yc.as_deref_mut() {
                yc[at..at + h].copy_from_slice(&cs[b * h..(b + 1) * h]);
            }
        }
        Ok(())
    }

    /// One batch row's step: `pre` holds the row's input projection (with bias) on entry;
    /// `hb`/`cb` are updated in place.
    fn cell_step(
        &self,
        pre: &mut [f32],
        hb: &mut [f32],
        cb: &mut [f32],
        scratch: &mut [f32],
    ) -> Result<(), String> {
        let h = hb.len();
        let clip = self.kernel.clip;
        let gemv = |x: &[f32], wt: &[f32], out: &mut [f32]| {
            gemv_accumulate(x, wt, out).map_err(|e| format!("recurrent product: {e}"))
        };
        match self.kernel.cell {
            Cell::Rnn => {
                gemv(hb, &self.weights.r, pre)?;
                self.acts[0].apply(clip, pre);
                hb.copy_from_slice(pre);
            }
            Cell::Gru {
                linear_before_reset,
            } => {
                let (zr, xh) = pre.split_at_mut(2 * h);
                gemv(hb, &self.weights.r, zr)?;
                self.acts[0].apply(clip, zr);
                let (z, r) = zr.split_at(h);
                let hh = &mut scratch[..h];
                hh.copy_from_slice(self.rb_h);
                if linear_before_reset {
                    gemv(hb, &self.weights.r_h, hh)?;
                    for j in 0..h {
                        xh[j] += r[j] * hh[j];
                    }
                } else {
                    let (hh, rh) = scratch.split_at_mut(h);
                    for j in 0..h {
                        rh[j] = r[j] * hb[j];
                    }
                    gemv(rh, &self.weights.r_h, hh)?;
                    for j in 0..h {
                        xh[j] += hh[j];
                    }
                }
                self.acts[1].apply(clip, xh);
                for j in 0..h {
                    hb[j] = (1.0 - z[j]) * xh[j] + z[j] * hb[j];
                }
            }
            Cell::Lstm { input_forget } => {
                gemv(hb, &self.weights.r, pre)?;
                // Gates i, o, f, c in ONNX's order.
                let (i, rest) = pre.split_at_mut(h);
                let (o, rest) = rest.split_at_mut(h);
                let (f, c) = rest.split_at_mut(h);
                if let Some(p) = self.peep {
                    for j in 0..h {
                        i[j] += p[j] * cb[j];
                        f[j] += p[2 * h + j] * cb[j];
                    }
                }
                self.acts[0].apply(clip, i);
                if input_forget {
                    for j in 0..h {
                        f[j] = 1.0 - i[j];
                    }
                } else {
                    self.acts[0].apply(clip, f);
                }
                self.acts[1].apply(clip, c);
                for j in 0..h {
                    cb[j] = f[j] * cb[j] + i[j] * c[j];
                }
                if let Some(p) = self.peep {
                    for j in 0..h {
                        o[j] += p[h + j] * cb[j];
                    }
                }
                self.acts[0].apply(clip, o);
                let ct = &mut scratch[..h];
                ct.copy_from_slice(cb);
                self.acts[2].apply(None, ct);
                for j in 0..h {
                    hb[j] = o[j] * ct[j];
                }
            }
        }
        Ok(())
    }
}
