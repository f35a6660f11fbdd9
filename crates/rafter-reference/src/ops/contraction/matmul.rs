//! MatMul, Gemm, MatMulInteger and Einsum.

use super::{by_float, for_each_index, Real};
use crate::ops::broadcast::broadcast_shapes;
use crate::ops::{arg, invalid, unsupported, OpError};
use crate::Tensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Axis, Ix2, IxDyn};
use num_traits::{WrappingAdd, WrappingMul, Zero};

/// NumPy `matmul` of two arrays: 1-D operands are promoted (a row for `a`, a column for
/// `b`) and the promoted dims dropped again; batch dims broadcast. `mm` multiplies one
/// pair of matrices into the output matrix (which starts zeroed).
pub(crate) fn batched_matmul<T: Clone + Zero>(
    a: ArrayViewD<T>,
    b: ArrayViewD<T>,
    mut mm: impl FnMut(ArrayView2<T>, ArrayView2<T>, ArrayViewMut2<T>),
) -> Result<ArrayD<T>, OpError> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra == 0 || rb == 0 {
        return invalid("matmul operands must have rank >= 1");
    }
    let a2 = if ra == 1 { a.insert_axis(Axis(0)) } else { a };
    let b2 = if rb == 1 { b.insert_axis(Axis(1)) } else { b };
    let (m, k) = (a2.shape()[a2.ndim() - 2], a2.shape()[a2.ndim() - 1]);
    let (k2, n) = (b2.shape()[b2.ndim() - 2], b2.shape()[b2.ndim() - 1]);
    if k != k2 {
        return invalid(format!(
            "matmul of shapes {:?} and {:?}: inner dims differ",
            a2.shape(),
            b2.shape()
        ));
    }
    let batch = broadcast_shapes(&a2.shape()[..a2.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let full = |mut s: Vec<usize>, r, c| {
        s.push(r);
        s.push(c);
        s
    };
    let av = a2
        .broadcast(IxDyn(&full(batch.clone(), m, k)))
        .ok_or_else(|| OpError::Invalid("matmul batch dims do not broadcast".into()))?;
    let bv = b2
        .broadcast(IxDyn(&full(batch.clone(), k, n)))
        .ok_or_else(|| OpError::Invalid("matmul batch dims do not broadcast".into()))?;
    let mut out = ArrayD::<T>::zeros(IxDyn(&full(batch.clone(), m, n)));
    for_each_index(&batch, |idx| {
        let (mut x, mut y, mut o) = (av.view(), bv.view(), out.view_mut());
        for &i in idx {
            x = x.index_axis_move(Axis(0), i);
            y = y.index_axis_move(Axis(0), i);
            o = o.index_axis_move(Axis(0), i);
        }
        mm(
            x.into_dimensionality::<Ix2>().expect("rank 2"),
            y.into_dimensionality::<Ix2>().expect("rank 2"),
            o.into_dimensionality::<Ix2>().expect("rank 2"),
        );
    });
    let mut shape = batch;
    if ra != 1 {
        shape.push(m);
    }
    if rb != 1 {
        shape.push(n);
    }
    Ok(out
        .into_shape_with_order(IxDyn(&shape))
        .expect("same element count"))
}

/// `o = a @ b` for floats, through the blocked matrix product.
pub(crate) fn mm_float<T: Real>(a: ArrayView2<T>, b: ArrayView2<T>, mut o: ArrayViewMut2<T>) {
    general_mat_mul(T::one(), &a, &b, T::zero(), &mut o);
}

/// `o = a @ b` for integers, wrapping on overflow.
pub(crate) fn mm_wrapping<T>(a: ArrayView2<T>, b: ArrayView2<T>, mut o: ArrayViewMut2<T>)
where
    T: Copy + Zero + WrappingAdd + WrappingMul,
{
    let (m, k) = a.dim();
    let n = b.dim().1;
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::zero();
            for l in 0..k {
                acc = acc.wrapping_add(&a[[i, l]].wrapping_mul(&b[[l, j]]));
            }
            o[[i, j]] = acc;
        }
    }
}

