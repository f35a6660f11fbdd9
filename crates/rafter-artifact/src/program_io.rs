//! The seam to the Program text format (`rafter_ir::program_text`).

use rafter_ir::program::Program;
use rafter_ir::program_text::{parse_program, print_program, WeightMode, WeightResolver};

/// The program in weight-reference mode: weights are `external`, their bytes live in the
/// weights section.
pub fn print_reference(program: &Program) -> String {
    print_program(program, WeightMode::Reference)
}

/// Parses and verifies the program text, resolving each weight through `resolve`.
pub fn parse(src: &str, resolve: &mut WeightResolver<'_>) -> Result<Program, String> {
    parse_program(src, resolve).map_err(|e| e.to_string())
}
