//! MatMul (batched, broadcast batch dims) and Gemm with their fused tail, by the packed GEMM
//! of `rafter-kernels-cpu` straight from borrowed operands: weights are read as `BRef::Mat`
//! over the mapped bytes, results are written into the output binding, and a bias, residual,
//! relu or scalar scale in the body runs in the GEMM's epilogue.

use std::sync::{Arc, Mutex};

use rafter_ir::{DType, Graph, Op};
use rafter_kernels_cpu::{
    sgemm, Activation, BRef, Epilogue, MatMut, MatRef, Parallel, Residual, Sequential,
};

use super::epilogue::{parse_chain, resolve, EpiOp, Resolved, Src};
use super::{input_of, In, NativeKernel, Out, Par};

struct GemmAttrs {
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    c: Option<Src>,
}

struct MatMulKernel {
    a: usize,
    b: usize,
    /// `Some` for ONNX Gemm (2-D only), `None` for MatMul.
    gemm: Option<GemmAttrs>,
    chain: Vec<EpiOp>,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let first = body.nodes.first()?;
    if first.outputs.len() != 1 || first.inputs.len() < 2 {
        return None;
    }
    let a = input_of(body, first.inputs[0], DType::F32)?;
    let b = input_of(body, first.inputs[1], DType::F32)?;
    let gemm = match &first.op {
        Op::MatMul if first.inputs.len() == 2 => None,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => Some(GemmAttrs {
            alpha: *alpha,
            beta: *beta,
            trans_a: *trans_a,
            trans_b: *trans_b,
            c: match first.inputs.get(2) {
                None | Some(None) => None,
                Some(c) => Some(Src::of(body, *c)?),
            },
        }),
        _ => return None,
    };
    let chain = parse_chain(body, first.outputs[0]?)?;
    Some(Arc::new(MatMulKernel {
        a,
        b,
        gemm,
        chain,
        par: par.clone(),
    }))
}

fn gemm_err(e: rafter_kernels_cpu::GemmError) -> String {
    format!("matmul: {e}")
}

/// The epilogue of `r` for rows `row0..` of a `[rows, n]` block whose residual starts at
/// element `off`.
/// The GEMM epilogue for the output elements `off..off + len`. A residual shorter than the
/// output repeats (one matrix for every batch entry, see `resolve`), so it is read at
/// `off` modulo its length.
fn epilogue<'a>(r: &Resolved<'a>, off: usize, len: usize, n: usize) -> Epilogue<'a> {
    Epilogue {
        bias: r.bias,
        activation: r.act,
        residual: r.residual.map(|res| {
            let at = off % res.len().max(1);
            Residual::row_major(&res[at..at + len], n, r.res_before)
        }),
        ..Epilogue::none()
    }
}

impl NativeKernel for MatMulKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        match &self.gemm {
            Some(g) => self.run_gemm(g, ins, outs),
            None => self.run_matmul(ins, outs),
        }
    }

    fn out_dims(&self, ins: &[In<'_>]) -> Option<Vec<usize>> {
        if self.gemm.is_some() {
            return None;
        }
        let (sa, sb) = (&ins[self.a].dims, &ins[self.b].dims);
        let (batch, m, _, n) = product_dims(sa, sb)?;
        Some(batch.into_iter().chain([m, n]).collect())
    }
}

