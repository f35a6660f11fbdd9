//! The HTTP endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/health`,
//! and OpenAI-style errors for unknown paths and methods.
//!
//! A generation request is checked in full (JSON, model name, parameters, prompt length)
//! before it is queued, so a bad request is answered at once with a 4xx and never waits
//! behind others; templating and tokenizing run on tokio's blocking pool.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::params::{chat_max_tokens, check_extra, request_options};
use crate::prompt::{chat_messages, chat_prompt, completion_prompt, Prompt};
use crate::protocol::{
    ChatCompletionRequest, CommonFields, CompletionRequest, ModelCard, ModelList,
};
use crate::stream::{Endpoint, ResponseMeta};
use crate::AppState;

/// OpenAI's default `max_tokens` for `/v1/completions` (chat has none: the rest of the
/// context).
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

type Shared = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(unknown_url)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

async fn health(State(state): Shared) -> Response {
    let body = serde_json::json!({
        "status": "ok",
        "model": state.model_name,
        "context_length": state.llm.context(),
        "queue": state.queue.status(),
    });
    axum::Json(body).into_response()
}

fn model_card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.model_name.clone(),
        object: "model",
        created: state.created,
        owned_by: "rafter",
        context_length: state.llm.context(),
    }
}

async fn models(State(state): Shared) -> Response {
    axum::Json(ModelList {
        object: "list",
        data: vec![model_card(&state)],
    })
    .into_response()
}

async fn model(State(state): Shared, Path(model): Path<String>) -> Response {
    match state.check_model(&model) {
        Ok(()) => axum::Json(model_card(&state)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn unknown_url(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "Invalid URL ({method} {uri}): rafter serve answers GET /v1/models, POST \
             /v1/completions, POST /v1/chat/completions and GET /health"
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("unknown_url"),
    }
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{method} is not allowed on {}", uri.path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed"),
    }
}

/// The body as JSON: the endpoint's fields `T`, the shared fields, and the fields neither
/// knows. A syntax error, a body that is not an object, and a field of the wrong type are
/// each a 400 saying which.
fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<(T, CommonFields, Map<String, Value>), ApiError> {
    let body = body.map_err(|r| ApiError {
        status: r.status(),
        message: format!("reading the request body: {}", r.body_text()),
        kind: "invalid_request_error",
        param: None,
        code: None,
    })?;
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}. The body must be a \
             JSON object, e.g. {{\"model\": ..., \"messages\": [...]}}"
        ))
        .with_code("invalid_json")
    })?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request(format!(
            "the request body is a JSON {}, expected an object",
            json_kind(&value)
        ))
        .with_code("invalid_json"));
    };
    let (specific, unread_specific) = typed::<T>(&fields)?;
    let (common, unread_common) = typed::<CommonFields>(&fields)?;
    let extra = fields
        .into_iter()
        .filter(|(k, _)| unread_specific.contains(k) && unread_common.contains(k))
        .collect();
    Ok((specific, common, extra))
}

/// `fields` as `T`, and the top-level fields `T` does not read.
fn typed<T: DeserializeOwned>(
    fields: &Map<String, Value>,
) -> Result<(T, BTreeSet<String>), ApiError> {
    let mut unread = BTreeSet::new();
    let value = Value::Object(fields.clone());
    let mut note = |path: serde_ignored::Path<'_>| {
        if let serde_ignored::Path::Map { parent, key } = path {
            if matches!(parent, serde_ignored::Path::Root) {
                unread.insert(key);
            }
        }
    };
    let de = serde_ignored::Deserializer::new(value, &mut note);
    let parsed = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path == "?" {
            ApiError::bad_request(format!("{inner}"))
        } else {
            ApiError::bad_param(path.clone(), format!("{path}: {inner}"))
        }
    })?;
    Ok((parsed, unread))
}

#[cfg(test)]
#[path = "hostile_tests.rs"]
mod hostile_tests;

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Runs prompt building on the blocking pool (templates and tokenizers can take a while
/// on long prompts).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("building the prompt: {e}")))?
}

