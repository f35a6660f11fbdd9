//! MatMulBlockQuant: a matmul whose weight stays block-quantized and packed (ONNX
//! Runtime's MatMulNBits layout). Each weight row is dequantized one block at a time into
//! a small buffer and dotted with every row of `a`: the packed weight is read once per
//! call and the float matrix is never built.

use crate::ops::{arg, invalid, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};

/// The op's attributes.
#[derive(Clone, Copy)]
pub struct BlockQuant {
    pub k: usize,
    pub n: usize,
    pub bits: usize,
    pub block_size: usize,
    /// ORT's `accuracy_level` 4: `a` rounded to int8 per block first ([`round_to_int8`]).
    pub int8_activations: bool,
}

impl BlockQuant {
    fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Bytes of one packed block.
    fn blob(&self) -> usize {
        self.block_size * self.bits / 8
    }
}

/// Element `i` of a packed run of `bits`-bit values (low bits first).
fn unpack(bytes: &[u8], i: usize, bits: usize) -> u8 {
    let per_byte = 8 / bits;
    (bytes[i / per_byte] >> (bits * (i % per_byte))) & ((1u16 << bits) - 1) as u8
}

pub fn matmul_block_quant(inputs: &[Option<&Tensor>], q: BlockQuant) -> Result<Tensor, OpError> {
    let (Tensor::F32(a), Tensor::U8(b), Tensor::F32(scales)) =
        (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?)
    else {
        return invalid("matmul_block_quant wants a f32, b u8, scales f32");
    };
    let zp = match inputs.get(3).copied().flatten() {
        Some(Tensor::U8(z)) => Some(z.iter().copied().collect::<Vec<u8>>()),
        Some(_) => return invalid("zero_points must be u8"),
        None => None,
    };
    let bias: Option<Vec<f32>> = match inputs.get(4).copied().flatten() {
        Some(Tensor::F32(b)) => Some(b.iter().copied().collect()),
        Some(_) => return invalid("bias must be f32"),
        None => None,
    };
    let (k, n, kb, blob) = (q.k, q.n, q.k_blocks(), q.blob());
    let shape = a.shape().to_vec();
    if shape.last() != Some(&k) {
        return invalid(format!("a {shape:?}: last dim is not k = {k}"));
    }
    let b: Vec<u8> = b.iter().copied().collect();
    let scales: Vec<f32> = scales.iter().copied().collect();
    let zp_row = kb.div_ceil(8 / q.bits);
    if b.len() != n * kb * blob
        || scales.len() != n * kb
        || zp.as_ref().is_some_and(|z| z.len() != n * zp_row)
        || bias.as_ref().is_some_and(|v| v.len() != n)
    {
        return invalid(format!(
            "b ({}), scales ({}), zero points or bias do not fit n {n}, k {k}, block {}",
            b.len(),
            scales.len(),
            q.block_size
        ));
    }
    let mut a: Vec<f32> = a.iter().copied().collect();
    let rows = a.len() / k;
    if q.int8_activations {
        for row in a.chunks_mut(k.max(1)) {
            for blk in row.chunks_mut(q.block_size) {
                round_to_int8(blk);
            }
        }
    }
    let default_zp = 1u8 << (q.bits - 1);
    let mut out = vec![0f32; rows * n];
    let mut w = vec![0f32; q.block_size];
    for j in 0..n {
        let mut acc = vec![0f32; rows];
        for blk in 0..kb {
            let start = blk * q.block_size;
            let len = q.block_size.min(k - start);
            let packed = &b[(j * kb + blk) * blob..][..blob];
            let z = zp
                .as_ref()
                .map_or(default_zp, |z| unpack(&z[j * zp_row..], blk, q.bits));
            let s = scales[j * kb + blk];
            for (i, wi) in w[..len].iter_mut().enumerate() {
                *wi = (unpack(packed, i, q.bits) as f32 - z as f32) * s;
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let ar = &a[r * k + start..][..len];
                *acc += ar.iter().zip(&w[..len]).map(|(x, y)| x * y).sum::<f32>();
            }
        }
        let bj = bias.as_ref().map_or(0.0, |v| v[j]);
        for (r, acc) in acc.into_iter().enumerate() {
            out[r * n + j] = acc + bj;
        }
    }
    let mut oshape = shape;
    *oshape.last_mut().expect("rank >= 1") = n;
    Ok(Tensor::F32(
        ArrayD::from_shape_vec(IxDyn(&oshape), out).expect("sized"),
    ))
}

/// Replaces a block of activations by its int8 rounding, as ONNX Runtime's CPU MatMulNBits
/// quantizes A at `accuracy_level` 4: scale `max|x| / 127` (f32), `q = x * (127 / max|x|)`
/// rounded to nearest, ties to even; the value `q * scale` stands for `x` in the product.
/// (The int8 dot products ORT then runs give these same values up to f32 rounding.)
pub(crate) fn round_to_int8(block: &mut [f32]) {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for v in block.iter_mut() {
        *v = (*v * inv).round_ties_even() * scale;
    }
}
