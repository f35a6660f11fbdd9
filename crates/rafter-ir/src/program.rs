//! The kernel level of the IR: fused kernels and the host program that dispatches them.
//!
//! The compiler (`rafter-opt`) lowers a [`Graph`] to a [`Program`]; the artifact stores it;
//! the runtime executes it. A program is deliberately flat:
//! - **buffers**: every tensor that crosses a kernel boundary (inputs, outputs, weights,
//!   intermediates), each with a type and a [`Storage`] saying where it lives;
//! - **kernels**: fused groups of graph ops (a contraction with its bias/activation/residual
//!   epilogue, a chain of elementwise ops, a reduction with its elementwise prologue, ...),
//!   each with a small [`Graph`] as its body — the body's inputs are the kernel's operands,
//!   its outputs the kernel's results — and the device it runs on;
//! - **steps**: the host program, in order: dispatch a kernel over buffers, copy a buffer.
//!
//! Dims are polynomials over the program's input symbols. A symbol that inputs do not bind
//! (a size that depends on tensor *values*, such as NonZero's output) makes a buffer
//! [`Storage::Dynamic`]: its producer sizes it when it runs.

use crate::{ConstData, Graph, Symbol, TensorType};

/// A named, typed program input or output.
#[derive(Clone, Debug, PartialEq)]
pub struct Port {
    pub name: String,
    pub ty: TensorType,
}

/// Where a buffer's bytes live during a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// The caller's input `i` (read-only).
    Input(usize),
    /// The caller's output `i`, allocated per call.
    Output(usize),
    /// `Program::weights[i]` (read-only, memory-mapped from the artifact).
    Weight(usize),
    /// A slice of arena `arena`. `offset` is fixed at compile time when every symbol in the
    /// buffer's dims has a declared bound (the buffer is planned at its largest size, and
    /// lies within the arena's `size`); otherwise it is `None` and the runtime places the
    /// buffer per call, above the arena's planned `size`, from the program's liveness, with
    /// the same placement ([`crate::arena`]). Buffers may share bytes at different steps, and
    /// at one step when a kernel writes its result in place of an operand it reads last.
    Arena { arena: usize, offset: Option<u64> },
    /// Sized by its producer at run time (data-dependent dims); lives in host memory.
    Dynamic,
}

/// One tensor that crosses a kernel boundary.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferDecl {
    /// The source value's name (for traces and errors).
    pub name: String,
    pub ty: TensorType,
    pub storage: Storage,
}

/// One block of memory on one device, shared by buffers whose lifetimes do not overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arena {
    /// The device it lives on (`cpu`, `vulkan`).
    pub device: String,
    /// Memory kind keyword (`device_local`, `host_visible_shared`, `host`).
    pub memory: String,
    /// Bytes needed, planned against the declared bounds; `None` when planned per call.
    pub size: Option<u64>,
    /// The largest total size of buffers live at once (the bound no plan can beat), for the
    /// same bounds; `None` when planned per call.
    pub lower_bound: Option<u64>,
}

/// What a kernel mostly does: the class decides how a backend generates it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A matmul or convolution, possibly with a fused elementwise epilogue.
    Contraction,
    /// Elementwise ops with broadcasting only.
    Elementwise,
    /// A reduction (or softmax/normalisation), possibly with an elementwise prologue.
    Reduction,
    /// Transpose, gather, concat, slice, pad and other data movement.
    DataMovement,
    /// Anything else, run op by op (control flow, data-dependent shapes, rare ops).
    Opaque,
}

