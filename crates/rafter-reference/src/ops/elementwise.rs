//! Reference kernels: elementwise ops.
//!
//! Numerics follow ONNX's reference implementation (NumPy). Float math runs in the
//! tensor's own precision for f32 and f64; f16 and bf16 are widened to f32, computed and
//! rounded back (round to nearest even). Integer arithmetic wraps; integer division by zero
//! gives 0 (NumPy's result) instead of trapping.
//!
//! The scalar traits here ([`Elem`], [`Num`], [`Real`], [`Int`]) and [`cast`] are shared
//! with the reduction and normalisation kernels.

use super::broadcast::{broadcast_shapes, zip3_with, zip_with};
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{BinaryOp, DType, GeluApprox, Op, UnaryOp};

// ---------------------------------------------------------------------------------------
// Scalar traits
// ---------------------------------------------------------------------------------------

/// One element in a dtype-independent form: integers exactly (every integer dtype fits in
/// i128), floats as f64 (exact for every float dtype).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i128),
    Float(f64),
}

impl Scalar {
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

/// An element type of [`Tensor`].
pub trait Elem: Copy + PartialOrd + Default + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_scalar(self) -> Scalar;
    /// Converts with ONNX Cast semantics: integers wrap, floats to integers truncate toward
    /// zero and saturate (NaN becomes 0), floats round to nearest even, anything to bool is
    /// `!= 0` (NaN is true).
    fn from_scalar(s: Scalar) -> Self;
    /// Wraps an array of this type as a tensor.
    fn wrap(a: ArrayD<Self>) -> Tensor;

    fn to_float(self) -> f64 {
        self.to_scalar().to_f64()
    }
    fn from_float(x: f64) -> Self {
        Self::from_scalar(Scalar::Float(x))
    }
}

macro_rules! int_elem {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl Elem for $t {
            const DTYPE: DType = DType::$v;
            fn to_scalar(self) -> Scalar {
                Scalar::Int(self as i128)
            }
            fn from_scalar(s: Scalar) -> Self {
                match s {
                    Scalar::Int(i) => i as $t,
                    // `as` truncates toward zero, saturates, and maps NaN to 0.
                    Scalar::Float(f) => f as $t,
                }
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$v(a)
            }
        }
    )*};
}
int_elem!(i8 => I8, u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn to_scalar(self) -> Scalar {
        Scalar::Float(self as f64)
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(i) => i as f32,
            Scalar::Float(f) => f as f32,
        }
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::F32(a)
    }
}

impl Elem for f64 {
    const DTYPE: DType = DType::F64;
    fn to_scalar(self) -> Scalar {
        Scalar::Float(self)
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::F64(a)
    }
}

// `half`'s f64 conversions drop the low 32 mantissa bits before rounding, so they can
// round ties wrongly. Going through f32 is exact: rounding twice is innocuous when the
// intermediate precision (24 bits) is at least twice the target's plus two.
impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    fn to_scalar(self) -> Scalar {
        Scalar::Float(self.to_f64())
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(i) => f16::from_f32(i as f32),
            Scalar::Float(f) => f16::from_f32(f as f32),
        }
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::F16(a)
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_scalar(self) -> Scalar {
        Scalar::Float(self.to_f64())
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(i) => bf16::from_f32(i as f32),
            Scalar::Float(f) => bf16::from_f32(f as f32),
        }
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::BF16(a)
    }
}

impl Elem for bool {
    const DTYPE: DType = DType::Bool;
    fn to_scalar(self) -> Scalar {
        Scalar::Int(self as i128)
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::Int(i) => i != 0,
            Scalar::Float(f) => f != 0.0,
        }
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::Bool(a)
    }
}

/// Arithmetic shared by integers (wrapping) and f32/f64.
pub trait Num: Elem {
    fn add_(self, b: Self) -> Self;
    fn sub_(self, b: Self) -> Self;
    fn mul_(self, b: Self) -> Self;
    /// Integers truncate toward zero (0 when dividing by zero).
    fn div_(self, b: Self) -> Self;
    /// Remainder with the sign of the divisor (NumPy `mod`, Python `%`).
    fn mod_(self, b: Self) -> Self;
    /// Remainder with the sign of the dividend (C `fmod`).
    fn fmod_(self, b: Self) -> Self;
    fn is_neg(self) -> bool {
        self < Self::default()
    }
}

/// f32 and f64.
pub trait Real: Num + num_traits::Float + num_traits::FloatConst {
    /// A constant of this type (rounded).
    fn c(x: f64) -> Self;
    fn erf(self) -> Self;
    fn round_even(self) -> Self;
}

/// The eight integer types.
pub trait Int: Num + Ord {
    const BITS: u32;
    fn not_(self) -> Self;
    fn and_(self, b: Self) -> Self;
    fn or_(self, b: Self) -> Self;
    fn xor_(self, b: Self) -> Self;
    /// Shifts of `b < 0` or `b >= BITS` give 0 (left) or the sign fill (right).
    fn shl_(self, b: Self) -> Self;
    fn shr_(self, b: Self) -> Self;
    fn abs_(self) -> Self;
    fn neg_(self) -> Self;
    fn sign_(self) -> Self;
}

