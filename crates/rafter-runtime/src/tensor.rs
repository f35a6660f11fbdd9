//! The runtime's tensor: a dtype, dims and little-endian element bytes.
//!
//! What a caller passes to [`Session::submit`](crate::Session::submit) and gets back from
//! [`CallHandle::wait`](crate::CallHandle::wait). It is deliberately plain: no strides, no
//! views, no arithmetic. The bytes are the device ABI's (packed, row-major, little-endian),
//! so an input is written into device memory as it is and an output read back as it is,
//! and a CPU kernel reads a tensor's elements in place ([`Tensor::as_slice`]). The storage
//! is 8-byte aligned, enough for every element type, so typed views never copy.
//!
//! Why not the reference executor's `Tensor` (one `ndarray` per dtype): the runtime must
//! not depend on the reference executor (a deployed runtime links no interpreter), and a
//! byte-level tensor also holds element types that have no Rust type of their own (block-
//! quantized weights, later).

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};
use rafter_ir::DType;

use crate::borrowed::Borrowed;

/// Why a tensor could not be built or viewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// The bytes (or elements) do not match the dims.
    #[error("{dtype} tensor of shape {dims:?} needs {expected} bytes, got {actual}")]
    Size {
        /// The element type.
        dtype: DType,
        /// The dims.
        dims: Vec<usize>,
        /// The bytes the dims need.
        expected: usize,
        /// The bytes given.
        actual: usize,
    },
    /// The dims' element count overflows.
    #[error("{dtype} tensor of shape {dims:?}: size overflows")]
    Overflow {
        /// The element type.
        dtype: DType,
        /// The dims.
        dims: Vec<usize>,
    },
    /// A typed view of another dtype.
    #[error("tensor is {actual}, not {wanted}")]
    DType {
        /// The view's element type.
        wanted: DType,
        /// The tensor's.
        actual: DType,
    },
}

/// Element types with a Rust representation: plain little-endian values, every bit
/// pattern valid (`bool` only after the tensor normalised its bytes to 0 or 1).
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The IR dtype of this element type.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(
            impl sealed::Sealed for $t {}
            impl Element for $t {
                const DTYPE: DType = DType::$d;
            }
        )*
    };
}

element!(
    f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i16 => I16,
    u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64, bool => Bool,
);

/// A dense, row-major tensor of one dtype, its elements stored little-endian.
///
/// Its bytes are its own, or a caller's memory it borrows ([`Tensor::borrowed`], see
/// [`crate::borrowed`]): read in place, copied on the first write.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    dims: Vec<usize>,
    storage: Storage,
    len: usize,
}

/// Where a tensor's bytes are.
#[derive(Clone)]
pub(crate) enum Storage {
    /// In the first `len` bytes of these words (8-byte aligned storage).
    Owned(Vec<u64>),
    /// In a caller's memory, aligned for the dtype (checked when it was borrowed).
    Borrowed(Arc<Borrowed>),
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.dtype == other.dtype && self.dims == other.dims && self.le_bytes() == other.le_bytes()
    }
}

/// Bytes of a `dtype` tensor of `dims`, or `None` on overflow.
fn byte_len(dtype: DType, dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
}

impl Tensor {
    /// A tensor of zeros (for `bool`, false).
    pub fn zeros(dtype: DType, dims: &[usize]) -> Result<Tensor, TensorError> {
        let len = byte_len(dtype, dims).ok_or_else(|| TensorError::Overflow {
            dtype,
            dims: dims.to_vec(),
        })?;
        Ok(Tensor {
            dtype,
            dims: dims.to_vec(),
            storage: Storage::Owned(vec![0u64; len.div_ceil(8)]),
            len,
        })
    }

    /// A tensor from its packed little-endian element bytes. `bool` bytes other than 0
    /// are read as true (stored as 1).
    pub fn from_le_bytes(
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<Tensor, TensorError> {
        let mut t = Tensor::zeros(dtype, dims)?;
        if bytes.len() != t.len {
            return Err(TensorError::Size {
                dtype,
                dims: dims.to_vec(),
                expected: t.len,
                actual: bytes.len(),
            });
        }
        let out = t.bytes_mut();
        if dtype == DType::Bool {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = u8::from(b != 0);
            }
        } else {
            out.copy_from_slice(bytes);
        }
        Ok(t)
    }

