//! The scaffolding the data-movement kernels share ([`crate::gather`], [`crate::slice`],
//! concat, arg-reduce): one invocation per output element, in a grid-stride loop over the
//! count param (the elementwise launch), so any element count fits in the device's
//! workgroup-count limit. Each kernel only says what one output element `i` is; keeping
//! the loop here means a fix to it (the zero-workgroup guard) is made once.

use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand};
use rspirv::spirv::{BuiltIn, LoopControl, Word};

use crate::matmul::{begin_main, build, builtin_v3, prelude, push_block, Prelude, R};
use crate::WORKGROUP_SIZE;

/// The most buffers a dispatch passes inline: the runtime pushes each binding's 64-bit
/// address, then the params, and Vulkan guarantees 128 bytes of push constants (lavapipe's
/// limit). A kernel of more bindings reads the same block through memory, its address
/// pushed instead ([`crate::matmul::push_block`]); `rafter-hal-vulkan`'s `INLINE_BINDINGS`
/// is the same number (a test checks it).
pub const INLINE_BINDINGS: usize = 8;

/// The most buffers one dispatch may bind (`rafter-hal-vulkan`'s `MAX_BINDINGS`): a
/// kernel over it stays on the CPU rather than failing at dispatch.
pub const MAX_BINDINGS: usize = 64;

/// GLSL.std.450's `UMax`.
pub(crate) const GLSL_UMAX: u32 = 41;

/// What the per-element emitter sees: the binding addresses (body inputs, then outputs),
/// the count param, the dim params ([`module_with_params`]) and the element index `i`, all
/// `u32` but the `u64` addresses.
pub(crate) struct Element<'a> {
    pub(crate) addrs: &'a [Word],
    pub(crate) count: Word,
    pub(crate) params: &'a [Word],
    pub(crate) i: Word,
}

/// A module of `bindings` buffer addresses and one `u32` param (the output's element
/// count) whose `main` runs `element` for every output element. `element` emits into an
/// open block and must leave one open (it may emit loops and branches of its own).
pub(crate) fn module(
    bindings: usize,
    element: impl FnOnce(&mut Builder, &Prelude, Element) -> R<()>,
) -> R<Vec<u32>> {
    module_scaled(bindings, (1, 1), 0, element)
}

/// [`module`] that also reads `params` `u32` dim params pushed after the count (the
/// module's [`rafter_vulkan_section::DimParam`]s, in order): a kernel over tensors whose
/// dims are symbolic reads the call's sizes there rather than baking them in.
pub(crate) fn module_with_params(
    bindings: usize,
    params: usize,
    element: impl FnOnce(&mut Builder, &Prelude, Element) -> R<()>,
) -> R<Vec<u32>> {
    if params > rafter_vulkan_section::MAX_DIM_PARAMS {
        return Err(format!(
            "{params} dim params exceed the {} a module takes",
            rafter_vulkan_section::MAX_DIM_PARAMS
        ));
    }
    module_scaled(bindings, (1, 1), params, element)
}

/// [`module`] whose loop runs over `count / div * mul` elements rather than the count
/// param (the first output's element count): a kernel whose work is not its first output
/// (a split, one invocation per *input* element: the first output holds `div` of every
/// `mul` positions along the axis). The grid is still sized by the count; the grid-stride
/// loop covers the rest.
pub(crate) fn module_scaled(
    bindings: usize,
    (mul, div): (u32, u32),
    params: usize,
    element: impl FnOnce(&mut Builder, &Prelude, Element) -> R<()>,
) -> R<Vec<u32>> {
    let mut b = Builder::new();
    let t = prelude(&mut b);
    let Prelude {
        void,
        u32,
        u64,
        bool,
        ..
    } = t;
    let nb = bindings as u32;
    let push = push_block(&mut b, &t, nb, 1 + params as u32);
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
    let params = (0..params as u32)
        .map(|k| push.member(&mut b, (u32, u64), nb + 1 + k, false))
        .collect::<R<Vec<Word>>>()?;
    let limit = if mul == div {
        count
    } else {
        let (m, d) = (b.constant_bit32(u32, mul), b.constant_bit32(u32, div));
        let parts = build(b.u_div(u32, None, count, d))?;
        build(b.i_mul(u32, None, parts, m))?
    };
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
    let more = build(b.u_less_than(bool, None, i, limit))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    element(
        &mut b,
        &t,
        Element {
            addrs: &addrs,
            count,
            params: &params,
            i,
        },
    )?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    build(b.i_add(u32, Some(next), i, stride))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    build(b.ret())?;
    build(b.end_function())?;
    Ok(b.module().assemble())
}

