//! Compiler backends: what a device's code generator offers the compiler.
//!
//! A [`Backend`] says which kernels it can generate code for (and, for the others, why
//! not) and emits its device's executable section of the artifact. The compiler knows no
//! device by name beyond the host CPU: a [`Target`] is the host ([`CpuBackend`], which runs
//! every kernel, the fallback) plus the accelerator backends in preference order, and
//! placement ([`crate::place`]) puts each kernel on the first accelerator that supports it.
//!
//! ```text
//!   Target { accelerators: [vulkan, ...], host: cpu }
//!        │ placement: Backend::supports(kernel body) ─► device, else the host
//!        ▼
//!   Program (kernels on `vulkan` and `cpu`) ─► Backend::emit per device used
//!        ─► executable sections, opaque to the artifact, checked by each device's loader
//! ```
//!
//! The backends live in their device's crates (`rafter-codegen-spirv`'s `SpirvBackend`);
//! `rafter-compiler` holds the registry of targets by name and the one function that runs
//! compile → codegen → artifact.

use std::fmt;
use std::sync::Arc;

use rafter_ir::program::Program;
use rafter_ir::Graph;
use rafter_kernels_cpu::artifact_section::CpuDescriptor;

use crate::partition::PlacementOptions;

/// The host device's name in programs.
pub const CPU: &str = "cpu";

/// An executable section for one device, as a backend emits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// The section's bytes (the device's own format; the artifact does not look inside).
    pub bytes: Vec<u8>,
    /// The alignment the section needs in the file (a power of two: 4 for SPIR-V words).
    pub align: u64,
}

/// A device's code generator, as the compiler sees it.
pub trait Backend: Send + Sync {
    /// The device kernels placed here run on, as programs name it (`vulkan`).
    fn device(&self) -> &str;

    /// Whether this backend generates code for a kernel with body `body`; the error says
    /// briefly why not (`rafter plan` prints it for every kernel left on the host). Only
    /// the body: placement itself checks what any non-host device needs of the buffers.
    fn supports(&self, body: &Graph) -> Result<(), String>;

    /// The device's executable section for the kernels of `program` placed on
    /// [`device`](Backend::device). Errors name the kernel.
    fn emit(&self, program: &Program) -> Result<Section, String>;
}

/// The host CPU's backend: every kernel body is supported (the CPU runtime runs the bodies
/// the program carries, natively where a kernel covers them, else on its interpreter), and
/// the section is a descriptor ([`CpuDescriptor`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn device(&self) -> &str {
        CPU
    }

    fn supports(&self, _body: &Graph) -> Result<(), String> {
        Ok(())
    }

    fn emit(&self, program: &Program) -> Result<Section, String> {
        let kernels = program.kernels.iter().filter(|k| k.device == CPU).count();
        let kernels = u32::try_from(kernels).map_err(|_| format!("{kernels} cpu kernels"))?;
        Ok(Section {
            bytes: CpuDescriptor { kernels }.encode(),
            align: 8,
        })
    }
}

/// The machine a program is compiled for: the host CPU, which runs every kernel no
/// accelerator takes, and accelerator backends in preference order.
#[derive(Clone, Default)]
pub struct Target {
    accelerators: Vec<Arc<dyn Backend>>,
    placement: PlacementOptions,
}

impl Target {
    /// Every kernel on the host CPU.
    pub fn cpu() -> Target {
        Target::default()
    }

    /// This target with `backend` as one more accelerator (after those already there).
    pub fn with(mut self, backend: Arc<dyn Backend>) -> Target {
        self.accelerators.push(backend);
        self
    }

    /// This target placing by `placement` (greedy-by-support unless it says otherwise).
    pub fn with_placement(mut self, placement: PlacementOptions) -> Target {
        self.placement = placement;
        self
    }

    /// How placement chooses devices.
    pub fn placement(&self) -> &PlacementOptions {
        &self.placement
    }

    /// The accelerators, in preference order.
    pub fn accelerators(&self) -> &[Arc<dyn Backend>] {
        &self.accelerators
    }

    /// Whether the host CPU runs everything (the CPU-only passes apply: channels-last
    /// convolutions, pre-packed weights).
    pub fn is_cpu_only(&self) -> bool {
        self.accelerators.is_empty()
    }

    /// The backend that generates code for `device`, the host's included.
    pub fn backend(&self, device: &str) -> Option<&dyn Backend> {
        if device == CPU {
            return Some(&CpuBackend);
        }
        self.accelerators
            .iter()
            .find(|b| b.device() == device)
            .map(|b| b.as_ref())
    }

    /// The target's name on the command line: `cpu`, or the accelerators' devices joined
    /// by `+` (`vulkan`).
    pub fn name(&self) -> String {
        if self.is_cpu_only() {
            return CPU.to_string();
        }
        let names: Vec<&str> = self.accelerators.iter().map(|b| b.device()).collect();
        names.join("+")
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({})", self.name())
    }
}

/// Targets are equal when they place on the same devices in the same order.
impl PartialEq for Target {
    fn eq(&self, other: &Target) -> bool {
        self.name() == other.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend taking kernels whose body is one node of a given op.
    struct OneOp(&'static str, &'static str);

    impl Backend for OneOp {
        fn device(&self) -> &str {
            self.0
        }
        fn supports(&self, body: &Graph) -> Result<(), String> {
            match body.nodes.as_slice() {
                [n] if n.op.name() == self.1 => Ok(()),
                _ => Err(format!("only `{}`", self.1)),
            }
        }
        fn emit(&self, _: &Program) -> Result<Section, String> {
            Ok(Section {
                bytes: vec![1, 2, 3, 4],
                align: 4,
            })
        }
    }

    #[test]
    fn targets_name_their_devices_and_find_their_backends() {
        let cpu = Target::cpu();
        assert!(cpu.is_cpu_only());
        assert_eq!(cpu.name(), "cpu");
        assert_eq!(cpu.backend("cpu").unwrap().device(), "cpu");
        assert!(cpu.backend("npu").is_none());
        let t = Target::cpu()
            .with(Arc::new(OneOp("npu", "matmul")))
            .with(Arc::new(OneOp("gpu", "relu")));
        assert_eq!(t.name(), "npu+gpu");
        assert_eq!(format!("{t:?}"), "Target(npu+gpu)");
        assert_eq!(t.backend("gpu").unwrap().device(), "gpu");
        assert_ne!(t, cpu);
        assert_eq!(Target::default(), cpu);
    }

    #[test]
    fn the_cpu_section_counts_the_cpu_kernels() {
        let g = rafter_ir::text::parse_graph(
            "graph @g(%x: f32[4]) -> (%y) {\n  %y: f32[4] = unary{op = relu}(%x)\n}",
        )
        .unwrap();
        let p = crate::compile(&g, &crate::CompileOptions::default()).unwrap();
        let s = CpuBackend.emit(&p).unwrap();
        let d = CpuDescriptor::decode(&s.bytes, "cpu").unwrap();
        assert_eq!(d.kernels as usize, p.kernels.len());
        assert_eq!(s.align, 8);
    }
}
