//! HF folders of each architecture (real configs shrunk, weights written with the
//! safetensors crate) read into the expected spec and canonical weights.

mod common;

use common::*;
use rafter_llm::source::{ExpertLayout, ExpertProj, NormWeight, RopePairing, WeightDtype};
use rafter_llm::spec::{Activation, Architecture, AttentionKind, FfnKind, RopeScaling, RopeSpec};
use rafter_llm::ModelSource;
use safetensors::Dtype;
use serde_json::json;

fn open(
    name: &str,
    config: &serde_json::Value,
    dims: &Dims,
    dtype: Dtype,
    shards: usize,
) -> (TempDir, ModelSource) {
    let dir = TempDir::new(name);
    write_hf_folder(dir.path(), config, &dims.hf_tensors(), dtype, shards);
    let m = ModelSource::open(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
    (dir, m)
}

/// Every canonical weight holds exactly the bytes written for it.
fn assert_weights_match(m: &ModelSource, dims: &Dims, dtype: Dtype) {
    let tensors = dims.hf_tensors();
    assert_eq!(
        m.weights.len(),
        tensors.len(),
        "exactly the tensors the model needs"
    );
    for t in &tensors {
        let w = m
            .weights
            .get(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!(w.shape, t.shape, "{}", t.name);
        assert_eq!(&w.bytes[..], &encode(&t.data, dtype)[..], "{}", t.name);
    }
}

#[test]
fn qwen3_0_6b_f32() {
    let (config, dims) = qwen3_0_6b();
    let (_d, m) = open("qwen3", &config, &dims, Dtype::F32, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Qwen3);
    assert_eq!((s.vocab_size, s.hidden_size, s.num_layers), (256, 64, 2));
    assert_eq!(
        (s.num_heads, s.num_kv_heads, s.head_dim, s.gqa_group()),
        (4, 2, 32, 2)
    );
    assert_eq!(s.intermediate_size, 192);
    assert_eq!(s.rms_norm_eps, 1e-6);
    assert_eq!(s.rope, RopeSpec::plain(1e6));
    assert_eq!(s.max_position_embeddings, 40960);
    assert!(s.tie_word_embeddings && s.qk_norm && !s.sandwich_norms);
    assert_eq!(s.activation, Activation::Silu);
    assert_eq!(s.attention_scale, 32f64.powf(-0.5));
    assert!(s.moe.is_none() && s.sliding_window.is_none() && s.embedding_scale.is_none());
    assert!(s
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Full && l.ffn == FfnKind::Dense));
    assert_eq!(
        (s.tokens.bos, s.tokens.eos.clone()),
        (Some(151643), vec![151645])
    );
    assert_eq!(
        s.chat_template.as_deref(),
        Some("{% for m in messages %}{{ m.content }}{% endfor %}")
    );
    assert_eq!(s.generation.temperature, Some(0.6));
    assert_eq!(s.generation.top_k, Some(20));
    assert_eq!(s.generation.do_sample, Some(true));
    assert_eq!(m.conventions.rope_pairing, RopePairing::Halves);
    assert_eq!(m.conventions.norm_weight, NormWeight::Scale);
    assert_eq!(m.conventions.experts, ExpertLayout::None);
    assert!(m.weights.get("lm_head.weight").is_none(), "tied");
    assert_weights_match(&m, &dims, Dtype::F32);
}

#[test]
fn qwen3_bf16_and_f16_sharded() {
    let (config, dims) = qwen3_0_6b();
    for (dtype, want) in [
        (Dtype::BF16, WeightDtype::BF16),
        (Dtype::F16, WeightDtype::F16),
    ] {
        let (_d, m) = open(&format!("qwen3-{dtype:?}"), &config, &dims, dtype, 3);
        assert!(m.weights.iter().all(|(_, w)| w.dtype == want));
        assert_weights_match(&m, &dims, dtype);
        let files: std::collections::BTreeSet<_> = m
            .weights
            .iter()
            .map(|(_, w)| w.origin.file.clone())
            .collect();
        assert_eq!(files.len(), 3, "weights come from the three shards");
    }
}

#[test]
fn qwen3_30b_a3b_moe() {
    let (config, dims) = qwen3_30b_a3b();
    let (_d, m) = open("qwen3moe", &config, &dims, Dtype::BF16, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Qwen3Moe);
    let moe = s.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.experts_per_token,
            moe.intermediate_size,
            moe.norm_topk_prob
        ),
        (4, 2, 32, true)
    );
    assert!(s.layers.iter().all(|l| l.ffn == FfnKind::Moe));
    assert!(!s.tie_word_embeddings);
    assert_eq!(m.conventions.experts, ExpertLayout::PerExpert);
    assert_weights_match(&m, &dims, Dtype::BF16);
    let e = m.weights.expert(1, 3, ExpertProj::Down).unwrap();
    assert_eq!(e.shape, vec![64, 32]);
    assert_eq!(
        e,
        *m.weights
            .get("model.layers.1.mlp.experts.3.down_proj.weight")
            .unwrap()
    );
}

