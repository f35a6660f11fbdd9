//! `gather` along axis 0 of a 2-D f32 or f16 table by i64 indices: an embedding lookup
//! (BERT's word, position and token-type embeddings).
//!
//! One invocation per output element, in a grid-stride loop over the count param (the
//! elementwise launch): element `i` is column `i % D` of table row `ids[i / D]`. Indices
//! are read as 64-bit integers; a negative one counts from the end, as ONNX says. An index
//! outside the table after that is invalid input, which a kernel cannot report: it reads
//! row 0 instead of an address past the table (a device address must never be dereferenced
//! beyond its buffer) and writes NaN, so the output shows it. The table's dims are static
//! (it is a weight), the indices' may be symbolic.

use rafter_ir::{Graph, Op, ValueDef};
use rspirv::binary::Assemble;
use rspirv::dr::Builder;
use rspirv::spirv::{BuiltIn, LoopControl, MemoryAccess, StorageClass, Word};

use crate::elem::{self, Elem};
use crate::matmul::{begin_main, build, builtin_v3, prelude, push_block, Prelude, R};
use crate::WORKGROUP_SIZE;

/// A generated gather kernel; launched like an elementwise kernel (one `u32` param, the
/// output's element count).
#[derive(Debug, Clone)]
pub struct GatherKernel {
    /// The SPIR-V module (entry point `main`); bindings: table, indices, output.
    pub spirv: Vec<u32>,
}

/// The table's shape and element type, and where the operands are bound.
struct Layout {
    rows: u32,
    cols: u32,
    elem: Elem,
    table: usize,
    ids: usize,
    bindings: usize,
}

/// Generates a body holding one `gather{axis = 0}` of a static 2-D f32/f16 table (a body
/// input) by an i64 index tensor (a body input), its result the body's one output.
pub fn gather(body: &Graph) -> Result<GatherKernel, String> {
    let [node] = body.nodes.as_slice() else {
        return Err("a gather kernel is one gather node (nothing fused)".into());
    };
    let Op::Gather { axis } = node.op else {
        return Err(format!("op `{}` is not a gather", node.op.name()));
    };
    let input = |i: usize| match node.input(i).map(|v| &body.value(v).def) {
        Some(ValueDef::Input(b)) => Ok(*b),
        _ => Err(format!("gather operand {i} is not a body input")),
    };
    let (table, ids) = (input(0)?, input(1)?);
    let table_ty = &body.value(body.inputs[table]).ty;
    let ids_ty = &body.value(body.inputs[ids]).ty;
    if table_ty.rank() != 2 || !(axis == 0 || axis == -2) {
        return Err(format!(
            "gather along axis {axis} of a rank-{} table; only axis 0 of a 2-D table (an \
             embedding lookup) is generated",
            table_ty.rank()
        ));
    }
    if ids_ty.dtype != rafter_ir::DType::I64 {
        return Err(format!(
            "gather indices are {}; i64 is generated",
            ids_ty.dtype
        ));
    }
    let elem = Elem::of(table_ty.dtype).map_err(|e| format!("the table is {e}"))?;
    let known = |i: usize| {
        table_ty.dims[i]
            .as_known()
            .and_then(|d| u32::try_from(d).ok())
            .filter(|&d| d > 0)
            .ok_or_else(|| {
                format!(
                    "table dim {i} is {} (a static size is generated)",
                    table_ty.dims[i]
                )
            })
    };
    let (rows, cols) = (known(0)?, known(1)?);
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the gather's result must be the body's one output".into());
    }
    let layout = Layout {
        rows,
        cols,
        elem,
        table,
        ids,
        bindings: body.inputs.len() + 1,
    };
    Ok(GatherKernel {
        spirv: emit(&layout)?,
    })
}

