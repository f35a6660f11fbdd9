//! Discovering and running conformance tests.

use crate::backend::{suite_devices, Prepared};
use crate::{compare, Backend, Tolerance};
use rafter_onnx_proto::{decode_tensor, load_tensor_file};
use rafter_reference::Tensor;
use rafter_runtime::DeviceSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test folder: `model.onnx` plus one or more `test_data_set_N`.
#[derive(Clone, Debug, PartialEq)]
pub struct TestCase {
    /// `node`, `simple`, `pytorch-converted`, `pytorch-operator` or `light`.
    pub kind: String,
    pub name: String,
    pub dir: PathBuf,
    pub tolerance: Tolerance,
}

/// How one test ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass,
    /// rafter reports it cannot run the model (unsupported op, dtype or input kind).
    Skip(String),
    /// Wrong results or an error other than "unsupported".
    Fail(String),
}

#[derive(Clone, Debug)]
pub struct TestResult {
    pub case: TestCase,
    pub outcome: Outcome,
    pub elapsed: Duration,
    /// How many of the compiled model's kernels ran on the Vulkan device (0 on the CPU
    /// paths, and when the test failed before its session existed).
    pub gpu_kernels: usize,
    /// How many kernels the compiled model has (0 on the reference path and when the test
    /// failed before its session existed): the denominator of the GPU share.
    pub kernels: usize,
    /// The largest `|actual - expected|` over the outputs of every data set that was
    /// compared (0 when none was, or every output is an integer one that matched).
    pub max_abs_error: f64,
}

/// What a test run measured besides its outcome.
#[derive(Clone, Copy, Debug, Default)]
struct Measured {
    gpu_kernels: usize,
    kernels: usize,
    max_abs_error: f64,
}

/// Options of a suite run.
#[derive(Clone, Debug, Default)]
pub struct SuiteOptions {
    /// Only tests whose name matches this regular expression.
    pub filter: Option<String>,
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    /// The path each test's model takes (reference executor, or compiled and run by the
    /// runtime).
    pub backend: Backend,
}

const KINDS: [&str; 5] = [
    "node",
    "simple",
    "pytorch-converted",
    "pytorch-operator",
    "light",
];

/// Lists the tests under `dir`, sorted by kind then name.
pub fn discover(dir: &Path, filter: Option<&str>) -> Result<Vec<TestCase>, String> {
    let re = filter
        .map(|f| regex_lite::Regex::new(f).map_err(|e| format!("bad --filter pattern `{f}`: {e}")))
        .transpose()?;
    if !dir.is_dir() {
        return Err(format!(
            "conformance data not found at {} (run scripts/test.sh or `.venv/bin/python scripts/gen_conformance_data.py {}`)",
            dir.display(),
            dir.display()
        ));
    }
    let mut out = Vec::new();
    for kind in KINDS {
        let kdir = dir.join(kind);
        let Ok(entries) = std::fs::read_dir(&kdir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let tdir = kdir.join(&name);
            if !tdir.join("model.onnx").is_file() || re.as_ref().is_some_and(|r| !r.is_match(&name))
            {
                continue;
            }
            let tolerance = read_tolerance(&tdir)?;
            out.push(TestCase {
                kind: kind.to_string(),
                name,
                dir: tdir,
                tolerance,
            });
        }
    }
    Ok(out)
}

/// Reads `tolerance.json` (`{"rtol": .., "atol": ..}`) if the test has one.
fn read_tolerance(dir: &Path) -> Result<Tolerance, String> {
    let path = dir.join("tolerance.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Tolerance::default());
    };
    let field = |key: &str| -> Result<f64, String> {
        let at = text
            .find(&format!("\"{key}\""))
            .ok_or_else(|| format!("{}: no `{key}`", path.display()))?;
        let rest = text[at + key.len() + 2..]
            .trim_start()
            .trim_start_matches(':')
            .trim_start();
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end]
            .trim()
            .parse()
            .map_err(|e| format!("{}: bad `{key}`: {e}", path.display()))
    };
    Ok(Tolerance {
        rtol: field("rtol")?,
        atol: field("atol")?,
    })
}

/// Reads one `.pb` tensor file. Errors that mean "rafter cannot represent this" start
/// with `unsupported`.
pub fn load_tensor(path: &Path) -> Result<Tensor, String> {
    let (proto, _) = load_tensor_file(path).map_err(|e| e.to_string())?;
    let t = decode_tensor(&proto, path.parent()).map_err(|e| match e {
        rafter_onnx_proto::ProtoError::StringTensor { .. }
        | rafter_onnx_proto::ProtoError::UnsupportedDtype { .. } => {
            format!("unsupported: {e}")
        }
        other => format!("{}: {other}", path.display()),
    })?;
    let dtype = rafter_import::dtype_from_onnx(t.data_type)
        .map_err(|_| format!("unsupported dtype {} in {}", t.type_name(), path.display()))?;
    let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    Tensor::from_le_bytes(dtype, &dims, &t.data).map_err(|e| format!("{}: {e}", path.display()))
}

/// A test's data sets: its `test_data_set_*` folders, sorted.
pub fn data_sets(dir: &Path) -> Vec<PathBuf> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set"))
                })
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    sets
}

