//! Inputs that borrow the caller's memory instead of being copied into the runtime.
//!
//! A caller that already holds an input in the runtime's layout (packed, row-major,
//! little-endian: a C-contiguous numpy array, a contiguous torch CPU tensor) can hand the
//! session a [`Tensor::borrowed`] over that memory. The tensor keeps the memory's *owner*
//! (for the Python package, the DLPack capsule that keeps the array alive) for as long as
//! the tensor lives, and a call keeps its input tensors until its work has completed (the
//! session's host slot table holds them, see [`crate::host`]), so the memory cannot be
//! freed while a kernel may still read it, even when the caller drops the call's handle.
//!
//! What happens to a borrowed input depends on where the session put it
//! ([`Session::input_in_place`](crate::Session::input_in_place)): an input that only CPU
//! kernels read is bound in place (its kernels read the caller's bytes, no copy at all);
//! any other input is written once into the call's input buffer, as an owned tensor is
//! (for a GPU, that write is the upload). Nothing ever writes a caller's memory: a tensor
//! copies borrowed bytes before its first write ([`Tensor::as_mut_slice`]).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use rafter_ir::DType;

use crate::tensor::Storage;
use crate::{Tensor, TensorError};

/// A caller's bytes and what keeps them alive.
pub struct Borrowed {
    ptr: *const u8,
    len: usize,
    /// Dropped (releasing the memory) only after the last tensor over it.
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: `Borrowed` only reads its bytes, and `Tensor::borrowed`'s contract makes them
// valid and unwritten while `_owner` lives, from any thread; the owner itself is Send + Sync.
unsafe impl Send for Borrowed {}
// SAFETY: as for Send: shared access only ever reads.
unsafe impl Sync for Borrowed {}

impl Borrowed {
    /// The borrowed bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `Tensor::borrowed`'s contract: `ptr` points at `len` readable bytes that
        // stay valid and unwritten while `_owner` (a field of `self`) lives; the view
        // borrows `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Why memory could not be borrowed; the caller copies it instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BorrowError {
    /// The byte count does not match the dims, or the dims overflow.
    #[error(transparent)]
    Size(#[from] TensorError),
    /// The address is not a multiple of the element size.
    #[error("{dtype} data at {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The element type.
        dtype: DType,
        /// The data's address.
        addr: usize,
        /// The alignment it needs.
        align: usize,
    },
    /// Bool bytes must be 0 or 1, which foreign memory does not promise.
    #[error("bool tensors are not borrowed (their bytes must be normalised to 0 or 1)")]
    Bool,
}

impl Tensor {
    /// A tensor over `len` bytes of caller memory at `ptr`, read in place; `owner` is
    /// dropped after the last tensor (or clone) over it, which releases the memory.
    ///
    /// Refused (so the caller copies) for a size that does not match `dims`, an address
    /// not aligned to the element size, or `bool` elements.
    ///
    /// # Safety
    /// Unless `len` is 0, `ptr` must point at `len` readable bytes holding the elements
    /// (packed, row-major, little-endian) that stay valid, and that nobody writes, for as
    /// long as `owner` lives.
    pub unsafe fn borrowed(
        dtype: DType,
        dims: &[usize],
        ptr: *const u8,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Tensor, BorrowError> {
        if dtype == DType::Bool {
            return Err(BorrowError::Bool);
        }
        let expected = dims
            .iter()
            .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| TensorError::Overflow {
                dtype,
                dims: dims.to_vec(),
            })?;
        if expected != len {
            return Err(BorrowError::Size(TensorError::Size {
                dtype,
                dims: dims.to_vec(),
                expected,
                actual: len,
            }));
        }
        let align = dtype.size_of().max(1);
        if len > 0 && (ptr as usize) % align != 0 {
            return Err(BorrowError::Misaligned {
                dtype,
                addr: ptr as usize,
                align,
            });
        }
        let storage = Storage::Borrowed(Arc::new(Borrowed {
            ptr,
            len,
            _owner: owner,
        }));
        Ok(Tensor::from_storage(dtype, dims, storage, len))
    }
}

impl fmt::Debug for Borrowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Borrowed({} bytes at {:p})", self.len, self.ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn borrow_f32s(data: &[f32], dims: &[usize], owner: Flag) -> Result<Tensor, BorrowError> {
        // SAFETY: `data` outlives every tensor made in these tests, and nothing writes it.
        unsafe {
            Tensor::borrowed(
                DType::F32,
                dims,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                Box::new(owner),
            )
        }
    }

    #[test]
    fn reads_in_place_and_releases_the_owner_after_the_last_clone() {
        let data = vec![1.0f32, -2.0, 3.5, 4.0, 5.0, 6.0];
        let dropped = Arc::new(AtomicBool::new(false));
        let t = borrow_f32s(&data, &[2, 3], Flag(dropped.clone())).unwrap();
        assert!(t.is_borrowed());
        assert_eq!(t.as_slice::<f32>().unwrap().as_ptr(), data.as_ptr());
        assert_eq!(t.le_bytes().as_ptr(), data.as_ptr().cast());
        assert_eq!(t, Tensor::f32s(&[2, 3], data.clone()));
        let clone = t.clone();
        drop(t);
        assert!(
            !dropped.load(Ordering::SeqCst),
            "a clone still reads the memory"
        );
        assert_eq!(clone.as_slice::<f32>().unwrap().as_ptr(), data.as_ptr());
        drop(clone);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn writes_copy_first_and_never_touch_the_callers_memory() {
        let data = vec![1.0f32, 2.0, 3.0];
        let dropped = Arc::new(AtomicBool::new(false));
        let mut t = borrow_f32s(&data, &[3], Flag(dropped.clone())).unwrap();
        t.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        assert!(!t.is_borrowed());
        assert!(
            dropped.load(Ordering::SeqCst),
            "the owned copy needs the owner no more"
        );
        assert_eq!(t.as_slice::<f32>().unwrap(), &[9.0, 2.0, 3.0]);
        assert_eq!(data, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn refuses_wrong_sizes_misalignment_and_bools() {
        let data = [0u64; 4];
        let flag = || Flag(Arc::new(AtomicBool::new(false)));
        let f = borrow_f32s(&[1.0, 2.0], &[3], flag()).unwrap_err();
        assert!(f.to_string().contains("needs 12 bytes, got 8"), "{f}");
        // SAFETY: 8 readable bytes one byte into `data`, which outlives the attempt.
        let m = unsafe {
            Tensor::borrowed(
                DType::F32,
                &[2],
                data.as_ptr().cast::<u8>().add(1),
                8,
                Box::new(flag()),
            )
        }
        .unwrap_err();
        assert!(matches!(m, BorrowError::Misaligned { align: 4, .. }), "{m}");
        // SAFETY: as above, aligned.
        let b = unsafe {
            Tensor::borrowed(DType::Bool, &[4], data.as_ptr().cast(), 4, Box::new(flag()))
        }
        .unwrap_err();
        assert_eq!(b, BorrowError::Bool);
        // An empty tensor may have a null address.
        // SAFETY: no byte is read.
        let e =
            unsafe { Tensor::borrowed(DType::F32, &[0, 3], std::ptr::null(), 0, Box::new(flag())) }
                .unwrap();
        assert!(e.is_empty() && e.le_bytes().is_empty());
    }
}
