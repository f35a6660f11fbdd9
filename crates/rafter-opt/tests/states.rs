//! Graph states (KV caches) through the compiler: state ports leave the call signature,
//! both ends of a state share its storage, and bounds on sums size the state.

use rafter_ir::program::Storage;
use rafter_ir::text::parse_graph;
use rafter_ir::{Dim, Symbol};
use rafter_opt::{compile, CompileError, CompileOptions};

const STEP: &str = r#"graph @step(%x: f32[1, seq, 4], %past_k: f32[1, past, 4]) -> (%y, %present_k) states(%present_k -> %past_k) {
  %present_k: f32[1, past + seq, 4] = concat{axis = 1}(%past_k, %x)
  %y: f32[1, past + seq, 4] = unary{op = neg}(%present_k)
}"#;

fn options() -> CompileOptions {
    let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
    CompileOptions {
        bounds: vec![(Symbol::new("past"), 64), (Symbol::new("seq"), 64)],
        dim_bounds: vec![(past_seq, 64)],
        ..CompileOptions::default()
    }
}

#[test]
fn state_ports_become_session_state() {
    let g = parse_graph(STEP).unwrap();
    let p = compile(&g, &options()).unwrap();
    // The caller passes `x` only and receives `y` only.
    assert_eq!(
        p.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        ["x"]
    );
    assert_eq!(
        p.outputs
            .iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>(),
        ["y"]
    );
    assert_eq!(p.states.len(), 1);
    let st = &p.states[0];
    assert_eq!(
        (st.name.as_str(), st.input_name.as_str()),
        ("present_k", "past_k")
    );
    assert_eq!(st.length_symbol(), Some(&Symbol::new("past")));
    // Sized by the sum bound (64 positions), not by past's and seq's bounds added (128).
    assert_eq!(p.state_bytes(0), Some(64 * 4 * 4));
    // The concat reads the state's input buffer and writes its output buffer: both state 0.
    let state_buffers: Vec<usize> = p
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.storage == Storage::State(0))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(state_buffers.len(), 2);
    let concat = p
        .steps
        .iter()
        .find_map(|s| match s {
            rafter_ir::program::Step::Dispatch {
                kernel,
                args,
                results,
            } if p.kernels[*kernel].body.nodes[0].op.name() == "concat" => {
                Some((args.clone(), results.clone()))
            }
            _ => None,
        })
        .unwrap();
    assert!(state_buffers.contains(&concat.0[0]));
    assert!(state_buffers.contains(&concat.1[0].unwrap()));
}

#[test]
fn a_state_copied_from_an_input_is_refused() {
    let src = r#"graph @g(%x: f32[4], %s: f32[4]) -> (%x) states(%x -> %s) {
}"#;
    let g = parse_graph(src).unwrap();
    let e = compile(&g, &CompileOptions::default()).unwrap_err();
    assert!(
        matches!(e, CompileError::Unsupported(ref m) if m.contains("computed by the graph")),
        "{e}"
    );
}
