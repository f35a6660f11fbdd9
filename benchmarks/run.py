#!/usr/bin/env python3
"""Benchmark rafter against its peers on the CPU, side by side in one run.

    benchmarks/setup_peers.sh                      # once: .venv-bench/ with the peers
    .venv-bench/bin/python scripts/export_models.py   # once: .cache/models/ (or .venv's)
    cargo build --release -p rafter-cli            # target/release/rafter
    benchmarks/run.py [--models resnet50,mobilenet_v2,bert_base,minilm_l6] [--threads 2]
                      [--warmup 5] [--iters 20] [--rounds 3] [--peers rafter,ort,torch,inductor,iree]
                      [--budget 60] [--timeout 600] [--out FILE]

(run.py re-executes itself under .venv-bench/bin/python when started otherwise.)

Peers, each in its own process, all with the same thread count T (and
OMP_NUM_THREADS=MKL_NUM_THREADS=T in their environment), batch 1, fp32, the
BERT models at seq 128:

  rafter    `rafter compile` (timed; artifact size) once per model, then per
            round `rafter bench ART --threads T --warmup W --iters N --input ...`,
            whose last line gives median/p10/p90 and the process's peak RSS;
            `rafter run ART --output-dir` once for the output check.
  ort       ONNX Runtime, CPU EP, intra_op T, inter_op 1 (peers/ort.py)
  torch     PyTorch eager, set_num_threads(T) (peers/torch_eager.py)
  inductor  torch.compile with TorchInductor; compile = the first call
            (peers/torch_inductor.py)
  iree      IREE llvm-cpu, data tiling + img2col, target-cpu=host, compiled once
            per model (timed; .vmfb size), local-task with T workers (peers/iree_llvmcpu.py)

For each model, every round runs every peer once, in the order given (so
drift from other load on the machine hits everyone). Each runner does up to
W warm-up and N timed calls, but stops after --budget seconds of timed calls
(at least 3) so that a slow peer (rafter's reference kernels today) still
finishes; the table gives the calls actually timed. A runner past --timeout
seconds is killed and reported as a timeout.

Reported per peer: median latency (the median over rounds of each round's
median), p10-p90 (the median over rounds of each round's p10 and p90), the
ratio to rafter (peer / rafter: above 1 means rafter is faster), peak RSS (the
runner process's VmHWM, median over rounds) with its ratio,
compile time and artifact size where the peer has them, and the output check:
every output against ONNX Runtime's saved outputs in .cache/models/<model>_outputs/,
max|diff| / max|ref| <= --rtol (relative, because the random-init mobilenet_v2's
logits are ~1e-9). Also the model's FLOPs (2 x the MACs of every Conv, MatMul
and Gemm, shapes taken from an ONNX Runtime run of the sample inputs) and the
fraction of the machine's FLOP/s and DRAM bandwidth (weights streamed once per
call) that rafter reaches.

The report goes to stdout and to benchmarks/results/<date>.md (with the raw
numbers in <date>.json beside it; `--render RUN.json [--out F]` re-renders a
saved run). It opens with the machine (CPU model, cores, ISA, load average at
start and end) and this machine's fp32 FMA peak and DRAM triad bandwidth as
measured at the start by benchmarks/ceilings.c (gcc -O2 -march=native -fopenmp).
The rafter binary is copied to .cache/bench/ first (its build time and sha256
are reported), so a rebuild of target/release/rafter during the run does not
mix two binaries.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(REPO, ".venv-bench", "bin", "python")
MODELS_DIR = os.path.join(REPO, ".cache", "models")
WORK = os.path.join(REPO, ".cache", "bench")
PEERS_DIR = os.path.join(REPO, "benchmarks", "peers")
ALL_MODELS = ["resnet50", "mobilenet_v2", "bert_base", "minilm_l6"]
ALL_PEERS = ["rafter", "ort", "torch", "inductor", "iree"]
PEER_SCRIPT = {"ort": "ort.py", "torch": "torch_eager.py", "inductor": "torch_inductor.py",
               "iree": "iree_llvmcpu.py"}
PEER_LABEL = {"rafter": "rafter", "ort": "ONNX Runtime", "torch": "PyTorch eager",
              "inductor": "torch.compile (Inductor)", "iree": "IREE llvm-cpu"}
# The machine's ceilings with 2 threads, as measured for issue 5 (fp32 FMA, DRAM).
PEAK_GFLOPS = 205.0
PEAK_GBS = 29.0

if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(REPO, ".venv-bench")):
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__), *sys.argv[1:]])

import numpy as np  # noqa: E402


def log(msg: str) -> None:
    print(f"run.py: {msg}", file=sys.stderr, flush=True)


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def input_files(model: str) -> dict[str, str]:
    names = ["input"] if model in ("resnet50", "mobilenet_v2") else [
        "input_ids", "attention_mask", "token_type_ids"]
    return {n: os.path.join(MODELS_DIR, f"{model}_inputs", sanitize(n) + ".npy") for n in names}


# ---------------------------------------------------------------- machine, versions


def machine_line() -> dict:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if x in flags]
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": isa, "mem": mem,
            "kernel": platform.release(), "python": platform.python_version()}


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


IMPORTS = {"ort": "import onnxruntime, numpy", "torch": "import torch, torchvision, numpy",
           "iree": "import iree.runtime, numpy"}


def import_rss() -> dict:
    """Peak RSS (MiB) of a process that only imports each peer's Python modules:
    the floor under that peer's numbers (torch's includes the CUDA libraries of
    PyPI's default wheel, loaded by `import torch` even on a CPU-only run)."""
    out = {}
    for k, stmt in IMPORTS.items():
        # VmHWM, as the peers report (see peers/common.py's peak_rss_mb).
        code = (f"{stmt}; print(next(int(l.split()[1]) for l in open('/proc/self/status') "
                f"if l.startswith('VmHWM:')))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        out[k] = int(p.stdout.strip()) / 1024 if p.returncode == 0 else None
    return out


def measure_ceilings(threads: int) -> dict:
    """Compile and run benchmarks/ceilings.c (fp32 FMA peak, DRAM triad) with gcc;
    {} if that fails. On a shared machine these read low: see the load average."""
    exe = os.path.join(WORK, "ceilings")
    src = os.path.join(REPO, "benchmarks", "ceilings.c")
    try:
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", src, "-o", exe], check=True,
                       capture_output=True)
        out = subprocess.run([exe, str(threads)], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        log(f"ceilings.c: {e}")
        return {}
    res = {}
    m = re.search(r"fp32 FMA ([\d.]+) GFLOP/s \(([^,]+),", out)
    if m:
        res["gflops"], res["isa"] = float(m.group(1)), m.group(2)
    m = re.search(r"DRAM triad ([\d.]+) GB/s", out)
    if m:
        res["gbs"] = float(m.group(1))
    res["load"] = loadavg()
    return res


def versions(rafter: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in ("numpy", "onnx", "onnxruntime", "torch", "torchvision", "transformers",
              "iree-base-compiler", "iree-base-runtime"):
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = "not installed"
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "crates"],
                               capture_output=True, text=True).stdout.strip()
        out["rafter"] = f"binary {rafter}; checkout at {rev}{' with crates/ modified' if dirty else ''}"
    except OSError:
        out["rafter"] = "?"
    out["gcc"] = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    return out


