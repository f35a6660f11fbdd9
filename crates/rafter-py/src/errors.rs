//! The exception hierarchy: `rafter.Error` and one subclass per stage that can fail.
//!
//! Each carries rafter's own message (which names the file, input, kernel or field at
//! fault), so a Python user sees what the CLI would print.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    rafter,
    Error,
    PyException,
    "Base class of every error rafter raises."
);
create_exception!(
    rafter,
    ModelError,
    Error,
    "A model file could not be read: a missing file, invalid ONNX, a corrupt artifact."
);
create_exception!(
    rafter,
    CompileError,
    Error,
    "The compiler rejected the model or the options (target, dims)."
);
create_exception!(
    rafter,
    InputError,
    Error,
    "A call's inputs do not match the model: count, name, dtype, shape or memory layout."
);
create_exception!(
    rafter,
    RunError,
    Error,
    "A call failed while running (a kernel error, a device lost)."
);
create_exception!(
    rafter,
    DeviceError,
    Error,
    "A device the model needs could not be opened."
);
create_exception!(
    rafter,
    LLMError,
    Error,
    "An LLM could not be opened, or generation failed."
);

/// Adds the exception types to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("RunError", py.get_type::<RunError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("LLMError", py.get_type::<LLMError>())?;
    Ok(())
}

/// `f` for `Result::map_err`: any displayable error as exception `E` with its message.
pub fn to<E: pyo3::PyTypeInfo>(e: impl std::fmt::Display) -> PyErr {
    PyErr::new::<E, _>(e.to_string())
}
