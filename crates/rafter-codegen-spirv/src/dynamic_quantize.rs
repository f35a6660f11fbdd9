//! ONNX `DynamicQuantizeLinear` of an f32 tensor of any shape (symbolic dims too): the
//! u8 quantization of `x` with the scale and zero point of its own range, which ONNX
//! Runtime's dynamically quantized models (`DynamicQuantizeMatMul`, quantized BERT and LSTM
//! exports) compute in front of every integer product.
//!
//! The range is a reduction over the whole tensor, so the kernel is one workgroup
//! ([`Launch::Rows`] with the whole tensor as the row): its [`WG`] invocations take every
//! `WG`-th element for the running max and min (both starting at 0, as the spec's range
//! includes 0), combine them in a tree through workgroup memory, then each computes the
//! scale and zero point and quantizes its share. One workgroup is enough for the
//! activations these models quantize (a BERT layer's `[1, 128, 768]` is 768 elements per
//! invocation per pass) and is correct for any size; a tensor too large for one
//! workgroup to stream quickly would want a two-pass reduction.
//!
//! Every step is the reference's (`rafter_reference`'s `dynamic_quantize`): max and min
//! by ordered comparisons (a NaN element never wins), `scale = (max - min) / 255` (1/255
//! when both are 0), `zero_point = round_half_even(clamp(0 - min / scale, 0, 255))`,
//! `y = saturate(round_half_even(x / scale) + zero_point)`, NaN to 0. Both quotients are
//! correctly rounded ([`crate::epilogue_math::Math::div_exact`]): Vulkan's `OpFDiv` may be
//! 2.5 ulp off, which moves a quotient off a .5 tie. An empty `x` is refused where its
//! dims say so: the launch skips an empty dispatch, which would leave the scale unwritten.

use rafter_ir::{DType, Graph, Op};
use rafter_vulkan_section::Launch;
use rspirv::dr::Builder;
use rspirv::spirv::{
    BuiltIn, LoopControl, MemorySemantics, Scope, SelectionControl, StorageClass, Word,
};

use crate::elem::{self, Elem};
use crate::epilogue_math::Math;
use crate::grid;
use crate::matmul::{begin_main, build, builtin_v3, prelude, push_block, Prelude, R};
use crate::ROW_WORKGROUP_SIZE as WG;

/// GLSL.std.450 `RoundEven`.
const ROUND_EVEN: u32 = 2;

/// A generated dynamic-quantize kernel: one workgroup of [`WG`] invocations.
#[derive(Debug, Clone)]
pub struct DynamicQuantizeKernel {
    /// The SPIR-V module (entry point `main`); bindings: `x`, then the body's outputs.
    pub spirv: Vec<u32>,
    /// [`Launch::Rows`] over all of `x`'s dims: one row, one workgroup.
    pub launch: Launch,
}

/// Where each of the node's three results is bound (`None`: not a body output).
struct Outputs {
    y: usize,
    scale: Option<usize>,
    zero_point: Option<usize>,
}

/// Generates a body holding one `dynamic_quantize_linear` of an f32 body input whose
/// quantized result is the body's first output (the launch counts its elements).
pub fn dynamic_quantize(body: &Graph) -> Result<DynamicQuantizeKernel, String> {
    let node = grid::one_node(body, "dynamic_quantize_linear")?;
    if node.op != Op::DynamicQuantizeLinear {
        return Err(format!(
            "op `{}` is not dynamic_quantize_linear",
            node.op.name()
        ));
    }
    let x = grid::body_input(body, node, 0, "the quantized tensor")?;
    let ty = &body.value(body.inputs[x]).ty;
    if ty.dtype != DType::F32 {
        return Err(format!(
            "dynamic quantization of {}: f32 is generated",
            ty.dtype
        ));
    }
    if ty.dims.is_empty() || ty.dims.iter().any(|d| d.as_known() == Some(0)) {
        return Err("dynamic quantization of a scalar or an empty tensor".into());
    }
    let rank = u8::try_from(ty.dims.len()).map_err(|_| "rank over 255".to_string())?;
    let n_in = body.inputs.len();
    let bound = |i: usize| {
        let v = node.outputs.get(i).copied().flatten()?;
        body.outputs.iter().position(|&o| o == v).map(|p| n_in + p)
    };
    let outs = Outputs {
        y: bound(0)
            .filter(|&p| p == n_in)
            .ok_or("the quantized result must be the body's first output")?,
        scale: bound(1),
        zero_point: bound(2),
    };
    let spirv = emit(x, n_in + body.outputs.len(), &outs)?;
    Ok(DynamicQuantizeKernel {
        spirv,
        launch: Launch::Rows { lane_dims: rank },
    })
}

