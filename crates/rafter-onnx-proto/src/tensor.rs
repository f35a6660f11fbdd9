//! Turning a [`TensorProto`] into dims plus packed little-endian element bytes.
//!
//! Supported element types: FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64,
//! BOOL (1 byte), FLOAT16, DOUBLE, UINT32, UINT64, BFLOAT16 (2 bytes). STRING
//! gives [`ProtoError::StringTensor`]; every other type (float8, int4/uint4,
//! float4, complex, ...) gives [`ProtoError::UnsupportedDtype`].
//!
//! Data is taken from, in order: external data (`data_location == EXTERNAL`),
//! non-empty `raw_data`, or the typed field the schema assigns to the element
//! type (`int32_data` carries INT8/UINT8/INT16/UINT16/BOOL/FLOAT16/BFLOAT16 bit
//! patterns, `uint64_data` carries UINT32). `raw_data` and external data are
//! returned zero-copy; typed fields are converted. The bytes are not aligned to
//! the element size in general. BOOL bytes from `raw_data` are passed through
//! unchanged (ONNX writers emit 0/1). `segment` is ignored.

use std::collections::HashMap;
use std::ops::Deref;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;

use crate::proto::{data_type_name, tensor_proto::DataLocation, TensorProto};
use crate::ProtoError;

/// Packed little-endian element bytes of a tensor, tagged with where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorBytes {
    /// A slice of `raw_data`; shares the buffer the proto was decoded from.
    Raw(Bytes),
    /// Converted from a typed field (`float_data`, `int32_data`, ...); owned.
    Converted(Bytes),
    /// A slice of a memory-mapped external data file.
    External(Bytes),
}

impl TensorBytes {
    pub fn as_bytes(&self) -> &Bytes {
        match self {
            TensorBytes::Raw(b) | TensorBytes::Converted(b) | TensorBytes::External(b) => b,
        }
    }

    pub fn into_bytes(self) -> Bytes {
        match self {
            TensorBytes::Raw(b) | TensorBytes::Converted(b) | TensorBytes::External(b) => b,
        }
    }
}

impl Deref for TensorBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// A decoded tensor: `data.len() == product(dims) * element_size(data_type)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnnxTensor {
    pub name: String,
    /// ONNX `TensorProto.DataType` code.
    pub data_type: i32,
    /// Non-negative; empty for a scalar.
    pub dims: Vec<i64>,
    pub data: TensorBytes,
}

impl OnnxTensor {
    /// Number of elements (`product(dims)`, 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    pub fn type_name(&self) -> &'static str {
        data_type_name(self.data_type)
    }
}

/// Size in bytes of one element for the supported data types, `None` otherwise.
pub fn element_size(data_type: i32) -> Option<usize> {
    Some(match data_type {
        // UINT8, INT8, BOOL
        2 | 3 | 9 => 1,
        // UINT16, INT16, FLOAT16, BFLOAT16
        4 | 5 | 10 | 16 => 2,
        // FLOAT, INT32, UINT32
        1 | 6 | 12 => 4,
        // INT64, DOUBLE, UINT64
        7 | 11 | 13 => 8,
        _ => return None,
    })
}

/// Decodes one tensor. `base_dir` is the directory external data locations are
/// relative to (the model file's directory); `None` makes external tensors an
/// error. Use a [`TensorLoader`] to decode many tensors so each external file is
/// mapped once.
pub fn decode_tensor(t: &TensorProto, base_dir: Option<&Path>) -> Result<OnnxTensor, ProtoError> {
    TensorLoader::new(base_dir).decode(t)
}

/// Decodes tensors, caching memory maps of external data files.
#[derive(Debug, Default)]
pub struct TensorLoader {
    base_dir: Option<PathBuf>,
    maps: HashMap<PathBuf, Bytes>,
}

impl TensorLoader {
    /// `base_dir`: directory external data locations are relative to.
    pub fn new(base_dir: Option<&Path>) -> Self {
        TensorLoader {
            base_dir: base_dir.map(Path::to_path_buf),
            maps: HashMap::new(),
        }
    }

    /// Loader whose base directory is the directory containing `model_path`.
    pub fn for_model_file(model_path: impl AsRef<Path>) -> Self {
        let dir = match model_path.as_ref().parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        TensorLoader {
            base_dir: Some(dir),
            maps: HashMap::new(),
        }
    }

