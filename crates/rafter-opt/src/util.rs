//! Graph plumbing shared by the passes: use lists, use replacement, compaction.

use rafter_ir::{ConstId, Graph, Node, NodeId, Op, Symbol, Value, ValueDef, ValueId};
use std::collections::{HashMap, HashSet};

/// For each value, the nodes that read it (each node once, in node order).
pub(crate) fn consumers(g: &Graph) -> Vec<Vec<usize>> {
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); g.values.len()];
    for (ni, node) in g.nodes.iter().enumerate() {
        for v in node.inputs.iter().flatten() {
            let list = &mut uses[v.0 as usize];
            if list.last() != Some(&ni) {
                list.push(ni);
            }
        }
    }
    uses
}

/// Whether each value is one of the graph's outputs.
pub(crate) fn graph_outputs(g: &Graph) -> Vec<bool> {
    let mut out = vec![false; g.values.len()];
    for v in &g.outputs {
        out[v.0 as usize] = true;
    }
    out
}

/// The node producing `v`, if a node does.
pub(crate) fn producer(g: &Graph, v: ValueId) -> Option<&Node> {
    match g.value(v).def {
        ValueDef::Node { node, .. } => Some(g.node(node)),
        _ => None,
    }
}

/// Symbols that the graph's inputs bind: those appearing alone as an input dim (`seq`, not
/// `2*seq`), which is how executors learn their values.
pub(crate) fn input_symbols(g: &Graph) -> HashSet<Symbol> {
    g.inputs
        .iter()
        .flat_map(|&v| g.value(v).ty.dims.iter())
        .filter_map(|d| d.as_symbol().cloned())
        .collect()
}

/// Replaces every use of `old` by `new` (the caller guarantees equal types). Node operands
/// are always rewritten. A graph output is rewritten only when that keeps the output's
/// name: when `new` has the same name, or is an intermediate node result that is not an
/// output itself (it then takes `old`'s name). Returns how many uses were rewritten.
pub(crate) fn replace_uses(g: &mut Graph, old: ValueId, new: ValueId) -> usize {
    if old == new {
        return 0;
    }
    let mut n = 0;
    for node in &mut g.nodes {
        for slot in node.inputs.iter_mut() {
            if *slot == Some(old) {
                *slot = Some(new);
                n += 1;
            }
        }
    }
    if g.outputs.contains(&old) {
        let same_name = g.value(new).name == g.value(old).name;
        let renamable = matches!(g.value(new).def, ValueDef::Node { .. })
            && !g.outputs.contains(&new)
            && !g.inputs.contains(&new);
        if same_name || renamable {
            if !same_name {
                let name = g.value(old).name.clone();
                g.values[new.0 as usize].name = name;
            }
            for o in g.outputs.iter_mut() {
                if *o == old {
                    *o = new;
                    n += 1;
                }
            }
        }
    }
    n
}

/// The subgraphs of a node (If branches, Loop and Scan bodies).
pub(crate) fn bodies_mut(op: &mut Op) -> Vec<&mut Graph> {
    match op {
        Op::If {
            then_branch,
            else_branch,
        } => vec![then_branch.as_mut(), else_branch.as_mut()],
        Op::Loop { body } | Op::Scan { body, .. } => vec![body.as_mut()],
        _ => Vec::new(),
    }
}

/// Whether the op holds subgraphs (control flow, never folded or fused).
pub(crate) fn is_control_flow(op: &Op) -> bool {
    matches!(op, Op::If { .. } | Op::Loop { .. } | Op::Scan { .. })
}

/// Dead-code elimination and canonical renumbering of one graph (not its subgraphs).
///
/// Keeps every input, the nodes some output depends on, and the constants they read.
/// Values are renumbered inputs first, then constants in order of first use (node operands
/// in node order, then graph outputs), then node results in node order; constants shared
/// by several values stay shared. Returns whether a node or constant was removed.
pub(crate) fn compact(g: &mut Graph) -> bool {
    // Liveness, backwards.
    let mut live = vec![false; g.values.len()];
    for v in &g.outputs {
        live[v.0 as usize] = true;
    }
    let mut live_node = vec![false; g.nodes.len()];
    for (ni, node) in g.nodes.iter().enumerate().rev() {
        if node.outputs.iter().flatten().any(|v| live[v.0 as usize]) {
            live_node[ni] = true;
            for v in node.inputs.iter().flatten() {
                live[v.0 as usize] = true;
            }
        }
    }

    let mut remap: HashMap<ValueId, ValueId> = HashMap::new();
    let mut values: Vec<Value> = Vec::new();
    let push = |old: ValueId,
                def: ValueDef,
                values: &mut Vec<Value>,
                remap: &mut HashMap<ValueId, ValueId>| {
        let id = ValueId(values.len() as u32);
        let mut v = g.values[old.0 as usize].clone();
        v.def = def;
        values.push(v);
        remap.insert(old, id);
        id
    };
    for (i, &v) in g.inputs.iter().enumerate() {
        push(v, ValueDef::Input(i), &mut values, &mut remap);
    }
    // Constants in first-use order.
    let mut const_map: HashMap<ConstId, ConstId> = HashMap::new();
    let mut constants = Vec::new();
    let const_uses = g
        .nodes
        .iter()
        .zip(&live_node)
        .filter(|(_, &l)| l)
        .flat_map(|(n, _)| n.inputs.iter().flatten().copied())
        .chain(g.outputs.iter().copied())
        .collect::<Vec<_>>();
    for v in const_uses {
        let ValueDef::Const(c) = g.value(v).def else {
            continue;
        };
        if remap.contains_key(&v) {
            continue;
        }
        let nc = *const_map.entry(c).or_insert_with(|| {
            constants.push(g.constants[c.0 as usize].clone());
            ConstId(constants.len() as u32 - 1)
        });
        push(v, ValueDef::Const(nc), &mut values, &mut remap);
    }
    let mut nodes = Vec::new();
    for (ni, node) in g.nodes.iter().enumerate() {
        if !live_node[ni] {
            continue;
        }
        let nid = NodeId(nodes.len() as u32);
        let outputs = node
            .outputs
            .iter()
            .enumerate()
            .map(|(oi, o)| {
                o.map(|v| {
                    push(
                        v,
                        ValueDef::Node {
                            node: nid,
                            output: oi,
                        },
                        &mut values,
                        &mut remap,
                    )
                })
            })
            .collect();
        nodes.push(Node {
            name: node.name.clone(),
            op: node.op.clone(),
            inputs: node.inputs.clone(),
            outputs,
        });
    }
    for node in &mut nodes {
        for v in node.inputs.iter_mut().flatten() {
            *v = remap[v];
        }
    }
    let removed = nodes.len() != g.nodes.len() || constants.len() != g.constants.len();
    g.inputs = g.inputs.iter().map(|v| remap[v]).collect();
    g.outputs = g.outputs.iter().map(|v| remap[v]).collect();
    g.values = values;
    g.nodes = nodes;
    g.constants = constants;
    removed
}