/// One iteration of [`Cx::elements`]: the emitter, the element index, the carried
/// values; returns their next values.
type Step<'s, 'b> = dyn FnMut(&mut Cx<'b>, Word, &[Word]) -> R<Vec<Word>> + 's;

/// The ids the emitter threads through its steps.
struct Cx<'a> {
    b: Builder,
    t: Prelude,
    addrs: Vec<Word>,
    count: Word,
    lid: Word,
    scratch: [Word; 2],
    ptr_wg: Word,
    outs: &'a Outputs,
}

fn emit(x: usize, bindings: usize, outs: &Outputs) -> R<Vec<u32>> {
    let mut b = Builder::new();
    let t = prelude(&mut b);
    let nb = bindings as u32;
    let push = push_block(&mut b, &t, nb, 1);
    let lid_var = builtin_v3(&mut b, t.u32, BuiltIn::LocalInvocationId);
    let wg_len = b.constant_bit32(t.u32, WG);
    let arr = b.type_array(t.f32, wg_len);
    let ptr_arr = b.type_pointer(None, StorageClass::Workgroup, arr);
    let scratch = [
        b.variable(ptr_arr, None, StorageClass::Workgroup, None),
        b.variable(ptr_arr, None, StorageClass::Workgroup, None),
    ];
    let ptr_wg = b.type_pointer(None, StorageClass::Workgroup, t.f32);
    let interface = vec![push.var, lid_var, scratch[0], scratch[1]];
    begin_main(&mut b, t.void, interface, [WG, 1, 1])?;
    build(b.begin_block(None))?;
    let addrs = (0..nb)
        .map(|i| push.member(&mut b, (t.u32, t.u64), i, true))
        .collect::<R<Vec<Word>>>()?;
    let count = push.member(&mut b, (t.u32, t.u64), nb, false)?;
    let v3 = b.type_vector(t.u32, 3);
    let lid = build(b.load(v3, None, lid_var, None, []))?;
    let lid = build(b.composite_extract(t.u32, None, lid, [0]))?;
    let mut cx = Cx {
        b,
        t,
        addrs,
        count,
        lid,
        scratch,
        ptr_wg,
        outs,
    };
    let (max, min) = cx.range(x)?;
    let (scale, zero_point) = cx.parameters(max, min)?;
    cx.quantize(x, scale, zero_point)?;
    cx.store_parameters(scale, zero_point)?;
    build(cx.b.ret())?;
    build(cx.b.end_function())?;
    Ok(rspirv::binary::Assemble::assemble(&cx.b.module()))
}

impl<'b> Cx<'b> {
    fn f(&mut self, v: f32) -> Word {
        self.b.constant_bit32(self.t.f32, v.to_bits())
    }