macro_rules! real_impl {
    ($($t:ty, $erf:path);*) => {$(
        impl Num for $t {
            fn add_(self, b: Self) -> Self { self + b }
            fn sub_(self, b: Self) -> Self { self - b }
            fn mul_(self, b: Self) -> Self { self * b }
            fn div_(self, b: Self) -> Self { self / b }
            fn mod_(self, b: Self) -> Self {
                // NumPy's npy_divmod: fmod, then move into the divisor's sign.
                let m = self % b;
                if b == 0.0 {
                    m
                } else if m != 0.0 {
                    if (b < 0.0) != (m < 0.0) { m + b } else { m }
                } else {
                    (0.0 as $t).copysign(b)
                }
            }
            fn fmod_(self, b: Self) -> Self { self % b }
        }
        impl Real for $t {
            fn c(x: f64) -> Self { x as $t }
            fn erf(self) -> Self { $erf(self) }
            fn round_even(self) -> Self { self.round_ties_even() }
        }
    )*};
}
real_impl!(f32, libm::erff; f64, libm::erf);

macro_rules! int_impl {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn add_(self, b: Self) -> Self { self.wrapping_add(b) }
            fn sub_(self, b: Self) -> Self { self.wrapping_sub(b) }
            fn mul_(self, b: Self) -> Self { self.wrapping_mul(b) }
            fn div_(self, b: Self) -> Self {
                if b == 0 { 0 } else { self.wrapping_div(b) }
            }
            fn mod_(self, b: Self) -> Self {
                if b == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(b);
                if r != 0 && (r.is_neg() != b.is_neg()) { r.wrapping_add(b) } else { r }
            }
            fn fmod_(self, b: Self) -> Self {
                if b == 0 { 0 } else { self.wrapping_rem(b) }
            }
        }
        impl Int for $t {
            const BITS: u32 = <$t>::BITS;
            fn not_(self) -> Self { !self }
            fn and_(self, b: Self) -> Self { self & b }
            fn or_(self, b: Self) -> Self { self | b }
            fn xor_(self, b: Self) -> Self { self ^ b }
            fn shl_(self, b: Self) -> Self {
                let by = b as i128;
                if by < 0 || by >= Self::BITS as i128 { 0 } else { self.wrapping_shl(by as u32) }
            }
            fn shr_(self, b: Self) -> Self {
                let by = b as i128;
                if by < 0 || by >= Self::BITS as i128 {
                    if self.is_neg() { !0 } else { 0 }
                } else {
                    self >> by
                }
            }
            fn abs_(self) -> Self {
                if self.is_neg() { self.wrapping_neg() } else { self }
            }
            fn neg_(self) -> Self { self.wrapping_neg() }
            fn sign_(self) -> Self {
                if self.is_neg() { (0 as $t).wrapping_sub(1) } else if self == 0 { 0 } else { 1 }
            }
        }
    )*};
}
int_impl!(i8, u8, i16, u16, i32, u32, i64, u64);

// ---------------------------------------------------------------------------------------
// Dispatch macros
// ---------------------------------------------------------------------------------------

/// Matches a tensor of f32 or f64, binding its array; `None` for other dtypes.
macro_rules! real_map {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F32($a) => Some(Tensor::F32($body)),
            Tensor::F64($a) => Some(Tensor::F64($body)),
            _ => None,
        }
    };
}

/// Matches a tensor of an integer dtype, binding its array; `None` for other dtypes.
macro_rules! int_map {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::I8($a) => Some(Tensor::I8($body)),
            Tensor::U8($a) => Some(Tensor::U8($body)),
            Tensor::I16($a) => Some(Tensor::I16($body)),
            Tensor::U16($a) => Some(Tensor::U16($body)),
            Tensor::I32($a) => Some(Tensor::I32($body)),
            Tensor::U32($a) => Some(Tensor::U32($body)),
            Tensor::I64($a) => Some(Tensor::I64($body)),
            Tensor::U64($a) => Some(Tensor::U64($body)),
            _ => None,
        }
    };
}

/// Matches two tensors of the same dtype among `$($v)*`, binding both arrays; the body
/// yields the result tensor. `None` when the dtypes differ or are not listed.
macro_rules! pair_map {
    ($a:expr, $b:expr, $x:ident, $y:ident => $body:expr; $($v:ident)*) => {
        match ($a, $b) {
            $( (Tensor::$v($x), Tensor::$v($y)) => Some($body), )*
            _ => None,
        }
    };
}

// ---------------------------------------------------------------------------------------
// Public helpers
// ---------------------------------------------------------------------------------------

