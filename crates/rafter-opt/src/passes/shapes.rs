//! Shape reads moved to the graph's inputs: `gather(shape(x), k)`, one dim of an
//! intermediate value, reads the same dim of a graph input instead, when shape inference
//! proved the two equal (the same symbol, `seq` or `batch`).
//!
//! Exported transformers take their sequence length and batch size from the shape of a
//! hidden state (`shape(embeddings)[1]`) to build the attention mask. The value is the
//! same as the input's dim, but reading it from the hidden state makes the mask wait for
//! that state: on a GPU the host-side mask arithmetic then waits for the GPU's first
//! kernels, and the state is copied back to the host (only for its shape) in the middle
//! of the call. Read from the input, the mask can be computed while the GPU works.
//!
//! The rewrite is exact: a symbol has one value per call, which the runtime binds from the
//! inputs. `gather(shape(x), k)` (axis 0, a constant index of one element) becomes
//! `gather(shape(v){start = j, end = j + 1}, 0)` with the index's own shape, so the result
//! keeps its type. Numbers (known dims) are left to constant folding, and reads of a graph
//! input's own shape are left alone.

use std::collections::HashMap;

use rafter_ir::{ConstData, Dim, Graph, Node, NodeId, Op, TensorType, ValueDef, ValueId};

use crate::util::{bodies_mut, compact, producer};

/// Applies the rewrite in the graph and its bodies. Returns whether anything changed.
pub fn shapes_from_inputs(g: &mut Graph) -> bool {
    let mut changed = false;
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            changed |= shapes_from_inputs(body);
        }
    }
    // (gather node, input, axis, index const's dims) per rewrite, found first.
    let mut rewrites: Vec<(usize, ValueId, usize, Vec<usize>)> = Vec::new();
    for (ni, node) in g.nodes.iter().enumerate() {
        if let Some((v, j, dims)) = input_dim_read(g, node) {
            rewrites.push((ni, v, j, dims));
        }
    }
    if rewrites.is_empty() {
        return changed;
    }
    // One `shape(v){j, j+1}` per input dim, prepended (it reads only an input).
    let mut dim_reads: HashMap<(ValueId, usize), ValueId> = HashMap::new();
    for (ni, v, j, index_dims) in rewrites {
        let read = match dim_reads.get(&(v, j)) {
            Some(&r) => r,
            None => {
                let name = format!("{}_dim{j}", g.value(v).name);
                let r = prepend_shape(g, &name, v, j);
                dim_reads.insert((v, j), r);
                r
            }
        };
        // Prepending moved every node one place on.
        let ni = ni + dim_reads.len();
        let zero = ConstData {
            dims: index_dims,
            ..ConstData::from_i64s(&[0])
        };
        let zero = g.add_const(format!("{}_index", g.value(read).name), zero);
        g.nodes[ni].inputs = vec![Some(read), Some(zero)];
    }
    compact(g);
    true
}

/// For `gather(shape(x), k)` reading a symbolic dim of a non-input `x` that a graph input
/// `v` has at axis `j`: `(v, j, dims of the index constant)`.
fn input_dim_read(g: &Graph, node: &Node) -> Option<(ValueId, usize, Vec<usize>)> {
    let Op::Gather { axis: 0 | -1 } = node.op else {
        return None;
    };
    let (s, index) = (node.input(0)?, node.input(1)?);
    let shape = producer(g, s)?;
    let Op::Shape { start, end } = shape.op else {
        return None;
    };
    let x = shape.input(0)?;
    if matches!(g.value(x).def, ValueDef::Input(_)) {
        return None;
    }
    let k = g.const_of(index)?;
    let [k] = k.to_i64s()?[..] else {
        return None;
    };
    let dims = &g.value(x).ty.dims;
    let rank = dims.len() as i64;
    let clamp = |a: i64| (if a < 0 { a + rank } else { a }).clamp(0, rank);
    let (from, to) = (clamp(start), clamp(end.unwrap_or(rank)));
    let len = to - from;
    let k = if k < 0 { k + len } else { k };
    if !(0..len).contains(&k) {
        return None;
    }
    let d: &Dim = &dims[(from + k) as usize];
    if d.as_known().is_some() {
        return None;
    }
    g.inputs.iter().find_map(|&v| {
        let j = g.value(v).ty.dims.iter().position(|e| e == d)?;
        Some((v, j, g.const_of(index)?.dims.clone()))
    })
}

/// Adds `shape(v){start = j, end = j + 1}` as the graph's first node; returns its result.
fn prepend_shape(g: &mut Graph, name: &str, v: ValueId, j: usize) -> ValueId {
    let op = Op::Shape {
        start: j as i64,
        end: Some(j as i64 + 1),
    };
    let ty = TensorType::known(rafter_ir::DType::I64, &[1]);
    let out = g.add_node(name, op, vec![Some(v)], vec![Some((name.to_string(), ty))])[0]
        .expect("one result");
    let last = g.nodes.len() as u32 - 1;
    let node = g.nodes.pop().expect("just added");
    g.nodes.insert(0, node);
    for value in &mut g.values {
        if let ValueDef::Node { node, .. } = &mut value.def {
            *node = NodeId(if node.0 == last { 0 } else { node.0 + 1 });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::check;

    #[test]
    fn dims_of_a_hidden_state_are_read_from_the_input() {
        // BERT's mask: batch and seq from the embeddings' shape, a scalar and a [1] index.
        check(
            shapes_from_inputs,
            r#"graph @g(%ids: i64[b, s], %t: f32[100, 8]) -> (%e, %n, %m) {
              %e: f32[b, s, 8] = gather{axis = 0}(%t, %ids)
              %sh: i64[3] = shape{start = 0}(%e)
              const %one: i64[] = dense [1]
              %n: i64[] = gather{axis = 0}(%sh, %one)
              const %first: i64[1] = dense [-3]
              %m: i64[1] = gather{axis = 0}(%sh, %first)
            }"#,
            r#"graph @g(%ids: i64[b, s], %t: f32[100, 8]) -> (%e, %n, %m) {
              %ids_dim0: i64[1] = shape{start = 0, end = 1}(%ids) @ids_dim0
              %ids_dim1: i64[1] = shape{start = 1, end = 2}(%ids) @ids_dim1
              %e: f32[b, s, 8] = gather{axis = 0}(%t, %ids)
              const %ids_dim1_index: i64[] = dense [0]
              %n: i64[] = gather{axis = 0}(%ids_dim1, %ids_dim1_index)
              const %ids_dim0_index: i64[1] = dense [0]
              %m: i64[1] = gather{axis = 0}(%ids_dim0, %ids_dim0_index)
            }"#,
        );
    }

    #[test]
    fn known_dims_and_inputs_own_shapes_stay() {
        let src = r#"graph @g(%ids: i64[b, s], %x: f32[b, 4]) -> (%n, %k) {
              %a: f32[b, 4] = unary{op = relu}(%x)
              %sa: i64[2] = shape{start = 0}(%a)
              const %one: i64[] = dense [1]
              %n: i64[] = gather{axis = 0}(%sa, %one)
              %si: i64[2] = shape{start = 0}(%ids)
              %k: i64[] = gather{axis = 0}(%si, %one)
            }"#;
        check(shapes_from_inputs, src, src);
    }
}