    fn math(&mut self) -> Math<'_> {
        Math {
            b: &mut self.b,
            f32: self.t.f32,
            bool: self.t.bool,
            glsl: self.t.glsl,
        }
    }

    fn ext(&mut self, inst: u32, a: Word) -> R<Word> {
        let (f32, glsl) = (self.t.f32, self.t.glsl);
        build(
            self.b
                .ext_inst(f32, None, glsl, inst, [rspirv::dr::Operand::IdRef(a)]),
        )
    }

    /// `v > m ? v : m` (`greater`) or `v < m ? v : m`: ordered, so a NaN `v` keeps `m`.
    fn pick(&mut self, v: Word, m: Word, greater: bool) -> R<Word> {
        let (f32, bool) = (self.t.f32, self.t.bool);
        let wins = if greater {
            build(self.b.f_ord_greater_than(bool, None, v, m))?
        } else {
            build(self.b.f_ord_less_than(bool, None, v, m))?
        };
        build(self.b.select(f32, None, wins, v, m))
    }

    /// The address of element `k` (a `u32`) of binding `binding` of `bytes`-byte elements.
    fn addr(&mut self, binding: usize, k: Word, bytes: u32) -> R<Word> {
        let u64 = self.t.u64;
        let k64 = build(self.b.u_convert(u64, None, k))?;
        grid::element_addr(&mut self.b, u64, self.addrs[binding], k64, bytes)
    }

    /// A loop over this invocation's elements `k = lid, lid + WG, ... < count`, carrying
    /// the `f32` accumulators `init` through `step`; returns their final values.
    fn elements(&mut self, init: &[Word], step: &mut Step<'_, 'b>) -> R<Vec<Word>> {
        let (u32, f32, bool) = (self.t.u32, self.t.f32, self.t.bool);
        // A block of its own before the header, so the phis name their entry edge.
        let entry = self.b.id();
        build(self.b.branch(entry))?;
        build(self.b.begin_block(Some(entry)))?;
        let (header, cond, body, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let next = self.b.id();
        let nexts: Vec<Word> = init.iter().map(|_| self.b.id()).collect();
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(header)))?;
        let k = build(self.b.phi(u32, None, [(self.lid, entry), (next, cont)]))?;
        let mut accs = Vec::with_capacity(init.len());
        for (&i, &n) in init.iter().zip(&nexts) {
            accs.push(build(self.b.phi(f32, None, [(i, entry), (n, cont)]))?);
        }
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;
        build(self.b.begin_block(Some(cond)))?;
        let more = build(self.b.u_less_than(bool, None, k, self.count))?;
        build(self.b.branch_conditional(more, body, merge, []))?;
        build(self.b.begin_block(Some(body)))?;
        let updated = step(self, k, &accs)?;
        build(self.b.branch(cont))?;
        build(self.b.begin_block(Some(cont)))?;
        // The continue block's copies give each next value its reserved id.
        for (&u, &n) in updated.iter().zip(&nexts) {
            build(self.b.copy_object(f32, Some(n), u))?;
        }
        let wg = self.b.constant_bit32(u32, WG);
        build(self.b.i_add(u32, Some(next), k, wg))?;
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(merge)))?;
        Ok(accs)
    }

    /// The tensor's max and min (each starting at 0): per invocation, then combined.
    fn range(&mut self, x: usize) -> R<(Word, Word)> {
        let zero = self.f(0.0);
        let parts = self.elements(&[zero, zero], &mut |cx, k, acc| {
            let at = cx.addr(x, k, 4)?;
            let v = elem::load(&mut cx.b, Elem::F32, cx.t.f32, at)?;
            Ok(vec![cx.pick(v, acc[0], true)?, cx.pick(v, acc[1], false)?])
        })?;
        self.combine(parts[0], parts[1])
    }

    fn barrier(&mut self) -> R<()> {
        let u32 = self.t.u32;
        let scope = self.b.constant_bit32(u32, Scope::Workgroup as u32);
        let semantics =
            (MemorySemantics::ACQUIRE_RELEASE | MemorySemantics::WORKGROUP_MEMORY).bits();
        let semantics = self.b.constant_bit32(u32, semantics);
        build(self.b.control_barrier(scope, scope, semantics))
    }

    /// Every invocation's max and min combined in a tree through workgroup memory; the
    /// results to all invocations.
    fn combine(&mut self, max: Word, min: Word) -> R<(Word, Word)> {
        let (u32, f32, bool) = (self.t.u32, self.t.f32, self.t.bool);
        let (ptr, lid) = (self.ptr_wg, self.lid);
        let slots = [
            build(self.b.access_chain(ptr, None, self.scratch[0], [lid]))?,
            build(self.b.access_chain(ptr, None, self.scratch[1], [lid]))?,
        ];
        build(self.b.store(slots[0], max, None, []))?;
        build(self.b.store(slots[1], min, None, []))?;
        self.barrier()?;
        let mut half = WG / 2;
        while half >= 1 {
            let h = self.b.constant_bit32(u32, half);
            let active = build(self.b.u_less_than(bool, None, lid, h))?;
            let (then, done) = (self.b.id(), self.b.id());
            build(self.b.selection_merge(done, SelectionControl::NONE))?;
            build(self.b.branch_conditional(active, then, done, []))?;
            build(self.b.begin_block(Some(then)))?;
            let other = build(self.b.i_add(u32, None, lid, h))?;
            for (s, greater) in [(0, true), (1, false)] {
                let there = build(self.b.access_chain(ptr, None, self.scratch[s], [other]))?;
                let mine = build(self.b.load(f32, None, slots[s], None, []))?;
                let theirs = build(self.b.load(f32, None, there, None, []))?;
                let r = self.pick(theirs, mine, greater)?;
                build(self.b.store(slots[s], r, None, []))?;
            }
            build(self.b.branch(done))?;
            build(self.b.begin_block(Some(done)))?;
            self.barrier()?;
            half /= 2;
        }
        let zero = self.b.constant_bit32(u32, 0);
        let mut r = [0; 2];
        for (s, out) in r.iter_mut().enumerate() {
            let first = build(self.b.access_chain(ptr, None, self.scratch[s], [zero]))?;
            *out = build(self.b.load(f32, None, first, None, []))?;
        }
        Ok((r[0], r[1]))
    }

    /// `scale = (max == min ? 1 : max - min) / 255` and the zero point
    /// `round_half_even(clamp(0 - min / scale, 0, 255))`, the clamp by ordered selects that
    /// keep a NaN (an infinite range), as the reference's `clamp` does.
    fn parameters(&mut self, max: Word, min: Word) -> R<(Word, Word)> {
        let (f32, bool) = (self.t.f32, self.t.bool);
        let same = build(self.b.f_ord_equal(bool, None, max, min))?;
        let diff = build(self.b.f_sub(f32, None, max, min))?;
        let one = self.f(1.0);
        let range = build(self.b.select(f32, None, same, one, diff))?;
        let levels = self.f(255.0);
        let scale = self.math().div_exact(range, levels)?;
        let q = self.math().div_exact(min, scale)?;
        let zero = self.f(0.0);
        let z = build(self.b.f_sub(f32, None, zero, q))?;
        let below = build(self.b.f_ord_less_than(bool, None, z, zero))?;
        let z = build(self.b.select(f32, None, below, zero, z))?;
        let above = build(self.b.f_ord_greater_than(bool, None, z, levels))?;
        let z = build(self.b.select(f32, None, above, levels, z))?;
        let r = self.ext(ROUND_EVEN, z)?;
        Ok((scale, self.nan_to_zero(z, r)?))
    }

    /// `r` where `v` is a number, else 0 (the reference's NaN-to-integer cast): a NaN
    /// never reaches `RoundEven` or a conversion.
    fn nan_to_zero(&mut self, v: Word, r: Word) -> R<Word> {
        let (f32, bool) = (self.t.f32, self.t.bool);
        let nan = build(self.b.is_nan(bool, None, v))?;
        let zero = self.f(0.0);
        build(self.b.select(f32, None, nan, zero, r))
    }

    /// `y = saturate(round_half_even(x / scale) + zero_point)` for this invocation's share.
    /// A NaN zero point (an infinite range) makes every `y` 0, as in the reference.
    fn quantize(&mut self, x: usize, scale: Word, zero_point: Word) -> R<()> {
        let y = self.outs.y;
        self.elements(&[], &mut |cx, k, _| {
            let at = cx.addr(x, k, 4)?;
            let v = elem::load(&mut cx.b, Elem::F32, cx.t.f32, at)?;
            let q = cx.math().div_exact(v, scale)?;
            let r = cx.ext(ROUND_EVEN, q)?;
            let r = cx.nan_to_zero(q, r)?;
            let sum = build(cx.b.f_add(cx.t.f32, None, r, zero_point))?;
            let sum = cx.nan_to_zero(q, sum)?;
            let dst = cx.addr(y, k, 1)?;
            // The store saturates to 0..=255 and takes NaN to 0.
            elem::store(&mut cx.b, Elem::U8, cx.t.f32, dst, sum)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// Invocation 0 writes the scale and zero point (those the body outputs).
    fn store_parameters(&mut self, scale: Word, zero_point: Word) -> R<()> {
        let (u32, bool) = (self.t.u32, self.t.bool);
        let zero = self.b.constant_bit32(u32, 0);
        let first = build(self.b.i_equal(bool, None, self.lid, zero))?;
        let (then, done) = (self.b.id(), self.b.id());
        build(self.b.selection_merge(done, SelectionControl::NONE))?;
        build(self.b.branch_conditional(first, then, done, []))?;
        build(self.b.begin_block(Some(then)))?;
        let f32 = self.t.f32;
        if let Some(s) = self.outs.scale {
            let at = self.addr(s, zero, 4)?;
            elem::store(&mut self.b, Elem::F32, f32, at, scale)?;
        }
        if let Some(z) = self.outs.zero_point {
            let at = self.addr(z, zero, 1)?;
            elem::store(&mut self.b, Elem::U8, f32, at, zero_point)?;
        }
        build(self.b.branch(done))?;
        build(self.b.begin_block(Some(done)))?;
        Ok(())
    }
}
