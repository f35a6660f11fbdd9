//! Control flow: If, Loop, Scan take their result types from their subgraphs.
//!
//! A subgraph's types are written in its own symbols. Where a subgraph input dim is a
//! plain symbol, it is bound to the operand's dim and the subgraph's result dims are
//! rewritten through that binding; a result dim that mentions any other symbol (say a
//! data-dependent size inside the body) becomes a fresh symbol.

use super::arith;
use super::cx::{axis, Cx, Res, R};
use crate::{Dim, Graph, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

/// The types of a subgraph's values `ids`, checked to exist.
fn types<'g>(g: &'g Graph, ids: &[ValueId], what: &str) -> Result<Vec<&'g TensorType>, String> {
    ids.iter()
        .map(|id| {
            g.values.get(id.0 as usize).map(|v| &v.ty).ok_or_else(|| {
                format!(
                    "subgraph `{}`: {what} value id {} is out of range",
                    g.name, id.0
                )
            })
        })
        .collect()
}

/// Bindings from a subgraph's input dims to the node's operand dims: per symbol (`seq`),
/// and per whole symbolic dim (`past + seq`, which has no per-symbol inverse).
#[derive(Default)]
struct Binding {
    map: HashMap<String, Dim>,
    whole: HashMap<Dim, Dim>,
    conflicted: HashSet<String>,
    conflicted_whole: HashSet<Dim>,
}

impl Binding {
    fn bind(&mut self, inner: &[Dim], outer: &[Dim]) {
        if inner.len() != outer.len() {
            return;
        }
        for (i, o) in inner.iter().zip(outer) {
            if i.is_known() {
                continue;
            }
            if !self.conflicted_whole.contains(i) {
                match self.whole.get(i) {
                    Some(prev) if prev != o => {
                        self.whole.remove(i);
                        self.conflicted_whole.insert(i.clone());
                    }
                    Some(_) => {}
                    None => {
                        self.whole.insert(i.clone(), o.clone());
                    }
                }
            }
            let Some(s) = i.as_symbol() else { continue };
            let name = s.name().to_string();
            if self.conflicted.contains(&name) {
                continue;
            }
            match self.map.get(&name) {
                Some(prev) if prev != o => {
                    self.map.remove(&name);
                    self.conflicted.insert(name);
                }
                Some(_) => {}
                None => {
                    self.map.insert(name, o.clone());
                }
            }
        }
    }

    /// `d` in the outer graph's symbols, when it has a form there.
    fn translate(&self, d: &Dim) -> Option<Dim> {
        if let Some(o) = self.whole.get(d) {
            return Some(o.clone());
        }
        arith::substitute(d, &self.map)
    }

    /// Binds only the positions a loop keeps unchanged from one iteration to the next.
    fn bind_invariant(&mut self, inner: &[Dim], inner_next: &[Dim], outer: &[Dim]) {
        if inner.len() != outer.len() || inner.len() != inner_next.len() {
            return;
        }
        for p in 0..inner.len() {
            if inner[p] == inner_next[p] {
                self.bind(&inner[p..=p], &outer[p..=p]);
            }
        }
    }

    /// `d` in the outer graph's symbols, or a fresh symbol.
    fn outer(&self, cx: &mut Cx<'_, '_, '_>, d: &Dim) -> Dim {
        self.translate(d).unwrap_or_else(|| cx.fresh())
    }

    fn outer_dims(&self, cx: &mut Cx<'_, '_, '_>, dims: &[Dim]) -> Vec<Dim> {
        dims.iter().map(|d| self.outer(cx, d)).collect()
    }
}

