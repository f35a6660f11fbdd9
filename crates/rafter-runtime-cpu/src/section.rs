//! The `cpu` executable section of an artifact, checked by the CPU's loader.
//!
//! The CPU runs the kernel bodies the program carries, so its section is only a
//! descriptor ([`CpuDescriptor`]: magic, descriptor version, the number of kernels on the
//! device). The artifact reader leaves device sections to their loaders: this is where a
//! `cpu` section that is malformed or disagrees with the program is refused.

use rafter_kernels_cpu::artifact_section::CpuDescriptor;
use rafter_runtime::{LoadRequest, Result, RuntimeError};

/// Checks `section` against the kernels `req` places on its device.
pub(crate) fn check_section(req: &LoadRequest<'_>, section: &[u8]) -> Result<()> {
    let d = CpuDescriptor::decode(section, req.device_name)
        .map_err(|e| RuntimeError::Artifact(e.to_string()))?;
    if d.kernels as usize != req.kernels.len() {
        return Err(RuntimeError::Artifact(format!(
            "executable `{}`: the descriptor says {} kernels, the program has {} on `{}`",
            req.device_name,
            d.kernels,
            req.kernels.len(),
            req.device_name
        )));
    }
    Ok(())
}
