//! The decoder builder's view of [`GraphBuilder`]: constants of the shapes it needs and
//! errors in its own terms.

use bytes::Bytes;
use rafter_ir::{ConstData, DType, GraphBuilder, Op, TensorType, ValueId};

use super::BuildError;

/// A graph under construction, every node typed by rafter-ir's inference as it is added.
pub(crate) struct Builder {
    pub b: GraphBuilder,
}

impl From<rafter_ir::WireError> for BuildError {
    fn from(e: rafter_ir::WireError) -> BuildError {
        BuildError::Node(e.to_string())
    }
}

impl Builder {
    pub fn new(name: &str) -> Builder {
        Builder {
            b: GraphBuilder::new(name),
        }
    }

    pub fn input(&mut self, name: &str, ty: TensorType) -> ValueId {
        self.b.input(name, ty)
    }

    pub fn constant(&mut self, name: &str, data: ConstData) -> ValueId {
        self.b.constant(name, data)
    }

    /// A constant i64 vector (axes, shapes, slice bounds).
    pub fn i64s(&mut self, name: &str, values: &[i64]) -> ValueId {
        self.b.constant(name, ConstData::from_i64s(values))
    }

    /// A constant f32 vector.
    pub fn f32s(&mut self, name: &str, values: &[f32]) -> ValueId {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let data = ConstData::new(DType::F32, vec![values.len()], Bytes::from(bytes))
            .expect("length matches");
        self.b.constant(name, data)
    }

    /// A constant f32 scalar (rank 0).
    pub fn f32_scalar(&mut self, name: &str, value: f32) -> ValueId {
        let data = ConstData::new(
            DType::F32,
            vec![],
            Bytes::from(value.to_le_bytes().to_vec()),
        )
        .expect("one element");
        self.b.constant(name, data)
    }

    /// Adds a one-result node with optional operands.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[Option<ValueId>],
    ) -> Result<ValueId, BuildError> {
        let ids = self
            .b
            .wire(name, op, inputs.to_vec(), vec![Some(name.to_string())])?;
        Ok(ids[0].expect("one named result"))
    }

    /// Adds a node whose operands are all present.
    pub fn op(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId, BuildError> {
        Ok(self.b.wire_node(name, op, inputs)?)
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.b.ty(v)
    }
}
