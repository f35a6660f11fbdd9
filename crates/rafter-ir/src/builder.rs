//! Building a graph node by node, each node's result types inferred as it is added.
//!
//! Any frontend builds graphs this way: the ONNX importer (through [`wire`], with its own
//! error reporting), and frontends that construct a model in code, such as an LLM decoder
//! built from a weights file, through [`GraphBuilder`]:
//!
//! ```
//! use rafter_ir::{ConstData, DType, Dim, GraphBuilder, Op, TensorType, UnaryOp};
//!
//! let mut b = GraphBuilder::new("mlp");
//! let x = b.input("x", TensorType::new(DType::F32, vec![Dim::symbol("seq"), Dim::known(8)]));
//! let bytes: Vec<u8> = [0.5f32; 8 * 4].iter().flat_map(|v| v.to_le_bytes()).collect();
//! let w = b.constant("w", ConstData::new(DType::F32, vec![8, 4], bytes.into())?);
//! let y = b.wire_node("proj", Op::MatMul, &[x, w])?;
//! let z = b.wire_node("act", Op::Unary { op: UnaryOp::Relu }, &[y])?;
//! assert_eq!(b.ty(z).to_string(), "f32[seq, 4]");
//! b.output(z);
//! let graph = b.finish()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Typing is [`crate::infer::infer_node`]'s: result dims stay symbolic, small integer
//! values (shape arithmetic) are tracked as dims so a later `reshape` reads them, and a
//! size no polynomial expresses gets a fresh symbol ([`SymbolNames`]). This is the model
//! tract's `wire_node` set: a node is typed when it is wired, so a malformed one is an
//! error at the node that is wrong, never later.

use std::collections::{HashMap, HashSet};

use crate::infer::{Fresh, InferInput, Inferred};
use crate::{sanitize_identifier, ConstData, Dim, Graph, Op, TensorType, ValueDef, ValueId};

/// The shape-inference function a builder calls: normally [`crate::infer::infer_node`]
/// (an importer's tests substitute their own to look at its translation alone).
pub type InferFn<'h> = dyn FnMut(&Op, &[Option<InferInput<'_>>], usize, &mut Fresh<'_>) -> Result<Inferred, String>
    + 'h;

/// The element values of small integer values, as dims (constants, shape arithmetic):
/// what inference reads to keep `Shape → Gather → Concat → Reshape` symbolic.
pub type ValueSyms = HashMap<ValueId, Vec<Dim>>;

/// Largest integer constant (elements) whose values are handed to inference as dims.
pub const MAX_SYM_ELEMENTS: usize = 1024;

/// A constant's elements as dims, for 0-D and 1-D integer constants.
pub fn const_syms(c: &ConstData) -> Option<Vec<Dim>> {
    if c.dims.len() > 1 || c.num_elements() > MAX_SYM_ELEMENTS || !c.dtype.is_int() {
        return None;
    }
    Some(c.to_i64s()?.into_iter().map(Dim::known).collect())
}

/// The symbol names in use in a model, and fresh ones handed out for sizes inference
/// cannot express (`_nonzero0`, `_loop1`): unique within the model, never a name the
/// model declared.
#[derive(Clone, Debug, Default)]
pub struct SymbolNames {
    used: HashSet<String>,
    next: usize,
}

impl SymbolNames {
    /// Marks `name` as taken.
    pub fn reserve(&mut self, name: impl Into<String>) {
        self.used.insert(name.into());
    }

    /// Marks the symbols of `ty` as taken.
    pub fn reserve_type(&mut self, ty: &TensorType) {
        for d in &ty.dims {
            for s in d.symbols() {
                self.reserve(s.name());
            }
        }
    }

    /// A fresh symbol `_<hint><n>`.
    pub fn fresh(&mut self, hint: &str) -> Dim {
        loop {
            let n = self.next;
            self.next += 1;
            let name = sanitize_identifier(&format!("_{hint}{n}"));
            if self.used.insert(name.clone()) {
                return Dim::symbol(&name);
            }
        }
    }
}

/// Appends a node to `graph` after inferring its result types, and records the symbolic
/// element values of its results in `syms`. `outs` names each result (`None` for an
/// unused optional one). The error is inference's message (which node it is, the caller
/// says).
#[allow(clippy::too_many_arguments)]
pub fn wire(
    graph: &mut Graph,
    syms: &mut ValueSyms,
    symbols: &mut SymbolNames,
    infer: &mut InferFn<'_>,
    name: impl Into<String>,
    op: Op,
    inputs: Vec<Option<ValueId>>,
    outs: Vec<Option<String>>,
) -> Result<Vec<Option<ValueId>>, String> {
    let inferred = {
        let ins: Vec<Option<InferInput<'_>>> = inputs
            .iter()
            .map(|o| {
                o.map(|v| InferInput {
                    ty: &graph.value(v).ty,
                    sym: syms.get(&v).map(Vec::as_slice),
                    konst: graph.const_of(v),
                })
            })
            .collect();
        let mut fresh = |hint: &str| symbols.fresh(hint);
        infer(&op, &ins, outs.len(), &mut fresh)?
    };
    if inferred.types.len() < outs.len() {
        return Err(format!(
            "inference of `{}` gave {} result types for {} results",
            op.name(),
            inferred.types.len(),
            outs.len()
        ));
    }
    let outputs = outs
        .into_iter()
        .zip(inferred.types)
        .map(|(o, t)| o.map(|name| (name, t)))
        .collect();
    let ids = graph.add_node(name, op, inputs, outputs);
    for (id, s) in ids.iter().zip(inferred.syms) {
        if let (Some(id), Some(s)) = (id, s) {
            syms.insert(*id, s);
        }
    }
    Ok(ids)
}

