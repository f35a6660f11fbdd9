//! The one error type of the crate: which file, where in it, and what is wrong.

use std::fmt;
use std::sync::Arc;

use crate::ggml_type::{GgmlType, UnknownGgmlType};
use crate::value::ValueType;

/// An error reading, querying or writing a GGUF file.
///
/// It names the file (the path, or the name given to [`crate::GgufFile::from_bytes_named`]),
/// the byte offset in it where the bad field starts when there is one, and in
/// [`kind`](Self::kind) what is wrong, naming the key or tensor involved.
#[derive(Debug)]
pub struct GgufError {
    file: Arc<str>,
    offset: Option<u64>,
    kind: ErrorKind,
}

impl GgufError {
    pub(crate) fn new(file: &Arc<str>, offset: Option<u64>, kind: ErrorKind) -> Self {
        GgufError {
            file: Arc::clone(file),
            offset,
            kind,
        }
    }

    /// The file (or in-memory buffer name) the error is about.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The byte offset of the offending field, when the error is about one.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// What is wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(offset) => write!(f, "{}: at byte {offset}: {}", self.file, self.kind),
            None => write!(f, "{}: {}", self.file, self.kind),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// What is wrong, naming the field, key or tensor concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    #[error("cannot read the file: {0}")]
    Io(#[source] std::io::Error),

    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: Vec<u8> },

    #[error("GGUF version 1 is not supported (it used 32-bit counts); versions 2 and 3 are")]
    VersionOne,

    #[error(
        "GGUF version field reads {version:#010x}: the file looks big-endian, \
         and only little-endian GGUF files are supported"
    )]
    BigEndian { version: u32 },

    #[error("unsupported GGUF version {version} (versions 2 and 3 are supported)")]
    UnsupportedVersion { version: u32 },

    #[error("{what}: needs {needed} bytes but the file has only {available} left")]
    Truncated {
        what: String,
        needed: u64,
        available: u64,
    },

    #[error(
        "{what} is {count}, but even at {min_bytes} bytes each that needs more than \
         the {available} bytes left in the file"
    )]
    CountTooLarge {
        what: String,
        count: u64,
        min_bytes: u64,
        available: u64,
    },

    #[error("{what} is not valid UTF-8 ({error})")]
    InvalidUtf8 {
        what: String,
        error: std::str::Utf8Error,
    },

    #[error("metadata key #{index} is empty")]
    EmptyKey { index: u64 },

    #[error("duplicate metadata key '{key}' (first defined at byte {first_offset})")]
    DuplicateKey { key: String, first_offset: u64 },

    #[error("metadata key '{key}': invalid value type id {type_id} (valid ids are 0..=12)")]
    InvalidValueType { key: String, type_id: u32 },

    #[error("metadata key '{key}': bool value {value} is neither 0 nor 1")]
    InvalidBool { key: String, value: u8 },

    #[error("metadata key '{key}': arrays nested deeper than {max} levels")]
    NestingTooDeep { key: String, max: usize },

    #[error("metadata key '{key}': more than {max} nested arrays in the file")]
    TooManyNestedArrays { key: String, max: usize },

    #[error("'general.alignment' {reason}")]
    BadAlignment { reason: String },

    #[error("duplicate tensor name '{name}' (first defined at byte {first_offset})")]
    DuplicateTensor { name: String, first_offset: u64 },

    #[error("tensor '{tensor}': {n_dims} dimensions, but ggml allows at most 4")]
    TooManyDims { tensor: String, n_dims: u32 },

    #[error("tensor '{tensor}': dimension {index} is {dim}, which exceeds i64::MAX")]
    DimTooLarge {
        tensor: String,
        index: usize,
        dim: u64,
    },

    #[error("tensor '{tensor}': element count of dims {dims:?} overflows i64")]
    ElementCountOverflow { tensor: String, dims: Vec<u64> },

    #[error("tensor '{tensor}': {reason}")]
    BadTensorType {
        tensor: String,
        reason: UnknownGgmlType,
    },

    #[error(
        "tensor '{tensor}' ({ty}): rows of {row} elements are not a whole number of \
         {block}-element blocks"
    )]
    RowNotBlockMultiple {
        tensor: String,
        ty: GgmlType,
        row: u64,
        block: u32,
    },

    #[error("tensor '{tensor}' ({ty}, dims {dims:?}): byte size overflows u64")]
    ByteSizeOverflow {
        tensor: String,
        ty: GgmlType,
        dims: Vec<u64>,
    },

    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor '{tensor}': data bytes {start}..{end} (data offset {offset} + {size} bytes) \
         lie past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        size: u64,
        start: u64,
        end: u64,
        file_len: u64,
    },

    #[error(
        "tensors '{first}' (data bytes {first_start}..{first_end}) and '{second}' \
         (data bytes {second_start}..{second_end}) overlap"
    )]
    TensorsOverlap {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },

    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },

    #[error("metadata key '{key}' holds {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("metadata key '{key}': array element type is {found}, expected {expected}")]
    WrongArrayType {
        key: String,
        expected: ValueType,
        found: ValueType,
    },

    #[error("writer: {0}")]
    Writer(String),
}
