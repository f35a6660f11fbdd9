#!/usr/bin/env python3
"""ONNX Runtime (CPU EP) runner: intra_op_num_threads = --threads, inter_op 1,
sequential execution, ORT_ENABLE_ALL graph optimisation (the default), memory
arena on (the default). load_s is session creation. See common.py."""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import onnxruntime as ort  # noqa: E402


def main() -> int:
    args = common.parse_args()
    feeds = common.load_inputs(args.model)
    path = os.path.join(common.MODELS_DIR, f"{args.model}.onnx")
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    load_s = time.perf_counter() - t0
    names = [o.name for o in sess.get_outputs()]
    samples, outs, warmup = common.time_calls(lambda: sess.run(names, feeds), args.warmup, args.iters, args.budget)
    common.save_outputs(args.output_dir, dict(zip(names, outs)))
    common.report(samples, warmup, load_s=load_s, version=f"onnxruntime {ort.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
