//! ggml's numerics for products with block-format weights, written out here independently
//! of the kernels: how ggml's CPU backend quantizes the activations on x86-64 (the weight
//! type's `vec_dot_type` and its `from_float`), and an f64 evaluation of what its dot
//! products then compute. `tests/quant_ggml.rs` anchors this model to ggml's own outputs
//! (`tests/data/ggml_products.txt`).

use rafter_kernels_cpu::BlockFormat;
use rafter_quant::{dequantize_row, quantize_row};

/// ggml's activation types.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    Q8_0,
    Q8_1,
    Q8_K,
}

impl ActType {
    pub fn block(self) -> usize {
        match self {
            ActType::Q8_K => 256,
            _ => 32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ActType::Q8_0 => "q8_0",
            ActType::Q8_1 => "q8_1",
            ActType::Q8_K => "q8_K",
        }
    }
}

/// ggml-cpu.c's `type_traits_cpu[format].vec_dot_type`. Q8_1 and Q8_K have no dot product
/// in ggml (they are activation types); the kernels pair them like Q8_0 and the K formats.
pub fn vec_dot_type(format: BlockFormat) -> ActType {
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 | BlockFormat::Q8_1 => {
            ActType::Q8_0
        }
        BlockFormat::Q4_1 | BlockFormat::Q5_1 => ActType::Q8_1,
        BlockFormat::Q2_K
        | BlockFormat::Q3_K
        | BlockFormat::Q4_K
        | BlockFormat::Q5_K
        | BlockFormat::Q6_K
        | BlockFormat::Q8_K => ActType::Q8_K,
    }
}

/// One row of quantized activations: per block the scale `d` as the dot products read it
/// (the f16 value for Q8_0/Q8_1), the quants, and Q8_1's `s` (f16 value).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRow {
    pub kind: ActType,
    pub d: Vec<f32>,
    pub q: Vec<i8>,
    pub s: Vec<f32>,
}

/// Variants of the model, to show what the tests can tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// ggml's x86-64 CPU backend.
    Ggml,
    /// The Q8_0/Q8_1 scale (and `s`) kept in f32 instead of f16.
    F32Scale,
    /// Q8_K's 256-element blocks quantized per 32 instead.
    Per32,
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// ggml's activation quantization of one row.
pub fn quantize(kind: ActType, x: &[f32]) -> QuantRow {
    quantize_variant(kind, x, Variant::Ggml)
}

/// [`quantize`], or one of the deliberately wrong [`Variant`]s.
pub fn quantize_variant(kind: ActType, x: &[f32], variant: Variant) -> QuantRow {
    let mut row = QuantRow {
        kind,
        d: vec![],
        q: vec![],
        s: vec![],
    };
    if kind == ActType::Q8_K && variant != Variant::Per32 {
        // x86-64 runs `quantize_row_q8_K_ref` (arch/x86/quants.c), which rafter-quant
        // reproduces bit for bit (its tests hold it to ggml's C).
        let mut bytes = vec![0u8; x.len() / 256 * 292];
        quantize_row(BlockFormat::Q8_K, x, &mut bytes).unwrap();
        for b in bytes.chunks_exact(292) {
            row.d.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            row.q.extend(b[4..260].iter().map(|&v| v as i8));
            row.s.push(0.0);
        }
        return row;
    }
    // x86-64's `quantize_row_q8_0` / `quantize_row_q8_1` (AVX2): `d = amax / 127` stored
    // as f16, `q = round_to_nearest_even(x * (127 / amax))`, Q8_1's `s = f16(d * Σ q)` from
    // the f32 `d`. (The portable `_ref` versions round half away from zero of `x * (1/d)`.)
    for xb in x.chunks(32) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let q: Vec<i8> = xb
            .iter()
            .map(|&v| (v * id).round_ties_even() as i8)
            .collect();
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        let (dv, sv) = match variant {
            Variant::F32Scale => (d, d * sum as f32),
            _ => (f16_round(d), f16_round(d * sum as f32)),
        };
        row.d.push(if variant == Variant::Per32 { d } else { dv });
        row.s.push(if kind == ActType::Q8_1 { sv } else { 0.0 });
        row.q.extend(q);
    }
    row
}

/// The row in ggml's block layout (`block_q8_0`, `block_q8_1`, `block_q8_K`).
pub fn to_bytes(r: &QuantRow) -> Vec<u8> {
    let mut out = vec![];
    let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    match r.kind {
        ActType::Q8_0 | ActType::Q8_1 => {
            for (b, qb) in r.q.chunks(32).enumerate() {
                out.extend(f16(r.d[b]));
                if r.kind == ActType::Q8_1 {
                    out.extend(f16(r.s[b]));
                }
                out.extend(qb.iter().map(|&v| v as u8));
            }
        }
        ActType::Q8_K => {
            for (b, qb) in r.q.chunks(256).enumerate() {
                out.extend(r.d[b].to_le_bytes());
                out.extend(qb.iter().map(|&v| v as u8));
                for q16 in qb.chunks(16) {
                    out.extend((q16.iter().map(|&v| v as i32).sum::<i32>() as i16).to_le_bytes());
                }
            }
        }
    }
    out
}

/// One weight row as the model needs it: the dequantized values and, for the `_1`
/// formats, each block's min.
pub struct WeightRow {
    pub w: Vec<f32>,
    pub mins: Vec<f32>,
}

/// `format`'s row `bytes` of `k` elements, dequantized (bit-exact with gguf-py: rafter-quant's
/// tests hold it there).
pub fn weight_row(format: BlockFormat, bytes: &[u8], k: usize) -> WeightRow {
    let mut w = vec![0.0f32; k];
    dequantize_row(format, bytes, &mut w).unwrap();
    let mins = match format {
        // `d: f16, m: f16, ...`
        BlockFormat::Q4_1 | BlockFormat::Q5_1 => bytes
            .chunks_exact(format.block_bytes())
            .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
            .collect(),
        _ => vec![],
    };
    WeightRow { w, mins }
}

/// ggml's product of one weight row with a quantized activation row, evaluated in f64:
/// `Σ_k w_k d_b q_k` over the dequantized weights, plus for Q8_1 (the `_1` formats)
/// `Σ_b m_b (s_b - d_b Σ_b q)`, since ggml multiplies the block's min by the f16 `s`
/// rather than by `d Σ q`. Returns the value and the magnitude `Σ |terms|` that f32
/// rounding errors scale with.
pub fn product(w: &WeightRow, x: &QuantRow) -> (f64, f64) {
    let blk = x.q.len() / x.d.len();
    let (mut sum, mut mag) = (0.0f64, 0.0f64);
    for ((wb, qb), &d) in w.w.chunks(blk).zip(x.q.chunks(blk)).zip(&x.d) {
        for (&wv, &q) in wb.iter().zip(qb) {
            let t = wv as f64 * d as f64 * q as f64;
            sum += t;
            mag += t.abs();
        }
    }
    if x.kind == ActType::Q8_1 {
        for (b, &m) in w.mins.iter().enumerate() {
            let qs: i32 = x.q[32 * b..32 * (b + 1)].iter().map(|&v| v as i32).sum();
            let corr = x.s[b] as f64 - x.d[b] as f64 * qs as f64;
            sum += m as f64 * corr;
            mag += (m as f64 * x.s[b] as f64).abs();
        }
    }
    (sum, mag)
}
