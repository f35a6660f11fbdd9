//! Generates until the context is full, prompt after prompt, and prints the resident memory
//! after each: it must stay flat (KV caches and buffers are allocated once per session).
//!
//!     cargo run --release -p rafter-llm-engine --example long_run -- MODEL [CONTEXT] [PROMPTS]

use std::ops::ControlFlow;

use rafter_generate::{GenerateParams, SamplerConfig};
use rafter_llm_engine::{Llm, LlmOptions};

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .expect("MODEL (an HF folder, a .gguf or an .rfa)");
    let context: usize = args.next().map_or(2048, |c| c.parse().unwrap());
    let prompts: usize = args.next().map_or(5, |c| c.parse().unwrap());
    let llm = Llm::open(
        &model,
        &LlmOptions {
            context: Some(context),
            ..Default::default()
        },
    )
    .unwrap();
    let texts = [
        "Once upon a time",
        "The history of the printing press",
        "def fibonacci(n):",
        "In a hole in the ground there lived",
        "Die Geschichte der Stadt",
    ];
    let mut total = 0;
    let start = std::time::Instant::now();
    println!("| prompt | tokens | RSS MB | peak RSS MB |");
    println!("|---|---|---|---|");
    for i in 0..prompts {
        let ids = llm
            .tokenizer()
            .encode(texts[i % texts.len()], true)
            .unwrap();
        let mut params = GenerateParams::new(llm.tokenizer(), context);
        params.stop_token_ids.clear();
        params.sampler = SamplerConfig {
            seed: i as u64,
            ..SamplerConfig::default()
        };
        let g = llm
            .generate(&ids, &params, |_| ControlFlow::Continue(()))
            .unwrap();
        let n = g.prompt_ids.len() + g.generated_ids.len();
        total += n;
        println!(
            "| {i} | {n} | {:.1} | {:.1} |",
            rss_kib("VmRSS") as f64 / 1024.0,
            rss_kib("VmHWM") as f64 / 1024.0
        );
    }
    println!(
        "{total} tokens in {:.1} s; context {context}",
        start.elapsed().as_secs_f64()
    );
}
