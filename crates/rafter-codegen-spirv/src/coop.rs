//! The cooperative-matrix variant of the f16 matrix-product and convolution kernels
//! (`VK_KHR_cooperative_matrix`: tensor cores on NVIDIA, matrix cores elsewhere).
//!
//! It computes what the [`crate::matmul`] kernel of the same [`MatmulTile`] computes, with
//! the same launch (grid, push constants, 256 invocations), so the runtime can load it in
//! place of that kernel where the device offers the configuration it is written for and
//! keep the plain kernel everywhere else: 16×16×16 products of f16 A and B accumulated
//! in f32, at subgroup scope, with 32-invocation subgroups (eight per workgroup).
//!
//! Per step of K the workgroup stages a `tile × KC` slice of A and a `KC × tile` slice of
//! B in workgroup memory as f16 (element loads and the zero fill past the edges are the
//! plain kernel's; the rows are padded by 8 elements to stay 16-byte aligned and spread
//! over memory banks), and each subgroup multiplies 16×16 blocks of them with
//! `OpCooperativeMatrixMulAddKHR`: one 16-deep product per block and step, or up to eight
//! for a matrix product with a long K (`Layout::long_k`), as many as fit [`MAX_SHARED`]. A
//! 64×64 tile has 16 blocks of C: each subgroup owns two of one block row (KC = 16, or 64
//! for a long K). Smaller tiles have fewer blocks than subgroups, so K is split too, like
//! the sliced tiles: a 32×32 tile's four blocks each get two subgroups (KC = 32, or 256),
//! a 16×16 tile's one block eight (KC = 128, or 256). Loading the next step into registers
//! before the products (double buffering) measured slower on the H100 and is not done. At the end every subgroup stores
//! its f32 blocks to workgroup memory, and the 256 invocations each take elements of the
//! tile, add the K groups' partial sums in group order (so rounding does not depend on
//! timing), run the epilogue and store, as the plain kernel does: the position of a
//! cooperative matrix's elements in its invocations is the driver's, so the epilogue
//! cannot run on the matrices themselves.

use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{
    AddressingModel, BuiltIn, Capability, Decoration, LoopControl, MemoryAccess, MemoryModel,
    Scope, SelectionControl, StorageClass, Word,
};

use crate::elem::{self, Elem};
use crate::matmul::{
    begin_main, build, builtin_v3, declare_const_rows, prelude, push_block, BSource, Body,
    Epilogue, Ids, Layout, MatmulTile, Operands, Prelude, Push, R, THREADS,
};

/// The side of one cooperative matrix (the 16×16×16 configuration).
pub const COOP_SIDE: u32 = 16;
/// The subgroup size the variant is written for: eight subgroups per 256-invocation
/// workgroup. The Vulkan device loads the variant only where subgroups are this wide.
pub const COOP_SUBGROUP: u32 = 32;
const INVOCATIONS: u32 = THREADS * THREADS;
const SUBGROUPS: u32 = INVOCATIONS / COOP_SUBGROUP;
/// f16 elements after each staged row: 16 bytes keep every row (and so every matrix
/// load) 16-byte aligned, and shift consecutive rows across memory banks.
const PAD: u32 = 8;
/// The most workgroup memory a variant declares: 48 KiB, what NVIDIA's driver offers (AMD
/// and Intel offer 64 KiB). A device offering less refuses the variant by its
/// `maxComputeSharedMemorySize` and runs the plain kernel.
const MAX_SHARED: u32 = 48 * 1024;
/// 16-deep products per staged step for a long K, at most.
const LONG_K_STEPS: u32 = 8;
/// The memory operand of every workgroup-memory access: the Vulkan memory model orders
/// only non-private accesses across invocations, even at a barrier.
const SHARED: MemoryAccess = MemoryAccess::NON_PRIVATE_POINTER;
/// `CooperativeMatrixUse`: A, B, accumulator.
const USE_A: u32 = 0;
const USE_B: u32 = 1;
const USE_ACC: u32 = 2;
/// `CooperativeMatrixLayout::RowMajorKHR`.
const ROW_MAJOR: u32 = 0;

/// How a tile is divided among the subgroups.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The C tile's side.
    size: u32,
    /// Cooperative blocks per side of the tile.
    side: u32,
    /// Groups of subgroups splitting K (1 when there are at least as many blocks as
    /// subgroups).
    groups: u32,
    /// Blocks of one block row each subgroup computes.
    per_subgroup: u32,
    /// 16-deep products each subgroup does per block and staged step.
    steps: u32,
    /// Elements of K staged per step: `steps` products of 16 per group.
    kc: u32,
}

