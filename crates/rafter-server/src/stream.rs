//! Responses in OpenAI's shapes: the chunks of a `stream: true` response as server-sent
//! events (`data: {chunk}` lines, then `data: [DONE]`), and the one-object answer of a
//! non-streamed request, for both endpoints.
//!
//! A chat stream opens with a chunk whose delta carries the role, sends one chunk per text
//! piece, then a chunk with an empty delta and the `finish_reason`; with
//! `stream_options.include_usage` every chunk has `"usage": null` and a last chunk with no
//! choices carries the counts. A completion stream sends `text` pieces the same way (the
//! prompt first when `echo`). A generation that fails after the stream began ends it with an
//! `{"error": ...}` event, which the openai client raises as an `APIError`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use rafter_generate::FinishReason;
use serde::Serialize;

use crate::error::ApiError;
use crate::protocol::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, Completion,
    CompletionChoice, Delta, Usage,
};
use crate::queue::{Event, Finished, Ticket};

/// Which endpoint's shapes to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What every object of one response shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_ids: Vec<u32>,
    /// The prompt's text, written before the completion (`echo`, completions only).
    pub echo: Option<String>,
    pub include_usage: bool,
    pub return_token_ids: bool,
}

/// OpenAI's name for how a generation ended.
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "length",
        // A cancelled generation has no client left to read its reason.
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn usage(meta: &ResponseMeta, f: &Finished) -> Usage {
    Usage::new(meta.prompt_ids.len(), f.generated_ids.len())
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("response objects always serialise")
}

impl ResponseMeta {
    /// The non-streamed answer: waits for the generation and writes one object.
    pub async fn collect(self, mut ticket: Ticket) -> Result<Response, ApiError> {
        let finished = loop {
            match ticket.events.recv().await {
                Some(Event::Text(_)) => {}
                Some(Event::Done(done)) => break done?,
                None => return Err(ApiError::internal("the generation worker stopped")),
            }
        };
        let token_ids = self
            .return_token_ids
            .then(|| finished.generated_ids.clone());
        let prompt_token_ids = self.return_token_ids.then(|| self.prompt_ids.clone());
        let usage = usage(&self, &finished);
        let reason = finish_reason(finished.finish_reason);
        let text = match &self.echo {
            Some(prompt) => format!("{prompt}{}", finished.text),
            None => finished.text,
        };
        let body = match self.endpoint {
            Endpoint::Chat => json(&ChatCompletion {
                id: self.id,
                object: "chat.completion",
                created: self.created,
                model: self.model,
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: "assistant",
                        content: text,
                    },
                    logprobs: None,
                    finish_reason: reason,
                    token_ids,
                }],
                usage,
                prompt_token_ids,
            }),
            Endpoint::Completion => json(&Completion {
                id: self.id,
                object: "text_completion",
                created: self.created,
                model: self.model,
                choices: vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: Some(reason),
                    token_ids,
                }],
                usage: Some(Some(usage)),
                prompt_token_ids,
            }),
        };
        Ok((
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response())
    }

    /// The streamed answer: server-sent events as the generation produces text.
    pub fn stream(self, ticket: Ticket) -> Response {
        let events =
            chunks(self, ticket).map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)));
        Sse::new(events)
            // Comment lines while a request waits in the queue: clients ignore them, and
            // writing them finds a client that has gone (which cancels its job).
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
            .into_response()
    }

    /// One chunk (with `"usage": null` when usage comes at the end).
    fn chunk(
        &self,
        content: Option<Delta>,
        text: Option<String>,
        end: Option<&Finished>,
    ) -> String {
        let reason = end.map(|f| finish_reason(f.finish_reason));
        let token_ids = end
            .filter(|_| self.return_token_ids)
            .map(|f| f.generated_ids.clone());
        let usage = self.include_usage.then_some(None);
        match self.endpoint {
            Endpoint::Chat => json(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChunkChoice {
                    index: 0,
                    delta: content.unwrap_or_default(),
                    logprobs: None,
                    finish_reason: reason,
                    token_ids,
                }],
                usage,
            }),
            Endpoint::Completion => json(&Completion {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text: text.unwrap_or_default(),
                    logprobs: None,
                    finish_reason: reason,
                    token_ids,
                }],
                usage,
                prompt_token_ids: None,
            }),
        }
    }

    /// The chunk that opens a stream: the role (chat) or the echoed prompt (completions).
    fn opening(&self) -> Option<String> {
        match (self.endpoint, &self.echo) {
            (Endpoint::Chat, _) => Some(self.chunk(
                Some(Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                }),
                None,
                None,
            )),
            (Endpoint::Completion, Some(prompt)) => {
                Some(self.chunk(None, Some(prompt.clone()), None))
            }
            (Endpoint::Completion, None) => None,
        }
    }

    fn text(&self, piece: String) -> String {
        match self.endpoint {
            Endpoint::Chat => self.chunk(
                Some(Delta {
                    role: None,
                    content: Some(piece),
                }),
                None,
                None,
            ),
            Endpoint::Completion => self.chunk(None, Some(piece), None),
        }
    }

    /// The chunk with no choices that carries `usage`.
    fn usage_chunk(&self, usage: Usage) -> String {
        let usage = Some(Some(usage));
        match self.endpoint {
            Endpoint::Chat => json(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage,
            }),
            Endpoint::Completion => json(&Completion {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage,
                prompt_token_ids: self.return_token_ids.then(|| self.prompt_ids.clone()),
            }),
        }
    }
}

/// Where a stream is.
enum Phase {
    Opening,
    Body,
    Usage(Usage),
    Done,
    End,
}

