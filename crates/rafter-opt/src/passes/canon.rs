//! Canonicalisation: local rewrites that remove no-ops and compose chains.
//!
//! Every rewrite is exact (bit for bit) and type-preserving:
//! - `identity`, `cast` to the value's own dtype, and `reshape`/`expand`/`squeeze`/
//!   `unsqueeze`/`flatten`/single-operand `concat` whose result type equals the operand's
//!   are removed;
//! - `transpose` with the identity permutation is removed; a transpose of a transpose
//!   becomes one transpose (or nothing, when the composition is the identity);
//! - a reshape-like op (`reshape`, `flatten`, `squeeze`, `unsqueeze`) of a reshape-like op
//!   is removed when the result has the inner operand's type, and a `reshape` with a
//!   constant target shape (no `0` entries copying dims, unless `allow_zero`) of a
//!   reshape-like op reads the inner operand directly;
//! - a `reshape` whose target shape is computed at run time (typically `shape` → `gather` →
//!   `concat` chains over a symbolic sequence length) but whose result type is already known
//!   from shape inference gets a constant target instead: each result dim that is a number
//!   becomes that number, each symbolic dim equal to the operand's dim at the same position
//!   becomes `0` (copy), and at most one other dim becomes `-1` when every other entry is a
//!   positive number. The shape chain then dies (DCE), sparing a dispatch per op per call;
//! - `x * 1`, `1 * x`, `x / 1`, integer `x + 0` / `x - 0`, float `x - 0.0` and
//!   `x + -0.0`, `x and true`, `x or false` are removed when `x` already has the result's
//!   type (no broadcast). Float `x + 0.0` is kept: it turns `-0.0` into `+0.0`;
//! - `neg(neg(x))`, `not(not(x))`, `bitwise_not(bitwise_not(x))` become `x`; idempotent
//!   `relu(relu(x))`, `abs(abs(x))` become the inner result.
//!
//! A graph output is rerouted only where its name is kept (see `replace_uses`): `y =
//! identity(x)` with `x` a graph input stays, since the output must be called `y`.

use crate::util::{bodies_mut, compact, producer, replace_uses};
use rafter_ir::{BinaryOp, ConstData, DType, Dim, Graph, Op, UnaryOp, ValueId};

/// Applies the rewrites above to a fixed point, in the graph and its bodies, then removes
/// what became dead. Returns whether anything changed.
pub fn canonicalize(g: &mut Graph) -> bool {
    let mut changed = false;
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            changed |= canonicalize(body);
        }
    }
    let mut any = false;
    loop {
        let mut round = false;
        for ni in 0..g.nodes.len() {
            round |= apply(g, ni);
        }
        if !round {
            break;
        }
        any = true;
    }
    if any {
        compact(g);
    }
    changed | any
}

enum Rewrite {
    /// Every use of the node's first result reads this value instead.
    Replace(ValueId),
    /// The node becomes this op over these operands.
    Modify(Op, Vec<Option<ValueId>>),
    /// The node's operand at this position becomes a new constant.
    SetConst(usize, ConstData),
}

fn apply(g: &mut Graph, ni: usize) -> bool {
    let Some(y) = g.nodes[ni].outputs.first().copied().flatten() else {
        return false;
    };
    match rewrite(g, ni) {
        None => false,
        Some(Rewrite::Replace(x)) => replace_uses(g, y, x) > 0,
        Some(Rewrite::Modify(op, inputs)) => {
            let node = &mut g.nodes[ni];
            node.op = op;
            node.inputs = inputs;
            true
        }
        Some(Rewrite::SetConst(at, data)) => {
            let name = format!("{}_shape", g.value(y).name);
            let c = g.add_const(name, data);
            g.nodes[ni].inputs[at] = Some(c);
            true
        }
    }
}

