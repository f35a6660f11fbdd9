//! The generation loop over deterministic fake models: the prefill/decode protocol, stop
//! tokens, stop strings across tokens (never streamed), cancellation, the token and context
//! limits, errors, and streaming of characters split over byte tokens.

use std::ops::ControlFlow;

use rafter_generate::{
    generate, Error, FinishReason, GenerateParams, GgufVocab, LogitsModel, SamplerConfig, Tokenizer,
};

/// A SentencePiece vocabulary: `<unk> <s> </s>`, the 256 byte tokens, then a few pieces.
fn tiny_tokenizer() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in [
        "▁", "▁Hello", "▁world", "▁ST", "OP", "▁more", "!", "S", "T", "O", "P",
    ] {
        tokens.push(t.into());
        types.push(1);
    }
    let n = tokens.len();
    Tokenizer::from_gguf_vocab(&GgufVocab {
        model: "llama".into(),
        tokens,
        token_type: Some(types),
        scores: Some((0..n).map(|i| -(i as f32)).collect()),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        ..Default::default()
    })
    .unwrap()
}

fn id(tok: &Tokenizer, t: &str) -> u32 {
    tok.token_to_id(t).unwrap_or_else(|| panic!("no token {t}"))
}

/// Emits a fixed script: after the prompt and `k` generated tokens, the logits favour
/// `script[k]` (then EOS-free filler 0). Records what it is fed.
struct Scripted {
    script: Vec<u32>,
    vocab: usize,
    fed: usize,
    prompt_len: Option<usize>,
    calls: Vec<Vec<u32>>,
    resets: usize,
    logits: Vec<f32>,
    max_context: usize,
    fail_at: Option<usize>,
}

impl Scripted {
    fn new(script: Vec<u32>, vocab: usize) -> Self {
        Scripted {
            script,
            vocab,
            fed: 0,
            prompt_len: None,
            calls: Vec::new(),
            resets: 0,
            logits: Vec::new(),
            max_context: 1 << 20,
            fail_at: None,
        }
    }
}

impl LogitsModel for Scripted {
    fn forward(
        &mut self,
        tokens: &[u32],
    ) -> Result<&[f32], Box<dyn std::error::Error + Send + Sync>> {
        if self.fail_at == Some(self.calls.len()) {
            return Err("device lost".into());
        }
        self.calls.push(tokens.to_vec());
        self.fed += tokens.len();
        let p = *self.prompt_len.get_or_insert(tokens.len());
        let k = self.fed - p;
        self.logits = vec![0.0; self.vocab];
        let next = self.script.get(k).copied().unwrap_or(0);
        self.logits[next as usize] = 10.0;
        Ok(&self.logits)
    }
    fn reset(&mut self) {
        self.fed = 0;
        self.prompt_len = None;
        self.resets += 1;
    }
    fn max_context(&self) -> usize {
        self.max_context
    }
}

fn collect(
    model: &mut Scripted,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
) -> (rafter_generate::Generation, Vec<String>) {
    let mut pieces = Vec::new();
    let g = generate(model, tok, prompt, params, |p| {
        pieces.push(p.to_string());
        ControlFlow::Continue(())
    })
    .unwrap();
    (g, pieces)
}

#[test]
fn prefill_then_one_token_at_a_time_until_max_tokens() {
    let tok = tiny_tokenizer();
    let script = vec![
        id(&tok, "▁Hello"),
        id(&tok, "▁world"),
        id(&tok, "!"),
        id(&tok, "▁more"),
    ];
    let mut m = Scripted::new(script.clone(), tok.vocab_size());
    let prompt = tok.encode("Hello", true).unwrap();
    let (g, pieces) = collect(&mut m, &tok, &prompt, &GenerateParams::new(&tok, 3));
    assert_eq!(g.generated_ids, script[..3]);
    assert_eq!(g.finish_reason, FinishReason::Length);
    // A continuation: the first piece keeps its leading space.
    assert_eq!(g.text, " Hello world!");
    assert_eq!(pieces.concat(), g.text);
    assert_eq!(m.resets, 1);
    assert_eq!(
        m.calls,
        vec![prompt.clone(), vec![script[0]], vec![script[1]]]
    );
    assert_eq!(g.prompt_ids, prompt);
    assert_eq!(g.timings.prompt_tokens, prompt.len());
    assert_eq!(g.timings.generated_tokens, 3);
    assert!(g.timings.prompt_seconds >= 0.0 && g.timings.generation_seconds >= 0.0);
}

#[test]
fn a_stop_token_ends_generation_and_stays_out_of_the_text() {
    let tok = tiny_tokenizer();
    let script = vec![id(&tok, "▁Hello"), 2, id(&tok, "▁world")];
    let mut m = Scripted::new(script, tok.vocab_size());
    let (g, pieces) = collect(&mut m, &tok, &[1], &GenerateParams::new(&tok, 10));
    assert_eq!(g.finish_reason, FinishReason::Stop);
    assert_eq!(g.generated_ids, [id(&tok, "▁Hello"), 2]);
    assert_eq!(g.text, "Hello");
    assert_eq!(pieces.concat(), "Hello");
}

