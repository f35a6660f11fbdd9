//! Fuzzes rafter-ir's text readers with arbitrary text: the graph format
//! (`text::parse_graph`, with `parse_dim` and `parse_type`) and the program format
//! (`program_text::parse_program_inline`). Each returns a value or a `ParseError`, never a
//! panic, a stack overflow or an allocation sized by the text. Accepted graphs that verify,
//! and accepted programs (which the parser verifies), must survive print → parse.
//!
//! Seeds: `fuzz/seeds/read_ir_text/` (`graph_*` and `program_*`; `cargo test -p rafter-ir
//! --test fuzz_seeds` keeps them parsing). Run with `fuzz/run_all.sh SECONDS read_ir_text`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_ir::text::{parse_dim, parse_graph, parse_type, print_graph};

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(g) = parse_graph(src) {
        if rafter_ir::verify(&g).is_ok() {
            let back = parse_graph(&print_graph(&g)).expect("printed graphs parse");
            assert_eq!(back, g, "graph text round trip");
        }
    }
    if let Ok(p) = parse_program_inline(src) {
        let text = print_program(&p, WeightMode::Inline);
        let back = parse_program_inline(&text).expect("printed programs parse");
        assert_eq!(back, p, "program text round trip");
    }
    if let Ok(d) = parse_dim(src) {
        assert_eq!(parse_dim(&d.to_string()).ok(), Some(d), "dim round trip");
    }
    if let Ok(t) = parse_type(src) {
        assert_eq!(parse_type(&t.to_string()).ok(), Some(t), "type round trip");
    }
});
