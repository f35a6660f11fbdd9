# Conv probes alone and replicated (distinct weights), to see whether a probe timed hot in
# cache (the same kernel, call after call) runs faster than the same shape mid-model.
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(0)
def model(name, c, hw, m, reps, shared_input):
    inits, nodes, ins, outs = [], [], [], []
    for r in range(reps):
        xn = "x" if shared_input else f"x{r}"
        if r == 0 or not shared_input:
            ins.append(helper.make_tensor_value_info(xn, TensorProto.FLOAT, [1, c, hw, hw]))
        w = (rng.standard_normal((m, c, 1, 1)) * (2.0 / c) ** 0.5).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32) * 0.1
        inits += [numpy_helper.from_array(w, f"w{r}"), numpy_helper.from_array(b, f"b{r}")]
        nodes.append(helper.make_node("Conv", [xn, f"w{r}", f"b{r}"], [f"c{r}"], kernel_shape=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{r}"], [f"y{r}"]))
        outs.append(helper.make_tensor_value_info(f"y{r}", TensorProto.FLOAT, [1, m, hw, hw]))
    g = helper.make_graph(nodes, name, ins, outs, inits)
    mdl = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(mdl, f"{out}/{name}.onnx")
for (c, hw, m) in [(64, 56, 256), (256, 56, 64), (1024, 14, 256), (512, 7, 2048)]:
    base = f"pw{c}_{hw}_{m}"
    model(f"{base}_r1", c, hw, m, 1, True)
    model(f"{base}_r16s", c, hw, m, 16, True)
    model(f"{base}_r16d", c, hw, m, 16, False)
