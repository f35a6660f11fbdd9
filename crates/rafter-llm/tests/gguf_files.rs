//! GGUF files of each architecture, written as llama.cpp's converter writes them (its
//! metadata keys, tensor names, Llama Q/K permutation, Gemma's 1 + w norms, stacked
//! experts), read into the same spec as the HF folder and weights that relate to the HF
//! ones exactly as the `Conventions` say.

mod common;

use common::*;
use rafter_gguf::{Array, GgmlType, Value};
use rafter_llm::source::{ExpertLayout, ExpertProj, NormWeight, RopePairing, WeightDtype};
use rafter_llm::spec::{Architecture, RopeScaling};
use rafter_llm::ModelSource;
use safetensors::Dtype;

/// The metadata llama.cpp's converter writes for a model of these dims
/// (TextModel.set_gguf_parameters and the per-architecture additions).
fn metadata(arch: &str, d: &Dims, ctx: u32, theta: f32, eps: f32) -> Vec<(&'static str, Value)> {
    let k = |s: &str| -> &'static str { Box::leak(format!("{arch}.{s}").into_boxed_str()) };
    let mut m = vec![
        ("general.architecture", strv(arch)),
        ("general.name", strv("tiny")),
        (k("block_count"), u32v(d.layers as u32)),
        (k("context_length"), u32v(ctx)),
        (k("embedding_length"), u32v(d.hidden as u32)),
        (k("feed_forward_length"), u32v(d.inter as u32)),
        (k("attention.head_count"), u32v(d.heads as u32)),
        (k("attention.head_count_kv"), u32v(d.kv as u32)),
        (k("rope.freq_base"), f32v(theta)),
        (k("attention.layer_norm_rms_epsilon"), f32v(eps)),
        (k("attention.key_length"), u32v(d.head_dim as u32)),
        (k("attention.value_length"), u32v(d.head_dim as u32)),
        ("general.file_type", u32v(0)),
        ("tokenizer.ggml.model", strv("gpt2")),
        ("tokenizer.ggml.tokens", tokens_array(d.vocab)),
        ("tokenizer.ggml.bos_token_id", u32v(11)),
        ("tokenizer.ggml.eos_token_id", u32v(12)),
        ("tokenizer.ggml.eot_token_id", u32v(13)),
        ("tokenizer.ggml.padding_token_id", u32v(12)),
        ("tokenizer.chat_template", strv("{{ messages }}")),
        ("general.sampling.top_k", Value::I32(20)),
        ("general.sampling.temp", f32v(0.6)),
    ];
    if let Some((e, f, _)) = &d.moe {
        m.push((k("expert_count"), u32v(*e as u32)));
        m.push((k("expert_used_count"), u32v(2)));
        m.push((k("expert_feed_forward_length"), u32v(*f as u32)));
    }
    m
}

fn write_and_open(
    name: &str,
    meta: &[(&str, Value)],
    d: &Dims,
    convert: Convert,
    q8: &[&str],
) -> (TempDir, ModelSource) {
    let dir = TempDir::new(name);
    let path = dir.join("model.gguf");
    write_gguf(&path, meta, &d.hf_tensors(), convert, q8);
    let m = ModelSource::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    (dir, m)
}

fn hf_model(name: &str, config: &serde_json::Value, d: &Dims) -> (TempDir, ModelSource) {
    let dir = TempDir::new(&format!("{name}-hf"));
    write_hf_folder(dir.path(), config, &d.hf_tensors(), Dtype::F32, 1);
    let m = ModelSource::open(dir.path()).unwrap();
    (dir, m)
}