/// A constant ONNX `reshape` target (no `allow_zero`) producing `to` from `from`, when the
/// types pin it down: see the module docs.
fn static_reshape_target(from: &[Dim], to: &[Dim]) -> Option<ConstData> {
    let mut target = Vec::with_capacity(to.len());
    let mut inferred = None;
    for (i, d) in to.iter().enumerate() {
        match d.as_known() {
            // A literal 0 would mean "copy" without allow_zero.
            Some(0) => return None,
            Some(k) => target.push(k),
            None if from.get(i) == Some(d) => target.push(0),
            None if inferred.is_none() => {
                inferred = Some(i);
                target.push(-1);
            }
            None => return None,
        }
    }
    // `-1` is inferred from the element count, which needs every other entry to be a
    // positive number (a copied symbolic dim could be 0 at run time).
    if inferred.is_some() && target.contains(&0) {
        return None;
    }
    Some(ConstData::from_i64s(&target))
}

fn is_reshape_like(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. }
    )
}

fn rewrite(g: &Graph, ni: usize) -> Option<Rewrite> {
    let node = &g.nodes[ni];
    if node.outputs.len() != 1 {
        return None;
    }
    let y = node.outputs[0]?;
    let ty = &g.value(y).ty;
    let x = node.input(0);
    let same = |v: ValueId| g.value(v).ty == *ty;
    let keep_x = || x.filter(|&x| same(x)).map(Rewrite::Replace);
    match &node.op {
        Op::Identity | Op::Cast { .. } | Op::Expand => keep_x(),
        Op::Concat { .. } if node.inputs.len() == 1 => keep_x(),
        op if is_reshape_like(op) => {
            if let Some(r) = keep_x() {
                return Some(r);
            }
            if let (Op::Reshape { allow_zero: false }, Some(s)) = (&node.op, node.input(1)) {
                if g.const_of(s).is_none() {
                    let from = &g.value(x?).ty.dims;
                    return static_reshape_target(from, &ty.dims).map(|c| Rewrite::SetConst(1, c));
                }
            }
            let inner = producer(g, x?).filter(|p| is_reshape_like(&p.op))?;
            let x0 = inner.input(0)?;
            if same(x0) {
                return Some(Rewrite::Replace(x0));
            }
            if let Op::Reshape { allow_zero } = node.op {
                let shape = g.const_of(node.input(1)?)?.to_i64s()?;
                if allow_zero || !shape.contains(&0) {
                    let mut inputs = node.inputs.clone();
                    inputs[0] = Some(x0);
                    return Some(Rewrite::Modify(node.op.clone(), inputs));
                }
            }
            None
        }
        Op::Transpose { perm } => {
            let p = resolve_perm(perm, g.value(x?).ty.rank())?;
            if is_identity(&p) {
                return keep_x();
            }
            let inner = producer(g, x?)?;
            let Op::Transpose { perm: p1 } = &inner.op else {
                return None;
            };
            let x0 = inner.input(0)?;
            let p1 = resolve_perm(p1, g.value(x0).ty.rank())?;
            let q: Vec<usize> = p.iter().map(|&k| p1[k]).collect();
            if is_identity(&q) {
                return same(x0).then_some(Rewrite::Replace(x0));
            }
            let perm = q.iter().map(|&k| k as i64).collect();
            Some(Rewrite::Modify(Op::Transpose { perm }, vec![Some(x0)]))
        }
        Op::Unary { op } => {
            let inner = producer(g, x?)?;
            let Op::Unary { op: inner_op } = inner.op else {
                return None;
            };
            match (op, inner_op) {
                (UnaryOp::Neg, UnaryOp::Neg)
                | (UnaryOp::Not, UnaryOp::Not)
                | (UnaryOp::BitwiseNot, UnaryOp::BitwiseNot) => {
                    let x0 = inner.input(0)?;
                    same(x0).then_some(Rewrite::Replace(x0))
                }
                (UnaryOp::Relu, UnaryOp::Relu) | (UnaryOp::Abs, UnaryOp::Abs) => keep_x(),
                _ => None,
            }
        }
        Op::Binary { op } => {
            let (a, b) = (node.input(0)?, node.input(1)?);
            let neutral = |c: ValueId| g.const_of(c).is_some_and(|c| is_neutral(*op, c));
            let commutes = matches!(
                op,
                BinaryOp::Mul | BinaryOp::Add | BinaryOp::And | BinaryOp::Or
            );
            if neutral(b) && same(a) {
                Some(Rewrite::Replace(a))
            } else if commutes && neutral(a) && same(b) {
                Some(Rewrite::Replace(b))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Whether `x op c == x` for every `x` of `c`'s dtype, bit for bit.
fn is_neutral(op: BinaryOp, c: &ConstData) -> bool {
    let vals = c.to_f64s();
    if vals.is_empty() {
        return false;
    }
    let all = |f: &dyn Fn(f64) -> bool| vals.iter().all(|&v| f(v));
    let float = c.dtype.is_float();
    match op {
        BinaryOp::Mul | BinaryOp::Div => c.dtype != DType::Bool && all(&|v| v == 1.0),
        BinaryOp::Add if float => all(&|v| v == 0.0 && v.is_sign_negative()),
        BinaryOp::Sub if float => all(&|v| v == 0.0 && v.is_sign_positive()),
        BinaryOp::Add | BinaryOp::Sub => c.dtype.is_int() && all(&|v| v == 0.0),
        BinaryOp::And => c.dtype == DType::Bool && all(&|v| v == 1.0),
        BinaryOp::Or => c.dtype == DType::Bool && all(&|v| v == 0.0),
        _ => false,
    }
}

/// Non-negative permutation entries; an empty `perm` reverses the dims.
fn resolve_perm(perm: &[i64], rank: usize) -> Option<Vec<usize>> {
    if perm.is_empty() {
        return Some((0..rank).rev().collect());
    }
    if perm.len() != rank {
        return None;
    }
    let r = rank as i64;
    let p: Vec<usize> = perm
        .iter()
        .map(|&k| {
            let k = if k < 0 { k + r } else { k };
            (0..r).contains(&k).then_some(k as usize)
        })
        .collect::<Option<_>>()?;
    let mut seen = vec![false; rank];
    for &k in &p {
        if std::mem::replace(&mut seen[k], true) {
            return None;
        }
    }
    Some(p)
}

fn is_identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &k)| i == k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::check;

    #[test]
    fn removes_identity_and_same_dtype_cast() {
        check(
            canonicalize,
            r#"graph @g(%x: f32[2, 3]) -> (%y) {
              %a: f32[2, 3] = identity(%x)
              %b: f32[2, 3] = cast{to = f32}(%a)
              %c: f16[2, 3] = cast{to = f16}(%b)
              %y: f16[2, 3] = unary{op = exp}(%c)
            }"#,
            r#"graph @g(%x: f32[2, 3]) -> (%y) {
              %c: f16[2, 3] = cast{to = f16}(%x)
              %y: f16[2, 3] = unary{op = exp}(%c)
            }"#,
        );
    }

    #[test]
    fn output_names_are_kept() {
        // `y` must stay the output's name: an identity of an input stays; an identity of an
        // intermediate is removed and the intermediate takes the name.
        check(
            canonicalize,
            r#"graph @g(%x: f32[2]) -> (%y, %z) {
              %y: f32[2] = identity(%x)
              %e: f32[2] = unary{op = exp}(%x)
              %z: f32[2] = identity(%e)
            }"#,
            r#"graph @g(%x: f32[2]) -> (%y, %z) {
              %y: f32[2] = identity(%x)
              %z: f32[2] = unary{op = exp}(%x)
            }"#,
        );
    }

    #[test]
    fn composes_transposes() {
        check(
            canonicalize,
            r#"graph @g(%x: f32[2, 3, 4]) -> (%y, %z) {
              %t: f32[3, 4, 2] = transpose{perm = [1, 2, 0]}(%x)
              %y: f32[4, 3, 2] = transpose{perm = [1, 0, 2]}(%t)
              %u: f32[2, 3, 4] = transpose{perm = [2, 0, 1]}(%t)
              %z: f32[2, 3, 4] = unary{op = exp}(%u)
            }"#,
            r#"graph @g(%x: f32[2, 3, 4]) -> (%y, %z) {
              %y: f32[4, 3, 2] = transpose{perm = [2, 1, 0]}(%x)
              %z: f32[2, 3, 4] = unary{op = exp}(%x)
            }"#,
        );
    }

    #[test]
    fn removes_identity_transpose_and_no_op_reshapes() {
        check(
            canonicalize,
            r#"graph @g(%x: f32[batch, 4]) -> (%y) {
              %t: f32[batch, 4] = transpose{perm = [0, 1]}(%x)
              const %s: i64[2] = dense [0, 4]
              %r: f32[batch, 4] = reshape{allow_zero = false}(%t, %s)
              %u: f32[batch, 4, 1] = unsqueeze{axes = [2]}(%r)
              %q: f32[batch, 4] = squeeze{axes = [2]}(%u)
              %y: f32[batch, 4] = unary{op = exp}(%q)
            }"#,
            r#"graph @g(%x: f32[batch, 4]) -> (%y) {
              %y: f32[batch, 4] = unary{op = exp}(%x)
            }"#,
        );
    }

    #[test]
    fn composes_reshapes() {
        // `%w` copies a dim of `%f` (a `0` entry), but has `%x`'s type: a no-op pair.
        check(
            canonicalize,
            r#"graph @g(%x: f32[2, 3, 4]) -> (%y, %v) {
              const %s1: i64[2] = dense [6, 4]
              %a: f32[6, 4] = reshape{allow_zero = false}(%x, %s1)
              const %s2: i64[2] = dense [-1, 12]
              %y: f32[2, 12] = reshape{allow_zero = false}(%a, %s2)
              %f: f32[2, 12] = flatten{axis = 1}(%x)
              const %s3: i64[3] = dense [0, 3, 4]
              %w: f32[2, 3, 4] = reshape{allow_zero = false}(%f, %s3)
              %v: f32[2, 3, 4] = unary{op = exp}(%w)
            }"#,
            r#"graph @g(%x: f32[2, 3, 4]) -> (%y, %v) {
              const %s2: i64[2] = dense [-1, 12]
              %y: f32[2, 12] = reshape{allow_zero = false}(%x, %s2)
              %v: f32[2, 3, 4] = unary{op = exp}(%x)
            }"#,
        );
        // A `0` entry copies a dim of the intermediate: not rewritten.
        let src = r#"graph @g(%x: f32[2, 3, 4]) -> (%y) {
              const %s1: i64[2] = dense [6, 4]
              %a: f32[6, 4] = reshape{allow_zero = false}(%x, %s1)
              const %s2: i64[3] = dense [0, 2, 2]
              %y: f32[6, 2, 2] = reshape{allow_zero = false}(%a, %s2)
            }"#;
        check(canonicalize, src, src);
    }

    #[test]
    fn reshape_targets_from_shape_chains_become_constants() {
        // BERT's head split: the target [batch, seq, 12, 64] is computed from `shape(x)`;
        // the types already say it, so the target becomes [0, 0, 12, 64] and the chain dies
        // (the `shape` node stays here: canonicalisation does not run DCE on live inputs).
        check(
            canonicalize,
            r#"graph @g(%x: f32[b, s, 768]) -> (%y, %z) {
              %sh: i64[3] = shape{start = 0}(%x)
              const %heads: i64[2] = dense [12, 64]
              const %idx: i64[2] = dense [0, 1]
              %bs: i64[2] = gather{axis = 0}(%sh, %idx)
              %t: i64[4] = concat{axis = 0}(%bs, %heads)
              %y: f32[b, s, 12, 64] = reshape{allow_zero = false}(%x, %t)
              const %flat: i64[1] = dense [-1]
              %n: i64[2] = concat{axis = 0}(%flat, %heads)
              %z: f32[n, 12, 64] = reshape{allow_zero = false}(%x, %n)
            }"#,
            r#"graph @g(%x: f32[b, s, 768]) -> (%y, %z) {
              const %y_shape: i64[4] = dense [0, 0, 12, 64]
              %y: f32[b, s, 12, 64] = reshape{allow_zero = false}(%x, %y_shape)
              const %z_shape: i64[3] = dense [-1, 12, 64]
              %z: f32[n, 12, 64] = reshape{allow_zero = false}(%x, %z_shape)
            }"#,
        );
        // Two symbolic dims that are not copies: nothing to say statically.
        let src = r#"graph @g(%x: f32[b, s], %t: i64[2]) -> (%y) {
              %y: f32[s, b] = reshape{allow_zero = false}(%x, %t)
            }"#;
        check(canonicalize, src, src);
    }

    #[test]
    fn removes_neutral_elements() {
        // Float `+ 0.0` stays (it turns -0.0 into +0.0); `s * ones` broadcasts a scalar up,
        // so it stays too.
        check(
            canonicalize,
            r#"graph @g(%x: f32[2, 3], %i: i64[3]) -> (%y, %kk, %bc) {
              const %one: f32[] = dense [1.0]
              const %ones: f32[3] = dense [1.0, 1.0, 1.0]
              const %pz: f32[] = dense [0.0]
              const %nz: f32[] = dense [-0.0]
              const %iz: i64[] = dense [0]
              %a: f32[2, 3] = binary{op = mul}(%one, %x)
              %b: f32[2, 3] = binary{op = div}(%a, %ones)
              %c: f32[2, 3] = binary{op = sub}(%b, %pz)
              %d: f32[2, 3] = binary{op = add}(%c, %nz)
              %y: f32[2, 3] = binary{op = add}(%d, %pz)
              %j: i64[3] = binary{op = add}(%iz, %i)
              %k: i64[3] = binary{op = sub}(%j, %iz)
              %kk: i64[3] = binary{op = mul}(%k, %k)
              %s: f32[] = unary{op = exp}(%pz)
              %bc: f32[3] = binary{op = mul}(%s, %ones)
            }"#,
            r#"graph @g(%x: f32[2, 3], %i: i64[3]) -> (%y, %kk, %bc) {
              const %pz: f32[] = dense [0.0]
              const %ones: f32[3] = dense [1.0, 1.0, 1.0]
              %y: f32[2, 3] = binary{op = add}(%x, %pz)
              %kk: i64[3] = binary{op = mul}(%i, %i)
              %s: f32[] = unary{op = exp}(%pz)
              %bc: f32[3] = binary{op = mul}(%s, %ones)
            }"#,
        );
    }

    #[test]
    fn removes_double_negation_and_idempotent_ops() {
        check(
            canonicalize,
            r#"graph @g(%x: f32[4], %m: bool[4]) -> (%y, %n) {
              %a: f32[4] = unary{op = neg}(%x)
              %b: f32[4] = unary{op = neg}(%a)
              %r: f32[4] = unary{op = relu}(%b)
              %y: f32[4] = unary{op = relu}(%r)
              %n1: bool[4] = unary{op = not}(%m)
              %n2: bool[4] = unary{op = not}(%n1)
              %n: bool[4] = binary{op = and}(%n2, %m)
            }"#,
            r#"graph @g(%x: f32[4], %m: bool[4]) -> (%y, %n) {
              %y: f32[4] = unary{op = relu}(%x)
              %n: bool[4] = binary{op = and}(%m, %m)
            }"#,
        );
    }
}
