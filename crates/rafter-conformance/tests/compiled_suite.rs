//! The whole ONNX backend suite through the compiled path (compile, artifact bytes, reopen,
//! runtime session on the CPU device), held to the reference path: every test the reference
//! executor passes must pass compiled too. The reference path itself is held to the
//! committed expected-failure list by `onnx_backend_suite.rs`.
//!
//! `RAFTER_COMPILED_SUITE_BASELINE=list` takes the tests that must pass from that list instead
//! of running the reference executor: every test `conformance/expected-failures-cpu.txt` does
//! not name. Wherever `onnx_backend_suite` passes that is the same set (it holds the reference
//! to exactly the list), so the compiled path is held to the same tests; what is left out is
//! the reference executor's own run, half of this test's time. scripts/test_aarch64.sh sets
//! it: under qemu that run takes ~145 s and checks no Arm code rafter ships (the deploy runtime
//! has no reference executor); the x86 run in scripts/test.sh keeps the reference run.

use rafter_conformance::{
    discover, run_suite, Backend, ExpectedFailures, Outcome, SuiteOptions, TestCase, TestResult,
};
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

/// The tests `conformance/expected-failures-cpu.txt` does not name: the reference executor's
/// passes wherever `onnx_backend_suite` passes. A listed name the suite lacks fails here too,
/// as it does there.
fn listed_passes(cases: &[TestCase]) -> BTreeSet<String> {
    let path = repo_root().join("conformance/expected-failures-cpu.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let listed = ExpectedFailures::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .entries;
    let unknown: Vec<&String> = listed
        .keys()
        .filter(|name| !cases.iter().any(|c| &c.name == *name))
        .collect();
    assert!(
        unknown.is_empty(),
        "{} lists tests the suite does not have: {unknown:?}",
        path.display()
    );
    cases
        .iter()
        .filter(|c| !listed.contains_key(&c.name))
        .map(|c| c.name.clone())
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
    let baseline = std::env::var("RAFTER_COMPILED_SUITE_BASELINE").unwrap_or_default();
    let (source, reference) = match baseline.as_str() {
        "" | "reference" => ("reference", passes(&run(Backend::Reference))),
        "list" => ("list", listed_passes(&cases)),
        other => panic!("RAFTER_COMPILED_SUITE_BASELINE={other}: expected `reference` or `list`"),
    };
    let compiled_results = run(Backend::Compiled);
    let compiled = passes(&compiled_results);
    let lost: Vec<String> = compiled_results
        .iter()
        .filter(|r| reference.contains(&r.case.name) && r.outcome != Outcome::Pass)
        .map(|r| format!("{}: {:?}", r.case.name, r.outcome))
        .collect();
    println!(
        "conformance: {source} {} passed, compiled {} passed of {} ({} pass only compiled)",
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