/// If: operands cond, captures...; the branches take the captures as inputs.
pub(super) fn if_(cx: &mut Cx<'_, '_, '_>, then_g: &Graph, else_g: &Graph) -> R {
    cx.arity(1, usize::MAX)?;
    let c = cx.ty(0)?;
    if super::cx::elem_count(&c.dims).is_some_and(|n| n != 1) {
        return Err(format!("condition must hold one value, got {c}"));
    }
    // Each branch's results in the outer symbols (`None` where a dim has no outer form).
    let mut branches = Vec::new();
    for g in [then_g, else_g] {
        let ins = types(g, &g.inputs, "input")?;
        let outs = types(g, &g.outputs, "output")?;
        if ins.len() != cx.len() - 1 {
            return Err(format!(
                "branch `{}` takes {} inputs, the node passes {} captures",
                g.name,
                ins.len(),
                cx.len() - 1
            ));
        }
        let mut b = Binding::default();
        for (k, t) in ins.iter().enumerate() {
            if let Some(o) = cx.opt_ty(k + 1) {
                b.bind(&t.dims, &o.dims);
            }
        }
        let res: Vec<(&TensorType, Vec<Option<Dim>>)> = outs
            .iter()
            .map(|t| (*t, t.dims.iter().map(|d| b.translate(d)).collect()))
            .collect();
        branches.push(res);
    }
    // A condition known at import (shape arithmetic, as in ONNX function expansions that
    // branch on an input's rank) selects one branch: the result is typed by it alone, so
    // branches may even differ in rank.
    if let Some([c]) = cx.ints(0).as_deref() {
        let taken = &branches[usize::from(*c == 0)];
        return Ok(taken
            .iter()
            .map(|(t, dims)| {
                let dims = dims.iter().map(|d| d.clone().unwrap_or_else(|| cx.fresh()));
                Res::new(t.dtype, dims.collect())
            })
            .collect());
    }
    let (t, e) = (&branches[0], &branches[1]);
    if t.len() != e.len() {
        return Err(format!(
            "then branch has {} results, else branch has {}",
            t.len(),
            e.len()
        ));
    }
    let mut out = Vec::with_capacity(t.len());
    for (i, ((ta, da), (tb, db))) in t.iter().zip(e).enumerate() {
        if ta.dtype != tb.dtype {
            return Err(format!(
                "result {i} is {ta} in the then branch but {tb} in the else branch"
            ));
        }
        if ta.rank() != tb.rank() {
            return Err(format!(
                "{}: result {i} is {ta} in the then branch but {tb} in the else branch",
                super::DATA_DEPENDENT_RANK
            ));
        }
        let dims = da
            .iter()
            .zip(db)
            .map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) if x == y => x.clone(),
                _ => cx.fresh(),
            })
            .collect();
        out.push(Res::new(ta.dtype, dims));
    }
    Ok(out)
}

/// The final type of a loop-carried value: its dims stay the operand's where the body
/// keeps them, else fresh.
fn carried(
    cx: &mut Cx<'_, '_, '_>,
    b: &Binding,
    init: Option<&TensorType>,
    body_in: &TensorType,
    body_out: &TensorType,
) -> Result<Res, String> {
    let Some(init) = init else {
        let dims = b.outer_dims(cx, &body_out.dims);
        return Ok(Res::new(body_out.dtype, dims));
    };
    if init.dtype != body_out.dtype || init.rank() != body_out.rank() {
        return Err(format!(
            "loop-carried value starts as {init} but the body produces {body_out}"
        ));
    }
    let dims = (0..init.rank())
        .map(|p| {
            let (i, o) = (body_in.dims.get(p), &body_out.dims[p]);
            if i == Some(o) || b.translate(o).as_ref() == Some(&init.dims[p]) {
                init.dims[p].clone()
            } else {
                cx.fresh()
            }
        })
        .collect();
    Ok(Res::new(body_out.dtype, dims))
}

