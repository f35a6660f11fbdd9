//! Test models: real published configs shrunk, HF folders written with the safetensors
//! crate, and GGUFs written the way llama.cpp's converter writes them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rafter_gguf::{Array, GgmlType, GgufWriter};
use safetensors::{Dtype, View};
use serde_json::{json, Value};

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("rafter-llm-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shape of a test model, from which its tensors are made (written independently of
/// the config JSON, whose agreement with it is what the reader checks).
#[derive(Clone, Debug)]
pub struct Dims {
    pub vocab: usize,
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv: usize,
    pub head_dim: usize,
    pub tied: bool,
    pub qk_norm: bool,
    /// Biases on q/k/v (Qwen2, Llama's `attention_bias`) and on o (Llama's).
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub sandwich: bool,
    /// (experts, moe intermediate size, layers that are MoE)
    pub moe: Option<(usize, usize, Vec<usize>)>,
}

/// A tensor as f32 values with its HF name and shape.
#[derive(Clone, Debug)]
pub struct F32Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Deterministic values in [-1, 1) (a 64-bit LCG).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Dims {
    /// The tensors of the HF checkpoint, names as transformers saves them.
    pub fn hf_tensors(&self) -> Vec<F32Tensor> {
        let (h, hd) = (self.hidden, self.head_dim);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("model.embed_tokens.weight".into(), vec![self.vocab, h]),
            ("model.norm.weight".into(), vec![h]),
        ];
        if !self.tied {
            shapes.push(("lm_head.weight".into(), vec![self.vocab, h]));
        }
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut add = |n: &str, s: Vec<usize>| shapes.push((format!("{p}.{n}.weight"), s));
            add("input_layernorm", vec![h]);
            add("self_attn.q_proj", vec![self.heads * hd, h]);
            add("self_attn.k_proj", vec![self.kv * hd, h]);
            add("self_attn.v_proj", vec![self.kv * hd, h]);
            add("self_attn.o_proj", vec![h, self.heads * hd]);
            let mut bias = |n: &str, s: Vec<usize>| shapes.push((format!("{p}.{n}.bias"), s));
            if self.qkv_bias {
                bias("self_attn.q_proj", vec![self.heads * hd]);
                bias("self_attn.k_proj", vec![self.kv * hd]);
                bias("self_attn.v_proj", vec![self.kv * hd]);
            }
            if self.o_bias {
                bias("self_attn.o_proj", vec![h]);
            }
            let mut add = |n: &str, s: Vec<usize>| shapes.push((format!("{p}.{n}.weight"), s));
            if self.qk_norm {
                add("self_attn.q_norm", vec![hd]);
                add("self_attn.k_norm", vec![hd]);
            }
            add("post_attention_layernorm", vec![h]);
            if self.sandwich {
                add("pre_feedforward_layernorm", vec![h]);
                add("post_feedforward_layernorm", vec![h]);
            }
            match &self.moe {
                Some((e, f, moe_layers)) if moe_layers.contains(&i) => {
                    add("mlp.gate", vec![*e, h]);
                    for x in 0..*e {
                        add(&format!("mlp.experts.{x}.gate_proj"), vec![*f, h]);
                        add(&format!("mlp.experts.{x}.up_proj"), vec![*f, h]);
                        add(&format!("mlp.experts.{x}.down_proj"), vec![h, *f]);
                    }
                }
                _ => {
                    add("mlp.gate_proj", vec![self.inter, h]);
                    add("mlp.up_proj", vec![self.inter, h]);
                    add("mlp.down_proj", vec![h, self.inter]);
                }
            }
        }
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let n = shape.iter().product();
                F32Tensor {
                    name,
                    shape,
                    data: values(n, i as u64 + 1),
                }
            })
            .collect()
    }
}

/// Element bytes of `data` in `dtype` (bf16 by truncation, f16 by the half crate's
/// rounding is not needed here: f16 via a simple conversion of small values).
pub fn encode(data: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => data
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        Dtype::F16 => data
            .iter()
            .flat_map(|v| f32_to_f16(*v).to_le_bytes())
            .collect(),
        other => panic!("no encoding for {other:?}"),
    }
}

/// f32 → IEEE half, round toward zero, for values well inside the normal range.
fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if v == 0.0 || exp <= 0 {
        return sign;
    }
    sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

struct Raw<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl View for Raw<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.data.into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `tensors` (name, dtype, shape, bytes) as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views = tensors.iter().map(|(n, d, s, b)| {
        (
            n.clone(),
            Raw {
                dtype: *d,
                shape: s.clone(),
                data: b,
            },
        )
    });
    safetensors::serialize_to_file(views, None, path).unwrap();
}

