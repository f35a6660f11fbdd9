//! Fusion: partitions a graph's nodes into groups, each of which becomes one kernel.
//!
//! Nodes are visited in topological order; a node joins the group of one of its operands'
//! producers when a rule allows it, otherwise it starts a group. Rules:
//! - **elementwise chains**: an elementwise op joins an elementwise group when its result
//!   has the group's *domain* (the dims every value computed in the group has), so nothing
//!   is recomputed per broadcast element;
//! - **contraction epilogues**: an elementwise op joins a contraction group (matmul, gemm,
//!   conv, ...) through a value that it alone reads (and that is no graph output), keeping
//!   the contraction's output dims: bias, activation, residual add, scaling (not a cast
//!   of a `linear`'s result to f16/bf16: an LLM's keys and values entering an f16 cache);
//! - **reduction prologues**: a reduction, softmax or normalisation joins an elementwise
//!   group through its data operand when that has the group's domain and nothing outside
//!   the group and the reduction reads any value the group computes (else the prologue
//!   would be computed twice or stored anyway). The group is then closed;
//! - **reordered stem input**: a channels-last convolution of at most
//!   [`SMALL_CONV_MAX_CIN`] input channels joins the NCHW→NHWC transpose of its input when
//!   it alone reads it: the CPU runtime's direct small convolution reads the NCHW tensor in
//!   place, so a model's RGB input is never transposed (MobileNetV2's 224×224 input took
//!   ~160 µs to transpose, a call);
//! - **channels-last pooling head**: a global average or max pool joins the NHWC→NCHW
//!   transpose of its input when it alone reads it: the CPU runtime pools the NHWC tensor
//!   in place (its result, `[N, C, 1, 1]`, is the same in either layout), so a CNN's head
//!   does not transpose its last feature map (MobileNetV2's 7×7×1280 took ~37 µs);
//! - **channels-last max pool**: a 2-D max pool between an NHWC→NCHW transpose and an
//!   NCHW→NHWC one, each read by nothing else, becomes one kernel of the three, which the
//!   CPU runtime runs as a max pool over the NHWC map (ResNet's stem pool, which otherwise
//!   transposes 3.2 MB and 0.8 MB around it);
//! - **channels-last depthwise block**: a `conv_nhwc` joins the group of the `conv_nhwc`
//!   whose result (after its clips or relus) it alone reads when the two, or three, make
//!   MobileNet's inverted residual `1×1 → depthwise → 1×1` or a half of it. The CPU
//!   runtime runs the block band by band (`rafter_kernels_cpu::block_nhwc`), so the 6×
//!   wide expansion never goes to memory (MobileNetV2's first one is 4.8 MB). An image's
//!   stem (a convolution of at most [`SMALL_CONV_MAX_CIN`] input channels, perhaps read
//!   through its input's transpose by the rule above) may take the expansion's place:
//!   `stem → depthwise (→ 1×1)`, its map computed a band at a time too;
//! - everything else (data movement, control flow, data-dependent ops) is one op per kernel.
//!
//! A join is refused when it would make a cycle between groups (a value leaving the group
//! and coming back through another group). Nodes are never duplicated.

use crate::layout::{SMALL_CONV_MAX_CIN, TO_NCHW, TO_NHWC};
use crate::util::{consumers, graph_outputs};
use rafter_ir::program::{BlockConv, KernelKind};
use rafter_ir::{DType, Dim, Graph, Op, PoolKind, UnaryOp, ValueDef, ValueId};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// One fused group: its kind and its nodes (indices into `Graph::nodes`, ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub kind: KernelKind,
    pub nodes: Vec<usize>,
}

/// The kernel class of a single op ([`KernelKind::of`], which the runtime shares).
pub fn op_class(op: &Op) -> KernelKind {
    KernelKind::of(op)
}

struct Building {
    kind: KernelKind,
    nodes: Vec<usize>,
    /// The dims of the values the group computes (elementwise and contraction groups).
    domain: Vec<Dim>,
    /// No further node may join.
    closed: bool,
    /// Groups producing this group's operands.
    preds: BTreeSet<usize>,
}

struct Partitioner<'g> {
    g: &'g Graph,
    uses: Vec<Vec<usize>>,
    is_output: Vec<bool>,
    node_group: Vec<usize>,
    groups: Vec<Building>,
    /// Casts between f32 and half precision stay kernels of their own (see
    /// [`partition_with`]).
    half_casts_alone: bool,
}

