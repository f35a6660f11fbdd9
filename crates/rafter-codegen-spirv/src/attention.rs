//! ONNX `Attention` (opset 23 to 25; also what ORT's contrib `Attention`,
//! `MultiHeadAttention` and `GroupQueryAttention` import to) on f32 or f16 queries, with
//! the semantics of `rafter-reference`'s `attention`: 3-D `[B, S, H * D]` or 4-D
//! `[B, H, S, D]` operands, grouped key/value heads, a bool or float mask broadcast to
//! `[B, Hq, Sq, L]` (padded with -inf past its last dim), `is_causal`, sliding windows,
//! `nonpad_kv_seqlen`, past keys and values with the present outputs, softcap, every
//! `qk_matmul_output_mode`, and f16 keys and values read by f32 queries (rafter's KV-cache
//! extension: the query rounded to f16 before `q · k`, the weights before `Σ p v`).
//!
//! One invocation per query row `(b, h, i)` in the grid-stride loop of [`crate::grid`]
//! (the launch counts `y`'s elements; the loop runs over them divided by the value head
//! size). The row's scores live in a `Private` array of the key length `L` (static), so
//! each score is computed once: pass 1 the scaled product, softcap and additive bias (and
//! the running max, NaN-propagating as the reference's fold), pass 2 the exponentials and
//! their sum, pass 3 the weights, then `y` one value column at a time. All arithmetic is
//! f32; with f16 queries every intermediate the reference rounds to f16 is rounded here
//! too ([`elem::round_to_half`]). The present keys and values (`past ++ current`) are
//! copied by the same invocations: row `r` copies present rows `r, r + R, r + 2R, ...`
//! where `R` is the query row count, so every present row is written once.
//!
//! Declined, with the reason (the node stays on the CPU): bf16 queries or bf16 keys and
//! values, a key length over [`MAX_KEYS`] or not static, symbolic dims other than the
//! batch, a mask that does not broadcast, empty dims.

use rafter_ir::{DType, Dim, Graph, Node, Op, TensorType};
use rspirv::dr::{Builder, Instruction, Operand as Arg};
use rspirv::spirv::{self, Decoration, SelectionControl, StorageClass, Word};

use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid::{self, DimParams, Element, Size};
use crate::matmul::{build, Prelude, R};

/// The longest static key row generated: the row's scores are a `Private` array of this
/// many f32s at most (16 KiB per invocation), past which a driver's spills would dominate.
pub const MAX_KEYS: u64 = 4096;

/// The widest value row of the online softmax (a symbolic key length): its running
/// weighted sum is a `Private` array of this many f32s at most.
pub const MAX_ONLINE_VALUES: u32 = 512;

// A body over `grid::MAX_BINDINGS` (a mask, pasts, presents and the scores together)
// stays on the CPU rather than failing at dispatch.
use crate::grid::MAX_BINDINGS;

/// A generated attention kernel; launched like an elementwise kernel (one `u32` param,
/// `y`'s element count).
#[derive(Debug, Clone)]
pub struct AttentionKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the body
    /// outputs (`y` first).
    pub spirv: Vec<u32>,
    /// The symbolic lengths the kernel reads (sequence, past, mask), in push order.
    pub dims: Vec<rafter_vulkan_section::DimParam>,
}

/// Where a q, k or v operand is bound, its element type and layout.
#[derive(Clone, Copy)]
struct Operand {
    binding: usize,
    elem: Elem,
    /// 3-D `[B, S, H * W]` (true) or 4-D `[B, H, S, W]`.
    split: bool,
}

/// The attention mask: its binding, element type (bool: 0 or -inf), its dims along `b`,
/// `h` and `i` (`None` where broadcast or absent; their strides follow from the dims
/// inside them) and its last dim (≤ L; -inf past it).
struct Mask {
    binding: usize,
    elem: Elem,
    lead: [Option<Size>; 3],
    len: Size,
}

/// The attributes that shape the scores.
struct Scoring {
    /// `sqrt(scale)`, applied to q and k each (the reference's split of the scale).
    sc: f32,
    softcap: f32,
    causal: bool,
    left: i64,
    right: i64,
    /// The `qk_matmul_output` binding and mode, where the body has it.
    qk_out: Option<(usize, i64)>,
}

struct Layout {
    hq: u32,
    hkv: u32,
    /// Query rows, current key rows and past rows: static, or dim params.
    sq: Size,
    skv: Size,
    past: Size,
    /// The key length `past + skv` where static: the scores live in an array of it. A
    /// symbolic one takes the online softmax instead ([`Row::emit_online`]).
    total: Option<u32>,
    /// Dim params the module reads.
    params: usize,
    d: u32,
    dv: u32,
    q: Operand,
    k: Operand,
    v: Operand,
    /// Past key and value bindings (4-D, k's and v's element types).
    pasts: Option<(usize, usize)>,
    mask: Option<Mask>,
    nonpad: Option<(usize, Elem)>,
    y: usize,
    present_k: Option<usize>,
    present_v: Option<usize>,
    scoring: Scoring,
    /// q is f16: intermediates are rounded to f16 where the reference rounds them.
    half: bool,
}

/// Generates a body holding one `attention` node of body inputs, its results (y first)
/// the body's outputs.
pub fn attention(body: &Graph) -> Result<AttentionKernel, String> {
    let node = grid::one_node(body, "attention")?;
    let bindings = body.inputs.len() + body.outputs.len();
    if bindings > MAX_BINDINGS {
        return Err(format!(
            "attention with {bindings} buffers: a dispatch binds at most {MAX_BINDINGS}"
        ));
    }
    let mut params = DimParams::default();
    let layout = layout(body, node, &mut params)?;
    let rows_per_count = (1, layout.dv);
    let spirv = grid::module_scaled(
        bindings,
        rows_per_count,
        layout.params,
        |b, t, e| match layout.total {
            Some(total) => {
                let scores = scores_array(b, t, total);
                Row::new(b, t, &layout, &e, scores)?.emit(b)
            }
            None => {
                let acc = scores_array(b, t, layout.dv);
                Row::new(b, t, &layout, &e, acc)?.emit_online(b)
            }
        },
    )?;
    Ok(AttentionKernel {
        spirv,
        dims: params.params,
    })
}

