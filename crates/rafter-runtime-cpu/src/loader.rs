//! The CPU's executable loader: a program's CPU kernels as one `cpu-kernels` executable.
//!
//! The CPU runs the kernel bodies the program itself carries. Loading picks, per kernel,
//! its native kernel and its tensor-path kernel (see [`crate::dispatch`]), and loads one
//! [`CpuKernels`] executable on the device: an entry point per kernel, then the built-in
//! copy entry ([`COPY_ENTRY`]) that the session's host copies run on. Recording a dispatch
//! encodes its operands into the parameter words [`crate::dispatch::Params`] describes.

use std::sync::{Arc, Mutex};

use rafter_hal::{CommandBufferBuilder, DeviceInfo, DeviceKind, Executable, FORMAT_CPU_KERNELS};
use rafter_hal_cpu::CpuKernels;
use rafter_runtime::{
    hal, CopyEnd, DispatchArgs, ExecutableLoader, HostCopy, LoadRequest, LoadedKernels,
    NativeStats, Result, RuntimeError,
};

use crate::dispatch::{KernelShared, Operand, Params, COPY_ENTRY};
#[cfg(feature = "interpreter")]
use crate::fallback::{self, TensorKernel};
use crate::native::{self, NativeKernel};
use crate::section::check_section;

/// Loads kernels on a CPU device ([`DeviceKind::Cpu`]), format [`FORMAT_CPU_KERNELS`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuLoader;

impl ExecutableLoader for CpuLoader {
    fn name(&self) -> &str {
        FORMAT_CPU_KERNELS
    }

    fn serves(&self, device: &DeviceInfo) -> bool {
        device.kind == DeviceKind::Cpu
    }

    fn load(&self, req: &LoadRequest<'_>) -> Result<Arc<dyn LoadedKernels>> {
        let program = req.program;
        if let Some(section) = req.section {
            check_section(req, section)?;
        }
        let n = program.kernels.len();
        #[cfg_attr(not(feature = "interpreter"), allow(unused_variables))]
        let (natives, tensor_kernels) = choose_kernels(req)?;
        let native_kernels = natives.iter().filter(|n| n.is_some()).count();
        let shared = Arc::new(KernelShared {
            program: program.clone(),
            symbols: req.symbols.to_vec(),
            #[cfg(feature = "interpreter")]
            tensor_kernels,
            native: natives,
            native_stats: Arc::new(native::Stats::default()),
            registry: req.calls.clone(),
            dims: (0..n).map(|_| Mutex::new(None)).collect(),
        });

        // One executable: an entry per kernel, then the copy entry.
        let mut entry: Vec<Option<usize>> = vec![None; n];
        let mut names: Vec<String> = Vec::with_capacity(req.kernels.len() + 1);
        let mut kernels = CpuKernels::new();
        for &k in req.kernels {
            let mut name = program.kernels[k].name.clone();
            if names.contains(&name) || name == COPY_ENTRY {
                name = format!("{name}#{k}");
            }
            entry[k] = Some(names.len());
            names.push(name.clone());
            let shared = shared.clone();
            kernels = kernels.with_entry(name, move |ctx| shared.run_kernel(k, ctx));
        }
        let copy_entry = names.len();
        let copy_shared = shared.clone();
        kernels = kernels.with_entry(COPY_ENTRY, move |ctx| copy_shared.run_copy(ctx));
        let exe_name = if program.name.is_empty() {
            "program".to_string()
        } else {
            program.name.clone()
        };
        let executable = req
            .device
            .load_executable(&kernels.into_spec(exe_name))
            .map_err(hal(format!(
                "loading kernels on device `{}`",
                req.device_name
            )))?;
        Ok(Arc::new(CpuProgram {
            program: program.name.clone(),
            executable,
            entry,
            copy_entry,
            shared,
            native_kernels,
            serial: serial_commands(req.options),
        }))
    }
}

/// Whether a program's dispatches should run one after another rather than side by side
/// where independent: when the kernels split their own work over more than one kernel
/// thread. Two dispatches side by side cannot both have the kernel threads (the pool runs
/// one job at a time; the other kernel runs on its command worker alone), so they put
/// more busy threads than cores on the machine and the split kernel waits for its
/// preempted tasks. Measured on a 2-core Zen 4 (two alternated runs each, side by side ->
/// one after another): Qwen3-0.6B-shaped q4_0 decode 48.1-50.2 -> 52.3-53.3 tok/s, prefill
/// 280-304 -> 308-346 tok/s; MobileNetV2 4.9-5.6 -> 4.7-4.8 ms, MiniLM 17.5 -> 17.0 ms,
/// ResNet-50 37.1-37.2 -> 36.6-37.0 ms. With one kernel thread, side by side is the only
/// parallelism there is, and stays.
fn serial_commands(options: &rafter_runtime::KernelOptions) -> bool {
    threads(options) > 1
}

/// Per program kernel: its native kernel, if one covers its body.
type Natives = Vec<Option<Arc<dyn NativeKernel>>>;

/// The native kernels' precision for products with float weights.
fn precision(options: &rafter_runtime::KernelOptions) -> rafter_kernels_cpu::MatmulPrecision {
    match options.matmul_precision {
        rafter_runtime::MatmulPrecision::F32 => rafter_kernels_cpu::MatmulPrecision::F32,
        rafter_runtime::MatmulPrecision::Bf16 => rafter_kernels_cpu::MatmulPrecision::Bf16,
    }
}

/// The threads a kernel may use (0: one per available core).
fn threads(options: &rafter_runtime::KernelOptions) -> usize {
    match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    }
}

