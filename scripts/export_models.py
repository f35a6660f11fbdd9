#!/usr/bin/env python3
"""Export the benchmark models to ONNX, with sample inputs and ONNX Runtime outputs.

Needs the full venv (no network access is needed: every model is randomly
initialised with a fixed seed, so no pretrained weights are downloaded):
    scripts/setup_venv.sh --full
    .venv/bin/python scripts/export_models.py [--force] [--only NAME ...]

Writes into .cache/models/ (git-ignored):
    resnet50.onnx        torchvision resnet50(weights=None), input "input" float32 [1,3,224,224]
    mobilenet_v2.onnx    torchvision mobilenet_v2(weights=None), same input
    bert_base.onnx       transformers BertModel(BertConfig()) = bert-base-uncased sizes
    minilm_l6.onnx       BertModel with all-MiniLM-L6-v2's sizes (hidden 384, 6 layers,
                         12 heads, intermediate 1536)
    <name>_inputs/<input>.npy    one sample input set
    <name>_outputs/<output>.npy  ONNX Runtime's outputs (CPU EP) on that input set

The BERT models take input_ids, attention_mask, token_type_ids (int64, dims
[batch, seq], both symbolic) and return last_hidden_state [batch, seq, hidden];
the sample inputs are batch 1, seq 128: ids uniform in [0, vocab) (numpy seed 0),
attention mask all ones, token types all zeros. The image models' sample input
is standard-normal float32 (numpy seed 0). Note: with torchvision's random
init (BatchNorm at identity statistics) mobilenet_v2's activations shrink layer
by layer and its logits are ~1e-9 (resnet50's are ~1e2); compare its outputs
relatively (rtol), not with an absolute tolerance.

All models: opset 17, the TorchScript-based exporter (torch.onnx.export with
dynamo=False), eval mode, weights stored inside the .onnx file (no external
data). Each export is checked against PyTorch on the sample inputs, and the
BERT exports also on a second shape (batch 2, seq 37, with padding), so that a
dimension baked in by tracing is caught.

Idempotent: an existing file is kept unless --force is given (a re-exported
model also has its inputs and outputs rewritten). File names are sanitised to
[A-Za-z0-9._-] (anything else becomes "_").
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, ".cache", "models")

OPSET = 17
SEED = 0
BERT_SEQ = 128
# ORT vs PyTorch: max |diff| <= TOL * max |torch output| (relative: the random-init
# mobilenet_v2's logits are only ~1e-9 in magnitude, see the module docstring)
TOL = 1e-3


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


# ---------------------------------------------------------------- models


def image_model(ctor):
    def build():
        torch.manual_seed(SEED)
        return ctor(weights=None).eval()

    return build


def make_resnet50():
    import torchvision

    return image_model(torchvision.models.resnet50)()


def make_mobilenet_v2():
    import torchvision

    return image_model(torchvision.models.mobilenet_v2)()


class BertLastHidden(torch.nn.Module):
    """BertModel returning only last_hidden_state (no pooler)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        return out.last_hidden_state


def bert_model(**overrides):
    def config():
        from transformers import BertConfig

        cfg = BertConfig(**overrides)
        # Plain MatMul/Softmax attention rather than SDPA: the classic BERT graph.
        cfg._attn_implementation = "eager"
        return cfg

    def build():
        torch.manual_seed(SEED)
        return BertLastHidden(config()).eval()

    build.config = config
    return build


make_bert_base = bert_model()  # BertConfig() defaults = bert-base-uncased
make_minilm_l6 = bert_model(
    hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
)


# ---------------------------------------------------------------- inputs


def image_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}