impl Plan {
    /// The plan of a `tile`; `long_k`: up to [`LONG_K_STEPS`] 16-deep products per staged
    /// step, as many as fit [`MAX_SHARED`] (fewer barriers and loop trips per element of
    /// K, and more loads in flight per trip). On the H100, BERT-base f16 took 2.96 ms a
    /// call with two, 2.34–2.43 with four and 2.24–2.38 with eight; two had measured
    /// slower than one for convolutions and short K (benchmarks/RESULTS.md).
    fn of(tile: MatmulTile, long_k: bool) -> Plan {
        let size = tile.size();
        let side = size / COOP_SIDE;
        let blocks = side * side;
        let (groups, per_subgroup) = if blocks >= SUBGROUPS {
            (1, blocks / SUBGROUPS)
        } else {
            (SUBGROUPS / blocks, 1)
        };
        let mut steps = if long_k { LONG_K_STEPS } else { 1 };
        loop {
            let plan = Plan {
                size,
                side,
                groups,
                per_subgroup,
                steps,
                kc: COOP_SIDE * groups * steps,
            };
            if steps == 1 || plan.shared_bytes() <= MAX_SHARED {
                return plan;
            }
            steps /= 2;
        }
    }

    /// Bytes of workgroup memory the module declares: the staged A and B slices and the
    /// f32 tile of each K group.
    fn shared_bytes(self) -> u32 {
        let f16s = self.size * self.a_stride() + self.kc * self.b_stride();
        2 * f16s + 4 * self.groups * self.size * self.size
    }

    /// Row stride of the staged A slice (`size × kc`, row-major).
    fn a_stride(self) -> u32 {
        self.kc + PAD
    }

    /// Row stride of the staged B slice (`kc × size`, row-major).
    fn b_stride(self) -> u32 {
        self.size + PAD
    }
}

/// The module's cooperative-matrix types and workgroup arrays.
struct Coop {
    plan: Plan,
    f16: Word,
    mat_a: Word,
    mat_b: Word,
    mat_c: Word,
    a_sh: Word,
    b_sh: Word,
    c_sh: Word,
    ptr_wg16: Word,
    ptr_fn16: Word,
    sg_var: Word,
    /// The A and B slices are arrays of 4-f16 vectors ([`packed`]), not of f16s.
    packed: bool,
    v4h: Word,
    ptr_wg_v4h: Word,
}

