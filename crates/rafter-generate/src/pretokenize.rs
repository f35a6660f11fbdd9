//! Byte-level BPE pre-tokenizers by GGUF `tokenizer.ggml.pre` name.
//!
//! llama.cpp splits text with a list of regular expressions chosen by the vocabulary's `pre`
//! name (src/llama-vocab.cpp, `llm_tokenizer_bpe`): each expression splits the pieces the
//! previous one made, and the text between matches stays a piece of its own. That is the
//! `tokenizers` library's `Split` pre-tokenizer with the `Isolated` behaviour, applied in
//! sequence. The patterns below are llama.cpp's (whose case-insensitive contractions are spelt
//! `'[sS]` instead of `(?i:'s)`, the same language).

/// The split rules of one `pre` name.
#[derive(Debug, Clone, PartialEq)]
pub struct PreTokenizerSpec {
    /// Regular expressions applied in order; each splits the pieces of the previous one.
    pub patterns: Vec<&'static str>,
    /// A word that is a whole vocabulary entry is taken as is, before any merge
    /// (llama.cpp's `ignore_merges`; the `tokenizers` BPE option of the same name).
    pub ignore_merges: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split rules llama.cpp uses for a byte-level BPE vocabulary whose `tokenizer.ggml.pre`
/// is `pre` (an absent `pre` is `default`, as in llama.cpp), or `None` for a name we do not
/// know.
pub fn pre_tokenizer_spec(pre: &str) -> Option<PreTokenizerSpec> {
    let spec = |patterns: Vec<&'static str>, ignore_merges: bool| PreTokenizerSpec {
        patterns,
        ignore_merges,
    };
    Some(match pre {
        "default" | "" => spec(
            vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => spec(vec![LLAMA3], true),
        "dbrx" | "smaug-bpe" => spec(vec![LLAMA3], false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" => spec(vec![QWEN2], false),
        "qwen35" => spec(vec![QWEN35], false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "mpt" | "olmo" | "jais" | "trillion" | "exaone4" => spec(vec![GPT2], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => spec(vec![r"\p{N}", GPT2], false),
        "falcon" => spec(
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            false,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::Split;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn split(pre: &str, text: &str) -> Vec<String> {
        let spec = pre_tokenizer_spec(pre).unwrap();
        let mut s = PreTokenizedString::from(text);
        for p in spec.patterns {
            let split = Split::new(
                tokenizers::pre_tokenizers::split::SplitPattern::Regex(p.into()),
                tokenizers::SplitDelimiterBehavior::Isolated,
                false,
            )
            .unwrap();
            split.pre_tokenize(&mut s).unwrap();
        }
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(t, _, _)| t.to_string())
            .collect()
    }

    #[test]
    fn every_pattern_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "qwen2",
            "qwen35",
            "gpt-2",
            "smollm",
            "falcon",
        ] {
            let spec = pre_tokenizer_spec(pre).unwrap();
            for p in spec.patterns {
                fancy_regex_compiles(p);
            }
        }
    }

    fn fancy_regex_compiles(p: &str) {
        Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(p.into()),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap_or_else(|e| panic!("{p}: {e}"));
    }

    // Hand-split by the rules of each pattern.
    #[test]
    fn llama3_groups_digits_by_three_and_keeps_contractions() {
        assert_eq!(
            split("llama-bpe", "I'M 12345 ok!!\n\n  x"),
            ["I", "'M", " ", "123", "45", " ok", "!!\n\n", " ", " x"]
        );
    }

    #[test]
    fn qwen2_splits_every_digit() {
        assert_eq!(split("qwen2", "a 123"), ["a", " ", "1", "2", "3"]);
    }

    #[test]
    fn smollm_isolates_digits_before_the_gpt2_rule() {
        assert_eq!(split("smollm", "x12 y"), ["x", "1", "2", " y"]);
        assert_eq!(split("gpt-2", "x12 y"), ["x", "12", " y"]);
    }

    #[test]
    fn unknown_names_are_none() {
        assert!(pre_tokenizer_spec("no-such-pre").is_none());
    }
}
