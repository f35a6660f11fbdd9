//! The transcendental activations a generated GEMM or convolution applies in its store
//! path (its epilogue): sigmoid, tanh and GELU (erf or tanh form), so that a matmul
//! followed by its bias and activation (BERT's `MatMul, Add, Gelu`, a pooler's `Gemm, Tanh`,
//! a convolution's `Sigmoid`) stays one kernel on the GPU.
//!
//! The elementwise generator calls these same functions for its `exp`, `tanh` and `erf`
//! (one copy of each formula); they are written over a bare [`Builder`] so the matmul
//! emitter, which has its own state, can call them too. Every
//! function keeps NaN and never feeds a GLSL built-in an argument where Vulkan leaves the
//! result undefined (`Ldexp` overflow, `Exp` of a large argument).

use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{Decoration, Word};

use crate::elementwise::{build, R};

/// GLSL.std.450 instruction numbers used here.
const ROUND_EVEN: u32 = 2;
const FABS: u32 = 4;
const FSIGN: u32 = 6;
const TANH: u32 = 21;
const EXP: u32 = 27;
const FCLAMP: u32 = 43;
const LDEXP: u32 = 53;
const FMA: u32 = 50;

/// A builder with the ids the activations need.
pub(crate) struct Math<'a> {
    pub(crate) b: &'a mut Builder,
    pub(crate) f32: Word,
    pub(crate) bool: Word,
    pub(crate) glsl: Word,
}

