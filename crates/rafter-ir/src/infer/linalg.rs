//! Contractions: MatMul, Gemm, Einsum, quantisation, Attention.

use super::arith;
use super::cx::{Cx, Res, R};
use crate::{DType, Dim, TensorType};
use std::collections::BTreeMap;

/// Two dims that must be equal: an error when both are known and differ; otherwise the
/// known one (or the first).
fn unify(a: &Dim, b: &Dim, what: impl Fn() -> String) -> Result<Dim, String> {
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) if x != y => Err(format!("{}: {x} vs {y}", what())),
        (None, Some(_)) => Ok(b.clone()),
        _ => Ok(a.clone()),
    }
}

/// NumPy matmul of shapes `a` and `b` (1-D promotion, broadcast batch dims).
pub(super) fn matmul_dims(
    cx: &mut Cx<'_, '_, '_>,
    a: &[Dim],
    b: &[Dim],
) -> Result<Vec<Dim>, String> {
    if a.is_empty() || b.is_empty() {
        return Err("matmul operands must have rank at least 1".into());
    }
    let one = Dim::known(1);
    let (a2, a_vec) = if a.len() == 1 {
        (vec![one.clone(), a[0].clone()], true)
    } else {
        (a.to_vec(), false)
    };
    let (b2, b_vec) = if b.len() == 1 {
        (vec![b[0].clone(), one], true)
    } else {
        (b.to_vec(), false)
    };
    let (ra, rb) = (a2.len(), b2.len());
    unify(&a2[ra - 1], &b2[rb - 2], || {
        "matmul: inner dims differ".to_string()
    })?;
    let mut out = cx.broadcast(&[(0, &a2[..ra - 2]), (1, &b2[..rb - 2])])?;
    if !a_vec {
        out.push(a2[ra - 2].clone());
    }
    if !b_vec {
        out.push(b2[rb - 1].clone());
    }
    Ok(out)
}

/// MatMul (dtype of a) and MatMulInteger (i32).
pub(super) fn matmul(cx: &mut Cx<'_, '_, '_>, integer: Option<DType>) -> R {
    cx.arity(2, if integer.is_some() { 4 } else { 2 })?;
    let (a, b) = (cx.ty(0)?, cx.ty(1)?);
    if integer.is_none() && a.dtype != b.dtype {
        return Err(format!(
            "operand dtypes differ: {} and {}",
            a.dtype, b.dtype
        ));
    }
    let dims = matmul_dims(cx, &a.dims, &b.dims)?;
    Ok(vec![Res::new(integer.unwrap_or(a.dtype), dims)])
}