/// `a / d` and `a % d` of a `u32` by a constant, skipping the instructions where `d` is 1
/// (quotient `a`, remainder 0).
pub(crate) fn div_mod(b: &mut Builder, u32: Word, a: Word, d: u32) -> R<(Word, Word)> {
    if d == 1 {
        return Ok((a, b.constant_bit32(u32, 0)));
    }
    let dc = b.constant_bit32(u32, d);
    Ok((
        build(b.u_div(u32, None, a, dc))?,
        build(b.u_mod(u32, None, a, dc))?,
    ))
}

/// Element index `i` of a row-major block with innermost `dims` as its coordinates there
/// (`coords[d]` along `dims[d]`) and the index of the block (what lies outside `dims`).
pub(crate) fn unflatten(b: &mut Builder, u32: Word, i: Word, dims: &[u32]) -> R<(Vec<Word>, Word)> {
    let mut coords = vec![0; dims.len()];
    let mut rest = i;
    for (d, &size) in dims.iter().enumerate().rev() {
        let (q, c) = div_mod(b, u32, rest, size.max(1))?;
        coords[d] = c;
        rest = q;
    }
    Ok((coords, rest))
}

/// The byte address of element `index` (a `u64` element count) of `bytes`-byte elements
/// at `base`.
pub(crate) fn element_addr(
    b: &mut Builder,
    u64: Word,
    base: Word,
    index: Word,
    bytes: u32,
) -> R<Word> {
    let size = b.constant_bit64(u64, u64::from(bytes));
    let off = build(b.i_mul(u64, None, index, size))?;
    build(b.i_add(u64, None, base, off))
}

/// The static dims of a tensor type, or why not (`what` names it in the message).
pub(crate) fn static_dims(ty: &rafter_ir::TensorType, what: &str) -> R<Vec<u64>> {
    ty.dims
        .iter()
        .map(|d| {
            d.as_known()
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| format!("{what} dim {d} is not static"))
        })
        .collect()
}

/// An axis attribute in `0..rank` (a negative one counts from the end), or why not.
pub(crate) fn norm_axis(axis: i64, rank: usize, what: &str) -> R<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| format!("{what} axis {axis} outside rank {rank}"))
}

/// A product of dims that must fit the kernel's 32-bit element indexing.
pub(crate) fn product_u32(dims: &[u64], what: &str) -> R<u32> {
    let p = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .unwrap_or(u64::MAX);
    u32::try_from(p).map_err(|_| format!("{what} of {p} elements exceeds 32-bit indexing"))
}

/// The dims of a tensor type from axis `from` inward, which must be static; the outer
/// ones may be symbolic (a kernel that divides the element index by the inner sizes never
/// needs them).
pub(crate) fn static_dims_from(ty: &rafter_ir::TensorType, from: usize, what: &str) -> R<Vec<u64>> {
    let inner = rafter_ir::TensorType {
        dtype: ty.dtype,
        dims: ty.dims[from..].to_vec(),
    };
    static_dims(&inner, what)
}

/// The one node of a body generated for a single `op` (these kernels fuse nothing).
pub(crate) fn one_node<'a>(body: &'a rafter_ir::Graph, op: &str) -> R<&'a rafter_ir::Node> {
    match body.nodes.as_slice() {
        [node] => Ok(node),
        _ => Err(format!(
            "a kernel for `{op}` is one {op} node (nothing fused)"
        )),
    }
}

/// The body input that operand `i` of `node` is; `what` names the operand in the error
/// (`"pad data"`, `"concat operand 2"`).
pub(crate) fn body_input(
    body: &rafter_ir::Graph,
    node: &rafter_ir::Node,
    i: usize,
    what: &str,
) -> R<usize> {
    match node.input(i).map(|v| &body.value(v).def) {
        Some(rafter_ir::ValueDef::Input(b)) => Ok(*b),
        _ => Err(format!("{what} is not a body input")),
    }
}