/// Per kernel on the device: the caller's host kernel, else the native kernel and the
/// tensor path's accelerated kernel (neither with `reference_only`).
#[cfg(feature = "interpreter")]
fn choose_kernels(req: &LoadRequest<'_>) -> Result<(Natives, Vec<Option<TensorKernel>>)> {
    let program = req.program;
    let n = program.kernels.len();
    let mut tensor_kernels: Vec<Option<TensorKernel>> = vec![None; n];
    let mut natives: Natives = vec![None; n];
    for (name, f) in &req.options.host_kernels {
        if let Some(&k) = req
            .kernels
            .iter()
            .find(|&&k| program.kernels[k].name == *name)
        {
            tensor_kernels[k] = Some(fallback::host(f.clone()));
        }
    }
    if !req.options.reference_only {
        let pool = native::pool(threads(req.options));
        for &k in req.kernels {
            if tensor_kernels[k].is_none() {
                let body = &program.kernels[k].body;
                natives[k] = native::select(body, &pool, precision(req.options));
                tensor_kernels[k] = fallback::select(body, &pool);
            }
        }
    }
    Ok((natives, tensor_kernels))
}

/// Without the interpreter every kernel needs a native kernel: one without is refused
/// here, by name, as are the options only the interpreter serves.
#[cfg(not(feature = "interpreter"))]
fn choose_kernels(req: &LoadRequest<'_>) -> Result<(Natives, ())> {
    let program = req.program;
    if req.options.reference_only || !req.options.host_kernels.is_empty() {
        return Err(req.unsupported(
            "reference kernels and host kernels need the interpreter (rafter-runtime-cpu's \
             `interpreter` feature), which this build leaves out",
        ));
    }
    let pool = native::pool(threads(req.options));
    let mut natives: Natives = vec![None; program.kernels.len()];
    for &k in req.kernels {
        let kernel = &program.kernels[k];
        natives[k] = native::select(&kernel.body, &pool, precision(req.options));
        if natives[k].is_none() {
            let ops: Vec<&str> = kernel.body.nodes.iter().map(|n| n.op.name()).collect();
            return Err(req.unsupported(format!(
                "kernel {k} `{}` ({}) has no native CPU kernel, and this build has no \
                 interpreter (rafter-runtime-cpu's `interpreter` feature)",
                kernel.name,
                ops.join(", ")
            )));
        }
    }
    Ok((natives, ()))
}

/// A program's kernels loaded on one CPU device.
struct CpuProgram {
    /// The program's name, for errors.
    program: String,
    executable: Executable,
    /// Per program kernel: its entry point, if it runs on this device.
    entry: Vec<Option<usize>>,
    copy_entry: usize,
    shared: Arc<KernelShared>,
    native_kernels: usize,
    /// Whether the session's dispatches run one after another (see [`serial_commands`]).
    serial: bool,
}

impl CpuProgram {
    fn record(
        &self,
        builder: &mut CommandBufferBuilder,
        entry: usize,
        bound: &[rafter_hal::BufferRange],
        params: &Params,
        step: usize,
    ) -> Result<()> {
        builder
            .dispatch(&self.executable, entry, bound, &params.encode(), [1, 1, 1])
            .map_err(hal(format!("call {}: step {step}", params.call)))?;
        Ok(())
    }
}

impl LoadedKernels for CpuProgram {
    fn record_dispatch(
        &self,
        builder: &mut CommandBufferBuilder,
        d: &DispatchArgs<'_>,
    ) -> Result<()> {
        let entry = self.entry.get(d.kernel).copied().flatten().ok_or_else(|| {
            RuntimeError::Unsupported {
                program: self.program.clone(),
                msg: format!(
                    "step {}: kernel {} is not loaded on this CPU device",
                    d.step, d.kernel
                ),
            }
        })?;
        let mut bound = Vec::new();
        let operands = d
            .operands
            .iter()
            .map(|o| match o {
                rafter_runtime::Operand::Memory(range) => {
                    bound.push(range.clone());
                    Operand::Binding(bound.len() - 1)
                }
                rafter_runtime::Operand::Weight { index, .. } => Operand::Weight(*index),
                rafter_runtime::Operand::Slot(b) => Operand::Slot(*b),
                rafter_runtime::Operand::Absent => Operand::Absent,
            })
            .collect();
        let params = Params {
            call: d.call,
            symbols_at_run: d.symbols_at_run,
            symbols: if d.symbols_at_run {
                Vec::new()
            } else {
                d.symbol_values.to_vec()
            },
            operands,
            extra: Vec::new(),
        };
        self.record(builder, entry, &bound, &params, d.step)
    }

    fn record_host_copy(
        &self,
        builder: &mut CommandBufferBuilder,
        copy: &HostCopy<'_>,
    ) -> Result<()> {
        let mut bound = Vec::new();
        let mut operand = |end: &CopyEnd| match end {
            CopyEnd::Memory(range) => {
                bound.push(range.clone());
                Operand::Binding(bound.len() - 1)
            }
            CopyEnd::Weight(w) => Operand::Weight(*w),
            CopyEnd::Slot(b) => Operand::Slot(*b),
            CopyEnd::Foreign(i) => Operand::Foreign(*i),
        };
        let operands = vec![operand(&copy.src), operand(&copy.dst)];
        let mut extra = vec![copy.buffer as u64];
        if let Some(dims) = copy.dims {
            extra.extend(dims.iter().map(|&x| x as u64));
        }
        // The copy entry reads no symbols: the source's dims travel in `extra`.
        let params = Params {
            call: copy.call,
            symbols_at_run: false,
            symbols: Vec::new(),
            operands,
            extra,
        };
        self.record(builder, self.copy_entry, &bound, &params, copy.step)
    }

    fn native_stats(&self) -> Option<NativeStats> {
        Some(self.shared.native_stats.snapshot(self.native_kernels))
    }

    fn serial(&self) -> bool {
        self.serial
    }
}