/// MatMulBlockQuant: `a [..., k]` times the packed `[n, k]` weight, transposed.
pub(super) fn matmul_block_quant(
    cx: &mut Cx<'_, '_, '_>,
    k: i64,
    n: i64,
    bits: i64,
    block_size: i64,
) -> R {
    cx.arity(3, 5)?;
    if !matches!(bits, 2 | 4 | 8) || block_size <= 0 || k <= 0 || n <= 0 {
        return Err(format!(
            "bits {bits} (want 2, 4 or 8), block_size {block_size}, k {k}, n {n}"
        ));
    }
    let a = cx.ty(0)?;
    let r = a.rank();
    if a.dtype != DType::F32 || r == 0 {
        return Err(format!("a must be f32 [..., {k}], got {a}"));
    }
    unify(&a.dims[r - 1], &Dim::known(k), || {
        format!("a {a}: last dim is not k = {k}")
    })?;
    let k_blocks = k / block_size + i64::from(k % block_size != 0);
    let sizes = n
        .checked_mul(k_blocks)
        .and_then(|nk| Some((nk, nk.checked_mul(block_size)?.checked_mul(bits)? / 8)));
    let Some((n_blocks, want_b)) = sizes else {
        return Err(format!("k {k}, n {n}, block_size {block_size}: too large"));
    };
    let b = cx.ty(1)?;
    if b.dtype != DType::U8 || b.num_elements().as_known().is_some_and(|e| e != want_b) {
        return Err(format!("b must be u8 with {want_b} elements, got {b}"));
    }
    let scales = cx.ty(2)?;
    if scales.dtype != DType::F32
        || scales
            .num_elements()
            .as_known()
            .is_some_and(|e| e != n_blocks)
    {
        return Err(format!(
            "scales must be f32 with {n_blocks} elements, got {scales}"
        ));
    }
    if let Some(z) = cx.opt_ty(3) {
        let per_byte = 8 / bits;
        let want = n.saturating_mul(k_blocks / per_byte + i64::from(k_blocks % per_byte != 0));
        if z.dtype != DType::U8 || z.num_elements().as_known().is_some_and(|e| e != want) {
            return Err(format!(
                "zero_points must be u8 with {want} elements, got {z}"
            ));
        }
    }
    if let Some(bias) = cx.opt_ty(4) {
        if bias.dtype != DType::F32 || bias.num_elements().as_known().is_some_and(|e| e != n) {
            return Err(format!("bias must be f32 [{n}], got {bias}"));
        }
    }
    let mut dims = a.dims[..r - 1].to_vec();
    dims.push(Dim::known(n));
    Ok(vec![Res::new(DType::F32, dims)])
}

pub(super) fn gemm(cx: &mut Cx<'_, '_, '_>, trans_a: bool, trans_b: bool) -> R {
    cx.arity(2, 3)?;
    let a = cx.ranked(0, 2, "a")?;
    let b = cx.ranked(1, 2, "b")?;
    let (m, ka) = if trans_a {
        (&a.dims[1], &a.dims[0])
    } else {
        (&a.dims[0], &a.dims[1])
    };
    let (kb, n) = if trans_b {
        (&b.dims[1], &b.dims[0])
    } else {
        (&b.dims[0], &b.dims[1])
    };
    unify(ka, kb, || "gemm: inner dims differ".to_string())?;
    let dims = vec![m.clone(), n.clone()];
    if let Some(c) = cx.opt_ty(2) {
        if c.rank() > 2 {
            return Err(format!("c must have rank at most 2, got {}", c.rank()));
        }
        // c broadcasts to [m, n] unidirectionally: each of its dims is 1 or the target's.
        let off = 2 - c.rank();
        for (j, cd) in c.dims.iter().enumerate() {
            if let (Some(x), Some(y)) = (cd.as_known(), dims[off + j].as_known()) {
                if x != 1 && x != y {
                    return Err(format!("c of shape {c} does not broadcast to [{m}, {n}]"));
                }
            }
        }
    }
    Ok(vec![Res::new(a.dtype, dims)])
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Letter(char),
    Ellipsis,
}

fn parse_term(t: &str) -> Result<Vec<Label>, String> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("...") {
            if out.contains(&Label::Ellipsis) {
                return Err(format!("einsum: term `{t}` has two ellipses"));
            }
            out.push(Label::Ellipsis);
            rest = r;
        } else if c.is_ascii_alphabetic() {
            out.push(Label::Letter(c));
            rest = &rest[1..];
        } else {
            return Err(format!("einsum: bad character `{c}` in term `{t}`"));
        }
    }
    Ok(out)
}

