//! The SPIR-V loader: an artifact's `vulkan` section on a Vulkan device.

use std::sync::Arc;

use bytes::Bytes;

use rafter_hal::{
    BufferRange, CommandBufferBuilder, Device, DeviceInfo, DeviceKind, Executable,
    ExecutablePayload, ExecutableSpec, HalError, FORMAT_SPIRV,
};
use rafter_ir::program::Program;
use rafter_runtime::{
    hal, DispatchArgs, ExecutableLoader, LoadRequest, LoadedKernels, Operand, Result, RuntimeError,
};
use rafter_vulkan_section::{DimParam, Launch, VulkanModule, VulkanSection};

/// Loads kernels on a Vulkan device ([`DeviceKind::Vulkan`]) from the program's `vulkan`
/// executable section, one SPIR-V module per kernel.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpirvLoader;

/// A kernel's module, loaded.
struct GpuKernel {
    /// The kernel's name, for errors.
    name: String,
    /// How many of a dispatch's operands are body inputs (the rest are results).
    inputs: usize,
    executable: Executable,
    entry: usize,
    workgroup_size: u32,
    launch: Launch,
    /// Sizes pushed after the launch's params (the module's dim params).
    dims: Vec<DimParam>,
}

impl ExecutableLoader for SpirvLoader {
    fn name(&self) -> &str {
        FORMAT_SPIRV
    }

    fn serves(&self, device: &DeviceInfo) -> bool {
        device.kind == DeviceKind::Vulkan
    }

    fn load(&self, req: &LoadRequest<'_>) -> Result<Arc<dyn LoadedKernels>> {
        let program = req.program;
        let mut kernels: Vec<Option<GpuKernel>> =
            (0..program.kernels.len()).map(|_| None).collect();
        if let Some(&first) = req.kernels.first() {
            let code = req.section.ok_or_else(|| {
                req.unsupported(format!(
                    "kernel `{}` runs on device `{}`, but no `{}` executable section was \
                     given (compile to an artifact with `--target {}`)",
                    program.kernels[first].name, req.device_name, req.device_name, req.device_name
                ))
            })?;
            let section = decode(program, req.device_name, code)?;
            for &k in req.kernels {
                kernels[k] = Some(load_kernel(req, &section, k)?);
            }
        }
        Ok(Arc::new(SpirvProgram {
            program: program.name.clone(),
            device: req.device.clone(),
            device_name: req.device_name.to_string(),
            kernels,
        }))
    }
}

/// The section, decoded and checked against the program (see [`VulkanSection::check`]).
fn decode(program: &Program, device: &str, code: &Bytes) -> Result<VulkanSection> {
    let artifact = |e: rafter_vulkan_section::SectionError| RuntimeError::Artifact(e.to_string());
    let section = VulkanSection::decode(code).map_err(artifact)?;
    section.check(program, device).map_err(artifact)?;
    Ok(section)
}

fn load_kernel(req: &LoadRequest<'_>, section: &VulkanSection, k: usize) -> Result<GpuKernel> {
    let kernel = &req.program.kernels[k];
    let module = section.module(k).ok_or_else(|| {
        req.unsupported(format!(
            "kernel {k} `{}` runs on `{}` but its executable section has no module for it",
            kernel.name, req.device_name
        ))
    })?;
    let context = format!("loading kernel `{}` on `{}`", kernel.name, req.device_name);
    let executable =
        load_spirv(req.device.as_ref(), &kernel.name, module).map_err(hal(context.clone()))?;
    let entry = executable
        .entry_index(&module.entry_point)
        .map_err(hal(context))?;
    Ok(GpuKernel {
        name: kernel.name.clone(),
        inputs: kernel.body.inputs.len(),
        executable,
        entry,
        workgroup_size: module.workgroup_size,
        launch: module.launch,
        dims: module.dims.clone(),
    })
}