/// Converts a tensor to `to` with ONNX Cast semantics (see [`Elem::from_scalar`]).
pub fn cast(x: &Tensor, to: DType) -> Tensor {
    fn conv<S: Elem, T: Elem>(a: &ArrayD<S>) -> Tensor {
        T::wrap(a.mapv(|v| T::from_scalar(v.to_scalar())))
    }
    fn to_dtype<S: Elem>(a: &ArrayD<S>, to: DType) -> Tensor {
        match to {
            DType::F32 => conv::<S, f32>(a),
            DType::F64 => conv::<S, f64>(a),
            DType::F16 => conv::<S, f16>(a),
            DType::BF16 => conv::<S, bf16>(a),
            DType::I8 => conv::<S, i8>(a),
            DType::U8 => conv::<S, u8>(a),
            DType::I16 => conv::<S, i16>(a),
            DType::U16 => conv::<S, u16>(a),
            DType::I32 => conv::<S, i32>(a),
            DType::U32 => conv::<S, u32>(a),
            DType::I64 => conv::<S, i64>(a),
            DType::U64 => conv::<S, u64>(a),
            DType::Bool => conv::<S, bool>(a),
        }
    }
    if x.dtype() == to {
        return x.clone();
    }
    crate::with_array!(x, a => to_dtype(a, to))
}

/// A tensor of dtype `dtype` from f64 values in row-major order (converted as by [`cast`]).
pub fn from_f64s(dtype: DType, shape: &[usize], v: Vec<f64>) -> Tensor {
    let a = ArrayD::from_shape_vec(IxDyn(shape), v).expect("element count matches shape");
    cast(&Tensor::F64(a), dtype)
}

/// The first element of a tensor as a [`Scalar`], or `None` when it is empty.
pub fn first_scalar(t: &Tensor) -> Option<Scalar> {
    crate::with_array!(t, a => a.iter().next().map(|v| v.to_scalar()))
}

/// Widens f16/bf16 to f32 (others are returned as they are).
fn widen(t: &Tensor) -> std::borrow::Cow<'_, Tensor> {
    if t.dtype().is_half() {
        std::borrow::Cow::Owned(cast(t, DType::F32))
    } else {
        std::borrow::Cow::Borrowed(t)
    }
}

fn dtype_err<T>(op: &str, ts: &[&Tensor]) -> Result<T, OpError> {
    let ds: Vec<String> = ts.iter().map(|t| t.dtype().to_string()).collect();
    unsupported(format!("`{op}` on {}", ds.join(", ")))
}

// ---------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let x = arg(inputs, 0)?;
    let y = match op {
        Op::Identity => x.clone(),
        Op::Where => where_(x, arg(inputs, 1)?, arg(inputs, 2)?)?,
        Op::Clip => clip(
            x,
            inputs.get(1).copied().flatten(),
            inputs.get(2).copied().flatten(),
        )?,
        Op::Cast { to } => cast(x, *to),
        Op::IsInf {
            detect_negative,
            detect_positive,
        } => {
            let (neg, pos) = (*detect_negative, *detect_positive);
            Tensor::Bool(crate::with_array!(x, a => a.mapv(|v| match v.to_scalar() {
                Scalar::Float(f) => (f == f64::INFINITY && pos) || (f == f64::NEG_INFINITY && neg),
                Scalar::Int(_) => false,
            })))
        }
        Op::Unary { op: UnaryOp::IsNaN } => Tensor::Bool(crate::with_array!(x, a => a.mapv(|v| {
            matches!(v.to_scalar(), Scalar::Float(f) if f.is_nan())
        }))),
        Op::Unary { op: u } => {
            let d = x.dtype();
            let y = unary(*u, &widen(x))?;
            if d.is_half() {
                cast(&y, d)
            } else {
                y
            }
        }
        Op::Binary { op: b } => {
            let b_in = arg(inputs, 1)?;
            let d = x.dtype();
            let y = binary(*b, &widen(x), &widen(b_in))?;
            if d.is_half() && y.dtype() == DType::F32 {
                cast(&y, d)
            } else {
                y
            }
        }
        Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Selu { .. }
        | Op::Celu { .. }
        | Op::HardSigmoid { .. }
        | Op::ThresholdedRelu { .. }
        | Op::Shrink { .. }
        | Op::Gelu { .. } => {
            let d = x.dtype();
            let w = widen(x);
            let y = match real_map!(&*w, a => a.mapv(|v| activation(op, v))) {
                Some(y) => y,
                // Integers (Shrink allows them): compute in f64, convert back.
                None if d.is_int() => crate::map_array!(x, a => a.mapv(|v| {
                    Elem::from_float(activation(op, v.to_float()))
                })),
                None => return dtype_err(op.name(), &[x]),
            };
            if d.is_half() {
                cast(&y, d)
            } else {
                y
            }
        }
        _ => return unsupported(format!("`{}` is not an elementwise op", op.name())),
    };
    Ok(vec![Some(y)])
}

fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor, OpError> {
    use UnaryOp::*;
    let r = match op {
        Not => match x {
            Tensor::Bool(a) => Some(Tensor::Bool(a.mapv(|v| !v))),
            _ => None,
        },
        BitwiseNot => int_map!(x, a => a.mapv(Int::not_)),
        Abs => {
            real_map!(x, a => a.mapv(|v| v.abs())).or_else(|| int_map!(x, a => a.mapv(Int::abs_)))
        }
        Neg => real_map!(x, a => a.mapv(|v| -v)).or_else(|| int_map!(x, a => a.mapv(Int::neg_))),
        Sign => real_map!(x, a => a.mapv(|v| unary_real(Sign, v)))
            .or_else(|| int_map!(x, a => a.mapv(Int::sign_))),
        Relu => real_map!(x, a => a.mapv(|v| unary_real(Relu, v))).or_else(
            || int_map!(x, a => a.mapv(|v| if v.is_neg() { Default::default() } else { v })),
        ),
        _ => real_map!(x, a => a.mapv(|v| unary_real(op, v))),
    };
    r.map_or_else(|| dtype_err(op.word(), &[x]), Ok)
}

