//! rafter's compiler: [`Graph`] in, [`Program`] out.
//!
//! ```text
//! Graph ──optimize──► Graph ──partition──► groups ──lower──► Program ──plan_memory──► Program
//!        (dce, fold,            (fusion)              (buffers,          (liveness, in-place,
//!         cse, canon)                                  kernels, steps)    arena offsets)
//! ```
//!
//! - [`passes`]: graph-to-graph passes ([`passes::dce`], [`passes::fold_constants`],
//!   [`passes::cse`], [`passes::canonicalize`]), each type-preserving and verified;
//! - [`fusion`]: groups ops into kernels (elementwise chains, contraction epilogues,
//!   reduction prologues);
//! - [`layout`]: CPU convolutions to channels-last (`conv_nhwc`), the layout flowing
//!   through the elementwise ops between them ([`layout::channels_last`]);
//! - [`lower()`]: partition + lowering to a [`Program`], without memory planning;
//! - [`backend`]: the [`Backend`] trait a device's code generator implements (which kernels
//!   it supports and why not, its section of the artifact), the host's [`CpuBackend`], and
//!   the [`Target`] (the host plus accelerator backends);
//! - [`place`]: device placement for a target with accelerators (a kernel on the first
//!   accelerator that supports it, CPU fallback, copies at device changes), then
//!   [`schedule::schedule_for_overlap`] (CPU work ordered by when the GPU needs it);
//! - [`partition`]: cost-model placement (`--target auto`, `--target cpu,vulkan`): device
//!   descriptions and profiles, the cost model, and the partitioner searching placements;
//! - [`prepack`]: weights read only as a CPU matmul's B stored pre-packed in the GEMM's
//!   panel layout, with an unpacking prologue in the kernel body
//!   ([`prepack::prepack_weights`]);
//! - [`memplan`]: static memory planning ([`memplan::plan_memory`]: offsets in one arena per
//!   device and memory kind, sized at the declared bounds; [`memplan::memory_report`]);
//! - [`compile()`]: all of the above.
//!
//! `rafter-compiler` runs this together with each device backend's code generation and
//! writes the artifact: that is the entry point for the command line and other frontends.

pub mod backend;
mod error;
pub mod fusion;
pub mod layout;
pub mod lower;
pub mod memplan;
pub mod partition;
pub mod passes;
pub mod place;
pub mod prepack;
pub mod schedule;
pub mod symbol_defs;
mod util;
pub mod widen;

pub use backend::{Backend, CpuBackend, Section, Target};
pub use error::CompileError;
pub use lower::{lower, LowerOptions};
pub use widen::widen_half;

use rafter_ir::program::Program;
use rafter_ir::{Dim, Graph, Symbol};

/// Options of [`compile`].
#[derive(Clone, Debug, Default)]
pub struct CompileOptions {
    pub target: Target,
    /// Declared upper bounds of symbols (`--dim seq<=2048`), for static memory planning.
    pub bounds: Vec<(Symbol, i64)>,
    /// Declared upper bounds of sums of symbols (`--dim 'past+seq<=4096'`); each of their
    /// symbols must also be in `bounds` (see [`rafter_ir::program::Program::dim_bounds`]).
    pub dim_bounds: Vec<(Dim, i64)>,
    /// How the CPU target stores the weights of matrix products (`--cpu-weights`).
    pub cpu_weights: prepack::WeightFormat,
    /// How the CPU target computes in half precision.
    pub half_compute: HalfCompute,
}

/// How the CPU target runs half-precision (f16, bf16) compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HalfCompute {
    /// In f32, half values cast where they enter and leave a chain of computing nodes
    /// ([`widen::widen_half`]), as ONNX Runtime's CPU provider runs f16 models: the CPU's
    /// kernels compute in f32, and the reference executor's half-precision path is
    /// 20-40x slower.
    #[default]
    F32,
    /// As the graph has it: for graphs whose half-precision operands the CPU kernels read
    /// natively (the LLM decoder's f16 weights and KV cache, which widening would double
    /// in memory and in bytes per token).
    AsIs,
}