pub fn matmul(inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let (a, b) = (arg(inputs, 0)?, arg(inputs, 1)?);
    if a.dtype() != b.dtype() {
        return invalid(format!("matmul of {} and {}", a.dtype(), b.dtype()));
    }
    macro_rules! int {
        ($v:ident, $x:expr, $y:expr) => {
            Ok(Tensor::$v(batched_matmul(
                $x.view(),
                $y.view(),
                mm_wrapping,
            )?))
        };
    }
    match (a, b) {
        (Tensor::I32(x), Tensor::I32(y)) => int!(I32, x, y),
        (Tensor::I64(x), Tensor::I64(y)) => int!(I64, x, y),
        (Tensor::U32(x), Tensor::U32(y)) => int!(U32, x, y),
        (Tensor::U64(x), Tensor::U64(y)) => int!(U64, x, y),
        (Tensor::I8(x), Tensor::I8(y)) => int!(I8, x, y),
        (Tensor::U8(x), Tensor::U8(y)) => int!(U8, x, y),
        (Tensor::I16(x), Tensor::I16(y)) => int!(I16, x, y),
        (Tensor::U16(x), Tensor::U16(y)) => int!(U16, x, y),
        _ => by_float!(a.dtype(), "matmul", T => {
            let (x, y) = (T::view(a)?, T::view(b)?);
            Ok(T::wrap(batched_matmul(x.view(), y.view(), mm_float::<T>)?, a.dtype()))
        }),
    }
}

pub fn gemm(
    inputs: &[Option<&Tensor>],
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<Tensor, OpError> {
    let (a, b) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let c = inputs.get(2).copied().flatten();
    by_float!(a.dtype(), "gemm", T => {
        let (x, y) = (T::view(a)?, T::view(b)?);
        let x = x.view().into_dimensionality::<Ix2>()
            .map_err(|_| OpError::Invalid(format!("gemm operand a has shape {:?}", a.shape())))?;
        let y = y.view().into_dimensionality::<Ix2>()
            .map_err(|_| OpError::Invalid(format!("gemm operand b has shape {:?}", b.shape())))?;
        let x = if trans_a { x.reversed_axes() } else { x };
        let y = if trans_b { y.reversed_axes() } else { y };
        if x.dim().1 != y.dim().0 {
            return invalid(format!("gemm of {:?} and {:?}: inner dims differ", x.dim(), y.dim()));
        }
        let (m, n) = (x.dim().0, y.dim().1);
        let mut o = ndarray::Array2::<T>::zeros((m, n));
        general_mat_mul(T::of(alpha as f64), &x, &y, T::zero(), &mut o);
        if let Some(c) = c {
            if beta != 0.0 {
                let cv = T::view(c)?;
                let cb = cv.broadcast(IxDyn(&[m, n])).ok_or_else(|| {
                    OpError::Invalid(format!("gemm c of shape {:?} does not broadcast to [{m}, {n}]", c.shape()))
                })?;
                let beta = T::of(beta as f64);
                ndarray::Zip::from(&mut o).and(&cb.into_dimensionality::<Ix2>().expect("rank 2"))
                    .for_each(|o, &c| *o += c * beta);
            }
        }
        Ok(T::wrap(o.into_dyn(), a.dtype()))
    })
}

/// An integer tensor as i32 (the accumulation type of MatMulInteger and ConvInteger).
pub(crate) fn as_i32(t: &Tensor) -> Result<ArrayD<i32>, OpError> {
    Ok(match t {
        Tensor::I8(a) => a.mapv(i32::from),
        Tensor::U8(a) => a.mapv(i32::from),
        Tensor::I16(a) => a.mapv(i32::from),
        Tensor::U16(a) => a.mapv(i32::from),
        Tensor::I32(a) => a.clone(),
        _ => return unsupported(format!("integer contraction of dtype {}", t.dtype())),
    })
}

pub fn matmul_integer(inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let mut a = as_i32(arg(inputs, 0)?)?;
    let mut b = as_i32(arg(inputs, 1)?)?;
    if let Some(zp) = inputs.get(2).copied().flatten() {
        let zp = as_i32(zp)?;
        if zp.len() == 1 {
            let z = zp.iter().next().copied().unwrap_or(0);
            a.mapv_inplace(|x| x - z);
        } else if a.ndim() >= 2 && zp.len() == a.shape()[a.ndim() - 2] {
            // Per row of a.
            let zv: Vec<i32> = zp.iter().copied().collect();
            let rows = a.ndim() - 2;
            for (i, mut row) in a.axis_iter_mut(Axis(rows)).enumerate() {
                row.mapv_inplace(|x| x - zv[i]);
            }
        } else {
            return invalid(format!("a_zero_point of shape {:?}", zp.shape()));
        }
    }
    if let Some(zp) = inputs.get(3).copied().flatten() {
        let zp = as_i32(zp)?;
        if zp.len() == 1 {
            let z = zp.iter().next().copied().unwrap_or(0);
            b.mapv_inplace(|x| x - z);
        } else if zp.len() == b.shape()[b.ndim() - 1] {
            let zv: Vec<i32> = zp.iter().copied().collect();
            let last = b.ndim() - 1;
            for (j, mut col) in b.axis_iter_mut(Axis(last)).enumerate() {
                col.mapv_inplace(|x| x - zv[j]);
            }
        } else {
            return invalid(format!("b_zero_point of shape {:?}", zp.shape()));
        }
    }
    Ok(Tensor::I32(batched_matmul(
        a.view(),
        b.view(),
        mm_wrapping,
    )?))
}

/// A parsed einsum term: labels per axis, `None` standing for the ellipsis.
struct Term {
    labels: Vec<Option<u8>>,
}

fn parse_term(s: &str) -> Result<Term, OpError> {
    let mut labels = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'.' {
            if b.len() < i + 3 || &b[i..i + 3] != b"..." || labels.contains(&None) {
                return invalid(format!("bad ellipsis in einsum term `{s}`"));
            }
            labels.push(None);
            i += 3;
        } else if b[i].is_ascii_alphabetic() {
            labels.push(Some(b[i]));
            i += 1;
        } else {
            return invalid(format!("bad character in einsum term `{s}`"));
        }
    }
    Ok(Term { labels })
}

