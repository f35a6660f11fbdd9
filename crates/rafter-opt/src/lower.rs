//! Lowering: a partitioned graph becomes a [`Program`] (buffers, kernels, host steps).

use crate::fusion::{partition_with, Group};
use crate::util::{consumers, graph_outputs, input_symbols};
use crate::{CompileError, Target};
use rafter_ir::program::{Arena, BufferDecl, Kernel, Port, Program, StateDecl, Step, Storage};
use rafter_ir::{ConstId, Dim, Graph, Symbol, TensorType, Value, ValueDef, ValueId};
use std::collections::{HashMap, HashSet};

/// Constants of at most this many bytes are copied into the kernel bodies that read them
/// (scalars, shape vectors, axes); larger ones are weights, bound as `Storage::Weight`.
pub const INLINE_CONST_MAX_BYTES: usize = 64;

/// Options of [`lower`].
#[derive(Clone, Debug)]
pub struct LowerOptions {
    pub target: Target,
    /// Declared upper bounds of symbols, copied into the program for the memory planner.
    pub bounds: Vec<(Symbol, i64)>,
    /// Declared upper bounds of sums of symbols, copied into the program.
    pub dim_bounds: Vec<(Dim, i64)>,
    /// Fuse ops into kernels ([`crate::fusion`]); off: one op per kernel.
    pub fuse: bool,
}

impl Default for LowerOptions {
    fn default() -> LowerOptions {
        LowerOptions {
            target: Target::cpu(),
            bounds: Vec::new(),
            dim_bounds: Vec::new(),
            fuse: true,
        }
    }
}

/// Partitions `graph` ([`partition`]) and lowers it. Does not plan memory: arena buffers
/// have no offsets and the arena no size (see [`crate::memplan::plan_memory`]).
pub fn lower(graph: &Graph, opts: &LowerOptions) -> Result<Program, CompileError> {
    rafter_ir::verify(graph).map_err(|source| CompileError::Verify {
        pass: "lower",
        source,
    })?;
    for st in &graph.states {
        let out = graph.value(graph.outputs[st.output]);
        if !matches!(out.def, ValueDef::Node { .. }) {
            return Err(CompileError::Unsupported(format!(
                "state `{}` -> `{}`: the state's new value must be computed by the graph, not \
                 be an input or a constant",
                out.name,
                graph.value(graph.inputs[st.input]).name
            )));
        }
    }
    let groups = partition_with(graph, opts.fuse, opts.target.is_cpu_only());
    let mut program = lower_partitioned(graph, &groups, opts);
    if !opts.target.is_cpu_only() {
        crate::partition::place_for_target(&mut program, &opts.target)?;
    }
    program.verify()?;
    Ok(program)
}

