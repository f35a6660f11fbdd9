//! The graph: SSA values, nodes in topological order, constants kept aside.

use crate::{ConstData, Op, TensorType};

/// Index of a value in [`Graph::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// Index of a node in [`Graph::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// Index of a constant in [`Graph::constants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConstId(pub u32);

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The graph's `n`-th input.
    Input(usize),
    /// A constant (weight).
    Const(ConstId),
    /// Output `output` of node `node`.
    Node { node: NodeId, output: usize },
}

/// An SSA value: defined once, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The source model's name (kept for error messages and for naming outputs).
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

/// One op application. Absent optional operands and unused optional results are `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The source model's node name, or a generated one; used in error messages.
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<Option<ValueId>>,
}

impl Node {
    /// The operand at `i`, if present.
    pub fn input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }
}

/// A graph of ops over SSA values.
///
/// Nodes are stored in a topological order (every operand is defined before it is used), so
/// executors and passes walk `nodes` front to back. Constants live in their own table so
/// that passes move ids around, never weight bytes.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub constants: Vec<ConstData>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0 as usize]
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn constant(&self, id: ConstId) -> &ConstData {
        &self.constants[id.0 as usize]
    }

    /// The constant behind a value, if the value is a constant.
    pub fn const_of(&self, id: ValueId) -> Option<&ConstData> {
        match self.value(id).def {
            ValueDef::Const(c) => Some(self.constant(c)),
            _ => None,
        }
    }

    fn push_value(&mut self, name: String, ty: TensorType, def: ValueDef) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.values.push(Value { name, ty, def });
        id
    }

    /// Appends a graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let id = self.push_value(name.into(), ty, ValueDef::Input(self.inputs.len()));
        self.inputs.push(id);
        id
    }

    /// Adds a constant and the value that names it. The value's type is the constant's.
    pub fn add_const(&mut self, name: impl Into<String>, data: ConstData) -> ValueId {
        let ty = TensorType::known(
            data.dtype,
            &data.dims.iter().map(|&d| d as i64).collect::<Vec<_>>(),
        );
        let cid = ConstId(self.constants.len() as u32);
        self.constants.push(data);
        self.push_value(name.into(), ty, ValueDef::Const(cid))
    }

    /// Appends a node; `outputs` gives each result's name and type (`None` for an unused
    /// optional result). Returns the result ids in the same positions.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outputs: Vec<Option<(String, TensorType)>>,
    ) -> Vec<Option<ValueId>> {
        let node = NodeId(self.nodes.len() as u32);
        let outs: Vec<Option<ValueId>> = outputs
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                o.map(|(n, ty)| self.push_value(n, ty, ValueDef::Node { node, output: i }))
            })
            .collect();
        self.nodes.push(Node {
            name: name.into(),
            op,
            inputs,
            outputs: outs.clone(),
        });
        outs
    }

    /// Total bytes of constant data (the parameter bytes `rafter inspect` reports).
    pub fn constant_bytes(&self) -> usize {
        self.constants.iter().map(|c| c.bytes.len()).sum()
    }
}
