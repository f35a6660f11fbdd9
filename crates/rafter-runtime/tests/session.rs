//! The runtime on hand-built programs. Every ordering claim is checked through semaphores and
//! call handles (with timeouts, so a broken claim fails instead of hanging), never timing.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::json::{self, Json};
use common::*;
use rafter_hal::{Device, Semaphore};
use rafter_hal_cpu::CpuDevice;
use rafter_ir::program::{Arena, Port, Program, Step, Storage};
use rafter_ir::{BinaryOp, ConstData, DType, Dim, Op, Symbol, TensorType};
use rafter_runtime::{
    BytesBuffer, ChromeTrace, DeviceSet, RuntimeError, Session, SessionOptions, Tensor,
};
use rafter_runtime_cpu::CpuDeviceOptions;

fn add() -> Op {
    Op::Binary { op: BinaryOp::Add }
}

fn mul() -> Op {
    Op::Binary { op: BinaryOp::Mul }
}

fn weight_half() -> ConstData {
    ConstData::from_f32s(&[0.5])
}

/// `y = (x + 0.5)^2`, with `x + 0.5` in an arena buffer planned per call.
fn chain_program() -> Program {
    let xt = f32_ty(&[n()]);
    let wt = f32_ty(&[Dim::known(1)]);
    Program {
        name: "chain".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: xt.clone(),
        }],
        outputs: vec![Port {
            name: "y".into(),
            ty: xt.clone(),
        }],
        weights: vec![weight_half()],
        buffers: vec![
            buffer("x", xt.clone(), Storage::Input(0)),
            buffer("w", wt.clone(), Storage::Weight(0)),
            buffer(
                "t",
                xt.clone(),
                Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            ),
            buffer("y", xt.clone(), Storage::Output(0)),
        ],
        arenas: vec![host_arena()],
        kernels: vec![
            one_op_kernel(
                "add",
                add(),
                &[xt.clone(), wt],
                std::slice::from_ref(&xt),
                "cpu",
            ),
            one_op_kernel("square", mul(), &[xt.clone(), xt.clone()], &[xt], "cpu"),
        ],
        steps: vec![
            Step::Dispatch {
                kernel: 0,
                args: vec![0, 1],
                results: vec![Some(2)],
            },
            Step::Dispatch {
                kernel: 1,
                args: vec![2, 2],
                results: vec![Some(3)],
            },
        ],
        ..Program::default()
    }
}

fn chain_expected(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| (v + 0.5) * (v + 0.5)).collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f64_vec().into_iter().map(|v| v as f32).collect()
}

