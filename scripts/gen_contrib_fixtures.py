#!/usr/bin/env python3
"""Generate tests/fixtures/contrib: one small model per ONNX Runtime contrib op
(com.microsoft) and attribute variant, built with onnx.helper, with random inputs
(fixed seed) and ONNX Runtime's outputs, in ONNX's backend-test layout:

    tests/fixtures/contrib/node/<case>/model.onnx
    tests/fixtures/contrib/node/<case>/test_data_set_0/{input,output}_J.pb
    tests/fixtures/contrib/node/<case>/tolerance.json

crates/rafter-conformance/tests/contrib_ops.rs runs every case through rafter's
reference executor and its compiled CPU path and compares with these outputs.

Needs onnx, numpy and onnxruntime (scripts/setup_venv.sh --full has them):
    .venv/bin/python scripts/gen_contrib_fixtures.py [GROUP...]

GROUPs: fused, quantized, attention, gqa, tools, qoperator, gather_quant (default: all).
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "contrib", "node")
MS = "com.microsoft"
RNG = np.random.default_rng(20261128)

F32 = TensorProto.FLOAT
I32 = TensorProto.INT32
I64 = TensorProto.INT64
U8 = TensorProto.UINT8
I8 = TensorProto.INT8

CASES: list[str] = []


def rnd(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def case(name, nodes, inputs, outputs, inits=None, rtol=1e-4, atol=1e-5, extra_sets=(), ref=None):
    """Builds the model, runs ORT on `inputs` (name -> array; more data sets in
    `extra_sets`), writes the fixture. `outputs`: list of (name, elem_type). `ref`
    (feeds -> outputs) replaces ORT for ops ORT has no CPU kernel for."""
    inits = inits or {}
    g = helper.make_graph(
        nodes,
        name,
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        producer_name="rafter gen_contrib_fixtures.py",
    )
    m.ir_version = 8
    write(name, m, [inputs, *extra_sets], rtol, atol, ref)


def write(name, model, sets, rtol, atol, ref=None):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    data = model.SerializeToString()
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(data)
    so = ort.SessionOptions()
    # The model as written, not ORT's own rewrite of it.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if ref is None:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        in_names = [i.name for i in sess.get_inputs()]
        out_names = [o.name for o in sess.get_outputs()]
    else:
        in_names = [i.name for i in model.graph.input]
        out_names = [o.name for o in model.graph.output]
    for k, feeds in enumerate(sets):
        outs = sess.run(None, feeds) if ref is None else ref(feeds)
        sd = os.path.join(d, f"test_data_set_{k}")
        os.makedirs(sd)
        for j, n in enumerate(in_names):
            save(os.path.join(sd, f"input_{j}.pb"), feeds[n], n)
        for j, (o, arr) in enumerate(zip(out_names, outs)):
            save(os.path.join(sd, f"output_{j}.pb"), arr, o)
    with open(os.path.join(d, "tolerance.json"), "w") as f:
        json.dump({"rtol": rtol, "atol": atol}, f)
    CASES.append(name)


def save(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.asarray(arr), name).SerializeToString())


def ms(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain=MS, **attrs)


# ---- activations, normalisations, fused matmul ----


def fused():
    x = rnd(2, 3, 8)
    case("gelu", [ms("Gelu", ["x"], ["y"])], {"x": x}, [("y", F32)])
    case(
        "bias_gelu",
        [ms("BiasGelu", ["x", "b"], ["y"])],
        {"x": x},
        [("y", F32)],
        inits={"b": rnd(8)},
    )
    case("fast_gelu", [ms("FastGelu", ["x"], ["y"])], {"x": x}, [("y", F32)])
    case(
        "fast_gelu_bias",
        [ms("FastGelu", ["x", "b"], ["y"])],
        {"x": x, "b": rnd(8)},
        [("y", F32)],
    )
    case("quick_gelu", [ms("QuickGelu", ["x"], ["y"])], {"x": x}, [("y", F32)])
    case(
        "quick_gelu_alpha",
        [ms("QuickGelu", ["x"], ["y"], alpha=1.0)],
        {"x": x},
        [("y", F32)],
    )
    case(
        "bias_add",
        [ms("BiasAdd", ["x", "b", "s"], ["y"])],
        {"x": x, "b": rnd(8), "s": rnd(2, 3, 8)},
        [("y", F32)],
        # ORT has BiasAdd for CUDA only: NumPy, from the op's definition.
        ref=lambda f: [f["x"] + f["b"] + f["s"]],
    )
    for name, a, b, attrs in [
        ("fused_matmul_alpha", rnd(3, 4), rnd(4, 5), dict(alpha=0.5)),
        ("fused_matmul_trans_a", rnd(4, 3), rnd(4, 5), dict(transA=1)),
        ("fused_matmul_trans_b", rnd(2, 3, 4), rnd(5, 4), dict(transB=1, alpha=2.0)),
        ("fused_matmul_trans_ab_batched", rnd(2, 4, 3), rnd(2, 5, 4), dict(transA=1, transB=1)),
    ]:
        case(name, [ms("FusedMatMul", ["a", "b"], ["y"], **attrs)], {"a": a, "b": b}, [("y", F32)])
    h = 16
    x, s = rnd(2, 5, h), rnd(2, 5, h)
    gamma, beta, bias = rnd(h) + 1.0, rnd(h), rnd(h)
    case(
        "skip_layer_norm",
        [ms("SkipLayerNormalization", ["x", "s", "gamma", "beta", "bias"], ["y", "", "", "sum"])],
        {"x": x, "s": s},
        [("y", F32), ("sum", F32)],
        inits={"gamma": gamma, "beta": beta, "bias": bias},
    )
    case(
        "skip_layer_norm_no_beta_eps",
        [ms("SkipLayerNormalization", ["x", "s", "gamma"], ["y"], epsilon=1e-3)],
        {"x": x, "s": rnd(5, h)},
        [("y", F32)],
        inits={"gamma": gamma},
    )
    case(
        "skip_simplified_layer_norm",
        [ms("SkipSimplifiedLayerNormalization", ["x", "s", "gamma", "bias"], ["y", "", "", "sum"],
            epsilon=1e-6)],
        {"x": x, "s": s},
        [("y", F32), ("sum", F32)],
        inits={"gamma": gamma, "bias": bias},
    )
    case(
        "simplified_layer_norm",
        [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], epsilon=1e-6)],
        {"x": x},
        [("y", F32)],
        inits={"gamma": gamma},
    )
    vocab, maxpos = 11, 9
    ids = RNG.integers(0, vocab, (2, 6)).astype(np.int32)
    seg = RNG.integers(0, 2, (2, 6)).astype(np.int32)
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], dtype=np.int32)
    emb = {
        "word": rnd(vocab, h),
        "pos": rnd(maxpos, h),
        "segemb": rnd(2, h),
        "gamma": gamma,
        "beta": beta,
    }
    case(
        "embed_layer_norm",
        [ms("EmbedLayerNormalization",
            ["ids", "seg", "word", "pos", "segemb", "gamma", "beta", "mask"],
            ["y", "mask_index", "sum"])],
        {"ids": ids, "seg": seg, "mask": mask},
        [("y", F32), ("mask_index", I32), ("sum", F32)],
        inits=emb,
    )
    case(
        "embed_layer_norm_position_ids",
        [ms("EmbedLayerNormalization",
            ["ids", "", "word", "pos", "", "gamma", "beta", "", "pos_ids"],
            ["y", "mask_index"], epsilon=1e-5)],
        {"ids": ids, "pos_ids": RNG.integers(0, maxpos, (2, 6)).astype(np.int32)},
        [("y", F32), ("mask_index", I32)],
        inits={k: v for k, v in emb.items() if k != "segemb"},
    )


# ---- quantized ----


def pack_nbits(q, bits):
    """[rows, n] values < 2^bits -> [rows, ceil(n * bits / 8)] bytes, low bits first."""
    per = 8 // bits
    rows, n = q.shape
    pad = (-n) % per
    q = np.concatenate([q, np.zeros((rows, pad), q.dtype)], axis=1).reshape(rows, -1, per)
    out = np.zeros(q.shape[:2], np.uint8)
    for i in range(per):
        out |= (q[:, :, i].astype(np.uint8) << (bits * i)).astype(np.uint8)
    return out


def nbits_case(name, k, n, block, bits, a_shape, zp=True, bias=False, accuracy_level=None):
    k_blocks = -(-k // block)
    q = RNG.integers(0, 1 << bits, (n, k_blocks * block)).astype(np.uint8)
    b = pack_nbits(q, bits).reshape(n, k_blocks, block * bits // 8)
    inits = {"B": b, "scales": (RNG.random(n * k_blocks) * 0.1 + 0.01).astype(np.float32)}
    ins = ["A", "B", "scales"]
    if zp:
        zq = RNG.integers(0, 1 << bits, (n, k_blocks)).astype(np.uint8)
        inits["zp"] = pack_nbits(zq, bits).reshape(-1)
        ins.append("zp")
    if bias:
        inits["bias"] = rnd(n)
        ins += [""] * (5 - len(ins)) + ["bias"]
    attrs = {} if accuracy_level is None else {"accuracy_level": accuracy_level}
    case(
        name,
        [ms("MatMulNBits", ins, ["y"], K=k, N=n, bits=bits, block_size=block, **attrs)],
        {"A": rnd(*a_shape)},
        [("y", F32)],
        inits=inits,
        rtol=1e-4,
        atol=1e-4,
    )


def quantized():
    nbits_case("matmul_nbits_decode", 64, 24, 32, 4, (1, 64))
    nbits_case("matmul_nbits_prefill_3d", 64, 24, 32, 4, (2, 5, 64), bias=True)
    nbits_case("matmul_nbits_no_zero_points", 48, 8, 16, 4, (3, 48), zp=False)
    nbits_case("matmul_nbits_k_padded", 40, 8, 16, 4, (3, 40))
    nbits_case("matmul_nbits_8bit", 64, 12, 32, 8, (2, 64))

    a = RNG.integers(0, 256, (2, 3, 8)).astype(np.uint8)
    b = RNG.integers(-128, 128, (8, 5)).astype(np.int8)
    case(
        "matmul_integer_to_float",
        [ms("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz", "bias"], ["y"])],
        {"a": a},
        [("y", F32)],
        inits={
            "b": b,
            "as": np.array(0.02, np.float32),
            "bs": (RNG.random(5) * 0.05).astype(np.float32),
            "az": np.array(128, np.uint8),
            "bz": RNG.integers(-3, 3, 5).astype(np.int8),
            "bias": rnd(5),
        },
    )
    case(
        "matmul_integer_to_float_no_zero_points",
        [ms("MatMulIntegerToFloat", ["a", "b", "as", "bs"], ["y"])],
        {"a": a},
        [("y", F32)],
        inits={"b": b, "as": np.array(0.02, np.float32), "bs": np.array(0.03, np.float32)},
    )
    for name, zp, bs in [
        ("dynamic_quantize_matmul", True, (RNG.random(6) * 0.05).astype(np.float32)),
        ("dynamic_quantize_matmul_symmetric", False, np.array(0.04, np.float32)),
    ]:
        inits = {"b": RNG.integers(-128, 128, (8, 6)).astype(np.int8), "bs": bs, "bias": rnd(6)}
        ins = ["a", "b", "bs", "bz", "bias"] if zp else ["a", "b", "bs", "", "bias"]
        if zp:
            inits["bz"] = np.zeros(6, np.int8)
        case(
            name,
            [ms("DynamicQuantizeMatMul", ins, ["y"])],
            {"a": rnd(4, 8)},
            [("y", F32)],
            inits=inits,
            atol=1e-4,
        )
    qa = RNG.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    qb = RNG.integers(0, 256, (4,)).astype(np.uint8)
    qparams = {
        "as": np.array(0.05, np.float32), "az": np.array(120, np.uint8),
        "bs": np.array(0.03, np.float32), "bz": np.array(130, np.uint8),
        "cs": np.array(0.07, np.float32), "cz": np.array(125, np.uint8),
    }
    for op in ["QLinearAdd", "QLinearMul"]:
        case(
            op.lower().replace("qlinear", "qlinear_"),
            [ms(op, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"])],
            {"a": qa, "b": qb},
            [("y", U8)],
            inits=qparams,
        )
    ia = RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    case(
        "qlinear_add_int8",
        [ms("QLinearAdd", ["a", "as", "az", "a", "bs", "az", "cs", "cz"], ["y"])],
        {"a": ia},
        [("y", I8)],
        inits={"as": np.array(0.05, np.float32), "az": np.array(-3, np.int8),
               "bs": np.array(0.05, np.float32),
               "cs": np.array(0.11, np.float32), "cz": np.array(4, np.int8)},
    )
    xq = RNG.integers(0, 256, (2, 8)).astype(np.uint8)
    for name, op, attrs in [
        ("qlinear_sigmoid", "QLinearSigmoid", {}),
        ("qlinear_leaky_relu", "QLinearLeakyRelu", {"alpha": 0.1}),
    ]:
        case(
            name,
            [ms(op, ["x", "xs", "xz", "ys", "yz"], ["y"], **attrs)],
            {"x": xq},
            [("y", U8)],
            inits={"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
                   "ys": np.array(1 / 256 if op == "QLinearSigmoid" else 0.04, np.float32),
                   "yz": np.array(0 if op == "QLinearSigmoid" else 100, np.uint8)},
        )
    # accuracy_level 4: ORT's CPU kernel rounds A to int8 per block (its outputs move by
    # ~0.3% from the f32 product, far outside the tolerance, so these check that we round
    # as ORT does), at decode and prefill shapes, several blocks and no zero points.
    nbits_case("matmul_nbits_acc4_decode", 256, 24, 32, 4, (1, 256), accuracy_level=4)
    nbits_case("matmul_nbits_acc4_prefill_3d", 128, 40, 64, 4, (2, 9, 128), bias=True,
               accuracy_level=4)
    nbits_case("matmul_nbits_acc4_no_zero_points_k_padded", 80, 8, 32, 4, (3, 80), zp=False,
               accuracy_level=4)
    nbits_case("matmul_nbits_acc4_block16", 64, 8, 16, 4, (2, 64), accuracy_level=4)
    nbits_case("matmul_nbits_acc4_8bit", 64, 12, 32, 8, (2, 64), accuracy_level=4)
    nbits_case("matmul_nbits_acc1", 64, 12, 32, 4, (2, 64), accuracy_level=1)


# ---- attention ----


def attention():
    b, s, d, heads = 2, 5, 16, 2
    x = rnd(b, s, d)
    w, bias = rnd(d, 3 * d, scale=0.3), rnd(3 * d, scale=0.1)
    att = lambda name, ins, outs, feeds, inits=None, **attrs: case(
        name,
        [ms("Attention", ins, [o for o, _ in outs], num_heads=heads, **attrs)],
        feeds,
        outs,
        inits={"w": w, "bias": bias, **(inits or {})},
    )
    att("attention", ["x", "w", "bias"], [("y", F32)], {"x": x})
    att("attention_mask_1d", ["x", "w", "bias", "m"], [("y", F32)],
        {"x": x, "m": np.array([5, 3], np.int32)})
    att("attention_mask_2d_unidirectional", ["x", "w", "bias", "m"], [("y", F32)],
        {"x": x, "m": np.array([[1] * 5, [1, 1, 1, 0, 0]], np.int32)}, unidirectional=1)
    att("attention_mask_3d_scale", ["x", "w", "bias", "m"], [("y", F32)],
        {"x": x, "m": RNG.integers(0, 2, (b, s, s)).astype(np.int32) | np.eye(s, dtype=np.int32)},
        scale=0.2)
    case("attention_qkv_hidden_sizes",
         [ms("Attention", ["x", "w2"], ["y"], num_heads=heads, qkv_hidden_sizes=[16, 16, 8])],
         {"x": x}, [("y", F32)], inits={"w2": rnd(d, 40, scale=0.3)})
    att("attention_bias", ["x", "w", "bias", "", "", "ab"], [("y", F32)],
        {"x": x, "ab": rnd(1, heads, s, s)})
    p = 3
    att("attention_past_unidirectional", ["x", "w", "bias", "m", "past"],
        [("y", F32), ("present", F32)],
        {"x": rnd(b, 2, d), "m": np.ones((b, p + 2), np.int32),
         "past": rnd(2, b, heads, p, d // heads)},
        unidirectional=1)

    q, kv = rnd(2, 4, 16), rnd(2, 6, 16)
    case("multi_head_attention",
         [ms("MultiHeadAttention", ["q", "k", "v", "bias", "kpm"], ["y"], num_heads=4)],
         {"q": q, "k": kv, "v": rnd(2, 6, 16),
          "kpm": np.array([[1] * 6, [1] * 4 + [0] * 2], np.int32)},
         [("y", F32)], inits={"bias": rnd(48, scale=0.1)})
    case("multi_head_attention_bias_scale",
         [ms("MultiHeadAttention", ["q", "k", "v", "", "kpm", "ab"], ["y"], num_heads=4,
             scale=0.3)],
         {"q": q, "k": kv, "v": rnd(2, 6, 16), "kpm": np.array([6, 3], np.int32),
          "ab": rnd(2, 1, 4, 6)},
         [("y", F32)])
    case("multi_head_attention_past_unidirectional",
         [ms("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"],
             ["y", "present_k", "present_v"], num_heads=4, unidirectional=1)],
         {"q": rnd(2, 2, 16), "k": rnd(2, 2, 16), "v": rnd(2, 2, 16),
          "pk": rnd(2, 4, 3, 4), "pv": rnd(2, 4, 3, 4)},
         [("y", F32), ("present_k", F32), ("present_v", F32)])

    maxpos, hd = 12, 16
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(maxpos)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = RNG.integers(0, maxpos, (2, 5)).astype(np.int64)
    for name, xs, feeds_pos, attrs, cs in [
        ("rotary_embedding", (2, 5, 32), pos, {}, (cos, sin)),
        ("rotary_embedding_interleaved", (2, 5, 32), pos, {"interleaved": 1}, (cos, sin)),
        ("rotary_embedding_offset", (2, 5, 32), np.array([3], np.int64), {}, (cos, sin)),
        ("rotary_embedding_4d_bnsh", (2, 2, 5, 16), pos, {}, (cos, sin)),
        ("rotary_embedding_partial", (2, 5, 32), pos,
         {"num_heads": 2, "rotary_embedding_dim": 8}, (cos[:, :4], sin[:, :4])),
    ]:
        case(name, [ms("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], **attrs)],
             {"x": rnd(*xs), "pos": feeds_pos}, [("y", F32)],
             inits={"cos": cs[0], "sin": cs[1]})


def gqa():
    h, nq, nkv, b = 16, 4, 2, 2
    cos_sin = {}
    inv = 1.0 / (10000 ** (np.arange(0, h, 2) / h))
    ang = np.arange(16)[:, None] * inv[None, :]
    cos_sin = {"cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32)}
    outs = [("y", F32), ("present_k", F32), ("present_v", F32)]

    def g(name, s, past, attrs, packed=False, rotary=False, b=b):
        total = s + past
        feeds = {"seqlens": np.full(b, total - 1, np.int32), "total": np.array(total, np.int32)}
        if packed:
            feeds["q"] = rnd(b, s, (nq + 2 * nkv) * h)
            ins = ["q", "", ""]
        else:
            feeds.update(q=rnd(b, s, nq * h), k=rnd(b, s, nkv * h), v=rnd(b, s, nkv * h))
            ins = ["q", "k", "v"]
        if past:
            feeds.update(pk=rnd(b, nkv, past, h), pv=rnd(b, nkv, past, h))
            ins += ["pk", "pv"]
        else:
            ins += ["", ""]
        ins += ["seqlens", "total"]
        if rotary:
            ins += ["cos", "sin"]
        case(name,
             [ms("GroupQueryAttention", ins, [o for o, _ in outs], num_heads=nq,
                 kv_num_heads=nkv, **attrs)],
             feeds, outs, inits=cos_sin if rotary else None)

    g("gqa_prompt", 5, 0, {})
    g("gqa_decode", 1, 4, {})
    g("gqa_rotary_decode", 1, 4, {"do_rotary": 1}, rotary=True)
    g("gqa_rotary_chunk_batch1", 2, 3, {"do_rotary": 1}, rotary=True, b=1)
    g("gqa_rotary_interleaved_prompt", 4, 0, {"do_rotary": 1, "rotary_interleaved": 1},
      rotary=True)
    g("gqa_packed_local_window_softcap", 5, 0, {"local_window_size": 3, "softcap": 5.0},
      packed=True)
    g("gqa_decode_scale", 1, 6, {"scale": 0.2})

    # Per-sequence lengths (seqlens_k varying across the batch), as ORT GenAI batches run:
    # decode steps over a shared past buffer longer than some sequences (ORT writes each new
    # row at seqlens_k[b] and zeroes the rows above it), and a right-padded first prompt.
    def ragged(name, s, past, seqlens, attrs, rotary=False):
        nb = len(seqlens)
        total = max(past, max(seqlens) + 1) if past else s
        feeds = {"seqlens": np.array(seqlens, np.int32), "total": np.array(total, np.int32),
                 "q": rnd(nb, s, nq * h), "k": rnd(nb, s, nkv * h), "v": rnd(nb, s, nkv * h)}
        ins = ["q", "k", "v"]
        if past:
            feeds.update(pk=rnd(nb, nkv, past, h), pv=rnd(nb, nkv, past, h))
            ins += ["pk", "pv"]
        else:
            ins += ["", ""]
        ins += ["seqlens", "total"]
        if rotary:
            ins += ["cos", "sin"]
        case(name,
             [ms("GroupQueryAttention", ins, [o for o, _ in outs], num_heads=nq,
                 kv_num_heads=nkv, **attrs)],
             feeds, outs, inits=cos_sin if rotary else None)

    ragged("gqa_ragged_decode", 1, 6, [2, 5, 3], {})
    ragged("gqa_ragged_decode_grows_buffer", 1, 4, [4, 1], {})
    ragged("gqa_ragged_rotary_decode_window", 1, 7, [6, 2, 4], {"do_rotary": 1, "local_window_size": 3},
           rotary=True)
    ragged("gqa_ragged_prompt_padded", 5, 0, [2, 4], {"do_rotary": 1}, rotary=True)


# ---- QOperator-format ops (quantize_static), QAttention, FusedConv, NhwcConv, quantized LSTM ----


def u8(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


def f32(v):
    return np.array(v, np.float32)


def qoperator():
    a, b = u8(4, 6), RNG.integers(-128, 128, (6, 5)).astype(np.int8)
    c = RNG.integers(-2000, 2000, (5,)).astype(np.int32)
    qg = {"as": f32(0.02), "az": np.array(131, np.uint8), "b": b, "bz": np.zeros(5, np.int8),
          "bs": (RNG.random(5) * 0.05 + 0.01).astype(np.float32), "c": c}
    case("qgemm_float_out", [ms("QGemm", ["a", "as", "az", "b", "bs", "bz", "c"], ["y"],
                                alpha=0.5)],
         {"a": a}, [("y", F32)], inits=qg)
    qg2 = dict(qg, b=np.ascontiguousarray(b.T), bs=f32(0.03), bz=np.array(0, np.int8),
               ys=f32(0.09), yz=np.array(120, np.uint8))
    case("qgemm_u8_out_trans_b",
         [ms("QGemm", ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"], transB=1)],
         {"a": a}, [("y", U8)], inits=qg2)
    ia = RNG.integers(-128, 128, (6, 3)).astype(np.int8)
    case("qgemm_i8_trans_a",
         [ms("QGemm", ["a", "as", "az", "b", "bs", "bz", "", "ys", "yz"], ["y"], transA=1)],
         {"a": ia}, [("y", I8)],
         inits={"as": f32(0.05), "az": np.array(2, np.int8),
                "b": RNG.integers(-128, 128, (6, 4)).astype(np.int8),
                "bs": f32(0.02), "bz": np.array(0, np.int8),
                "ys": f32(0.4), "yz": np.array(-5, np.int8)})

    x1, x2 = u8(1, 3, 4, 4), u8(1, 5, 4, 4)
    case("qlinear_concat",
         [ms("QLinearConcat", ["ys", "yz", "x1", "s1", "z1", "x2", "s2", "z2"], ["y"], axis=1)],
         {"x1": x1, "x2": x2}, [("y", U8)],
         inits={"ys": f32(0.05), "yz": np.array(128, np.uint8),
                "s1": f32(0.03), "z1": np.array(100, np.uint8),
                "s2": f32(0.08), "z2": np.array(140, np.uint8)})

    xp = u8(2, 3, 7, 6)
    pool_q = {"xs": f32(0.04), "xz": np.array(110, np.uint8),
              "ys": f32(0.03), "yz": np.array(90, np.uint8)}
    pin = ["x", "xs", "xz", "ys", "yz"]
    case("qlinear_average_pool", [ms("QLinearAveragePool", pin, ["y"], kernel_shape=[3, 3],
                                     strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": xp}, [("y", U8)], inits=pool_q)
    case("qlinear_average_pool_count_pad_ceil",
         [ms("QLinearAveragePool", pin, ["y"], kernel_shape=[2, 3], strides=[2, 2],
             pads=[0, 1, 0, 1], count_include_pad=1, ceil_mode=1)],
         {"x": xp}, [("y", U8)], inits=pool_q)
    case("qlinear_average_pool_nhwc",
         [ms("QLinearAveragePool", pin, ["y"], kernel_shape=[2, 2], channels_last=1)],
         {"x": u8(1, 5, 6, 4)}, [("y", U8)], inits=pool_q)
    case("qlinear_global_average_pool", [ms("QLinearGlobalAveragePool", pin, ["y"])],
         {"x": u8(2, 4, 5, 5)}, [("y", U8)], inits=pool_q)
    case("qlinear_global_average_pool_nhwc",
         [ms("QLinearGlobalAveragePool", pin, ["y"], channels_last=1)],
         {"x": u8(2, 3, 3, 6)}, [("y", U8)], inits=pool_q)
    case("qlinear_softmax",
         [ms("QLinearSoftmax", pin, ["y"], axis=-1, opset=13)],
         {"x": u8(3, 10)}, [("y", U8)],
         inits={"xs": f32(0.1), "xz": np.array(128, np.uint8),
                "ys": f32(1 / 256), "yz": np.array(0, np.uint8)})
    # y_scale 0.003: ORT scales by floor(1 / 0.003) = 333, not 333.3.
    case("qlinear_softmax_scale_not_reciprocal",
         [ms("QLinearSoftmax", pin, ["y"], axis=1, opset=13)],
         {"x": u8(2, 6, 3)}, [("y", U8)],
         inits={"xs": f32(0.05), "xz": np.array(100, np.uint8),
                "ys": f32(0.003), "yz": np.array(5, np.uint8)})

    # QAttention: u8 input, i8 weights per column, 2-D mask, past.
    bsz, s, d, heads = 2, 4, 16, 2
    qa_inits = {
        "w": RNG.integers(-128, 128, (d, 3 * d)).astype(np.int8),
        "bias": rnd(3 * d, scale=0.1),
        "xs": f32(0.01),
        "ws": (RNG.random(3 * d) * 0.004 + 0.002).astype(np.float32),
        "xz": np.array(128, np.uint8),
        "wz": np.zeros(3 * d, np.int8),
    }
    mask = np.ones((bsz, s), np.int32)
    mask[1, 3:] = 0
    case("qattention",
         [ms("QAttention", ["x", "w", "bias", "xs", "ws", "mask", "xz", "wz"], ["y"],
             num_heads=heads)],
         {"x": u8(bsz, s, d), "mask": mask}, [("y", F32)], inits=qa_inits, atol=1e-4)
    past = rnd(2, bsz, heads, 3, d // heads)
    qa_inits2 = dict(qa_inits, ws=f32(0.003), wz=np.array(0, np.int8))
    case("qattention_past_unidirectional",
         [ms("QAttention", ["x", "w", "bias", "xs", "ws", "", "xz", "wz", "past"],
             ["y", "present"], num_heads=heads, unidirectional=1)],
         {"x": u8(bsz, 1, d), "past": past}, [("y", F32), ("present", F32)],
         inits=qa_inits2, atol=1e-4)

    # FusedConv: each MLAS activation, and the Z (sum) input.
    xc = rnd(1, 3, 6, 6)
    conv_inits = {"w": rnd(4, 3, 3, 3, scale=0.3), "b": rnd(4, scale=0.1)}
    for name, act, params in [
        ("relu", "Relu", None), ("sigmoid", "Sigmoid", None), ("tanh", "Tanh", None),
        ("leaky_relu", "LeakyRelu", [0.2]), ("clip", "Clip", [-0.5, 0.7]),
        ("hard_sigmoid", "HardSigmoid", [0.3, 0.4]),
    ]:
        attrs = {"activation": act, "pads": [1, 1, 1, 1]}
        if params:
            attrs["activation_params"] = params
        case(f"fused_conv_{name}", [ms("FusedConv", ["x", "w", "b"], ["y"], **attrs)],
             {"x": xc}, [("y", F32)], inits=conv_inits)
    case("fused_conv_sum_relu",
         [ms("FusedConv", ["x", "w", "b", "z"], ["y"], activation="Relu", strides=[2, 2])],
         {"x": xc, "z": rnd(1, 4, 2, 2)}, [("y", F32)], inits=conv_inits)

    # NhwcConv: ORT runs it on CUDA only; the reference is ORT's Conv on the same data
    # transposed to NCHW / OIHW.
    wn = rnd(6, 3, 3, 4, scale=0.3)  # [M, kH, kW, C/group], group 2 over C = 8

    def nhwc_ref(feeds):
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["y"], group=2, pads=[1, 0, 1, 0],
                              strides=[1, 2])],
            "nhwc_ref",
            [helper.make_tensor_value_info("x", F32, None),
             helper.make_tensor_value_info("b", F32, None)],
            [helper.make_tensor_value_info("y", F32, None)],
            [numpy_helper.from_array(np.ascontiguousarray(wn.transpose(0, 3, 1, 2)), "w")],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        x = np.ascontiguousarray(feeds["x"].transpose(0, 3, 1, 2))
        y = sess.run(None, {"x": x, "b": feeds["b"]})[0]
        return [np.ascontiguousarray(y.transpose(0, 2, 3, 1))]

    case("nhwc_conv", [ms("NhwcConv", ["x", "w", "b"], ["y"], group=2, pads=[1, 0, 1, 0],
                          strides=[1, 2])],
         {"x": rnd(2, 5, 7, 8), "b": rnd(6, scale=0.1)}, [("y", F32)], inits={"w": wn},
         ref=nhwc_ref)

    # DynamicQuantizeLSTM as quantize_dynamic writes it: W [D, input, 4H] int8, per
    # direction scales; outputs within the hidden state's run-time rounding (docs).
    dirs, inp, hid, seq, batch = 2, 5, 4, 6, 2
    lstm_inits = {
        "w": RNG.integers(-128, 128, (dirs, inp, 4 * hid)).astype(np.int8),
        "r": RNG.integers(-128, 128, (dirs, hid, 4 * hid)).astype(np.int8),
        "bb": rnd(dirs, 8 * hid, scale=0.1),
        "ws": f32([0.004, 0.005]), "wz": np.zeros(dirs, np.int8),
        "rs": f32([0.006, 0.004]), "rz": np.zeros(dirs, np.int8),
    }
    case("dynamic_quantize_lstm_bidirectional",
         [ms("DynamicQuantizeLSTM",
             ["x", "w", "r", "bb", "", "", "", "", "ws", "wz", "rs", "rz"], ["y", "yh", "yc"],
             hidden_size=hid, direction="bidirectional")],
         {"x": rnd(seq, batch, inp)}, [("y", F32), ("yh", F32), ("yc", F32)],
         inits=lstm_inits, rtol=0, atol=1.5e-2)
    lstm_inits1 = {
        "w": RNG.integers(0, 256, (1, inp, 4 * hid)).astype(np.uint8),
        "r": RNG.integers(0, 256, (1, hid, 4 * hid)).astype(np.uint8),
        "ws": (RNG.random((1, 4 * hid)) * 0.004 + 0.002).astype(np.float32),
        "wz": np.full((1, 4 * hid), 128, np.uint8),
        "rs": (RNG.random((1, 4 * hid)) * 0.004 + 0.002).astype(np.float32),
        "rz": np.full((1, 4 * hid), 128, np.uint8),
    }
    case("dynamic_quantize_lstm_per_column_u8",
         [ms("DynamicQuantizeLSTM",
             ["x", "w", "r", "", "", "h0", "c0", "", "ws", "wz", "rs", "rz"], ["y"],
             hidden_size=hid)],
         {"x": rnd(seq, batch, inp), "h0": rnd(1, batch, hid, scale=0.5),
          "c0": rnd(1, batch, hid, scale=0.5)}, [("y", F32)],
         inits=lstm_inits1, rtol=0, atol=1.5e-2)


# ---- models as ONNX Runtime's tools write them ----


def contrib_ops_of(model):
    return sorted({n.op_type for n in model.graph.node if n.domain == MS})


def ort_optimized(model, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    """The model as ORT's own graph optimizer rewrites and saves it (CPU, its fusions
    into com.microsoft ops)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.optimized_model_filepath = path
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(path)


