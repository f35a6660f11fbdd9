//! The OpenAI wire format: request bodies as the server reads them, and the objects it
//! answers (completions, chat completions, their stream chunks, the model list).
//!
//! Requests keep the fields whose meaning rafter checks itself (`stop`, `messages`,
//! `prompt`) as raw JSON, so that a wrong shape gets a message naming the field rather than
//! serde's "did not match any variant". A body is read twice, as its endpoint's fields and as
//! [`CommonFields`] (not `#[serde(flatten)]`, which would lose the name of a field of the
//! wrong type); fields neither reads are refused by name, as OpenAI refuses them
//! ("Unrecognized request argument supplied: ..."), except the few it accepts and ignores.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Default, Deserialize)]
pub struct CommonFields {
    pub model: String,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// A string or a list of strings.
    #[serde(default)]
    pub stop: Option<Value>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Accepted and ignored (OpenAI uses it for abuse monitoring).
    #[serde(default)]
    pub user: Option<String>,
    // Extensions, named as vLLM and llama.cpp's server name them.
    /// Keep the k most likely tokens (0 or -1: all).
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Drop tokens less likely than `min_p` times the most likely one.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// HF's multiplicative repetition penalty over the prompt and the output (1: none).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// Generate through end-of-sequence tokens (for benchmarks: a fixed token count).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Add the prompt's and the completion's token ids to the response (`prompt_token_ids`,
    /// and `token_ids` in each choice).
    #[serde(default)]
    pub return_token_ids: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    /// Message objects; checked and normalised by `prompt::chat_messages`.
    pub messages: Vec<Value>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u64>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Extension: more variables for the chat template (`{"enable_thinking": false}`).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// A string, a one-string list, a list of token ids, or a one-list list of them.
    pub prompt: Value,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub logprobs: Option<u64>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub best_of: Option<u64>,
}

/// Fields that clients send and that change nothing about a generation here.
pub const IGNORED_FIELDS: &[&str] = &["metadata", "store", "service_tier", "parallel_tool_calls"];

/// `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// The assistant's message in a chat completion.
#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

/// One choice of a (non-streamed) chat completion.
#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `chat.completion`.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The `delta` of a chat stream chunk: the role first, then content pieces, then nothing.
#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Present (as `null` until the last chunk) when `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One choice of a completion or of a completion stream chunk.
#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `text_completion` (also each chunk of a completion stream).
#[derive(Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// An entry of `/v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Extension: the positions a sequence may hold (prompt and completion).
    pub context_length: usize,
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}
