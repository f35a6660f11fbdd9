//! Data movement on borrowed bytes: reshape-likes (reshape, flatten, squeeze, unsqueeze) are
//! one `memcpy` of the operand's bytes into the result (their row-major order is unchanged);
//! transposes walk the output in order, copying whole rows when the last axis stays last;
//! f32 transposes that are batched 2-D ones once their axes are merged (NCHW ↔ NHWC) run
//! tiled over the worker pool (`rafter_kernels_cpu::transpose_f32`), and f32 ones that keep
//! the last axis last (attention's head split and merge) copy their rows over the pool
//! (`rafter_kernels_cpu::permute_rows_f32`).

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op, ValueDef};
use rafter_kernels_cpu::{permute_rows_f32, transpose_f32};

use super::{In, NativeKernel, Out, Par};

/// How a reshape-like op's result dims follow from its operands (for results in host
/// slots, whose dims the symbols do not give).
enum Shape {
    /// ONNX Reshape by an i64 shape: a body input, or a constant copied into the body.
    Reshape {
        allow_zero: bool,
        input: Option<usize>,
        constant: Option<Vec<i64>>,
    },
    Flatten(i64),
    Unknown,
}

enum Kind {
    /// The result is the operand's bytes.
    Copy(Shape),
    Transpose(Vec<usize>),
    /// Concat along `axis` of parts that are body inputs or body constants (raw bytes).
    Concat {
        axis: i64,
        parts: Vec<Part>,
    },
    /// ONNX Gather along `axis` of operand `data` by i64 operand `indices`: whole rows copied
    /// (an embedding lookup reads only the rows it needs from the mapped weight).
    Gather {
        axis: i64,
        data: usize,
        indices: usize,
    },
}

/// One operand of a concat.
enum Part {
    Input(usize),
    Const { dims: Vec<usize>, bytes: Vec<u8> },
}

struct MovementKernel {
    kind: Kind,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let kind = kind_of(body)?;
    Some(Arc::new(MovementKernel {
        kind,
        par: par.clone(),
    }))
}

fn kind_of(body: &Graph) -> Option<Kind> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let x = (*node.inputs.first()?)?;
    let y = (*node.outputs.first()?)?;
    if let Op::Gather { axis } = node.op {
        let (ValueDef::Input(data), Some(ix)) = (body.value(x).def, *node.inputs.get(1)?) else {
            return None;
        };
        let ValueDef::Input(indices) = body.value(ix).def else {
            return None;
        };
        if body.value(ix).ty.dtype != DType::I64
            || body.outputs != [y]
            || node.outputs.len() != 1
            || body.value(x).ty.dtype != body.value(y).ty.dtype
        {
            return None;
        }
        return Some(Kind::Gather {
            axis,
            data,
            indices,
        });
    }
    if let Op::Concat { axis } = node.op {
        let dtype = body.value(y).ty.dtype;
        let parts = node
            .inputs
            .iter()
            .map(|v| {
                let v = (*v)?;
                if body.value(v).ty.dtype != dtype {
                    return None;
                }
                match body.value(v).def {
                    ValueDef::Input(i) => Some(Part::Input(i)),
                    _ => body.const_of(v).map(|c| Part::Const {
                        dims: c.dims.clone(),
                        bytes: c.bytes.to_vec(),
                    }),
                }
            })
            .collect::<Option<Vec<_>>>()?;
        if parts.is_empty() || body.outputs != [y] || node.outputs.len() != 1 {
            return None;
        }
        return Some(Kind::Concat { axis, parts });
    }
    if body.value(x).def != ValueDef::Input(0)
        || body.outputs != [y]
        || node.outputs.len() != 1
        || body.value(x).ty.dtype != body.value(y).ty.dtype
    {
        return None;
    }
    let kind = match &node.op {
        Op::Reshape { allow_zero } => {
            let shape = node.inputs.get(1).copied().flatten();
            Kind::Copy(Shape::Reshape {
                allow_zero: *allow_zero,
                input: shape.and_then(|v| match body.value(v).def {
                    ValueDef::Input(i) if body.value(v).ty.dtype == DType::I64 => Some(i),
                    _ => None,
                }),
                constant: shape
                    .and_then(|v| body.const_of(v))
                    .and_then(|c| c.to_i64s()),
            })
        }
        Op::Flatten { axis } => Kind::Copy(Shape::Flatten(*axis)),
        Op::Squeeze { .. } | Op::Unsqueeze { .. } => Kind::Copy(Shape::Unknown),
        Op::Transpose { perm }
            if node.inputs.len() == 1
                && matches!(body.value(x).ty.dtype, DType::F32 | DType::I64) =>
        {
            Kind::Transpose(
                perm.iter()
                    .map(|&p| usize::try_from(p).ok())
                    .collect::<Option<_>>()?,
            )
        }
        _ => return None,
    };
    Some(kind)
}

