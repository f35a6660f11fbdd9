//! `attention` on the Vulkan device (lavapipe in CI), against the reference executor:
//! 3-D and 4-D operands, grouped key/value heads, causal, bool and float masks (broadcast
//! and narrower than the keys), past keys and values with the present outputs, softcap,
//! explicit scale, sliding windows, `nonpad_kv_seqlen`, every `qk_matmul_output_mode`,
//! a fully masked row, f16 keys and values under f32 queries and all-f16 attention. Every
//! module passes spirv-val.

use crate::common;

use rafter_codegen_spirv::{attention, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

/// One attention configuration.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    past: usize,
    d: usize,
    dv: usize,
    /// 3-D operands `[B, S, H * D]` (else 4-D).
    split: bool,
    causal: bool,
    /// Mask dims and whether it is bool.
    mask: Option<(&'static [usize], bool)>,
    nonpad: Option<&'static [i64]>,
    softcap: f32,
    scale: Option<f32>,
    window: (i64, i64),
    /// The qk_matmul_output mode, where the case asks for that output.
    qk_mode: Option<i64>,
    presents: bool,
    q_dtype: &'static str,
    kv_dtype: &'static str,
}

const BASE: Case = Case {
    name: "4-D",
    batch: 2,
    hq: 3,
    hkv: 3,
    sq: 4,
    skv: 5,
    past: 0,
    d: 8,
    dv: 8,
    split: false,
    causal: false,
    mask: None,
    nonpad: None,
    softcap: 0.0,
    scale: None,
    window: (-1, -1),
    qk_mode: None,
    presents: false,
    q_dtype: "f32",
    kv_dtype: "f32",
};

fn dtype(name: &str) -> DType {
    if name == "f16" {
        DType::F16
    } else {
        DType::F32
    }
}

/// An operand's dims: `[B, S, H * W]` or `[B, H, S, W]`.
fn operand(c: &Case, heads: usize, seq: usize, width: usize) -> Vec<usize> {
    if c.split {
        vec![c.batch, seq, heads * width]
    } else {
        vec![c.batch, heads, seq, width]
    }
}

/// The body text of `c` and its output dims and types (absent outputs skipped).
fn body(c: &Case) -> (String, Vec<(DType, Vec<usize>)>) {
    let total = c.past + c.skv;
    let (q, k, v) = (
        operand(c, c.hq, c.sq, c.d),
        operand(c, c.hkv, c.skv, c.d),
        operand(c, c.hkv, c.skv, c.dv),
    );
    let (qt, kt) = (c.q_dtype, c.kv_dtype);
    let mut params = format!(
        "%q: {qt}[{}], %k: {kt}[{}], %v: {kt}[{}]",
        common::dims_text(&q),
        common::dims_text(&k),
        common::dims_text(&v)
    );
    let mut args = vec!["%q", "%k", "%v"];
    let mut arg = |present: bool, name: &'static str| args.push(if present { name } else { "_" });
    if let Some((dims, is_bool)) = c.mask {
        let t = if is_bool { "bool" } else { qt };
        params += &format!(", %m: {t}[{}]", common::dims_text(dims));
    }
    arg(c.mask.is_some(), "%m");
    let pk = [c.batch, c.hkv, c.past, c.d];
    let pv = [c.batch, c.hkv, c.past, c.dv];
    if c.past > 0 {
        params += &format!(
            ", %pk: {kt}[{}], %pv: {kt}[{}]",
            common::dims_text(&pk),
            common::dims_text(&pv)
        );
    }
    arg(c.past > 0, "%pk");
    arg(c.past > 0, "%pv");
    if c.nonpad.is_some() {
        params += &format!(", %n: i64[{}]", c.batch);
    }
    arg(c.nonpad.is_some(), "%n");
    while args.last() == Some(&"_") {
        args.pop();
    }
    let y = if c.split {
        vec![c.batch, c.sq, c.hq * c.dv]
    } else {
        vec![c.batch, c.hq, c.sq, c.dv]
    };
    let mut outs = vec![(dtype(qt), y.clone())];
    let mut defs = vec![format!("%y: {qt}[{}]", common::dims_text(&y))];
    let mut names = vec!["%y"];
    let present = [
        ("%pko", [c.batch, c.hkv, total, c.d]),
        ("%pvo", [c.batch, c.hkv, total, c.dv]),
    ];
    for (name, dims) in present {
        if c.presents {
            defs.push(format!("{name}: {kt}[{}]", common::dims_text(&dims)));
            names.push(name);
            outs.push((dtype(kt), dims.to_vec()));
        } else {
            defs.push("_".into());
        }
    }
    if c.qk_mode.is_some() {
        let dims = [c.batch, c.hq, c.sq, total];
        defs.push(format!("%qk: {qt}[{}]", common::dims_text(&dims)));
        names.push("%qk");
        outs.push((dtype(qt), dims.to_vec()));
    }
    while defs.last().map(String::as_str) == Some("_") {
        defs.pop();
    }
    let scale = c
        .scale
        .map_or(String::new(), |s| format!(", scale = {s:?}"));
    let text = format!(
        "graph @a({params}) -> ({}) {{\n  {} = attention{{is_causal = {}, kv_num_heads = {}, q_num_heads = {}, qk_matmul_output_mode = {}, softcap = {:?}, left_window_size = {}, right_window_size = {}{scale}}}({})\n}}",
        names.join(", "),
        defs.join(", "),
        c.causal,
        c.hkv,
        c.hq,
        c.qk_mode.unwrap_or(0),
        c.softcap,
        c.window.0,
        c.window.1,
        args.join(", "),
    );
    (text, outs)
}

/// The inputs of `c`, in the body's order.
fn inputs(c: &Case) -> Vec<Tensor> {
    let (qt, kt) = (dtype(c.q_dtype), dtype(c.kv_dtype));
    let dims = [
        (qt, operand(c, c.hq, c.sq, c.d)),
        (kt, operand(c, c.hkv, c.skv, c.d)),
        (kt, operand(c, c.hkv, c.skv, c.dv)),
    ];
    let mut out: Vec<Tensor> = dims
        .iter()
        .enumerate()
        .map(|(i, (t, d))| {
            let n = d.iter().product();
            common::floats(*t, d, &common::inputs_in((-2.0, 2.0), n, i as u64 + 1))
        })
        .collect();
    if let Some((dims, is_bool)) = c.mask {
        let n = dims.iter().product();
        let values = common::inputs_in((-1.0, 1.0), n, 7);
        out.push(common::floats(
            if is_bool { DType::Bool } else { qt },
            dims,
            &values,
        ));
    }
    if c.past > 0 {
        for (seed, w) in [(8, c.d), (9, c.dv)] {
            let d = [c.batch, c.hkv, c.past, w];
            let n = d.iter().product();
            out.push(common::floats(
                kt,
                &d,
                &common::inputs_in((-2.0, 2.0), n, seed),
            ));
        }
    }
    if let Some(n) = c.nonpad {
        let bytes: Vec<u8> = n.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.push(Tensor::from_le_bytes(DType::I64, &[c.batch], &bytes).unwrap());
    }
    out
}

/// Runs `c` on the device and checks every output against the reference; `None` without
/// a device. Returns the number of output elements compared.
fn check(c: &Case) -> Option<usize> {
    let (text, outs) = body(c);
    let g = parse_graph(&text).unwrap_or_else(|e| panic!("{}: {text}: {e}", c.name));
    let kernel = attention(&g).unwrap_or_else(|e| panic!("{}: {text}: {e}", c.name));
    common::spirv_val(&kernel.spirv, "attention");
    let device = common::device_or_skip("attention")?;
    let inputs = inputs(c);
    let module = kernel_module(&g, 0).unwrap();
    let dtypes: Vec<DType> = outs.iter().map(|o| o.0).collect();
    let dims: Vec<Vec<usize>> = outs.iter().map(|o| o.1.clone()).collect();
    let got = common::run_typed_outputs(&device, &module, &inputs, &dtypes, &dims);
    let want = rafter_reference::run(&g, inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let (atol, rtol) = if c.q_dtype == "f16" || c.kv_dtype == "f16" {
        (4e-3, 1e-2)
    } else {
        (2e-5, 2e-5)
    };
    let mut compared = 0;
    for (o, (got, want)) in got.iter().zip(&want).enumerate() {
        let (got, want) = (got.to_f64_vec(), want.to_f64_vec());
        assert_eq!(got.len(), want.len(), "{}: output {o} length", c.name);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                common::close(g as f32, w as f32, atol, rtol),
                "{}: output {o} element {i}: got {g}, want {w}\n{text}",
                c.name
            );
        }
        compared += got.len();
    }
    Some(compared)
}

