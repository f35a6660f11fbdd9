//! Chat templates: a model's Jinja template rendered with `minijinja` the way transformers'
//! `apply_chat_template` renders it.
//!
//! transformers renders with `trim_blocks` and `lstrip_blocks`, loop controls, a `tojson`
//! that is Python's `json.dumps` ([`crate::pyjson`]), `raise_exception(msg)`,
//! `strftime_now(fmt)` (local time), and the variables `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`) and any extra
//! keyword (`enable_thinking`, ...). Templates also call Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`); minijinja-contrib's pycompat supplies them.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::pyjson::{dumps, DumpOptions};

/// One chat message (the common case; richer messages go in as JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What a template renders: the conversation and its options.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// Messages as JSON objects (`role`, `content`, and whatever else the template reads:
    /// `tool_calls`, `reasoning_content`, content lists).
    pub messages: Vec<Json>,
    /// End with the header of an assistant turn, for the model to continue.
    pub add_generation_prompt: bool,
    /// Tool schemas (`None` renders as Python's `None`).
    pub tools: Option<Vec<Json>>,
    /// Other template variables (`enable_thinking`, `date_string`, ...).
    pub extra: Map<String, Json>,
}

impl ChatRequest {
    pub fn new(messages: &[Message]) -> Self {
        ChatRequest {
            messages: messages
                .iter()
                .map(|m| serde_json::to_value(m).expect("a Message always serialises"))
                .collect(),
            add_generation_prompt: true,
            ..Default::default()
        }
    }
}

/// The clock behind `strftime_now`.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's local time (what transformers uses).
    #[default]
    Local,
    /// A fixed civil time (for reproducible prompts and tests).
    Fixed(jiff::civil::DateTime),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// Template instructions one render may run (minijinja's fuel). A template that loops
/// (nested `range`s) fails after this many, in well under a second, instead of running for
/// hours; the real templates of tests/data/chat_templates.json (Qwen 2.5 and 3, Llama 3.1
/// and 3.2, Gemma 2, Phi 3.5, SmolLM3) render 16,000-message conversations (about 1 MB of
/// prompt, measured 2026-11-28) within it.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// The longest prompt a template may render: far past any model's context (a million tokens
/// of about four bytes), short of exhausting memory on a template that repeats text.
pub const MAX_PROMPT_BYTES: usize = 16 << 20;

/// A writer that refuses bytes past [`MAX_PROMPT_BYTES`] and remembers that it did (the
/// template engine reports only that a write failed).
#[derive(Default)]
struct CappedWriter {
    out: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > MAX_PROMPT_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("prompt too long"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_error(e: minijinja::Error) -> Error {
    // `{:#}` adds the template line the error comes from.
    Error::Template(format!("{e:#}"))
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates receive.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_clock(source, bos_token, eos_token, Clock::Local)
    }

    /// As [`ChatTemplate::new`], with the clock `strftime_now` reads.
    pub fn with_clock(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        clock: Clock,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function(
            "strftime_now",
            move |fmt: String| -> std::result::Result<String, minijinja::Error> {
                let now = match &clock {
                    Clock::Local => jiff::ZonedDateTime::now().datetime(),
                    Clock::Fixed(t) => *t,
                };
                jiff::fmt::strtime::format(fmt.as_str(), now).map_err(|e| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime_now({fmt:?}): {e}"),
                    )
                })
            },
        );
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat_template", source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders the conversation to the prompt text.
    pub fn render(&self, req: &ChatRequest) -> Result<String> {
        let mut ctx = Map::new();
        ctx.insert(
            "messages".into(),
            Json::Array(req.messages.iter().map(alias_reasoning).collect()),
        );
        ctx.insert(
            "tools".into(),
            req.tools
                .as_ref()
                .map_or(Json::Null, |t| Json::Array(t.clone())),
        );
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(req.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        for (k, v) in &req.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self
            .env
            .get_template("chat_template")
            .map_err(template_error)?;
        let mut w = CappedWriter::default();
        let rendered = tmpl.render_captured_to(Value::from(minijinja::value::Serde(&ctx)), &mut w);
        if w.overflowed {
            return Err(Error::Template(format!(
                "the rendered prompt passes {MAX_PROMPT_BYTES} bytes (does the template repeat without end?)"
            )));
        }
        rendered.map_err(template_error)?;
        String::from_utf8(w.out)
            .map_err(|e| Error::Template(format!("the rendered prompt is not UTF-8: {e}")))
    }
}

/// transformers passes a message's reasoning under `reasoning_content` and `thinking`
/// whichever of `reasoning_content`, `thinking`, `reasoning` it came as.
fn alias_reasoning(m: &Json) -> Json {
    let Json::Object(obj) = m else {
        return m.clone();
    };
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()))
        .cloned();
    let Some(r) = reasoning else { return m.clone() };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    // Python's {"thinking": r, **message, "reasoning_content": r}: an existing key keeps its
    // place and takes the later value.
    for (k, v) in obj {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), r);
    Json::Object(out)
}

/// The widest `tojson(indent=...)`: templates use 2 or 4; a huge one would allocate that
/// many spaces per line.
const MAX_INDENT: i64 = 1024;

/// `x | tojson(indent=..., separators=..., sort_keys=..., ensure_ascii=...)` as
/// Python's json.dumps.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let json: Json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut opts = DumpOptions::default();
    if let Some(ind) = kwargs.get::<Option<Value>>("indent")? {
        if let Some(n) = ind.as_i64() {
            if n > MAX_INDENT {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent={n} is past {MAX_INDENT}"),
                ));
            }
            opts.indent = Some(" ".repeat(n.max(0) as usize));
        } else if let Some(s) = ind.as_str() {
            opts.indent = Some(s.to_string());
        }
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [a, b] = seps.as_slice() {
            opts.separators = Some((a.clone(), b.clone()));
        }
    }
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    opts.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(dumps(&json, &opts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_control_matches_transformers() {
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
        let t = ChatTemplate::new(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let out = t
            .render(&ChatRequest::new(&[Message::new("user", "hi")]))
            .unwrap();
        assert_eq!(out, "[hi]\n");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = t.render(&ChatRequest::new(&[])).unwrap_err().to_string();
        assert!(e.contains("no system role"), "{e}");
    }

    #[test]
    fn syntax_errors_name_the_template() {
        let e = ChatTemplate::new("{% if %}", "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("chat template"), "{e}");
    }

    #[test]
    fn python_methods_and_fixed_clock() {
        let when = jiff::civil::date(2025, 3, 7).at(14, 5, 9, 0);
        let t = ChatTemplate::with_clock(
            "{{ messages[0].content.strip().upper() }} {{ strftime_now('%d %b %Y') }} {{ bos_token }}",
            "<s>",
            "",
            Clock::Fixed(when),
        )
        .unwrap();
        let out = t
            .render(&ChatRequest::new(&[Message::new("user", "  hi ")]))
            .unwrap();
        assert_eq!(out, "HI 07 Mar 2025 <s>");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}",
            "",
            "",
        )
        .unwrap();
        let mut req = ChatRequest::new(&[]);
        req.tools = Some(vec![serde_json::json!({"name": "f", "p": [1, 2.5]})]);
        assert_eq!(
            t.render(&req).unwrap(),
            "{\"name\": \"f\", \"p\": [1, 2.5]}|{\n  \"name\": \"f\",\n  \"p\": [\n    1,\n    2.5\n  ]\n}"
        );
    }
}
