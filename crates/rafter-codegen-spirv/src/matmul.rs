//! Matrix products (ONNX `MatMul`, `Gemm`) on f32 or f16 buffers, accumulated in f32, tiled
//! through workgroup memory.
//!
//! One workgroup of 16×16 invocations computes a 64×64 tile of `C = A·B` for one batch
//! entry; each invocation holds a 4×4 block of the tile in registers ([`MatmulTile`]: or
//! 32×32 and 2×2, for products with few rows). K is walked in steps
//! of 16: the workgroup stages a 64×16 slice of A and a 16×64 slice of B in workgroup
//! memory (every invocation loads 4 elements of each, consecutive invocations reading
//! consecutive addresses), synchronises, and every invocation accumulates its 4×4 block
//! from 4 + 4 workgroup-memory reads per k (a 2:1 ratio of FMAs to shared loads, versus
//! 1:2 for one output per invocation). A's slice is stored transposed, its rows padded to
//! 65 floats so that the transposing stores do not collide on one memory bank. Elements
//! outside the matrices read as 0 and are not stored, so any M, N, K work.
//!
//! A chain of elementwise ops after the product (what fusion puts in a contraction
//! kernel: bias, scale, residual, relu) is applied to each element as it is stored, so
//! the fused kernel writes C once: `add`/`sub`/`mul`/`div` with a scalar (a constant or a
//! one-element input), a row vector broadcast over the rows (a bias of C's last dim), or a
//! tensor of C's dims (a residual), on either side; and `relu`.
//!
//! Addresses follow the crate's ABI: 64-bit device addresses in the push constants, one
//! per binding (the body's inputs, then its output), then the params; element addresses
//! are 64-bit integers.

use rafter_ir::{BinaryOp, GeluApprox, Graph, Op, UnaryOp, ValueDef, ValueId};
use rafter_vulkan_section::Launch;
use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{
    AddressingModel, BuiltIn, Capability, Decoration, ExecutionMode, ExecutionModel,
    FunctionControl, LoopControl, MemoryAccess, MemoryModel, MemorySemantics, Scope,
    SelectionControl, StorageClass, Word,
};

use crate::coop::emit_coop;
use crate::elem::{self, Elem};
use crate::CodegenError;

/// Rows and columns of C one workgroup computes by default.
pub const MATMUL_TILE: u32 = 64;
/// Invocations per workgroup side (16×16).
pub(crate) const THREADS: u32 = 16;
/// The K step staged in workgroup memory.
const KSTEP: u32 = 16;

/// The C tile a workgroup computes. Large tiles reuse each staged element more (4×4
/// registers per invocation); small ones make 4× more workgroups, which is what products
/// with few rows (a transformer at batch 1: M = sequence length) need to fill a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MatmulTile {
    /// 64×64, a 4×4 block per invocation.
    #[default]
    Large,
    /// 32×32, a 2×2 block per invocation.
    Small,
    /// 16×16, one element per invocation: for products too small in M and N to give the
    /// GPU's multiprocessors a workgroup each otherwise (a convolution on a 7×7 map: 49
    /// columns), at the price of fewer FMAs per workgroup-memory load.
    Tiny,
    /// 32×32 like `Small`, with K split over [`SLICES`] groups of 16×16 invocations in one
    /// workgroup (1,024 invocations), whose partial sums meet through workgroup memory
    /// before the epilogue: for long-K products with few tiles (BERT's 128×768 outputs
    /// make 96 workgroups for 132 multiprocessors), 4× the warps per multiprocessor to
    /// hide memory latency, without a second pass or atomics.
    Sliced,
    /// 16×16 like `Tiny`, with K split like `Sliced`: for long-K products with too few
    /// 32×32 tiles to fill the GPU even with slices (ResNet-50's last stage: 512 channels
    /// on a 7×7 map, K = 4,608).
    TinySliced,
}

/// K slices of a [`MatmulTile::Sliced`] workgroup.
pub const SLICES: u32 = 4;

impl MatmulTile {
    /// Rows and columns of the tile.
    pub fn size(self) -> u32 {
        match self {
            MatmulTile::Large => 64,
            MatmulTile::Small | MatmulTile::Sliced => 32,
            MatmulTile::Tiny | MatmulTile::TinySliced => 16,
        }
    }

    /// Groups of 16×16 invocations splitting K in one workgroup.
    pub fn slices(self) -> u32 {
        match self {
            MatmulTile::Sliced | MatmulTile::TinySliced => SLICES,
            _ => 1,
        }
    }

    /// The register block's side (`size / 16`).
    fn block(self) -> u32 {
        self.size() / THREADS
    }

    /// Row length of the transposed A slice in workgroup memory (padded against bank
    /// conflicts).
    fn a_row(self) -> u32 {
        self.size() + 1
    }
}

/// A generated matrix-product kernel and how to launch it.
#[derive(Debug, Clone)]
pub struct MatmulKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body's inputs, then C.
    pub spirv: Vec<u32>,
    /// Whether B is one matrix shared by every batch entry of A (B of rank 2).
    pub b_shared: bool,
    /// The body inputs that are A and B (binding indices).
    pub a_input: usize,
    pub b_input: usize,
    /// Number of bindings (body inputs + 1).
    pub bindings: usize,
    /// The C tile per workgroup.
    pub tile: MatmulTile,
    /// B is stored transposed (`[N, K]`: a `Gemm` with `transB`).
    pub b_transposed: bool,
    /// The same kernel on cooperative matrices, with the same launch, for devices that
    /// offer them (f16 kernels only; see the `coop` module).
    pub coop: Option<Vec<u32>>,
}

impl MatmulKernel {
    /// How the runtime launches it (and what computes a call's params and grid from the
    /// operands' dims: [`Launch::matmul_dispatch`], shared with the runtime).
    pub fn launch(&self) -> Result<Launch, String> {
        let index = |i: usize| {
            u8::try_from(i).map_err(|_| format!("matmul operand {i} is past binding 255"))
        };
        if self.b_transposed {
            return Ok(Launch::GemmTransB {
                a: index(self.a_input)?,
                b: index(self.b_input)?,
                tile: self.tile.size(),
            });
        }
        Ok(Launch::Matmul {
            a: index(self.a_input)?,
            b: index(self.b_input)?,
            b_shared: self.b_shared,
            tile: self.tile.size(),
        })
    }
}

/// One operand of an epilogue op.
#[derive(Debug, Clone)]
pub(crate) enum Src {
    Const(f32),
    /// Binding `i`, one element.
    Scalar(usize),
    /// Binding `i`, indexed by C's column.
    Row(usize),
    /// Binding `i`, indexed by C's row (a convolution's per-channel bias).
    PerRow(usize),
    /// The kernel's constant vector `i` (a body constant folded into the module), indexed
    /// by C's row.
    ConstRow(usize),
    /// The same, indexed by C's column (a matmul's bias folded into the body).
    ConstCol(usize),
    /// Binding `i`, indexed like C.
    Full(usize),
    /// Binding `i`, broadcast to C (NumPy rules): its rows are C's (`row`) or one, its
    /// columns C's (`col`) or one, and its matrix for C's batch entry `z` is
    /// `sum over parts of ((z / divisor) % size) * stride` (no modulo for size 0: the
    /// outermost batch dim). An attention mask `[b, 1, 1, s]` or `[b, 1, s, s]` added to
    /// scores `[b, h, s, s]`.
    Bcast {
        i: usize,
        row: bool,
        col: bool,
        batch: Vec<(u32, u32, u32)>,
    },
}

/// One epilogue step on the accumulated value `x`.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// `x op s` (`x_left`) or `s op x`.
    Binary(BinaryOp, Src, bool),
    Relu,
    /// An activation from [`crate::epilogue_math`]: sigmoid, tanh or GELU.
    Activation(Activation),
    /// `clip(x, lo, hi)`, either bound absent (ONNX `Clip`; ReLU6 in MobileNetV2).
    Clip(Option<Src>, Option<Src>),
    /// `x` rounded to f16: the boundary between two ops of an f16 chain (the product and
    /// each epilogue node), so fusion rounds where separate ops would have stored.
    Round,
}

/// The transcendental activations an epilogue applies (see [`crate::epilogue_math`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    Sigmoid,
    Tanh,
    /// GELU, `tanh_form` for ONNX's `approximate = "tanh"`.
    Gelu {
        tanh_form: bool,
    },
}

