//! A view of one ONNX node: its display name, typed attribute access, and error builders
//! that name the file and the node.

use crate::ImportError;
use rafter_onnx_proto::attribute_proto::AttributeType;
use rafter_onnx_proto::{AttributeProto, GraphProto, NodeProto, TensorProto};
use std::cell::RefCell;
use std::collections::HashSet;

/// The name a node is reported under: its own, or `OpType_<index>` when it has none.
pub(crate) fn display_name(p: &NodeProto, index: usize) -> String {
    if p.name.is_empty() {
        format!("{}_{}", p.op_type, index)
    } else {
        p.name.clone()
    }
}

/// Whether a node domain is the default ONNX domain.
pub(crate) fn is_default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// Whether a node domain is `ai.onnx.ml`, whose ops are checked against their own list.
pub(crate) fn is_ml_domain(d: &str) -> bool {
    d == "ai.onnx.ml"
}

/// Whether a node domain is `com.microsoft`, ONNX Runtime's contrib ops (opset 1), checked
/// against their own list.
pub(crate) fn is_contrib_domain(d: &str) -> bool {
    d == "com.microsoft"
}

/// Whether the importer has a registry for the node domain at all.
pub(crate) fn is_known_domain(d: &str) -> bool {
    is_default_domain(d) || is_ml_domain(d) || is_contrib_domain(d)
}

/// Attributes that only tune precision or training and change nothing the IR expresses.
/// (`consumed_inputs`, before opset 6, only hinted which inputs may be overwritten in
/// place. Legacy `is_test` and `spatial` do change results: the translations read them.)
const IGNORED_ATTRS: &[&str] = &[
    "stash_type",
    "softmax_precision",
    "saturate",
    "round_mode",
    "momentum",
    "seed",
    "ratio",
    "consumed_inputs",
];

pub(crate) struct NodeView<'a> {
    pub p: &'a NodeProto,
    /// Display name (see [`display_name`]).
    pub name: String,
    /// The model's default-domain opset.
    pub opset: i64,
    pub file: &'a str,
    /// Attribute names the translation looked at.
    pub used: RefCell<HashSet<String>>,
}

