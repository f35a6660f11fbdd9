//! Bad models give errors naming the file and the field or tensor: one test each.

mod common;

use common::*;
use rafter_gguf::{GgmlType, Value};
use rafter_llm::{ModelSource, TensorMemory};
use safetensors::Dtype;
use serde_json::json;

/// The error message for opening `path`, which must fail the same way with its weights
/// mapped and read into memory (the LLM engine's default).
#[track_caller]
fn err(path: &std::path::Path) -> String {
    let msgs = [TensorMemory::Mapped, TensorMemory::Resident].map(|memory| {
        match ModelSource::open_with(path, memory) {
            Ok(_) => panic!("{} opened ({memory:?})", path.display()),
            Err(e) => e.to_string(),
        }
    });
    assert_eq!(msgs[0], msgs[1], "mapped vs resident");
    msgs[0].clone()
}

#[track_caller]
fn contains_all(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "expected {p:?} in: {msg}");
    }
}

fn hf(name: &str, config: &serde_json::Value, d: &Dims) -> TempDir {
    let dir = TempDir::new(name);
    write_hf_folder(dir.path(), config, &d.hf_tensors(), Dtype::F32, 1);
    dir
}

fn gguf_meta(arch: &str, d: &Dims) -> Vec<(&'static str, Value)> {
    let k = |s: &str| -> &'static str { Box::leak(format!("{arch}.{s}").into_boxed_str()) };
    vec![
        ("general.architecture", strv(arch)),
        (k("block_count"), u32v(d.layers as u32)),
        (k("context_length"), u32v(4096)),
        (k("embedding_length"), u32v(d.hidden as u32)),
        (k("feed_forward_length"), u32v(d.inter as u32)),
        (k("attention.head_count"), u32v(d.heads as u32)),
        (k("attention.head_count_kv"), u32v(d.kv as u32)),
        (k("attention.key_length"), u32v(d.head_dim as u32)),
        (k("attention.layer_norm_rms_epsilon"), f32v(1e-6)),
        ("tokenizer.ggml.tokens", tokens_array(d.vocab)),
    ]
}

#[test]
fn unknown_architecture_hf() {
    let (mut config, d) = qwen3_0_6b();
    config["architectures"] = json!(["Phi3ForCausalLM"]);
    config["model_type"] = json!("phi3");
    let dir = hf("unknown-hf", &config, &d);
    let msg = err(dir.path());
    contains_all(
        &msg,
        &[
            "config.json",
            "unknown architecture 'Phi3ForCausalLM'",
            "Qwen3ForCausalLM",
            "Gemma3ForConditionalGeneration",
            "GGUF qwen2, qwen3, qwen3moe, llama, gemma2, gemma3",
        ],
    );
}

#[test]
fn unknown_architecture_gguf() {
    let (_, d) = qwen3_0_6b();
    let dir = TempDir::new("unknown-gguf");
    let path = dir.join("phi.gguf");
    write_gguf(
        &path,
        &gguf_meta("phi3", &d),
        &d.hf_tensors(),
        Convert::Plain,
        &[],
    );
    contains_all(
        &err(&path),
        &["phi.gguf", "unknown architecture 'phi3'", "supported"],
    );
}

#[test]
fn missing_tensor_hf() {
    let (config, d) = qwen3_0_6b();
    let dir = TempDir::new("missing-hf");
    let t: Vec<_> = d
        .hf_tensors()
        .into_iter()
        .filter(|t| t.name != "model.layers.1.self_attn.k_proj.weight")
        .collect();
    write_hf_folder(dir.path(), &config, &t, Dtype::F32, 1);
    contains_all(
        &err(dir.path()),
        &[
            "missing tensor 'model.layers.1.self_attn.k_proj.weight'",
            "safetensors",
            "missing-hf",
        ],
    );
}

#[test]
fn missing_tensor_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("missing-gguf");
    let path = dir.join("m.gguf");
    let t: Vec<_> = d
        .hf_tensors()
        .into_iter()
        .filter(|t| t.name != "model.layers.1.mlp.up_proj.weight")
        .collect();
    write_gguf(&path, &gguf_meta("llama", &d), &t, Convert::Plain, &[]);
    contains_all(
        &err(&path),
        &[
            "missing tensor 'model.layers.1.mlp.up_proj.weight'",
            "GGUF tensor 'blk.1.ffn_up.weight'",
            "m.gguf",
        ],
    );
}

