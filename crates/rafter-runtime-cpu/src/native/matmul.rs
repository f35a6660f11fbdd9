//! MatMul (batched, broadcast batch dims) and Gemm with their fused tail, by the packed GEMM
//! of `rafter-kernels-cpu` straight from borrowed operands: weights are read as `BRef::Mat`
//! over the mapped bytes, results are written into the output binding, and a bias, residual,
//! relu or scalar scale in the body runs in the GEMM's epilogue.
//!
//! A weight the compiler pre-packed (`rafter_opt::prepack`) reaches the body as panels
//! `[ceil(N/16), K, 16]` followed by an unpacking prologue (`transpose`, `reshape`, maybe
//! `slice`); the kernel recognises that prologue and gives the GEMM the panels in place
//! (`BRef::Packed`), so no call packs B.

use std::sync::{Arc, Mutex};

use rafter_ir::{DType, Graph, Op, ValueId};
use rafter_kernels_cpu::{
    gemm_half, sgemm, Activation, BRef, Epilogue, HalfKind, MatMut, MatRef, PackedBRef,
    PackedHalfBRef, Parallel, Residual, Sequential, PACKED_B_NR,
};

use super::epilogue::{parse_chain_from, resolve, EpiOp, Resolved, Src};
use super::{input_of, In, NativeKernel, Out, Par};

struct GemmAttrs {
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    c: Option<Src>,
}

/// Where the product's B comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BSrc {
    /// Body input `i`, as the product reads it.
    Input(usize),
    /// Body input `input`, a weight pre-packed into `[ceil(n/16), k, 16]` panels that the
    /// body unpacks to `[k, n]` (see [`packed_prologue`]).
    Packed { input: usize, k: usize, n: usize },
    /// The same panels in a 16-bit format, which the body widens first.
    PackedHalf {
        input: usize,
        kind: HalfKind,
        k: usize,
        n: usize,
    },
}

