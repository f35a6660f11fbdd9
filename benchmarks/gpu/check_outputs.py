"""Compares a rafter run's outputs with ONNX Runtime's f32 reference outputs that
scripts/export_models.py saved, for the GPU benchmark scripts.

python3 benchmarks/gpu/check_outputs.py MODEL OUT_DIR

For each .cache/models/MODEL_outputs/NAME.npy, prints `output check MODEL: max |got - ORT| /
max|ORT| = E`, reading OUT_DIR/NAME.npy. Where .cache/models/MODEL_torch/NAME.npy exists (an
f16 model's PyTorch f16 outputs, from benchmarks/gpu/export_f16.py), also prints PyTorch's
own error against the same reference and whether rafter's is within max(2x PyTorch's, 1e-2).
Exits 1 when an output file is missing.
"""
import glob
import os
import sys

import numpy as np


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model, out_dir = sys.argv[1], sys.argv[2]
    refs = sorted(glob.glob(f".cache/models/{model}_outputs/*.npy"))
    if not refs:
        sys.exit(f"check_outputs: no reference outputs in .cache/models/{model}_outputs")
    for ref in refs:
        name = os.path.basename(ref)
        got_path = os.path.join(out_dir, name)
        if not os.path.exists(got_path):
            sys.exit(f"check_outputs: {model}: rafter wrote no {got_path}")
        want = np.load(ref).astype(np.float64)
        scale = np.abs(want).max() + 1e-30
        got = np.load(got_path).astype(np.float64)
        err = float(np.max(np.abs(got - want)) / scale)
        line = f"output check {model}: max |got - ORT| / max|ORT| = {err:.3g}"
        torch_path = f".cache/models/{model}_torch/{name}"
        if os.path.exists(torch_path):
            terr = float(np.max(np.abs(np.load(torch_path).astype(np.float64) - want)) / scale)
            verdict = "ok" if err <= max(2 * terr, 1e-2) else "TOO FAR"
            line += f"; torch f16: {terr:.3g} ({verdict}: within max(2x torch, 1e-2))"
        print(line)


if __name__ == "__main__":
    main()