struct StreamState {
    meta: ResponseMeta,
    ticket: Ticket,
    phase: Phase,
}

/// The `data:` payloads of a stream, in order; dropping the stream drops the ticket, which
/// cancels the job.
fn chunks(meta: ResponseMeta, ticket: Ticket) -> impl Stream<Item = String> + Send {
    let state = StreamState {
        meta,
        ticket,
        phase: Phase::Opening,
    };
    stream::unfold(state, |mut s| async move {
        let data = next_chunk(&mut s).await?;
        Some((data, s))
    })
}

async fn next_chunk(s: &mut StreamState) -> Option<String> {
    loop {
        match std::mem::replace(&mut s.phase, Phase::End) {
            Phase::Opening => {
                s.phase = Phase::Body;
                if let Some(c) = s.meta.opening() {
                    return Some(c);
                }
            }
            Phase::Body => {
                let event = s.ticket.events.recv().await;
                return Some(match event {
                    Some(Event::Text(piece)) => {
                        s.phase = Phase::Body;
                        s.meta.text(piece)
                    }
                    Some(Event::Done(Ok(f))) => {
                        s.phase = if s.meta.include_usage {
                            Phase::Usage(usage(&s.meta, &f))
                        } else {
                            Phase::Done
                        };
                        s.meta.chunk(None, None, Some(&f))
                    }
                    Some(Event::Done(Err(e))) => {
                        s.phase = Phase::Done;
                        e.to_json()
                    }
                    None => {
                        s.phase = Phase::Done;
                        ApiError::internal("the generation worker stopped").to_json()
                    }
                });
            }
            Phase::Usage(u) => {
                s.phase = Phase::Done;
                return Some(s.meta.usage_chunk(u));
            }
            Phase::Done => return Some("[DONE]".to_string()),
            Phase::End => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Ticket;
    use rafter_generate::Timings;
    use serde_json::{json, Value};

    fn meta(endpoint: Endpoint, include_usage: bool) -> ResponseMeta {
        ResponseMeta {
            endpoint,
            id: "id-1".into(),
            created: 7,
            model: "m".into(),
            prompt_ids: vec![1, 2, 3],
            echo: None,
            include_usage,
            return_token_ids: false,
        }
    }

    fn finished(reason: FinishReason) -> Finished {
        Finished {
            generated_ids: vec![10, 11],
            text: "ab".into(),
            finish_reason: reason,
            timings: Timings::default(),
        }
    }

    /// The `data:` payloads of a stream whose job sent `events`.
    async fn payloads(meta: ResponseMeta, events: Vec<Event>) -> Vec<String> {
        let (ticket, tx) = Ticket::for_test();
        for e in events {
            tx.send(e).unwrap();
        }
        drop(tx);
        chunks(meta, ticket).collect().await
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[tokio::test]
    async fn chat_stream_shape() {
        let events = vec![
            Event::Text("a".into()),
            Event::Text("b".into()),
            Event::Done(Ok(finished(FinishReason::Length))),
        ];
        let p = payloads(meta(Endpoint::Chat, true), events).await;
        assert_eq!(p.len(), 6, "{p:?}");
        let c: Vec<Value> = p[..5].iter().map(|s| parse(s)).collect();
        assert_eq!(
            c[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(c[0]["object"], "chat.completion.chunk");
        assert_eq!(c[1]["choices"][0]["delta"], json!({"content": "a"}));
        assert_eq!(c[2]["choices"][0]["delta"], json!({"content": "b"}));
        assert!(c[2]["choices"][0]["finish_reason"].is_null());
        assert_eq!(c[3]["choices"][0]["delta"], json!({}));
        assert_eq!(c[3]["choices"][0]["finish_reason"], "length");
        // include_usage: usage null on every chunk, then a chunk without choices.
        assert!(c[..4]
            .iter()
            .all(|c| c["usage"].is_null() && c.get("usage").is_some()));
        assert_eq!(c[4]["choices"], json!([]));
        assert_eq!(
            c[4]["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
        );
        assert_eq!(p[5], "[DONE]");
    }

    #[tokio::test]
    async fn completion_stream_without_usage() {
        let events = vec![
            Event::Text("x".into()),
            Event::Done(Ok(finished(FinishReason::Stop))),
        ];
        let p = payloads(meta(Endpoint::Completion, false), events).await;
        assert_eq!(p.len(), 3, "{p:?}");
        let first = parse(&p[0]);
        assert_eq!(first["object"], "text_completion");
        assert_eq!(first["choices"][0]["text"], "x");
        assert!(first.get("usage").is_none());
        assert_eq!(parse(&p[1])["choices"][0]["finish_reason"], "stop");
        assert_eq!(p[2], "[DONE]");
    }

    #[tokio::test]
    async fn a_failure_ends_the_stream_with_an_error_event() {
        let events = vec![
            Event::Text("x".into()),
            Event::Done(Err(ApiError::internal("boom"))),
        ];
        let p = payloads(meta(Endpoint::Chat, false), events).await;
        assert_eq!(p.len(), 4, "{p:?}");
        assert_eq!(parse(&p[2])["error"]["message"], "boom");
        assert_eq!(parse(&p[2])["error"]["type"], "server_error");
        assert_eq!(p[3], "[DONE]");
        // A worker that went away without an answer is an error too, never a silent end.
        let p = payloads(meta(Endpoint::Completion, false), vec![]).await;
        assert_eq!(parse(&p[0])["error"]["type"], "server_error");
        assert_eq!(p[1], "[DONE]");
    }
}
