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
//! Dims are polynomials over the program's input symbols and its defined symbols
//! ([`Program::symbol_defs`]: floor divisions and broadcasts of those, bound with the
//! inputs). A symbol neither binds (a size that depends on tensor *values*, such as
//! NonZero's output) makes a buffer [`Storage::Dynamic`]: its producer sizes it when it runs.

use crate::{ConstData, Dim, Graph, Symbol, TensorType};

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
    /// `Program::states[i]`: memory a session keeps from one call to the next (a KV
    /// cache), allocated once at its capacity. The buffer for the state's input reads the
    /// bytes the previous call left; the one for its output is the same bytes, which the
    /// producing kernel extends in place (see [`StateDecl`]).
    State(usize),
}

/// State a program carries from one call to the next ([`crate::StateLink`] in the graph).
///
/// The caller neither passes nor receives it: the session allocates it once, at the size of
/// `output`'s type at the declared bounds, and keeps its length. On a growth axis the input's
/// dim is a plain symbol (`past`) that the session binds to the length left by the previous
/// call (0 after a reset); the output's dim (`past + seq`) is the new length. Every dim before
/// the growth axis is 1, so both are prefixes of one buffer, and a kernel that writes the
/// output over the input (`concat(past, new)`) only writes the new part.
#[derive(Clone, Debug, PartialEq)]
pub struct StateDecl {
    /// The state's name: the graph output that produces it (`present_k.3`).
    pub name: String,
    /// The input port it was (the graph input that reads it).
    pub input_name: String,
    /// Its type as a call reads it.
    pub input_ty: TensorType,
    /// Its type as a call leaves it.
    pub output_ty: TensorType,
}

impl StateDecl {
    /// The axis along which the state grows, if any: the one axis where the input and
    /// output dims differ.
    pub fn growth_axis(&self) -> Option<usize> {
        (0..self.input_ty.rank()).find(|&a| self.input_ty.dims[a] != self.output_ty.dims[a])
    }

    /// The symbol the session binds to the state's current length (`past`), if it grows.
    pub fn length_symbol(&self) -> Option<&Symbol> {
        self.growth_axis()
            .and_then(|a| self.input_ty.dims[a].as_symbol())
    }
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

/// Convolutions whose outputs have fewer pixels than this (per image) are not run by
/// Winograd on the CPU ([`cpu_winograd`]): ResNet-50's 7×7 maps run as im2col + GEMM. There
/// the weights, not the multiply-adds, bound the time: 49 outputs per filter, and
/// Winograd's filters are 16/9 the bytes (16.8 MB against 9.4 MB for 512 channels). With
/// weights hot in cache Winograd wins (0.82 against 1.59 ms, `cargo bench -p
/// rafter-kernels-cpu --bench winograd`), but inside ResNet-50 it gained ~7% on those
/// layers for +34 MB of peak RSS (`rafter bench resnet50.onnx --trace`, both builds
/// alternated, three rounds).
pub const WINOGRAD_MIN_PIXELS: usize = 100;

/// The facts about one 2-D convolution that decide whether the CPU runs it by Winograd
/// F(2×2, 3×3) ([`cpu_winograd`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    /// The window, `[kh, kw]`.
    pub window: [usize; 2],
    /// `[sh, sw]`.
    pub strides: [usize; 2],
    /// `[dh, dw]`.
    pub dilations: [usize; 2],
    /// Channel groups.
    pub groups: usize,
    /// Input channels (all groups').
    pub in_channels: usize,
    /// Output pixels of one image, `oh · ow`.
    pub out_pixels: usize,
    /// The activations' element type.
    pub dtype: crate::DType,
}

