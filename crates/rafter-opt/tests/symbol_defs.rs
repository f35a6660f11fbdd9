//! Symbols that shape arithmetic defines from the inputs' (strided convolutions and pools
//! over a symbolic height and width, a residual add of two of them) are defined in the
//! program, so the buffers they size are sized per call rather than by their producer on
//! the host; the definitions agree with what the reference executor computes for several
//! sizes, odd and even.

mod common;

use common::{check_equivalent_with, parse, rand_f32};
use rafter_codegen_spirv::SpirvBackend;
use rafter_ir::program::Storage;
use rafter_ir::{Symbol, SymbolExpr};
use rafter_opt::{CompileOptions, Target};

/// x [1, 2, h, w] → 3×3 conv, stride 2, pad 1 → relu → 3×3 max pool, stride 2, pad 1
/// (floor((floor((h + 1) / 2) + 1) / 2)), plus a 1×1 conv of stride 4 (floor((h + 3) / 4),
/// the same size by another path: their sum broadcasts two different symbols).
fn graph() -> String {
    let w1: Vec<String> = (0..2 * 2 * 9)
        .map(|i| format!("{:?}", (i % 7) as f32 * 0.25 - 0.75))
        .collect();
    let w2 = ["0.5", "-1.0", "1.5", "0.25"];
    format!(
        r#"graph @g(%x: f32[1, 2, h, w]) -> (%y) {{
  const %w1: f32[2, 2, 3, 3] = dense [{}]
  const %w2: f32[2, 2, 1, 1] = dense [{}]
  %c: f32[1, 2, _c0, _c1] = conv{{kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w1, _)
  %r: f32[1, 2, _c0, _c1] = unary{{op = relu}}(%c)
  %p: f32[1, 2, _p0, _p1] = pool{{kind = max, kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], dilations = [1, 1], auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, storage_order = 0}}(%r)
  %d: f32[1, 2, _d0, _d1] = conv{{kernel_shape = [1, 1], strides = [4, 4], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, auto_pad = explicit}}(%x, %w2, _)
  %y: f32[1, 2, _a0, _a1] = binary{{op = add}}(%p, %d)
}}"#,
        w1.join(", "),
        w2.join(", ")
    )
}

#[test]
fn strided_windows_and_their_broadcast_are_defined_and_agree_with_execution() {
    let g = parse(&graph());
    for (seed, (h, w)) in [(9, 7), (8, 8), (5, 12), (1, 2)].into_iter().enumerate() {
        let x = rand_f32(&[1, 2, h, w], seed as u64);
        let p = check_equivalent_with(&g, vec![x], &CompileOptions::default());
        let dynamic: Vec<&str> = p
            .buffers
            .iter()
            .filter(|b| b.storage == Storage::Dynamic)
            .map(|b| b.name.as_str())
            .collect();
        assert!(dynamic.is_empty(), "host-only buffers left: {dynamic:?}");
        let defs = &p.symbol_defs;
        assert_eq!(defs.len(), 8, "{defs:?}");
        let c0 = defs.iter().find(|d| d.symbol.name() == "_c0").expect("_c0");
        assert_eq!(c0.to_string(), "_c0 = floordiv(h + 1, 2)");
        let a0 = defs.iter().find(|d| d.symbol.name() == "_a0").expect("_a0");
        assert!(matches!(a0.expr, SymbolExpr::Broadcast { .. }), "{a0}");
    }
}

/// The buffers no longer count as sized by tensor values: what keeps a kernel off the GPU
/// is the generator's own limit, which `rafter plan` names instead.
#[test]
fn defined_sizes_are_not_a_placement_refusal() {
    let g = parse(&graph());
    let opts = CompileOptions {
        target: Target::cpu().with(std::sync::Arc::new(SpirvBackend)),
        ..CompileOptions::default()
    };
    let p = check_equivalent_with(&g, vec![rand_f32(&[1, 2, 9, 7], 3)], &opts);
    for k in 0..p.kernels.len() {
        if let Err(why) = rafter_opt::place::support(&p, k, &SpirvBackend) {
            assert!(!why.contains("sized by"), "kernel {k}: {why}");
        }
    }
    assert!(p.symbol_defs.iter().any(|d| d.symbol == Symbol::new("_p1")));
}

/// A definition the inputs cannot satisfy (a window larger than the padded input) is an
/// error naming the symbol, before any kernel runs.
#[test]
fn an_input_too_small_for_the_window_is_named() {
    let g = parse(
        r#"graph @g(%x: f32[1, 1, h]) -> (%y) {
  %y: f32[1, 1, _q0] = pool{kind = max, kernel_shape = [5], strides = [2], pads = [0, 0], dilations = [1], auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, storage_order = 0}(%x)
}"#,
    );
    let p = rafter_opt::compile(&g, &CompileOptions::default()).unwrap();
    let e = common::interpret(&p, vec![rand_f32(&[1, 1, 1], 0)]).unwrap_err();
    assert!(e.contains("_q0") && e.contains("negative"), "{e}");
}

