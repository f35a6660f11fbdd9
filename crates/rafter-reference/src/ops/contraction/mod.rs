//! Reference kernels: contractions (matmul, gemm, conv, einsum, attention), pooling and
//! quantisation.
//!
//! Float kernels run in f32 for f32/f16/bf16 operands (rounded back to the operand dtype)
//! and in f64 for f64. Conv, ConvTranspose, Gemm and MatMul go through `ndarray`'s matrix
//! product (im2col for convolutions) so real CNNs run in seconds.

mod attention;
mod block_quant;
mod conv;
mod matmul;
mod pool;
mod quant;

use super::{unsupported, OpCtx, OpError};
use crate::Tensor;
use half::{bf16, f16};
use ndarray::{ArrayD, CowArray, IxDyn};
use rafter_ir::{DType, Op};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    use Op::*;
    match op {
        MatMul => matmul::matmul(inputs).map(one),
        Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => matmul::gemm(inputs, *alpha, *beta, *trans_a, *trans_b).map(one),
        Einsum { equation } => matmul::einsum(inputs, equation).map(one),
        MatMulInteger => matmul::matmul_integer(inputs).map(one),
        MatMulBlockQuant {
            k,
            n,
            bits,
            block_size,
            accuracy_level,
        } => {
            let q = block_quant::BlockQuant {
                k: *k as usize,
                n: *n as usize,
                bits: *bits as usize,
                block_size: *block_size as usize,
                int8_activations: *accuracy_level == 4,
            };
            block_quant::matmul_block_quant(inputs, q).map(one)
        }
        Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
        | ConvNhwc {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        }
        | ConvInteger {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => {
            let p = conv::ConvParams {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                auto_pad: *auto_pad,
            };
            match op {
                ConvNhwc { .. } => conv::conv_nhwc(inputs, &p),
                ConvInteger { .. } => conv::conv_integer(inputs, &p),
                _ => conv::conv(inputs, &p),
            }
            .map(one)
        }
        ConvTranspose {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
            output_padding,
            output_shape,
        } => {
            let p = conv::ConvParams {
                kernel_shape,
                strides,
                pads,
                dilations,
                group: *group,
                auto_pad: *auto_pad,
            };
            conv::conv_transpose(inputs, &p, output_padding, output_shape).map(one)
        }
        QuantizeLinear {
            axis,
            block_size,
            output_dtype,
        } => quant::quantize(inputs, *axis, *block_size, *output_dtype, ctx).map(one),
        DequantizeLinear { axis, block_size } => {
            quant::dequantize(inputs, *axis, *block_size, ctx).map(one)
        }
        DynamicQuantizeLinear => quant::dynamic_quantize(inputs),
        Attention { .. } => attention::attention(op, inputs, ctx),
        RotaryEmbedding {
            interleaved,
            num_heads,
            rotary_embedding_dim,
        } => attention::rotary(inputs, *interleaved, *num_heads, *rotary_embedding_dim).map(one),
        Pool { .. } => pool::pool(op, inputs, ctx),
        GlobalPool { kind, p } => pool::global_pool(inputs, *kind, *p).map(one),
        MaxUnpool {
            kernel_shape,
            strides,
            pads,
        } => pool::max_unpool(inputs, kernel_shape, strides, pads).map(one),
        _ => unsupported(format!("`{}` is not a contraction op", op.name())),
    }
}

fn one(t: Tensor) -> Vec<Option<Tensor>> {
    vec![Some(t)]
}

/// The float types kernels compute in: f32 (for f32, f16 and bf16 operands) and f64.
pub(crate) trait Real:
    num_traits::Float
    + ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + std::fmt::Debug
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::MulAssign
    + Send
    + Sync
{
    fn of(x: f64) -> Self;
    fn to64(self) -> f64;
    /// The elements of a float tensor in this type: borrowed when the dtype matches,
    /// converted otherwise.
    fn view(t: &Tensor) -> Result<CowArray<'_, Self, IxDyn>, OpError>;
    /// An array of this type as a tensor of dtype `dt` (a float dtype).
    fn wrap(a: ArrayD<Self>, dt: DType) -> Tensor;
    /// Rounds through the precision of dtype `dt` (the identity unless `dt` is narrower),
    /// to mimic kernels that store intermediates in the operand dtype.
    fn round_to(self, dt: DType) -> Self;
}

fn not_float(t: &Tensor) -> OpError {
    OpError::Unsupported(format!("dtype {} where a float is expected", t.dtype()))
}

impl Real for f32 {
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn to64(self) -> f64 {
        self as f64
    }
    fn view(t: &Tensor) -> Result<CowArray<'_, f32, IxDyn>, OpError> {
        Ok(match t {
            Tensor::F32(a) => CowArray::from(a.view()),
            Tensor::F64(a) => CowArray::from(a.mapv(|x| x as f32)),
            Tensor::F16(a) => CowArray::from(a.mapv(f16::to_f32)),
            Tensor::BF16(a) => CowArray::from(a.mapv(bf16::to_f32)),
            _ => return Err(not_float(t)),
        })
    }
    fn wrap(a: ArrayD<f32>, dt: DType) -> Tensor {
        match dt {
            DType::F64 => Tensor::F64(a.mapv(|x| x as f64)),
            DType::F16 => Tensor::F16(a.mapv(f16::from_f32)),
            DType::BF16 => Tensor::BF16(a.mapv(bf16::from_f32)),
            _ => Tensor::F32(a),
        }
    }
    fn round_to(self, dt: DType) -> f32 {
        match dt {
            DType::F16 => f16::from_f32(self).to_f32(),
            DType::BF16 => bf16::from_f32(self).to_f32(),
            _ => self,
        }
    }
}