/// The cooperative-matrix module of `layout`, or `None` where there is none: f32 kernels
/// (the devices' f32 matrix configurations are rare, and TF32 would change results).
pub(crate) fn emit_coop(layout: &Layout) -> R<Option<Vec<u32>>> {
    if layout.elem != Elem::F16 {
        return Ok(None);
    }
    let plan = Plan::of(layout.tile, layout.long_k);
    let mut b = Builder::new();
    let t = prelude(&mut b);
    // f16 values in workgroup memory and registers (shaderFloat16), the subgroup index
    // (a basic subgroup feature) and the matrices themselves.
    b.capability(Capability::Float16);
    b.capability(Capability::GroupNonUniform);
    b.capability(Capability::CooperativeMatrixKHR);
    b.extension("SPV_KHR_cooperative_matrix");
    // Cooperative matrices require the Vulkan memory model, under which a barrier orders
    // only accesses marked non-private: every workgroup-memory access here is ([`SHARED`]).
    b.capability(Capability::VulkanMemoryModel);
    b.memory_model(
        AddressingModel::PhysicalStorageBuffer64,
        MemoryModel::Vulkan,
    );
    let Prelude {
        glsl,
        void,
        f32,
        u32,
        u64,
        bool,
    } = t;
    let f16 = b.type_float(16);
    let push = push_block(&mut b, &t, layout.bindings as u32, 4);
    let packed = packed(layout);
    let v4h = b.type_vector(f16, 4);
    let mut array = |ty: Word, len: u32| {
        let len = b.constant_bit32(u32, len);
        let arr = b.type_array(ty, len);
        let ptr = b.type_pointer(None, StorageClass::Workgroup, arr);
        b.variable(ptr, None, StorageClass::Workgroup, None)
    };
    let (slice_elem, per_elem) = if packed { (v4h, 4) } else { (f16, 1) };
    let a_sh = array(slice_elem, plan.size * plan.a_stride() / per_elem);
    let b_sh = array(slice_elem, plan.kc * plan.b_stride() / per_elem);
    let c_sh = array(f32, plan.groups * plan.size * plan.size);
    let ptr_wg = b.type_pointer(None, StorageClass::Workgroup, f32);
    let ptr_wg16 = b.type_pointer(None, StorageClass::Workgroup, f16);
    let ptr_wg_v4h = b.type_pointer(None, StorageClass::Workgroup, v4h);
    let ptr_fn16 = b.type_pointer(None, StorageClass::Function, f16);
    let ptr_fn = b.type_pointer(None, StorageClass::Function, f32);
    let wg_var = builtin_v3(&mut b, u32, BuiltIn::WorkgroupId);
    let lid_var = builtin_v3(&mut b, u32, BuiltIn::LocalInvocationId);
    let ptr_in = b.type_pointer(None, StorageClass::Input, u32);
    let sg_var = b.variable(ptr_in, None, StorageClass::Input, None);
    b.decorate(
        sg_var,
        Decoration::BuiltIn,
        [Arg::BuiltIn(BuiltIn::SubgroupId)],
    );
    let scope = b.constant_bit32(u32, Scope::Subgroup as u32);
    let side = b.constant_bit32(u32, COOP_SIDE);
    let mut matrix = |component: Word, use_: u32| {
        let use_ = b.constant_bit32(u32, use_);
        b.type_cooperative_matrix_khr(component, scope, side, side, use_)
    };
    let (mat_a, mat_b, mat_c) = (matrix(f16, USE_A), matrix(f16, USE_B), matrix(f32, USE_ACC));
    let const_rows = declare_const_rows(&mut b, f32, u32, &layout.const_rows);
    let interface = [push.var, wg_var, lid_var, sg_var, a_sh, b_sh, c_sh]
        .into_iter()
        .chain(const_rows.iter().copied())
        .collect();
    begin_main(&mut b, void, interface, [THREADS, THREADS, 1])?;
    let mut e = Body {
        b,
        ids: Ids {
            glsl,
            f32,
            u32,
            u64,
            bool,
            ptr_wg,
            ptr_fn,
            a_tile: a_sh,
            b_tile: b_sh,
        },
        tile: layout.tile,
        const_rows,
        elem: layout.elem,
        slice_offsets: None,
        red_tile: None,
    };
    let coop = Coop {
        plan,
        f16,
        mat_a,
        mat_b,
        mat_c,
        a_sh,
        b_sh,
        c_sh,
        ptr_wg16,
        ptr_fn16,
        sg_var,
        packed,
        v4h,
        ptr_wg_v4h,
    };
    coop.main(&mut e, layout, &push, (wg_var, lid_var))?;
    build(e.b.end_function())?;
    Ok(Some(e.b.module().assemble()))
}

/// The subgroup's place in the tile: its block row, first block column and K group.
struct Place {
    row: Word,
    col: Word,
    group: Word,
}

impl Coop {
    fn main(&self, e: &mut Body, layout: &Layout, push: &Push, vars: (Word, Word)) -> R<()> {
        let (wg_var, lid_var) = vars;
        let Ids { u32, f32, .. } = e.ids;
        let entry = build(e.b.begin_block(None))?;
        // The accumulators, in function variables declared first (as SPIR-V requires).
        let fzero = e.b.constant_bit32(f32, 0);
        let zero_c = e.b.constant_composite(self.mat_c, [fzero]);
        let ptr_c = e.b.type_pointer(None, StorageClass::Function, self.mat_c);
        let acc: Vec<Word> = (0..self.plan.per_subgroup)
            .map(|_| {
                e.b.variable(ptr_c, None, StorageClass::Function, Some(zero_c))
            })
            .collect();
        // One step's elements of this invocation (A's, then B's), loaded before any is
        // stored to workgroup memory so the loads overlap.
        let per = (self.plan.size * self.plan.kc / INVOCATIONS) as usize;
        let regs = (0..2 * per)
            .map(|_| {
                e.b.variable(self.ptr_fn16, None, StorageClass::Function, None)
            })
            .collect::<Vec<_>>();

        let v3 = e.b.type_vector(u32, 3);
        let wg = build(e.b.load(v3, None, wg_var, None, []))?;
        let lid = build(e.b.load(v3, None, lid_var, None, []))?;
        let tx = build(e.b.composite_extract(u32, None, lid, [0]))?;
        let ty = build(e.b.composite_extract(u32, None, lid, [1]))?;
        let wx = build(e.b.composite_extract(u32, None, wg, [0]))?;
        let wy = build(e.b.composite_extract(u32, None, wg, [1]))?;
        let wz = build(e.b.composite_extract(u32, None, wg, [2]))?;
        let ops = e.operands(layout, push, wz)?;
        let size = e.u(self.plan.size);
        let n0 = e.mul(wx, size)?;
        let m0 = e.mul(wy, size)?;
        let threads = e.u(THREADS);
        let flat = e.mul(ty, threads)?;
        let flat = e.add(flat, tx)?;
        let place = self.place(e)?;
        let vectors = vector_staging(e, layout, &ops)?;
        let zero = e.u(0);

        // for (kb = 0; kb < K; kb += KC): stage a step of K, multiply. Every subgroup runs
        // the same trip count (a group past K multiplies the zeros staged there).
        let (header, cond, body, cont, merge) = (e.b.id(), e.b.id(), e.b.id(), e.b.id(), e.b.id());
        let kb_next = e.b.id();
        build(e.b.branch(header))?;
        build(e.b.begin_block(Some(header)))?;
        let kb = build(e.b.phi(u32, None, [(zero, entry), (kb_next, cont)]))?;
        build(e.b.loop_merge(merge, cont, LoopControl::NONE, []))?;
        build(e.b.branch(cond))?;
        build(e.b.begin_block(Some(cond)))?;
        let more = e.lt(kb, ops.k)?;
        build(e.b.branch_conditional(more, body, merge, []))?;
        build(e.b.begin_block(Some(body)))?;
        self.stage(
            e,
            (flat, m0, n0, kb),
            (&ops, layout.b_source),
            vectors,
            &regs,
        )?;
        e.barrier()?;
        self.multiply(e, &acc, &place)?;
        e.barrier()?;
        build(e.b.branch(cont))?;
        build(e.b.begin_block(Some(cont)))?;
        let kc = e.u(self.plan.kc);
        build(e.b.i_add(u32, Some(kb_next), kb, kc))?;
        build(e.b.branch(header))?;
        build(e.b.begin_block(Some(merge)))?;

        self.park(e, &acc, &place)?;
        e.barrier()?;
        let epilogue = Epilogue {
            steps: &layout.steps,
            addrs: &ops.addrs,
            c_off: ops.c_off,
            batch: wz,
            m: ops.m,
        };
        self.store(e, flat, (m0, n0), &ops, &epilogue)?;
        build(e.b.ret())
    }