/// An Expand whose shape is a graph input: its result's dims are defined as the expand
/// re-inferred on the call's shape values, so no buffer is host-only and the program
/// agrees with the reference for several shapes (one recording per shape).
#[test]
fn sizes_read_from_an_input_shape_are_defined_and_agree_with_execution() {
    let g = parse(
        r#"graph @g(%x: f32[3, 1], %s: i64[2]) -> (%y) {
  %e: f32[_e0, _e1] = expand(%x, %s)
  %y: f32[_e0, _e1] = unary{op = relu}(%e)
}"#,
    );
    for (seed, shape) in [[3i64, 4], [1, 2], [3, 1]].into_iter().enumerate() {
        let x = rand_f32(&[3, 1], seed as u64);
        let bytes: Vec<u8> = shape.iter().flat_map(|v| v.to_le_bytes()).collect();
        let c = rafter_ir::ConstData::new(rafter_ir::DType::I64, vec![2], bytes.into()).unwrap();
        let s = rafter_reference::Tensor::from_const(&c);
        let p = check_equivalent_with(&g, vec![x, s], &CompileOptions::default());
        assert!(p.buffers.iter().all(|b| b.storage != Storage::Dynamic));
        let defs: Vec<String> = p
            .symbol_defs
            .iter()
            .map(|d| d.symbol.name().to_string())
            .collect();
        assert_eq!(defs, ["_e0", "_e1"]);
        assert!(matches!(p.symbol_defs[0].expr, SymbolExpr::Values { .. }));
    }
}

/// A range to `max(past, total)` (ORT GenAI's present-buffer rows: the past length from a
/// shape, the total from an input's value), three ops of shape arithmetic away from the
/// inputs, is defined by re-running those ops; one whose limit a kernel computes from data
/// (a sum of a large tensor's elements) is not, and stays host-sized.
#[test]
fn sizes_from_several_ops_of_shape_arithmetic_are_defined_and_agree_with_execution() {
    let g = parse(
        r#"graph @g(%pk: f32[2, past, 3], %total: i32[1]) -> (%y) {
  %s: i64[1] = shape{start = 1, end = 2}(%pk)
  %c: i64[1] = cast{to = i64}(%total)
  %m: i64[1] = binary{op = max}(%s, %c)
  %q: i64[] = squeeze{axes = [0]}(%m)
  const %zero: i64[] = dense [0]
  const %one: i64[] = dense [1]
  %y: i64[_rows] = range(%zero, %q, %one)
}"#,
    );
    for (seed, (past, total)) in [(4usize, 7i32), (6, 2), (0, 1)].into_iter().enumerate() {
        let pk = rand_f32(&[2, past, 3], seed as u64);
        let c = rafter_ir::ConstData::new(
            rafter_ir::DType::I32,
            vec![1],
            total.to_le_bytes().to_vec().into(),
        )
        .unwrap();
        let t = rafter_reference::Tensor::from_const(&c);
        let p = check_equivalent_with(&g, vec![pk, t], &CompileOptions::default());
        assert!(p.buffers.iter().all(|b| b.storage != Storage::Dynamic));
        let [def] = p.symbol_defs.as_slice() else {
            panic!("{:?}", p.symbol_defs)
        };
        let SymbolExpr::Values { body, reads, .. } = &def.expr else {
            panic!("{def}")
        };
        assert_eq!(body.nodes.len(), 5, "{def}");
        assert_eq!(reads.len(), 1, "{def}");
    }
    let by_data = parse(
        r#"graph @g(%x: i64[100]) -> (%y) {
  %s: i64[] = reduce{kind = sum, axes = [0], keep_dims = false, noop_with_empty_axes = false}(%x)
  const %zero: i64[] = dense [0]
  const %one: i64[] = dense [1]
  %y: i64[_n] = range(%zero, %s, %one)
}"#,
    );
    let p = rafter_opt::compile(&by_data, &CompileOptions::default()).unwrap();
    assert!(p.symbol_defs.is_empty(), "{:?}", p.symbol_defs);
}

/// A float range whose limit is cast from an input (ONNX's expanded window functions):
/// inference carries no float element values through the cast, so the size is left to
/// the range's kernel (host-sized), and the program still runs as the reference does.
#[test]
fn a_float_limit_computed_from_an_input_is_left_to_the_kernel() {
    let g = parse(
        r#"graph @g(%n: i32[]) -> (%y) {
  %f: f32[] = cast{to = f32}(%n)
  const %zero: f32[] = dense [0.0]
  const %one: f32[] = dense [1.0]
  %y: f32[_r] = range(%zero, %f, %one)
}"#,
    );
    let c = rafter_ir::ConstData::new(
        rafter_ir::DType::I32,
        vec![],
        5i32.to_le_bytes().to_vec().into(),
    )
    .unwrap();
    let n = rafter_reference::Tensor::from_const(&c);
    let p = check_equivalent_with(&g, vec![n], &CompileOptions::default());
    assert!(p.symbol_defs.is_empty(), "{:?}", p.symbol_defs);
}
