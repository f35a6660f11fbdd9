#!/usr/bin/env python3
"""Build rafter's corpus of real-world-style models (issue 24): small models with random
weights, put through the tool chains users run on their models, each with ONNX
Runtime's outputs beside it, in ONNX's backend-test layout:

    <out>/node/<model>/model.onnx
    <out>/node/<model>/test_data_set_0/{input,output}_J.pb
    <out>/node/<model>/tolerance.json
    <out>/node/<model>/ops.txt          (the model's op types, one per line, with counts)

crates/rafter-conformance/tests/corpus.rs runs them (RAFTER_CORPUS_DIR=<out>) on the CPU and
on Vulkan. Nothing here is committed: the models are made again by this script.

The models (every one tiny, random weights, fixed seeds):
  bert_export            transformers BertModel (2 layers) exported with torch.onnx
  bert_optimizer         the same through onnxruntime.transformers.optimizer (Attention,
                         EmbedLayerNormalization, SkipLayerNormalization, BiasGelu)
  bert_quant_dynamic     bert_export through quantize_dynamic (DynamicQuantizeLinear,
                         MatMulInteger)
  bert_optimizer_quant   bert_optimizer through quantize_dynamic (QAttention, ...)
  bert_quant_ort_fused   bert_quant_dynamic as ORT saves it after its own fusions
                         (DynamicQuantizeMatMul, MatMulIntegerToFloat, ...)
  lstm_speech_quant      a speech-style LSTM (features -> 2-layer LSTM -> logits, h/c state
                         in and out) through quantize_dynamic (DynamicQuantizeLSTM)
  gru_speech             a speech-style bidirectional GRU (features -> 2-layer bidirectional
                         GRU, h state in and out -> logits; ORT's quantize_dynamic leaves
                         GRU in float, so this is the float export)
  cnn_nchw / cnn_nhwc    a ResNet-style CNN exported with NCHW input and with NHWC input
                         (the transpose inside the model, as TF-converted and
                         channels-last exports have it)
  cnn_nchw_ort_fused     cnn_nchw as ORT saves it after its fusions (FusedConv)
  cnn_qdq_static         quantize_static, QDQ format (QuantizeLinear/DequantizeLinear)
  cnn_qoperator_static   quantize_static, QOperator format (QLinearConv, QLinearAdd,
                         QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QGemm)
  llm_nbits_gqa          one step of a tiny decoder written with ORT's contrib ops as the
                         GenAI model builder writes them (GroupQueryAttention with a KV
                         cache, rotary, SimplifiedLayerNormalization) through ORT's
                         MatMulNBitsQuantizer (4-bit, block 32)
  llm_genai_builder_int4 a tiny random Llama through ORT GenAI's model builder (`-p int4 -e
                         cpu`): MatMulNBits, GroupQueryAttention over a symbolic batch, the
                         tied embedding as GatherBlockQuantized
  llm_genai_builder_int4_untied  the same with `shared_embeddings=false` (a float Gather)

Needs torch, transformers, onnx, onnxruntime, onnxscript, onnxruntime-genai (a venv outside the repo; see the
corpus section of docs/contrib-ops.md):
    python scripts/make_corpus.py [OUT] [MODEL...]      (OUT default: .cache/corpus)
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMP = tempfile.mkdtemp(prefix="rafter-corpus-")


def save_tensor(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.asarray(arr), name).SerializeToString())


def op_counts(model):
    c = collections.Counter(
        (n.domain + "." if n.domain not in ("", "ai.onnx") else "") + n.op_type
        for n in model.graph.node
    )
    return sorted(c.items())


def write_case(out, name, model_path, feeds, rtol, atol):
    """Copies the model, runs ORT (its default optimizations: what users get), saves
    inputs, outputs, tolerance and the op list."""
    d = os.path.join(out, "node", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "test_data_set_0"))
    model = onnx.load(model_path)
    onnx.save(model, os.path.join(d, "model.onnx"))
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = sess.run(None, {k: feeds[k] for k in names})
    sd = os.path.join(d, "test_data_set_0")
    for j, n in enumerate(names):
        save_tensor(os.path.join(sd, f"input_{j}.pb"), feeds[n], n)
    for j, (o, arr) in enumerate(zip(sess.get_outputs(), outs)):
        save_tensor(os.path.join(sd, f"output_{j}.pb"), arr, o.name)
    with open(os.path.join(d, "tolerance.json"), "w") as f:
        json.dump({"rtol": rtol, "atol": atol}, f)
    ops = op_counts(model)
    with open(os.path.join(d, "ops.txt"), "w") as f:
        f.writelines(f"{op} {k}\n" for op, k in ops)
    print(f"{name}: {len(model.graph.node)} nodes: " + ", ".join(f"{o} x{k}" for o, k in ops))


def ort_saved(src, dst, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    """The model as ORT saves it after its own (provider-independent) fusions."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = dst
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return dst