    /// This subgroup's block row, first block column and K group (see the module docs).
    fn place(&self, e: &mut Body) -> R<Place> {
        let u32 = e.ids.u32;
        let sg = build(e.b.load(u32, None, self.sg_var, None, []))?;
        let Plan {
            side,
            groups,
            per_subgroup,
            ..
        } = self.plan;
        if groups == 1 {
            let across = e.u(side / per_subgroup);
            let row = build(e.b.u_div(u32, None, sg, across))?;
            let col = build(e.b.u_mod(u32, None, sg, across))?;
            let per = e.u(per_subgroup);
            let col = e.mul(col, per)?;
            let group = e.u(0);
            return Ok(Place { row, col, group });
        }
        let blocks = e.u(side * side);
        let block = build(e.b.u_mod(u32, None, sg, blocks))?;
        let group = build(e.b.u_div(u32, None, sg, blocks))?;
        let s = e.u(side);
        let row = build(e.b.u_div(u32, None, block, s))?;
        let col = build(e.b.u_mod(u32, None, block, s))?;
        Ok(Place { row, col, group })
    }

    /// Stages the step at K offset `kb`: by 16-byte loads where `vectors` (the alignment
    /// check) holds, else element by element through `regs`.
    fn stage(
        &self,
        e: &mut Body,
        at: (Word, Word, Word, Word),
        (ops, b_source): (&Operands, BSource),
        vectors: Option<Word>,
        regs: &[Word],
    ) -> R<()> {
        let flat = at.0;
        let Some(aligned) = vectors else {
            self.fetch(e, at, ops, b_source, regs)?;
            return self.deposit(e, flat, regs);
        };
        let (then, other, done) = (e.b.id(), e.b.id(), e.b.id());
        build(e.b.selection_merge(done, SelectionControl::NONE))?;
        build(e.b.branch_conditional(aligned, then, other, []))?;
        build(e.b.begin_block(Some(then)))?;
        self.stage_vectors(e, at, ops, b_source)?;
        build(e.b.branch(done))?;
        build(e.b.begin_block(Some(other)))?;
        self.fetch(e, at, ops, b_source, regs)?;
        self.deposit(e, flat, regs)?;
        build(e.b.branch(done))?;
        build(e.b.begin_block(Some(done)))?;
        Ok(())
    }

