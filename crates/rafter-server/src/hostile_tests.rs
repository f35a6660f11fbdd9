//! Hostile request bodies (issue 28, item 6): empty, not JSON, not an object, nested past
//! serde_json's recursion limit, numbers past their field's range, fields of the wrong
//! type, invalid UTF-8. Each is a 400 whose message or `param` says what is wrong, never a
//! panic or a stack overflow.

use axum::body::Bytes;
use axum::http::StatusCode;

use super::parse_body;
use crate::error::ApiError;
use crate::protocol::{ChatCompletionRequest, CompletionRequest};

fn chat_err(body: &[u8]) -> ApiError {
    match parse_body::<ChatCompletionRequest>(Ok(Bytes::copy_from_slice(body))) {
        Ok(_) => panic!("accepted: {:?}", String::from_utf8_lossy(body)),
        Err(e) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
            e
        }
    }
}

#[test]
fn a_valid_body_parses() {
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    parse_body::<ChatCompletionRequest>(Ok(Bytes::from_static(body))).unwrap();
}

#[test]
fn empty_and_non_json_bodies() {
    for body in [
        &b""[..],
        b"   ",
        b"{",
        b"{\"model\": ",
        b"nul",
        b"\xff\xfe{}",
    ] {
        let e = chat_err(body);
        assert_eq!(e.code, Some("invalid_json"), "{body:?}: {}", e.message);
        assert!(
            e.message.contains("could not parse the JSON body"),
            "{}",
            e.message
        );
    }
}

#[test]
fn bodies_that_are_not_objects_name_their_kind() {
    for (body, kind) in [
        ("[]", "array"),
        ("3", "number"),
        ("\"x\"", "string"),
        ("null", "null"),
    ] {
        let e = chat_err(body.as_bytes());
        assert!(
            e.message.contains(&format!("is a JSON {kind}")),
            "{}",
            e.message
        );
    }
}

#[test]
fn nesting_past_the_recursion_limit_is_refused() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let depth = 100_000;
        let body = format!(
            "{{\"model\": \"m\", \"messages\": [], \"x\": {}1{}}}",
            open.repeat(depth),
            close.repeat(depth)
        );
        let e = chat_err(body.as_bytes());
        assert!(e.message.contains("recursion limit"), "{}", e.message);
    }
}

#[test]
fn numbers_past_their_range_and_wrong_types_name_the_field() {
    let cases = [
        (
            r#"{"model": "m", "messages": [], "max_tokens": 1e300}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "messages": [], "max_tokens": -1}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "messages": [], "max_tokens": 99999999999999999999999}"#,
            "max_tokens",
        ),
        (r#"{"model": "m", "messages": [], "n": "two"}"#, "n"),
        (
            r#"{"model": "m", "messages": {"role": "user"}}"#,
            "messages",
        ),
        (r#"{"model": 7, "messages": []}"#, "model"),
        (r#"{"model": "m", "messages": [], "seed": 1.5}"#, "seed"),
    ];
    for (body, field) in cases {
        let e = chat_err(body.as_bytes());
        assert!(
            e.param.as_deref() == Some(field) || e.message.contains(field),
            "{body}: {} (param {:?})",
            e.message,
            e.param
        );
    }
    let e = match parse_body::<CompletionRequest>(Ok(Bytes::from_static(
        br#"{"model": "m", "prompt": "p", "best_of": -3}"#,
    ))) {
        Ok(_) => panic!("a negative best_of was accepted"),
        Err(e) => e,
    };
    assert!(e.message.contains("best_of"), "{}", e.message);
}

#[test]
fn a_huge_string_is_read_not_a_crash() {
    let body = format!(
        "{{\"model\": \"m\", \"messages\": [], \"user\": \"{}\"}}",
        "x".repeat(4 << 20)
    );
    parse_body::<ChatCompletionRequest>(Ok(Bytes::from(body))).unwrap();
}
