//! Constant folding: nodes whose operands are all constants are evaluated at compile time
//! with the reference executor (so the folded bits are exactly what the op computes at run
//! time), and `shape`/`size` of values whose dims are statically known become constants.

use crate::util::{bodies_mut, compact, input_symbols, is_control_flow, replace_uses};
use rafter_ir::{ConstData, Dim, Graph, Op, Symbol, TensorType, Value, ValueDef, ValueId};
use rafter_reference::ops::{self, OpCtx};
use rafter_reference::Tensor;
use std::collections::{HashMap, HashSet};

/// Results larger than this are not folded: they would grow the weights (a folded
/// `constant_of_shape` or a transposed weight is better computed at run time).
pub const FOLD_LIMIT_BYTES: usize = 64 * 1024;

/// Folds constant subexpressions. Control flow is never folded (its bodies are folded
/// inside). A folded result whose declared dims name a symbol the graph inputs do not bind
/// (a data-dependent size, now known) binds that symbol everywhere in the graph. Runs DCE
/// afterwards. Returns whether anything was folded.
pub fn fold_constants(g: &mut Graph) -> bool {
    fold_graph(g, true)
}

fn fold_graph(g: &mut Graph, top_level: bool) -> bool {
    let mut changed = false;
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            changed |= fold_graph(body, false);
        }
    }
    let bound = input_symbols(g);
    for ni in 0..g.nodes.len() {
        let Some((results, subst)) = fold_node(g, ni, &bound, top_level) else {
            continue;
        };
        if !subst.is_empty() {
            substitute_graph(g, &subst);
        }
        for (old, data) in results {
            let v = g.value(old);
            let (name, ty) = (v.name.clone(), v.ty.clone());
            let new = push_const(g, name, ty, data);
            replace_uses(g, old, new);
        }
        changed = true;
    }
    if changed {
        compact(g);
    }
    changed
}

/// Adds a constant whose value has exactly type `ty` (equal to the data's type once the
/// substitution has been applied).
fn push_const(g: &mut Graph, name: String, ty: TensorType, data: ConstData) -> ValueId {
    let cid = rafter_ir::ConstId(g.constants.len() as u32);
    g.constants.push(data);
    let id = ValueId(g.values.len() as u32);
    g.values.push(Value {
        name,
        ty,
        def: ValueDef::Const(cid),
    });
    id
}

type Folded = (Vec<(ValueId, ConstData)>, HashMap<Symbol, Dim>);

/// Evaluates node `ni` if it can be folded: the results to replace and the symbols bound.
fn fold_node(g: &Graph, ni: usize, bound: &HashSet<Symbol>, top_level: bool) -> Option<Folded> {
    let node = &g.nodes[ni];
    if is_control_flow(&node.op) || node.outputs.iter().all(Option::is_none) {
        return None;
    }
    if let Some(data) = fold_shape_of(g, &node.op, node.input(0)) {
        let out = node.outputs[0]?;
        return (TensorType::known(data.dtype, &dims_i64(&data)) == g.value(out).ty)
            .then(|| (vec![(out, data)], HashMap::new()));
    }
    if !node
        .inputs
        .iter()
        .flatten()
        .all(|&v| g.const_of(v).is_some())
    {
        return None;
    }
    // Skip before evaluating what is statically too large.
    for &out in node.outputs.iter().flatten() {
        let ty = &g.value(out).ty;
        if let Some(dims) = ty.known_dims() {
            let n = dims
                .iter()
                .try_fold(ty.dtype.size_of() as i64, |a, &d| a.checked_mul(d));
            if n.is_none_or(|n| n as usize > FOLD_LIMIT_BYTES) {
                return None;
            }
        }
    }
    let args: Vec<Option<Tensor>> = node
        .inputs
        .iter()
        .map(|v| v.map(|v| Tensor::from_const(g.const_of(v).expect("checked"))))
        .collect();
    let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
    let results = ops::eval(&node.op, &refs, &OpCtx { graph: g, node }).ok()?;
    let mut subst: HashMap<Symbol, Dim> = HashMap::new();
    let mut out = Vec::new();
    for (oi, slot) in node.outputs.iter().enumerate() {
        let Some(v) = *slot else { continue };
        let t = results.get(oi)?.as_ref()?;
        let ty = &g.value(v).ty;
        if t.dtype() != ty.dtype
            || t.shape().len() != ty.rank()
            || t.len() * ty.dtype.size_of() > FOLD_LIMIT_BYTES
        {
            return None;
        }
        for (d, &actual) in ty.dims.iter().zip(t.shape()) {
            let actual = actual as i64;
            let d = d.substitute(&subst);
            if d.as_known() == Some(actual) {
                continue;
            }
            match d.as_symbol() {
                Some(s) if top_level && !bound.contains(s) => {
                    subst.insert(s.clone(), Dim::known(actual));
                }
                _ => return None,
            }
        }
        out.push((v, t.to_const()));
    }
    Some((out, subst))
}

fn dims_i64(c: &ConstData) -> Vec<i64> {
    c.dims.iter().map(|&d| d as i64).collect()
}