/// How C's dims map onto the kernel's `rows × cols` matrix, for reading epilogue operands:
/// the axis of C that is the row (a matmul's second-to-last, a convolution's channel), and
/// whether the last axis is the whole column index (a matmul's; a convolution's columns
/// span its spatial axes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CAxes {
    pub(crate) row: usize,
    pub(crate) col_is_last: bool,
}

/// Compiles a body holding one f32 or f16 `matmul` of two body inputs (A, B, C and the
/// epilogue's operands of one element type), A of rank >= 2 and B either 2-D or with A's
/// batch dims (ONNX broadcasting beyond that is not generated yet), optionally followed by
/// the epilogue chain of the module docs, ending in the body's one output.
pub fn matmul(body: &Graph) -> Result<MatmulKernel, CodegenError> {
    matmul_tiled(body, MatmulTile::Large)
}

/// [`matmul`] with a chosen C tile per workgroup.
pub fn matmul_tiled(body: &Graph, tile: MatmulTile) -> Result<MatmulKernel, CodegenError> {
    let error = |reason: String| CodegenError {
        kernel: body.name.clone(),
        reason,
    };
    let Some((first, rest)) = body.nodes.split_first() else {
        return Err(error("the body is empty".into()));
    };
    // A 2-D `Gemm` is a matmul whose epilogue starts with `· alpha` and `+ C`.
    let mut gemm_steps = Vec::new();
    let mut consts = Vec::new();
    let mut b_transposed = false;
    match &first.op {
        Op::MatMul => {}
        Op::Gemm {
            alpha,
            beta,
            trans_a: false,
            trans_b,
        } if first.inputs.len() <= 3 => {
            b_transposed = *trans_b;
            if *alpha != 1.0 {
                gemm_steps.push(Step::Binary(BinaryOp::Mul, Src::Const(*alpha), true));
            }
            if let Some(c) = first.inputs.get(2).copied().flatten() {
                if *beta != 1.0 {
                    return Err(error(format!(
                        "gemm with beta {beta} is not generated yet (only 1)"
                    )));
                }
                let Some(&Some(product)) = first.outputs.first() else {
                    return Err(error("the gemm has no result".into()));
                };
                let c_ty = &body.value(product).ty;
                let axes = CAxes {
                    row: 0,
                    col_is_last: true,
                };
                gemm_steps.push(Step::Binary(
                    BinaryOp::Add,
                    source(body, c, c_ty, axes, &mut consts).map_err(error)?,
                    true,
                ));
            }
        }
        op => {
            return Err(error(format!(
                "the first node is `{}`, not matmul (or a gemm without transA)",
                op.name()
            )));
        }
    }
    let is_gemm = first.op != Op::MatMul;
    let input_index = |v: Option<ValueId>| match v.map(|v| &body.value(v).def) {
        Some(ValueDef::Input(i)) => Some(*i),
        _ => None,
    };
    let (Some(a_input), Some(b_input), true, [Some(product)]) = (
        input_index(first.input(0)),
        input_index(first.input(1)),
        first.inputs.len() == 2 || is_gemm,
        first.outputs.as_slice(),
    ) else {
        return Err(error(
            "the matmul must read two body inputs and have one result".into(),
        ));
    };
    let (a, b) = (
        &body.value(body.inputs[a_input]).ty,
        &body.value(body.inputs[b_input]).ty,
    );
    let c_dtype = body.value(*product).ty.dtype;
    if a.dtype != c_dtype || b.dtype != c_dtype {
        return Err(error(format!(
            "operands are {} and {} for a {} product; a matmul kernel is generated on one \
             element type",
            a.dtype, b.dtype, c_dtype
        )));
    }
    let elem = Elem::of(c_dtype).map_err(|e| error(format!("operands are {e}")))?;
    if a.rank() < 2 || b.rank() < 2 {
        return Err(error(
            "operands of rank below 2 are not generated yet".into(),
        ));
    }
    if is_gemm && (a.rank() != 2 || b.rank() != 2) {
        return Err(error("gemm operands must be 2-D".into()));
    }
    let b_shared = b.rank() == 2;
    if !b_shared && b.dims[..b.rank() - 2] != a.dims[..a.rank() - 2] {
        return Err(error(format!(
            "B's batch dims {:?} are neither absent nor A's {:?} (broadcasting is not \
             generated yet)",
            &b.dims[..b.rank() - 2],
            &a.dims[..a.rank() - 2]
        )));
    }
    let c_ty = body.value(*product).ty.clone();
    let axes = CAxes {
        row: c_ty.rank() - 2,
        col_is_last: true,
    };
    let (mut steps, last) =
        epilogue(body, rest, *product, &c_ty, axes, &mut consts).map_err(error)?;
    gemm_steps.append(&mut steps);
    let steps = gemm_steps;
    if body.outputs != [last] {
        return Err(error(
            "the body's one output must be the end of the matmul's epilogue chain".into(),
        ));
    }
    let bindings = body.inputs.len() + 1;
    // A is `[.., M, K]` whether or not B is transposed.
    let k = a.dims[a.rank() - 1].as_known();
    let layout = Layout {
        a: a_input,
        b: b_input,
        c: bindings - 1,
        bindings,
        steps,
        tile,
        b_source: if b_transposed {
            BSource::MatrixT
        } else {
            BSource::Matrix
        },
        const_rows: consts,
        elem,
        long_k: k.is_some_and(|k| k >= i64::from(LONG_K)),
        // Rows of 8-element multiples: A's (K) and B's contiguous dim (N, or K if B is
        // transposed).
        rows_of_8: k.is_some_and(|k| k % 8 == 0)
            && (b_transposed
                || c_ty.dims[c_ty.rank() - 1]
                    .as_known()
                    .is_some_and(|n| n % 8 == 0)),
    };
    let spirv = emit(&layout).map_err(error)?;
    let coop = emit_coop(&layout).map_err(error)?;
    Ok(MatmulKernel {
        spirv,
        coop,
        b_shared,
        a_input,
        b_input,
        bindings,
        tile,
        b_transposed,
    })
}

/// The epilogue chain after the product `x`: each node takes the previous result and at
/// most one other operand. Returns the steps and the chain's last value.
pub(crate) fn epilogue(
    body: &Graph,
    nodes: &[rafter_ir::Node],
    mut x: ValueId,
    c: &rafter_ir::TensorType,
    axes: CAxes,
    consts: &mut Vec<Vec<f32>>,
) -> Result<(Vec<Step>, ValueId), String> {
    let mut steps = Vec::new();
    for node in nodes {
        if c.dtype == rafter_ir::DType::F16 {
            steps.push(Step::Round);
        }
        let [Some(y)] = node.outputs.as_slice() else {
            return Err(format!(
                "epilogue node `{}` has not one result",
                node.op.name()
            ));
        };
        if body.value(*y).ty != *c {
            return Err(format!(
                "epilogue node `{}` changes the type to {}",
                node.op.name(),
                body.value(*y).ty
            ));
        }
        let step = match (&node.op, node.inputs.as_slice()) {
            (Op::Unary { op: UnaryOp::Relu }, [Some(v)]) if *v == x => Step::Relu,
            (
                Op::Unary {
                    op: UnaryOp::Sigmoid,
                },
                [Some(v)],
            ) if *v == x => Step::Activation(Activation::Sigmoid),
            (Op::Unary { op: UnaryOp::Tanh }, [Some(v)]) if *v == x => {
                Step::Activation(Activation::Tanh)
            }
            (Op::Gelu { approximate }, [Some(v)]) if *v == x => {
                Step::Activation(Activation::Gelu {
                    tanh_form: matches!(approximate, GeluApprox::Tanh),
                })
            }
            (Op::Binary { op }, [Some(l), Some(r)])
                if matches!(
                    op,
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
                ) && (*l == x) != (*r == x) =>
            {
                let (other, x_left) = if *l == x { (*r, true) } else { (*l, false) };
                Step::Binary(*op, source(body, other, c, axes, consts)?, x_left)
            }
            (Op::Clip, [Some(v), bounds @ ..]) if *v == x && bounds.len() <= 2 => {
                let mut bound = |i: usize| -> Result<Option<Src>, String> {
                    match bounds.get(i).copied().flatten() {
                        None => Ok(None),
                        Some(b) => match source(body, b, c, axes, consts)? {
                            s @ (Src::Const(_) | Src::Scalar(_)) => Ok(Some(s)),
                            _ => Err("a clip bound that is not one element".into()),
                        },
                    }
                };
                let lo = bound(0)?;
                Step::Clip(lo, bound(1)?)
            }
            (op, _) => {
                return Err(format!(
                    "epilogue op `{}` is not generated after a matmul yet",
                    op.name()
                ))
            }
        };
        steps.push(step);
        x = *y;
    }
    Ok((steps, x))
}

