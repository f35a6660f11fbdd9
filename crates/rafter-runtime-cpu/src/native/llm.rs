//! The ops of an LLM decoder on borrowed operands: `linear` and `moe_ffn` over weights in
//! any format (quantized ones read in place by `rafter-kernels-cpu`'s quantized products),
//! `embedding` rows decoded where they are read, `rms_norm`, `rotary_embedding`, and
//! causal `attention` over a KV cache (f32, or f16 read in place and widened in registers).
//!
//! Each kernel covers the forms the LLM graph builder emits (`rafter_llm::graph`) and
//! returns `Ok(false)` for any other shape, so the reference path still runs every body
//! the IR allows.

use std::sync::Arc;

use half::f16;
use half::slice::HalfBitsSliceExt;
use rafter_ir::{DType, FfnActivation, Graph, Op, WeightFormat};
use rafter_kernels_cpu::{
    cached_attention, rms_norm, rope, BlockFormat, CachedAttention, Epilogue, Isa, MatMut, MatRef,
    MatmulPrecision, QuantMatRef, Residual, RopePairs,
};

use super::epilogue::{parse_chain_from, resolve, EpiOp, Src};
use super::{input_of, In, NativeKernel, Out, Par};

/// The kernels crate's name for an IR weight format.
fn kernel_format(f: WeightFormat) -> Option<rafter_kernels_cpu::WeightFormat> {
    use rafter_kernels_cpu::WeightFormat as K;
    Some(match f {
        WeightFormat::F32 => K::F32,
        WeightFormat::F16 => K::F16,
        WeightFormat::BF16 => K::Bf16,
        block => K::Block(BlockFormat::named(block.word())?),
    })
}

/// The kernel for a body the LLM builder makes, if any.
pub(super) fn select(
    body: &Graph,
    par: &Par,
    precision: MatmulPrecision,
) -> Option<Arc<dyn NativeKernel>> {
    let node = body.nodes.first()?;
    let single = body.nodes.len() == 1 && body.outputs.len() == 1;
    match &node.op {
        Op::Linear { format } => LinearKernel::select(body, *format, par, precision),
        Op::Embedding { format } if single => Some(Arc::new(EmbeddingKernel {
            format: *format,
            table: body_input(body, node.input(0)?)?,
            ids: body_input(body, node.input(1)?)?,
        })),
        Op::RmsNorm { epsilon, .. } if single => Some(Arc::new(RmsNormKernel {
            x: input_of(body, node.input(0), DType::F32)?,
            scale: Src::of(body, node.input(1))?,
            eps: *epsilon,
            par: par.clone(),
        })),
        Op::RotaryEmbedding {
            interleaved,
            num_heads,
            rotary_embedding_dim: 0,
        } if single && node.input(3).is_none() => Some(Arc::new(RopeKernel {
            x: input_of(body, node.input(0), DType::F32)?,
            cos: input_of(body, node.input(1), DType::F32)?,
            sin: input_of(body, node.input(2), DType::F32)?,
            heads: usize::try_from(*num_heads).ok()?,
            pairs: if *interleaved {
                RopePairs::Interleaved
            } else {
                RopePairs::Halves
            },
            par: par.clone(),
        })),
        Op::Attention { .. } if single => AttentionKernel::select(body, par),
        Op::MoeFfn { .. } if single => MoeKernel::select(body, par, precision),
        _ => None,
    }
}

/// The body input index of `v`, whatever its dtype.
fn body_input(body: &Graph, v: rafter_ir::ValueId) -> Option<usize> {
    match body.value(v).def {
        rafter_ir::ValueDef::Input(i) => Some(i),
        _ => None,
    }
}

/// [`rafter_kernels_cpu::quant_matmul`] with float weights' products at `precision`.
fn matmul(
    precision: MatmulPrecision,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn rafter_kernels_cpu::Parallel,
) -> Result<(), rafter_kernels_cpu::GemmError> {
    rafter_kernels_cpu::quant_matmul_with(Isa::detect(), precision, x, w, y, epilogue, par)
}

fn gemm_err(e: rafter_kernels_cpu::GemmError) -> String {
    format!("linear: {e}")
}

