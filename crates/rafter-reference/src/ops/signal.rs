//! Reference kernels: signal processing (DFT, STFT, Hann/Hamming/Blackman windows,
//! MelWeightMatrix).
//!
//! Numerics follow onnx/reference/ops (op_dft.py, op_stft.py, op_*_window.py,
//! op_mel_weight_matrix.py). Complex inverse transforms of float32 signals round like
//! NumPy's float32 FFT (see [`super::fft`]); the rest run in f64 (as NumPy does) and round
//! to the signal's dtype once.

use super::elementwise::from_f64s;
use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use rafter_ir::{DType, Op, WindowKind};
use std::f64::consts::PI;

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let _ = ctx;
    let opt = |i: usize| inputs.get(i).copied().flatten();
    let out = match op {
        Op::Dft {
            axis,
            inverse,
            onesided,
        } => {
            let x = arg(inputs, 0)?;
            let rank = x.shape().len() as i64;
            let axis = match axis {
                Some(a) => *a,
                None => scalar_int(arg(inputs, 2)?, "axis")?,
            };
            if rank < 2 || axis < -rank || axis >= rank {
                return invalid(format!("dft axis {axis} for rank {rank}"));
            }
            let axis = axis.rem_euclid(rank) as usize;
            let len = match opt(1) {
                Some(t) => Some(positive_len(scalar_int(t, "dft_length")?)?),
                None => None,
            };
            dft(x, len, axis, *inverse, *onesided)?
        }
        Op::Stft { onesided } => stft(inputs, *onesided)?,
        Op::Window {
            kind,
            periodic,
            dtype,
        } => window(arg(inputs, 0)?, *kind, *periodic, *dtype)?,
        Op::MelWeightMatrix { dtype } => mel_weight_matrix(inputs, *dtype)?,
        _ => return unsupported(format!("`{}` is not a signal op", op.name())),
    };
    Ok(vec![Some(out)])
}

