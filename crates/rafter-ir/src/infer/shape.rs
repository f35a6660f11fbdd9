//! Shapes and data movement: Reshape, Shape, Slice, Gather, Concat, ... and the value
//! propagation that keeps exported shape arithmetic symbolic.

use super::arith;
use super::cx::{
    axes, axis, broadcast_values, check_inferred_rank, ck, elem_count, op_axes, prod, valued, Cx,
    OpAxes, Res, BIG, MAX_SYM, R,
};
use super::RUNTIME_AXES_RANK;
use crate::{DType, Dim, Scalar, TensorType};

/// The operand must be a 1-D integer tensor (shapes, pads, repeats, slice bounds).
pub(super) fn int_vector<'i>(
    cx: &Cx<'_, 'i, '_>,
    i: usize,
    what: &str,
) -> Result<&'i TensorType, String> {
    let t = cx.int_ty(i, what)?;
    if t.rank() != 1 {
        return Err(format!("{what} (operand {i}) must be 1-D, got {t}"));
    }
    Ok(t)
}

/// The length of a 1-D operand, which must be known (it decides a rank) and at most
/// `MAX_INFERRED_RANK`.
pub(super) fn known_len(t: &TensorType, i: usize, what: &str) -> Result<usize, String> {
    let len = t.dims[0]
        .as_known()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            format!(
                "{what} (operand {i}) has unknown length {}, so the result rank is unknown",
                t.dims[0]
            )
        })?;
    check_inferred_rank(len, &format!("{what} (operand {i})"))?;
    Ok(len)
}

fn no_negative(vals: &[Dim], what: &str) -> Result<(), String> {
    match vals.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
        Some(d) => Err(format!("{what} has negative value {d}")),
        None => Ok(()),
    }
}

fn fmt_dims(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(Dim::to_string).collect();
    format!("[{}]", parts.join(", "))
}

pub(super) fn reshape(cx: &mut Cx<'_, '_, '_>, allow_zero: bool) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let s = int_vector(cx, 1, "shape")?;
    let len = known_len(s, 1, "shape")?;
    let Some(target) = cx.values(1) else {
        let dims = cx.fresh_n(len);
        return Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))]);
    };
    let mut infer_at = None;
    let mut dims = Vec::with_capacity(len);
    for (i, v) in target.iter().enumerate() {
        match v.as_known() {
            Some(-1) => {
                if infer_at.is_some() {
                    return Err(format!("shape {} has more than one -1", fmt_dims(&target)));
                }
                infer_at = Some(i);
                dims.push(Dim::known(1));
            }
            Some(0) if !allow_zero => dims.push(x.dims.get(i).cloned().ok_or_else(|| {
                format!(
                    "shape value 0 at position {i} copies an input dim, but the input has rank {}",
                    x.rank()
                )
            })?),
            Some(k) if k < 0 => return Err(format!("shape has invalid value {k}")),
            _ => dims.push(v.clone()),
        }
    }
    let total = prod(&x.dims)?;
    let rest = prod(&dims)?;
    if let Some(at) = infer_at {
        if rest.as_known() == Some(0) {
            return Err(format!(
                "cannot infer the -1 in shape {} next to a zero dim",
                fmt_dims(&target)
            ));
        }
        dims[at] = match arith::div_exact(&total, &rest) {
            Some(d) => d,
            None if total.is_known() && rest.is_known() => {
                return Err(format!(
                    "cannot reshape {} ({total} elements) into {}",
                    fmt_dims(&x.dims),
                    fmt_dims(&target)
                ))
            }
            None => cx.fresh(),
        };
    } else if let (Some(a), Some(b)) = (total.as_known(), rest.as_known()) {
        if a != b {
            return Err(format!(
                "cannot reshape {} ({a} elements) into {} ({b} elements)",
                fmt_dims(&x.dims),
                fmt_dims(&dims)
            ));
        }
    }
    Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))])
}

pub(super) fn shape(cx: &mut Cx<'_, '_, '_>, start: i64, end: Option<i64>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let s = clamp(start);
    let e = clamp(end.unwrap_or(r)).max(s);
    let vals = x.dims[s..e].to_vec();
    Ok(vec![
        Res::new(DType::I64, vec![Dim::known((e - s) as i64)]).with_sym(Some(vals))
    ])
}

