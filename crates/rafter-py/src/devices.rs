//! The devices rafter finds, and the set a program needs.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rafter_ir::program::Program;
use rafter_runtime::DeviceSet;

use crate::errors::{to, DeviceError};

/// Whether a program uses the Vulkan device.
fn uses_vulkan(program: &Program) -> bool {
    program.kernels.iter().any(|k| k.device == "vulkan")
        || program.arenas.iter().any(|a| a.device == "vulkan")
}

/// The CPU (with `threads` worker threads, 0: one per core), and the Vulkan device when
/// `program` has work there (an error saying so when it cannot be opened).
pub fn devices_for(program: &Program, threads: usize) -> PyResult<DeviceSet> {
    let cpu = rafter_runtime_cpu::CpuDeviceOptions {
        worker_threads: threads,
        ..Default::default()
    };
    let mut set = rafter_runtime_cpu::devices_with(cpu).map_err(to::<DeviceError>)?;
    if uses_vulkan(program) {
        rafter_runtime_vulkan::add_device(&mut set, Default::default()).map_err(|e| {
            to::<DeviceError>(format!(
                "the model runs kernels on `vulkan`, but the Vulkan device cannot be opened: {e}"
            ))
        })?;
    }
    Ok(set)
}

/// Whether a Vulkan device opens on this machine (for `target="auto"`).
pub fn vulkan_available() -> Result<(), String> {
    let mut set = DeviceSet::new();
    rafter_runtime_vulkan::add_device(&mut set, Default::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The devices rafter can run on here: one dict per device (`name`, `kind`, and for a
/// device that cannot be opened, `error`).
#[pyfunction]
pub fn devices(py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
    let mut out = Vec::new();
    let cpu = PyDict::new(py);
    cpu.set_item("name", "cpu")?;
    cpu.set_item("kind", "cpu")?;
    cpu.set_item("available", true)?;
    cpu.set_item(
        "cores",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    )?;
    out.push(cpu.unbind());
    let vk = PyDict::new(py);
    vk.set_item("name", "vulkan")?;
    vk.set_item("kind", "gpu")?;
    match py.detach(vulkan_available) {
        Ok(()) => vk.set_item("available", true)?,
        Err(e) => {
            vk.set_item("available", false)?;
            vk.set_item("error", e)?;
        }
    }
    out.push(vk.unbind());
    Ok(out)
}
