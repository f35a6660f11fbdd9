//! Request fields to generation settings: OpenAI's sampling parameters (and the `top_k`,
//! `min_p`, `repetition_penalty`, `ignore_eos` extensions) checked and mapped onto
//! [`GenerateParams`]; parameters rafter cannot honour are refused by name rather than
//! silently dropped.

use rafter_generate::{GenerateParams, SamplerConfig, Tokenizer};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::protocol::{CommonFields, IGNORED_FIELDS};

/// What a request asks for, besides its prompt.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// Sampling, stop tokens and strings; `max_tokens` is set once the prompt's length is
    /// known ([`RequestOptions::budget`]).
    pub params: GenerateParams,
    /// `max_tokens` / `max_completion_tokens` as given.
    pub max_tokens: Option<usize>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage`.
    pub include_usage: bool,
    pub return_token_ids: bool,
}

/// A 400 naming `param` and why.
fn bad(param: &str, why: String) -> ApiError {
    ApiError::bad_param(param, why)
}

/// Refuses fields rafter does not know, as OpenAI does; accepts [`IGNORED_FIELDS`].
pub fn check_extra(extra: &Map<String, Value>) -> Result<(), ApiError> {
    match extra.keys().find(|k| !IGNORED_FIELDS.contains(&k.as_str())) {
        Some(k) => Err(bad(
            k,
            format!("Unrecognized request argument supplied: {k}"),
        )),
        None => Ok(()),
    }
}

/// Checks the shared fields and maps them onto [`GenerateParams`]. `max_tokens` is the
/// endpoint's resolved budget field (`max_completion_tokens` or `max_tokens`).
pub fn request_options(
    c: &CommonFields,
    max_tokens: Option<(&str, u64)>,
    tokenizer: &Tokenizer,
) -> Result<RequestOptions, ApiError> {
    if let Some(n) = c.n.filter(|&n| n != 1) {
        return Err(bad(
            "n",
            format!(
                "n = {n} is not supported: rafter serve returns one choice per request \
                 (send {n} requests, with different seeds)"
            ),
        ));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad(
            "temperature",
            format!("temperature {temperature} is not in [0, 2]"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", format!("top_p {top_p} is not in (0, 1]")));
    }
    let top_k = match c.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(bad(
                "top_k",
                format!("top_k {k} is not a positive count (0 or -1: no limit)"),
            ))
        }
    };
    let min_p = c.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(bad("min_p", format!("min_p {min_p} is not in [0, 1]")));
    }
    let repetition_penalty = c.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(bad(
            "repetition_penalty",
            format!("repetition_penalty {repetition_penalty} is not a positive number"),
        ));
    }
    for (name, value) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if let Some(v) = value.filter(|&v| v != 0.0) {
            return Err(bad(
                name,
                format!(
                    "{name} {v} is not supported (only 0): rafter's sampler has HF's \
                     multiplicative `repetition_penalty` instead (an extension field, 1 = off)"
                ),
            ));
        }
    }
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(bad(
            "logit_bias",
            "logit_bias is not supported by rafter serve".into(),
        ));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(bad(
            "stream_options",
            "stream_options is only allowed when stream is true".into(),
        ));
    }
    let max_tokens = match max_tokens {
        Some((name, 0)) => return Err(bad(name, format!("{name} must be at least 1"))),
        Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    // Without a seed, each request draws its own (OpenAI's sampling is not reproducible
    // unless a seed is given); a given seed reproduces the tokens.
    let seed = c.seed.map_or_else(rand::random::<u64>, |s| s as u64);

    let mut params = GenerateParams::new(tokenizer, 0);
    params.sampler = SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        seed,
    };
    params.stop_strings = stop_strings(c.stop.as_ref())?;
    if c.ignore_eos.unwrap_or(false) {
        params.stop_token_ids.clear();
    }
    Ok(RequestOptions {
        params,
        max_tokens,
        stream,
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        return_token_ids: c.return_token_ids.unwrap_or(false),
    })
}

/// `stop`: null, a string, or a list of strings, none empty.
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad(
                    &format!("stop[{i}]"),
                    format!("stop[{i}] is {other}, expected a string"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(bad(
                "stop",
                format!("stop is {other}, expected a string or a list of strings"),
            ))
        }
    };
    if strings.iter().any(String::is_empty) {
        return Err(bad("stop", "stop strings must not be empty".into()));
    }
    Ok(strings)
}

/// The resolved `max_tokens` field of a chat request: `max_completion_tokens` (the current
/// name) or `max_tokens` (the deprecated one); both given must agree.
pub fn chat_max_tokens(
    max_completion_tokens: Option<u64>,
    max_tokens: Option<u64>,
) -> Result<Option<(&'static str, u64)>, ApiError> {
    match (max_completion_tokens, max_tokens) {
        (Some(a), Some(b)) if a != b => Err(bad(
            "max_completion_tokens",
            format!("max_completion_tokens ({a}) and max_tokens ({b}) disagree: give one"),
        )),
        (Some(a), _) => Ok(Some(("max_completion_tokens", a))),
        (None, Some(b)) => Ok(Some(("max_tokens", b))),
        (None, None) => Ok(None),
    }
}

impl RequestOptions {
    /// Sets the token budget for a prompt of `prompt_len` tokens in a context of `context`
    /// positions: the requested `max_tokens`, else `default` (or the rest of the context).
    /// A prompt that leaves no room, or a requested budget past the context, is a 400 that
    /// names the context, as OpenAI's `context_length_exceeded` does.
    pub fn budget(
        &mut self,
        prompt_len: usize,
        context: usize,
        default: Option<usize>,
        prompt_param: &str,
    ) -> Result<(), ApiError> {
        if prompt_len >= context {
            return Err(ApiError::bad_param(
                prompt_param,
                format!(
                    "This model's maximum context length is {context} tokens (rafter serve \
                     --context, or the context the artifact was compiled for). However, your \
                     {prompt_param} resulted in {prompt_len} tokens, which leaves no room for a \
                     completion. Please reduce the length of the {prompt_param}."
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = context - prompt_len;
        self.params.max_tokens = match self.max_tokens {
            Some(n) if n > room => {
                return Err(ApiError::bad_param(
                    prompt_param,
                    format!(
                        "This model's maximum context length is {context} tokens. However, you \
                         requested {} tokens ({prompt_len} in the {prompt_param}, {n} in the \
                         completion). Please reduce the length of the {prompt_param} or \
                         completion.",
                        prompt_len.saturating_add(n)
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Some(n) => n,
            None => default.unwrap_or(room).min(room),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_shapes() {
        assert_eq!(stop_strings(None).unwrap(), Vec::<String>::new());
        assert_eq!(stop_strings(Some(&json!("x"))).unwrap(), vec!["x"]);
        assert_eq!(
            stop_strings(Some(&json!(["a", "b"]))).unwrap(),
            vec!["a", "b"]
        );
        let e = stop_strings(Some(&json!(["a", 3]))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop[1]"));
        let e = stop_strings(Some(&json!(5))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(stop_strings(Some(&json!([""]))).is_err());
    }

    #[test]
    fn unknown_fields_are_named() {
        let mut m = Map::new();
        m.insert("store".into(), json!(true));
        assert!(check_extra(&m).is_ok());
        m.insert("frobnicate".into(), json!(1));
        let e = check_extra(&m).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert!(e.message.contains("Unrecognized request argument"));
    }

    #[test]
    fn max_tokens_fields() {
        assert_eq!(chat_max_tokens(None, None).unwrap(), None);
        assert_eq!(
            chat_max_tokens(Some(5), None).unwrap(),
            Some(("max_completion_tokens", 5))
        );
        assert_eq!(
            chat_max_tokens(None, Some(7)).unwrap(),
            Some(("max_tokens", 7))
        );
        assert!(chat_max_tokens(Some(5), Some(7)).is_err());
        assert!(chat_max_tokens(Some(5), Some(5)).is_ok());
    }
}
