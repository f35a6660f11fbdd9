#!/usr/bin/env python3
"""Makes rafter-quant's reference vectors (tests/data/*.txt) from ggml's own C code and gguf-py.

    python3 gen_reference.py /path/to/llama.cpp [OUT_DIR]

llama.cpp is the source tree (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp was used);
the Python running this needs numpy and pyyaml (gguf-py imports yaml). Nothing here is
needed by `cargo test`: the outputs are committed.

How each vector is made:
- inputs: deterministic (numpy seed 25 per format) f32 rows, one case per kind of input
  (random, mixed magnitudes, zeros, constants, large values near the f16 range, f32 and f16
  denormals, rounding ties, one-hot, ramp);
- `q`: ggml's reference quantizer `quantize_row_<type>_ref` from ggml/src/ggml-quants.c,
  compiled here with `gcc -O2 -DNDEBUG` (a release build: asserts off) for baseline x86-64 (no -march: ggml-base, which holds
  ggml-quants.c, is built without native flags, so no FMA contraction), loaded with ctypes.
  That is what `llama-quantize` writes without an imatrix (`quantize_<type>` calls the
  `_ref` function when `quant_weights` is NULL);
- `y`: gguf-py's dequantizer (gguf-py/gguf/quants.py) applied to `q`; for Q8_K, which
  gguf-py lacks, ggml's `dequantize_row_q8_K`; for Q8_1 (no dequantizer in either),
  `d * qs` in f32, the definition ggml's dot products use. Where both gguf-py and ggml's C
  dequantizer exist the script checks that they agree bit for bit;
- cases named `bytes_*` have no `x`: their blocks are random bytes (with finite f16 scales),
  so that dequantization sees bit patterns the quantizers never write.

File format (one per format, lowercase name): `#` comments, then per case
`case NAME`, optional `x <f32 bits hex>...`, `q <block bytes hex>`, `y <f32 bits hex>...`.
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

LLAMA = os.path.abspath(sys.argv[1])
OUT = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(__file__))
sys.path.insert(0, os.path.join(LLAMA, "gguf-py"))
import gguf  # noqa: E402
from gguf import quants  # noqa: E402

T = gguf.GGMLQuantizationType
# name, ggml type, elements per block, bytes per block, byte offsets of f16 scale fields
FORMATS = [
    ("Q4_0", T.Q4_0, 32, 18, [0]),
    ("Q4_1", T.Q4_1, 32, 20, [0, 2]),
    ("Q5_0", T.Q5_0, 32, 22, [0]),
    ("Q5_1", T.Q5_1, 32, 24, [0, 2]),
    ("Q8_0", T.Q8_0, 32, 34, [0]),
    ("Q8_1", T.Q8_1, 32, 36, [0, 2]),
    ("Q2_K", T.Q2_K, 256, 84, [80, 82]),
    ("Q3_K", T.Q3_K, 256, 110, [108]),
    ("Q4_K", T.Q4_K, 256, 144, [0, 2]),
    ("Q5_K", T.Q5_K, 256, 176, [0, 2]),
    ("Q6_K", T.Q6_K, 256, 210, [208]),
    ("Q8_K", T.Q8_K, 256, 292, []),
]


def build_lib(tmp):
    src = os.path.join(LLAMA, "ggml", "src")
    so = os.path.join(tmp, "libggmlq.so")
    subprocess.check_call([
        "gcc", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-o", so,
        "-I", os.path.join(LLAMA, "ggml", "include"), "-I", src,
        os.path.join(src, "ggml-quants.c"),
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "ggml_stubs.c"), "-lm",
    ])
    return ctypes.CDLL(so)


def c_quantize(lib, name, x, bb, be):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(len(x) // be * bb, dtype=np.uint8)
    fn = getattr(lib, f"quantize_row_{name.lower()}_ref".replace("_k_", "_K_"))
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(x)))
    return out


def c_dequantize(lib, name, q, bb, be):
    sym = f"dequantize_row_{name.lower()}".replace("_k", "_K")
    if not hasattr(lib, sym):
        return None
    n = len(q) // bb * be
    out = np.zeros(n, dtype=np.float32)
    q = np.ascontiguousarray(q)
    getattr(lib, sym)(q.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return out


def py_dequantize(lib, name, qtype, q, bb, be):
    c = c_dequantize(lib, name, q, bb, be)
    if name == "Q8_1":
        blocks = q.reshape(-1, bb)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:].copy().view(np.int8).astype(np.float32)
        return (qs * d).reshape(-1)
    if name == "Q8_K":
        return c
    y = quants.dequantize(q.reshape(1, -1), qtype).reshape(-1)
    y = np.asarray(y, dtype=np.float32)
    if c is not None:
        assert np.array_equal(y.view(np.uint32), c.view(np.uint32)), f"{name}: gguf-py and ggml disagree"
    return y


def inputs(be, rng):
    """(case name, f32 row) pairs; rows are whole blocks."""
    nb32 = 4 if be == 32 else 1  # blocks per case: 128 or 256 elements
    n = be * nb32
    big = be * (2 if be == 256 else 8)
    cases = []
    cases.append(("normal", rng.standard_normal(big)))
    mags = 10.0 ** rng.uniform(-4, 4, size=big // 16).repeat(16)
    cases.append(("mixed_magnitudes", rng.standard_normal(big) * mags))
    cases.append(("zeros", np.zeros(n)))
    const = np.full(n, 0.75)
    const[n // 2:] = -3.5
    cases.append(("constant", const))
    ext = rng.uniform(-60000, 60000, size=n)
    ext[::7] = 60000.0
    ext[3::11] = -60000.0
    cases.append(("large", ext))
    den = rng.standard_normal(n) * 1e-40  # f32 denormals
    cases.append(("f32_denormal", den))
    cases.append(("f16_subnormal_scale", rng.standard_normal(n) * 1e-6))
    ties = (np.arange(n) % 16 - 7.5) * 0.5
    ties[::32] = -4.0  # block max 4: scales that make x / d land on halves
    cases.append(("ties", ties))
    q8ties = (np.arange(n) % 64 - 32) + 0.5
    q8ties[::32] = 127.0
    cases.append(("q8_ties", q8ties))
    onehot = np.zeros(n)
    onehot[5::be // 2] = [(-1) ** i * (i + 1) * 0.37 for i in range(len(onehot[5::be // 2]))]
    cases.append(("one_hot", onehot))
    cases.append(("ramp", np.linspace(-1.0, 2.0, n)))
    pos = np.abs(rng.standard_normal(n)) + 0.25
    cases.append(("all_positive", pos))
    cases.append(("all_negative", -pos[::-1].copy()))
    return [(c, np.asarray(x, dtype=np.float32)) for c, x in cases]


def random_blocks(bb, scale_offsets, name, nblocks, rng):
    raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for off in scale_offsets:
        # finite f16, subnormals included: exponent field 0..30
        exp = rng.integers(0, 31, size=nblocks)
        mant = rng.integers(0, 1024, size=nblocks)
        sign = rng.integers(0, 2, size=nblocks)
        h = ((sign << 15) | (exp << 10) | mant).astype(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    if name == "Q8_K":
        d = (rng.standard_normal(nblocks) * 1e-2).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(nblocks, 4)
    return raw.reshape(-1)


def hexf(a):
    return " ".join(f"{v:08x}" for v in np.asarray(a, dtype=np.float32).view(np.uint32))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_lib(tmp)
        for name, qtype, be, bb, scale_offsets in FORMATS:
            rng = np.random.default_rng(25)
            lines = [
                f"# {name} reference vectors: made by gen_reference.py (see its docstring) from",
                "# ggml's quantize_row_*_ref (ggml-quants.c) and gguf-py's dequantizer, llama.cpp of",
                "# llama-cpp-python 0.3.36. x: input f32 bits, q: block bytes, y: dequantized f32 bits.",
            ]
            for case, x in inputs(be, rng):
                q = c_quantize(lib, name, x, bb, be)
                y = py_dequantize(lib, name, qtype, q, bb, be)
                lines += [f"case {case}", "x " + hexf(x), "q " + q.tobytes().hex(), "y " + hexf(y)]
            for i in range(3):
                q = random_blocks(bb, scale_offsets, name, 2, rng)
                y = py_dequantize(lib, name, qtype, q, bb, be)
                lines += [f"case bytes_{i}", "q " + q.tobytes().hex(), "y " + hexf(y)]
            path = os.path.join(OUT, f"{name.lower()}.txt")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            print(path, os.path.getsize(path))


if __name__ == "__main__":
    main()
