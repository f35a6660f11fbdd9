//! ONNX Runtime's attention contrib ops (`com.microsoft`): Attention (packed QKV
//! weights) and QAttention (the same with int8 input and weights), MultiHeadAttention, GroupQueryAttention and RotaryEmbedding, lowered at
//! import onto the IR's `attention` and `rotary_embedding` ops (ONNX Attention-23 and
//! RotaryEmbedding-23 semantics) with ORT's masks rewritten as additive biases.

use super::registry::OnnxOp;
use super::{Tr, R};
use crate::node::NodeView;
use crate::ImportError;
use rafter_ir::{BinaryOp, ConstData, DType, Op, ValueId};

/// ORT's default `mask_filter_value`: what a masked score gets added.
const MASK_FILTER: f32 = -10000.0;

/// The attention contrib ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("Attention", packed_attention).checked(check_packed_attention),
    OnnxOp::new("QAttention", quantized_attention).checked(check_shared_buffers),
    OnnxOp::new("MultiHeadAttention", multi_head_attention),
    OnnxOp::new("RotaryEmbedding", rotary_embedding).checked(check_rotary),
    OnnxOp::new("GroupQueryAttention", group_query_attention).checked(check_gqa),
];

fn check_gqa(n: &NodeView<'_>) -> Result<(), String> {
    for a in ["smooth_softmax", "qk_output"] {
        if n.attr(a).is_some_and(|a| a.i != 0) {
            return Err(format!("unsupported: {a}={}", n.attr(a).map_or(0, |a| a.i)));
        }
    }
    if n.input_name(11).is_some() {
        return Err("unsupported: head_sink".into());
    }
    if n.has_output(3) {
        return Err("unsupported: the output_qk output".into());
    }
    Ok(())
}

fn check_shared_buffers(n: &NodeView<'_>) -> Result<(), String> {
    for a in ["do_rotary", "past_present_share_buffer"] {
        if n.attr(a).is_some_and(|a| a.i != 0) {
            return Err(format!("unsupported: {a}=1"));
        }
    }
    Ok(())
}

fn check_packed_attention(n: &NodeView<'_>) -> Result<(), String> {
    check_shared_buffers(n)?;
    if n.input_name(6).is_some() {
        return Err("unsupported: past_sequence_length (shared past/present buffer)".into());
    }
    Ok(())
}

fn check_rotary(n: &NodeView<'_>) -> Result<(), String> {
    if n.attr("is_packed_batching").is_some_and(|a| a.i != 0) {
        return Err("unsupported: is_packed_batching=1".into());
    }
    if n.attr("scale").is_some_and(|a| a.f != 1.0) {
        return Err("unsupported: scale other than 1".into());
    }
    Ok(())
}

/// The ONNX `Attention` op that com.microsoft's `Attention` and `MultiHeadAttention` lower
/// to: as many key/value heads as query heads, causal when `unidirectional` is set.
fn mha_op(n: &NodeView<'_>, heads: i64) -> Result<Op, ImportError> {
    Ok(Op::Attention {
        is_causal: n.flag("unidirectional", false)?,
        kv_num_heads: heads,
        q_num_heads: heads,
        qk_matmul_output_mode: 0,
        scale: n.f_opt("scale")?,
        softcap: 0.0,
        left_window_size: -1,
        right_window_size: -1,
    })
}

/// `Attention`: `input @ weights (+ bias)` split into Q, K, V (sizes `qkv_hidden_sizes`,
/// else three equal parts), then multi-head attention. `mask_index` is a 1-D `[batch]`
/// key length (right padding), a 2-D `[batch, total]` or 3-D `[batch, seq, total]` 0/1
/// mask; `past`/`present` pack keys and values as `[2, batch, heads, seq, head]`.
fn packed_attention(t: &mut Tr<'_, '_, '_>) -> R {
    let (x, w, bias) = (t.req(0)?, t.req(1)?, t.inp(2)?);
    let (mask, past, attn_bias) = (t.inp(3)?, t.inp(4)?, t.inp(5)?);
    let mut proj = t.tmp("qkv", Op::MatMul, vec![Some(x), Some(w)])?;
    if let Some(b) = bias {
        proj = t.bin("qkv_bias", BinaryOp::Add, proj, b)?;
    }
    attention_of_projection(t, proj, w, mask, past, attn_bias)
}

