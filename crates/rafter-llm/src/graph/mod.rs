//! The decoder as a graph of rafter-ir ops.
//!
//! [`build_decoder`] turns a [`ModelSource`] into one [`Graph`] that serves every call of a
//! generation: prefill (many tokens) and decode (one token) alike, at any length, because
//! the tokens of the call (`seq`) and the tokens already cached (`past`) are symbolic dims.
//!
//! ```text
//! inputs:  input_ids i64[1, seq]
//!          past.{l}.key / past.{l}.value kv[1, past, kv_heads * head_dim]   (states)
//! outputs: logits f32[1, seq, vocab]   (or [1, 1, vocab] with Logits::Last)
//!          present.{l}.key / .value kv[1, past + seq, kv_heads * head_dim] (states)
//! ```
//!
//! `kv` is the cache's element type ([`KvType`]): f16 (llama.cpp's default, half the
//! bytes a decode step reads and the session holds) or f32. With f16, each call's new
//! keys and values are cast to f16 (round-to-nearest-even, as llama.cpp stores them)
//! before they are appended, and attention reads the f16 cache as f32 (exact widening)
//! with f16 products, as llama.cpp's: queries and softmax weights rounded to f16.
//!
//! The KV cache of each layer is a graph *state* ([`rafter_ir::StateLink`]): `present =
//! concat(past, k)` is the next call's `past`. The cache is seq-major (`[1, positions,
//! heads * head_dim]`), so a call's state is a prefix of one buffer and the compiler
//! appends to it in place. Attention reads the whole `present` with
//! `nonpad_kv_seqlen = past + seq` (ONNX Attention's convention for a static cache: the
//! causal frontier is aligned so that query `i` sits at position `past + i`).
//!
//! Weights enter as constants holding the source's bytes (zero-copy slices of the mapped
//! file; block-quantized ones as raw `u8` rows) read by `linear`, `embedding` and
//! `moe_ffn` in their [`WeightFormat`]. Only norm scales (a few KB) and the rope's inverse
//! frequencies are computed here, and experts stored one tensor each (HF MoE) are stacked
//! into one constant per projection.

mod builder;
mod layers;
mod quantize;

use std::fmt;

use bytes::Bytes;
use rafter_ir::{ConstData, DType, Dim, Graph, TensorType, ValueId, WeightFormat};

use crate::source::{ModelSource, SourceFormat, WeightDtype, WeightTensor};
use builder::Builder;

/// Which positions the `logits` output covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position of the call: what generation needs (the output projection
    /// over a prompt's other positions is wasted work).
    #[default]
    Last,
    /// Every position of the call (tests compare them with a reference).
    All,
}

/// The element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// IEEE half precision: what llama.cpp stores by default (its outputs, our GGUF
    /// references, are computed with it), half the bytes of f32.
    F16,
    /// Single precision: exactly what transformers computes in f32.
    F32,
}

