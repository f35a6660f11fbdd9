//! `rafter serve` end to end with the official `openai` Python client as the client.
//!
//! The references are `rafter generate --json-out` runs on the same tiny Qwen3 fixture
//! (random weights, the real tokenizer and chat template): greedy chat and plain prompts,
//! and one seeded sampled prompt. The server must give exactly their tokens, streamed and
//! not, alone and with concurrent clients, after a client disconnected mid-stream and
//! after a full queue refused a request; the error cases must come back as OpenAI error
//! objects. tests/server/openai_client.py holds the client side.
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