/// How an epilogue operand is read, from its type against C's.
pub(crate) fn source(
    body: &Graph,
    v: ValueId,
    c: &rafter_ir::TensorType,
    axes: CAxes,
    consts: &mut Vec<Vec<f32>>,
) -> Result<Src, String> {
    let value = body.value(v);
    let ty = &value.ty;
    if ty.dtype != c.dtype {
        return Err(format!(
            "epilogue operand %{} is {}, the result {} (one element type per kernel)",
            value.name, ty.dtype, c.dtype
        ));
    }
    match value.def {
        ValueDef::Const(id) => {
            let values = body.constant(id).to_f64s();
            if let [x] = values.as_slice() {
                if ty.rank() <= c.rank() {
                    return Ok(Src::Const(*x as f32));
                }
            }
            // A small vector the compiler folded into the body (a bias of a few f16s): a
            // row or column of C's matrix, kept in the module as a `Private` array.
            let vector = || values.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let src = match shaped(0, ty, c, axes) {
                Some(Src::Row(_)) if values.len() <= MAX_CONST_VECTOR => {
                    consts.push(vector());
                    Src::ConstCol(consts.len() - 1)
                }
                Some(Src::PerRow(_)) if values.len() <= MAX_CONST_VECTOR => {
                    consts.push(vector());
                    Src::ConstRow(consts.len() - 1)
                }
                _ => {
                    return Err(format!(
                        "constant %{} of dims {:?} is neither one element nor a row or column \
                         vector of C's matrix (of at most {MAX_CONST_VECTOR} elements)",
                        value.name, ty.dims
                    ))
                }
            };
            Ok(src)
        }
        ValueDef::Input(i) => shaped(i, ty, c, axes).ok_or_else(|| {
            format!(
                "operand %{} of dims {:?} is neither a scalar, a row or a column of C's \
                 matrix, of C's dims {:?}, nor broadcast to them over static inner batch dims",
                value.name, ty.dims, c.dims
            )
        }),
        _ => Err(format!(
            "epilogue operand %{} is computed inside the kernel",
            value.name
        )),
    }
}

/// The most elements of a constant vector folded into a module.
const MAX_CONST_VECTOR: usize = 4096;

/// How binding `i` of type `ty` is read against C's type `c`, if it can be.
fn shaped(
    i: usize,
    ty: &rafter_ir::TensorType,
    c: &rafter_ir::TensorType,
    axes: CAxes,
) -> Option<Src> {
    let ones = |dims: &[rafter_ir::Dim]| dims.iter().all(|d| d.as_known() == Some(1));
    if ty.rank() > c.rank() {
        return None;
    }
    if ones(&ty.dims) {
        return Some(Src::Scalar(i));
    }
    if ty.dims == c.dims {
        return Some(Src::Full(i));
    }
    if let Some((last, lead)) = ty.dims.split_last() {
        if axes.col_is_last && ones(lead) && Some(last) == c.dims.last() {
            return Some(Src::Row(i));
        }
    }
    // Aligned to C's trailing dims: one dim of C's row axis, every other 1.
    let skip = c.rank() - ty.rank();
    let per_row = ty.dims.iter().enumerate().all(|(a, d)| {
        if a + skip == axes.row {
            Some(d) == c.dims.get(axes.row)
        } else {
            d.as_known() == Some(1)
        }
    });
    if per_row && axes.row >= skip {
        return Some(Src::PerRow(i));
    }
    if axes.col_is_last {
        return broadcast_source(i, &ty.dims, &c.dims);
    }
    None
}

/// An operand of `dims` broadcast to C's `c` dims (each dim C's or 1, right-aligned), if
/// its batch index is computable from C's batch entry: every batch dim of C inside the
/// outermost one the operand follows is known.
fn broadcast_source(i: usize, dims: &[rafter_ir::Dim], c: &[rafter_ir::Dim]) -> Option<Src> {
    let rc = c.len();
    if rc < 2 || dims.len() > rc {
        return None;
    }
    let one = rafter_ir::Dim::known(1);
    let mut od = vec![one.clone(); rc - dims.len()];
    od.extend_from_slice(dims);
    // Per dim: whether the operand follows C there (a dim of 1 is broadcast).
    let follows = |d: usize| -> Option<bool> {
        if od[d] == one {
            Some(false)
        } else if od[d] == c[d] {
            Some(true)
        } else {
            None
        }
    };
    let (row, col) = (follows(rc - 2)?, follows(rc - 1)?);
    let mut batch = Vec::new();
    let mut divisor = 1u64; // C's batch entries inside dim d
    let mut stride = 1u64; // the operand's matrices inside dim d
    for d in (0..rc - 2).rev() {
        if follows(d)? {
            let size = if d == 0 {
                0
            } else {
                u32::try_from(c[d].as_known()?).ok()?
            };
            batch.push((
                u32::try_from(divisor).ok()?,
                size,
                u32::try_from(stride).ok()?,
            ));
            if d > 0 {
                stride = stride.checked_mul(size as u64)?;
            }
        }
        if d > 0 {
            divisor = divisor.checked_mul(u64::try_from(c[d].as_known()?).ok()?)?;
        }
    }
    Some(Src::Bcast { i, row, col, batch })
}

/// Where the bindings are and what the epilogue does.
pub(crate) struct Layout {
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) c: usize,
    pub(crate) bindings: usize,
    pub(crate) steps: Vec<Step>,
    pub(crate) tile: MatmulTile,
    pub(crate) b_source: BSource,
    /// Constant vectors the epilogue reads ([`Src::ConstRow`]).
    pub(crate) const_rows: Vec<Vec<f32>>,
    /// The element type of every binding (A, B, C and the epilogue's operands alike).
    pub(crate) elem: Elem,
    /// A matrix product whose K is known to be [`LONG_K`] or more: the cooperative-matrix
    /// variant stages more of K per step (see the `coop` module).
    pub(crate) long_k: bool,
    /// A matrix product whose A rows and B rows (their contiguous dim) are known to be
    /// multiples of 8 elements: the cooperative-matrix variant stages them 16 bytes at a
    /// time where the operands' addresses are 16-byte aligned (see the `coop` module).
    pub(crate) rows_of_8: bool,
}

/// What counts as a long K for [`Layout::long_k`].
pub(crate) const LONG_K: u32 = 512;

/// Where B's elements come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BSource {
    /// A row-major `K × N` matrix per batch entry (or one shared, per the `b_shared` param).
    Matrix,
    /// One row-major `N × K` matrix (B transposed), shared.
    MatrixT,
    /// A convolution's input image `[C, H, W]` per batch entry (an image), read as its
    /// im2col matrix on the fly (implicit GEMM): row `k = (c, ki, kj)`, column
    /// `n = (oh, ow)`. A is then the filter `[M, C·KH·KW]`, shared by every image.
    Image(ImageGeom),
}

/// Static geometry of a 2-D convolution's input window (one group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImageGeom {
    /// Input channels, height, width.
    pub(crate) c: u32,
    pub(crate) h: u32,
    pub(crate) w: u32,
    /// Window, strides, leading pads, dilations (height, width).
    pub(crate) k: [u32; 2],
    pub(crate) s: [u32; 2],
    pub(crate) p: [u32; 2],
    pub(crate) d: [u32; 2],
    /// Output width.
    pub(crate) ow: u32,
}

pub(crate) type R<T> = Result<T, String>;

pub(crate) fn build<T>(r: Result<T, rspirv::dr::Error>) -> R<T> {
    r.map_err(|e| format!("rspirv: {e}"))
}

/// GLSL.std.450 `Fma`.
pub(crate) const GLSL_FMA: u32 = 50;

