#!/usr/bin/env python3
"""PyTorch eager runner: torch.set_num_threads(--threads), one inter-op thread,
torch.inference_mode(). The model is re-created from torchvision/transformers
with export_models.py's seed (load_s is that build). See common.py."""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import torch  # noqa: E402


def main() -> int:
    args = common.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    import torch_models

    t0 = time.perf_counter()
    model = torch_models.build(args.model)
    load_s = time.perf_counter() - t0
    feeds = common.load_inputs(args.model)
    xs = [torch.from_numpy(feeds[n]) for n in common.input_names(args.model)]

    def call():
        with torch.inference_mode():
            return model(*xs)

    samples, out, warmup = common.time_calls(call, args.warmup, args.iters, args.budget)
    name = "output" if args.model in common.IMAGE_MODELS else "last_hidden_state"
    common.save_outputs(args.output_dir, {name: out.numpy()})
    common.report(samples, warmup, load_s=load_s, version=f"torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
