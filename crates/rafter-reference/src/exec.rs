//! Runs a graph node by node on host tensors.

use crate::ops::{self, OpCtx, OpError};
use crate::Tensor;
pub use rafter_ir::Bindings;
use rafter_ir::{Graph, ValueDef, ValueId};

/// Why a run failed, naming the input, node or result concerned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("expected {expected} inputs, got {actual}")]
    InputCount { expected: usize, actual: usize },
    #[error("input `{name}`: {msg}")]
    Input { name: String, msg: String },
    #[error("node `{node}` ({op}): unsupported: {msg}")]
    Unsupported {
        node: String,
        op: &'static str,
        msg: String,
    },
    #[error("node `{node}` ({op}): {msg}")]
    Op {
        node: String,
        op: &'static str,
        msg: String,
    },
    #[error("node `{node}` ({op}) result `{value}`: {msg}")]
    Result {
        node: String,
        op: &'static str,
        value: String,
        msg: String,
    },
}

impl ExecError {
    /// Whether the failure is a missing capability (op, dtype or mode), not a wrong result.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, ExecError::Unsupported { .. })
    }
}

/// Runs `graph` on `inputs` (in the order of `graph.inputs`) and returns its outputs.
pub fn run(graph: &Graph, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, ExecError> {
    run_with(graph, inputs, &mut Bindings::default())
}

/// Like [`run`], with symbols already bound (and binding the rest into `bindings`).
pub fn run_with(
    graph: &Graph,
    inputs: Vec<Tensor>,
    bindings: &mut Bindings,
) -> Result<Vec<Tensor>, ExecError> {
    if inputs.len() != graph.inputs.len() {
        return Err(ExecError::InputCount {
            expected: graph.inputs.len(),
            actual: inputs.len(),
        });
    }
    let mut env: Vec<Option<Tensor>> = vec![None; graph.values.len()];
    for (&id, t) in graph.inputs.iter().zip(inputs) {
        let v = graph.value(id);
        bindings
            .check(&v.ty, &t, &format!("input `{}`", v.name))
            .map_err(|msg| ExecError::Input {
                name: v.name.clone(),
                msg,
            })?;
        env[id.0 as usize] = Some(t);
    }
    let last_use = last_uses(graph);
    for (ni, node) in graph.nodes.iter().enumerate() {
        for &id in node.inputs.iter().flatten() {
            materialise_const(graph, &mut env, id);
        }
        let args: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|i| i.map(|id| value_of(graph, &env, id)))
            .collect();
        let ctx = OpCtx { graph, node };
        let results = ops::eval(&node.op, &args, &ctx).map_err(|e| match e {
            OpError::Unsupported(msg) => ExecError::Unsupported {
                node: node.name.clone(),
                op: node.op.name(),
                msg,
            },
            OpError::Invalid(msg) => ExecError::Op {
                node: node.name.clone(),
                op: node.op.name(),
                msg,
            },
        })?;
        store_results(graph, node, results, bindings, &mut env)?;
        for id in node.inputs.iter().flatten() {
            if last_use[id.0 as usize] == Some(ni) && !graph.outputs.contains(id) {
                env[id.0 as usize] = None;
            }
        }
    }
    for &id in &graph.outputs {
        materialise_const(graph, &mut env, id);
    }
    Ok(graph
        .outputs
        .iter()
        .map(|&id| value_of(graph, &env, id).clone())
        .collect())
}

/// Copies a constant into the environment the first time it is read; it is freed after
/// its last use like any other value.
fn materialise_const(graph: &Graph, env: &mut [Option<Tensor>], id: ValueId) {
    if let (None, ValueDef::Const(c)) = (&env[id.0 as usize], graph.value(id).def) {
        env[id.0 as usize] = Some(Tensor::from_const(graph.constant(c)));
    }
}

/// The tensor for a value. The verifier guarantees definition before use, and values are
/// freed only after their last use, so a missing value is an executor bug.
fn value_of<'a>(graph: &'a Graph, env: &'a [Option<Tensor>], id: ValueId) -> &'a Tensor {
    env[id.0 as usize].as_ref().unwrap_or_else(|| {
        panic!(
            "value `{}` read before definition or after free",
            graph.value(id).name
        )
    })
}

fn store_results(
    graph: &Graph,
    node: &rafter_ir::Node,
    results: Vec<Option<Tensor>>,
    bindings: &mut Bindings,
    env: &mut [Option<Tensor>],
) -> Result<(), ExecError> {
    let mut results = results.into_iter();
    for out in &node.outputs {
        let produced = results.next().flatten();
        let Some(id) = *out else { continue };
        let v = graph.value(id);
        let err = |msg: String| ExecError::Result {
            node: node.name.clone(),
            op: node.op.name(),
            value: v.name.clone(),
            msg,
        };
        let t = produced.ok_or_else(|| err("the op produced no value for this result".into()))?;
        bindings.check(&v.ty, &t, "result").map_err(err)?;
        env[id.0 as usize] = Some(t);
    }
    Ok(())
}

/// For each value, the index of the last node that reads it.
fn last_uses(graph: &Graph) -> Vec<Option<usize>> {
    let mut last = vec![None; graph.values.len()];
    for (ni, node) in graph.nodes.iter().enumerate() {
        for id in node.inputs.iter().flatten() {
            last[id.0 as usize] = Some(ni);
        }
    }
    last
}
