//! ONNX `Trilu`: the upper or lower triangle of the last two dims (static) of a tensor of
//! any element type the generator stores (floats, bools, 8- to 64-bit integers), the
//! diagonal offset `k` a constant or read from its binding at run time.
//!
//! One invocation per output element, in the grid-stride loop of [`crate::grid`]: element
//! `i` is at row `(i / cols) % rows`, column `i % cols`, and keeps its value when
//! `col - row >= k` (upper) or `<= k` (lower), else 0, as the reference does. Floats go
//! through f32 (exact for f16), integers through 64-bit registers, so every value is
//! copied bit-exactly.

use rafter_ir::{Graph, Op, ValueDef};
use rspirv::dr::Builder;
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// A generated trilu kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct TriluKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// Where `k` comes from.
enum Offset {
    Const(i64),
    Binding(usize),
}

struct Layout {
    elem: Elem,
    data: usize,
    k: Offset,
    rows: u32,
    cols: u32,
    upper: bool,
    bindings: usize,
}

/// Generates a body holding one `trilu` of a body input whose last two dims are static,
/// its result the body's one output.
pub fn trilu(body: &Graph) -> Result<TriluKernel, String> {
    let node = grid::one_node(body, "trilu")?;
    let Op::Trilu { upper } = node.op else {
        return Err(format!("op `{}` is not a trilu", node.op.name()));
    };
    let data = grid::body_input(body, node, 0, "trilu data")?;
    let k = match node.input(1).map(|v| (v, &body.value(v).def)) {
        None => Offset::Const(0),
        Some((_, ValueDef::Input(b))) => Offset::Binding(*b),
        Some((_, ValueDef::Const(c))) => match body.constant(*c).to_i64s().as_deref() {
            Some([k]) => Offset::Const(*k),
            _ => return Err("trilu k is not one integer".into()),
        },
        Some((v, _)) => {
            return Err(format!(
                "trilu k %{} is computed in the kernel",
                body.value(v).name
            ))
        }
    };
    if let Offset::Binding(b) = k {
        if body.value(body.inputs[b]).ty.dtype != rafter_ir::DType::I64 {
            return Err("trilu k is not an i64".into());
        }
    }
    let ty = &body.value(body.inputs[data]).ty;
    let elem = Elem::of_any(ty.dtype).map_err(|e| format!("trilu data is {e}"))?;
    if ty.rank() < 2 {
        return Err(format!("trilu of rank {}", ty.rank()));
    }
    let dims = grid::static_dims_from(ty, ty.rank() - 2, "trilu data")?;
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the trilu's result must be the body's one output".into());
    }
    grid::product_u32(&dims, "trilu matrix")?;
    let layout = Layout {
        elem,
        data,
        k,
        // An empty matrix launches nothing; 1 keeps the module free of a division by 0.
        rows: (dims[0] as u32).max(1),
        cols: (dims[1] as u32).max(1),
        upper,
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(TriluKernel { spirv })
}

/// Output element `i`: its row and column, whether it is kept, the copy or 0.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let i64t = b.type_int(64, 1);
    let (rest, col) = grid::div_mod(b, u32, e.i, l.cols)?;
    let (_, row) = grid::div_mod(b, u32, rest, l.rows)?;
    let col = build(b.u_convert(u64, None, col))?;
    let row = build(b.u_convert(u64, None, row))?;
    let d = build(b.i_sub(u64, None, col, row))?;
    let d = build(b.bitcast(i64t, None, d))?;
    let k = match l.k {
        Offset::Const(k) => b.constant_bit64(i64t, k as u64),
        Offset::Binding(binding) => elem::load_int(b, Elem::I64, i64t, e.addrs[binding])?,
    };
    // Kept where col - row >= k (upper) or <= k (lower).
    let keep = if l.upper {
        build(b.s_greater_than_equal(bool, None, d, k))?
    } else {
        build(b.s_less_than_equal(bool, None, d, k))?
    };
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let src = grid::element_addr(b, u64, e.addrs[l.data], i64, l.elem.bytes())?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    copy_or_zero(b, (f32, i64t), l.elem, (src, dst), keep)
}

/// Stores the element at `src` to `dst` where `keep`, else 0: floats through f32,
/// everything else through an i64 register.
fn copy_or_zero(
    b: &mut Builder,
    (f32, i64t): (Word, Word),
    elem: Elem,
    (src, dst): (Word, Word),
    keep: Word,
) -> R<()> {
    if matches!(elem, Elem::F32 | Elem::F16) {
        let v = elem::load(b, elem, f32, src)?;
        let zero = b.constant_bit32(f32, 0);
        let v = build(b.select(f32, None, keep, v, zero))?;
        elem::store(b, elem, f32, dst, v)
    } else {
        let v = elem::load_int(b, elem, i64t, src)?;
        let zero = b.constant_bit64(i64t, 0);
        let v = build(b.select(i64t, None, keep, v, zero))?;
        elem::store_int(b, elem, i64t, dst, v)
    }
}