fn unary_real<T: Real>(op: UnaryOp, x: T) -> T {
    use UnaryOp::*;
    let zero = T::zero();
    let one = T::one();
    match op {
        Abs => x.abs(),
        Neg => -x,
        Sqrt => x.sqrt(),
        Exp => x.exp(),
        Log => x.ln(),
        Reciprocal => one / x,
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_even(),
        Sign => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                x // 0 or NaN
            }
        }
        Sin => x.sin(),
        Cos => x.cos(),
        Tan => x.tan(),
        Asin => x.asin(),
        Acos => x.acos(),
        Atan => x.atan(),
        Sinh => x.sinh(),
        Cosh => x.cosh(),
        Tanh => x.tanh(),
        Asinh => x.asinh(),
        Acosh => x.acosh(),
        Atanh => x.atanh(),
        Erf => Real::erf(x),
        Sigmoid => {
            if x >= zero {
                one / (one + (-x).exp())
            } else {
                let e = x.exp();
                e / (one + e)
            }
        }
        Relu => {
            if x < zero {
                zero
            } else {
                x
            }
        }
        Softplus => softplus(x),
        Softsign => x / (one + x.abs()),
        Mish => x * softplus(x).tanh(),
        HardSwish => x * (x / T::c(6.0) + T::c(0.5)).min(one).max(zero),
        // Handled before dispatch (not float functions).
        Not | BitwiseNot | IsNaN => T::nan(),
    }
}

/// `log(1 + exp(x))` without overflow (NumPy `logaddexp(0, x)`).
fn softplus<T: Real>(x: T) -> T {
    if x.is_nan() {
        return x;
    }
    x.max(T::zero()) + (-x.abs()).exp().ln_1p()
}

fn activation<T: Real>(op: &Op, x: T) -> T {
    let c = |v: f32| T::c(v as f64);
    let zero = T::zero();
    let one = T::one();
    let half = T::c(0.5);
    match op {
        Op::LeakyRelu { alpha } => {
            if x < zero {
                c(*alpha) * x
            } else {
                x
            }
        }
        Op::Elu { alpha } => {
            if x > zero {
                x
            } else {
                c(*alpha) * x.exp_m1()
            }
        }
        Op::Selu { alpha, gamma } => c(*gamma) * if x > zero { x } else { c(*alpha) * x.exp_m1() },
        Op::Celu { alpha } => {
            let a = c(*alpha);
            if x.is_nan() {
                x
            } else {
                x.max(zero) + (a * (x / a).exp_m1()).min(zero)
            }
        }
        Op::HardSigmoid { alpha, beta } => {
            let v = c(*alpha) * x + c(*beta);
            if v.is_nan() {
                v
            } else {
                v.min(one).max(zero)
            }
        }
        Op::ThresholdedRelu { alpha } => {
            if x > c(*alpha) {
                x
            } else {
                zero
            }
        }
        Op::Shrink { bias, lambd } => {
            if x < -c(*lambd) {
                x + c(*bias)
            } else if x > c(*lambd) {
                x - c(*bias)
            } else {
                zero
            }
        }
        Op::Gelu { approximate } => match approximate {
            GeluApprox::None => half * x * (one + Real::erf(x * T::FRAC_1_SQRT_2())),
            GeluApprox::Tanh => {
                let k = (T::c(2.0) / T::PI()).sqrt();
                half * x * (one + (k * (x + T::c(0.044715) * x * x * x)).tanh())
            }
        },
        _ => T::nan(),
    }
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    use BinaryOp::*;
    let r = match op {
        Add | Sub | Mul | Div | Mod | FMod => {
            let f = |x: &Tensor, y: &Tensor| pair_map!(x, y, p, q => num_binary(op, p, q); F32 F64 I8 U8 I16 U16 I32 U32 I64 U64);
            f(a, b)
        }
        Max | Min => pair_map!(a, b, p, q => minmax(op == Max, p, q);
            F32 F64 I8 U8 I16 U16 I32 U32 I64 U64 Bool),
        Equal | Less | LessOrEqual | Greater | GreaterOrEqual => {
            pair_map!(a, b, p, q => compare(op, p, q); F32 F64 I8 U8 I16 U16 I32 U32 I64 U64 Bool)
        }
        And | Or | Xor => match (a, b) {
            (Tensor::Bool(p), Tensor::Bool(q)) => Some(
                zip_with(p, q, |&x, &y| match op {
                    And => x && y,
                    Or => x || y,
                    _ => x ^ y,
                })
                .map(Tensor::Bool),
            ),
            _ => None,
        },
        BitAnd | BitOr | BitXor | ShiftLeft | ShiftRight => {
            pair_map!(a, b, p, q => int_binary(op, p, q); I8 U8 I16 U16 I32 U32 I64 U64)
        }
        Pow => pow(a, b),
        PRelu => pair_map!(a, b, p, q => prelu(p, q); F32 F64 I8 U8 I16 U16 I32 U32 I64 U64),
    };
    match r {
        Some(r) => r,
        None => dtype_err(op.word(), &[a, b]),
    }
}

