//! [`GgufFile`]: an opened, validated GGUF file and its typed accessors.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{ErrorKind, GgufError};
use crate::parse::{parse, MetadataEntry};
use crate::tensor::TensorInfo;
use crate::value::{Array, Scalar, StringArray, TypedArray, Value, ValueType};

/// A GGUF file (version 2 or 3), validated when opened.
///
/// The whole file is one [`Bytes`] buffer (a memory map for [`open`](Self::open)); tensor
/// data and string-array elements are zero-copy slices of it, which keep the map alive.
#[derive(Clone)]
pub struct GgufFile {
    name: Arc<str>,
    bytes: Bytes,
    version: u32,
    metadata: Vec<MetadataEntry>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    /// The memory map behind `bytes` when the file was opened from a path ([`Self::open`]);
    /// `None` for in-memory files. Kept to hand the header's pages back
    /// ([`Self::release_header_pages`]), which only a file mapping may do.
    map: Option<Arc<memmap2::Mmap>>,
    /// The tensor data section (from `data_offset` to the end) read into memory
    /// ([`TensorMemory::Resident`]); `None`: tensor data are slices of `bytes`.
    data: Option<Bytes>,
}

/// Where an opened file's tensor data live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorMemory {
    /// In a read-only memory map of the file, every page mapped at open (the file's pages
    /// in the page cache: 4 KiB each, which the kernel may drop and re-read under memory
    /// pressure).
    #[default]
    Mapped,
    /// Copied into anonymous memory advised for huge pages ([`crate::read_resident`]): a
    /// decode step that streams every weight runs faster, at the cost of one copy at open.
    /// The header stays mapped (its pages are touched only while it is parsed).
    Resident,
}

/// A shared memory map as the owner of a [`Bytes`] buffer.
struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// Memory-maps `path` read-only as one [`Bytes`] buffer, with its pages mapped up front.
///
/// A map reflects later changes to the file: callers must not modify or truncate a model
/// file while any slice of it is alive (rafter treats model files as immutable inputs).
///
/// Why populate (`MAP_POPULATE` on Linux; a no-op elsewhere): a model's weights are all
/// read by its first call, so mapping them lazily only moves one page fault per 4-64 KiB
/// of weights into that call (48,600 minor faults, ~9% of the CPU time of a 128-token
/// prefill of the Qwen3-0.6B-shaped f16 GGUF, `perf record`). Populating maps the pages
/// (already in the page cache, or read from disk) in one system call at open, as
/// llama.cpp's loader does; the resident size after the first call is the same.
pub fn map_file(path: &Path) -> std::io::Result<Bytes> {
    Ok(map_shared(path, true)?.0)
}

