//! ONNX importer: turns an ONNX `ModelProto` into a rafter [`Graph`].
//!
//! * Default-domain opsets [`MIN_OPSET`]`..=`[`MAX_OPSET`]. Version differences are erased:
//!   attributes that later became inputs (Slice-1, Pad-2, Clip-6, Reduce*, Squeeze, Split,
//!   TopK, Upsample, Reshape-1) become constant operands, pre-13 Softmax coercion to 2-D is
//!   spelled out, variadic Sum/Max/Min/Mean become chains of binary ops, Dropout becomes
//!   Identity. Before opset 7, binary ops broadcast only with `broadcast=1` and line the
//!   second operand up with the first from `axis` on: it gets trailing unit dims so NumPy
//!   broadcasting does the same; PRelu's 1-D slope is per channel. Legacy attributes the
//!   translation does not understand are errors, never dropped (`consumed_inputs`, a memory
//!   hint, is the one ignored).
//! * Graph inputs keep their `dim_param`s as symbols; initializers and Constant nodes become
//!   constants sharing the model file's bytes (the file is memory-mapped).
//! * Each ONNX op type is one registration (`ops::registry`), in its family's table beside
//!   the code that builds it (`ops/elementwise.rs`, `ops/movement.rs`, ...): the one list of
//!   what is imported, read by the importer and by [`check_support`] alike.
//! * Nodes are imported in dependency order (ONNX requires sorted nodes; we sort anyway and
//!   report cycles). Each node is added with [`rafter_ir::builder::wire`], the path every
//!   frontend's graph builder takes ([`rafter_ir::GraphBuilder`]): its result types come from
//!   [`rafter_ir::infer::infer_node`], which also tracks shape arithmetic symbolically.
//! * If/Loop/Scan bodies reference outer values implicitly in ONNX; here those captures are
//!   explicit operands and body inputs (outer constants are copied into the body instead).
//! * Anything outside the IR's op set is an [`ImportError::UnsupportedOp`]; [`check_support`]
//!   lists every such node of a model without stopping at the first.

mod convert;
mod error;
mod import;
mod node;
mod ops;
mod support;

#[cfg(test)]
mod tests;

pub use convert::dtype_from_onnx;
pub use error::{ImportError, Unsupported};
pub use rafter_ir::builder::InferFn;
pub use support::check_support;

use bytes::Bytes;
use rafter_ir::Graph;
use rafter_onnx_proto::{Message, ModelProto};
use std::path::Path;

/// Oldest default-domain opset the importer accepts.
pub const MIN_OPSET: i64 = 1;
/// Newest default-domain opset the importer accepts.
pub const MAX_OPSET: i64 = 28;

/// An imported model.
#[derive(Clone, Debug)]
pub struct Imported {
    pub graph: Graph,
    /// The default-domain opset the model was written against.
    pub opset: i64,
    pub ir_version: i64,
    /// `producer_name` of the model (e.g. `pytorch`).
    pub producer: String,
    pub producer_version: String,
    /// Every `(domain, version)` the model imports.
    pub opsets: Vec<(String, i64)>,
}

/// Imports an `.onnx` file. The file is memory-mapped and weights stay slices of the map;
/// external data is resolved relative to the file's directory.
pub fn import_onnx_file(path: &Path) -> Result<Imported, ImportError> {
    let file = path.display().to_string();
    let bytes = rafter_onnx_proto::map_file(path).map_err(|e| match e {
        rafter_onnx_proto::ProtoError::Io { source, .. } => ImportError::Io {
            file: file.clone(),
            source,
        },
        other => ImportError::Model {
            file: file.clone(),
            msg: other.to_string(),
        },
    })?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    import_onnx_bytes(bytes, Some(&base), &file)
}

/// Imports a serialized model held in `bytes` (weights stay slices of it). `base_dir`
/// resolves external data (`None`: external tensors are an error); `source_name` names the
/// model in errors.
pub fn import_onnx_bytes(
    bytes: Bytes,
    base_dir: Option<&Path>,
    source_name: &str,
) -> Result<Imported, ImportError> {
    import_onnx_bytes_with(
        bytes,
        base_dir,
        source_name,
        Box::new(|op, ins, n, fresh| rafter_ir::infer::infer_node(op, ins, n, fresh)),
    )
}

/// [`check_support`] for a model file (memory-mapped and decoded first).
pub fn check_support_file(path: &Path) -> Result<Vec<Unsupported>, ImportError> {
    let file = path.display().to_string();
    let bytes = rafter_onnx_proto::map_file(path).map_err(|e| match e {
        rafter_onnx_proto::ProtoError::Io { source, .. } => ImportError::Io {
            file: file.clone(),
            source,
        },
        other => ImportError::Model {
            file: file.clone(),
            msg: other.to_string(),
        },
    })?;
    Ok(check_support(&decode_onnx(bytes, &file)?))
}

/// Decodes a model, naming `source_name` in the error.
pub fn decode_onnx(bytes: Bytes, source_name: &str) -> Result<ModelProto, ImportError> {
    ModelProto::decode(bytes).map_err(|source| ImportError::Decode {
        file: source_name.to_string(),
        source,
    })
}

/// Imports an already decoded model.
pub fn import_onnx_model(
    model: &ModelProto,
    base_dir: Option<&Path>,
    source_name: &str,
) -> Result<Imported, ImportError> {
    import::import_model(
        model,
        source_name,
        base_dir,
        Box::new(|op, ins, n, fresh| rafter_ir::infer::infer_node(op, ins, n, fresh)),
    )
}

/// [`import_onnx_bytes`] with a different shape-inference function (for tests and tools
/// that want to look at the importer's translation on its own).
#[doc(hidden)]
pub fn import_onnx_bytes_with(
    bytes: Bytes,
    base_dir: Option<&Path>,
    source_name: &str,
    infer: Box<InferFn<'_>>,
) -> Result<Imported, ImportError> {
    let model = decode_onnx(bytes, source_name)?;
    import::import_model(&model, source_name, base_dir, infer)
}