impl Real for f64 {
    fn of(x: f64) -> f64 {
        x
    }
    fn to64(self) -> f64 {
        self
    }
    fn view(t: &Tensor) -> Result<CowArray<'_, f64, IxDyn>, OpError> {
        Ok(match t {
            Tensor::F64(a) => CowArray::from(a.view()),
            Tensor::F32(a) => CowArray::from(a.mapv(|x| x as f64)),
            Tensor::F16(a) => CowArray::from(a.mapv(f16::to_f64)),
            Tensor::BF16(a) => CowArray::from(a.mapv(bf16::to_f64)),
            _ => return Err(not_float(t)),
        })
    }
    fn wrap(a: ArrayD<f64>, dt: DType) -> Tensor {
        match dt {
            DType::F32 => Tensor::F32(a.mapv(|x| x as f32)),
            DType::F16 => Tensor::F16(a.mapv(f16::from_f64)),
            DType::BF16 => Tensor::BF16(a.mapv(bf16::from_f64)),
            _ => Tensor::F64(a),
        }
    }
    fn round_to(self, dt: DType) -> f64 {
        match dt {
            DType::F32 => self as f32 as f64,
            DType::F16 => f16::from_f64(self).to_f64(),
            DType::BF16 => bf16::from_f64(self).to_f64(),
            _ => self,
        }
    }
}

/// Runs `$body` with `$T` bound to the working float type of dtype `$dt` (f64 for f64, f32
/// for f32/f16/bf16); other dtypes are unsupported.
macro_rules! by_float {
    ($dt:expr, $what:expr, $T:ident => $body:expr) => {
        match $dt {
            rafter_ir::DType::F64 => {
                type $T = f64;
                $body
            }
            rafter_ir::DType::F32 | rafter_ir::DType::F16 | rafter_ir::DType::BF16 => {
                type $T = f32;
                $body
            }
            other => $crate::ops::unsupported(format!("{} of dtype {other}", $what)),
        }
    };
}
pub(crate) use by_float;

/// Calls `f` with every multi-index of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Row-major strides (in elements) of `shape`.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// For a sliding window over an image: entry `k * P + p` is the flat (row-major) offset in
/// an image of shape `image` of kernel tap `k` (row-major over `kernel`) at window position
/// `p` (row-major over `positions`), or -1 when the tap falls outside the image. The
/// coordinate along dim `d` is `pos * strides[d] - pad_begin[d] + tap * dilations[d]`.
///
/// Used both ways: im2col and pooling read input offsets for output positions; col2im
/// (ConvTranspose) writes output offsets for input positions.
pub(crate) fn window_offsets(
    kernel: &[usize],
    positions: &[usize],
    image: &[usize],
    strides: &[usize],
    dilations: &[usize],
    pad_begin: &[i64],
) -> Vec<isize> {
    let nd = kernel.len();
    let img_strides = strides_of(image);
    let kn: usize = kernel.iter().product();
    let pn: usize = positions.iter().product();
    // Per dim: the coordinate of (tap, pos), or -1.
    let coord: Vec<Vec<i64>> = (0..nd)
        .map(|d| {
            let mut v = Vec::with_capacity(kernel[d] * positions[d]);
            for k in 0..kernel[d] {
                for p in 0..positions[d] {
                    let c = (p * strides[d]) as i64 - pad_begin[d] + (k * dilations[d]) as i64;
                    v.push(if c >= 0 && c < image[d] as i64 { c } else { -1 });
                }
            }
            v
        })
        .collect();
    let mut out = vec![-1isize; kn * pn];
    if kn == 0 || pn == 0 {
        return out;
    }
    let mut ki = 0;
    for_each_index(kernel, |kidx| {
        let row = &mut out[ki * pn..(ki + 1) * pn];
        let mut pi = 0;
        for_each_index(positions, |pidx| {
            let mut off = 0isize;
            for d in 0..nd {
                let c = coord[d][kidx[d] * positions[d] + pidx[d]];
                if c < 0 {
                    off = -1;
                    break;
                }
                off += c as isize * img_strides[d] as isize;
            }
            row[pi] = off;
            pi += 1;
        });
        ki += 1;
    });
    out
}

/// An attribute list of per-spatial-dim values, or `default` for each dim when empty.
pub(crate) fn per_dim(v: &[i64], n: usize, default: i64, what: &str) -> Result<Vec<i64>, OpError> {
    if v.is_empty() {
        return Ok(vec![default; n]);
    }
    if v.len() != n {
        return super::invalid(format!(
            "{what} has {} values for {n} spatial dims",
            v.len()
        ));
    }
    Ok(v.to_vec())
}

/// The values of a positive per-dim attribute as usize.
pub(crate) fn positive(v: &[i64], what: &str) -> Result<Vec<usize>, OpError> {
    v.iter()
        .map(|&x| {
            if x > 0 {
                Ok(x as usize)
            } else {
                super::invalid(format!("{what} must be positive, got {v:?}"))
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