/// The attributes and operands of `node`, checked.
fn layout(body: &Graph, node: &Node, params: &mut DimParams) -> R<Layout> {
    let Op::Attention {
        is_causal,
        kv_num_heads,
        q_num_heads,
        qk_matmul_output_mode,
        scale,
        softcap,
        left_window_size,
        right_window_size,
    } = node.op
    else {
        return Err(format!("op `{}` is not attention", node.op.name()));
    };
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    let input = |i: usize, what: &str| grid::body_input(body, node, i, what);
    let opt_input = |i: usize, what: &str| node.input(i).map(|_| input(i, what)).transpose();
    let (q, k, v) = (input(0, "q")?, input(1, "k")?, input(2, "v")?);
    let q_elem = float_elem(ty(q).dtype, "q")?;
    let (qg, q_split) = heads_of(ty(q), q_num_heads, "q", (q, &mut *params))?;
    let (kg, k_split) = heads_of(ty(k), kv_num_heads, "k", (k, &mut *params))?;
    let (vg, v_split) = heads_of(ty(v), kv_num_heads, "v", (v, &mut *params))?;
    let (k_elem, v_elem) = (float_elem(ty(k).dtype, "k")?, float_elem(ty(v).dtype, "v")?);
    if q_elem == Elem::F16 && (k_elem, v_elem) != (Elem::F16, Elem::F16) {
        return Err("f16 q with f32 k or v".into());
    }
    let batch = &ty(q).dims[0];
    for (i, what) in [(k, "k"), (v, "v")] {
        same_batch(ty(i), batch, what)?;
    }
    let (hq, sq, d) = qg;
    let (hkv, skv, dk) = kg;
    let (vh, vs, dv) = vg;
    if dk != d || vh != hkv || vs.1 != skv.1 || hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "q {}, k {}, v {} (heads, seq, size) do not agree",
            ty(q),
            ty(k),
            ty(v)
        ));
    }
    let pasts = pasts(body, node, (hkv, d, dv), (k_elem, v_elem), batch, params)?;
    let past = pasts.as_ref().map_or(Size::Known(0), |p| p.2);
    let total = match (past, skv.0) {
        (Size::Known(p), Size::Known(s)) => Some(p + s),
        _ => None,
    };
    if total.is_some_and(|t| t > MAX_KEYS || t == 0) || [hq, d, dv].contains(&0) {
        let keys = total.map_or_else(|| "symbolic".to_string(), |t| t.to_string());
        return Err(format!(
            "key length {keys} (1 to {MAX_KEYS} generated) or an empty dim in q {}",
            ty(q)
        ));
    }
    if sq.0 == Size::Known(0) {
        return Err("attention of no query rows".into());
    }
    let known = |s: Size| match s {
        Size::Known(k) => k,
        Size::Param(_) => 1,
    };
    grid::product_u32(
        &[
            hq.max(hkv),
            known(sq.0).max(total.unwrap_or(1)),
            d.max(dv),
            4,
        ],
        "one batch of attention",
    )?;
    let mask = opt_input(3, "attn_mask")?
        .map(|m| {
            mask(
                ty(m),
                m,
                q_elem,
                (hq, &sq.1, total.map(|t| t as u32)),
                batch,
                params,
            )
        })
        .transpose()?;
    let nonpad = opt_input(6, "nonpad_kv_seqlen")?
        .map(|n| nonpad(ty(n), n, batch))
        .transpose()?;
    let outs = outputs(body, node)?;
    let qk_out = outs[3].map(|o| (o, qk_matmul_output_mode));
    if total.is_none() {
        // The online softmax keeps no scores: no qk output, and no f16 rounding of each
        // intermediate as the reference rounds them.
        if qk_out.is_some() {
            return Err("qk_matmul_output over a symbolic key length".into());
        }
        if q_elem != Elem::F32 || k_elem != Elem::F32 || v_elem != Elem::F32 {
            return Err("f16 attention over a symbolic key length".into());
        }
        if dv > u64::from(MAX_ONLINE_VALUES) {
            return Err(format!(
                "value rows of {dv} over a symbolic key length (at most {MAX_ONLINE_VALUES})"
            ));
        }
    }
    let u = |x: u64| x as u32;
    Ok(Layout {
        hq: u(hq),
        hkv: u(hkv),
        sq: sq.0,
        skv: skv.0,
        past,
        total: total.map(u),
        params: params.params.len(),
        d: u(d),
        dv: u(dv),
        q: Operand {
            binding: q,
            elem: q_elem,
            split: q_split,
        },
        k: Operand {
            binding: k,
            elem: k_elem,
            split: k_split,
        },
        v: Operand {
            binding: v,
            elem: v_elem,
            split: v_split,
        },
        pasts: pasts.map(|(pk, pv, _)| (pk, pv)),
        mask,
        nonpad,
        y: outs[0].ok_or("the attention's y must be the body's first output")?,
        present_k: outs[1],
        present_v: outs[2],
        scoring: Scoring {
            sc: scale.map_or(1.0 / (d as f64).sqrt(), f64::from).sqrt() as f32,
            softcap,
            causal: is_causal,
            left: left_window_size,
            right: right_window_size,
            qk_out,
        },
        half: q_elem == Elem::F16,
    })
}

/// f32 or f16, or why not (bf16 keys, values and queries are not generated).
fn float_elem(dtype: DType, what: &str) -> R<Elem> {
    match dtype {
        DType::F32 => Ok(Elem::F32),
        DType::F16 => Ok(Elem::F16),
        other => Err(format!(
            "attention {what} is {other}; f32 and f16 are generated"
        )),
    }
}

/// An operand's heads, sequence (its size and its dim) and head size.
type Heads = (u64, (Size, Dim), u64);

