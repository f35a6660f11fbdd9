//! A compiled model bound to its devices: compile, load, save, run, submit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyList;
use rafter_compiler::{CompileOptions, Compiled};
use rafter_ir::program::{Port, Program};
use rafter_ir::Symbol;
use rafter_runtime::{CallHandle, Session, SessionOptions};

use crate::devices::devices_for;
use crate::dlpack::{tensor_from, Tensor};
use crate::errors::{to, CompileError, InputError, ModelError, RunError};

/// How long a call may run before waiting gives up: far beyond any model, so it only ends a
/// call the runtime failed to complete.
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

/// Where a model's artifact bytes come from, for `save`.
enum Saved {
    /// Compiled in this process.
    Compiled(Box<Compiled>),
    /// Opened from this artifact file.
    File(PathBuf),
}

/// A compiled model, ready to call from any thread.
#[pyclass(frozen, module = "rafter._rafter")]
pub struct Model {
    session: Arc<Session>,
    saved: Mutex<Saved>,
    /// The target it was compiled for here (`None` for an artifact opened from a file),
    /// which the plan report names as `rafter plan --target` does.
    target: Option<String>,
    /// How many inputs were copied on the way in (strided, misaligned or bool tensors).
    converted: AtomicU64,
}

/// Compiles the ONNX model at `path` for `target` (`cpu` or `vulkan`) with symbol `bounds`;
/// its calls use `threads` CPU threads (0: one per core).
#[pyfunction]
#[pyo3(signature = (path, target, bounds, threads=0))]
pub fn compile_onnx(
    py: Python<'_>,
    path: PathBuf,
    target: &str,
    bounds: Vec<(String, i64)>,
    threads: usize,
) -> PyResult<Model> {
    let target = match target {
        "auto" if crate::devices::vulkan_available().is_ok() => "vulkan",
        "auto" => "cpu",
        name => name,
    };
    let target_name = target.to_string();
    let target = rafter_compiler::target(target).map_err(to::<CompileError>)?;
    let mut symbols = Vec::new();
    for (name, n) in bounds {
        if !rafter_ir::is_identifier(&name) {
            return Err(to::<CompileError>(format!(
                "dims: `{name}` is not a symbol name"
            )));
        }
        if n < 1 {
            return Err(to::<CompileError>(format!(
                "dims: `{name}` must be bounded by a positive size, got {n}"
            )));
        }
        symbols.push((Symbol::new(&name), n));
    }
    let compiled = py.detach(|| -> PyResult<Compiled> {
        let graph = rafter_import::import_onnx_file(&path)
            .map_err(to::<ModelError>)?
            .graph;
        check_bounds_known(&graph, &symbols)?;
        let options = CompileOptions {
            target,
            bounds: symbols,
            ..CompileOptions::default()
        };
        rafter_compiler::compile(&graph, &options).map_err(to::<CompileError>)
    })?;
    let session = py.detach(|| bind(compiled.program.clone(), &compiled.executables(), threads))?;
    Ok(Model {
        session: Arc::new(session),
        saved: Mutex::new(Saved::Compiled(Box::new(compiled))),
        target: Some(target_name),
        converted: AtomicU64::new(0),
    })
}

