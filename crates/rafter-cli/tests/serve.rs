//! `rafter serve` end to end with the official `openai` Python client as the client.
//!
//! The references are `rafter generate --json-out` runs on the same tiny Qwen3 fixture
//! (random weights, the real tokenizer and chat template): greedy chat and plain prompts,
//! and one seeded sampled prompt. The server must give exactly their tokens, streamed and
//! not, alone and with concurrent clients, after a client disconnected mid-stream (or gave
//! up on a non-streamed request) and after a full queue refused a request; the error cases
//! must come back as OpenAI error objects. tests/server/openai_client.py holds the client
//! side. A second test sends SIGTERM during a long stream: the server stops it at once.
//!
//! Needs the LLM fixtures (`RAFTER_LLM_FIXTURES`, made by scripts/test.sh) and a Python
//! with the pinned `openai` (`scripts/setup_venv.sh --server` puts it in .venv; or point
//! `RAFTER_SERVER_PYTHON` at another interpreter).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const CONTEXT: usize = 1024;
const MAX_QUEUE: usize = 1;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    let dir = std::env::var_os("RAFTER_LLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/llm-fixtures"));
    let m = dir.join("qwen3/hf-f32");
    assert!(
        m.join("config.json").is_file(),
        "the tiny Qwen3 fixture is not in {}: make the LLM fixtures (scripts/test.sh does) or \
         point RAFTER_LLM_FIXTURES at them",
        m.display()
    );
    m
}

fn python() -> PathBuf {
    let py = std::env::var_os("RAFTER_SERVER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    let has_openai = Command::new(&py)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_openai,
        "{} cannot import openai: run scripts/setup_venv.sh --server, or point \
         RAFTER_SERVER_PYTHON at a Python that has the pinned openai",
        py.display()
    );
    py
}

fn tmpdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("rafter-serve-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `rafter generate` on `model` with `args`; its JSON output with `request` added.
fn reference(
    model: &Path,
    dir: &Path,
    name: &str,
    args: &[&str],
    request: serde_json::Value,
) -> serde_json::Value {
    let out = dir.join(format!("{name}.json"));
    let o = Command::new(env!("CARGO_BIN_EXE_rafter"))
        .arg("generate")
        .arg(model)
        .args(args)
        .arg("--json-out")
        .arg(&out)
        .output()
        .expect("rafter generate runs");
    assert!(
        o.status.success(),
        "rafter generate {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    v["request"] = request;
    v
}

/// Kills the server when the test ends, passed or not.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn openai_client_against_rafter_serve() {
    let model = model();
    let py = python();
    let dir = tmpdir();

    let chat_prompt = "Say hello.";
    let plain_prompt = "The capital of France is";
    let sampled_prompt = "Once upon a time";
    let refs = serde_json::json!({
        "chat": reference(&model, &dir, "chat",
            &["--chat", "-p", chat_prompt, "-n", "24"],
            serde_json::json!({"prompt": chat_prompt, "max_tokens": 24})),
        "plain": reference(&model, &dir, "plain",
            &["-p", plain_prompt, "-n", "24"],
            serde_json::json!({"prompt": plain_prompt, "max_tokens": 24})),
        "sampled": reference(&model, &dir, "sampled",
            &["-p", sampled_prompt, "-n", "16", "--temperature", "0.8", "--seed", "7",
              "--top-k", "40"],
            serde_json::json!({"prompt": sampled_prompt, "max_tokens": 16,
                               "temperature": 0.8, "seed": 7, "top_k": 40})),
    });
    let refs_path = dir.join("refs.json");
    std::fs::write(&refs_path, refs.to_string()).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_rafter"))
        .arg("serve")
        .arg(&model)
        .args(["--port", "0", "--model-name", "tiny-qwen3"])
        .args(["--context", &CONTEXT.to_string()])
        .args(["--max-queue", &MAX_QUEUE.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("rafter serve starts");
    let stdout = child.stdout.take().unwrap();
    let server = ServerProcess(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("rafter serve prints its address");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in rafter serve's first line: {line:?}"))
        .to_string();

    let o = Command::new(&py)
        .arg(root().join("tests/server/openai_client.py"))
        .arg(&url)
        .arg("tiny-qwen3")
        .arg(&refs_path)
        .arg(CONTEXT.to_string())
        .arg(MAX_QUEUE.to_string())
        .output()
        .expect("the openai client script runs");
    drop(server);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{out}");
    assert!(
        o.status.success(),
        "the openai client failed:\n{out}\n{err}"
    );
    assert!(out.contains("all passed"), "{out}");
}

/// SIGTERM while a long generation streams: the server stops it within moments (not after
/// its thousands of tokens), ends the stream with a `shutting_down` error event and
/// `[DONE]`, and exits 0.
#[cfg(unix)]
#[test]
fn sigterm_stops_a_streaming_generation() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    let model = model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rafter"))
        .arg("serve")
        .arg(&model)
        .args(["--port", "0", "--model-name", "m", "--context", "4096"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("rafter serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("rafter serve prints its address");
    let server = ServerProcess(child);
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .and_then(|w| w.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();

    let body = r#"{"model": "m", "prompt": "a", "max_tokens": 4000, "ignore_eos": true,
                   "temperature": 0, "stream": true}"#;
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // Wait for the first text chunk: the generation runs.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"text\"") {
        let n = conn.read(&mut buf).expect("the stream starts");
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let term = Instant::now();
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    conn.read_to_end(&mut got).expect("the stream ends");
    let mut server = server;
    let status = server.0.wait().unwrap();
    let took = term.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(status.success(), "rafter serve exited with {status}");
    // (The body is chunked: HTTP/1.1 framing surrounds the events.)
    let error_at = text.find("\"code\":\"shutting_down\"");
    let done_at = text.find("data: [DONE]");
    assert!(
        matches!((error_at, done_at), (Some(e), Some(d)) if e < d),
        "the stream did not end with a shutting_down error and [DONE]: ...{}",
        &text[text.len().saturating_sub(400)..]
    );
    // 4000 tokens take tens of seconds on the tiny model; stopping takes one token.
    assert!(
        took < Duration::from_secs(10),
        "the server took {took:?} to stop"
    );
}