/// Whether the CPU runtime runs a convolution of `g` by Winograd F(2×2, 3×3)
/// (`rafter_kernels_cpu::conv3x3_nhwc` channels-last, `conv3x3` in NCHW), 2.25× fewer
/// multiply-adds than a direct convolution: f32, one group of more than
/// [`SMALL_CONV_MAX_CIN`] input channels (fewer run directly, `small_conv_nhwc`), a 3×3
/// window at stride 1 without dilation, and at least [`WINOGRAD_MIN_PIXELS`] output pixels.
/// The thread count does not enter. The CPU runtime picks its kernel by this rule and the
/// cost model (`rafter_opt::partition::cost`) rates such convolutions as their own class,
/// so the two cannot disagree.
pub fn cpu_winograd(g: &ConvGeometry) -> bool {
    g.dtype == crate::DType::F32
        && g.groups == 1
        && g.in_channels > SMALL_CONV_MAX_CIN as usize
        && g.window == [3, 3]
        && g.strides == [1, 1]
        && g.dilations == [1, 1]
        && g.out_pixels >= WINOGRAD_MIN_PIXELS
}

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
    /// Declared upper bounds of sums of symbols (`--dim 'past+seq<=4096'`): the runtime
    /// checks them on every call, and the planner sizes a dim equal to one of them by it.
    /// Each of their symbols is also in `bounds`, at most the same value.
    pub dim_bounds: Vec<(Dim, i64)>,
    /// Symbols the inputs do not bind, defined from those they do (conv output sizes over
    /// symbolic inputs): the runtime binds them, in order, right after the inputs, so the
    /// buffers they size are sized per call (see [`crate::symbol_def`]).
    pub symbol_defs: Vec<crate::SymbolDef>,
    /// State carried across calls (KV caches), read and written through `Storage::State`.
    pub states: Vec<StateDecl>,
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
        let placed = |b: usize| match self.buffers.get(b).map(|d| &d.storage) {
            Some(Storage::Arena {
                arena,
                offset: Some(o),
            }) => Some((*arena, *o)),
            _ => None,
        };
        self.view_operands(step)
            .is_some_and(|(src, dst)| placed(src).is_some() && placed(src) == placed(dst))
    }

    /// The `(operand, result)` buffers of `step` when it dispatches a reshape-like kernel
    /// ([`Kernel::viewed_operand`]): the pair a view places one over the other.
    pub fn view_operands(&self, step: &Step) -> Option<(usize, usize)> {
        let Step::Dispatch {
            kernel,
            args,
            results,
        } = step
        else {
            return None;
        };
        let a = self.kernels.get(*kernel)?.viewed_operand()?;
        Some((*args.get(a)?, (*results.first()?)?))
    }

    /// The `(operand, result)` buffers of step `si` when it is a view the session places per
    /// call: it dispatches a reshape-like kernel ([`Kernel::viewed_operand`]) whose operand
    /// and result are buffers of one arena without compile-time offsets (sized by symbols
    /// the bounds leave open, such as a sequence length), the operand touched for the last
    /// time at `si` and the result for the first (`live`, [`crate::arena::liveness`]).
    /// The session then places the result over the operand's bytes and does not dispatch
    /// the step, as the memory plan does at compile time for sized buffers
    /// ([`Program::is_placed_view`]).
    pub fn per_call_view(
        &self,
        si: usize,
        live: &[Option<(usize, usize)>],
    ) -> Option<(usize, usize)> {
        let step = self.steps.get(si)?;
        let (src, dst) = self.view_operands(step)?;
        let per_call = |b: usize| match self.buffers.get(b).map(|d| &d.storage) {
            Some(Storage::Arena {
                arena,
                offset: None,
            }) => Some(*arena),
            _ => None,
        };
        let fits = src != dst
            && per_call(src).is_some()
            && per_call(src) == per_call(dst)
            && live.get(src).copied().flatten().map(|l| l.1) == Some(si)
            && live.get(dst).copied().flatten().map(|l| l.0) == Some(si)
            && !step.writes().contains(&src);
        fits.then_some((src, dst))
    }

    /// Checks every index, arity and type, and that each buffer is written before it is
    /// read (inputs and weights count as written). The runtime runs this on every program it
    /// loads, so a hostile artifact cannot make it index out of bounds.
    pub fn verify(&self) -> Result<(), ProgramError> {
        let err = |msg: String| ProgramError {
            program: self.name.clone(),
            msg,
        };
        self.verify_states().map_err(err)?;
        self.verify_symbol_defs().map_err(err)?;
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
                Storage::State(st) => {
                    let decl = self.states.get(*st).ok_or_else(|| {
                        err(format!(
                            "buffer {i} `{}` is state {st}, but there are {} states",
                            b.name,
                            self.states.len()
                        ))
                    })?;
                    if b.ty != decl.input_ty && b.ty != decl.output_ty {
                        return Err(err(format!(
                            "buffer {i} `{}` has type {} but state {st} `{}` is {} -> {}",
                            b.name, b.ty, decl.name, decl.output_ty, decl.input_ty
                        )));
                    }
                    // The previous call (or the reset) left it: readable from the start.
                    written[i] = true;
                }
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

    /// Each state's types form a state (same dtype and rank; dims equal but on one growth
    /// axis, where the input's dim is a symbol and the dims before it are 1).
    /// Each definition reads only symbols bound before it (the inputs', the states'
    /// lengths, earlier definitions), defines a symbol nothing else binds, and divides by a
    /// positive number.
    fn verify_symbol_defs(&self) -> Result<(), String> {
        let mut bound: std::collections::HashSet<Symbol> = self
            .inputs
            .iter()
            .map(|p| &p.ty)
            .chain(self.states.iter().map(|s| &s.input_ty))
            .flat_map(|ty| ty.dims.iter().flat_map(|d| d.symbols()))
            .collect();
        for (i, def) in self.symbol_defs.iter().enumerate() {
            if let Some(s) = def.expr.symbols().into_iter().find(|s| !bound.contains(s)) {
                return Err(format!(
                    "symbol definition {i} `{def}` reads `{}`, which no input or earlier \
                     definition binds",
                    s.name()
                ));
            }
            if let crate::SymbolExpr::FloorDiv { den, .. } | crate::SymbolExpr::Mod { den, .. } =
                &def.expr
            {
                if *den <= 0 {
                    return Err(format!("symbol definition {i} `{def}` divides by {den}"));
                }
            }
            for name in def.expr.value_inputs() {
                let port = self.inputs.iter().find(|p| p.name == name);
                let Some(port) = port else {
                    return Err(format!(
                        "symbol definition {i} `{}` reads the values of `{name}`, which is \
                         not an input",
                        def.symbol.name()
                    ));
                };
                if !(port.ty.dtype.is_int() || port.ty.dtype.is_float()) {
                    return Err(format!(
                        "symbol definition {i} `{}` reads the values of `{name}`, of type {}",
                        def.symbol.name(),
                        port.ty
                    ));
                }
            }
            if !bound.insert(def.symbol.clone()) {
                return Err(format!(
                    "symbol definition {i} `{def}` defines `{}`, which is already bound",
                    def.symbol.name()
                ));
            }
        }
        Ok(())
    }

    fn verify_states(&self) -> Result<(), String> {
        for (i, st) in self.states.iter().enumerate() {
            let (a, b) = (&st.input_ty, &st.output_ty);
            let bad = |why: &str| format!("state {i} `{}` ({b} -> {a}): {why}", st.name);
            if a.dtype != b.dtype || a.rank() != b.rank() {
                return Err(bad("dtype or rank differ"));
            }
            let differ = (0..a.rank()).filter(|&x| a.dims[x] != b.dims[x]).count();
            if differ > 1 {
                return Err(bad("the types differ on more than one axis"));
            }
            if let Some(axis) = st.growth_axis() {
                if a.dims[axis].as_symbol().is_none() {
                    return Err(bad("the input's growing dim must be a plain symbol"));
                }
                if (0..axis).any(|x| a.dims[x].as_known() != Some(1)) {
                    return Err(bad("the dims before the growth axis must be 1"));
                }
            }
        }
        Ok(())
    }

    /// The largest value `dim` takes within the declared bounds: a sum bound that `dim`
    /// equals (`past + seq <= 4096`), else the polynomial at the symbols' bounds. `None`
    /// when a symbol of `dim` has no bound.
    pub fn max_of(&self, dim: &Dim) -> Option<i64> {
        if let Some((_, b)) = self.dim_bounds.iter().find(|(d, _)| d == dim) {
            return Some(*b);
        }
        let bounds: std::collections::HashMap<Symbol, i64> = self.bounds.iter().cloned().collect();
        dim.max_value(&bounds).ok()
    }

    /// Bytes state `s` takes at its capacity (its output type at the declared bounds), or
    /// `None` when a dim has no bound (or the size overflows).
    pub fn state_bytes(&self, s: usize) -> Option<u64> {
        let st = self.states.get(s)?;
        st.output_ty
            .dims
            .iter()
            .try_fold(st.output_ty.dtype.size_of() as u64, |acc, d| {
                let n = u64::try_from(self.max_of(d)?).ok()?;
                acc.checked_mul(n)
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// ResNet-50's 3×3 stride-1 convolution of stage 1 (64 channels, 56×56).
    fn resnet_3x3() -> ConvGeometry {
        ConvGeometry {
            window: [3, 3],
            strides: [1, 1],
            dilations: [1, 1],
            groups: 1,
            in_channels: 64,
            out_pixels: 56 * 56,
            dtype: crate::DType::F32,
        }
    }

    #[test]
    fn winograd_takes_ungrouped_f32_3x3_stride_1_convolutions_of_enough_pixels() {
        let g = resnet_3x3();
        assert!(cpu_winograd(&g));
        // 10×10 is the smallest square map that qualifies; ResNet-50's 7×7 does not.
        assert!(cpu_winograd(&ConvGeometry {
            out_pixels: 100,
            ..g
        }));
        assert!(!cpu_winograd(&ConvGeometry {
            out_pixels: 49,
            ..g
        }));
        for other in [
            ConvGeometry {
                strides: [2, 2],
                ..g
            },
            ConvGeometry {
                strides: [1, 2],
                ..g
            },
            ConvGeometry {
                dilations: [2, 2],
                ..g
            },
            ConvGeometry {
                window: [1, 1],
                ..g
            },
            ConvGeometry {
                window: [5, 5],
                ..g
            },
            ConvGeometry { groups: 64, ..g },
            ConvGeometry { groups: 2, ..g },
            // An RGB stem runs directly.
            ConvGeometry {
                in_channels: SMALL_CONV_MAX_CIN as usize,
                ..g
            },
            ConvGeometry {
                dtype: crate::DType::F16,
                ..g
            },
        ] {
            assert!(!cpu_winograd(&other), "{other:?}");
        }
    }
}
