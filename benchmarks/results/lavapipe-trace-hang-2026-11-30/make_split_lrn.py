"""The model of the lavapipe traced-run hang (2026-11-30): Relu -> LRN -> Relu -> LRN -> Relu
on f32[1, 16, 32, 32], opset 13. With `--device vulkan` the LRNs (with the Relus before
them fused in) run on the CPU and the last Relu on the GPU: one CPU -> GPU crossing a call.

    python make_split_lrn.py OUT.onnx
"""
import sys

import onnx
from onnx import TensorProto, helper


def main():
    shape = [1, 16, 32, 32]
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("LRN", ["a"], ["b"], size=3),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("LRN", ["c"], ["d"], size=3),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, sys.argv[1])


if __name__ == "__main__":
    main()
