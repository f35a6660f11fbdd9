//! Models converted by llama.cpp's own converter read as their HF originals do.
//!
//! `RAFTER_LLM_CONVERTED_DIR` names a folder of `<name>/hf/` (a transformers checkpoint,
//! f32) and `<name>/model-f32.gguf` (`convert_hf_to_gguf.py --outtype f32` of it). For
//! each pair the two specs must agree and every GGUF weight must relate to the HF one as
//! the source `Conventions` say: equal bytes, `1 + w` norms (Gemma), permuted Q/K giving
//! HF's attention scores under interleaved rope (Llama), stacked experts equal per expert.
//! Without the variable the test prints a note and passes (the LLM fixture pipeline
//! produces such folders; see tests/fixtures/llm/ once it lands).

mod common;

use std::path::PathBuf;

use common::*;
use rafter_llm::source::{ExpertProj, NormWeight, RopePairing, WeightDtype};
use rafter_llm::ModelSource;

#[test]
fn converted_models_read_like_their_originals() {
    let Some(dir) = std::env::var_os("RAFTER_LLM_CONVERTED_DIR").map(PathBuf::from) else {
        eprintln!("real_converter: RAFTER_LLM_CONVERTED_DIR is not set; skipping");
        return;
    };
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let d = entry.unwrap().path();
        let (hf_dir, gguf) = (d.join("hf"), d.join("model-f32.gguf"));
        if !hf_dir.is_dir() || !gguf.is_file() {
            continue;
        }
        let hf = ModelSource::open(&hf_dir).unwrap_or_else(|e| panic!("{e}"));
        let g = ModelSource::open(&gguf).unwrap_or_else(|e| panic!("{e}"));
        assert_same_architecture(&hf.spec, &g.spec);
        compare_weights(&hf, &g);
        eprintln!(
            "real_converter: {} ({}) ok",
            d.display(),
            g.spec.architecture
        );
        checked += 1;
    }
    assert!(
        checked > 0,
        "no <name>/hf + <name>/model-f32.gguf pairs in {}",
        dir.display()
    );
}

fn compare_weights(hf: &ModelSource, g: &ModelSource) {
    assert!(
        hf.weights.iter().all(|(_, w)| w.dtype == WeightDtype::F32),
        "f32 checkpoints"
    );
    let s = &hf.spec;
    for (name, hw) in hf.weights.iter() {
        if name.contains(".mlp.experts.") {
            continue;
        }
        let gw = g
            .weights
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from GGUF"));
        assert_eq!(hw.shape, gw.shape, "{name}");
        let (a, b) = (f32s(&hw.bytes), f32s(&gw.bytes));
        let qk = name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight");
        if name.ends_with("norm.weight") && hf.conventions.norm_weight != g.conventions.norm_weight
        {
            assert_eq!(hf.conventions.norm_weight, NormWeight::OnePlus);
            assert!(
                a.iter().zip(&b).all(|(x, y)| 1.0 + x == *y),
                "{name}: GGUF holds 1 + w"
            );
        } else if qk && g.conventions.rope_pairing == RopePairing::Interleaved {
            assert_ne!(a, b, "{name}: rows permuted");
        } else {
            assert_eq!(a, b, "{name}");
        }
    }
    if g.conventions.rope_pairing != hf.conventions.rope_pairing {
        let x: Vec<f64> = values(s.hidden_size, 3)
            .into_iter()
            .map(f64::from)
            .collect();
        for (u, v) in scores(hf, &x).iter().zip(scores(g, &x)) {
            assert!((u - v).abs() < 1e-6 * u.abs().max(1.0), "scores {u} vs {v}");
        }
    }
    if let Some(moe) = &s.moe {
        for (layer, spec) in s.layers.iter().enumerate() {
            if spec.ffn != rafter_llm::spec::FfnKind::Moe {
                continue;
            }
            for e in 0..moe.num_experts {
                for p in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down] {
                    let (a, b) = (
                        hf.weights.expert(layer, e, p).unwrap(),
                        g.weights.expert(layer, e, p).unwrap(),
                    );
                    assert_eq!(
                        (a.shape, a.bytes),
                        (b.shape, b.bytes),
                        "layer {layer} expert {e} {p:?}"
                    );
                }
            }
        }
    }
}
