#!/usr/bin/env python3
"""Quantize a GGUF through libllama's `llama_model_quantize`, as `llama-quantize IN OUT TYPE N`
does, but through the llama-cpp-python bindings of benchmarks/setup_llama_cpp.sh's build.

    python quantize.py IN --outfile OUT --type {Q4_0,Q4_K_M,Q5_K_M,Q6_K} [--nthread N]

Why not the llama-quantize binary: it links llama.cpp's `common` library (and cpp-httplib),
about half of the whole llama.cpp compile, while the quantizer itself lives in libllama. With
this script the fixtures need only libllama and the ggml libraries (`setup_llama_cpp.sh
--lib-only`, what CI builds). llama-quantize's main, for these arguments, sets nothing but the
ftype and the thread count on `llama_model_quantize_default_params()` and calls
`llama_model_quantize` between `llama_backend_init` and `llama_backend_free`; this does the
same, so the files are byte-identical (the sha256 in tests/fixtures/llm/expected.json check it).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

LLAMA_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        ".cache", "llama.cpp", "python")

# llama-quantize's names for the types the fixtures use -> enum llama_ftype (llama.h).
FTYPES = {"Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
          "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("--outfile", required=True)
    ap.add_argument("--type", required=True, choices=sorted(FTYPES))
    ap.add_argument("--nthread", type=int, default=0, help="0: all cores (llama.cpp's default)")
    args = ap.parse_args()
    if not os.path.isfile(args.input):
        print(f"quantize.py: {args.input}: no such file", file=sys.stderr)
        return 2
    if os.path.exists(args.outfile) and os.path.samefile(args.input, args.outfile):
        print(f"quantize.py: input and output are the same file: {args.input}", file=sys.stderr)
        return 2

    sys.path.insert(0, LLAMA_PY)
    import llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, FTYPES[args.type])
    params.nthread = args.nthread
    L.llama_backend_init()
    try:
        rc = L.llama_model_quantize(args.input.encode(), args.outfile.encode(), ctypes.byref(params))
    finally:
        L.llama_backend_free()
    if rc != 0:
        print(f"quantize.py: llama_model_quantize({args.input} -> {args.outfile}, {args.type}) failed ({rc})",
              file=sys.stderr)
        return 1
    print(f"quantize.py: {args.input} -> {args.outfile} as {args.type} ({args.nthread} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
