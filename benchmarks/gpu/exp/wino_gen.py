# A 256->256 3x3 convolution over 14x14 (ResNet-50's stage-3 Winograd kernel) alone,
# in a chain of 8, and as 8 or 48 replicas of distinct weights: the 48 replicas' weights
# (~350 MB) outgrow the cache, and each then runs as slowly as inside ResNet-50.
#   python wino_gen.py DIR; rafter bench DIR/wrep48.onnx --device cpu --trace t.json
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(0)
def model(name, c, hw, n, chain, k=3):
    inits, nodes = [], []
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])]
    outs = []
    cur = "x"
    for r in range(n):
        w = (rng.standard_normal((c, c, k, k)) * (2.0 / (c*k*k)) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(c) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{r}"), numpy_helper.from_array(b, f"b{r}")]
        src = cur if chain else "x"
        nodes.append(helper.make_node("Conv", [src, f"w{r}", f"b{r}"], [f"c{r}"], kernel_shape=[k, k], pads=[k//2]*4))
        nodes.append(helper.make_node("Relu", [f"c{r}"], [f"y{r}"]))
        cur = f"y{r}"
        if not chain: outs.append(helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, c, hw, hw]))
    if chain: outs = [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, c, hw, hw])]
    g = helper.make_graph(nodes, name, ins, outs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), f"{out}/{name}.onnx")

model("w1", 256, 14, 1, True)
model("wchain8", 256, 14, 8, True)
model("wrep8", 256, 14, 8, False)
model("wrep48", 256, 14, 48, False)
