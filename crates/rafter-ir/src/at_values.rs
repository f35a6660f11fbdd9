//! Whether a graph holds together at given symbol values: the graph re-typed node by node
//! with its symbols replaced by numbers.
//!
//! Import types a graph once, symbolically, and some of its types rest on assumptions about
//! the symbols that the model itself limits: `positions[:, 0:seq]` over a table of 64 rows
//! is typed `seq` long, which holds only while `seq <= 64`. Re-typing the graph at the
//! values a user declares (`--dim seq<=2048`) finds where such an assumption breaks, before
//! anything is compiled or run, and names the node: there the re-typed result has a number
//! where the graph's type, at those values, says another.

use std::collections::HashMap;

use crate::{Dim, Graph, GraphBuilder, Symbol, TensorType, ValueDef, ValueId, WireError};

/// Re-types `graph` with each symbol of `values` replaced by its value (other symbols stay
/// symbolic). The first node whose inference fails, or whose result dim differs from the
/// graph's type at those values, is the error.
pub fn check_at_values(graph: &Graph, values: &HashMap<Symbol, i64>) -> Result<(), WireError> {
    let known: HashMap<Symbol, Dim> = values
        .iter()
        .map(|(s, v)| (s.clone(), Dim::known(*v)))
        .collect();
    let at = |ty: &TensorType| {
        TensorType::new(
            ty.dtype,
            ty.dims.iter().map(|d| d.substitute(&known)).collect(),
        )
    };
    let mut b = GraphBuilder::new(graph.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; graph.values.len()];
    for (i, v) in graph.values.iter().enumerate() {
        match v.def {
            ValueDef::Input(_) => map[i] = Some(b.input(v.name.clone(), at(&v.ty))),
            ValueDef::Const(c) => {
                map[i] = Some(b.constant(v.name.clone(), graph.constant(c).clone()))
            }
            ValueDef::Node { .. } => {}
        }
    }
    for node in &graph.nodes {
        let inputs = node
            .inputs
            .iter()
            .map(|o| o.and_then(|v| map[v.0 as usize]))
            .collect();
        let outs = node
            .outputs
            .iter()
            .map(|o| o.map(|v| graph.value(v).name.clone()))
            .collect();
        let ids = b.wire(node.name.clone(), node.op.clone(), inputs, outs)?;
        for (orig, new) in node.outputs.iter().zip(ids) {
            let (Some(orig), Some(new)) = (orig, new) else {
                continue;
            };
            let want = &graph.value(*orig).ty;
            let got = b.ty(new);
            for (axis, (w, g)) in want.dims.iter().zip(&got.dims).enumerate() {
                let w_at = w.substitute(&known);
                if let (Some(a), Some(bv)) = (w_at.as_known(), g.as_known()) {
                    if a != bv {
                        return Err(WireError {
                            node: node.name.clone(),
                            op: node.op.name(),
                            msg: format!(
                                "result `{}` dim {axis} is `{w}` = {a} at these values, but \
                                 the model computes {bv} there",
                                graph.value(*orig).name
                            ),
                        });
                    }
                }
            }
            map[orig.0 as usize] = Some(new);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConstData, DType, Op};

    /// `table[0:seq]` over a 4-row table: typed `seq`, which holds for seq <= 4 only.
    fn sliced_table() -> Graph {
        let mut b = GraphBuilder::new("g");
        let seq = Dim::symbol("seq");
        let x = b.input("x", TensorType::new(DType::F32, vec![seq.clone()]));
        let table = b.constant("table", ConstData::from_f32s(&[0.0; 4]));
        let shape = b
            .wire_node(
                "shape",
                Op::Shape {
                    start: 0,
                    end: None,
                },
                &[x],
            )
            .unwrap();
        let zero = b.constant("zero", ConstData::from_i64s(&[0]));
        let sliced = b
            .wire_node("slice", Op::Slice, &[table, zero, shape])
            .unwrap();
        let y = b
            .wire_node(
                "add",
                Op::Binary {
                    op: crate::BinaryOp::Add,
                },
                &[x, sliced],
            )
            .unwrap();
        b.output(y);
        b.finish().unwrap()
    }

    #[test]
    fn an_assumption_the_model_limits_is_named_with_its_node() {
        let g = sliced_table();
        assert_eq!(g.value(g.outputs[0]).ty.dims, vec![Dim::symbol("seq")]);
        let ok: HashMap<Symbol, i64> = [(Symbol::new("seq"), 4)].into();
        check_at_values(&g, &ok).unwrap();
        let too_long: HashMap<Symbol, i64> = [(Symbol::new("seq"), 9)].into();
        let e = check_at_values(&g, &too_long).unwrap_err();
        assert_eq!(e.node, "slice");
        assert!(
            e.msg.contains("`seq` = 9") && e.msg.contains("computes 4"),
            "{e}"
        );
    }
}
