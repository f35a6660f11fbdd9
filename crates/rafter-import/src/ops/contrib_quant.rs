//! ONNX Runtime's quantized contrib ops (`com.microsoft`), decomposed at import:
//! integer matmuls with a float epilogue (MatMulIntegerToFloat, DynamicQuantizeMatMul),
//! MatMulNBits (block-quantized 4/8-bit weights, onto the IR's `matmul_block_quant`, which
//! keeps them packed), DynamicQuantizeLSTM (dequantized weights, onto the IR's `lstm`),
//! and the QLinear* elementwise ops as DequantizeLinear -> float op -> QuantizeLinear.

use super::registry::OnnxOp;
use super::{Tr, R};
use crate::node::NodeView;
use rafter_ir::{BinaryOp, ConstData, DType, Op, UnaryOp, ValueId};

/// The quantized contrib ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("MatMulIntegerToFloat", |t| {
        let (a, b, a_scale, b_scale) = (t.req(0)?, t.req(1)?, t.req(2)?, t.req(3)?);
        let (a_zp, b_zp, bias) = (t.inp(4)?, t.inp(5)?, t.inp(6)?);
        let scale = t.bin("scale", BinaryOp::Mul, a_scale, b_scale)?;
        t.int_matmul_to_float(a, b, a_zp, b_zp, scale, bias)
    }),
    OnnxOp::new("DynamicQuantizeMatMul", |t| {
        let (a, b, b_scale) = (t.req(0)?, t.req(1)?, t.req(2)?);
        let (b_zp, bias) = (t.inp(3)?, t.inp(4)?);
        // A is quantized per tensor to u8 with its own range, as ORT does.
        let name = |s: &str| Some(format!("{}/{s}", t.n.name));
        let ids = t.cx.emit(
            t.sc,
            t.n,
            format!("{}/quantize_a", t.n.name),
            Op::DynamicQuantizeLinear,
            vec![Some(a)],
            vec![name("a_q"), name("a_scale"), name("a_zp")],
        )?;
        let (aq, a_scale, a_zp) = (ids[0].unwrap(), ids[1].unwrap(), ids[2].unwrap());
        let scale = t.bin("scale", BinaryOp::Mul, a_scale, b_scale)?;
        t.int_matmul_to_float(aq, b, Some(a_zp), b_zp, scale, bias)
    }),
    OnnxOp::new("DynamicQuantizeLSTM", dynamic_quantize_lstm),
    OnnxOp::new("MatMulNBits", matmul_nbits).checked(check_matmul_nbits),
    OnnxOp::new("QLinearAdd", |t| t.qlinear_binary(BinaryOp::Add)),
    OnnxOp::new("QLinearMul", |t| t.qlinear_binary(BinaryOp::Mul)),
    OnnxOp::new("QLinearSigmoid", |t| {
        t.qlinear_unary(|t, x| t.un("sigmoid", UnaryOp::Sigmoid, x))
    }),
    OnnxOp::new("QLinearLeakyRelu", |t| {
        let alpha = t.n.f("alpha", 0.01)?;
        t.qlinear_unary(move |t, x| t.tmp("leaky_relu", Op::LeakyRelu { alpha }, vec![Some(x)]))
    }),
];

/// `DynamicQuantizeLSTM` (X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?,
/// W_scale, W_zero_point, R_scale, R_zero_point): an LSTM whose W `[D, input, 4H]` and R
/// `[D, H, 4H]` are int8/uint8 with per-direction or per-column scales. ORT quantizes the
/// GEMMs' left operands at run time (u8, per call): X once for all steps, the hidden
/// state at every step. rafter does the first exactly (X through
/// `dynamic_quantize_linear` and back) and runs the recurrence in f32 on the dequantized
/// weights, so it differs from ORT by the hidden state's rounding (a few 1e-3 on
/// outputs in `[-1, 1]`; see docs/contrib-ops.md).
fn dynamic_quantize_lstm(t: &mut Tr<'_, '_, '_>) -> R {
    let mut ins = t.all_inputs()?;
    ins.truncate(8);
    let x = t.req(0)?;
    let name = |s: &str| Some(format!("{}/{s}", t.n.name));
    let ids = t.cx.emit(
        t.sc,
        t.n,
        format!("{}/quantize_x", t.n.name),
        Op::DynamicQuantizeLinear,
        vec![Some(x)],
        vec![name("x_q"), name("x_scale"), name("x_zp")],
    )?;
    let deq = Op::DequantizeLinear {
        axis: 1,
        block_size: 0,
    };
    ins[0] = Some(t.tmp("x_rounded", deq, ids)?);
    ins[1] = Some(t.dequantized_rnn_weight("w", 1, 8)?);
    ins[2] = Some(t.dequantized_rnn_weight("r", 2, 10)?);
    t.rnn_of("LSTM", ins)
}

