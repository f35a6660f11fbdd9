//! LLMs: open a model folder, GGUF or LLM artifact, and generate text streamed to Python.
//!
//! Generation runs on a Rust thread of its own; the pieces come to Python through a channel
//! that [`TextStream`] (a Python iterator) drains with the GIL released. Dropping or closing
//! the stream stops generation at the next token. One generation runs at a time per model
//! (they share its KV cache): a second waits for the first.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rafter_generate::{GenerateParams, Message, SamplerConfig};
use rafter_llm_engine::{KvType, Llm as Engine, LlmOptions};

use crate::errors::{to, LLMError};

/// An LLM ready to generate.
#[pyclass(frozen, module = "rafter._rafter")]
pub struct Llm {
    engine: Arc<Engine>,
    /// Held by the generation running now.
    busy: Arc<Mutex<()>>,
}

/// What a generation thread sends: a text piece, then the end (its summary or error).
enum Event {
    Text(String),
    Done(Result<Summary, String>),
}

/// The end of a generation, as `TextStream.result` gives it.
struct Summary {
    text: String,
    prompt_tokens: usize,
    completion_tokens: usize,
    finish_reason: String,
}

#[pymethods]
impl Llm {
    /// Opens (and, for a Hugging Face folder or GGUF, compiles) the model at `path`.
    #[new]
    #[pyo3(signature = (path, context=None, threads=0, kv_type=None, mmap=false, matmul_precision="f32"))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        context: Option<usize>,
        threads: usize,
        kv_type: Option<&str>,
        mmap: bool,
        matmul_precision: &str,
    ) -> PyResult<Llm> {
        let matmul_precision = matmul_precision
            .parse()
            .map_err(|e: String| to::<LLMError>(format!("matmul_precision: {e}")))?;
        let kv_type = match kv_type {
            None => None,
            Some(t) => Some(KvType::from_word(t).ok_or_else(|| {
                to::<LLMError>(format!("kv_type {t:?}: expected \"f16\" or \"f32\""))
            })?),
        };
        let options = LlmOptions {
            context,
            threads,
            kv_type,
            map_weights: mmap,
            matmul_precision,
            ..LlmOptions::default()
        };
        let engine = py
            .detach(|| Engine::open(&path, &options))
            .map_err(|e| to::<LLMError>(format!("opening {}: {e}", path.display())))?;
        Ok(Llm {
            engine: Arc::new(engine),
            busy: Arc::new(Mutex::new(())),
        })
    }

    /// The positions (prompt and generated) a sequence may hold.
    #[getter]
    fn context(&self) -> usize {
        self.engine.context()
    }

    /// The architecture (`Qwen3`, `Llama`...).
    #[getter]
    fn architecture(&self) -> String {
        self.engine.info().architecture.clone()
    }

    /// Token ids of `text` (with the tokenizer's special prefix when `add_special`).
    #[pyo3(signature = (text, add_special=true))]
    fn encode(&self, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        self.engine
            .tokenizer()
            .encode(text, add_special)
            .map_err(to::<LLMError>)
    }

    /// The chat template rendered over `messages` (`(role, content)` pairs) with the
    /// generation prompt appended.
    fn chat_prompt(&self, messages: Vec<(String, String)>) -> PyResult<String> {
        let messages: Vec<Message> = messages
            .into_iter()
            .map(|(role, content)| Message::new(role, content))
            .collect();
        self.engine.chat_prompt(&messages).map_err(to::<LLMError>)
    }

    /// Starts generating from `prompt_ids`; the stream yields the text pieces.
    #[pyo3(signature = (prompt_ids, max_tokens, temperature, top_k, top_p, min_p,
                        repetition_penalty, seed, stop))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        seed: u64,
        stop: Vec<String>,
    ) -> PyResult<TextStream> {
        if prompt_ids.is_empty() {
            return Err(to::<LLMError>("the prompt is empty after tokenization"));
        }
        if prompt_ids.len() >= self.engine.context() {
            return Err(to::<LLMError>(format!(
                "the prompt has {} tokens, but the model's context holds {}",
                prompt_ids.len(),
                self.engine.context()
            )));
        }
        let mut params = GenerateParams::new(self.engine.tokenizer(), max_tokens);
        params.sampler = SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
        };
        params.stop_strings = stop;
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let (engine, busy, stop_flag) = (self.engine.clone(), self.busy.clone(), cancel.clone());
        std::thread::spawn(move || {
            let _turn = busy.lock().unwrap_or_else(|p| p.into_inner());
            let result = engine.generate(&prompt_ids, &params, |piece| {
                if stop_flag.load(Ordering::Relaxed) || tx.send(Event::Text(piece.into())).is_err()
                {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            let summary = result
                .map(|g| Summary {
                    text: g.text,
                    prompt_tokens: g.prompt_ids.len(),
                    completion_tokens: g.generated_ids.len(),
                    finish_reason: format!("{:?}", g.finish_reason).to_lowercase(),
                })
                .map_err(|e| e.to_string());
            let _ = tx.send(Event::Done(summary));
        });
        Ok(TextStream {
            rx: Mutex::new(Some(rx)),
            cancel,
            result: Mutex::new(None),
        })
    }
}

/// The text pieces of one generation, as a Python iterator. `result()` gives the whole
/// text and the token counts once it has ended.
#[pyclass(frozen, module = "rafter._rafter")]
pub struct TextStream {
    rx: Mutex<Option<Receiver<Event>>>,
    cancel: Arc<AtomicBool>,
    result: Mutex<Option<Summary>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self.rx.lock().map_err(|_| to::<LLMError>("lock"))?;
        let Some(rx) = guard.take() else {
            return Ok(None);
        };
        // The receiver moves into the GIL-free wait and back (it is not `Sync`).
        let (rx, event) = py.detach(move || {
            let event = rx.recv();
            (rx, event)
        });
        *guard = Some(rx);
        match event {
            Ok(Event::Text(t)) => Ok(Some(t)),
            Ok(Event::Done(Ok(summary))) => {
                *guard = None;
                *self.result.lock().map_err(|_| to::<LLMError>("lock"))? = Some(summary);
                Ok(None)
            }
            Ok(Event::Done(Err(e))) => {
                *guard = None;
                Err(to::<LLMError>(e))
            }
            Err(_) => {
                *guard = None;
                Err(to::<LLMError>(
                    "the generation thread ended without a result",
                ))
            }
        }
    }

    /// Stops generation at the next token.
    fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Ok(mut g) = self.rx.lock() {
            *g = None;
        }
    }

    /// After the stream ended: `{"text", "prompt_tokens", "completion_tokens",
    /// "finish_reason"}`; `None` before.
    fn result(&self, py: Python<'_>) -> PyResult<Option<Py<PyDict>>> {
        let r = self.result.lock().map_err(|_| to::<LLMError>("lock"))?;
        let Some(s) = r.as_ref() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("text", &s.text)?;
        d.set_item("prompt_tokens", s.prompt_tokens)?;
        d.set_item("completion_tokens", s.completion_tokens)?;
        d.set_item("finish_reason", &s.finish_reason)?;
        Ok(Some(d.unbind()))
    }
}

impl Drop for TextStream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}