#[test]
fn shape_disagrees_with_config_hf() {
    let (mut config, d) = qwen3_0_6b();
    config["intermediate_size"] = json!(190);
    let dir = hf("shape-hf", &config, &d);
    contains_all(
        &err(dir.path()),
        &[
            "tensor 'model.layers.0.mlp.gate_proj.weight'",
            "has shape [192, 64], but the config implies [190, 64]",
            "model.safetensors",
        ],
    );
}

#[test]
fn shape_disagrees_with_config_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("shape-gguf");
    let path = dir.join("m.gguf");
    let mut meta = gguf_meta("llama", &d);
    meta.retain(|(k, _)| *k != "llama.attention.head_count_kv");
    meta.push(("llama.attention.head_count_kv", u32v(2)));
    write_gguf(&path, &meta, &d.hf_tensors(), Convert::Plain, &[]);
    contains_all(
        &err(&path),
        &[
            "tensor 'model.layers.0.self_attn.k_proj.weight' (blk.0.attn_k.weight in",
            "m.gguf",
            "has shape [8, 64], but the config implies [16, 64]",
        ],
    );
}

#[test]
fn unsupported_dtype_hf() {
    let (config, d) = qwen3_0_6b();
    let dir = TempDir::new("dtype-hf");
    write_json(&dir.join("config.json"), &config);
    let mut t: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = d
        .hf_tensors()
        .into_iter()
        .map(|t| (t.name, Dtype::F32, t.shape, encode(&t.data, Dtype::F32)))
        .collect();
    let v = t
        .iter_mut()
        .find(|t| t.0 == "model.layers.0.self_attn.v_proj.weight")
        .unwrap();
    v.1 = Dtype::F64;
    v.3 = vec![0; v.3.len() * 2];
    write_safetensors(&dir.join("model.safetensors"), &t);
    contains_all(
        &err(dir.path()),
        &[
            "tensor 'model.layers.0.self_attn.v_proj.weight'",
            "model.safetensors",
            "dtype F64",
            "supported: F32, F16, BF16, q8_0",
        ],
    );
}

#[test]
fn unsupported_dtype_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("dtype-gguf");
    let path = dir.join("m.gguf");
    let mut w = rafter_gguf::GgufWriter::new();
    for (k, v) in gguf_meta("llama", &d) {
        w.add(k, v).unwrap();
    }
    let tmp = dir.join("t.gguf");
    write_gguf(&tmp, &[], &d.hf_tensors(), Convert::Plain, &[]);
    let t = rafter_gguf::GgufFile::open(&tmp).unwrap();
    for info in t.tensors() {
        if info.name() == "blk.0.ffn_down.weight" {
            // [64, 176]: rows of 176 are not q3_K blocks; use a 256-multiple stand-in.
            continue;
        }
        w.add_tensor(
            info.name(),
            info.dims(),
            info.ggml_type(),
            t.tensor_data(info),
        )
        .unwrap();
    }
    let n = GgmlType::IQ4_XS.bytes_for(256 * 64).unwrap() as usize;
    w.add_tensor(
        "blk.0.ffn_down.weight",
        &[256, 64],
        GgmlType::IQ4_XS,
        vec![0u8; n],
    )
    .unwrap();
    w.write_file(&path).unwrap();
    contains_all(
        &err(&path),
        &[
            "tensor 'blk.0.ffn_down.weight'",
            "m.gguf",
            "dtype iq4_xs, which rafter cannot compute",
        ],
    );
}

#[test]
fn truncated_safetensors() {
    let (config, d) = qwen3_0_6b();
    let dir = hf("trunc-st", &config, &d);
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    contains_all(
        &err(dir.path()),
        &["model.safetensors: not a valid safetensors file"],
    );
    std::fs::write(&p, &bytes[..5]).unwrap();
    contains_all(
        &err(dir.path()),
        &["model.safetensors: not a valid safetensors file"],
    );
}

#[test]
fn corrupt_safetensors_header() {
    let (config, d) = qwen3_0_6b();
    let dir = hf("corrupt-st", &config, &d);
    let p = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[9] = b'#'; // inside the JSON header
    std::fs::write(&p, &bytes).unwrap();
    contains_all(
        &err(dir.path()),
        &["model.safetensors: not a valid safetensors file"],
    );
}

#[test]
fn truncated_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("trunc-gguf");
    let path = dir.join("m.gguf");
    write_gguf(
        &path,
        &gguf_meta("llama", &d),
        &d.hf_tensors(),
        Convert::Plain,
        &[],
    );
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    contains_all(
        &err(&path),
        &["m.gguf: at byte", "lie past the end of the file"],
    );
}