/// MatMulNBits: 4- or 8-bit weights, no `g_idx`, integer (or absent) zero points.
fn check_matmul_nbits(n: &NodeView<'_>) -> Result<(), String> {
    let bits = n.attr("bits").map_or(4, |a| a.i);
    if bits != 4 && bits != 8 {
        return Err(format!("unsupported: bits={bits} (4 and 8 are supported)"));
    }
    if n.input_name(4).is_some() {
        return Err("unsupported: g_idx (act-order group indices)".into());
    }
    Ok(())
}

/// `MatMulNBits`: `Y = A @ dequant(B)^T (+ bias)`, onto the IR's `matmul_block_quant`,
/// which keeps ORT's packed layout: B `[N, k_blocks, blob]` holds each row's blocks of
/// `block_size` elements, low bits first; scales `[N * k_blocks]`; zero points packed the
/// same way per row (absent: `2^(bits-1)`). The weights stay `bits`-bit in the artifact.
fn matmul_nbits(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let k = n.i_req("K")?;
    let cols = n.i_req("N")?;
    let bits = n.i("bits", 4)?;
    let block = n.i_req("block_size")?;
    // 4: ORT's CPU kernel rounds A to int8 per block (SQNBIT_CompInt8); kept for ours.
    let accuracy_level = n.i("accuracy_level", 0)?;
    if block < 16 || (block as u64).count_ones() != 1 {
        return Err(n.invalid(format!("block_size {block} is not a power of 2 >= 16")));
    }
    let (a, b, scales) = (t.req(0)?, t.req(1)?, t.req(2)?);
    let (zp, bias) = (t.inp(3)?, t.inp(5)?);
    for (v, what) in [(Some(a), "A"), (Some(scales), "scales"), (bias, "bias")] {
        if let Some(v) = v.filter(|&v| t.dtype(v) != DType::F32) {
            return Err(n.unsupported(format!(
                "unsupported: {what} of type {} (only f32)",
                t.dtype(v)
            )));
        }
    }
    if let Some(z) = zp.filter(|&z| t.dtype(z) != DType::U8) {
        return Err(n.unsupported(format!(
            "unsupported: {} zero points (only packed u8)",
            t.dtype(z)
        )));
    }
    // The op's operands: zero points at 3, bias at 4 (ORT's g_idx slot dropped).
    t.finish(
        Op::MatMulBlockQuant {
            k,
            n: cols,
            bits,
            block_size: block,
            accuracy_level,
        },
        super::trim(vec![Some(a), Some(b), Some(scales), zp, bias]),
    )
}

