"""PyTorch CUDA peer for rafter's Vulkan benchmarks: the benchmark models built exactly as
scripts/export_models.py builds them (random init, fixed seed), batch 1 (BERT: seq 128),
eager f32 and f16 on the GPU, and the same replayed as a CUDA graph (what removes
PyTorch's per-op launch cost; the issue's "PyTorch best"). Median of `--iters` calls after
warm-up, each synchronised. f32 without TF32, like rafter's f32 kernels.

python3 benchmarks/gpu/torch_models.py [--iters 50] [--models resnet50,mobilenet_v2,bert_base]
Prints `torch <model> <dtype> <eager|cuda-graph>: median M ms` per model that can be built.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import export_models as em  # noqa: E402


def median_ms(fn, iters):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    args = ap.parse_args()
    wanted = set(args.models.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    makers = {
        "resnet50": em.make_resnet50,
        "mobilenet_v2": em.make_mobilenet_v2,
        "bert_base": em.make_bert_base,
    }
    for name, make in makers.items():
        if name not in wanted:
            continue
        try:
            model = make()
        except Exception as e:  # torchvision missing, etc.
            print(f"torch {name}: cannot build here ({type(e).__name__}: {e})")
            continue
        if name.startswith("bert") or name.startswith("minilm"):
            ids = torch.randint(0, 30000, (1, 128))
            inputs = (ids, torch.ones(1, 128, dtype=torch.long), torch.zeros(1, 128, dtype=torch.long))
        else:
            inputs = (torch.randn(1, 3, 224, 224),)
        for dtype in (torch.float32, torch.float16):
            m = model.to("cuda", dtype=dtype).eval()
            xs = tuple(x.to("cuda") if x.dtype == torch.long else x.to("cuda", dtype=dtype) for x in inputs)
            dt = str(dtype).split(".")[-1]
            with torch.no_grad():
                ms = median_ms(lambda: m(*xs), args.iters)
                print(f"torch {name} {dt} eager: median {ms:.3f} ms")
                # Capture one call as a CUDA graph (warm-up on a side stream first, as
                # PyTorch's docs require) and time its replays.
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        m(*xs)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph):
                        m(*xs)
                except RuntimeError as e:  # e.g. transformers' BERT copies its mask from the host
                    print(f"torch {name} {dt} cuda-graph: cannot capture ({str(e).splitlines()[0]})")
                    continue
                ms = median_ms(graph.replay, args.iters)
                print(f"torch {name} {dt} cuda-graph: median {ms:.3f} ms")


if __name__ == "__main__":
    main()
