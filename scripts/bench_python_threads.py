"""Benchmark: 4 Python threads calling one rafter model at once vs one call alone.

Not a test (timings on a shared machine are noisy): prints the median wall time of one
call, of 4 concurrent calls (one per thread, started together), their ratio, and checks
that every concurrent result equals the single-call result.

    .venv/bin/python scripts/bench_python_threads.py [--model bert|resnet18] [--reps 30]

Needs the installed `rafter` wheel (scripts/test_python.sh installs it); resnet18 needs
torch and torchvision.
"""

import argparse
import statistics
import threading
import time
from pathlib import Path

import numpy as np

import rafter

ROOT = Path(__file__).resolve().parents[1]


def model_and_inputs(name):
    if name == "bert":
        m = rafter.compile(ROOT / "tests/fixtures/bert_tiny/model.onnx", dims={"batch": 4, "seq": 64})
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 100, (4, 64), dtype=np.int64)
        return m, (ids, np.ones_like(ids))
    import torch
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return rafter.compile(net, (x,)), (x.numpy(),)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", choices=["bert", "resnet18"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    m, x = model_and_inputs(args.model)
    want = m(*x)
    for _ in range(5):
        m(*x)

    one = []
    for _ in range(args.reps):
        t = time.perf_counter()
        m(*x)
        one.append(time.perf_counter() - t)

    many = []
    for _ in range(args.reps):
        results = [None] * args.threads
        barrier = threading.Barrier(args.threads + 1)

        def work(k):
            barrier.wait()
            results[k] = m(*x)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(args.threads)]
        for th in threads:
            th.start()
        barrier.wait()
        t = time.perf_counter()
        for th in threads:
            th.join()
        many.append(time.perf_counter() - t)
        for r in results:
            np.testing.assert_array_equal(r, want)

    t1, tn = statistics.median(one), statistics.median(many)
    print(f"model {args.model}: one call {t1 * 1e3:.2f} ms; {args.threads} concurrent calls "
          f"{tn * 1e3:.2f} ms = {tn / t1:.2f}x one call (serial would be {args.threads}x); "
          f"median of {args.reps}; results identical")


if __name__ == "__main__":
    main()