/// [`map_file`], also returning the map (`None` for an empty file) and the open file;
/// `populate` maps every page up front.
fn map_shared(
    path: &Path,
    populate: bool,
) -> std::io::Result<(Bytes, Option<Arc<memmap2::Mmap>>, File)> {
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok((Bytes::new(), None, file));
    }
    let mut options = memmap2::MmapOptions::new();
    if populate {
        options.populate();
    }
    // SAFETY: the map is read-only and private to this process. The remaining hazard is
    // another process truncating or rewriting the file while it is mapped, which the
    // doc comment above makes the caller's contract.
    let map = Arc::new(unsafe { options.map(&file) }?);
    Ok((Bytes::from_owner(SharedMap(map.clone())), Some(map), file))
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`. Errors name the path.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_with(path, TensorMemory::Mapped)
    }

    /// Opens and validates the file at `path` with its tensor data where `memory` says.
    /// Errors name the path.
    pub fn open_with(path: impl AsRef<Path>, memory: TensorMemory) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let name: Arc<str> = path.display().to_string().into();
        let io = |e| GgufError::new(&name, None, ErrorKind::Io(e));
        // Resident: only the header's pages are read through the map (by the parser), so
        // they are the only ones mapped; the tensor data are read from the file directly.
        let populate = memory == TensorMemory::Mapped;
        let (bytes, map, file) = map_shared(path, populate).map_err(io)?;
        let mut f = Self::parse_named(bytes, name.clone())?;
        f.map = map;
        if memory == TensorMemory::Resident {
            let start = usize::try_from(f.data_offset).unwrap_or(usize::MAX);
            let len = f.bytes.len().saturating_sub(start);
            f.data = Some(crate::read_resident(&file, f.data_offset, len).map_err(io)?);
        }
        Ok(f)
    }

    /// Validates an in-memory GGUF file. Errors name it `<memory>`.
    pub fn from_bytes(bytes: Bytes) -> Result<GgufFile, GgufError> {
        Self::parse_named(bytes, "<memory>".into())
    }

    /// Validates an in-memory GGUF file; errors name it `name`.
    pub fn from_bytes_named(bytes: Bytes, name: &str) -> Result<GgufFile, GgufError> {
        Self::parse_named(bytes, name.into())
    }

    fn parse_named(bytes: Bytes, name: Arc<str>) -> Result<GgufFile, GgufError> {
        let p = parse(&bytes, &name)?;
        Ok(GgufFile {
            name,
            bytes,
            version: p.version,
            metadata: p.metadata,
            key_index: p.key_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
            alignment: p.alignment,
            data_offset: p.data_offset,
            map: None,
            data: None,
        })
    }

    /// Hands the resident pages of the header (metadata and tensor infos: everything before
    /// [`Self::data_offset`], in whole pages) back to the kernel; returns the bytes advised.
    ///
    /// Why: [`map_file`] maps every page up front, and the header of an LLM's GGUF is its
    /// tokenizer (151k token strings and merges: 5.7 MiB for Qwen3), read once while the
    /// tokenizer is built and then never again. Its pages would otherwise stay in the
    /// process's resident set next to the weights for its whole life.
    ///
    /// Nothing is lost: the map is a read-only mapping of the file, so `MADV_DONTNEED` only
    /// drops this process's page-table entries; a later read of those bytes (a metadata
    /// accessor) faults them in again from the page cache, with the same contents. A file
    /// read from memory ([`Self::from_bytes`]) is left alone (0); so is every platform but
    /// Linux.
    pub fn release_header_pages(&self) -> std::io::Result<usize> {
        #[cfg(target_os = "linux")]
        if let Some(map) = &self.map {
            // SAFETY: `sysconf` reads a constant of the system.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let page = usize::try_from(page).unwrap_or(0).max(1);
            let header = usize::try_from(self.data_offset).unwrap_or(usize::MAX);
            let len = header.min(map.len()) / page * page;
            if len > 0 {
                // SAFETY: the range [0, len) lies in the map (len <= map.len()) and is
                // page-aligned (the map starts on a page, len is whole pages, so the kernel
                // does not round it into the tensor data). The map is a read-only shared
                // mapping of a file nobody may change while it is mapped (the contract of
                // `map_file`): MADV_DONTNEED drops page-table entries only, and any live
                // `&[u8]` into the range reads the same bytes again from the page cache.
                unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, len)?;
                }
            }
            return Ok(len);
        }
        Ok(0)
    }

    /// The path (or given name) of the file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole file.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The tensor data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the tensor data section starts: the end of the tensor infos rounded up to the
    /// alignment (as gguf-py's reader computes it).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[MetadataEntry] {
        &self.metadata
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's data as a zero-copy slice of the file (or of its copy in memory,
    /// [`TensorMemory::Resident`]).
    ///
    /// `info` must come from this file (its range was validated against it); an info
    /// from another file whose range does not fit gives an empty buffer.
    pub fn tensor_data(&self, info: &TensorInfo) -> Bytes {
        let start = info.data_start as usize;
        let Some(end) = start.checked_add(info.n_bytes as usize) else {
            return Bytes::new();
        };
        match &self.data {
            // Resident: the data section's copy, which starts at `data_offset`.
            Some(data) => {
                let base = self.data_offset as usize;
                match (start.checked_sub(base), end.checked_sub(base)) {
                    (Some(s), Some(e)) if e <= data.len() => data.slice(s..e),
                    _ => Bytes::new(),
                }
            }
            None if end <= self.bytes.len() => self.bytes.slice(start..end),
            None => Bytes::new(),
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entry(key).map(|e| &e.value)
    }

    /// The entry of `key`, if present (with its offset in the file).
    pub fn entry(&self, key: &str) -> Option<&MetadataEntry> {
        self.key_index.get(key).map(|&i| &self.metadata[i])
    }

    fn error(&self, key: &str, kind: ErrorKind) -> GgufError {
        let offset = self.entry(key).map(|e| e.offset);
        GgufError::new(&self.name, offset, kind)
    }

    fn missing(&self, key: &str) -> GgufError {
        self.error(
            key,
            ErrorKind::MissingKey {
                key: key.to_string(),
            },
        )
    }

    /// The value of `key` converted to `T` (see [`FromValue`] for the conversions);
    /// errors name the key when it is missing or holds something else.
    pub fn get_as<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T, GgufError> {
        self.get_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// Like [`get_as`](Self::get_as), but a missing key is `Ok(None)`.
    pub fn get_opt<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        T::from_value(value).map(Some).ok_or_else(|| {
            self.error(
                key,
                ErrorKind::WrongType {
                    key: key.to_string(),
                    expected: T::EXPECTED,
                    found: found_description(value),
                },
            )
        })
    }

    /// `key` as a `u32` (any integer type whose value fits).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_as(key)
    }

    /// `key` as a `u64` (any integer type whose value fits).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_as(key)
    }

    /// `key` as an `i32` (any integer type whose value fits).
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.get_as(key)
    }

    /// `key` as an `i64` (any integer type whose value fits).
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.get_as(key)
    }

    /// `key` as an `f32` (f32, f64 or integer values).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_as(key)
    }

    /// `key` as an `f64` (f32, f64 or integer values).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.get_as(key)
    }

    /// `key` as a `bool`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.get_as(key)
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get_as(key)
    }

    /// `key` as an array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        self.get_as(key)
    }

    /// `key` as an array of strings (zero-copy; see [`StringArray`]).
    pub fn get_string_array(&self, key: &str) -> Result<&StringArray, GgufError> {
        let array = self.get_array(key)?;
        array
            .as_strings()
            .ok_or_else(|| self.wrong_elem(key, ValueType::String, array))
    }

    /// `key` as an array of `T` elements, decoded on access. The element type must be
    /// exactly `T`'s (no conversion: a token-type array of i32 is not read as u32).
    pub fn get_typed_array<T: Scalar>(&self, key: &str) -> Result<TypedArray<'_, T>, GgufError> {
        let array = self.get_array(key)?;
        array
            .as_typed::<T>()
            .ok_or_else(|| self.wrong_elem(key, T::TYPE, array))
    }

    /// `key` as an array of i32 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<TypedArray<'_, i32>, GgufError> {
        self.get_typed_array(key)
    }

    /// `key` as an array of f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<TypedArray<'_, f32>, GgufError> {
        self.get_typed_array(key)
    }

    /// `key` as an array of u32.
    pub fn get_u32_array(&self, key: &str) -> Result<TypedArray<'_, u32>, GgufError> {
        self.get_typed_array(key)
    }

    fn wrong_elem(&self, key: &str, expected: ValueType, array: &Array) -> GgufError {
        self.error(
            key,
            ErrorKind::WrongArrayType {
                key: key.to_string(),
                expected,
                found: array.elem_type(),
            },
        )
    }
}

/// How a found value is described in a type error: the type, and the value for scalars.
fn found_description(value: &Value) -> String {
    match value {
        Value::Array(_) => value.describe(),
        Value::String(s) if s.len() <= 40 => format!("str {s:?}"),
        Value::String(_) => "str".to_string(),
        Value::F32(v) => format!("f32 {v}"),
        Value::F64(v) => format!("f64 {v}"),
        Value::Bool(v) => format!("bool {v}"),
        other => match other.as_integer() {
            Some(i) => format!("{} {i}", other.value_type()),
            None => other.describe(),
        },
    }
}

/// A type a metadata value can be read as, with the conversions GGUF writers make
/// necessary: integers of any width convert when the value fits (gguf-py writes most
/// counts as u32, other tools as u64 or i32), floats read f32 or f64 or integer values.
pub trait FromValue<'a>: Sized {
    /// What the getter expects, for error messages.
    const EXPECTED: &'static str;
    /// The converted value, or `None` if `value` does not hold one.
    fn from_value(value: &'a Value) -> Option<Self>;
}

macro_rules! from_integer {
    ($($t:ty),*) => {$(
        impl<'a> FromValue<'a> for $t {
            const EXPECTED: &'static str = concat!("an integer that fits in ", stringify!($t));
            fn from_value(value: &'a Value) -> Option<Self> {
                value.as_integer().and_then(|i| <$t>::try_from(i).ok())
            }
        }
    )*};
}
from_integer!(u8, i8, u16, i16, u32, i32, u64, i64, usize);

impl<'a> FromValue<'a> for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_value(value: &'a Value) -> Option<Self> {
        value
            .as_float()
            .or_else(|| value.as_integer().map(|i| i as f64))
    }
}

impl<'a> FromValue<'a> for f32 {
    const EXPECTED: &'static str = "a number";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::F32(v) => Some(*v),
            other => f64::from_value(other).map(|v| v as f32),
        }
    }
}

impl<'a> FromValue<'a> for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for &'a str {
    const EXPECTED: &'static str = "a string";
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_str()
    }
}

impl<'a> FromValue<'a> for &'a Array {
    const EXPECTED: &'static str = "an array";
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_array()
    }
}
