//! Parsing and validating a GGUF file's header, metadata and tensor infos.
//!
//! Layout (ggml's `gguf.h`; all integers little-endian):
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × { key: string | value_type u32 | value }
//! tensor_count × { name: string | n_dims u32 | n_dims × dim u64 | ggml_type u32 | offset u64 }
//! padding to `general.alignment` (default 32) | tensor data
//!
//! string = length u64 + UTF-8 bytes (no terminator)
//! value  = fixed-size scalar | string | array: elem_type u32, count u64, count × element
//! ```
//!
//! Every read is bounds-checked against the buffer, and every count is checked against the
//! bytes left before anything is allocated for it, so a hostile header cannot make the
//! parser allocate more than a small multiple of the file's size.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{ErrorKind, GgufError};
use crate::ggml_type::GgmlType;
use crate::tensor::TensorInfo;
use crate::value::{Array, ArrayItems, BadString, StringArray, Value, ValueType};

/// The magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Arrays nested deeper than this are rejected (gguf-py can write nested arrays, ggml
/// cannot read them at all; no real file nests).
pub const MAX_NESTING: usize = 8;

/// At most this many nested (array-of-array) elements in one file.
pub const MAX_NESTED_ARRAYS: usize = 1 << 20;

/// Smallest possible encoding of one key-value pair: key length, one key byte, value
/// type, one value byte.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;

/// Smallest possible encoding of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One metadata key-value pair.
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataEntry {
    pub(crate) key: String,
    pub(crate) value: Value,
    pub(crate) offset: u64,
}

impl MetadataEntry {
    /// The key (`"general.architecture"`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The value.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Offset in the file where the entry (its key's length) starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// Everything the header describes, validated.
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Vec<MetadataEntry>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Parser<'a> {
    bytes: &'a Bytes,
    pos: usize,
    file: &'a Arc<str>,
    nested_arrays: usize,
}

