//! Adding nodes to a [`Graph`] with their result types inferred as they are added.

use std::collections::HashMap;

use bytes::Bytes;
use rafter_ir::infer::{infer_node, InferInput};
use rafter_ir::{ConstData, DType, Dim, Graph, Op, TensorType, ValueId};

/// A graph under construction: every node's results are typed by rafter-ir's inference
/// the moment it is added, so a wrong shape is caught at the node that makes it, with the
/// node's name, rather than later by the verifier.
pub(crate) struct Builder {
    pub g: Graph,
    /// Element values of small integer results (shape arithmetic), as inference gives them.
    syms: HashMap<ValueId, Vec<Dim>>,
}

impl Builder {
    pub fn new(name: &str) -> Builder {
        Builder {
            g: Graph::new(name),
            syms: HashMap::new(),
        }
    }

    pub fn input(&mut self, name: &str, ty: TensorType) -> ValueId {
        self.g.add_input(name, ty)
    }

    pub fn constant(&mut self, name: &str, data: ConstData) -> ValueId {
        self.g.add_const(name, data)
    }

    /// A constant i64 vector (axes, shapes, slice bounds).
    pub fn i64s(&mut self, name: &str, values: &[i64]) -> ValueId {
        self.g.add_const(name, ConstData::from_i64s(values))
    }

    /// A constant f32 vector.
    pub fn f32s(&mut self, name: &str, values: &[f32]) -> ValueId {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let data = ConstData::new(DType::F32, vec![values.len()], Bytes::from(bytes))
            .expect("length matches");
        self.g.add_const(name, data)
    }

    /// A constant f32 scalar (rank 0).
    pub fn f32_scalar(&mut self, name: &str, value: f32) -> ValueId {
        let data = ConstData::new(
            DType::F32,
            vec![],
            Bytes::from(value.to_le_bytes().to_vec()),
        )
        .expect("one element");
        self.g.add_const(name, data)
    }

    /// Adds `op` over `inputs` with `n_out` results named `name`, `name.1`, ...; returns
    /// the results.
    pub fn node_n(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[Option<ValueId>],
        n_out: usize,
    ) -> Result<Vec<ValueId>, String> {
        let infer_inputs: Vec<Option<InferInput<'_>>> = inputs
            .iter()
            .map(|v| {
                v.map(|v| InferInput {
                    ty: &self.g.value(v).ty,
                    sym: self.syms.get(&v).map(Vec::as_slice),
                    konst: self.g.const_of(v),
                })
            })
            .collect();
        let mut fresh_count = 0usize;
        let mut fresh = |hint: &str| {
            fresh_count += 1;
            Dim::symbol(&rafter_ir::sanitize_identifier(&format!(
                "{name}_{hint}{fresh_count}"
            )))
        };
        let inferred = infer_node(&op, &infer_inputs, n_out, &mut fresh)
            .map_err(|e| format!("node `{name}` ({}): {e}", op.name()))?;
        let outputs = (0..n_out)
            .map(|i| {
                let n = if i == 0 {
                    name.to_string()
                } else {
                    format!("{name}.{i}")
                };
                Some((n, inferred.types[i].clone()))
            })
            .collect();
        let ids: Vec<ValueId> = self
            .g
            .add_node(name, op, inputs.to_vec(), outputs)
            .into_iter()
            .map(|v| v.expect("every result requested"))
            .collect();
        for (id, sym) in ids.iter().zip(inferred.syms) {
            if let Some(s) = sym {
                self.syms.insert(*id, s);
            }
        }
        Ok(ids)
    }

    /// Adds a one-result node.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[Option<ValueId>],
    ) -> Result<ValueId, String> {
        Ok(self.node_n(name, op, inputs, 1)?[0])
    }

    /// Adds a node whose operands are all present.
    pub fn op(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId, String> {
        let inputs: Vec<Option<ValueId>> = inputs.iter().map(|&v| Some(v)).collect();
        self.node(name, op, &inputs)
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.value(v).ty
    }
}