/// `linear(x, w, bias?)` and its elementwise tail (the residual add of `o_proj` and
/// `down_proj`).
struct LinearKernel {
    format: rafter_kernels_cpu::WeightFormat,
    x: usize,
    w: usize,
    bias: Option<Src>,
    chain: Vec<EpiOp>,
    precision: MatmulPrecision,
    par: Par,
}

impl LinearKernel {
    fn select(
        body: &Graph,
        format: WeightFormat,
        par: &Par,
        precision: MatmulPrecision,
    ) -> Option<Arc<dyn NativeKernel>> {
        let node = &body.nodes[0];
        let out = node.outputs.first().copied().flatten()?;
        Some(Arc::new(LinearKernel {
            format: kernel_format(format)?,
            x: input_of(body, node.input(0), DType::F32)?,
            w: body_input(body, node.input(1)?)?,
            bias: match node.input(2) {
                Some(b) => Some(Src::of(body, Some(b))?),
                None => None,
            },
            chain: parse_chain_from(body, out, 1)?,
            precision,
            par: par.clone(),
        }))
    }
}

impl NativeKernel for LinearKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (x, w) = (&ins[self.x], &ins[self.w]);
        let (Some(&k), Some(&n)) = (x.dims.last(), w.dims.first()) else {
            return Ok(false);
        };
        if w.dims.len() != 2 {
            return Ok(false);
        }
        let m: usize = x.dims[..x.dims.len() - 1].iter().product();
        let out_dims = outs[0].dims.clone();
        if out_dims.last() != Some(&n) || out_dims.iter().product::<usize>() != m * n {
            return Ok(false);
        }
        let bias = match &self.bias {
            Some(b) => match b.get(ins)? {
                (_, data) if data.len() == n => Some(data),
                _ => return Ok(false),
            },
            None => None,
        };
        let Some(r) = resolve(&self.chain, ins, &out_dims, out_dims.len() - 1, bias, false)? else {
            return Ok(false);
        };
        if r.alpha != 1.0 {
            return Ok(false);
        }
        let wref = QuantMatRef::new(self.format, w.bytes(), n, k).map_err(gemm_err)?;
        let xm = MatRef::row_major(x.f32s()?, m, k, k).map_err(gemm_err)?;
        let y = outs[0].f32s()?;
        let epi = Epilogue {
            bias: r.bias,
            activation: r.act,
            residual: r
                .residual
                .map(|res| Residual::row_major(res, n, r.res_before)),
            ..Epilogue::none()
        };
        let ym = MatMut::row_major(y, m, n, n).map_err(gemm_err)?;
        matmul(self.precision, xm, wref, ym, &epi, &*self.par).map_err(gemm_err)?;
        r.post(y);
        Ok(true)
    }
}

/// Rows of a table in any format, decoded into f32.
struct EmbeddingKernel {
    format: WeightFormat,
    table: usize,
    ids: usize,
}

/// Row `row` (of `cols` values) of a `format` table, decoded into `out`.
fn decode_row(
    format: WeightFormat,
    table: &[u8],
    row: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<(), String> {
    let bytes = format
        .row_bytes(cols)
        .ok_or_else(|| format!("{cols} values are not whole {} blocks", format.word()))?;
    let raw = table
        .get(row * bytes..(row + 1) * bytes)
        .ok_or_else(|| format!("the table has no row {row}"))?;
    match format {
        WeightFormat::F32 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        block => {
            let f = BlockFormat::named(block.word())
                .ok_or_else(|| format!("unknown block format {}", block.word()))?;
            rafter_quant::dequantize_row(f, raw, out).map_err(|e| format!("{e}"))?;
        }
    }
    Ok(())
}

impl NativeKernel for EmbeddingKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (table, ids) = (&ins[self.table], &ins[self.ids]);
        if table.dims.len() != 2 {
            return Ok(false);
        }
        let (rows, stored) = (table.dims[0], table.dims[1]);
        let Some(cols) = self.format.row_values(stored) else {
            return Ok(false);
        };
        let ids: Vec<i64> = match ids.dtype {
            DType::I64 => ids.i64s()?.to_vec(),
            DType::I32 => ids
                .bytes()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            _ => return Ok(false),
        };
        let y = outs[0].f32s()?;
        if y.len() != ids.len() * cols {
            return Ok(false);
        }
        for (i, (&id, out)) in ids.iter().zip(y.chunks_exact_mut(cols.max(1))).enumerate() {
            if id < 0 || id as usize >= rows {
                return Err(format!(
                    "embedding: id {id} (element {i}) is outside the table of {rows} rows"
                ));
            }
            decode_row(self.format, table.bytes(), id as usize, cols, out)?;
        }
        Ok(true)
    }
}

