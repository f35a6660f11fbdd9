//! Kernels that compute each output element from a small window of one input plane, one
//! invocation per output element: depthwise convolution, max, average and Lp pooling, global
//! average and max pooling, on f32 or f16 NCHW tensors with static channel and spatial dims (the batch may be
//! symbolic: the element count is the launch's one param, as for elementwise kernels).
//!
//! These are memory-bound (a depthwise 3×3 reads each input about once per output), so
//! one invocation per output with the window unrolled is the right shape: there is no
//! reuse across outputs worth staging in workgroup memory. The convolution's epilogue
//! (bias, residual, relu, clip) is the matmul's ([`crate::matmul::Step`]), applied before
//! the single store.

use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{BuiltIn, LoopControl, StorageClass, Word};

use crate::elem::Elem;
use crate::matmul::{
    begin_main, build, builtin_v3, declare_const_rows, prelude, push_block, Body, Epilogue, Ids,
    MatmulTile, Prelude, Step, GLSL_FMA, R,
};
use crate::WORKGROUP_SIZE;

/// What a window kernel computes per output element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowOp {
    /// `sum over taps of x · w[c]` (one filter per channel), then the epilogue.
    Depthwise,
    /// The maximum over the taps inside the input (padding is ignored), NaN propagating.
    MaxPool,
    /// The mean over the taps: those inside the input (`include_pad` false), or every tap
    /// (`include_pad`: the generator only takes it where every window lies inside the
    /// padded input, so the divisor is the window size, as ONNX's `count_include_pad`).
    AvgPool {
        include_pad: bool,
    },
    /// `(sum over the taps inside of |x|^p)^(1/p)` for an integer `p >= 1` (pads add 0).
    LpPool {
        p: u32,
    },
    /// The mean (or maximum) over the whole plane.
    GlobalAverage,
    GlobalMax,
}

/// Static geometry: channels, input plane, window, strides, leading pads, dilations,
/// output plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowGeom {
    pub(crate) c: u32,
    pub(crate) h: u32,
    pub(crate) w: u32,
    pub(crate) k: [u32; 2],
    pub(crate) s: [u32; 2],
    pub(crate) p: [u32; 2],
    pub(crate) d: [u32; 2],
    pub(crate) oh: u32,
    pub(crate) ow: u32,
}

/// Bindings of a window kernel: `x`, `w` (depthwise only), the epilogue's operands
/// anywhere among the body inputs, and the output last.
pub(crate) struct WindowLayout {
    pub(crate) op: WindowOp,
    pub(crate) geom: WindowGeom,
    pub(crate) x: usize,
    pub(crate) w: Option<usize>,
    pub(crate) y: usize,
    pub(crate) bindings: usize,
    pub(crate) steps: Vec<Step>,
    /// Constant vectors the epilogue reads ([`crate::matmul::Src::ConstRow`]).
    pub(crate) const_rows: Vec<Vec<f32>>,
    /// The element type of every binding.
    pub(crate) elem: Elem,
}

