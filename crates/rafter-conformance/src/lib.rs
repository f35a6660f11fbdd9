//! ONNX backend conformance: discovery, execution and comparison of ONNX's own tests.
//!
//! The suite lives outside the repository (ONNX ships it as a generator; see
//! `scripts/gen_conformance_data.py`): `<dir>/<kind>/<test>/model.onnx` with
//! `test_data_set_N/{input,output}_J.pb`. Each test is imported, run on a device and compared
//! with ONNX's tolerance rule `|actual - expected| <= atol + rtol * |expected|`.
//!
//! A test runs on a [`Backend`]: the reference executor over the imported graph, or the
//! compiled path (compile, artifact bytes, reopen, runtime session), which must pass every
//! test the reference passes.

mod backend;
mod compare;
mod expected;
mod suite;

pub use backend::Backend;
pub use compare::{compare, Tolerance};
pub use expected::{ExpectedFailures, ExpectedParseError};
pub use suite::{
    data_sets, discover, load_tensor, numbered, run_suite, run_test, Outcome, SuiteOptions,
    TestCase, TestResult,
};