fn cpu(workers: usize) -> DeviceSet {
    rafter_runtime_cpu::devices_with(CpuDeviceOptions {
        worker_threads: workers,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn runs_a_chain_with_a_weight_and_an_arena_buffer() {
    let session = Session::new(chain_program(), &cpu(2)).unwrap();
    assert_eq!(session.symbols(), &[Symbol::new("n")]);
    for len in [1usize, 4, 0, 33] {
        let x: Vec<f32> = (0..len).map(|i| i as f32 - 3.0).collect();
        let out = session
            .run(vec![Tensor::f32s(&[len], x.clone())], LONG)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shape(), &[len]);
        assert_eq!(f32s(&out[0]), chain_expected(&x));
    }
}

/// Waits (the release runs on the thread that signals the call's last semaphore, just
/// after the waiters are woken) until `session` holds `want` idle recordings.
fn settle(session: &Session, want: usize) {
    let start = std::time::Instant::now();
    while session.idle_recordings() != want && start.elapsed() < LONG {
        std::thread::yield_now();
    }
    assert_eq!(session.idle_recordings(), want, "idle recordings");
}

#[test]
fn calls_of_the_same_shapes_reuse_one_recording() {
    let session = Session::new(chain_program(), &cpu(2)).unwrap();
    let input = |len: usize, round: usize| -> Vec<f32> {
        (0..len).map(|i| (i * 7 + round * 3) as f32 - 5.0).collect()
    };
    // New values on the same shapes: each call rewrites the recording's input buffer and
    // its arena, and the recording is reused rather than made again.
    for round in 0..3 {
        let x = input(4, round);
        let out = session
            .run(vec![Tensor::f32s(&[4], x.clone())], LONG)
            .unwrap();
        assert_eq!(f32s(&out[0]), chain_expected(&x), "round {round}");
        settle(&session, 1);
    }
    // Another shape gets its own recording; both are kept, and the first is reused again.
    for (len, idle) in [(5, 2), (4, 2)] {
        let x = input(len, 9);
        let out = session
            .run(vec![Tensor::f32s(&[len], x.clone())], LONG)
            .unwrap();
        assert_eq!(f32s(&out[0]), chain_expected(&x), "len {len}");
        settle(&session, idle);
    }
    // Two calls of one shape in flight at once: the second cannot share the first's
    // recording, so it makes its own; at most two are kept idle afterwards.
    let (xa, xb) = (input(4, 20), input(4, 21));
    let a = session
        .submit(vec![Tensor::f32s(&[4], xa.clone())])
        .unwrap();
    let b = session
        .submit(vec![Tensor::f32s(&[4], xb.clone())])
        .unwrap();
    assert_eq!(f32s(&b.wait(LONG).unwrap()[0]), chain_expected(&xb));
    assert_eq!(f32s(&a.wait(LONG).unwrap()[0]), chain_expected(&xa));
    settle(&session, 2);
}

/// `a = x + w; b = x * x` (independent), `c = a * b`, `y = c + w`: arena buffers whose
/// lifetimes let the planner reuse bytes, and a step pair that shares a barrier segment.
fn diamond_program() -> Program {
    let xt = f32_ty(&[n()]);
    let wt = f32_ty(&[Dim::known(1)]);
    let arena = |name: &str| {
        buffer(
            name,
            xt.clone(),
            Storage::Arena {
                arena: 0,
                offset: None,
            },
        )
    };
    let k = |name: &str, op: Op, b: &TensorType| {
        one_op_kernel(
            name,
            op,
            &[xt.clone(), b.clone()],
            std::slice::from_ref(&xt),
            "cpu",
        )
    };
    Program {
        name: "diamond".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: xt.clone(),
        }],
        outputs: vec![Port {
            name: "y".into(),
            ty: xt.clone(),
        }],
        weights: vec![weight_half()],
        buffers: vec![
            buffer("x", xt.clone(), Storage::Input(0)),
            buffer("w", wt.clone(), Storage::Weight(0)),
            arena("a"),
            arena("b"),
            arena("c"),
            buffer("y", xt.clone(), Storage::Output(0)),
        ],
        arenas: vec![host_arena()],
        kernels: vec![
            k("a", add(), &wt),
            k("b", mul(), &xt),
            k("c", mul(), &xt),
            k("y", add(), &wt),
        ],
        steps: vec![
            Step::Dispatch {
                kernel: 0,
                args: vec![0, 1],
                results: vec![Some(2)],
            },
            Step::Dispatch {
                kernel: 1,
                args: vec![0, 0],
                results: vec![Some(3)],
            },
            Step::Dispatch {
                kernel: 2,
                args: vec![2, 3],
                results: vec![Some(4)],
            },
            Step::Dispatch {
                kernel: 3,
                args: vec![4, 1],
                results: vec![Some(5)],
            },
        ],
        ..Program::default()
    }
}

#[test]
fn independent_steps_share_a_segment_and_dependent_ones_are_ordered() {
    let session = Session::new(diamond_program(), &cpu(2)).unwrap();
    // Many calls in flight at once, each with its own memory.
    let inputs: Vec<Vec<f32>> = (0..8)
        .map(|c| (0..(5 + c)).map(|i| (i as f32) * 0.25 - c as f32).collect())
        .collect();
    let handles: Vec<_> = inputs
        .iter()
        .map(|x| {
            session
                .submit(vec![Tensor::f32s(&[x.len()], x.clone())])
                .unwrap()
        })
        .collect();
    for (h, x) in handles.into_iter().zip(&inputs) {
        let out = h.wait(LONG).unwrap();
        let want: Vec<f32> = x.iter().map(|v| (v + 0.5) * (v * v) + 0.5).collect();
        assert_eq!(f32s(&out[0]), want);
    }
}

#[test]
fn calls_from_several_threads() {
    let session = Session::new(chain_program(), &cpu(2)).unwrap();
    std::thread::scope(|s| {
        for t in 0..3 {
            let session = session.clone();
            s.spawn(move || {
                for c in 0..5 {
                    let x: Vec<f32> = (0..(t * 5 + c + 1)).map(|i| i as f32 * 0.5).collect();
                    let out = session
                        .run(vec![Tensor::f32s(&[x.len()], x.clone())], LONG)
                        .unwrap();
                    assert_eq!(f32s(&out[0]), chain_expected(&x));
                }
            });
        }
    });
}

