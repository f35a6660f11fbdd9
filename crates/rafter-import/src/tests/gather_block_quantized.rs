//! `GatherBlockQuantized` (com.microsoft) with bad attributes and operands: each must be an
//! error naming the node and what is wrong, never a panic, and the operand forms ORT's CPU
//! kernel accepts must import. ORT's rules (its `gather_block_quantized.cc`): uint8 data
//! with bits 2, 4 or 8; block_size a power of 2 >= 16; gather_axis 0 and quantize_axis the
//! last axis; scales of data's rank with `ceil(values / block_size)` blocks per row; zero
//! points of scales' shape, packed like the data along the last axis; int32/int64 indices.

use super::*;

const F32: i32 = 1;
const U8: i32 = 2;
const I8: i32 = 3;
const I32: i32 = 6;
const I64: i32 = 7;
const BOOL: i32 = 9;
const F16: i32 = 10;
const F64: i32 = 11;
const UINT4: i32 = 21;

/// A shrunk tied embedding (ORT GenAI's builder): 8 rows of 32 4-bit values (16 bytes) in
/// blocks of 16, so 2 scales and 1 byte of packed zero points per row.
fn inputs() -> Vec<ValueInfoProto> {
    vec![
        tvi("data", U8, &["8", "16"]),
        tvi("indices", I64, &["2", "3"]),
        tvi("scales", F32, &["8", "2"]),
        tvi("zero_points", U8, &["8", "1"]),
    ]
}

/// Blocks of 16 (the attribute's default, 128, would want 1 scale a row).
fn block16() -> AttributeProto {
    ai("block_size", 16)
}

/// `inputs()` with operand `i` declared as `elem` of `dims` instead.
fn with(i: usize, elem: i32, dims: &[&str]) -> Vec<ValueInfoProto> {
    let mut v = inputs();
    v[i] = tvi(&v[i].name.clone(), elem, dims);
    v
}

/// The node `embed` over graph inputs `ins` (in operand order).
fn gbq(ins: Vec<ValueInfoProto>, attrs: Vec<AttributeProto>) -> ModelProto {
    let names: Vec<String> = ins.iter().map(|v| v.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut n = node("GatherBlockQuantized", "embed", &names, &["y"], attrs);
    n.domain = "com.microsoft".into();
    let mut m = model(17, graph(vec![n], ins, &["y"], vec![]));
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.microsoft".into(),
        version: 1,
    });
    m
}

/// The imported output's type.
fn gbq_ok(ins: Vec<ValueInfoProto>, attrs: Vec<AttributeProto>) -> String {
    let g = import_real(&gbq(ins, attrs))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph;
    g.value(g.outputs[0]).ty.to_string()
}