#[test]
fn gguf_unknown_tensor_type() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("type-gguf");
    let path = dir.join("m.gguf");
    write_gguf(
        &path,
        &gguf_meta("llama", &d),
        &d.hf_tensors(),
        Convert::Plain,
        &[],
    );
    let mut bytes = std::fs::read(&path).unwrap();
    // The type field of the first tensor info follows its name and dims.
    let file = rafter_gguf::GgufFile::open(&path).unwrap();
    let t = &file.tensors()[0];
    let type_at =
        (t.info_offset() + 8 + t.name().len() as u64 + 4 + 8 * t.dims().len() as u64) as usize;
    bytes[type_at..type_at + 4].copy_from_slice(&77u32.to_le_bytes());
    drop(file);
    std::fs::write(&path, &bytes).unwrap();
    contains_all(&err(&path), &["m.gguf: at byte", "unknown ggml type id 77"]);
}

#[test]
fn missing_config_field_hf() {
    let (mut config, d) = qwen3_0_6b();
    config.as_object_mut().unwrap().remove("hidden_size");
    let dir = hf("field-hf", &config, &d);
    contains_all(
        &err(dir.path()),
        &["config.json: missing field 'hidden_size' (needed for Qwen3)"],
    );
}

#[test]
fn missing_config_field_moe() {
    let (mut config, d) = qwen3_30b_a3b();
    config.as_object_mut().unwrap().remove("num_experts");
    let dir = hf("field-moe", &config, &d);
    contains_all(
        &err(dir.path()),
        &["missing field 'num_experts' (or 'num_local_experts')"],
    );
}

#[test]
fn missing_metadata_key_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("field-gguf");
    let path = dir.join("m.gguf");
    let meta: Vec<_> = gguf_meta("llama", &d)
        .into_iter()
        .filter(|(k, _)| *k != "llama.block_count")
        .collect();
    write_gguf(&path, &meta, &d.hf_tensors(), Convert::Plain, &[]);
    contains_all(&err(&path), &["m.gguf: missing field 'llama.block_count'"]);
}

#[test]
fn wrong_field_type() {
    let (mut config, d) = qwen3_0_6b();
    config["num_attention_heads"] = json!("four");
    let dir = hf("type-hf", &config, &d);
    contains_all(&err(dir.path()), &["config.json: field 'num_attention_heads': expected a non-negative integer, found \"four\""]);
}

#[test]
fn unsupported_rope_kind() {
    let (mut config, d) = llama_3_2_1b();
    config["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0});
    let dir = hf("rope-hf", &config, &d);
    contains_all(
        &err(dir.path()),
        &[
            "config.json: rope scaling 'dynamic'",
            "supported: default, linear, llama3, yarn",
        ],
    );
}

#[test]
fn unsupported_rope_kind_gguf() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("rope-gguf");
    let path = dir.join("m.gguf");
    let mut meta = gguf_meta("llama", &d);
    meta.push(("llama.rope.scaling.type", strv("longrope")));
    write_gguf(&path, &meta, &d.hf_tensors(), Convert::Plain, &[]);
    contains_all(
        &err(&path),
        &["m.gguf: rope scaling 'longrope'", "llama.rope.scaling.type"],
    );
}

#[test]
fn index_lists_a_tensor_its_shard_lacks() {
    let (config, d) = qwen3_0_6b();
    let dir = TempDir::new("index");
    write_hf_folder(dir.path(), &config, &d.hf_tensors(), Dtype::F32, 2);
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    index["weight_map"]["model.norm.weight"] = json!("model-00002-of-00002.safetensors");
    let first = index["weight_map"]["model.embed_tokens.weight"].clone();
    index["weight_map"]["model.norm.weight"] = if first == json!("model-00001-of-00002.safetensors")
    {
        json!("model-00002-of-00002.safetensors")
    } else {
        json!("model-00001-of-00002.safetensors")
    };
    write_json(&index_path, &index);
    contains_all(
        &err(dir.path()),
        &[
            "model.safetensors.index.json: the index maps tensor 'model.norm.weight'",
            "which does not contain it",
        ],
    );
}

#[test]
fn index_names_a_missing_shard() {
    let (config, d) = qwen3_0_6b();
    let dir = TempDir::new("shard");
    write_hf_folder(dir.path(), &config, &d.hf_tensors(), Dtype::F32, 2);
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    contains_all(
        &err(dir.path()),
        &["cannot read", "model-00002-of-00002.safetensors"],
    );
}

