//! End to end against independent references: tiny random-weight checkpoints of each
//! architecture (real configs shrunk, real tokenizers) made by `scripts/gen_llm_fixtures.py`,
//! with transformers' logits and greedy tokens, and llama.cpp's on the GGUFs its own
//! converter and quantizer wrote (see tests/fixtures/llm/README.md).
//!
//! - HF folders (f32, and bf16 weights): the last prefill position's logits at two prompt
//!   lengths and the next 8 decode steps' logits match transformers within 1e-4 of the
//!   largest logit, from one session (one compiled program), and 32 greedy tokens agree.
//! - GGUF at f32/f16/bf16/q8_0: the same greedy tokens as llama.cpp; at q4_0, q4_K_M,
//!   q5_K_M and q6_K, the top-1 token agrees with llama.cpp's on >= 90% of its 64 greedy
//!   steps (teacher-forced: both see llama.cpp's tokens).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use rafter_generate::{GenerateParams, LogitsModel, SamplerConfig};
use rafter_llm_engine::{Llm, LlmOptions, SessionModel};

fn fixtures() -> PathBuf {
    let dir = std::env::var_os("RAFTER_LLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/llm-fixtures"));
    assert!(
        dir.join("manifest.json").is_file(),
        "LLM fixtures not found in {}: make them with `scripts/setup_venv.sh --llm && \
         benchmarks/setup_llama_cpp.sh && .venv/bin/python scripts/gen_llm_fixtures.py` \
         (scripts/test.sh does), or point RAFTER_LLM_FIXTURES at them",
        dir.display()
    );
    dir
}

