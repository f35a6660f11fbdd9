//! The Vulkan device's compiler backend: [`rafter_opt::Backend`] over this crate's
//! generator.

use rafter_ir::program::Program;
use rafter_ir::Graph;
use rafter_opt::{Backend, Section};

use crate::DEVICE;

/// Generates SPIR-V for the kernels placed on [`DEVICE`] (`vulkan`): a kernel is
/// supported when [`crate::supports`] accepts its body, and the section is
/// [`crate::program_section`]'s (the format of `rafter-vulkan-section`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SpirvBackend;

impl Backend for SpirvBackend {
    fn device(&self) -> &str {
        DEVICE
    }

    fn supports(&self, body: &Graph) -> Result<(), String> {
        crate::supports(body)
    }

    fn emit(&self, program: &Program) -> Result<Section, String> {
        let section = crate::program_section(program).map_err(|e| e.to_string())?;
        // SPIR-V is a stream of u32 words.
        Ok(Section {
            bytes: section.encode(),
            align: 4,
        })
    }
}