/// decoder_sparse_step and mlp_only_layers make some layers dense, as
/// Qwen3MoeDecoderLayer decides.
#[test]
fn qwen3_moe_dense_layers() {
    let (mut config, mut dims) = qwen3_30b_a3b();
    config["num_hidden_layers"] = json!(4);
    config["decoder_sparse_step"] = json!(2);
    config["mlp_only_layers"] = json!([3]);
    dims.layers = 4;
    dims.moe = Some((4, 32, vec![1]));
    let (_d, m) = open("qwen3moe-sparse", &config, &dims, Dtype::F32, 1);
    let kinds: Vec<FfnKind> = m.spec.layers.iter().map(|l| l.ffn).collect();
    assert_eq!(
        kinds,
        [FfnKind::Dense, FfnKind::Moe, FfnKind::Dense, FfnKind::Dense]
    );
    assert_weights_match(&m, &dims, Dtype::F32);
}

/// transformers 5 `save_pretrained(save_original_format=False)` writes experts fused:
/// `gate_up_proj` [experts, 2·ff, hidden] and `down_proj` [experts, hidden, ff]; they
/// split, zero-copy, into the same per-expert tensors.
#[test]
fn qwen3_moe_fused_experts() {
    let (mut config, dims) = qwen3_30b_a3b();
    // transformers 5 spelling of the same config.
    let obj = config.as_object_mut().unwrap();
    let experts = obj.remove("num_experts").unwrap();
    obj.insert("num_local_experts".into(), experts);
    obj.remove("rope_theta");
    obj.remove("rope_scaling");
    obj.insert(
        "rope_parameters".into(),
        json!({"rope_theta": 1000000.0, "rope_type": "default"}),
    );
    let per_expert = dims.hf_tensors();
    let (e, f, h) = (4, 32, 64);
    let mut written: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in &per_expert {
        if !t.name.contains(".mlp.experts.") {
            written.push((
                t.name.clone(),
                Dtype::F32,
                t.shape.clone(),
                encode(&t.data, Dtype::F32),
            ));
        }
    }
    for layer in 0..2 {
        let get = |x: usize, p: &str| {
            per_expert
                .iter()
                .find(|t| t.name == format!("model.layers.{layer}.mlp.experts.{x}.{p}.weight"))
                .unwrap()
                .data
                .clone()
        };
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        for x in 0..e {
            gate_up.extend(get(x, "gate_proj"));
            gate_up.extend(get(x, "up_proj"));
            down.extend(get(x, "down_proj"));
        }
        let p = format!("model.layers.{layer}.mlp.experts");
        written.push((
            format!("{p}.gate_up_proj"),
            Dtype::F32,
            vec![e, 2 * f, h],
            encode(&gate_up, Dtype::F32),
        ));
        written.push((
            format!("{p}.down_proj"),
            Dtype::F32,
            vec![e, h, f],
            encode(&down, Dtype::F32),
        ));
    }
    let dir = TempDir::new("qwen3moe-fused");
    write_json(&dir.join("config.json"), &config);
    write_safetensors(&dir.join("model.safetensors"), &written);
    let m = ModelSource::open(dir.path()).unwrap();
    assert_eq!(m.spec.moe.as_ref().unwrap().num_experts, 4);
    assert_eq!(m.spec.rope, RopeSpec::plain(1e6));
    assert_weights_match(&m, &dims, Dtype::F32);
    assert!(m.spec.chat_template.is_none() && m.spec.generation.temperature.is_none());
}

