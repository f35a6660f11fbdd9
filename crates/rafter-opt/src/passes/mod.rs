//! Graph-to-graph passes. Each takes a `&mut Graph`, keeps it valid for
//! [`rafter_ir::verify()`], only makes type-preserving rewrites (a value is replaced by another
//! of exactly the same type), and returns whether it changed anything. Passes recurse into
//! control-flow bodies.

mod canon;
mod cse;
mod dce;
mod fold;
mod shapes;

pub use canon::canonicalize;
pub use cse::cse;
pub use dce::dce;
pub use fold::{fold_constants, FOLD_LIMIT_BYTES};
pub use shapes::shapes_from_inputs;

#[cfg(test)]
pub(crate) mod testing {
    use rafter_ir::text::{parse_graph, print_graph};
    use rafter_ir::Graph;

    pub fn parse(src: &str) -> Graph {
        let g = parse_graph(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        rafter_ir::verify(&g).unwrap();
        g
    }

    /// Runs `pass` on `input` and checks the result against `expected` (both normalised by
    /// compaction, so value numbering and constant order do not matter). The pass must
    /// report a change exactly when `expected` is not the same text as `input`.
    pub fn check(pass: fn(&mut Graph) -> bool, input: &str, expected: &str) {
        let mut g = parse(input);
        let changed = pass(&mut g);
        rafter_ir::verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", print_graph(&g)));
        crate::util::compact(&mut g);
        let mut want = parse(expected);
        crate::util::compact(&mut want);
        let (got, want) = (print_graph(&g), print_graph(&want));
        assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}");
        assert_eq!(changed, input != expected, "changed flag");
    }
}