/// Loop: operands max_trip_count?, cond?, carried..., captures...
///
/// Carried values and captures are told apart by position: the carried ones are the
/// longest prefix whose body inputs and outputs agree in dtype and rank (a capture has no
/// body output, a scan output no body input).
pub(super) fn loop_(cx: &mut Cx<'_, '_, '_>, body: &Graph) -> R {
    cx.arity(2, usize::MAX)?;
    let ins = types(body, &body.inputs, "input")?;
    let outs = types(body, &body.outputs, "output")?;
    if ins.len() != cx.len() {
        return Err(format!(
            "loop body takes {} inputs, the node passes {} operands",
            ins.len(),
            cx.len()
        ));
    }
    if outs.is_empty() {
        return Err("loop body has no results (it must produce cond first)".into());
    }
    let max_n = (cx.len() - 2).min(outs.len() - 1);
    let n = (0..=max_n)
        .rev()
        .find(|&n| {
            (0..n).all(|j| {
                let (i, o) = (ins[2 + j], outs[1 + j]);
                i.dtype == o.dtype
                    && i.rank() == o.rank()
                    && cx
                        .opt_ty(2 + j)
                        .is_none_or(|t| t.dtype == i.dtype && t.rank() == i.rank())
            })
        })
        .unwrap_or(0);
    let mut b = Binding::default();
    for (k, t) in ins.iter().enumerate().skip(2) {
        let Some(o) = cx.opt_ty(k) else { continue };
        if k < 2 + n {
            b.bind_invariant(&t.dims, &outs[k - 1].dims, &o.dims);
        } else {
            b.bind(&t.dims, &o.dims);
        }
    }
    let mut res = Vec::with_capacity(outs.len() - 1);
    for j in 0..n {
        let r = carried(cx, &b, cx.opt_ty(2 + j), ins[2 + j], outs[1 + j])?;
        res.push(r);
    }
    // Scan outputs stack one slice per iteration: the trip count when nothing can stop the
    // loop early, else one fresh count shared by all of them.
    let trips = match (cx.scalar(0), cx.present(1)) {
        (Some(t), false) if t.as_known().is_none_or(|v| v >= 0) => t,
        _ => cx.fresh(),
    };
    for t in &outs[1 + n..] {
        let mut dims = vec![trips.clone()];
        dims.extend(b.outer_dims(cx, &t.dims));
        res.push(Res::new(t.dtype, dims));
    }
    Ok(res)
}

/// Scan: operands state..., scan inputs..., captures...
pub(super) fn scan(
    cx: &mut Cx<'_, '_, '_>,
    body: &Graph,
    num_scan_inputs: i64,
    num_captures: i64,
    in_axes: &[i64],
    out_axes: &[i64],
) -> R {
    let m = usize::try_from(num_scan_inputs)
        .ok()
        .filter(|m| *m > 0)
        .ok_or_else(|| format!("num_scan_inputs must be positive, got {num_scan_inputs}"))?;
    let c = usize::try_from(num_captures)
        .map_err(|_| format!("num_captures is negative ({num_captures})"))?;
    let n = cx.len().checked_sub(m + c).ok_or_else(|| {
        format!(
            "scan has {} operands, fewer than {m} scan inputs and {c} captures",
            cx.len()
        )
    })?;
    let ins = types(body, &body.inputs, "input")?;
    let outs = types(body, &body.outputs, "output")?;
    if ins.len() != cx.len() {
        return Err(format!(
            "scan body takes {} inputs, the node passes {} operands",
            ins.len(),
            cx.len()
        ));
    }
    let k = outs.len().checked_sub(n).ok_or_else(|| {
        format!(
            "scan body has {} results, fewer than {n} states",
            outs.len()
        )
    })?;
    if !in_axes.is_empty() && in_axes.len() != m {
        return Err(format!(
            "scan_input_axes has {} values for {m} scan inputs",
            in_axes.len()
        ));
    }
    if !out_axes.is_empty() && out_axes.len() != k {
        return Err(format!(
            "scan_output_axes has {} values for {k} scan outputs",
            out_axes.len()
        ));
    }
    let mut b = Binding::default();
    let mut len = None;
    for (j, t) in ins.iter().enumerate() {
        let o = cx.ty(j)?;
        if j >= n && j < n + m {
            let a = axis(in_axes.get(j - n).copied().unwrap_or(0), o.rank())?;
            len.get_or_insert_with(|| o.dims[a].clone());
            let mut slice = o.dims.clone();
            slice.remove(a);
            b.bind(&t.dims, &slice);
        } else if j < n {
            b.bind_invariant(&t.dims, &outs[j].dims, &o.dims);
        } else {
            b.bind(&t.dims, &o.dims);
        }
    }
    let len = match len {
        Some(l) => l,
        None => cx.fresh(),
    };
    let mut res = Vec::with_capacity(outs.len());
    for j in 0..n {
        let r = carried(cx, &b, cx.opt_ty(j), ins[j], outs[j])?;
        res.push(r);
    }
    for (q, t) in outs[n..].iter().enumerate() {
        let mut dims = b.outer_dims(cx, &t.dims);
        let r = dims.len() as i64 + 1;
        let a = out_axes.get(q).copied().unwrap_or(0);
        if a < -r || a >= r {
            return Err(format!("scan output axis {a} out of range for rank {r}"));
        }
        dims.insert(if a < 0 { a + r } else { a } as usize, len.clone());
        res.push(Res::new(t.dtype, dims));
    }
    Ok(res)
}