/// A bound on a symbol the model does not have is a mistake worth naming.
fn check_bounds_known(graph: &rafter_ir::Graph, bounds: &[(Symbol, i64)]) -> PyResult<()> {
    let mut known = Vec::new();
    for &id in &graph.inputs {
        for d in &graph.value(id).ty.dims {
            for s in d.symbols() {
                if !known.contains(&s) {
                    known.push(s);
                }
            }
        }
    }
    for (s, _) in bounds {
        if !known.contains(s) {
            let names: Vec<&str> = known.iter().map(|s| s.name()).collect();
            return Err(to::<CompileError>(format!(
                "dims: the model's inputs have no symbol `{}` (they have: {})",
                s.name(),
                if names.is_empty() {
                    "none, every dim is fixed".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// Opens the artifact at `path` (memory-mapped, checksums verified); its calls use
/// `threads` CPU threads (0: one per core).
#[pyfunction]
#[pyo3(signature = (path, threads=0))]
pub fn load(py: Python<'_>, path: PathBuf, threads: usize) -> PyResult<Model> {
    let session = py.detach(|| -> PyResult<Session> {
        let artifact = rafter_artifact::Artifact::open(&path)
            .map_err(|e| to::<ModelError>(format!("{}: {e}", path.display())))?;
        let executables: Vec<(String, Bytes)> = artifact
            .devices()
            .filter_map(|d| Some((d.to_string(), artifact.executable(d)?)))
            .collect();
        bind(artifact.into_program(), &executables, threads)
    })?;
    Ok(Model {
        session: Arc::new(session),
        saved: Mutex::new(Saved::File(path)),
        target: None,
        converted: AtomicU64::new(0),
    })
}

/// A session for `program` on the devices it names; `threads` CPU worker threads, and
/// threads per CPU kernel (0: one per core).
fn bind(program: Program, executables: &[(String, Bytes)], threads: usize) -> PyResult<Session> {
    let devices = devices_for(&program, threads)?;
    let mut options = SessionOptions::new().kernel_threads(threads);
    for (device, code) in executables {
        options = options.executable(device.clone(), code.clone());
    }
    Session::with_options(program, &devices, options).map_err(to::<ModelError>)
}

/// `(name, dtype, dims)` of a port; a dim is an int when known, else its symbolic text.
fn describe(py: Python<'_>, port: &Port) -> PyResult<(String, String, Py<PyList>)> {
    let dims = PyList::empty(py);
    for d in &port.ty.dims {
        match d.as_known() {
            Some(n) => dims.append(n)?,
            None => dims.append(d.to_string())?,
        }
    }
    Ok((port.name.clone(), port.ty.dtype.to_string(), dims.unbind()))
}

#[pymethods]
impl Model {
    /// `(name, dtype, dims)` of each input, in call order.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<(String, String, Py<PyList>)>> {
        let p = self.session.program();
        p.inputs.iter().map(|port| describe(py, port)).collect()
    }

    /// `(name, dtype, dims)` of each output, in result order.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<(String, String, Py<PyList>)>> {
        let p = self.session.program();
        p.outputs.iter().map(|port| describe(py, port)).collect()
    }

    /// The report `rafter plan` prints: ports and bounds, the steps in dispatch order with
    /// the ops fused into each kernel and its device, buffers, weights and planned memory.
    fn plan(&self) -> String {
        rafter_compiler::plan_report::render(self.session.program(), self.target.as_deref())
    }

    /// The devices the model runs on.
    fn device_names(&self) -> Vec<String> {
        self.session
            .device_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// Per input, whether calls read it in place from the caller's memory (only CPU
    /// kernels read it, and its dtype is not bool): a row-major, aligned tensor is then
    /// never copied.
    fn input_in_place(&self) -> Vec<bool> {
        let ports = &self.session.program().inputs;
        self.session
            .input_in_place()
            .into_iter()
            .zip(ports)
            .map(|(in_place, port)| in_place && port.ty.dtype != rafter_ir::DType::Bool)
            .collect()
    }

    /// How many input tensors were copied so far: `(converted, written)`, those read into
    /// a packed tensor (strided, misaligned or bool) and those written into a call's input
    /// buffer (inputs not read in place; for a GPU, the upload).
    fn input_copies(&self) -> (u64, u64) {
        (
            self.converted.load(Ordering::Relaxed),
            self.session.inputs_written(),
        )
    }

    /// Writes the model as an artifact at `path`; returns its length in bytes.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<u64> {
        let saved = self.saved.lock().map_err(|_| to::<ModelError>("lock"))?;
        py.detach(|| match &*saved {
            Saved::Compiled(c) => c
                .write(&path)
                .map_err(|e| to::<ModelError>(format!("writing {}: {e}", path.display()))),
            Saved::File(src) => copy_artifact(src, &path),
        })
    }

    /// Runs one call with the GIL released; `inputs` in the model's input order.
    fn run(&self, py: Python<'_>, inputs: &Bound<'_, PyList>) -> PyResult<Vec<Tensor>> {
        let tensors = self.tensors(inputs)?;
        let session = self.session.clone();
        let outputs = py.detach(move || {
            session
                .submit_to_wait(tensors)
                .and_then(|h| h.wait(CALL_TIMEOUT))
        });
        Ok(outputs
            .map_err(run_error)?
            .into_iter()
            .map(Tensor::new)
            .collect())
    }

    /// Submits one call and returns at once; [`Call::wait`] gets its outputs.
    fn submit(&self, inputs: &Bound<'_, PyList>) -> PyResult<Call> {
        let tensors = self.tensors(inputs)?;
        let handle = self.session.submit(tensors).map_err(run_error)?;
        Ok(Call {
            handle: Mutex::new(Some(handle)),
        })
    }
}

impl Model {
    /// The inputs as runtime tensors, checked against the program's inputs by count and
    /// dtype (the runtime checks shapes against the symbols). Row-major inputs borrow the
    /// caller's memory: each runtime tensor holds its DLPack capsule, which the call keeps
    /// until its work has completed, so a dropped future or a failed call frees nothing early.
    fn tensors(&self, inputs: &Bound<'_, PyList>) -> PyResult<Vec<rafter_runtime::Tensor>> {
        let ports = &self.session.program().inputs;
        if inputs.len() != ports.len() {
            let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
            return Err(to::<InputError>(format!(
                "the model takes {} inputs ({}), got {}",
                ports.len(),
                names.join(", "),
                inputs.len()
            )));
        }
        let mut out = Vec::with_capacity(ports.len());
        for (port, obj) in ports.iter().zip(inputs.iter()) {
            let what = format!("input `{}`", port.name);
            let input = tensor_from(&obj, &what)?;
            let t = input.tensor;
            if input.copied {
                self.converted.fetch_add(1, Ordering::Relaxed);
            }
            if t.dtype() != port.ty.dtype {
                return Err(to::<InputError>(format!(
                    "{what}: expected {}, got {}",
                    port.ty.dtype,
                    t.dtype()
                )));
            }
            out.push(t);
        }
        Ok(out)
    }
}

/// A runtime error as a Python exception: an input that does not fit the model is an
/// [`InputError`], anything else a [`RunError`].
fn run_error(e: rafter_runtime::RuntimeError) -> PyErr {
    match e {
        rafter_runtime::RuntimeError::Input { .. } => to::<InputError>(e),
        e => to::<RunError>(e),
    }
}

fn copy_artifact(src: &Path, dst: &Path) -> PyResult<u64> {
    if src.canonicalize().ok() == dst.canonicalize().ok() {
        return std::fs::metadata(src)
            .map(|m| m.len())
            .map_err(|e| to::<ModelError>(format!("{}: {e}", src.display())));
    }
    std::fs::copy(src, dst).map_err(|e| {
        to::<ModelError>(format!(
            "copying artifact {} to {}: {e}",
            src.display(),
            dst.display()
        ))
    })
}

/// A submitted call.
#[pyclass(frozen, module = "rafter._rafter")]
pub struct Call {
    handle: Mutex<Option<CallHandle>>,
}

#[pymethods]
impl Call {
    /// Whether the call's work has finished. Never blocks.
    fn done(&self) -> bool {
        self.handle
            .lock()
            .map(|h| h.as_ref().is_none_or(CallHandle::is_done))
            .unwrap_or(true)
    }

    /// Waits (GIL released) and returns the outputs; only once.
    fn wait(&self, py: Python<'_>) -> PyResult<Vec<Tensor>> {
        let handle = self
            .handle
            .lock()
            .map_err(|_| to::<RunError>("lock"))?
            .take()
            .ok_or_else(|| to::<RunError>("the call's outputs were already taken"))?;
        let outputs = py.detach(move || handle.wait(CALL_TIMEOUT));
        Ok(outputs
            .map_err(run_error)?
            .into_iter()
            .map(Tensor::new)
            .collect())
    }
}
