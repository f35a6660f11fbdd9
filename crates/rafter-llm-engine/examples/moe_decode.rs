//! Does a mixture-of-experts decode step cost its active parameters or all of them?
//!
//! Writes Qwen3-MoE-shaped checkpoints (random bf16 weights) that differ only in how many of
//! their 16 experts each token uses (2, 4, 8, 16), and a dense model whose MLP has the same
//! active size as top-2, compiles each, and times decode steps. If only the chosen experts
//! are read, decode time follows the active parameters.
//!
//!     cargo run --release -p rafter-llm-engine --example moe_decode -- [DIR] [--threads N]

use std::path::{Path, PathBuf};
use std::time::Instant;

use rafter_generate::LogitsModel;
use rafter_ir::{Dim, Symbol};
use rafter_llm::{build_decoder, DecoderOptions, Logits, ModelSource};
use rafter_llm_engine::SessionModel;
use serde_json::json;

const HIDDEN: usize = 1024;
const LAYERS: usize = 8;
const EXPERTS: usize = 16;
const EXPERT_FFN: usize = 768;
const VOCAB: usize = 2048;
const HEADS: usize = 16;
const KV_HEADS: usize = 4;
const HEAD_DIM: usize = 64;

struct Rng(u64);
impl Rng {
    fn bf16s(&mut self, n: usize, scale: f32) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * 2);
        for _ in 0..n {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let v = ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
        out
    }
}

