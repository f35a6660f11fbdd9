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

/// State carried from one call of a graph to the next: graph output `output` of a call is
/// graph input `input` of the following call (a KV cache, an RNN's hidden state).
///
/// Both ends have the same dtype and rank. Their dims are equal except on at most one
/// *growth* axis, where the input's dim is a plain symbol (the length carried so far, such
/// as `past`) and the output's is larger (`past + seq`): a KV cache that a call extends.
/// The compiler then keeps the state in one buffer per session, sized at the declared
/// bounds, which the input reads as a prefix and the output extends in place; the caller
/// neither passes nor receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateLink {
    /// Index into [`Graph::inputs`].
    pub input: usize,
    /// Index into [`Graph::outputs`].
    pub output: usize,
}

impl StateLink {
    /// The axis along which the state grows from call to call, if any; an error naming the
    /// problem when the two ends do not form a state (see the type's docs).
    pub fn growth_axis(&self, g: &Graph) -> Result<Option<usize>, String> {
        let (Some(&i), Some(&o)) = (g.inputs.get(self.input), g.outputs.get(self.output)) else {
            return Err(format!(
                "state links input {} and output {}, but the graph has {} inputs and {} outputs",
                self.input,
                self.output,
                g.inputs.len(),
                g.outputs.len()
            ));
        };
        let (iv, ov) = (g.value(i), g.value(o));
        let what = || format!("state `{}` -> `{}`", ov.name, iv.name);
        if iv.ty.dtype != ov.ty.dtype || iv.ty.rank() != ov.ty.rank() {
            return Err(format!(
                "{}: the output's type {} and the input's type {} differ in dtype or rank",
                what(),
                ov.ty,
                iv.ty
            ));
        }
        let differ: Vec<usize> = (0..iv.ty.rank())
            .filter(|&a| iv.ty.dims[a] != ov.ty.dims[a])
            .collect();
        match differ[..] {
            [] => Ok(None),
            [a] => {
                if iv.ty.dims[a].as_symbol().is_none() {
                    return Err(format!(
                        "{}: the input's growing dim {} (axis {a}) must be a plain symbol",
                        what(),
                        iv.ty.dims[a]
                    ));
                }
                if let Some(b) = (0..a).find(|&b| iv.ty.dims[b].as_known() != Some(1)) {
                    return Err(format!(
                        "{}: dims before the growth axis {a} must be 1 (so the state is a \
                         prefix of its buffer), axis {b} is {}",
                        what(),
                        iv.ty.dims[b]
                    ));
                }
                Ok(Some(a))
            }
            _ => Err(format!(
                "{}: the types {} and {} differ on more than one axis",
                what(),
                ov.ty,
                iv.ty
            )),
        }
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
    /// Inputs fed by outputs of the previous call (see [`StateLink`]); empty for a
    /// stateless graph.
    pub states: Vec<StateLink>,
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
