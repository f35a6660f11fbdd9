# ResNet-50's stage-2 1x1 convolutions (512->128 and 128->512 over 28x28, bias + ReLU),
# which on the H200 machine's host ran 1.3-1.7x their estimate inside ResNet-50 while the
# same-flops probes of other shapes did not: alone (`s2_down`, `s2_up`), and as 4
# bottleneck pairs chained, each 512->128 reading what the 128->512 before it wrote
# (`s2_chain`), to tell a slow shape from a slow hand-over between kernels.
#   python stage2_gen.py DIR; rafter bench DIR/s2_chain.onnx --device cpu --estimate
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(0)
def model(name, pairs):
    inits, nodes = [], []
    cur, c = "x", pairs[0][0]
    for r, (ci, co) in enumerate(pairs):
        w = (rng.standard_normal((co, ci, 1, 1)) * (2.0 / ci) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(co) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{r}"), numpy_helper.from_array(b, f"b{r}")]
        nodes.append(helper.make_node("Conv", [cur, f"w{r}", f"b{r}"], [f"c{r}"], kernel_shape=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{r}"], [f"y{r}"]))
        cur = f"y{r}"
    co = pairs[-1][1]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 28, 28])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, co, 28, 28])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), f"{out}/{name}.onnx")
model("s2_down", [(512, 128)])
model("s2_up", [(128, 512)])
model("s2_chain", [(512, 128), (128, 512)] * 4)
