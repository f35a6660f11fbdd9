//! [`GgufWriter`]: builds a GGUF v3 file from metadata and tensors.
//!
//! The layout is the one gguf-py's `GGUFWriter` and ggml's `gguf_write_to_file` produce:
//! header, metadata in insertion order, tensor infos in insertion order, zero padding to
//! the alignment, then each tensor's data padded to the alignment, so offsets increase
//! with no gaps but padding. llama.cpp requires exactly that (its reader rejects any other
//! offsets), so files from this writer load there too.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{ErrorKind, GgufError};
use crate::ggml_type::GgmlType;
use crate::parse::{tensor_size, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::value::{Array, ArrayItems, Value};

/// ggml keeps tensor names in a 64-byte buffer with a terminator (`GGML_MAX_NAME`).
pub const MAX_TENSOR_NAME_BYTES: usize = 63;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Bytes,
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
///
/// ```
/// use rafter_gguf::{GgmlType, GgufFile, GgufWriter};
///
/// let mut w = GgufWriter::new();
/// w.add("general.architecture", "qwen3")?;
/// w.add("qwen3.block_count", 2u32)?;
/// w.add_tensor("output_norm.weight", &[4], GgmlType::F32, vec![0u8; 16])?;
/// let file = GgufFile::from_bytes(w.to_vec()?.into())?;
/// assert_eq!(file.get_u32("qwen3.block_count")?, 2);
/// # Ok::<(), rafter_gguf::GgufError>(())
/// ```
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

fn writer_error(msg: String) -> GgufError {
    let name: Arc<str> = "<writer>".into();
    GgufError::new(&name, None, ErrorKind::Writer(msg))
}

impl GgufWriter {
    /// An empty writer with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT.into(),
        }
    }

    /// Adds a metadata entry. Keys must be non-empty and unique; `general.alignment` must
    /// be a power-of-two u32 and sets the data alignment.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self, GgufError> {
        let value = value.into();
        if key.is_empty() {
            return Err(writer_error("metadata keys must not be empty".into()));
        }
        if !self.keys.insert(key.to_string()) {
            return Err(writer_error(format!("duplicate metadata key '{key}'")));
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = a.into(),
                ref other => {
                    self.keys.remove(key);
                    return Err(writer_error(format!(
                        "'{ALIGNMENT_KEY}' must be a power-of-two u32, got {}",
                        other.describe()
                    )));
                }
            }
        }
        self.metadata.push((key.to_string(), value));
        Ok(self)
    }

    /// Adds a tensor with ggml-order `dims` (row length first) whose `data` must hold
    /// exactly the bytes its type and dims need.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Bytes>,
    ) -> Result<&mut Self, GgufError> {
        let data = data.into();
        if name.len() > MAX_TENSOR_NAME_BYTES {
            return Err(writer_error(format!(
                "tensor name '{name}' is {} bytes; ggml allows at most {MAX_TENSOR_NAME_BYTES}",
                name.len()
            )));
        }
        if dims.len() > 4 {
            return Err(writer_error(format!(
                "tensor '{name}' has {} dims; ggml allows at most 4",
                dims.len()
            )));
        }
        let (_, n_bytes) =
            tensor_size(name, dims, ty).map_err(|kind| writer_error(kind.to_string()))?;
        if data.len() as u64 != n_bytes {
            return Err(writer_error(format!(
                "tensor '{name}' ({ty}, dims {dims:?}) needs {n_bytes} bytes, got {}",
                data.len()
            )));
        }
        if !self.names.insert(name.to_string()) {
            return Err(writer_error(format!("duplicate tensor name '{name}'")));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    fn pad(&self, out: &mut Vec<u8>) {
        let rem = out.len() as u64 % self.alignment;
        if rem != 0 {
            out.resize(out.len() + (self.alignment - rem) as usize, 0);
        }
    }

    fn padded(&self, n: u64) -> u64 {
        n.div_ceil(self.alignment) * self.alignment
    }

    /// The whole file in memory.
    pub fn to_vec(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += self.padded(t.data.len() as u64);
        }
        if !self.tensors.is_empty() {
            self.pad(&mut out);
        }
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            self.pad(&mut out);
        }
        Ok(out)
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), GgufError> {
        let bytes = self.to_vec()?;
        w.write_all(&bytes)
            .map_err(|e| GgufError::new(&"<writer>".into(), None, ErrorKind::Io(e)))
    }

    /// Writes the file to `path`.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let bytes = self.to_vec()?;
        std::fs::write(path, bytes)
            .map_err(|e| GgufError::new(&path.display().to_string().into(), None, ErrorKind::Io(e)))
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.push(*v as u8),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match &a.items {
        ArrayItems::Scalars { bytes, .. } => out.extend_from_slice(bytes),
        ArrayItems::Strings(s) => out.extend_from_slice(s.raw()),
        ArrayItems::Arrays(arrays) => arrays.iter().for_each(|sub| write_array(out, sub)),
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v)
            }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
    Array => Array);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_string())
    }
}
