#!/usr/bin/env python3
"""Issue 24's GPU benchmark: three corpus models (scripts/make_corpus.py) on rafter's Vulkan
device against PyTorch on CUDA, same machine, same run.

  cnn_nhwc            the corpus CNN with an NHWC input (batch 2, 32x32);
  bert_quant_dynamic  the corpus BERT (2 layers, hidden 64, batch 2, seq 11) after ORT's
                      dynamic int8 quantizer;
  llm_nbits_gqa       one decode step of the corpus Llama-style decoder (2 layers, hidden
                      64, 4/2 heads, past 5) with MatMulNBits weights and GroupQueryAttention;
  llm_genai_builder_int4  ORT GenAI's model builder's int4 export of the corpus's tiny Llama
                      (same sizes, vocab 512): 4 new tokens after 3 cached.

The peer is PyTorch because ONNX Runtime's CUDA provider is not installable on the GPU
machine (its python3 has onnxruntime with the CPU provider only, and no internet). PyTorch
runs the same modules make_corpus.py exports (cnn_module; BertModel with the corpus config
and seed; LlamaForCausalLM with the decoder's config and a 5-token cache), in f32: PyTorch
has no CUDA kernels for the quantized forms, so its BERT and decoder run unquantized (their
quantized work is smaller, so this favours neither side much at these sizes: all three
models are launch-bound). Each PyTorch model is timed eager, as a captured CUDA graph and
compiled with torch.compile(mode="reduce-overhead") (CUDA graphs where a whole capture fails;
the best configurations for launch-bound models); each rafter model by `rafter bench
--device vulkan` on the corpus's own inputs. Rounds alternate rafter and PyTorch; the
report is the median over rounds of each round's median, in ms, with the ratio to the
fastest PyTorch configuration (eager, a captured CUDA graph, torch.compile with
mode="reduce-overhead").

    python3 benchmarks/gpu/corpus_torch.py CORPUS_DIR RAFTER_BIN [--rounds 3] [--calls 200]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))

MODELS = ["cnn_nhwc", "bert_quant_dynamic", "llm_nbits_gqa", "llm_genai_builder_int4"]
# CUDA on the GPU machine; the CPU only to check the script elsewhere (no graphs there).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def inputs_of(case):
    sd = os.path.join(case, "test_data_set_0")
    feeds, j = {}, 0
    while os.path.exists(os.path.join(sd, f"input_{j}.pb")):
        t = onnx.load_tensor(os.path.join(sd, f"input_{j}.pb"))
        feeds[t.name] = numpy_helper.to_array(t)
        j += 1
    return feeds


def rafter_ms(bin_, model, npys, calls):
    cmd = [bin_, "bench", model, "--device", "vulkan", "--warmup", "20", "--iters", str(calls)]
    for name, path in npys.items():
        cmd += ["--input", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"bench: median ([0-9.]+) ms", out)
    if not m:
        raise RuntimeError(f"no bench line in: {out[-500:]}")
    placed = re.search(r"\((\d+) kernels \((\d+) on vulkan\)\)", out)
    return float(m.group(1)), (placed.group(2), placed.group(1)) if placed else None


def torch_module(name, feeds):
    """The PyTorch module and its CUDA input tensors for corpus model `name`."""
    dev = DEV
    if name == "cnn_nhwc":
        from make_corpus import cnn_module

        return cnn_module(True).to(dev), (torch.tensor(feeds["image"], device=dev),)
    if name == "bert_quant_dynamic":
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=64, attn_implementation="eager")
        m = BertModel(cfg).eval().to(dev)

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, ids, mask, types):
                o = self.m(input_ids=ids, attention_mask=mask, token_type_ids=types)
                return o.last_hidden_state, o.pooler_output

        args = tuple(torch.tensor(feeds[k], device=dev)
                     for k in ("input_ids", "attention_mask", "token_type_ids"))
        return Wrap(m), args
    if name == "llm_nbits_gqa":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(7)
        cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
                          attn_implementation="eager")
        return llama_step(LlamaForCausalLM(cfg).eval().to(dev), feeds, 2)
    if name == "llm_genai_builder_int4":
        from make_corpus import genai_config, genai_llama

        cfg = genai_config()
        cfg._attn_implementation = "eager"
        return llama_step(genai_llama(cfg).to(dev), feeds, cfg.num_hidden_layers)
    raise ValueError(name)


def llama_step(m, feeds, layers):
    """A decoder step over the corpus inputs' cache: the module and its CUDA inputs."""
    dev = DEV
    past = [(torch.tensor(feeds[f"past_key_values.{l}.key"], device=dev),
             torch.tensor(feeds[f"past_key_values.{l}.value"], device=dev))
            for l in range(layers)]

    class Step(torch.nn.Module):
        """The new tokens over the cache (rebuilt from the same tensors every call, as the
        ONNX step takes its past as inputs)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            from transformers import DynamicCache

            cache = DynamicCache()
            for l, (k, v) in enumerate(past):
                cache.update(k, v, l)
            p = past[0][0].shape[2]
            pos = torch.arange(p, p + ids.shape[1], device=ids.device)[None]
            return self.m(input_ids=ids, attention_mask=mask, past_key_values=cache,
                          position_ids=pos, use_cache=True).logits

    args = (torch.tensor(feeds["input_ids"], device=dev),
            torch.tensor(feeds["attention_mask"], device=dev))
    return Step(m), args


def time_ms(fn, calls):
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_configs(module, args):
    """name -> a callable running one call: eager, and a captured CUDA graph when the
    module captures (else its error)."""
    out = {}
    with torch.inference_mode():
        out["eager"] = lambda: module(*args)
        if DEV != "cuda":
            return out
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    module(*args)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                module(*args)
            out["cuda graph"] = g.replay
        except Exception as e:  # noqa: BLE001 - report why a configuration is missing
            print(f"  cuda graph capture failed: {type(e).__name__}: {e}"[:300])
        # torch.compile's CUDA-graph mode: graphs around what it can capture, where a whole
        # capture fails (host copies in BERT's mask and the cache's bookkeeping).
        try:
            compiled = torch.compile(module, mode="reduce-overhead")
            for _ in range(3):
                compiled(*args)
            out["compile reduce-overhead"] = lambda: compiled(*args)
        except Exception as e:  # noqa: BLE001
            print(f"  torch.compile failed: {type(e).__name__}: {e}"[:300])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("rafter")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("models", nargs="*", default=MODELS)
    a = ap.parse_args()
    root = os.path.join(a.corpus, "node")
    tmp = tempfile.mkdtemp(prefix="corpus-torch-")
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else "no CUDA device: CPU"
    print(f"torch {torch.__version__}, {gpu}")
    rows = []
    for name in a.models:
        case = os.path.join(root, name)
        feeds = inputs_of(case)
        npys = {}
        for k, v in feeds.items():
            p = os.path.join(tmp, f"{name}.{k}.npy")
            np.save(p, v)
            npys[k] = p
        module, args = torch_module(name, feeds)
        configs = torch_configs(module, args)
        res = {"rafter": []} | {c: [] for c in configs}
        placed = None
        for _ in range(a.rounds):
            ms, placed = rafter_ms(a.rafter, os.path.join(case, "model.onnx"), npys, a.calls)
            res["rafter"].append(ms)
            with torch.inference_mode():
                for c, fn in configs.items():
                    res[c].append(time_ms(fn, a.calls))
        med = {k: statistics.median(v) for k, v in res.items()}
        best = min(v for k, v in med.items() if k != "rafter")
        print(f"{name}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in med.items())
              + f"; rafter / best torch {med['rafter'] / best:.2f}"
              + (f"; {placed[0]} of {placed[1]} kernels on vulkan" if placed else ""))
        rows.append((name, med, best, placed))
    print("\n| model | rafter vulkan ms | torch eager ms | torch CUDA graph ms | torch.compile "
          "reduce-overhead ms | rafter / best torch | kernels on GPU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v: "-" if v is None else f"{v:.4f}"
    for name, med, best, placed in rows:
        print(f"| {name} | {med['rafter']:.4f} | {med['eager']:.4f} | "
              f"{fmt(med.get('cuda graph'))} | {fmt(med.get('compile reduce-overhead'))} | "
              f"{med['rafter'] / best:.2f} | "
              f"{placed[0] + ' of ' + placed[1] if placed else '-'} |")


if __name__ == "__main__":
    main()
