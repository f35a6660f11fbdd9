//! The registry of ONNX ops: one [`OnnxOp`] per op type, each registered in its family's
//! table beside the code that builds it (`elementwise.rs`, `movement.rs`, ...).
//!
//! The registry is the one list of what the importer translates: the importer looks an op
//! up here to translate it, [`crate::check_support`] to report it, and the registration's
//! static check (attribute values rafter does not handle, visible without importing)
//! serves both. Adding an op is one registration; nothing else lists op names.

use super::{Tr, R};
use crate::node::{is_contrib_domain, is_default_domain, is_ml_domain, NodeView};
use rafter_ir::{BinaryOp, ReduceKind, UnaryOp};

/// How a node of the op is translated.
#[derive(Clone, Copy)]
pub(crate) enum Translate {
    /// One operand, one IR unary op.
    Unary(UnaryOp),
    /// Two operands, one IR binary op (with the pre-opset-7 broadcast forms).
    Binary(BinaryOp),
    /// A reduction with its `axes` (an attribute or, from some opsets, an operand).
    Reduce(ReduceKind),
    /// Anything else: the op's own translation.
    Custom(fn(&mut Tr<'_, '_, '_>) -> R),
}

/// A problem visible without importing (an attribute value rafter does not handle): the
/// reason, as `check_support` reports it.
pub(crate) type Check = fn(&NodeView<'_>) -> Result<(), String>;

/// One ONNX op type the importer translates.
#[derive(Clone, Copy)]
pub(crate) struct OnnxOp {
    /// The op type (`Conv`).
    pub name: &'static str,
    pub translate: Translate,
    /// The static check run before translating, and by `check_support`.
    pub check: Option<Check>,
}

impl OnnxOp {
    /// An op translated by `f`.
    pub const fn new(name: &'static str, f: fn(&mut Tr<'_, '_, '_>) -> R) -> OnnxOp {
        OnnxOp {
            name,
            translate: Translate::Custom(f),
            check: None,
        }
    }

    /// An elementwise op of one operand.
    pub const fn unary(name: &'static str, op: UnaryOp) -> OnnxOp {
        OnnxOp {
            name,
            translate: Translate::Unary(op),
            check: None,
        }
    }

    /// An elementwise op of two operands.
    pub const fn binary(name: &'static str, op: BinaryOp) -> OnnxOp {
        OnnxOp {
            name,
            translate: Translate::Binary(op),
            check: None,
        }
    }

    /// A reduction.
    pub const fn reduce(name: &'static str, kind: ReduceKind) -> OnnxOp {
        OnnxOp {
            name,
            translate: Translate::Reduce(kind),
            check: None,
        }
    }

    /// This op with a static check.
    pub const fn checked(mut self, check: Check) -> OnnxOp {
        self.check = Some(check);
        self
    }
}

/// The default-domain families, in the order they are searched.
const DEFAULT_DOMAIN: &[&[OnnxOp]] = &[
    super::elementwise::OPS,
    super::normalize::OPS,
    super::contraction::OPS,
    super::pooling::OPS,
    super::movement::OPS,
    super::misc::OPS,
    super::recurrent::OPS,
    super::extra::OPS,
    super::control::OPS,
];

/// The `com.microsoft` (ONNX Runtime contrib, opset 1) families.
const CONTRIB_DOMAIN: &[&[OnnxOp]] = &[
    super::contrib::OPS,
    super::contrib_quant::OPS,
    super::contrib_attention::OPS,
    super::contrib_qlinear::OPS,
    super::contrib_conv::OPS,
    super::contrib_gather::OPS,
];

/// The registration of `op_type` in `domain` (the default domain, `ai.onnx.ml` or
/// `com.microsoft`). ONNX Runtime registers a few of its own ops in the default domain
/// (`SimplifiedLayerNormalization`); those are found in the contrib table after the
/// standard ops.
pub(crate) fn lookup(op_type: &str, domain: &str) -> Option<&'static OnnxOp> {
    let families: &[&[OnnxOp]] = if is_ml_domain(domain) {
        &[super::misc::ML_OPS]
    } else if is_contrib_domain(domain) {
        CONTRIB_DOMAIN
    } else if is_default_domain(domain) {
        DEFAULT_DOMAIN
    } else {
        &[]
    };
    let find = |families: &[&'static [OnnxOp]]| {
        families
            .iter()
            .flat_map(|f| f.iter())
            .find(|o| o.name == op_type)
    };
    find(families).or_else(|| {
        is_default_domain(domain)
            .then(|| find(&[super::contrib::ORT_DEFAULT_DOMAIN_OPS]))
            .flatten()
    })
}

/// Every registered default-domain op type.
#[cfg(test)]
pub(crate) fn default_domain_names() -> Vec<&'static str> {
    DEFAULT_DOMAIN
        .iter()
        .flat_map(|f| f.iter())
        .map(|o| o.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_type_is_registered_once() {
        let names = default_domain_names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "an op type registered twice");
        // ONNX's op set of opsets 1..=28 that rafter translates: one entry each.
        assert_eq!(names.len(), 178);
        assert!(lookup("Conv", "").is_some() && lookup("Conv", "ai.onnx.ml").is_none());
        assert!(lookup("LabelEncoder", "ai.onnx.ml").is_some());
        assert!(lookup("SequenceAt", "").is_none());
        assert!(lookup("FastGelu", "com.microsoft").is_some() && lookup("FastGelu", "").is_none());
        assert!(lookup("SimplifiedLayerNormalization", "").is_some());
        assert!(lookup("Conv", "com.microsoft").is_none());
        assert!(lookup("Conv", "org.example").is_none());
    }
}