/// Why a node could not be wired: its name, op and inference's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node `{node}` ({op}): {msg}")]
pub struct WireError {
    pub node: String,
    pub op: &'static str,
    pub msg: String,
}

/// A graph under construction, typed node by node (see the module docs).
pub struct GraphBuilder {
    graph: Graph,
    syms: ValueSyms,
    symbols: SymbolNames,
}

impl GraphBuilder {
    /// An empty graph called `name`.
    pub fn new(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            graph: Graph::new(name),
            syms: ValueSyms::new(),
            symbols: SymbolNames::default(),
        }
    }

    /// Adds a graph input (its symbols are reserved: no fresh symbol takes their names).
    pub fn input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        self.symbols.reserve_type(&ty);
        self.graph.add_input(name, ty)
    }

    /// Adds a constant (a weight, a shape vector); its bytes are shared, not copied.
    pub fn constant(&mut self, name: impl Into<String>, data: ConstData) -> ValueId {
        let syms = const_syms(&data);
        let v = self.graph.add_const(name, data);
        if let Some(s) = syms {
            self.syms.insert(v, s);
        }
        v
    }

    /// Adds a node of `op` over `inputs` with one result, named `name`, typed by
    /// inference; returns the result.
    pub fn wire_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<ValueId, WireError> {
        let name = name.into();
        let ids = self.wire(
            name.clone(),
            op,
            inputs.iter().map(|&v| Some(v)).collect(),
            vec![Some(name)],
        )?;
        Ok(ids[0].expect("one named result"))
    }

    /// Adds a node with its results named `outs` (`None`: an optional result not wanted)
    /// and optional operands (`None`: absent), the general form of
    /// [`wire_node`](GraphBuilder::wire_node).
    pub fn wire(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outs: Vec<Option<String>>,
    ) -> Result<Vec<Option<ValueId>>, WireError> {
        let name = name.into();
        let op_name = op.name();
        let mut infer =
            |op: &Op, ins: &[Option<InferInput<'_>>], n: usize, fresh: &mut Fresh<'_>| {
                crate::infer::infer_node(op, ins, n, fresh)
            };
        wire(
            &mut self.graph,
            &mut self.syms,
            &mut self.symbols,
            &mut infer,
            name.clone(),
            op,
            inputs,
            outs,
        )
        .map_err(|msg| WireError {
            node: name,
            op: op_name,
            msg,
        })
    }

    /// Marks `v` as a graph output.
    pub fn output(&mut self, v: ValueId) {
        self.graph.outputs.push(v);
    }

    /// The type of `v`.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.graph.value(v).ty
    }

    /// The integer elements of `v` when they are known now: a constant, or shape
    /// arithmetic whose dims are all known.
    pub fn known_i64s(&self, v: ValueId) -> Option<Vec<i64>> {
        if let ValueDef::Const(c) = self.graph.value(v).def {
            return self.graph.constant(c).to_i64s();
        }
        self.syms.get(&v)?.iter().map(Dim::as_known).collect()
    }

    /// A fresh symbol for a size only the run time knows.
    pub fn fresh_symbol(&mut self, hint: &str) -> Dim {
        self.symbols.fresh(hint)
    }

    /// The graph so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The finished graph, verified ([`crate::verify()`]).
    pub fn finish(self) -> Result<Graph, crate::VerifyError> {
        crate::verify(&self.graph)?;
        Ok(self.graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, UnaryOp};

    #[test]
    fn wired_nodes_are_typed_and_shape_arithmetic_stays_symbolic() {
        let mut b = GraphBuilder::new("g");
        let seq = Dim::symbol("seq");
        let x = b.input(
            "x",
            TensorType::new(DType::F32, vec![seq.clone(), Dim::known(6)]),
        );
        let shape = b
            .wire_node(
                "shape",
                Op::Shape {
                    start: 0,
                    end: None,
                },
                &[x],
            )
            .unwrap();
        assert_eq!(b.ty(shape).to_string(), "i64[2]");
        let two = b.constant("two", ConstData::from_i64s(&[3, -1]));
        assert_eq!(b.known_i64s(two), Some(vec![3, -1]));
        let r = b
            .wire_node("r", Op::Reshape { allow_zero: false }, &[x, two])
            .unwrap();
        assert_eq!(b.ty(r).to_string(), "f32[3, 2*seq]");
        let y = b
            .wire_node("y", Op::Unary { op: UnaryOp::Relu }, &[r])
            .unwrap();
        b.output(y);
        let g = b.finish().unwrap();
        assert_eq!(g.nodes.len(), 3);
    }

    #[test]
    fn a_malformed_node_is_an_error_naming_it() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", TensorType::known(DType::F32, &[2, 3]));
        let w = b.input("w", TensorType::known(DType::F32, &[4, 5]));
        let e = b.wire_node("mm", Op::MatMul, &[x, w]).unwrap_err();
        assert_eq!((e.node.as_str(), e.op), ("mm", "matmul"));
        assert!(e.to_string().starts_with("node `mm` (matmul): "), "{e}");
        // Nothing was added.
        assert!(b.graph().nodes.is_empty());
    }

    #[test]
    fn fresh_symbols_avoid_declared_names() {
        let mut names = SymbolNames::default();
        names.reserve("_nz0");
        assert_eq!(names.fresh("nz").to_string(), "_nz1");
        assert_eq!(names.fresh("nz").to_string(), "_nz2");
    }
}
