//! What the importer supports, checked statically: shared by the importer (before it
//! translates a node) and by [`check_support`] (which walks a whole model and reports every
//! problem instead of stopping at the first).

use crate::convert::{dtype_from_onnx, value_info_type};
use crate::import::model_opset;
use crate::node::{attr_graphs, is_contrib_domain, is_default_domain, is_known_domain, NodeView};
use crate::ops::registry::{self, OnnxOp};
use crate::{Unsupported, MAX_OPSET};
use rafter_onnx_proto::{GraphProto, ModelProto};
use std::collections::HashSet;

/// Why a default-domain op type the registry does not have is not imported.
fn unknown_op_reason(op: &str) -> String {
    let why = if op.starts_with("Sequence")
        || matches!(
            op,
            "SplitToSequence" | "ConcatFromSequence" | "ReverseSequenceMap"
        ) {
        "sequence values are not supported"
    } else if op.starts_with("Optional") {
        "optional values are not supported"
    } else if op.starts_with("String")
        || matches!(
            op,
            "RegexFullMatch" | "TfIdfVectorizer" | "StringNormalizer"
        )
    {
        "string tensors are not supported"
    } else if op.starts_with("Random") || matches!(op, "Bernoulli" | "Multinomial") {
        "random number generation is not supported"
    } else if op == "ImageDecoder" {
        "image decoding is not supported"
    } else {
        "not in rafter's op set"
    };
    format!("unsupported op `{op}`: {why}")
}

/// The node's registration, after the problems visible without importing: an op type the
/// registry does not have, and what the op's own static check finds (attribute values
/// rafter does not handle). `Err` holds the reason.
pub(crate) fn static_check(n: &NodeView<'_>) -> Result<&'static OnnxOp, String> {
    let op = n.op_type();
    let domain = &n.p.domain;
    let Some(registered) = registry::lookup(op, domain) else {
        return Err(if is_default_domain(domain) {
            unknown_op_reason(op)
        } else if is_contrib_domain(domain) {
            format!("unsupported op `{op}` in domain `{domain}` (not among the contrib ops rafter translates; see docs/contrib-ops.md)")
        } else {
            format!("unsupported op in domain `{domain}`")
        });
    };
    if let Some(check) = registered.check {
        check(n)?;
    }
    Ok(registered)
}

/// Every node of `model` (subgraphs included) and every graph input the importer would
/// reject, each with its reason. Problems only visible while importing (an `axes` operand
/// computed at run time, shape errors) are not found here, except an `axes` operand that is
/// directly a graph input.
pub fn check_support(model: &ModelProto) -> Vec<Unsupported> {
    let mut out = Vec::new();
    let model_level = |reason: String| Unsupported {
        graph: String::new(),
        node: String::new(),
        op_type: String::new(),
        domain: String::new(),
        reason,
    };
    let opset = match model_opset(model, "") {
        Ok(v) => v,
        Err(e) => {
            // Drop the (empty) file prefix of the message.
            let msg = e.to_string();
            out.push(model_level(msg.trim_start_matches(": ").to_string()));
            model
                .opset_import
                .iter()
                .filter(|o| is_default_domain(&o.domain))
                .map(|o| o.version)
                .max()
                .unwrap_or(MAX_OPSET)
        }
    };
    let Some(gp) = &model.graph else {
        out.push(model_level("the model has no graph".into()));
        return out;
    };
    let inits: HashSet<&str> = gp.initializer.iter().map(|t| t.name.as_str()).collect();
    for vi in &gp.input {
        if inits.contains(vi.name.as_str()) {
            continue;
        }
        if let Err(reason) = value_info_type(vi) {
            out.push(Unsupported {
                graph: gp.name.clone(),
                node: vi.name.clone(),
                op_type: "<input>".into(),
                domain: String::new(),
                reason,
            });
        }
    }
    let functions: HashSet<&str> = model.functions.iter().map(|f| f.domain.as_str()).collect();
    walk(gp, &gp.name, opset, &functions, &mut out);
    out
}

fn walk(
    gp: &GraphProto,
    graph: &str,
    opset: i64,
    functions: &HashSet<&str>,
    out: &mut Vec<Unsupported>,
) {
    for s in &gp.sparse_initializer {
        let name = s
            .values
            .as_ref()
            .map(|v| v.name.clone())
            .unwrap_or_default();
        out.push(Unsupported {
            graph: graph.to_string(),
            node: name,
            op_type: "<input>".into(),
            domain: String::new(),
            reason: "sparse initializers are not supported".into(),
        });
    }
    for t in &gp.initializer {
        if let Err(reason) = dtype_from_onnx(t.data_type) {
            out.push(Unsupported {
                graph: graph.to_string(),
                node: t.name.clone(),
                op_type: "<input>".into(),
                domain: String::new(),
                reason: format!("initializer: {reason}"),
            });
        }
    }
    for (i, p) in gp.node.iter().enumerate() {
        let n = NodeView::new(p, i, opset, "");
        let mut push = |reason: String| {
            out.push(Unsupported {
                graph: graph.to_string(),
                node: n.name.clone(),
                op_type: p.op_type.clone(),
                domain: p.domain.clone(),
                reason,
            })
        };
        if !is_known_domain(&p.domain) {
            if functions.contains(p.domain.as_str()) {
                push(format!(
                    "unsupported op in domain `{}` (model-local functions are not supported)",
                    p.domain
                ));
            } else {
                push(format!("unsupported op in domain `{}`", p.domain));
            }
        } else if let Err(reason) = static_check(&n) {
            push(reason);
        }
        for (attr, sub) in attr_graphs(p) {
            walk(
                sub,
                &format!("{graph}/{}/{attr}", n.name),
                opset,
                functions,
                out,
            );
        }
    }
}
