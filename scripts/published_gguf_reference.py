#!/usr/bin/env python3
"""llama.cpp's greedy run on the published Gemma 3 270M GGUF (the held-out real model that
scripts/gen_llm_fixtures.py keeps in .cache/llm-fixtures/_published), written to
tests/fixtures/llm/published-gemma3-270m.json: prompt ids, 48 greedy ids and each step's
top-5 logits, for crates/rafter-llm-engine/tests/fixtures.rs.

llama.cpp's logits on this real Q4_K_M model move by up to ~0.5 between its AVX-512 and
AVX2 kernels (Zen 4 against Zen 3: step 18's top two 21.217 / 21.101 against 21.0945 /
21.0939), so the file keeps one run per CPU family (`runs`: "avx512", "avx2"), merged:
a run on this machine replaces only its own family's.

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
def cpu_family() -> str:
    """Which of ggml's x86 kernel families this CPU runs: "avx512" or "avx2" (else "other")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


dst = os.path.join(REPO, "tests", "fixtures", "llm", "published-gemma3-270m.json")
old = json.load(open(dst)) if os.path.exists(dst) else {}
if old and (old.get("gguf_sha256"), old.get("prompt_ids")) != (sha, ids):
    old = {}  # another file or prompt: the other families' runs no longer apply
run = {"greedy": greedy, "top": tops, "text": llm.detokenize(greedy).decode("utf-8", "replace")}
out = {"gguf": "_published/gemma-3-270m-q4_k_m.gguf", "gguf_sha256": sha, "prompt": prompt,
       "prompt_ids": ids, "llama_cpp_python": L.__version__, "kv_cache": "f16 (llama.cpp's default)",
       "runs": {**old.get("runs", {}), cpu_family(): run}}
json.dump(out, open(dst, "w"), indent=1)
print(f"wrote {dst} ({cpu_family()}): {run['text']!r}")