    /// Element `r` of this invocation's share of a staged step: its A coordinates (row,
    /// K offset) and its B coordinates (K offset, column) within the slices. A's K offset
    /// runs fastest and B's column, so consecutive invocations read consecutive addresses
    /// of A's rows and of B's rows (an image's positions for a convolution).
    fn share(&self, e: &mut Body, flat: Word, r: u32) -> R<[Word; 4]> {
        let Plan { size, kc, .. } = self.plan;
        let u32 = e.ids.u32;
        let step = e.u(r * INVOCATIONS);
        let lin = e.add(flat, step)?;
        let mask = e.u(kc - 1);
        let a_k = build(e.b.bitwise_and(u32, None, lin, mask))?;
        let shift = e.u(kc.trailing_zeros());
        let a_row = build(e.b.shift_right_logical(u32, None, lin, shift))?;
        let mask = e.u(size - 1);
        let b_col = build(e.b.bitwise_and(u32, None, lin, mask))?;
        let shift = e.u(size.trailing_zeros());
        let b_k = build(e.b.shift_right_logical(u32, None, lin, shift))?;
        Ok([a_row, a_k, b_k, b_col])
    }

    /// Loads this invocation's share of the step at K offset `kb` into `regs` (A's
    /// elements, then B's) as f16, zero outside the matrices.
    fn fetch(
        &self,
        e: &mut Body,
        (flat, m0, n0, kb): (Word, Word, Word, Word),
        ops: &Operands,
        b_source: BSource,
        regs: &[Word],
    ) -> R<()> {
        let per = regs.len() / 2;
        let h0 = e.b.constant_bit32(self.f16, 0);
        for r in 0..per {
            let [a_row, a_k, b_k, b_col] = self.share(e, flat, r as u32)?;
            let row = e.add(m0, a_row)?;
            let col = e.add(kb, a_k)?;
            let found = e.matrix_addr(ops.a_base, (row, ops.m), (col, ops.k))?;
            self.fetch_one(e, found, h0, regs[r])?;
            let row = e.add(kb, b_k)?;
            let col = e.add(n0, b_col)?;
            let (k, n) = (ops.k, ops.n);
            let found = match b_source {
                BSource::Matrix => e.matrix_addr(ops.b_base, (row, k), (col, n))?,
                // Element (k, n) of Bᵀ is at n·K + k.
                BSource::MatrixT => e.matrix_addr(ops.b_base, (col, n), (row, k))?,
                BSource::Image(g) => e.im2col_addr(ops.b_base, &g, (row, k), (col, n))?,
            };
            self.fetch_one(e, found, h0, regs[per + r])?;
        }
        Ok(())
    }

    /// Loads the f16 at `addr` (0 where not `inside`) into the variable `reg`.
    fn fetch_one(&self, e: &mut Body, (addr, inside): (Word, Word), h0: Word, reg: Word) -> R<()> {
        let v = elem::load_stored(&mut e.b, e.elem, e.ids.f32, addr)?;
        let v = build(e.b.select(self.f16, None, inside, v, h0))?;
        build(e.b.store(reg, v, None, []))
    }

    /// Stores the fetched share to the workgroup's A and B slices.
    fn deposit(&self, e: &mut Body, flat: Word, regs: &[Word]) -> R<()> {
        let per = regs.len() / 2;
        let (a_stride, b_stride) = (e.u(self.plan.a_stride()), e.u(self.plan.b_stride()));
        for r in 0..per {
            let [a_row, a_k, b_k, b_col] = self.share(e, flat, r as u32)?;
            let at = e.mul(a_row, a_stride)?;
            let at = e.add(at, a_k)?;
            self.deposit_one(e, self.a_sh, at, regs[r])?;
            let at = e.mul(b_k, b_stride)?;
            let at = e.add(at, b_col)?;
            self.deposit_one(e, self.b_sh, at, regs[per + r])?;
        }
        Ok(())
    }

    fn deposit_one(&self, e: &mut Body, tile: Word, at: Word, reg: Word) -> R<()> {
        let v = build(e.b.load(self.f16, None, reg, None, []))?;
        let p = self.element(e, tile, at)?;
        build(e.b.store(p, v, Some(SHARED), []))
    }

    /// A pointer to f16 element `at` of a staged slice (a component of a vector where the
    /// slices are packed).
    fn element(&self, e: &mut Body, tile: Word, at: Word) -> R<Word> {
        if !self.packed {
            return build(e.b.access_chain(self.ptr_wg16, None, tile, [at]));
        }
        let u32 = e.ids.u32;
        let two = e.u(2);
        let vector = build(e.b.shift_right_logical(u32, None, at, two))?;
        let three = e.u(3);
        let lane = build(e.b.bitwise_and(u32, None, at, three))?;
        build(e.b.access_chain(self.ptr_wg16, None, tile, [vector, lane]))
    }

