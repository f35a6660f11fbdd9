//! Exact integer matrix products on the f32 GEMM, for the quantized kernels
//! (`QLinearConv`/`ConvInteger` in qconv.rs, `MatMulInteger` in matmul_integer.rs).
//!
//! Operands shifted by their zero points are integers of magnitude at most 255, so every
//! product is an integer of magnitude at most 255² = 65,025, and a sum of at most
//! [`EXACT_K`] = 256 of them stays below 2²⁴ = 16,777,216 (256 · 65,025 = 16,646,400):
//! every partial sum, in any order, with or without FMA, is an integer f32 represents
//! exactly. Longer reductions run in chunks of 256 whose exact products are added in i32
//! (wrapping, as ONNX Runtime's i32 accumulation does). So the result is the integer product
//! bit for bit, at the speed of the crate's tuned f32 GEMM and its ISA dispatch.

use rafter_kernels_cpu::{sgemm, BRef, Epilogue, GemmError, MatMut, MatRef, Parallel};

/// The longest reduction summed exactly in f32 (see the module docs).
pub(super) const EXACT_K: usize = 256;

/// Grows `v` to at least `len` (never shrinks: every element used is written first).
pub(super) fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// The exact `[m, n]` product: the f32 product itself when one chunk covered K, else the
/// i32 sums of the chunks.
pub(super) enum ExactProduct<'a> {
    Single(&'a [f32]),
    Chunked(&'a [i32]),
}

impl ExactProduct<'_> {
    /// Element `i` (row-major).
    #[inline]
    pub(super) fn get(&self, i: usize) -> i32 {
        match self {
            ExactProduct::Single(p) => p[i] as i32,
            ExactProduct::Chunked(a) => a[i],
        }
    }

    /// `len` elements from `start`.
    pub(super) fn run(&self, start: usize, len: usize) -> impl Iterator<Item = i32> + '_ {
        (start..start + len).map(|i| self.get(i))
    }
}

/// `a · b` exactly, for row-major `a` (`[m, k]`, row stride `lda`) and `b` (`[k, n]`) that
/// hold integers of magnitude at most 255 (see the module docs). `prod` and `acc` are
/// scratch, grown as needed; the result borrows one of them.
#[allow(clippy::too_many_arguments)]
pub(super) fn exact_product<'s>(
    a: &[f32],
    lda: usize,
    b: &[f32],
    [m, k, n]: [usize; 3],
    prod: &'s mut Vec<f32>,
    acc: &'s mut Vec<i32>,
    par: &dyn Parallel,
) -> Result<ExactProduct<'s>, GemmError> {
    let prod = grow(prod, m * n);
    if k == 0 {
        prod.fill(0.0);
        return Ok(ExactProduct::Single(prod));
    }
    let chunks = k.div_ceil(EXACT_K);
    let acc = grow(acc, if chunks > 1 { m * n } else { 0 });
    for ci in 0..chunks {
        let (k0, k1) = (ci * EXACT_K, ((ci + 1) * EXACT_K).min(k));
        let am = MatRef::row_major(&a[k0..], m, k1 - k0, lda)?;
        let bm = MatRef::row_major(&b[k0 * n..k1 * n], k1 - k0, n, n)?;
        let cm = MatMut::row_major(prod, m, n, n)?;
        sgemm(1.0, am, BRef::Mat(bm), 0.0, cm, &Epilogue::none(), par)?;
        if chunks > 1 {
            for (s, &v) in acc.iter_mut().zip(prod.iter()) {
                *s = if ci == 0 {
                    v as i32
                } else {
                    s.wrapping_add(v as i32)
                };
            }
        }
    }
    Ok(if chunks > 1 {
        ExactProduct::Chunked(acc)
    } else {
        ExactProduct::Single(prod)
    })
}

/// A weight shifted by its zero point as f32, kept for the program weight it came from: the
/// same bytes on every call, so it is computed once per kernel.
#[derive(Default)]
pub(super) struct ShiftedWeight(std::sync::Mutex<Option<(usize, std::sync::Arc<Vec<f32>>)>>);

impl ShiftedWeight {
    /// The cached shift of program weight `key`, computed by `compute` the first time; a
    /// `None` key (an operand that is not a weight, or a zero point that may change) is
    /// computed every call.
    pub(super) fn get(
        &self,
        key: Option<usize>,
        compute: impl FnOnce() -> Vec<f32>,
    ) -> std::sync::Arc<Vec<f32>> {
        let Some(key) = key else {
            return std::sync::Arc::new(compute());
        };
        let mut cached = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((k, v)) if *k == key => v.clone(),
            _ => {
                let v = std::sync::Arc::new(compute());
                *cached = Some((key, v.clone()));
                v
            }
        }
    }
}