def tmp(name):
    return os.path.join(TMP, name)


def export(module, args, path, input_names, output_names):
    import torch

    module.eval()
    torch.onnx.export(module, args, path, input_names=input_names, output_names=output_names,
                      opset_version=17, dynamo=False)
    return path


# ---- BERT ----


def bert_models(out, wanted):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64,
                     attn_implementation="eager")
    model = BertModel(cfg).eval()
    b, s = 2, 11
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 120, (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.int64)
    mask[1, 8:] = 0
    types = np.zeros((b, s), np.int64)
    types[:, 6:] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids)
            return o.last_hidden_state, o.pooler_output

    src = export(Wrap(model), (torch.tensor(ids), torch.tensor(mask), torch.tensor(types)),
                 tmp("bert.onnx"), ["input_ids", "attention_mask", "token_type_ids"],
                 ["last_hidden_state", "pooler_output"])
    if "bert_export" in wanted:
        write_case(out, "bert_export", src, feeds, 1e-4, 1e-4)

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(src, model_type="bert", num_heads=4, hidden_size=64, opt_level=0)
    opt.save_model_to_file(tmp("bert_opt.onnx"))
    if "bert_optimizer" in wanted:
        write_case(out, "bert_optimizer", tmp("bert_opt.onnx"), feeds, 1e-4, 1e-4)
    # reduce_range (7-bit weights), as ORT advises for x86 machines without VNNI: its u8s8
    # kernels there (AVX2, Zen 3) add pairs of u8 x s8 products in 16 bits, which saturate
    # with 8-bit weights, so ORT's outputs were not the exact integer products MatMulInteger
    # defines (bert_quant_dynamic's pooler_output off by 0.014 against ONNX's reference
    # evaluator, which rafter matched to the last digit). With 7-bit weights a pair fits.
    quantize_dynamic(src, tmp("bert_q.onnx"), weight_type=QuantType.QInt8, reduce_range=True)
    # Dynamic quantization rounds activations at run time: a last-bit difference before
    # a quantizer moves a value by a quantization step (docs/contrib-ops.md), hence 1e-2.
    if "bert_quant_dynamic" in wanted:
        write_case(out, "bert_quant_dynamic", tmp("bert_q.onnx"), feeds, 1e-2, 1e-2)
    if "bert_quant_ort_fused" in wanted:
        ort_saved(tmp("bert_q.onnx"), tmp("bert_q_fused.onnx"))
        write_case(out, "bert_quant_ort_fused", tmp("bert_q_fused.onnx"), feeds, 1e-2, 1e-2)
    if "bert_optimizer_quant" in wanted:
        quantize_dynamic(tmp("bert_opt.onnx"), tmp("bert_opt_q.onnx"),
                         weight_type=QuantType.QInt8, reduce_range=True,
                         extra_options={"DefaultTensorType": TensorProto.FLOAT})
        write_case(out, "bert_optimizer_quant", tmp("bert_opt_q.onnx"), feeds, 1e-2, 1e-2)


# ---- LSTM speech model ----


