//! What the elementwise, softmax and normalisation kernels share: their error type, the
//! row-block split over [`Parallel`], and the disjoint-output helper that lets parallel
//! tasks write their own rows.

use std::marker::PhantomData;
use std::ops::Range;

use thiserror::Error;

use crate::{Isa, Parallel};

/// The operands of a softmax, normalisation, activation or tile kernel did not fit
/// together. Each message names the operand and the sizes.
#[allow(missing_docs)]
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum KernelError {
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        what: String,
        expected: usize,
        got: usize,
    },
    #[error("{what}: {detail}")]
    Shape { what: String, detail: String },
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}

pub(crate) fn check_len(what: &str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::Length {
            what: what.to_string(),
            expected,
            got,
        })
    }
}

pub(crate) fn check_isa(isa: Isa) -> Result<(), KernelError> {
    if isa.is_available() {
        Ok(())
    } else {
        Err(KernelError::IsaUnavailable(isa))
    }
}

/// Elements below which a task is not worth handing to another thread (a persistent pool
/// wakes a worker in a few microseconds; 16K f32 elementwise take about that long).
pub(crate) const MIN_TASK_ELEMS: usize = 16 * 1024;

/// Splits `items` (rows, tiles) of `per_item` elements each into contiguous blocks and
/// runs `f(block)` for each, on `par`. At most 4 blocks per thread (load balance on a
/// shared machine) and none smaller than [`MIN_TASK_ELEMS`] unless there is only one.
pub(crate) fn par_blocks(
    par: &dyn Parallel,
    items: usize,
    per_item: usize,
    f: &(dyn Fn(Range<usize>) + Sync),
) {
    if items == 0 {
        return;
    }
    let by_size = (items.saturating_mul(per_item.max(1)) / MIN_TASK_ELEMS).max(1);
    let tasks = by_size.min(par.threads().max(1) * 4).min(items);
    if tasks <= 1 {
        return f(0..items);
    }
    par.run(tasks, &|t| f(items * t / tasks..items * (t + 1) / tasks));
}

/// A mutable slice that parallel tasks write disjoint parts of (f32 unless told).
pub(crate) struct Disjoint<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

// SAFETY: `Disjoint` hands out `&mut` sub-slices only through `part`, whose contract is
// that parts used concurrently do not overlap, so sharing it between threads is sound.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}
// SAFETY: as for `Sync`: moving it to another thread moves only the right to take parts.
unsafe impl<T: Send> Send for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        Disjoint {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: PhantomData,
        }
    }

    /// Elements `r` of the slice.
    ///
    /// # Safety
    /// No other part overlapping `r` may be alive at the same time.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, r: Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "part {r:?} of {}",
            self.len
        );
        // SAFETY: in bounds (checked above); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }

    /// A raw pointer to elements `r`, checked in bounds, for a loop that writes them
    /// through [`crate::simd::Simd::store_at`] (no `&mut` made, so parts of other tasks
    /// may interleave with `r`, as channel ranges of shared rows do).
    pub(crate) fn ptr_to(&self, r: Range<usize>) -> *mut T {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "part {r:?} of {}",
            self.len
        );
        // In bounds (checked above), so the offset stays inside the allocation.
        self.ptr.wrapping_add(r.start)
    }
}

/// The elementwise tail a direct convolution kernel fuses (the NHWC ones, the NCHW
/// depthwise one), per output element:
/// `clamp(act(alpha * conv + bias[c] (+ residual)) (+ residual))`.
#[derive(Clone, Copy, Debug)]
pub struct ChannelTail<'a> {
    /// Scale of the convolution's result.
    pub alpha: f32,
    /// Per output channel, added after the scale.
    pub bias: Option<&'a [f32]>,
    /// Of the output's shape.
    pub residual: Option<&'a [f32]>,
    /// The residual is added before the activation (else after it).
    pub res_before: bool,
    /// `max(x, 0)` as the activation (else none).
    pub relu: bool,
    /// `x.max(lo).min(hi)`, last.
    pub clamp: Option<(f32, f32)>,
}

impl Default for ChannelTail<'_> {
    /// The identity: the convolution's result as it is.
    fn default() -> Self {
        ChannelTail {
            alpha: 1.0,
            bias: None,
            residual: None,
            res_before: true,
            relu: false,
            clamp: None,
        }
    }
}

impl ChannelTail<'_> {
    /// Checks the bias against `channels` and the residual against the output's length.
    pub(crate) fn check(
        &self,
        what: &str,
        channels: usize,
        out_len: usize,
    ) -> Result<(), KernelError> {
        if let Some(b) = self.bias {
            check_len(&format!("{what} bias"), b.len(), channels)?;
        }
        if let Some(r) = self.residual {
            check_len(&format!("{what} residual"), r.len(), out_len)?;
        }
        Ok(())
    }

    /// The tail of `acc`, the sum of output element `at` of channel `channel`, in f64: the
    /// tests' reference for every kernel that takes a `ChannelTail`.
    #[cfg(test)]
    pub(crate) fn reference(&self, acc: f64, channel: usize, at: usize) -> f64 {
        let r = self.residual.map_or(0.0, |r| r[at] as f64);
        let mut v = self.alpha as f64 * acc + self.bias.map_or(0.0, |b| b[channel] as f64);
        if self.res_before {
            v += r;
        }
        if self.relu {
            v = v.max(0.0);
        }
        if !self.res_before {
            v += r;
        }
        if let Some((lo, hi)) = self.clamp {
            v = v.max(lo as f64).min(hi as f64);
        }
        v
    }
}

/// Asks for the cache lines of `xs` ahead of a read; a no-op off x86-64.
#[inline(always)]
pub(crate) fn prefetch_read(xs: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in xs.chunks(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint: it changes no state a program can observe and
        // never faults; the address lies inside `xs` anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = xs;
}

/// A portable f32 dot product in 16 independent partial sums (so the compiler vectorises
/// it without an ISA dispatch), the partial sums then the tail added last. For the
/// row-at-a-time paths (small GEMVs, reference-exact block-quantized rows) whose results
/// must not depend on the machine's ISA.
pub fn dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for ((l, a), b) in lanes.iter_mut().zip(x).zip(y) {
            *l += a * b;
        }
    }
    lanes.iter().sum::<f32>() + tail
}