#[test]
fn qwen3_gguf_matches_hf() {
    let (config, d) = qwen3_0_6b();
    let (_h, hf) = hf_model("qwen3", &config, &d);
    let meta = metadata("qwen3", &d, 40960, 1e6, 1e-6);
    let (_g, g) = write_and_open(
        "qwen3-gguf",
        &meta,
        &d,
        Convert::Plain,
        &["blk.0.attn_q.weight"],
    );
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(g.conventions.rope_pairing, RopePairing::Halves);
    assert_eq!(g.conventions.norm_weight, NormWeight::Scale);
    assert_eq!(g.spec.tokens.bos, Some(11));
    assert_eq!(
        g.spec.tokens.eos,
        vec![12, 13],
        "eos and eot end generation"
    );
    assert_eq!(g.spec.tokens.pad, Some(12));
    assert_eq!(g.spec.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!(
        (g.spec.generation.top_k, g.spec.generation.temperature),
        (Some(20), Some(f64::from(0.6f32)))
    );
    let q = g
        .weights
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(
        (q.dtype, q.shape.clone()),
        (WeightDtype::Ggml(GgmlType::Q8_0), vec![128, 64])
    );
    assert_eq!(q.bytes.len(), 128 * 64 / 32 * 34);
    assert_eq!(q.origin.name, "blk.0.attn_q.weight");
    // Every other weight is the HF one, bytes for bytes, zero-copy from the map.
    let file = g.gguf().unwrap().bytes();
    let range = file.as_ptr() as usize..file.as_ptr() as usize + file.len();
    for (name, w) in g.weights.iter() {
        assert!(
            range.contains(&(w.bytes.as_ptr() as usize)),
            "{name} points into the map"
        );
        if name != "model.layers.0.self_attn.q_proj.weight" {
            assert_eq!(
                w,
                hf.weights
                    .get(name)
                    .map(|h| WeightRefEq(h.bytes.clone(), h.shape.clone()))
                    .unwrap(),
                "{name}"
            );
        }
    }
}

/// Compares a weight's bytes and shape to an HF weight's.
struct WeightRefEq(bytes::Bytes, Vec<usize>);
impl PartialEq<WeightRefEq> for &rafter_llm::source::WeightTensor {
    fn eq(&self, other: &WeightRefEq) -> bool {
        self.bytes == other.0 && self.shape == other.1
    }
}
impl std::fmt::Debug for WeightRefEq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes of shape {:?}", self.0.len(), self.1)
    }
}

