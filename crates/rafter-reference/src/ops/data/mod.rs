//! Reference kernels: shapes and data movement.
//!
//! Every kernel is generic over [`Elem`], implemented for all 13 dtypes, so data movement
//! works for every tensor the executor can hold. Index arithmetic runs on row-major
//! (standard-layout) copies, which keeps the code short and obviously correct.

mod create;
mod index;
pub(crate) mod layout;
mod sort;

use super::{invalid, OpCtx, OpError};
use crate::Tensor;
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use rafter_ir::{Op, Scalar};
use std::cmp::Ordering;

/// An element type of [`Tensor`]: everything data ops need to be written once.
pub(crate) trait Elem: Copy + PartialEq + PartialOrd + std::fmt::Debug + 'static {
    /// Wraps an array into the tensor variant of this type.
    fn wrap(a: ArrayD<Self>) -> Tensor;
    /// The array inside `t` when `t` holds this type.
    fn unwrap(t: &Tensor) -> Option<&ArrayD<Self>>;
    fn zero() -> Self;
    fn one() -> Self;
    /// Rounds half to even for integers and saturates (NumPy `round` + `clip` + `astype`).
    fn from_f64(v: f64) -> Self;
    /// `as`-cast semantics.
    fn from_i64(v: i64) -> Self;
    fn from_u64(v: u64) -> Self;
    /// Addition (wrapping for integers, `or` for bool, as NumPy does).
    fn plus(self, o: Self) -> Self;
    /// Multiplication (wrapping for integers, `and` for bool).
    fn times(self, o: Self) -> Self;
    fn is_nan(self) -> bool;

    /// A total order: NaN sorts after everything and equals itself (NumPy's sort order).
    fn cmp_total(&self, o: &Self) -> Ordering {
        self.partial_cmp(o)
            .unwrap_or_else(|| match (self.is_nan(), o.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                _ => Ordering::Less,
            })
    }

    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Float(_, v) => Self::from_f64(v),
            Scalar::Int(_, v) => Self::from_i64(v),
            Scalar::UInt(_, v) => Self::from_u64(v),
            Scalar::Bool(b) => Self::from_i64(b as i64),
        }
    }
}

macro_rules! elem_common {
    ($variant:ident) => {
        fn wrap(a: ArrayD<Self>) -> Tensor {
            Tensor::$variant(a)
        }
        fn unwrap(t: &Tensor) -> Option<&ArrayD<Self>> {
            match t {
                Tensor::$variant(a) => Some(a),
                _ => None,
            }
        }
    };
}