pub(crate) fn parse(bytes: &Bytes, file: &Arc<str>) -> Result<Parsed, GgufError> {
    let mut p = Parser {
        bytes,
        pos: 0,
        file,
        nested_arrays: 0,
    };
    let (version, n_tensors, n_kv) = p.header()?;
    let (metadata, key_index) = p.metadata(n_kv)?;
    let alignment = alignment(&metadata, &key_index, file)?;
    let (mut tensors, tensor_index) = p.tensor_infos(n_tensors)?;
    let data_offset = align_up(p.pos as u64, alignment);
    place_tensors(
        &mut tensors,
        data_offset,
        alignment,
        bytes.len() as u64,
        file,
    )?;
    check_overlaps(&tensors, file)?;
    Ok(Parsed {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

fn align_up(pos: u64, alignment: u64) -> u64 {
    // `alignment` is a power of two no larger than 2^31 and `pos` a buffer length, so
    // this cannot overflow.
    pos.div_ceil(alignment) * alignment
}

impl<'a> Parser<'a> {
    fn err(&self, at: usize, kind: ErrorKind) -> GgufError {
        GgufError::new(self.file, Some(at as u64), kind)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(self.err(
                self.pos,
                ErrorKind::Truncated {
                    what: what(),
                    needed: n,
                    available: self.remaining() as u64,
                },
            ));
        }
        let start = self.pos;
        self.pos += n as usize;
        let bytes: &'a Bytes = self.bytes;
        Ok(&bytes[start..self.pos])
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(|| format!("{} (length)", what()))?;
        let raw = self.take(len, || format!("{} ({len} bytes)", what()))?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_string()),
            Err(error) => Err(self.err(
                at,
                ErrorKind::InvalidUtf8 {
                    what: what(),
                    error,
                },
            )),
        }
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in what is left.
    fn check_count(
        &self,
        at: usize,
        count: u64,
        min_bytes: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        let available = self.remaining() as u64;
        match count.checked_mul(min_bytes) {
            Some(need) if need <= available => Ok(count as usize),
            _ => Err(self.err(
                at,
                ErrorKind::CountTooLarge {
                    what: what(),
                    count,
                    min_bytes,
                    available,
                },
            )),
        }
    }

    fn header(&mut self) -> Result<(u32, u64, u64), GgufError> {
        if self.bytes.len() < 4 {
            return Err(self.err(
                0,
                ErrorKind::Truncated {
                    what: "magic".into(),
                    needed: 4,
                    available: self.bytes.len() as u64,
                },
            ));
        }
        if self.bytes[..4] != GGUF_MAGIC {
            return Err(self.err(
                0,
                ErrorKind::BadMagic {
                    found: self.bytes[..4].to_vec(),
                },
            ));
        }
        self.pos = 4;
        let version = self.u32(|| "version".into())?;
        match version {
            2 | 3 => {}
            1 => return Err(self.err(4, ErrorKind::VersionOne)),
            v if v & 0xffff == 0 && v != 0 => {
                return Err(self.err(4, ErrorKind::BigEndian { version: v }))
            }
            v => return Err(self.err(4, ErrorKind::UnsupportedVersion { version: v })),
        }
        let n_tensors = self.u64(|| "tensor count".into())?;
        let n_kv = self.u64(|| "metadata key-value count".into())?;
        Ok((version, n_tensors, n_kv))
    }

    fn metadata(
        &mut self,
        n_kv: u64,
    ) -> Result<(Vec<MetadataEntry>, HashMap<String, usize>), GgufError> {
        let n = self.check_count(16, n_kv, MIN_KV_BYTES, || "metadata key-value count".into())?;
        let mut entries = Vec::with_capacity(n);
        let mut index = HashMap::with_capacity(n);
        for i in 0..n {
            let at = self.pos;
            let key = self.string(|| format!("metadata key #{i}"))?;
            if key.is_empty() {
                return Err(self.err(at, ErrorKind::EmptyKey { index: i as u64 }));
            }
            if let Some(&first) = index.get(&key) {
                let first_offset = entries_offset(&entries, first);
                return Err(self.err(at, ErrorKind::DuplicateKey { key, first_offset }));
            }
            let type_id = self.u32(|| format!("metadata key '{key}': value type"))?;
            let value = self.value(&key, type_id, 0)?;
            index.insert(key.clone(), entries.len());
            entries.push(MetadataEntry {
                key,
                value,
                offset: at as u64,
            });
        }
        Ok((entries, index))
    }

    fn value_type(&self, at: usize, key: &str, type_id: u32) -> Result<ValueType, GgufError> {
        ValueType::from_id(type_id).ok_or_else(|| {
            self.err(
                at,
                ErrorKind::InvalidValueType {
                    key: key.to_string(),
                    type_id,
                },
            )
        })
    }

    /// The value of `key` whose type id was just read (at `self.pos - 4`).
    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<Value, GgufError> {
        let ty = self.value_type(self.pos - 4, key, type_id)?;
        let what = || format!("metadata key '{key}': {} value", ty.name());
        let at = self.pos;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.take(1, what)?[0]),
            ValueType::I8 => Value::I8(self.take(1, what)?[0] as i8),
            ValueType::U16 => {
                let b = self.take(2, what)?;
                Value::U16(u16::from_le_bytes([b[0], b[1]]))
            }
            ValueType::I16 => {
                let b = self.take(2, what)?;
                Value::I16(i16::from_le_bytes([b[0], b[1]]))
            }
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(self.u32(what)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(self.u64(what)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(what)?)),
            ValueType::Bool => {
                let b = self.take(1, what)?[0];
                if b > 1 {
                    let key = key.to_string();
                    return Err(self.err(at, ErrorKind::InvalidBool { key, value: b }));
                }
                Value::Bool(b == 1)
            }
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array(key, depth + 1)?),
        })
    }

    /// An array's element type, count and elements.
    fn array(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        let at = self.pos;
        if depth > MAX_NESTING {
            let key = key.to_string();
            return Err(self.err(
                at,
                ErrorKind::NestingTooDeep {
                    key,
                    max: MAX_NESTING,
                },
            ));
        }
        let elem_id = self.u32(|| format!("metadata key '{key}': array element type"))?;
        let elem = self.value_type(at, key, elem_id)?;
        let count_at = self.pos;
        let count = self.u64(|| format!("metadata key '{key}': array length"))?;
        let what = || format!("metadata key '{key}': array length");
        let items = match elem {
            ValueType::String => {
                let n = self.check_count(count_at, count, 8, what)?;
                self.string_array(key, n)?
            }
            ValueType::Array => {
                let n = self.check_count(count_at, count, 12, what)?;
                self.nested_arrays(key, n, depth)?
            }
            fixed => {
                let size = fixed.fixed_size().unwrap_or(1) as u64;
                let n = self.check_count(count_at, count, size, what)?;
                let start = self.pos;
                self.pos += n * size as usize;
                let bytes = self.bytes.slice(start..self.pos);
                if fixed == ValueType::Bool {
                    if let Some(i) = bytes.iter().position(|&b| b > 1) {
                        let key = format!("{key}[{i}]");
                        return Err(self.err(
                            start + i,
                            ErrorKind::InvalidBool {
                                key,
                                value: bytes[i],
                            },
                        ));
                    }
                }
                ArrayItems::Scalars { len: n, bytes }
            }
        };
        Ok(Array { elem, items })
    }

    fn string_array(&mut self, key: &str, n: usize) -> Result<ArrayItems, GgufError> {
        let start = self.pos;
        let rest = self.bytes.slice(start..);
        match StringArray::parse(&rest, n) {
            Ok((strings, used)) => {
                self.pos += used;
                Ok(ArrayItems::Strings(strings))
            }
            Err(BadString::Truncated { index, at, needed }) => Err(self.err(
                start + at,
                ErrorKind::Truncated {
                    what: format!("metadata key '{key}': string #{index}"),
                    needed,
                    available: (rest.len() - at) as u64,
                },
            )),
            Err(BadString::Utf8 { index, at, error }) => Err(self.err(
                start + at,
                ErrorKind::InvalidUtf8 {
                    what: format!("metadata key '{key}': string #{index}"),
                    error,
                },
            )),
        }
    }

    fn nested_arrays(
        &mut self,
        key: &str,
        n: usize,
        depth: usize,
    ) -> Result<ArrayItems, GgufError> {
        self.nested_arrays += n;
        if self.nested_arrays > MAX_NESTED_ARRAYS {
            let key = key.to_string();
            return Err(self.err(
                self.pos,
                ErrorKind::TooManyNestedArrays {
                    key,
                    max: MAX_NESTED_ARRAYS,
                },
            ));
        }
        let mut arrays = Vec::with_capacity(n);
        for i in 0..n {
            arrays.push(self.array(&format!("{key}[{i}]"), depth + 1)?);
        }
        Ok(ArrayItems::Arrays(arrays))
    }

    fn tensor_infos(
        &mut self,
        n_tensors: u64,
    ) -> Result<(Vec<TensorInfo>, HashMap<String, usize>), GgufError> {
        let n = self.check_count(8, n_tensors, MIN_TENSOR_INFO_BYTES, || {
            "tensor count".into()
        })?;
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n);
        let mut index = HashMap::with_capacity(n);
        for i in 0..n {
            let info = self.tensor_info(i)?;
            if let Some(&first) = index.get(&info.name) {
                let first: &TensorInfo = &tensors[first];
                return Err(self.err(
                    info.info_offset as usize,
                    ErrorKind::DuplicateTensor {
                        name: info.name,
                        first_offset: first.info_offset,
                    },
                ));
            }
            index.insert(info.name.clone(), tensors.len());
            tensors.push(info);
        }
        Ok((tensors, index))
    }

    fn tensor_info(&mut self, i: usize) -> Result<TensorInfo, GgufError> {
        let at = self.pos;
        let name = self.string(|| format!("tensor #{i}: name"))?;
        let n_dims_at = self.pos;
        let n_dims = self.u32(|| format!("tensor '{name}': dimension count"))?;
        if n_dims > 4 {
            let tensor = name;
            return Err(self.err(n_dims_at, ErrorKind::TooManyDims { tensor, n_dims }));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims as usize {
            let dim_at = self.pos;
            let dim = self.u64(|| format!("tensor '{name}': dimension {d}"))?;
            if dim > i64::MAX as u64 {
                let tensor = name;
                return Err(self.err(
                    dim_at,
                    ErrorKind::DimTooLarge {
                        tensor,
                        index: d,
                        dim,
                    },
                ));
            }
            dims.push(dim);
        }
        let type_at = self.pos;
        let type_id = self.u32(|| format!("tensor '{name}': type"))?;
        let ty = GgmlType::from_id(type_id).map_err(|reason| {
            let tensor = name.clone();
            self.err(type_at, ErrorKind::BadTensorType { tensor, reason })
        })?;
        let offset = self.u64(|| format!("tensor '{name}': data offset"))?;
        let (n_elements, n_bytes) =
            tensor_size(&name, &dims, ty).map_err(|kind| self.err(n_dims_at, kind))?;
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
            info_offset: at as u64,
            data_start: 0,
        })
    }
}

