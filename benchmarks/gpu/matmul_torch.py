"""PyTorch peer for rafter's generated Vulkan matmul (examples/matmul_bench.rs): the same
f32 products on the same GPU, TF32 off (plain f32, like the SPIR-V kernel) and on.
Median of 7 rounds of 20 back-to-back products, synchronised per round.

python3 benchmarks/gpu/matmul_torch.py
"""
import time

import torch

SIZES = [(128, 768, 768), (128, 3072, 768), (128, 768, 3072), (1024, 1024, 1024), (4096, 4096, 4096)]
REPS, ROUNDS = 20, 7


def median_us(m, n, k):
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    c = torch.empty(m, n, device="cuda")
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(REPS):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / REPS)
    times.sort()
    return times[len(times) // 2] * 1e6


for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    for m, n, k in SIZES:
        us = median_us(m, n, k)
        print(f"torch {'tf32' if tf32 else 'f32'} matmul {m}x{n}x{k}: {us:.1f} us, {2*m*n*k/us/1e3:.0f} GFLOP/s")