/// Lowers `graph` with a given partition (groups in a dependency order, covering every node
/// once).
///
/// - ports: the graph's inputs and outputs, named after their values;
/// - one buffer per value crossing a kernel boundary: graph inputs are `Input(i)`, graph
///   outputs `Output(i)` (an output that is an input or a constant, or that repeats an
///   earlier output, gets its own buffer and a `Step::Copy`), constants read by kernels
///   `Weight(i)` (one weight per constant), values whose dims mention symbols neither the
///   inputs bind nor [`crate::symbol_defs`] defines from them `Dynamic`, everything else a slice of arena 0 (`cpu`, `host`) with no offset;
/// - one kernel per group, on `cpu`; steps in the groups' order ([`lower`] then moves
///   kernels to the target's accelerators, see [`crate::place`]).
pub fn lower_partitioned(graph: &Graph, groups: &[Group], opts: &LowerOptions) -> Program {
    let mut l = Lowering {
        g: graph,
        p: Program {
            name: graph.name.clone(),
            bounds: opts.bounds.clone(),
            dim_bounds: opts.dim_bounds.clone(),
            ..Program::default()
        },
        buf_of: HashMap::new(),
        weight_of: HashMap::new(),
        bound: input_symbols(graph),
    };
    // Symbols shape arithmetic defines from the inputs' are bound per call too.
    l.p.symbol_defs = crate::symbol_defs::derive(graph, &l.bound);
    l.bound
        .extend(l.p.symbol_defs.iter().map(|d| d.symbol.clone()));
    let device = crate::place::CPU.to_string();
    l.p.arenas.push(Arena {
        device: device.clone(),
        memory: "host".to_string(),
        size: None,
        lower_bound: None,
    });
    // State ports leave the call's signature: their buffers are the session's state.
    let state_of_input: HashMap<usize, usize> = graph
        .states
        .iter()
        .enumerate()
        .map(|(s, st)| (st.input, s))
        .collect();
    let state_of_output: HashMap<usize, usize> = graph
        .states
        .iter()
        .enumerate()
        .map(|(s, st)| (st.output, s))
        .collect();
    for st in &graph.states {
        let (i, o) = (
            graph.value(graph.inputs[st.input]),
            graph.value(graph.outputs[st.output]),
        );
        l.p.states.push(StateDecl {
            name: o.name.clone(),
            input_name: i.name.clone(),
            input_ty: i.ty.clone(),
            output_ty: o.ty.clone(),
        });
    }
    for (i, &v) in graph.inputs.iter().enumerate() {
        let val = graph.value(v);
        let storage = match state_of_input.get(&i) {
            Some(&s) => Storage::State(s),
            None => {
                l.p.inputs.push(Port {
                    name: val.name.clone(),
                    ty: val.ty.clone(),
                });
                Storage::Input(l.p.inputs.len() - 1)
            }
        };
        let b = l.push(val.name.clone(), val.ty.clone(), storage);
        l.buf_of.insert(v, b);
    }
    // Which output slots each value fills; the first one produced by a kernel is its
    // buffer, the others are copies. A state is always the first.
    let mut out_slots: HashMap<ValueId, Vec<Storage>> = HashMap::new();
    let mut port_of_output = vec![None; graph.outputs.len()];
    for (j, &v) in graph.outputs.iter().enumerate() {
        let val = graph.value(v);
        let slots = out_slots.entry(v).or_default();
        match state_of_output.get(&j) {
            Some(&s) => slots.insert(0, Storage::State(s)),
            None => {
                l.p.outputs.push(Port {
                    name: val.name.clone(),
                    ty: val.ty.clone(),
                });
                let k = l.p.outputs.len() - 1;
                port_of_output[j] = Some(k);
                slots.push(Storage::Output(k));
            }
        }
    }
    // Outputs that no kernel produces: copies of inputs and constants ([`lower`] has
    // refused such states).
    for (j, &v) in graph.outputs.iter().enumerate() {
        let Some(k) = port_of_output[j] else { continue };
        if matches!(graph.value(v).def, ValueDef::Node { .. }) {
            continue;
        }
        let src = l.operand(v);
        let val = graph.value(v);
        let dst = l.push(val.name.clone(), val.ty.clone(), Storage::Output(k));
        l.p.steps.push(Step::Copy { src, dst });
    }

    let uses = consumers(graph);
    let is_output = graph_outputs(graph);
    let mut group_of = vec![usize::MAX; graph.nodes.len()];
    for (gi, grp) in groups.iter().enumerate() {
        for &n in &grp.nodes {
            group_of[n] = gi;
        }
    }
    for (gi, grp) in groups.iter().enumerate() {
        let anchor = grp
            .nodes
            .iter()
            .copied()
            .find(|&n| crate::fusion::op_class(&graph.nodes[n].op) == grp.kind)
            .unwrap_or(grp.nodes[0]);
        let name = format!("k{gi}_{}", graph.nodes[anchor].op.name());
        let (body, outer_in, outer_out) = build_body(graph, &grp.nodes, &name, |v| {
            is_output[v.0 as usize] || uses[v.0 as usize].iter().any(|&u| group_of[u] != gi)
        });
        let args = outer_in.iter().map(|&v| l.operand(v)).collect();
        let mut results = Vec::with_capacity(outer_out.len());
        let mut copies = Vec::new();
        for &v in &outer_out {
            let val = graph.value(v);
            let slots = out_slots.get(&v).map(Vec::as_slice).unwrap_or(&[]);
            let storage = match slots.first() {
                Some(s) => s.clone(),
                None if l.is_dynamic(&val.ty) => Storage::Dynamic,
                None => Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            };
            let b = l.push(val.name.clone(), val.ty.clone(), storage);
            l.buf_of.insert(v, b);
            results.push(Some(b));
            for slot in slots.iter().skip(1) {
                let dst = l.push(val.name.clone(), val.ty.clone(), slot.clone());
                copies.push(Step::Copy { src: b, dst });
            }
        }
        l.p.kernels.push(Kernel {
            name,
            kind: grp.kind,
            device: device.clone(),
            body,
        });
        l.p.steps.push(Step::Dispatch {
            kernel: gi,
            args,
            results,
        });
        l.p.steps.extend(copies);
    }
    l.p
}