/// Whether `n` casts between f32 and f16 or bf16 (either way).
fn is_half_cast(g: &Graph, n: &rafter_ir::Node) -> bool {
    let Op::Cast { to } = n.op else {
        return false;
    };
    let from = n.input(0).map(|v| g.value(v).ty.dtype);
    (to.is_half() && from == Some(DType::F32))
        || (to == DType::F32 && from.is_some_and(DType::is_half))
}

impl Partitioner<'_> {
    fn group_of(&self, v: ValueId) -> Option<usize> {
        match self.g.value(v).def {
            ValueDef::Node { node, .. } => Some(self.node_group[node.0 as usize]),
            _ => None,
        }
    }

    /// Whether `from` depends (transitively) on `target`.
    fn reaches(&self, from: usize, target: usize) -> bool {
        let mut seen = vec![false; self.groups.len()];
        let mut stack = vec![from];
        while let Some(h) = stack.pop() {
            if h == target {
                return true;
            }
            if !std::mem::replace(&mut seen[h], true) {
                stack.extend(self.groups[h].preds.iter().copied());
            }
        }
        false
    }

    /// Whether node `ni` may join group `gid`, which produces its operand `pos` (`v`).
    fn can_join(&self, gid: usize, ni: usize, pos: usize, v: ValueId) -> bool {
        let g = self.g;
        let grp = &self.groups[gid];
        let node = &g.nodes[ni];
        let reordered = self.reads_through_transpose(gid, ni, pos, v)
            || self.writes_through_transpose(gid, ni, v);
        if grp.closed && !reordered {
            return false;
        }
        if self.half_casts_alone
            && (is_half_cast(g, node) || grp.nodes.iter().any(|&m| is_half_cast(g, &g.nodes[m])))
        {
            return false;
        }
        let ok = reordered
            || match (op_class(&node.op), grp.kind) {
                (KernelKind::Elementwise, KernelKind::Elementwise) => {
                    out_dims(g, node).as_ref() == Some(&grp.domain)
                }
                (KernelKind::Elementwise, KernelKind::Contraction) => {
                    out_dims(g, node).as_ref() == Some(&grp.domain)
                        && self.uses[v.0 as usize] == [ni]
                        && !self.is_output[v.0 as usize]
                        && !self.narrows_linear(gid, ni)
                }
                (KernelKind::Reduction, KernelKind::Elementwise) => {
                    pos == 0
                        && g.value(v).ty.dims == grp.domain
                        && grp.nodes.iter().all(|&m| {
                            g.nodes[m].outputs.iter().flatten().all(|o| {
                                !self.is_output[o.0 as usize]
                                    && self.uses[o.0 as usize]
                                        .iter()
                                        .all(|&u| u == ni || self.node_group[u] == gid)
                            })
                        })
                }
                (KernelKind::Contraction, KernelKind::Contraction) => {
                    self.continues_block(gid, ni, pos, v)
                }
                _ => false,
            };
        // Operands from other groups must not depend on this one.
        ok && node
            .inputs
            .iter()
            .flatten()
            .filter_map(|&u| self.group_of(u))
            .filter(|&h| h != gid && h != usize::MAX)
            .all(|h| !self.reaches(h, gid))
    }

    /// Whether `ni` casts the result of group `gid`'s `linear` to f16 or bf16: an LLM's new
    /// keys and values entering an f16 KV cache. It stays a kernel of its own, so the
    /// linear keeps its native f32 kernel (whose epilogues compute in f32) and the cast,
    /// a row per token, runs natively as well.
    fn narrows_linear(&self, gid: usize, ni: usize) -> bool {
        let g = self.g;
        matches!(
            g.nodes[ni].op,
            Op::Cast {
                to: DType::F16 | DType::BF16
            }
        ) && self.groups[gid]
            .nodes
            .iter()
            .any(|&m| matches!(g.nodes[m].op, Op::Linear { .. }))
    }

    /// Whether channels-last convolution `ni` continues the depthwise block that group `gid`
    /// is (the "channels-last depthwise block" rule): it reads the group's running value `v`
    /// (its data operand, read by nothing else and no graph output), and the group's
    /// convolutions followed by `ni` make `1×1 → depthwise`, `depthwise → 1×1` or
    /// `1×1 → depthwise → 1×1`, every 1×1 of stride 1 without padding, with nothing but
    /// clips and relus after a convolution that is not the last; or `stem → depthwise
    /// (→ 1×1)`, the stem a convolution of few input channels, perhaps read through its
    /// input's NCHW→NHWC transpose (MobileNet's first layers).
    fn continues_block(&self, gid: usize, ni: usize, pos: usize, v: ValueId) -> bool {
        let g = self.g;
        let grp = &self.groups[gid];
        let reads_head = grp
            .nodes
            .last()
            .is_some_and(|&l| g.nodes[l].outputs.first() == Some(&Some(v)));
        if pos != 0
            || !reads_head
            || self.uses[v.0 as usize] != [ni]
            || self.is_output[v.0 as usize]
        {
            return false;
        }
        let mut stages = Vec::new();
        for (i, &m) in grp.nodes.iter().enumerate() {
            match &g.nodes[m].op {
                Op::ConvNhwc { .. } => match block_stage(g, m) {
                    Some(st) => stages.push(st),
                    None => return false,
                },
                Op::Clip | Op::Unary { op: UnaryOp::Relu } if !stages.is_empty() => {}
                // The stem's input read in place (the reordered stem input rule).
                Op::Transpose { perm } if i == 0 && perm.as_slice() == TO_NHWC => {}
                _ => return false,
            }
        }
        let Some(next) = block_stage(g, ni) else {
            return false;
        };
        stages.push(next);
        use BlockConv::{Depthwise as D, Pointwise as P, Stem as S};
        matches!(
            stages.as_slice(),
            [P, D] | [D, P] | [P, D, P] | [S, D] | [S, D, P]
        )
    }

    /// Whether node `ni` reads its data operand `v` (operand `pos`) through the layout
    /// transpose that group `gid` holds alone, read by nothing else, and the CPU runtime's
    /// kernel for it reads the transpose's input in place instead: a channels-last
    /// convolution of few input channels after NCHW→NHWC (the "reordered stem input" rule)
    /// or a global pool after NHWC→NCHW (the "channels-last pooling head" rule).
    fn reads_through_transpose(&self, gid: usize, ni: usize, pos: usize, v: ValueId) -> bool {
        let g = self.g;
        let grp = &self.groups[gid];
        let &[t] = grp.nodes.as_slice() else {
            return false;
        };
        let Op::Transpose { perm } = &g.nodes[t].op else {
            return false;
        };
        let fits = match g.nodes[ni].op {
            Op::ConvNhwc { group: 1, .. } => {
                perm.as_slice() == TO_NHWC
                    && g.value(v)
                        .ty
                        .dims
                        .last()
                        .and_then(Dim::as_known)
                        .is_some_and(|c| c <= SMALL_CONV_MAX_CIN)
            }
            Op::GlobalPool {
                kind: PoolKind::Average | PoolKind::Max,
                ..
            } => perm.as_slice() == TO_NCHW,
            Op::Pool {
                kind: PoolKind::Max,
                ..
            } => perm.as_slice() == TO_NCHW && self.transposed_back(ni).is_some(),
            _ => false,
        };
        pos == 0
            && fits
            && grp.kind == KernelKind::DataMovement
            && self.uses[v.0 as usize] == [ni]
            && !self.is_output[v.0 as usize]
    }

    /// The NCHW→NHWC transpose that alone reads 2-D max pool `ni`'s only result (and that is
    /// no graph output), if there is one: the channels-last max pool rule's last node.
    fn transposed_back(&self, ni: usize) -> Option<usize> {
        let g = self.g;
        let [Some(y)] = g.nodes[ni].outputs.as_slice() else {
            return None;
        };
        if self.is_output[y.0 as usize] || g.value(*y).ty.rank() != 4 {
            return None;
        }
        let &[t] = self.uses[y.0 as usize].as_slice() else {
            return None;
        };
        let back = matches!(&g.nodes[t].op, Op::Transpose { perm } if perm.as_slice() == TO_NHWC);
        back.then_some(t)
    }

    /// Whether node `ni` is the transpose back to NHWC of the max pool that group `gid`
    /// reads through its NHWC→NCHW transpose (`v` the pool's result): the channels-last max
    /// pool rule's last join.
    fn writes_through_transpose(&self, gid: usize, ni: usize, v: ValueId) -> bool {
        let g = self.g;
        let &[t, pool] = self.groups[gid].nodes.as_slice() else {
            return false;
        };
        matches!(&g.nodes[t].op, Op::Transpose { perm } if perm.as_slice() == TO_NCHW)
            && matches!(
                g.nodes[pool].op,
                Op::Pool {
                    kind: PoolKind::Max,
                    ..
                }
            )
            && g.nodes[pool].outputs.first() == Some(&Some(v))
            && self.transposed_back(pool) == Some(ni)
    }

    fn place(&mut self, ni: usize, fuse: bool) {
        let g = self.g;
        let node = &g.nodes[ni];
        let class = op_class(&node.op);
        let target = fuse
            .then(|| {
                node.inputs.iter().enumerate().find_map(|(pos, v)| {
                    let v = (*v)?;
                    let gid = self.group_of(v)?;
                    self.can_join(gid, ni, pos, v).then_some(gid)
                })
            })
            .flatten();
        let preds: Vec<usize> = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|&u| self.group_of(u))
            .collect();
        let gid = match target {
            Some(gid) => {
                let grp = &mut self.groups[gid];
                if class == KernelKind::Contraction && grp.kind == KernelKind::Contraction {
                    // The next convolution of a depthwise block: its epilogue has its dims.
                    grp.domain = out_dims(g, node).unwrap_or_default();
                }
                if grp.kind == KernelKind::DataMovement {
                    // A transpose read in place: the group is the reader's from here on (a
                    // convolution's is open to its epilogue; a pool's is closed below).
                    grp.kind = KernelKind::Contraction;
                    grp.closed = false;
                    grp.domain = out_dims(g, node).unwrap_or_default();
                }
                grp.nodes.push(ni);
                if class == KernelKind::Reduction {
                    grp.kind = KernelKind::Reduction;
                    grp.closed = true;
                }
                gid
            }
            None => {
                let domain = out_dims(g, node).unwrap_or_default();
                self.groups.push(Building {
                    kind: class,
                    nodes: vec![ni],
                    domain,
                    closed: !matches!(class, KernelKind::Elementwise | KernelKind::Contraction),
                    preds: BTreeSet::new(),
                });
                self.groups.len() - 1
            }
        };
        self.node_group[ni] = gid;
        let grp = &mut self.groups[gid];
        grp.preds.extend(preds.into_iter().filter(|&h| h != gid));
    }
}

