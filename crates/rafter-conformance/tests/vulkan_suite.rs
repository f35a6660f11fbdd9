//! The whole ONNX backend suite compiled for `--target vulkan` and run on the Vulkan device
//! (lavapipe in CI) with the CPU as fallback, held to `conformance/expected-failures-vulkan.txt`
//! exactly (a test outside the list that fails, or a listed test that passes, fails this
//! test), and to issue 4's bar: at least 90% of what the CPU path passes. It prints how many
//! passing tests ran at least one kernel on the GPU.
//!
//! Without a Vulkan device it prints why and passes, unless `RAFTER_REQUIRE_VULKAN` is set
//! (CI installs lavapipe and sets it).

#![cfg(feature = "vulkan")]

use rafter_conformance::{discover, run_suite, Backend, ExpectedFailures, Outcome, SuiteOptions};
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions, VulkanError};
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn list(name: &str) -> ExpectedFailures {
    let path = repo_root().join("conformance").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ExpectedFailures::parse(&text).unwrap()
}

#[test]
fn vulkan_suite_matches_expected_failures() {
    match VulkanDevice::new(VulkanDeviceOptions::default()) {
        Ok(_) => {}
        Err(error @ VulkanError::NoDevice { .. }) => {
            let required =
                std::env::var("RAFTER_REQUIRE_VULKAN").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "RAFTER_REQUIRE_VULKAN is set but: {error}");
            eprintln!("skipping vulkan_suite_matches_expected_failures: {error}");
            return;
        }
        Err(error) => panic!("opening the Vulkan device failed: {error}"),
    }
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
    let expected = list("expected-failures-vulkan.txt");
    let results = run_suite(
        &cases,
        &SuiteOptions {
            backend: Backend::Vulkan,
            ..SuiteOptions::default()
        },
    );
    let mut problems = Vec::new();
    let (mut passed, mut on_gpu) = (0usize, 0usize);
    for r in &results {
        let listed = expected.entries.contains_key(&r.case.name);
        match (&r.outcome, listed) {
            (Outcome::Pass, false) => {
                passed += 1;
                on_gpu += usize::from(r.gpu_kernels > 0);
            }
            (Outcome::Pass, true) => problems.push(format!(
                "{} now passes on vulkan: remove it from the list",
                r.case.name
            )),
            (Outcome::Skip(why) | Outcome::Fail(why), false) => {
                problems.push(format!("{} fails on vulkan: {why}", r.case.name))
            }
            _ => {}
        }
    }
    for name in expected.entries.keys() {
        if !cases.iter().any(|c| &c.name == name) {
            problems.push(format!("{name} is listed but no such test exists"));
        }
    }
    // The CPU path passes every test not on its list (held by onnx_backend_suite.rs and
    // compiled_suite.rs).
    let cpu_passed = cases.len() - list("expected-failures-cpu.txt").entries.len();
    println!(
        "conformance (vulkan): {passed} of {} passed ({:.1}% of the CPU path's {cpu_passed}); \
         {on_gpu} of them ran at least one kernel on the GPU",
        cases.len(),
        100.0 * passed as f64 / cpu_passed as f64
    );
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(
        passed * 10 >= cpu_passed * 9,
        "vulkan passes {passed}, under 90% of the CPU path's {cpu_passed}"
    );
    // Guards the GPU share against a partitioner that quietly sends everything to the CPU.
    assert!(
        on_gpu >= 300,
        "only {on_gpu} passing tests ran a kernel on the GPU"
    );
}
