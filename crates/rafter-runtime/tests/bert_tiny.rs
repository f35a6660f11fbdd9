//! The committed bert_tiny fixture, imported, compiled (by `rafter-opt`, and by the tests'
//! one-kernel-per-node lowering) and run by the runtime at seq 7 and 13, against ONNX
//! Runtime's outputs.

mod common;

use std::path::{Path, PathBuf};

use common::{lower_per_node, max_abs_diff, read_npy, LONG};
use rafter_ir::program::{Program, Storage};
use rafter_ir::Symbol;
use rafter_runtime::{BytesBuffer, Session};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny")
}

fn import() -> rafter_ir::Graph {
    rafter_import::import_onnx_file(&fixture().join("model.onnx"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

#[test]
fn bert_tiny_compiled_by_rafter_opt_matches_onnx_runtime() {
    let program = rafter_opt::compile(&import(), &rafter_opt::CompileOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        program
            .buffers
            .iter()
            .any(|b| matches!(b.storage, Storage::Arena { offset: None, .. })),
        "the compiler leaves offsets to the runtime"
    );
    run_and_compare(program);
}

/// With `batch <= 2, seq <= 128` declared, every arena buffer gets a compile-time offset:
/// the runtime allocates the planned arena and places nothing itself, and the results (at
/// seq 7 and 13, below the bound) still match. The plan is within 25% of its lower bound.
#[test]
fn bert_tiny_with_a_static_memory_plan_matches_onnx_runtime() {
    let opts = rafter_opt::CompileOptions {
        bounds: vec![(Symbol::new("batch"), 2), (Symbol::new("seq"), 128)],
        ..rafter_opt::CompileOptions::default()
    };
    let program = rafter_opt::compile(&import(), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        program
            .buffers
            .iter()
            .all(|b| !matches!(b.storage, Storage::Arena { offset: None, .. })),
        "every arena buffer is planned"
    );
    rafter_opt::memplan::check_plan(&program).unwrap();
    let report = rafter_opt::memplan::memory_report(&program);
    eprintln!("bert_tiny, batch <= 2, seq <= 128: {}", report[0]);
    assert!(
        report[0].ratio().is_some_and(|r| r <= 1.25),
        "{}",
        report[0]
    );
    run_and_compare(program);
}

#[test]
fn bert_tiny_one_kernel_per_node_matches_onnx_runtime() {
    run_and_compare(lower_per_node(&import()));
}

fn run_and_compare(program: Program) {
    let dir = fixture();
    let weight_ptrs: Vec<(*const u8, usize)> = program
        .weights
        .iter()
        .map(|w| (w.bytes.as_ptr(), w.dtype.size_of()))
        .collect();
    let session = Session::new(program, &rafter_runtime_cpu::devices().unwrap()).unwrap();
    // The weights the kernels read are the program's own bytes (the model file's map, for
    // weights the compiler did not fold) where they start element-aligned; a weight the
    // protobuf left misaligned is copied once, to a 64-byte boundary.
    let (mut bound, mut copied) = (0, 0);
    for (i, &(ptr, element)) in weight_ptrs.iter().enumerate() {
        if let Some(buffer) = session.weight_buffer(i) {
            let wrapped = buffer
                .downcast_ref::<BytesBuffer>()
                .expect("CPU weights are BytesBuffers");
            if ptr as usize % element == 0 {
                assert_eq!(wrapped.as_ptr(), ptr);
                bound += 1;
            } else {
                assert_eq!(wrapped.as_ptr() as usize % 64, 0);
                copied += 1;
            }
        }
    }
    assert!(bound > 0, "{bound} bound in place, {copied} copied");
    // Both calls in flight at once.
    let calls: Vec<_> = ["seq7", "seq13"]
        .iter()
        .map(|case| {
            let read = |name: &str| read_npy(&dir.join(case).join(name));
            let inputs = vec![read("input_ids.npy"), read("attention_mask.npy")];
            let handle = session.submit(inputs).unwrap();
            (case, handle, read("last_hidden_state.npy"))
        })
        .collect();
    for (case, handle, want) in calls {
        let out = handle.wait(LONG).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(out.len(), 1);
        let diff = max_abs_diff(&out[0], &want);
        assert!(diff <= 1e-4, "{case}: max |runtime - ORT| = {diff}");
    }
    // The completed calls' arenas are pooled (their completion callbacks may run just
    // after the waits return), and later calls, which reuse them with whatever the earlier
    // calls left in them, give the same results.
    let start = std::time::Instant::now();
    while session.idle_arenas() == 0 && start.elapsed() < LONG {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(session.idle_arenas() > 0, "no arena was pooled");
    for case in ["seq13", "seq7", "seq7"] {
        let read = |name: &str| read_npy(&dir.join(case).join(name));
        let inputs = vec![read("input_ids.npy"), read("attention_mask.npy")];
        let out = session
            .run(inputs, LONG)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let diff = max_abs_diff(&out[0], &read("last_hidden_state.npy"));
        assert!(diff <= 1e-4, "{case} again: max |runtime - ORT| = {diff}");
    }
}
