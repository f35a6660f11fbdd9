//! A small portable-SIMD layer for the elementwise, softmax and normalisation kernels.
//!
//! The GEMM has hand-written micro-kernels per ISA because its register tiling differs per
//! ISA. The kernels here are the same algorithm at every width, so they are written once,
//! generic over [`Simd`] (a token type whose methods wrap one ISA's intrinsics), and
//! instantiated per ISA inside a `#[target_feature]` function by [`simd_dispatch!`].
//! Every token method is `#[inline(always)]`, so after the generic body is inlined into the
//! `#[target_feature]` entry point the intrinsics are inlined too and compile to straight
//! vector code.
//!
//! Soundness: a token ([`Avx512`], [`Avx2`]) can only be made by `unsafe fn new`, whose
//! contract is that the CPU has the ISA; [`simd_dispatch!`] makes tokens only inside
//! `#[target_feature]` functions it calls after the caller checked [`crate::Isa::is_available`].
//! Loads and stores take slices and check their length, so kernels themselves need no
//! `unsafe`.
//!
//! The math functions (`exp`, `log`, `erf`, `tanh`, `sigmoid`) are generic too; their
//! accuracy is documented on each and measured by this module's tests against f64.

// Every `unsafe` block here is an intrinsic on a token's ISA, or a load or store the
// `Simd` trait's contract bounds: one SAFETY comment per impl states it for all its blocks,
// so the per-block comment clippy asks for would only repeat it.
#![allow(clippy::undocumented_unsafe_blocks)]

/// One ISA's f32 vector operations. `V` holds `LANES` f32s.
///
/// `min`/`max` follow x86 semantics (`a < b ? a : b`, `a > b ? a : b`: NaN in either
/// operand gives `b`); kernels that must propagate NaN say how they do it.
pub(crate) trait Simd: Copy + Send + Sync {
    type V: Copy;
    const LANES: usize;

