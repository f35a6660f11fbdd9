"""Benchmark: N Python threads calling one rafter model at once vs one call alone.

Not a test (timings on a shared machine are noisy). Per round: the median wall time of one
call, of N concurrent calls (one per Python thread, started together by a barrier), and
their ratio; then the median ratio over the rounds. Every concurrent result must equal the
single-call result. With `--call-threads 1` each call runs on one CPU thread, so on a
machine of C cores N calls that overlap take about N/C times one call (N=4, C=2: ~2x);
calls that serialised would take N times.

    .venv/bin/python scripts/bench_python_threads.py [--model resnet18|bert] \
        [--call-threads 1] [--threads 4] [--reps 10] [--rounds 5]

`--model numpy-matmul` (with OPENBLAS_NUM_THREADS=1) is the control without rafter: on a
machine whose cores are taken by other jobs it shows how much N threads can overlap there.

Needs the installed `rafter` wheel (scripts/test_python.sh installs it); resnet18 needs
torch and torchvision.
"""

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

import rafter

ROOT = Path(__file__).resolve().parents[1]


def model_and_inputs(name, call_threads):
    if name == "numpy-matmul":
        # The control, no rafter: numpy's matmul releases the GIL, one BLAS thread per
        # call (run with OPENBLAS_NUM_THREADS=1). What it shows is the machine's limit.
        a = np.random.default_rng(0).random((1000, 1000), dtype=np.float32)
        return (lambda m: m @ m), (a,)
    if name == "bert":
        m = rafter.compile(ROOT / "tests/fixtures/bert_tiny/model.onnx",
                           dims={"batch": 4, "seq": 64}, threads=call_threads)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 100, (4, 64), dtype=np.int64)
        return m, (ids, np.ones_like(ids))
    import torch
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return rafter.compile(net, (x,), threads=call_threads), (x.numpy(),)


def one_round(m, x, want, threads, reps):
    one = []
    for _ in range(reps):
        t = time.perf_counter()
        m(*x)
        one.append(time.perf_counter() - t)
    many = []
    for _ in range(reps):
        results = [None] * threads
        barrier = threading.Barrier(threads + 1)

        def work(k):
            barrier.wait()
            results[k] = m(*x)

        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for th in pool:
            th.start()
        barrier.wait()
        t = time.perf_counter()
        for th in pool:
            th.join()
        many.append(time.perf_counter() - t)
        for r in results:
            np.testing.assert_array_equal(r, want)
    return statistics.median(one), statistics.median(many)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", choices=["bert", "resnet18", "numpy-matmul"])
    ap.add_argument("--call-threads", type=int, default=1,
                    help="CPU threads of one call (rafter.compile(threads=...); 0: one per core)")
    ap.add_argument("--threads", type=int, default=4, help="Python threads calling at once")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    m, x = model_and_inputs(args.model, args.call_threads)
    want = m(*x)
    for _ in range(3):
        m(*x)
    ratios = []
    for r in range(args.rounds):
        t1, tn = one_round(m, x, want, args.threads, args.reps)
        ratios.append(tn / t1)
        print(f"round {r}: one call {t1 * 1e3:.1f} ms, {args.threads} concurrent calls "
              f"{tn * 1e3:.1f} ms = {tn / t1:.2f}x", flush=True)
    print(f"model {args.model}, {args.call_threads} CPU thread(s) per call, {os.cpu_count()} "
          f"cores: {args.threads} concurrent calls take {statistics.median(ratios):.2f}x one "
          f"call (median of {args.rounds} rounds of {args.reps}; serial would be "
          f"{args.threads}x); results identical")


if __name__ == "__main__":
    main()