# ---------------------------------------------------------------- FLOPs


def count_flops(model: str) -> tuple[int, int]:
    """(FLOPs, weight bytes): 2 x MACs of Conv/MatMul/Gemm, with every operand's
    shape read from an ONNX Runtime run (no graph optimisation) of the sample
    inputs, so symbolic and computed shapes are exact. Cached in .cache/bench/."""
    import onnx
    import onnxruntime as ort

    path = os.path.join(MODELS_DIR, f"{model}.onnx")
    cache = os.path.join(WORK, "flops.json")
    key = f"{model}:{os.path.getsize(path)}:{int(os.path.getmtime(path))}"
    cached = json.load(open(cache)) if os.path.exists(cache) else {}
    if key in cached:
        return tuple(cached[key])
    m = onnx.load(path)
    init = {t.name: list(t.dims) for t in m.graph.initializer}
    weight_bytes = sum(int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                       for t in m.graph.initializer)
    nodes = [n for n in m.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")]
    want = []
    for n in nodes:
        for x in (n.input[0], n.input[1], n.output[0]):
            if x not in init and x not in want:
                want.append(x)
    have = {o.name for o in m.graph.output}
    for x in want:
        if x not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=x))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    del m
    feeds = {n: np.load(p) for n, p in input_files(model).items()}
    outs = dict(zip(want, sess.run(want, feeds)))
    shape = lambda x: list(outs[x].shape) if x in outs else init[x]  # noqa: E731
    macs = 0
    for n in nodes:
        out = shape(n.output[0])
        if n.op_type == "Conv":
            w = shape(n.input[1])  # [Cout, Cin/group, kh, kw]
            macs += int(np.prod(out)) * int(np.prod(w[1:]))
        elif n.op_type == "MatMul":
            macs += int(np.prod(out)) * shape(n.input[0])[-1]
        else:
            a = shape(n.input[0])
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            macs += int(np.prod(out)) * (a[0] if trans_a else a[1])
    res = (2 * macs, weight_bytes)
    cached[key] = list(res)
    os.makedirs(WORK, exist_ok=True)
    json.dump(cached, open(cache, "w"), indent=1)
    return res