pub(super) fn size(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let n = arith::product(&x.dims);
    Ok(vec![
        Res::new(DType::I64, vec![]).with_sym(n.map(|n| vec![n]))
    ])
}

pub(super) fn transpose(cx: &mut Cx<'_, '_, '_>, perm: &[i64]) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let r = x.rank();
    let p: Vec<usize> = if perm.is_empty() {
        (0..r).rev().collect()
    } else {
        if perm.len() != r {
            return Err(format!(
                "perm {perm:?} has {} entries for rank {r}",
                perm.len()
            ));
        }
        axes(perm, r).map_err(|e| format!("perm {perm:?} is not a permutation: {e}"))?
    };
    let dims = p.iter().map(|&a| x.dims[a].clone()).collect();
    let sym = if r <= 1 { cx.values(0) } else { None };
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

/// The error for a Squeeze or Unsqueeze whose axes operand has an unknown length.
fn runtime_rank_err() -> String {
    format!("{RUNTIME_AXES_RANK}: the axes operand has an unknown length")
}

pub(super) fn squeeze(cx: &mut Cx<'_, '_, '_>, ax: &[i64]) -> R {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let ax = match op_axes(cx, ax, 1)? {
        OpAxes::Known(ax) => ax,
        OpAxes::RunTime(None) => return Err(runtime_rank_err()),
        OpAxes::RunTime(Some(l)) => {
            // Dims known not to be 1 stay; when exactly `l` dims may be 1, those go.
            let stay: Vec<Dim> = x
                .dims
                .iter()
                .filter(|d| d.as_known().is_some_and(|v| v != 1))
                .cloned()
                .collect();
            let may_go = x.rank() - stay.len();
            if l > may_go {
                return Err(format!(
                    "cannot squeeze {l} axes of {x}: at most {may_go} dims can be 1"
                ));
            }
            let dims = if l == may_go {
                stay
            } else {
                cx.fresh_n(x.rank() - l)
            };
            return Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))]);
        }
    };
    let ax = ax.as_slice();
    let mut dims = Vec::with_capacity(x.rank());
    if ax.is_empty() {
        for (i, d) in x.dims.iter().enumerate() {
            match d.as_known() {
                Some(1) => {}
                Some(_) => dims.push(d.clone()),
                None => {
                    return Err(format!(
                        "{}: squeeze without axes: dim {i} is symbolic ({d}), so whether it is 1 is unknown",
                        super::DATA_DEPENDENT_RANK
                    ))
                }
            }
        }
    } else {
        let drop = axes(ax, x.rank())?;
        for (i, d) in x.dims.iter().enumerate() {
            if !drop.contains(&i) {
                dims.push(d.clone());
            } else if let Some(v) = d.as_known().filter(|v| *v != 1) {
                return Err(format!("cannot squeeze axis {i} of size {v}"));
            }
        }
    }
    Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))])
}

pub(super) fn unsqueeze(cx: &mut Cx<'_, '_, '_>, ax: &[i64]) -> R {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let ax = match op_axes(cx, ax, 1)? {
        OpAxes::Known(ax) => ax,
        OpAxes::RunTime(None) => return Err(runtime_rank_err()),
        OpAxes::RunTime(Some(l)) => {
            // Each result dim is 1 or one of x's: all 1 when x's are.
            let out_rank = x.rank() + l;
            let dims = if x.dims.iter().all(|d| d.as_known() == Some(1)) {
                vec![Dim::known(1); out_rank]
            } else {
                cx.fresh_n(out_rank)
            };
            return Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))]);
        }
    };
    let ax = ax.as_slice();
    let out_rank = x.rank() + ax.len();
    let new = axes(ax, out_rank)?;
    let mut src = x.dims.iter();
    let dims = (0..out_rank)
        .map(|i| {
            if new.contains(&i) {
                Dim::known(1)
            } else {
                src.next().cloned().unwrap_or_else(|| Dim::known(1))
            }
        })
        .collect();
    Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))])
}

pub(super) fn flatten(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let r = x.rank() as i64;
    if ax < -r || ax > r {
        return Err(format!("axis {ax} out of range for rank {r}"));
    }
    let a = if ax < 0 { ax + r } else { ax } as usize;
    let dims = vec![prod(&x.dims[..a])?, prod(&x.dims[a..])?];
    Ok(vec![Res::new(x.dtype, dims).with_sym(cx.values(0))])
}

