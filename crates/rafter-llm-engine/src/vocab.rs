//! A GGUF file's embedded tokenizer (`tokenizer.ggml.*`) as [`GgufVocab`].

use rafter_generate::GgufVocab;
use rafter_gguf::{GgufError, GgufFile};

/// Reads every `tokenizer.ggml.*` key [`GgufVocab`] holds (and `tokenizer.chat_template`);
/// errors name the key whose value has the wrong type. A file without `tokenizer.ggml.model`
/// has no tokenizer: `Ok(None)`.
pub fn gguf_vocab(f: &GgufFile) -> Result<Option<GgufVocab>, GgufError> {
    let k = |s: &str| format!("tokenizer.ggml.{s}");
    let Some(model) = f.get_opt::<&str>(&k("model"))? else {
        return Ok(None);
    };
    let tokens = f
        .get_string_array(&k("tokens"))?
        .iter()
        .map(str::to_string)
        .collect();
    let opt_u32 = |s: &str| f.get_opt::<u32>(&k(s));
    let opt_bool = |s: &str| f.get_opt::<bool>(&k(s));
    Ok(Some(GgufVocab {
        model: model.to_string(),
        pre: f.get_opt::<&str>(&k("pre"))?.map(str::to_string),
        tokens,
        token_type: match f.get(&k("token_type")) {
            Some(_) => Some(f.get_i32_array(&k("token_type"))?.to_vec()),
            None => None,
        },
        scores: match f.get(&k("scores")) {
            Some(_) => Some(f.get_f32_array(&k("scores"))?.to_vec()),
            None => None,
        },
        merges: match f.get(&k("merges")) {
            Some(_) => Some(
                f.get_string_array(&k("merges"))?
                    .iter()
                    .map(str::to_string)
                    .collect(),
            ),
            None => None,
        },
        bos_token_id: opt_u32("bos_token_id")?,
        eos_token_id: opt_u32("eos_token_id")?,
        unknown_token_id: opt_u32("unknown_token_id")?,
        padding_token_id: opt_u32("padding_token_id")?,
        eot_token_id: opt_u32("eot_token_id")?,
        eom_token_id: opt_u32("eom_token_id")?,
        add_bos_token: opt_bool("add_bos_token")?,
        add_eos_token: opt_bool("add_eos_token")?,
        add_space_prefix: opt_bool("add_space_prefix")?,
        chat_template: f
            .get_opt::<&str>("tokenizer.chat_template")?
            .map(str::to_string),
    }))
}
