"""A model with a few kernels the Vulkan generator does not support in the middle of the
graph, for issue 26's "beats greedy-by-support" check.

A head and a tail of three 3x3 convolutions each (64 channels, 56x56, He-initialised so
activations keep a normal magnitude), and between them three LRNs (local response
normalisation across channels, as AlexNet and GoogLeNet place it between convolutions; the
Vulkan generator has no LRN kernel, so it runs on the CPU) with a cheap 1x1 convolution
after the first two. Greedy-by-support (`--device vulkan`) runs every convolution on the
GPU, so the middle crosses devices six times; the cost model can instead run the whole
middle (LRNs and the 1x1 convolutions) on the host and cross twice, keeping the heavy head
and tail on the GPU. (The CPU-only op was CumSum until the GPU learnt it: check that the
plan of `--device vulkan` still puts the LRNs on the CPU, or swap the op again.) Written with onnx's helpers (no torch), with one random input and ONNX Runtime's
output when onnxruntime is present.

    python3 benchmarks/gpu/export_midgraph.py [OUT_DIR]    (default .cache/models)
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

C, HW = 64, 56
HEAD = TAIL = 3


def build(rng):
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    def conv_relu(i, inp, k=3):
        w = (rng.standard_normal((C, C, k, k)) * np.sqrt(2.0 / (C * k * k))).astype(np.float32)
        pads = [k // 2] * 4
        nodes.append(helper.make_node("Conv", [inp, const(f"w{i}", w)], [f"c{i}"], pads=pads))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    def lrn(i, inp):
        # AlexNet's settings (size 5, alpha 1e-4, beta 0.75, bias 2): the output keeps the
        # input's magnitude within a factor of two.
        nodes.append(
            helper.make_node("LRN", [inp], [f"n{i}"], size=5, alpha=1e-4, beta=0.75, bias=2.0)
        )
        return f"n{i}"

    cur = "x"
    for i in range(HEAD):
        cur = conv_relu(i, cur)
    # The middle: LRN, 1x1 conv, LRN, 1x1 conv, LRN.
    cur = conv_relu(HEAD, lrn(0, cur), k=1)
    cur = conv_relu(HEAD + 1, lrn(1, cur), k=1)
    cur = lrn(2, cur)
    for i in range(HEAD + 2, HEAD + 2 + TAIL):
        cur = conv_relu(i, cur)
    graph = helper.make_graph(
        nodes,
        "midgraph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, C, HW, HW])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what opset 17 needs; newer onnx packages write IRs ORT refuses
    return model


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else ".cache/models"
    rng = np.random.default_rng(26)
    model = build(rng)
    onnx.checker.check_model(model)
    os.makedirs(os.path.join(out, "midgraph_inputs"), exist_ok=True)
    path = os.path.join(out, "midgraph.onnx")
    onnx.save(model, path)
    x = rng.standard_normal((1, C, HW, HW)).astype(np.float32)
    np.save(os.path.join(out, "midgraph_inputs", "x.npy"), x)
    try:
        import onnxruntime as ort
    except ImportError:
        print(f"wrote {path} (no onnxruntime: no reference output)")
        return
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    os.makedirs(os.path.join(out, "midgraph_outputs"), exist_ok=True)
    np.save(os.path.join(out, "midgraph_outputs", "y.npy"), y)
    print(f"wrote {path}; ORT output mean |y| {np.abs(y).mean():.3g}")


if __name__ == "__main__":
    main()
