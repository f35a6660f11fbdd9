//! 64-byte-aligned f32 storage without `unsafe`: a `Vec` with up to 15 floats of slack and
//! an offset. Cache-line alignment keeps every 16-float panel row inside one line, so the
//! kernels' vector loads never split lines.

use std::cell::RefCell;
use std::thread::LocalKey;

const ALIGN_FLOATS: usize = 16; // 64 bytes

/// `prefix + len` floats whose element `prefix` (the payload's start) is 64-byte aligned.
#[derive(Clone)]
pub(crate) struct Aligned {
    v: Vec<f32>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for Aligned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aligned({} floats)", self.len)
    }
}

impl Aligned {
    /// Zero-filled.
    pub(crate) fn new(prefix: usize, len: usize) -> Aligned {
        let total = prefix + len;
        let v = vec![0.0f32; total + ALIGN_FLOATS - 1];
        // A Vec<f32> is 4-byte aligned, so addresses are in whole floats.
        let addr_floats = v.as_ptr() as usize / 4;
        let start = (ALIGN_FLOATS - (addr_floats + prefix) % ALIGN_FLOATS) % ALIGN_FLOATS;
        Aligned {
            v,
            start,
            len: total,
        }
    }

    /// Prefix and payload.
    pub(crate) fn as_slice(&self) -> &[f32] {
        &self.v[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.v[self.start..self.start + self.len]
    }

    fn capacity_floats(&self) -> usize {
        self.v.len() - (ALIGN_FLOATS - 1)
    }

    /// Makes the payload at least `len` floats (no prefix), keeping its contents; new
    /// floats are zero. Grows to exactly `len`: a reused buffer settles at the largest
    /// request it sees and holds no slack (a block's scratch is ~200 KB a thread).
    pub(crate) fn grow(&mut self, len: usize) {
        if self.len >= len {
            return;
        }
        if self.capacity_floats() < len {
            let mut bigger = Aligned::new(0, len);
            bigger.as_mut_slice()[..self.len].copy_from_slice(self.as_slice());
            *self = bigger;
        } else {
            self.len = len;
        }
    }
}

thread_local! {
    /// Per-thread packing buffers, reused across calls so a GEMM allocates nothing in steady
    /// state, whichever pool thread runs its tasks.
    static SCRATCH: ScratchPair = RefCell::new((Aligned::new(0, 0), Aligned::new(0, 0)));
}

/// A thread's own pair of aligned buffers, reused across calls (see [`with_pair`]).
pub(crate) type ScratchPair = RefCell<(Aligned, Aligned)>;

/// Runs `f` on the thread's pair of buffers in `key`, or on a fresh (empty) pair if this
/// thread already holds them further up its stack (re-entrancy), so a kernel's scratch
/// allocates nothing in steady state whichever pool thread runs it.
pub(crate) fn with_pair<R>(
    key: &'static LocalKey<ScratchPair>,
    f: impl FnOnce(&mut (Aligned, Aligned)) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut pair) => f(&mut pair),
        Err(_) => f(&mut (Aligned::new(0, 0), Aligned::new(0, 0))),
    })
}

/// Runs `f` with two aligned scratch buffers of at least `len_a` and `len_b` floats (contents
/// unspecified): the GEMM's packing buffers. Falls back to fresh buffers if the thread's
/// are in use (re-entrancy).
pub(crate) fn with_scratch<R>(
    len_a: usize,
    len_b: usize,
    f: impl FnOnce(&mut [f32], &mut [f32]) -> R,
) -> R {
    let mut f = Some(f);
    let done = SCRATCH.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok()?;
        let (a, b) = &mut *guard;
        if a.capacity_floats() < len_a {
            *a = Aligned::new(0, len_a);
        }
        if b.capacity_floats() < len_b {
            *b = Aligned::new(0, len_b);
        }
        let f = f.take()?;
        Some(f(
            &mut a.as_mut_slice()[..len_a],
            &mut b.as_mut_slice()[..len_b],
        ))
    });
    match done {
        Some(r) => r,
        None => {
            let (mut a, mut b) = (Aligned::new(0, len_a), Aligned::new(0, len_b));
            let f = f.take().expect("scratch closure already ran");
            f(a.as_mut_slice(), b.as_mut_slice())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned(a: &Aligned) -> bool {
        (a.as_slice().as_ptr() as usize).is_multiple_of(64)
    }

    #[test]
    fn grow_keeps_the_contents_and_the_alignment() {
        let mut a = Aligned::new(0, 3);
        a.as_mut_slice().copy_from_slice(&[1.0, 2.0, 3.0]);
        for len in [2, 3, 5, 6, 1000, 999] {
            a.grow(len);
            assert!(a.as_slice().len() >= len, "grow({len})");
            assert!(aligned(&a), "grow({len}) left the payload misaligned");
            assert_eq!(&a.as_slice()[..3], &[1.0, 2.0, 3.0], "grow({len})");
        }
        // Floats a grow added are zero.
        assert!(a.as_slice()[3..].iter().all(|&x| x == 0.0));
    }

    thread_local! {
        static PAIR: ScratchPair = RefCell::new((Aligned::new(0, 0), Aligned::new(0, 0)));
    }

    #[test]
    fn a_pair_held_up_the_stack_is_not_handed_out_again() {
        with_pair(&PAIR, |(a, _)| {
            a.grow(4);
            a.as_mut_slice().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
            // Re-entered: a fresh, empty pair, not the one this frame holds.
            with_pair(&PAIR, |(inner, _)| {
                assert!(inner.as_slice().is_empty());
                inner.grow(4);
                inner.as_mut_slice().fill(9.0);
            });
            assert_eq!(a.as_slice(), &[1.0, 2.0, 3.0, 4.0]);
        });
        // Released: the thread's own pair again, contents kept.
        with_pair(&PAIR, |(a, _)| {
            assert_eq!(a.as_slice(), &[1.0, 2.0, 3.0, 4.0])
        });
    }

    #[test]
    fn new_is_aligned_after_the_prefix() {
        for prefix in [0, 1, 8, 15, 16, 17] {
            let a = Aligned::new(prefix, 40);
            let at = a.as_slice()[prefix..].as_ptr() as usize;
            assert!(at.is_multiple_of(64), "prefix {prefix}");
            assert_eq!(a.as_slice().len(), prefix + 40);
        }
    }
}