impl KernelKind {
    /// The class of a single op. Lives here, with the program types, because both the
    /// compiler (fusion, the memory planner's in-place rule) and the runtime (which kernels
    /// may have a result bound over an operand) must agree on it.
    pub fn of(op: &crate::Op) -> KernelKind {
        use crate::Op::*;
        match op {
            Identity
            | Unary { .. }
            | Binary { .. }
            | Where
            | Clip
            | Cast { .. }
            | LeakyRelu { .. }
            | Elu { .. }
            | Selu { .. }
            | Celu { .. }
            | HardSigmoid { .. }
            | ThresholdedRelu { .. }
            | Shrink { .. }
            | Gelu { .. }
            | IsInf { .. } => KernelKind::Elementwise,
            MatMul
            | Gemm { .. }
            | Conv { .. }
            | ConvNhwc { .. }
            | ConvTranspose { .. }
            | Einsum { .. }
            | MatMulInteger
            | ConvInteger { .. }
            | Linear { .. }
            | MoeFfn { .. } => KernelKind::Contraction,
            Reduce { .. }
            | ArgReduce { .. }
            | Cumulative { .. }
            | Softmax { .. }
            | LayerNorm { .. }
            | RmsNorm { .. }
            | GroupNorm { .. }
            | InstanceNorm { .. }
            | BatchNorm { .. }
            | LpNorm { .. }
            | Lrn { .. }
            | MeanVarianceNorm { .. }
            | Pool { .. }
            | GlobalPool { .. } => KernelKind::Reduction,
            Reshape { .. }
            | Shape { .. }
            | Size
            | Transpose { .. }
            | Squeeze { .. }
            | Unsqueeze { .. }
            | Flatten { .. }
            | Concat { .. }
            | Split { .. }
            | Slice
            | Gather { .. }
            | Embedding { .. }
            | GatherElements { .. }
            | GatherNd { .. }
            | ScatterElements { .. }
            | ScatterNd { .. }
            | Expand
            | Tile
            | Pad { .. }
            | ConstantOfShape { .. }
            | Range
            | OneHot { .. }
            | Trilu { .. }
            | ReverseSequence { .. }
            | DepthToSpace { .. }
            | SpaceToDepth { .. }
            | EyeLike { .. }
            | Resize { .. } => KernelKind::DataMovement,
            _ => KernelKind::Opaque,
        }
    }

    pub const ALL: [KernelKind; 5] = [
        KernelKind::Contraction,
        KernelKind::Elementwise,
        KernelKind::Reduction,
        KernelKind::DataMovement,
        KernelKind::Opaque,
    ];

    pub fn word(self) -> &'static str {
        match self {
            KernelKind::Contraction => "contraction",
            KernelKind::Elementwise => "elementwise",
            KernelKind::Reduction => "reduction",
            KernelKind::DataMovement => "data_movement",
            KernelKind::Opaque => "opaque",
        }
    }

    pub fn from_word(w: &str) -> Option<KernelKind> {
        KernelKind::ALL.into_iter().find(|k| k.word() == w)
    }
}

/// `conv_nhwc`s of at most this many input channels (an RGB stem) are computed directly on
/// the CPU (`rafter_kernels_cpu::small_conv_nhwc`), not as a GEMM: `rafter_opt` keeps their
/// weight raw and lets them read an NCHW input in place, and the CPU runtime picks that
/// kernel for them, so all three must agree on the bound.
pub const SMALL_CONV_MAX_CIN: i64 = 4;

/// What a `conv_nhwc` is to a fused channels-last depthwise block: `rafter_opt::fusion`
/// forms the block and the CPU runtime's block kernel runs it, so both must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockConv {
    /// 1×1, stride 1, no padding, one group: a GEMM over pixels.
    Pointwise,
    /// One input and one output channel per group.
    Depthwise,
    /// One group of at most [`SMALL_CONV_MAX_CIN`] input channels, not a pointwise one: an
    /// image's stem, computed directly; only ever a block's first stage, whose rows the
    /// block computes a band at a time so that its map never goes to memory.
    Stem,
}

impl BlockConv {
    /// `op` with weight dims `[kh, kw, C/group, M]`, if it is a `conv_nhwc` of either kind
    /// without dilation whose `kernel_shape` (when given) is the weight's window.
    pub fn of(op: &crate::Op, [kh, kw, cg, m]: [i64; 4]) -> Option<BlockConv> {
        let crate::Op::ConvNhwc {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } = op
        else {
            return None;
        };
        let window_ok = kernel_shape.is_empty() || kernel_shape[..] == [kh, kw];
        if !window_ok || !dilations.iter().all(|&d| d == 1) {
            return None;
        }
        let pointwise = [kh, kw] == [1, 1]
            && *group == 1
            && strides.iter().all(|&s| s == 1)
            && pads.iter().all(|&p| p == 0)
            && matches!(auto_pad, crate::AutoPad::NotSet | crate::AutoPad::Valid);
        if pointwise {
            return Some(BlockConv::Pointwise);
        }
        if *group == 1 && (1..=SMALL_CONV_MAX_CIN).contains(&cg) {
            return Some(BlockConv::Stem);
        }
        (cg == 1 && *group > 1 && *group == m).then_some(BlockConv::Depthwise)
    }
}

/// A fused group of graph ops, run as one dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub kind: KernelKind,
    /// The device that runs it (`cpu`, `vulkan`).
    pub device: String,
    /// Inputs: the kernel's operands in order; outputs: its results in order. Its dims may
    /// name the program's symbols; the runtime passes their values with each dispatch.
    pub body: Graph,
}