/// `(heads, seq, size)` of a 3-D (`heads` from the attribute) or 4-D operand, all static
/// but the batch and the sequence (a dim param of `binding`, with its dim), and whether it
/// is 3-D.
fn heads_of(
    ty: &TensorType,
    heads: i64,
    what: &str,
    (binding, params): (usize, &mut DimParams),
) -> R<(Heads, bool)> {
    let what = format!("attention {what}");
    let (seq_axis, split) = match ty.dims.len() {
        3 => (1, true),
        4 => (2, false),
        r => return Err(format!("{what} of rank {r}: 3-D or 4-D is generated")),
    };
    let seq = (
        params.dim(ty, binding, seq_axis)?,
        ty.dims[seq_axis].clone(),
    );
    let d = grid::static_dims_from(ty, seq_axis + 1, &what)?;
    if split {
        let hidden = d[0];
        let h = u64::try_from(heads)
            .ok()
            .filter(|&h| h > 0 && hidden % h == 0)
            .ok_or_else(|| format!("{what}: {heads} heads of {hidden} values"))?;
        Ok(((h, seq, hidden / h), true))
    } else {
        let h = ty.dims[1]
            .as_known()
            .ok_or_else(|| format!("{what} heads {} are not static", ty.dims[1]))?;
        Ok(((h as u64, seq, d[0]), false))
    }
}

/// Checks that an operand's batch dim is q's (symbolically).
fn same_batch(ty: &TensorType, batch: &Dim, what: &str) -> R<()> {
    match ty.dims.first() {
        Some(d) if d == batch => Ok(()),
        d => Err(format!("attention {what} batch {d:?} is not q's {batch}")),
    }
}

/// The past key and value bindings and the past length (static, or a dim param of the
/// past key): 4-D `[B, Hkv, P, D]` (and `Dv`), of k's and v's element types, given
/// together or not at all.
fn pasts(
    body: &Graph,
    node: &Node,
    (hkv, d, dv): (u64, u64, u64),
    (ke, ve): (Elem, Elem),
    batch: &Dim,
    params: &mut DimParams,
) -> R<Option<(usize, usize, Size)>> {
    let (pk, pv) = match (node.input(4), node.input(5)) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => (
            grid::body_input(body, node, 4, "past_key")?,
            grid::body_input(body, node, 5, "past_value")?,
        ),
        _ => return Err("past_key and past_value must be given together".into()),
    };
    let ty = |i: usize| &body.value(body.inputs[i]).ty;
    for (i, size, elem, what) in [(pk, d, ke, "past_key"), (pv, dv, ve, "past_value")] {
        if ty(i).dims.len() != 4 {
            return Err(format!(
                "{what} of rank {}: 4-D is generated",
                ty(i).dims.len()
            ));
        }
        same_batch(ty(i), batch, what)?;
        let dims = &ty(i).dims;
        if dims[1].as_known() != Some(hkv as i64)
            || dims[3].as_known() != Some(size as i64)
            || float_elem(ty(i).dtype, what)? != elem
        {
            return Err(format!(
                "{what} {} does not match the current keys or values",
                ty(i)
            ));
        }
    }
    if ty(pk).dims[2] != ty(pv).dims[2] {
        return Err("past_key and past_value lengths differ".into());
    }
    let past = params.dim(ty(pk), pk, 2)?;
    Ok(Some((pk, pv, past)))
}

/// The mask's layout against `[B, hq, sq, total]`: right-aligned, each dim 1 (broadcast)
/// or the target's; its last dim at most `total` (where both are static).
fn mask(
    ty: &TensorType,
    binding: usize,
    q_elem: Elem,
    (hq, sq, total): (u64, &Dim, Option<u32>),
    batch: &Dim,
    params: &mut DimParams,
) -> R<Mask> {
    let elem = match ty.dtype {
        DType::Bool => Elem::Bool,
        d if float_elem(d, "attn_mask").ok() == Some(q_elem) => q_elem,
        other => return Err(format!("attn_mask of type {other} for {q_elem:?} queries")),
    };
    let rank = ty.dims.len();
    if !(1..=4).contains(&rank) {
        return Err(format!("attn_mask of rank {rank}"));
    }
    let len = params.dim(ty, binding, rank - 1)?;
    match (len, total) {
        (Size::Known(0), _) => return Err("attn_mask of no keys".into()),
        (Size::Known(n), Some(t)) if n > u64::from(t) => {
            return Err(format!("attn_mask last dim {n} for {t} keys"));
        }
        _ => {}
    }
    // The mask's dims right-aligned to [B, hq, sq] (None where it has none).
    let targets = [batch.clone(), Dim::from(hq as i64), sq.clone()];
    let mut lead = [None; 3];
    for (a, target) in targets.iter().enumerate() {
        let Some(m) = (a + rank).checked_sub(4) else {
            continue;
        };
        let dim = &ty.dims[m];
        if dim.as_known() == Some(1) {
            continue;
        }
        if dim != target {
            return Err(format!(
                "attn_mask dims {:?} do not broadcast to [{batch}, {hq}, {sq}, keys]",
                ty.dims
            ));
        }
        lead[a] = Some(params.dim(ty, binding, m)?);
    }
    Ok(Mask {
        binding,
        elem,
        lead,
        len,
    })
}

/// `nonpad_kv_seqlen`: i64 or i32 `[B]`.
fn nonpad(ty: &TensorType, binding: usize, batch: &Dim) -> R<(usize, Elem)> {
    let elem = match ty.dtype {
        DType::I64 => Elem::I64,
        DType::I32 => Elem::I32,
        other => return Err(format!("nonpad_kv_seqlen of type {other}")),
    };
    if ty.dims.len() != 1 || ty.dims[0] != *batch {
        return Err(format!(
            "nonpad_kv_seqlen of dims {:?} for batch {batch}",
            ty.dims
        ));
    }
    Ok((binding, elem))
}

/// The bindings of the node's four results among the body's outputs (after the inputs);
/// y must be the first (its element count is the launch's).
fn outputs(body: &Graph, node: &Node) -> R<[Option<usize>; 4]> {
    let mut at = [None; 4];
    for (o, &value) in body.outputs.iter().enumerate() {
        let result = node.outputs.iter().position(|r| *r == Some(value));
        let Some(r) = result.filter(|&r| r < 4) else {
            return Err("the attention's outputs must be its results".into());
        };
        at[r] = Some(body.inputs.len() + o);
    }
    if at[0] != Some(body.inputs.len()) {
        return Err("the attention's y must be the body's first output".into());
    }
    Ok(at)
}