fn check_all(cases: &[Case]) {
    for c in cases {
        if check(c).is_none() {
            return;
        }
    }
}

#[test]
fn plain_3d_and_4d_attention_match_the_reference() {
    check_all(&[
        BASE,
        Case {
            name: "3-D",
            split: true,
            ..BASE
        },
        Case {
            name: "3-D, value size 4",
            split: true,
            dv: 4,
            ..BASE
        },
        Case {
            name: "scaled",
            scale: Some(0.3),
            ..BASE
        },
        Case {
            name: "softcap",
            softcap: 2.0,
            qk_mode: Some(0),
            ..BASE
        },
        Case {
            name: "one query",
            sq: 1,
            skv: 7,
            ..BASE
        },
    ]);
}

#[test]
fn grouped_query_heads_match_the_reference() {
    check_all(&[
        Case {
            name: "gqa 4-D",
            hq: 6,
            hkv: 2,
            ..BASE
        },
        Case {
            name: "gqa 3-D causal",
            hq: 4,
            hkv: 2,
            split: true,
            causal: true,
            ..BASE
        },
        Case {
            name: "mqa",
            hq: 4,
            hkv: 1,
            ..BASE
        },
    ]);
}

#[test]
fn causal_masks_and_windows_match_the_reference() {
    check_all(&[
        Case {
            name: "causal",
            causal: true,
            ..BASE
        },
        Case {
            name: "bool mask [sq, L]",
            mask: Some((&[4, 5], true)),
            ..BASE
        },
        Case {
            name: "float mask [B, 1, sq, L]",
            mask: Some((&[2, 1, 4, 5], false)),
            ..BASE
        },
        Case {
            name: "float mask [B, H, sq, L] causal",
            mask: Some((&[2, 3, 4, 5], false)),
            causal: true,
            ..BASE
        },
        Case {
            name: "bool mask 3-D [H, sq, L]",
            mask: Some((&[3, 4, 5], true)),
            split: true,
            ..BASE
        },
        Case {
            name: "narrow mask [1, 3]",
            mask: Some((&[1, 3], false)),
            ..BASE
        },
        Case {
            name: "window (2, 0)",
            window: (2, 0),
            ..BASE
        },
        Case {
            name: "window (1, 1) causal",
            window: (1, 1),
            causal: true,
            ..BASE
        },
        Case {
            name: "nonpad",
            nonpad: Some(&[3, 5]),
            causal: true,
            ..BASE
        },
        Case {
            name: "nonpad 0 (a fully masked batch)",
            nonpad: Some(&[0, 4]),
            qk_mode: Some(3),
            ..BASE
        },
    ]);
}

