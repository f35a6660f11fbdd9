//! The fuzz targets' committed seeds (fuzz/seeds/read_gguf_model, read_safetensors):
//! `write_fuzz_seeds` (ignored; run with `--ignored`) regenerates them, and
//! `fuzz_seeds_are_valid` checks they still read, so mutations start from valid models.

mod common;

use std::path::PathBuf;

use common::*;
use safetensors::Dtype;

fn seeds(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

fn tiny(moe: bool, qk_norm: bool, sandwich: bool) -> Dims {
    Dims {
        vocab: 8,
        hidden: 8,
        inter: 16,
        layers: if sandwich { 2 } else { 1 },
        heads: 2,
        kv: 1,
        head_dim: 4,
        tied: !moe,
        qk_norm,
        qkv_bias: false,
        o_bias: false,
        sandwich,
        moe: moe.then(|| (2, 4, vec![0])),
    }
}

fn meta(arch: &str, d: &Dims) -> Vec<(&'static str, rafter_gguf::Value)> {
    let k = |s: &str| -> &'static str { Box::leak(format!("{arch}.{s}").into_boxed_str()) };
    let mut m = vec![
        ("general.architecture", strv(arch)),
        (k("block_count"), u32v(d.layers as u32)),
        (k("context_length"), u32v(64)),
        (k("embedding_length"), u32v(d.hidden as u32)),
        (k("feed_forward_length"), u32v(d.inter as u32)),
        (k("attention.head_count"), u32v(d.heads as u32)),
        (k("attention.head_count_kv"), u32v(d.kv as u32)),
        (k("attention.key_length"), u32v(d.head_dim as u32)),
        (k("attention.layer_norm_rms_epsilon"), f32v(1e-6)),
        (k("rope.freq_base"), f32v(10000.0)),
        ("tokenizer.ggml.tokens", tokens_array(d.vocab)),
        ("tokenizer.ggml.eos_token_id", u32v(1)),
    ];
    if arch == "qwen3moe" {
        m.push((k("expert_count"), u32v(2)));
        m.push((k("expert_used_count"), u32v(1)));
        m.push((k("expert_feed_forward_length"), u32v(4)));
    }
    if arch == "gemma3" {
        m.push((k("attention.sliding_window"), u32v(4)));
        m.push((k("attention.sliding_window_pattern"), u32v(2)));
        m.push((k("rope.scaling.type"), strv("linear")));
        m.push((k("rope.scaling.factor"), f32v(8.0)));
    }
    m
}

#[test]
#[ignore = "writes the committed seeds; run explicitly to regenerate them"]
fn write_fuzz_seeds() {
    let dir = seeds("read_gguf_model");
    std::fs::create_dir_all(&dir).unwrap();
    let models = [
        ("qwen3moe", tiny(true, true, false), Convert::Plain),
        (
            "llama",
            tiny(false, false, false),
            Convert::Llama { heads: 2, kv: 1 },
        ),
        ("gemma3", tiny(false, true, true), Convert::Gemma),
    ];
    for (arch, d, convert) in models {
        write_gguf(
            &dir.join(format!("{arch}.gguf")),
            &meta(arch, &d),
            &d.hf_tensors(),
            convert,
            &[],
        );
    }
    let dir = seeds("read_safetensors");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, dtype) in [("f32", Dtype::F32), ("bf16", Dtype::BF16)] {
        let t: Vec<_> = tiny(false, true, false)
            .hf_tensors()
            .into_iter()
            .take(4)
            .map(|t| (t.name, dtype, t.shape, encode(&t.data, dtype)))
            .collect();
        write_safetensors(&dir.join(format!("{name}.safetensors")), &t);
    }
}

#[test]
fn fuzz_seeds_are_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(seeds("read_gguf_model")).unwrap() {
        let path = entry.unwrap().path();
        rafter_llm::ModelSource::open(&path).unwrap_or_else(|e| panic!("{e}"));
        n += 1;
    }
    for entry in std::fs::read_dir(seeds("read_safetensors")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = bytes::Bytes::from(std::fs::read(&path).unwrap());
        let views = rafter_llm::source::read_safetensors(&bytes, &path).unwrap();
        assert!(views.iter().all(|(_, v)| v.is_ok()));
        n += 1;
    }
    assert_eq!(n, 5);
}