#[test]
fn compile_time_offsets_are_used_and_bounds_enforced() {
    let mut p = chain_program();
    p.bounds = vec![(Symbol::new("n"), 8)];
    p.buffers[2].storage = Storage::Arena {
        arena: 0,
        offset: Some(0),
    };
    p.arenas[0].size = Some(32);
    p.arenas[0].lower_bound = Some(32);
    let session = Session::new(p, &cpu(1)).unwrap();
    for len in [1usize, 8] {
        let x: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let out = session
            .run(vec![Tensor::f32s(&[len], x.clone())], LONG)
            .unwrap();
        assert_eq!(f32s(&out[0]), chain_expected(&x));
    }
    let e = session
        .submit(vec![Tensor::f32s(&[9], vec![0.0; 9])])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "program `chain`: the inputs make `n` = 9, above its declared bound 8"
    );
}

/// A compiled program with a static plan in which an elementwise kernel writes its result
/// over the operand it reads last (`e = exp(s)` in `s`'s bytes): the runtime allocates the
/// planned arena once per call, binds both to the same bytes, and the results match the
/// reference at sizes up to the bound.
#[test]
fn planned_in_place_results_run_correctly() {
    let g = rafter_ir::text::parse_graph(
        r#"graph @ip(%x: f32[n, 8]) -> (%y, %z) {
          %s: f32[n, 8] = softmax{kind = softmax, axis = 1}(%x)
          %e: f32[n, 8] = unary{op = exp}(%s)
          %y: f32[n, 8] = softmax{kind = log_softmax, axis = 1}(%e)
          %z: f32[n] = reduce{kind = sum, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%e)
        }"#,
    )
    .unwrap();
    let p = compile_up_to_8_rows(&g);
    let live = rafter_ir::arena::liveness(&p);
    let offset = |b: usize| match p.buffers[b].storage {
        Storage::Arena { offset, .. } => offset,
        _ => None,
    };
    let in_place = (0..p.buffers.len()).any(|a| {
        (0..p.buffers.len()).any(|b| {
            a != b
                && offset(a).is_some()
                && offset(a) == offset(b)
                && live[a].zip(live[b]).is_some_and(|(la, lb)| la.1 == lb.0)
        })
    });
    assert!(
        in_place,
        "expected a result written in place:\n{}",
        rafter_ir::program_text::print_program(&p, rafter_ir::program_text::WeightMode::Inline)
    );
    // A call at the bound allocates the two outputs and the planned arena, once, and not
    // the input, which only CPU kernels read: they read the caller's tensor in place. A
    // device with one byte less fails the call.
    let arena = rafter_ir::arena::align_up(p.arenas[0].size.unwrap()).unwrap();
    let need = 8 * 8 * 4 + 8 * 4 + arena;
    let x8 = Tensor::f32s(&[8, 8], vec![0.5; 64]);
    for (limit, fits) in [(need, true), (need - 1, false)] {
        let devices = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
            memory_limit: Some(limit),
            ..Default::default()
        })
        .unwrap();
        let session = Session::new(p.clone(), &devices).unwrap();
        assert_eq!(session.run(vec![x8.clone()], LONG).is_ok(), fits, "{limit}");
    }
    matches_reference_up_to_8_rows(&Session::new(p, &cpu(2)).unwrap(), &g);
}

/// `g` compiled with its row count `n` bounded by 8 (what [`matches_reference_up_to_8_rows`]
/// runs).
fn compile_up_to_8_rows(g: &rafter_ir::Graph) -> Program {
    let opts = rafter_opt::CompileOptions {
        bounds: vec![(Symbol::new("n"), 8)],
        ..Default::default()
    };
    rafter_opt::compile(g, &opts).unwrap()
}

/// Runs `session` (compiled from `g`, input `f32[n, 8]`) at n = 1, 5 and 8 and compares
/// every output with the reference executor's. Native softmax and the tile programs' exp
/// are within a few ulp of the reference (no longer bitwise); a result clobbered in place
/// would be off by far more.
fn matches_reference_up_to_8_rows(session: &Session, g: &rafter_ir::Graph) {
    for len in [1usize, 5, 8] {
        let x: Vec<f32> = (0..len * 8).map(|i| (i % 7) as f32 * 0.5 - 1.0).collect();
        let x = Tensor::f32s(&[len, 8], x);
        let want = reference_run(g, std::slice::from_ref(&x));
        let got = session.run(vec![x], LONG).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!(
                max_abs_diff(a, b) <= 1e-5,
                "n = {len}: {}",
                max_abs_diff(a, b)
            );
        }
    }
}