    fn splat(self, x: f32) -> Self::V;
    /// The first `LANES` elements of `x` (panics when shorter; in `chunks_exact` loops the
    /// check compiles away).
    fn load(self, x: &[f32]) -> Self::V;
    /// Writes the first `LANES` elements of `x`.
    fn store(self, x: &mut [f32], v: Self::V);
    /// `LANES` elements from `p`, unchecked: for an inner loop whose bounds its caller
    /// checked once, where a check per load cost more than the loads.
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load_at(self, p: *const f32) -> Self::V;
    /// Writes `LANES` elements at `p`, unchecked (see [`Simd::load_at`]).
    ///
    /// # Safety
    /// `p..p + LANES` must be writable, and no reference to them alive.
    unsafe fn store_at(self, p: *mut f32, v: Self::V);
    /// The elements of `x` (fewer than `LANES`), the remaining lanes set to `fill`.
    fn load_partial(self, x: &[f32], fill: f32) -> Self::V;
    /// Writes the first `x.len()` (fewer than `LANES`) lanes of `v` to `x`.
    fn store_partial(self, x: &mut [f32], v: Self::V);
    /// The first `LANES` halves of `x` widened to f32 (exact): an f16 KV cache read at half
    /// the bytes of an f32 one (`vcvtph2ps`).
    fn load_f16(self, x: &[half::f16]) -> Self::V;
    /// The halves of `x` (fewer than `LANES`) widened, the remaining lanes 0.
    fn load_f16_partial(self, x: &[half::f16]) -> Self::V;
    /// Each lane rounded to the nearest f16 (ties to even; beyond 65504 the infinities) and
    /// widened back: an operand of an f16 product, as ggml converts one (`vcvtps2ph`).
    fn round_f16(self, a: Self::V) -> Self::V;

    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c` (fused where the ISA has FMA, which both vector ISAs here do).
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    fn sqrt(self, a: Self::V) -> Self::V;
    /// `a` with its sign bit cleared.
    fn abs(self, a: Self::V) -> Self::V;
    /// `a` with its sign bit flipped.
    fn neg(self, a: Self::V) -> Self::V;
    /// The magnitude of `mag` with the sign bit of `sign`.
    fn copysign(self, mag: Self::V, sign: Self::V) -> Self::V;
    /// Per lane `a < b ? t : f` (false when either is NaN).
    fn select_lt(self, a: Self::V, b: Self::V, t: Self::V, f: Self::V) -> Self::V;
    /// Per lane `a == b ? t : f` (false when either is NaN).
    fn select_eq(self, a: Self::V, b: Self::V, t: Self::V, f: Self::V) -> Self::V;
    /// Per lane `a is NaN ? t : f`.
    fn select_nan(self, a: Self::V, t: Self::V, f: Self::V) -> Self::V;
    /// Round to nearest, ties to even.
    fn round(self, a: Self::V) -> Self::V;
    /// `p * 2^n` for integer-valued `n` in [-252, 254] (a NaN `n` gives a NaN or a finite
    /// garbage value; callers make sure `p` is NaN then).
    fn ldexp(self, p: Self::V, n: Self::V) -> Self::V;
    /// For finite `x > 0` (denormals included): `(m, e)` with `x = m * 2^e`, `m` in
    /// [1, 2). Other inputs give unspecified lanes (callers patch them).
    fn frexp(self, x: Self::V) -> (Self::V, Self::V);
    fn reduce_add(self, a: Self::V) -> f32;
    fn reduce_max(self, a: Self::V) -> f32;
    /// The even and the odd elements of the `2 * LANES` elements `a` then `b`: the two
    /// halves of a stride-2 access (convolution and pooling with stride 2).
    fn deinterleave(self, a: Self::V, b: Self::V) -> (Self::V, Self::V);
    /// `a` and `b` interleaved, `a0 b0 a1 b1 ...`, as two vectors: the inverse of
    /// [`Simd::deinterleave`] (stride-2 stores: Winograd's 2-wide output tiles).
    fn interleave(self, a: Self::V, b: Self::V) -> (Self::V, Self::V);

    /// `(sum x, sum (x - shift)^2)` accumulated in f64 (for normalisation statistics:
    /// exact enough that a row's mean and variance round like the reference's f64 ones).
    #[inline(always)]
    fn sums_f64(self, x: &[f32], shift: f64) -> (f64, f64) {
        let (mut s, mut q) = ([0.0f64; 4], [0.0f64; 4]);
        let mut c = x.chunks_exact(4);
        for v in &mut c {
            for k in 0..4 {
                let d = v[k] as f64;
                s[k] += d;
                q[k] += (d - shift) * (d - shift);
            }
        }
        for &v in c.remainder() {
            s[0] += v as f64;
            q[0] += (v as f64 - shift) * (v as f64 - shift);
        }
        ((s[0] + s[1]) + (s[2] + s[3]), (q[0] + q[1]) + (q[2] + q[3]))
    }
}

/// The portable fallback: one f32 "lane".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    type V = f32;
    const LANES: usize = 1;

    #[inline(always)]
    fn splat(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn load(self, x: &[f32]) -> f32 {
        x[0]
    }
    #[inline(always)]
    unsafe fn load_at(self, p: *const f32) -> f32 {
        // SAFETY: the caller's contract (one element readable).
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store_at(self, p: *mut f32, v: f32) {
        // SAFETY: the caller's contract (one element writable).
        unsafe { *p = v }
    }
    #[inline(always)]
    fn store(self, x: &mut [f32], v: f32) {
        x[0] = v;
    }
    #[inline(always)]
    fn load_partial(self, _x: &[f32], fill: f32) -> f32 {
        fill // never called with elements: LANES is 1
    }
    #[inline(always)]
    fn load_f16(self, x: &[half::f16]) -> f32 {
        x[0].to_f32()
    }
    #[inline(always)]
    fn load_f16_partial(self, _x: &[half::f16]) -> f32 {
        0.0 // never called with elements: LANES is 1
    }
    #[inline(always)]
    fn round_f16(self, a: f32) -> f32 {
        half::f16::from_f32(a).to_f32()
    }
    #[inline(always)]
    fn store_partial(self, _x: &mut [f32], _v: f32) {}
    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(self, a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(self, a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        // Unfused: `mul_add` is a slow libm call without hardware FMA.
        a * b + c
    }
    #[inline(always)]
    fn min(self, a: f32, b: f32) -> f32 {
        if a < b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn max(self, a: f32, b: f32) -> f32 {
        if a > b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn sqrt(self, a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    fn abs(self, a: f32) -> f32 {
        a.abs()
    }
    #[inline(always)]
    fn neg(self, a: f32) -> f32 {
        -a
    }
    #[inline(always)]
    fn copysign(self, mag: f32, sign: f32) -> f32 {
        mag.copysign(sign)
    }
    #[inline(always)]
    fn select_lt(self, a: f32, b: f32, t: f32, f: f32) -> f32 {
        if a < b {
            t
        } else {
            f
        }
    }
    #[inline(always)]
    fn select_eq(self, a: f32, b: f32, t: f32, f: f32) -> f32 {
        if a == b {
            t
        } else {
            f
        }
    }
    #[inline(always)]
    fn select_nan(self, a: f32, t: f32, f: f32) -> f32 {
        if a.is_nan() {
            t
        } else {
            f
        }
    }
    #[inline(always)]
    fn round(self, a: f32) -> f32 {
        a.round_ties_even()
    }
    #[inline(always)]
    fn ldexp(self, p: f32, n: f32) -> f32 {
        let n = n as i32; // NaN -> 0; `p` is NaN then
        let n1 = n >> 1;
        let n2 = n - n1;
        let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
        let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
        p * s1 * s2
    }
    #[inline(always)]
    fn frexp(self, x: f32) -> (f32, f32) {
        let den = x < f32::MIN_POSITIVE;
        let xs = if den { x * 8_388_608.0 } else { x };
        let b = xs.to_bits();
        let e = ((b >> 23) & 0xff) as i32 - 127 - if den { 23 } else { 0 };
        let m = f32::from_bits((b & 0x007f_ffff) | 0x3f80_0000);
        (m, e as f32)
    }
    #[inline(always)]
    fn reduce_add(self, a: f32) -> f32 {
        a
    }
    #[inline(always)]
    fn deinterleave(self, a: f32, b: f32) -> (f32, f32) {
        (a, b)
    }
    #[inline(always)]
    fn interleave(self, a: f32, b: f32) -> (f32, f32) {
        (a, b)
    }
    #[inline(always)]
    fn reduce_max(self, a: f32) -> f32 {
        a
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Simd;
    use std::arch::x86_64::*;

    /// AVX-512F, 16 lanes. Made only where AVX-512F is available (see the module docs).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx512(());

    impl Avx512 {
        /// # Safety
        /// The CPU must support AVX-512F.
        #[inline(always)]
        pub(crate) unsafe fn new() -> Self {
            Avx512(())
        }
    }

    /// AVX2 + FMA + F16C, 8 lanes. Made only where all three are available (see the module
    /// docs; every AVX2 CPU has F16C, which came a generation earlier).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx2(());

    impl Avx2 {
        /// # Safety
        /// The CPU must support AVX2, FMA and F16C.
        #[inline(always)]
        pub(crate) unsafe fn new() -> Self {
            Avx2(())
        }
    }

    // SAFETY (every `unsafe` block in this impl): an `Avx512` exists only when AVX-512F is
    // available; pointer accesses stay inside the slices (lengths checked or masked).
    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;

        #[inline(always)]
        fn splat(self, x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        fn load(self, x: &[f32]) -> __m512 {
            assert!(x.len() >= 16);
            unsafe { _mm512_loadu_ps(x.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_at(self, p: *const f32) -> __m512 {
            // SAFETY: the caller's contract (16 floats readable).
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store_at(self, p: *mut f32, v: __m512) {
            // SAFETY: the caller's contract (16 floats writable).
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn store(self, x: &mut [f32], v: __m512) {
            assert!(x.len() >= 16);
            unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn load_partial(self, x: &[f32], fill: f32) -> __m512 {
            let k: __mmask16 = ((1u32 << x.len().min(16)) - 1) as u16;
            // Masked-off lanes are not accessed (AVX-512 masked loads suppress faults).
            unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(fill), k, x.as_ptr()) }
        }
        #[inline(always)]
        fn load_f16(self, x: &[half::f16]) -> __m512 {
            assert!(x.len() >= 16);
            // `half::f16` is a transparent u16: 16 of them are 32 readable bytes.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().cast())) }
        }
        #[inline(always)]
        fn load_f16_partial(self, x: &[half::f16]) -> __m512 {
            let mut buf = [half::f16::ZERO; 16];
            let n = x.len().min(16);
            buf[..n].copy_from_slice(&x[..n]);
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(buf.as_ptr().cast())) }
        }
        #[inline(always)]
        fn round_f16(self, a: __m512) -> __m512 {
            unsafe {
                _mm512_cvtph_ps(_mm512_cvtps_ph::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(a))
            }
        }
        #[inline(always)]
        fn store_partial(self, x: &mut [f32], v: __m512) {
            let k: __mmask16 = ((1u32 << x.len().min(16)) - 1) as u16;
            unsafe { _mm512_mask_storeu_ps(x.as_mut_ptr(), k, v) }
        }
        #[inline(always)]
        fn add(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_div_ps(a, b) }
        }
        #[inline(always)]
        fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn min(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_min_ps(a, b) }
        }
        #[inline(always)]
        fn max(self, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        fn sqrt(self, a: __m512) -> __m512 {
            unsafe { _mm512_sqrt_ps(a) }
        }
        #[inline(always)]
        fn abs(self, a: __m512) -> __m512 {
            unsafe { _mm512_abs_ps(a) }
        }
        #[inline(always)]
        fn neg(self, a: __m512) -> __m512 {
            unsafe {
                _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(a),
                    _mm512_set1_epi32(i32::MIN),
                ))
            }
        }
        #[inline(always)]
        fn copysign(self, mag: __m512, sign: __m512) -> __m512 {
            unsafe {
                let s = _mm512_set1_epi32(i32::MIN);
                _mm512_castsi512_ps(_mm512_or_si512(
                    _mm512_andnot_si512(s, _mm512_castps_si512(mag)),
                    _mm512_and_si512(s, _mm512_castps_si512(sign)),
                ))
            }
        }
        #[inline(always)]
        fn select_lt(self, a: __m512, b: __m512, t: __m512, f: __m512) -> __m512 {
            unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), f, t) }
        }
        #[inline(always)]
        fn select_eq(self, a: __m512, b: __m512, t: __m512, f: __m512) -> __m512 {
            unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b), f, t) }
        }
        #[inline(always)]
        fn select_nan(self, a: __m512, t: __m512, f: __m512) -> __m512 {
            unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), f, t) }
        }
        #[inline(always)]
        fn round(self, a: __m512) -> __m512 {
            unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
        }
        #[inline(always)]
        fn ldexp(self, p: __m512, n: __m512) -> __m512 {
            // scalef computes p * 2^floor(n) with one rounding, denormal results included.
            unsafe { _mm512_scalef_ps(p, n) }
        }
        #[inline(always)]
        fn frexp(self, x: __m512) -> (__m512, __m512) {
            // getexp/getmant handle denormals natively.
            unsafe {
                (
                    _mm512_getmant_ps::<_MM_MANT_NORM_1_2, _MM_MANT_SIGN_ZERO>(x),
                    _mm512_getexp_ps(x),
                )
            }
        }
        #[inline(always)]
        fn reduce_add(self, a: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(a) }
        }
        #[inline(always)]
        fn deinterleave(self, a: __m512, b: __m512) -> (__m512, __m512) {
            unsafe {
                let even =
                    _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                let odd =
                    _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
                (
                    _mm512_permutex2var_ps(a, even, b),
                    _mm512_permutex2var_ps(a, odd, b),
                )
            }
        }
        #[inline(always)]
        fn interleave(self, a: __m512, b: __m512) -> (__m512, __m512) {
            unsafe {
                // Index i < 16 picks a[i], 16 + i picks b[i].
                let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
                let hi =
                    _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
                (
                    _mm512_permutex2var_ps(a, lo, b),
                    _mm512_permutex2var_ps(a, hi, b),
                )
            }
        }
        #[inline(always)]
        fn reduce_max(self, a: __m512) -> f32 {
            unsafe { _mm512_reduce_max_ps(a) }
        }
        #[inline(always)]
        fn sums_f64(self, x: &[f32], shift: f64) -> (f64, f64) {
            unsafe {
                let sh = _mm512_set1_pd(shift);
                let (mut s0, mut s1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
                let (mut q0, mut q1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
                let mut c = x.chunks_exact(16);
                for v in &mut c {
                    // Two 8-float halves, each widened to 8 doubles.
                    let a = _mm512_cvtps_pd(_mm256_loadu_ps(v.as_ptr()));
                    let b = _mm512_cvtps_pd(_mm256_loadu_ps(v[8..].as_ptr()));
                    s0 = _mm512_add_pd(s0, a);
                    s1 = _mm512_add_pd(s1, b);
                    let (da, db) = (_mm512_sub_pd(a, sh), _mm512_sub_pd(b, sh));
                    q0 = _mm512_fmadd_pd(da, da, q0);
                    q1 = _mm512_fmadd_pd(db, db, q1);
                }
                let (mut s, mut q) = (
                    _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)),
                    _mm512_reduce_add_pd(_mm512_add_pd(q0, q1)),
                );
                for &v in c.remainder() {
                    s += v as f64;
                    q += (v as f64 - shift) * (v as f64 - shift);
                }
                (s, q)
            }
        }
    }

    // SAFETY (every `unsafe` block in this impl): an `Avx2` exists only when AVX2, FMA and
    // F16C are available; pointer accesses stay inside the slices (lengths checked) or a local
    // buffer.
    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;

        #[inline(always)]
        fn splat(self, x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        fn load(self, x: &[f32]) -> __m256 {
            assert!(x.len() >= 8);
            unsafe { _mm256_loadu_ps(x.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_at(self, p: *const f32) -> __m256 {
            // SAFETY: the caller's contract (8 floats readable).
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store_at(self, p: *mut f32, v: __m256) {
            // SAFETY: the caller's contract (8 floats writable).
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        fn store(self, x: &mut [f32], v: __m256) {
            assert!(x.len() >= 8);
            unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn load_partial(self, x: &[f32], fill: f32) -> __m256 {
            let mut buf = [fill; 8];
            let n = x.len().min(8);
            buf[..n].copy_from_slice(&x[..n]);
            unsafe { _mm256_loadu_ps(buf.as_ptr()) }
        }
        #[inline(always)]
        fn load_f16(self, x: &[half::f16]) -> __m256 {
            assert!(x.len() >= 8);
            // `half::f16` is a transparent u16: 8 of them are 16 readable bytes.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().cast())) }
        }
        #[inline(always)]
        fn load_f16_partial(self, x: &[half::f16]) -> __m256 {
            let mut buf = [half::f16::ZERO; 8];
            let n = x.len().min(8);
            buf[..n].copy_from_slice(&x[..n]);
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr().cast())) }
        }
        #[inline(always)]
        fn round_f16(self, a: __m256) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a)) }
        }
        #[inline(always)]
        fn store_partial(self, x: &mut [f32], v: __m256) {
            let mut buf = [0.0f32; 8];
            unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), v) };
            let n = x.len().min(8);
            x[..n].copy_from_slice(&buf[..n]);
        }
        #[inline(always)]
        fn add(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_div_ps(a, b) }
        }
        #[inline(always)]
        fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn min(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_min_ps(a, b) }
        }
        #[inline(always)]
        fn max(self, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_max_ps(a, b) }
        }
        #[inline(always)]
        fn sqrt(self, a: __m256) -> __m256 {
            unsafe { _mm256_sqrt_ps(a) }
        }
        #[inline(always)]
        fn abs(self, a: __m256) -> __m256 {
            unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
        }
        #[inline(always)]
        fn neg(self, a: __m256) -> __m256 {
            unsafe { _mm256_xor_ps(_mm256_set1_ps(-0.0), a) }
        }
        #[inline(always)]
        fn copysign(self, mag: __m256, sign: __m256) -> __m256 {
            unsafe {
                let s = _mm256_set1_ps(-0.0);
                _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign))
            }
        }
        #[inline(always)]
        fn select_lt(self, a: __m256, b: __m256, t: __m256, f: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(f, t, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
        }
        #[inline(always)]
        fn select_eq(self, a: __m256, b: __m256, t: __m256, f: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(f, t, _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b)) }
        }
        #[inline(always)]
        fn select_nan(self, a: __m256, t: __m256, f: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(f, t, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a)) }
        }
        #[inline(always)]
        fn round(self, a: __m256) -> __m256 {
            unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
        }
        #[inline(always)]
        fn ldexp(self, p: __m256, n: __m256) -> __m256 {
            // Two factors, so that every n in [-252, 254] has normal scale factors.
            unsafe {
                let n = _mm256_cvtps_epi32(n);
                let n1 = _mm256_srai_epi32::<1>(n);
                let n2 = _mm256_sub_epi32(n, n1);
                let bias = _mm256_set1_epi32(127);
                let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
                let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
                _mm256_mul_ps(_mm256_mul_ps(p, s1), s2)
            }
        }
        #[inline(always)]
        fn frexp(self, x: __m256) -> (__m256, __m256) {
            unsafe {
                // Denormals: scale by 2^23 first, and take 23 off the exponent.
                let den = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(f32::MIN_POSITIVE));
                let xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8_388_608.0)), den);
                let b = _mm256_castps_si256(xs);
                let e = _mm256_sub_epi32(
                    _mm256_and_si256(_mm256_srli_epi32::<23>(b), _mm256_set1_epi32(0xff)),
                    _mm256_set1_epi32(127),
                );
                let e = _mm256_sub_ps(
                    _mm256_cvtepi32_ps(e),
                    _mm256_and_ps(den, _mm256_set1_ps(23.0)),
                );
                let m = _mm256_or_si256(
                    _mm256_and_si256(b, _mm256_set1_epi32(0x007f_ffff)),
                    _mm256_set1_epi32(0x3f80_0000),
                );
                (_mm256_castsi256_ps(m), e)
            }
        }
        #[inline(always)]
        fn reduce_add(self, a: __m256) -> f32 {
            unsafe {
                let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
                _mm_cvtss_f32(s)
            }
        }
        #[inline(always)]
        fn sums_f64(self, x: &[f32], shift: f64) -> (f64, f64) {
            unsafe {
                let sh = _mm256_set1_pd(shift);
                let (mut s0, mut s1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
                let (mut q0, mut q1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
                let mut c = x.chunks_exact(8);
                for v in &mut c {
                    let a = _mm256_cvtps_pd(_mm_loadu_ps(v.as_ptr()));
                    let b = _mm256_cvtps_pd(_mm_loadu_ps(v[4..].as_ptr()));
                    s0 = _mm256_add_pd(s0, a);
                    s1 = _mm256_add_pd(s1, b);
                    let (da, db) = (_mm256_sub_pd(a, sh), _mm256_sub_pd(b, sh));
                    q0 = _mm256_fmadd_pd(da, da, q0);
                    q1 = _mm256_fmadd_pd(db, db, q1);
                }
                let mut lanes = [0.0f64; 8];
                _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(s0, s1));
                _mm256_storeu_pd(lanes[4..].as_mut_ptr(), _mm256_add_pd(q0, q1));
                let mut s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
                let mut q = (lanes[4] + lanes[5]) + (lanes[6] + lanes[7]);
                for &v in c.remainder() {
                    s += v as f64;
                    q += (v as f64 - shift) * (v as f64 - shift);
                }
                (s, q)
            }
        }
        #[inline(always)]
        fn deinterleave(self, a: __m256, b: __m256) -> (__m256, __m256) {
            unsafe {
                // Per 128-bit lane: [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit quarters
                // reordered to [a0 a2 a4 a6 b0 b2 b4 b6].
                let e = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
                let o = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
                (
                    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(e))),
                    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(o))),
                )
            }
        }
        #[inline(always)]
        fn interleave(self, a: __m256, b: __m256) -> (__m256, __m256) {
            unsafe {
                // Per 128-bit lane: [a0 b0 a1 b1 | a4 b4 a5 b5] and [a2 b2 a3 b3 | a6 b6 a7 b7],
                // then the low lanes together and the high lanes together.
                let l = _mm256_unpacklo_ps(a, b);
                let h = _mm256_unpackhi_ps(a, b);
                (
                    _mm256_permute2f128_ps::<0x20>(l, h),
                    _mm256_permute2f128_ps::<0x31>(l, h),
                )
            }
        }
        #[inline(always)]
        fn reduce_max(self, a: __m256) -> f32 {
            unsafe {
                let s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
                _mm_cvtss_f32(s)
            }
        }
    }
}

/// Instantiates a generic kernel `$generic::<S: Simd>(s, args..)` per ISA and defines
/// `$name(isa, args..)` that runs the one for `isa` (the scalar one for `Isa::Scalar` and
/// ISAs without a vector path here, e.g. NEON).
///
/// The caller of `$name` must have checked `isa.is_available()`.
macro_rules! simd_dispatch {
    ($vis:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) $(-> $ret:ty)? => $generic:ident) => {
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(isa: $crate::Isa, $($a: $t),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            #[allow(clippy::too_many_arguments)]
            fn avx512($($a: $t),*) $(-> $ret)? {
                // SAFETY: this function runs only where AVX-512F is available (it is
                // compiled with it, and called after `Isa::is_available`).
                $generic(unsafe { $crate::simd::Avx512::new() }, $($a),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            #[allow(clippy::too_many_arguments)]
            fn avx2($($a: $t),*) $(-> $ret)? {
                // SAFETY: as above, for AVX2, FMA and F16C.
                $generic(unsafe { $crate::simd::Avx2::new() }, $($a),*)
            }
            match isa {
                // SAFETY: the caller checked that `isa` is available on this CPU.
                #[cfg(target_arch = "x86_64")]
                $crate::Isa::Avx512 => unsafe { avx512($($a),*) },
                // SAFETY: as for AVX-512.
                #[cfg(target_arch = "x86_64")]
                $crate::Isa::Avx2 => unsafe { avx2($($a),*) },
                _ => $generic($crate::simd::Scalar, $($a),*),
            }
        }
    };
}

/// The most lanes of any [`Simd`] (AVX-512's 16): what kernels size their scratch's slack
/// and row padding for, so one layout serves every ISA.
pub(crate) const MAX_LANES: usize = 16;

/// `dst.copy_from_slice(src)` by vectors, inline: a kernel copying many short rows
/// (padded planes, panels) would otherwise pay a `memcpy` call per row. MobileNetV2's 7×7
/// depthwise layers (960 planes): 49–57 → 44–50 µs a call (`rafter bench --trace`, three
/// alternated rounds); its larger planes did not change.
#[inline(always)]
pub(crate) fn copy<S: Simd>(s: S, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "copy: lengths differ");
    let l = S::LANES;
    let full = src.len() / l * l;
    for x in (0..full).step_by(l) {
        s.store(&mut dst[x..], s.load(&src[x..]));
    }
    if full < src.len() {
        s.store_partial(&mut dst[full..], s.load_partial(&src[full..], 0.0));
    }
}

/// `S::LANES` from a token value (for the macros below, which cannot name `S`).
#[inline(always)]
pub(crate) fn lanes<S: Simd>(_: S) -> usize {
    S::LANES
}

/// `x[i] = body(x[i])` over a slice, vector by vector, the partial last vector masked.
///
/// A macro, not a function taking a closure: a closure is a function of its own, compiled
/// without the caller's `#[target_feature]`s, and when LLVM declines to inline a large one
/// (an `erf`) every intrinsic in it becomes an out-of-line call (measured 10-40x slower).
/// Expanded in place, `body` is compiled inside the `#[target_feature]` function.
macro_rules! map_in_place {
    ($s:ident, $x:expr, |$v:ident| $body:expr) => {{
        let x: &mut [f32] = $x;
        let mut c = x.chunks_exact_mut($crate::simd::lanes($s));
        for ch in &mut c {
            let $v = $s.load(ch);
            let r = $body;
            $s.store(ch, r);
        }
        let tail = c.into_remainder();
        if !tail.is_empty() {
            let $v = $s.load_partial(tail, 0.0);
            let r = $body;
            $s.store_partial(tail, r);
        }
    }};
}

// ---------------------------------------------------------------------------------------
// Math functions
// ---------------------------------------------------------------------------------------

const LN2_HI: f32 = 0.693_359_4; // 355/512: n * LN2_HI is exact for |n| < 2^15
const LN2_LO: f32 = -2.121_944_4e-4;

/// `e^x`. Cody-Waite reduction `x = n ln2 + r`, |r| <= ln2/2, then Cephes' degree-5
/// minimax polynomial for `(e^r - 1 - r) / r^2`, scaled by `2^n` with [`Simd::ldexp`].
///
/// Measured (tests, 200k points of [-87, 88.7]): at most 2 ulp from the correctly
/// rounded result. Results below f32::MIN_POSITIVE (x < -87.33) are flushed to +0, as in
/// FTZ mode: computing denormals costs a microcode assist per vector on x86 (measured 3x
/// slower softmax rows with masked-out keys), and the error is below 1.2e-38 absolute.
/// Above f32::MAX the result is +inf; `e^-inf` is exactly 0 and NaN stays NaN.
#[inline(always)]
pub(crate) fn exp<S: Simd>(s: S, x0: S::V) -> S::V {
    // max(lo, x) keeps a NaN x (x86 returns the second operand), so NaN propagates. The
    // lower clamp keeps `2^n p` normal (n >= -126 with p >= 1 there).
    let lo = s.splat(-87.33);
    let x = s.min(s.splat(89.0), s.max(lo, x0));
    let n = s.round(s.mul(x, s.splat(std::f32::consts::LOG2_E)));
    let r = s.fma(n, s.splat(-LN2_HI), x);
    let r = s.fma(n, s.splat(-LN2_LO), r);
    let mut p = s.splat(1.987_569_1e-4);
    for c in [
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = s.fma(p, r, s.splat(c));
    }
    let r2 = s.mul(r, r);
    let p = s.add(s.fma(p, r2, r), s.splat(1.0));
    s.select_lt(x0, lo, s.splat(0.0), s.ldexp(p, n))
}

/// Natural log. `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)), then Cephes' `logf`
/// polynomial in `m - 1`. Measured at most 2 ulp on positive normal and denormal
/// inputs; `log(0) = -inf`, `log(x < 0) = NaN`, `log(inf) = inf`, NaN stays NaN.
#[inline(always)]
pub(crate) fn log<S: Simd>(s: S, x: S::V) -> S::V {
    let one = s.splat(1.0);
    let (m, e) = s.frexp(x);
    // m in [1, 2): fold into [sqrt(1/2), sqrt(2)).
    let big = std::f32::consts::SQRT_2;
    let m_half = s.mul(m, s.splat(0.5));
    let e1 = s.add(e, one);
    let (m, e) = (
        s.select_lt(m, s.splat(big), m, m_half),
        s.select_lt(m, s.splat(big), e, e1),
    );
    let f = s.sub(m, one);
    let z = s.mul(f, f);
    let mut p = s.splat(7.037_683_6e-2);
    for c in [
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_5e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ] {
        p = s.fma(p, f, s.splat(c));
    }
    let y = s.mul(s.mul(p, f), z);
    let y = s.fma(e, s.splat(LN2_LO), y);
    let y = s.fma(z, s.splat(-0.5), y);
    let r = s.add(f, y);
    let r = s.fma(e, s.splat(LN2_HI), r);
    // Special values: 0 -> -inf, negative -> NaN, +inf -> +inf, NaN -> NaN.
    let zero = s.splat(0.0);
    let r = s.select_eq(x, zero, s.splat(f32::NEG_INFINITY), r);
    let r = s.select_lt(x, zero, s.splat(f32::NAN), r);
    let r = s.select_eq(x, s.splat(f32::INFINITY), x, r);
    s.select_nan(x, x, r)
}

/// `erf(x)`. Two branches, both evaluated, selected per lane:
/// - |x| < 0.5: the Taylor series `2/sqrt(pi) * x * (1 - x^2/3 + x^4/10 - ...)` to `x^13`
///   (truncation < 1e-9 relative), so small arguments keep full relative accuracy;
/// - otherwise Abramowitz & Stegun 7.1.26,
///   `1 - t (a1 + t (a2 + ...)) e^{-x^2}` with `t = 1 / (1 + p|x|)`, whose own error is
///   below 1.5e-7 absolute, with the sign restored.
///
/// Measured (tests, 240k-point sweep of [-6, 6] against an f64 erf): max abs error
/// 3.7e-7 (the approximation's 1.5e-7 plus f32 rounding of `1 - ..`), and at most
/// 2.3 ulp relative for |x| < 0.5. NaN stays NaN; `erf(+-inf) = +-1`.
#[inline(always)]
pub(crate) fn erf<S: Simd>(s: S, x: S::V) -> S::V {
    let a = s.abs(x);
    // Small |x|: odd Taylor polynomial in x^2.
    let z = s.mul(x, x);
    // erf(x) sqrt(pi) / 2 = x sum_k c_k x^{2k}, c_k = (-1)^k / (k! (2k + 1)), k = 6 down to 0.
    let mut q = s.splat(1.0 / 9_360.0);
    for c in [
        -1.0 / 1_320.0,
        1.0 / 216.0,
        -1.0 / 42.0,
        1.0 / 10.0,
        -1.0 / 3.0,
        1.0,
    ] {
        q = s.fma(q, z, s.splat(c));
    }
    let small = s.mul(s.mul(x, q), s.splat(std::f32::consts::FRAC_2_SQRT_PI));
    // Large |x|: A&S 7.1.26.
    let t = s.div(s.splat(1.0), s.fma(a, s.splat(0.327_591_1), s.splat(1.0)));
    let mut p = s.splat(1.061_405_4);
    for c in [-1.453_152_1, 1.421_413_7, -0.284_496_72, 0.254_829_6] {
        p = s.fma(p, t, s.splat(c));
    }
    let e = exp(s, s.neg(z));
    let big = s.copysign(s.sub(s.splat(1.0), s.mul(s.mul(p, t), e)), x);
    s.select_lt(a, s.splat(0.5), small, big)
}

/// `tanh(x)`. |x| < 0.4: the odd Taylor series to `x^15` (truncation < 3e-10 relative);
/// otherwise `sign(x) (1 - 2 / (e^{2|x|} + 1))` with [`exp`] (at most a few ulp: the
/// cancellation in `1 - ..` is mild for |x| >= 0.4). Saturates to +-1, NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh<S: Simd>(s: S, x: S::V) -> S::V {
    let a = s.abs(x);
    let z = s.mul(x, x);
    let mut q = s.splat(-929_569.0 / 638_512_875.0);
    for c in [
        21_844.0 / 6_081_075.0,
        -1_382.0 / 155_925.0,
        62.0 / 2_835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
    ] {
        q = s.fma(q, z, s.splat(c));
    }
    // copysign: keeps tanh(-0) = -0 (the sum would round it to +0).
    let small = s.copysign(s.fma(s.mul(x, z), q, x), x);
    let e = exp(s, s.add(a, a));
    let big = s.sub(s.splat(1.0), s.div(s.splat(2.0), s.add(e, s.splat(1.0))));
    let big = s.copysign(big, x);
    // A NaN fails `a < 0.4`, and `big` is NaN then.
    s.select_lt(a, s.splat(0.4), small, big)
}

