# Chains of N distinct-weight 128x768x768 GEMMs (+bias, ReLU): BERT-base projection shape,
# weights 2.4 MB each, 2.4-380 MB in all. On the 2-core Xeon VM (2026-12-01) a GEMM ran
# 541 us alone and 597 in the chain of 160 (377 MB): weights from memory cost it ~10%.
# `h{N}`: the same with MiniLM-L6's 128x384x384 projection (0.6 MB of weights each, 94 MB
# for 160), for the GPU (gpu_chain_exp.sh): does a GPU GEMM slow down once the weights
# outgrow the GPU's L2 (50 MB on an H100/H200)?
#   python gemm_chain_gen.py DIR; rafter bench DIR/g160.onnx --device cpu --iters 30
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(0)
def model(name, m, k, n):
    inits, nodes = [], []
    cur = "x"
    for r in range(n):
        w = (rng.standard_normal((k, k)) * (1.0 / k) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(k) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{r}"), numpy_helper.from_array(b, f"b{r}")]
        nodes.append(helper.make_node("MatMul", [cur, f"w{r}"], [f"t{r}"]))
        nodes.append(helper.make_node("Add", [f"t{r}", f"b{r}"], [f"c{r}"]))
        nodes.append(helper.make_node("Relu", [f"c{r}"], [f"y{r}"]))
        cur = f"y{r}"
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [m, k])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), f"{out}/{name}.onnx")
for n in [1, 4, 16, 64, 160]:
    model(f"g{n}", 128, 768, n)
for n in [1, 12, 64, 160]:
    model(f"h{n}", 128, 384, n)
