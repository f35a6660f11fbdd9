"""A model with a few kernels the Vulkan generator does not support in the middle of the
graph, for issue 26's "beats greedy-by-support" check.

Eight 3x3 convolutions (64 channels, 56x56, He-initialised so activations keep a normal
magnitude), each but the last followed by an op only the CPU runs (CumSum over channels,
rescaled). Greedy-by-support (`--device vulkan`) runs every convolution on the GPU and
crosses devices twice per block; the cost model weighs those crossings against running
the convolutions on the host. Written with onnx's helpers
(no torch), with one random input and ONNX Runtime's output when onnxruntime is present.

    python3 benchmarks/gpu/export_midgraph.py [OUT_DIR]    (default .cache/models)
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

C, HW = 64, 56
BLOCKS = 8


def build(rng):
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(array, name))
        return name

    def conv_relu(i, inp):
        w = (rng.standard_normal((C, C, 3, 3)) * np.sqrt(2.0 / (C * 9))).astype(np.float32)
        nodes.append(helper.make_node("Conv", [inp, const(f"w{i}", w)], [f"c{i}"], pads=[1] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    axis = const("axis", np.array(1, dtype=np.int64))
    scale = const("scale", np.array(1.0 / C, dtype=np.float32))
    shift = const("shift", np.array(-0.5, dtype=np.float32))
    cur = "x"
    for i in range(BLOCKS):
        cur = conv_relu(i, cur)
        if i == BLOCKS - 1:
            break
        # CumSum over channels, rescaled so the magnitude stays that of the input.
        nodes.append(helper.make_node("CumSum", [cur, axis], [f"cs{i}"]))
        nodes.append(helper.make_node("Mul", [f"cs{i}", scale], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", shift], [f"a{i}"]))
        cur = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "midgraph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, C, HW, HW])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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
