//! The whole ONNX backend suite through the compiled path (compile, artifact bytes, reopen,
//! runtime session on the CPU device), held to the reference path: every test the reference
//! executor passes must pass compiled too. The reference path itself is held to the
//! committed expected-failure list by `onnx_backend_suite.rs`.

use rafter_conformance::{discover, run_suite, Backend, Outcome, SuiteOptions, TestResult};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn passes(results: &[TestResult]) -> BTreeSet<String> {
    results
        .iter()
        .filter(|r| r.outcome == Outcome::Pass)
        .map(|r| r.case.name.clone())
        .collect()
}

#[test]
fn compiled_path_passes_every_test_the_reference_passes() {
    let dir = std::env::var_os("RAFTER_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/onnx-conformance"));
    let cases = discover(&dir, None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        cases.len(),
        2033,
        "the pinned onnx 1.23.2 suite has 2,033 tests; regenerate {}",
        dir.display()
    );
    let run = |backend| {
        run_suite(
            &cases,
            &SuiteOptions {
                backend,
                ..SuiteOptions::default()
            },
        )
    };
    let reference = passes(&run(Backend::Reference));
    let compiled_results = run(Backend::Compiled);
    let compiled = passes(&compiled_results);
    let lost: Vec<String> = compiled_results
        .iter()
        .filter(|r| reference.contains(&r.case.name) && r.outcome != Outcome::Pass)
        .map(|r| format!("{}: {:?}", r.case.name, r.outcome))
        .collect();
    println!(
        "conformance: reference {} passed, compiled {} passed of {} ({} pass only compiled)",
        reference.len(),
        compiled.len(),
        cases.len(),
        compiled.difference(&reference).count()
    );
    assert!(
        lost.is_empty(),
        "{} test(s) pass on the reference executor but not compiled:\n{}",
        lost.len(),
        lost.join("\n")
    );
}