/// Ids of the types and globals the body refers to.
pub(crate) struct Ids {
    pub(crate) glsl: Word,
    pub(crate) f32: Word,
    pub(crate) u32: Word,
    pub(crate) u64: Word,
    pub(crate) bool: Word,
    pub(crate) ptr_wg: Word,
    pub(crate) ptr_fn: Word,
    /// The workgroup tiles (unused, and 0, in kernels without them).
    pub(crate) a_tile: Word,
    pub(crate) b_tile: Word,
}

/// The types every compute module here starts with.
pub(crate) struct Prelude {
    pub(crate) glsl: Word,
    pub(crate) void: Word,
    pub(crate) f32: Word,
    pub(crate) u32: Word,
    pub(crate) u64: Word,
    pub(crate) bool: Word,
}

/// SPIR-V 1.5, the capabilities and memory model of the kernel ABI (buffers by 64-bit
/// `PhysicalStorageBuffer` address, see the crate docs), GLSL.std.450, and the base types.
pub(crate) fn prelude(b: &mut Builder) -> Prelude {
    b.set_version(1, 5);
    b.capability(Capability::Shader);
    b.capability(Capability::PhysicalStorageBufferAddresses);
    b.capability(Capability::Int64);
    let glsl = b.ext_inst_import("GLSL.std.450");
    b.memory_model(
        AddressingModel::PhysicalStorageBuffer64,
        MemoryModel::GLSL450,
    );
    Prelude {
        glsl,
        void: b.type_void(),
        f32: b.type_float(32),
        u32: b.type_int(32, 0),
        u64: b.type_int(64, 0),
        bool: b.type_bool(),
    }
}

/// The push-constant block and the pointer types to read its members.
pub(crate) struct Push {
    pub(crate) var: Word,
    pub(crate) ptr_u64: Word,
    pub(crate) ptr_u32: Word,
    /// With more than [`crate::grid::INLINE_BINDINGS`] addresses: the block's address count;
    /// the block then lives in memory and the push constants hold its address.
    table: Option<u32>,
}

/// The kernel's arguments: `addresses` u64 binding addresses, then `words` u32 params,
/// packed. Up to [`crate::grid::INLINE_BINDINGS`] addresses the block is the push
/// constants; past it the runtime writes the same block to memory and pushes its address
/// (`rafter-hal-vulkan`'s `INLINE_BINDINGS` says why), and [`Push::member`] reads through
/// it. Either way a kernel reads member `i` the same way.
pub(crate) fn push_block(b: &mut Builder, t: &Prelude, addresses: u32, words: u32) -> Push {
    let table = (addresses as usize > crate::grid::INLINE_BINDINGS).then_some(addresses);
    let members: Vec<Word> = if table.is_some() {
        vec![t.u64]
    } else {
        (0..addresses)
            .map(|_| t.u64)
            .chain((0..words).map(|_| t.u32))
            .collect()
    };
    let count = members.len() as u32;
    let push = b.type_struct(members);
    b.decorate(push, Decoration::Block, []);
    for i in 0..count {
        let offset = if i < addresses {
            8 * i
        } else {
            8 * addresses + 4 * (i - addresses)
        };
        b.member_decorate(push, i, Decoration::Offset, [Arg::LiteralBit32(offset)]);
    }
    let ptr_push = b.type_pointer(None, StorageClass::PushConstant, push);
    let class = if table.is_some() {
        StorageClass::PhysicalStorageBuffer
    } else {
        StorageClass::PushConstant
    };
    Push {
        var: b.variable(ptr_push, None, StorageClass::PushConstant, None),
        ptr_u64: b.type_pointer(None, class, t.u64),
        ptr_u32: b.type_pointer(None, class, t.u32),
        table,
    }
}

impl Push {
    /// Loads member `i` of the block: a binding's address (`wide`, a u64) or a param (u32).
    pub(crate) fn member(&self, b: &mut Builder, t: (Word, Word), i: u32, wide: bool) -> R<Word> {
        let (u32, u64) = t;
        let (ty, ptr) = if wide {
            (u64, self.ptr_u64)
        } else {
            (u32, self.ptr_u32)
        };
        let Some(addresses) = self.table else {
            let index = b.constant_bit32(u32, i);
            let p = build(b.access_chain(ptr, None, self.var, [index]))?;
            return build(b.load(ty, None, p, None, []));
        };
        // The block's address, then member `i` at its offset in the block.
        let push_u64 = b.type_pointer(None, StorageClass::PushConstant, u64);
        let zero = b.constant_bit32(u32, 0);
        let p = build(b.access_chain(push_u64, None, self.var, [zero]))?;
        let base = build(b.load(u64, None, p, None, []))?;
        let offset = if i < addresses {
            8 * i
        } else {
            8 * addresses + 4 * (i - addresses)
        };
        let offset = b.constant_bit64(u64, u64::from(offset));
        let at = build(b.i_add(u64, None, base, offset))?;
        let p = build(b.convert_u_to_ptr(ptr, None, at))?;
        let align = [Arg::LiteralBit32(if wide { 8 } else { 4 })];
        build(b.load(ty, None, p, Some(MemoryAccess::ALIGNED), align))
    }
}

/// Starts the module's one function: `main`, a GLCompute entry point using the globals
/// `interface`, with `local_size` invocations per workgroup. Returns its id.
pub(crate) fn begin_main(
    b: &mut Builder,
    void: Word,
    interface: Vec<Word>,
    local_size: [u32; 3],
) -> R<Word> {
    let fn_type = b.type_function(void, []);
    let main = build(b.begin_function(void, None, FunctionControl::NONE, fn_type))?;
    b.entry_point(ExecutionModel::GLCompute, main, "main", interface);
    b.execution_mode(main, ExecutionMode::LocalSize, local_size);
    Ok(main)
}

/// An `Input` variable of the `uvec3` built-in `which` (workgroup id, local id, ...).
pub(crate) fn builtin_v3(b: &mut Builder, u32: Word, which: BuiltIn) -> Word {
    let v3 = b.type_vector(u32, 3);
    let ptr = b.type_pointer(None, StorageClass::Input, v3);
    let var = b.variable(ptr, None, StorageClass::Input, None);
    b.decorate(var, Decoration::BuiltIn, [Arg::BuiltIn(which)]);
    var
}

pub(crate) fn emit(layout: &Layout) -> R<Vec<u32>> {
    let mut b = Builder::new();
    let t = prelude(&mut b);
    let Prelude {
        glsl,
        void,
        f32,
        u32,
        u64,
        bool,
    } = t;

    // Push constants: every binding's address (as u64), then M, N, K, B-shared.
    let nb = layout.bindings as u32;
    let push = push_block(&mut b, &t, nb, 4);

    // Workgroup tiles.
    let tile = layout.tile;
    let slices = tile.slices();
    let a_len = b.constant_bit32(u32, KSTEP * tile.a_row() * slices);
    let b_len = b.constant_bit32(u32, KSTEP * tile.size() * slices);
    let a_arr = b.type_array(f32, a_len);
    let b_arr = b.type_array(f32, b_len);
    let ptr_a_arr = b.type_pointer(None, StorageClass::Workgroup, a_arr);
    let ptr_b_arr = b.type_pointer(None, StorageClass::Workgroup, b_arr);
    let a_tile = b.variable(ptr_a_arr, None, StorageClass::Workgroup, None);
    let b_tile = b.variable(ptr_b_arr, None, StorageClass::Workgroup, None);
    let ptr_wg = b.type_pointer(None, StorageClass::Workgroup, f32);
    let ptr_fn = b.type_pointer(None, StorageClass::Function, f32);
    // The partial sums of slices 1.. for slice 0 to add (sliced tiles only).
    let red_tile = (slices > 1).then(|| {
        let len = b.constant_bit32(u32, (slices - 1) * tile.size() * tile.size());
        let arr = b.type_array(f32, len);
        let ptr = b.type_pointer(None, StorageClass::Workgroup, arr);
        b.variable(ptr, None, StorageClass::Workgroup, None)
    });

    let v3 = b.type_vector(u32, 3);
    let wg_var = builtin_v3(&mut b, u32, BuiltIn::WorkgroupId);
    let lid_var = builtin_v3(&mut b, u32, BuiltIn::LocalInvocationId);

    let const_rows = declare_const_rows(&mut b, f32, u32, &layout.const_rows);
    let interface = [push.var, wg_var, lid_var, a_tile, b_tile]
        .into_iter()
        .chain(red_tile)
        .chain(const_rows.iter().copied())
        .collect();
    begin_main(&mut b, void, interface, [THREADS, THREADS, slices])?;
    let ids = Ids {
        glsl,
        f32,
        u32,
        u64,
        bool,
        ptr_wg,
        ptr_fn,
        a_tile,
        b_tile,
    };
    let mut e = Body {
        b,
        ids,
        tile,
        const_rows,
        elem: layout.elem,
        slice_offsets: None,
        red_tile,
    };
    e.main(layout, &push, (wg_var, lid_var), v3)?;
    build(e.b.end_function())?;
    Ok(e.b.module().assemble())
}

