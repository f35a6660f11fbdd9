//! ONNX Runtime's contrib ops (`com.microsoft`): the committed fixtures of
//! `scripts/gen_contrib_fixtures.py` (one small model per op and attribute variant, with ONNX
//! Runtime's outputs and a per-case tolerance) run through the reference executor and the
//! compiled CPU path; every case must pass on both.

use rafter_conformance::{discover, run_test, Backend, Outcome};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/contrib")
}

fn run_all(backend: Backend) {
    let cases = discover(&fixtures(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        cases.len() >= 93,
        "only {} contrib fixtures found",
        cases.len()
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| match run_test(c, backend) {
            Outcome::Pass => None,
            Outcome::Skip(r) => Some(format!("{}: skipped: {r}", c.name)),
            Outcome::Fail(r) => Some(format!("{}: {r}", c.name)),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} contrib cases fail on the {} path:\n{}",
        failures.len(),
        cases.len(),
        backend.word(),
        failures.join("\n")
    );
}

#[test]
fn contrib_ops_match_onnx_runtime_on_the_reference_executor() {
    run_all(Backend::Reference);
}

#[test]
fn contrib_ops_match_onnx_runtime_compiled_for_the_cpu() {
    run_all(Backend::Compiled);
}
