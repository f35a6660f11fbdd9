//! Cumulative sums and products along one axis (ONNX `CumSum`, and the product that
//! rafter's IR names alongside it), on row-major tensors viewed as `[outer, len, inner]`
//! around the axis (`len` is the axis, `outer` the product of the dims before it, `inner`
//! of those after it).
//!
//! - `inner > 1`: step `j` of the scan is a whole row of `inner` contiguous elements, so
//!   `y[j] = y[j - 1] ⊕ x[j]` is an elementwise op over two slices (the previous result
//!   row is the running accumulator: no scratch), which the compiler vectorises. The rows
//!   of one outer slice are split into column blocks (multiples of 16 elements), so a
//!   single large slice (`[1, 64, 56, 56]` over the channels: one outer slice) still
//!   spreads over the threads.
//! - `inner == 1`: each lane of `len` elements is contiguous; one scalar running value per
//!   lane, lanes split over the threads.
//!
//! Semantics as ONNX specifies (and as `rafter-reference` computes): with `exclusive` the
//! element's own value is left out (the first result of a scan is the identity, 0 or 1);
//! with `reverse` the scan runs from the end of the axis towards its start. An empty axis
//! (or any empty dim) writes nothing.
//!
//! # Precision
//! The scan accumulates **in the element type**, as ONNX Runtime's CPU `CumSum` does (its
//! kernel keeps a running `T`): an f32 sum is rounded to f32 after every step, so over a
//! long axis it can differ from the reference executor (which accumulates in f64 and
//! rounds each result once) by the usual `len * 2^-24` relative drift of a sequential f32
//! sum. Integers wrap on overflow (two's complement), exactly as the reference's wrapping
//! i128 accumulation truncated to the element type.

use crate::common::{check_len, par_blocks, Disjoint, KernelError};
use crate::Parallel;

/// An element type the cumulative kernel scans: its identities and its (wrapping, for
/// integers) sum and product.
pub trait CumElem: Copy + Send + Sync + 'static {
    /// The identity of the sum.
    const ZERO: Self;
    /// The identity of the product.
    const ONE: Self;
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
}

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl CumElem for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
        }
    )*};
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl CumElem for $t {
            const ZERO: $t = 0;
            const ONE: $t = 1;
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
        }
    )*};
}

float_elem!(f32, f64);
int_elem!(i32, i64);

/// The shape and flavour of a cumulative scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cumulative {
    /// Product of the dims before the axis.
    pub outer: usize,
    /// The axis' length.
    pub len: usize,
    /// Product of the dims after the axis.
    pub inner: usize,
    /// A running product (else a running sum).
    pub prod: bool,
    /// Leave each element's own value out of its result.
    pub exclusive: bool,
    /// Scan from the end of the axis towards its start.
    pub reverse: bool,
}

impl Cumulative {
    /// The scan along axis `axis` of a row-major tensor of `dims` (`axis < dims.len()`).
    pub fn around(dims: &[usize], axis: usize, prod: bool, exclusive: bool, reverse: bool) -> Self {
        Cumulative {
            outer: dims[..axis].iter().product(),
            len: dims[axis],
            inner: dims[axis + 1..].iter().product(),
            prod,
            exclusive,
            reverse,
        }
    }

    fn elems(&self) -> Option<usize> {
        self.outer.checked_mul(self.len)?.checked_mul(self.inner)
    }
}

/// Column blocks are multiples of this many elements (a 64-byte line of f32s), so that
/// two tasks rarely share a cache line of the result.
const COL_ALIGN: usize = 16;
/// Column blocks narrower than this are not worth a task of their own.
const MIN_COLS: usize = 64;