#[test]
fn past_keys_and_present_outputs_match_the_reference() {
    check_all(&[
        Case {
            name: "past 4-D",
            past: 3,
            presents: true,
            ..BASE
        },
        Case {
            name: "past 3-D gqa causal",
            past: 6,
            hq: 4,
            hkv: 2,
            split: true,
            causal: true,
            presents: true,
            ..BASE
        },
        Case {
            name: "past, presents only of many rows",
            past: 20,
            sq: 1,
            presents: true,
            ..BASE
        },
        Case {
            name: "past, no presents",
            past: 2,
            causal: true,
            ..BASE
        },
    ]);
}

#[test]
fn every_qk_matmul_output_mode_matches_the_reference() {
    for mode in 0..4 {
        check_all(&[Case {
            name: "qk output",
            qk_mode: Some(mode),
            softcap: 3.0,
            mask: Some((&[4, 5], false)),
            causal: true,
            ..BASE
        }]);
    }
}

#[test]
fn f16_keys_and_values_and_f16_attention_match_the_reference() {
    check_all(&[
        Case {
            name: "f16 kv",
            kv_dtype: "f16",
            ..BASE
        },
        // Not with the present outputs: the reference returns them in the queries' type
        // where the IR's type is the keys' (f16), so it cannot run that body.
        Case {
            name: "f16 kv past",
            kv_dtype: "f16",
            past: 3,
            causal: true,
            ..BASE
        },
        Case {
            name: "f16",
            q_dtype: "f16",
            kv_dtype: "f16",
            causal: true,
            ..BASE
        },
        Case {
            name: "f16 3-D masked",
            q_dtype: "f16",
            kv_dtype: "f16",
            split: true,
            mask: Some((&[4, 5], false)),
            qk_mode: Some(3),
            ..BASE
        },
    ]);
}

