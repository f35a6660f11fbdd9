//! rafter's graph IR.
//!
//! A model enters rafter as a [`Graph`]: typed SSA values whose shapes may be symbolic
//! ([`Dim`]), nodes drawn from a closed op set ([`Op`]) with typed attributes, and constants
//! kept in their own table ([`ConstData`], zero-copy over the model file). Everything later
//! (passes, partitioning, code generation, the reference executor) reads this form.

pub mod arena;
mod at_values;
pub mod attr;
mod bindings;
pub mod builder;
mod constant;
mod dim;
mod dtype;
mod graph;
pub mod infer;
pub mod npy;
mod op;
pub mod program;
pub mod program_text;
pub mod rnn_activation;
pub mod symbol_def;
pub mod text;
mod types;
pub mod verify;
mod weight;

pub use at_values::check_at_values;
pub use attr::{AttrType, AttrValue, Scalar};
pub use bindings::{Bindings, Shaped};
pub use builder::{GraphBuilder, WireError};
pub use constant::{ConstData, ConstSizeError};
pub use dim::{is_identifier, sanitize_identifier, Dim, DimError, Symbol};
pub use dtype::DType;
pub use graph::{ConstId, Graph, Node, NodeId, StateLink, Value, ValueDef, ValueId};
pub use op::*;
pub use symbol_def::{bind_defined, InputValues, SymbolDef, SymbolExpr};
pub use types::TensorType;
pub use verify::{verify, VerifyError};
pub use weight::WeightFormat;