impl Kernel {
    /// The operand whose bytes the kernel's one result repeats unchanged, if the kernel is
    /// a single reshape, flatten, squeeze, unsqueeze or identity of that operand: row-major
    /// tensors keep their bytes under a change of dims. The memory planner may then place
    /// the result over the operand, and the runtime skips the dispatch (its bytes are
    /// already there); other operands (a reshape's target shape) only name dims.
    pub fn viewed_operand(&self) -> Option<usize> {
        use crate::Op;
        let [node] = self.body.nodes.as_slice() else {
            return None;
        };
        let is_view = matches!(
            node.op,
            Op::Reshape { .. }
                | Op::Flatten { .. }
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
                | Op::Identity
        );
        let data = node.input(0)?;
        let result = (*node.outputs.first()?)?;
        let same_type = self.body.value(data).ty.dtype == self.body.value(result).ty.dtype;
        if !is_view || !same_type || self.body.outputs != [result] {
            return None;
        }
        self.body.inputs.iter().position(|&v| v == data)
    }
}

/// One step of the host program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Runs `kernel` reading `args` and writing `results` (buffer indices, one per body input
    /// and output; `None` for an unused optional result).
    Dispatch {
        kernel: usize,
        args: Vec<usize>,
        results: Vec<Option<usize>>,
    },
    /// Copies buffer `src` into buffer `dst` (same type): graph outputs that are inputs or
    /// weights, and device changes.
    Copy { src: usize, dst: usize },
}

impl Step {
    /// Buffers the step reads.
    pub fn reads(&self) -> Vec<usize> {
        match self {
            Step::Dispatch { args, .. } => args.clone(),
            Step::Copy { src, .. } => vec![*src],
        }
    }

    /// Buffers the step writes.
    pub fn writes(&self) -> Vec<usize> {
        match self {
            Step::Dispatch { results, .. } => results.iter().flatten().copied().collect(),
            Step::Copy { dst, .. } => vec![*dst],
        }
    }
}

/// A compiled model: what the artifact stores and the runtime runs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub name: String,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
    /// Declared upper bounds of symbols (`--dim seq<=2048`), used for static planning.
    pub bounds: Vec<(Symbol, i64)>,
    /// Constant tensors read by kernels (weights), in buffer order of `Storage::Weight`.
    pub weights: Vec<ConstData>,
    pub buffers: Vec<BufferDecl>,
    pub arenas: Vec<Arena>,
    pub kernels: Vec<Kernel>,
    pub steps: Vec<Step>,
}

/// What is wrong with a program, naming the step, kernel or buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("program `{program}`: {msg}")]
pub struct ProgramError {
    pub program: String,
    pub msg: String,
}

impl Program {
    /// Whether `step` dispatches a reshape-like kernel ([`Kernel::viewed_operand`]) whose
    /// result the memory plan placed at its operand's offset in the same arena: its bytes
    /// are already there, so the runtime records no dispatch for it and `rafter plan` says
    /// so. (Buffers placed per call never qualify: live together, they get disjoint bytes.)
    pub fn is_placed_view(&self, step: &Step) -> bool {
        let Step::Dispatch {
            kernel,
            args,
            results,
        } = step
        else {
            return false;
        };
        let placed = |b: usize| match self.buffers.get(b).map(|d| &d.storage) {
            Some(Storage::Arena {
                arena,
                offset: Some(o),
            }) => Some((*arena, *o)),
            _ => None,
        };
        let Some(a) = self.kernels.get(*kernel).and_then(Kernel::viewed_operand) else {
            return false;
        };
        let (Some(&src), Some(&Some(dst))) = (args.get(a), results.first()) else {
            return false;
        };
        placed(src).is_some() && placed(src) == placed(dst)
    }