def lstm_models(out, wanted):
    import torch

    torch.manual_seed(2)

    class Speech(torch.nn.Module):
        """Features -> projection -> 2-layer LSTM (state in and out) -> logits, the shape
        of streaming keyword-spotting and acoustic models."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(40, 64)
            self.lstm = torch.nn.LSTM(64, 64, num_layers=2)
            self.out = torch.nn.Linear(64, 30)

        def forward(self, feats, h0, c0):
            y, (h, c) = self.lstm(torch.relu(self.proj(feats)), (h0, c0))
            return torch.log_softmax(self.out(y), -1), h, c

    t, b = 20, 2
    rng = np.random.default_rng(3)
    feeds = {
        "feats": rng.standard_normal((t, b, 40)).astype(np.float32),
        "h0": (rng.standard_normal((2, b, 64)) * 0.3).astype(np.float32),
        "c0": (rng.standard_normal((2, b, 64)) * 0.3).astype(np.float32),
    }
    src = export(Speech(), tuple(torch.tensor(feeds[k]) for k in ["feats", "h0", "c0"]),
                 tmp("speech.onnx"), ["feats", "h0", "c0"], ["logits", "h", "c"])
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # reduce_range: see bert_models (ORT's u8s8 kernels saturate without VNNI).
    quantize_dynamic(src, tmp("speech_q.onnx"), weight_type=QuantType.QInt8, reduce_range=True,
                     op_types_to_quantize=["LSTM", "MatMul", "Gemm"])
    # ORT rounds the hidden state to u8 at every step; rafter keeps it f32 (see
    # docs/contrib-ops.md), so log-probabilities differ by up to ~1e-3 (measured 9.5e-4).
    write_case(out, "lstm_speech_quant", tmp("speech_q.onnx"), feeds, 0.0, 1e-2)


def gru_models(out, wanted):
    import torch

    torch.manual_seed(4)

    class Speech(torch.nn.Module):
        """Features -> projection -> 2-layer bidirectional GRU (state in and out) -> logits,
        the shape of DeepSpeech2-style acoustic models (torch exports GRU with
        linear_before_reset=1)."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(40, 64)
            self.gru = torch.nn.GRU(64, 64, num_layers=2, bidirectional=True)
            self.out = torch.nn.Linear(128, 30)

        def forward(self, feats, h0):
            y, h = self.gru(torch.relu(self.proj(feats)), h0)
            return torch.log_softmax(self.out(y), -1), h

    t, b = 20, 2
    rng = np.random.default_rng(5)
    feeds = {
        "feats": rng.standard_normal((t, b, 40)).astype(np.float32),
        "h0": (rng.standard_normal((4, b, 64)) * 0.3).astype(np.float32),
    }
    src = export(Speech(), tuple(torch.tensor(feeds[k]) for k in ["feats", "h0"]),
                 tmp("gru.onnx"), ["feats", "h0"], ["logits", "h"])
    write_case(out, "gru_speech", src, feeds, 1e-4, 1e-4)


# ---- CNNs ----


