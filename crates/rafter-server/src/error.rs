//! Errors as OpenAI's API reports them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`, which the official clients turn into
//! their exception classes (`BadRequestError`, `NotFoundError`, ...).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// What went wrong and, where it helps, what to do instead.
    pub message: String,
    /// OpenAI's error `type`: `invalid_request_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault (`temperature`, `messages[1].content`), if one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

/// The JSON body of an error.
#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn bad_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 `invalid_request_error` about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A 500 `server_error`: the model or the server failed, not the request.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// Sets the machine-readable `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The `{"error": {...}}` object, also sent as a stream's last event when a generation
    /// fails after the stream has begun.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .expect("an error body always serialises")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Clients that honour it (the openai client does) wait this long before retrying.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_fields() {
        let e = ApiError::bad_param("temperature", "temperature 3 is not in [0, 2]");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["message"], "temperature 3 is not in [0, 2]");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
    }
}