#[test]
fn llama_3_2_1b_llama3_rope() {
    let (config, dims) = llama_3_2_1b();
    let (_d, m) = open("llama32", &config, &dims, Dtype::BF16, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Llama);
    assert_eq!(
        s.rope.scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0
        }
    );
    assert_eq!(s.rope.theta, 500000.0);
    assert_eq!(s.rms_norm_eps, 1e-5);
    assert!(s.tie_word_embeddings && !s.qk_norm);
    // Reference values: transformers 5.23's `ROPE_INIT_FUNCTIONS["llama3"]` for this
    // config (head_dim 16), which computes in float32.
    let want = [
        1.0,
        0.193922758102417,
        0.03760603070259094,
        0.00729266507551074,
        0.000429556705057621,
        8.570255886297673e-06,
        1.6619674170215148e-06,
        3.2229328894572973e-07,
    ];
    let got = s.rope.inv_freq(16);
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= w * 1e-6, "{g} vs {w}");
    }
    assert_weights_match(&m, &dims, Dtype::BF16);
}

/// YaRN as Qwen3's model cards recommend enabling it; reference values from
/// transformers 5.23's `ROPE_INIT_FUNCTIONS["yarn"]` (float32).
#[test]
fn qwen3_yarn_rope() {
    let (mut config, dims) = qwen3_0_6b();
    config["rope_scaling"] =
        json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
    config["max_position_embeddings"] = json!(131072);
    let (_d, m) = open("qwen3-yarn", &config, &dims, Dtype::F32, 1);
    let want = [
        1.0,
        0.4216965138912201,
        0.17782793939113617,
        0.07498941570520401,
        0.03162277862429619,
        0.01333521492779255,
        0.00477990135550499,
        0.001659961650148034,
        0.0005499999970197678,
        0.00016867858357727528,
        4.4456985051510856e-05,
        1.8747356079984456e-05,
        7.905693564680405e-06,
        3.3338035336782923e-06,
        1.405853367941745e-06,
        5.928434347879374e-07,
    ];
    for (g, w) in m.spec.rope.inv_freq(32).iter().zip(want) {
        assert!((g - w).abs() <= w * 1e-6, "{g} vs {w}");
    }
    assert!((m.spec.rope.attention_factor() - 1.138629436111989).abs() < 1e-12);
}

#[test]
fn smollm2_135m_without_head_dim() {
    let (config, dims) = smollm2_135m();
    let (_d, m) = open("smollm2", &config, &dims, Dtype::F32, 1);
    assert_eq!(
        (m.spec.num_heads, m.spec.num_kv_heads, m.spec.head_dim),
        (9, 3, 8)
    );
    assert_eq!(m.spec.rope, RopeSpec::plain(100000.0));
    assert_eq!(m.spec.tokens.eos, vec![0]);
    assert_weights_match(&m, &dims, Dtype::F32);
}