pub(crate) struct Body {
    pub(crate) b: Builder,
    pub(crate) ids: Ids,
    pub(crate) tile: MatmulTile,
    /// The `Private` arrays holding the kernel's constant vectors ([`Src::ConstRow`]).
    pub(crate) const_rows: Vec<Word>,
    /// The element type of every binding.
    pub(crate) elem: Elem,
    /// A sliced tile's workgroup-memory offsets of this invocation's slice in the A and B
    /// tiles (set by `main`; `None`: one slice).
    pub(crate) slice_offsets: Option<(Word, Word)>,
    /// A sliced tile's workgroup array of the other slices' partial sums.
    pub(crate) red_tile: Option<Word>,
}

/// Declares each of `vectors` as a `Private` f32 array initialised with its values (before
/// the function, as SPIR-V requires); returns the variables, which the entry point must
/// list in its interface.
pub(crate) fn declare_const_rows(
    b: &mut Builder,
    f32: Word,
    u32: Word,
    vectors: &[Vec<f32>],
) -> Vec<Word> {
    vectors
        .iter()
        .map(|v| {
            let len = b.constant_bit32(u32, v.len() as u32);
            let arr = b.type_array(f32, len);
            let elems: Vec<Word> = v
                .iter()
                .map(|x| b.constant_bit32(f32, x.to_bits()))
                .collect();
            let init = b.constant_composite(arr, elems);
            let ptr = b.type_pointer(None, StorageClass::Private, arr);
            b.variable(ptr, None, StorageClass::Private, Some(init))
        })
        .collect()
}

/// What `store_block` needs to run the epilogue: the steps, every binding's address, and
/// the byte offset of this batch entry's C matrix (full-size operands share it).
pub(crate) struct Epilogue<'a> {
    pub(crate) steps: &'a [Step],
    pub(crate) addrs: &'a [Word],
    pub(crate) c_off: Word,
    /// C's batch entry (the workgroup's z) and rows, for broadcast operands.
    pub(crate) batch: Word,
    pub(crate) m: Word,
}

/// A kernel's view of its push constants for one batch entry: every binding's address,
/// the product's sizes, and the byte addresses of this entry's A, B and C.
pub(crate) struct Operands {
    pub(crate) addrs: Vec<Word>,
    pub(crate) m: Word,
    pub(crate) n: Word,
    pub(crate) k: Word,
    pub(crate) a_base: Word,
    pub(crate) b_base: Word,
    pub(crate) c_base: Word,
    /// C's byte offset of this entry, which full-size epilogue operands share.
    pub(crate) c_off: Word,
}