fn num_binary<T: Num>(op: BinaryOp, a: &ArrayD<T>, b: &ArrayD<T>) -> Result<Tensor, OpError> {
    use BinaryOp::*;
    let f: fn(T, T) -> T = match op {
        Add => T::add_,
        Sub => T::sub_,
        Mul => T::mul_,
        Div => T::div_,
        Mod => T::mod_,
        FMod => T::fmod_,
        _ => unreachable!("arithmetic op"),
    };
    Ok(T::wrap(zip_with(a, b, |&x, &y| f(x, y))?))
}

/// NaN-propagating max/min (NumPy `maximum`/`minimum`).
fn minmax<T: Elem>(max: bool, a: &ArrayD<T>, b: &ArrayD<T>) -> Result<Tensor, OpError> {
    #[allow(clippy::eq_op)]
    let f = |&x: &T, &y: &T| {
        if x != x {
            x
        } else if y != y {
            y
        } else if (x >= y) == max {
            x
        } else {
            y
        }
    };
    Ok(T::wrap(zip_with(a, b, f)?))
}

fn compare<T: Elem>(op: BinaryOp, a: &ArrayD<T>, b: &ArrayD<T>) -> Result<Tensor, OpError> {
    use BinaryOp::*;
    let f: fn(&T, &T) -> bool = match op {
        Equal => |x, y| x == y,
        Less => |x, y| x < y,
        LessOrEqual => |x, y| x <= y,
        Greater => |x, y| x > y,
        GreaterOrEqual => |x, y| x >= y,
        _ => unreachable!("comparison op"),
    };
    Ok(Tensor::Bool(zip_with(a, b, f)?))
}

fn int_binary<T: Int>(op: BinaryOp, a: &ArrayD<T>, b: &ArrayD<T>) -> Result<Tensor, OpError> {
    use BinaryOp::*;
    let f: fn(T, T) -> T = match op {
        BitAnd => T::and_,
        BitOr => T::or_,
        BitXor => T::xor_,
        ShiftLeft => T::shl_,
        ShiftRight => T::shr_,
        _ => unreachable!("bit op"),
    };
    Ok(T::wrap(zip_with(a, b, |&x, &y| f(x, y))?))
}

/// `x < 0 ? slope * x : x`. The slope broadcasts to x; as in ONNX's reference, a 1-D
/// slope that does not broadcast is matched against the one dim of x of its length.
fn prelu<T: Num>(x: &ArrayD<T>, slope: &ArrayD<T>) -> Result<Tensor, OpError> {
    let f = |&v: &T, &s: &T| if v.is_neg() { s.mul_(v) } else { v };
    let shape = broadcast_shapes(x.shape(), slope.shape());
    if shape.as_deref().ok() == Some(x.shape()) {
        return Ok(T::wrap(zip_with(x, slope, f)?));
    }
    if slope.ndim() == 1 {
        let n = slope.len();
        let hits: Vec<usize> = (0..x.ndim()).filter(|&i| x.shape()[i] == n).collect();
        if let [axis] = hits[..] {
            let mut s = vec![1; x.ndim()];
            s[axis] = n;
            let slope = slope.to_shape(IxDyn(&s)).expect("same length").to_owned();
            return Ok(T::wrap(zip_with(x, &slope, f)?));
        }
    }
    invalid(format!(
        "prelu slope of shape {:?} does not broadcast to {:?}",
        slope.shape(),
        x.shape()
    ))
}

/// Pow: the result has the base's dtype. Float bases with an exponent of their own dtype
/// compute natively; integer pairs compute exactly (wrapping); other mixes compute in f64
/// and convert to the base's dtype (truncating for integer bases), as NumPy does.
fn pow(a: &Tensor, b: &Tensor) -> Option<Result<Tensor, OpError>> {
    fn pow_sc(x: Scalar, e: Scalar) -> Scalar {
        match (x, e) {
            (Scalar::Int(x), Scalar::Int(e)) => Scalar::Int(int_pow(x, e)),
            (x, e) => Scalar::Float(x.to_f64().powf(e.to_f64())),
        }
    }
    fn mixed<B: Elem>(x: &ArrayD<B>, e: &Tensor) -> Result<Tensor, OpError> {
        let r = crate::with_array!(e, ea => zip_with(x, ea, |&p, &q| {
            B::from_scalar(pow_sc(p.to_scalar(), q.to_scalar()))
        }))?;
        Ok(B::wrap(r))
    }
    if a.dtype() == DType::Bool || b.dtype() == DType::Bool {
        return None;
    }
    if let Some(r) =
        pair_map!(a, b, p, q => zip_with(p, q, |&x, &y| x.powf(y)).map(Elem::wrap); F32 F64)
    {
        return Some(r);
    }
    Some(crate::with_array!(a, x => mixed(x, b)))
}