#[test]
fn tinyllama_untied() {
    let (config, dims) = tinyllama();
    let (_d, m) = open("tinyllama", &config, &dims, Dtype::F16, 2);
    assert!(!m.spec.tie_word_embeddings);
    assert_eq!(
        m.weights.get("lm_head.weight").unwrap().shape,
        vec![256, 64]
    );
    assert_eq!(m.spec.max_position_embeddings, 2048);
    assert_weights_match(&m, &dims, Dtype::F16);
}

#[test]
fn gemma3_1b_it_sliding_pattern() {
    let (config, dims) = gemma3_1b_it();
    let (_d, m) = open("gemma3-1b", &config, &dims, Dtype::BF16, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Gemma3);
    assert!(s.tie_word_embeddings, "Gemma3TextConfig defaults to tied");
    assert_eq!(s.activation, Activation::GeluTanh);
    assert!(s.qk_norm && s.sandwich_norms);
    assert_eq!(s.embedding_scale, Some(8.0));
    assert_eq!(s.attention_scale, 32f64.powf(-0.5));
    assert_eq!(
        (s.attn_logit_softcapping, s.final_logit_softcapping),
        (None, None)
    );
    let kinds: Vec<AttentionKind> = s.layers.iter().map(|l| l.attention).collect();
    use AttentionKind::{Full, Sliding};
    assert_eq!(
        kinds,
        [Sliding, Sliding, Sliding, Sliding, Sliding, Full, Sliding]
    );
    let w = s.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.rope.clone()), (8, RopeSpec::plain(10000.0)));
    assert_eq!(s.rope, RopeSpec::plain(1e6));
    assert_eq!(s.rope_for_layer(0), &w.rope);
    assert_eq!(s.rope_for_layer(5), &s.rope);
    assert_eq!(s.tokens.eos, vec![1, 106]);
    assert_eq!((s.tokens.bos, s.tokens.pad), (Some(2), Some(0)));
    assert_eq!(m.conventions.norm_weight, NormWeight::OnePlus);
    assert_weights_match(&m, &dims, Dtype::BF16);
}

/// Gemma3ForConditionalGeneration: text fields under text_config, weights under
/// `language_model.model.` (as saved) or `model.language_model.` (transformers 5 in
/// memory), vision tensors ignored.
#[test]
fn gemma3_4b_conditional_generation_v5() {
    let (config, dims) = gemma3_4b_it_v5();
    for prefix in ["language_model.model.", "model.language_model."] {
        let dir = TempDir::new(&format!("gemma3-4b-{}", prefix.len()));
        let mut written: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = dims
            .hf_tensors()
            .iter()
            .map(|t| {
                let name = t.name.replacen("model.", prefix, 1);
                (
                    name,
                    Dtype::F32,
                    t.shape.clone(),
                    encode(&t.data, Dtype::F32),
                )
            })
            .collect();
        written.push((
            "vision_tower.vision_model.post_layernorm.weight".into(),
            Dtype::F32,
            vec![4],
            vec![0; 16],
        ));
        write_json(&dir.join("config.json"), &config);
        write_safetensors(&dir.join("model.safetensors"), &written);
        std::fs::write(dir.join("chat_template.jinja"), "{{ bos_token }}").unwrap();
        let m = ModelSource::open(dir.path()).unwrap();
        let s = &m.spec;
        assert_eq!(
            (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim),
            (6, 8, 4, 16)
        );
        assert_eq!(s.rope.scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!(s.rope.theta, 1e6);
        assert_eq!(
            s.sliding_window.as_ref().unwrap().rope,
            RopeSpec::plain(10000.0)
        );
        assert_eq!(s.sliding_window.as_ref().unwrap().size, 16);
        assert_eq!(s.final_logit_softcapping, Some(30.0));
        assert_eq!(s.attention_scale, 0.25);
        let full: Vec<usize> = (0..6)
            .filter(|&i| s.layers[i].attention == AttentionKind::Full)
            .collect();
        assert_eq!(full, [2, 5]);
        assert_eq!(s.tokens.eos, vec![1, 106]);
        assert_eq!(s.chat_template.as_deref(), Some("{{ bos_token }}"));
        assert_weights_match(&m, &dims, Dtype::F32);
        assert_eq!(
            m.unused,
            ["vision_tower.vision_model.post_layernorm.weight"]
        );
        let embed = m.weights.get("model.embed_tokens.weight").unwrap();
        assert_eq!(
            embed.origin.name,
            format!("{prefix}embed_tokens.weight"),
            "origin keeps the file's name"
        );
    }
}

/// A tied model whose file still carries lm_head: the embedding is used, lm_head is unused.
#[test]
fn tied_model_ignores_a_stored_lm_head() {
    let (config, dims) = qwen3_0_6b();
    let dir = TempDir::new("qwen3-extra-head");
    let mut t = dims.hf_tensors();
    t.push(F32Tensor {
        name: "lm_head.weight".into(),
        shape: vec![256, 64],
        data: values(256 * 64, 99),
    });
    write_hf_folder(dir.path(), &config, &t, Dtype::F32, 1);
    let m = ModelSource::open(dir.path()).unwrap();
    assert!(m.weights.get("lm_head.weight").is_none());
}

/// Named chat templates in tokenizer_config.json: "default" is taken.
#[test]
fn named_chat_templates() {
    let (config, dims) = smollm2_135m();
    let dir = TempDir::new("templates");
    write_hf_folder(dir.path(), &config, &dims.hf_tensors(), Dtype::F32, 1);
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}),
    );
    assert_eq!(
        ModelSource::open(dir.path())
            .unwrap()
            .spec
            .chat_template
            .as_deref(),
        Some("D")
    );
}