async fn chat_completions(State(state): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    chat(state, body)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn completions(State(state): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    completion(state, body)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn chat(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, common, extra) = parse_body::<ChatCompletionRequest>(body)?;
    state.check_model(&common.model)?;
    check_extra(&extra)?;
    if req.logprobs == Some(true) || req.top_logprobs.is_some_and(|n| n > 0) {
        let param = if req.logprobs == Some(true) {
            "logprobs"
        } else {
            "top_logprobs"
        };
        return Err(ApiError::bad_param(
            param,
            "logprobs are not supported by rafter serve",
        ));
    }
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::bad_param(
            "tools",
            "tools are not supported by rafter serve: it returns the model's text and does \
             not parse tool calls",
        ));
    }
    if let Some(choice) = &req.tool_choice {
        if choice != "none" && choice != "auto" {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!("tool_choice {choice} needs tools, which rafter serve does not support"),
            ));
        }
    }
    if let Some(format) = &req.response_format {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::bad_param(
                "response_format",
                format!(
                    "response_format {format} is not supported: rafter serve writes free text \
                     only ({{\"type\": \"text\"}})"
                ),
            ));
        }
    }
    let max = chat_max_tokens(req.max_completion_tokens, common.max_tokens)?;
    let mut options = request_options(&common, max, state.llm.tokenizer())?;
    let messages = chat_messages(&req.messages)?;
    state.chat_template()?;
    let kwargs = req.chat_template_kwargs;
    let prompt = {
        let state = state.clone();
        blocking(move || {
            let template = state.chat_template()?;
            chat_prompt(template, state.llm.tokenizer(), messages, kwargs)
        })
        .await?
    };
    options.budget(prompt.ids.len(), state.llm.context(), None, "messages")?;
    respond(&state, Endpoint::Chat, prompt, None, options).await
}

async fn completion(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, common, extra) = parse_body::<CompletionRequest>(body)?;
    state.check_model(&common.model)?;
    check_extra(&extra)?;
    if req.logprobs.is_some() {
        return Err(ApiError::bad_param(
            "logprobs",
            "logprobs are not supported by rafter serve",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_param(
            "suffix",
            "suffix (insertion) is not supported by rafter serve",
        ));
    }
    if let Some(n) = req.best_of.filter(|&n| n != 1) {
        return Err(ApiError::bad_param(
            "best_of",
            format!("best_of = {n} is not supported: rafter serve generates one sequence"),
        ));
    }
    let max = common.max_tokens.map(|n| ("max_tokens", n));
    let mut options = request_options(&common, max, state.llm.tokenizer())?;
    let prompt = {
        let state = state.clone();
        let value = req.prompt;
        blocking(move || {
            let vocab = state.llm.info().vocab_size;
            completion_prompt(&value, state.llm.tokenizer(), vocab)
        })
        .await?
    };
    options.budget(
        prompt.ids.len(),
        state.llm.context(),
        Some(COMPLETION_DEFAULT_MAX_TOKENS),
        "prompt",
    )?;
    let echo = req.echo.unwrap_or(false).then(|| prompt.text.clone());
    respond(&state, Endpoint::Completion, prompt, echo, options).await
}

/// Queues the generation and answers with its stream or its result.
async fn respond(
    state: &AppState,
    endpoint: Endpoint,
    prompt: Prompt,
    echo: Option<String>,
    options: crate::params::RequestOptions,
) -> Result<Response, ApiError> {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let id = state.next_id(prefix);
    let ticket = state
        .queue
        .submit(id.clone(), prompt.ids.clone(), options.params)?;
    let meta = ResponseMeta {
        endpoint,
        id,
        created: crate::unix_time(),
        model: state.model_name.clone(),
        prompt_ids: prompt.ids,
        echo,
        include_usage: options.include_usage,
        return_token_ids: options.return_token_ids,
    };
    if options.stream {
        Ok(meta.stream(ticket))
    } else {
        meta.collect(ticket).await
    }
}
