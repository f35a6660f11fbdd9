//! Operands and results of a native kernel: typed slices over borrowed bytes.
//!
//! Binding views start 64-byte aligned (plus planner offsets that keep element alignment)
//! and weights sit page-aligned in the artifact's map, so casting in place nearly always
//! works. A misaligned operand (e.g. a weight inside an in-memory ONNX protobuf) is copied
//! once into an owned vector and counted ([`super::Stats::misaligned_copies`]); a misaligned
//! result makes the dispatch fall back to the reference path.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use rafter_ir::DType;

use super::Stats;

/// Plain little-endian element types: every bit pattern is a valid value.
pub(crate) trait Plain: Copy + 'static {
    fn from_le(bytes: &[u8]) -> Self;
}

impl Plain for f32 {
    fn from_le(bytes: &[u8]) -> f32 {
        f32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }
}

impl Plain for u16 {
    fn from_le(bytes: &[u8]) -> u16 {
        u16::from_le_bytes(bytes.try_into().expect("2 bytes"))
    }
}

impl Plain for i64 {
    fn from_le(bytes: &[u8]) -> i64 {
        i64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
}

impl Plain for f64 {
    fn from_le(bytes: &[u8]) -> f64 {
        f64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
}

impl Plain for i32 {
    fn from_le(bytes: &[u8]) -> i32 {
        i32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }
}

impl Plain for half::f16 {
    fn from_le(bytes: &[u8]) -> half::f16 {
        half::f16::from_le_bytes(bytes.try_into().expect("2 bytes"))
    }
}

/// The elements of an f16 operand: borrowed when aligned (nearly always, see the module
/// docs), else copied.
pub(crate) fn f16s(bytes: &[u8]) -> Cow<'_, [half::f16]> {
    match cast::<half::f16>(bytes) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(bytes.chunks_exact(2).map(half::f16::from_le).collect()),
    }
}

/// An f16 result's elements in place, if aligned.
pub(crate) fn f16s_mut(bytes: &mut [u8]) -> Option<&mut [half::f16]> {
    cast_mut::<half::f16>(bytes)
}

/// The elements of an operand of any [`Plain`] type: borrowed when aligned, else copied.
pub(crate) fn elems<T: Plain>(bytes: &[u8]) -> Cow<'_, [T]> {
    match cast::<T>(bytes) {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(T::from_le)
                .collect(),
        ),
    }
}

/// A result's elements of any [`Plain`] type in place, if aligned.
pub(crate) fn elems_mut<T: Plain>(bytes: &mut [u8]) -> Option<&mut [T]> {
    cast_mut::<T>(bytes)
}

/// `bytes` as a slice of `T` in place, if aligned and a whole number of `T`s.
fn cast<T: Plain>(bytes: &[u8]) -> Option<&[T]> {
    // SAFETY: `T: Plain` is f32, f64, i32, i64, u16 or f16: no padding, every bit pattern valid; `align_to`
    // yields only the correctly aligned middle, and we accept it only when it is all of
    // `bytes`. The result borrows `bytes`, so the memory outlives it and is not written
    // meanwhile. (The crate is little-endian only, like `rafter-kernels-cpu`.)
    let (head, body, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(body)
}

/// `bytes` as a mutable slice of `T` in place, if aligned and a whole number of `T`s.
fn cast_mut<T: Plain>(bytes: &mut [u8]) -> Option<&mut [T]> {
    // SAFETY: as in `cast`; the mutable borrow of `bytes` is moved into the result.
    let (head, body, tail) = unsafe { bytes.align_to_mut::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(body)
}

/// `bytes` as `T`s: borrowed when aligned, else copied (and counted).
fn cast_or_copy<'a, T: Plain>(bytes: &'a [u8], stats: &Stats) -> Cow<'a, [T]> {
    match cast::<T>(bytes) {
        Some(s) => Cow::Borrowed(s),
        None => {
            stats.misaligned_copies.fetch_add(1, Ordering::Relaxed);
            Cow::Owned(
                bytes
                    .chunks_exact(std::mem::size_of::<T>())
                    .map(T::from_le)
                    .collect(),
            )
        }
    }
}

/// The bytes of `v`.
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: viewing initialised f32s as bytes: u8 has no alignment or validity requirement,
    // the length is exactly the f32s' size, and the view borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Bytes of a tensor of `dtype` with `dims`, or `None` on overflow.
pub(crate) fn byte_len(dtype: DType, dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
}