fn scalar_int(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match t.to_i64_vec().as_deref() {
        Some([v]) => Ok(*v),
        _ => invalid(format!(
            "{what} must be one integer, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        )),
    }
}

fn scalar_f64(t: &Tensor, what: &str) -> Result<f64, OpError> {
    match t.to_f64_vec().as_slice() {
        [v] => Ok(*v),
        _ => invalid(format!(
            "{what} must be one value, got shape {:?}",
            t.shape()
        )),
    }
}

fn positive_len(n: i64) -> Result<usize, OpError> {
    if n <= 0 {
        return invalid(format!("dft_length must be positive, got {n}"));
    }
    Ok(n as usize)
}

/// A complex number as (re, im).
type C = (f64, f64);

/// A signal [..., 1 or 2] as complex values of shape `dims[..rank-1]`.
fn to_complex(x: &Tensor, what: &str) -> Result<(Vec<usize>, Vec<C>), OpError> {
    if !x.dtype().is_float() {
        return unsupported(format!("{what} of dtype {}", x.dtype()));
    }
    let shape = x.shape();
    let c = *shape.last().unwrap_or(&0);
    if shape.len() < 2 || !(c == 1 || c == 2) {
        return invalid(format!(
            "{what} must end in a dim of 1 (real) or 2 (complex), got shape {shape:?}"
        ));
    }
    let v = x.to_f64_vec();
    let vals = if c == 1 {
        v.into_iter().map(|r| (r, 0.0)).collect()
    } else {
        v.chunks_exact(2).map(|p| (p[0], p[1])).collect()
    };
    Ok((shape[..shape.len() - 1].to_vec(), vals))
}

/// `e^{sign * 2 pi i k / n}` with `k` reduced modulo `n` first (exact angles).
fn twiddle(k: usize, n: usize, sign: f64) -> C {
    let a = 2.0 * PI * ((k % n) as f64) / n as f64;
    (a.cos(), sign * a.sin())
}

/// The DFT of `x` (already of the transform length), `sign` -1 forward, +1 inverse
/// (unscaled), in f64.
fn dft_line(x: &[C], sign: f64) -> Vec<C> {
    let n = x.len();
    (0..n)
        .map(|k| {
            let (mut re, mut im) = (0.0, 0.0);
            for (t, &(xr, xi)) in x.iter().enumerate() {
                let (c, s) = twiddle(k * t, n, sign);
                re += xr * c - xi * s;
                im += xr * s + xi * c;
            }
            (re, im)
        })
        .collect()
}

/// The complex DFT of `x` (already of the transform length), the inverse scaled by
/// 1/len. NumPy runs a forward FFT of float32 data in f64 (its scale factor is a Python
/// int, which selects the complex128 loop) but an inverse one in f32 (the scale is a
/// float32): a float32 inverse is transformed with NumPy's radix passes in f32 so its
/// rounding matches ONNX's expected outputs; everything else (and lengths with radices
/// other than 2 to 5) in f64.
fn transform(x: &[C], inverse: bool, dtype: DType) -> Vec<C> {
    let n = x.len();
    if inverse && dtype == DType::F32 {
        let xf: Vec<(f32, f32)> = x.iter().map(|&(r, i)| (r as f32, i as f32)).collect();
        let fct = if inverse { 1.0f32 / n as f32 } else { 1.0 };
        if let Some(y) = super::fft::cfft(&xf, !inverse, fct) {
            return y.into_iter().map(|(r, i)| (r as f64, i as f64)).collect();
        }
    }
    let y = dft_line(x, if inverse { 1.0 } else { -1.0 });
    if inverse {
        y.into_iter()
            .map(|(r, i)| (r / n as f64, i / n as f64))
            .collect()
    } else {
        y
    }
}

/// ONNX DFT along `axis` of a signal [..., 1 or 2].
pub(crate) fn dft(
    x: &Tensor,
    len: Option<usize>,
    axis: usize,
    inverse: bool,
    onesided: bool,
) -> Result<Tensor, OpError> {
    let (shape, vals) = to_complex(x, "dft input")?;
    if axis >= shape.len() {
        return invalid("dft axis cannot be the last (real/imaginary) dim");
    }
    let n = shape[axis];
    let l = match len {
        Some(l) => l,
        None if inverse && onesided => {
            if n == 0 {
                return invalid("dft of an empty one-sided spectrum");
            }
            2 * (n - 1)
        }
        None => n,
    };
    if l == 0 {
        return invalid("dft of length 0");
    }
    let before: usize = shape[..axis].iter().product();
    let after: usize = shape[axis + 1..].iter().product();
    let m = if onesided && !inverse { l / 2 + 1 } else { l };
    let mut out = vec![(0.0, 0.0); before * m * after];
    let mut line = vec![(0.0, 0.0); l];
    for b in 0..before {
        for a in 0..after {
            let at = |t: usize| vals[(b * n + t) * after + a];
            let res = if inverse && onesided {
                // The Hermitian spectrum whose first half is the input (as numpy.irfft:
                // the imaginary parts of the DC and Nyquist bins do not matter).
                let half = l / 2 + 1;
                for (k, slot) in line.iter_mut().enumerate() {
                    let (src, conj) = if k < half { (k, false) } else { (l - k, true) };
                    let v = if src < n { at(src) } else { (0.0, 0.0) };
                    *slot = if conj { (v.0, -v.1) } else { v };
                }
                // NumPy's irfft works in f64 here (a real-input algorithm): no radix passes.
                dft_line(&line, 1.0)
                    .into_iter()
                    .map(|(r, i)| (r / l as f64, i / l as f64))
                    .collect()
            } else {
                for (t, slot) in line.iter_mut().enumerate() {
                    *slot = if t < n { at(t) } else { (0.0, 0.0) };
                }
                transform(&line, inverse, x.dtype())
            };
            for (k, v) in res.into_iter().take(m).enumerate() {
                out[(b * m + k) * after + a] = v;
            }
        }
    }
    let mut oshape = shape.clone();
    oshape[axis] = m;
    Ok(complex_tensor(x.dtype(), oshape, out, inverse && onesided))
}

/// Complex values of shape `shape` as a tensor [..., 2], or their real parts [..., 1].
fn complex_tensor(dtype: DType, mut shape: Vec<usize>, v: Vec<C>, real: bool) -> Tensor {
    let flat: Vec<f64> = if real {
        v.into_iter().map(|c| c.0).collect()
    } else {
        v.into_iter().flat_map(|c| [c.0, c.1]).collect()
    };
    shape.push(if real { 1 } else { 2 });
    from_f64s(dtype, &shape, flat)
}

/// ONNX STFT: windowed frames of the signal, each transformed along its length.
fn stft(inputs: &[Option<&Tensor>], onesided: bool) -> Result<Tensor, OpError> {
    let x = arg(inputs, 0)?;
    let step = scalar_int(arg(inputs, 1)?, "frame_step")?;
    let window = inputs.get(2).copied().flatten();
    let frame_len = inputs.get(3).copied().flatten();
    let (shape, vals) = to_complex(x, "stft signal")?;
    if shape.len() != 2 {
        return invalid(format!(
            "stft signal must be [batch, length, 1 or 2], got {:?}",
            x.shape()
        ));
    }
    let (batch, n) = (shape[0], shape[1]);
    let fl = match (frame_len, window) {
        (Some(f), _) => scalar_int(f, "frame_length")?,
        (None, Some(w)) => w.shape().first().copied().unwrap_or(0) as i64,
        (None, None) => n as i64,
    };
    if fl <= 0 || step <= 0 || fl > n as i64 {
        return invalid(format!(
            "stft frame length {fl} and step {step} for a signal of length {n}"
        ));
    }
    let fl = fl as usize;
    let w: Vec<f64> = match window {
        Some(w) => {
            if w.shape().len() != 1 {
                return invalid(format!("stft window must be 1-D, got {:?}", w.shape()));
            }
            w.to_f64_vec()
        }
        None => vec![1.0; fl],
    };
    let ws = w.len();
    let frames = 1 + (n - fl) / step as usize;
    let m = if onesided { fl / 2 + 1 } else { fl };
    let mut out = Vec::with_capacity(batch * frames * m);
    let mut line = vec![(0.0, 0.0); fl];
    for b in 0..batch {
        for f in 0..frames {
            let begin = f * step as usize;
            // The frame holds `ws` samples (zero past the signal's end), weighted by the
            // window, then padded or truncated to the transform length.
            for (t, slot) in line.iter_mut().enumerate() {
                *slot = if t < ws && begin + t < n {
                    let (re, im) = vals[b * n + begin + t];
                    (re * w[t], im * w[t])
                } else {
                    (0.0, 0.0)
                };
            }
            out.extend(transform(&line, false, x.dtype()).into_iter().take(m));
        }
    }
    Ok(complex_tensor(
        x.dtype(),
        vec![batch, frames, m],
        out,
        false,
    ))
}

/// Hann, Hamming and Blackman windows (onnx's `_CommonWindow`).
fn window(
    size: &Tensor,
    kind: WindowKind,
    periodic: bool,
    dtype: DType,
) -> Result<Tensor, OpError> {
    let n = scalar_int(size, "window size")?;
    if n < 0 {
        return invalid(format!("window size {n} is negative"));
    }
    let n = n as usize;
    let period = if periodic { n as f64 } else { n as f64 - 1.0 };
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let i = i as f64;
            match kind {
                WindowKind::Hann => (i * PI / period).sin().powi(2),
                WindowKind::Hamming => {
                    let alpha = 25.0 / 46.0;
                    alpha - (i * PI * 2.0 / period).cos() * (1.0 - alpha)
                }
                WindowKind::Blackman => {
                    0.42 - 0.5 * (i * PI * 2.0 / period).cos()
                        + 0.08 * (i * PI * 4.0 / period).cos()
                }
            }
        })
        .collect();
    Ok(from_f64s(dtype, &[n], v))
}