pub(super) fn concat(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(1, usize::MAX)?;
    let first = cx.ty(0)?;
    let r = first.rank();
    let a = axis(ax, r)?;
    let mut dims = first.dims.clone();
    for i in 1..cx.len() {
        let t = cx.ty(i)?;
        if t.dtype != first.dtype {
            return Err(format!(
                "operand {i} has dtype {}, operand 0 has {}",
                t.dtype, first.dtype
            ));
        }
        if t.rank() != r {
            return Err(format!(
                "operand {i} has rank {}, operand 0 has rank {r}",
                t.rank()
            ));
        }
        for (j, d) in t.dims.iter().enumerate() {
            if j == a {
                dims[j] = ck(arith::add(&dims[j], d))?;
            } else if let (Some(p), Some(q)) = (dims[j].as_known(), d.as_known()) {
                if p != q {
                    return Err(format!(
                        "concat: dim {j} is {p} in operand 0 and {q} in operand {i}"
                    ));
                }
            } else if d.is_known() {
                dims[j] = d.clone();
            }
        }
    }
    let sym = if r == 1 {
        (0..cx.len())
            .map(|i| cx.values(i))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.concat())
    } else {
        None
    };
    Ok(vec![Res::new(first.dtype, dims).with_sym(sym)])
}

pub(super) fn split(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let a = axis(ax, x.rank())?;
    let n = cx.n_out;
    if n == 0 {
        return Err("split needs at least one result".into());
    }
    let dim = &x.dims[a];
    let sizes: Vec<Dim> = if cx.present(1) {
        let s = int_vector(cx, 1, "split")?;
        if s.dims[0].as_known().is_some_and(|l| l != n as i64) {
            return Err(format!("split has {} sizes for {n} results", s.dims[0]));
        }
        match cx.values(1) {
            Some(v) => {
                no_negative(&v, "split")?;
                let total = ck(arith::sum(&v))?;
                if let (Some(t), Some(d)) = (total.as_known(), dim.as_known()) {
                    if t != d {
                        return Err(format!("split sizes sum to {t}, axis {a} has size {d}"));
                    }
                }
                v
            }
            None => cx.fresh_n(n),
        }
    } else if let Some(d) = dim.as_known() {
        // Equal parts, the last one smaller when the axis does not divide.
        let k = n as i64;
        let chunk = arith::ceil_div(d, k).ok_or("overflow")?;
        let last = d - chunk * (k - 1);
        if last < 0 {
            return Err(format!(
                "axis {a} of size {d} cannot be split into {n} parts"
            ));
        }
        let mut v = vec![Dim::known(chunk); n - 1];
        v.push(Dim::known(last));
        v
    } else {
        match arith::div_exact(dim, &Dim::known(n as i64)) {
            Some(q) => vec![q; n],
            None => cx.fresh_n(n),
        }
    };
    let vals = cx.values(0).filter(|_| x.rank() == 1);
    let mut out = Vec::with_capacity(n);
    let mut offset = Some(0usize);
    for s in sizes {
        let mut dims = x.dims.clone();
        dims[a] = s.clone();
        let sym = match (
            &vals,
            offset,
            s.as_known().and_then(|v| usize::try_from(v).ok()),
        ) {
            (Some(v), Some(o), Some(len)) if o + len <= v.len() => {
                offset = Some(o + len);
                Some(v[o..o + len].to_vec())
            }
            _ => {
                offset = None;
                None
            }
        };
        out.push(Res::new(x.dtype, dims).with_sym(sym));
    }
    Ok(out)
}

/// ONNX's clamped (start, end) for a known dim; `len` follows.
fn clamp_bounds(n: i64, start: i64, end: i64, step: i64) -> (i128, i128, i128) {
    let (n, mut s, mut e, st) = (n as i128, start as i128, end as i128, step as i128);
    if s < 0 {
        s += n;
    }
    if e < 0 {
        e += n;
    }
    let len;
    if st > 0 {
        s = s.clamp(0, n);
        e = e.clamp(0, n);
        len = if e > s { (e - s + st - 1) / st } else { 0 };
    } else {
        s = s.clamp(0, (n - 1).max(0));
        e = e.clamp(-1, n - 1);
        len = if s > e && n > 0 {
            (s - e + (-st) - 1) / (-st)
        } else {
            0
        };
    }
    (s, e, len)
}

