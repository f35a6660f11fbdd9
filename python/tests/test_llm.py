"""LLM generation on the tiny Qwen3 fixture against transformers' greedy tokens
(tests/fixtures/llm/expected.json), decoded by the `tokenizers` library."""

import json

import pytest

import rafter
from conftest import ROOT, llm_fixtures, need

STOP_IDS = {151643, 151645}  # Qwen3's <|endoftext|>, <|im_end|>


@pytest.fixture(scope="module")
def qwen():
    path = llm_fixtures() / "qwen3" / "hf-f32"
    return rafter.LLM(path, context=256), path


def expected():
    d = json.loads((ROOT / "tests" / "fixtures" / "llm" / "expected.json").read_text())
    return d["archs"]["qwen3"]


def reference_text(path, ids):
    tokenizers = need("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    cut = next((k for k, t in enumerate(ids) if t in STOP_IDS), len(ids))
    return tok.decode(ids[:cut], skip_special_tokens=True)


def test_generate_matches_transformers_greedy(qwen):
    llm, path = qwen
    prompts = json.loads((path.parent / "prompts.json").read_text())
    exp = expected()
    for name in ("short", "long"):
        text = prompts[name]["text"]
        assert llm.encode(text) == exp["prompts"][name]
        want = reference_text(path, exp["transformers_greedy"]["f32"][name])
        got = llm.generate(text, max_tokens=32)
        assert got == want
        streamed = list(llm.generate(text, max_tokens=32, stream=True))
        assert len(streamed) > 1 and "".join(streamed) == want


def test_mapped_weights_generate_the_same(qwen):
    # Weights memory-mapped from the files (mmap=True) instead of read into memory.
    llm, path = qwen
    mapped = rafter.LLM(path, context=256, mmap=True)
    text = json.loads((path.parent / "prompts.json").read_text())["short"]["text"]
    assert mapped.generate(text, max_tokens=16) == llm.generate(text, max_tokens=16)


def test_bf16_matmul_precision_generates_and_names_bad_values(qwen):
    # bf16 products (PyTorch's bf16 arithmetic) for the prompt; the Rust fixture tests hold
    # their logits to transformers'. Here: the option reaches the engine, and a bad value
    # is an error naming it.
    _, path = qwen
    fast = rafter.LLM(path, context=256, matmul_precision="bf16")
    text = json.loads((path.parent / "prompts.json").read_text())["long"]["text"]
    assert fast.generate(text, max_tokens=8)
    with pytest.raises(rafter.LLMError, match="matmul_precision: unknown matmul precision `fp8`"):
        rafter.LLM(path, matmul_precision="fp8")


def test_chat_matches_transformers_greedy(qwen):
    llm, path = qwen
    prompts = json.loads((path.parent / "prompts.json").read_text())
    messages = prompts["chat"]["messages"]
    want = reference_text(path, expected()["transformers_greedy"]["f32"]["chat"])
    assert llm.chat(messages, max_tokens=32) == want
    pairs = [(m["role"], m["content"]) for m in messages]
    assert "".join(llm.chat(pairs, max_tokens=32, stream=True)) == want


def test_sampling_is_seeded_and_stream_can_stop_early(qwen):
    llm, _ = qwen
    a = llm.generate("The quick brown fox", max_tokens=16, temperature=0.9, seed=5)
    b = llm.generate("The quick brown fox", max_tokens=16, temperature=0.9, seed=5)
    assert a == b
    stream = llm.generate("The quick brown fox", max_tokens=64, stream=True)
    first = next(stream)
    stream.close()  # stops generation; the model serves the next request
    assert isinstance(first, str)
    assert llm.generate("The quick brown fox", max_tokens=4) == llm.generate(
        "The quick brown fox", max_tokens=4)


def test_llm_errors(qwen, tmp_path):
    llm, _ = qwen
    with pytest.raises(rafter.LLMError, match="missing"):
        rafter.LLM(tmp_path / "missing")
    with pytest.raises(rafter.LLMError, match="CPU only"):
        rafter.LLM(tmp_path, device="vulkan")
    with pytest.raises(rafter.LLMError, match="context holds 256"):
        llm.generate("word " * 400, max_tokens=4)
    with pytest.raises(rafter.LLMError, match="has no 'content'"):
        llm.chat([{"role": "user"}])
    with pytest.raises(TypeError, match="temprature"):
        llm.chat([{"role": "user", "content": "hi"}], temprature=1.0)
