//! `cast` between f32 and the half-precision types (f16, bf16), both ways: an LLM's new
//! keys and values rounded as they enter an f16 KV cache, and the casts the compiler puts
//! where an f16 model's values enter and leave the f32 compute of the CPU target
//! (`rafter_opt::widen`). Round-to-nearest-even to half precision, as ONNX Cast and
//! llama.cpp round; widening is exact. `half` converts with F16C where the CPU has it.

use std::sync::Arc;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use rafter_ir::{DType, Graph, Op};

use super::{input_of, In, NativeKernel, Out};

/// Which way a cast goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// f32 -> f16 or bf16 (`DType` of the result).
    Narrow(DType),
    /// f16 or bf16 (`DType` of the operand) -> f32.
    Widen(DType),
}

struct Cast {
    x: usize,
    direction: Direction,
}

/// The kernel for a body that is one cast between f32 and f16 or bf16, if it is one.
pub(super) fn select(body: &Graph) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let Op::Cast { to } = node.op else {
        return None;
    };
    if body.outputs.len() != 1 {
        return None;
    }
    let from = body.value(node.input(0)?).ty.dtype;
    let direction = match (from, to) {
        (DType::F32, t) if t.is_half() => Direction::Narrow(t),
        (f, DType::F32) if f.is_half() => Direction::Widen(f),
        _ => return None,
    };
    Some(Arc::new(Cast {
        x: input_of(body, node.input(0), from)?,
        direction,
    }))
}

impl NativeKernel for Cast {
    /// The planner may bind the result over the operand (an elementwise body): read it
    /// from a copy then.
    fn copies_operands(&self) -> bool {
        true
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[self.x];
        let y = &mut outs[0];
        if y.dims.iter().product::<usize>() != x.len() {
            return Ok(false);
        }
        match self.direction {
            Direction::Narrow(to) => {
                if y.dtype != to {
                    return Ok(false);
                }
                narrow(x.f32s()?, to, y.bytes_mut());
            }
            Direction::Widen(from) => {
                if x.dtype != from || y.dtype != DType::F32 {
                    return Ok(false);
                }
                let bits = x.u16s()?;
                let out = y.f32s()?;
                match from {
                    DType::F16 => bits.reinterpret_cast::<f16>().convert_to_f32_slice(out),
                    _ => bits.reinterpret_cast::<bf16>().convert_to_f32_slice(out),
                }
            }
        }
        Ok(true)
    }
}

/// Rounds `x` to `to` (f16 or bf16) into `bytes` (little-endian, `2 * x.len()` of them).
fn narrow(x: &[f32], to: DType, bytes: &mut [u8]) {
    // SAFETY: every bit pattern is a valid u16, and `align_to_mut` only hands out the
    // correctly aligned middle of the bytes it borrows.
    let (head, halves, _) = unsafe { bytes.align_to_mut::<u16>() };
    if head.is_empty() && halves.len() == x.len() {
        match to {
            DType::F16 => halves
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(x),
            _ => halves
                .reinterpret_cast_mut::<bf16>()
                .convert_from_f32_slice(x),
        }
        return;
    }
    for (b, &v) in bytes.chunks_exact_mut(2).zip(x) {
        let le = match to {
            DType::F16 => f16::from_f32(v).to_le_bytes(),
            _ => bf16::from_f32(v).to_le_bytes(),
        };
        b.copy_from_slice(&le);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::Stats;

    fn body(from: DType, to: DType) -> Graph {
        rafter_ir::text::parse_graph(&format!(
            "graph @g(%x: {from}[5]) -> (%y) {{\n  %y: {to}[5] = cast{{to = {to}}}(%x)\n}}"
        ))
        .unwrap()
    }

    /// Values whose roundings are known: exact ones, a tie (to even), an overflow, a
    /// subnormal, and a NaN.
    const XS: [f32; 5] = [1.5, 1.0 + 1.0 / 4096.0, 70000.0, 1e-7, f32::NAN];

    fn run_narrow(to: DType) -> Vec<u16> {
        let k = select(&body(DType::F32, to)).expect("a native cast");
        let bytes: Vec<u8> = XS.iter().flat_map(|v| v.to_le_bytes()).collect();
        let stats = Stats::default();
        let x = In::new(DType::F32, vec![5], &bytes, &stats).unwrap();
        let mut out = vec![0u8; 10];
        let mut y = [Out::new(to, vec![5], &mut out).unwrap()];
        assert!(k.run(&[x], &mut y).unwrap());
        out.chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        let y = run_narrow(DType::F16);
        // 1.5; 1 + 2^-12 is a tie between 1 and 1 + 2^-10: even is 1.0 (0x3c00);
        // 70000 overflows f16 to +inf; 1e-7 is the subnormal 2 * 2^-24; NaN stays NaN.
        assert_eq!(&y[..4], &[0x3e00, 0x3c00, 0x7c00, 0x0002]);
        assert!(f16::from_bits(y[4]).is_nan());
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        let y = run_narrow(DType::BF16);
        // 1.5; 1 + 2^-12 rounds to 1.0 (bf16 keeps 7 fraction bits); 70000 lies between
        // 136 and 137 steps of 512 (bf16's spacing at 2^16): 70,144 is nearer.
        assert_eq!(y[0], 0x3fc0);
        assert_eq!(y[1], 0x3f80);
        assert_eq!(bf16::from_bits(y[2]).to_f32(), 70144.0);
        assert_eq!(bf16::from_bits(y[3]), bf16::from_f32(1e-7));
        assert!(bf16::from_bits(y[4]).is_nan());
    }

    #[test]
    fn half_to_f32_is_exact() {
        for from in [DType::F16, DType::BF16] {
            let k = select(&body(from, DType::F32)).expect("a native cast");
            let bits: [u16; 5] = match from {
                DType::F16 => [0x3e00, 0x0001, 0xfbff, 0x7c00, 0x7e00],
                _ => [0x3fc0, 0x0001, 0xff7f, 0x7f80, 0x7fc0],
            };
            let want: Vec<f32> = match from {
                DType::F16 => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
                _ => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
            };
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            let stats = Stats::default();
            let x = In::new(from, vec![5], &bytes, &stats).unwrap();
            let mut out = vec![0f32; 5];
            let mut y = [Out::from_f32s(vec![5], &mut out)];
            assert!(k.run(&[x], &mut y).unwrap());
            assert_eq!(&out[..4], &want[..4], "{from}");
            assert!(out[4].is_nan());
            // Spot values: 1.5, the smallest subnormal, the most negative finite, +inf.
            assert_eq!(out[0], 1.5);
            assert!(out[1] > 0.0 && out[1] < 1e-7);
            assert!(out[3].is_infinite());
        }
    }

    #[test]
    fn other_casts_are_not_this_kernel() {
        assert!(select(&body(DType::F16, DType::BF16)).is_none());
        assert!(select(&body(DType::F32, DType::I32)).is_none());
        assert!(select(&body(DType::I64, DType::F32)).is_none());
    }
}
