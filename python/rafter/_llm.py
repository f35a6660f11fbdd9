"""LLMs: open a model and generate text (the Python side of rafter._rafter.Llm)."""

from __future__ import annotations

import os
from typing import Iterator, List, Mapping, Optional, Sequence, Union

from rafter import _rafter
from rafter._rafter import LLMError

Message = Union[Mapping[str, str], Sequence[str]]


class LLM:
    """A decoder LLM, opened from a Hugging Face folder (config.json, safetensors,
    tokenizer.json), a GGUF file, or an LLM artifact written by ``rafter compile``.

    ``device`` is ``"cpu"`` (the LLM engine runs on the CPU today). ``context`` is the most
    positions (prompt and generated) a sequence may hold, default the model's trained
    context capped at 4096; ``threads`` the kernel threads (0: one per core);
    ``kv_type`` the KV cache's element type, ``"f16"`` (half the cache's memory and
    decode traffic; the default for GGUF files, as in llama.cpp) or ``"f32"`` (the
    default for Hugging Face folders). ``mmap=True`` keeps the weights memory-mapped from
    the files (no copy at open; the kernel may drop and re-read them under memory
    pressure) instead of reading them into memory backed by huge pages, which decodes
    faster. ``matmul_precision`` is how float (f32/f16/bf16) weights multiply a prompt:
    ``"f32"`` (f32-accurate, the default) or ``"bf16"`` (weights and activations rounded
    to bf16 as PyTorch computes a bf16 model: twice as fast on CPUs with AVX512-BF16;
    decode steps and quantized weights are unaffected).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        device: str = "cpu",
        context: Optional[int] = None,
        threads: int = 0,
        kv_type: Optional[str] = None,
        mmap: bool = False,
        matmul_precision: str = "f32",
    ):
        if device != "cpu":
            raise LLMError(f"device {device!r}: LLMs run on the CPU only for now")
        self._native = _rafter.Llm(os.fspath(path), context, threads, kv_type, mmap, matmul_precision)

    @property
    def context(self) -> int:
        """The positions (prompt and generated) a sequence may hold."""
        return self._native.context

    @property
    def architecture(self) -> str:
        """The model's architecture (``"Qwen3"``, ``"Llama"``...)."""
        return self._native.architecture

    def encode(self, text: str, add_special: bool = True) -> List[int]:
        """The token ids of ``text``."""
        return self._native.encode(text, add_special)

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        stop: Optional[Sequence[str]] = None,
        stream: bool = False,
    ) -> Union[str, Iterator[str]]:
        """Continues ``prompt``. Returns the generated text, or with ``stream=True`` an
        iterator of text pieces as they are decoded (closing it stops generation).

        Sampling as ``rafter generate``: ``temperature=0`` is greedy (the default);
        otherwise top-k (0: off), top-p (1: off), min-p (0: off) and the repetition penalty
        (1: off) filter, and ``seed`` makes the draw repeatable. Generation stops at the
        model's end-of-text tokens, after ``max_tokens``, or before the first of ``stop``.
        """
        ids = self._native.encode(prompt, True)
        return self._run(ids, max_tokens, temperature, top_k, top_p, min_p,
                         repetition_penalty, seed, stop, stream)

    def chat(self, messages: Sequence[Message], *, stream: bool = False, **sampling) -> Union[str, Iterator[str]]:
        """The assistant's reply to ``messages`` (``[{"role": "user", "content": "Hi"}]``),
        rendered with the model's chat template. Takes :meth:`generate`'s sampling
        arguments."""
        pairs = []
        for k, m in enumerate(messages):
            if isinstance(m, Mapping):
                try:
                    pairs.append((str(m["role"]), str(m["content"])))
                except KeyError as e:
                    raise LLMError(f"messages[{k}] has no {e.args[0]!r}") from None
            else:
                role, content = m
                pairs.append((str(role), str(content)))
        prompt = self._native.chat_prompt(pairs)
        # The template writes the model's own BOS where it wants one.
        ids = self._native.encode(prompt, False)
        params = dict(max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                      repetition_penalty=1.0, seed=0, stop=None)
        unknown = set(sampling) - set(params)
        if unknown:
            raise TypeError(f"chat() got unexpected arguments: {', '.join(sorted(unknown))}")
        params.update(sampling)
        return self._run(ids, stream=stream, **params)

    def _run(self, ids, max_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
             seed, stop, stream):
        if max_tokens < 0 or temperature < 0:
            raise LLMError("max_tokens and temperature must not be negative")
        pieces = self._native.start(ids, int(max_tokens), float(temperature), int(top_k),
                                    float(top_p), float(min_p), float(repetition_penalty),
                                    int(seed), list(stop or []))
        if stream:
            return _stream(pieces)
        return "".join(pieces)

    def __repr__(self) -> str:
        return f"rafter.LLM({self.architecture}, context {self.context})"


def _stream(pieces) -> Iterator[str]:
    try:
        yield from pieces
    finally:
        pieces.close()