/// `QAttention` (input, weight, bias, input_scale, weight_scale, mask_index?,
/// input_zero_point?, weight_zero_point?, past?): `Attention` whose projection is the
/// integer product `(input - izp) @ (weight - wzp)` times `input_scale * weight_scale`
/// (per tensor or per column) plus the float bias, as ORT's kernel (MLAS's scale-bias
/// output processor) computes it.
fn quantized_attention(t: &mut Tr<'_, '_, '_>) -> R {
    let (x, w, bias) = (t.req(0)?, t.req(1)?, t.req(2)?);
    let (x_scale, w_scale) = (t.req(3)?, t.req(4)?);
    let (mask, x_zp, w_zp, past) = (t.inp(5)?, t.inp(6)?, t.inp(7)?, t.inp(8)?);
    let x_zp = match (x_zp, w_zp) {
        (None, Some(_)) => Some(t.zero_like("input_zero", x)?),
        _ => x_zp,
    };
    let ins = super::trim(vec![Some(x), Some(w), x_zp, w_zp]);
    let acc = t.tmp("qkv_integer", Op::MatMulInteger, ins)?;
    let f = t.tmp("qkv_float", Op::Cast { to: DType::F32 }, vec![Some(acc)])?;
    let scale = t.bin("dequant_scale", BinaryOp::Mul, w_scale, x_scale)?;
    let scaled = t.bin("qkv_scaled", BinaryOp::Mul, f, scale)?;
    let proj = t.bin("qkv_bias", BinaryOp::Add, scaled, bias)?;
    attention_of_projection(t, proj, w, mask, past, None)
}

/// The rest of `Attention` and `QAttention` once `proj = input @ weights + bias` is
/// computed (`w`: the weights, for their column count).
fn attention_of_projection(
    t: &mut Tr<'_, '_, '_>,
    proj: ValueId,
    w: ValueId,
    mask: Option<ValueId>,
    past: Option<ValueId>,
    attn_bias: Option<ValueId>,
) -> R {
    let n = t.n;
    let heads = n.i_req("num_heads")?;
    n.i("rotary_embedding_dim", 0)?;
    n.i("do_rotary", 0)?;
    n.i("past_present_share_buffer", 0)?;
    let total = t.ty(w).dims.last().and_then(|d| d.as_known());
    let sizes = match n.ints("qkv_hidden_sizes")? {
        Some(s) if !s.is_empty() => s,
        _ => match total {
            Some(d) if d % 3 == 0 => vec![d / 3; 3],
            _ => {
                return Err(n.unsupported(format!(
                    "unsupported: weights {} without qkv_hidden_sizes",
                    t.ty(w)
                )));
            }
        },
    };
    if sizes.len() != 3 {
        return Err(n.invalid(format!("qkv_hidden_sizes {sizes:?} is not 3 sizes")));
    }
    let (q_end, k_end) = (sizes[0], sizes[0] + sizes[1]);
    let q = t.slice_axis("q", proj, -1, 0, q_end)?;
    let k = t.slice_axis("k", proj, -1, q_end, k_end)?;
    let v = t.slice_axis("v", proj, -1, k_end, k_end + sizes[2])?;
    let (past_k, past_v) = match past {
        Some(p) => {
            let (i0, i1) = (t.i64_scalar("zero", 0), t.i64_scalar("one", 1));
            let pk = t.tmp("past_key", Op::Gather { axis: 0 }, vec![Some(p), Some(i0)])?;
            let pv = t.tmp(
                "past_value",
                Op::Gather { axis: 0 },
                vec![Some(p), Some(i1)],
            )?;
            (Some(pk), Some(pv))
        }
        None => (None, None),
    };
    let filter = n.f("mask_filter_value", MASK_FILTER)?;
    let (additive, nonpad) = t.attention_masks(mask, attn_bias, filter, q, past.is_some())?;
    let want_present = n.has_output(1);
    let y_name = n.out_names().into_iter().next().flatten();
    let present_names = |s: &str| want_present.then(|| format!("{}/{s}", n.name));
    let ids = t.cx.emit(
        t.sc,
        n,
        n.name.clone(),
        mha_op(n, heads)?,
        super::trim(vec![
            Some(q),
            Some(k),
            Some(v),
            additive,
            past_k,
            past_v,
            nonpad,
        ]),
        vec![
            y_name.clone(),
            present_names("present_key"),
            present_names("present_value"),
        ],
    )?;
    if let (Some(name), Some(y)) = (y_name, ids[0]) {
        t.sc.names.insert(name, y);
    }
    if want_present {
        let (pk, pv) = (ids[1].expect("requested"), ids[2].expect("requested"));
        let pk = t.tmp("present_k", Op::Unsqueeze { axes: vec![0] }, vec![Some(pk)])?;
        let pv = t.tmp("present_v", Op::Unsqueeze { axes: vec![0] }, vec![Some(pv)])?;
        let name = n.out_names()[1].clone();
        t.finish_outs(Op::Concat { axis: 0 }, vec![Some(pk), Some(pv)], vec![name])?;
    }
    Ok(())
}

