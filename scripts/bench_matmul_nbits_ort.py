#!/usr/bin/env python3
"""ONNX Runtime's CPU MatMulNBits on the shapes of crates/rafter-kernels-cpu/benches/nbits.rs
(K = N = 4096, 4-bit, block 32, zero points; M = 1 and 128; accuracy_level 0 and 4), for a
same-session comparison. Needs numpy, onnx, onnxruntime:

    python scripts/bench_matmul_nbits_ort.py [ITERS]
"""
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K = N = 4096
BLOCK = 32


def session(m, level, threads, packed, scales, zp):
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=BLOCK, accuracy_level=level)
    graph = helper.make_graph(
        [node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, N])],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "s"),
         numpy_helper.from_array(zp, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rng = np.random.default_rng(0)
    kb = K // BLOCK
    packed = rng.integers(0, 256, (N, kb, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(N * kb, dtype=np.float32) * 0.02).astype(np.float32)
    zp = rng.integers(0, 256, N * kb // 2, dtype=np.uint8)
    for threads in [1, 2]:
        for m in [1, 128]:
            for level in [0, 4]:
                s = session(m, level, threads, packed, scales, zp)
                a = rng.standard_normal((m, K)).astype(np.float32)
                times = []
                calls = iters * 10 if m == 1 else iters
                for i in range(calls + 3):
                    t = time.perf_counter()
                    s.run(None, {"a": a})
                    if i >= 3:
                        times.append(time.perf_counter() - t)
                med = float(np.median(times))
                print(f"ort threads {threads} m {m:3} accuracy_level {level}: median "
                      f"{med * 1e3:8.3f} ms, {2 * m * N * K / med / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
