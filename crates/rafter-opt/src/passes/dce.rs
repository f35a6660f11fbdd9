//! Dead-code elimination.

use crate::util::{bodies_mut, compact};
use rafter_ir::Graph;

/// Removes nodes no graph output depends on and constants nothing reads, in the graph and
/// in its control-flow bodies (whose inputs and outputs are kept: they are positional).
/// Renumbers values canonically (inputs, constants in first-use order, node results).
pub fn dce(g: &mut Graph) -> bool {
    let mut changed = false;
    for node in &mut g.nodes {
        for body in bodies_mut(&mut node.op) {
            changed |= dce(body);
        }
    }
    compact(g) || changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::check;

    #[test]
    fn removes_dead_nodes_and_constants() {
        check(
            dce,
            r#"graph @g(%x: f32[4], %unused: f32[2]) -> (%y) {
              const %c: f32[] = dense [2.0]
              const %dead_c: f32[] = dense [3.0]
              %a: f32[4] = unary{op = exp}(%x)
              %dead: f32[4] = binary{op = mul}(%a, %dead_c)
              %dead2: f32[4] = unary{op = neg}(%dead)
              %y: f32[4] = binary{op = mul}(%a, %c)
            }"#,
            r#"graph @g(%x: f32[4], %unused: f32[2]) -> (%y) {
              %a: f32[4] = unary{op = exp}(%x)
              const %c: f32[] = dense [2.0]
              %y: f32[4] = binary{op = mul}(%a, %c)
            }"#,
        );
    }

    #[test]
    fn keeps_live_multi_output_nodes_and_recurses_into_bodies() {
        check(
            dce,
            r#"graph @g(%c: bool[], %x: f32[2, 4]) -> (%y) {
              %p: f32[1, 4], %q: f32[1, 4] = split{axis = 0}(%x, _)
              %y: f32[1, 4] = if{then_branch = graph @t(%v: f32[1, 4]) -> (%v) {
                %junk: f32[1, 4] = unary{op = neg}(%v)
              }, else_branch = graph @e(%v: f32[1, 4]) -> (%w) {
                %w: f32[1, 4] = unary{op = exp}(%v)
              }}(%c, %p)
            }"#,
            r#"graph @g(%c: bool[], %x: f32[2, 4]) -> (%y) {
              %p: f32[1, 4], %q: f32[1, 4] = split{axis = 0}(%x, _)
              %y: f32[1, 4] = if{then_branch = graph @t(%v: f32[1, 4]) -> (%v) {
              }, else_branch = graph @e(%v: f32[1, 4]) -> (%w) {
                %w: f32[1, 4] = unary{op = exp}(%v)
              }}(%c, %p)
            }"#,
        );
    }

    #[test]
    fn nothing_to_remove() {
        let src = r#"graph @g(%x: f32[4]) -> (%y, %x) {
              %y: f32[4] = unary{op = exp}(%x)
            }"#;
        check(dce, src, src);
    }
}
