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

/// Like `STEP`, but nothing the caller gets back is sized by `past`: `y` sums the negated
/// positions. Its recordings can serve every length of the state.
const SUM_STEP: &str = r#"graph @step(%x: f32[1, seq, 3], %past: f32[1, past, 3]) -> (%y, %present) states(%present -> %past) {
  %present: f32[1, past + seq, 3] = concat{axis = 1}(%past, %x)
  %n: f32[1, past + seq, 3] = unary{op = neg}(%present)
  %y: f32[1, 3] = reduce{kind = sum, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%n)
}"#;

fn sum_session(capacity: i64, options: SessionOptions) -> Session {
    let g = parse_graph(SUM_STEP).unwrap();
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

/// `SUM_STEP`'s `y` once the state holds positions `0..n` of `rows`, by hand:
/// column `c` is `-(sum over p < n of 3p + c)`.
fn negated_sums(n: usize) -> Vec<f32> {
    (0..3)
        .map(|c| -((0..n).map(|p| (3 * p + c) as f32).sum::<f32>()))
        .collect()
}

#[test]
fn one_recording_serves_every_length_of_the_state() {
    let s = sum_session(16, SessionOptions::default());
    assert!(s.records_every_length());
    // A prefill of 4 positions, then one position per call (an LLM's decode steps).
    let y = s.run(vec![rows(0, 4)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(4)[..]);
    for t in 4..12 {
        let y = s.run(vec![rows(t, 1)], LONG).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(t + 1)[..]);
    }
    // One recording per input shape, whatever the state's length.
    assert_eq!(s.recordings_made(), 2);
    assert_eq!(s.native_stats().fallbacks, 0, "{:?}", s.native_stats());
    // Rewound and reset states continue where they say, through the same recordings.
    s.truncate_state(2).unwrap();
    let y = s.run(vec![rows(2, 1)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(3)[..]);
    s.reset_state(LONG).unwrap();
    let y = s.run(vec![rows(0, 1)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(1)[..]);
    assert_eq!(s.recordings_made(), 2);
    // Up to the capacity, and refused beyond it.
    let y = s.run(vec![rows(1, 15)], LONG).unwrap();
    assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(16)[..]);
    assert!(s.run(vec![rows(16, 1)], LONG).is_err());
}

#[test]
fn kernels_of_a_length_free_recording_see_the_call_s_shapes() {
    // The kernel holding the negation (fused with the sum or not) on the tensor path (a
    // host kernel): it must get the live positions only, not the capacity the recording
    // binds.
    let shapes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = shapes.clone();
    let g = parse_graph(SUM_STEP).unwrap();
    let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
    let opts = rafter_opt::CompileOptions {
        bounds: vec![(Symbol::new("past"), 8), (Symbol::new("seq"), 8)],
        dim_bounds: vec![(past_seq, 8)],
        ..Default::default()
    };
    let p = rafter_opt::compile(&g, &opts).unwrap();
    let k = p
        .kernels
        .iter()
        .find(|k| k.body.nodes.iter().any(|n| n.op.name() == "unary"))
        .expect("a kernel computes the negation");
    let fused = k.body.nodes.iter().any(|n| n.op.name() == "reduce");
    let options = SessionOptions::new().host_kernel(k.name.clone(), move |ins| {
        let shape = ins[0].shape().to_vec();
        seen.lock().unwrap().push(shape.clone());
        let x = ins[0].as_slice::<f32>().map_err(|e| e.to_string())?;
        if fused {
            // -sum over positions, per column: `y` itself.
            let y: Vec<f32> = (0..3)
                .map(|c| -x.chunks(3).map(|r| r[c]).sum::<f32>())
                .collect();
            Ok(vec![
                Tensor::from_slice(&[1, 3], &y).map_err(|e| e.to_string())?
            ])
        } else {
            let y: Vec<f32> = x.iter().map(|v| -v).collect();
            Ok(vec![
                Tensor::from_slice(&shape, &y).map_err(|e| e.to_string())?
            ])
        }
    });
    let devices = rafter_runtime_cpu::devices().unwrap();
    let s = Session::with_options(p, &devices, options).unwrap();
    assert!(s.records_every_length());
    for (t, n) in [(0, 2), (2, 1), (3, 1), (4, 3)] {
        let y = s.run(vec![rows(t, n)], LONG).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &negated_sums(t + n)[..]);
    }
    let shapes = shapes.lock().unwrap();
    let positions: Vec<usize> = shapes.iter().map(|d| d[1]).collect();
    assert_eq!(positions, vec![2, 3, 4, 7]);
}

#[test]
fn outputs_sized_by_the_state_keep_recordings_per_length() {
    let s = session(8, SessionOptions::default());
    assert!(!s.records_every_length(), "`y` is sized by `past`");
    s.run(vec![rows(0, 2)], LONG).unwrap();
    s.run(vec![rows(2, 1)], LONG).unwrap();
    s.run(vec![rows(3, 1)], LONG).unwrap();
    assert_eq!(s.recordings_made(), 3);
}
