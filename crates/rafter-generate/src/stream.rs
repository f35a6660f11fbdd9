//! Streaming detokenization: text pieces as tokens arrive, never a broken character.
//!
//! Decoding one token at a time is wrong in two ways: a character may span tokens (byte
//! fallback `<0xE2><0x82><0xAC>`, or a byte-level piece ending mid-character), and
//! SentencePiece decoders drop the leading space of the first token of whatever they decode.
//! So each step decodes a short window of recent tokens twice, with and without the new ones,
//! and emits the difference once it no longer ends in U+FFFD (the mark of an incomplete
//! character), the method of Hugging Face's text-generation-inference.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// An incremental detokenizer over one [`Tokenizer`].
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix: usize,
    /// Tokens up to here have had their text emitted.
    read: usize,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tok,
            skip_special,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Starts after `context` (e.g. the prompt's last few tokens): the first generated
    /// token is decoded as a continuation, so a SentencePiece `▁word` keeps its space.
    pub fn with_context(mut self, context: &[u32]) -> Self {
        self.ids = context.to_vec();
        self.prefix = 0;
        self.read = context.len();
        self
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = self
            .tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let piece = match after.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            // A decoder rewrote earlier text (rare): emit past the common prefix.
            None => after[common_prefix(&before, &after)..].to_string(),
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        self.compact();
        Ok(Some(piece))
    }

    /// Drops tokens before the decode window, so a long stream keeps a short buffer.
    fn compact(&mut self) {
        if self.prefix > 64 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }

    /// The text of tokens still held back (an incomplete character at the end of the stream
    /// comes out as U+FFFD, as a full decode would show it).
    pub fn finish(&mut self) -> Result<String> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let before = self
            .tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(match after.strip_prefix(before.as_str()) {
            Some(rest) => rest.to_string(),
            None => after[common_prefix(&before, &after)..].to_string(),
        })
    }
}

/// Byte length of the longest common prefix of `a` and `b` that ends on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .unwrap_or(a.len().min(b.len()))
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_stops_at_characters() {
        assert_eq!(common_prefix("héllo", "hélp"), 4);
        assert_eq!(common_prefix("ab", "abc"), 2);
        assert_eq!(common_prefix("é", "è"), 0);
    }
}