    /// A pointer to f16 element `at` (a multiple of 4) of a staged slice, for a matrix
    /// load: of the f16 array, or of the vector array where packed; with the row stride in
    /// the same units.
    fn matrix_at(&self, e: &mut Body, tile: Word, at: Word, stride: u32) -> R<(Word, Word)> {
        if !self.packed {
            let p = build(e.b.access_chain(self.ptr_wg16, None, tile, [at]))?;
            return Ok((p, e.u(stride)));
        }
        let u32 = e.ids.u32;
        let two = e.u(2);
        let vector = build(e.b.shift_right_logical(u32, None, at, two))?;
        let p = build(e.b.access_chain(self.ptr_wg_v4h, None, tile, [vector]))?;
        Ok((p, e.u(stride / 4)))
    }

    /// Stages the step at K offset `kb` with 16-byte loads (8 f16s of a row), zero
    /// outside the matrices: rows are multiples of 8 elements and the bases 16-byte
    /// aligned, so a vector lies wholly inside or wholly outside. Each vector's elements are
    /// stored to workgroup memory one by one (the slices stay f16 arrays, which the matrix
    /// loads read).
    fn stage_vectors(
        &self,
        e: &mut Body,
        (flat, m0, n0, kb): (Word, Word, Word, Word),
        ops: &Operands,
        b_source: BSource,
    ) -> R<()> {
        let Plan { size, kc, .. } = self.plan;
        let (a_stride, b_stride) = (self.plan.a_stride(), self.plan.b_stride());
        // A: `size` rows of `kc / 8` vectors; element i of vector (row, v) goes to
        // (row, 8v + i).
        self.vectors(e, flat, size, kc / 8, &mut |e, row, v| {
            let k = e.mul_c(v, 8)?;
            let (gr, gk) = (e.add(m0, row)?, e.add(kb, k)?);
            let found = e.matrix_addr(ops.a_base, (gr, ops.m), (gk, ops.k))?;
            let at = e.mul_c(row, a_stride)?;
            let at = e.add(at, k)?;
            Ok((found, self.a_sh, at, 1))
        })?;
        match b_source {
            // B: `kc` rows of `size / 8` vectors along N.
            BSource::Matrix => self.vectors(e, flat, kc, size / 8, &mut |e, row, v| {
                let n = e.mul_c(v, 8)?;
                let (gk, gn) = (e.add(kb, row)?, e.add(n0, n)?);
                let found = e.matrix_addr(ops.b_base, (gk, ops.k), (gn, ops.n))?;
                let at = e.mul_c(row, b_stride)?;
                let at = e.add(at, n)?;
                Ok((found, self.b_sh, at, 1))
            }),
            // Bᵀ `[N, K]`: `size` rows (columns of B) of `kc / 8` vectors along K, each
            // element going down a column of the slice.
            BSource::MatrixT => self.vectors(e, flat, size, kc / 8, &mut |e, col, v| {
                let k = e.mul_c(v, 8)?;
                let (gn, gk) = (e.add(n0, col)?, e.add(kb, k)?);
                let found = e.matrix_addr(ops.b_base, (gn, ops.n), (gk, ops.k))?;
                let at = e.mul_c(k, b_stride)?;
                let at = e.add(at, col)?;
                Ok((found, self.b_sh, at, b_stride))
            }),
            BSource::Image(_) => Err("an image is not staged by vectors".into()),
        }
    }

