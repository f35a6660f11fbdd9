"""The tiny checkpoints: each family's real config, shrunk, and how its weights are drawn.

Shrunk how: 2 layers (Gemma 3: 6, so that its 5-sliding : 1-global layer pattern, which
llama.cpp hard-codes, is there whole), hidden 256, every matrix's input width a multiple of
256 (so K-quants apply to every matrix and no tensor falls back to another type), the real
head_dim and query/KV head ratio, the real vocabulary, tying, rope, norms and special ids.
Each comment names the published config the numbers were taken from.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

SEED = 20251128


@dataclass
class Arch:
    name: str
    model_type: str  # transformers' model_type of the config
    tokenizer: str  # see tokenizers_from_gguf: "qwen3" | "llama3" | "gemma3"
    config: dict
    generation_config: dict
    chat_template: str | None = None  # file in the sdist's models/templates, else the tokenizer's
    shard: str | None = None  # max_shard_size for save_pretrained: write an index + shards
    gemma_norms: bool = False  # RMSNorm weight w is applied as (1 + w)
    system_role: bool = True  # the chat template takes a system message (else it is folded into the user's)
    seed: int = SEED  # set by gen_llm_fixtures's search for a seed without near-ties
    extra: dict = field(default_factory=dict)


ARCHS = {
    # Qwen/Qwen3-0.6B: hidden 1024, FFN 3072, 28 layers, 16 q / 8 kv heads, head_dim 128,
    # q/k RMSNorm, rope 1e6, tied embeddings.
    "qwen3": Arch(
        name="qwen3", model_type="qwen3", tokenizer="qwen3",
        config=dict(vocab_size=151936, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=128, hidden_act="silu",
                    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                    max_window_layers=2, bos_token_id=151643, eos_token_id=151645),
        generation_config=dict(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
                               do_sample=True, temperature=0.6, top_k=20, top_p=0.95),
        chat_template="Qwen-Qwen3-0.6B.jinja",
    ),
    # Qwen/Qwen3-30B-A3B: hidden 2048, 128 experts top-8 of width 768, 32 q / 4 kv heads,
    # head_dim 128, normalized top-k weights, untied. Shrunk to 8 experts top-2. Written
    # sharded (index + shards) to exercise that path.
    "qwen3-moe": Arch(
        name="qwen3-moe", model_type="qwen3_moe", tokenizer="qwen3",
        config=dict(vocab_size=151936, hidden_size=256, intermediate_size=768, moe_intermediate_size=256,
                    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, head_dim=128,
                    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
                    use_sliding_window=False, max_window_layers=2, router_aux_loss_coef=0.001,
                    output_router_logits=False, bos_token_id=151643, eos_token_id=151645),
        generation_config=dict(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
                               do_sample=True, temperature=0.6, top_k=20, top_p=0.95),
        chat_template="Qwen-Qwen3-0.6B.jinja", shard="100MB",
    ),
    # Qwen/Qwen2.5-0.5B-Instruct: hidden 896, FFN 4864, 24 layers, 14 q / 2 kv heads, head_dim
    # 64 (hidden / heads: the config has no head_dim), biases on q/k/v, rope 1e6, tied, an
    # unused sliding_window (use_sliding_window false). Shrunk to 4 q / 1 kv heads of 64:
    # hidden 256 fixes the query heads at 4, so the GQA ratio is 4 rather than 7. The
    # tokenizer is Qwen3's (Qwen2.5's BPE and <|im_start|> specials, a few more added).
    "qwen2": Arch(
        name="qwen2", seed=20251129, model_type="qwen2", tokenizer="qwen3",
        config=dict(vocab_size=151936, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, hidden_act="silu",
                    max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
                    max_window_layers=2, bos_token_id=151643, eos_token_id=151645),
        generation_config=dict(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
                               do_sample=True, temperature=0.7, top_k=20, top_p=0.8,
                               repetition_penalty=1.05),
        chat_template="Qwen-Qwen2.5-7B-Instruct.jinja",
    ),
    # meta-llama/Llama-3.2-1B-Instruct: hidden 2048, FFN 8192, 32 q / 8 kv heads, head_dim 64,
    # llama3 rope scaling (factor 32, original context 8192), rope 500000, tied embeddings.
    # SmolLM and TinyLlama share this architecture (LlamaForCausalLM).
    "llama3": Arch(
        name="llama3", seed=20251129, model_type="llama", tokenizer="llama3",
        config=dict(vocab_size=128256, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=64, hidden_act="silu",
                    max_position_embeddings=131072, rms_norm_eps=1e-5,
                    rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=8192),
                    rope_theta=500000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                    bos_token_id=128000, eos_token_id=[128001, 128008, 128009]),
        generation_config=dict(bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                               do_sample=True, temperature=0.6, top_p=0.9),
        chat_template="meta-llama-Llama-3.2-3B-Instruct.jinja",
    ),
    # google/gemma-2-2b-it: hidden 2304, FFN 9216, 26 layers, 8 q / 4 kv heads, head_dim 256,
    # query_pre_attn_scalar 256, a 4096-token sliding window on even layers (one rope, 10000),
    # attention scores soft-capped at 50 and logits at 30, gelu-tanh, tied, embeddings scaled
    # by sqrt(hidden), (1 + w) sandwich norms, no q/k norms. Shrunk: 6 layers (sliding and full
    # in turn: llama.cpp's fixed pattern; with 2, the scaled tied embedding outweighed the
    # branches and greedy runs repeated one token), 2 q / 1 kv heads, the window to 16 (below
    # the long and chat prompts). Gemma 2's own vocabulary (256,000) is not at hand: Gemma 3's tokenizer and
    # special ids stand in (its <start_of_turn>/<end_of_turn> are what Gemma 2's template writes).
    "gemma2": Arch(
        name="gemma2", model_type="gemma2", tokenizer="gemma3",
        config=dict(vocab_size=262144, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
                    sliding_window=16, rope_theta=10000.0, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, attention_bias=False, tie_word_embeddings=True,
                    bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0),
        generation_config=dict(bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
                               cache_implementation="hybrid"),
        chat_template="google-gemma-2-2b-it.jinja", system_role=False,
        gemma_norms=True,
    ),
    # google/gemma-3-1b-it: hidden 1152, FFN 6912, 26 layers, 4 q / 1 kv heads, head_dim 256,
    # query_pre_attn_scalar 256, sliding window 512 on 5 of every 6 layers (local rope 10000,
    # global 1e6), no softcapping (Gemma 3 dropped it for q/k norms), gelu-tanh, tied,
    # embeddings scaled by sqrt(hidden), (1 + w) norms. The window is shrunk to 16, below the
    # long and the chat prompt.
    "gemma3": Arch(
        name="gemma3", seed=20251129, model_type="gemma3_text", tokenizer="gemma3",
        config=dict(vocab_size=262144, hidden_size=256, intermediate_size=1536, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, rms_norm_eps=1e-6,
                    sliding_window=16, layer_types=["sliding_attention"] * 5 + ["full_attention"],
                    rope_theta=1000000.0, rope_local_base_freq=10000.0, final_logit_softcapping=None,
                    attn_logit_softcapping=None, attention_bias=False, tie_word_embeddings=True,
                    bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0),
        generation_config=dict(bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0, do_sample=True,
                               top_k=64, top_p=0.95, cache_implementation="hybrid"),
        gemma_norms=True,
    ),
}

# Qwen/Qwen3-0.6B itself, for the benchmarks (random weights, bf16).
BENCH = Arch(
    name="qwen3-0.6b-shape", model_type="qwen3", tokenizer="qwen3",
    config=dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                max_window_layers=28, bos_token_id=151643, eos_token_id=151645),
    generation_config=ARCHS["qwen3"].generation_config,
    chat_template="Qwen-Qwen3-0.6B.jinja",
)

# Spread of the logits (std over the vocabulary) the output projection is scaled for.
LOGIT_STD = 4.0
# Gain of the residual branches (o_proj, down_proj) over the embedding. With tied embeddings
# the current token's own embedding in the residual stream adds |e|^2 / rms(h) to its own
# logit; unless the branches outweigh the embedding, greedy decoding repeats one token.
RESIDUAL_GAIN = 4.0
# Gemma's post-attention / post-FFN norms set the branches' scale instead (its embedding is
# multiplied by sqrt(hidden)): weights near 8 do what RESIDUAL_GAIN does elsewhere.
GEMMA_POST_NORM = 8.0


def weight_std_and_mean(name: str, shape: tuple, arch: Arch, hidden: int) -> tuple[float, float]:
    """How each tensor is drawn: (std, mean) of a normal.

    Linear maps get std 1/sqrt(fan_in) so every activation stays near unit RMS (the residual
    branches' outputs RESIDUAL_GAIN times that, see there); q/k get 1.5x
    (or, with q/k norms, norm weights near 1.5) so attention is peaked rather than uniform and
    greedy decoding depends on the context; the output projection (or the tied embedding) is
    scaled so the logits spread LOGIT_STD; norm weights vary by 10% around 1 so a skipped or
    misplaced norm changes the output; the MoE router spreads its logits so experts differ.
    """
    if name.endswith(".bias"):  # Qwen2's q/k/v biases: large enough that leaving one out shows
        return 0.5, 0.0
    if "norm" in name:
        base = 1.5 if ("q_norm" in name or "k_norm" in name) else 1.0
        if arch.gemma_norms and ("post_attention_layernorm" in name or "post_feedforward_layernorm" in name):
            base = GEMMA_POST_NORM
        # Gemma stores w of (1 + w).
        return 0.1, (base - 1.0 if arch.gemma_norms else base)
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        tied = arch.config.get("tie_word_embeddings", False)
        if name.endswith("lm_head.weight") or tied:
            return LOGIT_STD / np.sqrt(hidden), 0.0
        return 1.0, 0.0
    fan_in = shape[-1]
    std = 1.0 / np.sqrt(fan_in)
    if name.endswith("mlp.gate.weight"):  # MoE router
        std *= 2.0
    if not arch.gemma_norms and (".o_proj." in name or "down_proj" in name):
        std *= RESIDUAL_GAIN
    has_qk_norm = arch.model_type in ("qwen3", "qwen3_moe", "gemma3_text")
    if not has_qk_norm and (".q_proj." in name or ".k_proj." in name):
        std *= 1.5
    return float(std), 0.0


def init_weights(model, arch: Arch) -> None:
    """Overwrite every parameter with numpy draws: seeded per tensor by (arch.seed, crc32(name)), so
    the weights are the same on every platform and do not shift when another tensor changes."""
    import torch

    hidden = arch.config["hidden_size"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            std, mean = weight_std_and_mean(name, tuple(p.shape), arch, hidden)
            rng = np.random.default_rng([arch.seed, zlib.crc32(name.encode())])
            w = rng.standard_normal(tuple(p.shape), dtype=np.float32)
            w *= np.float32(std)
            w += np.float32(mean)
            p.copy_(torch.from_numpy(w))


def build_config(arch: Arch):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(arch.model_type, **arch.config)
    cfg.architectures = [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                          "llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                          "gemma3_text": "Gemma3ForCausalLM"}[arch.model_type]]
    return cfg