/// `y = cumulative(x)` along the axis of `shape` (see the module doc), on `par`.
pub fn cumulative<T: CumElem>(
    x: &[T],
    y: &mut [T],
    shape: &Cumulative,
    par: &dyn Parallel,
) -> Result<(), KernelError> {
    let n = shape.elems().ok_or_else(|| KernelError::Shape {
        what: "cumulative".into(),
        detail: format!("{shape:?} overflows"),
    })?;
    check_len("cumulative input", x.len(), n)?;
    check_len("cumulative output", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    if shape.prod {
        scan(x, y, shape, T::ONE, T::mul, par);
    } else {
        scan(x, y, shape, T::ZERO, T::add, par);
    }
    Ok(())
}

/// The scan with operator `op` and its identity; `x` and `y` hold `outer * len * inner`
/// elements, none of the three is 0.
fn scan<T: CumElem, F: Fn(T, T) -> T + Copy + Sync>(
    x: &[T],
    y: &mut [T],
    s: &Cumulative,
    identity: T,
    op: F,
    par: &dyn Parallel,
) {
    let (outer, len, inner) = (s.outer, s.len, s.inner);
    let out = Disjoint::new(y);
    if inner == 1 {
        par_blocks(par, outer, len, &|lanes| {
            let span = lanes.start * len..lanes.end * len;
            // SAFETY: `par_blocks` hands out disjoint lane ranges.
            let yb = unsafe { out.part(span.clone()) };
            for (xl, yl) in x[span].chunks_exact(len).zip(yb.chunks_exact_mut(len)) {
                lane(xl, yl, identity, op, s.exclusive, s.reverse);
            }
        });
        return;
    }
    // Enough column blocks per outer slice for about four tasks per thread in all.
    let want = (par.threads().max(1) * 4).div_ceil(outer);
    let blocks = want.min(inner / MIN_COLS).max(1);
    let bound = |b: usize| {
        if b >= blocks {
            inner
        } else {
            (inner * b / blocks) / COL_ALIGN * COL_ALIGN
        }
    };
    par_blocks(par, outer * blocks, len * inner / blocks, &|items| {
        for item in items {
            let (o, b) = (item / blocks, item % blocks);
            let (c0, c1) = (bound(b), bound(b + 1));
            let row = |j: usize| {
                let at = (o * len + j) * inner;
                at + c0..at + c1
            };
            let mut prev: Option<usize> = None;
            for k in 0..len {
                let j = if s.reverse { len - 1 - k } else { k };
                // SAFETY: element (o, j, c0..c1) belongs to this item alone: items are
                // distinct (outer slice, column block) pairs, handed out once each.
                let cur = unsafe { out.part(row(j)) };
                match prev {
                    None if s.exclusive => cur.fill(identity),
                    None => {
                        for (c, &v) in cur.iter_mut().zip(&x[row(j)]) {
                            *c = op(identity, v);
                        }
                    }
                    Some(p) => {
                        // SAFETY: row `p` of this item's block, a different row than
                        // `cur`'s (so the two parts do not overlap), read only.
                        let acc: &[T] = unsafe { out.part(row(p)) };
                        let xs = &x[row(if s.exclusive { p } else { j })];
                        for ((c, &a), &v) in cur.iter_mut().zip(acc).zip(xs) {
                            *c = op(a, v);
                        }
                    }
                }
                prev = Some(j);
            }
        }
    });
}

/// One contiguous lane (`inner == 1`).
#[inline(always)]
fn lane<T: CumElem, F: Fn(T, T) -> T>(
    x: &[T],
    y: &mut [T],
    identity: T,
    op: F,
    exclusive: bool,
    reverse: bool,
) {
    let mut acc = identity;
    let mut step = |xv: &T, yv: &mut T| {
        if exclusive {
            *yv = acc;
            acc = op(acc, *xv);
        } else {
            acc = op(acc, *xv);
            *yv = acc;
        }
    };
    if reverse {
        x.iter()
            .zip(y.iter_mut())
            .rev()
            .for_each(|(a, b)| step(a, b));
    } else {
        x.iter().zip(y.iter_mut()).for_each(|(a, b)| step(a, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScopedThreads, Sequential};

    fn run<T: CumElem>(x: &[T], dims: &[usize], axis: usize, flags: (bool, bool, bool)) -> Vec<T> {
        let (prod, exclusive, reverse) = flags;
        let s = Cumulative::around(dims, axis, prod, exclusive, reverse);
        let mut y = vec![T::ZERO; x.len()];
        cumulative(x, &mut y, &s, &Sequential).unwrap();
        y
    }

    /// Sum, not exclusive, not reverse.
    const SUM: (bool, bool, bool) = (false, false, false);

    #[test]
    fn the_four_flavours_of_a_sum_over_one_lane() {
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(run(&x, &[5], 0, SUM), [1.0, 3.0, 6.0, 10.0, 15.0]);
        assert_eq!(
            run(&x, &[5], 0, (false, true, false)),
            [0.0, 1.0, 3.0, 6.0, 10.0]
        );
        assert_eq!(
            run(&x, &[5], 0, (false, false, true)),
            [15.0, 14.0, 12.0, 9.0, 5.0]
        );
        assert_eq!(
            run(&x, &[5], 0, (false, true, true)),
            [14.0, 12.0, 9.0, 5.0, 0.0]
        );
    }

    #[test]
    fn the_four_flavours_of_a_sum_over_rows() {
        // [3, 2], axis 0: inner 2, rows scanned as wholes.
        let x = [1i64, 10, 2, 20, 3, 30];
        assert_eq!(run(&x, &[3, 2], 0, SUM), [1, 10, 3, 30, 6, 60]);
        assert_eq!(
            run(&x, &[3, 2], 0, (false, true, false)),
            [0, 0, 1, 10, 3, 30]
        );
        assert_eq!(
            run(&x, &[3, 2], 0, (false, false, true)),
            [6, 60, 5, 50, 3, 30]
        );
        assert_eq!(
            run(&x, &[3, 2], 0, (false, true, true)),
            [5, 50, 3, 30, 0, 0]
        );
    }

    #[test]
    fn the_axis_first_middle_and_last_of_a_rank_3_tensor() {
        // [2, 2, 2] = 1..=8.
        let x: Vec<i32> = (1..=8).collect();
        assert_eq!(run(&x, &[2, 2, 2], 0, SUM), [1, 2, 3, 4, 6, 8, 10, 12]);
        assert_eq!(run(&x, &[2, 2, 2], 1, SUM), [1, 2, 4, 6, 5, 6, 12, 14]);
        assert_eq!(run(&x, &[2, 2, 2], 2, SUM), [1, 3, 3, 7, 5, 11, 7, 15]);
        assert_eq!(
            run(&x, &[2, 2, 2], 1, (false, true, true)),
            [3, 4, 0, 0, 7, 8, 0, 0]
        );
    }

    #[test]
    fn products_start_from_one() {
        let x = [2.0f64, 3.0, 4.0];
        assert_eq!(run(&x, &[3], 0, (true, false, false)), [2.0, 6.0, 24.0]);
        assert_eq!(run(&x, &[3], 0, (true, true, false)), [1.0, 2.0, 6.0]);
        assert_eq!(run(&x, &[3], 0, (true, false, true)), [24.0, 12.0, 4.0]);
        assert_eq!(run(&x, &[3], 0, (true, true, true)), [12.0, 4.0, 1.0]);
        let x = [2i32, 3, 4, 5];
        assert_eq!(run(&x, &[2, 2], 0, (true, false, false)), [2, 3, 8, 15]);
    }

    #[test]
    fn integers_wrap() {
        let x = [i32::MAX, 1, 1];
        assert_eq!(run(&x, &[3], 0, SUM), [i32::MAX, i32::MIN, i32::MIN + 1]);
    }

    #[test]
    fn an_empty_axis_or_dim_writes_nothing() {
        let x: [f32; 0] = [];
        assert!(run(&x, &[2, 0, 3], 1, SUM).is_empty());
        assert!(run(&x, &[0, 4], 1, SUM).is_empty());
        let s = Cumulative::around(&[2, 3], 1, false, false, false);
        let mut y = [0f32; 5];
        assert!(cumulative(&[0f32; 6], &mut y, &s, &Sequential).is_err());
    }

    /// The naive scan every flavour and split is held to.
    fn naive(x: &[f32], s: &Cumulative) -> Vec<f32> {
        let mut y = vec![0f32; x.len()];
        for o in 0..s.outer {
            for i in 0..s.inner {
                let mut acc = if s.prod { 1.0 } else { 0.0 };
                for k in 0..s.len {
                    let j = if s.reverse { s.len - 1 - k } else { k };
                    let at = (o * s.len + j) * s.inner + i;
                    let before = acc;
                    acc = if s.prod { acc * x[at] } else { acc + x[at] };
                    y[at] = if s.exclusive { before } else { acc };
                }
            }
        }
        y
    }

    #[test]
    fn threaded_splits_match_the_naive_scan_bitwise() {
        for dims in [
            [1usize, 64, 56 * 56],
            [3, 5, 1000],
            [2, 7, 33],
            [300, 100, 1],
        ] {
            let n: usize = dims.iter().product();
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 49.0)
                .collect();
            for flags in 0..8 {
                let s = Cumulative {
                    outer: dims[0],
                    len: dims[1],
                    inner: dims[2],
                    prod: flags & 1 != 0,
                    exclusive: flags & 2 != 0,
                    reverse: flags & 4 != 0,
                };
                let mut y = vec![f32::NAN; n];
                cumulative(&x, &mut y, &s, &ScopedThreads::new(4)).unwrap();
                let want = naive(&x, &s);
                assert!(
                    y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{s:?}"
                );
            }
        }
    }
}