/// Where element `i` of a tensor seen as `[outer, total, inner]` lies among `parts` laid
/// end to end along the middle axis (each `(binding, offset, length)` there): the address
/// in the part whose range holds the element's axis index, of `bytes`-byte elements. The
/// one mapping concat reads through and split writes through. `None` when `parts` is empty.
pub(crate) fn part_addr(
    b: &mut Builder,
    t: &Prelude,
    e: &Element,
    parts: &[(usize, u32, u32)],
    (total, inner): (u32, u32),
    bytes: u32,
) -> R<Option<Word>> {
    let parts: Vec<(usize, Word, Word)> = parts
        .iter()
        .map(|&(k, off, n)| {
            let (off, n) = (u64::from(off), u64::from(n));
            (k, b.constant_bit64(t.u64, off), b.constant_bit64(t.u64, n))
        })
        .collect();
    part_addr_sized(b, t, e, &parts, (Size::Known(total.into()), inner), bytes)
}

/// [`part_addr`] with each part's offset and length as `u64` values of the module and a
/// total that may be a dim param (a concat along a symbolic axis: a KV cache's `past + 1`
/// rows).
pub(crate) fn part_addr_sized(
    b: &mut Builder,
    t: &Prelude,
    e: &Element,
    parts: &[(usize, Word, Word)],
    (total, inner): (Size, u32),
    bytes: u32,
) -> R<Option<Word>> {
    let Prelude { u32, u64, bool, .. } = *t;
    let (rest, c) = div_mod(b, u32, e.i, inner)?;
    let (o, a) = match total {
        Size::Known(n) => {
            let n = u32::try_from(n.max(1)).map_err(|_| "concat axis over 32 bits")?;
            div_mod(b, u32, rest, n)?
        }
        Size::Param(i) => {
            let n = *e.params.get(i).ok_or("dim param out of range")?;
            // At least 1: a zero-length axis has no elements, so no invocation uses it.
            let one = b.constant_bit32(u32, 1);
            let args = [Operand::IdRef(n), Operand::IdRef(one)];
            let n = build(b.ext_inst(u32, None, t.glsl, GLSL_UMAX, args))?;
            let q = build(b.u_div(u32, None, rest, n))?;
            (q, build(b.u_mod(u32, None, rest, n))?)
        }
    };
    let (o, a, c) = (
        build(b.u_convert(u64, None, o))?,
        build(b.u_convert(u64, None, a))?,
        build(b.u_convert(u64, None, c))?,
    );
    let inner = b.constant_bit64(u64, u64::from(inner));
    let mut addr = None;
    for &(binding, off64, n64) in parts {
        // ((o * n + a - off) * inner + c), wrapping where `a` is below this part's range
        // (the select then discards it).
        let flat = build(b.i_mul(u64, None, o, n64))?;
        let flat = build(b.i_add(u64, None, flat, a))?;
        let flat = build(b.i_sub(u64, None, flat, off64))?;
        let flat = build(b.i_mul(u64, None, flat, inner))?;
        let flat = build(b.i_add(u64, None, flat, c))?;
        let at = element_addr(b, u64, e.addrs[binding], flat, bytes)?;
        addr = Some(match addr {
            None => at,
            Some(prev) => {
                let here = build(b.u_greater_than_equal(bool, None, a, off64))?;
                build(b.select(u64, None, here, at, prev))?
            }
        });
    }
    Ok(addr)
}

/// One iteration of [`range_loop`]: the builder, the index, the carried values; returns
/// their next values.
pub(crate) type LoopStep<'a> = dyn FnMut(&mut Builder, Word, &[Word]) -> R<Vec<Word>> + 'a;