pub(super) fn einsum(cx: &mut Cx<'_, '_, '_>, equation: &str) -> R {
    cx.arity(1, usize::MAX)?;
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<Vec<Label>> = lhs.split(',').map(parse_term).collect::<Result<_, _>>()?;
    if terms.len() != cx.len() {
        return Err(format!(
            "einsum: equation has {} input terms, node has {} operands",
            terms.len(),
            cx.len()
        ));
    }
    let mut letters: BTreeMap<char, Dim> = BTreeMap::new();
    let mut counts: BTreeMap<char, usize> = BTreeMap::new();
    let mut ellipses: Vec<(usize, Vec<Dim>)> = Vec::new();
    let mut dtype = None;
    for (i, term) in terms.iter().enumerate() {
        let t = cx.ty(i)?;
        dtype.get_or_insert(t.dtype);
        let n_letters = term.iter().filter(|l| **l != Label::Ellipsis).count();
        let has_ell = term.contains(&Label::Ellipsis);
        let ell_rank = if has_ell {
            t.rank().checked_sub(n_letters).ok_or_else(|| {
                format!(
                    "einsum: operand {i} has rank {}, term needs at least {n_letters}",
                    t.rank()
                )
            })?
        } else if t.rank() != n_letters {
            return Err(format!(
                "einsum: operand {i} has rank {}, term has {n_letters} labels",
                t.rank()
            ));
        } else {
            0
        };
        let mut p = 0;
        for l in term {
            match *l {
                Label::Ellipsis => {
                    ellipses.push((i, t.dims[p..p + ell_rank].to_vec()));
                    p += ell_rank;
                }
                Label::Letter(c) => {
                    let d = &t.dims[p];
                    *counts.entry(c).or_default() += 1;
                    let merged = match letters.get(&c) {
                        None => d.clone(),
                        Some(prev) if prev == d || d.as_known() == Some(1) => prev.clone(),
                        Some(prev) if prev.as_known() == Some(1) => d.clone(),
                        Some(prev) => unify(prev, d, || format!("einsum: label `{c}` has sizes"))?,
                    };
                    letters.insert(c, merged);
                    p += 1;
                }
            }
        }
    }
    let ell_shapes: Vec<(usize, &[Dim])> =
        ellipses.iter().map(|(i, d)| (*i, d.as_slice())).collect();
    let ell = cx.broadcast(&ell_shapes)?;
    let out_labels: Vec<Label> = match rhs {
        Some(r) => {
            let o = parse_term(r)?;
            for (k, l) in o.iter().enumerate() {
                if let Label::Letter(c) = l {
                    if !letters.contains_key(c) {
                        return Err(format!("einsum: output label `{c}` is not in any input"));
                    }
                    if o[..k].contains(l) {
                        return Err(format!("einsum: output label `{c}` is repeated"));
                    }
                }
            }
            o
        }
        None => {
            let mut o = vec![Label::Ellipsis];
            o.extend(
                counts
                    .iter()
                    .filter(|(_, n)| **n == 1)
                    .map(|(c, _)| Label::Letter(*c)),
            );
            o
        }
    };
    let mut dims = Vec::new();
    for l in out_labels {
        match l {
            Label::Ellipsis => dims.extend(ell.iter().cloned()),
            Label::Letter(c) => dims.push(letters[&c].clone()),
        }
    }
    Ok(vec![Res::new(dtype.unwrap_or(DType::F32), dims)])
}

/// QuantizeLinear: x, y_scale, y_zero_point?. The zero point's dtype wins when present
/// (ONNX: output_dtype must then match it; without either the output is u8).
pub(super) fn quantize(cx: &mut Cx<'_, '_, '_>, output_dtype: DType) -> R {
    cx.arity(2, 3)?;
    let x = cx.ty(0)?;
    cx.ty(1)?;
    let dtype = cx.opt_ty(2).map_or(output_dtype, |z| z.dtype);
    Ok(vec![Res::new(dtype, x.dims.clone())])
}

/// DequantizeLinear: the result has the scale's (float) dtype.
pub(super) fn dequantize(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 3)?;
    let x = cx.ty(0)?;
    let scale = cx.ty(1)?;
    Ok(vec![Res::new(scale.dtype, x.dims.clone())])
}

pub(super) fn dynamic_quantize(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    Ok(vec![
        Res::new(DType::U8, x.dims.clone()),
        Res::new(DType::F32, vec![]),
        Res::new(DType::U8, vec![]),
    ])
}

