//! What the importer supports, checked statically: shared by the importer (before it
//! translates a node) and by [`check_support`] (which walks a whole model and reports every
//! problem instead of stopping at the first).

use crate::convert::{dtype_from_onnx, value_info_type};
use crate::import::model_opset;
use crate::node::{attr_graphs, is_default_domain, is_ml_domain, NodeView};
use crate::ops::{ML_SUPPORTED, SUPPORTED};
use crate::{Unsupported, MAX_OPSET};
use rafter_onnx_proto::{GraphProto, ModelProto};
use std::collections::HashSet;

/// Why a default-domain op type outside [`SUPPORTED`] is not imported.
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

/// Problems visible without importing: unknown ops, version-specific forms and attribute
/// values rafter does not handle. `Err` holds the reason.
pub(crate) fn static_check(n: &NodeView<'_>) -> Result<(), String> {
    let op = n.op_type();
    if is_ml_domain(&n.p.domain) {
        if !ML_SUPPORTED.contains(&op) {
            return Err(format!("unsupported op in domain `{}`", n.p.domain));
        }
    } else if !SUPPORTED.contains(&op) {
        return Err(unknown_op_reason(op));
    }
    let attr_i = |name: &str| n.attr(name).map(|a| a.i);
    let attr_s = |name: &str| {
        n.attr(name)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    };
    match op {
        "BatchNormalization" => {
            if attr_i("training_mode") == Some(1) {
                return Err(
                    "unsupported: training_mode=1 (only inference batch norm is supported)".into(),
                );
            }
            if n.opset < 7 && attr_i("is_test").unwrap_or(0) == 0 {
                return Err(
                    "unsupported: is_test=0 (training mode: normalises with the batch's own \
                     statistics; only inference batch norm is supported)"
                        .into(),
                );
            }
            if (1..n.p.output.len()).any(|i| n.has_output(i)) {
                return Err(
                    "unsupported: training outputs (running or saved mean/variance) are requested"
                        .into(),
                );
            }
        }
        "Scan" if n.opset < 9 => {
            return Err(
                "unsupported: Scan-8 (batched, with sequence_lens); Scan from opset 9 is supported"
                    .into(),
            )
        }
        "Cast" => {
            if let Ok(to) = crate::ops::cast_to_code(n) {
                dtype_from_onnx(to).map_err(|e| format!("unsupported: cast to {e}"))?;
            }
        }
        "Dropout" if n.opset < 7 => {
            let ratio = n.attr("ratio").map_or(0.5, |a| a.f);
            if attr_i("is_test").unwrap_or(0) == 0 && ratio != 0.0 {
                return Err(
                    "unsupported: is_test=0 (training mode: zeroes random elements)".into(),
                );
            }
        }
        "BitCast" => {
            if let Some(to) = attr_i("to") {
                dtype_from_onnx(to as i32).map_err(|e| format!("unsupported: to: {e}"))?;
            }
        }
        "HannWindow" | "HammingWindow" | "BlackmanWindow" | "MelWeightMatrix" => {
            if let Some(d) = attr_i("output_datatype") {
                dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: {e}"))?;
            }
        }
        "EyeLike" => {
            if let Some(d) = attr_i("dtype") {
                dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: {e}"))?;
            }
        }
        "QuantizeLinear" => {
            if let Some(d) = attr_i("output_dtype").filter(|&d| d != 0) {
                dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: output {e}"))?;
            }
        }
        "Constant" => {
            if n.has("sparse_value") {
                return Err("unsupported: sparse tensor constants".into());
            }
            if n.has("value_string") || n.has("value_strings") {
                return Err("unsupported: string constants".into());
            }
            if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
                dtype_from_onnx(t.data_type).map_err(|e| format!("unsupported: {e}"))?;
            }
        }
        "ConstantOfShape" => {
            if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
                dtype_from_onnx(t.data_type).map_err(|e| format!("unsupported: {e}"))?;
            }
        }
        "Resize"
            if attr_s("coordinate_transformation_mode").as_deref()
                == Some("tf_half_pixel_for_nn") =>
        {
            return Err(
                "unsupported: coordinate_transformation_mode `tf_half_pixel_for_nn`".into(),
            );
        }
        "LSTM" | "GRU" | "RNN" => {
            if let Some(a) = n.attr("activations") {
                for s in &a.strings {
                    let s = String::from_utf8_lossy(s);
                    if crate::ops::rnn_activation_index(&s).is_none() {
                        return Err(format!("unsupported: activation function `{s}`"));
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
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
        if !is_default_domain(&p.domain) && !is_ml_domain(&p.domain) {
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