/// The length of `start..end` by `step` along a dim (ONNX clamping).
fn slice_len(
    cx: &mut Cx<'_, '_, '_>,
    dim: &Dim,
    start: &Dim,
    end: &Dim,
    step: i64,
) -> Result<Dim, String> {
    if let (Some(n), Some(s), Some(e)) = (dim.as_known(), start.as_known(), end.as_known()) {
        let (_, _, len) = clamp_bounds(n, s, e, step);
        return Ok(Dim::known(len as i64));
    }
    let from_end = |v: &Dim, k: i64| ck(arith::add_k(v, k));
    let length = |cx: &mut Cx<'_, '_, '_>, span: Dim, step: i64| -> Result<Dim, String> {
        let st = step.abs();
        if let Some(v) = span.as_known() {
            return Ok(Dim::known(arith::ceil_div(v, st).ok_or("overflow")?.max(0)));
        }
        Ok(arith::div_exact(&span, &Dim::known(st)).unwrap_or_else(|| cx.fresh()))
    };
    if step > 0 {
        let s = match start.as_known() {
            Some(v) if v >= BIG => return Ok(Dim::known(0)),
            Some(v) if v <= -BIG => Dim::known(0),
            Some(v) if v < 0 => from_end(dim, v)?,
            _ => start.clone(),
        };
        let e = match end.as_known() {
            Some(v) if v >= BIG => dim.clone(),
            Some(v) if v <= -BIG => return Ok(Dim::known(0)),
            Some(v) if v < 0 => from_end(dim, v)?,
            _ => end.clone(),
        };
        let s = if arith::le(&s, &Dim::known(0)) {
            Dim::known(0)
        } else {
            s
        };
        let e = if arith::le(dim, &e) { dim.clone() } else { e };
        if arith::le(&e, &s) {
            return Ok(Dim::known(0));
        }
        // A symbolic end on a known dim (`positions[:, 0:seq]` over a fixed-size table) is
        // taken to lie within the dim, as exporters intend; if it does not at run time, the
        // executor's check of `seq` against the actual length reports it.
        let end_in_range = arith::le(&e, dim) || (dim.is_known() && !e.is_known());
        if arith::nonneg(&s) && arith::le(&s, &e) && end_in_range {
            return length(cx, ck(arith::sub(&e, &s))?, step);
        }
        Ok(cx.fresh())
    } else {
        let last = from_end(dim, -1)?;
        let s = match start.as_known() {
            Some(v) if v >= BIG => last.clone(),
            Some(v) if v <= -BIG => return Ok(Dim::known(0)),
            Some(v) if v < 0 => from_end(dim, v)?,
            _ => start.clone(),
        };
        let e = match end.as_known() {
            Some(v) if v >= BIG => return Ok(Dim::known(0)),
            Some(v) if v <= -BIG => Dim::known(-1),
            Some(v) if v < 0 => from_end(dim, v)?,
            _ => end.clone(),
        };
        let s = if arith::le(&last, &s) {
            last.clone()
        } else {
            s
        };
        if arith::le(&s, &e) {
            return Ok(Dim::known(0));
        }
        if arith::le(&Dim::known(-1), &e) && arith::le(&e, &s) && arith::le(&s, &last) {
            return length(cx, ck(arith::sub(&s, &e))?, step);
        }
        Ok(cx.fresh())
    }
}

