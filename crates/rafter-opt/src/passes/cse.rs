//! Common-subexpression elimination.

use crate::util::{bodies_mut, compact, is_control_flow, replace_uses};
use rafter_ir::{Graph, ValueDef, ValueId};
use std::collections::HashMap;

/// Constants larger than this are not compared for deduplication (hashing weights costs
/// time and two equal weights are rare).
const DEDUP_CONST_MAX_BYTES: usize = 64 * 1024;

/// Merges constants with the same type and bytes (up to 64 KiB), then nodes with the same
/// op, attributes and operands (control flow excepted) whose results have the same types;
/// in the graph and its bodies. Runs DCE afterwards. Returns whether anything merged.
pub fn cse(g: &mut Graph) -> bool {
    let mut changed = false;
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            changed |= cse(body);
        }
    }
    let mut any = false;
    // Constants: by type and bytes.
    let mut consts: HashMap<(String, bytes::Bytes), ValueId> = HashMap::new();
    for i in 0..g.values.len() {
        let v = ValueId(i as u32);
        let ValueDef::Const(c) = g.value(v).def else {
            continue;
        };
        let data = g.constant(c);
        if data.bytes.len() > DEDUP_CONST_MAX_BYTES {
            continue;
        }
        let key = (g.value(v).ty.to_string(), data.bytes.clone());
        match consts.get(&key) {
            Some(&first) => any |= replace_uses(g, v, first) > 0,
            None => {
                consts.insert(key, v);
            }
        }
    }
    // Nodes: by op name and operands, then full op equality.
    let mut seen: HashMap<(&'static str, Vec<Option<ValueId>>), Vec<usize>> = HashMap::new();
    for ni in 0..g.nodes.len() {
        let node = &g.nodes[ni];
        if is_control_flow(&node.op) {
            continue;
        }
        let key = (node.op.name(), node.inputs.clone());
        let twin = seen.get(&key).and_then(|list| {
            list.iter().copied().find(|&m| {
                let other = &g.nodes[m];
                other.op == node.op
                    && other.outputs.len() == node.outputs.len()
                    && other
                        .outputs
                        .iter()
                        .zip(&node.outputs)
                        .all(|(a, b)| match (a, b) {
                            (Some(a), Some(b)) => g.value(*a).ty == g.value(*b).ty,
                            (_, None) => true,
                            (None, Some(_)) => false,
                        })
            })
        });
        match twin {
            Some(m) => {
                let pairs: Vec<(ValueId, ValueId)> = g.nodes[ni]
                    .outputs
                    .iter()
                    .zip(&g.nodes[m].outputs)
                    .filter_map(|(b, a)| Some(((*b)?, (*a)?)))
                    .collect();
                for (dup, first) in pairs {
                    any |= replace_uses(g, dup, first) > 0;
                }
            }
            None => seen.entry(key).or_default().push(ni),
        }
    }
    if any {
        compact(g);
    }
    changed | any
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::check;

    #[test]
    fn merges_equal_nodes_and_constants() {
        check(
            cse,
            r#"graph @g(%x: f32[batch, seq]) -> (%y, %e) {
              %s0: i64[2] = shape{start = 0}(%x)
              const %i0: i64[] = dense [1]
              %d0: i64[] = gather{axis = 0}(%s0, %i0)
              %s1: i64[2] = shape{start = 0}(%x)
              const %i1: i64[] = dense [1]
              %d1: i64[] = gather{axis = 0}(%s1, %i1)
              %e: i64[] = binary{op = mul}(%d0, %d1)
              %f: f32[batch, seq] = unary{op = exp}(%x)
              %g: f32[batch, seq] = unary{op = sin}(%x)
              %y: f32[batch, seq] = binary{op = add}(%f, %g)
            }"#,
            r#"graph @g(%x: f32[batch, seq]) -> (%y, %e) {
              %s0: i64[2] = shape{start = 0}(%x)
              const %i0: i64[] = dense [1]
              %d0: i64[] = gather{axis = 0}(%s0, %i0)
              %e: i64[] = binary{op = mul}(%d0, %d0)
              %f: f32[batch, seq] = unary{op = exp}(%x)
              %g: f32[batch, seq] = unary{op = sin}(%x)
              %y: f32[batch, seq] = binary{op = add}(%f, %g)
            }"#,
        );
    }

    #[test]
    fn keeps_distinct_attributes_and_output_names() {
        // `b` duplicates `a` but both are outputs with their own names; `d` differs from
        // `c` by an attribute.
        let src = r#"graph @g(%x: f32[4]) -> (%a, %b, %c, %d) {
              %a: f32[4] = unary{op = exp}(%x)
              %b: f32[4] = unary{op = exp}(%x)
              %c: f32[4] = leaky_relu{alpha = 0.5}(%x)
              %d: f32[4] = leaky_relu{alpha = 0.25}(%x)
            }"#;
        check(cse, src, src);
    }
}