/// A per-invocation `Private` array of `len` f32s (the row's scores), added to the entry
/// point's interface as SPIR-V 1.4+ requires of every global a function uses.
fn scores_array(b: &mut Builder, t: &Prelude, len: u32) -> Word {
    let n = b.constant_bit32(t.u32, len);
    let arr = b.type_array(t.f32, n);
    let ptr = b.type_pointer(None, StorageClass::Private, arr);
    let var = b.id();
    let inst = Instruction::new(
        spirv::Op::Variable,
        Some(ptr),
        Some(var),
        vec![Arg::StorageClass(StorageClass::Private)],
    );
    let module = b.module_mut();
    module.types_global_values.push(inst);
    if let Some(entry) = module.entry_points.first_mut() {
        entry.operands.push(Arg::IdRef(var));
    }
    var
}

/// The emitter of one query row: the layout, the binding addresses and the row's
/// coordinates (`batch`, `head`, `group` as `u64`s; `row`, `i`, the offset and the key
/// count as `u32`s). Its methods take the builder, so loop bodies can share it.
#[derive(Clone, Copy)]
struct Row<'a> {
    t: &'a Prelude,
    l: &'a Layout,
    addrs: &'a [Word],
    count: Word,
    row: Word,
    scores: Word,
    batch: Word,
    head: Word,
    group: Word,
    i: Word,
    /// The query's absolute position minus `i` (the causal and window frontier's offset),
    /// signed in a `u32`.
    offset: Word,
    /// The batch's nonpad key count (signed in a `u32`), where there is one.
    keys: Option<Word>,
    /// Query rows, current key rows, past rows and keys (`past + skv`), as `u32`s.
    sq: Word,
    skv: Word,
    past: Word,
    total: Word,
    /// The dim params' values (`u32`s).
    params: &'a [Word],
}

impl<'a> Row<'a> {
    fn new(
        b: &mut Builder,
        t: &'a Prelude,
        l: &'a Layout,
        e: &Element<'a>,
        scores: Word,
    ) -> R<Self> {
        let u32 = t.u32;
        let size = |b: &mut Builder, s: Size| grid::size_u32(b, t, e.params, s);
        let (sq, skv, past) = (size(b, l.sq)?, size(b, l.skv)?, size(b, l.past)?);
        let total = build(b.i_add(u32, None, past, skv))?;
        let (bh, i) = divmod(b, t, e.i, l.sq, sq)?;
        let (batch, head) = grid::div_mod(b, u32, bh, l.hq)?;
        let (group, _) = grid::div_mod(b, u32, head, l.hq / l.hkv)?;
        let wide = |b: &mut Builder, v: Word| build(b.u_convert(t.u64, None, v));
        let mut row = Row {
            t,
            l,
            addrs: e.addrs,
            count: e.count,
            row: e.i,
            scores,
            batch: wide(b, batch)?,
            head: wide(b, head)?,
            group: wide(b, group)?,
            i,
            offset: past,
            keys: None,
            sq,
            skv,
            past,
            total,
            params: e.params,
        };
        if let Some((binding, elem)) = l.nonpad {
            let n = row.nonpad_keys(b, binding, elem)?;
            if l.pasts.is_none() {
                row.offset = build(b.i_sub(u32, None, n, sq))?;
            }
            row.keys = Some(n);
        }
        Ok(row)
    }