impl<'a> NodeView<'a> {
    pub fn new(p: &'a NodeProto, index: usize, opset: i64, file: &'a str) -> NodeView<'a> {
        NodeView {
            p,
            name: display_name(p, index),
            opset,
            file,
            used: RefCell::new(HashSet::new()),
        }
    }

    /// The first attribute the translation did not look at (and that is not a known
    /// precision or training knob): a meaning the import would silently drop.
    pub fn unread_attr(&self) -> Option<&'a str> {
        let used = self.used.borrow();
        self.p
            .attribute
            .iter()
            .map(|a| a.name.as_str())
            .find(|n| !used.contains(*n) && !IGNORED_ATTRS.contains(n))
    }

    pub fn op_type(&self) -> &str {
        &self.p.op_type
    }

    // ---- errors ----

    pub fn invalid(&self, msg: impl Into<String>) -> ImportError {
        ImportError::InvalidNode {
            file: self.file.to_string(),
            node: self.name.clone(),
            op_type: self.p.op_type.clone(),
            msg: msg.into(),
        }
    }

    pub fn unsupported(&self, reason: impl Into<String>) -> ImportError {
        ImportError::UnsupportedOp {
            file: self.file.to_string(),
            node: self.name.clone(),
            op_type: self.p.op_type.clone(),
            domain: self.p.domain.clone(),
            reason: reason.into(),
        }
    }

    pub fn shape_err(&self, msg: impl Into<String>) -> ImportError {
        ImportError::Shape {
            file: self.file.to_string(),
            node: self.name.clone(),
            op_type: self.p.op_type.clone(),
            msg: msg.into(),
        }
    }

    // ---- inputs and outputs ----

    /// The name of input `i`, if present and not the empty "absent" marker.
    pub fn input_name(&self, i: usize) -> Option<&'a str> {
        self.p
            .input
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    pub fn num_inputs(&self) -> usize {
        self.p.input.len()
    }

    /// The output names, `None` for absent optional outputs. Trailing absent outputs are
    /// kept so positions stay aligned with the op's result list.
    pub fn out_names(&self) -> Vec<Option<String>> {
        self.p
            .output
            .iter()
            .map(|s| (!s.is_empty()).then(|| s.clone()))
            .collect()
    }

    pub fn has_output(&self, i: usize) -> bool {
        self.p.output.get(i).is_some_and(|s| !s.is_empty())
    }

    // ---- attributes ----

    pub fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        self.used.borrow_mut().insert(name.to_string());
        self.p.attribute.iter().find(|a| a.name == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    fn attr_type(a: &AttributeProto) -> AttributeType {
        AttributeType::try_from(a.r#type).unwrap_or(AttributeType::Undefined)
    }

    fn wrong(&self, a: &AttributeProto, want: &str) -> ImportError {
        self.invalid(format!(
            "attribute `{}` should be {want}, found {:?}",
            a.name,
            Self::attr_type(a)
        ))
    }

    pub fn i_opt(&self, name: &str) -> Result<Option<i64>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::Int | AttributeType::Undefined => Ok(Some(a.i)),
            _ => Err(self.wrong(a, "an int")),
        }
    }

    pub fn i(&self, name: &str, default: i64) -> Result<i64, ImportError> {
        Ok(self.i_opt(name)?.unwrap_or(default))
    }

    pub fn flag(&self, name: &str, default: bool) -> Result<bool, ImportError> {
        Ok(self.i(name, default as i64)? != 0)
    }

    pub fn i_req(&self, name: &str) -> Result<i64, ImportError> {
        self.i_opt(name)?
            .ok_or_else(|| self.invalid(format!("missing required attribute `{name}`")))
    }

    pub fn f_opt(&self, name: &str) -> Result<Option<f32>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::Float | AttributeType::Undefined => Ok(Some(a.f)),
            AttributeType::Int => Ok(Some(a.i as f32)),
            _ => Err(self.wrong(a, "a float")),
        }
    }

    pub fn f(&self, name: &str, default: f32) -> Result<f32, ImportError> {
        Ok(self.f_opt(name)?.unwrap_or(default))
    }

    pub fn s_opt(&self, name: &str) -> Result<Option<String>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::String | AttributeType::Undefined => {
                Ok(Some(String::from_utf8_lossy(&a.s).into_owned()))
            }
            _ => Err(self.wrong(a, "a string")),
        }
    }

    pub fn s(&self, name: &str, default: &str) -> Result<String, ImportError> {
        Ok(self.s_opt(name)?.unwrap_or_else(|| default.to_string()))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::Ints | AttributeType::Undefined => Ok(Some(a.ints.clone())),
            _ => Err(self.wrong(a, "a list of ints")),
        }
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::Floats | AttributeType::Undefined => Ok(Some(a.floats.clone())),
            AttributeType::Ints => Ok(Some(a.ints.iter().map(|&i| i as f32).collect())),
            _ => Err(self.wrong(a, "a list of floats")),
        }
    }

    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match Self::attr_type(a) {
            AttributeType::Strings | AttributeType::Undefined => Ok(Some(
                a.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )),
            _ => Err(self.wrong(a, "a list of strings")),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>, ImportError> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        match (Self::attr_type(a), &a.t) {
            (AttributeType::Tensor | AttributeType::Undefined, Some(t)) => Ok(Some(t)),
            _ => Err(self.wrong(a, "a tensor")),
        }
    }

    pub fn graph(&self, name: &str) -> Result<&'a GraphProto, ImportError> {
        let a = self
            .attr(name)
            .ok_or_else(|| self.invalid(format!("missing required attribute `{name}`")))?;
        match (Self::attr_type(a), &a.g) {
            (AttributeType::Graph | AttributeType::Undefined, Some(g)) => Ok(g),
            _ => Err(self.wrong(a, "a graph")),
        }
    }
}

/// Every graph held by a node's attributes, with the attribute name.
pub(crate) fn attr_graphs(p: &NodeProto) -> Vec<(&str, &GraphProto)> {
    let mut out = Vec::new();
    for a in &p.attribute {
        if let Some(g) = &a.g {
            out.push((a.name.as_str(), g));
        }
        for g in &a.graphs {
            out.push((a.name.as_str(), g));
        }
    }
    out
}
