"""f16 variants of the benchmark models, for rafter's Vulkan f16 kernels.

Builds each model exactly as scripts/export_models.py does (random init, fixed seed: the
same weights as the f32 export), converts it with `model.half()` and exports it with
half-precision inputs (on the GPU when there is one: PyTorch's CPU lacks some f16 ops).
No network access is needed. Writes into .cache/models/:

    <m>_f16.onnx              the f16 model (f16 initializers, inputs and outputs; BERT's
                              int64 inputs stay int64)
    <m>_f16_inputs/*.npy      the f32 export's sample inputs, images rounded to f16
    <m>_f16_outputs/*.npy     the f32 model's ONNX Runtime outputs (copied from
                              <m>_outputs/): the reference the f16 run is compared with
    <m>_f16_torch/*.npy       PyTorch's own f16 outputs on those inputs (CUDA when
                              available): how far f16 itself moves the result, the scale
                              an f16 error is judged on

Run export_models.py for the f32 models first. Then:
    python3 benchmarks/gpu/export_f16.py [--only resnet50 mobilenet_v2 bert_base]
"""
import argparse
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import export_models as em  # noqa: E402

MAKERS = {
    "resnet50": em.make_resnet50,
    "mobilenet_v2": em.make_mobilenet_v2,
    "bert_base": em.make_bert_base,
    "minilm_l6": em.make_minilm_l6,
}
BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def export_f16(name: str, device: str) -> None:
    src_in = os.path.join(em.OUT_DIR, f"{name}_inputs")
    src_out = os.path.join(em.OUT_DIR, f"{name}_outputs")
    if not os.path.isdir(src_out):
        raise SystemExit(f"export_f16: {src_out} missing: run scripts/export_models.py first")
    bert = name.startswith("bert") or name.startswith("minilm")
    in_names = BERT_INPUTS if bert else ["input"]
    inputs = em.load_npys(src_in, in_names)
    if inputs is None:
        raise SystemExit(f"export_f16: inputs missing in {src_in}")
    if not bert:
        inputs = {k: v.astype(np.float16) for k, v in inputs.items()}
    model = MAKERS[name]().to(device).half().eval()
    args = tuple(torch.from_numpy(inputs[n]).to(device) for n in in_names)
    path = os.path.join(em.OUT_DIR, f"{name}_f16.onnx")
    if bert:
        dyn = {n: {0: "batch", 1: "seq"} for n in in_names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"}
        em.export(model, args, path, in_names, ["last_hidden_state"], dyn)
    else:
        em.export(model, args, path, ["input"], ["output"], None)
    em.log(f"{name}: wrote {os.path.relpath(path, em.REPO)} ({os.path.getsize(path)} bytes)")
    em.write_npys(os.path.join(em.OUT_DIR, f"{name}_f16_inputs"), inputs, True)
    ref_dir = os.path.join(em.OUT_DIR, f"{name}_f16_outputs")
    os.makedirs(ref_dir, exist_ok=True)
    for f in os.listdir(src_out):
        shutil.copy(os.path.join(src_out, f), os.path.join(ref_dir, f))
    with torch.no_grad():
        got = model(*args).float().cpu().numpy()
    out_name = "last_hidden_state" if bert else "output"
    em.write_npys(os.path.join(em.OUT_DIR, f"{name}_f16_torch"), {out_name: got}, True)
    want = np.load(os.path.join(src_out, out_name + ".npy")).astype(np.float64)
    err = float(np.max(np.abs(got - want)) / (np.abs(want).max() + 1e-30))
    em.log(f"{name}: torch f16 ({device}) vs f32 ORT: max|diff| / max|ORT| = {err:.3g}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", choices=list(MAKERS), default=list(MAKERS))
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in args.only:
        try:
            export_f16(name, device)
        except SystemExit:
            raise
        except Exception as e:  # torchvision/transformers missing, an op without f16, ...
            print(f"export_f16: {name}: cannot export ({type(e).__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