/// The broadcast batch dims, M, K and N of a matmul of `sa` by `sb` (both at least 2-D);
/// `None` when the batch dims do not broadcast or the inner dims differ.
fn product_dims(sa: &[usize], sb: &[usize]) -> Option<(Vec<usize>, usize, usize, usize)> {
    if sa.len() < 2 || sb.len() < 2 {
        return None;
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    let (ab, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let rank = ab.len().max(bb.len());
    let dim = |d: &[usize], i: usize| (i + d.len()).checked_sub(rank).map_or(1, |j| d[j]);
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let (p, q) = (dim(ab, i), dim(bb, i));
        if p != q && p != 1 && q != 1 {
            return None;
        }
        batch.push(if p == 1 { q } else { p });
    }
    (k == kb).then_some((batch, m, k, n))
}

impl MatMulKernel {
    fn run_matmul(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let (x, y) = (&ins[self.a], &ins[self.b]);
        let (sa, sb) = (&x.dims, &y.dims);
        if sa.len() < 2 || sb.len() < 2 {
            return Ok(false);
        }
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if k != kb {
            return Err(format!("matmul: {sa:?} times {sb:?}: inner dims differ"));
        }
        let (ab, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
        let rank = ab.len().max(bb.len());
        let dim = |d: &[usize], i: usize| (i + d.len()).checked_sub(rank).map_or(1, |j| d[j]);
        let mut batch = Vec::with_capacity(rank);
        for i in 0..rank {
            let (p, q) = (dim(ab, i), dim(bb, i));
            if p != q && p != 1 && q != 1 {
                return Ok(false);
            }
            batch.push(if p == 1 { q } else { p });
        }
        let out_dims: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
        if outs[0].dims != out_dims {
            return Ok(false);
        }
        let Some(r) = resolve(&self.chain, ins, &out_dims, out_dims.len() - 1, None, true)? else {
            return Ok(false);
        };
        let (a, b) = (x.f32s()?, y.f32s()?);
        let c = outs[0].f32s()?;
        let batches: usize = batch.iter().product();
        if batches == 0 || m == 0 || n == 0 {
            return Ok(true);
        }
        let b_batches: usize = bb.iter().product();
        let a_batches: usize = ab.iter().product();
        let whole_residual = r.residual.is_none_or(|res| res.len() == c.len());
        if b_batches == 1 && a_batches == batches && whole_residual {
            // B shared by every batch (a weight): one GEMM over all rows of A.
            let rows = batches * m;
            let am = MatRef::row_major(a, rows, k, k).map_err(gemm_err)?;
            let bm = MatRef::row_major(b, k, n, n).map_err(gemm_err)?;
            let cm = MatMut::row_major(c, rows, n, n).map_err(gemm_err)?;
            let e = epilogue(&r, 0, rows * n, n);
            sgemm(r.alpha, am, BRef::Mat(bm), 0.0, cm, &e, &*self.par).map_err(gemm_err)?;
            r.post(c);
            return Ok(true);
        }
        // Element offsets of batch `t` in A and B (broadcast dims stride 0).
        let strides = |d: &[usize], mat: usize| -> Vec<usize> {
            let mut s = vec![0usize; rank];
            let mut acc = mat;
            for i in (0..rank).rev() {
                let n = dim(d, i);
                if n != 1 {
                    s[i] = acc;
                }
                acc *= n;
            }
            s
        };
        let (sa_, sb_) = (strides(ab, m * k), strides(bb, k * n));
        let offsets = |mut t: usize| {
            let (mut oa, mut ob) = (0, 0);
            for i in (0..rank).rev() {
                let idx = t % batch[i];
                t /= batch[i];
                oa += idx * sa_[i];
                ob += idx * sb_[i];
            }
            (oa, ob)
        };
        let one = |t: usize, ct: &mut [f32], par: &dyn Parallel| -> Result<(), String> {
            let (oa, ob) = offsets(t);
            let am = MatRef::row_major(&a[oa..oa + m * k], m, k, k).map_err(gemm_err)?;
            let bm = MatRef::row_major(&b[ob..ob + k * n], k, n, n).map_err(gemm_err)?;
            let cm = MatMut::row_major(ct, m, n, n).map_err(gemm_err)?;
            let e = epilogue(&r, t * m * n, m * n, n);
            sgemm(r.alpha, am, BRef::Mat(bm), 0.0, cm, &e, par).map_err(gemm_err)?;
            r.post(ct);
            Ok(())
        };
        if batches >= self.par.threads()
            && m * n * k < (1 << 22)
            && batches * m * n * k >= (1 << 22)
        {
            // Many small products (attention heads): one task per batch, each sequential.
            let chunks: Vec<Mutex<&mut [f32]>> = c.chunks_mut(m * n).map(Mutex::new).collect();
            let error = Mutex::new(None);
            self.par.run(batches, &|t| {
                let mut ct = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = one(t, &mut ct, &Sequential) {
                    *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            });
            if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
        } else {
            for (t, ct) in c.chunks_mut(m * n).enumerate() {
                one(t, ct, &*self.par)?;
            }
        }
        Ok(true)
    }

    fn run_gemm(
        &self,
        g: &GemmAttrs,
        ins: &[In<'_>],
        outs: &mut [Out<'_>],
    ) -> Result<bool, String> {
        let (x, y) = (&ins[self.a], &ins[self.b]);
        let (&[ar, ac], &[br, bc]) = (x.dims.as_slice(), y.dims.as_slice()) else {
            return Ok(false);
        };
        let (m, k) = if g.trans_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if g.trans_b { (bc, br) } else { (br, bc) };
        if k != kb {
            return Err(format!(
                "gemm: {:?} times {:?}: inner dims differ",
                x.dims, y.dims
            ));
        }
        let out_dims = [m, n];
        if outs[0].dims != out_dims {
            return Ok(false);
        }
        // C: a per-column bias ([N], [1, N]) or a full [M, N] residual, with beta 1.
        let (mut bias, mut residual) = (None, None);
        if let Some(c) = &g.c {
            let (dims, data) = c.get(ins)?;
            if g.beta != 1.0 {
                return Ok(false);
            }
            if dims == out_dims {
                residual = Some(data);
            } else if data.len() == n && dims.iter().rev().skip(1).all(|&d| d == 1) {
                bias = Some(data);
            } else {
                return Ok(false);
            }
        }
        let scaled = self.chain.iter().any(|o| matches!(o, EpiOp::Mul(_)));
        if (residual.is_some() && !self.chain.is_empty()) || (g.c.is_some() && scaled) {
            return Ok(false);
        }
        let Some(mut r) = resolve(&self.chain, ins, &out_dims, 1, bias, false)? else {
            return Ok(false);
        };
        if residual.is_some() {
            r.residual = residual;
            r.res_before = true;
        }
        if m == 0 || n == 0 {
            return Ok(true);
        }
        if m == 1 && g.trans_b && matches!(r.act, Activation::None | Activation::Relu) {
            self.gemv_rows(g.alpha * r.alpha, x.f32s()?, y.f32s()?, &r, outs[0].f32s()?);
            r.post(outs[0].f32s()?);
            return Ok(true);
        }
        let mut am = MatRef::row_major(x.f32s()?, ar, ac, ac).map_err(gemm_err)?;
        let mut bm = MatRef::row_major(y.f32s()?, br, bc, bc).map_err(gemm_err)?;
        if g.trans_a {
            am = am.t();
        }
        if g.trans_b {
            bm = bm.t();
        }
        let c = outs[0].f32s()?;
        let cm = MatMut::row_major(c, m, n, n).map_err(gemm_err)?;
        let e = epilogue(&r, 0, m * n, n);
        sgemm(
            g.alpha * r.alpha,
            am,
            BRef::Mat(bm),
            0.0,
            cm,
            &e,
            &*self.par,
        )
        .map_err(gemm_err)?;
        r.post(c);
        Ok(true)
    }

    /// `c[j] = act(scale * x·w[j] + bias[j] (+ res[j])) (+ res[j])` for a one-row product
    /// with B transposed (a classifier: `Gemm(x[1, K], W[N, K], transB=1)`): each output is a
    /// dot product of two contiguous rows. The GEMM path would pack W^T's columns, a
    /// strided gather of the whole weight per call (1.7 ms of MobileNetV2's 20 ms).
    fn gemv_rows(&self, scale: f32, x: &[f32], w: &[f32], r: &Resolved<'_>, c: &mut [f32]) {
        let (n, k) = (c.len(), x.len());
        let tasks = if n * k < (1 << 18) {
            1
        } else {
            self.par.threads().max(1) * 4
        };
        let per = n.div_ceil(tasks);
        let chunks: Vec<Mutex<&mut [f32]>> = c.chunks_mut(per.max(1)).map(Mutex::new).collect();
        self.par.run(chunks.len(), &|t| {
            let mut out = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
            for (i, o) in out.iter_mut().enumerate() {
                let j = t * per + i;
                let mut v = scale * dot(x, &w[j * k..(j + 1) * k]) + r.bias.map_or(0.0, |b| b[j]);
                let res = r.residual.map_or(0.0, |res| res[j]);
                if r.res_before {
                    v += res;
                }
                if r.act == Activation::Relu && v < 0.0 {
                    v = 0.0;
                }
                if !r.res_before {
                    v += res;
                }
                *o = v;
            }
        });
    }
}

/// A dot product in 16 independent partial sums (so it vectorises).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}
