//! Cumulative sums and products (`cumulative`: ONNX CumSum) by `rafter-kernels-cpu`'s
//! row scan on borrowed operands: f32, f64, i32 and i64 in their own type, f16 widened to
//! f32, scanned, and rounded to f16 once per result.
//!
//! The kernel accumulates in the element type, as ONNX Runtime's CumSum does (see
//! `rafter_kernels_cpu::cumulative`); the reference path accumulates floats in f64, so an
//! f32 scan may differ from it in the last bits (within the conformance tolerance).
//!
//! The axis is the node's second operand: in practice a small constant the compiler
//! copies into the body (read once, at selection), else a body input (an integer scalar
//! read per dispatch). A body with anything besides the one `cumulative` node, a
//! non-scalar axis or one out of range takes the reference path, which reports the error.

use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use rafter_ir::{CumKind, DType, Graph, Op, ValueDef};
use rafter_kernels_cpu::{CumElem, Cumulative};

use super::operands::{elems, elems_mut, f16s, f16s_mut, Plain};
use super::{In, NativeKernel, Out, Par};

/// Where the axis comes from.
#[derive(Clone, Copy, Debug)]
enum Axis {
    /// A constant of the body (unresolved: negative counts from the end).
    Const(i64),
    /// Body input `i`, an integer scalar.
    Input(usize),
}

struct CumulativeKernel {
    /// Body input index of the tensor.
    x: usize,
    axis: Axis,
    dtype: DType,
    prod: bool,
    exclusive: bool,
    reverse: bool,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let Op::Cumulative {
        kind,
        exclusive,
        reverse,
    } = node.op
    else {
        return None;
    };
    let [Some(y)] = node.outputs.as_slice() else {
        return None;
    };
    let dtype = body.value(*y).ty.dtype;
    if body.outputs != [*y]
        || !matches!(
            dtype,
            DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::F16
        )
    {
        return None;
    }
    let x = match body.value((*node.inputs.first()?)?).def {
        ValueDef::Input(k) if body.value(body.inputs[k]).ty.dtype == dtype => k,
        _ => return None,
    };
    let a = (*node.inputs.get(1)?)?;
    let axis = match body.value(a).def {
        ValueDef::Const(c) => match body.constant(c).to_i64s()?.as_slice() {
            [axis] => Axis::Const(*axis),
            _ => return None,
        },
        ValueDef::Input(k)
            if matches!(body.value(body.inputs[k]).ty.dtype, DType::I32 | DType::I64) =>
        {
            Axis::Input(k)
        }
        _ => return None,
    };
    Some(Arc::new(CumulativeKernel {
        x,
        axis,
        dtype,
        prod: kind == CumKind::Prod,
        exclusive,
        reverse,
        par: par.clone(),
    }))
}

/// The axis resolved against `rank`: `None` when it is not one integer in `-rank..rank`.
fn axis_of(axis: Axis, ins: &[In<'_>], rank: usize) -> Option<usize> {
    let raw = match axis {
        Axis::Const(a) => a,
        Axis::Input(i) => match (ins[i].dtype, ins[i].bytes()) {
            (DType::I64, b) if b.len() == 8 => i64::from_le_bytes(b.try_into().ok()?),
            (DType::I32, b) if b.len() == 4 => i32::from_le_bytes(b.try_into().ok()?) as i64,
            _ => return None,
        },
    };
    let r = rank as i64;
    let axis = if raw < 0 { raw + r } else { raw };
    (0..r).contains(&axis).then_some(axis as usize)
}

/// The scan in `T` over the operand's bytes into the result's; `false` when the result is
/// misaligned.
fn scan<T: CumElem + Plain>(
    x: &In<'_>,
    y: &mut Out<'_>,
    s: &Cumulative,
    par: &Par,
) -> Result<bool, String> {
    let xs = elems::<T>(x.bytes());
    let Some(ys) = elems_mut::<T>(y.bytes_mut()) else {
        return Ok(false);
    };
    rafter_kernels_cpu::cumulative(&xs, ys, s, &**par).map_err(|e| format!("cumulative: {e}"))?;
    Ok(true)
}

impl NativeKernel for CumulativeKernel {
    fn out_dims(&self, ins: &[In<'_>]) -> Option<Vec<usize>> {
        Some(ins[self.x].dims.clone())
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let y = &mut outs[0];
        if y.dims != x.dims || x.dtype != self.dtype || y.dtype != self.dtype {
            return Ok(false);
        }
        let Some(axis) = axis_of(self.axis, ins, x.dims.len()) else {
            return Ok(false);
        };
        let s = Cumulative::around(&x.dims, axis, self.prod, self.exclusive, self.reverse);
        match self.dtype {
            DType::F32 => {
                let ys = y.f32s()?;
                rafter_kernels_cpu::cumulative(x.f32s()?, ys, &s, &*self.par)
                    .map_err(|e| format!("cumulative: {e}"))?;
                Ok(true)
            }
            DType::F64 => scan::<f64>(x, y, &s, &self.par),
            DType::I32 => scan::<i32>(x, y, &s, &self.par),
            DType::I64 => scan::<i64>(x, y, &s, &self.par),
            DType::F16 => {
                let halves = f16s(x.bytes());
                let mut wide = vec![0f32; halves.len()];
                halves.convert_to_f32_slice(&mut wide);
                let mut sums = vec![0f32; wide.len()];
                rafter_kernels_cpu::cumulative(&wide, &mut sums, &s, &*self.par)
                    .map_err(|e| format!("cumulative: {e}"))?;
                match f16s_mut(y.bytes_mut()) {
                    Some(ys) if ys.len() == sums.len() => {
                        ys.convert_from_f32_slice(&sums);
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::text::parse_graph;

    fn body(dtype: &str, flags: &str) -> Graph {
        parse_graph(&format!(
            "graph @g(%x: {dtype}[2, 3], %a: i64[]) -> (%y) {{\n  \
             %y: {dtype}[2, 3] = cumulative{{{flags}}}(%x, %a)\n}}"
        ))
        .unwrap()
    }

    #[test]
    fn selects_a_lone_cumulative_of_supported_dtypes() {
        let par = super::super::pool(1);
        let flags = "kind = sum, exclusive = false, reverse = false";
        for dt in ["f32", "f64", "i32", "i64", "f16"] {
            assert!(select(&body(dt, flags), &par).is_some(), "{dt}");
        }
        assert!(select(&body("bf16", flags), &par).is_none());
    }

    #[test]
    fn takes_a_constant_axis_from_the_body() {
        let g = parse_graph(
            "graph @g(%x: f32[2, 3]) -> (%y) {\n  const %a: i64[] = dense [-1]\n  \
             %y: f32[2, 3] = cumulative{kind = prod, exclusive = true, reverse = true}(%x, %a)\n}",
        )
        .unwrap();
        assert!(select(&g, &super::super::pool(1)).is_some());
    }
}
