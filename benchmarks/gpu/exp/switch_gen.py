# Does a kernel run slower inside a model because the kernel before it was of another
# kind? The GPU's dispatch cost is calibrated on a chain of one kernel (a 1x1 matmul, the
# same pipeline every dispatch) and the chains of convolutions that reproduced the probes
# on the H200 (chain_exp.sh) repeat one kind too; in MiniLM-L6 each projection follows a
# layer norm, a softmax or a transpose, and ran 0.024-0.025 ms where its probe ran 0.017
# (cost-experiments-2026-12-01-b/kernels). These graphs hold MiniLM's 128x384x384
# projection (+bias) alone, chained 12 deep, and alternating with a layer norm or a
# softmax; the layer norm and the softmax chained alone too. A pipeline switch that costs
# shows as each projection's traced time (and the calls' untraced wall) above its time in
# the plain chain.
#   python switch_gen.py DIR; rafter bench DIR/mm_ln.onnx --device vulkan --trace t.json
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper

out = sys.argv[1]
rng = np.random.default_rng(0)
M, K, DEPTH = 128, 384, 12


def save(name, nodes, inits, cur):
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [M, K])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              f"{out}/{name}.onnx")


def projection(i, cur, nodes, inits):
    w = (rng.standard_normal((K, K)) * (1.0 / K) ** 0.5).astype(np.float32)
    b = (rng.standard_normal(K) * 0.1).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
    nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"t{i}"]))
    nodes.append(helper.make_node("Add", [f"t{i}", f"b{i}"], [f"p{i}"]))
    return f"p{i}"


def layer_norm(i, cur, nodes, inits):
    inits += [numpy_helper.from_array(np.ones(K, np.float32), f"g{i}"),
              numpy_helper.from_array(np.zeros(K, np.float32), f"be{i}")]
    nodes.append(helper.make_node("LayerNormalization", [cur, f"g{i}", f"be{i}"], [f"n{i}"],
                                  axis=-1, epsilon=1e-5))
    return f"n{i}"


def softmax(i, cur, nodes, inits):
    nodes.append(helper.make_node("Softmax", [cur], [f"s{i}"], axis=-1))
    return f"s{i}"


def graph(name, steps):
    nodes, inits, cur = [], [], "x"
    for i in range(DEPTH):
        for step in steps:
            cur = step(i, cur, nodes, inits)
    save(name, nodes, inits, cur)


def alone(name, step):
    nodes, inits = [], []
    save(name, nodes, inits, step(0, "x", nodes, inits))


alone("mm_alone", projection)
graph("mm_chain", [projection])
graph("mm_ln", [projection, layer_norm])
graph("mm_softmax", [projection, softmax])
graph("ln_chain", [layer_norm])
graph("softmax_chain", [softmax])
