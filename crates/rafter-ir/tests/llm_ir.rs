//! The IR pieces LLMs need: weights in any format (`linear`, `embedding`, `moe_ffn`) and
//! state carried across calls (`states(...)`), through inference, the verifier and the text
//! format.

use rafter_ir::infer::{infer_node, InferInput};
use rafter_ir::text::{parse_graph, print_graph};
use rafter_ir::*;

fn ty(src: &str) -> TensorType {
    rafter_ir::text::parse_type(src).unwrap()
}

fn infer(op: Op, operands: &[Option<TensorType>]) -> Result<Vec<TensorType>, String> {
    let inputs: Vec<Option<InferInput<'_>>> = operands
        .iter()
        .map(|t| {
            t.as_ref().map(|ty| InferInput {
                ty,
                sym: None,
                konst: None,
            })
        })
        .collect();
    let mut n = 0;
    let mut fresh = |h: &str| {
        n += 1;
        Dim::symbol(&format!("{h}_{n}"))
    };
    infer_node(&op, &inputs, 1, &mut fresh).map(|r| r.types)
}

#[test]
fn linear_reads_rows_in_any_format() {
    let lin = |format| Op::Linear { format };
    // f32 weight [N, K]
    let out = infer(
        lin(WeightFormat::F32),
        &[Some(ty("f32[1, seq, 64]")), Some(ty("f32[96, 64]")), None],
    )
    .unwrap();
    assert_eq!(out, vec![ty("f32[1, seq, 96]")]);
    // bf16 weight with a bias
    let out = infer(
        lin(WeightFormat::BF16),
        &[
            Some(ty("f32[seq, 64]")),
            Some(ty("bf16[8, 64]")),
            Some(ty("f32[8]")),
        ],
    )
    .unwrap();
    assert_eq!(out, vec![ty("f32[seq, 8]")]);
    // q4_k: 512 values a row are 2 blocks of 144 bytes
    let out = infer(
        lin(WeightFormat::Q4K),
        &[Some(ty("f32[1, seq, 512]")), Some(ty("u8[3, 288]")), None],
    )
    .unwrap();
    assert_eq!(out, vec![ty("f32[1, seq, 3]")]);
    // q8_0: 64 values are 2 blocks of 34 bytes
    let out = infer(
        lin(WeightFormat::Q8_0),
        &[Some(ty("f32[2, 64]")), Some(ty("u8[5, 68]")), None],
    )
    .unwrap();
    assert_eq!(out, vec![ty("f32[2, 5]")]);
}

#[test]
fn linear_rejects_mismatched_weights() {
    let lin = |format| Op::Linear { format };
    let err = |op, a: &str, w: &str| infer(op, &[Some(ty(a)), Some(ty(w)), None]).unwrap_err();
    let e = err(lin(WeightFormat::F32), "f32[4, 64]", "f32[8, 32]");
    assert!(e.contains("64 vs 32"), "{e}");
    let e = err(lin(WeightFormat::Q4K), "f32[4, 256]", "u8[8, 143]");
    assert!(e.contains("143 bytes") && e.contains("q4_k"), "{e}");
    let e = err(lin(WeightFormat::Q4K), "f32[4, 256]", "f32[8, 256]");
    assert!(e.contains("stored as u8"), "{e}");
    let e = err(lin(WeightFormat::F16), "f16[4, 64]", "f16[8, 64]");
    assert!(e.contains("x (operand 0) must be f32"), "{e}");
    let e = err(lin(WeightFormat::F32), "f32[4, 64]", "f32[2, 8, 64]");
    assert!(e.contains("rank 2"), "{e}");
}

#[test]
fn embedding_gathers_rows() {
    let op = Op::Embedding {
        format: WeightFormat::Q8_0,
    };
    let out = infer(
        op.clone(),
        &[Some(ty("u8[1000, 68]")), Some(ty("i64[1, seq]"))],
    )
    .unwrap();
    assert_eq!(out, vec![ty("f32[1, seq, 64]")]);
    let e = infer(op, &[Some(ty("u8[1000, 68]")), Some(ty("f32[1, seq]"))]).unwrap_err();
    assert!(e.contains("i32 or i64"), "{e}");
}