/// RMS normalisation over the last axis.
struct RmsNormKernel {
    x: usize,
    scale: Src,
    eps: f32,
    par: Par,
}

impl NativeKernel for RmsNormKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let Some(&cols) = x.dims.last() else {
            return Ok(false);
        };
        let (_, gamma) = self.scale.get(ins)?;
        if gamma.len() != cols || outs[0].dims != x.dims {
            return Ok(false);
        }
        rms_norm(
            x.f32s()?,
            outs[0].f32s()?,
            cols,
            gamma,
            self.eps,
            &*self.par,
        )
        .map_err(|e| format!("rms_norm: {e}"))?;
        Ok(true)
    }
}

/// Rotary embedding of `[batch, seq, heads * head_dim]` rows by `[batch, seq, head_dim/2]`
/// angle tables.
struct RopeKernel {
    x: usize,
    cos: usize,
    sin: usize,
    heads: usize,
    pairs: RopePairs,
    par: Par,
}

impl NativeKernel for RopeKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let (cos, sin) = (&ins[self.cos], &ins[self.sin]);
        if x.dims.len() != 3 || self.heads == 0 || x.dims[2] % self.heads != 0 {
            return Ok(false);
        }
        let head_dim = x.dims[2] / self.heads;
        let rows = x.dims[0] * x.dims[1];
        if cos.dims.iter().product::<usize>() != rows * head_dim / 2 || cos.dims != sin.dims {
            return Ok(false);
        }
        rope(
            x.f32s()?,
            outs[0].f32s()?,
            self.heads,
            head_dim,
            cos.f32s()?,
            sin.f32s()?,
            self.pairs,
            &*self.par,
        )
        .map_err(|e| format!("rotary_embedding: {e}"))?;
        Ok(true)
    }
}

/// ONNX Attention in the form of an LLM's cached attention: causal, batch 1, 3-D
/// `[1, seq, heads * head_dim]` queries over `[1, total, kv_heads * head_dim]` keys and
/// values, with `nonpad_kv_seqlen` giving the cache length (`past + seq`).
struct AttentionKernel {
    q: usize,
    k: usize,
    v: usize,
    nonpad: Option<usize>,
    q_heads: usize,
    kv_heads: usize,
    scale: Option<f32>,
    softcap: f32,
    window: Option<usize>,
    par: Par,
}

impl AttentionKernel {
    fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
        let node = &body.nodes[0];
        let Op::Attention {
            is_causal: true,
            kv_num_heads,
            q_num_heads,
            qk_matmul_output_mode: 0,
            scale,
            softcap,
            left_window_size,
            // The causal mask hides every later key already, whatever the right window.
            right_window_size: _,
        } = node.op
        else {
            return None;
        };
        // No mask, no past inputs, only `y` used.
        let extra = [3, 4, 5].iter().any(|&i| node.input(i).is_some());
        if extra || node.outputs.iter().skip(1).any(Option::is_some) {
            return None;
        }
        // The cache is f32 or f16 (both operands alike); queries and result are f32.
        let kv_dtype = body.value(node.input(1)?).ty.dtype;
        if !matches!(kv_dtype, DType::F32 | DType::F16) {
            return None;
        }
        Some(Arc::new(AttentionKernel {
            q: input_of(body, node.input(0), DType::F32)?,
            k: input_of(body, node.input(1), kv_dtype)?,
            v: input_of(body, node.input(2), kv_dtype)?,
            nonpad: match node.input(6) {
                Some(v) => Some(input_of(body, Some(v), DType::I64)?),
                None => None,
            },
            q_heads: usize::try_from(q_num_heads).ok()?,
            kv_heads: usize::try_from(kv_num_heads).ok()?,
            scale,
            softcap,
            window: usize::try_from(left_window_size).ok(),
            par: par.clone(),
        }))
    }
}