/// Numbered files `prefix_0.pb`, `prefix_1.pb`, ... in `dir` (a data set's `input` or
/// `output` tensors).
pub fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.pb")))
        .take_while(|p| p.is_file())
        .collect()
}

/// Runs one test on `backend` (the compiled path opens its own CPU device; [`run_suite`]
/// shares one between tests).
pub fn run_test(case: &TestCase, backend: Backend) -> Outcome {
    run_test_on(case, backend, None).0
}

/// The outcome, and what the run measured (kernels on the Vulkan device, of how many;
/// the largest error).
fn run_test_on(
    case: &TestCase,
    backend: Backend,
    devices: Option<&DeviceSet>,
) -> (Outcome, Measured) {
    let mut measured = Measured::default();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_test_inner(case, backend, devices, &mut measured)
    }));
    let outcome = match outcome {
        Ok(o) => o,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Outcome::Fail(format!("panic: {msg}"))
        }
    };
    (outcome, measured)
}

fn run_test_inner(
    case: &TestCase,
    backend: Backend,
    devices: Option<&DeviceSet>,
    measured: &mut Measured,
) -> Outcome {
    let path = case.dir.join("model.onnx");
    // Reasons name the node, not the file: the test's name already says which file.
    let strip = |e: &dyn std::fmt::Display| {
        one_line(&e.to_string().replace(&format!("{}: ", path.display()), ""))
    };
    let model = match rafter_import::import_onnx_file(&path) {
        Ok(m) => m,
        Err(e) if e.is_unsupported() => return Outcome::Skip(strip(&e)),
        Err(e) => return Outcome::Fail(format!("import: {}", strip(&e))),
    };
    let graph = &model.graph;
    let prepared = match Prepared::new(graph, backend, devices) {
        Ok(p) => p,
        Err(outcome) => return outcome,
    };
    measured.gpu_kernels = prepared.gpu_kernels();
    measured.kernels = prepared.kernels();
    let sets = data_sets(&case.dir);
    if sets.is_empty() {
        return Outcome::Fail("no test_data_set_* folder".into());
    }
    for set in sets {
        let mut inputs = Vec::new();
        for p in numbered(&set, "input") {
            match load_tensor(&p) {
                Ok(t) => inputs.push(t),
                Err(e) if e.starts_with("unsupported") => return Outcome::Skip(one_line(&e)),
                Err(e) => return Outcome::Fail(one_line(&e)),
            }
        }
        let outputs = match prepared.run(inputs) {
            Ok(o) => o,
            Err(outcome) => return outcome,
        };
        let expected = numbered(&set, "output");
        if expected.len() != outputs.len() {
            return Outcome::Fail(format!(
                "{} outputs but {} expected",
                outputs.len(),
                expected.len()
            ));
        }
        for (i, (p, actual)) in expected.iter().zip(&outputs).enumerate() {
            let want = match load_tensor(p) {
                Ok(t) => t,
                Err(e) if e.starts_with("unsupported") => return Outcome::Skip(one_line(&e)),
                Err(e) => return Outcome::Fail(one_line(&e)),
            };
            if actual.shape() == want.shape() {
                let (a, e) = (actual.to_f64_vec(), want.to_f64_vec());
                let err = a
                    .iter()
                    .zip(&e)
                    .map(|(a, e)| (a - e).abs())
                    .fold(0.0, f64::max);
                measured.max_abs_error = measured.max_abs_error.max(err);
            }
            if let Err(e) = compare(actual, &want, case.tolerance) {
                let name = &graph.value(graph.outputs[i]).name;
                return Outcome::Fail(one_line(&format!("output {i} `{name}`: {e}")));
            }
        }
    }
    Outcome::Pass
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs every case on a pool of threads; results come back in the order of `cases`.
pub fn run_suite(cases: &[TestCase], opts: &SuiteOptions) -> Vec<TestResult> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    };
    let devices = match opts.backend {
        Backend::Reference => None,
        backend => match suite_devices(backend) {
            Ok(d) => Some(d),
            Err(e) => {
                return cases
                    .iter()
                    .map(|case| TestResult {
                        case: case.clone(),
                        outcome: Outcome::Fail(e.clone()),
                        elapsed: Duration::ZERO,
                        gpu_kernels: 0,
                        kernels: 0,
                        max_abs_error: 0.0,
                    })
                    .collect()
            }
        },
    };
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<TestResult>>> = Mutex::new(vec![None; cases.len()]);
    // Panics are caught and reported per test; keep the default hook from printing them.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    std::thread::scope(|s| {
        for _ in 0..threads.min(cases.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let start = Instant::now();
                let (outcome, m) = run_test_on(case, opts.backend, devices.as_ref());
                let r = TestResult {
                    case: case.clone(),
                    outcome,
                    elapsed: start.elapsed(),
                    gpu_kernels: m.gpu_kernels,
                    kernels: m.kernels,
                    max_abs_error: m.max_abs_error,
                };
                results.lock().unwrap()[i] = Some(r);
            });
        }
    });
    std::panic::set_hook(hook);
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every case ran"))
        .collect()
}
