//! Sessions that carry state across calls (`Storage::State`, a KV cache): lengths bound
//! from the session, appends in place, capacity checks, reset and truncation, and a failed
//! call poisoning the state.

mod common;

use common::LONG;
use rafter_ir::text::parse_graph;
use rafter_ir::{Dim, Symbol};
use rafter_runtime::{RuntimeError, Session, SessionOptions, Tensor};

/// `present = past ++ x` along positions; `y = -present` (every position so far).
const STEP: &str = r#"graph @step(%x: f32[1, seq, 3], %past: f32[1, past, 3]) -> (%y, %present) states(%present -> %past) {
  %present: f32[1, past + seq, 3] = concat{axis = 1}(%past, %x)
  %y: f32[1, past + seq, 3] = unary{op = neg}(%present)
}"#;

fn session(capacity: i64, options: SessionOptions) -> Session {
    let g = parse_graph(STEP).unwrap();
    let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
    let opts = rafter_opt::CompileOptions {
        bounds: vec![
            (Symbol::new("past"), capacity),
            (Symbol::new("seq"), capacity),
        ],
        dim_bounds: vec![(past_seq, capacity)],
        ..Default::default()
    };
    let p = rafter_opt::compile(&g, &opts).unwrap();
    let devices = rafter_runtime_cpu::devices().unwrap();
    Session::with_options(p, &devices, options).unwrap()
}

fn rows(start: usize, n: usize) -> Tensor {
    let v: Vec<f32> = (start * 3..(start + n) * 3).map(|i| i as f32).collect();
    Tensor::from_slice(&[1, n, 3], &v).unwrap()
}

fn negated(n: usize) -> Vec<f32> {
    (0..n * 3).map(|i| -(i as f32)).collect()
}

#[test]
fn calls_extend_the_state_in_place() {
    let s = session(8, SessionOptions::default());
    assert_eq!(s.program().inputs.len(), 1, "the state is not an input");
    let y = s.run(vec![rows(0, 3)], LONG).unwrap();
    assert_eq!(y[0].shape(), &[1, 3, 3]);
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(3)[..]);
    assert_eq!(s.state_lengths(), vec![3]);
    // One position at a time: each call sees every earlier one.
    for t in 3..6 {
        let y = s.run(vec![rows(t, 1)], LONG).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(t + 1)[..]);
    }
    assert_eq!(s.state_lengths(), vec![6]);
    // The append ran natively (no fallback to the copying reference path).
    assert_eq!(s.native_stats().fallbacks, 0, "{:?}", s.native_stats());
}

#[test]
fn calls_in_flight_are_ordered_through_the_state() {
    let s = session(16, SessionOptions::default());
    let handles: Vec<_> = (0..5)
        .map(|t| s.submit(vec![rows(t * 2, 2)]).unwrap())
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let y = h.wait(LONG).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(2 * t + 2)[..]);
    }
}

#[test]
fn capacity_reset_and_truncation() {
    let s = session(4, SessionOptions::default());
    s.run(vec![rows(0, 3)], LONG).unwrap();
    // 3 + 2 > 4: refused before anything runs, naming the state and the bound.
    let e = s.run(vec![rows(3, 2)], LONG).unwrap_err();
    assert!(
        matches!(e, RuntimeError::Input { .. } | RuntimeError::State { .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("past + seq") && msg.contains('4'), "{msg}");
    assert_eq!(s.state_lengths(), vec![3], "a refused call changes nothing");
    // Rewind to 1 position: the next call continues there.
    s.truncate_state(1).unwrap();
    let y = s.run(vec![rows(1, 2)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(3)[..]);
    s.reset_state(LONG).unwrap();
    assert_eq!(s.state_lengths(), vec![0]);
    let y = s.run(vec![rows(0, 4)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(4)[..]);
}

#[test]
fn a_failed_call_poisons_the_state_until_reset() {
    // The negation kernel fails on the second call.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let g = parse_graph(STEP).unwrap();
    let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
    let opts = rafter_opt::CompileOptions {
        bounds: vec![(Symbol::new("past"), 8), (Symbol::new("seq"), 8)],
        dim_bounds: vec![(past_seq, 8)],
        ..Default::default()
    };
    let p = rafter_opt::compile(&g, &opts).unwrap();
    let neg = p
        .kernels
        .iter()
        .find(|k| k.body.nodes[0].op.name() == "unary")
        .unwrap()
        .name
        .clone();
    let options = SessionOptions::new().host_kernel(neg, move |ins| {
        if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            return Err("injected failure".into());
        }
        let x = ins[0].as_slice::<f32>().map_err(|e| e.to_string())?;
        let y: Vec<f32> = x.iter().map(|v| -v).collect();
        Ok(vec![
            Tensor::from_slice(ins[0].shape(), &y).map_err(|e| e.to_string())?
        ])
    });
    let devices = rafter_runtime_cpu::devices().unwrap();
    let s = Session::with_options(p, &devices, options).unwrap();
    s.run(vec![rows(0, 2)], LONG).unwrap();
    let e = s.run(vec![rows(2, 1)], LONG).unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    let e = s.run(vec![rows(3, 1)], LONG).unwrap_err();
    assert!(matches!(e, RuntimeError::State { .. }), "{e}");
    assert!(e.to_string().contains("reset"), "{e}");
    s.reset_state(LONG).unwrap();
    let y = s.run(vec![rows(0, 2)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated(2)[..]);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}
