//! The GGUF container (versions 2 and 3): llama.cpp's model file format.
//!
//! rafter reads GGUF files to run the LLMs people download as `.gguf`; this crate is the
//! container layer only: header, metadata, tensor infos and zero-copy tensor data. What
//! the metadata *means* (architectures, hyper-parameters, tensor names) is
//! `rafter-llm`'s business, and dequantizing block types is `rafter-quant`'s.
//!
//! * [`GgufFile::open`] memory-maps a file; [`GgufFile::open_with`] can instead read its
//!   tensor data into memory backed by huge pages ([`TensorMemory::Resident`]: faster to
//!   stream, see [`read_resident`]); [`GgufFile::from_bytes`] takes any [`Bytes`]. Either
//!   way everything is validated before anything is returned: magic and version, every
//!   count against the bytes left (a hostile count cannot make the reader allocate
//!   gigabytes), string lengths and UTF-8, array nesting, duplicate keys and
//!   tensor names, dims (at most 4, product without overflow, rows of whole blocks),
//!   `general.alignment`, and each tensor's data: aligned, inside the file, overlapping
//!   no other. Errors ([`GgufError`]) name the file, the byte offset and the key or tensor.
//! * Metadata: [`GgufFile::get`] and typed getters ([`GgufFile::get_u32`],
//!   [`GgufFile::get_str`], [`GgufFile::get_string_array`], ...). Arrays are views into
//!   the file ([`StringArray`], [`TypedArray`]): a 260k-token vocabulary is not copied.
//! * Tensors: [`GgufFile::tensors`] lists [`TensorInfo`]s (name, ggml-order dims,
//!   [`GgmlType`], offset); [`GgufFile::tensor_data`] is a zero-copy slice of the map.
//! * [`GgufWriter`] writes files in the layout gguf-py and ggml write (for tests and
//!   rafter's own tools).
//!
//! The format is specified by ggml's `gguf.h`/`gguf.cpp` and gguf-py's
//! `gguf_reader.py`/`gguf_writer.py`; this is an independent implementation of it.

mod error;
mod file;
mod ggml_type;
mod parse;
mod resident;
mod tensor;
mod value;
mod writer;

pub use bytes::Bytes;
pub use error::{ErrorKind, GgufError};
pub use file::{map_file, FromValue, GgufFile, TensorMemory};
pub use ggml_type::{GgmlType, RemovedGgmlType, UnknownGgmlType};
pub use parse::{
    MetadataEntry, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_NESTED_ARRAYS, MAX_NESTING,
};
pub use resident::{read_file, read_resident};
pub use tensor::TensorInfo;
pub use value::{Array, Scalar, StringArray, TypedArray, Value, ValueType};
pub use writer::{GgufWriter, MAX_TENSOR_NAME_BYTES};