/// What `conv_nhwc` node `ni` is in a depthwise block ([`BlockConv::of`]). Blocks on maps of
/// any size are fused: the CPU runtime's kernel runs those of few rows stage by stage over
/// the whole map (`rafter_kernels_cpu::block_nhwc`'s `BAND_MIN_ROWS`), where bands would
/// recompute too much of the expansion.
fn block_stage(g: &Graph, ni: usize) -> Option<BlockConv> {
    let node = &g.nodes[ni];
    let w = &g.value(node.input(1)?).ty.dims;
    let known: Option<Vec<i64>> = w.iter().map(Dim::as_known).collect();
    BlockConv::of(&node.op, known?.try_into().ok()?)
}

/// The dims of `n`'s first result, if it has one.
fn out_dims(g: &Graph, n: &rafter_ir::Node) -> Option<Vec<Dim>> {
    n.outputs
        .first()
        .copied()
        .flatten()
        .map(|o| g.value(o).ty.dims.clone())
}

/// Partitions `g`'s nodes into kernels, in an order where every group comes after the
/// groups it reads from (ties broken by first node). With `fuse` off, one node per group.
pub fn partition(g: &Graph, fuse: bool) -> Vec<Group> {
    partition_with(g, fuse, false)
}

/// [`partition`], with every cast between f32 and f16/bf16 a kernel of its own when
/// `half_casts_alone` (the CPU target): the CPU's native kernels compute in f32 and cover
/// such a cast alone (`rafter_opt::widen` puts one where each half value enters or leaves
/// f32 compute), but not as a product's epilogue or a normalisation's prologue, which would
/// send the whole kernel to the interpreter.
pub fn partition_with(g: &Graph, fuse: bool, half_casts_alone: bool) -> Vec<Group> {
    let mut p = Partitioner {
        g,
        uses: consumers(g),
        is_output: graph_outputs(g),
        node_group: vec![usize::MAX; g.nodes.len()],
        groups: Vec::new(),
        half_casts_alone,
    };
    for ni in 0..g.nodes.len() {
        p.place(ni, fuse);
    }
    // Topological order of groups (Kahn), smallest first node first.
    let n = p.groups.len();
    let mut indeg = vec![0usize; n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (gid, grp) in p.groups.iter().enumerate() {
        for &h in &grp.preds {
            indeg[gid] += 1;
            succs[h].push(gid);
        }
    }
    let key = |gid: usize| Reverse((p.groups[gid].nodes[0], gid));
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
        (0..n).filter(|&i| indeg[i] == 0).map(key).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse((_, gid))) = ready.pop() {
        order.push(gid);
        for &s in &succs[gid] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(key(s));
            }
        }
    }
    assert_eq!(order.len(), n, "fusion made a cycle between groups");
    order
        .into_iter()
        .map(|gid| Group {
            kind: p.groups[gid].kind,
            nodes: p.groups[gid].nodes.clone(),
        })
        .collect()
}
