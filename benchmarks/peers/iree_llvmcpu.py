#!/usr/bin/env python3
"""IREE runner (llvm-cpu target, local-task driver).

Two modes, each its own process (started by run.py):

  --compile   import the ONNX model with iree-import-onnx (the BERT models
              first get static input dims, batch 1 x seq 128, in a copy of the
              .onnx under --workdir) and compile it with iree-compile:
                  --iree-hal-target-device=local
                  --iree-hal-local-target-device-backends=llvm-cpu
                  --iree-llvmcpu-target-cpu=host
                  --iree-opt-data-tiling=true
                  --iree-preprocessing-pass-pipeline=builtin.module(util.func(
                      iree-global-opt-convert-conv2d-to-img2col))
              into <workdir>/<model>.vmfb. Prints RESULT {compile_s, import_s,
              artifact_bytes, flags}.
  (default)   load the .vmfb (memory-mapped) on the local-task driver with a
              task topology of --threads workers in one group, time calls as
              common.py describes, print RESULT.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BIN = os.path.dirname(sys.executable)
# The img2col preprocessing pass: named iree-preprocessing-convert-conv2d-to-img2col in
# older IREE releases, iree-global-opt-convert-conv2d-to-img2col in 3.13.
IMG2COL = "builtin.module(util.func(iree-global-opt-convert-conv2d-to-img2col))"
COMPILE_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
    "--iree-opt-data-tiling=true",
    f"--iree-preprocessing-pass-pipeline={IMG2COL}",
]
BERT_DIMS = {"batch": 1, "seq": 128}


def extra(ap) -> None:
    ap.add_argument("--compile", action="store_true", help="import and compile only")


def static_onnx(model: str, workdir: str) -> str:
    """The model's .onnx, with symbolic input dims fixed (a copy) if it has any."""
    import onnx

    src = os.path.join(common.MODELS_DIR, f"{model}.onnx")
    if model in common.IMAGE_MODELS:
        return src
    dst = os.path.join(workdir, f"{model}_static.onnx")
    m = onnx.load(src)
    for vi in list(m.graph.input) + list(m.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = BERT_DIMS[d.dim_param]
    onnx.save(m, dst)
    return dst


def do_compile(args) -> int:
    os.makedirs(args.workdir, exist_ok=True)
    onnx_path = static_onnx(args.model, args.workdir)
    mlir = os.path.join(args.workdir, f"{args.model}.mlir")
    vmfb = os.path.join(args.workdir, f"{args.model}.vmfb")
    t0 = time.perf_counter()
    subprocess.run([os.path.join(BIN, "iree-import-onnx"), onnx_path, "-o", mlir], check=True)
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([os.path.join(BIN, "iree-compile"), mlir, *COMPILE_FLAGS, "-o", vmfb], check=True)
    compile_s = time.perf_counter() - t0
    if onnx_path.startswith(args.workdir):
        os.remove(onnx_path)
    os.remove(mlir)
    print("RESULT " + json.dumps({
        "import_s": import_s, "compile_s": compile_s,
        "artifact_bytes": os.path.getsize(vmfb), "flags": COMPILE_FLAGS,
    }), flush=True)
    return 0


def do_run(args) -> int:
    import numpy as np
    import iree.runtime as ireert

    ireert.flags.parse_flags(f"--task_topology_group_count={args.threads}")
    vmfb = os.path.join(args.workdir, f"{args.model}.vmfb")
    feeds = common.load_inputs(args.model)
    xs = [feeds[n] for n in common.input_names(args.model)]
    t0 = time.perf_counter()
    config = ireert.Config("local-task")
    ctx = ireert.SystemContext(config=config)
    vm_module = ireert.VmModule.mmap(config.vm_instance, vmfb)
    ctx.add_vm_module(vm_module)
    fn = ctx.modules.module["main_graph"]
    load_s = time.perf_counter() - t0

    def call():
        r = fn(*xs)
        # results are device arrays; bring them to host so the call is complete
        return np.asarray(r.to_host() if hasattr(r, "to_host") else r)

    samples, out, warmup = common.time_calls(call, args.warmup, args.iters, args.budget)
    name = "output" if args.model in common.IMAGE_MODELS else "last_hidden_state"
    common.save_outputs(args.output_dir, {name: out})
    from importlib.metadata import version

    common.report(samples, warmup, load_s=load_s, artifact_bytes=os.path.getsize(vmfb),
                  version=f"iree-base-runtime {version('iree-base-runtime')}")
    return 0


def main() -> int:
    args = common.parse_args(extra)
    if not args.workdir:
        sys.exit("iree.py: --workdir is required")
    return do_compile(args) if args.compile else do_run(args)


if __name__ == "__main__":
    sys.exit(main())
