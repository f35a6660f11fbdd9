//! Quantizing float weights while the graph is built (`rafter compile --weights q4_k` on a
//! Hugging Face checkpoint): each row encoded with `rafter-quant`'s reference quantizers,
//! which produce the bytes ggml's `llama-quantize` would (without an importance matrix).

use bytes::Bytes;
use rafter_gguf::GgmlType;
use rafter_ir::WeightFormat;

use super::{weight_f32, BuildError};
use crate::source::{WeightDtype, WeightTensor};

/// `t` re-encoded in the block format `target`, or `None` when it stays as it is: it is
/// already block-quantized, or its rows are not a whole number of `target`'s blocks (the
/// caller keeps the source encoding then, as llama-quantize falls back for such tensors).
pub(crate) fn requantize(
    t: &WeightTensor,
    target: WeightFormat,
) -> Result<Option<WeightTensor>, BuildError> {
    let bad = |msg: String| BuildError::Weight {
        name: t.origin.name.clone(),
        msg,
    };
    if matches!(t.dtype, WeightDtype::Ggml(_)) || !target.is_block() {
        return Ok(None);
    }
    let Some(&cols) = t.shape.last() else {
        return Ok(None);
    };
    let Some(row_bytes) = target.row_bytes(cols) else {
        return Ok(None);
    };
    let format = rafter_quant::BlockFormat::named(target.word())
        .ok_or_else(|| bad(format!("{} has no quantizer", target.word())))?;
    let ggml = GgmlType::from_name(format.name())
        .ok_or_else(|| bad(format!("{} is not a ggml type", format.name())))?;
    let values = weight_f32(t)?;
    let rows = values.len() / cols.max(1);
    let mut out = vec![0u8; rows * row_bytes];
    for (src, dst) in values
        .chunks_exact(cols)
        .zip(out.chunks_exact_mut(row_bytes))
    {
        rafter_quant::quantize_row(format, src, dst).map_err(|e| bad(format!("{e:?}")))?;
    }
    Ok(Some(WeightTensor {
        dtype: WeightDtype::Ggml(ggml),
        shape: t.shape.clone(),
        bytes: Bytes::from(out),
        origin: t.origin.clone(),
    }))
}
