#!/usr/bin/env python3
"""Generate tests/fixtures/bert_tiny: a tiny BERT-like encoder exported to ONNX,
plus inputs and ONNX Runtime reference outputs at two sequence lengths.

Needs the full venv:
    scripts/setup_venv.sh --full
    .venv/bin/python scripts/gen_fixtures.py

Writes (relative to the repo root):
    tests/fixtures/bert_tiny/model.onnx
    tests/fixtures/bert_tiny/seq7/{input_ids,attention_mask,last_hidden_state,torch_last_hidden_state}.npy
    tests/fixtures/bert_tiny/seq13/...
    tests/fixtures/bert_tiny/README.md

last_hidden_state.npy is ONNX Runtime's output (the reference for tests);
torch_last_hidden_state.npy is PyTorch's, and the script asserts they agree
within 1e-4.
"""
from __future__ import annotations

import math
import os
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "bert_tiny")

VOCAB = 100
HIDDEN = 32
LAYERS = 2
HEADS = 4
INTERMEDIATE = 64
MAX_POS = 64
LN_EPS = 1e-12
OPSET = 17
SEED = 0
TOL = 1e-4

# (name, batch, seq, number of trailing padding positions per row)
CASES = [
    ("seq7", 1, 7, [0]),
    ("seq13", 2, 13, [0, 4]),
]


class Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(MAX_POS, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.register_buffer("position_ids", torch.arange(MAX_POS).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.size(1)
        pos = self.position_ids[:, :seq]
        return self.norm(self.word(input_ids) + self.position(pos))


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.q = nn.Linear(HIDDEN, HIDDEN)
        self.k = nn.Linear(HIDDEN, HIDDEN)
        self.v = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.size()
        return x.view(b, s, HEADS, self.head_dim).transpose(1, 2)  # [b, h, s, d]

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores + mask_bias, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).contiguous()  # [b, s, h, d]
        b, s = ctx.size(0), ctx.size(1)
        ctx = ctx.view(b, s, HIDDEN)
        return self.norm(x + self.out(ctx))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = SelfAttention()
        self.up = nn.Linear(HIDDEN, INTERMEDIATE)
        self.act = nn.GELU()  # approximate="none": the erf form
        self.down = nn.Linear(INTERMEDIATE, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attn(x, mask_bias)
        return self.norm(x + self.down(self.act(self.up(x))))


class TinyBert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = Embeddings()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # [b, s] -> [b, 1, 1, s]; 0 where attended, -10000 where masked (classic BERT).
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


def init_weights(model: nn.Module) -> None:
    # Larger-than-default, non-trivial values everywhere (LayerNorm gamma/beta
    # included) so that a mixed-up parameter shows in the outputs.
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm." in name or name.startswith("norm."):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif isinstance(p, torch.Tensor) and name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "word" in name or "position" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def make_inputs(batch: int, seq: int, pads: list[int], rng: np.random.RandomState):
    ids = rng.randint(0, VOCAB, size=(batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for i, p in enumerate(pads):
        if p:
            mask[i, seq - p:] = 0
    return ids, mask


def main() -> int:
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model = TinyBert()
    init_weights(model)
    model.eval()

    os.makedirs(OUT, exist_ok=True)
    model_path = os.path.join(OUT, "model.onnx")
    rng = np.random.RandomState(SEED)
    example_ids, example_mask = make_inputs(2, 5, [0, 1], rng)
    print(f"exporting to {model_path} (TorchScript exporter, opset {OPSET})")
    torch.onnx.export(
        model,
        (torch.from_numpy(example_ids), torch.from_numpy(example_mask)),
        model_path,
        dynamo=False,
        opset_version=OPSET,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"},
        },
        do_constant_folding=True,
    )
    m = onnx.load(model_path)
    onnx.checker.check_model(m, full_check=True)
    ops = Counter(n.op_type for n in m.graph.node)
    print("ops:", dict(sorted(ops.items())))
    for op in ("Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Erf", "LayerNormalization"):
        assert ops[op] > 0, f"expected {op} in the exported graph"
    dims = {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in list(m.graph.input) + list(m.graph.output)
    }
    print("io dims:", dims)
    assert dims["input_ids"] == ["batch", "seq"], dims
    assert dims["last_hidden_state"] == ["batch", "seq", HIDDEN], dims

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

    rng = np.random.RandomState(SEED + 1)
    for name, batch, seq, pads in CASES:
        ids, mask = make_inputs(batch, seq, pads, rng)
        (ort_out,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        with torch.no_grad():
            pt_out = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        assert ort_out.shape == (batch, seq, HIDDEN) and ort_out.dtype == np.float32
        diff = float(np.max(np.abs(ort_out - pt_out)))
        print(f"{name}: batch {batch} seq {seq}, max |ort - torch| = {diff:.3g}")
        assert diff <= TOL, f"ORT and PyTorch disagree on {name}: {diff}"
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "input_ids.npy"), ids)
        np.save(os.path.join(d, "attention_mask.npy"), mask)
        np.save(os.path.join(d, "last_hidden_state.npy"), ort_out)
        np.save(os.path.join(d, "torch_last_hidden_state.npy"), pt_out.astype(np.float32))

    write_readme(ops)
    total = sum(
        os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs
    )
    print(f"fixture folder: {total} bytes")
    assert total < 1 << 20, "fixture folder must stay under 1 MB"
    return 0


def write_readme(ops: Counter) -> None:
    py = sys.version.split()[0]
    text = f"""# bert_tiny fixture

A tiny BERT-like encoder (random weights, fixed seed) exported to ONNX, with
inputs and reference outputs at two sequence lengths. Generated by
`scripts/gen_fixtures.py`; do not edit by hand.

Regenerate (from the repo root):

    scripts/setup_venv.sh --full
    .venv/bin/python scripts/gen_fixtures.py

Made with Python {py}, torch {torch.__version__}, onnxruntime {ort.__version__},
onnx {onnx.__version__}, numpy {np.__version__}.

## Model

- vocab {VOCAB}, hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, intermediate
  {INTERMEDIATE}, learned position embeddings (max {MAX_POS}), post-LN
  LayerNorm (eps {LN_EPS}), GELU in its erf form; no token-type embeddings,
  no pooler.
- attention mask bias: `(1 - mask) * -10000` added to the scores.
- exported with `torch.onnx.export(..., dynamo=False, opset_version={OPSET},
  dynamic_axes=...)` (the TorchScript exporter, constant folding on).
- inputs: `input_ids` int64 [batch, seq], `attention_mask` int64 [batch, seq];
  output: `last_hidden_state` float32 [batch, seq, {HIDDEN}]; `batch` and `seq`
  are symbolic dims.
- the head split `x.view(b, s, heads, dim)` with `b, s = x.size()` leaves
  dynamic-shape arithmetic in the graph (Shape, Gather, Unsqueeze, Concat,
  Reshape).
- ops: {", ".join(f"{k} x{v}" for k, v in sorted(ops.items()))}

## Data

| dir | batch | seq | attention_mask |
| --- | --- | --- | --- |
| `seq7` | 1 | 7 | all ones |
| `seq13` | 2 | 13 | row 0 all ones, row 1 last 4 positions 0 |

Each dir holds `input_ids.npy`, `attention_mask.npy` (int64),
`last_hidden_state.npy` (float32, ONNX Runtime's output, CPU provider, 1
thread: the reference) and `torch_last_hidden_state.npy` (PyTorch's output).
The script asserts max |ORT - PyTorch| <= {TOL:g}.
"""
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
