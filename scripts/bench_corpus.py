#!/usr/bin/env python3
"""Time each corpus model (scripts/make_corpus.py) on rafter's CPU runtime and on ONNX
Runtime's CPU provider, same inputs, same thread count, alternating the two several
rounds; prints per model the medians and their ratio.

    python scripts/bench_corpus.py CORPUS_DIR RAFTER_BIN [--threads N] [--rounds R]
        [--calls C] [MODEL...]

rafter: `rafter bench MODEL --input NAME=FILE.npy ... --threads N --iters C` (its last line,
`bench: median M ms, ...`); ORT: C timed `session.run` calls after 3 warm-up calls, with
`intra_op_num_threads = N`. The table reports, per model, the median over rounds of
each round's median.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def inputs_of(case):
    sd = os.path.join(case, "test_data_set_0")
    feeds = {}
    j = 0
    while os.path.exists(os.path.join(sd, f"input_{j}.pb")):
        t = onnx.load_tensor(os.path.join(sd, f"input_{j}.pb"))
        feeds[t.name] = numpy_helper.to_array(t)
        j += 1
    return feeds


def rafter_ms(bin_, model, npys, threads, calls):
    cmd = [bin_, "bench", model, "--threads", str(threads), "--iters", str(calls)]
    for name, path in npys.items():
        cmd += ["--input", f"{name}={path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"bench: median ([0-9.]+) ms", out)
    if not m:
        raise RuntimeError(f"no bench line in: {out[-500:]}")
    return float(m.group(1))


def ort_ms(model, feeds, threads, calls):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("rafter")
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    root = os.path.join(a.corpus, "node")
    models = a.models or sorted(os.listdir(root))
    tmp = tempfile.mkdtemp(prefix="rafter-bench-")
    print(f"| model | rafter ms | ORT {ort.__version__} ms | rafter / ORT |")
    print("|---|---|---|---|")
    for name in models:
        case = os.path.join(root, name)
        model = os.path.join(case, "model.onnx")
        feeds = inputs_of(case)
        npys = {}
        for k, v in feeds.items():
            p = os.path.join(tmp, f"{name}.{re.sub(r'[^A-Za-z0-9_]', '_', k)}.npy")
            np.save(p, v)
            npys[k] = p
        r, o = [], []
        try:
            for _ in range(a.rounds):
                r.append(rafter_ms(a.rafter, model, npys, a.threads, a.calls))
                o.append(ort_ms(model, feeds, a.threads, a.calls))
        except (subprocess.CalledProcessError, RuntimeError) as e:
            err = getattr(e, "stderr", None) or str(e)
            print(f"| {name} | error: {err.strip().splitlines()[-1][:120]} | | |")
            continue
        rm, om = statistics.median(r), statistics.median(o)
        print(f"| {name} | {rm:.3f} ({', '.join(f'{x:.3f}' for x in r)}) | "
              f"{om:.3f} ({', '.join(f'{x:.3f}' for x in o)}) | {rm / om:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