    /// A tensor of `dims` holding `data` (row-major).
    pub fn from_slice<T: Element>(dims: &[usize], data: &[T]) -> Result<Tensor, TensorError> {
        let mut t = Tensor::zeros(T::DTYPE, dims)?;
        let want = t.len / T::DTYPE.size_of().max(1);
        if data.len() != want {
            return Err(TensorError::Size {
                dtype: T::DTYPE,
                dims: dims.to_vec(),
                expected: t.len,
                actual: std::mem::size_of_val(data),
            });
        }
        t.as_mut_slice::<T>()?.copy_from_slice(data);
        Ok(t)
    }

    /// An f32 tensor (panics when `data` does not have the dims' element count, like
    /// indexing out of bounds: for tests and literals).
    pub fn f32s(dims: &[usize], data: Vec<f32>) -> Tensor {
        Tensor::from_slice(dims, &data).expect("f32s: element count matches the dims")
    }

    /// An i64 tensor (panics like [`Tensor::f32s`]).
    pub fn i64s(dims: &[usize], data: Vec<i64>) -> Tensor {
        Tensor::from_slice(dims, &data).expect("i64s: element count matches the dims")
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dims, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.dims
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A tensor over `storage`, which holds `len` bytes for `dtype` and `dims`.
    pub(crate) fn from_storage(
        dtype: DType,
        dims: &[usize],
        storage: Storage,
        len: usize,
    ) -> Tensor {
        Tensor {
            dtype,
            dims: dims.to_vec(),
            storage,
            len,
        }
    }

    /// The packed little-endian element bytes.
    pub fn le_bytes(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: `words` holds at least `len` initialised bytes (`zeros` sized it to
            // `len.div_ceil(8)` words); u8 has no alignment or validity requirement, and
            // the view borrows `self`.
            Storage::Owned(words) => unsafe {
                std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), self.len)
            },
            Storage::Borrowed(b) => b.bytes(),
        }
    }

    /// Whether the bytes are a caller's memory, read in place ([`Tensor::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.storage, Storage::Borrowed(_))
    }

    /// The owned words, copying borrowed bytes first (a caller's memory is never written).
    fn words_mut(&mut self) -> &mut Vec<u64> {
        if let Storage::Borrowed(b) = &self.storage {
            let mut words = vec![0u64; self.len.div_ceil(8)];
            // SAFETY: `words` has room for `len` bytes; u8 has no alignment requirement.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), self.len)
            };
            dst.copy_from_slice(b.bytes());
            self.storage = Storage::Owned(words);
        }
        match &mut self.storage {
            Storage::Owned(words) => words,
            Storage::Borrowed(_) => unreachable!("made owned above"),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let words = self.words_mut();
        // SAFETY: as in `le_bytes`, with the mutable borrow of `self` moved into the view.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
    }

    /// The elements as `T`s, in place; an error when the dtype is not `T`'s.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        self.typed::<T>()?;
        // SAFETY: owned storage is 8-byte aligned (a `Vec<u64>`), which satisfies every
        // `Element`'s alignment, and borrowed storage is aligned to the dtype's size, which
        // is `T`'s alignment (`Tensor::borrowed` checks it); `len` is a whole number of `T`s
        // (`typed` checked the dtype, and `len` is its size times the element count); every
        // bit pattern is a valid `T` (bool bytes are kept 0 or 1 by every constructor and by
        // `as_mut_slice`'s type, and bools are never borrowed); the view borrows `self`.
        Ok(unsafe {
            std::slice::from_raw_parts(
                self.le_bytes().as_ptr().cast::<T>(),
                self.len / std::mem::size_of::<T>(),
            )
        })
    }

    /// The elements as mutable `T`s, in place (a kernel computing into a fresh tensor).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        self.typed::<T>()?;
        let len = self.len;
        let words = self.words_mut();
        // SAFETY: as in `as_slice` for owned storage (`words_mut` made it owned), with the
        // mutable borrow of `self` moved into the view; writes through it store valid `T`s,
        // so bool bytes stay 0 or 1.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(
                words.as_mut_ptr().cast::<T>(),
                len / std::mem::size_of::<T>(),
            )
        })
    }

    fn typed<T: Element>(&self) -> Result<(), TensorError> {
        if self.dtype == T::DTYPE {
            Ok(())
        } else {
            Err(TensorError::DType {
                wanted: T::DTYPE,
                actual: self.dtype,
            })
        }
    }

    /// Every element as an `f64` (integers and bools converted; for summaries and
    /// comparisons, not for speed).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        fn all<T: Element>(t: &Tensor, f: impl Fn(T) -> f64) -> Vec<f64> {
            t.as_slice::<T>()
                .expect("dtype checked by the caller")
                .iter()
                .map(|&x| f(x))
                .collect()
        }
        match self.dtype {
            DType::F32 => all(self, |x: f32| x as f64),
            DType::F64 => all(self, |x: f64| x),
            DType::F16 => all(self, |x: f16| x.to_f64()),
            DType::BF16 => all(self, |x: bf16| x.to_f64()),
            DType::I8 => all(self, |x: i8| x as f64),
            DType::U8 => all(self, |x: u8| x as f64),
            DType::I16 => all(self, |x: i16| x as f64),
            DType::U16 => all(self, |x: u16| x as f64),
            DType::I32 => all(self, |x: i32| x as f64),
            DType::U32 => all(self, |x: u32| x as f64),
            DType::I64 => all(self, |x: i64| x as f64),
            DType::U64 => all(self, |x: u64| x as f64),
            DType::Bool => all(self, |x: bool| f64::from(u8::from(x))),
        }
    }
}