/// `1 / (1 + e^-x)`, as the reference computes it: `1 / (1 + e^-x)` for x >= 0 and
/// `e^x / (1 + e^x)` for x < 0 (so tiny results keep relative accuracy). A few ulp.
#[inline(always)]
pub(crate) fn sigmoid<S: Simd>(s: S, x: S::V) -> S::V {
    let e = exp(s, s.neg(s.abs(x)));
    let r = s.div(s.splat(1.0), s.add(s.splat(1.0), e));
    s.select_lt(x, s.splat(0.0), s.mul(e, r), r)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Isa;

    /// Applies math function `F` (0 exp, 1 log, 2 erf, 3 tanh, 4 sigmoid) to every
    /// element of `xs` on `isa`, through the dispatch macro.
    fn map_with<const F: u8>(isa: Isa, xs: &[f32]) -> Vec<f32> {
        fn go<S: Simd>(s: S, f: u8, xs: &[f32], ys: &mut [f32]) {
            ys.copy_from_slice(xs);
            match f {
                0 => map_in_place!(s, ys, |v| exp(s, v)),
                1 => map_in_place!(s, ys, |v| log(s, v)),
                2 => map_in_place!(s, ys, |v| erf(s, v)),
                3 => map_in_place!(s, ys, |v| tanh(s, v)),
                _ => map_in_place!(s, ys, |v| sigmoid(s, v)),
            }
        }
        simd_dispatch!(fn run(f: u8, xs: &[f32], ys: &mut [f32]) => go);
        let mut ys = vec![0.0; xs.len()];
        run(isa, F, xs, &mut ys);
        ys
    }

    pub(crate) fn isas() -> Vec<Isa> {
        Isa::all()
            .iter()
            .copied()
            .filter(|i| i.is_available())
            .collect()
    }

    /// Distance in units in the last place of `want` (as f32).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        if got == w || (got.is_nan() && w.is_nan()) {
            return 0.0;
        }
        let ulp = (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64;
        ((got as f64 - want) / ulp).abs()
    }

    fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
            .collect()
    }

    /// `interleave` then `deinterleave` on `isa`: the interleaved halves and the round trip.
    fn interleave_on(isa: Isa, a: &[f32], b: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        #[inline(always)]
        fn go<S: Simd>(s: S, a: &[f32], b: &[f32], out: &mut [f32], back: &mut [f32]) {
            let l = S::LANES;
            let (lo, hi) = s.interleave(s.load(a), s.load(b));
            s.store(&mut out[..l], lo);
            s.store(&mut out[l..], hi);
            let (e, o) = s.deinterleave(lo, hi);
            s.store(&mut back[..l], e);
            s.store(&mut back[l..], o);
        }
        simd_dispatch!(fn run(a: &[f32], b: &[f32], out: &mut [f32], back: &mut [f32]) => go);
        let l = match isa {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
            _ => 1,
        };
        let (mut out, mut back) = (vec![0.0; 2 * l], vec![0.0; 2 * l]);
        run(isa, &a[..l], &b[..l], &mut out, &mut back);
        let want: Vec<f32> = (0..l).flat_map(|i| [a[i], b[i]]).collect();
        (out, want, back)
    }

    #[test]
    fn interleave_is_the_inverse_of_deinterleave() {
        let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..16).map(|i| 100.0 + i as f32).collect();
        for isa in isas() {
            let (out, want, back) = interleave_on(isa, &a, &b);
            assert_eq!(out, want, "{isa:?}");
            let l = out.len() / 2;
            assert_eq!(back[..l], a[..l], "{isa:?}");
            assert_eq!(back[l..], b[..l], "{isa:?}");
        }
    }

    #[test]
    fn exp_is_within_2_ulp() {
        let xs = sweep(-87.0, 88.7, 200_003);
        for isa in isas() {
            let ys = map_with::<0>(isa, &xs);
            let worst = xs
                .iter()
                .zip(&ys)
                .map(|(&x, &y)| ulps(y, (x as f64).exp()))
                .fold(0.0, f64::max);
            assert!(worst <= 2.0, "{isa:?}: {worst} ulp");
        }
        let special = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -104.0,
            -1000.0,
            89.0,
            0.0,
        ];
        for isa in isas() {
            let ys = map_with::<0>(isa, &special);
            assert_eq!(ys[0], 0.0, "{isa:?}");
            assert_eq!(ys[1], f32::INFINITY, "{isa:?}");
            assert!(ys[2].is_nan(), "{isa:?}");
            assert_eq!(ys[4], 0.0, "{isa:?}");
            assert_eq!(ys[5], f32::INFINITY, "{isa:?}");
            assert_eq!(ys[6], 1.0, "{isa:?}");
            // Denormal range: flushed to zero; just above it, normal and accurate.
            let d = map_with::<0>(isa, &[-87.34, -95.0, -103.0, -87.3]);
            assert_eq!(&d[..3], &[0.0; 3], "{isa:?}");
            assert!(
                ulps(d[3], (-87.3f32 as f64).exp()) <= 2.0,
                "{isa:?}: {}",
                d[3]
            );
        }
    }

    #[test]
    fn log_is_within_2_ulp() {
        let mut xs = sweep(1e-3, 10.0, 100_001);
        xs.extend(sweep(0.5, 2.0, 100_001));
        xs.extend([1e-40, 1e-30, 3e38, 1.0, f32::MIN_POSITIVE]);
        for isa in isas() {
            let ys = map_with::<1>(isa, &xs);
            let worst = xs
                .iter()
                .zip(&ys)
                .map(|(&x, &y)| ulps(y, (x as f64).ln()))
                .fold(0.0, f64::max);
            assert!(worst <= 2.0, "{isa:?}: {worst} ulp");
            let sp = map_with::<1>(isa, &[0.0, -1.0, f32::INFINITY, f32::NAN, -0.0]);
            assert_eq!(sp[0], f32::NEG_INFINITY);
            assert!(sp[1].is_nan());
            assert_eq!(sp[2], f32::INFINITY);
            assert!(sp[3].is_nan());
            assert_eq!(sp[4], f32::NEG_INFINITY);
        }
    }

    pub(crate) fn erf64(x: f64) -> f64 {
        libm_erf(x)
    }

    /// erf in f64 from its series / continued fraction (no libm dependency here): the
    /// Taylor series converges fast enough in f64 for |x| < 3; beyond, erfc's continued
    /// fraction.
    fn libm_erf(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            let (mut term, mut sum, mut k) = (a, a, 0.0);
            loop {
                k += 1.0;
                term *= -a * a / k;
                let t = term / (2.0 * k + 1.0);
                sum += t;
                if t.abs() <= 1e-17 * sum.abs() {
                    break;
                }
            }
            sum * std::f64::consts::FRAC_2_SQRT_PI
        } else {
            // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...))))
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
        };
        r.copysign(x)
    }

    #[test]
    fn erf_is_within_4e7_abs() {
        let xs = sweep(-6.0, 6.0, 240_001);
        for isa in isas() {
            let ys = map_with::<2>(isa, &xs);
            let mut worst = 0.0f64;
            let mut worst_small = 0.0f64;
            for (&x, &y) in xs.iter().zip(&ys) {
                let want = erf64(x as f64);
                worst = worst.max((y as f64 - want).abs());
                if x.abs() < 0.5 {
                    worst_small = worst_small.max(ulps(y, want));
                }
            }
            eprintln!("{isa:?}: erf max abs err {worst:e}, small-x {worst_small} ulp");
            assert!(worst <= 4e-7, "{isa:?}: abs err {worst}");
            assert!(worst_small <= 4.0, "{isa:?}: small-x {worst_small} ulp");
            let sp = map_with::<2>(isa, &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30]);
            assert_eq!(&sp[..2], &[1.0, -1.0]);
            assert!(sp[2].is_nan());
            assert!(ulps(sp[3], erf64(1e-30f32 as f64)) <= 1.0);
        }
    }

    #[test]
    fn tanh_and_sigmoid_are_accurate() {
        let xs = sweep(-20.0, 20.0, 200_001);
        for isa in isas() {
            let t = map_with::<3>(isa, &xs);
            let sg = map_with::<4>(isa, &xs);
            let (mut wt, mut ws) = (0.0f64, 0.0f64);
            for ((&x, &t), &sg) in xs.iter().zip(&t).zip(&sg) {
                wt = wt.max(ulps(t, (x as f64).tanh()));
                ws = ws.max(ulps(sg, 1.0 / (1.0 + (-(x as f64)).exp())));
            }
            assert!(wt <= 4.0, "{isa:?}: tanh {wt} ulp");
            assert!(ws <= 4.0, "{isa:?}: sigmoid {ws} ulp");
            let sp = map_with::<3>(isa, &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0]);
            assert_eq!(&sp[..2], &[1.0, -1.0]);
            assert!(sp[2].is_nan());
            assert!(sp[3] == 0.0 && sp[3].is_sign_negative());
            let sp = map_with::<4>(isa, &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -100.0]);
            assert_eq!(&sp[..2], &[1.0, 0.0]);
            assert!(sp[2].is_nan());
            assert!(sp[3] >= 0.0 && sp[3] < 1e-38);
        }
    }
}