/// Writes the checkpoint: MoE with `top_k` of [`EXPERTS`], or dense with MLP width `dense`.
fn write_model(dir: &Path, top_k: usize, dense: Option<usize>) {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".into(), vec![HIDDEN]),
        ("lm_head.weight".into(), vec![VOCAB, HIDDEN]),
    ];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        for (n, s) in [
            ("input_layernorm", vec![HIDDEN]),
            ("post_attention_layernorm", vec![HIDDEN]),
            ("self_attn.q_proj", vec![HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.k_proj", vec![KV_HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.v_proj", vec![KV_HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.o_proj", vec![HIDDEN, HEADS * HEAD_DIM]),
            ("self_attn.q_norm", vec![HEAD_DIM]),
            ("self_attn.k_norm", vec![HEAD_DIM]),
        ] {
            tensors.push((format!("{p}.{n}.weight"), s));
        }
        match dense {
            Some(f) => {
                tensors.push((format!("{p}.mlp.gate_proj.weight"), vec![f, HIDDEN]));
                tensors.push((format!("{p}.mlp.up_proj.weight"), vec![f, HIDDEN]));
                tensors.push((format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, f]));
            }
            None => {
                tensors.push((format!("{p}.mlp.gate.weight"), vec![EXPERTS, HIDDEN]));
                for e in 0..EXPERTS {
                    let q = format!("{p}.mlp.experts.{e}");
                    tensors.push((format!("{q}.gate_proj.weight"), vec![EXPERT_FFN, HIDDEN]));
                    tensors.push((format!("{q}.up_proj.weight"), vec![EXPERT_FFN, HIDDEN]));
                    tensors.push((format!("{q}.down_proj.weight"), vec![HIDDEN, EXPERT_FFN]));
                }
            }
        }
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s)| {
            let count = s.iter().product();
            let scale = if n.ends_with("norm.weight") {
                1.0
            } else {
                0.05
            };
            let mut bytes = rng.bf16s(count, scale);
            if n.ends_with("norm.weight") {
                bytes = (0..count)
                    .flat_map(|_| half::bf16::ONE.to_le_bytes())
                    .collect();
            }
            (n, s, bytes)
        })
        .collect();
    let views = data.iter().map(|(n, s, b)| {
        (
            n.clone(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut config = json!({
        "architectures": [if dense.is_some() {"Qwen3ForCausalLM"} else {"Qwen3MoeForCausalLM"}],
        "model_type": if dense.is_some() {"qwen3"} else {"qwen3_moe"},
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "intermediate_size": dense.unwrap_or(EXPERT_FFN), "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "max_position_embeddings": 4096, "tie_word_embeddings": false,
        "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
    });
    if dense.is_none() {
        config["num_experts"] = json!(EXPERTS);
        config["num_experts_per_tok"] = json!(top_k);
        config["moe_intermediate_size"] = json!(EXPERT_FFN);
        config["norm_topk_prob"] = json!(true);
        config["decoder_sparse_step"] = json!(1);
        config["mlp_only_layers"] = json!([]);
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// Median milliseconds of a decode step, after a 16-token prefill.
fn decode_ms(dir: &Path, threads: usize) -> f64 {
    let source = ModelSource::open(dir).unwrap();
    let d = build_decoder(
        &source,
        &DecoderOptions {
            logits: Logits::Last,
            quantize: None,
            kv_type: None,
        },
    )
    .unwrap();
    let n = 256;
    let opts = rafter_compiler::CompileOptions {
        bounds: vec![(Symbol::new("past"), n), (Symbol::new("seq"), n)],
        dim_bounds: vec![(Dim::symbol("past").add(&Dim::symbol("seq")), n)],
        half_compute: rafter_compiler::HalfCompute::AsIs,
        ..Default::default()
    };
    let c = rafter_compiler::compile(&d.graph, &opts).unwrap();
    let devices = rafter_runtime_cpu::devices_with(rafter_runtime_cpu::CpuDeviceOptions {
        worker_threads: threads,
        ..Default::default()
    })
    .unwrap();
    let mut so = rafter_runtime::SessionOptions::new().kernel_threads(threads);
    for (dev, code) in c.executables() {
        so = so.executable(dev, code);
    }
    let session = rafter_runtime::Session::with_options(c.program, &devices, so).unwrap();
    let mut m = SessionModel::new(&session, n as usize);
    let prompt: Vec<u32> = (0..16).map(|i| (i * 97 + 3) % VOCAB as u32).collect();
    m.forward(&prompt).unwrap();
    let mut times = Vec::new();
    let mut t = 5u32;
    for _ in 0..48 {
        let start = Instant::now();
        let logits = m.forward(&[t]).unwrap();
        times.push(start.elapsed().as_secs_f64() * 1e3);
        t = (logits.iter().position(|&x| x.is_finite()).unwrap_or(0) as u32 + t * 31)
            % VOCAB as u32;
    }
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = std::env::temp_dir().join("rafter-moe-decode");
    let mut threads = 2;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => threads = args.next().unwrap().parse().unwrap(),
            other => dir = PathBuf::from(other),
        }
    }
    // Bytes a decode step reads besides the MLPs: attention and the output head.
    let attn = LAYERS * (2 * HEADS * HEAD_DIM * HIDDEN + 2 * KV_HEADS * HEAD_DIM * HIDDEN) * 2;
    let head = VOCAB * HIDDEN * 2;
    let expert = 3 * EXPERT_FFN * HIDDEN * 2;
    println!("model: {LAYERS} layers, hidden {HIDDEN}, {EXPERTS} experts of {EXPERT_FFN}, bf16");
    println!(
        "| variant | MLP weights read per token (MB) | all MLP weights (MB) | decode ms (median) |"
    );
    println!("|---|---|---|---|");
    let mut variants: Vec<(String, usize, Option<usize>)> = [2, 4, 8, 16]
        .iter()
        .map(|&k| (format!("MoE top-{k} of {EXPERTS}"), k, None))
        .collect();
    variants.push(("dense, MLP width 2x768".into(), 0, Some(2 * EXPERT_FFN)));
    for (name, k, dense) in variants {
        let d = dir.join(name.replace([' ', ','], "_"));
        write_model(&d, k, dense);
        let (active, total) = match dense {
            Some(f) => (LAYERS * 3 * f * HIDDEN * 2, LAYERS * 3 * f * HIDDEN * 2),
            None => (LAYERS * k * expert, LAYERS * EXPERTS * expert),
        };
        let ms = decode_ms(&d, threads);
        println!(
            "| {name} | {:.0} | {:.0} | {ms:.2} |",
            active as f64 / 1e6,
            total as f64 / 1e6
        );
        let _ = std::fs::remove_dir_all(&d);
    }
    println!(
        "(attention and head: {:.0} MB per token in every variant)",
        (attn + head) as f64 / 1e6
    );
}