/// The mel filter bank of onnx's reference (triangles between mel-spaced bins).
fn mel_weight_matrix(inputs: &[Option<&Tensor>], dtype: DType) -> Result<Tensor, OpError> {
    let mel_bins = scalar_int(arg(inputs, 0)?, "num_mel_bins")?;
    let dft_len = scalar_int(arg(inputs, 1)?, "dft_length")?;
    let rate = scalar_int(arg(inputs, 2)?, "sample_rate")?;
    let (lo_t, hi_t) = (arg(inputs, 3)?, arg(inputs, 4)?);
    let (lo, hi) = (
        scalar_f64(lo_t, "lower_edge_hertz")?,
        scalar_f64(hi_t, "upper_edge_hertz")?,
    );
    if mel_bins < 0 || dft_len <= 0 || rate <= 0 {
        return invalid(format!(
            "num_mel_bins {mel_bins}, dft_length {dft_len}, sample_rate {rate}"
        ));
    }
    // NumPy computes `2595 * log1p(edge / 700)` in the edges' dtype before dividing by
    // the f64 `log(10)`.
    let to_mel = |f: f64, t: &Tensor| -> f64 {
        if t.dtype() == DType::F64 {
            2595.0 * (f / 700.0).ln_1p()
        } else {
            (2595.0f32 * (f as f32 / 700.0f32).ln_1p()) as f64
        }
    };
    let ln10 = 10f64.ln();
    let lo_mel = to_mel(lo, lo_t) / ln10;
    let hi_mel = to_mel(hi, hi_t) / ln10;
    let nb = mel_bins as usize;
    let step = (hi_mel - lo_mel) / (nb + 2) as f64;
    let bins: Vec<i64> = (0..nb + 2)
        .map(|i| {
            let mel = i as f64 * step + lo_mel;
            let hz = 700.0 * (mel / 2595.0 * ln10).exp_m1();
            (((dft_len + 1) as f64 * hz) / rate as f64).floor() as i64
        })
        .collect();
    let rows = (dft_len / 2 + 1) as usize;
    let mut out = vec![0.0f64; rows * nb];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), OpError> {
        if j < 0 || j as usize >= rows {
            return invalid(format!(
                "mel bin edge {j} outside the {rows} spectrogram bins"
            ));
        }
        out[j as usize * nb + i] = v;
        Ok(())
    };
    for i in 0..nb {
        let (lower, center, higher) = (bins[i], bins[i + 1], bins[i + 2]);
        let low_to_center = center - lower;
        if low_to_center == 0 {
            set(center, i, 1.0)?;
        } else {
            for j in lower..=center {
                set(j, i, (j - lower) as f64 / low_to_center as f64)?;
            }
        }
        let center_to_high = higher - center;
        if center_to_high > 0 {
            for j in center..higher {
                set(j, i, (higher - j) as f64 / center_to_high as f64)?;
            }
        }
    }
    // The reference builds an f64 matrix and casts it once.
    Ok(from_f64s(dtype, &[rows, nb], out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::contraction::tests::run_op;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn dft_of_four_real_samples() {
        // x = [1, 2, 3, 4]: X = [10, -2+2i, -2, -2-2i].
        let x = Tensor::f32s(&[1, 4, 1], vec![1.0, 2.0, 3.0, 4.0]);
        let op = |inverse, onesided| Op::Dft {
            axis: Some(1),
            inverse,
            onesided,
        };
        let y = run_op(op(false, false), &[Some(&x)], &[DType::F32])
            .remove(0)
            .unwrap();
        assert_eq!(y.shape(), &[1, 4, 2]);
        close(
            &y.to_f64_vec(),
            &[10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0],
        );
        // One-sided keeps bins 0..=2.
        let h = run_op(op(false, true), &[Some(&x)], &[DType::F32])
            .remove(0)
            .unwrap();
        close(&h.to_f64_vec(), &[10.0, 0.0, -2.0, 2.0, -2.0, 0.0]);
        // The inverse of the full spectrum is the signal; of the half, its real form.
        let back = run_op(op(true, false), &[Some(&y)], &[DType::F32])
            .remove(0)
            .unwrap();
        close(
            &back.to_f64_vec(),
            &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0],
        );
        let real = run_op(op(true, true), &[Some(&h)], &[DType::F32])
            .remove(0)
            .unwrap();
        assert_eq!(real.shape(), &[1, 4, 1]);
        close(&real.to_f64_vec(), &[1.0, 2.0, 3.0, 4.0]);
        // dft_length 2 truncates to [1, 2]: [3, -1].
        let two = Tensor::i64s(&[], vec![2]);
        let t = run_op(op(false, false), &[Some(&x), Some(&two)], &[DType::F32])
            .remove(0)
            .unwrap();
        close(&t.to_f64_vec(), &[3.0, 0.0, -1.0, 0.0]);
    }

    #[test]
    fn stft_frames_and_windows() {
        // Signal [1, 2, 3, 4], frames of 2 every 2 samples, no window: [[3, -1], [7, -1]].
        let x = Tensor::f32s(&[1, 4, 1], vec![1.0, 2.0, 3.0, 4.0]);
        let step = Tensor::i64s(&[], vec![2]);
        let len = Tensor::i64s(&[], vec![2]);
        let op = Op::Stft { onesided: true };
        let y = run_op(
            op,
            &[Some(&x), Some(&step), None, Some(&len)],
            &[DType::F32],
        )
        .remove(0)
        .unwrap();
        assert_eq!(y.shape(), &[1, 2, 2, 2]);
        close(&y.to_f64_vec(), &[3.0, 0.0, -1.0, 0.0, 7.0, 0.0, -1.0, 0.0]);
        // Periodic Hann of 4: [0, 0.5, 1, 0.5]; symmetric Hamming of 3: [0.0870, 1, 0.0870].
        let four = Tensor::i64s(&[], vec![4]);
        let hann = Op::Window {
            kind: WindowKind::Hann,
            periodic: true,
            dtype: DType::F32,
        };
        let w = run_op(hann, &[Some(&four)], &[DType::F32])
            .remove(0)
            .unwrap();
        close(&w.to_f64_vec(), &[0.0, 0.5, 1.0, 0.5]);
        let three = Tensor::i64s(&[], vec![3]);
        let hamming = Op::Window {
            kind: WindowKind::Hamming,
            periodic: false,
            dtype: DType::F64,
        };
        let w = run_op(hamming, &[Some(&three)], &[DType::F64])
            .remove(0)
            .unwrap();
        let a = 25.0 / 46.0;
        close(&w.to_f64_vec(), &[2.0 * a - 1.0, 1.0, 2.0 * a - 1.0]);
        // Blackman of 2 (periodic): [0.42 - 0.5 + 0.08, 0.42 + 0.5 + 0.08] = [0, 1].
        let two = Tensor::i64s(&[], vec![2]);
        let blackman = Op::Window {
            kind: WindowKind::Blackman,
            periodic: true,
            dtype: DType::F32,
        };
        let w = run_op(blackman, &[Some(&two)], &[DType::F32])
            .remove(0)
            .unwrap();
        close(&w.to_f64_vec(), &[0.0, 1.0]);
    }

    #[test]
    fn mel_weight_matrix_of_onnx_example() {
        // onnx's test: 8 mel bins over a 16-point DFT at 8192 Hz, 0..4096 Hz. Bin edges
        // come out as [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] minus rounding: rows 0..=8.
        let i = |v: i64| Tensor::i64s(&[], vec![v]);
        let f = |v: f32| Tensor::f32s(&[], vec![v]);
        let ins = [i(8), i(16), i(8192), f(0.0), f(4096.0)];
        let ins: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
        let y = run_op(
            Op::MelWeightMatrix { dtype: DType::F32 },
            &ins,
            &[DType::F32],
        )
        .remove(0)
        .unwrap();
        assert_eq!(y.shape(), &[9, 8]);
        let v = y.to_f64_vec();
        let mut want = vec![0.0; 72];
        for (r, c) in [
            (0, 0),
            (0, 1),
            (1, 2),
            (1, 3),
            (2, 4),
            (3, 5),
            (4, 6),
            (5, 7),
        ] {
            want[r * 8 + c] = 1.0;
        }
        close(&v, &want);
    }
}