/// `hidden / heads` for packed 3-D attention inputs.
fn head_size(
    cx: &mut Cx<'_, '_, '_>,
    hidden: &Dim,
    heads: &Dim,
    what: &str,
) -> Result<Dim, String> {
    if let Some(h) = arith::div_exact(hidden, heads) {
        return Ok(h);
    }
    if hidden.is_known() && heads.is_known() {
        return Err(format!(
            "{what} hidden size {hidden} is not divisible by {heads} heads"
        ));
    }
    Ok(cx.fresh())
}

/// The (batch, heads, seq, head_size) view of one attention input.
fn heads_view(
    cx: &mut Cx<'_, '_, '_>,
    t: &TensorType,
    i: usize,
    heads_attr: i64,
    what: &str,
) -> Result<[Dim; 4], String> {
    match t.rank() {
        3 => {
            if heads_attr <= 0 {
                return Err(format!(
                    "3-D {what} (operand {i}) needs a positive head count attribute, got {heads_attr}"
                ));
            }
            let heads = Dim::known(heads_attr);
            let hs = head_size(cx, &t.dims[2], &heads, what)?;
            Ok([t.dims[0].clone(), heads, t.dims[1].clone(), hs])
        }
        4 => Ok([
            t.dims[0].clone(),
            t.dims[1].clone(),
            t.dims[2].clone(),
            t.dims[3].clone(),
        ]),
        r => Err(format!(
            "{what} (operand {i}) must have rank 3 or 4, got {r}"
        )),
    }
}

/// ONNX Attention (opset 23). Results: y, present_key, present_value, qk_matmul_output.
pub(super) fn attention(cx: &mut Cx<'_, '_, '_>, q_heads: i64, kv_heads: i64) -> R {
    cx.arity(3, 7)?;
    let (q, k, v) = (cx.ty(0)?, cx.ty(1)?, cx.ty(2)?);
    let [batch, qh, q_seq, head] = heads_view(cx, q, 0, q_heads, "q")?;
    let [_, kh, kv_seq, k_head] = heads_view(cx, k, 1, kv_heads, "k")?;
    let [_, vh, v_seq, v_head] = heads_view(cx, v, 2, kv_heads, "v")?;
    unify(&head, &k_head, || {
        "attention: q and k head sizes differ".into()
    })?;
    unify(&kh, &vh, || "attention: k and v head counts differ".into())?;
    if let (Some(a), Some(b)) = (qh.as_known(), kh.as_known()) {
        if b == 0 || a % b != 0 {
            return Err(format!(
                "attention: {a} query heads are not a multiple of {b} key/value heads"
            ));
        }
    }
    // With a cache, present = past ++ current along the sequence axis.
    let total = |cx: &Cx<'_, '_, '_>, past: usize, cur: &Dim| -> Result<Dim, String> {
        match cx.opt_ty(past) {
            Some(p) if p.rank() == 4 => super::cx::ck(arith::add(&p.dims[2], cur)),
            Some(p) => Err(format!(
                "past (operand {past}) must have rank 4, got {}",
                p.rank()
            )),
            None => Ok(cur.clone()),
        }
    };
    let total_k = total(cx, 4, &kv_seq)?;
    let total_v = total(cx, 5, &v_seq)?;
    let y = if q.rank() == 3 {
        vec![
            batch.clone(),
            q_seq.clone(),
            super::cx::ck(arith::mul(&qh, &v_head))?,
        ]
    } else {
        vec![batch.clone(), qh.clone(), q_seq.clone(), v_head.clone()]
    };
    Ok(vec![
        Res::new(q.dtype, y),
        Res::new(
            k.dtype,
            vec![batch.clone(), kh.clone(), total_k.clone(), k_head],
        ),
        Res::new(v.dtype, vec![batch.clone(), kh, total_v, v_head]),
        Res::new(q.dtype, vec![batch, qh, q_seq, total_k]),
    ])
}