impl Body {
    pub(crate) fn u(&mut self, v: u32) -> Word {
        self.b.constant_bit32(self.ids.u32, v)
    }
    pub(crate) fn u64c(&mut self, v: u64) -> Word {
        self.b.constant_bit64(self.ids.u64, v)
    }
    pub(crate) fn add(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.i_add(self.ids.u32, None, a, c))
    }
    pub(crate) fn mul(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.i_mul(self.ids.u32, None, a, c))
    }
    pub(crate) fn add64(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.i_add(self.ids.u64, None, a, c))
    }
    pub(crate) fn mul64(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.i_mul(self.ids.u64, None, a, c))
    }
    pub(crate) fn wide(&mut self, a: Word) -> R<Word> {
        build(self.b.u_convert(self.ids.u64, None, a))
    }
    /// `a * c` for a constant `c`.
    pub(crate) fn mul_c(&mut self, a: Word, c: u32) -> R<Word> {
        let c = self.u(c);
        self.mul(a, c)
    }
    /// `a + c` for a constant `c`.
    pub(crate) fn add_c(&mut self, a: Word, c: u32) -> R<Word> {
        let c = self.u(c);
        self.add(a, c)
    }
    /// `a < c` for a constant `c`.
    pub(crate) fn lt_c(&mut self, a: Word, c: u32) -> R<Word> {
        let c = self.u(c);
        self.lt(a, c)
    }
    pub(crate) fn lt(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.u_less_than(self.ids.bool, None, a, c))
    }
    pub(crate) fn and(&mut self, a: Word, c: Word) -> R<Word> {
        build(self.b.logical_and(self.ids.bool, None, a, c))
    }

    /// The element size in bytes, as a `u64` constant.
    pub(crate) fn esize(&mut self) -> Word {
        self.u64c(self.elem.bytes() as u64)
    }

    /// `base + (row * ld + col) * size`: the byte address of a matrix element.
    pub(crate) fn elem_addr(&mut self, base: Word, row: Word, ld: Word, col: Word) -> R<Word> {
        let (row, ld, col) = (self.wide(row)?, self.wide(ld)?, self.wide(col)?);
        let idx = self.mul64(row, ld)?;
        let idx = self.add64(idx, col)?;
        let size = self.esize();
        let off = self.mul64(idx, size)?;
        self.add64(base, off)
    }

    /// Loads `(row, col)` of a `rows × cols` matrix at `base`, or 0 outside it.
    fn load_or_zero(
        &mut self,
        base: Word,
        (row, rows): (Word, Word),
        (col, cols): (Word, Word),
    ) -> R<Word> {
        let (addr, inside) = self.matrix_addr(base, (row, rows), (col, cols))?;
        self.load_inside(addr, inside)
    }

    /// The f32 value at `addr` where `inside`, else 0.
    fn load_inside(&mut self, addr: Word, inside: Word) -> R<Word> {
        let v = self.load_at(addr)?;
        let fzero = self.b.constant_bit32(self.ids.f32, 0);
        build(self.b.select(self.ids.f32, None, inside, v, fzero))
    }

    /// The address of `(row, col)` of a `rows × cols` matrix at `base`, and whether it lies
    /// inside. The address is always in bounds (element 0 when outside): a device address
    /// must not be dereferenced beyond its buffer, even by a load whose value is dropped.
    pub(crate) fn matrix_addr(
        &mut self,
        base: Word,
        (row, rows): (Word, Word),
        (col, cols): (Word, Word),
    ) -> R<(Word, Word)> {
        let in_rows = self.lt(row, rows)?;
        let in_cols = self.lt(col, cols)?;
        let inside = self.and(in_rows, in_cols)?;
        let zero = self.u(0);
        let row = build(self.b.select(self.ids.u32, None, inside, row, zero))?;
        let col = build(self.b.select(self.ids.u32, None, inside, col, zero))?;
        Ok((self.elem_addr(base, row, cols, col)?, inside))
    }

    /// Element `(row, col)` of the im2col matrix of the image at `base` (`rows × cols`),
    /// or 0 outside it or in the padding.
    fn load_im2col(
        &mut self,
        base: Word,
        g: &ImageGeom,
        (row, rows): (Word, Word),
        (col, cols): (Word, Word),
    ) -> R<Word> {
        let (addr, inside) = self.im2col_addr(base, g, (row, rows), (col, cols))?;
        self.load_inside(addr, inside)
    }

    /// The address of element `(row, col)` of the im2col matrix of the image at `base`
    /// (`rows × cols`), and whether it is a real element (inside the matrix and not in
    /// the padding); in bounds either way. Coordinates are `u32`: an input row above the
    /// top edge wraps to a huge value, so one unsigned comparison with H rejects both
    /// edges (sizes are far below 2^31).
    pub(crate) fn im2col_addr(
        &mut self,
        base: Word,
        g: &ImageGeom,
        (row, rows): (Word, Word),
        (col, cols): (Word, Word),
    ) -> R<(Word, Word)> {
        let u32 = self.ids.u32;
        let in_rows = self.lt(row, rows)?;
        let in_cols = self.lt(col, cols)?;
        let inside = self.and(in_rows, in_cols)?;
        let window = self.u(g.k[0] * g.k[1]);
        let kw = self.u(g.k[1]);
        let ow = self.u(g.ow);
        let ci = build(self.b.u_div(u32, None, row, window))?;
        let r = build(self.b.u_mod(u32, None, row, window))?;
        let ki = build(self.b.u_div(u32, None, r, kw))?;
        let kj = build(self.b.u_mod(u32, None, r, kw))?;
        let oh = build(self.b.u_div(u32, None, col, ow))?;
        let owi = build(self.b.u_mod(u32, None, col, ow))?;
        let ih = self.window_coord(oh, ki, g.s[0], g.d[0], g.p[0])?;
        let iw = self.window_coord(owi, kj, g.s[1], g.d[1], g.p[1])?;
        let (h, w) = (self.u(g.h), self.u(g.w));
        let in_h = self.lt(ih, h)?;
        let in_w = self.lt(iw, w)?;
        let inside = self.and(inside, in_h)?;
        let inside = self.and(inside, in_w)?;
        let zero = self.u(0);
        let (ci, ih, iw) = (
            build(self.b.select(u32, None, inside, ci, zero))?,
            build(self.b.select(u32, None, inside, ih, zero))?,
            build(self.b.select(u32, None, inside, iw, zero))?,
        );
        let plane = self.u(g.h * g.w);
        let index = self.mul(ci, plane)?;
        let ih_w = self.mul(ih, w)?;
        let index = self.add(index, ih_w)?;
        let index = self.add(index, iw)?;
        Ok((self.elem_addr(base, zero, zero, index)?, inside))
    }

    /// The input coordinate `o·s + k·d − p` of output coordinate `o` and window tap `k`,
    /// wrapping below 0 (see [`Body::im2col_addr`]).
    pub(crate) fn window_coord(&mut self, o: Word, k: Word, s: u32, d: u32, p: u32) -> R<Word> {
        let (s, d, p) = (self.u(s), self.u(d), self.u(p));
        let os = self.mul(o, s)?;
        let kd = self.mul(k, d)?;
        let x = self.add(os, kd)?;
        build(self.b.i_sub(self.ids.u32, None, x, p))
    }

    /// `index` into the A tile, moved to this invocation's slice.
    fn slice_a(&mut self, index: Word) -> R<Word> {
        match self.slice_offsets {
            Some((a, _)) => self.add(index, a),
            None => Ok(index),
        }
    }

    /// `index` into the B tile, moved to this invocation's slice.
    fn slice_b(&mut self, index: Word) -> R<Word> {
        match self.slice_offsets {
            Some((_, b)) => self.add(index, b),
            None => Ok(index),
        }
    }

    fn tile_ptr(&mut self, tile: Word, index: Word) -> R<Word> {
        build(self.b.access_chain(self.ids.ptr_wg, None, tile, [index]))
    }

    pub(crate) fn barrier(&mut self) -> R<()> {
        let scope = self.u(Scope::Workgroup as u32);
        let semantics =
            self.u((MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits());
        build(self.b.control_barrier(scope, scope, semantics))
    }

    fn main(
        &mut self,
        layout: &Layout,
        push: &Push,
        (wg_var, lid_var): (Word, Word),
        v3: Word,
    ) -> R<()> {
        let Ids {
            f32, u32, ptr_fn, ..
        } = self.ids;
        let entry = build(self.b.begin_block(None))?;
        // The register block lives in function variables (declared first, as SPIR-V
        // requires); drivers promote them to registers.
        let fzero = self.b.constant_bit32(f32, 0);
        let n_acc = (self.tile.block() * self.tile.block()) as usize;
        let acc: Vec<Word> = (0..n_acc)
            .map(|_| {
                self.b
                    .variable(ptr_fn, None, StorageClass::Function, Some(fzero))
            })
            .collect();

        let wg = build(self.b.load(v3, None, wg_var, None, []))?;
        let lid = build(self.b.load(v3, None, lid_var, None, []))?;
        let tx = build(self.b.composite_extract(u32, None, lid, [0]))?;
        let ty = build(self.b.composite_extract(u32, None, lid, [1]))?;
        let wx = build(self.b.composite_extract(u32, None, wg, [0]))?;
        let wy = build(self.b.composite_extract(u32, None, wg, [1]))?;
        let wz = build(self.b.composite_extract(u32, None, wg, [2]))?;
        let ops = self.operands(layout, push, wz)?;
        let Operands {
            m,
            n,
            k,
            a_base,
            b_base,
            c_base,
            ..
        } = ops;
        let zero32 = self.u(0);
        // A sliced tile: this invocation's K slice, and where its tiles sit.
        let slices = self.tile.slices();
        let slice = build(self.b.composite_extract(u32, None, lid, [2]))?;
        if slices > 1 {
            let a_step = self.u(KSTEP * self.tile.a_row());
            let b_step = self.u(KSTEP * self.tile.size());
            let a_off = self.mul(slice, a_step)?;
            let b_off = self.mul(slice, b_step)?;
            self.slice_offsets = Some((a_off, b_off));
        }
        let tile = self.u(self.tile.size());
        let n0 = self.mul(wx, tile)?;
        let m0 = self.mul(wy, tile)?;
        let threads = self.u(THREADS);
        let flat = self.mul(ty, threads)?;
        let flat = self.add(flat, tx)?;
        let epilogue = Epilogue {
            steps: &layout.steps,
            addrs: &ops.addrs,
            c_off: ops.c_off,
            batch: wz,
            m,
        };

        // for (kb = 0; kb < K; kb += KSTEP · slices), slice s staging k0 = kb + s · KSTEP
        // (past K, its loads read zeros): every slice runs the same trip count, so all reach
        // the loop's barriers.
        let (header, cond, body, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let k0_next = self.b.id();
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(header)))?;
        let kb = build(self.b.phi(u32, None, [(zero32, entry), (k0_next, cont)]))?;
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;
        build(self.b.begin_block(Some(cond)))?;
        let more = self.lt(kb, k)?;
        build(self.b.branch_conditional(more, body, merge, []))?;

        build(self.b.begin_block(Some(body)))?;
        let k0 = if slices > 1 {
            let kstep = self.u(KSTEP);
            let skip = self.mul(slice, kstep)?;
            self.add(kb, skip)?
        } else {
            kb
        };
        self.stage_tiles(
            (flat, m0, n0, k0),
            (m, n, k),
            (a_base, b_base),
            layout.b_source,
        )?;
        self.barrier()?;
        self.accumulate(&acc, tx, ty)?;
        self.barrier()?;
        build(self.b.branch(cont))?;

        build(self.b.begin_block(Some(cont)))?;
        let kstep = self.u(KSTEP * slices);
        build(self.b.i_add(u32, Some(k0_next), kb, kstep))?;
        build(self.b.branch(header))?;

        build(self.b.begin_block(Some(merge)))?;
        if slices > 1 {
            self.combine_slices(&acc, slice, (tx, ty))?;
            // Only slice 0 holds the sums now.
            let first = build(self.b.i_equal(self.ids.bool, None, slice, zero32))?;
            let (then, done) = (self.b.id(), self.b.id());
            build(self.b.selection_merge(done, SelectionControl::NONE))?;
            build(self.b.branch_conditional(first, then, done, []))?;
            build(self.b.begin_block(Some(then)))?;
            self.store_block(&acc, (tx, ty), (m0, n0), (m, n), c_base, &epilogue)?;
            build(self.b.branch(done))?;
            build(self.b.begin_block(Some(done)))?;
        } else {
            self.store_block(&acc, (tx, ty), (m0, n0), (m, n), c_base, &epilogue)?;
        }
        build(self.b.ret())
    }

    /// Reads the push constants and computes batch entry `wz`'s matrices: A and C advance
    /// by a matrix each, B too unless shared (a convolution's image by one image, its
    /// filter shared).
    pub(crate) fn operands(&mut self, layout: &Layout, push: &Push, wz: Word) -> R<Operands> {
        let (u32, u64) = (self.ids.u32, self.ids.u64);
        let nb = layout.bindings as u32;
        let addrs = (0..nb)
            .map(|i| push.member(&mut self.b, (u32, u64), i, true))
            .collect::<R<Vec<Word>>>()?;
        let (a_addr, b_addr, c_addr) = (addrs[layout.a], addrs[layout.b], addrs[layout.c]);
        let m = push.member(&mut self.b, (u32, u64), nb, false)?;
        let n = push.member(&mut self.b, (u32, u64), nb + 1, false)?;
        let k = push.member(&mut self.b, (u32, u64), nb + 2, false)?;
        let b_shared = push.member(&mut self.b, (u32, u64), nb + 3, false)?;
        let four = self.esize();
        let batch = self.wide(wz)?;
        let (m64, n64, k64) = (self.wide(m)?, self.wide(n)?, self.wide(k)?);
        let zero32 = self.u(0);
        let (a_base, b_base) = match layout.b_source {
            BSource::Matrix | BSource::MatrixT => {
                let mk = self.mul64(m64, k64)?;
                let a_off = self.mul64(batch, mk)?;
                let a_off = self.mul64(a_off, four)?;
                let a_base = self.add64(a_addr, a_off)?;
                let kn = self.mul64(k64, n64)?;
                let b_off = self.mul64(batch, kn)?;
                let b_off = self.mul64(b_off, four)?;
                let shared = build(self.b.i_not_equal(self.ids.bool, None, b_shared, zero32))?;
                let zero64 = self.u64c(0);
                let b_off = build(self.b.select(u64, None, shared, zero64, b_off))?;
                (a_base, self.add64(b_addr, b_off)?)
            }
            BSource::Image(g) => {
                let size = self.elem.bytes() as u64;
                let image = self.u64c(g.c as u64 * g.h as u64 * g.w as u64 * size);
                let b_off = self.mul64(batch, image)?;
                (a_addr, self.add64(b_addr, b_off)?)
            }
        };
        let mn = self.mul64(m64, n64)?;
        let c_off = self.mul64(batch, mn)?;
        let c_off = self.mul64(c_off, four)?;
        let c_base = self.add64(c_addr, c_off)?;
        Ok(Operands {
            addrs,
            m,
            n,
            k,
            a_base,
            b_base,
            c_base,
            c_off,
        })
    }

    /// A sliced tile's reduction: slices 1.. write their register blocks to workgroup
    /// memory, a barrier, and slice 0 adds them to its own (in slice order, so the sum's
    /// rounding does not depend on timing).
    fn combine_slices(&mut self, acc: &[Word], slice: Word, (tx, ty): (Word, Word)) -> R<()> {
        let Ids { f32, bool, .. } = self.ids;
        let red = self.red_tile.expect("a sliced tile has a reduction array");
        let (size, block) = (self.tile.size(), self.tile.block());
        let zero = self.u(0);
        // This invocation's element (ty + 16 i, tx + 16 j) of the tile, in slice `s`'s part.
        let index = |e: &mut Body, s: Word, i: u32, j: u32| -> R<Word> {
            let row_off = e.u(i * THREADS);
            let row = e.add(ty, row_off)?;
            let width = e.u(size);
            let at = e.mul(row, width)?;
            let col_off = e.u(j * THREADS);
            let at = e.add(at, col_off)?;
            let at = e.add(at, tx)?;
            let part = e.u(size * size);
            let base = e.mul(s, part)?;
            e.add(base, at)
        };
        let one = self.u(1);
        let not_first = build(self.b.i_not_equal(bool, None, slice, zero))?;
        let (then, done) = (self.b.id(), self.b.id());
        build(self.b.selection_merge(done, SelectionControl::NONE))?;
        build(self.b.branch_conditional(not_first, then, done, []))?;
        build(self.b.begin_block(Some(then)))?;
        let part = build(self.b.i_sub(self.ids.u32, None, slice, one))?;
        for i in 0..block {
            for j in 0..block {
                let v = build(
                    self.b
                        .load(f32, None, acc[(i * block + j) as usize], None, []),
                )?;
                let at = index(self, part, i, j)?;
                let p = self.tile_ptr(red, at)?;
                build(self.b.store(p, v, None, []))?;
            }
        }
        build(self.b.branch(done))?;
        build(self.b.begin_block(Some(done)))?;
        self.barrier()?;
        for i in 0..block {
            for j in 0..block {
                let var = acc[(i * block + j) as usize];
                let mut sum = build(self.b.load(f32, None, var, None, []))?;
                for s in 0..self.tile.slices() - 1 {
                    let part = self.u(s);
                    let at = index(self, part, i, j)?;
                    let p = self.tile_ptr(red, at)?;
                    let v = build(self.b.load(f32, None, p, None, []))?;
                    sum = build(self.b.f_add(f32, None, sum, v))?;
                }
                build(self.b.store(var, sum, None, []))?;
            }
        }
        Ok(())
    }

    /// Every invocation stages 4 elements of A's 64×16 slice (transposed) and 4 of B's
    /// 16×64 slice; consecutive invocations read consecutive addresses.
    fn stage_tiles(
        &mut self,
        (flat, m0, n0, k0): (Word, Word, Word, Word),
        (m, n, k): (Word, Word, Word),
        (a_base, b_base): (Word, Word),
        b_source: BSource,
    ) -> R<()> {
        let size = self.tile.size();
        let per_thread = size * KSTEP / (THREADS * THREADS);
        let (a_tile, b_tile) = (self.ids.a_tile, self.ids.b_tile);
        for r in 0..per_thread {
            let step = self.u(r * THREADS * THREADS);
            let lin = self.add(flat, step)?;
            // A: kk fastest (a row's K run), then the row.
            let kmask = self.u(KSTEP - 1);
            let kk = build(self.b.bitwise_and(self.ids.u32, None, lin, kmask))?;
            let kshift = self.u(KSTEP.trailing_zeros());
            let ml = build(self.b.shift_right_logical(self.ids.u32, None, lin, kshift))?;
            let row = self.add(m0, ml)?;
            let col = self.add(k0, kk)?;
            let v = self.load_or_zero(a_base, (row, m), (col, k))?;
            let a_row = self.u(self.tile.a_row());
            let at = self.mul(kk, a_row)?;
            let at = self.add(at, ml)?;
            let at = self.slice_a(at)?;
            let p = self.tile_ptr(a_tile, at)?;
            build(self.b.store(p, v, None, []))?;
            // B: the column fastest, then kk.
            let nmask = self.u(size - 1);
            let nl = build(self.b.bitwise_and(self.ids.u32, None, lin, nmask))?;
            let nshift = self.u(size.trailing_zeros());
            let kk = build(self.b.shift_right_logical(self.ids.u32, None, lin, nshift))?;
            let row = self.add(k0, kk)?;
            let col = self.add(n0, nl)?;
            let v = match b_source {
                BSource::Matrix => self.load_or_zero(b_base, (row, k), (col, n))?,
                // Element (k, n) of Bᵀ is at n·K + k.
                BSource::MatrixT => self.load_or_zero(b_base, (col, n), (row, k))?,
                BSource::Image(g) => self.load_im2col(b_base, &g, (row, k), (col, n))?,
            };
            let tile = self.u(size);
            let bt = self.mul(kk, tile)?;
            let bt = self.add(bt, nl)?;
            let bt = self.slice_b(bt)?;
            let p = self.tile_ptr(b_tile, bt)?;
            build(self.b.store(p, v, None, []))?;
        }
        Ok(())
    }

    /// acc[i][j] += A[ty + 16 i][kk] * B[kk][tx + 16 j] for the staged kk, unrolled.
    fn accumulate(&mut self, acc: &[Word], tx: Word, ty: Word) -> R<()> {
        let Ids {
            f32,
            glsl,
            a_tile,
            b_tile,
            ..
        } = self.ids;
        let mut sums = Vec::with_capacity(acc.len());
        for &var in acc {
            sums.push(build(self.b.load(f32, None, var, None, []))?);
        }
        let (size, block, a_row) = (self.tile.size(), self.tile.block(), self.tile.a_row());
        for kk in 0..KSTEP {
            let mut a = Vec::new();
            let mut bv = Vec::new();
            for i in 0..block {
                let off = self.u(kk * a_row + i * THREADS);
                let at = self.add(ty, off)?;
                let at = self.slice_a(at)?;
                let p = self.tile_ptr(a_tile, at)?;
                a.push(build(self.b.load(f32, None, p, None, []))?);
                let off = self.u(kk * size + i * THREADS);
                let bt = self.add(tx, off)?;
                let bt = self.slice_b(bt)?;
                let p = self.tile_ptr(b_tile, bt)?;
                bv.push(build(self.b.load(f32, None, p, None, []))?);
            }
            for i in 0..block as usize {
                for j in 0..block as usize {
                    let s = &mut sums[i * block as usize + j];
                    *s = build(self.b.ext_inst(
                        f32,
                        None,
                        glsl,
                        GLSL_FMA,
                        [Arg::IdRef(a[i]), Arg::IdRef(bv[j]), Arg::IdRef(*s)],
                    ))?;
                }
            }
        }
        for (&var, &s) in acc.iter().zip(&sums) {
            build(self.b.store(var, s, None, []))?;
        }
        Ok(())
    }

    /// Loads the element at `addr` (a u64 byte address) as an f32.
    pub(crate) fn load_at(&mut self, addr: Word) -> R<Word> {
        elem::load(&mut self.b, self.elem, self.ids.f32, addr)
    }

    /// Stores the f32 `v` as the element at `addr` (a u64 byte address).
    pub(crate) fn store_at(&mut self, addr: Word, v: Word) -> R<()> {
        elem::store(&mut self.b, self.elem, self.ids.f32, addr, v)
    }

    /// An epilogue operand's value for C's element `(row, col)` (C has `n` columns).
    fn load_src(
        &mut self,
        e: &Epilogue<'_>,
        src: &Src,
        (row, col): (Word, Word),
        n: Word,
    ) -> R<Word> {
        let f32 = self.ids.f32;
        let indexed = |me: &mut Body, i: usize, index: Word| -> R<Word> {
            let four = me.esize();
            let index = me.wide(index)?;
            let off = me.mul64(index, four)?;
            let addr = me.add64(e.addrs[i], off)?;
            me.load_at(addr)
        };
        match *src {
            Src::Const(c) => Ok(self.b.constant_bit32(f32, c.to_bits())),
            Src::Scalar(i) => self.load_at(e.addrs[i]),
            Src::Row(i) => indexed(self, i, col),
            Src::PerRow(i) => indexed(self, i, row),
            Src::ConstRow(i) | Src::ConstCol(i) => {
                let at = if matches!(src, Src::ConstRow(_)) {
                    row
                } else {
                    col
                };
                let ptr_private = self.b.type_pointer(None, StorageClass::Private, f32);
                let p = build(
                    self.b
                        .access_chain(ptr_private, None, self.const_rows[i], [at]),
                )?;
                build(self.b.load(f32, None, p, None, []))
            }
            Src::Bcast {
                i,
                row: follows_rows,
                col: follows_cols,
                ref batch,
            } => {
                // Matrix index from C's batch entry, then the element in it.
                let mut at: Option<Word> = None;
                for &(divisor, size, stride) in batch {
                    let mut c = e.batch;
                    if divisor != 1 {
                        let d = self.u(divisor);
                        c = build(self.b.u_div(self.ids.u32, None, c, d))?;
                    }
                    if size != 0 {
                        let s = self.u(size);
                        c = build(self.b.u_mod(self.ids.u32, None, c, s))?;
                    }
                    if stride != 1 {
                        let s = self.u(stride);
                        c = self.mul(c, s)?;
                    }
                    at = Some(match at {
                        Some(a) => self.add(a, c)?,
                        None => c,
                    });
                }
                let one = self.u(1);
                let rows = if follows_rows { e.m } else { one };
                let cols = if follows_cols { n } else { one };
                let zero = self.u64c(0);
                let mut off = zero;
                if let Some(at) = at {
                    let at = self.wide(at)?;
                    let (r64, c64) = (self.wide(rows)?, self.wide(cols)?);
                    let size = self.mul64(r64, c64)?;
                    off = self.mul64(at, size)?;
                }
                if follows_rows {
                    let r = self.wide(row)?;
                    let c64 = self.wide(cols)?;
                    let r = self.mul64(r, c64)?;
                    off = self.add64(off, r)?;
                }
                if follows_cols {
                    let c = self.wide(col)?;
                    off = self.add64(off, c)?;
                }
                let size = self.esize();
                let off = self.mul64(off, size)?;
                let addr = self.add64(e.addrs[i], off)?;
                self.load_at(addr)
            }
            Src::Full(i) => {
                let base = self.add64(e.addrs[i], e.c_off)?;
                let addr = self.elem_addr(base, row, n, col)?;
                self.load_at(addr)
            }
        }
    }

    /// The epilogue on the value `x` of C's element `(row, col)` (C has `n` columns).
    pub(crate) fn apply(
        &mut self,
        e: &Epilogue<'_>,
        mut x: Word,
        (row, col): (Word, Word),
        n: Word,
    ) -> R<Word> {
        let f32 = self.ids.f32;
        for step in e.steps {
            x = match step {
                Step::Round => elem::round_to_half(&mut self.b, f32, x)?,
                Step::Relu => {
                    // `x < 0 ? 0 : x`, which keeps NaN (GLSL's max leaves it undefined).
                    let zero = self.b.constant_bit32(f32, 0);
                    let neg = build(self.b.f_ord_less_than(self.ids.bool, None, x, zero))?;
                    build(self.b.select(f32, None, neg, zero, x))?
                }
                Step::Activation(act) => {
                    let mut m = crate::epilogue_math::Math {
                        b: &mut self.b,
                        f32,
                        bool: self.ids.bool,
                        glsl: self.ids.glsl,
                    };
                    match act {
                        Activation::Sigmoid => m.sigmoid(x)?,
                        Activation::Tanh => m.tanh(x)?,
                        Activation::Gelu { tanh_form } => m.gelu(x, *tanh_form)?,
                    }
                }
                Step::Clip(lo, hi) => {
                    // Ordered comparisons, so NaN passes through unchanged.
                    if let Some(lo) = lo {
                        let lo = self.load_src(e, lo, (row, col), n)?;
                        let below = build(self.b.f_ord_less_than(self.ids.bool, None, x, lo))?;
                        x = build(self.b.select(f32, None, below, lo, x))?;
                    }
                    if let Some(hi) = hi {
                        let hi = self.load_src(e, hi, (row, col), n)?;
                        let above = build(self.b.f_ord_greater_than(self.ids.bool, None, x, hi))?;
                        x = build(self.b.select(f32, None, above, hi, x))?;
                    }
                    x
                }
                Step::Binary(op, src, x_left) => {
                    let s = self.load_src(e, src, (row, col), n)?;
                    let (l, r) = if *x_left { (x, s) } else { (s, x) };
                    match op {
                        BinaryOp::Add => build(self.b.f_add(f32, None, l, r))?,
                        BinaryOp::Sub => build(self.b.f_sub(f32, None, l, r))?,
                        BinaryOp::Mul => build(self.b.f_mul(f32, None, l, r))?,
                        BinaryOp::Div => build(self.b.f_div(f32, None, l, r))?,
                        _ => return Err(format!("epilogue op {op:?} is not generated")),
                    }
                }
            };
        }
        Ok(x)
    }

    /// Stores the register block's elements that lie inside C.
    fn store_block(
        &mut self,
        acc: &[Word],
        (tx, ty): (Word, Word),
        (m0, n0): (Word, Word),
        (m, n): (Word, Word),
        c_base: Word,
        epilogue: &Epilogue<'_>,
    ) -> R<()> {
        let f32 = self.ids.f32;
        let block = self.tile.block();
        for i in 0..block {
            for j in 0..block {
                let off = self.u(i * THREADS);
                let row = self.add(m0, ty)?;
                let row = self.add(row, off)?;
                let off = self.u(j * THREADS);
                let col = self.add(n0, tx)?;
                let col = self.add(col, off)?;
                let in_rows = self.lt(row, m)?;
                let in_cols = self.lt(col, n)?;
                let inside = self.and(in_rows, in_cols)?;
                let (then, done) = (self.b.id(), self.b.id());
                build(self.b.selection_merge(done, SelectionControl::NONE))?;
                build(self.b.branch_conditional(inside, then, done, []))?;
                build(self.b.begin_block(Some(then)))?;
                let v = build(
                    self.b
                        .load(f32, None, acc[(i * block + j) as usize], None, []),
                )?;
                let v = self.apply(epilogue, v, (row, col), n)?;
                let addr = self.elem_addr(c_base, row, n, col)?;
                self.store_at(addr, v)?;
                build(self.b.branch(done))?;
                build(self.b.begin_block(Some(done)))?;
            }
        }
        Ok(())
    }
}