/// Qwen2.5: q/k/v biases read as weights of the model, no o bias, no q/k norms; the
/// unused `sliding_window` (with `use_sliding_window: false`) leaves every layer causal.
#[test]
fn qwen2_5_biases() {
    let (config, dims) = qwen2_5_0_5b();
    let (_d, m) = open("qwen2", &config, &dims, Dtype::BF16, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Qwen2);
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (14, 2, 8));
    assert!(s.qkv_bias && !s.o_bias && !s.qk_norm && s.tie_word_embeddings);
    assert!(s.sliding_window.is_none());
    assert!(s.layers.iter().all(|l| l.attention == AttentionKind::Full));
    assert_eq!(s.rope, RopeSpec::plain(1e6));
    assert_weights_match(&m, &dims, Dtype::BF16);
    // A checkpoint without its biases names the first one missing.
    let mut partial = dims.clone();
    partial.qkv_bias = false;
    let dir = TempDir::new("qwen2-nobias");
    write_hf_folder(dir.path(), &config, &partial.hf_tensors(), Dtype::F32, 1);
    let err = ModelSource::open(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.bias"),
        "{err}"
    );
}

/// Mistral v0.1: every layer attends within its 4096-token window with the model's one
/// rope; `"sliding_window": null` (v0.2 on) means full causal attention; a config without
/// the field gets transformers' default window, 4096.
#[test]
fn mistral_sliding_window() {
    let (config, dims) = mistral_7b_v0_1();
    let (_d, m) = open("mistral", &config, &dims, Dtype::F32, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Llama);
    let w = s.sliding_window.as_ref().expect("a window");
    assert_eq!(w.size, 4096);
    assert_eq!(w.rope, s.rope);
    assert!(s
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Sliding));
    assert!(!s.tie_word_embeddings && !s.qkv_bias);
    assert_weights_match(&m, &dims, Dtype::F32);

    let mut v02 = config.clone();
    v02["sliding_window"] = serde_json::Value::Null;
    let (_d, m) = open("mistral-v02", &v02, &dims, Dtype::F32, 1);
    assert!(m.spec.sliding_window.is_none());
    assert!(m
        .spec
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Full));

    let mut unset = config.clone();
    unset.as_object_mut().unwrap().remove("sliding_window");
    let (_d, m) = open("mistral-default", &unset, &dims, Dtype::F32, 1);
    assert_eq!(m.spec.sliding_window.as_ref().map(|w| w.size), Some(4096));
}