/// Loads a kernel's SPIR-V: its cooperative-matrix variant where it has one and the
/// device takes it, else the plain module. A device without what the variant needs
/// refuses it as unsupported before the driver sees it, so only that error falls back.
fn load_spirv(
    device: &dyn Device,
    name: &str,
    module: &VulkanModule,
) -> rafter_hal::Result<Executable> {
    let spec = |bytes: &[u8]| ExecutableSpec {
        name: name.to_string(),
        format: FORMAT_SPIRV.to_string(),
        payload: ExecutablePayload::Bytes(Arc::from(bytes)),
    };
    if let Some(coop) = &module.coop {
        match device.load_executable(&spec(coop)) {
            Err(HalError::Unsupported(_)) => {}
            loaded => return loaded,
        }
    }
    device.load_executable(&spec(&module.spirv))
}

/// A program's kernels loaded on one Vulkan device.
struct SpirvProgram {
    program: String,
    device: Arc<dyn Device>,
    device_name: String,
    /// Per program kernel: its module, if it runs on this device.
    kernels: Vec<Option<GpuKernel>>,
}

impl SpirvProgram {
    fn unsupported(&self, msg: String) -> RuntimeError {
        RuntimeError::Unsupported {
            program: self.program.clone(),
            msg,
        }
    }
}

impl LoadedKernels for SpirvProgram {
    /// Binds the operands' ranges (their device addresses go in the push constants, the
    /// HAL's ABI), then pushes the launch's params and the module's dim params, sized from
    /// the call's dims of every binding.
    fn record_dispatch(
        &self,
        builder: &mut CommandBufferBuilder,
        d: &DispatchArgs<'_>,
    ) -> Result<()> {
        let si = d.step;
        let gpu = self
            .kernels
            .get(d.kernel)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                self.unsupported(format!(
                    "step {si}: kernel {} is not loaded on `{}`",
                    d.kernel, self.device_name
                ))
            })?;
        let name = &gpu.name;
        let bound: Vec<BufferRange> = d
            .operands
            .iter()
            .map(|o| match o {
                Operand::Memory(range) | Operand::Weight { buffer: range, .. } => Ok(range.clone()),
                Operand::Slot(b) => Err(self.unsupported(format!(
                    "step {si}: kernel `{name}` on `{}` reads host slot {b}",
                    self.device_name
                ))),
                Operand::Absent => Err(self.unsupported(format!(
                    "step {si}: kernel `{name}` on `{}` has an unbound result",
                    self.device_name
                ))),
            })
            .collect::<Result<_>>()?;
        // The launch sizes its dispatch from the inputs' and the first result's dims
        // (`Launch::dispatch`); the dim params name axes of any binding.
        let dim_bytes = rafter_vulkan_section::dim_params(&gpu.dims, d.dims)
            .map_err(|e| self.unsupported(format!("step {si}: kernel `{name}`: {e}")))?;
        let (input_dims, result_dims) = d.dims.split_at(gpu.inputs.min(d.dims.len()));
        let first_output = result_dims.first().copied().unwrap_or(&[]);
        let max = self.device.info().limits.max_workgroup_count;
        let launched = gpu
            .launch
            .dispatch(input_dims, first_output, gpu.workgroup_size, max)
            .map_err(|e| {
                self.unsupported(format!(
                    "step {si}: kernel `{name}` on `{}`: {e}",
                    self.device_name
                ))
            })?;
        if let Some((mut params, grid)) = launched {
            params.extend_from_slice(&dim_bytes);
            builder
                .dispatch(&gpu.executable, gpu.entry, &bound, &params, grid)
                .map_err(hal(format!("call {}: step {si}", d.call)))?;
        }
        Ok(())
    }

    fn serial(&self) -> bool {
        // Measured on the H100 (BERT-base, f32): letting independent dispatches overlap (a
        // transpose beside the next projection) took 9.4 ms a call, a barrier between every
        // pair 8.1 ms; ResNet-50 and MobileNetV2 are chains, barriered either way.
        true
    }
}
