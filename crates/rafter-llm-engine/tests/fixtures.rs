//! End to end against independent references: tiny random-weight checkpoints of each
//! architecture (real configs shrunk, real tokenizers) made by `scripts/gen_llm_fixtures.py`,
//! with transformers' logits and greedy tokens, and llama.cpp's on the GGUFs its own
//! converter and quantizer wrote (see tests/fixtures/llm/README.md).
//!
//! - HF folders (f32, and bf16 weights): the last prefill position's logits at two prompt
//!   lengths and the next 8 decode steps' logits match transformers within 1e-4 of the
//!   largest logit, from one session (one compiled program), and 32 greedy tokens agree.
//!   With bf16 products (`MatmulPrecision::Bf16`), no further from the exact product than
//!   transformers' own bf16 model.
//! - GGUF at f16: llama.cpp's greedy tokens at every one of its 64 steps, but where its
//!   own top two logits tie within its numeric noise ([`TIE`]); at q8_0, q4_0, q4_K_M,
//!   q5_K_M and q6_K, the top-1 token agrees with llama.cpp's (teacher-forced: both see
//!   llama.cpp's tokens) at least as often as llama.cpp agrees with itself under another of
//!   its arithmetic settings (see [`check_gguf`]).
//! - The published Gemma 3 270M Q4_K_M GGUF: llama.cpp's greedy tokens exactly.

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
         benchmarks/setup_llama_cpp.sh --lib-only && .venv/bin/python scripts/gen_llm_fixtures.py` \
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

/// Opens a fixture with the default KV cache type, or the one `RAFTER_FIXTURE_KV_TYPE`
/// (`f16`, `f32`) names: a diagnostic, to print the agreement counts of both caches.
fn open(path: &Path) -> Llm {
    let kv_type = std::env::var("RAFTER_FIXTURE_KV_TYPE").ok().map(|w| {
        rafter_llm_engine::KvType::from_word(&w)
            .unwrap_or_else(|| panic!("RAFTER_FIXTURE_KV_TYPE={w}: f16 or f32"))
    });
    let options = LlmOptions {
        context: Some(128),
        threads: 2,
        kv_type,
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
        let recorded = llm.session().recordings_made();
        for (step, (&t, want)) in decode_in.iter().zip(&decode).enumerate() {
            let got = m.forward(&[t]).unwrap().to_vec();
            let e = rel_err(&got, want);
            assert!(e <= 1e-4, "{what}: decode step {step} differs by {e:.2e}");
        }
        // Every decode step, whatever the KV cache's length, reuses one recording.
        assert!(llm.session().records_every_length(), "{what}");
        // One recording, plus at most one more per step still held by a call in flight
        // when the next step records (recordings return to the cache when their call ends).
        let made = llm.session().recordings_made() - recorded;
        assert!(
            made <= 2,
            "{what}: {made} recordings for {} decode steps",
            decode.len()
        );
        let want = ids(&r.join("greedy_ids.npy"));
        let got = greedy(&llm, &prompt_ids, want.len());
        assert_eq!(got, want, "{what}: greedy tokens");
    }
}

/// llama.cpp's committed outputs (tests/fixtures/llm/expected.json: its greedy ids and the
/// top-5 logits of every step, for the GGUFs CI rebuilds bit for bit).
fn expected() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llm/expected.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// How far below llama.cpp's top logit a token may be and still count as its greedy
/// choice: llama.cpp itself is this far from an exact evaluation (its KV cache is f16 by
/// default: its f32 GGUF differs from transformers' f32 logits by ~1.4e-3 of the largest,
/// about 0.03 here), so a step whose top two are closer than this is a tie.
const TIE: f64 = 0.05;

/// A GGUF against llama.cpp's greedy run on the same file, teacher-forced (both see
/// llama.cpp's tokens), over its three prompts.
///
/// - f16 (`Bar::Exact`): at every step our top token is llama.cpp's, or ties with it
///   (within [`TIE`] by llama.cpp's own logits).
/// - Quantized types (`Bar::LlamaCppItself`): llama.cpp does not agree with itself there.
///   Its activations are rounded to 8 bits before every matmul, so an arithmetic difference
///   of one ulp upstream (its flash-attention kernel, an f32 instead of f16 KV cache) flips
///   roundings and moves these random-weight models' flat logits by 3-5% of the largest;
///   with the flash-attention kernel or an f32 KV cache it picks its default run's top token
///   on only 51-64 of 64 steps (`self_agreement` in expected.json, measured by
///   scripts/gen_llm_fixtures.py). Our agreement over the three prompts (a tie within [`TIE`] counts: that is where
///   llama.cpp's own runs flip) must
///   be at least the lower of llama.cpp's own two.
#[derive(Clone, Copy, PartialEq)]
enum Bar {
    Exact,
    LlamaCppItself,
}

fn check_gguf(arch: &str, kind: &str, bar: Bar) {
    let base = fixtures().join(arch);
    let llm = open(&base.join("gguf").join(format!("{arch}-{kind}.gguf")));
    let e = expected();
    let a = &e["archs"][arch];
    let (mut ours, mut tied, mut steps) = (0, 0, 0);
    let mut itself = [0u64; 2];
    for prompt in ["short", "long", "chat"] {
        let what = format!("{arch} {kind} vs llama.cpp `{prompt}`");
        let prompt_ids = u32s(&a["prompts"][prompt]);
        let run = &a["llama_cpp"][kind]["prompts"][prompt];
        let (agree, ties, n) = teacher_forced(&llm, &what, &prompt_ids, run, bar == Bar::Exact);
        ours += agree + ties;
        tied += ties;
        steps += n;
        if bar == Bar::LlamaCppItself {
            let s = &run["self_agreement"];
            for (k, name) in ["flash_attn", "f32_kv"].into_iter().enumerate() {
                itself[k] += s[name].as_u64().unwrap_or_else(|| {
                    panic!("{what}: expected.json has no self_agreement.{name}")
                });
            }
        }
    }
    if bar == Bar::LlamaCppItself {
        let need = itself[0].min(itself[1]) as usize;
        println!(
            "{arch} {kind}: rafter agrees with llama.cpp on {ours}/{steps} steps ({tied} of \
             them ties); llama.cpp with flash attention {}, with an f32 KV cache {}",
            itself[0], itself[1]
        );
        assert!(
            ours >= need,
            "{arch} {kind}: rafter agrees with llama.cpp on {ours} of {steps} steps, \
             llama.cpp with itself on {need}"
        );
    }
}

/// Feeds llama.cpp's greedy tokens (`run`: `greedy` ids and each step's `top` 5) after
/// `prompt_ids` and compares our top token at each step (see [`check_gguf`]); with
/// `exact`, any step that neither agrees nor ties fails. Returns (agree, ties, steps).
fn teacher_forced(
    llm: &Llm,
    what: &str,
    prompt_ids: &[u32],
    run: &serde_json::Value,
    exact: bool,
) -> (usize, usize, usize) {
    let want = u32s(&run["greedy"]);
    let tops = run["top"].as_array().unwrap();
    let mut m = SessionModel::new(llm.session(), llm.context());
    m.reset();
    let mut logits = m.forward(prompt_ids).unwrap().to_vec();
    let (mut agree, mut ties) = (0, 0);
    for (step, &t) in want.iter().enumerate() {
        let ours = argmax(&logits);
        if ours == t {
            agree += 1;
        } else {
            // llama.cpp's logit for our token, if it is in its top 5.
            let ids = u32s(&tops[step][0]);
            let vals: Vec<f64> = tops[step][1]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let gap = ids
                .iter()
                .position(|&i| i == ours)
                .map(|j| vals[0] - vals[j]);
            match gap {
                Some(g) if g <= TIE => ties += 1,
                _ if exact => panic!(
                    "{what}: step {step}: we pick {ours}, llama.cpp {t} (its top 5 {ids:?} \
                     {vals:?})"
                ),
                _ => {}
            }
        }
        logits = m.forward(&[t]).unwrap().to_vec();
    }
    println!("{what}: {agree}/{} agree, {ties} ties", want.len());
    (agree, ties, want.len())
}

/// The held-out real model: google/gemma-3-270m as published in GGUF (Q4_K_M, by
/// GGUF-my-repo), against llama.cpp's greedy runs on it
/// (tests/fixtures/llm/published-gemma3-270m.json, from scripts/published_gguf_reference.py).
///
/// llama.cpp's own logits on this model move by up to ~0.5 between its AVX-512 and AVX2
/// kernels (the file keeps a run of each; their greedy tokens are the same), more than
/// [`TIE`]: step 11's top two are 0.035 apart on one and 0.161 on the other. So, fed
/// llama.cpp's tokens, our token at every step must be llama.cpp's, or tie with it, in at
/// least one of its runs.
#[test]
fn published_gemma3_gguf_matches_llama_cpp() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/llm/published-gemma3-270m.json");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let gguf = fixtures().join(file["gguf"].as_str().unwrap());
    let llm = open(&gguf);
    let prompt = file["prompt"].as_str().unwrap();
    let ids = u32s(&file["prompt_ids"]);
    assert_eq!(
        llm.tokenizer().encode(prompt, true).unwrap(),
        ids,
        "tokenization"
    );
    let runs: Vec<(&String, &serde_json::Value)> = file["runs"]
        .as_object()
        .expect("runs per CPU family")
        .iter()
        .collect();
    let greedy = u32s(&runs[0].1["greedy"]);
    for (family, run) in &runs {
        assert_eq!(
            u32s(&run["greedy"]),
            greedy,
            "{family}: the runs' tokens differ"
        );
    }
    let mut m = SessionModel::new(llm.session(), llm.context());
    m.reset();
    let mut logits = m.forward(&ids).unwrap().to_vec();
    for (step, &t) in greedy.iter().enumerate() {
        let ours = argmax(&logits);
        // llama.cpp's logit gap from its top token to ours, per run (None: not in its top 5).
        let gaps: Vec<String> = runs
            .iter()
            .map(|(family, run)| {
                let top = &run["top"][step];
                let gap = u32s(&top[0])
                    .iter()
                    .position(|&i| i == ours)
                    .map(|j| top[1][0].as_f64().unwrap() - top[1][j].as_f64().unwrap());
                format!("{family}: {gap:?}")
            })
            .collect();
        let ok = ours == t
            || runs.iter().any(|(_, run)| {
                let top = &run["top"][step];
                u32s(&top[0])
                    .iter()
                    .position(|&i| i == ours)
                    .is_some_and(|j| {
                        top[1][0].as_f64().unwrap() - top[1][j].as_f64().unwrap() <= TIE
                    })
            });
        assert!(
            ok,
            "published gemma-3-270m q4_K_M: step {step}: we pick {ours}, llama.cpp {t}; its gap \
             to ours per run: {}",
            gaps.join(", ")
        );
        logits = m.forward(&[t]).unwrap().to_vec();
    }
    // A real model's logits are far from flat: its text is llama.cpp's, exactly.
    let text = llm.tokenizer().decode(&greedy, true).unwrap();
    assert_eq!(text, runs[0].1["text"].as_str().unwrap());
}

/// `--matmul-precision bf16` on an HF bf16 folder: the prefill (and, through the KV cache,
/// the decode steps) of bf16-rounded activations is no further from the exact product of
/// the bf16 weights (transformers in f32) than transformers' own bf16 model is, at every
/// step; and where the CPU runs bf16 products (AVX512-BF16) it is further than rafter's
/// default f32 products, so the rounding did happen.
fn check_bf16_products(arch: &str) {
    let base = fixtures().join(arch);
    let path = base.join("hf-bf16");
    let open_at = |precision| {
        let options = LlmOptions {
            context: Some(128),
            threads: 2,
            matmul_precision: precision,
            ..Default::default()
        };
        Llm::open(&path, &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (rounded, exact) = (
        open_at(rafter_llm_engine::MatmulPrecision::Bf16),
        open_at(rafter_llm_engine::MatmulPrecision::F32),
    );
    let r = base.join("ref");
    let prompt_ids = ids(&r.join("hf-bf16-as-f32/long/prompt_ids.npy"));
    assert!(
        prompt_ids.len() > 16,
        "the long prompt runs the prefill GEMM"
    );
    let want = rows(&r.join("hf-bf16-as-f32/long/prefill_logits.npy"));
    let torch_bf16 = rows(&r.join("hf-bf16/long/prefill_logits.npy"));
    let want_decode = rows(&r.join("hf-bf16-as-f32/long/decode_logits.npy"));
    let torch_decode = rows(&r.join("hf-bf16/long/decode_logits.npy"));
    let decode_in = ids(&r.join("hf-bf16-as-f32/long/decode_input_ids.npy"));
    // transformers' bf16 steps fed its own greedy tokens: comparable while they agree.
    let torch_in = ids(&r.join("hf-bf16/long/decode_input_ids.npy"));
    let same = decode_in
        .iter()
        .zip(&torch_in)
        .take_while(|(a, b)| a == b)
        .count();
    let mut m = SessionModel::new(rounded.session(), rounded.context());
    let mut e = SessionModel::new(exact.session(), exact.context());
    m.reset();
    e.reset();
    let got = m.forward(&prompt_ids).unwrap().to_vec();
    let ours = rel_err(&got, want.last().unwrap());
    let theirs = rel_err(torch_bf16.last().unwrap(), want.last().unwrap());
    let f32_err = rel_err(e.forward(&prompt_ids).unwrap(), want.last().unwrap());
    eprintln!(
        "{arch}: prefill logits from the exact product: bf16 products {ours:.2e}, f32 products \
         {f32_err:.2e}, transformers' bf16 {theirs:.2e}; {same} decode steps comparable"
    );
    assert!(
        ours <= theirs,
        "{arch}: bf16 products' prefill logits {ours:.2e} from the exact product,          transformers' bf16 {theirs:.2e}"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        assert!(
            ours > 4.0 * f32_err,
            "{arch}: bf16 products {ours:.2e} vs f32 products {f32_err:.2e}: not rounded?"
        );
    }
    let steps = decode_in.iter().zip(&want_decode).zip(&torch_decode);
    for (step, ((&t, w), torch)) in steps.take(same).enumerate() {
        let got = m.forward(&[t]).unwrap().to_vec();
        let (ours, theirs) = (rel_err(&got, w), rel_err(torch, w));
        assert!(
            ours <= theirs,
            "{arch}: decode step {step}: bf16 products {ours:.2e}, transformers' bf16 {theirs:.2e}"
        );
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
            fn bf16_products_no_further_from_exact_than_transformers_bf16() {
                super::check_bf16_products($arch);
            }
            #[test]
            fn gguf_f16_matches_llama_cpp() {
                super::check_gguf($arch, "f16", super::Bar::Exact);
            }
            #[test]
            fn gguf_quantized_agree_with_llama_cpp_as_it_does_with_itself() {
                for kind in ["q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"] {
                    super::check_gguf($arch, kind, super::Bar::LlamaCppItself);
                }
            }
        }
    )*};
}

hf_tests! {
    qwen2: "qwen2",
    qwen3: "qwen3",
    qwen3_moe: "qwen3-moe",
    llama3: "llama3",
    gemma2: "gemma2",
    gemma3: "gemma3",
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
    for map_weights in [false, true] {
        let options = LlmOptions {
            map_weights,
            ..Default::default()
        };
        let e = Llm::open(&cut, &options).err().unwrap().to_string();
        assert!(e.contains("cut.rfa") && e.contains("truncated"), "{e}");
    }
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

/// Diagnostics (ignored): how far our GGUF logits are from llama.cpp's on the same file
/// (last prefill position and the teacher-forced decode steps), next to how far llama.cpp's
/// own logits at that type are from its f16 ones, as max abs error / max abs logit.
#[test]
#[ignore]
fn logit_error_report() {
    let kinds = std::env::var("KINDS").unwrap_or("f16,q8_0,q4_0".into());
    for arch in ["qwen2", "qwen3", "qwen3-moe", "llama3", "gemma2", "gemma3"] {
        for kind in kinds.split(',') {
            let base = fixtures().join(arch);
            let llm = open(&base.join("gguf").join(format!("{arch}-{kind}.gguf")));
            for prompt in ["short", "long"] {
                let r = base.join(format!("ref/llama.cpp-{kind}/{prompt}"));
                let f = base.join(format!("ref/llama.cpp-f16/{prompt}"));
                let prompt_ids = ids(&r.join("prompt_ids.npy"));
                let greedy_ids = ids(&r.join("greedy_ids.npy"));
                let mut want = vec![rows(&r.join("prefill_logits.npy")).pop().unwrap()];
                want.extend(rows(&r.join("decode_logits.npy")));
                let mut f16 = vec![rows(&f.join("prefill_logits.npy")).pop().unwrap()];
                f16.extend(rows(&f.join("decode_logits.npy")));
                let mut m = SessionModel::new(llm.session(), llm.context());
                m.reset();
                let mut got = vec![m.forward(&prompt_ids).unwrap().to_vec()];
                for &t in &greedy_ids[..want.len() - 1] {
                    got.push(m.forward(&[t]).unwrap().to_vec());
                }
                let rel = |a: &[f32], b: &[f32]| {
                    let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top
                };
                let ours: f32 = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| rel(a, b))
                    .fold(0., f32::max);
                let theirs: f32 = want
                    .iter()
                    .zip(&f16)
                    .map(|(a, b)| rel(a, b))
                    .fold(0., f32::max);
                println!(
                    "{arch} {kind} `{prompt}` ({} steps): rafter vs llama.cpp {ours:.2e}; \
                     llama.cpp {kind} vs its f16 {theirs:.2e}",
                    want.len()
                );
            }
        }
    }
}
