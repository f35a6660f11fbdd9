//! The ops that read LLM weights in any [`WeightFormat`]: `linear`, `embedding`, `moe_ffn`.

use super::cx::{Cx, Res, R};
use crate::{DType, Dim, TensorType, WeightFormat};

/// Checks that operand `i` stores a matrix of `format` and returns its logical trailing dims
/// `(rows..., values)`: the stored dims with the last one converted from bytes to values for
/// block formats. `lead` is how many dims come before the `[rows, cols]` pair (the experts
/// axis of `moe_ffn`).
fn weight_dims(
    cx: &Cx<'_, '_, '_>,
    i: usize,
    format: WeightFormat,
    lead: usize,
    what: &str,
) -> Result<Vec<Dim>, String> {
    let w = cx.ranked(i, lead + 2, what)?;
    if w.dtype != format.storage_dtype() {
        return Err(format!(
            "{what} (operand {i}) in format {} must be stored as {}, got {}",
            format.word(),
            format.storage_dtype(),
            w.dtype
        ));
    }
    let mut dims = w.dims.clone();
    if format.is_block() {
        let last = dims.last().expect("rank >= 2").clone();
        let Some(bytes) = last.as_known() else {
            return Err(format!(
                "{what} (operand {i}) in block format {} needs a static row size, got {last}",
                format.word()
            ));
        };
        let values = format.row_values(bytes as usize).ok_or_else(|| {
            format!(
                "{what} (operand {i}): a row of {bytes} bytes is not a whole number of {} \
                 blocks ({} bytes each)",
                format.word(),
                format.block_bytes()
            )
        })?;
        *dims.last_mut().expect("rank >= 2") = Dim::known(values as i64);
    }
    Ok(dims)
}

/// Requires `a == b` when both are known (symbols are taken on trust, as elsewhere).
fn same(a: &Dim, b: &Dim, what: impl Fn() -> String) -> Result<(), String> {
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) if x != y => Err(format!("{}: {x} vs {y}", what())),
        _ if a.as_known().is_none() && b.as_known().is_none() && a != b => {
            Err(format!("{}: {a} vs {b}", what()))
        }
        _ => Ok(()),
    }
}

fn f32_operand<'i>(cx: &Cx<'_, 'i, '_>, i: usize, what: &str) -> Result<&'i TensorType, String> {
    let t = cx.ty(i)?;
    if t.dtype != DType::F32 {
        return Err(format!("{what} (operand {i}) must be f32, got {}", t.dtype));
    }
    Ok(t)
}

/// `linear{format}(x[..., K], w, bias?) -> f32[..., N]`.
pub(super) fn linear(cx: &mut Cx<'_, '_, '_>, format: WeightFormat) -> R {
    cx.arity(2, 3)?;
    let x = f32_operand(cx, 0, "x")?;
    if x.rank() == 0 {
        return Err("x must have rank at least 1".into());
    }
    let w = weight_dims(cx, 1, format, 0, "w")?;
    let (n, k) = (&w[0], &w[1]);
    same(&x.dims[x.rank() - 1], k, || {
        "linear: x's last dim and w's columns differ".into()
    })?;
    if cx.present(2) {
        let b = f32_operand(cx, 2, "bias")?;
        if b.rank() != 1 {
            return Err(format!("bias must have rank 1, got {}", b.rank()));
        }
        same(&b.dims[0], n, || "linear: bias and w's rows differ".into())?;
    }
    let mut dims = x.dims.clone();
    *dims.last_mut().expect("rank >= 1") = n.clone();
    Ok(vec![Res::new(DType::F32, dims)])
}

/// `embedding{format}(table[V, H], ids) -> f32[ids..., H]`.
pub(super) fn embedding(cx: &mut Cx<'_, '_, '_>, format: WeightFormat) -> R {
    cx.arity(2, 2)?;
    let table = weight_dims(cx, 0, format, 0, "table")?;
    let ids = cx.ty(1)?;
    if !matches!(ids.dtype, DType::I32 | DType::I64) {
        return Err(format!(
            "ids (operand 1) must be i32 or i64, got {}",
            ids.dtype
        ));
    }
    let mut dims = ids.dims.clone();
    dims.push(table[1].clone());
    Ok(vec![Res::new(DType::F32, dims)])
}

/// `moe_ffn(x[T, H], logits[T, E], gate[E, F, H], up[E, F, H], down[E, H, F]) -> f32[T, H]`.
pub(super) fn moe_ffn(cx: &mut Cx<'_, '_, '_>, top_k: i64, formats: [WeightFormat; 3]) -> R {
    cx.arity(5, 5)?;
    let x = f32_operand(cx, 0, "x")?;
    let logits = f32_operand(cx, 1, "router_logits")?;
    if x.rank() != 2 || logits.rank() != 2 {
        return Err(format!(
            "moe_ffn: x and router_logits must have rank 2, got {} and {}",
            x.rank(),
            logits.rank()
        ));
    }
    let gate = weight_dims(cx, 2, formats[0], 1, "gate")?;
    let up = weight_dims(cx, 3, formats[1], 1, "up")?;
    let down = weight_dims(cx, 4, formats[2], 1, "down")?;
    let (t, h, e) = (&x.dims[0], &x.dims[1], &logits.dims[1]);
    same(&logits.dims[0], t, || {
        "moe_ffn: x and router_logits have different token counts".into()
    })?;
    for (w, name) in [(&gate, "gate"), (&up, "up"), (&down, "down")] {
        same(&w[0], e, || {
            format!("moe_ffn: {name}'s experts and router_logits' experts differ")
        })?;
    }
    same(&gate[2], h, || {
        "moe_ffn: gate's columns and x's hidden size differ".into()
    })?;
    same(&up[1], &gate[1], || {
        "moe_ffn: up's rows and gate's rows differ".into()
    })?;
    same(&up[2], h, || {
        "moe_ffn: up's columns and x's hidden size differ".into()
    })?;
    same(&down[1], h, || {
        "moe_ffn: down's rows and x's hidden size differ".into()
    })?;
    same(&down[2], &gate[1], || {
        "moe_ffn: down's columns and gate's rows differ".into()
    })?;
    let experts = e.as_known();
    if top_k < 1 || experts.is_some_and(|e| top_k > e) {
        return Err(format!(
            "moe_ffn: top_k {top_k} must be in 1..={}",
            experts.map_or("experts".to_string(), |e| e.to_string())
        ));
    }
    Ok(vec![Res::new(DType::F32, vec![t.clone(), h.clone()])])
}
