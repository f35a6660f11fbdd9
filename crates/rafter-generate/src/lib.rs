//! rafter's text generation, on top of any model that maps tokens to logits.
//!
//! The CLI, the OpenAI-compatible server and the Python package share this crate. It holds
//! no model: the runtime plugs one in through [`LogitsModel`] (prefill, then one token at a
//! time, the model keeping its own KV cache), so the crate depends on neither the compiler
//! nor the runtime. What it holds:
//!
//! - [`Tokenizer`]: text to ids and back with the `tokenizers` crate, loaded from a Hugging
//!   Face folder or built from a GGUF's embedded vocabulary ([`GgufVocab`]) so that it
//!   tokenizes exactly as llama.cpp does; [`StreamDecoder`] turns ids into text as they
//!   arrive without ever splitting a character.
//! - [`ChatTemplate`]: the model's Jinja chat template, rendered as transformers does.
//! - [`Sampler`]: greedy, temperature, top-k, top-p, min-p and repetition penalty with a
//!   seeded, portable random stream.
//! - [`generate`]: the loop, with stop tokens, stop strings (never emitted, even in a stream),
//!   a token budget, cancellation and timings.

mod chat;
mod error;
mod generate;
mod gguf_vocab;
mod hf_json;
pub mod pretokenize;
pub mod pyjson;
mod sampling;
mod spm_merges;
mod stop;
mod stream;
mod tokenizer;

pub use chat::{ChatRequest, ChatTemplate, Clock, Message, MAX_PROMPT_BYTES, TEMPLATE_FUEL};
pub use error::{Error, Result};
pub use generate::{generate, FinishReason, GenerateParams, Generation, LogitsModel, Timings};
pub use gguf_vocab::{token_type, GgufVocab};
pub use hf_json::MAX_TOKEN_ID;
pub use sampling::{fast_exp, Sampler, SamplerConfig};
pub use spm_merges::merges_from_scores;
pub use stop::{Released, StopStrings};
pub use stream::StreamDecoder;
pub use tokenizer::{HfTokenizerFiles, Tokenizer};
