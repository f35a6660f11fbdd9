# Does a 1x1 conv run slower when its input was written by another conv (as in a model)
# than after the layout transpose a lone probe gets? Chains of 1x1 convs, each kernel
# timed in the trace. The `s2_*` ones are ResNet-50's stage-2 1x1 convolutions (512->128
# and 128->512 over 28x28), which on the H200 machine's host ran 1.3-1.7x their estimate
# inside ResNet-50: alone, and as 4 bottleneck pairs, each 512->128 reading what the
# 128->512 before it wrote, to tell a slow shape from a slow hand-over (stage2_exp.sh).
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(0)
def chain(name, hw, chans):
    inits, nodes = [], []
    cur = "x"
    for i, (c, m) in enumerate(zip(chans[:-1], chans[1:])):
        w = (rng.standard_normal((m, c, 1, 1)) * (2.0 / c) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(m) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"y{i}"]))
        cur = f"y{i}"
    g = helper.make_graph(nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, chans[0], hw, hw])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, chans[-1], hw, hw])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), f"{out}/{name}.onnx")
chain("alone_256_64", 56, [256, 64])
chain("after_conv_256_64", 56, [64, 256, 64])
chain("chain8_56", 56, [64, 256, 64, 256, 64, 256, 64, 256, 64])
chain("alone_1024_256", 14, [1024, 256])
chain("chain8_14", 14, [256, 1024, 256, 1024, 256, 1024, 256, 1024, 256])
chain("s2_down", 28, [512, 128])
chain("s2_up", 28, [128, 512])
chain("s2_chain", 28, [512, 128] * 4 + [512])