def cnn_module(nhwc):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)
            self.b = nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return torch.relu(x + self.b(torch.relu(self.bn(self.a(x)))))

    class Net(nn.Module):
        """ResNet-style: stem, residual blocks, a two-branch concat, pools, classifier."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.b1 = Block(16)
            self.left = nn.Conv2d(16, 8, 1)
            self.right = nn.Conv2d(16, 8, 3, padding=1)
            self.pool = nn.AvgPool2d(2)
            self.b2 = Block(16)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            if nhwc:
                x = x.permute(0, 3, 1, 2)
            x = torch.relu(self.stem(x))
            x = self.b1(x)
            x = torch.cat([torch.relu(self.left(x)), torch.sigmoid(self.right(x))], 1)
            x = self.b2(self.pool(x))
            x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.fc(x)

    torch.manual_seed(4)
    net = Net()
    # Non-trivial batch-norm statistics, as a trained model has.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def cnn_models(out, wanted):
    import torch

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    src = export(cnn_module(False), (torch.tensor(x),), tmp("cnn.onnx"), ["image"], ["logits"])
    feeds = {"image": x}
    if "cnn_nchw" in wanted:
        write_case(out, "cnn_nchw", src, feeds, 1e-4, 1e-4)
    if "cnn_nhwc" in wanted:
        xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        export(cnn_module(True), (torch.tensor(xh),), tmp("cnn_nhwc.onnx"), ["image"],
               ["logits"])
        write_case(out, "cnn_nhwc", tmp("cnn_nhwc.onnx"), {"image": xh}, 1e-4, 1e-4)
    if "cnn_nchw_ort_fused" in wanted:
        ort_saved(src, tmp("cnn_fused.onnx"))
        write_case(out, "cnn_nchw_ort_fused", tmp("cnn_fused.onnx"), feeds, 1e-4, 1e-4)

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            r = np.random.default_rng(6)
            self.data = iter([{"image": r.standard_normal((2, 3, 32, 32)).astype(np.float32)}
                              for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    quant_pre_process(src, tmp("cnn_pre.onnx"))
    for name, fmt in [("cnn_qdq_static", QuantFormat.QDQ),
                      ("cnn_qoperator_static", QuantFormat.QOperator)]:
        if name not in wanted:
            continue
        quantize_static(tmp("cnn_pre.onnx"), tmp(name + ".onnx"), Reader(), quant_format=fmt,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=fmt == QuantFormat.QDQ)
        # The logits are dequantized int8 values: one quantization step apart at most.
        write_case(out, name, tmp(name + ".onnx"), feeds, 0.0, 0.15)


# ---- LLM step: MatMulNBits + GroupQueryAttention ----


def llm_model(out, wanted):
    """One decode step of a 2-layer Llama-style decoder (hidden 64, 4 query heads, 2 KV
    heads, head 16) written with the ops the GenAI builder emits for CPU: Gather
    embedding, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization, MatMul
    projections (then MatMulNBits), GroupQueryAttention with rotary and a KV cache,
    SiLU MLP. Inputs: input_ids [1, S], attention_mask [1, past + S], past KV per layer."""
    rng = np.random.default_rng(7)
    hid, heads, kv, hd, inter, vocab, layers = 64, 4, 2, 16, 128, 96, 2
    past, s = 5, 1
    F = TensorProto.FLOAT
    inits, nodes = [], []

    def w(name, *shape, scale=0.1):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale)
                                             .astype(np.float32), name))
        return name

    def node(op, ins, outs, domain="", **kw):
        nodes.append(helper.make_node(op, ins, outs, domain=domain, name=outs[0], **kw))
        return outs[0]

    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(64), inv)
    inits += [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos_cache"),
              numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin_cache")]
    # seqlens_k = sum(mask) - 1 (int32), total_sequence_length = mask width: as the builder.
    node("ReduceSum", ["attention_mask", "one_axis"], ["mask_sum"], keepdims=0)
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one_axis"))
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    node("Sub", ["mask_sum", "one"], ["seqlens64"])
    node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "one"], ["total64"], axis=0)
    node("Cast", ["total64"], ["total_len"], to=TensorProto.INT32)

    x = node("Gather", [w("embed", vocab, hid, scale=0.5), "input_ids"], ["x0"])
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, s]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, past + s])]
    outputs = []
    residual = None
    for l in range(layers):
        p = f"l{l}"
        if residual is None:
            h = node("SimplifiedLayerNormalization", [x, w(f"{p}_ln1", hid, scale=1.0)],
                     [f"{p}_h"], epsilon=1e-5, axis=-1)
            residual = x
        else:
            h = node("SkipSimplifiedLayerNormalization",
                     [x, residual, w(f"{p}_ln1", hid, scale=1.0)],
                     [f"{p}_h", "", "", f"{p}_res"], domain="com.microsoft", epsilon=1e-5)
            residual = f"{p}_res"
        q = node("MatMul", [h, w(f"{p}_wq", hid, heads * hd)], [f"{p}_q"])
        k = node("MatMul", [h, w(f"{p}_wk", hid, kv * hd)], [f"{p}_k"])
        v = node("MatMul", [h, w(f"{p}_wv", hid, kv * hd)], [f"{p}_v"])
        pk, pv = f"past_key_values.{l}.key", f"past_key_values.{l}.value"
        inputs += [helper.make_tensor_value_info(n, F, [1, kv, past, hd]) for n in (pk, pv)]
        outputs += [helper.make_tensor_value_info(f"present.{l}.{n}", F, None)
                    for n in ("key", "value")]
        a = node("GroupQueryAttention",
                 [q, k, v, pk, pv, "seqlens_k", "total_len", "cos_cache", "sin_cache"],
                 [f"{p}_attn", f"present.{l}.key", f"present.{l}.value"],
                 domain="com.microsoft", num_heads=heads, kv_num_heads=kv, do_rotary=1,
                 rotary_interleaved=0)
        o = node("MatMul", [a, w(f"{p}_wo", heads * hd, hid)], [f"{p}_o"])
        h2 = node("SkipSimplifiedLayerNormalization",
                  [o, residual, w(f"{p}_ln2", hid, scale=1.0)],
                  [f"{p}_h2", "", "", f"{p}_res2"], domain="com.microsoft", epsilon=1e-5)
        residual = f"{p}_res2"
        g = node("MatMul", [h2, w(f"{p}_wg", hid, inter)], [f"{p}_g"])
        u = node("MatMul", [h2, w(f"{p}_wu", hid, inter)], [f"{p}_u"])
        sg = node("Sigmoid", [g], [f"{p}_sg"])
        act = node("Mul", [node("Mul", [g, sg], [f"{p}_silu"]), u], [f"{p}_act"])
        x = node("MatMul", [act, w(f"{p}_wd", inter, hid)], [f"{p}_down"])
    fin = node("SkipSimplifiedLayerNormalization", [x, residual, w("ln_f", hid, scale=1.0)],
               ["final"], domain="com.microsoft", epsilon=1e-5)
    node("MatMul", [fin, w("lm_head", hid, vocab)], ["logits"])
    outputs.insert(0, helper.make_tensor_value_info("logits", F, None))
    g = helper.make_graph(nodes, "llm_step", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.save(m, tmp("llm.onnx"))

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(tmp("llm.onnx")), block_size=32, is_symmetric=False,
                             accuracy_level=4)
    q.process()
    q.model.save_model_to_file(tmp("llm_q.onnx"))
    feeds = {"input_ids": np.array([[17]], np.int64),
             "attention_mask": np.ones((1, past + s), np.int64)}
    for l in range(layers):
        for n in ("key", "value"):
            feeds[f"past_key_values.{l}.{n}"] = rng.standard_normal((1, kv, past, hd)).astype(
                np.float32)
    write_case(out, "llm_nbits_gqa", tmp("llm_q.onnx"), feeds, 1e-3, 1e-3)


# ---- ORT GenAI's model builder ----


def genai_config():
    import transformers

    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, rope_theta=10000.0)


def genai_llama(cfg):
    """The checkpoint's module (fixed seed): also PyTorch's side of the GPU benchmark."""
    import torch
    import transformers

    torch.manual_seed(11)
    return transformers.LlamaForCausalLM(cfg).eval()


def genai_hf_checkpoint(path):
    """A tiny Llama (2 layers, hidden 64, 4 query and 2 KV heads, head 16, vocab 512, tied
    embeddings) with random weights and a word-level tokenizer, saved as an HF folder:
    what the builder reads (it copies the tokenizer into its output)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = genai_config()
    genai_llama(cfg).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)},
                                     unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2",
                                         unk_token="t0").save_pretrained(path)
    return cfg