fn moe(top_k: i64) -> Op {
    Op::MoeFfn {
        top_k,
        normalize: true,
        activation: FfnActivation::Silu,
        gate_format: WeightFormat::F32,
        up_format: WeightFormat::F32,
        down_format: WeightFormat::Q8_0,
    }
}

#[test]
fn moe_ffn_checks_every_expert_operand() {
    let ok = [
        Some(ty("f32[tokens, 64]")),
        Some(ty("f32[tokens, 8]")),
        Some(ty("f32[8, 32, 64]")),
        Some(ty("f32[8, 32, 64]")),
        Some(ty("u8[8, 64, 34]")),
    ];
    assert_eq!(infer(moe(2), &ok).unwrap(), vec![ty("f32[tokens, 64]")]);
    let e = infer(moe(9), &ok).unwrap_err();
    assert!(e.contains("top_k 9 must be in 1..=8"), "{e}");
    let mut bad = ok.clone();
    bad[4] = Some(ty("u8[8, 64, 68]"));
    let e = infer(moe(2), &bad).unwrap_err();
    assert!(e.contains("down's columns and gate's rows"), "{e}");
    let mut bad = ok.clone();
    bad[3] = Some(ty("f32[4, 32, 64]"));
    let e = infer(moe(2), &bad).unwrap_err();
    assert!(e.contains("up's experts"), "{e}");
}

const CACHE: &str = r#"graph @step(%ids: i64[1, seq], %past_k: f32[1, past, 16]) -> (%y, %present_k) states(%present_k -> %past_k) {
  const %table: f32[10, 16] = dense [0.0]
  %x: f32[1, seq, 16] = embedding{format = f32}(%table, %ids)
  %present_k: f32[1, past + seq, 16] = concat{axis = 1}(%past_k, %x)
  %y: f32[1, seq, 16] = identity(%x)
}"#;

#[test]
fn states_round_trip_through_text_and_verify() {
    // The dense list must hold every element: build the table's data from the text.
    let src = CACHE.replace(
        "dense [0.0]",
        &format!("dense [{}]", vec!["0.5"; 160].join(", ")),
    );
    let g = parse_graph(&src).unwrap();
    assert_eq!(
        g.states,
        vec![StateLink {
            input: 1,
            output: 1
        }]
    );
    verify(&g).unwrap();
    assert_eq!(g.states[0].growth_axis(&g), Ok(Some(1)));
    let text = print_graph(&g);
    assert!(text.contains("states(%present_k -> %past_k)"), "{text}");
    assert_eq!(parse_graph(&text).unwrap(), g);
}

#[test]
fn bad_states_are_rejected_with_a_reason() {
    let src = CACHE.replace(
        "dense [0.0]",
        &format!("dense [{}]", vec!["0.5"; 160].join(", ")),
    );
    // Not an output / not an input.
    let e = parse_graph(&src.replace("states(%present_k -> %past_k)", "states(%x -> %past_k)"))
        .unwrap_err();
    assert!(e.message.contains("not a graph output"), "{e}");
    let e =
        parse_graph(&src.replace("states(%present_k -> %past_k)", "states(%y -> %y)")).unwrap_err();
    assert!(e.message.contains("not a graph input"), "{e}");

    // A growth axis behind a dim other than 1: the state is not a prefix of its buffer.
    let mut g = parse_graph(&src).unwrap();
    let past = g.inputs[1];
    g.values[past.0 as usize].ty = ty("f32[2, past, 16]");
    let present = g.outputs[1];
    g.values[present.0 as usize].ty = ty("f32[2, past + seq, 16]");
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("must be 1"), "{e}");

    // Types that differ in dtype.
    let mut g = parse_graph(&src).unwrap();
    g.values[past.0 as usize].ty = ty("f16[1, past, 16]");
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("differ in dtype or rank"), "{e}");

    // One input in two states.
    let mut g = parse_graph(&src).unwrap();
    g.states.push(StateLink {
        input: 1,
        output: 1,
    });
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("more than one state"), "{e}");

    // Stale indices print without panicking and fail verification.
    let mut g = parse_graph(&src).unwrap();
    g.states[0].output = 7;
    assert!(print_graph(&g).contains("states(_ -> %past_k)"));
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("2 outputs"), "{e}");
}