impl NativeKernel for AttentionKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (q, k, v) = (&ins[self.q], &ins[self.k], &ins[self.v]);
        let three_d = |d: &[usize]| d.len() == 3 && d[0] == 1;
        if !three_d(&q.dims) || !three_d(&k.dims) || k.dims != v.dims || outs[0].dims != q.dims {
            return Ok(false);
        }
        if self.kv_heads == 0 || q.dims[2] % self.q_heads.max(1) != 0 {
            return Ok(false);
        }
        let head_dim = q.dims[2] / self.q_heads.max(1);
        if k.dims[2] != self.kv_heads * head_dim {
            return Ok(false);
        }
        let (seq, total) = (q.dims[1], k.dims[1]);
        // Keys past `nonpad` are padding; query i sits at nonpad - seq + i. Without it the
        // causal frontier is aligned to the first key (ONNX's upper-left alignment).
        let (keys, past) = match self.nonpad {
            Some(i) => {
                let n = match ins[i].i64s()? {
                    [n] => *n,
                    _ => return Ok(false),
                };
                let n = usize::try_from(n).ok().filter(|&n| n <= total && n >= seq);
                let Some(n) = n else {
                    return Ok(false);
                };
                (n, n - seq)
            }
            None if total >= seq => (total, 0),
            None => return Ok(false),
        };
        let kw = self.kv_heads * head_dim;
        let a = CachedAttention {
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim,
            scale: self.scale.unwrap_or((head_dim as f32).powf(-0.5)),
            softcap: self.softcap.max(0.0),
            window: self.window,
        };
        let (q, out) = (q.f32s()?, outs[0].f32s()?);
        let r = match k.dtype {
            DType::F16 => {
                let ks = &k.u16s()?.reinterpret_cast::<f16>()[..keys * kw];
                let vs = &v.u16s()?.reinterpret_cast::<f16>()[..keys * kw];
                cached_attention(&a, q, ks, vs, past, out, &*self.par)
            }
            _ => {
                let (ks, vs) = (&k.f32s()?[..keys * kw], &v.f32s()?[..keys * kw]);
                cached_attention(&a, q, ks, vs, past, out, &*self.par)
            }
        };
        r.map_err(|e| format!("attention: {e}"))?;
        Ok(true)
    }
}

/// Routed experts: per token the top-k of the router's softmax, each chosen expert's gated
/// MLP, summed with the routing weights. Tokens are grouped by expert, so an expert's
/// weights are read once per call for all the tokens that chose it, and experts no token
/// chose are not read at all.
struct MoeKernel {
    top_k: usize,
    normalize: bool,
    activation: FfnActivation,
    formats: [rafter_kernels_cpu::WeightFormat; 3],
    x: usize,
    logits: usize,
    weights: [usize; 3],
    precision: MatmulPrecision,
    par: Par,
}

impl MoeKernel {
    fn select(
        body: &Graph,
        par: &Par,
        precision: MatmulPrecision,
    ) -> Option<Arc<dyn NativeKernel>> {
        let node = &body.nodes[0];
        let Op::MoeFfn {
            top_k,
            normalize,
            activation,
            gate_format,
            up_format,
            down_format,
        } = node.op
        else {
            return None;
        };
        Some(Arc::new(MoeKernel {
            top_k: usize::try_from(top_k).ok()?,
            normalize,
            activation,
            formats: [
                kernel_format(gate_format)?,
                kernel_format(up_format)?,
                kernel_format(down_format)?,
            ],
            x: input_of(body, node.input(0), DType::F32)?,
            logits: input_of(body, node.input(1), DType::F32)?,
            weights: [
                body_input(body, node.input(2)?)?,
                body_input(body, node.input(3)?)?,
                body_input(body, node.input(4)?)?,
            ],
            precision,
            par: par.clone(),
        }))
    }
}

