//! Time to build each tokenizer the fixture script made, from its HF folder and from its
//! GGUF vocabulary dump, and to encode the multilingual texts.
//!
//!     python3 scripts/gen_tokenizer_fixtures.py
//!     cargo run -p rafter-generate --release --example tokenizer_load

use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/llm-tokenizers");
    for name in ["qwen2", "llama-bpe", "llama-spm", "gpt-2", "gemma3"] {
        let t = Instant::now();
        let hf = rafter_generate::Tokenizer::from_hf_dir(dir.join(name).join("hf"))
            .expect("run scripts/gen_tokenizer_fixtures.py");
        let t_hf = t.elapsed();
        let t = Instant::now();
        let text = std::fs::read_to_string(dir.join(name).join("vocab.json")).unwrap();
        let vocab: rafter_generate::GgufVocab = serde_json::from_str(&text).unwrap();
        let t_json = t.elapsed();
        let t = Instant::now();
        let gg = rafter_generate::Tokenizer::from_gguf_vocab(&vocab).unwrap();
        let t_gguf = t.elapsed();
        let sample =
            "The quick brown fox jumps over the lazy dog. 日本語のテキスト 🦙 fn main() {}\n"
                .repeat(200);
        let t = Instant::now();
        let n = gg.encode(&sample, false).unwrap().len();
        let t_enc = t.elapsed();
        assert!(hf.vocab_size() > 0);
        let ids = gg.encode(&sample, false).unwrap();
        let t = Instant::now();
        let mut dec = gg.stream_decoder(true);
        let mut streamed = 0;
        for &id in &ids {
            streamed += dec.push(id).unwrap().map_or(0, |p| p.len());
        }
        let t_stream = t.elapsed();
        println!(
            "{name:<10} stream-decode {} tokens ({streamed} bytes): {:.1} us/token",
            ids.len(),
            t_stream.as_secs_f64() * 1e6 / ids.len() as f64
        );
        println!(
            "{name:<10} vocab {:>6}: HF folder {:>6.0} ms, GGUF vocab {:>6.0} ms (+ {:>4.0} ms reading the JSON dump); encode {} tokens in {:.1} ms",
            gg.vocab_size(),
            t_hf.as_secs_f64() * 1e3,
            t_gguf.as_secs_f64() * 1e3,
            t_json.as_secs_f64() * 1e3,
            n,
            t_enc.as_secs_f64() * 1e3
        );
    }
}