impl KvType {
    /// The IR dtype of the cache.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::F32 => DType::F32,
        }
    }

    /// `f16` or `f32`.
    pub fn word(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
        }
    }

    /// The type named `word` (`f16`, `f32`, any case).
    pub fn from_word(word: &str) -> Option<KvType> {
        match word.trim().to_ascii_lowercase().as_str() {
            "f16" | "float16" => Some(KvType::F16),
            "f32" | "float32" => Some(KvType::F32),
            _ => None,
        }
    }

    /// The default for a model from `source`: f16 for a GGUF, f32 for a Hugging Face
    /// folder.
    ///
    /// A GGUF runs as llama.cpp runs it, whose default cache is f16 (and whose attention
    /// then rounds queries and softmax weights to f16, as ours does): half the cache's
    /// memory and of what a decode step reads of it. A Hugging Face checkpoint (f32, bf16
    /// or f16 weights alike) stays f32: its reference is transformers computing in f32
    /// (bf16 weights widened), checked at 1e-4 of the largest logit, which the f16
    /// cache's roundings (2^-11 relative) would exceed.
    pub fn default_for(source: &ModelSource) -> KvType {
        match source.format {
            SourceFormat::Gguf { .. } => KvType::F16,
            SourceFormat::HfFolder { .. } => KvType::F32,
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

/// Options of [`build_decoder`].
#[derive(Clone, Debug, Default)]
pub struct DecoderOptions {
    pub logits: Logits,
    /// The KV cache's element type; `None`: [`KvType::default_for`] the source.
    pub kv_type: Option<KvType>,
    /// Re-encode the float weights of linear layers, experts and the embedding in this
    /// block format (`q8_0`, `q4_0`, `q4_k`, ...) while building; weights already
    /// block-quantized (GGUF) and rows that are not whole blocks keep their encoding.
    pub quantize: Option<WeightFormat>,
}

/// Why a decoder graph could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildError {
    /// A weight the spec implies is missing or unusable (the source checks this; seeing it
    /// here means the source and the builder disagree).
    #[error("weight `{name}`: {msg}")]
    Weight { name: String, msg: String },
    /// A node could not be typed (a bug in the builder or an inconsistent spec).
    #[error("{0}")]
    Node(String),
}

/// The graph and the names its caller needs.
#[derive(Clone, Debug)]
pub struct DecoderGraph {
    pub graph: Graph,
    /// The token input (`input_ids`).
    pub input_ids: String,
    /// The logits output (`logits`).
    pub logits: String,
    /// Which positions `logits` covers.
    pub logits_mode: Logits,
}

/// The symbol of the call's token count.
pub const SEQ: &str = "seq";
/// The symbol of the cached token count.
pub const PAST: &str = "past";

/// Builds the decoder graph of `source` (see the module docs).
pub fn build_decoder(
    source: &ModelSource,
    opts: &DecoderOptions,
) -> Result<DecoderGraph, BuildError> {
    let spec = &source.spec;
    spec.check().map_err(BuildError::Node)?;
    if let Some(q) = opts.quantize.filter(|q| !q.is_block()) {
        return Err(BuildError::Node(format!(
            "weights can be quantized to a block format (q8_0, q4_0, q4_k, ...), not {}",
            q.word()
        )));
    }
    let mut b = Builder::new(&format!("{:?}", spec.architecture).to_lowercase());
    let seq = Dim::symbol(SEQ);
    let past = Dim::symbol(PAST);
    let kv_width = (spec.num_kv_heads * spec.head_dim) as i64;
    let ids = b.input(
        "input_ids",
        TensorType::new(DType::I64, vec![Dim::known(1), seq.clone()]),
    );
    let kv_type = opts.kv_type.unwrap_or_else(|| KvType::default_for(source));
    let cache_ty = TensorType::new(
        kv_type.dtype(),
        vec![Dim::known(1), past.clone(), Dim::known(kv_width)],
    );
    let mut past_inputs = Vec::with_capacity(spec.num_layers);
    for l in 0..spec.num_layers {
        let k = b.input(&format!("past.{l}.key"), cache_ty.clone());
        let v = b.input(&format!("past.{l}.value"), cache_ty.clone());
        past_inputs.push((k, v));
    }

    let mut d = layers::Decoder::new(
        &mut b,
        source,
        ids,
        past_inputs[0].0,
        opts.quantize,
        kv_type,
    )?;
    let mut x = d.embed()?;
    let mut presents = Vec::with_capacity(spec.num_layers);
    for (l, &(pk, pv)) in past_inputs.iter().enumerate() {
        let (next, present) = d.layer(l, x, pk, pv)?;
        x = next;
        presents.push(present);
    }
    let logits = d.head(x, opts.logits)?;

    let g = &mut b.b;
    g.output(logits);
    for ((pk, pv), (k, v)) in past_inputs.iter().zip(presents) {
        for (input, output) in [(*pk, k), (*pv, v)] {
            g.output(output);
            g.state(input, output).map_err(BuildError::Node)?;
        }
    }
    let graph = b.b.finish().map_err(|e| BuildError::Node(e.to_string()))?;
    Ok(DecoderGraph {
        graph,
        input_ids: "input_ids".into(),
        logits: "logits".into(),
        logits_mode: opts.logits,
    })
}

/// A weight as a constant in its [`WeightFormat`]: element formats keep their dtype and
/// shape; block formats become `u8[rows..., row_bytes]`. The bytes are shared, not copied.
pub(crate) fn weight_constant(t: &WeightTensor) -> Result<(WeightFormat, ConstData), BuildError> {
    let bad = |msg: String| BuildError::Weight {
        name: t.origin.name.clone(),
        msg,
    };
    let (format, dtype, dims) = match t.dtype {
        WeightDtype::F32 => (WeightFormat::F32, DType::F32, t.shape.clone()),
        WeightDtype::F16 => (WeightFormat::F16, DType::F16, t.shape.clone()),
        WeightDtype::BF16 => (WeightFormat::BF16, DType::BF16, t.shape.clone()),
        WeightDtype::Ggml(g) => {
            let name = g.name().to_ascii_lowercase();
            let format = WeightFormat::from_word(&name)
                .filter(|f| f.is_block())
                .ok_or_else(|| {
                    bad(format!(
                        "ggml type {} has no rafter weight format",
                        g.name()
                    ))
                })?;
            let (&cols, rows) = t
                .shape
                .split_last()
                .ok_or_else(|| bad("a block-quantized weight of rank 0".into()))?;
            let row_bytes = format
                .row_bytes(cols)
                .ok_or_else(|| bad(format!("{cols} columns are not whole {name} blocks")))?;
            let mut dims = rows.to_vec();
            dims.push(row_bytes);
            (format, DType::U8, dims)
        }
    };
    let data = ConstData::new(dtype, dims, t.bytes.clone()).map_err(|e| bad(e.to_string()))?;
    Ok((format, data))
}

/// A weight's values as f32 (norm scales: small vectors).
pub(crate) fn weight_f32(t: &WeightTensor) -> Result<Vec<f32>, BuildError> {
    let b = &t.bytes;
    Ok(match t.dtype {
        WeightDtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        WeightDtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        WeightDtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        WeightDtype::Ggml(g) => {
            return Err(BuildError::Weight {
                name: t.origin.name.clone(),
                msg: format!(
                    "a vector (norm scale or bias) stored as {} (expected a float type)",
                    g.name()
                ),
            })
        }
    })
}

/// Experts `[out, in]` one tensor each, stacked into one `[experts, out, in]` constant
/// (one copy, at build time). All must share a dtype.
pub(crate) fn stack_experts(
    parts: &[WeightTensor],
) -> Result<(WeightFormat, ConstData), BuildError> {
    let first = parts.first().ok_or_else(|| BuildError::Weight {
        name: "experts".into(),
        msg: "no experts".into(),
    })?;
    if let Some(odd) = parts
        .iter()
        .find(|p| p.dtype != first.dtype || p.shape != first.shape)
    {
        return Err(BuildError::Weight {
            name: odd.origin.name.clone(),
            msg: format!(
                "experts must share dtype and shape to be stacked: {} {:?} vs {} {:?} ({})",
                odd.dtype, odd.shape, first.dtype, first.shape, first.origin.name
            ),
        });
    }
    let mut bytes = Vec::with_capacity(first.bytes.len() * parts.len());
    for p in parts {
        bytes.extend_from_slice(&p.bytes);
    }
    let mut shape = vec![parts.len()];
    shape.extend_from_slice(&first.shape);
    let stacked = WeightTensor {
        dtype: first.dtype,
        shape,
        bytes: Bytes::from(bytes),
        origin: first.origin.clone(),
    };
    weight_constant(&stacked)
}

impl fmt::Display for Logits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Logits::Last => "last",
            Logits::All => "all",
        })
    }
}

/// The `ValueId`s of one layer's new cache, `(key, value)`.
pub(crate) type Present = (ValueId, ValueId);