fn entries_offset(entries: &[MetadataEntry], i: usize) -> u64 {
    entries.get(i).map_or(0, |e| e.offset)
}

/// Element count and byte size of a tensor with ggml `dims` of type `ty`.
pub(crate) fn tensor_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<(u64, u64), ErrorKind> {
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| ErrorKind::ElementCountOverflow {
            tensor: name.to_string(),
            dims: dims.to_vec(),
        })?;
    let row = dims.first().copied().unwrap_or(1);
    let block = ty.block_elems();
    if row % u64::from(block) != 0 {
        return Err(ErrorKind::RowNotBlockMultiple {
            tensor: name.to_string(),
            ty,
            row,
            block,
        });
    }
    let n_bytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| ErrorKind::ByteSizeOverflow {
            tensor: name.to_string(),
            ty,
            dims: dims.to_vec(),
        })?;
    Ok((n_elements, n_bytes))
}

/// `general.alignment` if present (a non-zero power-of-two u32), else the default.
fn alignment(
    metadata: &[MetadataEntry],
    index: &HashMap<String, usize>,
    file: &Arc<str>,
) -> Result<u64, GgufError> {
    let Some(&i) = index.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT.into());
    };
    let entry = &metadata[i];
    let reason = match entry.value {
        Value::U32(a) if a.is_power_of_two() => return Ok(a.into()),
        Value::U32(a) => format!("is {a}, which is not a non-zero power of two"),
        ref other => format!("must be a u32 but holds {}", other.describe()),
    };
    Err(GgufError::new(
        file,
        Some(entry.offset),
        ErrorKind::BadAlignment { reason },
    ))
}

