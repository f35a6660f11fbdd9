#!/usr/bin/env python3
"""LLM peers on the Qwen3-0.6B-shaped benchmark model, in one run: llama.cpp (llama-bench) at
f16, q8_0, q4_0 and q4_K_M, PyTorch eager (transformers; f32 and bf16), and the machine's read
bandwidth, so that decode can be put against its roofline (weight bytes per token / bandwidth).

    scripts/setup_venv.sh --llm && benchmarks/setup_llama_cpp.sh
    .venv/bin/python scripts/gen_llm_fixtures.py --bench      # the model, ~5 min
    .venv/bin/python benchmarks/llm_peers.py [--threads 2] [--prompt 128] [--gen 128] [--reps 3]
        [--rafter 'target/release/rafter generate {model} --prompt-ids {prompt_ids} -n {gen} --threads {threads}']
        [--rafter-variant '--matmul-precision bf16']

Each measurement runs in its own process; its peak RSS is that process's (getrusage of a wrapper whose only child it is). llama.cpp
is also run at every thread count below --threads (one llama-bench call each) and each reported. At --threads, llama.cpp
and rafter alternate, one run each, --reps times, and each reports the medians. The --rafter
template is the slot for rafter: run once per rep and GGUF type ({model} = the .gguf, {type},
{threads}, {prompt} and {gen} = token counts, {prompt_ids} = a file of ids, one per line)
and its last line `generate: prompt P tokens at X tok/s, N tokens at Y tok/s, peak RSS R MB`
goes into the same table; each --rafter-variant adds its arguments to the template for
another row, run in turn with the others. Writes benchmarks/results/llm-peers-STAMP.{json,md} and prints the
table.

Like for like: every peer decodes --gen tokens after the --prompt tokens (llama-bench at depth
`-d PROMPT`; rafter and PyTorch after their prefill), and llama.cpp loads its weights in its
faster mode here (--llama-load-mode, `-lm none`), as rafter reads them into memory.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, ".cache", "llm-bench", "qwen3-0.6b-shape")
LLAMA_DIR = os.path.join(REPO, ".cache", "llama.cpp")
LLAMA_BIN = os.path.join(LLAMA_DIR, "build", "bin")
GGUF_PY = os.path.join(LLAMA_DIR, "src", "llama_cpp_python-0.3.36", "vendor", "llama.cpp", "gguf-py")
TYPES = ["f16", "q8_0", "q4_0", "q4_k_m"]


# A fresh interpreter whose only child is the command: its RUSAGE_CHILDREN peak RSS is the
# command's own (ru_maxrss of the largest child reaped, in KiB on Linux).
_RSS_WRAPPER = ("import resource, subprocess, sys\n"
                "r = subprocess.run(sys.argv[1:])\n"
                "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
                "sys.exit(r.returncode)\n")


def run_measured(cmd: list[str], timeout: float | None = None) -> tuple[str, float]:
    """stdout of cmd and its peak RSS in MB (TimeoutExpired past `timeout` seconds)."""
    p = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"llm_peers: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    kib = re.findall(r"peak_rss_kib (\d+)", p.stderr)[-1]
    return p.stdout, int(kib) / 1024.0


# ------------------------------------------------------------------ bandwidth

def membw(threads: int) -> float:
    exe = os.path.join(LLAMA_DIR, "membw")
    src = os.path.join(REPO, "benchmarks", "membw.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", src, "-o", exe], check=True)
    out = subprocess.run([exe, str(threads)], check=True, capture_output=True, text=True).stdout
    return float(re.search(r"read ([\d.]+) GB/s", out).group(1))


# ------------------------------------------------------------------ weight bytes per token

def gguf_bytes_per_token(path: str) -> int:
    """Bytes of weights a decode step reads: every tensor, except that with a separate output
    matrix only one row of the token embedding is read (counted as none)."""
    sys.path.insert(0, GGUF_PY)
    from gguf import GGUFReader

    r = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes:
        total -= sizes.get("token_embd.weight", 0)
    return total


# ------------------------------------------------------------------ llama.cpp

def llama_bench(gguf: str, threads: int, args, reps: int | None = None) -> list[dict]:
    """llama.cpp's prefill of --prompt tokens and its decode of --gen tokens after them, one
    llama-bench call each: decode runs at depth --prompt (`-d`), so its attention covers the
    same positions as rafter's (llama-bench's plain `-n` decodes from an empty context, which
    on this model was 1.1-1.2x faster than after 128 tokens). Weights load as --llama-load-mode
    says (`none`: read into memory, llama.cpp's faster decode here; `mmap` is its default)."""
    base = [os.path.join(LLAMA_BIN, "llama-bench"), "-m", gguf, "-t", str(threads), "-r", str(reps or args.reps),
            "-lm", args.llama_load_mode]
    res = {}
    for test in (["-p", str(args.prompt), "-n", "0"], ["-p", "0", "-n", str(args.gen), "-d", str(args.prompt)]):
        cmd = base + test + ["-o", "json"]
        try:
            out, rss = run_measured(cmd, args.timeout)
        except subprocess.TimeoutExpired:
            print(f"llm_peers: timed out after {args.timeout} s: {' '.join(cmd)}", flush=True)
            return []
        for row in json.loads(out):
            t = row["n_threads"]
            key = "prefill" if row["n_prompt"] > 0 else "decode"
            r = res.setdefault(t, {"threads": t, "peak_rss_mb": 0.0, "command": ""})
            r[key + "_tok_s"] = row["avg_ts"]
            r[key + "_stddev"] = row["stddev_ts"]
            r["peak_rss_mb"] = max(r["peak_rss_mb"], rss)
            r["command"] = (r["command"] + " ; " if r["command"] else "") + " ".join(cmd)
    return [r for r in res.values() if "prefill_tok_s" in r and "decode_tok_s" in r]


# ------------------------------------------------------------------ PyTorch eager

def torch_worker(dtype: str, threads: int, prompt: int, gen: int, reps: int) -> None:
    """Run in a child process: prefill `prompt` tokens and decode `gen` greedily, `reps` times
    after a warm-up; print the median tok/s as JSON."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(os.path.join(BENCH, "hf-bf16"), dtype=dt,
                                                 attn_implementation="eager").eval()
    seen, nbytes = set(), 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if name.endswith("embed_tokens.weight") and not model.config.tie_word_embeddings:
            continue  # one row per token
        nbytes += p.numel() * p.element_size()
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))

    def once(n_prompt: int, n_gen: int):
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(ids[:, :n_prompt], use_cache=True)
            t1 = time.perf_counter()
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(n_gen):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
        return n_prompt / (t1 - t0), n_gen / (t2 - t1)

    once(16, 4)
    runs = [once(prompt, gen) for _ in range(reps)]
    print(json.dumps({"prefill_tok_s": statistics.median(r[0] for r in runs),
                      "decode_tok_s": statistics.median(r[1] for r in runs),
                      "runs": runs, "weight_bytes_per_token": nbytes}))


def torch_eager(dtype: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", dtype, "--threads", str(args.threads),
           "--prompt", str(args.prompt), "--gen", str(args.gen), "--reps", str(args.reps)]
    out, rss = run_measured(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    r.update(threads=args.threads, peak_rss_mb=rss, command=" ".join(cmd))
    return r


# ------------------------------------------------------------------ rafter (the lead's slot)

GENERATE_LINE = re.compile(r"generate: prompt (\d+) tokens at ([\d.]+) tok/s, (\d+) tokens at ([\d.]+) tok/s, "
                           r"peak RSS ([\d.]+) MB")


def rafter(template: str, t: str, gguf: str, args) -> dict:
    ids_file = os.path.join(LLAMA_DIR, f"prompt-{args.prompt}.txt")
    with open(ids_file, "w") as f:
        f.write("\n".join(str((i * 7919) % 151643) for i in range(args.prompt)) + "\n")
    cmd = shlex.split(template.format(model=gguf, type=t, threads=args.threads, prompt=args.prompt, gen=args.gen,
                                      prompt_ids=ids_file))
    out, rss = run_measured(cmd)
    m = None
    for line in out.splitlines():
        m = GENERATE_LINE.search(line) or m
    if m is None:
        raise SystemExit(f"llm_peers: no 'generate: ...' line from {' '.join(cmd)}")
    return {"threads": args.threads, "prefill_tok_s": float(m.group(2)), "decode_tok_s": float(m.group(4)),
            "peak_rss_mb": float(m.group(5)), "peak_rss_mb_measured": rss, "command": " ".join(cmd)}


def median_row(runs: list[dict]) -> dict:
    """The median of each rate over `runs` (the largest peak RSS), with the runs kept."""
    row = dict(runs[0])
    for key in ("prefill_tok_s", "decode_tok_s"):
        row[key] = statistics.median(r[key] for r in runs)
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    row["runs"] = [{k: r[k] for k in ("prefill_tok_s", "decode_tok_s")} for r in runs]
    return row


# ------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per llama-bench run (a busy machine)")
    ap.add_argument("--llama-load-mode", default="none",
                    help="llama-bench -lm: none (weights read into memory: its faster decode on the 2-core Zen 4, "
                         "60.1 vs 59.4 and 51.9 vs 50.3 tok/s q4_0) or mmap (its default)")
    ap.add_argument("--rafter", help="command template for rafter (see above)")
    ap.add_argument("--rafter-variant", action="append", default=[], metavar="ARGS",
                    help="more arguments for another rafter row, run alternately with the others "
                         "(e.g. '--matmul-precision bf16'); repeatable")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(args.torch_worker, args.threads, args.prompt, args.gen, args.reps)
        return

    types = args.types.split(",")
    for t in types:
        if not os.path.exists(os.path.join(BENCH, "gguf", f"qwen3-0.6b-shape-{t}.gguf")):
            raise SystemExit(f"llm_peers: {BENCH}/gguf/qwen3-0.6b-shape-{t}.gguf missing: "
                             "run scripts/gen_llm_fixtures.py --bench")
    load = os.getloadavg()
    bw = membw(args.threads)
    print(f"llm_peers: read bandwidth {bw:.1f} GB/s ({args.threads} threads); load average {load[0]:.2f}", flush=True)
    rows = []
    for t in types:
        gguf = os.path.join(BENCH, "gguf", f"qwen3-0.6b-shape-{t}.gguf")
        wb = gguf_bytes_per_token(gguf)
        found = [r for t_ in range(1, args.threads) for r in llama_bench(gguf, t_, args)]
        # At --threads, llama.cpp and rafter alternate run by run (medians of --reps each):
        # this machine's read bandwidth drifted by 1.5x within minutes, and one block of
        # llama.cpp's runs then one of rafter's compared two different machines.
        variants = [""] + args.rafter_variant if args.rafter else []
        ours = {v: [] for v in variants}
        theirs = []
        for _ in range(args.reps):
            theirs += llama_bench(gguf, args.threads, args, reps=1)
            for v in variants:
                ours[v].append(rafter(f"{args.rafter} {v}".strip(), t, gguf, args))
        if theirs:
            found.append(median_row(theirs))
        for r in found:
            rows.append(dict(r, peer="llama.cpp", type=t, weight_bytes_per_token=wb))
            print(f"llm_peers: llama.cpp {t} t={r['threads']}: prefill {r['prefill_tok_s']:.1f} decode "
                  f"{r['decode_tok_s']:.2f} tok/s, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
        for v, runs in ours.items():
            r = median_row(runs)
            peer = f"rafter {v}".strip()
            rows.append(dict(r, peer=peer, type=t, weight_bytes_per_token=wb))
            print(f"llm_peers: {peer} {t}: prefill {r['prefill_tok_s']:.1f} decode {r['decode_tok_s']:.2f} "
                  f"tok/s, peak RSS {r['peak_rss_mb']:.0f} MB (runs: "
                  f"{', '.join(f'{x[0]:.0f}/{x[1]:.1f}' for x in ((q['prefill_tok_s'], q['decode_tok_s']) for q in runs))})",
                  flush=True)
    if not args.no_torch:
        for dt in ("f32", "bf16"):
            r = torch_eager(dt, args)
            rows.append(dict(r, peer="pytorch-eager", type=dt))
            print(f"llm_peers: pytorch {dt}: prefill {r['prefill_tok_s']:.1f} decode {r['decode_tok_s']:.2f} tok/s, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    # Bandwidth again at the end: on a shared machine the first reading may be a busy moment;
    # the roofline uses the better of the two.
    bw_end = membw(args.threads)
    print(f"llm_peers: read bandwidth at the end {bw_end:.1f} GB/s", flush=True)
    bw = max(bw, bw_end)
    for r in rows:
        r["roofline_decode_tok_s"] = bw * 1e9 / r["weight_bytes_per_token"]
        r["decode_fraction_of_roofline"] = r["decode_tok_s"] / r["roofline_decode_tok_s"]

    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    os.makedirs(args.out, exist_ok=True)
    result = {"model": "qwen3-0.6b-shape (random weights)", "prompt": args.prompt, "gen": args.gen,
              "threads": args.threads, "reps": args.reps, "read_bandwidth_gb_s": bw, "load_average": load,
              "load_average_end": os.getloadavg(),
              "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
              "rows": rows}
    with open(os.path.join(args.out, f"llm-peers-{stamp}.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = [f"# LLM peers, {stamp}: Qwen3-0.6B shape, prompt {args.prompt}, {args.gen} generated, "
          f"median of {args.reps}", "",
          f"Read bandwidth {bw:.1f} GB/s ({args.threads} threads, benchmarks/membw.c, the better of a reading "
          f"before and after); load average at start {load[0]:.2f}, at the end {os.getloadavg()[0]:.2f}. "
          "Roofline = bandwidth / weight bytes per token.", "",
          "| peer | type | threads | prefill tok/s | decode tok/s | peak RSS MB | weights MB/token | roofline tok/s | decode / roofline |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['peer']} | {r['type']} | {r['threads']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
                  f"{r['peak_rss_mb']:.0f} | {r['weight_bytes_per_token'] / 1e6:.0f} | "
                  f"{r['roofline_decode_tok_s']:.1f} | {r['decode_fraction_of_roofline']:.2f} |")
    md += ["", "Commands:", ""] + sorted({f"- `{r['command']}`" for r in rows})
    with open(os.path.join(args.out, f"llm-peers-{stamp}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