def genai_models(out, wanted):
    """The checkpoint above through `python -m onnxruntime_genai.models.builder -p int4 -e
    cpu`, as users run it: its default export (the tied embedding read from the lm_head's
    4-bit weights by GatherBlockQuantized) and `shared_embeddings=false` (a float
    embedding Gather). One step each: 4 new tokens after 3 cached, and a decode step of a
    batch of 2 after 5 (the builder's batch dim is symbolic)."""
    import subprocess

    hf = tmp("genai_hf")
    cfg = genai_hf_checkpoint(hf)
    rng = np.random.default_rng(12)
    kv, hd = 2, 16

    def step(batch, past, s):
        feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (batch, s)).astype(np.int64),
                 "attention_mask": np.ones((batch, past + s), np.int64)}
        for l in range(cfg.num_hidden_layers):
            for n in ("key", "value"):
                feeds[f"past_key_values.{l}.{n}"] = rng.standard_normal(
                    (batch, kv, past, hd)).astype(np.float32)
        return feeds

    # ORT's GroupQueryAttention takes a batch of several only one token at a time.
    for name, extra, feeds in [
            ("llm_genai_builder_int4", [], step(1, 3, 4)),
            ("llm_genai_builder_int4_untied", ["--extra_options", "shared_embeddings=false"],
             step(2, 5, 1))]:
        if name not in wanted:
            continue
        dst = tmp(name)
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf,
                        "-o", dst, "-p", "int4", "-e", "cpu", "-c", tmp(name + "_cache"),
                        *extra], check=True, stdout=subprocess.DEVNULL)
        # The builder's MatMulNBits round activations to int8 per block (accuracy_level 4):
        # a last-bit difference upstream (an RMSNorm's summation order) can move an
        # activation across a rounding boundary, one quantization step (~3e-3 here); a
        # wrong nibble order or scale moves logits by 1e-1 and more.
        write_case(out, name, os.path.join(dst, "model.onnx"), feeds, 1e-2, 1e-2)


ALL = ["bert_export", "bert_optimizer", "bert_quant_dynamic", "bert_quant_ort_fused",
       "bert_optimizer_quant", "lstm_speech_quant", "gru_speech", "cnn_nchw", "cnn_nhwc",
       "cnn_nchw_ort_fused", "cnn_qdq_static", "cnn_qoperator_static", "llm_nbits_gqa",
       "llm_genai_builder_int4", "llm_genai_builder_int4_untied"]


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(REPO, ".cache", "corpus")
    wanted = set(argv[2:]) or set(ALL)
    unknown = wanted - set(ALL)
    if unknown:
        sys.exit(f"unknown model(s) {sorted(unknown)}; known: {ALL}")
    if wanted & {m for m in ALL if m.startswith("bert")}:
        bert_models(out, wanted)
    if "lstm_speech_quant" in wanted:
        lstm_models(out, wanted)
    if "gru_speech" in wanted:
        gru_models(out, wanted)
    if wanted & {m for m in ALL if m.startswith("cnn")}:
        cnn_models(out, wanted)
    if "llm_nbits_gqa" in wanted:
        llm_model(out, wanted)
    if wanted & {m for m in ALL if m.startswith("llm_genai")}:
        genai_models(out, wanted)
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"corpus under {out} (onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main(sys.argv)