/// An .npy file's values (f32 or i64) as f64, with its shape.
fn npy(path: &Path) -> (Vec<usize>, Vec<f64>) {
    let t =
        rafter_reference::npy::read_npy(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let shape = t.shape().to_vec();
    let values = match &t {
        rafter_reference::Tensor::F32(a) => a.iter().map(|&v| v as f64).collect(),
        rafter_reference::Tensor::I64(a) => a.iter().map(|&v| v as f64).collect(),
        other => panic!("{}: unexpected dtype {}", path.display(), other.dtype()),
    };
    (shape, values)
}

fn ids(path: &Path) -> Vec<u32> {
    npy(path).1.into_iter().map(|v| v as u32).collect()
}

/// Rows of a 2-D .npy.
fn rows(path: &Path) -> Vec<Vec<f32>> {
    let (shape, v) = npy(path);
    v.chunks(shape[1])
        .map(|r| r.iter().map(|&x| x as f32).collect())
        .collect()
}

fn open(path: &Path) -> Llm {
    let options = LlmOptions {
        context: Some(128),
        threads: 2,
        ..Default::default()
    };
    Llm::open(path, &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .fold(0f64, |m, &x| m.max(x.abs() as f64))
        .max(1e-12);
    let err = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    err / scale
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

/// Greedy generation of `n` tokens with no stop token.
fn greedy(llm: &Llm, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut params = GenerateParams::new(llm.tokenizer(), n);
    params.sampler = SamplerConfig::greedy();
    params.stop_token_ids.clear();
    llm.generate(prompt, &params, |_| ControlFlow::Continue(()))
        .unwrap()
        .generated_ids
}

/// An HF folder against transformers' references `reference` (a folder under `ref/`).
fn check_hf(arch: &str, folder: &str, reference: &str) {
    let base = fixtures().join(arch);
    let llm = open(&base.join(folder));
    for prompt in ["short", "long"] {
        let r = base.join("ref").join(reference).join(prompt);
        let what = format!("{arch} {folder} vs transformers {reference} `{prompt}`");
        let prompt_ids = ids(&r.join("prompt_ids.npy"));
        let prefill = rows(&r.join("prefill_logits.npy"));
        let decode_in = ids(&r.join("decode_input_ids.npy"));
        let decode = rows(&r.join("decode_logits.npy"));
        let mut m = SessionModel::new(llm.session(), llm.context());
        m.reset();
        let got = m.forward(&prompt_ids).unwrap().to_vec();
        let e = rel_err(&got, prefill.last().unwrap());
        assert!(
            e <= 1e-4,
            "{what}: prefill logits differ by {e:.2e} of the largest"
        );
        for (step, (&t, want)) in decode_in.iter().zip(&decode).enumerate() {
            let got = m.forward(&[t]).unwrap().to_vec();
            let e = rel_err(&got, want);
            assert!(e <= 1e-4, "{what}: decode step {step} differs by {e:.2e}");
        }
        let want = ids(&r.join("greedy_ids.npy"));
        let got = greedy(&llm, &prompt_ids, want.len());
        assert_eq!(got, want, "{what}: greedy tokens");
    }
}

/// How our model follows llama.cpp's greedy ids `want` from `prompt`: the steps whose
/// top-1 token agrees when both see llama.cpp's tokens (teacher-forced), and our own
/// greedy continuation.
fn agreement(llm: &Llm, prompt: &[u32], want: &[u32]) -> (usize, Vec<u32>) {
    let mut m = SessionModel::new(llm.session(), llm.context());
    m.reset();
    let mut logits = m.forward(prompt).unwrap().to_vec();
    let mut agree = 0;
    for &t in want {
        agree += usize::from(argmax(&logits) == t);
        logits = m.forward(&[t]).unwrap().to_vec();
    }
    (agree, greedy(llm, prompt, want.len()))
}

/// Leading steps on which two greedy continuations agree.
fn same_steps(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A GGUF against llama.cpp's outputs on the same file: identical greedy tokens (`exact`),
/// or top-1 agreement on at least 90% of its steps. Prints both measures either way.
fn check_gguf(arch: &str, kind: &str, exact: bool) {
    let base = fixtures().join(arch);
    let llm = open(&base.join("gguf").join(format!("{arch}-{kind}.gguf")));
    for prompt in ["short", "long"] {
        let r = base
            .join("ref")
            .join(format!("llama.cpp-{kind}"))
            .join(prompt);
        let what = format!("{arch} {kind} vs llama.cpp `{prompt}`");
        let prompt_ids = ids(&r.join("prompt_ids.npy"));
        let want = ids(&r.join("greedy_ids.npy"));
        let (agree, same) = agreement(&llm, &prompt_ids, &want);
        println!(
            "{what}: top-1 agreement {agree}/{}, greedy identical for {same} steps",
            want.len()
        );
        if exact {
            let got = greedy(&llm, &prompt_ids, want.len());
            assert_eq!(
                got, want,
                "{what}: greedy tokens (first difference at step {same})"
            );
            continue;
        }
        let share = agree as f64 / want.len() as f64;
        assert!(
            share >= 0.9,
            "{what}: top-1 agrees on {agree} of {} steps",
            want.len()
        );
    }
}

/// Diagnostics (ignored): the agreement of every architecture's GGUFs (`KINDS`, default
/// `f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k`) with llama.cpp greedy ids kept under `REF_ROOT`
/// (default: the fixtures; same layout, `ARCH/ref/llama.cpp-KIND/PROMPT/greedy_ids.npy`),
/// e.g. ids llama.cpp made with other settings.
#[test]
#[ignore]
fn agreement_report() {
    let root = std::env::var_os("REF_ROOT").map_or_else(fixtures, PathBuf::from);
    let kinds = std::env::var("KINDS").unwrap_or("f16,q8_0,q4_0,q4_k_m,q5_k_m,q6_k".into());
    for arch in ["qwen3", "qwen3-moe", "llama3", "gemma3"] {
        for kind in kinds.split(',') {
            let gguf = fixtures()
                .join(arch)
                .join(format!("gguf/{arch}-{kind}.gguf"));
            let llm = open(&gguf);
            for prompt in ["short", "long"] {
                let r = root
                    .join(arch)
                    .join(format!("ref/llama.cpp-{kind}/{prompt}"));
                let want = ids(&r.join("greedy_ids.npy"));
                let (agree, got) = agreement(&llm, &ids(&r.join("prompt_ids.npy")), &want);
                let same = same_steps(&got, &want);
                println!(
                    "{arch} {kind} `{prompt}`: top-1 agreement {agree}/{}, greedy identical \
                     for {same} steps",
                    want.len()
                );
            }
        }
    }
}

macro_rules! hf_tests {
    ($($name:ident: $arch:literal),* $(,)?) => {$(
        mod $name {
            #[test]
            fn f32_matches_transformers() {
                super::check_hf($arch, "hf-f32", "hf-f32");
            }
            #[test]
            fn bf16_weights_match_transformers_in_f32() {
                super::check_hf($arch, "hf-bf16", "hf-bf16-as-f32");
            }
            #[test]
            fn gguf_f16_and_q8_0_match_llama_cpp() {
                super::check_gguf($arch, "f16", true);
                super::check_gguf($arch, "q8_0", true);
            }
            #[test]
            fn gguf_4_to_6_bit_agree_with_llama_cpp() {
                for kind in ["q4_0", "q4_k_m", "q5_k_m", "q6_k"] {
                    super::check_gguf($arch, kind, false);
                }
            }
        }
    )*};
}

hf_tests! {
    qwen3: "qwen3",
    qwen3_moe: "qwen3-moe",
    llama3: "llama3",
    gemma3: "gemma3",
}

/// Diagnostics (ignored): relative logit error against llama.cpp, and the gaps at
/// mismatching steps.
#[test]
#[ignore]
fn diagnose_gguf() {
    let arch = std::env::var("ARCH").unwrap_or("qwen3".into());
    let kind = std::env::var("KIND").unwrap_or("q8_0".into());
    let base = fixtures().join(&arch);
    let llm = open(&base.join("gguf").join(format!("{arch}-{kind}.gguf")));
    let r = base
        .join("ref")
        .join(format!("llama.cpp-{kind}"))
        .join("short");
    let prompt_ids = ids(&r.join("prompt_ids.npy"));
    let prefill = rows(&r.join("prefill_logits.npy"));
    let decode = rows(&r.join("decode_logits.npy"));
    let want = ids(&r.join("greedy_ids.npy"));
    let mut m = SessionModel::new(llm.session(), llm.context());
    m.reset();
    let mut logits = m.forward(&prompt_ids).unwrap().to_vec();
    println!(
        "prefill rel err {:.3e}",
        rel_err(&logits, prefill.last().unwrap())
    );
    let hf = rows(&base.join("ref/hf-f32/short/prefill_logits.npy"));
    println!(
        "prefill vs transformers f32 {:.3e}; llama.cpp vs transformers {:.3e}",
        rel_err(&logits, hf.last().unwrap()),
        rel_err(prefill.last().unwrap(), hf.last().unwrap())
    );
    for (i, &t) in want.iter().enumerate() {
        let mut s: Vec<f32> = logits.clone();
        s.sort_by(|a, b| b.total_cmp(a));
        let ours = argmax(&logits);
        if i < decode.len() + 1 && i > 0 {
            println!("step {i} rel err {:.3e}", rel_err(&logits, &decode[i - 1]));
        }
        if ours != t {
            println!(
                "step {i}: ours {ours} ({}) llama {t} ({}), our gap top1-top2 {}",
                logits[ours as usize],
                logits[t as usize],
                s[0] - s[1]
            );
        }
        logits = m.forward(&[t]).unwrap().to_vec();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rafter-engine-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `rafter compile`'s path: the artifact carries the tokenizer, and the model it holds
/// gives transformers' greedy tokens; a truncated copy is refused naming the file.
#[test]
fn compiled_artifacts_generate_alike() {
    let base = fixtures().join("qwen3");
    let options = LlmOptions {
        context: Some(64),
        ..Default::default()
    };
    let c = rafter_llm_engine::compile(&base.join("hf-f32"), &options, &mut |_| {}).unwrap();
    let dir = temp_dir("rfa");
    let path = dir.join("qwen3.rfa");
    c.write(&path).unwrap();
    let llm = Llm::open(&path, &LlmOptions::default()).unwrap();
    assert_eq!(llm.context(), 64);
    assert_eq!(llm.info().architecture, "Qwen3");
    let r = base.join("ref/hf-f32/short");
    let prompt = ids(&r.join("prompt_ids.npy"));
    let text = "The quick brown fox jumps over the";
    assert_eq!(llm.tokenizer().encode(text, true).unwrap(), prompt);
    assert_eq!(greedy(&llm, &prompt, 32), ids(&r.join("greedy_ids.npy")));
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.rfa");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = Llm::open(&cut, &LlmOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cut.rfa"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input gets errors that say what is wrong.
#[test]
fn missing_tokenizer_and_overlong_prompts_are_errors() {
    let src = fixtures().join("qwen3/hf-f32");
    let dir = temp_dir("notok");
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() != "tokenizer.json" {
            std::os::unix::fs::symlink(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let e = Llm::open(&dir, &LlmOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    let llm = Llm::open(
        &src,
        &LlmOptions {
            context: Some(16),
            ..Default::default()
        },
    )
    .unwrap();
    let long = ids(&fixtures().join("qwen3/ref/hf-f32/long/prompt_ids.npy"));
    let params = GenerateParams::new(llm.tokenizer(), 4);
    let e = llm
        .generate(&long, &params, |_| ControlFlow::Continue(()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("23") && e.contains("16"), "{e}");
}