/// A graph pass: rewrites in place, returns whether it changed anything.
pub type Pass = fn(&mut Graph) -> bool;

/// The pipeline [`optimize`] runs each round, with the names errors report.
pub const PIPELINE: [(&str, Pass); 5] = [
    ("dce", passes::dce),
    ("fold_constants", passes::fold_constants),
    ("cse", passes::cse),
    ("canonicalize", passes::canonicalize),
    ("shapes_from_inputs", passes::shapes_from_inputs),
];

/// Most rounds of the pass pipeline (each round is DCE, folding, CSE, canonicalisation).
const MAX_ROUNDS: usize = 8;

/// Runs the graph passes to a fixed point (at most a few rounds), verifying the graph
/// after every pass.
pub fn optimize(g: &mut Graph) -> Result<(), CompileError> {
    let check = |g: &Graph, pass: &'static str| {
        rafter_ir::verify(g).map_err(|source| CompileError::Verify { pass, source })
    };
    check(g, "input")?;
    for _ in 0..MAX_ROUNDS {
        let mut changed = false;
        for (name, pass) in PIPELINE {
            changed |= pass(g);
            check(g, name)?;
        }
        if !changed {
            break;
        }
    }
    Ok(())
}

/// A stage of [`compile`], reported to [`compile_observed`]'s observer as it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The graph passes ([`optimize`]).
    Optimize,
    /// Fusion and [`lower()`].
    Lower,
    /// [`memplan::plan_memory`] and the final verification.
    PlanMemory,
}

/// Compiles a graph: [`optimize`], fusion and [`lower()`], [`prepack::prepack_weights`],
/// then [`memplan::plan_memory`].
/// The result passes [`Program::verify`].
pub fn compile(graph: &Graph, opts: &CompileOptions) -> Result<Program, CompileError> {
    compile_observed(graph, opts, &mut |_| {})
}

/// [`compile`], calling `observe` as each [`Stage`] starts (a command-line progress bar;
/// compiling a large model takes long enough to want one).
pub fn compile_observed(
    graph: &Graph,
    opts: &CompileOptions,
    observe: &mut dyn FnMut(Stage),
) -> Result<Program, CompileError> {
    observe(Stage::Optimize);
    let mut g = graph.clone();
    optimize(&mut g)?;
    if opts.target.is_cpu_only()
        && opts.half_compute == HalfCompute::F32
        && widen::widen_half(&mut g)
    {
        rafter_ir::verify(&g).map_err(|source| CompileError::Verify {
            pass: "widen_half",
            source,
        })?;
    }
    if opts.target.is_cpu_only() && layout::channels_last(&mut g) {
        rafter_ir::verify(&g).map_err(|source| CompileError::Verify {
            pass: "channels_last",
            source,
        })?;
    }
    observe(Stage::Lower);
    let program = lower(
        &g,
        &LowerOptions {
            target: opts.target.clone(),
            bounds: opts.bounds.clone(),
            dim_bounds: opts.dim_bounds.clone(),
            fuse: true,
        },
    )?;
    // The cost model kept everything on the host: compile for the CPU target instead, so
    // the CPU-only passes (channels-last, pre-packed weights) apply.
    if !opts.target.is_cpu_only() && program.kernels.iter().all(|k| k.device == backend::CPU) {
        let cpu = CompileOptions {
            target: Target::cpu(),
            ..opts.clone()
        };
        if opts.target.placement().strategy == partition::Strategy::CostModel {
            return compile_observed(graph, &cpu, observe);
        }
    }
    let mut program = program;
    // Only for the CPU target: with `--target vulkan`, `rafter plan` explains why each
    // kernel stayed on the CPU from its body, which must still be the body placement saw.
    if opts.target.is_cpu_only() {
        prepack::prepack_weights_as(&mut program, opts.cpu_weights);
    }
    observe(Stage::PlanMemory);
    memplan::plan_memory(&mut program, &memplan::PlanOptions::default())?;
    program.verify()?;
    Ok(program)
}