/// The import error, which must name the node.
fn gbq_err(ins: Vec<ValueInfoProto>, attrs: Vec<AttributeProto>) -> String {
    let e = match import_real(&gbq(ins, attrs)) {
        Ok(_) => panic!("imported"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with("t.onnx: node `embed` (GatherBlockQuantized): "),
        "{e}"
    );
    e
}

fn expect(ins: Vec<ValueInfoProto>, attrs: Vec<AttributeProto>, want: &str) {
    let e = gbq_err(ins, attrs);
    assert!(e.contains(want), "want `{want}` in: {e}");
}

#[test]
fn the_forms_ort_accepts_import() {
    assert_eq!(gbq_ok(inputs(), vec![block16()]), "f32[2, 3, 32]");
    // No zero points; int32 indices; f16 scales (f16 out); quantize_axis counted back.
    assert_eq!(
        gbq_ok(inputs()[..3].to_vec(), vec![block16()]),
        "f32[2, 3, 32]"
    );
    assert_eq!(gbq_ok(with(1, I32, &["5"]), vec![block16()]), "f32[5, 32]");
    let mut ins = with(2, F16, &["8", "2"]);
    ins.truncate(3);
    assert_eq!(gbq_ok(ins, vec![block16()]), "f16[2, 3, 32]");
    assert_eq!(
        gbq_ok(inputs(), vec![block16(), ai("quantize_axis", -1)]),
        "f32[2, 3, 32]"
    );
    // 8 bits: one value a byte, zero points unpacked; 2 bits: four a byte.
    let mut ins = with(0, U8, &["8", "32"]);
    ins[3] = tvi("zero_points", U8, &["8", "2"]);
    assert_eq!(gbq_ok(ins, vec![block16(), ai("bits", 8)]), "f32[2, 3, 32]");
    let ins = with(0, U8, &["8", "8"]);
    assert_eq!(gbq_ok(ins, vec![block16(), ai("bits", 2)]), "f32[2, 3, 32]");
    // Rank 3, a short last block (40 values in blocks of 16: 3 blocks, 2 zero-point bytes).
    let ins = vec![
        tvi("data", U8, &["8", "2", "20"]),
        tvi("indices", I64, &["4"]),
        tvi("scales", F32, &["8", "2", "3"]),
        tvi("zero_points", U8, &["8", "2", "2"]),
    ];
    assert_eq!(
        gbq_ok(ins, vec![block16(), ai("quantize_axis", 2)]),
        "f32[4, 2, 40]"
    );
}

#[test]
fn bits_and_block_size_outside_orts_rules() {
    for bits in [0, 1, 3, 5, 16, -4] {
        let e = gbq_err(inputs(), vec![block16(), ai("bits", bits)]);
        assert!(
            e.ends_with(&format!("unsupported: bits={bits} (2, 4 and 8 are)")),
            "{e}"
        );
    }
    for block in [0, 8, 24, 100, -16] {
        expect(
            inputs(),
            vec![ai("block_size", block)],
            &format!("block_size {block} is not a power of 2 >= 16"),
        );
    }
    // An attribute of the wrong kind.
    expect(
        inputs(),
        vec![block16(), af("bits", 4.0)],
        "attribute `bits` should be an int, found Float",
    );
}

#[test]
fn data_other_than_packed_uint8() {
    for (elem, name) in [(I8, "i8"), (F32, "f32"), (I32, "i32")] {
        expect(
            with(0, elem, &["8", "16"]),
            vec![block16()],
            &format!("unsupported: data of type {name} (packed uint8 is supported)"),
        );
    }
    // ONNX's uint4 has no rafter type: refused where the graph declares it.
    let e = import_real(&gbq(with(0, UINT4, &["8", "32"]), vec![block16()]))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t.onnx: graph input `data`: "), "{e}");
}

#[test]
fn data_of_too_few_dims_or_unknown_sizes() {
    for dims in [&[][..], &["16"][..]] {
        expect(
            with(0, U8, dims),
            vec![block16()],
            "must have rank 2 or more",
        );
    }
    expect(
        with(0, U8, &["rows", "16"]),
        vec![block16()],
        "data u8[rows, 16]: its first and last dims must be known at import",
    );
    expect(
        with(0, U8, &["8", "?"]),
        vec![block16()],
        "its first and last dims must be known at import",
    );
}

#[test]
fn axes_other_than_gather_0_and_quantize_last() {
    for (attrs, want) in [
        (
            vec![ai("gather_axis", 1)],
            "needs gather_axis 0 and quantize_axis the last axis (got 1 and 1)",
        ),
        (
            vec![ai("quantize_axis", 0)],
            "needs gather_axis 0 and quantize_axis the last axis (got 0 and 0)",
        ),
        (
            vec![ai("gather_axis", -1)],
            "needs gather_axis 0 and quantize_axis the last axis (got 1 and 1)",
        ),
        (
            vec![ai("gather_axis", 2)],
            "gather_axis 2 is out of range for data of rank 2",
        ),
        (
            vec![ai("quantize_axis", -3)],
            "quantize_axis -3 is out of range for data of rank 2",
        ),
    ] {
        let mut attrs = attrs;
        attrs.push(block16());
        expect(inputs(), attrs, want);
    }
    // Rank 3: the middle axis is neither.
    let ins = vec![
        tvi("data", U8, &["8", "2", "16"]),
        tvi("indices", I64, &["4"]),
        tvi("scales", F32, &["8", "2", "2"]),
    ];
    expect(
        ins,
        vec![block16(), ai("quantize_axis", 1)],
        "(got 0 and 1)",
    );
}

#[test]
fn scales_of_the_wrong_type_or_shape() {
    for (elem, name) in [(I32, "i32"), (F64, "f64"), (U8, "u8")] {
        expect(
            with(2, elem, &["8", "2"]),
            vec![block16()],
            &format!("unsupported: scales of type {name} (f32, f16 or bf16)"),
        );
    }
    // 32 values a row in blocks of 16: [8, 2].
    for dims in [
        &["8", "3"][..],
        &["8", "1"],
        &["7", "2"],
        &["8"],
        &[],
        &["8", "1", "2"],
    ] {
        let e = gbq_err(with(2, F32, dims), vec![block16()]);
        assert!(
            e.contains(
                "do not match data u8[8, 16]: want [8, ..., 2] (32 values per row in blocks of 16)"
            ),
            "{dims:?}: {e}"
        );
    }
    // Blocks of 32 make it [8, 1]; the default 128 too.
    expect(
        with(2, F32, &["8", "2"]),
        vec![ai("block_size", 32)],
        "want [8, ..., 1]",
    );
    expect(with(2, F32, &["8", "2"]), vec![], "want [8, ..., 1]");
    expect(
        with(2, F32, &["8", "?"]),
        vec![block16()],
        "scales f32[8, scales_d1]: its first and last dims must be known at import",
    );
    // Rank 3: the middle dims must be data's.
    let ins = vec![
        tvi("data", U8, &["8", "2", "16"]),
        tvi("indices", I64, &["4"]),
        tvi("scales", F32, &["8", "3", "2"]),
    ];
    expect(
        ins,
        vec![block16(), ai("quantize_axis", -1)],
        "do not match data u8[8, 2, 16]",
    );
}

#[test]
fn zero_points_of_the_wrong_type_or_shape() {
    // Two blocks a row, packed two 4-bit zero points a byte: [8, 1].
    for (elem, dims) in [
        (U8, &["8", "2"][..]),
        (U8, &["7", "1"]),
        (U8, &["8"]),
        (U8, &[]),
        (U8, &["8", "1", "1"]),
        (F32, &["8", "1"]),
        (I8, &["8", "1"]),
    ] {
        let e = gbq_err(with(3, elem, dims), vec![block16()]);
        assert!(
            e.contains("do not match scales f32[8, 2]: want uint8 [8, ..., 1] (2 packed 4-bit values per row)"),
            "{dims:?}: {e}"
        );
    }
    expect(
        with(3, U8, &["8", "?"]),
        vec![block16()],
        "zero_points u8[8, zero_points_d1]: its first and last dims must be known at import",
    );
}

#[test]
fn indices_other_than_int32_or_int64() {
    for (elem, name) in [(F32, "f32"), (I8, "i8"), (U8, "u8"), (BOOL, "bool")] {
        expect(
            with(1, elem, &["2", "3"]),
            vec![block16()],
            &format!("indices {name}[2, 3] must be int32 or int64"),
        );
    }
}

#[test]
fn missing_operands() {
    expect(
        inputs()[..2].to_vec(),
        vec![block16()],
        "missing required input 2 (of 2)",
    );
}

#[test]
fn tables_without_rows_or_values_and_sizes_that_overflow() {
    for dims in [["0", "16"], ["8", "0"]] {
        expect(
            with(0, U8, &dims),
            vec![block16()],
            "has no rows or no values per row",
        );
    }
    let huge = (i64::MAX / 2).to_string();
    expect(
        with(0, U8, &["8", &huge]),
        vec![block16()],
        "too many values per row",
    );
}