impl NativeKernel for MoeKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (x, logits) = (&ins[self.x], &ins[self.logits]);
        let [gate, up, down] = self.weights.map(|i| &ins[i]);
        let (&[t, h], &[lt, e]) = (x.dims.as_slice(), logits.dims.as_slice()) else {
            return Ok(false);
        };
        let (Some(&ge), Some(&f)) = (gate.dims.first(), gate.dims.get(1)) else {
            return Ok(false);
        };
        if lt != t || ge != e || up.dims[..2] != [e, f] || down.dims[..2] != [e, h] {
            return Ok(false);
        }
        if self.top_k == 0 || self.top_k > e || outs[0].dims != [t, h] {
            return Ok(false);
        }
        let err = |e: rafter_kernels_cpu::GemmError| format!("moe_ffn: {e}");
        let xs = x.f32s()?;
        let ls = logits.f32s()?;
        // Tokens per expert, with their routing weights.
        let mut chosen: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
        for tok in 0..t {
            for (ex, w) in rafter_kernels_cpu::moe_route(
                &ls[tok * e..(tok + 1) * e],
                self.top_k,
                self.normalize,
            ) {
                chosen[ex].push((tok, w));
            }
        }
        let y = outs[0].f32s()?;
        y.fill(0.0);
        let (mut rows, mut g, mut u, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (ex, tokens) in chosen.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let m = tokens.len();
            rows.clear();
            for &(tok, _) in tokens {
                rows.extend_from_slice(&xs[tok * h..(tok + 1) * h]);
            }
            g.resize(m * f, 0.0);
            u.resize(m * f, 0.0);
            d.resize(m * h, 0.0);
            let xm = MatRef::row_major(&rows, m, h, h).map_err(err)?;
            let none = Epilogue::none();
            let gw = expert(gate.bytes(), self.formats[0], ex, f, h)?;
            matmul(
                self.precision,
                xm,
                gw,
                MatMut::row_major(&mut g, m, f, f).map_err(err)?,
                &none,
                &*self.par,
            )
            .map_err(err)?;
            let uw = expert(up.bytes(), self.formats[1], ex, f, h)?;
            matmul(
                self.precision,
                xm,
                uw,
                MatMut::row_major(&mut u, m, f, f).map_err(err)?,
                &none,
                &*self.par,
            )
            .map_err(err)?;
            match self.activation {
                FfnActivation::Silu => rafter_kernels_cpu::silu(&mut g, &*self.par),
                FfnActivation::GeluTanh => rafter_kernels_cpu::gelu_tanh(&mut g, &*self.par),
            }
            .map_err(|e| format!("moe_ffn: {e}"))?;
            for (a, b) in g.iter_mut().zip(&u) {
                *a *= b;
            }
            let dw = expert(down.bytes(), self.formats[2], ex, h, f)?;
            let gm = MatRef::row_major(&g, m, f, f).map_err(err)?;
            matmul(
                self.precision,
                gm,
                dw,
                MatMut::row_major(&mut d, m, h, h).map_err(err)?,
                &none,
                &*self.par,
            )
            .map_err(err)?;
            for (r, &(tok, w)) in tokens.iter().enumerate() {
                for (o, v) in y[tok * h..(tok + 1) * h]
                    .iter_mut()
                    .zip(&d[r * h..(r + 1) * h])
                {
                    *o += w * v;
                }
            }
        }
        Ok(true)
    }
}

/// Expert `ex`'s `[n, k]` matrix in a stacked `[experts, n, k]` weight.
fn expert(
    stacked: &[u8],
    format: rafter_kernels_cpu::WeightFormat,
    ex: usize,
    n: usize,
    k: usize,
) -> Result<QuantMatRef<'_>, String> {
    let err = |e: rafter_kernels_cpu::GemmError| format!("moe_ffn: {e}");
    let per = format.row_bytes(k).map_err(err)? * n;
    let bytes = stacked
        .get(ex * per..(ex + 1) * per)
        .ok_or_else(|| format!("moe_ffn: the stacked weight has no expert {ex}"))?;
    QuantMatRef::new(format, bytes, n, k).map_err(err)
}