impl NativeKernel for MovementKernel {
    fn out_dims(&self, ins: &[In<'_>]) -> Option<Vec<usize>> {
        match &self.kind {
            Kind::Copy(shape) => copy_dims(shape, ins),
            Kind::Concat { .. } => None,
            Kind::Transpose(perm) => permuted(&ins[0].dims, perm).ok(),
            &Kind::Gather {
                axis,
                data,
                indices,
            } => {
                let (x, idx) = (&ins[data].dims, &ins[indices].dims);
                let axis = if axis < 0 {
                    axis + x.len() as i64
                } else {
                    axis
                };
                let axis = usize::try_from(axis).ok().filter(|&a| a < x.len())?;
                Some(
                    x[..axis]
                        .iter()
                        .chain(idx)
                        .chain(&x[axis + 1..])
                        .copied()
                        .collect(),
                )
            }
        }
    }

    fn append_parts(&self) -> Option<(usize, usize, i64)> {
        match &self.kind {
            Kind::Concat { axis, parts } => match parts.as_slice() {
                [Part::Input(a), Part::Input(b)] => Some((*a, *b, *axis)),
                _ => None,
            },
            _ => None,
        }
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[0];
        let y = &mut outs[0];
        match &self.kind {
            &Kind::Gather {
                axis,
                data,
                indices,
            } => gather_rows(&ins[data], &ins[indices], axis, y),
            Kind::Concat { axis, parts } => {
                let parts: Vec<(&[usize], &[u8])> = parts
                    .iter()
                    .map(|p| match p {
                        Part::Input(i) => (ins[*i].dims.as_slice(), ins[*i].bytes()),
                        Part::Const { dims, bytes } => (dims.as_slice(), bytes.as_slice()),
                    })
                    .collect();
                concat(&parts, *axis, y)
            }
            Kind::Copy(_) => {
                if x.len() != y.dims.iter().product::<usize>() {
                    return Ok(false);
                }
                y.bytes_mut().copy_from_slice(x.bytes());
                Ok(true)
            }
            Kind::Transpose(perm) => {
                let out_dims = permuted(&x.dims, perm)?;
                if y.dims != out_dims {
                    return Ok(false);
                }
                let (dims, perm) = merged_axes(&x.dims, perm);
                let batched_2d = match (dims.as_slice(), perm.as_slice()) {
                    (&[r, c], [1, 0]) => Some([1, r, c]),
                    (&[b, r, c], [0, 2, 1]) => Some([b, r, c]),
                    _ => None,
                };
                if let (DType::F32, Some(brc)) = (x.dtype, batched_2d) {
                    transpose_f32(x.f32s()?, brc, y.f32s()?, &*self.par)
                        .map_err(|e| format!("transpose: {e}"))?;
                    return Ok(true);
                }
                if x.dtype == DType::F32 && perm.last() == Some(&(perm.len() - 1)) {
                    permute_rows_f32(x.f32s()?, &dims, &perm, y.f32s()?, &*self.par)
                        .map_err(|e| format!("transpose: {e}"))?;
                    return Ok(true);
                }
                if x.dtype == DType::F32 && across_planes(&perm) {
                    transpose_planes(x.f32s()?, &dims, &perm, y.f32s()?);
                    return Ok(true);
                }
                let esize = x.dtype.size_of();
                transpose_bytes(x.bytes(), &dims, &perm, esize, y.bytes_mut());
                Ok(true)
            }
        }
    }
}

/// `dims` permuted by `perm`, after checking that `perm` is a permutation of its axes.
pub(crate) fn permuted(dims: &[usize], perm: &[usize]) -> Result<Vec<usize>, String> {
    let rank = dims.len();
    let mut seen = vec![false; rank];
    if perm.len() != rank
        || perm
            .iter()
            .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
    {
        return Err(format!(
            "transpose: perm {perm:?} is not a permutation of {rank} axes"
        ));
    }
    Ok(perm.iter().map(|&p| dims[p]).collect())
}

/// Transposes `x` (row-major `shape`, elements of `esize` bytes) into `y`: output axis `i`
/// is input axis `perm[i]` (a valid permutation). An odometer over the output's outer axes;
/// the innermost axis is one `memcpy` when it stays contiguous.
fn transpose_bytes(x: &[u8], shape: &[usize], perm: &[usize], esize: usize, y: &mut [u8]) {
    let rank = shape.len();
    if x.is_empty() || rank == 0 {
        y.copy_from_slice(x);
        return;
    }
    let in_strides: Vec<usize> = row_major_strides(shape)
        .into_iter()
        .map(|s| s * esize)
        .collect();
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let (inner, inner_stride) = (out_shape[rank - 1], strides[rank - 1]);
    let row = inner * esize;
    let mut idx = vec![0usize; rank - 1];
    let mut base = 0usize;
    for dst in y.chunks_exact_mut(row) {
        if inner_stride == esize {
            dst.copy_from_slice(&x[base..base + row]);
        } else {
            match esize {
                4 => gather::<4>(dst, x, base, inner_stride),
                8 => gather::<8>(dst, x, base, inner_stride),
                _ => {
                    for (j, d) in dst.chunks_exact_mut(esize).enumerate() {
                        let s = base + j * inner_stride;
                        d.copy_from_slice(&x[s..s + esize]);
                    }
                }
            }
        }
        // Advance the odometer over the outer output axes.
        let mut d = rank - 1;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            base += strides[d];
            if idx[d] < out_shape[d] {
                break;
            }
            base -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// The same transpose on fewer axes: axes of extent 1 dropped, and input axes that stay
/// adjacent and in order in the output merged into one. NCHW → NHWC of `[1, 3, 224, 224]`
/// becomes the 2-D `[3, 50176]` → `[50176, 3]`, so the blocked kernel walks one plane in
/// long rows instead of 224 planes of 224×3.
fn merged_axes(dims: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Output order of the input axes that are not 1, then runs of consecutive input axes.
    let kept: Vec<usize> = perm.iter().copied().filter(|&a| dims[a] != 1).collect();
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (first input axis, last input axis)
    for &a in &kept {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == a => *last = a,
            _ => runs.push((a, a)),
        }
    }
    if runs.is_empty() {
        return (vec![1], vec![0]);
    }
    // Input order of the runs gives the new input axes.
    let mut by_input: Vec<usize> = (0..runs.len()).collect();
    by_input.sort_by_key(|&r| runs[r].0);
    let new_dims: Vec<usize> = by_input
        .iter()
        .map(|&r| dims[runs[r].0..=runs[r].1].iter().product())
        .collect();
    let mut new_perm = vec![0usize; runs.len()];
    for (new_axis, &r) in by_input.iter().enumerate() {
        new_perm[r] = new_axis;
    }
    (new_dims, new_perm)
}

/// Elements between consecutive indices of each axis of a row-major `shape`.
fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Whether the input's innermost axis stops being the output's innermost one (a key
/// transposed for `Q·Kᵀ`, `[b, s, h, d] -> [b, h, d, s]`): then a row of the output
/// gathers one element per input row, and [`transpose_planes`] does it in cache blocks.
fn across_planes(perm: &[usize]) -> bool {
    let rank = perm.len();
    rank >= 2 && perm[rank - 1] != rank - 1
}

/// [`transpose_bytes`] for [`across_planes`] permutations: for every position of the other
/// axes, the plane of output axes `p` (the input's contiguous axis) and the last is
/// transposed in 8×8 blocks, so each block reads 8 input rows and writes 8 output rows
/// while they are in cache: MiniLM-L6's `[1, 128, 12, 32]` key took 83–90 µs element by
/// element (a cache line per element), 55–56 µs in blocks (2 threads; benchmarks/RESULTS.md,
/// "Kernel-level measurements").
fn transpose_planes<T: Copy>(x: &[T], shape: &[usize], perm: &[usize], y: &mut [T]) {
    const B: usize = 8;
    let rank = shape.len();
    let in_strides = row_major_strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let out_strides = row_major_strides(&out_shape);
    let p = perm
        .iter()
        .position(|&a| a == rank - 1)
        .expect("a permutation");
    let (rows, cols) = (out_shape[p], out_shape[rank - 1]);
    let (row_out, col_in) = (out_strides[p], in_strides[perm[rank - 1]]);
    // The other output axes, walked by an odometer: (extent, input stride, output stride).
    let outer: Vec<(usize, usize, usize)> = (0..rank - 1)
        .filter(|&a| a != p)
        .map(|a| (out_shape[a], in_strides[perm[a]], out_strides[a]))
        .collect();
    let planes: usize = outer.iter().map(|o| o.0).product();
    let mut idx = vec![0usize; outer.len()];
    let (mut x0, mut y0) = (0usize, 0usize);
    for _ in 0..planes {
        for r0 in (0..rows).step_by(B) {
            for c0 in (0..cols).step_by(B) {
                for r in r0..(r0 + B).min(rows) {
                    let (xr, yr) = (x0 + r, y0 + r * row_out);
                    for c in c0..(c0 + B).min(cols) {
                        y[yr + c] = x[xr + c * col_in];
                    }
                }
            }
        }
        // Advance the odometer over the other axes.
        for (d, &(extent, si, so)) in outer.iter().enumerate().rev() {
            idx[d] += 1;
            x0 += si;
            y0 += so;
            if idx[d] < extent {
                break;
            }
            x0 -= si * extent;
            y0 -= so * extent;
            idx[d] = 0;
        }
    }
}

/// Elements of `N` bytes at `base + j * stride` of `x`, in order, into `dst`.
fn gather<const N: usize>(dst: &mut [u8], x: &[u8], base: usize, stride: usize) {
    for (j, d) in dst.chunks_exact_mut(N).enumerate() {
        let s = base + j * stride;
        let e: [u8; N] = x[s..s + N].try_into().expect("N bytes");
        d.copy_from_slice(&e);
    }
}

/// ONNX Gather of `x` along `axis` by `idx` (negative indices count from the end) into `y`.
fn gather_rows(x: &In<'_>, idx: &In<'_>, axis: i64, y: &mut Out<'_>) -> Result<bool, String> {
    let rank = x.dims.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Ok(false);
    }
    let axis = axis as usize;
    let out_dims: Vec<usize> = x.dims[..axis]
        .iter()
        .chain(&idx.dims)
        .chain(&x.dims[axis + 1..])
        .copied()
        .collect();
    if y.dims != out_dims {
        return Ok(false);
    }
    let ids = idx.i64s()?;
    let n = x.dims[axis];
    let row = x.dims[axis + 1..].iter().product::<usize>() * x.dtype.size_of();
    let outer: usize = x.dims[..axis].iter().product();
    let src = x.bytes();
    let dst = y.bytes_mut();
    if row == 0 || ids.is_empty() || outer == 0 {
        return Ok(true);
    }
    // An index out of range: the reference path reports it, naming the node.
    if ids.iter().any(|&i| i < -(n as i64) || i >= n as i64) {
        return Ok(false);
    }
    let mut rows = dst.chunks_exact_mut(row);
    for o in 0..outer {
        for &i in ids {
            let j = if i < 0 { i + n as i64 } else { i };
            let s = (o * n + j as usize) * row;
            rows.next()
                .expect("the result holds outer x indices rows")
                .copy_from_slice(&src[s..s + row]);
        }
    }
    Ok(true)
}

/// Concat of `parts` (dims, bytes) along `axis` into `y`; `Ok(false)` when the dims do not
/// fit together or differ from `y`'s (the reference path reports it).
fn concat(parts: &[(&[usize], &[u8])], axis: i64, y: &mut Out<'_>) -> Result<bool, String> {
    let rank = y.dims.len();
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    let Some(axis) = usize::try_from(axis).ok().filter(|&a| a < rank) else {
        return Ok(false);
    };
    let esize = y.dtype.size_of();
    let mut along = 0;
    for (dims, bytes) in parts {
        if dims.iter().product::<usize>() * esize != bytes.len() {
            return Ok(false);
        }
        let same_else = dims.len() == rank
            && dims
                .iter()
                .zip(&y.dims)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_else {
            return Ok(false);
        }
        along += dims[axis];
    }
    if along != y.dims[axis] {
        return Ok(false);
    }
    let outer: usize = y.dims[..axis].iter().product();
    let inner: usize = y.dims[axis + 1..].iter().product::<usize>() * esize;
    let dst = y.bytes_mut();
    let mut at = 0;
    for o in 0..outer {
        for (dims, bytes) in parts {
            let block = dims[axis] * inner;
            dst[at..at + block].copy_from_slice(&bytes[o * block..(o + 1) * block]);
            at += block;
        }
    }
    Ok(true)
}

/// The result dims of a reshape-like op, when its operands tell them.
fn copy_dims(shape: &Shape, ins: &[In<'_>]) -> Option<Vec<usize>> {
    let x = &ins[0].dims;
    match shape {
        Shape::Reshape {
            allow_zero,
            input,
            constant,
        } => {
            let target: &[i64] = match (input, constant) {
                (Some(i), _) => ins[*i].i64s().ok()?,
                (None, Some(c)) => c,
                _ => return None,
            };
            let mut dims = Vec::with_capacity(target.len());
            let mut infer = None;
            for (i, &t) in target.iter().enumerate() {
                dims.push(match t {
                    0 if !allow_zero => *x.get(i)?,
                    -1 if infer.is_none() => {
                        infer = Some(i);
                        1
                    }
                    t => usize::try_from(t).ok()?,
                });
            }
            let n: usize = x.iter().product();
            if let Some(i) = infer {
                let rest: usize = dims.iter().product();
                if rest == 0 || n % rest != 0 {
                    return None;
                }
                dims[i] = n / rest;
            }
            (dims.iter().product::<usize>() == n).then_some(dims)
        }
        Shape::Flatten(axis) => {
            let r = x.len() as i64;
            let a = if *axis < 0 { axis + r } else { *axis };
            let a = usize::try_from(a).ok().filter(|&a| a <= x.len())?;
            Some(vec![x[..a].iter().product(), x[a..].iter().product()])
        }
        Shape::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every permutation of ranks 2 to 4 that moves the innermost axis, on odd extents
    /// (partial 8×8 blocks): the blocked planes against the element-by-element odometer,
    /// checked by value (element `i` holds `i`).
    #[test]
    fn blocked_planes_match_the_odometer() {
        fn perms(n: usize) -> Vec<Vec<usize>> {
            if n == 1 {
                return vec![vec![0]];
            }
            let mut out = Vec::new();
            for p in perms(n - 1) {
                for at in 0..n {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    out.push(q);
                }
            }
            out
        }
        for shape in [vec![13, 9], vec![3, 11, 10], vec![2, 9, 3, 17]] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            for perm in perms(shape.len()) {
                if !across_planes(&perm) {
                    continue;
                }
                let mut want = vec![0u8; n * 4];
                transpose_bytes(&bytes, &shape, &perm, 4, &mut want);
                let mut got = vec![0f32; n];
                transpose_planes(&x, &shape, &perm, &mut got);
                let got: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(got, want, "shape {shape:?} perm {perm:?}");
            }
        }
    }

    /// Merging axes changes nothing: every permutation of ranks 2 to 4 on shapes with
    /// extent-1 axes (NCHW ↔ NHWC of one image among them), merged, against the odometer on
    /// the shape as given.
    #[test]
    fn merged_axes_transpose_the_same() {
        let perms4: Vec<Vec<usize>> = (0..24)
            .map(|mut k| {
                let mut left: Vec<usize> = (0..4).collect();
                let mut p = Vec::new();
                for f in [6, 2, 1, 1] {
                    p.push(left.remove(k / f));
                    k %= f;
                }
                p
            })
            .collect();
        for shape in [
            vec![1, 3, 5, 7],
            vec![2, 1, 4, 3],
            vec![1, 6, 1, 1],
            vec![1, 1, 1, 1],
        ] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            for perm in &perms4 {
                let mut want = vec![0u8; n * 4];
                transpose_bytes(&bytes, &shape, perm, 4, &mut want);
                let (dims, p) = merged_axes(&shape, perm);
                assert_eq!(dims.iter().product::<usize>(), n);
                let mut got = vec![0u8; n * 4];
                transpose_bytes(&bytes, &dims, &p, 4, &mut got);
                assert_eq!(
                    got, want,
                    "shape {shape:?} perm {perm:?} merged {dims:?} {p:?}"
                );
            }
        }
        assert_eq!(
            merged_axes(&[1, 3, 224, 224], &[0, 2, 3, 1]),
            (vec![3, 50176], vec![1, 0])
        );
    }
}
