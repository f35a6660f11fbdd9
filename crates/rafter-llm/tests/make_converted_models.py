#!/usr/bin/env python3
"""Tiny transformers checkpoints converted by llama.cpp's own converter, for
tests/real_converter.rs (RAFTER_LLM_CONVERTED_DIR=OUT).

    python make_converted_models.py LLAMA_CPP_DIR OUT

LLAMA_CPP_DIR is llama.cpp's source tree (vendor/llama.cpp of the llama-cpp-python 0.3.36
sdist); the Python needs torch and transformers (5.x), numpy and pyyaml. For Qwen3,
Qwen3-MoE, Llama 3 (llama3 rope scaling) and Gemma 3 it writes OUT/<name>/hf (random f32
weights, save_pretrained) and OUT/<name>/model-f32.gguf made by the converter's model
classes, exactly as convert_hf_to_gguf.py --outtype f32 runs them, except that the
vocabulary is not converted (set_vocab is replaced by a no-op: these checkpoints have no
real tokenizer, and the test is about weights and hyper-parameters). A dev check, not
run in CI; the LLM fixture pipeline makes real tokenized fixtures.
"""
import json
import shutil
import sys
from pathlib import Path

import torch

LLAMA = Path(sys.argv[1])
sys.path[:0] = [str(LLAMA / "gguf-py"), str(LLAMA)]
import gguf  # noqa: E402
from transformers import (Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM,
                          LlamaConfig, LlamaForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM)
from conversion.base import TextModel  # noqa: E402
import conversion  # noqa: E402  (registers the model classes)

OUT = Path(sys.argv[2])
V = 256
models = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
              rope_theta=1e6, max_position_embeddings=40960, bos_token_id=1, eos_token_id=2)),
    "qwen3moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=1, head_dim=32, tie_word_embeddings=False, rope_theta=1e6, max_position_embeddings=40960)),
    "llama": (LlamaForCausalLM, LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-5,
              max_position_embeddings=131072, rope_theta=500000.0,
              rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192})),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
              num_attention_heads=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
              max_position_embeddings=32768)),
}
TextModel.set_vocab = lambda self: None
for name, (model_cls, config) in models.items():
    torch.manual_seed(0)
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    hf = d / "hf"
    model = model_cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(hf)
    # Gemma's converter trims embeddings to the tokenizer's size: give it all 256 tokens.
    (hf / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(V)}}, "added_tokens": []}))
    arch = json.loads((hf / "config.json").read_text())["architectures"][0]
    klass = conversion.get_model_class(arch)
    for k in klass.__mro__:
        if "set_vocab" in k.__dict__:
            k.set_vocab = lambda self: None
    m = klass(hf, gguf.LlamaFileType.ALL_F32, d / "model-f32.gguf")
    m.write()
    print(name, "ok", (d / "model-f32.gguf").stat().st_size)
