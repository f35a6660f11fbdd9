//! BPE merges that reproduce SentencePiece-style (llama.cpp SPM) tokenization.
//!
//! llama.cpp's SPM tokenizer starts from the characters of the text and repeatedly joins the
//! adjacent pair whose concatenation is a vocabulary entry of the highest score (the leftmost
//! on a tie). A BPE model does the same when its merges are every pair `(a, b)` with `a`, `b`
//! and `a + b` all in the vocabulary, ranked by the score of `a + b`: the BPE loop always
//! applies the best-ranked pair present, leftmost first.

use std::collections::HashMap;

/// Every `(left, right)` split of every token into two tokens, best merged score first.
///
/// Ties between different merged tokens keep the lower id first; pairs of the same merged
/// token are ordered by the left piece's length (they can only compete when both are present
/// at once, which the tokenization's own order decides).
pub fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut found: Vec<(usize, usize, usize)> = Vec::new(); // (merged id, left len, left id)
    for (merged, text) in tokens.iter().enumerate() {
        for (cut, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(cut);
            if let (Some(&li), Some(_)) = (ids.get(l), ids.get(r)) {
                found.push((merged, cut, li));
            }
        }
    }
    found.sort_by(|a, b| {
        scores[b.0]
            .total_cmp(&scores[a.0])
            .then(a.0.cmp(&b.0))
            .then(a.1.cmp(&b.1))
    });
    found
        .into_iter()
        .map(|(m, cut, _)| {
            let (l, r) = tokens[m].split_at(cut);
            (l.to_string(), r.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_split_ranked_by_merged_score() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let m = merges_from_scores(&tokens, &scores);
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }

    #[test]
    fn multibyte_characters_are_never_cut() {
        let tokens: Vec<String> = ["é", "▁", "▁é"].iter().map(|s| s.to_string()).collect();
        let m = merges_from_scores(&tokens, &[0.0, 0.0, -1.0]);
        assert_eq!(m, [("▁".to_string(), "é".to_string())]);
    }
}
