//! The native half of the `rafter` Python package (`rafter._rafter`).
//!
//! It holds what must run in Rust: compiling an ONNX model ([`model::compile_onnx`]),
//! opening an artifact ([`model::load`]), running a compiled model with the GIL released
//! ([`model::Model`]), moving tensors in and out through DLPack without extra copies
//! ([`dlpack`]), and LLM generation streamed to a Python iterator ([`llm::Llm`]). The Python
//! half (python/rafter/) shapes this into the public API: keyword inputs, numpy/torch
//! outputs, futures, `torch.nn.Module` export.
//!
//! Every failure is a Python exception of the `rafter.Error` hierarchy ([`errors`]), never a
//! panic crossing into the interpreter (PyO3 turns a panic into `PanicException`, and no code
//! path here is meant to panic).

mod devices;
mod dlpack;
mod errors;
mod llm;
mod model;

use pyo3::prelude::*;

/// The `rafter._rafter` extension module.
#[pymodule]
fn _rafter(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<dlpack::Tensor>()?;
    m.add_class::<model::Model>()?;
    m.add_class::<model::Call>()?;
    m.add_class::<llm::Llm>()?;
    m.add_class::<llm::TextStream>()?;
    m.add_function(wrap_pyfunction!(model::compile_onnx, m)?)?;
    m.add_function(wrap_pyfunction!(model::load, m)?)?;
    m.add_function(wrap_pyfunction!(devices::devices, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