/// `shape` and `size` of a value whose (selected) dims are all known.
fn fold_shape_of(g: &Graph, op: &Op, x: Option<ValueId>) -> Option<ConstData> {
    let dims = &g.value(x?).ty.dims;
    match op {
        Op::Shape { start, end } => {
            let r = dims.len() as i64;
            let clamp = |i: i64| (if i < 0 { i + r } else { i }).clamp(0, r) as usize;
            let (s, e) = (clamp(*start), clamp(end.unwrap_or(r)));
            let vals: Option<Vec<i64>> = dims[s..e.max(s)].iter().map(Dim::as_known).collect();
            Some(ConstData::from_i64s(&vals?))
        }
        Op::Size => {
            let n = dims
                .iter()
                .try_fold(1i64, |a, d| a.checked_mul(d.as_known()?))?;
            let mut c = ConstData::from_i64s(&[n]);
            c.dims = Vec::new();
            Some(c)
        }
        _ => None,
    }
}

/// Applies a symbol substitution to every type in the graph and its bodies.
fn substitute_graph(g: &mut Graph, subst: &HashMap<Symbol, Dim>) {
    for v in &mut g.values {
        for d in &mut v.ty.dims {
            *d = d.substitute(subst);
        }
    }
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            substitute_graph(body, subst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::check;

    #[test]
    fn folds_arithmetic_on_constants() {
        check(
            fold_constants,
            r#"graph @g(%x: f32[3]) -> (%y) {
              const %a: f32[3] = dense [1.0, 2.0, 3.0]
              const %b: f32[] = dense [2.0]
              %t: f32[3] = binary{op = mul}(%a, %b)
              %u: f32[3] = unary{op = neg}(%t)
              %y: f32[3] = binary{op = add}(%x, %u)
            }"#,
            r#"graph @g(%x: f32[3]) -> (%y) {
              const %u: f32[3] = dense [-2.0, -4.0, -6.0]
              %y: f32[3] = binary{op = add}(%x, %u)
            }"#,
        );
    }

    #[test]
    fn folds_shape_of_known_dims_but_not_of_symbolic_ones() {
        check(
            fold_constants,
            r#"graph @g(%x: f32[2, 3, 5], %z: f32[batch, 7]) -> (%r, %n, %s, %zs) {
              %s0: i64[3] = shape{start = 0}(%x)
              const %i: i64[1] = dense [2]
              %g0: i64[1] = gather{axis = 0}(%s0, %i)
              const %m: i64[1] = dense [-1]
              %s1: i64[2] = concat{axis = 0}(%g0, %m)
              %r: f32[5, 6] = reshape{allow_zero = false}(%x, %s1)
              %n: i64[] = size(%x)
              %s: i64[1] = shape{start = -1}(%z)
              %zs: i64[2] = shape{start = 0}(%z)
            }"#,
            r#"graph @g(%x: f32[2, 3, 5], %z: f32[batch, 7]) -> (%r, %n, %s, %zs) {
              const %s1: i64[2] = dense [5, -1]
              %r: f32[5, 6] = reshape{allow_zero = false}(%x, %s1)
              const %n: i64[] = dense [30]
              const %s: i64[1] = dense [7]
              %zs: i64[2] = shape{start = 0}(%z)
            }"#,
        );
    }

    #[test]
    fn skips_large_results_and_control_flow() {
        let src = r#"graph @g(%x: f32[2]) -> (%y, %z) {
              const %shape: i64[2] = dense [200, 100]
              %big: f32[200, 100] = constant_of_shape{value = f32 1.0}(%shape)
              %y: f32[200, 100] = binary{op = mul}(%big, %big)
              const %c: bool[] = dense [true]
              const %k: f32[2] = dense [1.0, 2.0]
              %z: f32[2] = if{then_branch = graph @t(%v: f32[2]) -> (%v) {
              }, else_branch = graph @e(%v: f32[2]) -> (%w) {
                %w: f32[2] = unary{op = neg}(%v)
              }}(%c, %k)
            }"#;
        check(fold_constants, src, src);
    }

    #[test]
    fn folds_inside_bodies() {
        check(
            fold_constants,
            r#"graph @g(%c: bool[], %x: f32[2]) -> (%z) {
              %z: f32[2] = if{then_branch = graph @t(%v: f32[2]) -> (%v) {
              }, else_branch = graph @e(%v: f32[2]) -> (%w) {
                const %k: f32[2] = dense [1.0, 2.0]
                %nk: f32[2] = unary{op = neg}(%k)
                %w: f32[2] = binary{op = add}(%v, %nk)
              }}(%c, %x)
            }"#,
            r#"graph @g(%c: bool[], %x: f32[2]) -> (%z) {
              %z: f32[2] = if{then_branch = graph @t(%v: f32[2]) -> (%v) {
              }, else_branch = graph @e(%v: f32[2]) -> (%w) {
                const %nk: f32[2] = dense [-1.0, -2.0]
                %w: f32[2] = binary{op = add}(%v, %nk)
              }}(%c, %x)
            }"#,
        );
    }

    #[test]
    fn folding_a_data_dependent_size_binds_its_symbol() {
        check(
            fold_constants,
            r#"graph @g(%x: f32[3]) -> (%y) {
              const %m: bool[3] = dense [true, false, true]
              %nz: i64[1, nnz] = non_zero(%m)
              %f: i64[nnz] = squeeze{axes = [0]}(%nz)
              %y: f32[nnz] = gather{axis = 0}(%x, %f)
            }"#,
            r#"graph @g(%x: f32[3]) -> (%y) {
              const %f: i64[2] = dense [0, 2]
              %y: f32[2] = gather{axis = 0}(%x, %f)
            }"#,
        );
    }
}