def bert_inputs(vocab: int, batch: int, seq: int, pads: list[int] | None = None, seed: int = SEED):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for row, pad in enumerate(pads or []):
        if pad:
            mask[row, seq - pad :] = 0
    types = np.zeros((batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# ---------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(f"export_models: {msg}", flush=True)


def run_torch(model, inputs: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    with torch.no_grad():
        return model(*[torch.from_numpy(inputs[n]) for n in names]).numpy()


def run_ort(path: str, inputs: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(names, inputs)


def check_close(what: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape:
        raise SystemExit(f"export_models: {what}: shape {got.shape} != torch {want.shape}")
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    scale = float(np.max(np.abs(want)))
    status = "ok" if diff <= TOL * scale else "MISMATCH"
    log(f"  {what}: ORT vs torch max|diff| = {diff:.3g}, max|torch| = {scale:.3g} {status}")
    if status != "ok":
        raise SystemExit(f"export_models: {what}: ORT and torch disagree")


def check_embedded(path: str) -> None:
    m = onnx.load(path, load_external_data=False)
    ext = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if ext:
        raise SystemExit(f"export_models: {path}: {len(ext)} initializers use external data")


def export(model, args: tuple, path: str, input_names, output_names, dynamic_axes) -> None:
    tmp = path + ".tmp"
    with torch.no_grad():
        torch.onnx.export(
            model,
            args,
            tmp,
            dynamo=False,
            opset_version=OPSET,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
            export_params=True,
        )
    check_embedded(tmp)
    onnx.checker.check_model(tmp)
    os.replace(tmp, path)


def write_npys(dir_: str, arrays: dict[str, np.ndarray], force: bool) -> None:
    os.makedirs(dir_, exist_ok=True)
    for name, arr in arrays.items():
        p = os.path.join(dir_, sanitize(name) + ".npy")
        if os.path.exists(p) and not force:
            log(f"  kept   {os.path.relpath(p, REPO)}")
            continue
        np.save(p, arr)
        log(f"  wrote  {os.path.relpath(p, REPO)} {arr.dtype} {list(arr.shape)}")


def load_npys(dir_: str, names: list[str]) -> dict[str, np.ndarray] | None:
    out = {}
    for n in names:
        p = os.path.join(dir_, sanitize(n) + ".npy")
        if not os.path.exists(p):
            return None
        out[n] = np.load(p)
    return out


# ---------------------------------------------------------------- per model


def do_image(name: str, make, force: bool) -> None:
    path = os.path.join(OUT_DIR, f"{name}.onnx")
    in_dir = os.path.join(OUT_DIR, f"{name}_inputs")
    out_dir = os.path.join(OUT_DIR, f"{name}_outputs")
    inputs = image_inputs()
    model = None
    if os.path.exists(path) and not force:
        log(f"{name}: kept   {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes)")
    else:
        t0 = time.time()
        model = make()
        export(model, (torch.from_numpy(inputs["input"]),), path, ["input"], ["output"], None)
        log(f"{name}: wrote  {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes, {time.time() - t0:.1f} s)")
    finish(name, path, in_dir, out_dir, inputs, force or model is not None, model, ["input"])


def do_bert(name: str, make, force: bool) -> None:
    path = os.path.join(OUT_DIR, f"{name}.onnx")
    in_dir = os.path.join(OUT_DIR, f"{name}_inputs")
    out_dir = os.path.join(OUT_DIR, f"{name}_outputs")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    config = make.config()
    inputs = bert_inputs(config.vocab_size, 1, BERT_SEQ)
    model = None
    if os.path.exists(path) and not force:
        log(f"{name}: kept   {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes)")
    else:
        t0 = time.time()
        model = make()
        # Trace with padding in the mask, so the "no padding: skip the mask"
        # shortcut of transformers is not baked into the graph.
        trace = bert_inputs(config.vocab_size, 2, 16, pads=[0, 5], seed=SEED + 1)
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"}
        export(model, tuple(torch.from_numpy(trace[n]) for n in names), path,
               names, ["last_hidden_state"], dyn)
        log(f"{name}: wrote  {os.path.relpath(path, REPO)} ({os.path.getsize(path)} bytes, {time.time() - t0:.1f} s)")
        # A second shape, with padding, to catch dimensions or branches fixed by tracing.
        other = bert_inputs(config.vocab_size, 2, 37, pads=[0, 9], seed=SEED + 2)
        _, (got,) = run_ort(path, other)
        check_close(f"{name} batch 2 seq 37 (padded)", got, run_torch(model, other, names))
    finish(name, path, in_dir, out_dir, inputs, force or model is not None, model, names)


def finish(name, path, in_dir, out_dir, inputs, force, torch_model, in_names) -> None:
    """Write the sample inputs and ORT's outputs (and compare with torch if just exported)."""
    write_npys(in_dir, inputs, force)
    # Use the inputs actually on disk (they may be kept from an earlier run).
    on_disk = load_npys(in_dir, list(inputs))
    assert on_disk is not None
    out_names = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    have_outputs = all(
        os.path.exists(os.path.join(out_dir, sanitize(n) + ".npy")) for n in out_names
    )
    if have_outputs and not force:
        log(f"{name}: kept   outputs in {os.path.relpath(out_dir, REPO)}/")
        return
    names, outs = run_ort(path, on_disk)
    if torch_model is not None:
        check_close(f"{name} sample inputs", outs[0], run_torch(torch_model, on_disk, in_names))
    write_npys(out_dir, dict(zip(names, outs)), True)


MODELS = {
    "resnet50": lambda force: do_image("resnet50", make_resnet50, force),
    "mobilenet_v2": lambda force: do_image("mobilenet_v2", make_mobilenet_v2, force),
    "bert_base": lambda force: do_bert("bert_base", make_bert_base, force),
    "minilm_l6": lambda force: do_bert("minilm_l6", make_minilm_l6, force),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="re-export and rewrite existing files")
    ap.add_argument("--only", nargs="+", choices=list(MODELS), help="export only these models")
    args = ap.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(2)
    log(f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}; "
        f"writing to {os.path.relpath(OUT_DIR, REPO)}/")
    for name in args.only or list(MODELS):
        MODELS[name](args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