/// Emits the module (entry point `main`, [`WORKGROUP_SIZE`] invocations per workgroup,
/// a grid-stride loop over the element count in the push constants after the addresses).
pub(crate) fn emit_window(layout: &WindowLayout) -> R<Vec<u32>> {
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
    // Push constants: every binding's address, then the element count.
    let nb = layout.bindings as u32;
    let push = push_block(&mut b, &t, nb, 1);
    let ptr_fn = b.type_pointer(None, StorageClass::Function, f32);
    let v3 = b.type_vector(u32, 3);
    let wg_var = builtin_v3(&mut b, u32, BuiltIn::WorkgroupId);
    let lid_var = builtin_v3(&mut b, u32, BuiltIn::LocalInvocationId);
    let nwg_var = builtin_v3(&mut b, u32, BuiltIn::NumWorkgroups);

    let const_rows = declare_const_rows(&mut b, f32, u32, &layout.const_rows);
    let interface = [push.var, wg_var, lid_var, nwg_var]
        .into_iter()
        .chain(const_rows.iter().copied())
        .collect();
    begin_main(&mut b, void, interface, [WORKGROUP_SIZE, 1, 1])?;
    let ids = Ids {
        glsl,
        f32,
        u32,
        u64,
        bool,
        ptr_wg: 0,
        ptr_fn,
        a_tile: 0,
        b_tile: 0,
    };
    let mut e = Body {
        b,
        ids,
        tile: MatmulTile::Small,
        const_rows,
        elem: layout.elem,
        slice_offsets: None,
        red_tile: None,
    };
    let entry = build(e.b.begin_block(None))?;
    let addrs = (0..nb)
        .map(|i| push.member(&mut e.b, (u32, u64), i, true))
        .collect::<R<Vec<Word>>>()?;
    let count = push.member(&mut e.b, (u32, u64), nb, false)?;
    let wg = build(e.b.load(v3, None, wg_var, None, []))?;
    let lid = build(e.b.load(v3, None, lid_var, None, []))?;
    let nwg = build(e.b.load(v3, None, nwg_var, None, []))?;
    let wx = build(e.b.composite_extract(u32, None, wg, [0]))?;
    let lx = build(e.b.composite_extract(u32, None, lid, [0]))?;
    let nx = build(e.b.composite_extract(u32, None, nwg, [0]))?;
    // NumWorkgroups read as at least 1, so the loop's stride is never 0 (see elementwise.rs).
    let (zero, one) = (e.u(0), e.u(1));
    let none = build(e.b.i_equal(e.ids.bool, None, nx, zero))?;
    let nx = build(e.b.select(u32, None, none, one, nx))?;
    let size = e.u(WORKGROUP_SIZE);
    let first = e.mul(wx, size)?;
    let first = e.add(first, lx)?;
    let stride = e.mul(nx, size)?;

    // for (i = first; i < count; i += stride)
    let (header, cond, body, cont, merge) = (e.b.id(), e.b.id(), e.b.id(), e.b.id(), e.b.id());
    let next = e.b.id();
    build(e.b.branch(header))?;
    build(e.b.begin_block(Some(header)))?;
    let i = build(e.b.phi(u32, None, [(first, entry), (next, cont)]))?;
    build(e.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
    build(e.b.branch(cond))?;
    build(e.b.begin_block(Some(cond)))?;
    let more = e.lt(i, count)?;
    build(e.b.branch_conditional(more, body, merge, []))?;
    build(e.b.begin_block(Some(body)))?;
    e.element(layout, &addrs, i)?;
    build(e.b.branch(cont))?;
    build(e.b.begin_block(Some(cont)))?;
    build(e.b.i_add(u32, Some(next), i, stride))?;
    build(e.b.branch(header))?;
    build(e.b.begin_block(Some(merge)))?;
    build(e.b.ret())?;
    build(e.b.end_function())?;
    Ok(e.b.module().assemble())
}

/// GLSL.std.450 `FAbs`, `Pow` and `Sqrt`.
const GLSL_FABS: u32 = 4;
const GLSL_POW: u32 = 26;
const GLSL_SQRT: u32 = 31;

impl Body {
    /// `x^(1/p)` of a non-negative sum: itself for p = 1, `Sqrt` for 2, else `Pow`.
    fn root(&mut self, x: Word, p: u32) -> R<Word> {
        let f32 = self.ids.f32;
        let glsl = self.ids.glsl;
        match p {
            1 => Ok(x),
            2 => build(self.b.ext_inst(f32, None, glsl, GLSL_SQRT, [Arg::IdRef(x)])),
            _ => {
                let inv = self.b.constant_bit32(f32, (1.0 / p as f32).to_bits());
                build(
                    self.b
                        .ext_inst(f32, None, glsl, GLSL_POW, [Arg::IdRef(x), Arg::IdRef(inv)]),
                )
            }
        }
    }

    /// Loads element `index` (u32) of the buffer at `base`, as an f32.
    fn load_elem(&mut self, base: Word, index: Word) -> R<Word> {
        let zero = self.u(0);
        let addr = self.elem_addr(base, zero, zero, index)?;
        self.load_at(addr)
    }

    /// Output element `i`: its plane `nc = i / (OH·OW)`, pixel, channel; the window's
    /// reduction; the epilogue; the store.
    fn element(&mut self, l: &WindowLayout, addrs: &[Word], i: Word) -> R<()> {
        let g = l.geom;
        let Ids { f32, u32, bool, .. } = self.ids;
        let out_plane = self.u(g.oh * g.ow);
        let nc = build(self.b.u_div(u32, None, i, out_plane))?;
        let pixel = build(self.b.u_mod(u32, None, i, out_plane))?;
        let channels = self.u(g.c);
        let c = build(self.b.u_mod(u32, None, nc, channels))?;
        let x_base = addrs[l.x];
        let in_plane = self.u(g.h * g.w);
        let plane_start = self.mul(nc, in_plane)?;
        let value = match l.op {
            WindowOp::GlobalAverage | WindowOp::GlobalMax => {
                self.plane_reduce(l.op, x_base, plane_start, g.h * g.w)?
            }
            WindowOp::Depthwise
            | WindowOp::MaxPool
            | WindowOp::AvgPool { .. }
            | WindowOp::LpPool { .. } => {
                let ow = self.u(g.ow);
                let oh_i = build(self.b.u_div(u32, None, pixel, ow))?;
                let ow_i = build(self.b.u_mod(u32, None, pixel, ow))?;
                let (h, w) = (self.u(g.h), self.u(g.w));
                let taps = g.k[0] * g.k[1];
                let w_base = match l.w {
                    Some(wi) => {
                        let taps_u = self.u(taps);
                        let first_tap = self.mul(c, taps_u)?;
                        Some((addrs[wi], first_tap))
                    }
                    None => None,
                };
                let mut acc = if l.op == WindowOp::MaxPool {
                    self.b.constant_bit32(f32, f32::NEG_INFINITY.to_bits())
                } else {
                    self.b.constant_bit32(f32, 0)
                };
                // Average pooling without pads counted: the taps inside, as an f32.
                let mut inside_taps = self.b.constant_bit32(f32, 0);
                for ki in 0..g.k[0] {
                    let ki_c = self.u(ki);
                    let ih = self.window_coord(oh_i, ki_c, g.s[0], g.d[0], g.p[0])?;
                    let in_h = self.lt(ih, h)?;
                    for kj in 0..g.k[1] {
                        let kj_c = self.u(kj);
                        let iw = self.window_coord(ow_i, kj_c, g.s[1], g.d[1], g.p[1])?;
                        let in_w = self.lt(iw, w)?;
                        let inside = self.and(in_h, in_w)?;
                        // Outside taps read the plane's first element (always in bounds)
                        // and are then ignored.
                        let row = self.mul(ih, w)?;
                        let off = self.add(row, iw)?;
                        let zero = self.u(0);
                        let off = build(self.b.select(u32, None, inside, off, zero))?;
                        let index = self.add(plane_start, off)?;
                        let v = self.load_elem(x_base, index)?;
                        acc = match w_base {
                            Some((wb, first_tap)) => {
                                let tap = self.u(ki * g.k[1] + kj);
                                let wi = self.add(first_tap, tap)?;
                                let wv = self.load_elem(wb, wi)?;
                                let fzero = self.b.constant_bit32(f32, 0);
                                let v = build(self.b.select(f32, None, inside, v, fzero))?;
                                build(self.b.ext_inst(
                                    f32,
                                    None,
                                    self.ids.glsl,
                                    GLSL_FMA,
                                    [Arg::IdRef(v), Arg::IdRef(wv), Arg::IdRef(acc)],
                                ))?
                            }
                            None if matches!(l.op, WindowOp::LpPool { .. }) => {
                                let WindowOp::LpPool { p } = l.op else {
                                    unreachable!()
                                };
                                let fzero = self.b.constant_bit32(f32, 0);
                                let v = build(self.b.select(f32, None, inside, v, fzero))?;
                                let a = build(self.b.ext_inst(
                                    f32,
                                    None,
                                    self.ids.glsl,
                                    GLSL_FABS,
                                    [Arg::IdRef(v)],
                                ))?;
                                let mut power = a;
                                for _ in 1..p {
                                    power = build(self.b.f_mul(f32, None, power, a))?;
                                }
                                build(self.b.f_add(f32, None, acc, power))?
                            }
                            None if matches!(l.op, WindowOp::AvgPool { .. }) => {
                                let (fzero, fone) = (
                                    self.b.constant_bit32(f32, 0),
                                    self.b.constant_bit32(f32, 1f32.to_bits()),
                                );
                                let v = build(self.b.select(f32, None, inside, v, fzero))?;
                                let n = build(self.b.select(f32, None, inside, fone, fzero))?;
                                inside_taps = build(self.b.f_add(f32, None, inside_taps, n))?;
                                build(self.b.f_add(f32, None, acc, v))?
                            }
                            None => {
                                // Take v when inside and (v > acc or v is NaN).
                                let gt = build(self.b.f_ord_greater_than(bool, None, v, acc))?;
                                let nan = build(self.b.is_nan(bool, None, v))?;
                                let take = build(self.b.logical_or(bool, None, gt, nan))?;
                                let take = self.and(take, inside)?;
                                build(self.b.select(f32, None, take, v, acc))?
                            }
                        };
                    }
                }
                match l.op {
                    WindowOp::AvgPool { include_pad: true } => {
                        let taps = self.b.constant_bit32(f32, (taps as f32).to_bits());
                        build(self.b.f_div(f32, None, acc, taps))?
                    }
                    WindowOp::AvgPool { include_pad: false } => {
                        build(self.b.f_div(f32, None, acc, inside_taps))?
                    }
                    WindowOp::LpPool { p } => self.root(acc, p)?,
                    _ => acc,
                }
            }
        };
        // The epilogue sees the output as per-image `C × (OH·OW)` matrices.
        let image = build(self.b.u_div(u32, None, nc, channels))?;
        let image = self.wide(image)?;
        let size = self.elem.bytes() as u64;
        let image_bytes = self.u64c(g.c as u64 * g.oh as u64 * g.ow as u64 * size);
        let c_off = self.mul64(image, image_bytes)?;
        // No broadcast operands here (`CAxes::col_is_last` is false): batch and rows only
        // complete the struct.
        let zero = self.u(0);
        let epilogue = Epilogue {
            steps: &l.steps,
            addrs,
            c_off,
            batch: zero,
            m: channels,
        };
        let value = self.apply(&epilogue, value, (c, pixel), out_plane)?;
        let addr = self.elem_addr(addrs[l.y], zero, zero, i)?;
        self.store_at(addr, value)
    }

    /// The mean or maximum of the `len` elements from `start` (a loop: planes can be
    /// large).
    fn plane_reduce(&mut self, op: WindowOp, base: Word, start: Word, len: u32) -> R<Word> {
        let Ids { f32, u32, bool, .. } = self.ids;
        let init = if op == WindowOp::GlobalMax {
            self.b.constant_bit32(f32, f32::NEG_INFINITY.to_bits())
        } else {
            self.b.constant_bit32(f32, 0)
        };
        let zero = self.u(0);
        // A block of its own to enter the loop from, named for the header's phis.
        let pre = self.b.id();
        build(self.b.branch(pre))?;
        build(self.b.begin_block(Some(pre)))?;
        let (header, cond, body, cont, merge) = (
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
            self.b.id(),
        );
        let (next_j, next_acc) = (self.b.id(), self.b.id());
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(header)))?;
        let j = build(self.b.phi(u32, None, [(zero, pre), (next_j, cont)]))?;
        let acc = build(self.b.phi(f32, None, [(init, pre), (next_acc, cont)]))?;
        build(self.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(self.b.branch(cond))?;
        build(self.b.begin_block(Some(cond)))?;
        let len_c = self.u(len);
        let more = self.lt(j, len_c)?;
        build(self.b.branch_conditional(more, body, merge, []))?;
        build(self.b.begin_block(Some(body)))?;
        let index = self.add(start, j)?;
        let v = self.load_elem(base, index)?;
        let folded = if op == WindowOp::GlobalMax {
            let gt = build(self.b.f_ord_greater_than(bool, None, v, acc))?;
            let nan = build(self.b.is_nan(bool, None, v))?;
            let take = build(self.b.logical_or(bool, None, gt, nan))?;
            build(self.b.select(f32, None, take, v, acc))?
        } else {
            build(self.b.f_add(f32, None, acc, v))?
        };
        build(self.b.branch(cont))?;
        build(self.b.begin_block(Some(cont)))?;
        // The continue block forwards the body's values to the header's phis.
        build(self.b.copy_object(f32, Some(next_acc), folded))?;
        let one = self.u(1);
        build(self.b.i_add(u32, Some(next_j), j, one))?;
        build(self.b.branch(header))?;
        build(self.b.begin_block(Some(merge)))?;
        if op == WindowOp::GlobalMax {
            Ok(acc)
        } else {
            let n = self.b.constant_bit32(f32, (len as f32).to_bits());
            build(self.b.f_div(f32, None, acc, n))
        }
    }
}