/// `x^e` in wrapping 128-bit arithmetic; negative exponents give the truncated reciprocal.
fn int_pow(x: i128, e: i128) -> i128 {
    if e < 0 {
        return match x {
            1 => 1,
            -1 => {
                if e % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut e, mut acc) = (x, e as u128, 1i128);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

fn where_(c: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, OpError> {
    let Tensor::Bool(c) = c else {
        return invalid(format!("where condition must be bool, got {}", c.dtype()));
    };
    let r = pair_map!(x, y, p, q => zip3_with(c, p, q, |&c, &p, &q| if c { p } else { q })
        .map(Elem::wrap); F32 F64 F16 BF16 I8 U8 I16 U16 I32 U32 I64 U64 Bool);
    r.unwrap_or_else(|| invalid(format!("where operands {} and {}", x.dtype(), y.dtype())))
}

/// `min(max(x, lo), hi)` with NaN kept (NumPy `clip`); lo > hi gives hi everywhere.
fn clip(x: &Tensor, lo: Option<&Tensor>, hi: Option<&Tensor>) -> Result<Tensor, OpError> {
    for t in [lo, hi].into_iter().flatten() {
        if t.len() > 1 {
            return invalid(format!(
                "clip bound of shape {:?} is not a scalar",
                t.shape()
            ));
        }
    }
    let lo = lo.and_then(first_scalar);
    let hi = hi.and_then(first_scalar);
    fn go<T: Elem>(a: &ArrayD<T>, lo: Option<Scalar>, hi: Option<Scalar>) -> ArrayD<T> {
        let lo = lo.map(T::from_scalar);
        let hi = hi.map(T::from_scalar);
        a.mapv(|mut v| {
            if let Some(l) = lo {
                if v < l {
                    v = l;
                }
            }
            if let Some(h) = hi {
                if v > h {
                    v = h;
                }
            }
            v
        })
    }
    Ok(crate::map_array!(x, a => go(a, lo, hi)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::Graph;

    fn run(op: Op, inputs: &[&Tensor]) -> Result<Tensor, OpError> {
        let graph = Graph::default();
        let node = rafter_ir::Node {
            name: "n".into(),
            op: op.clone(),
            inputs: vec![],
            outputs: vec![],
        };
        let ctx = OpCtx {
            graph: &graph,
            node: &node,
        };
        let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        Ok(eval(&op, &ins, &ctx)?.remove(0).unwrap())
    }

    fn arr<T: Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        T::wrap(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    }

    fn vals<T: Elem>(t: &Tensor) -> Vec<T> {
        assert_eq!(t.dtype(), T::DTYPE);
        crate::with_array!(t, a => a.iter().map(|v| T::from_scalar(v.to_scalar())).collect())
    }

    fn bin(op: BinaryOp, a: &Tensor, b: &Tensor) -> Tensor {
        run(Op::Binary { op }, &[a, b]).unwrap()
    }

    fn un(op: UnaryOp, a: &Tensor) -> Tensor {
        run(Op::Unary { op }, &[a]).unwrap()
    }

    #[test]
    fn int_div_truncates_and_mod_signs() {
        let a = arr::<i32>(&[4], vec![7, -7, 7, -7]);
        let b = arr::<i32>(&[4], vec![2, 2, -2, -2]);
        assert_eq!(vals::<i32>(&bin(BinaryOp::Div, &a, &b)), [3, -3, -3, 3]);
        assert_eq!(vals::<i32>(&bin(BinaryOp::Mod, &a, &b)), [1, 1, -1, -1]);
        assert_eq!(vals::<i32>(&bin(BinaryOp::FMod, &a, &b)), [1, -1, 1, -1]);
        let z = arr::<i32>(&[4], vec![0; 4]);
        assert_eq!(vals::<i32>(&bin(BinaryOp::Div, &a, &z)), [0; 4]);
        let m = arr::<i8>(&[1], vec![i8::MIN]);
        let n1 = arr::<i8>(&[1], vec![-1]);
        assert_eq!(vals::<i8>(&bin(BinaryOp::Div, &m, &n1)), [i8::MIN]);
        // ONNX test_mod_mixed_sign_int64.
        let x = arr::<i64>(&[6], vec![-4, 7, 5, 4, -7, 8]);
        let y = arr::<i64>(&[6], vec![2, -3, 8, -2, 3, 5]);
        assert_eq!(
            vals::<i64>(&bin(BinaryOp::Mod, &x, &y)),
            [0, -2, 5, 0, 2, 3]
        );
    }

    #[test]
    fn float_mod_follows_numpy() {
        let inf = f32::INFINITY;
        let a = arr::<f32>(&[6], vec![-5.0, 5.0, -3.0, 5.5, 1.0, -0.0]);
        let b = arr::<f32>(&[6], vec![inf, -inf, 2.0, -2.0, 0.0, 2.0]);
        let r = vals::<f32>(&bin(BinaryOp::Mod, &a, &b));
        assert_eq!(r[..4], [inf, -inf, 1.0, -0.5]);
        assert!(r[4].is_nan());
        assert_eq!(r[5], 0.0);
        let r = vals::<f32>(&bin(BinaryOp::FMod, &a, &b));
        assert_eq!(r[..4], [-5.0, 5.0, -1.0, 1.5]);
    }

    #[test]
    fn broadcasting_and_half() {
        let a = arr::<f16>(&[2, 1], vec![f16::from_f32(1.0), f16::from_f32(2.0)]);
        let b = arr::<f16>(&[3], [0.5f32, 0.25, 0.125].map(f16::from_f32).to_vec());
        let c = bin(BinaryOp::Add, &a, &b);
        assert_eq!(c.shape(), &[2, 3]);
        assert_eq!(
            vals::<f16>(&c),
            [1.5f32, 1.25, 1.125, 2.5, 2.25, 2.125].map(f16::from_f32)
        );
        let lt = bin(BinaryOp::Less, &a, &b);
        assert_eq!(vals::<bool>(&lt), [false; 6]);
        assert!(run(
            Op::Binary { op: BinaryOp::Add },
            &[&a, &arr::<f16>(&[3, 2], vec![f16::ZERO; 6])]
        )
        .is_err());
    }

    #[test]
    fn round_half_even_and_unary() {
        let x = arr::<f32>(&[6], vec![0.5, 1.5, 2.5, -0.5, -2.5, 2.6]);
        assert_eq!(
            vals::<f32>(&un(UnaryOp::Round, &x)),
            [0.0, 2.0, 2.0, -0.0, -2.0, 3.0]
        );
        let i = arr::<i8>(&[3], vec![-128, -3, 4]);
        assert_eq!(vals::<i8>(&un(UnaryOp::Abs, &i)), [-128, 3, 4]);
        assert_eq!(vals::<i8>(&un(UnaryOp::Sign, &i)), [-1, -1, 1]);
        assert_eq!(vals::<i8>(&un(UnaryOp::BitwiseNot, &i)), [127, 2, -5]);
        let n = arr::<f64>(&[3], vec![f64::NAN, 1.0, f64::INFINITY]);
        assert_eq!(vals::<bool>(&un(UnaryOp::IsNaN, &n)), [true, false, false]);
        let e = vals::<f64>(&un(UnaryOp::Erf, &arr::<f64>(&[3], vec![0.0, 0.5, -3.0])));
        assert!((e[1] - 0.520_499_877_813_046_5).abs() < 1e-15);
        assert!((e[2] + 0.999_977_909_503_001_4).abs() < 1e-15);
        assert!(run(Op::Unary { op: UnaryOp::Sqrt }, &[&i]).is_err());
        let s = vals::<f32>(&un(UnaryOp::Sigmoid, &arr::<f32>(&[2], vec![-100.0, 0.0])));
        assert_eq!(s[1], 0.5);
        assert!(s[0] > 0.0 && s[0] < 1e-40);
    }

    #[test]
    fn cast_edges() {
        let x = arr::<f32>(&[6], vec![f32::NAN, 1e10, -1e10, -2.7, 2.7, 300.0]);
        let y = run(Op::Cast { to: DType::I32 }, &[&x]).unwrap();
        assert_eq!(vals::<i32>(&y), [0, i32::MAX, i32::MIN, -2, 2, 300]);
        let y = run(Op::Cast { to: DType::U8 }, &[&x]).unwrap();
        assert_eq!(vals::<u8>(&y), [0, 255, 0, 0, 2, 255]);
        let y = run(Op::Cast { to: DType::Bool }, &[&x]).unwrap();
        assert_eq!(vals::<bool>(&y), [true, true, true, true, true, true]);
        // f32 -> f16 rounds to nearest even: 1 + 2^-11 is a tie, 1 + 2^-11 + 2^-20 is not.
        let t = arr::<f32>(
            &[2],
            vec![1.0 + 2f32.powi(-11), 1.0 + 2f32.powi(-11) + 2f32.powi(-20)],
        );
        let h = run(Op::Cast { to: DType::F16 }, &[&t]).unwrap();
        assert_eq!(
            vals::<f16>(&h),
            [f16::from_f32(1.0), f16::from_bits(0x3c01)]
        );
        let i = arr::<i64>(&[2], vec![-1, 257]);
        assert_eq!(vals::<u8>(&cast(&i, DType::U8)), [255, 1]);
        assert_eq!(
            vals::<f32>(&cast(&arr::<bool>(&[2], vec![true, false]), DType::F32)),
            [1.0, 0.0]
        );
    }

    #[test]
    fn pow_mixed_types() {
        let b = arr::<i32>(&[3], vec![1, 2, 3]);
        let e = arr::<f32>(&[3], vec![1.0, 2.0, 3.0]);
        assert_eq!(vals::<i32>(&bin(BinaryOp::Pow, &b, &e)), [1, 4, 27]);
        let b = arr::<f32>(&[2], vec![2.0, 4.0]);
        let e = arr::<i64>(&[1], vec![-1]);
        assert_eq!(vals::<f32>(&bin(BinaryOp::Pow, &b, &e)), [0.5, 0.25]);
        let b = arr::<i64>(&[2], vec![3, 2]);
        let e = arr::<i64>(&[2], vec![3, -1]);
        assert_eq!(vals::<i64>(&bin(BinaryOp::Pow, &b, &e)), [27, 0]);
    }

    #[test]
    fn shifts_bits_logic() {
        let a = arr::<i8>(&[4], vec![-16, 1, -1, 64]);
        let s = arr::<i8>(&[4], vec![2, 8, -1, 1]);
        assert_eq!(
            vals::<i8>(&bin(BinaryOp::ShiftRight, &a, &s)),
            [-4, 0, -1, 32]
        );
        assert_eq!(
            vals::<i8>(&bin(BinaryOp::ShiftLeft, &a, &s)),
            [-64, 0, 0, -128]
        );
        let u = arr::<u8>(&[2], vec![0b1100, 0b1010]);
        let v = arr::<u8>(&[1], vec![0b0110]);
        assert_eq!(vals::<u8>(&bin(BinaryOp::BitXor, &u, &v)), [0b1010, 0b1100]);
        let p = arr::<bool>(&[2], vec![true, false]);
        let q = arr::<bool>(&[2, 1], vec![true, false]);
        assert_eq!(
            vals::<bool>(&bin(BinaryOp::Xor, &p, &q)),
            [false, true, true, false]
        );
        assert_eq!(vals::<bool>(&un(UnaryOp::Not, &p)), [false, true]);
    }

    #[test]
    fn max_min_nan_prelu_where_clip() {
        let a = arr::<f32>(&[3], vec![1.0, f32::NAN, -2.0]);
        let b = arr::<f32>(&[3], vec![2.0, 0.0, -3.0]);
        let m = vals::<f32>(&bin(BinaryOp::Max, &a, &b));
        assert!(m[0] == 2.0 && m[1].is_nan() && m[2] == -2.0);
        let slope = arr::<f32>(&[1], vec![0.5]);
        assert_eq!(
            vals::<f32>(&bin(BinaryOp::PRelu, &b, &slope)),
            [2.0, 0.0, -1.5]
        );
        let c = arr::<bool>(&[3], vec![true, false, true]);
        let w = run(Op::Where, &[&c, &a, &b]).unwrap();
        assert_eq!(vals::<f32>(&w)[2], -2.0);
        let lo = arr::<i8>(&[], vec![-1]);
        let hi = arr::<i8>(&[], vec![3]);
        let x = arr::<i8>(&[3], vec![-5, 2, 9]);
        let graph = Graph::default();
        let node = rafter_ir::Node {
            name: "c".into(),
            op: Op::Clip,
            inputs: vec![],
            outputs: vec![],
        };
        let ctx = OpCtx {
            graph: &graph,
            node: &node,
        };
        let r = eval(&Op::Clip, &[Some(&x), None, Some(&hi)], &ctx).unwrap();
        assert_eq!(vals::<i8>(r[0].as_ref().unwrap()), [-5, 2, 3]);
        let r = run(Op::Clip, &[&x, &hi, &lo]).unwrap();
        assert_eq!(vals::<i8>(&r), [-1, -1, -1]);
    }

    #[test]
    fn activations() {
        let x = arr::<f32>(&[3], vec![-1.0, 0.0, 2.0]);
        let y = run(Op::LeakyRelu { alpha: 0.1 }, &[&x]).unwrap();
        assert_eq!(vals::<f32>(&y), [-0.1, 0.0, 2.0]);
        let y = run(
            Op::HardSigmoid {
                alpha: 0.5,
                beta: 0.6,
            },
            &[&x],
        )
        .unwrap();
        let h = vals::<f32>(&y);
        assert!((h[0] - 0.1).abs() < 1e-6 && h[1] == 0.6 && h[2] == 1.0);
        let y = run(
            Op::Shrink {
                bias: 1.5,
                lambd: 0.5,
            },
            &[&arr::<i32>(&[3], vec![-3, 0, 3])],
        )
        .unwrap();
        assert_eq!(vals::<i32>(&y), [-1, 0, 1]);
        let y = run(
            Op::Gelu {
                approximate: GeluApprox::None,
            },
            &[&x],
        )
        .unwrap();
        let g = vals::<f32>(&y);
        assert!((g[0] + 0.158_655_25).abs() < 1e-6 && (g[2] - 1.954_499_7).abs() < 1e-6);
        let y = run(
            Op::Gelu {
                approximate: GeluApprox::Tanh,
            },
            &[&x],
        )
        .unwrap();
        assert!((vals::<f32>(&y)[2] - 1.954_597_7).abs() < 1e-6);
        let inf = arr::<f32>(&[3], vec![f32::NEG_INFINITY, 0.0, f32::INFINITY]);
        let y = run(
            Op::IsInf {
                detect_negative: false,
                detect_positive: true,
            },
            &[&inf],
        )
        .unwrap();
        assert_eq!(vals::<bool>(&y), [false, false, true]);
    }
}