enum Data<'a> {
    F32(Cow<'a, [f32]>),
    I64(Cow<'a, [i64]>),
    /// f16 or bf16 bit patterns (16-bit weights, widened by the kernels).
    U16(Cow<'a, [u16]>),
    Other,
}

/// One operand: its dims (evaluated for this call), bytes, and typed elements.
pub(crate) struct In<'a> {
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
    /// The program weight this operand is, if it is one: the same bytes on every call, so
    /// a kernel may cache something derived from them (a transformed filter).
    pub(crate) weight: Option<usize>,
    bytes: &'a [u8],
    data: Data<'a>,
}

impl<'a> In<'a> {
    /// Checks that `bytes` hold exactly a `dtype` tensor of `dims`.
    pub(crate) fn new(
        dtype: DType,
        dims: Vec<usize>,
        bytes: &'a [u8],
        stats: &Stats,
    ) -> Result<In<'a>, String> {
        let want = byte_len(dtype, &dims).ok_or("size overflows")?;
        if bytes.len() != want {
            return Err(format!(
                "{} bytes, but {dtype} {dims:?} needs {want}",
                bytes.len()
            ));
        }
        let data = match dtype {
            DType::F32 => Data::F32(cast_or_copy(bytes, stats)),
            DType::I64 => Data::I64(cast_or_copy(bytes, stats)),
            DType::F16 | DType::BF16 => Data::U16(cast_or_copy(bytes, stats)),
            _ => Data::Other,
        };
        Ok(In {
            dims,
            dtype,
            weight: None,
            bytes,
            data,
        })
    }

    /// An f32 operand held as elements (a host slot's tensor).
    pub(crate) fn from_f32s(dims: Vec<usize>, data: &'a [f32]) -> In<'a> {
        In {
            dims,
            dtype: DType::F32,
            weight: None,
            bytes: f32_bytes(data),
            data: Data::F32(Cow::Borrowed(data)),
        }
    }

    /// Marks the operand as program weight `w` (see [`In::weight`]).
    pub(crate) fn of_weight(mut self, w: Option<usize>) -> In<'a> {
        self.weight = w;
        self
    }

    /// The elements of an f32 operand.
    pub(crate) fn f32s(&self) -> Result<&[f32], String> {
        match &self.data {
            Data::F32(v) => Ok(v),
            _ => Err(format!("expected an f32 operand, got {}", self.dtype)),
        }
    }

    /// The elements of an i64 operand.
    pub(crate) fn i64s(&self) -> Result<&[i64], String> {
        match &self.data {
            Data::I64(v) => Ok(v),
            _ => Err(format!("expected an i64 operand, got {}", self.dtype)),
        }
    }

    /// The bit patterns of an f16 or bf16 operand.
    pub(crate) fn u16s(&self) -> Result<&[u16], String> {
        match &self.data {
            Data::U16(v) => Ok(v),
            _ => Err(format!(
                "expected an f16 or bf16 operand, got {}",
                self.dtype
            )),
        }
    }

    /// The raw little-endian bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.dims.iter().product()
    }
}

/// One result: its dims and the bytes of its binding, written in place.
pub(crate) struct Out<'a> {
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
    bytes: &'a mut [u8],
}

impl<'a> Out<'a> {
    /// `None` when the bytes are not aligned for `dtype` (the caller falls back).
    pub(crate) fn new(dtype: DType, dims: Vec<usize>, bytes: &'a mut [u8]) -> Option<Out<'a>> {
        let aligned = match dtype {
            DType::F32 => cast_mut::<f32>(bytes).is_some(),
            DType::I64 => cast_mut::<i64>(bytes).is_some(),
            _ => true,
        };
        aligned.then_some(Out { dims, dtype, bytes })
    }

    /// An f32 result computed into `data` (a host slot's future tensor).
    pub(crate) fn from_f32s(dims: Vec<usize>, data: &'a mut [f32]) -> Out<'a> {
        // SAFETY: viewing initialised f32s as bytes: u8 has no alignment or validity
        // requirement and the length is exactly the f32s' size; the mutable borrow of `data`
        // moves into the view, so nothing else reaches the memory while it lives.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                data.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(data),
            )
        };
        Out {
            dims,
            dtype: DType::F32,
            bytes,
        }
    }

    /// The elements of an f32 result.
    pub(crate) fn f32s(&mut self) -> Result<&mut [f32], String> {
        if self.dtype != DType::F32 {
            return Err(format!("expected an f32 result, got {}", self.dtype));
        }
        cast_mut::<f32>(self.bytes).ok_or_else(|| "result bytes are misaligned".to_string())
    }

    /// The raw bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Operands over owned bytes, for the kernels' unit tests.
    use super::*;

    /// Little-endian bytes of `v`.
    pub(crate) fn le(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    pub(crate) fn input<'a>(dims: &[usize], bytes: &'a [u8], stats: &Stats) -> In<'a> {
        In::new(DType::F32, dims.to_vec(), bytes, stats).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_lengths_are_errors_and_misaligned_operands_are_copied() {
        let stats = Stats::default();
        let v: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let mut bytes = vec![0u8];
        bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        // Offset 1 of a Vec<u8> with at least one of 0..4 offsets misaligned: try both.
        for off in [0usize, 1] {
            let slice = &bytes[off..off + 32];
            let aligned = (slice.as_ptr() as usize) % 4 == 0;
            let before = stats.misaligned_copies.load(Ordering::Relaxed);
            let x = In::new(DType::F32, vec![2, 4], slice, &stats).unwrap();
            let after = stats.misaligned_copies.load(Ordering::Relaxed);
            assert_eq!(after - before, u64::from(!aligned));
            let want: Vec<f32> = slice
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(x.f32s().unwrap(), &want[..]);
        }
        let e = In::new(DType::F32, vec![3, 4], &bytes[..32], &stats)
            .err()
            .unwrap();
        assert!(e.contains("32 bytes, but f32 [3, 4] needs 48"), "{e}");
        let x = In::new(DType::I64, vec![4], &bytes[1..33], &stats).unwrap();
        assert!(x.f32s().unwrap_err().contains("expected an f32"));
        assert_eq!(x.i64s().unwrap().len(), 4);
    }
}