impl Tr<'_, '_, '_> {
    /// `(A - a_zp) @ (B - b_zp)` in i32, converted to float and multiplied by `scale`
    /// (`a_scale * b_scale`), plus `bias`: the node's output.
    fn int_matmul_to_float(
        &mut self,
        a: ValueId,
        b: ValueId,
        a_zp: Option<ValueId>,
        b_zp: Option<ValueId>,
        scale: ValueId,
        bias: Option<ValueId>,
    ) -> R {
        let a_zp = match (a_zp, b_zp) {
            (None, Some(_)) => {
                let dt = self.dtype(a);
                let z = ConstData::new(dt, vec![], vec![0u8].into())
                    .map_err(|e| self.n.invalid(e.to_string()))?;
                Some(self.konst("a_zero", z))
            }
            _ => a_zp,
        };
        let ins = super::trim(vec![Some(a), Some(b), a_zp, b_zp]);
        let acc = self.tmp("matmul_integer", Op::MatMulInteger, ins)?;
        let dt = self.dtype(scale);
        let f = self.tmp("to_float", Op::Cast { to: dt }, vec![Some(acc)])?;
        match bias {
            None => self.finish(Op::Binary { op: BinaryOp::Mul }, vec![Some(f), Some(scale)]),
            Some(bias) => {
                let y = self.bin("scaled", BinaryOp::Mul, f, scale)?;
                self.finish(Op::Binary { op: BinaryOp::Add }, vec![Some(y), Some(bias)])
            }
        }
    }

    /// DynamicQuantizeLSTM's weight operand `w` `[D, rows, 4H]` with its scale and zero
    /// point (operands `s`, `s + 1`; `[D]` or `[D, 4H]`) as ONNX LSTM wants it: float
    /// `(w - zp) * scale`, transposed to `[D, 4H, rows]`.
    fn dequantized_rnn_weight(&mut self, suffix: &str, w: usize, s: usize) -> R<ValueId> {
        let (wq, scale, zp) = (self.req(w)?, self.req(s)?, self.inp(s + 1)?);
        let axes = match self.rank(scale) {
            1 => vec![1, 2],
            2 => vec![1],
            r => {
                return Err(self.n.invalid(format!(
                    "{suffix} scale {} has rank {r}; want [D] or [D, 4H]",
                    self.ty(scale)
                )))
            }
        };
        let wf = self.tmp(suffix, Op::Cast { to: DType::F32 }, vec![Some(wq)])?;
        let wf = match zp {
            Some(z) => {
                let z = self.tmp(
                    &format!("{suffix}_zp_f"),
                    Op::Cast { to: DType::F32 },
                    vec![Some(z)],
                )?;
                let z = self.tmp(
                    &format!("{suffix}_zp_b"),
                    Op::Unsqueeze { axes: axes.clone() },
                    vec![Some(z)],
                )?;
                self.bin(&format!("{suffix}_centred"), BinaryOp::Sub, wf, z)?
            }
            None => wf,
        };
        let s = self.tmp(
            &format!("{suffix}_scale_b"),
            Op::Unsqueeze { axes },
            vec![Some(scale)],
        )?;
        let wf = self.bin(&format!("{suffix}_dequant"), BinaryOp::Mul, wf, s)?;
        self.tmp(
            &format!("{suffix}_t"),
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![Some(wf)],
        )
    }

    /// Operands `i, i+1, i+2` (x, scale, zero point) dequantized to float.
    pub(super) fn dequant_operand(&mut self, suffix: &str, i: usize) -> R<ValueId> {
        let (x, s, z) = (self.req(i)?, self.req(i + 1)?, self.inp(i + 2)?);
        let op = Op::DequantizeLinear {
            axis: 1,
            block_size: 0,
        };
        self.tmp(suffix, op, super::trim(vec![Some(x), Some(s), z]))
    }

    /// Quantizes float `y` with operands `i, i+1` (scale, zero point; the zero point absent
    /// means u8 0) as the node's output.
    pub(super) fn requantize(&mut self, y: ValueId, i: usize, like: ValueId) -> R {
        let (s, z) = (self.req(i)?, self.inp(i + 1)?);
        let output_dtype = match z {
            Some(z) => self.dtype(z),
            None => self.dtype(like),
        };
        let op = Op::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype,
        };
        self.finish(op, super::trim(vec![Some(y), Some(s), z]))
    }

    /// `QLinearAdd` / `QLinearMul` (operands A, A_scale, A_zp, B, B_scale, B_zp, C_scale,
    /// C_zp) in the order ORT's x86 kernels (MLAS) round: the zero-point-free integers
    /// in float, scaled by the ratios `A_scale / C_scale` and `B_scale / C_scale` (add) or
    /// `A_scale * B_scale / C_scale` (mul), offset by C_zp, then rounded half to even.
    fn qlinear_binary(&mut self, op: BinaryOp) -> R {
        let a = self.centred("a", 0)?;
        let b = self.centred("b", 3)?;
        let (sa, sb, sc) = (self.req(1)?, self.req(4)?, self.req(6)?);
        let y = if op == BinaryOp::Mul {
            let sab = self.bin("scale_ab", BinaryOp::Mul, sa, sb)?;
            let ratio = self.bin("ratio", BinaryOp::Div, sab, sc)?;
            let ab = self.bin("product", BinaryOp::Mul, a, b)?;
            self.bin("scaled", BinaryOp::Mul, ab, ratio)?
        } else {
            let ra = self.bin("ratio_a", BinaryOp::Div, sa, sc)?;
            let rb = self.bin("ratio_b", BinaryOp::Div, sb, sc)?;
            let a = self.bin("scaled_a", BinaryOp::Mul, a, ra)?;
            let b = self.bin("scaled_b", BinaryOp::Mul, b, rb)?;
            self.bin("sum", BinaryOp::Add, a, b)?
        };
        // The zero point is added before rounding (ties go to the even sum, not to the
        // even product: ORT's 34.5 + 125 gives 160, not 159).
        let zc = self.inp(7)?;
        let output_dtype = match zc {
            Some(z) => self.dtype(z),
            None => self.dtype(self.req(0)?),
        };
        let y = match zc {
            Some(z) => {
                let zf = self.tmp("c_zero", Op::Cast { to: DType::F32 }, vec![Some(z)])?;
                self.bin("offset", BinaryOp::Add, y, zf)?
            }
            None => y,
        };
        let one = self.scalar("one", 1.0, DType::F32)?;
        let q = Op::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype,
        };
        self.finish(q, vec![Some(y), Some(one)])
    }

    /// Operand `i` minus its zero point (operand `i + 2`, absent meaning 0), in f32.
    pub(super) fn centred(&mut self, suffix: &str, i: usize) -> R<ValueId> {
        let x = self.req(i)?;
        let xf = self.tmp(suffix, Op::Cast { to: DType::F32 }, vec![Some(x)])?;
        match self.inp(i + 2)? {
            None => Ok(xf),
            Some(z) => {
                let zf = self.tmp(
                    &format!("{suffix}_zero"),
                    Op::Cast { to: DType::F32 },
                    vec![Some(z)],
                )?;
                self.bin(&format!("{suffix}_centred"), BinaryOp::Sub, xf, zf)
            }
        }
    }

    /// A QLinear op of one operand: X, X_scale, X_zp, Y_scale, Y_zp.
    fn qlinear_unary(&mut self, f: impl FnOnce(&mut Self, ValueId) -> R<ValueId>) -> R {
        let x = self.dequant_operand("x", 0)?;
        let y = f(self, x)?;
        let like = self.req(0)?;
        self.requantize(y, 3, like)
    }
}