/// `MultiHeadAttention` with separate 3-D query, key and value (`[batch, seq, hidden]`),
/// an optional packed bias `[3 * hidden]`, key padding mask (`[batch]` lengths or
/// `[batch, kv_seq]` 0/1), additive attention bias, and 4-D past/present keys and values.
fn multi_head_attention(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let heads = n.i_req("num_heads")?;
    let q = t.req(0)?;
    let (Some(k), Some(v)) = (t.inp(1)?, t.inp(2)?) else {
        return Err(n.unsupported("unsupported: packed QKV / KV (key or value absent)"));
    };
    if t.rank(q) != 3 || t.rank(k) != 3 || t.rank(v) != 3 {
        return Err(n.unsupported(format!(
            "unsupported: query {}, key {}, value {} (only 3-D [batch, seq, hidden] each)",
            t.ty(q),
            t.ty(k),
            t.ty(v)
        )));
    }
    let (bias, mask, attn_bias) = (t.inp(3)?, t.inp(4)?, t.inp(5)?);
    let (past_k, past_v) = (t.inp(6)?, t.inp(7)?);
    if t.inp(8)?.is_some() || t.inp(9)?.is_some() {
        return Err(n.unsupported(
            "unsupported: past_sequence_length / cache_indirection (shared buffers, beam search)",
        ));
    }
    let (mut q, mut k, mut v) = (q, k, v);
    if let Some(b) = bias {
        let d = |t: &Tr<'_, '_, '_>, x: ValueId| t.ty(x).dims.last().and_then(|d| d.as_known());
        let (Some(dq), Some(dk), Some(dv)) = (d(t, q), d(t, k), d(t, v)) else {
            return Err(n.unsupported("unsupported: bias with hidden sizes unknown at import"));
        };
        let bq = t.slice_axis("bias_q", b, 0, 0, dq)?;
        let bk = t.slice_axis("bias_k", b, 0, dq, dq + dk)?;
        let bv = t.slice_axis("bias_v", b, 0, dq + dk, dq + dk + dv)?;
        q = t.bin("q_bias", BinaryOp::Add, q, bq)?;
        k = t.bin("k_bias", BinaryOp::Add, k, bk)?;
        v = t.bin("v_bias", BinaryOp::Add, v, bv)?;
    }
    let filter = n.f("mask_filter_value", MASK_FILTER)?;
    let (additive, nonpad) = t.attention_masks(mask, attn_bias, filter, q, past_k.is_some())?;
    let outs = n.out_names();
    if outs.len() > 3 && outs[3].is_some() {
        return Err(n.unsupported("unsupported: the qk output"));
    }
    t.finish_outs(
        mha_op(n, heads)?,
        super::trim(vec![
            Some(q),
            Some(k),
            Some(v),
            additive,
            past_k,
            past_v,
            nonpad,
        ]),
        outs.into_iter().take(3).collect(),
    )
}

