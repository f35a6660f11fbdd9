//! The generation loop: prefill the prompt, then sample one token at a time until a stop
//! token, a stop string, the token budget, the context's end or the caller says stop,
//! streaming text as it is produced.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::sampling::{Sampler, SamplerConfig};
use crate::stop::StopStrings;
use crate::tokenizer::Tokenizer;

/// A model that turns tokens into next-token logits, keeping its own KV cache.
///
/// The loop calls [`LogitsModel::reset`], then `forward(prompt)` once (prefill), then
/// `forward(&[token])` for each sampled token (decode). Each call appends its tokens after
/// everything fed since the last reset and returns the logits of the last position only
/// (one score per vocabulary entry; the vocabulary may be padded past the tokenizer's).
pub trait LogitsModel {
    /// Feeds `tokens` (never empty) and returns the logits after the last one.
    fn forward(
        &mut self,
        tokens: &[u32],
    ) -> Result<&[f32], Box<dyn std::error::Error + Send + Sync>>;
    /// Forgets every token fed so far (an empty KV cache).
    fn reset(&mut self);
    /// The most tokens (prompt and generated) one sequence may hold.
    fn max_context(&self) -> usize;
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or a stop string.
    Stop,
    /// `max_tokens`, or the model's context is full.
    Length,
    /// The streaming callback asked to stop.
    Cancelled,
}

/// Token counts and wall-clock seconds of the two phases.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// The prefill call.
    pub prompt_seconds: f64,
    pub generated_tokens: usize,
    /// From the end of prefill to the end (decode calls, sampling, detokenizing).
    pub generation_seconds: f64,
}

impl Timings {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(f64::MIN_POSITIVE)
    }

    /// Decode speed: the first token comes from prefill's logits, so it is not counted.
    pub fn generated_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64
            / self.generation_seconds.max(f64::MIN_POSITIVE)
    }
}

/// The result of [`generate`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// Sampled tokens in order, including a stop token that ended generation.
    pub generated_ids: Vec<u32>,
    /// The generated text: without a stop token or stop string, nor anything after one.
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// How to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub sampler: SamplerConfig,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation (usually [`Tokenizer::stop_token_ids`] plus any extra).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation; the text stops right before the first one.
    pub stop_strings: Vec<String>,
    /// Leave special tokens out of the text.
    pub skip_special: bool,
}

impl GenerateParams {
    /// `max_tokens` with the tokenizer's stop tokens, greedy, special tokens hidden.
    pub fn new(tokenizer: &Tokenizer, max_tokens: usize) -> Self {
        GenerateParams {
            sampler: SamplerConfig::greedy(),
            max_tokens,
            stop_token_ids: tokenizer.stop_token_ids().to_vec(),
            stop_strings: Vec::new(),
            skip_special: true,
        }
    }
}

/// How many prompt tokens the detokenizer sees before the first generated one, so that the
/// first piece decodes as a continuation (a SentencePiece `▁word` keeps its space).
const DECODE_CONTEXT: usize = 4;

/// Generates from `prompt_ids`, calling `on_text` with each piece of text as it becomes
/// final (never a broken character, never text at or after a stop string). `on_text`
/// returning `ControlFlow::Break(())` cancels.
pub fn generate<M: LogitsModel + ?Sized>(
    model: &mut M,
    tokenizer: &Tokenizer,
    prompt_ids: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Generation> {
    if prompt_ids.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let max_context = model.max_context();
    if prompt_ids.len() >= max_context {
        return Err(Error::PromptTooLong {
            prompt: prompt_ids.len(),
            max_context,
        });
    }
    let mut sampler = Sampler::new(params.sampler)?;
    for &t in prompt_ids {
        sampler.accept(t);
    }
    let context = &prompt_ids[prompt_ids.len().saturating_sub(DECODE_CONTEXT)..];
    let mut stream = tokenizer
        .stream_decoder(params.skip_special)
        .with_context(context);
    let mut stops = StopStrings::new(params.stop_strings.iter().cloned());
    let mut text = String::new();
    let mut generated = Vec::new();
    let mut emit = |piece: &str, text: &mut String| -> ControlFlow<()> {
        if piece.is_empty() {
            return ControlFlow::Continue(());
        }
        text.push_str(piece);
        on_text(piece)
    };

    model.reset();
    let start = Instant::now();
    let mut feed: Vec<u32> = prompt_ids.to_vec();
    let mut prompt_seconds = None;
    let finish = loop {
        if generated.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let token = {
            let logits = model.forward(&feed).map_err(Error::Model)?;
            sampler.sample(logits)?
        };
        if prompt_seconds.is_none() {
            prompt_seconds = Some(start.elapsed().as_secs_f64());
        }
        generated.push(token);
        sampler.accept(token);
        if params.stop_token_ids.contains(&token) {
            break FinishReason::Stop;
        }
        if let Some(piece) = stream.push(token)? {
            let released = stops.push(&piece);
            let flow = emit(&released.text, &mut text);
            if released.stopped {
                break FinishReason::Stop;
            }
            if flow.is_break() {
                break FinishReason::Cancelled;
            }
        }
        if prompt_ids.len() + generated.len() >= max_context {
            break FinishReason::Length;
        }
        feed.clear();
        feed.push(token);
    };
    if finish != FinishReason::Cancelled && !stops.stopped() {
        // Held-back text: an incomplete character, or a tail that could have begun a stop string.
        let tail = stream.finish()?;
        let released = stops.push(&tail);
        let _ = emit(&released.text, &mut text);
        if !released.stopped {
            let rest = stops.finish();
            let _ = emit(&rest, &mut text);
        }
    }
    let prompt_seconds = prompt_seconds.unwrap_or(0.0);
    Ok(Generation {
        prompt_ids: prompt_ids.to_vec(),
        timings: Timings {
            prompt_tokens: prompt_ids.len(),
            prompt_seconds,
            generated_tokens: generated.len(),
            generation_seconds: start.elapsed().as_secs_f64() - prompt_seconds,
        },
        generated_ids: generated,
        text,
        finish_reason: finish,
    })
}