    /// A size as a `u32` value of the module.
    fn size(&self, b: &mut Builder, s: Size) -> R<Word> {
        grid::size_u32(b, self.t, self.params, s)
    }
    fn u(&self, b: &mut Builder, v: u32) -> Word {
        b.constant_bit32(self.t.u32, v)
    }
    fn f(&self, b: &mut Builder, v: f32) -> Word {
        b.constant_bit32(self.t.f32, v.to_bits())
    }
    fn wide(&self, b: &mut Builder, v: Word) -> R<Word> {
        build(b.u_convert(self.t.u64, None, v))
    }
    /// `a * n + c` in `u64`s (`n` a constant).
    fn mad(&self, b: &mut Builder, a: Word, n: u32, c: Word) -> R<Word> {
        let n = b.constant_bit64(self.t.u64, u64::from(n));
        let p = build(b.i_mul(self.t.u64, None, a, n))?;
        build(b.i_add(self.t.u64, None, p, c))
    }
    /// `v` rounded to f16 when the queries are f16 (the reference's `r`), else `v`.
    fn r(&self, b: &mut Builder, v: Word) -> R<Word> {
        if self.l.half {
            elem::round_to_half(b, self.t.f32, v)
        } else {
            Ok(v)
        }
    }
    /// `v` rounded to f16 when `to` is (the reference's `round_to` a narrower type).
    fn round_to(&self, b: &mut Builder, v: Word, to: Elem) -> R<Word> {
        if to == Elem::F16 {
            elem::round_to_half(b, self.t.f32, v)
        } else {
            Ok(v)
        }
    }
    fn math<'b>(&self, b: &'b mut Builder) -> Math<'b> {
        Math {
            b,
            f32: self.t.f32,
            bool: self.t.bool,
            glsl: self.t.glsl,
        }
    }
    /// `a * b` rounded on its own (no fused multiply-add with a later sum).
    fn product(&self, b: &mut Builder, a: Word, c: Word) -> R<Word> {
        let p = build(b.f_mul(self.t.f32, None, a, c))?;
        b.decorate(p, Decoration::NoContraction, []);
        Ok(p)
    }

    /// The batch's nonpad key count clamped to `-1..=L` (so it fits a signed `u32`).
    fn nonpad_keys(&self, b: &mut Builder, binding: usize, elem: Elem) -> R<Word> {
        let (u64, bool) = (self.t.u64, self.t.bool);
        let at = grid::element_addr(b, u64, self.addrs[binding], self.batch, elem.bytes())?;
        let n = crate::gather::load_index_at(b, self.t, elem, at)?;
        let lo = b.constant_bit64(u64, u64::MAX);
        let hi = build(b.u_convert(u64, None, self.total))?;
        let below = build(b.s_less_than(bool, None, n, lo))?;
        let n = build(b.select(u64, None, below, lo, n))?;
        let above = build(b.s_greater_than(bool, None, n, hi))?;
        let n = build(b.select(u64, None, above, hi, n))?;
        build(b.u_convert(self.t.u32, None, n))
    }

    /// The byte address of the first element of key or value row `j` (a `u32` in
    /// `0..L`) of kv head `group` in `batch`: the past's row below the past length, else
    /// the current operand's row `j - past`.
    fn kv_row(
        &self,
        b: &mut Builder,
        op: Operand,
        past: Option<usize>,
        width: u32,
        j: Word,
    ) -> R<Word> {
        let l = self.l;
        let (u32, u64) = (self.t.u32, self.t.u64);
        let p = self.past;
        let cur = build(b.i_sub(u32, None, j, p))?;
        let cur = self.wide(b, cur)?;
        let index = if op.split {
            let bs = self.mad_w(b, self.batch, self.skv, cur)?;
            let bsh = self.mad(b, bs, l.hkv, self.group)?;
            self.times(b, bsh, width)?
        } else {
            let bh = self.mad(b, self.batch, l.hkv, self.group)?;
            let bhs = self.mad_w(b, bh, self.skv, cur)?;
            self.times(b, bhs, width)?
        };
        let at = grid::element_addr(b, u64, self.addrs[op.binding], index, op.elem.bytes())?;
        let Some(past) = past else { return Ok(at) };
        let j64 = self.wide(b, j)?;
        let bh = self.mad(b, self.batch, l.hkv, self.group)?;
        let bhj = self.mad_w(b, bh, self.past, j64)?;
        let index = self.times(b, bhj, width)?;
        let old = grid::element_addr(b, u64, self.addrs[past], index, op.elem.bytes())?;
        let in_past = build(b.u_less_than(self.t.bool, None, j, p))?;
        build(b.select(u64, None, in_past, old, at))
    }
    /// `a * n + c` in `u64`s (`n` a `u32` value of the module).
    fn mad_w(&self, b: &mut Builder, a: Word, n: Word, c: Word) -> R<Word> {
        let n = self.wide(b, n)?;
        let p = build(b.i_mul(self.t.u64, None, a, n))?;
        build(b.i_add(self.t.u64, None, p, c))
    }
    /// `a * n` in `u64`s (`n` a constant).
    fn times(&self, b: &mut Builder, a: Word, n: u32) -> R<Word> {
        let n = b.constant_bit64(self.t.u64, u64::from(n));
        build(b.i_mul(self.t.u64, None, a, n))
    }
    /// Element `d` (a `u32`) of the row at byte address `row` of `elem`s, as an f32.
    fn load(&self, b: &mut Builder, row: Word, d: Word, elem: Elem) -> R<Word> {
        let d = self.wide(b, d)?;
        let at = grid::element_addr(b, self.t.u64, row, d, elem.bytes())?;
        elem::load(b, elem, self.t.f32, at)
    }
    /// Stores `v` at element `index` (a `u64`) of output `binding` of `elem`s.
    fn store(&self, b: &mut Builder, binding: usize, elem: Elem, index: Word, v: Word) -> R<()> {
        let at = grid::element_addr(b, self.t.u64, self.addrs[binding], index, elem.bytes())?;
        elem::store(b, elem, self.t.f32, at, v)
    }
    fn score_ptr(&self, b: &mut Builder, j: Word) -> R<Word> {
        let ptr = b.type_pointer(None, StorageClass::Private, self.t.f32);
        build(b.access_chain(ptr, None, self.scores, [j]))
    }
    fn score(&self, b: &mut Builder, j: Word) -> R<Word> {
        let at = self.score_ptr(b, j)?;
        build(b.load(self.t.f32, None, at, None, []))
    }
    fn set_score(&self, b: &mut Builder, j: Word, v: Word) -> R<()> {
        let at = self.score_ptr(b, j)?;
        build(b.store(at, v, None, []))
    }

    /// The row: scores, softmax, weighted values, then its share of the present copies.
    fn emit(&self, b: &mut Builder) -> R<()> {
        let (max, all_masked) = self.score_pass(b)?;
        let sum = self.exp_pass(b, max, all_masked)?;
        self.weight_pass(b, sum)?;
        self.value_pass(b)?;
        self.present_pass(b)
    }

    /// The row over a symbolic key length, in one pass over the keys (the online softmax):
    /// a running max `m`, a running sum `l` of `exp(s - m)` and the running weighted
    /// values `acc[c]` (the `Private` array this row was made with), each rescaled by
    /// `exp(m_old - m_new)` when the max grows; then `y = acc / l`. NaN scores make the
    /// row NaN and a row with no visible key is 0, as the reference's three passes give
    /// (their sums round differently: the result agrees to float rounding, not bits).
    fn emit_online(&self, b: &mut Builder) -> R<()> {
        let l = self.l;
        let Prelude { f32, bool, .. } = *self.t;
        let zero = self.f(b, 0.0);
        let columns = (self.u(b, 0), self.u(b, l.dv));
        grid::range_loop(b, self.t, columns, &[], &mut |b, c, _| {
            self.set_score(b, c, zero)?;
            Ok(Vec::new())
        })?;
        let q_row = self.q_row(b)?;
        let minus_inf = self.f(b, f32::NEG_INFINITY);
        let one = self.f(b, 1.0);
        let no = b.constant_false(bool);
        let keys = (self.u(b, 0), self.total);
        let accs = [(f32, minus_inf), (f32, zero), (bool, no)];
        let out = grid::range_loop(b, self.t, keys, &accs, &mut |b, j, acc| {
            let (m, sum, nan) = (acc[0], acc[1], acc[2]);
            let qk = self.product_qk(b, q_row, j)?;
            let bias = self.bias(b, j)?;
            let s = build(b.f_add(f32, None, qk, bias))?;
            let is_nan = build(b.is_nan(bool, None, s))?;
            let nan = build(b.logical_or(bool, None, nan, is_nan))?;
            let above = build(b.f_ord_greater_than(bool, None, s, m))?;
            let m_new = build(b.select(f32, None, above, s, m))?;
            // While every score so far is -inf nothing is kept (and -inf - -inf is NaN).
            let none = build(b.f_ord_equal(bool, None, m_new, minus_inf))?;
            let shrink = build(b.f_sub(f32, None, m, m_new))?;
            let shrink = self.math(b).exp(shrink)?;
            let scale = build(b.select(f32, None, none, one, shrink))?;
            let x = build(b.f_sub(f32, None, s, m_new))?;
            let e = self.math(b).exp(x)?;
            let e = build(b.select(f32, None, none, zero, e))?;
            let kept = self.product(b, sum, scale)?;
            let sum = build(b.f_add(f32, None, kept, e))?;
            let v_row = self.kv_row(b, l.v, l.pasts.map(|p| p.1), l.dv, j)?;
            let columns = (self.u(b, 0), self.u(b, l.dv));
            grid::range_loop(b, self.t, columns, &[], &mut |b, c, _| {
                let a = self.score(b, c)?;
                let a = self.product(b, a, scale)?;
                let v = self.load(b, v_row, c, l.v.elem)?;
                let ev = self.product(b, e, v)?;
                let a = build(b.f_add(f32, None, a, ev))?;
                self.set_score(b, c, a)?;
                Ok(Vec::new())
            })?;
            Ok(vec![m_new, sum, nan])
        })?;
        let (sum, nan) = (out[1], out[2]);
        let empty = build(b.f_ord_equal(bool, None, sum, zero))?;
        let nan_value = self.f(b, f32::NAN);
        let y_row = self.y_row(b)?;
        let columns = (self.u(b, 0), self.u(b, l.dv));
        grid::range_loop(b, self.t, columns, &[], &mut |b, c, _| {
            let a = self.score(b, c)?;
            let y = build(b.f_div(f32, None, a, sum))?;
            let y = build(b.select(f32, None, empty, zero, y))?;
            let y = build(b.select(f32, None, nan, nan_value, y))?;
            let c64 = self.wide(b, c)?;
            let index = build(b.i_add(self.t.u64, None, y_row, c64))?;
            self.store(b, l.y, l.q.elem, index, y)?;
            Ok(Vec::new())
        })?;
        self.present_pass(b)
    }

    /// The index of this row's first element of `y`.
    fn y_row(&self, b: &mut Builder) -> R<Word> {
        let l = self.l;
        if l.q.split {
            let i = self.wide(b, self.i)?;
            let bs = self.mad_w(b, self.batch, self.sq, i)?;
            let bsh = self.mad(b, bs, l.hq, self.head)?;
            self.times(b, bsh, l.dv)
        } else {
            let r = self.wide(b, self.row)?;
            self.times(b, r, l.dv)
        }
    }

    /// The query row's first element's byte address.
    fn q_row(&self, b: &mut Builder) -> R<Word> {
        let l = self.l;
        let i = self.wide(b, self.i)?;
        let index = if l.q.split {
            let bs = self.mad_w(b, self.batch, self.sq, i)?;
            let bsh = self.mad(b, bs, l.hq, self.head)?;
            self.times(b, bsh, l.d)?
        } else {
            let r = self.wide(b, self.row)?;
            self.times(b, r, l.d)?
        };
        grid::element_addr(
            b,
            self.t.u64,
            self.addrs[l.q.binding],
            index,
            l.q.elem.bytes(),
        )
    }

    /// Pass 1: every score `qk + bias` into the array (and `qk_matmul_output` for modes
    /// 0 to 2); returns the max (NaN if any score is) and whether every bias is -inf.
    fn score_pass(&self, b: &mut Builder) -> R<(Word, Word)> {
        let Prelude { f32, bool, .. } = *self.t;
        let q_row = self.q_row(b)?;
        let minus_inf = self.f(b, f32::NEG_INFINITY);
        let (yes, no) = (b.constant_true(bool), b.constant_false(bool));
        let range = (self.u(b, 0), self.total);
        let accs = [(f32, minus_inf), (bool, no), (bool, yes)];
        let out = grid::range_loop(b, self.t, range, &accs, &mut |b, j, acc| {
            let qk = self.product_qk(b, q_row, j)?;
            let bias = self.bias(b, j)?;
            let sum = build(b.f_add(f32, None, qk, bias))?;
            let qkb = self.r(b, sum)?;
            self.set_score(b, j, qkb)?;
            self.store_qk(
                b,
                j,
                match self.l.scoring.qk_out {
                    Some((_, 2)) => Some(qkb),
                    Some((_, 3)) => None,
                    _ => Some(qk),
                },
            )?;
            let above = build(b.f_ord_greater_than(bool, None, qkb, acc[0]))?;
            let max = build(b.select(f32, None, above, qkb, acc[0]))?;
            let nan = build(b.is_nan(bool, None, qkb))?;
            let nan = build(b.logical_or(bool, None, acc[1], nan))?;
            let masked = build(b.f_ord_equal(bool, None, bias, minus_inf))?;
            let masked = build(b.logical_and(bool, None, acc[2], masked))?;
            Ok(vec![max, nan, masked])
        })?;
        let nan_value = self.f(b, f32::NAN);
        let max = build(b.select(f32, None, out[1], nan_value, out[0]))?;
        Ok((max, out[2]))
    }

    /// `qk_matmul_output[row, j] = v` where the body has it and `v` is given.
    fn store_qk(&self, b: &mut Builder, j: Word, v: Option<Word>) -> R<()> {
        let (Some((binding, _)), Some(v)) = (self.l.scoring.qk_out, v) else {
            return Ok(());
        };
        let r = self.wide(b, self.row)?;
        let j = self.wide(b, j)?;
        let index = self.mad_w(b, r, self.total, j)?;
        self.store(b, binding, self.l.q.elem, index, v)
    }

    /// `Σ_d qs[d] · ks[d]` for key `j`, then the softcap: `qs = r(round_k(q) · sc)`,
    /// `ks = r(k · sc)` as the reference scales both.
    fn product_qk(&self, b: &mut Builder, q_row: Word, j: Word) -> R<Word> {
        let l = self.l;
        let f32 = self.t.f32;
        let k_row = self.kv_row(b, l.k, l.pasts.map(|p| p.0), l.d, j)?;
        let sc = self.f(b, l.scoring.sc);
        let sc = self.r(b, sc)?;
        let range = (self.u(b, 0), self.u(b, l.d));
        let zero = self.f(b, 0.0);
        let dot = grid::range_loop(b, self.t, range, &[(f32, zero)], &mut |b, d, acc| {
            let q = self.load(b, q_row, d, l.q.elem)?;
            let q = self.round_to(b, q, l.k.elem)?;
            let qs = self.product(b, q, sc)?;
            let qs = self.r(b, qs)?;
            let k = self.load(b, k_row, d, l.k.elem)?;
            let ks = self.product(b, k, sc)?;
            let ks = self.r(b, ks)?;
            let p = self.product(b, qs, ks)?;
            Ok(vec![build(b.f_add(f32, None, acc[0], p))?])
        })?[0];
        let qk = self.r(b, dot)?;
        if l.scoring.softcap <= 0.0 {
            return Ok(qk);
        }
        let c = self.f(b, l.scoring.softcap);
        let c = self.r(b, c)?;
        let x = build(b.f_div(f32, None, qk, c))?;
        let x = self.r(b, x)?;
        let x = self.math(b).tanh(x)?;
        let x = self.r(b, x)?;
        let x = self.product(b, x, c)?;
        self.r(b, x)
    }

    /// The additive bias of key `j`: the mask's value (0 without one, -inf past its last
    /// dim, a bool's 0 or -inf), then -inf where the causal frontier, the window or the
    /// nonpad length excludes the key.
    fn bias(&self, b: &mut Builder, j: Word) -> R<Word> {
        let Prelude { f32, u32, bool, .. } = *self.t;
        let minus_inf = self.f(b, f32::NEG_INFINITY);
        let mut bias = match &self.l.mask {
            Some(m) => self.mask_value(b, m, j)?,
            None => self.f(b, 0.0),
        };
        let pos = build(b.i_add(u32, None, self.i, self.offset))?;
        let mut out = b.constant_false(bool);
        let s = &self.l.scoring;
        let (causal, left, right) = (s.causal, s.left, s.right);
        if causal {
            out = build(b.s_greater_than(bool, None, j, pos))?;
        }
        // diff = pos - j: excluded past `left` behind or `right` ahead.
        let diff = build(b.i_sub(u32, None, pos, j))?;
        if left >= 0 {
            let w = self.u(b, left.min(i64::from(i32::MAX)) as u32);
            let far = build(b.s_greater_than(bool, None, diff, w))?;
            out = build(b.logical_or(bool, None, out, far))?;
        }
        if right >= 0 {
            let ahead = build(b.i_sub(u32, None, j, pos))?;
            let w = self.u(b, right.min(i64::from(i32::MAX)) as u32);
            let far = build(b.s_greater_than(bool, None, ahead, w))?;
            out = build(b.logical_or(bool, None, out, far))?;
        }
        if let Some(n) = self.keys {
            let pad = build(b.s_greater_than_equal(bool, None, j, n))?;
            out = build(b.logical_or(bool, None, out, pad))?;
        }
        bias = build(b.select(f32, None, out, minus_inf, bias))?;
        Ok(bias)
    }

    /// The mask's value at `(batch, head, i, j)` as a bias.
    fn mask_value(&self, b: &mut Builder, m: &Mask, j: Word) -> R<Word> {
        let Prelude {
            f32,
            u32,
            u64,
            bool,
            ..
        } = *self.t;
        let len = self.size(b, m.len)?;
        let inside = build(b.u_less_than(bool, None, j, len))?;
        let one = self.u(b, 1);
        let last = build(b.i_sub(u32, None, len, one))?;
        let jc = build(b.select(u32, None, inside, j, last))?;
        let mut index = self.wide(b, jc)?;
        let i = self.wide(b, self.i)?;
        // Strides: each kept dim's is the product of the kept dims inside it.
        let mut stride = self.wide(b, len)?;
        for (coord, dim) in [
            (i, m.lead[2]),
            (self.head, m.lead[1]),
            (self.batch, m.lead[0]),
        ] {
            let Some(dim) = dim else { continue };
            let p = build(b.i_mul(u64, None, coord, stride))?;
            index = build(b.i_add(u64, None, index, p))?;
            let n = self.size(b, dim)?;
            let n = self.wide(b, n)?;
            stride = build(b.i_mul(u64, None, stride, n))?;
        }
        let at = grid::element_addr(b, u64, self.addrs[m.binding], index, m.elem.bytes())?;
        let v = elem::load(b, m.elem, f32, at)?;
        let minus_inf = self.f(b, f32::NEG_INFINITY);
        let v = if m.elem == Elem::Bool {
            let zero = self.f(b, 0.0);
            let set = build(b.f_ord_not_equal(bool, None, v, zero))?;
            build(b.select(f32, None, set, zero, minus_inf))?
        } else {
            v
        };
        build(b.select(f32, None, inside, v, minus_inf))
    }

    /// Pass 2: `r(exp(r(s - max)))` into the array (0 for a row whose every bias is -inf
    /// or whose max is -inf); returns their sum, 1 where it is 0.
    fn exp_pass(&self, b: &mut Builder, max: Word, all_masked: Word) -> R<Word> {
        let Prelude { f32, bool, .. } = *self.t;
        let minus_inf = self.f(b, f32::NEG_INFINITY);
        let none = build(b.f_ord_equal(bool, None, max, minus_inf))?;
        let empty = build(b.logical_or(bool, None, none, all_masked))?;
        let zero = self.f(b, 0.0);
        let range = (self.u(b, 0), self.total);
        let sum = grid::range_loop(b, self.t, range, &[(f32, zero)], &mut |b, j, acc| {
            let s = self.score(b, j)?;
            let x = build(b.f_sub(f32, None, s, max))?;
            let x = self.r(b, x)?;
            let e = self.math(b).exp(x)?;
            let e = self.r(b, e)?;
            let e = build(b.select(f32, None, empty, zero, e))?;
            self.set_score(b, j, e)?;
            Ok(vec![build(b.f_add(f32, None, acc[0], e))?])
        })?[0];
        let sum = self.r(b, sum)?;
        let is_zero = build(b.f_ord_equal(bool, None, sum, zero))?;
        let one = self.f(b, 1.0);
        build(b.select(f32, None, is_zero, one, sum))
    }

    /// Pass 3: the weights `round_v(r(e / sum))` into the array (and mode 3's output).
    fn weight_pass(&self, b: &mut Builder, sum: Word) -> R<()> {
        let f32 = self.t.f32;
        let range = (self.u(b, 0), self.total);
        grid::range_loop(b, self.t, range, &[], &mut |b, j, _| {
            let e = self.score(b, j)?;
            let p = build(b.f_div(f32, None, e, sum))?;
            let p = self.r(b, p)?;
            let p = self.round_to(b, p, self.l.v.elem)?;
            self.set_score(b, j, p)?;
            if matches!(self.l.scoring.qk_out, Some((_, 3))) {
                self.store_qk(b, j, Some(p))?;
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `y[row, c] = r(Σ_j p_j · v[j, c])` for every value column `c`.
    fn value_pass(&self, b: &mut Builder) -> R<()> {
        let l = self.l;
        let f32 = self.t.f32;
        let y_row = self.y_row(b)?;
        let columns = (self.u(b, 0), self.u(b, l.dv));
        grid::range_loop(b, self.t, columns, &[], &mut |b, c, _| {
            let zero = self.f(b, 0.0);
            let keys = (self.u(b, 0), self.total);
            let acc = grid::range_loop(b, self.t, keys, &[(f32, zero)], &mut |b, j, acc| {
                let p = self.score(b, j)?;
                let v_row = self.kv_row(b, l.v, l.pasts.map(|p| p.1), l.dv, j)?;
                let v = self.load(b, v_row, c, l.v.elem)?;
                let pv = self.product(b, p, v)?;
                Ok(vec![build(b.f_add(f32, None, acc[0], pv))?])
            })?[0];
            let y = self.r(b, acc)?;
            let c64 = self.wide(b, c)?;
            let index = build(b.i_add(self.t.u64, None, y_row, c64))?;
            self.store(b, l.y, l.q.elem, index, y)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The present keys and values `[B, Hkv, L, W]` (past rows, then current ones): this
    /// row `r` copies present rows `r + m·R` (`R` the query rows, `B·Hq·Sq`) that exist.
    fn present_pass(&self, b: &mut Builder) -> R<()> {
        let l = self.l;
        if l.present_k.is_none() && l.present_v.is_none() {
            return Ok(());
        }
        let (u32, bool) = (self.t.u32, self.t.bool);
        // R = count / Dv; B = R / (Hq·Sq); present rows B·Hkv·L.
        let dv = self.u(b, l.dv);
        let rows = build(b.u_div(u32, None, self.count, dv))?;
        let hq = self.u(b, l.hq);
        let per_batch = build(b.i_mul(u32, None, hq, self.sq))?;
        let batches = build(b.u_div(u32, None, rows, per_batch))?;
        let hkv = self.u(b, l.hkv);
        let per_batch_present = build(b.i_mul(u32, None, hkv, self.total))?;
        let present_rows = build(b.i_mul(u32, None, batches, per_batch_present))?;
        // ceil(per_batch_present / per_batch) copies per query row.
        let one = self.u(b, 1);
        let up = build(b.i_add(u32, None, per_batch_present, per_batch))?;
        let up = build(b.i_sub(u32, None, up, one))?;
        let copies = build(b.u_div(u32, None, up, per_batch))?;
        let range = (self.u(b, 0), copies);
        grid::range_loop(b, self.t, range, &[], &mut |b, m, _| {
            let step = build(b.i_mul(u32, None, m, rows))?;
            let t = build(b.i_add(u32, None, self.row, step))?;
            let exists = build(b.u_less_than(bool, None, t, present_rows))?;
            if_then(b, exists, |b| self.copy_present_row(b, t))?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// Copies present row `t` (`(batch · Hkv + group) · L + j`) of the keys and values.
    fn copy_present_row(&self, b: &mut Builder, t: Word) -> R<()> {
        let l = self.l;
        let u32 = self.t.u32;
        let (bg, j) = match l.total {
            Some(total) => grid::div_mod(b, u32, t, total)?,
            None => (
                build(b.u_div(u32, None, t, self.total))?,
                build(b.u_mod(u32, None, t, self.total))?,
            ),
        };
        let (batch, group) = grid::div_mod(b, u32, bg, l.hkv)?;
        let mut at = *self;
        at.batch = self.wide(b, batch)?;
        at.group = self.wide(b, group)?;
        let t64 = self.wide(b, t)?;
        let copies = [
            (l.present_k, l.k, l.pasts.map(|p| p.0), l.d),
            (l.present_v, l.v, l.pasts.map(|p| p.1), l.dv),
        ];
        for (out, op, past, width) in copies {
            let Some(out) = out else { continue };
            let src = at.kv_row(b, op, past, width, j)?;
            let base = self.times(b, t64, width)?;
            let range = (self.u(b, 0), self.u(b, width));
            grid::range_loop(b, self.t, range, &[], &mut |b, d, _| {
                let v = self.load(b, src, d, op.elem)?;
                let d64 = self.wide(b, d)?;
                let index = build(b.i_add(self.t.u64, None, base, d64))?;
                self.store(b, out, op.elem, index, v)?;
                Ok(Vec::new())
            })?;
        }
        Ok(())
    }
}

/// `a / n` and `a % n` of `u32`s, `n` a size (`value` its `u32` value of the module; a
/// constant division where static).
fn divmod(b: &mut Builder, t: &Prelude, a: Word, n: Size, value: Word) -> R<(Word, Word)> {
    match n {
        Size::Known(k) => grid::div_mod(b, t.u32, a, (k as u32).max(1)),
        Size::Param(_) => Ok((
            build(b.u_div(t.u32, None, a, value))?,
            build(b.u_mod(t.u32, None, a, value))?,
        )),
    }
}

/// `if (cond) { then }`: `then` emits into an open block and leaves one open.
fn if_then(b: &mut Builder, cond: Word, then: impl FnOnce(&mut Builder) -> R<()>) -> R<()> {
    let (body, merge) = (b.id(), b.id());
    build(b.selection_merge(merge, SelectionControl::NONE))?;
    build(b.branch_conditional(cond, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    then(b)?;
    build(b.branch(merge))?;
    build(b.begin_block(Some(merge)))?;
    Ok(())
}