/// `GroupQueryAttention`: `num_heads` query heads over `kv_num_heads` key/value heads,
/// causal, with a past key/value (`[batch, kv_heads, past, head]`) the new keys and values
/// are appended to (`present_*`), optional rotary embedding of Q and K at positions
/// `seqlens_k + 1 - seq + 0..seq`, a local (sliding) window, softcap and an additive
/// attention bias. Q, K, V come separately or packed in `query`.
///
/// Lowered for batches whose sequences all have the same length: the past buffer is taken
/// as fully valid (`past = total_sequence_length - seq`, i.e. `seqlens_k[b] =
/// total_sequence_length - 1` for every `b`). ORT's ragged batches (shorter sequences
/// right-padded inside the past buffer) are not represented: rafter does not detect them.
fn group_query_attention(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let heads = n.i_req("num_heads")?;
    let kv_heads = n.i_req("kv_num_heads")?;
    let q = t.req(0)?;
    let (mut k, mut v) = (t.inp(1)?, t.inp(2)?);
    let (past_k, past_v) = (t.inp(3)?, t.inp(4)?);
    let seqlens = t.req(5)?;
    t.req(6)?;
    let (cos, sin, pos_ids, attn_bias) = (t.inp(7)?, t.inp(8)?, t.inp(9)?, t.inp(10)?);
    n.i("smooth_softmax", 0)?;
    n.i("qk_output", 0)?;
    if t.rank(q) != 3 {
        return Err(n.unsupported(format!("unsupported: query {} (want 3-D)", t.ty(q))));
    }
    let mut q = q;
    if k.is_none() {
        // Packed QKV: [batch, seq, (heads + 2 kv_heads) * head].
        let Some(d) = t.ty(q).dims[2].as_known() else {
            return Err(n.unsupported("unsupported: packed QKV of unknown width"));
        };
        let per = heads + 2 * kv_heads;
        if d % per != 0 {
            return Err(n.invalid(format!("packed QKV width {d} is not a multiple of {per}")));
        }
        let h = d / per;
        let packed = q;
        q = t.slice_axis("q", packed, -1, 0, heads * h)?;
        k = Some(t.slice_axis("k", packed, -1, heads * h, (heads + kv_heads) * h)?);
        v = Some(t.slice_axis("v", packed, -1, (heads + kv_heads) * h, d)?);
    }
    let (Some(mut k), Some(v)) = (k, v) else {
        return Err(n.invalid("key without value"));
    };
    if n.flag("do_rotary", false)? {
        let (Some(cos), Some(sin)) = (cos, sin) else {
            return Err(n.invalid("do_rotary=1 without cos_cache and sin_cache"));
        };
        let pos = match pos_ids {
            Some(p) => t.tmp("position_ids", Op::Cast { to: DType::I64 }, vec![Some(p)])?,
            None => {
                // Position of the first new token: seqlens_k + 1 - seq, per batch.
                let sl = t.tmp("seqlens", Op::Cast { to: DType::I64 }, vec![Some(seqlens)])?;
                let one = t.i64_scalar("one_i", 1);
                let total = t.bin("total_len", BinaryOp::Add, sl, one)?;
                let seq = t.tmp(
                    "seq_len",
                    Op::Shape {
                        start: 1,
                        end: Some(2),
                    },
                    vec![Some(q)],
                )?;
                let start = t.bin("start_pos", BinaryOp::Sub, total, seq)?;
                // A right-padded first prompt's short rows start at 0 too (ORT's past_b).
                let zero_s = t.i64_scalar("zero_start", 0);
                let start = t.bin("start_pos0", BinaryOp::Max, start, zero_s)?;
                let start = t.tmp(
                    "start_col",
                    Op::Unsqueeze { axes: vec![1] },
                    vec![Some(start)],
                )?;
                let zero = t.i64_scalar("zero_i", 0);
                let seq0 = t.tmp("seq_scalar", Op::Squeeze { axes: vec![0] }, vec![Some(seq)])?;
                let r = t.tmp("range", Op::Range, vec![Some(zero), Some(seq0), Some(one)])?;
                t.bin("positions", BinaryOp::Add, start, r)?
            }
        };
        let interleaved = n.flag("rotary_interleaved", false)?;
        let rot = |t: &mut Tr<'_, '_, '_>, s: &str, x: ValueId, nh: i64| {
            t.tmp(
                s,
                Op::RotaryEmbedding {
                    interleaved,
                    num_heads: nh,
                    rotary_embedding_dim: 0,
                },
                vec![Some(x), Some(cos), Some(sin), Some(pos)],
            )
        };
        q = rot(t, "q_rotary", q, heads)?;
        k = rot(t, "k_rotary", k, kv_heads)?;
    } else {
        n.flag("rotary_interleaved", false)?;
    }
    let window = n.i("local_window_size", -1)?;
    if t.ty(q).dims[0].as_known() != Some(1) {
        // Sequences of the batch may have different lengths: see `gqa_ragged`.
        if attn_bias.is_some() {
            return Err(
                n.unsupported("unsupported: attention_bias with a batch of per-sequence lengths")
            );
        }
        let sl = t.tmp(
            "rg_seqlens",
            Op::Cast { to: DType::I64 },
            vec![Some(seqlens)],
        )?;
        let past = match (past_k, past_v) {
            (Some(pk), Some(pv)) => Some((pk, pv)),
            (None, None) => None,
            _ => return Err(n.invalid("past_key without past_value or the reverse")),
        };
        let pb = if past.is_some() {
            let one = t.i64_scalar("rg_one_p", 1);
            let zero = t.i64_scalar("rg_zero_p", 0);
            let seq = t.tmp(
                "rg_seq_p",
                Op::Shape {
                    start: 1,
                    end: Some(2),
                },
                vec![Some(q)],
            )?;
            let total = t.bin("rg_total_b", BinaryOp::Add, sl, one)?;
            let start = t.bin("rg_past_b0", BinaryOp::Sub, total, seq)?;
            t.bin("rg_past_b", BinaryOp::Max, start, zero)?
        } else {
            t.bin("rg_past_b", BinaryOp::Sub, sl, sl)?
        };
        let attn = Op::Attention {
            is_causal: false,
            kv_num_heads: kv_heads,
            q_num_heads: heads,
            qk_matmul_output_mode: 0,
            scale: n.f_opt("scale")?.filter(|&s| s != 0.0),
            softcap: n.f("softcap", 0.0)?,
            left_window_size: -1,
            right_window_size: -1,
        };
        return gqa_ragged(t, q, k, v, past, pb, sl, attn, window);
    }
    let outs = n.out_names();
    t.finish_outs(
        Op::Attention {
            is_causal: true,
            kv_num_heads: kv_heads,
            q_num_heads: heads,
            qk_matmul_output_mode: 0,
            scale: n.f_opt("scale")?.filter(|&s| s != 0.0),
            softcap: n.f("softcap", 0.0)?,
            // A window of `w` keys: the query's own position and `w - 1` before it.
            left_window_size: if window > 0 { window - 1 } else { -1 },
            right_window_size: -1,
        },
        super::trim(vec![Some(q), Some(k), Some(v), attn_bias, past_k, past_v]),
        outs.into_iter().take(3).collect(),
    )
}

