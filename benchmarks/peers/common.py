"""Shared pieces of the per-peer benchmark runners (benchmarks/peers/*.py).

Every runner is started by benchmarks/run.py in its own process, under the
.venv-bench interpreter, as

    python benchmarks/peers/<peer>.py --model NAME --threads T --warmup W --iters N
        [--budget S] [--output-dir D] [--workdir W]

It loads the model's sample inputs from .cache/models/<NAME>_inputs/, sets up
its runtime, runs W untimed calls and then up to N timed calls (stopping early,
after at least MIN_ITERS, once the timed calls have used --budget seconds, so
that a slow peer still finishes), saves the outputs of the last call to
--output-dir as NAME.npy, and prints exactly one line starting with
"RESULT " followed by a JSON object:

    median_ms, p10_ms, p90_ms, iters, warmup, samples_ms, peak_rss_mb
    (this process's VmHWM, in MiB: interpreter, imports, weights, everything),
    load_s (model load / session creation / build), compile_s (where a peer
    compiles in-process, e.g. torch.compile's first call), artifact_bytes (where there is one), and version strings.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(REPO, ".cache", "models")
MIN_ITERS = 3

IMAGE_MODELS = ("resnet50", "mobilenet_v2")
BERT_MODELS = ("bert_base", "minilm_l6")
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def parse_args(extra=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget", type=float, default=1e9,
                    help="seconds for the timed calls; stop early (after %d) past it" % MIN_ITERS)
    ap.add_argument("--output-dir")
    ap.add_argument("--workdir", help="a directory for compiled files, caches")
    if extra:
        extra(ap)
    return ap.parse_args()


def input_names(model: str) -> list[str]:
    return ["input"] if model in IMAGE_MODELS else list(BERT_INPUTS)


def load_inputs(model: str) -> dict[str, np.ndarray]:
    d = os.path.join(MODELS_DIR, f"{model}_inputs")
    return {n: np.load(os.path.join(d, sanitize(n) + ".npy")) for n in input_names(model)}


def peak_rss_mb() -> float:
    """This process's peak RSS in MiB: VmHWM, the high-water mark of its own address
    space. Not getrusage's ru_maxrss: Linux carries the parent's high-water mark into a
    child that was started by vfork + exec (Python's subprocess does), so ru_maxrss read
    the benchmark driver's peak (1.7 GB after it ran BERT-base in ONNX Runtime to count
    FLOPs) instead of the peer's. rafter reports VmHWM too."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def time_calls(call, warmup: int, iters: int, budget: float) -> tuple[list[float], object, int]:
    """Run `call` up to `warmup` times untimed, then time up to `iters` calls.

    Returns the timed calls' milliseconds, the last call's result and the
    number of warm-up calls made."""
    out = None
    start = time.perf_counter()
    for i in range(warmup):
        out = call()
        # a slow peer warms up for at most a quarter of the budget (at least one call)
        if time.perf_counter() - start > budget / 4:
            warmup = i + 1
            break
    samples: list[float] = []
    start = time.perf_counter()
    for i in range(iters):
        t0 = time.perf_counter()
        out = call()
        samples.append((time.perf_counter() - t0) * 1e3)
        if i + 1 >= MIN_ITERS and time.perf_counter() - start > budget:
            break
    return samples, out, warmup


def save_outputs(output_dir: str | None, outputs: dict[str, np.ndarray]) -> None:
    if not output_dir:
        return
    os.makedirs(output_dir, exist_ok=True)
    for n, a in outputs.items():
        np.save(os.path.join(output_dir, sanitize(n) + ".npy"), np.asarray(a))


def report(samples: list[float], warmup: int, **extra) -> None:
    res = {
        "median_ms": statistics.median(samples),
        "p10_ms": percentile(samples, 10),
        "p90_ms": percentile(samples, 90),
        "iters": len(samples),
        "warmup": warmup,
        "samples_ms": [round(s, 3) for s in samples],
        "peak_rss_mb": peak_rss_mb(),
    }
    res.update(extra)
    print("RESULT " + json.dumps(res), flush=True)
