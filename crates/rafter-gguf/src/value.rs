//! Metadata values: the 13 GGUF value types, scalars, strings and (nested) arrays.
//!
//! Arrays are views into the file's bytes rather than vectors of decoded elements: a
//! tokenizer vocabulary of 260k strings costs one offset per string, not one allocation
//! per string, and a numeric array costs nothing until it is read. Elements are decoded
//! (little-endian, unaligned) when accessed through [`TypedArray`] or [`StringArray`].

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;

/// A GGUF metadata value type (`enum gguf_type` in ggml's `gguf.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with id `id`, if there is one.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes per value for fixed-size types; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The name gguf.cpp uses (`"u32"`, `"str"`, `"arr"`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "str",
            Array => "arr",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

impl Value {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// A short description for error messages: `"u32"`, `"array of 12 str"`.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.elem_type()),
            other => other.value_type().name().to_string(),
        }
    }

    /// Any integer value as `i128` (wide enough for every GGUF integer type).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float value (f32 or f64) as `f64`.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, for string values.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, for array values.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A fixed-size element type that can be read from (and written to) a GGUF array.
pub trait Scalar: Copy + 'static + sealed::Sealed {
    /// The GGUF type of such elements.
    const TYPE: ValueType;
    /// Decodes one little-endian element; `bytes` holds exactly its size.
    fn from_le(bytes: &[u8]) -> Self;
    /// Appends the little-endian encoding.
    fn write_le(self, out: &mut Vec<u8>);
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalar {
    ($t:ty, $vt:ident) => {
        impl sealed::Sealed for $t {}
        impl Scalar for $t {
            const TYPE: ValueType = ValueType::$vt;
            fn from_le(bytes: &[u8]) -> Self {
                let mut buf = [0u8; std::mem::size_of::<$t>()];
                buf.copy_from_slice(bytes);
                <$t>::from_le_bytes(buf)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}
scalar!(u8, U8);
scalar!(i8, I8);
scalar!(u16, U16);
scalar!(i16, I16);
scalar!(u32, U32);
scalar!(i32, I32);
scalar!(u64, U64);
scalar!(i64, I64);
scalar!(f32, F32);
scalar!(f64, F64);

impl sealed::Sealed for bool {}
impl Scalar for bool {
    const TYPE: ValueType = ValueType::Bool;
    /// The reader accepts only 0 and 1, so any non-zero byte here is 1.
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
}

/// An array value: element type, length and the elements' bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub(crate) elem: ValueType,
    pub(crate) items: ArrayItems,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ArrayItems {
    /// Fixed-size elements, little-endian and packed (`len * size` bytes).
    Scalars {
        len: usize,
        bytes: Bytes,
    },
    Strings(StringArray),
    Arrays(Vec<Array>),
}

impl Array {
    /// An array of fixed-size elements.
    pub fn from_slice<T: Scalar>(values: &[T]) -> Array {
        let mut out = Vec::with_capacity(values.len() * T::TYPE.fixed_size().unwrap_or(1));
        for v in values {
            v.write_le(&mut out);
        }
        Array {
            elem: T::TYPE,
            items: ArrayItems::Scalars {
                len: values.len(),
                bytes: Bytes::from(out),
            },
        }
    }

    /// An array of strings.
    pub fn from_strings<S: AsRef<str>>(values: &[S]) -> Array {
        Array {
            elem: ValueType::String,
            items: ArrayItems::Strings(StringArray::from_strs(values)),
        }
    }

    /// An array of arrays (each may have its own element type).
    pub fn from_arrays(values: Vec<Array>) -> Array {
        Array {
            elem: ValueType::Array,
            items: ArrayItems::Arrays(values),
        }
    }

    /// The element type (`ValueType::Array` for nested arrays).
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.items {
            ArrayItems::Scalars { len, .. } => *len,
            ArrayItems::Strings(s) => s.len(),
            ArrayItems::Arrays(a) => a.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as `T`, when the element type is `T`'s.
    pub fn as_typed<T: Scalar>(&self) -> Option<TypedArray<'_, T>> {
        match &self.items {
            ArrayItems::Scalars { len, bytes } if self.elem == T::TYPE => Some(TypedArray {
                bytes,
                len: *len,
                _elem: PhantomData,
            }),
            _ => None,
        }
    }

    /// The raw little-endian bytes of a fixed-size element array.
    pub fn scalar_bytes(&self) -> Option<&Bytes> {
        match &self.items {
            ArrayItems::Scalars { bytes, .. } => Some(bytes),
            _ => None,
        }
    }

    /// The elements of a string array.
    pub fn as_strings(&self) -> Option<&StringArray> {
        match &self.items {
            ArrayItems::Strings(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array of arrays.
    pub fn as_arrays(&self) -> Option<&[Array]> {
        match &self.items {
            ArrayItems::Arrays(a) => Some(a),
            _ => None,
        }
    }
}

/// A read-only view of a fixed-size element array, decoding elements on access.
#[derive(Clone, Copy)]
pub struct TypedArray<'a, T: Scalar> {
    bytes: &'a [u8],
    len: usize,
    _elem: PhantomData<T>,
}

impl<'a, T: Scalar> TypedArray<'a, T> {
    fn size() -> usize {
        std::mem::size_of::<T>()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element `i`, if in range.
    pub fn get(&self, i: usize) -> Option<T> {
        let size = Self::size();
        let start = i.checked_mul(size)?;
        self.bytes.get(start..start + size).map(T::from_le)
    }

    /// The elements in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + 'a {
        self.bytes.chunks_exact(Self::size()).map(T::from_le)
    }

    /// The elements, decoded into a vector.
    pub fn to_vec(&self) -> Vec<T> {
        self.iter().collect()
    }
}

impl<T: Scalar + fmt::Debug> fmt::Debug for TypedArray<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A string array as stored in the file: the strings' bytes are not copied, only the
/// position of each one's length prefix is kept.
///
/// Invariant (established by `StringArray::parse` and `StringArray::from_strs`, the
/// only constructors): `prefixes` are strictly increasing positions in `data`; the string
/// `i` occupies `prefixes[i] + 8 .. end(i)` where `end(i)` is `prefixes[i + 1]` or
/// `data.len()` for the last, and every such range is valid UTF-8.
#[derive(Clone, PartialEq)]
pub struct StringArray {
    data: Bytes,
    prefixes: Vec<usize>,
}

impl StringArray {
    /// Parses `count` length-prefixed strings at the start of `data`, checking that they
    /// fit and are UTF-8. Returns the array and the bytes consumed, or the index of the
    /// bad element and what is wrong with it.
    pub(crate) fn parse(data: &Bytes, count: usize) -> Result<(StringArray, usize), BadString> {
        // Every string takes at least its 8-byte length prefix, which bounds the allocation
        // by the data's size whatever `count` claims.
        let mut prefixes = Vec::with_capacity(count.min(data.len() / 8));
        let mut pos = 0usize;
        for index in 0..count {
            let Some(len_bytes) = data.get(pos..pos + 8) else {
                return Err(BadString::Truncated {
                    index,
                    at: pos,
                    needed: 8,
                });
            };
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap_or([0; 8]));
            let start = pos + 8;
            let available = data.len() - start;
            if len > available as u64 {
                return Err(BadString::Truncated {
                    index,
                    at: pos,
                    needed: len,
                });
            }
            let end = start + len as usize;
            if let Err(error) = std::str::from_utf8(&data[start..end]) {
                return Err(BadString::Utf8 {
                    index,
                    at: pos,
                    error,
                });
            }
            prefixes.push(pos);
            pos = end;
        }
        Ok((
            StringArray {
                data: data.slice(..pos),
                prefixes,
            },
            pos,
        ))
    }

    fn from_strs<S: AsRef<str>>(values: &[S]) -> StringArray {
        let mut data = Vec::new();
        let mut prefixes = Vec::with_capacity(values.len());
        for v in values {
            prefixes.push(data.len());
            let s = v.as_ref().as_bytes();
            data.extend_from_slice(&(s.len() as u64).to_le_bytes());
            data.extend_from_slice(s);
        }
        StringArray {
            data: Bytes::from(data),
            prefixes,
        }
    }

    /// The number of strings.
    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// Whether there are no strings.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    fn range(&self, i: usize) -> Option<(usize, usize)> {
        let start = self.prefixes.get(i)? + 8;
        let end = self.prefixes.get(i + 1).copied().unwrap_or(self.data.len());
        Some((start, end))
    }

    /// String `i`, if in range.
    pub fn get(&self, i: usize) -> Option<&str> {
        let (start, end) = self.range(i)?;
        let bytes = &self.data[start..end];
        // SAFETY: by the type's invariant, every string range was checked to be valid
        // UTF-8 when the array was built, and `data` is immutable since.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    }

    /// String `i` as a zero-copy slice of the file.
    pub fn get_bytes(&self, i: usize) -> Option<Bytes> {
        let (start, end) = self.range(i)?;
        Some(self.data.slice(start..end))
    }

    /// The strings in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// The serialized form (each string as u64 length + bytes), as in the file.
    pub(crate) fn raw(&self) -> &Bytes {
        &self.data
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        let mut list = f.debug_list();
        list.entries(self.iter().take(SHOWN));
        if self.len() > SHOWN {
            list.entry(&format_args!("... {} more", self.len() - SHOWN));
        }
        list.finish()
    }
}

/// A bad element found by [`StringArray::parse`]; `at` is relative to the array data.
#[derive(Debug)]
pub(crate) enum BadString {
    Truncated {
        index: usize,
        at: usize,
        needed: u64,
    },
    Utf8 {
        index: usize,
        at: usize,
        error: std::str::Utf8Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_array_views_each_string() {
        let a = Array::from_strings(&["a", "", "héllo", "日本"]);
        let s = a.as_strings().unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s.iter().collect::<Vec<_>>(), ["a", "", "héllo", "日本"]);
        assert_eq!(s.get(4), None);
        assert_eq!(&s.get_bytes(2).unwrap()[..], "héllo".as_bytes());
        let (parsed, used) = StringArray::parse(s.raw(), 4).unwrap();
        assert_eq!(used, s.raw().len());
        assert_eq!(parsed, *s);
    }

    #[test]
    fn string_array_parse_rejects_bad_utf8_and_truncation() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&2u64.to_le_bytes());
        raw.extend_from_slice(&[0xff, 0xfe]);
        let err = StringArray::parse(&Bytes::from(raw.clone()), 1).unwrap_err();
        assert!(matches!(err, BadString::Utf8 { index: 0, .. }), "{err:?}");
        let mut ok = Vec::new();
        ok.extend_from_slice(&2u64.to_le_bytes());
        ok.extend_from_slice(b"ok");
        let err = StringArray::parse(&Bytes::from(ok), 2).unwrap_err();
        assert!(
            matches!(
                err,
                BadString::Truncated {
                    index: 1,
                    at: 10,
                    needed: 8
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn typed_arrays_decode_little_endian() {
        let a = Array::from_slice(&[1i32, -2, 300_000]);
        let t = a.as_typed::<i32>().unwrap();
        assert_eq!(t.to_vec(), [1, -2, 300_000]);
        assert_eq!(t.get(1), Some(-2));
        assert_eq!(t.get(3), None);
        assert!(a.as_typed::<u32>().is_none());
        assert_eq!(&a.scalar_bytes().unwrap()[..4], &[1, 0, 0, 0]);
    }
}