macro_rules! elem_int {
    ($($t:ty => $variant:ident),*) => {$(
        impl Elem for $t {
            elem_common!($variant);
            fn zero() -> Self { 0 }
            fn one() -> Self { 1 }
            fn from_f64(v: f64) -> Self { v.round_ties_even() as $t }
            fn from_i64(v: i64) -> Self { v as $t }
            fn from_u64(v: u64) -> Self { v as $t }
            fn plus(self, o: Self) -> Self { self.wrapping_add(o) }
            fn times(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn is_nan(self) -> bool { false }
        }
    )*};
}

elem_int!(i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

macro_rules! elem_float {
    ($($t:ty => $variant:ident),*) => {$(
        impl Elem for $t {
            elem_common!($variant);
            fn zero() -> Self { 0.0 }
            fn one() -> Self { 1.0 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn from_i64(v: i64) -> Self { v as $t }
            fn from_u64(v: u64) -> Self { v as $t }
            fn plus(self, o: Self) -> Self { self + o }
            fn times(self, o: Self) -> Self { self * o }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}

elem_float!(f32 => F32, f64 => F64);

macro_rules! elem_half {
    ($($t:ty => $variant:ident),*) => {$(
        impl Elem for $t {
            elem_common!($variant);
            fn zero() -> Self { <$t>::ZERO }
            fn one() -> Self { <$t>::ONE }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            fn from_u64(v: u64) -> Self { <$t>::from_f64(v as f64) }
            fn plus(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            fn times(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}

elem_half!(f16 => F16, bf16 => BF16);

impl Elem for bool {
    elem_common!(Bool);
    fn zero() -> Self {
        false
    }
    fn one() -> Self {
        true
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn from_u64(v: u64) -> Self {
        v != 0
    }
    fn plus(self, o: Self) -> Self {
        self | o
    }
    fn times(self, o: Self) -> Self {
        self & o
    }
    fn is_nan(self) -> bool {
        false
    }
}

/// Runs `$body` with `$T` bound to the Rust element type of the dtype `$d`.
macro_rules! with_dtype {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            rafter_ir::DType::F32 => {
                type $T = f32;
                $body
            }
            rafter_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            rafter_ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            rafter_ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            rafter_ir::DType::I8 => {
                type $T = i8;
                $body
            }
            rafter_ir::DType::U8 => {
                type $T = u8;
                $body
            }
            rafter_ir::DType::I16 => {
                type $T = i16;
                $body
            }
            rafter_ir::DType::U16 => {
                type $T = u16;
                $body
            }
            rafter_ir::DType::I32 => {
                type $T = i32;
                $body
            }
            rafter_ir::DType::U32 => {
                type $T = u32;
                $body
            }
            rafter_ir::DType::I64 => {
                type $T = i64;
                $body
            }
            rafter_ir::DType::U64 => {
                type $T = u64;
                $body
            }
            rafter_ir::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// The array of `t`, which must have the same dtype as the operand it goes with.
pub(crate) fn same<'a, T: Elem>(t: &'a Tensor, what: &str) -> Result<&'a ArrayD<T>, OpError> {
    T::unwrap(t).ok_or_else(|| {
        OpError::Invalid(format!(
            "{what} has dtype {}, which differs from the data's",
            t.dtype()
        ))
    })
}

/// A row-major owned copy of a view (whatever the view's strides).
pub(crate) fn owned<T: Clone>(v: ArrayViewD<T>) -> ArrayD<T> {
    let shape = v.shape().to_vec();
    ArrayD::from_shape_vec(IxDyn(&shape), v.iter().cloned().collect()).expect("same length")
}

/// The elements of `a` in row-major order, reshaped.
pub(crate) fn reshaped<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(shape), a.iter().cloned().collect())
        .expect("caller checked the element count")
}

/// The elements of an integer operand (shapes, indices, axes).
pub(crate) fn ints(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    t.to_i64_vec().ok_or_else(|| {
        OpError::Invalid(format!(
            "{what} must be an integer tensor, got {}",
            t.dtype()
        ))
    })
}

/// A single integer from a scalar or one-element operand.
pub(crate) fn int_scalar(t: &Tensor, what: &str) -> Result<i64, OpError> {
    let v = match t.to_i64_vec() {
        Some(v) => v,
        None => t.to_f64_vec().into_iter().map(|x| x as i64).collect(),
    };
    match v[..] {
        [x] => Ok(x),
        _ => invalid(format!(
            "{what} must hold one element, got shape {:?}",
            t.shape()
        )),
    }
}

/// Resolves a possibly negative axis against `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        invalid(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Resolves a possibly negative index against a dim of size `dim`.
pub(crate) fn norm_index(i: i64, dim: usize) -> Result<usize, OpError> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if (0..d).contains(&j) {
        Ok(j as usize)
    } else {
        invalid(format!("index {i} is out of range for a dim of size {dim}"))
    }
}

/// Row-major strides of a shape.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn one(t: Tensor) -> Result<Vec<Option<Tensor>>, OpError> {
    Ok(vec![Some(t)])
}

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    use super::arg;
    let x = || arg(inputs, 0);
    let opt = |i: usize| inputs.get(i).copied().flatten();
    match op {
        Op::Reshape { allow_zero } => one(layout::reshape(
            x()?,
            &ints(arg(inputs, 1)?, "shape")?,
            *allow_zero,
        )?),
        Op::Shape { start, end } => one(layout::shape(x()?, *start, *end)),
        Op::Size => one(Tensor::I64(ndarray::arr0(x()?.len() as i64).into_dyn())),
        Op::Transpose { perm } => one(layout::transpose(x()?, perm)?),
        // Run-time axes come as operand 1 (the attribute is then empty).
        Op::Squeeze { axes } => match opt(1) {
            Some(a) => one(layout::squeeze(x()?, &ints(a, "axes")?)?),
            None => one(layout::squeeze(x()?, axes)?),
        },
        Op::Unsqueeze { axes } => match opt(1) {
            Some(a) => one(layout::unsqueeze(x()?, &ints(a, "axes")?)?),
            None => one(layout::unsqueeze(x()?, axes)?),
        },
        Op::Flatten { axis } => one(layout::flatten(x()?, *axis)?),
        Op::Concat { axis } => {
            let all: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
            one(layout::concat(&all, *axis)?)
        }
        Op::Split { axis } => {
            let sizes = opt(1).map(|t| ints(t, "split")).transpose()?;
            let parts = layout::split(x()?, *axis, sizes.as_deref(), ctx.num_outputs())?;
            Ok(parts.into_iter().map(Some).collect())
        }
        Op::Slice => {
            let starts = ints(arg(inputs, 1)?, "starts")?;
            let ends = ints(arg(inputs, 2)?, "ends")?;
            let axes = opt(3).map(|t| ints(t, "axes")).transpose()?;
            let steps = opt(4).map(|t| ints(t, "steps")).transpose()?;
            one(layout::slice(
                x()?,
                &starts,
                &ends,
                axes.as_deref(),
                steps.as_deref(),
            )?)
        }
        Op::Gather { axis } => one(index::gather(x()?, arg(inputs, 1)?, *axis)?),
        Op::GatherElements { axis } => one(index::gather_elements(x()?, arg(inputs, 1)?, *axis)?),
        Op::GatherNd { batch_dims } => one(index::gather_nd(x()?, arg(inputs, 1)?, *batch_dims)?),
        Op::ScatterElements { axis, reduction } => one(index::scatter_elements(
            x()?,
            arg(inputs, 1)?,
            arg(inputs, 2)?,
            *axis,
            *reduction,
        )?),
        Op::ScatterNd { reduction } => one(index::scatter_nd(
            x()?,
            arg(inputs, 1)?,
            arg(inputs, 2)?,
            *reduction,
        )?),
        Op::Expand => one(layout::expand(x()?, &ints(arg(inputs, 1)?, "shape")?)?),
        Op::Tile => one(layout::tile(x()?, &ints(arg(inputs, 1)?, "repeats")?)?),
        Op::Pad { mode } => {
            let pads = ints(arg(inputs, 1)?, "pads")?;
            let axes = opt(3).map(|t| ints(t, "axes")).transpose()?;
            one(layout::pad(x()?, &pads, opt(2), axes.as_deref(), *mode)?)
        }
        Op::ConstantOfShape { value } => {
            one(create::constant_of_shape(&ints(x()?, "shape")?, *value)?)
        }
        Op::Range => one(create::range(x()?, arg(inputs, 1)?, arg(inputs, 2)?)?),
        Op::OneHot { axis } => one(index::one_hot(
            x()?,
            arg(inputs, 1)?,
            arg(inputs, 2)?,
            *axis,
        )?),
        Op::Trilu { upper } => {
            let k = opt(1).map(|t| int_scalar(t, "k")).transpose()?.unwrap_or(0);
            one(index::trilu(x()?, k, *upper)?)
        }
        Op::TopK {
            axis,
            largest,
            sorted: _,
        } => {
            // Unsorted order is unspecified by ONNX; sorted output is conformant.
            let k = int_scalar(arg(inputs, 1)?, "k")?;
            let (v, i) = sort::top_k(x()?, k, *axis, *largest)?;
            Ok(vec![Some(v), Some(i)])
        }
        Op::NonZero => one(index::non_zero(x()?)),
        Op::Compress { axis } => one(index::compress(x()?, arg(inputs, 1)?, *axis)?),
        Op::Unique { axis, sorted } => {
            let (y, idx, inv, counts) = sort::unique(x()?, *axis, *sorted)?;
            Ok(vec![Some(y), Some(idx), Some(inv), Some(counts)])
        }
        Op::ReverseSequence {
            batch_axis,
            time_axis,
        } => one(index::reverse_sequence(
            x()?,
            arg(inputs, 1)?,
            *batch_axis,
            *time_axis,
        )?),
        Op::DepthToSpace { blocksize, mode } => {
            one(layout::depth_to_space(x()?, *blocksize, *mode)?)
        }
        Op::SpaceToDepth { blocksize } => one(layout::space_to_depth(x()?, *blocksize)?),
        Op::EyeLike { dtype, k } => one(create::eye_like(x()?, *dtype, *k)?),
        other => super::unsupported(format!("`{}` is not a data op", other.name())),
    }
}

#[cfg(test)]
mod tests;