/// General einsum by iterating over every combination of label values.
pub fn einsum(inputs: &[Option<&Tensor>], equation: &str) -> Result<Tensor, OpError> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms = lhs
        .split(',')
        .map(parse_term)
        .collect::<Result<Vec<_>, _>>()?;
    let ts: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    if ts.len() != terms.len() {
        return invalid(format!(
            "einsum `{equation}` has {} terms but {} operands",
            terms.len(),
            ts.len()
        ));
    }
    let dt = ts[0].dtype();
    macro_rules! go {
        ($v:ident, $T:ty, $conv:expr, $back:expr) => {{
            let arrs: Vec<ArrayD<$T>> = ts
                .iter()
                .map(|t| match t {
                    Tensor::$v(a) => Ok(a.mapv($conv)),
                    _ => invalid(format!(
                        "einsum operands of mixed dtypes {} and {}",
                        dt,
                        t.dtype()
                    )),
                })
                .collect::<Result<_, _>>()?;
            let r = einsum_core(&terms, rhs, &arrs)?;
            Ok(Tensor::$v(r.mapv($back)))
        }};
    }
    match dt {
        rafter_ir::DType::F32 => go!(F32, f32, |x| x, |x| x),
        rafter_ir::DType::F64 => go!(F64, f64, |x| x, |x| x),
        rafter_ir::DType::F16 => go!(F16, f32, |x: half::f16| x.to_f32(), half::f16::from_f32),
        rafter_ir::DType::BF16 => {
            go!(BF16, f32, |x: half::bf16| x.to_f32(), half::bf16::from_f32)
        }
        rafter_ir::DType::I32 => go!(I32, i32, |x| x, |x| x),
        rafter_ir::DType::I64 => go!(I64, i64, |x| x, |x| x),
        rafter_ir::DType::U32 => go!(U32, u32, |x| x, |x| x),
        rafter_ir::DType::U64 => go!(U64, u64, |x| x, |x| x),
        other => unsupported(format!("einsum of dtype {other}")),
    }
}

/// Ring operations for einsum accumulation (wrapping for integers).
pub(crate) trait Ring: Copy + Zero {
    fn radd(self, o: Self) -> Self;
    fn rmul(self, o: Self) -> Self;
}
macro_rules! ring_float {
    ($($t:ty),*) => {$(impl Ring for $t {
        fn radd(self, o: Self) -> Self { self + o }
        fn rmul(self, o: Self) -> Self { self * o }
    })*};
}
macro_rules! ring_int {
    ($($t:ty),*) => {$(impl Ring for $t {
        fn radd(self, o: Self) -> Self { self.wrapping_add(o) }
        fn rmul(self, o: Self) -> Self { self.wrapping_mul(o) }
    })*};
}
ring_float!(f32, f64);
ring_int!(i32, i64, u32, u64);

