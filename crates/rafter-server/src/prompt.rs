//! Prompts from requests: chat messages checked, normalised and rendered through the model's
//! chat template, and a completion's `prompt` (text or token ids), both to token ids the
//! way `rafter generate` makes them (so a greedy request gives its exact tokens).

use rafter_generate::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// A prompt ready to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// The prompt as text (a completion's `echo` repeats it).
    pub text: String,
}

/// Checks OpenAI chat messages and makes them what chat templates read: `content` as one
/// string (text parts joined by newlines, as vLLM does), `developer` (OpenAI's newer name
/// for the system role) as `system`, other fields (`name`, `tool_calls`, `tool_call_id`)
/// kept.
pub fn chat_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages is empty: give at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect()
}

fn chat_message(i: usize, message: &Value) -> Result<Value, ApiError> {
    let at = |field: &str| format!("messages[{i}]{field}");
    let Value::Object(fields) = message else {
        return Err(ApiError::bad_param(
            at(""),
            format!("messages[{i}] is {message}, expected an object with `role` and `content`"),
        ));
    };
    let mut out: Map<String, Value> = fields.clone();
    let role = match fields.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(other) => {
            return Err(ApiError::bad_param(
                at(".role"),
                format!("messages[{i}].role is {other}, expected a string"),
            ))
        }
        None => {
            return Err(ApiError::bad_param(
                at(".role"),
                format!("messages[{i}] has no `role`"),
            ))
        }
    };
    if !["system", "developer", "user", "assistant", "tool"].contains(&role) {
        return Err(ApiError::bad_param(
            at(".role"),
            format!(
                "messages[{i}].role `{role}` is not one of system, developer, user, \
                 assistant, tool"
            ),
        ));
    }
    if role == "developer" {
        out.insert("role".into(), Value::String("system".into()));
    }
    let content = match fields.get("content") {
        None | Some(Value::Null) if role == "assistant" => Value::Null,
        None | Some(Value::Null) => {
            return Err(ApiError::bad_param(
                at(".content"),
                format!("messages[{i}] ({role}) has no `content`"),
            ))
        }
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => Value::String(text_parts(i, parts)?),
        Some(other) => {
            return Err(ApiError::bad_param(
                at(".content"),
                format!("messages[{i}].content is {other}, expected a string or a list of parts"),
            ))
        }
    };
    out.insert("content".into(), content);
    Ok(Value::Object(out))
}

/// The text of a content-part list (`[{"type": "text", "text": ...}]`); other part types
/// are refused (the server's models read text only).
fn text_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
            (Some("text"), _) => {
                return Err(ApiError::bad_param(
                    format!("{at}.text"),
                    format!("{at} is a text part without a string `text`"),
                ))
            }
            (Some(kind), _) => {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!("{at} is a `{kind}` part: rafter serve reads text parts only"),
                ))
            }
            (None, _) => {
                return Err(ApiError::bad_param(
                    at.clone(),
                    format!("{at} is {part}, expected {{\"type\": \"text\", \"text\": ...}}"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Renders `messages` (already [`chat_messages`]) with the generation prompt appended, and
/// tokenizes the result without adding special tokens (the template writes its own BOS),
/// as `rafter generate --chat` does.
pub fn chat_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: Vec<Value>,
    template_kwargs: Option<Map<String, Value>>,
) -> Result<Prompt, ApiError> {
    let mut request = ChatRequest {
        messages,
        add_generation_prompt: true,
        ..Default::default()
    };
    if let Some(extra) = template_kwargs {
        request.extra = extra;
    }
    let text = template
        .render(&request)
        .map_err(|e| ApiError::bad_param("messages", format!("rendering the messages: {e}")))?;
    let ids = tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
    Ok(Prompt { ids, text })
}

/// A completion's `prompt`: text (tokenized with the tokenizer's special tokens, as `rafter
/// generate` does), a list of token ids, or either wrapped in a one-element list.
pub fn completion_prompt(
    prompt: &Value,
    tokenizer: &Tokenizer,
    vocab_size: usize,
) -> Result<Prompt, ApiError> {
    match prompt {
        Value::String(text) => {
            let ids = tokenizer
                .encode(text, true)
                .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
            Ok(Prompt {
                ids,
                text: text.clone(),
            })
        }
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            let ids = token_ids(items, vocab_size)?;
            let text = tokenizer
                .decode(&ids, false)
                .map_err(|e| ApiError::bad_param("prompt", format!("decoding the prompt: {e}")))?;
            Ok(Prompt { ids, text })
        }
        Value::Array(items) if items.len() == 1 => {
            completion_prompt(&items[0], tokenizer, vocab_size)
        }
        Value::Array(items) if items.len() > 1 => Err(ApiError::bad_param(
            "prompt",
            format!(
                "prompt is a list of {} prompts: rafter serve completes one prompt per \
                 request (send one request each)",
                items.len()
            ),
        )),
        other => Err(ApiError::bad_param(
            "prompt",
            format!(
                "prompt is {other}, expected a string, a list of token ids, or a one-element \
                 list of either"
            ),
        )),
    }
}

fn token_ids(items: &[Value], vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .filter(|&id| id < vocab_size as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::bad_param(
                        format!("prompt[{i}]"),
                        format!("prompt[{i}] = {v} is not a token id in [0, {vocab_size})"),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_normalised() {
        let m = chat_messages(&[
            json!({"role": "developer", "content": "be brief"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
        ])
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "a\nb"}));
        assert_eq!(
            m[2],
            json!({"role": "assistant", "content": null, "tool_calls": []})
        );
    }

    #[test]
    fn bad_messages_name_the_field() {
        let param = |v: Value| chat_messages(&[v]).unwrap_err().param.unwrap();
        assert_eq!(param(json!("hi")), "messages[0]");
        assert_eq!(param(json!({"content": "x"})), "messages[0].role");
        assert_eq!(
            param(json!({"role": "wizard", "content": "x"})),
            "messages[0].role"
        );
        assert_eq!(param(json!({"role": "user"})), "messages[0].content");
        assert_eq!(
            param(json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})),
            "messages[0].content[0].type"
        );
        assert_eq!(chat_messages(&[]).unwrap_err().param.unwrap(), "messages");
    }

    #[test]
    fn token_ids_checked_against_the_vocabulary() {
        assert_eq!(token_ids(&[json!(0), json!(9)], 10).unwrap(), vec![0, 9]);
        let e = token_ids(&[json!(1), json!(10)], 10).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt[1]"));
        assert!(token_ids(&[json!(-1)], 10).is_err());
        assert!(token_ids(&[json!(1.5)], 10).is_err());
    }
}