    /// Loads `rows × per_row` 16-byte vectors, vector `lin` at `(lin / per_row, lin %
    /// per_row)`, spread over the workgroup's invocations; `place` gives a vector's
    /// address, whether it is inside, and where its first element and the next go in
    /// workgroup memory (the tile, the index, the step between elements).
    #[allow(clippy::type_complexity)]
    fn vectors(
        &self,
        e: &mut Body,
        flat: Word,
        rows: u32,
        per_row: u32,
        place: &mut dyn FnMut(&mut Body, Word, Word) -> R<((Word, Word), Word, Word, u32)>,
    ) -> R<()> {
        let u32 = e.ids.u32;
        let count = rows * per_row;
        let u32x4 = e.b.type_vector(u32, 4);
        let f16x2 = e.b.type_vector(self.f16, 2);
        let zero = e.u(0);
        let zeros = e.b.constant_composite(u32x4, [zero, zero, zero, zero]);
        let ptr_ty =
            e.b.type_pointer(None, StorageClass::PhysicalStorageBuffer, u32x4);
        for r in 0..count.div_ceil(INVOCATIONS) {
            let lin = e.add_c(flat, r * INVOCATIONS)?;
            // The last round may cover fewer vectors than invocations.
            let partial = (r + 1) * INVOCATIONS > count;
            let done = e.b.id();
            if partial {
                let then = e.b.id();
                let some = e.lt_c(lin, count)?;
                build(e.b.selection_merge(done, SelectionControl::NONE))?;
                build(e.b.branch_conditional(some, then, done, []))?;
                build(e.b.begin_block(Some(then)))?;
            }
            let shift = e.u(per_row.trailing_zeros());
            let row = build(e.b.shift_right_logical(u32, None, lin, shift))?;
            let mask = e.u(per_row - 1);
            let v = build(e.b.bitwise_and(u32, None, lin, mask))?;
            let ((addr, inside), tile, at, step) = place(e, row, v)?;
            let ptr = build(e.b.convert_u_to_ptr(ptr_ty, None, addr))?;
            let align = [Arg::LiteralBit32(16)];
            let words = build(e.b.load(u32x4, None, ptr, Some(MemoryAccess::ALIGNED), align))?;
            let words = build(e.b.select(u32x4, None, inside, words, zeros))?;
            if self.packed && step == 1 {
                // Two 4-f16 stores: `at` is a multiple of 8, so vectors `at / 4` and the next.
                let u32x2 = e.b.type_vector(u32, 2);
                let two = e.u(2);
                let first = build(e.b.shift_right_logical(u32, None, at, two))?;
                for half in 0..2u32 {
                    let pair = build(e.b.vector_shuffle(
                        u32x2,
                        None,
                        words,
                        words,
                        [2 * half, 2 * half + 1],
                    ))?;
                    let v = build(e.b.bitcast(self.v4h, None, pair))?;
                    let i = e.add_c(first, half)?;
                    let p = build(e.b.access_chain(self.ptr_wg_v4h, None, tile, [i]))?;
                    build(e.b.store(p, v, Some(SHARED), []))?;
                }
                if partial {
                    build(e.b.branch(done))?;
                    build(e.b.begin_block(Some(done)))?;
                }
                continue;
            }
            for w in 0..4u32 {
                let word = build(e.b.composite_extract(u32, None, words, [w]))?;
                let pair = build(e.b.bitcast(f16x2, None, word))?;
                for h in 0..2u32 {
                    let x = build(e.b.composite_extract(self.f16, None, pair, [h]))?;
                    let off = e.u((2 * w + h) * step);
                    let i = e.add(at, off)?;
                    let p = self.element(e, tile, i)?;
                    build(e.b.store(p, x, Some(SHARED), []))?;
                }
            }
            if partial {
                build(e.b.branch(done))?;
                build(e.b.begin_block(Some(done)))?;
            }
        }
        Ok(())
    }

    /// `acc[j] += A block · B block j` over this subgroup's K group of the staged step
    /// ([`STEPS`] 16-deep products per block).
    fn multiply(&self, e: &mut Body, acc: &[Word], place: &Place) -> R<()> {
        let side16 = e.u(COOP_SIDE);
        let layout = e.u(ROW_MAJOR);
        let (a_stride, b_stride) = (e.u(self.plan.a_stride()), e.u(self.plan.b_stride()));
        let r0 = e.mul(place.row, side16)?;
        let a_row = e.mul(r0, a_stride)?;
        let group_k = e.u(COOP_SIDE * self.plan.steps);
        let group_k = e.mul(place.group, group_k)?;
        let mut sums: Vec<Word> = acc
            .iter()
            .map(|&var| build(e.b.load(self.mat_c, None, var, None, [])))
            .collect::<R<_>>()?;
        for step in 0..self.plan.steps {
            // A's block: rows 16·row.., K offsets group·KC/G + 16·step.. of the slice.
            let off = e.u(step * COOP_SIDE);
            let k0 = e.add(group_k, off)?;
            let at = e.add(a_row, k0)?;
            let (p, stride) = self.matrix_at(e, self.a_sh, at, self.plan.a_stride())?;
            let a = build(e.b.cooperative_matrix_load_khr(
                self.mat_a,
                None,
                p,
                layout,
                Some(stride),
                Some(SHARED),
                [],
            ))?;
            let b_row = e.mul(k0, b_stride)?;
            for (j, sum) in sums.iter_mut().enumerate() {
                let col = e.u(j as u32);
                let col = e.add(place.col, col)?;
                let col = e.mul(col, side16)?;
                let at = e.add(b_row, col)?;
                let (p, stride) = self.matrix_at(e, self.b_sh, at, self.plan.b_stride())?;
                let bm = build(e.b.cooperative_matrix_load_khr(
                    self.mat_b,
                    None,
                    p,
                    layout,
                    Some(stride),
                    Some(SHARED),
                    [],
                ))?;
                *sum =
                    build(e.b.cooperative_matrix_mul_add_khr(self.mat_c, None, a, bm, *sum, None))?;
            }
        }
        for (&var, &sum) in acc.iter().zip(&sums) {
            build(e.b.store(var, sum, None, []))?;
        }
        Ok(())
    }