impl rafter_ir::Shaped for Tensor {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.dims
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        let values = self.to_f64_vec();
        write!(f, "Tensor({} {:?}, ", self.dtype, self.dims)?;
        let mut list = f.debug_list();
        list.entries(values.iter().take(SHOWN));
        if values.len() > SHOWN {
            list.entry(&format_args!("... {} more", values.len() - SHOWN));
        }
        list.finish()?;
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_typed_views_are_in_place() {
        let t = Tensor::f32s(&[2, 3], vec![1.0, -2.5, 3.0, 0.0, 5.5, -6.0]);
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.len(), 6);
        let back = Tensor::from_le_bytes(DType::F32, &[2, 3], t.le_bytes()).unwrap();
        assert_eq!(back, t);
        assert_eq!(t.as_slice::<f32>().unwrap()[1], -2.5);
        assert_eq!(t.as_slice::<f32>().unwrap().as_ptr() as usize % 8, 0);
        assert!(matches!(
            t.as_slice::<i64>(),
            Err(TensorError::DType { .. })
        ));
        let i = Tensor::i64s(&[3], vec![1, -2, i64::MAX]);
        assert_eq!(i.to_f64_vec()[1], -2.0);
        // An odd byte count (3 x u8) keeps its exact length.
        let u = Tensor::from_le_bytes(DType::U8, &[3], &[7, 8, 9]).unwrap();
        assert_eq!(u.le_bytes(), &[7, 8, 9]);
    }

    #[test]
    fn sizes_are_checked_and_bools_normalised() {
        let e = Tensor::from_le_bytes(DType::F32, &[2], &[0; 7]).unwrap_err();
        assert!(e.to_string().contains("needs 8 bytes, got 7"), "{e}");
        assert!(Tensor::from_slice(&[3], &[1.0f32, 2.0]).is_err());
        assert!(matches!(
            Tensor::zeros(DType::F64, &[usize::MAX, 2]),
            Err(TensorError::Overflow { .. })
        ));
        let b = Tensor::from_le_bytes(DType::Bool, &[3], &[0, 2, 255]).unwrap();
        assert_eq!(b.as_slice::<bool>().unwrap(), &[false, true, true]);
        assert_eq!(b.le_bytes(), &[0, 1, 1]);
        let z = Tensor::zeros(DType::F16, &[0, 4]).unwrap();
        assert!(z.is_empty() && z.le_bytes().is_empty());
    }
}
