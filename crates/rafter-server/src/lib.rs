//! `rafter serve`: an OpenAI-compatible HTTP server over one rafter LLM.
//!
//! Local LLM servers (llama.cpp's llama-server, Ollama, vLLM) speak OpenAI's API, so every
//! client library and tool already talks to them; this crate gives rafter the same door:
//!
//! - `GET /v1/models`, `GET /v1/models/{id}`: the one model served, under its name.
//! - `POST /v1/completions` and `POST /v1/chat/completions`, plain or with `stream: true`
//!   as server-sent events in OpenAI's chunk format ([`stream`]), with OpenAI's sampling
//!   parameters and rafter's extensions ([`params`]), `usage` counts and `finish_reason`.
//! - `GET /health`: liveness and the queue's counters.
//! - Errors as OpenAI's `{"error": {"message", "type", "param", "code"}}` ([`ApiError`]).
//!
//! One [`Llm`] has one session (its KV cache is the sequence's state), so generations run
//! one at a time on a worker thread, in arrival order, behind a bounded queue ([`queue`]);
//! a client that disconnects cancels its generation within a token.

pub mod error;
pub mod params;
pub mod prompt;
pub mod protocol;
pub mod queue;
mod routes;
pub mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use rafter_generate::ChatTemplate;
use rafter_llm_engine::Llm;

pub use error::ApiError;
pub use queue::QueueStatus;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The name clients give as `model` (any other name is a 404).
    pub model_name: String,
    /// Requests that may wait behind the running one; more are refused with a 503.
    pub max_queue: usize,
}

/// What the handlers share.
pub(crate) struct AppState {
    llm: Arc<Llm>,
    /// The model's chat template, compiled once; or why there is none.
    template: Result<ChatTemplate, String>,
    queue: queue::Queue,
    model_name: String,
    /// When the server started (the model's `created`).
    created: u64,
    next_id: AtomicU64,
}

impl AppState {
    fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.model_name {
            return Ok(());
        }
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{model}` does not exist: this server serves `{}` (see /v1/models)",
                self.model_name
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        })
    }

    fn chat_template(&self) -> Result<&ChatTemplate, ApiError> {
        self.template.as_ref().map_err(|why| {
            ApiError::bad_request(format!("{why}; /v1/completions takes a plain prompt"))
                .with_code("no_chat_template")
        })
    }

    /// A response id unique to this server run: `chatcmpl-<start time><counter>`.
    fn next_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An LLM ready to serve: its queue's worker thread runs.
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// Starts the generation worker over `llm` and compiles its chat template (a model
    /// without one, or with one that does not compile, still serves `/v1/completions`;
    /// [`Server::chat_template_problem`] says why chat is refused).
    pub fn new(llm: Llm, options: ServerOptions) -> std::io::Result<Server> {
        let llm = Arc::new(llm);
        let tok = llm.tokenizer();
        let template = match tok.chat_template() {
            None => Err(format!(
                "the model {} has no chat template",
                llm.path().display()
            )),
            Some(source) => ChatTemplate::new(source, &tok.bos_token(), &tok.eos_token())
                .map_err(|e| format!("the model's chat template does not compile: {e}")),
        };
        let queue = queue::Queue::start(llm.clone(), options.max_queue)?;
        Ok(Server {
            state: Arc::new(AppState {
                llm,
                template,
                queue,
                model_name: options.model_name,
                created: unix_time(),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// The routes, for [`axum::serve`] or a test.
    pub fn router(&self) -> Router {
        routes::router(self.state.clone())
    }

    /// Why `/v1/chat/completions` refuses requests, if it does.
    pub fn chat_template_problem(&self) -> Option<&str> {
        self.state.template.as_ref().err().map(String::as_str)
    }

    pub fn queue_status(&self) -> QueueStatus {
        self.state.queue.status()
    }
}

/// Serves on `listener` until `shutdown` completes; then stops the generations (each
/// answered with a 503 `shutting_down`, a stream with an error event) and returns once
/// their responses are written.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: &Server,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = server.state.clone();
    let stop = async move {
        shutdown.await;
        eprintln!("rafter serve: shutting down");
        state.queue.shut_down();
    };
    axum::serve(listener, server.router())
        .with_graceful_shutdown(stop)
        .await
}

/// Binds `addr` and serves until Ctrl-C or SIGTERM on a tokio runtime of its own (the
/// generation itself runs on the worker thread), calling `on_listening` with the bound
/// address (port 0 picks a free port).
pub fn run(
    server: Server,
    addr: &str,
    on_listening: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rafter-serve-http")
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        on_listening(listener.local_addr()?);
        serve(listener, &server, shutdown_signal()).await
    })
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