/// B as a product reads it: f32 (plain or packed), or 16-bit packed panels.
enum Weight<'a> {
    F32(BRef<'a>),
    Half(PackedHalfBRef<'a>),
}

/// `C = alpha·A·B` with `e`'s epilogue, on the f32 GEMM or, for 16-bit weights, on
/// `gemm_half`.
fn product(
    alpha: f32,
    a: MatRef<'_>,
    b: Weight<'_>,
    c: MatMut<'_>,
    e: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<(), String> {
    match b {
        Weight::F32(b) => sgemm(alpha, a, b, 0.0, c, e, par),
        Weight::Half(b) => gemm_half(alpha, a, b, c, e, par),
    }
    .map_err(gemm_err)
}

/// The unpacking prologue of a pre-packed weight: `x [np, k, 16] → transpose [1, 0, 2] →
/// reshape [k, 16·np] (→ slice 0..n on axis 1)`, its result read once, by the product.
pub(super) struct Prologue {
    pub(super) input: usize,
    /// The panels' 16-bit format when they are stored so (`rafter compile --cpu-weights`):
    /// the prologue then starts with a `cast` to f32.
    pub(super) half: Option<HalfKind>,
    pub(super) unpacked: ValueId,
    pub(super) k: usize,
    pub(super) n: usize,
    /// Index of the first node after the prologue.
    pub(super) next: usize,
}

/// The prologue at the start of `body`, if it is exactly the one `rafter_opt::prepack`
/// writes (anything else, even if equivalent, is left to the generic paths).
pub(super) fn packed_prologue(body: &Graph) -> Option<Prologue> {
    packed_prologue_at(body, 0)
}

/// [`packed_prologue`] starting at node `start` (a depthwise block's body unpacks each of
/// its pre-packed 1×1 weights by one prologue, one after another at its start).
pub(super) fn packed_prologue_at(body: &Graph, start: usize) -> Option<Prologue> {
    let dims = |v: ValueId| super::known_dims(body, v);
    let consts = |v: Option<&Option<ValueId>>| body.const_of((*v?)?)?.to_i64s();
    let read_once = |v: ValueId| super::read_once(body, v);
    let single = |n: &rafter_ir::Node| match n.outputs.as_slice() {
        [Some(v)] => Some(*v),
        _ => None,
    };
    // 16-bit panels: `cast` to f32 first, its result read by the transpose alone.
    let (half, start) = match body.nodes.get(start) {
        Some(c) if matches!(c.op, Op::Cast { to: DType::F32 }) && c.inputs.len() == 1 => {
            let raw = c.input(0)?;
            let kind = match body.value(raw).ty.dtype {
                DType::F16 => HalfKind::F16,
                DType::BF16 => HalfKind::Bf16,
                _ => return None,
            };
            let widened = single(c)?;
            if !read_once(widened) || dims(widened)? != dims(raw)? {
                return None;
            }
            (Some((kind, raw, widened)), start + 1)
        }
        _ => (None, start),
    };
    let t = body.nodes.get(start)?;
    if !matches!(&t.op, Op::Transpose { perm } if perm[..] == [1, 0, 2]) || t.inputs.len() != 1 {
        return None;
    }
    let x = t.input(0)?;
    let input = match half {
        Some((_, raw, widened)) if x == widened => {
            super::input_of(body, Some(raw), body.value(raw).ty.dtype)?
        }
        Some(_) => return None,
        None => super::input_of(body, Some(x), DType::F32)?,
    };
    let half = half.map(|(kind, ..)| kind);
    let &[np, k, nr] = dims(x)?.as_slice() else {
        return None;
    };
    let width = np.checked_mul(nr)?;
    let tv = single(t)?;
    if nr != PACKED_B_NR || k == 0 || np == 0 || dims(tv)? != [k, np, nr] || !read_once(tv) {
        return None;
    }
    let r = body.nodes.get(start + 1)?;
    let target = [i64::try_from(k).ok()?, i64::try_from(width).ok()?];
    if !matches!(r.op, Op::Reshape { .. })
        || r.inputs.len() != 2
        || r.input(0) != Some(tv)
        || consts(r.inputs.get(1))? != target
    {
        return None;
    }
    let mut unpacked = single(r)?;
    if dims(unpacked)? != [k, width] {
        return None;
    }
    let (mut n, mut next) = (width, start + 2);
    if let Some(s) = body.nodes.get(start + 2) {
        if matches!(s.op, Op::Slice) && s.input(0) == Some(unpacked) {
            let steps_ok = match s.inputs.get(4) {
                None | Some(None) => true,
                v => consts(v)? == [1],
            };
            let axis = consts(s.inputs.get(3))?;
            let end = consts(s.inputs.get(2))?;
            let &[end] = end.as_slice() else {
                return None;
            };
            let end = usize::try_from(end).ok()?;
            if !read_once(unpacked)
                || !steps_ok
                || !(axis == [1] || axis == [-1])
                || consts(s.inputs.get(1))? != [0]
                || end == 0
                || end > width
            {
                return None;
            }
            unpacked = single(s)?;
            if dims(unpacked)? != [k, end] {
                return None;
            }
            (n, next) = (end, start + 3);
        }
    }
    if n.div_ceil(PACKED_B_NR) != np || !read_once(unpacked) {
        return None;
    }
    Some(Prologue {
        input,
        half,
        unpacked,
        k,
        n,
        next,
    })
}

struct MatMulKernel {
    a: usize,
    b: BSrc,
    /// `Some` for ONNX Gemm (2-D only), `None` for MatMul.
    gemm: Option<GemmAttrs>,
    chain: Vec<EpiOp>,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let prologue = packed_prologue(body);
    let at = prologue.as_ref().map_or(0, |p| p.next);
    let first = body.nodes.get(at)?;
    if first.outputs.len() != 1 || first.inputs.len() < 2 {
        return None;
    }
    let a = input_of(body, first.inputs[0], DType::F32)?;
    let b = match &prologue {
        Some(p) if first.inputs[1] == Some(p.unpacked) => match p.half {
            None => BSrc::Packed {
                input: p.input,
                k: p.k,
                n: p.n,
            },
            Some(kind) => BSrc::PackedHalf {
                input: p.input,
                kind,
                k: p.k,
                n: p.n,
            },
        },
        Some(_) => return None,
        None => BSrc::Input(input_of(body, first.inputs[1], DType::F32)?),
    };
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
    let packed = matches!(b, BSrc::Packed { .. } | BSrc::PackedHalf { .. });
    if packed && gemm.as_ref().is_some_and(|g| g.trans_b) {
        return None;
    }
    let chain = parse_chain_from(body, first.outputs[0]?, at + 1)?;
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

/// The fewest rows of a small product a task takes when the products of a batch are split
/// into bands for more threads than products: the GEMM's register tile is 4-16 rows, and
/// thinner bands repack B for little work.
const MIN_BAND_ROWS: usize = 16;

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
        let (sa, sb) = (&ins[self.a].dims, self.b_dims(ins));
        let (batch, m, _, n) = product_dims(sa, &sb)?;
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
    /// B's dims as the product sees them (`[k, n]` for a pre-packed weight).
    fn b_dims(&self, ins: &[In<'_>]) -> Vec<usize> {
        match self.b {
            BSrc::Input(i) => ins[i].dims.clone(),
            BSrc::Packed { k, n, .. } | BSrc::PackedHalf { k, n, .. } => vec![k, n],
        }
    }

    /// B for one product: `k x n` elements from element `off` of a plain operand, or the
    /// pre-packed panels in place (one matrix for every batch entry, so `off` is 0).
    fn b_ref<'a>(
        &self,
        ins: &'a [In<'a>],
        off: usize,
        k: usize,
        n: usize,
    ) -> Result<Weight<'a>, String> {
        match self.b {
            BSrc::Input(i) => {
                let b = ins[i].f32s()?;
                let m = MatRef::row_major(&b[off..off + k * n], k, n, n).map_err(gemm_err)?;
                Ok(Weight::F32(BRef::Mat(m)))
            }
            BSrc::Packed { input, .. } => {
                let p = PackedBRef::from_panels(k, n, ins[input].f32s()?)
                    .map_err(|e| format!("matmul: pre-packed weight: {e}"))?;
                Ok(Weight::F32(BRef::Packed(p)))
            }
            BSrc::PackedHalf { input, kind, .. } => {
                let p = PackedHalfBRef::from_panels(kind, k, n, ins[input].u16s()?)
                    .map_err(|e| format!("matmul: pre-packed 16-bit weight: {e}"))?;
                Ok(Weight::Half(p))
            }
        }
    }

    fn run_matmul(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.a];
        let sb_owned = self.b_dims(ins);
        let (sa, sb) = (&x.dims, &sb_owned);
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
        let a = x.f32s()?;
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
            let bm = self.b_ref(ins, 0, k, n)?;
            let cm = MatMut::row_major(c, rows, n, n).map_err(gemm_err)?;
            let e = epilogue(&r, 0, rows * n, n);
            product(r.alpha, am, bm, cm, &e, &*self.par)?;
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
        // Rows `r0..r0 + ct.len() / n` of batch `t`'s product into `ct`.
        let rows =
            |t: usize, r0: usize, ct: &mut [f32], par: &dyn Parallel| -> Result<(), String> {
                let (oa, ob) = offsets(t);
                let mr = ct.len() / n;
                let am = MatRef::row_major(&a[oa + r0 * k..oa + (r0 + mr) * k], mr, k, k)
                    .map_err(gemm_err)?;
                let bm = self.b_ref(ins, ob, k, n)?;
                let cm = MatMut::row_major(ct, mr, n, n).map_err(gemm_err)?;
                let e = epilogue(&r, t * m * n + r0 * n, mr * n, n);
                product(r.alpha, am, bm, cm, &e, par)?;
                r.post(ct);
                Ok(())
            };
        let threads = self.par.threads();
        if batches > 1 && m * n * k < (1 << 22) && batches * m * n * k >= (1 << 22) {
            // Many small products (attention heads): each task one sequential product, or a
            // band of one's rows when there are fewer products than threads (12 heads on 16
            // threads: one parallel product after another left most threads idle).
            let splits = threads
                .div_ceil(batches)
                .min(m.div_ceil(MIN_BAND_ROWS))
                .max(1);
            let band = m.div_ceil(splits);
            let tasks: Vec<(usize, usize, Mutex<&mut [f32]>)> = c
                .chunks_mut(m * n)
                .enumerate()
                .flat_map(|(t, ct)| {
                    ct.chunks_mut(band * n)
                        .enumerate()
                        .map(move |(j, part)| (t, j * band, Mutex::new(part)))
                })
                .collect();
            let error = Mutex::new(None);
            self.par.run(tasks.len(), &|i| {
                let (t, r0, part) = &tasks[i];
                let mut ct = part.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = rows(*t, *r0, &mut ct, &Sequential) {
                    *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            });
            if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
        } else {
            for (t, ct) in c.chunks_mut(m * n).enumerate() {
                rows(t, 0, ct, &*self.par)?;
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
        let x = &ins[self.a];
        let b_dims = self.b_dims(ins);
        let (&[ar, ac], &[br, bc]) = (x.dims.as_slice(), b_dims.as_slice()) else {
            return Ok(false);
        };
        let (m, k) = if g.trans_a { (ac, ar) } else { (ar, ac) };
        let (kb, n) = if g.trans_b { (bc, br) } else { (br, bc) };
        if k != kb {
            return Err(format!(
                "gemm: {:?} times {:?}: inner dims differ",
                x.dims, b_dims
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
        if let (BSrc::Input(b), true) = (self.b, m == 1 && g.trans_b) {
            if matches!(r.act, Activation::None | Activation::Relu) {
                let w = ins[b].f32s()?;
                self.gemv_rows(g.alpha * r.alpha, x.f32s()?, w, &r, outs[0].f32s()?);
                r.post(outs[0].f32s()?);
                return Ok(true);
            }
        }
        let mut am = MatRef::row_major(x.f32s()?, ar, ac, ac).map_err(gemm_err)?;
        if g.trans_a {
            am = am.t();
        }
        let bm = match self.b {
            BSrc::Input(b) => {
                let bm = MatRef::row_major(ins[b].f32s()?, br, bc, bc).map_err(gemm_err)?;
                Weight::F32(BRef::Mat(if g.trans_b { bm.t() } else { bm }))
            }
            // `select` takes a pre-packed B only untransposed (the packing folded it).
            BSrc::Packed { .. } | BSrc::PackedHalf { .. } => self.b_ref(ins, 0, k, n)?,
        };
        let c = outs[0].f32s()?;
        let cm = MatMut::row_major(c, m, n, n).map_err(gemm_err)?;
        let e = epilogue(&r, 0, m * n, n);
        product(g.alpha * r.alpha, am, bm, cm, &e, &*self.par)?;
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
                let mut v = scale * rafter_kernels_cpu::dot16(x, &w[j * k..(j + 1) * k])
                    + r.bias.map_or(0.0, |b| b[j]);
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