def tool_case(name, model, sets, rtol, atol, want_ops):
    ops = contrib_ops_of(model)
    missing = set(want_ops) - set(ops)
    assert not missing, f"{name}: the tool wrote {ops}, not {sorted(missing)}"
    print(f"{name}: contrib ops {ops}")
    write(name, model, sets, rtol, atol)


def mlp():
    """A 3-layer MLP (MatMul + Add + Relu, and a Gemm) with fixed random weights."""
    d_in, d_h, d_out = 32, 64, 16
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h1b"]),
        helper.make_node("Relu", ["h1b"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["h2b"]),
        helper.make_node("Relu", ["h2b"], ["a2"]),
        helper.make_node("MatMul", ["a2", "w3"], ["y"]),
    ]
    inits = {"w1": rnd(d_in, d_h, scale=0.2), "b1": rnd(d_h, scale=0.1),
             "w2": rnd(d_h, d_h, scale=0.15), "b2": rnd(d_h, scale=0.1),
             "w3": rnd(d_h, d_out, scale=0.15)}
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", F32, ["batch", d_in])],
        [helper.make_tensor_value_info("y", F32, ["batch", d_out])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def tools():
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.transformers.optimizer import optimize_model

    bert_dir = os.path.join(REPO, "tests", "fixtures", "bert_tiny")
    sets = []
    for seq in ["seq7", "seq13"]:
        sets.append({n: np.load(os.path.join(bert_dir, seq, n + ".npy"))
                     for n in ["input_ids", "attention_mask"]})
    with tempfile.TemporaryDirectory() as tmp:
        # ORT's transformer optimizer (model_type bert), its Python fusions only.
        opt = optimize_model(os.path.join(bert_dir, "model.onnx"), model_type="bert",
                             num_heads=4, hidden_size=32, opt_level=0)
        bert_opt = opt.model
        tool_case("tool_bert_transformer_optimizer", bert_opt, sets, 1e-4, 1e-4,
                  ["Attention", "EmbedLayerNormalization", "SkipLayerNormalization"])
        # The same, then ORT's own CPU fusions on top, as saved by ORT.
        tool_case("tool_bert_optimizer_then_ort", ort_optimized(bert_opt), sets, 1e-4, 1e-4,
                  ["Attention"])

        # quantize_dynamic (int8 weights), then ORT's fusions of what it wrote.
        src, dst = os.path.join(tmp, "mlp.onnx"), os.path.join(tmp, "mlp_q.onnx")
        onnx.save(mlp(), src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        x_sets = [{"x": rnd(4, 32)}, {"x": rnd(1, 32)}]
        mlp_q = onnx.load(dst)
        write("tool_mlp_quantize_dynamic", mlp_q, x_sets, 1e-4, 1e-4)
        tool_case("tool_mlp_quantize_dynamic_ort_fused", ort_optimized(mlp_q), x_sets, 1e-4,
                  1e-4, ["DynamicQuantizeMatMul"])
        bsrc, bdst = os.path.join(tmp, "bert.onnx"), os.path.join(tmp, "bert_q.onnx")
        shutil.copy(os.path.join(bert_dir, "model.onnx"), bsrc)
        quantize_dynamic(bsrc, bdst, weight_type=QuantType.QInt8)
        # Two layers of activations quantized at run time: a last-bit difference before a
        # quantizer (a fused kernel's summation order) moves a value by one quantization
        # step, which the next layers carry; hence the wider tolerance.
        tool_case("tool_bert_quantize_dynamic_ort_fused", ort_optimized(onnx.load(bdst)), sets,
                  1e-2, 1e-2, ["DynamicQuantizeMatMul", "MatMulIntegerToFloat", "FusedMatMul"])

        # 4-bit weights with MatMulNBits (block 32, asymmetric), as ORT's quantizer writes.
        for sym in [False, True]:
            q = MatMulNBitsQuantizer(mlp(), block_size=32, is_symmetric=sym)
            q.process()
            tool_case(f"tool_mlp_matmul_nbits_{'sym' if sym else 'asym'}", q.model.model,
                      x_sets, 1e-4, 1e-4, ["MatMulNBits"])


# ---- GatherBlockQuantized (the GenAI builder's quantized, tied embedding) ----


def gbq_case(name, rows, inner, q, block, bits, idx, zp=True, scale_dt=np.float32,
             quantize_axis=None, extra_idx=()):
    """GatherBlockQuantized over uint8 `data` `[rows, *inner, q * bits / 8]` (gather_axis 0,
    quantize_axis last, as ORT requires for uint8), `scales` `[rows, *inner, ceil(q /
    block)]`, optional packed zero points. `idx` (and `extra_idx`, more data sets) are
    the model's input."""
    nb = -(-q // block)
    shape = (rows, *inner)
    flat = int(np.prod(shape))
    vals = RNG.integers(0, 1 << bits, (flat, q)).astype(np.uint8)
    data = pack_nbits(vals, bits).reshape(*shape, -1)
    scales = (RNG.random((*shape, nb)) * 0.1 + 0.01).astype(scale_dt)
    inits = {"data": data, "scales": scales}
    ins = ["data", "idx", "scales"]
    if zp:
        zq = RNG.integers(0, 1 << bits, (flat, nb)).astype(np.uint8)
        inits["zp"] = pack_nbits(zq, bits).reshape(*shape, -1)
        ins.append("zp")
    attrs = {"bits": bits, "block_size": block}
    if quantize_axis is not None:
        attrs["quantize_axis"] = quantize_axis
    out_t = helper.np_dtype_to_tensor_dtype(np.dtype(scale_dt))
    case(name, [ms("GatherBlockQuantized", ins, ["y"], **attrs)], {"idx": idx}, [("y", out_t)],
         inits=inits, rtol=0, atol=0, extra_sets=[{"idx": i} for i in extra_idx])


def gather_quant():
    i64 = lambda *v: np.array(v, np.int64)
    # The builder's case: 4 bits, no zero points (default 8), [batch, seq] token ids, one
    # of them negative (counted from the end, as Gather does).
    gbq_case("gather_block_quantized_4bit", 10, (), 48, 16, 4,
             i64(3, 0, -1, 9, 4, 4).reshape(2, 3), zp=False,
             extra_idx=[i64(7, 7, -10, 2, 1, 0).reshape(2, 3)])
    gbq_case("gather_block_quantized_4bit_zero_points", 9, (), 64, 32, 4,
             i64(8, 1, 1, 0))
    # q = 40 is not a multiple of the block: the last block is 8 wide.
    gbq_case("gather_block_quantized_4bit_ragged_block", 6, (), 40, 16, 4,
             i64(2, 5, 0).reshape(1, 3))
    gbq_case("gather_block_quantized_8bit", 7, (), 32, 16, 8, i64(6, 0, 3).reshape(3))
    gbq_case("gather_block_quantized_rank3_int32_idx", 5, (2,), 32, 16, 4,
             np.array([[4, 1], [0, 2]], np.int32), quantize_axis=2)
    gbq_case("gather_block_quantized_f16_scales", 8, (), 32, 16, 4,
             i64(1, 7, 2).reshape(1, 3), scale_dt=np.float16)
    # ORT writes zeros for an index outside [-rows, rows).
    gbq_case("gather_block_quantized_out_of_range", 4, (), 32, 16, 4, i64(1, 4, -5, 2))


GROUPS = {
    "fused": fused,
    "quantized": quantized,
    "attention": attention,
    "gqa": gqa,
    "tools": tools,
    "qoperator": qoperator,
    "gather_quant": gather_quant,
}


def main(argv):
    global RNG
    wanted = argv[1:] or list(GROUPS)
    for g in wanted:
        # Each group its own seed: regenerating one group leaves the others' data as is.
        RNG = np.random.default_rng([20261128, list(GROUPS).index(g)])
        GROUPS[g]()
    print(f"wrote {len(CASES)} cases under {OUT} (onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main(sys.argv)