/// GroupQueryAttention over a batch whose sequences have different lengths (ORT's
/// `seqlens_k` varying across the batch), as ORT's CPU kernel computes it: sequence `b`
/// has `past_b = max(seqlens_k[b] + 1 - S, 0)` cached tokens (0 for a first prompt, whose
/// rows past `seqlens_k[b]` are padding); its `S` new keys and values are written at
/// `past_b..past_b + S` of a present buffer of `max(past length, total_sequence_length)`
/// rows (with no past: the `S` new rows), which keeps the past below `past_b` and is zero
/// above the new rows; query `i` sees keys `j <= past_b + i` and `j <= seqlens_k[b]`
/// (and, with a local window `w`, `j > past_b + i - w`). Lowered to gathers with per-batch
/// indices, an explicit boolean mask and a non-causal IR `attention` over the 3-D
/// `[batch, rows, kv_heads * head]` present buffers.
#[allow(clippy::too_many_arguments)]
fn gqa_ragged(
    t: &mut Tr<'_, '_, '_>,
    q: ValueId,
    k: ValueId,
    v: ValueId,
    past: Option<(ValueId, ValueId)>,
    pb: ValueId,
    sl: ValueId,
    attn: Op,
    window: i64,
) -> R {
    let n = t.n;
    let kv_heads = n.i_req("kv_num_heads")?;
    let Some(d) = t.ty(k).dims.get(2).and_then(|d| d.as_known()) else {
        return Err(n.unsupported("unsupported: key of unknown width with per-batch lengths"));
    };
    if d % kv_heads != 0 {
        return Err(n.invalid(format!(
            "key width {d} is not a multiple of kv_num_heads {kv_heads}"
        )));
    }
    let shape1 = |t: &mut Tr<'_, '_, '_>, s: &str, x: ValueId, axis: i64| -> R<ValueId> {
        let d = t.tmp(
            s,
            Op::Shape {
                start: axis,
                end: Some(axis + 1),
            },
            vec![Some(x)],
        )?;
        t.tmp(
            &format!("{s}_scalar"),
            Op::Squeeze { axes: vec![0] },
            vec![Some(d)],
        )
    };
    let unsq = |t: &mut Tr<'_, '_, '_>, s: &str, x: ValueId, axes: Vec<i64>| {
        t.tmp(s, Op::Unsqueeze { axes }, vec![Some(x)])
    };
    let (zero, one) = (t.i64_scalar("rg_zero", 0), t.i64_scalar("rg_one", 1));
    let seq = shape1(t, "rg_seq", q, 1)?;
    // Rows of the present buffers.
    let rows = match past {
        Some((pk, _)) => {
            let pp = shape1(t, "rg_past_len", pk, 2)?;
            let total = t.req(6)?;
            let total = t.tmp("rg_total", Op::Cast { to: DType::I64 }, vec![Some(total)])?;
            let scalar = t.i64_const("rg_scalar_shape", &[]);
            let total = t.tmp(
                "rg_total_scalar",
                Op::Reshape { allow_zero: false },
                vec![Some(total), Some(scalar)],
            )?;
            Some((pp, t.bin("rg_rows", BinaryOp::Max, pp, total)?))
        }
        None => None,
    };
    let p = rows.map_or(seq, |(_, r)| r);
    let cols = t.tmp("rg_cols", Op::Range, vec![Some(zero), Some(p), Some(one)])?;
    let pb2 = unsq(t, "rg_past_col", pb, vec![1])?;
    let rel = t.bin("rg_rel", BinaryOp::Sub, cols, pb2)?;
    let (k_rows, v_rows) = match (past, rows) {
        (Some((pk, pv)), Some((pp, _))) => {
            let ge = t.bin("rg_ge0", BinaryOp::GreaterOrEqual, rel, zero)?;
            let lt = t.bin("rg_lt_seq", BinaryOp::Less, rel, seq)?;
            let in_new = t.bin("rg_in_new", BinaryOp::And, ge, lt)?;
            let in_new = unsq(t, "rg_in_new3", in_new, vec![2])?;
            let last = t.bin("rg_seq_last", BinaryOp::Sub, seq, one)?;
            let idx = t.bin("rg_rel_lo", BinaryOp::Max, rel, zero)?;
            let idx = t.bin("rg_rel_hi", BinaryOp::Min, idx, last)?;
            let idx_new = unsq(t, "rg_idx_new", idx, vec![2])?;
            // Past rows below past_b; every other row reads the zero row appended at Pp.
            let below = t.bin("rg_below", BinaryOp::Less, cols, pb2)?;
            let capped = t.bin("rg_capped", BinaryOp::Min, cols, pp)?;
            let idx_past = t.tmp(
                "rg_idx_past2",
                Op::Where,
                vec![Some(below), Some(capped), Some(pp)],
            )?;
            let idx_past = unsq(t, "rg_idx_past", idx_past, vec![2])?;
            let mut out = Vec::new();
            for (s, new, past) in [("k", k, pk), ("v", v, pv)] {
                let new_g = t.tmp(
                    &format!("rg_{s}_new"),
                    Op::GatherNd { batch_dims: 1 },
                    vec![Some(new), Some(idx_new)],
                )?;
                let pt = t.tmp(
                    &format!("rg_{s}_past_t"),
                    Op::Transpose {
                        perm: vec![0, 2, 1, 3],
                    },
                    vec![Some(past)],
                )?;
                let flat = t.i64_const(&format!("rg_{s}_flat"), &[0, 0, d]);
                let pr = t.tmp(
                    &format!("rg_{s}_past_r"),
                    Op::Reshape { allow_zero: false },
                    vec![Some(pt), Some(flat)],
                )?;
                let zrow = t.zero_rows(&format!("rg_{s}_zero_row"), new)?;
                let ext = t.tmp(
                    &format!("rg_{s}_past_ext"),
                    Op::Concat { axis: 1 },
                    vec![Some(pr), Some(zrow)],
                )?;
                let past_g = t.tmp(
                    &format!("rg_{s}_past_g"),
                    Op::GatherNd { batch_dims: 1 },
                    vec![Some(ext), Some(idx_past)],
                )?;
                out.push(t.tmp(
                    &format!("rg_{s}_rows"),
                    Op::Where,
                    vec![Some(in_new), Some(new_g), Some(past_g)],
                )?);
            }
            (out[0], out[1])
        }
        _ => (k, v),
    };
    // The mask [batch, 1, S, P]: key j seen by query i iff j <= past_b + i, j <= seqlens_k.
    let qi = t.tmp("rg_qi", Op::Range, vec![Some(zero), Some(seq), Some(one)])?;
    let qi = unsq(t, "rg_qi_col", qi, vec![1])?;
    let pb3 = unsq(t, "rg_past3", pb, vec![1, 2])?;
    let lim = t.bin("rg_lim", BinaryOp::Add, pb3, qi)?;
    let causal = t.bin("rg_causal", BinaryOp::LessOrEqual, cols, lim)?;
    let sl3 = unsq(t, "rg_sl3", sl, vec![1, 2])?;
    let inside = t.bin("rg_inside", BinaryOp::LessOrEqual, cols, sl3)?;
    let mut mask = t.bin("rg_mask3", BinaryOp::And, causal, inside)?;
    if window > 0 {
        let w = t.i64_scalar("rg_window", window);
        let from = t.bin("rg_window_from", BinaryOp::Sub, lim, w)?;
        let recent = t.bin("rg_recent", BinaryOp::Greater, cols, from)?;
        mask = t.bin("rg_mask3w", BinaryOp::And, mask, recent)?;
    }
    let mask = unsq(t, "rg_mask", mask, vec![1])?;
    let outs = n.out_names();
    t.finish_outs(
        attn,
        vec![Some(q), Some(k_rows), Some(v_rows), Some(mask)],
        vec![outs[0].clone()],
    )?;
    for (i, (s, x)) in [(1, ("k", k_rows)), (2, ("v", v_rows))] {
        if !n.has_output(i) {
            continue;
        }
        let shape = t.i64_const(&format!("rg_{s}_heads"), &[0, 0, kv_heads, d / kv_heads]);
        let r = t.tmp(
            &format!("rg_{s}_split"),
            Op::Reshape { allow_zero: false },
            vec![Some(x), Some(shape)],
        )?;
        let p = t.tmp(
            &format!("rg_{s}_present"),
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            vec![Some(r)],
        )?;
        t.bind(i, p)?;
    }
    Ok(())
}