/// Llama with `attention_bias: true`: biases on q, k, v and o; `mlp_bias: true` is refused
/// by name.
#[test]
fn llama_attention_bias_and_mlp_bias() {
    let (mut config, mut dims) = tinyllama();
    config["attention_bias"] = true.into();
    dims.qkv_bias = true;
    dims.o_bias = true;
    let (_d, m) = open("llama-bias", &config, &dims, Dtype::F32, 1);
    assert!(m.spec.qkv_bias && m.spec.o_bias);
    assert_weights_match(&m, &dims, Dtype::F32);

    config["mlp_bias"] = true.into();
    let dir = TempDir::new("llama-mlp-bias");
    write_hf_folder(dir.path(), &config, &dims.hf_tensors(), Dtype::F32, 1);
    let err = ModelSource::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("mlp_bias"), "{err}");
}

/// Gemma 2: even layers slide (with the model's one rope), scores and logits soft-capped,
/// (1 + w) sandwich norms without q/k norms; caps default to 50 and 30 when the config
/// omits them (Gemma2Config) and a `null` turns one off.
#[test]
fn gemma2_sliding_layers_and_softcaps() {
    let (config, dims) = gemma2_2b_it();
    let (_d, m) = open("gemma2", &config, &dims, Dtype::F32, 1);
    let s = &m.spec;
    assert_eq!(s.architecture, Architecture::Gemma2);
    let kinds: Vec<AttentionKind> = s.layers.iter().map(|l| l.attention).collect();
    use AttentionKind::{Full, Sliding};
    assert_eq!(kinds, [Sliding, Full, Sliding]);
    let w = s.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, &w.rope), (8, &RopeSpec::plain(10000.0)));
    assert_eq!(s.rope, RopeSpec::plain(10000.0));
    assert_eq!(
        (s.attn_logit_softcapping, s.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(s.attention_scale, 0.25);
    assert_eq!(s.embedding_scale, Some(8.0));
    assert!(s.sandwich_norms && !s.qk_norm && s.tie_word_embeddings);
    assert_eq!(s.activation, Activation::GeluTanh);
    assert_eq!(m.conventions.norm_weight, NormWeight::OnePlus);
    assert_weights_match(&m, &dims, Dtype::F32);

    let mut bare = config.clone();
    let obj = bare.as_object_mut().unwrap();
    obj.remove("attn_logit_softcapping");
    obj.insert("final_logit_softcapping".into(), serde_json::Value::Null);
    let (_d, m) = open("gemma2-caps", &bare, &dims, Dtype::F32, 1);
    assert_eq!(
        (
            m.spec.attn_logit_softcapping,
            m.spec.final_logit_softcapping
        ),
        (Some(50.0), None)
    );
}

/// `attention_bias: true` gives q/k/v/o biases wherever transformers' class builds them
/// from the config (Qwen3 here); Mistral's class has none whatever the config says.
#[test]
fn attention_bias_follows_the_class() {
    let (mut config, mut dims) = qwen3_0_6b();
    config["attention_bias"] = true.into();
    dims.qkv_bias = true;
    dims.o_bias = true;
    let (_d, m) = open("qwen3-bias", &config, &dims, Dtype::F32, 1);
    assert!(m.spec.qkv_bias && m.spec.o_bias);
    assert_weights_match(&m, &dims, Dtype::F32);

    let (mut config, dims) = mistral_7b_v0_1();
    config["attention_bias"] = true.into();
    config["mlp_bias"] = true.into();
    let (_d, m) = open("mistral-bias", &config, &dims, Dtype::F32, 1);
    assert!(!m.spec.qkv_bias && !m.spec.o_bias);
}
