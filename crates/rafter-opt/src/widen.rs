//! Half precision computed in f32 on the CPU.
//!
//! rafter's CPU kernels compute in f32 (the decoder's f16 weights and KV cache aside,
//! which the LLM kernels read as they are): an f16 or bf16 model's convolutions, products
//! and normalisations would otherwise fall to the reference executor, 20-40x slower than
//! the same model in f32. ONNX Runtime's CPU provider answers the same gap the same way: its
//! `InsertCastTransformer` surrounds every node that has no f16 kernel with casts to and
//! from f32 and then removes the casts that cancel, so consecutive nodes pass f32 between
//! them. [`widen_half`] does that at the graph level, before fusion:
//!
//! - a **compute** node ([`Widening::Compute`]: arithmetic, contractions, normalisations,
//!   pooling, attention) with a half-precision operand or result runs on f32 operands and
//!   gives f32 results;
//! - a **data-movement** node ([`Widening::Follow`]: reshapes, transposes, slices,
//!   gathers, concatenations) is exact in either precision, so it follows its data: it runs
//!   in f32 when one of its half operands already exists in f32, and as it is otherwise (a
//!   gather from an f16 embedding table reads the rows it needs in f16, not a widened copy
//!   of the table);
//! - every other node (casts, quantization, ops whose result type is an attribute, bit
//!   casts) runs as it is, on the half-precision form of its operands.
//!
//! Each value exists in the form(s) its users need, made once where first needed: an f32
//! form of a half value is a `cast` of it, or for a constant an f32 copy made here at
//! compile time (the weights of the computing nodes are widened once, not per call); a
//! half form of a value computed in f32 is a `cast` back, rounding to nearest even as ONNX
//! Cast does. The graph's inputs, outputs and states keep their types and names, so callers
//! see the model they exported.
//!
//! Numerically this is ONNX Runtime's CPU behaviour: a chain of widened nodes keeps f32
//! between them and rounds to half precision only where a half value leaves the chain.

use bytes::Bytes;
use half::{bf16, f16};
use rafter_ir::{ConstData, DType, Graph, Node, Op, TensorType, ValueDef, ValueId};

use crate::util::is_control_flow;

/// How a node takes half-precision operands once the graph is widened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Widening {
    /// Computes in f32 whenever an operand or result is f16 or bf16.
    Compute,
    /// Exact in any precision: runs in f32 when its data already is.
    Follow,
    /// Runs as it is (its result type is an attribute, or it looks at bits).
    Keep,
}