impl Math<'_> {
    fn f(&mut self, v: f32) -> Word {
        self.b.constant_bit32(self.f32, v.to_bits())
    }
    fn ext(&mut self, inst: u32, args: &[Word]) -> R<Word> {
        let (f32, glsl) = (self.f32, self.glsl);
        build(
            self.b
                .ext_inst(f32, None, glsl, inst, args.iter().map(|&a| Arg::IdRef(a))),
        )
    }
    fn add(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_add(self.f32, None, a, b))
    }
    fn sub(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_sub(self.f32, None, a, b))
    }
    fn mul(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_mul(self.f32, None, a, b))
    }
    fn div(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_div(self.f32, None, a, b))
    }
    fn lt(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_less_than(self.bool, None, a, b))
    }
    fn gt(&mut self, a: Word, b: Word) -> R<Word> {
        build(self.b.f_ord_greater_than(self.bool, None, a, b))
    }
    fn select(&mut self, cond: Word, a: Word, b: Word) -> R<Word> {
        build(self.b.select(self.f32, None, cond, a, b))
    }
    /// `nan(x) ? x : y`.
    fn keep_nan(&mut self, x: Word, y: Word) -> R<Word> {
        let nan = build(self.b.is_nan(self.bool, None, x))?;
        self.select(nan, x, y)
    }
    /// `op`'s result decorated NoContraction, so the driver keeps the split of `k ln 2`.
    fn exact(&mut self, op: impl FnOnce(&mut Self) -> R<Word>) -> R<Word> {
        let id = op(self)?;
        self.b.decorate(id, Decoration::NoContraction, []);
        Ok(id)
    }

    /// `e^x` range-reduced (`x = k ln 2 + r`, `Exp(r)` scaled by `Ldexp`), 0 below -104 and
    /// infinity above ln(f32::MAX) by selects: a plain `Exp` may be `3 + 2|x|` ulp off.
    pub(crate) fn exp(&mut self, x: Word) -> R<Word> {
        const LN2_HI: f32 = 6.931_457_5e-1; // 0x3f317200, zero low bits
        const LN2_LO: f32 = 1.428_606_8e-6; // 0x35bfbe8e
        const MAX_ARG: f32 = 88.722_83; // 0x42b17217
        let (lo, hi) = (self.f(-104.0), self.f(MAX_ARG));
        let xc = self.ext(FCLAMP, &[x, lo, hi])?;
        let log2e = self.f(std::f32::consts::LOG2_E);
        let scaled = self.mul(xc, log2e)?;
        let k = self.ext(ROUND_EVEN, &[scaled])?;
        let (hi_part, lo_part) = (self.f(LN2_HI), self.f(LN2_LO));
        let k_hi = self.exact(|m| m.mul(k, hi_part))?;
        let r = self.exact(|m| m.sub(xc, k_hi))?;
        let k_lo = self.exact(|m| m.mul(k, lo_part))?;
        let r = self.exact(|m| m.sub(r, k_lo))?;
        let y = self.ext(EXP, &[r])?;
        let i32t = self.b.type_int(32, 1);
        // k is within [-150, 128] after the clamp: the conversion cannot overflow.
        let ki = build(self.b.convert_f_to_s(i32t, None, k))?;
        let (f32, glsl) = (self.f32, self.glsl);
        let e = build(
            self.b
                .ext_inst(f32, None, glsl, LDEXP, [Arg::IdRef(y), Arg::IdRef(ki)]),
        )?;
        let (above, below) = (self.gt(x, hi)?, self.lt(x, lo)?);
        let (inf, zero) = (self.f(f32::INFINITY), self.f(0.0));
        let e = self.select(above, inf, e)?;
        let e = self.select(below, zero, e)?;
        self.keep_nan(x, e)
    }

    /// `1 / (1 + e^-x)` for x >= 0, `e^x / (1 + e^x)` below: never `exp` of a large
    /// positive number.
    pub(crate) fn sigmoid(&mut self, x: Word) -> R<Word> {
        let (zero, one) = (self.f(0.0), self.f(1.0));
        let a = self.ext(FABS, &[x])?;
        let na = build(self.b.f_negate(self.f32, None, a))?;
        let e = self.exp(na)?;
        let d = self.add(one, e)?;
        let pos = self.div(one, d)?;
        let neg = self.div(e, d)?;
        let below = self.lt(x, zero)?;
        let r = self.select(below, neg, pos)?;
        self.keep_nan(x, r)
    }

    /// `tanh` of `x` clamped to ±10 (where f32 tanh is ±1), with the odd series to x^9
    /// for |x| < 1/8, where a driver's `(e^2x - 1) / (e^2x + 1)` cancels.
    pub(crate) fn tanh(&mut self, x: Word) -> R<Word> {
        const SERIES: [f32; 5] = [62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0];
        let (lo, hi) = (self.f(-10.0), self.f(10.0));
        let clamped = self.ext(FCLAMP, &[x, lo, hi])?;
        let t = self.ext(TANH, &[clamped])?;
        let x2 = self.mul(x, x)?;
        let mut p = self.f(SERIES[0]);
        for &c in &SERIES[1..] {
            let m = self.mul(p, x2)?;
            let c = self.f(c);
            p = self.add(m, c)?;
        }
        let series = self.mul(p, x)?;
        let a = self.ext(FABS, &[x])?;
        let eighth = self.f(0.125);
        let small = self.lt(a, eighth)?;
        let t = self.select(small, series, t)?;
        self.keep_nan(x, t)
    }

    /// erf on [-4, 4] (±1 in f32 outside) as the rational approximation of Eigen's and
    /// XLA's f32 erf (odd numerator, even denominator), a few ulp.
    pub(crate) fn erf(&mut self, x: Word) -> R<Word> {
        const ALPHA: [f32; 7] = [
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906_3e-4,
            -2.954_6e-3,
            -1.609_603_3e-2,
        ];
        const BETA: [f32; 5] = [
            -1.456_607_2e-5,
            -2.133_740_6e-4,
            -1.682_827e-3,
            -7.373_329_3e-3,
            -1.426_474e-2,
        ];
        let (lo, hi) = (self.f(-4.0), self.f(4.0));
        let c = self.ext(FCLAMP, &[x, lo, hi])?;
        let c2 = self.mul(c, c)?;
        let mut p = self.f(ALPHA[0]);
        for &a in &ALPHA[1..] {
            let t = self.mul(p, c2)?;
            let a = self.f(a);
            p = self.add(t, a)?;
        }
        p = self.mul(p, c)?;
        let mut q = self.f(BETA[0]);
        for &b in &BETA[1..] {
            let t = self.mul(q, c2)?;
            let b = self.f(b);
            q = self.add(t, b)?;
        }
        let r = self.div(p, q)?;
        // At |x| >= 4 erf is ±1 in f32 (1 - 1.5e-8 rounds to 1); the approximation at the
        // clamp is one ulp short, which `0.5 x (1 + erf)` would scale to a large nonzero
        // GELU for x far below 0.
        let abs = self.ext(FABS, &[x])?;
        let inside = self.lt(abs, hi)?;
        let sign = self.ext(FSIGN, &[x])?;
        let r = self.select(inside, r, sign)?;
        self.keep_nan(x, r)
    }

    /// `0.5 x (1 + erf(x / sqrt 2))`, or with `tanh_form` the tanh approximation
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    pub(crate) fn gelu(&mut self, x: Word, tanh_form: bool) -> R<Word> {
        let (half, one) = (self.f(0.5), self.f(1.0));
        let inner = if tanh_form {
            let k = self.f((2.0f64 / std::f64::consts::PI).sqrt() as f32);
            let c = self.f(0.044715);
            let x2 = self.mul(x, x)?;
            let x3 = self.mul(x2, x)?;
            let t = self.mul(c, x3)?;
            let t = self.add(x, t)?;
            let t = self.mul(k, t)?;
            self.tanh(t)?
        } else {
            let k = self.f(std::f32::consts::FRAC_1_SQRT_2);
            let s = self.mul(x, k)?;
            self.erf(s)?
        };
        let t = self.add(one, inner)?;
        let hx = self.mul(half, x)?;
        self.mul(hx, t)
    }

    /// `a / b` correctly rounded, as IEEE division (and the CPU) gives it: for ONNX's `Div`,
    /// `Reciprocal` and the quotient a quantization rounds. Vulkan lets
    /// `OpFDiv` be 2.5 ulp off, and NVIDIA's is: a quotient that should land exactly on a
    /// .5 tie (25.5 in ONNX's `test_dynamicquantizelinear_expanded`) came out just below it
    /// and rounded to 25, not 26. Residual corrections with the exact residual
    /// `r = a - q * b` (a fused multiply-add) land on the correctly rounded quotient; where
    /// they cannot help (a zero, infinite or NaN quotient or residual, b = 0) the driver's
    /// quotient stays, which keeps infinities, NaNs and signed zeros as they were.
    pub(crate) fn div_exact(&mut self, a: Word, b: Word) -> R<Word> {
        let f32 = self.f32;
        let q = build(self.b.f_div(f32, None, a, b))?;
        // The reciprocal refined by one Newton step (y + y * (1 - b * y)), then two
        // residual corrections of the quotient (Markstein's sequence): one from a 2.5-ulp
        // quotient and reciprocal was not enough on lavapipe (7.000861 / 12.99831 stayed
        // 1 ulp off).
        let one = self.f(1.0);
        let y = build(self.b.f_div(f32, None, one, b))?;
        let minus_b = build(self.b.f_negate(f32, None, b))?;
        let e = self.ext(FMA, &[minus_b, y, one])?;
        let y = self.ext(FMA, &[e, y, y])?;
        let minus_q = build(self.b.f_negate(f32, None, q))?;
        let r0 = self.ext(FMA, &[minus_q, b, a])?;
        let q1 = self.ext(FMA, &[r0, y, q])?;
        let minus_q1 = build(self.b.f_negate(f32, None, q1))?;
        let r = self.ext(FMA, &[minus_q1, b, a])?;
        let corrected = self.ext(FMA, &[r, y, q1])?;
        let bool_ty = self.bool;
        // q1 exact already: keep it (a zero residual would only flip a zero's sign).
        let zero = self.f(0.0);
        let exact = build(self.b.f_ord_equal(bool_ty, None, r, zero))?;
        let corrected = build(self.b.select(f32, None, exact, q1, corrected))?;
        // Where the steps cannot help (b = 0, infinities, NaN: a NaN or infinite result or
        // residual, an infinite or zero quotient), the driver's quotient stays.
        let mut keep = build(self.b.f_ord_equal(bool_ty, None, q, zero))?;
        for (v, nan) in [(corrected, true), (r, true), (q, false)] {
            let inf = build(self.b.is_inf(bool_ty, None, v))?;
            keep = build(self.b.logical_or(bool_ty, None, keep, inf))?;
            if nan {
                let is_nan = build(self.b.is_nan(bool_ty, None, v))?;
                keep = build(self.b.logical_or(bool_ty, None, keep, is_nan))?;
            }
        }
        build(self.b.select(f32, None, keep, q, corrected))
    }
}