pub(super) fn slice(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(3, 5)?;
    let x = cx.ty(0)?;
    let r = x.rank();
    let names = ["data", "starts", "ends", "axes", "steps"];
    let mut lens = Vec::new();
    for (i, name) in names.iter().enumerate().skip(1) {
        if cx.present(i) {
            let t = int_vector(cx, i, name)?;
            if let Some(l) = t.dims[0].as_known() {
                lens.push((i, l));
            }
        }
    }
    if let Some(w) = lens.windows(2).find(|w| w[0].1 != w[1].1) {
        return Err(format!(
            "{} has {} values but {} has {}",
            names[w[0].0], w[0].1, names[w[1].0], w[1].1
        ));
    }
    let n = lens.first().map(|l| l.1 as usize);
    let starts = cx.values(1);
    let ends = cx.values(2);
    let ax: Option<Vec<usize>> = if cx.present(3) {
        cx.ints(3).map(|a| axes(&a, r)).transpose()?
    } else {
        match n {
            Some(n) if n > r => return Err(format!("{n} slice bounds for rank {r}")),
            Some(n) => Some((0..n).collect()),
            None => None,
        }
    };
    let steps: Option<Vec<i64>> = if cx.present(4) {
        cx.ints(4)
    } else {
        n.map(|n| vec![1; n])
    };
    if let Some(k) = steps.as_ref().and_then(|s| s.iter().position(|v| *v == 0)) {
        return Err(format!("slice step {k} is 0"));
    }
    let mut dims = x.dims.clone();
    let Some(ax) = ax else {
        let dims = cx.fresh_n(r);
        return Ok(vec![Res::new(x.dtype, dims)]);
    };
    for (k, &a) in ax.iter().enumerate() {
        let bounds = (
            starts.as_ref().and_then(|v| v.get(k)),
            ends.as_ref().and_then(|v| v.get(k)),
            steps.as_ref().and_then(|v| v.get(k)),
        );
        dims[a] = match bounds {
            (Some(s), Some(e), Some(&st)) => slice_len(cx, &x.dims[a], s, e, st)?,
            _ => cx.fresh(),
        };
    }
    // Values of a sliced vector.
    let sym = (|| {
        if r != 1 || !valued(x.dtype) {
            return None;
        }
        let v = cx.values(0)?;
        let s = starts.as_ref()?.first()?.as_known()?;
        let e = ends.as_ref()?.first()?.as_known()?;
        let st = *steps.as_ref()?.first()?;
        let (mut i, _, len) = clamp_bounds(v.len() as i64, s, e, st);
        let mut out = Vec::new();
        for _ in 0..len {
            out.push(v.get(usize::try_from(i).ok()?)?.clone());
            i += st as i128;
        }
        Some(out)
    })();
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

pub(super) fn gather(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let idx = cx.int_ty(1, "indices")?;
    let a = axis(ax, data.rank())?;
    let mut dims = data.dims[..a].to_vec();
    dims.extend_from_slice(&idx.dims);
    dims.extend_from_slice(&data.dims[a + 1..]);
    let indices = cx.ints(1);
    if let (Some(ix), Some(n)) = (&indices, data.dims[a].as_known()) {
        if let Some(bad) = ix.iter().find(|&&i| i < -n || i >= n) {
            return Err(format!(
                "gather: index {bad} out of range for axis {a} of size {n}"
            ));
        }
    }
    let sym = match (data.rank(), cx.values(0), indices) {
        (1, Some(v), Some(ix)) => ix
            .iter()
            .map(|&i| {
                let n = v.len() as i64;
                let j = if i < 0 { i + n } else { i };
                v.get(usize::try_from(j).ok()?).cloned()
            })
            .collect(),
        _ => None,
    };
    Ok(vec![Res::new(data.dtype, dims).with_sym(sym)])
}

pub(super) fn gather_elements(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let idx = cx.int_ty(1, "indices")?;
    axis(ax, data.rank())?;
    if idx.rank() != data.rank() {
        return Err(format!(
            "indices have rank {}, data has rank {}",
            idx.rank(),
            data.rank()
        ));
    }
    Ok(vec![Res::new(data.dtype, idx.dims.clone())])
}

pub(super) fn gather_nd(cx: &mut Cx<'_, '_, '_>, batch_dims: i64) -> R {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let idx = cx.int_ty(1, "indices")?;
    let (r, q) = (data.rank(), idx.rank());
    let b =
        usize::try_from(batch_dims).map_err(|_| format!("batch_dims {batch_dims} is negative"))?;
    if q == 0 || r == 0 || b >= q.min(r) {
        return Err(format!(
            "gather_nd: batch_dims {b} needs data (rank {r}) and indices (rank {q}) of greater rank"
        ));
    }
    let m = idx.dims[q - 1]
        .as_known()
        .and_then(|m| usize::try_from(m).ok())
        .ok_or_else(|| {
            format!(
                "gather_nd: indices' last dim {} is not known",
                idx.dims[q - 1]
            )
        })?;
    if m < 1 || m > r - b {
        return Err(format!(
            "gather_nd: indices' last dim {m} must be in 1..={} for data of rank {r}",
            r - b
        ));
    }
    let mut dims = idx.dims[..q - 1].to_vec();
    dims.extend_from_slice(&data.dims[b + m..]);
    Ok(vec![Res::new(data.dtype, dims)])
}

/// ScatterElements, ScatterNd: the result is data's type.
pub(super) fn scatter(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(3, 3)?;
    let data = cx.ty(0)?;
    cx.int_ty(1, "indices")?;
    let upd = cx.ty(2)?;
    if upd.dtype != data.dtype {
        return Err(format!(
            "updates have dtype {}, data has {}",
            upd.dtype, data.dtype
        ));
    }
    Ok(vec![Res::of(data)])
}

pub(super) fn expand(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let s = int_vector(cx, 1, "shape")?;
    let dims = match cx.values(1) {
        Some(target) => {
            no_negative(&target, "shape")?;
            cx.broadcast(&[(0, &x.dims), (1, &target)])?
        }
        None => {
            // Unknown target: a data dim other than 1 stays (the target must be 1 or
            // equal there); elsewhere the dim is the unknown target value.
            let len = known_len(s, 1, "shape")?;
            let rank = len.max(x.rank());
            let mut dims = Vec::with_capacity(rank);
            for p in 0..rank {
                let data = (p + x.rank()).checked_sub(rank).map(|i| &x.dims[i]);
                let in_target = p + len >= rank;
                dims.push(match data {
                    Some(d) if !in_target || d.as_known().is_some_and(|v| v != 1) => d.clone(),
                    _ => cx.fresh(),
                });
            }
            dims
        }
    };
    let sym = cx
        .values(0)
        .and_then(|v| broadcast_values(&dims, &[(&x.dims, &v)], |e| Some(e[0].clone())));
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

pub(super) fn tile(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let t = int_vector(cx, 1, "repeats")?;
    if t.dims[0].as_known().is_some_and(|l| l != x.rank() as i64) {
        return Err(format!(
            "repeats has {} values for rank {}",
            t.dims[0],
            x.rank()
        ));
    }
    let Some(reps) = cx.values(1) else {
        let dims = cx.fresh_n(x.rank());
        return Ok(vec![Res::new(x.dtype, dims)]);
    };
    no_negative(&reps, "repeats")?;
    let dims = x
        .dims
        .iter()
        .zip(&reps)
        .map(|(d, r)| ck(arith::mul(d, r)))
        .collect::<Result<Vec<_>, _>>()?;
    let sym = match (x.rank(), cx.values(0), reps.first().and_then(Dim::as_known)) {
        (1, Some(v), Some(k)) if (k as usize).saturating_mul(v.len()) <= MAX_SYM => Some(
            v.iter()
                .cycle()
                .take(v.len() * k as usize)
                .cloned()
                .collect(),
        ),
        _ => None,
    };
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

pub(super) fn pad(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 4)?;
    let x = cx.ty(0)?;
    let r = x.rank();
    let p = int_vector(cx, 1, "pads")?;
    let targets: Option<Vec<usize>> = if cx.present(3) {
        int_vector(cx, 3, "axes")?;
        cx.ints(3).map(|a| axes(&a, r)).transpose()?
    } else {
        Some((0..r).collect())
    };
    let Some(targets) = targets else {
        let dims = cx.fresh_n(r);
        return Ok(vec![Res::new(x.dtype, dims)]);
    };
    let n = targets.len();
    if p.dims[0].as_known().is_some_and(|l| l != 2 * n as i64) {
        return Err(format!(
            "pads has {} values, expected {} (begins then ends)",
            p.dims[0],
            2 * n
        ));
    }
    let mut dims = x.dims.clone();
    match cx.values(1) {
        Some(pads) => {
            for (k, &a) in targets.iter().enumerate() {
                let d = ck(
                    arith::add(&x.dims[a], &pads[k]).and_then(|d| arith::add(&d, &pads[k + n]))
                )?;
                if d.as_known().is_some_and(|v| v < 0) {
                    return Err(format!("pads make axis {a} negative ({d})"));
                }
                dims[a] = d;
            }
        }
        None => {
            for &a in &targets {
                dims[a] = cx.fresh();
            }
        }
    }
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn constant_of_shape(cx: &mut Cx<'_, '_, '_>, value: &Scalar) -> R {
    cx.arity(1, 1)?;
    let s = int_vector(cx, 0, "shape")?;
    let dims = match cx.values(0) {
        Some(v) => v,
        None => {
            let len = known_len(s, 0, "shape")?;
            cx.fresh_n(len)
        }
    };
    no_negative(&dims, "shape")?;
    let dtype = value.dtype();
    let fill = match *value {
        Scalar::Int(_, v) => Some(v),
        Scalar::UInt(_, v) => i64::try_from(v).ok(),
        Scalar::Bool(b) => Some(b as i64),
        Scalar::Float(..) => None,
    };
    let sym = match (fill, elem_count(&dims)) {
        (Some(f), Some(n)) if n <= MAX_SYM => Some(vec![Dim::known(f); n]),
        _ => None,
    };
    Ok(vec![Res::new(dtype, dims).with_sym(sym)])
}

pub(super) fn range(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(3, 3)?;
    let dtype = cx.ty(0)?.dtype;
    for (i, name) in ["start", "limit", "delta"].iter().enumerate() {
        let t = cx.ty(i)?;
        if elem_count(&t.dims).is_some_and(|n| n != 1) || t.rank() > 1 {
            return Err(format!("{name} (operand {i}) must be a scalar, got {t}"));
        }
        if t.dtype != dtype {
            return Err(format!("{name} has dtype {}, start has {dtype}", t.dtype));
        }
    }
    if dtype.is_int() {
        let (s, l, d) = (cx.scalar(0), cx.scalar(1), cx.scalar(2));
        if let (Some(s), Some(l), Some(d)) = (&s, &l, &d) {
            if let (Some(a), Some(b), Some(c)) = (s.as_known(), l.as_known(), d.as_known()) {
                if c == 0 {
                    return Err("range delta is 0".into());
                }
                let (a, b, c) = (a as i128, b as i128, c as i128);
                // ceil((limit - start) / delta), clamped at 0.
                let (num, den) = if c < 0 { (a - b, -c) } else { (b - a, c) };
                let n = (num + den - 1).div_euclid(den).max(0);
                let n = i64::try_from(n).map_err(|_| "range length overflows")?;
                let sym = (n as usize <= MAX_SYM).then(|| {
                    (0..n as i128)
                        .map(|i| Dim::known((a + i * c) as i64))
                        .collect()
                });
                return Ok(vec![Res::new(dtype, vec![Dim::known(n)]).with_sym(sym)]);
            }
            if d.as_known() == Some(0) {
                return Err("range delta is 0".into());
            }
            if let Some(n) = arith::sub(l, s).and_then(|span| arith::div_exact(&span, d)) {
                return Ok(vec![Res::new(dtype, vec![n])]);
            }
        }
        let f = cx.fresh();
        return Ok(vec![Res::new(dtype, vec![f])]);
    }
    let one = |i: usize| cx.floats(i).and_then(|v| v.first().copied());
    let len = match (one(0), one(1), one(2)) {
        (Some(s), Some(l), Some(d)) => {
            if d == 0.0 {
                return Err("range delta is 0".into());
            }
            let n = ((l - s) / d).ceil().max(0.0);
            if !(n.is_finite() && n < (1u64 << 62) as f64) {
                return Err(format!("range length {n} is out of range"));
            }
            Dim::known(n as i64)
        }
        _ => cx.fresh(),
    };
    Ok(vec![Res::new(dtype, vec![len])])
}

pub(super) fn one_hot(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(3, 3)?;
    let idx = cx.ty(0)?;
    cx.ty(1)?;
    let vals = cx.ty(2)?;
    let r = idx.rank() as i64;
    if ax < -(r + 1) || ax > r {
        return Err(format!("axis {ax} out of range for rank {}", r + 1));
    }
    let a = if ax < 0 { ax + r + 1 } else { ax } as usize;
    let depth = match cx.scalar(1) {
        Some(d) => Some(d),
        None => cx
            .floats(1)
            .filter(|v| v.len() == 1 && v[0].is_finite() && v[0].abs() < (1u64 << 62) as f64)
            .map(|v| Dim::known(v[0] as i64)),
    };
    let depth = match depth {
        Some(d) if d.as_known().is_some_and(|v| v <= 0) => {
            return Err(format!("depth must be positive, got {d}"))
        }
        Some(d) => d,
        None => cx.fresh(),
    };
    let mut dims = idx.dims.clone();
    dims.insert(a, depth);
    Ok(vec![Res::new(vals.dtype, dims)])
}

pub(super) fn trilu(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    if x.rank() < 2 {
        return Err(format!("x must have rank at least 2, got {}", x.rank()));
    }
    Ok(vec![Res::of(x)])
}

pub(super) fn top_k(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let kt = cx.int_ty(1, "k")?;
    if elem_count(&kt.dims).is_some_and(|n| n != 1) || kt.rank() > 1 {
        return Err(format!("k must hold one value, got {kt}"));
    }
    let a = axis(ax, x.rank())?;
    let k = match cx.scalar(1) {
        Some(k) => {
            if let Some(v) = k.as_known() {
                if v < 0 {
                    return Err(format!("k is negative ({v})"));
                }
                if let Some(n) = x.dims[a].as_known().filter(|n| v > *n) {
                    return Err(format!("k = {v} is larger than axis {a} of size {n}"));
                }
            }
            k
        }
        None => cx.fresh(),
    };
    let mut dims = x.dims.clone();
    dims[a] = k;
    Ok(vec![
        Res::new(x.dtype, dims.clone()),
        Res::new(DType::I64, dims),
    ])
}

pub(super) fn non_zero(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let r = cx.ty(0)?.rank();
    let n = cx.fresh();
    Ok(vec![Res::new(DType::I64, vec![Dim::known(r as i64), n])])
}

pub(super) fn compress(cx: &mut Cx<'_, '_, '_>, ax: Option<i64>) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let c = cx.ty(1)?;
    if c.rank() != 1 {
        return Err(format!("condition must be 1-D, got {c}"));
    }
    let a = ax.map(|a| axis(a, x.rank())).transpose()?;
    // The selected length: the true conditions within the axis (or the flattened input).
    let limit = match a {
        Some(a) => x.dims[a].as_known(),
        None => prod(&x.dims)?.as_known(),
    };
    let kept = match (cx.ints(1), limit) {
        (Some(v), Some(l)) => {
            let l = usize::try_from(l).unwrap_or(usize::MAX);
            Dim::known(v.iter().take(l).filter(|b| **b != 0).count() as i64)
        }
        _ => cx.fresh(),
    };
    let dims = match a {
        Some(a) => {
            let mut d = x.dims.clone();
            d[a] = kept;
            d
        }
        None => vec![kept],
    };
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn unique(cx: &mut Cx<'_, '_, '_>, ax: Option<i64>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let u = cx.fresh();
    let (y, inverse) = match ax {
        None => (vec![u.clone()], prod(&x.dims)?),
        Some(a) => {
            let a = axis(a, x.rank())?;
            let mut d = x.dims.clone();
            d[a] = u.clone();
            (d, x.dims[a].clone())
        }
    };
    Ok(vec![
        Res::new(x.dtype, y),
        Res::new(DType::I64, vec![u.clone()]),
        Res::new(DType::I64, vec![inverse]),
        Res::new(DType::I64, vec![u]),
    ])
}

pub(super) fn reverse_sequence(cx: &mut Cx<'_, '_, '_>, batch: i64, time: i64) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    cx.int_ty(1, "sequence_lens")?;
    if x.rank() < 2 {
        return Err(format!("x must have rank at least 2, got {}", x.rank()));
    }
    if !matches!((batch, time), (0, 1) | (1, 0)) {
        return Err(format!(
            "batch_axis {batch} and time_axis {time} must be 0 and 1 in some order"
        ));
    }
    Ok(vec![Res::of(x)])
}

pub(super) fn eye_like(cx: &mut Cx<'_, '_, '_>, dtype: DType) -> R {
    cx.arity(1, 1)?;
    let x = cx.ranked(0, 2, "x")?;
    Ok(vec![Res::new(dtype, x.dims.clone())])
}

pub(super) fn non_max_suppression(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 5)?;
    cx.ranked(0, 3, "boxes")?;
    cx.ranked(1, 3, "scores")?;
    let n = cx.fresh();
    Ok(vec![Res::new(DType::I64, vec![n, Dim::known(3)])])
}