#[test]
fn inputs_are_checked_against_the_signature() {
    let mut p = chain_program();
    // A second input sharing `n`, and a known dim.
    let bt = f32_ty(&[n(), Dim::known(2)]);
    p.inputs.push(Port {
        name: "b".into(),
        ty: bt.clone(),
    });
    p.buffers.push(buffer("b", bt, Storage::Input(1)));
    let session = Session::new(p, &cpu(1)).unwrap();
    let err = |inputs: Vec<Tensor>| session.submit(inputs).unwrap_err().to_string();
    let ok_b = Tensor::f32s(&[3, 2], vec![0.0; 6]);
    assert_eq!(
        err(vec![Tensor::f32s(&[3], vec![0.0; 3])]),
        "program `chain`: expected 2 inputs (`x`, `b`), got 1"
    );
    assert_eq!(
        err(vec![Tensor::i64s(&[3], vec![0; 3]), ok_b.clone()]),
        "program `chain`: input `x` has dtype i64 but f32 is expected"
    );
    assert_eq!(
        err(vec![Tensor::f32s(&[3, 1], vec![0.0; 3]), ok_b.clone()]),
        "program `chain`: input `x` has shape [3, 1] (rank 2) but f32[n] (rank 1) is expected"
    );
    assert_eq!(
        err(vec![
            Tensor::f32s(&[3], vec![0.0; 3]),
            Tensor::f32s(&[4, 2], vec![0.0; 8])
        ]),
        "program `chain`: input `b` dim 0 is 4 but symbol `n` is 3 (bound by input `x` dim 0)"
    );
    assert_eq!(
        err(vec![
            Tensor::f32s(&[3], vec![0.0; 3]),
            Tensor::f32s(&[3, 5], vec![0.0; 15])
        ]),
        "program `chain`: input `b` dim 1 is 5 but its type says `2` = 2"
    );
    // `submit_to_wait` checks as `submit` does.
    assert_eq!(
        session
            .submit_to_wait(vec![Tensor::f32s(&[3], vec![0.0; 3])])
            .unwrap_err()
            .to_string(),
        "program `chain`: expected 2 inputs (`x`, `b`), got 1"
    );
    // And a good call still works, either way.
    let out = session
        .run(
            vec![Tensor::f32s(&[3], vec![1.0, 2.0, 3.0]), ok_b.clone()],
            LONG,
        )
        .unwrap();
    assert_eq!(f32s(&out[0]), chain_expected(&[1.0, 2.0, 3.0]));
    let call = session
        .submit_to_wait(vec![Tensor::f32s(&[3], vec![4.0, 5.0, 6.0]), ok_b])
        .unwrap();
    assert_eq!(
        f32s(&call.wait(LONG).unwrap()[0]),
        chain_expected(&[4.0, 5.0, 6.0])
    );
}

#[test]
fn a_missing_device_is_named() {
    let mut p = chain_program();
    p.kernels[1].device = "vulkan".into();
    let e = Session::new(p, &cpu(1)).unwrap_err();
    assert!(matches!(e, RuntimeError::MissingDevice { .. }));
    assert_eq!(
        e.to_string(),
        "program needs device `vulkan`, which is not available (found: cpu)"
    );
    let e = Session::new(chain_program(), &DeviceSet::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "program needs device `cpu`, which is not available (found: none)"
    );
}