fn einsum_core<T: Ring + num_traits::One>(
    terms: &[Term],
    rhs: Option<&str>,
    arrs: &[ArrayD<T>],
) -> Result<ArrayD<T>, OpError> {
    // Labels: letters are 0..128 (ASCII), ellipsis dims are 128 + position in the
    // (right-aligned) broadcast ellipsis.
    let mut ell_rank = 0;
    for (t, a) in terms.iter().zip(arrs) {
        let letters = t.labels.iter().filter(|l| l.is_some()).count();
        if t.labels.contains(&None) {
            if a.ndim() < letters {
                return invalid(format!(
                    "einsum operand of rank {} is too small for its term",
                    a.ndim()
                ));
            }
            ell_rank = ell_rank.max(a.ndim() - letters);
        } else if a.ndim() != letters {
            return invalid(format!(
                "einsum operand of rank {} for a term of {letters} labels",
                a.ndim()
            ));
        }
    }
    // Per operand: label per axis.
    let mut axis_labels: Vec<Vec<usize>> = Vec::new();
    let mut size: std::collections::BTreeMap<usize, usize> = Default::default();
    for (t, a) in terms.iter().zip(arrs) {
        let letters = t.labels.iter().filter(|l| l.is_some()).count();
        let mine = a.ndim() - letters;
        let mut labs = Vec::new();
        for l in &t.labels {
            match l {
                Some(c) => labs.push(*c as usize),
                None => labs.extend((ell_rank - mine..ell_rank).map(|e| 128 + e)),
            }
        }
        for (ax, &l) in labs.iter().enumerate() {
            let d = a.shape()[ax];
            let e = size.entry(l).or_insert(d);
            if *e != d {
                if *e == 1 && l >= 128 {
                    *e = d;
                } else if !(d == 1 && l >= 128) {
                    return invalid(format!(
                        "einsum label `{}` has sizes {} and {d}",
                        if l < 128 {
                            (l as u8 as char).to_string()
                        } else {
                            "...".into()
                        },
                        *e
                    ));
                }
            }
        }
        axis_labels.push(labs);
    }
    for e in 0..ell_rank {
        size.entry(128 + e).or_insert(1);
    }
    let out_labels: Vec<usize> = match rhs {
        Some(r) => {
            let t = parse_term(r)?;
            let mut v = Vec::new();
            for l in t.labels {
                match l {
                    Some(c) => {
                        if !size.contains_key(&(c as usize)) {
                            return invalid(format!(
                                "einsum output label `{}` is not in any input",
                                c as char
                            ));
                        }
                        v.push(c as usize)
                    }
                    None => v.extend((0..ell_rank).map(|e| 128 + e)),
                }
            }
            v
        }
        None => {
            let mut count = std::collections::BTreeMap::<usize, usize>::new();
            for labs in &axis_labels {
                for &l in labs {
                    if l < 128 {
                        *count.entry(l).or_default() += 1;
                    }
                }
            }
            let mut v: Vec<usize> = (0..ell_rank).map(|e| 128 + e).collect();
            v.extend(count.into_iter().filter(|&(_, n)| n == 1).map(|(l, _)| l));
            v
        }
    };
    let summed: Vec<usize> = size
        .keys()
        .copied()
        .filter(|l| !out_labels.contains(l))
        .collect();
    let all: Vec<usize> = out_labels.iter().chain(&summed).copied().collect();
    let dims: Vec<usize> = all.iter().map(|l| size[l]).collect();
    // Per operand, the stride each label contributes (axes sharing a label add up: the
    // diagonal); broadcast dims of size 1 contribute 0.
    let op_strides: Vec<Vec<isize>> = arrs
        .iter()
        .zip(&axis_labels)
        .map(|(a, labs)| {
            all.iter()
                .map(|&l| {
                    labs.iter()
                        .enumerate()
                        .filter(|&(ax, &al)| al == l && a.shape()[ax] != 1)
                        .map(|(ax, _)| a.strides()[ax])
                        .sum()
                })
                .collect()
        })
        .collect();
    let out_shape: Vec<usize> = out_labels.iter().map(|l| size[l]).collect();
    let out_strides = super::strides_of(&out_shape);
    let mut out = vec![T::zero(); out_shape.iter().product()];
    let ptrs: Vec<&[T]> = arrs
        .iter()
        .map(|a| {
            a.as_slice_memory_order()
                .expect("owned arrays are contiguous")
        })
        .collect();
    for_each_index(&dims, |idx| {
        let mut prod = T::one();
        for (k, s) in op_strides.iter().enumerate() {
            let off: isize = idx.iter().zip(s).map(|(&i, &st)| i as isize * st).sum();
            prod = prod.rmul(ptrs[k][off as usize]);
        }
        let o: usize = idx.iter().zip(&out_strides).map(|(&i, &s)| i * s).sum();
        out[o] = out[o].radd(prod);
    });
    Ok(ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sizes agree"))
}