    /// Stores this subgroup's accumulators to its K group's part of the f32 tile.
    fn park(&self, e: &mut Body, acc: &[Word], place: &Place) -> R<()> {
        let size = self.plan.size;
        let (side16, width, part) = (e.u(COOP_SIDE), e.u(size), e.u(size * size));
        let layout = e.u(ROW_MAJOR);
        let base = e.mul(place.group, part)?;
        let r0 = e.mul(place.row, side16)?;
        let r0 = e.mul(r0, width)?;
        let base = e.add(base, r0)?;
        for (j, &var) in acc.iter().enumerate() {
            let col = e.u(j as u32);
            let col = e.add(place.col, col)?;
            let col = e.mul(col, side16)?;
            let at = e.add(base, col)?;
            let p = build(e.b.access_chain(e.ids.ptr_wg, None, self.c_sh, [at]))?;
            let c = build(e.b.load(self.mat_c, None, var, None, []))?;
            build(e.b.cooperative_matrix_store_khr(p, c, layout, Some(width), Some(SHARED), []))?;
        }
        Ok(())
    }

    /// Every invocation takes elements `flat + 256·r` of the tile (row-major, so
    /// consecutive invocations store consecutive columns), adds the K groups' parts, runs
    /// the epilogue and stores what lies inside C.
    fn store(
        &self,
        e: &mut Body,
        flat: Word,
        (m0, n0): (Word, Word),
        ops: &Operands,
        epilogue: &Epilogue<'_>,
    ) -> R<()> {
        let Ids { u32, f32, .. } = e.ids;
        let Plan { size, groups, .. } = self.plan;
        for r in 0..size * size / INVOCATIONS {
            let step = e.u(r * INVOCATIONS);
            let at = e.add(flat, step)?;
            let mut sum = None;
            for g in 0..groups {
                let off = e.u(g * size * size);
                let i = e.add(at, off)?;
                let p = build(e.b.access_chain(e.ids.ptr_wg, None, self.c_sh, [i]))?;
                let v = build(e.b.load(f32, None, p, Some(SHARED), []))?;
                sum = Some(match sum {
                    Some(s) => build(e.b.f_add(f32, None, s, v))?,
                    None => v,
                });
            }
            let sum = sum.expect("at least one K group");
            let shift = e.u(size.trailing_zeros());
            let row = build(e.b.shift_right_logical(u32, None, at, shift))?;
            let mask = e.u(size - 1);
            let col = build(e.b.bitwise_and(u32, None, at, mask))?;
            let row = e.add(m0, row)?;
            let col = e.add(n0, col)?;
            let in_rows = e.lt(row, ops.m)?;
            let in_cols = e.lt(col, ops.n)?;
            let inside = e.and(in_rows, in_cols)?;
            let (then, done) = (e.b.id(), e.b.id());
            build(e.b.selection_merge(done, SelectionControl::NONE))?;
            build(e.b.branch_conditional(inside, then, done, []))?;
            build(e.b.begin_block(Some(then)))?;
            let v = e.apply(epilogue, sum, (row, col), ops.n)?;
            let addr = e.elem_addr(ops.c_base, row, ops.n, col)?;
            e.store_at(addr, v)?;
            build(e.b.branch(done))?;
            build(e.b.begin_block(Some(done)))?;
        }
        Ok(())
    }
}

/// Whether the staged slices are arrays of 4-f16 vectors, so that a 16-byte load of
/// A or B is stored to workgroup memory by two vector stores instead of eight f16 stores:
/// for products staged by vectors ([`vector_staging`]) whose B rows lie along N (a staged
/// row of B is then a row of the slice). The matrix loads read the vectors with the row
/// stride in vectors; element stores (the unaligned fallback) write vector components.
fn packed(layout: &Layout) -> bool {
    layout.rows_of_8 && matches!(layout.b_source, BSource::Matrix)
}

/// For a product whose rows are multiples of 8 elements (not a convolution's image),
/// whether this batch entry's A and B addresses are both 16-byte aligned (a boolean,
/// uniform over the workgroup), for [`Coop::stage`]; `None` otherwise.
fn vector_staging(e: &mut Body, layout: &Layout, ops: &Operands) -> R<Option<Word>> {
    if !layout.rows_of_8 || matches!(layout.b_source, BSource::Image(_)) {
        return Ok(None);
    }
    let u64 = e.ids.u64;
    let both = build(e.b.bitwise_or(u64, None, ops.a_base, ops.b_base))?;
    let low = e.u64c(15);
    let low = build(e.b.bitwise_and(u64, None, both, low))?;
    let zero = e.u64c(0);
    Ok(Some(build(e.b.i_equal(e.ids.bool, None, low, zero))?))
}