    pub fn decode(&mut self, t: &TensorProto) -> Result<OnnxTensor, ProtoError> {
        let name = &t.name;
        let dt = t.data_type;
        if dt == 8 {
            return Err(ProtoError::StringTensor { name: name.clone() });
        }
        let Some(esize) = element_size(dt) else {
            return Err(ProtoError::UnsupportedDtype {
                name: name.clone(),
                data_type: dt,
                type_name: data_type_name(dt),
            });
        };
        if t.dims.iter().any(|&d| d < 0) {
            return Err(ProtoError::NegativeDim {
                name: name.clone(),
                dims: t.dims.clone(),
            });
        }
        let expected = t
            .dims
            .iter()
            .try_fold(esize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| ProtoError::SizeOverflow {
                name: name.clone(),
                dims: t.dims.clone(),
            })?;

        let (source_field, data) = if t.data_location == DataLocation::External as i32 {
            let b = self.external(t, expected)?;
            ("external data", TensorBytes::External(b))
        } else if !t.raw_data.is_empty() {
            ("raw_data", TensorBytes::Raw(t.raw_data.clone()))
        } else {
            let (field, b) = typed_bytes(t);
            (field, TensorBytes::Converted(b))
        };

        if data.len() != expected {
            return Err(ProtoError::SizeMismatch {
                name: name.clone(),
                type_name: data_type_name(dt),
                dims: t.dims.clone(),
                source_field,
                expected,
                actual: data.len(),
            });
        }
        Ok(OnnxTensor {
            name: name.clone(),
            data_type: dt,
            dims: t.dims.clone(),
            data,
        })
    }

    /// Resolves the external data region of `t`. Without a `length` key,
    /// `expected` bytes from `offset` are taken.
    fn external(&mut self, t: &TensorProto, expected: usize) -> Result<Bytes, ProtoError> {
        let name = &t.name;
        let bad = |reason: String| ProtoError::ExternalData {
            name: name.clone(),
            reason,
        };
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for e in &t.external_data {
            let parse = |v: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("{} '{}' is not a non-negative integer", e.key, v)))
            };
            match e.key.as_str() {
                "location" => location = Some(e.value.as_str()),
                "offset" => offset = parse(&e.value)?,
                "length" => length = Some(parse(&e.value)?),
                _ => {} // checksum, basepath, ...: ignored
            }
        }
        let location = location.ok_or_else(|| bad("missing 'location' key".into()))?;
        let rel = Path::new(location);
        if location.is_empty()
            || !rel
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(bad(format!(
                "location '{location}' must be a relative path inside the model directory \
                 (no '..', no absolute path)"
            )));
        }
        let base = self.base_dir.as_ref().ok_or_else(|| {
            bad(format!(
                "location '{location}' given but no base directory to resolve it against"
            ))
        })?;
        let path = base.join(rel);
        let file = match self.maps.get(&path) {
            Some(b) => b.clone(),
            None => {
                let b = crate::map_file(&path).map_err(|e| match e {
                    ProtoError::Io { path, source } => ProtoError::ExternalIo {
                        name: name.clone(),
                        path,
                        source,
                    },
                    other => other,
                })?;
                self.maps.insert(path.clone(), b.clone());
                b
            }
        };
        let file_len = file.len() as u64;
        let length = length.unwrap_or(expected as u64);
        let end = offset.checked_add(length);
        match end {
            Some(end) if end <= file_len => Ok(file.slice(offset as usize..end as usize)),
            _ => Err(ProtoError::ExternalRange {
                name: name.clone(),
                path,
                offset,
                length,
                file_len,
            }),
        }
    }
}

/// Packs the typed field the schema assigns to `t.data_type` (which must be a
/// supported type) into little-endian bytes.
fn typed_bytes(t: &TensorProto) -> (&'static str, Bytes) {
    fn pack<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Bytes {
        let mut out = Vec::with_capacity(v.len() * N);
        for &x in v {
            out.extend_from_slice(&f(x));
        }
        Bytes::from(out)
    }
    match t.data_type {
        1 => ("float_data", pack(&t.float_data, f32::to_le_bytes)),
        11 => ("double_data", pack(&t.double_data, f64::to_le_bytes)),
        6 => ("int32_data", pack(&t.int32_data, i32::to_le_bytes)),
        // INT8 / UINT8: low byte of the int32 (two's complement for INT8).
        2 | 3 => ("int32_data", pack(&t.int32_data, |x| [x as u8])),
        9 => ("int32_data", pack(&t.int32_data, |x| [(x != 0) as u8])),
        // INT16 / UINT16 / FLOAT16 / BFLOAT16: low 16 bits.
        4 | 5 | 10 | 16 => (
            "int32_data",
            pack(&t.int32_data, |x| (x as u16).to_le_bytes()),
        ),
        7 => ("int64_data", pack(&t.int64_data, i64::to_le_bytes)),
        13 => ("uint64_data", pack(&t.uint64_data, u64::to_le_bytes)),
        12 => (
            "uint64_data",
            pack(&t.uint64_data, |x| (x as u32).to_le_bytes()),
        ),
        _ => unreachable!("typed_bytes called with unsupported dtype {}", t.data_type),
    }
}