/// How `op` is treated by [`widen_half`] (see the module docs).
pub fn widening(op: &Op) -> Widening {
    match op {
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Clip
        | Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Selu { .. }
        | Op::Celu { .. }
        | Op::HardSigmoid { .. }
        | Op::ThresholdedRelu { .. }
        | Op::Shrink { .. }
        | Op::Gelu { .. }
        | Op::IsInf { .. }
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::Cumulative { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::GroupNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::BatchNorm { .. }
        | Op::LpNorm { .. }
        | Op::Lrn { .. }
        | Op::MeanVarianceNorm { .. }
        | Op::MatMul
        | Op::Gemm { .. }
        | Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Einsum { .. }
        | Op::Attention { .. }
        | Op::RotaryEmbedding { .. }
        | Op::Pool { .. }
        | Op::GlobalPool { .. }
        | Op::Resize { .. }
        | Op::GridSample { .. }
        | Op::SwiGlu { .. }
        | Op::TopK { .. }
        | Op::Lstm { .. }
        | Op::Gru { .. }
        | Op::Rnn { .. } => Widening::Compute,
        Op::Identity
        | Op::Reshape { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::Transpose { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Expand
        | Op::Tile
        | Op::Pad { .. }
        | Op::Trilu { .. }
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. } => Widening::Follow,
        _ => Widening::Keep,
    }
}

/// Rewrites the graph so that its half-precision compute runs in f32 (see the module docs).
/// Returns whether anything changed. Graphs with control flow are left alone (their bodies
/// capture outer values by name).
pub fn widen_half(g: &mut Graph) -> bool {
    if g.nodes.iter().any(|n| is_control_flow(&n.op)) {
        return false;
    }
    let mut w = Widener {
        src: g,
        dst: Graph::new(g.name.clone()),
        half: vec![None; g.values.len()],
        wide: vec![None; g.values.len()],
        widened_nodes: 0,
    };
    for &v in &g.inputs {
        let val = g.value(v);
        let new = w.dst.add_input(val.name.clone(), val.ty.clone());
        w.half[v.0 as usize] = Some(new);
    }
    for node in &g.nodes {
        w.node(node);
    }
    if w.widened_nodes == 0 {
        return false;
    }
    let outputs: Vec<ValueId> = g.outputs.iter().map(|&v| w.as_is(v)).collect();
    let mut dst = w.dst;
    dst.outputs = outputs;
    dst.states = g.states.clone();
    *g = dst;
    true
}

struct Widener<'a> {
    src: &'a Graph,
    dst: Graph,
    /// Each source value's form in its own type (for a half value: in half precision).
    half: Vec<Option<ValueId>>,
    /// Each half-precision source value's f32 form.
    wide: Vec<Option<ValueId>>,
    widened_nodes: usize,
}

impl Widener<'_> {
    fn half_value(&self, v: ValueId) -> bool {
        self.src.value(v).ty.dtype.is_half()
    }

    /// Source value `v` in its own type, casting its f32 form back on first need.
    fn as_is(&mut self, v: ValueId) -> ValueId {
        if let Some(x) = self.half[v.0 as usize] {
            return x;
        }
        let val = self.src.value(v);
        let out = match (val.def, self.wide[v.0 as usize]) {
            (ValueDef::Const(c), _) => self
                .dst
                .add_const(val.name.clone(), self.src.constant(c).clone()),
            (_, Some(wide)) => self.cast(wide, val.name.clone(), val.ty.clone()),
            _ => panic!("value {} used before its definition", val.name),
        };
        self.half[v.0 as usize] = Some(out);
        out
    }

    /// The f32 form of half-precision source value `v`: a compile-time copy of a constant,
    /// else a cast of its half form, made on first need.
    fn widened(&mut self, v: ValueId) -> ValueId {
        if let Some(x) = self.wide[v.0 as usize] {
            return x;
        }
        let val = self.src.value(v);
        let name = format!("{}.f32", val.name);
        let out = match val.def {
            ValueDef::Const(c) => self.dst.add_const(name, to_f32(self.src.constant(c))),
            _ => {
                let half = self.as_is(v);
                let ty = TensorType::new(DType::F32, val.ty.dims.clone());
                self.cast(half, name, ty)
            }
        };
        self.wide[v.0 as usize] = Some(out);
        out
    }

    fn cast(&mut self, x: ValueId, name: String, ty: TensorType) -> ValueId {
        self.dst.add_node(
            format!("{name}.cast"),
            Op::Cast { to: ty.dtype },
            vec![Some(x)],
            vec![Some((name, ty))],
        )[0]
        .expect("one result")
    }

    /// Whether node `n` runs in f32 (see the module docs).
    fn widens(&self, n: &Node) -> bool {
        let halves = || n.inputs.iter().chain(&n.outputs).flatten();
        if !halves().any(|&v| self.half_value(v)) {
            return false;
        }
        match widening(&n.op) {
            Widening::Compute => true,
            Widening::Follow => n
                .inputs
                .iter()
                .flatten()
                .any(|&v| self.half_value(v) && self.wide[v.0 as usize].is_some()),
            Widening::Keep => false,
        }
    }

    fn node(&mut self, n: &Node) {
        let widen = self.widens(n);
        let inputs: Vec<Option<ValueId>> = n
            .inputs
            .iter()
            .map(|v| {
                v.map(|v| {
                    if widen && self.half_value(v) {
                        self.widened(v)
                    } else {
                        self.as_is(v)
                    }
                })
            })
            .collect();
        let outputs = n
            .outputs
            .iter()
            .map(|o| {
                o.map(|o| {
                    let val = self.src.value(o);
                    if widen && val.ty.dtype.is_half() {
                        let ty = TensorType::new(DType::F32, val.ty.dims.clone());
                        (format!("{}.f32", val.name), ty)
                    } else {
                        (val.name.clone(), val.ty.clone())
                    }
                })
            })
            .collect();
        let outs = self
            .dst
            .add_node(n.name.clone(), n.op.clone(), inputs, outputs);
        for (old, new) in n.outputs.iter().zip(outs) {
            if let (Some(old), Some(new)) = (old, new) {
                if widen && self.half_value(*old) {
                    self.wide[old.0 as usize] = Some(new);
                } else {
                    self.half[old.0 as usize] = Some(new);
                }
            }
        }
        if widen {
            self.widened_nodes += 1;
        }
    }
}

/// Constant `c` (f16 or bf16) as f32: exact, every half value is an f32 value.
fn to_f32(c: &ConstData) -> ConstData {
    let values: Vec<f32> = match c.dtype {
        DType::F16 => c
            .bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => c
            .bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => unreachable!("only half-precision constants are widened, not {other}"),
    };
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    ConstData {
        dtype: DType::F32,
        dims: c.dims.clone(),
        bytes: Bytes::from(bytes),
    }
}