#[test]
fn weights_are_bound_without_a_copy() {
    let bytes = Bytes::from(
        [0.5f32, 1.5, 2.5, 3.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let source_ptr = bytes.as_ptr();
    let mut p = chain_program();
    let wt = f32_ty(&[Dim::known(4)]);
    p.weights = vec![ConstData::new(DType::F32, vec![4], bytes).unwrap()];
    p.buffers[1].ty = wt.clone();
    p.kernels[0] = one_op_kernel(
        "add",
        add(),
        &[f32_ty(&[n()]), wt],
        &[f32_ty(&[n()])],
        "cpu",
    );
    let session = Session::new(p, &cpu(1)).unwrap();
    let buffer = session.weight_buffer(0).expect("bound");
    let wrapped = buffer.downcast_ref::<BytesBuffer>().expect("a BytesBuffer");
    assert_eq!(wrapped.as_ptr(), source_ptr);
    assert_eq!(session.program().weights[0].bytes.as_ptr(), source_ptr);
    let mapped = buffer.map_read(0, 16, |b| b.as_ptr()).unwrap();
    assert_eq!(mapped, source_ptr);
    assert!(
        buffer.write_bytes(0, &[0; 4]).is_err(),
        "weights are read-only"
    );
    // The kernels read those bytes.
    let out = session
        .run(vec![Tensor::f32s(&[4], vec![1.0; 4])], LONG)
        .unwrap();
    assert_eq!(f32s(&out[0]), vec![2.25, 6.25, 12.25, 20.25]);
}

/// The test's proof of overlap: call 1's kernel announces that it runs (`entered`), then
/// blocks until the test signals `latch`; the test signals it only after call 2, submitted
/// after call 1, has completed with its outputs. If call 2 were serialized behind call 1
/// its wait would time out (the latch is not signalled yet) and the test would fail.
/// A compiled program with a reshape between two softmaxes: the planner places the
/// reshape's result over the operand it views, and the runtime then never dispatches the
/// reshape (its bytes are already there). A reshape whose operand is read again later keeps
/// its own bytes and its dispatch. Results match the reference at sizes up to the bound.
#[test]
fn placed_reshapes_are_not_dispatched() {
    let g = rafter_ir::text::parse_graph(
        r#"graph @view(%x: f32[n, 8]) -> (%y, %z) {
          const %shape: i64[3] = dense [0, 2, 4]
          %s: f32[n, 8] = softmax{kind = softmax, axis = 1}(%x)
          %r: f32[n, 2, 4] = reshape{allow_zero = false}(%s, %shape)
          %t: f32[n, 2, 4] = softmax{kind = softmax, axis = 2}(%r)
          %f: f32[n, 8] = flatten{axis = 1}(%t)
          %y: f32[n, 8] = softmax{kind = log_softmax, axis = 1}(%f)
          %z: f32[n, 2, 4] = softmax{kind = softmax, axis = 1}(%t)
        }"#,
    )
    .unwrap();
    let p = compile_up_to_8_rows(&g);
    let text =
        rafter_ir::program_text::print_program(&p, rafter_ir::program_text::WeightMode::Inline);
    let offset_of = |name: &str| {
        let b = p
            .buffers
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("{name}\n{text}"));
        match b.storage {
            Storage::Arena { offset, .. } => offset,
            _ => None,
        }
    };
    assert!(
        offset_of("r").is_some() && offset_of("r") == offset_of("s"),
        "{text}"
    );
    // `t` is read again (by `z`'s softmax) after the flatten: `f` cannot take its bytes.
    assert_ne!(offset_of("f"), offset_of("t"), "{text}");

    let trace = Arc::new(ChromeTrace::new());
    let devices = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
        worker_threads: 2,
        trace_sink: Some(trace.clone()),
        ..Default::default()
    })
    .unwrap();
    matches_reference_up_to_8_rows(&Session::new(p.clone(), &devices).unwrap(), &g);
    let kernel_of = |k: &str| {
        p.kernels
            .iter()
            .find(|kernel| kernel.body.nodes.iter().any(|n| n.op.name() == k))
            .map(|kernel| kernel.name.clone())
            .unwrap_or_else(|| panic!("no {k} kernel\n{text}"))
    };
    let dispatched = |name: &str| {
        trace
            .events()
            .iter()
            .filter(|e| e.kind == rafter_hal::TraceKind::Dispatch && *e.name == *name)
            .count()
    };
    assert_eq!(dispatched(&kernel_of("reshape")), 0, "{text}");
    assert_eq!(dispatched(&kernel_of("flatten")), 3, "{text}");
}

#[test]
fn two_calls_overlap_on_the_cpu_device() {
    let latch = Semaphore::host(0);
    let entered = Semaphore::host(0);
    let (l, e) = (latch.clone(), entered.clone());
    let options = SessionOptions::new().host_kernel("add", move |inputs: &[Tensor]| {
        let x = &inputs[0];
        if x.to_f64_vec()[0] == 1.0 {
            e.signal(1).map_err(|e| e.to_string())?;
            l.wait(1, LONG).map_err(|e| format!("latch: {e}"))?;
        }
        let w = inputs[1].to_f64_vec()[0] as f32;
        let y: Vec<f32> = x.to_f64_vec().iter().map(|v| *v as f32 + w).collect();
        Ok(vec![Tensor::f32s(x.shape(), y)])
    });
    let trace = Arc::new(ChromeTrace::new());
    let devices = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
        worker_threads: 2,
        trace_sink: Some(trace.clone()),
        ..Default::default()
    })
    .unwrap();
    let session = Session::with_options(chain_program(), &devices, options).unwrap();
    let first = session
        .submit(vec![Tensor::f32s(&[2], vec![1.0, 2.0])])
        .unwrap();
    entered.wait(1, LONG).expect("call 1 is running");
    let second = session
        .submit(vec![Tensor::f32s(&[3], vec![5.0, 6.0, 7.0])])
        .unwrap();
    let out2 = second
        .wait(LONG)
        .expect("call 2 completes while call 1 runs");
    assert_eq!(f32s(&out2[0]), chain_expected(&[5.0, 6.0, 7.0]));
    // Call 1 is provably still inside its kernel: the latch is not signalled yet.
    assert_eq!(latch.value(), 0);
    assert!(!first.is_done());
    latch.signal(1).unwrap();
    let out1 = first.wait(LONG).unwrap();
    assert_eq!(f32s(&out1[0]), chain_expected(&[1.0, 2.0]));

    // The trace shows it too: call 2's `add` slice lies inside call 1's (the order of the
    // spans is forced by the latch, not by timing). Slices are recorded when they end, so
    // call 2's comes first.
    let adds: Vec<_> = trace
        .events()
        .into_iter()
        .filter(|e| e.kind == rafter_hal::TraceKind::Dispatch && &*e.name == "add")
        .collect();
    assert_eq!(adds.len(), 2, "{adds:?}");
    let (second_span, first_span) = (&adds[0], &adds[1]);
    assert!(first_span.start <= second_span.start && second_span.end <= first_span.end);
}

