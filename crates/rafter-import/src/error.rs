//! Import errors. Every variant names the file, and where it applies the node (name and
//! op type), the input or initializer, or the dim it is about.

use rafter_onnx_proto::{DecodeError, ProtoError};
use std::fmt;

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not a protobuf `ModelProto` (truncated file, random bytes, ...).
    #[error("{file}: not a valid ONNX model: {source}")]
    Decode {
        file: String,
        #[source]
        source: DecodeError,
    },

    /// A model-level problem (no graph, no default-domain opset, ...).
    #[error("{file}: {msg}")]
    Model { file: String, msg: String },

    /// The default-domain opset is outside the supported range.
    #[error("{file}: opset {version} is {}", opset_msg(*.version))]
    UnsupportedOpset { file: String, version: i64 },

    #[error(
        "{file}: node `{node}` ({op_type}) input `{input}` is not defined by any node, \
         initializer or graph input"
    )]
    UndefinedInput {
        file: String,
        node: String,
        op_type: String,
        input: String,
    },

    #[error(
        "{file}: graph `{graph}` output `{name}` is not defined by any node, initializer or \
         graph input"
    )]
    UndefinedOutput {
        file: String,
        graph: String,
        name: String,
    },

    /// A tensor (initializer, Constant value, attribute) could not be decoded, e.g. its data
    /// size disagrees with its dims. `what` says which tensor.
    #[error("{file}: {what}: {source}")]
    Tensor {
        file: String,
        what: String,
        #[source]
        source: Box<ProtoError>,
    },

    /// An op, an op version or an attribute value rafter does not import.
    #[error("{file}: node `{node}` ({op_type}): {reason}")]
    UnsupportedOp {
        file: String,
        node: String,
        op_type: String,
        domain: String,
        reason: String,
    },

    /// A graph input (or initializer) of a type rafter cannot represent.
    #[error("{file}: graph input `{name}`: {reason}")]
    UnsupportedInput {
        file: String,
        name: String,
        reason: String,
    },

    /// The nodes cannot be ordered; `nodes` lists the nodes on one cycle, each as
    /// ``"`name` (OpType)"``.
    #[error("{file}: graph `{graph}` has a cycle: {}", cycle_text(.nodes))]
    Cycle {
        file: String,
        graph: String,
        nodes: Vec<String>,
    },

    /// Shape inference rejected a node.
    #[error("{file}: node `{node}` ({op_type}): shape inference failed: {msg}")]
    Shape {
        file: String,
        node: String,
        op_type: String,
        msg: String,
    },

    /// A node is malformed (missing required input or attribute, bad attribute value).
    #[error("{file}: node `{node}` ({op_type}): {msg}")]
    InvalidNode {
        file: String,
        node: String,
        op_type: String,
        msg: String,
    },

    /// The imported graph failed `rafter_ir::verify` (an importer bug).
    #[error("{file}: imported graph is malformed: {source}")]
    Verify {
        file: String,
        #[source]
        source: Box<rafter_ir::VerifyError>,
    },
}

fn opset_msg(version: i64) -> String {
    if version < crate::MIN_OPSET {
        format!("older than the oldest supported ({})", crate::MIN_OPSET)
    } else {
        format!("newer than the newest supported ({})", crate::MAX_OPSET)
    }
}

fn cycle_text(nodes: &[String]) -> String {
    let mut s = nodes.join(" -> ");
    if let Some(first) = nodes.first() {
        s.push_str(" -> ");
        s.push_str(first);
    }
    s
}

/// One thing [`crate::check_support`] found that the importer would reject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// Name of the graph the node is in (subgraphs are named `outer/node/attr`).
    pub graph: String,
    /// The node's name (generated as `OpType_<index>` when the model leaves it empty), or
    /// the graph input's name, or empty for model-level problems.
    pub node: String,
    /// The op type; `<input>` for a graph input, empty for model-level problems.
    pub op_type: String,
    pub domain: String,
    pub reason: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op_type.is_empty() {
            write!(f, "{}", self.reason)
        } else if self.op_type == "<input>" {
            write!(f, "graph input `{}`: {}", self.node, self.reason)
        } else {
            write!(
                f,
                "node `{}` ({}): {}",
                self.node, self.op_type, self.reason
            )
        }
    }
}

impl ImportError {
    /// Whether the model uses something rafter does not support (an op, opset, dtype or input
    /// kind), as opposed to a malformed model or an importer bug.
    pub fn is_unsupported(&self) -> bool {
        match self {
            ImportError::UnsupportedOp { .. }
            | ImportError::UnsupportedOpset { .. }
            | ImportError::UnsupportedInput { .. } => true,
            ImportError::Shape { msg, .. } => {
                msg.starts_with(rafter_ir::infer::DATA_DEPENDENT_RANK)
            }
            ImportError::Tensor { source, .. } => matches!(
                **source,
                rafter_onnx_proto::ProtoError::StringTensor { .. }
                    | rafter_onnx_proto::ProtoError::UnsupportedDtype { .. }
            ),
            _ => false,
        }
    }
}