/// Llama: the converter permutes Q/K rows; with interleaved rope the permuted weights
/// give the same attention scores as HF's weights with half-split rope.
#[test]
fn llama_gguf_permuted_qk_give_hf_scores() {
    let (config, d) = tinyllama();
    let (_h, hf) = hf_model("tinyllama", &config, &d);
    let mut meta = metadata("llama", &d, 2048, 10000.0, 1e-5);
    meta.push(("llama.vocab_size", u32v(256)));
    meta.push(("llama.rope.dimension_count", u32v(d.head_dim as u32)));
    let (_g, g) = write_and_open(
        "tinyllama-gguf",
        &meta,
        &d,
        Convert::Llama {
            heads: d.heads,
            kv: d.kv,
        },
        &[],
    );
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(g.conventions.rope_pairing, RopePairing::Interleaved);
    assert_eq!(hf.conventions.rope_pairing, RopePairing::Halves);
    let hq = hf
        .weights
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let gq = g
        .weights
        .get("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_ne!(hq.bytes, gq.bytes, "the rows are permuted");
    let x: Vec<f64> = values(d.hidden, 5).into_iter().map(f64::from).collect();
    let (a, b) = (scores(&hf, &x), scores(&g, &x));
    for (s, t) in a.iter().zip(&b) {
        assert!((s - t).abs() < 1e-9 * s.abs().max(1.0), "{s} vs {t}");
    }
    // Without honouring the convention the scores differ.
    let mut wrong = g.clone();
    wrong.conventions.rope_pairing = RopePairing::Halves;
    assert!(scores(&wrong, &x)
        .iter()
        .zip(&a)
        .any(|(s, t)| (s - t).abs() > 1e-3));
    // V and O are not permuted.
    for n in ["self_attn.v_proj", "self_attn.o_proj", "mlp.down_proj"] {
        let name = format!("model.layers.1.{n}.weight");
        assert_eq!(
            hf.weights.get(&name).unwrap().bytes,
            g.weights.get(&name).unwrap().bytes,
            "{name}"
        );
    }
}

/// Llama 3: GGUF carries the llama3 scaling as rope_freqs.weight; the inverse
/// frequencies equal HF's.
#[test]
fn llama3_gguf_rope_freqs() {
    let (config, d) = llama_3_2_1b();
    let (_h, hf) = hf_model("llama32", &config, &d);
    // The converter's factors (conversion/llama.py generate_extra_tensors), in f32.
    let (theta, dim, factor, low, high, old) =
        (500000.0f64, 16usize, 32.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let factors: Vec<f32> = (0..dim / 2)
        .map(|j| {
            let freq = 1.0 / theta.powf((2 * j) as f64 / dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect();
    let mut meta = metadata("llama", &d, 131072, 500000.0, 1e-5);
    meta.push(("llama.rope.dimension_count", u32v(16)));
    let dir = TempDir::new("llama32-gguf");
    let path = dir.join("model.gguf");
    // rope_freqs is one more tensor of the file.
    let mut w = rafter_gguf::GgufWriter::new();
    for (k, v) in &meta {
        w.add(k, v.clone()).unwrap();
    }
    let bytes: Vec<u8> = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
    w.add_tensor("rope_freqs.weight", &[8], GgmlType::F32, bytes)
        .unwrap();
    let tmp = dir.join("tensors.gguf");
    write_gguf(
        &tmp,
        &[],
        &d.hf_tensors(),
        Convert::Llama {
            heads: d.heads,
            kv: d.kv,
        },
        &[],
    );
    let t = rafter_gguf::GgufFile::open(&tmp).unwrap();
    for info in t.tensors() {
        w.add_tensor(
            info.name(),
            info.dims(),
            info.ggml_type(),
            t.tensor_data(info),
        )
        .unwrap();
    }
    w.write_file(&path).unwrap();
    let g = ModelSource::open(&path).unwrap();
    assert!(matches!(g.spec.rope.scaling, RopeScaling::FreqFactors(ref f) if f == &factors));
    assert_same_architecture(&hf.spec, &g.spec);
    assert!(g.spec.tie_word_embeddings, "no output.weight → tied");
    assert!(g.weights.get("rope_freqs.weight").is_none());
}

/// Gemma 3: GGUF norms hold 1 + w; the spec (sliding pattern, local rope, scales)
/// matches HF's.
#[test]
fn gemma3_gguf_norms_and_sliding_layers() {
    let (config, d) = gemma3_1b_it();
    let (_h, hf) = hf_model("gemma3", &config, &d);
    let mut meta = metadata("gemma3", &d, 32768, 1e6, 1e-6);
    meta.push(("gemma3.attention.sliding_window", u32v(8)));
    meta.push(("gemma3.rope.freq_base_swa", f32v(10000.0)));
    let (_g, g) = write_and_open("gemma3-gguf", &meta, &d, Convert::Gemma, &[]);
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(hf.conventions.norm_weight, NormWeight::OnePlus);
    assert_eq!(g.conventions.norm_weight, NormWeight::Scale);
    // x * (1 + w_hf) == x * w_gguf for every norm, q/k norms included.
    let mut norms = 0;
    for (name, hw) in hf
        .weights
        .iter()
        .filter(|(n, _)| n.ends_with("norm.weight"))
    {
        let gw = f32s(&g.weights.get(name).unwrap().bytes);
        for (a, b) in f32s(&hw.bytes).iter().zip(gw) {
            assert_eq!(1.0 + a, b, "{name}");
        }
        norms += 1;
    }
    assert_eq!(norms, 1 + 7 * 6, "final norm and six per layer");
    // The pre-FFN norm is ffn_norm, the post-attention norm post_attention_norm.
    assert_eq!(
        g.weights
            .get("model.layers.2.pre_feedforward_layernorm.weight")
            .unwrap()
            .origin
            .name,
        "blk.2.ffn_norm.weight"
    );
    assert_eq!(
        g.weights
            .get("model.layers.2.post_attention_layernorm.weight")
            .unwrap()
            .origin
            .name,
        "blk.2.post_attention_norm.weight"
    );
}

/// Gemma 3 4B-style: linear rope scaling on full layers, explicit per-layer pattern,
/// final soft-capping.
#[test]
fn gemma3_gguf_linear_scaling_and_bool_pattern() {
    let (config, d) = gemma3_4b_it_v5();
    let (_h, hf) = hf_model("gemma3-4b", &config, &d);
    let mut meta = metadata("gemma3", &d, 131072, 1e6, 1e-6);
    meta.push(("gemma3.attention.sliding_window", u32v(16)));
    meta.push(("gemma3.final_logit_softcapping", f32v(30.0)));
    meta.push(("gemma3.rope.scaling.type", strv("linear")));
    meta.push(("gemma3.rope.scaling.factor", f32v(8.0)));
    let pattern: Vec<bool> = (0..6).map(|i| (i + 1) % 3 != 0).collect();
    meta.push((
        "gemma3.attention.sliding_window_pattern",
        Value::Array(Array::from_slice(&pattern)),
    ));
    let (_g, g) = write_and_open("gemma3-4b-gguf", &meta, &d, Convert::Gemma, &[]);
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(g.spec.rope.scaling, RopeScaling::Linear { factor: 8.0 });
}

/// Qwen3-MoE: stacked `ffn_*_exps` tensors; each expert reads as HF's, zero-copy.
#[test]
fn qwen3moe_gguf_stacked_experts() {
    let (config, d) = qwen3_30b_a3b();
    let (_h, hf) = hf_model("qwen3moe", &config, &d);
    let meta = metadata("qwen3moe", &d, 40960, 1e6, 1e-6);
    let (_g, g) = write_and_open(
        "qwen3moe-gguf",
        &meta,
        &d,
        Convert::Plain,
        &["blk.1.ffn_up_exps.weight"],
    );
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(g.conventions.experts, ExpertLayout::Stacked);
    assert_eq!(hf.conventions.experts, ExpertLayout::PerExpert);
    let stacked = g
        .weights
        .get("model.layers.0.mlp.experts.down_proj.weight")
        .unwrap();
    assert_eq!(stacked.shape, vec![4, 64, 32]);
    for layer in 0..2 {
        for e in 0..4 {
            for p in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                let a = hf.weights.expert(layer, e, p).unwrap();
                let b = g.weights.expert(layer, e, p).unwrap();
                assert_eq!(a.shape, b.shape);
                if layer == 1 && p == ExpertProj::Up {
                    assert_eq!(b.dtype, WeightDtype::Ggml(GgmlType::Q8_0));
                    assert_eq!(b.bytes.len(), 32 * 64 / 32 * 34, "one expert's q8_0 blocks");
                } else {
                    assert_eq!(a.bytes, b.bytes, "layer {layer} expert {e} {p:?}");
                }
            }
        }
    }
    assert_eq!(g.spec.architecture, Architecture::Qwen3Moe);
    assert!(g.spec.moe.as_ref().unwrap().norm_topk_prob);
}

/// Without expert_feed_forward_length, llama.cpp's qwen3moe takes
/// feed_forward_length / expert_used_count.
#[test]
fn qwen3moe_expert_ff_default() {
    let (_, mut d) = qwen3_30b_a3b();
    d.inter = 64; // 64 / 2 experts used = 32 = the experts' size
    let meta: Vec<_> = metadata("qwen3moe", &d, 40960, 1e6, 1e-6)
        .into_iter()
        .filter(|(k, _)| *k != "qwen3moe.expert_feed_forward_length")
        .collect();
    let (_g, g) = write_and_open("qwen3moe-ff", &meta, &d, Convert::Plain, &[]);
    assert_eq!(g.spec.moe.as_ref().unwrap().intermediate_size, 32);
}

/// The converter's `--fuse-qkv` and `--fuse-gate-up-exps` outputs (attn_qkv = rows of q,
/// k, v; ffn_gate_up_exps = each expert's gate rows then up rows) read as the same
/// weights as the unfused file, zero-copy.
#[test]
fn fused_qkv_and_gate_up_exps() {
    let (_, d) = qwen3_30b_a3b();
    let meta = metadata("qwen3moe", &d, 40960, 1e6, 1e-6);
    let (dir, plain) = write_and_open("fused-plain", &meta, &d, Convert::Plain, &[]);
    let src = rafter_gguf::GgufFile::open(dir.join("model.gguf")).unwrap();
    let data = |n: &str| src.tensor_data(src.tensor(n).unwrap());
    let mut w = rafter_gguf::GgufWriter::new();
    for (k, v) in &meta {
        w.add(k, v.clone()).unwrap();
    }
    for info in src.tensors() {
        let n = info.name();
        let layer = n.split('.').nth(1).unwrap_or("");
        if n.contains(".attn_k.") || n.contains(".attn_v.") || n.contains(".ffn_up_exps.") {
            continue;
        }
        if n.contains(".attn_q.") {
            let mut qkv = data(n).to_vec();
            qkv.extend_from_slice(&data(&format!("blk.{layer}.attn_k.weight")));
            qkv.extend_from_slice(&data(&format!("blk.{layer}.attn_v.weight")));
            w.add_tensor(
                &format!("blk.{layer}.attn_qkv.weight"),
                &[64, 128 + 64],
                GgmlType::F32,
                qkv,
            )
            .unwrap();
        } else if n.contains(".ffn_gate_exps.") {
            let (gate, up) = (data(n), data(&format!("blk.{layer}.ffn_up_exps.weight")));
            let per = gate.len() / 4;
            let mut fused = Vec::new();
            for e in 0..4 {
                fused.extend_from_slice(&gate[e * per..(e + 1) * per]);
                fused.extend_from_slice(&up[e * per..(e + 1) * per]);
            }
            w.add_tensor(
                &format!("blk.{layer}.ffn_gate_up_exps.weight"),
                &[64, 64, 4],
                GgmlType::F32,
                fused,
            )
            .unwrap();
        } else {
            w.add_tensor(n, info.dims(), info.ggml_type(), data(n))
                .unwrap();
        }
    }
    let path = dir.join("fused.gguf");
    w.write_file(&path).unwrap();
    let fused = ModelSource::open(&path).unwrap();
    assert_eq!(fused.conventions.experts, ExpertLayout::PerExpert);
    for layer in 0..2 {
        for n in ["q_proj", "k_proj", "v_proj"] {
            let name = format!("model.layers.{layer}.self_attn.{n}.weight");
            assert_eq!(
                fused.weights.get(&name).unwrap().bytes,
                plain.weights.get(&name).unwrap().bytes,
                "{name}"
            );
        }
        for e in 0..4 {
            for p in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                let (a, b) = (
                    fused.weights.expert(layer, e, p).unwrap(),
                    plain.weights.expert(layer, e, p).unwrap(),
                );
                assert_eq!(
                    (a.bytes, a.shape),
                    (b.bytes, b.shape),
                    "layer {layer} expert {e} {p:?}"
                );
            }
        }
    }
}

/// Qwen2: the q/k/v biases come from `attn_{q,k,v}.bias`, bytes for bytes the HF ones (no
/// permutation: NeoX rope, as HF's); a file without them names the missing tensor.
#[test]
fn qwen2_gguf_matches_hf() {
    let (config, d) = qwen2_5_0_5b();
    let (_h, hf) = hf_model("qwen2", &config, &d);
    let meta = metadata("qwen2", &d, 32768, 1e6, 1e-6);
    let (_g, g) = write_and_open("qwen2-gguf", &meta, &d, Convert::Plain, &[]);
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(g.conventions.rope_pairing, RopePairing::Halves);
    for proj in ["q_proj", "k_proj", "v_proj"] {
        let name = format!("model.layers.1.self_attn.{proj}.bias");
        let b = g.weights.get(&name).unwrap();
        assert_eq!(b.origin.name, format!("blk.1.attn_{}.bias", &proj[..1]));
        assert_eq!(b.bytes, hf.weights.get(&name).unwrap().bytes, "{name}");
    }
    let x: Vec<f64> = values(d.hidden, 9).into_iter().map(f64::from).collect();
    assert_eq!(scores(&hf, &x), scores(&g, &x));

    let mut unbiased = d.clone();
    unbiased.qkv_bias = false;
    let dir = TempDir::new("qwen2-gguf-nobias");
    let path = dir.join("model.gguf");
    write_gguf(&path, &meta, &unbiased.hf_tensors(), Convert::Plain, &[]);
    let err = ModelSource::open(&path).unwrap_err().to_string();
    assert!(err.contains("blk.0.attn_q.bias"), "{err}");
}

/// A `llama` file with attention biases (a checkpoint with `attention_bias: true`): the
/// converter permutes the q/k biases with their weights, and with interleaved rope they
/// give HF's scores; the biases' presence, not the architecture, turns them on.
#[test]
fn llama_gguf_permuted_biases_give_hf_scores() {
    let (mut config, mut d) = tinyllama();
    config["attention_bias"] = true.into();
    d.qkv_bias = true;
    d.o_bias = true;
    let (_h, hf) = hf_model("tinyllama-bias", &config, &d);
    let mut meta = metadata("llama", &d, 2048, 10000.0, 1e-5);
    meta.push(("llama.vocab_size", u32v(256)));
    let convert = Convert::Llama {
        heads: d.heads,
        kv: d.kv,
    };
    let (_g, g) = write_and_open("tinyllama-bias-gguf", &meta, &d, convert, &[]);
    assert_same_architecture(&hf.spec, &g.spec);
    assert!(g.spec.qkv_bias && g.spec.o_bias);
    let name = "model.layers.0.self_attn.q_proj.bias";
    assert_ne!(
        g.weights.get(name).unwrap().bytes,
        hf.weights.get(name).unwrap().bytes,
        "the q bias is permuted"
    );
    let x: Vec<f64> = values(d.hidden, 5).into_iter().map(f64::from).collect();
    for (s, t) in scores(&hf, &x).iter().zip(&scores(&g, &x)) {
        assert!((s - t).abs() < 1e-9 * s.abs().max(1.0), "{s} vs {t}");
    }
}

/// Gemma 2 as llama.cpp's converter writes it: the same spec as the HF folder (window on
/// even layers, caps, norms as 1 + w); a file naming no window or caps gets llama.cpp's
/// defaults (4096, 50, 30).
#[test]
fn gemma2_gguf_matches_hf() {
    let (config, d) = gemma2_2b_it();
    let (_h, hf) = hf_model("gemma2", &config, &d);
    let base = metadata("gemma2", &d, 8192, 10000.0, 1e-6);
    let mut meta = base.clone();
    meta.push(("gemma2.attention.sliding_window", u32v(8)));
    meta.push(("gemma2.attn_logit_softcapping", f32v(50.0)));
    meta.push(("gemma2.final_logit_softcapping", f32v(30.0)));
    let (_g, g) = write_and_open("gemma2-gguf", &meta, &d, Convert::Gemma, &[]);
    assert_same_architecture(&hf.spec, &g.spec);
    assert_eq!(
        g.spec.attn_logit_softcapping,
        hf.spec.attn_logit_softcapping
    );
    assert_eq!(
        g.weights
            .get("model.layers.1.pre_feedforward_layernorm.weight")
            .unwrap()
            .origin
            .name,
        "blk.1.ffn_norm.weight"
    );

    let (_g, bare) = write_and_open("gemma2-gguf-bare", &base, &d, Convert::Gemma, &[]);
    let s = &bare.spec;
    assert_eq!(s.sliding_window.as_ref().map(|w| w.size), Some(4096));
    assert_eq!(
        (s.attn_logit_softcapping, s.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
}