/// Two independent kernels of one call run one after another when the session's kernels
/// split over several kernel threads (side by side, the second would run on its command
/// worker alone next to the first's threads), and side by side with one kernel thread.
/// Each kernel, on entry, waits for the other to enter too: side by side both see it at
/// once; one after another the first gives up after `PATIENCE` and the second, entering
/// alone, does the same.
#[test]
fn independent_dispatches_run_one_after_another_with_several_kernel_threads() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    const PATIENCE: Duration = Duration::from_millis(300);
    let g = rafter_ir::text::parse_graph(
        r#"graph @two(%x: f32[n, 8]) -> (%y, %z) {
          %y: f32[n, 8] = softmax{kind = softmax, axis = 1}(%x)
          %z: f32[n, 8] = softmax{kind = log_softmax, axis = 1}(%x)
        }"#,
    )
    .unwrap();
    let p = compile_up_to_8_rows(&g);
    assert_eq!(p.kernels.len(), 2, "two independent kernels");
    let run = |kernel_threads: usize| -> usize {
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut options = SessionOptions::new().kernel_threads(kernel_threads);
        for k in &p.kernels {
            let (inside, most) = (inside.clone(), most.clone());
            options = options.host_kernel(k.name.clone(), move |inputs: &[Tensor]| {
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                let start = Instant::now();
                while inside.load(Ordering::SeqCst) < 2 && start.elapsed() < PATIENCE {
                    std::thread::sleep(Duration::from_millis(1));
                }
                most.fetch_max(inside.load(Ordering::SeqCst), Ordering::SeqCst);
                // Leave only once the other has seen both inside (side by side).
                std::thread::sleep(Duration::from_millis(20));
                inside.fetch_sub(1, Ordering::SeqCst);
                let x = inputs[0].to_f64_vec();
                Ok(vec![Tensor::f32s(
                    inputs[0].shape(),
                    x.iter().map(|&v| v as f32).collect(),
                )])
            });
        }
        let devices = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
            worker_threads: 2,
            ..Default::default()
        })
        .unwrap();
        let session = Session::with_options(p.clone(), &devices, options).unwrap();
        session
            .run(vec![Tensor::f32s(&[1, 8], vec![0.5; 8])], LONG)
            .unwrap();
        most.load(Ordering::SeqCst)
    };
    assert_eq!(run(2), 1, "with 2 kernel threads the kernels overlapped");
    assert_eq!(
        run(1),
        2,
        "with 1 kernel thread the kernels did not overlap"
    );
}

/// `y = data[idx]` with `data` a weight: an index out of range fails the kernel.
fn gather_program() -> Program {
    let dt = f32_ty(&[Dim::known(3)]);
    let it = TensorType::known(DType::I64, &[1]);
    let yt = f32_ty(&[Dim::known(1)]);
    Program {
        name: "gather".into(),
        inputs: vec![Port {
            name: "idx".into(),
            ty: it.clone(),
        }],
        outputs: vec![Port {
            name: "y".into(),
            ty: yt.clone(),
        }],
        weights: vec![ConstData::from_f32s(&[10.0, 20.0, 30.0])],
        buffers: vec![
            buffer("idx", it.clone(), Storage::Input(0)),
            buffer("data", dt.clone(), Storage::Weight(0)),
            buffer("y", yt.clone(), Storage::Output(0)),
        ],
        kernels: vec![one_op_kernel(
            "pick",
            Op::Gather { axis: 0 },
            &[dt, it],
            &[yt],
            "cpu",
        )],
        steps: vec![Step::Dispatch {
            kernel: 0,
            args: vec![1, 0],
            results: vec![Some(2)],
        }],
        ..Program::default()
    }
}

