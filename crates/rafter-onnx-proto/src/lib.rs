//! ONNX protobuf messages (hand-written prost structs, no protoc) and zero-copy
//! loading of models and tensors.
//!
//! * [`proto`] holds the messages ([`ModelProto`], [`GraphProto`], [`TensorProto`], ...).
//!   They are re-exported at the crate root.
//! * [`decode_model`] and friends decode from a [`Bytes`] buffer. Because
//!   `TensorProto::raw_data` is a `Bytes`, prost slices the input buffer instead
//!   of copying it.
//! * [`load_model_file`] memory-maps a file and decodes it; initializer
//!   `raw_data` then points straight into the map.
//! * [`tensor`] turns a [`TensorProto`] into an [`OnnxTensor`]: dims plus
//!   little-endian packed element bytes, from whichever field (or external file)
//!   holds them.

use std::fs::File;
use std::path::{Path, PathBuf};

pub use bytes::Bytes;
pub use prost::{DecodeError, Message};

pub mod proto;
pub mod tensor;

pub use proto::*;
pub use tensor::{decode_tensor, element_size, OnnxTensor, TensorBytes, TensorLoader};

/// Errors from loading files and decoding tensors. Every variant names the file
/// or tensor it is about.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot decode {what} from {}: {source}", path.display())]
    Decode {
        path: PathBuf,
        /// Message type that was expected, e.g. `"ModelProto"`.
        what: &'static str,
        #[source]
        source: DecodeError,
    },

    #[error("tensor '{name}': unsupported dtype string (string tensors cannot be represented as packed bytes)")]
    StringTensor { name: String },

    #[error("tensor '{name}': unsupported dtype {type_name} (data_type {data_type})")]
    UnsupportedDtype {
        name: String,
        data_type: i32,
        type_name: &'static str,
    },

    #[error("tensor '{name}': negative dimension in dims {dims:?}")]
    NegativeDim { name: String, dims: Vec<i64> },

    #[error("tensor '{name}': element count of dims {dims:?} overflows")]
    SizeOverflow { name: String, dims: Vec<i64> },

    #[error(
        "tensor '{name}' ({type_name}, dims {dims:?}): expected {expected} bytes, \
         but {source_field} holds {actual} bytes"
    )]
    SizeMismatch {
        name: String,
        type_name: &'static str,
        dims: Vec<i64>,
        /// Where the data came from: `"raw_data"`, `"int32_data"`, `"external data"`, ...
        source_field: &'static str,
        expected: usize,
        actual: usize,
    },

    #[error("tensor '{name}': invalid external data: {reason}")]
    ExternalData { name: String, reason: String },

    #[error("tensor '{name}': cannot read external data file {}: {source}", path.display())]
    ExternalIo {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "tensor '{name}': external data range offset {offset} length {length} \
         lies outside {} ({file_len} bytes)", path.display()
    )]
    ExternalRange {
        name: String,
        path: PathBuf,
        offset: u64,
        length: u64,
        file_len: u64,
    },
}

/// Decodes a `ModelProto`. `raw_data` of the initializers shares `buf`.
pub fn decode_model(buf: Bytes) -> Result<ModelProto, DecodeError> {
    ModelProto::decode(buf)
}

/// Decodes a serialized `TensorProto` (e.g. a backend test `input_0.pb`).
pub fn decode_tensor_proto(buf: Bytes) -> Result<TensorProto, DecodeError> {
    TensorProto::decode(buf)
}

/// Decodes a serialized `SequenceProto` (backend test data).
pub fn decode_sequence(buf: Bytes) -> Result<SequenceProto, DecodeError> {
    SequenceProto::decode(buf)
}

/// Decodes a serialized `OptionalProto` (backend test data).
pub fn decode_optional(buf: Bytes) -> Result<OptionalProto, DecodeError> {
    OptionalProto::decode(buf)
}

/// Decodes a serialized `MapProto` (backend test data).
pub fn decode_map(buf: Bytes) -> Result<MapProto, DecodeError> {
    MapProto::decode(buf)
}

/// Memory-maps a whole file read-only and wraps the map in [`Bytes`]; the map
/// stays alive as long as any slice of the returned `Bytes` does.
///
/// # Safety invariant (not enforced)
///
/// A memory map reflects later changes to the file. If another process
/// truncates or rewrites the file while any slice of the map is alive, reads
/// may observe changed bytes or the process may be killed by `SIGBUS`. Callers
/// must not modify model / weight files while they are loaded; rafter treats
/// them as immutable inputs.
pub fn map_file(path: impl AsRef<Path>) -> Result<Bytes, ProtoError> {
    let path = path.as_ref();
    let io_err = |source| ProtoError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only and private to this process. The remaining
    // hazard is external modification/truncation of the file while mapped (see
    // the doc comment above); that is documented as the caller's contract.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
    Ok(Bytes::from_owner(map))
}

/// Memory-maps `path` and decodes it as message `M`. Returns the message and the
/// whole-file buffer it borrows from (byte fields of type `Bytes` point into it).
pub fn load_message_file<M: Message + Default>(
    path: impl AsRef<Path>,
    what: &'static str,
) -> Result<(M, Bytes), ProtoError> {
    let path = path.as_ref();
    let buf = map_file(path)?;
    let msg = M::decode(buf.clone()).map_err(|source| ProtoError::Decode {
        path: path.to_path_buf(),
        what,
        source,
    })?;
    Ok((msg, buf))
}

/// Memory-maps and decodes an `.onnx` model. Initializer `raw_data` is zero-copy.
/// For external data use [`TensorLoader::for_model_file`] with the same path.
pub fn load_model_file(path: impl AsRef<Path>) -> Result<(ModelProto, Bytes), ProtoError> {
    load_message_file(path, "ModelProto")
}

/// Memory-maps and decodes a serialized `TensorProto` (`.pb`).
pub fn load_tensor_file(path: impl AsRef<Path>) -> Result<(TensorProto, Bytes), ProtoError> {
    load_message_file(path, "TensorProto")
}

#[cfg(test)]
mod tests;
