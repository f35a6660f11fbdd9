//! Hostile input to the IR's readers (issue 28, item 6): the text format (graphs, dims,
//! types) and `.npy` files. Each case must be an error that says what is wrong and where
//! (a line and column, or the part of the file), never a panic, a stack overflow or an
//! allocation sized by the input.

use rafter_ir::npy;
use rafter_ir::text::{parse_dim, parse_graph, parse_type};

const VALID: &str = "graph @main(%x: f32[batch, 4]) -> (%y) {
  const %w: f32[4] = dense [1.0, 2.0, 3.0, 4.0]
  %t: f32[batch, 4] = binary{op = add}(%x, %w)
  %y: f32[batch, 4] = unary{op = neg}(%t)
}";

#[test]
fn the_valid_graph_parses() {
    parse_graph(VALID).unwrap();
}

#[test]
fn empty_and_blank_text_is_an_error_at_line_one() {
    for src in ["", "   \n\t ", "// only a comment\n"] {
        let e = parse_graph(src).unwrap_err();
        assert!(!e.message.is_empty(), "{src:?}");
        assert!(e.line >= 1, "{src:?}: {e:?}");
    }
}

#[test]
fn truncated_at_every_character_is_an_error() {
    for end in (0..VALID.len()).filter(|&i| VALID.is_char_boundary(i)) {
        let cut = &VALID[..end];
        let e = match parse_graph(cut) {
            Err(e) => e,
            Ok(_) => panic!("a graph cut at byte {end} parsed: {cut:?}"),
        };
        assert!(!e.message.is_empty());
    }
}

#[test]
fn deeply_nested_dim_parentheses_are_refused_not_a_stack_overflow() {
    for depth in [64, 100_000] {
        let src = format!("{}a{}", "(".repeat(depth), ")".repeat(depth));
        let result = parse_dim(&src);
        if depth == 64 {
            result.unwrap();
        } else {
            let e = result.unwrap_err();
            assert!(e.message.contains("nest"), "{e:?}");
        }
    }
}

#[test]
fn deeply_nested_subgraphs_are_refused_not_a_stack_overflow() {
    let depth = 20_000;
    let mut src = String::new();
    for i in 0..depth {
        src.push_str(&format!(
            "graph @g{i}(%c: bool[], %v: f32[]) -> (%y) {{\n %y: f32[] = if{{then_branch = "
        ));
    }
    src.push_str("graph @leaf(%v: f32[]) -> (%v) {}");
    for _ in 0..depth {
        src.push_str(", else_branch = graph @e(%v: f32[]) -> (%v) {}}(%c, %v)\n}");
    }
    let e = parse_graph(&src).unwrap_err();
    assert!(e.message.contains("nest"), "{e:?}");
}

#[test]
fn huge_dims_are_errors_or_values_never_overflow_panics() {
    // A literal past i64 is a parse error naming it.
    let e = parse_type("f32[99999999999999999999999]").unwrap_err();
    assert!(e.message.contains("99999999999999999999999"), "{e:?}");
    let e = parse_dim("99999999999999999999999 * a").unwrap_err();
    assert!(e.message.contains("99999999999999999999999"), "{e:?}");
    // Dims that fit one by one but whose product overflows: the graph is refused when it is
    // checked, not with an arithmetic overflow.
    let src = "graph @main(%x: f32[9223372036854775807, 9223372036854775807]) -> (%y) {
  %y: f32[9223372036854775807, 9223372036854775807] = unary{op = neg}(%x)
}";
    let _ = parse_graph(src);
    // Folding constant dims that overflow.
    for src in [
        "9223372036854775807 * 9223372036854775807",
        "9223372036854775807 + 9223372036854775807",
        "-9223372036854775807 - 9223372036854775807",
        "-(-9223372036854775808)",
    ] {
        let e = parse_dim(src).unwrap_err();
        assert!(e.message.contains("overflows i64"), "{src}: {e:?}");
    }
}

#[test]
fn oversized_dense_constants_are_an_error_not_an_allocation() {
    let src = "graph @main() -> (%w) {
  const %w: f32[4611686018427387904] = dense [1.0]
}";
    let e = parse_graph(src).unwrap_err();
    assert!(!e.message.is_empty());
    let src = "graph @main() -> (%w) {
  const %w: f32[3] = hex \"0000803f\"
}";
    let e = parse_graph(src).unwrap_err();
    assert!(!e.message.is_empty());
}

/// A version-1 `.npy` file with header `dict` (padded) and `payload`.
fn npy_file(dict: &str, payload: &[u8]) -> Vec<u8> {
    let mut header = dict.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    out
}

fn npy_err(bytes: &[u8]) -> String {
    match npy::parse(bytes) {
        Err(npy::ParseFail::Format(m)) | Err(npy::ParseFail::Dtype(m)) => m,
        Ok((d, dims, _)) => panic!("accepted: {d} {dims:?}"),
    }
}

#[test]
fn npy_valid_then_every_truncation_is_an_error() {
    let good = npy_file(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        &[0u8; 24],
    );
    let (_, dims, payload) = npy::parse(&good).unwrap();
    assert_eq!((dims, payload.len()), (vec![2, 3], 24));
    for end in 0..good.len() {
        assert!(!npy_err(&good[..end]).is_empty(), "cut at {end}");
    }
}

#[test]
fn npy_hostile_headers() {
    assert!(npy_err(b"").contains("magic"));
    // A header length past the end of the file (v1 u16, v2 u32).
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(npy_err(&v2).contains("past the end"));
    // A shape whose byte size overflows.
    let e = npy_err(&npy_file(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
        &[],
    ));
    assert!(e.contains("overflows"), "{e}");
    // A dim past usize.
    let e = npy_err(&npy_file(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
        &[],
    ));
    assert!(e.contains("bad shape"), "{e}");
    // Negative dims, and a payload shorter than the shape.
    let e = npy_err(&npy_file(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
        &[],
    ));
    assert!(e.contains("bad shape"), "{e}");
    let e = npy_err(&npy_file(
        "{'descr': '<f4', 'fortran_order': True, 'shape': (1000000, 1000000), }",
        &[0; 16],
    ));
    assert!(e.contains("needs"), "{e}");
    // Unknown and big-endian dtypes, and a header with no fields.
    assert!(npy_err(&npy_file(
        "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
        &[0; 4]
    ))
    .contains(">f4"));
    assert!(npy_err(&npy_file("{}", &[])).contains("descr"));
    // A zero dim beside a huge one holds no element; the product is zero.
    let empty = npy_file(
        "{'descr': '<f4', 'fortran_order': True, 'shape': (0, 18446744073709551615), }",
        &[],
    );
    let (_, dims, payload) = npy::parse(&empty).unwrap();
    assert_eq!((dims.len(), payload.len()), (2, 0));
}