/// Contrib `RotaryEmbedding`: input, position_ids (`[batch, seq]`, or `[1]`: an offset
/// added to `0..seq`), cos_cache, sin_cache; onto the IR's ONNX-23 rotary embedding.
fn rotary_embedding(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let (x, pos, cos, sin) = (t.req(0)?, t.req(1)?, t.req(2)?, t.req(3)?);
    n.i("is_packed_batching", 0)?;
    n.f("scale", 1.0)?;
    let pos = if t.rank(pos) == 1 {
        t.offset_positions(x, pos)?
    } else {
        pos
    };
    let pos = t.tmp("position_ids", Op::Cast { to: DType::I64 }, vec![Some(pos)])?;
    let rotary_embedding_dim = n.i("rotary_embedding_dim", 0)?;
    let mut num_heads = n.i("num_heads", 0)?;
    if num_heads == 0 && t.rank(x) == 3 {
        // ORT takes the head size from the cache (`2 * cos_cache.shape[1]`) when
        // neither `num_heads` nor `rotary_embedding_dim` is given.
        let hidden = t.ty(x).dims[2].as_known();
        let half = t.ty(cos).dims.get(1).and_then(|d| d.as_known());
        match (hidden, half) {
            (Some(h), Some(c)) if rotary_embedding_dim == 0 && c > 0 && h % (2 * c) == 0 => {
                num_heads = h / (2 * c)
            }
            _ => {
                return Err(n.unsupported(format!(
                    "unsupported: 3-D input {} without num_heads (head size not derivable \
                     from cos_cache {})",
                    t.ty(x),
                    t.ty(cos)
                )));
            }
        }
    }
    t.finish(
        Op::RotaryEmbedding {
            interleaved: n.flag("interleaved", false)?,
            num_heads,
            rotary_embedding_dim,
        },
        vec![Some(x), Some(cos), Some(sin), Some(pos)],
    )
}

