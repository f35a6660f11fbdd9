//! Structural checks every pass and importer relies on.

use crate::{Graph, Op, ValueDef, ValueId};

/// What is wrong with a graph, naming the node or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("graph `{graph}`: value id {id} is out of range ({count} values)")]
    BadValueId {
        graph: String,
        id: u32,
        count: usize,
    },
    #[error(
        "graph `{graph}`: node `{node}` uses `{value}` before it is defined (cycle or bad order)"
    )]
    UseBeforeDef {
        graph: String,
        node: String,
        value: String,
    },
    #[error(
        "graph `{graph}`: value `{value}` says it is defined by {def}, which does not define it"
    )]
    BadDef {
        graph: String,
        value: String,
        def: String,
    },
    #[error("graph `{graph}`: node `{node}` ({op}): {msg}")]
    BadNode {
        graph: String,
        node: String,
        op: &'static str,
        msg: String,
    },
    #[error("graph `{graph}`: {msg}")]
    BadState { graph: String, msg: String },
    #[error("graph `{graph}`: constant `{value}` has {actual} bytes, its type needs {expected}")]
    BadConst {
        graph: String,
        value: String,
        expected: usize,
        actual: usize,
    },
}

/// Checks ids, single definitions, topological order, constant sizes and subgraphs.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let graph = g.name.clone();
    let count = g.values.len();
    let check_id = |id: ValueId| {
        if (id.0 as usize) < count {
            Ok(())
        } else {
            Err(VerifyError::BadValueId {
                graph: graph.clone(),
                id: id.0,
                count,
            })
        }
    };
    // A value is "defined" once its producer has been seen in order.
    let mut defined = vec![false; count];
    for (i, &v) in g.inputs.iter().enumerate() {
        check_id(v)?;
        if g.value(v).def != ValueDef::Input(i) {
            return Err(bad_def(g, v, format!("input {i}")));
        }
        defined[v.0 as usize] = true;
    }
    for (i, v) in g.values.iter().enumerate() {
        if let ValueDef::Const(c) = v.def {
            let data = g
                .constants
                .get(c.0 as usize)
                .ok_or_else(|| bad_def(g, ValueId(i as u32), format!("constant {}", c.0)))?;
            let expected = data.num_elements() * data.dtype.size_of();
            if data.bytes.len() != expected || v.ty.dtype != data.dtype {
                return Err(VerifyError::BadConst {
                    graph: graph.clone(),
                    value: v.name.clone(),
                    expected,
                    actual: data.bytes.len(),
                });
            }
            defined[i] = true;
        }
    }
    for (ni, node) in g.nodes.iter().enumerate() {
        for v in node.inputs.iter().flatten() {
            check_id(*v)?;
            if !defined[v.0 as usize] {
                return Err(VerifyError::UseBeforeDef {
                    graph: graph.clone(),
                    node: node.name.clone(),
                    value: g.value(*v).name.clone(),
                });
            }
        }
        for (oi, v) in node.outputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            check_id(v)?;
            let want = ValueDef::Node {
                node: crate::NodeId(ni as u32),
                output: oi,
            };
            if g.value(v).def != want || defined[v.0 as usize] {
                return Err(bad_def(g, v, format!("node `{}` output {oi}", node.name)));
            }
            defined[v.0 as usize] = true;
        }
        verify_subgraphs(g, node)?;
    }
    for &v in &g.outputs {
        check_id(v)?;
        if !defined[v.0 as usize] {
            return Err(VerifyError::UseBeforeDef {
                graph: graph.clone(),
                node: "<graph outputs>".into(),
                value: g.value(v).name.clone(),
            });
        }
    }
    verify_states(g)
}

/// Each state links a distinct input and output whose types form a state
/// ([`crate::StateLink::growth_axis`]).
fn verify_states(g: &Graph) -> Result<(), VerifyError> {
    let bad = |msg: String| VerifyError::BadState {
        graph: g.name.clone(),
        msg,
    };
    let mut inputs = std::collections::HashSet::new();
    let mut outputs = std::collections::HashSet::new();
    for st in &g.states {
        st.growth_axis(g).map_err(bad)?;
        if !inputs.insert(st.input) || !outputs.insert(st.output) {
            return Err(bad(format!(
                "input {} or output {} is in more than one state",
                st.input, st.output
            )));
        }
    }
    Ok(())
}

fn bad_def(g: &Graph, v: ValueId, def: String) -> VerifyError {
    VerifyError::BadDef {
        graph: g.name.clone(),
        value: g.value(v).name.clone(),
        def,
    }
}

fn verify_subgraphs(g: &Graph, node: &crate::Node) -> Result<(), VerifyError> {
    let bodies: Vec<&Graph> = match &node.op {
        Op::If {
            then_branch,
            else_branch,
        } => vec![then_branch, else_branch],
        Op::Loop { body } | Op::Scan { body, .. } => vec![body],
        _ => vec![],
    };
    for body in bodies {
        verify(body).map_err(|e| VerifyError::BadNode {
            graph: g.name.clone(),
            node: node.name.clone(),
            op: node.op.name(),
            msg: format!("in subgraph: {e}"),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConstData, DType, TensorType, UnaryOp};

    fn small() -> Graph {
        let mut g = Graph::new("g");
        let x = g.add_input("x", TensorType::known(DType::F32, &[2]));
        let c = g.add_const("c", ConstData::from_f32s(&[1.0, 2.0]));
        let y = g.add_node(
            "add0",
            Op::Binary {
                op: crate::BinaryOp::Add,
            },
            vec![Some(x), Some(c)],
            vec![Some(("y".into(), TensorType::known(DType::F32, &[2])))],
        )[0]
        .unwrap();
        g.outputs.push(y);
        g
    }

    #[test]
    fn accepts_well_formed() {
        verify(&small()).unwrap();
    }

    #[test]
    fn rejects_use_before_def() {
        let mut g = small();
        // A second node whose output feeds the first: a cycle in disguise.
        let y = g.outputs[0];
        let z = g.add_node(
            "neg",
            Op::Unary { op: UnaryOp::Neg },
            vec![Some(y)],
            vec![Some(("z".into(), TensorType::known(DType::F32, &[2])))],
        )[0]
        .unwrap();
        g.nodes[0].inputs[0] = Some(z);
        let e = verify(&g).unwrap_err();
        assert!(
            e.to_string()
                .contains("node `add0` uses `z` before it is defined"),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_ids_and_consts() {
        let mut g = small();
        g.nodes[0].inputs[1] = Some(ValueId(99));
        assert!(matches!(
            verify(&g),
            Err(VerifyError::BadValueId { id: 99, .. })
        ));
        let mut g = small();
        g.constants[0].bytes = bytes::Bytes::from(vec![0u8; 3]);
        assert!(matches!(
            verify(&g),
            Err(VerifyError::BadConst {
                expected: 8,
                actual: 3,
                ..
            })
        ));
    }
}
