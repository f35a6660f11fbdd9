//! The whole ONNX backend suite on the CPU reference path, held to the committed
//! expected-failure list: a test outside the list that fails, or a listed test that now
//! passes, fails this test (the list may only shrink).

use rafter_conformance::{discover, run_suite, ExpectedFailures, Outcome, SuiteOptions};
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn onnx_backend_suite_matches_expected_failures() {
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
    let list_path = repo_root().join("conformance/expected-failures-cpu.txt");
    let text = std::fs::read_to_string(&list_path)
        .unwrap_or_else(|e| panic!("{}: {e}", list_path.display()));
    let expected = ExpectedFailures::parse(&text).unwrap();

    let results = run_suite(&cases, &SuiteOptions::default());
    let mut problems = Vec::new();
    let mut passed = 0;
    for r in &results {
        let listed = expected.entries.contains_key(&r.case.name);
        match (&r.outcome, listed) {
            (Outcome::Pass, false) => passed += 1,
            (Outcome::Pass, true) => problems.push(format!(
                "{} now passes: remove it from the list",
                r.case.name
            )),
            (Outcome::Skip(why) | Outcome::Fail(why), false) => {
                problems.push(format!("{} fails: {why}", r.case.name))
            }
            _ => {}
        }
    }
    for name in expected.entries.keys() {
        if !cases.iter().any(|c| &c.name == name) {
            problems.push(format!("{name} is listed but no such test exists"));
        }
    }
    println!("conformance (cpu): {passed} of {} passed", cases.len());
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