/// Checks each tensor's data is aligned and inside the file, and records where it starts.
fn place_tensors(
    tensors: &mut [TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
    file: &Arc<str>,
) -> Result<(), GgufError> {
    for t in tensors.iter_mut() {
        // The offset field is the last 8 bytes of the info.
        let field_at =
            || Some(t.info_offset + 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4);
        if t.offset % alignment != 0 {
            return Err(GgufError::new(
                file,
                field_at(),
                ErrorKind::MisalignedTensor {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment,
                },
            ));
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.data_start = start,
            _ => {
                return Err(GgufError::new(
                    file,
                    field_at(),
                    ErrorKind::TensorOutOfBounds {
                        tensor: t.name.clone(),
                        offset: t.offset,
                        size: t.n_bytes,
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    },
                ))
            }
        }
    }
    Ok(())
}

/// Checks that no two non-empty tensors share a byte.
fn check_overlaps(tensors: &[TensorInfo], file: &Arc<str>) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| (t.data_start, t.n_bytes));
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.data_start + a.n_bytes > b.data_start {
            return Err(GgufError::new(
                file,
                Some(b.info_offset),
                ErrorKind::TensorsOverlap {
                    first: a.name.clone(),
                    first_start: a.data_start,
                    first_end: a.data_start + a.n_bytes,
                    second: b.name.clone(),
                    second_start: b.data_start,
                    second_end: b.data_start + b.n_bytes,
                },
            ));
        }
    }
    Ok(())
}
