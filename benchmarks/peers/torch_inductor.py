#!/usr/bin/env python3
"""torch.compile (TorchInductor, default mode, CPU) runner: as torch_eager.py,
with the model wrapped by torch.compile. compile_s is the first call (tracing,
Inductor codegen and the C++ compile of its kernels); it is not among the
warm-up or timed calls. Inductor's cache lives under --workdir, so the first
round pays a cold compile and later rounds a warm-cache one (run.py reports
the cold one). See common.py."""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

args = common.parse_args()
if args.workdir:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(args.workdir, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(args.workdir, "triton"))

import torch  # noqa: E402


def main() -> int:
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    import torch_models

    t0 = time.perf_counter()
    model = torch_models.build(args.model)
    load_s = time.perf_counter() - t0
    compiled = torch.compile(model)
    feeds = common.load_inputs(args.model)
    xs = [torch.from_numpy(feeds[n]) for n in common.input_names(args.model)]

    def call():
        with torch.inference_mode():
            return compiled(*xs)

    t0 = time.perf_counter()
    call()
    compile_s = time.perf_counter() - t0
    samples, out, warmup = common.time_calls(call, args.warmup, args.iters, args.budget)
    name = "output" if args.model in common.IMAGE_MODELS else "last_hidden_state"
    common.save_outputs(args.output_dir, {name: out.numpy()})
    common.report(samples, warmup, load_s=load_s, compile_s=compile_s,
                  version=f"torch {torch.__version__} (inductor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