/// Variants the kernel does not generate are refused with a reason (the node then stays
/// on the CPU), never a panic.
#[test]
fn unsupported_variants_are_refused_with_a_reason() {
    let refused = |text: &str, needle: &str| {
        let g = parse_graph(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let err = attention(&g)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"));
        assert!(err.contains(needle), "{err}");
        assert!(rafter_codegen_spirv::supports(&g).is_err());
    };
    refused(
        "graph @a(%q: bf16[1, 2, 2, 4], %k: bf16[1, 2, 3, 4], %v: bf16[1, 2, 3, 4]) -> (%y) {\n  %y: bf16[1, 2, 2, 4] = attention{is_causal = false, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v)\n}",
        "bf16",
    );
    refused(
        "graph @a(%q: f16[1, 2, 2, 4], %k: f16[1, 2, s, 4], %v: f16[1, 2, s, 4]) -> (%y) {\n  %y: f16[1, 2, 2, 4] = attention{is_causal = false, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v)\n}",
        "f16 attention over a symbolic key length",
    );
    refused(
        "graph @a(%q: f32[1, 2, 2, 4], %k: f32[1, 2, 3, n], %v: f32[1, 2, 3, 4]) -> (%y) {\n  %y: f32[1, 2, 2, 4] = attention{is_causal = false, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v)\n}",
        "not static",
    );
    // Ten buffers (q, k, v, mask, past key and value; four results): past the 8 that fit
    // in push constants, their addresses go through the argument block in memory.
    let ten = parse_graph("graph @a(%q: f32[1, 2, 2, 4], %k: f32[1, 2, 3, 4], %v: f32[1, 2, 3, 4], %m: f32[2, 4], %pk: f32[1, 2, 1, 4], %pv: f32[1, 2, 1, 4]) -> (%y, %a, %b, %s) {\n  %y: f32[1, 2, 2, 4], %a: f32[1, 2, 4, 4], %b: f32[1, 2, 4, 4], %s: f32[1, 2, 2, 4] = attention{is_causal = false, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v, %m, %pk, %pv)\n}").unwrap();
    attention(&ten).unwrap_or_else(|e| panic!("ten bindings refused: {e}"));
    rafter_codegen_spirv::supports(&ten).unwrap();
    refused(
        "graph @a(%q: f32[1, 2, 2, 4], %k: f32[1, 2, 5000, 4], %v: f32[1, 2, 5000, 4]) -> (%y) {\n  %y: f32[1, 2, 2, 4] = attention{is_causal = false, kv_num_heads = 0, q_num_heads = 0, qk_matmul_output_mode = 0, softcap = 0.0, left_window_size = -1, right_window_size = -1}(%q, %k, %v)\n}",
        "key length 5000",
    );
}