/// A loop `for v in from..to` (`u32`s) carrying `accs` (values of types `tys`) through
/// `step`, which emits into the open body block; returns the final values.
pub(crate) fn range_loop(
    b: &mut Builder,
    t: &Prelude,
    (from, to): (Word, Word),
    accs: &[(Word, Word)],
    step: &mut LoopStep<'_>,
) -> R<Vec<Word>> {
    let (entry, header, cond, body, cont, merge) = (b.id(), b.id(), b.id(), b.id(), b.id(), b.id());
    let next = b.id();
    let nexts: Vec<Word> = accs.iter().map(|_| b.id()).collect();
    build(b.branch(entry))?;
    build(b.begin_block(Some(entry)))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(header)))?;
    let v = build(b.phi(t.u32, None, [(from, entry), (next, cont)]))?;
    let mut cur = Vec::with_capacity(accs.len());
    for (&(ty, init), &n) in accs.iter().zip(&nexts) {
        cur.push(build(b.phi(ty, None, [(init, entry), (n, cont)]))?);
    }
    build(b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(b.branch(cond))?;
    build(b.begin_block(Some(cond)))?;
    let more = build(b.u_less_than(t.bool, None, v, to))?;
    build(b.branch_conditional(more, body, merge, []))?;
    build(b.begin_block(Some(body)))?;
    let updated = step(b, v, &cur)?;
    build(b.branch(cont))?;
    build(b.begin_block(Some(cont)))?;
    for ((&(ty, _), &u), &n) in accs.iter().zip(&updated).zip(&nexts) {
        build(b.copy_object(ty, Some(n), u))?;
    }
    let one = b.constant_bit32(t.u32, 1);
    build(b.i_add(t.u32, Some(next), v, one))?;
    build(b.branch(header))?;
    build(b.begin_block(Some(merge)))?;
    Ok(cur)
}

/// A size a kernel uses: known when it is generated, or read at dispatch time from the
/// module's dim params ([`module_with_params`]; index into [`Element::params`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Size {
    Known(u64),
    Param(usize),
}

/// The dim params a kernel collects while it resolves its sizes: each symbolic dim it
/// needs becomes one [`rafter_vulkan_section::DimParam`] (a binding's axis), pushed per
/// call, so one module serves every size the symbols take.
#[derive(Default)]
pub(crate) struct DimParams {
    pub(crate) params: Vec<rafter_vulkan_section::DimParam>,
}

impl DimParams {
    /// Dim `axis` of the tensor at `binding` (body inputs, then outputs) of type `ty`:
    /// known, or a param (one per binding and axis).
    pub(crate) fn dim(
        &mut self,
        ty: &rafter_ir::TensorType,
        binding: usize,
        axis: usize,
    ) -> R<Size> {
        let d = ty
            .dims
            .get(axis)
            .ok_or_else(|| format!("{ty} has no axis {axis}"))?;
        if let Some(k) = d.as_known() {
            return u64::try_from(k)
                .map(Size::Known)
                .map_err(|_| format!("negative dim {k}"));
        }
        let p = rafter_vulkan_section::DimParam {
            binding: u16::try_from(binding).map_err(|_| "binding index over 16 bits")?,
            axis: u16::try_from(axis).map_err(|_| "axis over 16 bits")?,
        };
        if let Some(i) = self.params.iter().position(|q| *q == p) {
            return Ok(Size::Param(i));
        }
        if self.params.len() >= rafter_vulkan_section::MAX_DIM_PARAMS {
            return Err(format!(
                "more than {} symbolic dims",
                rafter_vulkan_section::MAX_DIM_PARAMS
            ));
        }
        self.params.push(p);
        Ok(Size::Param(self.params.len() - 1))
    }
}

/// `size` as a `u32` value of the module (a constant, or its param).
pub(crate) fn size_u32(b: &mut Builder, t: &Prelude, params: &[Word], size: Size) -> R<Word> {
    match size {
        Size::Known(k) => {
            let k = u32::try_from(k).map_err(|_| format!("size {k} over 32 bits"))?;
            Ok(b.constant_bit32(t.u32, k))
        }
        Size::Param(i) => params
            .get(i)
            .copied()
            .ok_or_else(|| "dim param out of range".into()),
    }
}

/// `size` as a `u64` value of the module (a constant, or its param widened).
pub(crate) fn size_u64(b: &mut Builder, t: &Prelude, e: &Element, size: Size) -> R<Word> {
    match size {
        Size::Known(k) => Ok(b.constant_bit64(t.u64, k)),
        Size::Param(i) => {
            let p = *e.params.get(i).ok_or("dim param out of range")?;
            build(b.u_convert(t.u64, None, p))
        }
    }
}