fn emit(l: &Layout) -> R<Vec<u32>> {
    let mut b = Builder::new();
    let t = prelude(&mut b);
    let Prelude {
        void,
        u32,
        u64,
        bool,
        ..
    } = t;
    let nb = l.bindings as u32;
    let push = push_block(&mut b, &t, nb, 1);
    let v3 = b.type_vector(u32, 3);
    let gid_var = builtin_v3(&mut b, u32, BuiltIn::GlobalInvocationId);
    let nwg_var = builtin_v3(&mut b, u32, BuiltIn::NumWorkgroups);
    begin_main(
        &mut b,
        void,
        vec![push.var, gid_var, nwg_var],
        [WORKGROUP_SIZE, 1, 1],
    )?;
    let entry = build(b.begin_block(None))?;
    let addrs = (0..nb)
        .map(|i| push.member(&mut b, (u32, u64), i, true))
        .collect::<R<Vec<Word>>>()?;
    let count = push.member(&mut b, (u32, u64), nb, false)?;
    let gid = build(b.load(v3, None, gid_var, None, []))?;
    let first = build(b.composite_extract(u32, None, gid, [0]))?;
    let nwg = build(b.load(v3, None, nwg_var, None, []))?;
    let groups = build(b.composite_extract(u32, None, nwg, [0]))?;
    // NumWorkgroups read as at least 1, so the loop's stride is never 0 (see elementwise.rs).
    let (zero, one) = (b.constant_bit32(u32, 0), b.constant_bit32(u32, 1));
    let none = build(b.i_equal(bool, None, groups, zero))?;
    let groups = build(b.select(u32, None, none, one, groups))?;
    let size = b.constant_bit32(u32, WORKGROUP_SIZE);
    let stride = build(b.i_mul(u32, None, groups, size))?;

    // for (i = first; i < count; i += stride)
    let (header, cond, body, cont, merge) = (b.id(), b.id(), b.id(), b.id(), b.id());
    let next = b.id();
    build(b.branch(header))?;
    build(b.begin_block(Some(header)))?;
    let i = build(b.phi(u32, None, [(first, entry), (next, cont)]))?;
    build(b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(b.branch(cond))?;
    build(b.begin_block(Some(cond)))?;
    let more = build(b.u_less_than(bool, None, i, count))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    element(&mut b, &t, l, &addrs, i)?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    build(b.i_add(u32, Some(next), i, stride))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    build(b.ret())?;
    build(b.end_function())?;
    Ok(b.module().assemble())
}

/// Output element `i`: its index (row) and column, the table element, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, addrs: &[Word], i: Word) -> R<()> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    let cols = b.constant_bit32(u32, l.cols);
    let row = build(b.u_div(u32, None, i, cols))?;
    let col = build(b.u_mod(u32, None, i, cols))?;
    // The index: 8 bytes at ids + row * 8, two's complement.
    let row64 = build(b.u_convert(u64, None, row))?;
    let eight = b.constant_bit64(u64, 8);
    let off = build(b.i_mul(u64, None, row64, eight))?;
    let at = build(b.i_add(u64, None, addrs[l.ids], off))?;
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, u64);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, at))?;
    let align = [rspirv::dr::Operand::LiteralBit32(8)];
    let index = build(b.load(u64, None, ptr, Some(MemoryAccess::ALIGNED), align))?;
    // Negative counts from the end; then one unsigned comparison checks both edges.
    let zero64 = b.constant_bit64(u64, 0);
    let rows = b.constant_bit64(u64, l.rows as u64);
    let negative = build(b.s_less_than(bool, None, index, zero64))?;
    let wrapped = build(b.i_add(u64, None, index, rows))?;
    let index = build(b.select(u64, None, negative, wrapped, index))?;
    let valid = build(b.u_less_than(bool, None, index, rows))?;
    let index = build(b.select(u64, None, valid, index, zero64))?;
    // The element: table + (index * D + col) * size.
    let cols64 = b.constant_bit64(u64, l.cols as u64);
    let col64 = build(b.u_convert(u64, None, col))?;
    let flat = build(b.i_mul(u64, None, index, cols64))?;
    let flat = build(b.i_add(u64, None, flat, col64))?;
    let size = b.constant_bit64(u64, l.elem.bytes() as u64);
    let off = build(b.i_mul(u64, None, flat, size))?;
    let at = build(b.i_add(u64, None, addrs[l.table], off))?;
    let v = elem::load(b, l.elem, f32, at)?;
    let nan = b.constant_bit32(f32, 0x7FC0_0000);
    let v = build(b.select(f32, None, valid, v, nan))?;
    let i64 = build(b.u_convert(u64, None, i))?;
    let off = build(b.i_mul(u64, None, i64, size))?;
    let out = build(b.i_add(u64, None, addrs[l.bindings - 1], off))?;
    elem::store(b, l.elem, f32, out, v)
}
