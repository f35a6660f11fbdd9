//! LLMs as rafter reads them: model sources and the architecture description.
//!
//! rafter runs decoder-only LLMs through its compiler like any other model. This crate
//! turns the files people download into what the decoder graph builder needs:
//!
//! * [`spec`]: [`ModelSpec`], the architecture-level description (sizes, heads, rope,
//!   MoE routing, Gemma 3's sliding window and soft-capping, special tokens, chat
//!   template, sampling defaults), the same whatever the source.
//! * [`source`]: [`ModelSource`], read from a Hugging Face folder (safetensors, f32/bf16/
//!   f16) or a GGUF file (llama.cpp's; float and block-quantized tensors): the spec,
//!   zero-copy weights under canonical HF-style names, and the [`source::Conventions`]
//!   that differ between the two (see the `source` module docs).
//!
//! Supported architectures: Qwen3, Qwen3-MoE, Llama (3.x, SmolLM, TinyLlama) and Gemma 3
//! (text).

pub mod graph;
pub mod source;
pub mod spec;

pub use graph::{build_decoder, DecoderGraph, DecoderOptions, KvType, Logits};
pub use rafter_gguf::TensorMemory;
pub use source::{ModelSource, SourceError};
pub use spec::{Architecture, ModelSpec};