pub fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// Writes an HF folder: config, generation config, tokenizer config with a chat
/// template, and the tensors in `dtype` as one safetensors file, or `shards` files with
/// an index.
pub fn write_hf_folder(
    dir: &Path,
    config: &Value,
    tensors: &[F32Tensor],
    dtype: Dtype,
    shards: usize,
) {
    write_json(&dir.join("config.json"), config);
    write_json(
        &dir.join("generation_config.json"),
        &json!({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                "transformers_version": "4.51.0"}),
    );
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
                "eos_token": "<eos>"}),
    );
    let encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                dtype,
                t.shape.clone(),
                encode(&t.data, dtype),
            )
        })
        .collect();
    if shards <= 1 {
        write_safetensors(&dir.join("model.safetensors"), &encoded);
        return;
    }
    let per = encoded.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (s, chunk) in encoded.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        write_safetensors(&dir.join(&file), chunk);
        for t in chunk {
            weight_map.insert(t.0.clone(), Value::from(file.clone()));
        }
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": 0}, "weight_map": weight_map}),
    );
}

/// llama.cpp's `LlamaModel.permute` (conversion/llama.py), transcribed: rows of each
/// head reordered so that pair (j, j + d/2) becomes (2j, 2j + 1).
pub fn permute_rows(data: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0.0; data.len()];
    for h in 0..n_head {
        for j in 0..half {
            for t in 0..2 {
                let src = h * hd + t * half + j;
                let dst = h * hd + 2 * j + t;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The GGUF name of an HF tensor name (as gguf-py's tensor map renames them).
pub fn gguf_name(hf: &str, gemma: bool) -> String {
    let (base, kind) = match hf.strip_suffix(".bias") {
        Some(base) => (base, "bias"),
        None => (hf.strip_suffix(".weight").unwrap(), "weight"),
    };
    let top = match base {
        "model.embed_tokens" => Some("token_embd"),
        "model.norm" => Some("output_norm"),
        "lm_head" => Some("output"),
        _ => None,
    };
    if let Some(t) = top {
        return format!("{t}.{kind}");
    }
    let rest = base.strip_prefix("model.layers.").unwrap();
    let (layer, part) = rest.split_once('.').unwrap();
    let g = match part {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{g}.{kind}")
}

/// How the test converter treats the model (what llama.cpp's converter does per arch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Convert {
    Plain,
    /// Llama: permute q/k rows.
    Llama {
        heads: usize,
        kv: usize,
    },
    /// Gemma 3: add 1 to every norm weight.
    Gemma,
}

/// A GGUF of the HF tensors as llama.cpp's converter would write them (f32 tensors, dims
/// reversed, experts stacked), with `metadata`. `quantize` lists tensors written instead
/// as q8_0 blocks (bytes only: the reader does not dequantize).
pub fn write_gguf(
    path: &Path,
    metadata: &[(&str, rafter_gguf::Value)],
    tensors: &[F32Tensor],
    convert: Convert,
    quantize: &[&str],
) {
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.add(k, v.clone()).unwrap();
    }
    let gemma = convert == Convert::Gemma;
    // Stack experts per layer and projection, in expert order.
    let mut stacked: std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> =
        Default::default();
    for t in tensors {
        if let Some((layer, rest)) = t
            .name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once(".mlp.experts."))
        {
            let (_, proj) = rest.split_once('.').unwrap();
            let proj = proj.strip_suffix(".weight").unwrap();
            let gname = format!(
                "blk.{layer}.ffn_{}_exps.weight",
                proj.strip_suffix("_proj").unwrap()
            );
            let e = stacked
                .entry(gname)
                .or_insert((vec![0, t.shape[0], t.shape[1]], Vec::new()));
            e.0[0] += 1;
            e.1.extend_from_slice(&t.data);
            continue;
        }
        let mut data = t.data.clone();
        match convert {
            // conversion/llama.py permutes q/k weights and their biases alike.
            Convert::Llama { heads, .. } if t.name.contains("q_proj.") => {
                let cols = t.shape.get(1).copied().unwrap_or(1);
                data = permute_rows(&data, t.shape[0], cols, heads)
            }
            Convert::Llama { kv, .. } if t.name.contains("k_proj.") => {
                let cols = t.shape.get(1).copied().unwrap_or(1);
                data = permute_rows(&data, t.shape[0], cols, kv)
            }
            Convert::Gemma if t.name.ends_with("norm.weight") => {
                data.iter_mut().for_each(|v| *v += 1.0)
            }
            _ => {}
        }
        let name = gguf_name(&t.name, gemma);
        add_gguf_tensor(
            &mut w,
            &name,
            &t.shape,
            &data,
            quantize.contains(&name.as_str()),
        );
    }
    for (name, (shape, data)) in stacked {
        add_gguf_tensor(
            &mut w,
            &name,
            &shape,
            &data,
            quantize.contains(&name.as_str()),
        );
    }
    w.write_file(path).unwrap();
}

fn add_gguf_tensor(w: &mut GgufWriter, name: &str, shape: &[usize], data: &[f32], q8: bool) {
    let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    if q8 {
        let n = GgmlType::Q8_0.bytes_for(data.len() as u64).unwrap() as usize;
        w.add_tensor(name, &dims, GgmlType::Q8_0, vec![7u8; n])
            .unwrap();
    } else {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor(name, &dims, GgmlType::F32, bytes).unwrap();
    }
}

/// Metadata helpers.
pub fn u32v(v: u32) -> rafter_gguf::Value {
    rafter_gguf::Value::U32(v)
}
pub fn f32v(v: f32) -> rafter_gguf::Value {
    rafter_gguf::Value::F32(v)
}
pub fn strv(v: &str) -> rafter_gguf::Value {
    rafter_gguf::Value::String(v.into())
}
pub fn tokens_array(n: usize) -> rafter_gguf::Value {
    let tokens: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    rafter_gguf::Value::Array(Array::from_strings(&tokens))
}

/// f32 values of a weight's bytes (F32 only).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Real published config.json files, shrunk: the fields and their spellings are those of
// the files on the Hub (transformers 4.x writers); sizes are small. Each comes with the
// Dims its tensors have.

/// Qwen/Qwen3-0.6B: tied embeddings, head_dim (128) ≠ hidden / heads, q/k norms.
pub fn qwen3_0_6b() -> (Value, Dims) {
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 192,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "sliding_window": null,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 192,
        layers: 2,
        heads: 4,
        kv: 2,
        head_dim: 32,
        tied: true,
        qk_norm: true,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// Qwen/Qwen3-30B-A3B: 128 experts top-8 (shrunk to 4 top-2), untied.
pub fn qwen3_30b_a3b() -> (Value, Dims) {
    let config = json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 32,
        "norm_topk_prob": true,
        "num_attention_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "output_router_logits": false,
        "rms_norm_eps": 1e-06,
        "rope_scaling": null,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 96,
        layers: 2,
        heads: 4,
        kv: 1,
        head_dim: 32,
        tied: false,
        qk_norm: true,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: Some((4, 32, vec![0, 1])),
    };
    (config, dims)
}

/// meta-llama/Llama-3.2-1B: llama3 rope scaling, tied, head_dim 64.
pub fn llama_3_2_1b() -> (Value, Dims) {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 131072,
        "mlp_bias": false,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3"
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 128,
        layers: 2,
        heads: 4,
        kv: 1,
        head_dim: 16,
        tied: true,
        qk_norm: false,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// Qwen/Qwen2.5-0.5B: q/k/v biases, no head_dim field (896 / 14 = 64; here 112 / 14 =
/// 8), 14 heads / 2 KV heads, tied, a `sliding_window` that `use_sliding_window: false`
/// leaves unused.
pub fn qwen2_5_0_5b() -> (Value, Dims) {
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 112,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 32768,
        "max_window_layers": 2,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 112,
        inter: 64,
        layers: 2,
        heads: 14,
        kv: 2,
        head_dim: 8,
        tied: true,
        qk_norm: false,
        qkv_bias: true,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// mistralai/Mistral-7B-v0.1: Llama's blocks with a 4096-token sliding window on every
/// layer, untied. (v0.2 and later write `"sliding_window": null`.)
pub fn mistral_7b_v0_1() -> (Value, Dims) {
    let config = json!({
        "architectures": ["MistralForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 128,
        layers: 2,
        heads: 4,
        kv: 1,
        head_dim: 16,
        tied: false,
        qk_norm: false,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// HuggingFaceTB/SmolLM2-135M: no head_dim field (576 / 9 = 64), 9 heads / 3 KV heads.
pub fn smollm2_135m() -> (Value, Dims) {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": 72,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 128,
        "is_llama_config": true,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_hidden_layers": 2,
        "num_key_value_heads": 3,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": false,
        "rope_scaling": null,
        "rope_theta": 100000,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 72,
        inter: 128,
        layers: 2,
        heads: 9,
        kv: 3,
        head_dim: 8,
        tied: true,
        qk_norm: false,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// TinyLlama/TinyLlama-1.1B-Chat-v1.0: untied lm_head, 32 heads / 4 KV heads.
pub fn tinyllama() -> (Value, Dims) {
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 176,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": 8,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": null,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.35.0",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 176,
        layers: 2,
        heads: 8,
        kv: 1,
        head_dim: 8,
        tied: false,
        qk_norm: false,
        qkv_bias: false,
        o_bias: false,
        sandwich: false,
        moe: None,
    };
    (config, dims)
}

/// google/gemma-3-1b-it: sliding_window_pattern 6, rope_local_base_freq, eos [1, 106],
/// tie_word_embeddings absent (defaults to true).
pub fn gemma3_1b_it() -> (Value, Dims) {
    let config = json!({
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": null,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": [1, 106],
        "final_logit_softcapping": null,
        "head_dim": 32,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 32768,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 7,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "sliding_window": 8,
        "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 128,
        layers: 7,
        heads: 4,
        kv: 1,
        head_dim: 32,
        tied: true,
        qk_norm: true,
        qkv_bias: false,
        o_bias: false,
        sandwich: true,
        moe: None,
    };
    (config, dims)
}

/// google/gemma-2-2b-it: a 4096-token window on even layers, attention scores capped at
/// 50 and logits at 30, query_pre_attn_scalar = head_dim, sandwich (1 + w) norms, no q/k
/// norms, tied.
pub fn gemma2_2b_it() -> (Value, Dims) {
    let config = json!({
        "architectures": ["Gemma2ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": [1, 107],
        "final_logit_softcapping": 30.0,
        "head_dim": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 16,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "sliding_window": 8,
        "torch_dtype": "float32",
        "transformers_version": "4.42.4",
        "use_cache": true,
        "vocab_size": 256
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 128,
        layers: 3,
        heads: 4,
        kv: 2,
        head_dim: 16,
        tied: true,
        qk_norm: false,
        qkv_bias: false,
        o_bias: false,
        sandwich: true,
        moe: None,
    };
    (config, dims)
}

/// google/gemma-3-4b-it as transformers 5 writes it: Gemma3ForConditionalGeneration with
/// the text model under text_config, rope_parameters per layer type (linear factor 8 on
/// full attention), layer_types, final_logit_softcapping set (as Gemma 2 had it, to
/// exercise it).
pub fn gemma3_4b_it_v5() -> (Value, Dims) {
    let layer_types: Vec<&str> = (0..6)
        .map(|i| {
            if (i + 1) % 3 == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    let config = json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": [1, 106],
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {
            "_sliding_window_pattern": 3,
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": null,
            "final_logit_softcapping": 30.0,
            "head_dim": 16,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 64,
            "intermediate_size": 128,
            "layer_types": layer_types,
            "max_position_embeddings": 131072,
            "model_type": "gemma3_text",
            "num_attention_heads": 8,
            "num_hidden_layers": 6,
            "num_key_value_heads": 4,
            "query_pre_attn_scalar": 16,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
            },
            "sliding_window": 16,
            "vocab_size": 256
        },
        "tie_word_embeddings": true,
        "transformers_version": "5.23.0",
        "vision_config": {"hidden_size": 32, "model_type": "siglip_vision_model"}
    });
    let dims = Dims {
        vocab: 256,
        hidden: 64,
        inter: 128,
        layers: 6,
        heads: 8,
        kv: 4,
        head_dim: 16,
        tied: true,
        qk_norm: true,
        qkv_bias: false,
        o_bias: false,
        sandwich: true,
        moe: None,
    };
    (config, dims)
}

// ---------------------------------------------------------------------------------------
// Comparing a model read from HF with the same model read from GGUF.

use rafter_llm::source::RopePairing;
use rafter_llm::spec::ModelSpec;
use rafter_llm::ModelSource;

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= a.abs().max(b.abs()) * 1e-6
}

/// The architecture-level fields agree (GGUF stores floats as f32, hence `close`).
pub fn assert_same_architecture(hf: &ModelSpec, gguf: &ModelSpec) {
    assert_eq!(hf.architecture, gguf.architecture);
    assert_eq!(
        (
            hf.vocab_size,
            hf.hidden_size,
            hf.num_layers,
            hf.num_heads,
            hf.num_kv_heads,
            hf.head_dim
        ),
        (
            gguf.vocab_size,
            gguf.hidden_size,
            gguf.num_layers,
            gguf.num_heads,
            gguf.num_kv_heads,
            gguf.head_dim
        )
    );
    if hf.moe.is_none() {
        assert_eq!(hf.intermediate_size, gguf.intermediate_size);
    }
    assert!(
        close(hf.rms_norm_eps, gguf.rms_norm_eps),
        "{} vs {}",
        hf.rms_norm_eps,
        gguf.rms_norm_eps
    );
    assert!(close(hf.rope.theta, gguf.rope.theta));
    for (a, b) in hf
        .rope
        .inv_freq(hf.head_dim)
        .iter()
        .zip(gguf.rope.inv_freq(gguf.head_dim))
    {
        assert!(close(*a, b), "inv_freq {a} vs {b}");
    }
    assert_eq!(hf.max_position_embeddings, gguf.max_position_embeddings);
    assert_eq!(hf.tie_word_embeddings, gguf.tie_word_embeddings);
    assert_eq!(
        (hf.qk_norm, hf.sandwich_norms, hf.activation),
        (gguf.qk_norm, gguf.sandwich_norms, gguf.activation)
    );
    assert_eq!((hf.qkv_bias, hf.o_bias), (gguf.qkv_bias, gguf.o_bias));
    assert_eq!(hf.layers, gguf.layers);
    assert_eq!(hf.moe, gguf.moe);
    assert_eq!(hf.sliding_window, gguf.sliding_window);
    assert!(close(hf.attention_scale, gguf.attention_scale));
    assert_eq!(hf.final_logit_softcapping, gguf.final_logit_softcapping);
    assert_eq!(hf.embedding_scale, gguf.embedding_scale);
}

/// Rotates `x` (one head) at position `pos` with `inv_freq`, pairing as `pairing` says.
pub fn rope(x: &[f64], pos: f64, inv_freq: &[f64], pairing: RopePairing) -> Vec<f64> {
    let d = x.len();
    let mut out = x.to_vec();
    for (j, f) in inv_freq.iter().enumerate() {
        let (a, b) = match pairing {
            RopePairing::Halves => (j, j + d / 2),
            RopePairing::Interleaved => (2 * j, 2 * j + 1),
        };
        let (s, c) = (pos * f).sin_cos();
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[a] * s + x[b] * c;
    }
    out
}

/// `W x` for a row-major f32 weight of `rows` rows.
pub fn matvec(w: &[f32], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    (0..rows)
        .map(|r| (0..cols).map(|c| f64::from(w[r * cols + c]) * x[c]).sum())
        .collect()
}

/// Attention scores q(head h, pos 7) · k(kv head, pos 3) for every head, from a model's
/// q/k weights and its rope pairing.
pub fn scores(m: &ModelSource, x: &[f64]) -> Vec<f64> {
    let s = &m.spec;
    // `W x + b`, with the bias when the model has one.
    let biased = |mut y: Vec<f64>, proj: &str| {
        if let Some(b) = m
            .weights
            .get(&format!("model.layers.0.self_attn.{proj}.bias"))
        {
            y.iter_mut()
                .zip(f32s(&b.bytes))
                .for_each(|(v, b)| *v += f64::from(b));
        }
        y
    };
    let q = matvec(
        &f32s(
            &m.weights
                .get("model.layers.0.self_attn.q_proj.weight")
                .unwrap()
                .bytes,
        ),
        x,
        s.num_heads * s.head_dim,
    );
    let q = biased(q, "q_proj");
    let k = matvec(
        &f32s(
            &m.weights
                .get("model.layers.0.self_attn.k_proj.weight")
                .unwrap()
                .bytes,
        ),
        x,
        s.num_kv_heads * s.head_dim,
    );
    let k = biased(k, "k_proj");
    let inv = s.rope.inv_freq(s.head_dim);
    let hd = s.head_dim;
    (0..s.num_heads)
        .map(|h| {
            let kv = h / s.gqa_group();
            let qh = rope(
                &q[h * hd..(h + 1) * hd],
                7.0,
                &inv,
                m.conventions.rope_pairing,
            );
            let kh = rope(
                &k[kv * hd..(kv + 1) * hd],
                3.0,
                &inv,
                m.conventions.rope_pairing,
            );
            qh.iter().zip(&kh).map(|(a, b)| a * b).sum()
        })
        .collect()
}
