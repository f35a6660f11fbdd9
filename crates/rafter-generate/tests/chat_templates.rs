//! Real chat templates (llama.cpp's models/templates/ in the llama-cpp-python sdist, and the
//! one embedded in the qwen2 vocabulary GGUF) against transformers' rendering of the same
//! conversations (tests/data/chat_templates.json, made by scripts/gen_tokenizer_fixtures.py
//! at a fixed clock).

mod common;

use rafter_generate::{ChatRequest, ChatTemplate, Clock};

#[test]
fn templates_render_as_transformers_does() {
    let refs = common::data("chat_templates.json");
    let now: Vec<i64> = refs["now"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    let clock = Clock::Fixed(
        jiff::civil::date(now[0] as i16, now[1] as i8, now[2] as i8).at(
            now[3] as i8,
            now[4] as i8,
            now[5] as i8,
            0,
        ),
    );
    let mut failures = Vec::new();
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 25, "only {} cases", cases.len());
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let label = format!("{name}/{}", case["case"].as_str().unwrap());
        let source = refs["templates"][name].as_str().unwrap();
        let tmpl = ChatTemplate::with_clock(
            source,
            case["bos_token"].as_str().unwrap(),
            case["eos_token"].as_str().unwrap(),
            clock.clone(),
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        let mut extra = case["extra"].as_object().unwrap().clone();
        let tools = extra.remove("tools").map(|t| t.as_array().unwrap().clone());
        let req = ChatRequest {
            messages: case["messages"].as_array().unwrap().clone(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools,
            extra,
        };
        let got = tmpl.render(&req);
        match (&case["expected"], got) {
            (serde_json::Value::String(want), Ok(got)) if *want == got => {}
            (serde_json::Value::String(want), Ok(got)) => {
                failures.push(format!("{label}:\n--- want\n{want}\n--- got\n{got}"))
            }
            (serde_json::Value::String(_), Err(e)) => failures.push(format!("{label}: {e}")),
            (_, Ok(got)) => failures.push(format!(
                "{label}: transformers raised {:?}, we rendered {got:?}",
                case["error"]
            )),
            (_, Err(e)) => {
                let want = case["error"].as_str().unwrap();
                if !e.to_string().contains(want) {
                    failures.push(format!("{label}: error {e} does not carry {want:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