#[test]
fn index_pointing_outside_the_folder() {
    let (config, d) = qwen3_0_6b();
    let dir = TempDir::new("escape");
    write_hf_folder(dir.path(), &config, &d.hf_tensors(), Dtype::F32, 2);
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"weight_map": {"model.norm.weight": "../x.safetensors"}}),
    );
    contains_all(
        &err(dir.path()),
        &["field 'weight_map.model.norm.weight': expected a file name in the folder"],
    );
}

#[test]
fn folder_without_weights() {
    let (config, _) = qwen3_0_6b();
    let dir = TempDir::new("noweights");
    write_json(&dir.join("config.json"), &config);
    contains_all(
        &err(dir.path()),
        &[
            "model.safetensors",
            "no model.safetensors or model.safetensors.index.json",
        ],
    );
}

#[test]
fn not_a_model() {
    let dir = TempDir::new("notamodel");
    contains_all(
        &err(dir.path()),
        &["is neither a Hugging Face model folder (no config.json) nor a GGUF file"],
    );
    let f = dir.join("x.bin");
    std::fs::write(&f, b"hello world, not gguf").unwrap();
    contains_all(&err(&f), &["x.bin: at byte 0: not a GGUF file"]);
}

#[test]
fn invalid_json() {
    let dir = TempDir::new("badjson");
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 64,").unwrap();
    contains_all(&err(dir.path()), &["config.json: invalid JSON"]);
}

#[test]
fn unsupported_features() {
    let (mut config, d) = tinyllama();
    config["mlp_bias"] = json!(true);
    let dir = hf("bias", &config, &d);
    contains_all(
        &err(dir.path()),
        &["config.json: 'mlp_bias: true'", "is not supported"],
    );
    let (mut config, d) = qwen3_0_6b();
    config["use_sliding_window"] = json!(true);
    let dir = hf("qwen-swa", &config, &d);
    contains_all(
        &err(dir.path()),
        &["'use_sliding_window: true' for Qwen3 is not supported"],
    );
}

#[test]
fn inconsistent_heads() {
    let (mut config, d) = qwen3_0_6b();
    config["num_key_value_heads"] = json!(3);
    let dir = hf("heads", &config, &d);
    contains_all(&err(dir.path()), &["config.json: inconsistent model: num_attention_heads 4 is not a multiple of num_key_value_heads 3"]);
}

#[test]
fn fused_qkv_of_the_wrong_shape() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("qkv");
    let path = dir.join("m.gguf");
    let mut w = rafter_gguf::GgufWriter::new();
    for (k, v) in gguf_meta("llama", &d) {
        w.add(k, v).unwrap();
    }
    w.add_tensor(
        "blk.0.attn_qkv.weight",
        &[64, 72],
        GgmlType::F32,
        vec![0u8; 64 * 72 * 4],
    )
    .unwrap();
    w.write_file(&path).unwrap();
    contains_all(
        &err(&path),
        &[
            "tensor 'model.layers.0.self_attn.qkv_proj.weight' (blk.0.attn_qkv.weight in",
            "has shape [72, 64], but the config implies [80, 64]",
        ],
    );
}

/// A hostile layer or expert count is an error before anything per layer is allocated.
#[test]
fn huge_counts() {
    let (_, d) = tinyllama();
    let dir = TempDir::new("huge-gguf");
    let path = dir.join("m.gguf");
    let mut meta = gguf_meta("llama", &d);
    meta.retain(|(k, _)| *k != "llama.block_count");
    meta.push(("llama.block_count", u32v(4_000_000_000)));
    write_gguf(&path, &meta, &d.hf_tensors(), Convert::Plain, &[]);
    contains_all(
        &err(&path),
        &["m.gguf: field 'llama.block_count': 4000000000 layers (at most 512 are supported)"],
    );

    let (mut config, d) = qwen3_30b_a3b();
    config["num_experts"] = json!(1_000_000);
    let dir = hf("huge-hf", &config, &d);
    contains_all(
        &err(dir.path()),
        &["config.json: inconsistent model: 1000000 experts of size 32 (at most 1024 experts"],
    );
    let (mut config, d) = qwen3_0_6b();
    config["vocab_size"] = json!(1u64 << 60);
    let dir = hf("huge-vocab", &config, &d);
    contains_all(&err(dir.path()), &["too large to address"]);
}
