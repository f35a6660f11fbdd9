//! What the tokenizer fuzz targets do with a tokenizer that loaded: encode and decode a few
//! texts (plain, Unicode, special-token markers), stream-decode, store and reload it, and
//! render its chat template. Each step may fail with an error; none may panic or hang.

use rafter_generate::{ChatRequest, ChatTemplate, Clock, Message, Tokenizer};

const TEXTS: &[&str] = &[
    "Hello, world! 123",
    " leading space and  double  spaces\n\ttabs",
    "héllo wörld — 你好 🤖",
    "<|im_start|>user\nhi<|im_end|><s></s><unk>",
];

pub fn exercise(tok: &Tokenizer) {
    for text in TEXTS {
        let Ok(ids) = tok.encode(text, true) else {
            continue;
        };
        let _ = tok.decode(&ids, false);
        let _ = tok.decode(&ids, true);
        let mut stream = tok.stream_decoder(false);
        for &id in &ids {
            let _ = stream.push(id);
        }
        let _ = stream.finish();
    }
    // Ids past the vocabulary decode to an error or nothing.
    let _ = tok.decode(&[u32::MAX, tok.vocab_size() as u32], false);
    if let Ok(json) = tok.to_json() {
        let back = Tokenizer::from_json(&json).expect("a stored tokenizer reloads");
        assert_eq!(back.stop_token_ids(), tok.stop_token_ids());
        assert_eq!(back.bos_id(), tok.bos_id());
        for text in TEXTS {
            assert_eq!(
                back.encode(text, true).ok(),
                tok.encode(text, true).ok(),
                "a reloaded tokenizer encodes {text:?} alike"
            );
        }
    }
    if let Some(source) = tok.chat_template() {
        let clock = Clock::Fixed(jiff::civil::date(2026, 1, 2).at(3, 4, 5, 0));
        if let Ok(t) = ChatTemplate::with_clock(source, &tok.bos_token(), &tok.eos_token(), clock)
        {
            let req = ChatRequest::new(&[
                Message::new("system", "Be brief."),
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello."),
                Message::new("user", "And?"),
            ]);
            let _ = t.render(&req);
        }
    }
}