impl Tr<'_, '_, '_> {
    /// A rank-0 i64 constant.
    /// Zeros `[batch, 1, d]` of `x`'s type, `x` being `[batch, rows, d]`: `x`'s first row
    /// (a gather of row 0, whose size is a polynomial of `x`'s dims where a slice's would be
    /// `min(1, rows)`, known only at run time) replaced by zero through an all-false `Where`
    /// (`x - x` would make NaN rows from infinities).
    fn zero_rows(&mut self, suffix: &str, x: ValueId) -> R<ValueId> {
        let dtype = self.dtype(x);
        let row0 = self.i64_const(&format!("{suffix}_row0"), &[0]);
        let first = self.tmp(
            &format!("{suffix}_first"),
            Op::Gather { axis: 1 },
            vec![Some(x), Some(row0)],
        )?;
        let scalar = |dtype: DType| {
            ConstData::new(dtype, vec![1, 1, 1], vec![0u8; dtype.size_of()].into())
                .map_err(|e| self.n.invalid(format!("zero of {dtype}: {e}")))
        };
        let (never, zero) = (scalar(DType::Bool)?, scalar(dtype)?);
        let never = self.konst(&format!("{suffix}_never"), never);
        let zero = self.konst(&format!("{suffix}_zero"), zero);
        self.tmp(
            suffix,
            Op::Where,
            vec![Some(never), Some(first), Some(zero)],
        )
    }

    fn i64_scalar(&mut self, suffix: &str, v: i64) -> ValueId {
        let c = rafter_ir::ConstData::new(DType::I64, vec![], v.to_le_bytes().to_vec().into())
            .expect("one element");
        self.konst(suffix, c)
    }

    /// `offset + 0..seq` broadcast to `[batch, seq]` (x's first two dims).
    fn offset_positions(&mut self, x: ValueId, offset: ValueId) -> R<ValueId> {
        let shape = |t: &mut Self, s: &str, a: i64, b: i64| {
            t.tmp(
                s,
                Op::Shape {
                    start: a,
                    end: Some(b),
                },
                vec![Some(x)],
            )
        };
        let seq = shape(self, "seq", 1, 2)?;
        let seq = self.tmp("seq_scalar", Op::Squeeze { axes: vec![0] }, vec![Some(seq)])?;
        let (zero, one) = (self.i64_scalar("zero", 0), self.i64_scalar("one", 1));
        let r = self.tmp("range", Op::Range, vec![Some(zero), Some(seq), Some(one)])?;
        let off = self.tmp("offset", Op::Cast { to: DType::I64 }, vec![Some(offset)])?;
        let p = self.bin("positions", BinaryOp::Add, r, off)?;
        let bs = shape(self, "batch_seq", 0, 2)?;
        self.tmp("positions_bs", Op::Expand, vec![Some(p), Some(bs)])
    }

    /// ORT's attention masks as the IR attention's operands: an additive float mask
    /// (`[batch, 1, 1|seq, total]`, the 0/1 mask's zeros getting `filter`, plus the
    /// attention bias) and the per-batch key lengths of a 1-D `mask_index`.
    fn attention_masks(
        &mut self,
        mask: Option<ValueId>,
        attn_bias: Option<ValueId>,
        filter: f32,
        q: ValueId,
        has_past: bool,
    ) -> R<(Option<ValueId>, Option<ValueId>)> {
        let n = self.n;
        let dt = self.dtype(q);
        let (mut additive, mut nonpad) = (None, None);
        if let Some(m) = mask {
            match self.rank(m) {
                1 => {
                    if has_past {
                        return Err(n.unsupported(
                            "unsupported: a 1-D mask (key lengths) together with past",
                        ));
                    }
                    let b = self.ty(q).dims[0].as_known();
                    if let (Some(b), Some(len)) = (b, self.ty(m).dims[0].as_known()) {
                        if len != b {
                            return Err(n.unsupported(format!(
                                "unsupported: 1-D mask of {len} elements for batch {b} \
                                 (start/end index form)"
                            )));
                        }
                    }
                    nonpad = Some(self.tmp(
                        "key_lengths",
                        Op::Cast { to: DType::I64 },
                        vec![Some(m)],
                    )?);
                }
                r @ (2 | 3) => {
                    let f = self.tmp("mask_float", Op::Cast { to: dt }, vec![Some(m)])?;
                    let one = self.scalar("mask_one", 1.0, dt)?;
                    let inv = self.bin("mask_inv", BinaryOp::Sub, one, f)?;
                    let fv = self.scalar("mask_filter", filter as f64, dt)?;
                    let add = self.bin("mask_add", BinaryOp::Mul, inv, fv)?;
                    let axes = if r == 2 { vec![1, 2] } else { vec![1] };
                    additive =
                        Some(self.tmp("mask_4d", Op::Unsqueeze { axes }, vec![Some(add)])?);
                }
                r => {
                    return Err(n.unsupported(format!("unsupported: mask of rank {r}")));
                }
            }
        }
        if let Some(b) = attn_bias {
            additive = Some(match additive {
                Some(a) => self.bin("bias_mask", BinaryOp::Add, a, b)?,
                None => b,
            });
        }
        Ok((additive, nonpad))
    }
}