#[test]
fn a_stop_string_across_tokens_is_never_streamed() {
    let tok = tiny_tokenizer();
    // " Hello ST" + "OP" + " more": the stop string "STOP" spans two tokens.
    let script = vec![
        id(&tok, "▁Hello"),
        id(&tok, "▁ST"),
        id(&tok, "OP"),
        id(&tok, "▁more"),
    ];
    let mut m = Scripted::new(script, tok.vocab_size());
    let mut params = GenerateParams::new(&tok, 10);
    params.stop_strings = vec!["STOP".into()];
    let (g, pieces) = collect(&mut m, &tok, &[1], &params);
    assert_eq!(g.finish_reason, FinishReason::Stop);
    assert_eq!(g.text, "Hello ");
    assert_eq!(pieces.concat(), "Hello ");
    assert!(pieces.iter().all(|p| !p.contains('S')), "{pieces:?}");
    // It stopped at the token completing the string, not later.
    assert_eq!(g.generated_ids.len(), 3);
}

#[test]
fn a_false_start_of_a_stop_string_is_released() {
    let tok = tiny_tokenizer();
    let script = vec![id(&tok, "▁ST"), id(&tok, "!"), id(&tok, "OP")];
    let mut m = Scripted::new(script, tok.vocab_size());
    let mut params = GenerateParams::new(&tok, 3);
    params.stop_strings = vec!["STOP".into()];
    let (g, pieces) = collect(&mut m, &tok, &[1], &params);
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.text, "ST!OP");
    assert_eq!(pieces.concat(), "ST!OP");
}

#[test]
fn the_callback_can_cancel() {
    let tok = tiny_tokenizer();
    let script = vec![id(&tok, "▁Hello"), id(&tok, "▁world"), id(&tok, "!")];
    let mut m = Scripted::new(script, tok.vocab_size());
    let mut seen = 0;
    let g = generate(&mut m, &tok, &[1], &GenerateParams::new(&tok, 10), |_| {
        seen += 1;
        if seen == 2 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Cancelled);
    assert_eq!(g.generated_ids.len(), 2);
    assert_eq!(g.text, "Hello world");
}

#[test]
fn the_context_bound_ends_generation() {
    let tok = tiny_tokenizer();
    let mut m = Scripted::new(vec![id(&tok, "!"); 10], tok.vocab_size());
    m.max_context = 5;
    let (g, _) = collect(&mut m, &tok, &[1, 1], &GenerateParams::new(&tok, 100));
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.generated_ids.len(), 3);
    // The last token was never fed: prefill + 2 decode calls, 4 of 5 positions.
    assert_eq!(m.calls.len(), 3);
}

#[test]
fn bad_prompts_and_model_failures_are_errors() {
    let tok = tiny_tokenizer();
    let mut m = Scripted::new(vec![], tok.vocab_size());
    m.max_context = 4;
    let params = GenerateParams::new(&tok, 5);
    let e = generate(
        &mut m,
        &tok,
        &[1; 4],
        &params,
        |_| ControlFlow::Continue(()),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::PromptTooLong {
                prompt: 4,
                max_context: 4
            }
        ),
        "{e}"
    );
    let e = generate(&mut m, &tok, &[], &params, |_| ControlFlow::Continue(())).unwrap_err();
    assert!(matches!(e, Error::EmptyPrompt), "{e}");
    let mut m = Scripted::new(vec![id(&tok, "!"); 5], tok.vocab_size());
    m.fail_at = Some(1);
    let e = generate(&mut m, &tok, &[1], &params, |_| ControlFlow::Continue(())).unwrap_err();
    assert!(e.to_string().contains("device lost"), "{e}");
}

#[test]
fn characters_split_over_byte_tokens_stream_whole() {
    let tok = tiny_tokenizer();
    // "é😀!" as byte-fallback tokens: C3 A9, F0 9F 98 80, then "!".
    let bytes: Vec<u32> = "é😀".bytes().map(|b| 3 + b as u32).collect();
    let mut script = bytes.clone();
    script.push(id(&tok, "!"));
    let mut m = Scripted::new(script.clone(), tok.vocab_size());
    let (g, pieces) = collect(&mut m, &tok, &[1], &GenerateParams::new(&tok, script.len()));
    assert_eq!(g.text, "é😀!");
    assert_eq!(pieces, ["é", "😀", "!"]);
}

#[test]
fn seeded_sampling_repeats() {
    let tok = tiny_tokenizer();
    // A model with a flat distribution: the draw decides everything.
    struct Flat(Vec<f32>);
    impl LogitsModel for Flat {
        fn forward(
            &mut self,
            _: &[u32],
        ) -> Result<&[f32], Box<dyn std::error::Error + Send + Sync>> {
            Ok(&self.0)
        }
        fn reset(&mut self) {}
        fn max_context(&self) -> usize {
            1000
        }
    }
    let mut flat = vec![f32::NEG_INFINITY; tok.vocab_size()];
    for t in ["▁Hello", "▁world", "!", "▁more"] {
        flat[id(&tok, t) as usize] = 0.0;
    }
    let run = |seed| {
        let mut p = GenerateParams::new(&tok, 20);
        p.sampler = SamplerConfig {
            seed,
            ..SamplerConfig::temperature(1.0, seed)
        };
        generate(&mut Flat(flat.clone()), &tok, &[1], &p, |_| {
            ControlFlow::Continue(())
        })
        .unwrap()
        .generated_ids
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}
