//! The `read_ir_text` fuzz target's seeds (`fuzz/seeds/read_ir_text/`) stay valid: every
//! `graph_*` file parses as a graph and every `program_*` file as a program, so the fuzzer
//! starts from inputs that reach past the parser's first error. Graphs that verify also
//! survive print → parse, as the target checks.

use std::path::{Path, PathBuf};

use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_ir::text::{parse_graph, print_graph};

fn seeds(prefix: &str) -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/read_ir_text");
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {prefix}* seeds in {}", dir.display());
    out
}

#[test]
fn graph_seeds_parse() {
    let mut verified = 0;
    for (path, text) in seeds("graph_") {
        let g = parse_graph(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if rafter_ir::verify(&g).is_ok() {
            let back = parse_graph(&print_graph(&g)).unwrap();
            assert_eq!(back, g, "{}", path.display());
            verified += 1;
        }
    }
    assert!(
        verified > 0,
        "no graph seed verifies, so the round trip goes unfuzzed"
    );
}

#[test]
fn program_seeds_parse() {
    for (path, text) in seeds("program_") {
        let p = parse_program_inline(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let back = parse_program_inline(&print_program(&p, WeightMode::Inline)).unwrap();
        assert_eq!(back, p, "{}", path.display());
    }
}