struct Lowering<'g> {
    g: &'g Graph,
    p: Program,
    buf_of: HashMap<ValueId, usize>,
    weight_of: HashMap<ConstId, usize>,
    bound: HashSet<Symbol>,
}

impl Lowering<'_> {
    fn push(&mut self, name: String, ty: TensorType, storage: Storage) -> usize {
        self.p.buffers.push(BufferDecl { name, ty, storage });
        self.p.buffers.len() - 1
    }

    /// The buffer holding an operand: its existing buffer, or a weight for a constant.
    fn operand(&mut self, v: ValueId) -> usize {
        if let Some(&b) = self.buf_of.get(&v) {
            return b;
        }
        let val = self.g.value(v);
        let ValueDef::Const(c) = val.def else {
            panic!(
                "value `{}` read before a kernel produced it (bad partition order)",
                val.name
            );
        };
        let data = self.g.constant(c);
        let dims: Vec<i64> = data.dims.iter().map(|&d| d as i64).collect();
        let ty = TensorType::known(data.dtype, &dims);
        let w = *self.weight_of.entry(c).or_insert_with(|| {
            self.p.weights.push(data.clone());
            self.p.weights.len() - 1
        });
        let b = self.push(val.name.clone(), ty, Storage::Weight(w));
        self.buf_of.insert(v, b);
        b
    }

    fn is_dynamic(&self, ty: &TensorType) -> bool {
        ty.dims
            .iter()
            .flat_map(|d| d.symbols())
            .any(|s| !self.bound.contains(&s))
    }
}

/// Builds the body of a kernel from `nodes` (ascending) of `g`. Body inputs: values read
/// from outside the group (graph inputs, other groups' results, weights) in order of first
/// use; small constants are copied in. Body outputs: values the group computes that
/// `escapes` says are read outside it, in definition order. Returns the body and the outer
/// values bound to its inputs and outputs.
pub(crate) fn build_body(
    g: &Graph,
    nodes: &[usize],
    name: &str,
    escapes: impl Fn(ValueId) -> bool,
) -> (Graph, Vec<ValueId>, Vec<ValueId>) {
    let inside: HashSet<usize> = nodes.iter().copied().collect();
    let defined_inside = |v: ValueId| match g.value(v).def {
        ValueDef::Node { node, .. } => inside.contains(&(node.0 as usize)),
        _ => false,
    };
    let inline = |v: ValueId| {
        g.const_of(v)
            .is_some_and(|c| c.bytes.len() <= INLINE_CONST_MAX_BYTES)
    };
    let mut body = Graph::new(name);
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    let mut outer_in = Vec::new();
    for &ni in nodes {
        for &v in g.nodes[ni].inputs.iter().flatten() {
            if !defined_inside(v) && !inline(v) && !map.contains_key(&v) {
                let val = g.value(v);
                let ty = match g.const_of(v) {
                    // A weight buffer has its data's type.
                    Some(c) => TensorType::known(
                        c.dtype,
                        &c.dims.iter().map(|&d| d as i64).collect::<Vec<_>>(),
                    ),
                    None => val.ty.clone(),
                };
                map.insert(v, body.add_input(val.name.clone(), ty));
                outer_in.push(v);
            }
        }
    }
    let mut outer_out = Vec::new();
    for &ni in nodes {
        let node = &g.nodes[ni];
        for &v in node.inputs.iter().flatten() {
            if map.contains_key(&v) {
                continue;
            }
            let ValueDef::Const(c) = g.value(v).def else {
                unreachable!("operand defined after its use");
            };
            let cid = ConstId(body.constants.len() as u32);
            body.constants.push(g.constant(c).clone());
            let id = ValueId(body.values.len() as u32);
            let val = g.value(v);
            body.values.push(Value {
                name: val.name.clone(),
                ty: val.ty.clone(),
                def: ValueDef::Const(cid),
            });
            map.insert(v, id);
        }
        let inputs = node.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
        let outputs = node
            .outputs
            .iter()
            .map(|o| o.map(|o| (g.value(o).name.clone(), g.value(o).ty.clone())))
            .collect();
        let outs = body.add_node(node.name.clone(), node.op.clone(), inputs, outputs);
        for (o, n) in node.outputs.iter().zip(outs) {
            if let (Some(o), Some(n)) = (*o, n) {
                map.insert(o, n);
                if escapes(o) {
                    body.outputs.push(n);
                    outer_out.push(o);
                }
            }
        }
    }
    (body, outer_in, outer_out)
}