#[test]
fn a_failing_kernel_is_an_error_naming_it() {
    let session = Session::new(gather_program(), &cpu(1)).unwrap();
    let bad = session.submit(vec![Tensor::i64s(&[1], vec![100])]).unwrap();
    let e = bad.wait(LONG).unwrap_err();
    assert!(matches!(e, RuntimeError::CallFailed { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("gather::pick"), "{msg}");
    assert!(msg.contains("node `pick` (gather)"), "{msg}");
    // The failed call's recording is dropped, not reused (its work may not have run)...
    let start = std::time::Instant::now();
    while session.calls_in_flight() != 0 {
        assert!(start.elapsed() < LONG, "the failed call never finished");
        std::thread::yield_now();
    }
    assert_eq!(
        session.idle_recordings(),
        0,
        "a failed call's recording is kept"
    );
    // ...and the session is still good: the next call of the same shape records anew.
    let out = session
        .run(vec![Tensor::i64s(&[1], vec![-1])], LONG)
        .unwrap();
    assert_eq!(f32s(&out[0]), vec![30.0]);
    settle(&session, 1);
    // A host kernel's error is reported the same way.
    let options = SessionOptions::new().host_kernel("pick", |_: &[Tensor]| {
        Err("refusing on purpose".to_string())
    });
    let session = Session::with_options(gather_program(), &cpu(1), options).unwrap();
    let msg = session
        .run(vec![Tensor::i64s(&[1], vec![0])], LONG)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("gather::pick") && msg.contains("refusing on purpose"),
        "{msg}"
    );
}

/// `idx = nonzero(x)` (a data-dependent size: a host slot), `s = shape(idx)`, and `idx`
/// itself copied to an output whose dims only the values decide.
fn nonzero_program() -> Program {
    let xt = f32_ty(&[n()]);
    let it = TensorType::new(DType::I64, vec![Dim::known(1), Dim::symbol("nnz")]);
    let st = TensorType::known(DType::I64, &[2]);
    Program {
        name: "nonzero".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: xt.clone(),
        }],
        outputs: vec![
            Port {
                name: "s".into(),
                ty: st.clone(),
            },
            Port {
                name: "idx_out".into(),
                ty: it.clone(),
            },
        ],
        buffers: vec![
            buffer("x", xt.clone(), Storage::Input(0)),
            buffer("idx", it.clone(), Storage::Dynamic),
            buffer("s", st.clone(), Storage::Output(0)),
            buffer("idx_out", it.clone(), Storage::Output(1)),
        ],
        kernels: vec![
            one_op_kernel("nz", Op::NonZero, &[xt], std::slice::from_ref(&it), "cpu"),
            one_op_kernel(
                "shape",
                Op::Shape {
                    start: 0,
                    end: None,
                },
                &[it],
                &[st],
                "cpu",
            ),
        ],
        steps: vec![
            Step::Dispatch {
                kernel: 0,
                args: vec![0],
                results: vec![Some(1)],
            },
            Step::Dispatch {
                kernel: 1,
                args: vec![1],
                results: vec![Some(2)],
            },
            Step::Copy { src: 1, dst: 3 },
        ],
        ..Program::default()
    }
}

#[test]
fn dynamic_buffers_live_in_host_slots() {
    let session = Session::new(nonzero_program(), &cpu(2)).unwrap();
    let a = session
        .submit(vec![Tensor::f32s(&[5], vec![0.0, 3.0, 0.0, 2.0, 5.0])])
        .unwrap();
    let b = session
        .submit(vec![Tensor::f32s(&[3], vec![1.0, 0.0, 0.0])])
        .unwrap();
    let out = a.wait(LONG).unwrap();
    assert_eq!(out[0], Tensor::i64s(&[2], vec![1, 3]));
    assert_eq!(out[1], Tensor::i64s(&[1, 3], vec![1, 3, 4]));
    let out = b.wait(LONG).unwrap();
    assert_eq!(out[0], Tensor::i64s(&[2], vec![1, 1]));
    assert_eq!(out[1], Tensor::i64s(&[1, 1], vec![0]));
    // The slot tables are dropped once the calls' work is done (the release runs on the
    // thread that signals the last semaphore, just after the waiters are woken).
    let start = std::time::Instant::now();
    while session.calls_in_flight() != 0 {
        assert!(start.elapsed() < LONG, "slot tables never released");
        std::thread::yield_now();
    }
}

