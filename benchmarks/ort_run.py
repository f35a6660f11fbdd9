#!/usr/bin/env python3
"""Run an ONNX model once with ONNX Runtime (CPU EP) and print the process's peak RSS.

    .venv/bin/python benchmarks/ort_run.py MODEL.onnx --input NAME=FILE.npy ... [--threads 2]

For peak-RSS comparisons, run it under GNU time and read "Maximum resident set
size (kbytes)":

    /usr/bin/time -v .venv/bin/python benchmarks/ort_run.py .cache/models/bert_base.onnx \\
        --input input_ids=.cache/models/bert_base_inputs/input_ids.npy ...

(/usr/bin/time is the `time` package on Debian/Ubuntu: `apt-get install time`;
the shell builtin `time` has no -v.) The script also prints its own peak RSS
from getrusage(RUSAGE_SELF).ru_maxrss, which is the same number for this
process without GNU time.

Session: CPUExecutionProvider, intra_op_num_threads = --threads, everything
else at ORT's defaults (graph optimisation level ORT_ENABLE_ALL, CPU memory
arena on, sequential execution). Every graph input must be given; the model is
run once (session creation + one run) and the outputs are discarded, unless
--output-dir is given (then they are saved as NAME.npy, with NAME sanitised to
[A-Za-z0-9._-]).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time

import numpy as np
import onnxruntime as ort


def peak_rss_kib() -> int:
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r // 1024 if sys.platform == "darwin" else r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="path to the .onnx file")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="a graph input and the .npy file holding it (repeatable)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--output-dir", help="save the outputs here as NAME.npy")
    args = ap.parse_args()

    feeds: dict[str, np.ndarray] = {}
    for spec in args.input:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--input wants NAME=FILE.npy, got {spec!r}")
        if name in feeds:
            ap.error(f"--input {name} given twice")
        feeds[name] = np.load(path)

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    t0 = time.perf_counter()
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()

    want = [i.name for i in sess.get_inputs()]
    missing = [n for n in want if n not in feeds]
    extra = [n for n in feeds if n not in want]
    if missing or extra:
        sys.exit(f"ort_run: model inputs are {want}; missing {missing}, unknown {extra}")

    out_names = [o.name for o in sess.get_outputs()]
    outs = sess.run(out_names, feeds)
    t2 = time.perf_counter()

    print(f"ort_run: onnxruntime {ort.__version__}, CPUExecutionProvider, intra_op_threads {args.threads}")
    print(f"ort_run: model {args.model} ({os.path.getsize(args.model)} bytes)")
    for n, a in feeds.items():
        print(f"ort_run: input  {n} {a.dtype} {list(a.shape)}")
    for n, a in zip(out_names, outs):
        print(f"ort_run: output {n} {a.dtype} {list(a.shape)}")
    print(f"ort_run: session {1e3 * (t1 - t0):.1f} ms, run {1e3 * (t2 - t1):.1f} ms")
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        for n, a in zip(out_names, outs):
            np.save(os.path.join(args.output_dir, re.sub(r"[^A-Za-z0-9._-]", "_", n) + ".npy"), a)
    print(f"ort_run: max RSS {peak_rss_kib()} KiB (getrusage ru_maxrss)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