    /// Checks every index, arity and type, and that each buffer is written before it is
    /// read (inputs and weights count as written). The runtime runs this on every program it
    /// loads, so a hostile artifact cannot make it index out of bounds.
    pub fn verify(&self) -> Result<(), ProgramError> {
        let err = |msg: String| ProgramError {
            program: self.name.clone(),
            msg,
        };
        let nb = self.buffers.len();
        let mut written = vec![false; nb];
        let mut outputs_seen = vec![false; self.outputs.len()];
        for (i, b) in self.buffers.iter().enumerate() {
            match &b.storage {
                Storage::Input(k) => {
                    let port = self.inputs.get(*k).ok_or_else(|| {
                        err(format!(
                            "buffer {i} `{}` is input {k}, but there are {} inputs",
                            b.name,
                            self.inputs.len()
                        ))
                    })?;
                    if port.ty != b.ty {
                        return Err(err(format!(
                            "buffer {i} `{}` has type {} but input {k} is {}",
                            b.name, b.ty, port.ty
                        )));
                    }
                    written[i] = true;
                }
                Storage::Output(k) => {
                    let port = self.outputs.get(*k).ok_or_else(|| {
                        err(format!(
                            "buffer {i} `{}` is output {k}, but there are {} outputs",
                            b.name,
                            self.outputs.len()
                        ))
                    })?;
                    if port.ty.dtype != b.ty.dtype || port.ty.rank() != b.ty.rank() {
                        return Err(err(format!(
                            "buffer {i} `{}` has type {} but output {k} is {}",
                            b.name, b.ty, port.ty
                        )));
                    }
                    if std::mem::replace(&mut outputs_seen[*k], true) {
                        return Err(err(format!("output {k} has two buffers")));
                    }
                }
                Storage::Weight(w) => {
                    let data = self.weights.get(*w).ok_or_else(|| {
                        err(format!(
                            "buffer {i} `{}` is weight {w}, but there are {} weights",
                            b.name,
                            self.weights.len()
                        ))
                    })?;
                    let dims: Vec<i64> = data.dims.iter().map(|&d| d as i64).collect();
                    if TensorType::known(data.dtype, &dims) != b.ty {
                        return Err(err(format!(
                            "buffer {i} `{}` has type {} but weight {w} is {}{:?}",
                            b.name, b.ty, data.dtype, data.dims
                        )));
                    }
                    written[i] = true;
                }
                Storage::Arena { arena, .. } => {
                    if *arena >= self.arenas.len() {
                        return Err(err(format!(
                            "buffer {i} `{}` is in arena {arena}, but there are {} arenas",
                            b.name,
                            self.arenas.len()
                        )));
                    }
                }
                Storage::Dynamic => {}
            }
        }
        if let Some(k) = outputs_seen.iter().position(|s| !s) {
            return Err(err(format!(
                "output {k} `{}` has no buffer",
                self.outputs[k].name
            )));
        }
        for (si, step) in self.steps.iter().enumerate() {
            self.verify_step(si, step, &mut written).map_err(err)?;
        }
        for (i, b) in self.buffers.iter().enumerate() {
            if matches!(b.storage, Storage::Output(_)) && !written[i] {
                return Err(err(format!(
                    "output buffer {i} `{}` is never written",
                    b.name
                )));
            }
        }
        Ok(())
    }

    fn verify_step(&self, si: usize, step: &Step, written: &mut [bool]) -> Result<(), String> {
        let buf = |b: usize| {
            self.buffers.get(b).ok_or_else(|| {
                format!(
                    "step {si}: buffer {b} out of range ({} buffers)",
                    self.buffers.len()
                )
            })
        };
        for b in step.reads() {
            buf(b)?;
            if !written[b] {
                return Err(format!(
                    "step {si} reads buffer {b} `{}` before anything writes it",
                    self.buffers[b].name
                ));
            }
        }
        match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let k = self.kernels.get(*kernel).ok_or_else(|| {
                    format!(
                        "step {si}: kernel {kernel} out of range ({} kernels)",
                        self.kernels.len()
                    )
                })?;
                let body = &k.body;
                if args.len() != body.inputs.len() || results.len() != body.outputs.len() {
                    return Err(format!(
                        "step {si}: kernel `{}` takes {} operands and gives {} results, the step binds {} and {}",
                        k.name,
                        body.inputs.len(),
                        body.outputs.len(),
                        args.len(),
                        results.len()
                    ));
                }
                let ports = args
                    .iter()
                    .map(|&b| Some(b))
                    .zip(body.inputs.iter())
                    .chain(results.iter().copied().zip(body.outputs.iter()));
                for (b, &v) in ports {
                    let Some(b) = b else { continue };
                    let (bt, vt) = (&buf(b)?.ty, &body.value(v).ty);
                    if bt.dtype != vt.dtype || bt.rank() != vt.rank() {
                        return Err(format!(
                            "step {si}: kernel `{}` port `{}` is {vt} but buffer {b} `{}` is {bt}",
                            k.name,
                            body.value(v).name,
                            self.buffers[b].name
                        ));
                    }
                }
            }
            Step::Copy { src, dst } => {
                let (s, d) = (buf(*src)?, buf(*dst)?);
                if s.ty.dtype != d.ty.dtype || s.ty.rank() != d.ty.rank() {
                    return Err(format!("step {si}: copy from {} to {}", s.ty, d.ty));
                }
            }
        }
        for b in step.writes() {
            let storage = &buf(b)?.storage;
            if matches!(storage, Storage::Input(_) | Storage::Weight(_)) {
                return Err(format!(
                    "step {si} writes read-only buffer {b} `{}`",
                    self.buffers[b].name
                ));
            }
            written[b] = true;
        }
        Ok(())
    }
}
