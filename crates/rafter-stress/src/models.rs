//! The models a stress run drives: real ONNX models from the conformance set, compiled
//! once per target, with expected outputs from the reference executor.
//!
//! A candidate joins the pool only when the reference executor reproduces ONNX's own
//! expected outputs (so the reference is a trusted oracle for it) and one call of its
//! compiled session, alone, matches the reference: a model the compiled path gets wrong
//! even without concurrency is the conformance suite's business (its expected-failure
//! list), not a stress failure. Every stress call is then compared with the reference.

use std::time::{Duration, Instant};

use rafter_compiler::Compiled;
use rafter_conformance::{compare, data_sets, load_tensor, numbered, TestCase, Tolerance};
use rafter_runtime::{DeviceSet, Session, SessionOptions};
use rafter_runtime_cpu::{from_reference, to_reference};

use crate::rng::Rng;

/// One data set: runtime inputs and the reference executor's outputs for them.
#[derive(Clone)]
pub struct DataSet {
    pub inputs: Vec<rafter_runtime::Tensor>,
    pub expected: Vec<rafter_reference::Tensor>,
}

/// A model compiled for one target, ready to open sessions on.
pub struct Model {
    /// `kind/test`, as the conformance suite names it.
    pub name: String,
    /// The compiler target (`cpu`, `vulkan`).
    pub target: String,
    compiled: Compiled,
    pub sets: Vec<DataSet>,
    pub tolerance: Tolerance,
}

impl Model {
    /// A new session over the model (artifact bytes written and reopened, as a deployed
    /// model is) on `devices`.
    pub fn session(&self, devices: &DeviceSet) -> Result<Session, String> {
        let artifact = self
            .compiled
            .to_artifact()
            .map_err(|e| format!("{}: artifact: {e}", self.name))?;
        Session::from_artifact(artifact, devices, SessionOptions::new())
            .map_err(|e| format!("{}: session: {e}", self.name))
    }

    /// How many of the model's kernels run on the Vulkan device.
    pub fn gpu_kernels(&self) -> usize {
        self.compiled
            .program
            .kernels
            .iter()
            .filter(|k| k.device == "vulkan")
            .count()
    }

    /// Compares a call's outputs with data set `set`'s reference outputs.
    pub fn check(&self, set: usize, outputs: &[rafter_runtime::Tensor]) -> Result<(), String> {
        let expected = &self.sets[set].expected;
        if outputs.len() != expected.len() {
            return Err(format!(
                "{} outputs, the reference has {}",
                outputs.len(),
                expected.len()
            ));
        }
        for (i, (actual, want)) in outputs.iter().zip(expected).enumerate() {
            let actual = to_reference(actual).map_err(|e| format!("output {i}: {e}"))?;
            compare(&actual, want, self.tolerance).map_err(|e| format!("output {i}: {e}"))?;
        }
        Ok(())
    }
}

/// Up to `want` models for `target`, tried in a random order among `cases` until `want`
/// qualify or `budget` is spent. `devices` must hold the devices `target` places kernels
/// on. Models whose file exceeds `max_bytes` are passed over (the stress run wants many
/// short calls, not a few long ones).
pub fn pick(
    cases: &[TestCase],
    target: &str,
    devices: &DeviceSet,
    rng: &mut Rng,
    want: usize,
    budget: Duration,
    max_bytes: u64,
) -> Vec<Model> {
    let start = Instant::now();
    let mut order: Vec<&TestCase> = cases.iter().collect();
    rng.shuffle(&mut order);
    let mut out = Vec::new();
    for case in order {
        if out.len() >= want || start.elapsed() >= budget {
            break;
        }
        let size = std::fs::metadata(case.dir.join("model.onnx")).map_or(u64::MAX, |m| m.len());
        if size > max_bytes {
            continue;
        }
        // A candidate that panics anywhere on the way is simply not picked.
        let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            prepare(case, target, devices)
        }));
        if let Ok(Some(model)) = tried {
            out.push(model);
        }
    }
    out
}

/// The model of `case` if it qualifies (see the module doc), else `None`.
fn prepare(case: &TestCase, target: &str, devices: &DeviceSet) -> Option<Model> {
    let imported = rafter_import::import_onnx_file(&case.dir.join("model.onnx")).ok()?;
    let graph = &imported.graph;
    let mut sets = Vec::new();
    for dir in data_sets(&case.dir) {
        let inputs = numbered(&dir, "input")
            .iter()
            .map(|p| load_tensor(p))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let onnx_expected = numbered(&dir, "output")
            .iter()
            .map(|p| load_tensor(p))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        let expected = rafter_reference::run(graph, inputs.clone()).ok()?;
        if expected.len() != onnx_expected.len()
            || expected
                .iter()
                .zip(&onnx_expected)
                .any(|(r, o)| compare(r, o, case.tolerance).is_err())
        {
            return None;
        }
        let inputs = inputs
            .iter()
            .map(from_reference)
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        sets.push(DataSet { inputs, expected });
    }
    if sets.is_empty() {
        return None;
    }
    let options = rafter_compiler::CompileOptions {
        target: rafter_compiler::target(target).ok()?,
        ..rafter_compiler::CompileOptions::default()
    };
    let compiled = rafter_compiler::compile(graph, &options).ok()?;
    let model = Model {
        name: format!("{}/{}", case.kind, case.name),
        target: target.to_string(),
        compiled,
        sets,
        tolerance: case.tolerance,
    };
    let session = model.session(devices).ok()?;
    for (i, set) in model.sets.iter().enumerate() {
        let outputs = session
            .run(set.inputs.clone(), Duration::from_secs(60))
            .ok()?;
        model.check(i, &outputs).ok()?;
    }
    Some(model)
}
