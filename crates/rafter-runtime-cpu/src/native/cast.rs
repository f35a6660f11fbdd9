//! `cast` of f32 to f16: an LLM's new keys and values rounded as they enter an f16 KV cache
//! (a row per token and layer). Round-to-nearest-even, as ONNX Cast and llama.cpp round;
//! `half` converts with F16C where the CPU has it.

use std::sync::Arc;

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rafter_ir::{DType, Graph, Op};

use super::{input_of, In, NativeKernel, Out};

struct CastToF16 {
    x: usize,
}

/// The kernel for a body that is one f32 -> f16 cast, if it is one.
pub(super) fn select(body: &Graph) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    if node.op != (Op::Cast { to: DType::F16 }) || body.outputs.len() != 1 {
        return None;
    }
    Some(Arc::new(CastToF16 {
        x: input_of(body, node.input(0), DType::F32)?,
    }))
}

impl NativeKernel for CastToF16 {
    /// The planner may bind the result over the operand (an elementwise body): read it
    /// from a copy then.
    fn copies_operands(&self) -> bool {
        true
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = ins[self.x].f32s()?;
        let y = &mut outs[0];
        if y.dtype != DType::F16 || y.dims.iter().product::<usize>() != x.len() {
            return Ok(false);
        }
        let bytes = y.bytes_mut();
        // SAFETY: every bit pattern is a valid u16, and `align_to_mut` only hands out the
        // correctly aligned middle of the bytes it borrows.
        let (head, halves, _) = unsafe { bytes.align_to_mut::<u16>() };
        if head.is_empty() && halves.len() == x.len() {
            halves
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(x);
        } else {
            for (b, &v) in bytes.chunks_exact_mut(2).zip(x) {
                b.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        Ok(true)
    }
}
