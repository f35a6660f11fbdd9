#!/usr/bin/env python3
"""llama.cpp's greedy run on the published Gemma 3 270M GGUF (the held-out real model that
scripts/gen_llm_fixtures.py keeps in .cache/llm-fixtures/_published), written to
tests/fixtures/llm/published-gemma3-270m.json: prompt ids, 48 greedy ids and each step's
top-5 logits, for crates/rafter-llm-engine/tests/fixtures.rs.

    .venv/bin/python scripts/published_gguf_reference.py [--fixtures DIR]
(needs benchmarks/setup_llama_cpp.sh's build for llama.cpp's bindings)."""
import argparse, hashlib, json, os, sys
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--fixtures", default=os.path.join(REPO, ".cache", "llm-fixtures"))
ap.add_argument("--llama-cpp", default=os.path.join(REPO, ".cache", "llama.cpp"))
args = ap.parse_args()
sys.path.insert(0, os.path.join(args.llama_cpp, "python"))
import llama_cpp as L  # noqa: E402

path = os.path.join(args.fixtures, "_published", "gemma-3-270m-q4_k_m.gguf")
sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
llm = L.Llama(path, n_ctx=256, n_batch=256, n_threads=1, n_threads_batch=1, logits_all=True,
              verbose=False)
prompt = "The capital of France is"
ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
llm.eval(ids)
greedy, tops = [], []
for _ in range(48):
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    order = np.argsort(-logits, kind="stable")[:5]
    tops.append([[int(i) for i in order], [round(float(logits[i]), 4) for i in order]])
    greedy.append(int(order[0]))
    llm.eval([int(order[0])])
out = {"gguf": "_published/gemma-3-270m-q4_k_m.gguf", "gguf_sha256": sha, "prompt": prompt,
       "prompt_ids": ids, "greedy": greedy, "top": tops,
       "text": llm.detokenize(greedy).decode("utf-8", "replace"),
       "llama_cpp_python": L.__version__, "kv_cache": "f16 (llama.cpp's default)"}
dst = os.path.join(REPO, "tests", "fixtures", "llm", "published-gemma3-270m.json")
json.dump(out, open(dst, "w"), indent=1)
print(f"wrote {dst}: {out['text']!r}")