# ---------------------------------------------------------------- checks


def check_outputs(model: str, out_dir: str, rtol: float) -> tuple[bool, str]:
    ref_dir = os.path.join(MODELS_DIR, f"{model}_outputs")
    worst = 0.0
    for f in sorted(os.listdir(ref_dir)):
        ref = np.load(os.path.join(ref_dir, f))
        p = os.path.join(out_dir, f)
        if not os.path.exists(p):
            return False, f"missing output {f}"
        got = np.load(p)
        if got.shape != ref.shape:
            return False, f"{f}: shape {list(got.shape)} != {list(ref.shape)}"
        scale = float(np.max(np.abs(ref))) or 1.0
        rel = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) / scale
        if not np.isfinite(rel):
            return False, f"{f}: non-finite"
        worst = max(worst, rel)
    return worst <= rtol, f"{worst:.1e}"


# ---------------------------------------------------------------- running


def run_proc(cmd: list[str], timeout: float, env=None) -> tuple[str, str | None, float]:
    """(stdout, error or None, wall s)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return "", f"timeout after {timeout:.0f} s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return p.stdout, f"exit {p.returncode}: " + " | ".join(tail), wall
    return p.stdout, None, wall


def parse_result(stdout: str) -> dict | None:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


BENCH_RE = re.compile(r"bench: median ([\d.]+) ms, p10 ([\d.]+) ms, p90 ([\d.]+) ms, peak RSS ([\d.]+) MB")
COMPILE_RE = re.compile(r"(\d+) kernels, (\d+) weight bytes, (\d+) artifact bytes")


class Bench:
    def __init__(self, args):
        self.a = args
        self.env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                        OPENBLAS_NUM_THREADS=str(args.threads))
        self.results: dict = {}

    # -- per-model setup: compiles, correctness of rafter

    def setup_rafter(self, model: str, r: dict) -> None:
        art = os.path.join(WORK, f"{model}.rfa")
        cmd = [self.a.rafter, "compile", os.path.join(MODELS_DIR, f"{model}.onnx"), "-o", art]
        if model in ("bert_base", "minilm_l6"):
            cmd += ["--dim", "batch=1", "--dim", "seq=128"]
        log(f"{model}: $ {shlex.join(cmd)}")
        out, err, wall = run_proc(cmd, self.a.timeout)
        if err:
            r["error"] = f"compile: {err}"
            return
        m = COMPILE_RE.search(out)
        r.update(compile_s=wall, artifact_bytes=os.path.getsize(art), compile_line=out.strip().splitlines()[-1])
        if m:
            r["kernels"], r["weight_bytes"] = int(m.group(1)), int(m.group(2))
        r["artifact"] = art
        # correctness, and a first estimate of a call's time
        od = os.path.join(WORK, "out", model, "rafter")
        cmd = [self.a.rafter, "run", art, "--output-dir", od] + self.inputs_flags(model)
        log(f"{model}: $ {shlex.join(cmd)}")
        _, err, wall = run_proc(cmd, self.a.timeout)
        if err:
            r["check"] = (False, f"run: {err}")
        else:
            r["check"] = check_outputs(model, od, self.a.rtol)
        r["est_call_s"] = wall

    def setup_iree(self, model: str, r: dict) -> None:
        note = os.path.join(REPO, ".venv-bench", "IREE_UNAVAILABLE")
        if os.path.exists(note):
            r["skip"] = "IREE not installed: " + open(note).read().strip()
            return
        cmd = [sys.executable, os.path.join(PEERS_DIR, "iree_llvmcpu.py"), "--model", model, "--compile",
               "--workdir", os.path.join(WORK, "iree")]
        log(f"{model}: $ {shlex.join(cmd)}")
        out, err, wall = run_proc(cmd, self.a.timeout, self.env)
        res = parse_result(out)
        if err or not res:
            r["error"] = f"compile: {err or 'no RESULT line'}"
            return
        r.update(compile_s=res["import_s"] + res["compile_s"], import_s=res["import_s"],
                 artifact_bytes=res["artifact_bytes"], flags=res["flags"])

    def inputs_flags(self, model: str) -> list[str]:
        out = []
        for n, p in input_files(model).items():
            out += ["--input", f"{n}={p}"]
        return out

    # -- one round of one peer

    def round_rafter(self, model: str, r: dict) -> dict:
        est = r.get("est_call_s", 1.0)
        if r.get("rounds"):
            est = statistics.median(x["median_ms"] for x in r["rounds"]) / 1e3
        iters = max(3, min(self.a.iters, int(self.a.budget / max(est, 1e-6))))
        warmup = max(1, min(self.a.warmup, int(self.a.budget / 4 / max(est, 1e-6))))
        cmd = [self.a.rafter, "bench", r["artifact"], "--threads", str(self.a.threads),
               "--warmup", str(warmup), "--iters", str(iters)] + self.inputs_flags(model)
        out, err, wall = run_proc(cmd, self.a.timeout, self.env)
        if err:
            return {"error": err}
        lines = [ln for ln in out.strip().splitlines() if ln.startswith("bench:")]
        m = BENCH_RE.search(lines[-1]) if lines else None
        if not m:
            return {"error": f"no bench line in: {out.strip()[-200:]}"}
        return {"median_ms": float(m.group(1)), "p10_ms": float(m.group(2)), "p90_ms": float(m.group(3)),
                "peak_rss_mb": float(m.group(4)), "iters": iters, "warmup": warmup, "wall_s": wall}

    def round_python(self, peer: str, model: str, r: dict, rnd: int) -> dict:
        od = os.path.join(WORK, "out", model, peer)
        cmd = [sys.executable, os.path.join(PEERS_DIR, PEER_SCRIPT[peer]), "--model", model,
               "--threads", str(self.a.threads), "--warmup", str(self.a.warmup), "--iters", str(self.a.iters),
               "--budget", str(self.a.budget), "--output-dir", od,
               "--workdir", os.path.join(WORK, peer if peer != "iree" else "iree")]
        out, err, wall = run_proc(cmd, self.a.timeout, self.env)
        res = parse_result(out)
        if err or not res:
            return {"error": err or "no RESULT line"}
        res["wall_s"] = wall
        res["check"] = check_outputs(model, od, self.a.rtol)
        return res

    def run_model(self, model: str) -> dict:
        rs = {p: {"rounds": []} for p in self.a.peers}
        flops, wbytes = count_flops(model)
        log(f"{model}: {flops / 1e9:.3f} GFLOP (2 x MACs of Conv/MatMul/Gemm), weights {wbytes / 1e6:.1f} MB")
        if "inductor" in rs:
            # a cold Inductor cache for this model's first round: its compile time is the cold one
            import shutil

            shutil.rmtree(os.path.join(WORK, "inductor"), ignore_errors=True)
        if "rafter" in rs:
            self.setup_rafter(model, rs["rafter"])
        if "iree" in rs:
            self.setup_iree(model, rs["iree"])
        for rnd in range(self.a.rounds):
            for peer in self.a.peers:
                r = rs[peer]
                if r.get("error") or r.get("skip"):
                    continue
                t0 = time.time()
                res = self.round_rafter(model, r) if peer == "rafter" else self.round_python(peer, model, r, rnd)
                res["load"] = loadavg()
                if res.get("error"):
                    log(f"{model} round {rnd + 1} {peer}: FAILED {res['error']}")
                    r.setdefault("round_errors", []).append(res["error"])
                    if "timeout" in res["error"] or rnd == 0:
                        r["error"] = res["error"]
                    continue
                r["rounds"].append(res)
                chk = res.get("check")
                comp = f", compile {res['compile_s']:.1f} s" if "compile_s" in res else ""
                chk_s = f", check {chk[1]}" if chk else ""
                log(f"{model} round {rnd + 1} {peer}: median {res['median_ms']:.2f} ms "
                    f"(p10 {res['p10_ms']:.2f}, p90 {res['p90_ms']:.2f}, {res['iters']} calls), "
                    f"RSS {res['peak_rss_mb']:.0f} MB{comp}{chk_s}, {time.time() - t0:.0f} s wall, load {res['load']}")
        return {"flops": flops, "weight_bytes": wbytes, "peers": rs}

    # -- summary

    @staticmethod
    def summarize(r: dict) -> dict | None:
        rounds = r.get("rounds") or []
        if not rounds:
            return None
        med = lambda k: statistics.median(x[k] for x in rounds)  # noqa: E731
        s = {"median_ms": med("median_ms"), "p10_ms": med("p10_ms"), "p90_ms": med("p90_ms"),
             "peak_rss_mb": med("peak_rss_mb"), "iters": sum(x["iters"] for x in rounds),
             "round_medians": [x["median_ms"] for x in rounds]}
        if "compile_s" in rounds[0]:  # inductor: the first (cold-cache) round's compile
            s["compile_s"] = rounds[0]["compile_s"]
            s["compile_s_warm"] = [x["compile_s"] for x in rounds[1:]]
        checks = [x["check"] for x in rounds if x.get("check")]
        if checks:
            s["check"] = (all(c[0] for c in checks), max(checks, key=lambda c: float(c[1]) if c[1][0].isdigit() else 1e9)[1])
        return s


def fmt_ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def render(models: dict, meta: dict, args) -> str:
    L = []
    L.append(f"## CPU latency vs peers, {meta['date']}")
    L.append("")
    L.append(f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores "
             f"({', '.join(meta['machine']['isa'])}), {meta['machine']['mem']}, Linux {meta['machine']['kernel']}; "
             f"load average {meta['load_start']} at start, {meta['load_end']} at end "
             f"(other agents' builds share the 2 cores: timings are noisy). "
             f"Ceilings used for the fractions: {PEAK_GFLOPS:.0f} GFLOP/s fp32 FMA and {PEAK_GBS:.0f} GB/s DRAM "
             f"with 2 threads (issue 5's measurements).")
    c = meta.get("ceilings") or {}
    if c:
        L.append("")
        L.append(f"Measured at the start of this run by benchmarks/ceilings.c ({args.threads} threads, best of 5, "
                 f"load {c['load']}): fp32 FMA {c.get('gflops', 0):.0f} GFLOP/s ({c.get('isa', '?').rstrip(',')}), "
                 f"DRAM triad {c.get('gbs', 0):.1f} GB/s. On a busy machine these read low.")
    L.append("")
    L.append("Import-only peak RSS (the floor under each Python peer's RSS): " + ", ".join(
        f"`{IMPORTS[k]}` {v:.0f} MB" for k, v in meta["import_rss"].items() if v is not None) +
        ". PyPI's default torch wheel is the CUDA build (the CPU wheel index is not reachable here); "
        "`import torch` maps its CUDA libraries, so the torch and Inductor RSS include them.")
    L.append("")
    L.append("Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".")
    L.append("")
    L.append(f"Settings: {args.threads} threads, batch 1, fp32, BERT models at seq 128; "
             f"{args.rounds} rounds, peers in the order {', '.join(args.peers)} within each round; "
             f"up to {args.warmup} warm-up and {args.iters} timed calls per runner per round, "
             f"capped at ~{args.budget:.0f} s of timed calls; output check rtol {args.rtol:g} "
             f"(max|diff| / max|ref| against ONNX Runtime's saved outputs). Ratios are peer / rafter: "
             f"below 1.00× the peer is faster (or smaller) than rafter. Medians and p10/p90 are the "
             f"median over rounds of each round's value, \"best round\" the lowest round median (the least "
             f"disturbed by other load); peak RSS is each runner process's "
             f"VmHWM (median over rounds); \"calls\" counts timed calls over all rounds.")
    L.append("")
    L.append(f"Command: `{meta['command']}`")
    c = meta.get("ceilings") or {}
    for model, mr in models.items():
        peers = mr["peers"]
        rs = {p: Bench.summarize(r) for p, r in peers.items()}
        base = rs.get("rafter")
        L.append("")
        wb = peers.get("rafter", {}).get("weight_bytes") or mr["weight_bytes"]
        L.append(f"### {model}: {mr['flops'] / 1e9:.2f} GFLOP, weights {mr['weight_bytes'] / 1e6:.1f} MB")
        L.append("")
        L.append("| peer | median ms | p10–p90 ms | best round ms | latency ×rafter | peak RSS MB | RSS ×rafter | "
                 "compile s | artifact MB | calls | output check (rel err) |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for p, r in peers.items():
            s = rs[p]
            label = PEER_LABEL[p]
            comp = r.get("compile_s")
            if s and "compile_s" in s:
                comp = s["compile_s"]
            comp_s = "—" if comp is None else f"{comp:.2f}" if comp < 10 else f"{comp:.0f}"
            if p == "inductor" and s and s.get("compile_s_warm"):
                comp_s += f" (warm cache {', '.join(f'{x:.0f}' for x in s['compile_s_warm'])})"
            art = r.get("artifact_bytes")
            art_s = "—" if art is None else f"{art / 1e6:.1f}"
            if p == "ort":
                art_s = f"({os.path.getsize(os.path.join(MODELS_DIR, model + '.onnx')) / 1e6:.1f} .onnx)"
            if r.get("skip"):
                L.append(f"| {label} | skipped: {r['skip']} | | | | | | | | | |")
                continue
            if not s:
                L.append(f"| {label} | **failed**: {r.get('error', '?')} | | | | | | {comp_s} | {art_s} | | |")
                continue
            chk = s.get("check") or r.get("check")
            chk_s = "?" if not chk else ("✓" if chk[0] else "**✗**") + f" ({chk[1]})"
            lr = s["median_ms"] / base["median_ms"] if base else None
            rr = s["peak_rss_mb"] / base["peak_rss_mb"] if base else None
            L.append(f"| {label} | {s['median_ms']:.1f} | {s['p10_ms']:.1f}–{s['p90_ms']:.1f} | "
                     f"{min(s['round_medians']):.1f} | {fmt_ratio(lr)} | "
                     f"{s['peak_rss_mb']:.0f} | {fmt_ratio(rr)} | {comp_s} | {art_s} | {s['iters']} | {chk_s} |")
            if r.get("round_errors"):
                L[-1] = L[-1][:-1] + f" round errors: {'; '.join(r['round_errors'])} |"
        if base:
            gf = mr["flops"] / (base["median_ms"] / 1e3) / 1e9
            gb = wb / (base["median_ms"] / 1e3) / 1e9
            L.append("")
            L.append(f"rafter: {gf:.2f} GFLOP/s = {100 * gf / PEAK_GFLOPS:.2f}% of {PEAK_GFLOPS:.0f} GFLOP/s; "
                     f"weights streamed once per call = {gb:.2f} GB/s = {100 * gb / PEAK_GBS:.2f}% of {PEAK_GBS:.0f} GB/s"
                     + (f" ({100 * gf / c['gflops']:.2f}% and {100 * gb / c['gbs']:.2f}% of this run's measured "
                        f"ceilings)" if c.get("gflops") and c.get("gbs") else "") + ". "
                     f"Round medians (ms): " + "; ".join(
                         f"{PEER_LABEL[p]} {', '.join(f'{x:.1f}' for x in rs[p]['round_medians'])}"
                         for p in peers if rs[p]) + ".")
            best = min(((rs[p]["median_ms"], p) for p in peers if p != "rafter" and rs[p]), default=None)
            if best:
                L.append(f"Fastest peer: {PEER_LABEL[best[1]]}, {best[0]:.1f} ms; "
                         f"rafter's median is {base['median_ms'] / best[0]:.1f}× that.")
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ALL_MODELS))
    ap.add_argument("--peers", default=",".join(ALL_PEERS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds of timed calls per runner per round (default 60)")
    ap.add_argument("--timeout", type=float, default=600.0, help="kill a runner after this many seconds")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--rafter", default=os.path.join(REPO, "target", "release", "rafter"))
    ap.add_argument("--out", help="markdown report (default benchmarks/results/<date>.md)")
    ap.add_argument("--render", metavar="RUN.json",
                    help="only re-render the report of an earlier run from its .json (to stdout, or --out)")
    args = ap.parse_args()
    if args.render:
        saved = json.load(open(args.render))
        text = render(saved["models"], saved["meta"], argparse.Namespace(**saved["args"]))
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        return 0
    args.models = [m for m in args.models.split(",") if m]
    args.peers = [p for p in args.peers.split(",") if p]
    for m in args.models:
        if m not in ALL_MODELS:
            ap.error(f"unknown model {m}; known: {ALL_MODELS}")
        if not os.path.exists(os.path.join(MODELS_DIR, f"{m}.onnx")):
            ap.error(f"{m}: no {MODELS_DIR}/{m}.onnx: run scripts/export_models.py first")
    for p in args.peers:
        if p not in ALL_PEERS:
            ap.error(f"unknown peer {p}; known: {ALL_PEERS}")
    if "rafter" in args.peers and not os.access(args.rafter, os.X_OK):
        ap.error(f"no rafter binary at {args.rafter}: cargo build --release -p rafter-cli")
    os.makedirs(WORK, exist_ok=True)
    if "rafter" in args.peers:
        # Run a private copy: target/release/rafter may be rebuilt while the run goes on.
        import hashlib
        import shutil

        digest = hashlib.sha256(open(args.rafter, "rb").read()).hexdigest()[:12]
        built = dt.datetime.fromtimestamp(os.path.getmtime(args.rafter)).strftime("%Y-%m-%d %H:%M")
        copy = os.path.join(WORK, "rafter.bin")
        shutil.copy2(args.rafter, copy)
        args.rafter_info = f"{os.path.relpath(args.rafter, REPO) if args.rafter.startswith(REPO) else args.rafter} " \
                           f"built {built}, sha256 {digest}"
        args.rafter = copy

    now = dt.datetime.now()
    meta = {"date": now.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(), "load_start": loadavg(),
            "versions": versions(getattr(args, "rafter_info", "not run")),
            "command": "benchmarks/run.py " + shlex.join(sys.argv[1:]), "import_rss": import_rss(),
            "ceilings": measure_ceilings(args.threads)}
    log(f"{meta['machine']['cpu']}, {meta['machine']['cores']} cores, load {meta['load_start']}")
    log("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    bench = Bench(args)
    models = {}
    for m in args.models:
        models[m] = bench.run_model(m)
    meta["load_end"] = loadavg()
    text = render(models, meta, args)
    print(text)

    out = args.out
    if not out:
        d = os.path.join(REPO, "benchmarks", "results")
        os.makedirs(d, exist_ok=True)
        base = now.strftime("%Y-%m-%d")
        out = os.path.join(d, base + ".md")
        i = 2
        while os.path.exists(out):
            out = os.path.join(d, f"{base}-{i}.md")
            i += 1
    with open(out, "w") as f:
        f.write(text)
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"meta": meta, "args": vars(args), "models": models}, f, indent=1, default=str)
    log(f"wrote {os.path.relpath(out, REPO)} and its .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
