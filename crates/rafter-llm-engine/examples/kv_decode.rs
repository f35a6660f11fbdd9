//! Prefill and greedy decode timings and peak RSS of one model with a chosen KV cache type
//! (f16 or f32), for comparing the two on the same machine (alternate runs, take medians).
//!
//!     cargo run --release -p rafter-llm-engine --example kv_decode -- \
//!         MODEL.gguf f16|f32 PROMPT_IDS_FILE [NEW_TOKENS] [THREADS]
//!
//! PROMPT_IDS_FILE holds token ids, one per line (`seq 1001 1128 > p128.txt`). The context
//! is sized to the prompt plus the new tokens. Prints one line:
//! `kv TYPE prompt P at X tok/s, N tokens at Y tok/s, peak RSS R MB`.

use std::time::Instant;

use rafter_generate::LogitsModel;
use rafter_llm_engine::{KvType, Llm, LlmOptions, SessionModel};

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    kib as f64 / 1024.0
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: kv_decode MODEL f16|f32 PROMPT_IDS_FILE [NEW_TOKENS] [THREADS]");
        std::process::exit(2);
    }
    let kv = KvType::from_word(&args[1]).expect("kv type: f16 or f32");
    let prompt: Vec<u32> = std::fs::read_to_string(&args[2])
        .expect("prompt ids file")
        .split_whitespace()
        .map(|t| t.parse().expect("a token id"))
        .collect();
    let n: usize = args.get(3).map_or(128, |s| s.parse().unwrap());
    let threads: usize = args.get(4).map_or(2, |s| s.parse().unwrap());
    let llm = Llm::open(
        &args[0],
        &LlmOptions {
            context: Some(prompt.len() + n),
            threads,
            kv_type: Some(kv),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    let mut m = SessionModel::new(llm.session(), llm.context());
    m.reset();
    let t0 = Instant::now();
    let mut next = argmax(m.forward(&prompt).unwrap());
    let prefill = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 1..n {
        next = argmax(m.forward(&[next]).unwrap());
    }
    let decode = t1.elapsed().as_secs_f64();
    println!(
        "kv {kv} prompt {} at {:.1} tok/s, {} tokens at {:.2} tok/s, peak RSS {:.0} MB",
        prompt.len(),
        prompt.len() as f64 / prefill,
        n - 1,
        (n - 1) as f64 / decode,
        peak_rss_mb()
    );
}