#[test]
fn copies_of_inputs_and_weights() {
    let xt = f32_ty(&[n()]);
    let wt = f32_ty(&[Dim::known(2)]);
    let p = Program {
        name: "copies".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: xt.clone(),
        }],
        outputs: vec![
            Port {
                name: "x_out".into(),
                ty: xt.clone(),
            },
            Port {
                name: "w_out".into(),
                ty: wt.clone(),
            },
        ],
        weights: vec![ConstData::from_f32s(&[7.0, 8.0])],
        buffers: vec![
            buffer("x", xt.clone(), Storage::Input(0)),
            buffer("w", wt.clone(), Storage::Weight(0)),
            buffer("x_out", xt, Storage::Output(0)),
            buffer("w_out", wt, Storage::Output(1)),
        ],
        steps: vec![Step::Copy { src: 0, dst: 2 }, Step::Copy { src: 1, dst: 3 }],
        ..Program::default()
    };
    let session = Session::new(p, &cpu(1)).unwrap();
    let out = session
        .run(vec![Tensor::f32s(&[3], vec![1.0, 2.0, 3.0])], LONG)
        .unwrap();
    assert_eq!(out[0], Tensor::f32s(&[3], vec![1.0, 2.0, 3.0]));
    assert_eq!(out[1], Tensor::f32s(&[2], vec![7.0, 8.0]));
}

#[test]
fn steps_on_two_devices_are_chained_by_semaphores() {
    let cpu2: Arc<dyn Device> = Arc::new(
        CpuDevice::new(CpuDeviceOptions {
            worker_threads: 1,
            name: "cpu2".into(),
            ..Default::default()
        })
        .unwrap(),
    );
    let devices = cpu(1).with("cpu2", cpu2);
    let mut p = chain_program();
    p.kernels[1].device = "cpu2".into();
    p.arenas = vec![Arena {
        device: "cpu".into(),
        memory: "device_local".into(),
        size: None,
        lower_bound: None,
    }];
    let session = Session::new(p, &devices).unwrap();
    assert_eq!(session.device_names(), vec!["cpu", "cpu2"]);
    let h = session
        .submit(vec![Tensor::f32s(&[3], vec![1.0, 2.0, 3.0])])
        .unwrap();
    assert_eq!(h.semaphores().len(), 2, "one submission per device");
    let out = h.wait(LONG).unwrap();
    assert_eq!(f32s(&out[0]), chain_expected(&[1.0, 2.0, 3.0]));
}

#[test]
fn a_trace_has_one_event_per_dispatch_and_a_track_per_queue() {
    let trace = Arc::new(ChromeTrace::new());
    let devices = rafter_runtime_cpu::devices_with(CpuDeviceOptions {
        worker_threads: 2,
        queue_count: 2,
        trace_sink: Some(trace.clone()),
        ..Default::default()
    })
    .unwrap();
    let on_q0 = Session::new(chain_program(), &devices).unwrap();
    let on_q1 =
        Session::with_options(chain_program(), &devices, SessionOptions::new().queue(1)).unwrap();
    for session in [&on_q0, &on_q1] {
        for len in [2, 3] {
            session
                .run(vec![Tensor::f32s(&[len], vec![1.0; len])], LONG)
                .unwrap();
        }
    }
    let path =
        std::env::temp_dir().join(format!("rafter-runtime-trace-{}.json", std::process::id()));
    trace.write(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let doc = json::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let events = doc
        .get("traceEvents")
        .and_then(Json::arr)
        .expect("traceEvents");
    // Track names: one per queue.
    let tracks: Vec<(f64, &str)> = events
        .iter()
        .filter(|e| e.get("ph").and_then(Json::str) == Some("M"))
        .filter(|e| e.get("name").and_then(Json::str) == Some("thread_name"))
        .map(|e| {
            let tid = e.get("tid").and_then(Json::num).unwrap();
            let name = e
                .get("args")
                .and_then(|a| a.get("name"))
                .and_then(Json::str)
                .unwrap();
            (tid, name)
        })
        .collect();
    let mut names: Vec<&str> = tracks.iter().map(|t| t.1).collect();
    names.sort();
    assert_eq!(names, vec!["cpu:0", "cpu:1"]);
    let dispatches: Vec<&Json> = events
        .iter()
        .filter(|e| e.get("ph").and_then(Json::str) == Some("X"))
        .filter(|e| e.get("cat").and_then(Json::str) == Some("dispatch"))
        .collect();
    // 2 sessions x 2 calls x 2 dispatches.
    assert_eq!(dispatches.len(), 8, "{text}");
    for queue in ["cpu:0", "cpu:1"] {
        let tid = tracks.iter().find(|t| t.1 == queue).unwrap().0;
        let mut on_track: Vec<&str> = dispatches
            .iter()
            .filter(|e| e.get("tid").and_then(Json::num) == Some(tid))
            .map(|e| e.get("name").and_then(Json::str).unwrap())
            .collect();
        on_track.sort();
        assert_eq!(on_track, vec!["add", "add", "square", "square"], "{queue}");
    }
    for e in &dispatches {
        assert!(e.get("ts").and_then(Json::num).unwrap() >= 0.0);
        assert!(e.get("dur").and_then(Json::num).unwrap() >= 0.0);
    }
}
